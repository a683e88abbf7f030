#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What turning a live outbox into a table partitioned by id takes
# (docs/design.md §11, "History within 1.3 × needs the partitioned
# table", the migration). An experiment, not a target: on the table
# `outbox-relay migrate` makes, N rows (a third pending, the rest sent;
# 1 % with ids a producer made itself, UUIDv4, the rest UUIDv7 of now),
# vacuumed; then, each step timed:
#   convert   one transaction: the table and its indexes renamed, a
#             table partitioned by range of id made LIKE it with the same
#             indexes (empty, so instant), the old table attached as its
#             DEFAULT partition; with and without restarting the new
#             table's identity after the old one's last seq
#   validate  a CHECK on the default that no row lies in the next two
#             hours' ids, added NOT VALID, then validated (a scan under
#             SHARE UPDATE EXCLUSIVE, which writes do not wait for)
#   implied   a partition for one of those hours, made beside the default
#             (Postgres skips the default's scan: implied by the CHECK)
#   scanned   a partition for the hour after, which no CHECK covers (the
#             default is scanned under its ACCESS EXCLUSIVE lock)
#   drop      a partition detached and dropped
# and where a row of each kind lands. Prints one line per step.
# Usage: RELAY_TEST_BIN=build/outbox-relay tests/bench/partition_convert.sh [rows]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROWS=${1:-300000}
. "$root/tests/bench/experiment_lib.sh"
v4=$((ROWS / 100))
# Two copies: converted without and with the identity restarted.
for s in s0 s1; do
	OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_TABLE=$s.outbox_events \
		"$RELAY_TEST_BIN" migrate >/dev/null
	q -c "SET search_path = $s" \
		-c "INSERT INTO outbox_events (type, payload, partition_key, status, finished_at)
      SELECT 'bench.event', decode(repeat(md5(g::text), 8), 'hex'), 'k' || (g % 1000),
             CASE WHEN g % 3 = 0 THEN 'pending' ELSE 'sent' END,
             CASE WHEN g % 3 = 0 THEN NULL ELSE now() END
      FROM generate_series(1, $((ROWS - v4))) g" \
		-c "INSERT INTO outbox_events (id, type, payload)
      SELECT gen_random_uuid(), 'bench.v4', decode(repeat(md5(g::text), 8), 'hex')
      FROM generate_series(1, $v4) g" -c "VACUUM ANALYZE outbox_events"
done
echo "rows $ROWS ($v4 UUIDv4), $(q -c "SELECT pg_size_pretty(pg_total_relation_size('s1.outbox_events'))") with indexes"
q -c "CREATE FUNCTION v7_floor(t timestamptz) RETURNS uuid LANGUAGE sql AS \$\$
  SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-0000-0000-000000000000')::uuid
  FROM (SELECT lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') AS h) x \$\$"
# step NAME SQL...: runs the statements in one psql with \timing, in
# schema s1, Postgres' DEBUG1 messages to NAME.err; prints the ms summed.
step() {
	local name=$1
	shift
	printf '%s\n' '\timing on' "SET search_path = ${schema:-s1};" \
		"SET client_min_messages = debug1;" "$@" >"$work/$name.sql"
	q -v ON_ERROR_STOP=1 -f "$work/$name.sql" 2>"$work/$name.err" |
		awk '/^Time: /{s += $2} END {printf "%.1f", s}'
}
implied() { grep -c 'implied by existing constraints' "$work/$1.err" || true; }
convert() { # $1: the schema; $2: restart the identity (1) or not (0)
	local restart=""
	[ "$2" = 1 ] && restart="EXECUTE format('ALTER TABLE outbox_events ALTER seq RESTART WITH %s',
                   (SELECT last_value + 1 FROM outbox_events_seq_seq));"
	schema=$1 ms=$(step "convert$2" "BEGIN;" "SET LOCAL lock_timeout = '1s';" \
		"ALTER TABLE outbox_events RENAME TO outbox_events_d0;" \
		"DO \$\$ DECLARE r record; BEGIN
  FOR r IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
           WHERE i.indrelid = 'outbox_events_d0'::regclass LOOP
    EXECUTE format('ALTER INDEX %I RENAME TO %I', r.relname, 'd0_' || r.relname);
  END LOOP; END \$\$;" \
		"CREATE TABLE outbox_events (LIKE outbox_events_d0 INCLUDING DEFAULTS
  INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING IDENTITY) PARTITION BY RANGE (id);" \
		"DO \$\$ DECLARE r record; BEGIN
  FOR r IN SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def, i.indisprimary
           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
           WHERE i.indrelid = 'outbox_events_d0'::regclass LOOP
    IF r.indisprimary THEN
      ALTER TABLE outbox_events ADD PRIMARY KEY (id);
    ELSE
      EXECUTE replace(replace(r.def, 'ON $1.outbox_events_d0', 'ON $1.outbox_events'),
                      'INDEX ' || r.relname, 'INDEX ' || substr(r.relname, 4));
    END IF;
  END LOOP; $restart END \$\$;" \
		"ALTER TABLE outbox_events ATTACH PARTITION outbox_events_d0 DEFAULT;" "COMMIT;")
	local seq
	q -c "SET search_path = $1" -c "SELECT outbox_events_enqueue('bench.after', '\\x7b7d'::bytea)" >/dev/null
	seq=$(q -c "SELECT seq FROM $1.outbox_events WHERE type = 'bench.after'")
	echo "convert (identity restarted: $2): $ms ms in one transaction; the next insert's seq $seq, the old table's last $ROWS; indexes valid: $(q -c "SELECT count(*) FILTER (WHERE indisvalid) || ' of ' || count(*) FROM pg_index WHERE indrelid = '$1.outbox_events'::regclass")"
}
convert s0 0
convert s1 1
hour="date_trunc('hour', now())"
lo=$(q -c "SELECT v7_floor($hour + interval '1 hour')")
mid=$(q -c "SELECT v7_floor($hour + interval '2 hour')")
hi=$(q -c "SELECT v7_floor($hour + interval '3 hour')")
far=$(q -c "SELECT v7_floor($hour + interval '4 hour')")
ms=$(step validate "ALTER TABLE outbox_events_d0 ADD CONSTRAINT d0_ahead CHECK (id < '$lo' OR id >= '$hi') NOT VALID;" \
	"ALTER TABLE outbox_events_d0 VALIDATE CONSTRAINT d0_ahead;")
echo "validate: $ms ms (the default's ids in those two hours: $(q -c "SELECT count(*) FROM s1.outbox_events_d0 WHERE id >= '$lo' AND id < '$hi'"))"
ms=$(step implied "CREATE TABLE outbox_events_p1 PARTITION OF outbox_events FOR VALUES FROM ('$lo') TO ('$mid');")
echo "implied: $ms ms, $(implied implied) 'implied' messages"
ms=$(step scanned "CREATE TABLE outbox_events_p3 PARTITION OF outbox_events FOR VALUES FROM ('$hi') TO ('$far');")
echo "scanned: $ms ms, $(implied scanned) 'implied' messages"
q -c "INSERT INTO s1.outbox_events (id, type, payload) VALUES
  ((substr('$lo', 1, 14) || '7000-8000-000000000001')::uuid, 'bench.next_hour', '\\x7b7d'),
  (gen_random_uuid(), 'bench.v4_after', '\\x7b7d')"
echo "where rows land: $(q -c "SELECT string_agg(type || ' ' || tableoid::regclass, ', ' ORDER BY type) FROM s1.outbox_events WHERE type IN ('bench.after', 'bench.next_hour', 'bench.v4_after')")"
ms=$(step drop "BEGIN;" "SET LOCAL lock_timeout = '1s';" \
	"ALTER TABLE outbox_events DETACH PARTITION outbox_events_p3;" \
	"DROP TABLE outbox_events_p3;" "COMMIT;")
echo "drop: $ms ms"
