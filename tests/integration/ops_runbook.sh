#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The operator's kit stays true: the alerting rules
# (deploy/prometheus/) pass `promtool check rules` and their unit tests
# (`promtool test rules`: each alert fires when it should and stays quiet
# otherwise); the dashboard (deploy/grafana/) is a well-formed Grafana
# dashboard; every metric the rules, their tests and the dashboard use is
# one a live relay exports on /metrics; the rules link to sections of
# docs/runbook.md that exist; and every query of sql/runbook.sql runs
# against a real outbox table (substituted the way the file says) and
# finds what it is for.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
command -v promtool >/dev/null || it_fail "promtool not found (Debian package prometheus)"
root="$RELAY_TEST_SOURCE_ROOT"
rules="$root/deploy/prometheus/outbox-relay.rules.yml"
rules_test="$root/deploy/prometheus/outbox-relay.rules.test.yml"
dashboard="$root/deploy/grafana/outbox-relay.json"
it_table opsrunbook

promtool check rules "$rules" >"$it_dir/promtool.out" 2>&1 ||
	it_fail "promtool check rules: $(cat "$it_dir/promtool.out")"
promtool test rules "$rules_test" >"$it_dir/promtool-test.out" 2>&1 ||
	it_fail "promtool test rules: $(cat "$it_dir/promtool-test.out")"
# Every alert of the rules file has unit tests that see it fire and stay
# quiet, and a row in the runbook's table of alerts.
python3 - "$rules" "$rules_test" "$root/docs/runbook.md" >"$it_dir/coverage.out" 2>&1 <<'PY' ||
import sys
import yaml
rules = yaml.safe_load(open(sys.argv[1]))
tests = yaml.safe_load(open(sys.argv[2]))
alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
fires, quiet = set(), set()
for t in tests["tests"]:
    for a in t.get("alert_rule_test", []):
        (fires if a.get("exp_alerts") else quiet).add(a["alertname"])
bad = sorted((alerts - fires) | (alerts - quiet))
for name in bad:
    print(f"alert {name} lacks a test where it fires or one where it stays quiet")
runbook = open(sys.argv[3]).read()
unlisted = sorted(a for a in alerts if f"| `{a}` |" not in runbook)
for name in unlisted:
    print(f"alert {name} has no row in docs/runbook.md's table of alerts")
if len(alerts) < 8:
    print(f"only {len(alerts)} alerts in the rules file")
sys.exit(1 if bad or unlisted or len(alerts) < 8 else 0)
PY
	it_fail "$(cat "$it_dir/coverage.out")"
# No runbook query asks for statuses with IN: no partial index (each of
# one status) serves it, and it reads the whole table, history included,
# where the same condition as an OR is a BitmapOr of the indexes.
! grep -n 'status IN (' "$root/sql/runbook.sql" >"$it_dir/in.out" ||
	it_fail "sql/runbook.sql reads statuses with IN: $(cat "$it_dir/in.out")"
# The runbook points at the rules file instead of holding a copy.
grep -q 'deploy/prometheus/outbox-relay.rules.yml' "$root/docs/runbook.md" ||
	it_fail "docs/runbook.md does not link the rules file"
! grep -q '^      - alert:' "$root/docs/runbook.md" ||
	it_fail "docs/runbook.md holds a copy of the rules"

# The dashboard: valid JSON in Grafana's dashboard model, importable as
# is (its data source is a variable), with the panels it promises and a
# panel for every metric an alert fires on; prints the metric names its
# queries use.
python3 - "$dashboard" "$rules" >"$it_dir/dashboard.metrics" 2>"$it_dir/dashboard.err" <<'PY' ||
import json
import re
import sys
d = json.load(open(sys.argv[1]))
problems = []
def need(cond, what):
    if not cond:
        problems.append(what)
need(d.get("title") and d.get("uid"), "no title or uid")
need(isinstance(d.get("schemaVersion"), int), "no schemaVersion")
need(d.get("id") is None, "an id ties the dashboard to one Grafana")
variables = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
need(variables.get("datasource", {}).get("type") == "datasource", "no data source variable")
need("instance" in variables, "no replica (instance) variable")
panels = d.get("panels", [])
need(len(panels) >= 8, "fewer than 8 panels")
ids = [p.get("id") for p in panels]
need(len(ids) == len(set(ids)) and None not in ids, "panel ids missing or repeated")
exprs = []
for p in panels:
    g = p.get("gridPos", {})
    need(all(isinstance(g.get(k), int) for k in "xywh") and g["x"] + g["w"] <= 24,
         f"panel {p.get('title')}: bad gridPos")
    need(p.get("type") and p.get("title"), f"panel {p.get('id')}: no type or title")
    if p.get("type") == "row":
        continue
    need(p.get("datasource", {}).get("uid") == "${datasource}", f"panel {p['title']}: fixed data source")
    targets = p.get("targets", [])
    need(targets, f"panel {p['title']}: no queries")
    for t in targets:
        need(t.get("expr") and t.get("refId"), f"panel {p['title']}: query without expr or refId")
        exprs.append(t.get("expr", ""))
text = "\n".join(exprs)
for want in ["outbox_backlog_events", "outbox_oldest_pending_age_seconds",
             "outbox_events_total", "outbox_publish_duration_seconds_bucket",
             "outbox_lease_duration_seconds_bucket", "outbox_lost_leases_total",
             "outbox_destinations_paused", "outbox_blocked_keys",
             "outbox_xmin_horizon_age_seconds", "outbox_xmin_horizon_holder_info",
             "outbox_xmin_age_transactions", "outbox_table_dead_tuples",
             "outbox_lease_dead_index_entries_per_scan", "outbox_source_dead_tuples"]:
    need(want in text, f"no panel shows {want}")
alerted = set()
for line in open(sys.argv[2]):
    if line.strip().startswith("expr:"):
        alerted |= set(re.findall(r"outbox_[a-z_]+", line))
need(alerted, "no alert expression in the rules file")
for m in sorted(alerted):
    need(m in text, f"an alert fires on {m}, but no panel shows it")
need("by (outcome, class)" in text, "events are not split by outcome and class")
need("$instance" in text and "by (instance)" in text, "nothing per replica")
for p in problems:
    print(p, file=sys.stderr)
print("\n".join(sorted(set(re.findall(r"outbox_[a-z_]+", text)))))
sys.exit(1 if problems else 0)
PY
	it_fail "dashboard: $(cat "$it_dir/dashboard.err")"

# Every metric the rules, their tests and the dashboard use is one the
# relay exports.
ops_relay relay
# After the ops thread's first gauge read, which the per-source dead
# tuples wait for (a source not read yet has no series).
gauges_read() {
	curl -s -m 5 "http://127.0.0.1:$ops_port/metrics" >"$it_dir/metrics.txt" &&
		grep -q '^outbox_source_dead_tuples{' "$it_dir/metrics.txt"
}
it_wait 20 "the first gauge read on /metrics" gauges_read
grep -q '^outbox_' "$it_dir/metrics.txt" || it_fail "/metrics answered nothing"
for m in $(grep -oh 'outbox_[a-z_]*' "$rules" "$rules_test" | sort -u) \
	$(cat "$it_dir/dashboard.metrics"); do
	grep -q "^$m[ {]" "$it_dir/metrics.txt" ||
		it_fail "$m is used by the rules or the dashboard, but /metrics does not export it"
done
# A session holding a snapshot is named on /metrics as the holder of the
# xmin horizon once it has held it 10 s (the gauges refresh every 5 s;
# the hold is kept short, since it delays other tests' CREATE INDEX
# CONCURRENTLY).
ops_session_open "runbook-horizon-$$"
ops_session_send "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;"
holder_named() {
	curl -s -m 5 "http://127.0.0.1:$ops_port/metrics" >"$it_dir/metrics-horizon.txt"
	grep -q "^outbox_xmin_horizon_holder_info{kind=\"session\",name=\"runbook-horizon-$$\",pid=\"[0-9]*\"} 1\$" \
		"$it_dir/metrics-horizon.txt" &&
		awk '$1 == "outbox_xmin_horizon_age_seconds" { exit !($2 >= 10) }' "$it_dir/metrics-horizon.txt"
}
it_wait 40 "/metrics naming the snapshot's holder, held 10 s or more" holder_named
ops_session_send "ROLLBACK;"
# Every runbook link points at a heading of docs/runbook.md.
for link in $(grep -o 'runbook.md#[a-z-]*' "$rules" | sort -u); do
	anchor=${link#runbook.md#}
	grep '^### ' "$root/docs/runbook.md" | sed 's/^### //' |
		tr 'A-Z ' 'a-z-' | grep -qx "$anchor" ||
		it_fail "rules link to #$anchor, which is no heading of docs/runbook.md"
done

# Rows for the queries to find: a holder that is this relay, failures,
# an expired lease, a blocked key, a pause.
ops_cli pause --reason "runbook test"
[ "$ops_rc" = 0 ] || it_fail "pause exited $ops_rc"
pid=$it_last_pid
reg=$(ops_registry)
registered() { [ "$(it_psql "SELECT count(*) FROM $reg WHERE id LIKE '%/$pid'")" = 1 ]; }
it_wait 10 "the registry row" registered
id=$(it_psql "SELECT id FROM $reg WHERE id LIKE '%/$pid'")
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, lease_id, leased_at, lease_expires_at, leased_by) VALUES
  ('runbook.held', '{}', 'in_flight', 1, gen_random_uuid(), now(), now() + interval '5 minutes', '$id/worker-0'),
  ('runbook.expired', '{}', 'in_flight', 1, gen_random_uuid(), now(), now() - interval '1 minute', 'gone-host/1/worker-0')"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, last_error, finished_at) VALUES
  ('runbook.failed', '{}', 'failed', 10, 'runbook sample error', now())"
blocking=$(it_psql "SELECT id FROM $OUTBOX_TABLE WHERE type = 'runbook.failed'")
it_psql "INSERT INTO ${OUTBOX_TABLE}_blocked_keys (partition_key, blocking_id, reason) VALUES ('runbook-key', '$blocking', 'failed')"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, created_at) VALUES ('runbook.pending', '{}', now() - interval '2 hours')"

# A session holding the sweep lock, for section 7 to name.
ops_session_open "runbook-sweeplock-$$"
ops_session_send "SELECT pg_advisory_lock(1868693506, hashtext('$OUTBOX_TABLE'));"
sweep_locked() {
	[ "$(it_psql "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'runbook-sweeplock-$$'")" = 1 ]
}
it_wait 10 "the sweep lock" sweep_locked

sed "s/outbox_events/$OUTBOX_TABLE/g" "$root/sql/runbook.sql" |
	psql "$RELAY_TEST_DATABASE_URL" -X -v ON_ERROR_STOP=1 -P pager=off >"$it_dir/runbook.out" 2>&1 ||
	it_fail "sql/runbook.sql failed: $(tail -n 20 "$it_dir/runbook.out")"
want() {
	grep -q -E -- "$1" "$it_dir/runbook.out" || it_fail "runbook output lacks /$1/"
}
want '== 7\. No sweep'
want 'runbook test'                          # section 1: the pause
want 'runbook\.pending'                      # section 2: the oldest pending row
want "$id +\| t +\| +1 "                     # section 4: holder alive, 1 row
want 'gone-host/1 +\| f +\| +1 +\| +1 '      # section 4: dead holder, expired
want 'runbook\.failed .*runbook sample error' # section 5
want 'runbook-key'                           # section 6
want "runbook-sweeplock-$$"                  # section 7: the lock holder
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "exit code $it_rc"
echo ok
