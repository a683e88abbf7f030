#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `outbox-relay status --watch`: one plain line per interval when stdout
# is not a terminal (backlog, throughput, drain rate and time to drain,
# oldest pending, in flight by holder, failures), redrawn in place on a
# terminal; Ctrl-C (SIGINT) ends it with exit 0; --json stays a one-shot
# document and cannot be combined with it; a bad interval is a usage
# error.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
command -v script >/dev/null || it_fail "script not found (Debian package util-linux)"
it_table opswatch

it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'watch.pending', '{}' FROM generate_series(1, 3000)"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, max_attempts, last_error, finished_at) VALUES
  ('watch.permanent', '{}', 'failed', 1, 10, 'too large', now()),
  ('watch.permanent', '{}', 'failed', 1, 10, 'too large', now()),
  ('watch.spent', '{}', 'failed', 10, 10, 'nacked', now()),
  ('watch.spent', '{}', 'failed', 10, 10, 'nacked', now()),
  ('watch.spent', '{}', 'failed', 10, 10, 'nacked', now())"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, attempts, next_attempt_at, last_error) VALUES
  ('watch.retry', '{}', 2, now() + interval '1 hour', 'no confirm in time')"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, lease_id, leased_at, lease_expires_at, leased_by) VALUES
  ('watch.held', '{}', 'in_flight', 1, gen_random_uuid(), now(), now() + interval '1 hour', 'watch-host/4242/worker-0')"

ops_expect_usage_error status --watch --json
ops_expect_usage_error status --watch 10ms
ops_expect_usage_error status --watch soon
ops_cli status --json
[ "$ops_rc" = 0 ] || it_fail "status --json exited $ops_rc"
jq -e '.backlog.pending == 3001' "$it_dir/cli.out" >/dev/null || it_fail "--json is no longer one document"

# Not a terminal: plain lines, one per interval.
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
	"$RELAY_TEST_BIN" status --watch 300ms >"$it_dir/watch.out" 2>"$it_dir/watch.err" &
watch_pid=$!
it_pids+=("$watch_pid")
it_wait_lines 20 "$it_dir/watch.out" 2
first=$(head -n 1 "$it_dir/watch.out")
for want in 'pending=3001 ' 'due_now=3000 ' 'retrying=1 ' 'crash_suspects=0 ' \
	'failed_total=5' 'in_flight=1 ' 'in_flight[watch-host/4242]=1 ' 'drain_per_s=? ' 'drained_in_s=- '; do
	[[ "$first" == *"$want"* ]] || it_fail "first line lacks '$want': $first"
done
[[ "$first" == *'oldest_pending_s='* && "$first" == *'sent_per_s=0.0 '* ]] ||
	it_fail "first line lacks the oldest age or throughput: $first"

# Rows failing now count in the window of the next frames, told apart:
# failed at once (attempts left) or with their attempts spent. They
# finish a little ahead of the database clock so that whichever frame
# comes next sees them.
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, max_attempts, last_error, finished_at) VALUES
  ('watch.permanent', '{}', 'failed', 1, 10, 'too large', now() + interval '3 seconds'),
  ('watch.spent', '{}', 'failed', 10, 10, 'nacked', now() + interval '3 seconds')"
failures_seen() {
	grep -q 'failed_permanent=1 failed_attempts_spent=1 .*failed_total=7' "$it_dir/watch.out"
}
it_wait 10 "a line with the new failures by class" failures_seen

# A relay drains at about 500 events/s: the watch sees throughput, a
# shrinking backlog and a time to drain.
it_relay relay OUTBOX_MAX_RATE=500 OUTBOX_BATCH_SIZE=50
relay_pid=$it_last_pid
draining() {
	awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
	       if (v["sent_per_s"] + 0 > 100 && v["drain_per_s"] + 0 > 100 && v["drained_in_s"] ~ /^[0-9]+$/) found = 1 }
	     END { exit !found }' "$it_dir/watch.out"
}
it_wait 30 "a line with throughput and a time to drain" draining
it_stop "$relay_pid"

lines=$(wc -l <"$it_dir/watch.out")
kill -INT "$watch_pid"
ops_wait_exit "$watch_pid" 10
[ "$it_rc" = 0 ] || it_fail "watch exited $it_rc after SIGINT, want 0"
[ ! -s "$it_dir/watch.err" ] || it_fail "watch wrote to stderr: $(cat "$it_dir/watch.err")"
[ "$lines" -ge 4 ] || it_fail "only $lines lines"

# A terminal: the frame is redrawn in place, with its sections.
script -q -e -c "env OUTBOX_DATABASE_URL='$RELAY_TEST_DATABASE_URL' OUTBOX_TABLE='$OUTBOX_TABLE' \
	timeout --preserve-status -s INT 5 '$RELAY_TEST_BIN' status --watch 500ms" "$it_dir/tty.out" >/dev/null ||
	it_fail "the terminal watch did not end with exit 0 on SIGINT: $(tail -c 500 "$it_dir/tty.out")"
frames=$(grep -o $'\033\\[H\033\\[2J' "$it_dir/tty.out" | wc -l)
[ "$frames" -ge 2 ] || it_fail "the terminal view was drawn $frames times, want redraws"
for want in 'BACKLOG ' 'THROUGHPUT ' 'DRAINED IN ' 'IN FLIGHT ' 'FAILURES ' 'every 500ms' \
	'retrying in backoff' 'watch-host/4242' '1 rows, 0 expired'; do
	grep -qF "$want" "$it_dir/tty.out" || it_fail "the terminal view lacks '$want'"
done
echo ok
