#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# No part of a password leaks, whatever characters it holds ('@', ':',
# '/', '%'): not in `check` output, not in the reconnect logs, not in
# /readyz. Percent-encoded, and in libpq's key=value form, every such
# password is accepted and hidden; written raw into a URL where it would
# be ambiguous ('@', '/', a stray '%'), the URL is refused at startup
# (exit 2) with a reason that names the variable and quotes nothing of it
# (config_url_userinfo_check, docs/security.md).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table secrets

hostport=$(printf '%s' "$RELAY_TEST_DATABASE_URL" | sed -E 's#^[a-z]+://[^@]*@([^/]+)/.*#\1#')
host=${hostport%:*}
port=${hostport##*:}
# Five fragments that appear nowhere else; the password holds them apart
# by the characters under test.
frags=(Kq7mA Wx4pB Vb9sC Zr2dE Yt5fG)
raw="Kq7mA@Wx4pB:Vb9sC/Zr2dE%Yt5fG"
enc="Kq7mA%40Wx4pB%3AVb9sC%2FZr2dE%25Yt5fG"

leaks() {
	local f frag
	for frag in "${frags[@]}"; do
		for f in "$it_dir"/*; do
			[ -f "$f" ] || continue
			if grep -q -- "$frag" "$f"; then
				echo "$(basename "$f"): $frag"
				return 0
			fi
		done
	done
	return 1
}

# check NAME VAR=value...: `outbox-relay check` with those settings.
check() {
	local name=$1
	shift
	check_rc=0
	env OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR= "$@" \
		timeout 20 "$RELAY_TEST_BIN" check >"$it_dir/$name.check" 2>&1 || check_rc=$?
}

# accepted NAME VAR=value...: check fails on the connection (exit 1, the
# password is wrong or nothing listens), the relay runs and retries,
# /readyz answers 503.
accepted() {
	local name=$1
	shift
	check "$name" "$@"
	[ "$check_rc" = 1 ] || it_fail "$name: check exit $check_rc, want 1: $(cat "$it_dir/$name.check")"
	grep -q "FAILED" "$it_dir/$name.check" || it_fail "$name: check did not report the failed connection"
	ops_relay "$name" "$@"
	local pid=$it_last_pid
	sleep 2
	ops_wait_code 10 /readyz 503
	echo "$ops_body" >"$it_dir/$name.readyz"
	it_stop "$pid"
}

# refused NAME VAR: the relay and check exit 2 naming VAR.
refused() {
	local name=$1 var=$2
	shift 2
	check "$name" "$@"
	[ "$check_rc" = 2 ] || it_fail "$name: check exit $check_rc, want 2: $(cat "$it_dir/$name.check")"
	grep -q "$var" "$it_dir/$name.check" || it_fail "$name: the error does not name $var"
	local rc=0
	env OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR= "$@" \
		timeout 60 "$RELAY_TEST_BIN" run >"$it_dir/$name.run" 2>&1 || rc=$?
	[ "$rc" = 2 ] || it_fail "$name: run exit $rc, want 2"
}

pg="postgresql://outbox"
accepted pg_encoded OUTBOX_DATABASE_URL="$pg:$enc@$hostport/outbox"
grep -q 'password authentication failed' "$it_dir/pg_encoded.check" ||
	it_fail "the encoded password did not reach the server: $(cat "$it_dir/pg_encoded.check")"
accepted pg_colon OUTBOX_DATABASE_URL="$pg:Kq7mA:Wx4pB@$hostport/outbox"
accepted pg_keyvalue OUTBOX_DATABASE_URL="host=$host port=$port user=outbox dbname=outbox password='$raw'"
accepted pg_unreachable OUTBOX_DATABASE_URL="$pg:$enc@127.0.0.1:1/outbox"
refused pg_at OUTBOX_DATABASE_URL OUTBOX_DATABASE_URL="$pg:Kq7mA@Wx4pB@$hostport/outbox"
grep -q '%40' "$it_dir/pg_at.check" || it_fail "the '@' refusal does not say how to write it"
refused pg_slash OUTBOX_DATABASE_URL OUTBOX_DATABASE_URL="$pg:Kq7mA/Wx4pB@$hostport/outbox"
refused pg_percent OUTBOX_DATABASE_URL OUTBOX_DATABASE_URL="$pg:Kq7mA%Wx4pB@$hostport/outbox"
refused pg_all OUTBOX_DATABASE_URL OUTBOX_DATABASE_URL="$pg:$raw@$hostport/outbox"
refused listen_at OUTBOX_LISTEN_DATABASE_URL OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" \
	OUTBOX_LISTEN=on OUTBOX_LISTEN_DATABASE_URL="$pg:Kq7mA@Wx4pB@$hostport/outbox"

# The broker URL: nothing listens on port 1, so check fails and the
# relay's publisher reconnects.
amqp=(OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_PUBLISHER=amqp)
accepted amqp_encoded "${amqp[@]}" OUTBOX_AMQP_URL="amqp://outbox:$enc@127.0.0.1:1"
refused amqp_at OUTBOX_AMQP_URL "${amqp[@]}" OUTBOX_AMQP_URL="amqp://outbox:Kq7mA@Wx4pB@127.0.0.1:1"
refused amqp_colon OUTBOX_AMQP_URL "${amqp[@]}" OUTBOX_AMQP_URL="amqp://outbox:Kq7mA:Wx4pB@127.0.0.1:1"
refused amqp_slash OUTBOX_AMQP_URL "${amqp[@]}" OUTBOX_AMQP_URL="amqp://outbox:Kq7mA/Wx4pB@127.0.0.1:1"

# NAME_FILE: a file every user can read works, with a warning in the log;
# a FIFO is refused at once (it used to hang startup waiting for a writer).
printf '%s\n' "$RELAY_TEST_DATABASE_URL" >"$it_dir/url-file"
chmod 0644 "$it_dir/url-file"
check file_0644 OUTBOX_DATABASE_URL_FILE="$it_dir/url-file"
[ "$check_rc" = 0 ] || it_fail "check with a 0644 URL file: exit $check_rc: $(cat "$it_dir/file_0644.check")"
grep -q "OUTBOX_DATABASE_URL_FILE: '$it_dir/url-file' is readable by every user (mode 0644)" \
	"$it_dir/file_0644.check" || it_fail "no warning for a URL file readable by everyone"
chmod 0600 "$it_dir/url-file"
check file_0600 OUTBOX_DATABASE_URL_FILE="$it_dir/url-file"
[ "$check_rc" = 0 ] && ! grep -q "readable by every user" "$it_dir/file_0600.check" ||
	it_fail "a 0600 URL file: exit $check_rc or a warning: $(cat "$it_dir/file_0600.check")"
rm -f "$it_dir/url-file"
mkfifo "$it_dir/url-fifo"
check file_fifo OUTBOX_DATABASE_URL_FILE="$it_dir/url-fifo"
[ "$check_rc" = 2 ] || it_fail "a FIFO as URL file: exit $check_rc, want 2 (124: it hung)"
grep -q "is a FIFO: name a regular file" "$it_dir/file_fifo.check" || it_fail "the FIFO is not named as one"
rm -f "$it_dir/url-fifo"

if where=$(leaks); then
	it_fail "a part of a password leaked: $where"
fi
# The check is worth something: the fragments are found when present.
echo "canary Wx4pB" >"$it_dir/canary"
leaks >/dev/null || it_fail "the leak check cannot find a fragment"
rm -f "$it_dir/canary"
echo "ok"
