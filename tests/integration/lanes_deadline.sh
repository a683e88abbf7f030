#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Three lanes of one worker, each publish taking 4 s of its 6 s timeout
# (OUTBOX_LEASE_TIMEOUT 8 s, so a lease's local deadline is 7 s after its
# last renewal): the third batch's turn comes about 8 s after its lease,
# the second's publish ends about as late. Each publish's deadline is the
# lease's as the renewals of its wait left it, so every row is confirmed
# on its first attempt; with the deadline read before the wait, the last
# rows of the second batch and all of the third were reported in doubt
# (their confirms "too late") and sent again.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
it_table lanesdeadline
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload)
         SELECT 'lanes.deadline', convert_to(g::text, 'UTF8') FROM generate_series(1, 30) g"

log="$it_dir/deliveries.jsonl"
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
	OUTBOX_HTTP_ADDR= OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" \
	RELAY_TEST_FLAKY_DELAY_MS=400 RELAY_TEST_FLAKY_DEADLINE=1 \
	OUTBOX_LOG_FORMAT=json OUTBOX_WORKERS=1 OUTBOX_WORKER_WINDOW=3 OUTBOX_BATCH_SIZE=10 \
	OUTBOX_LEASE_TIMEOUT=8s OUTBOX_STATEMENT_TIMEOUT=1s OUTBOX_PUBLISH_TIMEOUT=6s \
	OUTBOX_SWEEP_INTERVAL=5s OUTBOX_BACKOFF_BASE=100ms OUTBOX_BACKOFF_MAX=400ms \
	"$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/relay.log" &
pid=$!
it_pids+=("$pid")

it_wait_count 60 "status = 'sent'" -eq 30
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
retried=$(it_count "attempts <> 1")
[ "$retried" = 0 ] ||
	it_fail "$retried rows took more than one attempt: $(grep -c 'no confirm by the deadline' "$it_dir/relay.log") in-doubt lines in the log; $(it_psql "SELECT attempts, count(*) FROM $OUTBOX_TABLE GROUP BY 1")"
[ "$(wc -l <"$log")" = 30 ] || it_fail "$(wc -l <"$log") deliveries of 30 rows"
echo "ok: three lanes' batches, each confirmed on its first attempt"
