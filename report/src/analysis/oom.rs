//! Failed allocations: what was live, how much was free, why it failed, and PyTorch's
//! release-cache-and-retry sequence around it.

use std::cmp::Reverse;

use super::allocator::AllocEnv;
use super::groups::{IdTotals, totals_by_id};
use vramshim_format::{Event, EventKind};

use crate::replay::{Effect, Live, Observer, Process, SegmentChange, State, Step};

/// Failures analysed in full; later ones are only counted (each keeps a live-set summary).
pub const DETAILED: usize = 50;
/// Largest live allocations kept per failure.
pub const LARGEST_LIVE: usize = 5;

/// Why an allocation failed, as far as the recording tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The request was larger than the device's free memory.
    ExceededFree,
    /// Free memory was enough: fragmentation of the driver's address space, a pool or
    /// process limit, or memory that was free only in total, not in one piece.
    FragmentationOrLimit,
    /// No free/total reading was recorded with the failure.
    Unknown,
    /// PyTorch's caching allocator refused the request itself, without asking the driver:
    /// the segment it needed would pass `set_per_process_memory_fraction` (known from its
    /// `oom` entry with no failed call before it).
    AllocatorLimit,
    /// The call failed with another error than out of memory (the result says which): not an
    /// OOM. On an H200 PyTorch 2.11's expandable segments ask `cuMemCreate` for a fabric
    /// handle first, get 800 (`CUDA_ERROR_NOT_PERMITTED`) and ask again for a file-descriptor
    /// handle.
    OtherError,
}

/// `CUDA_ERROR_OUT_OF_MEMORY` and `cudaErrorMemoryAllocation`: both 2.
pub const OUT_OF_MEMORY: u32 = 2;

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::ExceededFree => "exceeded_free_memory",
            Verdict::FragmentationOrLimit => "fragmentation_or_limit",
            Verdict::Unknown => "unknown",
            Verdict::OtherError => "other_error",
            Verdict::AllocatorLimit => "allocator_limit",
        }
    }
}

impl Failure {
    /// Whether the call failed for lack of memory (every result but [`Verdict::OtherError`]'s).
    pub fn is_out_of_memory(&self) -> bool {
        self.verdict != Verdict::OtherError
    }
}

/// PyTorch-style retry after a failure: frees on the failing thread, then the same request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    pub released_bytes: u64,
    pub released_count: u64,
    /// Whether the repeated request succeeded.
    pub succeeded: bool,
    pub t_ns: u64,
    /// The release was `max_split_size_mb`'s first step, not the retry PyTorch counts: after a
    /// failed `cudaMalloc` its caching allocator releases cached blocks of at least the
    /// maximum split size (the largest first, until they cover the request) and calls
    /// `cudaMalloc` again without counting a retry (`num_alloc_retries`); only when that fails
    /// too does it release every cached block and retry, counted. Told from the log: the
    /// process set `max_split_size_mb`, the request is a large-pool segment (not 2 MiB),
    /// every block released is at least that size and together they cover the request.
    pub oversize: bool,
}

/// Whether the program got past `failures[index]`: its retry succeeded, or its retry was
/// `max_split_size_mb`'s uncounted step and the counted retry after it succeeded.
pub fn recovered(failures: &[Failure], mut index: usize) -> bool {
    // Each step goes to a later failure, so this ends.
    loop {
        let Some(failure) = failures.get(index) else {
            return false;
        };
        match (failure.retry, failure.retried_by) {
            (Some(retry), _) if retry.succeeded => return true,
            (Some(retry), Some(next)) if retry.oversize && next > index => index = next,
            _ => return false,
        }
    }
}

/// One failed allocation.
#[derive(Clone, Debug)]
pub struct Failure {
    pub process: u32,
    pub t_ns: u64,
    /// Sequence number of the failed event.
    pub seq: u64,
    pub api: u16,
    pub device: i32,
    pub thread: u32,
    pub stream: u64,
    pub request: u64,
    pub result: u32,
    pub stack: u32,
    /// Device (free, total) read right after the failure.
    pub mem_info: Option<(u64, u64)>,
    /// Bytes the hooks saw live on the device at that moment (all processes).
    pub tracked_bytes: u64,
    pub tracked_count: u64,
    pub verdict: Verdict,
    /// Live set on the device by (process, stack id), and thread when the analysis splits by
    /// thread; None past [`DETAILED`].
    pub live_by_id: Option<IdTotals>,
    pub largest_live: Vec<Live>,
    /// Set when the same thread released memory and asked again.
    pub retry: Option<Retry>,
    /// This failure is itself the repeated request of an earlier failure's retry.
    pub is_retry_of: Option<usize>,
    /// Tensor view: the block PyTorch's allocator was asked for when it gave up (its `oom`
    /// entry's request), on the last failure of its sequence.
    pub block_request: Option<u64>,
    /// Tensor view: PyTorch's segments on the device then (count, bytes) and the part of
    /// them no tensor held (the allocator's cache).
    pub segments: Option<(u64, u64, u64)>,
    /// The failure that is this one's repeated request (the inverse of `is_retry_of`).
    pub retried_by: Option<usize>,
}

/// A failure waiting to see whether its thread retries.
struct Pending {
    process: u32,
    thread: u32,
    failure: usize,
    released_bytes: u64,
    released_count: u64,
    /// Every block released so far is at least the process's `max_split_size_mb`.
    only_oversize: bool,
}

/// What a thread did since its last successful allocation.
struct SinceAllocation {
    process: u32,
    thread: u32,
    /// An allocating call failed.
    failed: bool,
    released_bytes: u64,
    released_count: u64,
}

/// A device as a failure found it (see `Oom::scene`).
struct Scene {
    tracked_bytes: u64,
    tracked_count: u64,
    live_by_id: Option<IdTotals>,
    largest_live: Vec<Live>,
    segments: Option<(u64, u64, u64)>,
}

/// Observer collecting every failed allocation.
#[derive(Default)]
pub struct Oom {
    device: Option<i32>,
    /// Keep each failure's live set by thread too (`--by-thread`).
    by_thread: bool,
    pub failures: Vec<Failure>,
    pending: Vec<Pending>,
    /// `max_split_size_mb` of each process (by index), once read.
    max_split: Vec<Option<Option<u64>>>,
    /// Per thread that allocated: what it did since (see [`Oom::limit_refusal`]).
    since: Vec<SinceAllocation>,
}

impl Oom {
    /// Failures on every device, or only on `device`; `by_thread` keys each failure's live set
    /// by thread too.
    pub fn new(device: Option<i32>, by_thread: bool) -> Oom {
        Oom {
            device,
            by_thread,
            ..Oom::default()
        }
    }

    fn max_split_of(&mut self, processes: &[Process], process: u32) -> Option<u64> {
        let p = process as usize;
        if self.max_split.len() <= p {
            self.max_split.resize(p + 1, None);
        }
        *self.max_split[p].get_or_insert_with(|| {
            processes
                .get(p)
                .and_then(|process| AllocEnv::of(process).max_split_size)
        })
    }

    /// Whether the release before a repeated request of `request` bytes was
    /// `max_split_size_mb`'s uncounted step ([`Retry::oversize`]).
    fn oversize_release(&mut self, processes: &[Process], waiting: &Pending, request: u64) -> bool {
        const SMALL_POOL_SEGMENT: u64 = 2 << 20;
        self.max_split_of(processes, waiting.process)
            .is_some_and(|limit| {
                request != SMALL_POOL_SEGMENT
                    && waiting.released_count > 0
                    && waiting.only_oversize
                    && waiting.released_bytes >= limit.max(request)
            })
    }

    /// The entry of `thread` of `process` in [`Oom::since`].
    fn since_of(&mut self, process: u32, thread: u32) -> &mut SinceAllocation {
        let index = match self
            .since
            .iter()
            .position(|s| s.process == process && s.thread == thread)
        {
            Some(index) => index,
            None => {
                self.since.push(SinceAllocation {
                    process,
                    thread,
                    failed: false,
                    released_bytes: 0,
                    released_count: 0,
                });
                self.since.len() - 1
            }
        };
        &mut self.since[index]
    }

    /// What was on `device` at a failure: the live set's totals, its largest entries and its
    /// groups (the last two only for the first [`DETAILED`] failures), and the allocator's
    /// segments there. Both kinds of failure (a failed driver call, PyTorch's own refusal)
    /// describe the device the same way.
    fn scene(&self, state: &State, device: i32) -> Scene {
        let detailed = self.failures.len() < DETAILED;
        let on_device = || state.live().filter(move |live| live.device == device);
        let (tracked_bytes, tracked_count) = on_device()
            .fold((0u64, 0u64), |(bytes, count), live| {
                (bytes.saturating_add(live.size), count + 1)
            });
        let largest_live = if detailed {
            let mut all: Vec<Live> = on_device().copied().collect();
            all.sort_by_key(|live| (Reverse(live.size), live.t_ns));
            all.truncate(LARGEST_LIVE);
            all
        } else {
            Vec::new()
        };
        let segments = state
            .devices()
            .iter()
            .find(|d| d.device == device && d.segment_count > 0)
            .map(|d| {
                (
                    d.segment_count,
                    d.segment_bytes,
                    d.segment_bytes.saturating_sub(d.tensor_bytes),
                )
            });
        Scene {
            tracked_bytes,
            tracked_count,
            live_by_id: detailed.then(|| totals_by_id(on_device(), self.by_thread)),
            largest_live,
            segments,
        }
    }

    /// PyTorch's `oom` entry with no failed call on its thread since its last allocation:
    /// past `set_per_process_memory_fraction` the allocator refuses a segment without calling
    /// the driver, releases every cached segment (the frees this thread made since), retries
    /// (counted in `num_alloc_retries`) and refuses again. Recorded as a failure of the
    /// block's size, with that retry.
    fn limit_refusal(&mut self, state: &State, process: u32, t_ns: u64, event: &Event) {
        let since = self.since_of(process, event.thread);
        let (released_bytes, released_count) = (since.released_bytes, since.released_count);
        let scene = self.scene(state, event.device);
        self.failures.push(Failure {
            process,
            t_ns,
            seq: state.seq,
            api: event.api,
            device: event.device,
            thread: event.thread,
            stream: event.stream,
            request: event.size,
            result: OUT_OF_MEMORY,
            stack: event.stack,
            mem_info: None,
            tracked_bytes: scene.tracked_bytes,
            tracked_count: scene.tracked_count,
            verdict: Verdict::AllocatorLimit,
            live_by_id: scene.live_by_id,
            largest_live: scene.largest_live,
            retry: Some(Retry {
                released_bytes,
                released_count,
                succeeded: false,
                t_ns,
                oversize: false,
            }),
            is_retry_of: None,
            block_request: Some(event.size),
            segments: scene.segments,
            retried_by: None,
        });
    }

    /// The waiting failure at `index` saw its thread release `released` (a segment, or a
    /// driver allocation in the driver view).
    fn note_release(&mut self, processes: &[Process], index: usize, released: &Live) {
        let limit = self.max_split_of(processes, self.pending[index].process);
        let waiting = &mut self.pending[index];
        waiting.released_bytes = waiting.released_bytes.saturating_add(released.size);
        waiting.released_count += 1;
        waiting.only_oversize &= limit.is_some_and(|limit| released.size >= limit);
    }

    /// The waiting failure at `index` saw its thread get `taken`: the retry succeeded when it
    /// is the same request on the same device. The failure no longer waits either way.
    fn note_taken(&mut self, processes: &[Process], index: usize, taken: &Live, t_ns: u64) {
        let waiting = self.pending.swap_remove(index);
        let failure = &self.failures[waiting.failure];
        if taken.size == failure.request && taken.device == failure.device {
            let oversize = self.oversize_release(processes, &waiting, taken.size);
            self.failures[waiting.failure].retry = Some(Retry {
                released_bytes: waiting.released_bytes,
                released_count: waiting.released_count,
                succeeded: true,
                t_ns,
                oversize,
            });
        }
    }
}

impl Observer for Oom {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        let (process, t_ns, event, effect) = match step {
            Step::Event {
                process,
                t_ns,
                event,
                effect,
            } => (process, t_ns, event, effect),
            // A dump rebuilds the live set from scratch: a retry cannot span it.
            Step::Dump { process, .. } => {
                self.pending.retain(|p| p.process != *process);
                return;
            }
            Step::MemInfo { .. } => return,
        };
        let pending = self
            .pending
            .iter()
            .position(|p| p.process == *process && p.thread == event.thread);
        // What the thread did since its last allocation.
        let followed = self.device.is_none_or(|d| d == event.device);
        let since = self.since_of(*process, event.thread);
        match (effect, state.segment_change()) {
            (_, Some(SegmentChange::Removed(segment))) => {
                since.released_bytes = since.released_bytes.saturating_add(segment.size);
                since.released_count += 1;
            }
            (Effect::Removed(live), None) if live.kind != EventKind::TensorAlloc => {
                since.released_bytes = since.released_bytes.saturating_add(live.size);
                since.released_count += 1;
            }
            (Effect::Added(_), _) | (_, Some(SegmentChange::Added(_))) => {
                (since.failed, since.released_bytes, since.released_count) = (false, 0, 0);
            }
            (Effect::Failed, _) => since.failed = true,
            _ => {}
        }
        if event.kind == EventKind::TensorOom && !since.failed && followed {
            (since.released_bytes, since.released_count) = (0, 0);
            self.limit_refusal(state, *process, *t_ns, event);
            return;
        }
        // Tensor view: PyTorch's segments released and taken on this thread.
        match (state.segment_change(), pending) {
            (Some(SegmentChange::Removed(segment)), Some(index)) => {
                self.note_release(processes, index, &segment);
            }
            (Some(SegmentChange::Added(segment)), Some(index))
                if !matches!(effect, Effect::Removed(_)) =>
            {
                self.note_taken(processes, index, &segment, *t_ns);
                return;
            }
            _ => {}
        }
        if event.kind == EventKind::TensorOom {
            if let Some(failure) = self.failures.iter_mut().rev().find(|f| {
                f.process == *process && f.device == event.device && f.block_request.is_none()
            }) {
                failure.block_request = Some(event.size);
            }
            return;
        }
        match effect {
            Effect::Removed(live) => {
                if let Some(index) = pending {
                    self.note_release(processes, index, live);
                }
            }
            Effect::Added(live) => {
                if let Some(index) = pending {
                    self.note_taken(processes, index, live, *t_ns);
                }
            }
            Effect::Failed => {
                if self.device.is_some_and(|d| d != event.device) {
                    return;
                }
                let mut is_retry_of = None;
                // The repeated request failed after max_split_size_mb's uncounted step:
                // PyTorch goes on to release everything and retry, counted.
                let mut retried_again = false;
                if let Some(index) = pending {
                    let waiting = self.pending.swap_remove(index);
                    let failure = &self.failures[waiting.failure];
                    if event.size == failure.request && event.device == failure.device {
                        let oversize = self.oversize_release(processes, &waiting, event.size);
                        self.failures[waiting.failure].retry = Some(Retry {
                            released_bytes: waiting.released_bytes,
                            released_count: waiting.released_count,
                            succeeded: false,
                            t_ns: *t_ns,
                            oversize,
                        });
                        is_retry_of = Some(waiting.failure);
                        retried_again = oversize;
                    }
                }
                let scene = self.scene(state, event.device);
                // A recorder that saw no result code (0) is taken at its word: a failure.
                let verdict = match event.mem_info {
                    _ if event.result != OUT_OF_MEMORY && event.result != 0 => Verdict::OtherError,
                    Some((free, _)) if event.size > free => Verdict::ExceededFree,
                    Some(_) => Verdict::FragmentationOrLimit,
                    None => Verdict::Unknown,
                };
                let index = self.failures.len();
                self.failures.push(Failure {
                    process: *process,
                    t_ns: *t_ns,
                    seq: state.seq,
                    api: event.api,
                    device: event.device,
                    thread: event.thread,
                    stream: event.stream,
                    request: event.size,
                    result: event.result,
                    stack: event.stack,
                    mem_info: event.mem_info,
                    tracked_bytes: scene.tracked_bytes,
                    tracked_count: scene.tracked_count,
                    verdict,
                    live_by_id: scene.live_by_id,
                    largest_live: scene.largest_live,
                    retry: None,
                    is_retry_of,
                    block_request: None,
                    segments: scene.segments,
                    retried_by: None,
                });
                if let Some(first) = is_retry_of {
                    self.failures[first].retried_by = Some(index);
                }
                // A failed retry ends the sequence (but max_split_size_mb's step's); a first
                // failure may be retried. Another error's next call is a fallback, not a
                // retry after releasing memory.
                if (is_retry_of.is_none() || retried_again) && verdict != Verdict::OtherError {
                    self.pending.push(Pending {
                        process: *process,
                        thread: event.thread,
                        failure: index,
                        released_bytes: 0,
                        released_count: 0,
                        only_oversize: true,
                    });
                }
            }
            Effect::Unmatched | Effect::None => {}
        }
    }
}
