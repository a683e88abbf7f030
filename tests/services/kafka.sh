#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Throwaway Kafka for tests: runs kafka_mock_broker (librdkafka's mock
# cluster, loopback only) in the background with a fault-injection FIFO.
#
# Usage: kafka.sh start DIR BINARY [BROKER-OPTIONS...]
#                                   start; prints the bootstrap list
#        kafka.sh ctl DIR COMMAND...   send one fault command and wait for
#                                      the broker to apply it (exit 1 if it
#                                      refused; see kafka_mock_broker --help)
#        kafka.sh stop DIR             stop; succeeds if already stopped
#
# DIR comes from `mktemp -d`. After start, DIR/env holds KEY=value lines:
# RELAY_TEST_KAFKA_BROKERS and KAFKA_CONTROL (the FIFO; tests may also
# write command lines to it directly, without waiting for them).
set -euo pipefail

# shellcheck disable=SC2034 # read by lib.sh
svc_name=kafka.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly start_timeout=15
readonly ctl_timeout=10
readonly stop_timeout=10

usage() {
	sed -n '6,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

# Pid of the broker started in DIR, if it still runs. The FIFO path in its
# command line tells it apart from a process that reused the pid.
broker_pid() {
	local dir="$1" pid
	pid=$(cat "$dir/broker.pid" 2>/dev/null) || return 1
	case "$pid" in
	'' | *[!0-9]*) return 1 ;;
	esac
	tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "--control $dir/control " \
		|| return 1
	printf '%s\n' "$pid"
}

broker_gone() {
	! broker_pid "$1" >/dev/null
}

# Succeeds once the BOOTSTRAP line is out; 99 (give up) if the broker died.
# Liveness here is the started pid itself, not broker_pid: until the
# background shell has exec'd the broker, its command line is still this
# script's, and on a loaded machine the first look can come before that.
bootstrap_ready() {
	local dir="$1" pid
	grep -q '^BOOTSTRAP=' "$dir/broker.out" 2>/dev/null && return 0
	pid=$(cat "$dir/broker.pid" 2>/dev/null) || return 99
	# A broker that exited stays a zombie child of this script.
	case "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" in
	'' | Z) return 99 ;;
	esac
	return 1
}

cmd_start() {
	local dir="$1" binary="$2" bootstrap rc
	shift 2

	svc_check_dir "$dir"
	[ ! -e "$dir/env" ] || svc_die "'$dir' was already used; use a fresh directory"
	[ -x "$binary" ] || svc_die "broker program not found or not executable: '$binary'"
	case "$binary" in
	/*) ;;
	*) binary="$PWD/$binary" ;;
	esac

	# shellcheck disable=SC2317 # called by svc_fail
	svc_on_fail() { cmd_stop "$dir"; }

	"$binary" --control "$dir/control" "$@" </dev/null \
		>"$dir/broker.out" 2>"$dir/broker.log" &
	echo "$!" >"$dir/broker.pid"

	rc=0
	svc_wait "$start_timeout" bootstrap_ready "$dir" || rc=$?
	case "$rc" in
	0) ;;
	99) svc_fail "broker exited during start" "$dir/broker.log" "$dir/broker.out" ;;
	*) svc_fail "no BOOTSTRAP line after ${start_timeout}s" "$dir/broker.log" "$dir/broker.out" ;;
	esac
	bootstrap=$(sed -n 's/^BOOTSTRAP=//p' "$dir/broker.out" | head -n 1)
	case "$bootstrap" in
	127.0.0.1:[0-9]*) ;;
	*) svc_fail "unexpected bootstrap list '$bootstrap'" "$dir/broker.out" ;;
	esac

	{
		echo "RELAY_TEST_KAFKA_BROKERS=$bootstrap"
		echo "KAFKA_CONTROL=$dir/control"
	} >"$dir/env"
	echo "RELAY_TEST_KAFKA_BROKERS=$bootstrap"
}

# Number of commands the broker has answered so far.
acks_count() {
	grep -c -E '^(ok|error) [0-9]+: ' "$1/broker.out" 2>/dev/null || true
}

# ack_find DIR SKIP COMMAND: prints the first answer to COMMAND after the
# first SKIP answers; fails if there is none yet.
ack_find() {
	awk -v skip="$2" -v cmd="$3" '
		/^(ok|error) [0-9]+: / {
			if (++n <= skip)
				next
			text = $0
			sub(/^[a-z]+ [0-9]+: /, "", text)
			if (text == cmd || index(text, cmd ": ") == 1) {
				print
				found = 1
				exit
			}
		}
		END { exit !found }
	' "$1/broker.out"
}

# The answer is found by the echoed command, so other writers to the FIFO
# at the same time do not confuse it (the same command sent twice at once
# may get the other's answer, which says the same).
cmd_ctl() {
	local dir="$1" before answer
	shift
	svc_check_dir "$dir"
	broker_pid "$dir" >/dev/null || svc_die "no broker running in '$dir'"
	case "$*" in
	*$'\n'*) svc_die "a command must be one line" ;;
	esac
	before=$(acks_count "$dir")
	# The broker holds the FIFO open for reading, so this cannot block; the
	# timeout only guards against it vanishing in between.
	# shellcheck disable=SC2016 # expanded by the inner shell
	timeout "$ctl_timeout" bash -c 'printf "%s\n" "$1" >"$2"' _ "$*" "$dir/control" \
		|| svc_die "cannot write to '$dir/control'"
	svc_wait "$ctl_timeout" ack_find "$dir" "$before" "$*" \
		|| svc_fail "broker did not answer '$*' within ${ctl_timeout}s" "$dir/broker.log"
	answer=$(ack_find "$dir" "$before" "$*")
	case "$answer" in
	ok*) return 0 ;;
	*)
		printf '%s\n' "$answer" >&2
		return 1
		;;
	esac
}

# Never fails: test cleanup calls it from traps, possibly twice, possibly
# after a failed start.
cmd_stop() {
	local dir="$1" pid
	[ -d "$dir" ] || return 0
	pid=$(broker_pid "$dir") || return 0
	kill -TERM "$pid" 2>/dev/null || true
	if ! svc_wait "$stop_timeout" broker_gone "$dir"; then
		svc_warn "broker $pid ignored SIGTERM for ${stop_timeout}s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	return 0
}

[ $# -ge 2 ] || usage
case "$1" in
start)
	[ $# -ge 3 ] || usage
	dir="$2"
	binary="$3"
	shift 3
	cmd_start "$dir" "$binary" "$@"
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
