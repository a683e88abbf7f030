#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A reconnect's backoff holds while notifications flow: the relay's
# sessions reach Postgres through a forwarder (a pooler, say) that goes
# away, its LISTEN session directly; producers go on inserting, each
# insert a notification. Each thread's reconnect tries come at its
# backoff (100 ms doubling to 5 s), not at every notification, as they
# did when any wake-up ended the backoff's sleep. Back, every row goes
# out.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table backoff
pg_port=$(printf '%s' "$RELAY_TEST_DATABASE_URL" | sed -E 's|^.*@[^:/]+:([0-9]+)/.*$|\1|')
fwd_port=$(svc_free_port)
fwd_url="${RELAY_TEST_DATABASE_URL/:$pg_port\//:$fwd_port/}"
[ "$fwd_url" != "$RELAY_TEST_DATABASE_URL" ] || it_fail "cannot point the URL at the forwarder: $RELAY_TEST_DATABASE_URL"
touch "$it_dir/gate"
start_forwarder() {
	python3 "$(dirname "$0")/tcp_gate.py" "$fwd_port" "$pg_port" "$it_dir/gate" 2>>"$it_dir/fwd.log" &
	fwd_pid=$!
	it_pids+=("$fwd_pid")
	it_wait 10 "the forwarder" bash -c "exec 3<>/dev/tcp/127.0.0.1/$fwd_port"
}
start_forwarder
# The NOTIFY trigger.
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_LISTEN=on \
	"$RELAY_TEST_BIN" migrate >"$it_dir/migrate_listen.out" 2>&1 ||
	it_fail "migrate with LISTEN on failed: $(cat "$it_dir/migrate_listen.out")"
it_relay backoff OUTBOX_DATABASE_URL="$fwd_url" OUTBOX_LISTEN=on \
	OUTBOX_LISTEN_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_LOG_LEVEL=info \
	OUTBOX_WORKERS=1 OUTBOX_POLL_INTERVAL=60s
pid=$it_last_pid
it_wait 20 "the listener" grep -q '"listening for inserts"' "$it_dir/backoff.log"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('before', '\\x7b7d')" >/dev/null
it_wait 20 "an event before the cut" grep -q '"type":"before"' "$it_dir/backoff.out"

kill "$fwd_pid"
wait "$fwd_pid" 2>/dev/null || true
tries() { grep -c '"postgres reconnect failed' "$it_dir/backoff.log" || true; }
# 50 notifications a second for 6 s, each insert its own transaction.
it_psql "DO \$\$ BEGIN FOR i IN 1..300 LOOP
	INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('during', '\\x7b7d');
	COMMIT; PERFORM pg_sleep(0.02); END LOOP; END \$\$" >/dev/null
t=$(tries)
# Each thread that reconnects (the lane, the sweeper, the cleaner) tries
# at 0.1, 0.3, 0.7, 1.5, 3.1 and 6.3 s: at most 7 each, about 25 in all.
[ "$t" -ge 1 ] || it_fail "no reconnect was tried while the forwarder was gone"
[ "$t" -le 40 ] || it_fail "$t reconnect tries in 6 s with notifications flowing (the backoff did not hold)"

start_forwarder
it_wait_count 60 "status = 'sent'" -eq 301
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
it_all_printed "after the forwarder came back" "$it_dir/backoff.out"
echo "ok: $t reconnect tries in 6 s of notifications with the sessions' way cut; every row out once back"
