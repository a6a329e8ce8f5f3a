//! The shim's one lock type: a futex mutex that knows which thread holds it.
//!
//! Why not `parking_lot` or `std`: both may leave a lock unusable in a fork child (parking_lot
//! hands a contended lock to a parked thread that does not exist in the child, and its parked
//! threads live in a global table whose own locks may be held), and neither says who holds a
//! lock, which a signal handler needs to know so as never to wait for itself. This lock keeps
//! all its state in one word plus the owner's thread id: a fork child can reset it with plain
//! stores, and a flush on the thread that already holds it can step aside.

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const UNLOCKED: u32 = 0;
const LOCKED: u32 = 1;
/// Locked, and a thread may be waiting in `futex_wait`.
const CONTENDED: u32 = 2;

thread_local! {
    /// Shim locks the thread holds or is taking. Counted before the lock's word changes and
    /// after it changed back, so a signal handler that interrupts the thread anywhere in
    /// between sees it (the owner field alone has gaps around the atomic operation).
    static TAKEN_HERE: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread holds (or is taking or releasing) any shim lock: a signal
/// handler that interrupted it there must not wait for one.
pub fn any_taken_here() -> bool {
    TAKEN_HERE
        .try_with(|taken| taken.get() > 0)
        .unwrap_or(false)
}

fn count_taken(delta: i32) {
    let _ = TAKEN_HERE.try_with(|taken| taken.set(taken.get().wrapping_add_signed(delta)));
}

/// A mutual-exclusion lock around a `T`.
pub struct Lock<T> {
    state: AtomicU32,
    /// Kernel thread id of the holder (0 = none). Only a hint for "is it me?": the holder
    /// writes it after taking the lock and clears it before releasing.
    owner: AtomicU32,
    value: UnsafeCell<T>,
}

unsafe impl<T: Send> Sync for Lock<T> {}
unsafe impl<T: Send> Send for Lock<T> {}

/// Access to the locked value; releases the lock when dropped.
pub struct LockGuard<'a, T> {
    lock: &'a Lock<T>,
}

impl<T> Lock<T> {
    pub const fn new(value: T) -> Lock<T> {
        Lock {
            state: AtomicU32::new(UNLOCKED),
            owner: AtomicU32::new(0),
            value: UnsafeCell::new(value),
        }
    }

    /// Waits for the lock.
    pub fn lock(&self) -> LockGuard<'_, T> {
        count_taken(1);
        if self
            .state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        self.owned()
    }

    #[cold]
    fn lock_contended(&self) {
        // Spin a little first; the lock is mostly held for short moments.
        for _ in 0..40 {
            if self.state.load(Ordering::Relaxed) == UNLOCKED
                && self
                    .state
                    .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            std::hint::spin_loop();
        }
        // From here on the lock is only taken as CONTENDED: a thread that slept may have
        // company, and its unlock must wake the next sleeper.
        while self.state.swap(CONTENDED, Ordering::Acquire) != UNLOCKED {
            futex_wait(&self.state, CONTENDED);
        }
    }

    /// The lock if it is free now.
    pub fn try_lock(&self) -> Option<LockGuard<'_, T>> {
        count_taken(1);
        match self
            .state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Some(self.owned()),
            Err(_) => {
                count_taken(-1);
                None
            }
        }
    }

    /// The lock if it becomes free within `timeout`; `None` at once if the calling thread
    /// holds it. Polls with `nanosleep`, so it is async-signal-safe.
    pub fn try_lock_for(&self, timeout: Duration) -> Option<LockGuard<'_, T>> {
        if self.held_by(thread_id()) {
            return None;
        }
        let deadline = monotonic_ns().saturating_add(timeout.as_nanos() as u64);
        loop {
            if let Some(guard) = self.try_lock() {
                return Some(guard);
            }
            if monotonic_ns() >= deadline {
                return None;
            }
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 200_000,
            };
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
        }
    }

    /// Whether thread `tid` holds the lock.
    pub fn held_by(&self, tid: u32) -> bool {
        self.state.load(Ordering::Acquire) != UNLOCKED && self.owner.load(Ordering::Acquire) == tid
    }

    /// In a fork child (one thread, nobody waiting): makes the lock free and holding `value`,
    /// whatever state the parent's threads left it in. The old value is leaked, not dropped:
    /// a thread that vanished with the fork may have left it half-modified. Plain stores only,
    /// so async-signal-safe as long as making `value` allocates nothing.
    ///
    /// # Safety
    /// Only in a fork child, before any other thread exists and before anyone uses the lock.
    pub unsafe fn reset_in_fork_child(&self, value: T) {
        unsafe { std::ptr::write(self.value.get(), value) };
        self.owner.store(0, Ordering::Relaxed);
        self.state.store(UNLOCKED, Ordering::Release);
    }

    fn owned(&self) -> LockGuard<'_, T> {
        self.owner.store(thread_id(), Ordering::Release);
        LockGuard { lock: self }
    }
}

impl<T> Drop for LockGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.owner.store(0, Ordering::Release);
        if self.lock.state.swap(UNLOCKED, Ordering::Release) == CONTENDED {
            futex_wake_one(&self.lock.state);
        }
        count_taken(-1);
    }
}

impl<T> Deref for LockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for LockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        unsafe { &mut *self.lock.value.get() }
    }
}

// This module sits below every other one (no `crate::` imports): the clock and the thread id
// are read here directly.

thread_local! {
    /// The thread's kernel id, asked once: every lock taken records its owner, and a
    /// `gettid` system call per lock was most of the shim's system calls on a training step
    /// (4,602 of 4,945 added). 0 until asked; a fork child forgets it (`after_fork_child`).
    static THREAD_ID: Cell<u32> = const { Cell::new(0) };
}

fn thread_id() -> u32 {
    let ask = || unsafe { libc::syscall(libc::SYS_gettid) as u32 };
    THREAD_ID
        .try_with(|id| match id.get() {
            0 => {
                let tid = ask();
                id.set(tid);
                tid
            }
            tid => tid,
        })
        // During the thread's TLS teardown: ask every time.
        .unwrap_or_else(|_| ask())
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

fn futex_wait(word: &AtomicU32, expected: u32) {
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

fn futex_wake_one(word: &AtomicU32) {
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
}

// ---------------------------------------------------------------------------------------
// The loader's list lock across fork.
//
// glibc's `dl_iterate_phdr` holds `dl_load_write_lock`, and a fork child does not get that lock
// reset (glibc resets `dl_load_lock` only): a fork while another thread walks the list leaves
// the child unable to walk it, and the shim walks it at the child's first CUDA call (module
// map, unwinder). So every walk in the process is gated (the shim exports `dl_iterate_phdr`:
// the program's, libgcc's unwinder's and its own calls all pass through it): `fork` waits,
// at most ~2 s, for the walks in flight to end and holds new ones back until it returns.

/// Threads inside `dl_iterate_phdr`.
static LOADER_WALKS: AtomicU32 = AtomicU32::new(0);
/// Forks in progress (prepare handler ran, parent handler not yet).
static FORKS: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// Walks of this thread in progress (a callback may walk again).
    static WALKING_HERE: Cell<u32> = const { Cell::new(0) };
}

/// Runs `walk`, which calls `dl_iterate_phdr`, outside of any fork.
pub fn loader_walk<R>(walk: impl FnOnce() -> R) -> R {
    let mut waited = 0u32;
    loop {
        LOADER_WALKS.fetch_add(1, Ordering::SeqCst);
        // Give up waiting after ~2 s: a fork that never returns must not stop recording.
        if FORKS.load(Ordering::SeqCst) == 0 || waited > 10_000 {
            break;
        }
        LOADER_WALKS.fetch_sub(1, Ordering::SeqCst);
        waited += 1;
        pause_200us();
    }
    let _ = WALKING_HERE.try_with(|here| here.set(here.get() + 1));
    let result = walk();
    let _ = WALKING_HERE.try_with(|here| here.set(here.get().saturating_sub(1)));
    LOADER_WALKS.fetch_sub(1, Ordering::SeqCst);
    result
}

/// `fork` prepare handler: waits (at most ~2 s, and not for a walk of its own thread that a
/// signal handler interrupted) until no shim thread is inside the loader's list.
pub fn before_fork() {
    FORKS.fetch_add(1, Ordering::SeqCst);
    if WALKING_HERE
        .try_with(|here| here.get() > 0)
        .unwrap_or(false)
    {
        return;
    }
    for _ in 0..10_000 {
        if LOADER_WALKS.load(Ordering::SeqCst) == 0 {
            return;
        }
        pause_200us();
    }
}

/// `fork` parent handler.
pub fn after_fork_parent() {
    FORKS.fetch_sub(1, Ordering::SeqCst);
}

/// `fork` child handler: the child has no walks and no fork in flight.
pub fn after_fork_child() {
    // The forking thread's id was the parent's.
    let _ = THREAD_ID.try_with(|id| id.set(0));
    FORKS.store(0, Ordering::SeqCst);
    LOADER_WALKS.store(0, Ordering::SeqCst);
    let _ = WALKING_HERE.try_with(|here| here.set(0));
}

fn pause_200us() {
    let pause = libc::timespec {
        tv_sec: 0,
        tv_nsec: 200_000,
    };
    unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
}
