#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The relay behind a transaction-mode PgBouncer whose pool has no server
# connection to spare: as many server connections as the relay has
# lanes. Each lease transaction pins one server connection for its
# publish and writes its claim on a second session, which needs another
# (docs/design.md §4, "A pool with no connection to spare"); with every
# server connection held by a lease waiting for its claim, nothing moved
# until the server ended the leases at the lease timeout. A claim that
# gets no reply within its wait gives its lease up (rolled back first,
# so its server connection goes back to the pool), and the others go on:
#  - every event is delivered well within one lease timeout;
#  - no event is charged an attempt for a lease given up (attempts = 1
#    on every row), and the relay says why it gave leases up, and counts
#    them in outbox_leases_given_up_total;
#  - the relay logs no lease lost while publishing.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/pgbouncer_lib.sh"
. "$(dirname "$0")/ops_lib.sh"
trap 'bouncer_stop_all; it_cleanup' EXIT

readonly events=3000 lease_timeout_s=60 within_s=30
bouncer_start 0 PGBOUNCER_POOL_SIZE=2
it_table pgbfull
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload)
         SELECT 'pool.full', convert_to(json_build_object('n', g)::text, 'UTF8')
         FROM generate_series(1, $events) g"
ops_relay full OUTBOX_DATABASE_URL="$bouncer_url" OUTBOX_PG_PREPARE=off \
	OUTBOX_WORKERS=2 OUTBOX_BATCH_SIZE=20 OUTBOX_LEASE_TIMEOUT=${lease_timeout_s}s OUTBOX_SWEEP_INTERVAL=5s \
	OUTBOX_LISTEN=off
relay=$it_last_pid
t0=$SECONDS
it_wait_count "$within_s" "status = 'sent'" -eq "$events"
took=$((SECONDS - t0))
counted=$(ops_metric outbox_leases_given_up_total)
it_stop "$relay"
[ "$it_rc" = 0 ] || it_fail "the relay exited $it_rc"
it_all_printed "a pool with none to spare" "$it_dir/full.out"
charged=$(it_count "attempts <> 1")
[ "$charged" = 0 ] ||
	it_fail "$charged events were charged more than their one attempt"
gave_up=$(grep -c 'its claim had no reply' "$it_dir/full.log" || true)
[ "$gave_up" -ge 1 ] ||
	it_fail "no lease was given up: the pool never ran out, and the test shows nothing"
[ "$counted" = "$gave_up" ] ||
	it_fail "outbox_leases_given_up_total is $counted, the log says $gave_up"
! grep -q 'lease lost while publishing' "$it_dir/full.log" ||
	it_fail "a lease was lost while publishing: $(grep -m1 'lease lost' "$it_dir/full.log")"
echo "$events events delivered in ${took}s through a pool of 2 by 2 lanes (lease timeout ${lease_timeout_s}s), none charged; $gave_up leases given up for their claims"
