#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The outbox's cluster upgraded in place by pg_upgrade (docs/runbook.md,
# "Restores and upgrades"; docs/design.md §4, "Claims from elsewhere").
# pg_upgrade carries the transaction counter and the commit log over, so
# the claims and the writers (written_by) of the old cluster stay this
# cluster's: a lease in flight when the old cluster stopped is a crash
# here, its rows charged one attempt and sent again, and nothing is
# dropped as coming from elsewhere. Debian 12 ships one major version, so
# the upgrade is to the same one, as Postgres' own tests of pg_upgrade
# do; what the relay relies on is carried the same way across versions.
# After the upgrade `migrate` has nothing to do, and a relay in ordered
# mode delivers every pending row and the rows written after the
# upgrade, each key in seq order.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"

# The old cluster is one of the test's own: it is stopped and upgraded.
it_cluster
old_dir=$it_cluster_dir
RELAY_TEST_DATABASE_URL=$it_cluster_url
pg_bin=$(sed -n 's/^PG_BIN=//p' "$old_dir/env")
old_data=$(sed -n 's/^PG_DATA=//p' "$old_dir/env")
it_table upgrade
it_psql "$(it_keyed_sql "$OUTBOX_TABLE" before 1 300 10 k)"

# A relay of the old cluster, slowed so that its lease is in flight (its
# claim committed, its rows handed to the publisher) when it is killed
# and the cluster stopped.
it_flaky_relay old "$RELAY_TEST_DATABASE_URL" "$it_dir/old.jsonl" RELAY_TEST_FLAKY_DELAY_MS=30
old=$it_last_pid
it_wait_lines 30 "$it_dir/old.jsonl" 5
kill -9 "$old"
wait "$old" 2>/dev/null || true
in_flight=$(it_psql "SELECT coalesce(sum(cardinality(ids)), 0) FROM ${OUTBOX_TABLE}_claims
  WHERE pg_xact_status(xid) <> 'committed'")
[ "$in_flight" -ge 1 ] || it_fail "no lease was in flight when the old relay was killed"
xid_before=$(it_psql "SELECT pg_current_xact_id()")
runuser -u postgres -- "$pg_bin/pg_ctl" stop -D "$old_data" -m fast -w \
	>"$it_dir/stop.out" 2>&1 || it_fail "the old cluster did not stop: $(cat "$it_dir/stop.out")"

# The new cluster: initdb as tests/services/postgres.sh does, no role or
# database of its own (pg_upgrade wants it empty), upgraded into.
new_dir=$(mktemp -d "${TMPDIR:-/tmp}/outbox-pg.XXXXXX")
it_clusters+=("$new_dir")
chown postgres: "$new_dir"
chmod 755 "$new_dir"
new_data=$new_dir/data
runuser -u postgres -- "$pg_bin/initdb" -D "$new_data" -U postgres -E UTF8 --no-locale \
	--auth-local=trust --auth-host=scram-sha-256 --no-sync --no-instructions \
	>"$it_dir/initdb.out" 2>&1 || it_fail "initdb: $(tail -3 "$it_dir/initdb.out")"
p_old=$(svc_free_port)
p_new=$(svc_free_port "$p_old")
runuser -u postgres -- bash -c "cd '$new_dir' && '$pg_bin/pg_upgrade' -b '$pg_bin' -B '$pg_bin' \
	-d '$old_data' -D '$new_data' -U postgres -p $p_old -P $p_new" \
	>"$it_dir/pg_upgrade.out" 2>&1 || it_fail "pg_upgrade: $(tail -15 "$it_dir/pg_upgrade.out")"
port=$(svc_free_port "$p_old" "$p_new")
cp "$old_data/pg_hba.conf" "$new_data/pg_hba.conf"
sed -n '/^# Test service settings/,$p' "$old_data/postgresql.conf" |
	sed -e "s|^port = .*|port = $port|" -e "s|^unix_socket_directories = .*|unix_socket_directories = '$new_dir'|" \
		>>"$new_data/postgresql.conf"
chown postgres: "$new_data/pg_hba.conf" "$new_data/postgresql.conf"
url=$(echo "$RELAY_TEST_DATABASE_URL" | sed "s|@127.0.0.1:[0-9]*/|@127.0.0.1:$port/|")
printf '%s\n' "PGHOST=127.0.0.1" "PGPORT=$port" "PG_BIN=$pg_bin" "PG_DATA=$new_data" \
	"PG_SOCKET_DIR=$new_dir" "RELAY_TEST_DATABASE_URL=$url" >"$new_dir/env"
runuser -u postgres -- "$pg_bin/pg_ctl" start -D "$new_data" -l "$new_dir/postgres.log" -w \
	>"$it_dir/start.out" 2>&1 || it_fail "the upgraded cluster did not start: $(tail -5 "$new_dir/postgres.log")"
RELAY_TEST_DATABASE_URL=$url

# The counter went on where the old cluster's stopped.
[ "$(it_psql "SELECT pg_current_xact_id() > '$xid_before'::xid8")" = t ] ||
	it_fail "the upgraded cluster's transaction counter is behind the old one's ($xid_before)"
it_psql "SELECT id FROM $OUTBOX_TABLE WHERE status = 'pending'" | sort >"$it_dir/pending.ids"
pending=$(wc -l <"$it_dir/pending.ids")
[ "$pending" -gt 0 ] || it_fail "nothing was pending after the upgrade"
versions="SELECT string_agg(v::text, ',' ORDER BY v::text) FROM ${OUTBOX_TABLE}_schema_version v"
before=$(it_psql "$versions")
env OUTBOX_DATABASE_URL="$url" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_LOG_FORMAT=json \
	"$RELAY_TEST_BIN" migrate >"$it_dir/migrate.out" 2>&1 ||
	it_fail "migrate of the upgraded table: $(cat "$it_dir/migrate.out")"
[ "$(it_psql "$versions")" = "$before" ] ||
	it_fail "migrate of the upgraded table recorded migrations of its own"

new_log="$it_dir/new.jsonl"
it_flaky_relay new "$url" "$new_log"
new=$it_last_pid
it_psql "$(it_keyed_sql "$OUTBOX_TABLE" after 301 400 10 k)"
it_wait_count 60 "status = 'sent'" -eq 400
it_stop "$new"
[ "$it_rc" = 0 ] || it_fail "the upgraded cluster's relay exited $it_rc"

if grep -E '"level":"(error|fatal)"' "$it_dir/new.log" >"$it_dir/errors.txt"; then
	it_fail "the upgraded cluster's relay logged errors: $(head -3 "$it_dir/errors.txt")"
fi
! grep -q 'dropped claims from another cluster or from before a restore' "$it_dir/new.log" ||
	it_fail "the old cluster's claims were dropped as coming from elsewhere"
jq -r '.id' "$new_log" | sort -u >"$it_dir/delivered.ids"
missing=$(comm -23 "$it_dir/pending.ids" "$it_dir/delivered.ids" | wc -l)
[ "$missing" = 0 ] || it_fail "$missing rows pending after the upgrade were never delivered"
violations=$(it_order_violations "$new_log")
[ "$violations" = 0 ] || it_fail "$violations first deliveries out of seq order"
[ "$(it_psql "SELECT min(seq) FILTER (WHERE type = 'after') > max(seq) FILTER (WHERE type = 'before')
  FROM $OUTBOX_TABLE")" = t ] || it_fail "rows written after the upgrade took seqs below the old rows'"
# The lease in flight is a crash here: its rows charged once, as the
# sweeper does for a dead claim of this cluster; no other row charged.
charged=$(it_count "attempts = 2")
[ "$charged" = "$in_flight" ] ||
	it_fail "$charged rows charged for the lease in flight, which held $in_flight"
[ "$(it_count "attempts NOT IN (1, 2)")" = 0 ] || it_fail "rows were charged more than once"
echo "ok: pg_upgrade kept the counter ($xid_before and on); $pending pending rows and 100 written after the upgrade delivered in key order; the lease in flight charged its $in_flight rows once"
