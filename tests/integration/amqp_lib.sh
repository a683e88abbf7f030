# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Helpers for the AMQP end-to-end tests, sourced right after lib.sh: the
# broker URL, names private to the test, the test consumer and
# rabbitmqctl against the test node.

: "${RELAY_TEST_AMQP_URL:?run through tests/run.sh}"
: "${RELAY_TEST_AMQP_CONSUME:?run through meson test}"

# "amqp://host:port/" names the empty vhost, which the relay refuses;
# without the slash it is vhost "/".
amqp_url="${RELAY_TEST_AMQP_URL%/}"
# Exchanges and queues of this test: the node is shared.
# shellcheck disable=SC2034 # used by the tests that source this file
amqp_ns="${it_name}.$$"

# amqp_consume ARGS...: the test consumer (tests/services/amqp_consume.c).
amqp_consume() {
	"$RELAY_TEST_AMQP_CONSUME" --url "$amqp_url" "$@"
}

# amqp_ctl ARGS...: rabbitmqctl against the test node.
amqp_ctl() {
	: "${RELAY_TEST_RABBITMQ_DIR:?run through tests/run.sh}"
	bash "$RELAY_TEST_SOURCE_ROOT/tests/services/rabbitmq.sh" ctl \
		"$RELAY_TEST_RABBITMQ_DIR" "$@"
}

# amqp_relay NAME [VAR=value...]: it_relay with the AMQP publisher.
amqp_relay() {
	local name="$1"
	shift
	it_relay "$name" OUTBOX_PUBLISHER=amqp OUTBOX_AMQP_URL="$amqp_url" "$@"
}

# amqp_take QUEUE N FILE [IDLE]: consumes N messages from QUEUE into FILE
# (one JSON line each); fails the test when fewer come within IDLE
# seconds of silence (default 10).
amqp_take() {
	local queue="$1" n="$2" file="$3" idle="${4:-10}" rc=0
	amqp_consume --queue "$queue" --count "$n" --idle-timeout "$idle" \
		>"$file" 2>"$file.err" || rc=$?
	[ "$rc" = 0 ] || it_fail "consumed $(wc -l <"$file") of $n messages from $queue: $(cat "$file.err")"
}

# amqp_log_has NAME PATTERN: the relay log NAME.log has a line matching
# the extended regex PATTERN.
amqp_log_has() {
	grep -E -q -- "$2" "$it_dir/$1.log"
}
