#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Wake-up through LISTEN (docs/design.md §7): with a 10 s poll interval and
# OUTBOX_LISTEN=on, an inserted event is published within a second; with
# the trigger dropped it still goes out within the poll interval; the
# listener comes back after a Postgres restart. Notifications wake the
# workers only: a burst of commits does not make the sweeper sweep. A
# table spelled otherwise than at migrate is woken all the same; one
# without the trigger is named at the listener's connect. A role that may
# not read the notification queue's usage is listened for all the same.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
: "${RELAY_TEST_PG_DIR:?run through tests/run.sh}"
it_table listen
OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_LISTEN=on "$RELAY_TEST_BIN" migrate \
	>"$it_dir/migrate-on.out" 2>&1 || it_fail "migrate with LISTEN on: $(cat "$it_dir/migrate-on.out")"
grep -q "NOTIFY trigger present" "$it_dir/migrate-on.out" || it_fail "migrate did not report the trigger"

ops_relay relay OUTBOX_LISTEN=on OUTBOX_POLL_INTERVAL=10s OUTBOX_SWEEP_INTERVAL=5s
pid=$it_last_pid
# Past the probe (the listener says so once it LISTENs) and the first poll.
it_wait 30 "the listener" grep -q '"listening for inserts"' "$it_dir/relay.log"
sleep 0.5

# insert_and_time SECONDS: seconds from commit to the event's line.
insert_and_time() {
	ops_insert_and_time "$1" "$it_dir/relay.out" listen.test
}
t=$(insert_and_time 5)
awk -v t="$t" 'BEGIN { exit !(t < 1) }' || it_fail "with LISTEN the event took ${t}s"

# 200 commits, 200 notifications, in about a second: at most one sweep
# (every 5 s), not one per notification.
sweeps=$(ops_metric outbox_sweeps_total)
n=$(wc -l <"$it_dir/relay.out")
for _ in $(seq 200); do
	echo "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('listen.burst', '{}');"
done | psql "$RELAY_TEST_DATABASE_URL" -X -q -v ON_ERROR_STOP=1 -f - >/dev/null
it_wait_lines 30 "$it_dir/relay.out" $((n + 200))
swept=$(($(ops_metric outbox_sweeps_total) - sweeps))
[ "$swept" -le 2 ] || it_fail "$swept sweeps during a burst of 200 notifications"

# Without the trigger, polling remains: within the 10 s interval.
OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_LISTEN=off "$RELAY_TEST_BIN" migrate \
	>"$it_dir/migrate-off.out" 2>&1 || it_fail "migrate with LISTEN off"
sleep 0.5
t=$(insert_and_time 12)
awk -v t="$t" 'BEGIN { exit !(t >= 1) }' || it_fail "without the trigger the event came in ${t}s: was it not the poll?"

# The listener reconnects and LISTENs again after a restart.
OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_LISTEN=on "$RELAY_TEST_BIN" migrate >/dev/null 2>&1
listened=$(grep -c '"listening for inserts"' "$it_dir/relay.log")
bash "$RELAY_TEST_SOURCE_ROOT/tests/services/postgres.sh" restart "$RELAY_TEST_PG_DIR" >/dev/null
it_wait 30 "listener reconnect" grep -q '"listener lost its connection' "$it_dir/relay.log"
listening_again() { [ "$(grep -c '"listening for inserts"' "$it_dir/relay.log")" -gt "$listened" ]; }
it_wait 30 "the listener to LISTEN again" listening_again
sleep 0.5
t=$(insert_and_time 12)
awk -v t="$t" 'BEGIN { exit !(t < 1) }' || it_fail "after the restart the event took ${t}s"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "exit code $it_rc"

# The same table spelled without its schema (found by search_path), where
# migrate spelled it with one: the listener LISTENs on the channel the
# trigger notifies, read from the trigger's function, not on one of its
# own spelling, which no insert notified (the event then waited for the
# poll, without a word).
schema=${OUTBOX_TABLE%%.*}
OUTBOX_TABLE="${OUTBOX_TABLE#*.}" ops_relay bare OUTBOX_LISTEN=on OUTBOX_POLL_INTERVAL=10s \
	OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL?options=-c%20search_path%3D$schema"
pid=$it_last_pid
it_wait 30 "the listener of the bare name" grep -q '"listening for inserts"' "$it_dir/bare.log"
sleep 0.5
t=$(ops_insert_and_time 5 "$it_dir/bare.out" listen.test)
awk -v t="$t" 'BEGIN { exit !(t < 1) }' || it_fail "the table spelled otherwise than at migrate: the event took ${t}s"
grep -q 'will wake no relay' "$it_dir/bare.log" && it_fail "a warning for a table whose trigger is there"
# The trigger dropped: the listener says at its connect that nothing
# will wake the table.
OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_LISTEN=off "$RELAY_TEST_BIN" migrate >/dev/null 2>&1 ||
	it_fail "migrate with LISTEN off"
it_stop "$pid"
OUTBOX_TABLE="${OUTBOX_TABLE#*.}" ops_relay untriggered OUTBOX_LISTEN=on \
	OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL?options=-c%20search_path%3D$schema"
pid=$it_last_pid
it_wait 30 "the warning that no trigger wakes the table" grep -q '"inserts into a table will wake no relay; it is polled".*no enabled NOTIFY trigger' "$it_dir/untriggered.log"
it_stop "$pid"

# A role that may not read the notification queue's usage (the function
# revoked, in a database of the test's own): the listener goes on
# listening without the gauge. It reconnected for it, every 5 s, each
# reconnect waking every table. The ops session's gauges go on without
# it too, where every gauge query failed.
role="listen_plain_$$"
db="listen_plain_$$"
drop_plain() {
	it_psql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	it_psql "DROP ROLE IF EXISTS $role" >/dev/null 2>&1 || true
}
trap 'drop_plain; it_cleanup' EXIT
it_psql "CREATE ROLE $role LOGIN PASSWORD 'outbox-test-secret'" >/dev/null
it_psql "CREATE DATABASE $db OWNER $role" >/dev/null
url_plain=$(sed "s|//outbox:|//$role:|; s|/[^/?]*\$|/$db|" <<<"$RELAY_TEST_DATABASE_URL")
psql "${RELAY_TEST_DATABASE_URL%/*}/$db" -X -q -v ON_ERROR_STOP=1 \
	-c "REVOKE EXECUTE ON FUNCTION pg_notification_queue_usage() FROM PUBLIC" ||
	it_fail "could not revoke the queue's usage function"
OUTBOX_DATABASE_URL="$url_plain" OUTBOX_TABLE=outbox_events OUTBOX_LISTEN=on "$RELAY_TEST_BIN" migrate \
	>"$it_dir/migrate-plain.out" 2>&1 || it_fail "migrate as $role: $(cat "$it_dir/migrate-plain.out")"
OUTBOX_TABLE=outbox_events ops_relay plain OUTBOX_LISTEN=on OUTBOX_POLL_INTERVAL=10s \
	OUTBOX_LOG_LEVEL=debug OUTBOX_DATABASE_URL="$url_plain"
pid=$it_last_pid
it_wait 30 "the listener of the plain role" grep -q '"listening for inserts"' "$it_dir/plain.log"
# Two reads 5 s apart, each failed (said at debug), or a connect again.
read_twice() {
	[ "$(grep -c "reading the notification queue's usage failed" "$it_dir/plain.log")" -ge 2 ] ||
		[ "$(grep -c '"listening for inserts"' "$it_dir/plain.log")" -ge 2 ]
}
it_wait 30 "two reads of the queue's usage" read_twice
[ "$(grep -c '"listening for inserts"' "$it_dir/plain.log")" = 1 ] ||
	it_fail "the listener connected again for the queue's usage: $(grep -c '"listening for inserts"' "$it_dir/plain.log") connects"
sleep 0.5
t=$(RELAY_TEST_DATABASE_URL="$url_plain" OUTBOX_TABLE=outbox_events \
	ops_insert_and_time 5 "$it_dir/plain.out" listen.plain)
awk -v t="$t" 'BEGIN { exit !(t < 1) }' || it_fail "without the queue's usage the event took ${t}s"
# Gauges refreshed every 5 s: a backlog of 3 shows.
psql "$url_plain" -X -q -v ON_ERROR_STOP=1 -c "INSERT INTO outbox_events (type, payload, next_attempt_at)
  SELECT 'listen.later', '{}', now() + interval '1 hour' FROM generate_series(1, 3)" >/dev/null
ops_wait_metric 15 outbox_backlog_events 'v == 3'
grep -q '"gauge query failed' "$it_dir/plain.log" && it_fail "the gauge query failed: $(grep '"gauge query failed' "$it_dir/plain.log" | head -1)"
[ "$(grep -c 'may not run pg_notification_queue_usage' "$it_dir/plain.log")" = 1 ] ||
	it_fail "the gauges' missing function was not said once"
it_stop "$pid"
echo "ok"
