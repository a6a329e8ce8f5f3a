"""A Python program that runs out of device memory, for tests/tests/dryrun.rs: it holds
256 MiB, then asks for 1 GiB on the line marked `# fail: step`, and exits with status 4 when
that fails (0 if it fits). Talks to the (fake) CUDA runtime through ctypes, found on the
library path. Runs on CPython 3.8 and later."""

import ctypes
import sys

MIB = 1 << 20
cudart = ctypes.CDLL("libcudart.so.12")
cudart.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
cudart.cudaMalloc.restype = ctypes.c_int


PTR = ctypes.c_void_p()
OUT = ctypes.addressof(PTR)


def step():
    return cudart.cudaMalloc(OUT, 1024 * MIB)  # fail: step


if cudart.cudaMalloc(OUT, 256 * MIB) != 0:
    sys.exit("the weights did not fit")
if step() != 0:
    print("out of memory")
    sys.exit(4)
print("fits")
