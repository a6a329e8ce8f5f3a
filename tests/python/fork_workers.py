"""Fork workers started from a process whose threads allocate, as PyTorch's DataLoader does,
for tests/tests/hostile.rs. Four threads allocate and free through the (fake) CUDA runtime
until the end; meanwhile WORKERS `multiprocessing` processes (fork start method) are started,
in batches of BATCH. Worker i allocates i % 3 blocks of 1 MiB and frees them (so a third of
the workers never call CUDA), prints `worker=i pid=PID allocs=N`, and ends as multiprocessing
ends a worker (os._exit). A worker still alive 60 s after its batch started is killed and counted.
The last line: `workers=W hung=H bad_exit=B pairs=P` (P: the threads' pairs)."""

import ctypes
import multiprocessing
import os
import sys
import threading
import time

MIB = 1 << 20
runtime = ctypes.CDLL("libcudart.so.12")
runtime.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
runtime.cudaMalloc.restype = ctypes.c_int
runtime.cudaFree.argtypes = [ctypes.c_void_p]
runtime.cudaFree.restype = ctypes.c_int


def alloc_free(count):
    pointers = []
    for _ in range(count):
        pointer = ctypes.c_void_p()
        if runtime.cudaMalloc(ctypes.byref(pointer), MIB) != 0:
            raise SystemExit("cudaMalloc failed")
        pointers.append(pointer)
    for pointer in pointers:
        if runtime.cudaFree(pointer) != 0:
            raise SystemExit("cudaFree failed")


def worker(index):
    count = index % 3
    alloc_free(count)
    # One write system call per line: the workers share stdout and run at the same time.
    line = f"worker={index} pid={multiprocessing.current_process().pid} allocs={count}\n"
    os.write(1, line.encode())


def main():
    workers, batch = int(sys.argv[1]), int(sys.argv[2])
    stop = threading.Event()
    pairs = [0] * 4

    def allocating(slot):
        while not stop.is_set():
            alloc_free(1)
            pairs[slot] += 1

    alloc_free(1)
    threads = [threading.Thread(target=allocating, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    context = multiprocessing.get_context("fork")
    hung = bad_exit = 0
    for first in range(0, workers, batch):
        processes = [
            context.Process(target=worker, args=(i,))
            for i in range(first, min(first + batch, workers))
        ]
        for process in processes:
            process.start()
        deadline = time.monotonic() + 60
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                hung += 1
                process.kill()
                process.join()
            elif process.exitcode != 0:
                bad_exit += 1
    stop.set()
    for thread in threads:
        thread.join()
    print(f"workers={workers} hung={hung} bad_exit={bad_exit} pairs={sum(pairs) + 1}", flush=True)


if __name__ == "__main__":
    main()
