#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The ThreadSanitizer suite (docs/security.md): builds the relay and its
# tests with -fsanitize=thread in build-tsan/ of the source tree
# (TSAN_BUILD to change it), then
#   1. runs that tree's `unit` and `postgres` suites (every test in them,
#      whatever their names), and
#   2. drains events through the TSan relay with 2 workers of 3 lanes each,
#      the lanes sharing their worker's publisher: 3000 events through the
#      test backend `flaky` (acknowledged in shuffled order, 5 % nacked,
#      1 ms per event), with /metrics and /readyz read all along, then 1000
#      through the AMQP publisher to the RabbitMQ node tests/run.sh
#      started; each relay is stopped by SIGTERM.
# Any ThreadSanitizer report fails the run and is shown (halt_on_error,
# and the relays' reports go to files under log_path, which are read).
# tests/tsan/suppressions.txt only covers uninstrumented libraries.
# Needs the services of tests/run.sh: `tests/run.sh tsan`.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${TSAN_BUILD:-$root/build-tsan}
: "${RELAY_TEST_DATABASE_URL:?run through tests/run.sh (tests/run.sh tsan)}"
: "${RELAY_TEST_AMQP_URL:?run through tests/run.sh (tests/run.sh tsan)}"

mkdir -p "$build"
# One build at a time, as tests/fuzz/run.sh.
exec 9>"$build.lock"
flock 9
if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" "$root" -Db_sanitize=thread -Db_lundef=false \
		--buildtype=debugoptimized -Dwerror=true >"$build.setup.log" 2>&1 || {
		cat "$build.setup.log" >&2
		exit 1
	}
fi
ninja -C "$build" >"$build.ninja.log" 2>&1 || {
	tail -n 40 "$build.ninja.log" >&2
	exit 1
}
flock -u 9

# halt_on_error: the first report ends the program with exitcode, which
# fails its test even when the report's race did no visible harm.
tsan_options="halt_on_error=1 exitcode=66 second_deadlock_stack=1"
tsan_options+=" suppressions=$root/tests/tsan/suppressions.txt"

# 1. The unit tests, by suite: a test added to `unit` or `postgres` runs
# here too. The postgres ones use the database tests/run.sh started.
unit_log="$build.unit.log"
if ! TSAN_OPTIONS="$tsan_options" meson test -C "$build" --no-rebuild \
	--suite unit --suite postgres --print-errorlogs >"$unit_log" 2>&1; then
	grep -E '^ *[0-9]+/[0-9]+ ' "$unit_log" | grep -v ' OK ' >&2 || true
	# Which test and line failed, in cmocka's words: from meson's full
	# log, as --print-errorlogs shows only the last lines of a test's
	# output. The sed below shows the races.
	grep -E '^\[  (ERROR|FAILED) +\]|^ERROR: ' \
		"$build/meson-logs/testlog.txt" | head -n 40 >&2 || true
	sed -n '/Summary of Failures/,$p;/WARNING: ThreadSanitizer/,/^SUMMARY/p' \
		"$unit_log" | head -n 200 >&2
	echo "FAIL: the TSan build's unit and postgres tests (log: $unit_log)" >&2
	exit 1
fi
units=$(awk '/^Ok:/ { print $2 }' "$unit_log")
[ "${units:-0}" -gt 0 ] || {
	echo "FAIL: no unit test ran under TSan (log: $unit_log)" >&2
	exit 1
}

# 2. The drains, with the end-to-end helpers and the TSan binaries.
export RELAY_TEST_SOURCE_ROOT="$root"
export RELAY_TEST_BIN="$build/tests/outbox-relay-flaky"
export RELAY_TEST_AMQP_CONSUME="$build/tests/amqp_consume"
# shellcheck disable=SC1094 # its [ "$c" "$op" "$n" ] is beyond shellcheck
# shellcheck source-path=SCRIPTDIR source=../integration/lib.sh
. "$root/tests/integration/lib.sh"
# shellcheck source-path=SCRIPTDIR source=../integration/amqp_lib.sh
. "$root/tests/integration/amqp_lib.sh"
# shellcheck source-path=SCRIPTDIR source=../integration/ops_lib.sh
. "$root/tests/integration/ops_lib.sh"
it_table tsan

workers=2
lanes=3
lane_settings=("OUTBOX_WORKERS=$workers" "OUTBOX_WORKER_WINDOW=$lanes"
	OUTBOX_BATCH_SIZE=20 OUTBOX_POLL_INTERVAL=100ms
	OUTBOX_BACKOFF_BASE=100ms OUTBOX_BACKOFF_MAX=400ms)

# tsan_check NAME: fails when relay NAME wrote a ThreadSanitizer report
# (to its log_path files or to its stderr), showing the report.
tsan_check() {
	local f found=0
	for f in "$it_dir/tsan-$1".* "$it_dir/$1.log"; do
		[ -f "$f" ] || continue
		if grep -q "WARNING: ThreadSanitizer\|ThreadSanitizer:" "$f"; then
			found=1
			echo "--- ThreadSanitizer in $(basename "$f") ---" >&2
			head -n 120 "$f" >&2
		fi
	done
	[ "$found" = 0 ] || it_fail "relay $1: ThreadSanitizer reported"
}

# drain NAME TOTAL [VAR=value...]: starts the TSan relay with the lanes and
# HTTP, reads /metrics and /readyz until TOTAL rows are sent (at most 180
# s), stops it by SIGTERM and checks its exit code, that the 6 lanes all
# leased, and that TSan said nothing.
drain() {
	local name="$1" total="$2" deadline scrapes=0 sent holders
	shift 2
	ops_relay "$name" "${lane_settings[@]}" \
		TSAN_OPTIONS="$tsan_options log_path=$it_dir/tsan-$name" "$@"
	local pid=$it_last_pid
	deadline=$((SECONDS + 180))
	while :; do
		sent=$(it_count "status = 'sent'")
		[ "$sent" -lt "$total" ] || break
		[ "$SECONDS" -lt "$deadline" ] || {
			tsan_check "$name"
			it_fail "relay $name sent $sent of $total in 180 s"
		}
		kill -0 "$pid" 2>/dev/null || {
			tsan_check "$name"
			it_fail "relay $name exited during the drain"
		}
		ops_get /metrics
		[ "$ops_code" = 200 ] || it_fail "relay $name: /metrics answered $ops_code"
		ops_get /readyz
		scrapes=$((scrapes + 1))
		sleep 0.2
	done
	it_stop "$pid" 60 any
	tsan_check "$name"
	[ "$it_rc" = 0 ] || it_fail "relay $name exited $it_rc after SIGTERM"
	holders=$(it_psql "SELECT count(DISTINCT holder) FROM ${OUTBOX_TABLE}_claims
		WHERE split_part(holder, '/', 2) = '$pid'")
	[ "$holders" = $((workers * lanes)) ] ||
		it_fail "relay $name: $holders lanes leased, want $((workers * lanes))"
	[ "$scrapes" -gt 0 ] || it_fail "relay $name: /metrics never read"
}

# 2a. The flaky backend: shuffled acknowledgements, nacks, a delay.
flaky_total=3000
log="$it_dir/deliveries.jsonl"
it_psql "SELECT ${OUTBOX_TABLE%.*}.outbox_events_enqueue_json('tsan.flaky',
	jsonb_build_object('n', n), 'k' || (n % 50)) FROM generate_series(1, $flaky_total) n" >/dev/null
drain flaky "$flaky_total" OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" \
	RELAY_TEST_FLAKY_PERCENT=5 RELAY_TEST_FLAKY_SHUFFLE=1 RELAY_TEST_FLAKY_DELAY_MS=1
delivered=$(jq -r .id "$log" | sort -u | wc -l)
[ "$delivered" = "$flaky_total" ] ||
	it_fail "flaky: $delivered distinct events delivered, want $flaky_total"
it_psql "SELECT id FROM $OUTBOX_TABLE WHERE status = 'sent'" | sort >"$it_dir/sent.txt"
jq -r .id "$log" | sort -u >"$it_dir/delivered.txt"
[ "$(comm -23 "$it_dir/sent.txt" "$it_dir/delivered.txt" | wc -l)" = 0 ] ||
	it_fail "flaky: rows marked sent that were never delivered"
retried=$(it_count "attempts >= 2")
[ "$retried" -gt 0 ] || it_fail "flaky: no publish was nacked"

# 2b. The AMQP publisher (confirms, a connection shared by the lanes), in
# the relay itself.
RELAY_TEST_BIN="$build/outbox-relay"
amqp_total=1000
it_psql "DELETE FROM $OUTBOX_TABLE" >/dev/null
x="$amqp_ns.x"
q="$amqp_ns.q"
amqp_consume --declare-exchange "$x" --queue "$q" --bind "$x:#" ||
	it_fail "cannot set up exchange $x and queue $q"
it_psql "SELECT ${OUTBOX_TABLE%.*}.outbox_events_enqueue_json('tsan.amqp',
	jsonb_build_object('n', n), 'k' || (n % 50), NULL, 'tsan.' || (n % 7))
	FROM generate_series(1, $amqp_total) n" >/dev/null
drain amqp "$amqp_total" OUTBOX_PUBLISHER=amqp OUTBOX_AMQP_URL="$amqp_url" \
	OUTBOX_AMQP_EXCHANGE="$x"
amqp_take "$q" "$amqp_total" "$it_dir/amqp.jsonl"
jq -r .properties.message_id "$it_dir/amqp.jsonl" | sort -u >"$it_dir/got.ids"
it_psql "SELECT id FROM $OUTBOX_TABLE" | sort >"$it_dir/table.ids"
diff -q "$it_dir/got.ids" "$it_dir/table.ids" >/dev/null ||
	it_fail "amqp: the consumed ids differ from the table's"

# One line for tests/run.sh's closing verdicts (a failure exits above,
# through it_fail, and meson reports the test failed).
echo "VERDICT tsan: PASS units=$units drained=$flaky_total+$amqp_total" \
	"workers=$workers lanes=$lanes reports=0"
