#!/usr/bin/env bash
# vramshim against the host-memory profilers heaptrack and memray, measured side by side in one
# run on the same alloc/free program (scripts/bench_peers.c, scripts/bench_peers.py).
#
# Installs what is missing: heaptrack (Debian package, apt-get) and memray (PyPI, into the venv
# ~/.cache/vramshim/memray-venv; MEMRAY_VERSION, default 1.20.0). Builds the workspace (release)
# and the fakes (tests/build-c.sh target/c-release), then runs, interleaved, BENCH_ROUNDS rounds
# (default 5) of:
#   C, PAIRS malloc+free at call depth 30:       without a tool, under heaptrack
#   C, PAIRS cudaMalloc+cudaFree (fake runtime):  without a tool, under `vramshim run` (native
#     stacks; the log compressed after the program exits, as `run` does, counted too),
#     and under vramshim with VRAMSHIM_TIME_RESOLUTION=10ms (heaptrack's own time step), for
#     its log size only
#   Python, PY_PAIRS pairs at Python depth 30:    malloc+free without a tool / under
#     `memray run --native`; cudaMalloc+cudaFree without a tool / under vramshim (mixed stacks)
#   heaptrack_print and `vramshim report` on the logs just written, pinned to one core
# A pair is 2 events. CPU time = user + sys of the whole process tree, from wait4 (rusage),
# never wall time; added CPU per event = (with tool - without) / events.
# Prints each tool's raw figures (medians) and each ratio of issue 14 with its goal, median,
# min and max over the rounds (a ratio is computed within one round, then summarised).
# BENCH_PAIRS (default 1000000), BENCH_PY_PAIRS (default 300000), BENCH_DEPTH (default 30).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

rounds="${BENCH_ROUNDS:-5}"
pairs="${BENCH_PAIRS:-1000000}"
py_pairs="${BENCH_PY_PAIRS:-300000}"
depth="${BENCH_DEPTH:-30}"
memray_version="${MEMRAY_VERSION:-1.20.0}"
venv="$HOME/.cache/vramshim/memray-venv"
for n in "$rounds" "$pairs" "$py_pairs" "$depth"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench-peers: counts must be positive integers" >&2; exit 2; }
done

# ---- tools ----
if ! command -v heaptrack >/dev/null || ! command -v heaptrack_print >/dev/null; then
    echo "== installing heaptrack (apt-get install heaptrack)"
    if [ "$(id -u)" = 0 ]; then apt_get=(apt-get); else apt_get=(sudo apt-get); fi
    "${apt_get[@]}" update -qq && DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y -qq heaptrack \
        || { echo "bench-peers: could not install heaptrack" >&2; exit 2; }
fi
if ! "$venv/bin/python" -c "import memray" 2>/dev/null; then
    echo "== installing memray $memray_version into $venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv" && "$venv/bin/pip" install -q "memray==$memray_version" \
        || { echo "bench-peers: could not install memray" >&2; exit 2; }
fi
python="$venv/bin/python"

echo "== building (cargo build --release, tests/build-c.sh target/c-release)"
cargo build --release --workspace --quiet
bash tests/build-c.sh target/c-release >/dev/null
vramshim="$root/target/release/vramshim"
fakes="$root/target/c-release/lib"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/vramshim-peers.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cc="${CC:-gcc}"
"$cc" -O2 -g -o "$tmp/bench_malloc" scripts/bench_peers.c
"$cc" -O2 -g -DUSE_CUDA -Itests/fake -o "$tmp/bench_cuda" scripts/bench_peers.c -L"$fakes" -lcudart

export LD_LIBRARY_PATH="$fakes${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FAKECUDA_MEM=unlimited
unset LD_PRELOAD VRAMSHIM_OUTPUT VRAMSHIM_STACK VRAMSHIM_MANIFEST VRAMSHIM_TIME_RESOLUTION
inherited="$(env | grep -E '^VRAMSHIM_' || true)"

# timed NAME CMD...: runs CMD (stdout and stderr to $tmp/NAME.out); appends "cpu_s:maxrss_kib"
# to runs[NAME]. CPU time is the child's rusage from wait4 (its waited-for descendants
# included), in microseconds: /usr/bin/time rounds to 10 ms.
declare -A runs
timed() {
    local name="$1"
    shift
    if ! "$python" -c '
import os, sys
pid = os.fork()
if pid == 0:
    try:
        out = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.execvp(sys.argv[3], sys.argv[3:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{usage.ru_utime + usage.ru_stime:.6f}:{usage.ru_maxrss} ")
sys.exit(os.waitstatus_to_exitcode(status))
' "$tmp/time" "$tmp/$name.out" "$@"; then
        echo "bench-peers: $name failed: $(tail -n 3 "$tmp/$name.out")" >&2
        exit 2
    fi
    runs[$name]+="$(cat "$tmp/time")"
}
declare -A values
add() { values[$1]+="$2 "; }
# cpu_of NAME / rss_of NAME: CPU seconds / peak RSS (KiB) of NAME's latest run.
cpu_of() { printf '%s' "${runs[$1]}" | awk '{ split($NF, f, ":"); print f[1] }'; }
rss_of() { printf '%s' "${runs[$1]}" | awk '{ split($NF, f, ":"); print f[2] }'; }
calc() { awk "BEGIN { printf \"%.4g\", $1 }"; }
# at_least_tick SECONDS: the kernel counts CPU time in ticks; a 0 means less than one.
at_least_tick() { awk -v s="$1" 'BEGIN { print (s < 0.001) ? 0.001 : s }'; }

events=$((2 * pairs))
py_events=$((2 * py_pairs))
echo "== measuring: $rounds interleaved rounds; C: $pairs pairs, Python: $py_pairs pairs, depth $depth"
start_s=$SECONDS
for round in $(seq 1 "$rounds"); do
    rm -f "$tmp"/ht* "$tmp"/*.vlog "$tmp"/*.bin
    # Native stacks.
    timed c_malloc "$tmp/bench_malloc" "$pairs" "$depth"
    timed heaptrack heaptrack -o "$tmp/ht" "$tmp/bench_malloc" "$pairs" "$depth"
    timed c_cuda "$tmp/bench_cuda" "$pairs" "$depth"
    # Through `vramshim run`, which compresses the log once the program has exited (the
    # recorder writes it plain), as heaptrack's own process compresses its file: both in the
    # CPU counted and the bytes.
    timed vramshim "$vramshim" run -o "$tmp/c.vlog" --stack native -- \
        "$tmp/bench_cuda" "$pairs" "$depth"
    # The same at heaptrack's time resolution (it writes time in 10 ms ticks): bytes only.
    timed vramshim_10ms env VRAMSHIM_TIME_RESOLUTION=10ms "$vramshim" run -o "$tmp/c10.vlog" \
        --stack native -- "$tmp/bench_cuda" "$pairs" "$depth"
    # Python + native stacks.
    timed py_malloc "$python" scripts/bench_peers.py malloc "$py_pairs" "$depth"
    timed memray "$python" -m memray run --native -q -f -o "$tmp/py.bin" \
        scripts/bench_peers.py malloc "$py_pairs" "$depth"
    timed py_cuda "$python" scripts/bench_peers.py cuda "$py_pairs" "$depth"
    timed vramshim_py "$vramshim" run -o "$tmp/py.vlog" --stack mixed -- \
        "$python" scripts/bench_peers.py cuda "$py_pairs" "$depth"
    # Reports, one core.
    ht_file="$(ls "$tmp"/ht* | head -n 1)"
    timed heaptrack_print taskset -c 0 heaptrack_print "$ht_file"
    timed report taskset -c 0 "$vramshim" report "$tmp/c.vlog"

    ht_added="$(calc "($(cpu_of heaptrack) - $(cpu_of c_malloc)) * 1e9 / $events")"
    vs_added="$(calc "($(cpu_of vramshim) - $(cpu_of c_cuda)) * 1e9 / $events")"
    mr_added="$(calc "($(cpu_of memray) - $(cpu_of py_malloc)) * 1e9 / $py_events")"
    vp_added="$(calc "($(cpu_of vramshim_py) - $(cpu_of py_cuda)) * 1e9 / $py_events")"
    ht_bytes="$(calc "$(stat -c %s "$ht_file") / $events")"
    vs_bytes="$(calc "$(stat -c %s "$tmp/c.vlog") / $events")"
    vs_bytes_10ms="$(calc "$(stat -c %s "$tmp/c10.vlog") / $events")"
    ht_rate="$(calc "$events / $(at_least_tick "$(cpu_of heaptrack_print)")")"
    vs_rate="$(calc "$events / $(at_least_tick "$(cpu_of report)")")"
    add ht_added "$ht_added"; add vs_added "$vs_added"; add mr_added "$mr_added"; add vp_added "$vp_added"
    add ht_bytes "$ht_bytes"; add vs_bytes "$vs_bytes"; add vs_bytes_10ms "$vs_bytes_10ms"; add ht_rate "$ht_rate"; add vs_rate "$vs_rate"
    add ht_rss "$(rss_of heaptrack_print)"; add vs_rss "$(rss_of report)"
    add r_native "$(calc "$vs_added / $ht_added")"
    add r_python "$(calc "$vp_added / $mr_added")"
    add r_bytes "$(calc "$vs_bytes / $ht_bytes")"
    add r_bytes_10ms "$(calc "$vs_bytes_10ms / $ht_bytes")"
    add r_rate "$(calc "$vs_rate / $ht_rate")"
    add r_rss "$(calc "$(rss_of report) / $(rss_of heaptrack_print)")"
    echo "  round $round: native ${vs_added}/${ht_added} ns, python ${vp_added}/${mr_added} ns," \
        "bytes ${vs_bytes} (10 ms: ${vs_bytes_10ms})/${ht_bytes}, report ${vs_rate}/${ht_rate} events/s (vramshim/peer)"
done
measure_s=$((SECONDS - start_s))

# stat3 NAME: "median min max" of values[NAME].
stat3() {
    # shellcheck disable=SC2086
    printf '%s\n' ${values[$1]} | sort -g | awk '{ v[NR] = $1 } END { printf "%s %s %s", v[int((NR + 1) / 2)], v[1], v[NR] }'
}
med() { stat3 "$1" | cut -d' ' -f1; }

cat <<INFO

What each side does:
  heaptrack $(heaptrack --version 2>&1 | awk '{ print $NF }'): LD_PRELOAD hook on malloc/free; unwinds every malloc with libunwind
    (unw_backtrace, cached), streams to a separate heaptrack_interpret process, zstd-compressed file.
    Frees carry no stack. Program: bench_peers (malloc/free), call depth $depth.
  vramshim: LD_PRELOAD hook on the CUDA driver/runtime; walks the stack itself with cached DWARF
    unwind rules (.eh_frame), interns stacks, writes from a thread in the process. Program:
    bench_peers -DUSE_CUDA (cudaMalloc/cudaFree of the bundled fake runtime), call depth $depth,
    VRAMSHIM_STACK=native (C) / mixed (Python).
  memray $("$python" -c 'import memray; print(memray.__version__)' 2>/dev/null || echo "?"): \`memray run --native\`: Python frames + native frames
    (libunwind) on each malloc, its own file. Program: bench_peers.py malloc (ctypes), Python depth $depth.
  CPU time = user + sys of the whole process tree (wait4 rusage); baselines are the same
  program without a tool; 1 pair = 2 events. Reports pinned to one core (taskset -c 0).
INFO
[ -z "$inherited" ] || echo "  note: vramshim settings from the environment: $(printf '%s' "$inherited" | tr '\n' ' ')"

echo
echo "raw figures (median of $rounds rounds):"
printf '  %-44s %12s %12s\n' "" vramshim peer
printf '  %-44s %12s %12s\n' "added CPU ns/event, native stacks (heaptrack)" "$(med vs_added)" "$(med ht_added)"
printf '  %-44s %12s %12s\n' "added CPU ns/event, Python + native (memray)" "$(med vp_added)" "$(med mr_added)"
printf '  %-44s %12s %12s\n' "log bytes/event as written (heaptrack)" "$(med vs_bytes)" "$(med ht_bytes)"
printf '  %-44s %12s %12s\n' "  the same, vramshim times at 10 ms" "$(med vs_bytes_10ms)" "$(med ht_bytes)"
printf '  %-44s %12s %12s\n' "report events per CPU second (heaptrack_print)" "$(med vs_rate)" "$(med ht_rate)"
printf '  %-44s %12s %12s\n' "report peak RSS KiB (heaptrack_print)" "$(med vs_rss)" "$(med ht_rss)"
echo "  baseline CPU s (last round), C: malloc $(cpu_of c_malloc), cuda $(cpu_of c_cuda);" \
    "Python: malloc $(cpu_of py_malloc), cuda $(cpu_of py_cuda)"

echo
echo "ratios vramshim / peer (computed per round):"
printf '  %-52s %8s %8s %8s %8s\n' measure goal median min max
row() {
    read -r m lo hi <<<"$(stat3 "$1")"
    printf '  %-52s %8s %8s %8s %8s\n' "$2" "$3" "$m" "$lo" "$hi"
}
row r_native "capture, native stacks, added CPU/event vs heaptrack" "<= 0.75"
row r_python "capture, Python+native, added CPU/event vs memray" "<= 1.0"
row r_bytes "log bytes per event vs heaptrack (zstd), 1 ns times" "<= 1.0"
row r_bytes_10ms "  the same, vramshim times at 10 ms (heaptrack's)" "<= 1.0"
row r_rate "report events per CPU second vs heaptrack_print" ">= 2"
row r_rss "report peak memory vs heaptrack_print" "<= 1.0"
echo
echo "measured in ${measure_s} s"
