#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What an idle relay of many tables costs Postgres, for two builds in
# turn (docs/design.md §13, "Every table's registry"). An experiment, not
# a target: TABLES tables (m_t1.outbox_events, ...) migrated by one
# `migrate` of their list; then, each round, for each build, a relay on
# the pattern m_t*.outbox_events (stdout publisher, HTTP on so that its
# ops thread runs, default settings otherwise) left 75 s to settle (every
# thread's first pass opens a store per table; the sweeper's comes at
# 30 s), then WINDOW seconds with nothing to relay: the Postgres CPU of
# its own sessions (their backends, found by application name at the
# window's start and end) and of the whole cluster (autovacuum visiting
# the tables included), in ms a second. The sweeper's pass over every
# table each 30 s is most of the spread: take windows of a few passes.
# Usage: RELAY_TEST_BIN=new BASELINE_BIN=old tests/bench/idle_registries.sh [tables] [rounds] [window]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TABLES=${1:-1000}
ROUNDS=${2:-2}
WINDOW=${3:-90}
: "${BASELINE_BIN:?set BASELINE_BIN to the outbox-relay binary to compare with}"
# shellcheck source-path=SCRIPTDIR source=experiment_lib.sh
. "$root/tests/bench/experiment_lib.sh"

list=$(seq -f 'm_t%g.outbox_events' 1 "$TABLES" | paste -sd, -)
OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_TABLE=$list \
	"$RELAY_TEST_BIN" migrate --quiet >/dev/null
echo "build round own_ms_per_s cluster_ms_per_s"
for round in $(seq "$ROUNDS"); do
	for bin in "$BASELINE_BIN" "$RELAY_TEST_BIN"; do
		port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
		OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL \
			OUTBOX_TABLE='m_t*.outbox_events' OUTBOX_PUBLISHER=stdout \
			OUTBOX_HTTP_ADDR="127.0.0.1:$port" OUTBOX_LOG_LEVEL=warn \
			timeout 600 "$bin" run >/dev/null 2>>"$work/relay.log" &
		pid=$!
		sleep 75
		o0=$(relay_ticks) c0=$(pgcpu) t0=$(date +%s.%N)
		sleep "$WINDOW"
		o1=$(relay_ticks) c1=$(pgcpu) t1=$(date +%s.%N)
		kill -TERM "$pid"
		wait "$pid" || true
		awk -v b="$bin" -v r="$round" -v o="$((o1 - o0))" -v c="$((c1 - c0))" \
			-v t0="$t0" -v t1="$t1" -v tk="$tk" \
			'BEGIN { s = t1 - t0; printf "%s %d %.1f %.1f\n", b, r, 1000 * o / tk / s, 1000 * c / tk / s }'
		sleep 2
	done
done
