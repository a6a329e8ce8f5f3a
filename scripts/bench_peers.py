"""Python program of scripts/bench-peers.sh: PAIRS allocations of 4096 bytes, each freed at
once, from a Python stack DEPTH frames deep, through ctypes. MODE `malloc` calls libc's
malloc/free (what memray records), `cuda` the fake runtime's cudaMalloc/cudaFree (what vramshim
records). Usage: bench_peers.py MODE PAIRS DEPTH"""

import ctypes
import sys

mode, pairs, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == "malloc":
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    malloc, free = libc.malloc, libc.free

    def pair():
        free(malloc(4096))

else:
    rt = ctypes.CDLL("libcudart.so.12")
    rt.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    ptr = ctypes.c_void_p()
    out = ctypes.addressof(ptr)
    cuda_malloc, cuda_free = rt.cudaMalloc, rt.cudaFree

    def pair():
        cuda_malloc(out, 4096)
        cuda_free(ptr)


def loop():
    for _ in range(pairs):
        pair()


def nest(n):
    return nest(n - 1) if n > 1 else loop()


nest(depth)
