#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A relay stopped (SIGSTOP) while it holds a key, past its lease: another
# relay takes the key over; after SIGCONT the stopped relay's late marks
# are fenced off and nothing it still had is published after its
# deadline, so the key's first deliveries stay in seq order.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
it_table ordstop
schema=${OUTBOX_TABLE%.*}
it_psql "SELECT $schema.outbox_events_enqueue_json('step', jsonb_build_object('n', n), 'K')
         FROM generate_series(1, 30) n"

log="$it_dir/deliveries.jsonl"
flaky_relay() {
	local name="$1"
	shift
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
		OUTBOX_HTTP_ADDR= OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" \
		OUTBOX_ORDERING=partition OUTBOX_LEASE_TIMEOUT=2s OUTBOX_PUBLISH_TIMEOUT=500ms \
		OUTBOX_STATEMENT_TIMEOUT=1s OUTBOX_SWEEP_INTERVAL=300ms OUTBOX_POLL_INTERVAL=100ms \
		"$@" "$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/$name.log" &
	it_last_pid=$!
	it_pids+=("$it_last_pid")
}
# The first relay pauses 400 ms before each event: it is stopped there.
flaky_relay slow RELAY_TEST_FLAKY_DELAY_MS=400
slow=$it_last_pid
slow_held="id IN (SELECT unnest(ids) FROM ${OUTBOX_TABLE}_claims WHERE
	holder LIKE '%/$slow/%' AND pg_xact_status(xid) = 'in progress')"
it_wait_count 20 "$slow_held" -ge 1
kill -STOP "$slow"
stopped() {
	case $(ps -o stat= -p "$slow") in T*) return 0 ;; *) return 1 ;; esac
}
it_wait 10 "the slow relay stopped" stopped
# What was delivered before the stop: a held row may be among it (handed
# over, its mark not yet committed), and goes out again from the relay
# that takes over, as at-least-once allows. What counts is what comes
# after.
stop_off=$(wc -c <"$log")
held=$(it_psql "SELECT id FROM $OUTBOX_TABLE WHERE $slow_held")
[ -n "$held" ] || it_fail "the slow relay held nothing when stopped"
flaky_relay fast
fast=$it_last_pid
# The fast relay sweeps the stopped one's lease and carries the key on.
it_wait_count 30 "status = 'sent'" -ge 10
kill -CONT "$slow"
it_wait_count 60 "status = 'sent'" -eq 30
sleep 1
it_stop "$slow"
it_stop "$fast"

# What it held when stopped went out once, from the relay that took over.
tail -c +$((stop_off + 1)) "$log" >"$it_dir/after-stop.jsonl"
for id in $held; do
	late=$(grep '"id":"'"$id"'"' "$it_dir/after-stop.jsonl" | grep -c '"pid":'"$slow" || true)
	[ "$late" = 0 ] || it_fail "the stopped relay published $id after its lease deadline"
	[ "$(grep -c '"id":"'"$id"'"' "$it_dir/after-stop.jsonl")" = 1 ] ||
		it_fail "$id was not delivered exactly once after the stop"
done
grep -q '"lost leases' "$it_dir/slow.log" || it_fail "the stopped relay's late marks were not fenced off"
violations=$(it_order_violations "$log")
[ "$violations" = 0 ] || it_fail "$violations first deliveries out of seq order"
[ "$(cut -f1 "$it_dir/deliveries.tsv" | sort -u | wc -l)" = 30 ] || it_fail "events lost"
echo "ok: the stopped relay's marks were fenced and nothing went out late"
