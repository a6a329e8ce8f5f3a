//! `vramshim whatif LOG`: replays a tensor-level recording's allocations through a model of
//! PyTorch's caching allocator under several `PYTORCH_CUDA_ALLOC_CONF` settings and ranks
//! them by peak reserved memory.

use std::path::PathBuf;
use std::process::ExitCode;

use vramshim_sim::Config;

use crate::Failure;
use crate::analysis::allocator::AllocatorView;
use crate::analysis::requests::{CapacitySource, Source, WhatIf};
use crate::commands::common::{Select, emit};
use crate::render::whatif::{self, Row, TENSORS_PATTERN, WhatIfReport};
use crate::replay::{self, Stop, View};
use crate::units::{counted, parse_size};

/// The configurations simulated when no `--config` is given.
pub const DEFAULT_CONFIGS: [&str; 11] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
    "expandable_segments:True,roundup_power2_divisions:4",
    "max_split_size_mb:256,roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
];

/// Added to the default set when a memory fraction is given (it has no effect without one).
pub const GC_CONFIG: &str = "garbage_collection_threshold:0.8";

/// What `whatif` says of a recording whose PyTorch blocks came from the profiler report
/// (PyTorch 2.1), which has no requested sizes.
pub const BLOCKS_AS_REQUESTS: &str = "requests are block sizes: PyTorch's blocks were taken from its profiler report (PyTorch 2.1 has no allocator tracker), which gives each block's size, not the bytes asked for, nor the stream; each block is simulated as a request of its size on the default stream. Exact where the program's requests were multiples of 512 B (or already rounded as the simulated setting rounds) and none was handed a whole cached block larger than it (a large-pool remainder of 1 MiB or less is not split, nor an oversize block under max_split_size_mb): then a block is its request. Otherwise requests are overstated (peak_requested is the blocks' bytes). For the requests themselves, record again with PyTorch 2.2 or later, or with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync";

#[derive(clap::Args)]
pub struct Args {
    /// A tensor-level recording: made with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync or
    /// PYTORCH_NO_CUDA_MEMORY_CACHING=1, or of a program allocating one buffer at a time.
    #[arg(value_name = "LOG")]
    log: PathBuf,
    /// The device whose allocations are simulated (default: the first one allocated on).
    #[arg(long, allow_hyphen_values = true)]
    device: Option<i32>,
    /// Device memory the allocator may take, e.g. 24GiB, 512MiB, 24G (binary units). Default:
    /// the device's total from the log's memory samples, else unlimited.
    #[arg(long, value_parser = parse_size)]
    capacity: Option<u64>,
    /// Simulate only this PYTORCH_CUDA_ALLOC_CONF string (repeatable; '' = the defaults).
    #[arg(long = "config", value_name = "STRING")]
    configs: Vec<String>,
    /// torch.cuda.set_per_process_memory_fraction(F) for every configuration (makes
    /// garbage_collection_threshold meaningful).
    #[arg(long, value_name = "F")]
    memory_fraction: Option<f64>,
    /// The recording's PyTorch release (e.g. 2.11.0), which decides how its best fit breaks
    /// ties between equal-size free blocks. Default: read from the torch/version.py beside
    /// the libc10.so the log names, when that path exists here (not for a log made on another
    /// machine).
    #[arg(long, value_name = "VERSION")]
    torch_version: Option<String>,
    /// The same content as one JSON document.
    #[arg(long)]
    json: bool,
}

/// How rows are ranked: no OOM first, then peak reserved, then fewer `cudaMalloc`s, then the
/// order simulated.
pub fn rank_key(index: usize, row: &Row) -> (bool, u64, u64, usize) {
    (
        !row.fits(),
        row.stats.peak_reserved,
        row.stats.num_device_alloc,
        index,
    )
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = Select {
        logs: vec![args.log.clone()],
        device: args.device,
        json: args.json,
    };
    with_report(&args, |report, warnings| {
        emit(
            &select,
            &warnings,
            || whatif::json(report),
            |out| whatif::text(out, report),
        )
    })?
}

impl Args {
    /// The arguments of `vramshim whatif LOG [--device DEVICE]` with nothing else given.
    pub fn defaults_for(log: PathBuf, device: Option<i32>) -> Args {
        Args {
            log,
            device,
            capacity: None,
            configs: Vec::new(),
            memory_fraction: None,
            torch_version: None,
            json: true,
        }
    }
}

/// Simulates the configurations `args` asks for on its log and hands the ranked table, with
/// the warnings, to `then`.
pub fn with_report<T>(
    args: &Args,
    then: impl FnOnce(&WhatIfReport<'_>, Vec<String>) -> T,
) -> Result<T, Failure> {
    if let Some(f) = args.memory_fraction
        && !(0.0..=1.0).contains(&f)
    {
        return Err(Failure::input(format!(
            "--memory-fraction {f}: must be in [0, 1]"
        )));
    }
    let mut notes = Vec::new();
    let strings: Vec<String> = if args.configs.is_empty() {
        let mut set: Vec<String> = DEFAULT_CONFIGS.iter().map(|s| s.to_string()).collect();
        if args.memory_fraction.is_some() {
            set.push(GC_CONFIG.to_string());
        } else {
            notes.push(format!(
                "{GC_CONFIG} is not in the set: garbage collection only runs with a memory fraction (torch.cuda.set_per_process_memory_fraction); pass --memory-fraction to include it"
            ));
        }
        set
    } else {
        args.configs.clone()
    };
    let mut configs = Vec::with_capacity(strings.len());
    for text in &strings {
        let mut config = Config::parse(text)
            .map_err(|err| Failure::input(format!("--config {text:?}: {err}")))?;
        config.memory_fraction = args.memory_fraction;
        if config.garbage_collection_threshold.is_some() && args.memory_fraction.is_none() {
            notes.push(format!(
                "{text:?}: garbage_collection_threshold has no effect without a memory fraction (--memory-fraction)"
            ));
        }
        configs.push(config);
    }
    let conf_strings: Vec<String> = configs.iter().map(Config::to_conf_string).collect();

    let mut view = AllocatorView::new(args.device);
    let mut sims = WhatIf::new(args.device, configs, args.capacity).map_err(Failure::input)?;
    sims.simulate_other_layout();
    if let Some(version) = &args.torch_version {
        sims.set_torch_version(version);
    }
    let logs = vec![args.log.clone()];
    // PyTorch's blocks where the log has them (the default allocator, recorded through its
    // tracker), in place of its segments.
    let replay = replay::run_view(&logs, &mut [&mut view, &mut sims], Stop::End, View::Tensors)?;
    view.finish();
    sims.finish(&replay.processes).map_err(Failure::input)?;

    let log = args.log.display();
    let device = match sims.requests.device {
        Some(device) if sims.requests.allocs > 0 || sims.requests.vmm_creates > 0 => device,
        _ => {
            return Err(Failure::input(match args.device {
                Some(d) => format!("{log}: no allocation on device {d} to simulate"),
                None => format!("{log}: no device allocation to simulate"),
            }));
        }
    };
    let (pattern, pattern_reason) = view
        .device(device)
        .map(|d| d.pattern())
        .unwrap_or((crate::analysis::allocator::Pattern::Unknown, String::new()));
    // Tensors recorded through PyTorch's tracker are requests whatever their sizes (a program
    // of 24 MiB tensors has every block the size of a segment).
    let from_tensors = sims.requests.source == Source::Tensors
        && replay
            .processes
            .first()
            .is_some_and(|p| p.tensor_allocs > 0);
    if pattern.is_segments() && !from_tensors {
        return Err(Failure::input(format!(
            "{log}: device {device} looks like a caching-allocator recording ({}: {pattern_reason}); its allocations are the allocator's segments, not tensors, so they cannot be replayed through it. Record the workload again with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (or PYTORCH_NO_CUDA_MEMORY_CACHING=1) and run whatif on that log",
            pattern.name()
        )));
    }
    let mut rows: Vec<(usize, Row)> = sims
        .simulators
        .iter()
        .zip(strings.iter().zip(conf_strings))
        .enumerate()
        .map(|(index, (sim, (label, conf)))| {
            (
                index,
                Row {
                    label: label.trim().to_string(),
                    conf,
                    stats: sim.stats(),
                    other_order: sims
                        .other_order
                        .get(index)
                        .map(|other| (other.address_order(), other.stats()))
                        .filter(|(_, other)| outcome_differs(&sim.stats(), other)),
                },
            )
        })
        .collect();
    rows.sort_by_key(|(index, row)| rank_key(*index, row));
    let rows: Vec<Row> = rows.into_iter().map(|(_, row)| row).collect();

    let mut warnings = replay.warnings();
    if !sims.requests.other_devices.is_empty() {
        warnings.push(format!(
            "only device {device} is simulated; devices {:?} also allocated (use --device)",
            sims.requests.other_devices
        ));
    }
    if sims.requests.failed > 0 {
        notes.push(format!(
            "{} failed in the recording and {} not replayed",
            counted(sims.requests.failed as u64, "allocation"),
            if sims.requests.failed == 1 {
                "is"
            } else {
                "are"
            }
        ));
    }
    if sims.requests.external_allocs > 0 {
        notes.push(format!(
            "{} on the device came from other libraries (cuBLAS's handle memory, NCCL): not replayed, but their bytes take room on the simulated device while they are live, and one that does not fit beside the allocator's segments fails the run (OOM column: a library's)",
            counted(sims.requests.external_allocs, "allocation"),
        ));
    }
    let left_out = sims.requests.skipped - sims.requests.external_allocs;
    if left_out > 0 {
        notes.push(format!(
            "{} on the device {} left out: with {} PyTorch's tensors come only from {}, the others from libraries outside its allocator",
            counted(left_out, "allocation"),
            if left_out == 1 { "is" } else { "are" },
            match sims.requests.source {
                Source::StreamOrdered => "backend:cudaMallocAsync",
                Source::Tensors => "the default allocator recorded through its tracker",
                _ => "PYTORCH_NO_CUDA_MEMORY_CACHING=1",
            },
            match sims.requests.source {
                Source::StreamOrdered => "stream-ordered allocations",
                Source::Tensors => "its blocks",
                _ => "cudaMalloc",
            }
        ));
    }
    let fallbacks = sims
        .simulators
        .iter()
        .filter(|sim| sim.stats().workspace_fallbacks > 0)
        .count();
    if fallbacks > 0 {
        notes.push(format!(
            "{} a cuDNN convolution's workspace (torch's run_conv_plan, or cudnn.benchmark's search) that did not fit: survived, as torch survives it: the OOM is counted, the convolution falls back to its next engine, assumed to need no workspace (the fake cuDNN's second engine needs none; a real cuDNN's may ask for another one, which the recording cannot tell: on an H200 with cuDNN 9.19, a failed workspace of 22,450,960 bytes was followed by one of more than 22 MiB), and later workspaces of that convolution on that thread (same operation, same size: the recording has no shapes) are not asked for",
            if fallbacks == 1 {
                "1 configuration met".to_string()
            } else {
                format!("{fallbacks} configurations met")
            }
        ));
    }
    if sims.requests.cudnn_probes > 0 {
        notes.push(format!(
            "{} {} cudaMallocAsync's probes of free memory for cudnn.benchmark's search (its cacheInfo, which the default allocator answers without allocating): not replayed; the searches themselves are (their workspace: no larger than cacheInfo's answer, halved after each failure, a survived OOM; an engine left out or a workspace halved makes the convolution run its engine with no workspace, assumed to need none, and its later workspaces are not asked for)",
            counted(sims.requests.cudnn_probes, "allocation"),
            if sims.requests.cudnn_probes == 1 { "was" } else { "were" },
        ));
    }
    let graphs = &sims.requests.graphs;
    if graphs.captures > 0 {
        notes.push(format!(
            "{} made while a stream was captured into a CUDA graph ({}) are served from a private pool per capture, as torch.cuda.graph's are: its segments serve only that capture's allocations, and neither empty_cache() nor the retry before an OOM gives them back while the graph lives; the recording does not say when a graph is destroyed, so every graph is taken to live to the end",
            counted(graphs.allocs, "allocation"),
            counted(graphs.captures, "capture"),
        ));
    }
    if sims.requests.vmm_creates > 0 {
        notes.push(format!(
            "{} VMM physical allocations (cuMemCreate) on the device are not replayed",
            sims.requests.vmm_creates
        ));
    }
    let Some(process) = replay.processes.first() else {
        return Err(Failure::input(format!("{log}: nothing to read")));
    };
    let requests_are_blocks = from_tensors && process.tensors_reported_as_blocks();
    // The driver saw segments, but the requests replayed are the tensors PyTorch's allocator
    // reported; the allocator view, counting them as allocations, would call them buffers.
    let (pattern, pattern_reason) = if from_tensors {
        (
            TENSORS_PATTERN,
            format!(
                "{} recorded from PyTorch's caching allocator inside its segments",
                counted(process.tensor_allocs, "tensor block")
            ),
        )
    } else {
        (pattern.name(), pattern_reason)
    };
    if requests_are_blocks {
        notes.insert(0, BLOCKS_AS_REQUESTS.to_string());
    }
    let report = WhatIfReport {
        process,
        device,
        pattern,
        pattern_reason,
        requests: &sims.requests,
        capacity: (sims.capacity_source != CapacitySource::Unlimited).then_some(sims.capacity),
        capacity_source: sims.capacity_source,
        order: sims.order,
        votes: sims.votes,
        torch_version: sims.torch_version.clone(),
        ties: sims.ties,
        memory_fraction: args.memory_fraction,
        rows,
        notes,
        requests_are_blocks,
    };
    Ok(then(&report, warnings))
}

/// Whether two simulations of one configuration end differently where a user would see it:
/// one fits and the other not, or peak reserved, retries or `cudaMalloc`s differ.
fn outcome_differs(a: &vramshim_sim::Stats, b: &vramshim_sim::Stats) -> bool {
    crate::render::whatif::fits(a) != crate::render::whatif::fits(b)
        || a.peak_reserved != b.peak_reserved
        || a.num_alloc_retries != b.num_alloc_retries
        || a.num_device_alloc != b.num_device_alloc
}
