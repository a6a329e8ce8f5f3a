//! Alternate signal stacks: a stack overflow's SIGSEGV can only be handled on one. Given to
//! each thread the shim records on at its first hooked call (by capture), released at thread
//! exit (by the lifecycle). Only `sigaltstack`, `mmap` and `munmap`: no lock, no allocator.

use std::cell::Cell;
use std::ffi::c_void;

/// Bytes of each alternate stack the shim gives a thread (plus a guard page below it). Only
/// the pages a crash flush touches are ever backed by memory.
const ALT_STACK_BYTES: usize = 256 << 10;
const PAGE: usize = 4096;

thread_local! {
    /// The mapping of the alternate stack the shim gave this thread (0 = none).
    static ALT_STACK: Cell<usize> = const { Cell::new(0) };
}

/// Gives the calling thread an alternate signal stack if it has none (never replacing the
/// program's own), so that the crash flush runs even when the thread's stack overflowed.
pub fn give_thread_an_alt_stack() {
    unsafe {
        let mut current: libc::stack_t = std::mem::zeroed();
        if libc::sigaltstack(std::ptr::null(), &mut current) != 0
            || current.ss_flags & libc::SS_DISABLE == 0
        {
            return;
        }
        let base = libc::mmap(
            std::ptr::null_mut(),
            ALT_STACK_BYTES + PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if base == libc::MAP_FAILED {
            return;
        }
        // The guard page turns an overflow of the alternate stack into a clean fault.
        libc::mprotect(base, PAGE, libc::PROT_NONE);
        let stack = libc::stack_t {
            ss_sp: base.cast::<u8>().add(PAGE).cast(),
            ss_flags: 0,
            ss_size: ALT_STACK_BYTES,
        };
        if libc::sigaltstack(&stack, std::ptr::null_mut()) != 0 {
            libc::munmap(base, ALT_STACK_BYTES + PAGE);
            return;
        }
        let _ = ALT_STACK.try_with(|alt| alt.set(base as usize));
    }
}

/// At thread exit: switches off the alternate stack the shim gave the thread (if it is still
/// the thread's) and unmaps it; not while running on it.
pub fn release_alt_stack() {
    let base = ALT_STACK.try_with(|alt| alt.get()).unwrap_or(0);
    if base == 0 {
        return;
    }
    unsafe {
        let mut current: libc::stack_t = std::mem::zeroed();
        if libc::sigaltstack(std::ptr::null(), &mut current) != 0 {
            return;
        }
        if current.ss_sp as usize == base + PAGE && current.ss_flags & libc::SS_DISABLE == 0 {
            if current.ss_flags & libc::SS_ONSTACK != 0 {
                return;
            }
            let off = libc::stack_t {
                ss_sp: std::ptr::null_mut(),
                ss_flags: libc::SS_DISABLE,
                ss_size: 0,
            };
            if libc::sigaltstack(&off, std::ptr::null_mut()) != 0 {
                return;
            }
        }
        let _ = ALT_STACK.try_with(|alt| alt.set(0));
        libc::munmap(base as *mut c_void, ALT_STACK_BYTES + PAGE);
    }
}
