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
leases() {
	curl -s "http://127.0.0.1:$ops_port/metrics" | awk '$1 == "outbox_leases_total" { print $2 }'
}
sleep 1
before=$(leases)
# 100 rows, one commit every 20 ms: about 2 s.
it_psql "DO \$\$ BEGIN FOR i IN 1..100 LOOP
  INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('t', '{}');
  COMMIT; PERFORM pg_sleep(0.02); END LOOP; END \$\$"
after=$(leases)
n=$((after - before))
it_wait_count 10 "status = 'sent'" -eq 100
# 2 s at one lease per 250 ms is about 8 (the 10 ms poll interval only
# applies after a lease found nothing); 14 ms pacing makes a lease per
# row or two, about 100.
[ "$n" -ge 3 ] || it_fail "only $n leases in 2 s of inserts"
[ "$n" -le 20 ] || it_fail "$n leases for 100 rows in 2 s: the lease interval is not kept"
it_stop "$it_last_pid"
echo "ok: $n leases for 100 rows"
