#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A lost lease ends the hand-over (docs/design.md §4, "Renewal and the
# local deadline"): one worker publishes a batch of 20 slowly (500 ms per
# event, the publish timeout 7 s, a renewal every 3 s) and its lease
# transaction is killed after the first delivery. The worker finds it gone
# (from the session's closing words, or at the next renewal) and stops the
# batch: no row of it is delivered after that, and only the rows delivered
# before are charged for the lost lease (the others were never handed over,
# leave the claim and owe nothing). Then everything is delivered.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
it_table renewlost
total=20
it_psql "SELECT ${OUTBOX_TABLE%.*}.outbox_events_enqueue_json('renew.step',
	jsonb_build_object('n', n)) FROM generate_series(1, $total) n" >/dev/null

log="$it_dir/deliveries.jsonl"
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
	OUTBOX_HTTP_ADDR= OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" \
	RELAY_TEST_FLAKY_DELAY_MS=500 OUTBOX_LOG_FORMAT=json \
	OUTBOX_WORKERS=1 OUTBOX_WORKER_WINDOW=1 OUTBOX_BATCH_SIZE=$total \
	OUTBOX_LEASE_TIMEOUT=9s OUTBOX_PUBLISH_TIMEOUT=7s OUTBOX_STATEMENT_TIMEOUT=1s \
	OUTBOX_SWEEP_INTERVAL=8s OUTBOX_POLL_INTERVAL=100ms \
	OUTBOX_BACKOFF_BASE=100ms OUTBOX_BACKOFF_MAX=400ms \
	"$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/relay.log" &
pid=$!
it_pids+=("$pid")

it_wait_lines 30 "$log" 1
# The lease transaction: the session holding the table's row-share lock.
killed=$(it_psql "SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l
	WHERE l.relation = '$OUTBOX_TABLE'::regclass AND l.mode = 'RowShareLock'
	AND l.granted AND l.pid <> pg_backend_pid()")
[ "$killed" = 1 ] || it_fail "$killed lease sessions found to kill, want 1"

# Deliveries when the renewal failed, and when the batch was concluded.
lines() { wc -l <"$log"; }
at_failure='' at_lost=''
deadline=$((SECONDS + 20))
while [ -z "$at_lost" ]; do
	[ "$SECONDS" -lt "$deadline" ] || it_fail "the batch was not concluded within 20 s"
	# The log first, then the deliveries: a row handed over just before
	# the loss was logged is in the file by then, where a count read
	# before the log could miss it. Nothing is handed over once the loss
	# is noticed, which is what at_lost checks.
	if [ -z "$at_failure" ] &&
		grep -q 'lease renewal failed\|lease lost while publishing' "$it_dir/relay.log"; then
		at_failure=$(lines)
	fi
	if grep -q 'lost leases' "$it_dir/relay.log"; then
		at_lost=$(lines)
	fi
	sleep 0.05
done
[ -n "$at_failure" ] || it_fail "the lost lease went unnoticed: $(cat "$it_dir/relay.log")"
[ "$at_lost" -le "$at_failure" ] ||
	it_fail "$((at_lost - at_failure)) rows handed over after the lease was found lost"
[ "$at_failure" -lt "$total" ] || it_fail "the whole batch went out before the loss was noticed"

it_wait_count 60 "status = 'sent'" -eq "$total"
it_stop "$pid"
# Rows delivered by the lost lease owe its attempt, then the one that
# sent them: 2. The rest owe only the sending one.
charged=$(it_count "attempts = 2")
[ "$charged" = "$at_failure" ] ||
	it_fail "$charged rows charged for the lost lease, want the $at_failure it handed over"
once=$(it_count "attempts = 1")
[ "$once" = $((total - at_failure)) ] ||
	it_fail "$once rows charged once, want $((total - at_failure))"
echo "ok: $at_failure rows out before the lost lease was noticed, none after; only they were charged for it"
