#!/usr/bin/env bash
# Regenerate fakegpu/symbols/: the whole export table (names, version nodes, kinds, sizes) of
# every NVIDIA library the fake GPU imitates, from NVIDIA's published packages.
#   cu13/, cu12/  the PyPI wheels pinned below (CUDA 13 line and CUDA 12 line);
#   driver/       libcuda.so.1 and libnvidia-ml.so.1 from Debian's non-free libcuda1 and
#                 libnvidia-ml1 (not published as wheels);
#   cuda-h/       libcuda.so.1: every function CUDA 13's cuda.h declares (Debian's driver is
#                 older than CUDA 13).
# Run by hand when a new CUDA release comes out; the downloads (several GB) go to a scratch
# directory (FAKEGPU_SYMBOLS_WORK, default a temporary one) and only text is written to the
# repository. Never run in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=fakegpu/symbols

# Package==version per CUDA line (the newest on PyPI when the lists were made).
CU13=(
    nvidia-cuda-runtime==13.5.37 nvidia-cublas==13.10.0.20 nvidia-cudnn-cu13==9.28.1.4
    nvidia-nccl-cu13==2.32.3 nvidia-cusparse==12.9.4.2 nvidia-cusolver==12.4.1.2
    nvidia-cufft==12.5.0.14 nvidia-curand==10.4.5.25 nvidia-cuda-nvrtc==13.5.37
    nvidia-nvjitlink==13.5.37 nvidia-cuda-cupti==13.5.25 nvidia-cufile==1.20.0.107
    nvidia-nvshmem-cu13==3.8.0 nvidia-cusparselt-cu13==0.10.0
)
CU12=(
    nvidia-cuda-runtime-cu12==12.9.79 nvidia-cublas-cu12==12.9.3.13 nvidia-cudnn-cu12==9.28.0.42
    nvidia-nccl-cu12==2.32.3 nvidia-cusparse-cu12==12.5.10.65 nvidia-cusolver-cu12==11.7.5.82
    nvidia-cufft-cu12==11.4.1.4 nvidia-curand-cu12==10.3.10.19 nvidia-cuda-nvrtc-cu12==12.9.86
    nvidia-nvjitlink-cu12==12.9.86 nvidia-cuda-cupti-cu12==12.9.79 nvidia-cufile-cu12==1.14.1.1
    nvidia-nvshmem-cu12==3.8.0 nvidia-cusparselt-cu12==0.8.1
    # libnvToolsExt.so.1, which torch 2.4 and older link (12.9's wheel has only NVTX 3's
    # interop library).
    nvidia-nvtx-cu12==12.1.105
    # cuDNN 8 (libcudnn.so.8 and its six sub-libraries), which torch 2.3 and older link: the
    # release torch 2.3 pins.
    nvidia-cudnn-cu12==8.9.2.26
)
# Debian suite holding the newest driver packages.
DEBIAN_SUITE=${FAKEGPU_DEBIAN_SUITE:-sid}
DEBIAN_SOURCE="deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $DEBIAN_SUITE non-free"

# Any x86-64 manylinux wheel (pip needs each accepted tag named).
PLATFORMS=(--platform manylinux1_x86_64 --platform manylinux2010_x86_64 --platform manylinux2014_x86_64)
for glibc in 5 12 17 24 25 26 27 28 29 31 34 35 39; do PLATFORMS+=(--platform "manylinux_2_${glibc}_x86_64"); done

WORK=${FAKEGPU_SYMBOLS_WORK:-$(mktemp -d)}
mkdir -p "$WORK"
say() { printf 'fakegpu-symbols: %s\n' "$*" >&2; }

wheels() { # LINE PKG==VER...
    local line=$1; shift
    local spec archives=()
    mkdir -p "$WORK/$line" "$OUT/$line"
    for spec in "$@"; do
        local pkg=${spec%%==*} ver=${spec##*==}
        local have
        have=$(ls "$WORK/$line/${pkg//-/_}-$ver-"*.whl 2>/dev/null | head -n1 || true)
        if [[ -z $have ]]; then
            say "downloading $spec"
            python3 -m pip download --no-deps --only-binary=:all: "${PLATFORMS[@]}" \
                --python-version 3.12 -d "$WORK/$line" "$spec" >&2
            have=$(ls "$WORK/$line/${pkg//-/_}-$ver-"*.whl | head -n1)
        fi
        archives+=("$have=$spec ($(basename "$have"))")
    done
    rm -f "$OUT/$line"/*.syms
    python3 scripts/fakegpu-symbols.py "$OUT/$line" "${archives[@]}"
}

debs() {
    local APT=$WORK/apt
    mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/etc/apt.conf.d" \
        "$APT/etc/sources.list.d" "$APT/etc/preferences.d" "$APT/state" "$APT/download"
    printf '%s\n' "$DEBIAN_SOURCE" >"$APT/etc/sources.list"
    : >"$APT/state/status"
    printf 'Dir::Etc::Parts "%s/etc/apt.conf.d";\nDir::Etc::Main "%s/etc/apt.conf";\n' "$APT" "$APT" >"$APT/apt.conf"
    local opts=(
        -o "Dir::Etc::SourceList=$APT/etc/sources.list" -o "Dir::Etc::SourceParts=$APT/etc/sources.list.d"
        -o "Dir::Etc::Preferences=$APT/etc/preferences" -o "Dir::Etc::PreferencesParts=$APT/etc/preferences.d"
        -o "Dir::State=$APT/state" -o "Dir::State::Lists=$APT/lists" -o "Dir::State::status=$APT/state/status"
        -o "Dir::Cache=$APT/cache" -o "Dir::Log=$APT/state" -o "APT::Architecture=amd64"
        -o "APT::Architectures::=amd64" -o "APT::Sandbox::User=root" -o "Acquire::Languages=none"
        -o "Acquire::Check-Valid-Until=false"
    )
    say "apt-get update ($DEBIAN_SUITE non-free, private configuration)"
    APT_CONFIG=$APT/apt.conf apt-get "${opts[@]}" -q update >&2
    local pkg archives=()
    for pkg in libcuda1 libnvidia-ml1; do
        local ver
        ver=$(APT_CONFIG=$APT/apt.conf apt-cache "${opts[@]}" madison "$pkg" | awk -F'|' '{gsub(/ /,"",$2); print $2}' | sort -V | tail -n1)
        [[ -n $ver ]] || { say "$pkg not found in $DEBIAN_SUITE non-free"; exit 3; }
        (cd "$APT/download" && APT_CONFIG=$APT/apt.conf apt-get "${opts[@]}" -q download "$pkg=$ver" >&2)
        local deb
        deb=$(ls "$APT/download/${pkg}_"*.deb | head -n1)
        archives+=("$deb=Debian $DEBIAN_SUITE non-free $pkg=$ver ($(basename "$deb"))")
    done
    mkdir -p "$OUT/driver"
    rm -f "$OUT/driver"/*.syms
    python3 scripts/fakegpu-symbols.py "$OUT/driver" "${archives[@]}"
}

# The driver functions CUDA 13's cuda.h declares (under the names its #defines map them to):
# Debian's newest libcuda1 is older than CUDA 13, and a CUDA 13 library may ask the resolver
# for any of them.
header_driver() {
    local wheel
    wheel=$(ls "$WORK/cu13/nvidia_cuda_runtime-"*.whl | head -n1)
    mkdir -p "$OUT/cuda-h"
    python3 - "$wheel" "$OUT/cuda-h/libcuda.so.1.syms" "${CU13[0]}" <<'PY'
import hashlib, re, sys, zipfile
wheel, out, spec = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith("/include/cuda.h"))
    text = z.read(member).decode()
mapped = dict(re.findall(r"#define\s+(cu\w+)\s+(cu\w+_v\d+)\b", text))
names = sorted({mapped.get(n, n) for n in re.findall(r"CUresult\s+CUDAAPI\s+(cu\w+)\s*\(", text)})
digest = hashlib.sha256(open(wheel, "rb").read()).hexdigest()
version = re.search(r"#define CUDA_VERSION (\d+)", text).group(1)
with open(out, "w") as f:
    f.write(f"# libcuda.so.1: the driver functions declared by {member} (CUDA_VERSION "
            f"{version})\n")
    f.write(f"# from {spec} ({wheel.rsplit('/', 1)[-1]})\n# archive sha256 {digest}\n")
    f.write("# columns: name version(@@default, @old, - none) kind size\n")
    f.writelines(f"{n} - func 0\n" for n in names)
print(f"{out}: {len(names)} symbols", file=sys.stderr)
PY
}

wheels cu13 "${CU13[@]}"
wheels cu12 "${CU12[@]}"
header_driver
debs
say "done: $(ls "$OUT"/*/*.syms | wc -l) libraries under $OUT (downloads kept in $WORK)"
