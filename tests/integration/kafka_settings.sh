#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# OUTBOX_KAFKA_<PROPERTY> passthrough. Startup (exit 2, naming the
# variable, never echoing a secret) refuses an unknown property, a bad
# value, settings that void the relay's guarantees and combinations only
# librdkafka itself can judge. Properties that pass take effect: the
# partitioner decides where each key lands (CRC32 by default, murmur2 with
# OUTBOX_KAFKA_PARTITIONER=murmur2_random, both computed here
# independently), lz4 compression still delivers, and message.max.bytes
# fails a row over it with the reason while the others go out.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/kafka_lib.sh"
it_table kafka_settings

# refused NAME PATTERN VAR=value...: startup exits 2 and stderr matches
# PATTERN (extended regex).
refused() {
	local name="$1" pattern="$2" rc=0
	shift 2
	timeout 30 env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$OUTBOX_TABLE" \
		OUTBOX_HTTP_ADDR="" OUTBOX_PUBLISHER=kafka OUTBOX_KAFKA_BROKERS="$kafka_brokers" "$@" \
		"$RELAY_TEST_BIN" run >"$it_dir/$name.out" 2>"$it_dir/$name.err" || rc=$?
	[ "$rc" = 2 ] || it_fail "$name: exit $rc, want 2: $(head -c 500 "$it_dir/$name.err")"
	grep -E -q -- "$pattern" "$it_dir/$name.err" ||
		it_fail "$name: stderr does not match '$pattern': $(head -c 500 "$it_dir/$name.err")"
}

refused unknown "OUTBOX_KAFKA_NO_SUCH_THING: .*'no\.such\.thing'" OUTBOX_KAFKA_NO_SUCH_THING=1
refused bad_value "OUTBOX_KAFKA_COMPRESSION_TYPE" OUTBOX_KAFKA_COMPRESSION_TYPE=rot13
refused no_idempotence "OUTBOX_KAFKA_ENABLE_IDEMPOTENCE" OUTBOX_KAFKA_ENABLE_IDEMPOTENCE=false
refused acks "OUTBOX_KAFKA_ACKS" OUTBOX_KAFKA_ACKS=1
refused brokers_prop "OUTBOX_KAFKA_BOOTSTRAP_SERVERS" OUTBOX_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:1
refused long_timeout "OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS" OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS=600000
refused only_errors "OUTBOX_KAFKA_DELIVERY_REPORT_ONLY_ERROR" OUTBOX_KAFKA_DELIVERY_REPORT_ONLY_ERROR=true
refused transactional "OUTBOX_KAFKA_TRANSACTIONAL_ID" OUTBOX_KAFKA_TRANSACTIONAL_ID=relay-1
refused in_flight "max\.in\.flight" OUTBOX_KAFKA_MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION=10
refused secret "OUTBOX_KAFKA_ENABLE_SASL_OAUTHBEARER_UNSECURE_JWT" \
	OUTBOX_KAFKA_ENABLE_SASL_OAUTHBEARER_UNSECURE_JWT=hunter2-secret
! grep -q hunter2 "$it_dir/secret.err" || it_fail "a secret value was printed"

# ---- properties that pass take effect ----
default_t="$kafka_ns.crc32"
murmur_t="$kafka_ns.murmur2"
kafka_topic "$default_t" 3
kafka_topic "$murmur_t" 3
# insert_keyed TOPIC: 40 keys, twice each, to TOPIC.
insert_keyed() {
	it_psql "INSERT INTO $OUTBOX_TABLE (type, exchange, partition_key, payload)
	         SELECT 'com.example.t', '$1', 'key-' || (g % 40), convert_to(g::text, 'UTF8')
	         FROM generate_series(1, 80) g"
}
insert_keyed "$default_t"
it_psql "INSERT INTO $OUTBOX_TABLE (type, exchange, payload, subject)
         VALUES ('com.example.t', '$default_t', convert_to(repeat('x', 5000), 'UTF8'), 'big')"

kafka_relay crc32 OUTBOX_KAFKA_MESSAGE_MAX_BYTES=2000 OUTBOX_KAFKA_CLIENT_ID=settings-test \
	OUTBOX_KAFKA_LINGER_MS=20
pid=$it_last_pid
it_wait_count 30 "status IN ('sent', 'failed')" -eq 81
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
[ "$(it_count "status = 'failed' AND subject = 'big' AND last_error LIKE '%MSG_SIZE_TOO_LARGE%'")" = 1 ] ||
	it_fail "the oversized row did not fail with the reason: $(it_psql "SELECT status, last_error FROM $OUTBOX_TABLE WHERE subject = 'big'")"
[ "$(it_count "status = 'sent'")" = 80 ] || it_fail "rows beside the oversized one were not all sent"
kafka_take "$default_t" 80 "$it_dir/crc32.txt" '%p\t%k\n'

insert_keyed "$murmur_t"
kafka_relay murmur2 OUTBOX_KAFKA_PARTITIONER=murmur2_random OUTBOX_KAFKA_COMPRESSION_TYPE=lz4
pid=$it_last_pid
it_wait_count 30 "status = 'sent' AND exchange = '$murmur_t'" -eq 80
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "murmur2 relay exit code $it_rc"
kafka_take "$murmur_t" 80 "$it_dir/murmur2.txt" '%p\t%k\n'

# Where librdkafka's partitioners put each key of a 3-partition topic:
# CRC32 (consistent_random) and Kafka's Java murmur2 (murmur2_random).
python3 - "$it_dir/crc32.txt" "$it_dir/murmur2.txt" >"$it_dir/partitioner.out" 2>&1 <<'EOF' ||
import sys, zlib

def murmur2(data):
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h

def check(path, place):
    seen = {}
    for line in open(path):
        part, key = line.rstrip("\n").split("\t")
        want = place(key.encode())
        if int(part) != want:
            sys.exit(f"{path}: key {key} in partition {part}, want {want}")
        seen[key] = want
    return seen

crc = check(sys.argv[1], lambda k: zlib.crc32(k) % 3)
mur = check(sys.argv[2], lambda k: (murmur2(k) & 0x7FFFFFFF) % 3)
moved = sum(1 for k in crc if crc[k] != mur[k])
if moved == 0:
    sys.exit("the partitioner setting changed nothing")
print(f"{moved} of {len(crc)} keys placed differently")
EOF
	it_fail "partitioning: $(cat "$it_dir/partitioner.out")"
echo "ok: 10 refusals at startup; $(cat "$it_dir/partitioner.out"); oversized row failed"
