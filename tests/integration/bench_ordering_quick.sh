#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The ordering benchmark's short form, so it cannot rot: it must run and
# print a well-formed table and JSON line. No timed assertion.
set -euo pipefail
: "${RELAY_TEST_SOURCE_ROOT:?run through meson test}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
RELAY_TEST_BUILD_DIR="$(dirname "$RELAY_TEST_BIN")" \
	bash "$RELAY_TEST_SOURCE_ROOT/tests/bench/ordering.sh" --quick >"$out" 2>/dev/null
grep -q '^| ordered lease, one key with 20000 rows' "$out" || { cat "$out"; echo "FAIL: no table"; exit 1; }
tail -n 1 "$out" | jq -e '.hot_over_none > 0 and .commits_per_s["16"].trigger > 0
	and .commits_per_s["64"].no_trigger > 0
	and .ordered_lease_ms_all_in_backoff[0] > 0
	and .walk_lease_ms_all_in_backoff[0] > 0' >/dev/null || { cat "$out"; echo "FAIL: bad JSON"; exit 1; }
cat "$out"
