#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Chaos harness: at-least-once with nothing lost while everything breaks.

Three relay processes (short lease timeout and sweep interval) drain N
events from a real Postgres to a real RabbitMQ node (or the Kafka test
broker) while faults land on a schedule drawn from a printed seed:

  kill -9 of a random relay every 1-2 s, restarted at once;
  the broker stopped and started (RabbitMQ stop_app/start_app, Kafka: every
  broker down), a broker that withholds acks (RabbitMQ memory alarm, Kafka:
  slow brokers), produce errors (Kafka only);
  a Postgres fast restart;
  SIGSTOP of a relay while it holds leased rows, until its lease expired and
  the sweeper took the rows back, then SIGCONT: whatever it marks then must
  be refused (fencing), which its lost-lease counter shows.

Then everything is consumed from the broker and counted by event id. One
verdict line says what happened; the run fails (exit 1) if any event was
lost or failed, anything is still pending or in flight, a stale mark was
accepted, a SIGSTOP'd relay's stale marks were not counted as lost leases,
or a relay died by itself. Duplicates are allowed (at-least-once) and
reported as a percentage of the events.

Run standalone it starts its own services with tests/services/*.sh; under
tests/run.sh it uses the services named by RELAY_TEST_* (and disturbs them,
so it runs alone: suite 'chaos'). Builds nothing: the relay binary comes from
RELAY_TEST_BIN or build-test/outbox-relay. Python standard library only.
"""

import argparse
import collections
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.environ.get("RELAY_TEST_SOURCE_ROOT") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVICES = os.path.join(ROOT, "tests", "services")

# Relay settings: short enough that expiry, sweeping and retries all happen
# many times within a short run, and valid under the startup cross-checks
# (publish timeout + statement timeout < lease timeout, sweep < lease).
LEASE_TIMEOUT_S = 3.0
SIGSTOP_PROBE_S = 10
RELAY_ENV = {
    "OUTBOX_LEASE_TIMEOUT": "3s",
    "OUTBOX_SWEEP_INTERVAL": "500ms",
    "OUTBOX_PUBLISH_TIMEOUT": "1s",
    "OUTBOX_STATEMENT_TIMEOUT": "1s",
    "OUTBOX_POLL_INTERVAL": "200ms",
    "OUTBOX_BATCH_SIZE": "20",
    "OUTBOX_BACKOFF_BASE": "200ms",
    "OUTBOX_BACKOFF_MAX": "1s",
    "OUTBOX_SHUTDOWN_TIMEOUT": "5s",
    "OUTBOX_LOG_FORMAT": "json",
    "OUTBOX_CE_SOURCE": "/chaos",
}
N_RELAYS = 3
# Log prefix and table schema prefix; the partition harness, which builds
# on this one, sets its own.
PREFIX = "chaos"


def log(msg):
    print(PREFIX + ": " + msg, flush=True)


def verdict_line(mode, word, seed, counts=""):
    """The run in one line with a fixed prefix, "VERDICT chaos_amqp: PASS
    seed=...", which tests/run.sh gathers from every harness; printed
    once, whatever ended the run (ERROR: the harness gave no verdict)."""
    return ("VERDICT %s_%s: %s seed=%d %s" % (PREFIX, mode, word, seed,
                                               counts)).rstrip()


class ChaosError(Exception):
    """The harness itself could not do its job (not a verdict)."""


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, timeout=60, check=True, **kw):
    """Runs a command, returning its stdout; raises with its output."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        raise ChaosError("%s: no answer within %ds" % (" ".join(cmd[:3]),
                                                       timeout))
    if check and p.returncode != 0:
        raise ChaosError("%s failed (exit %d): %s" % (
            " ".join(cmd[:4]), p.returncode,
            (p.stderr or p.stdout).strip()[-800:]))
    return p.stdout


def env_file(path):
    out = {}
    with open(path) as f:
        for line in f:
            key, sep, value = line.rstrip("\n").partition("=")
            if sep:
                out[key] = value
    return out


class Psql:
    """One long-lived psql session, reopened whenever it breaks (the
    harness restarts Postgres on purpose). Queries are read-only or safe to
    run twice, so a broken one is simply run again."""

    MARK = "__chaos_end__"

    def __init__(self, url):
        self.url = url
        self.proc = None
        self.lock = threading.Lock()

    def _open(self):
        self.proc = subprocess.Popen(
            ["psql", self.url, "-X", "-A", "-t", "-q", "-F", "\t",
             "-v", "ON_ERROR_STOP=0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1)

    def close(self):
        if self.proc:
            try:
                self.proc.kill()
                self.proc.wait(5)
            except OSError:
                pass
            self.proc = None

    def _once(self, sql):
        if not self.proc or self.proc.poll() is not None:
            self._open()
        self.proc.stdin.write(sql.rstrip().rstrip(";") + ";\n\\echo "
                              + self.MARK + "\n")
        self.proc.stdin.flush()
        lines = []
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise ChaosError("psql exited: " + "".join(lines)[-300:])
            line = line.rstrip("\n")
            if line == self.MARK:
                break
            lines.append(line)
        bad = [ln for ln in lines if re.match(
            r"(ERROR|FATAL|psql:|server closed|connection to server|"
            r"The connection|You are currently not connected|"
            r"no connection)", ln)]
        if bad:
            raise ChaosError(" ".join(lines)[-300:])
        return [ln.split("\t") for ln in lines if ln != ""]

    def rows(self, sql, retry_s=40):
        deadline = time.monotonic() + retry_s
        with self.lock:
            while True:
                try:
                    return self._once(sql)
                except (ChaosError, OSError) as e:
                    self.close()
                    if time.monotonic() > deadline:
                        raise ChaosError("query failed for %ds: %s" %
                                         (retry_s, e))
                    time.sleep(0.3)

    def value(self, sql, retry_s=40):
        r = self.rows(sql, retry_s)
        return r[0][0] if r else None


class Services:
    """The Postgres, RabbitMQ and Kafka the run uses: those of tests/run.sh
    when it set them up, else our own, stopped at the end."""

    def __init__(self, mode, relay_bin, work):
        self.mode = mode
        self.own = []
        e = os.environ
        need = ["RELAY_TEST_DATABASE_URL", "RELAY_TEST_PG_DIR"]
        need += (["RELAY_TEST_AMQP_URL", "RELAY_TEST_RABBITMQ_DIR"]
                 if mode == "amqp" else
                 ["RELAY_TEST_KAFKA_BROKERS", "RELAY_TEST_KAFKA_DIR"])
        if all(e.get(k) for k in need):
            self.db_url = e["RELAY_TEST_DATABASE_URL"]
            self.pg_dir = e["RELAY_TEST_PG_DIR"]
            self.amqp_url = e.get("RELAY_TEST_AMQP_URL", "")
            self.rmq_dir = e.get("RELAY_TEST_RABBITMQ_DIR", "")
            self.kafka_brokers = e.get("RELAY_TEST_KAFKA_BROKERS", "")
            self.kafka_dir = e.get("RELAY_TEST_KAFKA_DIR", "")
            log("using the services of tests/run.sh")
            return
        log("starting services in " + work)
        self.pg_dir = os.path.join(work, "pg")
        os.mkdir(self.pg_dir)
        self.own.append(("postgres.sh", self.pg_dir))
        run(["bash", os.path.join(SERVICES, "postgres.sh"), "start",
             self.pg_dir], timeout=120)
        self.db_url = env_file(os.path.join(self.pg_dir, "env"))[
            "RELAY_TEST_DATABASE_URL"]
        self.amqp_url = self.rmq_dir = ""
        self.kafka_brokers = self.kafka_dir = ""
        if mode == "amqp":
            self.rmq_dir = os.path.join(work, "rabbitmq")
            os.mkdir(self.rmq_dir)
            self.own.append(("rabbitmq.sh", self.rmq_dir))
            run(["bash", os.path.join(SERVICES, "rabbitmq.sh"), "start",
                 self.rmq_dir], timeout=180)
            self.amqp_url = env_file(os.path.join(self.rmq_dir, "env"))[
                "RELAY_TEST_AMQP_URL"]
        else:
            broker = os.path.join(os.path.dirname(relay_bin), "tests",
                                  "kafka_mock_broker")
            if not os.access(broker, os.X_OK):
                raise ChaosError("no Kafka test broker at " + broker)
            self.kafka_dir = os.path.join(work, "kafka")
            os.mkdir(self.kafka_dir)
            self.own.append(("kafka.sh", self.kafka_dir))
            run(["bash", os.path.join(SERVICES, "kafka.sh"), "start",
                 self.kafka_dir, broker], timeout=60)
            self.kafka_brokers = env_file(os.path.join(
                self.kafka_dir, "env"))["RELAY_TEST_KAFKA_BROKERS"]

    def stop(self):
        for script, d in reversed(self.own):
            run(["bash", os.path.join(SERVICES, script), "stop", d],
                timeout=120, check=False)

    def rabbitmqctl(self, *args, timeout=60, check=True):
        return run(["bash", os.path.join(SERVICES, "rabbitmq.sh"), "ctl",
                    self.rmq_dir] + list(args), timeout=timeout, check=check)

    def kafka_ctl(self, *args, check=True):
        return run(["bash", os.path.join(SERVICES, "kafka.sh"), "ctl",
                    self.kafka_dir] + list(args), timeout=30, check=check)

    def pg_restart(self):
        run(["bash", os.path.join(SERVICES, "postgres.sh"), "restart",
             self.pg_dir], timeout=120)


class Relay:
    """One relay slot: a process that is killed and replaced many times.
    Each generation gets a fresh HTTP port, so a restart never waits for
    the old one's sockets."""

    def __init__(self, slot, harness):
        self.slot = slot
        self.h = harness
        self.gen = 0
        self.proc = None
        self.port = None
        self.log_path = None
        self.busy = threading.Lock()  # held while a fault owns this relay

    def command(self):
        """The relay's command line; a subclass may run it elsewhere."""
        return [self.h.relay_bin, "run"]

    def start(self):
        self.gen += 1
        self.port = free_port()
        self.log_path = os.path.join(
            self.h.work, "relay-%d-%03d.log" % (self.slot, self.gen))
        env = dict(os.environ)
        env.update(self.h.relay_env)
        env.update(self.extra_env())
        env["OUTBOX_HTTP_ADDR"] = "127.0.0.1:%d" % self.port
        with open(self.log_path, "w") as err:
            self.proc = subprocess.Popen(
                self.command(), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err)
        # Set per process: the main thread may look at the old one while
        # the new one starts.
        self.proc.expected_exit = False

    def extra_env(self):
        """Settings of this slot alone, over the harness's."""
        return {}

    def metrics(self, timeout=1.0):
        """Counters from /metrics, or None if it does not answer."""
        try:
            with urllib.request.urlopen(
                    "http://127.0.0.1:%d/metrics" % self.port,
                    timeout=timeout) as r:
                return parse_counters(r.read().decode())
        except (OSError, ValueError):
            return None

    def exited_by_itself(self):
        p = self.proc
        return p is not None and not p.expected_exit and p.poll() is not None

    def kill9(self):
        """SIGKILL; False when the relay had already exited by itself
        (a crash the kill must not hide: check_crashes reports it)."""
        if self.proc.poll() is not None:
            return False
        self.proc.expected_exit = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        return True

    def stop(self, timeout=20):
        """SIGTERM and wait; returns the exit code (None: had to kill)."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.expected_exit = True
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None


def parse_counters(text):
    """The fencing counter of a /metrics page."""
    out = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"(outbox_lost_leases_total)\s+(\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


class Harness:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.mode = args.mode
        self.n = args.events
        # Several outbox tables behind each relay (docs/design.md §13):
        # the harness reads them through views, so every check below
        # looks at all of them at once.
        self.sources = getattr(args, "sources", 1)
        # OUTBOX_ORDERING=partition: the verdict also checks each key's
        # first deliveries came in seq order (docs/design.md §6).
        self.ordered = getattr(args, "ordered", False)
        self.window = args.window or min(120, max(30, self.n // 100))
        self.t_start = time.monotonic()
        self.deadline = self.t_start + args.duration_cap
        self.relay_bin = (os.environ.get("RELAY_TEST_BIN")
                          or os.path.join(ROOT, "build-test", "outbox-relay"))
        if not os.access(self.relay_bin, os.X_OK):
            raise ChaosError("no relay binary at %s (build it, or set "
                             "RELAY_TEST_BIN)" % self.relay_bin)
        self.consume_bin = (os.environ.get("RELAY_TEST_AMQP_CONSUME")
                            or os.path.join(os.path.dirname(self.relay_bin),
                                            "tests", "amqp_consume"))
        if self.mode == "amqp" and not os.access(self.consume_bin, os.X_OK):
            raise ChaosError("no amqp_consume at " + self.consume_bin)
        if self.mode == "kafka" and not shutil.which("kcat"):
            raise ChaosError("kcat not found (package kcat)")
        self.work = tempfile.mkdtemp(prefix="outbox-chaos.",
                                     dir=os.environ.get("TMPDIR", "/tmp"))
        os.chmod(self.work, 0o755)
        self.failed = False
        self.stop_faults = threading.Event()
        self.faults = collections.Counter()
        self.big_faults_planned = 0
        self.big_faults_done = 0
        self.fault_log = []
        self.errors = []
        self.episodes = []  # SIGSTOP episodes
        self.delivered = None  # (lost, duplicates), once counted
        self.out_of_order = 0  # ordered mode's violations, once counted
        self.lost_leases = 0.0  # summed over relays, scraped before exit
        self.lock = threading.Lock()
        self.relays = []
        self.broker_disturbed = False
        self.alarm_raised = False
        self.kafka_slow = False

    # ---- setup ----

    def setup(self):
        self.svc = Services(self.mode, self.relay_bin, self.work)
        self.db = Psql(self.svc.db_url)
        tag = "%s_%d" % (PREFIX, os.getpid())
        self.schema = tag
        self.table = tag + ".outbox_events"
        self.tables = [self.table] if self.sources == 1 else [
            "%s.events_%d" % (tag, i) for i in range(1, self.sources + 1)]
        self.db.rows("SET client_min_messages = warning; "
                     "DROP SCHEMA IF EXISTS %s CASCADE" % tag)
        run([self.relay_bin, "migrate"], env=dict(
            os.environ, OUTBOX_DATABASE_URL=self.svc.db_url,
            OUTBOX_TABLE=",".join(self.tables)))
        if self.sources > 1:
            # What the checks read: every table's rows and claims as one.
            for what, suffix in (("", ""), ("_claims", "_claims")):
                self.db.rows("CREATE VIEW %s%s AS %s" % (
                    self.table, suffix, " UNION ALL ".join(
                        "SELECT * FROM %s%s" % (t, suffix)
                        for t in self.tables)))
        rate, pacing = self.pace()
        self.relay_env = dict(RELAY_ENV)
        self.relay_env.update({
            "OUTBOX_DATABASE_URL": self.svc.db_url,
            "OUTBOX_TABLE": ",".join(self.tables),
            "OUTBOX_PUBLISHER": self.mode,
            "OUTBOX_MAX_RATE": rate,
        })
        if self.ordered:
            self.relay_env["OUTBOX_ORDERING"] = "partition"
        if self.mode == "amqp":
            url = self.svc.amqp_url.rstrip("/")
            self.amqp_url = url
            self.exchange = "chaos.%d.x" % os.getpid()
            self.queue = "chaos.%d.q" % os.getpid()
            run([self.consume_bin, "--url", url, "--declare-exchange",
                 self.exchange, "--queue", self.queue, "--bind",
                 self.exchange + ":#"])
            self.relay_env.update({"OUTBOX_AMQP_URL": url,
                                   "OUTBOX_AMQP_EXCHANGE": self.exchange})
        else:
            self.topic = "chaos.%d" % os.getpid()
            self.svc.kafka_ctl("create_topic", self.topic, "3")
            self.relay_env.update({
                "OUTBOX_KAFKA_BROKERS": self.svc.kafka_brokers,
                "OUTBOX_KAFKA_TOPIC": self.topic})
        self.insert_events(self.db, self.n)
        log("%d events in %s, %s, work dir %s" % (
            self.n, ", ".join(self.tables), pacing, self.work))

    def insert_events(self, db, n):
        """n events: a JSON payload of ~220 bytes, 16 routing keys, 64
        partition keys; spread evenly over the tables."""
        for i, t in enumerate(self.tables):
            share = n // len(self.tables) + (i < n % len(self.tables))
            db.rows(
                "INSERT INTO %s (type, routing_key, partition_key, payload) "
                "SELECT 'com.example.%s', 'k.' || (g %% 16), "
                "'key-' || (g %% 64), convert_to(json_build_object('n', g, "
                "'pad', repeat('x', 200))::text, 'UTF8') "
                "FROM generate_series(1, %d) g" % (t, PREFIX, share))

    def pace(self):
        """The relays' OUTBOX_MAX_RATE, and the run's pacing in words. The
        backlog must outlast the fault window and a SIGSTOP probe that
        starts at its end: a restarted relay begins with a fresh rate
        budget, so kills speed the drain up as well as slow it."""
        drain_s = self.window + SIGSTOP_PROBE_S + 5
        rate = max(5, math.ceil(self.n / (N_RELAYS * drain_s)))
        return str(rate), "%d relays at %d events/s each, fault window " \
            "%ds" % (N_RELAYS, rate, self.window)

    # ---- faults ----

    def note(self, kind, detail=""):
        with self.lock:
            self.faults[kind] += 1
            self.fault_log.append("%6.1fs %s %s" % (
                time.monotonic() - self.t_start, kind, detail))

    def sleep_until(self, t):
        while not self.stop_faults.is_set():
            left = t - time.monotonic()
            if left <= 0:
                return True
            self.stop_faults.wait(min(left, 0.2))
        return False

    def scrape_into_total(self, relay):
        m = relay.metrics()
        if m:
            with self.lock:
                self.lost_leases += m["outbox_lost_leases_total"]

    def kill_loop(self, rng, end):
        while not self.stop_faults.is_set():
            if not self.sleep_until(time.monotonic() + rng.uniform(1, 2)):
                return
            if time.monotonic() >= end:
                return
            relay = rng.choice(self.relays)
            # A relay in a SIGSTOP episode is left alone.
            if not relay.busy.acquire(blocking=False):
                continue
            try:
                self.scrape_into_total(relay)
                if not relay.kill9():
                    continue
                self.note("kill-9", "relay %d gen %d" % (relay.slot,
                                                         relay.gen))
                relay.start()
            finally:
                relay.busy.release()

    def big_fault_loop(self, rng, plan):
        for at, kind in plan:
            if not self.sleep_until(self.t_faults + at):
                return
            try:
                getattr(self, "fault_" + kind.replace("-", "_"))(rng)
            except ChaosError as e:
                self.errors.append("fault %s: %s" % (kind, e))
                self.stop_faults.set()
                return
            with self.lock:
                self.big_faults_done += 1

    def guarded(self, target, *args):
        """Runs a fault thread's target; whatever it raises is an error of
        the run, not a thread that ends in silence with faults unrun."""
        try:
            target(*args)
        except Exception as e:  # noqa: BLE001 - reported, not swallowed
            self.errors.append("fault thread %s: %r" % (target.__name__, e))
            self.stop_faults.set()

    def fault_broker_stop(self, rng):
        hold = rng.uniform(2, 4)
        self.broker_disturbed = True
        if self.mode == "amqp":
            self.svc.rabbitmqctl("stop_app")
            self.note("broker-stop", "stop_app for %.1fs" % hold)
            time.sleep(hold)
            self.svc.rabbitmqctl("start_app")
        else:
            self.svc.kafka_ctl("all_down")
            self.note("broker-stop", "all brokers down for %.1fs" % hold)
            time.sleep(hold)
            self.svc.kafka_ctl("all_up")
        self.broker_disturbed = False

    def fault_broker_slow(self, rng):
        hold = rng.uniform(2, 4)
        if self.mode == "amqp":
            self.alarm_raised = True
            self.svc.rabbitmqctl("set_vm_memory_high_watermark", "0")
            self.note("broker-alarm", "memory alarm for %.1fs" % hold)
            time.sleep(hold)
            self.svc.rabbitmqctl("set_vm_memory_high_watermark", "0.4")
            self.alarm_raised = False
        else:
            self.kafka_slow = True
            for b in (1, 2, 3):
                self.svc.kafka_ctl("rtt", str(b), "1500")
            self.note("broker-slow", "1.5s round trips for %.1fs" % hold)
            time.sleep(hold)
            for b in (1, 2, 3):
                self.svc.kafka_ctl("rtt", str(b), "0")
            self.kafka_slow = False

    def fault_broker_errors(self, rng):
        # Produce (ApiKey 0) answered with a retriable error a few times.
        n = rng.randint(5, 20)
        self.svc.kafka_ctl("push_errors", "0", str(n),
                           "NOT_ENOUGH_REPLICAS")
        self.note("broker-errors", "%d produce errors" % n)

    def fault_pg_restart(self, rng):
        t0 = time.monotonic()
        self.svc.pg_restart()
        self.note("pg-restart", "fast restart in %.1fs" % (
            time.monotonic() - t0))

    def held_rows(self, pid, db=None):
        """(id, lease id, transaction) of the rows pid's live leases hold,
        asked on db (a thread's own session) or the harness's."""
        return (db or self.db).rows(
            "SELECT unnest(ids), lease_id, xid FROM %s_claims WHERE "
            "split_part(holder, '/', 2) = '%d' AND pg_xact_status(xid) = "
            "'in progress'" % (self.table, pid), retry_s=10)

    def committed_xids(self, xids, db=None):
        """How many of the transactions xids (xid8 text) committed, asked
        on db (a thread's own session) or the harness's."""
        return int((db or self.db).value(
            "SELECT count(*) FROM unnest(ARRAY[%s]::xid8[]) x WHERE "
            "pg_xact_status(x) = 'committed'" % ",".join(
                "'%s'" % x for x in xids)))

    def fault_sigstop(self, rng):
        # A relay may be idle just then (waiting out its rate or probing
        # its publisher): try each one in turn until one is caught.
        order = list(self.relays)
        rng.shuffle(order)
        for relay in order:
            caught = len(self.episodes)
            with relay.busy:
                self.sigstop_episode(relay, rng, probe_s=SIGSTOP_PROBE_S)
            if len(self.episodes) > caught:
                return

    def sigstop_episode(self, relay, rng, probe_s):
        proc = relay.proc
        before = relay.metrics() or collections.Counter()
        held = []
        tries = 0
        # Stop it at a moment it holds leased rows. A relay held to a
        # rate holds rows for a few ms of every cycle, so a stop at a
        # random moment rarely lands: watch its leases (one query per ms
        # or so) and stop it the moment some appear, then look again
        # (it may have marked them in between).
        probe_end = time.monotonic() + probe_s
        watch = ("SELECT 1 FROM %s_claims WHERE split_part(holder, '/', 2) "
                 "= '%d' AND cardinality(ids) > 0 AND pg_xact_status(xid) = "
                 "'in progress' LIMIT 1" % (self.table, proc.pid))
        while time.monotonic() < probe_end and proc.poll() is None:
            if not self.db.rows(watch, retry_s=10):
                time.sleep(0.001)
                continue
            tries += 1
            os.kill(proc.pid, signal.SIGSTOP)
            for _ in range(50):
                if proc_state(proc.pid) in ("T", "t"):
                    break
                time.sleep(0.002)
            # A statement sent just before the stop finishes first.
            time.sleep(0.05)
            held = self.held_rows(proc.pid)
            if held:
                break
            os.kill(proc.pid, signal.SIGCONT)
        if not held:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
            left = self.counts()
            self.note("sigstop-missed", "relay %d held nothing in %d tries "
                      "(%d pending, %d in flight)" % (
                          relay.slot, tries, left["pending"],
                          left["in_flight"]))
            return
        leases = sorted({r[1] for r in held})
        xids = sorted({r[2] for r in held})
        ids = [r[0] for r in held]
        t_stop = time.monotonic()
        # Held past its lease timeout (the server ends the stopped
        # relay's session) until the sweeper charged its claims.
        lease_list = ",".join("'%s'" % x for x in leases)
        swept = False
        while time.monotonic() < t_stop + LEASE_TIMEOUT_S + 15:
            left = self.db.value(
                "SELECT count(*) FROM %s_claims WHERE lease_id IN (%s) AND "
                "cardinality(ids) > 0" % (self.table, lease_list),
                retry_s=10)
            if left == "0" and time.monotonic() > t_stop + LEASE_TIMEOUT_S:
                swept = True
                break
            time.sleep(0.2)
        held_for = time.monotonic() - t_stop
        # A lease transaction that committed while its relay was stopped
        # had its COMMIT on the server before the stop (its WAL flush
        # outlasting the look that found it in progress): no stale mark,
        # and no lease its relay could lose. Only a commit after SIGCONT
        # is a stale mark.
        committed_stopped = self.committed_xids(xids)
        os.kill(proc.pid, signal.SIGCONT)
        self.note("sigstop", "relay %d pid %d with %d leased rows for "
                  "%.1fs (%d probes; %d of %d lease transactions committed "
                  "while stopped)" % (relay.slot, proc.pid, len(ids),
                                      held_for, tries, committed_stopped,
                                      len(xids)))
        # Give it time to find out: renew, wait for the broker, mark.
        after = collections.Counter()
        t_cont = time.monotonic()
        while time.monotonic() < t_cont + 10:
            time.sleep(0.5)
            after = relay.metrics(timeout=2) or collections.Counter()
            if after["outbox_lost_leases_total"] > \
                    before["outbox_lost_leases_total"] and \
                    time.monotonic() > t_cont + 2:
                break
        self.episodes.append({
            "pid": proc.pid, "ids": ids, "leases": leases, "xids": xids,
            "swept": swept, "committed_stopped": committed_stopped,
            "held_s": held_for,
            "lost": after["outbox_lost_leases_total"]
            - before["outbox_lost_leases_total"],
            "scraped": bool(after)})

    def plan(self, rng):
        kinds = ["broker-stop", "broker-slow", "pg-restart", "sigstop"]
        if self.mode == "kafka":
            kinds.append("broker-errors")
        rounds = max(1, self.window // 45)
        planned = kinds * rounds
        rng.shuffle(planned)
        span = self.window / len(planned)
        return [(i * span + rng.uniform(0.1, 0.5) * span, k)
                for i, k in enumerate(planned)]

    # ---- the run ----

    def counts(self):
        rows = self.db.rows("SELECT status, count(*) FROM %s GROUP BY 1"
                            % self.table)
        c = collections.Counter()
        for status, n in rows:
            c[status] = int(n)
        # Leased rows still say pending: a live lease is a claim whose
        # transaction is in progress (docs/design.md §4).
        held = int(self.db.value(
            "SELECT coalesce(sum(cardinality(ids)), 0) FROM %s_claims "
            "WHERE pg_xact_status(xid) = 'in progress'" % self.table))
        c["in_flight"] += held
        c["pending"] -= held
        return c

    def check_crashes(self):
        for r in self.relays:
            if r.exited_by_itself():
                self.errors.append(
                    "relay %d gen %d exited by itself with status %s "
                    "(log %s)" % (r.slot, r.gen, r.proc.returncode,
                                  r.log_path))
                r.proc.expected_exit = True  # reported once
                if not self.stop_faults.is_set():
                    r.start()

    def run_faults(self):
        rng_kill = random.Random("%d/kill" % self.seed)
        rng_big = random.Random("%d/big" % self.seed)
        plan = self.plan(rng_big)
        log("fault plan: kill -9 every 1-2 s, then " + ", ".join(
            "%s at %.0fs" % (k, t) for t, k in plan))
        for i in range(N_RELAYS):
            r = Relay(i, self)
            r.start()
            self.relays.append(r)
        self.t_faults = time.monotonic()
        end = self.t_faults + self.window
        self.big_faults_planned = len(plan)
        threads = [
            threading.Thread(target=self.guarded,
                             args=(self.kill_loop, rng_kill, end)),
            threading.Thread(target=self.guarded,
                             args=(self.big_fault_loop, rng_big, plan)),
        ]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                self.check_crashes()
                if time.monotonic() > self.deadline - 60:
                    self.errors.append("fault phase ran into the duration "
                                       "cap")
                    self.stop_faults.set()
                time.sleep(0.2)
        finally:
            self.stop_faults.set()
            for t in threads:
                t.join()
        self.check_crashes()

    def drain(self):
        """Waits until nothing is pending or in flight."""
        c = self.counts()
        while time.monotonic() < self.deadline - 40:
            self.check_crashes()
            c = self.counts()
            if c["pending"] == 0 and c["in_flight"] == 0:
                break
            time.sleep(0.5)
        return c

    def stop_relays(self):
        codes = []
        for r in self.relays:
            if r.proc.poll() is None:
                self.scrape_into_total(r)
            codes.append(r.stop())
        return codes

    def consume(self):
        """Every event id the broker holds, with repeats."""
        ids = []
        if self.mode == "amqp":
            out = self.svc.rabbitmqctl("list_queues", "-q", "name",
                                       "messages")
            depth = None
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == self.queue:
                    depth = int(parts[1])
            if depth is None:
                raise ChaosError("queue %s not found" % self.queue)
            if depth:
                out = run([self.consume_bin, "--url", self.amqp_url,
                           "--queue", self.queue, "--count", str(depth),
                           "--idle-timeout", "15"], timeout=300)
                for line in out.splitlines():
                    msg = json.loads(line)
                    mid = msg["properties"].get("message_id") or \
                        msg["headers"].get("ce-id")
                    ids.append(mid)
        else:
            out = run(["kcat", "-C", "-q", "-b", self.svc.kafka_brokers,
                       "-t", self.topic, "-o", "beginning", "-e", "-f",
                       "%h\n"], timeout=300)
            for line in out.splitlines():
                m = re.search(r"(?:^|,)ce_id=([0-9a-fA-F-]{36})", line)
                if m:
                    ids.append(m.group(1))
                elif line.strip():
                    raise ChaosError("record without ce_id: " + line[:200])
        return ids

    def delivery(self, counts, consumed):
        """(problems, lost, duplicates) of the delivery itself: every
        event consumed, none unknown, every row sent and none left."""
        table_ids = {r[0] for r in self.db.rows(
            "SELECT id FROM %s" % self.table)}
        got = collections.Counter(consumed)
        lost = len(table_ids - set(got))
        phantom = len(set(got) - table_ids)
        problems = list(self.errors)
        if lost:
            problems.append("%d events never reached the broker" % lost)
        if phantom:
            problems.append("%d consumed ids are not in the table" % phantom)
        for k in ("failed", "pending", "in_flight"):
            if counts[k]:
                problems.append("%d rows %s at the end" % (counts[k], k))
        if counts["sent"] != self.n:
            problems.append("%d rows sent, want %d" % (counts["sent"],
                                                       self.n))
        self.delivered = (lost, sum(n - 1 for n in got.values()))
        return problems, lost, self.delivered[1]

    def order_violations(self, consumed):
        """Ordered mode: first deliveries (in the order consumed) of a
        keyed row after the first delivery of a later row of its key.
        One broker queue, or one Kafka partition per key, keeps the
        order in which the relays published."""
        where = {}
        for t in self.tables:
            for mid, key, seq in self.db.rows(
                    "SELECT id, partition_key, seq FROM %s WHERE "
                    "partition_key IS NOT NULL" % t):
                where[mid] = ((t, key), int(seq))
        newest, seen, bad = {}, set(), 0
        for mid in consumed:
            if mid in seen or mid not in where:
                continue
            seen.add(mid)
            key, seq = where[mid]
            if newest.get(key, -1) > seq:
                bad += 1
            newest[key] = max(newest.get(key, -1), seq)
        return bad

    def verdict(self, counts, codes, consumed):
        problems, lost, dups = self.delivery(counts, consumed)
        if self.ordered:
            self.out_of_order = self.order_violations(consumed)
            if self.out_of_order:
                problems.append("%d first deliveries came after a later "
                                "row of their key" % self.out_of_order)
        # Stale marks: the transaction a SIGSTOP'd relay held its rows
        # in may never commit (the server ended it past the lease; only
        # a fresh lease may finish the rows). Each of its rows counts once
        # one of them commits after SIGCONT.
        stale_accepted = 0
        for ep in self.episodes:
            committed = self.committed_xids(ep["xids"])
            stale_accepted += (len(ep["ids"])
                               if committed > ep["committed_stopped"] else 0)
        if stale_accepted:
            problems.append("%d marks of a stale lease were accepted"
                            % stale_accepted)
        if not self.episodes:
            problems.append("no SIGSTOP caught a relay holding rows")
        # A PASS says the faults happened: every one planned ran, and the
        # kill loop (every 1-2 s) killed.
        if self.big_faults_done < self.big_faults_planned:
            problems.append("%d of %d planned faults ran"
                            % (self.big_faults_done,
                               self.big_faults_planned))
        if self.faults["kill-9"] < 1:
            problems.append("no relay was killed")
        for ep in self.episodes:
            if not ep["swept"]:
                problems.append("rows of stopped relay pid %d were not swept "
                                "within the lease timeout + 15 s"
                                % ep["pid"])
            elif not ep["scraped"]:
                problems.append("relay pid %d did not answer /metrics after "
                                "SIGCONT" % ep["pid"])
            elif ep["lost"] < 1 and \
                    ep["committed_stopped"] < len(ep["xids"]):
                problems.append("relay pid %d came back from SIGSTOP with "
                                "%d stale rows but counted no lost lease"
                                % (ep["pid"], len(ep["ids"])))
        bad_exit = [c for c in codes if c != 0]
        if bad_exit:
            problems.append("relays exited with %s on SIGTERM at the end"
                            % bad_exit)
        stale_rejected = sum(int(ep["lost"]) for ep in self.episodes)
        line = ("chaos verdict: %s mode=%s events=%d lost=%d failed=%d "
                "pending=%d in_flight=%d duplicates=%.2f%% (%d) "
                "lost_leases=%d stale_rejected=%d stale_accepted=%d "
                "faults=%d%s seed=%d elapsed=%ds" % (
                    "FAIL" if problems else "PASS", self.mode, self.n, lost,
                    counts["failed"], counts["pending"], counts["in_flight"],
                    100.0 * dups / max(1, self.n), dups,
                    int(self.lost_leases), stale_rejected, stale_accepted,
                    sum(v for k, v in self.faults.items()
                        if k != "sigstop-missed"),
                    " out_of_order=%d" % self.out_of_order
                    if self.ordered else "",
                    self.seed, time.monotonic() - self.t_start))
        return line, problems

    def cleanup_services(self):
        """Leaves a shared broker as it found it, whatever happened."""
        for r in self.relays:
            if r.proc and r.proc.poll() is None:
                try:
                    os.kill(r.proc.pid, signal.SIGCONT)
                    r.proc.kill()
                    r.proc.wait(10)
                except OSError:
                    pass
        try:
            if self.mode == "amqp" and self.alarm_raised:
                self.svc.rabbitmqctl("set_vm_memory_high_watermark", "0.4",
                                     check=False)
            if self.mode == "amqp" and self.broker_disturbed:
                self.svc.rabbitmqctl("start_app", check=False)
            if self.mode == "kafka" and self.broker_disturbed:
                self.svc.kafka_ctl("all_up", check=False)
            if self.mode == "kafka" and self.kafka_slow:
                for b in (1, 2, 3):
                    self.svc.kafka_ctl("rtt", str(b), "0", check=False)
        except ChaosError:
            pass

    def report(self):
        """What happened, printed above the verdict line."""
        for f in self.fault_log:
            print("  fault " + f)
        for ep in self.episodes:
            print("  sigstop pid %d: %d rows under %d lease(s), held "
                  "%.1fs, lost leases counted %d"
                  % (ep["pid"], len(ep["ids"]), len(ep["leases"]),
                     ep["held_s"], ep["lost"]))

    def teardown(self):
        """What the run made beside the services, undone after them."""

    def fault_counts(self):
        """The faults, as the one-line verdict names them."""
        return "kills=%d faults=%d" % (
            self.faults["kill-9"], sum(v for k, v in self.faults.items()
                                       if k != "sigstop-missed"))

    def main(self):
        log("seed=%d mode=%s events=%d (repeat with --seed %d)" % (
            self.seed, self.mode, self.n, self.seed))
        ok = False
        word = "ERROR"
        try:
            self.setup()
            self.run_faults()
            log("faults over: %s" % dict(self.faults))
            counts = self.drain()
            codes = self.stop_relays()
            consumed = self.consume()
            line, problems = self.verdict(counts, codes, consumed)
            self.report()
            for p in problems:
                print("  problem: " + p)
            print(line, flush=True)
            ok = not problems
            word = "PASS" if ok else "FAIL"
        except ChaosError as e:
            print("%s: error: %s (seed=%d)" % (PREFIX, e, self.seed),
                  flush=True)
        finally:
            self.stop_faults.set()
            lost, dups = self.delivered or ("?", "?")
            print(verdict_line(self.mode, word, self.seed,
                               "%slost=%s duplicates=%s %s" % (
                                   "ordered out_of_order=%d " %
                                   self.out_of_order if self.ordered
                                   else "", lost, dups,
                                   self.fault_counts())),
                  flush=True)
            if hasattr(self, "svc"):
                self.cleanup_services()
                if ok:
                    self.db.rows("SET client_min_messages = warning; DROP "
                                 "SCHEMA IF EXISTS %s CASCADE" % self.schema,
                                 retry_s=10)
                self.db.close()
            self.teardown()
            if hasattr(self, "svc"):
                self.svc.stop()
            if ok:
                shutil.rmtree(self.work, ignore_errors=True)
            else:
                print("%s: kept %s (relay logs) for inspection"
                      % (PREFIX, self.work), flush=True)
        return 0 if ok else 1


def on_signal(signum, frame):
    # A test timeout: through the finally blocks, so the relays are killed
    # and a shared broker gets its memory watermark and its app back.
    raise SystemExit(128 + signum)


def add_common_args(p):
    """The options every harness built on this one takes."""
    p.add_argument("--seed", type=int, default=None,
                   help="fault schedule seed (default: random, printed)")
    p.add_argument("--mode", choices=["amqp", "kafka"], default="amqp")
    p.add_argument("--duration-cap", type=int, default=600,
                   help="the whole run is bounded by this many seconds")


def start(harness_class, p, a):
    """Checks the common options, then runs the harness; its exit code."""
    if a.duration_cap < 60:
        p.error("--duration-cap must be at least 60")
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1, 2 ** 31)
    try:
        h = harness_class(a)
    except ChaosError as e:
        print("%s: error: %s" % (PREFIX, e), file=sys.stderr)
        print(verdict_line(a.mode, "ERROR", a.seed), flush=True)
        return 2
    return h.main()


def main():
    signal.signal(signal.SIGTERM, on_signal)
    p = argparse.ArgumentParser(
        prog="chaos.sh",
        description="Relay chaos harness: faults on a seeded schedule, "
        "then a verdict on loss, duplicates and fencing.")
    p.add_argument("--events", type=int, default=10000,
                   help="events to relay (default 10000)")
    add_common_args(p)
    p.add_argument("--window", type=int, default=0,
                   help="seconds of faults (default: events/100, "
                   "30..120)")
    p.add_argument("--sources", type=int, default=1,
                   help="outbox tables behind each relay (default 1)")
    p.add_argument("--ordered", action="store_true",
                   help="OUTBOX_ORDERING=partition, and check each key's "
                   "first deliveries came in seq order")
    a = p.parse_args()
    if not 1 <= a.sources <= 100:
        p.error("--sources must be 1..100")
    if a.events < 100 or a.events > 10000000:
        p.error("--events must be 100..10000000")
    if a.window and not 10 <= a.window <= max(10, a.duration_cap - 60):
        p.error("--window must be 10..duration cap - 60")
    return start(Harness, p, a)


if __name__ == "__main__":
    sys.exit(main())
