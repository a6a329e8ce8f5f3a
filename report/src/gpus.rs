//! The cards `vramshim dryrun` can simulate. Where each figure comes from: `docs/gpus.md`.

/// Device memory a CUDA context takes, for cards where it was not measured: an estimate
/// (reports range from about 300 MB to 700+ MB; see `docs/gpus.md`).
pub const CONTEXT_ESTIMATE: u64 = 512 << 20;

/// Device memory the primary context took on an H100 80GB HBM3 and on an H200, both with
/// driver 580.159.04 and CUDA 13.0: `cuMemGetInfo` used bytes right after the primary context
/// was made current, no library or kernel loaded (`scripts/gpu_probe.py driver`; the same
/// figure under PyTorch 2.11 after `torch.cuda.init()`).
pub const CONTEXT_MEASURED_HOPPER: u64 = 552_402_944;

/// Device memory taken outside PyTorch's allocator when PyTorch 2.11 ran its first kernel (its
/// kernel module loaded, lazily), the same on an H100 80GB HBM3 and an H200
/// (`scripts/gpu_probe.py`; docs/gpus.md). The fakes charge it at a device's first kernel.
pub const MODULE_MEASURED_HOPPER: u64 = 96_468_992;
/// The same for cards where it was not measured: the Hopper figure, an estimate.
pub const MODULE_ESTIMATE: u64 = MODULE_MEASURED_HOPPER;
/// Device memory no hook sees that PyTorch 2.11's first matmul took on an H100 80GB HBM3 and on
/// an H200 beyond the cuBLAS 13.1 handle's own `cuMemAlloc_v2`s (1 KiB, 128 KiB, 64 MiB, which
/// the fake cuBLAS makes): 69,206,016 bytes outside PyTorch's allocator - 67,240,960
/// (`scripts/gpu_probe.py`; docs/gpus.md). It equals one 2 MiB page less the two small
/// allocations, so it may be the driver's page as much as cuBLAS's kernels; a second thread's
/// handle took no more. The fakes charge it at a device's first cuBLAS handle.
pub const CUBLAS_KERNELS_MEASURED_HOPPER: u64 = 1_965_056;
/// The same for cards where it was not measured: the Hopper figure, an estimate.
pub const CUBLAS_KERNELS_ESTIMATE: u64 = CUBLAS_KERNELS_MEASURED_HOPPER;
/// Device memory no hook sees that PyTorch 2.11's first cuDNN 9.19 convolution, forward and
/// backward, took on an H100 80GB HBM3 and on an H200: 18,874,368 bytes outside PyTorch's
/// allocator less its two handles' `cuMemAlloc_v2`s (2 x (25,344 + 4), which the fake cuDNN
/// makes). The fakes charge it at a device's first cuDNN execution.
pub const CUDNN_KERNELS_MEASURED_HOPPER: u64 = 18_874_368 - 2 * (25_344 + 4);
/// The same for cards where it was not measured: the Hopper figure, an estimate.
pub const CUDNN_KERNELS_ESTIMATE: u64 = CUDNN_KERNELS_MEASURED_HOPPER;
/// Device memory NCCL 2.28.9 took for one rank (`init_process_group` of one rank and one
/// `all_reduce`) on the H200: 556 MiB, of which 195 `cuMemCreate` of 2 MiB, the rest its kernels.
pub const NCCL_MEASURED_H200: u64 = 583_008_256;
/// The same on the H100 80GB HBM3: 562 MiB.
pub const NCCL_MEASURED_H100: u64 = 589_299_712;
/// The same for cards where it was not measured: the H200's figure, an estimate.
pub const NCCL_ESTIMATE: u64 = NCCL_MEASURED_H200;

/// One simulated card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// What `--gpu` takes (case, spaces, `-` and `_` do not matter).
    pub key: &'static str,
    /// The name the driver reports.
    pub name: String,
    /// `totalGlobalMem`: device memory as the driver reports it.
    pub memory: u64,
    /// Compute capability (major, minor).
    pub cc: (u32, u32),
    pub sms: u32,
    /// Device memory the CUDA context takes on this card.
    pub context_bytes: u64,
    /// Device memory the first kernel launch on a device takes (modules loaded).
    pub module_bytes: u64,
    /// Device memory a device's first cuBLAS handle takes beyond its allocations (its kernels).
    pub cublas_kernel_bytes: u64,
    /// Device memory a device's first cuDNN execution takes (its kernels).
    pub cudnn_kernel_bytes: u64,
    /// Device memory each NCCL rank takes for itself on this card.
    pub nccl_bytes: u64,
    /// Whether the context, kernel and NCCL figures were measured on this card.
    pub measured: bool,
    /// Whether NVML reports an NVLink fabric (PyTorch then tries fabric handles first, which
    /// the driver refuses without an IMEX channel: error 800, as on the machines measured).
    pub fabric: bool,
    /// Where the memory figure comes from, in short.
    pub source: &'static str,
}

const MIB: u64 = 1 << 20;

struct Preset {
    key: &'static str,
    name: &'static str,
    memory: u64,
    cc: (u32, u32),
    sms: u32,
    /// The context's memory where measured, else [`CONTEXT_ESTIMATE`].
    context_bytes: u64,
    /// NCCL's memory per rank where measured, else [`NCCL_ESTIMATE`].
    nccl_bytes: u64,
    /// Measured on this card (the context, module and NCCL figures); an HGX system whose
    /// NVML reports a fabric.
    measured: bool,
    source: &'static str,
}

/// The table, in `--list-gpus` order after sorting by memory (see [`presets`]).
const PRESETS: [Preset; 12] = [
    Preset {
        key: "t4",
        name: "Tesla T4",
        memory: 15_843_721_216,
        cc: (7, 5),
        sms: 40,
        context_bytes: CONTEXT_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        source: "deviceQuery, exact",
    },
    Preset {
        key: "a10g",
        name: "NVIDIA A10G",
        memory: 23_030 * MIB,
        cc: (8, 6),
        sms: 80,
        context_bytes: CONTEXT_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        source: "PyTorch OOM message 22.49 GiB, ±5 MiB",
    },
    Preset {
        key: "l4",
        name: "NVIDIA L4",
        memory: 23_583_784_960,
        cc: (8, 9),
        sms: 58,
        context_bytes: CONTEXT_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        source: "deviceQuery, exact",
    },
    Preset {
        key: "rtx4090",
        name: "NVIDIA GeForce RTX 4090",
        memory: 24_217 * MIB,
        cc: (8, 9),
        sms: 128,
        context_bytes: CONTEXT_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        source: "PyTorch OOM message 23.65 GiB, ±5 MiB",
    },
    Preset {
        key: "rtx3090",
        name: "NVIDIA GeForce RTX 3090",
        memory: 24_269 * MIB,
        cc: (8, 6),
        sms: 82,
        context_bytes: CONTEXT_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        source: "PyTorch OOM message 23.70 GiB, ±5 MiB",
    },
    Preset {
        key: "a100-40gb",
        name: "NVIDIA A100-SXM4-40GB",
        memory: 42_298_834_944,
        cc: (8, 0),
        sms: 108,
        context_bytes: CONTEXT_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        source: "deviceQuery, exact",
    },
    Preset {
        key: "l40s",
        name: "NVIDIA L40S",
        // PyTorch's OOM message on an L40S, "a total capacity of 44.42 GiB"
        // (github.com/stepfun-ai/Step-Video-T2V/issues/8): 45,486 MiB, within 5 MiB. Ada,
        // compute capability 8.9; 18,176 CUDA cores at 128 an SM: 142 SMs.
        memory: 45_486 << 20,
        cc: (8, 9),
        sms: 142,
        context_bytes: CONTEXT_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        source: "PyTorch OOM message 44.42 GiB, ±5 MiB",
    },
    Preset {
        key: "a100-80gb",
        name: "NVIDIA A100-SXM4-80GB",
        memory: 81_039 * MIB,
        cc: (8, 0),
        sms: 108,
        context_bytes: CONTEXT_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        source: "PyTorch OOM message 79.14 GiB, ±5 MiB",
    },
    Preset {
        key: "h100",
        name: "NVIDIA H100 80GB HBM3",
        memory: 85_017_493_504,
        cc: (9, 0),
        sms: 132,
        context_bytes: CONTEXT_MEASURED_HOPPER,
        nccl_bytes: NCCL_MEASURED_H100,
        measured: true,
        source: "measured: totalGlobalMem and cuMemGetInfo total, driver 580.159.04",
    },
    Preset {
        key: "h100-pcie",
        name: "NVIDIA H100 PCIe",
        memory: 85_017_493_504,
        cc: (9, 0),
        sms: 114,
        context_bytes: CONTEXT_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        source: "taken equal to the measured H100 SXM (no figure of its own)",
    },
    Preset {
        key: "h200",
        name: "NVIDIA H200",
        memory: 150_109_880_320,
        cc: (9, 0),
        sms: 132,
        context_bytes: CONTEXT_MEASURED_HOPPER,
        nccl_bytes: NCCL_MEASURED_H200,
        measured: true,
        source: "measured: totalGlobalMem and cuMemGetInfo total, driver 580.159.04",
    },
    Preset {
        key: "b200",
        name: "NVIDIA B200",
        // "Total Global Memory: 178.35 GB" (totalGlobalMem in GiB, 2 decimals), 148 SMs,
        // compute capability 10.0, from a device query on a B200 (pytorch/ao pull request
        // 4002): 182,630 MiB, within 5 MiB.
        memory: 182_630 << 20,
        cc: (10, 0),
        sms: 148,
        context_bytes: CONTEXT_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        source: "device query 178.35 GiB, ±5 MiB",
    },
];

impl Preset {
    fn gpu(&self) -> Gpu {
        Gpu {
            key: self.key,
            name: self.name.to_string(),
            memory: self.memory,
            cc: self.cc,
            sms: self.sms,
            context_bytes: self.context_bytes,
            module_bytes: if self.measured {
                MODULE_MEASURED_HOPPER
            } else {
                MODULE_ESTIMATE
            },
            cublas_kernel_bytes: if self.measured {
                CUBLAS_KERNELS_MEASURED_HOPPER
            } else {
                CUBLAS_KERNELS_ESTIMATE
            },
            cudnn_kernel_bytes: if self.measured {
                CUDNN_KERNELS_MEASURED_HOPPER
            } else {
                CUDNN_KERNELS_ESTIMATE
            },
            nccl_bytes: self.nccl_bytes,
            measured: self.measured,
            fabric: self.measured,
            source: self.source,
        }
    }
}

/// MIG profiles, from NVIDIA's Multi-Instance GPU User Guide, "Supported MIG Profiles"
/// (docs.nvidia.com/datacenter/tesla/mig-user-guide): each GPU-instance profile as
/// (compute slices `Ng`, memory in eighths of the card). The guide gives memory only as a
/// fraction (1/8, 2/8, 4/8, Full), so a slice's bytes here are that fraction of the preset's
/// memory: an estimate, not a driver's exact figure (the real slices are a little smaller).
const MIG_SHAPES: [(u32, u64); 6] = [(1, 1), (1, 2), (2, 2), (3, 4), (4, 4), (7, 8)];

/// The MIG-capable presets: their key, the SMs of one compute slice (A100: 14, so 98 of 108
/// SMs in a 7g instance; Hopper: 16, the guide's 1/7 of the GH100's usable SMs, an estimate),
/// and the round GB figure the guide names each profile of [`MIG_SHAPES`] by.
const MIG_PRESETS: [(&str, u32, [u32; 6]); 4] = [
    ("a100-40gb", 14, [5, 10, 10, 20, 20, 40]),
    ("a100-80gb", 14, [10, 20, 20, 40, 40, 80]),
    ("h100", 16, [10, 20, 20, 40, 40, 80]),
    ("h200", 16, [18, 35, 35, 71, 71, 141]),
];

/// The MIG profile names of the preset `gpu` (empty when it has no MIG).
pub fn mig_profiles(gpu: &Gpu) -> Vec<String> {
    MIG_PRESETS
        .iter()
        .find(|(key, _, _)| *key == gpu.key)
        .map(|(_, _, gbs)| {
            MIG_SHAPES
                .iter()
                .zip(gbs)
                .map(|((slices, _), gb)| format!("{slices}g.{gb}gb"))
                .collect()
        })
        .unwrap_or_default()
}

/// The MIG instance `profile` (e.g. `3g.40gb`) of the preset `gpu`, as CUDA shows it: the
/// slice's memory and SMs, named as the driver names it ("NVIDIA A100-SXM4-80GB MIG 3g.40gb").
#[cfg(test)]
pub fn mig(gpu: &Gpu, profile: &str) -> Result<Gpu, String> {
    mig_shape(gpu, profile).map(|(slice, _, _)| slice)
}

/// [`mig`], with the profile's compute slices and memory eighths.
fn mig_shape(gpu: &Gpu, profile: &str) -> Result<(Gpu, u32, u64), String> {
    let Some((_, sms_per_slice, gbs)) = MIG_PRESETS.iter().find(|(key, _, _)| *key == gpu.key)
    else {
        let capable: Vec<&str> = MIG_PRESETS.iter().map(|(key, _, _)| *key).collect();
        return Err(format!(
            "--mig: {} has no MIG (MIG-capable presets: {})",
            gpu.key,
            capable.join(", ")
        ));
    };
    let wanted = profile.trim().to_lowercase();
    let wanted = wanted
        .strip_prefix("mig")
        .unwrap_or(&wanted)
        .trim_start_matches([' ', '-']);
    let found = MIG_SHAPES
        .iter()
        .zip(gbs)
        .find(|((slices, _), gb)| format!("{slices}g.{gb}gb") == wanted);
    let Some(((slices, eighths), gb)) = found else {
        return Err(format!(
            "unknown MIG profile {profile:?} for {}: valid profiles are {}",
            gpu.key,
            mig_profiles(gpu).join(", ")
        ));
    };
    let mut slice = gpu.clone();
    slice.name = format!("{} MIG {slices}g.{gb}gb", gpu.name);
    slice.memory = gpu.memory / 8 * eighths;
    slice.sms = sms_per_slice * slices;
    // A MIG instance has no NVLink fabric of its own to offer.
    slice.fabric = false;
    slice.source = "MIG user guide: memory fraction of the card (estimate)";
    Ok((slice, *slices, *eighths))
}

/// Where each GPU-instance shape of [`MIG_SHAPES`] may start on a card's 8 memory slices, from
/// the MIG user guide's "Supported MIG Profiles" placements (the same on A100, H100 and H200;
/// `nvidia-smi mig -lgipp` lists them); a card has 7 compute slices.
const MIG_PLACEMENTS: [(u32, u64, &[u64]); 6] = [
    (1, 1, &[0, 1, 2, 3, 4, 5, 6]),
    (1, 2, &[0, 2, 4, 6]),
    (2, 2, &[0, 2, 4]),
    (3, 4, &[0, 4]),
    (4, 4, &[0]),
    (7, 8, &[0]),
];

/// One MIG device of a [`MigLayout`] (a compute instance of a GPU instance): the device as
/// CUDA shows it (its GPU instance's memory, its own SMs; named after the profile, `... MIG
/// 3g.40gb`, `1g.10gb+me`, `1c.3g.40gb` for 1 of a 3g instance's 3 compute slices), its GPU
/// instance id (by placement, as the driver numbers them) and compute instance id.
#[derive(Clone, Debug)]
pub struct MigDevice {
    pub gpu: Gpu,
    pub gpu_instance: u32,
    pub compute_instance: u32,
}

/// The MIG devices of the cards (`dryrun --mig LAYOUT`): each card's in NVML's index order
/// (by GPU instance id), the layout as the fakes read it (`VRAMSHIM_FAKEGPU_MIG`) and its
/// first MIG device (whose figures `VRAMSHIM_FAKEGPU_MEMORY`/`_SMS`/`_NAME` carry).
#[derive(Clone, Debug)]
pub struct MigLayout {
    pub cards: Vec<Vec<MigDevice>>,
    pub text: String,
    pub first: Gpu,
}

/// Places `shapes` (compute slices, eighths) from `k` on, `used` the memory slices taken: the
/// start of each, the first that lets all fit in the layout's order, as the fakes place them.
fn place(shapes: &[(u32, u64)], k: usize, used: u8, starts: &mut Vec<u64>) -> bool {
    let Some(&(slices, eighths)) = shapes.get(k) else {
        return true;
    };
    for (_, _, options) in MIG_PLACEMENTS
        .iter()
        .filter(|(s, e, _)| (*s, *e) == (slices, eighths))
    {
        for &start in options.iter() {
            let mask = (((1u16 << eighths) - 1) << start) as u8;
            if used & mask != 0 {
                continue;
            }
            starts.push(start);
            if place(shapes, k + 1, used | mask, starts) {
                return true;
            }
            starts.pop();
        }
    }
    false
}

/// Where a compute instance of `c` compute slices may start within a GPU instance of
/// `slices`, as `nvidia-smi mig -lcipp` lists them: multiples of `c` (of 4 for 3) that keep it
/// inside. Places `computes` from `k` on, `used` the compute slices taken, as the fakes do.
fn place_compute(computes: &[u32], slices: u32, k: usize, used: u8, starts: &mut Vec<u32>) -> bool {
    let Some(&c) = computes.get(k) else {
        return true;
    };
    let step = if c == 3 { 4 } else { c };
    let mut start = 0;
    while start + c <= slices {
        let mask = (((1u16 << c) - 1) << start) as u8;
        if used & mask == 0 {
            starts.push(start);
            if place_compute(computes, slices, k + 1, used | mask, starts) {
                return true;
            }
            starts.pop();
        }
        start += step;
    }
    false
}

/// A card's entry split at its commas outside brackets (`3g.40gb[2c,1c],1g.10gb`).
fn layout_items(entry: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut from) = (0i32, 0);
    for (at, c) in entry.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                items.push(&entry[from..at]);
                from = at + 1;
            }
            _ => {}
        }
    }
    items.push(&entry[from..]);
    items
}

/// One GPU instance of a layout: its shape, media extensions, profile name and compute
/// instances' slices.
struct LayoutInstance {
    gpu: Gpu,
    slices: u32,
    eighths: u64,
    profile: String,
    computes: Vec<u32>,
}

/// Reads `item` (`<N>g.<M>gb`, `+me`, then `[<C>c,...]`) of card `index`.
fn layout_instance(card: &Gpu, index: usize, item: &str) -> Result<LayoutInstance, String> {
    let item = item.trim();
    let (base, computes) = match item.split_once('[') {
        Some((base, rest)) => match rest.strip_suffix(']') {
            Some(inner) if !inner.trim().is_empty() => (base, Some(inner)),
            _ => {
                return Err(format!(
                    "--mig: card {index}: {item:?}: compute instances are written [<C>c,...] \
                     after the profile, such as 3g.40gb[2c,1c]"
                ));
            }
        },
        None => (item, None),
    };
    let (base, media) = match base.trim().strip_suffix("+me") {
        Some(base) => (base, true),
        None => (base, false),
    };
    let (mut gpu, slices, eighths) = mig_shape(card, base)?;
    let mut profile = gpu
        .name
        .rsplit_once(" MIG ")
        .map_or(String::new(), |(_, p)| p.to_owned());
    if media {
        if eighths != 1 {
            return Err(format!(
                "--mig: card {index}: {profile}+me: media extensions (+me) come with the 1g \
                 profile of one memory slice only (MIG user guide)"
            ));
        }
        profile.push_str("+me");
        gpu.name.push_str("+me");
    }
    let computes = match computes {
        None => vec![slices],
        Some(inner) => {
            let mut list = Vec::new();
            for text in inner.split(',') {
                let c = text
                    .trim()
                    .strip_suffix('c')
                    .and_then(|n| n.parse::<u32>().ok())
                    .filter(|c| [1, 2, 3, 4, 7].contains(c) && *c <= slices)
                    .ok_or_else(|| {
                        format!(
                            "--mig: card {index}: {profile}: {:?} is not a compute instance it \
                             can hold (1c, 2c, 3c, 4c or 7c, at most its {slices} compute slices)",
                            text.trim()
                        )
                    })?;
                list.push(c);
            }
            list
        }
    };
    Ok(LayoutInstance {
        gpu,
        slices,
        eighths,
        profile,
        computes,
    })
}

/// `layout` for `count` cards of the preset `card`: each card's GPU instances (MIG profiles),
/// comma-separated, cards separated by `;` (`3g.40gb,2g.20gb,1g.10gb;7g.80gb`); one card's
/// entry stands for every card. A profile may take `+me` (the 1g profile of one memory slice,
/// one a card) and its compute instances in brackets (`3g.40gb[2c,1c]`; none: one filling it):
/// each compute instance is a MIG device with its own SMs and its GPU instance's memory.
/// Refused, with why: a profile the card lacks, more than 7 on a card, a set no placement of
/// the MIG user guide fits on one card (memory slices, or more than 7 compute slices),
/// compute instances their GPU instance cannot hold, a number of entries other than 1 or
/// `count`, and `none` (a card out of MIG mode beside MIG ones: the fakes take it, but the
/// verdict judges the one device a process sees).
pub fn mig_layout(card: &Gpu, layout: &str, count: u32) -> Result<MigLayout, String> {
    let entries: Vec<&str> = layout.split(';').collect();
    if entries.len() > 1 && entries.len() != count as usize {
        return Err(format!(
            "--mig {layout:?} names {} cards and --gpus is {count} (one entry stands for every card)",
            entries.len()
        ));
    }
    let mut cards = Vec::new();
    let mut texts = Vec::new();
    let mut first = None;
    for (index, entry) in entries.iter().enumerate() {
        let entry = entry.trim();
        if entry.eq_ignore_ascii_case("none") {
            return Err(format!(
                "--mig: card {index} out of MIG mode (none): dryrun simulates cards that are all \
                 in MIG mode (its verdict judges the one MIG device a process sees); the fakes \
                 alone take it (VRAMSHIM_FAKEGPU_MIG)"
            ));
        }
        let mut instances = Vec::new();
        for item in layout_items(entry) {
            if item.trim().is_empty() {
                return Err(format!(
                    "--mig: card {index}: an empty profile in {entry:?} (a card's entry is its \
                     MIG profiles, comma-separated; cards are separated by ;)"
                ));
            }
            let instance = layout_instance(card, index, item)?;
            first.get_or_insert_with(|| instance.gpu.clone());
            instances.push(instance);
        }
        if instances.len() > 7 {
            return Err(format!(
                "--mig: card {index}: {} MIG devices, a card holds 7 at most",
                instances.len()
            ));
        }
        if instances
            .iter()
            .filter(|i| i.profile.ends_with("+me"))
            .count()
            > 1
        {
            return Err(format!(
                "--mig: card {index}: more than one +me profile (a card has one set of media \
                 extensions)"
            ));
        }
        let shapes: Vec<(u32, u64)> = instances.iter().map(|i| (i.slices, i.eighths)).collect();
        let profiles: Vec<&str> = instances.iter().map(|i| i.profile.as_str()).collect();
        let compute: u32 = shapes.iter().map(|(slices, _)| slices).sum();
        let mut starts = Vec::new();
        if compute > 7 || !place(&shapes, 0, 0, &mut starts) {
            return Err(if compute > 7 {
                format!(
                    "--mig: card {index}: {} take {compute} compute slices, a {} has 7",
                    profiles.join(","),
                    card.key
                )
            } else {
                format!(
                    "--mig: card {index}: {} do not fit the 8 memory slices of a {} at the \
                     placements the MIG user guide gives",
                    profiles.join(","),
                    card.key
                )
            });
        }
        let mut items = Vec::new();
        let mut devices = Vec::new();
        for (instance, &start) in instances.iter().zip(&starts) {
            let mut compute_starts = Vec::new();
            if instance.computes.len() > 7
                || !place_compute(
                    &instance.computes,
                    instance.slices,
                    0,
                    0,
                    &mut compute_starts,
                )
            {
                return Err(format!(
                    "--mig: card {index}: {}: its compute instances do not fit its {} compute \
                     slices at the placements the driver gives",
                    instance.profile, instance.slices
                ));
            }
            let gpu_instance = match instance.eighths {
                8 => 0,
                4 => 1 + start / 4,
                2 => 3 + start / 2,
                _ => 7 + start,
            } as u32;
            let whole = instance.computes == [instance.slices];
            items.push(if whole {
                instance.profile.clone()
            } else {
                let list: Vec<String> = instance.computes.iter().map(|c| format!("{c}c")).collect();
                format!("{}[{}]", instance.profile, list.join(","))
            });
            let per_slice = instance.gpu.sms / instance.slices;
            for (id, &c) in instance.computes.iter().enumerate() {
                let profile = if c == instance.slices {
                    instance.profile.clone()
                } else {
                    format!("{c}c.{}", instance.profile)
                };
                let mut gpu = instance.gpu.clone();
                gpu.sms = per_slice * c;
                gpu.name = format!("{} MIG {profile}", card.name);
                devices.push(MigDevice {
                    gpu,
                    gpu_instance,
                    compute_instance: id as u32,
                });
            }
        }
        texts.push(items.join(","));
        devices.sort_by_key(|d| (d.gpu_instance, d.compute_instance));
        cards.push(devices);
    }
    while cards.len() < count as usize {
        cards.push(cards[0].clone());
    }
    Ok(MigLayout {
        cards,
        text: texts.join(";"),
        first: first.ok_or_else(|| "--mig: an empty layout".to_owned())?,
    })
}

/// Other names `--gpu` takes, normalised, with the key they stand for.
const ALIASES: [(&str, &str); 2] = [("h100sxm", "h100"), ("h100sxm5", "h100")];

/// Every preset, smallest memory first (ties in table order), so the first that fits is
/// the smallest.
pub fn presets() -> Vec<Gpu> {
    let mut all: Vec<Gpu> = PRESETS.iter().map(Preset::gpu).collect();
    all.sort_by_key(|gpu| gpu.memory);
    all
}

/// A card of `memory` bytes with an H100's compute capability and SMs, and the estimated
/// context ([`CONTEXT_ESTIMATE`]: a custom card names no driver to have measured it with).
pub fn custom(memory: u64) -> Gpu {
    Gpu {
        key: "custom",
        name: format!("vramshim custom GPU ({})", crate::units::bytes(memory)),
        memory,
        cc: (9, 0),
        sms: 132,
        context_bytes: CONTEXT_ESTIMATE,
        module_bytes: MODULE_ESTIMATE,
        cublas_kernel_bytes: CUBLAS_KERNELS_ESTIMATE,
        cudnn_kernel_bytes: CUDNN_KERNELS_ESTIMATE,
        nccl_bytes: NCCL_ESTIMATE,
        measured: false,
        fabric: false,
        source: "--memory",
    }
}

fn normalise(text: &str) -> String {
    text.chars()
        .filter(|c| !matches!(c, ' ' | '-' | '_'))
        .flat_map(char::to_lowercase)
        .collect()
}

/// The preset called `text`, or a message naming the closest key and the list.
pub fn find(text: &str) -> Result<Gpu, String> {
    let wanted = normalise(text);
    let wanted = wanted.strip_prefix("nvidia").unwrap_or(&wanted);
    let wanted = wanted.strip_prefix("geforce").unwrap_or(wanted);
    let wanted = ALIASES
        .iter()
        .find(|(alias, _)| *alias == wanted)
        .map_or(wanted, |(_, key)| key);
    if let Some(preset) = PRESETS.iter().find(|p| normalise(p.key) == wanted) {
        return Ok(preset.gpu());
    }
    let closest = PRESETS
        .iter()
        .min_by_key(|p| edit_distance(&normalise(p.key), wanted))
        .map(|p| p.key)
        .unwrap_or("h100");
    let keys: Vec<&str> = presets().iter().map(|g| g.key).collect();
    Err(format!(
        "unknown GPU {text:?}: did you mean {closest}? (known: {}; or --memory SIZE for another card; `vramshim dryrun --list-gpus` shows them all)",
        keys.join(", ")
    ))
}

/// Levenshtein distance, for suggestions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_forgiving_and_unknown_ones_get_a_suggestion() {
        assert_eq!(find("H100 SXM").map(|g| g.sms), Ok(132));
        assert_eq!(find("NVIDIA_A100-80GB").map(|g| g.memory), Ok(81_039 << 20));
        assert_eq!(find("GeForce RTX 4090").map(|g| g.cc), Ok((8, 9)));
        let err = find("a100-80").unwrap_err();
        assert!(err.starts_with("unknown GPU \"a100-80\": did you mean a100-80gb?"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn presets_run_from_smallest_to_largest() {
        let all = presets();
        assert_eq!(all.first().map(|g| g.key), Some("t4"));
        assert!(all.windows(2).all(|w| w[0].memory <= w[1].memory));
    }

    #[test]
    fn mig_profiles_take_the_guides_fractions_and_bad_ones_list_the_valid() {
        let a100 = find("a100-80gb").unwrap();
        let slice = mig(&a100, "3g.40gb").unwrap();
        assert_eq!(slice.name, "NVIDIA A100-SXM4-80GB MIG 3g.40gb");
        assert_eq!(slice.memory, (81_039 << 20) / 8 * 4);
        assert_eq!(slice.sms, 42);
        assert_eq!(
            mig(&find("h200").unwrap(), "MIG 1g.18gb").map(|g| g.sms),
            Ok(16)
        );
        assert_eq!(
            mig(&a100, "3g.20gb").unwrap_err(),
            "unknown MIG profile \"3g.20gb\" for a100-80gb: valid profiles are 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"
        );
        assert!(
            mig(&find("t4").unwrap(), "1g.5gb")
                .unwrap_err()
                .starts_with("--mig: t4 has no MIG")
        );
    }

    /// Layouts: placed as the fakes place them (a search in the layout's order), numbered by
    /// GPU instance id; refused when no placement of the MIG user guide fits them.
    #[test]
    fn mig_layouts_are_placed_and_impossible_ones_refused() {
        let a100 = find("a100-80gb").unwrap();
        let layout = mig_layout(&a100, "1g.10gb,3g.40gb,2g.20gb;7g.80gb", 2).unwrap();
        assert_eq!(layout.text, "1g.10gb,3g.40gb,2g.20gb;7g.80gb");
        assert_eq!(layout.first.name, "NVIDIA A100-SXM4-80GB MIG 1g.10gb");
        let card0: Vec<(&str, u32, u64, u32)> = layout.cards[0]
            .iter()
            .map(|d| {
                let profile = d.gpu.name.rsplit_once(" MIG ").map_or("", |(_, p)| p);
                (profile, d.gpu_instance, d.gpu.memory, d.gpu.sms)
            })
            .collect();
        let eighth = (81_039u64 << 20) / 8;
        // 1g at slice 0 (GI 7), 3g at 4 (GI 2), 2g at 2 (GI 4).
        assert_eq!(
            card0,
            [
                ("3g.40gb", 2, eighth * 4, 42),
                ("2g.20gb", 4, eighth * 2, 28),
                ("1g.10gb", 7, eighth, 14)
            ]
        );
        assert_eq!(layout.cards[1][0].gpu_instance, 0);
        // One entry stands for every card.
        let every = mig_layout(&a100, "3g.40gb,4g.40gb", 3).unwrap();
        assert_eq!(every.cards.len(), 3);
        assert_eq!(
            every.cards[2]
                .iter()
                .map(|d| d.gpu_instance)
                .collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(
            mig_layout(
                &a100,
                "1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb",
                1
            )
            .unwrap()
            .cards[0]
                .iter()
                .map(|d| d.gpu_instance)
                .collect::<Vec<_>>(),
            [7, 8, 9, 10, 11, 12, 13]
        );
        for (bad, why) in [
            (
                "4g.40gb,4g.40gb",
                "--mig: card 0: 4g.40gb,4g.40gb take 8 compute slices, a a100-80gb has 7",
            ),
            (
                "3g.40gb,3g.40gb,1g.10gb",
                "--mig: card 0: 3g.40gb,3g.40gb,1g.10gb do not fit the 8 memory slices of a \
                 a100-80gb at the placements the MIG user guide gives",
            ),
            (
                "3g.40gb;3g.40gb;3g.40gb",
                "--mig \"3g.40gb;3g.40gb;3g.40gb\" names 3 cards and --gpus is 2 (one entry \
                 stands for every card)",
            ),
            (
                "3g.40gb,,1g.10gb;7g.80gb",
                "--mig: card 0: an empty profile in \"3g.40gb,,1g.10gb\" (a card's entry is its \
                 MIG profiles, comma-separated; cards are separated by ;)",
            ),
            (
                "7g.80gb;3g.20gb",
                "unknown MIG profile \"3g.20gb\" for a100-80gb: valid profiles are 1g.10gb, \
                 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
            ),
        ] {
            assert_eq!(mig_layout(&a100, bad, 2).unwrap_err(), why, "{bad}");
        }
        assert!(
            mig_layout(&a100, "7g.80gb;none", 2)
                .unwrap_err()
                .starts_with("--mig: card 1 out of MIG mode (none)")
        );
    }

    /// Compute instances (`[2c,1c]`) and `+me`: a MIG device per compute instance, by GPU then
    /// compute instance id, its GPU instance's memory and its own SMs; the layout text as the
    /// fakes read it; what a card cannot hold is refused as the fakes refuse it.
    #[test]
    fn mig_layouts_take_compute_instances_and_media_extensions() {
        let a100 = find("a100-80gb").unwrap();
        let layout = mig_layout(&a100, "3g.40gb[2c,1c], 1g.10gb+me ,2g.20gb[1c,1c]", 1).unwrap();
        assert_eq!(layout.text, "3g.40gb[2c,1c],1g.10gb+me,2g.20gb[1c,1c]");
        assert_eq!(layout.first.name, "NVIDIA A100-SXM4-80GB MIG 3g.40gb");
        assert_eq!(layout.first.sms, 42);
        let eighth = (81_039u64 << 20) / 8;
        let card0: Vec<(String, u32, u32, u64, u32)> = layout.cards[0]
            .iter()
            .map(|d| {
                let name = d.gpu.name.clone();
                (
                    name,
                    d.gpu_instance,
                    d.compute_instance,
                    d.gpu.memory,
                    d.gpu.sms,
                )
            })
            .collect();
        let name = |p: &str| format!("NVIDIA A100-SXM4-80GB MIG {p}");
        assert_eq!(
            card0,
            [
                (name("2c.3g.40gb"), 1, 0, eighth * 4, 28),
                (name("1c.3g.40gb"), 1, 1, eighth * 4, 14),
                (name("1c.2g.20gb"), 5, 0, eighth * 2, 14),
                (name("1c.2g.20gb"), 5, 1, eighth * 2, 14),
                (name("1g.10gb+me"), 13, 0, eighth, 14),
            ]
        );
        // A compute instance filling its GPU instance is written without brackets.
        assert_eq!(mig_layout(&a100, "7g.80gb[7c]", 1).unwrap().text, "7g.80gb");
        let h100 = find("h100").unwrap();
        assert_eq!(
            mig_layout(&h100, "7g.80gb[3c,4c]", 1).unwrap().cards[0]
                .iter()
                .map(|d| (d.compute_instance, d.gpu.sms))
                .collect::<Vec<_>>(),
            [(0, 48), (1, 64)]
        );
        for (bad, why) in [
            (
                "3g.40gb+me",
                "--mig: card 0: 3g.40gb+me: media extensions (+me) come with the 1g profile of \
                 one memory slice only (MIG user guide)",
            ),
            (
                "1g.10gb+me,1g.10gb+me",
                "--mig: card 0: more than one +me profile (a card has one set of media \
                 extensions)",
            ),
            (
                "3g.40gb[2c,2c]",
                "--mig: card 0: 3g.40gb: its compute instances do not fit its 3 compute slices \
                 at the placements the driver gives",
            ),
            (
                "3g.40gb[4c]",
                "--mig: card 0: 3g.40gb: \"4c\" is not a compute instance it can hold (1c, 2c, \
                 3c, 4c or 7c, at most its 3 compute slices)",
            ),
            (
                "3g.40gb[]",
                "--mig: card 0: \"3g.40gb[]\": compute instances are written [<C>c,...] after \
                 the profile, such as 3g.40gb[2c,1c]",
            ),
        ] {
            assert_eq!(mig_layout(&a100, bad, 1).unwrap_err(), why, "{bad}");
        }
    }
}
