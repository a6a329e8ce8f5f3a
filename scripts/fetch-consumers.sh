#!/usr/bin/env bash
# Install, once, the real programs that open vramshim's exports, for tests/tests/exports.rs:
#   - go (Debian's golang-go, with apt-get when missing and run as root): `go tool pprof`;
#   - a Python venv with duckdb and jsonschema (PyPI, pinned): Parquet queries and
#     speedscope-schema validation;
#   - speedscope's published file-format schema, from its npm package (pinned);
#   - auditwheel (PyPI, pinned, its own venv): the wheel's manylinux tag, for
#     tests/tests/wheel.rs.
#
# Cache: ${VRAMSHIM_CACHE:-$HOME/.cache/vramshim}/consumers
#   venv/                      python3 -m venv with duckdb and jsonschema
#   speedscope-schema.json     package/dist/release/file-format-schema.json of speedscope
#   auditwheel-venv/           python3 -m venv with auditwheel
#
# stdout: one line per consumer, `NAME=VALUE` when it is available and `NAME!=WHY` when not:
#   go=/path/to/go  python=/cache/venv/bin/python  speedscope_schema=/cache/...json
# Exits 0 whatever could be installed: the tests skip what is missing, saying why.
set -uo pipefail

DUCKDB_VERSION=1.1.3
JSONSCHEMA_VERSION=4.23.0
SPEEDSCOPE_VERSION=1.25.0
AUDITWHEEL_VERSION=6.8.2

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
