#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The outbox carried to another cluster by logical replication, as a
# blue-green upgrade carries it (docs/runbook.md, "Restores and
# upgrades"). Logical replication copies rows, not sequences: on the new
# cluster seq's sequence starts again at 1 below the copied rows, and
# producers there would write seqs that ordered mode reads as older than
# the rows already waiting. A relay in ordered mode refuses such a table;
# `migrate` on the copy moves the sequence past them and says so; the
# relay then sends each key's copied events before the ones written on
# the new cluster.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
export OUTBOX_TABLE=outbox_events

it_cluster
blue=$it_cluster_url
# Logical decoding on the old cluster: wal_level needs a restart.
echo "wal_level = logical" >>"$(sed -n 's/^PG_DATA=//p' "$it_cluster_dir/env")/postgresql.conf"
bash "$RELAY_TEST_SOURCE_ROOT/tests/services/postgres.sh" restart "$it_cluster_dir" >/dev/null ||
	it_fail "the old cluster did not restart"
it_cluster
green=$it_cluster_url
blue_port=$(sed -n 's/^PGPORT=//p' "${it_clusters[0]}/env")
psql_on() { # URL SQL (notices of CREATE and DROP SUBSCRIPTION left out)
	PGOPTIONS="-c client_min_messages=warning" psql "$1" -X -A -t -q -v ON_ERROR_STOP=1 -c "$2"
}
for url in "$blue" "$green"; do
	env OUTBOX_DATABASE_URL="$url" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate.out" 2>&1 ||
		it_fail "migrate: $(cat "$it_dir/migrate.out")"
done

keyed() { # TYPE FROM TO: keyed events n = FROM..TO over keys k0..k9
	it_keyed_sql "$OUTBOX_TABLE" "$1" "$2" "$3" 10 k
}
psql_on "$blue" "$(keyed blue 1 200)"
psql_on "$blue" "CREATE PUBLICATION outbox_move FOR TABLE $OUTBOX_TABLE"
psql_on "$green" "CREATE SUBSCRIPTION outbox_move
  CONNECTION 'host=127.0.0.1 port=$blue_port dbname=outbox user=outbox password=outbox-test-secret'
  PUBLICATION outbox_move"
psql_on "$blue" "$(keyed blue 201 300)"
copied() {
	[ "$(psql_on "$green" "SELECT count(*) FROM $OUTBOX_TABLE")" = 300 ]
}
it_wait 60 "the 300 rows copied to the new cluster" copied
# The switch: the old cluster's producers stopped, the subscription gone.
psql_on "$green" "DROP SUBSCRIPTION outbox_move"
last=$(psql_on "$green" "SELECT coalesce(pg_sequence_last_value(
  pg_get_serial_sequence('$OUTBOX_TABLE', 'seq')), 0)")
[ "$last" -lt 300 ] || it_fail "the copy's sequence came along ($last): nothing to show"

# Before migrate: an ordered relay refuses the copy, sending nothing.
if env OUTBOX_DATABASE_URL="$green" OUTBOX_HTTP_ADDR= OUTBOX_PUBLISHER=stdout \
	OUTBOX_ORDERING=partition timeout 30 "$RELAY_TEST_BIN" run \
	>"$it_dir/refused.out" 2>"$it_dir/refused.log"; then
	it_fail "an ordered relay ran on the copy before migrate"
fi
grep -q "has rows up to seq 300 past its sequence, at $last .*run \`outbox-relay migrate\`" \
	"$it_dir/refused.log" || it_fail "the ordered relay did not say why: $(tail -3 "$it_dir/refused.log")"
[ ! -s "$it_dir/refused.out" ] || it_fail "the refused relay published"

env OUTBOX_DATABASE_URL="$green" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate.out" 2>&1 ||
	it_fail "migrate on the copy: $(cat "$it_dir/migrate.out")"
grep -q "^seq: its sequence was at $last, behind rows up to 300 .*; moved to 300$" \
	"$it_dir/migrate.out" || it_fail "migrate did not say it moved the sequence: $(cat "$it_dir/migrate.out")"
env OUTBOX_DATABASE_URL="$green" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate.out" 2>&1 ||
	it_fail "migrate again: $(cat "$it_dir/migrate.out")"
! grep -q "^seq:" "$it_dir/migrate.out" || it_fail "a second migrate moved the sequence again"

psql_on "$green" "$(keyed green 301 400)"
low=$(psql_on "$green" "SELECT min(seq) FROM $OUTBOX_TABLE WHERE type = 'green'")
[ "$low" -gt 300 ] || it_fail "a row written on the new cluster has seq $low, below the copied rows"

log="$it_dir/deliveries.jsonl"
env OUTBOX_DATABASE_URL="$green" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR= \
	OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" OUTBOX_ORDERING=partition \
	OUTBOX_POLL_INTERVAL=100ms OUTBOX_LOG_FORMAT=json \
	"$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/relay.log" &
relay=$!
it_pids+=("$relay")
sent() {
	[ "$(psql_on "$green" "SELECT count(*) FROM $OUTBOX_TABLE WHERE status = 'sent'")" = 400 ]
}
it_wait 60 "the 400 events sent from the new cluster" sent
it_stop "$relay"
# Each key's deliveries in payload order: the copied events (n 1..300)
# before those written on the new cluster (n 301..400).
psql_on "$green" "SELECT concat_ws(E'\\t', id, partition_key,
  convert_from(payload, 'UTF8')::jsonb ->> 'n') FROM $OUTBOX_TABLE" >"$it_dir/rows.tsv"
jq -r '.id' "$log" >"$it_dir/delivered.ids"
violations=$(awk -F'\t' 'NR == FNR { key[$1] = $2; n[$1] = $3 + 0; next }
	!seen[$1]++ { k = key[$1]; if ((k in last) && n[$1] <= last[k]) bad++; last[k] = n[$1] }
	END { print bad + 0 }' "$it_dir/rows.tsv" "$it_dir/delivered.ids")
[ "$violations" = 0 ] || it_fail "$violations events went out before an older event of their key"
echo "ok: 300 rows copied by logical replication, the sequence moved from $last to 300 by migrate," \
	"100 more written on the new cluster after them; 400 sent in key order"
