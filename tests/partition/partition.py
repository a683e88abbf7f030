#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Partition harness: relays cut off by the network, nothing lost.

Three relays each run in a network namespace of their own, joined to the
host by two veth pairs: one to Postgres (which also listens on the host
ends of those links), one to the broker (a TCP forwarder on the host end
in front of RabbitMQ or the Kafka test broker, as a load balancer sits).
A link is cut by taking its host end down: no FIN, no RST, packets
vanish, and both ends keep half-open connections that only keepalives,
heartbeats and timeouts can notice.

Faults, on a schedule drawn from a printed seed; each cut lands while the
relay holds leased rows (its claims are watched, docs/design.md section 4):

  pg-blip     the Postgres link down for a fraction of the dead-peer
              window, back while the relay is blocked in a read
  pg-short    cut from Postgres past the dead-peer window, within the lease
  pg-long     cut from Postgres past the lease timeout
  broker-cut  cut from the broker mid-batch: its acknowledgements are lost
  both-cut    cut from both
  flap        both links down and up every few hundred ms for a while
  all-cut     every relay cut from both at once, then restored

The verdict line is enforced: nothing lost, failed, pending or in flight;
every lease a relay held when it was cut off from Postgres past the
dead-peer window ended without committing (its late marks refused) and
the server let go of it within the lease timeout; every relay published
again after its links came back. Reported: duplicates as a percentage,
seconds from a cut to the server letting go, and from a link's return to
the relay publishing again (target: twice the detection window).

Needs root, iproute2 and curl; builds nothing (RELAY_TEST_BIN or
build-test/outbox-relay). Under tests/run.sh it uses the suite's services
(and restarts Postgres to listen on the links); alone it starts its own.
"""

import argparse
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "chaos"))
import chaos  # noqa: E402  (the services, the table and the consumers)
from chaos import ChaosError, Psql, run  # noqa: E402

chaos.PREFIX = "partition"
log = chaos.log

# Timings: the dead-peer windows well inside the lease, so a cut relay is
# let go by the server and noticed by itself before its lease would end.
LEASE_S = 15.0
DEAD_PEER_S = 6.0  # OUTBOX_PG_DEAD_PEER_TIMEOUT
HEARTBEAT_S = 3.0  # two silent heartbeats end an AMQP link
KAFKA_WINDOW_S = LEASE_S / 4  # the relay's Kafka socket timeouts (kafka.c)
RELAY_ENV = {
    "OUTBOX_LEASE_TIMEOUT": "15s",
    "OUTBOX_PG_DEAD_PEER_TIMEOUT": "6s",
    "OUTBOX_AMQP_HEARTBEAT": "3s",
    "OUTBOX_SWEEP_INTERVAL": "1s",
    "OUTBOX_PUBLISH_TIMEOUT": "3s",
    "OUTBOX_STATEMENT_TIMEOUT": "2s",
    "OUTBOX_POLL_INTERVAL": "200ms",
    "OUTBOX_BATCH_SIZE": "20",
    "OUTBOX_BACKOFF_BASE": "200ms",
    "OUTBOX_BACKOFF_MAX": "1s",
    "OUTBOX_SHUTDOWN_TIMEOUT": "8s",
    "OUTBOX_LOG_FORMAT": "json",
    "OUTBOX_CE_SOURCE": "/partition",
}

# kind: (links cut, hold in seconds as (low, high), the server must let go)
FAULTS = {
    "pg-blip": (("db",), (0.15 * DEAD_PEER_S, 0.3 * DEAD_PEER_S), False),
    "pg-short": (("db",), (1.5 * DEAD_PEER_S, 0.9 * LEASE_S), True),
    "pg-long": (("db",), (1.2 * LEASE_S, 1.4 * LEASE_S), True),
    "broker-cut": (("mq",), (2.5 * HEARTBEAT_S, 3.5 * HEARTBEAT_S), False),
    "both-cut": (("db", "mq"), (1.5 * DEAD_PEER_S, 0.9 * LEASE_S), True),
    "flap": (("db", "mq"), (8.0, 8.0), False),
    "all-cut": (("db", "mq"), (1.5 * DEAD_PEER_S, 2 * DEAD_PEER_S), True),
}
SINGLE = ["pg-blip", "pg-short", "pg-long", "broker-cut", "both-cut", "flap"]
SHORT = ["pg-short", "broker-cut", "pg-blip"]
PROBE_S = 10  # how long a fault waits for its relay to hold rows


class Net:
    """A namespace per relay with two veth links to the host, "db" and
    "mq"; relay i's host ends are 10.231.B.(4i+1) and 10.232.B.(4i+1), its
    own ends .(4i+2), B drawn from the process id."""

    def __init__(self, n):
        self.n = n
        self.tag = os.getpid()
        self.base = self.tag % 250 + 1
        self.ns = ["orp%d_%d" % (self.tag, i) for i in range(n)]
        self.made_ns = []
        self.made_if = []

    def addr(self, i, link, side):
        return "10.%d.%d.%d" % (231 if link == "db" else 232, self.base,
                                4 * i + (1 if side == "host" else 2))

    def ifname(self, i, link):
        return "op%d%s%d" % (i, link[0], self.tag)

    def setup(self):
        for i, ns in enumerate(self.ns):
            run(["ip", "netns", "add", ns])
            self.made_ns.append(ns)
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            for link in ("db", "mq"):
                host, peer = self.ifname(i, link), self.ifname(i, link) + "n"
                run(["ip", "link", "add", host, "type", "veth", "peer",
                     "name", peer])
                self.made_if.append(host)
                run(["ip", "link", "set", peer, "netns", ns])
                run(["ip", "addr", "add", self.addr(i, link, "host") + "/30",
                     "dev", host])
                run(["ip", "link", "set", host, "up"])
                run(["ip", "-n", ns, "addr", "add",
                     self.addr(i, link, "ns") + "/30", "dev", peer])
                run(["ip", "-n", ns, "link", "set", peer, "up"])

    def set(self, i, link, up):
        run(["ip", "link", "set", self.ifname(i, link),
             "up" if up else "down"], timeout=10)

    def teardown(self):
        for ns in self.made_ns:
            run(["ip", "netns", "del", ns], check=False)
        for host in self.made_if:
            run(["ip", "link", "del", host], check=False)


class Forwarder:
    """tests/partition/forward.py, on the host or inside a namespace."""

    def __init__(self, specs, ns=None):
        cmd = ["python3", os.path.join(HERE, "forward.py")] + specs
        if ns:
            cmd = ["ip", "netns", "exec", ns] + cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline().split()
        if len(line) != len(specs):
            self.stop()
            raise ChaosError("forwarder did not start: " + " ".join(specs))
        self.ports = [int(p) for p in line]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class NsRelay(chaos.Relay):
    """A relay slot whose process runs in its own network namespace,
    reaching Postgres and the broker over its two links."""

    def command(self):
        return ["ip", "netns", "exec", self.h.net.ns[self.slot],
                self.h.relay_bin, "run"]

    def extra_env(self):
        return self.h.slot_env[self.slot]

    def metrics(self, timeout=1.0):
        try:
            text = run(["ip", "netns", "exec", self.h.net.ns[self.slot],
                        "curl", "-sf", "-m", str(timeout),
                        "http://127.0.0.1:%d/metrics" % self.port],
                       timeout=timeout + 5)
        except ChaosError:
            return None
        return chaos.parse_counters(text)


class Harness(chaos.Harness):
    def __init__(self, args):
        super().__init__(args)
        if not shutil.which("curl"):
            raise ChaosError("curl not found (package curl)")
        self.net = Net(chaos.N_RELAYS)
        self.forwarders = []
        self.pg_changed = False
        self.rounds = self.plan(random.Random("%d/plan" % self.seed),
                                args.short, args.passes)
        self.rng = random.Random("%d/faults" % self.seed)

    # ---- the plan ----

    def plan(self, rng, short, passes):
        """Rounds of faults; in a round each relay takes at most one,
        concurrently. Every pass ends with all relays cut at once."""
        rounds = []
        for _ in range(1 if short else passes):
            kinds = list(SHORT if short else SINGLE)
            rng.shuffle(kinds)
            for k in range(0, len(kinds), chaos.N_RELAYS):
                slots = list(range(chaos.N_RELAYS))
                rng.shuffle(slots)
                rounds.append([(kind, [slot]) for kind, slot in
                               zip(kinds[k:k + chaos.N_RELAYS], slots)])
            rounds.append([("all-cut", list(range(chaos.N_RELAYS)))])
        return rounds

    def pace(self):
        return "0", "%d relays, unlimited, behind a stream of %d events/s" \
            % (chaos.N_RELAYS, self.args.rate)

    # ---- setup ----

    def setup(self):
        super().setup()
        self.relay_env.update(RELAY_ENV)
        self.net.setup()
        self.pg_listen()
        self.slot_env = [self.slot_settings(i) for i in range(chaos.N_RELAYS)]

    def pg_listen(self):
        """Postgres also listens on the host ends of the db links (a
        restart), and takes password logins from the namespaces."""
        env = chaos.env_file(os.path.join(self.svc.pg_dir, "env"))
        self.pg_data, self.pg_port = env["PG_DATA"], env["PGPORT"]
        hosts = [self.net.addr(i, "db", "host")
                 for i in range(chaos.N_RELAYS)]
        self.pg_changed = True
        with open(os.path.join(self.pg_data, "pg_hba.conf"), "a") as f:
            f.write("host all all 10.231.%d.0/24 scram-sha-256 "
                    "# partition test\n" % self.net.base)
        self.db.rows("ALTER SYSTEM SET listen_addresses = '%s'"
                     % ",".join(["127.0.0.1"] + hosts))
        self.svc.pg_restart()

    def pg_unlisten(self):
        """Puts Postgres back as it was (in place: the files keep their
        owner, the server's user)."""
        if not self.pg_changed:
            return
        path = os.path.join(self.pg_data, "pg_hba.conf")
        with open(path, "r+") as f:
            kept = [ln for ln in f if "# partition test" not in ln]
            f.seek(0)
            f.writelines(kept)
            f.truncate()
        self.db.rows("ALTER SYSTEM RESET listen_addresses", retry_s=20)
        self.svc.pg_restart()

    def slot_settings(self, i):
        """Relay i's URLs: Postgres on its db link, the broker through a
        forwarder on its mq link."""
        local = "127.0.0.1:" + self.pg_port
        db_url = self.svc.db_url.replace(
            local, "%s:%s" % (self.net.addr(i, "db", "host"), self.pg_port))
        if db_url == self.svc.db_url:
            raise ChaosError("cannot point the database URL at the link")
        mq_host = self.net.addr(i, "mq", "host")
        if self.mode == "amqp":
            target = self.amqp_url.rsplit("@", 1)[-1].split("/", 1)[0]
            fwd = Forwarder(["%s:0=%s" % (mq_host, target)])
            self.forwarders.append(fwd)
            return {"OUTBOX_DATABASE_URL": db_url,
                    "OUTBOX_AMQP_URL": self.amqp_url.replace(
                        target, "%s:%d" % (mq_host, fwd.ports[0]))}
        # The test broker advertises 127.0.0.1 ports: inside the namespace
        # a forwarder answers on those, and crosses the mq link to a host
        # forwarder in front of the real ones.
        brokers = self.svc.kafka_brokers.split(",")
        host = Forwarder(["%s:0=%s" % (mq_host, b) for b in brokers])
        self.forwarders.append(host)
        inner = Forwarder(["%s=%s:%d" % (b, mq_host, p)
                           for b, p in zip(brokers, host.ports)],
                          ns=self.net.ns[i])
        self.forwarders.append(inner)
        return {"OUTBOX_DATABASE_URL": db_url}

    # ---- the stream ----

    def produce(self):
        """Inserts a steady stream (--rate events/s, every 100 ms) until
        told to stop; self.n counts every event in the table."""
        db = Psql(self.svc.db_url)
        per = max(1, self.args.rate // 10)
        t = time.monotonic()
        try:
            while not self.stop_stream.is_set():
                self.insert_events(db, per)
                with self.lock:
                    self.n += per
                t += 0.1
                self.stop_stream.wait(max(0.0, t - time.monotonic()))
        except ChaosError as e:
            with self.lock:
                self.errors.append("producer: %s" % e)
        finally:
            db.close()

    def await_recovery(self, limit_s, episodes=None):
        """Keeps the stream on until every cut relay (of episodes, or of
        the whole run) has published again after its return, or limit_s
        passed."""
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            with self.lock:
                eps = list(self.episodes if episodes is None else episodes)
            if all(self.recovery(ep) is not None for ep in eps):
                return
            time.sleep(0.2)

    # ---- faults ----

    def cut(self, slots, links, up=False):
        for i in slots:
            for link in links:
                self.net.set(i, link, up)

    def cut_holding(self, db, slots, links):
        """Cuts the links the moment one of the relays holds leased rows,
        and returns {slot: held rows} as they stand after the cut; a relay
        found idle by then is let go and watched again."""
        pids = {i: self.relays[i].proc.pid for i in slots}
        watch = ("SELECT 1 FROM %s_claims WHERE split_part(holder, '/', 2) "
                 "IN (%s) AND cardinality(ids) > 0 AND pg_xact_status(xid) = "
                 "'in progress' LIMIT 1" % (
                     self.table, ",".join("'%d'" % p for p in pids.values())))
        end = time.monotonic() + PROBE_S
        while True:
            if time.monotonic() < end and not db.rows(watch, retry_s=10):
                time.sleep(0.002)
                continue
            self.cut(slots, links)
            held = {i: self.held_rows(pid, db) for i, pid in pids.items()}
            if any(held.values()) or time.monotonic() >= end:
                return held
            self.cut(slots, links, up=True)

    def episode(self, kind, slots):
        links, (low, high), must_abort = FAULTS[kind]
        with self.lock:
            hold = self.rng.uniform(low, high)
            flips = [self.rng.uniform(0.2, 1.0) for _ in range(40)]
        db = Psql(self.svc.db_url)
        try:
            eps = [{"kind": kind, "slot": i, "pid": self.relays[i].proc.pid,
                    "links": links, "held": [], "release_s": None,
                    "committed_in_cut": 0, "must_abort": must_abort}
                   for i in slots]
            if kind == "flap":
                t_end = time.monotonic() + hold
                up = False
                while time.monotonic() < t_end:
                    self.cut(slots, links, up=up)
                    up = not up
                    time.sleep(flips.pop())
                hold_s = hold
            else:
                held = self.cut_holding(db, slots, links)
                t_cut = time.monotonic()
                for ep in eps:
                    ep["held"] = held[ep["slot"]]
                self.watch_release(db, eps, t_cut, t_cut + hold)
                hold_s = time.monotonic() - t_cut
                # A held lease that commits while the link is still down
                # had its COMMIT on the server before the cut (its WAL
                # flush outlasted the look that found it in progress):
                # no stale mark. Only one that commits after the return is.
                for ep in eps:
                    ep["committed_in_cut"] = self.committed(db, ep)
            self.cut(slots, links, up=True)
            restored = db.value("SELECT clock_timestamp()")
            for ep in eps:
                ep["hold_s"] = hold_s
                ep["restored"] = restored
            with self.lock:
                self.episodes.extend(eps)
                self.faults[kind] += 1
                self.fault_log.append("%6.1fs %s relay %s links %s for "
                                      "%.1fs, holding %s rows" % (
                                          time.monotonic() - self.t_start,
                                          kind, ",".join(map(str, slots)),
                                          "+".join(links), hold_s,
                                          "/".join(str(len(e["held"]))
                                                   for e in eps)))
        finally:
            db.close()

    def watch_release(self, db, eps, t_cut, t_end):
        """Holds the cut until t_end, noting when the server let go of each
        relay's held transactions (none still in progress)."""
        while time.monotonic() < t_end:
            for ep in eps:
                if ep["held"] and ep["release_s"] is None and "db" in \
                        ep["links"]:
                    xids = ",".join("'%s'" % x for x in
                                    {r[2] for r in ep["held"]})
                    left = db.value(
                        "SELECT count(*) FROM unnest(ARRAY[%s]::xid8[]) x "
                        "WHERE pg_xact_status(x) = 'in progress'" % xids,
                        retry_s=10)
                    if left == "0":
                        ep["release_s"] = time.monotonic() - t_cut
            time.sleep(0.2)

    def run_faults(self):
        log("plan: " + " | ".join(", ".join(
            "%s on %s" % (k, ",".join(map(str, s))) for k, s in r)
            for r in self.rounds))
        for i in range(chaos.N_RELAYS):
            r = NsRelay(i, self)
            r.start()
            self.relays.append(r)
        self.stop_stream = threading.Event()
        producer = threading.Thread(target=self.produce)
        producer.start()
        try:
            self.fault_rounds()
            self.await_recovery(40)
        finally:
            self.stop_stream.set()
            producer.join()
        self.check_crashes()

    def fault_rounds(self):
        time.sleep(2)  # started and leasing
        for faults in self.rounds:
            before = len(self.episodes)
            threads = [threading.Thread(target=self.guarded,
                                        args=(kind, slots))
                       for kind, slots in faults]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                self.check_crashes()
                time.sleep(0.2)
            for t in threads:
                t.join()
            if self.errors or time.monotonic() > self.deadline - 60:
                if not self.errors:
                    self.errors.append("faults ran into the duration cap")
                break
            # The next round starts once this one's relays publish again
            # (or had twice their window to), so a second cut never lands
            # inside the recovery the verdict judges.
            eps = self.episodes[before:]
            limit = max((self.window_s(ep["links"]) for ep in eps),
                        default=0)
            self.await_recovery(2 * limit + 1, eps)
            time.sleep(1)

    def guarded(self, kind, slots):
        # Any failure of a fault thread is the run's, never a silent gap.
        try:
            self.episode(kind, slots)
        except Exception as e:  # noqa: BLE001
            with self.lock:
                self.errors.append("fault %s: %s: %s" % (
                    kind, type(e).__name__, e))

    # ---- the verdict ----

    def window_s(self, links):
        broker = KAFKA_WINDOW_S if self.mode == "kafka" else 2 * HEARTBEAT_S
        return max(DEAD_PEER_S if "db" in links else 0,
                   broker if "mq" in links else 0)

    def recovery(self, ep):
        """Seconds from the links' return to the relay's first row sent
        under a lease taken after it (the database's clock)."""
        v = self.db.value(
            "SELECT extract(epoch FROM min(finished_at) - '%s'::timestamptz)"
            " FROM %s WHERE status = 'sent' AND split_part(leased_by, '/', 2)"
            " = '%d' AND leased_at >= '%s'" % (ep["restored"], self.table,
                                               ep["pid"], ep["restored"]))
        return float(v) if v else None

    def committed(self, db, ep):
        """How many of the transactions ep's relay held its rows in at the
        cut have committed, asked on db."""
        xids = sorted({r[2] for r in ep["held"]})
        return self.committed_xids(xids, db) if xids else 0

    def verdict(self, counts, codes, consumed):
        problems, lost, dups = self.delivery(counts, consumed)
        stale_accepted = 0
        releases, recoveries = [], collections.defaultdict(list)
        for ep in self.episodes:
            who = "%s relay %d (pid %d)" % (ep["kind"], ep["slot"], ep["pid"])
            committed = self.committed(self.db, ep)
            ep["committed"] = committed
            late = committed - ep["committed_in_cut"]
            if ep["must_abort"] and late:
                stale_accepted += late
                problems.append("%s: %d lease(s) held at the cut committed "
                                "after its links returned" % (who, late))
            if ep["must_abort"] and ep["held"]:
                if ep["release_s"] is None:
                    problems.append("%s: the server kept its lease through "
                                    "the cut" % who)
                else:
                    releases.append(ep["release_s"])
                    if ep["release_s"] >= LEASE_S:
                        problems.append("%s: the server let go after %.1f s,"
                                        " not within the lease" % (
                                            who, ep["release_s"]))
            ep["recovery_s"] = self.recovery(ep)
            if ep["recovery_s"] is None:
                problems.append("%s: never published after its links "
                                "returned" % who)
            else:
                w = self.window_s(ep["links"])
                recoveries[w].append(ep["recovery_s"])
                if ep["recovery_s"] > 2 * w:
                    problems.append("%s: published again %.1f s after its "
                                    "links returned, over twice the %.1f s "
                                    "window" % (who, ep["recovery_s"], w))
        if not any(ep["held"] for ep in self.episodes if ep["must_abort"]):
            problems.append("no cut caught a relay holding rows")
        bad_exit = [c for c in codes if c != 0]
        if bad_exit:
            problems.append("relays exited with %s on SIGTERM at the end"
                            % bad_exit)
        worst = max((max(v) / w for w, v in recoveries.items()), default=0)
        line = ("partition verdict: %s mode=%s events=%d lost=%d failed=%d "
                "pending=%d in_flight=%d duplicates=%.2f%% (%d) "
                "stale_accepted=%d lost_leases=%d release_max=%.1fs "
                "recovery_max=%.1fx_window faults=%d seed=%d elapsed=%ds" % (
                    "FAIL" if problems else "PASS", self.mode, self.n, lost,
                    counts["failed"], counts["pending"], counts["in_flight"],
                    100.0 * dups / max(1, self.n), dups, stale_accepted,
                    int(self.lost_leases), max(releases, default=0), worst,
                    sum(self.faults.values()), self.seed,
                    time.monotonic() - self.t_start))
        return line, problems

    def fault_counts(self):
        return "cuts=%d" % sum(self.faults.values())

    def report(self):
        for f in self.fault_log:
            print("  fault " + f)
        for ep in self.episodes:
            rel = ep["release_s"]
            rec = ep["recovery_s"]
            print("  %-10s relay %d pid %-7d held %3d rows, leases committed "
                  "%d (%d in the cut), server let go %s, publishing %s after "
                  "the return (window %.1fs)" % (
                      ep["kind"], ep["slot"], ep["pid"], len(ep["held"]),
                      ep["committed"], ep["committed_in_cut"],
                      "-" if rel is None else "%.1fs after the cut" % rel,
                      "never" if rec is None else "%.1fs" % rec,
                      self.window_s(ep["links"])))

    def cleanup_services(self):
        """The relays killed, the forwarders stopped, and Postgres back
        as it was."""
        super().cleanup_services()
        for f in self.forwarders:
            f.stop()
        try:
            self.pg_unlisten()
        except ChaosError as e:
            print("partition: cleanup: %s" % e, flush=True)

    def teardown(self):
        self.net.teardown()


def main():
    signal.signal(signal.SIGTERM, chaos.on_signal)
    p = argparse.ArgumentParser(
        prog="partition.sh",
        description="Relays cut off by the network on a seeded schedule, "
        "then a verdict on loss, fencing and recovery.")
    p.add_argument("--rate", type=int, default=100,
                   help="events/s inserted while the faults last "
                   "(default 100)")
    p.add_argument("--short", action="store_true",
                   help="one round of three faults and an all-cut")
    p.add_argument("--passes", type=int, default=2,
                   help="passes over every fault (default 2)")
    chaos.add_common_args(p)
    a = p.parse_args()
    # chaos.Harness reads these: a first backlog, and a window it
    # does not use here.
    a.events = 100
    a.window = 10
    if not 10 <= a.rate <= 5000:
        p.error("--rate must be 10..5000")
    if not 1 <= a.passes <= 10:
        p.error("--passes must be 1..10")
    if os.geteuid() != 0:
        p.error("needs root: it makes network namespaces")
    return chaos.start(Harness, p, a)


if __name__ == "__main__":
    sys.exit(main())
