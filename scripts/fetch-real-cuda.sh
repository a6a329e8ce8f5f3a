#!/usr/bin/env bash
# Download, once, the real NVIDIA CUDA user-space libraries used by the "real" tests:
#   - libcudart.so.12 from the PyPI wheel nvidia-cuda-runtime-cu12 (pinned, hash-checked);
#   - libcuda.so.535.* from Debian bookworm non-free package libcuda1 (signed archive),
#     fetched with a PRIVATE apt configuration so the system apt state is not touched.
#
# Cache: ${VRAMSHIM_CACHE:-$HOME/.cache/vramshim}/real-cuda
#   libcudart.so.12            real file from the wheel
#   libcuda.so.535.<x>.<y>     real file from the .deb
#   libcuda.so.1 -> libcuda.so.535.<x>.<y>
#   VERSIONS                   what was fetched (written last: its presence marks a complete cache)
#
# stdout: the cache directory, as the last (only) line. Everything else goes to stderr.
# Exit 3 with a one-line message on stderr when the libraries cannot be obtained.
#
# These files are NVIDIA-licensed: never commit them (they live outside the repository).
set -euo pipefail

CUDART_WHEEL_PKG=nvidia-cuda-runtime-cu12
CUDART_WHEEL_VERSION=12.9.79
CUDART_WHEEL_PLATFORM=manylinux2014_x86_64
CUDART_WHEEL_SHA256=25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3
# Preferred libcuda1 version. Debian point releases replace it in the archive; when it is
# gone, the newest 535.* candidate from bookworm non-free is taken (and recorded in VERSIONS).
LIBCUDA_DEB_VERSION=535.261.03-1
DEBIAN_SOURCE='deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm non-free'

CACHE_ROOT=${VRAMSHIM_CACHE:-${HOME:-/tmp}/.cache/vramshim}
DEST=$CACHE_ROOT/real-cuda

say() { printf 'fetch-real-cuda: %s\n' "$*" >&2; }
unavailable() {
    printf 'fetch-real-cuda: real CUDA libraries unavailable: %s\n' "$*" >&2
    exit 3
}

cache_complete() {
    [[ -f $DEST/VERSIONS && -f $DEST/libcudart.so.12 && -e $DEST/libcuda.so.1 ]] &&
        grep -qx "cudart_wheel=$CUDART_WHEEL_PKG==$CUDART_WHEEL_VERSION" "$DEST/VERSIONS"
}

# Fast path: no network, no lock, no tools needed.
if cache_complete; then
    printf '%s\n' "$DEST"
    exit 0
fi

[[ $(uname -m) == x86_64 ]] || unavailable "only x86_64 is supported (this is $(uname -m))"
for tool in python3 apt-get dpkg-deb unzip sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || unavailable "required tool '$tool' not found"
done
[[ -r /usr/share/keyrings/debian-archive-keyring.gpg ]] ||
    unavailable "Debian archive keyring /usr/share/keyrings/debian-archive-keyring.gpg not found"

mkdir -p "$CACHE_ROOT" || unavailable "cannot create $CACHE_ROOT"

# Serialise concurrent callers (parallel test runs).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE_ROOT/real-cuda.lock"
    flock 9
    if cache_complete; then
        printf '%s\n' "$DEST"
        exit 0
    fi
fi

WORK=$(mktemp -d "$CACHE_ROOT/real-cuda.tmp.XXXXXX") || unavailable "cannot create a temporary directory"
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/stage
mkdir -p "$STAGE"

# ---------------------------------------------------------------- libcudart.so.12 (PyPI)
say "downloading $CUDART_WHEEL_PKG==$CUDART_WHEEL_VERSION from PyPI"
printf '%s==%s --hash=sha256:%s\n' "$CUDART_WHEEL_PKG" "$CUDART_WHEEL_VERSION" "$CUDART_WHEEL_SHA256" \
    >"$WORK/requirements.txt"
python3 -m pip download --no-deps --only-binary=:all: --platform "$CUDART_WHEEL_PLATFORM" \
    --require-hashes -r "$WORK/requirements.txt" -d "$WORK/wheel" \
    --disable-pip-version-check --no-input --retries 2 --timeout 30 >"$WORK/pip.log" 2>&1 || {
    tail -n 3 "$WORK/pip.log" >&2
    unavailable "pip download of $CUDART_WHEEL_PKG==$CUDART_WHEEL_VERSION failed"
}
wheel=$(ls "$WORK"/wheel/*.whl 2>/dev/null | head -n1 || true)
[[ -n $wheel ]] || unavailable "pip produced no wheel for $CUDART_WHEEL_PKG==$CUDART_WHEEL_VERSION"
unzip -q -j -o "$wheel" 'nvidia/cuda_runtime/lib/libcudart.so.12' -d "$STAGE" >&2 ||
    unavailable "libcudart.so.12 not found in $(basename "$wheel")"
wheel_size=$(stat -c %s "$wheel")

# ---------------------------------------------------------------- libcuda.so.535 (Debian)
APT=$WORK/apt
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/etc/sources.list.d" \
    "$APT/etc/apt.conf.d" "$APT/etc/preferences.d" "$APT/state" "$APT/download"
printf '%s\n' "$DEBIAN_SOURCE" >"$APT/etc/sources.list"
: >"$APT/state/status"
# APT_CONFIG is read before /etc/apt/apt.conf.d, so pointing Dir::Etc::Parts at an empty
# private directory keeps the system's hooks (e.g. docker-clean's Post-Invoke that deletes
# /var/cache/apt/*.bin) from running. Everything else is set with -o below.
cat >"$APT/apt.conf" <<EOF
Dir::Etc::Parts "$APT/etc/apt.conf.d";
Dir::Etc::Main "$APT/etc/apt.conf";
EOF
apt_opts=(
    -o "Dir::Etc::SourceList=$APT/etc/sources.list"
    -o "Dir::Etc::SourceParts=$APT/etc/sources.list.d"
    -o "Dir::Etc::Preferences=$APT/etc/preferences"
    -o "Dir::Etc::PreferencesParts=$APT/etc/preferences.d"
    -o "Dir::State=$APT/state"
    -o "Dir::State::Lists=$APT/lists"
    -o "Dir::State::status=$APT/state/status"
    -o "Dir::Cache=$APT/cache"
    -o "Dir::Log=$APT/state"
    -o "APT::Architecture=amd64"
    -o "APT::Architectures::=amd64"
    -o "APT::Sandbox::User=root"
    -o "Acquire::Languages=none"
    # The system configuration sets this too (its mirrors may serve dated snapshots);
    # the Release file's signature is still verified.
    -o "Acquire::Check-Valid-Until=false"
)
say "updating private apt lists for bookworm non-free"
APT_CONFIG=$APT/apt.conf apt-get "${apt_opts[@]}" -q update >"$APT/update.log" 2>&1 || {
    tail -n 5 "$APT/update.log" >&2
    unavailable "apt-get update of bookworm non-free (deb.debian.org) failed"
}
# apt-get update exits 0 even when a source failed; check the index really arrived.
ls "$APT"/lists/*non-free*Packages* >/dev/null 2>&1 || {
    grep -E '^(W|E): ' "$APT/update.log" | sort -u >&2 || true
    unavailable "no package index for bookworm non-free was downloaded"
}
grep -E '^(W|E): ' "$APT/update.log" | sort -u >&2 || true

candidates=$(APT_CONFIG=$APT/apt.conf apt-cache "${apt_opts[@]}" madison libcuda1 2>/dev/null |
    awk -F'|' '{gsub(/ /, "", $2); print $2}' || true)
if grep -qxF "$LIBCUDA_DEB_VERSION" <<<"$candidates"; then
    deb_version=$LIBCUDA_DEB_VERSION
else
    deb_version=$(grep -E '^535\.' <<<"$candidates" | sort -V | tail -n1 || true)
    [[ -n $deb_version ]] || unavailable "libcuda1 535.* not found in bookworm non-free"
    say "note: pinned libcuda1=$LIBCUDA_DEB_VERSION is gone from the archive; using $deb_version"
fi
say "downloading libcuda1=$deb_version from Debian bookworm non-free"
(cd "$APT/download" && APT_CONFIG=$APT/apt.conf apt-get "${apt_opts[@]}" -q download "libcuda1=$deb_version") \
    >"$APT/download.log" 2>&1 || {
    tail -n 5 "$APT/download.log" >&2
    unavailable "apt-get download libcuda1=$deb_version failed"
}
deb=$(ls "$APT"/download/libcuda1_*.deb 2>/dev/null | head -n1 || true)
[[ -n $deb ]] || unavailable "apt-get download produced no libcuda1 .deb"
deb_size=$(stat -c %s "$deb")
dpkg-deb -x "$deb" "$WORK/deb" || unavailable "dpkg-deb -x $(basename "$deb") failed"
real_cuda=$(find "$WORK/deb" -type f -name 'libcuda.so.535.*' | head -n1 || true)
[[ -n $real_cuda ]] || unavailable "libcuda.so.535.* not found in $(basename "$deb")"
cuda_name=$(basename "$real_cuda")
cp "$real_cuda" "$STAGE/$cuda_name"
ln -s "$cuda_name" "$STAGE/libcuda.so.1"
chmod 0755 "$STAGE/libcudart.so.12" "$STAGE/$cuda_name"

# ---------------------------------------------------------------- commit to the cache
cat >"$STAGE/VERSIONS" <<EOF
cudart_wheel=$CUDART_WHEEL_PKG==$CUDART_WHEEL_VERSION
cudart_wheel_file=$(basename "$wheel")
cudart_wheel_bytes=$wheel_size
cudart_sha256=$(sha256sum "$STAGE/libcudart.so.12" | cut -d' ' -f1)
libcuda_deb=libcuda1=$deb_version
libcuda_deb_file=$(basename "$deb")
libcuda_deb_bytes=$deb_size
libcuda_file=$cuda_name
libcuda_sha256=$(sha256sum "$STAGE/$cuda_name" | cut -d' ' -f1)
fetched=$(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
rm -rf "$DEST"
mv "$STAGE" "$DEST"
say "cached in $DEST ($(basename "$wheel"): $wheel_size bytes, $(basename "$deb"): $deb_size bytes)"
printf '%s\n' "$DEST"
