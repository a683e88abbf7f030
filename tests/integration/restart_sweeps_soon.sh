#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A lease that ends with its session in a PostgreSQL restart is swept once
# the relay is connected again, not at the next sweep interval
# (docs/design.md §4, "Dead leases"): the one pending row is handed over
# and delivered, and its acknowledgement is slow (3 s), while PostgreSQL
# restarts. (A row not yet handed over when the restart ends the lease's
# session is not handed over: it needs no sweep.) The lease's claim
# is dead, every lease skips its row and no other row is pending, so no
# lease of the worker settles it (a worker settles its last claim when it
# writes its next); the sweep interval is 5 minutes, yet the row is
# delivered again within 30 s of the restart.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_PG_DIR:?run through tests/run.sh}"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
it_table restartswept
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('restart.swept', '{}')"

log="$it_dir/deliveries.jsonl"
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
	OUTBOX_HTTP_ADDR= OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" \
	RELAY_TEST_FLAKY_ACK_DELAY_MS=3000 OUTBOX_LOG_FORMAT=json OUTBOX_WORKERS=1 \
	OUTBOX_LEASE_TIMEOUT=10m OUTBOX_SWEEP_INTERVAL=5m OUTBOX_POLL_INTERVAL=100ms \
	OUTBOX_BACKOFF_BASE=100ms OUTBOX_BACKOFF_MAX=400ms \
	"$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/relay.log" &
pid=$!
it_pids+=("$pid")

# Restarted once the row is delivered, its acknowledgement pending.
deadline=$((SECONDS + 20))
until [ -s "$log" ]; do
	[ "$SECONDS" -lt "$deadline" ] || it_fail "no delivery within 20 s: $(cat "$it_dir/relay.log")"
	sleep 0.05
done
bash "$RELAY_TEST_SOURCE_ROOT/tests/services/postgres.sh" restart "$RELAY_TEST_PG_DIR" >/dev/null
it_wait_count 30 "status = 'sent'" -eq 1
grep -q '"lost leases' "$it_dir/relay.log" ||
	it_fail "the lease was not lost in the restart: $(cat "$it_dir/relay.log")"
grep -q '"swept expired leases"' "$it_dir/relay.log" ||
	it_fail "the row came back without a sweep: $(cat "$it_dir/relay.log")"
[ "$(wc -l <"$log")" = 2 ] || it_fail "$(wc -l <"$log") deliveries, want 2"
# What the server said as it ended the sessions reaches the JSON log as
# JSON, not as libpq's raw stderr line.
jq -e -R 'fromjson | .msg' "$it_dir/relay.log" >/dev/null ||
	it_fail "a log line is not JSON: $(grep -v '^{' "$it_dir/relay.log")"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "exit code $it_rc"
echo "ok: the lease lost in the restart was swept and its row delivered again"
