#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The relay behind PgBouncer in transaction mode, once with the pool's
# defaults and once with server_reset_query_always (DISCARD ALL after
# every transaction, which throws away what the relay prepared), a small
# pool shared with plain clients:
#  - delivery: two workers deliver a few thousand events, none lost, with
#    OUTBOX_PG_PREPARE=pooled (the other relays here run with off);
#  - the fence: a relay stopped (SIGSTOP) with rows leased loses them
#    within the lease timeout, and a second relay delivers them;
#  - hygiene: plain clients of the same pool, while relays run, see the
#    server's settings, never one the relay set (docs/design.md §4);
#  - migrate through the pool is refused with a clear error before it
#    changes or sets anything;
#  - the table made partitioned, the relay's cleaner tends its daily
#    partitions through the pool.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
. "$(dirname "$0")/pgbouncer_lib.sh"
trap 'bouncer_stop_all; it_cleanup' EXIT

readonly events=2500 lease_timeout_s=3
# What a plain client sees of the settings the relay makes in its
# transactions.
readonly settings_sql="SELECT concat_ws(' ', current_setting('statement_timeout'),
	current_setting('lock_timeout'),
	current_setting('idle_in_transaction_session_timeout'),
	current_setting('jit'), current_setting('enable_bitmapscan'),
	current_setting('enable_seqscan'), current_setting('enable_sort'),
	current_setting('plan_cache_mode'),
	current_setting('tcp_keepalives_idle'),
	current_setting('tcp_user_timeout'))"

# clients URL BASELINE N: N plain clients of the pool, one transaction
# each; prints how many saw settings other than BASELINE.
clients() {
	local url="$1" baseline="$2" n="$3" i seen leaked=0
	for i in $(seq 1 "$n"); do
		seen=$(psql "$url" -X -A -t -q -c "$settings_sql" 2>&1) || seen="error: $seen"
		if [ "$seen" != "$baseline" ]; then
			leaked=$((leaked + 1))
			echo "client $i saw: $seen" >>"$it_dir/leaks.txt"
		fi
	done
	echo "$leaked"
}

# every_server URL BASELINE: one client on each of the pool's 3 server
# connections at once (sequential clients get the one the last let go;
# URL is the pool's, bouncer_on_each_connection's); prints how many saw
# settings other than BASELINE.
every_server() {
	local baseline="$2" i leaked=0
	bouncer_on_each_connection "$settings_sql"
	for i in 1 2 3; do
		if [ "$(cat "$it_dir/conn-$i.txt")" != "$baseline" ]; then
			leaked=$((leaked + 1))
			cat "$it_dir/conn-$i.txt" >>"$it_dir/leaks.txt"
		fi
	done
	echo "$leaked"
}

# round RESET: one pgbouncer (server_reset_query_always = RESET) and the
# three checks through it.
round() {
	local reset="$1" url baseline leaked total=0 n=0 relay slow fast held
	local t0 released=0 deadline
	bouncer_start "$reset"
	url=$bouncer_url
	baseline=$(psql "$url" -X -A -t -q -c "$settings_sql")
	[ "$baseline" = "$(it_psql "$settings_sql")" ] ||
		it_fail "the pool's baseline ($baseline) is not the server's"

	# migrate needs a direct connection (a session advisory lock, its
	# settings): through the pool, whether it resets each server
	# connection after every transaction or not, migrate says so before
	# it changes anything, and leaves no setting on the pool's server
	# connections. (With the pool's defaults an idle pool kept migrate on
	# one server connection, where its lock's check saw nothing amiss.)
	local refused="pgbref_$$.outbox_events"
	if env OUTBOX_DATABASE_URL="$url" OUTBOX_TABLE="$refused" \
		"$RELAY_TEST_BIN" migrate >"$it_dir/migrate-pool.out" 2>&1; then
		it_fail "migrate through the pool (reset=$reset) succeeded: $(tail -3 "$it_dir/migrate-pool.out")"
	fi
	grep -q 'goes through a pooler or proxy.*Give migrate a direct connection' "$it_dir/migrate-pool.out" ||
		it_fail "migrate through the pool: $(cat "$it_dir/migrate-pool.out")"
	[ "$(it_psql "SELECT to_regclass('$refused') IS NULL")" = t ] ||
		it_fail "migrate through the pool made the table before it refused"
	leaked=$(every_server "$url" "$baseline")
	[ "$leaked" = 0 ] ||
		it_fail "migrate through the pool left its settings on $leaked server connections: $(cat "$it_dir/leaks.txt")"
	echo "reset=$reset: migrate through the pool refused before it changed or set anything"
	it_table "pgb${reset}"
	it_psql "INSERT INTO $OUTBOX_TABLE (type, payload)
	         SELECT 'pool.test', convert_to(json_build_object('n', g)::text, 'UTF8')
	         FROM generate_series(1, $events) g"
	# Delivery, with plain clients of the pool asking all the while.
	env OUTBOX_DATABASE_URL="$url" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR= \
		OUTBOX_PG_PREPARE=pooled OUTBOX_WORKERS=2 OUTBOX_BATCH_SIZE=50 \
		OUTBOX_POLL_INTERVAL=100ms OUTBOX_LEASE_TIMEOUT=${lease_timeout_s}s \
		OUTBOX_PUBLISH_TIMEOUT=500ms OUTBOX_STATEMENT_TIMEOUT=1s \
		OUTBOX_SWEEP_INTERVAL=500ms \
		"$RELAY_TEST_BIN" run >"$it_dir/deliver-$reset.out" 2>"$it_dir/deliver-$reset.log" &
	relay=$!
	it_pids+=("$relay")
	deadline=$((SECONDS + 120))
	while [ "$(it_count "status = 'sent'")" -lt "$events" ] || [ "$n" -lt 30 ]; do
		[ "$SECONDS" -lt "$deadline" ] ||
			it_fail "reset=$reset: $(it_count "status = 'sent'") of $events sent after 120s"
		kill -0 "$relay" 2>/dev/null || it_fail "reset=$reset: the delivering relay exited"
		leaked=$(clients "$url" "$baseline" 5)
		total=$((total + leaked))
		n=$((n + 5))
	done
	[ "$total" = 0 ] ||
		it_fail "reset=$reset: $total of $n plain clients of the pool saw the relay's settings (baseline '$baseline'): $(head -3 "$it_dir/leaks.txt")"
	it_stop "$relay"
	[ "$it_rc" = 0 ] || it_fail "reset=$reset: the delivering relay exited $it_rc"
	it_all_printed "reset=$reset" "$it_dir/deliver-$reset.out"
	echo "reset=$reset: $events events delivered by 2 workers, $n plain clients saw only the server's settings"

	# The fence: a relay stopped with rows leased.
	it_psql "INSERT INTO $OUTBOX_TABLE (type, payload)
	         SELECT 'pool.fence', convert_to(json_build_object('n', g)::text, 'UTF8')
	         FROM generate_series(1, 30) g"
	local log="$it_dir/fence-$reset.jsonl"
	flaky() {
		local name="$1"
		shift
		env OUTBOX_DATABASE_URL="$url" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR= \
			OUTBOX_PG_PREPARE=off OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" \
			OUTBOX_BATCH_SIZE=5 OUTBOX_LEASE_TIMEOUT=${lease_timeout_s}s \
			OUTBOX_PUBLISH_TIMEOUT=500ms OUTBOX_STATEMENT_TIMEOUT=1s \
			OUTBOX_SWEEP_INTERVAL=300ms OUTBOX_POLL_INTERVAL=100ms \
			"$@" "$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/$name-$reset.log" &
		it_last_pid=$!
		it_pids+=("$it_last_pid")
	}
	flaky slow RELAY_TEST_FLAKY_DELAY_MS=400
	slow=$it_last_pid
	local slow_held="id IN (SELECT unnest(ids) FROM ${OUTBOX_TABLE}_claims WHERE
		holder LIKE '%/$slow/%' AND pg_xact_status(xid) = 'in progress')"
	# Stopped while it holds rows (a lease may end between the look and
	# the stop: then it runs on and is stopped again).
	local tries=0
	while :; do
		it_wait_count 30 "$slow_held" -ge 1
		kill -STOP "$slow"
		t0=$(date +%s%N)
		held=$(it_psql "SELECT id FROM $OUTBOX_TABLE WHERE $slow_held")
		[ -z "$held" ] || break
		tries=$((tries + 1))
		[ "$tries" -lt 5 ] || it_fail "reset=$reset: the slow relay held nothing when stopped"
		kill -CONT "$slow"
	done
	# The server ends the stopped relay's lease transaction at the lease
	# timeout, whatever the pool did to its server connection.
	# The lease timeout, and a few seconds for a loaded machine: the
	# session settings of older relays let go after 10 s or never.
	deadline=$((SECONDS + lease_timeout_s + 4))
	while [ "$(it_count "$slow_held")" -gt 0 ]; do
		[ "$SECONDS" -lt "$deadline" ] ||
			it_fail "reset=$reset: a relay stopped with a lease open still held its rows $((lease_timeout_s + 4))s later (lease timeout ${lease_timeout_s}s)"
		sleep 0.2
	done
	released=$((($(date +%s%N) - t0) / 1000000))
	leaked=$(clients "$url" "$baseline" 10)
	[ "$leaked" = 0 ] || it_fail "reset=$reset: $leaked of 10 plain clients saw the relay's settings during the fence: $(tail -3 "$it_dir/leaks.txt")"
	flaky fast
	fast=$it_last_pid
	it_wait_count 60 "type = 'pool.fence' AND status = 'sent'" -eq 30
	kill -CONT "$slow"
	# The stopped relay's lease ended under it: it says at exit that
	# outcomes could not be written (1), or had none left (0).
	it_stop "$slow" 30 any
	[ "$it_rc" = 0 ] || [ "$it_rc" = 1 ] || it_fail "reset=$reset: the stopped relay exited $it_rc"
	it_stop "$fast"
	for id in $held; do
		grep '"id":"'"$id"'"' "$log" | grep -q '"pid":'"$fast" ||
			it_fail "reset=$reset: row $id the stopped relay held was not delivered by the second relay"
	done
	echo "reset=$reset: a relay stopped with $(echo "$held" | wc -w) rows leased lost them after ${released} ms (lease timeout ${lease_timeout_s}s); the second relay delivered them"
	[ "$reset" = 1 ] || partitioned "$url" "$baseline"
	bouncer_stop
}

# partitioned URL BASELINE: the table made partitioned by id (migrate
# --partition over a direct connection) and its partitions tended by the
# relay's cleaner through the pool: tomorrow's, dropped, made again; a
# past day's dropped, its pending row carried to the default partition
# and delivered; plain clients of the pool, and afterwards each of its
# server connections, see only the server's settings (the cleaner's
# 200 ms lock timeout is its transaction's; PgBouncer itself puts back
# each client's TimeZone, which the cleaner sets too).
partitioned() {
	local url="$1" baseline="$2" relay leaked
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
		"$RELAY_TEST_BIN" migrate --partition >"$it_dir/partition.out" 2>&1 ||
		it_fail "migrate --partition: $(cat "$it_dir/partition.out")"
	# day_id DAYS: the least UUIDv7 of today + DAYS (UTC); day_tag: its name.
	day_id() {
		it_psql "SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-0000-0000-000000000000'
		  FROM (SELECT lpad(to_hex((extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'UTC')
		  + interval '$1 day') * 1000)::bigint), 12, '0') AS h) x"
	}
	day_tag() {
		it_psql "SELECT to_char(date_trunc('day', now() AT TIME ZONE 'UTC') + interval '$1 day', 'YYYYMMDD')"
	}
	local past="${OUTBOX_TABLE}_p$(day_tag -3)" next="${OUTBOX_TABLE}_p$(day_tag 1)"
	it_psql "CREATE TABLE $past PARTITION OF $OUTBOX_TABLE FOR VALUES FROM ('$(day_id -3)') TO ('$(day_id -2)')"
	it_psql "INSERT INTO $OUTBOX_TABLE (id, type, payload, status, finished_at) VALUES
	  (overlay('$(day_id -3)' placing '7000-8000-000000000001' from 15)::uuid, 'pool.past', '{}', 'sent', now() - interval '3 days'),
	  (overlay('$(day_id -3)' placing '7000-8000-000000000002' from 15)::uuid, 'pool.past', '{}', 'pending', NULL)"
	[ "$(it_psql "SELECT count(*) FROM $past")" = 2 ] || it_fail "the past day's rows are not in its partition"
	it_psql "DROP TABLE $next"
	env OUTBOX_DATABASE_URL="$url" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR= \
		OUTBOX_PG_PREPARE=off OUTBOX_POLL_INTERVAL=100ms OUTBOX_CLEAN_INTERVAL=1s \
		OUTBOX_RETENTION=1h "$RELAY_TEST_BIN" run >"$it_dir/partitioned.out" 2>"$it_dir/partitioned.log" &
	relay=$!
	it_pids+=("$relay")
	tended() {
		[ "$(it_psql "SELECT to_regclass('$next') IS NOT NULL AND to_regclass('$past') IS NULL")" = t ]
	}
	it_wait 20 "the relay's cleaner to tend the partitions through the pool" tended
	it_wait_count 20 "type = 'pool.past' AND status = 'sent'" -eq 1
	[ "$(it_count "type = 'pool.past' AND tableoid = '${OUTBOX_TABLE}_default'::regclass")" = 1 ] ||
		it_fail "the past day's pending row was not carried to the default partition"
	leaked=$(clients "$url" "$baseline" 10)
	[ "$leaked" = 0 ] || it_fail "$leaked of 10 plain clients saw the relay's settings beside the partitioned table: $(tail -3 "$it_dir/leaks.txt")"
	it_stop "$relay"
	[ "$it_rc" = 0 ] || it_fail "the relay of the partitioned table exited $it_rc"
	leaked=$(every_server "$url" "$baseline")
	[ "$leaked" = 0 ] || it_fail "$leaked of the pool's 3 server connections kept a setting of the relay's cleaner: $(tail -3 "$it_dir/leaks.txt")"
	grep -q '"msg":"partitions made and dropped".*"made":"1"' "$it_dir/partitioned.log" &&
		grep -q '"msg":"partitions made and dropped".*"dropped":"1","carried":"1"' "$it_dir/partitioned.log" ||
		it_fail "the relay logged no partition made and dropped: $(grep partitions "$it_dir/partitioned.log")"
	echo "partitioned: the relay's cleaner made tomorrow's partition and dropped a past day's through the pool, its pending row carried and delivered"
}

round 0
round 1
echo "ok: delivery, the fence and hygiene hold behind pgbouncer in transaction mode, with and without server_reset_query_always"
