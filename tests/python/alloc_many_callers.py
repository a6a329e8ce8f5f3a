"""One Python line reached from more outer lines, in turn, than the recorder's replay keeps
walks for one innermost frame (tests/tests/python_stacks.rs): `inner`'s frame is at the same
place, running the same instruction, at each call, and only its caller's line differs. Each
caller line allocates its own size (a multiple of K); every allocation must get its own line.
Runs on CPython 3.8 and later."""

import ctypes

K = 4096
cuda = ctypes.CDLL("libcudart.so.12")
cuda.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
cuda.cudaMalloc.restype = ctypes.c_int
PTR = ctypes.c_void_p()
OUT = ctypes.addressof(PTR)
ROUNDS = 4


def inner(size):
    cuda.cudaMalloc(OUT, size)  # site: inner


def six_lines_one_inner():
    for _ in range(ROUNDS):
        inner(1 * K)  # call: 1
        inner(2 * K)  # call: 2
        inner(3 * K)  # call: 3
        inner(4 * K)  # call: 4
        inner(5 * K)  # call: 5
        inner(6 * K)  # call: 6


six_lines_one_inner()  # call: six lines
print("done")
