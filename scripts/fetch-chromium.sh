#!/usr/bin/env bash
# Install, once, a headless Chromium for tests/tests/html.rs (the `vramshim html` page opened
# in a real browser): Debian's `chromium` package with apt-get when missing and run as root.
#
# stdout: one line, `chromium=/path/to/chromium` when it is available and `chromium!=WHY` when
# not. Exits 0 either way: the test skips, saying why.
set -uo pipefail

CACHE_ROOT=${VRAMSHIM_CACHE:-${HOME:-/tmp}/.cache/vramshim}
log=/dev/null
if mkdir -p "$CACHE_ROOT" 2>/dev/null; then
    log=$CACHE_ROOT/chromium-install.log
    # Serialise concurrent callers (parallel test runs) and apt-get.
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$CACHE_ROOT/chromium.lock"
        flock 9
    fi
fi

found() {
    for name in chromium chromium-browser google-chrome; do
        if command -v "$name" >/dev/null 2>&1; then
            command -v "$name"
            return 0
        fi
    done
    return 1
}

if path=$(found); then
    echo "chromium=$path"
elif [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >>"$log" 2>&1 ||
        { apt-get update -q >>"$log" 2>&1 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >>"$log" 2>&1; }; then
        if path=$(found); then
            echo "chromium=$path"
        else
            echo "chromium!=apt-get installed chromium but it is not on PATH (see $log)"
        fi
    else
        echo "chromium!=apt-get install chromium failed (see $log)"
    fi
else
    echo "chromium!=no chromium on PATH, and the chromium package can only be installed by root with apt-get"
fi
