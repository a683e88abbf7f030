#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What per-key order costs Postgres with and without a head marker
# (docs/benchmark.md, "Ordered mode: what a lease without a marker would
# buy"). An experiment, not a target: the floor statements of each way of
# leasing, on the table `outbox-relay migrate` makes, full-page writes on,
# N pending 1 KB rows over K keys (filled, vacuumed, checkpointed, as the
# dbcost section does), drained by 4 sessions, batches of 100:
#   U  unordered: lock the due rows in (next_attempt_at, seq) order;
#   H  the head marker: lock due unkeyed rows and heads (the ordered
#      index), and the statement that finishes them hands each key's
#      marker to its next live row; every key's first row starts as head;
#   K  a key lock: lock the first live row of each key, found by a skip
#      scan along the key index from where the session's last lease
#      stopped, only if it is pending and due. A key whose first row
#      another lease holds is skipped, so one row per key is out at a
#      time and no row is written to say so.
# Each finished with DELETE (no history, C) or UPDATE to sent (history's
# drain, D). Prints WAL bytes and Postgres CPU µs per event, two rounds.
# With HOLD=1 another session holds a REPEATABLE READ snapshot, taken
# after the fill, for the whole drain (a pg_dump, a report): no entry of
# a finished row can be removed meanwhile.
# Usage: RELAY_TEST_BIN=build/outbox-relay [HOLD=1] tests/bench/ordered_shapes.sh [rows] [keys] [cases]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROWS=${1:-20000}
KEYS=${2:-1000}
CASES=${3:-"U:C H:C K:C U:D H:D K:D"}
CL=4
. "$root/tests/bench/experiment_lib.sh"
t=outbox_events
q >/dev/null <<SQL
-- The candidates of each way: the ids a lease of batch rows would lock.
CREATE FUNCTION lease_u(batch int) RETURNS uuid[] LANGUAGE sql AS \$\$
  SELECT array(SELECT id FROM $t WHERE status = 'pending' AND NOT suspect
    AND next_attempt_at <= now() ORDER BY next_attempt_at, seq LIMIT batch
    FOR UPDATE SKIP LOCKED) \$\$;
CREATE FUNCTION lease_h(batch int) RETURNS uuid[] LANGUAGE sql AS \$\$
  SELECT array(SELECT id FROM $t WHERE status = 'pending'
    AND (partition_key IS NULL OR head) AND next_attempt_at <= now()
    ORDER BY next_attempt_at, seq LIMIT batch FOR UPDATE SKIP LOCKED) \$\$;
-- The skip scan: each step is the next key's first live row.
CREATE FUNCTION lease_k(batch int, after text) RETURNS uuid[] LANGUAGE sql AS \$\$
  WITH RECURSIVE k(pk, id, due, st) AS (
    (SELECT partition_key, id, next_attempt_at, status FROM $t
      WHERE status IN ('pending', 'in_flight') AND partition_key IS NOT NULL
        AND partition_key > after ORDER BY partition_key, seq LIMIT 1)
    UNION ALL
    SELECT n.* FROM k, LATERAL (SELECT partition_key, id, next_attempt_at,
        status FROM $t o WHERE o.status IN ('pending', 'in_flight')
        AND o.partition_key IS NOT NULL AND o.partition_key > k.pk
        ORDER BY o.partition_key, o.seq LIMIT 1) n)
  SELECT array(SELECT id FROM $t WHERE id IN (
      SELECT id FROM k WHERE st = 'pending' AND due <= now() LIMIT batch)
    AND status = 'pending' ORDER BY partition_key FOR UPDATE SKIP LOCKED) \$\$;
CREATE FUNCTION finish(ids uuid[], history bool, hand_over bool) RETURNS void
LANGUAGE plpgsql AS \$\$
DECLARE ks text[]; ss bigint[];
BEGIN
  SELECT array_agg(partition_key), array_agg(seq) INTO ks, ss FROM $t
    WHERE id = ANY(ids) AND partition_key IS NOT NULL;
  IF history THEN
    UPDATE $t SET status = 'sent', finished_at = now() WHERE id = ANY(ids);
  ELSE
    DELETE FROM $t WHERE id = ANY(ids);
  END IF;
  IF hand_over AND ks IS NOT NULL THEN
    UPDATE $t SET head = true WHERE id IN (
      SELECT (SELECT n.id FROM $t n WHERE n.partition_key = f.k
          AND n.status IN ('pending', 'in_flight') AND n.seq > f.s
        ORDER BY n.seq LIMIT 1)
      FROM unnest(ks, ss) AS f(k, s));
  END IF;
END \$\$;
-- One session's drain: leases until a lease from the first key finds
-- nothing (the table is drained, or its last rows are another's).
CREATE PROCEDURE drain(way text, history bool) LANGUAGE plpgsql AS \$\$
DECLARE ids uuid[]; after text := ''; last text;
BEGIN
  LOOP
    IF way = 'K' THEN
      ids := lease_k(100, after);
      SELECT max(partition_key) INTO last FROM $t WHERE id = ANY(ids);
    ELSIF way = 'H' THEN
      ids := lease_h(100);
    ELSE
      ids := lease_u(100);
    END IF;
    IF cardinality(ids) = 0 THEN
      EXIT WHEN way <> 'K' OR after = '';
      after := '';
      CONTINUE;
    END IF;
    IF way = 'K' THEN after := last; END IF;
    PERFORM finish(ids, history, way = 'H');
    COMMIT;
  END LOOP;
END \$\$;
SQL
printf 'case\twal\tcpu_us\tleft\n'
for round in 1 2; do
	for c in $CASES; do
		way=${c%%:*} v=${c#*:}
		q -c "TRUNCATE $t" -c "INSERT INTO $t (type, partition_key, payload) SELECT 'bench.event', 'k' || (g % $KEYS), decode(repeat(md5(g::text), 64), 'hex') FROM generate_series(1, $ROWS) g" >/dev/null
		[ "$way" = H ] && q -c "UPDATE $t SET head = true WHERE id IN (SELECT DISTINCT ON (partition_key) id FROM $t ORDER BY partition_key, seq)" >/dev/null
		q -c "VACUUM ANALYZE $t" -c CHECKPOINT >/dev/null
		hist=false
		[ "$v" = D ] && hist=true
		if [ "${HOLD:-0}" = 1 ]; then
			PGAPPNAME=holder q -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
				-c "SELECT count(*) FROM $t" -c "SELECT pg_sleep(3600)" >/dev/null 2>&1 &
			until [ "$(q -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'holder' AND backend_xmin IS NOT NULL")" = 1 ]; do
				sleep 0.1
			done
		fi
		shapes_mark
		pids=()
		for i in $(seq 1 $CL); do
			q -c "CALL drain('$way', $hist)" >"$work/err.$i" 2>&1 &
			pids+=($!)
		done
		for p in "${pids[@]}"; do
			wait "$p" || { head -c 600 "$work"/err.* >&2; exit 1; }
		done
		shapes_since
		if [ "${HOLD:-0}" = 1 ]; then
			q -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'holder'" >/dev/null
			wait
		fi
		left=$(q -c "SELECT count(*) FROM $t WHERE status = 'pending'")
		awk -v c="$c" -v r="$ROWS" -v w="$wal" -v t="$ticks" -v tk="$tk" -v l="$left" \
			'BEGIN { printf "%s\t%.0f\t%.1f\t%d\n", c, w / r, t / tk * 1e6 / r, l }'
	done
done
