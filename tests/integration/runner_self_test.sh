#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/run.sh cannot report success when nothing ran: each way a run can
# go wrong must turn it red, with the reason named and the summary line
# still last. The runner is driven against two small meson projects made
# here (one with four tests, one with none) through the seams its header
# documents, with the real `meson test` underneath; no service starts.
#
#   runner_self_test.sh [RUN_SH]   the runner to prove (default: the
#                                  tree's tests/run.sh)
set -euo pipefail

root="${RELAY_TEST_SOURCE_ROOT:?run through meson test}"
runner=${1:-$root/tests/run.sh}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The fixture: one test per kind of suite the runner treats apart;
# "chaos" is one of the runner's serial suites, run in an invocation of
# its own. maybe_fail runs alone (is_parallel false), after pass_a and
# pass_b, so that the order of the verdicts, which is the order the tests
# finish in, is known. serial_d depends on a target that fails to build under
# FIXTURE_UNBUILDABLE=1, which meson test reports by exiting 125.
mkdir -p "$work/src" "$work/empty" "$work/bin"
cat >"$work/src/meson.build" <<'MESON'
project('runner-fixture')
sh = find_program('sh')
test('pass_a', sh, suite : 'one',
  args : ['-c', 'echo "VERDICT pass_a: PASS n=1"'])
test('pass_b', sh, suite : 'two',
  args : ['-c', 'echo "not a VERDICT line"; echo "  VERDICT indented"'])
test('maybe_fail', sh, suite : 'two', is_parallel : false,
  args : ['-c', 'echo "VERDICT maybe_fail: PASS"; exit ${FIXTURE_FAIL:-0}'])
stamp = custom_target('stamp', output : 'stamp', build_by_default : false,
  build_always_stale : true,
  command : [sh, '-c', 'test -z "$FIXTURE_UNBUILDABLE" && touch "$0"', '@OUTPUT@'])
test('skip_e', sh, suite : 'three', args : ['-c', 'exit 77'])
test('inner_f', sh, suite : 'four', args : ['-c',
  'echo "[ RUN      ] case_x"; echo "[  SKIPPED ] case_x"; echo "[  PASSED  ] 0 test(s)."; echo "[  SKIPPED ] 1 test(s), listed below:"; echo "[  SKIPPED ] case_x"'])
test('serial_d', sh, suite : 'chaos', depends : stamp,
  args : ['-c', 'echo "VERDICT serial_d: PASS"'])
MESON
echo "project('runner-empty')" >"$work/empty/meson.build"
for p in src empty; do
	meson setup "$work/build-$p" "$work/$p" >"$work/setup.log" 2>&1 || {
		cat "$work/setup.log" >&2
		echo "FAIL: could not set the fixture project $p up" >&2
		exit 1
	}
done

# meson first on PATH for one case: the real one, but its invocation for
# suite chaos finds the fixture unbuildable, after the first invocation
# of the run built it and ran tests.
sed "s|@MESON@|$(command -v meson)|" >"$work/bin/meson" <<'WRAP'
#!/usr/bin/env bash
prev=
for a in "$@"; do
	[ "$prev $a" != "--suite chaos" ] || export FIXTURE_UNBUILDABLE=1
	prev=$a
done
exec @MESON@ "$@"
WRAP
chmod +x "$work/bin/meson"

fails=0
# check WHAT BUILD WANT_RC WANT_TAIL WANT_REASONS -- ARGS...: runs the
# runner on BUILD with ARGS; WANT_RC is 0 or "red"; WANT_TAIL, lines
# separated by "|", must be the last lines of the output; WANT_REASONS,
# separated by "|", must each appear as "tests/run.sh: FAIL: REASON" (and
# a run that must pass may print none).
check() {
	local what=$1 build=$2 want_rc=$3 want_tail=$4 want_reasons=$5 rc=0
	local n reason bad=0
	shift 6
	RELAY_TEST_RUNNER_BUILD=$build RELAY_TEST_RUNNER_NO_SERVICES=1 \
		bash "$runner" "$@" >"$work/out" 2>&1 || rc=$?
	if [ "$want_rc" = 0 ] && [ "$rc" -ne 0 ]; then
		echo "FAIL: $what: the runner exited $rc, want 0" >&2
		bad=1
	elif [ "$want_rc" = red ] && [ "$rc" -eq 0 ]; then
		echo "FAIL: $what: the runner exited 0, want non-zero" >&2
		bad=1
	fi
	n=$(tr '|' '\n' <<<"$want_tail" | wc -l)
	if [ "$(tail -n "$n" "$work/out")" != "$(tr '|' '\n' <<<"$want_tail")" ]; then
		echo "FAIL: $what: the output does not end with: $want_tail" >&2
		bad=1
	fi
	if [ -z "$want_reasons" ]; then
		if grep -q '^tests/run.sh: FAIL' "$work/out"; then
			echo "FAIL: $what: a passing run names a failure" >&2
			bad=1
		fi
	else
		while IFS= read -r reason; do
			grep -qxF "tests/run.sh: FAIL: $reason" "$work/out" || {
				echo "FAIL: $what: no reason \"$reason\"" >&2
				bad=1
			}
		done < <(tr '|' '\n' <<<"$want_reasons")
	fi
	if [ "$bad" -ne 0 ]; then
		echo "--- the runner's output (tests/run.sh $*):" >&2
		cat "$work/out" >&2
		fails=$((fails + 1))
	else
		echo "ok: $what"
	fi
}

b=$work/build-src
inner="inside tests that passed, 1 case(s) skipped: inner_f/case_x"
check "a case skipped inside a test that passed (cmocka's skip()): said once" \
	"$b" 0 "$inner|1 passed, 0 failed" "" -- inner_f
check "named tests that pass: green, their verdicts last but the summary" \
	"$b" 0 "VERDICT pass_a: PASS n=1|2 passed, 0 failed" "" -- pass_a pass_b
check "the whole run, serial suite apart: green, counted over invocations" \
	"$b" 0 "VERDICT pass_a: PASS n=1|VERDICT maybe_fail: PASS|VERDICT serial_d: PASS|$inner|1 skipped|5 passed, 0 failed" "" --
[ -f "$b/meson-logs/testlog-chaos.json" ] || {
	echo "FAIL: the serial suite chaos ran in no invocation of its own" >&2
	fails=$((fails + 1))
}
check "a name that matches nothing" "$b" red "0 passed, 0 failed" \
	"test name 'typo' matches no test" -- typo
check "a name that matches nothing beside one that runs" "$b" red \
	"VERDICT pass_a: PASS n=1|1 passed, 0 failed" \
	"test name 'typo' matches no test" -- pass_a typo
check "a suite that matches nothing beside one that runs" "$b" red \
	"1 passed, 0 failed" "suite 'typo' matches no test" -- --suite one --suite typo
check "no test ran" "$work/build-empty" red "0 passed, 0 failed" \
	"no test ran" --
check "nothing but skips" "$b" red "1 skipped|0 passed, 0 failed" \
	"no test ran: all 1 skipped" -- skip_e
FIXTURE_FAIL=1 check "a failing test" "$b" red "1 passed, 1 failed" \
	"meson test (maybe_fail pass_a) exited 1|1 test(s) failed: maybe_fail (FAIL)" \
	-- maybe_fail pass_a
# The chaos suite's log of the whole run above is still there: it must
# not be counted for the invocation that could not rebuild.
PATH="$work/bin:$PATH" check \
	"meson test could not rebuild, after an invocation that ran tests" "$b" red \
	"VERDICT pass_a: PASS n=1|VERDICT maybe_fail: PASS|$inner|1 skipped|4 passed, 0 failed" \
	"meson test (suite chaos) exited 125: it could not rebuild $b" --

if [ "$fails" -ne 0 ]; then
	echo "FAIL: $fails case(s) above: tests/run.sh can report what did not happen" >&2
	exit 1
fi
echo "ok: every failure path of tests/run.sh turns the run red"
