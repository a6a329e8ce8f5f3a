/*
 * Shared helpers for the vramshim test programs.
 *
 * Every operation is reported as one line on stdout (flushed at once, so the
 * output survives abort(), SIGKILL and fork()):
 *
 *   <op> <api> [dev=<d>] <addr|handle>=0x<hex> size=<n> [<key>=<value> ...] rc=<code>
 *
 * op:   alloc | free | register | unregister | reserve | unreserve | map | unmap
 *       | access | info | lookup | ctx | stream_create | stream_destroy
 *       | pool_create | pool_destroy | pool_trim
 * api:  the exported function that was called (for pointers obtained through a
 *       resolver: the variant the real driver hands out, e.g. cuMemAlloc_v2).
 * rc:   the CUresult / cudaError_t returned, always the last field.
 * Failed allocations print addr=0x0 (or handle=0x0).
 */
#ifndef VRAMSHIM_TEST_COMMON_H
#define VRAMSHIM_TEST_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *g_prog = "test";

__attribute__((format(printf, 1, 2), unused)) static void out(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
}

__attribute__((format(printf, 1, 2), noreturn, unused)) static void die(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "%s: FAIL: ", g_prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* Formats optional extra "key=value" fields (thread-local scratch buffer). */
__attribute__((format(printf, 1, 2), unused)) static const char *xf(const char *fmt, ...)
{
    static __thread char buf[4][256];
    static __thread int slot;
    char *b = buf[slot++ & 3];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof buf[0], fmt, ap);
    va_end(ap);
    return b;
}

/*
 * One memory operation line.  dev < 0 omits dev=; idkey is "addr" or "handle";
 * extra (may be NULL or "") is inserted before rc=.
 */
__attribute__((unused)) static void emit(const char *op, const char *api, int dev,
                                         const char *idkey, unsigned long long id,
                                         unsigned long long size, const char *extra, int rc)
{
    char devbuf[32] = "";
    if (dev >= 0)
        snprintf(devbuf, sizeof devbuf, " dev=%d", dev);
    out("%s %s%s %s=0x%llx size=%llu%s%s rc=%d", op, api, devbuf, idkey, id, size,
        extra && *extra ? " " : "", extra ? extra : "", rc);
}

#define EXPECT_RC(rc, want, what)                                                              \
    do {                                                                                       \
        int rc_ = (int)(rc);                                                                   \
        if (rc_ != (int)(want))                                                                \
            die("%s returned %d, expected %d (%s:%d)", what, rc_, (int)(want), __FILE__,       \
                __LINE__);                                                                     \
    } while (0)

#define MiB ((size_t)1 << 20)

#endif
