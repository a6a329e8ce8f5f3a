#!/usr/bin/env bash
# Builds the `pip install vramshim` wheel: the `vramshim` command, libvramshim.so and the fake
# GPU libraries (fakegpu/lib), with the Python package python/vramshim (`vramshim.mark`,
# `python -m vramshim`, the `vramshim` console script). Assembled here (zip + METADATA, WHEEL,
# RECORD, entry_points.txt): no maturin or setuptools needed.
#
#   scripts/build-wheel.sh [--out DIR] [--from TARGET_PROFILE_DIR]
#     --out DIR     where the wheel goes (default: target/wheels)
#     --from DIR    package what DIR holds (such as target/debug) instead of running
#                   `cargo build --release` and packaging target/release
#     --no-strip    keep the binaries' debug sections (by default `strip --strip-debug`
#                   takes them out of the wheel's copies; symbol tables stay)
#
# The platform tag is manylinux_2_N_x86_64, N the newest glibc symbol version the binaries
# need (read with objdump), so pip installs it only where that glibc is present.
# Prints the wheel's path on the last line of stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=target/wheels
from=
strip_debug=1
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) out=$2; shift 2 ;;
        --from) from=$2; shift 2 ;;
        --no-strip) strip_debug=0; shift ;;
        *) echo "build-wheel.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
    esac
done

if [[ -z $from ]]; then
    target="${CARGO_TARGET_DIR:-$PWD/target}"
    echo "== cargo build --release (the recorder, the command, the fake GPU libraries)" >&2
    cargo build --release -p vramshim -p vramshim-nvtx -p vramshim-report -p vramshim-fakegpu >&2
    from=$target/release
fi
for needed in "$from/vramshim" "$from/libvramshim.so" "$from/libvramshim_nvtx.so" "$from/fakegpu/lib"; do
    if [[ ! -e $needed ]]; then
        echo "build-wheel.sh: $needed is missing (build first, or give --from)" >&2
        exit 1
    fi
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' report/Cargo.toml | head -1)
if [[ -z $version ]]; then
    version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
fi
glibc_minor=$(objdump -T "$from/vramshim" "$from/libvramshim.so" "$from/libvramshim_nvtx.so" "$from"/fakegpu/lib/*.so* 2>/dev/null |
    grep -o 'GLIBC_2\.[0-9]*' | sed 's/GLIBC_2\.//' | sort -n | tail -1)
if [[ -z $glibc_minor ]]; then
    echo "build-wheel.sh: cannot read the glibc versions the binaries need (objdump -T)" >&2
    exit 1
fi
# manylinux tags start at glibc 2.17.
((glibc_minor < 17)) && glibc_minor=17
mkdir -p "$out"

if ((strip_debug)) && ! command -v strip >/dev/null; then
    echo "build-wheel.sh: strip (binutils) not found; give --no-strip to package unstripped binaries" >&2
    exit 1
fi

python3 - "$from" "$out" "$version" "manylinux_2_${glibc_minor}_x86_64" "$strip_debug" <<'PY'
import base64, hashlib, os, stat, subprocess, sys, tempfile, zipfile

source, out, version, platform, strip_debug = sys.argv[1:6]
name = "vramshim"
tag = f"py3-none-{platform}"
dist_info = f"{name}-{version}.dist-info"
wheel_path = os.path.join(out, f"{name}-{version}-{tag}.whl")

# (path in the wheel, file on disk or bytes, executable)
entries = []
package = os.path.join("python", name)
for file in sorted(os.listdir(package)):
    if file.endswith(".py"):
        entries.append((f"{name}/{file}", os.path.join(package, file), False))
entries.append((f"{name}/_bin/vramshim", os.path.join(source, "vramshim"), True))
entries.append((f"{name}/_bin/libvramshim.so", os.path.join(source, "libvramshim.so"), False))
entries.append((f"{name}/_bin/libvramshim_nvtx.so", os.path.join(source, "libvramshim_nvtx.so"), False))
fake = os.path.join(source, "fakegpu", "lib")
for file in sorted(os.listdir(fake)):
    path = os.path.join(fake, file)
    if ".so" in file and os.path.isfile(path):
        entries.append((f"{name}/_bin/fakegpu/lib/{file}", path, False))

readme = open("README.md", encoding="utf-8").read()
metadata = (
    "Metadata-Version: 2.1\n"
    f"Name: {name}\n"
    f"Version: {version}\n"
    "Summary: A flight recorder for GPU memory: every CUDA allocation, free and failure, with stacks\n"
    "Requires-Python: >=3.8\n"
    "Classifier: Operating System :: POSIX :: Linux\n"
    "Description-Content-Type: text/markdown\n"
    "\n" + readme
)
wheel = (
    "Wheel-Version: 1.0\n"
    "Generator: vramshim scripts/build-wheel.sh\n"
    "Root-Is-Purelib: false\n"
    f"Tag: {tag}\n"
)
entry_points = "[console_scripts]\nvramshim = vramshim.__main__:main\n"
entries += [
    (f"{dist_info}/METADATA", metadata.encode(), False),
    (f"{dist_info}/WHEEL", wheel.encode(), False),
    (f"{dist_info}/entry_points.txt", entry_points.encode(), False),
]

def is_elf(path):
    with open(path, "rb") as file:
        return file.read(4) == b"\x7fELF"


def payload(content):
    """The bytes packaged for `content`: ELF files without their debug sections unless
    --no-strip (a debug build's command alone is hundreds of MiB)."""
    if isinstance(content, bytes):
        return content
    if strip_debug == "1" and is_elf(content):
        with tempfile.TemporaryDirectory() as tmp:
            stripped = os.path.join(tmp, "stripped")
            subprocess.run(["strip", "--strip-debug", "-o", stripped, content], check=True)
            return open(stripped, "rb").read()
    return open(content, "rb").read()


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

record = []
tmp = wheel_path + ".tmp"
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
    for arcname, content, executable in entries:
        data = payload(content)
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
        archive.writestr(info, data)
        record.append(f"{arcname},{digest(data)},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o644 | stat.S_IFREG) << 16
    archive.writestr(info, "\n".join(record) + "\n")
os.replace(tmp, wheel_path)
print(wheel_path)
PY
