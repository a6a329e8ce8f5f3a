//! `libvramshim_nvtx.so`: an NVTX injection library. NVTX (the `nvtx3` headers compiled into
//! PyTorch and CUDA libraries, or `libnvToolsExt.so.1`) loads the library named by
//! `NVTX_INJECTION64_PATH` at a process's first NVTX call and calls its
//! `InitializeInjectionNvtx2` with a function that hands out NVTX's export tables; the
//! library then fills NVTX's function-pointer slots with its own handlers. `vramshim run` and
//! `dryrun` set the variable to this library (unless the user set it).
//!
//! The handlers turn NVTX's core calls into vramshim marks, through `vramshim_mark`, which
//! the preloaded recorder exports: `nvtxRangePush*` → `nvtx push: NAME`, `nvtxRangePop` →
//! `nvtx pop: NAME` (the name of the range it closes, kept per thread), `nvtxMark*` → `nvtx
//! mark: NAME`, `nvtxRangeStart*` / `nvtxRangeEnd` → `nvtx start: NAME` / `nvtx end: NAME`.
//! Domain calls (NVTX's `CORE2` module: the C++ `nvtx3::` API, CCCL's internal ranges) are
//! not taken. Without the recorder in the process, initialisation fails (returns 0), and NVTX
//! turns every call into a no-op, as with no tool at all.
//!
//! A separate library rather than the recorder itself: NVTX `dlopen`s the path it is given,
//! and loading the recorder into a process that did not preload it would run its set-up
//! (signal handlers) where nobody asked for it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// `nvtxRangeId_t`.
type RangeId = u64;
/// NVTX's generic function pointer (`NvtxFunctionPointer`): a slot holds one.
type Slot = Option<unsafe extern "C" fn()>;
type GetExportTable = unsafe extern "C" fn(u32) -> *const c_void;
type GetModuleFunctionTable = unsafe extern "C" fn(
    module: c_int,
    out_table: *mut *mut *mut Slot,
    out_size: *mut u32,
) -> c_int;
type MarkFn = unsafe extern "C" fn(*const c_char) -> c_int;

/// `NVTX_ETID_CALLBACKS`.
const EXPORT_TABLE_CALLBACKS: u32 = 1;
/// `NVTX_CB_MODULE_CORE`.
const MODULE_CORE: c_int = 1;
/// `nvtxMessageType_t` values of an event's message.
const MESSAGE_ASCII: i32 = 1;
const MESSAGE_UNICODE: i32 = 2;
const MESSAGE_REGISTERED: i32 = 3;

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}

/// `nvtxEventAttributes_v2` (48 bytes): only its size and message are read.
#[repr(C)]
struct EventAttributes {
    _version: u16,
    size: u16,
    /// category, colorType, color, payloadType, reserved0.
    _fields: [u32; 5],
    _payload: u64,
    message_type: i32,
    message: *const c_void,
}

/// The recorder's `vramshim_mark`, when the recorder is in the process.
fn recorder() -> Option<MarkFn> {
    static MARK: OnceLock<Option<usize>> = OnceLock::new();
    let address = *MARK.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the global scope.
        let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"vramshim_mark".as_ptr()) };
        (!found.is_null()).then_some(found as usize)
    });
    // SAFETY: the address is the recorder's `vramshim_mark`, of this signature.
    address.map(|a| unsafe { std::mem::transmute::<usize, MarkFn>(a) })
}

/// Writes `text` as a mark (interior NULs, impossible from C strings, would cut it).
fn mark(text: String) {
    let Some(function) = recorder() else { return };
    let text = CString::new(text).unwrap_or_else(|err| {
        let end = err.nul_position();
        let mut bytes = err.into_vec();
        bytes.truncate(end);
        CString::new(bytes).unwrap_or_default()
    });
    // SAFETY: a NUL-terminated string; the recorder copies it.
    unsafe { function(text.as_ptr()) };
}

/// A NUL-terminated narrow string, lossily as UTF-8.
///
/// # Safety
/// `text` is null or NUL-terminated.
unsafe fn narrow(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// A NUL-terminated `wchar_t` string (UTF-32 on Linux); invalid code points become U+FFFD.
///
/// # Safety
/// `text` is null or NUL-terminated.
unsafe fn wide(text: *const libc::wchar_t) -> String {
    let mut out = String::new();
    if text.is_null() {
        return out;
    }
    let mut at = text;
    // Bounded like the recorder's marks (4 KiB), so a missing terminator cannot run far.
    while out.len() < 4096 {
        let unit = unsafe { *at };
        if unit == 0 {
            break;
        }
        out.push(char::from_u32(unit as u32).unwrap_or(char::REPLACEMENT_CHARACTER));
        at = unsafe { at.add(1) };
    }
    out
}

/// The message of an event's attributes.
///
/// # Safety
/// `attributes` is null or points to NVTX event attributes.
unsafe fn message(attributes: *const EventAttributes) -> String {
    if attributes.is_null() {
        return String::new();
    }
    let attributes = unsafe { &*attributes };
    if usize::from(attributes.size) < std::mem::size_of::<EventAttributes>() {
        return String::new();
    }
    match attributes.message_type {
        MESSAGE_ASCII => unsafe { narrow(attributes.message.cast()) },
        MESSAGE_UNICODE => unsafe { wide(attributes.message.cast()) },
        MESSAGE_REGISTERED => "(registered string)".to_string(),
        _ => String::new(),
    }
}

thread_local! {
    /// The names of this thread's open `nvtxRangePush` ranges, innermost last.
    static PUSHED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// `nvtxRangeStart` ranges not yet ended, by id.
fn started() -> &'static Mutex<HashMap<RangeId, String>> {
    static STARTED: OnceLock<Mutex<HashMap<RangeId, String>>> = OnceLock::new();
    STARTED.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The open `nvtxRangeStart` ranges, if their lock comes free within about 10 ms: a fork
/// child inherits the lock as it was, possibly held by a thread that does not exist there,
/// and must not wait for it forever.
fn lock_started() -> Option<std::sync::MutexGuard<'static, HashMap<RangeId, String>>> {
    for _ in 0..1000 {
        match started().try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_micros(10));
            }
        }
    }
    None
}

/// Runs a handler; a panic (a bug here) must not unwind into NVTX's C caller.
fn guarded<T>(fallback: T, handler: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(handler)).unwrap_or(fallback)
}

fn push(name: String) -> c_int {
    let level = PUSHED
        .try_with(|pushed| {
            let mut pushed = pushed.borrow_mut();
            pushed.push(name.clone());
            pushed.len() - 1
        })
        .unwrap_or(0);
    mark(format!("nvtx push: {name}"));
    c_int::try_from(level).unwrap_or(c_int::MAX)
}

fn start(name: String) -> RangeId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    mark(format!("nvtx start: {name}"));
    if let Some(mut open) = lock_started() {
        open.insert(id, name);
    }
    id
}

unsafe extern "C" fn mark_a(text: *const c_char) {
    guarded((), || {
        mark(format!("nvtx mark: {}", unsafe { narrow(text) }))
    });
}

unsafe extern "C" fn mark_w(text: *const libc::wchar_t) {
    guarded((), || mark(format!("nvtx mark: {}", unsafe { wide(text) })));
}

unsafe extern "C" fn mark_ex(attributes: *const EventAttributes) {
    guarded((), || {
        mark(format!("nvtx mark: {}", unsafe { message(attributes) }))
    });
}

unsafe extern "C" fn range_push_a(text: *const c_char) -> c_int {
    guarded(-1, || push(unsafe { narrow(text) }))
}

unsafe extern "C" fn range_push_w(text: *const libc::wchar_t) -> c_int {
    guarded(-1, || push(unsafe { wide(text) }))
}

unsafe extern "C" fn range_push_ex(attributes: *const EventAttributes) -> c_int {
    guarded(-1, || push(unsafe { message(attributes) }))
}

/// Closes this thread's innermost pushed range; returns its 0-based level, or -1 when none is
/// open (NVTX's error value), as NVTX specifies.
unsafe extern "C" fn range_pop() -> c_int {
    guarded(-1, || {
        let popped = PUSHED
            .try_with(|pushed| {
                let mut pushed = pushed.borrow_mut();
                pushed.pop().map(|name| (name, pushed.len()))
            })
            .ok()
            .flatten();
        match popped {
            Some((name, level)) => {
                mark(format!("nvtx pop: {name}"));
                c_int::try_from(level).unwrap_or(c_int::MAX)
            }
            None => {
                mark("nvtx pop: (no open range)".to_string());
                -1
            }
        }
    })
}

unsafe extern "C" fn range_start_a(text: *const c_char) -> RangeId {
    guarded(0, || start(unsafe { narrow(text) }))
}

unsafe extern "C" fn range_start_w(text: *const libc::wchar_t) -> RangeId {
    guarded(0, || start(unsafe { wide(text) }))
}

unsafe extern "C" fn range_start_ex(attributes: *const EventAttributes) -> RangeId {
    guarded(0, || start(unsafe { message(attributes) }))
}

unsafe extern "C" fn range_end(id: RangeId) {
    guarded((), || {
        let name = lock_started()
            .and_then(|mut open| open.remove(&id))
            .unwrap_or_else(|| format!("(range {id})"));
        mark(format!("nvtx end: {name}"));
    });
}

/// NVTX's entry point into an injection library: takes NVTX's core functions. Returns 1 when
/// attached, 0 (NVTX then makes every call a no-op) when the recorder is not in the process
/// or NVTX's tables are not as expected.
///
/// # Safety
/// Called by NVTX with its `nvtxGetExportTable`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn InitializeInjectionNvtx2(
    get_export_table: Option<GetExportTable>,
) -> c_int {
    guarded(0, || {
        let Some(get_export_table) = get_export_table else {
            return 0;
        };
        if recorder().is_none() {
            return 0;
        }
        let table =
            unsafe { get_export_table(EXPORT_TABLE_CALLBACKS) }.cast::<ExportTableCallbacks>();
        if table.is_null() {
            return 0;
        }
        let table = unsafe { &*table };
        let Some(get_module) = table.get_module_function_table else {
            return 0;
        };
        if table.struct_size < std::mem::size_of::<ExportTableCallbacks>() {
            return 0;
        }
        let mut slots: *mut *mut Slot = std::ptr::null_mut();
        let mut last: u32 = 0;
        if unsafe { get_module(MODULE_CORE, &mut slots, &mut last) } == 0 || slots.is_null() {
            return 0;
        }
        // SAFETY (each cast): the handler has the signature NVTX's slot of that id expects
        // (`NvtxCallbackIdCore`, nvtxDetail/nvtxTypes.h).
        let handlers: [(u32, unsafe extern "C" fn()); 11] = unsafe {
            use std::mem::transmute as cast;
            [
                (
                    1,
                    cast::<unsafe extern "C" fn(*const EventAttributes), unsafe extern "C" fn()>(
                        mark_ex,
                    ),
                ),
                (
                    2,
                    cast::<unsafe extern "C" fn(*const c_char), unsafe extern "C" fn()>(mark_a),
                ),
                (
                    3,
                    cast::<unsafe extern "C" fn(*const libc::wchar_t), unsafe extern "C" fn()>(
                        mark_w,
                    ),
                ),
                (
                    4,
                    cast::<
                        unsafe extern "C" fn(*const EventAttributes) -> RangeId,
                        unsafe extern "C" fn(),
                    >(range_start_ex),
                ),
                (
                    5,
                    cast::<unsafe extern "C" fn(*const c_char) -> RangeId, unsafe extern "C" fn()>(
                        range_start_a,
                    ),
                ),
                (
                    6,
                    cast::<
                        unsafe extern "C" fn(*const libc::wchar_t) -> RangeId,
                        unsafe extern "C" fn(),
                    >(range_start_w),
                ),
                (
                    7,
                    cast::<unsafe extern "C" fn(RangeId), unsafe extern "C" fn()>(range_end),
                ),
                (
                    8,
                    cast::<
                        unsafe extern "C" fn(*const EventAttributes) -> c_int,
                        unsafe extern "C" fn(),
                    >(range_push_ex),
                ),
                (
                    9,
                    cast::<unsafe extern "C" fn(*const c_char) -> c_int, unsafe extern "C" fn()>(
                        range_push_a,
                    ),
                ),
                (
                    10,
                    cast::<
                        unsafe extern "C" fn(*const libc::wchar_t) -> c_int,
                        unsafe extern "C" fn(),
                    >(range_push_w),
                ),
                (
                    11,
                    cast::<unsafe extern "C" fn() -> c_int, unsafe extern "C" fn()>(range_pop),
                ),
            ]
        };
        for (id, handler) in handlers {
            if id > last {
                continue;
            }
            // The table's entries point at NVTX's own function-pointer slots (entry 0 none).
            let slot = unsafe { *slots.add(id as usize) };
            if !slot.is_null() {
                unsafe { *slot = Some(handler) };
            }
        }
        1
    })
}
