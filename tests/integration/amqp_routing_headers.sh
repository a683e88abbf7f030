#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A row whose own headers name CC or BCC, which RabbitMQ reads as extra
# routing keys (sender-selected distribution) and refuses unless they are
# an array, fails at once with a reason that says so, without reaching the
# broker; the rest of its batch goes out on the first attempt.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_routing_headers

x="$amqp_ns.x"
q="$amqp_ns.q"
amqp_consume --declare-exchange "$x" --queue "$q" --bind "$x:#" || it_fail "cannot set up $x"
it_psql "INSERT INTO $OUTBOX_TABLE (type, routing_key, payload, headers)
         SELECT 'com.example.t', 'k.' || g, convert_to(g::text, 'UTF8'),
                CASE g WHEN 4 THEN '{\"CC\": \"k.other\"}'::jsonb
                       WHEN 8 THEN '{\"BCC\": \"k.other\"}'::jsonb
                       ELSE '{\"cc\": \"a lower-case name is no routing header\"}'::jsonb END
         FROM generate_series(1, 12) g ORDER BY g"

amqp_relay run OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_BATCH_SIZE=100
pid=$it_last_pid
it_wait_count 30 "status IN ('sent', 'failed')" -eq 12
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

for h in 4:CC 8:BCC; do
	[ "$(it_count "routing_key = 'k.${h%%:*}' AND status = 'failed' AND attempts = 1
	               AND last_error LIKE 'header ${h#*:}: %routing keys%'")" = 1 ] ||
		it_fail "the row with header ${h#*:} is not failed with a clear reason: $(it_psql "SELECT status, attempts, last_error FROM $OUTBOX_TABLE WHERE routing_key = 'k.${h%%:*}'")"
done
[ "$(it_count "status = 'sent' AND attempts = 1")" = 10 ] ||
	it_fail "the rest of the batch was not sent on the first attempt: $(it_psql "SELECT routing_key, status, attempts, last_error FROM $OUTBOX_TABLE WHERE status <> 'sent' OR attempts <> 1")"
if amqp_log_has run '"publisher unhealthy'; then
	it_fail "a routing header made the publisher unhealthy"
fi
amqp_take "$q" 10 "$it_dir/got.jsonl" 5
jq -r .properties.message_id "$it_dir/got.jsonl" | sort -u >"$it_dir/got.ids"
it_psql "SELECT id FROM $OUTBOX_TABLE WHERE status = 'sent'" | sort >"$it_dir/sent.ids"
diff -q "$it_dir/got.ids" "$it_dir/sent.ids" >/dev/null || it_fail "consumed ids are not the sent rows' ids"
echo "ok: the CC and BCC rows failed with a reason, the other 10 sent once"
