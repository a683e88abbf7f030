#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# How long a stalled relay keeps its lease transaction open
# (docs/design.md §4): a relay stuck in a publish with a lease open shows
# the transaction's age in outbox_oldest_lease_transaction_seconds; stopped
# there (SIGSTOP), its transaction is ended by the server at the lease
# timeout after its last statement, and pg_stat_activity shows the session
# gone. Continued, the relay counts the lost lease, and every row goes out.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table leasestall

it_psql "INSERT INTO $OUTBOX_TABLE (type, payload)
         SELECT 'stall.test', convert_to(json_build_object('pad', repeat('x', 2000), 'n', g)::text, 'UTF8')
         FROM generate_series(1, 200) g"

# The relay prints into a pipe nobody reads yet: once it is full the lane
# blocks inside a publish, its lease transaction open. Opened read-write
# here, so the relay's open does not wait for a reader.
mkfifo "$it_dir/stall.out"
exec 3<>"$it_dir/stall.out"
ops_relay stall OUTBOX_LEASE_TIMEOUT=4s OUTBOX_PUBLISH_TIMEOUT=1s \
	OUTBOX_STATEMENT_TIMEOUT=1s OUTBOX_BATCH_SIZE=20 OUTBOX_WORKERS=1 \
	OUTBOX_SWEEP_INTERVAL=500ms
pid=$it_last_pid

ops_wait_metric 20 outbox_oldest_lease_transaction_seconds 'v >= 1'
age1=$(ops_metric outbox_oldest_lease_transaction_seconds)
sleep 1
age2=$(ops_metric outbox_oldest_lease_transaction_seconds)
awk -v a="$age1" -v b="$age2" 'BEGIN { exit !(b >= a + 0.5) }' ||
	it_fail "the lease's age did not grow: $age1 then $age2"

# The lease session, idle in its transaction; how long since its last
# statement, on the server's clock.
lease_sessions="FROM pg_stat_activity WHERE application_name LIKE
	'outbox-relay/%' AND application_name NOT LIKE '%/claim' AND state =
	'idle in transaction'"
idle_leases() {
	test "$(it_psql "SELECT count(*) $lease_sessions")" "$@"
}
it_wait 10 "an idle lease transaction" idle_leases -ge 1
kill -STOP "$pid"
last=$(it_psql "SELECT extract(epoch FROM max(state_change)) $lease_sessions")
# Each look says, on the server's clock, whether the session is still
# there: the end lies between the last look that saw it and the first
# that did not, however slow the looks themselves are.
seen=0 gone=""
for _ in $(seq 300); do
	look=$(it_psql "SELECT count(*) || ' ' || round(extract(epoch FROM now()) - $last, 2) $lease_sessions") ||
		{ sleep 0.05; continue; }
	if [ "${look%% *}" = 0 ]; then
		gone=${look#* }
		break
	fi
	seen=${look#* }
	sleep 0.05
done
[ -n "$gone" ] || it_fail "the stopped relay's lease transaction did not end"
# Ended by idle_in_transaction_session_timeout: at the lease timeout (4 s)
# after the last statement, not before, and not much after.
awk -v s="$seen" -v g="$gone" 'BEGIN { exit !(g >= 3.5 && s <= 6.5) }' ||
	it_fail "the lease transaction ended between ${seen}s and ${gone}s after its last statement, want about 4s"
kill -CONT "$pid"

# Read the pipe: the relay finds its lease lost, and everything goes out.
cat <&3 >"$it_dir/stall.printed" &
it_pids+=("$!")
it_wait_count 60 "status = 'sent'" -eq 200
ops_wait_metric 20 outbox_lost_leases_total 'v >= 1'
ops_wait_metric 10 outbox_oldest_lease_transaction_seconds 'v == 0'
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
# Marked sent is not delivered: each row's event came out of the pipe
# (read to its end: the reader holds a write end too, so no EOF comes).
printed_ids() {
	[ "$(jq -R -r 'fromjson? | .id' "$it_dir/stall.printed" | sort -u | wc -l)" -ge 200 ]
}
it_wait 10 "every event read from the pipe" printed_ids
it_all_printed "a stalled relay" "$it_dir/stall.printed"
exec 3<&-
echo "ok: lease age $age1 -> ${age2}s while stuck; stopped, its transaction ended between ${seen}s and ${gone}s after its last statement"
