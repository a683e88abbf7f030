#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Slow or hostile HTTP clients cannot take /healthz down: a client that
# never finishes its request is closed once its header has taken too long,
# and while 200 slow clients (from many addresses, or from the probe's own
# address) hold more connections than the server serves at once, /healthz
# still answers 200 every time (ops_http_slow.py; the times are printed).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table opsslow

ops_relay relay
pid=$it_last_pid
ops_wait_code 20 /healthz 200
python3 "$(dirname "$0")/ops_http_slow.py" "$ops_port" >"$it_dir/slow.out" 2>&1 ||
	it_fail "$(cat "$it_dir/slow.out")"
cat "$it_dir/slow.out"
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited"
ops_get /healthz
[ "$ops_code" = 200 ] || it_fail "healthz after the slow clients: $ops_code $ops_body"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo ok
