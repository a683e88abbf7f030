#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Produce errors injected at the test broker. Retryable ones (not leader,
# request timed out, not enough replicas) are retried by the idempotent
# producer: every row sent, charged once, each record exactly once on the
# topic. A broker's MSG_SIZE_TOO_LARGE fails the row at once with the
# reason, and the relay goes on. A fatal idempotence error recreates the
# producer and loses nothing. Injects errors into the shared broker:
# suite kafkafault (run alone).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/kafka_lib.sh"
it_table kafka_errors

# Whatever happens, no injected error is left for the next test.
trap 'kafka_ctl clear_errors 0 >/dev/null 2>&1 || true; it_cleanup' EXIT

topic="$kafka_ns.t"
kafka_topic "$topic" 3
it_psql "INSERT INTO $OUTBOX_TABLE (type, partition_key, payload)
         SELECT 'com.example.t', 'k' || (g % 7), convert_to(g::text, 'UTF8')
         FROM generate_series(1, 300) g"
# ApiKey 0 is Produce; each error answers one Produce request.
kafka_ctl push_errors 0 12 NOT_LEADER_FOR_PARTITION REQUEST_TIMED_OUT NOT_ENOUGH_REPLICAS \
	NOT_LEADER_FOR_PARTITION REQUEST_TIMED_OUT NOT_ENOUGH_REPLICAS \
	LEADER_NOT_AVAILABLE REQUEST_TIMED_OUT NOT_ENOUGH_REPLICAS_AFTER_APPEND \
	NOT_LEADER_FOR_PARTITION REQUEST_TIMED_OUT NOT_ENOUGH_REPLICAS >/dev/null ||
	it_fail "cannot inject errors"

# librdkafka's msg debug lines show each error reaching the producer.
kafka_relay run OUTBOX_KAFKA_TOPIC="$topic" OUTBOX_BATCH_SIZE=50 \
	OUTBOX_LOG_LEVEL=debug OUTBOX_KAFKA_DEBUG=msg
pid=$it_last_pid
it_wait_count 60 "status = 'sent'" -eq 300
for e in 'Not leader for partition' 'Request timed out' 'Not enough in-sync replicas'; do
	kafka_log_has run "encountered error: Broker: $e" || it_fail "no Produce request met '$e'"
done
[ "$(it_count "attempts <> 1")" = 0 ] || it_fail "librdkafka's own retries charged rows"
kafka_take "$topic" 300 "$it_dir/retried.txt"
[ "$(cut -f 4 "$it_dir/retried.txt" | sort -u | wc -l)" = 300 ] ||
	it_fail "duplicates or losses on the topic after retries"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

# The broker refuses the next Produce request as too large: only the one
# row in it fails.
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, subject)
         VALUES ('com.example.t', convert_to('refused', 'UTF8'), 'refused')"
kafka_ctl push_errors 0 1 MSG_SIZE_TOO_LARGE >/dev/null || it_fail "cannot inject MSG_SIZE_TOO_LARGE"
kafka_relay refuse OUTBOX_KAFKA_TOPIC="$topic"
pid=$it_last_pid
it_wait_count 30 "subject = 'refused' AND status = 'failed'" -eq 1
[ "$(it_count "subject = 'refused' AND attempts = 1 AND last_error LIKE '%MSG_SIZE_TOO_LARGE%'")" = 1 ] ||
	it_fail "refused row: $(it_psql "SELECT attempts, last_error FROM $OUTBOX_TABLE WHERE subject = 'refused'")"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, subject)
         SELECT 'com.example.t', convert_to('after ' || g, 'UTF8'), 'after'
         FROM generate_series(1, 20) g"
it_wait_count 30 "subject = 'after' AND status = 'sent'" -eq 20
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
[ "$(it_count "status = 'failed'")" = 1 ] || it_fail "more than the refused row failed"

# OUT_OF_ORDER_SEQUENCE_NUMBER on a first request is a fatal idempotence
# error in librdkafka 2.0.2: the producer is recreated, the unconfirmed
# rows are retried keeping their charge, nothing fails.
fatal_t="$kafka_ns.fatal"
kafka_topic "$fatal_t" 1
it_psql "INSERT INTO $OUTBOX_TABLE (type, exchange, payload, subject)
         SELECT 'com.example.t', '$fatal_t', convert_to('fatal ' || g, 'UTF8'), 'fatal'
         FROM generate_series(1, 100) g"
kafka_ctl push_errors 0 1 OUT_OF_ORDER_SEQUENCE_NUMBER >/dev/null ||
	it_fail "cannot inject OUT_OF_ORDER_SEQUENCE_NUMBER"
kafka_relay fatal OUTBOX_KAFKA_TOPIC="$topic" OUTBOX_BATCH_SIZE=50 OUTBOX_BACKOFF_BASE=500ms
pid=$it_last_pid
it_wait_count 30 "subject = 'fatal' AND status = 'sent'" -eq 100
kafka_log_has fatal '"kafka producer fatal error"' || it_fail "no fatal error seen"
kafka_log_has fatal '"recreating the kafka producer after a fatal error"' || it_fail "producer not recreated"
[ "$(grep -c '"outbox-relay started"' "$it_dir/fatal.log")" = 1 ] || it_fail "the relay restarted"
[ "$(it_count "subject = 'fatal' AND attempts = 2")" -ge 1 ] || it_fail "no row was in the failed request"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
[ "$(it_count "status = 'failed'")" = 1 ] || it_fail "rows failed after the fatal error"
kafka_take "$fatal_t" 100 "$it_dir/fatal.txt" '%s\n'
[ "$(sort -u "$it_dir/fatal.txt" | wc -l)" = 100 ] || it_fail "records lost or doubled after the fatal error"
echo "ok: 300 sent through 12 retryable errors, MSG_SIZE_TOO_LARGE failed one row, producer recreated after a fatal error"
