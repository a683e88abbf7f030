#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# AMQP end to end, fault-free: 2000 events reach a bound queue, each
# exactly once, with properties and headers per the binary-mode mapping
# and the payload as body; then structured mode (a valid
# application/cloudevents+json envelope) and the cloudEvents_ prefix.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_publish

x="$amqp_ns.x"
q="$amqp_ns.q"
tp='00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
amqp_consume --declare-exchange "$x" --queue "$q" --bind "$x:#" ||
	it_fail "cannot set up exchange $x and queue $q"

# A mix: NULL exchange (the configured default) and explicit, optional
# attributes set or not, JSON and text payloads, headers on half.
it_psql "INSERT INTO $OUTBOX_TABLE (type, source, subject, content_type, exchange,
                                    routing_key, partition_key, payload, headers)
         SELECT 'com.example.order.v' || (g % 3),
                CASE WHEN g % 4 = 0 THEN 'urn:example:orders' END,
                CASE WHEN g % 2 = 0 THEN 'order/' || g END,
                CASE WHEN g % 5 = 0 THEN 'text/plain' ELSE 'application/json' END,
                CASE WHEN g % 3 = 0 THEN '$x' END,
                'orders.' || (g % 7),
                CASE WHEN g % 6 = 0 THEN 'k' || (g % 11) END,
                CASE WHEN g % 5 = 0 THEN convert_to('line ' || g, 'UTF8')
                     ELSE convert_to(json_build_object('n', g)::text, 'UTF8') END,
                CASE WHEN g % 2 = 1 THEN jsonb_build_object('traceparent', '$tp',
                     'tracestate', 'v=' || g, 'x-tenant', 't' || g)
                     ELSE '{}' END
         FROM generate_series(1, 2000) g"

amqp_relay binary OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_BATCH_SIZE=100
pid=$it_last_pid
it_wait_count 60 "status = 'sent'" -eq 2000
amqp_take "$q" 2000 "$it_dir/binary.jsonl"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
[ "$(it_count "status <> 'sent'")" = 0 ] || it_fail "rows not sent"

# Exactly once, and exactly the table's ids.
jq -r .properties.message_id "$it_dir/binary.jsonl" | sort >"$it_dir/got.ids"
it_psql "SELECT id FROM $OUTBOX_TABLE ORDER BY 1" | sort >"$it_dir/table.ids"
[ "$(uniq -d "$it_dir/got.ids" | wc -l)" = 0 ] || it_fail "duplicates in a fault-free run"
diff -q "$it_dir/got.ids" "$it_dir/table.ids" >/dev/null || it_fail "consumed ids differ from the table's"

# Every message against its row.
it_psql "SELECT json_build_object('id', id, 'type', type, 'source', coalesce(source, relay_source),
                'subject', subject, 'content_type', content_type,
                'exchange', exchange, 'routing_key', routing_key,
                'partition_key', partition_key,
                'payload', translate(encode(payload, 'base64'), E'\n', ''),
                'headers', headers,
                'ts', floor(extract(epoch FROM created_at))::bigint)
         FROM $OUTBOX_TABLE" >"$it_dir/rows.jsonl"
bad=$(jq -n --arg x "$x" --slurpfile msgs "$it_dir/binary.jsonl" --slurpfile rows "$it_dir/rows.jsonl" '
  ($rows | map({key: .id, value: .}) | from_entries) as $by
  | [$msgs[] | . as $m | $by[$m.properties.message_id] as $r
     | select($r == null
         or $m.exchange != ($r.exchange // $x)
         or $m.routing_key != $r.routing_key
         or $m.body_base64 != $r.payload
         or $m.properties.content_type != $r.content_type
         or $m.properties.delivery_mode != 2
         or $m.properties.app_id != "outbox-relay"
         or $m.properties.type != $r.type
         or $m.properties.timestamp != $r.ts
         or $m.headers["ce-specversion"] != "1.0"
         or $m.headers["ce-id"] != $r.id
         or $m.headers["ce-source"] != $r.source
         or $m.headers["ce-type"] != $r.type
         or ($m.headers["ce-time"] | test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]+Z$") | not)
         or $m.headers["ce-subject"] != $r.subject
         or $m.headers["ce-partitionkey"] != $r.partition_key
         or ([$r.headers | to_entries[] | $m.headers[.key] == .value] | all | not)
         or ($m.headers | length) != (5 + ([$r.subject, $r.partition_key] | map(select(. != null)) | length)
                                      + ($r.headers | length)))
     | $m.properties.message_id] | length') || it_fail "jq failed on the messages"
[ "$bad" = 0 ] || it_fail "$bad messages do not match their rows"
# The mix really had both kinds of each optional part.
[ "$(jq -s '[.[] | select(.headers.traceparent == "'"$tp"'")] | length' "$it_dir/binary.jsonl")" = 1000 ] ||
	it_fail "traceparent not carried through"
[ "$(jq -s '[.[] | select(.properties.content_type == "text/plain")] | length' "$it_dir/binary.jsonl")" = 400 ] ||
	it_fail "text/plain rows not seen"

# Structured mode: the envelope in the body, the row headers as headers.
it_psql "INSERT INTO $OUTBOX_TABLE (type, routing_key, payload, headers, subject)
         SELECT 'com.example.structured', 'structured.k',
                convert_to(json_build_object('n', g)::text, 'UTF8'),
                CASE WHEN g % 2 = 0 THEN jsonb_build_object('traceparent', '$tp', 'x-tenant', 'acme')
                     ELSE '{}' END, 's' || g
         FROM generate_series(1, 50) g"
amqp_relay structured OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_CE_MODE=structured
pid=$it_last_pid
it_wait_count 30 "status = 'sent'" -eq 2050
amqp_take "$q" 50 "$it_dir/structured.jsonl"
it_stop "$pid"
it_psql "SELECT json_build_object('id', id, 'source', coalesce(source, relay_source), 'headers', headers,
                'n', convert_from(payload, 'UTF8')::json->'n')
         FROM $OUTBOX_TABLE WHERE type = 'com.example.structured'" >"$it_dir/srows.jsonl"
bad=$(jq -n --slurpfile msgs "$it_dir/structured.jsonl" --slurpfile rows "$it_dir/srows.jsonl" '
  ($rows | map({key: .id, value: .}) | from_entries) as $by
  | [$msgs[] | . as $m | $by[$m.properties.message_id] as $r
     | ($m.body_base64 | @base64d | fromjson) as $e
     | select($r == null
         or $m.properties.content_type != "application/cloudevents+json; charset=UTF-8"
         or $m.properties.delivery_mode != 2
         or $m.routing_key != "structured.k"
         or $e.specversion != "1.0" or $e.id != $r.id or $e.source != $r.source
         or $e.type != "com.example.structured" or $e.datacontenttype != "application/json"
         or $e.data != {n: $r.n} or ($e.subject | startswith("s") | not)
         or $e.traceparent != $r.headers.traceparent
         or $m.headers != $r.headers)
     | $m.properties.message_id] | length') || it_fail "jq failed on the structured messages"
[ "$bad" = 0 ] || it_fail "$bad structured messages are not valid envelopes of their rows"

# The cloudEvents_ prefix (AMQP 1.0 consumers through RabbitMQ).
it_psql "INSERT INTO $OUTBOX_TABLE (type, routing_key, payload)
         SELECT 'com.example.prefixed', 'prefixed.k', '\\x01'::bytea FROM generate_series(1, 10)"
amqp_relay prefixed OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_AMQP_HEADER_PREFIX=cloudEvents_
pid=$it_last_pid
it_wait_count 30 "status = 'sent'" -eq 2060
amqp_take "$q" 10 "$it_dir/prefixed.jsonl"
it_stop "$pid"
bad=$(jq -s '[.[] | select(.headers.cloudEvents_id != .properties.message_id
                          or .headers.cloudEvents_type != "com.example.prefixed"
                          or .headers.cloudEvents_specversion != "1.0"
                          or .headers["ce-id"] != null or .body_base64 != "AQ==")] | length' \
	"$it_dir/prefixed.jsonl")
[ "$bad" = 0 ] || it_fail "$bad messages without cloudEvents_ headers"
echo "ok: 2000 binary, 50 structured, 10 prefixed events, each once"
