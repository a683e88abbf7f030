#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The demo, on a fresh Debian machine: installs what it needs, builds the
# relay, starts a throwaway PostgreSQL and RabbitMQ on loopback, migrates,
# writes sample events the way an application does (domain row + outbox
# rows in one transaction), runs the relay, shows the CloudEvents arriving
# at a queue and the final row states, then cleans everything up.
#
# Usage: deploy/local/demo.sh [--stdout | --kafka]
#   (default)  RabbitMQ: the relay publishes to a demo exchange and the
#              demo consumes the queue bound to it
#   --stdout   the relay prints each CloudEvent as one JSON line
#   --kafka    the Kafka test broker (librdkafka's mock cluster, a test
#              stand-in: production points at a real cluster)
set -euo pipefail

mode=amqp
case "${1:-}" in
"") ;;
--stdout) mode=stdout ;;
--kafka) mode=kafka ;;
*)
	echo "usage: $0 [--stdout | --kafka]" >&2
	exit 2
	;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build-demo"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "installing dependencies (apt-get, skipped when present)"
"$root/deploy/install-deps.sh"

say "building"
if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" "$root" --buildtype=release >/dev/null
fi
ninja -C "$build" >/dev/null
relay="$build/outbox-relay"

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-demo.XXXXXX")
chmod 755 "$work"
relay_pid=""
cleanup() {
	# Under errexit a failing test here would end the trap early.
	if [ -n "$relay_pid" ]; then
		kill -9 "$relay_pid" 2>/dev/null || true
	fi
	bash "$root/tests/services/kafka.sh" stop "$work/kafka" >/dev/null 2>&1 || true
	bash "$root/tests/services/rabbitmq.sh" stop "$work/rabbitmq" >/dev/null 2>&1 || true
	bash "$root/tests/services/postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/pg" "$work/rabbitmq" "$work/kafka"

say "starting PostgreSQL on loopback"
bash "$root/tests/services/postgres.sh" start "$work/pg" >/dev/null
db=$(sed -n 's/^RELAY_TEST_DATABASE_URL=//p' "$work/pg/env")
export OUTBOX_DATABASE_URL="$db" OUTBOX_TABLE=outbox_events
export OUTBOX_HTTP_ADDR="" OUTBOX_LOG_FORMAT=text OUTBOX_POLL_INTERVAL=500ms
export OUTBOX_CE_SOURCE="urn:example:orders-service"

case "$mode" in
amqp)
	say "starting RabbitMQ on loopback (about 8 s)"
	bash "$root/tests/services/rabbitmq.sh" start "$work/rabbitmq" >/dev/null
	amqp=$(sed -n 's/^RELAY_TEST_AMQP_URL=//p' "$work/rabbitmq/env")
	# A topic exchange for the events and a queue bound to order.*.
	"$build/tests/amqp_consume" --url "$amqp" --declare-exchange demo.events \
		--queue demo.orders --bind 'demo.events:order.#'
	export OUTBOX_PUBLISHER=amqp OUTBOX_AMQP_URL="$amqp" OUTBOX_AMQP_EXCHANGE=demo.events
	;;
kafka)
	say "starting the Kafka test broker (librdkafka's mock cluster)"
	bash "$root/tests/services/kafka.sh" start "$work/kafka" "$build/tests/kafka_mock_broker" >/dev/null
	brokers=$(sed -n 's/^RELAY_TEST_KAFKA_BROKERS=//p' "$work/kafka/env")
	export OUTBOX_PUBLISHER=kafka OUTBOX_KAFKA_BROKERS="$brokers" OUTBOX_KAFKA_TOPIC=demo.orders
	;;
stdout)
	export OUTBOX_PUBLISHER=stdout
	;;
esac

say "outbox-relay migrate"
"$relay" migrate

say "the application writes orders and their events in one transaction each"
psql "$db" -X -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE demo_orders (id int PRIMARY KEY, customer text, total numeric);
-- Each order: the domain row and its events commit together or not at all.
BEGIN;
INSERT INTO demo_orders VALUES (1, 'ada', 19.90);
SELECT outbox_events_enqueue_json('com.example.order.created.v1',
  '{"orderId": 1, "customer": "ada", "total": "19.90"}', 'order-1',
  p_routing_key => 'order.created', p_subject => 'order/1');
SELECT outbox_events_enqueue_json('com.example.order.paid.v1',
  '{"orderId": 1, "method": "card"}', 'order-1',
  p_routing_key => 'order.paid', p_subject => 'order/1',
  p_headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}');
COMMIT;
BEGIN;
INSERT INTO demo_orders VALUES (2, 'grace', 5.00);
SELECT outbox_events_enqueue_json('com.example.order.created.v1',
  '{"orderId": 2, "customer": "grace", "total": "5.00"}', 'order-2',
  p_routing_key => 'order.created', p_subject => 'order/2');
COMMIT;
-- A plain INSERT works too; this one carries a control character in its
-- subject, which no CloudEvent may hold: it will end failed, with why.
INSERT INTO outbox_events (type, routing_key, subject, payload)
VALUES ('com.example.order.cancelled.v1', 'order.cancelled', E'order/3\x01', '{"orderId": 3}');
SQL
psql "$db" -X -c "SELECT seq, type, partition_key, status FROM outbox_events ORDER BY seq"

say "running the relay (publisher: $OUTBOX_PUBLISHER)"
"$relay" run >"$work/relay.out" 2>"$work/relay.log" &
relay_pid=$!
for _ in $(seq 1 100); do
	left=$(psql "$db" -X -A -t -c "SELECT count(*) FROM outbox_events WHERE status IN ('pending', 'in_flight')")
	[ "$left" = 0 ] && break
	sleep 0.1
done
if ! kill -TERM "$relay_pid" 2>/dev/null; then
	rc=0
	wait "$relay_pid" || rc=$?
	relay_pid=""
	sed 's/^/  relay: /' "$work/relay.log" >&2
	echo "demo: the relay exited by itself (status $rc) before the events were out" >&2
	exit 1
fi
wait "$relay_pid" || true
relay_pid=""
sed 's/^/  relay: /' "$work/relay.log"

say "CloudEvents as they arrived"
case "$mode" in
amqp)
	"$build/tests/amqp_consume" --url "$amqp" --queue demo.orders --count 3 --idle-timeout 5 |
		jq '{routing_key, properties, headers, body: (.body_base64 | @base64d | (fromjson? // .))}'
	;;
kafka)
	kcat -b "$brokers" -C -t demo.orders -e -o beginning -q \
		-f 'partition %p key %k\nheaders %h\nvalue %s\n\n'
	;;
stdout)
	jq . "$work/relay.out"
	;;
esac

say "final row states"
psql "$db" -X -c "SELECT seq, type, status, attempts, last_error FROM outbox_events ORDER BY seq"
say "done: everything started by the demo is stopped and removed"
