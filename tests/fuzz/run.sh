#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The libFuzzer targets (docs/security.md): builds them with clang, ASan
# and UBSan in build-fuzz/ of the source tree (FUZZ_BUILD to change it),
# then runs each for SECONDS from a copy of its seed corpus in
# tests/fuzz/corpus/<target>/ (the corpus in the repository is never
# written). A crash, leak, timeout or sanitizer report fails the run; the
# input that caused it is kept under build-fuzz/crashes/. Prints per
# target one line "VERDICT TARGET: PASS|FAIL ..." (gathered by
# tests/run.sh): the executions, the coverage reached (libFuzzer's cov:
# and ft:) and the corpus size.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]  every target (or those named),
#                                            SECONDS each (default 30)
#   tests/fuzz/run.sh --test TARGET          one target for 30 s (meson test)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${FUZZ_BUILD:-$root/build-fuzz}
all=(fuzz_settings fuzz_encode fuzz_headers fuzz_amqp_reply)

seconds=30
if [ "${1:-}" = "--test" ]; then
	targets=("${2:?usage: run.sh --test TARGET}")
else
	if [[ "${1:-}" =~ ^[0-9]+$ ]]; then
		seconds=$1
		shift
	fi
	targets=("$@")
	[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
fi
for t in "${targets[@]}"; do
	[[ " ${all[*]} " == *" $t "* ]] || {
		echo "run.sh: unknown target $t (one of: ${all[*]})" >&2
		exit 2
	}
done

cc=${FUZZ_CC:-clang-14}
command -v "$cc" >/dev/null || {
	echo "run.sh: $cc not found (deploy/install-deps.sh --only fuzz)" >&2
	exit 1
}
mkdir -p "$build"
# One build at a time (meson test may start this for several targets).
exec 9>"$build.lock"
flock 9
if [ ! -f "$build/build.ninja" ]; then
	CC=$cc meson setup "$build" "$root" -Dfuzzers=true \
		-Db_sanitize=address,undefined -Db_lundef=false \
		--buildtype=debugoptimized -Dwerror=true >"$build.setup.log" 2>&1 || {
		cat "$build.setup.log" >&2
		exit 1
	}
fi
ninja -C "$build" "${targets[@]/#/tests/fuzz/}" >"$build.ninja.log" 2>&1 || {
	tail -n 40 "$build.ninja.log" >&2
	exit 1
}
flock -u 9

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=0
for t in "${targets[@]}"; do
	mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
	cp "$root/tests/fuzz/corpus/$t/"* "$work/$t/corpus/"
	seeds=$(find "$work/$t/corpus" -type f | wc -l)
	rc=0
	# -timeout: one input taking 10 s is a hang; -rss_limit_mb bounds
	# memory; the total time bounds the run.
	ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
		"$build/tests/fuzz/$t" -max_total_time="$seconds" -timeout=10 \
		-rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$work/$t/artifacts/" "$work/$t/corpus" \
		>"$work/$t.log" 2>&1 || rc=$?
	done_line=$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$work/$t.log" | tail -n 1 || true)
	execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$work/$t.log")
	cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$done_line")
	ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$done_line")
	corp=$(sed -nE 's/.* corp: ([0-9]+).*/\1/p' <<<"$done_line")
	rate=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+).*/\1/p' "$work/$t.log")
	if [ "$rc" -ne 0 ] || [ -z "$execs" ]; then
		failed=$((failed + 1))
		mkdir -p "$build/crashes"
		cp "$work/$t/artifacts/"* "$build/crashes/" 2>/dev/null || true
		echo "FAIL: $t (exit $rc); inputs kept in $build/crashes/" >&2
		grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$work/$t.log" | head -n 20 >&2 || true
		tail -n 30 "$work/$t.log" >&2
		echo "VERDICT $t: FAIL exit $rc, ${execs:-no} executions"
		continue
	fi
	echo "VERDICT $t: PASS ${seconds}s, ${execs} executions (${rate}/s), cov ${cov} ft ${ft}, corpus ${seeds} seeds -> ${corp}"
done
[ "$failed" -eq 0 ]
