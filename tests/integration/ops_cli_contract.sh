#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `outbox-relay migrate --contract` beside a running relay (docs/design.md
# §11, "Contract steps wait for the relays' protocol"): the relay's
# heartbeat records its protocol and `status` shows it; the contract step
# is refused while a relay older than the protocol column is seen alive,
# naming it, then runs once it is gone (the index dropped, the step
# recorded); the relay goes on delivering events, also keyed ones. Of a
# list of tables, every table's steps are recorded before any runs.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table opscontract
reg=$(ops_registry)
idx="${OUTBOX_TABLE%.*}.outbox_events_unclassified_idx"

ops_relay a OUTBOX_ORDERING=partition
beat() {
	[ "$(it_psql "SELECT count(*) FROM $reg WHERE protocol = 1")" = 1 ]
}
it_wait 20 "the relay's heartbeat with its protocol" beat
ops_cli status
[ "$ops_rc" = 0 ] || it_fail "status exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -Eq '^  alive +[^ ]+ +[^ ]+ +1 ' "$it_dir/cli.out" ||
	it_fail "status shows no protocol 1: $(cat "$it_dir/cli.out")"

# A relay of an earlier version: its heartbeats record no protocol.
it_psql "INSERT INTO $reg (id, version) VALUES ('older-pod/7', '0.0.9')"
ops_cli migrate --contract
[ "$ops_rc" = 1 ] || it_fail "migrate --contract exited $ops_rc with an older relay alive"
grep -q "older-pod/7 (version 0.0.9, protocol none)" "$it_dir/cli.err" ||
	it_fail "the refusal does not name the older relay: $(cat "$it_dir/cli.err")"
[ "$(it_psql "SELECT to_regclass('$idx') IS NOT NULL")" = t ] ||
	it_fail "the refused step dropped the index"
[ "$(it_psql "SELECT count(*) FROM ${OUTBOX_TABLE}_contract")" = 0 ] ||
	it_fail "the refused step is recorded"

# Gone (silent for longer than 15 s): the step runs.
it_psql "UPDATE $reg SET last_seen_at = now() - interval '1 minute' WHERE id = 'older-pod/7'"
ops_cli migrate --contract
[ "$ops_rc" = 0 ] || it_fail "migrate --contract exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^contract step drop_unclassified_idx (protocol 1): done$' "$it_dir/cli.out" ||
	it_fail "no line for the step: $(cat "$it_dir/cli.out")"
grep -q "needs relays of protocol 1$" "$it_dir/cli.out" ||
	it_fail "no line for the table's protocol: $(cat "$it_dir/cli.out")"
[ "$(it_psql "SELECT to_regclass('$idx') IS NULL")" = t ] ||
	it_fail "the index is still there"
[ "$(it_psql "SELECT count(*) FROM ${OUTBOX_TABLE}_contract WHERE step = 'drop_unclassified_idx' AND protocol = 1")" = 1 ] ||
	it_fail "the step is not recorded"

# The relay goes on, keyed rows in their order.
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, partition_key)
  SELECT 'contract.keyed', convert_to('{\"n\":' || g || '}', 'UTF8'), 'k' || (g % 3)
  FROM generate_series(1, 30) g"
it_wait_count 30 "type = 'contract.keyed' AND status = 'sent'" -eq 30
grep -c '"type":"contract.keyed"' "$it_dir/a.out" | grep -qx 30 ||
	it_fail "the relay did not publish the 30 events"

# Three tables listed: every table's steps recorded first, then run
# once the records settled (one wait for them all); a table with an
# older relay alive is refused at its record, the others go on.
list=""
for t in x y z; do
	it_psql "SET client_min_messages = warning; DROP SCHEMA IF EXISTS contract_${t}_$$ CASCADE" >/dev/null
	list="$list${list:+,}contract_${t}_$$.outbox_events"
done
list_cli() {
	ops_rc=0
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$list" \
		"$RELAY_TEST_BIN" "$@" >"$it_dir/cli.out" 2>"$it_dir/cli.err" || ops_rc=$?
}
list_cli migrate
[ "$ops_rc" = 0 ] || it_fail "migrate of the list exited $ops_rc: $(cat "$it_dir/cli.err")"
it_psql "INSERT INTO contract_y_$$.outbox_events_replicas (id, version) VALUES ('older-pod/8', '0.0.9')"
list_cli migrate --contract
[ "$ops_rc" = 1 ] || it_fail "migrate --contract of the list exited $ops_rc with an older relay of y alive"
grep -q "contract_y_$$.*older-pod/8 (version 0.0.9, protocol none)" "$it_dir/cli.err" &&
	grep -q '1 of 3 tables failed to migrate' "$it_dir/cli.err" ||
	it_fail "the list's refusal: $(cat "$it_dir/cli.err")"
awk '/^contract steps of every table/ { after = 1 }
     /: recorded$/ { if (after) bad = 1; recorded++ }
     /: done$/ { if (!after) bad = 1; done++ }
     /^\(skipped: it failed above\)$/ { skipped++ }
     END { exit !(after && !bad && recorded == 2 && done == 2 && skipped == 1) }' "$it_dir/cli.out" ||
	it_fail "the list's steps were not all recorded before they ran: $(cat "$it_dir/cli.out")"
for t in x y z; do
	want=t
	[ "$t" != y ] || want=f
	[ "$(it_psql "SELECT to_regclass('contract_${t}_$$.outbox_events_unclassified_idx') IS NULL")" = "$want" ] ||
		it_fail "table $t: the index dropped is not $want"
done
[ "$(it_psql "SELECT count(*) FROM contract_y_$$.outbox_events_contract")" = 0 ] ||
	it_fail "the refused table's step is recorded"
# The same three as one pattern: the summary counts the tables it matched
# (it counted the pattern as one table, and said nothing).
list="contract_*_$$.outbox_events"
# y's older relay seen just now: alive whatever the list's run took.
it_psql "UPDATE contract_y_$$.outbox_events_replicas SET last_seen_at = now() WHERE id = 'older-pod/8'"
list_cli migrate --contract
[ "$ops_rc" = 1 ] || it_fail "migrate --contract of the pattern exited $ops_rc with an older relay of y alive"
grep -q '1 of 3 tables failed to migrate' "$it_dir/cli.err" ||
	it_fail "the pattern's refusal: $(cat "$it_dir/cli.err")"
for t in x y z; do
	it_psql "SET client_min_messages = warning; DROP SCHEMA contract_${t}_$$ CASCADE" >/dev/null
done

ops_expect_usage_error migrate --bogus
echo ok
