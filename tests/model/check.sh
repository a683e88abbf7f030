#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Model check of the lock-lease row protocol (tests/model/row_protocol.pml,
# docs/model.md). The model must pass in each of its configurations; each
# mutant (the model with one guard removed, or the design as first
# written) must be reported failing by spin, with a trail; so must each
# known limit (a configuration whose violation docs/model.md states as a
# limit of the design), which counts apart. One line per run: name,
# verdict, states explored, seconds; then one line for tests/run.sh:
# "VERDICT model_check: PASS states NAME=N,... mutants_caught=K/M
# limits_seen=L/N".
#
# Usage: check.sh [-v] [RUN...]   (default: every run; -v prints the
#        trail of each failing mutant, as spin replays it)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
model="$here/row_protocol.pml"
verbose=0
if [ "${1:-}" = "-v" ]; then
	verbose=1
	shift
fi

for tool in spin gcc; do
	command -v "$tool" >/dev/null 2>&1 || {
		echo "check.sh: $tool not found (deploy/install-deps.sh installs it)" >&2
		exit 1
	}
done

# name : expected verdict : spin defines
runs=(
	"faults:pass:-DFAULTS=2 -DHISTORY"
	"modes:pass:-DFAULTS=1"
	"poison:pass:-DFAULTS=1 -DPOISON"
	"no_g1:fail:-DFAULTS=1 -DPOISON -DNO_G1"
	"no_g2:fail:-DFAULTS=1 -DNO_G2"
	"no_g3:fail:-DFAULTS=1 -DNO_G3"
	"no_g4:fail:-DFAULTS=1 -DNO_G4"
	"no_g5:fail:-DFAULTS=1 -DNO_G5"
	"no_fence:fail:-DFAULTS=1 -DNO_FENCE"
	"as_written_upsert:fail:-DFAULTS=1 -DAS_WRITTEN_UPSERT"
	"as_written_sweep:fail:-DFAULTS=1 -DPOISON -DAS_WRITTEN_SWEEP -DEARLY_ONLY -DNO_P6"
	"early_exclusion:fail:-DFAULTS=1 -DEARLY_ONLY"
	"c_settle:fail:-DFAULTS=1 -DPOISON -DEARLY_ONLY -DOLD_SETTLE -DNO_P6"
	"no_release:fail:-DFAULTS=1 -DNO_RELEASE"
	"no_live:fail:-DFAULTS=1 -DNO_LIVE"
	"late_window:pass:-DFAULTS=1 -DLATE_WINDOW"
	"late_uncounted:fail:-DFAULTS=1 -DLATE_WINDOW -DLATE_UNCOUNTED"
	"late_window_redrive:limit:-DFAULTS=1 -DLATE_WINDOW -DREDRIVE"
	"redrive:pass:-DFAULTS=1 -DREDRIVE"
	"keylock:pass:-DFAULTS=1 -DKEYLOCK -DKEYMAP -DREDRIVE"
	"key_early:fail:-DFAULTS=1 -DKEYLOCK -DKEYMAP -DREDRIVE -DKEY_EARLY"
	"redrive_no_write:fail:-DFAULTS=1 -DKEYLOCK -DKEYMAP -DREDRIVE -DREDRIVE_NO_WRITE"
	"keymap_no_disc:fail:-DFAULTS=1 -DKEYLOCK -DKEYMAP -DREDRIVE -DKEYMAP_NO_DISC"
	"keymap_eager_floor:fail:-DFAULTS=1 -DKEYLOCK -DKEYMAP -DREDRIVE -DKEYMAP_EAGER_FLOOR"
	"keyshare:pass:-DFAULTS=1 -DKEYLOCK -DKEYMAP -DREDRIVE -DKEYSHARE"
	"keyshare_eager:fail:-DFAULTS=1 -DKEYLOCK -DKEYMAP -DREDRIVE -DKEYSHARE -DKEYSHARE_EAGER"
)

# The property each mutant and known limit must break, as spin writes the
# assertion it found violated: a mutant caught by another assertion (a
# model that broke elsewhere) is not caught. assert(false) is the credit
# monitor's alone (owed attempts, row_protocol.pml), and (i != 1 ||
# st[0] != PEND) the order of a key's rows.
declare -A violation=(
	[no_g1]='assertion violated 0 '
	[no_g2]='assertion violated (st[0]==0)'
	[no_g3]='assertion violated (credit[0]>=k)'
	[no_g4]='assertion violated (( !((st[0]==0))&& !((st[1]==0)))&& !((st[2]==0)))'
	[no_g5]='assertion violated (( !(((batch>>1)&1))||(st[0]!=0))||0)'
	[no_fence]='assertion violated (lk[0]==me)'
	[as_written_upsert]='assertion violated  !(((cst[slot]==3)&&((cids[slot]'
	[as_written_sweep]='assertion violated 0 '
	[early_exclusion]='assertion violated ((1&((((((cst[0]==3)&&(cids[0]!=0))'
	[c_settle]='assertion violated 0 '
	[no_release]='assertion violated (credit[0]>=k)'
	[no_live]='assertion violated (credit[0]>=k)'
	[late_uncounted]='assertion violated (credit[0]>=k)'
	[late_window_redrive]='assertion violated (credit[0]>=k)'
	[key_early]='assertion violated ((1!=1)||(st[0]!=0))'
	[redrive_no_write]='assertion violated ((1!=1)||(st[0]!=0))'
	[keymap_no_disc]='assertion violated ((1!=1)||(st[0]!=0))'
	[keymap_eager_floor]='assertion violated ((1!=1)||(st[0]!=0))'
	[keyshare_eager]='assertion violated ((1!=1)||(st[0]!=0))'
)

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-model.XXXXXX")
trap 'rm -rf "$work"' EXIT

wanted() {
	[ ${#selected[@]} -eq 0 ] && return 0
	local s
	for s in "${selected[@]}"; do
		[ "$s" = "$1" ] && return 0
	done
	return 1
}

selected=("$@")
for s in "${selected[@]}"; do
	found=0
	for spec in "${runs[@]}"; do
		[ "${spec%%:*}" = "$s" ] && found=1
	done
	[ "$found" -eq 1 ] || { echo "check.sh: no run named '$s'" >&2; exit 2; }
done

failures=0
searched=() # NAME=states of each configuration that must pass
caught=0
mutants=0
limits=0
limits_seen=0
for spec in "${runs[@]}"; do
	name=${spec%%:*}
	rest=${spec#*:}
	expect=${rest%%:*}
	read -r -a defines <<<"${rest#*:}"
	wanted "$name" || continue
	if [ "$expect" = fail ]; then
		mutants=$((mutants + 1))
	fi
	if [ "$expect" = limit ]; then
		limits=$((limits + 1))
	fi
	dir="$work/$name"
	mkdir -p "$dir"
	cp "$model" "$dir/"
	start=$(date +%s.%N)
	if ! (cd "$dir" && spin -a "${defines[@]}" row_protocol.pml >spin.out 2>&1); then
		echo "model $name: FAIL: spin -a rejected the model" >&2
		cat "$dir/spin.out" >&2
		failures=$((failures + 1))
		continue
	fi
	# Mutants are searched breadth first: the trail is a shortest one.
	cflags=(-w -O2 -DSAFETY -DCOLLAPSE)
	[ "$expect" = pass ] || cflags+=(-DBFS)
	if ! (cd "$dir" && gcc "${cflags[@]}" -o pan pan.c >gcc.out 2>&1); then
		echo "model $name: FAIL: pan.c does not compile" >&2
		cat "$dir/gcc.out" >&2
		failures=$((failures + 1))
		continue
	fi
	(cd "$dir" && ./pan -m1000000 >pan.out 2>&1) || true
	end=$(date +%s.%N)
	secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
	states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$dir/pan.out")
	errors=$(sed -n 's/.*errors: \([0-9]*\)$/\1/p' "$dir/pan.out")
	found=$(grep -m1 -E 'assertion violated|invalid end state' "$dir/pan.out" || true)
	if [ -z "$states" ] || [ -z "$errors" ] ||
		grep -q 'max search depth too small' "$dir/pan.out"; then
		echo "model $name: FAIL: the search did not complete" >&2
		cat "$dir/pan.out" >&2
		failures=$((failures + 1))
		continue
	fi
	case "$expect:$errors" in
	pass:0)
		echo "model $name: pass, $states states, ${secs}s"
		searched+=("$name=$states")
		;;
	pass:*)
		echo "model $name: FAIL: $found ($states states, ${secs}s)" >&2
		(cd "$dir" && spin -t -p -g "${defines[@]}" row_protocol.pml) | tail -40 >&2
		failures=$((failures + 1))
		;;
	fail:0)
		echo "model $name: FAIL: the mutant passes ($states states, ${secs}s)" >&2
		failures=$((failures + 1))
		;;
	limit:0)
		echo "model $name: FAIL: the known limit is gone ($states states, ${secs}s): docs/model.md and this run need updating" >&2
		failures=$((failures + 1))
		;;
	fail:* | limit:*)
		if [ -z "$found" ]; then
			echo "model $name: FAIL: spin reports an error but no violation" >&2
			cat "$dir/pan.out" >&2
			failures=$((failures + 1))
			continue
		fi
		want=${violation[$name]:-}
		if [ -z "$want" ] || [[ "$found" != *"$want"* ]]; then
			echo "model $name: FAIL: caught by another property than its own (want: ${want:-none named in check.sh}): $found" >&2
			failures=$((failures + 1))
			continue
		fi
		steps=$(cd "$dir" && spin -t "${defines[@]}" row_protocol.pml 2>&1 |
			sed -n 's/^spin: trail ends after \([0-9]*\) steps.*/\1/p')
		if [ "$expect" = fail ]; then
			caught=$((caught + 1))
			echo "model $name: caught, $states states, ${secs}s: ${found#pan:1: } (trail of ${steps:-?} steps)"
		else
			limits_seen=$((limits_seen + 1))
			echo "model $name: the known limit (docs/model.md), $states states, ${secs}s: ${found#pan:1: } (trail of ${steps:-?} steps)"
		fi
		if [ "$verbose" -eq 1 ]; then
			(cd "$dir" && spin -t -p "${defines[@]}" row_protocol.pml)
		fi
		;;
	esac
done

word=PASS
[ "$failures" -eq 0 ] || word=FAIL
all_states=$(
	IFS=,
	echo "${searched[*]}"
)
echo "VERDICT model_check: $word states ${all_states:-none} mutants_caught=$caught/$mutants limits_seen=$limits_seen/$limits"
if [ "$failures" -ne 0 ]; then
	echo "model check: $failures run(s) failed" >&2
	exit 1
fi
echo "model check: ok"
