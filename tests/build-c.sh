#!/usr/bin/env bash
# Builds the C test fixtures of vramshim:
#   OUTDIR/lib/libcuda.so.1   (+ libcuda.so)    fake driver   (tests/fake/fakecuda.c)
#   OUTDIR/lib/libcudart.so.12 (+ libcudart.so) fake runtime  (tests/fake/fakecudart.c)
#   OUTDIR/lib/libinterpose.so                  second preload (tests/programs/interposer.c)
#   OUTDIR/bin/<name>                           test programs (tests/programs/<name>.c)
#
# Usage: tests/build-c.sh OUTDIR
# Programs find the fakes at run time through LD_LIBRARY_PATH=OUTDIR/lib (no rpath).
# Idempotent: a target newer than its inputs and this script is left alone; outputs are
# written to a temporary name and renamed, so concurrent builds of one OUTDIR are safe.
# CC may name another compiler (default gcc).
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fake="$here/fake"
progs="$here/programs"
script="$here/$(basename "${BASH_SOURCE[0]}")"
mkdir -p "$1/lib" "$1/bin"
out="$(cd "$1" && pwd)"
lib="$out/lib"
bin="$out/bin"
CC="${CC:-gcc}"

warn=(-Wall -Wextra -Werror)
libflags=(-g -O2 -fPIC -shared -fvisibility=hidden -pthread)
testflags=(-g -O1 -fno-omit-frame-pointer -fno-inline)
benchflags=(-O2 -g -fno-omit-frame-pointer)
includes=(-I"$fake" -I"$progs")
headers=("$fake/cuda.h" "$fake/cuda_runtime.h" "$progs/common.h")

# up_to_date TARGET INPUT... : true when TARGET exists and is newer than every input.
up_to_date() {
    local target="$1" f
    shift
    [ -e "$target" ] || return 1
    for f in "$@" "$script"; do
        [ "$target" -nt "$f" ] || return 1
    done
}

# build TARGET SOURCE -- COMPILER-ARGS... : compile SOURCE into TARGET atomically.
build() {
    local target="$1" src="$2"
    shift 3
    if up_to_date "$target" "$src" "${headers[@]}"; then
        return 0
    fi
    local tmp="$target.tmp.$$.$RANDOM"
    if ! "$CC" "${warn[@]}" "${includes[@]}" -o "$tmp" "$src" "$@"; then
        rm -f "$tmp"
        echo "build-c.sh: failed to build $target" >&2
        return 1
    fi
    mv -f "$tmp" "$target"
}

pids=()
spawn() {
    build "$@" &
    pids+=($!)
}
wait_all() {
    local rc=0 p
    for p in "${pids[@]}"; do
        wait "$p" || rc=1
    done
    pids=()
    return $rc
}

# ---- libraries (the programs link against them) ----
spawn "$lib/libcuda.so.1" "$fake/fakecuda.c" -- "${libflags[@]}" \
    -Wl,-Bsymbolic -Wl,-z,now -Wl,-soname,libcuda.so.1
spawn "$lib/libcudart.so.12" "$fake/fakecudart.c" -- "${libflags[@]}" \
    -Wl,-Bsymbolic -Wl,-z,now -Wl,-soname,libcudart.so.12 -ldl
spawn "$lib/libinterpose.so" "$progs/interposer.c" -- "${libflags[@]}" \
    -Wl,-soname,libinterpose.so -ldl
wait_all
ln -sfn libcuda.so.1 "$lib/libcuda.so"
ln -sfn libcudart.so.12 "$lib/libcudart.so"

# ---- programs ----
link_cuda=(-L"$lib" -lcuda -pthread)
link_cudart=(-L"$lib" -lcudart -pthread)
for p in direct vmm async threads oom fork abort sigkill dropcount thread_churn hostile; do
    spawn "$bin/$p" "$progs/$p.c" -- "${testflags[@]}" "${link_cuda[@]}"
done
for p in runtime interposed demo dryrun_train; do
    spawn "$bin/$p" "$progs/$p.c" -- "${testflags[@]}" "${link_cudart[@]}"
done
for p in dlsym resolver nvtx_client nvtx_domains; do
    spawn "$bin/$p" "$progs/$p.c" -- "${testflags[@]}" -ldl -lpthread
done
spawn "$bin/own_zstd" "$progs/own_zstd.c" -- "${testflags[@]}" "${link_cuda[@]}" -ldl
# Report scenarios (tests/programs/report_*.c): linked with both runtime and driver.
for src in "$progs"/report_*.c; do
    [ -e "$src" ] || continue
    spawn "$bin/$(basename "$src" .c)" "$src" -- "${testflags[@]}" "${link_cudart[@]}" -lcuda
done
spawn "$bin/nocuda" "$progs/nocuda.c" -- "${testflags[@]}"
# The same call paths with and without frame pointers (tests/tests/native_stacks.rs).
spawn "$bin/stack_paths" "$progs/stack_paths.c" -- "${testflags[@]}" "${link_cuda[@]}"
spawn "$bin/stack_paths_nofp" "$progs/stack_paths.c" -- -O2 -g -fomit-frame-pointer "${link_cuda[@]}"
spawn "$bin/stack_many" "$progs/stack_many.c" -- "${testflags[@]}" "${link_cuda[@]}"
spawn "$bin/stack_many_nofp" "$progs/stack_many.c" -- -O2 -g -fomit-frame-pointer "${link_cuda[@]}"
spawn "$bin/stack_joins" "$progs/stack_joins.c" -- "${testflags[@]}" "${link_cuda[@]}"
spawn "$bin/stack_joins_nofp" "$progs/stack_joins.c" -- -O2 -g -fomit-frame-pointer "${link_cuda[@]}"
# Without frame pointers but for one frame that keeps its frame in rbp (its alloca).
spawn "$bin/rbp_reads" "$progs/rbp_reads.c" -- -O2 -g -fomit-frame-pointer "${link_cuda[@]}"
spawn "$bin/bench" "$progs/bench.c" -- "${benchflags[@]}" "${link_cuda[@]}"
wait_all
