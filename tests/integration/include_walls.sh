#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The walls between the parts (docs/design.md §12): a part includes only
# the public header of a part below it, and only the store speaks libpq.
# The checker first proves it can fail (violations injected into copies,
# each must be reported at its file:line), then checks the real tree.
#
#   include_walls.sh                 self-test, then the tree
#   include_walls.sh --self-test     only the self-test
#   include_walls.sh --check DIR     only check DIR (a source tree)
set -euo pipefail

# check_tree DIR: prints one line per violation, "path:line: wall: what",
# and exits 1 when there is any.
check_tree() {
	python3 - "$1" <<'PY'
import os, re, sys

root = sys.argv[1]
PUBLIC = {
    "base": "base/base.h", "config": "config/config.h",
    "store": "store/store.h", "encode": "encode/encode.h",
    "publishers": "publishers/publisher.h", "loops": "loops/loops.h",
    "ops": "ops/ops.h",
}
BELOW = {
    "base": [],
    "config": ["base"],
    "store": ["base", "config"],
    "encode": ["base"],
    "publishers": ["base", "config", "encode"],
    "loops": ["base", "config", "store", "encode", "publishers"],
    "ops": ["base", "config", "store", "encode", "publishers", "loops"],
    "main": list(PUBLIC),
}
# System headers that belong to one place: (what, test, allowed prefix).
LIBS = [
    ("libpq", lambda h: h.startswith(("libpq-", "libpq/", "postgresql/")),
     "src/store/"),
    ("librabbitmq", lambda h: re.fullmatch(r"amqp(_\w+)?\.h", h) is not None
     or h.startswith("rabbitmq-c/"), "publishers/amqp"),
    ("librdkafka", lambda h: h.startswith("librdkafka/") or h == "rdkafka.h",
     "publishers/kafka"),
    ("libmicrohttpd", lambda h: h == "microhttpd.h", "src/ops/"),
]
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
PQ_CALL = re.compile(r"(?<![A-Za-z0-9_])(PQ\w*)\s*\(")

def part_of(path):
    top = path.split("/")
    if top[0] == "publishers":
        return "publishers"
    if len(top) == 2:
        return "main"  # src/main.c: outside every folder
    return top[1]

def without_comments(text):
    """Blank out comments and string/char literals, keeping line breaks."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(\\.|[^"\\\n])*"|\'(\\.|[^\'\\\n])*\'',
                  blank, text, flags=re.S)

def check_quoted(path, part, name):
    folder = os.path.dirname(path)
    if "/" not in name:
        if os.path.isfile(os.path.join(root, folder, name)):
            return None
        return f'includes "{name}", which is no file of {folder}/'
    if name.startswith("src/"):
        name = name[len("src/"):]
    target = name.split("/")[0]
    if target not in PUBLIC:
        return f'includes "{name}", which is no header of any part'
    if target == part:
        return None
    if target not in BELOW[part]:
        return f"{part} may not import {target} (includes \"{name}\")"
    if name != PUBLIC[target]:
        return (f'includes "{name}", a private header of {target} '
                f"(only {PUBLIC[target]} is public)")
    return None

def check_system(path, name):
    for lib, matches, prefix in LIBS:
        if matches(name) and not path.startswith(prefix):
            return f"<{name}> ({lib}) belongs only under {prefix}"
    return None

files = []
for top in ("src", "publishers"):
    for d, _, names in os.walk(os.path.join(root, top)):
        for n in names:
            if n.endswith((".c", ".h")):
                files.append(os.path.relpath(os.path.join(d, n), root))
if not files:
    print(f"FAIL: no sources under {root}/src or {root}/publishers")
    sys.exit(1)

bad = 0
for path in sorted(files):
    part = part_of(path)
    if part not in BELOW:
        print(f"{path}:1: walls: {path} is in no known part")
        bad += 1
        continue
    with open(os.path.join(root, path), encoding="utf-8",
              errors="replace") as f:
        text = f.read()
    for no, line in enumerate(text.split("\n"), 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        kind, name = m.groups()
        why = (check_quoted(path, part, name) if kind == '"'
               else check_system(path, name))
        if why:
            print(f"{path}:{no}: include wall: {why}")
            bad += 1
    if path.startswith("src/store/"):
        continue
    for no, line in enumerate(without_comments(text).split("\n"), 1):
        for m in PQ_CALL.finditer(line):
            print(f"{path}:{no}: libpq wall: calls {m.group(1)}() outside "
                  "src/store/")
            bad += 1
sys.exit(1 if bad else 0)
PY
}

# A small tree that keeps every wall: each part includes everything it may.
clean_tree() {
	local d=$1
	mkdir -p "$d/src/base" "$d/src/config" "$d/src/store" "$d/src/encode" \
		"$d/src/loops" "$d/src/ops" "$d/publishers"
	printf '#include <stdio.h>\n' >"$d/src/base/base.h"
	printf '#include "base.h"\n' >"$d/src/base/log.c"
	printf '#include "base/base.h"\n' >"$d/src/config/config.h"
	printf '#include "config.h"\n#include "base/base.h"\n' >"$d/src/config/config.c"
	printf '#include <libpq-fe.h>\n' >"$d/src/store/pgconn.h"
	printf '#include "base/base.h"\n#include "config/config.h"\n' >"$d/src/store/store.h"
	printf '#include "store.h"\n#include "pgconn.h"\n#include <libpq/libpq-fs.h>\nvoid f(void) { PQexec(0, ""); }\n' \
		>"$d/src/store/store.c"
	cp "$d/src/store/store.c" "$d/src/store/store_admin.c"
	printf '#include "base/base.h"\n' >"$d/src/encode/encode.h"
	printf '#include "encode.h"\n/* PQexec( in a comment */ const char *s = "PQexec(";\n' \
		>"$d/src/encode/cloudevent.c"
	printf '#include "config/config.h"\n#include "encode/encode.h"\n#include "base/base.h"\n' \
		>"$d/publishers/publisher.h"
	printf '#include "publisher.h"\n' >"$d/publishers/backends.h"
	printf '#include "backends.h"\n#include "publishers/backends.h"\n' >"$d/publishers/stdout.c"
	printf '#include "backends.h"\n#include <amqp.h>\n#include <amqp_tcp_socket.h>\n' \
		>"$d/publishers/amqp.c"
	printf '#include "backends.h"\n#include <librdkafka/rdkafka.h>\n' >"$d/publishers/kafka.c"
	printf '#include "config/config.h"\n#include "publishers/publisher.h"\n' >"$d/src/loops/loops.h"
	printf '#include "loops.h"\n#include "store/store.h"\n#include "encode/encode.h"\n#include "base/base.h"\n' \
		>"$d/src/loops/relay.c"
	printf '#include "loops/loops.h"\n' >"$d/src/ops/ops.h"
	printf '#include "ops.h"\n#include <microhttpd.h>\n#include "store/store.h"\n' >"$d/src/ops/http.c"
	{
		for h in base/base.h config/config.h store/store.h encode/encode.h \
			publishers/publisher.h loops/loops.h ops/ops.h; do
			printf '#include "%s"\n' "$h"
		done
	} >"$d/src/main.c"
}

# The injected violations: file, then the line appended to it.
injections=(
	'src/store/store.c|#include "publishers/publisher.h"'
	'publishers/kafka.c|#include "store/store.h"'
	'publishers/stdout.c|#include <libpq-fe.h>'
	'src/encode/cloudevent.c|#include "config/config.h"'
	'src/config/config.c|#include "publishers/publisher.h"'
	'src/store/store_admin.c|#include "loops/loops.h"'
	'src/base/log.c|#include "ops/ops.h"'
	'src/main.c|#include "store/pgconn.h"'
	'src/loops/relay.c|static void injected(void) { PQexec(0, "LISTEN x"); }'
	'src/loops/relay.c|#include <microhttpd.h>'
	'publishers/amqp.c|#include <librdkafka/rdkafka.h>'
	'src/ops/http.c|#include "nosuch.h"'
)

# inject_each BASE OUT: copies BASE once per injection and checks that the
# injected line is reported at its file:line.
inject_each() {
	local base=$1 work=$2 entry file line at copy fails=0
	for entry in "${injections[@]}"; do
		file=${entry%%|*}
		line=${entry#*|}
		copy=$work/copy
		rm -rf "$copy"
		mkdir -p "$copy"
		cp -R "$base/src" "$base/publishers" "$copy/"
		# a last line without its newline would swallow the injection
		[ -z "$(tail -c1 "$copy/$file")" ] || echo >>"$copy/$file"
		at=$(($(wc -l <"$copy/$file") + 1))
		printf '%s\n' "$line" >>"$copy/$file"
		if check_tree "$copy" >"$work/out"; then
			echo "FAIL: self-test: $file:$at ($line) passed the walls" >&2
			fails=$((fails + 1))
		elif ! grep -qF "$file:$at: " "$work/out"; then
			echo "FAIL: self-test: $file:$at ($line) not reported; got:" >&2
			cat "$work/out" >&2
			fails=$((fails + 1))
		fi
	done
	return "$fails"
}

self_test() {
	local root=$1
	clean_tree "$work/clean"
	if ! check_tree "$work/clean" >"$work/out"; then
		echo "FAIL: self-test: a tree that keeps every wall was refused:" >&2
		cat "$work/out" >&2
		return 1
	fi
	# The untouched copy of the real tree reports what the tree reports.
	mkdir -p "$work/real"
	cp -R "$root/src" "$root/publishers" "$work/real/"
	check_tree "$root" >"$work/want" || true
	check_tree "$work/real" >"$work/got" || true
	if ! diff -u "$work/want" "$work/got" >&2; then
		echo "FAIL: self-test: the copy of the tree checks differently" >&2
		return 1
	fi
	inject_each "$work/clean" "$work" || return 1
	inject_each "$work/real" "$work" || return 1
	echo "ok: self-test: ${#injections[@]} injected violations caught in a clean tree and in a copy of the tree"
}

root="${RELAY_TEST_SOURCE_ROOT:?run through meson test}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case "${1:-}" in
--self-test)
	self_test "$root"
	;;
--check)
	check_tree "${2:?--check DIR}"
	;;
"")
	self_test "$root"
	if ! check_tree "$root"; then
		echo "FAIL: includes above cross the walls between the parts (docs/design.md §12)" >&2
		exit 1
	fi
	echo "ok: every include in src/ and publishers/ keeps the walls"
	;;
*)
	echo "usage: include_walls.sh [--self-test | --check DIR]" >&2
	exit 2
	;;
esac
