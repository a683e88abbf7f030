# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Shared helpers for the throwaway test services in this directory: free
# loopback ports, bounded waits, error reports with the service log, and
# running a command as a service account. Sourced, never executed.

# Prints an error with the script's name and exits 1.
svc_die() {
	printf '%s: %s\n' "${svc_name:-service}" "$*" >&2
	exit 1
}

svc_warn() {
	printf '%s: warning: %s\n' "${svc_name:-service}" "$*" >&2
}

# svc_fail MESSAGE LOGFILE...: error exit that shows the first error lines
# and the end of each log, since "did not start" alone never says why (and
# a crashing Erlang node buries the reason under its stack dump). Calls
# svc_on_fail first, if the script defines it, to stop what it started.
svc_fail() {
	local msg="$1" log
	shift
	printf '%s: %s\n' "${svc_name:-service}" "$msg" >&2
	local errors
	for log in "$@"; do
		[ -s "$log" ] || continue
		errors=$(grep -m 5 -i -E 'error|fatal|panic' "$log" || true)
		if [ -n "$errors" ]; then
			printf -- '--- first error lines of %s ---\n%s\n' "$log" "$errors" >&2
		fi
		printf -- '--- last lines of %s ---\n' "$log" >&2
		tail -n 30 "$log" >&2
	done
	if declare -F svc_on_fail >/dev/null; then
		svc_on_fail >/dev/null 2>&1 || true
	fi
	exit 1
}

# svc_check_dir DIR: the caller's scratch directory must exist and have a
# plain path, because it ends up unquoted in the env file and in service
# configuration files.
svc_check_dir() {
	local dir="$1"
	[ -n "$dir" ] || svc_die "missing DIR argument"
	case "$dir" in
	/*) ;;
	*) svc_die "DIR must be an absolute path: '$dir'" ;;
	esac
	case "$dir" in
	*[!A-Za-z0-9._/-]*) svc_die "DIR may contain only letters, digits and ._/- : '$dir'" ;;
	esac
	[ -d "$dir" ] || svc_die "DIR does not exist: '$dir' (create it with mktemp -d)"
}

# svc_free_port [TAKEN...]: prints a TCP port that is free on 127.0.0.1 and
# not among TAKEN. Starts at a random port in 20000-39999 so concurrent test
# runs rarely probe the same ports; binding (not connecting) is the test, so
# listeners on 0.0.0.0 and ports in TIME_WAIT also count as taken.
svc_free_port() {
	python3 - "$@" <<'EOF'
import random, socket, sys
taken = {int(p) for p in sys.argv[1:]}
lo, hi = 20000, 40000
start = random.randrange(lo, hi)
for i in range(hi - lo):
    port = lo + (start - lo + i) % (hi - lo)
    if port in taken:
        continue
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    sys.exit(0)
sys.exit("no free port in %d-%d" % (lo, hi - 1))
EOF
}

# svc_port_listening PORT: true if something accepts TCP on 127.0.0.1:PORT.
svc_port_listening() {
	python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(1)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
EOF
}

# svc_wait SECONDS COMMAND...: retries COMMAND every 0.2 s until it succeeds
# or SECONDS have passed; returns 1 on timeout. COMMAND exits 99 to give up
# at once (the service died): the wait then returns 99.
svc_wait() {
	local deadline=$((SECONDS + $1)) rc
	shift
	while :; do
		rc=0
		"$@" >/dev/null 2>&1 || rc=$?
		[ "$rc" -ne 0 ] || return 0
		[ "$rc" -ne 99 ] || return 99
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.2
	done
}

# svc_as USER COMMAND...: runs COMMAND as USER when we are root (services
# refuse to run as root or would leave root-owned files), else as ourselves.
svc_as() {
	local user="$1"
	shift
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u "$user" -- "$@"
	else
		"$@"
	fi
}

# svc_env_get FILE KEY: prints KEY's value from an env file we wrote.
svc_env_get() {
	local file="$1" key="$2" line
	[ -r "$file" ] || return 1
	while IFS= read -r line; do
		case "$line" in
		"$key="*)
			printf '%s\n' "${line#*=}"
			return 0
			;;
		esac
	done <"$file"
	return 1
}
