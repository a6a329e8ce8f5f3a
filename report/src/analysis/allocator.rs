//! The caching-allocator view of a recording: which allocator pattern the device's
//! allocations follow (PyTorch's native caching allocator, expandable segments,
//! `cudaMallocAsync`, one buffer per allocation), reserved bytes over time, segment sizes,
//! `cudaMalloc`/`cudaFree` counts, `empty_cache()`-like release bursts, and device memory
//! outside every allocator.
//!
//! "Reserved" here is what the hooks see the allocator hold: live runtime-API allocations
//! (`cudaMalloc`), VMM physical allocations (`cuMemCreate`) and stream-ordered allocations of
//! the device (managed memory and pinned host memory excluded). For PyTorch's native allocator
//! and expandable segments that is exactly `torch.cuda.memory_reserved()`; for
//! `cudaMallocAsync` it is the live tensors (the driver pool's own cache is invisible to the
//! hooks).
//!
//! Driver-API allocations (`cuMemAlloc_v2`, `cuMemAllocPitch_v2`) are counted apart, as
//! [`Libraries`]: PyTorch's allocators never make them, while NVIDIA's libraries, which link
//! the CUDA runtime statically, reach the driver that way. Seen on an H200 with torch 2.11:
//! cuBLAS 13.1 makes three at each handle's creation (1 KiB, 128 KiB and 64 MiB), cuDNN 9.19
//! two small ones per handle; counted as reserved they made the peak 128.25 MiB above
//! `reserved_bytes.all.peak`. A device with driver-API allocations only (a program of its own
//! on the driver API) has them as its reserved bytes: there they are the program's.
//! VMM physical allocations whose innermost native frame is in one of NVIDIA's libraries are
//! [`Libraries`] too: NCCL (2.19 and later) makes its buffers with `cuMemCreate` (195 of
//! 2 MiB for one rank, NCCL 2.28 on an H200), which would otherwise read as expandable
//! segments. Without native stacks in the log they cannot be told apart.

use std::collections::BTreeMap;

use vramshim_format::EventKind;

use super::apis::{Family, FamilyCache};
use crate::replay::{Effect, Live, Observer, Process, State, Step};

const MIB: u64 = 1 << 20;
/// Points kept in a reserved-bytes series; a long log costs the same as a short one.
pub const MAX_POINTS: usize = 256;
/// Distinct allocation sizes counted exactly per device; later new sizes go to "other".
pub const MAX_SIZES: usize = 4096;
/// Release bursts kept per device; later ones are only counted.
pub const MAX_BURSTS: usize = 1000;
/// Longest gap between two frees of one release burst.
pub const BURST_GAP_NS: u64 = 100_000_000;
/// Fewest frees that make a burst.
pub const BURST_MIN_FREES: u64 = 2;
/// Width of the first series bucket.
const FIRST_BUCKET_NS: u64 = 1_000_000;

/// Recorded environment variables that select PyTorch's allocator.
pub const ALLOC_ENV: [&str; 3] = [
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
];

/// Which allocator the recorded allocations look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// PyTorch's default caching allocator: `cudaMalloc` of segments (2 MiB, 20 MiB, larger
    /// multiples of 2 MiB).
    NativeCaching,
    /// PyTorch's `expandable_segments:True`: VMM chunks of 2 MiB / 20 MiB.
    ExpandableSegments,
    /// A stream-ordered pool (`cudaMallocAsync`): one allocation per tensor.
    CudaMallocAsync,
    /// One `cudaMalloc` per buffer, no caching (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`, or a
    /// program managing its own buffers).
    PerBuffer,
    /// Nothing allocated, or nothing recognisable.
    Unknown,
}

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::NativeCaching => "native_caching",
            Pattern::ExpandableSegments => "expandable_segments",
            Pattern::CudaMallocAsync => "cuda_malloc_async",
            Pattern::PerBuffer => "per_buffer",
            Pattern::Unknown => "unknown",
        }
    }

    /// Whether the device's allocations are allocator segments rather than tensors.
    pub fn is_segments(self) -> bool {
        matches!(self, Pattern::NativeCaching | Pattern::ExpandableSegments)
    }
}

/// A size PyTorch's native allocator `cudaMalloc`s for a segment: 2 MiB, or a multiple of
/// 2 MiB from 10 MiB on (20 MiB included).
pub fn is_segment_size(size: u64) -> bool {
    size == 2 * MIB || (size >= 10 * MIB && size.is_multiple_of(2 * MIB))
}

/// The allocator settings a process's header recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocEnv {
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING` set to a true value.
    pub no_caching: bool,
    /// `backend:cudaMallocAsync` in either configuration variable.
    pub cuda_malloc_async: bool,
    /// `expandable_segments:True` in either configuration variable.
    pub expandable: bool,
    /// `max_split_size_mb:N`, in bytes (PyTorch reads N as whole MiB).
    pub max_split_size: Option<u64>,
    /// `garbage_collection_threshold` set (it releases segments without a failure).
    pub garbage_collection: bool,
}

impl AllocEnv {
    /// Reads the recorded variables (PyTorch uses `PYTORCH_ALLOC_CONF` when set, else
    /// `PYTORCH_CUDA_ALLOC_CONF`).
    pub fn of(process: &Process) -> AllocEnv {
        let header = &process.header;
        let no_caching = header
            .env_value("PYTORCH_NO_CUDA_MEMORY_CACHING")
            .is_some_and(|v| {
                let v = v.trim();
                !v.is_empty() && v != "0"
            });
        let mut env = AllocEnv {
            no_caching,
            ..AllocEnv::default()
        };
        let conf = header
            .env_value("PYTORCH_ALLOC_CONF")
            .or_else(|| header.env_value("PYTORCH_CUDA_ALLOC_CONF"));
        if let Some(conf) = conf {
            for (key, value) in conf_pairs(conf) {
                match key.as_str() {
                    "backend" => {
                        env.cuda_malloc_async = value.eq_ignore_ascii_case("cudaMallocAsync")
                    }
                    "expandable_segments" => env.expandable = value == "True" || value == "true",
                    "garbage_collection_threshold" => env.garbage_collection = true,
                    "max_split_size_mb" => {
                        env.max_split_size =
                            value.parse::<u64>().ok().and_then(|mb| mb.checked_mul(MIB))
                    }
                    _ => {}
                }
            }
        }
        env
    }
}

/// The top-level `key:value` pairs of an allocator configuration string (brackets kept
/// inside values), spaces removed.
fn conf_pairs(conf: &str) -> Vec<(String, String)> {
    let cleaned: String = conf.chars().filter(|c| !c.is_whitespace()).collect();
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    for c in cleaned.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts
        .into_iter()
        .filter_map(|part| {
            part.split_once(':')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// What a device's allocations looked like, for [`PatternCounts::classify`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PatternCounts {
    /// Successful plain allocations of the allocator: `cudaMalloc` (runtime family), or
    /// `cuMemAlloc` on a device with driver-API allocations only (arrays excluded).
    pub plain_allocs: u64,
    /// ... of which had a segment size ([`is_segment_size`]).
    pub segment_sized: u64,
    /// Successful stream-ordered allocations.
    pub async_allocs: u64,
    /// Successful `cuMemCreate`.
    pub vmm_creates: u64,
    /// ... of which were multiples of 2 MiB.
    pub chunk_sized: u64,
    /// The settings of the processes that allocated on the device, or-ed.
    pub env: AllocEnv,
}

impl PatternCounts {
    /// Says which allocator the counts look like, and why.
    pub fn classify(&self) -> (Pattern, String) {
        let c = self;
        if c.plain_allocs + c.async_allocs + c.vmm_creates == 0 {
            return (
                Pattern::Unknown,
                "no cudaMalloc, stream-ordered or VMM allocation on the device".to_string(),
            );
        }
        if c.env.no_caching {
            return (
                Pattern::PerBuffer,
                "PYTORCH_NO_CUDA_MEMORY_CACHING is set in the recorded environment".to_string(),
            );
        }
        if c.env.cuda_malloc_async {
            return (
                Pattern::CudaMallocAsync,
                "the recorded allocator configuration selects backend:cudaMallocAsync".to_string(),
            );
        }
        if c.vmm_creates > 0
            && c.vmm_creates >= c.plain_allocs
            && c.vmm_creates >= c.async_allocs
            && (c.env.expandable || c.chunk_sized * 10 >= c.vmm_creates * 9)
        {
            let why = if c.env.expandable {
                "the recorded configuration sets expandable_segments:True and physical memory comes from cuMemCreate chunks"
            } else {
                "physical memory comes from cuMemCreate chunks of multiples of 2 MiB"
            };
            return (Pattern::ExpandableSegments, why.to_string());
        }
        if c.async_allocs > c.plain_allocs {
            return (
                Pattern::CudaMallocAsync,
                "most allocations are stream-ordered (cudaMallocAsync / cuMemAllocAsync)"
                    .to_string(),
            );
        }
        if c.plain_allocs > 0 && c.segment_sized * 10 >= c.plain_allocs * 9 {
            return (
                Pattern::NativeCaching,
                format!(
                    "{} of {} cudaMalloc sizes are caching-allocator segment sizes (2 MiB, or multiples of 2 MiB from 10 MiB)",
                    c.segment_sized, c.plain_allocs
                ),
            );
        }
        if c.plain_allocs > 0 {
            return (
                Pattern::PerBuffer,
                format!(
                    "only {} of {} cudaMalloc sizes are caching-allocator segment sizes",
                    c.segment_sized, c.plain_allocs
                ),
            );
        }
        (
            Pattern::Unknown,
            "allocations follow no known allocator pattern".to_string(),
        )
    }
}

/// A value over time in bounded memory: at most [`MAX_POINTS`] buckets of equal width, each
/// holding the highest value reached in it; the width doubles as the replay runs on.
#[derive(Clone, Debug)]
pub struct Series {
    pub bucket_ns: u64,
    buckets: Vec<Option<u64>>,
    level: u64,
}

impl Default for Series {
    fn default() -> Series {
        Series {
            bucket_ns: FIRST_BUCKET_NS,
            buckets: Vec::new(),
            level: 0,
        }
    }
}

impl Series {
    /// The value changed to `value` at `t_ns`.
    pub fn record(&mut self, t_ns: u64, value: u64) {
        let mut index = t_ns / self.bucket_ns;
        while index >= MAX_POINTS as u64 {
            let merged: Vec<Option<u64>> = self
                .buckets
                .chunks(2)
                .map(|pair| pair.iter().flatten().copied().max())
                .collect();
            self.buckets = merged;
            self.bucket_ns = self.bucket_ns.saturating_mul(2);
            index = t_ns / self.bucket_ns;
        }
        let index = index as usize;
        if self.buckets.len() <= index {
            self.buckets.resize(index + 1, None);
        }
        let slot = &mut self.buckets[index];
        let start = slot.unwrap_or(self.level);
        *slot = Some(start.max(value));
        self.level = value;
    }

    /// (bucket start, highest value in the bucket) for each bucket where the value changed.
    pub fn points(&self) -> Vec<(u64, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (i as u64 * self.bucket_ns, v)))
            .collect()
    }
}

/// Several frees of segments close together with no allocation between them: what
/// `torch.cuda.empty_cache()` looks like from below.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Burst {
    pub process: u32,
    pub t_ns: u64,
    pub end_t_ns: u64,
    pub frees: u64,
    pub bytes: u64,
}

/// Calls and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    pub count: u64,
    pub bytes: u64,
}

impl Calls {
    fn add(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes = self.bytes.saturating_add(bytes);
    }
}

/// Used device memory outside every recorded allocation: `cuMemGetInfo` used − reserved −
/// libraries' live driver-API allocations (the context, loaded kernels, what no hook sees).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outside {
    pub samples: u64,
    pub max: u64,
    pub max_t_ns: u64,
    pub last: u64,
    pub last_t_ns: u64,
    /// The device's total memory (last sample).
    pub total: u64,
}

/// Release bursts of one kind of allocation (see [`Burst`]).
#[derive(Clone, Debug, Default)]
pub struct Bursts {
    pub list: Vec<Burst>,
    pub omitted: u64,
    pub total: Calls,
    current: Option<Burst>,
}

impl Bursts {
    fn close(&mut self) {
        if let Some(burst) = self.current.take()
            && burst.frees >= BURST_MIN_FREES
        {
            self.total.count += 1;
            self.total.bytes = self.total.bytes.saturating_add(burst.bytes);
            if self.list.len() < MAX_BURSTS {
                self.list.push(burst);
            } else {
                self.omitted += 1;
            }
        }
    }

    fn freed(&mut self, process: u32, t_ns: u64, bytes: u64) {
        if let Some(burst) = &mut self.current
            && burst.process == process
            && t_ns.saturating_sub(burst.end_t_ns) <= BURST_GAP_NS
        {
            burst.end_t_ns = t_ns;
            burst.frees += 1;
            burst.bytes = burst.bytes.saturating_add(bytes);
            return;
        }
        self.close();
        self.current = Some(Burst {
            process,
            t_ns,
            end_t_ns: t_ns,
            frees: 1,
            bytes,
        });
    }
}

/// Allocation sizes counted exactly up to [`MAX_SIZES`] distinct ones.
#[derive(Clone, Debug, Default)]
pub struct Sizes {
    /// size → count.
    pub counts: BTreeMap<u64, u64>,
    /// Allocations whose size came after [`MAX_SIZES`] distinct ones.
    pub other: Calls,
}

impl Sizes {
    /// (size, count), most bytes first (ties: smaller size first).
    pub fn by_bytes(&self) -> Vec<(u64, u64)> {
        let mut sizes: Vec<(u64, u64)> = self.counts.iter().map(|(s, n)| (*s, *n)).collect();
        sizes.sort_by_key(|(size, count)| (std::cmp::Reverse(size.saturating_mul(*count)), *size));
        sizes
    }

    fn count(&mut self, size: u64) {
        if let Some(n) = self.counts.get_mut(&size) {
            *n += 1;
        } else if self.counts.len() < MAX_SIZES {
            self.counts.insert(size, 1);
        } else {
            self.other.add(size);
        }
    }
}

/// Live bytes over time with their peak.
#[derive(Clone, Debug, Default)]
pub struct Held {
    pub current: u64,
    pub peak: u64,
    pub peak_t_ns: u64,
    pub series: Series,
}

impl Held {
    fn set(&mut self, t_ns: u64, value: u64) {
        self.current = value;
        if value > self.peak {
            self.peak = value;
            self.peak_t_ns = t_ns;
        }
        self.series.record(t_ns, value);
    }
}

/// Driver-API allocations on a device that also has the allocator's own (runtime, VMM or
/// stream-ordered): libraries' memory (cuBLAS's handle workspace, cuDNN, NCCL's
/// `cuMemAlloc` buffers), kept out of the reserved bytes.
#[derive(Clone, Debug, Default)]
pub struct Libraries {
    pub held: Held,
    pub malloc: Calls,
    pub failed: Calls,
    pub free: Calls,
    pub sizes: Sizes,
    /// Successful allocations of a segment size ([`is_segment_size`]).
    segment_sized: u64,
    bursts: Bursts,
}

/// Everything the view keeps for one device.
#[derive(Clone, Debug, Default)]
pub struct DeviceAllocator {
    pub device: i32,
    pub counts: PatternCounts,
    /// Bytes the allocator holds (see the module's "reserved").
    pub reserved: Held,
    /// Successful allocation sizes (plain allocations and VMM creates).
    pub sizes: Sizes,
    pub malloc: Calls,
    pub malloc_failed: Calls,
    pub free: Calls,
    pub vmm_create: Calls,
    pub vmm_release: Calls,
    pub vmm_maps: u64,
    pub vmm_unmaps: u64,
    pub async_alloc: Calls,
    pub async_free: Calls,
    pub trims: u64,
    /// `empty_cache()`-like release bursts of the allocator's segments.
    pub bursts: Bursts,
    /// Driver-API allocations beside the allocator's ([`Libraries`]); empty after
    /// [`AllocatorView::finish`] when they were the device's only allocations.
    pub libraries: Libraries,
    pub outside: Option<Outside>,
    /// A failed allocation and no allocation since: frees now belong to an OOM retry.
    after_failure: bool,
}

impl DeviceAllocator {
    fn new(device: i32) -> DeviceAllocator {
        DeviceAllocator {
            device,
            ..DeviceAllocator::default()
        }
    }

    pub fn pattern(&self) -> (Pattern, String) {
        self.counts.classify()
    }

    fn close_burst(&mut self) {
        self.bursts.close();
        self.libraries.bursts.close();
    }

    fn segment_freed(&mut self, process: u32, t_ns: u64, bytes: u64) {
        if !self.after_failure {
            self.bursts.freed(process, t_ns, bytes);
        }
    }

    /// Whether the allocator's own families (runtime, VMM, stream-ordered) allocated here.
    fn allocator_allocated(&self) -> bool {
        self.malloc.count + self.vmm_create.count + self.async_alloc.count > 0
    }

    /// After the replay: driver-API allocations on a device with no other kind are the
    /// program's own, so they become its reserved bytes; else they stay [`Libraries`].
    fn finish(&mut self) {
        self.close_burst();
        if self.allocator_allocated()
            || self.libraries.malloc.count + self.libraries.failed.count == 0
        {
            return;
        }
        let libraries = std::mem::take(&mut self.libraries);
        self.reserved = libraries.held;
        self.sizes = libraries.sizes;
        self.bursts = libraries.bursts;
        self.malloc = libraries.malloc;
        self.malloc_failed.count += libraries.failed.count;
        self.malloc_failed.bytes = self
            .malloc_failed
            .bytes
            .saturating_add(libraries.failed.bytes);
        self.free = libraries.free;
        self.counts.plain_allocs = libraries.malloc.count;
        self.counts.segment_sized = libraries.segment_sized;
    }
}

/// Whether a live object counts in the allocator's reserved figure (driver-API allocations
/// and NVIDIA libraries' VMM allocations go to [`Libraries`] instead).
fn counts_as_reserved(live: &Live, family: Family, by_library: bool) -> bool {
    live.device >= 0
        && !by_library
        && (live.kind == EventKind::Create
            || matches!(family, Family::Runtime | Family::StreamOrdered))
}

/// Whether a live object is a library's own allocation ([`Libraries`]): a plain driver-API
/// allocation, or a VMM physical allocation an NVIDIA library made.
fn is_driver_allocation(live: &Live, family: Family, by_library: bool) -> bool {
    live.device >= 0
        && (by_library
            || (live.kind != EventKind::Create && family == Family::Driver && live.addr != 0))
}

/// Observer building the allocator view of every device (or only `device`).
pub struct AllocatorView {
    filter: Option<i32>,
    pub devices: Vec<DeviceAllocator>,
    /// `cuMemAddressReserve` calls (address space only, any device).
    pub reservations: Calls,
    /// Family of each api index, per process.
    families: FamilyCache,
    envs: Vec<Option<AllocEnv>>,
    /// (process, stack) → whether the stack's innermost native frame is in an NVIDIA library.
    library_stacks: rustc_hash::FxHashMap<(u32, u32), bool>,
}

impl AllocatorView {
    pub fn new(filter: Option<i32>) -> AllocatorView {
        AllocatorView {
            filter,
            devices: Vec::new(),
            reservations: Calls::default(),
            families: FamilyCache::default(),
            envs: Vec::new(),
            library_stacks: rustc_hash::FxHashMap::default(),
        }
    }

    /// Whether `live` is a VMM physical allocation made inside one of NVIDIA's libraries.
    fn by_library(&mut self, processes: &[Process], live: &Live) -> bool {
        if live.kind != EventKind::Create {
            return false;
        }
        *self
            .library_stacks
            .entry((live.process, live.stack))
            .or_insert_with(|| {
                let Some(process) = processes.get(live.process as usize) else {
                    return false;
                };
                let Some(&innermost) = process.stacks.get(&live.stack).and_then(|f| f.first())
                else {
                    return false;
                };
                process
                    .modules
                    .iter()
                    .find(|m| m.start <= innermost && innermost < m.end)
                    .is_some_and(|m| super::apis::is_nvidia_library(&m.path))
            })
    }

    /// Closes open bursts and settles what driver-API allocations are; call once after the
    /// replay.
    pub fn finish(&mut self) {
        for device in &mut self.devices {
            device.finish();
        }
        self.devices.sort_by_key(|d| d.device);
    }

    /// The view of `device`, if anything happened there.
    pub fn device(&self, device: i32) -> Option<&DeviceAllocator> {
        self.devices.iter().find(|d| d.device == device)
    }

    fn env(&mut self, processes: &[Process], process: u32) -> AllocEnv {
        let p = process as usize;
        if self.envs.len() <= p {
            self.envs.resize(p + 1, None);
        }
        if let Some(env) = &self.envs[p] {
            return env.clone();
        }
        let env = processes.get(p).map(AllocEnv::of).unwrap_or_default();
        self.envs[p] = Some(env.clone());
        env
    }

    fn slot(&mut self, device: i32) -> Option<&mut DeviceAllocator> {
        if device < 0 || self.filter.is_some_and(|d| d != device) {
            return None;
        }
        let index = match self.devices.iter().position(|d| d.device == device) {
            Some(index) => index,
            None => {
                self.devices.push(DeviceAllocator::new(device));
                self.devices.len() - 1
            }
        };
        Some(&mut self.devices[index])
    }

    fn removed(&mut self, processes: &[Process], process: u32, t_ns: u64, live: &Live) {
        let family = self.families.of(processes, live.process, live.api);
        let by_library = self.by_library(processes, live);
        let reserved = counts_as_reserved(live, family, by_library);
        let Some(dev) = self.slot(live.device) else {
            return;
        };
        if reserved {
            let value = dev.reserved.current.saturating_sub(live.size);
            dev.reserved.set(t_ns, value);
        }
        if live.kind == EventKind::Create && !by_library {
            dev.vmm_release.add(live.size);
            dev.segment_freed(process, t_ns, live.size);
        } else if is_driver_allocation(live, family, by_library) {
            let libraries = &mut dev.libraries;
            let value = libraries.held.current.saturating_sub(live.size);
            libraries.held.set(t_ns, value);
            libraries.free.add(live.size);
            if !dev.after_failure {
                libraries.bursts.freed(process, t_ns, live.size);
            }
        } else {
            match family {
                Family::Runtime if live.addr != 0 => {
                    dev.free.add(live.size);
                    dev.segment_freed(process, t_ns, live.size);
                }
                Family::StreamOrdered => dev.async_free.add(live.size),
                _ => {}
            }
        }
    }
}

impl Observer for AllocatorView {
    fn step(&mut self, _state: &State, processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event {
                process,
                t_ns,
                event,
                effect,
            } => {
                let (process, t_ns) = (*process, *t_ns);
                match effect {
                    Effect::Added(live) => {
                        let family = self.families.of(processes, process, live.api);
                        let env = self.env(processes, process);
                        let by_library = self.by_library(processes, live);
                        let reserved = counts_as_reserved(live, family, by_library);
                        let Some(dev) = self.slot(live.device) else {
                            return;
                        };
                        dev.close_burst();
                        dev.after_failure = false;
                        dev.counts.env.no_caching |= env.no_caching;
                        dev.counts.env.cuda_malloc_async |= env.cuda_malloc_async;
                        dev.counts.env.expandable |= env.expandable;
                        if live.kind == EventKind::Create && !by_library {
                            dev.counts.vmm_creates += 1;
                            if live.size.is_multiple_of(2 * MIB) {
                                dev.counts.chunk_sized += 1;
                            }
                            dev.vmm_create.add(live.size);
                            dev.sizes.count(live.size);
                        } else {
                            match family {
                                _ if is_driver_allocation(live, family, by_library) => {
                                    let libraries = &mut dev.libraries;
                                    libraries.malloc.add(live.size);
                                    libraries.sizes.count(live.size);
                                    if is_segment_size(live.size) {
                                        libraries.segment_sized += 1;
                                    }
                                    let value = libraries.held.current.saturating_add(live.size);
                                    libraries.held.set(t_ns, value);
                                }
                                Family::Runtime if live.addr != 0 => {
                                    dev.counts.plain_allocs += 1;
                                    if is_segment_size(live.size) {
                                        dev.counts.segment_sized += 1;
                                    }
                                    dev.malloc.add(live.size);
                                    dev.sizes.count(live.size);
                                }
                                Family::StreamOrdered => {
                                    dev.counts.async_allocs += 1;
                                    dev.async_alloc.add(live.size);
                                }
                                _ => {}
                            }
                        }
                        if reserved {
                            let value = dev.reserved.current.saturating_add(live.size);
                            dev.reserved.set(t_ns, value);
                        }
                    }
                    Effect::Removed(live) => self.removed(processes, process, t_ns, live),
                    Effect::Failed => {
                        let family = self.families.of(processes, process, event.api);
                        let Some(dev) = self.slot(event.device) else {
                            return;
                        };
                        dev.close_burst();
                        dev.after_failure = true;
                        match family {
                            Family::Runtime => dev.malloc_failed.add(event.size),
                            Family::Driver => dev.libraries.failed.add(event.size),
                            _ => {}
                        }
                    }
                    Effect::Unmatched | Effect::None => {
                        if event.result != 0 {
                            return;
                        }
                        let vmm = matches!(event.kind, EventKind::Map | EventKind::Unmap)
                            && self.families.of(processes, process, event.api) == Family::Vmm;
                        match event.kind {
                            EventKind::Reserve => self.reservations.add(event.size),
                            // Not an IPC handle's mapping (cudaIpcOpenMemHandle): no VMM call.
                            EventKind::Map if vmm => {
                                if let Some(dev) = self.slot(event.device) {
                                    dev.vmm_maps += 1;
                                }
                            }
                            EventKind::Unmap if vmm => {
                                if let Some(dev) = self.slot(event.device) {
                                    dev.vmm_unmaps += 1;
                                }
                            }
                            EventKind::Trim => {
                                if let Some(dev) = self.slot(event.device) {
                                    dev.trims += 1;
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
            Step::MemInfo { t_ns, info, .. } => {
                if let Some(dev) = self.slot(info.device) {
                    let used = info.total.saturating_sub(info.free);
                    let outside = used
                        .saturating_sub(dev.reserved.current)
                        .saturating_sub(dev.libraries.held.current);
                    let o = dev.outside.get_or_insert_with(Outside::default);
                    o.samples += 1;
                    if o.samples == 1 || outside > o.max {
                        o.max = outside;
                        o.max_t_ns = *t_ns;
                    }
                    o.last = outside;
                    o.last_t_ns = *t_ns;
                    o.total = info.total;
                }
            }
            Step::Dump {
                process,
                t_ns,
                cleared,
            } => {
                for live in cleared.iter() {
                    self.removed(processes, *process, *t_ns, live);
                }
                for dev in &mut self.devices {
                    dev.bursts.current = None;
                    dev.libraries.bursts.current = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_sizes_are_recognised() {
        assert!(is_segment_size(2 * MIB));
        assert!(is_segment_size(20 * MIB));
        assert!(is_segment_size(10 * MIB));
        assert!(is_segment_size(24 * MIB));
        assert!(!is_segment_size(4 * MIB));
        assert!(!is_segment_size(3 * MIB));
        assert!(!is_segment_size(11 * MIB));
        assert!(!is_segment_size(MIB));
    }

    #[test]
    fn conf_pairs_keep_brackets() {
        assert_eq!(
            conf_pairs("backend:cudaMallocAsync, roundup_power2_divisions:[256:1,>:4]"),
            vec![
                ("backend".to_string(), "cudaMallocAsync".to_string()),
                (
                    "roundup_power2_divisions".to_string(),
                    "[256:1,>:4]".to_string()
                ),
            ]
        );
    }

    #[test]
    fn classification_follows_sizes_and_settings() {
        let mut c = PatternCounts {
            plain_allocs: 10,
            segment_sized: 10,
            ..PatternCounts::default()
        };
        assert_eq!(c.classify().0, Pattern::NativeCaching);
        c.segment_sized = 5;
        assert_eq!(c.classify().0, Pattern::PerBuffer);
        c.env.no_caching = true;
        c.segment_sized = 10;
        assert_eq!(c.classify().0, Pattern::PerBuffer);
        let c = PatternCounts {
            vmm_creates: 4,
            chunk_sized: 4,
            plain_allocs: 1,
            ..PatternCounts::default()
        };
        assert_eq!(c.classify().0, Pattern::ExpandableSegments);
        let c = PatternCounts {
            async_allocs: 4,
            plain_allocs: 1,
            ..PatternCounts::default()
        };
        assert_eq!(c.classify().0, Pattern::CudaMallocAsync);
        assert_eq!(PatternCounts::default().classify().0, Pattern::Unknown);
    }

    #[test]
    fn series_stays_bounded_and_keeps_maxima() {
        let mut s = Series::default();
        for i in 0..10_000u64 {
            s.record(i * 1_000_000, i);
        }
        let points = s.points();
        assert!(points.len() <= MAX_POINTS);
        assert_eq!(points.last().map(|p| p.1), Some(9_999));
        assert_eq!(points.iter().map(|p| p.1).max(), Some(9_999));
    }
}
