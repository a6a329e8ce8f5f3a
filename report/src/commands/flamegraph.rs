//! `vramshim flamegraph LOG... --what peak|leaks|allocated|oom`: a flame graph weighted by
//! bytes, as SVG or as folded stack lines.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::Failure;
use crate::analysis::allocated::Allocated;
use crate::analysis::groups::{Stacks, by_stack, by_stack_totals};
use crate::analysis::oom::Oom;
use crate::analysis::peaks::Peaks;
use crate::analysis::snapshot::SnapshotsAt;
use crate::commands::common::{self, ByThread, SegmentsArg, StacksArg};
use crate::render::flamegraph::{self, DeviceStacks};
use crate::render::timeline::{seconds_label, subject};
use crate::render::{device_name, device_order};
use crate::replay::{self, Stop};
use crate::units::bytes;

/// Which bytes the flame graph weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum What {
    /// Live at each selected device's peak.
    Peak,
    /// Still live when the process(es) ended.
    Leaks,
    /// Every byte allocated over the run.
    Allocated,
    /// Live on the device when an allocation failed (`--failure N` picks which).
    Oom,
}

impl What {
    fn name(self) -> &'static str {
        match self {
            What::Peak => "peak",
            What::Leaks => "leaks",
            What::Allocated => "allocated",
            What::Oom => "oom",
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Log(s) to read; several logs of one job are merged in time order.
    #[arg(required = true, value_name = "LOG")]
    logs: Vec<PathBuf>,
    /// What the flame graph weighs.
    #[arg(long, value_enum, default_value = "peak")]
    what: What,
    /// Output file (default: `vramshim-flamegraph-<what>.svg` here; with --folded, stdout).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Folded stack lines (`frame;frame;... bytes`, outermost first) instead of SVG, for
    /// other flame graph tools.
    #[arg(long)]
    folded: bool,
    /// Only this device ordinal (as the process numbered it; -1 = pinned host memory).
    #[arg(long, allow_hyphen_values = true)]
    device: Option<i32>,
    /// With --what oom: which failed allocation, counting from 1 in time order (as
    /// `vramshim oom` numbers them).
    #[arg(long, value_name = "N")]
    failure: Option<usize>,
    #[command(flatten)]
    view: StacksArg,
    // With it, a `thread NAME (TID)` frame right under each device frame.
    #[command(flatten)]
    threads: ByThread,
    /// Weigh PyTorch's caching-allocator segments, as the driver handed them out (the peak is
    /// then the reserved peak), instead of the tensors inside them (for logs recorded with
    /// the allocator's tracker).
    #[command(flatten)]
    segments: SegmentsArg,
}

/// The stacks to draw and what to call them.
struct View {
    parts: Vec<DeviceStacks>,
    /// What the bytes are, for the title: "live at the peak".
    title: String,
    /// When, per device.
    moments: Vec<String>,
    /// Said on an empty picture.
    empty: &'static str,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    if args.failure.is_some() && args.what != What::Oom {
        return Err(Failure::input("--failure only applies to --what oom"));
    }
    let (replay, warnings, view) = match args.what {
        What::Peak => peak(&args)?,
        What::Leaks => leaks(&args)?,
        What::Allocated => allocated(&args)?,
        What::Oom => oom(&args)?,
    };
    let lines = flamegraph::folded(&view.parts);
    let total: u64 = view
        .parts
        .iter()
        .flat_map(|p| &p.groups)
        .map(|g| g.bytes)
        .fold(0, u64::saturating_add);
    for warning in &warnings {
        eprintln!("vramshim: warning: {warning}");
    }
    if args.folded {
        let mut text = String::new();
        for line in &lines {
            text.push_str(line);
            text.push('\n');
        }
        return match &args.output {
            Some(path) => common::write_file(path, text.as_bytes()).map(|()| ExitCode::SUCCESS),
            None => common::write_stdout(text.as_bytes()),
        };
    }
    let title = format!(
        "vramshim {}: {}, {} ({total} bytes)",
        args.what.name(),
        view.title,
        bytes(total)
    );
    let mut subtitle = subject(&replay.processes);
    if !view.moments.is_empty() {
        subtitle = format!("{subtitle}; {}", view.moments.join("; "));
    }
    let picture =
        flamegraph::svg(&lines, &title, &subtitle, view.empty).map_err(|err| Failure {
            message: format!("cannot draw the flame graph: {err}"),
            code: 1,
        })?;
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("vramshim-flamegraph-{}.svg", args.what.name())));
    common::write_file(&path, &picture)?;
    Ok(ExitCode::SUCCESS)
}

/// The replay a view came from, its warnings, and the view.
type Found = (replay::Replay, Vec<String>, View);

fn peak(args: &Args) -> Result<Found, Failure> {
    let mut peaks = Peaks::default();
    let replay = replay::run_view(
        &args.logs,
        &mut [&mut peaks],
        Stop::End,
        args.segments.view(),
    )?;
    let mut stacks = Stacks::new(&replay.processes, args.view.stacks, args.threads.by_thread);
    let mut parts = Vec::new();
    let mut moments = Vec::new();
    for snapshot in peaks.snapshots(&replay.state, args.device) {
        let Some(device) = snapshot.device else {
            continue;
        };
        moments.push(format!(
            "{} peak {} at {}",
            device_name(device),
            bytes(snapshot.bytes()),
            seconds_label(snapshot.t_ns)
        ));
        parts.push(DeviceStacks {
            device,
            groups: by_stack(&snapshot.allocations, &mut stacks, &replay.processes),
        });
    }
    let view = View {
        parts,
        title: "live at each device's peak".to_string(),
        moments,
        empty: "nothing was ever allocated",
    };
    let warnings = common::warnings(&replay, args.device, &stacks);
    Ok((replay, warnings, view))
}

fn leaks(args: &Args) -> Result<Found, Failure> {
    let replay = replay::run_view(&args.logs, &mut [], Stop::End, args.segments.view())?;
    let mut devices: Vec<i32> = replay
        .state
        .devices()
        .iter()
        .filter(|d| d.live_count > 0 && args.device.is_none_or(|o| o == d.device))
        .map(|d| d.device)
        .collect();
    devices.sort_by_key(|d| device_order(*d));
    let mut stacks = Stacks::new(&replay.processes, args.view.stacks, args.threads.by_thread);
    let parts = devices
        .into_iter()
        .map(|device| DeviceStacks {
            device,
            groups: by_stack(
                replay.state.live().filter(|live| live.device == device),
                &mut stacks,
                &replay.processes,
            ),
        })
        .collect();
    let view = View {
        parts,
        title: format!("still live at {}", replay::end_name(&replay.processes)),
        moments: vec![format!(
            "{} at {}",
            replay::end_name(&replay.processes),
            seconds_label(replay.end_ns)
        )],
        empty: "no leaks: everything allocated was freed",
    };
    let warnings = common::warnings(&replay, args.device, &stacks);
    Ok((replay, warnings, view))
}

fn allocated(args: &Args) -> Result<Found, Failure> {
    let mut totals = Allocated::new(args.device, args.threads.by_thread);
    let replay = replay::run_view(
        &args.logs,
        &mut [&mut totals],
        Stop::End,
        args.segments.view(),
    )?;
    let mut devices: Vec<i32> = totals.devices.keys().copied().collect();
    devices.sort_by_key(|d| device_order(*d));
    let mut stacks = Stacks::new(&replay.processes, args.view.stacks, args.threads.by_thread);
    let parts = devices
        .into_iter()
        .filter_map(|device| {
            let by_id = totals.devices.get(&device)?;
            Some(DeviceStacks {
                device,
                groups: by_stack_totals(by_id, &mut stacks, &replay.processes),
            })
        })
        .collect();
    let view = View {
        parts,
        title: "allocated over the run".to_string(),
        moments: Vec::new(),
        empty: "nothing was allocated",
    };
    let warnings = common::warnings(&replay, args.device, &stacks);
    Ok((replay, warnings, view))
}

fn oom(args: &Args) -> Result<Found, Failure> {
    let mut analysis = Oom::new(args.device, args.threads.by_thread);
    let replay = replay::run_view(
        &args.logs,
        &mut [&mut analysis],
        Stop::End,
        args.segments.view(),
    )?;
    let count = analysis.failures.len();
    let on = args
        .device
        .map_or_else(String::new, |d| format!(" on {}", device_name(d)));
    if count == 0 {
        return Err(Failure::input(format!(
            "no failed allocation{on} in the log(s): --what oom has nothing to show"
        )));
    }
    let number = args.failure.unwrap_or(1);
    if number == 0 || number > count {
        let plural = if count == 1 { "" } else { "s" };
        return Err(Failure::input(format!(
            "--failure {number}: the log(s) hold {count} failed allocation{plural}{on} (numbered from 1)"
        )));
    }
    let failure = &analysis.failures[number - 1];
    let mut stacks = Stacks::new(&replay.processes, args.view.stacks, args.threads.by_thread);
    let groups = match &failure.live_by_id {
        Some(totals) => by_stack_totals(totals, &mut stacks, &replay.processes),
        None => {
            // Past the failures analysed in full: replay again up to this one.
            let mut at = SnapshotsAt::new(vec![(failure.seq, failure.device)]);
            if let Some(last) = at.last_seq() {
                replay::run_view(
                    &args.logs,
                    &mut [&mut at],
                    Stop::AfterSeq(last),
                    args.segments.view(),
                )?;
            }
            let allocations = at.taken.first().map_or(&[][..], |s| &s.allocations[..]);
            by_stack(allocations, &mut stacks, &replay.processes)
        }
    };
    let api = replay.processes.get(failure.process as usize).map_or_else(
        || "allocation".to_string(),
        |p| p.api(failure.api).into_owned(),
    );
    let view = View {
        parts: vec![DeviceStacks {
            device: failure.device,
            groups,
        }],
        title: format!("live when failed allocation {number} of {count} happened"),
        moments: vec![format!(
            "{api} of {} on {} failed at {}",
            bytes(failure.request),
            device_name(failure.device),
            seconds_label(failure.t_ns)
        )],
        empty: "nothing was live on the device when the allocation failed",
    };
    let warnings = common::warnings(&replay, args.device, &stacks);
    Ok((replay, warnings, view))
}
