/* The CUDA runtime's per-thread state, which the fake libcuda.so.1 keeps
 * (src/cuda/runtime_state.c) so that both fake runtime majors, and the libraries that act as a
 * statically linked runtime would (fakegpu_library_memory.h), see the same last error and
 * device. An extension of the fakes: no NVIDIA library has it. */
#pragma once

struct fakegpu_runtime_thread {
    int last_error; /* what cudaGetLastError returns next (a cudaError_t) */
    int device;     /* the device cudaSetDevice chose (default 0) */
};

struct fakegpu_runtime_thread *fakegpu_runtime_thread(void);
