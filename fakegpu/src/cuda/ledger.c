/* One device ledger for every process of a simulated machine (VRAMSHIM_FAKEGPU_LEDGER=<path>).
 *
 * On a real card every process sees the device's total in use (cuMemGetInfo, NVML) and an
 * allocation fails when the card as a whole is full. Here each process keeps its own
 * bookkeeping (fg_devices[].used); with a ledger it also keeps its bytes per device in a slot
 * of a file all processes map shared, and the machine's figure is the sum of the slots of the
 * processes alive.
 *
 * Liveness without any code running at death: a process holds a POSIX record lock (fcntl
 * F_SETLK) on its slot's byte of the file. The kernel drops it when the process ends in any
 * way, SIGKILL included, and pid reuse cannot fool it; a fork child does not inherit it (the
 * child takes a slot of its own at its first charge). Whoever sums a device tries that lock on
 * every occupied slot but its own: when it gets it, the owner is gone, and it clears the slot
 * (the dead process's bytes are given back) before letting go. Checking and charging happen
 * under a lock on byte 0 of the file (and a mutex in the process, since record locks do not
 * exclude the threads of one process), so two processes cannot both take the card's last
 * bytes; that lock too goes with a killed holder.
 *
 * The file: a header (magic, version, slot count; per device the most bytes ever in use at
 * once and the refused charges no hook sees, with the first of them) then LEDGER_SLOTS slots of
 * a pid and a byte count per machine device. `vramshim dryrun` reads the header at the end. An empty file (as `vramshim dryrun` makes it) or a missing one is
 * laid out by the first process. A path that cannot be opened, mapped or laid out, or a file
 * of another size or magic: one stderr line, and this process keeps its own bookkeeping. */
#include "driver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LEDGER_MAGIC 0x3172676472646c66ull /* "fldrdgr1" */
#define LEDGER_VERSION 1u
#define LEDGER_SLOTS 256
/* Record-lock offsets: byte 0 guards checking and charging; slot I's owner holds byte 1 + I
 * (offsets only: the locks need not lie inside the file). */
#define LOCK_ALL 0
#define LOCK_SLOT(i) (1 + (i))

struct ledger_slot {
    int32_t pid; /* 0: free */
    uint32_t reserved;
    uint64_t used[FG_MAX_DEVICES];
};
/* The layout is read by `vramshim dryrun` too (report/src/commands/dryrun.rs): offsets fixed. */
struct ledger_file {
    uint64_t magic;                   /* 0 */
    uint32_t version, slots;          /* 8, 12 */
    uint32_t devices, high;           /* 16, 20: high: slots ever taken (scans stop there) */
    uint64_t peak[FG_MAX_DEVICES];    /* 24: the most bytes in use at once, all processes */
    /* 536: charges no hook sees (a primary context, kernel code) refused for lack of memory:
     * the program gets an error no recorded allocation explains. */
    uint64_t unseen_refused[FG_MAX_DEVICES];
    /* 1048: the first of those: process, machine device, bytes asked, bytes in use then. */
    int32_t refused_pid, refused_device;
    uint64_t refused_bytes, refused_used;
    uint64_t reserved2[2];
    struct ledger_slot slot[LEDGER_SLOTS]; /* 1088 */
};
_Static_assert(__builtin_offsetof(struct ledger_file, unseen_refused) == 536, "ledger layout");
_Static_assert(__builtin_offsetof(struct ledger_file, refused_pid) == 1048, "ledger layout");
_Static_assert(__builtin_offsetof(struct ledger_file, slot) == 1088, "ledger layout");
_Static_assert(sizeof(struct ledger_file) == 1088 + 520 * LEDGER_SLOTS, "ledger layout");

static struct ledger_file *ledger; /* NULL: no ledger (unset, or it failed) */
static int ledger_fd = -1;
static pthread_once_t ledger_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t ledger_mutex = PTHREAD_MUTEX_INITIALIZER;
/* The slot this process holds (-1: none yet) and the process that took it (a fork child has
 * another pid). Written under the ledger lock; read without it through own_slot_now. */
static int my_slot = -1;
static pid_t my_slot_pid;

static int own_slot_now(pid_t pid)
{
    int slot = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    return slot >= 0 && __atomic_load_n(&my_slot_pid, __ATOMIC_ACQUIRE) == pid ? slot : -1;
}

static void warn(const char *path, const char *what, int error)
{
    fprintf(stderr,
            "vramshim fakegpu: VRAMSHIM_FAKEGPU_LEDGER=\"%s\": %s%s%s; this process counts "
            "only its own device memory\n",
            path, what, error ? ": " : "", error ? strerror(error) : "");
}

/* A record lock on byte AT: F_SETLKW (waits) or F_SETLK (tries), TYPE F_WRLCK or F_UNLCK. */
static int record_lock(int command, short type, off_t at)
{
    struct flock lock = {.l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
    int rc;
    do
        rc = fcntl(ledger_fd, command, &lock);
    while (rc == -1 && errno == EINTR);
    return rc;
}

static void lock_ledger(void)
{
    pthread_mutex_lock(&ledger_mutex);
    record_lock(F_SETLKW, F_WRLCK, LOCK_ALL);
}

static void unlock_ledger(void)
{
    record_lock(F_SETLK, F_UNLCK, LOCK_ALL);
    pthread_mutex_unlock(&ledger_mutex);
}

/* This process's pid, kept here (getpid is a system call): set when the ledger opens and in
 * a fork child. */
static pid_t this_pid;

static pid_t current_pid(void) { return __atomic_load_n(&this_pid, __ATOMIC_RELAXED); }

/* No thread is inside the ledger when a process forks, so the child's mutex is free. */
static void before_fork(void) { pthread_mutex_lock(&ledger_mutex); }
static void after_fork_parent(void) { pthread_mutex_unlock(&ledger_mutex); }
static void after_fork_child(void)
{
    __atomic_store_n(&this_pid, getpid(), __ATOMIC_RELAXED);
    pthread_mutex_unlock(&ledger_mutex);
}

static void open_ledger(void)
{
    const char *path = getenv("VRAMSHIM_FAKEGPU_LEDGER");
    if (!path || !*path)
        return;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        warn(path, "cannot open it", errno);
        return;
    }
    ledger_fd = fd;
    record_lock(F_SETLKW, F_WRLCK, LOCK_ALL);
    struct stat st;
    const char *problem = NULL;
    int error = 0;
    if (fstat(fd, &st) != 0) {
        problem = "cannot read its size";
        error = errno;
    } else if (st.st_size == 0 && ftruncate(fd, sizeof(struct ledger_file)) != 0) {
        problem = "cannot lay it out";
        error = errno;
    } else if (st.st_size != 0 && st.st_size != (off_t)sizeof(struct ledger_file))
        problem = "not a device ledger (wrong size)";
    void *map = MAP_FAILED;
    if (!problem) {
        map = mmap(NULL, sizeof(struct ledger_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            problem = "cannot map it";
            error = errno;
        }
    }
    if (!problem) {
        struct ledger_file *file = map;
        if (st.st_size == 0) {
            file->version = LEDGER_VERSION;
            file->slots = LEDGER_SLOTS;
            file->devices = FG_MAX_DEVICES;
            __atomic_store_n(&file->magic, LEDGER_MAGIC, __ATOMIC_RELEASE);
        } else if (file->magic != LEDGER_MAGIC || file->version != LEDGER_VERSION ||
                   file->slots != LEDGER_SLOTS || file->devices != FG_MAX_DEVICES)
            problem = "not a device ledger (bad header)";
    }
    record_lock(F_SETLK, F_UNLCK, LOCK_ALL);
    if (problem) {
        warn(path, problem, error);
        if (map != MAP_FAILED)
            munmap(map, sizeof(struct ledger_file));
        close(fd); /* drops this process's record locks on it, the only ones it had */
        ledger_fd = -1;
        return;
    }
    this_pid = getpid();
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    ledger = map;
}

static bool active(void)
{
    pthread_once(&ledger_once, open_ledger);
    return ledger != NULL;
}

/* Slots below this index may be taken; past it none ever was. */
static int slots_taken(void)
{
    uint32_t high = __atomic_load_n(&ledger->high, __ATOMIC_ACQUIRE);
    return high < LEDGER_SLOTS ? (int)high : LEDGER_SLOTS;
}

/* Clears slot I when its owner is gone (its lock free); true when it is. Ledger locked. */
static bool reclaim_if_dead(int i)
{
    if (record_lock(F_SETLK, F_WRLCK, LOCK_SLOT(i)) != 0)
        return false; /* held: the owner runs */
    memset(ledger->slot[i].used, 0, sizeof ledger->slot[i].used);
    __atomic_store_n(&ledger->slot[i].pid, 0, __ATOMIC_RELEASE);
    record_lock(F_SETLK, F_UNLCK, LOCK_SLOT(i));
    return true;
}

/* This process's slot, taking one (and its lock) at the first charge; -1 when all are held.
 * Ledger locked. */
static int own_slot(void)
{
    pid_t pid = current_pid();
    if (own_slot_now(pid) >= 0)
        return my_slot;
    __atomic_store_n(&my_slot, -1, __ATOMIC_RELEASE); /* a fork child: the parent's slot */
    for (int i = 0; i < LEDGER_SLOTS; i++)
        if (record_lock(F_SETLK, F_WRLCK, LOCK_SLOT(i)) == 0) {
            /* Free, or its owner gone: whatever it held is given back. */
            memset(ledger->slot[i].used, 0, sizeof ledger->slot[i].used);
            __atomic_store_n(&ledger->slot[i].pid, (int32_t)pid, __ATOMIC_RELEASE);
            if ((uint32_t)i >= ledger->high)
                __atomic_store_n(&ledger->high, (uint32_t)i + 1, __ATOMIC_RELEASE);
            __atomic_store_n(&my_slot_pid, pid, __ATOMIC_RELEASE);
            __atomic_store_n(&my_slot, i, __ATOMIC_RELEASE);
            return i;
        }
    return -1;
}

/* The machine's bytes in use on PHYSICAL, dead processes' slots cleared. Ledger locked. */
static uint64_t machine_used(int physical)
{
    int mine = own_slot_now(current_pid());
    uint64_t total = 0;
    for (int i = 0, high = slots_taken(); i < high; i++) {
        struct ledger_slot *s = &ledger->slot[i];
        if (!__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE))
            continue;
        if (i != mine && reclaim_if_dead(i))
            continue;
        total += __atomic_load_n(&s->used[physical], __ATOMIC_RELAXED);
    }
    return total;
}

/* Whether slot I's owner still holds its lock, asked without taking it (F_GETLK), so that a
 * reader does not make a charging process see the slot as held. */
static bool slot_held(int i)
{
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = LOCK_SLOT(i),
                         .l_len = 1};
    int rc;
    do
        rc = fcntl(ledger_fd, F_GETLK, &lock);
    while (rc == -1 && errno == EINTR);
    return rc != 0 || lock.l_type != F_UNLCK;
}

/* The same without the ledger's lock (cuMemGetInfo runs at every recorded event under a dry
 * run): one F_GETLK per other process; a dead process found, the locked count clears it. */
static uint64_t machine_used_unlocked(int physical)
{
    int mine = own_slot_now(current_pid());
    uint64_t total = 0;
    for (int i = 0, high = slots_taken(); i < high; i++) {
        struct ledger_slot *s = &ledger->slot[i];
        if (!__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE))
            continue;
        if (i != mine && !slot_held(i)) {
            lock_ledger();
            total = machine_used(physical);
            unlock_ledger();
            return total;
        }
        total += __atomic_load_n(&s->used[physical], __ATOMIC_RELAXED);
    }
    return total;
}

int fg_ledger_charge(int physical, unsigned long long n, unsigned long long capacity,
                     bool unseen)
{
    if (!active())
        return FG_LEDGER_OFF;
    lock_ledger();
    int slot = own_slot();
    int result = FG_LEDGER_FULL;
    if (slot < 0) {
        /* Every slot held: this process counts alone (said once). */
        static int said;
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "vramshim fakegpu: the device ledger has no free slot (%d processes "
                            "hold one); this process counts only its own device memory\n",
                    LEDGER_SLOTS);
        result = FG_LEDGER_OFF;
    } else {
        uint64_t used = machine_used(physical);
        if (used <= capacity && n <= capacity - used) {
            __atomic_add_fetch(&ledger->slot[slot].used[physical], n, __ATOMIC_RELAXED);
            if (used + n > ledger->peak[physical])
                ledger->peak[physical] = used + n;
            result = FG_LEDGER_CHARGED;
        } else if (unseen && ledger->unseen_refused[physical]++ == 0 && !ledger->refused_pid) {
            ledger->refused_pid = (int32_t)current_pid();
            ledger->refused_device = physical;
            ledger->refused_bytes = n;
            ledger->refused_used = used;
        }
    }
    unlock_ledger();
    return result;
}

/* Only this process writes its slot while it runs (threads: atomically): no ledger lock. */
void fg_ledger_uncharge(int physical, unsigned long long n)
{
    int mine = active() ? own_slot_now(current_pid()) : -1;
    if (mine < 0)
        return;
    uint64_t *used = &ledger->slot[mine].used[physical];
    uint64_t held = __atomic_load_n(used, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(used, &held, held - (n < held ? n : held), true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

bool fg_ledger_used(int physical, unsigned long long *used)
{
    if (!active())
        return false;
    *used = machine_used_unlocked(physical);
    return true;
}

int fg_ledger_processes(int physical, int max, int32_t *pids, unsigned long long *used)
{
    if (!active())
        return -1;
    lock_ledger();
    machine_used(physical); /* clears the slots of processes gone */
    int count = 0;
    for (int i = 0, high = slots_taken(); i < high; i++) {
        struct ledger_slot *s = &ledger->slot[i];
        int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
        uint64_t bytes = __atomic_load_n(&s->used[physical], __ATOMIC_RELAXED);
        if (pid && bytes) {
            if (count < max) {
                pids[count] = pid;
                used[count] = bytes;
            }
            count++;
        }
    }
    unlock_ledger();
    return count;
}
