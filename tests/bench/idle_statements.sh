#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What each statement of an idle relay of many tables costs Postgres
# (docs/benchmark.md, "Every source's dead tuples"). An experiment, not a
# target: TABLES tables (m_t1.outbox_events, ...) migrated by one
# `migrate` of their list, a relay on the pattern m_t*.outbox_events
# (stdout publisher, HTTP on so that its ops thread runs, default
# settings otherwise) left 60 s to settle, then pg_stat_statements reset
# and read WINDOW seconds later: the statements that took the most time,
# with their calls and their execution and planning time in ms.
# Usage: RELAY_TEST_BIN=bin tests/bench/idle_statements.sh [tables] [window]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TABLES=${1:-1000}
WINDOW=${2:-60}
# shellcheck source-path=SCRIPTDIR source=experiment_lib.sh
. "$root/tests/bench/experiment_lib.sh"
statements_on
list=$(seq -f 'm_t%g.outbox_events' 1 "$TABLES" | paste -sd, -)
OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_TABLE=$list \
	"$RELAY_TEST_BIN" migrate --quiet >/dev/null
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL \
	OUTBOX_TABLE='m_t*.outbox_events' OUTBOX_PUBLISHER=stdout \
	OUTBOX_HTTP_ADDR="127.0.0.1:$port" OUTBOX_LOG_LEVEL=warn \
	timeout $((WINDOW + 300)) "$RELAY_TEST_BIN" run >/dev/null 2>>"$work/relay.log" &
pid=$!
sleep 60
q -c "SELECT pg_stat_statements_reset()" >/dev/null
sleep "$WINDOW"
echo "calls exec_ms plan_ms ms_per_call statement"
q -F ' ' -c "SELECT calls, round(total_exec_time::numeric, 1),
             round(total_plan_time::numeric, 1),
             round(((total_exec_time + total_plan_time) / calls)::numeric, 2),
             left(regexp_replace(query, '\s+', ' ', 'g'), 70)
             FROM pg_stat_statements WHERE calls > 0
             ORDER BY total_exec_time + total_plan_time DESC LIMIT 12"
kill -TERM "$pid" || true
wait "$pid" || true
