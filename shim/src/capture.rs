//! The hook path: per-thread state, per-thread event rings, and what a hooked call records.
//!
//! Each thread appends to its own single-producer ring, so threads never contend. Order across
//! threads comes from timestamps: a thread publishes "I am inside a hook since t0" before it
//! reads the clock, frees are stamped before the real call and allocations after it, and the
//! writer only writes events older than every thread's t0 (the watermark). So the log is in
//! time order and a free always precedes the allocation that reuses its address.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use vramshim_format::{EventKind, HOST_DEVICE, UNKNOWN_DEVICE};

use crate::config::{OnFull, StackMode};
use crate::process::{self, now_ns};
use crate::real::{self, DRIVER, Layer};
use crate::ring::{ENTERING, IDLE, Ring, SLOT_EVENT, SLOT_MEM_INFO, Slot};
use crate::unwind::WalkFrom;
use crate::{altstack, stacks, writer};

/// What a hooked call did, as the table's spec expressions describe it.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub kind: EventKind,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub handle: u64,
    pub device: DeviceSource,
    /// A `cudaFree` or `cuMemUnmap`: with PyTorch's tracker recording, it releases one of the
    /// caching allocator's segments (an expandable segment's page for an unmap), and gets a
    /// stack by default (see [`stack_segment_releases`]).
    pub segment_release: bool,
    /// Where the event's native stack walk starts: inside the shim (its frames dropped), or
    /// at the caller of the entry point that reported it, as found on entry.
    pub walk_from: WalkFrom,
}

/// Set once PyTorch's caching allocator is known to be recording (its tracker's layout
/// checked): from then on `cudaFree` calls (`cuMemUnmap` under expandable segments) are its
/// segment releases, which are rare (cached segments go back only in `empty_cache()`, a
/// release-and-retry, garbage collection or `max_split_size_mb`'s release) and whose native
/// stack tells those apart
/// (`DeviceCachingAllocator::release_cached_blocks` under `malloc` is a retry `num_alloc_retries`
/// counts, even when no driver call failed). Other releases keep no stack by default.
static SEGMENT_RELEASE_STACKS: AtomicBool = AtomicBool::new(false);

/// From now on `cudaFree` and `cuMemUnmap` calls get a stack, as allocations do (see
/// [`SEGMENT_RELEASE_STACKS`]).
pub fn stack_segment_releases() {
    SEGMENT_RELEASE_STACKS.store(true, Ordering::Release);
}

/// Where an event's device ordinal comes from.
#[derive(Clone, Copy, Debug)]
pub enum DeviceSource {
    /// The calling thread's current device (`cuCtxGetDevice` / `cudaGetDevice`).
    Current,
    /// Pinned host memory.
    Host,
    /// Given by the call's arguments (`CUmemAllocationProp.location`).
    Known(i32),
}

impl Spec {
    pub fn new(kind: EventKind, addr: u64, size: u64) -> Spec {
        Spec {
            kind,
            addr,
            size,
            stream: 0,
            handle: 0,
            device: DeviceSource::Current,
            segment_release: false,
            walk_from: WalkFrom::Here,
        }
    }
    pub fn segment_release(mut self) -> Spec {
        self.segment_release = true;
        self
    }
    pub fn host(mut self) -> Spec {
        self.device = DeviceSource::Host;
        self
    }
    pub fn stream(mut self, stream: *mut c_void) -> Spec {
        self.stream = stream as u64;
        self
    }
    pub fn handle(mut self, handle: u64) -> Spec {
        self.handle = handle;
        self
    }
    pub fn device(mut self, device: i32) -> Spec {
        self.device = DeviceSource::Known(device);
        self
    }
    pub fn device_opt(mut self, device: Option<i32>) -> Spec {
        if let Some(device) = device {
            self.device = DeviceSource::Known(device);
        }
        self
    }
}

/// Per-thread state. `const`-initialised and free of `Drop`, so it stays usable while the
/// thread runs its TLS destructors and `atexit` handlers (frameworks free CUDA memory there).
pub struct ThreadState {
    /// Hooks currently active on this thread: a runtime call's inner driver call is not
    /// recorded again, and the shim's own CUDA calls are never recorded.
    depth: Cell<u32>,
    ring: Cell<*const Ring>,
    /// The OS name last written to the log for this thread (`comm`, NUL-padded).
    name: Cell<[u8; 16]>,
    /// When that name was last read (monotonic ns).
    name_read_ns: Cell<u64>,
}

thread_local! {
    pub static THREAD: ThreadState = const {
        ThreadState {
            depth: Cell::new(0),
            ring: Cell::new(std::ptr::null()),
            name: Cell::new([0; 16]),
            name_read_ns: Cell::new(0),
        }
    };
}

/// Runs one hooked call: the real call always, the recording around it when recording is on.
#[inline]
pub fn hook(
    api: u16,
    layer: Layer,
    call: impl FnOnce() -> c_int,
    spec: impl FnOnce(c_int) -> Option<Spec>,
) -> c_int {
    let Some(entry) = enter() else {
        return call();
    };
    let result = call();
    crate::guard((), || {
        record(api, layer, entry.t0, None, entry.ring, result, spec)
    });
    leave(entry.ring);
    result
}

/// Records an event no hooked call made (PyTorch's allocator reporting a block), on the
/// calling thread, exactly as a hooked call's event: same ring, stacks and ordering.
pub fn record_reported(api: u16, spec: &Spec) {
    if let DeviceSource::Known(device) = spec.device {
        return record_reported_on(api, spec, device);
    }
    let Some(entry) = enter() else {
        return;
    };
    // No call to stamp around: the entry time is the event's (one clock read, not two:
    // a read costs 40-50 ns on some VMs, a quarter of the event's cost).
    crate::guard((), || {
        record(
            api,
            Layer::Runtime,
            entry.t0,
            Some(entry.t0),
            entry.ring,
            0,
            |_| Some(*spec),
        )
    });
    leave(entry.ring);
}

/// [`record_reported`] for an event on a known device (every tensor event; inlined into
/// PyTorch's tracker callback): no call result to turn into a failure, no device to ask the
/// driver for and so no memory sample, and the slot handed to the ring by value. The general
/// path took a sixth more instructions per tensor event (285 against 238 without stacks).
/// Only the stack capture and the slow paths run under [`crate::guard`]: building the slot
/// and pushing it cannot panic, and a guard around the whole event (its closure's captures
/// stored and read back, its frame) cost ~50 instructions an event, most events having no
/// stack (frees).
#[inline(always)]
pub fn record_reported_on(api: u16, spec: &Spec, device: i32) {
    let Some(entry) = enter() else {
        return;
    };
    let t_ns = entry.t0;
    let kind = spec.kind;
    let config = process::config();
    let stack = if stack_wanted(config, kind, spec.segment_release) {
        crate::guard(0, || {
            stacks::capture(config.stack, config.max_frames, t_ns, spec.walk_from)
        })
    } else {
        0
    };
    let slot = |stack| Slot {
        t_ns,
        addr: spec.addr,
        size: spec.size,
        stream: spec.stream,
        handle: spec.handle,
        aux: [0, 0],
        has_mem_info: false,
        stack,
        result: 0,
        device,
        api,
        kind: kind as u8,
        tag: SLOT_EVENT,
    };
    // SAFETY: `enter` returned this thread's ring, alive while the thread records.
    let ring = unsafe { &*entry.ring };
    // Built again for a full ring: a slot whose address the slow path takes was built on the
    // stack and copied twice, field by field, before reaching the ring (~30 instructions an
    // event). The closure takes the stack id by value: one capturing it by reference had
    // its captures' addresses stored on every event (12 instructions).
    if !ring.push_value(slot(stack)) {
        let full = slot(stack);
        crate::guard((), || push(ring, &full, config.on_full));
    }
    if process::finished() {
        // As in `record`: after the final flush nobody else writes this event.
        ring.in_progress.store(t_ns + 1, Ordering::SeqCst);
        crate::guard((), || writer::flush(writer::FlushKind::Now));
    }
    leave(entry.ring);
}

/// Inside an acquiring hook's spec (before its event is stamped): tells the writer that this
/// thread's events from now on are newer than now, so that others can be written while this
/// thread waits (the hook's event is stamped after the spec; releases are not allowed here).
pub fn publish_progress_now() {
    let ring = THREAD
        .try_with(|thread| thread.ring.get())
        .unwrap_or(std::ptr::null());
    if let Some(ring) = unsafe { ring.as_ref() }
        && ring.in_progress.load(Ordering::SeqCst) != IDLE
    {
        ring.in_progress.store(now_ns(), Ordering::SeqCst);
    }
}

struct Entry {
    t0: u64,
    ring: *const Ring,
}

/// Marks this thread as inside a hook. `None` if this call must not be recorded (recording off,
/// or nested inside another hook on this thread).
#[inline]
fn enter() -> Option<Entry> {
    if !process::ensure_started() {
        return None;
    }
    THREAD
        .try_with(|thread| {
            let depth = thread.depth.get();
            if depth > 0 {
                return None;
            }
            let mut ring = thread.ring.get();
            if ring.is_null() {
                ring = register(thread);
                if ring.is_null() {
                    return None;
                }
            }
            thread.depth.set(1);
            let ring_ref = unsafe { &*ring };
            // Publish "entering" before reading the clock: the writer then never assumes
            // this thread's next event is newer than a time it read earlier.
            ring_ref.in_progress.store(ENTERING, Ordering::SeqCst);
            let t0 = now_ns();
            // Release is enough here (a plain store, where SeqCst is a full fence): a writer
            // that still sees ENTERING only waits, one that sees `t0` has a true lower bound.
            ring_ref.in_progress.store(t0, Ordering::Release);
            if t0.wrapping_sub(thread.name_read_ns.get()) >= NAME_CHECK_NS {
                reread_name(thread, ring_ref.tid, t0);
            }
            Some(Entry { t0, ring })
        })
        .ok()
        .flatten()
}

/// How often a thread's OS name is read again: threads often name themselves after their first
/// CUDA call (PyTorch's `pt_autograd_N`, data loader threads, Python 3.14's `threading`).
const NAME_CHECK_NS: u64 = 1_000_000_000;

/// Creates the calling thread's ring and names the thread in the log (its first hooked call).
#[cold]
#[inline(never)]
fn register(thread: &ThreadState) -> *const Ring {
    thread.depth.set(1);
    let name = current_thread_name().unwrap_or_default();
    let ring = crate::guard(std::ptr::null(), || new_ring(name_text(&name)));
    thread.depth.set(0);
    if !ring.is_null() {
        thread.ring.set(ring);
        thread.name.set(name);
        thread.name_read_ns.set(now_ns());
        // A crash on this thread, stack overflow included, can then still flush.
        altstack::give_thread_an_alt_stack();
    }
    ring
}

/// Creates the calling thread's ring, hands it to the writer, names the thread in the log as
/// `name`, and arranges for the ring's release at thread exit. Null if no memory.
fn new_ring(name: String) -> *const Ring {
    let tid = process::gettid();
    let Some(ring) = Ring::new(tid, process::config().buffer_events) else {
        return std::ptr::null();
    };
    let ring = Arc::new(ring);
    writer::name_thread(tid, name);
    writer::add_ring(ring.clone());
    // The thread's own reference, released by the thread-exit key's destructor.
    let pointer = Arc::into_raw(ring);
    process::set_thread_exit_hook(pointer.cast());
    pointer
}

/// Reads the thread's OS name again and writes a new `thread` record if it changed.
#[cold]
#[inline(never)]
fn reread_name(thread: &ThreadState, tid: u32, now: u64) {
    thread.name_read_ns.set(now);
    let Some(name) = current_thread_name() else {
        return;
    };
    if name != thread.name.get() {
        thread.name.set(name);
        crate::guard((), || writer::name_thread(tid, name_text(&name)));
    }
}

/// Checks the calling thread's name once more, whenever it was last read (the process ends):
/// a name set since the last check still reaches the log.
pub fn reread_own_name() {
    let ring = THREAD
        .try_with(|thread| thread.ring.get())
        .unwrap_or(std::ptr::null());
    reread_own_name_of(ring);
}

/// Like [`reread_own_name`] for `ring`, the calling thread's ring (also once the thread has
/// forgotten it, as it exits).
pub fn reread_own_name_of(ring: *const Ring) {
    if ring.is_null() {
        return;
    }
    let tid = unsafe { &*ring }.tid;
    let _ = THREAD.try_with(|thread| reread_name(thread, tid, now_ns()));
}

/// The calling thread's OS name (`comm`: at most 15 bytes), NUL-padded. One system call, no
/// file to open.
fn current_thread_name() -> Option<[u8; 16]> {
    let mut name = [0u8; 16];
    // PR_GET_NAME writes at most 16 bytes, NUL included.
    let rc = unsafe {
        libc::prctl(
            libc::PR_GET_NAME,
            name.as_mut_ptr() as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    (rc == 0).then_some(name)
}

/// A NUL-padded name as text.
fn name_text(name: &[u8; 16]) -> String {
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..len]).into_owned()
}

#[inline]
fn leave(ring: *const Ring) {
    unsafe { &*ring }.in_progress.store(IDLE, Ordering::Release);
    let _ = THREAD.try_with(|thread| thread.depth.set(0));
}

/// Forgets this thread's ring (after fork, in the child, or when the thread exits).
pub fn forget_thread_ring() -> *const Ring {
    THREAD
        .try_with(|thread| thread.ring.replace(std::ptr::null()))
        .unwrap_or(std::ptr::null())
}

/// Records the event `spec` describes; `now` is the time after the call (read here if
/// `None`).
fn record(
    api: u16,
    layer: Layer,
    t0: u64,
    now: Option<u64>,
    ring: *const Ring,
    result: c_int,
    spec: impl FnOnce(c_int) -> Option<Spec>,
) {
    let Some(spec) = spec(result) else { return };
    let now = now.unwrap_or_else(now_ns);
    let failed = result != 0;
    let kind = match spec.kind {
        EventKind::Alloc | EventKind::Create if failed => EventKind::AllocFailed,
        kind => kind,
    };
    let current = match spec.device {
        DeviceSource::Current => Some(current_device(layer)),
        _ => None,
    };
    let device = match spec.device {
        DeviceSource::Current => current.unwrap_or(UNKNOWN_DEVICE),
        DeviceSource::Host => HOST_DEVICE,
        DeviceSource::Known(device) => device,
    };
    let config = process::config();
    let stack = stack_for(config, kind, spec.segment_release, now, spec.walk_from);
    let mem_info = if kind == EventKind::AllocFailed {
        mem_get_info()
    } else {
        None
    };
    let slot = Slot {
        // Releases are stamped before the real call, acquisitions after it.
        t_ns: if kind.releases() { t0 } else { now },
        addr: spec.addr,
        size: spec.size,
        stream: spec.stream,
        handle: spec.handle,
        aux: mem_info.map_or([0, 0], |(free, total)| [free, total]),
        has_mem_info: mem_info.is_some(),
        stack,
        result: result as u32,
        device,
        api,
        kind: kind as u8,
        tag: SLOT_EVENT,
    };
    let ring = unsafe { &*ring };
    push(ring, &slot, config.on_full);
    if let Some(device) = current.filter(|&d| d >= 0) {
        sample_mem_info(ring, device, slot.t_ns);
    }
    if kind == EventKind::AllocFailed || process::finished() {
        // Nothing more is pushed in this call, so the watermark may pass this event; then
        // flush: the process may die of this failure and the evidence must be on disk (and
        // after the final flush nobody else will write it).
        ring.in_progress.store(slot.t_ns + 1, Ordering::SeqCst);
        if kind == EventKind::AllocFailed {
            crate::flight::request(crate::flight::REQUEST_ALLOC_FAILED);
        }
        writer::flush(writer::FlushKind::Now);
    }
}

/// The stack id an event of `kind` records (0: none). A release is attributed to its
/// allocation, so by default it needs no stack of its own.
#[inline(always)]
fn stack_for(
    config: &crate::config::Config,
    kind: EventKind,
    segment_release: bool,
    now: u64,
    from: WalkFrom,
) -> u32 {
    if stack_wanted(config, kind, segment_release) {
        stacks::capture(config.stack, config.max_frames, now, from)
    } else {
        0
    }
}

/// Whether an event of `kind` gets a stack: not with stacks off, nor a release unless free
/// stacks are on or it is one of the caching allocator's segment releases.
#[inline(always)]
fn stack_wanted(config: &crate::config::Config, kind: EventKind, segment_release: bool) -> bool {
    match config.stack {
        StackMode::None => false,
        _ => {
            !kind.releases()
                || config.free_stacks
                || (segment_release && SEGMENT_RELEASE_STACKS.load(Ordering::Acquire))
        }
    }
}

/// Appends to the thread's ring. If it is full, every later push of this hook call has a
/// time at least `slot.t_ns`, so the thread may publish that as its lower bound before
/// draining: the flush can then write everything older, this thread's events included.
fn push(ring: &Ring, slot: &Slot, on_full: OnFull) {
    let mut attempts = 0u32;
    while !ring.push(slot) {
        ring.in_progress.store(slot.t_ns, Ordering::SeqCst);
        match on_full {
            OnFull::Drop => {
                writer::count_dropped();
                return;
            }
            // Wait for room: drain synchronously rather than depend on the writer thread. If
            // that made no room, another thread inside a hook holds the watermark back (it
            // was preempted): give it the CPU instead of spinning on the writer lock.
            OnFull::Wait => {
                writer::flush(writer::FlushKind::MakeRoom);
                attempts += 1;
                if attempts > 2 {
                    if attempts < 20 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(100));
                    }
                }
            }
        }
    }
}

/// The calling thread's current device, by the API family it called.
pub fn current_device(layer: Layer) -> i32 {
    let mut device: c_int = UNKNOWN_DEVICE;
    let rc = match layer {
        Layer::Runtime => {
            static CUDA_GET_DEVICE: std::sync::atomic::AtomicPtr<c_void> =
                std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
            let mut real = CUDA_GET_DEVICE.load(Ordering::Acquire);
            if real.is_null() {
                real = real::next(c"cudaGetDevice");
                CUDA_GET_DEVICE.store(real, Ordering::Release);
            }
            if real.is_null() {
                return UNKNOWN_DEVICE;
            }
            let real: unsafe extern "C" fn(*mut c_int) -> c_int =
                unsafe { std::mem::transmute(real) };
            unsafe { real(&mut device) }
        }
        Layer::Driver => {
            let real = DRIVER.ctx_get_device.load(Ordering::Acquire);
            if real.is_null() {
                return UNKNOWN_DEVICE;
            }
            let real: unsafe extern "C" fn(*mut c_int) -> c_int =
                unsafe { std::mem::transmute(real) };
            unsafe { real(&mut device) }
        }
    };
    if rc == 0 { device } else { UNKNOWN_DEVICE }
}

/// Device (free, total) bytes of the current context, from the driver.
fn mem_get_info() -> Option<(u64, u64)> {
    let _ = real::libcuda();
    let real = DRIVER.mem_get_info.load(Ordering::Acquire);
    if real.is_null() {
        return None;
    }
    let real: unsafe extern "C" fn(*mut usize, *mut usize) -> c_int =
        unsafe { std::mem::transmute(real) };
    let (mut free, mut total) = (0usize, 0usize);
    (unsafe { real(&mut free, &mut total) } == 0).then_some((free as u64, total as u64))
}

const MAX_SAMPLED_DEVICES: usize = 64;
/// Last device memory sample per device (0 = never).
static LAST_SAMPLE: [AtomicU64; MAX_SAMPLED_DEVICES] =
    [const { AtomicU64::new(0) }; MAX_SAMPLED_DEVICES];

/// Records the device's free/total at its first event and then at most once every
/// `VRAMSHIM_SAMPLE_MS` (a second by default), so the report can show memory no hook sees
/// (context, modules). Stamped with the event's time to keep the ring in time order.
fn sample_mem_info(ring: &Ring, device: i32, now: u64) {
    let Some(last) = LAST_SAMPLE.get(device as usize) else {
        return;
    };
    let previous = last.load(Ordering::Relaxed);
    let interval_ns = process::config().sample_ms.saturating_mul(1_000_000);
    if previous != 0 && now.saturating_sub(previous) < interval_ns {
        return;
    }
    if last
        .compare_exchange(previous, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let Some((free, total)) = mem_get_info() else {
        return;
    };
    let slot = Slot {
        t_ns: now,
        device,
        aux: [free, total],
        tag: SLOT_MEM_INFO,
        ..Slot::default()
    };
    match process::config().on_full {
        OnFull::Wait => push(ring, &slot, OnFull::Wait),
        // A sample is no event: the `dropped` count must not include it. Skip it and let the
        // device's next event try again, so a device's first sample is not lost for a second.
        OnFull::Drop => {
            if !ring.push(&slot) {
                let _ = last.compare_exchange(
                    now.max(1),
                    previous,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
        }
    }
}

/// Forgets the sample times (after fork the child's log needs its own first samples).
pub fn reset_samples() {
    for last in &LAST_SAMPLE {
        last.store(0, Ordering::Relaxed);
    }
}
