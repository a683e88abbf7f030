#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A broker nack (a full queue with x-overflow reject-publish) is the event
# class: the row is retried with backoff until its attempts are spent,
# then failed with the reason; the publisher stays healthy and the
# messages the queue took are sent.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_nack

x="$amqp_ns.x"
amqp_consume --declare-exchange "$x" --queue "$amqp_ns.q" --max-length 5 --bind "$x:#" ||
	it_fail "cannot set up $x"
it_psql "INSERT INTO $OUTBOX_TABLE (type, routing_key, payload, max_attempts)
         SELECT 'com.example.t', 'k', convert_to(g::text, 'UTF8'), 3
         FROM generate_series(1, 10) g"

amqp_relay run OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_BACKOFF_BASE=100ms OUTBOX_BACKOFF_MAX=200ms
pid=$it_last_pid
it_wait_count 30 "status IN ('sent', 'failed')" -eq 10
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
[ "$(it_count "status = 'sent' AND attempts = 1")" = 5 ] || it_fail "the queue's 5 messages are not sent"
[ "$(it_count "status = 'failed' AND attempts = 3 AND last_error LIKE '%basic.nack%'")" = 5 ] ||
	it_fail "nacked rows not failed after their 3 attempts: $(it_psql "SELECT status, attempts, last_error FROM $OUTBOX_TABLE WHERE status <> 'sent'")"
if amqp_log_has run '"publisher unhealthy'; then
	it_fail "a nack made the publisher unhealthy"
fi
echo "ok: nacked rows retried, then failed"
