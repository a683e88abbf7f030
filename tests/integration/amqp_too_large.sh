#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A message over the broker's max_message_size fails its row at once with
# a clear reason; the rest of its batch, written on the channel the broker
# closed, goes out on a new one. Changes the broker's limit: suite
# amqpfault (run alone).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_too_large

limit=1048576
old=$(amqp_ctl eval 'application:get_env(rabbit, max_message_size).' | sed -nE 's/^\{ok,([0-9]+)\}$/\1/p')
[ -n "$old" ] || it_fail "cannot read the broker's max_message_size"
# Channels read the limit when they open: set before the relay connects,
# restored whatever happens.
trap 'amqp_ctl eval "application:set_env(rabbit, max_message_size, $old)." >/dev/null 2>&1 || true; it_cleanup' EXIT
amqp_ctl eval "application:set_env(rabbit, max_message_size, $limit)." >/dev/null ||
	it_fail "cannot set max_message_size"

x="$amqp_ns.x"
q="$amqp_ns.q"
amqp_consume --declare-exchange "$x" --queue "$q" --bind "$x:#" || it_fail "cannot set up $x"
# The big one sits in the middle of one batch.
it_psql "INSERT INTO $OUTBOX_TABLE (type, routing_key, payload)
         SELECT 'com.example.t', 'k.' || g,
                CASE WHEN g = 11 THEN convert_to(repeat('x', 1500000), 'UTF8')
                     ELSE convert_to(g::text, 'UTF8') END
         FROM generate_series(1, 21) g ORDER BY g"

amqp_relay run OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_BATCH_SIZE=100
pid=$it_last_pid
it_wait_count 30 "status IN ('sent', 'failed')" -eq 21
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

[ "$(it_count "routing_key = 'k.11' AND status = 'failed' AND attempts = 1
               AND last_error LIKE 'message too large: body of 1500000 bytes is over the broker''s max_message_size of $limit bytes'")" = 1 ] ||
	it_fail "the big row is not failed with a clear reason: $(it_psql "SELECT status, last_error FROM $OUTBOX_TABLE WHERE routing_key = 'k.11'")"
[ "$(it_count "routing_key <> 'k.11' AND status = 'sent' AND attempts = 1")" = 20 ] ||
	it_fail "the rest of the batch was not sent on the first attempt"
if amqp_log_has run '"publisher unhealthy'; then
	it_fail "one oversized message made the publisher unhealthy"
fi

# Every small event arrived (re-sent ones may arrive twice), the big one
# never.
rc=0
amqp_consume --queue "$q" --count 100 --idle-timeout 3 >"$it_dir/got.jsonl" 2>/dev/null || rc=$?
[ "$rc" = 3 ] || it_fail "consumer exit code $rc"
jq -r .properties.message_id "$it_dir/got.jsonl" | sort -u >"$it_dir/got.ids"
it_psql "SELECT id FROM $OUTBOX_TABLE WHERE routing_key <> 'k.11'" | sort >"$it_dir/small.ids"
diff -q "$it_dir/got.ids" "$it_dir/small.ids" >/dev/null || it_fail "consumed ids are not the small rows' ids"
echo "ok: oversized row failed, the other 20 sent"
