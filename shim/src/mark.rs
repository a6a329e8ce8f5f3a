//! `vramshim_mark(text)`: an annotation from the program itself (Python's `vramshim.mark`,
//! called through ctypes), written into the log as a `mark` record that reports draw on
//! timelines. Not async-signal-safe: it allocates, so it must not be called from a signal
//! handler.

use std::ffi::{CStr, c_char, c_int};

use crate::{process, writer};

/// Writes `text` (a NUL-terminated string; cut to 4 KiB) into the log as a mark stamped now.
/// Returns 1 when it was recorded, 0 when it was not (recording is off, or the log's queue
/// stayed busy), -1 for a null `text`. Starts recording, as a hooked CUDA call would.
///
/// # Safety
/// `text` is null or points to a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramshim_mark(text: *const c_char) -> c_int {
    if text.is_null() {
        return -1;
    }
    crate::guard(0, || {
        if !process::ensure_started() {
            return 0;
        }
        let text = unsafe { CStr::from_ptr(text) };
        c_int::from(writer::mark(process::gettid(), text.to_bytes()))
    })
}
