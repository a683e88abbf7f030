#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The whole test suite on a fresh Debian machine: installs what it needs,
# builds with ASan+UBSan, starts a throwaway PostgreSQL, RabbitMQ node and
# Kafka test broker on loopback, runs `meson test`, stops everything and
# prints one summary line "N passed, N failed" from meson's own totals.
# Exits non-zero on any failure.
#
# Usage: tests/run.sh [meson test arguments, e.g. a test name]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-test"

"$root/deploy/install-deps.sh"

if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" "$root" -Db_sanitize=address,undefined \
		-Db_lundef=false -Dwerror=true --buildtype=debugoptimized >/dev/null
fi
ninja -C "$build" >/dev/null

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-tests.XXXXXX")
chmod 755 "$work"
summary=""
cleanup() {
	{
		bash "$root/tests/services/kafka.sh" stop "$work/kafka" || true
		bash "$root/tests/services/rabbitmq.sh" stop "$work/rabbitmq" || true
		bash "$root/tests/services/postgres.sh" stop "$work/pg" || true
	} >/dev/null 2>&1
	wait 2>/dev/null || true
	rm -rf "$work"
	# Last, so nothing the services print on their way out follows it.
	[ -z "$summary" ] || echo "$summary"
}
trap cleanup EXIT

mkdir -p "$work/pg" "$work/rabbitmq" "$work/kafka"
# The three start in parallel; RabbitMQ takes the longest (about 8 s).
bash "$root/tests/services/postgres.sh" start "$work/pg" >"$work/pg.out" 2>&1 &
pg_pid=$!
bash "$root/tests/services/rabbitmq.sh" start "$work/rabbitmq" >"$work/rabbitmq.out" 2>&1 &
rabbit_pid=$!
# --honor-auto-create-flag: a client's allow.auto.create.topics=false
# works, as on a real cluster (tests/integration/kafka_destination.sh).
bash "$root/tests/services/kafka.sh" start "$work/kafka" \
	"$build/tests/kafka_mock_broker" --honor-auto-create-flag \
	>"$work/kafka.out" 2>&1 &
kafka_pid=$!
for svc in pg:$pg_pid rabbitmq:$rabbit_pid kafka:$kafka_pid; do
	if ! wait "${svc#*:}"; then
		cat "$work/${svc%%:*}.out" >&2
		echo "tests/run.sh: could not start ${svc%%:*}" >&2
		exit 1
	fi
done

set -a
# shellcheck disable=SC1091
. "$work/pg/env"
# shellcheck disable=SC1091
. "$work/rabbitmq/env"
# shellcheck disable=SC1091
. "$work/kafka/env"
set +a
export RELAY_TEST_PG_DIR="$work/pg"
export RELAY_TEST_RABBITMQ_DIR="$work/rabbitmq"
export RELAY_TEST_KAFKA_DIR="$work/kafka"

# Suites that disturb a shared service (restarting Postgres, stopping the
# broker), and the fuzzers (each takes a core for 30 s), run alone, after
# the parallel ones.
serial_suites=(pgrestart partition amqpfault kafkafault chaos bench fuzz tsan)
# Named tests run as asked, serial suites included (one at a time then).
exclude=()
jobs=2
if [ $# -eq 0 ]; then
	for s in "${serial_suites[@]}"; do
		exclude+=(--no-suite "$s")
	done
else
	jobs=1
fi

log="$work/meson-test.log"
status=0
{
	meson test -C "$build" --print-errorlogs --num-processes "$jobs" \
		"${exclude[@]}" "$@" || status=$?
	if [ $# -eq 0 ]; then
		for s in "${serial_suites[@]}"; do
			meson test -C "$build" --print-errorlogs --num-processes 1 \
				--suite "$s" || status=$?
		done
	fi
} 2>&1 | tee "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

# meson prints its totals as "Ok: N", "Fail: N", ... once per run; sum
# them over the runs above.
total() {
	awk -v key="$1" 'index($0, key ":") == 1 { n += $NF } END { print n + 0 }' "$log"
}
passed=$(($(total Ok) + $(total "Expected Fail")))
failed=$(($(total Fail) + $(total "Unexpected Pass") + $(total Timeout)))
skipped=$(total Skipped)
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
	failed=1
fi
summary="$passed passed, $failed failed"
[ "$skipped" -eq 0 ] || summary="$summary, $skipped skipped"
[ "$failed" -eq 0 ]
