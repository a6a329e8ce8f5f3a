//! `vramshim dryrun`: the verdict of a run on simulated GPUs, as text or JSON (one schema).

use std::io::{self, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;

use serde_json::{Value, json};

use super::frames::Fold;
use super::oom::{FailureView, explain};
use super::whatif::Row;
use super::{device_name, frame_json, group_json, live_json, short_stack, write_groups};
use crate::analysis::allocator::Pattern;
use crate::gpus::Gpu;
use crate::replay::Process;
use crate::symbols::SymFrame;
use crate::units::{bytes, counted, seconds};

/// What every verdict says it cannot see.
pub const LIMITS: &str = "data-dependent control flow sees only values copied back from the simulated device (the fakes compute nothing); autotuning sees fake timings; memory that cuDNN, cuBLAS and NCCL take inside a real GPU, the CUDA context and the kernels a real driver loads (the first kernel's modules, cuBLAS's at a device's first handle, cuDNN's at its first execution, NCCL's) are figures measured on an H100 and an H200 (estimates on other cards; NCCL measured for one rank only); not charged: other kernels a real driver loads at their first launch, and small allocations are charged exactly where a real driver gives them 2 MiB pages: against an H200 with PyTorch 2.11, 2.0 MB under for an MLP, 0.13 MB over for a small ResNet; the workspaces cuFFT, cuSOLVER and cuDNN's CTC loss ask for follow a real H100's answers where measured (CTC 32 of 32 queries, cuFFT 10 of 10 transforms, cuSOLVER 60 of 80 queries) and are estimates beyond them; cuDNN's RNN work spaces are estimates (within 11% of an H200's and an H100's for 9 networks in 12)";

/// Live stacks listed under a failure (text).
const TOP_STACKS: usize = 5;
/// Frames shown per stack (text).
const FRAMES: usize = 6;

/// One simulated device.
pub struct DeviceVerdict {
    pub device: i32,
    /// Highest bytes live through the hooks (segments under a caching allocator).
    pub peak_recorded: u64,
    pub peak_recorded_t_ns: Option<u64>,
    pub pattern: Pattern,
    /// Largest device memory used that no hook saw, from the memory samples (the context).
    pub untracked: Option<u64>,
    /// Highest device memory used, context included; `None` without memory samples.
    pub peak_used: Option<u64>,
    pub capacity: u64,
    pub failures: u64,
}

impl DeviceVerdict {
    /// What the recorded bytes are, given the allocator the log shows.
    pub fn recorded_kind(&self) -> &'static str {
        match self.pattern {
            Pattern::NativeCaching | Pattern::ExpandableSegments => "reserved",
            Pattern::CudaMallocAsync | Pattern::PerBuffer => "allocated",
            Pattern::Unknown => "recorded",
        }
    }

    /// Capacity left at the peak.
    pub fn headroom(&self) -> u64 {
        self.capacity
            .saturating_sub(self.peak_used.unwrap_or(self.peak_recorded))
    }
}

/// The first allocation the program did not recover from.
pub struct FailureVerdict<'a> {
    pub view: FailureView<'a>,
    /// Innermost native frame with a source line in the user's code.
    pub user_frame: Option<SymFrame>,
    /// Innermost Python frame outside installed packages.
    pub python_frame: Option<SymFrame>,
    /// Device memory used at the failure plus the request.
    pub needed: u64,
}

/// Memory no hook sees (a process's CUDA context, kernel code) that the simulated card
/// refused for lack of room, from the fakes' device ledger: the program got an error that no
/// recorded allocation explains.
pub struct UnseenRefusal {
    /// The first refusal's process, device (as the program numbers it), bytes asked, and the
    /// bytes every process on the card had in use then.
    pub pid: i32,
    pub device: i32,
    pub bytes: u64,
    pub used: u64,
    /// Refusals of this kind on every device.
    pub count: u64,
}

/// The MIG layout of the cards (`--mig`) and the MIG device the program sees, if any: its
/// card, index there, GPU instance id and UUID.
pub struct MigSeen {
    pub layout: String,
    pub device: Option<(u32, u32, u32, String)>,
}

pub struct DryrunReport<'a> {
    pub gpu: &'a Gpu,
    pub count: u32,
    pub mig: Option<MigSeen>,
    /// The cards `CUDA_VISIBLE_DEVICES` leaves the program; `None` when it is unset.
    pub visible: Option<u32>,
    pub command: &'a [String],
    pub status: ExitStatus,
    /// Functions the program called or looked up (the driver's `cuGetProcAddress`) that the
    /// fake libraries do not implement, in the order first asked for.
    pub unimplemented: Vec<String>,
    pub logs: &'a [PathBuf],
    pub processes: &'a [Process],
    pub devices: Vec<DeviceVerdict>,
    pub failure: Option<FailureVerdict<'a>>,
    pub unseen_refusal: Option<UnseenRefusal>,
    /// Failed allocations that PyTorch's release-and-retry recovered.
    pub recovered: u64,
    /// Device memory the job needs at least, on the simulated card.
    pub needed: u64,
    /// The smallest preset whose memory exceeds what is needed (its own context counted once
    /// per process that used the device, with a device ledger).
    pub smallest: Option<Gpu>,
    /// The best allocator setting for a per-tensor log that failed, and the peak reserved
    /// bytes the default settings gave on the same requests.
    pub whatif: Option<(Row, u64)>,
    /// Which frames the text shows.
    pub fold: Fold,
}

impl DryrunReport<'_> {
    pub fn fits(&self) -> bool {
        self.failure.is_none() && self.unseen_refusal.is_none()
    }

    /// The program ran to its end: it exited with status 0, or ran out of memory (then the
    /// verdict is the answer), rather than stopping for another reason, after which the run
    /// says nothing of what the rest of the program would have needed.
    pub fn completed(&self) -> bool {
        self.status.success() || !self.fits()
    }

    fn report_command(&self) -> Option<String> {
        if self.logs.is_empty() {
            return None;
        }
        let logs: Vec<String> = self
            .logs
            .iter()
            .map(|l| shell_word(&l.display().to_string()))
            .collect();
        Some(format!("vramshim report {}", logs.join(" ")))
    }

    fn whatif_note(&self) -> Option<String> {
        let failure = self.failure.as_ref()?;
        let device = failure.view.failure.device;
        let pattern = self.devices.iter().find(|d| d.device == device)?.pattern;
        if self.whatif.is_some() {
            return None;
        }
        Some(if pattern.is_segments() {
            "the log shows the caching allocator's segments, not tensors: run the dry run again with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync to have allocator settings simulated and ranked".to_string()
        } else {
            "no allocation to simulate on the failing device".to_string()
        })
    }
}

fn shell_word(text: &str) -> String {
    if text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+%:,=".contains(c))
    {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

fn exit_json(status: ExitStatus) -> Value {
    json!({"code": status.code(), "signal": status.signal()})
}

fn exit_text(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => "unknown exit".to_string(),
    }
}

fn gpu_json(gpu: &Gpu) -> Value {
    json!({
        "key": gpu.key,
        "name": gpu.name,
        "memory": gpu.memory,
        "compute_capability": format!("{}.{}", gpu.cc.0, gpu.cc.1),
        "sms": gpu.sms,
        "context_bytes": gpu.context_bytes,
        "module_bytes": gpu.module_bytes,
        "cublas_kernel_bytes": gpu.cublas_kernel_bytes,
        "cudnn_kernel_bytes": gpu.cudnn_kernel_bytes,
        "nccl_bytes": gpu.nccl_bytes,
        "measured": gpu.measured,
        "source": gpu.source,
    })
}

fn place_json(frame: &Option<SymFrame>) -> Value {
    frame.as_ref().map_or(Value::Null, frame_json)
}

pub fn json(report: &DryrunReport<'_>) -> Value {
    let processes = report.processes;
    let failure = report.failure.as_ref().map(|verdict| {
        let f = verdict.view.failure;
        let process = &processes[f.process as usize];
        json!({
            "pid": process.header.pid,
            "t_ns": f.t_ns,
            "api": process.api(f.api),
            "device": f.device,
            "request": f.request,
            "thread": f.thread,
            "thread_name": process.thread_names.get(&f.thread),
            "result": f.result,
            "free": f.mem_info.map(|(free, _)| free),
            "total": f.mem_info.map(|(_, total)| total),
            "used": f.mem_info.map(|(free, total)| total.saturating_sub(free)),
            "tracked_bytes": f.tracked_bytes,
            "tracked_count": f.tracked_count,
            "verdict": f.verdict.name(),
            "explanation": explain(f),
            "user_frame": place_json(&verdict.user_frame),
            "python_frame": place_json(&verdict.python_frame),
            "frames": verdict.view.frames.iter().map(frame_json).collect::<Vec<_>>(),
            "retry": f.retry.map(|r| json!({
                "released_bytes": r.released_bytes,
                "released_count": r.released_count,
                "succeeded": r.succeeded,
                "t_ns": r.t_ns,
                "oversize": r.oversize,
            })),
            "largest_live": f.largest_live.iter().map(|l| live_json(l, processes)).collect::<Vec<_>>(),
            "live_by_stack": verdict.view.live_groups.iter().map(|g| group_json(g, f.tracked_bytes, processes)).collect::<Vec<_>>(),
            "needed": verdict.needed,
        })
    });
    json!({
        "gpu": gpu_json(report.gpu),
        "count": report.count,
        "mig": report.mig.as_ref().map(|mig| json!({
            "layout": mig.layout,
            "device": mig.device.as_ref().map(|(card, index, gpu_instance, uuid)| json!({
                "card": card,
                "index": index,
                "gpu_instance": gpu_instance,
                "uuid": uuid,
            })),
        })),
        "visible_devices": report.visible,
        "command": report.command,
        "exit": exit_json(report.status),
        "fits": report.fits(),
        "completed": report.completed(),
        "unimplemented": report.unimplemented,
        "devices": report.devices.iter().map(|d| json!({
            "device": d.device,
            "peak_recorded": d.peak_recorded,
            "peak_recorded_kind": d.recorded_kind(),
            "peak_recorded_t_ns": d.peak_recorded_t_ns,
            "allocator": d.pattern.name(),
            "untracked": d.untracked,
            "peak_used": d.peak_used,
            "capacity": d.capacity,
            "headroom": d.headroom(),
            "failures": d.failures,
        })).collect::<Vec<_>>(),
        "failure": failure,
        "unseen_refusal": report.unseen_refusal.as_ref().map(|r| json!({
            "pid": r.pid,
            "device": r.device,
            "bytes": r.bytes,
            "used": r.used,
            "count": r.count,
        })),
        "recovered_failures": report.recovered,
        "needed": report.needed,
        "smallest_fitting_gpu": report.smallest.as_ref().map(gpu_json),
        "whatif": report.whatif.as_ref().map(|(row, default_reserved)| json!({
            "label": row.label,
            "conf": row.conf,
            "peak_reserved_before_failure": row.stats.peak_reserved,
            "default_peak_reserved_before_failure": default_reserved,
            "ooms_before_failure": row.stats.num_ooms,
            "requests": row.stats.allocs,
        })),
        "whatif_note": report.whatif_note(),
        "limits": LIMITS,
        "logs": report.logs,
        "report_command": report.report_command(),
    })
}

pub fn text(out: &mut dyn Write, report: &DryrunReport<'_>) -> io::Result<()> {
    let gpu = report.gpu;
    // In MIG mode the program has one MIG device, whatever the cards hold (the line below).
    let card = if report.mig.is_some() {
        format!("{} ({}", gpu.name, bytes(gpu.memory))
    } else {
        format!(
            "{} x {} ({} each",
            report.count,
            gpu.name,
            bytes(gpu.memory)
        )
    };
    writeln!(
        out,
        "\nvramshim dryrun: {card}, compute capability {}.{}, {} SMs; a CUDA context takes {}, the first kernel {}, cuBLAS's kernels {}, cuDNN's {}, each NCCL rank {}: {})",
        gpu.cc.0,
        gpu.cc.1,
        gpu.sms,
        bytes(gpu.context_bytes),
        bytes(gpu.module_bytes),
        bytes(gpu.cublas_kernel_bytes),
        bytes(gpu.cudnn_kernel_bytes),
        bytes(gpu.nccl_bytes),
        if gpu.measured {
            "measured on this card"
        } else {
            "estimates"
        }
    )?;
    if let Some(mig) = &report.mig {
        match &mig.device {
            Some((card, index, gpu_instance, uuid)) => writeln!(
                out,
                "MIG: {} holding {}; the program's device is card {card}'s MIG device {index} (GPU instance {gpu_instance}, {uuid}), the one MIG device CUDA enumerates",
                counted(u64::from(report.count), "card"),
                mig.layout
            )?,
            None => writeln!(
                out,
                "MIG: {} holding {}; CUDA_VISIBLE_DEVICES names none of their MIG devices",
                counted(u64::from(report.count), "card"),
                mig.layout
            )?,
        }
    }
    if let Some(visible) = report.visible {
        writeln!(
            out,
            "CUDA_VISIBLE_DEVICES leaves the program {visible} of {}",
            counted(u64::from(report.count), "card")
        )?;
    }
    writeln!(
        out,
        "program: {} ({})",
        report.command.join(" "),
        exit_text(report.status)
    )?;
    if !report.completed() {
        writeln!(
            out,
            "verdict: FITS AS FAR AS IT RAN: the program stopped ({}) before its end, not for want of memory; what the rest of it needs is not known",
            exit_text(report.status)
        )?;
    } else if report.fits() {
        writeln!(out, "verdict: FITS")?;
    } else {
        writeln!(out, "verdict: DOES NOT FIT")?;
    }
    if !report.unimplemented.is_empty() {
        writeln!(
            out,
            "  the fake GPU does not implement {} the program called or looked up (answered \"not supported\" or \"not found\" where a real card may have run it: what followed may differ on a card): {}",
            counted(report.unimplemented.len() as u64, "function"),
            report.unimplemented.join(", ")
        )?;
    }
    if report.logs.is_empty() {
        writeln!(
            out,
            "  no log was written: the program made no CUDA memory call"
        )?;
    }
    for d in &report.devices {
        let used = match (d.peak_used, d.untracked) {
            (Some(used), Some(untracked)) => format!(
                "peak used {} (of which {} no hook sees: context, modules)",
                bytes(used),
                bytes(untracked)
            ),
            (Some(used), None) => format!("peak used {}", bytes(used)),
            _ => "no memory sample".to_string(),
        };
        writeln!(
            out,
            "  {}: peak {} {}{}; {}; capacity {}; headroom {}{}",
            device_name(d.device),
            d.recorded_kind(),
            bytes(d.peak_recorded),
            d.peak_recorded_t_ns
                .map_or_else(String::new, |t| format!(" at {}", seconds(t))),
            used,
            bytes(d.capacity),
            bytes(d.headroom()),
            if d.failures > 0 {
                format!("; {} failed allocation(s)", d.failures)
            } else {
                String::new()
            }
        )?;
    }
    if report.recovered > 0 {
        writeln!(
            out,
            "  {} failed allocation(s) recovered after releasing cached memory (PyTorch's retry)",
            report.recovered
        )?;
    }
    if let Some(r) = &report.unseen_refusal {
        writeln!(
            out,
            "  process {} could not get {} for its CUDA context or kernel code on {}: {} of {} was in use by the processes on the card ({} such refusal(s); no recorded call failed)",
            r.pid,
            bytes(r.bytes),
            device_name(r.device),
            bytes(r.used),
            bytes(report.gpu.memory),
            r.count
        )?;
    }
    if let Some(verdict) = &report.failure {
        let f = verdict.view.failure;
        let process = &report.processes[f.process as usize];
        writeln!(
            out,
            "\nfirst failed allocation: {} of {} on {} at {} (thread {})",
            process.api(f.api),
            bytes(f.request),
            device_name(f.device),
            seconds(f.t_ns),
            process.thread_name(f.thread)
        )?;
        if let Some(frame) = &verdict.python_frame {
            writeln!(
                out,
                "  python: {}",
                super::frames::text_label(frame, report.fold)
            )?;
        }
        if let Some(frame) = &verdict.user_frame {
            writeln!(
                out,
                "  at: {}",
                super::frames::text_label(frame, report.fold)
            )?;
        }
        writeln!(out, "  {}", explain(f))?;
        match f.retry {
            Some(retry) => writeln!(
                out,
                "  PyTorch's retry: released {} in {} free(s), asked again: {}",
                bytes(retry.released_bytes),
                retry.released_count,
                if retry.succeeded {
                    "succeeded"
                } else {
                    "failed again"
                }
            )?,
            None => writeln!(out, "  no retry (nothing was released and asked again)")?,
        }
        if !f.largest_live.is_empty() {
            writeln!(
                out,
                "  live on the device: {} in {}; largest:",
                bytes(f.tracked_bytes),
                counted(f.tracked_count, "allocation")
            )?;
            for (live, frames) in f.largest_live.iter().zip(&verdict.view.largest_frames) {
                writeln!(
                    out,
                    "    {:>11}  {} at {}  {}",
                    bytes(live.size),
                    process.api(live.api),
                    seconds(live.t_ns),
                    short_stack(frames, 2, report.fold)
                )?;
            }
        }
        if !verdict.view.live_groups.is_empty() {
            writeln!(out, "  live by stack:")?;
            write_groups(
                out,
                &verdict.view.live_groups,
                f.tracked_bytes,
                TOP_STACKS,
                FRAMES,
                report.fold,
            )?;
        }
    }
    writeln!(out)?;
    match &report.smallest {
        Some(card) => writeln!(
            out,
            "needs at least {}: the smallest card that fits is {} ({}, {})",
            bytes(report.needed),
            card.key,
            card.name,
            bytes(card.memory)
        )?,
        None => writeln!(
            out,
            "needs at least {}: no preset card is large enough (use more devices or less memory)",
            bytes(report.needed)
        )?,
    }
    if let Some((row, default_reserved)) = &report.whatif {
        writeln!(
            out,
            "best allocator setting, simulated on the {} allocations made before the failure (the failed request and what would have followed it are not in the recording): PYTORCH_CUDA_ALLOC_CONF={} peak reserved {} ({} with the default settings){} (`vramshim whatif LOG` ranks them all)",
            row.stats.allocs,
            if row.conf.is_empty() { "''" } else { &row.conf },
            bytes(row.stats.peak_reserved),
            bytes(*default_reserved),
            if row.fits() {
                ""
            } else {
                ", and it already ran out"
            }
        )?;
    }
    if let Some(note) = report.whatif_note() {
        writeln!(out, "allocator settings: {note}")?;
    }
    writeln!(out, "limits: {LIMITS}")?;
    for log in report.logs {
        writeln!(out, "log: {}", log.display())?;
    }
    if let Some(command) = report.report_command() {
        writeln!(out, "full report: {command}")?;
    }
    Ok(())
}

/// `--list-gpus`: the presets.
pub fn list_gpus(out: &mut dyn Write, gpus: &[Gpu]) -> io::Result<()> {
    writeln!(
        out,
        "{:<10} {:<24} {:>16} {:>11} {:>4} {:>5} {:>10} {:>10}  source of the memory figure",
        "--gpu", "name", "memory (bytes)", "memory", "cc", "SMs", "context", "NCCL rank"
    )?;
    for gpu in gpus {
        writeln!(
            out,
            "{:<10} {:<24} {:>16} {:>11} {:>4} {:>5} {:>10} {:>10}  {}",
            gpu.key,
            gpu.name,
            gpu.memory,
            bytes(gpu.memory),
            format!("{}.{}", gpu.cc.0, gpu.cc.1),
            gpu.sms,
            bytes(gpu.context_bytes),
            bytes(gpu.nccl_bytes),
            gpu.source
        )?;
    }
    writeln!(
        out,
        "h100-sxm is h100. Contexts, the kernels loaded (the first kernel's {}, cuBLAS's {}, cuDNN's {}) and NCCL ranks: measured on the h100 and h200 (driver 580.159.04, CUDA 13, PyTorch 2.11, cuBLAS 13.1, cuDNN 9.19, NCCL 2.28.9), estimates on the others; docs/gpus.md gives the sources.",
        bytes(crate::gpus::MODULE_MEASURED_HOPPER),
        bytes(crate::gpus::CUBLAS_KERNELS_MEASURED_HOPPER),
        bytes(crate::gpus::CUDNN_KERNELS_MEASURED_HOPPER)
    )
}
