#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fifty tenant schemas behind one relay (docs/design.md §13): `migrate`
# creates them all; an idle relay does not lease each idle table every
# poll interval (one statistics read says which tables had rows); a
# tenant's first event goes out within a poll interval and the
# statistics' flush; with LISTEN on, a notification makes its own table
# due and no other.
. "$(dirname "$0")/lib.sh"
it_table tenants
schema="${OUTBOX_TABLE%%.*}"
it_psql "DROP SCHEMA $schema CASCADE" >/dev/null
tables=""
for i in $(seq 1 50); do tables="$tables,${schema}_t$i.outbox_events"; done
tables="${tables#,}"
cleanup_tenants() {
	for i in $(seq 1 50); do echo "DROP SCHEMA IF EXISTS ${schema}_t$i CASCADE;"; done |
		psql "$RELAY_TEST_DATABASE_URL" -X -q >/dev/null 2>&1 || true
}
trap 'cleanup_tenants; it_cleanup' EXIT
env OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL" OUTBOX_TABLE="$tables" OUTBOX_LISTEN=on \
	"$RELAY_TEST_BIN" migrate --quiet >"$it_dir/migrate.out" 2>&1 ||
	it_fail "migrate of 50 tables failed: $(tail -3 "$it_dir/migrate.out")"
[ "$(grep -c 'is at schema version' "$it_dir/migrate.out")" = 50 ] || it_fail "migrate did not do 50 tables"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
leases() { curl -sf "http://127.0.0.1:$port/metrics" | awk '/^outbox_leases_total /{print $2}'; }
printed() { [ "$(grep -c "\"type\":\"$1\"" "$it_dir/$2.out")" -ge "$3" ]; }
# Leases over 3 s once the relay has leased every table once.
idle_leases() {
	it_wait 30 "the relay's metrics" leases
	sleep 3
	local a b
	a=$(leases)
	sleep 3
	b=$(leases)
	echo $((b - a))
}

# Polling: 50 idle tables, 200 ms poll interval. Leasing each would be 750
# leases in 3 s; the statistics read leaves the 60 s backstop alone.
OUTBOX_TABLE="$tables" it_relay poll OUTBOX_HTTP_ADDR="127.0.0.1:$port"
pid=$it_last_pid
n=$(idle_leases)
[ "$n" -le 5 ] || it_fail "an idle relay of 50 tables leased $n times in 3 s"
it_psql "INSERT INTO ${schema}_t37.outbox_events (type, payload) VALUES ('first', '\\x7b7d')" >/dev/null
started=$SECONDS
it_wait 5 "a tenant's first event" printed first poll 1
took_poll=$((SECONDS - started))
it_stop "$pid"

# LISTEN: the notification wakes its table alone.
OUTBOX_TABLE="$tables" it_relay listen OUTBOX_HTTP_ADDR="127.0.0.1:$port" OUTBOX_LISTEN=on
pid=$it_last_pid
it_wait 30 "the relay's metrics" leases
sleep 3
a=$(leases)
for i in 1 2 3 4 5; do
	it_psql "INSERT INTO ${schema}_t$((i * 7)).outbox_events (type, payload) VALUES ('woken', '\\x7b7d')" >/dev/null
	sleep 0.3
done
it_wait 5 "the notified tables' events" printed woken listen 5
b=$(leases)
# Five events in five tables: a lease or two each, not a lease of every
# table per notification (250).
[ $((b - a)) -le 20 ] || it_fail "$((b - a)) leases for 5 notified events in 50 tables"
it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "relay exit code $it_rc"
echo "ok: 50 tables: $n leases in 3 s idle; first event within ${took_poll}s; 5 notified events took $((b - a)) leases"
