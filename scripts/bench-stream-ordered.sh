#!/usr/bin/env bash
# Instructions the recorder adds per cudaMallocAsync + cudaFreeAsync pair on a created stream,
# counted by callgrind (deterministic, so one run each): scripts/bench_stream_ordered.c on the
# fake runtime, PAIRS1 and PAIRS2 pairs, with and without libvramshim.so; the per-pair figure
# is the difference between the two runs divided by PAIRS2 - PAIRS1 (start-up cancels out).
# "capture": a capture is in progress on another stream meanwhile (the recorder then asks the
# driver about each call's stream; the common case, none in progress, asks nothing).
#
# Usage: scripts/bench-stream-ordered.sh [SHIM.so]   (default target/release/libvramshim.so;
# build it first: cargo build --release -p vramshim). VRAMSHIM_STACK defaults to none here
# (the hook path itself); set it to measure another mode.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
shim="$(realpath "${1:-target/release/libvramshim.so}")"
lib="target/release/fakegpu/lib"
[ -e "$lib/libcudart.so.13" ] || lib="target/debug/fakegpu/lib"
[ -e "$lib/libcudart.so.13" ] || { echo "no fake libraries (cargo build --workspace)" >&2; exit 2; }
lib="$(realpath "$lib")"
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 2; }
tmp="$(mktemp -d "${TMPDIR:-/tmp}/vramshim-bench-so.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -o "$tmp/bench" scripts/bench_stream_ordered.c -L"$lib" -Wl,-rpath-link,"$lib" \
    -l:libcudart.so.13
pairs1=1000
pairs2=11000
export LD_LIBRARY_PATH="$lib" VRAMSHIM_FAKEGPU_MEMORY=$((1 << 30))
export VRAMSHIM_STACK="${VRAMSHIM_STACK:-none}" VRAMSHIM_OUTPUT="$tmp/%p.vlog"

# Instructions of one run: PRELOAD PAIRS MODE.
count() {
    local out="$tmp/cg.$RANDOM"
    LD_PRELOAD="$1" valgrind --tool=callgrind --callgrind-out-file="$out" "$tmp/bench" "$2" "$3" \
        >/dev/null 2>"$out.err"
    grep -o 'Collected : [0-9]*' "$out.err" | grep -o '[0-9]*$'
}

printf '%-10s %-8s %14s\n' mode shim instructions/pair
for mode in plain capture; do
    for preload in "" "$shim"; do
        a="$(count "$preload" "$pairs1" "$mode")"
        b="$(count "$preload" "$pairs2" "$mode")"
        per=$(((b - a) / (pairs2 - pairs1)))
        printf '%-10s %-8s %14d\n' "$mode" "$([ -n "$preload" ] && echo yes || echo no)" "$per"
        if [ -n "$preload" ]; then
            echo "$mode: the recorder adds $((per - base)) instructions per pair (VRAMSHIM_STACK=$VRAMSHIM_STACK)"
        else
            base=$per
        fi
    done
done
