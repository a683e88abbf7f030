#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Behind a PgBouncer that keeps each client's prepared statements itself
# (1.21 and later with max_prepared_statements, on by default from 1.24;
# docs/design.md §7, "Prepared statements behind a pooler"): the later
# PgBouncer tests/run.sh builds from a later Debian release's source
# (tests/services/pgbouncer_build.sh), run in transaction mode with
# max_prepared_statements = 200.
#  - OUTBOX_PG_PREPARE=pooled: the pool ends a session that runs a
#    statement by a name it did not prepare, which is how pooled first
#    runs each; the relay logs one error that says so and runs as with
#    OUTBOX_PG_PREPARE=on from then on. 600 events in two rounds, with
#    DEALLOCATE ALL on every server connection between them, are each
#    printed once, no other error is logged, and over at least 40 empty
#    leases fewer statements are prepared than leases run.
#  - OUTBOX_PG_PREPARE=on: the same rounds with no error at all. The
#    relay sees a pooler answer its connection and prepares as pooled
#    (said at info), meets the same refusal at its first lease, before it
#    publishes anything, and goes back to on, saying so once at info.
#  - The same PgBouncer with max_prepared_statements = 0 passes prepared
#    statements through, as 1.18 does: pooled the same rounds with no
#    error, and the relay's statements found on the server connections
#    (it did not turn to on).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
. "$(dirname "$0")/pgbouncer_lib.sh"
bin=${RELAY_TEST_PGBOUNCER_LATER:?run through tests/run.sh}
trap 'bouncer_stop_all; it_cleanup' EXIT

echo "$("$bin" --version | head -n 1)"
bouncer_start 0 PGBOUNCER_BIN="$bin" PGBOUNCER_MAX_PREPARED=200
per_round=300
keeps="the pool keeps each client's prepared statements itself"

# deliver NAME PREPARE: a relay of 2 workers with OUTBOX_PG_PREPARE=PREPARE
# through the pool delivers two rounds of events, then runs at least 40
# empty leases; each event printed once. Leaves the relay's log in
# NAME.log and sets prepared_more and leases_ran for the empty leases.
deliver() {
	local name=$1 prepare=$2 relay prepared leases dups
	it_table "pgbkeeps$name"
	ops_relay "$name" OUTBOX_DATABASE_URL="$bouncer_url" OUTBOX_PG_PREPARE="$prepare" \
		OUTBOX_WORKERS=2 OUTBOX_BATCH_SIZE=50 OUTBOX_POLL_INTERVAL=100ms
	relay=$it_last_pid
	bouncer_rounds "$name" "$relay" 2 "$per_round"
	prepared=$(ops_metric outbox_statements_prepared_total)
	leases=$(ops_metric outbox_leases_total)
	ops_wait_metric 30 outbox_leases_total "v >= $((leases + 40))"
	prepared_more=$(($(ops_metric outbox_statements_prepared_total) - prepared))
	leases_ran=$(($(ops_metric outbox_leases_total) - leases))
	it_stop "$relay"
	[ "$it_rc" = 0 ] || it_fail "the $name relay exited $it_rc"
	it_all_printed "$name" "$it_dir/$name.out"
	dups=$(jq -R -r 'fromjson? | .id' "$it_dir/$name.out" | sort | uniq -d | wc -l)
	[ "$dups" = 0 ] || it_fail "$dups events were printed more than once by the $name relay"
	[ "$(wc -l <"$it_dir/$name.out")" = $((2 * per_round)) ] ||
		it_fail "$(wc -l <"$it_dir/$name.out") lines printed for $((2 * per_round)) events"
}

deliver pooled pooled
errors=$(grep -c '"level":"error"' "$it_dir/pooled.log" || true)
{ [ "$errors" = 1 ] && grep '"level":"error"' "$it_dir/pooled.log" | grep -qF "$keeps"; } ||
	it_fail "the pooled relay logged $errors errors, not the one about the pool: $(grep '"level":"error"' "$it_dir/pooled.log" | head -3)"
[ "$prepared_more" -lt "$leases_ran" ] ||
	it_fail "pooled: $prepared_more statements prepared while $leases_ran leases ran"
echo "pooled: 600 events delivered once each, one error naming the pool;" \
	"$prepared_more statements prepared while $leases_ran leases ran"

deliver on on
! grep -q '"level":"error"' "$it_dir/on.log" ||
	it_fail "the relay with on logged an error: $(grep '"level":"error"' "$it_dir/on.log" | head -3)"
[ "$(grep -c "$keeps" "$it_dir/on.log")" = 1 ] ||
	it_fail "the relay with on said $(grep -c "$keeps" "$it_dir/on.log") times that the pool keeps statements"
[ "$prepared_more" -lt "$leases_ran" ] ||
	it_fail "on: $prepared_more statements prepared while $leases_ran leases ran"
echo "on: 600 events delivered once each, no error;" \
	"$prepared_more statements prepared while $leases_ran leases ran"

bouncer_start 0 PGBOUNCER_BIN="$bin" PGBOUNCER_MAX_PREPARED=0
deliver passed pooled
! grep -q '"level":"error"' "$it_dir/passed.log" ||
	it_fail "pooled behind a pool that passes statements through logged an error: $(grep '"level":"error"' "$it_dir/passed.log" | head -3)"
bouncer_on_each_connection "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'outbox\_p\_%'"
held=$(cat "$it_dir"/conn-*.txt | awk '$1 > 0' | wc -l)
[ "$held" -ge 1 ] ||
	it_fail "pooled with max_prepared_statements = 0: no server connection holds the relay's statements"
echo "max_prepared_statements = 0, pooled: 600 events delivered once each, no error;" \
	"$held of 3 server connections hold the relay's statements"
