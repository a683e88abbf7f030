# SPDX-License-Identifier: MIT
# PgBouncer in front of the suite's Postgres for the pooler tests (source
# after lib.sh): bouncer_start starts one (tests/services/pgbouncer.sh,
# pool_mode = transaction), bouncer_stop stops it, bouncer_stop_all stops
# whatever is left (call it from the test's EXIT trap),
# bouncer_on_each_connection runs SQL on each of its server connections,
# bouncer_rounds delivers rounds of events through it.
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
	local reset="$1" n=${#bouncers[@]}
	shift
	bouncer_dir="$it_dir/pgbouncer-$n-$reset"
	mkdir -p "$bouncer_dir"
	bouncers+=("$bouncer_dir")
	env PGBOUNCER_POOL_SIZE=3 PGBOUNCER_RESET_ALWAYS="$reset" "$@" \
		bash "$bouncer_sh" start "$bouncer_dir" >"$it_dir/bouncer-$n.log" 2>&1 ||
		it_fail "pgbouncer did not start: $(cat "$it_dir/bouncer-$n.log")"
	bouncer_url=$(sed -n 's/^PGBOUNCER_URL=//p' "$bouncer_dir/env")
	bouncer_port=$(sed -n 's/^PGBOUNCER_PORT=//p' "$bouncer_dir/env")
}

bouncer_stop() {
	bash "$bouncer_sh" stop "$bouncer_dir"
}

# bouncer_on_each_connection SQL: SQL through the pool by 3 clients at
# once, one on each of its 3 server connections (each holds its own for a
# second); their output to conn-1..3.txt. Clients that did not land on
# three server backends (one started a second late) run again, three
# tries at most.
bouncer_on_each_connection() {
	local i try backends clients
	for try in 1 2 3; do
		clients=()
		rm -f "$it_dir"/conn-[123].pid
		for i in 1 2 3; do
			psql "$bouncer_url" -X -A -t -q -v ON_ERROR_STOP=1 \
				-c "BEGIN" -c "$1" -c "\\o $it_dir/conn-$i.pid" \
				-c "SELECT pg_backend_pid(), pg_sleep(1)" -c "COMMIT" \
				>"$it_dir/conn-$i.txt" 2>&1 &
			clients+=($!)
		done
		for i in "${clients[@]}"; do
			wait "$i" || it_fail "a client of the pool failed: $(cat "$it_dir"/conn-*.txt)"
		done
		backends=$(cat "$it_dir"/conn-[123].pid 2>/dev/null | sort -u | grep -c . || true)
		[ "$backends" = 3 ] && return 0
	done
	it_fail "3 clients at once never held the pool's 3 server connections ($backends backends, 3 tries)"
}

# bouncer_rounds NAME PID ROUNDS PER_ROUND: ROUNDS times PER_ROUND events
# of type pool.NAME inserted into $OUTBOX_TABLE, waited for in NAME.out
# (printed) and in the table (sent) while the relay PID runs, then
# DEALLOCATE ALL on each server connection of the pool.
bouncer_rounds() {
	local name=$1 pid=$2 rounds=$3 per=$4 r
	for r in $(seq "$rounds"); do
		it_psql "INSERT INTO $OUTBOX_TABLE (type, payload)
		         SELECT 'pool.$name', convert_to(json_build_object('r', $r, 'n', g)::text, 'UTF8')
		         FROM generate_series(1, $per) g"
		it_wait_lines 60 "$it_dir/$name.out" $((r * per))
		it_wait_count 30 "status = 'sent'" -eq $((r * per))
		kill -0 "$pid" 2>/dev/null || it_fail "the $name relay exited"
		bouncer_on_each_connection "DEALLOCATE ALL"
	done
}
