#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every broker of the test cluster goes down for 10 s under load: the relay
# rides it out in the same process, fails no row, and afterwards every row
# is sent and on the topic; records purged unsent were given back, so no
# row was charged for more than the batch in flight at the cut. SIGTERM
# during an outage exits 0 leaving nothing in flight. Stops the shared
# broker: suite kafkafault (run alone).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/kafka_lib.sh"
it_table kafka_outage

# Whatever happens, the brokers are up again for the next test.
trap 'kafka_ctl all_up >/dev/null 2>&1 || true; it_cleanup' EXIT

topic="$kafka_ns.t"
kafka_topic "$topic" 3
it_psql "INSERT INTO $OUTBOX_TABLE (type, partition_key, payload)
         SELECT 'com.example.t', 'k' || (g % 11), convert_to(g::text, 'UTF8')
         FROM generate_series(1, 3000) g"

# 300 events/s: the load spans the outage. A quick reconnect once the
# brokers are back keeps the test short.
kafka_relay run OUTBOX_KAFKA_TOPIC="$topic" OUTBOX_BATCH_SIZE=50 OUTBOX_MAX_RATE=300 \
	OUTBOX_PUBLISH_TIMEOUT=3s OUTBOX_BACKOFF_BASE=500ms OUTBOX_BACKOFF_MAX=2s \
	OUTBOX_KAFKA_RECONNECT_BACKOFF_MAX_MS=1000
pid=$it_last_pid
it_wait_count 30 "status = 'sent'" -ge 300
kafka_ctl all_down >/dev/null || it_fail "cannot stop the brokers"
down_at=$(it_count "status = 'sent'")
sleep 10
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited while the brokers were down"
[ "$(it_count "status = 'failed'")" = 0 ] || it_fail "rows failed during the outage"
during=$(it_count "status = 'sent'")
kafka_ctl all_up >/dev/null || it_fail "cannot start the brokers"

it_wait_count 90 "status = 'sent'" -eq 3000
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited"
[ "$(grep -c '"outbox-relay started"' "$it_dir/run.log")" = 1 ] || it_fail "the relay restarted"
[ "$down_at" -lt 3000 ] || it_fail "the outage did not happen under load"
# The batches in flight may finish in the moment the brokers go: one a
# lane (one worker's default window of 2 lanes of 50), against 3,000 had
# the relay marked sent what no broker took.
[ "$during" -le $((down_at + 100)) ] || it_fail "$((during - down_at)) rows marked sent while every broker was down"
[ "$(it_count "status <> 'sent'")" = 0 ] || it_fail "rows not sent (failed or stuck)"
max=$(it_psql "SELECT max(attempts) FROM $OUTBOX_TABLE")
[ "$max" -le 2 ] || it_fail "max(attempts) is $max after one outage, want <= 2"
kafka_log_has run '"publisher unhealthy; leasing nothing for it"' || it_fail "the outage was not noticed"
kafka_log_has run '"publisher kafka is healthy"' || it_fail "no recovery logged"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

# At least once: every row on the topic; a record whose outcome was
# unknown at the cut may be there twice.
total=$(timeout 60 kcat -C -q -b "$kafka_brokers" -t "$topic" -o beginning -e -f '%s\n' |
	tee "$it_dir/values.txt" | wc -l)
distinct=$(sort -u "$it_dir/values.txt" | wc -l)
[ "$distinct" = 3000 ] || it_fail "$distinct distinct records on the topic, want 3000"

# SIGTERM while every broker is down, mid-batch: what never left the
# producer is purged and released, the relay exits 0 within the shutdown
# timeout, nothing is left in flight or failed; a new relay sends the rest.
it_psql "INSERT INTO $OUTBOX_TABLE (type, partition_key, payload)
         SELECT 'com.example.t', 'k' || (g % 11), convert_to(g::text, 'UTF8')
         FROM generate_series(3001, 4000) g"
kafka_relay stop OUTBOX_KAFKA_TOPIC="$topic" OUTBOX_BATCH_SIZE=50 OUTBOX_MAX_RATE=300 \
	OUTBOX_PUBLISH_TIMEOUT=3s
pid=$it_last_pid
it_wait_count 30 "status = 'sent'" -ge 3150
kafka_ctl all_down >/dev/null || it_fail "cannot stop the brokers"
sleep 0.5
stop_started=$SECONDS
it_stop "$pid" 30
[ "$it_rc" = 0 ] || it_fail "SIGTERM during the outage: exit code $it_rc"
# Unsent records are purged at once; only the 3 s publish deadline of
# what was in flight may hold the exit up.
[ $((SECONDS - stop_started)) -le 8 ] || it_fail "shutdown during the outage took $((SECONDS - stop_started)) s"
[ "$(it_count "status = 'failed' OR $it_in_flight")" = 0 ] || it_fail "rows left in flight or failed by the shutdown"
kafka_ctl all_up >/dev/null || it_fail "cannot start the brokers"
kafka_relay rest OUTBOX_KAFKA_TOPIC="$topic" OUTBOX_KAFKA_RECONNECT_BACKOFF_MAX_MS=1000
pid=$it_last_pid
it_wait_count 60 "status = 'sent'" -eq 4000
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
# Every row of the second phase on the topic too: a purged record marked
# sent would be missing there.
timeout 60 kcat -C -q -b "$kafka_brokers" -t "$topic" -o beginning -e -f '%s\n' |
	sort -u >"$it_dir/values-all.txt"
seq 1 4000 | sort >"$it_dir/want.txt"
missing=$(comm -13 "$it_dir/values-all.txt" "$it_dir/want.txt" | wc -l)
[ "$missing" = 0 ] || it_fail "$missing rows marked sent are not on the topic: $(comm -13 "$it_dir/values-all.txt" "$it_dir/want.txt" | head -3)"
echo "ok: 3000 sent across a 10 s outage of all brokers (down at $down_at, $((total - 3000)) duplicates), max attempts $max; SIGTERM during an outage exits 0"
