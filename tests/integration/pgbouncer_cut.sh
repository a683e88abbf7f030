#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A relay behind PgBouncer in transaction mode, cut off from the pooler by
# the network while it holds leased rows: packets vanish (the host end of
# its link goes down), the pooler keeps the relay's server connection in
# its open lease transaction, and nothing on the pooler's side notices.
# The server still ends that transaction at the lease timeout (the lease
# set it for itself, docs/design.md §4), with the pool's defaults and
# with server_reset_query_always; a second relay delivers the rows, and
# the cut relay publishes again once its link is back.
# Needs root (ip netns), like the partition harness.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null 2>&1; then
	echo "skipped: needs root and ip (iproute2) for a network namespace"
	exit 77
fi
. "$(dirname "$0")/pgbouncer_lib.sh"

# The relay's namespace and its link: host end .1, relay's end .2.
ns="orpgb$$"
host_if="opb$$"
net="10.233.$(($$ % 250 + 1))"
teardown() {
	bouncer_stop_all
	ip netns del "$ns" 2>/dev/null || true
	ip link del "$host_if" 2>/dev/null || true
}
trap 'teardown; it_cleanup' EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
ip link add "$host_if" type veth peer name "${host_if}n"
ip link set "${host_if}n" netns "$ns"
ip addr add "$net.1/30" dev "$host_if"
ip link set "$host_if" up
ip -n "$ns" addr add "$net.2/30" dev "${host_if}n"
ip -n "$ns" link set "${host_if}n" up

readonly lease_timeout_s=3

# delivered_by LOG ID PID: the delivery log has ID from relay PID.
delivered_by() {
	grep '"id":"'"$2"'"' "$1" | grep -q '"pid":'"$3"
}

# published_more LOG PID N: relay PID has more than N deliveries in LOG.
published_more() {
	[ "$(grep -c '"pid":'"$2" "$1" || true)" -gt "$3" ]
}

round() {
	local reset="$1" url cut_url log t0 released held slow fast tries=0
	bouncer_start "$reset" PGBOUNCER_EXTRA_ADDR="$net.1"
	url=$bouncer_url
	cut_url="postgresql://outbox@$net.1:$bouncer_port/outbox"

	it_table "pgbcut${reset}"
	it_psql "INSERT INTO $OUTBOX_TABLE (type, payload)
	         SELECT 'pool.cut', convert_to(json_build_object('n', g)::text, 'UTF8')
	         FROM generate_series(1, 30) g"
	log="$it_dir/cut-$reset.jsonl"
	# relay NAME URL [ip netns exec NS]: a flaky-publisher relay through
	# the pool at URL.
	relay() {
		local name="$1" at="$2"
		shift 2
		env OUTBOX_DATABASE_URL="$at" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR= \
			OUTBOX_PG_PREPARE=off OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" \
			RELAY_TEST_FLAKY_DELAY_MS="${delay:-0}" \
			OUTBOX_BATCH_SIZE=5 OUTBOX_LEASE_TIMEOUT=${lease_timeout_s}s \
			OUTBOX_PUBLISH_TIMEOUT=500ms OUTBOX_STATEMENT_TIMEOUT=1s \
			OUTBOX_SWEEP_INTERVAL=300ms OUTBOX_POLL_INTERVAL=100ms \
			"$@" "$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/$name-$reset.log" &
		it_last_pid=$!
		it_pids+=("$it_last_pid")
	}
	delay=400 relay cut "$cut_url" ip netns exec "$ns"
	slow=$it_last_pid
	local slow_held="id IN (SELECT unnest(ids) FROM ${OUTBOX_TABLE}_claims WHERE
		holder LIKE '%/$slow/%' AND pg_xact_status(xid) = 'in progress')"
	# Cut while it holds rows (a lease may end between the look and the
	# cut: then the link comes back and it is cut again).
	while :; do
		it_wait_count 30 "$slow_held" -ge 1
		ip link set "$host_if" down
		t0=$(date +%s%N)
		held=$(it_psql "SELECT id FROM $OUTBOX_TABLE WHERE $slow_held")
		[ -z "$held" ] || break
		tries=$((tries + 1))
		[ "$tries" -lt 5 ] || it_fail "reset=$reset: the relay held nothing when cut"
		ip link set "$host_if" up
	done
	# The lease timeout, and a few seconds for a loaded machine: the
	# session settings of older relays let go after 10 s or never.
	local deadline=$((SECONDS + lease_timeout_s + 4))
	while [ "$(it_count "$slow_held")" -gt 0 ]; do
		[ "$SECONDS" -lt "$deadline" ] ||
			it_fail "reset=$reset: a relay cut off from the pool with a lease open still held its rows $((lease_timeout_s + 4))s later (lease timeout ${lease_timeout_s}s)"
		sleep 0.2
	done
	released=$((($(date +%s%N) - t0) / 1000000))
	relay fast "$url"
	fast=$it_last_pid
	it_wait_count 60 "status = 'sent'" -ge 20
	for id in $held; do
		it_wait 30 "row $id from the second relay" delivered_by "$log" "$id" "$fast"
	done
	it_wait_count 60 "status = 'sent'" -eq 30
	it_stop "$fast"
	# Back on the link, the cut relay publishes again.
	local before
	before=$(grep -c '"pid":'"$slow" "$log" || true)
	ip link set "$host_if" up
	it_psql "INSERT INTO $OUTBOX_TABLE (type, payload)
	         SELECT 'pool.cut.after', convert_to(json_build_object('n', g)::text, 'UTF8')
	         FROM generate_series(1, 10) g"
	it_wait 60 "the cut relay to publish again" published_more "$log" "$slow" "$before"
	it_wait_count 60 "status = 'sent'" -eq 40
	it_stop "$slow"
	echo "reset=$reset: a relay cut off from the pool with $(echo "$held" | wc -w) rows leased lost them after ${released} ms (lease timeout ${lease_timeout_s}s); another relay delivered them and the cut relay published again after the link returned"
	bouncer_stop
}

round 0
round 1
echo "ok: behind pgbouncer a relay cut off with a lease open loses it at the lease timeout, with and without server_reset_query_always"
