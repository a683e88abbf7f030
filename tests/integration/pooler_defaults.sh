#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A relay left at its defaults behind PgBouncer in transaction mode,
# with OUTBOX_LISTEN=on: the pooler runs each transaction on a server
# connection of its choosing, so named prepared statements prepared once
# a session, and LISTEN, cannot work there.
#  - Prepared statements: at the default, OUTBOX_PG_PREPARE=on, the relay
#    sees as it connects that a pooler answered its connection (the
#    server's pid is not the one announced) and prepares as with
#    OUTBOX_PG_PREPARE=pooled from its first statement, saying so once: no
#    statement of its meets a name missing or already there, though each
#    server connection holds its names. A proxy that passes the server's
#    pid through shows only by the first statement found missing or
#    already there (26000, 42P05), which turns the whole relay to pooled
#    with one error that names the setting (test_prepare_refused); events
#    are delivered either way (docs/design.md §7).
#  - LISTEN (docs/design.md §7): the pooler drops notifications that reach
#    a server connection between its client's statements, so a listener
#    there would wait for nothing without a word. The listener proves its
#    session first (its own notification, sent from another session, must
#    come back): through the pool it is refused with an error that names
#    the setting to mend, outbox_listen_probes_lost_total counts it,
#    events still go out by polling, and the listener set nothing on the
#    pool's server connections. With OUTBOX_LISTEN_DATABASE_URL a direct
#    connection, the probe comes back and an event goes out within a
#    second with a 10 s poll interval.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
. "$(dirname "$0")/pgbouncer_lib.sh"
trap 'bouncer_stop_all; it_cleanup' EXIT

it_table listenpool
OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_LISTEN=on "$RELAY_TEST_BIN" migrate \
	>"$it_dir/migrate.out" 2>&1 || it_fail "migrate: $(cat "$it_dir/migrate.out")"
bouncer_start 0
clients=()

# insert_and_time SECONDS: seconds from commit to the event's line.
insert_and_time() {
	ops_insert_and_time "$1" "$it_dir/$relay.out" listen.pool
}

# Through the pool at the defaults (OUTBOX_PG_PREPARE unset, so on):
# the listener refused, said, counted; the pooler seen, said once, and
# no statement refused; polling delivers. A client of the pool prepares
# the names the relay's statements go by when prepared once a session on
# each server connection first, as a relay before this one would have
# left them. A name says its text, so they are learnt from a relay of
# the same settings on a direct connection, which says each at debug
# level.
ops_relay names OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_LISTEN=on \
	OUTBOX_POLL_INTERVAL=2s OUTBOX_LOG_LEVEL=debug
kill -TERM "$it_last_pid"
wait "$it_last_pid" 2>/dev/null || true
prepare=$(grep '"msg":"preparing a statement"' "$it_dir/names.log" |
	grep -o '"name":"outbox_[a-z_]*_[0-9a-f]\{16\}"' | cut -d'"' -f4 | sort -u |
	sed 's/.*/PREPARE "&" AS SELECT 1;/' | tr '\n' ' ')
[ -n "$prepare" ] || it_fail "the relay said no statement it prepares: $(head -5 "$it_dir/names.log")"
for i in 1 2 3; do
	psql "$bouncer_url" -X -q -c "$prepare SELECT pg_sleep(1)" \
		>"$it_dir/prepare-$i.txt" 2>&1 &
	clients+=($!)
done
wait "${clients[@]}"
relay=pooled
ops_relay "$relay" OUTBOX_DATABASE_URL="$bouncer_url" OUTBOX_LISTEN=on \
	OUTBOX_POLL_INTERVAL=2s
pid=$it_last_pid
ops_wait_metric 30 outbox_listen_probes_lost_total 'v >= 1'
grep -q 'did not reach it within 5000 ms' "$it_dir/$relay.log" ||
	it_fail "no error for the lost probe: $(grep listener "$it_dir/$relay.log" | head -5)"
grep -q 'OUTBOX_LISTEN_DATABASE_URL is unset, so LISTEN went through OUTBOX_DATABASE_URL' \
	"$it_dir/$relay.log" || it_fail "the error does not name the setting to mend"
t=$(insert_and_time 10)
echo "through the pool, by polling: ${t}s"
said=$(grep -c 'goes through a pooler or proxy' "$it_dir/$relay.log" || true)
[ "$said" = 1 ] || it_fail "the pooler was said $said times"
grep -q 'the relay prepares its statements once a server connection, as with OUTBOX_PG_PREPARE=pooled, which a transaction-mode pool (PgBouncer pool_mode = transaction) needs' \
	"$it_dir/$relay.log" || it_fail "the notice does not say what the relay does"
n=$(wc -l <"$it_dir/$relay.out")
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'listen.pool', '{}' FROM generate_series(1, 50)"
it_wait_lines 10 "$it_dir/$relay.out" $((n + 50))
errors=$(grep -c '42P05\|26000\|cannot work; the relay now' "$it_dir/$relay.log" || true)
[ "$errors" = 0 ] || it_fail "$errors prepared statements' errors at the defaults: $(grep -m3 '42P05\|26000' "$it_dir/$relay.log")"

# Nothing of the listener's settings on the pool's server connections:
# one client on each of the 3 at once (one after another would reach only
# the one the last let go).
baseline=$(psql "$RELAY_TEST_DATABASE_URL" -X -A -t -q -c "SHOW statement_timeout")
clients=()
for i in 1 2 3; do
	psql "$bouncer_url" -X -A -t -q -c "SELECT current_setting('statement_timeout'), pg_sleep(1)" \
		>"$it_dir/server-$i.txt" 2>&1 &
	clients+=($!)
done
wait "${clients[@]}" # not the relay
for i in 1 2 3; do
	[ "$(cut -d'|' -f1 "$it_dir/server-$i.txt")" = "$baseline" ] ||
		it_fail "a pooled server connection has statement_timeout $(cat "$it_dir/server-$i.txt"), the server's is $baseline"
done
it_stop "$pid"

# A direct LISTEN URL: the probe comes back, the wake-up works.
relay=direct
ops_relay "$relay" OUTBOX_DATABASE_URL="$bouncer_url" OUTBOX_PG_PREPARE=off \
	OUTBOX_LISTEN=on OUTBOX_LISTEN_DATABASE_URL="$RELAY_TEST_DATABASE_URL" \
	OUTBOX_POLL_INTERVAL=10s
pid=$it_last_pid
# Past the probe (the listener says so once it LISTENs) and the first poll.
it_wait 30 "the listener" grep -q '"listening for inserts"' "$it_dir/$relay.log"
sleep 0.5
t=$(insert_and_time 12)
awk -v t="$t" 'BEGIN { exit !(t < 1) }' || it_fail "with a direct LISTEN URL the event took ${t}s"
[ "$(ops_metric outbox_listen_probes_lost_total)" = 0 ] ||
	it_fail "the direct session's probe was counted lost"
! grep -q 'did not reach it' "$it_dir/$relay.log" || it_fail "the direct session was refused"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "exit code $it_rc"
echo "ok"
