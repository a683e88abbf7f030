#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A relay cut off from RabbitMQ mid-stream while its link to Postgres
# stays up. The relay runs in its own network namespace with two veth
# links to the host: one to Postgres, one to a TCP forwarder in front of
# the broker (the way a load balancer sits between them, so the broker's
# side of the connection stays open and silent). The broker link goes
# down while batches are in flight: their confirms never come.
#
# Requires: the relay gives up the dead link within its publish timeout
# and heartbeat, the in-doubt rows go back (never failed: a broker outage
# fails no row), every event reaches the queue once the link returns,
# nothing lost or failed. Reports duplicates and the seconds from the
# link's return to the relay publishing again.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../integration/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../integration/lib.sh"
# shellcheck source-path=SCRIPTDIR source=../integration/amqp_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../integration/amqp_lib.sh"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

events=600
db_subnet="10.231.$part_n"
mq_subnet="10.232.$part_n"
part_link db "$db_subnet"
part_link mq "$mq_subnet"
part_pg_listen "$db_subnet"

amqp_port=$(printf '%s' "$amqp_url" | sed -E 's/.*:([0-9]+)(\/.*)?$/\1/')
coproc forward { exec python3 "$(dirname "${BASH_SOURCE[0]}")/forward.py" "$mq_subnet.1" "$amqp_port"; }
it_pids+=("$forward_PID")
read -r -t 10 fwd_port <&"${forward[0]}" || it_fail "the forwarder did not start"
ns_amqp_url=$(printf '%s' "$amqp_url" | sed -E "s/127\.0\.0\.1:$amqp_port/$mq_subnet.1:$fwd_port/")

it_table amqpcut
x="$amqp_ns.x"
q="$amqp_ns.q"
amqp_consume --declare-exchange "$x" --queue "$q" --bind "$x:#" || it_fail "cannot set up $x"

# A steady stream: 100 events/s for 6 s, so batches are in flight when
# the link goes.
ip netns exec "$part_ns" env OUTBOX_DATABASE_URL="$part_pg_url" OUTBOX_TABLE="$OUTBOX_TABLE" \
	OUTBOX_HTTP_ADDR= OUTBOX_LOG_FORMAT=json OUTBOX_PUBLISHER=amqp \
	OUTBOX_AMQP_URL="$ns_amqp_url" OUTBOX_AMQP_EXCHANGE="$x" OUTBOX_AMQP_HEARTBEAT=2s \
	OUTBOX_BATCH_SIZE=20 OUTBOX_MAX_RATE=100 OUTBOX_PUBLISH_TIMEOUT=3s \
	OUTBOX_LEASE_TIMEOUT=30s OUTBOX_SWEEP_INTERVAL=1s OUTBOX_POLL_INTERVAL=100ms OUTBOX_BACKOFF_BASE=200ms \
	OUTBOX_BACKOFF_MAX=1s OUTBOX_PG_DEAD_PEER_TIMEOUT=6s \
	"$RELAY_TEST_BIN" run >/dev/null 2>"$it_dir/relay.log" &
relay_pid=$!
it_pids+=("$relay_pid")
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'com.example.mq', '\\x00'::bytea
	FROM generate_series(1, $events)" >/dev/null
it_wait_count 30 "status = 'sent'" -ge 100
part_cut mq
sent_at_cut=$(it_count "status = 'sent'")
sleep 8
# Nothing can have been confirmed while the broker was unreachable, and
# nothing may have failed.
[ "$(it_count "status = 'failed'")" = 0 ] || it_fail "rows failed during a broker outage"
sent_during=$(it_count "status = 'sent'")
[ "$sent_during" -le "$((sent_at_cut + 20))" ] ||
	it_fail "$((sent_during - sent_at_cut)) rows marked sent with the broker cut off"
part_restore mq
t_up=$(date +%s.%N)
it_wait_count 60 "status = 'sent'" -gt "$sent_during"
t_back=$(date +%s.%N)
it_wait_count 60 "status = 'sent'" -eq "$events"

amqp_take "$q" "$events" "$it_dir/got.jsonl" 10
# Duplicates arrive after the first copy of everything: drain what is left.
amqp_consume --queue "$q" --count 100000 --idle-timeout 2 >"$it_dir/more.jsonl" 2>/dev/null || true
it_stop "$relay_pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

got=$(cat "$it_dir/got.jsonl" "$it_dir/more.jsonl" | jq -r .properties.message_id | sort -u | wc -l)
total=$(cat "$it_dir/got.jsonl" "$it_dir/more.jsonl" | wc -l)
[ "$got" = "$events" ] || it_fail "the queue holds $got distinct events of $events"
[ "$(it_count "status <> 'sent'")" = 0 ] || it_fail "rows not sent"
grep -q '"amqp connection lost"\|in doubt\|confirm timeout' "$it_dir/relay.log" ||
	it_fail "the relay never noticed the cut"
echo "ok: lost 0, failed 0, duplicates $((total - events)) of $events" \
	"($(awk -v d="$((total - events))" -v n="$events" 'BEGIN { printf "%.1f", 100 * d / n }') %);" \
	"publishing $(part_secs "$t_up" "$t_back") s after the link returned (heartbeat 2 s)"
