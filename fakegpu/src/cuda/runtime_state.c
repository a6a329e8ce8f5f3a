/* The CUDA runtime's per-thread state, kept in the driver so that the fake libcudart.so.12 and
 * libcudart.so.13 share it: `vramshim dryrun` preloads both, and the recorder forwards a runtime
 * call it records to whichever of the two comes first in the search order, not necessarily the
 * one the program was linked with. An extension of the fakes: no NVIDIA library has it. */
#include "driver.h"
#include "fakegpu_runtime_thread.h"

FG_EXPORT struct fakegpu_runtime_thread *fakegpu_runtime_thread(void)
{
    static __thread struct fakegpu_runtime_thread state;
    return &state;
}
