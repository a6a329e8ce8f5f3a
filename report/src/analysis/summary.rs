//! The summary: counts by API family, largest allocations, device memory samples against
//! what the hooks tracked.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::apis::{Family, FamilyCache};
use crate::replay::{Effect, Live, Observer, Process, SegmentChange, State, Step};

/// Calls of one API family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilyCounts {
    pub allocs: u64,
    pub frees: u64,
    pub failures: u64,
    /// Bytes of successful allocations over the whole run.
    pub allocated_bytes: u64,
}

/// One `cuMemGetInfo` sample beside the bytes the hooks saw live at that moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySample {
    pub process: u32,
    pub device: i32,
    pub t_ns: u64,
    /// total - free, as the driver reported.
    pub used: u64,
    pub total: u64,
    /// Live bytes on the device over all recorded processes.
    pub tracked: u64,
}

impl MemorySample {
    /// Used memory no hook accounts for: CUDA context, modules, other processes.
    pub fn untracked(&self) -> u64 {
        self.used.saturating_sub(self.tracked)
    }
}

/// How many of the largest allocations are kept.
pub const LARGEST: usize = 10;

/// Observer collecting the summary's counts.
pub struct Summary {
    device: Option<i32>,
    /// Per process, per family (indexed like `Family::ALL`).
    pub families: Vec<[FamilyCounts; Family::ALL.len()]>,
    /// Per device: failed allocations.
    pub failures: Vec<(i32, u64)>,
    pub samples: Vec<MemorySample>,
    largest: BinaryHeap<Reverse<(u64, Reverse<u64>, LiveKey)>>,
    /// The smallest size in `largest` once it is full: a smaller allocation cannot enter
    /// (checked first, without reaching into the heap).
    largest_floor: u64,
    /// Family of each api index, per process.
    family_cache: FamilyCache,
}

/// A `Live` kept in a heap (ordered by size, then earliest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LiveKey(Live);

impl PartialOrd for LiveKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LiveKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0.process, self.0.addr, self.0.handle).cmp(&(
            other.0.process,
            other.0.addr,
            other.0.handle,
        ))
    }
}

impl Summary {
    pub fn new(processes: usize, device: Option<i32>) -> Summary {
        Summary {
            device,
            families: vec![[FamilyCounts::default(); Family::ALL.len()]; processes],
            failures: Vec::new(),
            samples: Vec::new(),
            largest: BinaryHeap::new(),
            largest_floor: 0,
            family_cache: FamilyCache::default(),
        }
    }

    /// The largest successful allocations of the run, largest first (earliest first on ties).
    pub fn largest(&self) -> Vec<Live> {
        let mut out: Vec<_> = self
            .largest
            .iter()
            .map(|Reverse((_, _, key))| key.0)
            .collect();
        out.sort_by_key(|live| (Reverse(live.size), live.t_ns));
        out
    }

    /// Counts summed over processes.
    pub fn total_families(&self) -> [FamilyCounts; Family::ALL.len()] {
        let mut total = [FamilyCounts::default(); Family::ALL.len()];
        for per_process in &self.families {
            for (sum, counts) in total.iter_mut().zip(per_process) {
                sum.allocs += counts.allocs;
                sum.frees += counts.frees;
                sum.failures += counts.failures;
                sum.allocated_bytes = sum.allocated_bytes.saturating_add(counts.allocated_bytes);
            }
        }
        total
    }
}

impl Observer for Summary {
    #[inline(always)]
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event {
                process,
                event,
                effect,
                ..
            } => {
                // A free counts for the device of the memory it frees, which need not be the
                // device current when it was called (the event's device).
                let device = match effect {
                    Effect::Added(live) | Effect::Removed(live) => live.device,
                    _ => event.device,
                };
                if self.device.is_some_and(|d| d != device) {
                    return;
                }
                // Tensor view: the calls are the driver's (PyTorch's segments, whose
                // allocation the replay folds into the allocator's word on it); its blocks
                // count among the largest allocations only.
                let tensor = event.kind.is_tensor();
                let api = match state.segment_change_ref() {
                    Some(SegmentChange::Added(segment) | SegmentChange::Removed(segment)) => {
                        segment.api
                    }
                    None => event.api,
                };
                let family = self.family_cache.of(processes, *process, api);
                // `ALL` lists the families in declaration order.
                let index = family as usize;
                let counts = &mut self.families[*process as usize][index];
                match state.segment_change_ref() {
                    // (Not held back, the allocation already counted as one.)
                    Some(SegmentChange::Added(segment))
                        if !matches!(effect, Effect::Removed(_)) =>
                    {
                        counts.allocs += 1;
                        counts.allocated_bytes =
                            counts.allocated_bytes.saturating_add(segment.size);
                    }
                    Some(SegmentChange::Removed(_)) => counts.frees += 1,
                    _ => {}
                }
                match effect {
                    Effect::Added(live) => {
                        if !tensor {
                            counts.allocs += 1;
                            counts.allocated_bytes =
                                counts.allocated_bytes.saturating_add(live.size);
                        }
                        // Size and sequence number decide (the live object itself only on a
                        // tie of both): it is copied only when it enters the heap.
                        let head = (live.size, Reverse(state.seq));
                        let enters = self.largest.len() < LARGEST
                            || (live.size >= self.largest_floor
                                && self.largest.peek().is_some_and(|Reverse(min)| {
                                    let min_head = (min.0, min.1);
                                    head > min_head || (head == min_head && LiveKey(*live) > min.2)
                                }));
                        if enters {
                            if self.largest.len() >= LARGEST {
                                self.largest.pop();
                            }
                            self.largest.push(Reverse((head.0, head.1, LiveKey(*live))));
                            if self.largest.len() >= LARGEST {
                                self.largest_floor =
                                    self.largest.peek().map_or(0, |Reverse(min)| min.0);
                            }
                        }
                    }
                    Effect::Removed(_) | Effect::Unmatched if !tensor => counts.frees += 1,
                    Effect::Removed(_) | Effect::Unmatched => {}
                    Effect::Failed => {
                        counts.failures += 1;
                        match self.failures.iter_mut().find(|(d, _)| *d == event.device) {
                            Some((_, n)) => *n += 1,
                            None => {
                                self.failures.push((event.device, 1));
                                self.failures.sort();
                            }
                        }
                    }
                    // Maps and reservations are address ranges, not memory: VMM memory is
                    // counted by its create/release.
                    Effect::None => {}
                }
            }
            Step::MemInfo {
                process,
                t_ns,
                info,
            } => {
                if self.device.is_some_and(|d| d != info.device) {
                    return;
                }
                self.samples.push(MemorySample {
                    process: *process,
                    device: info.device,
                    t_ns: *t_ns,
                    used: info.total.saturating_sub(info.free),
                    total: info.total,
                    tracked: state.reserved_bytes(info.device),
                });
            }
            Step::Dump { .. } => {}
        }
    }
}
