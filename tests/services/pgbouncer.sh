#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Throwaway PgBouncer for tests: transaction pooling in front of the test
# PostgreSQL (PGHOST/PGPORT, as tests/run.sh exports them), listening only
# on 127.0.0.1 on a free port, with a small pool so that clients share
# server connections.
#
# Usage: pgbouncer.sh start DIR   start; prints the URL of the pooled database
#        pgbouncer.sh stop DIR    stop; succeeds if already stopped
#        pgbouncer.sh status DIR  exit 0 if running
#
# DIR comes from `mktemp -d`. After start, DIR/env holds KEY=value lines:
# PGBOUNCER_URL, PGBOUNCER_PORT. Any client user is let in (auth_type any);
# the server login is role `outbox` of tests/services/postgres.sh.
# Read at start: PGBOUNCER_POOL_SIZE (default_pool_size, default 3) and
# PGBOUNCER_RESET_ALWAYS (1: server_reset_query_always, DISCARD ALL after
# every transaction; default 0, the pool's default) and
# PGBOUNCER_EXTRA_ADDR (an address to listen on besides 127.0.0.1, on the
# same port: the host end of a test's network link), PGBOUNCER_BIN (the
# pgbouncer to run; default the one on PATH) and
# PGBOUNCER_MAX_PREPARED (max_prepared_statements, PgBouncer 1.21 and
# later: the pool's own tracking of protocol-level prepared statements;
# unset, the line is left out and the version's default holds).
set -euo pipefail

# shellcheck disable=SC2034 # read by lib.sh
svc_name=pgbouncer.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly run_user=postgres
readonly pg_password=outbox-test-secret
readonly start_timeout=20

usage() {
	sed -n '8,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

# The pid of the instance started in DIR, if it is still a pgbouncer.
running_pid() {
	local dir="$1" pid
	pid=$(cat "$dir/pgbouncer.pid" 2>/dev/null || true)
	case "$pid" in
	'' | *[!0-9]*) return 1 ;;
	esac
	[ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = pgbouncer ] || return 1
	printf '%s\n' "$pid"
}

cmd_start() {
	local dir="$1" port url bin
	svc_check_dir "$dir"
	[ ! -e "$dir/pgbouncer.ini" ] || svc_die "'$dir' already holds a pgbouncer; use a fresh directory"
	: "${PGPORT:?PGPORT of the test PostgreSQL is not set (run through tests/run.sh)}"
	bin=${PGBOUNCER_BIN:-pgbouncer}
	command -v "$bin" >/dev/null 2>&1 \
		|| svc_die "$bin not found (run deploy/install-deps.sh)"
	if [ "$(id -u)" -eq 0 ]; then
		# pgbouncer refuses to run as root.
		chown "$run_user:" "$dir"
		chmod 755 "$dir"
		svc_as "$run_user" test -w "$dir" \
			|| svc_die "user $run_user cannot write '$dir' (is a parent directory private?)"
	fi
	# shellcheck disable=SC2119 # no ports to exclude
	port=$(svc_free_port) || svc_die "cannot find a free port"
	cat >"$dir/pgbouncer.ini" <<EOF
; Written by the test service script.
[databases]
outbox = host=${PGHOST:-127.0.0.1} port=$PGPORT dbname=outbox user=outbox password=$pg_password

[pgbouncer]
listen_addr = 127.0.0.1${PGBOUNCER_EXTRA_ADDR:+,$PGBOUNCER_EXTRA_ADDR}
listen_port = $port
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = ${PGBOUNCER_POOL_SIZE:-3}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
server_reset_query_always = ${PGBOUNCER_RESET_ALWAYS:-0}
${PGBOUNCER_MAX_PREPARED:+max_prepared_statements = $PGBOUNCER_MAX_PREPARED}
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
	[ "$(id -u)" -ne 0 ] || chown "$run_user:" "$dir/pgbouncer.ini"
	# shellcheck disable=SC2317 # called by svc_fail
	svc_on_fail() { cmd_stop "$dir"; }
	svc_as "$run_user" "$bin" -d "$dir/pgbouncer.ini" >"$dir/start.log" 2>&1 \
		|| svc_fail "pgbouncer did not start" "$dir/start.log" "$dir/pgbouncer.log"
	url="postgresql://outbox@127.0.0.1:$port/outbox"
	svc_wait "$start_timeout" psql -X -q -At -d "$url" -c 'SELECT 1' \
		|| svc_fail "no query through pgbouncer after ${start_timeout}s" "$dir/pgbouncer.log"
	{
		echo "PGBOUNCER_URL=$url"
		echo "PGBOUNCER_PORT=$port"
	} >"$dir/env"
	echo "PGBOUNCER_URL=$url"
}

# Never fails: test cleanup calls it from traps, possibly twice.
cmd_stop() {
	local dir="$1" pid
	[ -d "$dir" ] || return 0
	pid=$(running_pid "$dir") || return 0
	kill -INT "$pid" 2>/dev/null || true
	for _ in $(seq 1 50); do
		running_pid "$dir" >/dev/null || return 0
		sleep 0.1
	done
	svc_warn "pgbouncer $pid did not stop on SIGINT; killing it"
	kill -KILL "$pid" 2>/dev/null || true
	return 0
}

cmd_status() {
	local dir="$1"
	svc_check_dir "$dir"
	running_pid "$dir" >/dev/null
}

[ $# -eq 2 ] || usage
case "$1" in
start) cmd_start "$2" ;;
stop) cmd_stop "$2" ;;
status) cmd_status "$2" ;;
*) usage ;;
esac
