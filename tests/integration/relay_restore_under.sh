#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# An older backup restored under a running relay (docs/design.md §4, "The
# late scan"; docs/runbook.md, "Restores and upgrades"). The relay reaches
# the database through PgBouncer, which keeps its sessions while the
# server behind it stops and comes back, so the floors its sessions keep
# (transaction ids of the cluster it read them from) outlive the restore.
# A cold backup is taken while 100 rows wait for a retry a few seconds
# ahead; the relay then sends them, 3,000 transactions pass and 100 more
# rows go out; the backup is put back. The 100 rows are pending again,
# written by transactions below the relay's late floor and due before its
# scan floor: the relay sends them again within seconds (not at the next
# scan from the start, an hour away here), then rows written after the
# restore. The relay runs with OUTBOX_PG_PREPARE=pooled: the server's
# restart takes its prepared statements away from under the pool, and
# its lease transactions prepare them again on the new connections.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/pgbouncer_lib.sh"
# shellcheck source=../services/lib.sh
. "$RELAY_TEST_SOURCE_ROOT/tests/services/lib.sh"

trap 'bouncer_stop_all; it_cleanup' EXIT
pg_sh="$RELAY_TEST_SOURCE_ROOT/tests/services/postgres.sh"
it_cluster
pg2=$it_cluster_dir
url2=$it_cluster_url
data2=$(svc_env_get "$pg2/env" PG_DATA)
# A clean stop (postgres.sh stops at once, losing what the test's fsync=off
# and synchronous_commit=off leave unwritten): a backup is of committed rows.
stop2() {
	svc_as postgres "$(svc_env_get "$pg2/env" PG_BIN)/pg_ctl" stop -D "$data2" -m fast -w \
		>>"$it_dir/cluster.out" 2>&1 || it_fail "the test's cluster did not stop"
}
psql2() {
	psql "$url2" -X -A -t -q -v ON_ERROR_STOP=1 -c "$1"
}
export OUTBOX_TABLE=outbox_events
env OUTBOX_DATABASE_URL="$url2" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate.out" 2>&1 ||
	it_fail "migrate: $(cat "$it_dir/migrate.out")"
bouncer_start 0 PGPORT="$(svc_env_get "$pg2/env" PGPORT)"

# The relay is stopped (SIGSTOP) while the server is down, so that its
# sessions stay idle in PgBouncer and see no error, as when a restore
# falls between two polls; the scan from the start an hour apart, so
# that only the floors' guard finds the rows the restore made pending
# again.
it_relay relay OUTBOX_DATABASE_URL="$bouncer_url" OUTBOX_PG_PREPARE=pooled \
	OUTBOX_POLL_INTERVAL=2s OUTBOX_LEASE_RESCAN_INTERVAL=1h OUTBOX_WORKERS=1 OUTBOX_WORKER_WINDOW=1
relay=$it_last_pid
out="$it_dir/relay.out"
insert() { # TYPE N [DUE_IN]: N events of TYPE, due DUE_IN from now
	psql2 "INSERT INTO $OUTBOX_TABLE (type, payload, next_attempt_at)
  SELECT '$1', '{}', now() + interval '${3:-0 s}' FROM generate_series(1, $2)"
}
delivered() { # TYPE: distinct events of TYPE the relay printed
	jq -r "select(.type == \"$1\") | .id" "$out" 2>/dev/null | sort -u | wc -l
}
wait_delivered() { # SECONDS TYPE N
	local deadline=$((SECONDS + $1))
	until [ "$(delivered "$2")" -ge "$3" ]; do
		[ "$SECONDS" -lt "$deadline" ] ||
			it_fail "$(delivered "$2") of $3 events of type $2 delivered in $1 s"
		sleep 0.2
	done
}
insert warm 50
wait_delivered 20 warm 50

# The cold backup: 100 rows pending in it, due 4 s after it was taken.
insert again 100 '4 s'
kill -STOP "$relay"
stop2
cp -a "$data2" "$pg2/backup"
bash "$pg_sh" restart "$pg2" >/dev/null
kill -CONT "$relay"
wait_delivered 30 again 100
echo 'SELECT pg_current_xact_id();' >"$it_dir/burn.sql"
pgbench -n -t 3000 -f "$it_dir/burn.sql" "$url2" >"$it_dir/burn.out" 2>&1 ||
	it_fail "pgbench: $(tail -3 "$it_dir/burn.out")"
insert later 100
wait_delivered 20 later 100
sent_once=$(jq -r 'select(.type == "again") | .id' "$out" | wc -l)

# The backup put back: the 100 rows pending again, the later ones gone.
kill -STOP "$relay"
stop2
rm -rf "$data2"
mv "$pg2/backup" "$data2"
bash "$pg_sh" restart "$pg2" >/dev/null
kill -CONT "$relay"
[ "$(psql2 "SELECT count(*) FROM $OUTBOX_TABLE WHERE type = 'again' AND status = 'pending'")" = 100 ] ||
	it_fail "the backup does not hold the 100 rows pending"
deadline=$((SECONDS + 15))
until [ "$(jq -r 'select(.type == "again") | .id' "$out" | wc -l)" -ge $((sent_once + 100)) ]; do
	[ "$SECONDS" -lt "$deadline" ] ||
		it_fail "the rows the restore made pending were not sent again within 15 s"
	sleep 0.2
done
insert after 20
wait_delivered 20 after 20
kill -0 "$relay" 2>/dev/null || it_fail "the relay exited"
echo "ok: 100 rows made pending by the restore sent again, 20 written after it sent"
