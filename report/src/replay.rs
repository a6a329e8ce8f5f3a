//! The replay engine: one streaming pass over one or more logs, in time order, keeping only
//! what is live (allocations by address or handle, bytes per device) and the definitions
//! reports need (stacks, modules, thread names). Analyses observe each step; they never see
//! the file.
//!
//! Several logs (one per process of a job) are merged in time order, so totals across
//! processes are exact at every moment. Times are nanoseconds since the earliest start.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::PathBuf;

use rustc_hash::FxHashMap;
use vramshim_format::{
    CodeDef, Damage, DamageKind, DumpBegin, Event, EventKind, Exit, Frame, Header, Item, LogReader,
    Mark, MemInfo, ModuleDef, Note, Record,
};

use crate::progress::Progress;
use crate::python::PyFrame;
use crate::{Failure, logfile};

mod live_map;
use live_map::LiveMap;

/// What a log told us about its process, besides the events.
pub struct Process {
    pub path: PathBuf,
    pub header: Header,
    /// Nanoseconds from the earliest process start of the replay to this one's start.
    pub start_offset_ns: u64,
    /// Native stacks by id, innermost frame first.
    pub stacks: StackTable,
    /// Python frames of the stacks that have them, by stack id, innermost first.
    pub python_stacks: FxHashMap<u32, Vec<PyFrame>>,
    /// Python code objects by id.
    pub codes: FxHashMap<u32, CodeDef>,
    pub modules: Vec<ModuleDef>,
    pub thread_names: FxHashMap<u32, String>,
    pub damage: Vec<Damage>,
    pub notes: Vec<Note>,
    /// Annotations the program wrote (`vramshim.mark`), in the order written; times since this
    /// process's start (add `start_offset_ns` for the replay's time).
    pub marks: Vec<Mark>,
    /// Events the recorder discarded (`VRAMSHIM_ON_FULL=drop`).
    pub dropped: u64,
    /// Flight-recorder dumps met (ring mode); each one restarts the live set.
    pub dumps: Vec<DumpBegin>,
    /// Frees of addresses that were never seen allocated (allocated before recording began,
    /// or lost to damage or dropping).
    pub unmatched_frees: u64,
    /// Frees (`cudaFree`, `cudaFreeAsync`...) of a CUDA graph's allocation made outside the
    /// graph, after a launch: the memory goes back to the device's graph pool, which keeps
    /// it (its level is recorded by the launches and trims), so they free nothing here.
    pub graph_frees_outside: u64,
    /// Time of the process's last timed record.
    pub end_ns: u64,
    pub events: u64,
    /// Tensor view: PyTorch blocks whose place in their segment the block model could not
    /// find (their size is then the rounded request, not the block's).
    pub unplaced_blocks: u64,
    /// Tensor view: PyTorch blocks handed out (`tensor_alloc` events met).
    pub tensor_allocs: u64,
    /// The log holds the recorder's exit record: the process ended normally.
    pub exited: bool,
}

impl Process {
    /// The API name of an event.
    pub fn api(&self, api: u16) -> std::borrow::Cow<'_, str> {
        self.header.api_name(api)
    }

    /// A thread's recorded name, or its id.
    pub fn thread_name(&self, thread: u32) -> String {
        self.thread_names
            .get(&thread)
            .cloned()
            .unwrap_or_else(|| thread.to_string())
    }

    /// Whether the process's PyTorch blocks came from its profiler report (PyTorch 2.1, whose
    /// allocator has no trace tracker; the recorder said so in a note before the first
    /// block): each block's size, never the bytes asked for; no stream; freed at the request;
    /// no `oom` entry of PyTorch's.
    pub fn tensors_reported_as_blocks(&self) -> bool {
        self.notes
            .iter()
            .any(|note| note.text.starts_with(REPORT_ROUTE_NOTE))
    }
}

/// How the recorder's note begins when it takes PyTorch's blocks from
/// `c10::reportMemoryUsageToProfiler` (`shim/src/torch_trace.rs`).
pub const REPORT_ROUTE_NOTE: &str = "torch: profiler report interposed";

/// The native stacks of one process by id, every frame in one flat vector: logs can define
/// millions of stacks, and a vector per stack would cost a heap block and its header each.
#[derive(Default)]
pub struct StackTable {
    /// Stack id → (index of its first frame in `frames`, frame count).
    index: FxHashMap<u32, (u64, u32)>,
    frames: Vec<u64>,
}

impl StackTable {
    /// The frames of stack `id`, innermost first; None for an id never defined.
    pub fn get(&self, id: &u32) -> Option<&[u64]> {
        let &(start, len) = self.index.get(id)?;
        let start = usize::try_from(start).ok()?;
        self.frames.get(start..start.checked_add(len as usize)?)
    }

    /// Starts defining a stack: push its frames, then [`NewStack::finish`] with its id.
    fn begin(&mut self) -> NewStack<'_> {
        let start = self.frames.len();
        NewStack { table: self, start }
    }
}

/// A stack being added to a [`StackTable`].
struct NewStack<'a> {
    table: &'a mut StackTable,
    start: usize,
}

impl NewStack<'_> {
    fn push(&mut self, ip: u64) {
        self.table.frames.push(ip);
    }

    /// Files the frames pushed under `id` (a redefinition replaces the earlier one).
    fn finish(self, id: u32) {
        let len = self.table.frames.len() - self.start;
        match u32::try_from(len) {
            Ok(len) => {
                self.table.index.insert(id, (self.start as u64, len));
            }
            // More frames than any decodable chunk holds: not kept.
            Err(_) => self.table.frames.truncate(self.start),
        }
    }
}

/// A live allocation (or VMM physical allocation, or PyTorch block in the tensor view).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    pub process: u32,
    /// `Alloc`, `Create`, `TensorAlloc` or `GraphPool` (the device's graph memory pool).
    pub kind: EventKind,
    pub api: u16,
    pub device: i32,
    pub addr: u64,
    pub handle: u64,
    /// Bytes held: a PyTorch block's size (its rounded request, or more when the allocator
    /// handed out a block without splitting it).
    pub size: u64,
    /// Bytes asked for: a PyTorch tensor's size; `size` for everything else.
    pub requested: u64,
    pub stack: u32,
    pub thread: u32,
    pub stream: u64,
    /// Replay time of the allocation.
    pub t_ns: u64,
    /// Sequence number of the allocating event.
    pub seq: u64,
}

/// Identity of a live object: same scheme as the recorder's flight mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    process: u32,
    /// 0: allocation by address (arrays: by handle with the top bit set); 1: VMM handle;
    /// 2: PyTorch block; 3: a device's graph pool (value: the device).
    class: u8,
    value: u64,
}

/// Live bytes of one device (or of pinned host memory, device = -1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceBytes {
    pub device: i32,
    pub live_bytes: u64,
    pub live_count: u64,
    /// Tensor view: the part of `live_bytes` that is PyTorch's blocks.
    pub tensor_bytes: u64,
    /// Tensor view: PyTorch's segments (not in `live_bytes`), as count and bytes.
    pub segment_count: u64,
    pub segment_bytes: u64,
}

/// Which memory a replay counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum View {
    /// What CUDA handed out: PyTorch's caching allocator counts as its segments.
    #[default]
    Driver,
    /// PyTorch's tensors (blocks) in place of its segments, for logs recorded with the
    /// allocator's tracker; everything else as in `Driver`. The segments are kept apart
    /// ([`State::segments`]).
    Tensors,
}

/// A segment of PyTorch's caching allocator (tensor view), and its blocks as the allocator
/// splits and merges them (default settings: 512-byte rounding, small requests ≤ 1 MiB split
/// off any remainder ≥ 512 B, large ones only a remainder > 1 MiB; in expandable segments
/// every remainder ≥ 512 B).
#[derive(Clone, Debug)]
pub struct Segment {
    /// The driver allocation; for an expandable segment, the mapped range (`size` grows and
    /// shrinks as PyTorch maps and unmaps its pages).
    pub live: Live,
    /// Block start → block.
    blocks: BTreeMap<u64, Block>,
    /// Part of an expandable segment (`expandable_segments:True`): mapped pages, not a
    /// `cudaMalloc`.
    expandable: bool,
}

/// A block of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub size: u64,
    pub state: BlockState,
    /// The bytes last asked for from this block, as PyTorch keeps them: a split's remainder
    /// keeps the split block's, a merged block the freed one's (0 for a new segment).
    pub requested: u64,
    /// The stack of the tensor that last took the block (0: none yet).
    pub stack: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    Allocated,
    /// Freed by the program, not yet reusable (used on other streams).
    Pending,
    Free,
}

/// What the current step did to PyTorch's segments (tensor view).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentChange {
    /// The allocator took a driver allocation as a segment.
    Added(Live),
    /// A segment went back to the driver.
    Removed(Live),
}

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;

impl Segment {
    fn new(live: Live) -> Segment {
        Segment {
            live,
            blocks: BTreeMap::from([(
                live.addr,
                Block {
                    size: live.size,
                    state: BlockState::Free,
                    requested: 0,
                    stack: 0,
                },
            )]),
            expandable: false,
        }
    }

    /// A range PyTorch mapped into one of its expandable segments: one free block.
    fn mapped(live: Live) -> Segment {
        Segment {
            expandable: true,
            ..Segment::new(live)
        }
    }

    fn end(&self) -> u64 {
        self.live.addr.saturating_add(self.live.size)
    }

    /// A `cudaMalloc`ed segment with no block in use: what `torch.cuda.empty_cache()` gives
    /// back whole (an expandable segment's pages are unmapped page by page instead).
    pub fn is_unused(&self) -> bool {
        !self.expandable
            && self
                .blocks
                .values()
                .all(|block| block.state == BlockState::Free)
    }

    /// Appends `next`, which starts where this segment ends; free blocks that meet merge.
    fn append(&mut self, next: Segment) {
        self.live.size = self.live.size.saturating_add(next.live.size);
        for (addr, block) in next.blocks {
            self.blocks.insert(addr, block);
            if block.state == BlockState::Free {
                self.merge_free_before(addr);
            }
        }
    }

    /// Merges the free block at `addr` into a free block ending there, if any.
    fn merge_free_before(&mut self, addr: u64) {
        let Some(&block) = self.blocks.get(&addr) else {
            return;
        };
        if block.state != BlockState::Free {
            return;
        }
        if let Some((&previous, &previous_block)) = self.blocks.range(..addr).next_back()
            && previous_block.state == BlockState::Free
            && previous.checked_add(previous_block.size) == Some(addr)
        {
            self.blocks.remove(&addr);
            self.blocks.insert(
                previous,
                Block {
                    size: previous_block.size.saturating_add(block.size),
                    ..previous_block
                },
            );
        }
    }

    /// Splits off the part of the segment from `at` on (`at` inside it), cutting a block
    /// that straddles `at`.
    fn split_off(&mut self, at: u64) -> Segment {
        if let Some((&start, &block)) = self.blocks.range(..at).next_back()
            && start.saturating_add(block.size) > at
        {
            self.blocks.insert(
                start,
                Block {
                    size: at - start,
                    ..block
                },
            );
            self.blocks.insert(
                at,
                Block {
                    size: start.saturating_add(block.size) - at,
                    ..block
                },
            );
        }
        let blocks = self.blocks.split_off(&at);
        let tail_size = self.end().saturating_sub(at);
        self.live.size = at.saturating_sub(self.live.addr);
        Segment {
            live: Live {
                addr: at,
                size: tail_size,
                ..self.live
            },
            blocks,
            expandable: self.expandable,
        }
    }

    /// The blocks as (address, block), by address; they tile the segment.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        self.blocks.iter().map(|(&addr, &block)| (addr, block))
    }

    /// The block handed out at `addr` for `requested` bytes (the allocating call's `stack`):
    /// its size, if the free block starting there can hold it.
    fn allocate(&mut self, addr: u64, requested: u64, stack: u32) -> Option<u64> {
        let rounded = rounded_request(requested);
        let &free = self.blocks.get(&addr)?;
        if free.state != BlockState::Free || free.size < rounded {
            return None;
        }
        let remaining = free.size - rounded;
        let split = if rounded <= SMALL_SIZE || self.expandable {
            remaining >= MIN_BLOCK
        } else {
            remaining > SMALL_SIZE
        };
        let size = if split { rounded } else { free.size };
        self.blocks.insert(
            addr,
            Block {
                size,
                state: BlockState::Allocated,
                requested,
                stack,
            },
        );
        if split {
            self.blocks.insert(
                addr.saturating_add(rounded),
                Block {
                    size: remaining,
                    ..free
                },
            );
        }
        Some(size)
    }

    fn free_requested(&mut self, addr: u64) {
        if let Some(block) = self.blocks.get_mut(&addr)
            && block.state == BlockState::Allocated
        {
            block.state = BlockState::Pending;
        }
    }

    /// The block at `addr` back in the pool, merged with free neighbours.
    fn free_completed(&mut self, addr: u64) {
        let Some(&freed) = self.blocks.get(&addr) else {
            return;
        };
        let mut size = freed.size;
        let mut start = addr;
        // Checked sums: a damaged or crafted log may hold blocks at the top of the range.
        if let Some(after) = addr.checked_add(1)
            && let Some((&next, &next_block)) = self.blocks.range(after..).next()
            && next_block.state == BlockState::Free
            && addr.checked_add(size) == Some(next)
        {
            self.blocks.remove(&next);
            size = size.saturating_add(next_block.size);
        }
        if let Some((&previous, &previous_block)) = self.blocks.range(..addr).next_back()
            && previous_block.state == BlockState::Free
            && previous.checked_add(previous_block.size) == Some(addr)
        {
            self.blocks.remove(&addr);
            start = previous;
            size = size.saturating_add(previous_block.size);
        }
        self.blocks.insert(
            start,
            Block {
                size,
                state: BlockState::Free,
                ..freed
            },
        );
    }
}

/// PyTorch's `round_size` with default settings.
pub fn rounded_request(requested: u64) -> u64 {
    requested
        .max(1)
        .div_ceil(MIN_BLOCK)
        .saturating_mul(MIN_BLOCK)
}

/// Everything live at the current step.
#[derive(Default)]
pub struct State {
    live: LiveMap,
    view: View,
    /// Tensor view: PyTorch's segments, by (process, address).
    segments: BTreeMap<(u32, u64), Segment>,
    /// Tensor view: each process's mapped VMM ranges, by (process, address): (size, handle).
    vmm_maps: BTreeMap<(u32, u64), (u64, u64)>,
    /// Tensor view: physical allocations (process, handle) PyTorch mapped into its
    /// expandable segments: the segments count them, and their release ends nothing live.
    segment_handles: HashSet<(u32, u64)>,
    /// Addresses of CUDA graph allocations (process, address), from `graph_alloc` events: fixed
    /// for the node's life, reused at each launch.
    graph_addresses: HashSet<(u32, u64)>,
    /// Per device, summed over processes; few devices, so a vector beats a map.
    devices: Vec<DeviceBytes>,
    /// Per (process, device).
    process_devices: Vec<(u32, DeviceBytes)>,
    /// Indexes in `devices` and `process_devices` of the last entries accounted (hints:
    /// checked before use).
    last_device: usize,
    last_process_device: usize,
    /// Index of the current step among events (0-based), across all logs.
    pub seq: u64,
    /// What the current step's [`Effect::Added`] replaced, if anything.
    replaced: Option<Live>,
    /// Tensor view: what the current step did to PyTorch's segments, if anything.
    segment_change: Option<SegmentChange>,
    /// Tensor view: driver allocations held back until the next events say whether they are
    /// a segment, summed per device (device, bytes); the driver handed them out either way.
    held: Vec<(i32, u64)>,
}

impl State {
    /// Live bytes per device (host pinned as device -1), sorted by device.
    pub fn devices(&self) -> &[DeviceBytes] {
        &self.devices
    }

    /// The totals of `device`, if it was met (the device last accounted tried first).
    #[inline]
    pub fn device_totals(&self, device: i32) -> Option<&DeviceBytes> {
        match self.devices.get(self.last_device) {
            Some(entry) if entry.device == device => Some(entry),
            _ => self.devices.iter().find(|d| d.device == device),
        }
    }

    /// Live bytes of `device` over all processes.
    pub fn device_bytes(&self, device: i32) -> u64 {
        self.device_totals(device).map_or(0, |d| d.live_bytes)
    }

    /// Live bytes of `device` in one process.
    pub fn process_device_bytes(&self, process: u32, device: i32) -> u64 {
        let matches = |(p, d): &&(u32, DeviceBytes)| *p == process && d.device == device;
        match self.process_devices.get(self.last_process_device) {
            Some(entry) if matches(&entry) => entry.1.live_bytes,
            _ => self
                .process_devices
                .iter()
                .find(matches)
                .map_or(0, |(_, d)| d.live_bytes),
        }
    }

    /// Every live object, in no particular order.
    pub fn live(&self) -> impl Iterator<Item = &Live> {
        self.live.values()
    }

    /// Tensor view: PyTorch's segments on `device` now, as (count, bytes).
    pub fn segment_totals(&self, device: i32) -> (u64, u64) {
        self.device_totals(device)
            .map_or((0, 0), |d| (d.segment_count, d.segment_bytes))
    }

    /// What the driver handed out on `device` now: in the tensor view PyTorch's segments in
    /// place of its blocks (the driver view's live bytes), else the live bytes.
    pub fn reserved_bytes(&self, device: i32) -> u64 {
        self.device_totals(device)
            .map_or(0, |d| {
                d.live_bytes
                    .saturating_sub(d.tensor_bytes)
                    .saturating_add(d.segment_bytes)
            })
            .saturating_add(
                self.held
                    .iter()
                    .filter(|(held, _)| *held == device)
                    .map(|(_, size)| size)
                    .sum(),
            )
    }

    /// Tensor view: notes the driver allocations now held back (`cudaMalloc`, `cuMemCreate`;
    /// a mapping takes no memory of its own).
    fn set_held<'a>(&mut self, held: impl Iterator<Item = &'a Held>) {
        self.held.clear();
        for h in held {
            if !matches!(h.event.kind, EventKind::Alloc | EventKind::Create) {
                continue;
            }
            match self
                .held
                .iter_mut()
                .find(|(device, _)| *device == h.event.device)
            {
                Some((_, bytes)) => *bytes = bytes.saturating_add(h.event.size),
                None => self.held.push((h.event.device, h.event.size)),
            }
        }
    }

    /// Tensor view: recounts `device`'s segments after an expandable segment grew, joined,
    /// shrank or split (rare next to block events: a scan is cheap enough).
    fn recount_segments(&mut self, device: i32) {
        let (count, bytes) = self
            .segments
            .values()
            .filter(|segment| segment.live.device == device)
            .fold((0u64, 0u64), |(count, bytes), segment| {
                (count + 1, bytes.saturating_add(segment.live.size))
            });
        let entry = self.device_entry(device);
        entry.segment_count = count;
        entry.segment_bytes = bytes;
    }

    /// Tensor view: PyTorch's segments now (of every process and device), by process and
    /// address.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }

    /// Tensor view: the segment of `process` that holds `addr`, if any.
    pub fn segment_holding(&self, process: u32, addr: u64) -> Option<&Segment> {
        let (_, segment) = self
            .segments
            .range((process, 0)..=(process, addr))
            .next_back()?;
        (addr < segment.end()).then_some(segment)
    }

    /// Tensor view: what the current step did to PyTorch's segments; None at other steps.
    pub fn segment_change(&self) -> Option<SegmentChange> {
        self.segment_change
    }

    /// [`State::segment_change`] where it lies, for observers of every step (no copy).
    #[inline]
    pub fn segment_change_ref(&self) -> Option<&SegmentChange> {
        self.segment_change.as_ref()
    }

    /// Tensor view: files `live` as a segment.
    fn add_segment(&mut self, live: Live) {
        if let Some(old) = self
            .segments
            .insert((live.process, live.addr), Segment::new(live))
        {
            self.count_segment(&old.live, false);
        }
        self.count_segment(&live, true);
        self.segment_change = Some(SegmentChange::Added(live));
    }

    /// Tensor view: the segment of `process` at `addr` goes back to the driver.
    fn remove_segment(&mut self, process: u32, addr: u64) -> Option<Live> {
        let segment = self.segments.remove(&(process, addr))?;
        self.count_segment(&segment.live, false);
        self.segment_change = Some(SegmentChange::Removed(segment.live));
        Some(segment.live)
    }

    fn count_segment(&mut self, live: &Live, add: bool) {
        let entry = self.device_entry(live.device);
        if add {
            entry.segment_count += 1;
            entry.segment_bytes = entry.segment_bytes.saturating_add(live.size);
        } else {
            entry.segment_count = entry.segment_count.saturating_sub(1);
            entry.segment_bytes = entry.segment_bytes.saturating_sub(live.size);
        }
    }

    /// The totals of `device`, created on first use.
    #[inline]
    fn device_entry(&mut self, device: i32) -> &mut DeviceBytes {
        let index = match self.devices.iter().position(|d| d.device == device) {
            Some(index) => index,
            None => self.add_device(device),
        };
        &mut self.devices[index]
    }

    /// Files a device first met; returns its index. (Apart, so that every event's lookup
    /// above stays small enough to inline.)
    #[cold]
    fn add_device(&mut self, device: i32) -> usize {
        self.devices.push(DeviceBytes {
            device,
            ..DeviceBytes::default()
        });
        self.devices.sort_by_key(|d| d.device);
        self.devices
            .iter()
            .position(|d| d.device == device)
            .unwrap_or(0)
    }

    /// Tensor view: the segment of `process` holding `addr`.
    fn segment_mut(&mut self, process: u32, addr: u64) -> Option<&mut Segment> {
        let (_, segment) = self
            .segments
            .range_mut((process, 0)..=(process, addr))
            .next_back()?;
        (addr < segment.live.addr.saturating_add(segment.live.size)).then_some(segment)
    }

    /// Tensor view: PyTorch mapped `segment`'s range into an expandable segment. The range
    /// joins the process's segments (continuing those it touches); the physical allocations
    /// mapped there become the segment's. Returns those that were live until now.
    fn map_segment(&mut self, segment: Segment) -> Vec<Live> {
        let (process, addr, end) = (segment.live.process, segment.live.addr, segment.end());
        let handles: Vec<u64> = self
            .vmm_maps
            .range((process, addr)..(process, end))
            .map(|(_, &(_, handle))| handle)
            .collect();
        let mut ended = Vec::new();
        for handle in handles {
            if self.segment_handles.insert((process, handle))
                && let Some(live) = self.remove(&Key {
                    process,
                    class: 1,
                    value: handle,
                })
            {
                ended.push(live);
            }
        }
        let device = segment.live.device;
        let continues = |other: &Segment| other.expandable && other.live.device == device;
        let start = match self.segments.range_mut(..(process, addr)).next_back() {
            Some((&key, previous))
                if key.0 == process && previous.end() == addr && continues(previous) =>
            {
                previous.append(segment);
                key
            }
            _ => {
                self.segments.insert((process, addr), segment);
                (process, addr)
            }
        };
        if self.segments.get(&(process, end)).is_some_and(continues)
            && let Some(next) = self.segments.remove(&(process, end))
            && let Some(joined) = self.segments.get_mut(&start)
        {
            joined.append(next);
        }
        self.recount_segments(device);
        ended
    }

    /// Tensor view: PyTorch unmapped `addr..addr+size` of its expandable segments on
    /// `device`.
    fn unmap_segment(&mut self, process: u32, device: i32, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        while let Some((&key, segment)) = self.segments.range(..(process, end)).next_back()
            && key.0 == process
            && segment.expandable
            && segment.end() > addr
        {
            let Some(mut segment) = self.segments.remove(&key) else {
                break;
            };
            let mut cut = if addr > segment.live.addr {
                let cut = segment.split_off(addr);
                self.segments.insert(key, segment);
                cut
            } else {
                segment
            };
            if end < cut.end() {
                let rest = cut.split_off(end);
                self.segments.insert((process, end), rest);
            }
        }
        self.recount_segments(device);
    }

    /// The live object that the current step's [`Effect::Added`] ended: the same address
    /// allocated twice without a free in between (the free was lost). None at other steps.
    pub fn replaced(&self) -> Option<&Live> {
        self.replaced.as_ref()
    }

    #[inline(always)]
    fn add(&mut self, key: Key, live: Live) {
        // (`replaced` written whole only when something was: a `Live` is large.)
        self.replaced = None;
        if let Some(old) = self.live.insert(key, live) {
            // The same address allocated twice without a free in between: the free was lost
            // (damage, dropping). The newer allocation replaces the older one.
            self.account(&old, false);
            self.replaced = Some(old);
        }
        self.account(&live, true);
    }

    #[inline(always)]
    fn remove(&mut self, key: &Key) -> Option<Live> {
        self.remove_with(key, |live| *live)
    }

    /// Ends `key`'s object, if it is there, as `made` makes it from the object (see
    /// [`LiveMap::remove_with`]).
    #[inline(always)]
    fn remove_with<T>(&mut self, key: &Key, made: impl FnOnce(&Live) -> T) -> Option<T> {
        // Accounted from the fields it needs (a `Live` is large: copies show in the replay's
        // profile).
        let (removed, process, device, size, kind) = self.live.remove_with(key, |live| {
            (made(live), live.process, live.device, live.size, live.kind)
        })?;
        self.account_parts(process, device, size, kind, false);
        Some(removed)
    }

    /// Ends every live object of `process`; returns them.
    fn clear_process(&mut self, process: u32) -> Vec<Live> {
        let keys: Vec<Key> = self
            .live
            .keys()
            .filter(|key| key.process == process)
            .copied()
            .collect();
        keys.iter().filter_map(|key| self.remove(key)).collect()
    }

    // Always inlined: called for every allocation and free, its call overhead showed in the
    // replay's profile.
    #[inline(always)]
    fn account(&mut self, live: &Live, add: bool) {
        self.account_parts(live.process, live.device, live.size, live.kind, add);
    }

    /// [`State::account`] of a live object of `process`, `device`, `size` bytes and `kind`.
    #[inline(always)]
    fn account_parts(&mut self, process: u32, device: i32, size: u64, kind: EventKind, add: bool) {
        fn apply(entry: &mut DeviceBytes, size: u64, add: bool) {
            if add {
                entry.live_bytes = entry.live_bytes.saturating_add(size);
                entry.live_count += 1;
            } else {
                entry.live_bytes = entry.live_bytes.saturating_sub(size);
                entry.live_count = entry.live_count.saturating_sub(1);
            }
        }
        // Most events name the device and process the last one named: try those first.
        let entry = match self.devices.get_mut(self.last_device) {
            Some(entry) if entry.device == device => entry,
            _ => {
                let index = match self.devices.iter().position(|d| d.device == device) {
                    Some(index) => index,
                    None => self.add_device(device),
                };
                self.last_device = index;
                &mut self.devices[index]
            }
        };
        apply(entry, size, add);
        if kind == EventKind::TensorAlloc {
            entry.tensor_bytes = if add {
                entry.tensor_bytes.saturating_add(size)
            } else {
                entry.tensor_bytes.saturating_sub(size)
            };
        }
        let index = match self.process_devices.get(self.last_process_device) {
            Some((p, d)) if *p == process && d.device == device => self.last_process_device,
            _ => {
                let index = match self
                    .process_devices
                    .iter()
                    .position(|(p, d)| *p == process && d.device == device)
                {
                    Some(index) => index,
                    None => self.add_process_device(process, device),
                };
                self.last_process_device = index;
                index
            }
        };
        apply(&mut self.process_devices[index].1, size, add);
    }

    #[cold]
    fn add_process_device(&mut self, process: u32, device: i32) -> usize {
        self.process_devices.push((
            process,
            DeviceBytes {
                device,
                ..DeviceBytes::default()
            },
        ));
        self.process_devices.len() - 1
    }
}

#[cfg(test)]
impl State {
    /// A state at a step whose allocation replaced `old` (whose free was lost).
    pub fn replacing(old: Live) -> State {
        State {
            replaced: Some(old),
            ..State::default()
        }
    }
}

/// What one event did to the live state.
#[derive(Clone, Copy, Debug)]
pub enum Effect {
    /// A new live object (already in the state).
    Added(Live),
    /// A live object ended (already gone from the state).
    Removed(Live),
    /// An allocating call failed.
    Failed,
    /// A free of something never seen allocated.
    Unmatched,
    /// Nothing live changed: map/unmap, reserve/unreserve, trims, failed frees, `free(NULL)`.
    None,
}

/// One step of the replay, as analyses see it.
pub enum Step<'a> {
    Event {
        process: u32,
        /// Replay time (ns since the earliest start).
        t_ns: u64,
        event: &'a Event,
        /// Borrowed, not copied: the live object it holds is a record of ~90 bytes.
        effect: &'a Effect,
    },
    MemInfo {
        process: u32,
        t_ns: u64,
        info: &'a MemInfo,
    },
    /// A ring-mode dump begins (details in `Process::dumps`): the process's live set was
    /// cleared (`cleared`) and is rebuilt from the dump's own records.
    Dump {
        process: u32,
        t_ns: u64,
        cleared: &'a [Live],
    },
}

/// An analysis fed by the replay.
pub trait Observer {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>);
}

/// The analyses one replay feeds, each shown every step in order: a slice of observers
/// (called through `dyn`), or a pair of known types, which [`run_view_with`] compiles into the
/// replay loop (no call per observer and step: the overview's hot path).
pub trait Observers {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>);
}

impl Observers for [&mut dyn Observer] {
    #[inline]
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        for observer in self.iter_mut() {
            observer.step(state, processes, step);
        }
    }
}

impl<A: Observer, B: Observer> Observers for (&mut A, &mut B) {
    #[inline(always)]
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        self.0.step(state, processes, step);
        self.1.step(state, processes, step);
    }
}

/// Where a replay stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Read every log to its end.
    End,
    /// Stop right after the event with this sequence number.
    AfterSeq(u64),
    /// Stop before the first event later than this replay time.
    AfterTime(u64),
}

/// The result of a replay: what each process defined, and the state where it stopped.
pub struct Replay {
    pub processes: Vec<Process>,
    pub state: State,
    /// Replay time of the last step taken.
    pub end_ns: u64,
    /// Whether every log was read to its end (not stopped early by a [`Stop`]).
    pub complete: bool,
    /// Devices that events or memory samples named, up to where the replay stopped.
    pub devices: std::collections::BTreeSet<i32>,
}

/// How the end of a recording is named: "exit" when every log holds its process's exit
/// record (a normal exit) and was read to its end, else "end of log": a process killed,
/// ended by `_exit` or exec, a log cut short, or a log of a recorder older than the record.
pub fn end_name(processes: &[Process]) -> &'static str {
    let cut = processes.iter().any(|process| {
        !process.exited
            || process.damage.iter().any(|damage| {
                matches!(
                    damage.kind,
                    DamageKind::TornTail { .. } | DamageKind::Io { .. }
                )
            })
    });
    if cut { "end of log" } else { "exit" }
}

impl Replay {
    /// A warning when `device` was asked for but no event or memory sample of the logs (as
    /// far as the replay read) names it.
    pub fn device_warning(&self, device: Option<i32>) -> Option<String> {
        let device = device?;
        if !self.complete || self.devices.contains(&device) {
            return None;
        }
        let seen: Vec<String> = self.devices.iter().map(i32::to_string).collect();
        let logs = match self.processes.as_slice() {
            [one] => one.path.display().to_string(),
            _ => "the logs".to_string(),
        };
        Some(match seen.len() {
            0 => format!("--device {device}: {logs} has no device events at all"),
            1 => format!(
                "--device {device}: nothing in {logs} is on device {device}; its only device is {}",
                seen[0]
            ),
            _ => format!(
                "--device {device}: nothing in {logs} is on device {device}; its devices are {}",
                seen.join(", ")
            ),
        })
    }

    /// Warnings for the user: damage met, dropped events, several ring-mode dumps.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for process in &self.processes {
            let name = process.path.display();
            for damage in &process.damage {
                out.push(format!("{name}: {damage}"));
            }
            if process.dropped > 0 {
                out.push(format!(
                    "{name}: the recorder dropped {} events (VRAMSHIM_ON_FULL=drop); figures are lower bounds",
                    process.dropped
                ));
            }
            if process.unplaced_blocks > 0 {
                out.push(format!(
                    "{name}: {} PyTorch blocks did not fit the allocator model (non-default PYTORCH_CUDA_ALLOC_CONF?); their sizes are rounded requests",
                    process.unplaced_blocks
                ));
            }
            if process.dumps.len() > 1 {
                out.push(format!(
                    "{name}: ring-mode log with {} dumps; each restarts the live set",
                    process.dumps.len()
                ));
            }
        }
        out
    }
}

/// Logs opened for a replay.
struct Input {
    reader: LogReader<File>,
    /// The next timed record, read ahead for merging, when `pending` (decoded in place: the
    /// reader's events are never copied on the way).
    record: Record,
    pending: bool,
    finished: bool,
    size_bytes: u64,
}

/// Replays `paths` merged in time order, feeding `observers`, until `stop`, counting what
/// the driver handed out.
pub fn run(
    paths: &[PathBuf],
    observers: &mut [&mut dyn Observer],
    stop: Stop,
) -> Result<Replay, Failure> {
    run_view(paths, observers, stop, View::Driver)
}

/// Whether the log at `path` holds PyTorch's tensors (its allocator's tracker recorded a
/// block); reads until the first one.
pub fn has_tensors(path: &std::path::Path) -> Result<bool, Failure> {
    let mut reader = logfile::open(path)?;
    for item in reader.by_ref() {
        if let Item::Record(Record::Event(event)) = item
            && matches!(
                event.kind,
                EventKind::TensorAlloc | EventKind::TensorSegment
            )
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A driver allocation held back one step in the tensor view: it may be a PyTorch segment,
/// which the allocator's `tensor_segment` event right after says.
struct Held {
    index: usize,
    t_ns: u64,
    event: Event,
}

/// Like [`run`], counting what `view` says.
pub fn run_view(
    paths: &[PathBuf],
    observers: &mut [&mut dyn Observer],
    stop: Stop,
    view: View,
) -> Result<Replay, Failure> {
    run_view_with(paths, observers, stop, view)
}

/// Like [`run_view`], for any set of observers.
pub fn run_view_with<O: Observers + ?Sized>(
    paths: &[PathBuf],
    observers: &mut O,
    stop: Stop,
    view: View,
) -> Result<Replay, Failure> {
    let mut inputs = Vec::with_capacity(paths.len());
    let mut processes = Vec::with_capacity(paths.len());
    for path in paths {
        // Opened once: the reader has its own 1 MiB buffer.
        let reader = logfile::open(path)?;
        let size_bytes = std::fs::metadata(path).map_or(0, |m| m.len());
        processes.push(Process {
            path: path.clone(),
            header: reader.header().clone(),
            start_offset_ns: 0,
            stacks: StackTable::default(),
            python_stacks: FxHashMap::default(),
            codes: FxHashMap::default(),
            modules: Vec::new(),
            thread_names: FxHashMap::default(),
            damage: Vec::new(),
            notes: Vec::new(),
            marks: Vec::new(),
            exited: false,
            dropped: 0,
            dumps: Vec::new(),
            unmatched_frees: 0,
            graph_frees_outside: 0,
            end_ns: 0,
            events: 0,
            unplaced_blocks: 0,
            tensor_allocs: 0,
        });
        inputs.push(Input {
            reader,
            record: Record::Exit(Exit::default()),
            pending: false,
            finished: false,
            size_bytes,
        });
    }
    let starts = start_times(&processes);
    let earliest = starts.iter().copied().min().unwrap_or(0);
    for (process, start) in processes.iter_mut().zip(starts) {
        process.start_offset_ns = start - earliest;
    }

    let mut state = State {
        view,
        ..State::default()
    };
    // Tensor view: driver events held back while they may be PyTorch's new segment, which
    // the allocator's word right after them on the same thread says: one hold per thread
    // (other threads' events, on other devices above all, may come between).
    let mut holds: Vec<Vec<Held>> = Vec::new();
    // Emptied holds, kept so that holding a `cudaMalloc` allocates nothing.
    let mut spare: Vec<Vec<Held>> = Vec::new();
    // The usual hold kept apart from `holds` (which is then empty): one `cudaMalloc`.
    let mut single: Option<Held> = None;
    // Per input: the index of `cudaMalloc` among its API names, if it has one.
    let malloc_apis: Vec<Option<u16>> = processes
        .iter()
        .map(|process| {
            let at = process
                .header
                .apis
                .iter()
                .position(|name| name == "cudaMalloc")?;
            u16::try_from(at).ok()
        })
        .collect();
    let mut last_device: Option<i32> = None;
    let mut progress = Progress::new("replaying", inputs.iter().map(|i| i.size_bytes).sum());
    let mut end_ns = 0u64;
    let mut steps = 0u64;
    let mut complete = false;
    let mut devices = std::collections::BTreeSet::new();
    // The input whose lookahead the last step used where it lay (not moved out): read anew.
    let mut used: Option<usize> = None;
    loop {
        // The input whose next record is earliest, after the lookahead is refilled
        // (definitions are absorbed as they are read). One log, the usual case, has nothing to
        // merge: its record is read and taken at once.
        let best = if let ([input], [only]) = (inputs.as_mut_slice(), processes.as_mut_slice()) {
            if used.take().is_some() {
                input.pending = false;
            }
            if !input.pending && !input.finished {
                input.pending = if stop == Stop::End && single.is_none() && holds.is_empty() {
                    // The usual run of events, stepped in a loop of its own until a record
                    // that needs this one.
                    step_plain_run(
                        input,
                        std::slice::from_mut(only),
                        &mut state,
                        observers,
                        malloc_apis[0],
                        &mut Run {
                            devices: &mut devices,
                            last_device: &mut last_device,
                            end_ns: &mut end_ns,
                            steps: &mut steps,
                            progress: &mut progress,
                        },
                    )
                } else {
                    next_timed(input, only)
                };
            }
            input.pending.then(|| (0, pending_time(input, only)))
        } else {
            if let Some(used) = used.take() {
                inputs[used].pending = false;
            }
            for (index, input) in inputs.iter_mut().enumerate() {
                if !input.pending && !input.finished {
                    input.pending = next_timed(input, &mut processes[index]);
                }
            }
            earliest_pending(&inputs, &processes)
        };
        let Some((index, t_ns)) = best else {
            complete = true;
            break;
        };
        let record = &inputs[index].record;
        used = Some(index);
        let process = index as u32;
        state.replaced = None;
        if let Record::Event(event) = &record {
            if let Stop::AfterTime(limit) = stop
                && t_ns > limit
            {
                break;
            }
            // Most events name the device the last one named: skip the set then.
            if last_device != Some(event.device) {
                devices.insert(event.device);
                last_device = Some(event.device);
            }
            // Copied into a hold only when one takes it (most events step straight through).
            let held_now = || Held {
                index,
                t_ns,
                event: *event,
            };
            // The one held `cudaMalloc` (the usual hold) decided at once, as the general
            // rules below would: stepped out before this event, taken as the segment this
            // event names, or, when still undecided, handed to the general holds.
            if let Some(held) = &single {
                let own = held.index == index && held.event.thread == event.thread;
                if own && is_own_segment(std::slice::from_ref(held), index, event) {
                    take_segment(&mut state, held);
                    state.held.clear();
                    single = None;
                } else if own
                    || ends_hold(&processes, std::slice::from_ref(held), index, t_ns, event)
                {
                    state.held.clear();
                    let seqs = step_event(
                        &mut state,
                        &mut processes,
                        observers,
                        held.index,
                        held.t_ns,
                        &held.event,
                    );
                    end_ns = end_ns.max(held.t_ns);
                    single = None;
                    if stops(stop, &seqs) {
                        break;
                    }
                } else {
                    let mut hold = spare.pop().unwrap_or_default();
                    hold.extend(single.take());
                    holds.push(hold);
                }
            }
            // Another thread's event ends a hold (its events are stepped first, as they came)
            // when the hold cannot be a segment still to be named: its thread said nothing for
            // HOLD_NS; or its process has no PyTorch tracker (a program without PyTorch: steps
            // then stay in time order, as every observer expects); or the event is on the
            // hold's device in its process (PyTorch names a segment under the device's
            // allocator lock, so no other thread of its allocates there in between: in the
            // no-caching mode, where PyTorch names none, the autograd thread's first call
            // ends the main thread's hold); or it touches the held memory. The hold's own
            // thread decides below, however long it took.
            let mut stopped = false;
            while let Some(stale) = holds
                .iter()
                .position(|hold| ends_hold(&processes, hold, index, t_ns, event))
            {
                stopped = step_hold_out(
                    &mut holds,
                    stale,
                    &mut spare,
                    &mut state,
                    &mut processes,
                    observers,
                    stop,
                    &mut end_ns,
                );
                if stopped {
                    break;
                }
            }
            if stopped {
                break;
            }
            if let Some(own) = holds
                .iter()
                .position(|hold| hold[0].index == index && hold[0].event.thread == event.thread)
            {
                // The usual case, stepped without copies: one held `cudaMalloc` that this
                // event does not name as PyTorch's segment (only a physical allocation's hold
                // grows or is mapped) steps as it came, before this event.
                if let [held] = holds[own].as_slice()
                    && held.event.kind == EventKind::Alloc
                    && !is_own_segment(&holds[own], index, event)
                {
                    let stopped = step_hold_out(
                        &mut holds,
                        own,
                        &mut spare,
                        &mut state,
                        &mut processes,
                        observers,
                        stop,
                        &mut end_ns,
                    );
                    if stopped {
                        break;
                    }
                } else {
                    let current = held_now();
                    if extends_hold(&holds[own], &current) {
                        holds[own].push(current);
                        state.set_held(holds.iter().flatten());
                        continue;
                    }
                    let mut hold = holds.swap_remove(own);
                    let mut to_step = std::mem::take(&mut hold);
                    if is_own_segment(&to_step, index, event) {
                        take_segment(&mut state, &to_step[0]);
                        to_step.clear();
                    } else if is_own_mapping(&to_step, &current) {
                        hold = to_step;
                        to_step = take_mapping(&mut state, &mut hold, &current);
                    }
                    state.set_held(holds.iter().flatten());
                    let stopped = step_all(
                        &mut state,
                        &mut processes,
                        observers,
                        stop,
                        &to_step,
                        &mut end_ns,
                    );
                    for mut emptied in [hold, to_step] {
                        if emptied.capacity() > 0 {
                            emptied.clear();
                            spare.push(emptied);
                        }
                    }
                    if stopped {
                        break;
                    }
                }
            }
            if view == View::Tensors && may_be_segment(&malloc_apis[index], event) {
                if holds.is_empty() && event.kind == EventKind::Alloc {
                    single = Some(held_now());
                    state.held.clear();
                    state.held.push((event.device, event.size));
                    continue;
                }
                let mut hold = spare.pop().unwrap_or_default();
                hold.push(held_now());
                holds.push(hold);
                state.set_held(holds.iter().flatten());
                continue;
            }
            let seqs = step_event(&mut state, &mut processes, observers, index, t_ns, event);
            end_ns = end_ns.max(t_ns);
            if stops(stop, &seqs) {
                break;
            }
        } else {
            // A dump restarts the live set: what came before it goes first. (Memory samples
            // and notes may come between a segment's allocation and PyTorch's word on it.)
            if matches!(record, Record::DumpBegin(_)) {
                holds.extend(single.take().map(|held| vec![held]));
                let before_dump = std::mem::take(&mut holds);
                state.set_held(holds.iter().flatten());
                for before in before_dump.iter().flatten() {
                    step_event(
                        &mut state,
                        &mut processes,
                        observers,
                        before.index,
                        before.t_ns,
                        &before.event,
                    );
                }
            }
            match &record {
                Record::MemInfo(info) => {
                    devices.insert(info.device);
                    let step = Step::MemInfo {
                        process,
                        t_ns,
                        info,
                    };
                    observers.step(&state, &processes, &step);
                }
                Record::DumpBegin(begin) => {
                    let cleared = state.clear_process(process);
                    processes[index].dumps.push(begin.clone());
                    let step = Step::Dump {
                        process,
                        t_ns,
                        cleared: &cleared,
                    };
                    observers.step(&state, &processes, &step);
                }
                Record::Note(note) => processes[index].notes.push(note.clone()),
                Record::Dropped(dropped) => {
                    processes[index].dropped =
                        processes[index].dropped.saturating_add(dropped.count);
                }
                _ => {}
            }
            end_ns = end_ns.max(t_ns);
        }
        steps += 1;
        if steps & 0xffff == 0 {
            progress.update(inputs.iter().map(|i| i.reader.offset()).sum());
        }
    }
    holds.extend(single.take().map(|held| vec![held]));
    let after_end = std::mem::take(&mut holds);
    state.set_held(holds.iter().flatten());
    for hold in &after_end {
        if step_all(
            &mut state,
            &mut processes,
            observers,
            stop,
            hold,
            &mut end_ns,
        ) {
            break;
        }
    }
    progress.finish();
    Ok(Replay {
        processes,
        state,
        end_ns,
        complete,
        devices,
    })
}

/// The replay loop's own counters, lent to [`step_plain_run`].
struct Run<'a> {
    devices: &'a mut std::collections::BTreeSet<i32>,
    last_device: &'a mut Option<i32>,
    end_ns: &'a mut u64,
    steps: &'a mut u64,
    progress: &'a mut Progress,
}

/// One log replayed to its end with nothing held back: reads and steps its events exactly as
/// the replay loop would, in a loop of its own (a small function whose state stays in
/// registers), until the log ends (false) or a record the replay loop must take comes
/// (true: that record in `input.record`, nothing done with it): anything but an event, or an
/// event the tensor view holds back. A `cudaMalloc` the tensor view would hold is stepped at once when the next
/// record is an event of the same thread that does not name it as PyTorch's segment (that
/// event would step it before itself, as it came; nothing else can come between).
#[inline(never)]
fn step_plain_run<O: Observers + ?Sized>(
    input: &mut Input,
    processes: &mut [Process],
    state: &mut State,
    observers: &mut O,
    malloc_api: Option<u16>,
    run: &mut Run<'_>,
) -> bool {
    loop {
        let Some(process) = processes.first_mut() else {
            return false;
        };
        // The usual record, a repeat, stepped from where the reader keeps its event (not
        // copied; the reader has every slot it gives); anything else read as the replay loop
        // reads it.
        let repeated = input.reader.next_repeat();
        let event = match repeated.and_then(|slot| input.reader.repeated(slot)) {
            Some(event) => event,
            None => {
                if !next_timed(input, process) {
                    return false;
                }
                let Record::Event(event) = &input.record else {
                    return true;
                };
                event
            }
        };
        let t_ns = process.start_offset_ns.saturating_add(event.t_ns);
        if *run.last_device != Some(event.device) {
            run.devices.insert(event.device);
            *run.last_device = Some(event.device);
        }
        if state.view == View::Tensors
            && may_be_segment(&malloc_api, event)
            && !(event.kind == EventKind::Alloc
                && input
                    .reader
                    .peek_repeat()
                    .is_some_and(|next| next.thread == event.thread && !names_segment(event, next)))
        {
            // Left for the replay loop where it reads its records.
            let held = *event;
            input.record = Record::Event(held);
            return true;
        }
        state.replaced = None;
        step_event(state, processes, observers, 0, t_ns, event);
        *run.end_ns = (*run.end_ns).max(t_ns);
        *run.steps += 1;
        if *run.steps & 0xffff == 0 {
            run.progress.update(input.reader.offset());
        }
    }
}

/// The replay time of `input`'s pending record (its process's start offset added).
#[inline(always)]
fn pending_time(input: &Input, process: &Process) -> u64 {
    process
        .start_offset_ns
        .saturating_add(record_time(&input.record))
}

/// The pending input whose next record is earliest (the first of equals), with its replay time.
fn earliest_pending(inputs: &[Input], processes: &[Process]) -> Option<(usize, u64)> {
    let mut best: Option<(usize, u64)> = None;
    for (index, input) in inputs.iter().enumerate() {
        if input.pending {
            let t = pending_time(input, &processes[index]);
            if best.is_none_or(|(_, best_t)| t < best_t) {
                best = Some((index, t));
            }
        }
    }
    best
}

/// Whether PyTorch's allocator tracker (or, in PyTorch 2.1, its profiler report) is in
/// `process`: it said so in a note when it attached (inside the first `cudaMalloc`, before
/// that call's event), or it handed out a tensor.
fn pytorch_tracked(process: &Process) -> bool {
    process.tensor_allocs > 0
        || process.notes.iter().any(|note| {
            note.text.starts_with("torch: tracker attached")
                || note.text.starts_with(REPORT_ROUTE_NOTE)
        })
}

/// Whether `event` (of the hold's process, another thread) concerns memory held back: an
/// address inside a held allocation or mapping, or a held physical allocation's handle.
fn touches_hold(hold: &[Held], event: &Event) -> bool {
    hold.iter().any(|held| {
        let held = &held.event;
        let inside = event.addr != 0
            && held.addr != 0
            && held.addr <= event.addr
            && event.addr < held.addr.saturating_add(held.size.max(1));
        inside
            || (event.handle != 0 && held.kind == EventKind::Create && event.handle == held.handle)
    })
}

/// How long (log time) a held driver event waits for PyTorch's word on its thread: the
/// allocator names its segment right after the `cudaMalloc` returns, microseconds later.
const HOLD_NS: u64 = 2_000_000;

/// [`HOLD_NS`] for a process whose times were rounded down to a coarser resolution: a gap
/// between two rounded times may be up to one resolution less than it shows, so a hold ends
/// only when the real gap surely passed `HOLD_NS`.
fn hold_ns(process: &Process) -> u64 {
    HOLD_NS.saturating_add(process.header.time_resolution_ns.saturating_sub(1))
}

/// Takes hold `at` out of `holds` and steps its events as they came (the other holds stay
/// held), keeping its emptied `Vec` in `spare` for the next hold; whether `stop` was reached.
#[allow(clippy::too_many_arguments)]
fn step_hold_out<O: Observers + ?Sized>(
    holds: &mut Vec<Vec<Held>>,
    at: usize,
    spare: &mut Vec<Vec<Held>>,
    state: &mut State,
    processes: &mut [Process],
    observers: &mut O,
    stop: Stop,
    end_ns: &mut u64,
) -> bool {
    let mut hold = holds.swap_remove(at);
    state.set_held(holds.iter().flatten());
    let stopped = step_all(state, processes, observers, stop, &hold, end_ns);
    hold.clear();
    spare.push(hold);
    stopped
}

/// Steps `events` in order; whether the replay stops there.
fn step_all<O: Observers + ?Sized>(
    state: &mut State,
    processes: &mut [Process],
    observers: &mut O,
    stop: Stop,
    events: &[Held],
    end_ns: &mut u64,
) -> bool {
    for before in events {
        let seqs = step_event(
            state,
            processes,
            observers,
            before.index,
            before.t_ns,
            &before.event,
        );
        *end_ns = (*end_ns).max(before.t_ns);
        if stops(stop, &seqs) {
            return true;
        }
    }
    false
}

/// Whether the replay stops after the steps `seqs`.
fn stops(stop: Stop, seqs: &std::ops::Range<u64>) -> bool {
    matches!(stop, Stop::AfterSeq(seq) if seqs.contains(&seq))
}

/// Applies one event and shows it to the observers; returns the sequence numbers of its steps
/// (one, or more when PyTorch's mapping ends several live physical allocations at once).
#[inline(always)]
fn step_event<O: Observers + ?Sized>(
    state: &mut State,
    processes: &mut [Process],
    observers: &mut O,
    index: usize,
    t_ns: u64,
    event: &Event,
) -> std::ops::Range<u64> {
    // The usual event, a successful allocation or free by address that the tensor view
    // leaves as the driver view has it, stepped here in the replay loop; the rest apart.
    let plain = event.result == 0
        && event.addr != 0
        && match event.kind {
            EventKind::Alloc => true,
            EventKind::Free => state.view == View::Driver || state.segments.is_empty(),
            _ => false,
        };
    if !plain {
        return step_event_general(state, processes, observers, index, t_ns, event);
    }
    let process = index as u32;
    let first = state.seq;
    state.replaced = None;
    state.segment_change = None;
    let key = Key {
        process,
        class: 0,
        value: event.addr,
    };
    let mut effect = Effect::None;
    file_or_end(
        state,
        &mut processes[index],
        process,
        t_ns,
        event,
        key,
        &mut effect,
    );
    processes[index].events += 1;
    show(state, processes, observers, index, t_ns, event, &effect);
    first..state.seq
}

/// [`step_event`] for every event.
// One body for every caller, with `apply`, `show` and the observers inlined into it.
#[inline(never)]
fn step_event_general<O: Observers + ?Sized>(
    state: &mut State,
    processes: &mut [Process],
    observers: &mut O,
    index: usize,
    t_ns: u64,
    event: &Event,
) -> std::ops::Range<u64> {
    let process = index as u32;
    let first = state.seq;
    state.segment_change = None;
    if state.view == View::Tensors && event.kind == EventKind::TensorSegmentMap && event.result == 0
    {
        let segment = Segment::mapped(live_of(process, t_ns, event, state.seq));
        for live in state.map_segment(segment) {
            state.replaced = None;
            show(
                state,
                processes,
                observers,
                index,
                t_ns,
                event,
                &Effect::Removed(live),
            );
        }
    }
    // The graph pool is a level: its last one on the device ends before the new one starts.
    if event.kind == EventKind::GraphPool
        && event.result == 0
        && let Some(live) = state.remove(&graph_pool_key(process, event.device))
    {
        state.replaced = None;
        show(
            state,
            processes,
            observers,
            index,
            t_ns,
            event,
            &Effect::Removed(live),
        );
    }
    state.replaced = None;
    state.segment_change = None;
    let effect = apply(state, &mut processes[index], process, t_ns, event);
    processes[index].events += 1;
    show(state, processes, observers, index, t_ns, event, &effect);
    first..state.seq
}

/// Shows one step of `held`'s event to the observers.
#[inline(always)]
fn show<O: Observers + ?Sized>(
    state: &mut State,
    processes: &mut [Process],
    observers: &mut O,
    index: usize,
    t_ns: u64,
    event: &Event,
    effect: &Effect,
) {
    let process = index as u32;
    let step = Step::Event {
        process,
        t_ns,
        event,
        effect,
    };
    observers.step(state, processes, &step);
    state.seq += 1;
    processes[index].end_ns = processes[index]
        .end_ns
        .max(t_ns.saturating_sub(processes[index].start_offset_ns));
}

/// Whether `event` may begin one of PyTorch's segments: a `cudaMalloc` (`malloc_api`: its
/// index among the process's API names), or the first physical allocation of a range an
/// expandable segment maps.
fn may_be_segment(malloc_api: &Option<u16>, event: &Event) -> bool {
    event.result == 0
        && event.device >= 0
        && match event.kind {
            EventKind::Alloc => event.addr != 0 && *malloc_api == Some(event.api),
            EventKind::Create => true,
            _ => false,
        }
}

/// Whether `event` (of input `index`, at replay time `t_ns`) ends `hold`, another thread's,
/// which then steps before it: see the rules in [`run_view`].
fn ends_hold(processes: &[Process], hold: &[Held], index: usize, t_ns: u64, event: &Event) -> bool {
    let first = &hold[0];
    let other_thread = first.index != index || first.event.thread != event.thread;
    other_thread
        && (t_ns.saturating_sub(first.t_ns) > hold_ns(&processes[first.index])
            || !pytorch_tracked(&processes[first.index])
            || (first.index == index
                && (first.event.device == event.device || touches_hold(hold, event))))
}

/// Events held back at most (an expandable segment maps a range page by page).
const MAX_HELD: usize = 256;

/// Whether `current` continues the held physical allocations and mappings of one thread.
fn extends_hold(held: &[Held], current: &Held) -> bool {
    let Some(first) = held.first() else {
        return false;
    };
    first.event.kind == EventKind::Create
        && held.len() < MAX_HELD
        && current.index == first.index
        && current.event.thread == first.event.thread
        && current.event.result == 0
        && matches!(current.event.kind, EventKind::Create | EventKind::Map)
}

/// Whether `event` is PyTorch taking the one held allocation as its segment.
fn is_own_segment(held: &[Held], index: usize, event: &Event) -> bool {
    let [held] = held else { return false };
    index == held.index && event.thread == held.event.thread && names_segment(&held.event, event)
}

/// Whether `event` names the allocation `held` as PyTorch's segment (on the same thread of the
/// same process: the caller's to check).
fn names_segment(held: &Event, event: &Event) -> bool {
    event.kind == EventKind::TensorSegment && event.addr == held.addr && event.size == held.size
}

/// Whether `current` is PyTorch mapping the range of the held mappings into an expandable
/// segment.
fn is_own_mapping(held: &[Held], current: &Held) -> bool {
    held.first().is_some_and(|first| {
        first.event.kind == EventKind::Create
            && current.event.kind == EventKind::TensorSegmentMap
            && current.index == first.index
            && current.event.thread == first.event.thread
    })
}

/// Tensor view: the held physical allocations mapped inside the range `map` reports become
/// the segment's without ever counting as live; returns the other held events, to step.
fn take_mapping(state: &mut State, held: &mut Vec<Held>, map: &Held) -> Vec<Held> {
    let process = map.index as u32;
    let (start, end) = (
        map.event.addr,
        map.event.addr.saturating_add(map.event.size),
    );
    let inside = |event: &Event| {
        event.kind == EventKind::Map
            && start <= event.addr
            && event.addr.saturating_add(event.size) <= end
    };
    let handles: HashSet<u64> = held
        .iter()
        .filter(|h| inside(&h.event))
        .map(|h| h.event.handle)
        .collect();
    let mut rest = Vec::new();
    for before in held.drain(..) {
        let event = &before.event;
        if inside(event) {
            state
                .vmm_maps
                .insert((process, event.addr), (event.size, event.handle));
        } else if event.kind == EventKind::Create && handles.contains(&event.handle) {
            state.segment_handles.insert((process, event.handle));
        } else {
            rest.push(before);
        }
    }
    rest
}

/// Tensor view: a held `cudaMalloc` becomes a segment without ever counting as live.
fn take_segment(state: &mut State, held: &Held) {
    let live = live_of(held.index as u32, held.t_ns, &held.event, state.seq);
    state.add_segment(live);
}

fn live_of(process: u32, t_ns: u64, event: &Event, seq: u64) -> Live {
    Live {
        process,
        kind: event.kind,
        api: event.api,
        device: event.device,
        addr: event.addr,
        handle: event.handle,
        size: event.size,
        requested: event.size,
        stack: event.stack,
        thread: event.thread,
        stream: event.stream,
        t_ns,
        seq,
    }
}

/// Each process's start on one common clock. Logs of one host and boot share
/// `CLOCK_MONOTONIC`, which is exact; otherwise wall-clock starts are used (their precision is
/// that of the hosts' clock synchronisation).
fn start_times(processes: &[Process]) -> Vec<u64> {
    let wall: Vec<u64> = processes.iter().map(|p| p.header.start_unix_ns).collect();
    let Some(first) = processes.first() else {
        return wall;
    };
    // Same boot: the two clocks' differences agree to well within a second.
    let same_boot = processes.iter().all(|p| {
        p.header.hostname == first.header.hostname && {
            let wall_gap = p.header.start_unix_ns as i128 - first.header.start_unix_ns as i128;
            let mono_gap = p.header.start_mono_ns as i128 - first.header.start_mono_ns as i128;
            (wall_gap - mono_gap).abs() < 1_000_000_000
        }
    });
    if same_boot {
        processes.iter().map(|p| p.header.start_mono_ns).collect()
    } else {
        wall
    }
}

/// Reads into `input.record` until a timed record (event, memory sample, note, dump) and
/// absorbs definitions; whether one came.
#[inline(always)]
fn next_timed(input: &mut Input, process: &mut Process) -> bool {
    // The usual record, an event, read here; everything else apart (its code kept out of
    // the replay loop).
    match input.reader.next_into(&mut input.record) {
        Some(Ok(())) if matches!(input.record, Record::Event(_)) => true,
        first => next_timed_after(input, process, first),
    }
}

/// [`next_timed`] after its first read gave `first`, something other than an event.
#[inline(never)]
fn next_timed_after(
    input: &mut Input,
    process: &mut Process,
    first: Option<Result<(), Damage>>,
) -> bool {
    let mut next = first;
    loop {
        match next {
            None => {
                input.finished = true;
                return false;
            }
            Some(Err(damage)) => process.damage.push(damage),
            Some(Ok(())) => match &input.record {
                Record::Event(_) | Record::MemInfo(_) | Record::Note(_) | Record::DumpBegin(_) => {
                    return true;
                }
                Record::Stack(stack) => {
                    let mut ips = process.stacks.begin();
                    let mut python = Vec::new();
                    for frame in &stack.frames {
                        match *frame {
                            Frame::Native(ip) => ips.push(ip),
                            Frame::Python {
                                code,
                                offset,
                                entry,
                            } => python.push(PyFrame {
                                code,
                                offset,
                                entry,
                            }),
                        }
                    }
                    ips.finish(stack.id);
                    if !python.is_empty() {
                        process.python_stacks.insert(stack.id, python);
                    }
                }
                Record::Dropped(dropped) => {
                    process.dropped = process.dropped.saturating_add(dropped.count);
                }
                Record::Exit(_) => process.exited = true,
                // Definitions kept whole: taken out of the slot.
                Record::Code(_) | Record::Module(_) | Record::ThreadName(_) | Record::Mark(_) => {
                    match std::mem::replace(&mut input.record, Record::Exit(Exit::default())) {
                        Record::Code(code) => {
                            process.codes.insert(code.id, code);
                        }
                        Record::Module(module) => process.modules.push(module),
                        Record::ThreadName(thread) => {
                            process.thread_names.insert(thread.thread, thread.name);
                        }
                        // Taken as read, like a definition: the recorder writes a mark with
                        // the definitions of its next flush, possibly before events older
                        // than it, so it must not move the replay's clock.
                        Record::Mark(mark) => process.marks.push(mark),
                        _ => {}
                    }
                }
            },
        }
        next = input.reader.next_into(&mut input.record);
    }
}

fn record_time(record: &Record) -> u64 {
    match record {
        Record::Event(event) => event.t_ns,
        Record::MemInfo(info) => info.t_ns,
        Record::Note(note) => note.t_ns,
        Record::DumpBegin(begin) => begin.t_ns,
        Record::Dropped(dropped) => dropped.t_ns,
        Record::Stack(_)
        | Record::Module(_)
        | Record::ThreadName(_)
        | Record::Code(_)
        | Record::Mark(_)
        | Record::Exit(_) => 0,
    }
}

/// The key of a process's graph pool on `device`: one live object, its current level.
fn graph_pool_key(process: u32, device: i32) -> Key {
    Key {
        process,
        class: 3,
        value: device as u32 as u64,
    }
}

/// Applies one event to the live state.
#[inline(always)]
fn apply(state: &mut State, process: &mut Process, index: u32, t_ns: u64, event: &Event) -> Effect {
    if event.kind == EventKind::AllocFailed {
        return Effect::Failed;
    }
    if event.result != 0 {
        return Effect::None;
    }
    // (The tensor view changes nothing for allocations, nor for frees while PyTorch holds no
    // segment: the usual events skip the call.)
    if state.view == View::Tensors
        && !(matches!(event.kind, EventKind::Alloc | EventKind::Create)
            || event.kind == EventKind::Free && state.segments.is_empty())
        && let Some(effect) = apply_tensor(state, process, index, t_ns, event)
    {
        return effect;
    }
    let (class, value) = match event.kind {
        EventKind::Alloc | EventKind::Free => {
            // Arrays have no address: known by handle, kept apart from addresses.
            if event.addr != 0 {
                (0, event.addr)
            } else if event.handle != 0 {
                (0, event.handle | 1 << 63)
            } else {
                // cudaFree(NULL) and the like.
                return Effect::None;
            }
        }
        EventKind::Create | EventKind::Release => (1, event.handle),
        EventKind::GraphAlloc => {
            state.graph_addresses.insert((index, event.addr));
            return Effect::None;
        }
        // The device's graph pool at its new level (the old one removed by `step_event`).
        EventKind::GraphPool if event.size > 0 => {
            let live = live_of(index, t_ns, event, state.seq);
            state.add(graph_pool_key(index, event.device), live);
            return Effect::Added(live);
        }
        _ => return Effect::None,
    };
    let key = Key {
        process: index,
        class,
        value,
    };
    let mut effect = Effect::None;
    file_or_end(state, process, index, t_ns, event, key, &mut effect);
    effect
}

/// Applies an allocation (`Alloc`, `Create`: files it under `key`) or a release (ends what
/// `key` holds) to the live state; its effect into `effect`.
#[inline(always)]
fn file_or_end(
    state: &mut State,
    process: &mut Process,
    index: u32,
    t_ns: u64,
    event: &Event,
    key: Key,
    effect: &mut Effect,
) {
    match event.kind {
        EventKind::Alloc | EventKind::Create => {
            // Made in its final place, then filed (one copy of the `Live`, not two).
            *effect = Effect::Added(live_of(index, t_ns, event, state.seq));
            if let Effect::Added(live) = effect {
                state.add(key, *live);
            }
        }
        // A freed `Live` is copied once, from its slot straight into `effect` (moving an
        // `Effect` out through the calls copied it three times).
        _ => match state.remove_with(&key, |live| *effect = Effect::Removed(*live)) {
            Some(()) => {}
            None if key.class == 0 && state.graph_addresses.contains(&(index, key.value)) => {
                process.graph_frees_outside += 1;
                *effect = Effect::None;
            }
            None => {
                process.unmatched_frees += 1;
                *effect = Effect::Unmatched;
            }
        },
    }
}

/// Tensor view: PyTorch's events, and frees of its segments. `None`: as in the driver view.
fn apply_tensor(
    state: &mut State,
    process: &mut Process,
    index: u32,
    t_ns: u64,
    event: &Event,
) -> Option<Effect> {
    let key = Key {
        process: index,
        class: 2,
        value: event.addr,
    };
    Some(match event.kind {
        EventKind::TensorAlloc => {
            process.tensor_allocs += 1;
            let block = state
                .segment_mut(index, event.addr)
                .and_then(|segment| segment.allocate(event.addr, event.size, event.stack));
            let size = block.unwrap_or_else(|| {
                process.unplaced_blocks += 1;
                rounded_request(event.size)
            });
            let live = Live {
                size,
                requested: event.size,
                ..live_of(index, t_ns, event, state.seq)
            };
            state.add(key, live);
            Effect::Added(live)
        }
        // PyTorch's allocated bytes drop when the program frees; the block is reusable later.
        EventKind::TensorFreeRequested => {
            if let Some(segment) = state.segment_mut(index, event.addr) {
                segment.free_requested(event.addr);
            }
            match state.remove(&key) {
                Some(live) => Effect::Removed(live),
                None => {
                    process.unmatched_frees += 1;
                    Effect::Unmatched
                }
            }
        }
        EventKind::TensorFree => {
            if let Some(segment) = state.segment_mut(index, event.addr) {
                segment.free_completed(event.addr);
            }
            Effect::None
        }
        // Not held back (another thread's event came between): the allocation leaves the
        // live set for the segments.
        EventKind::TensorSegment => {
            let driver = Key {
                process: index,
                class: 0,
                value: event.addr,
            };
            match state.remove(&driver) {
                Some(live) => {
                    state.add_segment(live);
                    Effect::Removed(live)
                }
                None => {
                    // Taken when held back, just before this step: the step says so.
                    if let Some(segment) = state.segments.get(&(index, event.addr)) {
                        state.segment_change = Some(SegmentChange::Added(segment.live));
                    }
                    Effect::None
                }
            }
        }
        EventKind::Free
            if !state.segments.is_empty() && state.remove_segment(index, event.addr).is_some() =>
        {
            Effect::None
        }
        // Expandable segments: what is mapped where, for PyTorch's word on it.
        EventKind::Map => {
            state
                .vmm_maps
                .insert((index, event.addr), (event.size, event.handle));
            return None;
        }
        EventKind::Unmap => {
            state.vmm_maps.remove(&(index, event.addr));
            return None;
        }
        EventKind::Release if state.segment_handles.remove(&(index, event.handle)) => Effect::None,
        // The range joined the segments before this step ([`step_event`]).
        EventKind::TensorSegmentMap => {
            state.segment_change =
                Some(SegmentChange::Added(live_of(index, t_ns, event, state.seq)));
            Effect::None
        }
        EventKind::TensorSegmentUnmap => {
            state.unmap_segment(index, event.device, event.addr, event.size);
            state.segment_change = Some(SegmentChange::Removed(live_of(
                index, t_ns, event, state.seq,
            )));
            Effect::None
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn segment(addr: u64, size: u64) -> Segment {
        Segment::new(Live {
            process: 0,
            kind: EventKind::Alloc,
            api: 0,
            device: 0,
            addr,
            handle: 0,
            size,
            requested: size,
            stack: 0,
            thread: 0,
            stream: 0,
            t_ns: 0,
            seq: 0,
        })
    }

    #[test]
    fn small_blocks_split_off_any_remainder_and_merge_back() {
        let base = 0x7000_0000_0000;
        let mut small = segment(base, 2 * MIB);
        assert_eq!(small.allocate(base, 1000, 0), Some(1024));
        assert_eq!(small.allocate(base + 1024, 1, 0), Some(512));
        // Not the start of a free block: the model does not place it.
        assert_eq!(small.allocate(base + 100, 512, 0), None);
        small.free_requested(base);
        // Requested, not completed: not reusable, not merged.
        assert_eq!(small.allocate(base, 512, 0), None);
        small.free_completed(base);
        small.free_requested(base + 1024);
        small.free_completed(base + 1024);
        assert_eq!(
            small.blocks().collect::<Vec<_>>(),
            vec![(
                base,
                Block {
                    size: 2 * MIB,
                    state: BlockState::Free,
                    requested: 1,
                    stack: 0,
                }
            )]
        );
    }

    fn live(kind: EventKind, addr: u64, handle: u64, size: u64) -> Live {
        Live {
            kind,
            addr,
            handle,
            size,
            requested: size,
            ..segment(addr, size).live
        }
    }

    #[test]
    fn expandable_ranges_join_split_every_remainder_and_part_when_unmapped() {
        let base = 0x7200_0000_0000;
        let mut state = State {
            view: View::Tensors,
            ..State::default()
        };
        let map = |state: &mut State, addr: u64| {
            state.map_segment(Segment::mapped(live(
                EventKind::TensorSegmentMap,
                addr,
                0,
                2 * MIB,
            )))
        };
        // A physical allocation mapped there leaves the live set for the segment.
        let create = live(EventKind::Create, 0, 0x55, 2 * MIB);
        let key = Key {
            process: 0,
            class: 1,
            value: 0x55,
        };
        state.add(key, create);
        state.vmm_maps.insert((0, base), (2 * MIB, 0x55));
        assert_eq!(state.device_bytes(0), 2 * MIB);
        assert_eq!(map(&mut state, base), vec![create]);
        assert_eq!(state.device_bytes(0), 0);
        assert!(state.segment_handles.contains(&(0, 0x55)));
        assert!(map(&mut state, base + 4 * MIB).is_empty());
        assert_eq!(state.segment_totals(0), (2, 4 * MIB));
        // The range between continues both: one segment.
        map(&mut state, base + 2 * MIB);
        assert_eq!(state.segment_totals(0), (1, 6 * MIB));
        let segment = state.segment_mut(0, base + 5 * MIB).expect("joined");
        // Blocks span the ranges; any remainder of 512 B or more is split off.
        assert_eq!(segment.allocate(base, 3 * MIB, 0), Some(3 * MIB));
        assert_eq!(
            segment.allocate(base + 3 * MIB, 3 * MIB - 512, 0),
            Some(3 * MIB - 512)
        );
        assert_eq!(segment.allocate(base + 6 * MIB - 512, 1, 0), Some(512));
        for addr in [base, base + 3 * MIB, base + 6 * MIB - 512] {
            segment.free_requested(addr);
            segment.free_completed(addr);
        }
        // Unmapping the middle leaves two segments, each one free block.
        state.unmap_segment(0, 0, base + 2 * MIB, 2 * MIB);
        assert_eq!(state.segment_totals(0), (2, 4 * MIB));
        for start in [base, base + 4 * MIB] {
            let segment = &state.segments[&(0, start)];
            assert_eq!(
                segment
                    .blocks()
                    .map(|(addr, block)| (addr, block.size, block.state))
                    .collect::<Vec<_>>(),
                vec![(start, 2 * MIB, BlockState::Free)]
            );
        }
        state.unmap_segment(0, 0, base, 6 * MIB);
        assert_eq!(state.segment_totals(0), (0, 0));
    }

    /// A log of `events` (api names `apis`) in a fresh file.
    fn log_of(name: &str, apis: &[&str], events: &[Event]) -> PathBuf {
        let records: Vec<Record> = events.iter().map(|e| Record::Event(*e)).collect();
        log_of_records(name, apis, &records)
    }

    /// A log of `records` (api names `apis`) in a fresh file.
    fn log_of_records(name: &str, apis: &[&str], records: &[Record]) -> PathBuf {
        let header = Header {
            version: vramshim_format::FORMAT_VERSION,
            pid: 1,
            ppid: 0,
            argv: vec!["crafted".into()],
            start_unix_ns: 1,
            start_mono_ns: 1,
            hostname: "h".into(),
            env: Vec::new(),
            apis: apis.iter().map(|s| s.to_string()).collect(),
            stack_mode: "none".into(),
            mode: "stream".into(),
            recorder: "test".into(),
            time_resolution_ns: 1,
        };
        let mut out = header.encode();
        let mut chunk = vramshim_format::ChunkBuilder::new();
        for record in records {
            chunk.push(record);
        }
        chunk.finish_into(&mut out);
        let path = std::env::temp_dir().join(format!("{name}-{}.vlog", std::process::id()));
        std::fs::write(&path, out).expect("write log");
        path
    }

    /// Records every step's device-0 bytes.
    struct Bytes(Vec<u64>);

    impl Observer for Bytes {
        fn step(&mut self, state: &State, _: &[Process], step: &Step<'_>) {
            if let Step::Event { .. } = step {
                self.0.push(state.device_bytes(0));
            }
        }
    }

    #[test]
    fn expandable_pages_become_the_segments_whether_or_not_another_thread_came_between() {
        let apis = [
            "cuMemCreate",
            "cuMemMap",
            "cuMemUnmap",
            "cuMemRelease",
            "cuMemAlloc_v2",
            "torch.CUDACachingAllocator",
        ];
        let base = 0x7300_0000_0000;
        let event = |kind, api, t_ns, thread, addr, size, handle| Event {
            kind,
            api,
            t_ns,
            thread,
            addr,
            size,
            handle,
            ..Event::default()
        };
        for interleaved in [false, true] {
            let mut events = vec![
                event(EventKind::Create, 0, 10, 1, 0, 2 * MIB, 0x51),
                event(EventKind::Create, 0, 11, 1, 0, 2 * MIB, 0x52),
                event(EventKind::Map, 1, 12, 1, base, 2 * MIB, 0x51),
                event(EventKind::Map, 1, 13, 1, base + 2 * MIB, 2 * MIB, 0x52),
                event(EventKind::TensorSegmentMap, 5, 14, 1, base, 4 * MIB, 0),
                event(EventKind::TensorAlloc, 5, 15, 1, base, 3 * MIB, 0),
                event(EventKind::TensorFreeRequested, 5, 16, 1, base, 3 * MIB, 0),
                event(EventKind::TensorFree, 5, 16, 1, base, 3 * MIB, 0),
                event(EventKind::Unmap, 2, 17, 1, base, 2 * MIB, 0),
                event(EventKind::Release, 3, 17, 1, 0, 0, 0x51),
                event(EventKind::TensorSegmentUnmap, 5, 18, 1, base, 2 * MIB, 0),
            ];
            if interleaved {
                // Another thread's allocation between the pages and PyTorch's word on them.
                events.insert(2, event(EventKind::Alloc, 4, 11, 2, 0x1000, 1024, 0));
            }
            let path = log_of("expandable", &apis, &events);
            let mut bytes = Bytes(Vec::new());
            let replay = run_view(
                std::slice::from_ref(&path),
                &mut [&mut bytes],
                Stop::End,
                View::Tensors,
            );
            let _ = std::fs::remove_file(&path);
            let Ok(replay) = replay else {
                panic!("the crafted log did not replay");
            };
            let other = if interleaved { 1024 } else { 0 };
            // The 3 MiB block, then the other thread's KiB; the pages themselves only when
            // another thread came between (until the segment_map): this process has handed
            // out no tensor before, so its holds end at any other thread's event (once it
            // has, each thread keeps its own: fakegpu_torch's two-device test).
            let peak = bytes.0.iter().copied().max().unwrap_or(0);
            let pages = if interleaved { 4 * MIB } else { 0 };
            assert_eq!(peak, (3 * MIB + other).max(pages + other), "{:?}", bytes.0);
            assert_eq!(replay.state.device_bytes(0), other);
            assert_eq!(replay.state.segment_totals(0), (1, 2 * MIB));
            assert_eq!(replay.processes[0].unmatched_frees, 0);
            assert_eq!(replay.processes[0].unplaced_blocks, 0);
        }
    }

    /// Every step's device-0 bytes and log time.
    struct Steps(Vec<(u64, u64)>);

    impl Observer for Steps {
        fn step(&mut self, state: &State, _: &[Process], step: &Step<'_>) {
            if let Step::Event { t_ns, .. } = step {
                self.0.push((state.device_bytes(0), *t_ns));
            }
        }
    }

    /// The tensor view's steps of a crafted log of `records`.
    fn steps_of(name: &str, apis: &[&str], records: &[Record]) -> Steps {
        let path = log_of_records(name, apis, records);
        let mut steps = Steps(Vec::new());
        let replay = run_view(
            std::slice::from_ref(&path),
            &mut [&mut steps],
            Stop::End,
            View::Tensors,
        );
        let _ = std::fs::remove_file(&path);
        assert!(replay.is_ok(), "the crafted log did not replay");
        steps
    }

    #[test]
    fn a_segment_waits_for_its_own_threads_word_unless_its_device_speaks() {
        let apis = ["cudaMalloc", "cuMemAlloc_v2", "torch.CUDACachingAllocator"];
        let (base, other) = (0x7400_0000_0000, 0x7500_0000_0000);
        let event = |kind, api, t_ns, thread, device, addr, size| Event {
            kind,
            api,
            t_ns,
            thread,
            device,
            addr,
            size,
            ..Event::default()
        };
        let attached = Record::Note(vramshim_format::Note {
            t_ns: 1,
            text: "torch: tracker attached (test)".into(),
        });
        // A tracked process (PyTorch's word on a segment is stepped, its `cudaMalloc` not):
        // thread 1's second segment is named after thread 2 spoke, on
        // device 1 (the hold waits: the pages never count) or on device 0 (it ends the hold:
        // PyTorch's lock on device 0 means it was no segment being named).
        for other_device in [1, 0] {
            let records = vec![
                attached.clone(),
                Record::Event(event(EventKind::Alloc, 0, 10, 1, 0, base, 2 * MIB)),
                Record::Event(event(EventKind::TensorSegment, 2, 11, 1, 0, base, 2 * MIB)),
                Record::Event(event(EventKind::TensorAlloc, 2, 12, 1, 0, base, MIB)),
                Record::Event(event(
                    EventKind::Alloc,
                    0,
                    13,
                    1,
                    0,
                    base + 2 * MIB,
                    2 * MIB,
                )),
                Record::Event(event(EventKind::Alloc, 1, 14, 2, other_device, other, 1024)),
                Record::Event(event(
                    EventKind::TensorSegment,
                    2,
                    15,
                    1,
                    0,
                    base + 2 * MIB,
                    2 * MIB,
                )),
            ];
            let steps = steps_of("own-thread-hold", &apis, &records);
            let peak = steps.0.iter().map(|&(bytes, _)| bytes).max().unwrap_or(0);
            let (expected_peak, expected_times) = if other_device == 1 {
                (MIB, vec![11, 12, 14, 15])
            } else {
                (MIB + 2 * MIB + 1024, vec![11, 12, 13, 14, 15])
            };
            assert_eq!(peak, expected_peak, "{:?}", steps.0);
            let times: Vec<u64> = steps.0.iter().map(|&(_, t_ns)| t_ns).collect();
            assert_eq!(times, expected_times, "{:?}", steps.0);
        }
        // PyTorch's no-caching mode: the tracker attached but names no segment; the autograd
        // thread's first call on the device ends the main thread's hold, so steps keep the
        // order they came in (the snapshot export's order is torch's).
        let records = vec![
            attached,
            Record::Event(event(EventKind::Alloc, 0, 10, 1, 0, base, 4)),
            Record::Event(event(EventKind::Alloc, 0, 11, 2, 0, other, 1024)),
            Record::Event(event(EventKind::Free, 0, 12, 2, 0, other, 0)),
            Record::Event(event(EventKind::Free, 0, 13, 1, 0, base, 0)),
        ];
        let steps = steps_of("no-caching-hold", &apis, &records);
        assert_eq!(
            steps.0,
            vec![(4, 10), (1028, 11), (4, 12), (0, 13)],
            "steps in time order"
        );
    }

    /// The tensor view's steps of the log at `path`, replayed until `stop`.
    fn steps_until(path: &std::path::Path, stop: Stop) -> Steps {
        let mut steps = Steps(Vec::new());
        let replay = run_view(
            &[path.to_path_buf()],
            &mut [&mut steps],
            stop,
            View::Tensors,
        );
        assert!(replay.is_ok(), "the crafted log did not replay");
        steps
    }

    #[test]
    fn the_look_ahead_decides_a_held_malloc_as_the_hold_does() {
        // A replay of one log to its end (`Stop::End`) runs its events in a loop of its own,
        // which decides a `cudaMalloc` the tensor view would hold from the next record when
        // that repeats an event; any other stop keeps the general loop, which holds it. Both
        // must step the same. Every round after the first is written as repeats.
        let apis = ["cudaMalloc", "cudaFree", "torch.CUDACachingAllocator"];
        let (base, pool) = (0x7400_0000_0000, 0x7500_0000_0000);
        let event = |kind, api, t_ns, thread, addr, size| {
            Record::Event(Event {
                kind,
                api,
                t_ns,
                thread,
                addr,
                size,
                ..Event::default()
            })
        };
        let mut records = vec![Record::Note(vramshim_format::Note {
            t_ns: 1,
            text: "torch: tracker attached (test)".into(),
        })];
        // Each case three times (the recorder keeps four events to repeat).
        let rounds = |first: u64, case: &dyn Fn(u64) -> Vec<Record>| -> Vec<Record> {
            (0..3).flat_map(|round| case(first + 10 * round)).collect()
        };
        // An allocate/free loop: the free, on the same thread, steps the allocation.
        records.extend(rounds(100, &|t| {
            vec![
                event(EventKind::Alloc, 0, t, 1, base, 4),
                event(EventKind::Free, 1, t + 1, 1, base, 0),
            ]
        }));
        // PyTorch names the `cudaMalloc` its segment right after: never live itself.
        records.extend(rounds(200, &|t| {
            vec![
                event(EventKind::Alloc, 0, t, 1, pool, 2 * MIB),
                event(EventKind::TensorSegment, 2, t + 1, 1, pool, 2 * MIB),
                event(EventKind::Free, 1, t + 2, 1, pool, 0),
            ]
        }));
        // Another thread between a `cudaMalloc` and its free: the hold's rules (an event on
        // the same device ends it).
        records.extend(rounds(300, &|t| {
            vec![
                event(EventKind::Alloc, 0, t, 1, base, 4),
                event(EventKind::Alloc, 0, t + 1, 2, base + 4096, 8),
                event(EventKind::Free, 1, t + 2, 1, base, 0),
                event(EventKind::Free, 1, t + 3, 2, base + 4096, 0),
            ]
        }));
        let path = log_of_records("look-ahead", &apis, &records);
        let looked_ahead = steps_until(&path, Stop::End);
        let held = steps_until(&path, Stop::AfterTime(u64::MAX));
        let _ = std::fs::remove_file(&path);
        assert_eq!(looked_ahead.0, held.0);
        let expected: Vec<(u64, u64)> = (0..3)
            .flat_map(|round| [(4, 100 + 10 * round), (0, 101 + 10 * round)])
            .chain((0..3).flat_map(|round| [(0, 201 + 10 * round), (0, 202 + 10 * round)]))
            .chain((0..3).flat_map(|round| {
                let t = 300 + 10 * round;
                [(4, t), (12, t + 1), (8, t + 2), (0, t + 3)]
            }))
            .collect();
        assert_eq!(looked_ahead.0, expected);
    }

    #[test]
    fn large_blocks_split_only_a_remainder_over_1_mib() {
        let base = 0x7100_0000_0000;
        let mut large = segment(base, 20 * MIB);
        // 20 MiB − 19.5 MiB leaves 0.5 MiB: handed out whole.
        assert_eq!(large.allocate(base, 19 * MIB + MIB / 2, 0), Some(20 * MIB));
        let mut large = segment(base, 20 * MIB);
        assert_eq!(large.allocate(base, 18 * MIB, 0), Some(18 * MIB));
        // The remaining 2 MiB then goes whole to a 1.5 MiB request (0.5 MiB left).
        assert_eq!(
            large.allocate(base + 18 * MIB, 3 * MIB / 2, 0),
            Some(2 * MIB)
        );
        assert_eq!(rounded_request(0), 512);
        assert_eq!(rounded_request(513), 1024);
    }
}
