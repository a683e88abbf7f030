# SPDX-License-Identifier: MIT
"""Section "dbcost" of the benchmark (bench.py): what draining the outbox
costs Postgres per event, next to the floor of a table queue.

On the relay's own table (`outbox-relay migrate` of the binary under test)
with N pending 1 KB rows and full_page_writes = on, each variant is
measured around its work: the CPU of every process of this run's Postgres
cluster (the postmaster and its children, reaped children included), the
WAL written (pg_current_wal_lsn() difference) and rows/s.

  relay variants  the relay binary itself drains the table (publisher
                  stdout, 4 workers, batch 100): history kept (default
                  OUTBOX_RETENTION), without history (OUTBOX_RETENTION=0,
                  when the binary accepts it), ordered (1000 keys), and the
                  whole life of a row (the drain, then the relay's own
                  cleaner deleting the sent rows).
  floor variants  pgbench, 4 clients, batches of 100, the statements of a
                  table queue: C (one transaction: SELECT .. FOR UPDATE SKIP
                  LOCKED; DELETE; COMMIT), D (the same with an UPDATE to
                  sent, then the sent rows deleted 1000 a transaction) and,
                  for reference, A (the lease UPDATE and mark UPDATE the
                  relay ran up to the row-protocol change, then the same
                  deletes).

Every variant starts from a freshly migrated table, filled, vacuumed and
checkpointed, migrated as its relay's deployment would migrate it: for
floor C and the relays without history with OUTBOX_RETENTION=0, so its
pages keep no room for a next version (migrate_room.c). The deletes of
history run in a second window that begins after a VACUUM and a
CHECKPOINT (neither measured), as they would hours later in production; the two windows add up to the whole life of a row.
The relay's variants also measure, each in a window of its own, a VACUUM
of the table after the drain and after the deletes: what the dead rows
they leave cost once (a deleted row, a row's version before its mark),
which autovacuum pays in production and a partition's drop does not; the
"+vacuum" figures add them to the whole life.
The variants of one run are interleaved (reversed every other run) so
that drift on a shared machine hits relay and floor alike; ratios are the
median of per-run ratios. docs/benchmark.md, "Database cost per event".
"""

import os
import re
import statistics
import subprocess
import time
import urllib.request

ROWS = {"full": 200000, "quick": 20000}
BATCH = 100
CLIENTS = 4
KEYS = 1000
RETENTION = "1m"  # the shortest OUTBOX_RETENTION; the cleaner waits it out
RETENTION_S = 60
SENT_METRIC = 'outbox_events_total{outcome="sent",class="none"}'
CLEANED_METRIC = 'outbox_cleaned_rows_total{status="sent"}'

# The floor statements, as the project's db-cost tool runs them ({t}: the
# table). A is the relay's protocol before the row-protocol change, kept
# here as text so that it stays the same reference for every build.
DUE = ("FROM {t} WHERE status='pending' AND NOT suspect AND "
       "next_attempt_at <= now() ORDER BY next_attempt_at, seq LIMIT 100")
FLOOR = {
    "C": "BEGIN;\n"
         "WITH d AS (SELECT id, payload " + DUE + " FOR UPDATE SKIP LOCKED)\n"
         "SELECT coalesce(array_agg(id)::text,'{{}}') AS ids FROM d\n"
         "\\gset\n"
         "DELETE FROM {t} WHERE id = ANY(:ids::uuid[]);\n"
         "COMMIT;\n",
    "D": "BEGIN;\n"
         "WITH d AS (SELECT id, payload " + DUE +
         " FOR NO KEY UPDATE SKIP LOCKED)\n"
         "SELECT coalesce(array_agg(id)::text,'{{}}') AS ids FROM d\n"
         "\\gset\n"
         "UPDATE {t} SET status='sent', finished_at=now() "
         "WHERE id = ANY(:ids::uuid[]);\n"
         "COMMIT;\n",
    "A": "WITH l AS (WITH lease AS MATERIALIZED (SELECT gen_random_uuid() "
         "AS lease_id), due AS MATERIALIZED (SELECT id " + DUE +
         " FOR NO KEY UPDATE SKIP LOCKED) UPDATE {t} t SET "
         "status='in_flight', lease_id=lease.lease_id, leased_at=now(), "
         "lease_expires_at=now()+interval '60 s', leased_by='b', "
         "attempts=t.attempts+1, source=coalesce(t.source,'/s') FROM lease "
         "WHERE t.id = ANY(ARRAY(SELECT id FROM due)) RETURNING t.id, "
         "t.payload, lease.lease_id) SELECT coalesce(array_agg(id)::text,"
         "'{{}}') AS ids, min(lease_id::text) AS lid FROM l\n"
         "\\gset\n"
         "UPDATE {t} SET status='sent', finished_at=now() WHERE id = "
         "ANY(:ids::uuid[]) AND lease_id = :lid::uuid AND "
         "status='in_flight';\n",
}
# Columns each floor script needs on the table under test.
FLOOR_COLUMNS = {
    "C": {"id", "payload", "status", "suspect", "next_attempt_at", "seq"},
    "D": {"id", "payload", "status", "suspect", "next_attempt_at", "seq",
          "finished_at"},
    "A": {"id", "payload", "status", "suspect", "next_attempt_at", "seq",
          "finished_at", "lease_id", "leased_at", "lease_expires_at",
          "leased_by", "attempts", "source"},
}
# The cleaner's work for the floor: sent rows, oldest first, 1000 a
# transaction (the relay's default OUTBOX_CLEAN_BATCH_SIZE).
FLOOR_DELETE = (
    "DO $$ BEGIN LOOP DELETE FROM {t} WHERE id = ANY(ARRAY(SELECT id FROM "
    "{t} WHERE status='sent' ORDER BY status, finished_at LIMIT 1000)); "
    "EXIT WHEN NOT FOUND; COMMIT; END LOOP; END $$")

# name: (kind, label, env of the relay or floor script, history deleted)
VARIANTS = {
    "floor_c": ("floor", "floor C (lock, DELETE, commit)", "C", False),
    "floor_d": ("floor", "floor D (lock, UPDATE to sent, commit)", "D",
                True),
    "floor_a": ("floor", "reference A (lease UPDATE, mark UPDATE)", "A",
                True),
    "relay_nohistory": ("relay", "relay without history "
                        "(OUTBOX_RETENTION=0)", {"OUTBOX_RETENTION": "0"},
                        False),
    "relay_nohistory_partitioned": ("relay", "relay without history "
                                    "(OUTBOX_RETENTION=0), the table "
                                    "partitioned by the day (migrate "
                                    "--partition)",
                                    {"OUTBOX_RETENTION": "0"}, False),
    "relay_history": ("relay", "relay, history kept", {}, False),
    "relay_ordered": ("relay", "relay, ordered (%d keys), history kept"
                      % KEYS, {"OUTBOX_ORDERING": "partition"}, False),
    "relay_ordered_nohistory": ("relay", "relay, ordered (%d keys), without "
                                "history (OUTBOX_RETENTION=0)" % KEYS,
                                {"OUTBOX_ORDERING": "partition",
                                 "OUTBOX_RETENTION": "0"}, False),
    "relay_life": ("relay", "relay, history kept, OUTBOX_RETENTION=%s, "
                   "OUTBOX_CLEAN_INTERVAL=1s" % RETENTION,
                   {"OUTBOX_RETENTION": RETENTION,
                    "OUTBOX_CLEAN_INTERVAL": "1s"}, True),
    "relay_life_partitioned": ("relay", "relay, history kept, the table "
                               "partitioned by the day (migrate "
                               "--partition), OUTBOX_RETENTION=%s, "
                               "OUTBOX_CLEAN_INTERVAL=1s" % RETENTION,
                               {"OUTBOX_RETENTION": RETENTION,
                                "OUTBOX_CLEAN_INTERVAL": "1s"}, True),
}
PARTITIONS_METRIC = 'outbox_partitions_total{event="dropped"}'


def pg_cpu_s(bench):
    """User + system CPU seconds of this cluster's processes so far: the
    postmaster and its children, plus the children it has reaped (cutime,
    cstime), so backends that ended in between still count (the way the
    db-cost tool counts)."""
    total = 0.0
    tck = os.sysconf("SC_CLK_TCK")
    for pid in bench.svc.pids("none")["postgres"]:
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15]) / tck
    return total


class Window:
    """Postgres CPU and WAL between begin() and end(). The settle pause
    lets the psql backend that read the LSN exit and be reaped, and at the
    end the backends of the measured work, so no process is caught between
    its own counters and its parent's."""

    SETTLE_S = 1.0

    def __init__(self, bench):
        self.bench = bench
        self.lsn = bench.sql("SELECT pg_current_wal_lsn()")
        time.sleep(self.SETTLE_S)
        self.cpu = pg_cpu_s(bench)
        self.t0 = time.monotonic()

    def end(self):
        secs = time.monotonic() - self.t0
        time.sleep(self.SETTLE_S)
        cpu = pg_cpu_s(self.bench) - self.cpu
        wal = float(self.bench.sql(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '%s')" % self.lsn))
        return {"seconds": secs, "cpu_s": cpu, "wal_bytes": wal}


def metric(relay, name):
    """A counter from the relay's /metrics (no database work), or None
    while its HTTP server is not up yet."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" %
                                    relay.port, timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise BenchError("the relay's /metrics has no %s; update "
                     "tests/bench/dbcost.py" % name)


def wait_metric(relay, name, n, deadline):
    """Polls a counter every 50 ms until it reaches n; bounded by the
    deadline and by the relay staying alive."""
    while True:
        v = metric(relay, name)
        if v is not None and v >= n:
            return time.monotonic()
        if not relay.alive():
            raise BenchError("relay exited before %s reached %d (log %s)"
                             % (name, n, relay.log_path))
        if time.monotonic() > deadline:
            raise BenchError("%s at %s of %d after the time limit (log %s)"
                             % (name, v, n, relay.log_path))
        time.sleep(0.05)


def retention_zero(relay_bin):
    """Whether this build takes OUTBOX_RETENTION=0, from its own settings
    table (`--settings-markdown`): the range closing the row's meaning
    must offer 0. Returns (accepted, the range)."""
    out = run([relay_bin, "--settings-markdown"], timeout=30)
    for line in out.splitlines():
        if line.startswith("| `OUTBOX_RETENTION` |"):
            ranges = re.findall(r"\(([^()]*)\)", line.rsplit("|", 2)[1])
            rng = ranges[-1] if ranges else ""
            return re.match(r"0(\s|\.\.|$)", rng) is not None, rng
    raise BenchError("%s --settings-markdown has no OUTBOX_RETENTION row"
                     % relay_bin)


class DbCost:
    def __init__(self, bench):
        self.b = bench
        self.n = ROWS["quick" if bench.args.quick else "full"]
        bench.p["dbcost_rows"] = self.n
        self.timeout = 600 + self.n // 100

    # ---- setup ----

    def full_page_writes(self, value):
        b = self.b
        if value is None:
            b.sql("ALTER SYSTEM RESET full_page_writes")
        else:
            b.sql("ALTER SYSTEM SET full_page_writes = %s" % value)
        b.sql("SELECT pg_reload_conf()")
        if value is None:
            return
        deadline = time.monotonic() + 10
        while b.sql("SHOW full_page_writes") != value:
            if time.monotonic() > deadline:
                raise BenchError("full_page_writes did not become %s after "
                                 "a reload" % value)
            time.sleep(0.1)

    def partition(self, t, relay_bin=None, minutes=10):
        """The table made partitioned by the binary's `migrate --partition`
        (which also makes the next days' partitions), and the rows about
        to be written given the partition they would have in production,
        where the day's partition was made days ahead: one holding the
        next minutes' ids (ending at tomorrow's, which exists), named
        after today. Returns its name; later() renames it after a day long
        past, as if its day had ended, for the relay's cleaner to drop."""
        b = self.b
        run([relay_bin or b.relay_bin, "migrate", "--partition"], env=dict(
            os.environ, OUTBOX_DATABASE_URL=b.svc.db_url, OUTBOX_TABLE=t,
            OUTBOX_LISTEN="off"), timeout=120)
        v7 = ("(substr(h, 1, 8) || '-' || substr(h, 9, 4) || "
              "'-0000-0000-000000000000') FROM (SELECT lpad(to_hex(("
              "extract(epoch FROM %s) * 1000)::bigint), 12, '0') AS h) x")
        lo = b.sql("SELECT " + v7 % "now()")
        until = ("least(now() + interval '%d minutes', (date_trunc('day', "
                 "now() AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE "
                 "'UTC')" % minutes)
        hi = b.sql("SELECT " + v7 % until)
        tag = b.sql("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')")
        # The storage parameters the binary gave tomorrow's partition
        # (the fill factor of a table keeping history among them).
        made = b.sql("SELECT array_to_string(reloptions, ', ') FROM pg_class "
                     "WHERE oid = to_regclass('%s_p' || to_char(now() AT "
                     "TIME ZONE 'UTC' + interval '1 day', 'YYYYMMDD'))" % t)
        b.sql("CREATE TABLE %s_p%s PARTITION OF %s FOR VALUES FROM ('%s') "
              "TO ('%s')%s" % (t, tag, t, lo, hi,
                               " WITH (%s)" % made if made else ""))
        return "%s_p%s" % (t, tag)

    def day_passed(self, part):
        """The partition's day ended long ago: renamed after a day three
        days back, which is what tells the cleaner (by name) that it may
        go."""
        past = self.b.sql("SELECT to_char(now() AT TIME ZONE 'UTC' - "
                          "interval '3 days', 'YYYYMMDD')")
        self.b.sql("ALTER TABLE %s RENAME TO %s" % (
            part, part.split(".")[-1][:-8] + past))

    def fresh_table(self, keyed, partitioned=False, history=True):
        """A freshly migrated table with n pending 1 KB rows (over KEYS
        partition keys if keyed), vacuumed, analyzed and checkpointed, so
        every variant starts from the same state and its first write to
        each page pays the full-page image, as after any checkpoint.
        Migrated as for a relay with history or without, whose pages keep
        room for a row's next version or not."""
        b = self.b
        t = b.table("dbcost", history=history)
        self.part = self.partition(t) if partitioned else None
        key = "'k' || (g %% %d)" % KEYS if keyed else "NULL"
        b.sql("INSERT INTO %s (type, routing_key, partition_key, payload) "
              "SELECT 'bench.event', 'bench', %s, decode(repeat(md5(g::text),"
              " 64), 'hex') FROM generate_series(1, %d) g" % (t, key, self.n),
              timeout=self.timeout)
        b.sql("VACUUM ANALYZE %s" % t, timeout=self.timeout)
        b.sql("CHECKPOINT", timeout=self.timeout)
        return t

    def later(self, t):
        """What happens between a drain and the deletes of its history in
        production (hours of vacuum and checkpoints), not measured."""
        self.b.sql("VACUUM %s" % t, timeout=self.timeout)
        self.b.sql("CHECKPOINT", timeout=self.timeout)

    def vacuum(self, t):
        """A measured VACUUM of the table: what its dead rows (a deleted
        row, a row's version before its mark) cost once in a row's life,
        left out of the windows above (autovacuum pays it later in
        production, a partition's drop never)."""
        w = Window(self.b)
        self.b.sql("VACUUM %s" % t, timeout=self.timeout)
        return w.end()

    def counts(self, t):
        """(rows, rows not yet done) of the table: done is sent or failed
        (history) or deleted (no history)."""
        out = self.b.sql("SELECT count(*), count(*) FILTER (WHERE status "
                         "NOT IN ('sent', 'failed')) FROM %s" % t)
        total, remaining = out.split("|")
        return int(total), int(remaining)

    # ---- one variant ----

    def floor(self, name, script, delete):
        b = self.b
        # Floor C deletes, as a relay without history does.
        t = self.fresh_table(False, history=script != "C")
        cols = set(b.sql("SELECT column_name FROM information_schema.columns"
                         " WHERE table_schema || '.' || table_name = '%s'"
                         % t).split())
        missing = FLOOR_COLUMNS[script] - cols
        if missing:
            raise BenchError("floor %s needs column(s) %s, which this "
                             "build's table lacks" % (script,
                                                      ", ".join(missing)))
        path = os.path.join(b.work, "dbcost-%s.sql" % script)
        with open(path, "w") as f:
            f.write(FLOOR[script].format(t=t))
        per = self.n // BATCH // CLIENTS
        w = Window(b)
        out = run([b.svc.pgbench, "-n", "-M", "prepared", "-c", str(CLIENTS),
                   "-j", str(CLIENTS), "-t", str(per), "-f", path,
                   b.svc.db_url], timeout=self.timeout)
        r = w.end()
        failed = re.search(r"number of failed transactions: (\d+)", out)
        if failed and int(failed.group(1)):
            raise BenchError("pgbench %s: %s failed transactions"
                             % (script, failed.group(1)))
        total, remaining = self.counts(t)
        done = self.n - remaining
        if done != per * CLIENTS * BATCH:
            raise BenchError("floor %s finished %d rows, want %d" % (
                script, done, per * CLIENTS * BATCH))
        r["rows"] = done
        if delete:
            self.later(t)
            w = Window(b)
            b.sql(FLOOR_DELETE.format(t=t), timeout=self.timeout)
            r["delete"] = w.end()
            if self.counts(t)[0] != 0:
                raise BenchError("floor %s: the deletes left rows" % script)
        return r

    def relay(self, name, env, delete):
        b = self.b
        n = self.n
        partitioned = name.endswith("_partitioned")
        t = self.fresh_table(name.startswith("relay_ordered"), partitioned,
                             env.get("OUTBOX_RETENTION") != "0")
        # What retention takes away: rows one by one, or the partition.
        gone, want = ((PARTITIONS_METRIC, 1) if partitioned
                      else (CLEANED_METRIC, n))
        extra = dict(env, OUTBOX_BATCH_SIZE=str(BATCH))
        w = Window(b)
        relay = Relay(b, t, "stdout", CLIENTS, extra,
                      log_name="dbcost-" + name)
        try:
            start = time.monotonic()
            t1 = wait_metric(relay, SENT_METRIC, n,
                             time.monotonic() + self.timeout)
            if delete:
                # The last batch's mark follows its count.
                time.sleep(0.5)
                r = w.end()
                vacuums = [self.vacuum(t)]
                self.later(t)
                # The cleaner may delete a row RETENTION after its mark;
                # the second window opens just before the first is due.
                time.sleep(max(0.0, start + RETENTION_S - 2 -
                               time.monotonic()))
                if metric(relay, gone):
                    raise BenchError("the cleaner began before its window: "
                                     "the drain and vacuum took over %d s"
                                     % (RETENTION_S - 2))
                if partitioned:
                    # Every row finished more than retention ago, so the
                    # drop carries none to the default partition.
                    time.sleep(max(0.0, t1 + RETENTION_S + 1 -
                                   time.monotonic()))
                w2 = Window(b)
                if partitioned:
                    self.day_passed(self.part)
                wait_metric(relay, gone, want,
                            time.monotonic() + RETENTION_S + self.timeout)
                rc = relay.stop()
                r["delete"] = w2.end()
            else:
                rc = relay.stop()
                r = w.end()
                vacuums = [self.vacuum(t)]
        finally:
            relay.stop()
        if rc != 0:
            raise BenchError("relay exit code %s (log %s)" % (
                rc, relay.log_path))
        total, remaining = self.counts(t)
        if remaining:
            raise BenchError("%s: %d rows not sent (log %s)" % (
                name, remaining, relay.log_path))
        if delete and total:
            raise BenchError("%s: the cleaner left %d rows (log %s)" % (
                name, total, relay.log_path))
        if delete:
            # The cleaner's deletes leave dead rows too; a drop none.
            vacuums.append(self.vacuum(t))
        r["vacuum"] = {k: sum(v[k] for v in vacuums)
                       for k in ("seconds", "cpu_s", "wal_bytes")}
        r["seconds"] = t1 - start
        r["rows"] = n
        r["rows_left"] = total
        return r

    # ---- the section ----

    def measure(self):
        b = self.b
        ok, rng = retention_zero(b.relay_bin)
        chosen = b.p.get("dbcost_variants") or list(VARIANTS)
        names = [v for v in VARIANTS
                 if v in chosen and (ok or "nohistory" not in v)]
        runs = {v: [] for v in names}
        self.full_page_writes("on")
        try:
            for i in range(b.p["runs"]):
                for name in names if i % 2 == 0 else names[::-1]:
                    kind, _, what, delete = VARIANTS[name]
                    if kind == "floor":
                        r = self.floor(name, what, delete)
                    else:
                        r = self.relay(name, what, delete)
                    runs[name].append(summarize(r))
                    say("dbcost %s run %d: %s" % (name, i + 1, ", ".join(
                        "%s %.1f" % (k, v) for k, v in
                        sorted(runs[name][-1].items()))))
        finally:
            self.full_page_writes(None)
        out = {"rows": self.n, "batch": BATCH, "clients": CLIENTS,
               "keys": KEYS, "full_page_writes": "on",
               # The keys' index compares text in it (PG_LOCALE).
               "collation": b.sql("SHOW lc_collate"),
               "retention_zero": {"supported": ok, "range": rng},
               "left_out": [v for v in VARIANTS if v not in chosen],
               "variants": {}}
        for name in names:
            out["variants"][name] = {
                k: spread([r[k] for r in runs[name]])
                for k in runs[name][0]}
        out["ratios"] = ratios(runs)
        return out


def summarize(r):
    """Per-event figures of one variant's run; with_deletes adds the second
    window (the deletes of the history) to the first."""
    n = r["rows"]
    s = {"rows_per_s": n / r["seconds"],
         "wal_bytes_per_event": r["wal_bytes"] / n,
         "cpu_us_per_event": r["cpu_s"] * 1e6 / n}
    d = r.get("delete")
    if d:
        s["with_deletes_wal_bytes_per_event"] = (
            r["wal_bytes"] + d["wal_bytes"]) / n
        s["with_deletes_cpu_us_per_event"] = (
            r["cpu_s"] + d["cpu_s"]) * 1e6 / n
        s["delete_seconds"] = d["seconds"]
    v = r.get("vacuum")
    if v:
        d = d or {"wal_bytes": 0, "cpu_s": 0}
        s["with_vacuum_wal_bytes_per_event"] = (
            r["wal_bytes"] + d["wal_bytes"] + v["wal_bytes"]) / n
        s["with_vacuum_cpu_us_per_event"] = (
            r["cpu_s"] + d["cpu_s"] + v["cpu_s"]) * 1e6 / n
    return s


# What is compared with what, run by run (the median of the per-run
# ratios is reported; bench.py's TARGETS read some of them): (relay
# figure, floor figure). A "+deletes" figure adds the second window, the
# deletes of the history.
COMPARISONS = [
    ("relay_nohistory", "floor_c"),
    ("relay_life+deletes", "floor_d+deletes"),
    ("relay_history", "floor_d"),
    # What history costs the relay: a row's whole life kept and cleaned,
    # against the relay that deletes it at once.
    ("relay_life+deletes", "relay_nohistory"),
    # The same on the partitioned table, whose day leaves by DROP.
    ("relay_life_partitioned+deletes", "relay_nohistory"),
    ("relay_life_partitioned+deletes", "relay_life+deletes"),
    # Which of that is the partitioned table's and which history's: the
    # relay without history on the partitioned table, against the plain
    # one and against history on the same table.
    ("relay_nohistory_partitioned", "relay_nohistory"),
    ("relay_life_partitioned+deletes", "relay_nohistory_partitioned"),
    # The same with the VACUUM of each one's dead rows (a "+vacuum"
    # figure: the windows of "+deletes" and the vacuums after each),
    # which the windows above leave to autovacuum.
    ("relay_life+vacuum", "relay_nohistory+vacuum"),
    ("relay_life_partitioned+vacuum", "relay_nohistory+vacuum"),
    # What order costs: ordered against unordered, each way of keeping
    # history (the drain's figures, the cleaner's deletes aside).
    ("relay_ordered", "relay_history"),
    ("relay_ordered_nohistory", "relay_nohistory"),
]
MEASURES = [("rows_per_s", "rows/s", 0),
            ("wal_bytes_per_event", "WAL bytes per event", 0),
            ("cpu_us_per_event", "Postgres CPU µs per event", 1)]


def figures(summary, key):
    """The per-event figures of a variant's run summary, or of the run with
    the deletes of its history for "name+deletes"."""
    for suffix in ("deletes", "vacuum"):
        if key.endswith("+" + suffix):
            return {w: summary["with_%s_%s" % (suffix, w)]
                    for w, _, _ in MEASURES[1:]}
    return summary


def ratios(runs):
    out = {}
    for relay, floor in COMPARISONS:
        a_runs, f_runs = runs.get(relay.split("+")[0]), runs.get(
            floor.split("+")[0])
        if not a_runs or not f_runs:
            continue
        for w, _, _ in MEASURES[1:]:
            per_run = [figures(a, relay)[w] / max(1e-9, figures(f, floor)[w])
                       for a, f in zip(a_runs, f_runs)]
            out["%s/%s.%s" % (relay, floor, w)] = spread(per_run)
    return out


def report_rows(res, row, rows):
    """Rows for bench.py's table: row(measure, spread, digits, compare)
    appends one; rows is the list for free-form ones."""
    v = res["variants"]
    rows.append("| DB cost per event: %s pending 1 KB rows per variant, "
                "full_page_writes on, batches of %d, %d pgbench clients or "
                "relay workers | | | |" % ("{:,}".format(res["rows"]),
                                          res["batch"], res["clients"]))
    for name, (kind, label, _, delete) in VARIANTS.items():
        if name in res.get("left_out", []):
            rows.append("| DB cost, %s | not run (--dbcost-variants) | | |"
                        % label)
            continue
        if name not in v:
            rows.append("| DB cost, %s | not supported by this build | | "
                        "OUTBOX_RETENTION takes %s |" % (
                            label, res["retention_zero"]["range"]))
            continue
        keys = [name] + ([name + "+deletes"] if delete else []) + (
            [name + "+vacuum"] if "with_vacuum_cpu_us_per_event" in v[name]
            else [])
        for key in keys:
            what = label + {
                name: "",
                name + "+deletes": ", with the deletes of its history",
                name + "+vacuum": ", with its deletes and the VACUUM of "
                "its dead rows"}[key]
            d = figures(v[name], key)
            for w, unit, digits in MEASURES:
                if w not in d:
                    continue
                row("DB cost, %s: %s" % (what, unit), d[w], digits,
                    compared(res["ratios"], key, w))


def compared(rat, key, w):
    out = []
    for relay, floor in COMPARISONS:
        s = rat.get("%s/%s.%s" % (relay, floor, w))
        if relay == key and s:
            out.append("%.2f × %s (per run %.2f–%.2f)" % (
                s["median"], floor, s["min"], s["max"]))
    return "; ".join(out)


# bench.py's helpers, bound when it imports this module (it is run as a
# script, so a plain import of it here would load it a second time).
BenchError = Relay = run = say = spread = None


def bind(bench_module):
    global BenchError, Relay, run, say, spread
    BenchError = bench_module.BenchError
    Relay = bench_module.Relay
    run = bench_module.run
    say = bench_module.say
    spread = bench_module.spread


def measure(bench, bench_module):
    """The section's results for bench.py's JSON line."""
    bind(bench_module)
    return DbCost(bench).measure()
