#!/usr/bin/env python3
"""Write the export table of every shared library in a set of wheels / .deb files as text.

usage: fakegpu-symbols.py OUTDIR ARCHIVE[=ORIGIN] ...

For each ELF shared object found in ARCHIVE (a .whl or a .deb), writes OUTDIR/<SONAME>.syms:
a header (the archive's name, version, sha256, the file inside it), then one line per defined
dynamic symbol: `name version kind size`, where version is the symbol's version node with
`@@` (default) or `@` (an older, non-default version), or `-` when it has none, kind is
`func`, `object`, `tls` or `other`, and size is in bytes. Lines are sorted.
ORIGIN (optional) is written into the header instead of the archive's file name.
"""
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

KINDS = {"FUNC": "func", "IFUNC": "func", "OBJECT": "object", "TLS": "tls"}


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"fakegpu-symbols: {' '.join(cmd)} failed: {done.stderr.strip()}")
    return done.stdout


def soname_of(path):
    for line in run(["readelf", "-d", "-W", path]).splitlines():
        found = re.search(r"\(SONAME\)\s+Library soname: \[(.+)\]", line)
        if found:
            return found.group(1)
    return None


def exports(path):
    """Defined dynamic symbols: (name, version, kind, size)."""
    rows = set()
    version_nodes = set()
    for line in run(["readelf", "--dyn-syms", "-W", path]).splitlines():
        cols = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(cols) < 8 or not cols[0].endswith(":") or not cols[0][:-1].isdigit():
            continue
        size, typ, bind, ndx, name = cols[2], cols[3], cols[4], cols[6], cols[7]
        if ndx == "UND" or bind == "LOCAL":
            continue
        if "@@" in name:
            base, node = name.split("@@", 1)
            version_nodes.add(node)
            version = "@@" + node
        elif "@" in name:
            base, node = name.split("@", 1)
            version = "@" + node
        else:
            base, node, version = name, None, "-"
        # The symbol that names a version node itself (ABS, size 0) is not an export.
        if ndx == "ABS" and node is not None and base == node:
            continue
        size = int(size, 16) if size.startswith("0x") else int(size)
        rows.add((base, version, KINDS.get(typ, "other"), size))
    # readelf may print a version node's own symbol without its @@ suffix.
    return sorted(row for row in rows if not (row[0] in version_nodes and row[3] == 0))


def is_elf_shared(path):
    with open(path, "rb") as f:
        head = f.read(18)
    return len(head) == 18 and head[:4] == b"\x7fELF" and head[16] == 3  # ET_DYN


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack(archive, into):
    if archive.endswith(".whl"):
        with zipfile.ZipFile(archive) as wheel:
            for member in wheel.namelist():
                if re.search(r"\.so(\.[0-9]+)*$", member) and "/" in member:
                    wheel.extract(member, into)
    elif archive.endswith(".deb"):
        run(["dpkg-deb", "-x", archive, into])
    else:
        sys.exit(f"fakegpu-symbols: {archive}: neither a .whl nor a .deb")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    for arg in sys.argv[2:]:
        archive, _, origin = arg.partition("=")
        origin = origin or os.path.basename(archive)
        digest = sha256(archive)
        with tempfile.TemporaryDirectory() as tmp:
            unpack(archive, tmp)
            for root, _, files in os.walk(tmp):
                for name in sorted(files):
                    path = os.path.join(root, name)
                    if os.path.islink(path) or not is_elf_shared(path):
                        continue
                    soname = soname_of(path) or name
                    rows = exports(path)
                    target = os.path.join(outdir, soname + ".syms")
                    with open(target, "w") as out:
                        out.write(f"# {soname}: the dynamic export table of {os.path.relpath(path, tmp)}\n")
                        out.write(f"# from {origin}\n")
                        out.write(f"# archive sha256 {digest}\n")
                        out.write("# columns: name version(@@default, @old, - none) kind size\n")
                        for base, version, kind, size in rows:
                            out.write(f"{base} {version} {kind} {size}\n")
                    print(f"{target}: {len(rows)} symbols", file=sys.stderr)


if __name__ == "__main__":
    main()
