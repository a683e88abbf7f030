#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Three databases of two tables each behind one relay (OUTBOX_DATABASES,
# docs/design.md §13), in a Postgres server of this test's own. The ops
# session's tables are dropped: the session moves to the next
# database's, and only the registry stores of the two databases the move
# is between are opened again: the destination's share the ops session
# (its registry session goes), the third database's keep their session
# (the same server process before and after), and a clean stop still
# leaves every remaining registry.
. "$(dirname "$0")/lib.sh"
it_table move_dbs
table="$OUTBOX_TABLE"
schema="${table%%.*}"
it_cluster
url_a=$it_cluster_url
psql_a() { psql "$url_a" -X -A -t -q -v ON_ERROR_STOP=1 -c "$1"; }
psql_a "CREATE DATABASE move_b" >/dev/null
psql_a "CREATE DATABASE move_c" >/dev/null
url_b=$(it_database_url "$url_a" move_b)
url_c=$(it_database_url "$url_a" move_c)
dbs_env=(OUTBOX_DATABASE_URL= OUTBOX_DATABASES="first,second,third"
	OUTBOX_DATABASE_URL_FIRST="$url_a" OUTBOX_DATABASE_URL_SECOND="$url_b"
	OUTBOX_DATABASE_URL_THIRD="$url_c" OUTBOX_TABLE="$table,$schema.outbox_two")
env "${dbs_env[@]}" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate3.out" 2>&1 ||
	it_fail "migrate of three databases failed: $(cat "$it_dir/migrate3.out")"

it_relay move "${dbs_env[@]}" OUTBOX_LOG_LEVEL=info
pid=$it_last_pid
in_registry() { # URL [TABLE]: this relay's row is in that table's registry
	[ "$(psql "$1" -X -A -t -q -c "SELECT count(*) FROM ${2:-$table}_replicas WHERE id LIKE '%/$pid'")" = 1 ]
}
for u in "$url_b" "$url_c"; do
	for t in "$table" "$schema.outbox_two"; do
		it_wait 20 "the relay in $t's registry of $u" in_registry "$u" "$t"
	done
done
# The ops thread's session in each database (the ops session in the
# first, the registries' in the others: one application_name).
ops_pid_in() { psql_a "SELECT coalesce(string_agg(pid::text, ','), '') FROM pg_stat_activity WHERE datname = '$1' AND application_name LIKE 'outbox-relay/%/ops'"; }
ops_sessions_in() { psql_a "SELECT count(*) FROM pg_stat_activity WHERE datname = '$1' AND application_name LIKE 'outbox-relay/%/ops'"; }
[ "$(ops_sessions_in move_b)" = 1 ] || it_fail "want the registries' session alone in the second database, got $(ops_sessions_in move_b)"
third_before=$(ops_pid_in move_c)
[ -n "$third_before" ] && [ "${third_before#*,}" = "$third_before" ] ||
	it_fail "want one ops-thread session in the third database, got '$third_before'"

# The first database's tables go (a tenant dropped): the ops session
# moves to the second database's first table.
psql_a "SET client_min_messages = warning; DROP SCHEMA $schema CASCADE" >/dev/null
it_wait 20 "the ops session to move" grep -q '"the ops session moves to another source"' "$it_dir/move.log"
# Its registry rows go on being written: the third's through the same
# session as before the move.
written_since() { # URL TABLE SECONDS
	[ "$(psql "$1" -X -A -t -q -c "SELECT count(*) FROM ${2}_replicas WHERE id LIKE '%/$pid' AND last_seen_at > now() - interval '$3 seconds'")" = 1 ]
}
sleep 7
it_wait 10 "the second database's first row written after the move" written_since "$url_b" "$table" 3
for t in "$table" "$schema.outbox_two"; do
	it_wait 10 "$t's row in the third database written after the move" written_since "$url_c" "$t" 7
done
it_wait 10 "$schema.outbox_two's row in the second database written after the move" written_since "$url_b" "$schema.outbox_two" 7
[ "$(ops_sessions_in move_b)" = 1 ] ||
	it_fail "the second database's registry stores kept a session of their own beside the ops session ($(ops_sessions_in move_b) sessions)"
third_after=$(ops_pid_in move_c)
[ "$third_after" = "$third_before" ] ||
	it_fail "the third database's registry session was made again by the move ($third_before, then $third_after)"
it_stop "$pid"
for u in "$url_b" "$url_c"; do
	for t in "$table" "$schema.outbox_two"; do
		! in_registry "$u" "$t" || it_fail "the clean stop left the relay in $t's registry of $u"
	done
done
echo "the move kept the third database's registry session (pid $third_after)" >&2
