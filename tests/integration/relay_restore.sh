#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The outbox moved by pg_dump and pg_restore into a fresh cluster whose
# transaction counter is behind the old one's (docs/runbook.md, "Restores
# and upgrades"; docs/design.md §4, "Claims from elsewhere"). Two tables,
# one plain and one partitioned by `migrate --partition`, with keyed rows
# pending, sent, failed and waiting for a retry; the dump is taken while
# a relay of the old cluster has a lease in flight, so the copy holds its
# claim and rows written by transactions the new cluster has not reached.
# On the new cluster `migrate` has nothing to do, and a relay there
# delivers every row pending in the copy and the rows written after the
# restore, each key in seq order, drops the old claim with one log line
# and no error, and leaves sent, failed and the retry's rows as they were.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
: "${RELAY_TEST_FLAKY_BIN:?run through meson test}"

it_cluster
url2=$it_cluster_url
psql2() {
	psql "$url2" -X -A -t -q -v ON_ERROR_STOP=1 -c "$1"
}

it_table restore
schema=${OUTBOX_TABLE%.*}
plain=$OUTBOX_TABLE
parted=$schema.parted_events
tables="$plain,$parted"
OUTBOX_LISTEN=on ops_cli migrate
[ "$ops_rc" = 0 ] || it_fail "migrate exited $ops_rc: $(cat "$it_dir/cli.err")"
OUTBOX_TABLE=$parted OUTBOX_LISTEN=on ops_cli migrate
[ "$ops_rc" = 0 ] || it_fail "migrate of $parted exited $ops_rc: $(cat "$it_dir/cli.err")"
OUTBOX_TABLE=$parted OUTBOX_LISTEN=on ops_cli migrate --partition
[ "$ops_rc" = 0 ] || it_fail "migrate --partition exited $ops_rc: $(cat "$it_dir/cli.err")"

# The old cluster's counter well ahead of the new one's, so that the
# copy's writers (written_by) and its claim's lease transaction are
# transaction ids the new cluster has not reached.
behind=$(psql2 "SELECT pg_current_xact_id()")
ahead=$(it_psql "SELECT pg_current_xact_id()")
burn=$((behind + 3000 - ahead))
if [ "$burn" -gt 0 ]; then
	echo 'SELECT pg_current_xact_id();' >"$it_dir/burn.sql"
	pgbench -n -t "$burn" -f "$it_dir/burn.sql" "$RELAY_TEST_DATABASE_URL" \
		>"$it_dir/burn.out" 2>&1 || it_fail "pgbench: $(tail -3 "$it_dir/burn.out")"
fi

keyed() { # TABLE TYPE FROM TO: keyed events n = FROM..TO over 10 keys
	it_keyed_sql "$1" "$2" "$3" "$4" 10 "$1/"
}
for t in $plain $parted; do
	it_psql "$(keyed "$t" before 1 300)"
	it_psql "INSERT INTO $t (type, payload, status, finished_at, attempts, last_error)
  SELECT 'before.' || s, '{}', s, now(), 1, CASE WHEN s = 'failed' THEN 'x' END
  FROM (VALUES ('sent'), ('sent'), ('failed')) v(s)"
	it_psql "INSERT INTO $t (type, payload, next_attempt_at, attempts)
  VALUES ('before.retry', '{}', now() + interval '1 hour', 2)"
done

# The old cluster's relay, slowed so that its lease is in flight (its
# claim committed, its rows handed to the publisher) while pg_dump runs.
it_flaky_relay old "$RELAY_TEST_DATABASE_URL" "$it_dir/old.jsonl" OUTBOX_TABLE="$tables" \
	RELAY_TEST_FLAKY_DELAY_MS=30
old=$it_last_pid
it_wait_lines 30 "$it_dir/old.jsonl" 5
pg_dump -Fc -n "$schema" -f "$it_dir/outbox.dump" "$RELAY_TEST_DATABASE_URL" \
	2>"$it_dir/pg_dump.err" || it_fail "pg_dump: $(cat "$it_dir/pg_dump.err")"
kill -9 "$old"
wait "$old" 2>/dev/null || true

pg_restore --exit-on-error -d "$url2" "$it_dir/outbox.dump" 2>"$it_dir/pg_restore.err" ||
	it_fail "pg_restore: $(cat "$it_dir/pg_restore.err")"
[ "$(psql2 "SELECT relkind FROM pg_class WHERE oid = '$parted'::regclass")" = p ] ||
	it_fail "the restored $parted is not partitioned"
old_claims="SELECT (SELECT count(*) FROM ${plain}_claims WHERE xid >= pg_current_xact_id())
  + (SELECT count(*) FROM ${parted}_claims WHERE xid >= pg_current_xact_id())"
claims=$(psql2 "$old_claims")
in_flight=$(psql2 "SELECT count(*) FROM (SELECT ids, xid FROM ${plain}_claims
  UNION ALL SELECT ids, xid FROM ${parted}_claims) c
  WHERE cardinality(ids) > 0 AND xid >= pg_current_xact_id()")
[ "$in_flight" -ge 1 ] || it_fail "the copy holds no claim of the old cluster's lease in flight"
late=$(psql2 "SELECT count(*) FROM $plain WHERE written_by >= pg_current_xact_id()")
[ "$late" -ge 300 ] || it_fail "only $late rows of the copy have writers the new cluster has not reached"

# What the copy holds, before the new cluster's relay touches it.
psql2 "SELECT id FROM $plain WHERE status = 'pending' AND type = 'before'
  UNION ALL SELECT id FROM $parted WHERE status = 'pending' AND type = 'before'" |
	sort >"$it_dir/pending.ids"
psql2 "SELECT id FROM $plain WHERE status = 'sent' UNION ALL
  SELECT id FROM $parted WHERE status = 'sent'" | sort >"$it_dir/sent.ids"
pending=$(wc -l <"$it_dir/pending.ids")
[ "$pending" -gt 0 ] || it_fail "nothing was pending in the copy"
for t in $plain $parted; do
	env OUTBOX_DATABASE_URL="$url2" OUTBOX_TABLE="$t" OUTBOX_LISTEN=on OUTBOX_LOG_FORMAT=json \
		"$RELAY_TEST_BIN" migrate >"$it_dir/migrate2.out" 2>&1 ||
		it_fail "migrate of the restored $t: $(cat "$it_dir/migrate2.out")"
done
versions="SELECT string_agg(v::text, ',' ORDER BY v::text) FROM ${plain}_schema_version v"
[ "$(psql2 "$versions")" = "$(it_psql "$versions")" ] ||
	it_fail "migrate of the restored table recorded migrations of its own"

new_log="$it_dir/new.jsonl"
it_flaky_relay new "$url2" "$new_log" OUTBOX_TABLE="$tables" OUTBOX_LISTEN=on
new=$it_last_pid
for t in $plain $parted; do
	psql2 "$(keyed "$t" after 301 350)"
done
want=$((pending + 100))
count2() {
	[ "$(psql2 "SELECT (SELECT count(*) FROM $plain WHERE status = 'sent' AND type IN ('before', 'after'))
  + (SELECT count(*) FROM $parted WHERE status = 'sent' AND type IN ('before', 'after'))")" -ge "$1" ]
}
sent_before=$(wc -l <"$it_dir/sent.ids")
# Sent at the end: the copy's (its 4 before.sent rows apart), every row
# pending in it, and the 100 written since.
it_wait 60 "every pending row of the copy and every new one sent" count2 $((want + sent_before - 4))
it_wait 30 "the old cluster's claims dropped" \
	grep -q 'dropped claims from another cluster or from before a restore' "$it_dir/new.log"
it_stop "$new"
[ "$it_rc" = 0 ] || it_fail "the new cluster's relay exited $it_rc"

if grep -E '"level":"(error|fatal)"' "$it_dir/new.log" >"$it_dir/errors.txt"; then
	it_fail "the new cluster's relay logged errors: $(head -3 "$it_dir/errors.txt")"
fi
! grep -q 'is in the future' "$it_dir/new.log" || it_fail "a transaction id 'in the future' was read"
jq -r '.id' "$new_log" | sort -u >"$it_dir/delivered.ids"
missing=$(comm -23 "$it_dir/pending.ids" "$it_dir/delivered.ids" | wc -l)
[ "$missing" = 0 ] || it_fail "$missing rows pending in the copy were never delivered"
again=$(comm -12 "$it_dir/sent.ids" "$it_dir/delivered.ids" | wc -l)
[ "$again" = 0 ] || it_fail "$again rows sent in the copy were delivered again"
psql2 "SELECT id FROM $plain WHERE type = 'after' UNION ALL
  SELECT id FROM $parted WHERE type = 'after'" | sort >"$it_dir/after.ids"
after=$(comm -12 "$it_dir/after.ids" "$it_dir/delivered.ids" | wc -l)
[ "$after" = 100 ] || it_fail "$after of the 100 rows written after the restore delivered"
violations=$(it_order_violations "$new_log")
[ "$violations" = 0 ] || it_fail "$violations first deliveries out of seq order"
for t in $plain $parted; do
	kept=$(psql2 "SELECT count(*) FROM $t WHERE (type = 'before.sent' AND status = 'sent')
  OR (type = 'before.failed' AND status = 'failed')
  OR (type = 'before.retry' AND status = 'pending' AND attempts = 2
      AND next_attempt_at > now() + interval '50 minutes')")
	[ "$kept" = 4 ] || it_fail "$t: $kept of the 4 sent, failed and retry rows kept as they were"
done
charged=$(psql2 "SELECT (SELECT count(*) FROM $plain WHERE type = 'before' AND attempts > 1)
  + (SELECT count(*) FROM $parted WHERE type = 'before' AND attempts > 1)")
[ "$charged" = 0 ] || it_fail "$charged rows of the copy were charged an attempt they did not make"
left=$(psql2 "$old_claims")
[ "$left" = 0 ] || it_fail "$left claims of the old cluster left behind"
echo "ok: $pending rows pending in the copy and 100 written after the restore delivered in key order; $claims old claim(s) dropped"
