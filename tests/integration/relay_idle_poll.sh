#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# An idle worker sleeps the poll interval even when due rows exist that it
# may not lease (a paused destination, or rows behind a key's head): it
# must not spin on lease statements. No loop of an idle relay spins on
# the CPU either (its sleeps are long: the sweeper's, the cleaner's).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table idlepoll
it_psql "INSERT INTO $OUTBOX_TABLE (type, exchange, partition_key, payload) VALUES
  ('t', 'held', NULL, '{}'), ('t', 'free', 'K', '{}'), ('t', 'free', 'K', '{}')"
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "$RELAY_TEST_BIN" pause --destination held >/dev/null ||
	it_fail "pause failed"
# Key K: its head waits in backoff, the row behind it is due but blocked.
it_psql "UPDATE $OUTBOX_TABLE SET next_attempt_at = now() + interval '1 hour'
         WHERE seq = (SELECT min(seq) FROM $OUTBOX_TABLE WHERE partition_key = 'K')"
ops_relay relay OUTBOX_POLL_INTERVAL=500ms OUTBOX_ORDERING=partition
leases() {
	curl -s "http://127.0.0.1:$ops_port/metrics" | awk '$1 == "outbox_leases_total" { print $2 }'
}
# User + system clock ticks of the relay process so far.
cpu_ticks() {
	awk '{ print $14 + $15 }' "/proc/$it_last_pid/stat"
}
sleep 1
before=$(leases)
cpu_before=$(cpu_ticks)
sleep 3
after=$(leases)
cpu=$(($(cpu_ticks) - cpu_before))
# 3 s of a spinning thread is about 300 ticks; an idle relay under the
# sanitizers takes a few.
[ "$cpu" -le 60 ] || it_fail "$cpu clock ticks of CPU in 3 s of idling: a loop spins"
n=$((after - before))
# 3 s at one lease per 500 ms is about 6; a spinning worker makes hundreds.
[ "$n" -le 12 ] || it_fail "$n leases in 3 s of idling: the worker spins"
# And it polls: a worker that stopped leasing would pass the bounds above.
[ "$n" -ge 2 ] || it_fail "$n leases in 3 s at a 500 ms poll interval: the worker does not poll"
[ "$(it_count "status = 'sent'")" = 0 ] || it_fail "a held row was sent"
it_stop "$it_last_pid"
echo "ok: $n leases and $cpu clock ticks of CPU in 3 s"
