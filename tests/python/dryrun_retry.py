"""PyTorch's out-of-memory retry, acted out through ctypes on the (fake) CUDA runtime, for
tests/tests/dryrun.rs. Run on a 1 GiB card whose context takes 512 MiB: caches 4 x 100 MiB,
asks for 300 MiB (fails: 112 MiB free), releases cached blocks on the same thread and asks
again. `python3 dryrun_retry.py ok` releases two (the retry succeeds, exit 0); `... fail`
releases one (the retry fails too, exit 5). Runs on CPython 3.8 and later."""

import ctypes
import sys

MIB = 1 << 20
cudart = ctypes.CDLL("libcudart.so.12")
cudart.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
cudart.cudaMalloc.restype = ctypes.c_int
cudart.cudaFree.argtypes = [ctypes.c_void_p]
cudart.cudaFree.restype = ctypes.c_int


def malloc(size):
    ptr = ctypes.c_void_p()
    rc = cudart.cudaMalloc(ctypes.addressof(ptr), size)
    return rc, ptr.value


cached = []
for _ in range(4):
    rc, ptr = malloc(100 * MIB)
    if rc != 0:
        sys.exit("the cache did not fit")
    cached.append(ptr)
rc, _ = malloc(300 * MIB)
if rc == 0:
    sys.exit("the first request should fail")
for ptr in cached[: 2 if sys.argv[1] == "ok" else 1]:
    if cudart.cudaFree(ptr) != 0:
        sys.exit("cudaFree failed")
rc, _ = malloc(300 * MIB)
print("retry", "succeeded" if rc == 0 else "failed")
sys.exit(0 if rc == 0 else 5)
