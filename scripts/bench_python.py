"""Python case of scripts/bench-capture.sh: PAIRS cudaMalloc + cudaFree pairs through the fake
runtime (ctypes.CDLL: GIL released, as in PyTorch) from a Python stack DEPTH frames deep.
Prints `ns_per_pair=N`."""

import ctypes
import sys
import time

pairs, depth = int(sys.argv[1]), int(sys.argv[2])
rt = ctypes.CDLL("libcudart.so.12")
rt.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]
ptr = ctypes.c_void_p()
out = ctypes.addressof(ptr)
malloc, free = rt.cudaMalloc, rt.cudaFree


def loop():
    start = time.perf_counter_ns()
    for _ in range(pairs):
        malloc(out, 4096)
        free(ptr)
    return time.perf_counter_ns() - start


def nest(n):
    return nest(n - 1) if n > 1 else loop()


print(f"ns_per_pair={nest(depth) / pairs:.1f}")
