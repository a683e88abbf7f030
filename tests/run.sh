#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The whole test suite on a fresh Debian machine: installs what it needs,
# builds with ASan+UBSan, starts a throwaway PostgreSQL, RabbitMQ node and
# Kafka test broker on loopback (and builds a later PgBouncer than the
# machine's, tests/services/pgbouncer_build.sh), runs `meson test`, stops
# everything and prints, last, one summary line "N passed, N failed"
# counted from the results meson logged for the tests that ran. Just above
# it: the harness verdict lines ("VERDICT <test>: ...") the tests printed.
#
# Exits non-zero, naming the reason on stderr, when a test failed, when a
# `meson test` invocation exited non-zero for any reason (125: it could
# not rebuild), when a test name or suite asked for matched no test, or
# when no test ran at all. tests/integration/runner_self_test.sh proves
# each of these turns the run red.
#
# Usage: tests/run.sh [meson test arguments, e.g. a test name]
#
# For that self-test only (everything else runs the real path):
#   RELAY_TEST_RUNNER_BUILD        the build directory (default: build-test)
#   RELAY_TEST_RUNNER_NO_SERVICES  1: install nothing, start no service
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${RELAY_TEST_RUNNER_BUILD:-$root/build-test}
services=1
[ "${RELAY_TEST_RUNNER_NO_SERVICES:-}" = 1 ] && services=0

fail() {
	echo "tests/run.sh: FAIL: $*" >&2
}

[ "$services" -eq 0 ] || "$root/deploy/install-deps.sh"

if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" "$root" -Db_sanitize=address,undefined \
		-Db_lundef=false -Dwerror=true --buildtype=debugoptimized >/dev/null
fi
ninja -C "$build" >/dev/null || {
	fail "the build in $build failed"
	exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-tests.XXXXXX")
chmod 755 "$work"
# Printed last whatever happens: a run that stops early ran nothing.
summary="0 passed, 0 failed"
skipped_line=""
cleanup() {
	# The start scripts first: a service one of them was still starting
	# would outlive the stop below (RabbitMQ and Kafka are not the
	# runner's children).
	wait 2>/dev/null || true
	if [ "$services" -eq 1 ]; then
		{
			bash "$root/tests/services/kafka.sh" stop "$work/kafka" || true
			bash "$root/tests/services/rabbitmq.sh" stop "$work/rabbitmq" || true
			bash "$root/tests/services/postgres.sh" stop "$work/pg" || true
		} >/dev/null 2>&1
	fi
	wait 2>/dev/null || true
	rm -rf "$work"
	# Last, so nothing the services print on their way out follows it;
	# the summary keeps its form, skips said on the line above it.
	[ -z "$skipped_line" ] || echo "$skipped_line"
	echo "$summary"
}
trap cleanup EXIT

if [ "$services" -eq 1 ]; then
	mkdir -p "$work/pg" "$work/rabbitmq" "$work/kafka" "$work/pgbouncer-later"
	# The services start in parallel; RabbitMQ takes the longest (about 8 s).
	# Beside them a later PgBouncer than Debian 12's is built from a later
	# Debian release's source, fetched with apt as the packages are, for
	# tests/integration/pgbouncer_keeps_statements.sh (about 15 s).
	bash "$root/tests/services/pgbouncer_build.sh" "$work/pgbouncer-later" \
		>"$work/pgbouncer-later.out" 2>&1 &
	later_pid=$!
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
	for svc in pg:$pg_pid rabbitmq:$rabbit_pid kafka:$kafka_pid pgbouncer-later:$later_pid; do
		if ! wait "${svc#*:}"; then
			cat "$work/${svc%%:*}.out" >&2
			fail "could not start ${svc%%:*}"
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
	RELAY_TEST_PGBOUNCER_LATER=$(tail -n 1 "$work/pgbouncer-later.out")
	export RELAY_TEST_PGBOUNCER_LATER
fi

# Suites that disturb a shared service (restarting Postgres, stopping the
# broker), and the fuzzers (each takes a core for 30 s), run alone, after
# the parallel ones.
serial_suites=(pgrestart partition amqpfault kafkafault chaos bench fuzz tsan guards)
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

# The test names and suites asked for, each of which must match a test
# that ran: meson runs what matches and says nothing of a name that
# matched nothing ("No suitable tests defined." only when none did).
names=()
suites=()
args=("$@")
i=0
while [ "$i" -lt ${#args[@]} ]; do
	a=${args[$i]}
	case "$a" in
	--)
		names+=("${args[@]:i+1}")
		break
		;;
	--suite)
		i=$((i + 1))
		suites+=("${args[$i]:-}")
		;;
	--suite=*)
		suites+=("${a#--suite=}")
		;;
	# meson test's options that take their value as the next word
	--maxfail | --repeat | --gdb-path | --wrapper | -C | --no-suite | \
		--logbase | --num-processes | -t | --timeout-multiplier | \
		--setup | --test-args)
		i=$((i + 1))
		;;
	-*) ;;
	*)
		names+=("$a")
		;;
	esac
	i=$((i + 1))
done

# run_meson WHAT LOGBASE ARGS...: one `meson test` invocation, run as is
# (no pipe, so its exit status is its own). Each invocation logs to a
# JSON file of its own name, removed first so that an invocation that
# runs nothing never leaves the last run's results to be counted.
logs=()
reasons=()
run_meson() {
	local what=$1 base=$2 rc=0
	shift 2
	rm -f "$build/meson-logs/$base.json"
	meson test -C "$build" --print-errorlogs --logbase "$base" "$@" || rc=$?
	case "$rc" in
	0) ;;
	125) reasons+=("meson test ($what) exited 125: it could not rebuild $build") ;;
	*) reasons+=("meson test ($what) exited $rc") ;;
	esac
	# meson writes no log when it selected no test.
	[ ! -f "$build/meson-logs/$base.json" ] || logs+=("$build/meson-logs/$base.json")
}

if [ $# -eq 0 ]; then
	run_meson "all but the serial suites" testlog --num-processes "$jobs" "${exclude[@]}"
	for s in "${serial_suites[@]}"; do
		run_meson "suite $s" "testlog-$s" --num-processes 1 --suite "$s"
	done
else
	run_meson "$*" testlog --num-processes "$jobs" "$@"
fi

# The results of every test that ran, from meson's JSON logs, one line
# each: "count PASSED FAILED SKIPPED", "failed NAME", "unmatched name|suite
# X", "verdict LINE", "inner NAME/CASE" (a cmocka case skipped inside a
# binary that passed: meson sees the binary's exit code only).
python3 - "${#names[@]}" "${names[@]}" "${suites[@]}" -- "${logs[@]}" \
	>"$work/results" <<'PY' || {
import json, sys

argv = sys.argv[1:]
n_names = int(argv[0])
names = argv[1:1 + n_names]
rest = argv[1 + n_names:]
split = rest.index("--")
suites, logs = rest[:split], rest[split + 1:]

PASSED = {"OK", "EXPECTEDFAIL"}
SKIPPED = {"SKIP"}
passed = failed = skipped = 0
ran = []  # (project, test name, suites)
for path in logs:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            t = json.loads(line)
            # "project:suite1+suite2 / name", or just "name" when the
            # project has one suite
            full = t["name"]
            project, tsuites, name = "", [], full
            if " / " in full:
                prefix, name = full.split(" / ", 1)
                project, _, s = prefix.partition(":")
                tsuites = s.split("+") if s else []
            ran.append((project, name, tsuites))
            res = t.get("result", "")
            if res in PASSED:
                passed += 1
            elif res in SKIPPED:
                skipped += 1
            else:
                failed += 1
                print("failed %s (%s)" % (name, res))
            inner = []
            for out in (t.get("stdout") or "", t.get("stderr") or ""):
                for l in out.splitlines():
                    if l.startswith("VERDICT "):
                        print("verdict " + l)
                    case = l[len("[  SKIPPED ] "):].strip() \
                        if l.startswith("[  SKIPPED ] ") else ""
                    if case and not case[0].isdigit() and \
                            case not in inner:
                        inner.append(case)
            if res in PASSED:
                for case in inner:
                    print("inner %s/%s" % (name, case))

def matches(want, project, value):
    # as meson reads a name: "project:name", "project:" or "name"
    p, colon, v = want.partition(":")
    if not colon:
        p, v = "", want
    return (not p or not project or p == project) and \
        (not v or v == value)

for want in names:
    if not any(matches(want, p, n) for p, n, _ in ran):
        print("unmatched name " + want)
for want in suites:
    if not any(matches(want, p, s) for p, _, ss in ran for s in ss) and \
            not any(not ss for _, _, ss in ran):
        print("unmatched suite " + want)
print("count %d %d %d" % (passed, failed, skipped))
PY
	fail "could not read meson's test logs (${logs[*]})"
	exit 1
}

verdicts=()
inner=()
failed_names=()
passed=0 failed=0 skipped=0
while IFS= read -r line; do
	case "$line" in
	"count "*) read -r _ passed failed skipped <<<"$line" ;;
	"failed "*) failed_names+=("${line#failed }") ;;
	"unmatched name "*) reasons+=("test name '${line#unmatched name }' matches no test") ;;
	"unmatched suite "*) reasons+=("suite '${line#unmatched suite }' matches no test") ;;
	"verdict "*) verdicts+=("${line#verdict }") ;;
	"inner "*) inner+=("${line#inner }") ;;
	esac
done <"$work/results"
if [ "$failed" -ne 0 ]; then
	reasons+=("$failed test(s) failed: ${failed_names[*]}")
fi
# A run of skips proves nothing either.
if [ $((passed + failed)) -eq 0 ] && [ "$skipped" -eq 0 ]; then
	reasons+=("no test ran")
elif [ $((passed + failed)) -eq 0 ]; then
	reasons+=("no test ran: all $skipped skipped")
fi

summary="$passed passed, $failed failed"
[ "$skipped" -eq 0 ] || skipped_line="$skipped skipped"
for r in "${reasons[@]}"; do
	fail "$r"
done
# Just above the summary line, which the exit trap prints.
for v in "${verdicts[@]}"; do
	echo "$v"
done
# Counted among the passed with their binary: said, so a case that
# skipped for want of its condition is seen.
[ ${#inner[@]} -eq 0 ] ||
	echo "inside tests that passed, ${#inner[@]} case(s) skipped: ${inner[*]}"
[ ${#reasons[@]} -eq 0 ] || exit 1
