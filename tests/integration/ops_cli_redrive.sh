#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `outbox-relay redrive`: a dry run changes nothing; a redrive returns
# failed rows to pending with attempts reset, by type and by id; sent rows
# are replayed by time range only; bad arguments exit 2 with a usage line.
# Also `check` with a wrong password, and usage errors of pause/resume.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table opsredrive

it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, last_error, finished_at)
  SELECT 'order.created', '{}', 'failed', 10, 'nacked', now() - interval '5 minutes'
  FROM generate_series(1, 3)"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, last_error, finished_at)
  SELECT 'user.deleted', '{}', 'failed', 4, 'too large', now() - interval '5 minutes'
  FROM generate_series(1, 2)"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, finished_at)
  SELECT 'old.sent', '{}', 'sent', 1, now() - interval '3 hours' FROM generate_series(1, 4)"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, finished_at)
  SELECT 'new.sent', '{}', 'sent', 2, now() - interval '30 minutes' FROM generate_series(1, 3)"
snapshot() {
	it_psql "SELECT string_agg(id || status || attempts || coalesce(finished_at::text, '-'), ',' ORDER BY id) FROM $OUTBOX_TABLE"
}
before=$(snapshot)

ops_cli redrive --type order.created --dry-run
[ "$ops_rc" = 0 ] || it_fail "dry run exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^dry run: 3 failed rows match' "$it_dir/cli.out" || it_fail "dry run said: $(cat "$it_dir/cli.out")"
[ "$(snapshot)" = "$before" ] || it_fail "the dry run changed rows"

ops_cli redrive --type order.created
[ "$ops_rc" = 0 ] || it_fail "redrive exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^redrove 3 failed rows' "$it_dir/cli.out" || it_fail "redrive said: $(cat "$it_dir/cli.out")"
[ "$(it_count "type = 'order.created' AND status = 'pending' AND attempts = 0 AND finished_at IS NULL AND next_attempt_at <= now()")" = 3 ] ||
	it_fail "order.created rows not back to pending with attempts reset"
[ "$(it_count "type = 'user.deleted' AND status = 'failed' AND attempts = 4")" = 2 ] ||
	it_fail "user.deleted rows were touched"

# A failed row's range ends when the command began too: a row that
# fails again while a redrive runs (finished after its start, an hour on
# here) is not taken by a later batch of the same run.
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, finished_at)
  VALUES ('fails.again', '{}', 'failed', 3, now() + interval '1 hour')"
ops_cli redrive --type fails.again --dry-run
grep -q '^dry run: 0 failed rows match' "$it_dir/cli.out" || it_fail "a failed-row redrive took a row finished after it began: $(cat "$it_dir/cli.out")"
it_psql "DELETE FROM $OUTBOX_TABLE WHERE type = 'fails.again'"

# By id (repeatable); an id of a row in another state is not touched.
ids=$(it_psql "SELECT string_agg(id::text, ' ') FROM (SELECT id FROM $OUTBOX_TABLE WHERE type = 'user.deleted' LIMIT 1) x")
sent_id=$(it_psql "SELECT id FROM $OUTBOX_TABLE WHERE type = 'new.sent' LIMIT 1")
ops_cli redrive --id "$ids" --id "$sent_id"
[ "$ops_rc" = 0 ] || it_fail "redrive --id exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^redrove 1 failed row:' "$it_dir/cli.out" || it_fail "redrive --id said: $(cat "$it_dir/cli.out")"
[ "$(it_count "id = '$ids' AND status = 'pending' AND attempts = 0")" = 1 ] || it_fail "row $ids not redriven"
[ "$(it_count "id = '$sent_id' AND status = 'sent'")" = 1 ] || it_fail "a sent row was redriven as failed"
# Each id that is not a failed row is named with what it is: the count
# alone left the operator to guess.
grep -q "\"msg\":\"an id given is not a row of the status asked for\".*\"id\":\"$sent_id\",\"status\":\"sent\"" "$it_dir/cli.err" ||
	it_fail "the sent row's id was not named: $(cat "$it_dir/cli.err")"
ops_cli redrive --id 01890000-0000-7000-8000-000000000000
grep -q '"msg":"an id given is not in the table' "$it_dir/cli.err" ||
	it_fail "an id of no row was not named: $(cat "$it_dir/cli.err")"
grep -q '^redrove 0 failed rows' "$it_dir/cli.out" || it_fail "redrive of an unknown id said: $(cat "$it_dir/cli.out")"

# Replay of sent rows by time range: the last hour holds the 3 new ones.
ops_cli redrive --status sent --since 1h --dry-run
grep -q 'before the sent rows kept' "$it_dir/cli.err" && it_fail "a range within the retention was warned of"
grep -q '^dry run: 3 sent rows match' "$it_dir/cli.out" || it_fail "sent dry run said: $(cat "$it_dir/cli.out")"
[ "$(it_count "status = 'sent'")" = 7 ] || it_fail "the dry run replayed rows"
ops_cli redrive --status sent --since 1h
[ "$ops_rc" = 0 ] || it_fail "replay exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^replayed 3 sent rows' "$it_dir/cli.out" || it_fail "replay said: $(cat "$it_dir/cli.out")"
[ "$(it_count "type = 'new.sent' AND status = 'pending' AND attempts = 0")" = 3 ] || it_fail "new.sent not replayed"
# Without --until the range ended when the command began, and the report
# says so: sent again since (as a relay would), the replayed rows are not
# in a second run over the same range.
until=$(sed -nE 's/^replayed 3 sent rows, finished from .* until (.*): pending.*/\1/p' "$it_dir/cli.out")
[ -n "$until" ] || it_fail "the replay names no end of its range: $(cat "$it_dir/cli.out")"
it_psql "UPDATE $OUTBOX_TABLE SET status = 'sent', finished_at = now() + interval '1 second' WHERE type = 'new.sent'"
ops_cli redrive --status sent --since 1h --until "$until" --dry-run
grep -q '^dry run: 0 sent rows match' "$it_dir/cli.out" || it_fail "the range again took the replayed rows: $(cat "$it_dir/cli.out")"
# And a run without --until ends its range at its own start: rows
# finished after it (an hour on here) are not in it.
it_psql "UPDATE $OUTBOX_TABLE SET finished_at = now() + interval '1 hour' WHERE type = 'new.sent'"
ops_cli redrive --status sent --since 1h --dry-run
grep -q '^dry run: 0 sent rows match' "$it_dir/cli.out" || it_fail "a range without --until took rows finished after it began: $(cat "$it_dir/cli.out")"
it_psql "UPDATE $OUTBOX_TABLE SET status = 'pending', finished_at = NULL, attempts = 0 WHERE type = 'new.sent'"
[ "$(it_count "type = 'old.sent' AND status = 'sent'")" = 4 ] || it_fail "old.sent replayed outside the range"
# An explicit range around the old ones.
since=$(it_psql "SELECT now() - interval '4 hours'")
until=$(it_psql "SELECT now() - interval '2 hours'")
ops_cli redrive --status sent --since "$since" --until "$until"
[ "$ops_rc" = 0 ] || it_fail "ranged replay exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^replayed 4 sent rows' "$it_dir/cli.out" || it_fail "ranged replay said: $(cat "$it_dir/cli.out")"
[ "$(it_count "status = 'sent'")" = 0 ] || it_fail "sent rows left after the ranged replay"

# Usage errors: exit 2, a usage line on stderr, nothing done.
before=$(snapshot)
ops_expect_usage_error redrive
ops_expect_usage_error redrive --dry-run
ops_expect_usage_error redrive --status sent --type order.created
ops_expect_usage_error redrive --status bogus --type order.created
ops_expect_usage_error redrive --id not-a-uuid
# A replay from before the sent rows kept (OUTBOX_RETENTION, 24 h by
# default) says that what was sent before then may be gone.
ops_cli redrive --status sent --since 2d --dry-run
grep -q '"msg":"the range starts before the sent rows kept' "$it_dir/cli.err" ||
	it_fail "a replay from before the retention was not warned of: $(cat "$it_dir/cli.err")"
ops_expect_usage_error redrive --type user.deleted --since "not a time"
# Infinite times bound no range: a usage error, not Postgres' own.
ops_expect_usage_error redrive --type user.deleted --since -infinity
grep -q "not a finite time" "$it_dir/cli.err" || it_fail "--since -infinity: $(cat "$it_dir/cli.err")"
ops_expect_usage_error redrive --type user.deleted --since 1h --until infinity
ops_expect_usage_error redrive --type user.deleted --until 1h
# A range that holds nothing (an hour ago until two hours ago).
ops_expect_usage_error redrive --type user.deleted --since 1h --until 2h
ops_expect_usage_error redrive --type
ops_expect_usage_error redrive --bogus
ops_expect_usage_error redrive --type user.deleted extra
ops_expect_usage_error pause --bogus
ops_expect_usage_error pause --destination
ops_expect_usage_error resume --reason x
ops_expect_usage_error resume extra
[ "$(snapshot)" = "$before" ] || it_fail "a rejected command changed rows"
ops_cli redrive --help
[ "$ops_rc" = 0 ] && grep -q '^usage: outbox-relay redrive' "$it_dir/cli.out" ||
	it_fail "redrive --help: $ops_rc $(cat "$it_dir/cli.out")"

# Ordered mode: k1 failed, k2 its key's head, k3 behind it. While k2 is
# held (a session holding its row lock, as a lease transaction does) the
# redrive is refused, also with --force, and changes nothing; once k2 is
# free the redrive demotes it, so k1 goes first again.
it_psql "INSERT INTO $OUTBOX_TABLE (type, subject, partition_key, payload, status, attempts, last_error, finished_at)
  VALUES ('key.failed', 'k1', 'K', '{}', 'failed', 10, 'nacked', now())"
it_psql "INSERT INTO $OUTBOX_TABLE (type, subject, partition_key, payload, head)
  VALUES ('key.later', 'k2', 'K', '{}', true), ('key.later', 'k3', 'K', '{}', false)"
PGAPPNAME=redrive-holder psql "$RELAY_TEST_DATABASE_URL" -X -q -c "BEGIN;
  SELECT 1 FROM $OUTBOX_TABLE WHERE subject = 'k2' FOR UPDATE; SELECT pg_sleep(30)" >/dev/null 2>&1 &
holder=$!
for _ in $(seq 100); do
	[ "$(it_psql "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'redrive-holder' AND wait_event = 'PgSleep'")" = 1 ] && break
	sleep 0.1
done
before=$(snapshot)
export OUTBOX_ORDERING=partition
for force in "" --force; do
	ops_cli redrive --type key.failed $force
	[ "$ops_rc" = 1 ] || it_fail "redrive $force with a later row held exited $ops_rc: $(cat "$it_dir/cli.out")"
	grep -q 'held by a lease' "$it_dir/cli.err" || it_fail "redrive $force said: $(cat "$it_dir/cli.err")"
done
[ "$(snapshot)" = "$before" ] || it_fail "a refused redrive changed rows"
it_psql "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'redrive-holder'" >/dev/null
wait "$holder" || true
ops_cli redrive --type key.failed
[ "$ops_rc" = 0 ] || it_fail "redrive with the later row free exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^redrove 1 failed row' "$it_dir/cli.out" || it_fail "redrive said: $(cat "$it_dir/cli.out")"
unset OUTBOX_ORDERING
[ "$(it_psql "SELECT string_agg(subject || '=' || status || '/' || coalesce(head::text, 'null'), ',' ORDER BY seq)
  FROM $OUTBOX_TABLE WHERE partition_key = 'K'")" = "k1=pending/null,k2=pending/false,k3=pending/false" ] ||
	it_fail "key K after the redrive: $(it_psql "SELECT string_agg(subject || '=' || status || '/' || coalesce(head::text, 'null'), ',' ORDER BY seq) FROM $OUTBOX_TABLE WHERE partition_key = 'K'")"

# check: a wrong password is a failed Postgres connection, exit 1, and
# the password is printed nowhere.
bad_url=$(printf '%s' "$RELAY_TEST_DATABASE_URL" | sed 's#://\([^:]*\):[^@]*@#://\1:wrong-Secret-42@#')
[ "$bad_url" != "$RELAY_TEST_DATABASE_URL" ] || it_fail "could not build a URL with a wrong password"
rc=0
env OUTBOX_DATABASE_URL="$bad_url" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_PUBLISHER=stdout \
	"$RELAY_TEST_BIN" check >"$it_dir/check.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || it_fail "check with a wrong password exited $rc: $(cat "$it_dir/check.out")"
grep -q '^postgres .*FAILED.*password authentication failed' "$it_dir/check.out" ||
	it_fail "check did not report the failed connection: $(cat "$it_dir/check.out")"
grep -q '^publisher stdout: ok' "$it_dir/check.out" || it_fail "check skipped the publisher"
if grep -q 'wrong-Secret-42' "$it_dir/check.out"; then
	it_fail "check printed the password: $(cat "$it_dir/check.out")"
fi
ops_cli check --bogus
[ "$ops_rc" = 2 ] || it_fail "check --bogus exited $ops_rc"
ops_cli redrive --bogus
[ "$ops_rc" = 2 ] || it_fail "redrive --bogus exited $ops_rc"
grep -q "unknown option '--bogus'" "$it_dir/cli.err" || it_fail "redrive --bogus said: $(cat "$it_dir/cli.err")"
# A long option given a value it does not take is named as written, not
# by its one-letter twin.
ops_cli redrive --dry-run=yes
[ "$ops_rc" = 2 ] || it_fail "redrive --dry-run=yes exited $ops_rc"
grep -q "option '--dry-run' takes no value" "$it_dir/cli.err" ||
	it_fail "redrive --dry-run=yes said: $(cat "$it_dir/cli.err")"
# An empty --source is no table, not every table.
ops_cli redrive --source= --dry-run
[ "$ops_rc" = 2 ] || it_fail "redrive --source= exited $ops_rc"
grep -q -- '--source needs a table' "$it_dir/cli.err" || it_fail "redrive --source= said: $(cat "$it_dir/cli.err")"
# Options are written whole: getopt_long took "--con" for --contract (a
# one-way migration step) and "--f" for --force. A single-value option
# given twice is refused, where the last one won (--type a --type b
# redrove b alone); --id may come many times.
ops_expect_usage_error migrate --con
grep -q -- "unknown option '--con' (options are written whole: '--contract'?)" "$it_dir/cli.err" ||
	it_fail "migrate --con said: $(cat "$it_dir/cli.err")"
ops_expect_usage_error redrive --f --dry-run
ops_expect_usage_error redrive --type a.created --type b.created --dry-run
grep -q -- "option '--type' given twice" "$it_dir/cli.err" || it_fail "redrive --type twice said: $(cat "$it_dir/cli.err")"
ops_expect_usage_error redrive -t a.created --type=b.created --dry-run
ops_expect_usage_error unblock --key k --key j --skip
ops_expect_usage_error pause -d x --destination y
ops_cli redrive --source a --source b --dry-run
[ "$ops_rc" = 2 ] || it_fail "redrive with two --source exited $ops_rc"
grep -q -- "--source given twice" "$it_dir/cli.err" || it_fail "two --source said: $(cat "$it_dir/cli.err")"
ops_cli redrive --id 00000000-0000-7000-8000-000000000001 --id 00000000-0000-7000-8000-000000000002 --dry-run
[ "$ops_rc" = 0 ] || it_fail "redrive with two --id exited $ops_rc: $(cat "$it_dir/cli.err")"
# A value that starts with "--" is a value, not an option.
ops_cli pause --destination x --reason --con
[ "$ops_rc" = 0 ] || it_fail "pause --reason --con exited $ops_rc: $(cat "$it_dir/cli.err")"
ops_cli resume --destination x
[ "$ops_rc" = 0 ] || it_fail "resume exited $ops_rc: $(cat "$it_dir/cli.err")"
echo ok
