#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The runbook stays true: its alerting rules pass `promtool check rules`
# and name metrics the relay exports and sections that exist, and every
# query of sql/runbook.sql runs against a real outbox table (substituted
# the way the file says) and finds what it is for.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
command -v promtool >/dev/null || it_fail "promtool not found (Debian package prometheus)"
root="$RELAY_TEST_SOURCE_ROOT"
it_table opsrunbook

# The first yaml block of docs/runbook.md is the rules file.
awk '/^```yaml$/ { on = 1; next } on && /^```$/ { exit } on { print }' \
	"$root/docs/runbook.md" >"$it_dir/rules.yml"
[ -s "$it_dir/rules.yml" ] || it_fail "no yaml block in docs/runbook.md"
promtool check rules "$it_dir/rules.yml" >"$it_dir/promtool.out" 2>&1 ||
	it_fail "promtool check rules: $(cat "$it_dir/promtool.out")"

# Every metric the rules use is one the relay exports.
ops_relay relay
curl -s -m 5 "http://127.0.0.1:$ops_port/metrics" >"$it_dir/metrics.txt"
for m in $(grep -o 'outbox_[a-z_]*' "$it_dir/rules.yml" | sort -u); do
	grep -q "^$m[ {]" "$it_dir/metrics.txt" ||
		it_fail "the rules use $m, which /metrics does not export"
done
# Every runbook link points at a heading of docs/runbook.md.
for link in $(grep -o 'runbook.md#[a-z-]*' "$it_dir/rules.yml" | sort -u); do
	anchor=${link#runbook.md#}
	grep '^### ' "$root/docs/runbook.md" | sed 's/^### //' |
		tr 'A-Z ' 'a-z-' | grep -qx "$anchor" ||
		it_fail "rules link to #$anchor, which is no heading of docs/runbook.md"
done

# Rows for the queries to find: a holder that is this relay, failures,
# an expired lease, a blocked key, a pause.
ops_cli pause --reason "runbook test"
[ "$ops_rc" = 0 ] || it_fail "pause exited $ops_rc"
pid=$it_last_pid
reg=$(ops_registry)
registered() { [ "$(it_psql "SELECT count(*) FROM $reg WHERE id LIKE '%/$pid'")" = 1 ]; }
it_wait 10 "the registry row" registered
id=$(it_psql "SELECT id FROM $reg WHERE id LIKE '%/$pid'")
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, lease_id, leased_at, lease_expires_at, leased_by) VALUES
  ('runbook.held', '{}', 'in_flight', 1, gen_random_uuid(), now(), now() + interval '5 minutes', '$id/worker-0'),
  ('runbook.expired', '{}', 'in_flight', 1, gen_random_uuid(), now(), now() - interval '1 minute', 'gone-host/1/worker-0')"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, attempts, last_error, finished_at) VALUES
  ('runbook.failed', '{}', 'failed', 10, 'runbook sample error', now())"
blocking=$(it_psql "SELECT id FROM $OUTBOX_TABLE WHERE type = 'runbook.failed'")
it_psql "INSERT INTO ${OUTBOX_TABLE}_blocked_keys (partition_key, blocking_id, reason) VALUES ('runbook-key', '$blocking', 'failed')"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, created_at) VALUES ('runbook.pending', '{}', now() - interval '2 hours')"

# A session holding the sweep lock, for section 7 to name.
ops_session_open "runbook-sweeplock-$$"
ops_session_send "SELECT pg_advisory_lock(1868693506, hashtext('$OUTBOX_TABLE'));"
sweep_locked() {
	[ "$(it_psql "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'runbook-sweeplock-$$'")" = 1 ]
}
it_wait 10 "the sweep lock" sweep_locked

sed "s/outbox_events/$OUTBOX_TABLE/g" "$root/sql/runbook.sql" |
	psql "$RELAY_TEST_DATABASE_URL" -X -v ON_ERROR_STOP=1 -P pager=off >"$it_dir/runbook.out" 2>&1 ||
	it_fail "sql/runbook.sql failed: $(tail -n 20 "$it_dir/runbook.out")"
want() {
	grep -q -E -- "$1" "$it_dir/runbook.out" || it_fail "runbook output lacks /$1/"
}
want '== 7\. No sweep'
want 'runbook test'                          # section 1: the pause
want 'runbook\.pending'                      # section 2: the oldest pending row
want "$id +\| t +\| +1 "                     # section 4: holder alive, 1 row
want 'gone-host/1 +\| f +\| +1 +\| +1 '      # section 4: dead holder, expired
want 'runbook\.failed .*runbook sample error' # section 5
want 'runbook-key'                           # section 6
want "runbook-sweeplock-$$"                  # section 7: the lock holder
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "exit code $it_rc"
echo ok
