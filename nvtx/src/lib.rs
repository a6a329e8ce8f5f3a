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
//! Domain calls (NVTX's `CORE2` module: `nvtxDomainCreateA/W`, `nvtxDomainMarkEx`,
//! `nvtxDomainRangePushEx/Pop`, `nvtxDomainRangeStartEx/End`, and the C++ `nvtx3::` API) are
//! the same marks with the domain's name before the message (`nvtx push: DOMAIN: NAME`); the
//! default domain (a null handle) has no prefix, as the core calls. Ranges nest per thread
//! and per domain. Strings registered with `nvtxDomainRegisterStringA/W` are shown as their
//! text. Without the recorder in the process, initialisation fails (returns 0), and NVTX
//! turns every call into a no-op, as with no tool at all. A fork child keeps the parent's
//! domains, strings and started ranges: the tables' locks are held across `fork` (see
//! [`before_fork`]), so the child never inherits one held by a thread it does not have.
//!
//! A separate library rather than the recorder itself: NVTX `dlopen`s the path it is given,
//! and loading the recorder into a process that did not preload it would run its set-up
//! (signal handlers) where nobody asked for it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once, OnceLock, TryLockError};

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
/// `NVTX_CB_MODULE_CORE2`: the domain calls.
const MODULE_CORE2: c_int = 5;
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
        MESSAGE_REGISTERED => lock_names()
            .and_then(|names| names.strings.get(&(attributes.message as usize)).cloned())
            .unwrap_or_else(|| "(registered string)".to_string()),
        _ => String::new(),
    }
}

/// Domain handles and registered-string handles handed out, by handle: small integers
/// (never dereferenced, by NVTX or by anyone), one per distinct name.
#[derive(Default)]
struct Names {
    domains: HashMap<usize, String>,
    strings: HashMap<usize, String>,
    next: usize,
}

impl Names {
    /// The handle of `text` in `table` (the same one for the same text).
    fn handle(&mut self, strings: bool, text: String) -> usize {
        let table = if strings {
            &self.strings
        } else {
            &self.domains
        };
        if let Some((&handle, _)) = table.iter().find(|(_, known)| **known == text) {
            return handle;
        }
        self.next += 1;
        let handle = self.next;
        if strings {
            self.strings.insert(handle, text);
        } else {
            self.domains.insert(handle, text);
        }
        handle
    }
}

fn names() -> &'static Mutex<Names> {
    static NAMES: OnceLock<Mutex<Names>> = OnceLock::new();
    NAMES.get_or_init(|| Mutex::new(Names::default()))
}

/// The handles, if their lock comes free within about 10 ms (see [`lock_started`]).
fn lock_names() -> Option<MutexGuard<'static, Names>> {
    lock_within(names())
}

/// `lock`, if it comes free within about 10 ms (1000 tries): never waits for good, as a
/// thread that holds it may not exist (see [`hold_tables_across_fork`]).
fn lock_within<T>(lock: &'static Mutex<T>) -> Option<MutexGuard<'static, T>> {
    for _ in 0..1000 {
        match lock.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_micros(10));
            }
        }
    }
    None
}

/// `DOMAIN: ` for a domain handle; nothing for the default domain (null).
fn domain_prefix(domain: *const c_void) -> String {
    if domain.is_null() {
        return String::new();
    }
    let name = lock_names()
        .and_then(|names| names.domains.get(&(domain as usize)).cloned())
        .unwrap_or_else(|| format!("(domain {})", domain as usize));
    format!("{name}: ")
}

thread_local! {
    /// This thread's open push ranges, innermost last: (domain handle, 0 for the default
    /// domain; the name as marked, prefix included).
    static PUSHED: RefCell<Vec<(usize, String)>> = const { RefCell::new(Vec::new()) };
}

/// `nvtxRangeStart` ranges not yet ended, by id.
fn started() -> &'static Mutex<HashMap<RangeId, String>> {
    static STARTED: OnceLock<Mutex<HashMap<RangeId, String>>> = OnceLock::new();
    STARTED.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The open `nvtxRangeStart` ranges, if their lock comes free within about 10 ms.
fn lock_started() -> Option<MutexGuard<'static, HashMap<RangeId, String>>> {
    lock_within(started())
}

thread_local! {
    /// The tables' locks the forking thread took in the prepare handler, released by the
    /// parent and the child handlers (both run on that thread, the child's on its copy).
    static HELD_AT_FORK: RefCell<HeldAtFork> = const { RefCell::new((None, None)) };
}

type HeldAtFork = (
    Option<MutexGuard<'static, Names>>,
    Option<MutexGuard<'static, HashMap<RangeId, String>>>,
);

/// `fork` prepare handler: takes both tables' locks, so that no thread is changing a table
/// when the process is copied. Without it a fork child inherits a lock held by a thread that
/// does not exist there: its domains, registered strings and started ranges were lost (the
/// child gave up on the lock after 10 ms and marked `nvtx end: (range N)`). Each lock is
/// waited for about 10 ms at most (the forking thread itself may hold it, when a signal
/// handler forks inside an NVTX call); one not taken leaves the child as before.
extern "C" fn before_fork() {
    guarded((), || {
        let _ = HELD_AT_FORK.try_with(|held| {
            let Ok(mut held) = held.try_borrow_mut() else {
                return;
            };
            // Always in this order; no handler holds both at once.
            held.0 = lock_within(names());
            held.1 = lock_within(started());
        });
    });
}

/// `fork` parent and child handler: releases what [`before_fork`] took (in the child, the
/// copies of those locks, held by this very thread there).
extern "C" fn after_fork() {
    guarded((), || {
        let _ = HELD_AT_FORK.try_with(|held| {
            if let Ok(mut held) = held.try_borrow_mut() {
                *held = (None, None);
            }
        });
    });
}

/// Registers [`before_fork`] and [`after_fork`] once.
fn hold_tables_across_fork() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: handlers of the right signature, which live as long as the library (glibc
        // unregisters them if it is unloaded).
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
    });
}

/// Runs a handler; a panic (a bug here) must not unwind into NVTX's C caller.
fn guarded<T>(fallback: T, handler: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(handler)).unwrap_or(fallback)
}

/// Opens a push range of `domain` (0: the default one); returns its 0-based level among the
/// domain's open ranges on this thread.
fn push(domain: usize, name: String) -> c_int {
    let level = PUSHED
        .try_with(|pushed| {
            let mut pushed = pushed.borrow_mut();
            let level = pushed.iter().filter(|(d, _)| *d == domain).count();
            pushed.push((domain, name.clone()));
            level
        })
        .unwrap_or(0);
    mark(format!("nvtx push: {name}"));
    c_int::try_from(level).unwrap_or(c_int::MAX)
}

/// Closes this thread's innermost push range of `domain`; returns its 0-based level, or -1
/// when none is open (NVTX's error value), as NVTX specifies.
fn pop(domain: usize, prefix: &str) -> c_int {
    let popped = PUSHED
        .try_with(|pushed| {
            let mut pushed = pushed.borrow_mut();
            let at = pushed.iter().rposition(|(d, _)| *d == domain)?;
            let (_, name) = pushed.remove(at);
            let level = pushed.iter().filter(|(d, _)| *d == domain).count();
            Some((name, level))
        })
        .ok()
        .flatten();
    match popped {
        Some((name, level)) => {
            mark(format!("nvtx pop: {name}"));
            c_int::try_from(level).unwrap_or(c_int::MAX)
        }
        None => {
            mark(format!("nvtx pop: {prefix}(no open range)"));
            -1
        }
    }
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
    guarded(-1, || push(0, unsafe { narrow(text) }))
}

unsafe extern "C" fn range_push_w(text: *const libc::wchar_t) -> c_int {
    guarded(-1, || push(0, unsafe { wide(text) }))
}

unsafe extern "C" fn range_push_ex(attributes: *const EventAttributes) -> c_int {
    guarded(-1, || push(0, unsafe { message(attributes) }))
}

/// Closes this thread's innermost pushed range of the default domain.
unsafe extern "C" fn range_pop() -> c_int {
    guarded(-1, || pop(0, ""))
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

unsafe extern "C" fn domain_create_a(name: *const c_char) -> *const c_void {
    guarded(std::ptr::null(), || {
        let name = unsafe { narrow(name) };
        lock_names().map_or(std::ptr::null(), |mut names| {
            names.handle(false, name) as *const c_void
        })
    })
}

unsafe extern "C" fn domain_create_w(name: *const libc::wchar_t) -> *const c_void {
    guarded(std::ptr::null(), || {
        let name = unsafe { wide(name) };
        lock_names().map_or(std::ptr::null(), |mut names| {
            names.handle(false, name) as *const c_void
        })
    })
}

/// Keeps the name: a range of the domain still open may end after it.
unsafe extern "C" fn domain_destroy(_domain: *const c_void) {}

unsafe extern "C" fn domain_register_string_a(
    _domain: *const c_void,
    text: *const c_char,
) -> *const c_void {
    guarded(std::ptr::null(), || {
        let text = unsafe { narrow(text) };
        lock_names().map_or(std::ptr::null(), |mut names| {
            names.handle(true, text) as *const c_void
        })
    })
}

unsafe extern "C" fn domain_register_string_w(
    _domain: *const c_void,
    text: *const libc::wchar_t,
) -> *const c_void {
    guarded(std::ptr::null(), || {
        let text = unsafe { wide(text) };
        lock_names().map_or(std::ptr::null(), |mut names| {
            names.handle(true, text) as *const c_void
        })
    })
}

unsafe extern "C" fn domain_mark_ex(domain: *const c_void, attributes: *const EventAttributes) {
    guarded((), || {
        mark(format!("nvtx mark: {}{}", domain_prefix(domain), unsafe {
            message(attributes)
        }))
    });
}

unsafe extern "C" fn domain_range_start_ex(
    domain: *const c_void,
    attributes: *const EventAttributes,
) -> RangeId {
    guarded(0, || {
        start(format!("{}{}", domain_prefix(domain), unsafe {
            message(attributes)
        }))
    })
}

/// Range ids are unique over every domain: the id alone finds the range.
unsafe extern "C" fn domain_range_end(_domain: *const c_void, id: RangeId) {
    unsafe { range_end(id) }
}

unsafe extern "C" fn domain_range_push_ex(
    domain: *const c_void,
    attributes: *const EventAttributes,
) -> c_int {
    guarded(-1, || {
        push(
            domain as usize,
            format!("{}{}", domain_prefix(domain), unsafe {
                message(attributes)
            }),
        )
    })
}

unsafe extern "C" fn domain_range_pop(domain: *const c_void) -> c_int {
    guarded(-1, || pop(domain as usize, &domain_prefix(domain)))
}

/// Fills the slots `handlers` names in NVTX's table of `module`; whether NVTX gave the table.
///
/// # Safety
/// `get_module` is NVTX's; each handler has the signature of its slot.
unsafe fn install(
    get_module: GetModuleFunctionTable,
    module: c_int,
    handlers: &[(u32, unsafe extern "C" fn())],
) -> bool {
    let mut slots: *mut *mut Slot = std::ptr::null_mut();
    let mut last: u32 = 0;
    if unsafe { get_module(module, &mut slots, &mut last) } == 0 || slots.is_null() {
        return false;
    }
    for &(id, handler) in handlers {
        if id > last {
            continue;
        }
        // The table's entries point at NVTX's own function-pointer slots (entry 0 none).
        let slot = unsafe { *slots.add(id as usize) };
        if !slot.is_null() {
            unsafe { *slot = Some(handler) };
        }
    }
    true
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
        hold_tables_across_fork();
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
        if !unsafe { install(get_module, MODULE_CORE, &handlers) } {
            return 0;
        }
        type Handle = *const c_void;
        type Attributes = *const EventAttributes;
        type Generic = unsafe extern "C" fn();
        // SAFETY (each cast): as above, for `NvtxCallbackIdCore2`.
        let domain_handlers: [(u32, unsafe extern "C" fn()); 10] = unsafe {
            use std::mem::transmute as cast;
            [
                (
                    1,
                    cast::<unsafe extern "C" fn(Handle, Attributes), Generic>(domain_mark_ex),
                ),
                (
                    2,
                    cast::<unsafe extern "C" fn(Handle, Attributes) -> RangeId, Generic>(
                        domain_range_start_ex,
                    ),
                ),
                (
                    3,
                    cast::<unsafe extern "C" fn(Handle, RangeId), Generic>(domain_range_end),
                ),
                (
                    4,
                    cast::<unsafe extern "C" fn(Handle, Attributes) -> c_int, Generic>(
                        domain_range_push_ex,
                    ),
                ),
                (
                    5,
                    cast::<unsafe extern "C" fn(Handle) -> c_int, Generic>(domain_range_pop),
                ),
                (
                    10,
                    cast::<unsafe extern "C" fn(Handle, *const c_char) -> Handle, Generic>(
                        domain_register_string_a,
                    ),
                ),
                (
                    11,
                    cast::<unsafe extern "C" fn(Handle, *const libc::wchar_t) -> Handle, Generic>(
                        domain_register_string_w,
                    ),
                ),
                (
                    12,
                    cast::<unsafe extern "C" fn(*const c_char) -> Handle, Generic>(domain_create_a),
                ),
                (
                    13,
                    cast::<unsafe extern "C" fn(*const libc::wchar_t) -> Handle, Generic>(
                        domain_create_w,
                    ),
                ),
                (
                    14,
                    cast::<unsafe extern "C" fn(Handle), Generic>(domain_destroy),
                ),
            ]
        };
        // Without the domain module the core calls are still recorded.
        unsafe { install(get_module, MODULE_CORE2, &domain_handlers) };
        1
    })
}
