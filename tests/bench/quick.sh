#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The benchmark's short form for tests/run.sh (suite bench): small sizes,
# one run each. Times are not asserted (the test build has sanitizers);
# only that it completes and prints a well-formed table, the targets'
# verdicts computed from its figures, and a JSON line with every section's
# figures.
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
out=$(mktemp "${TMPDIR:-/tmp}/outbox-bench-quick.XXXXXX")
charts=$(mktemp -d "${TMPDIR:-/tmp}/outbox-bench-charts.XXXXXX")
trap 'rm -rf "$out" "$charts"' EXIT
bash "$here/bench.sh" --quick --charts "$charts" >"$out"
cat "$out"
python3 - "$out" "$charts" <<'PY'
import json, os, sys
import xml.etree.ElementTree as ET
lines = open(sys.argv[1]).read().splitlines()
# Two tables, a blank line after each: the results, then the targets with
# this run's verdicts.
first = lines.index("| Measure | Median | Min–max | Compared with |")
assert lines[first + 1] == "|---|---|---|---|", "no results table header"
end = lines.index("", first)
table = lines[first:end]
assert all(l.count("|") == 5 for l in table), "malformed table row"
doc = json.loads(lines[-1])
r = doc["results"]
# Every target of bench.py's table has a verdict row, computed from this
# run's figure: the value shown is the JSON line's, and the verdict follows
# from it and the threshold. The quick form runs every section of the
# default list, so only the targets relative to a baseline build and those
# of the sections run on request (horizon) go unmeasured.
head = "| Target | Figure read (JSON line, results.…) | This run | Threshold | Verdict |"
assert head in lines, "no targets table"
t0 = lines.index(head)
assert lines[t0 + 1] == "|---|---|---|---|---|"
vrows = lines[t0 + 2:lines.index("", t0)]
targets, verdicts = doc["targets"], doc["verdicts"]
assert len(targets) >= 20 and len(vrows) == len(targets) == len(verdicts), \
    "%d targets, %d verdicts, %d rows" % (len(targets), len(verdicts), len(vrows))
def lookup(path):
    x = r
    for k in path:
        x = x[k]
    return x["median"] if isinstance(x, dict) else x
no_history = not r["dbcost"]["retention_zero"]["supported"]
for t, v, line in zip(targets, verdicts, vrows):
    assert v["name"] == t["name"]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert len(cells) == 5 and cells[0] == t["what"], "row %r" % line
    if t["reads"][0] in ("horizon", "many"):  # sections run on request
        assert v["verdict"] == "not measured in this run" and \
            v["detail"] == "section %s not run" % t["reads"][0], v
        continue
    if "baseline" in t["name"] or (no_history and "nohistory" in t["name"]):
        assert v["verdict"] == "not measured in this run" and v["detail"], v
        assert cells[4].startswith("not measured in this run ("), line
        continue
    value = lookup(t["reads"])
    assert v["value"] == value, (t["name"], v["value"], value)
    ok = value >= t["threshold"] if t["op"] == ">=" else value <= t["threshold"]
    assert v["verdict"] == ("met" if ok else "missed"), (t["name"], v, value)
    assert cells[4].split(" (")[0] == v["verdict"], line
    assert cells[2] and float(cells[2]) > 0, line
for key in ("limits", "throughput", "latency", "notify", "scale", "dbcost"):
    assert key in r, "no %s in the JSON line" % key
assert "horizon" not in r, "the horizon section ran by default"
assert "many" not in r, "the many section ran by default"
for w in ("1", "2", "4"):
    d = r["throughput"]["amqp"][w]
    assert d["events_per_s"]["median"] > 0 and d["cpu_us_per_event"]["median"] > 0
assert r["latency"]["p99"]["median"] > 0
# What the relay cost Postgres beside the latency: its sessions' CPU and
# leases per event, both measured, never zero while events flowed.
assert r["latency"]["pg_us_per_event"]["median"] > 0
assert r["latency"]["leases_per_1000"]["median"] > 0
# The broker floor and the high rate, each measured.
for key in ("latency_floor", "latency_high", "latency_high_listen",
            "latency_high_floor"):
    assert r[key]["p99"]["median"] > 0, "no %s" % key
cdf = r["latency"]["cdf_ms"]
assert len(cdf) == 101 and cdf == sorted(cdf) and cdf[-1] == r["latency"]["max"]["median"]
for name in ("throughput.svg", "latency.svg"):
    root = ET.parse(os.path.join(sys.argv[2], name)).getroot()
    assert root.tag.endswith("svg"), "%s is not an SVG" % name
assert set(r["scale"]) == {"history", "snapshot", "backlog", "purge"}
# Database cost: every variant measured something, and the ratios to the
# floor the targets speak of are there.
db = r["dbcost"]
want = {"floor_c", "floor_d", "floor_a", "relay_history", "relay_ordered",
        "relay_life", "relay_life_partitioned"}
if db["retention_zero"]["supported"]:
    want |= {"relay_nohistory", "relay_ordered_nohistory",
             "relay_nohistory_partitioned"}
assert set(db["variants"]) == want, \
    "dbcost variants: %s" % sorted(db["variants"])
for name, v in db["variants"].items():
    for k in ("rows_per_s", "wal_bytes_per_event", "cpu_us_per_event"):
        assert v[k]["median"] > 0, "dbcost %s: %s is %s" % (name, k, v[k])
for name in ("floor_d", "floor_a", "relay_life", "relay_life_partitioned"):
    v = db["variants"][name]
    for k in ("wal_bytes_per_event", "cpu_us_per_event"):
        assert v["with_deletes_" + k]["median"] > v[k]["median"], \
            "dbcost %s: the deletes cost nothing in %s" % (name, k)
assert "relay_life+deletes/floor_d+deletes.cpu_us_per_event" in db["ratios"]
# What history and order cost, each against the relay without them.
assert "relay_ordered/relay_history.cpu_us_per_event" in db["ratios"]
if "relay_nohistory" in want:
    assert "relay_nohistory/floor_c.wal_bytes_per_event" in db["ratios"]
    for k in ("relay_life+deletes/relay_nohistory.cpu_us_per_event",
              "relay_life_partitioned+deletes/relay_nohistory."
              "wal_bytes_per_event",
              "relay_ordered_nohistory/relay_nohistory.wal_bytes_per_event",
              "relay_life_partitioned+vacuum/relay_nohistory+vacuum."
              "cpu_us_per_event",
              "relay_life_partitioned+deletes/relay_nohistory_partitioned."
              "cpu_us_per_event"):
        assert k in db["ratios"], "no dbcost ratio %s" % k
    # The VACUUM of the dead rows: a row deleted at once leaves one.
    v = db["variants"]["relay_nohistory"]
    assert v["with_vacuum_cpu_us_per_event"]["median"] > \
        v["cpu_us_per_event"]["median"], "the VACUUM cost nothing"
else:
    assert any("not supported by this build" in l for l in table)
assert len(table) >= 20, "table has only %d rows" % len(table)
for key in ("history", "snapshot"):
    s = r["scale"][key]
    assert s["clean"]["lease_ms"]["median"] > 0 and s["lease_ratio"] > 0
print("ok: %d table rows, JSON line with %s" % (len(table) - 2, ", ".join(sorted(r))))
PY
