#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `outbox-relay migrate --partition` on a live table (docs/design.md §11,
# "The migration"): two relays of this version (a rolling deployment's)
# in ordered mode, woken by notifications alone, and a producer writing
# keyed events one a transaction, while the table, with rows in every
# state, becomes partitioned by id. Every event is published once, each
# relay's share of a key in order; the NOTIFY trigger moved with the
# name; the rows that were sent, failed or waiting for their retry stay
# so; `migrate` runs again on the new shape and the step is done once.
# Run by the table's owner, it drops days by the retention the relays
# record in the registry, not by its own shell's.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ops_lib.sh"
it_table opspartition
reg=$(ops_registry)
OUTBOX_LISTEN=on ops_cli migrate
[ "$ops_rc" = 0 ] || it_fail "migrate exited $ops_rc: $(cat "$it_dir/cli.err")"

keyed() { # TYPE FROM TO: keyed events, n = FROM..TO over keys k0..k2
	it_keyed_sql "$OUTBOX_TABLE" "$1" "$2" "$3" 3 k
}
it_psql "$(keyed before.keyed 1 60)"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, status, finished_at, attempts, last_error)
  SELECT 'before.' || s, '{}', s, now(), 10, CASE WHEN s = 'failed' THEN 'x' END
  FROM (VALUES ('sent'), ('sent'), ('failed')) v(s)"
it_psql "INSERT INTO $OUTBOX_TABLE (type, payload, next_attempt_at, attempts)
  VALUES ('before.retry', '{}', now() + interval '1 hour', 2)"

# Polling once a minute: only a notification, or the end of another
# lane's batch whose keys a lease found held, wakes them in this test
# (without the second, 6 of the 60 went in the 30 s).
relay=(OUTBOX_ORDERING=partition OUTBOX_LISTEN=on OUTBOX_POLL_INTERVAL=60s
	OUTBOX_CLEAN_INTERVAL=1s)
ops_relay a "${relay[@]}"
pid_a=$it_last_pid
ops_relay b "${relay[@]}"
pid_b=$it_last_pid
beats() {
	[ "$(it_psql "SELECT count(*) FROM $reg WHERE protocol = 1")" = 2 ]
}
it_wait 20 "both relays' heartbeats" beats
it_wait_count 30 "type = 'before.keyed' AND status = 'sent'" -eq 60

# The producer: one event a transaction, 10 ms apart, at most 400.
(
	for g in $(seq 1 400); do
		[ -f "$it_dir/stop" ] && break
		it_psql "$(keyed during.keyed "$g" "$g")" 2>>"$it_dir/producer.err" ||
			echo "insert $g refused" >>"$it_dir/producer.err"
		sleep 0.01
	done
) &
producer=$!
sleep 1
OUTBOX_LISTEN=on ops_cli migrate --partition
[ "$ops_rc" = 0 ] || it_fail "migrate --partition exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^contract step partition_by_id (protocol 1): done$' "$it_dir/cli.out" ||
	it_fail "no line for the step: $(cat "$it_dir/cli.out")"
grep -q 'is partitioned by id$' "$it_dir/cli.out" ||
	it_fail "no line for the table: $(cat "$it_dir/cli.out")"
# A run that found a lock taken (a relay's cleaner tending at that
# moment: its lock, or a partition it makes) says so and leaves those
# steps undone: run again, as it asks. (Before it said so for the
# cleaner's lock, the day after tomorrow's partition could be missing.)
tries=0
while grep -q '(some locks were taken: run it again)$' "$it_dir/cli.out"; do
	tries=$((tries + 1))
	[ "$tries" -le 10 ] || it_fail "migrate --partition found locks taken 10 times in a row"
	sleep 0.5
	OUTBOX_LISTEN=on ops_cli migrate --partition
	[ "$ops_rc" = 0 ] || it_fail "migrate --partition again exited $ops_rc: $(cat "$it_dir/cli.err")"
done
# Writes after the partitioning too, counted rather than timed: a slow
# machine's producer may write a few a second (it stops at 400).
want=$(($(it_count "type = 'during.keyed'") + 10))
[ "$want" -ge 51 ] || want=51
[ "$want" -le 400 ] || want=400
it_wait_count 30 "type = 'during.keyed'" -ge "$want"
touch "$it_dir/stop"
wait "$producer"
[ ! -s "$it_dir/producer.err" ] ||
	it_fail "the producer was refused: $(head -5 "$it_dir/producer.err")"
[ "$(it_psql "SELECT relkind FROM pg_class WHERE oid = '$OUTBOX_TABLE'::regclass")" = p ] ||
	it_fail "the table is not partitioned"
during=$(it_count "type = 'during.keyed'")
[ "$during" -gt 50 ] || it_fail "the producer wrote only $during events"
it_wait_count 20 "type = 'during.keyed' AND status = 'sent'" -eq "$during"

# Published once, each relay's share of a key in the key's order.
published=$(cat "$it_dir/a.out" "$it_dir/b.out" | grep -c '"type":"during.keyed"')
[ "$published" = "$during" ] ||
	it_fail "$published publications of $during events"
# ...and each of them: a lost event and one sent twice would count alike.
cat "$it_dir/a.out" "$it_dir/b.out" | grep '"type":"during.keyed"' |
	jq -r .id | sort -u >"$it_dir/during.printed"
it_psql "SELECT id FROM $OUTBOX_TABLE WHERE type = 'during.keyed'" | sort >"$it_dir/during.ids"
cmp -s "$it_dir/during.printed" "$it_dir/during.ids" ||
	it_fail "the events published are not the table's: $(comm -3 "$it_dir/during.printed" "$it_dir/during.ids" | head -3)"
for r in a b; do
	grep '"type":"during.keyed"' "$it_dir/$r.out" |
		sed -E 's/.*"partitionkey":"(k[0-9])".*"n":([0-9]+).*/\1 \2/' |
		awk '$1 !~ /^k[0-9]$/ { bad = bad " unparsed:" $0 }
		     last[$1] != "" && $2 <= last[$1] { bad = bad " " $1 ":" last[$1] ">" $2 }
		     { last[$1] = $2 } END { if (bad != "") { print bad; exit 1 } }' ||
		it_fail "relay $r published a key out of order"
done

# What was sent, failed or waiting for its retry stays so.
[ "$(it_count "type IN ('before.sent', 'before.failed') AND status = split_part(type, '.', 2)")" = 3 ] ||
	it_fail "terminal rows changed"
[ "$(it_count "type = 'before.retry' AND status = 'pending' AND attempts = 2")" = 1 ] ||
	it_fail "the retry in backoff changed"

# When migrate --partition returns, the next 2 days' partitions exist:
# made by it, or by a relay's cleaner (1 s rounds) that saw the table
# partitioned first, so the last run's count is 0 to 2 (each is made once:
# CREATE under the cleaner's lock). The count alone is checked at the
# end, with the relays stopped. The cleaners (one of them: the cleaner's
# lock) keep tomorrow's made, and with rounds shorter than 12 h only
# that one (every partition costs each lease): tomorrow's and the day
# after's, dropped by hand, are made again and not, and tomorrow's ids
# land in it.
grep -q '^partitions made ahead: [012], dropped: 0, rows carried to the default partition: 0, days kept for their rows: 0$' "$it_dir/cli.out" ||
	it_fail "migrate --partition's partitions: $(cat "$it_dir/cli.out")"
part_of() { # DAYS: the name of the partition of today + DAYS (UTC)
	echo "${OUTBOX_TABLE}_p$(it_psql "SELECT to_char(date_trunc('day', now() AT TIME ZONE 'UTC') + interval '$1 day', 'YYYYMMDD')")"
}
next_part=$(part_of 1)
after_part=$(part_of 2)
[ "$(it_psql "SELECT count(to_regclass(p)) FROM (VALUES ('$next_part'), ('$after_part')) v(p)")" = 2 ] ||
	it_fail "the next 2 days' partitions are missing after migrate --partition"
it_psql "DROP TABLE $next_part, $after_part"
remade() {
	[ "$(it_psql "SELECT to_regclass('$next_part') IS NOT NULL")" = t ]
}
it_wait 20 "tomorrow's partition made again" remade
sleep 3 # three more rounds
[ "$(it_psql "SELECT to_regclass('$after_part') IS NULL")" = t ] ||
	it_fail "the relays made the day after tomorrow's partition too"
# grep reads the files itself: `cat | grep -q` under pipefail fails when
# grep has matched and left before cat wrote the rest.
grep -q '"msg":"partitions made and dropped".*"made":"1"' "$it_dir/a.log" "$it_dir/b.log" ||
	it_fail "no relay logged the partition it made"
next=$(it_psql "SELECT lpad(to_hex((extract(epoch FROM (date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC') * 1000)::bigint + 5), 12, '0')")
it_psql "INSERT INTO $OUTBOX_TABLE (id, type, payload) VALUES
  ((substr('$next', 1, 8) || '-' || substr('$next', 9, 4) || '-7000-8000-000000000001')::uuid, 'next.day', '{}')"
[ "$(it_psql "SELECT tableoid = '$next_part'::regclass FROM $OUTBOX_TABLE WHERE type = 'next.day'")" = t ] ||
	it_fail "a row of tomorrow is not in its partition"
it_wait_count 20 "type = 'next.day' AND status = 'sent'" -eq 1

# On the new shape: migrate again, the step done once.
OUTBOX_LISTEN=on ops_cli migrate
[ "$ops_rc" = 0 ] || it_fail "migrate on the partitioned table exited $ops_rc: $(cat "$it_dir/cli.err")"
# With the relays stopped, migrate --partition alone makes the day after
# tomorrow's partition, dropped above (empty): counted once.
for pid in "$pid_a" "$pid_b"; do
	it_stop "$pid"
	[ "$it_rc" = 0 ] || it_fail "a relay exited $it_rc on SIGTERM"
done
OUTBOX_LISTEN=on ops_cli migrate --partition
[ "$ops_rc" = 0 ] || it_fail "migrate --partition again exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^contract step partition_by_id (protocol 1): recorded before, done$' "$it_dir/cli.out" ||
	it_fail "the second run: $(cat "$it_dir/cli.out")"
grep -q '^partitions made ahead: 1, dropped: 0, rows carried to the default partition: 0, days kept for their rows: 0$' "$it_dir/cli.out" ||
	it_fail "the second run's partitions: $(cat "$it_dir/cli.out")"
[ "$(it_psql "SELECT to_regclass('$after_part') IS NOT NULL")" = t ] ||
	it_fail "the second run did not make the day after tomorrow's partition"
[ "$(it_psql "SELECT count(*) FROM pg_partition_tree('$OUTBOX_TABLE') WHERE level > 1")" = 0 ] ||
	it_fail "the second run partitioned a partition"

# The days it drops are the relays' retention, not its own shell's: a
# day three days past with a row sent then, kept by the command's own
# 30 days, goes by the hour a relay records in the registry.
read -r old_tag old_lo old_hi < <(it_psql "SELECT to_char(at, 'YYYYMMDD'),
    substr(a, 1, 8) || '-' || substr(a, 9, 4) || '-0000-0000-000000000000',
    substr(b, 1, 8) || '-' || substr(b, 9, 4) || '-0000-0000-000000000000'
  FROM (SELECT at,
    lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') AS a,
    lpad(to_hex((extract(epoch FROM at + interval '1 day') * 1000)::bigint), 12, '0') AS b
  FROM (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
    - interval '3 days' AS at) x) y" | tr '|' ' ')
old_part="${OUTBOX_TABLE}_p$old_tag"
it_psql "CREATE TABLE $old_part PARTITION OF $OUTBOX_TABLE FOR VALUES FROM ('$old_lo') TO ('$old_hi');
  INSERT INTO $OUTBOX_TABLE (id, type, payload, status, finished_at)
    VALUES ((substr('$old_lo', 1, 14) || '7000-8000-000000000001')::uuid, 'old.day', '{}', 'sent',
      now() - interval '3 days')" >/dev/null
OUTBOX_RETENTION=30d OUTBOX_LISTEN=on ops_cli migrate --partition
[ "$ops_rc" = 0 ] || it_fail "migrate --partition with its own 30 days exited $ops_rc: $(cat "$it_dir/cli.err")"
[ "$(it_psql "SELECT to_regclass('$old_part') IS NOT NULL")" = t ] ||
	it_fail "a day within the command's own 30 days was dropped with no relay registered"
it_psql "INSERT INTO ${OUTBOX_TABLE}_replicas (id, version, started_at, last_seen_at, state, protocol, retention_ms)
  VALUES ('r/1', 'x', now(), now() + interval '1 hour', 'alive', 1, 3600000)" >/dev/null
OUTBOX_RETENTION=30d OUTBOX_LISTEN=on ops_cli migrate --partition
[ "$ops_rc" = 0 ] || it_fail "migrate --partition beside a relay of an hour exited $ops_rc: $(cat "$it_dir/cli.err")"
grep -q '^partitions made ahead: [012], dropped: 1, ' "$it_dir/cli.out" ||
	it_fail "the relays' hour did not drop the day: $(cat "$it_dir/cli.out")"
grep -q 'the relays keep rows for less time than this command' "$it_dir/cli.err" ||
	it_fail "the command did not say it went by the relay's retention: $(cat "$it_dir/cli.err")"
[ "$(it_count "type = 'old.day'")" = 0 ] || it_fail "the day's sent row outlived the relays' retention"
echo ok
