# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# What the experiments (history_shapes.sh, ordered_shapes.sh,
# repair_scan.sh) share: a Postgres of their own with full-page writes on
# and the relay's table migrated into it, q for psql, and the WAL and
# Postgres CPU spent between shapes_mark and shapes_since (in $wal bytes
# and $ticks clock ticks), relay_ticks for the relay's own sessions, and
# statements_on for pg_stat_statements.
# Sourced after `set -euo pipefail`, with root set to the repository.
: "${RELAY_TEST_BIN:?set RELAY_TEST_BIN to an outbox-relay binary}"
work=$(mktemp -d)
chmod 755 "$work"
mkdir "$work/pg"
trap 'bash "$root/tests/services/postgres.sh" stop "$work/pg" >/dev/null 2>&1; rm -rf "$work"' EXIT
bash "$root/tests/services/postgres.sh" start "$work/pg" >/dev/null
set -a
# shellcheck disable=SC1091 # written by postgres.sh start
. "$work/pg/env"
set +a
export PGPASSWORD=outbox-test-secret PGUSER=outbox PGDATABASE=outbox
psql -qAt -c "ALTER SYSTEM SET full_page_writes = on" \
	-c "ALTER SYSTEM SET max_wal_size = '4GB'" -c "SELECT pg_reload_conf()" >/dev/null
OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL "$RELAY_TEST_BIN" migrate >/dev/null
tk=$(getconf CLK_TCK)
q() { psql -qAtX "$@"; }
# The CPU of the postmaster and every backend, in clock ticks.
pgcpu() {
	local pm t=0
	pm=$(head -1 "$PG_DATA/postmaster.pid")
	for p in $pm $(pgrep -P "$pm"); do
		[ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14+$15+$16+$17}' "/proc/$p/stat")))
	done
	echo $t
}
# The CPU of the relay's sessions (their backends, by application
# name, found now), in clock ticks.
relay_ticks() {
	local t=0 p
	for p in $(q -c "SELECT pid FROM pg_stat_activity WHERE
	                 application_name LIKE 'outbox-relay/%'"); do
		[ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat")))
	done
	echo $t
}
shapes_mark() {
	sleep 1
	lsn=$(q -c "SELECT pg_current_wal_lsn()")
	cpu=$(pgcpu)
}
shapes_since() {
	sleep 1
	wal=$(q -c "SELECT pg_current_wal_lsn() - '$lsn'::pg_lsn")
	ticks=$(($(pgcpu) - cpu))
}
# pg_stat_statements loaded (a restart: it loads at start only) and
# created, planning time tracked.
statements_on() {
	q -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'" >/dev/null
	runuser -u postgres -- "$PG_BIN/pg_ctl" restart -D "$PG_DATA" -w >/dev/null
	q -c "CREATE EXTENSION pg_stat_statements" \
		-c "ALTER SYSTEM SET pg_stat_statements.track_planning = on" \
		-c "SELECT pg_reload_conf()" >/dev/null
}
# A UUIDv7 prefix of the time expression $1, as the dbcost section makes
# a partition's bounds.
v7() {
	q -c "SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) ||
	      '-0000-0000-000000000000' FROM (SELECT lpad(to_hex((extract(epoch
	      FROM $1) * 1000)::bigint), 12, '0') AS h) x"
}
# Table $1 made partitioned by the binary's `migrate --partition`, and a
# partition of today for the rows about to be written, made as the dbcost
# section makes it: the next minutes' ids, with the storage parameters the
# binary gave tomorrow's partition.
partitioned_today() {
	local t=$1 lo hi tag made
	OUTBOX_DATABASE_URL=$RELAY_TEST_DATABASE_URL OUTBOX_TABLE=$t \
		OUTBOX_LISTEN=off "$RELAY_TEST_BIN" migrate --partition --quiet >/dev/null
	lo=$(v7 "now()")
	hi=$(v7 "least(now() + interval '10 minutes', (date_trunc('day', now()
	     AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC')")
	tag=$(q -c "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')")
	made=$(q -c "SELECT array_to_string(reloptions, ', ') FROM pg_class
	             WHERE oid = to_regclass('${t}_p' || to_char(now() AT TIME
	             ZONE 'UTC' + interval '1 day', 'YYYYMMDD'))")
	q -c "CREATE TABLE ${t}_p$tag PARTITION OF $t FOR VALUES FROM ('$lo')
	      TO ('$hi') WITH ($made)" >/dev/null
}
# Calls $2 for every round of $ROUNDS and every case of $1, with the
# round, the case and the cell's number (1, 2, ...): the cases take turns
# in each round, so the machine's drift hits them alike.
each_cell() {
	local round c n=0
	for round in $(seq "$ROUNDS"); do
		for c in $1; do
			n=$((n + 1))
			"$2" "$round" "$c" "$n"
		done
	done
}
