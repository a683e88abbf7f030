#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A database whose encoding is not UTF-8 (LATIN1): the relay's sessions
# ask for UTF-8 whatever the URL or PGCLIENTENCODING says, so an event
# whose type and subject hold accented letters goes out as the same
# text in UTF-8 (read in LATIN1 it failed the CloudEvents checks as bad
# input), and the name of a prepared transaction holding the horizon back
# is a valid UTF-8 label on /metrics (Prometheus refuses a whole scrape
# with one invalid label).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"

# A cluster of the test's own: the prepared transaction below holds its
# horizon, which beside the other tests would hold theirs.
it_cluster
url="${it_cluster_url%/*}/latin1"
lpsql() { PGCLIENTENCODING=UTF8 psql "$url" -X -A -t -q -v ON_ERROR_STOP=1 -c "$1"; }
gid="rapport-été-$$"
psql "$it_cluster_url" -X -q -v ON_ERROR_STOP=1 \
	-c "CREATE DATABASE latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0" >/dev/null
[ "$(lpsql "SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database()")" = LATIN1 ] ||
	it_fail "the test database is not LATIN1"

export OUTBOX_TABLE=outbox_events
OUTBOX_DATABASE_URL="$url" "$RELAY_TEST_BIN" migrate >"$it_dir/migrate.out" 2>&1 ||
	it_fail "migrate failed: $(cat "$it_dir/migrate.out")"
# psql speaks UTF-8 here and the server stores LATIN1.
lpsql "INSERT INTO $OUTBOX_TABLE (type, subject, payload)
	SELECT 'café.créé', 'señor ' || g, convert_to('{}', 'UTF8') FROM generate_series(1, 5) g"
[ "$(lpsql "SELECT octet_length(convert_to(type, 'LATIN1')) FROM $OUTBOX_TABLE LIMIT 1")" = 9 ] ||
	it_fail "the type is not stored as LATIN1"
# A prepared transaction with an xid, older than every lease.
PGCLIENTENCODING=UTF8 psql "$url" -X -q -v ON_ERROR_STOP=1 >/dev/null <<SQL
CREATE TABLE held (n int);
BEGIN;
INSERT INTO held VALUES (1);
PREPARE TRANSACTION '$gid';
SQL

ops_relay latin1 OUTBOX_DATABASE_URL="$url" PGCLIENTENCODING=LATIN1
pid=$it_last_pid
all_sent() { [ "$(lpsql "SELECT count(*) FROM $OUTBOX_TABLE WHERE status = 'sent'")" = 5 ]; }
it_wait 20 "5 events sent" all_sent
[ "$(lpsql "SELECT count(*) FROM $OUTBOX_TABLE WHERE status <> 'sent'")" = 0 ] ||
	it_fail "events not sent: $(lpsql "SELECT status, last_error FROM $OUTBOX_TABLE WHERE status <> 'sent'")"
[ "$(jq -r 'select(.type == "café.créé" and (.subject | startswith("señor "))) | .id' "$it_dir/latin1.out" | wc -l)" = 5 ] ||
	it_fail "the events' type and subject did not arrive in UTF-8: $(head -c 300 "$it_dir/latin1.out")"

holder_named() {
	curl -s -m 5 "http://127.0.0.1:$ops_port/metrics" >"$it_dir/metrics.txt" &&
		grep -q "^outbox_xmin_horizon_holder_info{.*kind=\"prepared_transaction\".*name=\"$gid\"" "$it_dir/metrics.txt"
}
it_wait 30 "the prepared transaction named in UTF-8 on /metrics" holder_named
iconv -f UTF-8 -t UTF-8 "$it_dir/metrics.txt" >/dev/null ||
	it_fail "/metrics is not valid UTF-8"

it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo ok
