#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Benchmark of ordered delivery and LISTEN (not a timed test): prints a
# Markdown table and one JSON line.
#  1. The ordered lease with one partition key holding HOT_ROWS due rows
#     vs none (the relay's own statements, bench_ordering): target <= 2x.
#  2. Producers' commit rate with 16 and 64 concurrent writers, with and
#     without the NOTIFY trigger of OUTBOX_LISTEN=on: the cost of LISTEN.
# Usage: tests/bench/ordering.sh [--quick]
# Uses RELAY_TEST_DATABASE_URL when set (tests/run.sh), else starts a
# throwaway PostgreSQL. Needs a build: RELAY_TEST_BUILD_DIR (default build-test).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="${RELAY_TEST_BUILD_DIR:-$root/build-test}"
hot=100000 repeats=50 seconds=10
if [ "${1:-}" = "--quick" ]; then
	hot=20000 repeats=10 seconds=2
fi
relay="$build/outbox-relay"
bench="$build/tests/bench/bench_ordering"
[ -x "$relay" ] && [ -x "$bench" ] || { echo "ordering.sh: build first (ninja -C $build)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-bench-ord.XXXXXX")
chmod 755 "$work"
cleanup() {
	[ -n "${own_pg:-}" ] && bash "$root/tests/services/postgres.sh" stop "$work/pg" >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT
if [ -z "${RELAY_TEST_DATABASE_URL:-}" ]; then
	mkdir -p "$work/pg"
	bash "$root/tests/services/postgres.sh" start "$work/pg" >/dev/null
	own_pg=1
	RELAY_TEST_DATABASE_URL=$(sed -n 's/^RELAY_TEST_DATABASE_URL=//p' "$work/pg/env")
fi
db="$RELAY_TEST_DATABASE_URL"

lease_json=$("$bench" "$db" "$hot" "$repeats")

# Commit rate of plain autocommit inserts, trigger off and on.
schema="bench_notify_$$"
psql "$db" -X -q -c "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $schema CASCADE"
printf 'INSERT INTO %s.outbox_events (type, payload) VALUES (%s, %s);\n' \
	"$schema" "'bench'" "'x'" >"$work/insert.sql"
tps() { # clients
	pgbench "$db" -n -f "$work/insert.sql" -c "$1" -j 2 -T "$seconds" 2>/dev/null |
		awk '/^tps = / { printf "%.0f", $3 }'
}
declare -A rate
for listen in off on; do
	OUTBOX_DATABASE_URL="$db" OUTBOX_TABLE="$schema.outbox_events" OUTBOX_LISTEN=$listen \
		"$relay" migrate >/dev/null
	for c in 16 64; do
		rate[$listen$c]=$(tps "$c")
	done
done
psql "$db" -X -q -c "SET client_min_messages = warning; DROP SCHEMA $schema CASCADE"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
hot_ratio=$(printf '%s' "$lease_json" | jq -r .hot_over_none)
echo "| measure | value | comparison |"
echo "|---|---|---|"
printf '| ordered lease, no hot key (median ms) | %s | |\n' "$(printf '%s' "$lease_json" | jq -r '.ordered_lease_ms_no_hot_key[0]')"
printf '| ordered lease, one key with %s rows (median ms) | %s | %s x none (target <= 2) |\n' \
	"$hot" "$(printf '%s' "$lease_json" | jq -r '.ordered_lease_ms_hot_key[0]')" "$hot_ratio"
printf '| unordered lease, same table (median ms) | %s | |\n' "$(printf '%s' "$lease_json" | jq -r '.unordered_lease_ms_hot_key[0]')"
printf '| ordered lease, every key in backoff, key map (median ms) | %s | |\n' "$(printf '%s' "$lease_json" | jq -r '.ordered_lease_ms_all_in_backoff[0]')"
printf '| ordered lease, every key in backoff, walk along key_idx (median ms) | %s | |\n' "$(printf '%s' "$lease_json" | jq -r '.walk_lease_ms_all_in_backoff[0]')"
for c in 16 64; do
	printf '| producer commits/s, %s writers, no trigger | %s | |\n' "$c" "${rate[off$c]}"
	printf '| producer commits/s, %s writers, NOTIFY trigger | %s | %s x without |\n' \
		"$c" "${rate[on$c]}" "$(ratio "${rate[on$c]}" "${rate[off$c]}")"
done
printf '%s' "$lease_json" | jq -c --argjson s "$seconds" \
	--argjson off16 "${rate[off16]:-0}" --argjson on16 "${rate[on16]:-0}" \
	--argjson off64 "${rate[off64]:-0}" --argjson on64 "${rate[on64]:-0}" \
	'. + {commit_rate_seconds: $s, commits_per_s: {"16": {no_trigger: $off16, trigger: $on16}, "64": {no_trigger: $off64, trigger: $on64}}}'
