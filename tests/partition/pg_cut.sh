#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A relay cut off from Postgres while it holds a lease, with nothing to
# tell either side: the relay runs in its own network namespace, joined to
# the host by a veth pair, and the host end goes down mid-batch. No FIN,
# no RST: only keepalives can notice (README, "Cut links and half-open
# connections").
#
# With OUTBOX_PG_DEAD_PEER_TIMEOUT=6s and a lease of 2 minutes, the server
# must end the cut relay's session (and with it the lease transaction and
# its row locks) within about the window, not the lease; a second relay on
# the host then delivers every row; when the link comes back the cut relay
# must have concluded nothing (its commit refused), must publish again,
# and nothing is lost. Reports the seconds from the cut to the server
# letting go, and from the link's return to the cut relay publishing again.
#
# Needs root and iproute2 (`ip netns`); fails, never skips, without them.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../integration/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../integration/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
: "${RELAY_TEST_PG_DIR:?run through tests/run.sh}"

[ "$(id -u)" = 0 ] || it_fail "needs root to make a network namespace"
command -v ip >/dev/null || it_fail "needs ip (iproute2) for network namespaces"

# Names and a /30 of our own, from the pid, so parallel runs never clash.
n=$(($$ % 250 + 1))
ns="orpart$$"
host_if="orh$$"
ns_if="orn$$"
host_ip="10.231.$n.1"
ns_ip="10.231.$n.2"
window_s=6

pg_dir="$RELAY_TEST_PG_DIR"
pg_data=$(sed -n 's/^PG_DATA=//p' "$pg_dir/env")
pg_port=$(sed -n 's/^PGPORT=//p' "$pg_dir/env")
services="$RELAY_TEST_SOURCE_ROOT/tests/services"

reconfigured=0
restore() {
	ip netns del "$ns" 2>/dev/null || true
	ip link del "$host_if" 2>/dev/null || true
	if [ "$reconfigured" = 1 ]; then
		# In place, so the files keep their owner (the server's user).
		sed -i "/# partition test/d" "$pg_data/pg_hba.conf"
		chown --reference="$pg_data" "$pg_data/pg_hba.conf"
		it_psql "ALTER SYSTEM RESET listen_addresses" >/dev/null 2>&1 || true
		bash "$services/postgres.sh" restart "$pg_dir" >/dev/null 2>&1 || true
	fi
}
trap 'restore; it_cleanup' EXIT

ip netns add "$ns" || it_fail "cannot create network namespace $ns"
ip link add "$host_if" type veth peer name "$ns_if" || it_fail "cannot create a veth pair"
ip link set "$ns_if" netns "$ns"
ip addr add "$host_ip/30" dev "$host_if"
ip link set "$host_if" up
ip netns exec "$ns" ip addr add "$ns_ip/30" dev "$ns_if"
ip netns exec "$ns" ip link set "$ns_if" up
ip netns exec "$ns" ip link set lo up

# Postgres listens on the host end of the link too, for this test only.
reconfigured=1
echo "host all all $ns_ip/32 scram-sha-256 # partition test" >>"$pg_data/pg_hba.conf"
it_psql "ALTER SYSTEM SET listen_addresses = '127.0.0.1,$host_ip'" >/dev/null
bash "$services/postgres.sh" restart "$pg_dir" >/dev/null || it_fail "cannot restart postgres"
ns_url=$(printf '%s' "$RELAY_TEST_DATABASE_URL" | sed "s/127\.0\.0\.1:$pg_port/$host_ip:$pg_port/")
[ "$ns_url" != "$RELAY_TEST_DATABASE_URL" ] || it_fail "cannot rewrite the database URL for $host_ip"

it_table partition
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'com.example.cut', '\\x00'::bytea
	FROM generate_series(1, 30)" >/dev/null

log="$it_dir/deliveries.jsonl"
relay_env=(OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR= OUTBOX_LOG_FORMAT=json
	OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" OUTBOX_BATCH_SIZE=10
	OUTBOX_LEASE_TIMEOUT=2m OUTBOX_PUBLISH_TIMEOUT=20s OUTBOX_STATEMENT_TIMEOUT=5s
	OUTBOX_SWEEP_INTERVAL=500ms OUTBOX_POLL_INTERVAL=100ms
	OUTBOX_PG_DEAD_PEER_TIMEOUT="${window_s}s")

# The relay to cut: 400 ms per event, so a batch of 10 holds its lease 4 s.
ip netns exec "$ns" env OUTBOX_DATABASE_URL="$ns_url" "${relay_env[@]}" \
	RELAY_TEST_FLAKY_DELAY_MS=400 "$RELAY_TEST_FLAKY_BIN" run \
	>/dev/null 2>"$it_dir/cut.log" &
cut_pid=$!
it_pids+=("$cut_pid")

it_wait_count 30 "$it_in_flight" -ge 1
sessions="SELECT count(*) FROM pg_stat_activity WHERE client_addr = '$ns_ip'"
[ "$(it_psql "$sessions")" -ge 1 ] || it_fail "the cut relay has no session from $ns_ip"
ip link set "$host_if" down
t_cut=$(date +%s.%N)

# The server's keepalives (set by the relay for its sessions) must end the
# sessions within about the window; the lease timeout alone would take 2 min.
deadline=$((SECONDS + 4 * window_s))
until [ "$(it_psql "$sessions")" = 0 ]; do
	[ "$SECONDS" -lt "$deadline" ] ||
		it_fail "the server kept the cut relay's sessions for over $((4 * window_s)) s: $(it_psql "SELECT state, xact_start FROM pg_stat_activity WHERE client_addr = '$ns_ip'")"
	sleep 0.2
done
t_gone=$(date +%s.%N)

# A relay on the host delivers everything, the cut relay's batch included
# (charged by the sweeper once its lease transaction aborted).
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "${relay_env[@]}" \
	"$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/host.log" &
host_pid=$!
it_pids+=("$host_pid")
it_wait_count 60 "status = 'sent'" -eq 30
it_stop "$host_pid"

# The link returns while the cut relay is blocked in a read or a write;
# the new rows are its alone.
cut_lines=$(grep -c "\"pid\":$cut_pid}" "$log" || true)
ip link set "$host_if" up
t_up=$(date +%s.%N)
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'com.example.back', '\\x00'::bytea
	FROM generate_series(1, 60)" >/dev/null
deadline=$((SECONDS + 60))
until [ "$(grep -c "\"pid\":$cut_pid}" "$log" || true)" -gt "$cut_lines" ]; do
	[ "$SECONDS" -lt "$deadline" ] || it_fail "the cut relay did not publish again within 60 s of the link's return"
	sleep 0.1
done
t_back=$(date +%s.%N)
it_wait_count 90 "status = 'sent'" -eq 90
it_stop "$cut_pid" 60

# Lost nothing, failed nothing; the cut relay's late conclusion refused.
[ "$(it_count "status <> 'sent'")" = 0 ] || it_fail "rows not sent: $(it_count "status <> 'sent'")"
missing=$(it_psql "SELECT count(*) FROM $OUTBOX_TABLE WHERE id::text NOT IN
	($(grep -o '"id":"[^"]*"' "$log" | sed 's/"id":"\(.*\)"/'"'"'\1'"'"'/' | paste -sd, -))")
[ "$missing" = 0 ] || it_fail "$missing rows were marked sent but never delivered"
grep -q '"lost leases: the lease did not commit"\|"mark failed; the batch' "$it_dir/cut.log" ||
	it_fail "the cut relay's late conclusion was not refused"
dups=$(grep -o '"id":"[^"]*"' "$log" | sort | uniq -d | wc -l)
awk -v d="$dups" -v c="$t_cut" -v g="$t_gone" -v u="$t_up" -v b="$t_back" -v w="$window_s" 'BEGIN {
	printf "ok: lost 0, failed 0, duplicates %d of 90 (%.1f %%); server let go %.1f s after the cut (window %d s); cut relay publishing %.1f s after the link returned\n", d, 100 * d / 90, g - c, w, b - u
}'
