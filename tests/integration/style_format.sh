#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The C sources follow the repository's .clang-format.
set -euo pipefail
root="${RELAY_TEST_SOURCE_ROOT:?run through meson test}"
cd "$root"
files=$(git ls-files 'src/*.[ch]' 'publishers/*.[ch]' 'tests/*.[ch]' 2>/dev/null ||
	find src publishers tests -name '*.[ch]')
[ -n "$files" ] || { echo "FAIL: no sources found"; exit 1; }
# shellcheck disable=SC2086
if ! clang-format --dry-run --Werror $files; then
	echo "FAIL: run clang-format -i on the files above" >&2
	exit 1
fi
echo "ok: $(echo "$files" | wc -w) files formatted"
