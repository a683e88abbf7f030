#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What the relay costs Postgres behind a transaction-mode pooler
# (docs/benchmark.md, "Behind PgBouncer"). An experiment, not a target:
# ROWS pending 1 KB rows drained by the relay (publisher stdout, 4
# workers, batch 100) connected four ways in turn, each from a freshly
# filled, vacuumed and checkpointed table: directly with its prepared
# statements (OUTBOX_PG_PREPARE=on, the default), directly with unnamed
# statements (OUTBOX_PG_PREPARE=off), and through PgBouncer (pool_mode =
# transaction, a pool of POOL server connections, 9 by default: two for
# each lane and one more) with unnamed statements (pooler:
# OUTBOX_PG_PREPARE=off) and with the lease transaction's prepared once a
# server connection (pooled: OUTBOX_PG_PREPARE=pooled, as the README
# asks); and, with WAYS naming it, keeps: OUTBOX_PG_PREPARE=on through
# PGBOUNCER_LATER, a PgBouncer 1.21 or later (tests/services/
# pgbouncer_build.sh builds one) with max_prepared_statements = 200, a
# pool that keeps each client's prepared statements itself.
# Per event: WAL bytes, Postgres CPU (postmaster and backends, reaped
# ones included) and, behind the pooler, PgBouncer's own CPU, rows/s; then
# pg_stat_statements' planning and execution time of the relay's
# statements per event. HISTORY=1 keeps history (the relay's default);
# otherwise OUTBOX_RETENTION=0. PARTITIONED=1 makes the table partitioned
# by id first (migrate --partition and a partition of today's next
# minutes, as the dbcost section makes them). POOL sets the pool's server
# connections;
# WORKERS sets the relay's workers (default 4);
# WAYS picks some of "direct unnamed pooler pooled keeps" (POOL=4 WAYS=pooled: a pool
# with no connection to spare); KEEP=1 keeps the work directory.
# Usage: RELAY_TEST_BIN=build/outbox-relay tests/bench/pooler_cost.sh [rows] [rounds]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROWS=${1:-20000}
ROUNDS=${2:-2}
[ "$ROWS" -ge 1000 ] && [ "$ROWS" -le 1000000 ] ||
	{ echo "pooler_cost.sh: rows must be 1000..1000000" >&2; exit 2; }
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 10 ] ||
	{ echo "pooler_cost.sh: rounds must be 1..10" >&2; exit 2; }
[ "${POOL:-9}" -ge 1 ] 2>/dev/null && [ "${POOL:-9}" -le 100 ] ||
	{ echo "pooler_cost.sh: POOL must be 1..100" >&2; exit 2; }
read -ra ways <<<"${WAYS:-direct unnamed pooler pooled}"
for way in "${ways[@]}"; do
	case $way in
	direct | unnamed | pooler | pooled) ;;
	keeps) [ -x "${PGBOUNCER_LATER:-}" ] ||
		{ echo "pooler_cost.sh: the way keeps needs PGBOUNCER_LATER, a PgBouncer 1.21 or later" >&2; exit 2; } ;;
	*) echo "pooler_cost.sh: WAYS: no way '$way' (direct, unnamed, pooler, pooled, keeps)" >&2; exit 2 ;;
	esac
done
. "$root/tests/bench/experiment_lib.sh"
statements_on
# Without history, the table as migrate leaves it for such relays: no
# room kept in its pages.
[ "${HISTORY:-0}" = 1 ] ||
	OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_RETENTION=0 \
		"$RELAY_TEST_BIN" migrate >/dev/null
[ "${PARTITIONED:-0}" = 1 ] && partitioned_today outbox_events
mkdir "$work/bouncer"
PGBOUNCER_POOL_SIZE=${POOL:-9} bash "$root/tests/services/pgbouncer.sh" start "$work/bouncer" >/dev/null
bouncer_url=$(sed -n 's/^PGBOUNCER_URL=//p' "$work/bouncer/env")
mkdir "$work/later"
if [[ " ${ways[*]} " == *" keeps "* ]]; then
	PGBOUNCER_BIN=$PGBOUNCER_LATER PGBOUNCER_MAX_PREPARED=200 PGBOUNCER_POOL_SIZE=${POOL:-9} \
		bash "$root/tests/services/pgbouncer.sh" start "$work/later" >/dev/null
	later_url=$(sed -n 's/^PGBOUNCER_URL=//p' "$work/later/env")
fi
relay_pid=
trap '[ -z "$relay_pid" ] || kill "$relay_pid" 2>/dev/null || true
bash "$root/tests/services/pgbouncer.sh" stop "$work/later" >/dev/null 2>&1
bash "$root/tests/services/pgbouncer.sh" stop "$work/bouncer" >/dev/null 2>&1
bash "$root/tests/services/postgres.sh" stop "$work/pg" >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
retention=0
[ "${HISTORY:-0}" = 1 ] && retention=24h
# The CPU of one process, in clock ticks.
proc_cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
port=$(bash -c '. "$1/tests/services/lib.sh"; svc_free_port' _ "$root")
# drain WAY URL PREPARE [POOL_DIR]: one drain; prints WAY, WAL bytes,
# Postgres CPU us and the CPU us of the PgBouncer in POOL_DIR (default
# the first) per event, then the statements' planning and execution ms
# per event.
drain() {
	local way=$1 url=$2 prepare=$3 pool_dir=${4:-$work/bouncer} bpid b0 sent deadline
	q -c "TRUNCATE outbox_events" \
		-c "INSERT INTO outbox_events (type, routing_key, payload) SELECT 'bench.event', 'bench',
		    decode(repeat(md5(g::text), 64), 'hex') FROM generate_series(1, $ROWS) g" \
		-c "VACUUM ANALYZE outbox_events" -c "CHECKPOINT" >/dev/null
	q -c "SELECT pg_stat_statements_reset()" >/dev/null
	bpid=$(cat "$pool_dir/pgbouncer.pid")
	shapes_mark
	b0=$(proc_cpu "$bpid")
	t0=$(date +%s%N)
	OUTBOX_DATABASE_URL=$url OUTBOX_PG_PREPARE=$prepare OUTBOX_RETENTION=$retention \
		OUTBOX_PUBLISHER=stdout OUTBOX_WORKERS=${WORKERS:-4} OUTBOX_BATCH_SIZE=100 OUTBOX_LISTEN=off \
		OUTBOX_HTTP_ADDR=127.0.0.1:$port OUTBOX_CE_SOURCE=/bench \
		"$RELAY_TEST_BIN" run >/dev/null 2>"$work/relay-$way.log" &
	relay_pid=$!
	deadline=$((SECONDS + 60 + ROWS / 100))
	sent=0
	while [ "$sent" -lt "$ROWS" ]; do
		kill -0 "$relay_pid" 2>/dev/null || { cat "$work/relay-$way.log" >&2; exit 1; }
		[ $SECONDS -lt $deadline ] || { echo "pooler_cost.sh: $way sent $sent of $ROWS in time" >&2; exit 1; }
		sleep 0.05
		sent=$(curl -fs "http://127.0.0.1:$port/metrics" 2>/dev/null |
			sed -n 's/^outbox_events_total{outcome="sent",class="none"} //p')
		sent=${sent%.*}
		sent=${sent:-0}
	done
	t1=$(date +%s%N)
	sleep 0.5
	kill -TERM "$relay_pid"
	wait "$relay_pid" || { cat "$work/relay-$way.log" >&2; exit 1; }
	relay_pid=
	shapes_since
	awk -v w="$way" -v wal="$wal" -v t="$ticks" -v b=$(($(proc_cpu "$bpid") - b0)) \
		-v tk="$tk" -v n="$ROWS" -v s=$(((t1 - t0) / 1000000)) 'BEGIN {
		printf "%-8s %8.0f %8.1f %8.1f %8.0f", w, wal / n, t * 1e6 / tk / n,
		b * 1e6 / tk / n, n * 1000 / s }'
	q -c "SELECT to_char(sum(total_plan_time) * 1000 / $ROWS, 'FM990.0'),
	             to_char(sum(total_exec_time) * 1000 / $ROWS, 'FM990.0')
	      FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
	      AND query NOT LIKE '%outbox_events (type%' AND query NOT LIKE 'VACUUM%'
	      AND query NOT LIKE 'CHECKPOINT%' AND query NOT LIKE 'TRUNCATE%'" |
		awk -F'|' '{ printf " %10s %10s\n", $1, $2 }'
	[ -z "${STATEMENTS:-}" ] || q -c "SELECT calls, plans, to_char(total_plan_time * 1000 / $ROWS, 'FM990.0'),
	             to_char(total_exec_time * 1000 / $ROWS, 'FM990.0'), left(query, 60)
	      FROM pg_stat_statements ORDER BY total_plan_time + total_exec_time DESC LIMIT 8" >&2
}
echo "history: ${HISTORY:-0}, $ROWS rows, $ROUNDS rounds"
echo "way      WAL B/ev PG us/ev bncr us/ev  rows/s  plan us/ev exec us/ev"
for r in $(seq "$ROUNDS"); do
	# Every other round in reverse, so that drift hits each way alike.
	order=("${ways[@]}")
	[ $((r % 2)) = 1 ] || for i in "${!ways[@]}"; do
		order[i]=${ways[${#ways[@]} - 1 - i]}
	done
	for way in "${order[@]}"; do
		case $way in
		direct) drain direct "$RELAY_TEST_DATABASE_URL" on ;;
		unnamed) drain unnamed "$RELAY_TEST_DATABASE_URL" off ;;
		pooler) drain pooler "$bouncer_url" off ;;
		pooled) drain pooled "$bouncer_url" pooled ;;
		keeps) drain keeps "$later_url" on "$work/later" ;;
		esac
	done
done
