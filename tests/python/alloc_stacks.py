"""Allocates through the (fake) CUDA runtime from many kinds of Python frames, for
tests/tests/python_stacks.rs. Every allocation site has its own size (a multiple of K) and its
line ends in a `# site: NAME` marker; the line that calls into it ends in `# call: NAME`.

`ctypes.CDLL` releases the GIL around each foreign call, as PyTorch does before it allocates;
`ctypes.PyDLL` keeps it held. Runs on CPython 3.8 and later: no newer syntax."""

import ctypes
import threading

K = 4096
nogil = ctypes.CDLL("libcudart.so.12")
gil = ctypes.PyDLL("libcudart.so.12")
for lib in (nogil, gil):
    lib.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.cudaMalloc.restype = ctypes.c_int
PTR = ctypes.c_void_p()
OUT = ctypes.addressof(PTR)


def outer():
    def inner():
        nogil.cudaMalloc(OUT, 1 * K)  # site: inner

    inner()  # call: inner


class Model:
    def forward(self):
        nogil.cudaMalloc(OUT, 2 * K)  # site: method


alloc_lambda = lambda: nogil.cudaMalloc(OUT, 3 * K)  # site: lambda


def gen():
    yield nogil.cudaMalloc(OUT, 4 * K)  # site: generator


class Ctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def in_with():
    with Ctx():
        nogil.cudaMalloc(OUT, 5 * K)  # site: with


def in_except():
    try:
        raise ValueError("x")
    except ValueError:
        nogil.cudaMalloc(OUT, 6 * K)  # site: except


def with_gil():
    gil.cudaMalloc(OUT, 7 * K)  # site: gil


def worker(i):
    nogil.cudaMalloc(OUT, (20 + i) * K)  # site: thread


outer()  # call: outer
Model().forward()  # call: method
alloc_lambda()  # call: lambda
next(gen())  # call: generator
in_with()  # call: with
in_except()  # call: except
with_gil()  # call: gil
nogil.cudaMalloc(OUT, 8 * K)  # site: module
threads = [threading.Thread(target=worker, args=(i,), name=f"worker-{i}") for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("done")
