//! The simulator: blocks, pools, segments and the allocation algorithm.
//!
//! Blocks live in a slab (`Vec<Block>`) and link to their neighbours in the same segment by
//! index, as PyTorch's `Block::prev` / `Block::next`. Each pool (small, large) keeps its free
//! mapped blocks in an ordered map keyed by (stream, size, address) — PyTorch's
//! `BlockPool::blocks` — and the unmapped parts of expandable segments keyed by
//! (stream, address) — `BlockPool::unmapped`. Live allocations are found by request id.
//!
//! Streams are numbered densely in order of first use, and a key packs (stream number,
//! size / 512, address / 512) into one `u128` (32 + 48 + 48 bits): sizes and addresses are
//! multiples of 512, and ordering by stream number instead of the stream's value changes
//! nothing, since every search stays within one stream.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;

use crate::hash::BuildIdHasher;
use crate::{Config, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE, allocation_size, round_size};
use crate::{LARGE_BUFFER, MIB};

const NONE: u32 = u32::MAX;
/// Lowest simulated device address: segments laid out at rising addresses start here, those
/// laid out at falling addresses stay above it.
const ADDR_BASE: u64 = 1 << 40;
/// Segments laid out at falling addresses start below this.
const ADDR_TOP: u64 = 1 << 56;
/// Expandable segments reserve 9/8 of the capacity as address space, but at most 9/8 of this
/// (when the capacity is unlimited).
const MAX_VA_CAPACITY: u64 = 1 << 40;
/// Alignment of simulated `cudaMalloc` results.
const SEGMENT_ALIGN: u64 = 2 * MIB;
/// Requests above this fail at once (64 PiB; keeps sizes within the 48-bit key field).
const MAX_REQUEST: u64 = 1 << 56;
/// Simulated addresses stay below this (keeps them within the 48-bit key field).
const ADDR_LIMIT: u64 = 1 << 57;
/// The id of the workspace of a `cudnn.benchmark` search the simulator makes itself (after a
/// cached plan's workspace failed): live only during that search.
const SEARCH_ID: u64 = u64::MAX;

/// A free-set key: stream number, size and address.
type Key = u128;

/// Which way the driver hands out addresses for new segments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AddressOrder {
    /// Each new segment above the ones before (the model's default).
    #[default]
    Rising,
    /// Each new segment below the ones before (as Linux's `mmap` places mappings: the fake
    /// driver's order).
    Falling,
}

fn key(stream: u32, size: u64, addr: u64) -> Key {
    (u128::from(stream) << 96) | (u128::from(size >> 9) << 48) | u128::from(addr >> 9)
}

fn key_stream(k: Key) -> u32 {
    (k >> 96) as u32
}

fn key_size(k: Key) -> u64 {
    (((k >> 48) as u64) & ((1 << 48) - 1)) << 9
}

/// The first key of `stream` with a size of at least `size`.
fn lower_key(stream: u32, size: u64) -> Key {
    key(stream, size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE, 0)
}

/// One request to the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `malloc(size)` on `stream`; `id` names the allocation for its later `Free`.
    Alloc {
        /// Caller's name for this allocation (e.g. the recorded address or a counter).
        id: u64,
        /// Bytes requested (before rounding).
        size: u64,
        /// The stream the allocation belongs to (any value; blocks are reused only on the
        /// same stream).
        stream: u64,
    },
    /// `free` of the allocation made under `id`.
    Free {
        /// The `id` of an earlier `Alloc`.
        id: u64,
    },
    /// A cuDNN convolution's workspace, as torch's cuDNN v8/v9 path allocates it
    /// (`run_conv_plan` in `aten/src/ATen/native/cudnn/Conv_v8.cpp`): `malloc(size)` like
    /// [`Alloc`](Request::Alloc), but torch catches its `OutOfMemoryError` and runs the
    /// convolution with the next engine instead. When it fails, the next engine is taken to
    /// need no workspace (what the fake cuDNN's second engine reports; a real cuDNN's next
    /// engine may ask for a smaller one, which the recording does not have): no request, and
    /// the plan it caches for `plan` makes none either, so every later workspace of `plan`
    /// is skipped.
    Workspace {
        /// Caller's name for this allocation.
        id: u64,
        /// Bytes requested.
        size: u64,
        /// The stream.
        stream: u64,
        /// Which cached plan it belongs to: torch caches one plan per convolution (its
        /// shapes, operation) per thread (`thread_local benchmark_cache`).
        plan: u64,
        /// Whether it ran the plan torch had cached for the convolution (`run_single_conv`
        /// calling `run_conv_plan` itself) rather than one it was trying (`try_configs`,
        /// `try_plans`): a cached plan's failure is followed by the first engine again,
        /// whose workspace is the same request.
        cached: bool,
    },
    /// The workspace `torch.backends.cudnn.benchmark`'s search allocates before it times a
    /// convolution's engines (`generate_and_filter_plans` in
    /// `aten/src/ATen/native/cudnn/Conv_v8.cpp`): the largest workspace of the engines whose
    /// workspace is at most `cacheInfo`'s answer (the device's free memory or the largest
    /// cached free block, whichever is larger), halved after each `OutOfMemoryError` until
    /// it fits or reaches 0. An engine whose workspace no longer fits is dropped from the
    /// search; `size` is taken to be the largest engine's and every other engine to need no
    /// workspace (the fake cuDNN's), so when less than `size` is allocated (or nothing), the
    /// convolution runs and caches the engine that needs none: later workspaces of `plan` are
    /// skipped, as after [`Request::Workspace`]'s fallback. Its failures are counted
    /// (`num_ooms`), never raised.
    SearchWorkspace {
        /// Caller's name for this allocation.
        id: u64,
        /// Bytes the search asks for first.
        size: u64,
        /// The stream.
        stream: u64,
        /// The convolution's cached plan, as in [`Request::Workspace`]: a plan found by a
        /// search goes back to a search when its workspace later fails.
        plan: u64,
    },
    /// `torch.cuda.empty_cache()`: release every fully free segment.
    EmptyCache,
    /// Another library took `size` bytes of the device (cuBLAS's handle memory, NCCL's
    /// buffers): they count against the capacity until the matching
    /// [`ExternalFree`](Request::ExternalFree). Not counted in [`Stats::requests`], so request
    /// positions stay those of the allocator's own requests.
    ExternalAlloc {
        /// Bytes taken.
        size: u64,
    },
    /// Another library gave back `size` bytes it took with an
    /// [`ExternalAlloc`](Request::ExternalAlloc).
    ExternalFree {
        /// Bytes given back.
        size: u64,
    },
    /// A CUDA graph capture begins on `stream` (`torch.cuda.graph`'s `capture_begin`, which
    /// calls the allocator's `beginAllocateToPool`): until the matching
    /// [`EndCapture`](Request::EndCapture), allocations on `stream` come from private pool
    /// `pool` (made at its first capture; a later capture naming it shares it, as
    /// `torch.cuda.graph(pool=...)` and `make_graphed_callables` do), whose segments are its
    /// own: no other stream or pool takes its cached blocks, and neither `empty_cache()` nor
    /// the retry before an OOM gives them back until the pool is released
    /// ([`ReleasePool`](Request::ReleasePool)). While any capture is under way an allocation
    /// that finds no memory does not release cached segments and retry.
    BeginCapture {
        /// The private pool's id (torch's `MempoolId_t`, any value).
        pool: u64,
        /// The stream being captured.
        stream: u64,
    },
    /// The capture into `pool` ended (`endAllocateToPool`): allocations on its stream come
    /// from the ordinary pools again; blocks of the private pool freed later go back to it.
    EndCapture {
        /// The private pool's id.
        pool: u64,
    },
    /// A graph that used `pool` was destroyed or reset (`releasePool`): when no graph uses
    /// it any more, its fully free segments are given back at the next `empty_cache()` or
    /// retry, like the ordinary pools' (its blocks still stay its own).
    ReleasePool {
        /// The private pool's id.
        pool: u64,
    },
}

/// What a request did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// Done (a zero-byte allocation is done without touching the cache, as in PyTorch).
    Ok,
    /// Skipped: a `Free` of an id that is not live (never allocated, already freed, or its
    /// allocation failed), or an `Alloc` whose id is already live.
    Ignored,
    /// The allocation failed for lack of memory; it is dropped and the run goes on.
    Oom(OomEvent),
    /// A [`Request::Workspace`] failed (the last of its attempts) and the convolution fell
    /// back to an engine with no workspace: torch counts the OOM and goes on.
    FellBack(OomEvent),
    /// Another library's memory ([`Request::ExternalAlloc`]) did not fit beside what the
    /// allocator holds: it is not taken, and the run goes on.
    ExternalFailed(ExternalFailure),
}

/// Another library's allocation that did not fit (a `cublasCreate` on a new thread whose
/// 64 MiB `cuMemAlloc` fails): PyTorch neither sees nor retries it (the library calls the
/// driver itself, so no cached block is released for it), and the program fails with the
/// library's error, e.g. `CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExternalFailure {
    /// Time passed to [`Simulator::apply`].
    pub t_ns: u64,
    /// Bytes the library asked for.
    pub size: u64,
    /// Reserved bytes when it failed.
    pub reserved: u64,
    /// Bytes other libraries held when it failed.
    pub external: u64,
    /// Peak reserved bytes up to this failure (what a program stopped by it reports).
    pub peak_reserved: u64,
    /// `num_alloc_retries` up to this failure.
    pub num_alloc_retries: u64,
    /// `num_device_alloc` up to this failure.
    pub num_device_alloc: u64,
    /// `num_device_free` up to this failure.
    pub num_device_free: u64,
}

/// A failed allocation: what PyTorch's "CUDA out of memory" error would report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomEvent {
    /// Time passed to [`Simulator::apply`].
    pub t_ns: u64,
    /// 0-based position of the request in the stream.
    pub request_index: u64,
    /// The allocation's id.
    pub id: u64,
    /// Bytes requested.
    pub size: u64,
    /// Bytes after rounding.
    pub rounded: u64,
    /// The segment size it tried to get ("Tried to allocate" in PyTorch's message).
    pub alloc_size: u64,
    /// Stream of the request.
    pub stream: u64,
    /// Reserved bytes when it failed (after the release-and-retry step).
    pub reserved: u64,
    /// Allocated bytes when it failed.
    pub allocated: u64,
    /// Capacity left on the device (`capacity − reserved − external`).
    pub device_free: u64,
    /// Peak reserved bytes up to and including this failure: what
    /// `torch.cuda.max_memory_reserved()` reports in a program that stops at this error
    /// (the totals in [`Stats`] go on past it).
    pub peak_reserved: u64,
    /// `num_alloc_retries` up to and including this failure's own retry.
    pub num_alloc_retries: u64,
    /// `num_device_alloc` up to this failure.
    pub num_device_alloc: u64,
    /// `num_device_free` up to this failure (the segments its release step freed included).
    pub num_device_free: u64,
    /// `num_ooms` up to and including this failure (cuDNN workspaces that failed before it
    /// included).
    pub num_ooms: u64,
}

/// The allocator's state when reserved memory reached its peak, measured at the end of the
/// request that first reached it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AtPeak {
    /// Time of that request.
    pub t_ns: u64,
    /// 0-based position of that request in the stream.
    pub request_index: u64,
    /// Reserved bytes.
    pub reserved: u64,
    /// Allocated bytes.
    pub allocated: u64,
    /// Reserved but unallocated bytes (cached free blocks).
    pub reserved_minus_allocated: u64,
    /// Free bytes inside segments that also hold live blocks — PyTorch's
    /// `inactive_split_bytes` (which leaves out expandable segments).
    pub inactive_split_bytes: u64,
    /// Largest single cached free block.
    pub largest_free_block: u64,
    /// All cached free bytes (equal to `reserved_minus_allocated`).
    pub total_free: u64,
    /// `1 − largest_free_block / total_free` (0 when nothing is free): how scattered the
    /// free memory is.
    pub external_fragmentation: f64,
}

/// Counters and peaks of a run (see [`Simulator::stats`]). Byte counts are block sizes after
/// rounding unless named "requested".
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stats {
    /// Requests applied.
    pub requests: u64,
    /// `Alloc` requests.
    pub allocs: u64,
    /// `Free` requests.
    pub frees: u64,
    /// `EmptyCache` requests.
    pub empty_cache_calls: u64,
    /// Requests that were [`Outcome::Ignored`].
    pub ignored: u64,
    /// Bytes held by the allocator now (segments, or mapped pages of expandable segments).
    pub reserved: u64,
    /// Bytes handed out and not yet freed.
    pub allocated: u64,
    /// Bytes requested by the live allocations (before rounding).
    pub requested: u64,
    /// PyTorch's `inactive_split_bytes` now: free blocks inside segments that hold other
    /// blocks (expandable segments excluded, as in PyTorch).
    pub inactive_split_bytes: u64,
    /// Highest `reserved` ever (PyTorch's `reserved_bytes.all.peak`).
    pub peak_reserved: u64,
    /// Highest `allocated` ever.
    pub peak_allocated: u64,
    /// Highest `requested` ever.
    pub peak_requested: u64,
    /// Time at which `peak_allocated` was reached.
    pub peak_allocated_t_ns: u64,
    /// The state when reserved memory first reached its peak.
    pub at_peak: AtPeak,
    /// `cudaMalloc` calls, or page-range mappings of expandable segments (`num_device_alloc`).
    pub num_device_alloc: u64,
    /// `cudaFree` calls, or page-range unmappings (`num_device_free`).
    pub num_device_free: u64,
    /// Times every fully free segment was released to retry an allocation
    /// (`num_alloc_retries`).
    pub num_alloc_retries: u64,
    /// Failed allocations (`num_ooms`): raised OOMs and failed cuDNN workspaces alike.
    pub num_ooms: u64,
    /// The first failed allocation that is no cuDNN workspace (the `OutOfMemoryError` the
    /// program sees), if any.
    pub first_oom: Option<OomEvent>,
    /// Convolutions that fell back to an engine with no workspace
    /// ([`Outcome::FellBack`]); each counted one or two OOMs.
    pub workspace_fallbacks: u64,
    /// The first of them, if any.
    pub first_fallback: Option<OomEvent>,
    /// Workspace requests skipped because their plan had fallen back (torch's cached plan
    /// for them needs none).
    pub workspaces_skipped: u64,
    /// Bytes other libraries hold on the device now ([`Request::ExternalAlloc`]).
    pub external: u64,
    /// Highest `external` ever.
    pub peak_external: u64,
    /// Other libraries' allocations that did not fit ([`Outcome::ExternalFailed`]).
    pub external_failures: u64,
    /// The first of them, if any.
    pub first_external_failure: Option<ExternalFailure>,
}

/// One segment of [`Simulator::segments`] (for expandable segments: one mapped range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Simulated start address.
    pub address: u64,
    /// Bytes.
    pub total_size: u64,
    /// Allocated bytes in it.
    pub allocated_size: u64,
    /// Its stream.
    pub stream: u64,
    /// Small pool (≤ 1 MiB requests) or large.
    pub small: bool,
    /// Part of an expandable segment.
    pub expandable: bool,
    /// Its blocks in address order.
    pub blocks: Vec<BlockInfo>,
}

/// One block of a [`SegmentInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    /// Simulated address.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// Handed out (else cached free).
    pub allocated: bool,
    /// Bytes requested for it, when allocated.
    pub requested_size: u64,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
    requested: u64,
    /// Stream number (index into `Simulator::streams`).
    stream: u32,
    /// Pool's `gc_calls` when the block was (re)inserted into the free set.
    gc_base: u64,
    prev: u32,
    next: u32,
    /// Expandable segment index, or NONE for a cudaMalloc segment.
    seg: u32,
    small: bool,
    allocated: bool,
    mapped: bool,
    live: bool,
}

impl Block {
    fn is_split(&self) -> bool {
        self.prev != NONE || self.next != NONE
    }
    fn key(&self) -> Key {
        key(self.stream, self.size, self.addr)
    }
}

#[derive(Default)]
struct Pool {
    /// Free mapped blocks by (stream, size, address).
    blocks: BTreeMap<Key, u32>,
    /// Unmapped ranges of expandable segments by (stream, address).
    unmapped: BTreeMap<(u32, u64), u32>,
    /// PyTorch's `get_free_blocks_call_count` (counted only while GC is enabled).
    gc_calls: u64,
}

/// A CUDA graph's private pool (PyTorch's `PrivatePool`): its blocks are those of the stream
/// numbers made for it.
struct PrivatePool {
    /// The caller's id for it.
    id: u64,
    /// Captures (graphs) using it; at 0 it is freeable.
    use_count: u32,
}

struct ExpSeg {
    base: u64,
    page: u64,
}

fn pool_index(small: bool) -> usize {
    if small { 0 } else { 1 }
}

/// The caching-allocator model. Feed it requests with [`apply`](Simulator::apply) and read
/// [`stats`](Simulator::stats).
pub struct Simulator {
    cfg: Config,
    max_split: u64,
    allowed_max: Option<u64>,
    gc: bool,
    slab: Vec<Block>,
    free_slots: Vec<u32>,
    pools: [Pool; 2],
    segs: Vec<ExpSeg>,
    /// Released expandable segments (small, large), whose address ranges are reused.
    free_segs: [Vec<u32>; 2],
    /// Stream values by stream number, with the private pool the number belongs to (an
    /// index into `private`, or NONE for the ordinary pools): a private pool's blocks get
    /// stream numbers of their own, so every search, which stays within one stream number,
    /// stays within the pool.
    streams: Vec<(u64, u32)>,
    /// The last stream looked up: (value, private pool, number).
    last_stream: (u64, u32, u32),
    /// Private pools ever made, by index.
    private: Vec<PrivatePool>,
    /// Captures under way: (stream, private pool index).
    captures: Vec<(u64, u32)>,
    live: HashMap<u64, u32, BuildIdHasher>,
    /// Rising: the next free address; falling: the lowest address handed out so far.
    next_addr: u64,
    order: AddressOrder,
    scratch: Vec<u32>,
    scratch2: Vec<u32>,
    st: Stats,
    peak_pending: bool,
    now: u64,
    /// Sizes of other libraries' allocations that failed here: their recorded frees give
    /// back nothing.
    failed_external: Vec<u64>,
    /// Plans ([`Request::Workspace`]) that fell back to an engine with no workspace.
    fallen_back: HashSet<u64>,
    /// Plans found by `cudnn.benchmark`'s search ([`Request::SearchWorkspace`]).
    searched: HashSet<u64>,
}

impl Simulator {
    /// A simulator with an empty cache. Fails when [`Config::validate`] does.
    pub fn new(config: Config) -> Result<Simulator, String> {
        config.validate()?;
        Ok(Simulator {
            max_split: config.max_split_size.unwrap_or(u64::MAX),
            allowed_max: config.allowed_maximum(),
            gc: config.gc_enabled(),
            cfg: config,
            slab: Vec::new(),
            free_slots: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            segs: Vec::new(),
            free_segs: [Vec::new(), Vec::new()],
            streams: Vec::new(),
            last_stream: (0, NONE, NONE),
            private: Vec::new(),
            captures: Vec::new(),
            live: HashMap::default(),
            next_addr: ADDR_BASE,
            order: AddressOrder::Rising,
            scratch: Vec::new(),
            scratch2: Vec::new(),
            st: Stats::default(),
            peak_pending: false,
            now: 0,
            failed_external: Vec::new(),
            fallen_back: HashSet::new(),
            searched: HashSet::new(),
        })
    }

    /// Lays new segments (and expandable segments' address ranges) out in `order`. Call it
    /// before the first request: it decides which of two equal-size free blocks best fit
    /// takes (the lower address), so the model should follow the driver that made the
    /// recording.
    pub fn set_address_order(&mut self, order: AddressOrder) {
        self.order = order;
        self.next_addr = match order {
            AddressOrder::Rising => ADDR_BASE,
            AddressOrder::Falling => ADDR_TOP,
        };
    }

    /// The order new segments are laid out in.
    pub fn address_order(&self) -> AddressOrder {
        self.order
    }

    /// The settings this simulator runs with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// What the allocator may hold now: the capacity less what other libraries hold.
    fn device_capacity(&self) -> u64 {
        self.cfg.capacity.saturating_sub(self.st.external)
    }

    /// Applies one request at time `t_ns` (used only to say when peaks and failures happen).
    pub fn apply(&mut self, t_ns: u64, req: &Request) -> Outcome {
        self.now = t_ns;
        // Positions count the allocator's own requests only (not another library's memory).
        let index = self.st.requests;
        let out = match *req {
            Request::ExternalAlloc { size } => {
                // The library asks the driver directly: what the allocator holds is not
                // released for it (the device's free memory is all it can get).
                if self.device_capacity().saturating_sub(self.st.reserved) < size {
                    let failure = ExternalFailure {
                        t_ns,
                        size,
                        reserved: self.st.reserved,
                        external: self.st.external,
                        peak_reserved: self.st.peak_reserved,
                        num_alloc_retries: self.st.num_alloc_retries,
                        num_device_alloc: self.st.num_device_alloc,
                        num_device_free: self.st.num_device_free,
                    };
                    self.st.external_failures += 1;
                    self.st.first_external_failure.get_or_insert(failure);
                    self.failed_external.push(size);
                    return Outcome::ExternalFailed(failure);
                }
                self.st.external = self.st.external.saturating_add(size);
                self.st.peak_external = self.st.peak_external.max(self.st.external);
                return Outcome::Ok;
            }
            Request::ExternalFree { size } => {
                if let Some(i) = self.failed_external.iter().position(|&s| s == size) {
                    self.failed_external.swap_remove(i);
                    return Outcome::Ok;
                }
                self.st.external = self.st.external.saturating_sub(size);
                return Outcome::Ok;
            }
            Request::Alloc { id, size, stream } => self.malloc(index, id, size, stream, true),
            Request::Workspace {
                id,
                size,
                stream,
                plan,
                cached,
            } => self.workspace(index, id, size, stream, plan, cached),
            Request::SearchWorkspace {
                id,
                size,
                stream,
                plan,
            } => {
                self.searched.insert(plan);
                match self.search_workspace(index, id, size, stream, plan) {
                    Some(failure) => {
                        self.st.workspace_fallbacks += 1;
                        self.st.first_fallback.get_or_insert(failure);
                        Outcome::FellBack(failure)
                    }
                    None if self.live.contains_key(&id) => Outcome::Ok,
                    None => Outcome::Ignored,
                }
            }
            Request::Free { id } => {
                self.st.frees += 1;
                match self.live.remove(&id) {
                    Some(b) => {
                        self.free(b);
                        Outcome::Ok
                    }
                    None => {
                        self.st.ignored += 1;
                        Outcome::Ignored
                    }
                }
            }
            Request::EmptyCache => {
                self.st.empty_cache_calls += 1;
                self.release_cached_blocks();
                Outcome::Ok
            }
            Request::BeginCapture { pool, stream } => {
                self.begin_capture(pool, stream);
                return Outcome::Ok;
            }
            Request::EndCapture { pool } => {
                if let Some(i) = self
                    .captures
                    .iter()
                    .position(|&(_, p)| self.private[p as usize].id == pool)
                {
                    self.captures.remove(i);
                }
                return Outcome::Ok;
            }
            Request::ReleasePool { pool } => {
                if let Some(p) = self.live_private_pool(pool) {
                    let p = &mut self.private[p as usize];
                    p.use_count = p.use_count.saturating_sub(1);
                }
                return Outcome::Ok;
            }
        };
        self.st.requests += 1;
        if self.peak_pending {
            self.peak_pending = false;
            self.snapshot_peak(t_ns, index);
        }
        out
    }

    /// Applies every `(t_ns, request)` in order and returns the statistics.
    pub fn run<'a, I>(&mut self, requests: I) -> Stats
    where
        I: IntoIterator<Item = &'a (u64, Request)>,
    {
        for (t, r) in requests {
            self.apply(*t, r);
        }
        self.stats()
    }

    /// Counters, current values and peaks so far.
    pub fn stats(&self) -> Stats {
        self.st.clone()
    }

    /// Number of live allocations.
    pub fn live_allocations(&self) -> usize {
        self.live.len()
    }

    /// Every segment and its blocks, by address (for expandable segments, one entry per
    /// mapped range, as in PyTorch's snapshot). Walks all blocks: for reports, not per
    /// request.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut out = Vec::new();
        for b in &self.slab {
            if !b.live || !b.mapped {
                continue;
            }
            if b.prev != NONE && self.slab[b.prev as usize].mapped {
                continue;
            }
            let mut seg = SegmentInfo {
                address: b.addr,
                total_size: 0,
                allocated_size: 0,
                stream: self.streams[b.stream as usize].0,
                small: b.small,
                expandable: b.seg != NONE,
                blocks: Vec::new(),
            };
            let mut cur = Some(*b);
            while let Some(c) = cur {
                if !c.mapped {
                    break;
                }
                seg.total_size += c.size;
                if c.allocated {
                    seg.allocated_size += c.size;
                }
                seg.blocks.push(BlockInfo {
                    address: c.addr,
                    size: c.size,
                    allocated: c.allocated,
                    requested_size: if c.allocated { c.requested } else { 0 },
                });
                cur = (c.next != NONE).then(|| self.slab[c.next as usize]);
            }
            out.push(seg);
        }
        out.sort_by_key(|s| s.address);
        out
    }

    /// Checks the internal invariants (links, adjacency, merged free neighbours, pool
    /// membership, byte counters). For tests and fuzzing; walks everything.
    pub fn validate(&self) -> Result<(), String> {
        let mut reserved = 0u64;
        let mut allocated = 0u64;
        let mut inactive = 0u64;
        let mut in_pools = 0usize;
        let mut unmapped = 0usize;
        for (i, b) in self.slab.iter().enumerate() {
            if !b.live {
                continue;
            }
            let i = i as u32;
            if b.next != NONE {
                let n = &self.slab[b.next as usize];
                if !n.live || n.prev != i || b.addr + b.size != n.addr {
                    return Err(format!("block {i}: bad next link"));
                }
                if !b.allocated && !n.allocated && b.mapped == n.mapped {
                    return Err(format!("block {i}: unmerged free neighbours"));
                }
            }
            if b.prev != NONE && self.slab[b.prev as usize].next != i {
                return Err(format!("block {i}: bad prev link"));
            }
            let pool = &self.pools[pool_index(b.small)];
            if b.mapped {
                reserved += b.size;
            }
            if b.allocated {
                allocated += b.size;
                if !b.mapped {
                    return Err(format!("block {i}: allocated but unmapped"));
                }
            } else if b.mapped {
                in_pools += 1;
                if pool.blocks.get(&b.key()) != Some(&i) {
                    return Err(format!("block {i}: free but not in its pool"));
                }
                if b.seg == NONE && b.is_split() {
                    inactive += b.size;
                }
            } else {
                unmapped += 1;
                if pool.unmapped.get(&(b.stream, b.addr)) != Some(&i) {
                    return Err(format!("block {i}: unmapped but not in its pool"));
                }
            }
        }
        let pooled: usize = self.pools.iter().map(|p| p.blocks.len()).sum();
        let pooled_unmapped: usize = self.pools.iter().map(|p| p.unmapped.len()).sum();
        if pooled != in_pools || pooled_unmapped != unmapped {
            return Err("pool holds blocks that are not free".to_string());
        }
        if reserved != self.st.reserved {
            return Err(format!(
                "reserved {} != blocks {}",
                self.st.reserved, reserved
            ));
        }
        if allocated != self.st.allocated {
            return Err(format!(
                "allocated {} != blocks {}",
                self.st.allocated, allocated
            ));
        }
        if inactive != self.st.inactive_split_bytes {
            return Err(format!(
                "inactive_split_bytes {} != blocks {}",
                self.st.inactive_split_bytes, inactive
            ));
        }
        for &b in self.live.values() {
            if !self.slab[b as usize].allocated {
                return Err(format!("live id maps to free block {b}"));
            }
        }
        Ok(())
    }

    // ---- slab ---------------------------------------------------------------------------

    /// Splits the first `size` bytes of `b` off into a new unallocated block just before it
    /// (same segment and pool), on `stream`; `b` keeps the rest. Returns the new block.
    fn carve_front(&mut self, b: u32, size: u64, stream: u32, mapped: bool) -> u32 {
        let blk = self.slab[b as usize];
        let front = self.new_block(Block {
            addr: blk.addr,
            size,
            requested: 0,
            stream,
            gc_base: 0,
            prev: blk.prev,
            next: b,
            seg: blk.seg,
            small: blk.small,
            allocated: false,
            mapped,
            live: true,
        });
        if blk.prev != NONE {
            self.slab[blk.prev as usize].next = front;
        }
        let rest = &mut self.slab[b as usize];
        rest.prev = front;
        rest.addr += size;
        rest.size -= size;
        front
    }

    /// Splits everything of `b` past its first `keep` bytes off into a new unallocated block
    /// just after it (same segment, pool and stream). Returns the new block.
    fn carve_back(&mut self, b: u32, keep: u64, mapped: bool) -> u32 {
        let blk = self.slab[b as usize];
        let back = self.new_block(Block {
            addr: blk.addr + keep,
            size: blk.size - keep,
            requested: 0,
            stream: blk.stream,
            gc_base: 0,
            prev: b,
            next: blk.next,
            seg: blk.seg,
            small: blk.small,
            allocated: false,
            mapped,
            live: true,
        });
        if blk.next != NONE {
            self.slab[blk.next as usize].prev = back;
        }
        let m = &mut self.slab[b as usize];
        m.next = back;
        m.size = keep;
        back
    }

    fn new_block(&mut self, b: Block) -> u32 {
        match self.free_slots.pop() {
            Some(i) => {
                self.slab[i as usize] = b;
                i
            }
            None => {
                self.slab.push(b);
                (self.slab.len() - 1) as u32
            }
        }
    }

    fn drop_block(&mut self, i: u32) {
        self.slab[i as usize].live = false;
        self.free_slots.push(i);
    }

    fn insert_free(&mut self, i: u32) {
        let b = &mut self.slab[i as usize];
        let pool = &mut self.pools[pool_index(b.small)];
        b.gc_base = pool.gc_calls;
        pool.blocks.insert(b.key(), i);
    }

    fn remove_free(&mut self, i: u32) {
        let b = &self.slab[i as usize];
        self.pools[pool_index(b.small)].blocks.remove(&b.key());
    }

    fn insert_unmapped(&mut self, i: u32) {
        let b = &self.slab[i as usize];
        self.pools[pool_index(b.small)]
            .unmapped
            .insert((b.stream, b.addr), i);
    }

    fn remove_unmapped(&mut self, i: u32) {
        let b = &self.slab[i as usize];
        self.pools[pool_index(b.small)]
            .unmapped
            .remove(&(b.stream, b.addr));
    }

    fn reserve_va(&mut self, size: u64, align: u64) -> u64 {
        match self.order {
            AddressOrder::Rising => {
                let a = self.next_addr.div_ceil(align) * align;
                self.next_addr = a + size;
                assert!(
                    self.next_addr <= ADDR_LIMIT,
                    "simulated address space exhausted"
                );
                a
            }
            AddressOrder::Falling => {
                let a = self.next_addr.saturating_sub(size) / align * align;
                assert!(a >= ADDR_BASE, "simulated address space exhausted");
                self.next_addr = a;
                a
            }
        }
    }

    /// The number of stream value `stream` in the pools an allocation on it uses now (a
    /// private pool's while a capture into it is under way on that stream: `get_pool`),
    /// numbering new streams as they come.
    fn stream_index(&mut self, stream: u64) -> u32 {
        let pool = if self.captures.is_empty() {
            NONE
        } else {
            self.captures
                .iter()
                .find(|&&(s, _)| s == stream)
                .map_or(NONE, |&(_, p)| p)
        };
        if self.last_stream.2 != NONE && self.last_stream.0 == stream && self.last_stream.1 == pool
        {
            return self.last_stream.2;
        }
        let i = match self.streams.iter().position(|&s| s == (stream, pool)) {
            Some(i) => i as u32,
            None => {
                self.streams.push((stream, pool));
                (self.streams.len() - 1) as u32
            }
        };
        self.last_stream = (stream, pool, i);
        i
    }

    // ---- CUDA graphs' private pools -------------------------------------------------------

    /// The private pool `id` that some graph still uses, if any.
    fn live_private_pool(&self, id: u64) -> Option<u32> {
        self.private
            .iter()
            .rposition(|p| p.id == id && p.use_count > 0)
            .map(|i| i as u32)
    }

    /// `beginAllocateToPool`: a new pool for `id`, or the live one of that id shared.
    fn begin_capture(&mut self, id: u64, stream: u64) {
        let p = match self.live_private_pool(id) {
            Some(p) => {
                self.private[p as usize].use_count += 1;
                p
            }
            None => {
                self.private.push(PrivatePool { id, use_count: 1 });
                (self.private.len() - 1) as u32
            }
        };
        self.captures.retain(|&(s, _)| s != stream);
        self.captures.push((stream, p));
    }

    /// Whether blocks of stream number `stream` may be given back to the driver: those of
    /// the ordinary pools, and of private pools no graph uses any more
    /// (`graph_pools_freeable`).
    fn releasable(&self, stream: u32) -> bool {
        match self.streams.get(stream as usize) {
            Some(&(_, pool)) if pool != NONE => self.private[pool as usize].use_count == 0,
            _ => true,
        }
    }

    /// Whether stream number `stream` belongs to a private pool.
    fn is_private(&self, stream: u32) -> bool {
        self.streams
            .get(stream as usize)
            .is_some_and(|&(_, pool)| pool != NONE)
    }

    // ---- statistics -----------------------------------------------------------------------

    fn add_reserved(&mut self, n: u64) {
        self.st.reserved += n;
        if self.st.reserved > self.st.peak_reserved {
            self.st.peak_reserved = self.st.reserved;
            self.peak_pending = true;
        }
    }

    fn snapshot_peak(&mut self, t_ns: u64, index: u64) {
        let largest = self.largest_free_block();
        let total_free = self.st.reserved - self.st.allocated;
        self.st.at_peak = AtPeak {
            t_ns,
            request_index: index,
            reserved: self.st.reserved,
            allocated: self.st.allocated,
            reserved_minus_allocated: total_free,
            inactive_split_bytes: self.st.inactive_split_bytes,
            largest_free_block: largest,
            total_free,
            external_fragmentation: if total_free == 0 {
                0.0
            } else {
                1.0 - largest as f64 / total_free as f64
            },
        };
    }

    // ---- malloc ---------------------------------------------------------------------------

    /// A cuDNN workspace ([`Request::Workspace`]), as torch's `run_single_conv` and
    /// `try_configs` go through it: a cached plan that fails is followed by the heuristics'
    /// first engine, asking for the same workspace again; when that fails too, the next
    /// engine runs with none and becomes the plan cached for the convolution.
    fn workspace(
        &mut self,
        index: u64,
        id: u64,
        size: u64,
        stream: u64,
        plan: u64,
        cached: bool,
    ) -> Outcome {
        if self.fallen_back.contains(&plan) {
            self.st.workspaces_skipped += 1;
            return Outcome::Ignored;
        }
        match self.malloc(index, id, size, stream, false) {
            Outcome::Oom(failure) => self.workspace_failed(failure, plan, cached),
            other => other,
        }
    }

    /// What follows a failed workspace: the first engine again after a cached plan, then the
    /// fallback. A cached plan that `cudnn.benchmark` found goes back to the search instead
    /// (`run_single_conv`: the `OutOfMemoryError` of the cached plan is caught and, with
    /// benchmark on, `get_plans_from_find` runs again, then `emptyCache()`, then `try_plans`).
    fn workspace_failed(&mut self, failure: OomEvent, plan: u64, cached: bool) -> Outcome {
        let mut last = failure;
        if cached && self.searched.contains(&plan) {
            // The search's own workspace, the same size (the recording's engine is taken to
            // be the one with the largest workspace), released when the search returns.
            if let Some(failure) = self.search_workspace(
                failure.request_index,
                SEARCH_ID,
                failure.size,
                failure.stream,
                plan,
            ) {
                last = failure;
            }
            self.st.allocs -= 1;
            if let Some(b) = self.live.remove(&SEARCH_ID) {
                self.free(b);
            }
            // `_cudnn_get_conv_benchmark_empty_cache()`, on unless the program turned it off.
            self.release_cached_blocks();
            if !self.fallen_back.contains(&plan) {
                // try_plans: the searched engine first, asking for the same workspace.
                match self.ask_again(&failure) {
                    Outcome::Oom(failure) => last = failure,
                    other => return other,
                }
                self.fallen_back.insert(plan);
            }
        } else if cached {
            match self.ask_again(&failure) {
                Outcome::Oom(failure) => last = failure,
                other => return other,
            }
        }
        self.fallen_back.insert(plan);
        self.st.workspace_fallbacks += 1;
        self.st.first_fallback.get_or_insert(last);
        Outcome::FellBack(last)
    }

    /// The failed request asked once more (one request asked twice: not counted again).
    fn ask_again(&mut self, failure: &OomEvent) -> Outcome {
        let again = self.malloc(
            failure.request_index,
            failure.id,
            failure.size,
            failure.stream,
            false,
        );
        self.st.allocs -= 1;
        again
    }

    /// `cudnn.benchmark`'s search workspace ([`Request::SearchWorkspace`]) under `id`:
    /// nothing when `size` is more than `cacheInfo` says may fit, else `size`, halved after
    /// each failure. When it ends with less than `size`, `plan` falls back to the engine that
    /// needs no workspace. Returns the last failure, if any.
    fn search_workspace(
        &mut self,
        index: u64,
        id: u64,
        size: u64,
        stream: u64,
        plan: u64,
    ) -> Option<OomEvent> {
        // CUDACachingAllocator's cacheInfo: cudaMemGetInfo's free memory, or the largest
        // cached free block when that is larger.
        let free = self.device_capacity().saturating_sub(self.st.reserved);
        let available = free.max(self.largest_free_block());
        if size > available {
            self.st.allocs += 1;
            self.fallen_back.insert(plan);
            return None;
        }
        let mut last = None;
        let mut tried = size;
        let mut first = true;
        while tried > 0 {
            let outcome = self.malloc(index, id, tried, stream, false);
            if !first {
                // One request, asked several times.
                self.st.allocs -= 1;
            }
            first = false;
            match outcome {
                Outcome::Oom(failure) => {
                    last = Some(failure);
                    tried /= 2;
                }
                _ => break,
            }
        }
        if tried < size {
            self.fallen_back.insert(plan);
        }
        last
    }

    /// The largest cached free block of either pool, on any stream.
    fn largest_free_block(&self) -> u64 {
        let mut largest = 0u64;
        for pool in &self.pools {
            // The last block of each stream is that stream's largest.
            let mut from: Key = 0;
            while let Some((&k, _)) = pool.blocks.range(from..).next() {
                let stream = key_stream(k);
                let upper = if stream == u32::MAX {
                    Bound::Unbounded
                } else {
                    Bound::Excluded(key(stream + 1, 0, 0))
                };
                if let Some((&last, _)) = pool
                    .blocks
                    .range((Bound::Included(key(stream, 0, 0)), upper))
                    .next_back()
                {
                    largest = largest.max(key_size(last));
                }
                match upper {
                    Bound::Excluded(k) => from = k,
                    _ => break,
                }
            }
        }
        largest
    }

    /// Whether some convolution fell back ([`Request::Workspace`]): from then on its
    /// workspaces are skipped, so a caller that tells workspaces apart only when one fails
    /// (see [`Simulator::fall_back`]) must send every workspace as one.
    pub fn has_fallen_back(&self) -> bool {
        !self.fallen_back.is_empty()
    }

    /// Makes the [`Request::Alloc`] that just failed with `failure` a
    /// [`Request::Workspace`] of `plan` that failed: the same as applying that in its place
    /// (a failed allocation changes the cache the same way whatever it was), for a caller
    /// that finds out what an allocation is only when it fails. Returns what the workspace
    /// request would have returned.
    pub fn fall_back(&mut self, failure: OomEvent, plan: u64, cached: bool) -> Outcome {
        if self.st.first_oom == Some(failure) {
            self.st.first_oom = None;
        }
        let outcome = self.workspace_failed(failure, plan, cached);
        if self.peak_pending {
            self.peak_pending = false;
            self.snapshot_peak(self.now, failure.request_index);
        }
        outcome
    }

    /// `malloc(orig)`; a failure is the program's `OutOfMemoryError` when `raises` (the
    /// first one is [`Stats::first_oom`]).
    fn malloc(&mut self, index: u64, id: u64, orig: u64, stream: u64, raises: bool) -> Outcome {
        self.st.allocs += 1;
        if orig == 0 {
            return Outcome::Ok;
        }
        if self.live.contains_key(&id) {
            self.st.ignored += 1;
            return Outcome::Ignored;
        }
        let too_big = orig > MAX_REQUEST;
        let size = if too_big {
            orig
        } else {
            round_size(orig, &self.cfg)
        };
        let small = size <= SMALL_SIZE;
        let alloc_size = if too_big { orig } else { allocation_size(size) };
        let sidx = self.stream_index(stream);

        let mut found = None;
        if !too_big {
            found = self.get_free_block(small, sidx, size);
            if found.is_none() {
                if self.gc {
                    self.garbage_collect();
                }
                found = self.alloc_block(small, sidx, size, alloc_size, false);
                if found.is_none() && self.release_available_cached_blocks(small, sidx, size) {
                    found = self.alloc_block(small, sidx, size, alloc_size, false);
                }
                // No release-and-retry while a capture is under way (torch's malloc:
                // `C10_LIKELY(captures_underway.empty()) && release_cached_blocks(...)`).
                if found.is_none() && self.captures.is_empty() {
                    self.release_cached_blocks();
                    found = self.alloc_block(small, sidx, size, alloc_size, true);
                }
            }
        }
        let Some(block) = found else {
            let ev = OomEvent {
                t_ns: self.now,
                request_index: index,
                id,
                size: orig,
                rounded: size,
                alloc_size,
                stream,
                reserved: self.st.reserved,
                allocated: self.st.allocated,
                device_free: self.device_capacity().saturating_sub(self.st.reserved),
                peak_reserved: self.st.peak_reserved,
                num_alloc_retries: self.st.num_alloc_retries,
                num_device_alloc: self.st.num_device_alloc,
                num_device_free: self.st.num_device_free,
                num_ooms: self.st.num_ooms + 1,
            };
            self.st.num_ooms += 1;
            if raises && self.st.first_oom.is_none() {
                self.st.first_oom = Some(ev);
            }
            return Outcome::Oom(ev);
        };
        let b = self.alloc_found_block(block, size, orig, sidx);
        self.live.insert(id, b);
        Outcome::Ok
    }

    /// Best fit in the pool on the same stream, honouring the max_split_size rules.
    fn get_free_block(&mut self, small: bool, stream: u32, size: u64) -> Option<u32> {
        let p = pool_index(small);
        if self.gc {
            self.pools[p].gc_calls += 1;
        }
        let slab = &self.slab;
        let exp_size = |i: u32| {
            let b = &slab[i as usize];
            let n = b.next;
            b.size
                + if n != NONE && !slab[n as usize].mapped {
                    slab[n as usize].size
                } else {
                    0
                }
        };
        let mut it = self.pools[p].blocks.range(lower_key(stream, size)..);
        let (&k, &first) = it.next()?;
        if key_stream(k) != stream {
            return None;
        }
        let mut cur = first;
        if slab[cur as usize].seg != NONE {
            // For a block at the mapped end of an expandable segment, best fit counts the
            // size it could grow to; prefer a later block that can grow less.
            for (&k2, &n) in it {
                if slab[cur as usize].seg == NONE
                    || key_stream(k2) != stream
                    || exp_size(n) >= exp_size(cur)
                {
                    break;
                }
                cur = n;
            }
        }
        let bsize = slab[cur as usize].size;
        if size < self.max_split && bsize >= self.max_split {
            return None;
        }
        if size >= self.max_split && bsize >= size.saturating_add(self.cfg.max_non_split_rounding) {
            return None;
        }
        self.remove_free(cur);
        Some(cur)
    }

    fn should_split(&self, b: u32, size: u64) -> bool {
        let b = &self.slab[b as usize];
        let remaining = b.size - size;
        if b.small || self.cfg.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.max_split && remaining > SMALL_SIZE
        }
    }

    /// Hands out `b` (already out of the free set), splitting off the remainder if the rules
    /// allow. Returns the allocated block.
    fn alloc_found_block(&mut self, b: u32, size: u64, orig: u64, stream: u32) -> u32 {
        let split = self.should_split(b, size);
        let blk = self.slab[b as usize];
        let already_split = blk.is_split();
        let expandable = blk.seg != NONE;
        let out = if split {
            let front = self.carve_front(b, size, stream, true);
            let rem_size = self.slab[b as usize].size;
            self.insert_free(b);
            if !expandable {
                if already_split {
                    self.st.inactive_split_bytes -= size;
                } else {
                    self.st.inactive_split_bytes += rem_size;
                }
            }
            front
        } else {
            if already_split && !expandable {
                self.st.inactive_split_bytes -= blk.size;
            }
            b
        };
        let o = &mut self.slab[out as usize];
        o.allocated = true;
        o.requested = orig;
        let bsize = o.size;
        self.st.allocated += bsize;
        self.st.requested += orig;
        if self.st.allocated > self.st.peak_allocated {
            self.st.peak_allocated = self.st.allocated;
            self.st.peak_allocated_t_ns = self.now;
        }
        self.st.peak_requested = self.st.peak_requested.max(self.st.requested);
        out
    }

    /// A new segment (`cudaMalloc`) or, with expandable segments, newly mapped pages.
    fn alloc_block(
        &mut self,
        small: bool,
        stream: u32,
        size: u64,
        alloc_size: u64,
        is_retry: bool,
    ) -> Option<u32> {
        if is_retry {
            self.st.num_alloc_retries += 1;
        }
        if let Some(limit) = self.allowed_max
            && self.st.reserved.saturating_add(alloc_size) > limit
        {
            return None;
        }
        if self.cfg.expandable_segments {
            return self.try_allocate_expandable_block(small, stream, size);
        }
        if self.st.reserved.saturating_add(alloc_size) > self.device_capacity() {
            return None;
        }
        let addr = self.reserve_va(alloc_size, SEGMENT_ALIGN);
        let b = self.new_block(Block {
            addr,
            size: alloc_size,
            requested: 0,
            stream,
            gc_base: 0,
            prev: NONE,
            next: NONE,
            seg: NONE,
            small,
            allocated: false,
            mapped: true,
            live: true,
        });
        self.add_reserved(alloc_size);
        self.st.num_device_alloc += 1;
        Some(b)
    }

    // ---- free -----------------------------------------------------------------------------

    fn free(&mut self, b: u32) {
        let blk = &mut self.slab[b as usize];
        blk.allocated = false;
        let (size, requested) = (blk.size, blk.requested);
        self.st.allocated -= size;
        self.st.requested -= requested;
        self.free_block(b);
    }

    /// Returns `b` to its pool, merged with its free neighbours.
    fn free_block(&mut self, b: u32) {
        let mut net: i64 = 0;
        let (prev, next) = {
            let blk = &self.slab[b as usize];
            (blk.prev, blk.next)
        };
        for cand in [prev, next] {
            let subsumed = self.try_merge(b, cand);
            if subsumed > 0 {
                net -= subsumed as i64;
            }
        }
        self.insert_free(b);
        let blk = &self.slab[b as usize];
        if blk.is_split() {
            net += blk.size as i64;
        }
        if blk.seg == NONE {
            self.st.inactive_split_bytes = (self.st.inactive_split_bytes as i64 + net) as u64;
        }
    }

    /// Merges free neighbour `src` into `dst` when both are free and equally mapped.
    /// Returns the bytes taken over (0 when not merged).
    fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        if src == NONE {
            return 0;
        }
        let s = self.slab[src as usize];
        if s.allocated || s.mapped != self.slab[dst as usize].mapped {
            return 0;
        }
        if s.mapped {
            self.remove_free(src);
        } else {
            self.remove_unmapped(src);
        }
        if self.slab[dst as usize].prev == src {
            let d = &mut self.slab[dst as usize];
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NONE {
                self.slab[s.prev as usize].next = dst;
            }
        } else {
            let d = &mut self.slab[dst as usize];
            d.next = s.next;
            if s.next != NONE {
                self.slab[s.next as usize].prev = dst;
            }
        }
        self.slab[dst as usize].size += s.size;
        self.drop_block(src);
        s.size
    }

    // ---- releasing memory -----------------------------------------------------------------

    /// `cudaFree` of a whole free segment.
    fn release_block(&mut self, b: u32) {
        debug_assert!(!self.slab[b as usize].is_split() && self.slab[b as usize].seg == NONE);
        self.remove_free(b);
        self.st.reserved -= self.slab[b as usize].size;
        self.st.num_device_free += 1;
        self.drop_block(b);
    }

    /// With max_split_size set: frees one cached oversize block big enough for the request,
    /// or else oversize blocks from the largest down until enough is freed. Returns whether
    /// enough was freed. (Skipped with expandable segments, whose blocks PyTorch cannot
    /// release this way.)
    fn release_available_cached_blocks(&mut self, small: bool, stream: u32, size: u64) -> bool {
        if self.max_split == u64::MAX || self.cfg.expandable_segments {
            return false;
        }
        let want = size.max(self.max_split);
        let pool = &self.pools[pool_index(small)];
        if let Some((&k, &b)) = pool.blocks.range(lower_key(stream, want)..).next()
            && key_stream(k) == stream
        {
            self.release_block(b);
            return true;
        }
        let mut list = std::mem::take(&mut self.scratch);
        list.clear();
        let mut total = 0u64;
        for (&k, &b) in pool.blocks.range(..lower_key(stream, want)).rev() {
            let bsize = key_size(k);
            if total >= want || bsize < self.max_split || key_stream(k) != stream {
                break;
            }
            total += bsize;
            list.push(b);
        }
        for &b in &list {
            self.release_block(b);
        }
        self.scratch = list;
        total >= want
    }

    /// Releases every fully free segment (and unmaps the free pages of expandable ones):
    /// `empty_cache()` and the last step before an OOM.
    fn release_cached_blocks(&mut self) {
        self.release_blocks(false);
        self.release_blocks(true);
    }

    fn release_blocks(&mut self, small: bool) {
        let mut whole = std::mem::take(&mut self.scratch);
        let mut to_unmap = std::mem::take(&mut self.scratch2);
        whole.clear();
        to_unmap.clear();
        for &b in self.pools[pool_index(small)].blocks.values() {
            let blk = &self.slab[b as usize];
            if !self.releasable(blk.stream) {
                // A private pool some graph still uses keeps its segments.
                continue;
            }
            if blk.seg != NONE {
                to_unmap.push(b);
            } else if !blk.is_split() {
                whole.push(b);
            }
        }
        for &b in &whole {
            self.release_block(b);
        }
        for &b in &to_unmap {
            self.unmap_block(b);
            let blk = self.slab[b as usize];
            if !blk.is_split() && !blk.mapped {
                // The whole address range is unmapped: give the segment back.
                self.remove_unmapped(b);
                self.drop_block(b);
                self.free_segs[pool_index(small)].push(blk.seg);
            }
        }
        self.scratch = whole;
        self.scratch2 = to_unmap;
    }

    /// Garbage collection (memory fraction and threshold set): when reserved memory is above
    /// `threshold × allowed`, frees whole cached large-pool segments that have gone unused
    /// for at least the average number of pool lookups, repeating until enough is freed.
    fn garbage_collect(&mut self) {
        let Some(limit) = self.allowed_max else {
            return;
        };
        let threshold = self.cfg.garbage_collection_threshold.unwrap_or(0.0);
        let gc_threshold = (threshold * limit as f64) as u64;
        if self.st.reserved <= gc_threshold {
            return;
        }
        let target = self.st.reserved - gc_threshold;
        let calls = self.pools[1].gc_calls;
        let age = |b: &Block| calls - b.gc_base;
        // Only the ordinary large pool is collected (`garbage_collect_cached_blocks` walks
        // `large_blocks`), never a private pool's.
        let private: Vec<bool> = (0..self.streams.len() as u32)
            .map(|i| self.is_private(i))
            .collect();
        let freeable = |b: &Block| {
            !b.is_split()
                && b.seg == NONE
                && !private.get(b.stream as usize).copied().unwrap_or(false)
        };

        let mut total_age = 0.0f64;
        let mut count = 0usize;
        for &b in self.pools[1].blocks.values() {
            let blk = &self.slab[b as usize];
            if freeable(blk) {
                total_age += age(blk) as f64;
                count += 1;
            }
        }
        if count == 0 {
            return;
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        let mut list = std::mem::take(&mut self.scratch);
        while reclaimed < target && freed && count > 0 {
            let age_threshold = total_age / count as f64;
            freed = false;
            list.clear();
            for &b in self.pools[1].blocks.values() {
                let blk = &self.slab[b as usize];
                if freeable(blk) && age(blk) as f64 >= age_threshold {
                    list.push(b);
                }
            }
            for &b in &list {
                let blk = self.slab[b as usize];
                freed = true;
                reclaimed += blk.size;
                total_age -= age(&blk) as f64;
                count -= 1;
                self.release_block(b);
            }
        }
        self.scratch = list;
    }

    // ---- expandable segments --------------------------------------------------------------

    /// The lowest-address place in an existing segment of this stream and pool with `size`
    /// bytes of free and unmapped space in a row, or a new segment's unmapped range.
    fn find_expandable_block(&mut self, small: bool, stream: u32, size: u64) -> u32 {
        let slab = &self.slab;
        let allocatable = |b: u32| b != NONE && !slab[b as usize].allocated;
        let p = pool_index(small);
        for (&(s, _), &u) in self.pools[p].unmapped.range((stream, 0)..) {
            if s != stream {
                break;
            }
            let mut c = u;
            let prev = slab[c as usize].prev;
            if allocatable(prev) {
                c = prev;
            }
            let mut bytes = 0u64;
            let mut b = c;
            while bytes < size && allocatable(b) {
                bytes += slab[b as usize].size;
                b = slab[b as usize].next;
            }
            if bytes >= size {
                return c;
            }
        }
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let cap = self.cfg.capacity.min(MAX_VA_CAPACITY);
        let va = (cap + cap / 8).div_ceil(page).max(1) * page;
        let seg = match self.free_segs[p].pop() {
            Some(seg) => seg,
            None => {
                let base = self.reserve_va(va, page);
                self.segs.push(ExpSeg { base, page });
                (self.segs.len() - 1) as u32
            }
        };
        let base = self.segs[seg as usize].base;
        let b = self.new_block(Block {
            addr: base,
            size: va,
            requested: 0,
            stream,
            gc_base: 0,
            prev: NONE,
            next: NONE,
            seg,
            small,
            allocated: false,
            mapped: false,
            live: true,
        });
        self.insert_unmapped(b);
        b
    }

    /// Maps whole pages covering the first `size` bytes of unmapped block `b`; the mapped
    /// part merges with free neighbours and joins the free set. False when the pages do not
    /// fit in the capacity (nothing is mapped then).
    fn map_block(&mut self, b: u32, size: u64) -> bool {
        let blk = self.slab[b as usize];
        debug_assert!(!blk.mapped && size <= blk.size);
        let seg = &self.segs[blk.seg as usize];
        let page = seg.page;
        let rel = blk.addr - seg.base;
        debug_assert_eq!(rel % page, 0);
        let mapped = (rel + size).div_ceil(page) * page - rel;
        if mapped == 0 || self.st.reserved.saturating_add(mapped) > self.device_capacity() {
            return false;
        }
        self.remove_unmapped(b);
        self.slab[b as usize].mapped = true;
        if mapped < blk.size {
            let rest = self.carve_back(b, mapped, false);
            self.insert_unmapped(rest);
        }
        let (prev, next) = (self.slab[b as usize].prev, self.slab[b as usize].next);
        self.try_merge(b, prev);
        self.try_merge(b, next);
        self.insert_free(b);
        self.add_reserved(mapped);
        self.st.num_device_alloc += 1;
        true
    }

    fn try_allocate_expandable_block(
        &mut self,
        small: bool,
        stream: u32,
        size: u64,
    ) -> Option<u32> {
        let mut c = self.find_expandable_block(small, stream, size);
        if !self.slab[c as usize].mapped {
            let want = self.slab[c as usize].size.min(size);
            if !self.map_block(c, want) {
                return None;
            }
        }
        while self.slab[c as usize].size < size {
            let remaining = size - self.slab[c as usize].size;
            let n = self.slab[c as usize].next;
            if n == NONE || self.slab[n as usize].mapped {
                return None;
            }
            let want = remaining.min(self.slab[n as usize].size);
            if !self.map_block(n, want) {
                return None;
            }
            c = n;
        }
        self.remove_free(c);
        Some(c)
    }

    /// Unmaps the whole pages inside free expandable block `b`; partial pages at either end
    /// stay mapped as free blocks of their own.
    fn unmap_block(&mut self, b: u32) {
        let blk = self.slab[b as usize];
        let seg = &self.segs[blk.seg as usize];
        let (base, page) = (seg.base, seg.page);
        let begin = (blk.addr - base).div_ceil(page);
        let end = (blk.addr + blk.size - base) / page;
        if begin >= end {
            return;
        }
        self.remove_free(b);
        let un_addr = base + begin * page;
        let un_size = (end - begin) * page;
        let before = un_addr - blk.addr;
        // Partial pages at either end stay mapped, as free blocks of their own.
        if before > 0 {
            let f = self.carve_front(b, before, blk.stream, true);
            self.insert_free(f);
        }
        if blk.size - before > un_size {
            let f = self.carve_back(b, un_size, true);
            self.insert_free(f);
        }
        debug_assert_eq!(
            (self.slab[b as usize].addr, self.slab[b as usize].size),
            (un_addr, un_size)
        );
        self.slab[b as usize].mapped = false;
        let (prev, next) = (self.slab[b as usize].prev, self.slab[b as usize].next);
        self.try_merge(b, prev);
        self.try_merge(b, next);
        self.insert_unmapped(b);
        self.st.reserved -= un_size;
        self.st.num_device_free += 1;
    }
}
