/* The driver's error log (cuLogs*, CUDA 12.9): a real driver keeps a buffer of plain-English
 * messages for failed calls and hands them to registered callbacks. The fake driver writes no
 * messages (its failures are the codes it returns), so the buffer stays empty and a callback is
 * never called; registering one succeeds as on a real driver, which cudart 13 does at start. */
#include "driver.h"

#include <stdlib.h>

typedef void (*fg_logs_callback)(void *data, int level, char *message, size_t length);

struct fg_logs_registration {
    fg_logs_callback callback;
    void *data;
};

FG_EXPORT CUresult cuLogsRegisterCallback(fg_logs_callback callback, void *data,
                                          void **handle_out)
{
    if (!callback || !handle_out)
        return CUDA_ERROR_INVALID_VALUE;
    struct fg_logs_registration *registration = malloc(sizeof *registration);
    if (!registration)
        return CUDA_ERROR_OUT_OF_MEMORY;
    registration->callback = callback;
    registration->data = data;
    *handle_out = registration;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuLogsUnregisterCallback(void *handle)
{
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    free(handle);
    return CUDA_SUCCESS;
}

/* The iterator of an empty buffer: its end is entry 0. */
FG_EXPORT CUresult cuLogsCurrent(unsigned int *iterator_out, unsigned int flags)
{
    if (!iterator_out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    *iterator_out = 0;
    return CUDA_SUCCESS;
}

/* Nothing to dump: the size written is 0 and the iterator stays at the (empty) end. */
FG_EXPORT CUresult cuLogsDumpToMemory(unsigned int *iterator, char *buffer, size_t *size,
                                      unsigned int flags)
{
    if (!buffer || !size || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (*size > 0)
        buffer[0] = '\0';
    *size = 0;
    if (iterator)
        *iterator = 0;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuLogsDumpToFile(unsigned int *iterator, const char *path, unsigned int flags)
{
    if (!path || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (iterator)
        *iterator = 0;
    return CUDA_SUCCESS;
}
