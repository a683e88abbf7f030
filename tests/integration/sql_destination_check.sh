#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Migration 004 (sql/004_destination_text.sql): the table refuses pending
# rows whose exchange or routing_key holds a control character, through a
# plain INSERT and through the producer helper; a row finished before the
# migration may keep one. On a table whose old pending rows violate it,
# migrate still succeeds and leaves the constraint NOT VALID (enforced for
# new rows); the relay fails those rows with the reason, its lease and
# mark not refused, in unordered and ordered mode (where the relay fails
# them before its first lease); the next migrate validates the
# constraint.
. "$(dirname "$0")/lib.sh"
it_table destcheck
schema=${OUTBOX_TABLE%%.*}
con=outbox_events_destination_text

validated() {
	it_psql "SELECT convalidated FROM pg_constraint
	         WHERE conrelid = '$OUTBOX_TABLE'::regclass AND conname = '$con'"
}
[ "$(validated)" = t ] || it_fail "constraint $con missing or not validated after migrate"

refused() {
	local what=$1 sql=$2
	if it_psql "$sql" >"$it_dir/insert.out" 2>&1; then
		it_fail "$what was accepted"
	fi
	grep -q "$con" "$it_dir/insert.out" || it_fail "$what: refused, but not by $con: $(cat "$it_dir/insert.out")"
}
refused "a newline in exchange" \
	"INSERT INTO $OUTBOX_TABLE (type, payload, exchange) VALUES ('t', '{}', 'a' || chr(10) || 'b')"
refused "an escape in routing_key" \
	"INSERT INTO $OUTBOX_TABLE (type, payload, routing_key) VALUES ('t', '{}', 'k' || chr(27) || '[2K')"
refused "DEL in routing_key" \
	"INSERT INTO $OUTBOX_TABLE (type, payload, routing_key) VALUES ('t', '{}', 'k' || chr(127))"
refused "a tab in exchange through the helper" \
	"SELECT $schema.outbox_events_enqueue_json('t', '{}', NULL, p_exchange => 'a' || chr(9))"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, exchange, routing_key) VALUES
  ('ok.plain', '{}', 'orders.v1', 'order.paid.*'), ('ok.null', '{}', NULL, '')" ||
	it_fail "plain destinations refused"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, exchange, status, finished_at)
  VALUES ('old.finished', '{}', 'a' || chr(10) || 'b', 'failed', now())" ||
	it_fail "a finished row holding a control character was refused"
it_psql "DELETE FROM $OUTBOX_TABLE"

# A table at version 3 holding old pending rows with control characters.
it_psql "ALTER TABLE $OUTBOX_TABLE DROP CONSTRAINT $con;
         DELETE FROM $schema.outbox_events_schema_version WHERE version = 4"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, exchange, routing_key) VALUES
  ('old.bad', '{}', 'orders' || chr(10) || 'forged', ''),
  ('old.good', '{}', NULL, 'k')"
OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "$RELAY_TEST_BIN" migrate \
	>"$it_dir/migrate2.out" 2>&1 || it_fail "migrate over old bad rows failed: $(cat "$it_dir/migrate2.out")"
[ "$(validated)" = f ] || it_fail "constraint not left NOT VALID over old bad rows: '$(validated)'"
refused "a new bad row while NOT VALID" \
	"INSERT INTO $OUTBOX_TABLE (type, payload, exchange) VALUES ('t', '{}', 'a' || chr(13))"

it_relay relay
pid=$it_last_pid
it_wait_count 20 "status IN ('sent', 'failed')" -eq 2
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
[ "$(it_psql "SELECT status || ': ' || coalesce(last_error, '') FROM $OUTBOX_TABLE WHERE type = 'old.bad'")" = \
	"failed: exchange contains a control character" ] || it_fail "old bad row not failed with the reason"
[ "$(it_count "type = 'old.good' AND status = 'sent'")" = 1 ] || it_fail "old good row not sent"

# Ordered mode, old rows again: a2 (behind its key's first row) and b1
# (its key's first, marked head by a relay of that time), d1 written
# after. Each would stop a mark that left it pending; the relay fails
# them alone with the reason before its first lease and delivers the
# rest in key order.
it_psql "ALTER TABLE $OUTBOX_TABLE DROP CONSTRAINT $con;
         DELETE FROM $schema.outbox_events_schema_version WHERE version = 4"
it_psql "INSERT INTO $OUTBOX_TABLE (type, subject, partition_key, routing_key, payload) VALUES
  ('ord.good', 'a1', 'A', 'k', '{}'), ('ord.bad', 'a2', 'A', 'k' || chr(10), '{}'),
  ('ord.good', 'a3', 'A', 'k', '{}'), ('ord.bad', 'b1', 'B', chr(27) || 'k', '{}'),
  ('ord.good', 'u1', NULL, 'k', '{}');
  UPDATE $OUTBOX_TABLE SET head = subject IN ('a1', 'b1') WHERE type LIKE 'ord.%' AND partition_key IS NOT NULL;
  INSERT INTO $OUTBOX_TABLE (type, subject, partition_key, exchange, payload) VALUES
  ('ord.bad', 'd1', 'D', 'ex' || chr(9), '{}')"
OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "$RELAY_TEST_BIN" migrate \
	>"$it_dir/migrate4.out" 2>&1 || it_fail "migrate over old bad rows failed: $(cat "$it_dir/migrate4.out")"
[ "$(validated)" = f ] || it_fail "constraint not left NOT VALID over old bad rows: '$(validated)'"
it_psql "INSERT INTO $OUTBOX_TABLE (type, subject, partition_key, payload) VALUES ('ord.good', 'a4', 'A', '{}')"
it_relay ordered OUTBOX_ORDERING=partition
pid=$it_last_pid
it_wait_count 20 "type LIKE 'ord.%' AND status IN ('sent', 'failed')" -eq 7
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "ordered relay exit code $it_rc"
[ "$(it_count "type = 'ord.bad' AND status = 'failed' AND last_error LIKE
  'refused by the table''s CHECK outbox_events_destination_text: % contains a control character%'")" = 3 ] ||
	it_fail "old bad rows not failed with the CHECK's reason: $(it_psql "SELECT string_agg(subject || ' ' || status || ' ' || coalesce(last_error, ''), '; ') FROM $OUTBOX_TABLE WHERE type = 'ord.bad'")"
[ "$(it_psql "SELECT string_agg(subject, ',' ORDER BY finished_at, seq) FROM $OUTBOX_TABLE
  WHERE partition_key = 'A' AND status = 'sent'")" = "a1,a3,a4" ] || it_fail "key A not delivered in order"
[ "$(it_count "type = 'ord.good' AND status = 'sent'")" = 4 ] || it_fail "good rows not all sent"

OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "$RELAY_TEST_BIN" migrate \
	>"$it_dir/migrate3.out" 2>&1 || it_fail "migrate failed: $(cat "$it_dir/migrate3.out")"
[ "$(validated)" = t ] || it_fail "migrate did not validate the constraint once no pending row violated it"
echo "ok"
