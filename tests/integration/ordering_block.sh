#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A key's head row failing permanently (docs/design.md §6): under skip the
# rest of the key is delivered; under block nothing more of it is, status
# shows the key, the cleaner keeps the blocking row, and
# `outbox-relay unblock --key K --skip` releases it.
. "$(dirname "$0")/lib.sh"

# key K: its first row can never be encoded (a control character in the
# subject), then k2 and k3; key L flows beside it.
seed() {
	it_psql "INSERT INTO $OUTBOX_TABLE (type, subject, partition_key, payload) VALUES
	  ('t', E'bad\\x01', 'K', '{\"n\": 1}'), ('t', 'k2', 'K', '{\"n\": 2}'),
	  ('t', 'k3', 'K', '{\"n\": 3}'), ('t', 'l1', 'L', '{\"n\": 1}')"
}

it_table ordskip
seed
it_relay skip OUTBOX_ORDERING=partition OUTBOX_ORDERING_ON_FAILURE=skip
pid=$it_last_pid
it_wait_count 20 "status = 'sent'" -eq 3
it_stop "$pid"
[ "$(it_count "status = 'failed' AND partition_key = 'K'")" = 1 ] || it_fail "skip: the bad row did not fail"
[ "$(jq -r .subject "$it_dir/skip.out" | grep -c '^k')" = 2 ] || it_fail "skip: the rest of K was not delivered"

it_table ordblock
seed
rel=(OUTBOX_ORDERING=partition OUTBOX_ORDERING_ON_FAILURE=block OUTBOX_RETENTION=1m OUTBOX_FAILED_RETENTION=1m OUTBOX_CLEAN_INTERVAL=1s)
it_relay block "${rel[@]}"
pid=$it_last_pid
it_wait_count 20 "status = 'sent'" -eq 1
sleep 1
[ "$(it_count "status = 'sent' AND partition_key = 'K'")" = 0 ] || it_fail "block: K went on after its head failed"
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "${rel[@]}" "$RELAY_TEST_BIN" status --json >"$it_dir/status.json" ||
	it_fail "status failed"
jq -e '.. | strings | select(. == "K")' "$it_dir/status.json" >/dev/null || it_fail "status --json does not show blocked key K"
# Past every retention, the blocking row survives the cleaner.
it_psql "UPDATE $OUTBOX_TABLE SET finished_at = now() - interval '1 day' WHERE status IN ('sent', 'failed')"
it_wait_count 20 "status = 'sent'" -eq 0
[ "$(it_count "status = 'failed'")" = 1 ] || it_fail "the cleaner deleted the blocking row"

env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "${rel[@]}" "$RELAY_TEST_BIN" unblock --key K --skip \
	>"$it_dir/unblock.out" 2>&1 || it_fail "unblock failed: $(cat "$it_dir/unblock.out")"
grep -q "^partition key 'K' unblocked: the rest of the key flows; its blocking row stays failed$" "$it_dir/unblock.out" ||
	it_fail "unblock said: $(cat "$it_dir/unblock.out")"
it_wait_lines 20 "$it_dir/block.out" 3
it_stop "$pid"
[ "$(jq -r .subject "$it_dir/block.out" | tr '\n' ' ')" = "l1 k2 k3 " ] ||
	it_fail "after unblock: delivered $(jq -r .subject "$it_dir/block.out" | tr '\n' ' ')"
rc=0
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" "${rel[@]}" "$RELAY_TEST_BIN" unblock --key K --skip \
	>"$it_dir/again.out" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "not blocked" "$it_dir/again.out" || it_fail "unblocking a free key: exit $rc"
echo ok
