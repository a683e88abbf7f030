#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# PostgreSQL restarted under the running relay: it reconnects by itself and
# finishes the work without a restart of its own.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_PG_DIR:?run through tests/run.sh}"
it_table pgrestart
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'pg.restart', '{}' FROM generate_series(1, 500)"

it_relay relay OUTBOX_MAX_RATE=250 OUTBOX_BATCH_SIZE=25 OUTBOX_WORKERS=2
pid=$it_last_pid
it_wait_count 20 "status = 'sent'" -ge 50
bash "$RELAY_TEST_SOURCE_ROOT/tests/services/postgres.sh" restart "$RELAY_TEST_PG_DIR" >/dev/null
it_wait_count 60 "status = 'sent'" -eq 500
kill -0 "$pid" || it_fail "the relay died"
grep -q '"reconnected to postgres"' "$it_dir/relay.log" || it_fail "no reconnect was logged"
it_stop "$pid"
rc=$it_rc
[ "$rc" = 0 ] || it_fail "exit code $rc"
[ "$(it_count "status <> 'sent'")" = 0 ] || it_fail "rows not sent"
echo "ok"
