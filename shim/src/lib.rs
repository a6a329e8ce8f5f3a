//! `libvramshim.so`: loaded with `LD_PRELOAD` into an unmodified CUDA program, it records every
//! device-memory allocation, free and failed allocation into a compact, crash-safe log.
//!
//! How calls are reached (see `interpose` and `resolver`): exported driver and runtime
//! symbols, an exported `dlsym` that hands out wrappers to a libcuda handle, and wrappers of
//! the driver's resolver and of `cudaGetDriverEntryPoint*`. What each entry point records is
//! declared once in `table`. Hooks append to per-thread rings (`capture`); a writer thread
//! drains them into the log (`writer`); `lifecycle` keeps the log complete across fork, exec,
//! exit and crashes.
//!
//! The shim never changes what the program sees: return values and out-parameters pass
//! through untouched, every panic is caught, and any internal failure turns recording off with
//! one warning line.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

mod capture;
mod config;
mod flight;
mod interpose;
mod lifecycle;
mod python;
mod resolver;
mod stacks;
mod sync;
mod table;
mod unwind;
mod writer;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `f`; if it panics, recording stops for good (one warning) and `fallback` is returned.
pub(crate) fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => value,
        Err(_) => {
            static WARNED: AtomicBool = AtomicBool::new(false);
            lifecycle::disable();
            if !WARNED.swap(true, Ordering::AcqRel) {
                warn("internal error; recording stopped, the program continues unrecorded");
            }
            fallback
        }
    }
}

/// One line on stderr, prefixed `vramshim:`.
pub(crate) fn warn(message: &str) {
    let line = format!("vramshim: {message}\n");
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// A fixed line on stderr, written as it is: no allocation, so fine in a signal handler.
pub(crate) fn warn_static(line: &'static str) {
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// A line on stderr when `VRAMSHIM_DEBUG=1`.
pub(crate) fn debug(args: std::fmt::Arguments<'_>) {
    if lifecycle::config().debug {
        warn(&format!("debug: {args}"));
    }
}
