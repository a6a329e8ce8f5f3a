//! What fills device memory in a framework user's terms: parameters, gradients, optimizer
//! state, activations, temporaries, library workspaces, other. Each allocation is classified
//! once, from its stack (Python and native frames) and its lifetime (which thread freed it,
//! and whether its thread was still in the same operation), so a category is known only once
//! the run is over. Both observers ride one replay ([`Breakdown`], or beside other observers,
//! as `diff` does): [`Classifier`] sees every allocation end and files its category by
//! sequence number; [`Tally`] takes each device's peak, cache and context as they happen and
//! keeps the allocations' comings and goings (32 bytes each), which its `finish` sums per
//! category, over time and at each device's peak, once the categories are known.
//!
//! Meant for tensor-level recordings (the default allocator through its tracker, or one event
//! per tensor: `PYTORCH_NO_CUDA_MEMORY_CACHING=1`, `backend:cudaMallocAsync`); on a recording
//! of the caching allocator's segments alone most bytes fall under "other". Beside the
//! categories, the tally knows the allocator's cache (its segments less the tensors in them)
//! and the memory no hook sees (the device's sampled used bytes less what was recorded: the
//! context and loaded modules).

use rustc_hash::{FxHashMap, FxHashSet};

use crate::analysis::groups::Stacks;
use crate::python::{self, PYTHON_MODULE, StackView};
use crate::replay::{Effect, Live, Observer, Process, SegmentChange, State, Step};
use vramshim_format::EventKind;

/// What an allocation holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    Parameters,
    Gradients,
    OptimizerState,
    Activations,
    Temporaries,
    Workspaces,
    Communication,
    Other,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 8] = [
        Category::Parameters,
        Category::Gradients,
        Category::OptimizerState,
        Category::Activations,
        Category::Temporaries,
        Category::Workspaces,
        Category::Communication,
        Category::Other,
    ];

    /// The name reports use (text and JSON).
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameters => "parameters",
            Category::Gradients => "gradients",
            Category::OptimizerState => "optimizer_state",
            Category::Activations => "activations",
            Category::Temporaries => "temporaries",
            Category::Workspaces => "workspaces",
            Category::Communication => "communication",
            Category::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn from_index(index: u8) -> Category {
        let index = index & !MADE_IN_FORWARD;
        Category::ALL
            .get(usize::from(index))
            .copied()
            .unwrap_or(Category::Other)
    }
}

/// The bit of a filed category byte that says the allocation was made in a forward pass
/// (under a model's call, not by the autograd engine).
const MADE_IN_FORWARD: u8 = 0x80;

/// Bytes per category, indexed as [`Category::ALL`].
pub type CategoryBytes = [u64; Category::ALL.len()];

/// Bytes per library workspace, indexed as [`LIBRARIES`].
pub type LibraryBytes = [u64; LIBRARIES.len()];

/// The libraries whose workspaces are told apart: (name in reports, file-name prefix of the
/// library's module). The last, `other`, has no module: a workspace frame of PyTorch's that
/// names neither cuBLAS nor cuDNN.
pub const LIBRARIES: [(&str, &str); 9] = [
    ("cublas", "libcublas"),
    ("cudnn", "libcudnn"),
    ("cufft", "libcufft"),
    ("cusolver", "libcusolver"),
    ("cusparse", "libcusparse"),
    ("curand", "libcurand"),
    ("nvshmem", "libnvshmem"),
    ("cufile", "libcufile"),
    ("other", ""),
];
const CUBLAS: u8 = 0;
const CUDNN: u8 = 1;
const OTHER_LIBRARY: u8 = LIBRARIES.len() as u8 - 1;

/// Torch's functions that allocate a cuDNN convolution's workspace from its own allocator
/// (`aten/src/ATen/native/cudnn/Conv_v8.cpp`): running one plan (forward and both backward
/// passes, fused or not), and timing the candidate plans under `cudnn.benchmark`.
const CUDNN_WORKSPACE_FUNCTIONS: &[&str] = &[
    "at::native::run_conv_plan(",
    "at::native::run_conv_plan_fused(",
    "at::native::get_plans_from_find(",
    "at::native::get_plans_from_find_fused(",
];

/// NCCL's module prefix: its own memory is communication buffers.
const NCCL: &str = "libnccl";

/// What a stack says about the allocations made under it.
#[derive(Clone, Copy, Debug, Default)]
struct Traits {
    /// A native frame of `torch::autograd::AccumulateGrad`.
    accumulate_grad: bool,
    /// A native frame of the autograd engine (`torch::autograd::Engine::...`).
    autograd_engine: bool,
    /// A native `at::` frame that allocates a library workspace (`...Workspace...`).
    workspace: bool,
    /// The innermost native frame is in one of NVIDIA's libraries ([`LIBRARIES`]): the
    /// library allocated for itself (cuBLAS's 64 MiB per handle on an H200), whichever thread
    /// it ran on. Also set, from the frames' names, for a `workspace`.
    library: Option<u8>,
    /// The innermost native frame is in NCCL.
    communication: bool,
    /// A native `at::autocast::` frame: made under `torch.autocast`.
    autocast: bool,
    /// An out-of-place ReLU's output: a `ReLU.forward` Python frame, or a native
    /// `::relu`/`::threshold` frame (not a backward's). `inplace=True` allocates nothing there.
    relu: bool,
    /// A Python frame in `torch/optim/`.
    optimizer: bool,
    /// A Python frame of module construction or placement: `Module._apply`, `Module.to`,
    /// `Module.cuda`, `Module.to_empty`, or an `__init__` in `torch/nn/modules/`.
    parameter_setup: bool,
    /// The operation: the innermost Python frame's (code, line), else the stack itself.
    op: OpKey,
    /// Made in a module's forward: the (code, line) that called the outermost
    /// `Module._call_impl` (the call of the model).
    forward_call: Option<(u32, u32)>,
}

/// Which operation a thread is in, as far as its allocations tell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum OpKey {
    #[default]
    Unknown,
    PythonLine {
        code: u32,
        line: u32,
    },
    Stack(u32),
}

/// First replay: files every allocation's category by its sequence number.
#[derive(Default)]
pub struct Classifier {
    stacks: Option<Stacks>,
    traits: FxHashMap<(u32, u32), Traits>,
    /// (process, thread) → the operation of the thread's latest allocation.
    current_op: FxHashMap<(u32, u32), OpKey>,
    /// (process, thread) of threads that run the autograd engine.
    autograd_threads: FxHashSet<(u32, u32)>,
    /// Category by allocation sequence number (`Category::ALL` index).
    categories: Vec<u8>,
    /// Library by allocation sequence number ([`LIBRARIES`] index), for workspaces.
    libraries: Vec<u8>,
    /// (process, thread) → forward allocations freed by that thread, decided at the thread's
    /// next allocation: freed while the same model call went on (temporaries) or after it
    /// had finished without a backward pass (activations saved for nothing).
    pending: FxHashMap<(u32, u32), Vec<Live>>,
    /// Activations freed without a backward pass, by sequence number.
    unused: FxHashSet<u64>,
    /// Devices with an allocation made under `torch.autocast`.
    autocast_devices: FxHashSet<i32>,
    /// Out-of-place ReLU outputs made in a forward pass, by sequence number.
    relu_outputs: FxHashSet<u64>,
    /// A ReLU output's input (the latest live allocation of its size that its thread made in
    /// the forward pass) → the output's (sequence number, bytes).
    relu_inputs: FxHashMap<u64, (u64, u64)>,
    /// (process, thread) → its latest live forward allocations (sequence number, bytes),
    /// oldest first, at most [`RECENT_FORWARD`].
    recent_forward: FxHashMap<(u32, u32), Vec<(u64, u64)>>,
}

/// How many of a thread's latest forward allocations a ReLU's input is looked for in.
const RECENT_FORWARD: usize = 16;

/// How an allocation ended, as the classifier sees it.
#[derive(Clone, Copy, Debug)]
struct Ending {
    /// Freed on the allocating thread while that thread's latest allocation was of the same
    /// operation.
    in_same_op: bool,
    same_thread: bool,
    on_autograd_thread: bool,
}

impl Classifier {
    fn traits(&mut self, processes: &[Process], process: u32, stack: u32) -> Traits {
        if let Some(traits) = self.traits.get(&(process, stack)) {
            return *traits;
        }
        let stacks = self
            .stacks
            .get_or_insert_with(|| Stacks::new(processes, StackView::Mixed, false));
        let frames = stacks.frames(processes, process, stack);
        let mut traits = Traits::default();
        if let Some(innermost) = frames.iter().find(|f| &*f.module != PYTHON_MODULE) {
            let name = std::path::Path::new(&*innermost.module)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            traits.library = LIBRARIES
                .iter()
                .position(|(_, prefix)| !prefix.is_empty() && name.starts_with(prefix))
                .map(|index| index as u8);
            traits.communication = name.starts_with(NCCL);
        }
        let mut names_cudnn = false;
        let mut names_blas = false;
        for frame in frames.iter() {
            let function = frame.function.as_deref().unwrap_or("");
            if &*frame.module == PYTHON_MODULE {
                let file = frame.file.as_deref().unwrap_or("");
                if file.contains("/torch/optim/") {
                    traits.optimizer = true;
                }
                traits.relu |= function == "ReLU.forward";
                let module_file = file.contains("/torch/nn/modules/");
                if (module_file && function.ends_with("__init__"))
                    || (file.ends_with("/torch/nn/modules/module.py")
                        && matches!(
                            function,
                            "Module._apply" | "Module.to" | "Module.cuda" | "Module.to_empty"
                        ))
                {
                    traits.parameter_setup = true;
                }
            } else {
                if function.contains("torch::autograd::AccumulateGrad") {
                    traits.accumulate_grad = true;
                }
                if function.contains("torch::autograd::Engine::") {
                    traits.autograd_engine = true;
                }
                if function.starts_with("at::") && function.contains("Workspace") {
                    traits.workspace = true;
                }
                // Torch's cuDNN v8/v9 convolutions allocate the plan's workspace in these
                // (local symbols of libtorch_cuda.so, named from its `.symtab`); they allocate
                // nothing else.
                if CUDNN_WORKSPACE_FUNCTIONS
                    .iter()
                    .any(|prefix| function.starts_with(prefix))
                {
                    traits.workspace = true;
                    names_cudnn = true;
                }
                names_cudnn |= function.contains("cudnn") || function.contains("Cudnn");
                traits.autocast |= function.starts_with("at::autocast::");
                traits.relu |= (function.contains("::relu") || function.contains("::threshold"))
                    && !function.contains("backward")
                    && !function.contains("relu_");
                names_blas |= function.contains("Blas") || function.contains("cublas");
            }
        }
        if traits.workspace && traits.library.is_none() {
            traits.library = Some(if names_cudnn {
                CUDNN
            } else if names_blas {
                CUBLAS
            } else {
                OTHER_LIBRARY
            });
        }
        traits.forward_call = processes.get(process as usize).and_then(|info| {
            let frames = info.python_stacks.get(&stack)?;
            let outermost = frames.iter().rposition(|frame| {
                info.codes.get(&frame.code).is_some_and(|code| {
                    code.filename.ends_with("/torch/nn/modules/module.py")
                        && code.qualname.ends_with("_call_impl")
                })
            })?;
            let caller = frames.get(outermost + 1)?;
            let line = info
                .codes
                .get(&caller.code)
                .and_then(|code| python::line_of(code, caller.offset))
                .unwrap_or(0);
            Some((caller.code, line))
        });
        traits.op = processes
            .get(process as usize)
            .and_then(|info| {
                let innermost = info.python_stacks.get(&stack)?.first()?;
                let line = info
                    .codes
                    .get(&innermost.code)
                    .and_then(|code| python::line_of(code, innermost.offset))
                    .unwrap_or(0);
                Some(OpKey::PythonLine {
                    code: innermost.code,
                    line,
                })
            })
            .unwrap_or(if stack == 0 {
                OpKey::Unknown
            } else {
                OpKey::Stack(stack)
            });
        self.traits.insert((process, stack), traits);
        traits
    }

    fn is_autograd_thread(&self, processes: &[Process], process: u32, thread: u32) -> bool {
        self.autograd_threads.contains(&(process, thread))
            || processes.get(process as usize).is_some_and(|info| {
                info.thread_names
                    .get(&thread)
                    .is_some_and(|name| name.starts_with("pt_autograd"))
            })
    }

    fn file(&mut self, processes: &[Process], live: &Live, category: Category) {
        let Ok(seq) = usize::try_from(live.seq) else {
            return;
        };
        if self.categories.len() <= seq {
            self.categories.resize(seq + 1, Category::Other as u8);
        }
        let traits = self.traits(processes, live.process, live.stack);
        let forward = if traits.forward_call.is_some() && !traits.autograd_engine {
            MADE_IN_FORWARD
        } else {
            0
        };
        self.categories[seq] = category as u8 | forward;
        if category == Category::Workspaces {
            let library = self
                .traits(processes, live.process, live.stack)
                .library
                .unwrap_or(OTHER_LIBRARY);
            if self.libraries.len() <= seq {
                self.libraries.resize(seq + 1, OTHER_LIBRARY);
            }
            self.libraries[seq] = library;
        }
    }

    fn classify(&mut self, processes: &[Process], live: &Live, ending: Option<Ending>) -> Category {
        let traits = self.traits(processes, live.process, live.stack);
        let allocated_in_backward =
            traits.autograd_engine || self.is_autograd_thread(processes, live.process, live.thread);
        let in_same_op = ending.is_some_and(|e| e.in_same_op);
        if traits.communication {
            Category::Communication
        } else if traits.workspace || traits.library.is_some() {
            Category::Workspaces
        } else if traits.accumulate_grad
            || (allocated_in_backward && ending.is_none_or(|e| !e.same_thread))
        {
            Category::Gradients
        } else if traits.optimizer && !in_same_op {
            Category::OptimizerState
        } else if traits.parameter_setup && !in_same_op {
            Category::Parameters
        } else if in_same_op || (allocated_in_backward && ending.is_some_and(|e| e.same_thread)) {
            // Freed within its operation, or made and freed by the backward pass itself (the
            // gradients of activations, passed from one node to the next).
            Category::Temporaries
        } else if !allocated_in_backward && ending.is_some_and(|e| e.on_autograd_thread) {
            Category::Activations
        } else {
            Category::Other
        }
    }

    /// Files what is still live where the replay ended (never freed) and returns the
    /// categories by sequence number.
    pub fn finish(mut self, processes: &[Process], state: &State) -> Categories {
        let pending: Vec<Live> = self.pending.drain().flat_map(|(_, lives)| lives).collect();
        for live in &pending {
            self.unused.insert(live.seq);
            self.file(processes, live, Category::Activations);
        }
        let live: Vec<Live> = state.live().copied().collect();
        for live in &live {
            let category = self.classify(processes, live, None);
            self.file(processes, live, category);
        }
        Categories {
            by_seq: self.categories,
            libraries: self.libraries,
            unused: self.unused,
            autocast_devices: self.autocast_devices,
            relu_outputs: self.relu_outputs,
            relu_paired: self.relu_inputs.values().map(|(seq, _)| *seq).collect(),
            relu_inputs: self.relu_inputs,
        }
    }

    fn ended(&mut self, processes: &[Process], live: &Live, thread: Option<u32>) {
        let ending = thread.map(|thread| {
            let op = self.traits(processes, live.process, live.stack).op;
            let same_thread = thread == live.thread;
            Ending {
                in_same_op: same_thread
                    && op != OpKey::Unknown
                    && self.current_op.get(&(live.process, thread)) == Some(&op),
                same_thread,
                on_autograd_thread: self.is_autograd_thread(processes, live.process, thread),
            }
        });
        let category = self.classify(processes, live, ending);
        let traits = self.traits(processes, live.process, live.stack);
        if traits.forward_call.is_some()
            && matches!(category, Category::Other)
            && ending.is_some_and(|e| e.same_thread && !e.on_autograd_thread)
        {
            // Freed by the thread that made it in a forward: mid-forward or after it?
            self.pending
                .entry((live.process, live.thread))
                .or_default()
                .push(*live);
            return;
        }
        self.file(processes, live, category);
    }
}

impl Observer for Classifier {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event { event, effect, .. } => match effect {
                Effect::Added(live) => {
                    if let Some(replaced) = state.replaced().copied() {
                        self.ended(processes, &replaced, None);
                    }
                    let traits = self.traits(processes, live.process, live.stack);
                    if traits.autocast {
                        self.autocast_devices.insert(live.device);
                    }
                    if traits.forward_call.is_some() && !traits.autograd_engine {
                        let recent = self
                            .recent_forward
                            .entry((live.process, live.thread))
                            .or_default();
                        if traits.relu {
                            self.relu_outputs.insert(live.seq);
                            if let Some(&(input, _)) =
                                recent.iter().rev().find(|(_, size)| *size == live.size)
                            {
                                self.relu_inputs.insert(input, (live.seq, live.size));
                            }
                        }
                        if recent.len() == RECENT_FORWARD {
                            recent.remove(0);
                        }
                        recent.push((live.seq, live.size));
                    }
                    if let Some(pending) = self.pending.remove(&(live.process, live.thread)) {
                        for ended in &pending {
                            let made = self.traits(processes, ended.process, ended.stack);
                            let category = if traits.forward_call.is_some()
                                && traits.forward_call == made.forward_call
                            {
                                Category::Temporaries
                            } else {
                                self.unused.insert(ended.seq);
                                Category::Activations
                            };
                            self.file(processes, ended, category);
                        }
                    }
                    if traits.autograd_engine {
                        self.autograd_threads.insert((live.process, live.thread));
                    }
                    self.current_op
                        .insert((live.process, live.thread), traits.op);
                }
                Effect::Removed(live) => {
                    if let Some(recent) = self.recent_forward.get_mut(&(live.process, live.thread))
                    {
                        recent.retain(|(seq, _)| *seq != live.seq);
                    }
                    self.ended(processes, live, Some(event.thread))
                }
                _ => {}
            },
            Step::Dump { cleared, .. } => {
                for live in cleared.iter() {
                    self.ended(processes, live, None);
                }
            }
            Step::MemInfo { .. } => {}
        }
    }
}

/// Every allocation's category, by the sequence number of its allocating event.
#[derive(Default)]
pub struct Categories {
    by_seq: Vec<u8>,
    libraries: Vec<u8>,
    /// Activations freed without a backward pass (saved during evaluation).
    unused: FxHashSet<u64>,
    autocast_devices: FxHashSet<i32>,
    /// Out-of-place ReLU outputs made in a forward pass.
    relu_outputs: FxHashSet<u64>,
    /// A ReLU output's input → the output (sequence number, bytes).
    relu_inputs: FxHashMap<u64, (u64, u64)>,
    /// ReLU outputs whose input was found.
    relu_paired: FxHashSet<u64>,
}

impl Categories {
    /// The category of the allocation made by event `seq`.
    pub fn of(&self, seq: u64) -> Category {
        usize::try_from(seq)
            .ok()
            .and_then(|seq| self.by_seq.get(seq))
            .map_or(Category::Other, |&index| Category::from_index(index))
    }

    /// Whether the allocation made by event `seq` was made in a forward pass.
    pub fn made_in_forward(&self, seq: u64) -> bool {
        usize::try_from(seq)
            .ok()
            .and_then(|seq| self.by_seq.get(seq))
            .is_some_and(|&index| index & MADE_IN_FORWARD != 0)
    }

    /// The library ([`LIBRARIES`] index) of the workspace made by event `seq`.
    pub fn library_of(&self, seq: u64) -> usize {
        usize::try_from(seq)
            .ok()
            .and_then(|seq| self.libraries.get(seq))
            .map_or(usize::from(OTHER_LIBRARY), |&index| usize::from(index))
    }
}

/// One device's breakdown.
#[derive(Clone, Debug, Default)]
pub struct DeviceBreakdown {
    pub device: i32,
    /// Live bytes at the device's peak (first reached), and when.
    pub peak_bytes: u64,
    pub peak_t_ns: u64,
    pub peak_seq: u64,
    /// Bytes per category at the peak.
    pub at_peak: CategoryBytes,
    /// Each category's own highest live bytes over the run, and when first reached.
    pub max: CategoryBytes,
    pub max_t_ns: [u64; Category::ALL.len()],
    /// Bytes each category allocated over the run.
    pub allocated: CategoryBytes,
    /// Activations freed without a backward pass (kept by a graph nobody differentiated:
    /// evaluation without `no_grad`): highest live bytes, and bytes allocated.
    pub unused_activations_max: u64,
    pub unused_activations_allocated: u64,
    unused_activations: u64,
    /// Some allocation on the device was made under `torch.autocast`.
    pub autocast: bool,
    /// Out-of-place ReLU outputs kept for backward (activations made under `ReLU.forward` or
    /// a native relu/threshold): bytes allocated, count, highest live at once and the largest
    /// one. `inplace=True` would write each into its input instead.
    pub relu_kept_allocated: u64,
    pub relu_kept_count: u64,
    pub relu_kept_max: u64,
    pub relu_kept_largest: u64,
    relu_kept: u64,
    /// The allocation that made the peak was made in a forward pass.
    pub peak_in_forward: bool,
    /// What `inplace=True` on those ReLUs would take off the highest live bytes: of the
    /// whole run, and of the moments a forward pass allocated. Replayed as if each kept
    /// output were its input: from the output's allocation to its input's free, its bytes
    /// are not held.
    pub relu_inplace_peak_drop: u64,
    pub relu_inplace_forward_drop: u64,
    /// Kept outputs whose input is still live now, bytes.
    relu_overlap: u64,
    /// Bytes live now, and at their highest: as recorded, and less the overlap; the same at
    /// the moments a forward pass allocated.
    swept_live: u64,
    swept_max: u64,
    swept_max_inplace: u64,
    swept_forward_max: u64,
    swept_forward_max_inplace: u64,
    /// Workspaces per library at the peak, and each library's own highest.
    pub libraries_at_peak: LibraryBytes,
    pub libraries_max: LibraryBytes,
    /// The allocator's cache (its segments less the tensors in them) at the peak, and its
    /// own highest; None where the log has no segments (a per-tensor recording).
    pub cache_at_peak: Option<u64>,
    pub cache_max: u64,
    /// Of the cache at the peak, the segments with no tensor in them: what
    /// `torch.cuda.empty_cache()` just before would have given back (None without segments).
    pub unused_segments_at_peak: Option<u64>,
    /// The unused segments' bytes now.
    unused_segment_bytes: u64,
    /// The device's used memory less what was recorded (allocations and cache), from the
    /// memory sample nearest before the peak (else the first after); None without samples.
    pub context: Option<u64>,
    /// The index in the tally's changes of the allocation that made the peak.
    peak_change: Option<usize>,
    /// Bytes per category now (where the tally's sweep is).
    current: CategoryBytes,
    libraries_current: LibraryBytes,
    /// Tensors (tracker's blocks) and segments live now.
    tensor_bytes: u64,
    segment_bytes: u64,
    has_segments: bool,
    /// (time, used − recorded) at each memory sample.
    samples: Vec<(u64, u64)>,
}

impl DeviceBreakdown {
    /// The cache now.
    fn cache(&self) -> u64 {
        self.segment_bytes.saturating_sub(self.tensor_bytes)
    }

    /// Allocations and cache at the peak: what the recording saw the device hold.
    pub fn held_bytes(&self) -> u64 {
        self.peak_bytes
            .saturating_add(self.cache_at_peak.unwrap_or(0))
    }

    /// The device's used memory at the peak, where the log has memory samples: what was
    /// held plus the context.
    pub fn used_bytes(&self) -> Option<u64> {
        self.context
            .map(|context| self.held_bytes().saturating_add(context))
    }

    /// What shares are of: the used memory where known, else what was held.
    pub fn whole(&self) -> u64 {
        self.used_bytes().unwrap_or_else(|| self.held_bytes())
    }
}

/// An allocation made or ended on a tallied device, kept until the categories are known.
#[derive(Clone, Copy, Debug)]
struct Change {
    seq: u64,
    size: u64,
    t_ns: u64,
    device: i32,
    added: bool,
}

/// Live bytes per category and device, at each device's peak and over time: what does not
/// depend on the categories as the replay goes, the rest in [`Tally::finish`].
pub struct Tally {
    device: Option<i32>,
    pub devices: Vec<DeviceBreakdown>,
    /// Memory samples waiting for their process's next event: (process, device, time, used,
    /// recorded). A sample is taken inside the `cudaMalloc` that made a segment, before the
    /// allocator's tracker names it one, so that segment is added if the next event does.
    pending: Vec<(u32, i32, u64, u64, u64)>,
    /// Segments with no block in use, by (process, address): their device and bytes.
    unused_segments: FxHashMap<(u32, u64), (i32, u64)>,
    /// Allocations made and ended, in replay order.
    changes: Vec<Change>,
}

impl Tally {
    /// Tallies every device, or only `device`.
    pub fn new(device: Option<i32>) -> Tally {
        Tally {
            device,
            devices: Vec::new(),
            pending: Vec::new(),
            unused_segments: FxHashMap::default(),
            changes: Vec::new(),
        }
    }

    /// Files the segment of `process` holding `addr` as unused or not, as it is now.
    fn refresh_segment(&mut self, state: &State, process: u32, addr: u64) {
        let Some(segment) = state.segment_holding(process, addr) else {
            return;
        };
        let (device, size) = (segment.live.device, segment.live.size);
        if self.device.is_some_and(|d| d != device) {
            return;
        }
        let key = (process, segment.live.addr);
        let unused = segment.is_unused();
        let filed = self.unused_segments.contains_key(&key);
        if unused && !filed {
            self.unused_segments.insert(key, (device, size));
            let entry = self.entry(device);
            entry.unused_segment_bytes = entry.unused_segment_bytes.saturating_add(size);
        } else if !unused && filed {
            self.forget_segment(key);
        }
    }

    fn forget_segment(&mut self, key: (u32, u64)) {
        if let Some((device, size)) = self.unused_segments.remove(&key) {
            let entry = self.entry(device);
            entry.unused_segment_bytes = entry.unused_segment_bytes.saturating_sub(size);
        }
    }

    fn entry(&mut self, device: i32) -> &mut DeviceBreakdown {
        let index = match self.devices.iter().position(|d| d.device == device) {
            Some(index) => index,
            None => {
                let index = self.devices.partition_point(|d| {
                    crate::render::device_order(d.device) < crate::render::device_order(device)
                });
                self.devices.insert(
                    index,
                    DeviceBreakdown {
                        device,
                        ..DeviceBreakdown::default()
                    },
                );
                index
            }
        };
        &mut self.devices[index]
    }

    fn ended(&mut self, live: &Live) {
        if self.device.is_some_and(|d| d != live.device) {
            return;
        }
        let entry = self.entry(live.device);
        if live.kind == EventKind::TensorAlloc {
            entry.tensor_bytes = entry.tensor_bytes.saturating_sub(live.size);
        }
        self.changes.push(Change {
            seq: live.seq,
            size: live.size,
            t_ns: 0,
            device: live.device,
            added: false,
        });
    }

    fn added(&mut self, state: &State, t_ns: u64, live: &Live) {
        let device_bytes = state.device_bytes(live.device);
        let seq = state.seq;
        let change = self.changes.len();
        let entry = self.entry(live.device);
        if live.kind == EventKind::TensorAlloc {
            entry.tensor_bytes = entry.tensor_bytes.saturating_add(live.size);
        }
        entry.cache_max = entry.cache_max.max(entry.cache());
        if device_bytes > entry.peak_bytes {
            entry.peak_bytes = device_bytes;
            entry.peak_t_ns = t_ns;
            entry.peak_seq = seq;
            entry.peak_change = Some(change);
            entry.cache_at_peak = entry.has_segments.then(|| entry.cache());
            entry.unused_segments_at_peak =
                entry.has_segments.then_some(entry.unused_segment_bytes);
        }
        self.changes.push(Change {
            seq: live.seq,
            size: live.size,
            t_ns,
            device: live.device,
            added: true,
        });
    }

    /// Sums the kept changes per category, now that `categories` are known.
    fn sweep(&mut self, categories: &Categories) {
        let changes = std::mem::take(&mut self.changes);
        for (index, change) in changes.iter().enumerate() {
            let Some(entry) = self.devices.iter_mut().find(|d| d.device == change.device) else {
                continue;
            };
            let category = categories.of(change.seq);
            let library = categories.library_of(change.seq);
            let unused = categories.unused.contains(&change.seq);
            let relu_kept = category == Category::Activations
                && !unused
                && categories.relu_outputs.contains(&change.seq);
            let slot = category.index();
            if change.added {
                entry.swept_live = entry.swept_live.saturating_add(change.size);
                if relu_kept && categories.relu_paired.contains(&change.seq) {
                    entry.relu_overlap = entry.relu_overlap.saturating_add(change.size);
                }
            } else {
                entry.swept_live = entry.swept_live.saturating_sub(change.size);
                if let Some(&(output, size)) = categories.relu_inputs.get(&change.seq)
                    && categories.relu_outputs.contains(&output)
                    && categories.of(output) == Category::Activations
                    && !categories.unused.contains(&output)
                {
                    entry.relu_overlap = entry.relu_overlap.saturating_sub(size);
                }
            }
            let inplace = entry.swept_live.saturating_sub(entry.relu_overlap);
            entry.swept_max = entry.swept_max.max(entry.swept_live);
            entry.swept_max_inplace = entry.swept_max_inplace.max(inplace);
            if change.added && categories.made_in_forward(change.seq) {
                entry.swept_forward_max = entry.swept_forward_max.max(entry.swept_live);
                entry.swept_forward_max_inplace = entry.swept_forward_max_inplace.max(inplace);
            }
            if relu_kept {
                if change.added {
                    entry.relu_kept = entry.relu_kept.saturating_add(change.size);
                    entry.relu_kept_allocated =
                        entry.relu_kept_allocated.saturating_add(change.size);
                    entry.relu_kept_count += 1;
                    entry.relu_kept_max = entry.relu_kept_max.max(entry.relu_kept);
                    entry.relu_kept_largest = entry.relu_kept_largest.max(change.size);
                } else {
                    entry.relu_kept = entry.relu_kept.saturating_sub(change.size);
                }
            }
            if change.added {
                if unused {
                    entry.unused_activations = entry.unused_activations.saturating_add(change.size);
                    entry.unused_activations_allocated = entry
                        .unused_activations_allocated
                        .saturating_add(change.size);
                    entry.unused_activations_max =
                        entry.unused_activations_max.max(entry.unused_activations);
                }
                entry.current[slot] = entry.current[slot].saturating_add(change.size);
                entry.allocated[slot] = entry.allocated[slot].saturating_add(change.size);
                if entry.current[slot] > entry.max[slot] {
                    entry.max[slot] = entry.current[slot];
                    entry.max_t_ns[slot] = change.t_ns;
                }
                if category == Category::Workspaces {
                    entry.libraries_current[library] =
                        entry.libraries_current[library].saturating_add(change.size);
                    entry.libraries_max[library] =
                        entry.libraries_max[library].max(entry.libraries_current[library]);
                }
                if entry.peak_change == Some(index) {
                    entry.peak_in_forward = categories.made_in_forward(change.seq);
                    entry.at_peak = entry.current;
                    entry.libraries_at_peak = entry.libraries_current;
                }
            } else {
                entry.current[slot] = entry.current[slot].saturating_sub(change.size);
                if category == Category::Workspaces {
                    entry.libraries_current[library] =
                        entry.libraries_current[library].saturating_sub(change.size);
                }
                if unused {
                    entry.unused_activations = entry.unused_activations.saturating_sub(change.size);
                }
            }
        }
    }

    fn settle(&mut self, process: u32, segment: Option<(i32, u64)>) {
        let mut index = 0;
        while index < self.pending.len() {
            let (pending_process, device, t_ns, used, mut recorded) = self.pending[index];
            if pending_process != process {
                index += 1;
                continue;
            }
            self.pending.swap_remove(index);
            if let Some((segment_device, size)) = segment
                && segment_device == device
            {
                recorded = recorded.saturating_add(size);
            }
            self.entry(device)
                .samples
                .push((t_ns, used.saturating_sub(recorded)));
        }
    }

    /// Sums bytes per category with `categories` and picks each device's context from its
    /// samples; call once the replay ended.
    pub fn finish(&mut self, categories: &Categories) {
        for (process, ..) in self.pending.clone() {
            self.settle(process, None);
        }
        self.sweep(categories);
        for device in &mut self.devices {
            device.autocast = categories.autocast_devices.contains(&device.device);
            device.relu_inplace_peak_drop = device.swept_max - device.swept_max_inplace;
            device.relu_inplace_forward_drop =
                device.swept_forward_max - device.swept_forward_max_inplace;
            let before = device
                .samples
                .iter()
                .rev()
                .find(|(t_ns, _)| *t_ns <= device.peak_t_ns);
            device.context = before.or(device.samples.first()).map(|(_, bytes)| *bytes);
        }
    }
}

impl Observer for Tally {
    fn step(&mut self, state: &State, _processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event {
                process,
                t_ns,
                event,
                effect,
            } => {
                if !self.pending.is_empty() {
                    let segment = (event.kind == EventKind::TensorSegment)
                        .then_some((event.device, event.size));
                    self.settle(*process, segment);
                }
                // Segments whose use this step changed, before a new peak is taken.
                match state.segment_change() {
                    Some(SegmentChange::Added(segment)) => {
                        self.refresh_segment(state, segment.process, segment.addr)
                    }
                    Some(SegmentChange::Removed(segment)) => {
                        self.forget_segment((segment.process, segment.addr))
                    }
                    None => {}
                }
                for live in [effect_live(effect), state.replaced()]
                    .into_iter()
                    .flatten()
                {
                    if live.kind == EventKind::TensorAlloc {
                        self.refresh_segment(state, live.process, live.addr);
                    }
                }
                // A freed block is back in the pool when the free completes, not when asked.
                if event.kind == EventKind::TensorFree {
                    self.refresh_segment(state, *process, event.addr);
                }
                match effect {
                    Effect::Added(live) => {
                        if let Some(replaced) = state.replaced().copied() {
                            self.ended(&replaced);
                        }
                        if self.device.is_none_or(|d| d == live.device) {
                            self.added(state, *t_ns, live);
                        }
                    }
                    Effect::Removed(live) => self.ended(live),
                    _ => {}
                }
                // A segment made or given back: the tensor view keeps them apart.
                if matches!(event.kind, EventKind::TensorSegment | EventKind::Free)
                    && self.device.is_none_or(|d| d == event.device)
                    && event.device >= 0
                {
                    let (count, bytes) = state.segment_totals(event.device);
                    let entry = self.entry(event.device);
                    entry.segment_bytes = bytes;
                    entry.has_segments |= count > 0;
                    entry.cache_max = entry.cache_max.max(entry.cache());
                }
            }
            Step::MemInfo {
                process,
                t_ns,
                info,
            } => {
                if self.device.is_some_and(|d| d != info.device) || info.total == 0 {
                    return;
                }
                let used = info.total.saturating_sub(info.free);
                let held = state.device_bytes(info.device);
                let recorded = held.saturating_add(self.entry(info.device).cache());
                self.pending
                    .push((*process, info.device, *t_ns, used, recorded));
            }
            Step::Dump { cleared, .. } => {
                for live in cleared.iter() {
                    self.ended(live);
                }
            }
        }
    }
}

/// The classifier and the tally on one replay.
pub struct Breakdown {
    classifier: Classifier,
    tally: Tally,
}

impl Breakdown {
    /// Breaks down every device, or only `device`.
    pub fn new(device: Option<i32>) -> Breakdown {
        Breakdown {
            classifier: Classifier::default(),
            tally: Tally::new(device),
        }
    }

    /// Every allocation's category and each device's breakdown; call once the replay ended.
    pub fn finish(
        self,
        processes: &[Process],
        state: &State,
    ) -> (Categories, Vec<DeviceBreakdown>) {
        let categories = self.classifier.finish(processes, state);
        let mut tally = self.tally;
        tally.finish(&categories);
        (categories, tally.devices)
    }
}

impl Observer for Breakdown {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        self.classifier.step(state, processes, step);
        self.tally.step(state, processes, step);
    }
}

/// One row of `diff`'s per-category section: a category (or the allocator's cache, the
/// context, activations without a backward pass) in two recordings; None where a side does
/// not know the figure (no such device, no segments, no memory samples).
#[derive(Clone, Debug)]
pub struct CategoryChange {
    pub name: &'static str,
    /// Live bytes at each recording's own peak.
    pub at_peak: [Option<u64>; 2],
    /// The row's own highest live bytes over each run.
    pub max: [Option<u64>; 2],
    /// Bytes allocated over each run.
    pub allocated: [Option<u64>; 2],
}

/// One device's categories in two recordings (either may lack the device).
#[derive(Clone, Debug)]
pub struct DeviceChange {
    pub device: i32,
    pub peak_bytes: [Option<u64>; 2],
    pub rows: Vec<CategoryChange>,
}

/// Each device of `a` and `b` (A's order, then B's own), its categories side by side.
pub fn changes(a: &[DeviceBreakdown], b: &[DeviceBreakdown]) -> Vec<DeviceChange> {
    let mut ordinals: Vec<i32> = a.iter().map(|d| d.device).collect();
    for device in b {
        if !ordinals.contains(&device.device) {
            ordinals.push(device.device);
        }
    }
    ordinals
        .into_iter()
        .map(|ordinal| {
            let sides = [a, b].map(|side| side.iter().find(|d| d.device == ordinal));
            let pick =
                |f: &dyn Fn(&DeviceBreakdown) -> Option<u64>| sides.map(|side| side.and_then(f));
            let mut rows: Vec<CategoryChange> = Category::ALL
                .iter()
                .map(|&category| {
                    let index = category.index();
                    CategoryChange {
                        name: category.name(),
                        at_peak: pick(&|d| Some(d.at_peak[index])),
                        max: pick(&|d| Some(d.max[index])),
                        allocated: pick(&|d| Some(d.allocated[index])),
                    }
                })
                .collect();
            rows.push(CategoryChange {
                name: "allocator_cache",
                at_peak: pick(&|d| d.cache_at_peak),
                max: pick(&|d| d.cache_at_peak.map(|_| d.cache_max)),
                allocated: [None, None],
            });
            rows.push(CategoryChange {
                name: "allocator_cache_unused_segments",
                at_peak: pick(&|d| d.unused_segments_at_peak),
                max: [None, None],
                allocated: [None, None],
            });
            rows.push(CategoryChange {
                name: "context_and_modules",
                at_peak: pick(&|d| d.context),
                max: [None, None],
                allocated: [None, None],
            });
            rows.push(CategoryChange {
                name: "activations_without_backward",
                at_peak: [None, None],
                max: pick(&|d| Some(d.unused_activations_max)),
                allocated: pick(&|d| Some(d.unused_activations_allocated)),
            });
            DeviceChange {
                device: ordinal,
                peak_bytes: pick(&|d| Some(d.peak_bytes)),
                rows,
            }
        })
        .collect()
}

/// The allocation a step added or removed, if any.
fn effect_live(effect: &Effect) -> Option<&Live> {
    match effect {
        Effect::Added(live) | Effect::Removed(live) => Some(live),
        _ => None,
    }
}
