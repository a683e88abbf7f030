#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every source of the ops session down at once: two databases on one
# server, which stops. The ops session tries each source once a round
# and waits a second between rounds (an earlier version moved from one
# to the other without a pause, a core spent, a log line and a
# connection try each time, for as long as the server was down);
# readiness goes, and comes back with the server.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table opsdown
table="$OUTBOX_TABLE"
services="$(dirname "$0")/../services"
it_cluster
pg=$it_cluster_dir
url=$it_cluster_url
psql "$url" -X -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE other" >/dev/null ||
	it_fail "could not make the second database"
url_other="${url%/*}/other"
dbs_env=(OUTBOX_DATABASE_URL= OUTBOX_DATABASES="one,two"
	OUTBOX_DATABASE_URL_ONE="$url" OUTBOX_DATABASE_URL_TWO="$url_other"
	OUTBOX_TABLE="$table")
env "${dbs_env[@]}" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate.out" 2>&1 ||
	it_fail "migrate of two databases failed: $(cat "$it_dir/migrate.out")"

ops_relay down "${dbs_env[@]}" OUTBOX_LOG_LEVEL=info OUTBOX_POLL_INTERVAL=1s
pid=$it_last_pid
ops_wait_code 20 /readyz 200

moves() { grep -c '"the ops session moves to another source"' "$it_dir/down.log" || true; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
bash "$services/postgres.sh" stop "$pg" >/dev/null 2>&1 || it_fail "could not stop the server"
ops_wait_code 20 /readyz 503
# Settled down to its rounds: over 4 s, a move a round (a second) and
# little CPU; without the rounds, thousands of moves.
m0=$(moves)
c0=$(cpu_ticks "$pid")
sleep 4
m1=$(moves)
c1=$(cpu_ticks "$pid")
cpu_ms=$(((c1 - c0) * 1000 / $(getconf CLK_TCK)))
[ "$m0" -ge 1 ] || it_fail "the ops session never moved to the other database"
[ $((m1 - m0)) -le 2 ] || it_fail "$((m1 - m0)) moves of the ops session in 4 s with both databases down"
[ "$cpu_ms" -lt 1500 ] || it_fail "the relay spent $cpu_ms ms of CPU in 4 s with both databases down"

bash "$services/postgres.sh" restart "$pg" >/dev/null 2>&1 || it_fail "could not start the server again"
ops_wait_code 30 /readyz 200
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exited $it_rc"
echo "ok: both databases down, $((m1 - m0)) moves and ${cpu_ms} ms of CPU in 4 s; ready again once back"
