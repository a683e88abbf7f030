#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Readiness follows Postgres: /readyz answers 503 naming Postgres while the
# server is down and 200 again once it is back, while /healthz stays 200
# (a database outage must not make Kubernetes restart every replica).
# The table's dead tuples leave /metrics meanwhile (unknown, not frozen).
# Stops the shared test server: runs alone in suite 'pgrestart'.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
: "${RELAY_TEST_PG_DIR:?run through tests/run.sh}"
pg_service="$RELAY_TEST_SOURCE_ROOT/tests/services/postgres.sh"

# Whatever happens, the server is running again for the next test.
ops_pg_cleanup() {
	bash "$pg_service" status "$RELAY_TEST_PG_DIR" >/dev/null 2>&1 ||
		bash "$pg_service" restart "$RELAY_TEST_PG_DIR" >/dev/null 2>&1 || true
	it_cleanup
}
trap ops_pg_cleanup EXIT

it_table opsready
ops_relay relay
pid=$it_last_pid
ops_wait_code 20 /readyz 200
dead_shown() {
	curl -sf -m 5 "http://127.0.0.1:$ops_port/metrics" >"$it_dir/metrics.txt" &&
		grep -q "^outbox_source_dead_tuples{source=\"$OUTBOX_TABLE\"} [0-9]" "$it_dir/metrics.txt"
}
dead_unshown() {
	curl -sf -m 5 "http://127.0.0.1:$ops_port/metrics" >"$it_dir/metrics.txt" &&
		! grep -q '^outbox_source_dead_tuples{' "$it_dir/metrics.txt"
}
it_wait 15 "the table's dead tuples on /metrics" dead_shown

# The test server runs with synchronous_commit off and stops with -m
# immediate: without a checkpoint the last commits (the migration) could
# be lost with the crash.
it_psql "CHECKPOINT"
bash "$pg_service" stop "$RELAY_TEST_PG_DIR" >/dev/null
ops_wait_code 15 /readyz 503
# Which dependency is down, not where it is or as whom: no host, port,
# database, user or libpq text (the log has those).
[ "$ops_body" = "not ready: postgres: unreachable" ] ||
	it_fail "readyz body while postgres is down: $ops_body"
grep -q '"postgres check failed: not ready".*"error":"..*"' "$it_dir/relay.log" ||
	it_fail "the log does not say why postgres is not ready"
# Liveness is about the loops, which keep ticking while they reconnect.
sleep 2
ops_get /healthz
[ "$ops_code" = 200 ] || it_fail "healthz while postgres is down: $ops_code $ops_body"
ops_get /readyz
[ "$ops_code" = 503 ] || it_fail "ready again while postgres is still down: $ops_body"
dead_unshown || it_fail "the table's dead tuples stay on /metrics while postgres is down"

bash "$pg_service" restart "$RELAY_TEST_PG_DIR" >/dev/null
ops_wait_code 30 /readyz 200
it_wait 15 "the table's dead tuples back on /metrics" dead_shown
ops_get /healthz
[ "$ops_code" = 200 ] || it_fail "healthz after the restart: $ops_code $ops_body"

# And it relays again.
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'ops.ready', '{}' FROM generate_series(1, 5)"
it_wait_count 30 "status = 'sent'" -eq 5
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "exit code $it_rc"
echo ok
