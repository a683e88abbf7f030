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
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"

window_s=6
subnet="10.231.$part_n"
ns_ip="$subnet.2"
part_link db "$subnet"
part_pg_listen "$subnet"
ns_url=$part_pg_url

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
ip netns exec "$part_ns" env OUTBOX_DATABASE_URL="$ns_url" "${relay_env[@]}" \
	RELAY_TEST_FLAKY_DELAY_MS=400 "$RELAY_TEST_FLAKY_BIN" run \
	>/dev/null 2>"$it_dir/cut.log" &
cut_pid=$!
it_pids+=("$cut_pid")

it_wait_count 30 "$it_in_flight" -ge 1
sessions="SELECT count(*) FROM pg_stat_activity WHERE client_addr = '$ns_ip'"
[ "$(it_psql "$sessions")" -ge 1 ] || it_fail "the cut relay has no session from $ns_ip"
part_cut db
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
part_restore db
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
echo "ok: lost 0, failed 0, duplicates $dups of 90 ($(awk -v d="$dups" 'BEGIN { printf "%.1f", 100 * d / 90 }') %);" \
	"server let go $(part_secs "$t_cut" "$t_gone") s after the cut (window $window_s s);" \
	"cut relay publishing $(part_secs "$t_up" "$t_back") s after the link returned"
