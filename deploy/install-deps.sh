#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the Debian packages listed in deploy/packages.txt (build, test
# services, tools). Does nothing, not even `apt-get update`, when every
# listed package is already installed, so test runs can call it each time.
#
# Usage: install-deps.sh [--only SECTION[,SECTION...]] [--check] [--clean]
#                        [--list FILE]
#   --only   install only the named sections of the list (e.g. "build")
#   --check  install nothing; exit 1 and name the missing packages, if any
#   --clean  remove apt's package lists afterwards (smaller image layers)
#   --list   read another package list instead of the one next to this script
#
# Works as root (a Dockerfile RUN step) or as a user with sudo. Package
# scripts may start system services (PostgreSQL on 5432, RabbitMQ on 5672);
# the test scripts never use those ports, so such services are left alone.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
list_file="$script_dir/packages.txt"
only=""
check_only=0
clean=0

die() {
	printf 'install-deps: %s\n' "$*" >&2
	exit 1
}

usage() {
	sed -n '7,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case "$1" in
	--only)
		[ $# -ge 2 ] || usage
		only="$2"
		shift 2
		;;
	--check)
		check_only=1
		shift
		;;
	--clean)
		clean=1
		shift
		;;
	--list)
		[ $# -ge 2 ] || usage
		list_file="$2"
		shift 2
		;;
	-h | --help) usage ;;
	*)
		printf 'install-deps: unknown argument: %s\n' "$1" >&2
		usage
		;;
	esac
done

[ -r "$list_file" ] || die "cannot read package list '$list_file'"

# Prints the packages of the wanted sections, one per line.
read_list() {
	awk -v only=",$only," '
		/^#[[:space:]]*section:/ {
			sub(/^#[[:space:]]*section:[[:space:]]*/, "")
			section = $1
			next
		}
		{ sub(/#.*/, "") }
		NF == 0 { next }
		NF > 1 { printf "install-deps: bad line %d: %s\n", NR, $0 > "/dev/stderr"; bad = 1; next }
		only == ",," || index(only, "," section ",") { print $1 }
		END { exit bad }
	' "$list_file"
}

selected=$(read_list) || die "malformed package list '$list_file'"
packages=()
[ -z "$selected" ] || mapfile -t packages <<<"$selected"
[ ${#packages[@]} -gt 0 ] || die "no packages selected from '$list_file' (--only '$only')"

missing=()
for pkg in "${packages[@]}"; do
	status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
	# "ii " is installed; anything else (absent, half-configured) needs apt.
	case "$status" in
	ii*) ;;
	*) missing+=("$pkg") ;;
	esac
done

if [ ${#missing[@]} -eq 0 ]; then
	echo "install-deps: all ${#packages[@]} packages already installed"
	exit 0
fi

echo "install-deps: missing: ${missing[*]}"
[ "$check_only" -eq 0 ] || exit 1

if [ "$(id -u)" -eq 0 ]; then
	as_root=()
elif command -v sudo >/dev/null 2>&1; then
	as_root=(sudo)
else
	die "need root or sudo to install: ${missing[*]}"
fi

command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install by hand: ${missing[*]}"

"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update \
	|| die "apt-get update failed"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y \
	--no-install-recommends "${missing[@]}" \
	|| die "apt-get install failed for: ${missing[*]}"

if [ "$clean" -eq 1 ]; then
	"${as_root[@]}" apt-get clean
	"${as_root[@]}" rm -rf /var/lib/apt/lists/*
fi

echo "install-deps: installed ${#missing[@]} packages"
