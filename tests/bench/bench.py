#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Benchmark of outbox-relay against the limits of its database and broker.

One command prints a Markdown table and one JSON line. Every figure is the
median of --runs runs (default 3) with min-max, and every comparison is a
ratio of figures measured by this same invocation on this same machine:

 1. Limits: the database cycle limit (pgbench running the relay's own lease,
    claim and mark-sent statements in one transaction, batch 100, captured
    from the server log while the relay ran them) and the broker limit (bench_publish: a minimal
    confirmed publisher, 1 KB persistent messages, confirms pipelined).
 2. Throughput: pre-inserted events drained end to end (consumed) with
    OUTBOX_WORKERS 1, 2, 4, for AMQP and for the Kafka test broker; events/s
    and the ratio to min(database limit, broker limit).
 3. Cost: relay CPU time (user+sys, /proc) per event and peak RSS (VmHWM).
 4. Latency: a steady 1000 events/s (pgbench -R) for 30 s, insert to
    consumer receipt, p50/p99/max; polling and OUTBOX_LISTEN=on. And what
    the NOTIFY trigger costs producers (commits/s without and with it).
 5. Scale: lease time and cycle throughput with 5M sent rows in the table
    vs a clean table; lease time after 60 s of leasing while another session
    holds an old snapshot vs without; a 1M-event backlog drain; the cleaner
    purging 2M rows (time and WAL written).
 6. Database cost (section dbcost, tests/bench/dbcost.py): Postgres CPU
    and WAL per event of the relay's drain next to the floor statements of
    a table queue, run by pgbench on the same table.
 7. Horizon (section horizon, only when --sections names it): producers
    at 1000 events/s while a REPEATABLE READ snapshot is held for 30
    minutes; the Postgres CPU of the relay's sessions per event, backlog
    and dead tuples before, late in the hold and after the release, with
    history and without, for this build and the --baseline-bin one.
 8. Many outboxes (section many, only when --sections names it,
    tests/bench/many.py): events spread over 10 of 1,000 tenant tables
    served by a pattern against the same events in one table, the
    Postgres CPU of the idle relay on 1,000 tables against one, its
    sessions and memory per table, and the p99 latency of 49 quiet
    tables at 1 event/s alone and behind a hot table's 100,000 events.

The targets (TARGETS, the one table of them) get a verdict each from the
run's own results, printed as a second table and in the JSON line; they are
reported, not asserted. Standalone it starts its own services
with tests/services/*.sh; under tests/run.sh (--quick, suite 'bench') it
uses the RELAY_TEST_* services. Python standard library only.
"""

import argparse
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import dbcost
import many

ROOT = os.environ.get("RELAY_TEST_SOURCE_ROOT") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVICES = os.path.join(ROOT, "tests", "services")
NULL_UUID = "00000000-0000-0000-0000-000000000000"

FULL = {
    "runs": 3, "events": 100000, "workers": [1, 2, 4], "db_clients": 4,
    "broker_messages": 100000, "latency_rate": 1000, "latency_s": 30,
    "latency_high_rate": 5000,
    "latency_warmup_s": 4, "filler": 5000000, "scale_pending": 100000,
    "hold_s": 60, "hold_rate": 20, "backlog": 1000000, "purge": 2000000,
    "notify_s": 10,
    "horizon_rate": 1000, "horizon_payload": 512, "horizon_warmup_s": 30,
    "horizon_window_s": 60, "horizon_hold_s": 1800, "horizon_after_s": 60,
}
QUICK = {
    "runs": 1, "events": 5000, "workers": [1, 2, 4], "db_clients": 4,
    "broker_messages": 10000, "latency_rate": 1000, "latency_s": 5,
    "latency_high_rate": 5000,
    "latency_warmup_s": 4, "filler": 50000, "scale_pending": 10000,
    "hold_s": 5, "hold_rate": 20, "backlog": 20000, "purge": 20000,
    "notify_s": 3,
    "horizon_rate": 1000, "horizon_payload": 512, "horizon_warmup_s": 10,
    "horizon_window_s": 20, "horizon_hold_s": 120, "horizon_after_s": 30,
}
SECTIONS = ["limits", "throughput", "latency", "notify", "history",
            "snapshot", "backlog", "purge", "dbcost"]
SCALE = ["history", "snapshot", "backlog", "purge"]
HORIZON = ["before", "late", "after"]  # the horizon section's windows
# Sections run only when --sections names them (too long for the default
# list, which the test suite's quick form runs).
ON_REQUEST = ["horizon", "many"]

# The targets: the only place a threshold is written. Each row: name,
# what it measures, the figure it reads (a path into the results; derive()
# computes the ratios), the comparison, the threshold. Every run prints a
# verdict for each (met, missed, or not measured in this run) with its
# results; README and docs/benchmark.md quote that table, never their own.
# A figure "× baseline" is measured only with --baseline-bin or
# --baseline-env (the build or settings the target is relative to).
TARGETS = [
    ("many_throughput_vs_one", "Throughput with the events spread over 10 "
     "of 1,000 tables (quick form: 100), × the same events in one table",
     ("many", "throughput_ratio"), ">=", 0.8),
    ("many_quiet_p99_vs_alone", "p99 latency of 49 quiet tables at 1 "
     "event/s behind a hot table's 100,000-event backlog, × their p99 "
     "alone (LISTEN on)", ("many", "quiet_p99_ratio"), "<=", 2.0),
    ("amqp_4_workers_vs_limits", "AMQP throughput, 4 workers, × min("
     "database cycle limit, AMQP broker limit)",
     ("throughput", "amqp", "4", "ratio_to_limit"), ">=", 0.8),
    ("kafka_4_workers_vs_baseline", "Kafka throughput, 4 workers, × the "
     "baseline's in the same run (the target was set against the row "
     "lease)", ("throughput", "kafka", "4", "events_per_s_vs_baseline"),
     ">=", 2.0),
    ("amqp_1_worker_vs_4", "AMQP throughput, 1 worker ÷ 4 workers",
     ("throughput_ratios", "amqp", "one_over_four"), ">=", 0.8),
    ("kafka_1_worker_vs_4", "Kafka throughput, 1 worker ÷ 4 workers",
     ("throughput_ratios", "kafka", "one_over_four"), ">=", 0.8),
    ("amqp_cpu_1_worker", "Relay CPU per event, µs, AMQP, 1 worker",
     ("throughput", "amqp", "1", "cpu_us_per_event"), "<=", 10.0),
    ("amqp_cpu_2_workers", "Relay CPU per event, µs, AMQP, 2 workers",
     ("throughput", "amqp", "2", "cpu_us_per_event"), "<=", 10.0),
    ("amqp_cpu_4_workers", "Relay CPU per event, µs, AMQP, 4 workers",
     ("throughput", "amqp", "4", "cpu_us_per_event"), "<=", 10.0),
    ("kafka_cpu_1_worker", "Relay CPU per event, µs, Kafka, 1 worker",
     ("throughput", "kafka", "1", "cpu_us_per_event"), "<=", 6.0),
    ("kafka_cpu_2_workers", "Relay CPU per event, µs, Kafka, 2 workers",
     ("throughput", "kafka", "2", "cpu_us_per_event"), "<=", 6.0),
    ("kafka_cpu_4_workers", "Relay CPU per event, µs, Kafka, 4 workers",
     ("throughput", "kafka", "4", "cpu_us_per_event"), "<=", 6.0),
    ("amqp_rss_vs_baseline", "Relay peak RSS, AMQP, × the baseline's "
     "(the highest over the worker counts)",
     ("throughput_ratios", "amqp", "peak_rss_vs_baseline"), "<=", 1.0),
    ("kafka_rss_vs_baseline", "Relay peak RSS, Kafka, × the baseline's "
     "(the highest over the worker counts)",
     ("throughput_ratios", "kafka", "peak_rss_vs_baseline"), "<=", 1.0),
    ("latency_1000_polling_p50", "Latency p50, ms, polling, 1000 events/s",
     ("latency", "p50"), "<=", 10.0),
    ("latency_1000_polling_p99", "Latency p99, ms, polling, 1000 events/s",
     ("latency", "p99"), "<=", 50.0),
    ("latency_1000_listen_p50", "Latency p50, ms, OUTBOX_LISTEN=on, 1000 "
     "events/s", ("latency_listen", "p50"), "<=", 5.0),
    ("latency_1000_listen_p99", "Latency p99, ms, OUTBOX_LISTEN=on, 1000 "
     "events/s", ("latency_listen", "p99"), "<=", 25.0),
    ("latency_5000_polling_p99", "Latency p99, ms, polling, 5000 events/s",
     ("latency_high", "p99"), "<=", 50.0),
    ("latency_5000_listen_p99", "Latency p99, ms, OUTBOX_LISTEN=on, 5000 "
     "events/s", ("latency_high_listen", "p99"), "<=", 50.0),
    ("lease_cost_polling_vs_baseline", "Postgres CPU of the relay's "
     "sessions per event, polling at 1000 events/s, × the baseline's",
     ("latency", "pg_us_per_event_vs_baseline"), "<=", 1.2),
    ("lease_cost_listen_vs_baseline", "Postgres CPU of the relay's "
     "sessions per event, OUTBOX_LISTEN=on at 1000 events/s, × the "
     "baseline's", ("latency_listen", "pg_us_per_event_vs_baseline"), "<=",
     1.2),
    ("lease_time_with_history", "Lease time with the history rows (5M "
     "sent in the full form) × a clean table",
     ("scale", "history", "lease_ratio"), "<=", 1.2),
    ("dbcost_nohistory_wal", "DB cost without history (OUTBOX_RETENTION=0)"
     ": WAL bytes per event × floor C",
     ("dbcost", "ratios", "relay_nohistory/floor_c.wal_bytes_per_event"),
     "<=", 1.3),
    ("dbcost_nohistory_cpu", "DB cost without history (OUTBOX_RETENTION=0)"
     ": Postgres CPU per event × floor C",
     ("dbcost", "ratios", "relay_nohistory/floor_c.cpu_us_per_event"),
     "<=", 1.3),
    ("dbcost_life_wal", "DB cost of a row's whole life with history (the "
     "drain, then the cleaner's deletes): WAL bytes per event × floor D "
     "with its deletes", ("dbcost", "ratios",
                          "relay_life+deletes/floor_d+deletes."
                          "wal_bytes_per_event"), "<=", 1.3),
    ("dbcost_life_cpu", "DB cost of a row's whole life with history (the "
     "drain, then the cleaner's deletes): Postgres CPU per event × floor D "
     "with its deletes", ("dbcost", "ratios",
                          "relay_life+deletes/floor_d+deletes."
                          "cpu_us_per_event"), "<=", 1.3),
    ("dbcost_history_life_wal", "DB cost of history: a row's whole life "
     "with history (drain and cleaner) × the relay without history, WAL "
     "bytes per event", ("dbcost", "ratios",
                         "relay_life+deletes/relay_nohistory."
                         "wal_bytes_per_event"), "<=", 1.3),
    ("dbcost_history_life_cpu", "DB cost of history: a row's whole life "
     "with history (drain and cleaner) × the relay without history, "
     "Postgres CPU per event", ("dbcost", "ratios",
                                "relay_life+deletes/relay_nohistory."
                                "cpu_us_per_event"), "<=", 1.3),
    ("dbcost_history_partitioned_wal", "DB cost of history on the table "
     "partitioned by the day (migrate --partition): a row's whole life "
     "(drain, then its day dropped) × the relay without history, WAL "
     "bytes per event", ("dbcost", "ratios",
                         "relay_life_partitioned+deletes/relay_nohistory."
                         "wal_bytes_per_event"), "<=", 1.3),
    ("dbcost_history_partitioned_cpu", "DB cost of history on the table "
     "partitioned by the day (migrate --partition): a row's whole life "
     "(drain, then its day dropped) × the relay without history, "
     "Postgres CPU per event", ("dbcost", "ratios",
                                "relay_life_partitioned+deletes/"
                                "relay_nohistory.cpu_us_per_event"),
     "<=", 1.3),
    ("dbcost_ordered_history_wal", "DB cost of order, history kept: "
     "ordered (1,000 keys) × unordered, WAL bytes per event",
     ("dbcost", "ratios", "relay_ordered/relay_history.wal_bytes_per_event"),
     "<=", 2.0),
    ("dbcost_ordered_history_cpu", "DB cost of order, history kept: "
     "ordered (1,000 keys) × unordered, Postgres CPU per event",
     ("dbcost", "ratios", "relay_ordered/relay_history.cpu_us_per_event"),
     "<=", 2.0),
    ("dbcost_ordered_nohistory_wal", "DB cost of order, no history: "
     "ordered (1,000 keys) × unordered, WAL bytes per event",
     ("dbcost", "ratios",
      "relay_ordered_nohistory/relay_nohistory.wal_bytes_per_event"),
     "<=", 2.0),
    ("dbcost_ordered_nohistory_cpu", "DB cost of order, no history: "
     "ordered (1,000 keys) × unordered, Postgres CPU per event",
     ("dbcost", "ratios",
      "relay_ordered_nohistory/relay_nohistory.cpu_us_per_event"),
     "<=", 2.0),
    ("horizon_history_late", "Held snapshot, history kept: Postgres CPU "
     "of the relay's sessions per event late in the hold × before it",
     ("horizon", "relay", "history", "late_over_before"), "<=", 1.3),
    ("horizon_history_after", "Held snapshot, history kept: Postgres CPU "
     "of the relay's sessions per event after the release × before the "
     "hold", ("horizon", "relay", "history", "after_over_before"), "<=",
     1.1),
    ("horizon_history_backlog", "Held snapshot, history kept: backlog "
     "late in the hold, seconds of input",
     ("horizon", "relay", "history", "late", "backlog_s"), "<=", 1.0),
    ("horizon_nohistory_late", "Held snapshot, no history "
     "(OUTBOX_RETENTION=0): Postgres CPU of the relay's sessions per event "
     "late in the hold × before it",
     ("horizon", "relay", "nohistory", "late_over_before"), "<=", 1.3),
    ("horizon_nohistory_after", "Held snapshot, no history "
     "(OUTBOX_RETENTION=0): Postgres CPU of the relay's sessions per event "
     "after the release × before the hold",
     ("horizon", "relay", "nohistory", "after_over_before"), "<=", 1.1),
    ("horizon_nohistory_backlog", "Held snapshot, no history "
     "(OUTBOX_RETENTION=0): backlog late in the hold, seconds of input",
     ("horizon", "relay", "nohistory", "late", "backlog_s"), "<=", 1.0),
]
# What a target's figure needs beyond its section: with it missing, the
# verdict says why.
NEEDS_BASELINE = "needs --baseline-bin or --baseline-env"


class BenchError(Exception):
    pass


def say(msg):
    print("bench: " + msg, file=sys.stderr, flush=True)


def run(cmd, timeout=600, check=True, env=None, **kw):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout, env=env, **kw)
    except subprocess.TimeoutExpired:
        raise BenchError("%s: no result within %ds" % (
            " ".join(cmd[:3]), timeout))
    if check and p.returncode != 0:
        raise BenchError("%s failed (exit %d): %s" % (
            " ".join(cmd[:3]), p.returncode,
            (p.stderr or p.stdout).strip()[-1500:]))
    return p.stdout


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_file(path):
    out = {}
    with open(path) as f:
        for line in f:
            key, sep, value = line.rstrip("\n").partition("=")
            if sep:
                out[key] = value
    return out


def spread(values):
    """Median with min-max of a list of numbers."""
    v = [float(x) for x in values]
    return {"median": statistics.median(v), "min": min(v), "max": max(v),
            "runs": v}


def proc_cpu_s(pid):
    """User + system CPU seconds of a process so far (0 once it is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RelaySessionsCpu:
    """CPU seconds the relay's own Postgres sessions (those
    pg_stat_activity names outbox-relay/...) spend from now to total().
    A read at each end alone would miss a session that began in between
    and count one that ended as a negative figure: every session is read
    from /proc each half second (one that ends counts up to its last
    read, at most half a second of it lost) and the sessions are listed
    again every five seconds (one found later counts from zero, its
    start). Listing them costs a psql session, so it is kept rare, and
    list_s=None lists them once, for a window whose cluster CPU is small
    enough for the psql sessions to show in it."""

    READ_S = 0.5

    def __init__(self, bench, list_s=5.0):
        self.bench = bench
        self.list_s = list_s
        self.first = {p: proc_cpu_s(p) for p in self.list()}
        self.last = dict(self.first)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self.follow, daemon=True)
        self.thread.start()

    def list(self):
        return [int(p) for p in self.bench.sql(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE "
            "'outbox-relay/%' AND datname = current_database()").split()]

    def read(self):
        with self.lock:
            for p in self.last:
                c = proc_cpu_s(p)
                if c > 0.0:  # 0: gone; its last read stands
                    self.last[p] = c

    def follow(self):
        listed = time.monotonic()
        try:
            while not self.done.wait(self.READ_S):
                self.read()
                if self.list_s and time.monotonic() - listed >= self.list_s:
                    listed = time.monotonic()
                    found = self.list()
                    with self.lock:
                        for p in found:
                            self.last.setdefault(p, 0.0)
        except Exception as e:  # told by total(), not lost in a thread
            self.error = e

    def stop(self):
        """Stops following (a run cut short does not leave the thread
        listing sessions into the next run's figures)."""
        self.done.set()
        self.thread.join()

    def total(self):
        """Stops following; the sessions' CPU seconds since the start, and
        each session's (pid: seconds)."""
        self.stop()
        if self.error:
            raise BenchError("listing the relay's sessions failed: %s"
                             % self.error)
        self.read()
        by_pid = {p: c - self.first.get(p, 0.0) for p, c in self.last.items()}
        return sum(by_pid.values()), by_pid


def cpu_snapshot(groups):
    """CPU seconds so far of every pid of each group, plus the machine's
    busy and total seconds (/proc/stat)."""
    out = {name: {p: proc_cpu_s(p) for p in pids}
           for name, pids in groups.items()}
    tck = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    idle = cpu[3] + cpu[4]
    out["machine_busy"] = (sum(cpu[:8]) - idle) / tck
    out["machine_total"] = sum(cpu[:8]) / tck
    return out


def cpu_spent(before, after, name):
    """CPU seconds a group used between two snapshots: processes that
    started in between (the relay's backends) count from zero; those that
    ended in between are not seen."""
    return sum(t - before[name].get(p, 0.0) for p, t in after[name].items())


# ---- targets: derived figures and verdicts ----

def median_of(x):
    """A spread's median, or a plain number."""
    return x["median"] if isinstance(x, dict) else x


def ratio(a, b):
    return median_of(a) / max(1e-9, median_of(b))


def derive(r, workers):
    """The ratios the targets and the table read, computed from a run's
    results in place: each throughput cell over min(limits) and over its
    baseline, one worker over the most workers, peak RSS over the
    baseline's, the relay's Postgres CPU over the baseline's, and the lease
    time with history or a held snapshot over a clean table."""
    lim = r.get("limits", {})
    for broker, cells in r.get("throughput", {}).items():
        if "db" in lim and broker in lim:
            bound = min(lim["db"]["median"], lim[broker]["median"])
            for d in cells.values():
                d["limit"] = bound
                d["ratio_to_limit"] = ratio(d["events_per_s"], bound)
        summary = r.setdefault("throughput_ratios", {}).setdefault(broker,
                                                                   {})
        rss = []
        for d in cells.values():
            base = d.get("baseline")
            if base:
                d["events_per_s_vs_baseline"] = ratio(
                    d["events_per_s"], base["events_per_s"])
                d["cpu_us_per_event_vs_baseline"] = ratio(
                    d["cpu_us_per_event"], base["cpu_us_per_event"])
                rss.append(ratio(d["peak_rss_mb"], base["peak_rss_mb"]))
        if rss:
            summary["peak_rss_vs_baseline"] = max(rss)
        most = str(max(workers))
        if "1" in cells and most != "1" and most in cells:
            summary["one_over_four" if most == "4" else
                    "one_over_%s" % most] = ratio(
                cells["1"]["events_per_s"], cells[most]["events_per_s"])
    for key in ("latency", "latency_listen"):
        lat = r.get(key)
        if lat and "baseline" in lat:
            lat["pg_us_per_event_vs_baseline"] = ratio(
                lat["pg_us_per_event"], lat["baseline"]["pg_us_per_event"])
    for part, other in (("history", "history"), ("snapshot", "held")):
        s = r.get("scale", {}).get(part)
        if s:
            s["lease_ratio"] = ratio(s[other]["lease_ms"],
                                     s["clean"]["lease_ms"])


def lookup(r, path):
    for k in path:
        if not isinstance(r, dict) or k not in r:
            return None
        r = r[k]
    return median_of(r)


def target_section(path):
    if path[0] == "scale":
        return path[1]
    if path[0].startswith("latency"):
        return "latency"
    if path[0] == "throughput_ratios":
        return "throughput"
    return path[0]


def why_not(r, path, sections, baseline):
    """Why a target's figure is not in this run's results."""
    section = target_section(path)
    if section not in sections:
        return "section %s not run" % section
    if path[-1].endswith("vs_baseline") and not baseline:
        return NEEDS_BASELINE
    if path[-1] == "ratio_to_limit" and "limits" not in sections:
        return "needs section limits"
    if path[0].startswith("throughput") and path[1] not in r.get(
            "throughput", {}):
        return "no %s broker in this run" % path[1]
    left_out = r.get("dbcost", {}).get("left_out", [])
    if path[0] == "dbcost" and any(v in re.split(r"[/+.]", k)
                                   for k in path for v in left_out):
        return "a variant left out by --dbcost-variants"
    if path[0] in ("dbcost", "horizon") and any("nohistory" in k
                                                for k in path):
        return "OUTBOX_RETENTION=0 not supported by this build"
    if path[0].startswith("throughput"):
        return "worker count not in this run's --workers"
    return "not in this run's results"


def show_path(path):
    """The figure's place in the JSON line's results."""
    out = path[0]
    for k in path[1:]:
        out += ('["%s"]' % k) if re.search(r"[^a-z0-9_]|^\d", k) else \
            "." + k
    return out


def show_value(v):
    return "%.2f" % v if abs(v) < 10 else "%.1f" % v if abs(v) < 1000 \
        else "%.0f" % v


def verdicts(r, sections, baseline):
    """Each target's verdict from this run's results: met, missed (by how
    much), or not measured in this run (and why)."""
    out = []
    for name, what, path, op, threshold in TARGETS:
        v = lookup(r, path)
        if v is None:
            out.append({"name": name, "value": None,
                        "verdict": "not measured in this run",
                        "detail": why_not(r, path, sections, baseline)})
            continue
        ok = v >= threshold if op == ">=" else v <= threshold
        out.append({"name": name, "value": v,
                    "verdict": "met" if ok else "missed",
                    "detail": "" if ok else "by %s" % show_value(
                        abs(v - threshold))})
    return out


def verdict_table(vs):
    """The targets table with this run's verdicts, in Markdown."""
    rows = ["| Target | Figure read (JSON line, results.…) | This run | "
            "Threshold | Verdict |", "|---|---|---|---|---|"]
    for (name, what, path, op, threshold), v in zip(TARGETS, vs):
        rows.append("| %s | `%s` | %s | %s %s | %s |" % (
            what, show_path(path),
            "" if v["value"] is None else show_value(v["value"]),
            "≥" if op == ">=" else "≤", "%g" % threshold,
            ("%s (%s)" % (v["verdict"], v["detail"])) if v["detail"]
            else v["verdict"]))
    return "\n".join(rows)


def horizon_line(r, key, f):
    """One figure of the horizon section's three windows, for progress."""
    return ", ".join(f % median_of(r[w][key]) for w in HORIZON)


class HorizonWindow:
    """What the relay did in a window of the horizon section, from now to
    end(): the Postgres CPU of its own sessions (as pg_stat_activity names
    them) per event it counted sent on /metrics; the backlog (rows pending
    or in flight, in seconds of input) and dead tuples at the end; beside
    them the whole cluster's CPU per event (producers and autovacuum
    included) and the relay's own."""

    def __init__(self, bench, relay, t):
        self.bench, self.relay, self.t = bench, relay, t
        self.ins = self.stats()[0]
        self.sent = self.sent_count()
        self.relay_cpu = relay.cpu_s()
        self.cluster = dbcost.pg_cpu_s(bench)
        self.cpu = RelaySessionsCpu(bench)
        self.t0 = time.monotonic()

    def stats(self):
        # Postgres keeps no counts for a partitioned table: its
        # partitions' are summed (a plain table is its own only leaf).
        ins, dead = self.bench.sql(
            "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_dead_tup), "
            "0) FROM pg_stat_user_tables WHERE relid = '%s'::regclass OR "
            "relid IN (SELECT relid FROM pg_partition_tree('%s') WHERE "
            "isleaf)" % (self.t, self.t)).split("|")
        return int(ins), int(dead)

    def sent_count(self):
        v = dbcost.metric(self.relay, dbcost.SENT_METRIC)
        if v is None:
            raise BenchError("the relay's /metrics did not answer (log %s)"
                             % self.relay.log_path)
        return v

    def end(self):
        cpu = self.cpu.total()[0]
        secs = time.monotonic() - self.t0
        cluster = dbcost.pg_cpu_s(self.bench) - self.cluster
        relay_cpu = self.relay.cpu_s() - self.relay_cpu
        n = self.sent_count() - self.sent
        pending = int(self.bench.sql(
            "SELECT count(*) FROM %s WHERE status IN ('pending', "
            "'in_flight')" % self.t))
        ins, dead = self.stats()
        rate = self.bench.p["horizon_rate"]
        return {"seconds": secs, "events": n, "events_per_s": n / secs,
                "produced_per_s": (ins - self.ins) / secs,
                "pg_us_per_event": 1e6 * cpu / max(n, 1),
                "cluster_us_per_event": 1e6 * cluster / max(n, 1),
                "relay_us_per_event": 1e6 * relay_cpu / max(n, 1),
                "pending": pending, "backlog_s": pending / rate,
                "dead_tup": dead}


class Services:
    def __init__(self, work, need_kafka, build_dir):
        self.own = []
        e = os.environ
        if e.get("RELAY_TEST_DATABASE_URL") and e.get("RELAY_TEST_PG_DIR"):
            self.db_url = e["RELAY_TEST_DATABASE_URL"]
            self.pg_dir = e["RELAY_TEST_PG_DIR"]
            self.amqp_url = e.get("RELAY_TEST_AMQP_URL", "")
            self.rmq_dir = e.get("RELAY_TEST_RABBITMQ_DIR", "")
            self.kafka_brokers = e.get("RELAY_TEST_KAFKA_BROKERS", "")
            self.kafka_dir = e.get("RELAY_TEST_KAFKA_DIR", "")
            if not self.amqp_url or not self.rmq_dir:
                raise BenchError("RELAY_TEST_AMQP_URL and "
                                 "RELAY_TEST_RABBITMQ_DIR must be set too")
            say("using the services of tests/run.sh")
        else:
            say("starting Postgres, RabbitMQ and the Kafka test broker")
            self.pg_dir = self._start("postgres.sh", work, "pg")
            self.db_url = env_file(os.path.join(self.pg_dir, "env"))[
                "RELAY_TEST_DATABASE_URL"]
            self.rmq_dir = self._start("rabbitmq.sh", work, "rabbitmq")
            self.amqp_url = env_file(os.path.join(self.rmq_dir, "env"))[
                "RELAY_TEST_AMQP_URL"]
            self.kafka_brokers = self.kafka_dir = ""
            if need_kafka:
                broker = os.path.join(build_dir, "tests", "kafka_mock_broker")
                self.kafka_dir = self._start("kafka.sh", work, "kafka",
                                             broker)
                self.kafka_brokers = env_file(os.path.join(
                    self.kafka_dir, "env"))["RELAY_TEST_KAFKA_BROKERS"]
        self.amqp_url = self.amqp_url.rstrip("/")
        pg_env = env_file(os.path.join(self.pg_dir, "env"))
        pg_bin = pg_env.get("PG_BIN", "")
        self.pgbench = os.path.join(pg_bin, "pgbench") if pg_bin else ""
        if not os.access(self.pgbench, os.X_OK):
            self.pgbench = shutil.which("pgbench") or ""
        if not self.pgbench:
            raise BenchError("pgbench not found (package postgresql-contrib)")
        self.pg_log = os.path.join(self.pg_dir, "postgres.log")

    def _start(self, script, work, name, *extra):
        d = os.path.join(work, name)
        os.mkdir(d)
        self.own.append((script, d))
        run(["bash", os.path.join(SERVICES, script), "start", d] +
            list(extra), timeout=180)
        return d

    def pids(self, broker):
        """Processes of this run's database and broker (not any other
        Postgres or RabbitMQ on the machine): the postmaster and its
        children; the RabbitMQ node's processes, marked by their
        environment; the Kafka test broker's pid file."""
        found = {"postgres": [], "broker": []}
        pg_data = env_file(os.path.join(self.pg_dir, "env")).get("PG_DATA")
        try:
            with open(os.path.join(pg_data, "postmaster.pid")) as f:
                master = int(f.readline())
        except (OSError, TypeError, ValueError):
            master = None
        marker = ("RABBITMQ_CONF_ENV_FILE=%s/rabbitmq-env.conf"
                  % self.rmq_dir).encode()
        kafka_pid = None
        if broker == "kafka":
            try:
                with open(os.path.join(self.kafka_dir, "broker.pid")) as f:
                    kafka_pid = int(f.read().strip())
            except (OSError, ValueError):
                pass
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            p = int(pid)
            try:
                with open("/proc/%s/stat" % pid) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if master and (p == master or ppid == master):
                found["postgres"].append(p)
            elif broker == "kafka" and p == kafka_pid:
                found["broker"].append(p)
            elif broker == "amqp" and self.rmq_dir:
                try:
                    with open("/proc/%s/environ" % pid, "rb") as f:
                        if marker in f.read().split(b"\0"):
                            found["broker"].append(p)
                except OSError:
                    pass
        return found

    def stop(self):
        for script, d in reversed(self.own):
            run(["bash", os.path.join(SERVICES, script), "stop", d],
                timeout=120, check=False)

    def kafka_ctl(self, *args):
        run(["bash", os.path.join(SERVICES, "kafka.sh"), "ctl",
             self.kafka_dir] + list(args), timeout=30)


class Relay:
    """A relay process for one measurement."""

    def __init__(self, bench, table, publisher, workers=1, extra=None,
                 log_name="relay", relay_bin=None, run_env=True):
        self.port = free_port()
        env = dict(os.environ)
        env.update({
            "OUTBOX_DATABASE_URL": bench.svc.db_url,
            "OUTBOX_TABLE": table,
            "OUTBOX_PUBLISHER": publisher,
            "OUTBOX_WORKERS": str(workers),
            "OUTBOX_HTTP_ADDR": "127.0.0.1:%d" % self.port,
            "OUTBOX_AMQP_URL": bench.svc.amqp_url,
            "OUTBOX_AMQP_EXCHANGE": bench.exchange,
            "OUTBOX_KAFKA_BROKERS": bench.svc.kafka_brokers or "127.0.0.1:9",
            "OUTBOX_CE_SOURCE": "/bench",
        })
        if run_env:  # --relay-env
            env.update(bench.relay_env)
        env.update(extra or {})
        self.log_path = os.path.join(bench.work, log_name + ".log")
        with open(self.log_path, "a") as err:
            self.proc = subprocess.Popen(
                [relay_bin or bench.relay_bin, "run"], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err)

    def cpu_s(self):
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf(
            "SC_CLK_TCK")

    def peak_rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0

    def counts(self):
        """Sums and counts of the statement and publish histograms, as
        the relay's /metrics has them."""
        try:
            with urllib.request.urlopen(
                    "http://127.0.0.1:%d/metrics" % self.port,
                    timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            m = re.match(r"outbox_(lease|mark|publish)_duration_seconds_"
                         r"(sum|count)\s+(\S+)$", line)
            if m:
                out[m.group(1) + "_" + m.group(2)] = float(m.group(3))
        return out

    def metrics(self):
        """Milliseconds per batch of the lease, mark and publish."""
        out = self.counts()
        per_batch = {}
        for k in ("lease", "mark", "publish"):
            if out.get(k + "_count"):
                per_batch[k + "_ms"] = round(
                    1000 * out[k + "_sum"] / out[k + "_count"], 3)
        return per_batch

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


class Bench:
    def __init__(self, args):
        self.args = args
        self.p = dict(QUICK if args.quick else FULL)
        if args.runs:
            self.p["runs"] = args.runs
        if args.workers:
            self.p["workers"] = args.workers
        if args.events:
            self.p["events"] = args.events
        if args.horizon_hold:
            self.p["horizon_hold_s"] = args.horizon_hold
        self.p["horizon_keys"] = args.horizon_keys
        self.p["horizon_partitioned"] = args.horizon_partitioned
        self.p["dbcost_variants"] = args.dbcost_variants
        self.sections = args.sections
        self.relay_bin = args.relay_bin
        self.build = os.path.dirname(self.relay_bin)
        helpers = os.path.join(self.build, "tests", "bench")
        self.publish_bin = os.path.join(helpers, "bench_publish")
        self.consume_bin = os.path.join(helpers, "bench_consume")
        for b in (self.relay_bin, self.publish_bin, self.consume_bin):
            if not os.access(b, os.X_OK):
                raise BenchError("not built: " + b)
        self.sanitized = "asan" in run(["ldd", self.relay_bin], check=False)
        self.kafka = not args.no_kafka and shutil.which("kcat") is not None
        if not args.no_kafka and not self.kafka:
            say("kcat not found: the Kafka figures are left out")
        self.work = tempfile.mkdtemp(prefix="outbox-bench.",
                                     dir=os.environ.get("TMPDIR", "/tmp"))
        os.chmod(self.work, 0o755)
        self.tag = "bench_%d" % os.getpid()
        self.exchange = self.tag + ".x"
        self.queue = self.tag + ".q"
        self.results = {}
        self.notes = []
        # --relay-env: settings for every relay of the run (a section's
        # own settings still win), named in the report.
        self.relay_env = dict(kv.split("=", 1) for kv in args.relay_env)
        self.baseline_env = dict(kv.split("=", 1)
                                 for kv in args.baseline_env)
        if self.relay_env:
            self.notes.append("every relay ran with " + ", ".join(
                "`%s=%s`" % kv for kv in sorted(self.relay_env.items())))
        if self.baseline_env:
            self.notes.append("the throughput baseline ran with " +
                              ", ".join("`%s=%s`" % kv for kv in sorted(
                                  self.baseline_env.items())))

    # ---- database helpers ----

    def sql(self, text, timeout=3600):
        return run(["psql", self.svc.db_url, "-X", "-A", "-t", "-q",
                    "-v", "ON_ERROR_STOP=1", "-c", text],
                   timeout=timeout).strip()

    def table(self, name, listen=False, relay_bin=None, history=True):
        """A fresh, migrated outbox table SCHEMA.outbox_events (with the
        NOTIFY trigger if listen), migrated by relay_bin (default the relay
        under test) as for a relay that keeps history or not (migrate sets
        the pages' room by OUTBOX_RETENTION)."""
        schema = "%s_%s" % (self.tag, name)
        self.sql("SET client_min_messages = warning; DROP SCHEMA IF EXISTS "
                 "%s CASCADE" % schema)
        t = schema + ".outbox_events"
        env = dict(os.environ, OUTBOX_DATABASE_URL=self.svc.db_url,
                   OUTBOX_TABLE=t, OUTBOX_LISTEN="on" if listen else "off")
        if not history:
            env["OUTBOX_RETENTION"] = "0"
        run([relay_bin or self.relay_bin, "migrate"], env=env)
        return t

    def drop_tables(self):
        rows = self.sql("SELECT nspname FROM pg_namespace WHERE nspname "
                        "LIKE '%s%%'" % self.tag)
        for schema in rows.split():
            self.sql("SET client_min_messages = warning; DROP SCHEMA %s "
                     "CASCADE" % schema)

    def fill(self, table, n, kind="bench.event", size=1024):
        """n pending events with size-byte payloads, then VACUUM ANALYZE so
        every run starts from the same state."""
        reps = max(1, size // 16)
        self.sql("INSERT INTO %s (type, routing_key, payload) SELECT '%s', "
                 "'bench', decode(repeat(md5(g::text), %d), 'hex') FROM "
                 "generate_series(1, %d) g" % (table, kind, reps, n))
        self.sql("VACUUM ANALYZE %s" % table)

    def count(self, table, where):
        return int(self.sql("SELECT count(*) FROM %s WHERE %s"
                            % (table, where)))

    # ---- the statements pgbench runs ----

    def capture_statements(self):
        """The lease and mark-sent text the relay binary itself sends,
        from the server log of a short run with log_statement = all."""
        t = self.table("capture")
        self.fill(t, 5)
        start = os.path.getsize(self.svc.pg_log) if os.path.exists(
            self.svc.pg_log) else 0
        relay = Relay(self, t, "stdout", extra={
            "PGOPTIONS": "-c log_statement=all",
            "OUTBOX_POLL_INTERVAL": "100ms"}, log_name="capture",
            run_env=False)  # the default statements, whatever the run's
        deadline = time.monotonic() + 30
        while self.count(t, "status = 'sent'") < 5:
            if time.monotonic() > deadline or not relay.alive():
                relay.stop()
                raise BenchError("the capture relay did not send 5 events "
                                 "(log %s)" % relay.log_path)
            time.sleep(0.1)
        relay.stop()
        quoted = '"%s_capture"."outbox_events' % self.tag
        found = {}
        try:
            with open(self.svc.pg_log, errors="replace") as f:
                f.seek(start)
                # A statement's name is its kind and a hash of its text
                # (src/store/stmt_name.c).
                execute = re.compile(r"execute (outbox_lease|outbox_claim|"
                                     r"outbox_sent)_[0-9a-f]{16}: ")
                for line in f:
                    m = execute.search(line)
                    if m and quoted in line and m.group(1) not in found:
                        found[m.group(1)] = line[m.end():].rstrip("\n")
        except OSError as e:
            raise BenchError("cannot read the server log %s: %s"
                             % (self.svc.pg_log, e))
        if len(found) != 3:
            raise BenchError("lease, claim and mark statements not found in "
                             "%s (log_statement needs a superuser role)"
                             % self.svc.pg_log)
        return found["outbox_lease"], found["outbox_claim"], \
            found["outbox_sent"]

    def pgbench_script(self, table):
        """A pgbench cycle as a worker runs it (the lock lease): BEGIN, the
        relay's lease (batch 100), its claim, its mark-sent of exactly the
        rows leased (by ctid, as the relay names them), COMMIT. The relay writes the claim on a second
        session; here it runs inside the transaction, which costs the
        database the same write. The lease is wrapped so that \\gset can
        take its ids; the texts are otherwise the relay's own."""
        lease, claim, sent = self.statements
        cap = '"%s_capture"."outbox_events' % self.tag
        schema, name = table.split(".")
        quoted = '"%s"."%s' % (schema, name)
        lease, claim, sent = (x.replace(cap, quoted)
                              for x in (lease, claim, sent))
        # pgbench -M prepared turns every ":name" into a parameter, even in
        # a string literal (the to_char format's ":MI:SS"): spell such
        # colons chr(58), which the planner folds back into a constant.
        def no_colon_names(text):
            return re.sub(r"'(?:[^']|'')*'", lambda m: (
                m.group(0).replace(":", "' || chr(58) || '")
                if re.search(r":[A-Za-z_]", m.group(0)) else m.group(0)),
                text)
        lease, claim, sent = (no_colon_names(x) for x in (lease, claim, sent))
        if not lease.startswith("WITH ") or \
                "FOR UPDATE SKIP LOCKED" not in lease:
            raise BenchError("the lease statement no longer has the shape "
                             "'WITH ... FOR UPDATE SKIP LOCKED ...'; update "
                             "pgbench_script() in tests/bench/bench.py")
        # The relay's parameters, as literals: pgbench variables cannot
        # be empty, and the planner sees the values either way.
        def bind(text, values):
            return re.sub(r"\$(\d+)\b", lambda m: values[m.group(1)], text)
        # $4, the scan floor: '-infinity' is the lease as it rescans,
        # from the start of the pending index (docs/design.md §4).
        # $5, the claim floor: '0' reads every claim, as a session's
        # first lease does (the cycle cannot carry a floor across
        # transactions the way a relay's session does).
        # $6, the late scan's floor: NULL, no late scan, as in a rescan.
        # $7, the scan floor's seq: the lowest, as in a rescan.
        lease = bind(lease, {"1": "'{}'", "2": "''", "3": "'/bench'",
                             "4": "'-infinity'", "5": "'0'",
                             "6": "NULL",
                             "7": "'-9223372036854775808'"})
        # The claim is a new row named holder#xid, replacing the client's
        # previous one ($6, which the claim's RETURNING sets through \gset;
        # pgbench() starts every client with holder=none).
        claim = bind(claim, {"1": "'pgbench/' || :client_id || '#' || "
                                  "pg_current_xact_id()",
                             "2": ":lease", "3": "pg_current_xact_id()",
                             "4": ":ids", "5": "'/bench'",
                             "6": ":holder"})
        sent = bind(sent, {"1": ":tids", "2": ":lease", "3": "'/bench'",
                           "4": "'pgbench/0/w'", "5": ":ids"})
        # The claim names rows by id, the mark by ctid and id
        # (docs/design.md §4).
        wrapped = ("WITH bench_leased AS (%s) SELECT coalesce(array_agg(id), "
                   "'{}') AS ids, coalesce(array_agg(ctid), '{}') AS tids, "
                   "coalesce(max(lease_id::text), '%s') AS lease "
                   "FROM bench_leased" % (lease, NULL_UUID))
        path = os.path.join(self.work, "cycle-%s.sql" % schema)
        with open(path, "w") as f:
            f.write("-- The lease, claim and mark-sent statements "
                    "outbox-relay ran, captured from the server log.\n")
            f.write("BEGIN;\n")
            f.write(wrapped + " \\gset\n")
            f.write(claim + " \\gset\n")
            f.write(sent + ";\n")
            f.write("COMMIT;\n")
        return path

    def pgbench(self, script, clients, extra, timeout=3600):
        """Runs pgbench; returns tps and per-statement latencies (ms)."""
        cmd = [self.svc.pgbench, "-n", "-M", "prepared", "-r",
               "-c", str(clients), "-j", str(min(clients, 2)),
               "-D", "holder=none", "-f", script]
        out = run(cmd + extra + [self.svc.db_url], timeout=timeout)
        tps = re.search(r"tps = ([0-9.]+) \(without initial connection",
                        out)
        if not tps:
            raise BenchError("no tps in pgbench output: " + out[-500:])
        lat = []
        in_stmts = False
        for line in out.splitlines():
            if line.startswith("statement latencies"):
                in_stmts = True
                continue
            m = re.match(r"\s+([0-9.]+)\s+\d+\s+\S", line) if in_stmts \
                else None
            if m:
                lat.append(float(m.group(1)))
        failed = re.search(r"number of failed transactions: (\d+)", out)
        if failed and int(failed.group(1)):
            raise BenchError("pgbench: %s failed transactions" %
                             failed.group(1))
        return float(tps.group(1)), lat

    # ---- brokers ----

    def consumer(self, count, idle=20, since=None):
        ready = os.path.join(self.work, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        cmd = [self.consume_bin, "--url", self.svc.amqp_url, "--exchange",
               self.exchange, "--queue", self.queue, "--purge", "--count",
               str(count), "--idle-timeout", str(idle), "--ready-file",
               ready]
        if since:
            cmd += ["--since", "%.6f" % since]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise BenchError("consumer did not start: " +
                                 proc.communicate()[1])
            time.sleep(0.02)
        return proc

    @staticmethod
    def consumer_result(proc, timeout):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise BenchError("consumer still running after %ds" % timeout)
        if proc.returncode != 0:
            raise BenchError("consumer: " + err.strip())
        return json.loads(out)

    def kafka_topic(self, name, events=0):
        """A topic of the test broker. It keeps about 5 MB per partition
        and drops older records, so a drain topic gets enough partitions
        to hold every event even when kcat falls behind a fast relay."""
        parts = max(3, math.ceil(events * 1400 / (4 << 20)))
        self.svc.kafka_ctl("create_topic", name, str(parts))
        return name

    def kafka_consumer(self, topic, count):
        return subprocess.Popen(
            ["kcat", "-C", "-q", "-b", self.svc.kafka_brokers, "-t", topic,
             "-o", "beginning", "-c", str(count), "-X",
             "fetch.wait.max.ms=10", "-f", "%o\n"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    # ---- 1. limits ----

    def db_limit(self):
        t = self.table("limit")
        cycles = max(40, self.p["events"] // 100)
        per_client = cycles // self.p["db_clients"]
        rates = []
        for i in range(self.p["runs"]):
            self.sql("TRUNCATE %s" % t)
            self.fill(t, cycles * 100 + 1000)
            script = self.pgbench_script(t)
            tps, lat = self.pgbench(script, self.p["db_clients"],
                                    ["-t", str(per_client)])
            leased = self.count(t, "status = 'sent'")
            if leased != per_client * self.p["db_clients"] * 100:
                raise BenchError("pgbench cycle marked %d rows, want %d" % (
                    leased, per_client * self.p["db_clients"] * 100))
            rates.append(tps * 100)
            # lat: BEGIN, lease, claim, mark, COMMIT
            say("db limit run %d: %.0f events/s (lease %.2f ms, claim %.2f "
                "ms, mark %.2f ms, commit %.2f ms)" % (
                    i + 1, tps * 100, lat[1], lat[2], lat[3], lat[4]))
        return spread(rates)

    def amqp_limit(self):
        n = self.p["broker_messages"]
        rates = []
        for i in range(self.p["runs"]):
            cons = self.consumer(n)
            out = run([self.publish_bin, "amqp", "--url", self.svc.amqp_url,
                       "--exchange", self.exchange, "--count", str(n),
                       "--window", "1000"], timeout=600)
            got = self.consumer_result(cons, 120)
            pub = json.loads(out)
            rates.append(pub["per_s"])
            say("amqp broker limit run %d: %.0f msgs/s (%d consumed)"
                % (i + 1, pub["per_s"], got["count"]))
        return spread(rates)

    def kafka_limit(self):
        n = self.p["broker_messages"]
        rates = []
        for i in range(self.p["runs"]):
            topic = self.kafka_topic("%s.limit.%d" % (self.tag, i))
            out = run([self.publish_bin, "kafka", "--brokers",
                       self.svc.kafka_brokers, "--topic", topic, "--count",
                       str(n)], timeout=600)
            pub = json.loads(out)
            rates.append(pub["per_s"])
            say("kafka broker limit run %d: %.0f msgs/s" % (i + 1,
                                                            pub["per_s"]))
        return spread(rates)

    # ---- 2./3. throughput and cost ----

    def drain_once(self, t, n, broker, workers, topic=None, timeout=1800,
                   relay_bin=None, label="", env=None):
        """Relays n pre-inserted events; returns events/s, CPU, RSS."""
        # The consumer's CPU: it is our only child reaped in between.
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if broker == "amqp":
            cons = self.consumer(n, idle=60)
        else:
            cons = self.kafka_consumer(topic, n)
        extra = dict(env or {})
        if topic:
            extra["OUTBOX_KAFKA_TOPIC"] = topic
        cpu0 = cpu_snapshot(self.svc.pids(broker))
        t0 = time.time()
        relay = Relay(self, t, broker, workers, extra,
                      log_name="drain-%s-%d%s" % (broker, workers, label),
                      relay_bin=relay_bin)
        try:
            if broker == "amqp":
                got = self.consumer_result(cons, timeout)
                t1 = got["last_s"]
            else:
                try:
                    cons.wait(timeout)
                except subprocess.TimeoutExpired:
                    cons.kill()
                    raise BenchError("kcat did not read %d records" % n)
                t1 = time.time()
                if cons.returncode != 0:
                    raise BenchError("kcat: " + cons.stderr.read())
            if not relay.alive():
                raise BenchError("relay exited (log %s)" % relay.log_path)
            cpu = relay.cpu_s()
            cpu1 = cpu_snapshot(self.svc.pids(broker))
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            rss = relay.peak_rss_kb()
            per_batch = relay.metrics()
        finally:
            rc = relay.stop()
        if rc != 0:
            raise BenchError("relay exit code %s (log %s)" % (rc,
                                                              relay.log_path))
        # Sent rows are kept, or deleted on the ack (OUTBOX_RETENTION=0).
        left = self.count(t, "status <> 'sent'")
        if left:
            raise BenchError("%d of %d rows not sent" % (left, n))
        parts = {k: cpu_spent(cpu0, cpu1, k) / n * 1e6
                 for k in ("postgres", "broker")}
        parts["consumer"] = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime -
                             ru0.ru_stime) / n * 1e6
        parts["relay"] = cpu / n * 1e6
        busy = (cpu1["machine_busy"] - cpu0["machine_busy"]) / max(
            1e-9, cpu1["machine_total"] - cpu0["machine_total"])
        return {"per_s": n / (t1 - t0), "seconds": t1 - t0,
                "cpu_us_per_event": cpu / n * 1e6, "peak_rss_mb":
                rss / 1024.0, "per_batch": per_batch,
                "cpu_us_by_part": parts, "machine_busy": busy}

    def throughput(self, broker):
        t = self.table("drain_" + broker)
        n = self.p["events"]
        # With --baseline-bin or --baseline-env, each run drains the same
        # backlog with this build and with the baseline (another binary,
        # other settings, or both), in alternating order, so drift hits
        # both alike.
        bins = [("", self.relay_bin, {})]
        if self.args.baseline_bin or self.baseline_env:
            bins.append(("-baseline", self.args.baseline_bin or
                         self.relay_bin, self.baseline_env))
        out = {}
        for w in self.p["workers"]:
            runs = {label: [] for label, _, _ in bins}
            for i in range(self.p["runs"]):
                for label, relay_bin, env in (bins if i % 2 == 0 else
                                              bins[::-1]):
                    self.sql("TRUNCATE %s" % t)
                    self.fill(t, n)
                    topic = None
                    if broker == "kafka":
                        topic = self.kafka_topic("%s.drain.%d.%d%s"
                                                 % (self.tag, w, i, label), n)
                    r = self.drain_once(t, n, broker, w, topic,
                                        relay_bin=relay_bin, label=label,
                                        env=env)
                    runs[label].append(r)
                    say("%s%s %d worker(s) run %d: %.0f events/s, %.1f us "
                        "CPU/event, %.1f MB peak RSS, per batch %s, CPU "
                        "us/event by part %s, machine busy %.0f%%" % (
                            broker, label, w, i + 1, r["per_s"],
                            r["cpu_us_per_event"], r["peak_rss_mb"],
                            r["per_batch"], {k: round(v, 1) for k, v in
                                             r["cpu_us_by_part"].items()},
                            100 * r["machine_busy"]))
            out[str(w)] = self.drain_summary(runs[""])
            if len(bins) > 1:
                out[str(w)]["baseline"] = self.drain_summary(
                    runs["-baseline"])
        return out

    @staticmethod
    def drain_summary(runs):
        return {
            "events_per_s": spread([r["per_s"] for r in runs]),
            "cpu_us_per_event": spread(
                [r["cpu_us_per_event"] for r in runs]),
            "peak_rss_mb": spread([r["peak_rss_mb"] for r in runs]),
            "per_batch_ms": runs[-1]["per_batch"],
            "cpu_us_per_event_by_part": {
                k: spread([r["cpu_us_by_part"][k] for r in runs])
                for k in runs[0]["cpu_us_by_part"]},
            "machine_busy": spread([r["machine_busy"] for r in runs]),
        }

    # ---- 4. latency ----

    def latency(self, listen=False, rate=None, relay_bin=None, env=None):
        t = self.table("latency_listen" if listen else "latency", listen)
        extra = dict(env or {})
        if listen:
            extra["OUTBOX_LISTEN"] = "on"
        rate = rate or self.p["latency_rate"]
        secs = self.p["latency_s"]
        warm = self.p["latency_warmup_s"]
        script = os.path.join(self.work, "insert.sql")
        with open(script, "w") as f:
            f.write("INSERT INTO %s (type, routing_key, payload) VALUES "
                    "('bench.event', 'bench', decode(repeat(md5(random()"
                    "::text), 64), 'hex'));\n" % t)
        runs = []
        for i in range(self.p["runs"]):
            self.sql("TRUNCATE %s" % t)
            self.sql("VACUUM ANALYZE %s" % t)
            relay = Relay(self, t, "amqp", 1, extra, log_name="latency",
                          relay_bin=relay_bin)
            sessions = None
            try:
                time.sleep(0.5)
                # What the relay costs Postgres: the CPU of its own
                # sessions (not the producers'), and its leases.
                sessions = RelaySessionsCpu(self)
                leases0 = relay.counts().get("lease_count", 0)
                t_start = time.time()
                cons = self.consumer(0, idle=5, since=t_start + warm)
                run([self.svc.pgbench, "-n", "-M", "prepared", "-c", "2",
                     "-j", "1", "-R", str(rate), "-T", str(secs + warm),
                     "-f", script, self.svc.db_url],
                    timeout=secs + warm + 120)
                got = self.consumer_result(cons, 120)
                cpu, by_session = sessions.total()
                top = max(by_session, key=by_session.get, default=None)
                backends = dict(
                    (int(line.split("|")[0]), line.split("|")[1])
                    for line in self.sql(
                        "SELECT pid, application_name FROM "
                        "pg_stat_activity WHERE application_name LIKE "
                        "'outbox-relay/%%' AND datname = current_database()"
                    ).splitlines())
                leases = relay.counts().get("lease_count", 0) - leases0
                events = int(self.sql("SELECT count(*) FROM %s" % t))
            finally:
                if sessions:
                    sessions.stop()
                relay.stop()
            lat = got["latency_ms"]
            lat["pg_us_per_event"] = 1e6 * cpu / max(events, 1)
            lat["leases_per_1000"] = 1000.0 * leases / max(events, 1)
            if top is not None:
                say("  busiest relay session: %s, %.1f us per event" % (
                    backends.get(top, "ended").rsplit("/", 1)[-1],
                    1e6 * by_session[top] / max(events, 1)))
            # Below the base rate's samples something broke; at the high
            # rate the producers (or the relay) may fall short of it,
            # which the report shows by the events measured.
            if lat["n"] < rate * secs * 0.8:
                if rate == self.p["latency_rate"]:
                    raise BenchError("only %d latency samples" % lat["n"])
                say("latency at %d/s: only %d of %d events measured" % (
                    rate, lat["n"], rate * secs))
            runs.append(lat)
            say("latency%s%s at %d/s run %d: %d events p50 %.1f ms p99 %.1f "
                "ms max %.1f ms; the relay's sessions %.1f us Postgres CPU "
                "and %.0f leases per 1000 events" % (
                    " (listen)" if listen else "",
                    " (baseline)" if relay_bin or env else "", rate, i + 1,
                    lat["n"],
                    lat["p50"], lat["p99"], lat["max"],
                    lat["pg_us_per_event"], lat["leases_per_1000"]))
        return self.latency_summary(runs)

    @staticmethod
    def latency_summary(runs):
        # The distribution for the chart: the median over runs of each
        # percentile's latency.
        cdf = [sorted(r["cdf"][i] for r in runs)[len(runs) // 2]
               for i in range(len(runs[0]["cdf"]))]
        out = {k: spread([r[k] for r in runs]) for k in
               ("p50", "p99", "max", "pg_us_per_event", "leases_per_1000")
               if k in runs[0]}
        return out | {"events": spread(
                    [r["n"] for r in runs]), "cdf_ms": cdf}

    def latency_floor(self, rate):
        """The broker alone at the same rate: a confirmed publisher
        (bench_publish --rate), each message stamped when it is published,
        received by the same consumer as the relay's events."""
        secs, warm = self.p["latency_s"], self.p["latency_warmup_s"]
        runs = []
        for i in range(self.p["runs"]):
            cons = self.consumer(0, idle=5, since=time.time() + warm)
            run([self.publish_bin, "amqp", "--url", self.svc.amqp_url,
                 "--exchange", self.exchange, "--count",
                 str(rate * (secs + warm)), "--rate", str(rate)],
                timeout=secs + warm + 120)
            lat = self.consumer_result(cons, 120)["latency_ms"]
            if lat["n"] < rate * secs * 0.8:
                raise BenchError("only %d broker floor samples" % lat["n"])
            runs.append(lat)
            say("broker floor at %d/s run %d: %d messages p50 %.1f ms p99 "
                "%.1f ms max %.1f ms" % (rate, i + 1, lat["n"], lat["p50"],
                                         lat["p99"], lat["max"]))
        return self.latency_summary(runs)

    # ---- NOTIFY's cost to producers ----

    def notify_cost(self):
        """Producer commits/s (4 connections, one event per transaction)
        into a table without and with the NOTIFY trigger: a transaction
        that notified takes a database-wide lock at commit."""
        res = {"off": [], "on": []}
        tables = {"off": self.table("notify_off"),
                  "on": self.table("notify_on", listen=True)}
        for i in range(self.p["runs"]):
            for mode, t in tables.items():
                self.sql("TRUNCATE %s" % t)
                script = os.path.join(self.work, "produce-%s.sql" % mode)
                with open(script, "w") as f:
                    f.write("INSERT INTO %s (type, routing_key, payload) "
                            "VALUES ('bench.event', 'bench', decode(repeat("
                            "md5(random()::text), 64), 'hex'));\n" % t)
                out = run([self.svc.pgbench, "-n", "-M", "prepared", "-c",
                           "4", "-j", "2", "-T", str(self.p["notify_s"]),
                           "-f", script, self.svc.db_url],
                          timeout=self.p["notify_s"] + 120)
                tps = re.search(r"tps = ([0-9.]+) \(without", out)
                if not tps:
                    raise BenchError("no tps in pgbench output")
                res[mode].append(float(tps.group(1)))
                say("producers, NOTIFY trigger %s, run %d: %.0f commits/s"
                    % (mode, i + 1, float(tps.group(1))))
        return {m: spread(v) for m, v in res.items()}

    # ---- 5. scale ----

    def add_filler(self, t, n, age="0 s"):
        """n rows already sent (small payloads), as history would be: one
        finished every millisecond up to age ago. (Rows sharing one
        finished_at would defeat the cleaner's keyset cursor, which no
        real history does beyond the rows of one mark.)"""
        step = 500000
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            self.sql(
                "INSERT INTO %s (type, routing_key, payload, status, "
                "attempts, lease_id, leased_at, lease_expires_at, leased_by,"
                " finished_at) SELECT 'bench.filler', 'bench', "
                "decode(repeat(md5(g::text), 16), 'hex'), 'sent', 1, "
                "gen_random_uuid(), now(), now(), 'filler', now() - "
                "interval '%s' - (%d - g) * interval '1 ms' FROM "
                "generate_series(%d, %d) g" % (t, age, n, lo + 1, hi))
        self.sql("VACUUM ANALYZE %s" % t)

    def lease_cycle(self, t, pending):
        """pgbench, one client: lease ms, mark ms and events/s."""
        self.sql("DELETE FROM %s WHERE type = 'bench.event'" % t)
        self.fill(t, pending + 1000)
        script = self.pgbench_script(t)
        tps, lat = self.pgbench(script, 1, ["-t", str(pending // 100)])
        # lat: BEGIN, lease, claim, mark, COMMIT (pgbench_script)
        return {"lease_ms": lat[1], "mark_ms": lat[3], "per_s": tps * 100}

    def scale_history(self):
        clean = self.table("clean")
        big = self.table("history")
        say("inserting %d sent rows" % self.p["filler"])
        t0 = time.monotonic()
        self.add_filler(big, self.p["filler"])
        say("history ready in %.0fs" % (time.monotonic() - t0))
        res = {"clean": [], "history": []}
        for i in range(self.p["runs"]):
            for name, t in (("clean", clean), ("history", big)):
                r = self.lease_cycle(t, self.p["scale_pending"])
                res[name].append(r)
                say("%s run %d: lease %.3f ms, mark %.3f ms, %.0f events/s"
                    % (name, i + 1, r["lease_ms"], r["mark_ms"], r["per_s"]))
        out = {}
        for name in res:
            out[name] = {k: spread([r[k] for r in res[name]])
                         for k in ("lease_ms", "mark_ms", "per_s")}
        self.sql("DROP SCHEMA %s_history CASCADE" % self.tag)
        return out

    def scale_snapshot(self):
        t = self.table("snapshot")
        hold, rate = self.p["hold_s"], self.p["hold_rate"]
        res = {"held": [], "clean": []}
        for i in range(self.p["runs"]):
            for mode in ("clean", "held"):
                self.sql("TRUNCATE %s" % t)
                self.fill(t, rate * 100 * (hold + 5) + 20000)
                script = self.pgbench_script(t)
                holder = None
                if mode == "held":
                    holder = subprocess.Popen(
                        ["psql", self.svc.db_url, "-X", "-q", "-c",
                         "BEGIN ISOLATION LEVEL REPEATABLE READ", "-c",
                         "SELECT count(*) FROM pg_class", "-c",
                         "SELECT pg_sleep(%d)" % (hold + 60), "-c",
                         "COMMIT"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
                    deadline = time.monotonic() + 10
                    while self.sql(
                            "SELECT count(*) FROM pg_stat_activity WHERE "
                            "backend_xmin IS NOT NULL AND state = 'active' "
                            "AND query LIKE 'SELECT pg_sleep%'") == "0":
                        if time.monotonic() > deadline:
                            holder.kill()
                            raise BenchError("snapshot holder did not start")
                        time.sleep(0.1)
                try:
                    self.pgbench(script, 1, ["-R", str(rate), "-T",
                                             str(hold)],
                                 timeout=hold + 120)
                    tps, lat = self.pgbench(script, 1, ["-t", "100"])
                finally:
                    if holder:
                        holder.kill()
                        holder.wait()
                r = {"lease_ms": lat[1], "mark_ms": lat[3],
                     "per_s": tps * 100}
                res[mode].append(r)
                say("snapshot %s run %d: lease %.3f ms after %ds, %.0f "
                    "events/s" % (mode, i + 1, lat[1], hold, tps * 100))
        return {m: {k: spread([r[k] for r in res[m]])
                    for k in ("lease_ms", "mark_ms", "per_s")} for m in res}

    def scale_backlog(self):
        t = self.table("backlog")
        n = self.p["backlog"]
        w = max(self.p["workers"])
        runs = []
        for i in range(self.p["runs"]):
            self.sql("TRUNCATE %s" % t)
            self.fill(t, n)
            r = self.drain_once(t, n, "amqp", w, timeout=3600)
            runs.append(r)
            say("backlog run %d: %d events in %.1fs, %.0f events/s, per "
                "batch %s, CPU us/event by part %s, machine busy %.0f%%" % (
                    i + 1, n, r["seconds"], r["per_s"], r["per_batch"],
                    {k: round(v, 1) for k, v in
                     r["cpu_us_by_part"].items()},
                    100 * r["machine_busy"]))
        # The same breakdown as the 100k drains, to compare the two.
        return {"seconds": spread([r["seconds"] for r in runs]),
                "per_s": spread([r["per_s"] for r in runs]),
                "workers": w,
                "per_batch_ms": runs[-1]["per_batch"],
                "cpu_us_per_event_by_part": {
                    k: spread([r["cpu_us_by_part"][k] for r in runs])
                    for k in runs[0]["cpu_us_by_part"]},
                "machine_busy": spread([r["machine_busy"] for r in runs])}

    def scale_purge(self):
        t = self.table("purge")
        n = self.p["purge"]
        runs = []
        for i in range(self.p["runs"]):
            self.sql("TRUNCATE %s" % t)
            self.add_filler(t, n, age="2 days")
            lsn0 = self.sql("SELECT pg_current_wal_lsn()")
            t0 = time.monotonic()
            relay = Relay(self, t, "stdout", 1, {
                "OUTBOX_RETENTION": "1h", "OUTBOX_CLEAN_INTERVAL": "1s",
                "OUTBOX_CLEAN_BATCH_SIZE": "10000"}, log_name="purge")
            try:
                deadline = time.monotonic() + 3600
                while self.count(t, "true") > 0:
                    if not relay.alive() or time.monotonic() > deadline:
                        raise BenchError("the cleaner did not purge %d rows "
                                         "(log %s)" % (n, relay.log_path))
                    time.sleep(0.5)
                secs = time.monotonic() - t0
            finally:
                relay.stop()
            wal = int(self.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(),"
                               " '%s')" % lsn0).split(".")[0])
            runs.append({"seconds": secs, "wal_mb": wal / 1048576.0})
            say("purge run %d: %d rows in %.1fs, %.0f MB WAL" % (
                i + 1, n, secs, wal / 1048576.0))
        return {"seconds": spread([r["seconds"] for r in runs]),
                "wal_mb": spread([r["wal_mb"] for r in runs]),
                "rows": n, "clean_batch_size": 10000}

    # ---- 7. horizon: a snapshot held under a steady load ----

    def horizon(self):
        """Producers at a fixed rate for the whole of each cell; a
        REPEATABLE READ snapshot held for horizon_hold_s; the Postgres CPU
        of the relay's sessions per event, the backlog and the table's dead
        tuples in a window before the hold, in the hold's last window and
        in one after the release. Cells: the relay under test and the
        baseline (--baseline-bin, --baseline-env), each with history kept
        and without (OUTBOX_RETENTION=0, when the binary offers 0); one
        run unless --runs says otherwise, the binaries alternating."""
        dbcost.bind(sys.modules[__name__])
        bins = [("relay", self.relay_bin, {})]
        if self.args.baseline_bin or self.baseline_env:
            bins.append(("baseline", self.args.baseline_bin or
                         self.relay_bin, self.baseline_env))
        modes = {}
        for label, relay_bin, _ in bins:
            zero, rng = dbcost.retention_zero(relay_bin)
            modes[label] = ["history"] + (["nohistory"] if zero else [])
            if not zero:
                self.notes.append("horizon: the %s takes OUTBOX_RETENTION "
                                  "%s, not 0: no cell without history" % (
                                      label, rng))
        runs = {label: {m: [] for m in modes[label]} for label, _, _ in bins}
        for i in range(self.args.runs or 1):
            for label, relay_bin, env in (bins if i % 2 == 0 else
                                          bins[::-1]):
                for mode in modes[label]:
                    extra = dict(env)
                    if mode == "nohistory":
                        extra["OUTBOX_RETENTION"] = "0"
                    r = self.horizon_cell(label, relay_bin, extra, mode)
                    runs[label][mode].append(r)
                    say("horizon %s, %s, run %d (before, late, after): "
                        "Postgres CPU us/event %s (late %.2f x, after %.2f "
                        "x); events/s %s; backlog s %s; dead tuples %s" % (
                            label, mode, i + 1, horizon_line(
                                r, "pg_us_per_event", "%.1f"),
                            r["late_over_before"], r["after_over_before"],
                            horizon_line(r, "events_per_s", "%.0f"),
                            horizon_line(r, "backlog_s", "%.2f"),
                            horizon_line(r, "dead_tup", "%d")))
        out = {k: self.p["horizon_" + k] for k in (
            "rate", "payload", "warmup_s", "window_s", "hold_s", "after_s",
            "keys", "partitioned")}
        out["workers"] = 2
        out["publisher"] = "stdout"
        for label in runs:
            out[label] = {}
            for mode, rs in runs[label].items():
                cell = {w: {k: spread([r[w][k] for r in rs])
                            for k in rs[0][w]} for w in HORIZON}
                for k in ("late_over_before", "after_over_before"):
                    cell[k] = spread([r[k] for r in rs])
                out[label][mode] = cell
        return out

    def horizon_cell(self, label, relay_bin, env, mode):
        """One relay binary and history mode on a fresh table: the three
        windows and the ratios of the later two to the one before."""
        p = self.p
        rate, warm = p["horizon_rate"], p["horizon_warmup_s"]
        win, hold = p["horizon_window_s"], p["horizon_hold_s"]
        after = p["horizon_after_s"]
        t = self.table("horizon_%s_%s" % (label, mode), relay_bin=relay_bin)
        if p["horizon_partitioned"]:
            # The day's partition long made: the cell's ids land there,
            # not in the default partition a fresh migration leaves.
            cell_s = warm + 3 * win + hold + after + 300
            dbcost.DbCost(self).partition(t, relay_bin,
                                          minutes=cell_s // 60 + 10)
        self.sql("TRUNCATE %s" % t)
        self.sql("VACUUM ANALYZE %s" % t)
        script = os.path.join(self.work, "horizon-insert.sql")
        keys = p["horizon_keys"]
        with open(script, "w") as f:
            # With keys, each event names one of them at random: the
            # ordered relay's walk then has every key live at once.
            if keys:
                f.write("\\set k random(1, %d)\n" % keys)
            f.write("INSERT INTO %s (type, routing_key, partition_key, "
                    "payload) VALUES ('bench.event', 'bench', %s, "
                    "decode(repeat(md5(random()::text), %d), 'hex'));\n" % (
                        t, "'k' || (:k)::int" if keys else "NULL",
                        p["horizon_payload"] // 16))
        name = "horizon-%s-%s" % (label, mode)
        relay = Relay(self, t, "stdout", 2, env, log_name=name,
                      relay_bin=relay_bin)
        producers = holder = w = None
        res = {}
        try:
            # The producers run for the whole cell; they are stopped at
            # its end.
            with open(os.path.join(self.work, name + "-pgbench.log"),
                      "a") as err:
                producers = subprocess.Popen(
                    [self.svc.pgbench, "-n", "-M", "prepared", "-c", "2",
                     "-j", "1", "-R", str(rate), "-T",
                     str(warm + 3 * win + hold + after + 300), "-f", script,
                     self.svc.db_url], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=err)

            def pause(until):
                while time.monotonic() < until:
                    if not relay.alive():
                        raise BenchError("relay exited (log %s)" %
                                         relay.log_path)
                    if producers.poll() is not None:
                        raise BenchError("the producers (pgbench) exited "
                                         "early")
                    time.sleep(min(1.0, max(0.0, until - time.monotonic())))

            pause(time.monotonic() + warm)
            w = HorizonWindow(self, relay, t)
            pause(time.monotonic() + win)
            res["before"] = w.end()
            holder = self.hold_snapshot(t)
            held = time.monotonic()
            say("horizon %s, %s: snapshot held for %d s" % (label, mode,
                                                             hold))
            pause(held + hold - win)
            w = HorizonWindow(self, relay, t)
            pause(held + hold)
            res["late"] = w.end()
            self.release_snapshot(holder)
            holder = None
            pause(time.monotonic() + after)
            w = HorizonWindow(self, relay, t)
            pause(time.monotonic() + win)
            res["after"] = w.end()
        finally:
            if w:
                w.cpu.stop()
            if holder:
                self.release_snapshot(holder)
            if producers and producers.poll() is None:
                producers.terminate()
                producers.wait(30)
            rc = relay.stop()
        if rc != 0:
            raise BenchError("relay exit code %s (log %s)" % (
                rc, relay.log_path))
        # With history kept the full form leaves 2M rows: not kept for
        # the next cell.
        self.sql("SET client_min_messages = warning; DROP SCHEMA %s "
                 "CASCADE" % t.split(".")[0])
        for k in ("late", "after"):
            res[k + "_over_before"] = ratio(res[k]["pg_us_per_event"],
                                            res["before"]["pg_us_per_event"])
        return res

    def hold_snapshot(self, t):
        """A session holding a REPEATABLE READ snapshot (it has read the
        outbox table) until release_snapshot(); returns once its
        backend_xmin is set."""
        app = self.tag + "_holder"
        holder = subprocess.Popen(
            ["psql", self.svc.db_url, "-X", "-q", "-c",
             "BEGIN ISOLATION LEVEL REPEATABLE READ", "-c",
             "SELECT count(*) FROM %s" % t, "-c",
             "SELECT pg_sleep(%d)" % (self.p["horizon_hold_s"] + 3600),
             "-c", "COMMIT"], env=dict(os.environ, PGAPPNAME=app),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while self.sql(
                "SELECT count(*) FROM pg_stat_activity WHERE "
                "application_name = '%s' AND backend_xmin IS NOT NULL AND "
                "state = 'active' AND query LIKE 'SELECT pg_sleep%%'"
                % app) == "0":
            if time.monotonic() > deadline or holder.poll() is not None:
                holder.kill()
                holder.wait()
                raise BenchError("the snapshot holder did not start")
            time.sleep(0.1)
        return holder, app

    def release_snapshot(self, holder):
        """Ends the holder's session (killing psql alone would leave its
        backend asleep, snapshot held) and waits until it is gone."""
        proc, app = holder
        where = "application_name = '%s'" % app
        self.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE " + where)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        deadline = time.monotonic() + 30
        while self.sql("SELECT count(*) FROM pg_stat_activity WHERE " +
                       where) != "0":
            if time.monotonic() > deadline:
                raise BenchError("the snapshot holder's session did not end")
            time.sleep(0.1)

    # ---- report ----

    def report(self):
        r = self.results
        rows = []

        def fmt(s, digits=0):
            f = "%%.%df" % digits
            return (f % s["median"], (f + "–" + f) % (s["min"], s["max"]))

        def row(measure, s, digits=0, compare=""):
            med, rng = fmt(s, digits)
            rows.append("| %s | %s | %s | %s |" % (
                measure, med, rng, compare))

        lim = r.get("limits", {})
        if lim:
            row("Database cycle limit, events/s (pgbench, lease, claim and "
                "mark in one transaction, batch 100, %d clients)"
                % self.p["db_clients"], lim["db"])
            row("AMQP broker limit, msgs/s (confirmed publisher, 1 KB "
                "persistent, window 1000)", lim["amqp"])
            if "kafka" in lim:
                row("Kafka test-broker limit, msgs/s (idempotent, acks=all, "
                    "1 KB)", lim["kafka"])
        tp = r.get("throughput", {})
        for broker in ("amqp", "kafka"):
            if broker not in tp or not lim or broker not in lim:
                continue
            for w, d in tp[broker].items():
                row("%s throughput, %s worker(s), events/s (%d events "
                    "consumed)" % (broker.upper(), w, self.p["events"]),
                    d["events_per_s"], 0,
                    "%.2f × min(limits) = %.0f" % (d["ratio_to_limit"],
                                                   d["limit"]))
        for broker in ("amqp", "kafka"):
            one = r.get("throughput_ratios", {}).get(broker, {}).get(
                "one_over_four")
            if one is not None:
                rows.append("| %s throughput, 1 worker ÷ 4 workers | %.2f | "
                            "| |" % (broker.upper(), one))
        for broker in ("amqp", "kafka"):
            for w, d in tp.get(broker, {}).items():
                row("Relay CPU per event, µs (%s, %s worker(s))"
                    % (broker.upper(), w), d["cpu_us_per_event"], 1)
            for w, d in tp.get(broker, {}).items():
                base = d.get("baseline")
                if not base:
                    continue
                row("Relay CPU per event, µs (%s, %s worker(s)), this build "
                    "vs the baseline" % (broker.upper(), w),
                    d["cpu_us_per_event"], 1,
                    "%.2f × baseline (%.1f µs, %.1f–%.1f); events/s %.2f × "
                    "(%.0f)" % (d["cpu_us_per_event_vs_baseline"],
                                base["cpu_us_per_event"]["median"],
                                base["cpu_us_per_event"]["min"],
                                base["cpu_us_per_event"]["max"],
                                d["events_per_s_vs_baseline"],
                                base["events_per_s"]["median"]))
            for w, d in tp.get(broker, {}).items():
                base = d.get("baseline")
                row("Relay peak RSS, MB (%s, %s worker(s))"
                    % (broker.upper(), w), d["peak_rss_mb"], 1,
                    "%.2f × baseline (%.1f)" % (
                        ratio(d["peak_rss_mb"], base["peak_rss_mb"]),
                        base["peak_rss_mb"]["median"]) if base else "")
            for w, d in tp.get(broker, {}).items():
                pb = d.get("per_batch_ms", {})
                if pb:
                    rows.append(
                        "| Per batch, ms (%s, %s worker(s); the relay's "
                        "/metrics, last run): %s | | | |" % (
                            broker.upper(), w, ", ".join(
                                "%s %.2f" % (k[:-3], pb[k]) for k in
                                ("lease_ms", "mark_ms", "publish_ms")
                                if k in pb)))
            w = str(max(self.p["workers"]))
            d = tp.get(broker, {}).get(w)
            if d:
                parts = d["cpu_us_per_event_by_part"]
                med = {k: v["median"] for k, v in parts.items()}
                total = sum(med.values())
                # What this machine could do if the relay cost nothing:
                # every CPU busy with the database, broker and consumer.
                ceiling = os.cpu_count() * 1e6 / max(
                    1e-9, total - med["relay"])
                d["relay_cpu_share"] = med["relay"] / total
                d["shared_cpu_ceiling"] = ceiling
                rows.append(
                    "| CPU per event on this machine, µs (%s, %s workers): "
                    "%s | %.1f | | relay %.0f %% of it; machine busy %.0f "
                    "%% of %d CPUs |" % (
                        broker.upper(), w, ", ".join(
                            "%s %.1f" % (k, med[k]) for k in
                            ("relay", "postgres", "broker", "consumer")),
                        total, 100 * med["relay"] / total,
                        100 * d["machine_busy"]["median"], os.cpu_count()))
                rows.append(
                    "| %s throughput, %s workers, vs a relay costing "
                    "nothing on these %d CPUs, events/s | %.0f | | %.2f × "
                    "that ceiling of %.0f |" % (
                        broker.upper(), w, os.cpu_count(),
                        d["events_per_s"]["median"],
                        d["events_per_s"]["median"] / ceiling, ceiling))
        lat = r.get("latency")
        if lat:
            what = "%d events/s for %d s, AMQP, 1 worker" % (
                self.p["latency_rate"], self.p["latency_s"])
            row("Latency p50, ms (%s)" % what, lat["p50"], 1)
            row("Latency p99, ms", lat["p99"], 1)
            row("Latency max, ms", lat["max"], 1)
            self.lease_cost_rows(lat, "polling", row)
        lat = r.get("latency_listen")
        if lat:
            row("Latency p50, ms, with OUTBOX_LISTEN=on", lat["p50"], 1)
            row("Latency p99, ms, with OUTBOX_LISTEN=on", lat["p99"], 1)
            row("Latency max, ms, with OUTBOX_LISTEN=on", lat["max"], 1)
            self.lease_cost_rows(lat, "OUTBOX_LISTEN=on", row)
        self.latency_rows(r, row)
        nt = r.get("notify")
        if nt:
            row("Producer commits/s, 4 connections, no NOTIFY trigger",
                nt["off"])
            row("Producer commits/s, 4 connections, NOTIFY trigger "
                "(OUTBOX_LISTEN=on)", nt["on"], 0, "%.2f × without" % (
                    nt["on"]["median"] / nt["off"]["median"]))
        sc = r.get("scale", {})
        if "history" in sc:
            h = sc["history"]
            row("Lease time, ms, clean table (pgbench, 1 client)",
                h["clean"]["lease_ms"], 3)
            row("Lease time, ms, with %s sent rows" % "{:,}".format(
                self.p["filler"]), h["history"]["lease_ms"], 3,
                "%.2f × clean" % h["lease_ratio"])
            row("Mark time, ms, clean table", h["clean"]["mark_ms"], 3)
            row("Mark time, ms, with %s sent rows" % "{:,}".format(
                self.p["filler"]), h["history"]["mark_ms"], 3,
                "%.2f × clean" % ratio(h["history"]["mark_ms"],
                                       h["clean"]["mark_ms"]))
            row("Cycle throughput, events/s, clean table",
                h["clean"]["per_s"])
            row("Cycle throughput, events/s, with %s sent rows" %
                "{:,}".format(self.p["filler"]), h["history"]["per_s"], 0,
                "%.2f × clean" % (h["history"]["per_s"]["median"] /
                                  h["clean"]["per_s"]["median"]))
        if "snapshot" in sc:
            s = sc["snapshot"]
            row("Lease time, ms, after %d s at %d events/s, no old "
                "snapshot" % (self.p["hold_s"], self.p["hold_rate"] * 100),
                s["clean"]["lease_ms"], 3)
            row("Lease time, ms, after %d s with a snapshot held" %
                self.p["hold_s"], s["held"]["lease_ms"], 3,
                "%.2f × no snapshot" % s["lease_ratio"])
            row("Cycle throughput, events/s, with a snapshot held",
                s["held"]["per_s"], 0, "%.2f × no snapshot" % (
                    s["held"]["per_s"]["median"] /
                    s["clean"]["per_s"]["median"]))
        if "backlog" in sc:
            b = sc["backlog"]
            row("Backlog drain of %s events, s (AMQP, %d workers)" % (
                "{:,}".format(self.p["backlog"]), b["workers"]),
                b["seconds"], 1)
            row("Backlog drain rate, events/s", b["per_s"])
            med = {k: v["median"]
                   for k, v in b["cpu_us_per_event_by_part"].items()}
            rows.append(
                "| CPU per event in the backlog drain, µs: %s | %.1f | | "
                "machine busy %.0f %% of %d CPUs |" % (
                    ", ".join("%s %.1f" % (k, med[k]) for k in
                              ("relay", "postgres", "broker", "consumer")),
                    sum(med.values()), 100 * b["machine_busy"]["median"],
                    os.cpu_count()))
        if "purge" in sc:
            p = sc["purge"]
            row("Cleaner purge of %s rows, s (batch %d)" % (
                "{:,}".format(p["rows"]), p["clean_batch_size"]),
                p["seconds"], 1)
            row("WAL written by the purge, MB", p["wal_mb"], 0)
        if "dbcost" in r:
            dbcost.report_rows(r["dbcost"], row, rows)
        if "many" in r:
            many.report_rows(r["many"], row)
        head = ["| Measure | Median | Min–max | Compared with |",
                "|---|---|---|---|"]
        notes = ["", "Notes: " + "; ".join(self.notes) + "."] \
            if self.notes else []
        out = head + rows + notes if rows else notes[1:]
        if "horizon" in r:
            out += ([""] if out else []) + self.horizon_table(r["horizon"])
        return "\n".join(out)

    @staticmethod
    def horizon_table(h):
        """The horizon section's own table: per relay, history mode and
        window, the figures and the ratio to the window before the hold."""
        def cell(s, f):
            if s["min"] == s["max"]:
                return f % s["median"]
            return (f + " (" + f + "–" + f + ")") % (s["median"], s["min"],
                                                     s["max"])

        keys = h.get("keys", 0)
        out = ["Horizon: producers at %d events/s (%d-byte payloads%s) for "
               "the whole cell; the relay with %d workers, publisher %s; a "
               "REPEATABLE READ snapshot held %d s; %d s windows: before "
               "(after a %d s warm-up), late (the hold's last %d s), after "
               "(from %d s after the release)%s." % (
                   h["rate"], h["payload"], ", each with one of %d "
                   "partition keys at random" % keys if keys else "",
                   h["workers"], h["publisher"], h["hold_s"], h["window_s"],
                   h["warmup_s"], h["window_s"], h["after_s"],
                   "; the table partitioned by the day, the events landing "
                   "in the day's partition" if h.get("partitioned") else ""),
               "",
               "| Relay | History | Window | Postgres CPU of the relay's "
               "sessions, µs/event | × before | Events/s relayed | Backlog, "
               "s of input | Dead tuples | Whole cluster's CPU, µs/event |",
               "|---|---|---|---|---|---|---|---|---|"]
        for label in ("relay", "baseline"):
            for mode in ("history", "nohistory"):
                c = h.get(label, {}).get(mode)
                if not c:
                    continue
                for w in HORIZON:
                    d = c[w]
                    out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s "
                               "|" % (
                                   "under test" if label == "relay" else
                                   "baseline", "kept" if mode == "history"
                                   else "none (OUTBOX_RETENTION=0)", w,
                                   cell(d["pg_us_per_event"], "%.1f"),
                                   cell(c[w + "_over_before"], "%.2f")
                                   if w != "before" else "",
                                   cell(d["events_per_s"], "%.0f"),
                                   cell(d["backlog_s"], "%.2f"),
                                   cell(d["dead_tup"], "%.0f"),
                                   cell(d["cluster_us_per_event"], "%.1f")))
        return out

    def lease_cost_rows(self, lat, name, row):
        """What the relay cost Postgres while the latency was measured."""
        if "pg_us_per_event" not in lat:
            return
        base = lat.get("baseline")
        row("Postgres CPU of the relay's sessions per event, µs, %s at "
            "%d events/s" % (name, self.p["latency_rate"]),
            lat["pg_us_per_event"], 1, "%.2f × baseline (%.1f)" % (
                lat["pg_us_per_event_vs_baseline"],
                base["pg_us_per_event"]["median"]) if base else "")
        row("Leases per 1000 events, %s at %d events/s" % (
            name, self.p["latency_rate"]), lat["leases_per_1000"], 0,
            "%.2f × baseline (%.0f)" % (
                ratio(lat["leases_per_1000"], base["leases_per_1000"]),
                base["leases_per_1000"]["median"]) if base else "")

    def latency_rows(self, r, row):
        """The broker floor at the base rate, and all three at the high
        rate, each percentile beside the floor's."""
        def cells(name, lat, floor):
            for k in ("p50", "p99", "max"):
                cmp = ""
                if floor and lat is not floor:
                    cmp = "floor %.1f ms (+%.1f ms)" % (
                        floor[k]["median"],
                        lat[k]["median"] - floor[k]["median"])
                row("Latency %s, ms, %s" % (k, name), lat[k], 1, cmp)

        floor = r.get("latency_floor")
        if floor:
            cells("broker floor (a confirmed publisher at %d/s)"
                  % self.p["latency_rate"], floor, floor)
        high = self.p["latency_high_rate"]
        floor = r.get("latency_high_floor")
        for key, name in (("latency_high", "polling"),
                          ("latency_high_listen", "OUTBOX_LISTEN=on"),
                          ("latency_high_floor", "broker floor")):
            if r.get(key):
                cells("%s at %d events/s" % (name, high), r[key], floor)
                row("Events measured, %s at %d events/s for %d s" % (
                    name, high, self.p["latency_s"]), r[key]["events"], 0,
                    "of %d at the rate (fewer: the producers or the "
                    "relay fell short of it)" % (high * self.p["latency_s"]))

    def machine(self):
        model = ""
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        model = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        return {"cpus": os.cpu_count(), "cpu": model,
                "kernel": platform.release()}

    def charts(self, doc):
        """SVG charts beside the table (tests/bench/charts.py), drawn by
        a Python that has matplotlib: this one, or Debian's."""
        out = os.path.abspath(self.args.charts)
        os.makedirs(out, exist_ok=True)
        result = os.path.join(out, "bench-result.json")
        with open(result, "w") as f:
            json.dump(doc, f, sort_keys=True, indent=1)
            f.write("\n")
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "charts.py")
        for py in (sys.executable, "/usr/bin/python3"):
            probe = subprocess.run([py, "-c", "import matplotlib"],
                                   capture_output=True)
            if probe.returncode == 0:
                for line in run([py, script, result, out],
                                timeout=300).splitlines():
                    say(line)
                return
        raise BenchError("--charts needs matplotlib (Debian package "
                         "python3-matplotlib)")

    def main(self):
        t_begin = time.monotonic()
        self.svc = Services(self.work, self.kafka, self.build)
        if self.kafka and not self.svc.kafka_brokers:
            say("no Kafka broker: the Kafka figures are left out")
            self.kafka = False
        try:
            # Only these run the captured statements; dbcost runs its own,
            # so it works with a relay whose statements have other shapes.
            if set(self.sections) & {"limits", "history", "snapshot"}:
                self.statements = self.capture_statements()
            if "limits" in self.sections:
                lim = {"db": self.db_limit(), "amqp": self.amqp_limit()}
                if self.kafka:
                    lim["kafka"] = self.kafka_limit()
                self.results["limits"] = lim
            if "throughput" in self.sections:
                tp = {"amqp": self.throughput("amqp")}
                if self.kafka:
                    tp["kafka"] = self.throughput("kafka")
                self.results["throughput"] = tp
            if "latency" in self.sections:
                self.results["latency"] = self.latency()
                self.results["latency_listen"] = self.latency(listen=True)
                if self.args.baseline_bin or self.baseline_env:
                    # What the leases cost Postgres against the baseline,
                    # at the base rate (the lease-cost targets).
                    for key, listen in (("latency", False),
                                        ("latency_listen", True)):
                        self.results[key]["baseline"] = self.latency(
                            listen=listen, relay_bin=self.args.baseline_bin,
                            env=self.baseline_env)
                self.results["latency_floor"] = self.latency_floor(
                    self.p["latency_rate"])
                high = self.p["latency_high_rate"]
                self.results["latency_high"] = self.latency(rate=high)
                self.results["latency_high_listen"] = self.latency(
                    listen=True, rate=high)
                self.results["latency_high_floor"] = self.latency_floor(high)
            if "notify" in self.sections:
                self.results["notify"] = self.notify_cost()
            for part in SCALE:
                if part in self.sections:
                    self.results.setdefault("scale", {})[part] = getattr(
                        self, "scale_" + part)()
            if "dbcost" in self.sections:
                self.results["dbcost"] = dbcost.measure(
                    self, sys.modules[__name__])
            if "horizon" in self.sections:
                self.results["horizon"] = self.horizon()
            if "many" in self.sections:
                self.results["many"] = many.measure(
                    self, sys.modules[__name__])
            derive(self.results, self.p["workers"])
            table = self.report()
            vs = verdicts(self.results, self.sections,
                          bool(self.args.baseline_bin or self.baseline_env))
            doc = {
                "bench": "outbox-relay",
                "form": "quick" if self.args.quick else "full",
                "runs": self.p["runs"],
                "parameters": self.p,
                "relay_sanitized": self.sanitized,
                "relay_env": self.relay_env,
                "baseline_env": self.baseline_env,
                "machine": self.machine(),
                "seconds": round(time.monotonic() - t_begin, 1),
                "targets": [{"name": n, "what": w, "reads": list(p),
                             "op": op, "threshold": t}
                            for n, w, p, op, t in TARGETS],
                "verdicts": vs,
                "results": self.results,
            }
            print(table)
            print()
            print(verdict_table(vs))
            print()
            print(json.dumps(doc, sort_keys=True, separators=(",", ":")))
            sys.stdout.flush()
            if self.args.charts:
                self.charts(doc)
            if self.sanitized:
                say("note: the relay was built with sanitizers; its CPU and "
                    "memory figures are not representative")
            return 0
        finally:
            try:
                self.drop_tables()
            except BenchError as e:
                say("cleanup: %s" % e)
            self.svc.stop()
            if self.args.keep:
                say("kept " + self.work)
            else:
                shutil.rmtree(self.work, ignore_errors=True)


def on_signal(signum, frame):
    # Through the finally blocks: relays stopped, services stopped.
    raise SystemExit(128 + signum)


def main():
    signal.signal(signal.SIGTERM, on_signal)
    p = argparse.ArgumentParser(
        prog="bench.sh", description="outbox-relay benchmark: a Markdown "
        "table and a JSON line on stdout, progress on stderr.")
    p.add_argument("--quick", action="store_true",
                   help="small sizes and one run each (a smoke test)")
    p.add_argument("--runs", type=int, default=0,
                   help="runs per figure (default 3, --quick 1; the "
                   "horizon section 1)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help="comma-separated subset of " + ",".join(SECTIONS) +
                   " (scale = history,snapshot,backlog,purge; default: "
                   "all of them), or sections run only when named: " +
                   ",".join(ON_REQUEST))
    p.add_argument("--workers", default=None, metavar="LIST",
                   help="the throughput section's worker counts, "
                   "comma-separated (default 1,2,4)")
    p.add_argument("--events", type=int, default=0,
                   help="events per throughput drain (default 100000, "
                   "--quick 5000)")
    p.add_argument("--horizon-hold", type=int, default=0, metavar="S",
                   help="the horizon section's snapshot hold, seconds "
                   "(default 1800, --quick 120)")
    p.add_argument("--horizon-keys", type=int, default=0, metavar="N",
                   help="the horizon section's producers give each event "
                   "one of N partition keys at random (default 0: none); "
                   "with --relay-env OUTBOX_ORDERING=partition this "
                   "measures the ordered walk under the hold")
    p.add_argument("--horizon-partitioned", action="store_true",
                   help="the horizon section's tables partitioned by the "
                   "day (migrate --partition, the day's partition made "
                   "ahead, as dbcost's relay_life_partitioned)")
    p.add_argument("--dbcost-variants", default=None, metavar="LIST",
                   help="the dbcost section's variants, comma-separated "
                   "(default: all of them; the targets of variants left "
                   "out read not measured)")
    p.add_argument("--no-kafka", action="store_true",
                   help="leave out the Kafka figures")
    p.add_argument("--keep", action="store_true",
                   help="keep the work directory (scripts, relay logs)")
    p.add_argument("--baseline-bin", default=None,
                   help="a second relay binary (an earlier build): the "
                   "throughput section drains with both, alternating, and "
                   "reports this build's relay CPU per event as a ratio")
    p.add_argument("--charts", default=None, metavar="DIR",
                   help="also write SVG charts (throughput against the "
                   "limits, latency distribution) and the result they "
                   "were drawn from into DIR (needs python3-matplotlib)")
    p.add_argument("--relay-env", action="append", default=[],
                   metavar="OUTBOX_NAME=VALUE",
                   help="a setting for every relay the run starts "
                   "(repeatable), e.g. OUTBOX_RETENTION=0")
    p.add_argument("--baseline-env", action="append", default=[],
                   metavar="OUTBOX_NAME=VALUE",
                   help="a setting for the throughput baseline's relays "
                   "(repeatable): with or without --baseline-bin, each "
                   "run also drains with it, alternating")
    p.add_argument("--relay-bin", default=os.environ.get("RELAY_TEST_BIN"),
                   help="relay binary (default $RELAY_TEST_BIN)")
    a = p.parse_args()
    a.sections = [s for s in a.sections.split(",") if s]
    if "scale" in a.sections:
        a.sections += SCALE
    bad = [s for s in a.sections
           if s not in SECTIONS + ON_REQUEST + ["scale"]]
    if bad:
        p.error("unknown section(s): " + ", ".join(bad))
    for kv in a.relay_env + a.baseline_env:
        if not re.match(r"OUTBOX_[A-Z0-9_]+=", kv):
            p.error("--relay-env and --baseline-env take OUTBOX_NAME=VALUE, "
                    "not " + kv)
    if a.workers is not None:
        try:
            a.workers = [int(w) for w in a.workers.split(",") if w]
        except ValueError:
            p.error("--workers takes numbers, e.g. 1,4")
        if not a.workers or any(w < 1 or w > 64 for w in a.workers):
            p.error("--workers takes worker counts of 1..64")
    if a.events and (a.events < 100 or a.events > 10000000):
        p.error("--events must be 100..10000000")
    window = (QUICK if a.quick else FULL)["horizon_window_s"]
    if a.horizon_hold and (a.horizon_hold < window or
                           a.horizon_hold > 86400):
        p.error("--horizon-hold must be %d..86400 seconds (at least the "
                "window)" % window)
    if a.horizon_keys < 0 or a.horizon_keys > 1000000:
        p.error("--horizon-keys must be 0..1000000")
    if a.dbcost_variants is not None:
        a.dbcost_variants = [v for v in a.dbcost_variants.split(",") if v]
        bad = [v for v in a.dbcost_variants if v not in dbcost.VARIANTS]
        if bad or not a.dbcost_variants:
            p.error("--dbcost-variants takes some of " +
                    ",".join(dbcost.VARIANTS) + (", not " + ",".join(bad)
                                                 if bad else ""))
    if a.runs < 0 or a.runs > 20:
        p.error("--runs must be 1..20")
    if not a.relay_bin:
        p.error("no relay binary: set RELAY_TEST_BIN or --relay-bin")
    try:
        return Bench(a).main()
    except BenchError as e:
        print("bench: error: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
