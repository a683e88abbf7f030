#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Wrong AMQP credentials: `check` says which broker refused the login,
# without the secret, and exits 1 (so does amqps:// against a listener
# without TLS); the daemon keeps retrying, stays alive and unready, and
# sends nothing.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
it_table amqp_auth

secret="wrong-$RANDOM-secret"
# Same user, host and port as the test URL; only the password differs.
bad_url=$(printf '%s' "$amqp_url" | sed -E "s#^(amqp://[^:]+:)[^@]*@#\\1$secret@#")
[ "$bad_url" != "$amqp_url" ] || it_fail "cannot build a URL with a wrong password from $amqp_url"
hostport=$(printf '%s' "$amqp_url" | sed -E 's#^amqp://[^@]*@([^/]+).*#\1#')

rc=0
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
	OUTBOX_PUBLISHER=amqp OUTBOX_AMQP_URL="$bad_url" \
	"$RELAY_TEST_BIN" check >"$it_dir/check.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || it_fail "check exit code $rc, want 1: $(cat "$it_dir/check.out")"
grep -q "publisher amqp: FAILED: .*$hostport, vhost '/'.*login as user 'outbox' failed: 403 ACCESS_REFUSED" \
	"$it_dir/check.out" || it_fail "check does not say which broker refused the login: $(cat "$it_dir/check.out")"
if grep -q -- "$secret" "$it_dir/check.out"; then
	it_fail "check printed the password"
fi

# amqps:// verifies TLS: a plain listener is a handshake failure, named.
rc=0
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
	OUTBOX_PUBLISHER=amqp OUTBOX_AMQP_URL="amqps://${amqp_url#amqp://}" \
	"$RELAY_TEST_BIN" check >"$it_dir/tls.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || it_fail "amqps check exit code $rc, want 1: $(cat "$it_dir/tls.out")"
grep -q "publisher amqp: FAILED: .*$hostport, vhost '/': cannot connect: SSL" "$it_dir/tls.out" ||
	it_fail "amqps to a plain listener does not fail clearly: $(cat "$it_dir/tls.out")"

it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'com.example.t', '\\x00'::bytea FROM generate_series(1, 5)"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
amqp_relay daemon OUTBOX_AMQP_URL="$bad_url" OUTBOX_HTTP_ADDR="127.0.0.1:$port"
pid=$it_last_pid
# Open retries back off 1 s, 2 s, 4 s: three failures within 7 s.
deadline=$((SECONDS + 15))
until [ "$(grep -c '"publisher unhealthy.*login as user' "$it_dir/daemon.log" || true)" -ge 3 ]; do
	[ "$SECONDS" -lt "$deadline" ] || it_fail "no repeated login failures in the log"
	kill -0 "$pid" 2>/dev/null || it_fail "the relay exited"
	sleep 0.2
done
kill -0 "$pid" 2>/dev/null || it_fail "the relay exited"
code=$(curl -s -o "$it_dir/readyz.out" -w '%{http_code}' "http://127.0.0.1:$port/readyz" || true)
[ "$code" = 503 ] || it_fail "/readyz answered $code, want 503"
# Which dependency, not where or as whom: the log has those.
[ "$(cat "$it_dir/readyz.out")" = "not ready: publisher amqp: unhealthy" ] ||
	it_fail "/readyz body: $(cat "$it_dir/readyz.out")"
[ "$(it_count "status = 'pending' AND attempts = 0")" = 5 ] || it_fail "rows were leased without a broker"
if grep -q -- "$secret" "$it_dir/daemon.log" "$it_dir/readyz.out"; then
	it_fail "the password appears in the log or /readyz"
fi
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo "ok: login refused clearly, relay alive and unready"
