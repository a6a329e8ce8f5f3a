"""Marks around allocations through the (fake) CUDA runtime, for tests/tests/html.rs and
tests/tests/wheel.rs: `vramshim.mark` (the package under python/, or the installed wheel)
before and after each of two 64 MiB cudaMalloc calls, then a free. Prints
`recording True|False` and `mark TEXT True|False` for each mark."""

import ctypes
import sys

import vramshim

MIB = 1 << 20
runtime = ctypes.CDLL("libcudart.so.12")
runtime.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
runtime.cudaMalloc.restype = ctypes.c_int
runtime.cudaFree.argtypes = [ctypes.c_void_p]
runtime.cudaFree.restype = ctypes.c_int


def mark(text):
    print("mark", text, vramshim.mark(text))


print("recording", vramshim.recording())
pointers = []
for epoch in (1, 2):
    mark("epoch %d" % epoch)
    pointer = ctypes.c_void_p()
    if runtime.cudaMalloc(ctypes.byref(pointer), 64 * MIB) != 0:
        sys.exit("cudaMalloc failed")
    pointers.append(pointer)
mark("free </script> & done")
for pointer in pointers:
    runtime.cudaFree(pointer)
sys.stdout.flush()
