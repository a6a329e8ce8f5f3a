//! `vramshim export LOG... --pytorch-snapshot`: the recording as a memory snapshot for
//! PyTorch's memory viewer (pytorch.org/memory_viz), streamed to a file. The other formats
//! (`--pprof`, `--speedscope`, `--chrome-trace`, `--parquet`) are in [`export_formats`].
//!
//! A first replay counts the trace entries of each device (and checks that no two processes
//! share a device ordinal); then one replay per device writes that device's entries, the last
//! `--max-events` of them, straight into the file, frames resolved as they come and cached
//! per stack. Memory stays bounded by what is live and by the number of distinct stacks.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;

use rustc_hash::FxHashMap;
use vramshim_format::EventKind;

use crate::Failure;
use crate::analysis::groups::Stacks;
use crate::analysis::trace::{Census, Entry, Sink, Trace, viewer_addr};
use crate::commands::common::{self, SegmentsArg, StacksArg};
use crate::commands::export_formats::{self, Inuse};
use crate::render::pytorch::{
    Block, JsonWriter, PickleWriter, Segment, Setting, SnapshotWriter, write_entry, write_segment,
    write_settings,
};
use crate::replay::{self, BlockState, Process, StackTable, Stop};
use crate::symbols::SymFrame;

/// Trace entries kept per device by default: PyTorch's viewer becomes unusably slow past
/// about 600,000.
pub const DEFAULT_MAX_EVENTS: u64 = 500_000;

/// The longest string Chrome's JavaScript engine makes (2^28 - 16 characters, with pointer
/// compression); the viewer decodes a whole JSON file into one string.
const BROWSER_TEXT_MAX: u64 = (1 << 28) - 16;

/// Device ordinals above this are taken for damage: the document needs a list per ordinal.
const MAX_DEVICE: i32 = 1023;

/// The allocator settings PyTorch reads, as the log headers recorded them.
const SETTINGS_ENV: [&str; 3] = [
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
];

#[derive(clap::Args)]
pub struct Args {
    /// Log(s) to read; several logs of one job are merged in time order (each device
    /// ordinal must then belong to one process).
    #[arg(required = true, value_name = "LOG")]
    pub logs: Vec<PathBuf>,
    /// Write a memory snapshot for PyTorch's memory viewer (pytorch.org/memory_viz, or
    /// torch/cuda/_memory_viz.py): PyTorch's segments, their blocks and its own trace where
    /// its allocator's tracker recorded them; every other device allocation the recorder saw,
    /// NCCL, cuBLAS and cudaMallocAsync memory included, is a segment holding one block;
    /// failed allocations are `oom` entries. -o, --pickle and --max-events shape it.
    #[arg(long)]
    pytorch_snapshot: bool,
    /// Write a pprof profile (gzipped profile.proto) to FILE, for `go tool pprof`: per stack
    /// alloc_objects/alloc_space (allocated over the run) and inuse_objects/inuse_space
    /// (see --inuse; the default sample type), each sample labelled with its device.
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,
    /// Write a speedscope profile (JSON) to FILE: per device, one profile of the bytes
    /// allocated over the run and one of the bytes in use (see --inuse), by stack.
    #[arg(long, value_name = "FILE")]
    pub speedscope: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace (Trace Event Format JSON) to FILE: per process, a
    /// counter per device of live bytes and of the device's used memory, an instant event
    /// per failed allocation and per note, process and thread names.
    #[arg(long, value_name = "FILE")]
    pub chrome_trace: Option<PathBuf>,
    /// Write every event as a row of a Parquet file (for DuckDB and other Parquet readers): t_ns, pid,
    /// thread, event, api, device, addr, size, stream, handle, result, stack.
    #[arg(long, value_name = "FILE")]
    pub parquet: Option<PathBuf>,
    /// What the in-use bytes of --pprof and --speedscope are: live at each device's peak, or
    /// still live at the end of the log(s).
    #[arg(long, value_enum, default_value_t = Inuse::Peak)]
    pub inuse: Inuse,
    /// The snapshot's output file (default: `vramshim-snapshot.json` here,
    /// `vramshim-snapshot.pickle` with --pickle). Every output is written under a temporary
    /// name and renamed when complete.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// A protocol-2 pickle, as `torch.cuda.memory._dump_snapshot()` writes, instead of JSON:
    /// each stack's frames are stored once (JSON repeats them per entry), so it is usually
    /// many times smaller; also for viewers older than JSON support and for
    /// `python -m torch.cuda._memory_viz`.
    #[arg(long)]
    pickle: bool,
    /// Only this device ordinal (as the process numbered it; -1 = pinned host memory, which
    /// the snapshot never holds: the viewer shows device memory).
    #[arg(long, allow_hyphen_values = true)]
    pub device: Option<i32>,
    #[command(flatten)]
    pub view: StacksArg,
    /// For logs recorded with PyTorch's allocator tracker: count its segments, as the driver
    /// handed them out (each a segment of one block), instead of its tensors (the real
    /// blocks inside each segment, and PyTorch's own trace entries). Applies to every format.
    #[command(flatten)]
    pub segments: SegmentsArg,
    /// Trace entries kept per device: the last N (an allocation is 2 entries, its free 3, a
    /// failure 1); older ones are left out and said so. The viewer becomes unusably slow past
    /// about 600,000 entries. 0 keeps every entry.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_EVENTS)]
    max_events: u64,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let others = [
        args.pprof.is_some(),
        args.speedscope.is_some(),
        args.chrome_trace.is_some(),
        args.parquet.is_some(),
    ];
    if !args.pytorch_snapshot && !others.contains(&true) {
        return Err(Failure::input(
            "nothing to export: give --pytorch-snapshot, --pprof FILE, --speedscope FILE, \
             --chrome-trace FILE and/or --parquet FILE",
        ));
    }
    if !args.pytorch_snapshot && (args.output.is_some() || args.pickle) {
        return Err(Failure::input(
            "-o and --pickle apply to --pytorch-snapshot; the other formats take their file \
             after their flag",
        ));
    }
    if args.pytorch_snapshot {
        snapshot(&args)?;
    }
    export_formats::run(&args)?;
    Ok(ExitCode::SUCCESS)
}

/// The PyTorch snapshot.
fn snapshot(args: &Args) -> Result<(), Failure> {
    if let Some(device) = args.device {
        if device < 0 {
            return Err(Failure::input(format!(
                "--device {device}: PyTorch's memory viewer shows device memory only; pick a device ordinal"
            )));
        }
        if device > MAX_DEVICE {
            return Err(Failure::input(format!(
                "--device {device}: device ordinals above {MAX_DEVICE} are not exported"
            )));
        }
    }
    let path = args.output.clone().unwrap_or_else(|| {
        PathBuf::from(if args.pickle {
            "vramshim-snapshot.pickle"
        } else {
            "vramshim-snapshot.json"
        })
    });

    // Pass 1: how many entries each device has, and whose.
    let mut census = Trace::new(args.device, Census::default());
    let mut replay = replay::run_view(
        &args.logs,
        &mut [&mut census],
        Stop::End,
        args.segments.view(),
    )?;
    census.finish(replay.end_ns, &replay.processes);
    let processes = &replay.processes;
    for (device, (_, owners)) in &census.sink.devices {
        if owners.len() > 1 {
            let pids: Vec<String> = owners
                .iter()
                .filter_map(|p| processes.get(*p as usize))
                .map(|p| p.header.pid.to_string())
                .collect();
            return Err(Failure::input(format!(
                "device {device} is used by {} processes (pids {}): the viewer tells allocations \
                 apart by address only, and addresses of different processes can coincide; \
                 export one log at a time, or pick a device one process owns with --device",
                owners.len(),
                pids.join(", ")
            )));
        }
    }

    let mut segments = live_segments(&replay, &census);
    segments.sort_by_key(|s| (s.device, s.address));

    let highest = census
        .sink
        .devices
        .keys()
        .copied()
        .chain(segments.iter().map(|s| s.device))
        .chain(args.device)
        .max();
    if let Some(device) = highest
        && device > MAX_DEVICE
    {
        return Err(Failure::input(format!(
            "device {device}: no GPU has that ordinal (the viewer needs a list for each one \
             below it); the log looks damaged"
        )));
    }
    let plan = Plan {
        counts: (0..highest.map_or(0, |d| d + 1))
            .map(|device| census.sink.devices.get(&device).map_or(0, |(c, _)| *c))
            .collect(),
        limit: if args.max_events == 0 {
            u64::MAX
        } else {
            args.max_events
        },
        segments,
    };

    let mut stacks = Stacks::new(processes, args.view.stacks, false);
    // The frames of the segments now, so that this replay's stack tables can go before the
    // device passes replay the logs again (with tables of their own).
    let mut segment_frames: SegmentFrames = FxHashMap::default();
    for segment in &plan.segments {
        let blocks = segment.blocks.iter().filter_map(|block| block.stack);
        for stack in std::iter::once(segment.stack).chain(blocks) {
            segment_frames
                .entry((segment.process, stack))
                .or_insert_with(|| stacks.frames(processes, segment.process, stack));
        }
    }
    for process in &mut replay.processes {
        process.stacks = StackTable::default();
    }
    let processes = &replay.processes;
    let mut output = Output::create(&path, args.pickle)?;
    let written = {
        let out = output
            .writer
            .as_deref_mut()
            .ok_or_else(|| output_failure(&path, io::Error::other("no writer")))?;
        write_snapshot(out, args, &plan, &segment_frames, &mut stacks, processes).map_err(
            |err| match err {
                Written::Io(err) => output_failure(&path, err),
                Written::Replay(failure) => failure,
            },
        )?
    };
    output.commit(&path)?;

    let mut warnings = common::warnings(&replay, None, &stacks);
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    if !args.pickle && size > BROWSER_TEXT_MAX {
        warnings.push(format!(
            "{} is {}: browsers cannot read text this long (Chrome's limit is {}), so the \
             viewer will fail to open it; --pickle stores each stack's frames once (usually \
             many times smaller), or lower --max-events",
            path.display(),
            crate::units::bytes(size),
            crate::units::bytes(BROWSER_TEXT_MAX)
        ));
    }
    for warning in &warnings {
        eprintln!("vramshim: warning: {warning}");
    }
    if census.host_allocations > 0 {
        eprintln!(
            "vramshim: note: {} pinned host allocation(s) left out: the viewer shows device memory only",
            census.host_allocations
        );
    }
    if census.unknown_device_allocations > 0 {
        eprintln!(
            "vramshim: note: {} allocation(s) on an unknown device left out",
            census.unknown_device_allocations
        );
    }
    for (device, &count) in plan.counts.iter().enumerate() {
        if count > plan.limit {
            eprintln!(
                "vramshim: note: device {device}: kept the last {} of {count} trace entries; \
                 the {} older ones are left out (--max-events)",
                plan.limit,
                count - plan.limit
            );
        }
    }
    for process in processes.iter() {
        let resolution_ns = process.header.time_resolution_ns;
        if process.dumps.len() > 1 && resolution_ns > 1 {
            // The trace finds where a later dump's window goes past what an earlier one gave
            // by time (`Resume`): within one step of the resolution it cannot tell.
            eprintln!(
                "vramshim: note: {}: its {} ring-mode dumps overlap, and the overlap is found by \
                 time, recorded at {} resolution: events within one step of an earlier dump's \
                 last event may be missing from the history or in it twice (record with \
                 VRAMSHIM_TIME_RESOLUTION=1ns for an exact one)",
                process.path.display(),
                process.dumps.len(),
                crate::units::resolution(resolution_ns)
            );
        }
    }
    if let Some(reported) = reported_as_blocks(args, processes) {
        eprintln!("vramshim: note: {reported}");
    }
    if plan.counts.is_empty() {
        eprintln!("vramshim: note: no device memory in the log(s): the snapshot is empty");
    } else if let Some(device) = args.device
        && plan.count(device) == 0
    {
        eprintln!("vramshim: note: nothing recorded on device {device}");
    }
    eprintln!(
        "vramshim: wrote {}: {written} trace entries over {} device(s), {} allocation(s) live at the end as segments",
        path.display(),
        plan.counts.len(),
        plan.segments.len()
    );
    Ok(())
}

/// What is live at the end as the snapshot's segments: in the tensor view PyTorch's segments
/// with their blocks, and every allocation outside its allocator as a segment of one block
/// (marked as outside when the process recorded tensors); in the driver view every allocation
/// as a segment of one block.
fn live_segments(replay: &replay::Replay, trace: &Trace<Census>) -> Vec<Segment> {
    let state = &replay.state;
    let pytorch = state
        .segments()
        .filter(|segment| trace.selects(segment.live.device))
        .map(|segment| {
            let live = &segment.live;
            let blocks = segment
                .blocks()
                .map(|(address, block)| {
                    let (state, stack) = match block.state {
                        BlockState::Allocated => ("active_allocated", Some(block.stack)),
                        BlockState::Pending => ("active_pending_free", Some(block.stack)),
                        BlockState::Free => ("inactive", None),
                    };
                    Block {
                        address,
                        size: block.size,
                        requested: block.requested,
                        state,
                        stack,
                    }
                })
                .collect();
            Segment {
                blocks,
                ..one_block(live, None)
            }
        });
    let others = state
        .live()
        .filter(|live| live.kind != EventKind::TensorAlloc && trace.selects(live.device))
        .map(|live| {
            let process = replay.processes.get(live.process as usize);
            let outside = process
                .filter(|p| p.tensor_allocs > 0)
                .map(|p| p.api(live.api).into_owned());
            one_block(live, outside)
        });
    pytorch.chain(others).collect()
}

/// What the snapshot cannot know of blocks taken from PyTorch 2.1's profiler report (see
/// [`Process::tensors_reported_as_blocks`]), when the export shows such blocks: said in the
/// document (`allocator_settings.vramshim_unknown`) and on stderr.
fn reported_as_blocks(args: &Args, processes: &[Process]) -> Option<String> {
    let pids: Vec<String> = processes
        .iter()
        .filter(|p| p.tensor_allocs > 0 && p.tensors_reported_as_blocks())
        .map(|p| p.header.pid.to_string())
        .collect();
    if pids.is_empty() || args.segments.segments {
        return None;
    }
    Some(format!(
        "PyTorch's blocks of pid {} come from its profiler report (PyTorch 2.1: no allocator \
         tracker), which gives no requested sizes, streams or oom entries: each block's \
         requested_size is its size (at least the bytes asked for), every stream is 0, a block \
         freed while still in use on another stream is inactive at once (never \
         active_pending_free), and each failed cudaMalloc is an oom entry (PyTorch's retry \
         after releasing its cache makes a second); re-record with PyTorch 2.2 or later for \
         requested sizes and streams",
        pids.join(", ")
    ))
}

/// `live` as a segment holding one block of its full size.
fn one_block(live: &replay::Live, outside: Option<String>) -> Segment {
    Segment {
        device: live.device,
        address: viewer_addr(live),
        size: live.size,
        stream: live.stream,
        process: live.process,
        stack: live.stack,
        blocks: Vec::new(),
        outside,
    }
}

/// Frames of the segments' stacks, by (process, stack id).
type SegmentFrames = FxHashMap<(u32, u32), Rc<[SymFrame]>>;

/// What the snapshot will hold, known after the first replay.
struct Plan {
    /// Trace entries per device ordinal, one for each list of `device_traces`.
    counts: Vec<u64>,
    /// Entries kept per device (`u64::MAX`: all).
    limit: u64,
    /// Allocations live at the end, by device and address.
    segments: Vec<Segment>,
}

impl Plan {
    fn count(&self, device: i32) -> u64 {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.counts.get(d))
            .copied()
            .unwrap_or(0)
    }
}

/// The wall-clock time (Unix ns) of replay time 0: the start of the earliest process.
pub fn replay_start_unix_ns(processes: &[Process]) -> u64 {
    processes
        .iter()
        .find(|p| p.start_offset_ns == 0)
        .or(processes.first())
        .map_or(0, |p| p.header.start_unix_ns)
}

/// Why writing the snapshot stopped.
enum Written {
    Io(io::Error),
    Replay(Failure),
}

impl From<io::Error> for Written {
    fn from(err: io::Error) -> Written {
        Written::Io(err)
    }
}

/// Writes the whole document; returns the number of trace entries written.
fn write_snapshot(
    out: &mut dyn SnapshotWriter,
    args: &Args,
    plan: &Plan,
    segment_frames: &SegmentFrames,
    stacks: &mut Stacks,
    processes: &[Process],
) -> Result<u64, Written> {
    let mut written = 0;
    out.begin_dict()?;
    out.key("device_traces")?;
    out.begin_list()?;
    for (device, &count) in plan.counts.iter().enumerate() {
        out.begin_list()?;
        if count > 0 {
            let sink = Writer {
                out: &mut *out,
                stacks: &mut *stacks,
                start_unix_ns: replay_start_unix_ns(processes),
                skip: count.saturating_sub(plan.limit),
                written: 0,
                error: None,
            };
            let mut trace = Trace::new(Some(device as i32), sink);
            let replay = replay::run_view(
                &args.logs,
                &mut [&mut trace],
                Stop::End,
                args.segments.view(),
            )
            .map_err(Written::Replay)?;
            trace.finish(replay.end_ns, &replay.processes);
            if let Some(err) = trace.sink.error {
                return Err(Written::Io(err));
            }
            written += trace.sink.written;
        }
        out.end_list()?;
    }
    out.end_list()?;

    out.key("segments")?;
    out.begin_list()?;
    for segment in &plan.segments {
        write_segment(out, segment, &mut |key| {
            segment_frames
                .get(&key)
                .cloned()
                .unwrap_or_else(|| Rc::from(Vec::new()))
        })?;
    }
    out.end_list()?;

    out.key("allocator_settings")?;
    let mut settings: Vec<(&'static str, Setting)> = Vec::new();
    for name in SETTINGS_ENV {
        if let Some(value) = processes.iter().find_map(|p| p.header.env_value(name)) {
            settings.push((name, Setting::Text(value.to_string())));
        }
    }
    if plan.limit != u64::MAX {
        settings.push(("trace_alloc_max_entries", Setting::Count(plan.limit)));
    }
    let overflowed = plan.counts.iter().any(|&count| count > plan.limit);
    settings.push(("trace_alloc_overflowed", Setting::Flag(overflowed)));
    settings.push((
        "recorded_by",
        Setting::Text(format!(
            "vramshim {}: PyTorch's segments with their blocks and its own trace entries where \
             its allocator's tracker recorded them (unless --segments); every other device \
             allocation the recorder saw (any API: NCCL, cuBLAS, cudaMallocAsync, VMM) is one \
             segment holding one block, marked `vramshim_outside` in a log with tensors; \
             frees show the allocating call's frames",
            env!("CARGO_PKG_VERSION")
        )),
    ));
    if let Some(reported) = reported_as_blocks(args, processes) {
        settings.push(("vramshim_unknown", Setting::Text(reported)));
    }
    write_settings(out, &settings)?;
    out.end_dict()?;
    out.finish()?;
    Ok(written)
}

/// Writes one device's entries from the `skip`th on, resolving frames as they come.
struct Writer<'a> {
    out: &'a mut dyn SnapshotWriter,
    stacks: &'a mut Stacks,
    /// Wall-clock time of replay time 0: entry times are epoch microseconds.
    start_unix_ns: u64,
    skip: u64,
    written: u64,
    /// The first write error; nothing more is written after it.
    error: Option<io::Error>,
}

impl Sink for Writer<'_> {
    fn entry(&mut self, index: u64, entry: &Entry, processes: &[Process]) {
        if index < self.skip || self.error.is_some() {
            return;
        }
        let stacks = &mut *self.stacks;
        let result = write_entry(self.out, entry, self.start_unix_ns, &mut || {
            stacks.frames(processes, entry.process, entry.stack)
        });
        match result {
            Ok(()) => self.written += 1,
            Err(err) => self.error = Some(err),
        }
    }
}

/// The output file, written under a temporary name beside it until complete.
struct Output {
    temp: PathBuf,
    /// Dropped (which closes the file) before the rename.
    writer: Option<Box<dyn SnapshotWriter>>,
    committed: bool,
}

impl Output {
    fn create(path: &Path, pickle: bool) -> Result<Output, Failure> {
        if path.is_dir() {
            return Err(output_failure(path, io::Error::other("it is a directory")));
        }
        let Some(name) = path.file_name() else {
            return Err(output_failure(path, io::Error::other("not a file name")));
        };
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".{}.tmp", std::process::id()));
        let temp = path.with_file_name(temp_name);
        let file = File::create(&temp).map_err(|err| output_failure(path, err))?;
        let mut output = Output {
            temp,
            writer: None,
            committed: false,
        };
        let buffered = BufWriter::with_capacity(1 << 20, file);
        output.writer = Some(if pickle {
            Box::new(PickleWriter::new(buffered).map_err(|err| output_failure(path, err))?)
        } else {
            Box::new(JsonWriter::new(buffered))
        });
        Ok(output)
    }

    fn commit(&mut self, path: &Path) -> Result<(), Failure> {
        self.writer = None;
        std::fs::rename(&self.temp, path).map_err(|err| output_failure(path, err))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.committed {
            self.writer = None;
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

fn output_failure(path: &Path, err: io::Error) -> Failure {
    Failure {
        message: format!("cannot write {}: {err}", path.display()),
        code: 1,
    }
}
