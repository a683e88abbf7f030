#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Kafka end to end, read back with kcat. Binary mode: 2000 events to a
# 3-partition topic arrive exactly once each, with the key, headers and
# value the CloudEvents Kafka binding asks for; every key stays in one
# partition in insert order; rows without a key spread over partitions.
# Structured mode with OUTBOX_KAFKA_KEY_FROM=routing_key: valid envelopes,
# the structured content-type, row headers, the routing key as the key.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/kafka_lib.sh"

# ---- binary mode ----
it_table kafka_publish_bin
topic="$kafka_ns.binary"
kafka_topic "$topic" 3
it_psql "INSERT INTO $OUTBOX_TABLE (type, subject, payload, partition_key, headers)
         SELECT 'com.example.order.created', 'order/' || g,
                convert_to('{\"n\":' || g || '}', 'UTF8'),
                CASE WHEN g % 10 = 0 THEN NULL ELSE 'key-' || (g % 17) END,
                '{\"x-tenant\": \"acme\"}'
         FROM generate_series(1, 2000) g"

kafka_relay binary OUTBOX_KAFKA_TOPIC="$topic"
pid=$it_last_pid
it_wait_count 60 "status = 'sent'" -eq 2000
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
[ "$(it_count "attempts <> 1")" = 0 ] || it_fail "rows charged more than one attempt in a clean run"

kafka_take "$topic" 2000 "$it_dir/binary.txt"
# ce_time is created_at in RFC 3339 UTC; checked by shape, then dropped so
# the rest compares exactly with what the table says.
bad_time=$(grep -c -v -E '	ce_specversion=1\.0,ce_id=[^,]+,ce_source=[^,]+,ce_type=[^,]+,ce_time=[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z,' \
	"$it_dir/binary.txt" || true)
[ "$bad_time" = 0 ] || it_fail "$bad_time records without the ce_ attributes in order or a valid ce_time"
cut -f 2- "$it_dir/binary.txt" | sed -E 's/,ce_time=[^,]+,/,/' | sort >"$it_dir/binary.got"
it_psql "SELECT coalesce(partition_key, '') || E'\t'
                || 'ce_specversion=1.0,ce_id=' || id || ',ce_source=' || coalesce(source, relay_source)
                || ',ce_type=' || type || ',ce_subject=' || subject
                || coalesce(',ce_partitionkey=' || partition_key, '')
                || ',content-type=' || content_type || ',x-tenant=acme' || E'\t'
                || convert_from(payload, 'UTF8')
         FROM $OUTBOX_TABLE" | sort >"$it_dir/binary.want"
if ! diff "$it_dir/binary.want" "$it_dir/binary.got" >"$it_dir/binary.diff"; then
	head -n 10 "$it_dir/binary.diff" >&2
	it_fail "records differ from the rows (key, headers or value)"
fi

# One partition per key, and within it the insert order (n grows).
awk -F '\t' '$2 != "" {
		if (($2 in part) && part[$2] != $1) { print "key " $2 " in partitions " part[$2] " and " $1; bad = 1 }
		part[$2] = $1
		n = $4; gsub(/[^0-9]/, "", n); n += 0
		if (n <= last[$2]) { print "key " $2 ": n " n " after " last[$2]; bad = 1 }
		last[$2] = n
	}
	END { exit bad }' "$it_dir/binary.txt" >"$it_dir/order.err" ||
	it_fail "per-key order broken: $(head -n 3 "$it_dir/order.err")"
keyed_parts=$(awk -F '\t' '$2 != "" { print $1 }' "$it_dir/binary.txt" | sort -u | wc -l)
[ "$keyed_parts" = 3 ] || it_fail "17 keys used $keyed_parts of 3 partitions"
# No key: librdkafka's sticky partitioner moves on with every batch.
null_parts=$(awk -F '\t' '$2 == "" { print $1 }' "$it_dir/binary.txt" | sort -u | wc -l)
[ "$null_parts" -gt 1 ] || it_fail "rows without a key all went to one partition"

# ---- structured mode, key from the routing key ----
it_table kafka_publish_str
topic_s="$kafka_ns.structured"
kafka_topic "$topic_s" 3
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, partition_key, routing_key, headers)
         SELECT 'com.example.order.paid', convert_to('{\"n\":' || g || '}', 'UTF8'),
                'pk-' || g, 'rk-' || (g % 5),
                '{\"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\",
                  \"x-tenant\": \"acme\"}'
         FROM generate_series(1, 100) g"
kafka_relay structured OUTBOX_KAFKA_TOPIC="$topic_s" OUTBOX_CE_MODE=structured \
	OUTBOX_KAFKA_KEY_FROM=routing_key
pid=$it_last_pid
it_wait_count 30 "status = 'sent'" -eq 100
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "structured relay exit code $it_rc"

kafka_take "$topic_s" 100 "$it_dir/structured.txt"
# Row headers come in jsonb's key order (shorter keys first).
want_h='content-type=application/cloudevents+json; charset=UTF-8,x-tenant=acme,traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
[ "$(cut -f 3 "$it_dir/structured.txt" | sort -u)" = "$want_h" ] ||
	it_fail "structured headers: $(cut -f 3 "$it_dir/structured.txt" | sort -u | head -n 3)"
# The value is the envelope; the key is the routing key; the partition key
# stays in the event.
cut -f 2,4 "$it_dir/structured.txt" | jq -R -r '
	split("\t") as [$key, $value] | ($value | fromjson) as $e
	| select($e.specversion == "1.0" and $e.type == "com.example.order.paid"
		and $e.datacontenttype == "application/json"
		and $e.partitionkey == ("pk-" + ($e.data.n | tostring))
		and $key == ("rk-" + ($e.data.n % 5 | tostring))
		and $e.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		and ($e.time | test("^[0-9-]+T[0-9:.]+Z$")))
	| $e.id' 2>"$it_dir/jq.err" | sort >"$it_dir/structured.ids" ||
	it_fail "jq failed: $(head -c 500 "$it_dir/jq.err")"
it_psql "SELECT id FROM $OUTBOX_TABLE" | sort >"$it_dir/structured.want"
diff -q "$it_dir/structured.want" "$it_dir/structured.ids" >/dev/null ||
	it_fail "structured envelopes: $(wc -l <"$it_dir/structured.ids") of 100 valid with the right key"
awk -F '\t' '{ if (($2 in p) && p[$2] != $1) bad = 1; p[$2] = $1 } END { exit bad }' \
	"$it_dir/structured.txt" || it_fail "a routing key spread over partitions"
echo "ok: 2000 binary-mode records (keys over $keyed_parts partitions, keyless over $null_parts), 100 structured"
