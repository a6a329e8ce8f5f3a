#!/usr/bin/env bash
# Speed and memory of the log analyses, on synthetic logs, against their budgets.
#
#   scripts/bench-report.sh            10M-event log: events/s on one core (budget 5,000,000/s)
#   scripts/bench-report.sh --large    also a 100M-event log: peak RSS (budget 1 GiB)
#   scripts/bench-report.sh --stacks   logs with 200k and 2M distinct stacks of 32 frames: peak
#                                      RSS (budget 1 GiB) and events/s of report, peak, leaks,
#                                      flamegraph, export --pytorch-snapshot and diff (the log
#                                      against itself); figures only, no rate budget; each
#                                      command is capped at 6 GiB of address space
#
# Builds release (`vramshim` and the format crate's examples), writes the logs with
# `format/examples/synth.rs` (cached: VRAMSHIM_BENCH_DIR, default $TMPDIR/vramshim-bench; a log
# is rewritten when the generator or the format changed after it was written; the 100M log
# takes about 1.7 GB), then runs each command once, pinned to CPU 0 (`taskset -c 0`), under
# /usr/bin/time -v:
#
#   vramshim CMD LOG ARGS >/dev/null    for CMD in VRAMSHIM_BENCH_COMMAND
#
# Events per second are events / CPU time (user + system), which a busy machine disturbs far
# less than wall time; both are printed. The budgets: >= 5,000,000 events/s on the 10M log,
# peak RSS <= 1 GiB on the 100M log.
# A pure decode loop (format/examples/decode.rs, LogReader and nothing else) is timed first:
# the ceiling any analysis can reach.
#
# Environment:
#   VRAMSHIM_BENCH_COMMAND  subcommands to time (default "report summary"; one missing from
#                           this vramshim is skipped with a note). `dump` checks the plumbing.
#   VRAMSHIM_BENCH_ARGS     arguments after the log (default --json; set it empty for none)
#   VRAMSHIM_BENCH_EVENTS   events in the normal log (default 10000000)
#   VRAMSHIM_BENCH_LARGE=1  same as --large; VRAMSHIM_BENCH_LARGE_EVENTS (default 100000000)
#   VRAMSHIM_BENCH_SEED     synth seed (default 1)
# Exit status 1 when a command fails or misses a budget, 2 when nothing could be measured.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

large="${VRAMSHIM_BENCH_LARGE:-0}"
stacks_mode=0
for arg in "$@"; do
    case "$arg" in
        --large) large=1 ;;
        --stacks) stacks_mode=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "bench-report: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done
read -r -a commands <<<"${VRAMSHIM_BENCH_COMMAND:-report summary}"
read -r -a extra <<<"${VRAMSHIM_BENCH_ARGS---json}"
events="${VRAMSHIM_BENCH_EVENTS:-10000000}"
large_events="${VRAMSHIM_BENCH_LARGE_EVENTS:-100000000}"
seed="${VRAMSHIM_BENCH_SEED:-1}"
cache="${VRAMSHIM_BENCH_DIR:-${TMPDIR:-/tmp}/vramshim-bench}"
budget_rate=5000000
budget_rss_kib=$((1 << 20))
address_space_kib=""
cpu=0

for tool in /usr/bin/time taskset; do
    command -v "$tool" >/dev/null || {
        echo "bench-report: needs $tool (apt-get install time util-linux)" >&2
        exit 2
    }
done

echo "== building (cargo build --release -p vramshim-report -p vramshim-format --bins --examples)"
cargo build --release --quiet -p vramshim-report -p vramshim-format --bins --examples
target="${CARGO_TARGET_DIR:-$root/target}"
vramshim="$target/release/vramshim"
synth="$target/release/examples/synth"
decode="$target/release/examples/decode"
for f in "$vramshim" "$synth" "$decode"; do
    [ -x "$f" ] || { echo "bench-report: missing $f after the build" >&2; exit 2; }
done

mkdir -p "$cache"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/vramshim-bench-run.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

# log_for N [K]: prints the path of the cached N-event log (with K distinct stacks of 32
# frames when K is given), writing it first if needed.
log_for() {
    local n="$1" k="${2:-}" log="$cache/synth-seed$seed-$1${2:+-stacks$2}.vlog" input stale=0
    local stack_args=()
    [ -n "$k" ] && stack_args=(--stacks "$k" --frames 32)
    if [ -s "$log" ]; then
        for input in format/examples/synth.rs format/src/*.rs; do
            [ "$input" -nt "$log" ] && stale=1
        done
    else
        stale=1
    fi
    if [ "$stale" = 1 ]; then
        echo "== writing $log ($n events)" >&2
        "$synth" --events "$n" --seed "$seed" "${stack_args[@]}" -o "$log.tmp" >&2
        mv "$log.tmp" "$log"
    fi
    echo "$log"
}

# measure NAME N CMD...: runs CMD on CPU 0 under /usr/bin/time -v, stdout discarded; sets
# wall and cpu_s (user + system, s), rss (KiB), rate (events per CPU second) and rc.
measure() {
    local name="$1" n="$2" stats="$scratch/time.txt"
    shift 2
    rc=0
    (
        # --stacks: an address-space cap, so that a command far over budget fails instead of
        # taking the machine's memory.
        [ -n "$address_space_kib" ] && ulimit -v "$address_space_kib"
        exec /usr/bin/time -v -o "$stats" taskset -c "$cpu" "$@"
    ) >/dev/null 2>"$scratch/stderr" || rc=$?
    wall="$(awk -F': ' '/Elapsed \(wall clock\)/ {
        n = split($2, part, ":"); s = 0
        for (i = 1; i <= n; i++) s = s * 60 + part[i]
        print s }' "$stats")"
    cpu_s="$(awk -F': ' '/User time \(seconds\)|System time \(seconds\)/ { s += $2 }
        END { printf "%.2f", s }' "$stats")"
    rss="$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$stats")"
    rate="$(awk -v n="$n" -v s="$cpu_s" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')"
    if [ "$rc" != 0 ]; then
        echo "  $name: FAILED (exit $rc):"
        sed 's/^/    /' "$scratch/stderr" | tail -n 20
    fi
}

# has_command CMD: whether this vramshim knows subcommand CMD.
has_command() {
    "$vramshim" help "$1" >/dev/null 2>&1 || "$vramshim" "$1" --help >/dev/null 2>&1
}

failures=0
measured=0
report_line() { # label n
    printf '  %-28s %6.2f s CPU (%6.2f s wall)  %10s events/s  %5.2fx budget  peak RSS %s MiB\n' \
        "$1" "$cpu_s" "$wall" "$rate" \
        "$(awk -v r="$rate" -v b="$budget_rate" 'BEGIN { printf "%.2f", r / b }')" \
        "$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')"
}

run_size() { # N budget-kind(rate|rss)
    local n="$1" kind="$2" log cmd
    log="$(log_for "$n")"
    echo
    echo "== $n events: $log ($(du -h "$log" | cut -f1)), CPU $cpu"
    measure decode "$n" "$decode" "$log"
    [ "$rc" = 0 ] && report_line "decode loop (LogReader)" "$n"
    for cmd in "${commands[@]}"; do
        if ! has_command "$cmd"; then
            echo "  vramshim $cmd: not in this vramshim, skipped"
            continue
        fi
        measure "vramshim $cmd" "$n" "$vramshim" "$cmd" "$log" "${extra[@]}"
        if [ "$rc" != 0 ]; then
            failures=$((failures + 1))
            continue
        fi
        measured=$((measured + 1))
        report_line "vramshim $cmd ${extra[*]}" "$n"
        if [ "$kind" = rate ] && [ "$rate" -lt "$budget_rate" ]; then
            echo "    FAIL: below the budget of $budget_rate events/s"
            failures=$((failures + 1))
        fi
        if [ "$kind" = rss ]; then
            printf '    peak RSS %.1f MiB of the 1024 MiB budget (%.0f%%)\n' \
                "$(awk -v k="$rss" 'BEGIN { print k / 1024 }')" \
                "$(awk -v k="$rss" -v b="$budget_rss_kib" 'BEGIN { print 100 * k / b }')"
            if [ "$rss" -gt "$budget_rss_kib" ]; then
                echo "    FAIL: peak RSS over 1 GiB"
                failures=$((failures + 1))
            fi
        fi
    done
}

# run_stacks K N: the commands above on an N-event log with K distinct 32-frame stacks.
run_stacks() {
    local k="$1" n="$2" log name
    log="$(log_for "$n" "$k")"
    echo
    echo "== $k distinct stacks of 32 frames, $n events: $log ($(du -h "$log" | cut -f1)), CPU $cpu"
    local -a runs=(
        "report --json"
        "peak --json"
        "leaks --json"
        "flamegraph -o $scratch/flame.svg"
        "export --pytorch-snapshot -o $scratch/snapshot.json"
    )
    for run in "${runs[@]}"; do
        read -r -a words <<<"$run"
        measure "vramshim ${words[0]}" "$n" "$vramshim" "${words[0]}" "$log" "${words[@]:1}"
        stacks_line "vramshim $run" "$n"
    done
    # diff reads the log twice.
    measure "vramshim diff" "$((2 * n))" "$vramshim" diff "$log" "$log" --json
    stacks_line "vramshim diff (log vs itself)" "$((2 * n))"
}

stacks_line() { # label n
    if [ "$rc" != 0 ]; then
        failures=$((failures + 1))
        return
    fi
    measured=$((measured + 1))
    printf '  %-44s %7.2f s CPU %10s events/s  peak RSS %7.1f MiB (%3.0f%% of 1 GiB)%s\n' \
        "$1" "$cpu_s" "$rate" "$(awk -v k="$rss" 'BEGIN { print k / 1024 }')" \
        "$(awk -v k="$rss" -v b="$budget_rss_kib" 'BEGIN { print 100 * k / b }')" \
        "$([ "$rss" -gt "$budget_rss_kib" ] && echo '  OVER BUDGET')"
    [ "$rss" -gt "$budget_rss_kib" ] && failures=$((failures + 1))
    return 0
}

if [ "$stacks_mode" = 1 ]; then
    address_space_kib=$((6 << 20))
    # Every stack is used by at least one allocation: 2.5 events per stack.
    run_stacks 200000 500000
    run_stacks 2000000 5000000
else
    run_size "$events" rate
    if [ "$large" = 1 ]; then
        run_size "$large_events" rss
    fi
fi

echo
if [ "$measured" = 0 ] && [ "$failures" = 0 ]; then
    echo "bench-report: none of [${commands[*]}] exists in this vramshim; try VRAMSHIM_BENCH_COMMAND=dump VRAMSHIM_BENCH_ARGS= $0" >&2
    exit 2
fi
if [ "$failures" -gt 0 ]; then
    echo "bench-report: $failures failure(s)"
    exit 1
fi
echo "bench-report: all budgets met"
