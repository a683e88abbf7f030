#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A memory alarm held longer than the whole backoff schedule: the broker
# blocks the connection, publishing pauses, no row fails and attempts are
# not spent on the wait; lifting the alarm drains everything. Alarms the
# shared broker: suite amqpfault (run alone).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_alarm

trap 'amqp_ctl set_vm_memory_high_watermark 0.4 >/dev/null 2>&1 || true; it_cleanup' EXIT

x="$amqp_ns.x"
amqp_consume --declare-exchange "$x" --queue "$amqp_ns.q" --bind "$x:#" || it_fail "cannot set up $x"
it_psql "INSERT INTO $OUTBOX_TABLE (type, routing_key, payload)
         SELECT 'com.example.t', 'k.' || (g % 10), convert_to(g::text, 'UTF8')
         FROM generate_series(1, 2000) g"

amqp_relay run OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_BATCH_SIZE=20 OUTBOX_MAX_RATE=200 \
	OUTBOX_BACKOFF_BASE=100ms OUTBOX_BACKOFF_MAX=400ms OUTBOX_PUBLISH_TIMEOUT=2s
pid=$it_last_pid
it_wait_count 30 "status = 'sent'" -ge 200
amqp_ctl set_vm_memory_high_watermark 0 >/dev/null || it_fail "cannot raise a memory alarm"
it_wait 15 "the blocked connection in the log" amqp_log_has run '"amqp broker blocked the connection'
# What was in flight settles within the publish timeout; then nothing.
sleep 3
paused_at=$(it_count "status = 'sent'")
sleep 6
[ "$(it_count "status = 'sent'")" = "$paused_at" ] || it_fail "publishing went on during the alarm"
[ "$paused_at" -lt 2000 ] || it_fail "the alarm did not happen under load"
[ "$(it_count "status = 'failed'")" = 0 ] || it_fail "rows failed during the alarm"
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited during the alarm"
amqp_log_has run 'broker blocked the connection: low on memory' || it_fail "the probe does not say why"

amqp_ctl set_vm_memory_high_watermark 0.4 >/dev/null || it_fail "cannot lift the memory alarm"
it_wait_count 90 "status = 'sent'" -eq 2000
[ "$(it_count "status <> 'sent'")" = 0 ] || it_fail "rows not sent"
max=$(it_psql "SELECT max(attempts) FROM $OUTBOX_TABLE")
[ "$max" -le 2 ] || it_fail "max(attempts) is $max after one alarm, want <= 2"
amqp_log_has run '"amqp broker unblocked the connection"' || it_fail "no unblock logged"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo "ok: paused at $paused_at during the alarm, 2000 sent after, max attempts $max"
