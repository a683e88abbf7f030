#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A mixed-case OUTBOX_TABLE, in a mixed-case schema too: migrate creates
# it, the relay starts (its startup check names the table quoted, as every
# statement does), delivers in ordered mode with LISTEN on, and status
# reads it. Postgres folds unquoted names to lower case; the relay never
# leaves a name unquoted.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"

schema="Mixed_App_$$"
it_psql "SET client_min_messages = warning; DROP SCHEMA IF EXISTS \"$schema\" CASCADE;
	CREATE SCHEMA \"$schema\"" >/dev/null
for table in "$schema.Outbox_Events" "Mixed_Outbox_$$"; do
	export OUTBOX_TABLE="$table"
	quoted="\"${table%%.*}\".\"${table#*.}\""
	[ "$table" = "${table#*.}" ] && quoted="\"$table\""
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_LISTEN=on \
		"$RELAY_TEST_BIN" migrate --quiet >"$it_dir/migrate.out" 2>&1 ||
		it_fail "migrate $table: $(cat "$it_dir/migrate.out")"
	[ "$(it_psql "SELECT to_regclass('$quoted') IS NOT NULL")" = t ] ||
		it_fail "migrate did not create $quoted"
	# The producer helper, as an application calls it.
	fn="${quoted%\"}_enqueue\""
	it_psql "SELECT $fn('mixed.case', convert_to('{\"n\": ' || g || '}', 'UTF8'), 'k' || (g % 3))
		FROM generate_series(1, 30) g" >/dev/null
	it_in_flight="false"
	ops_relay "mixed$$" OUTBOX_LISTEN=on OUTBOX_ORDERING=partition OUTBOX_BATCH_SIZE=7
	pid=$it_last_pid
	count() { it_psql "SELECT count(*) FROM $quoted WHERE $1"; }
	deadline=$((SECONDS + 30))
	until [ "$(count "status = 'sent'")" = 30 ]; do
		[ "$SECONDS" -lt "$deadline" ] || it_fail "$table: $(count "status = 'sent'") of 30 sent"
		sleep 0.1
	done
	ops_cli status --json
	[ "$ops_rc" = 0 ] || it_fail "status on $table: $(cat "$it_dir/cli.err")"
	it_stop "$pid"
	[ "$it_rc" = 0 ] || it_fail "relay on $table exit code $it_rc"
	grep -q '"level":"error"' "$it_dir/mixed$$.log" &&
		it_fail "the relay logged errors on $table: $(grep '"level":"error"' "$it_dir/mixed$$.log" | head -3)"
	echo "ok: $table migrated, 30 events delivered in ordered mode, status read"
done
it_psql "SET client_min_messages = warning; DROP SCHEMA \"$schema\" CASCADE;
	DROP TABLE \"Mixed_Outbox_$$\" CASCADE" >/dev/null
