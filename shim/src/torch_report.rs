//! Tensors of PyTorch releases whose caching allocator has no trace tracker (2.1.x), taken from
//! `c10::reportMemoryUsageToProfiler`.
//!
//! Where torch 2.1.2 calls it (read from its `libc10_cuda.so`, which imports the function from
//! `libc10.so`: `objdump -d` shows exactly two calls, and a preloaded probe printed their
//! arguments): `DeviceCachingAllocator::alloc_found_block`, the end of every block `malloc`
//! hands out (block pointer, + block size: the rounded request, or the whole free block when it
//! is not split), and `DeviceCachingAllocator::free(Block*)`, at the program's free request
//! (block pointer, − block size, even when the block was used on other streams and becomes
//! reusable only once their events complete). Both pass the allocator's aggregate allocated
//! and reserved bytes for the device *after* the change, with `Device(CUDA, index)`, and both
//! run under that device allocator's mutex. Other allocators (CPU) call it too, with other
//! device types, and the CUDA calls come on any thread (autograd's).
//!
//! `libvramshim.so` defines the same symbol, so, preloaded, it interposes these calls; each is
//! forwarded to the real one, so PyTorch's profiler keeps its memory events. Only with
//! [`torch_trace`](crate::torch_trace) in its reporting state (the allocator has no tracker)
//! does a CUDA report become an event; otherwise the function is one atomic load and the
//! forward.
//!
//! What this route lacks, against the tracker's: the requested size (the event's `size` is the
//! block's), the stream (0), the moment a block really becomes reusable (`tensor_free` comes
//! with the request), `oom` entries. Segments are not reported either: a report whose reserved
//! bytes grew by exactly this thread's last `cudaMalloc` (or the range its last `cuMemMap`
//! calls mapped back to back) takes that call as PyTorch's segment, and records it as the
//! tracker's `segment_alloc` (`segment_map`) would be; a `cudaFree` of such a segment (a
//! `cuMemUnmap` inside such a range) gives it back, the unmap recorded as `segment_unmap`.
//!
//! Trust: every report is checked before it is recorded: the reserved bytes must equal the
//! bytes of the segments recorded live on that device, the allocated bytes the blocks
//! recorded live there, and the block must lie inside one segment (inside ranges mapped back
//! to back). On any mismatch the route steps aside for the rest of the process, with one
//! note and one warning line.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::time::Duration;

use vramshim_format::EventKind;

use crate::capture::{self, Spec};
use crate::real;
use crate::sync::Lock;
use crate::torch_trace;

use torch_trace::REPORT_SYMBOL;
/// `c10::DeviceType::CUDA`.
const DEVICE_TYPE_CUDA: i8 = 1;
const MAX_DEVICES: usize = 64;

/// `c10::Device`: two 8-bit fields, passed by value in one register.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Device {
    kind: i8,
    index: i8,
}

type ReportFn = unsafe extern "C" fn(*mut c_void, i64, usize, usize, Device);

/// Reports seen, for the test setting of [`torch_trace::report_break_at`].
static REPORTS: AtomicU64 = AtomicU64::new(0);

/// The real `c10::reportMemoryUsageToProfiler` (the next definition after the shim's).
static REAL_REPORT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The real function once nothing but forwarding is left for the shim to do: the tracker route
/// was taken or the route stepped aside ([`torch_trace::never_reporting`]), so this process
/// never records a report. Null until then.
static FORWARD_ONLY: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Interposes PyTorch's report of a block allocation (`alloc_size` > 0) or free (< 0), then
/// forwards it to the real function. Where PyTorch has a tracker (2.2 on) every block is
/// reported here too, twice an allocation: once [`FORWARD_ONLY`] is set, the call jumps
/// straight to the real one, its registers and stack untouched (four instructions, where the
/// full check and forward took some 28 a call).
///
/// # Safety
/// Same contract as `c10::reportMemoryUsageToProfiler`.
#[unsafe(naked)]
#[unsafe(no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE(
    ptr: *mut c_void,
    alloc_size: i64,
    total_allocated: usize,
    total_reserved: usize,
    device: Device,
) {
    std::arch::naked_asm!(
        "mov rax, qword ptr [rip + {forward}]",
        "test rax, rax",
        "jz {checked}",
        "jmp rax",
        forward = sym FORWARD_ONLY,
        checked = sym report_checked,
    )
}

/// The interposer's body until [`FORWARD_ONLY`] is set: a report recorded where the route
/// records, then the forward.
unsafe extern "C" fn report_checked(
    ptr: *mut c_void,
    alloc_size: i64,
    total_allocated: usize,
    total_reserved: usize,
    device: Device,
) {
    if device.kind == DEVICE_TYPE_CUDA && torch_trace::reporting() && crate::process::is_on() {
        crate::guard((), || {
            on_report(
                ptr as u64,
                alloc_size,
                total_allocated as u64,
                total_reserved as u64,
                i32::from(device.index),
            )
        });
    }
    let mut real = REAL_REPORT.load(Ordering::Acquire);
    if real.is_null() {
        // Asked once: asking the loader at every call would put `dlopen`s on every thread,
        // and a fork in the middle of one leaves the child a loader it cannot use.
        real = real_report().unwrap_or(NO_REAL_REPORT);
        REAL_REPORT.store(real, Ordering::Release);
    }
    if real == NO_REAL_REPORT {
        return;
    }
    if torch_trace::never_reporting() {
        FORWARD_ONLY.store(real, Ordering::Release);
    }
    let real: ReportFn = unsafe { std::mem::transmute::<*mut c_void, ReportFn>(real) };
    unsafe { real(ptr, alloc_size, total_allocated, total_reserved, device) };
}

/// [`REAL_REPORT`] once the first call found nothing to forward to.
const NO_REAL_REPORT: *mut c_void = usize::MAX as *mut c_void;

/// The definition the shim's hides: the next one in the global scope (another interposer),
/// else `libc10.so`'s own. PyTorch loads `libc10.so` into a local scope (its extension module
/// is opened without `RTLD_GLOBAL`), where `RTLD_NEXT` does not look. PyTorch's calls come
/// from `libc10_cuda.so`, which needs `libc10.so` loaded, so the first of them finds it; a
/// program that calls the function without PyTorch gets `None`, kept for the process.
fn real_report() -> Option<*mut c_void> {
    let next = real::next(REPORT_SYMBOL);
    if !next.is_null() {
        return Some(next);
    }
    let handle =
        unsafe { libc::dlopen(c"libc10.so".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    let own = real::real_dlsym(handle, REPORT_SYMBOL);
    unsafe { libc::dlclose(handle) };
    let ours = _ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE as *const c_void;
    (!own.is_null() && !std::ptr::eq(own.cast_const(), ours)).then_some(own)
}

/// A segment PyTorch holds, as recorded: a `cudaMalloc`, or a range mapped back to back.
#[derive(Clone, Copy)]
struct Range {
    end: u64,
    device: usize,
    mapped: bool,
}

/// What the reports are checked against.
struct Books {
    /// PyTorch's segments seen live, by start address.
    ranges: BTreeMap<u64, Range>,
    /// Per device: the bytes of `ranges`, and of the blocks recorded live.
    reserved: [u64; MAX_DEVICES],
    allocated: [u64; MAX_DEVICES],
    /// The first report has been checked and said so in a note.
    checked: bool,
}

static BOOKS: Lock<Books> = Lock::new(Books {
    ranges: BTreeMap::new(),
    reserved: [0; MAX_DEVICES],
    allocated: [0; MAX_DEVICES],
    checked: false,
});

/// The books, unless another thread holds them past a moment (a fork child whose parent's
/// thread held them, or a signal handler that interrupted this thread inside them).
fn books() -> Option<crate::sync::LockGuard<'static, Books>> {
    BOOKS
        .try_lock()
        .or_else(|| BOOKS.try_lock_for(Duration::from_millis(100)))
}

/// One CUDA report: checked against the books, then recorded (the segment it took first).
fn on_report(addr: u64, delta: i64, allocated: u64, mut reserved: u64, device: i32) {
    let break_at = torch_trace::report_break_at();
    if break_at != 0 && REPORTS.fetch_add(1, Ordering::Relaxed) + 1 == break_at {
        reserved += 1;
    }
    // This thread's segment calls since its last report, whichever this report is.
    let (malloc, map) = torch_trace::take_segment_calls();
    let Some(d) = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES) else {
        return fail(format!("a report names device {device}"));
    };
    let size = delta.unsigned_abs();
    if size == 0 {
        return;
    }
    let Some(mut books) = books() else {
        return fail("the shim's segment books stayed busy".into());
    };
    let mut segment = None;
    if delta > 0 && reserved != books.reserved[d] {
        let grown = reserved.wrapping_sub(books.reserved[d]);
        let (start, len, kind, mapped) = if malloc.1 != 0 && malloc.1 == grown {
            (malloc.0, malloc.1, EventKind::TensorSegment, false)
        } else {
            let len = map.1.wrapping_sub(map.0);
            (map.0, len, EventKind::TensorSegmentMap, true)
        };
        if start != 0 && len == grown {
            let end = start.saturating_add(len);
            books.ranges.insert(
                start,
                Range {
                    end,
                    device: d,
                    mapped,
                },
            );
            books.reserved[d] = reserved;
            segment = Some((kind, start, len));
        }
    }
    if reserved != books.reserved[d] {
        let held = books.reserved[d];
        drop(books);
        return fail(format!(
            "PyTorch reports {reserved} bytes reserved on device {device}, the segments \
             recorded there hold {held}"
        ));
    }
    if !inside(&books.ranges, d, addr, size) {
        drop(books);
        return fail(format!(
            "PyTorch's block of {size} bytes at {addr:#x} on device {device} lies in no \
             segment recorded"
        ));
    }
    let live = if delta > 0 {
        books.allocated[d].wrapping_add(size)
    } else {
        books.allocated[d].wrapping_sub(size)
    };
    if live != allocated {
        drop(books);
        return fail(format!(
            "PyTorch reports {allocated} bytes allocated on device {device}, the blocks \
             recorded there hold {live}"
        ));
    }
    books.allocated[d] = live;
    let first = !std::mem::replace(&mut books.checked, true);
    drop(books);
    if first {
        torch_trace::note(format!(
            "torch: recording tensor blocks from c10::reportMemoryUsageToProfiler: PyTorch's \
             block of {size} bytes at {addr:#x} on device {device} lies in the segments \
             recorded, which hold its {reserved} bytes reserved"
        ));
    }
    let api = torch_trace::api();
    if let Some((kind, start, len)) = segment {
        capture::record_reported(api, &Spec::new(kind, start, len).device(device));
    }
    if delta > 0 {
        capture::record_reported(
            api,
            &Spec::new(EventKind::TensorAlloc, addr, size).device(device),
        );
    } else {
        // Reusable now as far as this route can tell (see the module's comment).
        capture::record_reported(
            api,
            &Spec::new(EventKind::TensorFreeRequested, addr, size).device(device),
        );
        capture::record_reported(
            api,
            &Spec::new(EventKind::TensorFree, addr, size).device(device),
        );
    }
}

/// Whether `[addr, addr + size)` lies inside one recorded `cudaMalloc` segment of `device`,
/// or inside ranges of it mapped back to back.
fn inside(ranges: &BTreeMap<u64, Range>, device: usize, addr: u64, size: u64) -> bool {
    let end = addr.saturating_add(size.max(1));
    let mut at = addr;
    while at < end {
        let Some((_, range)) = ranges
            .range(..=at)
            .next_back()
            .filter(|(_, range)| at < range.end && range.device == device)
        else {
            return false;
        };
        if !range.mapped {
            return at == addr && end <= range.end;
        }
        at = range.end;
    }
    true
}

fn fail(reason: String) {
    torch_trace::stop_reporting(&reason);
}

/// A `cudaFree` (after the real call): a recorded segment given back.
pub fn after_cuda_free(result: i32, addr: u64) {
    if result != 0 || !torch_trace::reporting() {
        return;
    }
    let Some(mut books) = books() else {
        return fail("the shim's segment books stayed busy".into());
    };
    if let Some(range) = books.ranges.get(&addr).copied()
        && !range.mapped
    {
        books.ranges.remove(&addr);
        let d = range.device;
        books.reserved[d] = books.reserved[d].wrapping_sub(range.end - addr);
    }
}

/// Watches a `cuMemUnmap`: after it, the part of a recorded range it unmapped is given back,
/// and recorded as PyTorch's `segment_unmap` (outside the hook, so that it is an event).
pub struct Unmap {
    addr: u64,
    size: u64,
}

impl Unmap {
    pub fn before(addr: u64, size: usize) -> Unmap {
        Unmap {
            addr,
            size: size as u64,
        }
    }

    pub fn after(self, result: i32) {
        if result != 0 || !torch_trace::reporting() {
            return;
        }
        crate::guard((), || self.unmapped());
    }

    fn unmapped(self) {
        let Some(mut books) = books() else {
            return fail("the shim's segment books stayed busy".into());
        };
        let (start, end) = (self.addr, self.addr.saturating_add(self.size));
        let overlapping: Vec<(u64, Range)> = books
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, range)| range.end > start)
            .filter(|(_, range)| range.mapped)
            .map(|(&at, &range)| (at, range))
            .collect();
        let mut device = None;
        for (at, range) in overlapping {
            books.ranges.remove(&at);
            if at < start {
                books.ranges.insert(
                    at,
                    Range {
                        end: start,
                        ..range
                    },
                );
            }
            if range.end > end {
                books.ranges.insert(end, range);
            }
            let gone = range.end.min(end) - at.max(start);
            books.reserved[range.device] = books.reserved[range.device].wrapping_sub(gone);
            device = Some(range.device);
        }
        drop(books);
        if let Some(device) = device {
            capture::record_reported(
                torch_trace::api(),
                &Spec::new(EventKind::TensorSegmentUnmap, self.addr, self.size)
                    .device(device as i32),
            );
        }
    }
}
