#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A relay of a pattern that matches one table (docs/design.md §13): a row
# written after the start goes out within a poll interval and the
# statistics' flush, where the lanes, whose first activity read came
# before they had a session, slept to the backstop (5 minutes).
. "$(dirname "$0")/lib.sh"
it_table remade
schema="${OUTBOX_TABLE%%.*}"
it_psql "DROP SCHEMA $schema CASCADE" >/dev/null
tenant="${schema}_t1"
table="$tenant.outbox_events"
pattern="${schema}_t*.outbox_events"
trap 'it_psql "DROP SCHEMA IF EXISTS $tenant CASCADE" >/dev/null 2>&1 || true; it_cleanup' EXIT

env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$pattern" \
	"$RELAY_TEST_BIN" migrate --quiet --source "$table" >"$it_dir/migrate.out" 2>&1 ||
	it_fail "migrate --source failed: $(tail -3 "$it_dir/migrate.out")"
insert() { # N TYPE
	it_psql "INSERT INTO $table (type, payload) SELECT '$2', convert_to('{}', 'UTF8') FROM generate_series(1, $1)" >/dev/null
}
printed() { [ "$(grep -c "\"type\":\"$1\"" "$it_dir/remade.out")" -ge "$2" ]; }
insert 1 first

OUTBOX_TABLE="$pattern" it_relay remade OUTBOX_DISCOVERY_INTERVAL=1s \
	OUTBOX_LOG_LEVEL=info
pid=$it_last_pid
it_wait 15 "the row written before the start" printed first 1
sleep 1
insert 20 later
it_wait 15 "the later rows" printed later 20
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo "ok: rows written after the start went out"
