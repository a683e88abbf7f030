#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Bad input gets a clear error and loses nothing (docs/design.md §10):
# rows that cannot be encoded, in a table created without the CHECKs, end
# failed with a reason while the rest of their batch is sent; bad settings
# exit 2 naming the variable; a missing table names itself and the fix; a
# password in the URL never appears in any output.
. "$(dirname "$0")/lib.sh"
it_table badinput

# Some teams create the table themselves, without the CHECKs.
it_psql "DO \$\$ DECLARE c record; BEGIN
  FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = '$OUTBOX_TABLE'::regclass AND contype = 'c' LOOP
    EXECUTE format('ALTER TABLE $OUTBOX_TABLE DROP CONSTRAINT %I', c.conname);
  END LOOP; END \$\$"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, headers) VALUES
  ('good.one', '{}', '{\"traceparent\": \"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\"}'),
  ('bad.array', '{}', '[1, 2]'),
  ('bad.number', '{}', '{\"retries\": 3}'),
  ('bad.collide', '{}', '{\"ce-id\": \"spoofed\"}'),
  ('bad.ctype', '{}', '{\"Content-Type\": \"text/plain\"}'),
  ('', '{}', '{}'),
  ('good.two', '{}', '{\"x-tenant\": \"t1\"}')"
# A source that is not a URI-reference, and destinations holding control
# characters: refused by the encoder when the table has no CHECKs.
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, source, exchange, routing_key) VALUES
  ('bad.source', '{}', 'not a uri with spaces', NULL, ''),
  ('bad.exchange', '{}', NULL, 'orders' || chr(10) || 'forged', ''),
  ('bad.routing', '{}', NULL, NULL, 'rk' || chr(27) || '[2K')"

it_relay relay
pid=$it_last_pid
it_wait_count 20 "status IN ('sent', 'failed')" -eq 10
it_stop "$pid"
rc=$it_rc
[ "$rc" = 0 ] || it_fail "exit code $rc"
[ "$(it_count "status = 'sent' AND type LIKE 'good.%'")" = 2 ] || it_fail "good rows not sent"
[ "$(it_count "status = 'failed' AND last_error IS NOT NULL AND finished_at IS NOT NULL")" = 8 ] ||
	it_fail "bad rows not failed with a reason"
for t in bad.array bad.number bad.collide bad.ctype; do
	reason=$(it_psql "SELECT last_error FROM $OUTBOX_TABLE WHERE type = '$t'")
	[ -n "$reason" ] || it_fail "$t has no reason"
done
it_psql "SELECT last_error FROM $OUTBOX_TABLE WHERE type = 'bad.collide'" | grep -q 'ce-id' ||
	it_fail "collision reason does not name the header"
it_psql "SELECT last_error FROM $OUTBOX_TABLE WHERE type = ''" | grep -qi 'type' ||
	it_fail "empty type reason does not say type"
[ "$(it_psql "SELECT last_error FROM $OUTBOX_TABLE WHERE type = 'bad.source'")" = \
	"source is not a URI-reference (RFC 3986): a space in the path" ] ||
	it_fail "bad source reason: $(it_psql "SELECT last_error FROM $OUTBOX_TABLE WHERE type = 'bad.source'")"
[ "$(it_psql "SELECT last_error FROM $OUTBOX_TABLE WHERE type = 'bad.exchange'")" = \
	"exchange contains a control character" ] || it_fail "bad exchange reason"
[ "$(it_psql "SELECT last_error FROM $OUTBOX_TABLE WHERE type = 'bad.routing'")" = \
	"routing_key contains a control character" ] || it_fail "bad routing key reason"
[ "$(wc -l <"$it_dir/relay.out")" = 2 ] || it_fail "expected exactly the 2 good events printed"

# Bad settings: exit 2, a line naming the variable.
bad_settings=(
	OUTBOX_BATCH_SIZE=0 OUTBOX_BATCH_SIZE=lots OUTBOX_WORKERS=0 OUTBOX_POLL_INTERVAL=5
	OUTBOX_LEASE_TIMEOUT=-1s OUTBOX_PUBLISHER=nats OUTBOX_CE_MODE=xml OUTBOX_ORDERING=total
	OUTBOX_TABLE=bad-name OUTBOX_LOG_LEVEL=loud OUTBOX_HTTP_ADDR=nohost OUTBOX_PG_PREPARE=maybe
	OUTBOX_UNROUTABLE=drop OUTBOX_MAX_RATE=-5 OUTBOX_RETENTION=forever OUTBOX_LOG_FORMAT=xml
	OUTBOX_SHUTDOWN_TIMEOUT=1y OUTBOX_ORDERING_ON_FAILURE=ignore OUTBOX_CE_SOURCE=
	"OUTBOX_CE_SOURCE=not a uri" "OUTBOX_CE_SOURCE=http://h:port/"
	OUTBOX_PUBLISH_TIMEOUT=1m OUTBOX_SWEEP_INTERVAL=2m OUTBOX_KAFKA_ENABLE_IDEMPOTENCE=false
)
for setting in "${bad_settings[@]}"; do
	var=${setting%%=*}
	rc=0
	env "$setting" OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "$RELAY_TEST_BIN" run \
		>"$it_dir/bad.out" 2>"$it_dir/bad.err" || rc=$?
	[ "$rc" = 2 ] || it_fail "$setting: exit $rc, want 2"
	grep -q "$var" "$it_dir/bad.err" || it_fail "$setting: error does not name $var: $(cat "$it_dir/bad.err")"
done
# The cross-checks say why.
env OUTBOX_PUBLISH_TIMEOUT=1m "$RELAY_TEST_BIN" run >"$it_dir/cross.out" 2>&1 || true
grep -q "OUTBOX_LEASE_TIMEOUT" "$it_dir/cross.out" ||
	it_fail "publish timeout cross-check does not name the lease timeout"
# A command's help needs no setting right: it printed the configuration
# problems and exited 2 instead.
for cmd in redrive migrate status unblock; do
	rc=0
	env OUTBOX_BATCH_SIZE=0 "$RELAY_TEST_BIN" "$cmd" --help >"$it_dir/help.out" 2>&1 || rc=$?
	[ "$rc" = 0 ] || it_fail "$cmd --help with a bad setting exited $rc: $(cat "$it_dir/help.out")"
	grep -q "^usage: outbox-relay $cmd" "$it_dir/help.out" || it_fail "$cmd --help printed: $(cat "$it_dir/help.out")"
done
# A later --help may be a value: still read with the settings.
rc=0
env OUTBOX_BATCH_SIZE=0 "$RELAY_TEST_BIN" pause --reason --help >"$it_dir/help.out" 2>&1 || rc=$?
[ "$rc" = 2 ] || it_fail "pause --reason --help with a bad setting exited $rc: $(cat "$it_dir/help.out")"

# A missing table: named, with the command that creates it.
rc=0
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE=nosuch_$$.outbox_events OUTBOX_HTTP_ADDR= \
	"$RELAY_TEST_BIN" run >"$it_dir/missing.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || it_fail "missing table: exit $rc, want 1"
grep -q "nosuch_$$.outbox_events" "$it_dir/missing.out" || it_fail "missing table not named"
grep -q "outbox-relay migrate" "$it_dir/missing.out" || it_fail "missing table: no hint to migrate"

# A password never appears: wrong password at run time and in check.
secret="Zq9-not-the-password-7Hx"
wrong=$(printf '%s' "$RELAY_TEST_DATABASE_URL" | sed -E "s#(://[^:]+:)[^@]*@#\1$secret@#")
it_relay wrongpw OUTBOX_DATABASE_URL="$wrong"
pid=$it_last_pid
sleep 3
kill -0 "$pid" || it_fail "the relay gave up instead of retrying the connection"
it_stop "$pid"
grep -q "password authentication failed" "$it_dir/wrongpw.log" || it_fail "no clear error for the wrong password"
rc=0
env OUTBOX_DATABASE_URL="$wrong" OUTBOX_TABLE="$OUTBOX_TABLE" "$RELAY_TEST_BIN" check >"$it_dir/check.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || it_fail "check with a wrong password: exit $rc, want 1"
rc=0
env OUTBOX_DATABASE_URL="postgresql://u:$secret@127.0.0.1:1/x?no_such_option=1" \
	timeout 10 "$RELAY_TEST_BIN" run >"$it_dir/cfg.out" 2>&1 || rc=$?
[ "$rc" = 2 ] || it_fail "a malformed database URL: exit $rc, want 2"
grep -q OUTBOX_DATABASE_URL "$it_dir/cfg.out" || it_fail "a malformed database URL is not named"
if grep -l -- "$secret" "$it_dir"/*.log "$it_dir"/*.out "$it_dir"/*.err 2>/dev/null; then
	it_fail "the password appeared in the output"
fi
# Memory that runs out while the worker checks a row is not the row's
# fault: the row is retried with backoff (charged, so that a row that
# always needs more ends at max_attempts) and sent, never failed at once.
# (An earlier version failed it for good as "headers are not valid json":
# cJSON returns NULL for both.) The test backend makes cJSON's next
# allocation fail once it opened.
it_psql "DELETE FROM $OUTBOX_TABLE" >/dev/null
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, headers) VALUES ('oom.headers', '{}', '{\"x-tenant\": \"t1\"}')" >/dev/null
RELAY_TEST_BIN="$RELAY_TEST_FLAKY_BIN" it_relay oom OUTBOX_PUBLISHER=flaky OUTBOX_WORKERS=1 \
	RELAY_TEST_FLAKY_FILE="$it_dir/oom.delivered" RELAY_TEST_FLAKY_JSON_OOM=1 \
	OUTBOX_BACKOFF_BASE=100ms
pid=$it_last_pid
it_wait 20 "the row checked without memory to be sent" \
	bash -c "[ \"\$(psql '$RELAY_TEST_DATABASE_URL' -XAtc \"SELECT status FROM $OUTBOX_TABLE WHERE type = 'oom.headers'\")\" = sent ]"
it_stop "$pid"
grep -q '"event not encoded; retried".*"reason":"out of memory"' "$it_dir/oom.log" ||
	it_fail "the worker did not say it retries the row it had no memory to check"
attempts=$(psql "$RELAY_TEST_DATABASE_URL" -XAtc "SELECT attempts FROM $OUTBOX_TABLE WHERE type = 'oom.headers'")
[ "$attempts" = 2 ] || it_fail "the retry for memory was not charged: attempts $attempts, want 2"
[ "$(wc -l <"$it_dir/oom.delivered")" = 1 ] || it_fail "the row was not delivered once"

# Without OUTBOX_DATABASE_URL, libpq's own PG* variables apply.
pg_vars=$(python3 -c '
import sys, urllib.parse as u
p = u.urlparse(sys.argv[1])
print("PGHOST=%s PGPORT=%s PGUSER=%s PGPASSWORD=%s PGDATABASE=%s" % (
    p.hostname, p.port, p.username, u.unquote(p.password or ""), p.path.lstrip("/")))
' "$RELAY_TEST_DATABASE_URL")
# shellcheck disable=SC2086
env -u OUTBOX_DATABASE_URL $pg_vars OUTBOX_TABLE="$OUTBOX_TABLE" "$RELAY_TEST_BIN" check \
	>"$it_dir/pgvars.out" 2>&1 || it_fail "check with PG* variables: $(cat "$it_dir/pgvars.out")"
grep -q "^postgres .*: ok" "$it_dir/pgvars.out" || it_fail "check with PG* variables did not reach postgres"
echo "ok"
