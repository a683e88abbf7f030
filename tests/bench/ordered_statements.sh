#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Where the relay's Postgres time goes, statement by statement, ordered
# and unordered (docs/benchmark.md, "Ordered mode: where the lease's reads
# go"). An experiment, not a target: ROWS pending 1 KB rows of KEYS keys
# (1,000 by default, the rows spread evenly) are drained by WORKERS
# workers (publisher stdout, batches of 100), once per variant;
# pg_stat_statements (planning tracked) gives each statement's execution
# and planning ms, calls, buffers a call and µs per event, and the WAL
# per event is read from the server. The drain is
# awaited by polling the table, whose queries are left out.
# Variants: ordered, unordered, ordered-nohistory, unordered-nohistory,
# and any of them with -partitioned: the table made partitioned by the
# day as the dbcost section makes it (partitioned_today, a table of its
# own each time). The table is migrated again before each variant with its
# OUTBOX_RETENTION, as its deployment would migrate it (the pages' room,
# migrate_room.c). With PERF=1, perf samples every CPU during each drain
# and the Postgres processes' functions with the most samples are listed
# (sample counts compare across variants: the same frequency).
# Usage: [ROWS=N] [KEYS=N] [PERF=1] RELAY_TEST_BIN=build/outbox-relay tests/bench/ordered_statements.sh [workers] [variant...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORKERS=${1:-1}
shift || true
VARIANTS=("$@")
[ ${#VARIANTS[@]} -gt 0 ] || VARIANTS=(ordered unordered ordered unordered)
ROWS=${ROWS:-20000}
KEYS=${KEYS:-1000}
PERF=${PERF:-0}
[ "$WORKERS" -ge 1 ] && [ "$WORKERS" -le 16 ] ||
	{ echo "ordered_statements.sh: workers must be 1..16" >&2; exit 2; }
[[ "$ROWS" =~ ^[0-9]+$ ]] && [ "$ROWS" -ge 1000 ] && [ "$ROWS" -le 1000000 ] ||
	{ echo "ordered_statements.sh: ROWS must be 1000..1000000" >&2; exit 2; }
[[ "$KEYS" =~ ^[0-9]+$ ]] && [ "$KEYS" -ge 1 ] && [ "$KEYS" -le "$ROWS" ] ||
	{ echo "ordered_statements.sh: KEYS must be 1..ROWS" >&2; exit 2; }
[ "$PERF" = 0 ] || { [ "$PERF" = 1 ] && command -v perf >/dev/null; } ||
	{ echo "ordered_statements.sh: PERF=1 needs perf (PERF is 0 or 1)" >&2; exit 2; }
# The drain is awaited 0.1 s at a time, 120 s for each 20,000 rows.
polls=$(((ROWS + 19999) / 20000 * 1200))
for v in "${VARIANTS[@]}"; do
	case ${v%-partitioned} in ordered | unordered | ordered-nohistory | unordered-nohistory) ;;
	*) echo "ordered_statements.sh: unknown variant '$v'" >&2; exit 2 ;;
	esac
done
. "$root/tests/bench/experiment_lib.sh"
statements_on
relay= sampler=
trap 'kill $relay $sampler 2>/dev/null || true; wait 2>/dev/null || true; bash "$root/tests/services/postgres.sh" stop "$work/pg" >/dev/null 2>&1; rm -rf "$work"' EXIT
cell=0
for v in "${VARIANTS[@]}"; do
	ordering=none retention=7d tbl=outbox_events
	case $v in ordered*) ordering=partition ;; esac
	case ${v%-partitioned} in *-nohistory) retention=0 ;; esac
	case $v in *-partitioned) cell=$((cell + 1)) tbl=outbox_parted$cell ;; esac
	OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_RETENTION=$retention \
		OUTBOX_TABLE=$tbl "$RELAY_TEST_BIN" migrate >/dev/null
	case $v in *-partitioned) OUTBOX_RETENTION=$retention partitioned_today $tbl ;; esac
	q -c "TRUNCATE $tbl" >/dev/null
	q -c "INSERT INTO $tbl (type, routing_key, partition_key, payload)
	  SELECT 'bench.event', 'bench', 'k' || (g % $KEYS), decode(repeat(md5(g::text), 32), 'hex')
	  FROM generate_series(1, $ROWS) g" >/dev/null
	q -c "VACUUM ANALYZE $tbl" -c "CHECKPOINT" >/dev/null
	q -c "SELECT pg_stat_statements_reset()" >/dev/null
	lsn=$(q -c "SELECT pg_current_wal_lsn()")
	if [ "$PERF" = 1 ]; then
		perf record -a -F 999 -o "$work/perf.data" >/dev/null 2>&1 &
		sampler=$!
	fi
	t0=$(date +%s%N)
	OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_PUBLISHER=stdout \
		OUTBOX_WORKERS="$WORKERS" OUTBOX_ORDERING=$ordering OUTBOX_RETENTION=$retention \
		OUTBOX_BATCH_SIZE=100 OUTBOX_HTTP_ADDR='' OUTBOX_CE_SOURCE=/bench OUTBOX_TABLE=$tbl \
		"$RELAY_TEST_BIN" run >/dev/null 2>"$work/relay.log" &
	relay=$!
	for _ in $(seq 1 $polls); do
		[ "$(q -c "SELECT count(*) FROM $tbl WHERE status = 'pending'")" = 0 ] && break
		kill -0 $relay 2>/dev/null || { cat "$work/relay.log" >&2; exit 1; }
		sleep 0.1
	done
	t1=$(date +%s%N)
	kill $relay
	wait $relay || true
	relay=
	if [ -n "$sampler" ]; then
		kill -INT $sampler
		wait $sampler || true
		sampler=
	fi
	left=$(q -c "SELECT count(*) FROM $tbl WHERE status = 'pending'")
	[ "$left" = 0 ] || { echo "ordered_statements.sh: $left rows left after $((polls / 10)) s" >&2; exit 1; }
	wal=$(q -c "SELECT pg_current_wal_lsn() - '$lsn'::pg_lsn")
	echo "== $v, $WORKERS worker(s): drained in $(((t1 - t0) / 1000000)) ms, WAL $((wal / ROWS)) bytes an event"
	echo "exec ms | plan ms | calls | buffers a call | exec µs an event | statement"
	q -F' | ' -c "SELECT round(total_exec_time)::int, round(total_plan_time)::int, calls,
	  (shared_blks_hit + shared_blks_read) / greatest(calls, 1),
	  round((total_exec_time * 1000 / $ROWS)::numeric, 1), left(regexp_replace(query, '\s+', ' ', 'g'), 60)
	  FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
	  AND query NOT LIKE 'SELECT count(*) FROM $tbl WHERE status%'
	  AND query NOT LIKE 'TRUNCATE%' AND query NOT LIKE 'INSERT INTO $tbl%'
	  ORDER BY total_exec_time DESC LIMIT 8"
	[ "$PERF" = 1 ] || continue
	echo "samples | function (Postgres processes, perf at 999 Hz; all of them: $(perf report \
		-i "$work/perf.data" --comm postgres --sort comm -n --stdio 2>/dev/null |
		awk '/^ +[0-9]/ {print $2}'))"
	perf report -i "$work/perf.data" --comm postgres --sort sym -n --stdio \
		--percent-limit 0.7 2>/dev/null | awk '/^ +[0-9]/ {print $2 " | " $NF}' | head -30
done
