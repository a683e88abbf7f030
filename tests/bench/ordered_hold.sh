#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Where the ordered relay's Postgres time goes under a held snapshot
# (docs/benchmark.md, "Ordered mode: the key lock"). An experiment, not a
# target: the relay (2 workers, OUTBOX_ORDERING=partition, publisher
# stdout) drains producers at RATE events/s (pgbench, 512-byte payloads,
# each event one of KEYS partition keys at random; with KEYS 0 the events
# have no key and the relay runs unordered); pg_stat_statements
# shows the relay's statements over WINDOW seconds before a REPEATABLE
# READ snapshot is taken, over the last WINDOW seconds of a HOLD-second
# hold, and over WINDOW seconds from 30 s after its release (where the
# horizon section measures "after"): total ms, calls, buffers, and
# buffers per call.
# Usage: RELAY_TEST_BIN=build/outbox-relay tests/bench/ordered_hold.sh [keys] [hold_s]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KEYS=${1:-1000}
HOLD=${2:-120}
RATE=1000
WINDOW=20
[ "$HOLD" -ge $((2 * WINDOW)) ] && [ "$HOLD" -le 3600 ] ||
	{ echo "ordered_hold.sh: hold_s must be $((2 * WINDOW))..3600" >&2; exit 2; }
[ "$KEYS" -ge 0 ] && [ "$KEYS" -le 1000000 ] ||
	{ echo "ordered_hold.sh: keys must be 0..1000000" >&2; exit 2; }
ordering=partition key="'k' || (:k)::int"
[ "$KEYS" -gt 0 ] || ordering=none key=NULL
. "$root/tests/bench/experiment_lib.sh"
# pg_stat_statements is loaded at start only.
q -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'" >/dev/null
runuser -u postgres -- "$PG_BIN/pg_ctl" restart -D "$PG_DATA" -w >/dev/null
q -c "CREATE EXTENSION pg_stat_statements" >/dev/null
printf '%s\n' "\\set k random(1, $((KEYS > 0 ? KEYS : 1)))" \
	"INSERT INTO outbox_events (type, routing_key, partition_key, payload) VALUES ('bench.event', 'bench', $key, decode(repeat(md5(random()::text), 32), 'hex'));" \
	>"$work/insert.sql"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; bash "$root/tests/services/postgres.sh" stop "$work/pg" >/dev/null 2>&1; rm -rf "$work"' EXIT
OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_PUBLISHER=stdout OUTBOX_WORKERS=2 \
	OUTBOX_ORDERING=$ordering OUTBOX_HTTP_ADDR= OUTBOX_CE_SOURCE=/bench \
	"$RELAY_TEST_BIN" run >/dev/null 2>"$work/relay.log" &
pids+=($!)
"$PG_BIN/pgbench" -n -M prepared -c 2 -j 1 -R $RATE -T $((3 * WINDOW + HOLD + 40)) \
	-f "$work/insert.sql" >/dev/null 2>"$work/pgbench.log" &
pids+=($!)
stats() {
	q -F' | ' -c "SELECT round(total_exec_time)::int, calls, shared_blks_hit + shared_blks_read,
	  (shared_blks_hit + shared_blks_read) / greatest(calls, 1), left(regexp_replace(query, '\s+', ' ', 'g'), 60)
	  FROM pg_stat_statements WHERE query NOT LIKE 'INSERT INTO outbox_events%' AND query NOT LIKE '%pg_stat_statements%'
	  ORDER BY total_exec_time DESC LIMIT 8"
	q -c "SELECT 'dead tuples: ' || n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox_events'"
}
alive() { kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/relay.log" >&2; exit 1; }; }
sleep $WINDOW; alive
q -c "SELECT pg_stat_statements_reset()" >/dev/null
sleep $WINDOW; alive
echo "before the hold, $WINDOW s: ms | calls | buffers | buffers per call | statement"
stats
psql -X -q -c "BEGIN ISOLATION LEVEL REPEATABLE READ" -c "SELECT count(*) FROM outbox_events" \
	-c "SELECT pg_sleep($HOLD + 60)" >/dev/null 2>&1 &
pids+=($!)
sleep $((HOLD - WINDOW)); alive
q -c "SELECT pg_stat_statements_reset()" >/dev/null
sleep $WINDOW; alive
echo "the last $WINDOW s of a $HOLD s hold"
stats
# The holder's backend sleeps on: ending its client would not end it.
q -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'" >/dev/null
sleep 30; alive
q -c "SELECT pg_stat_statements_reset()" >/dev/null
sleep $WINDOW; alive
echo "$WINDOW s from 30 s after the release"
stats
