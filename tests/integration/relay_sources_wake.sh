#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A relay of a pattern leases an idle table again only when the table's
# statistics show a write, a wake-up comes, a row comes due, or the
# 5-minute backstop passes (docs/design.md §13). Two ends of a pause make
# rows due that none of those saw, and the rows went out at the backstop:
# - a destination the broker refused (paused by the relay, 1 s doubling)
#   takes its rows again when its pause ends;
# - an operator's `resume --destination` writes the control table, which
#   the statistics read now counts.
. "$(dirname "$0")/lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"
it_table wake
schema="${OUTBOX_TABLE%%.*}"
it_psql "DROP SCHEMA $schema CASCADE" >/dev/null
tenant="${schema}_t1"
table="$tenant.outbox_events"
pattern="${schema}_t*.outbox_events"
trap 'it_psql "DROP SCHEMA IF EXISTS $tenant CASCADE" >/dev/null 2>&1 || true; it_cleanup' EXIT
run_cli() {
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$pattern" "$RELAY_TEST_BIN" "$@"
}
run_cli migrate --quiet --source "$table" >"$it_dir/migrate.out" 2>&1 ||
	it_fail "migrate --source failed: $(tail -3 "$it_dir/migrate.out")"
insert() { # TYPE DESTINATION
	it_psql "INSERT INTO $table (type, payload, exchange) VALUES ('$1', '\\x7b7d', '$2')" >/dev/null
}
delivered() { [ "$(it_psql "SELECT count(*) FROM $table WHERE type = '$1' AND status = 'sent'")" = 1 ]; }

refuse="$it_dir/refuse"
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$pattern" \
	OUTBOX_HTTP_ADDR= OUTBOX_POLL_INTERVAL=200ms OUTBOX_LOG_FORMAT=json \
	OUTBOX_DISCOVERY_INTERVAL=1s OUTBOX_PUBLISHER=flaky \
	OUTBOX_SWEEP_INTERVAL=50s OUTBOX_LEASE_TIMEOUT=120s \
	RELAY_TEST_FLAKY_FILE="$it_dir/delivered.jsonl" RELAY_TEST_FLAKY_REFUSE="$refuse" \
	"$RELAY_TEST_FLAKY_BIN" run >/dev/null 2>"$it_dir/wake.log" &
pid=$!
it_pids+=("$pid")
it_wait 15 "the relay's discovery" grep -q '"msg":"discovered tables"' "$it_dir/wake.log"

# Paused by an operator, then resumed (first: the relay has written
# nothing yet whose statistics, flushed late, would wake the table).
run_cli pause --destination held --source "$table" --reason test >"$it_dir/pause.out" 2>&1 ||
	it_fail "pause failed: $(cat "$it_dir/pause.out")"
sleep 2
insert held held
sleep 3
delivered held && it_fail "a row of the paused destination went out"
run_cli resume --destination held --source "$table" >"$it_dir/resume.out" 2>&1 ||
	it_fail "resume failed: $(cat "$it_dir/resume.out")"
started=$SECONDS
it_wait 15 "the held row after the resume" delivered held
took_held=$((SECONDS - started))

# Refused: the relay pauses the destination, 1 s, and takes the row again
# at the end of each pause, refused again each time while the refusals
# last (2 s, then 4): three refusals within seconds. Waiting for the
# statistics instead, the relay took it again only when Postgres flushed
# the release's claims write, 10 s later (an idle backend's delay), and
# once the pauses outgrew that, at the 5-minute backstop. (The sweeper's
# passes, which wake a table whose claims were written, are 50 s apart
# here.) The refusals stop; the row goes out at the pause's end.
touch "$refuse"
insert refused far
it_wait 15 "the destination paused" grep -q '"msg":"destination paused"' "$it_dir/wake.log"
refusals() { [ "$(grep -c '"msg":"destination paused"' "$it_dir/wake.log")" -ge 3 ]; }
it_wait 8 "two more refusals, each at the end of a pause" refusals
rm -f "$refuse"
started=$SECONDS
it_wait 15 "the refused row, once its destination takes it" delivered refused
took_refused=$((SECONDS - started))

it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo "ok: refused row out ${took_refused}s after its destination took it again, held row ${took_held}s after the resume"
