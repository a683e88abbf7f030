#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What one run of the sweeper's head repair costs Postgres in ordered mode
# with a backlog (docs/benchmark.md, "The repair's scan"). An experiment,
# not a target: on the table `outbox-relay migrate` makes, N pending 1 KB
# keyed rows over K keys, each key's first row head (what the
# classification leaves; the rows behind stay unclassified), vacuumed.
# The repair finds no lost head there, which is its usual sweep. Both
# statements are timed with EXPLAIN ANALYZE, three times each, median:
#   probe  the statement up to 2c6534f: every pending row that is not head
#          is read and asked, by a probe of key_idx, whether an older live
#          row of its key exists;
#   walk   the statement since: a recursive walk from key to key along
#          key_idx that reads each key's first live row only, at most
#          10,000 keys a sweep (the next sweep goes on from there), run
#          as the relay runs it, a prepared statement on its generic plan.
# Usage: RELAY_TEST_BIN=build/outbox-relay tests/bench/repair_scan.sh [rows] [keys]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROWS=${1:-200000}
KEYS=${2:-1000}
. "$root/tests/bench/experiment_lib.sh"
q -c "INSERT INTO outbox_events (type, partition_key, payload, head)
      SELECT 'bench.event', 'k' || (g % $KEYS),
             decode(repeat(md5(g::text), 64), 'hex'),
             CASE WHEN g <= $KEYS THEN true END
      FROM generate_series(1, $ROWS) g" -c "VACUUM ANALYZE outbox_events"
T=outbox_events
B=outbox_events_blocked_keys
declare -A stmt
stmt[probe]="SELECT DISTINCT ON (partition_key) id FROM $T t WHERE status =
 'pending' AND head IS NOT true AND partition_key IS NOT NULL AND NOT EXISTS
 (SELECT 1 FROM $T o WHERE o.partition_key = t.partition_key AND o.seq <
 t.seq AND o.status IN ('pending', 'in_flight')) AND NOT EXISTS (SELECT 1
 FROM $B b WHERE b.partition_key = t.partition_key) ORDER BY partition_key,
 seq LIMIT 1000"
# The relay's statement (sql_repair) without its UPDATE: the heads found.
walk="WITH RECURSIVE first AS ((SELECT partition_key, id, status, head, 1 AS
 n FROM $T WHERE status IN ('pending', 'in_flight') AND partition_key IS NOT
 NULL AND partition_key >= \$1::text ORDER BY partition_key, seq LIMIT 1)
 UNION ALL SELECT x.partition_key, x.id, x.status, x.head, f.n + 1 FROM
 first f CROSS JOIN LATERAL (SELECT o.partition_key, o.id, o.status, o.head
 FROM $T o WHERE o.status IN ('pending', 'in_flight') AND o.partition_key IS
 NOT NULL AND o.partition_key > f.partition_key ORDER BY o.partition_key,
 o.seq LIMIT 1) x WHERE f.n < \$2::int) SELECT f.id FROM first f WHERE
 f.status = 'pending' AND f.head IS NOT true AND NOT EXISTS (SELECT 1 FROM $B
 b WHERE b.partition_key = f.partition_key)"
stmt[walk]="EXECUTE walk('', 10000)"
# One line per run: execution ms, shared buffers touched, rows found.
measure() {
	q -c "SET plan_cache_mode = force_generic_plan" \
		-c "PREPARE walk(text, int) AS $walk" \
		-c "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) $1" | python3 -c '
import json, sys
p = json.load(sys.stdin)[0]
top = p["Plan"]
print("%.1f %d %d" % (p["Execution Time"],
    top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
    top["Actual Rows"]))'
}
echo "rows=$ROWS keys=$KEYS"
for name in probe walk; do
	runs=$(for _ in 1 2 3; do measure "${stmt[$name]}"; done | sort -n)
	read -r ms bufs found <<<"$(sed -n 2p <<<"$runs")"
	echo "$name: ${ms} ms, $bufs buffers, $found lost heads (median of 3)"
done
