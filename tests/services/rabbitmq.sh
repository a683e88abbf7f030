#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Throwaway RabbitMQ node for tests: its own node name, ports, epmd, Erlang
# cookie, data and logs, all in the caller's scratch directory and bound to
# 127.0.0.1, so it never meets a system RabbitMQ or another test run.
#
# Usage: rabbitmq.sh start DIR           start; prints the test URL
#        rabbitmq.sh ctl DIR ARGS...     rabbitmqctl against this node
#        rabbitmq.sh stop DIR            stop; succeeds if already stopped
#
# DIR comes from `mktemp -d`. After start, DIR/env holds KEY=value lines:
# RELAY_TEST_AMQP_URL, RABBITMQ_NODENAME, RABBITMQ_NODE_PORT, ERL_EPMD_PORT,
# RABBITMQ_CONF_ENV_FILE, HOME (where the node's Erlang cookie is).
# User `outbox` (password outbox-test-secret) has full rights on vhost "/".
#
# With RABBITMQ_TEST_TLS_DIR set to a directory holding ca.crt, server.crt
# and server.key, the node also listens for AMQPS (TLS) on another port,
# asks clients for a certificate signed by ca.crt (without requiring one),
# and enables rabbitmq_auth_mechanism_ssl (SASL EXTERNAL, the user name
# taken from the certificate's CN); DIR/env then holds RELAY_TEST_AMQPS_PORT.
set -euo pipefail

# shellcheck disable=SC2034 # read by lib.sh
svc_name=rabbitmq.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly rmq_user=rabbitmq
readonly rmq_password=outbox-test-secret
readonly rmq_sbin=/usr/lib/rabbitmq/bin
readonly start_timeout=60
readonly stop_timeout=30

usage() {
	sed -n '7,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

# Commands run as the rabbitmq account when we are root: the node's files
# must not end up root-owned, and Debian's own wrapper would switch users
# anyway (and force HOME to the system node's directory, whose cookie we
# must not share).
runner=()
if [ "$(id -u)" -eq 0 ]; then
	runner=(runuser -u "$rmq_user" --)
fi

# The environment of every server and CLI process: only what we set, so
# RABBITMQ_* variables of the calling shell cannot point elsewhere.
node_env() {
	local dir="$1"
	printf '%s\n' \
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		"HOME=$dir" \
		"LANG=C.UTF-8" \
		"LC_ALL=C.UTF-8" \
		"RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf" \
		"RABBITMQ_NODENAME=$(svc_env_get "$dir/env" RABBITMQ_NODENAME)" \
		"ERL_EPMD_PORT=$(svc_env_get "$dir/env" ERL_EPMD_PORT)" \
		"ERL_EPMD_ADDRESS=127.0.0.1"
}

# run_ctl DIR ARGS...: rabbitmqctl against the node started in DIR, behind
# ctl_prefix (e.g. a timeout) if set.
ctl_prefix=()
run_ctl() {
	local dir="$1" env_lines=()
	shift
	mapfile -t env_lines < <(node_env "$dir")
	(cd "$dir" && "${ctl_prefix[@]}" "${runner[@]}" env -i "${env_lines[@]}" "$rmq_sbin/rabbitmqctl" \
		-n "$(svc_env_get "$dir/env" RABBITMQ_NODENAME)" "$@")
}

# Pids of every process of the node: the server script, beam.smp, its port
# programs and any rabbitmqctl talking to it. Port programs such as
# erl_child_setup start their own sessions and would survive beam.smp if
# killed, so the marker is the environment all of them inherit. The
# caller and its ancestors are left out: tests/run.sh exports the node's
# env file to the tests, so the shell that stops the node carries the
# marker too, and killed itself before it reached epmd.
node_pids() {
	local dir="$1"
	python3 - "RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf" <<'PY'
import os, sys
marker = sys.argv[1].encode()
mine = set()
pid = os.getpid()
while pid > 1 and pid not in mine:
    mine.add(pid)
    try:
        with open("/proc/%d/stat" % pid) as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
found = False
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) in mine:
        continue
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        continue
    if marker in env:
        print(pid)
        found = True
sys.exit(0 if found else 1)
PY
}

epmd_pid() {
	local dir="$1" pid
	pid=$(cat "$dir/epmd.pid" 2>/dev/null) || return 1
	case "$pid" in
	'' | *[!0-9]*) return 1 ;;
	esac
	[ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = epmd ] || return 1
	printf '%s\n' "$pid"
}

node_alive() {
	node_pids "$1" >/dev/null
}

node_gone() {
	! node_alive "$1"
}

# AMQP_GRACE_UNTIL: until then (SECONDS) a node not found yet is not given
# up on: the background shell may not have exec'd the node with its
# marked environment yet, which on a loaded machine takes a moment.
amqp_ready() {
	local dir="$1" port="$2"
	if ! node_alive "$dir"; then
		[ "$SECONDS" -lt "${AMQP_GRACE_UNTIL:-0}" ] || return 99
		return 1
	fi
	svc_port_listening "$port"
}

cmd_start() {
	local dir="$1" node amqp_port dist_port epmd_port ctl_port tls_port="" env_lines=() t0 rc
	t0=$SECONDS

	svc_check_dir "$dir"
	[ ! -e "$dir/env" ] || svc_die "'$dir' was already used; use a fresh directory"
	[ -x "$rmq_sbin/rabbitmq-server" ] \
		|| svc_die "rabbitmq-server not found in $rmq_sbin (run deploy/install-deps.sh)"
	command -v epmd >/dev/null 2>&1 || svc_die "epmd not found (package erlang-base)"

	# A failed start stops what it started; the logs stay in DIR.
	# shellcheck disable=SC2317 # called by svc_fail
	svc_on_fail() { cmd_stop "$dir"; }

	node="outbox-test-$$@localhost"
	amqp_port=$(svc_free_port) || svc_die "cannot find a free port"
	dist_port=$(svc_free_port "$amqp_port") || svc_die "cannot find a free port"
	epmd_port=$(svc_free_port "$amqp_port" "$dist_port") || svc_die "cannot find a free port"
	# rabbitmqctl is an Erlang node too; it listens on the first free port
	# of a range, by default 35672-35682, which concurrent runs would share.
	# Ten ports from a free one leave room for concurrent ctl calls.
	ctl_port=$(svc_free_port "$amqp_port" "$dist_port" "$epmd_port") \
		|| svc_die "cannot find a free port"

	mkdir -p "$dir/mnesia" "$dir/log"

	# Sourced by the rabbitmq-env script of both server and CLI.
	cat >"$dir/rabbitmq-env.conf" <<EOF
# Written by the test service script.
NODENAME=$node
NODE_IP_ADDRESS=127.0.0.1
NODE_PORT=$amqp_port
DIST_PORT=$dist_port
CONFIG_FILE=$dir/rabbitmq.conf
ADVANCED_CONFIG_FILE=$dir/advanced.config
ENABLED_PLUGINS_FILE=$dir/enabled_plugins
MNESIA_BASE=$dir/mnesia
LOG_BASE=$dir/log
PID_FILE=$dir/rabbitmq.pid
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
CTL_DIST_PORT_MIN=$ctl_port
CTL_DIST_PORT_MAX=$((ctl_port + 9))
EOF
	cat >"$dir/rabbitmq.conf" <<EOF
# Written by the test service script: loopback only, one known user.
listeners.tcp.default = 127.0.0.1:$amqp_port
loopback_users = none
default_vhost = /
default_user = outbox
default_pass = $rmq_password
default_user_tags.administrator = true
default_permissions.configure = .*
default_permissions.read = .*
default_permissions.write = .*
# Tests raise memory alarms on purpose; a nearly full disk must not.
disk_free_limit.absolute = 8MB
log.console = false
log.file.level = info
EOF
	echo '[].' >"$dir/enabled_plugins"
	if [ -n "${RABBITMQ_TEST_TLS_DIR:-}" ]; then
		tls_port=$(svc_free_port "$amqp_port" "$dist_port" "$epmd_port" "$ctl_port") ||
			svc_die "cannot find a free port"
		mkdir -p "$dir/tls"
		cp "$RABBITMQ_TEST_TLS_DIR/ca.crt" "$RABBITMQ_TEST_TLS_DIR/server.crt" \
			"$RABBITMQ_TEST_TLS_DIR/server.key" "$dir/tls/" ||
			svc_die "RABBITMQ_TEST_TLS_DIR lacks ca.crt, server.crt or server.key"
		cat >>"$dir/rabbitmq.conf" <<EOF
# TLS (RABBITMQ_TEST_TLS_DIR): client certificates are asked for, not required.
listeners.ssl.default = 127.0.0.1:$tls_port
ssl_options.cacertfile = $dir/tls/ca.crt
ssl_options.certfile = $dir/tls/server.crt
ssl_options.keyfile = $dir/tls/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
ssl_cert_login_from = common_name
EOF
		echo '[rabbitmq_auth_mechanism_ssl].' >"$dir/enabled_plugins"
	fi
	# Erlang refuses a cookie file that others can read.
	python3 -c 'import secrets; print(secrets.token_hex(20).upper(), end="")' >"$dir/.erlang.cookie"
	chmod 400 "$dir/.erlang.cookie"

	{
		echo "RABBITMQ_NODENAME=$node"
		echo "RABBITMQ_NODE_PORT=$amqp_port"
		echo "ERL_EPMD_PORT=$epmd_port"
		echo "RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf"
		echo "HOME=$dir"
		[ -z "$tls_port" ] || echo "RELAY_TEST_AMQPS_PORT=$tls_port"
	} >"$dir/env"

	if [ "$(id -u)" -eq 0 ]; then
		chown -R "$rmq_user:" "$dir"
		chmod 755 "$dir"
		"${runner[@]}" test -w "$dir" \
			|| svc_die "user $rmq_user cannot write '$dir' (is a parent directory private?)"
	fi

	# Our own epmd on our own port: the node would otherwise start one that
	# outlives it, or register with a system epmd on 4369.
	setsid epmd -port "$epmd_port" -address 127.0.0.1 \
		</dev/null >"$dir/log/epmd.log" 2>&1 &
	echo "$!" >"$dir/epmd.pid"
	svc_wait 10 svc_port_listening "$epmd_port" \
		|| svc_fail "epmd did not listen on port $epmd_port" "$dir/log/epmd.log"

	mapfile -t env_lines < <(node_env "$dir")
	# Detached from our session so that a Ctrl-C of the test run or the end
	# of its process group does not kill the node behind stop's back.
	(cd "$dir" && exec setsid "${runner[@]}" env -i "${env_lines[@]}" \
		"$rmq_sbin/rabbitmq-server" </dev/null >"$dir/log/startup.log" 2>&1) &

	# The AMQP listener opens last in the boot sequence, so it listening
	# means the node is ready.
	AMQP_GRACE_UNTIL=$((SECONDS + 5))
	rc=0
	svc_wait "$start_timeout" amqp_ready "$dir" "$amqp_port" || rc=1
	if [ "$rc" -eq 0 ] && [ -n "$tls_port" ]; then
		svc_wait "$start_timeout" amqp_ready "$dir" "$tls_port" || rc=1
	fi
	if ! node_alive "$dir"; then
		svc_fail "node exited during start" "$dir/log/startup.log" "$dir/log/$node.log"
	fi
	[ "$rc" -eq 0 ] \
		|| svc_fail "AMQP port $amqp_port not open after ${start_timeout}s" \
			"$dir/log/startup.log" "$dir/log/$node.log"

	# Proves that the CLI reaches the node (cookie, epmd, names) and that
	# the test user exists, both of which later tests rely on.
	run_ctl "$dir" authenticate_user outbox "$rmq_password" >"$dir/log/setup.log" 2>&1 \
		|| svc_fail "rabbitmqctl cannot reach the node or user 'outbox' is missing" \
			"$dir/log/setup.log" "$dir/log/$node.log"

	# No path: vhost "/" (a trailing "/" would name the empty vhost).
	echo "RELAY_TEST_AMQP_URL=amqp://outbox:$rmq_password@127.0.0.1:$amqp_port" >>"$dir/env"
	echo "RELAY_TEST_AMQP_URL=amqp://outbox:$rmq_password@127.0.0.1:$amqp_port"
	echo "rabbitmq.sh: node $node ready in $((SECONDS - t0))s" >&2
}

cmd_ctl() {
	local dir="$1"
	shift
	svc_check_dir "$dir"
	[ -r "$dir/env" ] || svc_die "no node was started in '$dir'"
	run_ctl "$dir" "$@"
}

# Never fails: test cleanup calls it from traps, possibly twice, possibly
# after a failed start.
cmd_stop() {
	local dir="$1" pids pid
	[ -d "$dir" ] || return 0
	if node_alive "$dir" && [ -r "$dir/env" ]; then
		# A clean stop first, so the node does not leave a half-written
		# database behind for anyone inspecting DIR after a failure.
		# With the pid file, `stop` returns only once the OS process is gone.
		ctl_prefix=(timeout "$stop_timeout")
		run_ctl "$dir" stop "$dir/rabbitmq.pid" >"$dir/log/stop.log" 2>&1 \
			|| svc_warn "rabbitmqctl stop failed; killing the node"
	fi
	if pids=$(node_pids "$dir"); then
		# shellcheck disable=SC2086 # one pid per word
		kill -KILL $pids 2>/dev/null || true
	fi
	if pid=$(epmd_pid "$dir"); then
		kill -TERM "$pid" 2>/dev/null || true
	fi
	svc_wait 10 node_gone "$dir" \
		|| svc_warn "processes of the node still exist after stop"
	return 0
}

[ $# -ge 2 ] || usage
case "$1" in
start)
	[ $# -eq 2 ] || usage
	cmd_start "$2"
	;;
ctl)
	[ $# -ge 3 ] || usage
	dir="$2"
	shift 2
	cmd_ctl "$dir" "$@"
	;;
stop)
	[ $# -eq 2 ] || usage
	cmd_stop "$2"
	;;
*) usage ;;
esac
