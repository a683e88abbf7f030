#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Throwaway PostgreSQL server for tests: a fresh cluster in the caller's
# scratch directory, listening only on 127.0.0.1 on a free port, tuned for
# speed rather than durability. Not for anything that must keep data.
#
# Usage: postgres.sh start DIR     create and start; prints the test URL
#        postgres.sh restart DIR   fast restart on the same port (starts it
#                                  again if it was stopped)
#        postgres.sh stop DIR      stop; succeeds if already stopped
#        postgres.sh status DIR    exit 0 if running
#
# DIR comes from `mktemp -d`. After start, DIR/env holds KEY=value lines:
# RELAY_TEST_DATABASE_URL, PGHOST, PGPORT, PG_BIN, PG_DATA, PG_SOCKET_DIR.
# Role `outbox` (superuser, password outbox-test-secret) owns database
# `outbox`; TCP logins need the password (SCRAM), socket logins are trusted.
# PG_BIN may be set to choose a server version; the newest one is the default.
# PG_LOCALE may be set to make the cluster in a locale of the machine's
# (`locale -a`), as a user's database often is (en_US.UTF-8); without it
# the cluster has none (C), the tests' default.
set -euo pipefail

# shellcheck disable=SC2034 # read by lib.sh
svc_name=postgres.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly pg_user=postgres
readonly pg_password=outbox-test-secret
readonly start_timeout=30

usage() {
	sed -n '7,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

find_pg_bin() {
	local bin
	if [ -n "${PG_BIN:-}" ]; then
		[ -x "$PG_BIN/pg_ctl" ] || svc_die "PG_BIN has no pg_ctl: '$PG_BIN'"
		printf '%s\n' "$PG_BIN"
		return
	fi
	bin=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
	if [ ! -x "$bin/initdb" ] || [ ! -x "$bin/pg_ctl" ]; then
		svc_die "no PostgreSQL server found under /usr/lib/postgresql (run deploy/install-deps.sh)"
	fi
	printf '%s\n' "$bin"
}

# Loads PG_BIN/PG_DATA/PGPORT of an instance started earlier; returns 1 if
# DIR holds none.
load_env() {
	local dir="$1"
	pg_bin=$(svc_env_get "$dir/env" PG_BIN) || return 1
	pg_data=$(svc_env_get "$dir/env" PG_DATA) || return 1
	pg_port=$(svc_env_get "$dir/env" PGPORT) || return 1
}

is_running() {
	[ -f "$pg_data/postmaster.pid" ] \
		&& svc_as "$pg_user" "$pg_bin/pg_ctl" status -D "$pg_data" >/dev/null 2>&1
}

wait_ready() {
	svc_wait "$start_timeout" "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" -t 2
}

cmd_start() {
	local dir="$1" url socket_len

	svc_check_dir "$dir"
	[ ! -e "$dir/data" ] || svc_die "'$dir' already holds a cluster; use a fresh directory"
	command -v runuser >/dev/null 2>&1 || [ "$(id -u)" -ne 0 ] \
		|| svc_die "runuser not found (package util-linux)"

	pg_bin=$(find_pg_bin)
	pg_data="$dir/data"
	# The socket path must fit sockaddr_un (107 bytes).
	socket_len=$((${#dir} + 16))
	[ "$socket_len" -le 107 ] || svc_die "DIR path too long for a unix socket: '$dir'"

	if [ "$(id -u)" -eq 0 ]; then
		chown "$pg_user:" "$dir"
		# Other local users (tests not run as root) may use the socket.
		chmod 755 "$dir"
		svc_as "$pg_user" test -w "$dir" \
			|| svc_die "user $pg_user cannot write '$dir' (is a parent directory private?)"
	fi

	locale_arg=--no-locale
	if [ -n "${PG_LOCALE:-}" ]; then
		# locale -a spells UTF-8 as utf8.
		want=$(printf '%s' "$PG_LOCALE" | sed 's/UTF-8$/utf8/')
		# Read whole first: grep -q stops early, and under pipefail
		# locale -a's broken pipe would read as no match.
		locales=$(locale -a)
		grep -qx -- "$want" <<<"$locales" \
			|| svc_die "PG_LOCALE '$PG_LOCALE' is not a locale of this machine (locale -a)"
		locale_arg=--locale=$PG_LOCALE
	fi
	svc_as "$pg_user" "$pg_bin/initdb" -D "$pg_data" -U "$pg_user" -E UTF8 "$locale_arg" \
		--auth-local=trust --auth-host=scram-sha-256 --no-sync --no-instructions \
		>"$dir/initdb.log" 2>&1 \
		|| svc_fail "initdb failed" "$dir/initdb.log"

	# shellcheck disable=SC2119 # no ports to exclude
	pg_port=$(svc_free_port) || svc_die "cannot find a free port"

	cat >"$pg_data/pg_hba.conf" <<EOF
# Written by the test service script: sockets are trusted, TCP needs a
# password so tests of authentication failures are real.
local all all trust
host all all 127.0.0.1/32 scram-sha-256
host replication all 127.0.0.1/32 scram-sha-256
EOF
	cat >>"$pg_data/postgresql.conf" <<EOF

# Test service settings: loopback only, fast and not crash-safe.
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$dir'
max_connections = 200
shared_buffers = 128MB
fsync = off
synchronous_commit = off
full_page_writes = off
password_encryption = scram-sha-256
log_line_prefix = '%m [%p] %q%u@%d '
log_connections = off
# Prepared transactions hold the xmin horizon back: the horizon gauges'
# tests make one (the default, 0, forbids them).
max_prepared_transactions = 10
EOF
	chown "$(stat -c %u:%g "$pg_data")" "$pg_data/pg_hba.conf" "$pg_data/postgresql.conf"

	{
		echo "PGHOST=127.0.0.1"
		echo "PGPORT=$pg_port"
		echo "PG_BIN=$pg_bin"
		echo "PG_DATA=$pg_data"
		echo "PG_SOCKET_DIR=$dir"
	} >"$dir/env"

	# A failed start stops what it started; the logs stay in DIR.
	# shellcheck disable=SC2317 # called by svc_fail
	svc_on_fail() { cmd_stop "$dir"; }
	svc_as "$pg_user" "$pg_bin/pg_ctl" start -D "$pg_data" -l "$dir/postgres.log" \
		-w -t "$start_timeout" >"$dir/pg_ctl.log" 2>&1 \
		|| svc_fail "server did not start" "$dir/pg_ctl.log" "$dir/postgres.log"
	wait_ready || svc_fail "server not ready after ${start_timeout}s" "$dir/postgres.log"

	"$pg_bin/psql" -X -q -h "$dir" -p "$pg_port" -U "$pg_user" -d postgres \
		-v ON_ERROR_STOP=1 >"$dir/setup.log" 2>&1 <<EOF \
		|| svc_fail "cannot create role and database 'outbox'" "$dir/setup.log"
CREATE ROLE outbox LOGIN SUPERUSER PASSWORD '$pg_password';
CREATE DATABASE outbox OWNER outbox;
EOF

	url="postgresql://outbox:$pg_password@127.0.0.1:$pg_port/outbox"
	# Proves the TCP + SCRAM path the tests use, not just the socket.
	"$pg_bin/psql" -X -q -At -d "$url" -c 'SELECT 1' >>"$dir/setup.log" 2>&1 \
		|| svc_fail "password login as 'outbox' over TCP failed" "$dir/setup.log" "$dir/postgres.log"

	echo "RELAY_TEST_DATABASE_URL=$url" >>"$dir/env"
	echo "RELAY_TEST_DATABASE_URL=$url"
}

cmd_restart() {
	local dir="$1"
	svc_check_dir "$dir"
	load_env "$dir" || svc_die "no server was started in '$dir'"
	svc_as "$pg_user" "$pg_bin/pg_ctl" restart -D "$pg_data" -m fast -l "$dir/postgres.log" \
		-w -t "$start_timeout" >"$dir/pg_ctl.log" 2>&1 \
		|| svc_fail "restart failed" "$dir/pg_ctl.log" "$dir/postgres.log"
	wait_ready || svc_fail "server not ready after ${start_timeout}s" "$dir/postgres.log"
}

# Never fails: test cleanup calls it from traps, possibly twice, possibly
# after a failed start.
cmd_stop() {
	local dir="$1" pid
	[ -d "$dir" ] || return 0
	load_env "$dir" || return 0
	[ -f "$pg_data/postmaster.pid" ] || return 0
	if svc_as "$pg_user" "$pg_bin/pg_ctl" stop -D "$pg_data" -m immediate -w -t "$start_timeout" \
		>"$dir/pg_ctl.log" 2>&1; then
		return 0
	fi
	# pg_ctl refused (e.g. stale pid file or hung server): kill the
	# postmaster named in the pid file, if it is still a postgres.
	pid=$(head -n 1 "$pg_data/postmaster.pid" 2>/dev/null || true)
	case "$pid" in
	'' | *[!0-9]*) return 0 ;;
	esac
	if [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = postgres ]; then
		svc_warn "pg_ctl stop failed; killing postmaster $pid"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	return 0
}

cmd_status() {
	local dir="$1"
	svc_check_dir "$dir"
	load_env "$dir" || return 1
	is_running
}

[ $# -eq 2 ] || usage
case "$1" in
start) cmd_start "$2" ;;
restart) cmd_restart "$2" ;;
stop) cmd_stop "$2" ;;
status) cmd_status "$2" ;;
*) usage ;;
esac
