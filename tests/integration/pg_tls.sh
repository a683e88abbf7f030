#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Postgres over TLS, verified: a throwaway server of its own (the shared
# one is left alone) with ssl=on and TCP logins allowed only over TLS,
# certificates from the test's own CA. The relay on sslmode=verify-full
# migrates and relays (its sessions show in pg_stat_ssl); a wrong CA and
# a wrong host name are refused with libpq's reason; plaintext is refused
# by the server.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tls_lib.sh"
pg_service="$RELAY_TEST_SOURCE_ROOT/tests/services/postgres.sh"

# The service account must reach the server's directory.
chmod 755 "$it_dir"
pg="$it_dir/pg"
mkdir "$pg"
trap 'bash "$pg_service" stop "$pg" >/dev/null 2>&1; it_cleanup' EXIT
bash "$pg_service" start "$pg" >"$it_dir/pg-start.out" 2>&1 ||
	it_fail "cannot start a Postgres of the test's own: $(cat "$it_dir/pg-start.out")"
port=$(sed -n 's/^PGPORT=//p' "$pg/env")
data=$(sed -n 's/^PG_DATA=//p' "$pg/env")

tls_certs "$it_dir/certs"
certs="$it_dir/certs"
cp "$certs/server.crt" "$certs/server.key" "$data/"
chown "$(stat -c %u:%g "$data")" "$data/server.crt" "$data/server.key"
chmod 600 "$data/server.key"
cat >>"$data/postgresql.conf" <<CONF
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
CONF
cat >"$data/pg_hba.conf" <<HBA
local all all trust
hostssl all all 127.0.0.1/32 scram-sha-256
hostnossl all all 127.0.0.1/32 reject
HBA
bash "$pg_service" restart "$pg" >"$it_dir/pg-restart.out" 2>&1 ||
	it_fail "cannot restart Postgres with ssl=on: $(cat "$it_dir/pg-restart.out")"

# localhost is the name the certificate is for; hostaddr keeps libpq off
# ::1, where the server does not listen.
base="postgresql://outbox:outbox-test-secret@localhost:$port/outbox?hostaddr=127.0.0.1"
good="$base&sslmode=verify-full&sslrootcert=$certs/ca.crt"
export OUTBOX_TABLE="pgtls_$$.outbox_events"

relay_cmd() {
	local url="$1" out="$2"
	shift 2
	it_rc=0
	env OUTBOX_DATABASE_URL="$url" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_LOG_FORMAT=json \
		"$RELAY_TEST_BIN" "$@" >"$it_dir/$out" 2>&1 || it_rc=$?
}

relay_cmd "$good" migrate.out migrate
[ "$it_rc" = 0 ] || it_fail "migrate over verify-full failed: $(cat "$it_dir/migrate.out")"
relay_cmd "$good" check.out check
[ "$it_rc" = 0 ] || it_fail "check over verify-full failed: $(cat "$it_dir/check.out")"
grep -q '^postgres (.*): ok' "$it_dir/check.out" || it_fail "check: $(cat "$it_dir/check.out")"

psql_tls() {
	psql "$good" -X -A -t -q -v ON_ERROR_STOP=1 -c "$1"
}
psql_tls "INSERT INTO $OUTBOX_TABLE (type, payload) SELECT 'tls.pg', '{}' FROM generate_series(1, 5)"
env OUTBOX_DATABASE_URL="$good" OUTBOX_TABLE="$OUTBOX_TABLE" OUTBOX_HTTP_ADDR="" \
	OUTBOX_POLL_INTERVAL=200ms "$RELAY_TEST_BIN" run >"$it_dir/relay.out" 2>"$it_dir/relay.log" &
pid=$!
it_pids+=("$pid")
sent() { [ "$(psql_tls "SELECT count(*) FROM $OUTBOX_TABLE WHERE status = 'sent'")" = 5 ]; }
it_wait 20 "5 rows sent over TLS" sent
# Every session of the relay is encrypted.
[ "$(psql_tls "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_ssl s
	JOIN pg_stat_activity a USING (pid) WHERE a.application_name LIKE 'outbox-relay/%'" |
	awk -F'|' '$1 == $2 && $1 > 0 { print "all" }')" = all ] ||
	it_fail "a relay session is not on TLS"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"

# A CA that did not sign the server's certificate.
relay_cmd "$base&sslmode=verify-full&sslrootcert=$certs/other-ca.crt" wrong-ca.out check
[ "$it_rc" = 1 ] || it_fail "wrong CA: check exit $it_rc: $(cat "$it_dir/wrong-ca.out")"
grep -q 'postgres (.*): FAILED: .*certificate verify failed' "$it_dir/wrong-ca.out" ||
	it_fail "wrong CA not refused clearly: $(cat "$it_dir/wrong-ca.out")"
# A host name the certificate is not for (hostaddr: no lookup of it).
wrong_host="postgresql://outbox:outbox-test-secret@wrong.example:$port/outbox?hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert=$certs/ca.crt"
relay_cmd "$wrong_host" wrong-host.out check
[ "$it_rc" = 1 ] || it_fail "wrong host: check exit $it_rc: $(cat "$it_dir/wrong-host.out")"
grep -q 'does not match host name "wrong.example"' "$it_dir/wrong-host.out" ||
	it_fail "wrong host name not refused clearly: $(cat "$it_dir/wrong-host.out")"
# The server takes no plaintext login.
relay_cmd "$base&sslmode=disable" plain.out check
[ "$it_rc" = 1 ] || it_fail "plaintext: check exit $it_rc"
for f in check wrong-ca wrong-host plain; do
	if grep -q outbox-test-secret "$it_dir/$f.out"; then
		it_fail "$f.out shows the password"
	fi
done
echo ok
