#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A worker whose session is lost while it reads the operator pauses (the
# first statement of a turn after a quiet second) reconnects and leases
# at its next turn, not a poll interval later: an idle relay polling once
# a minute, its workers' sessions ended by the server, then an event
# whose notification starts the turn. An earlier version skipped the
# source for the poll interval after the reconnect, so the event waited
# a minute.
. "$(dirname "$0")/lib.sh"
it_table lost
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_LISTEN=on \
	"$RELAY_TEST_BIN" migrate >"$it_dir/migrate_listen.out" 2>&1 ||
	it_fail "migrate with LISTEN on failed: $(cat "$it_dir/migrate_listen.out")"
it_relay lost OUTBOX_LISTEN=on OUTBOX_POLL_INTERVAL=60s OUTBOX_LOG_LEVEL=info
pid=$it_last_pid
it_wait 20 "the listener" grep -q '"listening for inserts"' "$it_dir/lost.log"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('before', '\\x7b7d')" >/dev/null
it_wait 20 "an event before the sessions end" grep -q '"type":"before"' "$it_dir/lost.out"

# Quiet for more than the pauses' refresh (a second), then the lanes'
# sessions end; the listener's stays.
sleep 2
workers="application_name LIKE 'outbox-relay/%/worker%' AND datname = current_database()"
[ "$(it_psql "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE $workers")" -ge 1 ] ||
	it_fail "no worker session to end"
it_wait 10 "the workers' sessions gone" bash -c "[ \"\$(psql '$RELAY_TEST_DATABASE_URL' -XAtc \"SELECT count(*) FROM pg_stat_activity WHERE $workers\")\" = 0 ]"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('after', '\\x7b7d')" >/dev/null
started=$SECONDS
it_wait 20 "the event after the sessions ended (not a poll interval later)" grep -q '"type":"after"' "$it_dir/lost.out"
took=$((SECONDS - started))
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo "ok: the event after the workers' sessions ended went out in ${took}s"
