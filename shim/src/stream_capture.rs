//! Stream captures in progress, so that a stream-ordered allocation or free asks the driver
//! whether its stream is being captured only while some capture is in progress: the common
//! case costs one atomic load, not a driver call.
//!
//! Every entry point that begins a capture into a graph is hooked (`table`): the runtime's
//! `cudaStreamBeginCapture`, `cudaStreamBeginCaptureToGraph` and the driver's
//! `cuStreamBeginCapture` (CUDA 10.0's, no mode), `cuStreamBeginCapture_v2`,
//! `cuStreamBeginCaptureToGraph`, each also as `_ptsz`; and the ends, `cu(da)StreamEndCapture`
//! (`_ptsz` too). The count is raised before the real begin (a stream the capture reaches is
//! seen by the program only after that) and lowered again when the begin fails or when an end
//! takes the stream out of capture. A runtime call's inner driver call is not counted again.
//! An error can only leave the count too high (the driver is then asked, as before), never
//! too low: a capture nobody ended (its stream destroyed) keeps it up for good.

use std::cell::Cell;
use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::real;

type Stream = *mut c_void;

/// Captures begun and not ended, process-wide.
static CAPTURES: AtomicU64 = AtomicU64::new(0);

/// One capture fewer. Never below 0: the end of a capture begun where no hook saw it (before
/// the shim was loaded) must not hide a later one.
fn one_fewer() {
    let _ = CAPTURES.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
}

/// `CU_STREAM_PER_THREAD`: the calling thread's default stream, as the driver names it.
const STREAM_PER_THREAD: usize = 2;
/// `CU_STREAM_CAPTURE_STATUS_NONE`.
const CAPTURE_STATUS_NONE: c_int = 0;
/// Results of an end that took the stream out of capture: success, and a capture that was
/// invalidated (901) or left a joined stream unjoined (904), which end it with no graph.
const ENDED: [c_int; 3] = [0, 901, 904];

thread_local! {
    /// Inside a hooked begin or end on this thread: the driver call a runtime call makes is
    /// the same capture.
    static IN_CAPTURE_CALL: Cell<bool> = const { Cell::new(false) };
}

/// Whether some stream capture may be in progress (one atomic load).
#[inline]
pub fn any_in_progress() -> bool {
    CAPTURES.load(Ordering::Relaxed) != 0
}

/// The handle to ask the driver about for `stream` passed to an entry point (`per_thread`:
/// a `_ptsz` variant, where 0 is the thread's default stream); `None` for the legacy default
/// stream, which is never captured (and asking about it while another stream captures is
/// itself a prohibited call).
#[inline]
pub fn queryable(stream: Stream, per_thread: bool) -> Option<Stream> {
    match stream as usize {
        0 if per_thread => Some(STREAM_PER_THREAD as Stream),
        0 | 1 => None,
        _ => Some(stream),
    }
}

/// A driver entry point looked up once in the application's libcuda (null = not there).
pub fn driver_entry(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let found = slot.load(Ordering::Acquire);
    if !found.is_null() {
        return found;
    }
    let Some(handle) = real::libcuda() else {
        return std::ptr::null_mut();
    };
    let found = real::real_dlsym(handle, name);
    slot.store(found, Ordering::Release);
    found
}

/// The capture status of `stream` (a [`queryable`] handle) from the real driver's
/// `cuStreamIsCapturing` (not the runtime's: a driver query takes no runtime lock and is not
/// hooked). `None` when it cannot be asked. 1 = active, 2 = invalidated (still capturing).
pub fn status(stream: Stream) -> Option<c_int> {
    static IS_CAPTURING: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let real = driver_entry(&IS_CAPTURING, c"cuStreamIsCapturing");
    if real.is_null() {
        return None;
    }
    let real: unsafe extern "C" fn(Stream, *mut c_int) -> c_int =
        unsafe { std::mem::transmute::<*mut c_void, _>(real) };
    let mut status: c_int = CAPTURE_STATUS_NONE;
    (unsafe { real(stream, &mut status) } == 0).then_some(status)
}

/// Marks this thread as inside a begin or end; false if it already was (a nested call).
fn enter() -> bool {
    IN_CAPTURE_CALL
        .try_with(|inside| !inside.replace(true))
        .unwrap_or(true)
}

fn leave() {
    let _ = IN_CAPTURE_CALL.try_with(|inside| inside.set(false));
}

fn debug(what: &str, result: c_int) {
    crate::debug(format_args!(
        "{what} (result {result}): stream captures in progress {}",
        CAPTURES.load(Ordering::SeqCst)
    ));
}

/// A hooked begin of a capture, around the real call.
pub struct Begin {
    counted: bool,
}

impl Begin {
    /// Before the real call: the capture counts from now.
    pub fn before(_stream: Stream) -> Begin {
        let counted = enter();
        if counted {
            CAPTURES.fetch_add(1, Ordering::SeqCst);
        }
        Begin { counted }
    }

    /// After the real call: a failed begin began nothing.
    pub fn after(self, result: c_int) {
        if !self.counted {
            return;
        }
        if result != 0 {
            one_fewer();
        }
        leave();
        crate::guard((), || debug("capture begin", result));
    }
}

/// A hooked end of a capture, around the real call.
pub struct End {
    /// The stream was capturing before the call (and this is the outermost hook).
    capturing: Option<Stream>,
    outermost: bool,
}

impl End {
    /// Before the real call: whether the stream is capturing now.
    pub fn before(stream: Stream, per_thread: bool) -> End {
        let outermost = enter();
        let capturing = if outermost {
            queryable(stream, per_thread)
                .filter(|&handle| status(handle).is_some_and(|s| s != CAPTURE_STATUS_NONE))
        } else {
            None
        };
        End {
            capturing,
            outermost,
        }
    }

    /// After the real call: the capture ended if this call took the stream out of capture.
    pub fn after(self, result: c_int) {
        if !self.outermost {
            return;
        }
        if let Some(handle) = self.capturing
            && ENDED.contains(&result)
            && status(handle) == Some(CAPTURE_STATUS_NONE)
        {
            one_fewer();
        }
        leave();
        crate::guard((), || debug("capture end", result));
    }
}
