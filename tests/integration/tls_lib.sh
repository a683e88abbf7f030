# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Certificates for the TLS tests, made by openssl inside the test and
# valid for two days: a test CA, a server certificate for the name
# localhost (DNS:localhost only, so 127.0.0.1 is a host name it does not
# match), a client certificate (CN outbox-relay-client, signed by the
# test CA) and a second CA that signed none of them.

command -v openssl >/dev/null || it_fail "openssl not found (Debian package openssl)"

# tls_certs DIR: writes ca.crt, server.crt, server.key, client.crt,
# client.key and other-ca.crt into DIR (readable by every user: the
# broker and the database run under their own accounts).
tls_certs() {
	local dir="$1" ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
	mkdir -p "$dir"
	(
		cd "$dir"
		openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 2 \
			-subj "/CN=outbox-relay test CA" \
			-addext "basicConstraints=critical,CA:TRUE" \
			-addext "keyUsage=critical,keyCertSign,cRLSign"
		openssl req -x509 "${ec[@]}" -keyout other-ca.key -out other-ca.crt -days 2 \
			-subj "/CN=another CA" \
			-addext "basicConstraints=critical,CA:TRUE" \
			-addext "keyUsage=critical,keyCertSign,cRLSign"
		openssl req "${ec[@]}" -keyout server.key -out server.csr -subj "/CN=localhost"
		printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
		openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
			-out server.crt -days 2 -extfile server.ext
		openssl req "${ec[@]}" -keyout client.key -out client.csr -subj "/CN=outbox-relay-client"
		printf 'extendedKeyUsage=clientAuth\n' >client.ext
		openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
			-out client.crt -days 2 -extfile client.ext
		chmod 644 ./*.crt ./*.key
	) >"$dir/openssl.log" 2>&1 || it_fail "openssl failed: $(cat "$dir/openssl.log")"
}
