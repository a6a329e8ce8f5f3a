//! Tensors inside PyTorch's default (native) caching allocator, with no change to the program.
//!
//! The driver sees only the allocator's segments. PyTorch reports every block action to the
//! trackers attached with `NativeCachingAllocator::attachAllocatorTraceTracker` (a local
//! symbol of `libc10_cuda.so`, read from the file's `.symtab`); this module attaches one, a
//! libstdc++ `std::function<void(const TraceEntry&)>` built by hand, whose invoker records
//! each block as an event through [`capture::record_reported`].
//!
//! When: at a `cudaMalloc` (or a `cuMemMap`: with `expandable_segments:True` segments are
//! mapped pages) once `libc10_cuda.so` is loaded, its allocator is the native one (vtable
//! check) and initialised (`initialized()`, which takes no lock). Attaching takes each
//! device allocator's recursive mutex in turn, possibly while this thread holds one of them
//! (it is inside that allocator's segment `cudaMalloc` or `cuMemMap`): that one is recursive; for the others,
//! PyTorch never holds two device mutexes at once and never waits for the GIL while holding
//! one (it unlocks before calling its OOM observers), so every holder leaves without waiting
//! for this thread. Only one thread attaches; the others pass by without waiting. While it
//! waits, this thread tells the writer its own next events are newer than now, so a thread
//! holding a device mutex never waits on this one to make room in its buffer (unless it fills
//! the whole buffer with new events during that one allocation).
//!
//! Trust: `TraceEntry`'s layout is not an ABI. Until the first `segment_alloc` entry matches
//! the `cudaMalloc` this thread has just recorded (address, size, device), or the first
//! `segment_map` the range its `cuMemMap` calls have just mapped back to back, every entry is
//! ignored; on a mismatch the tracker stays attached but inert, with one note and one warning.
//! Any failure to find or check the allocator leaves tensors unrecorded, with one note and one
//! warning, never a crash.
//!
//! PyTorch 2.1's allocator has no `attachAllocatorTraceTracker`: found so here (the symbol
//! missing, the rest in place), the blocks are taken from its profiler report instead
//! (`torch_report`, which this module's state switches on).

use std::cell::Cell;
use std::ffi::{CStr, c_int, c_void};
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU64, AtomicUsize, Ordering};

use vramshim_format::{EventKind, Note, Record};

use crate::capture::{self, Spec};
use crate::real::{self, Layer};
use crate::unwind::{CallerState, WalkFrom};
use crate::{process, writer};

/// The API name of the events this module records (in the header, after the hook table's).
pub const API_NAME: &str = "torch.CUDACachingAllocator";

/// Not attached yet; looking at `cudaMalloc` calls.
const SEARCHING: u8 = 0;
/// Attached; waiting for a `segment_alloc` entry to check the layout against.
const UNVERIFIED: u8 = 1;
/// Layout checked: entries become events.
const RECORDING: u8 = 2;
/// Stepped aside for good (the reason is in the log's notes).
const OFF: u8 = 3;
/// No tracker in this PyTorch (2.1): its blocks come from `c10::reportMemoryUsageToProfiler`
/// ([`torch_report`](crate::torch_report)).
const REPORTING: u8 = 4;

/// The `api` index of [`API_NAME`].
static TENSOR_API: AtomicU16 = AtomicU16::new(0);
static STATE: AtomicU8 = AtomicU8::new(SEARCHING);
/// One thread at a time looks for the allocator; the others pass by.
static SEARCHING_NOW: AtomicBool = AtomicBool::new(false);
/// When `libc10_cuda.so` was last looked for (it may be loaded later than the first call).
static LAST_LOOK_NS: AtomicU64 = AtomicU64::new(0);
/// While PyTorch is not loaded, look again at most this often: a program without PyTorch pays
/// one `dlopen(RTLD_NOLOAD)` per interval, not per call.
const LOOK_INTERVAL_NS: u64 = 50_000_000;
static SYMBOLS: OnceLock<Symbols> = OnceLock::new();
/// Trackers attached so far; each carries its number in the function's storage.
static GENERATION: AtomicUsize = AtomicUsize::new(0);
/// At most this many attaches (each adds a tracker to every device allocator then existing).
const MAX_ATTACHES: usize = 16;
const MAX_DEVICES: usize = 64;
/// Per device: the tracker generation whose entries are recorded (0 = none yet).
static OWNER: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];

const ALLOCATOR_SYMBOL: &CStr = c"_ZN3c104cuda20CUDACachingAllocator9allocatorE";
const NATIVE: &str = "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator";
/// `attachAllocatorTraceTracker(std::function<void(const ...TraceEntry&)>)`: TraceEntry's
/// namespace changed across releases, so only this much of the name is fixed.
const ATTACH_PREFIX: &str = "27attachAllocatorTraceTrackerESt8functionIFvRK";
const INITIALIZED_SUFFIX: &str = "11initializedEv";
const VTABLE_SYMBOL: &str = "_ZTVN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocatorE";

// TraceEntry::Action values (the same from PyTorch 2.1 to 2.15).
const ACTION_ALLOC: i32 = 0;
const ACTION_FREE_REQUESTED: i32 = 1;
const ACTION_FREE_COMPLETED: i32 = 2;
const ACTION_SEGMENT_ALLOC: i32 = 3;
const ACTION_SEGMENT_MAP: i32 = 5;
const ACTION_SEGMENT_UNMAP: i32 = 6;
const ACTION_OOM: i32 = 8;

type InitializedFn = unsafe extern "C" fn(*mut c_void) -> bool;
type AttachFn = unsafe extern "C" fn(*mut c_void, *mut StdFunction);

/// Addresses in the running `libc10_cuda.so`.
struct Symbols {
    /// `std::atomic<CUDAAllocator*> allocator`.
    allocator: *const *mut c_void,
    /// Where a `NativeCachingAllocator`'s vtable pointer points.
    native_vptr: usize,
    initialized: InitializedFn,
    /// `None` in releases without the tracker (2.1).
    attach: Option<AttachFn>,
}

// Plain addresses in a loaded library, never written through.
unsafe impl Send for Symbols {}
unsafe impl Sync for Symbols {}

thread_local! {
    /// The last successful `cudaMalloc` of this thread (address, size), for the layout check.
    static LAST_MALLOC: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    /// The range this thread's last successful `cuMemMap` calls mapped back to back (start,
    /// end): expandable segments map one range page by page, then report it whole.
    static LAST_MAP: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Called by the `cudaMalloc` hook after the real call (inside the hook: nothing it does is
/// recorded). `api` is the index of [`API_NAME`] in the header's API names.
pub fn after_cuda_malloc(api: u16, result: c_int, addr: u64, size: u64) {
    if result == 0 {
        let _ = LAST_MALLOC.try_with(|last| last.set((addr, size)));
    }
    after_segment_call(api, result);
}

/// A call that may have made one of PyTorch's segments: look for the allocator, or attach to
/// a device's allocator created since.
fn after_segment_call(api: u16, result: c_int) {
    match STATE.load(Ordering::Relaxed) {
        SEARCHING => {
            TENSOR_API.store(api, Ordering::Relaxed);
            search();
        }
        RECORDING if result == 0 && GENERATION.load(Ordering::Relaxed) < MAX_ATTACHES => {
            reattach_for_new_device();
        }
        _ => {}
    }
}

/// Called by the `cuMemMap` hook after the real call, as [`after_cuda_malloc`]: with
/// `expandable_segments:True` PyTorch's segments are mapped ranges, never `cudaMalloc`s.
pub fn after_mem_map(api: u16, result: c_int, addr: u64, size: u64) {
    if result == 0 {
        let _ = LAST_MAP.try_with(|last| {
            let (start, end) = last.get();
            if end == addr && start != 0 {
                last.set((start, addr.wrapping_add(size)));
            } else {
                last.set((addr, addr.wrapping_add(size)));
            }
        });
    }
    after_segment_call(api, result);
}

#[cold]
#[inline(never)]
fn search() {
    if SEARCHING_NOW.swap(true, Ordering::Acquire) {
        return;
    }
    let outcome = try_attach();
    SEARCHING_NOW.store(false, Ordering::Release);
    if let Err(reason) = outcome {
        step_aside(&reason, true);
    }
}

/// Attaches when everything is in place; `Ok` also when it is too early (try again later).
fn try_attach() -> Result<(), String> {
    let symbols = match SYMBOLS.get() {
        Some(symbols) => symbols,
        None => {
            let now = process::now_ns();
            let last = LAST_LOOK_NS.load(Ordering::Relaxed);
            if last != 0 && now.saturating_sub(last) < LOOK_INTERVAL_NS {
                return Ok(());
            }
            LAST_LOOK_NS.store(now.max(1), Ordering::Relaxed);
            let Some(symbols) = find_symbols()? else {
                return Ok(());
            };
            SYMBOLS.get_or_init(|| symbols)
        }
    };
    let allocator = unsafe { std::ptr::read_volatile(symbols.allocator) };
    if allocator.is_null() {
        return Ok(());
    }
    let vptr = unsafe { std::ptr::read_volatile(allocator as *const usize) };
    if vptr != symbols.native_vptr {
        // backend:cudaMallocAsync: every tensor is already a cudaMallocAsync call.
        step_aside(
            "PyTorch's allocator is not the native caching allocator (cudaMallocAsync backend?): \
             its tensors are the recorded cudaMallocAsync calls",
            false,
        );
        return Ok(());
    }
    if !unsafe { (symbols.initialized)(allocator) } {
        return Ok(());
    }
    let Some(attach_fn) = symbols.attach else {
        return report_instead();
    };
    STATE.store(UNVERIFIED, Ordering::Release);
    attach(attach_fn, allocator);
    note("torch: tracker attached to PyTorch's caching allocator; checking its layout".into());
    Ok(())
}

/// PyTorch 2.1's allocator has no tracker but reports every block to its profiler: record
/// those reports, when they reach the shim.
fn report_instead() -> Result<(), String> {
    if !report_interposed() {
        let reason = "no NativeCachingAllocator::attachAllocatorTraceTracker, and \
                      c10::reportMemoryUsageToProfiler resolves elsewhere than the shim \
                      (not preloaded?)";
        return Err(reason.into());
    }
    let break_at = std::env::var("VRAMSHIM_TEST_TORCH_REPORT_BREAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    REPORT_BREAK_AT.store(break_at, Ordering::Relaxed);
    STATE.store(REPORTING, Ordering::Release);
    note(
        "torch: profiler report interposed: PyTorch's allocator has no \
         attachAllocatorTraceTracker; its blocks are taken from \
         c10::reportMemoryUsageToProfiler (block sizes, no requested sizes, no streams, frees \
         at the request), each checked against the segments recorded"
            .into(),
    );
    Ok(())
}

/// `c10::reportMemoryUsageToProfiler`, which the shim defines (`torch_report`).
pub const REPORT_SYMBOL: &CStr = c"_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE";

/// Tests: the report of this number (1 = the first) reads one byte more reserved than PyTorch
/// said, to prove the route steps aside cleanly (`VRAMSHIM_TEST_TORCH_REPORT_BREAK`; 0 =
/// never).
static REPORT_BREAK_AT: AtomicU64 = AtomicU64::new(0);

/// The test setting above (0 = never).
pub fn report_break_at() -> u64 {
    REPORT_BREAK_AT.load(Ordering::Relaxed)
}

/// Whether calls to `c10::reportMemoryUsageToProfiler` reach the shim's definition: the
/// process's first is in the shim's own file (not so when the shim was not preloaded).
fn report_interposed() -> bool {
    let first = real::real_dlsym(libc::RTLD_DEFAULT, REPORT_SYMBOL);
    let mut theirs: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut ours: libc::Dl_info = unsafe { std::mem::zeroed() };
    !first.is_null()
        && unsafe { libc::dladdr(first, &mut theirs) } != 0
        && unsafe { libc::dladdr(report_interposed as *const c_void, &mut ours) } != 0
        && theirs.dli_fbase == ours.dli_fbase
}

/// Whether blocks come from PyTorch's profiler report (see [`REPORTING`]).
#[inline]
pub fn reporting() -> bool {
    STATE.load(Ordering::Relaxed) == REPORTING
}

/// Whether this process will never take blocks from PyTorch's profiler report: the tracker
/// was attached (its states lead only to recording or to `OFF`), or the route stepped aside for
/// good. `SEARCHING` may still turn to [`REPORTING`].
pub fn never_reporting() -> bool {
    matches!(STATE.load(Ordering::Acquire), UNVERIFIED | RECORDING | OFF)
}

/// This thread's last `cudaMalloc` (address, size) and the range its last `cuMemMap` calls
/// mapped back to back (start, end), each forgotten: a report takes them as its segment at
/// most once.
pub fn take_segment_calls() -> ((u64, u64), (u64, u64)) {
    let malloc = LAST_MALLOC
        .try_with(|last| last.replace((0, 0)))
        .unwrap_or((0, 0));
    let map = LAST_MAP
        .try_with(|last| last.replace((0, 0)))
        .unwrap_or((0, 0));
    (malloc, map)
}

/// The reports stopped matching the segments: no more blocks for the rest of the process.
pub fn stop_reporting(reason: &str) {
    if STATE
        .compare_exchange(REPORTING, OFF, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    note(format!("torch: tensor blocks no longer recorded: {reason}"));
    crate::warn(&format!(
        "PyTorch tensor blocks no longer recorded ({reason}); segments still are"
    ));
}

/// Attaches one more generation of the tracker to every device allocator that exists now.
fn attach(attach_fn: AttachFn, allocator: *mut c_void) {
    let generation = GENERATION.fetch_add(1, Ordering::AcqRel) + 1;
    // Attaching may wait for other threads inside the allocator, whose events must then be
    // writable even if their buffers fill: they are older than anything this call records.
    capture::publish_progress_now();
    let mut tracker = StdFunction {
        data: [generation, 0],
        manager: Some(manage),
        invoker: Some(invoke),
    };
    // The callee copies the function into each device allocator; the argument is ours to
    // destroy afterwards (Itanium ABI), and destroying it is a no-op.
    unsafe { attach_fn(allocator, &mut tracker) };
}

/// PyTorch creates a device's allocator when the device is first used, without the trackers
/// attached before: a `cudaMalloc` on a device no tracker has reported yet attaches again.
/// Every attach reaches the older devices too, so each device's entries are taken from the
/// first generation that reported them ([`OWNER`]) and the others are ignored.
#[cold]
#[inline(never)]
fn reattach_for_new_device() {
    let device = capture::current_device(Layer::Runtime);
    let Some(owner) = usize::try_from(device).ok().and_then(|d| OWNER.get(d)) else {
        return;
    };
    if owner.load(Ordering::Acquire) != 0 || SEARCHING_NOW.swap(true, Ordering::Acquire) {
        return;
    }
    if let Some(symbols) = SYMBOLS.get()
        && let Some(attach_fn) = symbols.attach
    {
        let allocator = unsafe { std::ptr::read_volatile(symbols.allocator) };
        if !allocator.is_null() && GENERATION.load(Ordering::Acquire) < MAX_ATTACHES {
            attach(attach_fn, allocator);
        }
    }
    SEARCHING_NOW.store(false, Ordering::Release);
}

/// Looks up the allocator in `libc10_cuda.so`; `Ok(None)` when it is not loaded.
fn find_symbols() -> Result<Option<Symbols>, String> {
    let handle = unsafe {
        libc::dlopen(
            c"libc10_cuda.so".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if handle.is_null() {
        return Ok(None);
    }
    let allocator = real::real_dlsym(handle, ALLOCATOR_SYMBOL);
    unsafe { libc::dlclose(handle) };
    if allocator.is_null() {
        return Err("libc10_cuda.so exports no CUDACachingAllocator::allocator".into());
    }
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(allocator, &mut info) } == 0 || info.dli_fname.is_null() {
        return Err("cannot tell which file libc10_cuda.so was loaded from".into());
    }
    let path = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    let found = read_symbols(&path).map_err(|why| format!("{path}: {why}"))?;
    let need = |name: &str, value: Option<u64>| {
        value.ok_or_else(|| format!("{path}: no {name} in its .symtab (stripped?)"))
    };
    let allocator_value = need("allocator", found.allocator)?;
    let initialized = need("NativeCachingAllocator::initialized", found.initialized)?;
    let vtable = need("NativeCachingAllocator's vtable", found.vtable)?;
    let bias = (allocator as u64).wrapping_sub(allocator_value);
    let at = |value: u64| value.wrapping_add(bias) as usize;
    Ok(Some(Symbols {
        allocator: allocator as *const *mut c_void,
        // The object's vtable pointer skips offset-to-top and the type info.
        native_vptr: at(vtable) + 16,
        initialized: unsafe { std::mem::transmute::<usize, InitializedFn>(at(initialized)) },
        attach: found
            .attach
            .map(|attach| unsafe { std::mem::transmute::<usize, AttachFn>(at(attach)) }),
    }))
}

/// File values (`st_value`) of the symbols the tracker needs.
#[derive(Default)]
struct FoundSymbols {
    allocator: Option<u64>,
    attach: Option<u64>,
    initialized: Option<u64>,
    vtable: Option<u64>,
}

/// Reads the ELF file's `.symtab` (local symbols are not in the dynamic table).
fn read_symbols(path: &str) -> Result<FoundSymbols, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let read = |offset: u64, len: usize| -> Result<Vec<u8>, String> {
        if len > 256 << 20 {
            return Err("section too large".into());
        }
        let mut bytes = vec![0u8; len];
        file.read_exact_at(&mut bytes, offset)
            .map_err(|e| e.to_string())?;
        Ok(bytes)
    };
    let header = read(0, 64)?;
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err("not a little-endian ELF64 file".into());
    }
    let section_offset = u64_at(&header, 0x28);
    let section_size = usize::from(u16::from_le_bytes([header[0x3a], header[0x3b]]));
    let section_count = usize::from(u16::from_le_bytes([header[0x3c], header[0x3d]]));
    if section_size < 64 {
        return Err("odd section header size".into());
    }
    let sections = read(section_offset, section_size * section_count)?;
    let section = |index: usize| sections.get(index * section_size..(index + 1) * section_size);
    let mut found = FoundSymbols::default();
    let mut has_symtab = false;
    for index in 0..section_count {
        let Some(sh) = section(index) else { break };
        const SHT_SYMTAB: u32 = 2;
        if u32_at(sh, 4) != SHT_SYMTAB {
            continue;
        }
        has_symtab = true;
        let symbols = read(u64_at(sh, 24), u64_at(sh, 32) as usize)?;
        let Some(strtab) = section(u32_at(sh, 40) as usize) else {
            return Err("bad .symtab link".into());
        };
        let names = read(u64_at(strtab, 24), u64_at(strtab, 32) as usize)?;
        for symbol in symbols.chunks_exact(24) {
            let name_at = u32_at(symbol, 0) as usize;
            let Some(rest) = names.get(name_at..) else {
                continue;
            };
            let len = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            let Ok(name) = std::str::from_utf8(&rest[..len]) else {
                continue;
            };
            let value = u64_at(symbol, 8);
            if value == 0 {
                continue;
            }
            if name == VTABLE_SYMBOL {
                found.vtable = Some(value);
            } else if name.as_bytes() == ALLOCATOR_SYMBOL.to_bytes() {
                found.allocator = Some(value);
            } else if let Some(method) = name.strip_prefix(NATIVE) {
                if method.starts_with(ATTACH_PREFIX) {
                    found.attach = Some(value);
                } else if method == INITIALIZED_SUFFIX {
                    found.initialized = Some(value);
                }
            }
        }
    }
    if !has_symtab {
        return Err("no .symtab (stripped)".into());
    }
    Ok(found)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// Stops for good: one note, and one warning line when something is wrong.
fn step_aside(reason: &str, warn: bool) {
    if STATE.swap(OFF, Ordering::AcqRel) == OFF {
        return;
    }
    note(format!("torch: tensors not recorded: {reason}"));
    if warn {
        crate::warn(&format!(
            "PyTorch tensors not recorded ({reason}); segments still are"
        ));
    }
}

pub fn note(text: String) {
    writer::define(Record::Note(Note { t_ns: 0, text }));
}

/// libstdc++'s `std::function<void(const TraceEntry&)>`: the functor's storage, its manager
/// and its invoker. The tracker has no state, so the storage is unused.
#[repr(C)]
struct StdFunction {
    data: [usize; 2],
    manager: Option<unsafe extern "C" fn(*mut [usize; 2], *const [usize; 2], c_int) -> bool>,
    invoker: Option<unsafe extern "C" fn(*const [usize; 2], *const u8)>,
}

/// The function's manager: `__get_type_info` (0), `__get_functor_ptr` (1), `__clone_functor`
/// (2), `__destroy_functor` (3).
unsafe extern "C" fn manage(dest: *mut [usize; 2], source: *const [usize; 2], op: c_int) -> bool {
    match op {
        0 => {
            static VOID_TYPE_INFO: OnceLock<usize> = OnceLock::new();
            let info = *VOID_TYPE_INFO
                .get_or_init(|| real::real_dlsym(libc::RTLD_DEFAULT, c"_ZTIv") as usize);
            unsafe { (*dest)[0] = info };
        }
        1 => unsafe { (*dest)[0] = source as usize },
        2 => unsafe { *dest = *source },
        _ => {}
    }
    false
}

/// The function's invoker: one `TraceEntry`. Runs on the allocating thread, inside the
/// allocator's lock. Takes the caller's registers as they are on entry (the return address on
/// top of the stack, the stack pointer above it, `rbp` untouched) and jumps on to
/// [`invoke_from`], which returns to the caller: the event's native walk starts there, not
/// inside the shim ([`crate::unwind::CallerState`]).
#[unsafe(naked)]
unsafe extern "C" fn invoke(data: *const [usize; 2], entry: *const u8) {
    std::arch::naked_asm!(
        "mov rdx, [rsp]",
        "lea rcx, [rsp + 8]",
        "mov r8, rbp",
        "jmp {body}",
        body = sym invoke_from,
    )
}

/// [`invoke`]'s body, with its caller's registers on entry.
unsafe extern "C" fn invoke_from(
    data: *const [usize; 2],
    entry: *const u8,
    return_address: u64,
    sp: u64,
    bp: u64,
) {
    let state = STATE.load(Ordering::Acquire);
    if state == OFF || state == SEARCHING || state == REPORTING || entry.is_null() || data.is_null()
    {
        return;
    }
    let generation = unsafe { (*data)[0] };
    // Layout (PyTorch 2.4.1, 2.6 and 2.15, checked against their own history): action i32 @0, device @4 (its low byte), addr @8,
    // context (shared_ptr) @16, stream @32, size @40.
    let field = |at: usize| unsafe { std::ptr::read_unaligned(entry.add(at) as *const u64) };
    let action = unsafe { std::ptr::read_unaligned(entry as *const i32) };
    let device = i32::from(unsafe { *entry.add(4) } as i8);
    let (addr, stream, size) = (field(8), field(32), field(40));
    // One generation per device (later attaches reach this device's allocator again).
    let Some(owner) = usize::try_from(device).ok().and_then(|d| OWNER.get(d)) else {
        return;
    };
    let claimed = owner.load(Ordering::Acquire);
    let mine = claimed == generation
        || (claimed == 0
            && match owner.compare_exchange(0, generation, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => true,
                Err(now) => now == generation,
            });
    if !mine {
        return;
    }
    if state == UNVERIFIED {
        if action != ACTION_SEGMENT_ALLOC && action != ACTION_SEGMENT_MAP {
            return;
        }
        crate::guard((), || verify(action, device, addr, size, field(MEMPOOL_AT)));
        // The checked segment is recorded too once the layout is trusted.
        if STATE.load(Ordering::Acquire) != RECORDING {
            return;
        }
    }
    let kind = match action {
        ACTION_ALLOC => EventKind::TensorAlloc,
        ACTION_FREE_REQUESTED => EventKind::TensorFreeRequested,
        ACTION_FREE_COMPLETED => EventKind::TensorFree,
        ACTION_OOM => EventKind::TensorOom,
        ACTION_SEGMENT_ALLOC => EventKind::TensorSegment,
        ACTION_SEGMENT_MAP => EventKind::TensorSegmentMap,
        ACTION_SEGMENT_UNMAP => EventKind::TensorSegmentUnmap,
        _ => return,
    };
    let mut spec = Spec::new(kind, addr, size).device(device);
    spec.stream = stream;
    spec.walk_from = WalkFrom::Caller(CallerState {
        return_address,
        sp,
        bp,
    });
    if kind == EventKind::TensorAlloc && captured(stream) {
        // Both halves of the pair (a graph's own pool and a user's `MemPool` use one each);
        // read only where the layout has the pair, so never past an older, shorter entry.
        let pool = if MEMPOOL_FIELD.load(Ordering::Relaxed) {
            (field(MEMPOOL_AT) << 32) ^ field(MEMPOOL_AT + 8)
        } else {
            0
        };
        spec.handle = if pool == 0 {
            CAPTURED_BLOCK
        } else {
            CAPTURED_POOL | (pool & !CAPTURED_POOL)
        };
    }
    capture::record_reported_on(api(), &spec, device);
}

/// The `handle` of a `tensor_alloc` handed out while its stream was being captured into a
/// CUDA graph: under `torch.cuda.graph` the block comes from the capture's private pool.
pub const CAPTURED_BLOCK: u64 = 1;
/// ... or this bit with the pool's id, where `TraceEntry` carries it (`mempool_`, PyTorch
/// 2.15: a graph's pool is `{id, 0}`): captures that share a pool (`torch.cuda.graph(pool=)`,
/// `make_graphed_callables`) share the id.
pub const CAPTURED_POOL: u64 = 1 << 63;
/// Where `TraceEntry::mempool_.first` is (after `size_`), when the layout has it. Inside
/// every layout the tracker attaches to (PyTorch 2.2 on, the first with
/// `attachAllocatorTraceTracker`): `time_` is there in 2.2 – 2.6.
const MEMPOOL_AT: usize = 48;
/// Whether the layout has `mempool_` at [`MEMPOOL_AT`]: decided at the checked first
/// `segment_alloc` (an ordinary segment, pool `{0, 0}`), where older layouts have `time_`
/// there, a clock reading that is never 0.
static MEMPOOL_FIELD: AtomicBool = AtomicBool::new(false);

/// Whether `stream` is being captured now. The driver is asked only while some capture is
/// in progress (one atomic load otherwise), and never about the legacy default stream
/// (asking about it during another stream's capture is itself a prohibited call).
fn captured(stream: u64) -> bool {
    crate::stream_capture::any_in_progress()
        && crate::stream_capture::queryable(stream as *mut c_void, false)
            .and_then(crate::stream_capture::status)
            .is_some_and(|status| status != 0)
}

/// The first `segment_alloc` entry against the `cudaMalloc` this thread has just recorded, or
/// the first `segment_map` against the range its `cuMemMap` calls have just mapped.
fn verify(action: i32, device: i32, addr: u64, size: u64, mempool: u64) {
    let (call, (call_addr, call_size)) = if action == ACTION_SEGMENT_MAP {
        let (start, end) = LAST_MAP.try_with(Cell::get).unwrap_or((0, 0));
        ("cuMemMap", (start, end.wrapping_sub(start)))
    } else {
        (
            "cudaMalloc",
            LAST_MALLOC.try_with(Cell::get).unwrap_or((0, 0)),
        )
    };
    let entry = if action == ACTION_SEGMENT_MAP {
        "segment_map"
    } else {
        "segment_alloc"
    };
    let current = capture::current_device(Layer::Runtime);
    // Tests: a layout that does not match, to prove the tracker steps aside cleanly.
    let broken = std::env::var_os("VRAMSHIM_TEST_TORCH_LAYOUT_BREAK").is_some_and(|v| v == "1");
    let read_size = if broken { size ^ 1 } else { size };
    if call_addr != 0 && (addr, read_size, device) == (call_addr, call_size, current) {
        // Set before recording starts, so that every entry recorded sees it.
        MEMPOOL_FIELD.store(mempool == 0, Ordering::Relaxed);
        if STATE
            .compare_exchange(UNVERIFIED, RECORDING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            capture::stack_segment_releases();
            note(format!(
                "torch: recording tensors: PyTorch's {entry} of {size} bytes at {addr:#x} \
                 on device {device} matches the {call} recorded"
            ));
            if mempool == 0 {
                note(
                    "torch: its entries name their memory pool (blocks of a CUDA graph's \
                     private pool are recorded with it)"
                        .to_string(),
                );
            }
        }
    } else {
        step_aside(
            &format!(
                "PyTorch's TraceEntry layout is not the one known: its first {entry} reads \
                 ({addr:#x}, {read_size} bytes, device {device}), the {call} was \
                 ({call_addr:#x}, {call_size} bytes, device {current})"
            ),
            true,
        );
    }
}

/// The `api` number of tensor events, as the hook table gave it.
pub fn api() -> u16 {
    TENSOR_API.load(Ordering::Relaxed)
}
