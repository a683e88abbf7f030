#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A clean stop while the ops thread is stuck in a connect to a server that
# accepts the connection and never answers (a proxy whose upstream hangs):
# the loops finish, the ops thread is left after its stop wait (3 s), and
# the process exits 0 at once instead of waiting out the connect's
# dead-peer window (here 60 s: the window is at most half the lease
# timeout, hence its 150 s), and without freeing what that thread
# still reads (docs/design.md §7, the ops thread at a stop).
. "$(dirname "$0")/lib.sh"
it_table stop_stuck
it_cluster
url=$it_cluster_url
pg_port=$(printf '%s' "$url" | sed -E 's|^.*@[^:/]+:([0-9]+)/.*$|\1|')
gate_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
gate_url="${url/:$pg_port\//:$gate_port/}"
[ "$gate_url" != "$url" ] || it_fail "cannot point the URL at the gate: $url"
# Connections pass while the gate file exists; once it is gone, each new
# one is accepted and held unanswered.
touch "$it_dir/gate"
python3 "$(dirname "$0")/tcp_gate.py" "$gate_port" "$pg_port" "$it_dir/gate" 2>"$it_dir/gate.log" &
it_pids+=("$!")
OUTBOX_DATABASE_URL="$url" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate2.out" 2>&1 ||
	it_fail "migrate failed: $(cat "$it_dir/migrate2.out")"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
it_relay stuck OUTBOX_DATABASE_URL="$gate_url" OUTBOX_HTTP_ADDR="127.0.0.1:$port" \
	OUTBOX_PG_DEAD_PEER_TIMEOUT=60s OUTBOX_LEASE_TIMEOUT=150s OUTBOX_LOG_LEVEL=info OUTBOX_WORKERS=1
pid=$it_last_pid
it_wait 20 "readiness" curl -sf "http://127.0.0.1:$port/readyz" -o /dev/null
psql_own() { psql "$url" -X -A -t -q -v ON_ERROR_STOP=1 -c "$1"; }
# The worker's lane, the sweeper, the cleaner and the ops session (no
# event, so no claim session).
sessions() { [ "$(psql_own "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay/%'")" -ge 4 ]; }
it_wait 20 "the relay's sessions" sessions

rm "$it_dir/gate"
[ "$(psql_own "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay/%/ops'")" = 1 ] ||
	it_fail "no ops session to end"
# The ops thread finds its session gone at its next heartbeat, says it
# is not ready, and connects again: into the gate, which holds it.
not_ready() { ! curl -sf "http://127.0.0.1:$port/readyz" -o /dev/null; }
it_wait 20 "/readyz to say not ready" not_ready
it_wait 10 "the ops thread's connect into the gate" grep -q 'holding a connection' "$it_dir/gate.log"

started=$SECONDS
it_stop "$pid" 20
took=$((SECONDS - started))
grep -q '"ops thread did not stop within 3000 ms; leaving it"' "$it_dir/stuck.log" ||
	it_fail "the stop did not leave the stuck ops thread: $(tail -5 "$it_dir/stuck.log")"
grep -q '"outbox-relay stopped".*"exit":"0"' "$it_dir/stuck.log" ||
	it_fail "the relay did not say it stopped cleanly"
echo "stopped in ${took} s with the ops thread stuck in a connect" >&2
