#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The binary is built hardened (meson.build, docs/security.md): read with
# readelf, it must be a PIE, have full RELRO (a GNU_RELRO segment and
# BIND_NOW), call __stack_chk_fail (stack canaries) and, unless the build
# is a sanitizer or unoptimized build, import fortified __*_chk functions
# (_FORTIFY_SOURCE).
#
# First it proves the checks can fail: a small program compiled with
# every flag passes, and compiled five more times, each time without one
# flag, is refused naming exactly that flag. Then it checks the relay
# built by this build directory, expecting what that build's own options
# (meson introspect) say meson.build must have added.
#
#   hardening.sh                      the test (through meson test)
#   hardening.sh --check BIN [--no-fortify]
#                                     check one binary; exit 1 naming gaps
set -euo pipefail

# Prints one line per missing protection of $1; $2 = 1 expects fortify.
gaps() {
	local bin=$1 fortify=$2 dyn syms
	dyn=$(readelf -dW "$bin")
	syms=$(readelf --dyn-syms -W "$bin")
	readelf -hW "$bin" | grep -Eq 'Type:[[:space:]]+DYN' &&
		grep -Eq 'FLAGS_1.*\bPIE\b' <<<"$dyn" || echo "pie"
	readelf -lW "$bin" | grep -q 'GNU_RELRO' || echo "relro"
	grep -Eq '\(FLAGS\).*\bBIND_NOW\b|FLAGS_1.*\bNOW\b' <<<"$dyn" ||
		echo "bind-now"
	grep -q ' __stack_chk_fail' <<<"$syms" || echo "stack-protector"
	if [ "$fortify" = 1 ]; then
		grep -Eq ' __[a-z0-9_]+_chk(@|$| )' <<<"$syms" || echo "fortify"
	fi
	return 0
}

if [ "${1:-}" = "--check" ]; then
	bin=${2:?usage: hardening.sh --check BIN [--no-fortify]}
	fortify=1
	[ "${3:-}" = "--no-fortify" ] && fortify=0
	missing=$(gaps "$bin" "$fortify")
	if [ -n "$missing" ]; then
		echo "FAIL: $bin is not hardened, missing: $(echo $missing)" >&2
		exit 1
	fi
	echo "hardened: $bin (pie relro bind-now stack-protector$([ "$fortify" = 1 ] && echo ' fortify'))"
	exit 0
fi

: "${RELAY_TEST_BIN:?run through meson test (tests/run.sh)}"
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-hardening.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
	echo "FAIL: $*" >&2
	failures=$((failures + 1))
}

# --- The checks can fail ----------------------------------------------------
cat >"$work/sample.c" <<'EOF'
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
	char buf[64];
	size_t n = strlen(argv[0]) % sizeof(buf);
	memcpy(buf, argv[0], n);
	snprintf(buf, sizeof(buf), "%s %d", argv[0], argc);
	puts(buf);
	return 0;
}
EOF
cc=${CC:-cc}
full=(-O2 -fstack-protector-strong -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=2
	-fPIE -pie -Wl,-z,relro -Wl,-z,now)
# name : the flags that take that one protection away (appended last)
declare -A without=(
	[pie]="-fno-PIE -no-pie"
	[relro]="-Wl,-z,norelro"
	[bind-now]="-Wl,-z,lazy"
	[stack-protector]="-fno-stack-protector"
	[fortify]="-U_FORTIFY_SOURCE"
)
"$cc" "${full[@]}" -o "$work/full" "$work/sample.c"
got=$(gaps "$work/full" 1)
[ -z "$got" ] || fail "a sample built with every flag is reported missing: $got"
for name in "${!without[@]}"; do
	# shellcheck disable=SC2206
	extra=(${without[$name]})
	"$cc" "${full[@]}" "${extra[@]}" -o "$work/$name" "$work/sample.c"
	got=$(gaps "$work/$name" 1 | tr '\n' ' ')
	[ "$got" = "$name " ] ||
		fail "a sample built without $name is reported as missing '${got% }', not '$name'"
done

# --- The relay as this build made it ----------------------------------------
builddir=$(dirname "$RELAY_TEST_BIN")
options=$(meson introspect --buildoptions "$builddir")
option() {
	jq -r --arg n "$1" '.[] | select(.name == $n) | .value | tostring' <<<"$options"
}
optimization=$(option optimization)
sanitize=$(option b_sanitize)
fortify=1
case "$optimization" in plain | 0) fortify=0 ;; esac
[ "$sanitize" = none ] || fortify=0
echo "build: optimization=$optimization b_sanitize=$sanitize (fortify expected: $fortify)"
for bin in "$RELAY_TEST_BIN"; do
	missing=$(gaps "$bin" "$fortify")
	[ -z "$missing" ] || fail "$bin is not hardened, missing: $(echo $missing)"
done
# A sanitizer build must still not be fortified (meson.build leaves it out).
if [ "$sanitize" != none ] &&
	readelf --dyn-syms -W "$RELAY_TEST_BIN" | grep -v ' __stack_chk_fail' |
	grep -Eq ' __[a-z0-9_]+_chk(@|$| )'; then
	fail "the sanitizer build imports fortified __*_chk functions"
fi

[ "$failures" -eq 0 ] || exit 1
echo "hardening: the checks fail on each missing flag; $RELAY_TEST_BIN is hardened"
