//! Fast native stack walking with cached DWARF unwind rules (`framehop`).
//!
//! libgcc's `_Unwind_Backtrace` re-reads the unwind tables for every frame (about 130 ns a
//! frame here); framehop evaluates a return address's rule once and keeps it in a per-thread
//! cache, so a repeated call path costs a few nanoseconds a frame. The unwinder reads the
//! tables straight from the loaded objects' memory (`PT_GNU_EH_FRAME`), and is rebuilt when
//! the dynamic loader reports objects loaded or unloaded. Stack reads are bounds-checked
//! against the thread's stack, so a corrupt frame ends the walk instead of faulting.
//!
//! On top of that, each thread keeps its last walks with every stack word they read: a call
//! from the same place whose stack still holds those words has the same frames, and checking
//! the words costs a load each, where walking costs a rule lookup and its evaluation per frame
//! (`scripts/bench-peers.sh`, 30 frames: 414 -> 188 ns of added CPU per event). A walk that
//! does not replay whole still stops at the first frame where it reaches the state one of the
//! last walks reached, with every word that walk read from there on unchanged, and takes the
//! rest of its frames from it: in PyTorch's training steps consecutive allocations come from
//! different operators, but the stack outside the operator's call is often the one the last
//! allocation walked (a suffix replay, [`SuffixMatch`]).

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};

/// Bytes of a loaded object, valid while the object stays loaded.
#[derive(Clone, Copy, Default)]
pub struct Loaded(&'static [u8]);

impl Deref for Loaded {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0
    }
}

type ProcessUnwinder = UnwinderX86_64<Loaded>;

/// Stack words one walk may read and remember: each frame's step reads at most two (the
/// return address and a saved frame pointer).
const MEMO_READS: usize = 2 * MEMO_FRAMES + 8;
/// Frames one walk may remember (the callers ask for at most 256 + 16).
const MEMO_FRAMES: usize = 288;
/// Walks a thread remembers, to replay whole: on the training steps 35% of the allocations
/// replay one of the last 16 walks, 17% the last one.
const REMEMBERED: usize = 16;
/// The newest walks a fresh walk may join part-way: checking one costs a few instructions a
/// frame walked, and older ones add little (the frames a fresh walk shares with them it
/// mostly shares with the newest too: on the training steps, joining the newest one or two
/// walked as many frames, framehop's rule evaluation 4.31 M and 4.30 M instructions).
const JOINABLE: usize = 1;

/// Slots in one framehop rule cache (fixed inside the crate, `rule_cache.rs`: direct-mapped,
/// slot `address % 509`).
const FRAMEHOP_SLOTS: usize = 509;
/// Groups of two framehop caches a thread keeps: see [`RuleBanks`].
const BANK_PAIRS: usize = 8;

/// framehop's rule cache, made larger and two-way set-associative from the outside.
///
/// One framehop cache holds a rule per slot `address % 509`; a training step's walks cross
/// some 400 distinct return addresses on one thread, so hot ones share slots and evict each
/// other on every walk, and each miss re-parses DWARF CFI (gimli: most of a walk's cost).
/// framehop has no API to read or insert a rule, nor to size its cache, but `unwind_frame`
/// takes the cache to use per frame: here an address picks a pair of caches by
/// `(address / 509) % BANK_PAIRS` (a set of `509 * BANK_PAIRS`), and one of the two by the
/// tags kept here: the way whose framehop slot last looked this address up, or else the
/// pair's least recently used way. framehop checks its own slot's address and modules
/// generation on every lookup, so a tag that is stale only costs a miss, never a wrong rule.
/// Memory: `2 * BANK_PAIRS` framehop caches (8 KiB of slots each, and a gimli context) and
/// 17 bytes of tags a set (68 KiB): about 200 KiB for a thread that gets them.
struct RuleBanks {
    caches: Box<[CacheX86_64]>,
    /// The address each framehop slot last looked up: `tags[way][pair * 509 + slot]`.
    tags: [Box<[u64]>; 2],
    /// Which way of each set served last (0 or 1).
    recent: Box<[u8]>,
}

impl RuleBanks {
    fn new() -> RuleBanks {
        let sets = BANK_PAIRS * FRAMEHOP_SLOTS;
        RuleBanks {
            caches: (0..2 * BANK_PAIRS).map(|_| CacheX86_64::new()).collect(),
            tags: [
                vec![0; sets].into_boxed_slice(),
                vec![0; sets].into_boxed_slice(),
            ],
            recent: vec![0; sets].into_boxed_slice(),
        }
    }

    /// The framehop cache to unwind the frame at `lookup` (its lookup address) with.
    fn for_address(&mut self, lookup: u64) -> &mut CacheX86_64 {
        let slot = (lookup % FRAMEHOP_SLOTS as u64) as usize;
        let pair = (lookup / FRAMEHOP_SLOTS as u64 % BANK_PAIRS as u64) as usize;
        let set = pair * FRAMEHOP_SLOTS + slot;
        let way = if self.tags[0][set] == lookup {
            0
        } else if self.tags[1][set] == lookup {
            1
        } else {
            let lru = 1 - self.recent[set] as usize;
            self.tags[lru][set] = lookup;
            lru
        };
        self.recent[set] = way as u8;
        &mut self.caches[2 * pair + way]
    }
}

/// Slot conflicts in a thread's first framehop cache after which it gets [`RuleBanks`]: a
/// thread that walks a few stacks keeps costing one 8 KiB cache (100 short-lived threads
/// alive at once, `tests/tests/shim_memory.rs`), one whose walks thrash it gets the banks.
const CONFLICTS_BEFORE_BANKS: u64 = 64;

/// A thread's unwinding state: framehop's rule caches, and its last walks.
pub struct ThreadCache {
    /// The rule cache while the thread's walks fit it.
    rules: CacheX86_64,
    /// The larger one, once `rules` has had [`CONFLICTS_BEFORE_BANKS`] slot conflicts.
    banks: Option<Box<RuleBanks>>,
    /// The last walks, a ring: the newest is `walks[last]`, the oldest's buffers take the
    /// next fresh walk. Each grows to the walks it holds (nothing for a thread that never
    /// walks more than a few stacks).
    walks: [Walk; REMEMBERED],
    last: usize,
}

impl ThreadCache {
    pub fn new() -> ThreadCache {
        ThreadCache {
            rules: CacheX86_64::new(),
            banks: None,
            walks: std::array::from_fn(|_| Walk::new()),
            last: 0,
        }
    }
}

impl Default for ThreadCache {
    fn default() -> Self {
        Self::new()
    }
}

/// framehop's state on reaching a frame: (ip, sp, bp). framehop's x86_64 registers hold 16
/// more, but its DWARF rules and its frame-pointer fallback (all a module built from
/// `.eh_frame` gets, [`module_of`]) read and write only these three, so the rest stay zero.
type FrameState = (u64, u64, u64);

/// A remembered walk: where it started, every stack word it read, what it found, and per
/// frame the state it reached the frame in and where that frame's step began reading.
///
/// A walk is a function of the unwinder (its rules), the registers it starts from, the
/// read bounds, the frame limit and the words it reads; when all of them are the same, it
/// finds the same frames. Comparing the words costs one load per word, where walking again
/// costs a rule lookup and its evaluation per frame (a hot allocation site is walked from
/// the same place, through the same frames, on every call). The same holds from any frame
/// on: a walk that reaches a state this walk reached at frame `j`, with the words this walk
/// read from frame `j` on still in place, continues with this walk's frames from `j`
/// ([`SuffixMatch`]).
struct Walk {
    valid: bool,
    unwinder: *const ProcessUnwinder,
    /// (ip, sp, bp) at the start.
    start: FrameState,
    bounds: (u64, u64),
    capacity: usize,
    /// (address, word read); a read refused by the bounds check is not kept (the same
    /// address is refused again with the same bounds).
    reads: Vec<(u64, u64)>,
    frames: Vec<u64>,
    /// Per frame: the state the walk reached it in, and the index in `reads` of the first
    /// word its step read.
    states: Vec<(FrameState, u32)>,
    /// The walk stopped at `capacity` frames, not at the end of the stack: what lies
    /// beyond its last frame is not known.
    truncated: bool,
    /// Names this walk's result among every walk remembered in the process ([`SERIAL`]).
    serial: u64,
}

/// The last serial number given to a remembered walk: a caller that kept what a walk found
/// under its serial needs no copy of the frames when the next walk replays the same one.
static SERIAL: AtomicU64 = AtomicU64::new(0);

impl Walk {
    fn new() -> Walk {
        Walk {
            valid: false,
            unwinder: std::ptr::null(),
            start: (0, 0, 0),
            bounds: (0, 0),
            capacity: 0,
            reads: Vec::new(),
            frames: Vec::new(),
            states: Vec::new(),
            truncated: false,
            serial: 0,
        }
    }

    /// Whether this walk was made with the same rules, bounds and frame limit.
    fn comparable(
        &self,
        unwinder: *const ProcessUnwinder,
        bounds: (u64, u64),
        capacity: usize,
    ) -> bool {
        self.valid
            && self.unwinder == unwinder
            && self.bounds == bounds
            && self.capacity == capacity
    }

    /// The frame count if a walk from `start` would find what this one found.
    fn replay(
        &self,
        unwinder: *const ProcessUnwinder,
        start: FrameState,
        bounds: (u64, u64),
        capacity: usize,
    ) -> Option<usize> {
        if !self.comparable(unwinder, bounds, capacity) || self.start != start {
            return None;
        }
        // Eight words at a time, or-ing their differences: one branch per eight, not per word.
        // SAFETY: each address passed the bounds check of the thread's own stack (same
        // bounds), so it is mapped; it is read as the walk would read it.
        let differ = |reads: &[(u64, u64)]| {
            reads.iter().fold(0, |differ, &(addr, word)| {
                differ | (unsafe { (addr as *const u64).read_volatile() } ^ word)
            })
        };
        let mut chunks = self.reads.chunks_exact(8);
        for chunk in &mut chunks {
            if differ(chunk) != 0 {
                return None;
            }
        }
        (differ(chunks.remainder()) == 0).then_some(self.frames.len())
    }
}

/// A fresh walk's search for the point where it joins one of the last walks.
///
/// That walk's frames are visited in the order of their stack pointers (each step moves it
/// up; a frame out of that order is only never joined), with one cursor for the whole walk:
/// no search per frame. Where the states are equal, that walk's words from that frame on are
/// compared with memory, from the outermost down, so that a difference found rules out every
/// frame at or inside it and a range found equal is not compared again: at most one load per
/// remembered word per walk.
struct SuffixMatch {
    /// The next of the remembered walk's frames to consider (frame 0 is its start, never
    /// joined).
    cursor: usize,
    /// Its reads from here on are equal to memory.
    equal_from: usize,
    /// Its reads up to here (exclusive) are not all equal to memory.
    differ_below: usize,
    /// The stack pointer of the frame under the cursor (`u64::MAX` past its last frame): a
    /// state below it joins nothing, at the cost of one comparison.
    cursor_sp: u64,
}

impl SuffixMatch {
    fn new(last: &Walk) -> SuffixMatch {
        SuffixMatch {
            cursor: 1,
            equal_from: last.reads.len(),
            differ_below: 0,
            cursor_sp: last.states.get(1).map_or(u64::MAX, |state| state.0.1),
        }
    }

    /// The frame of `last` (the remembered walk) whose remaining walk is exactly what a walk
    /// reaching `state` with `count` frames written would find: the state is the same, and so
    /// is every word `last` read from there on. The rules, bounds and frame limit are the
    /// same ([`Walk::comparable`]).
    fn join(&mut self, last: &Walk, state: FrameState, count: usize) -> Option<usize> {
        let sp = state.1;
        if sp < self.cursor_sp {
            return None;
        }
        while self.cursor < last.states.len() && last.states[self.cursor].0.1 < sp {
            self.cursor += 1;
        }
        let at = self.cursor;
        self.cursor_sp = last.states.get(at).map_or(u64::MAX, |state| state.0.1);
        let &(their_state, reads_from) = last.states.get(at)?;
        // A walk cut at the frame limit is known only as far as it went: this walk may join it
        // only at a depth no smaller than its own there (then it reaches the limit no later).
        if their_state != state || (last.truncated && count < at) {
            return None;
        }
        let reads_from = reads_from as usize;
        if reads_from < self.differ_below {
            return None;
        }
        while self.equal_from > reads_from {
            let (addr, word) = last.reads[self.equal_from - 1];
            // SAFETY: as in `Walk::replay`: in the thread's own stack, within the same bounds.
            if unsafe { (addr as *const u64).read_volatile() } != word {
                self.differ_below = self.equal_from;
                return None;
            }
            self.equal_from -= 1;
        }
        Some(at)
    }
}

/// The unwinder for the current set of loaded objects. Replaced ones are leaked on purpose:
/// another thread may still be walking with them, and they change only on dlopen/dlclose.
static CURRENT: AtomicPtr<ProcessUnwinder> = AtomicPtr::new(std::ptr::null_mut());
/// `dlpi_adds` / `dlpi_subs` the current unwinder was built for.
static BUILT_FOR: AtomicU64 = AtomicU64::new(u64::MAX);
/// When the loader counters were last looked at (ns), to check at most every 10 ms.
static LAST_CHECK: AtomicU64 = AtomicU64::new(0);
static REBUILD: crate::sync::Lock<()> = crate::sync::Lock::new(());

/// In a fork child: frees the rebuild lock, whoever held it in the parent.
///
/// # Safety
/// Only in a fork child's after-fork handler.
pub unsafe fn reset_in_fork_child() {
    unsafe { REBUILD.reset_in_fork_child(()) };
}
const CHECK_INTERVAL_NS: u64 = 10_000_000;

/// Walks the caller's stack into `frames` (return addresses, innermost first, starting with
/// the instruction pointer inside this function). Returns the count, 0 if walking failed, and
/// the serial number of the remembered walk that found them (0: not remembered). When that
/// serial is `known` (non-zero), the frames are the ones found under it before and are not
/// written again.
#[inline(never)]
pub fn walk(
    frames: &mut [MaybeUninit<u64>],
    cache: &mut ThreadCache,
    stack: (u64, u64),
    now_ns: u64,
    known: u64,
) -> (usize, u64) {
    let unwinder_ptr = current_unwinder(now_ns);
    let Some(unwinder) = (unsafe { unwinder_ptr.as_ref() }) else {
        return (0, 0);
    };
    let (ip, sp, bp): (u64, u64, u64);
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags)
        );
    }
    let (low, high) = if stack.0 <= sp && sp < stack.1 {
        stack
    } else {
        (sp, sp.saturating_add(1 << 20))
    };
    let capacity = frames.len();
    let bounds = (low, high);
    let start = (ip, sp, bp);
    let ThreadCache {
        rules,
        banks,
        walks,
        last,
    } = cache;
    let newest = *last;
    for age in 0..REMEMBERED {
        let remembered = &walks[(newest + REMEMBERED - age) % REMEMBERED];
        if let Some(count) = remembered.replay(unwinder_ptr, start, bounds, capacity) {
            if known == 0 || remembered.serial != known {
                for (out, &frame) in frames.iter_mut().zip(&remembered.frames[..count]) {
                    out.write(frame);
                }
            }
            return (count, remembered.serial);
        }
    }
    // Walk, noting every word read and each frame's state, for the next calls.
    // The oldest walk's buffers take this one; the others are searched for a join.
    let oldest = (newest + 1) % REMEMBERED;
    let mut next = std::mem::replace(&mut walks[oldest], Walk::new());
    next.valid = false;
    next.reads.clear();
    next.frames.clear();
    next.states.clear();
    let mut suffixes: [Option<(usize, SuffixMatch)>; JOINABLE] = std::array::from_fn(|age| {
        let index = (newest + REMEMBERED - age) % REMEMBERED;
        let walk = &walks[index];
        walk.comparable(unwinder_ptr, bounds, capacity)
            .then(|| (index, SuffixMatch::new(walk)))
    });
    let mut reads_fit = true;
    if banks.is_none() && rules.stats().miss_wrong_address_count >= CONFLICTS_BEFORE_BANKS {
        // Allocates, as the thread's first walk (this cache) and framehop's misses do.
        *banks = Some(Box::new(RuleBanks::new()));
    }
    // framehop's `iter_frames`, one frame at a time, each frame's rule from its cache.
    let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
    let mut address = FrameAddress::from_instruction_pointer(ip);
    let mut count = 0;
    let mut joined = None;
    while count < capacity {
        frames[count].write(address.address());
        next.states
            .push(((regs.ip(), regs.sp(), regs.bp()), next.reads.len() as u32));
        count += 1;
        if count == capacity {
            break;
        }
        let rules = match banks {
            Some(banks) => banks.for_address(address.address_for_lookup()),
            None => &mut *rules,
        };
        let reads = &mut next.reads;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            if addr < low || addr.saturating_add(8) > high || !addr.is_multiple_of(8) {
                return Err(());
            }
            let word = unsafe { (addr as *const u64).read() };
            if reads.len() < MEMO_READS {
                reads.push((addr, word));
            } else {
                reads_fit = false;
            }
            Ok(word)
        };
        match unwinder.unwind_frame(address, &mut regs, rules, &mut read_stack) {
            Ok(Some(return_address)) => match FrameAddress::from_return_address(return_address) {
                Some(caller) => address = caller,
                None => break,
            },
            _ => break,
        }
        let state = (regs.ip(), regs.sp(), regs.bp());
        joined = suffixes.iter_mut().flatten().find_map(|(index, suffix)| {
            let at = suffix.join(&walks[*index], state, count)?;
            Some((*index, at))
        });
        if joined.is_some() {
            break;
        }
    }
    if let Some((index, at)) = joined {
        let previous = &walks[index];
        // The rest of this walk is that walk's from frame `at`, up to the frame limit; the
        // remembered walk is this one's frames, states and reads followed by that one's.
        let tail = &previous.frames[at..];
        let take = tail.len().min(capacity - count);
        for (out, &frame) in frames[count..].iter_mut().zip(&tail[..take]) {
            out.write(frame);
        }
        let reads_from = previous.states[at].1 as usize;
        let tail_reads = &previous.reads[reads_from..];
        if next.reads.len() + tail_reads.len() <= MEMO_READS {
            let shift = next.reads.len() as i64 - reads_from as i64;
            next.states.extend(
                previous.states[at..at + take]
                    .iter()
                    .map(|&(state, from)| (state, (i64::from(from) + shift) as u32)),
            );
            next.reads.extend_from_slice(tail_reads);
        } else {
            reads_fit = false;
        }
        count += take;
    }
    if reads_fit && count <= MEMO_FRAMES {
        next.frames.extend(frames[..count].iter().map(|frame| {
            // SAFETY: the first `count` frames were written above.
            unsafe { frame.assume_init() }
        }));
        next.unwinder = unwinder_ptr;
        next.start = start;
        next.bounds = bounds;
        next.capacity = capacity;
        next.truncated = count == capacity;
        next.serial = SERIAL.fetch_add(1, Ordering::Relaxed) + 1;
        next.valid = true;
        let serial = next.serial;
        walks[oldest] = next;
        *last = oldest;
        return (count, serial);
    }
    walks[oldest] = next;
    (count, 0)
}

fn current_unwinder(now_ns: u64) -> *const ProcessUnwinder {
    let current = CURRENT.load(Ordering::Acquire);
    let last = LAST_CHECK.load(Ordering::Relaxed);
    if !current.is_null() && now_ns.saturating_sub(last) < CHECK_INTERVAL_NS {
        return current;
    }
    LAST_CHECK.store(now_ns, Ordering::Relaxed);
    let counters = loader_counters();
    if !current.is_null() && counters == BUILT_FOR.load(Ordering::Acquire) {
        return current;
    }
    let _rebuilding = REBUILD.lock();
    if counters == BUILT_FOR.load(Ordering::Acquire) {
        return CURRENT.load(Ordering::Acquire);
    }
    let fresh = Box::into_raw(Box::new(build()));
    CURRENT.store(fresh, Ordering::Release);
    BUILT_FOR.store(counters, Ordering::Release);
    fresh
}

/// The loader's load and unload counters, packed.
fn loader_counters() -> u64 {
    let mut counters = 0u64;
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> i32 {
        let info = unsafe { &*info };
        unsafe { *(data as *mut u64) = (info.dlpi_adds << 32) ^ info.dlpi_subs };
        1
    }
    unsafe { libc::dl_iterate_phdr(Some(first), (&raw mut counters).cast::<c_void>()) };
    counters
}

fn build() -> ProcessUnwinder {
    let mut unwinder = ProcessUnwinder::new();
    let mut modules: Vec<Module<Loaded>> = Vec::new();
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> i32 {
        let modules = unsafe { &mut *(data as *mut Vec<Module<Loaded>>) };
        if let Some(module) = module_of(unsafe { &*info }) {
            modules.push(module);
        }
        0
    }
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut modules).cast::<c_void>()) };
    for module in modules {
        unwinder.add_module(module);
    }
    unwinder
}

fn slice(avma: u64, len: u64) -> Loaded {
    Loaded(unsafe { std::slice::from_raw_parts(avma as *const u8, len as usize) })
}

/// Describes one loaded object to framehop: its executable range and its unwind tables.
fn module_of(info: &libc::dl_phdr_info) -> Option<Module<Loaded>> {
    let bias = info.dlpi_addr;
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let loads: Vec<&libc::Elf64_Phdr> =
        phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD).collect();
    let start = loads.iter().map(|p| p.p_vaddr).min()?;
    let end = loads.iter().map(|p| p.p_vaddr + p.p_memsz).max()?;
    let text = loads.iter().find(|p| p.p_flags & libc::PF_X != 0)?;
    let hdr = phdrs.iter().find(|p| p.p_type == libc::PT_GNU_EH_FRAME)?;
    // .eh_frame_hdr: version, eh_frame_ptr encoding, fde count encoding, table encoding, then
    // eh_frame_ptr. Linkers write it pc-relative sdata4 (0x1b); anything else is skipped.
    let hdr_avma = bias.wrapping_add(hdr.p_vaddr);
    let header = unsafe { std::slice::from_raw_parts(hdr_avma as *const u8, 8) };
    if header[0] != 1 || header[1] != 0x1b {
        return None;
    }
    let offset = i32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let eh_frame_svma = (hdr.p_vaddr + 4).wrapping_add(offset as i64 as u64);
    // .eh_frame has no length in the program headers: it runs to the end of its segment.
    let segment = loads
        .iter()
        .find(|p| p.p_vaddr <= eh_frame_svma && eh_frame_svma < p.p_vaddr + p.p_memsz)?;
    let eh_frame_len = segment.p_vaddr + segment.p_filesz.min(segment.p_memsz) - eh_frame_svma;
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    let sections = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(text.p_vaddr..text.p_vaddr + text.p_memsz),
        text: Some(slice(bias.wrapping_add(text.p_vaddr), text.p_memsz)),
        eh_frame_svma: Some(eh_frame_svma..eh_frame_svma + eh_frame_len),
        eh_frame: Some(slice(bias.wrapping_add(eh_frame_svma), eh_frame_len)),
        eh_frame_hdr_svma: Some(hdr.p_vaddr..hdr.p_vaddr + hdr.p_memsz),
        eh_frame_hdr: Some(slice(hdr_avma, hdr.p_memsz)),
        ..Default::default()
    };
    Some(Module::new(
        name,
        bias.wrapping_add(start)..bias.wrapping_add(end),
        bias,
        sections,
    ))
}

/// The calling thread's stack range, for bounds-checking reads.
pub fn thread_stack_bounds() -> (u64, u64) {
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, 0);
        }
        let mut base: *mut c_void = std::ptr::null_mut();
        let mut size: usize = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut base, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 {
            return (0, 0);
        }
        (base as u64, base as u64 + size as u64)
    }
}
