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
//!
//! Both compare `rbp` (and the words restored into it) only where a later step's rule reads
//! it ([`BpUse`], [`keep_needed_bp`]): in code built without frame pointers it is one more
//! general register, whose changing contents made remembered walks miss though no frame's
//! rule used them. framehop does not say which rule a step ran; what a rule does with `bp` is
//! learnt by unwinding its frame twice over a synthetic stack ([`probe_rule`]), once per
//! lookup address and thread ([`BpRules`]). The same two unwinds show how far a rule that
//! ignores `bp` moves the stack pointer, or that it is the frame-pointer rule; a fresh walk
//! then steps such a frame from that table itself ([`step_learnt`]: framehop's cache lookup
//! and `exec` cost ~170 instructions a frame).

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
/// Walks a thread remembers, to replay whole, found by where they started ([`START_BUCKETS`]):
/// a training loop comes back to each of its allocation sites once a step, a few hundred
/// allocations apart, so a memo of the last few walks (16: 35% of the training steps'
/// allocations replayed) misses what a memo of a step's sites finds.
const REMEMBERED: usize = 256;
/// Buckets of the remembered walks by their start state (hashed), each listing the newest
/// [`START_WAYS`] walks that started there: the same operator called from different Python
/// lines at the same depth starts from the same registers with different words further out.
const START_BUCKETS: usize = 256;
const START_WAYS: usize = 4;
const _: () = assert!(START_BUCKETS.is_power_of_two() && REMEMBERED < u16::MAX as usize);
const _: () =
    assert!(BP_RULE_SLOTS.is_power_of_two() && BP_RULE_SLOTS_WITH_BANKS.is_power_of_two());

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
    /// The larger one, once `rules` and `bp_rules` have had [`CONFLICTS_BEFORE_BANKS`] slot
    /// conflicts together (a frame stepped from `bp_rules` does not look in `rules`).
    banks: Option<Box<RuleBanks>>,
    /// The last walks, a ring growing to [`REMEMBERED`]: the newest is `walks[last]`, the
    /// oldest's buffers take the next fresh walk. Each grows to the walk it holds (little
    /// for a thread that walks a few stacks).
    walks: Vec<Walk>,
    last: usize,
    /// The index in `walks` of the walk the last [`walk`] found (replayed or remembered): its
    /// frames, not copied by a replay, are there until the next walk ([`ThreadCache::frames_of`]).
    returned: usize,
    /// Whether the last [`walk`] wrote the frames it found (not when it replayed one whole).
    written: bool,
    /// Per bucket of start states, the indices (+ 1; 0: none) in `walks` of the newest walks
    /// that started in it, newest first. An index may name a walk since replaced: the start
    /// is compared before anything else.
    by_start: Box<[[u16; START_WAYS]; START_BUCKETS]>,
    /// The states of `walks[last]`'s frames.
    newest_states: States,
    /// The states of the walk being made (its buffers reused).
    states: States,
    /// What each step of the walk being made did with `bp` ([`BpUse`]).
    bp_uses: Vec<BpUse>,
    /// What each rule met so far does with `bp`.
    bp_rules: BpRules,
}

impl ThreadCache {
    pub fn new() -> ThreadCache {
        ThreadCache {
            rules: CacheX86_64::new(),
            banks: None,
            walks: Vec::new(),
            last: 0,
            returned: 0,
            written: true,
            by_start: Box::new([[0; START_WAYS]; START_BUCKETS]),
            newest_states: Vec::new(),
            states: Vec::new(),
            bp_uses: Vec::new(),
            bp_rules: BpRules::new(BP_RULE_SLOTS),
        }
    }

    /// Whether the last [`walk`] wrote the frames it found into the caller's buffer: not
    /// when it replayed a remembered walk whole ([`ThreadCache::frames_of`] its serial).
    pub fn written(&self) -> bool {
        self.written
    }

    /// The frames of the remembered walk of `serial` if it is the one the last [`walk`] found
    /// (a replay does not copy them: most callers need only its serial).
    pub fn frames_of(&self, serial: u64) -> Option<&[u64]> {
        let walk = self.walks.get(self.returned)?;
        (serial != 0 && walk.valid && walk.serial == serial).then_some(&walk.frames[..])
    }
}

impl Default for ThreadCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Per frame of a walk ([`FrameEntry`]). Only the newest walk's are kept (a fresh walk may
/// join only that one): kept for every remembered walk they were half its memory.
type States = Vec<FrameEntry>;

/// framehop's state on reaching a frame: (ip, sp, bp). framehop's x86_64 registers hold 16
/// more, but its DWARF rules and its frame-pointer fallback (all a module built from
/// `.eh_frame` gets, [`module_of`]) read and write only these three, so the rest stay zero.
type FrameState = (u64, u64, u64);

/// One frame of a remembered walk: the state the walk reached it in, where its step's reads
/// begin in the walk's `reads`, and whether the rest of the walk depends on the state's `bp`.
#[derive(Clone, Copy, Debug)]
struct FrameEntry {
    state: FrameState,
    reads_from: u32,
    bp_needed: bool,
}

/// Whether a walk reaching `ours` finds what one that reached `theirs` found, as far as the
/// state goes: `ip` and `sp` always count, `bp` only where a later step reads it.
///
/// PyTorch and most distribution libraries are built without frame pointers: there `rbp` is
/// one more callee-saved register, its value whatever the code kept in it (a pointer, a
/// counter), and framehop's DWARF rules restore it from the stack at each frame that saved
/// it. Comparing it everywhere made a remembered walk miss whenever that value changed,
/// though no rule after it would have read it.
fn same_state(theirs: FrameState, bp_needed: bool, ours: FrameState) -> bool {
    theirs.0 == ours.0 && theirs.1 == ours.1 && (!bp_needed || theirs.2 == ours.2)
}

/// What one step of a walk did with the `bp` it started from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BpUse {
    /// Read it: a frame-pointer rule, or a DWARF row framehop evaluated in full (which may
    /// read any register). The rest of the walk depends on it.
    Reads,
    /// Left it unchanged for the next step: the walk depends on it where it depends on the
    /// next state's.
    Keeps,
    /// Replaced it with the stack word at this address, without reading it: the walk does
    /// not depend on it, and depends on that word only where it depends on the next state's.
    Restores(u64),
    /// Followed it as a frame pointer (framehop's frame-pointer rule), this `bp`: read it (the
    /// rest of the walk depends on it), and replaced it with the word at it, on which the walk
    /// depends only where it depends on the next state's `bp`. PyTorch's libraries keep frame
    /// pointers in many functions whose callers do not: there the caller's saved `rbp` is a
    /// pointer or a counter that changes from call to call, and keeping it made every replay
    /// of the same path miss (a fresh walk for ~8% of the training steps' allocations, 70% of
    /// the native walk's instructions).
    FollowsFramePointer(u64),
}

/// What the rule at one lookup address does with `bp`, as [`BpUse`] with the restored word's
/// address relative to the step's stack pointer: a rule depends only on its address (and on
/// whether it is the first frame's), so this is learnt once ([`probe_rule`]) and kept
/// ([`BpRules`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BpRule {
    Reads,
    Keeps,
    /// Restores `bp` from the word at `sp + offset`.
    Restores(i32),
}

impl BpRule {
    /// What the step from a frame with stack pointer `sp` did with `bp`, the walk's reads
    /// bounded by `bounds` (a refused read of the restored word is framehop's, in `exec`).
    fn at(self, is_first_frame: bool, sp: u64, bounds: (u64, u64)) -> BpUse {
        match self {
            BpRule::Reads => BpUse::Reads,
            BpRule::Keeps => BpUse::Keeps,
            BpRule::Restores(offset) => {
                let Some(at) = sp.checked_add_signed(i64::from(offset)) else {
                    // `exec` fails before reading: the walk ends whatever `bp` is.
                    return BpUse::Keeps;
                };
                // A first frame's refused read below the stack pointer keeps `bp` (`exec`'s
                // epilogue case); a read refused elsewhere ends the walk.
                if is_first_frame && at < sp && !readable(at, bounds) {
                    BpUse::Keeps
                } else {
                    BpUse::Restores(at)
                }
            }
        }
    }
}

/// The stack pointer a probe unwinds from ([`probe_rule`]); the two `bp` values above it
/// (a frame-pointer rule must move the stack pointer up to succeed).
const PROBE_SP: u64 = 0x4000_0000_0000;
const PROBE_BPS: [u64; 2] = [PROBE_SP + 0x10_0000, PROBE_SP + 0x20_0000];
/// A probe's stack holds `address ^ PROBE_WORDS` at each address: a different word at every
/// address, never zero at an aligned one (framehop ends a walk at a zero return address), and
/// the address a restored word came from is `word ^ PROBE_WORDS`.
const PROBE_WORDS: u64 = 0x5a5a_a5a5_c3c3_3c3d;

/// Learns what a step's rule does with `bp` through framehop's public `unwind_frame`: `step`
/// unwinds the frame (the same address, the same first-frame-ness) from the registers it is
/// given, reading the stack through the reader it is given, and says whether a rule from
/// framehop's cache ran (`None`: it did not). Run twice from registers differing only in
/// `bp`, over a stack whose words are an injective function of their address:
/// - return address or stack pointer differ: the rule reads `bp`;
/// - each `bp` left as it was: it keeps it;
/// - both the same stack word: it restores it from that word's address;
/// - anything else (an error, a step that no cached rule made) counts as reading it, which is
///   never wrong (a replay compares one more register).
///
/// A step no cached rule made is a DWARF row framehop evaluates in full (an expression, a
/// frame-pointer-relative CFA it cannot turn into a rule): two points cannot show that such an
/// evaluation ignores `bp`. framehop's cached rules read and write only `ip`, `sp` and `bp`, as
/// fixed offsets from `sp` or `bp` and words read there, so two points tell them apart exactly.
///
/// A rule that neither reads `bp` nor fails moved the stack pointer by a fixed amount (all of
/// framehop's cached rules but the frame-pointer ones add a constant to `sp`); where the word
/// it returned to is the one just below the new stack pointer, the probe keeps that amount,
/// and [`step_learnt`] replays the rule without framehop.
fn probe_rule<S>(mut step: S) -> FrameRule
where
    S: FnMut(
        &mut UnwindRegsX86_64,
        &mut dyn FnMut(u64) -> Result<u64, ()>,
    ) -> Option<Result<Option<u64>, framehop::Error>>,
{
    const READS: FrameRule = FrameRule {
        bp: BpRule::Reads,
        sp_step_by_8: 0,
    };
    let mut stack = |addr: u64| -> Result<u64, ()> { Ok(addr ^ PROBE_WORDS) };
    let mut after = [UnwindRegsX86_64::new(0, 0, 0); 2];
    let mut returned = [None; 2];
    for (i, &bp) in PROBE_BPS.iter().enumerate() {
        let mut regs = UnwindRegsX86_64::new(0, PROBE_SP, bp);
        match step(&mut regs, &mut stack) {
            Some(Ok(return_address)) => returned[i] = Some(return_address),
            Some(Err(_)) | None => return READS,
        }
        after[i] = regs;
    }
    // framehop's frame-pointer rule (`UseFramePointer`, and `JustReturnIfFirstFrameOtherwiseFp`
    // past the first frame), the only cached rule whose `sp` follows `bp`: `sp = bp + 16`,
    // `bp` and the return address the words at `bp` and `bp + 8`, from both points.
    let frame_pointer = (0..2).all(|i| {
        let bp = PROBE_BPS[i];
        after[i].sp() == bp + 16
            && after[i].bp() == bp ^ PROBE_WORDS
            && returned[i] == Some(Some((bp + 8) ^ PROBE_WORDS))
    });
    if frame_pointer {
        return FrameRule {
            bp: BpRule::Reads,
            sp_step_by_8: FRAME_POINTER_STEP,
        };
    }
    if returned[0] != returned[1] || after[0].sp() != after[1].sp() {
        return READS;
    }
    let bps = [after[0].bp(), after[1].bp()];
    let rule = if bps == PROBE_BPS {
        BpRule::Keeps
    } else if bps[0] == bps[1]
        && let Ok(offset) = i32::try_from((bps[0] ^ PROBE_WORDS).wrapping_sub(PROBE_SP) as i64)
    {
        BpRule::Restores(offset)
    } else {
        return READS;
    };
    // Returned to the word just below a stack pointer moved up by a multiple of 8 (that
    // framehop's rules can encode): `step_learnt` does the same.
    let new_sp = after[0].sp();
    let moved = new_sp.wrapping_sub(PROBE_SP);
    let returned_below = returned[0] == Some(Some((new_sp - 8) ^ PROBE_WORDS));
    let sp_step_by_8 = match u16::try_from(moved / 8) {
        Ok(by_8)
            if new_sp > PROBE_SP
                && moved.is_multiple_of(8)
                && returned_below
                && by_8 != FRAME_POINTER_STEP =>
        {
            by_8
        }
        _ => 0,
    };
    FrameRule {
        bp: rule,
        sp_step_by_8,
    }
}

/// The rule at one lookup address, as learnt by [`probe_rule`]: what it does with `bp`, and,
/// for a rule that does not read it, how far it moves the stack pointer (in 8 bytes; 0:
/// unknown, framehop steps it; [`FRAME_POINTER_STEP`]: framehop's frame-pointer rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameRule {
    bp: BpRule,
    sp_step_by_8: u16,
}

/// [`FrameRule::sp_step_by_8`] of framehop's frame-pointer rule (an `sp` step of that many
/// words is left to framehop).
const FRAME_POINTER_STEP: u16 = u16::MAX;

/// One step of a learnt rule ([`FrameRule`], `sp_step_by_8` not 0): what framehop's `exec`
/// does with the cached rule the probe ran, the same reads in the same order, without its
/// cache lookup. A rule that moves the stack pointer by `sp_step_by_8 * 8` does with `bp`
/// what `bp_rule` says (`OffsetSp`, `OffsetSpAndRestoreBp`, `JustReturn`: the restored word
/// read first, then the return address); [`FRAME_POINTER_STEP`] is `UseFramePointer` (the
/// words at `bp` and `bp + 8`). `Err`: the step failed (the walk ends, as on framehop's
/// error); `Ok(None)`: the end of the stack (a zero return address, or a zero frame pointer).
fn step_learnt<R>(
    sp_step_by_8: u16,
    bp_rule: BpRule,
    is_first_frame: bool,
    regs: &mut UnwindRegsX86_64,
    read_stack: &mut R,
) -> Result<Option<u64>, ()>
where
    R: FnMut(u64) -> Result<u64, ()>,
{
    let (sp, bp) = (regs.sp(), regs.bp());
    if sp_step_by_8 == FRAME_POINTER_STEP {
        if bp == 0 {
            return Ok(None);
        }
        let new_sp = bp.checked_add(16).ok_or(())?;
        if new_sp <= sp {
            return Err(());
        }
        let new_bp = read_stack(bp)?;
        return finish_step(regs, read_stack, new_sp, new_bp);
    }
    let new_sp = sp.checked_add(u64::from(sp_step_by_8) * 8).ok_or(())?;
    let new_bp = match bp_rule {
        BpRule::Keeps => bp,
        BpRule::Restores(offset) => {
            let at = sp.checked_add_signed(i64::from(offset)).ok_or(())?;
            match read_stack(at) {
                Ok(word) => word,
                // `exec`'s epilogue case: a first frame's refused read below sp keeps `bp`.
                Err(()) if is_first_frame && at < sp => bp,
                Err(()) => return Err(()),
            }
        }
        BpRule::Reads => return Err(()),
    };
    finish_step(regs, read_stack, new_sp, new_bp)
}

/// The end of `exec`: the return address below the new stack pointer, then the registers.
fn finish_step<R>(
    regs: &mut UnwindRegsX86_64,
    read_stack: &mut R,
    new_sp: u64,
    new_bp: u64,
) -> Result<Option<u64>, ()>
where
    R: FnMut(u64) -> Result<u64, ()>,
{
    // `exec`'s "did not advance" check cannot fire: both rules move `sp` up.
    let return_address = read_stack(new_sp - 8)?;
    if return_address == 0 {
        return Ok(None);
    }
    regs.set_ip(return_address);
    regs.set_sp(new_sp);
    regs.set_bp(new_bp);
    Ok(Some(return_address))
}

/// [`probe_rule`] for the frame at `address`, with framehop's cache for it: the first of
/// the two unwinds leaves the frame's rule in that cache (framehop caches every rule it
/// runs), so the second finds it there unless no rule ran (a full DWARF evaluation).
fn probe_frame(
    unwinder: &ProcessUnwinder,
    address: FrameAddress,
    rules: &mut CacheX86_64,
) -> FrameRule {
    let mut first = true;
    probe_rule(|regs, stack| {
        regs.set_ip(address.address());
        let hits = rules.stats().hit_count;
        let stepped = unwinder.unwind_frame(address, regs, rules, &mut |addr| stack(addr));
        let from_cache = std::mem::replace(&mut first, false) || rules.stats().hit_count > hits;
        from_cache.then_some(stepped)
    })
}

/// Slots in a thread's table of [`BpRule`]s while it has no [`RuleBanks`], and once it has
/// them (a thread walking many stacks crosses some 400 return addresses a training step).
const BP_RULE_SLOTS: usize = 256;
const BP_RULE_SLOTS_WITH_BANKS: usize = 4096;

/// A thread's [`FrameRule`]s by lookup address and first-frame-ness: direct-mapped, a miss
/// probes the rule again ([`probe_frame`]). A hit whose rule moves `sp` by a known amount
/// steps the frame without framehop ([`step_learnt`]).
struct BpRules {
    /// The unwinder the rules were learnt with: another one may have other modules at the
    /// same addresses.
    unwinder: *const ProcessUnwinder,
    slots: Box<[BpRuleSlot]>,
    /// Rules inserted over another address's ([`CONFLICTS_BEFORE_BANKS`]).
    conflicts: u64,
}

/// One slot of [`BpRules`] (16 bytes).
#[derive(Clone, Copy)]
struct BpRuleSlot {
    lookup: u64,
    /// `BpRule::Restores`'s offset.
    offset: i32,
    /// [`FrameRule::sp_step_by_8`].
    sp_step_by_8: u16,
    /// 0: empty, 1: reads, 2: keeps, 3: restores.
    kind: u8,
    is_first_frame: bool,
}

const EMPTY_SLOT: BpRuleSlot = BpRuleSlot {
    lookup: 0,
    offset: 0,
    sp_step_by_8: 0,
    kind: 0,
    is_first_frame: false,
};
const _: () = assert!(std::mem::size_of::<BpRuleSlot>() == 16);

impl BpRules {
    fn new(slots: usize) -> BpRules {
        BpRules {
            unwinder: std::ptr::null(),
            slots: vec![EMPTY_SLOT; slots].into_boxed_slice(),
            conflicts: 0,
        }
    }

    /// Learnt with another unwinder: forget them all (dlopen / dlclose only).
    fn use_unwinder(&mut self, unwinder: *const ProcessUnwinder) {
        if self.unwinder != unwinder {
            self.slots.fill(EMPTY_SLOT);
            self.unwinder = unwinder;
        }
    }

    fn slot(&self, lookup: u64, is_first_frame: bool) -> usize {
        // First-frame-ness in a high bit: neighbouring addresses keep apart.
        let key = lookup ^ (u64::from(is_first_frame) << 47);
        let mixed = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // The product's top bits, as many as the slots take (a power of two).
        (mixed >> (64 - self.slots.len().trailing_zeros())) as usize
    }

    fn get(&self, lookup: u64, is_first_frame: bool) -> Option<FrameRule> {
        let slot = self.slots[self.slot(lookup, is_first_frame)];
        if slot.lookup != lookup || slot.is_first_frame != is_first_frame {
            return None;
        }
        let bp = match slot.kind {
            1 => BpRule::Reads,
            2 => BpRule::Keeps,
            3 => BpRule::Restores(slot.offset),
            _ => return None,
        };
        Some(FrameRule {
            bp,
            sp_step_by_8: slot.sp_step_by_8,
        })
    }

    fn insert(&mut self, lookup: u64, is_first_frame: bool, rule: FrameRule) {
        let (kind, offset) = match rule.bp {
            BpRule::Reads => (1, 0),
            BpRule::Keeps => (2, 0),
            BpRule::Restores(offset) => (3, offset),
        };
        let at = self.slot(lookup, is_first_frame);
        let held = self.slots[at];
        if held.kind != 0 && (held.lookup, held.is_first_frame) != (lookup, is_first_frame) {
            self.conflicts += 1;
        }
        self.slots[at] = BpRuleSlot {
            lookup,
            offset,
            sp_step_by_8: rule.sp_step_by_8,
            kind,
            is_first_frame,
        };
    }
}

/// Whether a walk within `bounds` reads the word at `addr` (the check of [`walk`]'s reads).
fn readable(addr: u64, (low, high): (u64, u64)) -> bool {
    addr >= low && addr.saturating_add(8) <= high && addr.is_multiple_of(8)
}

/// A remembered walk: where it started, every stack word it read and what it found (the
/// newest one's states per frame are kept beside it: [`States`]).
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
    /// (ip, sp, bp) at the start: inside [`walk`], or an entry point's caller (its ip a
    /// return address outside the shim, so never equal to a start inside it).
    start: FrameState,
    bounds: (u64, u64),
    capacity: usize,
    /// (address, word read); a read refused by the bounds check is not kept (the same
    /// address is refused again with the same bounds).
    reads: Vec<(u64, u64)>,
    frames: Vec<u64>,
    /// Whether the walk depends on the start's `bp` (its first frame's `bp_needed`).
    start_bp_needed: bool,
    /// The walk stopped at `capacity` frames, not at the end of the stack: what lies
    /// beyond its last frame is not known.
    truncated: bool,
    /// Names this walk's result among every walk remembered in the process ([`SERIAL`]).
    serial: u64,
}

/// The last serial number given to a remembered walk: a caller that kept what a walk found
/// under its serial (its hash, its frames) needs no copy of the frames when the next walk
/// replays the same one.
static SERIAL: AtomicU64 = AtomicU64::new(0);

impl Walk {
    fn with_capacity(reads: usize, frames: usize) -> Walk {
        Walk {
            reads: Vec::with_capacity(reads.min(MEMO_READS)),
            frames: Vec::with_capacity(frames.min(MEMO_FRAMES)),
            ..Walk::new()
        }
    }

    fn new() -> Walk {
        Walk {
            valid: false,
            unwinder: std::ptr::null(),
            start: (0, 0, 0),
            bounds: (0, 0),
            capacity: 0,
            reads: Vec::new(),
            frames: Vec::new(),
            start_bp_needed: true,
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
        if !self.comparable(unwinder, bounds, capacity)
            || !same_state(self.start, self.start_bp_needed, start)
        {
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
    fn new(last: &Walk, states: &[FrameEntry]) -> SuffixMatch {
        SuffixMatch {
            cursor: 1,
            equal_from: last.reads.len(),
            differ_below: 0,
            cursor_sp: states.get(1).map_or(u64::MAX, |frame| frame.state.1),
        }
    }

    /// The frame of `last` (the remembered walk) whose remaining walk is exactly what a walk
    /// reaching `state` with `count` frames written would find: the state is the same, and so
    /// is every word `last` read from there on. The rules, bounds and frame limit are the
    /// same ([`Walk::comparable`]).
    fn join(
        &mut self,
        last: &Walk,
        states: &[FrameEntry],
        state: FrameState,
        count: usize,
    ) -> Option<usize> {
        let sp = state.1;
        if sp < self.cursor_sp {
            return None;
        }
        while self.cursor < states.len() && states[self.cursor].state.1 < sp {
            self.cursor += 1;
        }
        let at = self.cursor;
        self.cursor_sp = states.get(at).map_or(u64::MAX, |frame| frame.state.1);
        let &FrameEntry {
            state: their_state,
            reads_from,
            bp_needed,
        } = states.get(at)?;
        // A walk cut at the frame limit is known only as far as it went: this walk may join it
        // only at a depth no smaller than its own there (then it reaches the limit no later).
        if !same_state(their_state, bp_needed, state) || (last.truncated && count < at) {
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

/// Where a walk starts: at the caller of one of the shim's entry points, as that entry point
/// found it on entry ([`CallerState`]), or here, inside [`walk`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkFrom {
    Here,
    Caller(CallerState),
}

/// The registers framehop reads (ip, sp, bp) as an entry point's caller will find them on
/// its return, taken at the entry point's first instruction: the return address on top of
/// the stack, the stack pointer above it, the caller's frame pointer still in `rbp`. This is
/// exactly the state unwinding the entry point's own frame reaches, so a walk from it finds
/// the caller's frames without walking the shim's (some seven frames a tensor event, each a
/// rule lookup and evaluation, that were dropped from the stack afterwards).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerState {
    pub return_address: u64,
    pub sp: u64,
    pub bp: u64,
}

/// Walks the caller's stack into `frames` (return addresses, innermost first, starting with
/// the instruction pointer inside this function, or with the entry point's return address
/// when `from` is its caller). Returns the count, 0 if walking failed, and the serial number
/// of the remembered walk that found them (0: not remembered). A remembered walk replayed
/// whole does not write them (most callers need only its serial; the copy of its ~40 frames
/// was 44 instructions a walk in the training steps): then [`ThreadCache::written`] is false and they are
/// [`ThreadCache::frames_of`] its serial.
#[inline(never)]
pub fn walk(
    frames: &mut [MaybeUninit<u64>],
    cache: &mut ThreadCache,
    stack: (u64, u64),
    now_ns: u64,
    from: WalkFrom,
) -> (usize, u64) {
    cache.written = true;
    let unwinder_ptr = current_unwinder(now_ns);
    let Some(unwinder) = (unsafe { unwinder_ptr.as_ref() }) else {
        return (0, 0);
    };
    let (ip, sp, bp): (u64, u64, u64);
    let mut address = match from {
        WalkFrom::Here => {
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
            FrameAddress::from_instruction_pointer(ip)
        }
        WalkFrom::Caller(caller) => {
            (ip, sp, bp) = (caller.return_address, caller.sp, caller.bp);
            // Looked up at the call instruction, as a return address found by unwinding is.
            let Some(address) = FrameAddress::from_return_address(ip) else {
                return (0, 0);
            };
            address
        }
    };
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
        returned,
        written,
        by_start,
        newest_states,
        states,
        bp_uses,
        bp_rules,
    } = cache;
    let newest = *last;
    let bucket = &mut by_start[start_bucket(start)];
    for &way in bucket.iter() {
        let at = usize::from(way).wrapping_sub(1);
        let Some(remembered) = walks.get(at) else {
            break;
        };
        if let Some(count) = remembered.replay(unwinder_ptr, start, bounds, capacity) {
            *returned = at;
            *written = false;
            return (count, remembered.serial);
        }
    }
    // Walk, noting every word read and each frame's state, for the next calls.
    // The oldest walk's buffers take this one (a new one while the ring grows); the newest is
    // searched for a join (older ones add little: the frames a fresh walk shares with them
    // it mostly shares with the newest too; on the training steps, joining the newest one or
    // two walked as many frames, framehop's rule evaluation 4.31 M and 4.30 M instructions).
    let grown = walks.len() < REMEMBERED;
    let oldest = if grown {
        // Its buffers sized as the newest walk's (a fresh walk mostly joins it): grown from
        // empty by pushes, they were reallocated several times each (training steps under
        // callgrind, ring not yet full: ~490,000 instructions in 1,000 reallocations).
        let (reads, frames) = walks
            .get(newest)
            .map_or((0, 0), |walk| (walk.reads.len(), walk.frames.len()));
        walks.push(Walk::with_capacity(reads, frames));
        walks.len() - 1
    } else {
        (newest + 1) % REMEMBERED
    };
    let mut next = std::mem::replace(&mut walks[oldest], Walk::new());
    next.valid = false;
    next.reads.clear();
    next.frames.clear();
    states.clear();
    bp_uses.clear();
    let mut suffix = walks
        .get(newest)
        .filter(|walk| walk.comparable(unwinder_ptr, bounds, capacity))
        .map(|walk| SuffixMatch::new(walk, newest_states));
    let mut reads_fit = true;
    let conflicts = rules.stats().miss_wrong_address_count + bp_rules.conflicts;
    if banks.is_none() && conflicts >= CONFLICTS_BEFORE_BANKS {
        // Allocates, as the thread's first walk (this cache) and framehop's misses do.
        *banks = Some(Box::new(RuleBanks::new()));
        *bp_rules = BpRules::new(BP_RULE_SLOTS_WITH_BANKS);
    }
    bp_rules.use_unwinder(unwinder_ptr);
    // framehop's `iter_frames`, one frame at a time, each frame's rule from its cache.
    let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
    let mut count = 0;
    let mut joined = None;
    while count < capacity {
        frames[count].write(address.address());
        states.push(FrameEntry {
            state: (regs.ip(), regs.sp(), regs.bp()),
            reads_from: next.reads.len() as u32,
            bp_needed: true,
        });
        count += 1;
        if count == capacity {
            break;
        }
        let reads = &mut next.reads;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            if !readable(addr, bounds) {
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
        let step_sp = regs.sp();
        let (lookup, is_first_frame) = (address.address_for_lookup(), !address.is_return_address());
        // A rule learnt that moves `sp` by a known amount is stepped here: framehop's cache
        // lookup and `exec` cost ~170 instructions a frame, this a few dozen.
        let step_bp = regs.bp();
        let (stepped, rule) = match bp_rules.get(lookup, is_first_frame) {
            Some(rule) if rule.sp_step_by_8 != 0 => {
                let stepped = step_learnt(
                    rule.sp_step_by_8,
                    rule.bp,
                    is_first_frame,
                    &mut regs,
                    &mut read_stack,
                );
                (stepped.ok().flatten(), rule)
            }
            known => {
                let rules = match banks {
                    Some(banks) => banks.for_address(lookup),
                    None => &mut *rules,
                };
                let stepped = unwinder.unwind_frame(address, &mut regs, rules, &mut read_stack);
                let rule = known.unwrap_or_else(|| {
                    let learnt = probe_frame(unwinder, address, rules);
                    bp_rules.insert(lookup, is_first_frame, learnt);
                    learnt
                });
                (stepped.ok().flatten(), rule)
            }
        };
        bp_uses.push(if rule.sp_step_by_8 == FRAME_POINTER_STEP {
            BpUse::FollowsFramePointer(step_bp)
        } else {
            rule.bp.at(is_first_frame, step_sp, bounds)
        });
        match stepped.and_then(FrameAddress::from_return_address) {
            Some(caller) => address = caller,
            None => break,
        }
        let state = (regs.ip(), regs.sp(), regs.bp());
        joined = suffix
            .as_mut()
            .and_then(|suffix| suffix.join(&walks[newest], newest_states, state, count));
        if joined.is_some() {
            break;
        }
    }
    // Which states' `bp` the walk depends on, from the last step back; the words restored
    // into a `bp` nothing reads are dropped from the reads (a replay or a join need not find
    // them again).
    let needed_after = joined.is_some_and(|at| newest_states[at].bp_needed);
    keep_needed_bp(&mut next.reads, states, bp_uses, needed_after);
    if let Some(at) = joined {
        let previous = &walks[newest];
        // The rest of this walk is that walk's from frame `at`, up to the frame limit; the
        // remembered walk is this one's frames, states and reads followed by that one's.
        let tail = &previous.frames[at..];
        let take = tail.len().min(capacity - count);
        for (out, &frame) in frames[count..].iter_mut().zip(&tail[..take]) {
            out.write(frame);
        }
        let reads_from = newest_states[at].reads_from as usize;
        let tail_reads = &previous.reads[reads_from..];
        if next.reads.len() + tail_reads.len() <= MEMO_READS {
            let shift = next.reads.len() as i64 - reads_from as i64;
            states.extend(
                newest_states[at..at + take]
                    .iter()
                    .map(|&frame| FrameEntry {
                        reads_from: (i64::from(frame.reads_from) + shift) as u32,
                        ..frame
                    }),
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
        next.start_bp_needed = states.first().is_none_or(|frame| frame.bp_needed);
        next.bounds = bounds;
        next.capacity = capacity;
        next.truncated = count == capacity;
        next.serial = SERIAL.fetch_add(1, Ordering::Relaxed) + 1;
        next.valid = true;
        let serial = next.serial;
        walks[oldest] = next;
        *last = oldest;
        *returned = oldest;
        std::mem::swap(newest_states, states);
        // Newest first in its start's bucket (once: this slot may be listed from before).
        let way = (oldest + 1) as u16;
        let mut previous = way;
        for slot in bucket.iter_mut() {
            previous = std::mem::replace(slot, previous);
            if previous == way {
                break;
            }
        }
        return (count, serial);
    }
    if grown {
        // Not remembered: the ring does not keep an empty slot.
        walks.pop();
    } else {
        walks[oldest] = next;
    }
    (count, 0)
}

/// The bucket of `by_start` for a walk starting at `start`: by its `ip` and `sp` only (a walk
/// may not depend on the start's `bp`, [`Walk::start_bp_needed`]).
fn start_bucket((ip, sp, _bp): FrameState) -> usize {
    let mixed = (ip ^ sp.rotate_left(21)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // The product's top bits, as many as the buckets take (a power of two).
    (mixed >> (64 - START_BUCKETS.trailing_zeros())) as usize
}

/// Marks which of a fresh walk's states it depends on through `bp`, and drops from its reads
/// the words restored into a `bp` that no later step reads. `states` holds the frames it
/// walked itself and `bp_uses` its steps (one fewer where it stopped at the frame limit);
/// `needed_after` is whether the state after its last step counts (that of the walk it joined
/// there; false where it ended).
///
/// Sound because a step's result depends on its state's `bp` only where its rule reads it
/// ([`BpUse`]): going back from the end, a state's `bp` is needed where its step reads it, or
/// keeps it and the next state's is needed; never where the step restores it. A restored
/// word is needed exactly where the next state's `bp` is, the word a frame-pointer step
/// followed `bp` to likewise (that step needs its own `bp` whatever the next state needs).
fn keep_needed_bp(
    reads: &mut Vec<(u64, u64)>,
    states: &mut [FrameEntry],
    bp_uses: &[BpUse],
    needed_after: bool,
) {
    let frames = states.len();
    let mut needed_next = needed_after;
    for i in (0..frames).rev() {
        let needed = match bp_uses.get(i) {
            Some(BpUse::Reads) => true,
            Some(BpUse::Keeps) => needed_next,
            Some(BpUse::FollowsFramePointer(_)) => true,
            Some(BpUse::Restores(_)) => false,
            // The frame limit: no step taken from this frame.
            None => false,
        };
        states[i].bp_needed = needed;
        needed_next = needed;
    }
    // Compact the reads in place, frame by frame.
    let mut kept = 0;
    for i in 0..frames {
        let from = states[i].reads_from as usize;
        let to = states
            .get(i + 1)
            .map_or(reads.len(), |frame| frame.reads_from as usize);
        let drop_at = match bp_uses.get(i) {
            Some(&BpUse::Restores(at) | &BpUse::FollowsFramePointer(at)) => {
                let next_needed = states.get(i + 1).map_or(needed_after, |f| f.bp_needed);
                // `exec` reads the restored word first (the frame-pointer rule: the word at
                // `bp`, then the return address above it).
                (!next_needed && reads.get(from).is_some_and(|read| read.0 == at)).then_some(from)
            }
            _ => None,
        };
        states[i].reads_from = kept as u32;
        for r in from..to {
            if Some(r) != drop_at {
                reads[kept] = reads[r];
                kept += 1;
            }
        }
    }
    reads.truncate(kept);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::black_box;

    /// Recurses `depth` frames, then runs `bottom`; `pattern` 1 takes another call site in the
    /// innermost recursive frame (the same registers at the bottom, another word further out).
    #[inline(never)]
    fn descend(depth: usize, pattern: usize, bottom: &mut dyn FnMut()) -> usize {
        if depth == 0 {
            bottom();
            return black_box(0);
        }
        if depth == 1 && pattern == 1 {
            black_box(descend(depth - 1, pattern, bottom)) ^ 7
        } else {
            black_box(descend(depth - 1, pattern, bottom)) + 1
        }
    }

    /// Walks from the bottom of `descend(depth, pattern)` with `memo` and with a fresh cache
    /// (no remembered walks: framehop alone), from the same call site; returns both frame
    /// lists and the memo walk's serial.
    fn walk_both(memo: &mut ThreadCache, depth: usize, pattern: usize) -> [(Vec<u64>, u64); 2] {
        let stack = thread_stack_bounds();
        let mut found: Vec<(Vec<u64>, u64)> = Vec::new();
        descend(depth, pattern, &mut || {
            for which in 0..2 {
                let mut fresh = ThreadCache::new();
                let cache = if which == 0 { &mut *memo } else { &mut fresh };
                let mut frames = [MaybeUninit::<u64>::uninit(); MEMO_FRAMES];
                let (count, serial) = walk(&mut frames, cache, stack, 0, WalkFrom::Here);
                let frames = if cache.written() {
                    frames[..count]
                        .iter()
                        // SAFETY: `walk` wrote the first `count` frames.
                        .map(|frame| unsafe { frame.assume_init() })
                        .collect()
                } else {
                    let remembered = cache.frames_of(serial).expect("replayed frames");
                    assert_eq!(remembered.len(), count);
                    remembered.to_vec()
                };
                found.push((frames, serial));
            }
        });
        let fresh = found.pop().expect("the fresh walk");
        let memo = found.pop().expect("the memo walk");
        [memo, fresh]
    }

    /// More stacks than the ring holds, then the newest again, the oldest again, and stacks
    /// that share their start with earlier ones but not their words: every walk through the
    /// memo (replayed whole, joined, or fresh) finds what framehop alone finds.
    #[test]
    fn remembered_walks_find_what_a_fresh_walk_finds() {
        const DEPTHS: usize = REMEMBERED + 24;
        // (depth, pattern), all walked from one call site below, so that a stack differs
        // from another only where its depth or pattern makes it.
        let mut jobs: Vec<(usize, usize)> = Vec::new();
        jobs.extend((1..=DEPTHS).map(|depth| (depth, 0)));
        jobs.extend((DEPTHS - 63..=DEPTHS).map(|depth| (depth, 0)));
        jobs.extend((1..=24).map(|depth| (depth, 0)));
        jobs.extend((1..=40).map(|depth| (depth, 1)));
        let mut memo = ThreadCache::new();
        let mut serials: Vec<u64> = Vec::new();
        for &(depth, pattern) in &jobs {
            let [(ours, serial), (fresh, _)] = walk_both(&mut memo, depth, pattern);
            assert!(fresh.len() > depth, "depth {depth}: {} frames", fresh.len());
            assert_eq!(ours, fresh, "depth {depth}, pattern {pattern}");
            serials.push(serial);
        }
        let (first, rest) = serials.split_at(DEPTHS);
        let (newest_again, rest) = rest.split_at(64);
        let (oldest_again, _) = rest.split_at(24);
        // Every one of the first pass remembered: the ring wrapped.
        let mut distinct = first.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), DEPTHS);
        assert!(!distinct.contains(&0));
        assert_eq!(memo.walks.len(), REMEMBERED);
        // The newest 64 again: found by their start and replayed whole (the same serial),
        // unless a bucket's newer walks pushed one out (four ways a bucket).
        let replayed = newest_again
            .iter()
            .zip(&first[DEPTHS - 64..])
            .filter(|(again, before)| again == before)
            .count();
        assert!(replayed >= 56, "{replayed} of 64 replayed whole");
        // The oldest, long replaced: walked again, not replayed.
        for (depth, serial) in (1..).zip(oldest_again) {
            assert!(
                !first.contains(serial),
                "depth {depth} replayed a replaced walk"
            );
        }
    }

    const BOUNDS: (u64, u64) = (0x1000, 0x2000);

    // Never run: rows of unwind tables of each shape framehop turns into a cached rule or
    // evaluates in full, at known addresses, for the probe to learn from the process's own
    // unwinder (the test binary's `.eh_frame`).
    std::arch::global_asm!(
        ".pushsection .text.vramshim_bp_probe_cases,\"ax\",@progbits",
        ".p2align 4",
        ".globl vramshim_bp_probe_start",
        ".hidden vramshim_bp_probe_start",
        ".globl vramshim_bp_probe_saved",
        ".hidden vramshim_bp_probe_saved",
        ".globl vramshim_bp_probe_framed",
        ".hidden vramshim_bp_probe_framed",
        ".globl vramshim_bp_probe_popped",
        ".hidden vramshim_bp_probe_popped",
        ".globl vramshim_bp_probe_fp",
        ".hidden vramshim_bp_probe_fp",
        ".globl vramshim_bp_probe_fp_odd",
        ".hidden vramshim_bp_probe_fp_odd",
        ".globl vramshim_bp_probe_expression",
        ".hidden vramshim_bp_probe_expression",
        ".globl vramshim_bp_probe_end",
        ".hidden vramshim_bp_probe_end",
        "vramshim_bp_probe_start:",
        ".cfi_startproc",
        // CFA = rsp + 8: JustReturn.
        "push rbp",
        ".cfi_def_cfa_offset 16",
        ".cfi_offset rbp, -16",
        // CFA = rsp + 16, rbp saved at CFA - 16: OffsetSpAndRestoreBp (bp from sp + 0).
        "vramshim_bp_probe_saved:",
        "sub rsp, 32",
        ".cfi_def_cfa_offset 48",
        // CFA = rsp + 48: bp from sp + 32.
        "vramshim_bp_probe_framed:",
        "add rsp, 32",
        ".cfi_def_cfa_offset 16",
        "pop rbp",
        ".cfi_def_cfa_offset 8",
        // CFA = rsp + 8 with rbp's save not undone (an epilogue): bp from sp - 8.
        "vramshim_bp_probe_popped:",
        "push rbp",
        ".cfi_def_cfa_offset 16",
        "mov rbp, rsp",
        ".cfi_def_cfa_register rbp",
        // CFA = rbp + 16, rbp at CFA - 16: UseFramePointer.
        "vramshim_bp_probe_fp:",
        "sub rsp, 16",
        ".cfi_def_cfa rbp, 32",
        // CFA = rbp + 32: no cached rule (framehop's `_ffi_call_unix64` case), evaluated in full.
        "vramshim_bp_probe_fp_odd:",
        "mov rsp, rbp",
        "pop rbp",
        // CFA = rsp + 8 as an expression (DW_CFA_def_cfa_expression, DW_OP_breg7 8), rbp not
        // saved: evaluated in full, though it does not read rbp.
        ".cfi_restore rbp",
        ".cfi_escape 0x0f, 0x02, 0x77, 0x08",
        "vramshim_bp_probe_expression:",
        "nop",
        // The return address undefined: EndOfStack.
        ".cfi_def_cfa rsp, 8",
        ".cfi_undefined rip",
        "vramshim_bp_probe_end:",
        "ret",
        ".cfi_endproc",
        ".popsection",
    );

    unsafe extern "C" {
        fn vramshim_bp_probe_start();
        fn vramshim_bp_probe_saved();
        fn vramshim_bp_probe_framed();
        fn vramshim_bp_probe_popped();
        fn vramshim_bp_probe_fp();
        fn vramshim_bp_probe_fp_odd();
        fn vramshim_bp_probe_expression();
        fn vramshim_bp_probe_end();
    }

    /// What the probe learns of the row at `label`, as the first frame's (its instruction
    /// pointer) and as a caller's (a return address just past it), each with a fresh rule
    /// cache and again with that cache warm.
    fn probed(label: unsafe extern "C" fn()) -> [BpRule; 2] {
        probed_rules(label).map(|rule| rule.bp)
    }

    /// [`probed`]'s whole rules.
    fn probed_rules(label: unsafe extern "C" fn()) -> [FrameRule; 2] {
        // SAFETY: built by `current_unwinder` and never freed.
        let unwinder = unsafe { &*current_unwinder(0) };
        let at = label as usize as u64;
        let addresses = [
            FrameAddress::from_instruction_pointer(at),
            FrameAddress::from_return_address(at + 1).expect("a non-zero address"),
        ];
        addresses.map(|address| {
            let mut rules = CacheX86_64::new();
            let cold = probe_frame(unwinder, address, &mut rules);
            let warm = probe_frame(unwinder, address, &mut rules);
            assert_eq!(cold, warm, "{address:?}");
            cold
        })
    }

    #[test]
    fn the_probe_learns_what_each_rule_does_with_bp() {
        use BpRule::{Keeps, Reads, Restores};
        assert_eq!(probed(vramshim_bp_probe_start), [Keeps, Keeps]);
        assert_eq!(probed(vramshim_bp_probe_saved), [Restores(0), Restores(0)]);
        assert_eq!(
            probed(vramshim_bp_probe_framed),
            [Restores(32), Restores(32)]
        );
        assert_eq!(
            probed(vramshim_bp_probe_popped),
            [Restores(-8), Restores(-8)]
        );
        assert_eq!(probed(vramshim_bp_probe_fp), [Reads, Reads]);
        assert_eq!(probed(vramshim_bp_probe_fp_odd), [Reads, Reads]);
        // Two points would call it Keeps; a full evaluation may read any register.
        assert_eq!(probed(vramshim_bp_probe_expression), [Reads, Reads]);
        assert_eq!(probed(vramshim_bp_probe_end), [Keeps, Keeps]);
        // No module there: framehop's frame-pointer fallback.
        let unwinder = unsafe { &*current_unwinder(0) };
        let nowhere = FrameAddress::from_return_address(0x18).expect("non-zero");
        let mut rules = CacheX86_64::new();
        assert_eq!(probe_frame(unwinder, nowhere, &mut rules).bp, Reads);
    }

    #[test]
    fn the_probe_learns_how_far_each_rule_moves_sp() {
        let steps = |label| probed_rules(label).map(|rule| rule.sp_step_by_8);
        // CFA = rsp + 8 * n, the return address just below it.
        assert_eq!(steps(vramshim_bp_probe_start), [1, 1]);
        assert_eq!(steps(vramshim_bp_probe_saved), [2, 2]);
        assert_eq!(steps(vramshim_bp_probe_framed), [6, 6]);
        assert_eq!(steps(vramshim_bp_probe_popped), [1, 1]);
        // The frame-pointer rule.
        assert_eq!(
            steps(vramshim_bp_probe_fp),
            [FRAME_POINTER_STEP, FRAME_POINTER_STEP]
        );
        // Evaluated in full, or the end of the stack: framehop steps them.
        assert_eq!(steps(vramshim_bp_probe_fp_odd), [0, 0]);
        assert_eq!(steps(vramshim_bp_probe_expression), [0, 0]);
        assert_eq!(steps(vramshim_bp_probe_end), [0, 0]);
    }

    /// Each probed rule stepped by [`step_learnt`] and by framehop over the same stack
    /// (every word `address ^ salt`, bounded reads): the same result, registers and reads.
    #[test]
    fn stepping_a_learnt_rule_is_what_framehop_does() {
        // SAFETY: built by `current_unwinder` and never freed.
        let unwinder = unsafe { &*current_unwinder(0) };
        let labels: [unsafe extern "C" fn(); 6] = [
            vramshim_bp_probe_start,
            vramshim_bp_probe_saved,
            vramshim_bp_probe_framed,
            vramshim_bp_probe_popped,
            vramshim_bp_probe_fp,
            vramshim_bp_probe_end,
        ];
        // No module there: framehop's frame-pointer fallback.
        let nowhere = FrameAddress::from_return_address(0x18).expect("non-zero");
        let mut stepped = 0;
        let addresses = labels.into_iter().flat_map(|label| {
            let at = label as usize as u64;
            [
                FrameAddress::from_instruction_pointer(at),
                FrameAddress::from_return_address(at + 1).expect("a non-zero address"),
            ]
        });
        for address in addresses.chain([nowhere]) {
            {
                let mut rules = CacheX86_64::new();
                let probe_regs = UnwindRegsX86_64::new(address.address(), 0x1800, 0x1900);
                let mut warm = probe_regs;
                let _ = unwinder.unwind_frame(address, &mut warm, &mut rules, &mut |_| Ok(1));
                let rule = probe_frame(unwinder, address, &mut rules);
                if rule.sp_step_by_8 == 0 {
                    continue;
                }
                stepped += 1;
                let first = !address.is_return_address();
                // Stack pointers across the bounds' edges; frame pointers above, below, at
                // the bounds' edges and zero; words zero or not.
                let sps = [0xff8, 0x1000, 0x1008, 0x17f0, 0x1fd0, 0x1ff8, 0x2000];
                let bps = [
                    0,
                    0x4242,
                    0x1000,
                    0x17e0,
                    0x1800,
                    0x1fe8,
                    0x1ff0,
                    u64::MAX - 8,
                ];
                for (sp, bp) in sps.into_iter().flat_map(|sp| bps.map(|bp| (sp, bp))) {
                    for salt in [0, 0x7777_0000] {
                        let mut run = |ours: bool| {
                            let mut regs = UnwindRegsX86_64::new(address.address(), sp, bp);
                            let mut reads = Vec::new();
                            let mut read = |addr: u64| {
                                if !readable(addr, BOUNDS) {
                                    return Err(());
                                }
                                let zero = salt == 0 && (addr == sp || addr == bp.wrapping_add(8));
                                let word = if zero { 0 } else { addr ^ salt };
                                reads.push(addr);
                                Ok(word)
                            };
                            let result = if ours {
                                step_learnt(rule.sp_step_by_8, rule.bp, first, &mut regs, &mut read)
                                    .ok()
                                    .flatten()
                            } else {
                                unwinder
                                    .unwind_frame(address, &mut regs, &mut rules, &mut read)
                                    .ok()
                                    .flatten()
                            };
                            (result, regs.ip(), regs.sp(), regs.bp(), reads)
                        };
                        let ours = run(true);
                        let framehops = run(false);
                        assert_eq!(ours, framehops, "{address:?} sp {sp:#x} bp {bp:#x} {salt}");
                    }
                }
            }
        }
        assert_eq!(stepped, 11);
    }

    fn probe_bp_rule<S>(step: S) -> BpRule
    where
        S: FnMut(
            &mut UnwindRegsX86_64,
            &mut dyn FnMut(u64) -> Result<u64, ()>,
        ) -> Option<Result<Option<u64>, framehop::Error>>,
    {
        probe_rule(step).bp
    }

    #[test]
    fn steps_that_fail_or_run_no_cached_rule_count_as_reading_bp() {
        use framehop::Error;
        // A step that moves the stack pointer by bp, one that returns to bp, one that fails.
        let by_bp = probe_bp_rule(|regs, _| {
            regs.set_sp(regs.bp());
            Some(Ok(Some(0x1234)))
        });
        assert_eq!(by_bp, BpRule::Reads);
        let to_bp = probe_bp_rule(|regs, _| Some(Ok(Some(regs.bp()))));
        assert_eq!(to_bp, BpRule::Reads);
        let fails = probe_bp_rule(|_, _| Some(Err(Error::IntegerOverflow)));
        assert_eq!(fails, BpRule::Reads);
        // Keeps bp, but no cached rule ran.
        assert_eq!(probe_bp_rule(|_, _| None), BpRule::Reads);
        // Swaps the two: neither kept nor one word.
        let swaps = probe_bp_rule(|regs, _| {
            regs.set_bp(PROBE_BPS[0] ^ PROBE_BPS[1] ^ regs.bp());
            Some(Ok(Some(0x1234)))
        });
        assert_eq!(swaps, BpRule::Reads);
        // Restores from a word out of an i32's reach of sp.
        let far = probe_bp_rule(|regs, stack| {
            regs.set_bp(stack(PROBE_SP << 1).ok()?);
            Some(Ok(Some(0x1234)))
        });
        assert_eq!(far, BpRule::Reads);
        let near = probe_bp_rule(|regs, stack| {
            regs.set_bp(stack(PROBE_SP - 0x18).ok()?);
            Some(Ok(Some(0x1234)))
        });
        assert_eq!(near, BpRule::Restores(-0x18));
    }

    #[test]
    fn a_restored_word_refused_below_the_first_frames_sp_keeps_bp() {
        let restores = |offset: i32, first, sp| BpRule::Restores(offset).at(first, sp, BOUNDS);
        assert_eq!(restores(8, false, 0x1800), BpUse::Restores(0x1808));
        assert_eq!(restores(-16, false, 0x1800), BpUse::Restores(0x17f0));
        assert_eq!(restores(-16, true, 0x1800), BpUse::Restores(0x17f0));
        // In the first frame, a refused read below the stack pointer keeps `bp` (framehop's
        // epilogue case); a read refused elsewhere ends the walk.
        assert_eq!(restores(-8, true, 0x1000), BpUse::Keeps);
        assert_eq!(restores(-8, false, 0x1000), BpUse::Restores(0xff8));
        assert_eq!(restores(-8, true, 0x1008), BpUse::Restores(0x1000));
        // Past the end of the address space: `exec` fails before reading.
        assert_eq!(
            BpRule::Restores(8).at(false, u64::MAX - 3, BOUNDS),
            BpUse::Keeps
        );
        assert_eq!(BpRule::Reads.at(true, 0x1800, BOUNDS), BpUse::Reads);
        assert_eq!(BpRule::Keeps.at(false, 0x1800, BOUNDS), BpUse::Keeps);
    }

    #[test]
    fn bp_rules_are_kept_per_address_first_frame_and_unwinder() {
        let mut table = BpRules::new(BP_RULE_SLOTS);
        let unwinder = 0x10 as *const ProcessUnwinder;
        table.use_unwinder(unwinder);
        assert_eq!(table.get(0x4000, false), None);
        let rule = |bp, sp_step_by_8| FrameRule { bp, sp_step_by_8 };
        table.insert(0x4000, false, rule(BpRule::Restores(-24), 3));
        table.insert(0x4000, true, rule(BpRule::Keeps, 1));
        table.insert(0x4001, false, rule(BpRule::Reads, 0));
        let get = |table: &BpRules, lookup, first| table.get(lookup, first);
        assert_eq!(
            get(&table, 0x4000, false),
            Some(rule(BpRule::Restores(-24), 3))
        );
        assert_eq!(get(&table, 0x4000, true), Some(rule(BpRule::Keeps, 1)));
        assert_eq!(get(&table, 0x4001, false), Some(rule(BpRule::Reads, 0)));
        assert_eq!(table.get(0x4001, true), None);
        table.use_unwinder(unwinder);
        assert_eq!(
            get(&table, 0x4000, false),
            Some(rule(BpRule::Restores(-24), 3))
        );
        // Three slots filled, none over another address; then one taken over.
        assert_eq!(table.conflicts, 0);
        table.insert(0x4000, false, rule(BpRule::Keeps, 2));
        assert_eq!(table.conflicts, 0);
        let other = (0x4002..)
            .find(|&lookup| table.slot(lookup, false) == table.slot(0x4000, false))
            .expect("another address in the slot");
        table.insert(other, false, rule(BpRule::Keeps, 1));
        assert_eq!(table.conflicts, 1);
        assert_eq!(table.get(0x4000, false), None);
        table.use_unwinder(0x20 as *const ProcessUnwinder);
        assert_eq!(table.get(0x4000, false), None);
    }

    /// What [`keep_needed_bp`] works on.
    struct Steps {
        reads: Vec<(u64, u64)>,
        states: Vec<FrameEntry>,
        bp_uses: Vec<BpUse>,
    }

    fn keep(walk: &mut Steps, needed_after: bool) {
        keep_needed_bp(
            &mut walk.reads,
            &mut walk.states,
            &walk.bp_uses,
            needed_after,
        );
    }

    /// A walk of `uses.len()` steps over frames `0..frames`, each step reading the word its
    /// rule restores (if any) and then the return address above it.
    fn walk_of(frames: usize, uses: &[BpUse]) -> Steps {
        let mut walk = Steps {
            reads: Vec::new(),
            states: Vec::new(),
            bp_uses: Vec::new(),
        };
        for i in 0..frames {
            let sp = 0x1000 + 0x40 * i as u64;
            walk.states.push(FrameEntry {
                state: (0x5000 + i as u64, sp, 0x7000 + i as u64),
                reads_from: walk.reads.len() as u32,
                bp_needed: true,
            });
            if let Some(&bp_use) = uses.get(i) {
                if let BpUse::Restores(at) | BpUse::FollowsFramePointer(at) = bp_use {
                    walk.reads.push((at, 0xb0 + i as u64));
                }
                walk.reads.push((sp + 0x38, 0xa0 + i as u64));
            }
        }
        walk.bp_uses.extend_from_slice(uses);
        walk
    }

    fn needed(walk: &Steps) -> Vec<bool> {
        walk.states.iter().map(|frame| frame.bp_needed).collect()
    }

    fn reads_from(walk: &Steps) -> Vec<u32> {
        walk.states.iter().map(|frame| frame.reads_from).collect()
    }

    #[test]
    fn only_the_bp_a_later_step_reads_is_kept() {
        let uses = [
            BpUse::Restores(0x1010),
            BpUse::Keeps,
            BpUse::Reads,
            BpUse::Keeps,
            BpUse::Restores(0x1110),
        ];
        // Ended after its last step: nothing reads the last `bp` restored.
        let mut walk = walk_of(5, &uses);
        keep(&mut walk, false);
        assert_eq!(needed(&walk), [false, true, true, false, false]);
        // Frame 0's restored word is read (through frame 1's kept `bp`) by frame 2's step;
        // frame 4's is read by nothing.
        assert_eq!(
            walk.reads,
            [
                (0x1010, 0xb0),
                (0x1038, 0xa0),
                (0x1078, 0xa1),
                (0x10b8, 0xa2),
                (0x10f8, 0xa3),
                (0x1138, 0xa4)
            ]
        );
        assert_eq!(reads_from(&walk), [0, 2, 3, 4, 5]);

        // Joined after its last step to a walk whose state there needs `bp`: the last word
        // restored stays.
        let mut walk = walk_of(5, &uses);
        keep(&mut walk, true);
        assert_eq!(needed(&walk), [false, true, true, false, false]);
        assert_eq!(walk.reads.len(), 7);
        assert_eq!(walk.reads[5], (0x1110, 0xb4));
        assert_eq!(reads_from(&walk), [0, 2, 3, 4, 5]);

        // Words restored into a `bp` nothing reads before the next restore.
        let uses = [
            BpUse::Keeps,
            BpUse::Restores(0x1050),
            BpUse::Keeps,
            BpUse::Restores(0x10d0),
        ];
        let mut walk = walk_of(4, &uses);
        keep(&mut walk, false);
        assert_eq!(needed(&walk), [false, false, false, false]);
        assert_eq!(
            walk.reads,
            [
                (0x1038, 0xa0),
                (0x1078, 0xa1),
                (0x10b8, 0xa2),
                (0x10f8, 0xa3)
            ]
        );
        assert_eq!(reads_from(&walk), [0, 1, 2, 3]);

        // Stopped at the frame limit: no step from its last frame.
        let uses = [BpUse::Keeps, BpUse::Keeps];
        let mut walk = walk_of(3, &uses);
        keep(&mut walk, true);
        assert_eq!(needed(&walk), [false, false, false]);
        let uses = [BpUse::Keeps, BpUse::Reads];
        let mut walk = walk_of(3, &uses);
        keep(&mut walk, false);
        assert_eq!(needed(&walk), [true, true, false]);
    }

    /// A frame-pointer step reads its own `bp` (its state's is needed) and the word there
    /// becomes the next `bp`: that word is kept only where a later step reads the next `bp`.
    #[test]
    fn a_frame_pointers_saved_word_is_kept_only_where_a_later_step_reads_it() {
        // Frame 1's caller does not keep a frame pointer: frame 2 restores `bp` again, so the
        // word frame 1 followed (whatever its caller held in `rbp`) is dropped.
        let uses = [
            BpUse::Restores(0x1010),
            BpUse::FollowsFramePointer(0x7001),
            BpUse::Restores(0x1090),
            BpUse::Keeps,
        ];
        let mut walk = walk_of(4, &uses);
        keep(&mut walk, false);
        assert_eq!(needed(&walk), [false, true, false, false]);
        assert_eq!(
            walk.reads,
            [
                (0x1010, 0xb0),
                (0x1038, 0xa0),
                (0x1078, 0xa1),
                (0x10b8, 0xa2),
                (0x10f8, 0xa3)
            ]
        );
        assert_eq!(reads_from(&walk), [0, 2, 3, 4]);

        // Its caller keeps one too (frame 2 follows it): the word is the next frame pointer,
        // kept; and so where the walk joins one whose state there needs `bp`.
        let uses = [
            BpUse::Keeps,
            BpUse::FollowsFramePointer(0x7001),
            BpUse::FollowsFramePointer(0x7002),
        ];
        let mut walk = walk_of(3, &uses);
        keep(&mut walk, false);
        assert_eq!(needed(&walk), [true, true, true]);
        assert_eq!(
            walk.reads,
            [
                (0x1038, 0xa0),
                (0x7001, 0xb1),
                (0x1078, 0xa1),
                (0x10b8, 0xa2)
            ]
        );
        assert_eq!(reads_from(&walk), [0, 1, 3]);
        let mut walk = walk_of(3, &uses);
        keep(&mut walk, true);
        assert_eq!(walk.reads.len(), 5);
        assert_eq!(walk.reads[3], (0x7002, 0xb2));
    }

    #[test]
    fn states_compare_bp_only_where_needed() {
        assert!(same_state((1, 2, 3), false, (1, 2, 4)));
        assert!(!same_state((1, 2, 3), true, (1, 2, 4)));
        assert!(same_state((1, 2, 3), true, (1, 2, 3)));
        assert!(!same_state((1, 2, 3), false, (1, 5, 3)));
        assert!(!same_state((1, 2, 3), false, (6, 2, 3)));
    }
}
