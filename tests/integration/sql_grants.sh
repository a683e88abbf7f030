#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# sql/grants.sql gives least privilege: the application may insert (also
# through the producer helper) but not read or change rows; the relay may
# read, update and delete, and use its side tables; where EXECUTE was
# revoked from PUBLIC too (the headers' CHECK calls a function), and on a
# table partitioned afterwards, whose default partition the cleaner reads
# and deletes from by name.
. "$(dirname "$0")/lib.sh"
it_table grants
schema=${OUTBOX_TABLE%.*}
app="app_$$"
relay="relay_$$"
later="relay_later_$$"
it_psql "CREATE ROLE $app; CREATE ROLE $relay; CREATE ROLE $later"
trap 'it_psql "DROP OWNED BY $app, $relay, $later; DROP ROLE IF EXISTS $app; DROP ROLE IF EXISTS $relay; DROP ROLE IF EXISTS $later" >/dev/null 2>&1 || true; it_cleanup' EXIT
it_psql "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA $schema FROM PUBLIC" >/dev/null
# grants APP RELAY: sql/grants.sql for those roles.
grants() {
	psql "$RELAY_TEST_DATABASE_URL" -X -q -v ON_ERROR_STOP=1 -v app_role="$1" -v relay_role="$2" \
		-v schema="$schema" -v table=outbox_events -f "$RELAY_TEST_SOURCE_ROOT/sql/grants.sql" >/dev/null ||
		it_fail "grants.sql failed"
}
grants "$app" "$relay"
# as ROLE SQL: runs SQL as ROLE; prints ok, denied (SQLSTATE 42501,
# insufficient privilege) or what else went wrong, which no check takes
# for a refusal.
as() {
	local out
	if out=$(psql "$RELAY_TEST_DATABASE_URL" -X -A -t -q -v VERBOSITY=sqlstate \
		-c "SET ROLE $1; $2" 2>&1 >/dev/null); then
		echo ok
	elif [ "$out" = "ERROR:  42501" ]; then
		echo denied
	else
		echo "error: $out"
	fi
}
[ "$(as "$app" "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('t', 'x')")" = ok ] || it_fail "app cannot insert"
[ "$(as "$app" "SELECT $schema.outbox_events_enqueue_json('t', '{}', 'k')")" = ok ] || it_fail "app cannot use the helper"
[ "$(as "$app" "SELECT payload FROM $OUTBOX_TABLE")" = denied ] || it_fail "app can read the outbox"
[ "$(as "$app" "UPDATE $OUTBOX_TABLE SET status = 'sent'")" = denied ] || it_fail "app can update the outbox"
[ "$(as "$relay" "UPDATE $OUTBOX_TABLE SET attempts = attempts WHERE true")" = ok ] || it_fail "relay cannot update"
[ "$(as "$relay" "UPDATE $OUTBOX_TABLE SET status = 'pending', headers = '{\"x-a\": \"b\"}' WHERE true")" = ok ] ||
	it_fail "relay cannot make a row pending again (the headers' CHECK)"
[ "$(as "$relay" "DELETE FROM $OUTBOX_TABLE WHERE false")" = ok ] || it_fail "relay cannot delete"
[ "$(as "$relay" "INSERT INTO $schema.outbox_events_control (destination) VALUES ('*')")" = ok ] ||
	it_fail "relay cannot pause"
[ "$(as "$relay" "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('t', 'x')")" = denied ] ||
	it_fail "relay can insert events"
[ "$(as "$relay" "DROP TABLE $OUTBOX_TABLE")" = denied ] || it_fail "relay can drop the table"
# Every relay reads the contract steps when it opens the table (design.md
# §11), and records its protocol in the registry.
[ "$(as "$relay" "SELECT step FROM $schema.outbox_events_contract")" = ok ] ||
	it_fail "relay cannot read the contract steps"
[ "$(as "$relay" "INSERT INTO $schema.outbox_events_replicas (id, version, protocol) VALUES ('g/1', '1', 1)")" = ok ] ||
	it_fail "relay cannot record its protocol"
[ "$(as "$relay" "INSERT INTO $schema.outbox_events_contract (step, protocol) VALUES ('x', 1)")" = denied ] ||
	it_fail "relay can record a contract step"
# Ordered mode reads seq's sequence at every connect; nothing draws from it
# but the producers' inserts.
seq="pg_get_serial_sequence('$OUTBOX_TABLE', 'seq')"
[ "$(as "$relay" "SELECT pg_sequence_last_value($seq)")" = ok ] ||
	it_fail "relay cannot read seq's sequence"
[ "$(as "$relay" "SELECT nextval($seq)")" = denied ] || it_fail "relay can draw from seq's sequence"
# Partitioned, then granted to a relay role made later. The partition step
# refuses a table with column privileges (the application's SELECT (id)),
# which would stay with the old table: revoked first, as it says.
it_psql "REVOKE SELECT (id) ON $OUTBOX_TABLE FROM $app" >/dev/null
OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "$RELAY_TEST_BIN" migrate --partition \
	>"$it_dir/partition.out" 2>&1 || it_fail "migrate --partition: $(cat "$it_dir/partition.out")"
grants "$app" "$later"
default="$schema.outbox_events_default"
[ "$(as "$later" "SELECT id FROM $default WHERE status = 'sent' LIMIT 1 FOR UPDATE SKIP LOCKED")" = ok ] ||
	it_fail "a relay granted after the partition step cannot read the default partition for the cleaner"
[ "$(as "$later" "DELETE FROM $default WHERE false")" = ok ] ||
	it_fail "a relay granted after the partition step cannot delete from the default partition"
[ "$(as "$app" "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('t', 'x')")" = ok ] ||
	it_fail "app cannot insert into the partitioned table"
echo ok
