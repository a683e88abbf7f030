#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A failover of the application's primary to its streaming standby
# (docs/design.md §7, "Postgres sessions"; docs/runbook.md, "Restores and
# upgrades"). The relay and a producer reach the database through one
# multi-host URL with target_session_attrs=read-write; the primary is
# killed mid-stream (a crash, as a failover meets it) and the standby
# promoted. The relay waits while no host takes writes, goes on on the
# promoted one, and every event the promoted database holds is sent and
# was delivered, those written after the failover included.
. "$(dirname "$0")/lib.sh"
# shellcheck source=../services/lib.sh
. "$RELAY_TEST_SOURCE_ROOT/tests/services/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"

it_cluster
primary_dir=$it_cluster_dir
primary_url=$it_cluster_url
primary_port=$(svc_env_get "$primary_dir/env" PGPORT)
pg_bin=$(svc_env_get "$primary_dir/env" PG_BIN)
export OUTBOX_TABLE=outbox_events
env OUTBOX_DATABASE_URL="$primary_url" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate.out" 2>&1 ||
	it_fail "migrate: $(cat "$it_dir/migrate.out")"

# The standby: a base backup of the primary streaming from it, in a
# directory the cleanup stops and removes with the test's clusters.
standby_dir=$(mktemp -d "${TMPDIR:-/tmp}/outbox-standby.XXXXXX")
it_clusters+=("$standby_dir")
chown postgres: "$standby_dir"
chmod 755 "$standby_dir"
standby_port=$(svc_free_port "$primary_port")
PGPASSWORD=outbox-test-secret svc_as postgres "$pg_bin/pg_basebackup" \
	-h 127.0.0.1 -p "$primary_port" -U outbox -D "$standby_dir/data" -R -X stream -c fast \
	>"$it_dir/basebackup.out" 2>&1 || it_fail "pg_basebackup: $(cat "$it_dir/basebackup.out")"
cat >>"$standby_dir/data/postgresql.conf" <<EOF
port = $standby_port
unix_socket_directories = '$standby_dir'
EOF
# What postgres.sh needs to stop it at the end, as it stops the primary.
sed -e "s|^PG_DATA=.*|PG_DATA=$standby_dir/data|" -e "s|^PGPORT=.*|PGPORT=$standby_port|" \
	"$primary_dir/env" >"$standby_dir/env"
svc_as postgres "$pg_bin/pg_ctl" start -D "$standby_dir/data" -w -l "$standby_dir/postgres.log" \
	>"$it_dir/standby.out" 2>&1 || it_fail "the standby did not start: $(cat "$it_dir/standby.out")"
standby_url=${primary_url/:$primary_port\//:$standby_port/}
[ "$(psql "$standby_url" -X -A -t -c 'SELECT pg_is_in_recovery()')" = t ] ||
	it_fail "the standby is not in recovery"

both="postgresql://outbox:outbox-test-secret@127.0.0.1:$primary_port,127.0.0.1:$standby_port/outbox?target_session_attrs=read-write&connect_timeout=2"
log="$it_dir/deliveries.jsonl"
env OUTBOX_DATABASE_URL="$both" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR= \
	OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" OUTBOX_WORKERS=2 \
	OUTBOX_POLL_INTERVAL=100ms OUTBOX_LOG_FORMAT=json \
	"$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/relay.log" &
relay=$!
it_pids+=("$relay")

# The producer: 10 events a transaction, 20 ms apart, until told to stop
# (at most 1,000 transactions or 60 s); a round refused (no host took
# writes) is noted and not tried again.
(
	end=$((SECONDS + 60))
	for round in $(seq 1 1000); do
		[ "$SECONDS" -lt "$end" ] && [ ! -f "$it_dir/stop" ] || break
		psql "$both" -X -q -c "INSERT INTO $OUTBOX_TABLE (type, payload)
  SELECT 'n$round', '{}' FROM generate_series(1, 10)" >/dev/null 2>&1 ||
			echo "$round" >>"$it_dir/refused"
		sleep 0.02
	done
) &
producer=$!
it_wait_lines 30 "$log" 500
bash "$RELAY_TEST_SOURCE_ROOT/tests/services/postgres.sh" stop "$primary_dir" >/dev/null
sleep 1
svc_as postgres "$pg_bin/pg_ctl" promote -D "$standby_dir/data" -w >"$it_dir/promote.out" 2>&1 ||
	it_fail "promote: $(cat "$it_dir/promote.out")"
promoted=$(psql "$standby_url" -X -A -t -c "SELECT now()")
sleep 2
touch "$it_dir/stop"
wait "$producer"
[ -s "$it_dir/refused" ] || it_fail "no insert was refused: the failover came after the producer"
total=$(psql "$standby_url" -X -A -t -c "SELECT count(*) FROM $OUTBOX_TABLE")
written_after=$(psql "$standby_url" -X -A -t -c "SELECT count(*) FROM $OUTBOX_TABLE
  WHERE created_at > '$promoted'")
[ "$written_after" -gt 0 ] || it_fail "no event was written after the failover"
sent_all() {
	[ "$(psql "$standby_url" -X -A -t -c "SELECT count(*) FROM $OUTBOX_TABLE
  WHERE status = 'sent'")" = "$total" ]
}
it_wait 60 "every event of the promoted database sent" sent_all
kill -0 "$relay" 2>/dev/null || it_fail "the relay exited"
it_stop "$relay"
psql "$standby_url" -X -A -t -c "SELECT id FROM $OUTBOX_TABLE" | sort >"$it_dir/held.ids"
jq -r '.id' "$log" | sort -u >"$it_dir/delivered.ids"
missing=$(comm -23 "$it_dir/held.ids" "$it_dir/delivered.ids" | wc -l)
[ "$missing" = 0 ] || it_fail "$missing events of the promoted database were marked sent and never delivered"
twice=$(($(wc -l <"$log") - $(wc -l <"$it_dir/delivered.ids")))
echo "ok: $total events held by the promoted database, all sent and delivered," \
	"$written_after of them written after the failover, $twice deliveries again;" \
	"$(wc -l <"$it_dir/refused") producer rounds refused"
