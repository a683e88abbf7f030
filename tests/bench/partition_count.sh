#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What the partitioned table costs the relay keeping history, by the
# number of partitions it has (docs/benchmark.md, "What the partitioned
# table costs"). An experiment, not a target: the table made by the
# binary's `migrate --partition` (the default partition and two days
# made ahead), a partition of today made as the dbcost section makes it,
# and, for each count in PASTS, that many partitions of past days, as
# retention of that many days keeps them, empty here (their sent rows
# are in no pending index; the lease reads every partition's either
# way). N pending 1 KB rows, filled, vacuumed and checkpointed, drained
# by the relay (publisher stdout, 4 workers, batch 100, history kept
# for 8 days, so the cleaner drops no partition, LISTEN off) until every
# row is sent, then stopped; WAL bytes and Postgres CPU µs per event from
# the relay's start to after its stop, each round, then the median of
# the rounds and its ratio to the first count's.
# Usage: RELAY_TEST_BIN=build/outbox-relay tests/bench/partition_count.sh [rows] [rounds] [pasts]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROWS=${1:-20000}
ROUNDS=${2:-3}
PASTS=${3:-"0 7"}
. "$root/tests/bench/experiment_lib.sh"

# Table $1 with $2 partitions of past days beside today's, filled.
shape() {
	local t=$1 k=$2 d
	partitioned_today "$t"
	for d in $(seq "$k"); do
		q -c "CREATE TABLE ${t}_p$(q -c "SELECT to_char(now() AT TIME ZONE
		      'UTC' - interval '$d days', 'YYYYMMDD')") PARTITION OF $t FOR
		      VALUES FROM ('$(v7 "date_trunc('day', now() AT TIME ZONE
		      'UTC' - interval '$d days') AT TIME ZONE 'UTC'")') TO
		      ('$(v7 "date_trunc('day', now() AT TIME ZONE 'UTC' - interval
		      '$((d - 1)) days') AT TIME ZONE 'UTC'")')" >/dev/null
	done
	q -c "INSERT INTO $t (type, routing_key, payload) SELECT 'bench.event',
	      'bench', decode(repeat(md5(g::text), 64), 'hex')
	      FROM generate_series(1, $ROWS) g" \
		-c "VACUUM ANALYZE $t" -c CHECKPOINT >/dev/null
}

printf 'round\tpast_days\tpartitions\twal\tcpu_us\n'
cell() {
	local round=$1 k=$2 n=$3 t parts relay left
	t="partition_count_$n.m"
	shape "$t" "$k"
	parts=$(q -c "SELECT count(*) FROM pg_inherits WHERE inhparent = '$t'::regclass")
	shapes_mark
	OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_TABLE=$t \
		OUTBOX_PUBLISHER=stdout OUTBOX_WORKERS=4 OUTBOX_BATCH_SIZE=100 \
		OUTBOX_RETENTION=8d OUTBOX_LISTEN=off OUTBOX_CE_SOURCE=/bench \
		"$RELAY_TEST_BIN" run >/dev/null 2>"$work/relay.log" &
	relay=$!
	for _ in $(seq 600); do
		[ "$(q -c "SELECT count(*) FROM $t WHERE status <> 'sent'")" = 0 ] && break
		sleep 0.2
	done
	kill -TERM "$relay"
	wait "$relay" || { tail -5 "$work/relay.log" >&2; exit 1; }
	left=$(q -c "SELECT count(*) FROM $t WHERE status <> 'sent'")
	[ "$left" = 0 ] || { echo "partition_count.sh: $left rows not sent after 120 s" >&2; exit 1; }
	shapes_since
	q -c "SET client_min_messages = warning" -c "DROP SCHEMA ${t%.m} CASCADE" >/dev/null
	awk -v r="$round" -v k="$k" -v p="$parts" -v n="$ROWS" -v w="$wal" \
		-v t="$ticks" -v tk="$tk" 'BEGIN { printf "%s\t%s\t%s\t%.0f\t%.1f\n",
		r, k, p, w / n, t / tk * 1e6 / n }' | tee -a "$work/rows"
}
each_cell "$PASTS" cell
python3 - "$work/rows" "$PASTS" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
pasts = sys.argv[2].split()
print("\nmedian of the rounds")
print("past_days\tpartitions\twal\tcpu_us\tcpu_over_first")
first = None
for k in pasts:
    mine = [r for r in rows if r[1] == k]
    wal = statistics.median(float(r[3]) for r in mine)
    cpu = statistics.median(float(r[4]) for r in mine)
    first = first or cpu
    print("%s\t%s\t%.0f\t%.1f\t%.2f" % (k, mine[0][2], wal, cpu, cpu / first))
PY
