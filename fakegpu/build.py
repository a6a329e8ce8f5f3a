#!/usr/bin/env python3
"""Build every fake NVIDIA library (called by build.sh; needs only gcc and binutils).

usage: build.py FAKEGPU_DIR OUTDIR

Reads FAKEGPU_DIR/symbols/*/*.syms (one export table per SONAME; a SONAME listed by several
lines gets the union, the first line in LINES giving each symbol's version node). For each
SONAME it compiles the hand-written sources, FAKEGPU_DIR/src/<name>.<major>/*.c or else
FAKEGPU_DIR/src/<name>/*.c (libcudart.so.13 -> src/cudart.13 or src/cudart) with FG_SONAME_MAJOR
defined to the SONAME's major (13; 0 without one), generates a stub
for every listed function and a zeroed object for every listed data symbol that those sources
do not define, and links OUTDIR/lib/<SONAME> with its real SONAME and a version script that puts
every symbol under its real version node. A `link.txt` beside the hand-written sources adds
link arguments (such as -l:libcuda.so.1, found in OUTDIR/lib: the driver is built first).
A SONAME in FORWARDS (cuDNN 8's and 9's sub-libraries) forwards each function that its target
(libcudnn.so.8 or .9) also lists to the target's definition, bound by the target's version node, so
that a program linking the sub-library gets the target's behaviour and state; its other
symbols are stubs like any library's. Targets are built before the libraries forwarding to them.
Scratch files go to OUTDIR/obj. Only what changed is rebuilt; files whose content is unchanged
are not rewritten.
"""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

LINES = ["driver", "cuda-h", "cu13", "cu12"]
# Linker-made symbols, never exported on purpose.
SKIP = {"_edata", "_end", "__bss_start", "_init", "_fini"}
# The C++ runtime some NVIDIA libraries link statically and re-export (std::, __gnu_cxx::,
# operators new and delete, __cxa_*, the unwinder): a stub of these would interpose the
# process's own libstdc++, so the fakes leave them out.
CXX_RUNTIME_RE = re.compile(
    r"^(_ZNSt|_ZNKSt|_ZSt|_ZT[ISV]St|_ZTHN?St|_ZNSs|_ZNKSs|_ZNSi|_ZNKSi|_ZNSo|_ZNKSo|_ZNSd|"
    r"_Zdl|_Znw|_Zna|_Zda|_ZN9__gnu_cxx|_ZNK9__gnu_cxx|_ZT[ISV]N9__gnu_cxx|_ZN10__cxxabiv1|"
    r"_ZT[ISV]N10__cxxabiv1|__cxa_|__gxx_|_Unwind_|__gcclibcxx)")

# Libraries whose functions are another fake's (SONAME pattern, target SONAME): cuDNN 8 split
# its API over libcudnn.so.8 and six sub-libraries that the real libcudnn.so.8 dlopens; each
# sub-library exports its part of the API under its own version node. cuDNN 9 does the same
# with libcudnn.so.9 and libcudnn_{ops,cnn,adv,graph,ext}.so.9 (every function of
# libcudnn.so.9 is in exactly one of them; the engines and heuristic libraries share none). The
# fake keeps one implementation, in libcudnn.so.8 or .9, and the sub-libraries' copies jump to it.
FORWARDS = [(re.compile(r"libcudnn_(ops|cnn|adv)_(infer|train)\.so\.8"), "libcudnn.so.8"),
            (re.compile(r"libcudnn_\w+\.so\.9"), "libcudnn.so.9")]

# Each library's "not supported" status, returned by every stub (by SONAME prefix).
NOT_SUPPORTED = [
    ("libcudart.", 801, "cudaErrorNotSupported"),
    ("libcuda.", 801, "CUDA_ERROR_NOT_SUPPORTED"),
    ("libcublasLt.", 15, "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("libcublas.", 15, "CUBLAS_STATUS_NOT_SUPPORTED"),
    ("libnvblas.", 0, "void BLAS functions"),
    ("libcudnn", 3000, "CUDNN_STATUS_NOT_SUPPORTED"),
    ("libnccl.", 5, "ncclInvalidUsage"),
    ("libnvidia-ml.", 3, "NVML_ERROR_NOT_SUPPORTED"),
    ("libcusparseLt.", 10, "CUSPARSE_STATUS_NOT_SUPPORTED"),
    ("libcusparse.", 10, "CUSPARSE_STATUS_NOT_SUPPORTED"),
    ("libcusolver", 9, "CUSOLVER_STATUS_NOT_SUPPORTED"),
    ("libcufftw.", 0, "void FFTW functions"),
    ("libcufft.", 16, "CUFFT_NOT_SUPPORTED"),
    ("libcurand.", 204, "CURAND_STATUS_ARCH_MISMATCH"),
    ("libnvrtc", 11, "NVRTC_ERROR_INTERNAL_ERROR"),
    ("libnvJitLink.", 6, "NVJITLINK_ERROR_INTERNAL"),
    ("libcupti.", 27, "CUPTI_ERROR_NOT_SUPPORTED"),
    ("libnvperf", 6, "NVPA_STATUS_NOT_SUPPORTED"),
    ("libpcsamplingutil.", 27, "CUPTI_ERROR_NOT_SUPPORTED"),
    ("libcheckpoint.", 27, "CUPTI_ERROR_NOT_SUPPORTED"),
    ("libcufile", 5007, "CU_FILE_PLATFORM_NOT_SUPPORTED (cu_err 0)"),
    ("libnvshmem", 3, "NVSHMEMX_ERROR_NOT_SUPPORTED"),
    ("nvshmem_", 3, "NVSHMEMX_ERROR_NOT_SUPPORTED"),
]
# Functions that return a message (const char *), not a status: their stub returns text.
# The driver's and CUPTI's look-alikes take an out-parameter and return a status instead.
MESSAGE_RE = re.compile(r"(ErrorString|ErrorName|StatusString|StatusName|GetLastError)$")
MESSAGE_EXCEPT = ("libcuda.", "libcupti.", "libcudart.")
MESSAGE_RUNTIME = {"cudaGetErrorString", "cudaGetErrorName"}


def status_of(soname):
    for prefix, value, name in NOT_SUPPORTED:
        if soname.startswith(prefix):
            return value, name
    return -1, "generic failure"


def hand_dir(root, soname):
    stem = re.sub(r"^lib", "", soname)
    name, _, major = stem.partition(".so")
    major = major.lstrip(".").split(".")[0]
    for candidate in ([f"{name}.{major}"] if major else []) + [name]:
        path = os.path.join(root, "src", candidate)
        if os.path.isdir(path):
            return path
    return None


def soname_major(soname):
    """The first number after ".so." (libcudart.so.12 -> 12), 0 without one."""
    match = re.search(r"\.so\.(\d+)", soname)
    return int(match.group(1)) if match else 0


def read_tables(root):
    tables = {}  # soname -> {name: (version, kind, size)}
    for line in LINES:
        folder = os.path.join(root, "symbols", line)
        for file in sorted(os.listdir(folder)):
            if not file.endswith(".syms"):
                continue
            soname = file[: -len(".syms")]
            table = tables.setdefault(soname, {})
            with open(os.path.join(folder, file)) as text:
                for row in text:
                    if row.startswith("#") or not row.strip():
                        continue
                    name, version, kind, size = row.split()
                    if name not in SKIP and not CXX_RUNTIME_RE.match(name) and name not in table:
                        table[name] = (version, kind, int(size))
    return tables


def c_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'



CFLAGS = ["-O2", "-g", "-fPIC", "-fvisibility=hidden", "-std=gnu11", "-Wall", "-Wextra",
          "-Wno-unused-parameter", "-Werror"]


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"fakegpu build: {' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def write_if_changed(path, content):
    try:
        with open(path) as old:
            if old.read() == content:
                return
    except FileNotFoundError:
        pass
    with open(path + ".tmp", "w") as new:
        new.write(content)
    os.replace(path + ".tmp", path)


def stale(target, sources):
    try:
        built = os.path.getmtime(target)
    except FileNotFoundError:
        return True
    return any(os.path.getmtime(src) > built for src in sources)


def compile_c(source, obj, includes, depends, optimise=True, defines=()):
    if stale(obj, [source] + depends):
        run(["gcc"] + CFLAGS + ([] if optimise else ["-O0", "-g0"]) + [f"-I{inc}" for inc in includes]
            + [f"-D{define}" for define in defines] + ["-c", source, "-o", obj + ".tmp"])
        os.replace(obj + ".tmp", obj)
    return obj


def exported_by(obj):
    """The default-visibility symbols an object defines (hidden ones stay inside the library)."""
    names = set()
    for line in run(["readelf", "-s", "-W", obj]).splitlines():
        cols = line.split()
        if len(cols) >= 8 and cols[4] in ("GLOBAL", "WEAK") and cols[5] == "DEFAULT" and cols[6] != "UND":
            names.add(cols[7])
    return names


def forward_target(soname):
    for pattern, target in FORWARDS:
        if pattern.fullmatch(soname):
            return target
    return None


def forwarded(table, target_table):
    """The functions of `table` that `target_table` lists as functions: name -> the target's
    version node."""
    found = {}
    for name, (_, kind, _) in table.items():
        target = target_table.get(name)
        if kind == "func" and target and target[1] == "func":
            if not target[0].startswith("@@"):
                sys.exit(f"fakegpu build: forwarding {name} to an unversioned target: not handled")
            found[name] = target[0][2:]
    return found


def forward_source(index, name, node):
    """A function that jumps to `name@node` (another library's definition of the same name):
    a jump, not a call, so every argument and the return reach the target untouched."""
    target = f"fg_forward_target_{index}"
    return (f'__asm__(".symver {target}, {name}@{node}\\n"\n'
            f'        "\\t.text\\n\\t.globl {name}\\n\\t.type {name}, @function\\n"\n'
            f'        "{name}:\\n\\tjmp {target}@PLT\\n\\t.size {name}, .-{name}\\n");')


def stub_source(soname, table, hand_syms, noop_re=None, forwards=None):
    status, status_name = status_of(soname)
    lines = [
        f"/* Generated by fakegpu/build.py for {soname}: do not edit. */",
        '#include "fakegpu_stub.h"',
        f"/* Stubs return {status_name}. */",
    ]
    for index, (name, (version, kind, size)) in enumerate(sorted(table.items())):
        if name in hand_syms:
            continue
        label = c_string(name)
        if forwards and name in forwards:
            lines.append(forward_source(index, name, forwards[name]))
        elif kind == "object":
            lines.append(f"FG_OBJECT({index}, {label}, {max(size, 1)})")
        elif kind == "tls":
            lines.append(f"FG_TLS({index}, {label}, {max(size, 1)})")
        elif kind == "func" and noop_re and noop_re.fullmatch(name):
            lines.append(f"FG_NOOP({index}, {label})")
        elif kind == "func" and MESSAGE_RE.search(name) and (
            not soname.startswith(MESSAGE_EXCEPT) or name in MESSAGE_RUNTIME
        ):
            lines.append(f"FG_MESSAGE_STUB({index}, {label})")
        else:
            lines.append(f"FG_STUB({index}, {label}, {status})")
    return "\n".join(lines) + "\n"


def proc_table_source(soname, functions):
    """Every exported function by name, sorted (strcmp order) for the library's resolver."""
    lines = [f"/* Generated by fakegpu/build.py for {soname}: do not edit. */",
             "#include <stddef.h>",
             "struct fg_proc { const char *name; void *address; };"]
    for index, name in enumerate(functions):
        lines.append(f"extern char fg_proc_{index}[] __asm__({c_string(name)});")
    lines.append("__attribute__((visibility(\"hidden\"))) const struct fg_proc fg_procs[] = {")
    lines += [f"    {{{c_string(name)}, fg_proc_{index}}}," for index, name in enumerate(functions)]
    lines.append("};")
    lines.append(f"__attribute__((visibility(\"hidden\"))) const size_t fg_proc_count = {len(functions)};")
    return "\n".join(lines) + "\n"


def version_script(soname, table, hand_syms):
    nodes = {v[2:] for v, _, _ in table.values() if v.startswith("@@")}
    if len(nodes) > 1:
        sys.exit(f"fakegpu build: {soname} has several version nodes {sorted(nodes)}: not handled")
    exported = sorted(set(table) | hand_syms)
    # ld's version scripts cannot name a node with other characters (libnvrtc-builtins's
    # own node has a '-'); such a library is built unversioned, which satisfies versioned
    # references too, and only libnvrtc loads it (by dlopen).
    nodes = {node for node in nodes if re.fullmatch(r"[A-Za-z0-9_.]+", node)}
    body = "  global:\n" + "".join(f"    {c_string(name)};\n" for name in exported) + "  local: *;\n"
    return f"{next(iter(nodes))} {{\n{body}}};\n" if nodes else f"{{\n{body}}};\n"


def build_library(root, outdir, soname, table, forwards=None):
    obj_dir = os.path.join(outdir, "obj", soname)
    lib_dir = os.path.join(outdir, "lib")
    os.makedirs(obj_dir, exist_ok=True)
    common = os.path.join(root, "src", "common")
    include = os.path.join(root, "include")
    headers = [os.path.join(d, f) for d in (common, include) for f in sorted(os.listdir(d))]
    hand = hand_dir(root, soname)
    hand_objs, link_args, link_files = [], [], []
    if hand:
        sources = sorted(f for f in os.listdir(hand) if f.endswith(".c"))
        local_headers = [os.path.join(hand, f) for f in os.listdir(hand) if f.endswith(".h")]
        for source in sources:
            hand_objs.append(compile_c(os.path.join(hand, source),
                                       os.path.join(obj_dir, source[:-2] + ".o"),
                                       [hand, common, include], headers + local_headers,
                                       defines=[f"FG_SONAME_MAJOR={soname_major(soname)}"]))
        link_file = os.path.join(hand, "link.txt")
        if os.path.exists(link_file):
            with open(link_file) as text:
                link_args = text.read().split()
            link_files.append(link_file)
    hand_syms = set()
    for obj in hand_objs:
        hand_syms |= exported_by(obj)
    noop_re = None
    if hand and os.path.exists(os.path.join(hand, "noop.txt")):
        with open(os.path.join(hand, "noop.txt")) as text:
            patterns = [l.strip() for l in text if l.strip() and not l.startswith("#")]
        noop_re = re.compile("|".join(f"(?:{p})" for p in patterns))
    stubs = os.path.join(obj_dir, "stubs.c")
    write_if_changed(stubs, stub_source(soname, table, hand_syms, noop_re, forwards))
    if forwards:
        link_args = link_args + [f"-l:{forward_target(soname)}"]
    mapfile = os.path.join(obj_dir, "exports.map")
    write_if_changed(mapfile, version_script(soname, table, hand_syms))
    if hand and os.path.exists(os.path.join(hand, "proc_table")):
        functions = {n for n, (_, kind, _) in table.items() if kind == "func"} | hand_syms
        procs = os.path.join(obj_dir, "procs.c")
        write_if_changed(procs, proc_table_source(soname, sorted(functions)))
        hand_objs.append(compile_c(procs, os.path.join(obj_dir, "procs.o"), [common], headers,
                                   optimise=False))
    objs = hand_objs + [
        compile_c(stubs, os.path.join(obj_dir, "stubs.o"), [common], headers, optimise=False),
        compile_c(os.path.join(common, "fakegpu_log.c"), os.path.join(obj_dir, "fakegpu_log.o"),
                  [common], headers),
    ]
    target = os.path.join(lib_dir, soname)
    # This script too: its link flags are inputs.
    if stale(target, objs + [mapfile, os.path.abspath(__file__)] + link_files):
        # RUNPATH $ORIGIN: a fake that needs the fake driver finds it beside itself, so the
        # wheel's copies resolve among themselves (auditwheel checks that).
        run(["gcc", "-shared", "-o", target + ".tmp", f"-Wl,-soname,{soname}",
             f"-Wl,--version-script={mapfile}", "-Wl,-z,now", "-Wl,-z,defs", "-Wl,--no-undefined-version",
             "-Wl,-rpath,$ORIGIN"]
            + objs + [f"-L{lib_dir}"] + link_args + ["-lpthread", "-ldl", "-lc"])
        os.replace(target + ".tmp", target)
    return soname


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root, outdir = sys.argv[1], sys.argv[2]
    tables = read_tables(root)
    os.makedirs(os.path.join(outdir, "lib"), exist_ok=True)
    # The driver first: other hand-written libraries link against it.
    build_library(root, outdir, "libcuda.so.1", tables.pop("libcuda.so.1"))
    forwarding = {s: forward_target(s) for s in tables if forward_target(s)}
    for soname, target in forwarding.items():
        if target not in tables:
            sys.exit(f"fakegpu build: {soname} forwards to {target}, which no list names")
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        # Then every other library, targets of forwarding among them; then the forwarders,
        # which link against their target.
        for future in [pool.submit(build_library, root, outdir, s, t)
                       for s, t in sorted(tables.items()) if s not in forwarding]:
            future.result()
        for future in [pool.submit(build_library, root, outdir, s, tables[s],
                                   forwarded(tables[s], tables[target]))
                       for s, target in sorted(forwarding.items())]:
            future.result()
    print(f"fakegpu: {len(tables) + 1} libraries in {os.path.join(outdir, 'lib')}", file=sys.stderr)


if __name__ == "__main__":
    main()
