#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A broker that allows one channel per connection (channel_max = 1) and
# stops answering mid-batch: the batch's confirms time out and its channel
# is closed without waiting, so the next channel would have the same
# number while the old one's acks may still be on the way, and librabbitmq
# would hand them over as the new channel's (settling its messages
# unconfirmed). The relay opens no channel under a number whose close the
# broker has not confirmed: it reconnects, and every row goes out once the
# broker answers again. Changes the broker's channel_max and stops the
# broker: suite amqpfault (run alone).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_channel_reuse

old=$(amqp_ctl eval 'application:get_env(rabbit, channel_max).' | sed -nE 's/^\{ok,([0-9]+)\}$/\1/p')
[ -n "$old" ] || it_fail "cannot read the broker's channel_max"
beam=$(amqp_ctl eval 'list_to_integer(os:getpid()).' | tr -dc '0-9')
[ -n "$beam" ] || it_fail "cannot read the broker's pid"
trap 'kill -CONT "$beam" 2>/dev/null || true; amqp_ctl eval "application:set_env(rabbit, channel_max, $old)." >/dev/null 2>&1 || true; it_cleanup' EXIT
# Connections read the limit when they open: set before the relay connects.
amqp_ctl eval "application:set_env(rabbit, channel_max, 1)." >/dev/null ||
	it_fail "cannot set channel_max"

x="$amqp_ns.x"
q="$amqp_ns.q"
amqp_consume --declare-exchange "$x" --queue "$q" --bind "$x:#" || it_fail "cannot set up $x"
amqp_relay run OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_PUBLISH_TIMEOUT=1s OUTBOX_WORKER_WINDOW=1 \
	OUTBOX_BACKOFF_BASE=100ms OUTBOX_BACKOFF_MAX=400ms
pid=$it_last_pid
it_wait 20 "the relay to connect" amqp_log_has run '"amqp connected"'
[ "$(amqp_ctl list_connections channel_max | grep -cx '1')" -ge 1 ] ||
	it_fail "the broker did not give the relay channel_max 1: $(amqp_ctl list_connections channel_max)"

kill -STOP "$beam"
stopped=$SECONDS
it_psql "INSERT INTO $OUTBOX_TABLE (type, routing_key, payload)
         SELECT 'com.example.t', 'k.' || g, convert_to(g::text, 'UTF8')
         FROM generate_series(1, 10) g"
it_wait 20 "the confirm timeout" amqp_log_has run '"publish outcome unknown'
it_wait 20 "the reconnect instead of channel 1 again" amqp_log_has run 'no channel to open: the broker has not confirmed closing channel 1'
kill -CONT "$beam"
echo "broker stopped for $((SECONDS - stopped)) s" >&2

it_wait_count 60 "status = 'sent'" -eq 10
[ "$(it_count "status = 'failed'")" = 0 ] || it_fail "rows failed"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
# Every row arrived, some twice (the first batch's, written before the stop).
rc=0
amqp_consume --queue "$q" --count 100 --idle-timeout 3 >"$it_dir/got.jsonl" 2>/dev/null || rc=$?
[ "$rc" = 3 ] || it_fail "consumer exit code $rc"
jq -r .properties.message_id "$it_dir/got.jsonl" | sort -u >"$it_dir/got.ids"
it_psql "SELECT id FROM $OUTBOX_TABLE" | sort >"$it_dir/rows.ids"
diff -q "$it_dir/got.ids" "$it_dir/rows.ids" >/dev/null || it_fail "consumed ids are not the rows' ids"
echo "ok: no channel reopened under a number still closing; 10 sent"
