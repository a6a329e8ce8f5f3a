//! The bottom layer: what every other part of the shim may read, and which calls nothing
//! above it. The settings, whether recording is on, the thread-exit key, the clock and thread
//! id, and the one-line messages and panic guard.
//!
//! Starting the recorder is the lifecycle's work (it opens the log, installs handlers), which
//! sits above capture and the writer. The hook path only asks [`ensure_started`]; the first
//! call runs the starter the lifecycle registered when the library was loaded
//! ([`set_starter`]), so no module below the lifecycle names it.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use crate::config::Config;

/// Recording not started yet (the first CUDA call starts it).
pub const UNINIT: u8 = 0;
/// A thread is opening the log.
pub const STARTING: u8 = 1;
/// Recording.
pub const ON: u8 = 2;
/// Off for good (could not start, or an internal error).
pub const OFF: u8 = 3;

/// One of the four states above.
pub static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// The settings, read once (reset in a fork child when a vanished thread was reading them).
pub static CONFIG: OnceLock<Config> = OnceLock::new();
/// Set by the final flush: later events (other libraries' destructors) are written at once.
pub static FINISHED: AtomicBool = AtomicBool::new(false);
/// The key whose destructor releases a thread's ring at thread exit (`u32::MAX` = none).
pub static THREAD_KEY: AtomicU32 = AtomicU32::new(u32::MAX);
/// What opens the log and starts the writer: `fn() -> bool`, registered at load.
static STARTER: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// The settings (read once).
pub fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (config, warnings) = Config::from_env();
        for warning in warnings {
            warn(&warning);
        }
        config
    })
}

/// Registers what starts recording (the lifecycle's `start`, at library load).
pub fn set_starter(start: fn() -> bool) {
    STARTER.store(start as *mut (), Ordering::Release);
}

/// Whether recording is on; starts it on the first call.
#[inline]
pub fn ensure_started() -> bool {
    match STATE.load(Ordering::Acquire) {
        ON => true,
        OFF => false,
        _ => start_slow(),
    }
}

/// Whether recording is on now (never starts it).
#[inline]
pub fn is_on() -> bool {
    STATE.load(Ordering::Acquire) == ON
}

/// Stops recording for good (after an internal error).
pub fn disable() {
    STATE.store(OFF, Ordering::Release);
}

#[cold]
fn start_slow() -> bool {
    let starter = STARTER.load(Ordering::Acquire);
    if starter.is_null() {
        // A CUDA call from a constructor that ran before the shim's own: not yet.
        return false;
    }
    let start: fn() -> bool = unsafe { std::mem::transmute::<*mut (), fn() -> bool>(starter) };
    loop {
        match STATE.compare_exchange(UNINIT, STARTING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                let started = guard(false, start);
                STATE.store(if started { ON } else { OFF }, Ordering::Release);
                return started;
            }
            Err(ON) => return true,
            Err(OFF) => return false,
            // Another thread is opening the log.
            Err(_) => std::thread::sleep(Duration::from_micros(50)),
        }
    }
}

/// Whether the final flush already ran (then each later event is flushed at once).
pub fn finished() -> bool {
    FINISHED.load(Ordering::Acquire)
}

/// Arranges for `ring` (the thread's, as a raw `Arc`) to be released when the calling thread
/// exits, by the destructor of [`THREAD_KEY`].
pub fn set_thread_exit_hook(ring: *const c_void) {
    let key = THREAD_KEY.load(Ordering::Acquire);
    if key != u32::MAX {
        unsafe { libc::pthread_setspecific(key, ring) };
    }
}

/// Kernel thread id of the caller.
pub fn gettid() -> u32 {
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Monotonic clock in nanoseconds.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Runs `f`; if it panics, recording stops for good (one warning) and `fallback` is returned.
pub fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => value,
        Err(_) => {
            static WARNED: AtomicBool = AtomicBool::new(false);
            disable();
            if !WARNED.swap(true, Ordering::AcqRel) {
                warn("internal error; recording stopped, the program continues unrecorded");
            }
            fallback
        }
    }
}

/// One line on stderr, prefixed `vramshim:`.
pub fn warn(message: &str) {
    let line = format!("vramshim: {message}\n");
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// A fixed line on stderr, written as it is: no allocation, so fine in a signal handler.
pub fn warn_static(line: &'static str) {
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// A line on stderr when `VRAMSHIM_DEBUG=1`.
pub fn debug(args: std::fmt::Arguments<'_>) {
    if config().debug {
        warn(&format!("debug: {args}"));
    }
}
