#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `migrate` never queues the application's writes behind its strong locks
# (docs/design.md §2, "Migrations"): with a lease open on the table,
# dropping the NOTIFY trigger (an ACCESS EXCLUSIVE lock) waits only its
# short lock timeout and tries again later, so application INSERTs issued
# meanwhile complete at once; the trigger goes once the lease ends.
. "$(dirname "$0")/lib.sh"
it_table migratelock

migrate() {
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
		OUTBOX_LISTEN="$1" "$RELAY_TEST_BIN" migrate --quiet
}
trigger="SELECT count(*) FROM pg_trigger WHERE tgrelid = '$OUTBOX_TABLE'::regclass
	AND tgname = 'outbox_events_notify'"
migrate on >"$it_dir/on.out" 2>&1 || it_fail "migrate (LISTEN on): $(cat "$it_dir/on.out")"
[ "$(it_psql "$trigger")" = 1 ] || it_fail "no NOTIFY trigger after migrate with LISTEN on"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'lock.test', '{}' FROM generate_series(1, 3)"

# A lease as a relay holds one: a transaction with rows of the table
# locked, open until the inserts are done (a session fed through a fifo,
# so that no fixed sleep has to outlast them on a slow machine).
mkfifo "$it_dir/lease.fifo"
PGAPPNAME=held-lease psql "$RELAY_TEST_DATABASE_URL" -X -q -v ON_ERROR_STOP=1 \
	-f "$it_dir/lease.fifo" >"$it_dir/lease.out" 2>&1 &
it_pids+=("$!")
# Read-write: the open does not wait for psql, so a psql that never ran
# shows as no held lease below, not as a hang.
exec {lease_fd}<>"$it_dir/lease.fifo"
printf '%s\n' "BEGIN;" "SELECT id FROM $OUTBOX_TABLE WHERE status = 'pending' FOR UPDATE SKIP LOCKED LIMIT 2;" >&"$lease_fd"
count_is() {
	test "$(it_psql "$1")" "$2" "$3"
}
it_wait 10 "the held lease" count_is "SELECT count(*) FROM pg_locks l
	JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'held-lease'
	AND l.relation = '$OUTBOX_TABLE'::regclass AND l.mode = 'RowShareLock' AND l.granted" = 1

migrate off >"$it_dir/off.out" 2>&1 &
migrate_pid=$!
it_pids+=("$migrate_pid")
# migrate's ACCESS EXCLUSIVE request waits behind the lease: seen while a
# try waits (200 ms) or, between tries, as the session's last statement.
it_wait 20 "migrate waiting for its lock" count_is "SELECT count(*) FROM pg_stat_activity
	WHERE pid <> pg_backend_pid() AND application_name <> 'held-lease'
	AND query LIKE 'DROP TRIGGER IF EXISTS %' AND query LIKE '%${OUTBOX_TABLE%.*}%'" -ge 1

# The application's inserts meanwhile, each timed: none may queue behind
# the DDL for longer than a moment.
worst=0
for i in $(seq 1 15); do
	t0=$(date +%s%N)
	it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('app.write', '{}')"
	ms=$((($(date +%s%N) - t0) / 1000000))
	[ "$ms" -lt 1000 ] || it_fail "application INSERT $i waited ${ms} ms behind migrate's lock"
	[ "$ms" -gt "$worst" ] && worst=$ms
	sleep 0.2
done
[ "$(it_psql "$trigger")" = 1 ] || it_fail "the NOTIFY trigger went while the lease held its rows"
printf '%s\n' "COMMIT;" >&"$lease_fd"
exec {lease_fd}>&-

# The lease ends; migrate gets its lock on a later try.
rc=0
wait "$migrate_pid" || rc=$?
[ "$rc" = 0 ] || it_fail "migrate (LISTEN off) exit $rc: $(cat "$it_dir/off.out")"
[ "$(it_psql "$trigger")" = 0 ] || it_fail "the NOTIFY trigger is still there"
echo "ok: 15 inserts beside migrate's waiting ACCESS EXCLUSIVE request, the slowest ${worst} ms"
