#!/usr/bin/env bash
# Prints the CPython struct offsets the shim's Python stack reader needs (shim/src/python.rs),
# derived with offsetof from an installed interpreter's own headers (internal ones included).
# Usage: scripts/py-offsets.sh /path/to/python3.X     (3.9 to 3.13)
#
# 3.9 / 3.10: the thread state's `frame` and the frame object's fields (the `PY39` / `PY310`
# tables). 3.11 / 3.12: the `PY311` / `PY312` tables. 3.13: the shim takes these offsets from
# `_Py_DebugOffsets` at run time; the table printed here is the reference its unit test checks
# against (and `code_firsttraceable`, which `_Py_DebugOffsets` does not publish).
set -euo pipefail
py="${1:-python3}"
inc="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
ver="$("$py" -c 'import sys; print("%d%02d" % sys.version_info[:2])')"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/o.c" <<'C'
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
#else
#include <frameobject.h>
#endif
#define P(name, expr) printf("%-28s %zu\n", name, (size_t)(expr))
int main(void) {
#if PY_VERSION_HEX < 0x030B0000
    /* 3.9 / 3.10: PyFrameObject chain; f_lasti in bytes (3.9) or code units (3.10). */
    P("tstate_frame", offsetof(PyThreadState, frame));
    P("frame_back", offsetof(PyFrameObject, f_back));
    P("frame_code", offsetof(PyFrameObject, f_code));
    P("frame_lasti", offsetof(PyFrameObject, f_lasti));
    P("code_filename", offsetof(PyCodeObject, co_filename));
    P("code_name", offsetof(PyCodeObject, co_name));
    P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX >= 0x030A0000
    P("code_linetable", offsetof(PyCodeObject, co_linetable));
#else
    P("code_lnotab", offsetof(PyCodeObject, co_lnotab));
#endif
#else
#if PY_VERSION_HEX >= 0x030D0000
    P("tstate_current_frame", offsetof(PyThreadState, current_frame));
    P("frame_executable", offsetof(_PyInterpreterFrame, f_executable));
    P("frame_instr_ptr", offsetof(_PyInterpreterFrame, instr_ptr));
#else
    P("tstate_cframe", offsetof(PyThreadState, cframe));
    P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_code));
    P("frame_prev_instr", offsetof(_PyInterpreterFrame, prev_instr));
#endif
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
#if PY_VERSION_HEX < 0x030C0000
    P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#endif
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
    P("code_filename", offsetof(PyCodeObject, co_filename));
    P("code_qualname", offsetof(PyCodeObject, co_qualname));
    P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
    P("code_linetable", offsetof(PyCodeObject, co_linetable));
    P("code_firsttraceable", offsetof(PyCodeObject, _co_firsttraceable));
    P("code_code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#endif
    P("object_type", offsetof(PyObject, ob_type));
    P("unicode_state", offsetof(PyASCIIObject, state));
    P("unicode_length", offsetof(PyASCIIObject, length));
    P("unicode_ascii_data", sizeof(PyASCIIObject));
    P("unicode_compact_data", sizeof(PyCompactUnicodeObject));
    P("bytes_size", offsetof(PyVarObject, ob_size));
    P("bytes_data", offsetof(PyBytesObject, ob_sval));
    return 0;
}
C
cc -I"$inc" -o "$tmp/o" "$tmp/o.c"
echo "# CPython $ver ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
"$tmp/o"
