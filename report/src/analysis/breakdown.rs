//! What fills device memory in a framework user's terms: parameters, gradients, optimizer
//! state, activations, temporaries, library workspaces, other. Each allocation is classified
//! once, from its stack (Python and native frames) and its lifetime (which thread freed it,
//! and whether its thread was still in the same operation), so it takes two replays: the
//! first ([`Classifier`]) sees every allocation end and files its category by sequence
//! number; the second ([`Tally`]) sums live bytes per category over time and at each
//! device's peak.
//!
//! Meant for per-tensor recordings (one event per tensor: PyTorch with
//! `PYTORCH_NO_CUDA_MEMORY_CACHING=1` or `backend:cudaMallocAsync`); on a recording of the
//! caching allocator's segments most bytes fall under "other".

use rustc_hash::{FxHashMap, FxHashSet};

use crate::analysis::groups::Stacks;
use crate::python::{self, PYTHON_MODULE, StackView};
use crate::replay::{Effect, Live, Observer, Process, State, Step};

/// What an allocation holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    Parameters,
    Gradients,
    OptimizerState,
    Activations,
    Temporaries,
    Workspaces,
    Other,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 7] = [
        Category::Parameters,
        Category::Gradients,
        Category::OptimizerState,
        Category::Activations,
        Category::Temporaries,
        Category::Workspaces,
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
            Category::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn from_index(index: u8) -> Category {
        Category::ALL
            .get(usize::from(index))
            .copied()
            .unwrap_or(Category::Other)
    }
}

/// Bytes per category, indexed as [`Category::ALL`].
pub type CategoryBytes = [u64; Category::ALL.len()];

/// What a stack says about the allocations made under it.
#[derive(Clone, Copy, Debug, Default)]
struct Traits {
    /// A native frame of `torch::autograd::AccumulateGrad`.
    accumulate_grad: bool,
    /// A native frame of the autograd engine (`torch::autograd::Engine::...`).
    autograd_engine: bool,
    /// A native `at::` frame that allocates a library workspace (`...Workspace...`).
    workspace: bool,
    /// The innermost native frame is in one of NVIDIA's libraries ([`super::apis::is_nvidia_library`]): the
    /// library allocated for itself (cuBLAS's 64 MiB per handle on an H200), whichever thread
    /// it ran on.
    library: bool,
    /// A Python frame in `torch/optim/`.
    optimizer: bool,
    /// A Python frame of module construction or placement: `Module._apply`, `Module.to`,
    /// `Module.cuda`, `Module.to_empty`, or an `__init__` in `torch/nn/modules/`.
    parameter_setup: bool,
    /// The operation: the innermost Python frame's (code, line), else the stack itself.
    op: OpKey,
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
}

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
            traits.library = super::apis::is_nvidia_library(&innermost.module);
        }
        for frame in frames.iter() {
            let function = frame.function.as_deref().unwrap_or("");
            if &*frame.module == PYTHON_MODULE {
                let file = frame.file.as_deref().unwrap_or("");
                if file.contains("/torch/optim/") {
                    traits.optimizer = true;
                }
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
            }
        }
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

    fn file(&mut self, live: &Live, category: Category) {
        let Ok(seq) = usize::try_from(live.seq) else {
            return;
        };
        if self.categories.len() <= seq {
            self.categories.resize(seq + 1, Category::Other as u8);
        }
        self.categories[seq] = category as u8;
    }

    fn classify(&mut self, processes: &[Process], live: &Live, ending: Option<Ending>) -> Category {
        let traits = self.traits(processes, live.process, live.stack);
        let allocated_in_backward =
            traits.autograd_engine || self.is_autograd_thread(processes, live.process, live.thread);
        let in_same_op = ending.is_some_and(|e| e.in_same_op);
        if traits.workspace || traits.library {
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
        let live: Vec<Live> = state.live().copied().collect();
        for live in &live {
            let category = self.classify(processes, live, None);
            self.file(live, category);
        }
        Categories {
            by_seq: self.categories,
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
        self.file(live, category);
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
                    if traits.autograd_engine {
                        self.autograd_threads.insert((live.process, live.thread));
                    }
                    self.current_op
                        .insert((live.process, live.thread), traits.op);
                }
                Effect::Removed(live) => self.ended(processes, live, Some(event.thread)),
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
}

impl Categories {
    /// The category of the allocation made by event `seq`.
    pub fn of(&self, seq: u64) -> Category {
        usize::try_from(seq)
            .ok()
            .and_then(|seq| self.by_seq.get(seq))
            .map_or(Category::Other, |&index| Category::from_index(index))
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
    /// Bytes per category now (where the replay is).
    current: CategoryBytes,
}

/// Second replay: live bytes per category and device, at each device's peak and over time.
pub struct Tally<'a> {
    categories: &'a Categories,
    device: Option<i32>,
    pub devices: Vec<DeviceBreakdown>,
}

impl<'a> Tally<'a> {
    /// Tallies every device, or only `device`.
    pub fn new(categories: &'a Categories, device: Option<i32>) -> Tally<'a> {
        Tally {
            categories,
            device,
            devices: Vec::new(),
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
        let category = self.categories.of(live.seq).index();
        let entry = self.entry(live.device);
        entry.current[category] = entry.current[category].saturating_sub(live.size);
    }
}

impl Observer for Tally<'_> {
    fn step(&mut self, state: &State, _processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event {
                t_ns,
                effect: Effect::Added(live),
                ..
            } => {
                if let Some(replaced) = state.replaced().copied() {
                    self.ended(&replaced);
                }
                if self.device.is_some_and(|d| d != live.device) {
                    return;
                }
                let category = self.categories.of(live.seq).index();
                let device_bytes = state.device_bytes(live.device);
                let seq = state.seq;
                let entry = self.entry(live.device);
                entry.current[category] = entry.current[category].saturating_add(live.size);
                if entry.current[category] > entry.max[category] {
                    entry.max[category] = entry.current[category];
                    entry.max_t_ns[category] = *t_ns;
                }
                if device_bytes > entry.peak_bytes {
                    entry.peak_bytes = device_bytes;
                    entry.peak_t_ns = *t_ns;
                    entry.peak_seq = seq;
                    entry.at_peak = entry.current;
                }
            }
            Step::Event {
                effect: Effect::Removed(live),
                ..
            } => self.ended(live),
            Step::Dump { cleared, .. } => {
                for live in cleared.iter() {
                    self.ended(live);
                }
            }
            _ => {}
        }
    }
}
