#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Ordered delivery under faults (docs/design.md §6): 3 relay processes x 2
# workers x a window of 3 lanes, 200 keys x 50 events, 5 % of publishes
# failing retryably, each batch acknowledged in a random order, and
# one relay killed -9 mid-run. Deliveries go to one shared log in global
# order (the flaky test backend); for every key the first deliveries
# follow seq, and nothing is lost.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
it_table ordflaky
schema=${OUTBOX_TABLE%.*}
it_psql "DO \$\$ BEGIN
  FOR n IN 1..50 LOOP
    PERFORM $schema.outbox_events_enqueue_json('order.step',
      jsonb_build_object('n', n), 'key-' || k)
    FROM generate_series(1, 200) k;
  END LOOP; END \$\$"

log="$it_dir/deliveries.jsonl"
flaky_relay() {
	local name="$1"
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
		OUTBOX_HTTP_ADDR= OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" \
		RELAY_TEST_FLAKY_PERCENT=5 RELAY_TEST_FLAKY_SHUFFLE=1 OUTBOX_ORDERING=partition \
		OUTBOX_WORKERS=2 OUTBOX_WORKER_WINDOW=3 \
		OUTBOX_LEASE_TIMEOUT=3s OUTBOX_PUBLISH_TIMEOUT=1s OUTBOX_STATEMENT_TIMEOUT=1s \
		OUTBOX_SWEEP_INTERVAL=500ms OUTBOX_POLL_INTERVAL=100ms \
		OUTBOX_BACKOFF_BASE=100ms OUTBOX_BACKOFF_MAX=400ms \
		"$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/$name.log" &
	it_last_pid=$!
	it_pids+=("$it_last_pid")
}
flaky_relay r1
p1=$it_last_pid
flaky_relay r2
p2=$it_last_pid
flaky_relay r3
p3=$it_last_pid
it_wait_count 60 "status = 'sent'" -ge 2500
kill -9 "$p2"
it_wait_count 180 "status = 'sent'" -eq 10000
it_stop "$p1"
it_stop "$p3"

retried=$(it_count "attempts >= 2")
[ "$retried" -gt 0 ] || it_fail "no publish failed: the 5 % injection did not happen"
violations=$(it_order_violations "$log")
[ "$violations" = 0 ] || it_fail "$violations first deliveries out of seq order"
delivered=$(cut -f1 "$it_dir/deliveries.tsv" | sort -u | wc -l)
[ "$delivered" = 10000 ] || it_fail "$delivered distinct events delivered, want 10000"
echo "ok: 10000 events in per-key order; $retried retried after injected nacks, one relay killed"
