#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The benchmark's charts (tests/bench/charts.py, bench.sh --charts DIR):
# from a result with the limits, throughput and latency sections, two
# SVG files showing what they promise (throughput bars by workers against
# each limit, the latency distribution with and without LISTEN); a result
# without those sections draws nothing and says so. The full benchmark
# draws them for real in the bench suite (tests/bench/quick.sh).
set -euo pipefail
root="${RELAY_TEST_SOURCE_ROOT:?run through meson test}"
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-it-bench_charts.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
py=""
for p in python3 /usr/bin/python3; do
	if "$p" -c 'import matplotlib' 2>/dev/null; then
		py=$p
		break
	fi
done
[ -n "$py" ] || fail "no python3 with matplotlib (Debian package python3-matplotlib)"

"$py" - "$work/result.json" <<'PY'
import json, sys
def s(v):
    return {"median": v, "min": v, "max": v}
cdf = [5 + i * 0.2 for i in range(100)] + [48.0]
cdf_listen = [3 + i * 0.15 for i in range(100)] + [30.0]
doc = {"form": "quick", "runs": 1, "machine": {"cpus": 2},
       "parameters": {"latency_rate": 1000},
       "results": {
           "limits": {"db": s(52000), "amqp": s(28000), "kafka": s(29000)},
           "throughput": {b: {w: {"events_per_s": s(v * int(w) / 4)}
                              for w in ("1", "2", "4")}
                          for b, v in (("amqp", 13800), ("kafka", 23500))},
           "latency": {"p50": s(15.0), "p99": s(31.2), "max": s(48.0), "cdf_ms": cdf},
           "latency_listen": {"p50": s(11.4), "p99": s(27.9), "max": s(30.0),
                              "cdf_ms": cdf_listen},
           "dbcost": {"variants": {
               "floor_c": {"wal_bytes_per_event": s(1294), "cpu_us_per_event": s(25.2)},
               "floor_d": {"wal_bytes_per_event": s(2736), "cpu_us_per_event": s(50.3),
                           "with_deletes_wal_bytes_per_event": s(3982),
                           "with_deletes_cpu_us_per_event": s(59.0)},
               "relay_nohistory": {"wal_bytes_per_event": s(1313), "cpu_us_per_event": s(31.5)},
               "relay_history": {"wal_bytes_per_event": s(2805), "cpu_us_per_event": s(52.9)}}}}}
json.dump(doc, open(sys.argv[1], "w"))
PY
"$py" "$root/tests/bench/charts.py" "$work/result.json" "$work/charts" >"$work/out" 2>&1 ||
	fail "charts.py failed: $(cat "$work/out")"
for f in throughput latency dbcost; do
	[ -s "$work/charts/$f.svg" ] || fail "no $f.svg"
	"$py" -c 'import sys, xml.etree.ElementTree as E; assert E.parse(sys.argv[1]).getroot().tag.endswith("svg")' \
		"$work/charts/$f.svg" || fail "$f.svg is not SVG"
done
want() {
	grep -qF -- "$2" "$work/charts/$1" || fail "$1 does not show '$2'"
}
want throughput.svg "Throughput against the limits"
want throughput.svg "Postgres limit (lease + mark): 52000/s"
want throughput.svg "RabbitMQ limit: 28000/s"
want throughput.svg "Kafka test broker limit: 29000/s"
want throughput.svg "relay, amqp"
want throughput.svg "relay, kafka"
want throughput.svg "13800"
want throughput.svg "relay workers"
want latency.svg "Latency distribution at 1000 events/s"
want latency.svg "p50 15.0 ms, p99 31.2 ms"
want latency.svg "OUTBOX_LISTEN=on: p50 11.4 ms, p99 27.9 ms"
want latency.svg "target: p99 within 50 ms"
want dbcost.svg "Database cost per event"
want dbcost.svg "relay (blue) beside the floor (grey)"
want dbcost.svg "WAL bytes per event"
want dbcost.svg "1313"
want dbcost.svg "relay"
# The same result draws the same files.
"$py" "$root/tests/bench/charts.py" "$work/result.json" "$work/again" >/dev/null 2>&1
cmp -s "$work/charts/latency.svg" "$work/again/latency.svg" || fail "charts differ between two drawings"

# Sections not run: nothing to draw, said, exit 1.
echo '{"results": {"notify": {}}}' >"$work/none.json"
if "$py" "$root/tests/bench/charts.py" "$work/none.json" "$work/none" >"$work/none.out" 2>&1; then
	fail "charts.py succeeded with nothing to draw"
fi
grep -q "throughput.svg left out" "$work/none.out" || fail "no word on the left-out chart"
echo ok
