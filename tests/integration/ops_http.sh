#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The HTTP surface of a running relay: /healthz and /readyz, 404 and 405,
# /metrics in the Prometheus text format (checked by promtool) with
# counters that move as events flow and SQL-backed gauges, the replica
# registry, and readiness going 503 from the first moment of shutdown.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
command -v promtool >/dev/null || it_fail "promtool not found (Debian package prometheus)"
it_table opshttp

# A 20s statement timeout gives workers a 10s lock timeout: long enough to
# watch the shutdown while a worker waits on a table lock, on a loaded
# machine too (5 s was the steps below and little more).
ops_relay relay OUTBOX_STATEMENT_TIMEOUT=20s OUTBOX_SHUTDOWN_TIMEOUT=30s
pid=$it_last_pid
ops_wait_code 20 /healthz 200
[ "$ops_body" = ok ] || it_fail "healthz body: $ops_body"
ops_wait_code 20 /readyz 200
[ "$ops_body" = ready ] || it_fail "readyz body: $ops_body"
ops_get /nope
[ "$ops_code" = 404 ] || it_fail "/nope answered $ops_code"
code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$ops_port/metrics")
[ "$code" = 405 ] || it_fail "POST /metrics answered $code"
ctype=$(curl -s -m 5 -o /dev/null -w '%{content_type}' "http://127.0.0.1:$ops_port/metrics")
case "$ctype" in
"text/plain; version=0.0.4"*) ;;
*) it_fail "metrics content type: $ctype" ;;
esac

# The registry row of this replica: host/pid, version, alive.
reg=$(ops_registry)
registry_state() {
	[ "$(it_psql "SELECT state FROM $reg WHERE id LIKE '%/$pid' AND version <> ''")" = "$1" ]
}
it_wait 10 "the registry row" registry_state alive

# Counters move as events flow.
sent='outbox_events_total{outcome="sent",class="none"}'
[ "$(ops_metric "$sent")" = 0 ] || it_fail "sent counter starts at $(ops_metric "$sent")"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'ops.http', '{}' FROM generate_series(1, 30)"
it_wait_count 20 "status = 'sent'" -eq 30
ops_wait_metric 10 "$sent" 'v == 30'
ops_wait_metric 10 outbox_end_to_end_latency_seconds_count 'v == 30'

# Gauges from the ops thread's query (every 5 s): paused, 7 pending rows,
# the oldest an hour old.
ops_cli pause --reason "ops_http test"
[ "$ops_rc" = 0 ] || it_fail "pause exited $ops_rc: $(cat "$it_dir/cli.err")"
ops_wait_metric 5 outbox_paused 'v == 1'
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, created_at) VALUES ('ops.http', '{}', now() - interval '1 hour')"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'ops.http', '{}' FROM generate_series(1, 6)"
ops_wait_metric 15 outbox_backlog_events 'v == 7'
ops_wait_metric 10 outbox_oldest_pending_age_seconds 'v >= 3600 && v < 4000'
ops_wait_metric 10 outbox_live_replicas 'v == 1'
[ "$(ops_metric outbox_in_flight_events)" = 0 ] || it_fail "in flight while paused"

curl -s -m 5 "http://127.0.0.1:$ops_port/metrics" >"$it_dir/metrics.txt"
promtool check metrics <"$it_dir/metrics.txt" >"$it_dir/promtool.out" 2>&1 ||
	it_fail "promtool check metrics: $(cat "$it_dir/promtool.out")"

ops_cli resume
[ "$ops_rc" = 0 ] || it_fail "resume exited $ops_rc"
it_wait_count 20 "status = 'sent'" -eq 37
ops_wait_metric 15 outbox_backlog_events 'v == 0'
ops_wait_metric 10 outbox_oldest_pending_age_seconds 'v == 0'

# Shutdown: a worker waits on a table lock, so the process lives on after
# SIGTERM; readiness must already answer 503 and the registry say
# draining, while liveness stays 200.
ops_session_open "ops-http-locker-$$"
ops_session_send "BEGIN; LOCK TABLE $OUTBOX_TABLE IN ACCESS EXCLUSIVE MODE;"
worker_blocked() {
	[ "$(it_psql "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name LIKE 'outbox-relay/%/worker-0%' AND query LIKE '%${OUTBOX_TABLE%%.*}%'")" -ge 1 ]
}
it_wait 10 "a worker blocked on the table lock" worker_blocked
ops_get /readyz
[ "$ops_code" = 200 ] || it_fail "not ready before the signal: $ops_code $ops_body"
kill -TERM "$pid"
ops_wait_code 2 /readyz 503
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited before readiness was checked"
case "$ops_body" in
*"shutting down"*) ;;
*) it_fail "readyz body during shutdown: $ops_body" ;;
esac
ops_get /healthz
[ "$ops_code" = 200 ] || it_fail "healthz during shutdown: $ops_code $ops_body"
it_wait 10 "the registry row to say draining" registry_state draining
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited before the registry was checked"
ops_session_send "COMMIT;"
ops_wait_exit "$pid" 20
[ "$it_rc" = 0 ] || it_fail "exit code $it_rc"
# A clean stop leaves the registry.
[ "$(it_psql "SELECT count(*) FROM $reg WHERE id LIKE '%/$pid'")" = 0 ] ||
	it_fail "registry row left behind after a clean stop"
echo ok
