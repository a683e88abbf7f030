# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Helpers for the end-to-end tests: each test sources this file, gets its
# own outbox table (a fresh schema), runs the relay binary in the
# background and checks rows with psql. Background processes are killed
# when the test exits, whatever happens.
set -euo pipefail

: "${RELAY_TEST_BIN:?run through meson test (tests/run.sh)}"
: "${RELAY_TEST_DATABASE_URL:?run through tests/run.sh}"

it_name=$(basename "${BASH_SOURCE[1]:-$0}" .sh)
it_dir=$(mktemp -d "${TMPDIR:-/tmp}/outbox-it-${it_name}.XXXXXX")
it_pids=()
it_clusters=()

it_cleanup() {
	# A trap of set -e: nothing here may end it before the files go.
	set +e
	local pid hits=()
	for pid in "${it_pids[@]}"; do
		kill -9 "$pid" 2>/dev/null
	done
	wait 2>/dev/null
	# A sanitizer's report in a relay's log fails the test: one of a
	# process killed, or whose exit code the test did not read.
	mapfile -t hits < <(grep -l -e 'ERROR: AddressSanitizer' -e 'ERROR: LeakSanitizer' \
		-e 'runtime error: ' -r "$it_dir" --include='*.log' --include='*.out' 2>/dev/null)
	if [ ${#hits[@]} -gt 0 ] && [ "${it_failed:-0}" = 0 ]; then
		it_failed=1
		echo "FAIL: a sanitizer's report in ${hits[*]##*/}" >&2
		grep -h -A 12 -e 'ERROR: AddressSanitizer' -e 'ERROR: LeakSanitizer' \
			-e 'runtime error: ' "${hits[@]}" 2>/dev/null | head -60 >&2
		it_cleanup_files
		exit 1
	fi
	it_cleanup_files
}

it_cleanup_files() {
	local dir
	for dir in "${it_clusters[@]}"; do
		bash "$RELAY_TEST_SOURCE_ROOT/tests/services/postgres.sh" stop "$dir" \
			>/dev/null 2>&1 || true
	done
	if [ "${it_failed:-0}" = 0 ]; then
		rm -rf "$it_dir" "${it_clusters[@]}"
	else
		echo "kept $it_dir ${it_clusters[*]} for inspection" >&2
	fi
}
trap it_cleanup EXIT

# it_fail MESSAGE: fails the test, showing the relay logs it started.
it_fail() {
	it_failed=1
	echo "FAIL: $*" >&2
	local log
	for log in "$it_dir"/*.log; do
		[ -f "$log" ] || continue
		echo "--- last lines of $(basename "$log") ---" >&2
		tail -n 40 "$log" >&2
	done
	exit 1
}

it_psql() {
	psql "$RELAY_TEST_DATABASE_URL" -X -A -t -q -v ON_ERROR_STOP=1 -c "$1"
}

# it_table PREFIX: creates a fresh schema, migrates PREFIX_<pid>.outbox_events
# with the relay binary and sets OUTBOX_TABLE to it.
it_table() {
	local schema="$1_$$"
	it_psql "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null
	export OUTBOX_TABLE="$schema.outbox_events"
	# Leased rows still say pending: a live lease is a claim whose
	# transaction is in progress (docs/design.md §4). Rows a relay of
	# the row lease left in_flight count too.
	it_in_flight="(status = 'in_flight' OR id IN (SELECT unnest(ids) FROM
		${OUTBOX_TABLE}_claims WHERE pg_xact_status(xid) = 'in progress'))"
	OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" \
		"$RELAY_TEST_BIN" migrate >"$it_dir/migrate.out" 2>&1 ||
		it_fail "migrate failed: $(cat "$it_dir/migrate.out")"
}

# it_cluster: a PostgreSQL cluster of the test's own (tests/services/
# postgres.sh), stopped and removed when the test exits. Sets
# it_cluster_dir (its env file is there) and it_cluster_url.
it_cluster() {
	it_cluster_dir=$(mktemp -d "${TMPDIR:-/tmp}/outbox-pg.XXXXXX")
	it_clusters+=("$it_cluster_dir")
	bash "$RELAY_TEST_SOURCE_ROOT/tests/services/postgres.sh" start "$it_cluster_dir" \
		>"$it_dir/cluster.out" 2>&1 ||
		it_fail "the test's own cluster did not start: $(cat "$it_dir/cluster.out")"
	it_cluster_url=$(sed -n 's/^RELAY_TEST_DATABASE_URL=//p' "$it_cluster_dir/env")
}

# it_database_url URL NAME: URL naming database NAME instead (another
# database of the same server).
it_database_url() {
	python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$1" "$2"
}

# it_keyed_sql TABLE TYPE FROM TO KEYS PREFIX: the INSERT of keyed events
# of TYPE into TABLE, payload {"n": g} for g = FROM..TO, key PREFIX || g %
# KEYS, so that each key's events are in n order.
it_keyed_sql() {
	echo "INSERT INTO $1 (type, payload, partition_key)
  SELECT '$2', convert_to('{\"n\":' || g || '}', 'UTF8'), '$6' || (g % $5)
  FROM generate_series($3, $4) g"
}

# it_all_printed WHAT FILE...: fails the test (WHAT says which run)
# unless every row of the test's table has its id among the events the
# stdout publisher printed to FILEs (a line a kill cut short is skipped).
it_all_printed() {
	it_all_printed_from it_psql "$@"
}

# it_all_printed_from PSQL WHAT FILE...: it_all_printed for the table of
# that name in the database PSQL (a function like it_psql) reaches.
it_all_printed_from() {
	local query="$1" what="$2" f
	shift 2
	for f in "$@"; do
		cat "$f"
		echo
	done | jq -R -r 'fromjson? | .id' | sort -u >"$it_dir/printed.ids"
	$query "SELECT id FROM $OUTBOX_TABLE ORDER BY 1" | sort >"$it_dir/table.ids"
	comm -13 "$it_dir/printed.ids" "$it_dir/table.ids" >"$it_dir/missing.ids"
	[ ! -s "$it_dir/missing.ids" ] ||
		it_fail "$what: $(wc -l <"$it_dir/missing.ids") events never printed: $(head -3 "$it_dir/missing.ids")"
}

# it_order_violations LOG: of the events the flaky test publisher logged
# to LOG (JSON lines, in delivery order), the first deliveries that came
# at or below the seq of the previous first delivery of their key. A log
# jq cannot read ends the test: called inside $(...), where errexit is
# off, a cut list would count as none.
it_order_violations() {
	jq -r '[.id, .key, (.seq | tostring)] | @tsv' "$1" >"$it_dir/deliveries.tsv" ||
		{ echo unreadable; it_fail "the delivery log $1 could not be read"; }
	awk -F'\t' '!seen[$1]++ { if (($2 in last) && $3 + 0 <= last[$2]) bad++; last[$2] = $3 + 0 }
		END { print bad + 0 }' "$it_dir/deliveries.tsv"
}

# it_flaky_relay NAME URL LOG [VAR=value...]: a relay of the flaky test
# publisher (its events as JSON lines in LOG) on OUTBOX_TABLE, ordered,
# one worker, polling and sweeping fast; stderr to NAME.log. Sets
# it_last_pid.
it_flaky_relay() {
	local name="$1" url="$2" log="$3"
	shift 3
	env OUTBOX_DATABASE_URL="$url" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR= \
		OUTBOX_PUBLISHER=flaky RELAY_TEST_FLAKY_FILE="$log" OUTBOX_ORDERING=partition \
		OUTBOX_WORKERS=1 OUTBOX_POLL_INTERVAL=100ms OUTBOX_SWEEP_INTERVAL=500ms \
		OUTBOX_LOG_FORMAT=json "$@" \
		"$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/$name.log" &
	it_last_pid=$!
	it_pids+=("$it_last_pid")
}

# it_wait SECONDS DESCRIPTION CMD...: polls CMD every 100 ms until it
# succeeds, failing the test after SECONDS.
it_wait() {
	local seconds="$1" what="$2"
	shift 2
	local deadline=$((SECONDS + seconds))
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || it_fail "timed out after ${seconds}s waiting for $what"
		sleep 0.1
	done
}

# it_count WHERE: rows of the test's table matching WHERE.
it_count() {
	it_psql "SELECT count(*) FROM $OUTBOX_TABLE WHERE $1"
}

# it_wait_count SECONDS WHERE OP N: waits until the count of rows matching
# WHERE compares to N with test's OP (-eq, -ge, ...).
it_wait_count() {
	local seconds="$1" where="$2" op="$3" n="$4"
	local deadline=$((SECONDS + seconds)) c
	while :; do
		c=$(it_count "$where" 2>/dev/null || echo -1)
		[ "$c" "$op" "$n" ] && return 0
		[ "$SECONDS" -lt "$deadline" ] ||
			it_fail "timed out after ${seconds}s: count of ($where) is $c, want $op $n"
		sleep 0.1
	done
}

# it_wait_lines SECONDS FILE N: waits until FILE has at least N lines.
it_wait_lines() {
	local seconds="$1" file="$2" n="$3"
	local deadline=$((SECONDS + seconds))
	until [ -f "$file" ] && [ "$(wc -l <"$file")" -ge "$n" ]; do
		[ "$SECONDS" -lt "$deadline" ] ||
			it_fail "timed out after ${seconds}s waiting for $n lines in $(basename "$file")"
		sleep 0.1
	done
}

# it_relay NAME [VAR=value...]: starts the relay in the background with
# fast test settings, stdout to NAME.out and stderr to NAME.log; sets
# it_last_pid.
it_relay() {
	local name="$1"
	shift
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" \
		OUTBOX_TABLE="$OUTBOX_TABLE" \
		OUTBOX_HTTP_ADDR="" \
		OUTBOX_POLL_INTERVAL=200ms \
		OUTBOX_LOG_FORMAT=json \
		"$@" "$RELAY_TEST_BIN" run >"$it_dir/$name.out" 2>"$it_dir/$name.log" &
	it_last_pid=$!
	it_pids+=("$it_last_pid")
}

# it_stop PID [SECONDS] [any]: SIGTERM and wait; sets it_rc to the exit
# code, and fails the test unless it is 0 (a sanitizer's report at exit
# makes it 1 or 134) or the third argument is any. (Not for $(...): only
# this shell can wait for its own children.)
it_stop() {
	local pid="$1" seconds="${2:-30}" want="${3:-0}"
	it_rc=0
	kill -TERM "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + seconds))
	# A child that exited stays a zombie until waited for: not running.
	while ps -o stat= -p "$pid" | grep -qv Z; do
		[ "$SECONDS" -lt "$deadline" ] || it_fail "relay $pid did not stop within ${seconds}s"
		sleep 0.1
	done
	wait "$pid" || it_rc=$?
	[ "$want" = any ] || [ "$it_rc" = 0 ] ||
		it_fail "relay $pid exited $it_rc after SIGTERM, want 0"
}
