/* One device ledger for every process of a simulated machine (VRAMSHIM_FAKEGPU_LEDGER=<path>).
 *
 * On a real card every process sees the device's total in use (cuMemGetInfo, NVML) and an
 * allocation fails when the card as a whole is full. Here each process keeps its own
 * bookkeeping (fg_devices[].used); with a ledger it also keeps its bytes per device in a slot
 * of a file all processes map shared, and the machine keeps a counter per device of the bytes
 * in use over all the slots.
 *
 * Charging is lock-free: a compare-and-swap on the machine's counter checks the card's
 * capacity and takes the bytes in one step (two processes cannot both take the last bytes),
 * then the bytes go on the process's slot. Giving back subtracts from both. No system call.
 *
 * Liveness without any code running at death: a process holds a POSIX record lock (fcntl
 * F_SETLK) on its slot's byte of the file. The kernel drops it when the process ends in any
 * way, SIGKILL included, and pid reuse cannot fool it; a fork child does not inherit it (the
 * child takes a slot of its own at its first charge). A charge that does not fit tries every
 * other slot's lock; cuMemGetInfo watches the other processes by pidfds in one epoll set, one
 * system call whatever their number (see "Liveness at a query" below). A slot whose lock is
 * free belongs to a dead process: under the lock on byte 0
 * of the file (which also guards taking slots), it is cleared and the machine's counters are
 * recomputed from the slots alive (see recompute_machine: a process killed between its two
 * updates leaves the counter off by its charge, and only a recount repairs that).
 *
 * The file: a header (magic, version, slot count; per device the most bytes ever in use at
 * once and the refused charges no hook sees, with the first of them), LEDGER_SLOTS slots of a
 * pid, an in-flight count and a byte count per machine device, then, each in the place of one
 * more slot, the number of processes that asked each device for memory and the machine's
 * counters. `vramshim dryrun` reads the header at the end. An empty file (as
 * `vramshim dryrun` makes it) or a missing one is laid out by the first process. A path that
 * cannot be opened, mapped or laid out, or a file of another size or magic: one stderr line,
 * and this process keeps its own bookkeeping. */
#include "driver.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on every architecture */
#endif

#define LEDGER_MAGIC 0x3172676472646c66ull /* "fldrdgr1" */
#define LEDGER_VERSION 2u /* 1: no machine counters, 256 slots, charges under the file lock */
#define LEDGER_SLOTS 254
/* Record-lock offsets: byte 0 guards taking slots, clearing dead ones and recounting; slot I's
 * owner holds byte 1 + I (offsets only: the locks need not lie inside the file). */
#define LOCK_ALL 0
#define LOCK_SLOT(i) (1 + (i))

struct ledger_slot {
    int32_t pid;       /* 0: free */
    uint32_t inflight; /* the owner's threads between their two updates (recompute_machine) */
    uint64_t used[FG_MAX_DEVICES];
};
/* Per device, the processes that ever asked it for memory (each has a context there): the dry
 * run's smallest fitting card counts one context per process. */
struct ledger_processes {
    uint32_t on_device[FG_MAX_DEVICES];
    uint32_t reserved[66];
};
/* The machine's bytes in use per device: the sum of the slots (but for charges in flight). */
struct ledger_machine {
    uint32_t recounting; /* set while recompute_machine runs: charges wait for the file lock */
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
    struct ledger_processes processes;     /* 1088 + 520 * 254 */
    struct ledger_machine machine;         /* 1088 + 520 * 255 */
};
_Static_assert(__builtin_offsetof(struct ledger_file, unseen_refused) == 536, "ledger layout");
_Static_assert(__builtin_offsetof(struct ledger_file, refused_pid) == 1048, "ledger layout");
_Static_assert(__builtin_offsetof(struct ledger_file, slot) == 1088, "ledger layout");
_Static_assert(__builtin_offsetof(struct ledger_file, processes) == 1088 + 520 * 254,
               "ledger layout");
_Static_assert(sizeof(struct ledger_slot) == 520 && sizeof(struct ledger_processes) == 520 &&
                   sizeof(struct ledger_machine) == 520,
               "ledger layout");
_Static_assert(sizeof(struct ledger_file) == 1088 + 520 * 256, "ledger layout");

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

static void recompute_machine(void);

/* Takes the ledger lock. A recount flagged but not finished (recounting is set and cleared only
 * under this lock) means its process died in the middle: it is done again here. */
static void lock_ledger(void)
{
    pthread_mutex_lock(&ledger_mutex);
    record_lock(F_SETLKW, F_WRLCK, LOCK_ALL);
    if (ledger && __atomic_load_n(&ledger->machine.recounting, __ATOMIC_SEQ_CST))
        recompute_machine();
}

static void unlock_ledger(void)
{
    record_lock(F_SETLK, F_UNLCK, LOCK_ALL);
    pthread_mutex_unlock(&ledger_mutex);
}

/* This process's pid, kept here (getpid is a system call): set when the ledger opens and in
 * a fork child. */
static pid_t this_pid;
/* The machine's devices this process has asked for memory (counted in the file once). */
static uint8_t asked_device[FG_MAX_DEVICES];

static pid_t current_pid(void) { return __atomic_load_n(&this_pid, __ATOMIC_RELAXED); }

/* fork.c takes ledger_mutex across fork with the driver's other locks, in their order. */
pthread_mutex_t *fg_ledger_lock(void) { return &ledger_mutex; }

static void watch_after_fork_child(void);

void fg_ledger_after_fork_child(void)
{
    __atomic_store_n(&this_pid, getpid(), __ATOMIC_RELAXED);
    memset(asked_device, 0, sizeof asked_device); /* a new process: its own contexts */
    watch_after_fork_child();
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

/* The process holding slot I's lock, asked without taking it (F_GETLK), so that a reader does
 * not make a process taking a slot see this one as held: 0 when free, -1 when held by a
 * process this one cannot name (another pid namespace) or when the kernel does not say. */
static pid_t slot_holder(int i)
{
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = LOCK_SLOT(i),
                         .l_len = 1};
    int rc;
    do
        rc = fcntl(ledger_fd, F_GETLK, &lock);
    while (rc == -1 && errno == EINTR);
    if (rc != 0)
        return -1;
    if (lock.l_type == F_UNLCK)
        return 0;
    return lock.l_pid > 0 ? lock.l_pid : -1;
}

/* Clears slot I when its owner is gone (its lock free); true when it is. Ledger locked: the
 * machine's counters must be recomputed after. */
static bool reclaim_if_dead(int i)
{
    if (record_lock(F_SETLK, F_WRLCK, LOCK_SLOT(i)) != 0)
        return false; /* held: the owner runs */
    /* Flagged before the slot is emptied: a query that no longer sees the dead slot waits for
     * the recount instead of reading the counter that still holds its bytes. */
    __atomic_store_n(&ledger->machine.recounting, 1, __ATOMIC_SEQ_CST);
    struct ledger_slot *s = &ledger->slot[i];
    memset(s->used, 0, sizeof s->used);
    __atomic_store_n(&s->inflight, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
    record_lock(F_SETLK, F_UNLCK, LOCK_SLOT(i));
    return true;
}

/* The machine's counters made the sum of the slots alive again, after dead slots were cleared
 * (ledger locked).
 *
 * Why a recount and not a subtraction of the dead slot's bytes: a charge is two updates, the
 * machine's counter (compare-and-swap, against the capacity) then the process's slot, and a
 * give-back the slot then the counter. A process SIGKILLed between the two leaves the counter
 * off by that amount with nothing in its slot to say so; subtracting its slot would keep the
 * error forever. Recounting from the slots alive drops whatever the dead process had, in its
 * slot or in flight.
 *
 * Why the recount is exact while other processes keep charging without the lock: each charge
 * or give-back raises its slot's `inflight` before touching anything and lowers it after both
 * updates; after raising it, it reads `recounting`, and when that is set it backs out
 * (touching nothing) and does its work under the file lock instead, so after this recount.
 * Here `recounting` is set before any `inflight` is read; both sides use sequentially
 * consistent operations, so of a charge and a recount at least one sees the other's flag
 * (the store-then-load pattern of Dekker's algorithm). A charge that went on is therefore seen
 * in flight, and the recount waits until its slot's `inflight` is 0 (both updates visible),
 * or until its owner is found dead (its lock free: cleared like the others). With every slot
 * alive quiet and no new charge starting, sum of slots = bytes in use, and that is stored. */
static void recompute_machine(void)
{
    __atomic_store_n(&ledger->machine.recounting, 1, __ATOMIC_SEQ_CST);
    uint64_t sum[FG_MAX_DEVICES] = {0};
    for (int i = 0, high = slots_taken(); i < high; i++) {
        struct ledger_slot *s = &ledger->slot[i];
        if (!__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE))
            continue;
        bool dead = false;
        for (unsigned spins = 0; __atomic_load_n(&s->inflight, __ATOMIC_SEQ_CST); spins++)
            if (spins % 64 == 63 && i != own_slot_now(current_pid()) && reclaim_if_dead(i)) {
                dead = true; /* killed in the middle of a charge */
                break;
            } else
                sched_yield(); /* the owner is between two stores */
        if (dead)
            continue;
        for (int d = 0; d < FG_MAX_DEVICES; d++)
            sum[d] += __atomic_load_n(&s->used[d], __ATOMIC_ACQUIRE);
    }
    for (int d = 0; d < FG_MAX_DEVICES; d++)
        __atomic_store_n(&ledger->machine.used[d], sum[d], __ATOMIC_RELAXED);
    __atomic_store_n(&ledger->machine.recounting, 0, __ATOMIC_SEQ_CST);
}

/* Clears the slots of processes gone, and recounts when there were any. Ledger locked. */
static void reclaim_dead(void)
{
    int mine = own_slot_now(current_pid());
    bool any = false;
    for (int i = 0, high = slots_taken(); i < high; i++)
        if (i != mine && __atomic_load_n(&ledger->slot[i].pid, __ATOMIC_ACQUIRE))
            any |= reclaim_if_dead(i);
    if (any)
        recompute_machine();
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
            /* Free, or its owner gone: whatever it held is given back (a recount). */
            struct ledger_slot *s = &ledger->slot[i];
            bool stale = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != 0;
            if (stale) /* as in reclaim_if_dead */
                __atomic_store_n(&ledger->machine.recounting, 1, __ATOMIC_SEQ_CST);
            memset(s->used, 0, sizeof s->used);
            __atomic_store_n(&s->inflight, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&s->pid, (int32_t)pid, __ATOMIC_RELEASE);
            if ((uint32_t)i >= ledger->high)
                __atomic_store_n(&ledger->high, (uint32_t)i + 1, __ATOMIC_RELEASE);
            __atomic_store_n(&my_slot_pid, pid, __ATOMIC_RELEASE);
            __atomic_store_n(&my_slot, i, __ATOMIC_RELEASE);
            if (stale)
                recompute_machine();
            return i;
        }
    return -1;
}

static void raise_peak(int physical, uint64_t used)
{
    uint64_t peak = __atomic_load_n(&ledger->peak[physical], __ATOMIC_RELAXED);
    while (used > peak && !__atomic_compare_exchange_n(&ledger->peak[physical], &peak, used, true,
                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

enum { TRY_CHARGED, TRY_FULL, TRY_RECOUNTING };

/* Charges N bytes on PHYSICAL to slot MINE when the machine stays within CAPACITY. LOCKED: the
 * caller holds the ledger lock (no recount can run). *USED: the machine's bytes in use seen. */
static int try_charge(int mine, int physical, uint64_t n, uint64_t capacity, bool locked,
                      uint64_t *used)
{
    struct ledger_slot *s = &ledger->slot[mine];
    __atomic_add_fetch(&s->inflight, 1, __ATOMIC_SEQ_CST);
    if (!locked && __atomic_load_n(&ledger->machine.recounting, __ATOMIC_SEQ_CST)) {
        __atomic_sub_fetch(&s->inflight, 1, __ATOMIC_RELEASE);
        return TRY_RECOUNTING;
    }
    uint64_t *machine = &ledger->machine.used[physical];
    uint64_t now = __atomic_load_n(machine, __ATOMIC_RELAXED);
    do {
        if (now > capacity || n > capacity - now) {
            __atomic_sub_fetch(&s->inflight, 1, __ATOMIC_RELEASE);
            *used = now;
            return TRY_FULL;
        }
    } while (!__atomic_compare_exchange_n(machine, &now, now + n, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    __atomic_add_fetch(&s->used[physical], n, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&s->inflight, 1, __ATOMIC_RELEASE);
    raise_peak(physical, now + n);
    return TRY_CHARGED;
}

int fg_ledger_charge(int physical, unsigned long long n, unsigned long long capacity,
                     bool unseen)
{
    if (!active())
        return FG_LEDGER_OFF;
    if (!__atomic_load_n(&asked_device[physical], __ATOMIC_RELAXED) &&
        !__atomic_exchange_n(&asked_device[physical], 1, __ATOMIC_RELAXED))
        __atomic_add_fetch(&ledger->processes.on_device[physical], 1, __ATOMIC_RELAXED);
    uint64_t used = 0;
    int mine = own_slot_now(current_pid());
    if (mine >= 0 && try_charge(mine, physical, n, capacity, false, &used) == TRY_CHARGED)
        return FG_LEDGER_CHARGED;
    /* No slot yet, a recount under way, or the card looks full: under the lock, with the dead
     * processes' bytes given back first. */
    lock_ledger();
    mine = own_slot();
    int result = FG_LEDGER_FULL;
    if (mine < 0) {
        /* Every slot held: this process counts alone (said once). */
        static int said;
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "vramshim fakegpu: the device ledger has no free slot (%d processes "
                            "hold one); this process counts only its own device memory\n",
                    LEDGER_SLOTS);
        result = FG_LEDGER_OFF;
    } else {
        reclaim_dead();
        if (try_charge(mine, physical, n, capacity, true, &used) == TRY_CHARGED)
            result = FG_LEDGER_CHARGED;
        else if (unseen && ledger->unseen_refused[physical]++ == 0 && !ledger->refused_pid) {
            ledger->refused_pid = (int32_t)current_pid();
            ledger->refused_device = physical;
            ledger->refused_bytes = n;
            ledger->refused_used = used;
        }
    }
    unlock_ledger();
    return result;
}

/* Takes up to N bytes off slot MINE and the machine's counter (both by the same amount). */
static void give_back(int mine, int physical, uint64_t n)
{
    uint64_t *held = &ledger->slot[mine].used[physical];
    uint64_t now = __atomic_load_n(held, __ATOMIC_RELAXED);
    uint64_t take;
    do
        take = n < now ? n : now;
    while (!__atomic_compare_exchange_n(held, &now, now - take, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
    __atomic_sub_fetch(&ledger->machine.used[physical], take, __ATOMIC_RELAXED);
}

/* Only this process writes its slot while it runs (threads: atomically): no ledger lock, but
 * for a recount under way. */
void fg_ledger_uncharge(int physical, unsigned long long n)
{
    int mine = active() ? own_slot_now(current_pid()) : -1;
    if (mine < 0)
        return;
    struct ledger_slot *s = &ledger->slot[mine];
    __atomic_add_fetch(&s->inflight, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&ledger->machine.recounting, __ATOMIC_SEQ_CST)) {
        give_back(mine, physical, n);
        __atomic_sub_fetch(&s->inflight, 1, __ATOMIC_RELEASE);
        return;
    }
    __atomic_sub_fetch(&s->inflight, 1, __ATOMIC_RELEASE);
    lock_ledger(); /* after the recount */
    give_back(mine, physical, n);
    unlock_ledger();
}

/* Liveness at a query. cuMemGetInfo (and NVML, and `dryrun`'s sampler at every recorded event)
 * must not count the bytes of a process gone, and must cost well under a microsecond. Only
 * other slots with bytes on the queried device, or in the middle of a charge (which may be on
 * it), can change its figure: a process alone on its device (DDP's one rank per GPU) asks the
 * kernel nothing. For the others, this process keeps a pidfd (pidfd_open) of each one's owner
 * in one epoll set, and one epoll_wait(..., 0) says whether any of them has ended, whatever
 * their number. Readable: that process is gone (the kernel closes its files, so drops its
 * record lock, before it makes its pidfd readable), and the dead slots are cleared and the
 * counters recounted as in a charge (reclaim_dead). That pidfd is then closed: a dead process
 * fires once.
 *
 * The set follows the slots lazily: each entry remembers the pid it was opened for, and a query
 * that finds a slot with another pid (retaken, or cleared) closes the old pidfd and, when the
 * slot matters, opens one for the new owner. Pid reuse: a pidfd is opened on a pid read from
 * the file, which may by then name another process (the owner died, the pid was reused). So
 * after opening it, the slot's lock is asked (F_GETLK names its holder): free, the owner is
 * gone (reclaim); held by that pid, the pidfd is the owner's (opened before the check, while
 * the holder was alive); held by another process (one clearing or retaking the slot), the
 * pidfd is not kept, the query waits for that process's work under the ledger lock (its
 * recount done, the figure is right) and the slot is asked by F_GETLK until its pid changes.
 * Another thread of this process may have taken a death's event and not yet cleared the slot:
 * the slot, no longer watched, is looked at anew (its lock free: gone).
 *
 * What a pidfd cannot see: a process that exec'd a program making no CUDA call lives on with
 * its lock dropped (the ledger's descriptor is close-on-exec). Such a slot is found by an
 * F_GETLK of every watched slot that matters once every sweep period per process
 * (VRAMSHIM_FAKEGPU_LEDGER_SWEEP_MS, default 10 ms: the first query after that long asks them
 * all); a charge that does not fit asks every slot's lock before failing, as always, so no
 * allocation fails because of it: only cuMemGetInfo can show the exec'd process's bytes, for
 * at most that period. (An exec into a CUDA program frees the slot at its first charge.)
 *
 * Limits: pidfds are opened for at most WATCH_MAX processes, and no more than a sixteenth of
 * the descriptor limit (RLIMIT_NOFILE): the program keeps nearly all its descriptors; all are
 * close-on-exec (pidfds always are; the set by EPOLL_CLOEXEC). A slot over the cap, one whose
 * pidfd cannot be opened (EMFILE, ENOMEM) and every slot on a kernel without pidfd_open
 * (Linux < 5.3, or a seccomp filter refusing it: ENOSYS, EPERM) is asked by one F_GETLK per
 * query, as before the set existed; nothing is printed (the answer is the same, only slower).
 * A fork child must not use its parent's set (the epoll instance is shared with the parent):
 * the child closes its copies of the descriptors after fork, and every use checks that the set
 * was made by this process (a child forked from a signal handler interrupting a query). The
 * set's lock (watch_mutex) is taken across fork with the driver's others (fork.c). */
#define WATCH_MAX 64

struct watch_entry {
    int32_t pid; /* the slot's owner this entry was made for; 0: no entry */
    int fd;      /* its pidfd, in the set; -1: asked by F_GETLK at every query */
    bool alias;  /* its lock's holder has another pid here: the owner seen from another pid
                  * namespace (owner_alive) */
};
static struct {
    pid_t maker;       /* the process that made these descriptors; another: a fork child's copy */
    int epoll_fd;      /* -1: not made yet, or none to be had */
    bool no_pidfd;     /* pidfd_open refused (old kernel, seccomp) or the set broken */
    int watched, cap;  /* pidfds open; the most this process takes */
    long long last_sweep;
    struct watch_entry slot[LEDGER_SLOTS];
} watch = {.epoll_fd = -1};
static pthread_mutex_t watch_mutex = PTHREAD_MUTEX_INITIALIZER;

pthread_mutex_t *fg_ledger_watch_lock(void) { return &watch_mutex; }

/* Forgets the set; CLOSE: its descriptors are this process's copies, closed (never when they
 * may be the program's: see watch_broken). watch_mutex held, or the child alone after fork. */
static void watch_forget(bool close_them)
{
    if (close_them) {
        for (int i = 0; i < LEDGER_SLOTS; i++)
            if (watch.slot[i].pid && watch.slot[i].fd >= 0)
                close(watch.slot[i].fd);
        if (watch.epoll_fd >= 0)
            close(watch.epoll_fd);
    }
    memset(watch.slot, 0, sizeof watch.slot);
    watch.epoll_fd = -1;
    watch.watched = 0;
    watch.last_sweep = 0;
    watch.maker = current_pid();
    struct rlimit files;
    long long cap = getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY
                        ? WATCH_MAX
                        : (long long)(files.rlim_cur / 16);
    watch.cap = cap < WATCH_MAX ? (int)cap : WATCH_MAX;
}

/* The child's copies of its parent's descriptors are closed (the parent keeps the set); when
 * the fork came from a signal handler interrupting a query in this thread, the lock is still
 * held and the interrupted query finds the set not its own (watch.maker) and does the same. */
static void watch_after_fork_child(void)
{
    if (pthread_mutex_trylock(&watch_mutex) != 0)
        return;
    if (watch.maker)
        watch_forget(true);
    pthread_mutex_unlock(&watch_mutex);
}

/* Entry I's pidfd out of the set and closed (EPOLL_CTL_DEL first: a fork child still holding
 * a copy of it would keep it in the set past the close). */
static void unwatch(int i)
{
    struct watch_entry *e = &watch.slot[i];
    if (e->pid && e->fd >= 0) {
        epoll_ctl(watch.epoll_fd, EPOLL_CTL_DEL, e->fd, NULL);
        close(e->fd);
        watch.watched--;
    }
    e->pid = 0;
    e->fd = -1;
    e->alias = false;
}

/* A descriptor of the set is no longer what it was (the program closed it: a daemon's
 * close-all): they are forgotten without closing (the numbers may be the program's now) and
 * every slot is asked by F_GETLK from now on. */
static void watch_broken(void)
{
    watch_forget(false);
    watch.no_pidfd = true;
}

/* Whether entry E's process is alive by HOLDER, its slot's lock holder (slot_holder). False
 * when it is gone, or may be: another process holds the lock, one clearing the slot (the owner
 * died) or retaking it, and until it has recounted the machine's counter is not yet right; the
 * caller then takes the ledger lock and reclaims, which waits for that process's work (both
 * are done under the ledger lock). If after that the slot still names the same pid, the lock is
 * its owner's under another pid (another pid namespace): E->alias, held means alive. */
static bool owner_alive(struct watch_entry *e, pid_t holder)
{
    if (holder == 0)
        return false;
    if (holder == e->pid || holder < 0 || e->alias)
        return true;
    e->alias = true;
    return false;
}

/* Makes entry I for PID, the slot's owner as read; false when the owner is found gone (or may
 * be: owner_alive). */
static bool watch_slot(int i, int32_t pid)
{
    struct watch_entry *e = &watch.slot[i];
    e->pid = pid;
    e->fd = -1;
    e->alias = false;
    int fd = -1;
    if (!watch.no_pidfd && watch.watched < watch.cap) {
        if (watch.epoll_fd < 0)
            watch.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
        if (watch.epoll_fd >= 0) {
            fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0u);
            if (fd < 0 && (errno == ENOSYS || errno == EPERM))
                watch.no_pidfd = true;
        }
    }
    pid_t holder = slot_holder(i);
    if (fd >= 0) {
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        if (holder == pid && epoll_ctl(watch.epoll_fd, EPOLL_CTL_ADD, fd, &event) == 0) {
            e->fd = fd;
            watch.watched++;
        } else
            close(fd);
    }
    return owner_alive(e, holder);
}

static long long monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts); /* the vDSO's: no system call */
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Whether the owners of the other slots that weigh on PHYSICAL (FIRST the lowest of them) are
 * all alive; false when one is found gone. */
__attribute__((noinline)) /* the query of a process alone on its device stays short */
static bool others_alive(int physical, int mine, int first, int high)
{
    pthread_mutex_lock(&watch_mutex);
    if (watch.maker != current_pid())
        watch_forget(watch.maker != 0); /* a fork child's copies, or none yet */
    bool sweep = false;
    long long now = monotonic_ns();
    if (now - watch.last_sweep >= fg_config()->ledger_sweep_ns) {
        sweep = true;
        watch.last_sweep = now;
    }
    bool alive = true, wait = false;
    for (int i = 0; i < high; i++) {
        const struct ledger_slot *s = &ledger->slot[i];
        int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
        struct watch_entry *e = &watch.slot[i];
        if (e->pid && e->pid != pid)
            unwatch(i); /* cleared or retaken since */
        /* Once a process is found gone the rest is only tidied: the caller reclaims them all. */
        if (!alive || i < first || i == mine || !pid)
            continue;
        if (!__atomic_load_n(&s->used[physical], __ATOMIC_ACQUIRE) &&
            !__atomic_load_n(&s->inflight, __ATOMIC_SEQ_CST))
            continue;
        if (!e->pid)
            alive = watch_slot(i, pid);
        else if (e->fd < 0 || sweep) {
            pid_t holder = slot_holder(i);
            alive = owner_alive(e, holder);
            if (holder == 0)
                unwatch(i); /* gone (an exec'd process): its pidfd would never fire */
        }
        wait |= e->fd >= 0;
    }
    if (wait) {
        struct epoll_event events[8];
        int n;
        do
            n = epoll_wait(watch.epoll_fd, events, 8, 0);
        while (n < 0 && errno == EINTR);
        if (n < 0) {
            watch_broken();
            alive = false; /* not known: reclaim_dead asks every slot */
        }
        for (int k = 0; k < n; k++) {
            uint32_t i = events[k].data.u32;
            if (i < LEDGER_SLOTS)
                unwatch((int)i); /* ended: readable for ever, its slot reclaimed now */
            alive = false;
        }
    }
    pthread_mutex_unlock(&watch_mutex);
    return alive;
}

/* The machine's bytes in use on PHYSICAL: its counter, once the owner of every other slot that
 * could weigh on it is known alive (above); a dead one found, its bytes are given back first. */
bool fg_ledger_used(int physical, unsigned long long *used)
{
    if (!active())
        return false;
    int mine = own_slot_now(current_pid());
    for (int i = 0, high = slots_taken(); i < high; i++) {
        const struct ledger_slot *s = &ledger->slot[i];
        if (i == mine || !__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE))
            continue;
        if (!__atomic_load_n(&s->used[physical], __ATOMIC_ACQUIRE) &&
            !__atomic_load_n(&s->inflight, __ATOMIC_SEQ_CST))
            continue;
        if (!others_alive(physical, mine, i, high)) {
            lock_ledger();
            reclaim_dead();
            unlock_ledger();
        }
        break;
    }
    /* Another process clearing a dead slot (which this scan may no longer have seen) has not
     * recounted yet: its work is waited for (it holds the ledger lock until done). */
    if (__atomic_load_n(&ledger->machine.recounting, __ATOMIC_SEQ_CST)) {
        lock_ledger();
        unlock_ledger();
    }
    *used = __atomic_load_n(&ledger->machine.used[physical], __ATOMIC_ACQUIRE);
    return true;
}

int fg_ledger_processes(int physical, int max, int32_t *pids, unsigned long long *used)
{
    if (!active())
        return -1;
    lock_ledger();
    reclaim_dead();
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
