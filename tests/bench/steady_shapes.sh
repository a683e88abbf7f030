#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What the partitioned table costs the relay at a steady rate, against
# the plain table (docs/benchmark.md, "A held snapshot on the partitioned
# table"). An experiment, not a target: for each round, each shape in
# turn on a table of its own, the relay (2 workers, publisher stdout)
# beside producers at RATE events/s of 512 bytes (pgbench, 2 clients);
# after a 10 s warm-up, WINDOW seconds measured: the Postgres CPU of the
# relay's sessions per event it counted sent, and from
# pg_stat_statements the server time of its statements per event (the
# producers' insert left out).
# Shapes:
#   plain        the migrated table;
#   partitioned  made by the binary's `migrate --partition` (the default
#                partition and the next 2 days'), with the day's
#                partition made ahead as dbcost makes it, so the events
#                land there: 4 partitions;
#   partitioned+N  the same with N more partitions of days past, as a
#                table keeping history for N days has.
# RETENTION is the relays' OUTBOX_RETENTION (0: no history).
# Usage: RELAY_TEST_BIN=build/outbox-relay tests/bench/steady_shapes.sh [rounds] [retention] [shapes]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROUNDS=${1:-3}
RETENTION=${2:-24h}
SHAPES=${3:-"plain partitioned"}
RATE=${RATE:-1000}
WINDOW=${WINDOW:-40}
. "$root/tests/bench/experiment_lib.sh"
psql -qAt -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'" >/dev/null
bash "$root/tests/services/postgres.sh" restart "$work/pg" >/dev/null
q -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null

# A UUIDv7 prefix of the time expression $1, as dbcost makes its bounds.
v7() {
	q -c "SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) ||
	      '-0000-0000-000000000000' FROM (SELECT lpad(to_hex((extract(epoch
	      FROM $1) * 1000)::bigint), 12, '0') AS h) x"
}

# Makes table $2 of shape $1.
make_table() {
	local shape=$1 t=$2 days k
	OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_TABLE=$t \
		OUTBOX_LISTEN=off "$RELAY_TEST_BIN" migrate >/dev/null
	[ "$shape" = plain ] && return 0
	OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_TABLE=$t \
		OUTBOX_LISTEN=off "$RELAY_TEST_BIN" migrate --partition >/dev/null
	q -c "CREATE TABLE ${t}_pnow PARTITION OF $t FOR VALUES FROM
	      ('$(v7 "now()")') TO ('$(v7 "now() + interval '20 minutes'")')
	      WITH (fillfactor = 50)"
	days=0
	case $shape in partitioned+*) days=${shape#partitioned+} ;; esac
	for k in $(seq 1 "$days"); do
		q -c "CREATE TABLE ${t}_past$k PARTITION OF $t FOR VALUES FROM
		      ('$(v7 "date_trunc('day', now()) - interval '$k days'")') TO
		      ('$(v7 "date_trunc('day', now()) - interval '$((k - 1)) days'")')"
	done
}

sent() {
	curl -s "127.0.0.1:$1/metrics" |
		awk -F' ' '$1 == "outbox_events_total{outcome=\"sent\",class=\"none\"}" {print $2}'
}

for round in $(seq 1 "$ROUNDS"); do
	for shape in $SHAPES; do
		schema="steady_$(echo "$shape" | tr -c 'a-z0-9\n' '_')"
		t=$schema.outbox_events
		q -c "DROP SCHEMA IF EXISTS $schema CASCADE" 2>/dev/null
		make_table "$shape" "$t"
		parts=$(q -c "SELECT count(*) FROM pg_partition_tree('$t') WHERE isleaf")
		echo "INSERT INTO $t (type, routing_key, payload) VALUES ('bench.event',
		      'bench', decode(repeat(md5(random()::text), 32), 'hex'));" >"$work/ins.sql"
		port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
		OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_TABLE=$t \
			OUTBOX_PUBLISHER=stdout OUTBOX_WORKERS=2 OUTBOX_LISTEN=off \
			OUTBOX_HTTP_ADDR=127.0.0.1:$port OUTBOX_RETENTION=$RETENTION \
			OUTBOX_CE_SOURCE=/steady "$RELAY_TEST_BIN" run >/dev/null 2>"$work/relay.log" &
		relay=$!
		"$PG_BIN/pgbench" -n -M prepared -c 2 -j 1 -R "$RATE" -T $((WINDOW + 15)) \
			-f "$work/ins.sql" >/dev/null 2>"$work/pgbench.log" &
		producers=$!
		sleep 10
		q -c "SELECT pg_stat_statements_reset()" >/dev/null
		c0=$(relay_ticks)
		s0=$(sent "$port")
		sleep "$WINDOW"
		c1=$(relay_ticks)
		s1=$(sent "$port")
		stmt=$(q -c "SELECT coalesce(sum(total_exec_time + total_plan_time), 0)
		             FROM pg_stat_statements WHERE query NOT LIKE 'INSERT INTO%'
		             AND query NOT LIKE '%pg_stat_statements%'")
		wait "$producers" || true
		kill "$relay"
		wait "$relay" || true
		python3 -c "
n = int(float('$s1') - float('$s0'))
print('round $round, $shape ($parts partitions), retention $RETENTION: '
      '%d events; Postgres CPU of the relay sessions %.1f us/event; '
      'its statements %.1f us/event' % (n, ($c1 - $c0) * 1e6 / $tk / n,
      $stmt * 1e3 / n))"
		q -c "DROP SCHEMA $schema CASCADE" 2>/dev/null
	done
done
