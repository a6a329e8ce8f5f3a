/* The fake driver's locks across fork: a child forked while another thread is inside a fake
 * call must not find that call's lock held for ever (the fakes support CUDA in a fork child,
 * as the ledger does; a DataLoader worker forks while other threads run).
 *
 * The prepare handler takes every lock of the driver in one order, the nesting order found in
 * the code (an arrow: taken while holding):
 *   init_lock (cuInit) -> pools_lock (a device's default pool made)
 *   capture_lock (graph memory) -> pools_lock (trim), device lock (charge), registry_lock,
 *       map_cache_lock, host_lock
 *   imports_lock (pool pointers imported) -> registry_lock
 *   ipc_lock -> registry_lock, host_lock
 *   vmm_lock -> registry_lock -> host_lock (an export moves the mappings' written pages)
 *   pools_lock -> a pool's lock -> device lock (charge), registry_lock, map_cache_lock
 *   device lock (each device's, fg_devices[d].lock) -> ledger_mutex
 *   the ledger's watch_mutex (cuMemGetInfo's set of other processes), map_cache_lock,
 *       host_lock, unknown_names_lock: nothing inside
 * so: init, capture, imports, ipc, vmm, pools, every pool's, every device's, ledger, ledger
 * watch, registry, host, map cache, unknown names. The parent and child handlers release them in reverse.
 * The fake runtime (libcudart) holds its own lock while calling the driver: it registers its
 * handlers after this library's (its constructor runs after the driver's, which it links), and
 * prepare handlers run in reverse order of registration, so its lock is taken before these.
 * How a lock the forking thread already holds is treated: fakegpu_fork.h. */
#include <stddef.h>

#include "driver.h"
#include "fakegpu_fork.h"

static struct fg_fork_state fork_state;

/* The locks that are not per pool or per device, in the order above; NULL marks where the pools
 * and the devices go. */
#define FIXED_LOCKS 14
static pthread_mutex_t *fixed[FIXED_LOCKS];
enum { AT_POOLS = 6, AT_DEVICES = 7 };

static void list_fixed(void)
{
    pthread_mutex_t *order[FIXED_LOCKS] = {
        fg_init_lock(),    fg_capture_lock(), fg_imports_lock(), fg_ipc_lock(),
        fg_vmm_lock(),     fg_pools_lock(),   NULL /* pools */,  NULL /* devices */,
        fg_ledger_lock(),  fg_ledger_watch_lock(), fg_registry_lock(), fg_host_lock(),
        fg_map_cache_lock(), fg_unknown_names_lock()};
    for (int i = 0; i < FIXED_LOCKS; i++)
        fixed[i] = order[i];
}

/* Devices whose lock is in use: none before cuInit (the locks are made there). */
static int devices_in_use(void) { return fg_initialized() ? fg_config()->count : 0; }

static void take(pthread_mutex_t *m, void *arg)
{
    (void)arg;
    fg_fork_take(&fork_state, m);
}

static void release_parent(pthread_mutex_t *m, void *arg)
{
    (void)arg;
    fg_fork_release_parent(&fork_state, m);
}

static void release_child(pthread_mutex_t *m, void *arg)
{
    (void)arg;
    fg_fork_release_child(&fork_state, m);
}

static void before_fork(void)
{
    fg_fork_begin(&fork_state);
    for (int i = 0; i < FIXED_LOCKS; i++) {
        if (i == AT_POOLS) {
            /* The list is walked only under its lock (another thread may be adding a pool). */
            if (fg_fork_held(&fork_state, fg_pools_lock()))
                fg_pools_each_lock(take, NULL);
        } else if (i == AT_DEVICES) {
            for (int d = 0; d < devices_in_use(); d++)
                take(&fg_devices[d].lock, NULL);
        } else {
            take(fixed[i], NULL);
        }
    }
}

/* Releases in reverse; CHILD: the child (one thread: every list may be walked). */
static void release_all(bool child)
{
    void (*release)(pthread_mutex_t *, void *) = child ? release_child : release_parent;
    for (int i = FIXED_LOCKS - 1; i >= 0; i--) {
        if (i == AT_POOLS) {
            if (child || fg_fork_held(&fork_state, fg_pools_lock()))
                fg_pools_each_lock(release, NULL);
        } else if (i == AT_DEVICES) {
            for (int d = devices_in_use() - 1; d >= 0; d--)
                release(&fg_devices[d].lock, NULL);
        } else {
            release(fixed[i], NULL);
        }
    }
}

static void after_fork_parent(void) { release_all(false); }

static void after_fork_child(void)
{
    release_all(true);
    fg_ledger_after_fork_child();
    fg_fork_warn_child(&fork_state, "libcuda.so.1");
}

/* Registered when the library loads, before any fake call can hold a lock, and before the
 * libraries that link this one register theirs. */
__attribute__((constructor)) static void register_fork_handlers(void)
{
    list_fixed();
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}
