//! Suggestions from a recording's breakdown, steps and simulated allocator settings, each
//! with the figures that support it and the bytes it would free. Ranked by those bytes.

use std::rc::Rc;

use crate::analysis::breakdown::{Category, DeviceBreakdown};
use crate::analysis::steps::ProcessSteps;

/// Activations at the peak worth checkpointing: this share of what the device held
/// (allocations and cache; the context is not the program's to change).
pub const ACTIVATIONS_SHARE: f64 = 0.20;
/// Optimizer state worth shrinking: this share of what the device held.
pub const OPTIMIZER_SHARE: f64 = 0.20;
/// Activations saved for no backward pass worth `no_grad`: this share of what the device
/// held.
pub const EVALUATION_SHARE: f64 = 0.05;
/// Activations worth halving with autocast: this share of what the device held.
pub const AUTOCAST_SHARE: f64 = 0.10;
/// Out-of-place ReLU outputs kept for backward worth `inplace=True`: their highest live
/// bytes as this share of what the device held.
pub const RELU_SHARE: f64 = 0.05;
/// A cache worth simulating allocator settings for: this share of what the device held.
pub const CACHE_SHARE: f64 = 0.10;

/// What `whatif` found for a device's cache.
#[derive(Clone, Debug)]
pub struct CacheEvidence {
    pub device: i32,
    pub default_peak_reserved: u64,
    pub best_conf: String,
    pub best_peak_reserved: u64,
}

/// What a suggestion is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Memory grows every step: a line keeps what it allocates.
    Growth,
    /// Activations dominate at the peak.
    Activations,
    /// The optimizer's state is a large share.
    OptimizerState,
    /// The allocator's cache, and a setting that holds less.
    AllocatorCache,
    /// Activations saved in a forward that no backward used (evaluation with autograd on).
    Evaluation,
    /// No allocation went through autocast: activations in fp32.
    Autocast,
    /// Whole segments of the cache hold no tensor at the peak: `empty_cache()` returns them.
    EmptyCache,
    /// Out-of-place ReLU outputs kept for backward: `inplace=True` writes into the input.
    InplaceRelu,
    /// Activations dominate and every optimizer step runs one forward pass: accumulate
    /// gradients over micro-batches.
    GradientAccumulation,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Growth => "growth_per_step",
            Kind::Activations => "activations",
            Kind::OptimizerState => "optimizer_state",
            Kind::AllocatorCache => "allocator_cache",
            Kind::Evaluation => "evaluation_without_no_grad",
            Kind::Autocast => "autocast",
            Kind::EmptyCache => "empty_cache",
            Kind::InplaceRelu => "inplace_relu",
            Kind::GradientAccumulation => "gradient_accumulation",
        }
    }
}

/// One suggestion.
#[derive(Clone, Debug)]
pub struct Suggestion {
    pub kind: Kind,
    /// The device it is about (None: a process's steps, every device).
    pub device: Option<i32>,
    /// Bytes it would free (an estimate where said so in `action`).
    pub bytes: u64,
    /// What to change.
    pub action: String,
    /// The figures behind it.
    pub evidence: Vec<String>,
    /// For growth: the leaking line (file, line).
    pub line: Option<(Rc<str>, u32)>,
    /// For growth: the process id.
    pub pid: Option<u32>,
}

/// What the device held at the peak, context left out.
fn held(device: &DeviceBreakdown) -> u64 {
    device.held_bytes()
}

fn at_peak(device: &DeviceBreakdown, category: Category) -> u64 {
    device.at_peak[category as usize]
}

fn share_of(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Whether `device`'s cache is large enough to ask `whatif` about.
pub fn cache_worth_asking(device: &DeviceBreakdown) -> bool {
    device
        .cache_at_peak
        .is_some_and(|cache| share_of(cache, held(device)) >= CACHE_SHARE)
}

fn size(bytes: u64) -> String {
    crate::units::bytes(bytes)
}

/// Every suggestion, most bytes first. `steps` come with their process ids.
pub fn suggest(
    devices: &[DeviceBreakdown],
    steps: &[(u32, ProcessSteps)],
    caches: &[CacheEvidence],
) -> Vec<Suggestion> {
    let mut found = Vec::new();
    // Forward passes per optimizer step, over the processes split at the optimizer's steps.
    let forwards: Vec<u32> = steps
        .iter()
        .filter_map(|(_, process)| process.forwards_per_step())
        .collect();
    let one_forward_per_step = !forwards.is_empty() && forwards.iter().all(|&f| f == 1);
    for (pid, process) in steps {
        if !process.grows() {
            continue;
        }
        let growth = process.growth();
        let Some(leak) = process.leaks.first() else {
            continue;
        };
        found.push(Suggestion {
            kind: Kind::Growth,
            device: None,
            bytes: leak.bytes,
            action: format!(
                "free what {}:{} keeps each step (a tensor still attached to its graph: `.item()` or `.detach()` what is accumulated); {} more are held after every step",
                leak.file,
                leak.line,
                size(leak.per_step.last().copied().unwrap_or(0))
            ),
            evidence: vec![
                format!(
                    "live bytes at the end of each step change by {} (steps 2 to {})",
                    growth
                        .iter()
                        .map(|d| size(d.unsigned_abs()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    process.closed().len()
                ),
                format!(
                    "{} in {} allocations made by {}:{} ({}) in steps 2 to {} are still live at the end of step {}",
                    size(leak.bytes),
                    leak.count,
                    leak.file,
                    leak.line,
                    leak.function,
                    process.closed().len() - 1,
                    process.closed().len()
                ),
            ],
            line: Some((leak.file.clone(), leak.line)),
            pid: Some(*pid),
        });
    }
    for device in devices.iter().filter(|d| d.device >= 0) {
        let whole = held(device);
        let unused = device.unused_activations_max;
        if share_of(unused, whole) >= EVALUATION_SHARE {
            found.push(Suggestion {
                kind: Kind::Evaluation,
                device: Some(device.device),
                bytes: unused,
                action: format!(
                    "run evaluation under torch.no_grad() or torch.inference_mode(): frees up to {} that autograd saves for a backward pass that never runs",
                    size(unused)
                ),
                evidence: vec![format!(
                    "{} of activations allocated in forward passes were freed without a backward pass, at most {} live at once ({:.1}% of the {} held at the peak)",
                    size(device.unused_activations_allocated),
                    size(unused),
                    share_of(unused, whole) * 100.0,
                    size(whole)
                )],
                line: None,
                pid: None,
            });
        }
        // Activations at their highest (the end of a forward pass), against what the device
        // held at its peak.
        let activations = device.max[Category::Activations as usize];
        if share_of(activations, whole) >= ACTIVATIONS_SHARE {
            found.push(Suggestion {
                kind: Kind::Activations,
                device: Some(device.device),
                bytes: activations,
                action: format!(
                    "activation checkpointing (torch.utils.checkpoint) of the largest blocks would free up to {}; halving the batch about {}",
                    size(activations),
                    size(activations / 2)
                ),
                evidence: vec![format!(
                    "activations at their highest: {} against {} held at the peak ({:.1}%)",
                    size(activations),
                    size(whole),
                    share_of(activations, whole) * 100.0
                )],
                line: None,
                pid: None,
            });
        }
        // Gradient accumulation: k micro-batches of 1/k of the batch, each forward's
        // activations freed by its backward before the next; activations scale with the
        // batch, so their highest becomes about 1/k (k = 2 ranked; k = 4 said too).
        if one_forward_per_step && share_of(activations, whole) >= ACTIVATIONS_SHARE {
            found.push(Suggestion {
                kind: Kind::GradientAccumulation,
                device: Some(device.device),
                bytes: activations - activations / 2,
                action: format!(
                    "accumulate gradients over k micro-batches (forward and backward on 1/k of the batch each, loss divided by k, one optimizer step): the same effective batch, activations at their highest about 1/k; k = 2 frees about {}, k = 4 about {}",
                    size(activations - activations / 2),
                    size(activations - activations / 4)
                ),
                evidence: vec![
                    "every optimizer step runs one forward pass (one model call per step at its call site)".to_string(),
                    format!(
                        "activations at their highest: {} against {} held at the peak ({:.1}%)",
                        size(activations),
                        size(whole),
                        share_of(activations, whole) * 100.0
                    ),
                ],
                line: None,
                pid: None,
            });
        }
        if !device.autocast && share_of(activations, whole) >= AUTOCAST_SHARE {
            found.push(Suggestion {
                kind: Kind::Autocast,
                device: Some(device.device),
                bytes: activations / 2,
                action: format!(
                    "run the forward pass under torch.autocast (bfloat16 or float16): 16-bit activations take half the bytes, about {} of {}",
                    size(activations / 2),
                    size(activations)
                ),
                evidence: vec![
                    "no allocation on this device went through torch.autocast (no at::autocast frame)".to_string(),
                    format!(
                        "activations at their highest: {} ({:.1}% of the {} held at the peak)",
                        size(activations),
                        share_of(activations, whole) * 100.0,
                        size(whole)
                    ),
                ],
                line: None,
                pid: None,
            });
        }
        // Out-of-place ReLUs: each output is a new tensor the size of its input, made while
        // the input is live (the input is dropped after, the output kept for backward). With
        // `inplace=True` the output is the input: the forward's highest moment is lower by
        // the largest such output, and none of their bytes are allocated.
        if device.relu_kept_count > 0 && share_of(device.relu_kept_max, whole) >= RELU_SHARE {
            let at_peak = device.relu_inplace_peak_drop;
            found.push(Suggestion {
                kind: Kind::InplaceRelu,
                device: Some(device.device),
                bytes: at_peak,
                action: format!(
                    "use ReLU(inplace=True) (or F.relu_): each ReLU output would be written into its input; the highest live bytes of the forward passes drop by {}, the device's peak by {}, and {} of allocations are not made",
                    size(device.relu_inplace_forward_drop),
                    size(at_peak),
                    size(device.relu_kept_allocated)
                ),
                evidence: vec![format!(
                    "{} ReLU outputs ({}) were made out of place in forward passes and kept for backward; at most {} live at once ({:.1}% of the {} held at the peak)",
                    device.relu_kept_count,
                    size(device.relu_kept_allocated),
                    size(device.relu_kept_max),
                    share_of(device.relu_kept_max, whole) * 100.0,
                    size(whole)
                )],
                line: None,
                pid: None,
            });
        }
        let state = at_peak(device, Category::OptimizerState);
        let parameters = at_peak(device, Category::Parameters);
        if share_of(state, whole) >= OPTIMIZER_SHARE {
            found.push(Suggestion {
                kind: Kind::OptimizerState,
                device: Some(device.device),
                // 8-bit state: a quarter of fp32's bytes.
                bytes: state - state / 4,
                action: format!(
                    "an 8-bit optimizer (bitsandbytes) would free about {} (a quarter of the bytes per state value); sharding the state over N ranks (ZeRO / FSDP) frees (N-1)/N of {}; a fused optimizer (fused=True) avoids its per-step temporaries",
                    size(state - state / 4),
                    size(state)
                ),
                evidence: vec![format!(
                    "optimizer state {} ({:.2}x the parameters' {}) of {} held at the peak ({:.1}%)",
                    size(state),
                    share_of(state, parameters.max(1)),
                    size(parameters),
                    size(whole),
                    share_of(state, whole) * 100.0
                )],
                line: None,
                pid: None,
            });
        }
        if let Some(unused) = device.unused_segments_at_peak
            && share_of(unused, whole) >= CACHE_SHARE
        {
            found.push(Suggestion {
                kind: Kind::EmptyCache,
                device: Some(device.device),
                bytes: unused,
                action: format!(
                    "`del` what is no longer needed and call torch.cuda.empty_cache() before the phase that reaches the peak: the device's reserved (and used) memory at the peak would be {} lower; the program's own allocations do not change",
                    size(unused)
                ),
                evidence: vec![format!(
                    "at the peak, {} of the allocator's segments hold no tensor ({:.1}% of the {} held; the whole cache is {})",
                    size(unused),
                    share_of(unused, whole) * 100.0,
                    size(whole),
                    size(device.cache_at_peak.unwrap_or(0))
                )],
                line: None,
                pid: None,
            });
        }
        if let Some(cache) = device.cache_at_peak
            && let Some(evidence) = caches.iter().find(|c| c.device == device.device)
            && evidence.best_peak_reserved < evidence.default_peak_reserved
        {
            let saved = evidence.default_peak_reserved - evidence.best_peak_reserved;
            found.push(Suggestion {
                kind: Kind::AllocatorCache,
                device: Some(device.device),
                bytes: saved,
                action: format!(
                    "PYTORCH_CUDA_ALLOC_CONF={} lowers the simulated peak reserved from {} to {}",
                    evidence.best_conf,
                    size(evidence.default_peak_reserved),
                    size(evidence.best_peak_reserved)
                ),
                evidence: vec![format!(
                    "allocator cache {} of {} held at the peak ({:.1}%); vramshim whatif ranks the settings",
                    size(cache),
                    size(whole),
                    share_of(cache, whole) * 100.0
                )],
                line: None,
                pid: None,
            });
        }
    }
    found.sort_by_key(|s| std::cmp::Reverse(s.bytes));
    found
}
