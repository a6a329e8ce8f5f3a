//! Native stack capture and interning: each distinct stack is written to the log once, as a
//! `StackDef`, and events carry its id. A per-thread cache answers repeated stacks without
//! taking any lock; the shared table is sharded.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use vramshim_format::{Frame, ModuleDef, Record, StackDef};

use crate::config::StackMode;
use crate::sync::Lock;
use crate::unwind::WalkFrom;
use crate::{python, writer};

const MAX_FRAMES: usize = 256;
/// Frames a native walk may find: the frames kept, and room for the shim's own above them.
const WALK_FRAMES: usize = MAX_FRAMES + 16;
const CACHE_SLOTS: usize = 256;
const _: () = assert!(CACHE_SLOTS.is_power_of_two());
const SHARDS: usize = 16;

#[derive(Clone, Copy)]
struct CacheEntry {
    hash: u64,
    id: u32,
    generation: u32,
}

/// Recently seen stacks of one thread: hash → id. A 64-bit hash of the whole frame list
/// decides a hit (a collision needs ~2^32 distinct stacks in one thread's 256 slots).
pub struct ThreadCache {
    entries: [CacheEntry; CACHE_SLOTS],
}

impl ThreadCache {
    pub const fn new() -> ThreadCache {
        ThreadCache {
            entries: [CacheEntry {
                hash: 0,
                id: 0,
                generation: 0,
            }; CACHE_SLOTS],
        }
    }
}

impl Default for ThreadCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Keys are already hashes: use them as they are.
#[derive(Default)]
struct IdentityHasher(u64);

impl std::hash::Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 << 8) | u64::from(byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

type Shard =
    Lock<HashMap<u64, Vec<(Box<[u64]>, u32)>, std::hash::BuildHasherDefault<IdentityHasher>>>;

static SHARDS_TABLE: [Shard; SHARDS] =
    [const { Lock::new(HashMap::with_hasher(std::hash::BuildHasherDefault::new())) }; SHARDS];
static NEXT_ID: AtomicU32 = AtomicU32::new(1);
/// Bumped after fork: the child's log must define its stacks again.
static GENERATION: AtomicU32 = AtomicU32::new(1);

/// The shim's own code range: frames there are dropped from the top of every stack.
static SHIM_START: AtomicUsize = AtomicUsize::new(0);
static SHIM_END: AtomicUsize = AtomicUsize::new(0);

/// Modules already written to the log, as sorted (start, end) ranges.
static MODULES: Lock<Vec<(u64, u64)>> = Lock::new(Vec::new());

/// Key words a stack may take: native frames, then Python frames and their tag word.
const KEY_WORDS: usize = MAX_FRAMES + python::MAX_PY_FRAMES * python::WORDS_PER_FRAME + 1;
// A native walk uses the key's first `WALK_FRAMES` words (the Python part is written after it).
const _: () = assert!(KEY_WORDS >= WALK_FRAMES);

/// Captures the calling thread's stack as `mode` asks (native frames innermost first, shim
/// frames removed; then its Python frames) and returns its id (0 if nothing was captured).
/// `python` mode falls back to the native stack where the thread runs no Python code. The
/// native walk starts at `from` (an entry point's caller, or inside the shim: its frames are
/// dropped either way).
pub fn capture(mode: StackMode, max_frames: usize, now_ns: u64, from: WalkFrom) -> u32 {
    let Some(last) = last_key() else {
        return 0;
    };
    let valid = last.count > 0
        && last.mode == mode
        && last.generation == GENERATION.load(Ordering::Relaxed);
    let known = if valid {
        (last.native_serial, last.python_serial)
    } else {
        (0, 0)
    };
    let kept = (last.native_words, last.python_words, last.id);
    // The new key is written over the last one, in place: a part the same as the last key's
    // is then neither written nor copied in, nor the whole key copied back. Until it is
    // complete the buffer holds no key.
    last.count = 0;
    let key = &mut last.words[..];
    // The Python part: (words, serial of the walk that found it, the same as the last key's
    // part and so not written).
    let mut native = NativePart::NONE;
    let mut python = (0, 0, false);
    match mode {
        StackMode::Python => {
            // Either part starts the key, as in the last one.
            python = python_part(key, known.1);
            if python.0 == 0 {
                native = native_part(&mut key[..WALK_FRAMES], max_frames, now_ns, known.0, from);
            }
        }
        StackMode::Mixed => {
            native = native_part(&mut key[..WALK_FRAMES], max_frames, now_ns, known.0, from);
            let native_same = native.same || (valid && native.words == 0 && kept.0 == 0);
            // The last key's Python part is in place only behind the same native part (a
            // native walk writes past the frames it keeps).
            let (native_words, python_known) = if native_same {
                (kept.0, known.1)
            } else {
                (native.words, 0)
            };
            python = python_part(&mut key[native_words..], python_known);
        }
        _ => native = native_part(&mut key[..WALK_FRAMES], max_frames, now_ns, known.0, from),
    }
    let serials = (native.serial, python.1);
    if valid {
        let native_same = native.same || (native.words == 0 && kept.0 == 0);
        let python_same = python.2 || (python.0 == 0 && kept.1 == 0);
        if native_same && python_same {
            // The native part as the last key had it, in `words` or not.
            last.count = kept.0 + kept.1;
            (last.native_serial, last.python_serial) = serials;
            return kept.2;
        }
    }
    if native.same {
        native.words = kept.0;
        native.in_place = last.native_in_place;
    }
    let count = native.words + python.0;
    if count == 0 {
        return 0;
    }
    // Each part's hash: the last key's where the same walk found it, a remembered walk's
    // where one was replayed whole, else hashed here (the native frames fetched into the key
    // first if a replay did not write them).
    let native_hash = if native.same {
        last.native_hash
    } else if let Some(hash) = last.native_hashes.known(native.serial, native.words) {
        hash
    } else {
        if !native.in_place {
            if !fetch_native(native.serial, &mut last.words[..native.words]) {
                return 0;
            }
            native.in_place = true;
        }
        let hash = part_hash(written(&last.words, native.words));
        last.native_hashes.keep(native.serial, native.words, hash);
        hash
    };
    let python_words = written(&last.words[native.words..], python.0);
    let python_hash = if valid && python.1 != 0 && python.1 == known.1 {
        last.python_hash
    } else {
        last.python_hashes.get(python.1, python_words)
    };
    let hash = key_hash(native_hash, python_hash);
    let id = match cached_id(hash) {
        Some(id) => id,
        None => {
            // Interning compares or stores the whole key.
            if !native.in_place {
                if !fetch_native(native.serial, &mut last.words[..native.words]) {
                    return 0;
                }
                native.in_place = true;
            }
            intern_new(written(&last.words, count), hash)
        }
    };
    last.count = count;
    last.native_in_place = native.in_place;
    last.native_words = native.words;
    last.python_words = python.0;
    last.id = id;
    last.generation = GENERATION.load(Ordering::Relaxed);
    last.mode = mode;
    (last.native_serial, last.python_serial) = serials;
    (last.native_hash, last.python_hash) = (native_hash, python_hash);
    id
}

/// A thread's last captured stack key and its id: a hot allocation site captures the same
/// stack event after event. With the serial numbers of the walks that found its parts, a
/// walk that replays the same remembered walk gives that part without writing it, and with
/// each part's hash, a part the same as the last key's is not hashed again.
struct LastKey {
    /// The key's words: the next capture writes its key here (uninitialised past `count`,
    /// and while a capture runs).
    words: Box<[MaybeUninit<u64>]>,
    /// Words of the key (0: none kept).
    count: usize,
    /// The native frames' words at the start of `words`; the Python part follows.
    native_words: usize,
    /// Whether `words` holds the native frames: not when the walk of `native_serial` was
    /// replayed and nothing needed them (they are the first `native_words` of its frames,
    /// [`fetch_native`], while the next capture replays it).
    native_in_place: bool,
    python_words: usize,
    id: u32,
    /// [`GENERATION`] when `id` was given (a fork child must define its stacks again).
    generation: u32,
    mode: StackMode,
    /// Serials of the native and the Python walks that found the parts (0: none).
    native_serial: u64,
    python_serial: u64,
    /// [`part_hash`] of each part.
    native_hash: u64,
    python_hash: u64,
    /// The native parts' hashes by the serials of the remembered walks that found them.
    native_hashes: PartHashes,
    /// The Python parts' hashes, the same way (Python walks are remembered by their own
    /// serials, [`python::walk`]).
    python_hashes: PartHashes,
}

/// This thread's last key (allocated on first use; `None` only without thread-local
/// storage).
#[inline]
fn last_key() -> Option<&'static mut LastKey> {
    THREAD
        .try_with(|thread| {
            let mut last = thread.last_key.get();
            if last.is_null() {
                last = new_last_key();
                thread.last_key.set(last);
            }
            // SAFETY: this thread's own, freed only at its exit; one capture at a time
            // (hooks do not nest on a thread).
            unsafe { &mut *last }
        })
        .ok()
}

/// An empty [`LastKey`] on the heap (its buffers allocated there directly, not built on the
/// hook's stack).
#[cold]
#[inline(never)]
fn new_last_key() -> *mut LastKey {
    Box::into_raw(Box::new(LastKey {
        words: Box::new_uninit_slice(KEY_WORDS),
        count: 0,
        native_words: 0,
        native_in_place: true,
        python_words: 0,
        id: 0,
        generation: 0,
        mode: StackMode::None,
        native_serial: 0,
        python_serial: 0,
        native_hash: 0,
        python_hash: 0,
        native_hashes: PartHashes {
            slots: vec![(0, 0, 0); PART_HASH_SLOTS].into_boxed_slice(),
        },
        python_hashes: PartHashes {
            slots: vec![(0, 0, 0); PART_HASH_SLOTS].into_boxed_slice(),
        },
    }))
}

/// Slots of a [`PartHashes`]: four times the walks a thread remembers, whose serials
/// interleave with other threads'.
const PART_HASH_SLOTS: usize = 1024;

/// Hashes of a key's parts by the serial of the remembered walk that found them (a serial
/// names one walk's frames for good), direct-mapped: most allocations replay a remembered
/// walk whole, and its frames then need no hashing. A Python part (its frames and tag word)
/// is kept too: with a table of remembered Python walks, a replay's serial is mostly not the
/// last key's (1,730 Python parts hashed in the training steps' 2,346 allocations).
struct PartHashes {
    /// (serial, words, hash); serial 0: empty. [`PART_HASH_SLOTS`] of them (24 KiB).
    slots: Box<[(u64, usize, u64)]>,
}

impl PartHashes {
    /// The [`part_hash`] of `words`, the part the walk of `serial` (0: none remembered)
    /// found.
    fn get(&mut self, serial: u64, words: &[u64]) -> u64 {
        if let Some(hash) = self.known(serial, words.len()) {
            return hash;
        }
        let hash = part_hash(words);
        self.keep(serial, words.len(), hash);
        hash
    }

    /// The hash kept for the first `words` words the walk of `serial` found, if any.
    fn known(&self, serial: u64, words: usize) -> Option<u64> {
        let slot = &self.slots[serial as usize % PART_HASH_SLOTS];
        (serial != 0 && slot.0 == serial && slot.1 == words).then_some(slot.2)
    }

    /// Keeps `hash` for the first `words` words the walk of `serial` (0: none remembered,
    /// then nothing is kept) found.
    fn keep(&mut self, serial: u64, words: usize, hash: u64) {
        if serial != 0 {
            self.slots[serial as usize % PART_HASH_SLOTS] = (serial, words, hash);
        }
    }
}

/// One part of a key (its native frames, or its Python frames and tag word) hashed; 0 for
/// none.
fn part_hash(words: &[u64]) -> u64 {
    if words.is_empty() {
        0
    } else {
        hash_frames(words)
    }
}

/// A key's hash from its parts' (a key's Python part is known from its last word, so this is
/// a function of its words).
fn key_hash(native: u64, python: u64) -> u64 {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    (native.rotate_left(5) ^ python).wrapping_mul(K) | 1
}

/// Writes the thread's Python frames and their tag word into `key` (which has room for
/// [`python::MAX_PY_FRAMES`] frames and the tag): (words written, 0 if no Python; the walk's
/// serial; whether they are the last key's Python part, then not written).
fn python_part(key: &mut [MaybeUninit<u64>], known: u64) -> (usize, u64, bool) {
    let frames_room = key.len().saturating_sub(1);
    let (py_count, serial) = python::walk(&mut key[..frames_room], known);
    if py_count == 0 {
        return (0, serial, false);
    }
    let words = py_count * python::WORDS_PER_FRAME;
    if known != 0 && serial == known {
        return (words + 1, serial, true);
    }
    key[words].write(python::PY_KEY_TAG | py_count as u64);
    (words + 1, serial, false)
}

/// A key's native part as a capture found it.
#[derive(Clone, Copy)]
struct NativePart {
    /// Its frames (0: none; also while `same`).
    words: usize,
    /// The serial of the remembered walk that found them (0: none).
    serial: u64,
    /// They are the last key's native part (found by the same walk), so not written.
    same: bool,
    /// They are in the key's words: not where a remembered walk was replayed whole, and
    /// they are then the first `words` of its frames ([`fetch_native`]).
    in_place: bool,
}

impl NativePart {
    const NONE: NativePart = NativePart {
        words: 0,
        serial: 0,
        same: false,
        in_place: true,
    };
}

/// The native part into `frames`, or where a remembered walk was replayed whole, only its
/// serial and length.
fn native_part(
    frames: &mut [MaybeUninit<u64>],
    max_frames: usize,
    now_ns: u64,
    known: u64,
    from: WalkFrom,
) -> NativePart {
    let (words, serial, in_place) = capture_native(frames, max_frames, now_ns, known, from);
    NativePart {
        words,
        serial,
        same: known != 0 && serial == known,
        in_place,
    }
}

/// Writes the first `into.len()` frames of the remembered walk of `serial` (which this
/// capture's walk replayed: nothing has walked since on this thread) into `into`. False only
/// if that walk is not there, which cannot happen (the capture then records no stack).
#[cold]
#[inline(never)]
fn fetch_native(serial: u64, into: &mut [MaybeUninit<u64>]) -> bool {
    let fetched = THREAD
        .try_with(|thread| {
            // SAFETY: this thread's own cache (allocated by its walk), one hook at a time.
            let Some(cache) = (unsafe { thread.unwind_cache.get().as_ref() }) else {
                return false;
            };
            match cache
                .frames_of(serial)
                .and_then(|frames| frames.get(..into.len()))
            {
                Some(frames) => {
                    for (out, &frame) in into.iter_mut().zip(frames) {
                        out.write(frame);
                    }
                    true
                }
                None => false,
            }
        })
        .unwrap_or(false);
    debug_assert!(fetched, "the replayed walk {serial} is gone");
    fetched
}

/// The first `count` words of `words`, which the caller has all written.
fn written(words: &[MaybeUninit<u64>], count: usize) -> &[u64] {
    let words = &words[..count];
    // SAFETY: each of these words was written; `MaybeUninit<u64>` has the layout of `u64`.
    unsafe { &*(words as *const [MaybeUninit<u64>] as *const [u64]) }
}

/// The native part: up to `max_frames` return addresses into `frames`; returns the count, the
/// serial of the remembered walk that found them (0: none) and whether they were written.
/// When that serial is `known`, nothing is written: the frames are the ones kept under it
/// (count 0). A walk from an entry point's caller that replays a remembered walk whole writes
/// nothing either: the frames are the first `count` of that walk's ([`fetch_native`]).
fn capture_native(
    frames: &mut [MaybeUninit<u64>],
    max_frames: usize,
    now_ns: u64,
    known: u64,
    from: WalkFrom,
) -> (usize, u64, bool) {
    let mut raw = [MaybeUninit::<u64>::uninit(); WALK_FRAMES];
    let max = max_frames.min(MAX_FRAMES).min(frames.len());
    let (shim_start, shim_end) = shim_range();
    let in_shim = |ip: u64| ip >= shim_start && ip < shim_end;
    // Fast path: cached unwind rules. A walk from here starts inside the shim; leave room for
    // the shim's own frames on top of the `max` frames kept. One from an entry point's caller
    // has none (its first frame is the caller's return address, and none is 0: a walk ends
    // at a null return address), so it writes its frames in place, not copied, and the first
    // `max` are kept. Both walk as far (`WALK_FRAMES`), not just `max` frames: a walk cut at
    // the frame limit can be joined only at its own depth or deeper, and the callers' walks
    // then joined so much less that they stepped 45% more frames (`max` 64).
    let direct = matches!(from, WalkFrom::Caller(_)) && frames.len() >= WALK_FRAMES;
    let walked = THREAD
        .try_with(|thread| {
            let mut cache = thread.unwind_cache.get();
            if cache.is_null() {
                cache = Box::into_raw(Box::new(crate::unwind::ThreadCache::new()));
                thread.unwind_cache.set(cache);
            }
            let mut bounds = thread.stack_bounds.get();
            if bounds == (0, 0) {
                bounds = crate::unwind::thread_stack_bounds();
                thread.stack_bounds.set(bounds);
            }
            let into = if direct {
                &mut frames[..WALK_FRAMES]
            } else {
                &mut raw[..]
            };
            // SAFETY: this thread's own cache, one hook at a time.
            let cache = unsafe { &mut *cache };
            let (walked, serial) = crate::unwind::walk(into, cache, bounds, now_ns, from);
            let written = cache.written();
            if !written && !direct && (known == 0 || serial != known) {
                // Shim frames to drop and a frame limit to apply: the frames are needed here.
                match cache.frames_of(serial) {
                    Some(found) if found.len() == walked => {
                        for (out, &frame) in raw.iter_mut().zip(found) {
                            out.write(frame);
                        }
                    }
                    _ => return (0, 0, true),
                }
            }
            (walked, serial, written)
        })
        .unwrap_or((0, 0, true));
    let (walked, serial, in_place) = walked;
    if known != 0 && serial == known {
        return (0, serial, false);
    }
    if direct && walked > 0 {
        return (walked.min(max), serial, in_place);
    }
    let raw = written(&raw, walked);
    let skip = raw.iter().take_while(|&&ip| in_shim(ip)).count();
    let mut count = 0;
    for &ip in raw[skip..].iter().take_while(|&&ip| ip != 0).take(max) {
        frames[count].write(ip);
        count += 1;
    }
    if count == 0 {
        // Objects without .eh_frame_hdr: the slow, general unwinder.
        count = capture_with_libgcc(&mut frames[..max], in_shim);
        return (count, 0, true);
    }
    (count, serial, true)
}

fn capture_with_libgcc(frames: &mut [MaybeUninit<u64>], in_shim: impl Fn(u64) -> bool) -> usize {
    let mut count = 0usize;
    let mut outside_shim = false;
    // libgcc's unwinder walks the loader's list through the exported `dl_iterate_phdr`.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as u64;
            // The unwinder ends some stacks with a null frame.
            if ip == 0 {
                return false;
            }
            if !outside_shim && in_shim(ip) {
                return true;
            }
            outside_shim = true;
            frames[count].write(ip);
            count += 1;
            count < frames.len()
        });
    }
    count
}

fn shim_range() -> (u64, u64) {
    let start = SHIM_START.load(Ordering::Relaxed);
    if start != 0 {
        return (start as u64, SHIM_END.load(Ordering::Relaxed) as u64);
    }
    let here = capture as *const c_void as u64;
    let range = modules()
        .into_iter()
        .find(|m| here >= m.start && here < m.end)
        .map_or((0, 0), |m| (m.start, m.end));
    SHIM_END.store(range.1 as usize, Ordering::Relaxed);
    SHIM_START.store(range.0 as usize, Ordering::Relaxed);
    range
}

fn hash_frames(frames: &[u64]) -> u64 {
    // FxHash-style mixing; frames are already well-distributed addresses. Four independent
    // lanes: one serial chain of multiplies was most of a capture's own time.
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let mix = |hash: u64, word: u64| (hash.rotate_left(5) ^ word).wrapping_mul(K);
    let mut lanes = [frames.len() as u64, 1, 2, 3];
    let mut chunks = frames.chunks_exact(4);
    for chunk in &mut chunks {
        for (lane, &word) in lanes.iter_mut().zip(chunk) {
            *lane = mix(*lane, word);
        }
    }
    for (lane, &word) in lanes.iter_mut().zip(chunks.remainder()) {
        *lane = mix(*lane, word);
    }
    let hash = lanes.iter().fold(0, |hash, &lane| mix(hash, lane));
    hash | 1
}

/// What a thread keeps for stack capture. `const`-initialised and free of `Drop`, so it stays
/// usable while the thread runs its TLS destructors (frameworks free CUDA memory there).
struct ThreadStacks {
    /// Recently interned stacks of this thread.
    stack_cache: UnsafeCell<ThreadCache>,
    /// This thread's cache of unwind rules (allocated on first use, freed at thread exit).
    unwind_cache: Cell<*mut crate::unwind::ThreadCache>,
    /// This thread's stack range (0, 0 = not known yet).
    stack_bounds: Cell<(u64, u64)>,
    /// This thread's last captured stack (allocated on first use, freed at thread exit).
    last_key: Cell<*mut LastKey>,
}

thread_local! {
    static THREAD: ThreadStacks = const {
        ThreadStacks {
            stack_cache: UnsafeCell::new(ThreadCache::new()),
            unwind_cache: Cell::new(std::ptr::null_mut()),
            stack_bounds: Cell::new((0, 0)),
            last_key: Cell::new(std::ptr::null_mut()),
        }
    };
}

/// Frees this thread's unwind cache and last stack (at thread exit).
pub fn release_thread_caches() {
    let _ = THREAD.try_with(|thread| {
        let cache = thread.unwind_cache.replace(std::ptr::null_mut());
        if !cache.is_null() {
            drop(unsafe { Box::from_raw(cache) });
        }
        python::release_thread_memo();
        let last = thread.last_key.replace(std::ptr::null_mut());
        if !last.is_null() {
            drop(unsafe { Box::from_raw(last) });
        }
    });
}

/// The id of the key of [`key_hash`] `hash` if this thread's cache has it.
#[inline]
fn cached_id(hash: u64) -> Option<u32> {
    let generation = GENERATION.load(Ordering::Relaxed);
    THREAD
        .try_with(|thread| {
            let cache = unsafe { &*thread.stack_cache.get() };
            let entry = cache.entries[cache_slot(hash)];
            (entry.hash == hash && entry.generation == generation).then_some(entry.id)
        })
        .ok()
        .flatten()
}

/// The id of `frames` (a whole key, of [`key_hash`] `hash`, not in this thread's cache:
/// [`cached_id`]), defining it in the log the first time it is seen.
fn intern_new(frames: &[u64], hash: u64) -> u32 {
    let generation = GENERATION.load(Ordering::Relaxed);
    let slot = cache_slot(hash);
    let id = intern_shared(hash, frames);
    let _ = THREAD.try_with(|thread| {
        let cache = unsafe { &mut *thread.stack_cache.get() };
        cache.entries[slot] = CacheEntry {
            hash,
            id,
            generation,
        };
    });
    id
}

/// The thread cache's slot of a key's hash: its top bits, the best mixed of a product's
/// ([`key_hash`]). Its low bit is always set: `hash % CACHE_SLOTS` used only the odd half of
/// the slots, and the training steps' ~200 stacks kept evicting each other there (~900
/// misses in 2,346 allocations, each the shared table's lock and a whole-key comparison; 4
/// with the top bits, as with 4,096 slots).
fn cache_slot(hash: u64) -> usize {
    (hash >> (64 - CACHE_SLOTS.trailing_zeros())) as usize
}
fn intern_shared(hash: u64, frames: &[u64]) -> u32 {
    let mut shard = SHARDS_TABLE[(hash >> 58) as usize % SHARDS].lock();
    let bucket = shard.entry(hash).or_default();
    if let Some((_, id)) = bucket.iter().find(|(known, _)| **known == *frames) {
        return *id;
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    bucket.push((frames.into(), id));
    // A key ends with its Python frames, then a tag word counting them.
    let py_count = match frames.last() {
        Some(&last) if last & python::PY_KEY_TAG == python::PY_KEY_TAG => {
            (last & 0xffff_ffff) as usize
        }
        _ => 0,
    };
    let py_words = py_count * python::WORDS_PER_FRAME;
    let native_count = frames
        .len()
        .saturating_sub(py_words + usize::from(py_count > 0));
    let (native, py) = frames.split_at(native_count);
    // Define the modules and code objects first, so a reader always knows where a stack's
    // frames point.
    define_modules(native);
    let mut defined: Vec<Frame> = native.iter().map(|&ip| Frame::Native(ip)).collect();
    for words in py[..py_words.min(py.len())].chunks_exact(python::WORDS_PER_FRAME) {
        defined.push(Frame::Python {
            code: python::code_id(words[0], words[1]),
            offset: (words[2] >> 1) as u32,
            entry: words[2] & 1 == 1,
        });
    }
    writer::define(Record::Stack(StackDef {
        id,
        frames: defined,
    }));
    id
}

/// Writes module definitions for any frame outside the modules written so far.
fn define_modules(frames: &[u64]) {
    let mut known = MODULES.lock();
    // Neighbouring frames mostly lie in one module: the range that covered the last frame is
    // tried before a search (a search a frame was ~40 instructions, ~4,000 a new stack).
    let mut last: (u64, u64) = (0, 0);
    let covered = |known: &Vec<(u64, u64)>, last: &mut (u64, u64), ip: u64| {
        if last.0 <= ip && ip < last.1 {
            return true;
        }
        let at = known.partition_point(|&(start, _)| start <= ip);
        match at.checked_sub(1).and_then(|at| known.get(at)) {
            Some(&range) if ip < range.1 => {
                *last = range;
                true
            }
            _ => false,
        }
    };
    if frames.iter().all(|&ip| covered(&known, &mut last, ip)) {
        return;
    }
    for module in modules() {
        let range = (module.start, module.end);
        if known.binary_search(&range).is_err() {
            let at = known.partition_point(|&r| r < range);
            known.insert(at, range);
            writer::define(Record::Module(module));
        }
    }
}

/// In a fork child: forgets every stack and module, so the child's log defines them again.
/// The parent's tables are leaked, not freed (a vanished thread may have been changing them);
/// plain stores only, so async-signal-safe.
///
/// # Safety
/// Only in a fork child's after-fork handler.
pub unsafe fn reset_in_fork_child() {
    for shard in &SHARDS_TABLE {
        unsafe {
            shard.reset_in_fork_child(HashMap::with_hasher(std::hash::BuildHasherDefault::new()))
        };
    }
    unsafe {
        MODULES.reset_in_fork_child(Vec::new());
        python::reset_in_fork_child();
        crate::unwind::reset_in_fork_child();
    }
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Every loaded object with its loadable range and build id.
pub fn modules() -> Vec<ModuleDef> {
    let mut found: Vec<ModuleDef> = Vec::new();
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> i32 {
        let found = unsafe { &mut *(data as *mut Vec<ModuleDef>) };
        let info = unsafe { &*info };
        let mut start = u64::MAX;
        let mut end = 0u64;
        let mut build_id = Vec::new();
        for i in 0..info.dlpi_phnum as usize {
            let phdr = unsafe { &*info.dlpi_phdr.add(i) };
            let seg_start = info.dlpi_addr.wrapping_add(phdr.p_vaddr);
            match phdr.p_type {
                libc::PT_LOAD => {
                    start = start.min(seg_start);
                    end = end.max(seg_start.wrapping_add(phdr.p_memsz));
                }
                libc::PT_NOTE if build_id.is_empty() => {
                    build_id = read_build_id(seg_start, phdr.p_memsz);
                }
                _ => {}
            }
        }
        if start >= end {
            return 0;
        }
        let path = if info.dlpi_name.is_null() {
            String::new()
        } else {
            unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
                .to_string_lossy()
                .into_owned()
        };
        // The main program has an empty name: use its real path.
        let path = if path.is_empty() {
            std::fs::read_link("/proc/self/exe")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default()
        } else {
            path
        };
        found.push(ModuleDef {
            path,
            load_bias: info.dlpi_addr,
            start,
            end,
            build_id,
        });
        0
    }
    // Through the exported `dl_iterate_phdr`, so it is gated around fork.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut found).cast::<c_void>()) };
    found
}

/// The GNU build id from a loaded PT_NOTE segment, if present.
fn read_build_id(start: u64, len: u64) -> Vec<u8> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let mut at = start;
    let end = start.saturating_add(len);
    while at + 12 <= end {
        let (name_size, desc_size, kind) = unsafe {
            let p = at as *const u32;
            (
                p.read_unaligned(),
                p.add(1).read_unaligned(),
                p.add(2).read_unaligned(),
            )
        };
        let name_at = at + 12;
        let desc_at = name_at + u64::from(name_size).next_multiple_of(4);
        let next = desc_at + u64::from(desc_size).next_multiple_of(4);
        if next > end {
            break;
        }
        if kind == NT_GNU_BUILD_ID && name_size == 4 {
            let name = unsafe { std::slice::from_raw_parts(name_at as *const u8, 4) };
            if name == b"GNU\0" {
                return unsafe {
                    std::slice::from_raw_parts(desc_at as *const u8, desc_size as usize)
                }
                .to_vec();
            }
        }
        at = next;
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_walks_hash_is_its_frames_hash() {
        let mut hashes = PartHashes {
            slots: vec![(0, 0, 0); PART_HASH_SLOTS].into_boxed_slice(),
        };
        let frames: Vec<u64> = (0..60).map(|i| 0x7f00_0000_1000 + i * 0x40).collect();
        let other: Vec<u64> = (0..60).map(|i| 0x7f00_0000_2000 + i * 0x40).collect();
        let hash = part_hash(&frames);
        // Unremembered (serial 0): hashed each time, never kept.
        assert_eq!(hashes.get(0, &other), part_hash(&other));
        assert_eq!(hashes.get(0, &frames), hash);
        // Kept under its serial: the same answer without the frames being read again.
        assert_eq!(hashes.get(7, &frames), hash);
        assert_eq!(hashes.slots[7], (7, 60, hash));
        assert_eq!(hashes.get(7, &frames), hash);
        // Another serial in the same slot replaces it; the same serial cut shorter (another
        // frame limit) is hashed again.
        let later = 7 + PART_HASH_SLOTS as u64;
        assert_eq!(hashes.get(later, &other), part_hash(&other));
        assert_eq!(hashes.slots[7], (later, 60, part_hash(&other)));
        assert_eq!(hashes.get(later, &other[..20]), part_hash(&other[..20]));
        // Looked up by serial and length alone (a replay's frames are not copied for it).
        assert_eq!(hashes.known(later, 20), Some(part_hash(&other[..20])));
        assert_eq!(hashes.known(later, 60), None);
        assert_eq!(hashes.known(7, 60), None);
        hashes.keep(0, 60, hash);
        assert_eq!(hashes.known(0, 60), None);
    }

    #[test]
    fn key_hashes_reach_every_slot_of_the_thread_cache() {
        // A key's hash always has its low bit set, so a slot by `hash % CACHE_SLOTS` was always
        // odd; by its top bits, 4,096 keys reach every slot.
        let mut used = [0u32; CACHE_SLOTS];
        for i in 0..4096u64 {
            let native = part_hash(&[0x7f00_0000_1000 + i * 0x40, 0x7f00_0010_0000]);
            let python = part_hash(&[0x5500_0000_1000 + i * 0x70, 7, python::PY_KEY_TAG | 1]);
            let hash = key_hash(native, python);
            assert_eq!(hash % 2, 1);
            used[cache_slot(hash)] += 1;
        }
        assert!(used.iter().all(|&keys| keys > 0), "{used:?}");
        assert!(used.iter().all(|&keys| keys < 48), "{used:?}");
    }

    #[test]
    fn a_keys_hash_depends_on_each_parts_words() {
        let native = [0x7f00_0000_1000u64, 0x7f00_0000_2000, 0x7f00_0000_3000];
        let python = [
            0x5500_0000_1000u64,
            0x5500_0000_2000,
            4 << 1 | 1,
            python::PY_KEY_TAG | 1,
        ];
        let whole = key_hash(part_hash(&native), part_hash(&python));
        assert_eq!(whole, key_hash(part_hash(&native), part_hash(&python)));
        assert_ne!(whole, key_hash(part_hash(&native), 0));
        assert_ne!(whole, key_hash(part_hash(&native[..2]), part_hash(&python)));
        let mut moved = python;
        moved[2] = 5 << 1 | 1;
        assert_ne!(whole, key_hash(part_hash(&native), part_hash(&moved)));
        assert_eq!(part_hash(&[]), 0);
        assert_eq!(whole & 1, 1);
    }
}
