# SPDX-License-Identifier: MIT
# PgBouncer in front of the suite's Postgres for the pooler tests (source
# after lib.sh): bouncer_start starts one (tests/services/pgbouncer.sh,
# pool_mode = transaction), bouncer_stop stops it, bouncer_stop_all stops
# whatever is left (call it from the test's EXIT trap).
: "${RELAY_TEST_SOURCE_ROOT:?run through meson test}"
: "${PGPORT:?run through tests/run.sh}"
bouncer_sh="$RELAY_TEST_SOURCE_ROOT/tests/services/pgbouncer.sh"
bouncers=()
# pgbouncer runs as the service account, in directories under this one.
chmod 755 "$it_dir"

bouncer_stop_all() {
	local d
	for d in "${bouncers[@]}"; do
		bash "$bouncer_sh" stop "$d" >/dev/null 2>&1 || true
	done
}

# bouncer_start RESET [VAR=VALUE...]: a pool of 3 server connections with
# server_reset_query_always = RESET and pgbouncer.sh's other settings as
# given. Sets bouncer_dir, bouncer_url and bouncer_port.
bouncer_start() {
	local reset="$1"
	shift
	bouncer_dir="$it_dir/pgbouncer-$reset"
	mkdir -p "$bouncer_dir"
	bouncers+=("$bouncer_dir")
	env PGBOUNCER_POOL_SIZE=3 PGBOUNCER_RESET_ALWAYS="$reset" "$@" \
		bash "$bouncer_sh" start "$bouncer_dir" >"$it_dir/bouncer-$reset.log" 2>&1 ||
		it_fail "pgbouncer did not start: $(cat "$it_dir/bouncer-$reset.log")"
	bouncer_url=$(sed -n 's/^PGBOUNCER_URL=//p' "$bouncer_dir/env")
	bouncer_port=$(sed -n 's/^PGBOUNCER_PORT=//p' "$bouncer_dir/env")
}

bouncer_stop() {
	bash "$bouncer_sh" stop "$bouncer_dir"
}
