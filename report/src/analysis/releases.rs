//! PyTorch's caching allocator releasing cached segments inside an allocation when no driver
//! call failed, told apart by the native stack of each `cudaFree` (the recorder keeps one
//! by default once PyTorch's tracker records, see the shim's `capture::stack_segment_releases`).
//! Under `expandable_segments:True` a release is `ExpandableSegment::unmap`'s `cuMemUnmap` of
//! each page, then the tracker's unmap entry for the range: the unmaps' stack classifies it.
//!
//! `DeviceCachingAllocator::malloc` (c10/cuda/CUDACachingAllocator.cpp, torch 2.4 to 2.15),
//! when no cached block fits:
//! 1. with a memory fraction and `garbage_collection_threshold`,
//!    `garbage_collect_cached_blocks` frees old unused segments first (not a retry);
//! 2. `alloc_block`; past `set_per_process_memory_fraction` it refuses without calling
//!    `cudaMalloc`, so the log shows no failure;
//! 3. with `max_split_size_mb`, `release_available_cached_blocks` frees oversize segments and
//!    `alloc_block` again (not a retry);
//! 4. `release_cached_blocks` frees every unsplit cached segment and `alloc_block(isRetry)`:
//!    `num_alloc_retries` += 1, whatever the outcome.
//!
//! After a failed `cudaMalloc` the same steps follow a failure in the log: the `oom` analysis
//! counts those (and the failed retry past the fraction, from the tracker's `oom` entry).
//! This one counts what no failure marks: the retry past the fraction that succeeds, and the
//! one whose `cudaMalloc` then fails; and lists the garbage collection's and the oversize
//! releases. `emptyCache` also calls `release_cached_blocks`, but not under `malloc`.

use rustc_hash::FxHashMap;
use vramshim_format::EventKind;

use crate::replay::{Effect, Observer, Process, SegmentChange, State, Step};
use crate::symbols::Symbolizer;

/// Why the allocator released a segment, from the free's native stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseKind {
    /// `release_cached_blocks` under `malloc`: a retry PyTorch counts.
    Retry,
    /// `garbage_collect_cached_blocks` (under `malloc`).
    GarbageCollection,
    /// `release_available_cached_blocks` (under `malloc`): `max_split_size_mb`'s release.
    Oversize,
    /// Anything else (`empty_cache()`, no stack, not PyTorch's).
    Other,
}

const MALLOC: &str = "DeviceCachingAllocator::malloc(";
const BY_FUNCTION: [(&str, ReleaseKind); 3] = [
    (
        "DeviceCachingAllocator::release_cached_blocks(",
        ReleaseKind::Retry,
    ),
    (
        "DeviceCachingAllocator::garbage_collect_cached_blocks(",
        ReleaseKind::GarbageCollection,
    ),
    (
        "DeviceCachingAllocator::release_available_cached_blocks(",
        ReleaseKind::Oversize,
    ),
];

/// The kind of the innermost releasing function among the frames (innermost first), when a
/// `DeviceCachingAllocator::malloc` frame calls it.
pub fn kind_of<'a>(functions: impl IntoIterator<Item = Option<&'a str>>) -> ReleaseKind {
    let mut found = None;
    for function in functions.into_iter().flatten() {
        match found {
            None => {
                found = BY_FUNCTION
                    .iter()
                    .find(|(name, _)| function.contains(name))
                    .map(|(_, kind)| *kind);
            }
            Some(kind) if function.contains(MALLOC) => return kind,
            Some(_) => {}
        }
    }
    ReleaseKind::Other
}

/// Segments one thread released inside one allocation, and what came of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release {
    pub process: u32,
    pub thread: u32,
    pub device: i32,
    pub kind: ReleaseKind,
    /// The first free.
    pub t_ns: u64,
    pub released_bytes: u64,
    pub released_count: u64,
    /// The segment size asked for next (a failed `cudaMalloc`'s size; 0 when PyTorch refused
    /// again past the fraction, which its `oom` entry tells).
    pub request: u64,
    /// Whether that allocation succeeded.
    pub succeeded: bool,
    /// When it ended (the segment taken, or the failure).
    pub end_t_ns: u64,
}

/// One thread's releases since its last allocation.
struct Thread {
    process: u32,
    thread: u32,
    /// A driver allocation failed since the last allocation: the releases that follow are that
    /// failure's retry, which the `oom` analysis counts.
    after_failure: bool,
    /// Open runs, in the order they started (at most one per kind).
    open: Vec<Release>,
    /// Expandable segments: the kind of the last `cuMemUnmap`, for the tracker's unmap entry
    /// that follows it (the driver calls carry the stack, the entry the segment change).
    unmap_kind: ReleaseKind,
}

/// Observer finding [`Release`]s on every device, or only on one.
#[derive(Default)]
pub struct Releases {
    device: Option<i32>,
    /// Closed runs, in time order of their end.
    pub list: Vec<Release>,
    threads: Vec<Thread>,
    symbolizers: FxHashMap<u32, Symbolizer>,
    kinds: FxHashMap<(u32, u32), ReleaseKind>,
}

impl Releases {
    pub fn new(device: Option<i32>) -> Releases {
        Releases {
            device,
            ..Releases::default()
        }
    }

    fn kind(&mut self, processes: &[Process], process: u32, stack: u32) -> ReleaseKind {
        if stack == 0 {
            return ReleaseKind::Other;
        }
        if let Some(kind) = self.kinds.get(&(process, stack)) {
            return *kind;
        }
        let kind = match processes.get(process as usize) {
            Some(info) => match info.stacks.get(&stack) {
                Some(ips) => {
                    let symbolizer = self
                        .symbolizers
                        .entry(process)
                        .or_insert_with(|| Symbolizer::new(Vec::new()));
                    if let Some(new) = info.modules.get(symbolizer.module_count()..) {
                        symbolizer.add_modules(new);
                    }
                    let frames = symbolizer.stack(ips);
                    kind_of(frames.iter().map(|f| f.function.as_deref()))
                }
                None => ReleaseKind::Other,
            },
            None => ReleaseKind::Other,
        };
        self.kinds.insert((process, stack), kind);
        kind
    }

    /// The index of `thread` of `process` in `threads`, added if new.
    fn thread(&mut self, process: u32, thread: u32) -> usize {
        match self
            .threads
            .iter()
            .position(|t| t.process == process && t.thread == thread)
        {
            Some(index) => index,
            None => {
                self.threads.push(Thread {
                    process,
                    thread,
                    after_failure: false,
                    open: Vec::new(),
                    unmap_kind: ReleaseKind::Other,
                });
                self.threads.len() - 1
            }
        }
    }

    /// Closes the thread's open runs: the allocation after them asked for `request` bytes and
    /// `succeeded`; `keep_retry` false drops an open retry (counted elsewhere).
    fn close(&mut self, at: usize, request: u64, succeeded: bool, t_ns: u64, keep_retry: bool) {
        let open = std::mem::take(&mut self.threads[at].open);
        for mut run in open {
            if run.kind == ReleaseKind::Retry && !keep_retry {
                continue;
            }
            run.request = request;
            run.succeeded = succeeded;
            run.end_t_ns = t_ns;
            self.list.push(run);
        }
    }
}

impl Observer for Releases {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        let (process, t_ns, event, effect) = match step {
            Step::Event {
                process,
                t_ns,
                event,
                effect,
            } => (*process, *t_ns, *event, effect),
            Step::Dump { process, .. } => {
                self.threads.retain(|t| t.process != *process);
                return;
            }
            Step::MemInfo { .. } => return,
        };
        if self.device.is_some_and(|d| d != event.device) {
            return;
        }
        let thread = event.thread;
        let segment = state.segment_change();
        let freed = match (segment, effect) {
            (Some(SegmentChange::Removed(live)), _) => Some(live.size),
            (None, Effect::Removed(live))
                if matches!(live.kind, EventKind::Alloc | EventKind::Create) =>
            {
                Some(live.size)
            }
            _ => None,
        };
        let added = match (segment, effect) {
            (Some(SegmentChange::Added(live)), _) => Some(live.size),
            (None, Effect::Added(live))
                if matches!(live.kind, EventKind::Alloc | EventKind::Create) =>
            {
                Some(live.size)
            }
            _ => None,
        };
        if event.kind == EventKind::Unmap && event.result == 0 {
            let kind = self.kind(processes, process, event.stack);
            let at = self.thread(process, thread);
            self.threads[at].unmap_kind = kind;
            return;
        }
        if let Some(size) = freed {
            let kind = match event.kind {
                EventKind::Free => self.kind(processes, process, event.stack),
                // Driver view: each page's `cuMemRelease` follows its unmap.
                EventKind::Release => {
                    let at = self.thread(process, thread);
                    self.threads[at].unmap_kind
                }
                // `unmap_block` unmaps every page of the range, then reports the range.
                EventKind::TensorSegmentUnmap => {
                    let at = self.thread(process, thread);
                    std::mem::replace(&mut self.threads[at].unmap_kind, ReleaseKind::Other)
                }
                _ => return,
            };
            let at = self.thread(process, thread);
            let entry = &mut self.threads[at];
            if kind == ReleaseKind::Other || entry.after_failure {
                return;
            }
            match entry.open.iter_mut().find(|r| r.kind == kind) {
                Some(run) => {
                    run.released_bytes = run.released_bytes.saturating_add(size);
                    run.released_count += 1;
                }
                None => entry.open.push(Release {
                    process,
                    thread,
                    device: event.device,
                    kind,
                    t_ns,
                    released_bytes: size,
                    released_count: 1,
                    request: 0,
                    succeeded: false,
                    end_t_ns: t_ns,
                }),
            }
            return;
        }
        if let Some(size) = added {
            let at = self.thread(process, thread);
            self.threads[at].after_failure = false;
            self.close(at, size, true, t_ns, true);
            return;
        }
        match effect {
            Effect::Failed => {
                // A retry past the fraction whose cudaMalloc failed: counted here, the
                // failure is the `oom` analysis's.
                let at = self.thread(process, thread);
                self.close(at, event.size, false, t_ns, true);
                self.threads[at].after_failure = true;
            }
            _ if event.kind == EventKind::TensorOom => {
                // Refused again past the fraction: the `oom` analysis counts that retry.
                let at = self.thread(process, thread);
                self.close(at, event.size, false, t_ns, false);
                self.threads[at].after_failure = false;
            }
            // A block handed out: the allocation that failed, if any, is over.
            Effect::Added(_) => {
                let at = self.thread(process, thread);
                self.threads[at].after_failure = false;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CACHED: &str = "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::";

    fn kind(names: &[&str]) -> ReleaseKind {
        let full: Vec<String> = names
            .iter()
            .map(|n| {
                if n.starts_with("NativeCachingAllocator") {
                    format!("c10::cuda::CUDACachingAllocator::Native::{n}")
                } else {
                    format!("{CACHED}{n}")
                }
            })
            .collect();
        kind_of(full.iter().map(|n| Some(n.as_str())))
    }

    #[test]
    fn a_release_is_told_by_its_function_under_malloc() {
        assert_eq!(
            kind(&[
                "release_block(Block*)",
                "release_blocks(BlockPool&)",
                "release_cached_blocks(std::shared_ptr<c10::GatheredContext> const&)",
                "malloc(unsigned long, CUstream_st*)",
            ]),
            ReleaseKind::Retry
        );
        assert_eq!(
            kind(&[
                "release_block(Block*)",
                "release_blocks(BlockPool&)",
                "release_cached_blocks(std::shared_ptr<c10::GatheredContext> const&)",
                "NativeCachingAllocator::emptyCache()",
            ]),
            ReleaseKind::Other
        );
        assert_eq!(
            kind(&[
                "release_block(Block*)",
                "garbage_collect_cached_blocks(std::shared_ptr<c10::GatheredContext> const&)",
                "malloc(unsigned long, CUstream_st*)",
            ]),
            ReleaseKind::GarbageCollection
        );
        assert_eq!(
            kind(&[
                "release_block(Block*)",
                "release_available_cached_blocks(AllocParams const&)",
                "malloc(unsigned long, CUstream_st*)",
            ]),
            ReleaseKind::Oversize
        );
        assert_eq!(kind_of([None, None]), ReleaseKind::Other);
    }
}
