#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Several outbox tables behind one relay (OUTBOX_TABLE as a list,
# docs/design.md §13): `migrate` creates them all; every table's events
# go out, on the sessions of one table's relay; a quiet table's event is
# not held behind a hot table's backlog; /metrics shows each table's lag
# and dead tuples; a table dropped while the relay
# runs gives one warning and the others go on; an operator pause of one
# table (--source) stops that table alone, and a redrive by source replays
# that table's rows alone; commands that work on one table refuse to guess
# which.
. "$(dirname "$0")/lib.sh"
it_table sources
schema="${OUTBOX_TABLE%%.*}"
hot="$schema.hot"
quiet="$schema.quiet"
gone="$schema.gone"
tables="$hot, $quiet,$gone"
run_cli() {
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$tables" \
		"$RELAY_TEST_BIN" "$@"
}

run_cli migrate >"$it_dir/migrate3.out" 2>&1 || it_fail "migrate of the list failed: $(cat "$it_dir/migrate3.out")"
for t in "$hot" "$quiet" "$gone"; do
	grep -q "table $t is at schema version" "$it_dir/migrate3.out" || it_fail "migrate did not report $t"
done
# Twice is fine (idempotent), and --source migrates that table alone.
run_cli migrate --source "$quiet" >"$it_dir/migrate1.out" 2>&1 || it_fail "migrate --source failed"
[ "$(grep -c 'is at schema version' "$it_dir/migrate1.out")" = 1 ] || it_fail "migrate --source did more than one table"

insert() { # TABLE N TYPE
	it_psql "INSERT INTO $1 (type, payload) SELECT '$3', convert_to('{}', 'UTF8')
	         FROM generate_series(1, $2)" >/dev/null
}
sent() { it_psql "SELECT count(*) FROM $1 WHERE status = 'sent'"; }
sent_over() { [ "$(sent "$1")" -gt "$2" ]; }
printed() { [ "$(grep -c "\"type\":\"$1\"" "$it_dir/multi.out")" -ge "$2" ]; }

# A hot backlog, then one quiet event once the relay is draining it.
# The quiet table starts with dead tuples of its own (30: below
# autovacuum's threshold; an autoanalyze, past its 50 changes, keeps a
# one-page table's count), which /metrics must show as that table's.
insert "$quiet" 30 junk
it_psql "DELETE FROM $quiet" >/dev/null
insert "$hot" 20000 hot
insert "$gone" 5 gone
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OUTBOX_TABLE="$tables" it_relay multi OUTBOX_BATCH_SIZE=50 OUTBOX_MAX_RATE=4000 OUTBOX_LOG_LEVEL=info OUTBOX_HTTP_ADDR="127.0.0.1:$port"
pid=$it_last_pid
it_wait 30 "the hot table to start draining" sent_over "$hot" 500
# Draining, the hot table is behind by the age of its backlog's head
# (all of it inserted before the relay started), the third table is not.
metric() { curl -sf "http://127.0.0.1:$port/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
hot_lag=$(metric "outbox_source_lag_seconds{source=\"$hot\"}")
python3 -c "import sys; sys.exit(0 if float('${hot_lag:-0}') >= 0.3 else 1)" ||
	it_fail "the hot table's lag is '$hot_lag' while it drains a backlog"
insert "$quiet" 1 quiet
it_wait 10 "the quiet event" printed quiet 1
hot_then=$(sent "$hot")
[ "$hot_then" -lt 20000 ] || it_fail "the quiet event waited for the whole hot backlog"
it_wait 30 "the third table's events" printed gone 5
# Each table's dead tuples, read by the ops thread a database at a time:
# what Postgres counts for that table, not the ops session's table's.
dead_of() { it_psql "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relid IN (SELECT relid FROM pg_partition_tree('$1') UNION SELECT '$1'::regclass)"; }
dead_shown() {
	local shown
	shown=$(metric "outbox_source_dead_tuples{source=\"$1\"}")
	[ -n "$shown" ] && [ "$shown" -ge "$2" ] && [ "$shown" = "$(dead_of "$1")" ]
}
it_wait 15 "the quiet table's dead tuples on /metrics" dead_shown "$quiet" 30
it_wait 30 "the hot table's dead tuples on /metrics" dead_shown "$hot" 0
it_wait 15 "the third table's dead tuples on /metrics" dead_shown "$gone" 0

# Every table's registry has the relay, not only the ops session's
# table's: `status --source` of another table sees it alive (an earlier
# version showed it no replica at all), and so do that table's redrive,
# migrate --partition and contract steps.
live_in() { it_psql "SELECT count(*) FROM ${1}_replicas WHERE id LIKE '%/$pid' AND state = 'alive' AND last_seen_at > now() - interval '15 seconds'"; }
for t in "$hot" "$quiet" "$gone"; do
	it_wait 10 "the relay in $t's registry" bash -c "[ \"\$(psql '$RELAY_TEST_DATABASE_URL' -XAtc \"SELECT count(*) FROM ${t}_replicas WHERE id LIKE '%/$pid'\")\" = 1 ]"
	[ "$(live_in "$t")" = 1 ] || it_fail "the relay's row in $t's registry is not alive"
done
# Beaten on: the other tables' rows move together, one statement every
# other round (6 s).
moved() { [ "$(it_psql "SELECT count(*) FROM ${1}_replicas WHERE id LIKE '%/$pid' AND last_seen_at > started_at + interval '5 seconds' AND last_seen_at > now() - interval '8 seconds'")" = 1 ]; }
for t in "$quiet" "$gone"; do
	it_wait 15 "the relay's heartbeats in $t's registry" moved "$t"
done
run_cli status --source "$quiet" >"$it_dir/status_quiet.out" 2>&1 || it_fail "status --source $quiet failed: $(cat "$it_dir/status_quiet.out")"
grep -Eq '^REPLICAS +1 alive' "$it_dir/status_quiet.out" || it_fail "status of the second table does not see the relay: $(cat "$it_dir/status_quiet.out")"
! grep -q 'no live replica' "$it_dir/status_quiet.out" || it_fail "status of the second table says no replica is live"

# The sessions of one table's relay for all three tables, not a set per
# table: 2 lanes and their 2 claim sessions, the sweeper, the cleaner
# (the ops thread is off without HTTP). Counted as this relay's
# connections to Postgres: other tests share the server.
pg_port=$(it_psql "SHOW port")
sessions=$(ss -tnpH state established "( dport = :$pg_port )" | grep -c "pid=$pid," || true)
[ "$sessions" -le 8 ] || it_fail "$sessions sessions for 3 tables (want the one-table count, 8 at most)"
# A count that found none (ss's form changed, the filter went wrong)
# would pass the bound: the two lanes' sessions at least are there.
[ "$sessions" -ge 2 ] || it_fail "$sessions of the relay's sessions found: the count does not see them"

# Dropped while running: one warning, the others go on.
it_psql "DROP TABLE $gone CASCADE" >/dev/null
sleep 1
insert "$quiet" 10 quiet2
it_wait 20 "quiet events after the drop" printed quiet2 10
sleep 3
warnings=$(grep -c '"source failing; the others go on"' "$it_dir/multi.log" || true)
[ "$warnings" -ge 1 ] || it_fail "no warning for the dropped table"
[ "$warnings" -le 3 ] || it_fail "$warnings warnings for one dropped table (a loop per thread at most)"
grep '"source failing' "$it_dir/multi.log" | grep -q "$gone" || it_fail "the warning does not name the table"
# Its dead tuples' series goes with it (a value left would be summed
# into nothing real).
dead_gone() {
	curl -sf "http://127.0.0.1:$port/metrics" >"$it_dir/metrics_gone.txt" &&
		! grep -q "^outbox_source_dead_tuples{source=\"$gone\"}" "$it_dir/metrics_gone.txt"
}
it_wait 15 "the dropped table's dead tuples to leave /metrics" dead_gone
# status without --source: a line per table, the dropped one first.
run_cli status >"$it_dir/status_all.out" 2>&1 || it_fail "status of all tables failed: $(cat "$it_dir/status_all.out")"
grep -q '^3 sources, 1 in trouble' "$it_dir/status_all.out" || it_fail "status of all tables: $(cat "$it_dir/status_all.out")"
first=$(grep -A1 '^SOURCE' "$it_dir/status_all.out" | tail -n 1)
# Each line shows its table's dead tuples (the quiet table's 30 and more).
awk -v t="$quiet" '$1 == t { found = 1; ok = $NF >= 30 } END { exit !(found && ok) }' "$it_dir/status_all.out" ||
	it_fail "status does not show the quiet table's dead tuples: $(cat "$it_dir/status_all.out")"
case "$first" in "$gone "*missing*) ;; *) it_fail "the dropped table is not first: $(cat "$it_dir/status_all.out")" ;; esac

# Pause one table: its rows wait, the other's go.
run_cli pause >"$it_dir/pause_none.out" 2>&1 && it_fail "pause without --source on a list succeeded"
grep -q 'say which with --source' "$it_dir/pause_none.out" || it_fail "no hint to use --source: $(cat "$it_dir/pause_none.out")"
run_cli pause --source "$schema.nope" >"$it_dir/pause_bad.out" 2>&1 && it_fail "pause of an unlisted table succeeded"
grep -q 'is not one of' "$it_dir/pause_bad.out" || it_fail "unlisted --source not explained"
run_cli pause --source "$quiet" --reason test >"$it_dir/pause.out" 2>&1 || it_fail "pause --source failed: $(cat "$it_dir/pause.out")"
sleep 2
insert "$quiet" 3 paused
insert "$hot" 3 hot2
it_wait 20 "the hot table's new rows" printed hot2 3
sleep 1
! grep -q '"type":"paused"' "$it_dir/multi.out" || it_fail "a paused table's row went out"
run_cli resume --source "$quiet" >/dev/null 2>&1 || it_fail "resume --source failed"
it_wait 20 "the paused table's rows after resume" printed paused 3
run_cli status --source "$hot" --json >"$it_dir/status.json" 2>&1 || it_fail "status --source failed: $(cat "$it_dir/status.json")"

# Redrive by source: a replay of one table's rows of a type both tables
# have sends that table's again and leaves the other's alone.
insert "$hot" 2 both
insert "$quiet" 2 both
it_wait 20 "both tables' rows of one type" printed both 4
run_cli redrive --source "$quiet" --type both --status sent --since 10m --quiet >"$it_dir/redrive.out" 2>&1 ||
	it_fail "redrive --source failed: $(cat "$it_dir/redrive.out")"
it_wait 20 "the replayed rows" printed both 6
sleep 1
[ "$(grep -c '"type":"both"' "$it_dir/multi.out")" = 6 ] || it_fail "redrive --source replayed another table's rows too"

it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
# A clean stop leaves every registry it beat.
for t in "$hot" "$quiet"; do
	[ "$(it_psql "SELECT count(*) FROM ${t}_replicas WHERE id LIKE '%/$pid'")" = 0 ] || it_fail "the stopped relay is still in $t's registry"
done
[ "$(sent "$hot")" = 20005 ] || it_fail "hot table: $(sent "$hot") of 20005 sent"
echo "ok: 3 tables, quiet event after $hot_then of 20000 hot, $warnings warning(s) for the dropped table, $sessions sessions"
