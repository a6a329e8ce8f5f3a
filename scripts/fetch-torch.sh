#!/usr/bin/env bash
# Install, once, a real PyTorch CUDA wheel from PyPI into a cached virtual environment for
# the fake-GPU tests (tests/tests/fakegpu_torch.rs): torch itself with --no-deps, plus its
# pure-Python dependencies at the versions that torch release pins; none of NVIDIA's wheels
# (the fakes stand in for them).
#
# usage: fetch-torch.sh [--extras] [VERSION]   (default $VRAMSHIM_TORCH_VERSION, else 2.15.0)
# --extras also installs, once, into the same venv (own lock; the file EXTRAS inside marks it
#        done): triton at torch's own pin (torch.compile), torchvision (--no-deps), pillow and
#        numpy (torchvision imports them). Only for the releases listed in torchvision_for().
# The releases the tests use: 2.15.0 (PyPI's build for CUDA 13), 2.6.0 and 2.4.1 (PyPI's builds
# for CUDA 12.4 and 12.1: libcudart.so.12, cuBLAS 12, cuDNN 9), 2.3.1, 2.2.2 and 2.1.2
# (CUDA 12.1, cuDNN 8).
# Cache: ${VRAMSHIM_CACHE:-$HOME/.cache/vramshim}/torch-<version>/ (a venv; the file VERSION
#        inside is written last: its presence marks a complete install).
# stdout: the venv's python, as the last (only) line. Everything else goes to stderr.
# Exit 3 with a one-line message on stderr when torch cannot be installed (no network, ...).
#
# usage: fetch-torch.sh --nvtx
# NVIDIA's real NVTX 2 library, libnvToolsExt.so.1 (what torch 2.4 and older link; the fake GPU
# has its own, tested against it), from PyPI's nvidia-nvtx-cu12 wheel (checked against its sha256),
# unpacked once into ${VRAMSHIM_CACHE:-$HOME/.cache/vramshim}/nvtx-cu12-<version>/ (the file
# VERSION inside is written last). stdout: the library's path, as the last line; exit 3 when
# it cannot be fetched.
set -euo pipefail

NVTX_WHEEL_VERSION=12.1.105
NVTX_WHEEL_SHA256=dc21cf308ca5691e7c04d962e213f8a4aa9bbfa23d95412f452254c2caeb09e5

if [[ ${1:-} == --nvtx ]]; then
    [[ $# -eq 1 ]] || { echo "usage: scripts/fetch-torch.sh --nvtx" >&2; exit 2; }
    CACHE_ROOT=${VRAMSHIM_CACHE:-${HOME:-/tmp}/.cache/vramshim}
    NVTX_DIR=$CACHE_ROOT/nvtx-cu12-$NVTX_WHEEL_VERSION
    NVTX_LIB=$NVTX_DIR/nvidia/nvtx/lib/libnvToolsExt.so.1
    nvtx_unavailable() {
        printf 'fetch-torch: libnvToolsExt.so.1 unavailable: %s\n' "$*" >&2
        exit 3
    }
    if [[ ! -f $NVTX_DIR/VERSION ]]; then
        mkdir -p "$CACHE_ROOT" || nvtx_unavailable "cannot create $CACHE_ROOT"
        if command -v flock >/dev/null 2>&1; then
            exec 9>"$NVTX_DIR.lock"
            flock 9
        fi
    fi
    if [[ ! -f $NVTX_DIR/VERSION ]]; then
        command -v python3 >/dev/null 2>&1 || nvtx_unavailable "python3 not found"
        rm -rf "$NVTX_DIR"
        mkdir -p "$NVTX_DIR/wheel"
        printf 'fetch-torch: downloading nvidia-nvtx-cu12==%s (100 kB)\n' "$NVTX_WHEEL_VERSION" >&2
        python3 -m pip --disable-pip-version-check --no-input download --no-deps \
            --only-binary=:all: --platform manylinux1_x86_64 --python-version 3 \
            --retries 2 --timeout 60 -d "$NVTX_DIR/wheel" \
            "nvidia-nvtx-cu12==$NVTX_WHEEL_VERSION" >"$NVTX_DIR.pip.log" 2>&1 || {
            tail -n 3 "$NVTX_DIR.pip.log" >&2
            rm -rf "$NVTX_DIR"
            nvtx_unavailable "pip download of nvidia-nvtx-cu12==$NVTX_WHEEL_VERSION failed"
        }
        python3 - "$NVTX_DIR" "$NVTX_WHEEL_SHA256" <<'PY' || { rm -rf "$NVTX_DIR"; nvtx_unavailable "the wheel is not the expected one"; }
import glob, hashlib, sys, zipfile
root, expected = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(root + "/wheel/*.whl")
digest = hashlib.sha256(open(wheel, "rb").read()).hexdigest()
if digest != expected:
    sys.exit(f"fetch-torch: {wheel}: sha256 {digest}, expected {expected}")
zipfile.ZipFile(wheel).extract("nvidia/nvtx/lib/libnvToolsExt.so.1", root)
PY
        printf 'nvidia-nvtx-cu12==%s sha256 %s\n' "$NVTX_WHEEL_VERSION" "$NVTX_WHEEL_SHA256" \
            >"$NVTX_DIR/VERSION"
    fi
    [[ -f $NVTX_LIB ]] || nvtx_unavailable "$NVTX_LIB missing"
    printf '%s\n' "$NVTX_LIB"
    exit 0
fi

EXTRAS=0
if [[ ${1:-} == --extras ]]; then
    EXTRAS=1
    shift
fi
[[ $# -le 1 ]] || { echo "usage: scripts/fetch-torch.sh [--extras] [VERSION]" >&2; exit 2; }
TORCH_VERSION=${1:-${VRAMSHIM_TORCH_VERSION:-2.15.0}}
[[ $TORCH_VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || {
    echo "fetch-torch: not a torch release number: '$TORCH_VERSION'" >&2
    exit 2
}

CACHE_ROOT=${VRAMSHIM_CACHE:-${HOME:-/tmp}/.cache/vramshim}
VENV=$CACHE_ROOT/torch-$TORCH_VERSION

say() { printf 'fetch-torch: %s\n' "$*" >&2; }
unavailable() {
    printf 'fetch-torch: torch unavailable: %s\n' "$*" >&2
    exit 3
}

# The torchvision release that runs with a torch release (PyPI has none newer for 2.15:
# 0.29.2 requires torch>=2.14 and is built against torch's stable ABI).
torchvision_for() {
    case $1 in
    2.15.0) echo 0.29.2 ;;
    *) return 1 ;;
    esac
}

# Installs the extras into the complete venv $VENV, once; prints nothing on stdout.
install_extras() {
    [[ -f $VENV/EXTRAS ]] && return 0
    local torchvision
    torchvision=$(torchvision_for "$TORCH_VERSION") ||
        unavailable "no torchvision/triton extras known for torch $TORCH_VERSION"
    if command -v flock >/dev/null 2>&1; then
        exec 8>"$CACHE_ROOT/torch-$TORCH_VERSION-extras.lock"
        flock 8
        [[ -f $VENV/EXTRAS ]] && return 0
    fi
    local triton
    triton=$("$VENV/bin/python" - <<'PY'
import importlib.metadata as metadata
from pip._vendor.packaging.requirements import Requirement
for text in metadata.requires("torch") or []:
    requirement = Requirement(text)
    if requirement.name == "triton":
        print(requirement.name + str(requirement.specifier))
PY
) || unavailable "cannot read torch's requirements"
    [[ -n $triton ]] || unavailable "torch $TORCH_VERSION does not name a triton release"
    local log=$CACHE_ROOT/torch-$TORCH_VERSION-extras-pip.log
    say "installing extras: $triton torchvision==$torchvision pillow numpy (about 320 MB)"
    "$VENV/bin/python" -m pip --disable-pip-version-check --no-input install --no-deps \
        --only-binary=:all: --retries 2 --timeout 60 "$triton" "torchvision==$torchvision" \
        pillow numpy >"$log" 2>&1 || {
        tail -n 3 "$log" >&2
        unavailable "pip install of the extras failed"
    }
    printf '%s torchvision==%s installed %s\n' "$triton" "$torchvision" \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$VENV/EXTRAS"
    say "installed the extras in $VENV"
}

if [[ -f $VENV/VERSION ]]; then
    say "reusing $VENV ($(cat "$VENV/VERSION"))"
    [[ $EXTRAS == 0 ]] || install_extras
    printf '%s\n' "$VENV/bin/python"
    exit 0
fi

[[ $(uname -m) == x86_64 ]] || unavailable "only x86_64 is supported (this is $(uname -m))"
command -v python3 >/dev/null 2>&1 || unavailable "python3 not found"
mkdir -p "$CACHE_ROOT" || unavailable "cannot create $CACHE_ROOT"

# Serialise concurrent callers (parallel test runs).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE_ROOT/torch-$TORCH_VERSION.lock"
    flock 9
    if [[ -f $VENV/VERSION ]]; then
        [[ $EXTRAS == 0 ]] || install_extras
        printf '%s\n' "$VENV/bin/python"
        exit 0
    fi
fi

rm -rf "$VENV"
say "creating $VENV"
python3 -m venv "$VENV" >&2 || unavailable "python3 -m venv failed (is the venv module installed?)"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input)
log=$CACHE_ROOT/torch-$TORCH_VERSION-pip.log
say "installing torch==$TORCH_VERSION (500-900 MB) with --no-deps"
"${pip[@]}" install --no-deps --only-binary=:all: --retries 2 --timeout 60 \
    "torch==$TORCH_VERSION" >"$log" 2>&1 || {
    tail -n 3 "$log" >&2
    rm -rf "$VENV"
    unavailable "pip install torch==$TORCH_VERSION failed"
}
# torch's own requirements at its pins (sympy==1.13.1 for 2.6), less NVIDIA's CUDA packages and
# triton (only torch.compile needs triton) and those whose environment marker is false here.
pure_deps=$("$VENV/bin/python" - <<'PY'
import importlib.metadata as metadata
from pip._vendor.packaging.requirements import Requirement
for text in metadata.requires("torch") or []:
    requirement = Requirement(text)
    if requirement.name.startswith(("nvidia-", "cuda-", "triton")):
        continue
    if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
        print(str(requirement).split(";")[0].strip())
PY
) || unavailable "cannot read torch's requirements"
mapfile -t pure_deps <<<"$pure_deps"
say "installing torch's pure-Python dependencies: ${pure_deps[*]}"
"${pip[@]}" install --only-binary=:all: --retries 2 --timeout 60 "${pure_deps[@]}" \
    >>"$log" 2>&1 || {
    tail -n 3 "$log" >&2
    rm -rf "$VENV"
    unavailable "pip install of torch's dependencies failed"
}
installed=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))') ||
    unavailable "torch does not report its version"
printf 'torch==%s installed %s\n' "$installed" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$VENV/VERSION"
say "installed torch $installed in $VENV"
[[ $EXTRAS == 0 ]] || install_extras
printf '%s\n' "$VENV/bin/python"
