#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# OUTBOX_PG_PREPARE=pooled behind PgBouncer in transaction mode
# (docs/design.md §7, "Prepared statements behind a pooler"): the lease
# transaction's statements are prepared once a server connection and
# found there again by later transactions, whichever connection the
# pool hands out, while the pool's other clients throw prepared
# statements away.
#  - In rounds, events are inserted and delivered by 2 workers; between
#    rounds a client on each of the pool's 3 server connections at once
#    runs DEALLOCATE ALL, so the relay's next transactions there find
#    none of their statements.
#  - Every event is printed once (a mark that found its statement gone
#    would fail its lease transaction after the publish, and the rows
#    would go out again), and the relay logs no error.
#  - Afterwards the pool's server connections hold the relay's
#    statements, and one of them has run more often than once: prepared
#    once, executed by many transactions; and while the relay's empty
#    leases go on, outbox_statements_prepared_total grows by fewer than
#    the leases run (at least 40).
#  - Ordered mode the same way, with a fifth of the publishes nacked, so
#    the retry mark's statement is prepared mid-transaction too: 1,000
#    keyed events over 40 keys each delivered, each key in order.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
. "$(dirname "$0")/ops_lib.sh"
. "$(dirname "$0")/pgbouncer_lib.sh"
trap 'bouncer_stop_all; it_cleanup' EXIT

it_table pgbpooled
bouncer_start 0
rounds=5
per_round=300

ops_relay pooled OUTBOX_DATABASE_URL="$bouncer_url" OUTBOX_PG_PREPARE=pooled \
	OUTBOX_WORKERS=2 OUTBOX_BATCH_SIZE=50 OUTBOX_POLL_INTERVAL=100ms
relay=$it_last_pid
bouncer_rounds pooled "$relay" "$rounds" "$per_round"
sleep 1 # a few empty leases on each connection
bouncer_on_each_connection "SELECT count(*), coalesce(max(generic_plans + custom_plans), 0)
	FROM pg_prepared_statements WHERE name LIKE 'outbox\_p\_%'"
prepared=$(ops_metric outbox_statements_prepared_total)
leases=$(ops_metric outbox_leases_total)
[ "$prepared" -gt 0 ] 2>/dev/null || it_fail "outbox_statements_prepared_total is $prepared"
# A connection the relay had not met since the last DEALLOCATE ALL gets
# its statements once (a handful); a pool that threw them away after
# every transaction would have the lease prepared again at each.
ops_wait_metric 30 outbox_leases_total "v >= $((leases + 40))"
more=$(($(ops_metric outbox_statements_prepared_total) - prepared))
ran=$(($(ops_metric outbox_leases_total) - leases))
[ "$more" -lt "$ran" ] || it_fail "$more statements prepared while $ran leases ran"
it_stop "$relay"
[ "$it_rc" = 0 ] || it_fail "the relay exited $it_rc"

it_all_printed "pooled" "$it_dir/pooled.out"
dups=$(jq -R -r 'fromjson? | .id' "$it_dir/pooled.out" | sort | uniq -d | wc -l)
[ "$dups" = 0 ] || it_fail "$dups events were printed more than once"
[ "$(wc -l <"$it_dir/pooled.out")" = $((rounds * per_round)) ] ||
	it_fail "$(wc -l <"$it_dir/pooled.out") lines printed for $((rounds * per_round)) events"
! grep -q '"level":"error"' "$it_dir/pooled.log" ||
	it_fail "the relay logged an error: $(grep '"level":"error"' "$it_dir/pooled.log" | head -3)"
held=0 most=0
for i in 1 2 3; do
	IFS='|' read -r n runs <"$it_dir/conn-$i.txt"
	[ "$n" -gt 0 ] && held=$((held + 1))
	[ "$runs" -gt "$most" ] && most=$runs
done
[ "$held" -ge 1 ] || it_fail "no server connection of the pool holds the relay's statements"
[ "$most" -gt 1 ] ||
	it_fail "no statement of the relay ran more than once where it was prepared: $(cat "$it_dir"/conn-*.txt)"
echo "$((rounds * per_round)) events delivered once each across $rounds rounds of DEALLOCATE ALL;" \
	"$held of 3 server connections hold the relay's statements, the most run one $most times;" \
	"$prepared statements prepared, $more more while $ran leases ran"

# Ordered, with nacks: the key walk's lease and the retry mark, pooled.
it_table pgbpooledord
log="$it_dir/ordered.jsonl"
it_flaky_relay ordered "$bouncer_url" "$log" OUTBOX_PG_PREPARE=pooled \
	RELAY_TEST_FLAKY_PERCENT=20 OUTBOX_BACKOFF_BASE=100ms OUTBOX_BACKOFF_MAX=200ms
relay=$it_last_pid
for r in 1 2; do
	it_psql "$(it_keyed_sql "$OUTBOX_TABLE" pool.ordered $(((r - 1) * 500 + 1)) $((r * 500)) 40 k)"
	it_wait_count 90 "status = 'sent'" -eq $((r * 500))
	bouncer_on_each_connection "DEALLOCATE ALL"
done
it_stop "$relay"
[ "$it_rc" = 0 ] || it_fail "the ordered relay exited $it_rc"
[ "$(jq -r .id "$log" | sort -u | wc -l)" = 1000 ] ||
	it_fail "$(jq -r .id "$log" | sort -u | wc -l) of 1000 keyed events delivered"
bad=$(it_order_violations "$log")
[ "$bad" = 0 ] || it_fail "$bad deliveries out of their key's order"
! grep -q '"level":"error"' "$it_dir/ordered.log" ||
	it_fail "the ordered relay logged an error: $(grep '"level":"error"' "$it_dir/ordered.log" | head -3)"
echo "ordered, a fifth nacked: 1000 keyed events over 40 keys delivered in their keys' order"
