#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two databases behind one relay (OUTBOX_DATABASES, docs/design.md §13),
# the second a Postgres server of this test's own: `migrate` and `check`
# cover both; the events of both go out, each database with its own
# sessions and its own listener; operator commands name a source as
# DATABASE/TABLE and refuse to guess; one database stopped: the other's
# events keep flowing, the ops session moves to it and readiness stays;
# the stopped one's events go out by themselves once it is back; a
# database down at start is set aside with all its tables at once.
. "$(dirname "$0")/lib.sh"
it_table dbs
table="$OUTBOX_TABLE"
services="$(dirname "$0")/../services"
it_cluster
pg2=$it_cluster_dir
url2=$it_cluster_url
psql2() { psql "$url2" -X -A -t -q -v ON_ERROR_STOP=1 -c "$1"; }

# The second database is listed first: the ops session starts on it, so
# stopping it shows the session moving.
dbs_env=(OUTBOX_DATABASE_URL= OUTBOX_DATABASES="second,main"
	OUTBOX_DATABASE_URL_SECOND="$url2" OUTBOX_DATABASE_URL_MAIN="$RELAY_TEST_DATABASE_URL"
	OUTBOX_TABLE="$table" OUTBOX_LISTEN=on)
run_cli() { env "${dbs_env[@]}" "$RELAY_TEST_BIN" "$@"; }

run_cli migrate >"$it_dir/migrate.out" 2>&1 || it_fail "migrate of two databases failed: $(cat "$it_dir/migrate.out")"
grep -q 'database second (1 of 2)' "$it_dir/migrate.out" || it_fail "migrate did not name the first database: $(head -3 "$it_dir/migrate.out")"
grep -q 'database main (2 of 2)' "$it_dir/migrate.out" || it_fail "migrate did not name the second database"
[ "$(grep -c "table $table is at schema version" "$it_dir/migrate.out")" = 2 ] || it_fail "migrate did not do the table in both databases"
[ "$(psql2 "SELECT to_regclass('$table') IS NOT NULL")" = t ] || it_fail "the table is not in the second database"
run_cli check >"$it_dir/check.out" 2>&1 || it_fail "check failed: $(cat "$it_dir/check.out")"
grep -q "^postgres (second: .*ok, table $table present" "$it_dir/check.out" || it_fail "check did not report the second database: $(cat "$it_dir/check.out")"
grep -q "^postgres (main: .*ok, table $table present" "$it_dir/check.out" || it_fail "check did not report the main database"
! grep -q 'outbox-test-secret' "$it_dir/check.out" || it_fail "check printed a password"

# One table in two databases: a command on one must say which.
run_cli pause >"$it_dir/pause_none.out" 2>&1 && it_fail "pause without --source succeeded with two databases"
grep -q 'say which with --source DATABASE/' "$it_dir/pause_none.out" || it_fail "no hint: $(cat "$it_dir/pause_none.out")"
run_cli status --source "$table" >"$it_dir/status_bare.out" 2>&1 && it_fail "status --source without a database succeeded"
grep -q 'a source is DATABASE/TABLE' "$it_dir/status_bare.out" || it_fail "bare --source not explained: $(cat "$it_dir/status_bare.out")"
run_cli status --source "third/$table" >/dev/null 2>&1 && it_fail "status of an unknown database succeeded"

insert() { # PSQL N TYPE
	$1 "INSERT INTO $table (type, payload) SELECT '$3', convert_to('{}', 'UTF8') FROM generate_series(1, $2)" >/dev/null
}
printed() { [ "$(grep -c "\"type\":\"$1\"" "$it_dir/dbs.out")" -ge "$2" ]; }

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
insert psql2 20 second1
insert it_psql 20 main1
# One lane: a worker that waited for the stopped database would hold up
# the other database's events too.
it_relay dbs "${dbs_env[@]}" OUTBOX_HTTP_ADDR="127.0.0.1:$port" OUTBOX_LOG_LEVEL=info OUTBOX_POLL_INTERVAL=1s OUTBOX_WORKER_WINDOW=1
pid=$it_last_pid
it_wait 20 "the second database's events" printed second1 20
it_wait 20 "the main database's events" printed main1 20
it_wait 10 "readiness" curl -sf "http://127.0.0.1:$port/readyz" -o /dev/null

# /metrics: each source's events, under its DATABASE/TABLE name.
metric() { curl -sf "http://127.0.0.1:$port/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
sent_of() { metric "outbox_source_events_total{source=\"$1/$table\",outcome=\"sent\"}"; }
failing_of() { metric "outbox_source_failing{source=\"$1/$table\"}"; }
# Counted once the marks commit, a moment after the lines are printed.
sent_is() { [ "$(sent_of "$1")" = "$2" ]; }
it_wait 10 "second's sent counter at 20" sent_is second 20
it_wait 10 "main's sent counter at 20" sent_is main 20
[ "$(failing_of second)" = 0 ] || it_fail "second failing before anything failed"
# Each database's table's dead tuples, read in that database; none while
# a database cannot be read (below), not a value frozen from before.
dead_shown() { [ -n "$(metric "outbox_source_dead_tuples{source=\"$1/$table\"}")" ]; }
dead_unshown() {
	curl -sf -m 5 "http://127.0.0.1:$port/metrics" >"$it_dir/metrics_dead.txt" &&
		! grep -q "^outbox_source_dead_tuples{source=\"$1/$table\"}" "$it_dir/metrics_dead.txt"
}
both_dead_shown() { dead_shown main && dead_shown second; }
it_wait 15 "both databases' dead tuples on /metrics" both_dead_shown
[ "$(metric 'outbox_sources{state="served"}')" = 2 ] || it_fail "outbox_sources served is not 2"
curl -sf "http://127.0.0.1:$port/metrics" >"$it_dir/metrics.txt"
if command -v promtool >/dev/null; then
	promtool check metrics <"$it_dir/metrics.txt" >"$it_dir/promtool.out" 2>&1 ||
		it_fail "promtool check metrics: $(cat "$it_dir/promtool.out")"
fi

# Each database has the sessions of a one-database relay (the lane, its
# claim session, the sweeper, the cleaner, a listener, and the ops
# session or, in the other database, the one that beats its registry). This relay's sessions are told from other
# tests' by their client ports.
client_ports() { # PSQL: this relay's client ports to that server, comma-separated
	local pgport
	pgport=$($1 "SHOW port")
	ss -tnpH state established "( dport = :$pgport )" | grep "pid=$pid," |
		awk '{ n = split($3, a, ":"); print a[n] }' | paste -sd, -
}
sessions() { # PSQL [APP-LIKE]
	local ports
	ports=$(client_ports "$1")
	[ -n "$ports" ] || { echo 0; return; }
	$1 "SELECT count(*) FROM pg_stat_activity WHERE client_port IN ($ports) AND application_name LIKE '${2:-%}'"
}
# Each thread opens its sessions as it starts; a loaded machine may be
# slow to, so the counts are read once they are there.
sessions_at_least() { [ "$(sessions "$1" "${3:-%}")" -ge "$2" ]; }
it_wait 15 "the second database's sessions" sessions_at_least psql2 6
it_wait 15 "the main database's sessions" sessions_at_least it_psql 6
it_wait 15 "the second database's listener" sessions_at_least psql2 1 '%/listener%'
it_wait 15 "the main database's listener" sessions_at_least it_psql 1 '%/listener%'
s2=$(sessions psql2)
l2=$(sessions psql2 '%/listener%')
l1=$(sessions it_psql '%/listener%')
[ "$l2" = 1 ] || it_fail "want one listener in the second database, got $l2"
[ "$l1" = 1 ] || it_fail "want one listener in the main database, got $l1"
s1=$(sessions it_psql)
[ "$s2" = 6 ] || it_fail "$s2 sessions in the second database (want a one-database relay's, 6)"
[ "$s1" = 6 ] || it_fail "$s1 sessions in the main database (want a one-database relay's, 6)"
echo "sessions: second database $s2, main database $s1" >&2

# Both databases' registries have the relay, alive: the ops session
# beats its own (the second's), the other session the main one's.
# PSQL: this relay's registry row was written in the last 8 s (the other
# tables' are written every 6 s).
beaten() {
	[ "$($1 "SELECT count(*) FROM ${table}_replicas WHERE id LIKE '%/$pid' AND state = 'alive' AND last_seen_at > now() - interval '8 seconds'")" = 1 ]
}
it_wait 10 "the relay in the second database's registry" beaten psql2
it_wait 10 "the relay in the main database's registry" beaten it_psql
run_cli status --source "main/$table" >"$it_dir/status_main.out" 2>&1 || it_fail "status --source main/...: $(cat "$it_dir/status_main.out")"
grep -Eq '^REPLICAS +1 alive' "$it_dir/status_main.out" || it_fail "status of the main database does not see the relay: $(cat "$it_dir/status_main.out")"

# An event in the second database goes out once it is notified or polled
# (1 s here; listen_wakeup.sh shows the notification's own wake-up).
insert psql2 1 woken
it_wait 15 "the notified event in the second database" printed woken 1

# Pause one database's table: its rows wait, the other's go.
run_cli pause --source "second/$table" --reason test >"$it_dir/pause.out" 2>&1 || it_fail "pause --source second/...: $(cat "$it_dir/pause.out")"
sleep 2.5
insert psql2 3 paused
insert it_psql 3 main2
it_wait 10 "the main database's rows while the second is paused" printed main2 3
sleep 1
! grep -q '"type":"paused"' "$it_dir/dbs.out" || it_fail "a paused source's row went out"
run_cli status --source "second/$table" >"$it_dir/status.out" 2>&1 || it_fail "status --source second/...: $(cat "$it_dir/status.out")"
grep -qi 'paused' "$it_dir/status.out" || it_fail "status of the paused source does not say so: $(cat "$it_dir/status.out")"
# status without --source: a line per source, the paused one first.
run_cli status >"$it_dir/status_all.out" 2>&1 || it_fail "status of all sources failed: $(cat "$it_dir/status_all.out")"
grep -q '^2 sources, 1 in trouble' "$it_dir/status_all.out" || it_fail "status of all sources: $(cat "$it_dir/status_all.out")"
first=$(grep -A1 '^SOURCE' "$it_dir/status_all.out" | tail -n 1)
case "$first" in "second/$table "*paused*) ;; *) it_fail "the paused source is not first: $(cat "$it_dir/status_all.out")" ;; esac
grep -q "^main/$table  *ok  " "$it_dir/status_all.out" || it_fail "the main source is not ok: $(cat "$it_dir/status_all.out")"
run_cli resume --source "second/$table" >/dev/null 2>&1 || it_fail "resume --source failed"
it_wait 10 "the paused rows after resume" printed paused 3

# The second database stops: the main one's events keep flowing, the ops
# session moves there, readiness stays.
bash "$services/postgres.sh" stop "$pg2" >/dev/null 2>&1 || it_fail "could not stop the second Postgres"
stopped_at=$SECONDS
# Once the relay has met the stopped database (a poll interval and more).
sleep 3
insert it_psql 20 during
it_wait 15 "the main database's events while the second is down" printed during 20
it_wait 15 "the ops session to move" grep -q '"the ops session moves to another source"' "$it_dir/dbs.log"
it_wait 15 "ready with one of two databases down" curl -sf "http://127.0.0.1:$port/readyz" -o /dev/null
for _ in 1 2 3 4 5; do
	sleep 0.3
	curl -sf "http://127.0.0.1:$port/readyz" -o /dev/null || it_fail "not ready with one of two databases down"
done
grep -q '"source failing; the others go on"' "$it_dir/dbs.log" || it_fail "no warning for the stopped database's source"
[ "$(failing_of second)" = 1 ] || it_fail "the stopped database's source is not failing in /metrics: '$(failing_of second)'"
[ "$(failing_of main)" = 0 ] || it_fail "the main source is failing in /metrics"
it_wait 15 "the stopped database's dead tuples to leave /metrics" dead_unshown second
dead_shown main || it_fail "the main database's dead tuples left /metrics with the second's"
run_cli status --json >"$it_dir/status_down.json" 2>&1 || it_fail "status with a database down failed: $(cat "$it_dir/status_down.json")"
python3 - "$it_dir/status_down.json" "$table" <<'PY' || it_fail "status with a database down: $(cat "$it_dir/status_down.json")"
import json, sys
rows = json.load(open(sys.argv[1]))["sources"]
t = sys.argv[2]
assert [r["source"] for r in rows] == ["second/" + t, "main/" + t], rows
assert rows[0]["state"] == "unreachable" and "error" in rows[0], rows[0]
assert rows[1]["state"] == "ok" and rows[1]["pending"] >= 0, rows[1]
PY
# No source read (the second down, no such table in the main one): the
# lines still print, and the exit status says it.
run_cli_missing() { env "${dbs_env[@]}" OUTBOX_TABLE="${table}_none" "$RELAY_TEST_BIN" "$@"; }
run_cli_missing status >"$it_dir/status_none.out" 2>"$it_dir/status_none.err" &&
	it_fail "status with no source read exited 0: $(cat "$it_dir/status_none.out")"
grep -q "^main/${table}_none  *missing" "$it_dir/status_none.out" || it_fail "status with no source read: $(cat "$it_dir/status_none.out")"
grep -q 'no source could be read' "$it_dir/status_none.err" || it_fail "status with no source read does not say so: $(cat "$it_dir/status_none.err")"

# Back: its rows go out without a restart of the relay.
sleep 3
bash "$services/postgres.sh" restart "$pg2" >/dev/null 2>&1 || it_fail "could not start the second Postgres again"
insert psql2 20 after
it_wait 45 "the second database's events after it came back" printed after 20
# Its registry too, from the main database's ops session's relay now.
it_wait 45 "the relay's heartbeat in the second database after it came back" beaten psql2
grep -q '"a database.s replica registries get no heartbeat; the others go on"' "$it_dir/dbs.log" ||
	it_fail "the second database's registry out of reach was not told"
it_wait 10 "its registry's heartbeat told again" grep -q '"a database.s replica registries get their heartbeat again"' "$it_dir/dbs.log"
it_wait 15 "the second database's dead tuples back on /metrics" dead_shown second
it_wait 10 "the second source to work again in /metrics" bash -c "[ \"\$(curl -sf http://127.0.0.1:$port/metrics | grep -c '^outbox_source_failing{.*} 1')\" = 0 ]"
echo "second database down $((SECONDS - stopped_at)) s in all; its events went out after it returned" >&2
insert it_psql 5 main3
it_wait 10 "the main database's events at the end" printed main3 5
# A batch whose marks the stop cut off is leased again after its backoff
# (a crash suspect's charge): wait for it rather than for a fixed time.
all_sent() {
	[ "$(psql2 "SELECT count(*) FROM $table WHERE status <> 'sent'")" = 0 ] &&
		[ "$(it_psql "SELECT count(*) FROM $table WHERE status <> 'sent'")" = 0 ]
}
it_wait 60 "every row of both databases to be sent" all_sent
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exited $it_rc"
# A clean stop leaves both registries.
for q in psql2 it_psql; do
	[ "$($q "SELECT count(*) FROM ${table}_replicas WHERE id LIKE '%/$pid'")" = 0 ] || it_fail "the stopped relay is still in a registry ($q)"
done

# Nothing lost, nothing left: every row of both databases is sent, and
# its event was printed (a mark alone is no delivery).
for q in psql2 it_psql; do
	left=$($q "SELECT count(*) FROM $table WHERE status <> 'sent'")
	[ "$left" = 0 ] || it_fail "$left rows not sent in ($q): $($q "SELECT type, status, attempts, created_at, next_attempt_at FROM $table WHERE status <> 'sent'")"
	it_all_printed_from "$q" "two databases ($q)" "$it_dir/dbs.out"
done

# 50 tenant schemas over the two databases, served by one pattern: each
# database's discovery finds its own, and a tenant created in the second
# while the relay runs is served within the discovery interval.
schema="${table%%.*}"
pattern="${schema}_t*.outbox_events"
tenants_env=(OUTBOX_DATABASE_URL= OUTBOX_DATABASES="second,main"
	OUTBOX_DATABASE_URL_SECOND="$url2" OUTBOX_DATABASE_URL_MAIN="$RELAY_TEST_DATABASE_URL"
	OUTBOX_TABLE="$pattern")
tenant_cli() { env "${tenants_env[@]}" "$RELAY_TEST_BIN" "$@"; }
drop_tenants() {
	for i in $(seq 1 51); do echo "DROP SCHEMA IF EXISTS ${schema}_t$i CASCADE;"; done |
		psql "$RELAY_TEST_DATABASE_URL" -X -q >/dev/null 2>&1 || true
}
trap 'drop_tenants; it_cleanup' EXIT
for i in $(seq 1 50); do
	db=main
	[ "$i" -le 25 ] || db=second
	tenant_cli migrate --quiet --source "$db/${schema}_t$i.outbox_events" >>"$it_dir/tenants.out" 2>&1 ||
		it_fail "migrate --source $db/... of tenant $i failed: $(tail -3 "$it_dir/tenants.out")"
done
it_relay tenants "${tenants_env[@]}" OUTBOX_DISCOVERY_INTERVAL=1s OUTBOX_LOG_LEVEL=info
pid=$it_last_pid
it_wait 20 "the first discovery" grep -q '"discovered tables"' "$it_dir/tenants.log"
grep '"discovered tables"' "$it_dir/tenants.log" | grep -q '"tables":"50"' ||
	it_fail "discovery did not find 50 tenants in the two databases: $(grep '"discovered tables"' "$it_dir/tenants.log")"
for i in $(seq 1 50); do
	q=it_psql
	[ "$i" -le 25 ] || q=psql2
	$q "INSERT INTO ${schema}_t$i.outbox_events (type, payload) VALUES ('tenant$i', '\\x7b7d')" >/dev/null
done
tenants_printed() { [ "$(grep -c '"type":"tenant[0-9]*"' "$it_dir/tenants.out")" -ge 50 ]; }
it_wait 30 "one event of each of the 50 tenants" tenants_printed
tenant_cli migrate --quiet --source "second/${schema}_t51.outbox_events" >>"$it_dir/tenants.out" 2>&1 ||
	it_fail "migrate --source of a new tenant failed"
it_wait 10 "the new tenant to be found" grep -q '"found a table; relaying it".*second/'"${schema}_t51" "$it_dir/tenants.log"
psql2 "INSERT INTO ${schema}_t51.outbox_events (type, payload) VALUES ('newcomer', '\\x7b7d')" >/dev/null
it_wait 15 "the new tenant's event" grep -q '"type":"newcomer"' "$it_dir/tenants.out"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "the tenants' relay exited $it_rc"

# A database already down when the relay starts: its three tables are set
# aside together, one warning a thread (not one a table), the other
# database's events flow, and its own once it is up.
three="${schema}_t1.outbox_events,${schema}_t2.outbox_events,${schema}_t26.outbox_events"
three_env=(OUTBOX_DATABASE_URL= OUTBOX_DATABASES="second,main"
	OUTBOX_DATABASE_URL_SECOND="$url2" OUTBOX_DATABASE_URL_MAIN="$RELAY_TEST_DATABASE_URL"
	OUTBOX_TABLE="$three")
env "${three_env[@]}" "$RELAY_TEST_BIN" migrate --quiet >"$it_dir/three.migrate" 2>&1 ||
	it_fail "migrate of three tables in two databases: $(tail -3 "$it_dir/three.migrate")"
bash "$services/postgres.sh" stop "$pg2" >/dev/null 2>&1 || it_fail "could not stop the second Postgres"
it_relay three "${three_env[@]}" OUTBOX_LOG_LEVEL=info OUTBOX_WORKER_WINDOW=1
pid=$it_last_pid
it_psql "INSERT INTO ${schema}_t2.outbox_events (type, payload) VALUES ('main_up', '\\x7b7d')" >/dev/null
it_wait 15 "the main database's event with the second down" grep -q '"type":"main_up"' "$it_dir/three.out"
sleep 2
warned=$(grep '"source failing; the others go on"' "$it_dir/three.log" | grep -c '"source":"second/' || true)
# The lane, the sweeper and the cleaner: one each.
[ "$warned" -ge 1 ] && [ "$warned" -le 3 ] ||
	it_fail "$warned warnings for the second database's 3 tables (want one a thread, 3 at most)"
bash "$services/postgres.sh" restart "$pg2" >/dev/null 2>&1 || it_fail "could not start the second Postgres again"
psql2 "INSERT INTO ${schema}_t26.outbox_events (type, payload) VALUES ('second_up', '\\x7b7d')" >/dev/null
it_wait 45 "the second database's event once it is up" grep -q '"type":"second_up"' "$it_dir/three.out"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "the relay of three tables exited $it_rc"
echo "relay_databases: ok"
