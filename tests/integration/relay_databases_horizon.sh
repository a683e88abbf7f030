#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two databases behind one relay (OUTBOX_DATABASES, docs/design.md §13),
# both in a Postgres server of this test's own: a snapshot held in the
# database the ops session is not in keeps vacuum from that database's
# outbox alone, and the ops session's own statement cannot see it there.
# /metrics names it all the same, with its database, through the session
# the ops thread holds there for the registries; once it ends, the
# holder is no longer that one. A writer of the first database, which
# the other database's read sees too (by its transaction id), is named
# with its own database, the first. Each database's table's dead tuples
# are shown as that source's.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table horizon_dbs
table="$OUTBOX_TABLE"
it_cluster
url_a=$it_cluster_url
psql_a() { psql "$url_a" -X -A -t -q -v ON_ERROR_STOP=1 -c "$1"; }
psql_a "CREATE DATABASE other_db" >/dev/null
url_b=$(it_database_url "$url_a" other_db)

# "first" is listed first: the ops session starts in it, so "second",
# the other database, is read through the registries' session (the two
# have one application_name; the ops session's place is the list's
# order, docs/design.md §13).
dbs_env=(OUTBOX_DATABASE_URL= OUTBOX_DATABASES="first,second"
	OUTBOX_DATABASE_URL_FIRST="$url_a" OUTBOX_DATABASE_URL_SECOND="$url_b"
	OUTBOX_TABLE="$table")
env "${dbs_env[@]}" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate2.out" 2>&1 ||
	it_fail "migrate of two databases failed: $(cat "$it_dir/migrate2.out")"

# Dead tuples of each database's table (25 and 7), which /metrics shows
# as that source's, read in each database.
psql "$url_b" -X -q -v ON_ERROR_STOP=1 -c "INSERT INTO $table (type, payload) SELECT 'junk', '\\x00' FROM generate_series(1, 25)" -c "DELETE FROM $table" >/dev/null
psql_a "INSERT INTO $table (type, payload) SELECT 'junk', '\\x00' FROM generate_series(1, 7)" >/dev/null
psql_a "DELETE FROM $table" >/dev/null

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
it_relay horizon "${dbs_env[@]}" OUTBOX_HTTP_ADDR="127.0.0.1:$port" OUTBOX_LOG_LEVEL=info
it_wait 20 "readiness" curl -sf "http://127.0.0.1:$port/readyz" -o /dev/null
beaten() {
	[ "$(psql "$url_b" -X -A -t -q -c "SELECT count(*) FROM ${table}_replicas WHERE id LIKE '%/$it_last_pid'")" = 1 ]
}
it_wait 15 "the relay's row in the second database's registry" beaten
dead_shown() { # URL SOURCE AT_LEAST
	local shown want
	shown=$(curl -sf -m 5 "http://127.0.0.1:$port/metrics" | awk -v k="outbox_source_dead_tuples{source=\"$2\"}" '$1 == k { print $2 }')
	want=$(psql "$1" -X -A -t -q -c "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relid IN (SELECT relid FROM pg_partition_tree('$table') UNION SELECT '$table'::regclass)")
	[ -n "$shown" ] && [ "$shown" -ge "$3" ] && [ "$shown" = "$want" ]
}
it_wait 20 "the second database's dead tuples on /metrics" dead_shown "$url_b" "second/$table" 25
it_wait 20 "the first database's dead tuples on /metrics" dead_shown "$url_a" "first/$table" 7

# A report in the second database: a snapshot, no transaction id (a
# writer's id would show in the first database's statement too).
ops_session_open "report-in-second-$$" "$url_b"
ops_session_send "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class;"
# Not visible from the first database (else this test proves nothing).
sleep 1
[ "$(psql_a "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'report-in-second-$$' AND (backend_xid IS NOT NULL OR datname = current_database())")" = 0 ] ||
	it_fail "the holder would be seen from the first database"

holder_named() { # NAME DATABASE
	curl -sf -m 5 "http://127.0.0.1:$port/metrics" >"$it_dir/metrics.txt" || return 1
	grep -q "^outbox_xmin_horizon_holder_info{kind=\"session\",name=\"$1\",pid=\"[0-9]*\",database=\"$2\"} 1\$" \
		"$it_dir/metrics.txt" &&
		awk '$1 == "outbox_xmin_horizon_age_seconds" { seen = 1; ok = $2 >= 10 } END { exit !(seen && ok) }' "$it_dir/metrics.txt"
}
it_wait 40 "/metrics naming the second database's holder, held 10 s or more" holder_named "report-in-second-$$" second
if command -v promtool >/dev/null; then
	promtool check metrics <"$it_dir/metrics.txt" >"$it_dir/promtool.out" 2>&1 ||
		it_fail "promtool check metrics: $(cat "$it_dir/promtool.out")"
fi

ops_session_send "ROLLBACK;"
released() {
	curl -sf -m 5 "http://127.0.0.1:$port/metrics" >"$it_dir/metrics.txt" || return 1
	grep -q '^outbox_xmin_horizon_holder_info{' "$it_dir/metrics.txt" &&
		! grep -q "name=\"report-in-second-$$\"" "$it_dir/metrics.txt"
}
it_wait 20 "/metrics no longer naming the released holder" released

# A writer of the first database holds by its transaction id, which the
# second database's read sees as well: named with its own database.
ops_session_open "writer-in-first-$$" "$url_a"
ops_session_send "BEGIN; SELECT txid_current();"
it_wait 40 "/metrics naming the first database's writer with its database" holder_named "writer-in-first-$$" first
ops_session_send "ROLLBACK;"
it_stop "$it_last_pid"
echo "the second database's holder was named with its database, gone once released; the first's writer with its own" >&2
