#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What the mark to sent costs, part by part, on the daily partition of a
# table keeping history (docs/benchmark.md, "What the mark to sent
# costs"). An experiment, not a target: on a table made by the binary's
# `migrate --partition`, with today's partition made as the dbcost
# section makes it (the storage parameters the binary gave tomorrow's),
# N pending 1 KB rows, filled, vacuumed and checkpointed, a pgbench
# client locks 100 rows (FOR NO KEY UPDATE SKIP LOCKED), marks them by
# ctid and id as the relay's marks name them, and commits, until none is
# left; CLIENTS of them at once (1; the relay's workers are 4 in the
# dbcost section, and the mark's cost grows with them). Cases, each on a
# table of its own:
#   delete     DELETE: the relay without history;
#   mark       the relay's mark to sent (statements.c sql_sent): status,
#              finished_at and the attempt's charge (attempts, suspect,
#              lease_id, leased_by, leased_at, relay_source);
#   sent       UPDATE of status and finished_at only;
#   sent-t     the same without the terminal index;
#   sent-tc    and without the table's CHECK constraints;
#   apart      the pending rows kept apart: the events table with its
#              primary key only, a narrow table of pending ids (id,
#              next_attempt_at, seq) that the producer's insert also
#              fills; the drain locks pending ids, deletes them, and
#              marks the event sent as the relay's mark does, an update
#              no index sees (HOT).
#   hot        one table, every mark HOT: the primary key and one index
#              on (next_attempt_at, seq) that names no column the mark
#              writes, so sent rows keep their entries in it; the lock
#              scan starts at the lowest (next_attempt_at, seq) of the
#              client's previous batch (the relay's scan floor) and
#              steps over the entries of rows sent since, filtered by
#              status on the heap.
# Prints, per event, the fill's (the producers' inserts) and the
# drain's WAL bytes and Postgres CPU µs and the share of the drain's
# updates that were HOT, each round, then the median of the rounds and
# the drain's and the whole's CPU against delete's.
# HEADERS=1 gives every row two headers, as a traced producer writes them
# (traceparent, a tenant): the fill then measures the headers CHECK.
# Usage: RELAY_TEST_BIN=build/outbox-relay tests/bench/mark_parts.sh [rows] [rounds] [clients] [cases]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROWS=${1:-20000}
ROUNDS=${2:-3}
CLIENTS=${3:-1}
CASES=${4:-"delete mark sent sent-t sent-tc apart hot"}
. "$root/tests/bench/experiment_lib.sh"

# Runs each statement the query $1 returns.
each() {
	printf '%s\n\\gexec\n' "$1" | q >/dev/null
}

# Case $1's table in schema $2, filled.
shape() {
	local c=$1 s=$2 t="$2.m"
	partitioned_today "$t"
	case $c in
	sent-t*) q -c "DROP INDEX $s.m_terminal_idx" >/dev/null ;;
	apart | hot)
		each "SELECT format('DROP INDEX %I.%I', schemaname, indexname)
		      FROM pg_indexes WHERE schemaname = '$s' AND tablename = 'm'
		      AND indexname <> 'm_pkey'"
		;;
	esac
	case $c in
	hot) q -c "CREATE INDEX ON $t (next_attempt_at, seq)" >/dev/null ;;
	apart)
		q -c "CREATE TABLE $s.p (id uuid PRIMARY KEY, next_attempt_at
		      timestamptz NOT NULL, seq bigint NOT NULL)" \
			-c "CREATE INDEX ON $s.p (next_attempt_at, seq)" >/dev/null
		;;
	esac
	case $c in
	sent-tc*)
		each "SELECT format('ALTER TABLE %s DROP CONSTRAINT %I', '$t',
		      conname) FROM pg_constraint WHERE conrelid = '$t'::regclass
		      AND contype = 'c'"
		;;
	esac
	local headers="'{}'::jsonb"
	[ "${HEADERS:-}" = 1 ] && headers="jsonb_build_object('traceparent',
	      '00-' || md5(g::text) || '-' || left(md5((-g)::text), 16) ||
	      '-01', 'tenant', 'tenant-' || g % 10)"
	local fill="INSERT INTO $t (type, routing_key, headers, payload) SELECT
	      'bench.event', 'bench', $headers,
	      decode(repeat(md5(g::text), 64), 'hex')
	      FROM generate_series(1, $ROWS) g"
	[ "$c" = apart ] && fill="WITH e AS ($fill RETURNING id, next_attempt_at,
	      seq) INSERT INTO $s.p SELECT * FROM e"
	q -c CHECKPOINT >/dev/null
	shapes_mark
	q -c "$fill" >/dev/null
	shapes_since
	fill_wal=$wal fill_ticks=$ticks
	q -c "VACUUM ANALYZE $t" -c CHECKPOINT >/dev/null
	[ "$c" != apart ] || q -c "VACUUM ANALYZE $s.p" >/dev/null
}

# Case $1's script for table $2.
script() {
	local c=$1 t=$2 done_sql lock
	local rows="t.ctid = ANY(:c::tid[]) AND t.id = ANY(:i::uuid[])"
	lock="FROM (SELECT ctid, id FROM $t WHERE status = 'pending' ORDER BY
		next_attempt_at, seq LIMIT 100 FOR NO KEY UPDATE SKIP LOCKED) x"
	case $c in
	delete) done_sql="DELETE FROM $t AS t WHERE $rows;" ;;
	mark | apart | hot) done_sql="UPDATE $t AS t SET status = 'sent', finished_at =
		statement_timestamp(), attempts = t.attempts + 1, suspect = false,
		lease_id = '$(q -c "SELECT gen_random_uuid()")', leased_by =
		'bench', leased_at = now(), relay_source = coalesce(t.relay_source,
		CASE WHEN t.source IS NULL THEN '/bench' END) WHERE $rows;" ;;
	*) done_sql="UPDATE $t AS t SET status = 'sent', finished_at =
		statement_timestamp() WHERE $rows;" ;;
	esac
	if [ "$c" = hot ]; then
		lock="FROM (SELECT ctid, id, next_attempt_at, seq FROM $t WHERE
			status = 'pending' AND (next_attempt_at, seq) >= (:fa, :fs)
			ORDER BY next_attempt_at, seq LIMIT 100 FOR NO KEY UPDATE SKIP
			LOCKED) x"
		printf '%s\n' "BEGIN;" \
			"SELECT coalesce(array_agg(ctid)::text, '{}') AS c," \
			"coalesce(array_agg(id)::text, '{}') AS i," \
			"coalesce((array_agg(next_attempt_at ORDER BY next_attempt_at," \
			"seq))[1], '-infinity') AS fa, coalesce((array_agg(seq ORDER BY" \
			"next_attempt_at, seq))[1], 0) AS fs $lock" '\gset' \
			"$done_sql" "COMMIT;"
		return
	fi
	if [ "$c" = apart ]; then
		lock="FROM (SELECT e.ctid, e.id FROM (SELECT id FROM ${t%.m}.p
			ORDER BY next_attempt_at, seq LIMIT 100 FOR UPDATE SKIP
			LOCKED) y JOIN $t e USING (id)) x"
		done_sql="DELETE FROM ${t%.m}.p WHERE id = ANY(:i::uuid[]);
		$done_sql"
	fi
	printf '%s\n' "BEGIN;" \
		"SELECT coalesce(array_agg(ctid)::text, '{}') AS c," \
		"coalesce(array_agg(id)::text, '{}') AS i $lock" '\gset' \
		"$done_sql" "COMMIT;"
}

printf 'round\tcase\tfill_wal\tfill_cpu_us\tdrain_wal\tdrain_cpu_us\thot\n'
cell() {
	local round=$1 c=$2 n=$3 s left hot
	s="mark_parts_$n"
	shape "$c" "$s"
	script "$c" "$s.m" >"$work/$c.sql"
	shapes_mark
	"$PG_BIN/pgbench" -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -t $((ROWS / 100 / CLIENTS)) -D fa=-infinity -D fs=0 -f "$work/$c.sql" >/dev/null 2>"$work/err" ||
		{ head -c 600 "$work/err" >&2; exit 1; }
	shapes_since
	left=$(q -c "SELECT count(*) FROM $s.m WHERE status = 'pending'")
	[ "$left" = 0 ] || { echo "mark_parts.sh: $c left $left rows pending" >&2; exit 1; }
	hot=$(q -c "SELECT coalesce(round(sum(n_tup_hot_upd) / nullif(sum(n_tup_upd), 0), 2), 0)
	            FROM pg_stat_user_tables WHERE schemaname = '$s' AND relname LIKE 'm_p%'")
	q -c "SET client_min_messages = warning" -c "DROP SCHEMA $s CASCADE" >/dev/null
	awk -v r="$round" -v c="$c" -v n="$ROWS" -v fw="$fill_wal" -v ft="$fill_ticks" \
		-v w="$wal" -v t="$ticks" -v tk="$tk" -v h="$hot" \
		'BEGIN { printf "%s\t%s\t%.0f\t%.1f\t%.0f\t%.1f\t%s\n", r, c, fw / n,
		         ft / tk * 1e6 / n, w / n, t / tk * 1e6 / n, h }' |
		tee -a "$work/rows"
}
each_cell "$CASES" cell
python3 - "$work/rows" "$CASES" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
cases = sys.argv[2].split()
med = {c: [statistics.median(float(r[j]) for r in rows if r[1] == c)
           for j in range(2, 7)] for c in cases}
print("\nmedian of the rounds")
print("case\tfill_wal\tfill_cpu_us\tdrain_wal\tdrain_cpu_us\thot"
      "\tdrain_cpu_over_delete\twhole_cpu_over_delete")
d = med[cases[0]]
for c in cases:
    m = med[c]
    print("%s\t%.0f\t%.1f\t%.0f\t%.1f\t%.2f\t%+.1f\t%+.1f" % (
        c, m[0], m[1], m[2], m[3], m[4], m[3] - d[3],
        m[1] + m[3] - d[1] - d[3]))
PY
