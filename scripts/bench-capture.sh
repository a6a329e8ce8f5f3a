#!/usr/bin/env bash
# Capture cost of libvramshim.so, measured in one run against a baseline without it.
#
# Builds the workspace (release) and the C fixtures (tests/build-c.sh target/c-release), then
# runs `bench THREADS PAIRS DEPTH` on the bundled fake driver (no GPU needed) in four
# configurations, each on 1 and on 8 threads:
#   no shim, depth 0          baseline for "stacks off"
#   shim, VRAMSHIM_STACK=none
#   no shim, depth 30         baseline for native stacks
#   shim, VRAMSHIM_STACK=native at call depth 30 (each stack has ~30 frames)
# A pair is cuMemAlloc_v2 + cuMemFree_v2 = 2 events. Pair counts are calibrated so that each
# measurement takes about BENCH_SECONDS (default 0.4 s); every configuration runs 3 times,
# interleaved, and the median is reported. Logs go to a temporary folder that is removed.
#
# Prints a table and the budgets:
#   stacks off: added <= 300 ns/event; native, 30 frames: added <= 2000 ns/event
#   (latency budgets judged on 1 thread; on 8 threads only when the machine has >= 8 cores)
#   8-thread throughput >= 4x 1-thread throughput with the shim, stacks off (needs >= 8 cores;
#   with fewer cores the ratio is bounded by the core count and is reported as n/a)
# Exit status 1 when a budget measurable on this machine fails, else 0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

target_s="${BENCH_SECONDS:-0.4}"
reps=3
cores="$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)"
budget_off=300
budget_native=2000
budget_ratio=4

echo "== building (cargo build --release, tests/build-c.sh target/c-release)"
cargo build --release --workspace --quiet
bash tests/build-c.sh target/c-release

shim="$root/target/release/libvramshim.so"
vramshim="$root/target/release/vramshim"
bench="$root/target/c-release/bin/bench"
fakes="$root/target/c-release/lib"
for f in "$shim" "$vramshim" "$bench" "$fakes/libcuda.so.1"; do
    [ -e "$f" ] || { echo "bench-capture: missing $f after the build" >&2; exit 2; }
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/vramshim-bench.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

export LD_LIBRARY_PATH="$fakes${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FAKECUDA_MEM=unlimited
# Settings of the shim that are left to the caller (buffer size, flush interval, ...).
inherited="$(env | grep -E '^VRAMSHIM_' | grep -Ev '^VRAMSHIM_(OUTPUT|STACK|MANIFEST)=' || true)"
unset VRAMSHIM_OUTPUT VRAMSHIM_STACK VRAMSHIM_MANIFEST

# config name -> depth, stack mode ("" = no shim), label
configs=(base0 none base30 native30)
declare -A depth=([base0]=0 [none]=0 [base30]=30 [native30]=30)
declare -A stack=([base0]="" [none]=none [base30]="" [native30]=native)
declare -A label=(
    [base0]="no shim (depth 0)"
    [none]="shim, stacks none"
    [base30]="no shim (depth 30)"
    [native30]="shim, native, depth 30"
)
declare -A baseline=([none]=base0 [native30]=base30)
thread_counts=(1 8)

failures=0
first_failure=""
last_line=""
last_log=""

# run_bench CONFIG THREADS PAIRS: runs bench once (retrying a failed run up to twice);
# sets last_line to its output line and last_log to the log it wrote ("" without shim).
run_bench() {
    local cfg="$1" threads="$2" pairs="$3" attempt out rc
    for attempt in 1 2 3; do
        rm -f "$tmp"/*.vlog
        rc=0
        if [ -z "${stack[$cfg]}" ]; then
            out="$(env -u LD_PRELOAD "$bench" "$threads" "$pairs" "${depth[$cfg]}" 2>&1)" || rc=$?
        else
            out="$(env LD_PRELOAD="$shim" VRAMSHIM_OUTPUT="$tmp/bench.%p.vlog" \
                VRAMSHIM_STACK="${stack[$cfg]}" \
                "$bench" "$threads" "$pairs" "${depth[$cfg]}" 2>&1)" || rc=$?
        fi
        last_line="$(printf '%s\n' "$out" | grep '^threads=' | tail -n 1 || true)"
        last_log=""
        for f in "$tmp"/bench.*.vlog; do
            [ -e "$f" ] && last_log="$f" && break
        done
        if [ "$rc" = 0 ] && [ -n "$last_line" ]; then
            return 0
        fi
        failures=$((failures + 1))
        [ -n "$first_failure" ] ||
            first_failure="${label[$cfg]}, $threads thread(s): $(printf '%s' "$out" | tail -n 1)"
        echo "  warning: run failed (${label[$cfg]}, $threads thread(s), attempt $attempt," \
            "exit $rc): $(printf '%s' "$out" | tail -n 1)" >&2
    done
    echo "bench-capture: ${label[$cfg]} on $threads thread(s) failed 3 times; giving up" >&2
    exit 2
}

# field NAME LINE: the value of NAME=... in a bench output line.
field() { printf '%s\n' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# wall_ns PAIRS: wall time of the last run, from its ns_per_pair.
wall_ns() { awk -v n="$(field ns_per_pair "$last_line")" -v p="$1" 'BEGIN { printf "%.0f", n * p }'; }

# scale PAIRS WALL_NS: the pair count that would take target_s seconds.
scale() {
    awk -v p="$1" -v w="$2" -v t="$target_s" \
        'BEGIN { if (w < 1) w = 1; n = p * t * 1e9 / w; if (n < 1000) n = 1000; printf "%.0f", n }'
}

# calibrate CONFIG THREADS: sets `calibrated` to a pair count taking about target_s seconds.
# The cost per pair is not linear in the count (the shim's buffers fill up only in longer
# runs), so the first estimate is checked with a run at full length and corrected if needed.
calibrate() {
    local cfg="$1" threads="$2" pairs=2000 wall
    while :; do
        run_bench "$cfg" "$threads" "$pairs"
        wall="$(wall_ns "$pairs")"
        if [ "$wall" -ge 100000000 ] || [ "$pairs" -ge 1000000000 ]; then
            break
        fi
        pairs=$((pairs * 10))
    done
    pairs="$(scale "$pairs" "$wall")"
    for _ in 1 2; do
        run_bench "$cfg" "$threads" "$pairs"
        wall="$(wall_ns "$pairs")"
        # Within [0.6, 1.6] x target: keep.
        if awk -v w="$wall" -v t="$target_s" 'BEGIN { exit !(w >= 0.6 * t * 1e9 && w <= 1.6 * t * 1e9) }'; then
            break
        fi
        pairs="$(scale "$pairs" "$wall")"
    done
    calibrated="$pairs"
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "== calibrating (target ${target_s} s per measurement)"
declare -A pairs_for
for t in "${thread_counts[@]}"; do
    for cfg in "${configs[@]}"; do
        calibrate "$cfg" "$t"
        pairs_for[$cfg:$t]="$calibrated"
    done
done

echo "== measuring: $reps rounds of $(( ${#configs[@]} * ${#thread_counts[@]} )) runs, interleaved"
declare -A ns_runs pps_runs
log_note=""
frames_note=""
start_s=$SECONDS
for rep in $(seq 1 "$reps"); do
    for t in "${thread_counts[@]}"; do
        for cfg in "${configs[@]}"; do
            p="${pairs_for[$cfg:$t]}"
            run_bench "$cfg" "$t" "$p"
            ns_runs[$cfg:$t]+=" $(field ns_per_pair "$last_line")"
            pps_runs[$cfg:$t]+=" $(field pairs_per_sec "$last_line")"
            # Compactness, from the first round's 1-thread logs.
            if [ "$rep" = 1 ] && [ "$t" = 1 ] && [ -n "$last_log" ]; then
                size="$(stat -c %s "$last_log")"
                log_note+="$(awk -v s="$size" -v e="$((2 * p * t))" -v l="${label[$cfg]}" \
                    'BEGIN { printf "  %-24s %8.1f MiB for %6.2f M events = %5.2f bytes/event\n",
                             l, s / 1048576, e / 1e6, s / e }')"$'\n'
                if [ "$cfg" = native30 ]; then
                    # Frames of the first stack record (text dump: "stack ID: ip ip ...").
                    nframes="$("$vramshim" dump "$last_log" 2>/dev/null \
                        | awk '/^stack [0-9]+:/ { print NF - 2; exit }' || true)"
                    frames_note="${nframes:-?}"
                fi
            fi
        done
    done
done
rm -f "$tmp"/*.vlog
measure_s=$((SECONDS - start_s))

declare -A ns_ev pps
for key in "${!ns_runs[@]}"; do
    # shellcheck disable=SC2086
    ns_ev[$key]="$(awk -v n="$(median ${ns_runs[$key]})" 'BEGIN { printf "%.1f", n / 2 }')"
    # shellcheck disable=SC2086
    pps[$key]="$(median ${pps_runs[$key]})"
done

echo
echo "fake driver, $cores cores; median of $reps runs; 1 pair = cuMemAlloc_v2 + cuMemFree_v2 = 2 events"
echo "ns/event = wall time / (pairs per thread x 2): what one event costs a thread (with more"
echo "threads than cores this includes time spent waiting for a core); events/s = all threads"
echo
printf '%-24s %7s %9s %10s %15s %12s\n' config threads pairs ns/event "added ns/event" events/s
printf '%-24s %7s %9s %10s %15s %12s\n' ------ ------- ----- -------- -------------- --------
for t in "${thread_counts[@]}"; do
    for cfg in "${configs[@]}"; do
        key="$cfg:$t"
        if [ -n "${baseline[$cfg]:-}" ]; then
            added="$(awk -v a="${ns_ev[$key]}" -v b="${ns_ev[${baseline[$cfg]}:$t]}" \
                'BEGIN { printf "%+.1f", a - b }')"
        else
            added="-"
        fi
        evs="$(awk -v p="${pps[$key]}" 'BEGIN { printf "%.2f M", 2 * p / 1e6 }')"
        printf '%-24s %7s %9s %10s %15s %12s\n' "${label[$cfg]}" "$t" "${pairs_for[$key]}" \
            "${ns_ev[$key]}" "$added" "$evs"
    done
done

echo
echo "log compactness (first round, 1 thread; whole file incl. header, module map, stacks):"
printf '%s' "$log_note"
[ -z "$frames_note" ] || echo "  native stacks recorded: $frames_note frames (first stack record of the depth-30 run)"
if [ -n "$inherited" ]; then
    echo "  note: shim settings taken from the environment: $(printf '%s' "$inherited" | tr '\n' ' ')"
fi

status=0
# verdict OK: prints PASS (OK = 1) or FAIL, and remembers a failure for the exit status.
verdict() {
    if [ "$1" = 1 ]; then
        printf 'PASS'
    else
        printf 'FAIL'
        status=1
    fi
}
added_of() { awk -v a="${ns_ev[$1:$2]}" -v b="${ns_ev[$3:$2]}" 'BEGIN { printf "%.1f", a - b }'; }

echo
echo "budgets:"
for t in "${thread_counts[@]}"; do
    for pair in "none:base0:$budget_off:stacks off" "native30:base30:$budget_native:native 30 frames"; do
        IFS=: read -r cfg base budget what <<<"$pair"
        added="$(added_of "$cfg" "$t" "$base")"
        if [ "$t" = 1 ]; then threads_word="1 thread"; else threads_word="$t threads"; fi
        line="$(printf '  %-46s <= %5s ns : %8s ns' "$what, added ns/event, $threads_word" "$budget" "$added")"
        if [ "$t" -gt "$cores" ]; then
            echo "$line   n/a ($cores cores < $t threads: includes waiting for a core)"
        else
            ok="$(awk -v a="$added" -v b="$budget" 'BEGIN { print (a <= b) ? 1 : 0 }')"
            printf '%s   ' "$line"
            verdict "$ok"
            echo
        fi
    done
done
ratio="$(awk -v a="${pps[none:8]}" -v b="${pps[none:1]}" 'BEGIN { printf "%.2f", a / b }')"
base_ratio="$(awk -v a="${pps[base0:8]}" -v b="${pps[base0:1]}" 'BEGIN { printf "%.2f", a / b }')"
line="$(printf '  %-46s >= %5s x  : %8s x ' "8-thread / 1-thread throughput, stacks off" "$budget_ratio" "$ratio")"
if [ "$cores" -lt 8 ]; then
    echo "$line   n/a ($cores cores)"
    echo "    (with $cores cores the ratio is bounded by $cores; without the shim it is ${base_ratio}x here)"
    if awk -v r="$ratio" 'BEGIN { exit !(r < 1) }'; then
        echo "    note: below 1x: with the shim, 8 threads together get less done than 1 thread"
    fi
else
    ok="$(awk -v r="$ratio" -v b="$budget_ratio" 'BEGIN { print (r >= b) ? 1 : 0 }')"
    printf '%s   ' "$line"
    verdict "$ok"
    echo "   ($cores cores; without the shim ${base_ratio}x)"
fi

# Python: the cost Python frames add to each event, at a 30-deep Python stack (native stacks
# are captured in both runs; the difference is the Python frame walk and its interning).
# BENCH_PYTHON picks another interpreter (e.g. ~/.pyenv/versions/3.9.18/bin/python3).
budget_python=1000
python="${BENCH_PYTHON:-$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || true)}"
echo
if [ -z "$python" ]; then
    echo "python: n/a (no python3)"
else
    py_pairs="${BENCH_PY_PAIRS:-100000}"
    declare -A py_runs
    for _ in $(seq 1 "$reps"); do
        for mode in native mixed; do
            rm -f "$tmp"/*.vlog
            out="$(env LD_PRELOAD="$shim" VRAMSHIM_OUTPUT="$tmp/py.%p.vlog" VRAMSHIM_STACK="$mode" \
                "$python" scripts/bench_python.py "$py_pairs" 30 2>&1)" || {
                echo "bench-capture: python bench ($mode) failed: $out" >&2
                exit 2
            }
            py_runs[$mode]+=" $(field ns_per_pair "$out")"
        done
    done
    rm -f "$tmp"/*.vlog
    # shellcheck disable=SC2086
    py_native="$(awk -v n="$(median ${py_runs[native]})" 'BEGIN { printf "%.1f", n / 2 }')"
    # shellcheck disable=SC2086
    py_mixed="$(awk -v n="$(median ${py_runs[mixed]})" 'BEGIN { printf "%.1f", n / 2 }')"
    py_added="$(awk -v a="$py_mixed" -v b="$py_native" 'BEGIN { printf "%.1f", a - b }')"
    echo "python $("$python" -c 'import sys; print(sys.version.split()[0])'), 30-deep Python stack," \
        "$py_pairs pairs, median of $reps: native $py_native ns/event, mixed $py_mixed ns/event"
    line="$(printf '  %-46s <= %5s ns : %8s ns' "python frames, added ns/event, 1 thread" \
        "$budget_python" "$py_added")"
    ok="$(awk -v a="$py_added" -v b="$budget_python" 'BEGIN { print (a <= b) ? 1 : 0 }')"
    printf '%s   ' "$line"
    verdict "$ok"
    echo
fi

if [ "$failures" -gt 0 ]; then
    echo
    echo "WARNING: $failures bench run(s) under the shim failed and were retried; first: $first_failure"
    echo "         (a program must behave the same with and without the shim: this is a bug)"
fi
echo
echo "measured in ${measure_s} s; exit $status"
exit "$status"
