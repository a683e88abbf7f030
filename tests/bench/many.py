# SPDX-License-Identifier: MIT
"""Section "many" of the benchmark (bench.py, only when --sections names
it): one relay for many outbox tables (docs/design.md §13), against the
same relay on one table, in one invocation.

  tables      N tenant tables (1,000 in the full form, 100 in the quick
              one), tag_many_t<i>.outbox_events, migrated by one `migrate`
              of their list, served by the pattern tag_many_t*.outbox_events.
  throughput  the relay started on the tables and settled (discovery, a
              first lease and sweep of each), then the same number of 1 KB
              events inserted, all into one table or spread over 10 busy
              tables of the N, and drained by the stdout publisher
              (default workers): events/s from the first insert to the
              relay's last sent count.
  idle        the relay left running with nothing to do, on the one table
              and on the N: the CPU per second of its own Postgres sessions
              (their backends, by application_name) and of the whole
              cluster (autovacuum visiting N tables included), over a
              window after the relay settled, and its leases per second.
  sessions    the relay's sessions (pg_stat_activity by application name)
              while it serves the N tables.
  memory      the relay's peak RSS on N tables less on one, per table.
  fairness    49 quiet tables of the N, each written once a second (one
              producer session, one table after another), with LISTEN on:
              the p99 of their events' latency (finished_at - created_at)
              over a window with no other load, then while a hot table
              drains a backlog of 100,000 events, inserted anew after
              each drain until the drains add up to the same window
              (the quiet tables are not written while the backlog is);
              the ratio of the two.
"""

import subprocess
import time

import dbcost

TABLES = {"full": 1000, "quick": 100}
BUSY = 10
EVENTS = {"full": 100000, "quick": 20000}
IDLE_S = {"full": 60, "quick": 20}
SETTLE_S = 20  # after start: discovery, a first lease and sweep of each
LEASES = "outbox_leases_total"
TIMEOUT_S = 900
QUIET = 49
HOT_EVENTS = 100000
QUIET_WINDOW_S = {"full": 30, "quick": 15}


def bind(bench_module):
    global BenchError, Relay, say, spread, RelaySessionsCpu
    BenchError = bench_module.BenchError
    Relay = bench_module.Relay
    RelaySessionsCpu = bench_module.RelaySessionsCpu
    say = bench_module.say
    spread = bench_module.spread
    dbcost.bind(bench_module)


class Many:
    def __init__(self, bench):
        self.b = bench
        form = "quick" if bench.args.quick else "full"
        self.n = TABLES[form]
        self.events = EVENTS[form]
        self.idle_s = IDLE_S[form]
        self.schema = "%s_many_t" % bench.tag

    def names(self):
        return ["%s%d.outbox_events" % (self.schema, i)
                for i in range(1, self.n + 1)]

    def migrate(self):
        b = self.b
        for i in range(1, self.n + 1):
            b.sql("SET client_min_messages = warning; DROP SCHEMA IF EXISTS "
                  "%s%d CASCADE" % (self.schema, i))
        # The NOTIFY trigger too: the fairness part relays with LISTEN.
        dbcost.run([b.relay_bin, "migrate", "--quiet"], env=dict(
            dbcost.os.environ, OUTBOX_DATABASE_URL=b.svc.db_url,
            OUTBOX_TABLE=",".join(self.names()), OUTBOX_LISTEN="on"))

    def fill(self, table, n):
        self.b.sql("INSERT INTO %s (type, routing_key, payload) SELECT "
                   "'bench.event', 'bench', decode(repeat(md5(g::text), 64), "
                   "'hex') FROM generate_series(1, %d) g" % (table, n),
                   timeout=TIMEOUT_S)

    def drain(self, tables, fill, name):
        """Starts a relay on tables (a pattern or a name), lets it settle,
        fills and waits for every event; the relay is returned running,
        with events/s."""
        b = self.b
        relay = Relay(b, tables, "stdout", 1, {
            "OUTBOX_DISCOVERY_INTERVAL": "1s"}, log_name="many-" + name)
        time.sleep(SETTLE_S)
        start = time.monotonic()
        for t in fill:
            self.fill(t, self.events // len(fill))
        done = dbcost.wait_metric(relay, dbcost.SENT_METRIC, self.events,
                                  start + TIMEOUT_S)
        return relay, self.events / (done - start)

    def sessions(self):
        return int(self.b.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name "
            "LIKE 'outbox-relay/%'"))

    def idle(self, relay):
        """Postgres CPU ms/s (the relay's sessions, the cluster) and
        leases/s of an idle relay, after it settled."""
        time.sleep(SETTLE_S)
        l0 = dbcost.metric(relay, LEASES)
        c0 = dbcost.pg_cpu_s(self.b)
        # An idle relay keeps its sessions: listed once, where a psql
        # session every few seconds would show in the cluster's figure.
        sessions = RelaySessionsCpu(self.b, list_s=None)
        t0 = time.monotonic()
        try:
            time.sleep(self.idle_s)
        finally:
            own = sessions.total()[0]
        secs = time.monotonic() - t0
        cpu = dbcost.pg_cpu_s(self.b) - c0
        leases = dbcost.metric(relay, LEASES) - l0
        return {"pg_cpu_ms_per_s": 1000.0 * cpu / secs,
                "relay_pg_cpu_ms_per_s": 1000.0 * own / secs,
                "leases_per_s": leases / secs}

    def quiet_stream(self, quiet, secs, until=None):
        """Writes one event a second into each quiet table, spread over
        the second, for secs or until until() is true (asked once a
        second); returns the database time the stream started at."""
        b = self.b
        t0 = b.sql("SELECT clock_timestamp()")
        psql = subprocess.Popen(
            ["psql", b.svc.db_url, "-X", "-q", "-v", "ON_ERROR_STOP=1"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        try:
            start = time.monotonic()
            k = 0
            while time.monotonic() - start < secs:
                if until and k % len(quiet) == 0 and k and until():
                    break
                psql.stdin.write(
                    "INSERT INTO %s (type, payload) VALUES ('quiet', "
                    "'\\x7b7d');\n" % quiet[k % len(quiet)])
                psql.stdin.flush()
                k += 1
                time.sleep(max(0.0, start + k / len(quiet) -
                               time.monotonic()))
        finally:
            psql.stdin.close()
            psql.wait(timeout=60)
        return t0

    def quiet_p99(self, quiet, since):
        """p99 and count of the quiet events' latency since since, once
        every one of them is sent (seconds)."""
        b = self.b
        rows = " UNION ALL ".join(
            "SELECT status, finished_at - created_at AS lat FROM %s WHERE "
            "type = 'quiet' AND created_at >= '%s'" % (t, since)
            for t in quiet)
        deadline = time.monotonic() + 120
        while int(b.sql("SELECT count(*) FROM (%s) q WHERE status <> "
                        "'sent'" % rows)) > 0:
            if time.monotonic() > deadline:
                raise BenchError("many: quiet events not sent in 120 s")
            time.sleep(0.5)
        out = b.sql("SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY "
                    "extract(epoch FROM lat)), count(*) FROM (%s) q" % rows)
        p99, n = out.split("|")
        return float(p99), int(n)

    def fairness(self):
        """Quiet tables' p99 latency alone and behind a hot backlog."""
        b = self.b
        names = self.names()
        hot, quiet = names[0], names[1:QUIET + 1]
        secs = QUIET_WINDOW_S["quick" if b.args.quick else "full"]
        relay = Relay(b, self.schema + "*.outbox_events", "stdout", 1, {
            "OUTBOX_DISCOVERY_INTERVAL": "1s", "OUTBOX_LISTEN": "on"},
            log_name="many-fair")
        try:
            time.sleep(SETTLE_S)
            say("many: %d quiet tables at 1 event/s, %d s alone" % (
                len(quiet), secs))
            alone, n_alone = self.quiet_p99(
                quiet, self.quiet_stream(quiet, secs))
            say("many: the same while a hot table drains %d events, "
                "again until %d s of it" % (HOT_EVENTS, secs))
            pending = "SELECT count(*) > 0 FROM %s WHERE status = " \
                      "'pending'" % hot

            def drained():
                return b.sql(pending) != "t"
            sent0 = dbcost.metric(relay, dbcost.SENT_METRIC)
            since, spent, rounds = None, 0.0, 0
            while spent < secs and rounds < 30:
                # The quiet stream pauses while the backlog is written:
                # the window is the drain of a 100,000-event backlog.
                self.fill(hot, HOT_EVENTS)
                t = time.monotonic()
                started = self.quiet_stream(quiet, secs - spent, drained)
                since = since or started
                spent += time.monotonic() - t
                rounds += 1
            hot_sent = dbcost.metric(relay, dbcost.SENT_METRIC) - sent0
            behind, n_behind = self.quiet_p99(quiet, since)
        finally:
            relay.stop()
        return {"quiet": len(quiet), "hot_events": HOT_EVENTS,
                "alone_p99_s": alone, "alone_n": n_alone,
                "behind_p99_s": behind, "behind_n": n_behind,
                "hot_sent": hot_sent, "rounds": rounds,
                "ratio": behind / max(alone, 0.001)}

    def measure(self):
        b = self.b
        say("many: migrating %d tables" % self.n)
        self.migrate()
        fairness = self.fairness()
        one = b.table("many_one")
        say("many: %d events in one table" % self.events)
        relay, one_rate = self.drain(one, [one], "one")
        try:
            one_idle = self.idle(relay)
            one_rss = relay.peak_rss_kb()
        finally:
            relay.stop()
        busy = self.names()[:: self.n // BUSY][:BUSY]
        say("many: %d events over %d of %d tables" % (
            self.events, len(busy), self.n))
        relay, many_rate = self.drain(self.schema + "*.outbox_events", busy,
                                      "many")
        try:
            sessions = self.sessions()
            many_idle = self.idle(relay)
            many_rss = relay.peak_rss_kb()
        finally:
            relay.stop()
        for i in range(1, self.n + 1):
            b.sql("SET client_min_messages = warning; DROP SCHEMA IF EXISTS "
                  "%s%d CASCADE" % (self.schema, i))
        return {
            "tables": self.n, "busy": len(busy), "events": self.events,
            "one": {"events_per_s": one_rate, **one_idle,
                    "peak_rss_kb": one_rss},
            "many": {"events_per_s": many_rate, **many_idle,
                     "peak_rss_kb": many_rss, "sessions": sessions},
            "throughput_ratio": many_rate / one_rate,
            "idle_cpu_ratio": (many_idle["relay_pg_cpu_ms_per_s"] /
                               max(one_idle["relay_pg_cpu_ms_per_s"], 0.1)),
            "rss_kb_per_table": (many_rss - one_rss) / self.n,
            "fairness": fairness,
            "quiet_p99_ratio": fairness["ratio"],
        }


def report_rows(r, bench_row):
    """The section's rows in bench.py's table (one run each)."""
    n = r["tables"]

    def row(measure, v, digits):
        bench_row(measure, spread([v]), digits)

    row("Many outboxes: events/s, %d events in 1 table" % r["events"],
        r["one"]["events_per_s"], 0)
    row("Many outboxes: events/s, the same over %d of %d tables" % (
        r["busy"], n), r["many"]["events_per_s"], 0)
    row("Many outboxes: throughput, %d tables ÷ 1" % n,
        r["throughput_ratio"], 2)
    for who, key in (("its sessions", "relay_pg_cpu_ms_per_s"),
                     ("the whole cluster", "pg_cpu_ms_per_s")):
        row("Many outboxes: idle relay, Postgres CPU ms/s of %s, 1 table"
            % who, r["one"][key], 1)
        row("Many outboxes: idle relay, Postgres CPU ms/s of %s, %d tables"
            % (who, n), r["many"][key], 1)
    row("Many outboxes: idle relay's sessions, Postgres CPU, %d tables ÷ 1"
        % n, r["idle_cpu_ratio"], 2)
    row("Many outboxes: idle relay, leases/s, %d tables" % n,
        r["many"]["leases_per_s"], 2)
    row("Many outboxes: relay sessions, %d tables" % n,
        r["many"]["sessions"], 0)
    row("Many outboxes: relay peak RSS per table, KB", r["rss_kb_per_table"],
        1)
    f = r["fairness"]
    row("Many outboxes: p99 latency s of %d quiet tables at 1 event/s, "
        "alone (%d events)" % (f["quiet"], f["alone_n"]), f["alone_p99_s"], 3)
    row("Many outboxes: the same while a hot table drains a %d-event "
        "backlog (%d events over %d drains; the relay sent %d)" % (
            f["hot_events"], f["behind_n"], f["rounds"], f["hot_sent"]),
        f["behind_p99_s"], 3)
    row("Many outboxes: quiet tables' p99, behind the hot backlog ÷ alone",
        r["quiet_p99_ratio"], 2)


def measure(bench, bench_module):
    bind(bench_module)
    return Many(bench).measure()
