#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The relay as the deployments run it (image USER 10001, runAsNonRoot,
# readOnlyRootFilesystem, capabilities dropped, DynamicUser): as user
# nobody with no capabilities, no_new_privs, no HOME, in a working
# directory it cannot write, HTTP on an unprivileged port. It relays
# events enqueued with the producer helper, serves /healthz, /readyz and
# /metrics (including every metric docs/deployment.md names), exits 0 on
# SIGTERM, and leaves no file behind anywhere it could write.
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

if [ "$(id -u)" -ne 0 ]; then
	echo "SKIP: switching to user nobody needs root"
	exit 77
fi
root=${RELAY_TEST_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
it_table unpriv

# The binary in a root-owned directory nobody may read but not write; it
# is also the working directory.
ro=$(mktemp -d "${TMPDIR:-/tmp}/outbox-ro.XXXXXX")
trap 'rm -rf "$ro"; it_cleanup' EXIT
install -m 0555 "$RELAY_TEST_BIN" "$ro/outbox-relay"
chmod 0555 "$ro"
as_nobody=(setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups
	--no-new-privs --inh-caps=-all --bounding-set=-all)
"${as_nobody[@]}" test -x "$ro/outbox-relay" ||
	it_fail "user nobody cannot reach $ro (a private TMPDIR?)"
tree() { find "$ro" -printf '%p %m %s %T@\n'; }
before=$(tree)

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
touch "$it_dir/marker"
sleep 0.05

vars=(
	PATH=/usr/bin:/bin
	OUTBOX_DATABASE_URL="$RELAY_TEST_DATABASE_URL"
	OUTBOX_TABLE="$OUTBOX_TABLE"
	OUTBOX_PUBLISHER=stdout
	OUTBOX_HTTP_ADDR="127.0.0.1:$port"
	OUTBOX_POLL_INTERVAL=200ms
	OUTBOX_LOG_FORMAT=json
)
for san in ASAN_OPTIONS UBSAN_OPTIONS; do
	[ -z "${!san:-}" ] || vars+=("$san=${!san}")
done
# setpriv and env exec (no child in between), so $! is the relay itself
# and SIGTERM reaches it directly, as tini or systemd would deliver it.
(
	cd "$ro" || exit 1
	exec "${as_nobody[@]}" env -i "${vars[@]}" ./outbox-relay run
) >"$it_dir/relay.out" 2>"$it_dir/relay.log" &
pid=$!
it_pids+=("$pid")

it_wait 20 "/healthz on port $port" curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz"
[ "$(ps -o user= -p "$pid")" = nobody ] || it_fail "relay runs as $(ps -o user= -p "$pid"), not nobody"
grep -q '^NoNewPrivs:[[:space:]]*1' "/proc/$pid/status" || it_fail "no_new_privs is not set"
grep -q '^CapEff:[[:space:]]*0*$' "/proc/$pid/status" || it_fail "the relay has effective capabilities"

it_psql "SELECT ${OUTBOX_TABLE}_enqueue_json('com.example.order.created',
             jsonb_build_object('n', g), 'customer-' || (g % 3))
         FROM generate_series(1, 50) g" >/dev/null
it_wait_count 30 "status = 'sent'" -eq 50
it_wait_lines 10 "$it_dir/relay.out" 50
jq -r .id "$it_dir/relay.out" | sort >"$it_dir/published.ids" ||
	it_fail "stdout is not one JSON event per line"
it_psql "SELECT id FROM $OUTBOX_TABLE ORDER BY id" | sort >"$it_dir/table.ids"
cmp -s "$it_dir/published.ids" "$it_dir/table.ids" || it_fail "published ids differ from the table's"

# The image's HEALTHCHECK command, run as Docker runs it (sh -c).
health=$(awk '
	/^[[:space:]]*#/ && !cont { next }
	{
		if (cont) sub(/^[[:space:]]+/, "")
		line = cont ? line $0 : $0
		if (sub(/\\$/, "", line)) { cont = 1; next }
		cont = 0
		print line
		line = ""
	}' "$root/deploy/Dockerfile" | sed -n 's/^HEALTHCHECK\( --[a-z-]*=[^ ]*\)* CMD //p')
[ -n "$health" ] || it_fail "no HEALTHCHECK CMD in deploy/Dockerfile"
OUTBOX_HTTP_ADDR="0.0.0.0:$port" sh -c "$health" ||
	it_fail "the image's HEALTHCHECK fails against a healthy relay: $health"
if OUTBOX_HTTP_ADDR="0.0.0.0:1" sh -c "$health" 2>/dev/null; then
	it_fail "the image's HEALTHCHECK passes with nothing listening"
fi

it_wait 20 "/readyz to answer 200" curl -fsS -o /dev/null "http://127.0.0.1:$port/readyz"
curl -fsS "http://127.0.0.1:$port/metrics" >"$it_dir/metrics.txt" || it_fail "GET /metrics failed"
[ -f "$root/docs/deployment.md" ] || it_fail "missing docs/deployment.md"
# Every outbox_* name the deployment guide mentions, except the default
# table and its derived objects and the example database roles.
metrics=0
while IFS= read -r metric; do
	grep -q "^# TYPE $metric " "$it_dir/metrics.txt" ||
		it_fail "docs/deployment.md names $metric, which /metrics does not expose"
	metrics=$((metrics + 1))
done < <(grep -o '\boutbox_[a-z_]*[a-z]' "$root/docs/deployment.md" |
	grep -v -e '^outbox_events' -e '^outbox_relay$' -e '^outbox_owner$' | sort -u)
[ "$metrics" -ge 5 ] || it_fail "docs/deployment.md names only $metrics metrics"

it_stop "$pid"
[ "$it_rc" = 0 ] || it_fail "SIGTERM exit code $it_rc, want 0"

# Nothing written: not in the working directory, not in any directory
# every user may write, and no attempt refused either.
[ "$(tree)" = "$before" ] || it_fail "the working directory changed"
created=$(find /tmp /var/tmp /dev/shm /run/lock ${TMPDIR:+"$TMPDIR"} \
	-newer "$it_dir/marker" -user nobody 2>/dev/null || true)
[ -z "$created" ] || it_fail "files created as nobody: $created"
if grep -Eqi 'permission denied|read-only file system' "$it_dir/relay.log"; then
	it_fail "the relay tried to write somewhere"
fi
echo "deploy_unprivileged: 50 events relayed as nobody, $metrics documented metrics served, no file written"
