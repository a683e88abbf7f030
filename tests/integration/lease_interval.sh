#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# OUTBOX_LEASE_INTERVAL paces a worker fed a trickle: after a partial
# batch its next lease starts that long after the last one started, so a
# row every 20 ms is leased in batches, not a lease per row. Both lanes
# of the default window share the pace (one cadence per worker).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table leaseint
ops_relay relay OUTBOX_LEASE_INTERVAL=250ms OUTBOX_POLL_INTERVAL=10ms
# Leases that found rows: an empty lease (one every 10 ms whenever no row
# came for 250 ms: a producer stalled by a loaded machine, the tail after
# its last commit) is the poll interval's, not the pace's.
leases() {
	curl -s "http://127.0.0.1:$ops_port/metrics" | awk '$1 == "outbox_batch_size_count" { print $2 }'
}
# 100 rows, one commit every 20 ms: about 2 s. Counted from the first row
# sent to the producer's end, so that the idle relay's empty leases (one
# every 10 ms) before the producer got going are not counted, however
# long psql took to start.
it_psql "DO \$\$ BEGIN FOR i IN 1..100 LOOP
  INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('t', '{}');
  COMMIT; PERFORM pg_sleep(0.02); END LOOP; END \$\$" >/dev/null &
producer=$!
it_wait_count 10 "status = 'sent'" -ge 1
before=$(leases)
t0=$(date +%s%N)
wait "$producer" || it_fail "the producer failed"
after=$(leases)
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
n=$((after - before))
it_wait_count 10 "status = 'sent'" -eq 100
# One lease per 250 ms is about 8 in 2 s; the bound allows twice that over
# the time the producer took, plus a few; 14 ms pacing makes a lease per
# row or two, about 100.
bound=$((elapsed_ms / 250 * 2 + 4))
[ "$n" -ge 3 ] || it_fail "only $n leases in ${elapsed_ms} ms of inserts"
[ "$n" -le "$bound" ] || it_fail "$n leases for 100 rows in ${elapsed_ms} ms (at most $bound): the lease interval is not kept"
it_stop "$it_last_pid"
echo "ok: $n leases for 100 rows in ${elapsed_ms} ms"
