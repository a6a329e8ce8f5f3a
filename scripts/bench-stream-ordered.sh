#!/usr/bin/env bash
# Instructions the recorder adds per cudaMallocAsync + cudaFreeAsync pair on a created stream,
# counted by callgrind: scripts/bench_stream_ordered.c on the fake runtime, PAIRS1 and PAIRS2
# pairs, with and without libvramshim.so; the per-pair figure is the difference between the two
# runs divided by PAIRS2 - PAIRS1 (start-up cancels out). Two figures: the calling thread's
# instructions (the hook path itself: the same in every run) and all threads' (the recorder's
# writer thread drains the events on a timer, so its share varies a little from run to run:
# the median of 3, all 3 shown).
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
# A cuMemGetInfo sample each second of run time would depend on valgrind's speed: the most
# seldom allowed (one a minute).
export VRAMSHIM_SAMPLE_MS="${VRAMSHIM_SAMPLE_MS:-60000}"

# Instructions of one run, "CALLING_THREAD ALL": PRELOAD PAIRS MODE.
count() {
    local out="$tmp/cg.$RANDOM"
    LD_PRELOAD="$1" valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out" \
        "$tmp/bench" "$2" "$3" >/dev/null 2>"$out.err"
    echo "$(sed -n 's/^totals: //p' "$out-01") $(grep -o 'Collected : [0-9]*' "$out.err" | grep -o '[0-9]*$')"
}

# Instructions per pair, "CALLING_THREAD ALL" (all: the median of 3): PRELOAD MODE.
per_pair() {
    local runs=() a b thread
    for _ in 1 2 3; do
        read -r a_thread a <<<"$(count "$1" "$pairs1" "$2")"
        read -r b_thread b <<<"$(count "$1" "$pairs2" "$2")"
        thread=$(((b_thread - a_thread) / (pairs2 - pairs1)))
        runs+=($(((b - a) / (pairs2 - pairs1))))
    done
    echo "$thread $(printf '%s\n' "${runs[@]}" | sort -n | sed -n 2p)"
    echo "  all threads, 3 runs: ${runs[*]}" >&2
}

printf '%-10s %-5s %16s %12s\n' mode shim "calling thread" "all threads"
for mode in plain capture; do
    for preload in "" "$shim"; do
        read -r thread all <<<"$(per_pair "$preload" "$mode")"
        printf '%-10s %-5s %16d %12d\n' "$mode" "$([ -n "$preload" ] && echo yes || echo no)" \
            "$thread" "$all"
        if [ -n "$preload" ]; then
            echo "$mode: the recorder adds $((thread - base_thread)) instructions per pair on the calling thread, $((all - base_all)) in all (VRAMSHIM_STACK=$VRAMSHIM_STACK)"
        else
            base_thread=$thread
            base_all=$all
        fi
    done
done
