#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The watchdog: a broker under a memory alarm stops reading mid-message,
# and librabbitmq 0.11 would wait forever to write the rest. The publish
# is broken at its deadline (the connection dropped, the row kept for a
# retry), the relay waits out the alarm, and the row goes out after it.
# Alarms the shared broker: suite amqpfault (run alone).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_watchdog

trap 'amqp_ctl set_vm_memory_high_watermark 0.4 >/dev/null 2>&1 || true; it_cleanup' EXIT

x="$amqp_ns.x"
amqp_consume --declare-exchange "$x" --queue "$amqp_ns.q" --bind "$x:#" || it_fail "cannot set up $x"
# 30 MB: more than the socket buffers hold, in one message.
it_psql "INSERT INTO $OUTBOX_TABLE (type, routing_key, payload)
         SELECT 'com.example.t', 'k.' || g,
                CASE WHEN g = 1 THEN convert_to(repeat('x', 30000000), 'UTF8')
                     ELSE convert_to(g::text, 'UTF8') END
         FROM generate_series(1, 5) g ORDER BY g"

amqp_ctl set_vm_memory_high_watermark 0 >/dev/null || it_fail "cannot raise a memory alarm"
# The message must stay under the relay's own size limit to be sent.
amqp_relay run OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_PUBLISH_TIMEOUT=2s \
	OUTBOX_BACKOFF_BASE=100ms OUTBOX_BACKOFF_MAX=400ms \
	OUTBOX_MAX_EVENT_SIZE=64MiB
pid=$it_last_pid
it_wait 20 "the watchdog in the log" amqp_log_has run 'publish stuck past its deadline'
it_wait 20 "the blocked probe in the log" amqp_log_has run 'broker blocked the connection: low on memory'
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited"
[ "$(it_count "status = 'sent'")" = 0 ] || it_fail "rows sent during the alarm"
[ "$(it_count "status = 'failed'")" = 0 ] || it_fail "rows failed during the alarm"

amqp_ctl set_vm_memory_high_watermark 0.4 >/dev/null || it_fail "cannot lift the memory alarm"
it_wait_count 90 "status = 'sent'" -eq 5
max=$(it_psql "SELECT max(attempts) FROM $OUTBOX_TABLE")
[ "$max" -le 2 ] || it_fail "max(attempts) is $max, want <= 2"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo "ok: stuck publish broken at its deadline, sent after the alarm"
