#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The broker stops (rabbitmqctl stop_app) for 10 s under load: the relay
# rides it out in the same process; afterwards every row is sent, none
# failed, none stuck in flight, only the events in flight at the stop
# were charged one extra attempt, and the queue holds every one of them
# (a row marked sent unconfirmed would be missing there; the queue and
# the messages are durable). Stops the shared broker: suite
# amqpfault (run alone).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_broker_stop

# Whatever happens, the broker is running again for the next test.
trap 'amqp_ctl start_app >/dev/null 2>&1 || true; it_cleanup' EXIT

x="$amqp_ns.x"
amqp_consume --declare-exchange "$x" --queue "$amqp_ns.q" --bind "$x:#" || it_fail "cannot set up $x"
it_psql "INSERT INTO $OUTBOX_TABLE (type, routing_key, payload)
         SELECT 'com.example.t', 'k.' || (g % 10), convert_to(g::text, 'UTF8')
         FROM generate_series(1, 3000) g"

# 300 events/s: the load spans the outage.
amqp_relay run OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_BATCH_SIZE=50 OUTBOX_MAX_RATE=300 \
	OUTBOX_BACKOFF_BASE=500ms OUTBOX_BACKOFF_MAX=2s OUTBOX_PUBLISH_TIMEOUT=3s
pid=$it_last_pid
it_wait_count 30 "status = 'sent'" -ge 300
amqp_ctl stop_app >"$it_dir/stop_app.out" 2>&1 || it_fail "stop_app failed: $(cat "$it_dir/stop_app.out")"
stopped_at=$(it_count "status = 'sent'")
sleep 10
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited while the broker was down"
[ "$(it_count "status = 'failed'")" = 0 ] || it_fail "rows failed during the outage"
amqp_ctl start_app >"$it_dir/start_app.out" 2>&1 || it_fail "start_app failed: $(cat "$it_dir/start_app.out")"

it_wait_count 120 "status = 'sent'" -eq 3000
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited"
[ "$(grep -c '"outbox-relay started"' "$it_dir/run.log")" = 1 ] || it_fail "the relay restarted"
[ "$stopped_at" -lt 3000 ] || it_fail "the outage did not happen under load"
[ "$(it_count "status <> 'sent'")" = 0 ] || it_fail "rows not sent (failed or stuck)"
max=$(it_psql "SELECT max(attempts) FROM $OUTBOX_TABLE")
[ "$max" -le 2 ] || it_fail "max(attempts) is $max after one outage, want <= 2"
amqp_log_has run '"amqp connection lost"' || it_fail "the outage was not noticed"
[ "$(grep -c '"amqp connected"' "$it_dir/run.log")" -ge 2 ] || it_fail "no reconnect logged"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
# Every row at the broker, some twice (those in flight at the stop): the
# consumer stops once the queue stays empty for 3 s (exit 3).
rc=0
amqp_consume --queue "$amqp_ns.q" --count 6000 --idle-timeout 3 >"$it_dir/got.jsonl" \
	2>"$it_dir/got.err" || rc=$?
[ "$rc" = 3 ] || it_fail "consumer exit code $rc: $(cat "$it_dir/got.err")"
jq -r .properties.message_id "$it_dir/got.jsonl" | sort -u >"$it_dir/got.ids"
it_psql "SELECT id FROM $OUTBOX_TABLE" | sort >"$it_dir/rows.ids"
missing=$(comm -13 "$it_dir/got.ids" "$it_dir/rows.ids" | wc -l)
[ "$missing" = 0 ] || it_fail "$missing rows marked sent never reached the queue"
[ "$(wc -l <"$it_dir/got.ids")" = 3000 ] || it_fail "messages of ids not in the table"
echo "ok: 3000 sent across a 10 s broker stop (stopped at $stopped_at), max attempts $max"
