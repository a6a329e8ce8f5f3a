//! Per-thread event rings: each thread that records appends to its own single-producer ring;
//! the writer, holding its lock, is the single consumer. Also the consumer's wake-up, which a
//! producer pulls when its ring is half full.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// What a ring slot holds.
pub const SLOT_EVENT: u8 = 0;
pub const SLOT_MEM_INFO: u8 = 1;

/// One buffered record: an event, or a device memory sample (`aux` = free, total).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct Slot {
    pub t_ns: u64,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub handle: u64,
    pub aux: [u64; 2],
    pub stack: u32,
    pub result: u32,
    pub device: i32,
    pub api: u16,
    pub kind: u8,
    pub tag: u8,
    /// Whether `aux` holds device free/total read at a failed allocation.
    pub has_mem_info: bool,
}

/// `in_progress` value of a thread outside any hook.
pub const IDLE: u64 = u64::MAX;
/// `in_progress` value while a thread is reading the clock on entry.
pub const ENTERING: u64 = 0;

#[repr(align(64))]
struct Padded<T>(T);

/// A thread's event buffer: single producer (the thread), single consumer (whoever holds the
/// writer lock).
pub struct Ring {
    pub tid: u32,
    /// Monotonic time the thread entered the hook it is in, or [`IDLE`] / [`ENTERING`].
    pub in_progress: AtomicU64,
    /// Set when the thread has exited; the writer frees the ring once it is empty.
    pub orphaned: AtomicBool,
    /// The producer asked the writer to drain early (ring half full); cleared by a drain.
    wake_sent: AtomicBool,
    head: Padded<AtomicUsize>,
    tail: Padded<AtomicUsize>,
    slots: SlotMemory,
    mask: usize,
}

/// A ring's slots, in anonymous memory mapped for this ring alone. Pages are touched only as
/// the thread records (a thread that makes two calls costs one page, not the whole ring), and
/// unmapping gives all of it back when the ring is freed: from the heap, the rings of exited
/// threads would stay in glibc's per-thread arenas.
struct SlotMemory {
    base: *mut UnsafeCell<Slot>,
    len: usize,
}

impl SlotMemory {
    /// `len` zeroed slots (all-zero bytes are a valid `Slot`); `None` if mapping fails.
    fn map(len: usize) -> Option<SlotMemory> {
        let bytes = len.checked_mul(std::mem::size_of::<Slot>())?;
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        (base != libc::MAP_FAILED).then(|| SlotMemory {
            base: base.cast(),
            len,
        })
    }

    #[inline]
    fn slot(&self, index: usize) -> &UnsafeCell<Slot> {
        debug_assert!(index < self.len);
        unsafe { &*self.base.add(index) }
    }
}

impl Drop for SlotMemory {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.base.cast(), self.len * std::mem::size_of::<Slot>()) };
    }
}

// Slots are written by the owning thread only before publishing `tail`, and read by the
// consumer only below `tail` and above `head`.
unsafe impl Sync for Ring {}
unsafe impl Send for Ring {}

impl Ring {
    /// A ring of `capacity` slots (rounded up to a power of two); `None` if there is no
    /// memory for it.
    pub fn new(tid: u32, capacity: usize) -> Option<Ring> {
        let capacity = capacity.max(1).next_power_of_two();
        Some(Ring {
            tid,
            in_progress: AtomicU64::new(IDLE),
            orphaned: AtomicBool::new(false),
            wake_sent: AtomicBool::new(false),
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            slots: SlotMemory::map(capacity)?,
            mask: capacity - 1,
        })
    }

    /// Appends `slot`; false if the ring is full. Wakes the writer once the ring is half
    /// full, so a busy thread rarely has to drain its ring itself.
    pub fn push(&self, slot: &Slot) -> bool {
        self.push_value(*slot)
    }

    /// [`Ring::push`] of a slot built by the caller, inlined into it: one copy of the slot
    /// fewer than through a reference.
    #[inline(always)]
    pub fn push_value(&self, slot: Slot) -> bool {
        let tail = self.tail.0.load(Ordering::Relaxed);
        let head = self.head.0.load(Ordering::Acquire);
        let used = tail.wrapping_sub(head);
        if used > self.mask {
            return false;
        }
        unsafe { *self.slots.slot(tail & self.mask).get() = slot };
        self.tail.0.store(tail.wrapping_add(1), Ordering::Release);
        if used >= self.mask / 2
            && !self.wake_sent.load(Ordering::Relaxed)
            && !self.wake_sent.swap(true, Ordering::AcqRel)
        {
            wake();
        }
        true
    }

    /// Moves every buffered slot older than `watermark` to `out` as (position in `out`,
    /// thread, slot), while `out` has fewer than `limit` entries. Consumer side only.
    pub fn drain_before(&self, watermark: u64, out: &mut Vec<(u32, u32, Slot)>, limit: usize) {
        let tail = self.tail.0.load(Ordering::Acquire);
        let mut head = self.head.0.load(Ordering::Relaxed);
        while head != tail && out.len() < limit {
            let slot = unsafe { *self.slots.slot(head & self.mask).get() };
            if slot.t_ns >= watermark {
                break;
            }
            out.push((out.len() as u32, self.tid, slot));
            head = head.wrapping_add(1);
        }
        self.head.0.store(head, Ordering::Release);
        self.wake_sent.store(false, Ordering::Release);
    }

    pub fn is_empty(&self) -> bool {
        self.head.0.load(Ordering::Acquire) == self.tail.0.load(Ordering::Acquire)
    }
}

/// The writer thread, for early wake-ups (leaked: replaced only when a fork child starts one).
static WRITER_THREAD: AtomicPtr<std::thread::Thread> = AtomicPtr::new(std::ptr::null_mut());

/// Registers the thread that drains periodically.
pub fn set_writer_thread(thread: std::thread::Thread) {
    WRITER_THREAD.store(Box::into_raw(Box::new(thread)), Ordering::Release);
}

/// Forgets the writer thread (in a fork child, where it does not exist).
pub fn clear_writer_thread() {
    WRITER_THREAD.store(std::ptr::null_mut(), Ordering::Release);
}

/// Asks the writer thread to drain now. An atomic load and a futex wake: no lock, no
/// allocation, so fine in a signal handler.
pub fn wake() {
    if let Some(thread) = unsafe { WRITER_THREAD.load(Ordering::Acquire).as_ref() } {
        thread.unpark();
    }
}
