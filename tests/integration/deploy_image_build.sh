#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Dockerfile's build stage without Docker: its RUN steps after the
# sources are copied, run as written in a copy of the build context (the
# repository minus the patterns of deploy/Dockerfile.dockerignore). The
# image is the only release build (-O3 with the project's -Werror) and its
# unit suite gates the image, so both must pass here or the image cannot
# be built; its binary must carry every hardening flag (hardening.sh).
# The dependency step is checked with --check: the test command has
# installed the same package list already.
set -euo pipefail

root=${RELAY_TEST_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-deploy-image.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

dockerfile="$root/deploy/Dockerfile"
# Instructions one per line (continuations joined), build stage only.
awk '
	/^[[:space:]]*#/ && !cont { next }
	{
		if (cont) sub(/^[[:space:]]+/, "")
		line = cont ? line $0 : $0
		if (sub(/\\$/, "", line)) { cont = 1; next }
		cont = 0
		if (line ~ /^FROM /) stage++
		if (stage == 1 && line !~ /^[[:space:]]*$/) print line
		line = ""
	}' "$dockerfile" >"$work/build-stage"

grep -qx 'RUN deploy/install-deps.sh --only build.*' "$work/build-stage" ||
	fail "the build stage does not install with deploy/install-deps.sh --only build"
grep -qx 'COPY \. \.' "$work/build-stage" || fail "the build stage does not COPY . ."
sed -n '/^COPY \. \.$/,$ { s/^RUN //p }' "$work/build-stage" >"$work/steps"
[ -s "$work/steps" ] || fail "no RUN step after COPY . . in the build stage"

"$root/deploy/install-deps.sh" --only build --check >"$work/deps.out" 2>&1 ||
	fail "build dependencies: $(cat "$work/deps.out")"

# The build context as BuildKit sends it: top-level patterns anchored at
# the root, **/ patterns at any depth.
excludes=()
while IFS= read -r pattern; do
	case "$pattern" in
	'' | '#'*) continue ;;
	'**/'*) excludes+=("--exclude=${pattern#'**/'}") ;;
	*) excludes+=("--exclude=./$pattern") ;;
	esac
done <"$root/deploy/Dockerfile.dockerignore"
mkdir "$work/src"
tar -C "$root" "${excludes[@]}" -cf - . | tar -C "$work/src" -xf -
if [ -e "$work/src/.git" ] || [ -e "$work/src/build" ]; then
	fail "the dockerignore patterns leave .git or build/ in the context"
fi

n=0
while IFS= read -r step; do
	n=$((n + 1))
	echo "step $n: $step"
	(cd "$work/src" && sh -ec "$step") >"$work/step$n.log" 2>&1 || {
		tail -n 60 "$work/step$n.log" >&2
		fail "build stage step $n failed: $step"
	}
done <"$work/steps"
[ -x "$work/src/build/outbox-relay" ] || fail "the build stage produced no build/outbox-relay"
"$work/src/build/outbox-relay" --version
# The image's binary carries every hardening flag, fortify included.
bash "$root/tests/integration/hardening.sh" --check "$work/src/build/outbox-relay" ||
	fail "the release binary is not hardened"
echo "deploy_image_build: the image's build stage builds and passes the unit suite"
