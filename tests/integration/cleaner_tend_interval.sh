#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The cleaner tends a partitioned table's days once a clean interval
# (docs/design.md §11, "Partitions by the day"), not at each follow-up of
# a round that hit its cap: with a backlog in the default partition and a
# day past retention whose lock another session holds, the day's drop is
# tried once while the capped rounds go on. Tried at each follow-up, a
# second apart, its ACCESS EXCLUSIVE request queued every insert, lease and
# mark behind it each time for its lock wait.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
: "${RELAY_TEST_PG_DIR:?run through tests/run.sh}"
it_table cleantend
schema=${OUTBOX_TABLE%%.*}
ops_cli migrate --partition
[ "$ops_rc" = 0 ] || it_fail "migrate --partition exited $ops_rc: $(cat "$it_dir/cli.err")"

# A day that ended more than the retention ago, made as a relay that ran
# then made it; its lock held by another session for the test's length.
read -r tag lo hi < <(it_psql "SET TimeZone = 'UTC';
  SELECT to_char(at, 'YYYYMMDD'),
    substr(a, 1, 8) || '-' || substr(a, 9, 4) || '-0000-0000-000000000000',
    substr(b, 1, 8) || '-' || substr(b, 9, 4) || '-0000-0000-000000000000'
  FROM (SELECT at,
    lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') AS a,
    lpad(to_hex((extract(epoch FROM at + interval '1 day') * 1000)::bigint), 12, '0') AS b
  FROM (SELECT date_trunc('day', now()) - interval '2 days' AS at) x) y" | tr '|' ' ')
day="$schema.\"outbox_events_p$tag\""
it_psql "CREATE TABLE $day PARTITION OF $OUTBOX_TABLE FOR VALUES FROM ('$lo') TO ('$hi')" >/dev/null
psql "$RELAY_TEST_DATABASE_URL" -X -q -c "BEGIN; LOCK TABLE $day IN ACCESS SHARE MODE;
  SELECT pg_sleep(40); COMMIT" >/dev/null 2>&1 &
holder=$!
it_pids+=("$holder")
held() {
	[ "$(it_psql "SELECT count(*) FROM pg_locks WHERE relation = '$day'::regclass AND granted")" -ge 1 ]
}
it_wait 10 "the day's lock held" held

# 600 rows sent two hours ago, in the default partition: rounds of 100
# (batches of 5, 20 a round), each capped, followed up a second later.
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, finished_at)
  SELECT 'old.sent', '{}', 'sent', now() - interval '2 hours' FROM generate_series(1, 600)" >/dev/null

ops_relay relay OUTBOX_RETENTION=1m OUTBOX_CLEAN_INTERVAL=1h OUTBOX_CLEAN_BATCH_SIZE=5
pid=$it_last_pid
ops_wait_metric 30 'outbox_cleaned_rows_total{status="sent"}' 'v >= 400'
# Each try that waited out its lock wait, in the server's log.
tries=$(grep -c -F "STATEMENT:  LOCK TABLE ONLY \"$schema\".\"outbox_events\", \"$schema\".\"outbox_events_p$tag\"" \
	"$RELAY_TEST_PG_DIR/postgres.log" || true)
[ "$tries" = 1 ] || it_fail "the day's drop was tried $tries times over 4 capped rounds, want once"
[ "$(it_psql "SELECT to_regclass('$day') IS NOT NULL")" = t ] || it_fail "the day was dropped under the lock"
it_stop "$pid"
it_psql "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE relation = '$day'::regclass
  AND pid <> pg_backend_pid()" >/dev/null
wait "$holder" 2>/dev/null || true # ended by the terminate
echo "ok"
