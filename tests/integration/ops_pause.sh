#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `outbox-relay pause` / `resume` with two running replicas: a global pause
# stops all leasing within a poll interval and resume restarts it; a
# destination pause holds back only that destination's rows, and holds
# while the pauses cannot be read.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table opspause

# A lock wait of 1 s (half the statement timeout) for the reads of the
# pauses below.
it_relay a OUTBOX_STATEMENT_TIMEOUT=2s
pid_a=$it_last_pid
it_relay b OUTBOX_STATEMENT_TIMEOUT=2s
pid_b=$it_last_pid
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'ops.pause', '{}' FROM generate_series(1, 10)"
it_wait_count 20 "status = 'sent'" -eq 10

ops_cli pause --reason "maintenance"
[ "$ops_rc" = 0 ] || it_fail "pause exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^paused all leasing' "$it_dir/cli.out" || it_fail "pause said: $(cat "$it_dir/cli.out")"
# Poll interval 200 ms: every worker reads the pauses at each turn 200 ms
# after its last read, and a turn leases right after its read; 1 s leaves
# room for a turn slowed by a loaded machine.
sleep 1
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'ops.pause', '{}' FROM generate_series(1, 20)"
sleep 2
[ "$(it_count "status = 'pending'")" = 20 ] ||
	it_fail "rows leased while paused: $(it_psql "SELECT status, count(*) FROM $OUTBOX_TABLE GROUP BY 1")"
ops_cli pause
grep -q 'already paused' "$it_dir/cli.out" || it_fail "second pause said: $(cat "$it_dir/cli.out")"

ops_cli resume
[ "$ops_rc" = 0 ] || it_fail "resume exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^resumed all leasing' "$it_dir/cli.out" || it_fail "resume said: $(cat "$it_dir/cli.out")"
it_wait_count 10 "status = 'sent'" -eq 30
ops_cli resume
grep -q '^nothing to resume' "$it_dir/cli.out" || it_fail "second resume said: $(cat "$it_dir/cli.out")"

# One destination: rows for 'held' wait, rows for 'open' go on.
ops_cli pause --destination held --reason "consumer down"
[ "$ops_rc" = 0 ] || it_fail "pause --destination exited $ops_rc: $(cat "$it_dir/cli.err")"
sleep 1
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, exchange)
  SELECT 'ops.pause', '{}', CASE WHEN g % 2 = 0 THEN 'held' ELSE 'open' END
  FROM generate_series(1, 10) g"
it_wait_count 10 "exchange = 'open' AND status = 'sent'" -eq 5
sleep 1
[ "$(it_count "exchange = 'held' AND status = 'pending'")" = 5 ] ||
	it_fail "rows of the paused destination were leased"
ops_cli status --json
jq -e '.paused | length == 1 and .[0].destination == "held" and .[0].reason == "consumer down"' \
	"$it_dir/cli.out" >/dev/null || it_fail "status shows pauses: $(jq -c .paused "$it_dir/cli.out")"
ops_cli resume --destination held
grep -q "^resumed destination 'held'" "$it_dir/cli.out" || it_fail "resume said: $(cat "$it_dir/cli.out")"
it_wait_count 10 "status = 'sent'" -eq 40

# Pauses that cannot be read are not lifted: with the control table
# locked, each worker's read of the pauses gives up after its lock wait
# and the turn leases nothing (an earlier version leased as if nothing
# were paused); read again, the pause holds as before.
ops_cli pause --destination held --reason "consumer down"
[ "$ops_rc" = 0 ] || it_fail "pause --destination exited $ops_rc: $(cat "$it_dir/cli.err")"
sleep 1
psql "$RELAY_TEST_DATABASE_URL" -q -c "BEGIN; LOCK TABLE ${OUTBOX_TABLE}_control
  IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(3.5); COMMIT" >/dev/null 2>&1 &
locker=$!
sleep 0.3
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, exchange)
  SELECT 'ops.pause', '{}', 'held' FROM generate_series(1, 5)"
wait "$locker" || it_fail "the lock on the control table was not held"
sleep 1
grep -q 'reading operator pauses failed' "$it_dir/a.log" "$it_dir/b.log" ||
	it_fail "no read of the pauses failed under the lock"
[ "$(it_count "exchange = 'held' AND status = 'pending'")" = 5 ] ||
	it_fail "rows of the paused destination were leased while the pauses could not be read: $(it_psql "SELECT status, count(*) FROM $OUTBOX_TABLE WHERE exchange = 'held' GROUP BY 1")"
ops_cli resume --destination held
it_wait_count 10 "status = 'sent'" -eq 45

it_stop "$pid_a"
[ "$it_rc" = 0 ] || it_fail "a exited $it_rc"
it_stop "$pid_b"
[ "$it_rc" = 0 ] || it_fail "b exited $it_rc"
echo ok
