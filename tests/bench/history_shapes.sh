#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What keeping history costs Postgres for several shapes of the outbox
# table (docs/benchmark.md, "History: what the table's shape would buy").
# An experiment, not a target: the floor statements of a table queue, run
# by pgbench on a copy of the table `outbox-relay migrate` makes, full-page
# writes on, N pending 1 KB rows (filled, vacuumed, checkpointed, as the
# dbcost section does):
#   C   lock, DELETE, commit: no history;
#   Dd  lock, UPDATE to sent, commit; then, after a VACUUM and a
#       CHECKPOINT, the sent rows deleted 1000 a transaction (the cleaner);
#   Dp  the same drain on a partitioned copy; then the partition dropped;
#   H   lock, DELETE, the deleted rows inserted into a history table of
#       their own (no index, a partition of history in effect), commit;
#       then that table dropped.
# Shapes: plain (as migrated), ffN (fillfactor N), part (range
# partitions on created_at, one partition), partffN, a trailing f (the
# terminal index narrowed to failed rows: a sent row then gets a primary
# key entry only), toast (payload STORAGE EXTERNAL, toast_tuple_target
# 128). Prints WAL bytes and Postgres CPU µs per event for the drain and
# for the whole life, two rounds.
# Usage: RELAY_TEST_BIN=build/outbox-relay tests/bench/history_shapes.sh [rows] [cases]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROWS=${1:-40000}
CASES=${2:-"plain:C plain:Dd ff70:C ff70:Dd part:C part:Dp partff70:Dp partff70f:Dp plain:H toast:C toast:Dd"}
CL=4
. "$root/tests/bench/experiment_lib.sh"
shape() {
	q -c "DROP TABLE IF EXISTS q CASCADE" >/dev/null
	case $1 in
	part*)
		q >/dev/null <<'SQL'
CREATE TABLE q (LIKE outbox_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS
  INCLUDING IDENTITY INCLUDING STORAGE) PARTITION BY RANGE (created_at);
CREATE TABLE q_1 PARTITION OF q FOR VALUES FROM (MINVALUE) TO (MAXVALUE);
ALTER TABLE q ADD PRIMARY KEY (id, created_at);
DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT indexdef FROM pg_indexes WHERE tablename = 'outbox_events'
           AND indexname <> 'outbox_events_pkey' LOOP
    EXECUTE replace(replace(r.indexdef, 'ON public.outbox_events', 'ON public.q'),
                    'INDEX outbox_events', 'INDEX q');
  END LOOP; END $$;
SQL
		;;
	*) q -c "CREATE TABLE q (LIKE outbox_events INCLUDING ALL)" >/dev/null ;;
	esac
	q -c "DROP TABLE IF EXISTS qh" -c "CREATE TABLE qh AS SELECT * FROM q WITH NO DATA" >/dev/null
	case $1 in
	ff[0-9]*) q -c "ALTER TABLE q SET (fillfactor = $(echo "$1" | tr -dc 0-9))" >/dev/null ;;
	partff*) q -c "ALTER TABLE q_1 SET (fillfactor = $(echo "$1" | tr -dc 0-9))" >/dev/null ;;
	esac
	case $1 in
	*f) q -c "DROP INDEX q_terminal_idx" \
		-c "CREATE INDEX q_terminal_idx ON q (status, finished_at) WHERE status = 'failed'" >/dev/null ;;
	toast) q -c "ALTER TABLE q ALTER payload SET STORAGE EXTERNAL" \
		-c "ALTER TABLE q SET (toast_tuple_target = 128)" >/dev/null ;;
	esac
}
due="FROM q WHERE status = 'pending' AND NOT suspect AND next_attempt_at <= now() ORDER BY next_attempt_at, seq LIMIT 100"
for v in C D H; do
	case $v in
	C) lock="FOR UPDATE" done_sql="DELETE FROM q WHERE id = ANY(:ids::uuid[]);" ;;
	D) lock="FOR NO KEY UPDATE" done_sql="UPDATE q SET status = 'sent', finished_at = now() WHERE id = ANY(:ids::uuid[]);" ;;
	H) lock="FOR UPDATE" done_sql="WITH d AS (DELETE FROM q WHERE id = ANY(:ids::uuid[]) RETURNING *) INSERT INTO qh SELECT * FROM d;" ;;
	esac
	printf '%s\n' "BEGIN;" "WITH d AS (SELECT id, payload $due $lock SKIP LOCKED)" \
		"SELECT coalesce(array_agg(id)::text, '{}') AS ids FROM d" '\gset' "$done_sql" "COMMIT;" >"$work/$v.sql"
done
printf 'case\tdrain_wal\tdrain_cpu_us\tlife_wal\tlife_cpu_us\n'
for round in 1 2; do
	for c in $CASES; do
		s=${c%%:*} v=${c#*:}
		shape "$s"
		q -c "INSERT INTO q (type, payload, routing_key) SELECT 'bench.event', decode(repeat(md5(g::text), 64), 'hex'), 'k' FROM generate_series(1, $ROWS) g" \
			-c "VACUUM ANALYZE q" -c CHECKPOINT >/dev/null
		shapes_mark
		"$PG_BIN/pgbench" -n -M prepared -c $CL -j $CL -t $((ROWS / 100 / CL)) -f "$work/${v:0:1}.sql" >/dev/null 2>"$work/err" ||
			{ head -c 600 "$work/err" >&2; exit 1; }
		shapes_since; dw=$wal dt=$ticks lw=0 lt=0
		if [ "$v" != C ]; then
			q -c "VACUUM q" -c CHECKPOINT >/dev/null
			shapes_mark
			case $v in
			Dd) q -c "DO \$\$ BEGIN LOOP DELETE FROM q WHERE id = ANY(ARRAY(SELECT id FROM q WHERE status = 'sent' ORDER BY status, finished_at LIMIT 1000)); EXIT WHEN NOT FOUND; COMMIT; END LOOP; END \$\$" >/dev/null ;;
			Dp) q -c "DROP TABLE q_1" >/dev/null ;;
			H) q -c "DROP TABLE qh" >/dev/null ;;
			esac
			shapes_since; lw=$wal lt=$ticks
		fi
		awk -v c="$c" -v r="$ROWS" -v dw="$dw" -v dt="$dt" -v lw="$lw" -v lt="$lt" -v tk="$tk" \
			'BEGIN { printf "%s\t%.0f\t%.1f\t%.0f\t%.1f\n", c, dw / r, dt / tk * 1e6 / r, (dw + lw) / r, (dt + lt) / tk * 1e6 / r }'
	done
done
