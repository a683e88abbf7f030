#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A table made by hand, CREATE TABLE x (LIKE outbox_events INCLUDING ALL),
# has none of the side tables (x_control, x_replicas, x_blocked_keys); one
# made from an older table also lacks later columns (relay_source). The
# relay says so once at startup, naming what is off and
# `outbox-relay migrate`, then relays, sweeps and cleans in silence, and
# stops without an error; the commands that need a missing table say which.
# Ordered mode with OUTBOX_ORDERING_ON_FAILURE=block refuses to start. After
# `outbox-relay migrate` the warning is gone.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table sidetabs
model="$OUTBOX_TABLE"
hand="handmade_$$"
it_psql "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $hand CASCADE"
it_psql "CREATE SCHEMA $hand; CREATE TABLE $hand.outbox_events (LIKE $model INCLUDING ALL)"
it_psql "ALTER TABLE $hand.outbox_events DROP COLUMN relay_source"
export OUTBOX_TABLE="$hand.outbox_events"
trap 'it_psql "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $hand CASCADE" >/dev/null 2>&1 || true; it_cleanup' EXIT

it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'side.ok', '{}' FROM generate_series(1, 50)"
# Finished long ago: the cleaner deletes them (its statement reads the
# blocked keys, here an empty stand-in).
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, finished_at) SELECT 'side.old', '{}', 'sent', now() - interval '3 days' FROM generate_series(1, 20)"

ops_relay relay OUTBOX_CLEAN_INTERVAL=1s OUTBOX_SWEEP_INTERVAL=1s
pid=$it_last_pid
it_wait_count 30 "status = 'sent' AND type = 'side.ok'" -eq 50
it_wait_count 30 "type = 'side.old'" -eq 0
# Without relay_source the relay's source is pinned into source.
[ "$(it_count "type = 'side.ok' AND source IS NOT NULL")" = 50 ] || it_fail "source not pinned into source"
# Without a registry the replica vouches for itself only.
ops_wait_metric 15 outbox_live_replicas 'v == 1'
# Loops go on (200 ms polls, 1 s sweeps and cleans) for a while: the one
# warning must stay the only one.
sleep 3

ops_cli pause --reason "no table"
[ "$ops_rc" = 1 ] || it_fail "pause exited $ops_rc, want 1"
grep -q "_control.*does not exist.*outbox-relay migrate" "$it_dir/cli.err" ||
	it_fail "pause did not name the missing table: $(cat "$it_dir/cli.err")"
ops_cli unblock --key k1 --skip
[ "$ops_rc" = 1 ] || it_fail "unblock exited $ops_rc, want 1"
grep -q "no blocked-keys table" "$it_dir/cli.err" ||
	it_fail "unblock did not say why: $(cat "$it_dir/cli.err")"

it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "exit code $it_rc, want 0"
jq -c 'select(.level == "warn" or .level == "error")' "$it_dir/relay.log" >"$it_dir/warnings"
[ "$(wc -l <"$it_dir/warnings")" = 1 ] ||
	it_fail "want exactly one warning, got: $(cat "$it_dir/warnings")"
for want in "$hand.outbox_events_control" "$hand.outbox_events_replicas" \
	"$hand.outbox_events_blocked_keys" "operator pauses" "replica registry" \
	"$hand.outbox_events.relay_source (column)" "source pinned behind the payload" \
	'outbox-relay migrate'; do
	grep -qF "$want" "$it_dir/warnings" || it_fail "the warning does not name '$want': $(cat "$it_dir/warnings")"
done
grep -q '"outbox-relay stopped"' "$it_dir/relay.log" || it_fail "no clean stop logged"

# Blocking needs the blocked-keys table: a clear refusal at startup.
it_relay blocking OUTBOX_ORDERING=partition OUTBOX_ORDERING_ON_FAILURE=block
pid=$it_last_pid
ops_wait_exit "$pid" 20
[ "$it_rc" = 1 ] || it_fail "block mode without the table exited $it_rc, want 1"
grep -q "OUTBOX_ORDERING_ON_FAILURE=block needs the table $hand.outbox_events_blocked_keys.*outbox-relay migrate" \
	"$it_dir/blocking.log" || it_fail "block mode did not name the table"

# What the warning says to do works, and then the relay has nothing to say.
OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate2.out" 2>&1 ||
	it_fail "migrate of the hand-made table failed: $(cat "$it_dir/migrate2.out")"
it_relay migrated
pid=$it_last_pid
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('side.after', '{}')"
it_wait_count 30 "status = 'sent' AND type = 'side.after'" -eq 1
[ "$(it_count "type = 'side.after' AND source IS NULL AND relay_source IS NOT NULL")" = 1 ] ||
	it_fail "after migrate the source is not pinned into relay_source"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "exit code $it_rc after migrate"
! grep -q 'side tables missing' "$it_dir/migrated.log" || it_fail "still warned after migrate"
echo ok
