#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# OUTBOX_MAX_EVENT_SIZE: a row whose event is over it (payload, headers
# and attributes, as a broker counts them) fails at once (one attempt,
# failed, the reason naming the size and the setting) and is never
# published; rows at the limit and below go out, in binary and structured
# mode; the other rows of the batch are not held up.
. "$(dirname "$0")/lib.sh"
it_table maxsize

for mode in binary structured; do
	it_psql "TRUNCATE $OUTBOX_TABLE"
	# The event's bytes: the payload, the headers' JSON text ('{}': 2),
	# type, source ('s': 1) and content type ('application/json': 16).
	it_psql "INSERT INTO $OUTBOX_TABLE (type, source, payload, headers, max_attempts) VALUES
	  ('at.limit', 's', convert_to(repeat('a', 1024 - 27), 'UTF8'), '{}', 5),
	  ('over.limit', 's', convert_to(repeat('b', 1025 - 29), 'UTF8'), '{}', 5),
	  ('far.over', 's', convert_to(repeat('c', 3000000), 'UTF8'), '{}', 5),
	  ('big.headers', 's', convert_to('{}', 'UTF8'),
	   jsonb_build_object('x-note', repeat('d', 1100)), 5),
	  ('small', 's', convert_to('{}', 'UTF8'), '{}', 5)"
	it_relay "relay-$mode" OUTBOX_MAX_EVENT_SIZE=1KiB OUTBOX_CE_MODE="$mode"
	pid=$it_last_pid
	it_wait_count 20 "status IN ('sent', 'failed')" -eq 5
	it_stop "$pid"
	[ "$it_rc" = 0 ] || it_fail "$mode: exit code $it_rc"
	[ "$(it_count "status = 'sent' AND type IN ('at.limit', 'small')")" = 2 ] ||
		it_fail "$mode: rows within the limit were not sent"
	[ "$(it_count "status = 'failed' AND attempts = 1 AND type IN ('over.limit', 'far.over', 'big.headers')")" = 3 ] ||
		it_fail "$mode: rows over the limit did not fail at their first attempt"
	reason=$(it_psql "SELECT last_error FROM $OUTBOX_TABLE WHERE type = 'over.limit'")
	[ "$reason" = "too large: event of 1025 bytes (payload 996) is over OUTBOX_MAX_EVENT_SIZE (1KiB)" ] ||
		it_fail "$mode: reason: $reason"
	# Published: the two small rows only, never a byte of the others.
	[ "$(wc -l <"$it_dir/relay-$mode.out")" = 2 ] ||
		it_fail "$mode: $(wc -l <"$it_dir/relay-$mode.out") events published, want 2"
	reason=$(it_psql "SELECT last_error FROM $OUTBOX_TABLE WHERE type = 'big.headers'")
	case $reason in
	"too large: event of "*" bytes (payload 2) is over OUTBOX_MAX_EVENT_SIZE (1KiB)") ;;
	*) it_fail "$mode: headers' reason: $reason" ;;
	esac
	if grep -q -e bbbb -e cccc -e dddd "$it_dir/relay-$mode.out"; then
		it_fail "$mode: a row over the limit was published"
	fi
done
echo ok
