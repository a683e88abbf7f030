#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# AMQP over verified TLS, against a RabbitMQ node of the test's own with
# a TLS listener and certificates from the test's own CA (tls_lib.sh):
# - amqps:// with OUTBOX_AMQP_TLS_CA: check passes and events arrive;
# - with a client certificate as well, and with SASL EXTERNAL (the broker
#   takes the user from the certificate; rabbitmq_auth_mechanism_ssl);
# - a wrong CA, a host name the certificate is not for, and a missing
#   client certificate under EXTERNAL are refused with a clear error;
# - OUTBOX_AMQP_TLS_VERIFY=off connects despite the wrong CA and is
#   warned about at startup.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/amqp_lib.sh"
. "$(dirname "$0")/tls_lib.sh"
rmq_service="$RELAY_TEST_SOURCE_ROOT/tests/services/rabbitmq.sh"
it_table amqp_tls

chmod 755 "$it_dir"
certs="$it_dir/certs"
tls_certs "$certs"
rmq="$it_dir/rmq"
mkdir "$rmq"
trap 'bash "$rmq_service" stop "$rmq" >/dev/null 2>&1; it_cleanup' EXIT
RABBITMQ_TEST_TLS_DIR="$certs" bash "$rmq_service" start "$rmq" >"$it_dir/rmq-start.out" 2>&1 ||
	it_fail "cannot start a RabbitMQ node with TLS: $(cat "$it_dir/rmq-start.out")"
plain_url=$(sed -n 's/^RELAY_TEST_AMQP_URL=//p' "$rmq/env")
tls_port=$(sed -n 's/^RELAY_TEST_AMQPS_PORT=//p' "$rmq/env")
[ -n "$tls_port" ] || it_fail "the node has no TLS port"
# The user the client certificate's CN names, for EXTERNAL.
bash "$rmq_service" ctl "$rmq" add_user outbox-relay-client "unused-$RANDOM$RANDOM" >/dev/null &&
	bash "$rmq_service" ctl "$rmq" set_permissions -p / outbox-relay-client '.*' '.*' '.*' >/dev/null ||
	it_fail "cannot add the certificate's user"

tls_url="amqps://outbox:outbox-test-secret@localhost:$tls_port"
x="$amqp_ns.x"
q="$amqp_ns.q"
"$RELAY_TEST_AMQP_CONSUME" --url "$plain_url" --declare-exchange "$x" --queue "$q" --bind "$x:#" ||
	it_fail "cannot set up exchange $x and queue $q"

# tls_check NAME URL [VAR=value...]: `check` against the node; sets it_rc.
tls_check() {
	local name="$1" url="$2"
	shift 2
	it_rc=0
	env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
		OUTBOX_PUBLISHER=amqp OUTBOX_AMQP_URL="$url" OUTBOX_LOG_FORMAT=json "$@" \
		"$RELAY_TEST_BIN" check >"$it_dir/$name.out" 2>&1 || it_rc=$?
}

# tls_relay NAME N URL [VAR=value...]: N events relayed over url arrive.
tls_relay() {
	local name="$1" n="$2" url="$3"
	shift 3
	it_psql "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'tls.$name', '{}' FROM generate_series(1, $n)"
	it_relay "$name" OUTBOX_PUBLISHER=amqp OUTBOX_AMQP_URL="$url" OUTBOX_AMQP_EXCHANGE="$x" "$@"
	local pid=$it_last_pid
	it_wait_count 30 "status = 'sent' AND type = 'tls.$name'" -eq "$n"
	"$RELAY_TEST_AMQP_CONSUME" --url "$plain_url" --queue "$q" --count "$n" --idle-timeout 10 \
		>"$it_dir/$name.jsonl" 2>"$it_dir/$name.err" ||
		it_fail "$name: consumed $(wc -l <"$it_dir/$name.jsonl") of $n: $(cat "$it_dir/$name.err")"
	it_stop "$pid"
	[ "$it_rc" = 0 ] || it_fail "$name: relay exit code $it_rc"
	grep -q '"amqp connected"' "$it_dir/$name.log" || it_fail "$name: never connected"
}

# The test CA, no client certificate, PLAIN.
tls_check ca "$tls_url" OUTBOX_AMQP_TLS_CA="$certs/ca.crt"
[ "$it_rc" = 0 ] || it_fail "check over amqps with the test CA: $(cat "$it_dir/ca.out")"
grep -q '^publisher amqp: ok' "$it_dir/ca.out" || it_fail "check: $(cat "$it_dir/ca.out")"
if grep -q '"level":"warn".*"link"' "$it_dir/ca.out"; then
	it_fail "a verified TLS link was warned about: $(cat "$it_dir/ca.out")"
fi
tls_relay tls-ca 20 "$tls_url" OUTBOX_AMQP_TLS_CA="$certs/ca.crt"

# With the client certificate too (PLAIN still logs in).
tls_relay tls-cert 20 "$tls_url" OUTBOX_AMQP_TLS_CA="$certs/ca.crt" \
	OUTBOX_AMQP_TLS_CERT="$certs/client.crt" OUTBOX_AMQP_TLS_KEY="$certs/client.key"

# SASL EXTERNAL: no password in the URL; the broker names the user from
# the certificate's CN.
ext_url="amqps://localhost:$tls_port"
tls_relay tls-external 20 "$ext_url" OUTBOX_AMQP_TLS_CA="$certs/ca.crt" \
	OUTBOX_AMQP_TLS_CERT="$certs/client.crt" OUTBOX_AMQP_TLS_KEY="$certs/client.key" \
	OUTBOX_AMQP_SASL_MECHANISM=external
# No password was sent, and the node let in the certificate's user.
grep -q "user 'outbox-relay-client' authenticated" "$rmq"/log/*.log ||
	it_fail "the node's log does not show the certificate's user logging in"

# Refusals, each saying why.
tls_check wrong-ca "$tls_url" OUTBOX_AMQP_TLS_CA="$certs/other-ca.crt"
[ "$it_rc" = 1 ] || it_fail "wrong CA: check exit $it_rc: $(cat "$it_dir/wrong-ca.out")"
grep -q "publisher amqp: FAILED: amqp broker localhost:$tls_port, vhost '/': cannot connect: SSL peer cert verification failed (the broker's certificate is not signed by a CA in OUTBOX_AMQP_TLS_CA" \
	"$it_dir/wrong-ca.out" || it_fail "wrong CA not refused clearly: $(cat "$it_dir/wrong-ca.out")"
# The system bundle does not hold the test CA either.
tls_check system-ca "$tls_url"
[ "$it_rc" = 1 ] || it_fail "system CA bundle: check exit $it_rc"
# 127.0.0.1 is not a name the certificate (DNS:localhost) is for.
tls_check wrong-host "amqps://outbox:outbox-test-secret@127.0.0.1:$tls_port" \
	OUTBOX_AMQP_TLS_CA="$certs/ca.crt"
[ "$it_rc" = 1 ] || it_fail "wrong host: check exit $it_rc: $(cat "$it_dir/wrong-host.out")"
grep -q "publisher amqp: FAILED: amqp broker 127.0.0.1:$tls_port, vhost '/': cannot connect: SSL hostname verification failed (the broker's certificate is not issued for the host name in OUTBOX_AMQP_URL)" \
	"$it_dir/wrong-host.out" || it_fail "wrong host name not refused clearly: $(cat "$it_dir/wrong-host.out")"
# EXTERNAL without a certificate is a configuration error (exit 2).
tls_check no-cert "$ext_url" OUTBOX_AMQP_TLS_CA="$certs/ca.crt" OUTBOX_AMQP_SASL_MECHANISM=external
[ "$it_rc" = 2 ] || it_fail "EXTERNAL without a certificate: exit $it_rc: $(cat "$it_dir/no-cert.out")"
grep -q "OUTBOX_AMQP_SASL_MECHANISM=external logs in with the TLS client certificate" "$it_dir/no-cert.out" ||
	it_fail "EXTERNAL without a certificate: $(cat "$it_dir/no-cert.out")"

# A directory given as the CA file (the CA path for the bundle) is a
# configuration error at startup (exit 2), not a failure at each connect.
tls_check ca-dir "$tls_url" OUTBOX_AMQP_TLS_CA="$certs"
[ "$it_rc" = 2 ] || it_fail "a directory as the CA file: exit $it_rc: $(cat "$it_dir/ca-dir.out")"
grep -q "OUTBOX_AMQP_TLS_CA.*is not a regular file (a directory)" "$it_dir/ca-dir.out" ||
	it_fail "a directory as the CA file: $(cat "$it_dir/ca-dir.out")"

# Verification off: connects despite the wrong CA, and says so.
tls_check no-verify "$tls_url" OUTBOX_AMQP_TLS_CA="$certs/other-ca.crt" OUTBOX_AMQP_TLS_VERIFY=off
[ "$it_rc" = 0 ] || it_fail "verify off: check exit $it_rc: $(cat "$it_dir/no-verify.out")"
[ "$(grep -c '"level":"warn".*OUTBOX_AMQP_TLS_VERIFY=off' "$it_dir/no-verify.out")" = 1 ] ||
	it_fail "verify off is not warned about once: $(cat "$it_dir/no-verify.out")"

# What the relay printed and logged never holds the password.
for f in "$it_dir"/*.out "$it_dir"/*.log; do
	[ "$(basename "$f")" != rmq-start.out ] || continue
	if grep -q outbox-test-secret "$f"; then
		it_fail "$(basename "$f") shows the password"
	fi
done
echo ok
