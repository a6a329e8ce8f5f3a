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

/// Drained slots `start..end` of a batch: one thread's, in time order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub start: u32,
    pub end: u32,
    pub tid: u32,
}

impl Run {
    fn new(start: usize, end: usize, tid: u32) -> Run {
        // A batch never holds 2^32 slots (320 GiB of them).
        Run {
            start: start as u32,
            end: end as u32,
            tid,
        }
    }
}

/// A slot's place in a merge of more runs than [`MERGE_SCAN_RUNS`]: sorted by time, then by
/// place in the batch.
#[derive(Clone, Copy, Debug, Default)]
pub struct MergeKey {
    t_ns: u64,
    index: u32,
    run: u32,
}

/// Up to this many runs out of order are merged by looking at each run's next slot; more
/// (many threads, or one whose slots are far from time order) by sorting keys.
const MERGE_SCAN_RUNS: usize = 8;

/// Calls `emit(thread, slot)` for every slot of `batch` (covered by `runs`, in drain order) in
/// time order, slots of the same time in the order drained: what a stable sort of `batch` by
/// time gives, without moving the slots. `keys` is scratch for many runs; it never grows past
/// `batch.len()` (a crash flush, which must not allocate, reserves that much beforehand).
pub fn for_each_in_time_order(
    batch: &[Slot],
    runs: &[Run],
    keys: &mut Vec<MergeKey>,
    mut emit: impl FnMut(u32, &Slot),
) {
    let in_order = runs
        .windows(2)
        .all(|pair| batch[pair[0].end as usize - 1].t_ns <= batch[pair[1].start as usize].t_ns);
    if in_order {
        // One run, or runs that follow each other (threads that took turns between drains).
        for run in runs {
            for slot in &batch[run.start as usize..run.end as usize] {
                emit(run.tid, slot);
            }
        }
    } else if runs.len() <= MERGE_SCAN_RUNS {
        merge_by_scan(batch, runs, emit);
    } else {
        keys.clear();
        for (run_index, run) in runs.iter().enumerate() {
            for index in run.start..run.end {
                keys.push(MergeKey {
                    t_ns: batch[index as usize].t_ns,
                    index,
                    run: run_index as u32,
                });
            }
        }
        // In place (no allocation); the keys are distinct, so the order is the stable one.
        keys.sort_unstable_by_key(|key| (key.t_ns, key.index));
        for key in keys.iter() {
            emit(runs[key.run as usize].tid, &batch[key.index as usize]);
        }
    }
}

/// [`for_each_in_time_order`] of a few runs: the run whose next slot comes first (the
/// earliest-drained run on a tie) gives every slot up to the next slot of the others.
fn merge_by_scan(batch: &[Slot], runs: &[Run], mut emit: impl FnMut(u32, &Slot)) {
    let mut next = [0usize; MERGE_SCAN_RUNS];
    // The time of each run's next slot; `u64::MAX` once it is done (a drained slot is
    // older than the watermark, so never stamped `u64::MAX`).
    let mut next_t = [u64::MAX; MERGE_SCAN_RUNS];
    for (r, run) in runs.iter().enumerate() {
        next[r] = run.start as usize;
        next_t[r] = batch[run.start as usize].t_ns;
    }
    let mut left = batch.len();
    while left > 0 {
        // The first run by (next time, run), and the time and run that follow it (runs in
        // drain order: of runs as early, the first seen stays ahead).
        let (mut best, mut best_t) = (0, next_t[0]);
        let (mut second, mut second_t) = (usize::MAX, u64::MAX);
        for (r, &t_ns) in next_t.iter().enumerate().take(runs.len()).skip(1) {
            if t_ns < best_t {
                (second, second_t) = (best, best_t);
                (best, best_t) = (r, t_ns);
            } else if t_ns < second_t {
                (second, second_t) = (r, t_ns);
            }
        }
        // `best` goes on while its slots come before `second`'s next one: earlier, or as
        // early and drained before it.
        let run = &runs[best];
        let end = run.end as usize;
        let mut at = next[best];
        loop {
            emit(run.tid, &batch[at]);
            at += 1;
            left -= 1;
            if at == end {
                next_t[best] = u64::MAX;
                break;
            }
            let t_ns = batch[at].t_ns;
            if t_ns > second_t || (t_ns == second_t && best > second) {
                next_t[best] = t_ns;
                break;
            }
        }
        next[best] = at;
    }
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

    /// Slots `start..start + len`, to read. Only slots the producer has published and the
    /// consumer not yet released (it does not write them meanwhile).
    #[inline]
    fn slice(&self, start: usize, len: usize) -> &[Slot] {
        debug_assert!(start + len <= self.len);
        // `UnsafeCell<Slot>` has `Slot`'s layout.
        unsafe { std::slice::from_raw_parts(self.base.add(start).cast::<Slot>(), len) }
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

    /// Moves every buffered slot older than `watermark` to the end of `out`, while `out` has
    /// fewer than `limit` slots and `runs` at most `run_limit` runs, and appends to `runs` the
    /// stretches of what it moved that are in time order ([`Run`]s of this ring's thread: one,
    /// unless the thread stamped a slot earlier than the one before it). Consumer side only.
    pub fn drain_before(
        &self,
        watermark: u64,
        out: &mut Vec<Slot>,
        runs: &mut Vec<Run>,
        limit: usize,
        run_limit: usize,
    ) {
        let tail = self.tail.0.load(Ordering::Acquire);
        let head = self.head.0.load(Ordering::Relaxed);
        let available = tail.wrapping_sub(head).min(limit.saturating_sub(out.len()));
        let mut taken = 0usize;
        if available > 0 && runs.len() < run_limit {
            // Within the capacity a crash flush limits itself to: no allocation there.
            out.reserve(available);
            let base = out.len();
            let free = out.spare_capacity_mut();
            let mut run_start = base;
            let mut last_t = 0u64;
            // The buffered slots, in at most two pieces (the ring wraps).
            let first = head & self.mask;
            let before_wrap = available.min(self.mask + 1 - first);
            let pieces = [
                self.slots.slice(first, before_wrap),
                self.slots.slice(0, available - before_wrap),
            ];
            'drain: for piece in pieces {
                for slot in piece {
                    let t_ns = slot.t_ns;
                    if t_ns >= watermark {
                        break 'drain;
                    }
                    if t_ns < last_t {
                        // The thread stamped this slot earlier than the one before it (a
                        // run of the merge is in time order): a run ends here.
                        if runs.len() + 1 >= run_limit {
                            break 'drain;
                        }
                        runs.push(Run::new(run_start, base + taken, self.tid));
                        run_start = base + taken;
                    }
                    last_t = t_ns;
                    free[taken].write(*slot);
                    taken += 1;
                }
            }
            // The slots written are initialized.
            unsafe { out.set_len(base + taken) };
            if taken > 0 {
                runs.push(Run::new(run_start, base + taken, self.tid));
            }
        }
        self.head
            .0
            .store(head.wrapping_add(taken), Ordering::Release);
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

/// A test's pseudo-random numbers (xorshift64 from `seed`, not 0): each call a number below its
/// argument.
#[cfg(test)]
pub(crate) fn below_from(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |below| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot_at(t_ns: u64, addr: u64) -> Slot {
        Slot {
            t_ns,
            addr,
            ..Slot::default()
        }
    }

    /// (thread, time, addr) of every slot, as `for_each_in_time_order` writes them.
    fn merged(batch: &[Slot], runs: &[Run]) -> Vec<(u32, u64, u64)> {
        let mut keys = Vec::new();
        let mut out = Vec::new();
        for_each_in_time_order(batch, runs, &mut keys, |tid, slot| {
            out.push((tid, slot.t_ns, slot.addr))
        });
        assert!(keys.len() <= batch.len());
        out
    }

    /// What the writer did before: a stable sort of (thread, slot) by time.
    fn stable_sorted(batch: &[Slot], runs: &[Run]) -> Vec<(u32, u64, u64)> {
        let mut all: Vec<(u32, u64, u64)> = runs
            .iter()
            .flat_map(|run| {
                batch[run.start as usize..run.end as usize]
                    .iter()
                    .map(move |slot| (run.tid, slot.t_ns, slot.addr))
            })
            .collect();
        all.sort_by_key(|&(_, t_ns, _)| t_ns);
        all
    }

    #[test]
    fn drain_splits_a_ring_where_its_times_go_back() {
        let ring = Ring::new(7, 8).expect("ring");
        for (t_ns, addr) in [(10, 1), (20, 2), (15, 3), (15, 4), (30, 5), (40, 6)] {
            assert!(ring.push(&slot_at(t_ns, addr)));
        }
        let mut batch = vec![slot_at(1, 99)];
        let mut runs = vec![Run::new(0, 1, 3)];
        ring.drain_before(35, &mut batch, &mut runs, usize::MAX, usize::MAX);
        let addrs: Vec<u64> = batch.iter().map(|slot| slot.addr).collect();
        assert_eq!(addrs, [99, 1, 2, 3, 4, 5]);
        assert_eq!(
            runs,
            [Run::new(0, 1, 3), Run::new(1, 3, 7), Run::new(3, 6, 7)]
        );
        assert!(!ring.is_empty());
        // The rest and more, across the ring's wrap, up to the slot limit.
        for (t_ns, addr) in [(50, 7), (60, 8), (70, 9)] {
            assert!(ring.push(&slot_at(t_ns, addr)));
        }
        batch.clear();
        runs.clear();
        ring.drain_before(u64::MAX, &mut batch, &mut runs, 4, usize::MAX);
        let addrs: Vec<u64> = batch.iter().map(|slot| slot.addr).collect();
        assert_eq!(addrs, [6, 7, 8, 9]);
        assert_eq!(runs, [Run::new(0, 4, 7)]);
        assert!(ring.is_empty());
        // A run limit stops the drain before a slot that would begin one more run.
        for (t_ns, addr) in [(90, 10), (5, 11)] {
            assert!(ring.push(&slot_at(t_ns, addr)));
        }
        batch.clear();
        runs.clear();
        ring.drain_before(u64::MAX, &mut batch, &mut runs, usize::MAX, 1);
        let addrs: Vec<u64> = batch.iter().map(|slot| slot.addr).collect();
        assert_eq!(addrs, [10]);
        assert_eq!(runs, [Run::new(0, 1, 7)]);
        ring.drain_before(u64::MAX, &mut batch, &mut runs, usize::MAX, usize::MAX);
        assert_eq!(runs, [Run::new(0, 1, 7), Run::new(1, 2, 7)]);
        assert_eq!(batch[1].addr, 11);
        assert!(ring.is_empty());
    }

    #[test]
    fn merge_is_the_stable_sort_by_time() {
        // Runs of 1 to 40 threads' slots with few distinct times (many ties), as the rings
        // drain them; every merge path (runs in order, a scan of up to 8 runs, sorted keys).
        let mut next = below_from(0x9e37_79b9_7f4a_7c15);
        for round in 0..2000 {
            let threads = 1 + next(if round % 2 == 0 { 9 } else { 40 }) as u32;
            let mut batch = Vec::new();
            let mut runs = Vec::new();
            for tid in 0..threads {
                let len = next(12) as usize;
                if len == 0 {
                    continue;
                }
                let start = batch.len();
                let mut t_ns = next(20);
                for _ in 0..len {
                    t_ns += next(3);
                    batch.push(slot_at(t_ns, batch.len() as u64));
                }
                runs.push(Run::new(start, batch.len(), 100 + tid));
            }
            if round % 3 == 0 {
                // Runs that follow each other in time.
                let mut t_ns = 0;
                for slot in batch.iter_mut() {
                    t_ns += next(2);
                    slot.t_ns = t_ns;
                }
            }
            assert_eq!(
                merged(&batch, &runs),
                stable_sorted(&batch, &runs),
                "round {round}"
            );
        }
    }
}
