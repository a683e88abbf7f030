#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's settings table is the one the binary prints from its
# settings table: documentation cannot drift from what is parsed.
set -euo pipefail
: "${RELAY_TEST_BIN:?run through meson test}"
readme="$RELAY_TEST_SOURCE_ROOT/README.md"
want=$(mktemp)
got=$(mktemp)
trap 'rm -f "$want" "$got"' EXIT
"$RELAY_TEST_BIN" --settings-markdown >"$want"
sed -n '/<!-- settings:begin -->/,/<!-- settings:end -->/p' "$readme" | sed '1d;$d' >"$got"
[ -s "$want" ] || { echo "FAIL: the binary printed no settings"; exit 1; }
if ! diff -u "$want" "$got"; then
	echo "FAIL: README settings table differs from outbox-relay --settings-markdown" >&2
	echo "regenerate it between the settings markers" >&2
	exit 1
fi
# Every setting the README names in backticks exists.
grep -o '`OUTBOX_[A-Z0-9_]*`' "$readme" | tr -d '`' | sort -u | while read -r v; do
	case "$v" in
	OUTBOX_KAFKA_*) continue ;;
	# A database's own variables (OUTBOX_DATABASES): the <NAME> rows.
	OUTBOX_DATABASE_URL_* | OUTBOX_LISTEN_DATABASE_URL_*)
		row=OUTBOX_DATABASE_URL_
		case "$v" in OUTBOX_LISTEN_*) row=OUTBOX_LISTEN_DATABASE_URL_ ;; esac
		grep -q "\`${row}<NAME>\`" "$want" || { echo "FAIL: README names $v without its <NAME> row" >&2; exit 1; }
		continue
		;;
	esac
	grep -q "\`$v\`" "$want" || { echo "FAIL: README names unknown setting $v" >&2; exit 1; }
done
echo ok
