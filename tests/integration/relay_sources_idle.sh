#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fifty tenant schemas behind one relay by a pattern (OUTBOX_TABLE=
# "<prefix>_t*.outbox_events", docs/design.md §13): `migrate` migrates
# every table the pattern matches; the relay finds them, and a tenant
# created while it runs is relayed within a discovery interval; a tenant
# dropped while it runs gives one warning and the others go on; an idle
# relay does not lease each idle table every poll interval (one
# statistics read says which tables were written); a tenant's first event
# goes out within a poll interval and the statistics' flush; with LISTEN
# on, a notification makes its own table due and no other.
. "$(dirname "$0")/lib.sh"
it_table tenants
schema="${OUTBOX_TABLE%%.*}"
it_psql "DROP SCHEMA $schema CASCADE" >/dev/null
pattern="${schema}_t*.outbox_events"
cleanup_tenants() {
	for i in $(seq 1 52); do echo "DROP SCHEMA IF EXISTS ${schema}_t$i CASCADE;"; done |
		psql "$RELAY_TEST_DATABASE_URL" -X -q >/dev/null 2>&1 || true
}
trap 'cleanup_tenants; it_cleanup' EXIT
run_cli() {
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$pattern" OUTBOX_LISTEN=on \
		"$RELAY_TEST_BIN" "$@"
}
# A pattern that matches no table yet: the relay waits for one without
# spinning (an earlier version's ops thread looked again at once, a core's
# worth of CPU until the first table came).
OUTBOX_TABLE="$pattern" it_relay empty OUTBOX_DISCOVERY_INTERVAL=1s
pid=$it_last_pid
sleep 1
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
a=$(cpu_ticks "$pid")
sleep 3
b=$(cpu_ticks "$pid")
cpu_ms=$(((b - a) * 1000 / $(getconf CLK_TCK)))
[ "$cpu_ms" -lt 1000 ] || it_fail "a relay with no table yet spent $cpu_ms ms of CPU in 3 s"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "the relay with no table exited $it_rc"

# A new tenant's table: `migrate --source` names it (a table the pattern
# matches); `migrate` alone then upgrades every table it matches.
for i in $(seq 1 50); do
	run_cli migrate --quiet --source "${schema}_t$i.outbox_events" >>"$it_dir/create.out" 2>&1 ||
		it_fail "migrate --source of tenant $i failed: $(tail -3 "$it_dir/create.out")"
done
run_cli migrate --quiet >"$it_dir/migrate.out" 2>&1 || it_fail "migrate of the pattern failed: $(tail -3 "$it_dir/migrate.out")"
grep -qF "pattern $pattern matches 50 tables" "$it_dir/migrate.out" || it_fail "migrate did not find the 50 tables: $(head -3 "$it_dir/migrate.out")"
[ "$(grep -c 'is at schema version' "$it_dir/migrate.out")" = 50 ] || it_fail "migrate did not do 50 tables"
run_cli migrate --source "other.outbox_events" >"$it_dir/bad.out" 2>&1 && it_fail "migrate --source of a table the pattern does not match succeeded"
# The pattern's * matches any text: a --source it matches that is no
# table name is a usage error (2), named.
rc=0
run_cli redrive --dry-run --source "${schema}_t1-x.outbox_events" >"$it_dir/bad.out" 2>&1 || rc=$?
[ "$rc" = 2 ] || it_fail "redrive --source of no table name exited $rc: $(cat "$it_dir/bad.out")"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
leases() { curl -sf "http://127.0.0.1:$port/metrics" | awk '/^outbox_leases_total /{print $2}'; }
printed() { [ "$(grep -c "\"type\":\"$1\"" "$it_dir/$2.out")" -ge "$3" ]; }
# Settled: the count of leases is at least $1 and stands still for a second.
settled() {
	local x y
	x=$(leases)
	sleep 1
	y=$(leases)
	[ -n "$x" ] && [ "$x" -ge "$1" ] && [ "$x" = "$y" ]
}
# Leases over 3 s once the relay has leased every table once (the start
# settled: under load the first leases of 50 tables take seconds).
idle_leases() {
	it_wait 60 "the relay's first lease of each table" settled 50 >&2
	local a b
	a=$(leases)
	sleep 3
	b=$(leases)
	echo $((b - a))
}

# Polling: 50 idle tables, 200 ms poll interval. Leasing each would be 750
# leases in 3 s; the statistics read leaves the 60 s backstop alone.
OUTBOX_TABLE="$pattern" it_relay poll OUTBOX_HTTP_ADDR="127.0.0.1:$port" OUTBOX_DISCOVERY_INTERVAL=1s OUTBOX_METRICS_SOURCES=10
pid=$it_last_pid
n=$(idle_leases)
# Per-source series for the first 10 tenants, the other 40 summed.
curl -sf "http://127.0.0.1:$port/metrics" >"$it_dir/metrics.txt"
[ "$(grep -c '^outbox_source_failing{' "$it_dir/metrics.txt")" = 11 ] || it_fail "want 10 sources and (other) in outbox_source_failing: $(grep '^outbox_source_failing' "$it_dir/metrics.txt" | head -3)"
grep -q '^outbox_source_events_total{source="(other)",outcome="sent"} ' "$it_dir/metrics.txt" || it_fail "no (other) series"
grep -q '^outbox_sources{state="served"} 50$' "$it_dir/metrics.txt" || it_fail "outbox_sources served is not 50"
[ "$n" -le 5 ] || it_fail "an idle relay of 50 tables leased $n times in 3 s"
it_psql "INSERT INTO ${schema}_t37.outbox_events (type, payload) VALUES ('first', '\\x7b7d')" >/dev/null
started=$SECONDS
it_wait 5 "a tenant's first event" printed first poll 1
took_poll=$((SECONDS - started))
grep '"msg":"discovered tables"' "$it_dir/poll.log" | grep -q '"tables":"50"' ||
	it_fail "the relay did not say it found 50 tables"

# A tenant added while the relay runs is relayed within a discovery
# interval (1 s here); one dropped gives one warning, the others go on.
run_cli migrate --quiet --source "${schema}_t51.outbox_events" >/dev/null 2>&1 || it_fail "migrate of tenant 51 failed"
it_psql "INSERT INTO ${schema}_t51.outbox_events (type, payload) VALUES ('new', '\\x7b7d')" >/dev/null
it_wait 10 "the new tenant's event" printed new poll 1
grep -q '"found a table; relaying it".*_t51' "$it_dir/poll.log" || it_fail "no log line for the new tenant"
# Set aside first (a column renamed under a new row fails its lease),
# then dropped: the lanes that set it aside let it go, so it is no
# longer counted failing (they kept it so, and its old store, for good).
failing_is() { [ "$(curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "outbox_sources{state=\"failing\"}" { print $2 }')" = "$1" ]; }
it_psql "INSERT INTO ${schema}_t12.outbox_events (type, payload) VALUES ('broken', '\\x7b7d');
	ALTER TABLE ${schema}_t12.outbox_events RENAME COLUMN payload TO payload_gone" >/dev/null
it_wait 15 "the broken tenant set aside" failing_is 1
it_psql "DROP SCHEMA ${schema}_t12 CASCADE" >/dev/null
sleep 3
it_psql "INSERT INTO ${schema}_t13.outbox_events (type, payload) VALUES ('after', '\\x7b7d')" >/dev/null
it_wait 10 "an event after a tenant was dropped" printed after poll 1
it_wait 10 "the dropped tenant no longer failing" failing_is 0
[ "$(grep -c '"a table is gone; no longer relayed".*_t12' "$it_dir/poll.log")" = 1 ] ||
	it_fail "want one warning for the dropped tenant: $(grep -c _t12 "$it_dir/poll.log") lines name it"
# The next source's pending index has read far more than the first's
# (bitmap scans of 1,000 entries that fetch nothing, rows due in a year
# the relay leaves alone): its dead-entries gauge must start over when
# the ops session moves there, where an earlier version's first sample
# took the difference to the first table's counters, about 1,000 a scan.
t10="${schema}_t10.outbox_events"
it_psql "INSERT INTO $t10 (type, payload, next_attempt_at) SELECT 'later', '\\x7b7d', now() + interval '1 year' FROM generate_series(1, 1000)" >/dev/null
idx_reads() { it_psql "SELECT idx_scan || ' ' || idx_tup_read FROM pg_stat_user_indexes WHERE indexrelid = '${schema}_t10.outbox_events_pending_idx'::regclass"; }
reads0=$(idx_reads)
{
	echo "SET enable_seqscan = off; SET enable_indexscan = off; SET enable_indexonlyscan = off;"
	for _ in $(seq 50); do
		echo "SELECT count(*) FROM $t10 WHERE status = 'pending' AND next_attempt_at > now() + interval '300 days';"
	done
} | psql "$RELAY_TEST_DATABASE_URL" -X -q >/dev/null || it_fail "the reads of the next source's index failed"
reads_grew() { [ "$(idx_reads | awk -v r="$reads0" '{ split(r, a, " "); print ($2 - a[2] >= 40000) }')" = 1 ]; }
it_wait 10 "the next source's index reads counted" reads_grew
dead_per_scan() { curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "outbox_lease_dead_index_entries_per_scan" { print $2 }'; }
# The first tenant holds the ops session (registry, gauges, readiness):
# dropped, the session moves on and the relay stays ready.
it_psql "DROP SCHEMA ${schema}_t1 CASCADE" >/dev/null
it_wait 15 "the ops session to move on" grep -q '"the ops session moves to another source"' "$it_dir/poll.log"
sleep 1
curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || it_fail "not ready after the first tenant was dropped"
it_wait 10 "a heartbeat from the next source" bash -c "[ \$(psql '$RELAY_TEST_DATABASE_URL' -XAtc 'SELECT count(*) FROM ${schema}_t10.outbox_events_replicas') -ge 1 ]"
# Two gauge intervals (5 s each) on the next source: no sample there may
# carry the first table's counters.
for _ in $(seq 24); do
	v=$(dead_per_scan)
	[ -n "$v" ] || it_fail "no outbox_lease_dead_index_entries_per_scan in /metrics"
	awk -v v="$v" 'BEGIN { exit !(v < 100) }' ||
		it_fail "the dead-entries gauge read $v entries a scan after the ops session moved (the two tables' counters mixed)"
	sleep 0.5
done
it_psql "DELETE FROM $t10 WHERE type = 'later'" >/dev/null
it_stop "$pid"

# LISTEN: the notification wakes its table alone. The LISTEN session goes
# through a forwarder that holds it until the gate file exists, so that
# the start's leases and the listener's first wake-up are counted apart
# whatever the machine's load (raced, the wake-up re-leased the tables
# leased before it: 49 to 98 leases by timing alone).
pg_port=$(printf '%s' "$RELAY_TEST_DATABASE_URL" | sed -E 's|^.*@[^:/]+:([0-9]+)/.*$|\1|')
gate_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 "$(dirname "$0")/tcp_gate.py" "$gate_port" "$pg_port" "$it_dir/gate" 2>"$it_dir/gate.log" &
it_pids+=("$!")
listen_url="${RELAY_TEST_DATABASE_URL/:$pg_port\//:$gate_port/}"
[ "$listen_url" != "$RELAY_TEST_DATABASE_URL" ] || it_fail "cannot point the LISTEN URL at the gate: $RELAY_TEST_DATABASE_URL"
OUTBOX_TABLE="$pattern" it_relay listen OUTBOX_HTTP_ADDR="127.0.0.1:$port" OUTBOX_LISTEN=on \
	OUTBOX_LISTEN_DATABASE_URL="$listen_url"
pid=$it_last_pid
it_wait 30 "the relay's first lease of each table" settled 49
start=$(leases)
# A lease of each of the 49 tables. Each table's first activity count is
# read before its first lease, and a lane that has no session yet reads
# none: either slip cost another lease of every table (98 and more).
[ "$start" -le 53 ] || it_fail "the relay's start took $start leases for 49 idle tables"
# The listener's first wake-up: rows inserted while nobody listened make
# their table due, so each table leased before it is leased once more,
# and no more than once.
touch "$it_dir/gate"
it_wait 30 "the listener" grep -q '"listening for inserts".*"tables":"49"' "$it_dir/listen.log"
it_wait 30 "the listener's wake-up to settle" settled $((start + 49))
woke=$(($(leases) - start))
[ "$woke" -le 53 ] || it_fail "the listener's first wake-up took $woke leases of 49 idle tables"
a=$(leases)
for i in 1 2 3 4 5; do
	it_psql "INSERT INTO ${schema}_t$((i * 7)).outbox_events (type, payload) VALUES ('woken', '\\x7b7d')" >/dev/null
	sleep 0.3
done
it_wait 5 "the notified tables' events" printed woken listen 5
b=$(leases)
# Five events in five tables: a few leases each (the notification's, the
# one its own marks' statistics bring), not a lease of every table per
# notification (250 and more), nor per turn of a lane with no session.
[ $((b - a)) -le 50 ] || it_fail "$((b - a)) leases for 5 notified events in 50 tables"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

# Statistics off (track_counts): nothing counts writes, so the read fails
# and every idle table is leased once a poll interval (200 ms), as
# without it: 49 tables, about 735 leases in 3 s. The failed read waits
# for its interval as a good one does; read again at every turn it would
# make every table due at every turn, leases back to back.
OUTBOX_TABLE="$pattern" it_relay nocounts OUTBOX_HTTP_ADDR="127.0.0.1:$port" \
	OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL?options=-c%20track_counts%3Doff"
pid=$it_last_pid
it_wait 30 "the relay's metrics" leases
sleep 2
c=$(leases)
sleep 3
polled=$(($(leases) - c))
it_stop "$pid"
[ "$polled" -ge 49 ] || it_fail "with track_counts off, 49 idle tables took $polled leases in 3 s: not polled"
[ "$polled" -le 1000 ] || it_fail "with track_counts off, 49 idle tables took $polled leases in 3 s: more than one a poll interval"
# A table listed by name that the pattern matches too is the operator's:
# dropped, it is not let go, where a table of the pattern alone is (an
# earlier version let both go). The pattern's table going tells that
# discovery has looked since.
gone_is() { [ "$(curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "outbox_sources{state=\"gone\"}" { print $2 }')" = "$1" ]; }
OUTBOX_TABLE="$pattern,${schema}_t20.outbox_events" it_relay listed OUTBOX_HTTP_ADDR="127.0.0.1:$port" OUTBOX_DISCOVERY_INTERVAL=1s
pid=$it_last_pid
# Served once each: the listed table and the pattern's 48 others (the
# discovery thread's first pass comes after the metrics answer).
served_is() { curl -sf "http://127.0.0.1:$port/metrics" | grep -q "^outbox_sources{state=\"served\"} $1\$"; }
it_wait 30 "the pattern's tables found beside the listed one" served_is 49
gone_is 0 || it_fail "a table gone at the start: $(curl -sf "http://127.0.0.1:$port/metrics" | grep '^outbox_sources')"
# status counts the listed table the pattern matches too once, as the
# relay does (an earlier version showed it twice: 50 sources).
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$pattern,${schema}_t20.outbox_events" \
	"$RELAY_TEST_BIN" status >"$it_dir/status_listed.out" 2>&1 || it_fail "status failed: $(cat "$it_dir/status_listed.out")"
grep -q '^49 sources, ' "$it_dir/status_listed.out" || it_fail "status of a listed table a pattern matches too: $(head -n 1 "$it_dir/status_listed.out")"
# The pattern's table to be dropped is paused first: once let go it is
# paused no more (counted, outbox_paused stayed 1 for good).
run_cli pause --source "${schema}_t21.outbox_events" --reason "tenant leaving" >"$it_dir/pause21.out" 2>&1 ||
	it_fail "pause of one tenant failed: $(cat "$it_dir/pause21.out")"
paused_is() { [ "$(curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "outbox_paused" { print $2 }')" = "$1" ]; }
# An event makes the idle tenant due, and its turn reads the pause.
it_psql "INSERT INTO ${schema}_t21.outbox_events (type, payload) VALUES ('held.event', '{}')" >/dev/null
it_wait 10 "the tenant's pause counted" paused_is 1
it_psql "DROP SCHEMA ${schema}_t20 CASCADE; DROP SCHEMA ${schema}_t21 CASCADE" >/dev/null
it_wait 15 "the pattern's dropped table let go" grep -q '"a table is gone; no longer relayed".*_t21' "$it_dir/listed.log"
sleep 2
gone_is 1 || it_fail "want only the pattern's table gone: $(curl -sf "http://127.0.0.1:$port/metrics" | grep '^outbox_sources')"
# The table let go has no lag series left (its last lease's, kept, would
# fire OutboxSourceLagging for good); the listed one, failing, keeps its.
lags=$(curl -sf "http://127.0.0.1:$port/metrics" | grep '^outbox_source_lag_seconds{' || true)
grep -q "_t20.outbox_events" <<<"$lags" || it_fail "no lag series of the listed table: $lags"
! grep -q "_t21.outbox_events" <<<"$lags" || it_fail "the table let go keeps a lag series: $lags"
grep -q '"a table is gone; no longer relayed".*_t20' "$it_dir/listed.log" && it_fail "the listed table was let go"
it_wait 5 "the dropped tenant's pause no longer counted" paused_is 0
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "the relay of a listed table exited $it_rc"
echo "ok: 50 tenants by a pattern, one added and one dropped while running: $n leases in 3 s idle; first event within ${took_poll}s; start took $start leases, the listener's wake-up $woke; 5 notified events took $((b - a)) leases; $polled in 3 s with track_counts off"
