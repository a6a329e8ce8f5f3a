"""Allocates in loops whose consecutive stacks share one part and differ in the other, for
tests/tests/python_stacks.rs: one Python line reached through two native paths (a ctypes
function called directly, or through `functools.partial`, a C callable), and two Python lines
reached through the same native path. A thread's next stack reuses the parts of its last one
that its walks find unchanged; every allocation must still get its own, whole stack. Each
native path and each line has its own size (a multiple of K). Runs on CPython 3.8 and later."""

import ctypes
import functools

K = 4096
cuda = ctypes.CDLL("libcudart.so.12")
cuda.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
cuda.cudaMalloc.restype = ctypes.c_int
PTR = ctypes.c_void_p()
OUT = ctypes.addressof(PTR)
ROUNDS = 6


def one_line_two_native_paths():
    calls = [cuda.cudaMalloc, functools.partial(cuda.cudaMalloc)]
    for i in range(ROUNDS):
        calls[i % 2](OUT, (1 + i % 2) * K)  # site: one line


def two_lines_one_native_path():
    for i in range(ROUNDS):
        if i % 2:
            cuda.cudaMalloc(OUT, 3 * K)  # site: odd
        else:
            cuda.cudaMalloc(OUT, 4 * K)  # site: even


one_line_two_native_paths()  # call: one line
two_lines_one_native_path()  # call: two lines
print("done")
