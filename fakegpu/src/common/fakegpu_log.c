#define _GNU_SOURCE
#include "fakegpu_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void fg_log_unimplemented(int *logged, const char *name)
{
    if (__atomic_exchange_n(logged, 1, __ATOMIC_RELAXED))
        return;
    const char *path = getenv("VRAMSHIM_FAKEGPU_LOG");
    if (!path || !*path)
        return;
    int saved_errno = errno;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        char line[512];
        size_t n = strnlen(name, sizeof line - 2);
        memcpy(line, name, n);
        line[n++] = '\n';
        (void)!write(fd, line, n);
        close(fd);
    }
    errno = saved_errno;
}
