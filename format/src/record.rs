//! The records a log holds, and the per-chunk delta state used to encode them compactly.

use crate::varint::{Cursor, DecodeError, ROOM_RECORD, append, put_bytes, put_i64, put_u64};

/// What a hooked call did to GPU (or pinned host) memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum EventKind {
    /// Memory obtained at `addr` (or array `handle`), `size` bytes.
    #[default]
    Alloc = 0,
    /// Memory at `addr` (or array `handle`) given back.
    Free = 1,
    /// An allocating call that did not succeed; `size` is the request.
    AllocFailed = 2,
    /// VMM physical memory created: `handle`, `size` bytes.
    Create = 3,
    /// VMM physical memory handle released.
    Release = 4,
    /// VMM: `size` bytes of `handle` mapped at `addr`.
    Map = 5,
    /// VMM: the range `addr`..`addr+size` unmapped.
    Unmap = 6,
    /// VMM: a virtual address range reserved.
    Reserve = 7,
    /// VMM: a virtual address range released.
    Unreserve = 8,
    /// A stream-ordered pool (`handle`) trimmed down to `size` bytes kept.
    Trim = 9,
    /// A block (tensor storage) handed out by PyTorch's caching allocator at `addr` inside a
    /// segment it holds; `size` is the requested size. Reported by the allocator itself, not
    /// by a CUDA call.
    TensorAlloc = 10,
    /// The program gave the block at `addr` back to PyTorch's caching allocator; the block
    /// is reusable only at the matching [`EventKind::TensorFree`] (later when it was used on
    /// other streams). `size` is the requested size.
    TensorFreeRequested = 11,
    /// The block at `addr` returned to PyTorch's caching allocator's free pool.
    TensorFree = 12,
    /// PyTorch's caching allocator raised out-of-memory: `size` bytes requested, `addr` is
    /// the device's free bytes as the allocator read them.
    TensorOom = 13,
    /// PyTorch's caching allocator took the driver allocation at `addr` (`size` bytes), just
    /// recorded on the same thread, as one of its segments.
    TensorSegment = 14,
    /// PyTorch's caching allocator (`expandable_segments:True`) took the range at `addr`
    /// (`size` bytes), just mapped by the same thread's `cuMemMap` calls, into one of its
    /// expandable segments.
    TensorSegmentMap = 15,
    /// PyTorch's caching allocator (`expandable_segments:True`) gave the range at `addr`
    /// (`size` bytes) of one of its expandable segments back; its `cuMemUnmap` calls follow.
    TensorSegmentUnmap = 16,
    /// A `cudaMallocAsync`-family call made while its stream was being captured into a CUDA
    /// graph: it became a graph memory node (address fixed, no device memory taken yet).
    GraphAlloc = 17,
    /// A stream-ordered free made while its stream was being captured: a graph free node.
    GraphFree = 18,
    /// The device's graph memory pool after a graph launch, upload or trim: `size` is the
    /// driver's reserved-mem-current (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`), a level, not
    /// a change; device memory taken or given back by the driver for graphs.
    GraphPool = 19,
}

impl EventKind {
    /// Every kind, in code order.
    pub const ALL: [EventKind; 20] = [
        EventKind::Alloc,
        EventKind::Free,
        EventKind::AllocFailed,
        EventKind::Create,
        EventKind::Release,
        EventKind::Map,
        EventKind::Unmap,
        EventKind::Reserve,
        EventKind::Unreserve,
        EventKind::Trim,
        EventKind::TensorAlloc,
        EventKind::TensorFreeRequested,
        EventKind::TensorFree,
        EventKind::TensorOom,
        EventKind::TensorSegment,
        EventKind::TensorSegmentMap,
        EventKind::TensorSegmentUnmap,
        EventKind::GraphAlloc,
        EventKind::GraphFree,
        EventKind::GraphPool,
    ];

    /// The name used in text and JSON output.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::Free => "free",
            EventKind::AllocFailed => "alloc_failed",
            EventKind::Create => "create",
            EventKind::Release => "release",
            EventKind::Map => "map",
            EventKind::Unmap => "unmap",
            EventKind::Reserve => "reserve",
            EventKind::Unreserve => "unreserve",
            EventKind::Trim => "trim",
            EventKind::TensorAlloc => "tensor_alloc",
            EventKind::TensorFreeRequested => "tensor_free_requested",
            EventKind::TensorFree => "tensor_free",
            EventKind::TensorOom => "tensor_oom",
            EventKind::TensorSegment => "tensor_segment",
            EventKind::TensorSegmentMap => "tensor_segment_map",
            EventKind::TensorSegmentUnmap => "tensor_segment_unmap",
            EventKind::GraphAlloc => "graph_alloc",
            EventKind::GraphFree => "graph_free",
            EventKind::GraphPool => "graph_pool",
        }
    }

    /// The kind with code `code`, if any.
    pub fn from_code(code: u8) -> Option<EventKind> {
        EventKind::ALL.get(usize::from(code)).copied()
    }

    /// Whether the event gives memory back (recorded before the real call runs, so that a
    /// free always precedes the allocation that reuses its address in time order).
    pub fn releases(self) -> bool {
        matches!(
            self,
            EventKind::Free
                | EventKind::Release
                | EventKind::Unmap
                | EventKind::Unreserve
                | EventKind::TensorFreeRequested
                | EventKind::TensorFree
                | EventKind::TensorSegmentUnmap
        )
    }

    /// Whether the event comes from PyTorch's caching allocator (blocks inside segments the
    /// driver-level events already count), not from a CUDA call.
    pub fn is_tensor(self) -> bool {
        matches!(
            self,
            EventKind::TensorAlloc
                | EventKind::TensorFreeRequested
                | EventKind::TensorFree
                | EventKind::TensorOom
                | EventKind::TensorSegment
                | EventKind::TensorSegmentMap
                | EventKind::TensorSegmentUnmap
        )
    }
}

/// Device ordinal used for pinned host memory.
pub const HOST_DEVICE: i32 = -1;
/// Device ordinal used when the device could not be determined.
pub const UNKNOWN_DEVICE: i32 = -2;

/// One hooked call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Event {
    pub kind: EventKind,
    /// Index into [`Header::apis`]: the exact entry point called.
    pub api: u16,
    /// Monotonic nanoseconds since [`Header::start_mono_ns`].
    pub t_ns: u64,
    /// Kernel thread id of the caller.
    pub thread: u32,
    /// Device ordinal, [`HOST_DEVICE`] or [`UNKNOWN_DEVICE`].
    pub device: i32,
    /// `CUstream` as an integer (0 = legacy default stream).
    pub stream: u64,
    pub addr: u64,
    pub size: u64,
    /// VMM allocation handle, pool handle or array handle.
    pub handle: u64,
    /// Raw `CUresult` / `cudaError_t` of the call (0 = success).
    pub result: u32,
    /// Stack id from a [`StackDef`]; 0 = no stack captured.
    pub stack: u32,
    /// Device (free, total) bytes read right after a failed allocation.
    pub mem_info: Option<(u64, u64)>,
}

/// Device memory as the driver reported it (`cuMemGetInfo_v2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub t_ns: u64,
    pub device: i32,
    pub free: u64,
    pub total: u64,
}

/// A thread's name, recorded the first time the thread makes a hooked call.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ThreadName {
    pub thread: u32,
    pub name: String,
}

/// Where one captured frame points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    /// A native return address (innermost first in a stack).
    Native(u64),
    /// A Python frame: code object `code` (a [`CodeDef`] id) executing the instruction at
    /// `offset` (in code units, `_Py_CODEUNIT`, from the start of the bytecode, on every
    /// version). `entry` marks the outermost Python frame run by one native call of the
    /// interpreter's eval loop (`_PyEval_EvalFrameDefault`), so a report can splice Python
    /// frames into native ones; before 3.11 every frame is one.
    Python { code: u32, offset: u32, entry: bool },
}

/// A Python code object, written once and referred to by id from [`Frame::Python`].
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CodeDef {
    pub id: u32,
    /// The interpreter's version as `major << 8 | minor` (0x030b = 3.11); it decides how the
    /// line table and instruction offsets are read.
    pub python: u16,
    pub filename: String,
    /// `co_qualname`: `Class.method`, `outer.<locals>.inner`, `<lambda>`, `<module>`. Before
    /// 3.11 code objects have no qualified name: `co_name` (`method`, `inner`).
    pub qualname: String,
    pub first_line: u32,
    /// The line table as the interpreter holds it: `co_lnotab` (3.9), `co_linetable` in the
    /// PEP 626 format (3.10), the location table `co_linetable` (3.11+).
    pub line_table: Vec<u8>,
}

/// A call stack, written once and referred to by id from events.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StackDef {
    pub id: u32,
    /// Innermost frame first.
    pub frames: Vec<Frame>,
}

/// A loaded object, so the report can symbolise addresses offline.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ModuleDef {
    pub path: String,
    /// Difference between run-time addresses and the file's virtual addresses.
    pub load_bias: u64,
    /// Run-time address range covered by the object's loadable segments.
    pub start: u64,
    pub end: u64,
    /// GNU build id, empty if the object has none.
    pub build_id: Vec<u8>,
}

/// Events discarded because the ring was full and the user chose dropping over waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Dropped {
    pub t_ns: u64,
    pub count: u64,
}

/// Something that happened to the recorder or the process (fork, exec, signal, a warning).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Note {
    pub t_ns: u64,
    pub text: String,
}

/// An annotation the program wrote into its log (`vramshim.mark("epoch 3")`, the exported
/// `vramshim_mark`): reports draw it on timelines and can cut phases at it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Mark {
    pub t_ns: u64,
    /// The thread that wrote it.
    pub thread: u32,
    pub text: String,
}

/// Flight-recorder mode: what follows until the next `DumpBegin` is one self-contained
/// dump: the allocations live when its window opened, then every event of the window.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DumpBegin {
    pub t_ns: u64,
    pub reason: String,
    /// Events that fell out of the window before this dump (not written).
    pub events_discarded: u64,
    pub live_count: u64,
    pub window_count: u64,
}

/// The process ended normally: `exit()` or a return from `main`, after every `atexit` handler
/// (the recorder writes it from its own destructor, in a chunk of its own). `_exit`, exec and
/// signals leave none, so a log without it ends "at end of log", whatever cut it. Logs of
/// recorders before this record never have it: they read as cut (the report cannot tell a
/// normal exit from a kill between two flushes in them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Exit {
    pub t_ns: u64,
}

/// Anything a chunk can hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Event(Event),
    MemInfo(MemInfo),
    ThreadName(ThreadName),
    Stack(StackDef),
    Module(ModuleDef),
    Dropped(Dropped),
    Note(Note),
    DumpBegin(DumpBegin),
    Code(CodeDef),
    Mark(Mark),
    Exit(Exit),
}

// Record tags. Events use 0x10 + kind so the kind costs no extra byte.
const TAG_MEM_INFO: u8 = 0x01;
const TAG_THREAD_NAME: u8 = 0x02;
const TAG_STACK: u8 = 0x03;
const TAG_MODULE: u8 = 0x04;
const TAG_DROPPED: u8 = 0x05;
const TAG_NOTE: u8 = 0x06;
const TAG_DUMP_BEGIN: u8 = 0x07;
const TAG_CODE: u8 = 0x08;
const TAG_MARK: u8 = 0x09;
/// `TAG_REPEAT + slot`: an event equal, but for its time, to the event kept in that slot of
/// [`DeltaState`]'s recent events; only its time delta follows (format version 2). Loops that
/// allocate and free the same buffers then cost two or three bytes per event, and decode fast.
const TAG_REPEAT: u8 = 0x0a;
/// `TAG_REPEAT_SAME_TIME + slot`: a repeat at the same time (as written) as the event before
/// it, so nothing follows the tag (format version 4). At a coarse time resolution most events
/// of a loop are these: one byte each, so a chunk holds twice the events.
const TAG_REPEAT_SAME_TIME: u8 = 0xf0;
/// `TAG_RUN + period - 1` then a count `n` (format version 5): the `period` one-byte
/// same-time repeats written just before this record, repeated in turn for `n` more records
/// (a loop of `period` events at one time costs one record per time step, not one byte per
/// event).
pub(crate) const TAG_RUN: u8 = 0xf8;
/// Longest cycle of records a run repeats (tags `TAG_RUN..=0xff`).
pub(crate) const MAX_RUN_PERIOD: usize = 8;
/// Most records the runs of one chunk may expand to: more than a chunk of the recorder's
/// holds (it closes chunks at 256 KiB of records, a run's records counted one byte each, so
/// at most about 320 Ki records), so only damage passes it; it bounds the work a crafted
/// chunk can cause. The encoder writes plainly what a chunk's runs cannot take.
pub(crate) const MAX_RUN_RECORDS: u32 = 1 << 19;
/// `TAG_RUN_AGAIN + phase` then `n` less the last such record's `n` since the last key chunk
/// (0 before the first; a zigzag varint) (format version 6): `n` records of the cycle of
/// the last run record (`TAG_RUN + period - 1`) read since the last key chunk, in turn from
/// its record `phase` on (`phase` < the period): a loop's next time step costs its first
/// event (a repeat with the time delta), this tag and the count, not the cycle written once
/// more, whichever of the loop's events crosses into the step.
pub(crate) const TAG_RUN_AGAIN: u8 = 0xe8;
/// `TAG_FREE_PAIR`, then a `tensor_free_requested` event's fields as `TAG_EVENT + 11` writes
/// them, then the time from it to a `tensor_free` of the same block (an unsigned varint in
/// time units) (format version 7): both events in one record. PyTorch's `free()` reports a
/// block's `free_requested` and, when no other stream used it, its `free_completed` at once,
/// on the same thread: two thirds of a training step's tensor events come as such pairs. The
/// second event is the first with kind `tensor_free`, no stack and its own time. Both are kept
/// for repeats, as if each had been written in full.
pub(crate) const TAG_FREE_PAIR: u8 = 0xe0;
/// The thread of a state that knows none (a builder told no first thread): its encoder writes
/// the thread of every event while it is this, even an event of this very id, so that any
/// reader's start state reads the right one.
pub(crate) const NO_THREAD: u32 = u32::MAX;
/// The one tag left between the repeats and the events.
const TAG_EXIT: u8 = 0x0e;
/// Recent events a repeat can refer to (tags `TAG_REPEAT..TAG_REPEAT + RECENT`, below 0x10).
const RECENT: usize = 4;

// Stack frame types.
const FRAME_NATIVE: u64 = 0;
const FRAME_PYTHON: u64 = 1;
const FRAME_PYTHON_ENTRY: u64 = 2;
const TAG_EVENT: u8 = 0x10;
/// The tag of a `tensor_free_requested` written in full.
pub(crate) const TAG_FREE_REQUESTED: u8 = TAG_EVENT + EventKind::TensorFreeRequested as u8;

// Event field-presence flags: fields equal to their usual value cost nothing.
const F_THREAD: u8 = 1 << 0; // thread differs from the previous event in the chunk
const F_DEVICE: u8 = 1 << 1; // device differs from the previous event in the chunk
const F_STREAM: u8 = 1 << 2;
const F_HANDLE: u8 = 1 << 3;
const F_RESULT: u8 = 1 << 4;
const F_MEM_INFO: u8 = 1 << 5;
const F_STACK: u8 = 1 << 6;
const F_ADDR: u8 = 1 << 7;

/// Delta state shared by encoder and decoder; reset at every key chunk (before format
/// version 6: every chunk) so that it decodes on its own; a continued chunk (version 6)
/// carries on from the state the chunk before it ended in.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeltaState {
    t_ns: u64,
    thread: u32,
    device: i32,
    addr: u64,
    size: u64,
    /// The last `RECENT` events written in full, in slots filled round-robin; a repeat
    /// leaves them as they are.
    recent: [Event; RECENT],
    recent_filled: u8,
    recent_next: u8,
    /// The log's time resolution (0 or 1: full). The encoder rounds every time down to a
    /// multiple of it (which keeps times in the order they came) and, from format version 4
    /// on, writes times and time deltas in units of it: at 10 ms, a loop's next tick costs
    /// one byte instead of four. The decoder multiplies them back.
    time_step_ns: u64,
    /// The thread each chunk's state starts from (format version 5: the process id, so the
    /// main thread's first event of a chunk costs no thread id; before, 0).
    first_thread: u32,
    /// Modules written as before format version 5 (each address in full), not as the
    /// range's length and its distance from the load bias.
    absolute_modules: bool,
    /// Records of the run being decoded still to come (0: none); the cursor stays on the
    /// run record until the last.
    run_left: u32,
    /// Records of the current run decoded so far.
    run_done: u32,
    /// Records every run of this chunk expanded to so far (bounded by `MAX_RUN_RECORDS`).
    run_records: u32,
    /// The cycle of the last run record read (its first `last_period` bytes), for
    /// [`TAG_RUN_AGAIN`].
    last_cycle: [u8; MAX_RUN_PERIOD],
    /// 0: no run read yet since the last key chunk.
    last_period: u8,
    /// The count of the last [`TAG_RUN_AGAIN`] record since the last key chunk (0: none).
    last_again_count: u32,
    /// Format version 6 or later: [`TAG_RUN_AGAIN`] is a record (before, damage).
    runs_again: bool,
    /// Format version 7 or later: [`TAG_FREE_PAIR`] is a record (before, damage).
    free_pairs: bool,
    /// Decoding: where the pair record whose first event was just read ends (0: none); the
    /// cursor stays on the record until its second event is read.
    pair_end: usize,
    /// Decoding: the time of that pair's second event.
    pair_t_ns: u64,
}

impl DeltaState {
    /// A state for a log of time resolution `ns` nanoseconds (the header's
    /// `time_resolution_ns`): its encoder writes times rounded down to a multiple of it, in
    /// units of it; its decoder reads them so. Version 3 logs, whose times are nanoseconds
    /// whatever their resolution, are read with the default state.
    pub fn with_time_resolution(ns: u64) -> DeltaState {
        DeltaState {
            time_step_ns: ns,
            ..DeltaState::default()
        }
    }

    /// The same state, but each chunk's first thread is `thread` (format version 5: the
    /// header's pid): a chunk's events of that thread write no thread id until another
    /// thread's event comes.
    pub fn with_first_thread(mut self, thread: u32) -> DeltaState {
        self.first_thread = thread;
        self.thread = thread;
        self
    }

    /// The thread each chunk's state starts from.
    pub(crate) fn first_thread(&self) -> u32 {
        self.first_thread
    }

    /// The same state, reading modules as format versions before 5 wrote them.
    pub(crate) fn with_absolute_modules(mut self) -> DeltaState {
        self.absolute_modules = true;
        self
    }

    /// The same state, reading [`TAG_RUN_AGAIN`] (format version 6).
    pub(crate) fn with_runs_again(mut self) -> DeltaState {
        self.runs_again = true;
        self
    }

    /// The same state, reading [`TAG_FREE_PAIR`] (format version 7).
    pub(crate) fn with_free_pairs(mut self) -> DeltaState {
        self.free_pairs = true;
        self
    }

    /// The state at the start of a new key chunk, with the same settings.
    pub(crate) fn restarted(&self) -> DeltaState {
        DeltaState {
            time_step_ns: self.time_step_ns,
            first_thread: self.first_thread,
            thread: self.first_thread,
            absolute_modules: self.absolute_modules,
            runs_again: self.runs_again,
            free_pairs: self.free_pairs,
            ..DeltaState::default()
        }
    }

    /// The state at the start of a continued chunk: this one, with the chunk's bound on its
    /// runs' records starting again.
    pub fn continued(&self) -> DeltaState {
        DeltaState {
            run_left: 0,
            run_done: 0,
            run_records: 0,
            pair_end: 0,
            ..*self
        }
    }

    /// `t_ns` as written: rounded down to the time resolution.
    #[inline]
    fn time(&self, t_ns: u64) -> u64 {
        if self.time_step_ns > 1 {
            t_ns - t_ns % self.time_step_ns
        } else {
            t_ns
        }
    }

    /// `ns` nanoseconds in time units (no division at full resolution).
    #[inline]
    fn units(&self, ns: u64) -> u64 {
        if self.time_step_ns > 1 {
            ns / self.time_step_ns
        } else {
            ns
        }
    }

    /// Nanoseconds per unit of the times written.
    #[inline]
    fn time_unit(&self) -> u64 {
        self.time_step_ns.max(1)
    }

    /// Appends `t_ns` in time units (rounded down, as written).
    #[inline]
    fn put_time(&self, out: &mut Vec<u8>, t_ns: u64) {
        put_u64(out, t_ns / self.time_unit());
    }

    /// Appends the delta from the previous event's time (both rounded) to `t_ns`, in time
    /// units: exact, as both are multiples of the unit.
    #[inline]
    fn put_time_delta(&self, out: &mut Vec<u8>, t_ns: u64) {
        put_i64(out, self.time_delta_units(t_ns));
    }

    /// The delta [`DeltaState::put_time_delta`] writes.
    #[inline]
    fn time_delta_units(&self, t_ns: u64) -> i64 {
        let delta = t_ns.wrapping_sub(self.t_ns) as i64;
        if self.time_step_ns > 1 {
            // Wrapping: no resolution passed in can make it panic.
            delta.wrapping_div(self.time_step_ns as i64)
        } else {
            delta
        }
    }

    /// A time written by [`DeltaState::put_time`], in nanoseconds.
    #[inline]
    fn read_time(&self, cursor: &mut Cursor<'_>) -> Result<u64, DecodeError> {
        Ok(cursor.u64()?.wrapping_mul(self.time_unit()))
    }

    /// The time a delta written by [`DeltaState::put_time_delta`] leads to, in nanoseconds.
    #[inline(always)]
    fn read_time_delta(&self, cursor: &mut Cursor<'_>) -> Result<u64, DecodeError> {
        let units = cursor.i64()? as u64;
        Ok(self.t_ns.wrapping_add(units.wrapping_mul(self.time_unit())))
    }

    /// Appends `record` to `out`.
    pub fn encode(&mut self, record: &Record, out: &mut Vec<u8>) {
        match record {
            Record::Event(event) => self.encode_event(event, out),
            Record::MemInfo(info) => {
                out.push(TAG_MEM_INFO);
                self.put_time(out, info.t_ns);
                put_i64(out, i64::from(info.device));
                put_u64(out, info.free);
                put_u64(out, info.total);
            }
            Record::ThreadName(thread) => {
                out.push(TAG_THREAD_NAME);
                put_u64(out, u64::from(thread.thread));
                put_bytes(out, thread.name.as_bytes());
            }
            Record::Stack(stack) => {
                out.push(TAG_STACK);
                put_u64(out, u64::from(stack.id));
                put_u64(out, stack.frames.len() as u64);
                // Neighbouring frames often lie in the same object: store differences.
                let mut previous = 0u64;
                for frame in &stack.frames {
                    match *frame {
                        Frame::Native(ip) => {
                            put_u64(out, FRAME_NATIVE);
                            put_i64(out, ip.wrapping_sub(previous) as i64);
                            previous = ip;
                        }
                        Frame::Python {
                            code,
                            offset,
                            entry,
                        } => {
                            put_u64(
                                out,
                                if entry {
                                    FRAME_PYTHON_ENTRY
                                } else {
                                    FRAME_PYTHON
                                },
                            );
                            put_u64(out, u64::from(code));
                            put_u64(out, u64::from(offset));
                        }
                    }
                }
            }
            Record::Module(module) => {
                out.push(TAG_MODULE);
                put_bytes(out, module.path.as_bytes());
                if self.absolute_modules {
                    put_u64(out, module.load_bias);
                    put_u64(out, module.start);
                    put_u64(out, module.end);
                } else {
                    // A shared object's load bias is its start, and its range is short: one
                    // address in full, not three.
                    put_u64(out, module.start);
                    put_u64(out, module.end.wrapping_sub(module.start));
                    put_i64(out, module.start.wrapping_sub(module.load_bias) as i64);
                }
                put_bytes(out, &module.build_id);
            }
            Record::Dropped(dropped) => {
                out.push(TAG_DROPPED);
                self.put_time(out, dropped.t_ns);
                put_u64(out, dropped.count);
            }
            Record::Note(note) => {
                out.push(TAG_NOTE);
                self.put_time(out, note.t_ns);
                put_bytes(out, note.text.as_bytes());
            }
            Record::Mark(mark) => {
                out.push(TAG_MARK);
                self.put_time(out, mark.t_ns);
                put_u64(out, u64::from(mark.thread));
                put_bytes(out, mark.text.as_bytes());
            }
            Record::Exit(exit) => {
                out.push(TAG_EXIT);
                self.put_time(out, exit.t_ns);
            }
            Record::DumpBegin(dump) => {
                out.push(TAG_DUMP_BEGIN);
                self.put_time(out, dump.t_ns);
                put_bytes(out, dump.reason.as_bytes());
                put_u64(out, dump.events_discarded);
                put_u64(out, dump.live_count);
                put_u64(out, dump.window_count);
            }
            Record::Code(code) => {
                out.push(TAG_CODE);
                put_u64(out, u64::from(code.id));
                put_u64(out, u64::from(code.python));
                put_bytes(out, code.filename.as_bytes());
                put_bytes(out, code.qualname.as_bytes());
                put_u64(out, u64::from(code.first_line));
                put_bytes(out, &code.line_table);
            }
        }
    }

    /// Appends `event`'s record to `out` (in full, or as a repeat of a recent one).
    #[inline]
    pub(crate) fn encode_event(&mut self, event: &Event, out: &mut Vec<u8>) {
        let t_ns = self.time(event.t_ns);
        if let Some(slot) = self.repeated_slot(event) {
            if t_ns == self.t_ns {
                out.push(TAG_REPEAT_SAME_TIME + slot as u8);
            } else {
                out.push(TAG_REPEAT + slot as u8);
                self.put_time_delta(out, t_ns);
            }
            self.follow(event);
            self.t_ns = t_ns;
            return;
        }
        self.remember(event);
        let time_delta = self.time_delta_units(t_ns);
        let (last_addr, last_size) = (self.addr, self.size);
        let thread_written = event.thread != self.thread || self.thread == NO_THREAD;
        let device_written = event.device != self.device;
        // Written in place at the payload's end (see `Room`); each flag is set where its field
        // is written, and the flags byte goes in last.
        append(out, |record| {
            let mut flags = 0;
            // The tag, and a zero where the flags go.
            record.put_word(u64::from(TAG_EVENT + event.kind as u8), 2);
            record.put_u64(u64::from(event.api));
            record.put_i64(time_delta);
            if thread_written {
                flags |= F_THREAD;
                record.put_u64(u64::from(event.thread));
            }
            if device_written {
                flags |= F_DEVICE;
                record.put_i64(i64::from(event.device));
            }
            if event.addr != 0 {
                flags |= F_ADDR;
                record.put_i64(event.addr.wrapping_sub(last_addr) as i64);
            }
            // Sizes repeat a lot (same tensor shapes): a repeated size costs one byte.
            record.put_i64(event.size.wrapping_sub(last_size) as i64);
            if event.stream != 0 {
                flags |= F_STREAM;
                record.put_u64(event.stream);
            }
            if event.handle != 0 {
                flags |= F_HANDLE;
                record.put_u64(event.handle);
            }
            if event.result != 0 {
                flags |= F_RESULT;
                record.put_u64(u64::from(event.result));
            }
            if let Some((free, total)) = event.mem_info {
                flags |= F_MEM_INFO;
                record.put_u64(free);
                record.put_u64(total);
            }
            if event.stack != 0 {
                flags |= F_STACK;
                record.put_u64(u64::from(event.stack));
            }
            record.set(1, flags);
        });
        if event.addr != 0 {
            self.addr = event.addr;
        }
        self.size = event.size;
        self.t_ns = t_ns;
        self.thread = event.thread;
        self.device = event.device;
    }

    /// The first slot of the recent events that `event` repeats (every field the same but
    /// the time), if any. The addresses, which differ most often, are compared first, all of
    /// them at once: most events written in full match none, and cost no more.
    #[inline(always)]
    fn repeated_slot(&self, event: &Event) -> Option<usize> {
        let mut candidates = 0u32;
        for (slot, recent) in self.recent.iter().enumerate() {
            candidates |= u32::from(recent.addr == event.addr) << slot;
        }
        candidates &= (1u32 << self.recent_filled) - 1;
        while candidates != 0 {
            let slot = candidates.trailing_zeros() as usize;
            if same_but_time(&self.recent[slot], event) {
                return Some(slot);
            }
            candidates &= candidates - 1;
        }
        None
    }

    /// Moves the delta state on past `event`, as writing it in full would.
    fn follow(&mut self, event: &Event) {
        self.t_ns = event.t_ns;
        self.thread = event.thread;
        self.device = event.device;
        if event.addr != 0 {
            self.addr = event.addr;
        }
        self.size = event.size;
    }

    /// Folds `event`, a `tensor_free`, into the `tensor_free_requested` written in full as the
    /// last `first_len` bytes of `out` (the last event encoded, so the last one kept): when it
    /// is the same block's (every field the same but its kind, its time, not earlier, and its
    /// stack, none), that record becomes a [`TAG_FREE_PAIR`] with the time between them, and
    /// the state moves on as writing `event` in full would have moved it. False, nothing
    /// written, otherwise.
    #[inline]
    pub(crate) fn fold_free(&mut self, event: &Event, first_len: usize, out: &mut Vec<u8>) -> bool {
        let last = (usize::from(self.recent_next) + RECENT - 1) % RECENT;
        let first = &self.recent[last];
        let t_ns = self.time(event.t_ns);
        let Some(at) = out.len().checked_sub(first_len) else {
            return false;
        };
        if event.kind != EventKind::TensorFree
            || first.kind != EventKind::TensorFreeRequested
            || event.stack != 0
            || t_ns < self.t_ns
            || out[at] != TAG_FREE_REQUESTED
            || !same_block(first, event)
        {
            return false;
        }
        out[at] = TAG_FREE_PAIR;
        let units = self.units(t_ns - self.t_ns);
        put_u64(out, units);
        self.remember(event);
        self.t_ns = t_ns;
        true
    }

    /// Keeps `event` (about to be written in full) for later repeats.
    #[inline(always)]
    fn remember(&mut self, event: &Event) {
        let next = usize::from(self.recent_next);
        self.recent[next] = *event;
        self.recent_next = ((next + 1) % RECENT) as u8;
        self.recent_filled = self.recent_filled.max(next as u8 + 1);
    }

    /// Reads the next record from `cursor` into `out`, overwriting it: an event is decoded in
    /// place (a replay reads millions; each copy of a record costs), other records replace
    /// `out`. On an error `out` holds anything.
    #[inline(always)]
    pub fn decode_into(
        &mut self,
        cursor: &mut Cursor<'_>,
        out: &mut Record,
    ) -> Result<(), DecodeError> {
        let tag = cursor.u8()?;
        // The usual record of a loop, a repeat with its time, first.
        if tag.wrapping_sub(TAG_REPEAT) < RECENT as u8
            && let Record::Event(event) = out
        {
            return self.repeat_into(usize::from(tag - TAG_REPEAT), false, cursor, event);
        }
        if tag < TAG_REPEAT || (tag >= TAG_REPEAT + RECENT as u8 && tag < TAG_EVENT) {
            cursor.pos -= 1;
            *out = self.decode(cursor)?;
            return Ok(());
        }
        if !matches!(out, Record::Event(_)) {
            *out = Record::Event(Event::default());
        }
        let Record::Event(event) = out else {
            unreachable!("just made an event");
        };
        if tag >= TAG_RUN {
            self.decode_run_into(tag, cursor, event)?;
        } else if tag >= TAG_REPEAT_SAME_TIME {
            self.decode_repeat_into(tag, cursor, event)?;
        } else if self.runs_again && is_run_again(tag) {
            self.decode_run_into(tag, cursor, event)?;
        } else if tag == TAG_FREE_PAIR && self.free_pairs {
            self.decode_pair_into(cursor, event)?;
        } else if tag >= TAG_EVENT {
            let kind =
                EventKind::from_code(tag - TAG_EVENT).ok_or(DecodeError("unknown record tag"))?;
            self.decode_event_into(kind, cursor, event)?;
            self.remember(event);
        } else {
            self.decode_repeat_into(tag, cursor, event)?;
        }
        Ok(())
    }

    /// The event that the record at the start of `bytes` repeats, when that record is a
    /// repeat that [`DeltaState::decode_into`] would decode (its slot filled, its time delta
    /// whole), without reading it: a replay's look-ahead at the next event. None for anything
    /// else, and within a run (whose records come from its run record).
    #[inline(always)]
    pub fn peek_repeat(&self, bytes: &[u8]) -> Option<&Event> {
        let (slot, timed) = self.repeat_at(bytes)?;
        if timed {
            let mut cursor = Cursor::new(bytes);
            cursor.pos = 1;
            cursor.i64().ok()?;
        }
        self.recent.get(slot)
    }

    /// Reads the record at the cursor when it is a repeat that decodes (as
    /// [`DeltaState::peek_repeat`] says), as [`DeltaState::decode_into`] would, without copying
    /// its event: the kept event it repeats takes the repeat's time and its slot is returned
    /// (see [`DeltaState::kept`]). None, the cursor left where it was, for anything else.
    #[inline(always)]
    pub fn read_repeat(&mut self, cursor: &mut Cursor<'_>) -> Option<usize> {
        let (slot, timed) = self.repeat_at(cursor.bytes.get(cursor.pos..)?)?;
        let mut after = Cursor {
            bytes: cursor.bytes,
            pos: cursor.pos + 1,
        };
        let t_ns = if timed {
            self.read_time_delta(&mut after).ok()?
        } else {
            self.t_ns
        };
        cursor.pos = after.pos;
        // The delta state follows as in `repeat_into` (a kept event's own time is read by
        // nothing but its repeats, which set it).
        let recent = self.recent.get_mut(slot)?;
        recent.t_ns = t_ns;
        self.t_ns = t_ns;
        self.thread = recent.thread;
        self.device = recent.device;
        if recent.addr != 0 {
            self.addr = recent.addr;
        }
        self.size = recent.size;
        Some(slot)
    }

    /// The event kept in `slot` (as [`DeltaState::read_repeat`] left it).
    #[inline(always)]
    pub fn kept(&self, slot: usize) -> Option<&Event> {
        self.recent.get(slot)
    }

    /// The slot of the event that the record at the start of `bytes` repeats, and whether a
    /// time delta follows its tag, when it is a repeat of a filled slot outside a run.
    #[inline(always)]
    fn repeat_at(&self, bytes: &[u8]) -> Option<(usize, bool)> {
        let &tag = bytes.first()?;
        if self.run_left != 0 {
            return None;
        }
        let (slot, timed) = if tag.wrapping_sub(TAG_REPEAT) < RECENT as u8 {
            (tag - TAG_REPEAT, true)
        } else if tag.wrapping_sub(TAG_REPEAT_SAME_TIME) < RECENT as u8 {
            (tag - TAG_REPEAT_SAME_TIME, false)
        } else {
            return None;
        };
        (slot < self.recent_filled).then_some((usize::from(slot), timed))
    }

    /// A repeat (`tag` in `TAG_REPEAT..` or `TAG_REPEAT_SAME_TIME..`) into `event`.
    #[inline(always)]
    fn decode_repeat_into(
        &mut self,
        tag: u8,
        cursor: &mut Cursor<'_>,
        event: &mut Event,
    ) -> Result<(), DecodeError> {
        let (slot, same_time) = if tag >= TAG_REPEAT_SAME_TIME {
            (usize::from(tag - TAG_REPEAT_SAME_TIME), true)
        } else {
            (usize::from(tag - TAG_REPEAT), false)
        };
        self.repeat_into(slot, same_time, cursor, event)
    }

    /// A repeat of the event kept in `slot` (below `RECENT`), at the time before it
    /// (`same_time`) or at the time delta the cursor is on, into `event`.
    #[inline(always)]
    fn repeat_into(
        &mut self,
        slot: usize,
        same_time: bool,
        cursor: &mut Cursor<'_>,
        event: &mut Event,
    ) -> Result<(), DecodeError> {
        if slot >= usize::from(self.recent_filled) {
            return Err(DecodeError("repeat of an event not in the chunk"));
        }
        let t_ns = if same_time {
            self.t_ns
        } else {
            self.read_time_delta(cursor)?
        };
        // The delta state follows the kept event, not the copy just stored: reading fields
        // back from that copy waited on its stores.
        let recent = &self.recent[slot];
        *event = *recent;
        event.t_ns = t_ns;
        self.t_ns = t_ns;
        self.thread = recent.thread;
        self.device = recent.device;
        if recent.addr != 0 {
            self.addr = recent.addr;
        }
        self.size = recent.size;
        Ok(())
    }

    /// The next event of the [`TAG_FREE_PAIR`] record the cursor is on (its tag read), into
    /// `event`: its `tensor_free_requested` first, the cursor left on the record; then its
    /// `tensor_free`, the cursor moved past it.
    fn decode_pair_into(
        &mut self,
        cursor: &mut Cursor<'_>,
        event: &mut Event,
    ) -> Result<(), DecodeError> {
        if self.pair_end != 0 {
            // The second event: the first (the last event kept) as the block's free.
            let last = (usize::from(self.recent_next) + RECENT - 1) % RECENT;
            *event = self.recent[last];
            event.kind = EventKind::TensorFree;
            event.stack = 0;
            event.t_ns = self.pair_t_ns;
            self.remember(event);
            self.t_ns = self.pair_t_ns;
            cursor.pos = self.pair_end;
            self.pair_end = 0;
            return Ok(());
        }
        let at = cursor.pos - 1;
        self.decode_event_into(EventKind::TensorFreeRequested, cursor, event)?;
        self.remember(event);
        let units = cursor.u64()?;
        self.pair_t_ns = event
            .t_ns
            .wrapping_add(units.wrapping_mul(self.time_unit()));
        self.pair_end = cursor.pos;
        cursor.pos = at;
        Ok(())
    }

    /// The next record of the run whose record (tag `tag`) the cursor is on, into `event`.
    /// The cursor stays on the run record until its last record is read.
    fn decode_run_into(
        &mut self,
        tag: u8,
        cursor: &mut Cursor<'_>,
        event: &mut Event,
    ) -> Result<(), DecodeError> {
        let at = cursor.pos - 1;
        let again = tag < TAG_REPEAT_SAME_TIME;
        let phase = if again {
            usize::from(tag - TAG_RUN_AGAIN)
        } else {
            0
        };
        let period = if again {
            usize::from(self.last_period)
        } else {
            usize::from(tag - TAG_RUN) + 1
        };
        if period == 0 {
            return Err(DecodeError("run of the last cycle with no run before it"));
        }
        if phase >= period {
            return Err(DecodeError("run of the last cycle from past its end"));
        }
        let count = if again {
            // The count's difference from the last such run's (a loop's steps hold about as
            // many records each): read again at each record, used at the first only.
            let difference = cursor.i64()?;
            if self.run_left == 0 {
                u32::try_from(i64::from(self.last_again_count).wrapping_add(difference))
                    .map_err(|_| DecodeError("run of the last cycle with a count out of range"))?
            } else {
                0
            }
        } else {
            cursor.u32()?
        };
        if self.run_left == 0 {
            if again {
                self.last_again_count = count;
            }
            if count == 0 {
                return Err(DecodeError("empty run of records"));
            }
            if count > MAX_RUN_RECORDS - self.run_records {
                return Err(DecodeError("runs of records longer than a chunk holds"));
            }
            self.run_records += count;
            self.run_left = count;
            self.run_done = 0;
        }
        let repeat = if again {
            self.last_cycle[(phase + self.run_done as usize) % period]
        } else {
            let Some(cycle) = at.checked_sub(period).map(|start| &cursor.bytes[start..at]) else {
                return Err(DecodeError("run of records not in the chunk"));
            };
            if self.runs_again && self.run_done == 0 {
                self.last_cycle[..period].copy_from_slice(cycle);
                self.last_period = period as u8;
            }
            cycle[self.run_done as usize % period]
        };
        if !(TAG_REPEAT_SAME_TIME..TAG_REPEAT_SAME_TIME + RECENT as u8).contains(&repeat) {
            return Err(DecodeError("run of records that are not same-time repeats"));
        }
        self.run_done += 1;
        self.run_left -= 1;
        if self.run_left > 0 {
            cursor.pos = at;
        }
        self.decode_repeat_into(repeat, cursor, event)
    }

    /// Reads the next record from `cursor`.
    pub fn decode(&mut self, cursor: &mut Cursor<'_>) -> Result<Record, DecodeError> {
        let tag = cursor.u8()?;
        if tag >= TAG_RUN || (self.runs_again && is_run_again(tag)) {
            let mut event = Event::default();
            self.decode_run_into(tag, cursor, &mut event)?;
            return Ok(Record::Event(event));
        }
        if tag == TAG_FREE_PAIR && self.free_pairs {
            let mut event = Event::default();
            self.decode_pair_into(cursor, &mut event)?;
            return Ok(Record::Event(event));
        }
        let repeat = (TAG_REPEAT..TAG_REPEAT + RECENT as u8).contains(&tag)
            || (TAG_REPEAT_SAME_TIME..TAG_REPEAT_SAME_TIME + RECENT as u8).contains(&tag);
        if tag >= TAG_EVENT && !repeat {
            let kind =
                EventKind::from_code(tag - TAG_EVENT).ok_or(DecodeError("unknown record tag"))?;
            let mut event = Event::default();
            self.decode_event_into(kind, cursor, &mut event)?;
            self.remember(&event);
            return Ok(Record::Event(event));
        }
        if repeat {
            let mut event = Event::default();
            self.decode_repeat_into(tag, cursor, &mut event)?;
            return Ok(Record::Event(event));
        }
        Ok(match tag {
            TAG_MEM_INFO => Record::MemInfo(MemInfo {
                t_ns: self.read_time(cursor)?,
                device: device_from(cursor.i64()?)?,
                free: cursor.u64()?,
                total: cursor.u64()?,
            }),
            TAG_THREAD_NAME => Record::ThreadName(ThreadName {
                thread: cursor.u32()?,
                name: cursor.string()?,
            }),
            TAG_STACK => {
                let id = cursor.u32()?;
                let count = cursor.u64()?;
                // Each frame takes at least two bytes: refuse counts the chunk cannot hold.
                if count > (cursor.bytes.len() - cursor.pos) as u64 / 2 {
                    return Err(DecodeError("stack frame count exceeds chunk"));
                }
                let mut frames = Vec::with_capacity(count as usize);
                let mut previous = 0u64;
                for _ in 0..count {
                    match cursor.u64()? {
                        FRAME_NATIVE => {
                            previous = previous.wrapping_add(cursor.i64()? as u64);
                            frames.push(Frame::Native(previous));
                        }
                        kind @ (FRAME_PYTHON | FRAME_PYTHON_ENTRY) => frames.push(Frame::Python {
                            code: cursor.u32()?,
                            offset: cursor.u32()?,
                            entry: kind == FRAME_PYTHON_ENTRY,
                        }),
                        _ => return Err(DecodeError("unknown frame type")),
                    }
                }
                Record::Stack(StackDef { id, frames })
            }
            TAG_MODULE => {
                let path = cursor.string()?;
                let (load_bias, start, end) = if self.absolute_modules {
                    (cursor.u64()?, cursor.u64()?, cursor.u64()?)
                } else {
                    let start = cursor.u64()?;
                    let end = start.wrapping_add(cursor.u64()?);
                    (start.wrapping_sub(cursor.i64()? as u64), start, end)
                };
                Record::Module(ModuleDef {
                    path,
                    load_bias,
                    start,
                    end,
                    build_id: cursor.bytes()?.to_vec(),
                })
            }
            TAG_DROPPED => Record::Dropped(Dropped {
                t_ns: self.read_time(cursor)?,
                count: cursor.u64()?,
            }),
            TAG_NOTE => Record::Note(Note {
                t_ns: self.read_time(cursor)?,
                text: cursor.string()?,
            }),
            TAG_MARK => Record::Mark(Mark {
                t_ns: self.read_time(cursor)?,
                thread: cursor.u32()?,
                text: cursor.string()?,
            }),
            TAG_EXIT => Record::Exit(Exit {
                t_ns: self.read_time(cursor)?,
            }),
            TAG_DUMP_BEGIN => Record::DumpBegin(DumpBegin {
                t_ns: self.read_time(cursor)?,
                reason: cursor.string()?,
                events_discarded: cursor.u64()?,
                live_count: cursor.u64()?,
                window_count: cursor.u64()?,
            }),
            TAG_CODE => Record::Code(CodeDef {
                id: cursor.u32()?,
                python: u16::try_from(cursor.u64()?)
                    .map_err(|_| DecodeError("python version out of range"))?,
                filename: cursor.string()?,
                qualname: cursor.string()?,
                first_line: cursor.u32()?,
                line_table: cursor.bytes()?.to_vec(),
            }),
            _ => return Err(DecodeError("unknown record tag")),
        })
    }

    /// An event's fields after its tag, into `event` (every field written).
    #[inline]
    fn decode_event_into(
        &mut self,
        kind: EventKind,
        cursor: &mut Cursor<'_>,
        event: &mut Event,
    ) -> Result<(), DecodeError> {
        let flags = cursor.u8()?;
        event.kind = kind;
        event.api = u16::try_from(cursor.u64()?).map_err(|_| DecodeError("api index too large"))?;
        event.t_ns = self.read_time_delta(cursor)?;
        event.thread = if flags & F_THREAD != 0 {
            cursor.u32()?
        } else {
            self.thread
        };
        event.device = if flags & F_DEVICE != 0 {
            device_from(cursor.i64()?)?
        } else {
            self.device
        };
        event.addr = if flags & F_ADDR != 0 {
            self.addr = self.addr.wrapping_add(cursor.i64()? as u64);
            self.addr
        } else {
            0
        };
        event.size = self.size.wrapping_add(cursor.i64()? as u64);
        self.size = event.size;
        event.stream = if flags & F_STREAM != 0 {
            cursor.u64()?
        } else {
            0
        };
        event.handle = if flags & F_HANDLE != 0 {
            cursor.u64()?
        } else {
            0
        };
        event.result = if flags & F_RESULT != 0 {
            cursor.u32()?
        } else {
            0
        };
        event.mem_info = if flags & F_MEM_INFO != 0 {
            Some((cursor.u64()?, cursor.u64()?))
        } else {
            None
        };
        event.stack = if flags & F_STACK != 0 {
            cursor.u32()?
        } else {
            0
        };
        self.t_ns = event.t_ns;
        self.thread = event.thread;
        self.device = event.device;
        Ok(())
    }
}

#[cfg(test)]
mod encode_tests;

/// Whether `tag` is a run record's ([`TAG_RUN`] or [`TAG_RUN_AGAIN`]), in a log that has them.
pub(crate) fn is_run(tag: u8) -> bool {
    tag >= TAG_RUN || is_run_again(tag)
}

/// Whether `tag` is a [`TAG_RUN_AGAIN`] record's.
#[inline]
fn is_run_again(tag: u8) -> bool {
    (TAG_RUN_AGAIN..TAG_RUN_AGAIN + MAX_RUN_PERIOD as u8).contains(&tag)
}

/// Whether `a` and `b` differ at most in their times: the same block's (the address, which
/// differs most often, first), then the kind and the stack.
fn same_but_time(a: &Event, b: &Event) -> bool {
    same_block(a, b) && a.kind == b.kind && a.stack == b.stack
}

/// Whether `a` and `b` are the same block's events: every field but the kind, the time and
/// the stack the same. Every field is named, so a new one cannot be forgotten here (nor in
/// [`same_but_time`]).
fn same_block(a: &Event, b: &Event) -> bool {
    let Event {
        kind: _,
        api,
        t_ns: _,
        thread,
        device,
        stream,
        addr,
        size,
        handle,
        result,
        stack: _,
        mem_info,
    } = *a;
    addr == b.addr
        && size == b.size
        && thread == b.thread
        && api == b.api
        && device == b.device
        && stream == b.stream
        && handle == b.handle
        && result == b.result
        && mem_info == b.mem_info
}

fn device_from(value: i64) -> Result<i32, DecodeError> {
    i32::try_from(value).map_err(|_| DecodeError("device ordinal out of range"))
}

/// The most bytes one event record takes: its tag and flags, its api (a `u16`), its time delta,
/// thread, device, address and size deltas, stream, handle, result, the two words of memory
/// and its stack, each a LEB128 of at most 10 bytes (5 for a `u32`, 3 for a `u16`).
const MAX_EVENT_BYTES: usize = 2 + 3 + 10 + 5 + 10 + 10 + 10 + 10 + 10 + 5 + 20 + 5;
// An event record fits the room it is written in (see `Room`).
const _: () = assert!(MAX_EVENT_BYTES <= ROOM_RECORD);

/// The encoder's side of runs ([`TAG_RUN`]): watches the records appended to a chunk's payload
/// and gathers a cycle of one-byte same-time repeats that comes round again into one run
/// record.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RunWriter {
    /// One-byte same-time repeats written last, in a row, at the payload's end.
    plain: usize,
    /// The period of the run being gathered (0: none); its cycle is the payload's last
    /// `period` bytes.
    period: usize,
    /// Records of the run being gathered (not in the payload).
    count: u32,
    /// Records every run record of this chunk stands for.
    expanded: u32,
    /// Bytes the chunk's runs saved: records counted as written plainly, one byte each, less
    /// the run records.
    saved: usize,
    /// The run being gathered repeats `last` (a [`TAG_RUN_AGAIN`] record), not the bytes
    /// before it.
    again: bool,
    /// The record of `last` that run starts from.
    phase: usize,
    /// The cycle of the last run record written since the last key chunk (its first
    /// `last_period` bytes; 0: none), as the decoder keeps it.
    last: [u8; MAX_RUN_PERIOD],
    last_period: usize,
    /// The count of the last [`TAG_RUN_AGAIN`] record written since the last key chunk.
    last_again_count: u32,
}

impl RunWriter {
    /// The writer for the next chunk: a key chunk's forgets the last run's cycle; a continued
    /// chunk's keeps it, as its decoder does.
    pub(crate) fn next_chunk(&self, key: bool) -> RunWriter {
        let mut next = RunWriter::default();
        if !key {
            next.last = self.last;
            next.last_period = self.last_period;
            next.last_again_count = self.last_again_count;
        }
        next
    }

    /// Bytes the payload would hold with every run written plainly.
    pub(crate) fn saved(&self) -> usize {
        self.saved + self.count as usize
    }

    /// A record was appended to `payload` from `start` on: the record joins the run being
    /// gathered, or ends it (the run is then written before the record), or starts one.
    #[inline]
    pub(crate) fn after_record(&mut self, payload: &mut Vec<u8>, start: usize) {
        // Most records are neither in a run nor a one-byte repeat that may start one.
        if self.period == 0 && payload.len() != start + 1 {
            self.plain = 0;
            return;
        }
        self.after_short_record(payload, start);
    }

    /// [`RunWriter::after_record`] with a run being gathered or a one-byte record.
    #[inline(never)]
    fn after_short_record(&mut self, payload: &mut Vec<u8>, start: usize) {
        let repeat = (payload.len() == start + 1)
            .then(|| payload[start])
            .filter(|tag| {
                (TAG_REPEAT_SAME_TIME..TAG_REPEAT_SAME_TIME + RECENT as u8).contains(tag)
            });
        if self.period != 0 {
            let at = self.count as usize % self.period;
            let expected = if self.again {
                self.last[(self.phase + self.count as usize) % self.period]
            } else {
                payload[start - self.period + at]
            };
            if repeat == Some(expected) && self.expanded + self.count < MAX_RUN_RECORDS {
                payload.pop();
                self.count += 1;
                return;
            }
            // The run goes before the record just appended.
            let (bytes, len) = self.end_at(payload, start);
            payload.extend_from_slice(&bytes[..len]);
            payload[start..].rotate_right(len);
        }
        let Some(repeat) = repeat else {
            self.plain = 0;
            return;
        };
        // The first one-byte repeat after something else, and one of the last run's cycle: a
        // loop's next time step; its records may repeat that cycle.
        let phase = self.last[..self.last_period]
            .iter()
            .position(|tag| *tag == repeat);
        if self.plain == 0
            && self.expanded < MAX_RUN_RECORDS
            && let Some(phase) = phase
        {
            payload.pop();
            self.period = self.last_period;
            self.again = true;
            self.phase = phase;
            self.count = 1;
            return;
        }
        // The record's position in its own bytes' terms, after whatever the run became.
        let at = payload.len() - 1;
        let known = self.plain.min(MAX_RUN_PERIOD);
        if let Some(period) = (1..=known).find(|back| payload[at - back] == repeat) {
            payload.pop();
            self.period = period;
            self.count = 1;
        } else {
            self.plain += 1;
        }
    }

    /// Writes the run being gathered, if any, at the payload's end: plainly when that is as
    /// short.
    pub(crate) fn end(&mut self, payload: &mut Vec<u8>) {
        let (bytes, len) = self.end_at(payload, payload.len());
        payload.extend_from_slice(&bytes[..len]);
    }

    /// Ends the run being gathered, whose cycle ends at `at` in `payload`: the bytes that
    /// stand for it (at most a tag and a count).
    fn end_at(&mut self, payload: &[u8], at: usize) -> ([u8; 11], usize) {
        let mut bytes = [0u8; 11];
        if self.period == 0 {
            return (bytes, 0);
        }
        let mut cycle = [0u8; MAX_RUN_PERIOD];
        if self.again {
            for (at, tag) in cycle[..self.period].iter_mut().enumerate() {
                *tag = self.last[(self.phase + at) % self.period];
            }
        } else {
            cycle[..self.period].copy_from_slice(&payload[at - self.period..at]);
        }
        let count = self.count as usize;
        // The run record: its tag, then its count (a run of the last cycle: the count's
        // difference from the last one's, zigzag).
        let mut value = if self.again {
            let difference = i64::from(self.count) - i64::from(self.last_again_count);
            ((difference << 1) ^ (difference >> 63)) as u64
        } else {
            u64::from(self.count)
        };
        let mut len = 1;
        while value >= 0x80 {
            bytes[len] = (value as u8) | 0x80;
            value >>= 7;
            len += 1;
        }
        bytes[len] = value as u8;
        len += 1;
        let len = if count <= 2 || len >= count {
            // As short written plainly.
            for done in 0..count {
                bytes[done] = cycle[done % self.period];
            }
            self.plain += count;
            count
        } else {
            if self.again {
                bytes[0] = TAG_RUN_AGAIN + self.phase as u8;
                self.last_again_count = self.count;
            } else {
                bytes[0] = TAG_RUN + (self.period - 1) as u8;
                self.last = cycle;
                self.last_period = self.period;
            }
            self.saved += count - len;
            self.expanded += self.count;
            self.plain = 0;
            len
        };
        self.period = 0;
        self.count = 0;
        self.again = false;
        (bytes, len)
    }
}
