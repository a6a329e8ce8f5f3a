/*
 * interposer -> libinterpose.so: a second LD_PRELOAD library that defines
 * cudaMalloc and cudaFree, counts the calls and forwards them to the next
 * definition with dlsym(RTLD_NEXT, ...) (resolved once).  At exit it prints
 *   interposer cudaMalloc=<n> cudaFree=<n>
 * to stderr.  Used to check that vramshim coexists with other interposers
 * (RTLD_NEXT resolved relative to this library, no recursion).
 */
#define _GNU_SOURCE
#include "cuda_runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

typedef cudaError_t (*malloc_fn)(void **, size_t);
typedef cudaError_t (*free_fn)(void *);

static malloc_fn real_malloc;
static free_fn real_free;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_long n_malloc, n_free;

static void resolve(void)
{
    real_malloc = (malloc_fn)dlsym(RTLD_NEXT, "cudaMalloc");
    real_free = (free_fn)dlsym(RTLD_NEXT, "cudaFree");
}

__attribute__((visibility("default"))) cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    pthread_once(&once, resolve);
    atomic_fetch_add(&n_malloc, 1);
    if (!real_malloc)
        return cudaErrorUnknown;
    return real_malloc(devPtr, size);
}

__attribute__((visibility("default"))) cudaError_t cudaFree(void *devPtr)
{
    pthread_once(&once, resolve);
    atomic_fetch_add(&n_free, 1);
    if (!real_free)
        return cudaErrorUnknown;
    return real_free(devPtr);
}

__attribute__((destructor)) static void report(void)
{
    fprintf(stderr, "interposer cudaMalloc=%ld cudaFree=%ld\n", atomic_load(&n_malloc),
            atomic_load(&n_free));
}
