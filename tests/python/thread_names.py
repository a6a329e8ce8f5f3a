"""Threads named from Python, for tests/tests/threads_view.rs: one named only with
`threading.Thread(name=...)` (an OS-level name from Python 3.14 on), one that also sets its OS
name with prctl(PR_SET_NAME). Each allocates through the (fake) CUDA runtime and prints
`role=ROLE tid=NATIVE_ID`; the first line says the Python version."""

import ctypes
import sys
import threading

K = 4096
PR_SET_NAME = 15
runtime = ctypes.CDLL("libcudart.so.12")
runtime.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
runtime.cudaMalloc.restype = ctypes.c_int
libc = ctypes.CDLL(None, use_errno=True)


def alloc(role, size):
    pointer = ctypes.c_void_p()
    rc = runtime.cudaMalloc(ctypes.byref(pointer), size)
    if rc != 0:
        raise SystemExit(f"cudaMalloc returned {rc}")
    print(f"role={role} tid={threading.get_native_id()}", flush=True)


def python_named():
    alloc("python-named", 1 * K)


def os_named():
    if libc.prctl(PR_SET_NAME, b"py-os-named", 0, 0, 0) != 0:
        raise SystemExit(f"prctl failed: errno {ctypes.get_errno()}")
    alloc("os-named", 2 * K)


print(f"minor={sys.version_info[1]}", flush=True)
alloc("main", 3 * K)
for target, name in ((python_named, "py-loader"), (os_named, "py-os")):
    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
