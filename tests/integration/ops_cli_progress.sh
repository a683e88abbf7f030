#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Progress of long commands, on a terminal only: `redrive` shows rows done
# of the total, the rate and the time left; SIGINT stops it between
# batches, keeping what is done and saying how much and, with a time
# range, the range as resolved to run again (exit 1); `migrate`
# shows an index build's phase from pg_stat_progress_create_index. Both
# are silent with --quiet or when stderr is not a terminal.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
command -v script >/dev/null || it_fail "script not found (Debian package util-linux)"
it_table opsprogress
env_cli="env OUTBOX_DATABASE_URL='$RELAY_TEST_DATABASE_URL' OUTBOX_TABLE='$OUTBOX_TABLE' OUTBOX_LOG_FORMAT=json '$RELAY_TEST_BIN'"

fail_rows() { # TYPE N
	it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, last_error, finished_at)
	         SELECT '$1', '{}', 'failed', 10, 'nacked', now() FROM generate_series(1, $2)"
}

# On a terminal: the progress line, then the usual report.
fail_rows progress.tty 5000
script -q -e -c "$env_cli redrive --type progress.tty" "$it_dir/redrive.tty" >/dev/null ||
	it_fail "redrive on a terminal failed: $(tail -c 500 "$it_dir/redrive.tty")"
grep -qF 'redrive: 5000 of 5000 rows (100%)' "$it_dir/redrive.tty" ||
	it_fail "no progress line: $(tail -c 500 "$it_dir/redrive.tty")"
grep -qE 'redrive: [0-9]+ of 5000 rows .*rows/s, about .* left' "$it_dir/redrive.tty" ||
	it_fail "no rate or time left: $(tail -c 500 "$it_dir/redrive.tty")"
grep -qF 'redrove 5000 failed rows' "$it_dir/redrive.tty" || it_fail "no report after the progress"
[ "$(it_count "type = 'progress.tty' AND status = 'pending'")" = 5000 ] || it_fail "not every row redriven"

# --quiet, and not a terminal: no progress.
fail_rows progress.quiet 3000
script -q -e -c "$env_cli redrive --type progress.quiet --quiet" "$it_dir/quiet.tty" >/dev/null ||
	it_fail "redrive --quiet failed"
! grep -q 'rows/s' "$it_dir/quiet.tty" || it_fail "--quiet showed progress"
grep -qF 'redrove 3000 failed rows' "$it_dir/quiet.tty" || it_fail "--quiet lost the report"
fail_rows progress.pipe 3000
ops_cli redrive --type progress.pipe
[ "$ops_rc" = 0 ] || it_fail "redrive exited $ops_rc"
[ ! -s "$it_dir/cli.err" ] || it_fail "progress written when stderr is not a terminal: $(cat "$it_dir/cli.err")"

# SIGINT between batches: what is done stays done, and is told.
fail_rows progress.stop 300000
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
	"$RELAY_TEST_BIN" redrive --type progress.stop --since 1h >"$it_dir/stop.out" 2>"$it_dir/stop.err" &
pid=$!
it_pids+=("$pid")
it_wait_count 60 "type = 'progress.stop' AND status = 'pending'" -gt 0
kill -INT "$pid"
ops_wait_exit "$pid" 30
[ "$it_rc" = 1 ] || it_fail "interrupted redrive exited $it_rc, want 1: $(cat "$it_dir/stop.out" "$it_dir/stop.err")"
done_rows=$(it_count "type = 'progress.stop' AND status = 'pending'")
left=$(it_count "type = 'progress.stop' AND status = 'failed'")
[ "$((done_rows + left))" = 300000 ] || it_fail "rows lost: $done_rows pending + $left failed"
[ "$left" -gt 0 ] || it_fail "the redrive finished before SIGINT: nothing was interrupted"
[ "$((done_rows % 1000))" = 0 ] || it_fail "$done_rows rows redriven: not whole batches"
grep -qF "interrupted: $done_rows failed rows redriven before the stop are pending again" "$it_dir/stop.out" ||
	it_fail "the stop does not say what was done: $(cat "$it_dir/stop.out")"
# The rest is the range as resolved (a relative --since given again would
# start later); run so, it redrives every row left.
since=$(sed -n "s/.*run it with --since '\([^']*\)' --until '[^']*' again for the rest.*/\1/p" "$it_dir/stop.out")
until=$(sed -n "s/.*run it with --since '[^']*' --until '\([^']*\)' again for the rest.*/\1/p" "$it_dir/stop.out")
[ -n "$since" ] || it_fail "the stop does not name the range to run again: $(cat "$it_dir/stop.out")"
[[ "$since" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T ]] || it_fail "the stop names --since '$since', not the instant it resolved"
[ -n "$until" ] || it_fail "the stop does not name the range's end: $(cat "$it_dir/stop.out")"
ops_cli redrive --type progress.stop --since "$since" --until "$until"
[ "$ops_rc" = 0 ] || it_fail "redrive --since $since --until $until exited $ops_rc: $(cat "$it_dir/cli.err")"
[ "$(it_count "type = 'progress.stop' AND status = 'failed'")" = 0 ] ||
	it_fail "rows left failed after running the range again"
# A --until later than the start ends the range when the command began.
fail_rows progress.until 2
ops_cli redrive --type progress.until --since 1h --until 2999-01-01
[ "$ops_rc" = 0 ] || it_fail "redrive with a later --until exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q "^redrove 2 failed rows, finished from .* until $(date -u +%Y)-" "$it_dir/cli.out" ||
	it_fail "a later --until was taken as given: $(cat "$it_dir/cli.out")"

# migrate: an index build waiting shows its phase each second, then that
# it was built. Migration 002 is undone for one index and run again while
# a transaction holds an old snapshot, which CREATE INDEX CONCURRENTLY
# waits for (shorter than migrate's 5 s lock timeout).
schema=${OUTBOX_TABLE%%.*}
undo_002() {
	it_psql "DROP INDEX $schema.outbox_events_key_idx; DELETE FROM ${OUTBOX_TABLE}_schema_version WHERE version = 2"
}
undo_002
ops_session_open "progress-snapshot-$$"
ops_session_send "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class;"
snapshot_held() {
	[ "$(it_psql "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'progress-snapshot-$$' AND state = 'idle in transaction'")" = 1 ]
}
it_wait 10 "the old snapshot" snapshot_held
script -q -e -f -c "$env_cli migrate" "$it_dir/migrate.tty" >/dev/null &
mpid=$!
it_pids+=("$mpid")
progress_line='migrate: index outbox_events_key_idx: waiting for [a-z ]+(, [0-9]+ of [0-9]+ \([0-9]+%\))?, [0-9]+s so far'
building() {
	[ "$(it_psql "SELECT count(*) FROM pg_stat_progress_create_index p JOIN pg_class c ON c.oid = p.relid WHERE c.relname = 'outbox_events' AND c.relnamespace = '$schema'::regnamespace")" = 1 ]
}
it_wait 20 "the index build" building
# The snapshot is let go once the build's wait for it was reported: a
# fixed time could end before a slow build reached that wait.
progress_shown() {
	grep -qE "$progress_line" "$it_dir/migrate.tty"
}
it_wait 30 "a progress line of the build" progress_shown
ops_session_send "COMMIT;"
ops_wait_exit "$mpid" 60
[ "$it_rc" = 0 ] || it_fail "migrate exited $it_rc: $(tail -c 800 "$it_dir/migrate.tty")"
grep -qE 'migrate: index outbox_events_key_idx: built, [0-9]+s' "$it_dir/migrate.tty" ||
	it_fail "no line for the finished build: $(tail -c 800 "$it_dir/migrate.tty")"
grep -qF '002_ordering.sql: applied' "$it_dir/migrate.tty" || it_fail "migrate's own report is gone"
# The build waited for the snapshot instead of giving up on a lock
# timeout, which leaves an invalid index behind IF NOT EXISTS.
[ "$(it_psql "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'outbox_events_key_idx' AND c.relnamespace = '$schema'::regnamespace")" = t ] ||
	it_fail "migrate left outbox_events_key_idx invalid"

# migrate --quiet on a terminal: the same build, no progress.
undo_002
ops_session_send "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class;"
sleep 0.5
script -q -e -c "$env_cli migrate --quiet" "$it_dir/migrate-quiet.tty" >/dev/null &
mpid=$!
it_pids+=("$mpid")
it_wait 20 "the index build" building
sleep 1.5
ops_session_send "COMMIT;"
ops_wait_exit "$mpid" 60
[ "$it_rc" = 0 ] || it_fail "migrate --quiet exited $it_rc"
! grep -q 'migrate: index' "$it_dir/migrate-quiet.tty" || it_fail "--quiet showed progress"
grep -qF '002_ordering.sql: applied' "$it_dir/migrate-quiet.tty" || it_fail "migrate --quiet lost its report"
echo ok
