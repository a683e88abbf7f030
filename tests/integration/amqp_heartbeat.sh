#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Heartbeats are answered while the worker idles between polls: with the
# broker's heartbeat cut to 2 s, an idle relay keeps its connection for
# 10 s (the broker drops a silent one after two missed beats) and then
# publishes on it. Changes a broker setting: suite amqpfault (run alone).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_heartbeat

old=$(amqp_ctl eval 'application:get_env(rabbit, heartbeat).' | sed -nE 's/^\{ok,([0-9]+)\}$/\1/p')
[ -n "$old" ] || it_fail "cannot read the broker's heartbeat"
trap 'amqp_ctl eval "application:set_env(rabbit, heartbeat, $old)." >/dev/null 2>&1 || true; it_cleanup' EXIT
amqp_ctl eval 'application:set_env(rabbit, heartbeat, 2).' >/dev/null || it_fail "cannot set the heartbeat"

x="$amqp_ns.x"
amqp_consume --declare-exchange "$x" --queue "$amqp_ns.q" --bind "$x:#" || it_fail "cannot set up $x"
amqp_relay run OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_POLL_INTERVAL=5s
pid=$it_last_pid
it_wait 15 "the connection" amqp_log_has run '"amqp connected"'
amqp_ctl list_connections client_properties timeout >"$it_dir/connections.out" ||
	it_fail "cannot list connections"
grep -E "outbox-relay [^ ]+ pid $pid\"\\}\\]\\s+2\$" "$it_dir/connections.out" >/dev/null ||
	it_fail "the relay's connection did not take the 2 s heartbeat: $(cat "$it_dir/connections.out")"
sleep 10
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'com.example.t', '\\x00'::bytea FROM generate_series(1, 5)"
it_wait_count 20 "status = 'sent'" -eq 5
if amqp_log_has run '"amqp connection lost"'; then
	it_fail "the idle connection was dropped: $(grep '"amqp connection lost"' "$it_dir/run.log")"
fi
[ "$(grep -c '"amqp connected"' "$it_dir/run.log")" = 1 ] || it_fail "the relay reconnected"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

# The relay's own proposal: with the broker at a long heartbeat, the
# connection takes OUTBOX_AMQP_HEARTBEAT (the lower of the two).
amqp_ctl eval 'application:set_env(rabbit, heartbeat, 600).' >/dev/null || it_fail "cannot set the heartbeat"
amqp_relay run2 OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_POLL_INTERVAL=5s OUTBOX_AMQP_HEARTBEAT=3s
pid=$it_last_pid
it_wait 15 "the connection" amqp_log_has run2 '"amqp connected"'
amqp_ctl list_connections client_properties timeout >"$it_dir/connections2.out" ||
	it_fail "cannot list connections"
grep -E "outbox-relay [^ ]+ pid $pid\"\\}\\]\\s+3\$" "$it_dir/connections2.out" >/dev/null ||
	it_fail "the relay's connection did not take its own 3 s heartbeat: $(cat "$it_dir/connections2.out")"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

# Two missed heartbeats must end a silent link within half the lease: an
# 8 s lease caps a 30 s proposal at 2 s.
amqp_relay run3 OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_POLL_INTERVAL=1s OUTBOX_AMQP_HEARTBEAT=30s \
	OUTBOX_LEASE_TIMEOUT=8s OUTBOX_PUBLISH_TIMEOUT=2s OUTBOX_STATEMENT_TIMEOUT=2s \
	OUTBOX_SWEEP_INTERVAL=2s OUTBOX_SHUTDOWN_TIMEOUT=5s
pid=$it_last_pid
it_wait 15 "the connection" amqp_log_has run3 '"amqp connected"'
amqp_ctl list_connections client_properties timeout >"$it_dir/connections3.out" ||
	it_fail "cannot list connections"
grep -E "outbox-relay [^ ]+ pid $pid\"\\}\\]\\s+2\$" "$it_dir/connections3.out" >/dev/null ||
	it_fail "the heartbeat was not capped at a quarter of the lease: $(cat "$it_dir/connections3.out")"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo "ok: idle connection kept alive by heartbeats; the relay's own heartbeat proposed and capped"
