# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Helpers for the operations tests, sourced right after lib.sh: a relay
# with its HTTP server on a free loopback port, requests to it, metric
# values, and the CLI against the test's table.

: "${RELAY_TEST_SOURCE_ROOT:?run through meson test}"
# shellcheck source=../services/lib.sh
. "$RELAY_TEST_SOURCE_ROOT/tests/services/lib.sh"

# ops_relay NAME [VAR=value...]: it_relay with the stdout publisher and
# HTTP on a free port; returns once /healthz answers. Sets ops_port. A
# port taken between the probe and the bind (tests run in parallel) is
# retried with another one.
ops_relay() {
	local name="$1" try deadline
	shift
	for try in 1 2 3; do
		ops_port=$(svc_free_port)
		it_relay "$name" OUTBOX_PUBLISHER=stdout \
			OUTBOX_HTTP_ADDR="127.0.0.1:$ops_port" "$@"
		deadline=$((SECONDS + 30))
		while :; do
			if curl -s -m 2 -o /dev/null "http://127.0.0.1:$ops_port/healthz"; then
				return 0
			fi
			kill -0 "$it_last_pid" 2>/dev/null || break
			[ "$SECONDS" -lt "$deadline" ] ||
				it_fail "relay $name never answered on port $ops_port"
			sleep 0.1
		done
		grep -q "cannot listen" "$it_dir/$name.log" ||
			it_fail "relay $name exited at start (try $try)"
	done
	it_fail "relay $name found no free port"
}

# ops_get PATH [PORT]: GET on the relay's HTTP server; sets ops_code and
# ops_body (ops_code 000 when nothing answered).
ops_get() {
	local port="${2:-$ops_port}"
	ops_code=$(curl -s -m 5 -o "$it_dir/http.body" -w '%{http_code}' \
		"http://127.0.0.1:$port$1" || true)
	ops_body=$(cat "$it_dir/http.body" 2>/dev/null || true)
}

# ops_wait_code SECONDS PATH CODE: polls PATH until it answers CODE.
ops_wait_code() {
	local seconds="$1" path="$2" code="$3"
	local deadline=$((SECONDS + seconds))
	while :; do
		ops_get "$path"
		[ "$ops_code" = "$code" ] && return 0
		[ "$SECONDS" -lt "$deadline" ] ||
			it_fail "timed out after ${seconds}s: $path answers $ops_code ($ops_body), want $code"
		sleep 0.1
	done
}

# ops_metric NAME_WITH_LABELS: the value of one sample from /metrics.
ops_metric() {
	curl -s -m 5 "http://127.0.0.1:$ops_port/metrics" |
		awk -v n="$1" '$1 == n { print $2; found = 1 } END { if (!found) print "missing" }'
}

# ops_wait_metric SECONDS NAME AWK_CONDITION: polls until the sample's
# value v satisfies the condition, e.g. 'v >= 30'.
ops_wait_metric() {
	local seconds="$1" name="$2" cond="$3" v
	local deadline=$((SECONDS + seconds))
	while :; do
		v=$(ops_metric "$name")
		if [ "$v" != missing ] && awk -v v="$v" "BEGIN { exit !($cond) }"; then
			return 0
		fi
		[ "$SECONDS" -lt "$deadline" ] ||
			it_fail "timed out after ${seconds}s: $name is $v, want $cond"
		sleep 0.2
	done
}

# ops_cli ARGS...: runs the binary with ARGS against the test's table;
# stdout to cli.out, stderr to cli.err; sets ops_rc.
ops_cli() {
	ops_rc=0
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" \
		OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_LOG_FORMAT=json \
		"$RELAY_TEST_BIN" "$@" >"$it_dir/cli.out" 2>"$it_dir/cli.err" || ops_rc=$?
}

# ops_expect_usage_error ARGS...: the command must exit 2 with a usage
# line on stderr and print nothing on stdout.
ops_expect_usage_error() {
	ops_cli "$@"
	[ "$ops_rc" = 2 ] || it_fail "'$*' exited $ops_rc, want 2: $(cat "$it_dir/cli.err")"
	grep -q '^usage: outbox-relay' "$it_dir/cli.err" ||
		it_fail "'$*' printed no usage line: $(cat "$it_dir/cli.err")"
	[ ! -s "$it_dir/cli.out" ] || it_fail "'$*' wrote to stdout: $(cat "$it_dir/cli.out")"
}

# ops_wait_exit PID SECONDS: waits for a relay that was already signalled
# (it_stop would signal again, and a second signal means "exit at once");
# sets it_rc to its exit code.
ops_wait_exit() {
	local pid="$1" seconds="$2"
	local deadline=$((SECONDS + seconds))
	it_rc=0
	while ps -o stat= -p "$pid" | grep -qv Z; do
		[ "$SECONDS" -lt "$deadline" ] || it_fail "relay $pid did not exit within ${seconds}s"
		sleep 0.1
	done
	wait "$pid" || it_rc=$?
}

# ops_session_open NAME [URL]: a psql session (application_name NAME, of
# the test database or URL's) that runs what ops_session_send writes to it
# and stays idle in between. Tests hold
# locks with it instead of a long pg_sleep: an idle session holds no
# snapshot, so the CREATE INDEX CONCURRENTLY of other tests' migrations
# never waits for it, and its backend ends as soon as psql is killed.
ops_session_open() {
	local name="$1"
	mkfifo "$it_dir/$name.fifo"
	PGAPPNAME="$name" psql "${2:-$RELAY_TEST_DATABASE_URL}" -X -q -v ON_ERROR_STOP=1 \
		-f "$it_dir/$name.fifo" >"$it_dir/$name.psql" 2>&1 &
	it_pids+=("$!")
	exec {ops_session_fd}>"$it_dir/$name.fifo"
}

# ops_session_send SQL: runs SQL in the session opened last.
ops_session_send() {
	printf '%s\n' "$1" >&"$ops_session_fd"
}

# ops_registry: the registry table of the test's table.
ops_registry() {
	echo "${OUTBOX_TABLE}_replicas"
}

# ops_insert_and_time SECONDS OUT TYPE: inserts one event of TYPE and
# prints the seconds from its commit to its line in OUT (the stdout of a
# relay with the stdout publisher), waiting at most SECONDS.
ops_insert_and_time() {
	local before after n
	n=$(wc -l <"$2")
	before=$(date +%s.%N)
	it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) VALUES ('$3', '{}')"
	it_wait_lines "$1" "$2" $((n + 1))
	after=$(date +%s.%N)
	awk -v a="$after" -v b="$before" 'BEGIN { printf "%.3f\n", a - b }'
}
