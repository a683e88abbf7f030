#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# kill -9 of the relay mid-batch, then a restart: every event is printed at
# least once, none is lost, and the swept rows come back one per batch.
. "$(dirname "$0")/lib.sh"
it_table kill9

it_psql "INSERT INTO $OUTBOX_TABLE (type, payload)
         SELECT 'kill.test', convert_to(json_build_object('pad', repeat('x', 500), 'n', g)::text, 'UTF8')
         FROM generate_series(1, 1000) g"

# The relay writes into a pipe nobody reads yet: once the pipe is full it
# blocks inside a batch, holding leased rows, and is killed there.
mkfifo "$it_dir/pipe"
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
	OUTBOX_HTTP_ADDR= OUTBOX_LEASE_TIMEOUT=2s OUTBOX_PUBLISH_TIMEOUT=500ms \
	OUTBOX_STATEMENT_TIMEOUT=1s OUTBOX_SWEEP_INTERVAL=500ms OUTBOX_BATCH_SIZE=50 \
	"$RELAY_TEST_BIN" run >"$it_dir/pipe" 2>"$it_dir/first.log" &
pid=$!
it_pids+=("$pid")
exec 3<"$it_dir/pipe"
it_wait_count 20 "$it_in_flight" -gt 0
sleep 0.5
held=$(it_count "$it_in_flight")
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
# What reached the pipe before the kill counts as printed.
timeout 5 cat <&3 >"$it_dir/first.out" || true
exec 3<&-
[ "$held" -gt 0 ] || it_fail "nothing was in flight at the kill"

it_relay second OUTBOX_LEASE_TIMEOUT=2s OUTBOX_PUBLISH_TIMEOUT=500ms \
	OUTBOX_STATEMENT_TIMEOUT=1s OUTBOX_SWEEP_INTERVAL=500ms OUTBOX_BATCH_SIZE=50
pid=$it_last_pid
it_wait_count 60 "status = 'sent'" -eq 1000
it_stop "$pid"
rc=$it_rc
[ "$rc" = 0 ] || it_fail "restarted relay exit code $rc"

# The kill may cut the last line short: only whole events count.
it_all_printed "kill -9" "$it_dir/first.out" "$it_dir/second.out"
swept=$(it_count "attempts >= 2")
[ "$swept" -gt 0 ] || it_fail "no row was swept and retried"
grep -q '"swept expired leases"' "$it_dir/second.log" || it_fail "the sweeper did not report the expired leases"
# One crash suspect per batch: every retried row went out under its own lease.
distinct=$(it_psql "SELECT count(DISTINCT lease_id) FROM $OUTBOX_TABLE WHERE attempts >= 2")
[ "$distinct" = "$swept" ] || it_fail "$swept swept rows shared $distinct leases: suspects were batched together"
echo "ok: $held rows in flight at kill -9, $swept retried one per batch, none lost"
