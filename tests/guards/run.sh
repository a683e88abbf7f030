#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The guards of the lock lease, proven in the C (docs/design.md §4, "The
# guards, proven in the C"): for each guard of src/store/guards.h, builds
# the store's tests in build-guards/ of the source tree (GUARDS_BUILD to
# change it) with that guard removed (-DOUTBOX_WITHOUT_<NAME>) and requires
# the store test named for it to fail. First, the same tests must pass with
# every guard in place, so a failure below is the guard's, not the
# machine's. tests/model does the same for the Promela model.
#
# Needs the Postgres of tests/run.sh (RELAY_TEST_DATABASE_URL and the rest
# of tests/lib/pgtest.c's variables). Prints one line per guard and a
# closing "VERDICT guards: ..." line; exits non-zero when a guard's test
# still passes without it, or the build fails.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${GUARDS_BUILD:-$root/build-guards}

# guard : the store tests (tests/unit/test_store.c) that must fail
# without it, comma-separated
guards=(
	"G1:test_renew_sweep_suspect"
	"G2:test_concurrent_lease_each_row_once"
	"G3:test_retry_backoff_permanent"
	"G4:test_lock_lease_fencing,test_settings_per_transaction"
	"F1:test_own_dead_claim_settled"
	"LIVE:test_late_claim_gives_lease_up"
	"FENCE:test_lock_lease_fencing"
)

# build [DEFINE]: the store's tests, with DEFINE (or nothing) as c_args.
build_with() {
	local args=${1:+-D$1}
	if [ ! -f "$build/build.ninja" ]; then
		# Unoptimized and without sanitizers: each guard is a rebuild
		# of the core library, and only the tests' verdicts matter.
		meson setup "$build" "$root" --buildtype=debug \
			-Db_sanitize=none -Dwerror=true -Dc_args="$args" >/dev/null
	else
		meson configure "$build" -Dc_args="$args" >/dev/null
	fi
	ninja -C "$build" tests/test_store >/dev/null
}

# run_test NAME: 0 when the store test NAME passed.
run_test() {
	RELAY_TEST_FILTER="$1" "$build/tests/test_store" >"$build/guard-test.log" 2>&1
}

# failed_on_assertion NAME: whether the last run of NAME failed one of
# the test's own checks (cmocka's failure of the case at a line of the
# test file), not by a crash, a lost server, a helper of pgtest.c that
# could not set the test up, or a store call that failed (the test's
# fail_msg("lease: %s", ...) and its kin, as the G2 mutant's leases did
# when they had no transaction id), which would count any breakage as
# the guard's.
failed_on_assertion() {
	local log=$build/guard-test.log
	grep -qF "[  FAILED  ] $1" "$log" &&
		grep -qE '\[   LINE   \] --- .*tests/unit/test_store\.c:[0-9]+: error: Failure!' "$log" &&
		! grep -qE '^ERROR: (leaser [0-9]+: )?(lease|first lease|lease as 005|mark|commit|abort|sweep|tend|store_open|gauges|migrate[a-z ]*): ' "$log" &&
		! grep -qE 'could not connect|server closed the connection|AddressSanitizer|runtime error: ' "$log"
}

all_tests=$(printf '%s\n' "${guards[@]}" | cut -d: -f2 | tr , '\n' | sort -u)

build_with ""
for t in $all_tests; do
	if ! run_test "$t"; then
		cat "$build/guard-test.log" >&2
		echo "guards: $t fails with every guard in place" >&2
		exit 1
	fi
done

caught=0 missed=()
for g in "${guards[@]}"; do
	name=${g%%:*}
	tests=${g#*:}
	build_with "OUTBOX_WITHOUT_$name"
	failed=()
	for t in ${tests//,/ }; do
		if ! run_test "$t"; then
			if failed_on_assertion "$t"; then
				failed+=("$t")
			else
				echo "guard $name removed: $t failed, but not on one of its checks:" >&2
				tail -n 20 "$build/guard-test.log" >&2
			fi
		fi
	done
	expected=$(tr ',' '\n' <<<"$tests" | wc -l)
	if [ ${#failed[@]} -eq "$expected" ]; then
		caught=$((caught + 1))
		echo "guard $name removed: caught by ${failed[*]}"
	else
		missed+=("$name")
		echo "guard $name removed: NOT caught (passed: $tests, failed: ${failed[*]:-none})" >&2
	fi
done
# Leave the tree built as the source says, and see the tests pass there
# again: a machine that went wrong during the run fails it, not a guard.
build_with ""
for t in $all_tests; do
	if ! run_test "$t"; then
		cat "$build/guard-test.log" >&2
		echo "guards: $t fails with every guard in place, after the run" >&2
		missed+=("baseline:$t")
	fi
done

word=PASS
[ ${#missed[@]} -eq 0 ] || word=FAIL
if [ ${#missed[@]} -eq 0 ]; then
	echo "VERDICT guards: $word caught=$caught/${#guards[@]}"
else
	echo "VERDICT guards: $word caught=$caught/${#guards[@]} missed=${missed[*]}"
fi
[ "$word" = PASS ]
