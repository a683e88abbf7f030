#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# outbox_events_total counts a row's outcome only once its lease's COMMIT
# succeeded (docs/operations.md): a lease whose COMMIT fails concluded
# nothing, and counts its rows in outbox_lost_leases_total instead. A
# deferred trigger makes every COMMIT of a row marked sent fail; then it
# goes, and the sent count is exactly the rows that became sent.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table commitcount
schema=${OUTBOX_TABLE%%.*}

it_psql "CREATE FUNCTION $schema.refuse_commit() RETURNS trigger LANGUAGE plpgsql
	AS \$\$ BEGIN RAISE EXCEPTION 'refused at commit'; END \$\$;
	CREATE CONSTRAINT TRIGGER refuse_sent AFTER UPDATE ON $OUTBOX_TABLE
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.status = 'sent')
	EXECUTE FUNCTION $schema.refuse_commit()"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, max_attempts)
	SELECT 'commit.test', '{}', 1000 FROM generate_series(1, 10)"

sent='outbox_events_total{outcome="sent",class="none"}'
ops_relay commit OUTBOX_BATCH_SIZE=5 OUTBOX_SWEEP_INTERVAL=200ms \
	OUTBOX_BACKOFF_BASE=100ms
pid=$it_last_pid
ops_wait_metric 30 outbox_lost_leases_total 'v >= 10'
[ "$(ops_metric "$sent")" = 0 ] ||
	it_fail "sent counted $(ops_metric "$sent") rows whose COMMIT failed"
[ "$(it_count "status = 'sent'")" = 0 ] || it_fail "a row became sent through the trigger"

it_psql "DROP TRIGGER refuse_sent ON $OUTBOX_TABLE"
it_wait_count 30 "status = 'sent'" -eq 10
ops_wait_metric 10 "$sent" 'v == 10'
sleep 1
[ "$(ops_metric "$sent")" = 10 ] || it_fail "sent is $(ops_metric "$sent"), want 10"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo "ok: no sent counted while COMMIT failed; 10 counted for 10 rows sent"
