#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A relay of a pattern that matches one table (docs/design.md §13).
# Rows written after the start go out within a poll interval and the
# statistics' flush, where the lanes, whose first activity read came
# before they had a session, slept to the backstop (5 minutes). Then the
# tenant's table is restored from a dump under the running relay: the
# schema dropped and restored in one transaction, so no discovery pass
# sees it gone. The row the dump holds pending, sent since, is pending
# again with its old due time, below the scan floor of the relay's store
# of the dropped table; discovery finds another oid under the name, each
# thread opens its store afresh, and the row goes out again within
# seconds, where the old store left it for its next scan from the start
# (ten minutes here). The copies lack their replica registries: the ops
# thread and the other tables' heartbeats look at the side tables anew
# and beat none, where they failed on the dropped tables' registries.
# Then both lanes of a one-table relay read the activity on sessions of
# their own. Last, the table listed without a schema beside the pattern
# that matches it is one source.
. "$(dirname "$0")/lib.sh"
it_table remade
schema="${OUTBOX_TABLE%%.*}"
it_psql "DROP SCHEMA $schema CASCADE" >/dev/null
tenant="${schema}_t1"
table="$tenant.outbox_events"
pattern="${schema}_t*.outbox_events"
tenant2="${schema}_t2"
trap 'it_psql "DROP SCHEMA IF EXISTS $tenant, $tenant2 CASCADE" >/dev/null 2>&1 || true; it_cleanup' EXIT

for t in "$table" "$tenant2.outbox_events"; do
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$pattern" \
		"$RELAY_TEST_BIN" migrate --quiet --source "$t" >"$it_dir/migrate.out" 2>&1 ||
		it_fail "migrate --source $t failed: $(tail -3 "$it_dir/migrate.out")"
done
insert() { # N TYPE
	it_psql "INSERT INTO $table (type, payload) SELECT '$2', convert_to('{}', 'UTF8') FROM generate_series(1, $1)" >/dev/null
}
printed() { [ "$(grep -c "\"type\":\"$1\"" "$it_dir/remade.out")" -ge "$2" ]; }
insert 1 restored
for t in "$tenant" "$tenant2"; do
	pg_dump -n "$t" --no-owner -f "$it_dir/$t.sql" "$RELAY_TEST_DATABASE_URL" \
		2>"$it_dir/pg_dump.err" || it_fail "pg_dump: $(cat "$it_dir/pg_dump.err")"
done
# restore SCHEMA: drops it and puts its dump back in one transaction. The
# copy has no replica registry (a table made by hand may lack it).
restore() {
	{
		echo "DROP SCHEMA $1 CASCADE;"
		cat "$it_dir/$1.sql"
		echo "DROP TABLE $1.outbox_events_replicas;"
	} | psql "$RELAY_TEST_DATABASE_URL" -X -q -1 -v ON_ERROR_STOP=1 >"$it_dir/restore.out" 2>&1 ||
		it_fail "the restore of $1 failed: $(tail -3 "$it_dir/restore.out")"
}

# One lane: it holds the floors of every lease (a second lane that
# leased nothing would have none, and would rescan).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OUTBOX_TABLE="$pattern" it_relay remade OUTBOX_DISCOVERY_INTERVAL=1s \
	OUTBOX_LEASE_RESCAN_INTERVAL=10m OUTBOX_LOG_LEVEL=info OUTBOX_WORKER_WINDOW=1 \
	OUTBOX_HTTP_ADDR="127.0.0.1:$port"
pid=$it_last_pid
it_wait 15 "the dumped row, first sent" printed restored 1
# The second tenant, not the ops session's table, restored first: the
# heartbeats of the other tables' registries look at its side tables
# anew (they went on beating the dropped table's registry, and failed),
# before the first's restore below opens the ops session's anew (and
# with it those of the tables that share its session).
beaten() { [ "$(it_psql "SELECT count(*) FROM $tenant2.outbox_events_replicas WHERE id LIKE '%/$pid'")" = 1 ]; }
it_wait 15 "the relay in the second tenant's registry" beaten
restore "$tenant2"
it_wait 10 "the second tenant made anew" grep -q '"a table was made anew; relaying it afresh".*_t2' "$it_dir/remade.log"
sleep 6
! grep -q "registry gets no heartbeat" "$it_dir/remade.log" ||
	it_fail "the second tenant's dropped registry was beaten: $(grep -m1 'registry gets no heartbeat' "$it_dir/remade.log")"
# Later rows move the lease's scan floor past the dumped row's due time.
sleep 1
insert 20 later
it_wait 15 "the later rows" printed later 20
sleep 1

# The first tenant restored: the ops thread, whose session's table it
# is, looks at its side tables anew, where it went on beating the dropped
# table's registry and failed.
restore "$tenant"
it_wait 15 "the restored row, sent again" printed restored 2
grep -q '"a table was made anew; relaying it afresh".*_t1' "$it_dir/remade.log" ||
	it_fail "no log line for the table made anew"
! grep -q '"a table is gone' "$it_dir/remade.log" || it_fail "a discovery pass saw the table gone"
insert 1 after
it_wait 15 "a row written after the restore" printed after 1
# Three heartbeats' time (3 s apart).
sleep 7
! grep -Eq '"(registry heartbeat failed|the ops session moves to another source)"' "$it_dir/remade.log" ||
	it_fail "the ops thread beat the dropped table's registry: $(grep -Em1 'registry heartbeat failed|moves to another' "$it_dir/remade.log")"
curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || it_fail "not ready after the restore"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

it_psql "DROP SCHEMA $tenant2 CASCADE" >/dev/null

# Two lanes (the default) of a relay of one table by a pattern: both
# read the tables' activity on a session of their own, the one that
# leased nothing too: it opens one for the read (it read nothing, and
# each turn it took put the worker's next read off a poll interval).
OUTBOX_TABLE="$pattern" it_relay lanes OUTBOX_DISCOVERY_INTERVAL=1s
pid=$it_last_pid
lanes_read() {
	local ports
	ports=$(ss -tnpH state established "( dport = :$pg_port )" | grep "pid=$pid," |
		awk '{ sub(/.*:/, "", $3); print $3 }' | paste -sd, -)
	[ -n "$ports" ] && [ "$(it_psql "SELECT count(DISTINCT application_name) FROM pg_stat_activity
		WHERE client_port IN ($ports) AND application_name ~ '/worker-0(\\.1)?$'")" = 2 ]
}
pg_port=$(it_psql "SHOW port")
it_wait 10 "a session of each lane" lanes_read
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

# The same table listed without a schema (found by the session's
# search_path) beside the pattern that matches it: one source, as listed,
# where the pattern's match made a second source of the same table.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="$RELAY_TEST_DATABASE_URL"
case "$url" in *\?*) url="$url&" ;; *) url="$url?" ;; esac
url="${url}options=-csearch_path%3D$tenant"
OUTBOX_TABLE="outbox_events,$pattern" it_relay both OUTBOX_DATABASE_URL="$url" \
	OUTBOX_DISCOVERY_INTERVAL=1s OUTBOX_LOG_LEVEL=info OUTBOX_HTTP_ADDR="127.0.0.1:$port"
pid=$it_last_pid
it_wait 15 "the relay's discovery" grep -q '"msg":"discovered tables"' "$it_dir/both.log"
served() { curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "outbox_sources{state=\"served\"}" { print $2 }'; }
it_wait 10 "/metrics" bash -c "curl -sf http://127.0.0.1:$port/metrics >/dev/null"
[ "$(served)" = 1 ] || it_fail "the listed table and the pattern's match of it are $(served) sources"
grep -q '"a table the pattern matches is listed too; relayed once, as listed".*"listed":"outbox_events"' "$it_dir/both.log" ||
	it_fail "no log line for the table listed and matched"
# `status` counts it once too.
env OUTBOX_DATABASE_URL="$url" OUTBOX_TABLE="outbox_events,$pattern" "$RELAY_TEST_BIN" status \
	>"$it_dir/status.out" 2>&1 || it_fail "status failed: $(cat "$it_dir/status.out")"
grep -q '^1 sources, 0 in trouble' "$it_dir/status.out" || it_fail "status: $(cat "$it_dir/status.out")"
insert 1 both
it_wait 15 "a row of the table listed and matched" grep -q '"type":"both"' "$it_dir/both.out"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo "ok: the restored table's pending row went out again; a table listed and matched is one source"
