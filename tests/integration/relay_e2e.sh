#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# End to end with the stdout publisher: 1000 events become 1000 valid
# CloudEvents with the right ids and every row ends sent; SIGTERM in the
# middle of the run exits 0 and leaves no row in flight.
. "$(dirname "$0")/lib.sh"
it_table e2e

it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, partition_key)
         SELECT 'com.example.order.created', convert_to(json_build_object('n', g)::text, 'UTF8'), 'k' || (g % 7)
         FROM generate_series(1, 1000) g"

# Slow enough (200 events/s) that SIGTERM lands mid-run.
it_relay first OUTBOX_MAX_RATE=200 OUTBOX_BATCH_SIZE=20
pid=$it_last_pid
it_wait_lines 20 "$it_dir/first.out" 100
it_stop "$pid"
rc=$it_rc
[ "$rc" = 0 ] || it_fail "SIGTERM exit code $rc, want 0"
[ "$(it_count "$it_in_flight")" = 0 ] || it_fail "rows left in flight after SIGTERM"
sent_first=$(it_count "status = 'sent'")
[ "$sent_first" -lt 1000 ] || it_fail "SIGTERM did not land mid-run"
grep -q '"shutting down"' "$it_dir/first.log" || it_fail "no shutdown log line"
# The test environment's own variables stay out of the relay's namespace,
# so a relay started from a test shell has nothing to warn about.
! grep -q 'unknown setting' "$it_dir/first.log" ||
	it_fail "the relay warned: $(grep 'unknown setting' "$it_dir/first.log")"

it_relay second OUTBOX_BATCH_SIZE=100
pid=$it_last_pid
it_wait_count 30 "status = 'sent'" -eq 1000
it_stop "$pid"
rc=$it_rc
[ "$rc" = 0 ] || it_fail "second relay exit code $rc"

cat "$it_dir/first.out" "$it_dir/second.out" >"$it_dir/all.out"
# Every line a valid structured CloudEvent.
jq -e -c 'select(.specversion == "1.0" and (.id | length) == 36 and .type == "com.example.order.created"
          and .source == "/outbox-relay" and .datacontenttype == "application/json" and (.data.n | type) == "number"
          and (.time | test("^[0-9-]+T[0-9:.]+Z$")))' \
	"$it_dir/all.out" >"$it_dir/valid.out" || it_fail "jq failed on the output"
[ "$(wc -l <"$it_dir/valid.out")" = "$(wc -l <"$it_dir/all.out")" ] || it_fail "invalid CloudEvents in the output"
# The printed ids are exactly the table's ids, each once (a clean run).
jq -r .id "$it_dir/all.out" | sort >"$it_dir/printed.ids"
it_psql "SELECT id FROM $OUTBOX_TABLE ORDER BY 1" | sort >"$it_dir/table.ids"
diff -q "$it_dir/printed.ids" "$it_dir/table.ids" >/dev/null || it_fail "printed ids differ from the table's"
[ "$(uniq -d "$it_dir/printed.ids" | wc -l)" = 0 ] || it_fail "duplicates in a fault-free run"
echo "ok: 1000 events, SIGTERM after $sent_first"
