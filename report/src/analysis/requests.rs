//! Allocator request streams from tensor-level recordings, and the what-if simulation fed by
//! them.
//!
//! A recording made with `PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync` (one
//! `cudaMallocAsync`/`cudaFreeAsync` per tensor), with `PYTORCH_NO_CUDA_MEMORY_CACHING=1` (one
//! `cudaMalloc`/`cudaFree` per tensor), or of any program allocating per buffer, is the
//! request stream PyTorch's caching allocator would see. [`Requests`] turns the replay's
//! allocations and frees on one device into [`Request`]s (ids are the allocations' sequence
//! numbers, so they are unique), trims of a pool down to nothing (`cudaMemPoolTrimTo(pool,
//! 0)`, which is what `torch.cuda.empty_cache()` does with `cudaMallocAsync`) into
//! [`Request::EmptyCache`]. [`WhatIf`] feeds them to one simulator per configuration in
//! lockstep, so memory stays bounded by the live set, whatever the log's length.

use vramshim_format::EventKind;
use vramshim_sim::{AddressOrder, Outcome, Request, Simulator};

use std::hash::{Hash, Hasher};

use rustc_hash::FxHashMap;

use super::allocator::AllocEnv;
use super::apis::Family;
use super::groups::Stacks;
use crate::python::StackView;
use crate::replay::{
    Effect, Live, Observer, Process, REPORT_ROUTE_NOTE, SegmentChange, State, Step,
};

/// Which allocations are PyTorch's tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Source {
    /// Not decided yet (decided from the first process's header).
    #[default]
    Undecided,
    /// Every device allocation (a program allocating per buffer).
    All,
    /// `backend:cudaMallocAsync`: stream-ordered allocations only; `cudaMalloc` and
    /// `cuMemAlloc` come from other libraries (cuBLAS's own workspace, NCCL).
    StreamOrdered,
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: runtime `cudaMalloc` only (driver allocations
    /// come from other libraries).
    Runtime,
    /// The default caching allocator recorded through its tracker (tensor view): its blocks
    /// only; other allocations come from libraries outside it.
    Tensors,
}

/// Turns replay steps into allocator requests for one device.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    /// The device followed: fixed by the caller, or the first device (≥ 0) allocated on.
    pub device: Option<i32>,
    pub allocs: u64,
    pub frees: u64,
    pub empty_cache: u64,
    /// Allocations that failed in the recording (not replayed).
    pub failed: u64,
    /// `cudaMallocAsync`'s probes of free memory for `cudnn.benchmark`'s search (not
    /// replayed, not counted in `allocs`).
    pub cudnn_probes: u64,
    /// VMM physical allocations on the device (segments, not tensors; not replayed).
    pub vmm_creates: u64,
    /// Other devices (≥ 0) that allocated, not followed.
    pub other_devices: Vec<i32>,
    /// Allocations on the device left out because another library made them (see
    /// [`Source`]).
    pub skipped: u64,
    /// ... of which took room on the device as another library's memory
    /// ([`Request::ExternalAlloc`]).
    pub external_allocs: u64,
    pub source: Source,
    /// CUDA graph captures in a stream-ordered recording (see [`GraphCaptures`]).
    pub graphs: GraphCaptures,
    /// Family of each api index, per process.
    families: Vec<Vec<Family>>,
    /// Tensor view, per (process, thread) that allocated: whether an allocating call failed
    /// since its last block, and whether it is releasing segments (see
    /// [`Requests::segment_released`]).
    threads: Vec<ThreadSince>,
}

/// CUDA graph captures: an allocation made while its stream was captured is one PyTorch's
/// native allocator serves from the capture's private pool. In a recording of stream-ordered
/// allocations (`backend:cudaMallocAsync`, or a program allocating per buffer) those are the
/// `graph_alloc`s (graph memory nodes), freed by their `graph_free` or by a free of their
/// address after the capture (which CUDA allows); in the default allocator's tensor view,
/// the `tensor_alloc`s the recorder marked as handed out to a captured stream. A capture is
/// a run of such allocations on one stream of the followed device (frees in between); it
/// ends at the process's next other allocation, failure, trim or graph launch there (the
/// recording has no event of its own for the capture's end), and each capture gets a private
/// pool of its own ([`Request::BeginCapture`]). The recording does not say when a graph is
/// destroyed: no pool is released.
#[derive(Clone, Debug, Default)]
pub struct GraphCaptures {
    /// The capture under way: (process, stream, pool id).
    current: Option<(u32, u64, u64)>,
    /// Captures seen.
    pub captures: u64,
    /// Allocations made in captures.
    pub allocs: u64,
    /// Graph allocations not yet freed: (process, address) → request id.
    live: FxHashMap<(u32, u64), u64>,
}

/// The `handle` the recorder gives a `tensor_alloc` handed out to a stream being captured ...
const CAPTURED_BLOCK: u64 = 1;
/// ... or this bit and the block's pool, where PyTorch names it (2.15): captures that share a
/// pool share it.
const CAPTURED_POOL: u64 = 1 << 63;

/// Request ids of graph allocations start here (above any recorded sequence number).
const GRAPH_ID_BASE: u64 = 1 << 62;

#[derive(Clone, Copy, Debug)]
struct ThreadSince {
    process: u32,
    thread: u32,
    failed: bool,
    releasing: bool,
}

impl Requests {
    pub fn new(device: Option<i32>) -> Requests {
        Requests {
            device,
            ..Requests::default()
        }
    }

    /// Whether `device` is the one followed (choosing it when none is yet).
    fn follows(&mut self, device: i32) -> bool {
        if device < 0 {
            return false;
        }
        match self.device {
            Some(d) if d == device => true,
            Some(_) => {
                if !self.other_devices.contains(&device) {
                    self.other_devices.push(device);
                    self.other_devices.sort_unstable();
                }
                false
            }
            None => {
                self.device = Some(device);
                true
            }
        }
    }

    /// Whether an allocation made through `api` of `process` is a tensor.
    fn wanted(&mut self, processes: &[Process], process: u32, api: u16) -> bool {
        let family = self.family(processes, process, api);
        match self.source {
            Source::StreamOrdered => family == Family::StreamOrdered,
            Source::Runtime => family == Family::Runtime,
            Source::Tensors => false,
            Source::All | Source::Undecided => matches!(
                family,
                Family::Runtime | Family::Driver | Family::StreamOrdered
            ),
        }
    }

    /// Whether an allocation that is no tensor is another library's memory, which takes room
    /// on the device: driver-API allocations (NVIDIA's libraries link the runtime statically),
    /// and with `backend:cudaMallocAsync` also `cudaMalloc` (PyTorch makes none then). The
    /// default allocator's own segments are not: the simulator makes its own.
    fn external(&mut self, processes: &[Process], process: u32, api: u16) -> bool {
        let family = self.family(processes, process, api);
        match self.source {
            Source::StreamOrdered => matches!(family, Family::Runtime | Family::Driver),
            Source::Runtime | Source::Tensors => family == Family::Driver,
            Source::All | Source::Undecided => false,
        }
    }

    /// The family of `api` of `process` (deciding the [`Source`] at the first call).
    fn family(&mut self, processes: &[Process], process: u32, api: u16) -> Family {
        let p = process as usize;
        if self.source == Source::Undecided {
            let env = processes.get(p).map(AllocEnv::of).unwrap_or_default();
            self.source = if env.cuda_malloc_async {
                Source::StreamOrdered
            } else if env.no_caching {
                Source::Runtime
            } else {
                Source::All
            };
        }
        if self.families.len() <= p {
            self.families.resize(p + 1, Vec::new());
        }
        if self.families[p].is_empty()
            && let Some(proc_) = processes.get(p)
        {
            self.families[p] = proc_.header.apis.iter().map(|n| Family::of(n)).collect();
        }
        self.families[p]
            .get(usize::from(api))
            .copied()
            .unwrap_or(Family::Driver)
    }

    fn alloc(&mut self, processes: &[Process], live: &Live) -> Option<Request> {
        if !self.follows(live.device) {
            return None;
        }
        if live.kind == EventKind::TensorAlloc {
            // PyTorch's own blocks: what the program asked for, rounded by the simulator.
            self.source = Source::Tensors;
            self.allocs += 1;
            return Some(Request::Alloc {
                id: live.seq,
                size: live.requested,
                stream: live.stream,
            });
        }
        if live.kind == EventKind::GraphPool {
            // The driver's graph pool: its memory is what the captures' requests take.
            return None;
        }
        if live.kind != EventKind::Alloc {
            self.vmm_creates += 1;
            return None;
        }
        if !self.wanted(processes, live.process, live.api) {
            self.skipped += 1;
            if self.external(processes, live.process, live.api) {
                self.external_allocs += 1;
                return Some(Request::ExternalAlloc { size: live.size });
            }
            return None;
        }
        self.allocs += 1;
        Some(Request::Alloc {
            id: live.seq,
            size: live.size,
            stream: live.stream,
        })
    }

    fn free(&mut self, processes: &[Process], live: &Live) -> Option<Request> {
        let tensor = live.kind == EventKind::TensorAlloc;
        if !(tensor || live.kind == EventKind::Alloc)
            || live.device < 0
            || self.device != Some(live.device)
        {
            return None;
        }
        if !(tensor || self.wanted(processes, live.process, live.api)) {
            return self
                .external(processes, live.process, live.api)
                .then_some(Request::ExternalFree { size: live.size });
        }
        self.frees += 1;
        Some(Request::Free { id: live.seq })
    }

    fn thread_since(&mut self, process: u32, thread: u32) -> &mut ThreadSince {
        let index = match self
            .threads
            .iter()
            .position(|t| t.process == process && t.thread == thread)
        {
            Some(index) => index,
            None => {
                self.threads.push(ThreadSince {
                    process,
                    thread,
                    failed: false,
                    releasing: false,
                });
                self.threads.len() - 1
            }
        };
        &mut self.threads[index]
    }

    /// Tensor view: PyTorch's `empty_cache()`, which leaves no entry of its own. Its segment
    /// releases (`cudaFree`, or with expandable segments the unmapping of pages) are the
    /// ones no failed call on the thread came before (those are release-and-retry, or
    /// `max_split_size_mb`'s step); garbage collection releases without a failure too, so a
    /// process that sets it gets none. One `EmptyCache` per run of releases, up to the
    /// thread's next block.
    pub fn segment_released(
        &mut self,
        processes: &[Process],
        state: &State,
        step: &Step<'_>,
    ) -> Option<Request> {
        let Step::Event {
            process,
            event,
            effect,
            ..
        } = step
        else {
            return None;
        };
        let tensors = self.source == Source::Tensors;
        let followed = self.device.is_some_and(|d| d == event.device);
        let since = self.thread_since(*process, event.thread);
        match (effect, state.segment_change()) {
            (Effect::Added(live), _) if live.kind == EventKind::TensorAlloc => {
                (since.failed, since.releasing) = (false, false);
                None
            }
            (Effect::Failed, _) => {
                since.failed = true;
                None
            }
            (_, Some(SegmentChange::Removed(_))) if tensors && followed => {
                if since.failed || since.releasing {
                    return None;
                }
                since.releasing = true;
                let collects = processes
                    .get(*process as usize)
                    .is_some_and(|p| AllocEnv::of(p).garbage_collection);
                if collects {
                    return None;
                }
                self.empty_cache += 1;
                Some(Request::EmptyCache)
            }
            _ => None,
        }
    }

    /// A CUDA graph capture's part of one event (see [`GraphCaptures`]): ends the capture
    /// under way when the event is the process's other work on the device, begins one at a
    /// captured allocation, and turns captured allocations and frees of their addresses into
    /// requests. Returns whether the event was a graph allocation's (no other request then).
    fn graph_step(
        &mut self,
        processes: &[Process],
        process: u32,
        event: &vramshim_format::Event,
        effect: &Effect,
        t_ns: u64,
        sink: &mut impl FnMut(u64, Request),
    ) -> bool {
        let graph_kind = matches!(event.kind, EventKind::GraphAlloc | EventKind::GraphFree);
        if graph_kind
            && !matches!(
                self.source,
                Source::StreamOrdered | Source::All | Source::Undecided
            )
        {
            return false;
        }
        let on_device = event.device >= 0 && self.device.is_none_or(|d| d == event.device);
        // A block the default allocator handed out to a captured stream (the recorder marks
        // it): from the capture's private pool.
        let captured_block = match effect {
            Effect::Added(live) if live.kind == EventKind::TensorAlloc => {
                if live.handle & CAPTURED_POOL != 0 {
                    Some((live.stream, Some(live.handle)))
                } else {
                    (live.handle == CAPTURED_BLOCK).then_some((live.stream, None))
                }
            }
            _ => None,
        };
        // Frees go on during a capture (its own blocks, freed and reused inside it).
        let other_work = on_device
            && !graph_kind
            && captured_block.is_none()
            && (matches!(effect, Effect::Added(_) | Effect::Failed)
                || matches!(event.kind, EventKind::Trim | EventKind::GraphPool));
        if other_work
            && let Some((p, _, pool)) = self.graphs.current
            && p == process
        {
            self.graphs.current = None;
            sink(t_ns, Request::EndCapture { pool });
        }
        if let Some((stream, pool)) = captured_block {
            if self.follows(event.device) {
                self.graphs.allocs += 1;
                self.capture_on(process, stream, pool, t_ns, sink);
            }
            return false;
        }
        match event.kind {
            EventKind::GraphAlloc => {
                if event.result != 0
                    || self.family(processes, process, event.api) != Family::StreamOrdered
                    || !self.follows(event.device)
                {
                    return false;
                }
                self.capture_on(process, event.stream, None, t_ns, sink);
                let id = GRAPH_ID_BASE + self.graphs.allocs;
                self.graphs.allocs += 1;
                self.allocs += 1;
                self.graphs.live.insert((process, event.addr), id);
                sink(
                    t_ns,
                    Request::Alloc {
                        id,
                        size: event.size,
                        stream: event.stream,
                    },
                );
                true
            }
            EventKind::GraphFree | EventKind::Free
                if matches!(effect, Effect::None | Effect::Unmatched) && on_device =>
            {
                if let Some(id) = self.graphs.live.remove(&(process, event.addr)) {
                    self.frees += 1;
                    sink(t_ns, Request::Free { id });
                }
                graph_kind
            }
            _ => graph_kind,
        }
    }

    /// Makes the capture under way the one of `process` on `stream` into `pool` (as the
    /// recording names it, else a private pool of its own): ends another, begins a new one.
    fn capture_on(
        &mut self,
        process: u32,
        stream: u64,
        pool: Option<u64>,
        t_ns: u64,
        sink: &mut impl FnMut(u64, Request),
    ) {
        if let Some((p, s, current)) = self.graphs.current
            && p == process
            && s == stream
            && pool.is_none_or(|pool| pool == current)
        {
            return;
        }
        if let Some((_, _, pool)) = self.graphs.current.take() {
            sink(t_ns, Request::EndCapture { pool });
        }
        self.graphs.captures += 1;
        // Pools the recording names have the top bit set; the others are counted.
        let pool = pool.unwrap_or(self.graphs.captures);
        self.graphs.current = Some((process, stream, pool));
        sink(t_ns, Request::BeginCapture { pool, stream });
    }

    /// The requests one replay step makes, in order (at most one, except for a ring-mode
    /// dump, which ends every live allocation of its process, and CUDA graph captures, see
    /// [`GraphCaptures`]), passed to `sink`.
    pub fn convert(
        &mut self,
        processes: &[Process],
        step: &Step<'_>,
        mut sink: impl FnMut(u64, Request),
    ) {
        match step {
            Step::Event {
                process,
                t_ns,
                event,
                effect,
            } => {
                if self.graph_step(processes, *process, event, effect, *t_ns, &mut sink) {
                    return;
                }
                let request = match effect {
                    Effect::Added(live) => self.alloc(processes, live),
                    Effect::Removed(live) => self.free(processes, live),
                    Effect::Failed => {
                        if event.device >= 0 && self.device.is_none_or(|d| d == event.device) {
                            self.failed += 1;
                        }
                        None
                    }
                    Effect::None | Effect::Unmatched => {
                        let trim = event.kind == EventKind::Trim
                            && event.result == 0
                            && event.size == 0
                            && (event.device < 0 || self.device.is_none_or(|d| d == event.device));
                        if trim {
                            self.empty_cache += 1;
                            Some(Request::EmptyCache)
                        } else {
                            None
                        }
                    }
                };
                if let Some(request) = request {
                    sink(*t_ns, request);
                }
            }
            Step::Dump { t_ns, cleared, .. } => {
                for live in cleared.iter() {
                    if let Some(request) = self.free(processes, live) {
                        sink(*t_ns, request);
                    }
                }
            }
            Step::MemInfo { .. } => {}
        }
    }
}

/// Torch's functions (`aten/src/ATen/native/cudnn/Conv_v8.cpp`) that allocate the workspace
/// of the cuDNN plan they run, inside a `try` that catches `c10::OutOfMemoryError` (their
/// callers' catch, or `run_single_conv`'s around a cached plan).
const CONV_PLAN_RUNNERS: &[&str] = &[
    "at::native::run_conv_plan(",
    "at::native::run_conv_plan_fused(",
];

/// Callers of a plan runner that try one candidate plan after another (after a failure, the
/// next); any other caller (`run_single_conv`, `run_fused_conv`) ran the plan it had cached.
const PLAN_TRIERS: &[&str] = &["at::native::try_configs", "at::native::try_plans"];

/// Torch's function that allocates the workspace of `cudnn.benchmark`'s search (Conv_v8.cpp:
/// `generate_and_filter_plans`, called by `get_plans_from_find` and
/// `get_plans_from_find_fused`).
const PLAN_SEARCHER: &str = "at::native::generate_and_filter_plans(";

/// Frames between a plan runner (or the search) and the convolution it runs (its
/// operation's function: `raw_cudnn_convolution_forward_out`, `..._backward_input_out`,
/// `..._backward_weight_out`, `..._add_relu_out`).
const CONV_DRIVERS: &[&str] = &[
    "at::native::try_configs",
    "at::native::try_plans",
    "at::native::get_plans_from_find",
    "at::native::run_single_conv(",
    "at::native::run_fused_conv(",
];

/// The function of `CUDAMallocAsyncAllocator` that probes the device's free memory with
/// `cudaMallocAsync` calls it frees at once, for `cudnn.benchmark`'s search
/// (`get_available_workspace`): PyTorch's default allocator answers the same question
/// without allocating.
const ASYNC_CACHE_INFO: &str =
    "c10::cuda::CUDACachingAllocator::CudaMallocAsync::CudaMallocAsyncAllocator::cacheInfo(";

/// Which of torch's cuDNN workspaces an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvCall {
    /// A plan's workspace (`run_conv_plan`): `cached` when the plan was the one torch had
    /// cached, rather than one it was trying.
    Run { cached: bool },
    /// The workspace of `cudnn.benchmark`'s search.
    Search,
}

/// A cuDNN convolution's workspace, from the allocation's stack (innermost frame first):
/// the function of the convolution's operation, and which workspace it is. `None` for any
/// other allocation.
pub fn conv_workspace_call<'a>(
    mut functions: impl Iterator<Item = &'a str>,
) -> Option<(&'a str, ConvCall)> {
    let mut call = ConvCall::Run { cached: true };
    functions.find(|f| {
        if f.starts_with(PLAN_SEARCHER) {
            call = ConvCall::Search;
        }
        call == ConvCall::Search || CONV_PLAN_RUNNERS.iter().any(|p| f.starts_with(p))
    })?;
    for (i, function) in functions.enumerate() {
        if i == 0 && PLAN_TRIERS.iter().any(|p| function.starts_with(p)) {
            call = ConvCall::Run { cached: false };
        }
        if !CONV_DRIVERS.iter().any(|p| function.starts_with(p)) {
            let name = function.split('(').next().unwrap_or(function);
            return Some((name, call));
        }
    }
    None
}

/// A request waiting for the simulators, with the allocation it came from (for an
/// allocation).
type Pending = (u64, Request, Option<Live>);

/// Finds the cuDNN convolution workspaces among a recording's allocations (by their native
/// frames, symbolised once per stack) and names the plan each belongs to.
#[derive(Default)]
pub struct ConvWorkspaces {
    /// Made for the processes known then (their count beside it): remade when more come.
    stacks: Option<(Stacks, usize)>,
    /// Per (process, stack): the operation's hash and which workspace it is.
    calls: FxHashMap<(u32, u32), Option<(u64, ConvCall)>>,
    /// Per (process, stack): whether it is `cudaMallocAsync`'s free-memory probe.
    probes: FxHashMap<(u32, u32), bool>,
    /// Processes whose recording probed free memory for `cudnn.benchmark`'s search.
    searching: Vec<u32>,
    /// Per (process, thread): the plan of the search just made there, whose next workspace
    /// is `try_plans` running the engine it found (inlined into `run_single_conv`: its stack
    /// looks like a cached plan's).
    just_searched: FxHashMap<(u32, u32), u64>,
}

impl ConvWorkspaces {
    /// The stacks of `processes`, made again when the replay has met more processes.
    fn stacks(&mut self, processes: &[Process]) -> &mut Stacks {
        if self
            .stacks
            .as_ref()
            .is_some_and(|(_, n)| *n < processes.len())
        {
            self.stacks = None;
        }
        let (stacks, _) = self.stacks.get_or_insert_with(|| {
            (
                Stacks::new(processes, StackView::Native, false),
                processes.len(),
            )
        });
        stacks
    }

    /// Whether a `cudaMallocAsync` allocation is the allocator's probe of free memory for
    /// `cudnn.benchmark`'s search (see [`ASYNC_CACHE_INFO`]), which PyTorch's default
    /// allocator does not make. Reads only the innermost frame (PyTorch's allocator library):
    /// cheap enough for every allocation.
    pub fn is_probe(&mut self, processes: &[Process], live: &Live) -> bool {
        if live.process as usize >= processes.len() {
            return false;
        }
        let key = (live.process, live.stack);
        let probe = match self.probes.get(&key) {
            Some(probe) => *probe,
            None => {
                let function =
                    self.stacks(processes)
                        .innermost_function(processes, live.process, live.stack);
                let probe = function.is_some_and(|f| f.starts_with(ASYNC_CACHE_INFO));
                self.probes.insert(key, probe);
                probe
            }
        };
        if probe && !self.searching.contains(&live.process) {
            self.searching.push(live.process);
        }
        probe
    }

    /// Whether `process` runs `cudnn.benchmark`'s search (seen by [`Self::is_probe`]): its
    /// workspaces are told apart from the start, since a search can change what follows
    /// without failing.
    pub fn searching(&self, process: u32) -> bool {
        self.searching.contains(&process)
    }

    /// `Request::Workspace` for an allocation that is a convolution's workspace. Its plan is
    /// torch's cache entry as far as the recording tells it: the thread (torch's plan cache
    /// is thread-local), the operation and the workspace size (the recording has no tensor
    /// shapes: two convolutions whose workspaces have the same size share an entry here).
    pub fn request(&mut self, processes: &[Process], live: &Live) -> Option<Request> {
        let thread = (live.process, live.thread);
        let call = match self.calls.get(&(live.process, live.stack)) {
            Some(call) => *call,
            None => {
                if live.process as usize >= processes.len() {
                    return None;
                }
                let frames = self
                    .stacks(processes)
                    .frames(processes, live.process, live.stack);
                let call =
                    conv_workspace_call(frames.iter().map(|f| f.function.as_deref().unwrap_or("")))
                        .map(|(operation, call)| {
                            let mut hasher = std::collections::hash_map::DefaultHasher::new();
                            operation.hash(&mut hasher);
                            (hasher.finish(), call)
                        });
                self.calls.insert((live.process, live.stack), call);
                call
            }
        };
        let Some((operation, call)) = call else {
            self.just_searched.remove(&thread);
            return None;
        };
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (live.process, live.thread, operation, live.size).hash(&mut hasher);
        let plan = hasher.finish();
        let searched = self.just_searched.remove(&thread);
        Some(match call {
            ConvCall::Search => {
                self.just_searched.insert(thread, plan);
                Request::SearchWorkspace {
                    id: live.seq,
                    size: live.size,
                    stream: live.stream,
                    plan,
                }
            }
            ConvCall::Run { cached } => Request::Workspace {
                id: live.seq,
                size: live.size,
                stream: live.stream,
                plan,
                cached: cached && searched != Some(plan),
            },
        })
    }
}

/// Which way the recording's driver handed out addresses, from its `cudaMalloc`/`cuMemAlloc`
/// results on the followed device (PyTorch's segments, per-tensor `cudaMalloc`s, or other
/// libraries' memory; stream-ordered pool allocations are carved out of pool blocks and say
/// nothing of it): an allocation below every earlier one is a vote for falling, above every
/// earlier one for rising; an address in between (a reused range) votes for nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddressVotes {
    range: Option<(u64, u64)>,
    pub rising: u64,
    pub falling: u64,
}

/// How the recording's PyTorch breaks ties between equal-size free blocks in its best fit.
/// Measured on the fake GPU (two equal-size cached blocks, which one the next request gets):
/// torch 2.3.1, 2.4.1, 2.6.0 and 2.11.0 take the lower address; 2.12.0, 2.13.0, 2.14.0 and
/// 2.15.0 take the block of the segment made first, whatever the addresses. 2.7 – 2.10 are not
/// measured: taken as 2.6 and 2.11. (On a real H200 with 2.11, taken as 2.15, whatif missed
/// an OOM the driver's segment addresses decided.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ties {
    /// The lower address wins: the model lays segments out in the driver's order.
    ByAddress,
    /// The older segment wins: the model lays segments out rising (its addresses are never
    /// reused, so rising is the order segments were made in).
    #[default]
    BySegmentAge,
}

impl Ties {
    /// The rule of PyTorch `version` ("2.6.0+cu124").
    pub fn of_version(version: &str) -> Ties {
        let mut parts = version.split(['.', '+']).map(|p| p.parse::<u32>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) if (major, minor) <= (2, 11) => Ties::ByAddress,
            _ => Ties::BySegmentAge,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Ties::ByAddress => "address",
            Ties::BySegmentAge => "segment_age",
        }
    }
}

/// The version of the PyTorch a process loaded, read from the `torch/version.py` beside the
/// `torch/lib/libc10.so` the log lists among its modules (None when the log names no such
/// library or the file is not on this machine).
pub fn torch_version(process: &Process) -> Option<String> {
    let lib = process
        .modules
        .iter()
        .find(|m| m.path.ends_with("/torch/lib/libc10.so"))?;
    let torch_dir = std::path::Path::new(&lib.path).parent()?.parent()?;
    let text = std::fs::read_to_string(torch_dir.join("version.py")).ok()?;
    text.lines().find_map(|line| {
        let value = line.strip_prefix("__version__")?.trim_start();
        let value = value.strip_prefix('=')?.trim();
        Some(value.trim_matches(['\'', '"']).to_string())
    })
}

/// The lead in votes that decides the order before the simulators start (a driver placing
/// new ranges in holes of the address space gives a few votes the other way: the fake's
/// second segment lands above its first).
const DECIDING_LEAD: u64 = 3;

impl AddressVotes {
    fn add(&mut self, addr: u64) {
        match &mut self.range {
            None => self.range = Some((addr, addr)),
            Some((low, high)) => {
                if addr < *low {
                    *low = addr;
                    self.falling += 1;
                } else if addr > *high {
                    *high = addr;
                    self.rising += 1;
                }
            }
        }
    }

    fn decided(&self) -> bool {
        self.rising.abs_diff(self.falling) >= DECIDING_LEAD
    }

    /// The majority's order; rising (the model's default) on a tie or with no vote.
    pub fn order(&self) -> AddressOrder {
        if self.falling > self.rising {
            AddressOrder::Falling
        } else {
            AddressOrder::Rising
        }
    }
}

/// Requests held back until the device's capacity (the first memory sample of a device is
/// written right after its first allocation) and the driver's address order are known.
pub const MAX_PENDING: usize = 1 << 16;

/// Where the simulated device capacity came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapacitySource {
    /// `--capacity`.
    Given,
    /// The device's total memory from the log's `cuMemGetInfo` samples.
    MemInfo,
    /// Neither: nothing ever fails.
    Unlimited,
}

impl CapacitySource {
    pub fn name(self) -> &'static str {
        match self {
            CapacitySource::Given => "option",
            CapacitySource::MemInfo => "mem_info",
            CapacitySource::Unlimited => "unlimited",
        }
    }
}

/// Observer feeding one request stream to one simulator per configuration, in lockstep.
pub struct WhatIf {
    pub requests: Requests,
    configs: Vec<vramshim_sim::Config>,
    given_capacity: Option<u64>,
    /// Empty until the capacity and the address order are known (see [`MAX_PENDING`]); then
    /// one per configuration.
    pub simulators: Vec<Simulator>,
    /// Where PyTorch breaks best-fit ties by address, the same configurations with segments
    /// laid out in the other order (one per configuration, else empty): a real driver's
    /// order is not one or the other (an H200 with a ballast placed PyTorch's segments in two
    /// regions, differently from run to run), and near the edge of fitting the outcome can
    /// hang on it (measured: 139 MiB beside the libraries, rising says a retry saves the
    /// run, falling says it raises, and the card did either).
    pub other_order: Vec<Simulator>,
    /// Whether to build [`WhatIf::other_order`] at all (`whatif` reports it; `dryrun`'s
    /// verdict does not use it).
    other_layout: bool,
    pub capacity: u64,
    pub capacity_source: CapacitySource,
    /// Total memory per device from the samples seen.
    totals: Vec<(i32, u64)>,
    /// Whether the capacity is known (given, or sampled on the followed device).
    capacity_known: bool,
    /// The driver's address order, from the recording (see [`AddressVotes`]); the
    /// simulators lay their segments out in it.
    pub votes: AddressVotes,
    pub order: AddressOrder,
    /// The recording's PyTorch (from its first process), and its tie rule.
    pub torch_version: Option<String>,
    pub ties: Ties,
    /// The first process's PyTorch blocks came from its profiler report (PyTorch 2.1, see
    /// [`Process::tensors_reported_as_blocks`]): their sizes are the requests simulated,
    /// and with no version read the tie rule is that of releases before 2.2.
    pub blocks_reported: bool,
    /// Notes of the first process looked at for [`WhatIf::blocks_reported`].
    notes_read: usize,
    /// Tells cuDNN convolution workspaces apart (only when one might matter: see
    /// [`WhatIf::apply`]).
    workspaces: ConvWorkspaces,
    /// Live `cudaMallocAsync` probes of free memory ([`ConvWorkspaces::is_probe`]), left
    /// out.
    probes: rustc_hash::FxHashSet<u64>,
    version_read: bool,
    pending: Vec<Pending>,
    /// Reused for the requests of one step.
    scratch: Vec<Pending>,
    error: Option<String>,
}

impl WhatIf {
    /// Checks every configuration (with the given capacity, if any).
    pub fn new(
        device: Option<i32>,
        configs: Vec<vramshim_sim::Config>,
        capacity: Option<u64>,
    ) -> Result<WhatIf, String> {
        for config in &configs {
            let mut config = config.clone();
            config.capacity = capacity.unwrap_or(u64::MAX);
            Simulator::new(config)?;
        }
        let mut what_if = WhatIf {
            requests: Requests::new(device),
            configs,
            given_capacity: capacity,
            simulators: Vec::new(),
            other_order: Vec::new(),
            other_layout: false,
            capacity: u64::MAX,
            capacity_source: CapacitySource::Unlimited,
            totals: Vec::new(),
            capacity_known: capacity.is_some(),
            votes: AddressVotes::default(),
            order: AddressOrder::Rising,
            torch_version: None,
            ties: Ties::default(),
            blocks_reported: false,
            notes_read: 0,
            workspaces: ConvWorkspaces::default(),
            probes: Default::default(),
            version_read: false,
            pending: Vec::new(),
            scratch: Vec::new(),
            error: None,
        };
        what_if.start_when_ready(&[]);
        Ok(what_if)
    }

    /// Also simulate each configuration with segments laid out in the other order where
    /// PyTorch breaks ties by address ([`WhatIf::other_order`]; call before the replay).
    pub fn simulate_other_layout(&mut self) {
        self.other_layout = true;
    }

    /// The recording's PyTorch release as the user gives it, in place of the one read from
    /// the log's libraries (call before the replay).
    pub fn set_torch_version(&mut self, version: &str) {
        self.version_read = true;
        self.torch_version = Some(version.to_string());
        self.ties = Ties::of_version(version);
    }

    fn started(&self) -> bool {
        !self.simulators.is_empty() || self.configs.is_empty()
    }

    /// Starts the simulators once the capacity and the driver's address order are known.
    fn start_when_ready(&mut self, processes: &[Process]) {
        let order_known =
            self.votes.decided() || (self.version_read && self.ties == Ties::BySegmentAge);
        if !self.started() && self.error.is_none() && self.capacity_known && order_known {
            self.start(processes);
        }
    }

    /// Counts a driver allocation's address toward the address order.
    fn vote(&mut self, processes: &[Process], live: &Live) {
        let followed = self.requests.device.is_none_or(|d| d == live.device);
        if live.kind != EventKind::Alloc || live.device < 0 || !followed {
            return;
        }
        let family = self.requests.family(processes, live.process, live.api);
        if matches!(family, Family::Runtime | Family::Driver) {
            self.votes.add(live.addr);
            self.start_when_ready(processes);
        }
    }

    fn start(&mut self, processes: &[Process]) {
        let sampled = self.requests.device.and_then(|device| {
            self.totals
                .iter()
                .find(|(d, _)| *d == device)
                .map(|(_, total)| *total)
        });
        (self.capacity, self.capacity_source) = match (self.given_capacity, sampled) {
            (Some(capacity), _) => (capacity, CapacitySource::Given),
            (None, Some(total)) => (total, CapacitySource::MemInfo),
            (None, None) => (u64::MAX, CapacitySource::Unlimited),
        };
        self.order = match self.ties {
            Ties::ByAddress => self.votes.order(),
            Ties::BySegmentAge => AddressOrder::Rising,
        };
        let other = match self.order {
            AddressOrder::Rising => AddressOrder::Falling,
            AddressOrder::Falling => AddressOrder::Rising,
        };
        let mut orders = vec![self.order];
        if self.other_layout && self.ties == Ties::ByAddress {
            orders.push(other);
        }
        let mut simulators = Vec::with_capacity(self.configs.len() * orders.len());
        for &order in &orders {
            for config in &self.configs {
                let mut config = config.clone();
                config.capacity = self.capacity;
                match Simulator::new(config) {
                    Ok(mut sim) => {
                        sim.set_address_order(order);
                        simulators.push(sim)
                    }
                    Err(err) => {
                        self.error.get_or_insert(err);
                        return;
                    }
                }
            }
        }
        self.other_order = simulators.split_off(self.configs.len());
        self.simulators = simulators;
        for pending in std::mem::take(&mut self.pending) {
            self.apply(processes, pending);
        }
    }

    /// Applies one request to every simulator. An allocation is looked at as a cuDNN
    /// convolution's workspace (its stack symbolised, which costs seconds for torch's
    /// libraries) only where that can change something: when it fails in a simulator (it is
    /// then made the workspace's failure, see [`Simulator::fall_back`]), once a
    /// simulator has a convolution that fell back (whose later workspaces it skips), or in a
    /// process that runs `cudnn.benchmark`'s search (whose workspace may be skipped or
    /// halved without failing). `cudaMallocAsync`'s probes of free memory for that search
    /// (told by their innermost frame alone) are left out, with their frees.
    fn apply(&mut self, processes: &[Process], (t_ns, request, site): Pending) {
        let mut request = request;
        match (request, &site) {
            (Request::Alloc { id, .. }, Some(live)) => {
                if self.requests.source == Source::StreamOrdered
                    && self.workspaces.is_probe(processes, live)
                {
                    self.probes.insert(id);
                    self.requests.allocs -= 1;
                    self.requests.cudnn_probes += 1;
                    return;
                }
                if (self.workspaces.searching(live.process)
                    || self
                        .simulators
                        .iter()
                        .chain(&self.other_order)
                        .any(Simulator::has_fallen_back))
                    && let Some(workspace) = self.workspaces.request(processes, live)
                {
                    request = workspace;
                }
            }
            (Request::Free { id }, _) if self.probes.remove(&id) => {
                self.requests.frees -= 1;
                return;
            }
            _ => {}
        }
        for sim in self.simulators.iter_mut().chain(&mut self.other_order) {
            if let (Outcome::Oom(failure), Request::Alloc { .. }, Some(live)) =
                (sim.apply(t_ns, &request), request, &site)
                && let Some(Request::Workspace { plan, cached, .. }) =
                    self.workspaces.request(processes, live)
            {
                sim.fall_back(failure, plan, cached);
            }
        }
    }

    /// Feeds what is still held back; call once after the replay, with its processes. Fails
    /// when a simulator could not be made.
    pub fn finish(&mut self, processes: &[Process]) -> Result<(), String> {
        if !self.started() && self.error.is_none() {
            self.start(processes);
        }
        match self.error.take() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

impl Observer for WhatIf {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        if !self.version_read
            && let Some(process) = processes.first()
        {
            self.version_read = true;
            self.torch_version = torch_version(process);
            if let Some(version) = &self.torch_version {
                self.ties = Ties::of_version(version);
            }
        }
        // The recorder's note comes before the first block, so before the simulators start;
        // only notes not looked at yet are.
        if !self.blocks_reported
            && !self.started()
            && let Some(process) = processes.first()
            && process.notes.len() > self.notes_read
        {
            let new = &process.notes[self.notes_read..];
            self.notes_read = process.notes.len();
            if new
                .iter()
                .any(|note| note.text.starts_with(REPORT_ROUTE_NOTE))
            {
                self.blocks_reported = true;
                if self.torch_version.is_none() {
                    // Only releases before 2.2 have no allocator tracker; they break ties by
                    // address, as every release up to 2.6 measured does.
                    self.ties = Ties::ByAddress;
                }
            }
        }
        if let Step::MemInfo { info, .. } = step {
            match self.totals.iter_mut().find(|(d, _)| *d == info.device) {
                Some(entry) => entry.1 = info.total,
                None => self.totals.push((info.device, info.total)),
            }
            if self.requests.device == Some(info.device) {
                self.capacity_known = true;
                self.start_when_ready(processes);
            }
            return;
        }
        if let Some(SegmentChange::Added(live)) = state.segment_change() {
            self.vote(processes, &live);
        }
        if let Step::Event {
            effect: Effect::Added(live),
            ..
        } = step
        {
            self.vote(processes, live);
        }
        let mut batch = std::mem::take(&mut self.scratch);
        if let (Some(request), Step::Event { t_ns, .. }) =
            (self.requests.segment_released(processes, state, step), step)
        {
            batch.push((*t_ns, request, None));
        }
        self.requests.convert(processes, step, |t_ns, request| {
            batch.push((t_ns, request, None))
        });
        // An allocation keeps where it was made: it may be a cuDNN convolution's workspace,
        // a request whose failure torch survives.
        if let Step::Event {
            effect: Effect::Added(live),
            ..
        } = step
            && live.kind == EventKind::Alloc
            && let Some((_, Request::Alloc { id, .. }, site)) = batch.last_mut()
            && *id == live.seq
        {
            *site = Some(*live);
        }
        for pending in batch.drain(..) {
            if self.started() {
                self.apply(processes, pending);
            } else {
                self.pending.push(pending);
                if self.pending.len() >= MAX_PENDING && self.error.is_none() {
                    self.start(processes);
                }
            }
        }
        self.scratch = batch;
    }
}

#[cfg(test)]
mod tests {
    use vramshim_format::{Event, EventKind, MemInfo};
    use vramshim_sim::{AddressOrder, Config, GIB, MIB, Request};

    use super::{CapacitySource, ConvCall, Requests, Ties, WhatIf};
    use crate::replay::{Effect, Live, Observer, State, Step};

    fn live(seq: u64, device: i32, kind: EventKind, size: u64, stream: u64) -> Live {
        Live {
            process: 0,
            kind,
            api: 0,
            device,
            addr: 0x1000 * (seq + 1),
            handle: 0,
            size,
            requested: size,
            stack: 0,
            thread: 1,
            stream,
            t_ns: seq * 10,
            seq,
        }
    }

    fn convert(requests: &mut Requests, event: &Event, effect: Effect) -> Vec<Request> {
        let mut out = Vec::new();
        let step = Step::Event {
            process: 0,
            t_ns: event.t_ns,
            event,
            effect: &effect,
        };
        requests.convert(&[], &step, |_, r| out.push(r));
        out
    }

    /// Torch 2.6's stacks (innermost first, from the allocator's `allocate` outward): a
    /// backward-data workspace of a plan it was trying, a forward one of its cached plan, and
    /// an ordinary tensor.
    #[test]
    fn conv_workspaces_are_found_by_their_plan_runner() {
        let trying = [
            "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
            "at::native::run_conv_plan(cudnnContext*, at::Tensor const&, at::Tensor const&, at::Tensor const&, cudnn_frontend::ExecutionPlan_v8 const&, cudnnBackendDescriptorType_t)",
            "at::native::try_configs(std::vector<std::shared_ptr<cudnn_frontend::OpaqueBackendPointer>>&, std::string const&, at::native::CacheKeyWrapper const&, cudnnContext*, at::Tensor const&, at::Tensor const&, at::Tensor const&, cudnnBackendDescriptorType_t)",
            "at::native::run_single_conv(cudnnBackendDescriptorType_t, at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::ArrayRef<long>, c10::ArrayRef<long>, c10::ArrayRef<long>, long, bool, bool, bool)",
            "at::native::raw_cudnn_convolution_backward_input_out(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::ArrayRef<long>, c10::ArrayRef<long>, c10::ArrayRef<long>, long, bool, bool, bool)",
            "at::native::cudnn_convolution_backward_input(char const*)",
        ];
        assert_eq!(
            super::conv_workspace_call(trying.into_iter()),
            Some((
                "at::native::raw_cudnn_convolution_backward_input_out",
                ConvCall::Run { cached: false }
            ))
        );
        let cached = [
            "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
            "at::native::run_conv_plan(cudnnContext*)",
            "at::native::run_single_conv(cudnnBackendDescriptorType_t)",
            "at::native::raw_cudnn_convolution_forward_out(at::Tensor const&)",
        ];
        assert_eq!(
            super::conv_workspace_call(cached.into_iter()),
            Some((
                "at::native::raw_cudnn_convolution_forward_out",
                ConvCall::Run { cached: true }
            ))
        );
        // cudnn.benchmark's search workspace (torch 2.15: under get_plans_from_find).
        let search = [
            "c10::cuda::CUDACachingAllocator::CudaMallocAsync::CudaMallocAsyncAllocator::allocate(unsigned long)",
            "at::native::generate_and_filter_plans(cudnnContext*, cudnn_frontend::OperationGraph_v8&)",
            "at::native::get_plans_from_find(cudnnContext*, cudnnBackendDescriptorType_t)",
            "at::native::run_single_conv(cudnnBackendDescriptorType_t)",
            "at::native::raw_cudnn_convolution_backward_weight_out(at::Tensor const&)",
        ];
        assert_eq!(
            super::conv_workspace_call(search.into_iter()),
            Some((
                "at::native::raw_cudnn_convolution_backward_weight_out",
                ConvCall::Search
            ))
        );
        let tensor = [
            "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
            "at::detail::empty_generic(c10::ArrayRef<long>)",
            "at::native::cudnn_convolution(at::Tensor const&)",
        ];
        assert_eq!(super::conv_workspace_call(tensor.into_iter()), None);
    }

    /// The default allocator's tensor view: blocks the recorder marked as handed out to a
    /// captured stream (handle 1) make a capture with a private pool of its own; frees go on
    /// inside it; the next unmarked block ends it; the graph pool's level is no VMM memory.
    #[test]
    fn captured_blocks_make_captures_with_private_pools() {
        let mut requests = Requests::new(None);
        let event = Event::default();
        let captured = |seq, size| Live {
            handle: super::CAPTURED_BLOCK,
            ..live(seq, 0, EventKind::TensorAlloc, size, 9)
        };
        let a = captured(1, 8 * MIB);
        assert_eq!(
            convert(&mut requests, &event, Effect::Added(a)),
            vec![
                Request::BeginCapture { pool: 1, stream: 9 },
                Request::Alloc {
                    id: 1,
                    size: 8 * MIB,
                    stream: 9
                }
            ]
        );
        assert_eq!(
            convert(&mut requests, &event, Effect::Removed(a)),
            vec![Request::Free { id: 1 }]
        );
        assert_eq!(
            convert(&mut requests, &event, Effect::Added(captured(2, MIB))),
            vec![Request::Alloc {
                id: 2,
                size: MIB,
                stream: 9
            }]
        );
        let eager = live(3, 0, EventKind::TensorAlloc, MIB, 0);
        assert_eq!(
            convert(&mut requests, &event, Effect::Added(eager)),
            vec![
                Request::EndCapture { pool: 1 },
                Request::Alloc {
                    id: 3,
                    size: MIB,
                    stream: 0
                }
            ]
        );
        assert_eq!(
            convert(&mut requests, &event, Effect::Added(captured(4, MIB)))[0],
            Request::BeginCapture { pool: 2, stream: 9 }
        );
        assert_eq!((requests.graphs.captures, requests.graphs.allocs), (2, 3));
        let pool_level = Event {
            kind: EventKind::GraphPool,
            ..Event::default()
        };
        let level = live(5, 0, EventKind::GraphPool, 6 * MIB, 0);
        assert_eq!(
            convert(&mut requests, &pool_level, Effect::Added(level)),
            vec![Request::EndCapture { pool: 2 }]
        );
        assert_eq!(requests.vmm_creates, 0);
        // Blocks naming their pool (torch 2.15) begin a capture into it (the recorded id),
        // stay in it while they name it, and a block of another pool begins another.
        let pooled = |seq, pool: u64| Live {
            handle: super::CAPTURED_POOL | pool,
            ..live(seq, 0, EventKind::TensorAlloc, MIB, 9)
        };
        let p = super::CAPTURED_POOL | 7;
        assert_eq!(
            convert(&mut requests, &event, Effect::Added(pooled(6, 7)))[0],
            Request::BeginCapture { pool: p, stream: 9 }
        );
        assert_eq!(
            convert(&mut requests, &event, Effect::Added(pooled(7, 7))).len(),
            1,
            "the same capture"
        );
        assert_eq!(
            convert(&mut requests, &event, Effect::Added(pooled(8, 8)))[..2],
            [
                Request::EndCapture { pool: p },
                Request::BeginCapture {
                    pool: super::CAPTURED_POOL | 8,
                    stream: 9
                }
            ]
        );
    }

    #[test]
    fn allocations_frees_and_trims_become_requests() {
        let mut requests = Requests::new(None);
        let event = Event::default();
        let a = live(3, 0, EventKind::Alloc, 5 * MIB, 7);
        assert_eq!(
            convert(&mut requests, &event, Effect::Added(a)),
            vec![Request::Alloc {
                id: 3,
                size: 5 * MIB,
                stream: 7
            }]
        );
        assert_eq!(requests.device, Some(0));
        // Another device is noted, not followed; VMM memory is counted, not replayed.
        let other = live(4, 1, EventKind::Alloc, MIB, 0);
        assert!(convert(&mut requests, &event, Effect::Added(other)).is_empty());
        assert_eq!(requests.other_devices, vec![1]);
        let create = live(5, 0, EventKind::Create, 20 * MIB, 0);
        assert!(convert(&mut requests, &event, Effect::Added(create)).is_empty());
        assert_eq!(requests.vmm_creates, 1);
        assert_eq!(
            convert(&mut requests, &event, Effect::Removed(a)),
            vec![Request::Free { id: 3 }]
        );
        let trim = |size| Event {
            kind: EventKind::Trim,
            size,
            ..Event::default()
        };
        assert_eq!(
            convert(&mut requests, &trim(0), Effect::None),
            vec![Request::EmptyCache]
        );
        assert!(convert(&mut requests, &trim(MIB), Effect::None).is_empty());
        let failed = Event {
            kind: EventKind::AllocFailed,
            ..Event::default()
        };
        assert!(convert(&mut requests, &failed, Effect::Failed).is_empty());
        assert_eq!(
            (
                requests.allocs,
                requests.frees,
                requests.empty_cache,
                requests.failed
            ),
            (1, 1, 1, 1)
        );
    }

    #[test]
    fn capacity_comes_from_the_first_sample_after_the_first_allocation() {
        let mut what_if = WhatIf::new(None, vec![Config::default()], None).unwrap();
        let state = State::default();
        let event = Event::default();
        let a = live(0, 0, EventKind::Alloc, 30 * MIB, 0);
        let step = Step::Event {
            process: 0,
            t_ns: 0,
            event: &event,
            effect: &Effect::Added(a),
        };
        what_if.step(&state, &[], &step);
        assert!(what_if.simulators.is_empty());
        let info = MemInfo {
            t_ns: 0,
            device: 0,
            free: 0,
            total: 40 * MIB,
        };
        what_if.step(
            &state,
            &[],
            &Step::MemInfo {
                process: 0,
                t_ns: 0,
                info: &info,
            },
        );
        // The capacity is known, the driver's address order not yet (one address so far).
        assert!(what_if.simulators.is_empty());
        let b = live(1, 0, EventKind::Alloc, 30 * MIB, 0);
        let step = Step::Event {
            process: 0,
            t_ns: 1,
            event: &event,
            effect: &Effect::Added(b),
        };
        what_if.step(&state, &[], &step);
        assert!(what_if.finish(&[]).is_ok());
        assert_eq!(what_if.capacity, 40 * MIB);
        assert_eq!(what_if.capacity_source, CapacitySource::MemInfo);
        assert_eq!((what_if.votes.rising, what_if.votes.falling), (1, 0));
        assert_eq!(what_if.order, AddressOrder::Rising);
        let stats = what_if.simulators[0].stats();
        assert_eq!(stats.peak_reserved, 30 * MIB);
        assert_eq!(stats.num_ooms, 1);
    }

    #[test]
    fn tie_rules_by_torch_release() {
        for (version, ties) in [
            ("2.3.1+cu121", Ties::ByAddress),
            ("2.4.1", Ties::ByAddress),
            ("2.6.0+cu124", Ties::ByAddress),
            ("2.11.0+cu130", Ties::ByAddress),
            ("2.12.0+cu130", Ties::BySegmentAge),
            ("2.13.0", Ties::BySegmentAge),
            ("2.15.0+cu132", Ties::BySegmentAge),
            ("2.10.0a0+git1234", Ties::ByAddress),
            ("3.0.0", Ties::BySegmentAge),
            ("not a version", Ties::BySegmentAge),
        ] {
            assert_eq!(Ties::of_version(version), ties, "{version}");
        }
    }

    #[test]
    fn the_drivers_address_order_comes_from_the_recording() {
        let state = State::default();
        let event = Event::default();
        // Addresses 0x5000, 0x6000 (rising), 0x3000, 0x4000 (in between: no vote), 0x2000,
        // 0x1000, 0x800: falling leads by three at the last, so the simulators start then with the capacity
        // given.
        let mut what_if = WhatIf::new(None, vec![Config::default()], Some(GIB)).unwrap();
        what_if.ties = Ties::ByAddress;
        let addresses = [0x5000u64, 0x6000, 0x3000, 0x4000, 0x2000, 0x1000, 0x800];
        for (seq, addr) in (0u64..).zip(addresses) {
            assert!(what_if.simulators.is_empty(), "started before {seq}");
            let mut a = live(seq, 0, EventKind::Alloc, 20 * MIB, 0);
            a.addr = addr;
            let step = Step::Event {
                process: 0,
                t_ns: seq,
                event: &event,
                effect: &Effect::Added(a),
            };
            what_if.step(&state, &[], &step);
        }
        assert_eq!((what_if.votes.rising, what_if.votes.falling), (1, 4));
        assert_eq!(what_if.order, AddressOrder::Falling);
        assert_eq!(what_if.simulators[0].address_order(), AddressOrder::Falling);
        assert_eq!(what_if.simulators[0].stats().num_device_alloc, 7);
    }
}
