#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A PgBouncer newer than the machine's, for tests that need one: Debian
# 12 has PgBouncer 1.18, which keeps no prepared statements of its own;
# 1.21 and later do (max_prepared_statements, on by default from 1.24).
# This fetches the source of the pgbouncer package of a later Debian
# release (trixie unless PGBOUNCER_SUITE says otherwise) with apt itself,
# from the mirror the machine's apt already uses and checked against
# that release's signed index, and builds it into DIR.
#
# Usage: pgbouncer_build.sh DIR   builds; prints the path of the binary
#
# DIR comes from `mktemp -d` (the source and the build go there too).
# The build needs libevent-dev (deploy/install-deps.sh installs it).
set -euo pipefail

# shellcheck disable=SC2034 # read by lib.sh
svc_name=pgbouncer_build.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly keyring=/usr/share/keyrings/debian-archive-keyring.gpg

[ $# -eq 1 ] || { sed -n '12p' "${BASH_SOURCE[0]}" | sed 's/^# //' >&2; exit 2; }
dir=$1
svc_check_dir "$dir"
suite=${PGBOUNCER_SUITE:-trixie}
for tool in apt-get make cc pkg-config; do
	command -v "$tool" >/dev/null 2>&1 || svc_die "$tool not found (run deploy/install-deps.sh)"
done
pkg-config --exists libevent || svc_die "libevent-dev is not installed (run deploy/install-deps.sh)"
[ -r "$keyring" ] || svc_die "no Debian archive keyring at $keyring"
# The Debian mirror apt is set up with (not its security archive).
# shellcheck disable=SC2016 # apt's own format, not the shell's
mirror=$(apt-get indextargets --format '$(REPO_URI)' | sort -u | grep -v -- '-security/$' | head -n 1)
[ -n "$mirror" ] || svc_die "apt is set up with no Debian mirror"

# apt's lists and caches of its own, so the machine's stay as they were.
mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/src"
echo "deb-src [signed-by=$keyring] $mirror $suite main" >"$dir/apt/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
	-o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache"
	-o "APT::Sandbox::User=root" -q)
apt-get "${apt_opts[@]}" update >"$dir/apt.log" 2>&1 ||
	svc_fail "apt could not read the $suite sources from $mirror" "$dir/apt.log"
(cd "$dir/src" && apt-get "${apt_opts[@]}" source --download-only pgbouncer) >>"$dir/apt.log" 2>&1 ||
	svc_fail "apt could not fetch the source of pgbouncer ($suite)" "$dir/apt.log"
orig=$(find "$dir/src" -maxdepth 1 -name 'pgbouncer_*.orig.tar.*' | head -n 1)
[ -n "$orig" ] || svc_fail "no upstream tarball among what apt fetched" "$dir/apt.log"
tar -xf "$orig" -C "$dir/src"
top=$(find "$dir/src" -maxdepth 1 -type d -name 'pgbouncer-*' | head -n 1)
[ -n "$top" ] || svc_die "the tarball $orig holds no pgbouncer-* directory"
(cd "$top" && ./configure --prefix="$dir/install" --without-cares --without-pam \
	--without-systemd && make -j"$(nproc)" && make install) >"$dir/build.log" 2>&1 ||
	svc_fail "building $(basename "$top") failed" "$dir/build.log"
# pgbouncer.sh runs it as user postgres.
chmod -R a+rX "$dir"
"$dir/install/bin/pgbouncer" --version >/dev/null || svc_die "the pgbouncer built does not run"
echo "$dir/install/bin/pgbouncer"
