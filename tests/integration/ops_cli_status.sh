#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `outbox-relay status` against running replicas and rows in every state:
# two live replicas and a killed one shown dead, who holds each in-flight
# row and when its lease expires, expired leases, failed rows by type with
# a sample error, the backlog, the pause; text and --json alike.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table opsstatus
reg=$(ops_registry)

# Replicas must lease nothing (the rows below are staged) and the sweeper
# must not return the expired lease: leasing is paused, and this session
# holds the sweep lock (namespace 0x6f620002, keyed by the table).
ops_cli pause --reason "status test"
[ "$ops_rc" = 0 ] || it_fail "pause exited $ops_rc: $(cat "$it_dir/cli.err")"
ops_session_open "opsstatus-$$"
ops_session_send "SELECT pg_advisory_lock(1868693506, hashtext('$OUTBOX_TABLE'));"
sweep_locked() {
	[ "$(it_psql "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'opsstatus-$$'")" = 1 ]
}
it_wait 10 "the sweep lock" sweep_locked

it_relay a
pid_a=$it_last_pid
it_relay b OUTBOX_RETENTION=7d
pid_b=$it_last_pid
it_relay c
pid_c=$it_last_pid
registered() {
	[ "$(it_psql "SELECT count(*) FROM $reg WHERE id LIKE '%/$pid_a' OR id LIKE '%/$pid_b' OR id LIKE '%/$pid_c'")" = 3 ]
}
it_wait 20 "three registry rows" registered
id_a=$(it_psql "SELECT id FROM $reg WHERE id LIKE '%/$pid_a'")
id_c=$(it_psql "SELECT id FROM $reg WHERE id LIKE '%/$pid_c'")

# c dies without a word; its heartbeats stop. Rather than waiting 15 s,
# its last heartbeat is moved back.
kill -9 "$pid_c"
wait "$pid_c" 2>/dev/null || true
it_psql "UPDATE $reg SET last_seen_at = now() - interval '1 minute' WHERE id = '$id_c'"

it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, next_attempt_at) VALUES
  ('order.created', '{}', now()), ('order.created', '{}', now()),
  ('order.created', '{}', now() + interval '10 minutes')"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, lease_id, leased_at, lease_expires_at, leased_by) VALUES
  ('held.alive', '{}', 'in_flight', 1, gen_random_uuid(), now(), now() + interval '2 minutes', '$id_a/worker-0'),
  ('held.dead', '{}', 'in_flight', 2, gen_random_uuid(), now(), now() + interval '2 minutes', '$id_c/worker-0'),
  ('held.expired', '{}', 'in_flight', 3, gen_random_uuid(), now() - interval '3 minutes', now() - interval '1 minute', '$id_a/worker-0')"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, last_error, finished_at) VALUES
  ('order.created', '{}', 'failed', 10, 'older error', now() - interval '1 hour'),
  ('order.created', '{}', 'failed', 10, 'newest error: exchange orders missing', now()),
  ('user.deleted', '{}', 'failed', 1, 'header ce_id collides', now())"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, finished_at) VALUES ('order.created', '{}', 'sent', now())"
blocking=$(it_psql "SELECT id FROM $OUTBOX_TABLE WHERE type = 'user.deleted'")
it_psql "INSERT INTO ${OUTBOX_TABLE}_blocked_keys (partition_key, blocking_id, reason) VALUES ('order-42', '$blocking', 'header ce_id collides')"

ops_cli status --json
[ "$ops_rc" = 0 ] || it_fail "status --json exited $ops_rc: $(cat "$it_dir/cli.err")"
cp "$it_dir/cli.out" "$it_dir/status.json"
jqt() {
	jq -e "$1" "$it_dir/status.json" >/dev/null ||
		it_fail "status --json: '$1' is not true in $(cat "$it_dir/status.json")"
}
jqt '[.replicas[] | select(.alive)] | length == 2'
jqt "[.replicas[] | select(.alive) | .id] | sort == ([\"$id_a\", \"$(it_psql "SELECT id FROM $reg WHERE id LIKE '%/$pid_b'")\"] | sort)"
jqt ".replicas[] | select(.id == \"$id_c\") | .alive == false and .last_seen_seconds_ago >= 60"
# Each records how long it keeps sent rows (a redrive goes by the shortest).
jqt ".replicas[] | select(.id == \"$id_a\") | .retention_ms == 86400000"
jqt ".replicas[] | select(.id | endswith(\"/$pid_b\")) | .retention_ms == 604800000"
jqt '.backlog.pending == 3 and .backlog.due_now == 2'
jqt '.in_flight.count == 3 and .in_flight.expired_leases == 1'
jqt ".in_flight_rows[] | select(.type == \"held.alive\") | .holder == \"$id_a\" and .holder_alive == true and .leased_by == \"$id_a/worker-0\" and .attempts == 1 and .lease_expires_in_seconds > 100 and .lease_expires_in_seconds <= 120"
jqt ".in_flight_rows[] | select(.type == \"held.dead\") | .holder == \"$id_c\" and .holder_alive == false"
jqt '.in_flight_rows[] | select(.type == "held.expired") | .lease_expires_in_seconds < -50'
jqt ".in_flight_holders[] | select(.holder == \"$id_c\") | .rows == 1 and .holder_alive == false"
jqt '.failed.count == 3'
jqt '.failed_by_type[] | select(.type == "order.created") | .count == 2 and .sample_error == "newest error: exchange orders missing"'
jqt '.failed_by_type[] | select(.type == "user.deleted") | .count == 1'
jqt '.paused | length == 1 and .[0].destination == "*" and .[0].reason == "status test"'
jqt ".blocked_keys.present == true and .blocked_keys.count == 1 and .blocked_keys.rows[0].key.partition_key == \"order-42\" and .blocked_keys.rows[0].key.blocking_id == \"$blocking\""
jqt '.attention | map(select(test("blocked"))) | length == 1'
jqt '.table_stats.total_bytes > 0'
jqt '.attention | map(select(test("DEAD"))) | length == 1'
jqt '.attention | map(select(test("PAUSED"))) | length == 1'

ops_cli status
[ "$ops_rc" = 0 ] || it_fail "status exited $ops_rc: $(cat "$it_dir/cli.err")"
cp "$it_dir/cli.out" "$it_dir/status.txt"
want() {
	grep -q -E -- "$1" "$it_dir/status.txt" ||
		it_fail "status text lacks /$1/: $(cat "$it_dir/status.txt")"
}
want '^REPLICAS  2 alive, 1 dead'
want "^  DEAD +$id_c "
want "^  alive +$id_a +[^ ]+ +[0-9]+ +1d00h "
want "^  alive +[^ ]+/$pid_b +[^ ]+ +[0-9]+ +7d00h "
want '^  pending +3 \(due now 2'
want '^IN FLIGHT  3 rows, 1 expired lease'
want "^  $id_c +NO +1 "
want "held\.alive +$id_a/worker-0 +yes +1/10 +in (1m[345][0-9]s|2m00s)"
want 'held\.expired .* EXPIRED 1m[0-2][0-9]s ago'
want '^FAILED  3 rows'
want '^  2 +order\.created .* newest error: exchange orders missing'
want 'ALL LEASING .* status test'
want '^  ! 1 replica silent'
want "^  key 'order-42' blocked by row $blocking"

# Replicas that stop cleanly leave the registry; the dead one stays.
it_stop "$pid_a"
[ "$it_rc" = 0 ] || it_fail "a exited $it_rc"
it_stop "$pid_b"
[ "$it_rc" = 0 ] || it_fail "b exited $it_rc"
[ "$(it_psql "SELECT string_agg(id, ',') FROM $reg")" = "$id_c" ] ||
	it_fail "registry after the stops: $(it_psql "SELECT string_agg(id, ',') FROM $reg")"
ops_cli status --json
jq -e '[.replicas[] | select(.alive)] | length == 0' "$it_dir/cli.out" >/dev/null ||
	it_fail "replicas still alive after the stops"
jq -e '.attention | map(select(test("no live replica"))) | length == 1' "$it_dir/cli.out" >/dev/null ||
	it_fail "no attention line for the missing replicas"

# A missing table is a runtime failure naming the table and the fix.
OUTBOX_TABLE=opsstatus_missing_$$.outbox_events ops_cli status
[ "$ops_rc" = 1 ] || it_fail "status of a missing table exited $ops_rc"
grep -q "outbox-relay migrate" "$it_dir/cli.err" || it_fail "no hint to migrate: $(cat "$it_dir/cli.err")"

ops_expect_usage_error status --bogus
ops_expect_usage_error status extra
ops_cli status --help
[ "$ops_rc" = 0 ] && grep -q '^usage: outbox-relay status' "$it_dir/cli.out" ||
	it_fail "status --help: $ops_rc $(cat "$it_dir/cli.out")"
echo ok
