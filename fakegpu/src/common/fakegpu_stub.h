/* Building blocks of the generated stubs (fakegpu/gen.py): a function that is not implemented
 * logs its name once (fg_log_unimplemented) and returns its library's "not supported"
 * status; a data symbol is a zeroed object of the real size. */
#pragma once
#include "fakegpu_log.h"

#define FG_STUB(index, name, status)                                                      \
    __attribute__((visibility("default"))) long fg_stub_##index(void) __asm__(name);      \
    long fg_stub_##index(void)                                                            \
    {                                                                                     \
        static int logged_;                                                               \
        fg_log_unimplemented(&logged_, name);                                             \
        return (long)(status);                                                            \
    }

/* A function that is implemented by doing nothing (a kernel launch on the fake): success. */
#define FG_NOOP(index, name)                                                              \
    __attribute__((visibility("default"))) long fg_stub_##index(void) __asm__(name);      \
    long fg_stub_##index(void) { return 0; }

#define FG_MESSAGE_STUB(index, name)                                                      \
    __attribute__((visibility("default"))) const char *fg_stub_##index(void) __asm__(name); \
    const char *fg_stub_##index(void)                                                     \
    {                                                                                     \
        static int logged_;                                                               \
        fg_log_unimplemented(&logged_, name);                                             \
        return "not supported by the vramshim fake GPU";                                  \
    }

#define FG_OBJECT(index, name, size)                                                      \
    __attribute__((visibility("default"), aligned(16))) char fg_object_##index[size]      \
        __asm__(name);

#define FG_TLS(index, name, size)                                                         \
    __attribute__((visibility("default"), aligned(16))) __thread char fg_tls_##index[size] \
        __asm__(name);
