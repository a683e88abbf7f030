# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Network namespaces for the partition tests: part_link NAME SUBNET makes
# (once) the namespace $part_ns and a veth pair whose host end is
# $SUBNET.1 and namespace end $SUBNET.2 (a /30), with the host end's name
# in part_if[NAME]. part_cut NAME / part_restore NAME take the host end
# down and up: no FIN, no RST, packets vanish. part_pg_listen makes the
# suite's Postgres also listen on one host end (restored on exit).
# Sourced after tests/integration/lib.sh; needs root and iproute2.
[ "$(id -u)" = 0 ] || it_fail "needs root to make a network namespace"
command -v ip >/dev/null || it_fail "needs ip (iproute2) for network namespaces"
: "${RELAY_TEST_PG_DIR:?run through tests/run.sh}"

part_ns="orpart$$"
part_n=$(($$ % 250 + 1))
declare -A part_if=()
part_pg_dir="$RELAY_TEST_PG_DIR"
part_pg_data=$(sed -n 's/^PG_DATA=//p' "$part_pg_dir/env")
part_pg_port=$(sed -n 's/^PGPORT=//p' "$part_pg_dir/env")
part_services="$RELAY_TEST_SOURCE_ROOT/tests/services"
part_pg_changed=0

part_teardown() {
	local name
	ip netns del "$part_ns" 2>/dev/null || true
	for name in "${!part_if[@]}"; do
		ip link del "${part_if[$name]}" 2>/dev/null || true
	done
	if [ "$part_pg_changed" = 1 ]; then
		# In place, so the files keep their owner (the server's user).
		sed -i "/# partition test/d" "$part_pg_data/pg_hba.conf"
		chown --reference="$part_pg_data" "$part_pg_data/pg_hba.conf"
		it_psql "ALTER SYSTEM RESET listen_addresses" >/dev/null 2>&1 || true
		bash "$part_services/postgres.sh" restart "$part_pg_dir" >/dev/null 2>&1 || true
	fi
}
trap 'part_teardown; it_cleanup' EXIT

part_link() {
	local name="$1" subnet="$2" host_if="or${1:0:1}h$$" ns_if="or${1:0:1}n$$"
	ip netns list | grep -qw "$part_ns" || {
		ip netns add "$part_ns" || it_fail "cannot create network namespace $part_ns"
		ip netns exec "$part_ns" ip link set lo up
	}
	ip link add "$host_if" type veth peer name "$ns_if" || it_fail "cannot create a veth pair"
	part_if[$name]=$host_if
	ip link set "$ns_if" netns "$part_ns"
	ip addr add "$subnet.1/30" dev "$host_if"
	ip link set "$host_if" up
	ip netns exec "$part_ns" ip addr add "$subnet.2/30" dev "$ns_if"
	ip netns exec "$part_ns" ip link set "$ns_if" up
}

part_cut() { ip link set "${part_if[$1]}" down; }
part_restore() { ip link set "${part_if[$1]}" up; }

# part_pg_listen SUBNET: Postgres also listens on SUBNET.1 and takes
# SUBNET.2's password logins; sets part_pg_url to reach it from there.
part_pg_listen() {
	local subnet="$1"
	part_pg_changed=1
	echo "host all all $subnet.2/32 scram-sha-256 # partition test" >>"$part_pg_data/pg_hba.conf"
	it_psql "ALTER SYSTEM SET listen_addresses = '127.0.0.1,$subnet.1'" >/dev/null
	bash "$part_services/postgres.sh" restart "$part_pg_dir" >/dev/null || it_fail "cannot restart postgres"
	part_pg_url=$(printf '%s' "$RELAY_TEST_DATABASE_URL" |
		sed "s/127\.0\.0\.1:$part_pg_port/$subnet.1:$part_pg_port/")
	[ "$part_pg_url" != "$RELAY_TEST_DATABASE_URL" ] || it_fail "cannot rewrite the database URL for $subnet.1"
}

# part_secs T0 T1: seconds between two `date +%s.%N` readings, one decimal.
part_secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
