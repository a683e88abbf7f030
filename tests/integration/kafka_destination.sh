#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A wrong topic name with topic auto-creation off (as on a production
# cluster): its rows stay pending with their attempts given back, the
# topic is paused (logged with the reason), nothing fails, and the rows
# for the good topic go out meanwhile. Once the topic exists its rows are
# sent. A row naming an impossible topic fails at once with the reason.
# Needs the test broker's --honor-auto-create-flag (tests/run.sh).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/kafka_lib.sh"
it_table kafka_destination

good="$kafka_ns.good"
missing="$kafka_ns.missing"
kafka_topic "$good" 3
it_psql "INSERT INTO $OUTBOX_TABLE (type, exchange, payload)
         SELECT 'com.example.t', CASE WHEN g % 3 = 0 THEN '$missing' END, convert_to(g::text, 'UTF8')
         FROM generate_series(1, 90) g;
         INSERT INTO $OUTBOX_TABLE (type, exchange, payload, subject)
         VALUES ('com.example.t', 'no such/topic', '\\x00', 'bad-name')"

kafka_relay run OUTBOX_KAFKA_TOPIC="$good" OUTBOX_KAFKA_ALLOW_AUTO_CREATE_TOPICS=false \
	OUTBOX_PUBLISH_TIMEOUT=2s OUTBOX_BATCH_SIZE=20
pid=$it_last_pid
it_wait_count 30 "status = 'sent'" -eq 60
it_wait_count 10 "subject = 'bad-name' AND status = 'failed'" -eq 1
[ "$(it_count "subject = 'bad-name' AND last_error LIKE '%not a valid Kafka topic name%'")" = 1 ] ||
	it_fail "the impossible topic failed without the reason"
it_wait 20 "the missing topic paused" kafka_log_has run "\"destination paused\".*\"destination\":\"$missing\".*UNKNOWN_TOPIC"
# Several pause rounds: still nothing failed, nothing charged.
sleep 4
[ "$(it_count "exchange = '$missing' AND status = 'pending' AND attempts = 0")" = 30 ] ||
	it_fail "rows for the missing topic: $(it_psql "SELECT status, attempts, count(*) FROM $OUTBOX_TABLE WHERE exchange = '$missing' GROUP BY 1, 2")"
[ "$(it_count "status = 'failed'")" = 1 ] || it_fail "rows failed for a missing topic"
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited"

# The topic appears: after its pause the rows go out.
kafka_topic "$missing" 3
it_wait_count 60 "exchange = '$missing' AND status = 'sent'" -eq 30
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
kafka_take "$missing" 30 "$it_dir/missing.txt"
kafka_take "$good" 60 "$it_dir/good.txt"
echo "ok: missing topic paused without failing rows, sent once created"
