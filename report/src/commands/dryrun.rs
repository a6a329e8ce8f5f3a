//! `vramshim dryrun [--gpu MODEL [--mig PROFILE] | --memory SIZE] [--gpus N] [--json] -- CMD ARGS...`: runs
//! an unmodified program on simulated GPUs (fake NVIDIA libraries whose device memory is exact
//! bookkeeping of the chosen card) under the recorder, then says whether it fit.

use std::ffi::OsString;
use std::io::{self, BufWriter, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};

use vramshim_sim::Config;

use crate::Failure;
use crate::analysis::allocator::AllocatorView;
use crate::analysis::groups::{Stacks, by_stack_totals};
use crate::analysis::oom::{Oom, recovered};
use crate::analysis::peaks::Peaks;
use crate::analysis::requests::WhatIf;
use crate::analysis::summary::Summary;
use crate::commands::common::{UnfoldArg, finish_stdout};
use crate::commands::whatif::{DEFAULT_CONFIGS, rank_key};
use crate::commands::{compact, launch};
use crate::gpus::{self, Gpu};
use crate::python::{PYTHON_MODULE, StackView};
use crate::render::dryrun::{
    self as render, DeviceVerdict, DryrunReport, FailureVerdict, MigSeen, UnseenRefusal,
};
use crate::render::frames::Fold;
use crate::render::oom::FailureView;
use crate::render::whatif::Row;
use crate::replay::{self, Stop, View};
use crate::symbols::SymFrame;
use crate::units::parse_size;

/// Most devices `--gpus` takes.
pub const MAX_GPUS: u32 = 64;

#[derive(clap::Args)]
pub struct Args {
    /// The card to simulate (`--list-gpus` shows them; default h100).
    #[arg(long, value_name = "MODEL", conflicts_with = "memory")]
    gpu: Option<String>,
    /// Run on a MIG instance of the `--gpu` card, e.g. `--gpu a100-80gb --mig 3g.40gb`
    /// (A100 40/80GB, H100, H200; a bad profile lists the valid ones), or a layout of several
    /// per card: each card's profiles comma-separated, cards separated by `;`
    /// (`3g.40gb,2g.20gb,1g.10gb;7g.80gb`); one card's entry stands for every card. A profile
    /// may take `+me` (`1g.10gb+me`) and its compute instances (`3g.40gb[2c,1c]`: two MIG
    /// devices sharing the instance's memory).
    #[arg(long, value_name = "LAYOUT", requires = "gpu")]
    mig: Option<String>,
    /// A custom card with this much device memory, e.g. 24GiB, 512MiB (binary units).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory: Option<u64>,
    /// Number of simulated devices (1 to 64).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_gpus)]
    gpus: u32,
    /// Log path (`%p` = pid of the recorded process); default vramshim-<program>.<pid>.vlog.
    #[arg(short = 'o', long = "output")]
    output: Option<OsString>,
    /// The verdict as one JSON document on stdout (the program's own stdout goes to stderr).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    unfold: UnfoldArg,
    /// Print the simulated cards and exit.
    #[arg(long, exclusive = true)]
    list_gpus: bool,
    /// The program and its arguments.
    #[arg(last = true, required_unless_present = "list_gpus")]
    command: Vec<OsString>,
}

fn parse_gpus(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_GPUS).contains(&n) => Ok(n),
        _ => Err(format!("not a device count: {text:?} (1 to {MAX_GPUS})")),
    }
}

/// Where the fake libraries are: `VRAMSHIM_FAKEGPU_DIR` when set (a wrong one is an error,
/// not a fallback), else `fakegpu` beside this executable.
fn find_fakes() -> Result<PathBuf, Failure> {
    let from_env = std::env::var_os("VRAMSHIM_FAKEGPU_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("fakegpu")));
    let chosen = from_env.as_ref().or(beside.as_ref());
    if let Some(dir) = chosen.filter(|dir| dir.join("lib").is_dir()) {
        return Ok(dir.canonicalize().unwrap_or_else(|_| dir.clone()));
    }
    let env_text = match &from_env {
        Some(dir) => format!("VRAMSHIM_FAKEGPU_DIR={} has no lib/", dir.display()),
        None => "VRAMSHIM_FAKEGPU_DIR is not set".to_string(),
    };
    let beside_text = match &beside {
        Some(dir) if from_env.is_some() && dir.join("lib").is_dir() => format!(
            "{} exists but is not used while VRAMSHIM_FAKEGPU_DIR is set",
            dir.join("lib").display()
        ),
        Some(dir) => format!("{} does not exist", dir.join("lib").display()),
        None => "the directory of the vramshim executable is unknown".to_string(),
    };
    Err(Failure::input(format!(
        "the fake NVIDIA libraries were not found: {env_text}, and {beside_text} (build them, or point VRAMSHIM_FAKEGPU_DIR at the directory holding lib/)"
    )))
}

/// Drop-in replacements for other libraries' APIs (BLAS, FFTW): preloaded, their stubs would
/// capture the calls a program makes to its own CPU BLAS or FFTW.
const NOT_PRELOADED: &[&str] = &["libnvblas", "libcufftw"];

/// The fake libraries to preload from `lib`: every `lib<name>.so.<major>`, each major of a
/// library (`libcudart.so.13` and `.12`) newest first. A program needs the majors it was built
/// for, which a Python program only shows when it loads them, and different majors have
/// different SONAMEs and symbol versions: preloading both lets each library's references bind
/// to their own major (`cudaMalloc@libcudart.so.12` skips `.13`'s definitions). The recorder's
/// `dlsym(RTLD_NEXT, "cudaMalloc")` finds the newest; the fake runtimes keep their per-thread
/// state (last error, device) in the fake driver, so either major serves the call the same.
/// Plugins loaded by path (`nvshmem_*`, `*-builtins`, `.alt` variants) and drop-ins are left
/// to be found when asked for.
fn fake_libraries(lib: &Path) -> Result<Vec<PathBuf>, Failure> {
    let entries = std::fs::read_dir(lib)
        .map_err(|err| Failure::input(format!("cannot read {}: {err}", lib.display())))?;
    // (base name, newest major first) -> path, e.g. ("libcudart", Reverse(13)).
    let mut found: std::collections::BTreeMap<(String, std::cmp::Reverse<u32>), PathBuf> =
        Default::default();
    for path in entries.filter_map(|entry| entry.ok().map(|e| e.path())) {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some((base, major)) = name.split_once(".so.") else {
            continue;
        };
        let Ok(major) = major.parse::<u32>() else {
            continue;
        };
        if !base.starts_with("lib")
            || base.contains(".alt")
            || base.ends_with("-builtins")
            || NOT_PRELOADED.contains(&base)
            || !path.is_file()
        {
            continue;
        }
        found.insert((base.to_owned(), std::cmp::Reverse(major)), path);
    }
    if found.is_empty() {
        return Err(Failure::input(format!(
            "{} holds no fake library (lib*.so.N)",
            lib.display()
        )));
    }
    Ok(found.into_values().collect())
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    if args.list_gpus {
        let mut out = BufWriter::new(io::stdout().lock());
        let written = render::list_gpus(&mut out, &gpus::presets()).and_then(|()| out.flush());
        return finish_stdout(written);
    }
    let gpu = match (&args.gpu, args.memory) {
        (_, Some(0)) => return Err(Failure::input("--memory 0: a card needs some memory")),
        (_, Some(memory)) => gpus::custom(memory),
        (Some(name), None) => gpus::find(name).map_err(Failure::input)?,
        (None, None) => gpus::find("h100").map_err(Failure::input)?,
    };
    let card = gpu.clone();
    let layout = match &args.mig {
        Some(text) => Some(gpus::mig_layout(&card, text, args.gpus).map_err(Failure::input)?),
        None => None,
    };
    // The fakes take the first MIG device's figures and scale the others from them.
    let gpu = layout.as_ref().map_or(gpu, |layout| layout.first.clone());
    let fakes = find_fakes()?;
    let lib = fakes.join("lib");
    let library = launch::find_library()?;
    let nvtx = launch::nvtx_injection(&library);
    let mut first = vec![library];
    first.extend(fake_libraries(&lib)?);
    let (program, rest) = launch::split_command(&args.command)?;

    let mut manifest = launch::Manifest::create()?;
    // One device ledger for every process of the run: each sees the others' memory in
    // cuMemGetInfo and NVML, and an allocation fails when the card as a whole is full.
    let ledger = manifest.private_file("ledger")?;
    // The fakes name each function they do not implement, once, where this says: a real card
    // would have run it, so the verdict must say the run may have gone otherwise. A log the
    // user names is theirs (it may hold earlier runs' names): then the verdict lists none.
    let unimplemented_log = match std::env::var_os("VRAMSHIM_FAKEGPU_LOG") {
        Some(value) if !value.is_empty() => None,
        _ => Some(manifest.private_file("unimplemented")?),
    };
    if let Some(output) = &args.output {
        launch::remove_stale_log(output);
    }
    let mut library_path = OsString::from(&lib);
    if let Some(existing) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        library_path.push(":");
        library_path.push(existing);
    }
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("LD_PRELOAD", launch::preload(&first))
        .env("LD_LIBRARY_PATH", library_path)
        .env("VRAMSHIM_MANIFEST", manifest.path())
        // Memory no hook sees (the context, loaded kernels, NCCL's) at every event, not once
        // a second: a short run's first kernel would otherwise fall between two samples.
        .env("VRAMSHIM_SAMPLE_MS", "0")
        .env("VRAMSHIM_FAKEGPU_COUNT", args.gpus.to_string())
        .env("VRAMSHIM_FAKEGPU_MEMORY", gpu.memory.to_string())
        .env("VRAMSHIM_FAKEGPU_NAME", &gpu.name)
        .env("VRAMSHIM_FAKEGPU_CC", format!("{}.{}", gpu.cc.0, gpu.cc.1))
        .env("VRAMSHIM_FAKEGPU_SMS", gpu.sms.to_string())
        .env(
            "VRAMSHIM_FAKEGPU_CONTEXT_BYTES",
            gpu.context_bytes.to_string(),
        )
        .env(
            "VRAMSHIM_FAKEGPU_MODULE_BYTES",
            gpu.module_bytes.to_string(),
        )
        .env(
            "VRAMSHIM_FAKEGPU_CUBLAS_KERNEL_BYTES",
            gpu.cublas_kernel_bytes.to_string(),
        )
        .env(
            "VRAMSHIM_FAKEGPU_CUDNN_KERNEL_BYTES",
            gpu.cudnn_kernel_bytes.to_string(),
        )
        .env("VRAMSHIM_FAKEGPU_NCCL_BYTES", gpu.nccl_bytes.to_string())
        .env("VRAMSHIM_FAKEGPU_LEDGER", &ledger)
        .env(
            "VRAMSHIM_FAKEGPU_FABRIC",
            if gpu.fabric { "1" } else { "0" },
        );
    // MIG: the fakes put the cards in MIG mode with the layout's MIG devices (one of which
    // CUDA sees), NVML reporting the whole card for its GPU handle.
    match &layout {
        Some(layout) => {
            command
                .env("VRAMSHIM_FAKEGPU_MIG", &layout.text)
                .env("VRAMSHIM_FAKEGPU_CARD_MEMORY", card.memory.to_string())
                .env("VRAMSHIM_FAKEGPU_CARD_SMS", card.sms.to_string());
        }
        None => {
            command
                .env_remove("VRAMSHIM_FAKEGPU_MIG")
                .env_remove("VRAMSHIM_FAKEGPU_CARD_MEMORY")
                .env_remove("VRAMSHIM_FAKEGPU_CARD_SMS");
        }
    }
    if let Some(path) = &unimplemented_log {
        command.env("VRAMSHIM_FAKEGPU_LOG", path);
    }
    // PyTorch keeps the kernels its jiterator compiles through NVRTC in ~/.cache/torch/kernels,
    // named by architecture and NVRTC release: the fake NVRTC's placeholder images would be
    // loaded from there by a later run on a real card of the same architecture.
    command.env("USE_PYTORCH_KERNEL_CACHE", "0");
    if let Some(nvtx) = nvtx {
        command.env(launch::NVTX_INJECTION, nvtx);
    }
    if let Some(output) = &args.output {
        command.env("VRAMSHIM_OUTPUT", output);
    }
    if args.json {
        // stdout carries the JSON document: the program's own output goes to stderr.
        let stderr = io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|err| Failure::input(format!("cannot duplicate stderr: {err}")))?;
        command.stdout(Stdio::from(stderr));
    }
    let status = launch::spawn_and_wait(&mut command, program)?;
    // Read before the manifest (and the ledger beside it) goes.
    let ledger_end = read_ledger(&ledger);
    let unimplemented = unimplemented_log
        .as_deref()
        .map(read_unimplemented)
        .unwrap_or_default();
    let logs: Vec<PathBuf> = manifest
        .logs()
        .into_iter()
        .filter(|log| log.is_file())
        .collect();

    let command_line: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // The program's own CUDA_VISIBLE_DEVICES picks among the simulated cards, as on a node.
    let visible_value =
        std::env::var_os("CUDA_VISIBLE_DEVICES").map(|v| v.to_string_lossy().into_owned());
    let mut gpu = gpu;
    let mut mig_seen = None;
    let (visible, seen, visible_list) = match &layout {
        None => {
            let list = visible_device_list(args.gpus, visible_value.as_deref());
            let visible = list.as_ref().map(|list| list.len() as u32);
            (visible, visible.unwrap_or(args.gpus), list)
        }
        Some(layout) => {
            // A process enumerates one MIG device at most (card 0's first when nothing is
            // named); its memory unit is the ledger's device.
            let counts: Vec<u32> = layout.cards.iter().map(|c| c.len() as u32).collect();
            let found = visible_mig_device(&counts, visible_value.as_deref());
            let list: Vec<u32> = found
                .map(|(card, index)| counts[..card as usize].iter().sum::<u32>() + index)
                .into_iter()
                .collect();
            let device = found.map(|(card, index)| {
                let device = &layout.cards[card as usize][index as usize];
                gpu = device.gpu.clone();
                let uuid = format!("MIG-46414b45-4d49-4700-0000-00000000{index:02x}{card:02x}");
                (card, index, device.gpu_instance, uuid)
            });
            mig_seen = Some(MigSeen {
                layout: layout.text.clone(),
                device,
            });
            let seen = list.len() as u32;
            (visible_value.as_ref().map(|_| seen), seen, Some(list))
        }
    };
    let machine = ledger_end
        .map(|end| end.as_seen(args.gpus, visible_list.as_deref()))
        .unwrap_or_default();
    match verdict(
        &gpu,
        (args.gpus, visible, seen, machine, mig_seen),
        &command_line,
        (status, unimplemented),
        &logs,
        &lib,
        (args.json, args.unfold.fold()),
    ) {
        Ok(()) => {}
        Err(failure) => eprintln!("vramshim: {}", failure.message),
    }
    // Kept for other reports: compressed now, as `vramshim run` leaves its logs (the recorder
    // writes them plain), once the verdict has read them.
    for (log, outcome) in logs
        .iter()
        .zip(compact::compact_logs(&logs, compact::DEFAULT_LEVEL))
    {
        if let Err(why) = outcome {
            eprintln!(
                "vramshim: {} left as recorded: not compacted: {why}",
                log.display()
            );
        }
    }
    Ok(launch::exit_like(status))
}

/// Reads the logs and prints the verdict.
fn verdict(
    gpu: &Gpu,
    // The machine: its cards, how many the program names and sees, and what its device ledger
    // said.
    (count, visible, seen, machine, mig): (u32, Option<u32>, u32, MachineSeen, Option<MigSeen>),
    command: &[String],
    // How the program ended, and the fakes' functions it called that they do not implement.
    (status, unimplemented): (ExitStatus, Vec<String>),
    logs: &[PathBuf],
    fakes_lib: &Path,
    (json, fold): (bool, Fold),
) -> Result<(), Failure> {
    let mut peaks = Peaks::default();
    let mut summary = Summary::new(logs.len(), None);
    let mut oom = Oom::new(None, false);
    let mut view = AllocatorView::new(None);
    let replay = if logs.is_empty() {
        None
    } else {
        let replay = replay::run(
            logs,
            &mut [&mut peaks, &mut summary, &mut oom, &mut view],
            Stop::End,
        )?;
        view.finish();
        Some(replay)
    };
    let processes = replay.as_ref().map_or(&[][..], |r| &r.processes[..]);
    // The user's lines: a stack's Python frames where it has any (the allocator's and the
    // framework's native frames say nothing about which line to change), native ones else.
    let mut stacks = Stacks::new(processes, StackView::Python, false);

    let mut devices: Vec<i32> = (0..seen as i32).collect();
    for peak in &peaks.total {
        if peak.device >= 0 && !devices.contains(&peak.device) {
            devices.push(peak.device);
        }
    }
    devices.sort();
    let device_verdicts: Vec<DeviceVerdict> = devices
        .iter()
        .map(|&device| {
            let peak = peaks.total.iter().find(|p| p.device == device);
            let samples: Vec<_> = summary
                .samples
                .iter()
                .filter(|s| s.device == device)
                .collect();
            let untracked = samples.iter().map(|s| s.untracked()).max();
            let sampled_used = samples.iter().map(|s| s.used).max();
            let failure_used = oom
                .failures
                .iter()
                .filter(|f| f.device == device)
                .filter_map(|f| f.mem_info.map(|(free, total)| total.saturating_sub(free)))
                .max();
            let peak_recorded = peak.map_or(0, |p| p.bytes);
            // With the device ledger each sample's `used` is the whole card's (every process),
            // and `tracked` every recorded process's live bytes at that moment of the merged
            // timeline: `untracked` is then the sum of the contexts and kernel code of the
            // processes alive then. The ledger's own peak is exact where samples miss (memory
            // taken after a process's last event).
            let machine_peak = machine
                .peaks
                .iter()
                .find(|(d, _)| *d == device)
                .map(|(_, bytes)| *bytes)
                .filter(|&bytes| bytes > 0);
            let peak_used = [
                untracked.map(|u| peak_recorded + u),
                sampled_used,
                failure_used,
                machine_peak,
            ]
            .into_iter()
            .flatten()
            .max();
            let (pattern, _) = view
                .device(device)
                .map(|d| d.pattern())
                .unwrap_or((crate::analysis::allocator::Pattern::Unknown, String::new()));
            DeviceVerdict {
                device,
                peak_recorded,
                peak_recorded_t_ns: peak.map(|p| p.t_ns),
                pattern,
                untracked,
                peak_used,
                capacity: gpu.memory,
                failures: oom
                    .failures
                    .iter()
                    .filter(|f| f.device == device && f.is_out_of_memory())
                    .count() as u64,
            }
        })
        .collect();

    // The first failure the program did not recover from (PyTorch's retry did not save it):
    // failures it recovered from may come before it.
    let first = (0..oom.failures.len()).find(|&index| {
        let f = &oom.failures[index];
        f.device >= 0
            && f.is_out_of_memory()
            && f.is_retry_of.is_none()
            && !recovered(&oom.failures, index)
    });
    let recovered = oom
        .failures
        .iter()
        .filter(|f| f.retry.is_some_and(|r| r.succeeded))
        .count() as u64;
    let failure = first.map(|index| {
        let f = &oom.failures[index];
        let frames = stacks.frames(processes, f.process, f.stack);
        let view = FailureView {
            failure: f,
            frames: frames.clone(),
            largest_frames: f
                .largest_live
                .iter()
                .map(|live| stacks.frames(processes, live.process, live.stack))
                .collect(),
            live_groups: f.live_by_id.as_ref().map_or_else(Vec::new, |totals| {
                by_stack_totals(totals, &mut stacks, processes)
            }),
        };
        let device = device_verdicts.iter().find(|d| d.device == f.device);
        let used = f
            .mem_info
            .map(|(free, total)| total.saturating_sub(free))
            .or_else(|| device.and_then(|d| d.peak_used))
            .unwrap_or(f.tracked_bytes);
        FailureVerdict {
            user_frame: user_frame(&frames, fakes_lib),
            python_frame: python_frame(&frames),
            needed: used + f.request,
            view,
        }
    });

    // What the job needs on a card: the most any device used (plus the failed request),
    // less this card's context, plus the other card's context.
    let needed = match &failure {
        Some(failure) => failure.needed,
        None => device_verdicts
            .iter()
            .map(|d| d.peak_used.unwrap_or(d.peak_recorded))
            .max()
            .unwrap_or(0),
    };
    // A process refused its context or kernel code needed that much more than was in use.
    let needed = match &machine.refusal {
        Some(r) => needed.max(r.used + r.bytes),
        None => needed,
    };
    // The smallest card on which every device's need fits, each process on a device swapping
    // its context for the other card's (without a ledger: one process).
    let contexts_on = |device: i32| {
        machine
            .processes
            .iter()
            .find(|(d, _)| *d == device)
            .map_or(1, |(_, n)| u64::from(*n).max(1))
    };
    let mut demands: Vec<(u64, u64)> = match &failure {
        Some(failure) => vec![(failure.needed, contexts_on(failure.view.failure.device))],
        None => device_verdicts
            .iter()
            .map(|d| {
                (
                    d.peak_used.unwrap_or(d.peak_recorded),
                    contexts_on(d.device),
                )
            })
            .collect(),
    };
    if let Some(r) = &machine.refusal {
        demands.push((r.used + r.bytes, contexts_on(r.device)));
    }
    let smallest = gpus::presets().into_iter().find(|card| {
        demands.iter().all(|&(need, contexts)| {
            let beyond_contexts = need.saturating_sub(contexts * gpu.context_bytes);
            card.memory > beyond_contexts + contexts * card.context_bytes
        })
    });

    let whatif = match (&failure, &replay) {
        (Some(failure), Some(_)) => {
            let device = failure.view.failure.device;
            let pattern = device_verdicts
                .iter()
                .find(|d| d.device == device)
                .map(|d| d.pattern);
            let per_tensor = pattern.is_some_and(|p| {
                !p.is_segments() && p != crate::analysis::allocator::Pattern::Unknown
            });
            // PyTorch's tensors, where the log has them (its default allocator recorded
            // through its tracker), are requests whatever the segments look like.
            let mut tensors = false;
            if pattern.is_some() && !per_tensor {
                for log in logs {
                    tensors = tensors || replay::has_tensors(log)?;
                }
            }
            match pattern {
                Some(_) if per_tensor || tensors => {
                    let context = device_verdicts
                        .iter()
                        .find(|d| d.device == device)
                        .and_then(|d| d.untracked)
                        .unwrap_or(gpu.context_bytes);
                    best_whatif(logs, device, gpu.memory.saturating_sub(context))?
                }
                _ => None,
            }
        }
        _ => None,
    };

    let mut warnings = replay.as_ref().map_or_else(Vec::new, |r| r.warnings());
    warnings.extend(stacks.warnings());
    let report = DryrunReport {
        gpu,
        count,
        mig,
        visible,
        command,
        status,
        unimplemented,
        logs,
        processes,
        devices: device_verdicts,
        failure,
        unseen_refusal: machine.refusal,
        recovered,
        needed,
        smallest,
        whatif,
        fold,
    };
    for warning in &warnings {
        eprintln!("vramshim: warning: {warning}");
    }
    let mut out = BufWriter::with_capacity(1 << 16, io::stdout().lock());
    let written = if json {
        let mut value = render::json(&report);
        if let serde_json::Value::Object(map) = &mut value {
            map.insert("warnings".to_string(), warnings.into());
        }
        serde_json::to_writer_pretty(&mut out, &value)
            .map_err(io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        render::text(&mut out, &report)
    }
    .and_then(|()| out.flush());
    finish_stdout(written).map(|_| ())
}

/// The names the fakes wrote to `VRAMSHIM_FAKEGPU_LOG`, in the order first called, each once
/// (every process of the run appends to the one file). An unreadable file lists none.
fn read_unimplemented(path: &Path) -> Vec<String> {
    let text = std::fs::read(path).unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    for line in String::from_utf8_lossy(&text).lines() {
        let name = line.trim();
        if !name.is_empty() && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    names
}

/// Replays the failing device's allocations through the caching-allocator model under the
/// default set of settings on `capacity` bytes; the best row, ranked as `vramshim whatif`
/// ranks, and the peak reserved bytes under PyTorch's default settings.
fn best_whatif(
    logs: &[PathBuf],
    device: i32,
    capacity: u64,
) -> Result<Option<(Row, u64)>, Failure> {
    let mut configs = Vec::with_capacity(DEFAULT_CONFIGS.len());
    for text in DEFAULT_CONFIGS {
        configs.push(Config::parse(text).map_err(Failure::input)?);
    }
    let labels: Vec<String> = configs.iter().map(Config::to_conf_string).collect();
    let mut sims = WhatIf::new(Some(device), configs, Some(capacity)).map_err(Failure::input)?;
    // Tensors in place of the segments they came from where the log has them, as `whatif`.
    let replay = replay::run_view(logs, &mut [&mut sims], Stop::End, View::Tensors)?;
    sims.finish(&replay.processes).map_err(Failure::input)?;
    if sims.requests.allocs == 0 {
        return Ok(None);
    }
    let mut rows: Vec<(usize, Row)> = sims
        .simulators
        .iter()
        .zip(DEFAULT_CONFIGS.iter().zip(labels))
        .enumerate()
        .map(|(index, (sim, (label, conf)))| {
            (
                index,
                Row {
                    label: label.to_string(),
                    conf,
                    stats: sim.stats(),
                    other_order: None,
                },
            )
        })
        .collect();
    // The default settings' row comes first in DEFAULT_CONFIGS: the best is told beside it.
    let default_reserved = rows.first().map_or(0, |(_, row)| row.stats.peak_reserved);
    rows.sort_by_key(|(index, row)| rank_key(*index, row));
    Ok(rows
        .into_iter()
        .next()
        .map(|(_, row)| (row, default_reserved)))
}

/// Libraries that are not the user's code: NVIDIA's, PyTorch's, the recorder's, the C
/// library's and the Python interpreter's (whose frames stand for Python code).
const LIBRARY_PREFIXES: [&str; 12] = [
    "libcud",
    "libcublas",
    "libnccl",
    "libnvidia",
    "libtorch",
    "libc10",
    "libvramshim",
    "libc.so",
    "libffi",
    "libpython",
    "_ctypes",
    "python",
];

/// The innermost native frame with a source line in the user's code.
fn user_frame(frames: &[SymFrame], fakes_lib: &Path) -> Option<SymFrame> {
    frames
        .iter()
        .find(|frame| {
            let module = Path::new(&*frame.module);
            let base = module.file_name().and_then(|n| n.to_str()).unwrap_or("");
            *frame.module != *PYTHON_MODULE
                && frame.file.is_some()
                && frame.line.is_some()
                && !module.starts_with(fakes_lib)
                && !frame.module.contains("/lib-dynload/")
                && !LIBRARY_PREFIXES
                    .iter()
                    .any(|prefix| base.starts_with(prefix))
        })
        .cloned()
}

/// The innermost Python frame outside installed packages (else the innermost Python frame).
fn python_frame(frames: &[SymFrame]) -> Option<SymFrame> {
    let python = || {
        frames
            .iter()
            .filter(|f| *f.module == *PYTHON_MODULE && f.file.is_some())
    };
    python()
        .find(|f| {
            f.file.as_deref().is_some_and(|file| {
                !file.contains("/site-packages/")
                    && !file.contains("/dist-packages/")
                    && !file.starts_with('<')
            })
        })
        .or_else(|| python().next())
        .cloned()
}

/// The machine's cards a program sees under `CUDA_VISIBLE_DEVICES`, in the program's order,
/// read as the fake driver (and the real one) reads it: `None` when the variable is unset;
/// indices (`"1gpu"` is 1) or `GPU-` UUIDs and unique prefixes of the fakes' UUIDs, the first
/// entry that is not a device ending the list; a device named twice or an ambiguous prefix:
/// none. (Cards in MIG mode: [`visible_mig_device`].)
fn visible_device_list(count: u32, value: Option<&str>) -> Option<Vec<u32>> {
    let value = value?;
    let first = value.trim_start_matches([' ', '\t']);
    let uuids = first.starts_with("GPU-");
    let mut seen: Vec<u32> = Vec::new();
    for entry in value.split(',') {
        let entry = entry.trim_matches([' ', '\t']);
        let device = if uuids {
            let prefix = "gpu-46414b45-4750-5500";
            if entry.len() <= 4 || !entry.starts_with("GPU-") {
                None
            } else {
                let entry = entry.to_ascii_lowercase();
                let matches: Vec<u32> = (0..count)
                    .filter(|d| format!("{prefix}-0000-0000000000{d:02x}").starts_with(&entry))
                    .collect();
                if matches.len() > 1 {
                    return Some(Vec::new());
                }
                matches.first().copied()
            }
        } else {
            let digits = entry.strip_prefix('+').unwrap_or(entry);
            let digits: String = digits.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok().filter(|&d| d < count)
        };
        let Some(device) = device else { break };
        if seen.contains(&device) {
            return Some(Vec::new());
        }
        seen.push(device);
    }
    Some(seen)
}

/// The MIG device a program sees on cards all in MIG mode (`counts`: each card's MIG devices)
/// under `CUDA_VISIBLE_DEVICES`, as the fake driver reads it: unset, card 0's MIG device 0;
/// else the first entry's: an index or `GPU-` UUID (or unique prefix) names its card's MIG
/// device 0, a `MIG-` UUID (or unique prefix) that MIG device; `None` when the first entry
/// names none, or several.
fn visible_mig_device(counts: &[u32], value: Option<&str>) -> Option<(u32, u32)> {
    let Some(value) = value else {
        return (counts.first().copied().unwrap_or(0) > 0).then_some((0, 0));
    };
    let entry = value.split(',').next()?.trim_matches([' ', '\t']);
    if entry.starts_with("MIG-") && entry.len() > 4 {
        let entry = entry.to_ascii_lowercase();
        let matches: Vec<(u32, u32)> = (0..counts.len() as u32)
            .flat_map(|card| (0..counts[card as usize]).map(move |index| (card, index)))
            .filter(|(card, index)| {
                format!("mig-46414b45-4d49-4700-0000-00000000{index:02x}{card:02x}")
                    .starts_with(&entry)
            })
            .collect();
        return (matches.len() == 1).then(|| matches[0]);
    }
    let card = *visible_device_list(counts.len() as u32, Some(entry))?.first()?;
    Some((card, 0))
}

/// The fakes' device ledger (`VRAMSHIM_FAKEGPU_LEDGER`, laid out in
/// `fakegpu/src/cuda/ledger.c`, version 2) at the end of the run: per machine device the most
/// bytes in use at once over every process, and charges no hook sees (a context, kernel code)
/// refused for lack of room, with the first of them; and how many processes asked each device
/// for memory (each has a context there).
struct LedgerEnd {
    peak: Vec<u64>,
    processes: Vec<u32>,
    unseen_refused: Vec<u64>,
    /// Process, machine device, bytes asked, bytes in use then.
    first_refusal: Option<(i32, u32, u64, u64)>,
}

const LEDGER_MAGIC: u64 = 0x3172_6764_7264_6c66;
const LEDGER_DEVICES: usize = 64;
const LEDGER_SIZE: usize = 1088 + 520 * 256;
/// Where the processes per device lie (after 254 slots of 520 bytes).
const LEDGER_PROCESSES: usize = 1088 + 520 * 254;

/// `None` when no process laid the ledger out (no CUDA call), or it is not one.
fn read_ledger(path: &Path) -> Option<LedgerEnd> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() != LEDGER_SIZE {
        return None;
    }
    let u64_at = |at: usize| -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_ne_bytes(word)
    };
    let u32_at = |at: usize| -> u32 {
        let mut word = [0u8; 4];
        word.copy_from_slice(&bytes[at..at + 4]);
        u32::from_ne_bytes(word)
    };
    if u64_at(0) != LEDGER_MAGIC || u32_at(8) != 2 || u32_at(16) != LEDGER_DEVICES as u32 {
        return None;
    }
    let pid = u32_at(1048) as i32;
    Some(LedgerEnd {
        peak: (0..LEDGER_DEVICES).map(|d| u64_at(24 + 8 * d)).collect(),
        processes: (0..LEDGER_DEVICES)
            .map(|d| u32_at(LEDGER_PROCESSES + 4 * d))
            .collect(),
        unseen_refused: (0..LEDGER_DEVICES).map(|d| u64_at(536 + 8 * d)).collect(),
        first_refusal: (pid != 0).then(|| (pid, u32_at(1052), u64_at(1056), u64_at(1064))),
    })
}

/// The ledger's figures by device as the program numbers them.
#[derive(Default)]
struct MachineSeen {
    peaks: Vec<(i32, u64)>,
    /// Processes that took a context on each device.
    processes: Vec<(i32, u32)>,
    refusal: Option<UnseenRefusal>,
}

impl LedgerEnd {
    /// VISIBLE: the machine's cards in the program's order (`None`: all, in order).
    fn as_seen(&self, count: u32, visible: Option<&[u32]>) -> MachineSeen {
        let all: Vec<u32> = (0..count).collect();
        let order = visible.unwrap_or(&all);
        let program_device =
            |physical: u32| order.iter().position(|&p| p == physical).map(|v| v as i32);
        MachineSeen {
            peaks: order
                .iter()
                .enumerate()
                .filter_map(|(v, &p)| Some((v as i32, *self.peak.get(p as usize)?)))
                .collect(),
            processes: order
                .iter()
                .enumerate()
                .filter_map(|(v, &p)| Some((v as i32, *self.processes.get(p as usize)?)))
                .collect(),
            refusal: self
                .first_refusal
                .map(|(pid, physical, bytes, used)| UnseenRefusal {
                    pid,
                    device: program_device(physical).unwrap_or(-1),
                    bytes,
                    used,
                    count: self.unseen_refused.iter().sum(),
                }),
        }
    }
}

#[cfg(test)]
mod visible_tests {
    use super::{visible_device_list, visible_mig_device};

    fn visible_devices(count: u32, value: Option<&str>) -> Option<u32> {
        visible_device_list(count, value).map(|list| list.len() as u32)
    }

    #[test]
    fn visible_devices_are_read_as_the_driver_reads_them() {
        let uuid = |d: u32| format!("GPU-46414b45-4750-5500-0000-0000000000{d:02x}");
        for (value, seen) in [
            ("2,0", 2),
            (" 3 , 1gpu", 2),
            ("1,7,2", 1),
            ("1,-1,2", 1),
            ("0,2,0", 0),
            ("", 0),
            ("x", 0),
            ("GPU-46414b45-4750-5500-0000-00000000000", 0),
            ("MIG-46414b45", 0),
        ] {
            assert_eq!(visible_devices(4, Some(value)), Some(seen), "{value:?}");
        }
        assert_eq!(visible_devices(4, Some(&format!("{},1", uuid(2)))), Some(1));
        assert_eq!(
            visible_devices(4, Some(&format!("{},{}", uuid(3), uuid(1)))),
            Some(2)
        );
        assert_eq!(visible_devices(4, None), None);
        // MIG mode: one MIG device at most, named by its MIG- UUID (or a prefix) or its card.
        let mig = |d: u32| format!("MIG-46414b45-4d49-4700-0000-0000000000{d:02x}");
        let one_each = [1, 1, 1, 1];
        for (value, seen) in [
            (mig(2), Some((2, 0))),
            (format!("{},{}", mig(3), mig(1)), Some((3, 0))),
            ("MIG-46414b45-4d49".to_owned(), None),
            ("MIG-46414b45-4d49-4700-0000-00000000000".to_owned(), None),
            (format!("{},1", uuid(2)), Some((2, 0))),
            ("2,0".to_owned(), Some((2, 0))),
            ("x".to_owned(), None),
        ] {
            assert_eq!(
                visible_mig_device(&one_each, Some(&value)),
                seen,
                "{value:?}"
            );
        }
        // Several MIG devices on a card: the MIG index is the UUID's byte before the card's.
        let layout = [3, 1, 2];
        assert_eq!(visible_mig_device(&layout, None), Some((0, 0)));
        assert_eq!(
            visible_mig_device(&layout, Some("MIG-46414b45-4d49-4700-0000-000000000102")),
            Some((2, 1))
        );
        assert_eq!(
            visible_mig_device(&layout, Some("MIG-46414b45-4d49-4700-0000-000000000200")),
            Some((0, 2))
        );
        assert_eq!(
            visible_mig_device(&layout, Some("MIG-46414b45-4d49-4700-0000-000000000201")),
            None
        );
        assert_eq!(
            visible_mig_device(&layout, Some("MIG-46414b45-4d49-4700-0000-0000000001")),
            None
        );
        assert_eq!(visible_mig_device(&layout, Some("1")), Some((1, 0)));
        assert_eq!(visible_devices(4, Some(&mig(1))), Some(0));
        // The order is the program's: its device 0 is the machine's card 2.
        assert_eq!(visible_device_list(4, Some("2,0")), Some(vec![2, 0]));
        assert_eq!(
            visible_device_list(4, Some(&format!("{},{}", uuid(3), uuid(1)))),
            Some(vec![3, 1])
        );
        assert_eq!(visible_mig_device(&one_each, Some(&mig(2))), Some((2, 0)));
    }
}
