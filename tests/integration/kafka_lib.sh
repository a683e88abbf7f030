# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Helpers for the Kafka end-to-end tests, sourced right after lib.sh: the
# test broker (tests/services/kafka.sh, shared by all tests: every test
# uses topics of its own), its fault commands, the relay with the Kafka
# publisher, and kcat to read topics back.

: "${RELAY_TEST_KAFKA_BROKERS:?run through tests/run.sh}"
: "${RELAY_TEST_KAFKA_DIR:?run through tests/run.sh}"

kafka_brokers="$RELAY_TEST_KAFKA_BROKERS"
# Topic names of this test ([A-Za-z0-9._-]): the broker is shared.
# shellcheck disable=SC2034 # used by the tests that source this file
kafka_ns="${it_name}.$$"

# kafka_ctl COMMAND...: a command to the test broker (see
# kafka_mock_broker --help), waiting until it is applied.
kafka_ctl() {
	bash "$RELAY_TEST_SOURCE_ROOT/tests/services/kafka.sh" ctl \
		"$RELAY_TEST_KAFKA_DIR" "$@"
}

# kafka_topic NAME PARTITIONS: creates a topic on the test broker.
kafka_topic() {
	kafka_ctl create_topic "$1" "$2" >"$it_dir/create_topic.out" 2>&1 ||
		it_fail "cannot create topic $1: $(cat "$it_dir/create_topic.out")"
}

# kafka_relay NAME [VAR=value...]: it_relay with the Kafka publisher.
kafka_relay() {
	local name="$1"
	shift
	it_relay "$name" OUTBOX_PUBLISHER=kafka OUTBOX_KAFKA_BROKERS="$kafka_brokers" "$@"
}

# kafka_take TOPIC N FILE [FORMAT]: reads TOPIC from the beginning to its
# end into FILE, one line per record in kcat's FORMAT (default: partition,
# key, headers, value, tab-separated); fails the test unless it holds N
# records. Records of one partition come in offset order.
kafka_take() {
	local topic="$1" n="$2" file="$3" format="${4:-%p\t%k\t%h\t%s\n}" rc=0 got
	timeout 60 kcat -C -q -b "$kafka_brokers" -t "$topic" -o beginning -e \
		-f "$format" >"$file" 2>"$file.err" || rc=$?
	[ "$rc" = 0 ] || it_fail "kcat failed reading $topic (exit $rc): $(head -c 2000 "$file.err")"
	got=$(wc -l <"$file")
	[ "$got" = "$n" ] || it_fail "read $got records from $topic, want $n"
}

# kafka_log_has NAME PATTERN: the relay log NAME.log has a line matching
# the extended regex PATTERN.
kafka_log_has() {
	grep -E -q -- "$2" "$it_dir/$1.log"
}
