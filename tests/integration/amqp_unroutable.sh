#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Destination errors are not row errors: rows for an unroutable routing
# key and for a missing exchange stay pending (their destination paused,
# attempts given back) while other routing keys flow in the same batches;
# binding a queue and declaring the exchange later delivers them. With
# OUTBOX_UNROUTABLE=fail an unroutable row fails at once with a reason
# naming exchange and routing key.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_unroutable

x="$amqp_ns.x"
missing="$amqp_ns.missing"
amqp_consume --declare-exchange "$x" --queue "$amqp_ns.good" --bind "$x:good.#" ||
	it_fail "cannot set up $x"

# Interleaved, so every batch mixes the three destinations.
it_psql "INSERT INTO $OUTBOX_TABLE (type, exchange, routing_key, payload)
         SELECT 'com.example.t',
                CASE WHEN g % 3 = 2 THEN '$missing' END,
                CASE g % 3 WHEN 0 THEN 'lost.key' WHEN 1 THEN 'good.' || g ELSE 'any' END,
                convert_to(g::text, 'UTF8')
         FROM generate_series(1, 300) g"
lost="routing_key = 'lost.key'"
absent="exchange = '$missing'"

amqp_relay retry OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_BATCH_SIZE=50 OUTBOX_BACKOFF_BASE=200ms
pid=$it_last_pid
it_wait_count 30 "routing_key LIKE 'good.%' AND status = 'sent'" -eq 100
# Give the paused destinations a few rounds of retries.
sleep 3
[ "$(it_count "status = 'failed'")" = 0 ] || it_fail "a destination error failed rows"
[ "$(it_count "($lost OR $absent) AND status = 'sent'")" = 0 ] ||
	it_fail "unroutable or missing-exchange rows marked sent"
[ "$(it_count "($lost OR $absent) AND status IN ('pending', 'in_flight')")" = 200 ] ||
	it_fail "paused rows are not pending"
# Released rows get their attempt back: retries never spend the budget.
[ "$(it_psql "SELECT max(attempts) FROM $OUTBOX_TABLE")" -le 1 ] ||
	it_fail "attempts inflated by destination errors: $(it_psql "SELECT max(attempts) FROM $OUTBOX_TABLE")"
amqp_log_has retry '"destination paused".*lost\.key' ||
	it_fail "no 'destination paused' log line for the unroutable key"
amqp_log_has retry "\"destination paused\".*\"destination\":\"$missing\"" ||
	it_fail "no 'destination paused' log line for the missing exchange"
amqp_log_has retry "unroutable: no queue bound to exchange '$x' for routing key 'lost.key'" ||
	it_fail "the unroutable reason does not name exchange and routing key"
amqp_log_has retry "no exchange '$missing'" ||
	it_fail "the missing exchange is not named"
if amqp_log_has retry '"publisher unhealthy'; then
	it_fail "destination errors made the publisher unhealthy"
fi

# Bind the key and create the exchange: the paused rows go out.
amqp_consume --queue "$amqp_ns.lost" --bind "$x:lost.#" || it_fail "cannot bind lost.#"
amqp_consume --declare-exchange "$missing" --queue "$amqp_ns.found" --bind "$missing:#" ||
	it_fail "cannot declare $missing"
it_wait_count 60 "status = 'sent'" -eq 300
amqp_take "$amqp_ns.lost" 100 "$it_dir/lost.jsonl"
amqp_take "$amqp_ns.found" 100 "$it_dir/found.jsonl"
[ "$(jq -r .properties.message_id "$it_dir/lost.jsonl" | sort -u | wc -l)" = 100 ] ||
	it_fail "the unroutable rows were not delivered once bound"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

# OUTBOX_UNROUTABLE=fail: unroutable rows fail, others still flow.
it_psql "INSERT INTO $OUTBOX_TABLE (type, routing_key, payload)
         SELECT 'com.example.f', CASE WHEN g % 2 = 0 THEN 'nowhere.key' ELSE 'good.f' END, '\\x00'::bytea
         FROM generate_series(1, 20) g"
amqp_relay fail OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_UNROUTABLE=fail
pid=$it_last_pid
it_wait_count 30 "type = 'com.example.f' AND status IN ('sent', 'failed')" -eq 20
it_stop "$pid"
[ "$(it_count "type = 'com.example.f' AND routing_key = 'good.f' AND status = 'sent'")" = 10 ] ||
	it_fail "routable rows did not go out in fail mode"
[ "$(it_count "routing_key = 'nowhere.key' AND status = 'failed' AND attempts = 1
               AND last_error LIKE '%exchange ''$x''%'
               AND last_error LIKE '%routing key ''nowhere.key''%'")" = 10 ] ||
	it_fail "unroutable rows not failed with a reason naming exchange and key: $(it_psql "SELECT DISTINCT last_error FROM $OUTBOX_TABLE WHERE routing_key = 'nowhere.key'")"
echo "ok: paused and delivered later; failed in fail mode"
