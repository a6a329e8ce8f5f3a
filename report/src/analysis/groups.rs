//! Grouping a set of allocations by call stack, flat and as a caller → callee tree; with
//! `--by-thread`, by (process, thread, stack).

use std::hash::{Hash, Hasher};
use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::python::{self, StackView};
use crate::replay::{Live, Process};
use crate::symbols::{SymFrame, Symbolizer};

/// Frames [`Stacks`] keeps for stacks asked for again (about 70 MiB): a command going through
/// millions of distinct stacks once (an export) must not keep them all.
const CACHED_FRAMES_MAX: usize = 1 << 20;

/// Symbolised stacks of every process of a replay, each resolved once, and how groups of them
/// are keyed.
pub struct Stacks {
    symbolizers: Vec<Option<Symbolizer>>,
    cache: FxHashMap<(u32, u32), Rc<[SymFrame]>>,
    /// Frames held by `cache`: it is emptied when they pass `cached_frames_max`.
    cached_frames: usize,
    /// [`CACHED_FRAMES_MAX`] unless [`Stacks::with_cache_limit`] set another.
    cached_frames_max: usize,
    view: StackView,
    by_thread: bool,
}

impl Stacks {
    /// Stacks of `processes` shown as `view` asks (a command's `--stacks`); `by_thread` (a
    /// command's `--by-thread`) splits [`by_stack`]'s groups by allocating thread.
    pub fn new(processes: &[Process], view: StackView, by_thread: bool) -> Stacks {
        Stacks {
            symbolizers: processes.iter().map(|_| None).collect(),
            cache: FxHashMap::default(),
            cached_frames: 0,
            cached_frames_max: CACHED_FRAMES_MAX,
            view,
            by_thread,
        }
    }

    /// The same, keeping at most `frames` frames of stacks asked for again: for a command
    /// that asks for each stack about once, where the cache would be memory for nothing.
    pub fn with_cache_limit(mut self, frames: usize) -> Stacks {
        self.cached_frames_max = frames;
        self
    }

    /// Whether groups are split by thread.
    pub fn by_thread(&self) -> bool {
        self.by_thread
    }

    /// The frames of stack `stack` of process `process`, innermost first, shim frames removed.
    /// Stack 0 (none captured) and unknown ids give no frames.
    pub fn frames(&mut self, processes: &[Process], process: u32, stack: u32) -> Rc<[SymFrame]> {
        if let Some(frames) = self.cache.get(&(process, stack)) {
            return frames.clone();
        }
        let frames: Rc<[SymFrame]> = match processes.get(process as usize) {
            Some(info) => match info.stacks.get(&stack) {
                Some(ips) => {
                    let symbolizer = self.symbolizers[process as usize]
                        .get_or_insert_with(|| Symbolizer::new(info.modules.clone()));
                    // Symbolising while the replay runs: modules defined since the symbolizer
                    // was made (the log defines each before the first stack that needs it).
                    if let Some(new) = info.modules.get(symbolizer.module_count()..) {
                        symbolizer.add_modules(new);
                    }
                    match info.python_stacks.get(&stack) {
                        Some(py) if self.view != StackView::Native => {
                            let frames: Vec<SymFrame> = py
                                .iter()
                                .map(|&f| python::sym_frame(info.codes.get(&f.code), f))
                                .collect();
                            if self.view == StackView::Python {
                                frames.into()
                            } else {
                                let native =
                                    ips.iter().map(|&ip| symbolizer.stack(&[ip])).collect();
                                python::splice(native, python::groups(&frames, py)).into()
                            }
                        }
                        _ => symbolizer.stack(ips).into(),
                    }
                }
                None => Rc::from(Vec::new()),
            },
            None => Rc::from(Vec::new()),
        };
        if self.cached_frames + frames.len() > self.cached_frames_max {
            self.cache.clear();
            self.cached_frames = 0;
        }
        self.cached_frames += frames.len();
        self.cache.insert((process, stack), frames.clone());
        frames
    }

    /// The function of the innermost frame of stack `stack` of process `process` that is not
    /// the recorder's own, resolving only the addresses up to it (so only the modules that
    /// hold them are read: for an allocator's call, its own library). `None` when there is
    /// no such frame or no name for it.
    pub fn innermost_function(
        &mut self,
        processes: &[Process],
        process: u32,
        stack: u32,
    ) -> Option<String> {
        let info = processes.get(process as usize)?;
        let ips = info.stacks.get(&stack)?;
        let symbolizer = self
            .symbolizers
            .get_mut(process as usize)?
            .get_or_insert_with(|| Symbolizer::new(info.modules.clone()));
        if let Some(new) = info.modules.get(symbolizer.module_count()..) {
            symbolizer.add_modules(new);
        }
        ips.iter()
            .find_map(|&ip| symbolizer.stack(&[ip]).into_iter().next())
            .and_then(|frame| frame.function.map(|f| f.to_string()))
    }

    /// One line per module that could not be symbolised.
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .symbolizers
            .iter()
            .flatten()
            .flat_map(|s| s.warnings())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Allocations sharing one (symbolised) call stack, and with `--by-thread` one thread.
#[derive(Clone, Debug)]
pub struct StackGroup {
    /// Innermost first; empty when no stack was recorded.
    pub frames: Rc<[SymFrame]>,
    pub bytes: u64,
    pub count: u64,
    /// Processes (indexes into the replay's processes) contributing.
    pub processes: Vec<u32>,
    /// The allocating thread, when groups are split by thread.
    pub thread: Option<GroupThread>,
}

/// A thread of one process, as groups split by thread show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupThread {
    /// Index into the replay's processes.
    pub process: u32,
    pub pid: u32,
    pub tid: u32,
    /// The last name recorded for the thread; None when none was (or it was empty).
    pub name: Option<String>,
}

/// Shown for a thread without a recorded name.
pub const UNNAMED_THREAD: &str = "[unnamed]";

impl GroupThread {
    /// The thread `tid` of process `process`, named as the log names it.
    pub fn of(processes: &[Process], process: u32, tid: u32) -> GroupThread {
        let info = processes.get(process as usize);
        GroupThread {
            process,
            pid: info.map_or(0, |p| p.header.pid),
            tid,
            name: info
                .and_then(|p| p.thread_names.get(&tid))
                .filter(|name| !name.is_empty())
                .cloned(),
        }
    }

    /// The name, or [`UNNAMED_THREAD`].
    pub fn name_or_unnamed(&self) -> &str {
        self.name.as_deref().unwrap_or(UNNAMED_THREAD)
    }

    /// `thread NAME (tid N, pid P)`.
    pub fn label(&self) -> String {
        format!(
            "thread {} (tid {}, pid {})",
            self.name_or_unnamed(),
            self.tid,
            self.pid
        )
    }
}

/// Groups `allocations` by symbolised stack (identical stacks of different processes or ids
/// merge), and by thread when `stacks` splits by thread; largest first.
pub fn by_stack<'a>(
    allocations: impl IntoIterator<Item = &'a Live>,
    stacks: &mut Stacks,
    processes: &[Process],
) -> Vec<StackGroup> {
    let by_thread = stacks.by_thread();
    by_stack_totals(&totals_by_id(allocations, by_thread), stacks, processes)
}

/// What allocations are summed under before symbolisation: process, stack id and, when
/// grouping by thread, the allocating thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdKey {
    pub process: u32,
    /// The allocating thread; None when groups are not split by thread.
    pub thread: Option<u32>,
    pub stack: u32,
}

impl IdKey {
    /// The key of `live`, with its thread only when `by_thread`.
    pub fn of(live: &Live, by_thread: bool) -> IdKey {
        IdKey {
            process: live.process,
            thread: by_thread.then_some(live.thread),
            stack: live.stack,
        }
    }
}

/// Bytes and count per [`IdKey`]: the cheap first step of grouping, small enough to keep for
/// many moments.
pub type IdTotals = FxHashMap<IdKey, (u64, u64)>;

/// Adds `live` to `totals` (keyed with its thread only when `by_thread`).
pub fn add_total(totals: &mut IdTotals, live: &Live, by_thread: bool) {
    let entry = totals.entry(IdKey::of(live, by_thread)).or_default();
    entry.0 = entry.0.saturating_add(live.size);
    entry.1 += 1;
}

/// Sums `allocations` per (process, stack id), and per thread when `by_thread`.
pub fn totals_by_id<'a>(
    allocations: impl IntoIterator<Item = &'a Live>,
    by_thread: bool,
) -> IdTotals {
    let mut by_id = IdTotals::default();
    for live in allocations {
        add_total(&mut by_id, live, by_thread);
    }
    by_id
}

/// Groups per-id totals by symbolised stack (and by (process, thread) where the keys carry a
/// thread), largest first.
pub fn by_stack_totals(
    totals: &IdTotals,
    stacks: &mut Stacks,
    processes: &[Process],
) -> Vec<StackGroup> {
    let mut ids: Vec<_> = totals.iter().map(|(id, totals)| (*id, *totals)).collect();
    ids.sort_unstable_by_key(|(id, _)| *id);
    // Groups by the hash of their key (thread, places of the frames), compared in full on
    // a hash match: keeping the keys themselves would copy every frame's strings again.
    let mut by_hash: FxHashMap<u64, Vec<usize>> = FxHashMap::default();
    let mut groups: Vec<StackGroup> = Vec::new();
    for (id, (bytes, count)) in ids {
        let frames = stacks.frames(processes, id.process, id.stack);
        let thread = id.thread.map(|tid| (id.process, tid));
        let hash = group_hash(thread, &frames);
        let candidates = by_hash.entry(hash).or_default();
        let found = candidates.iter().copied().find(|&index| {
            let group = &groups[index];
            group.thread.as_ref().map(|t| (t.process, t.tid)) == thread
                && same_places(&group.frames, &frames)
        });
        let index = match found {
            Some(index) => index,
            None => {
                groups.push(StackGroup {
                    frames,
                    bytes: 0,
                    count: 0,
                    processes: Vec::new(),
                    thread: thread.map(|(process, tid)| GroupThread::of(processes, process, tid)),
                });
                candidates.push(groups.len() - 1);
                groups.len() - 1
            }
        };
        let group = &mut groups[index];
        group.bytes = group.bytes.saturating_add(bytes);
        group.count += count;
        if !group.processes.contains(&id.process) {
            group.processes.push(id.process);
        }
    }
    groups.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.count.cmp(&a.count))
            .then_with(|| label_of(&a.frames).cmp(&label_of(&b.frames)))
            .then_with(|| thread_order(a).cmp(&thread_order(b)))
    });
    groups
}

/// Ties between groups of different threads: by process, then thread id.
fn thread_order(group: &StackGroup) -> Option<(u32, u32)> {
    group.thread.as_ref().map(|t| (t.process, t.tid))
}

/// The label of a stack's innermost frame.
pub fn label_of(frames: &[SymFrame]) -> String {
    frames
        .first()
        .map_or_else(|| NO_STACK.to_string(), SymFrame::label)
}

/// Shown for allocations without a recorded stack.
pub const NO_STACK: &str = "[no stack recorded]";

/// A node of the caller → callee tree: bytes and count of everything below it.
#[derive(Clone, Debug, Default)]
pub struct TreeNode {
    /// None at the root and at thread nodes.
    pub frame: Option<TreeFrame>,
    /// Set at the nodes of the top level when groups are split by thread: each thread's
    /// stacks hang below its node. Boxed: a tree can have millions of nodes, few of these.
    pub thread: Option<Box<GroupThread>>,
    pub bytes: u64,
    pub count: u64,
    /// Largest first.
    pub children: Vec<TreeNode>,
}

/// A frame of a tree node: a place in the stack it came from (a tree of millions of nodes
/// would otherwise hold a copy of each frame).
#[derive(Clone, Debug)]
pub struct TreeFrame {
    frames: Rc<[SymFrame]>,
    index: usize,
}

impl std::ops::Deref for TreeFrame {
    type Target = SymFrame;

    fn deref(&self) -> &SymFrame {
        &self.frames[self.index]
    }
}

/// Builds the caller → callee tree of `groups` (outermost frame at the top; groups split by
/// thread hang below a node per thread).
pub fn tree(groups: &[StackGroup]) -> TreeNode {
    let mut root = TreeNode::default();
    let no_stack: Rc<[SymFrame]> = Rc::from(vec![no_stack_frame()]);
    for group in groups {
        root.bytes = root.bytes.saturating_add(group.bytes);
        root.count += group.count;
        let mut node = &mut root;
        if let Some(thread) = &group.thread {
            let index = match node.children.iter().position(|child| {
                child
                    .thread
                    .as_ref()
                    .is_some_and(|t| (t.process, t.tid) == (thread.process, thread.tid))
            }) {
                Some(index) => index,
                None => {
                    node.children.push(TreeNode {
                        thread: Some(Box::new(thread.clone())),
                        ..TreeNode::default()
                    });
                    node.children.len() - 1
                }
            };
            node = &mut node.children[index];
            node.bytes = node.bytes.saturating_add(group.bytes);
            node.count += group.count;
        }
        let frames = if group.frames.is_empty() {
            no_stack.clone()
        } else {
            group.frames.clone()
        };
        for (index, frame) in frames.iter().enumerate().rev() {
            let found = node
                .children
                .iter()
                .position(|child| child.frame.as_ref().is_some_and(|f| same_place(f, frame)));
            let index = match found {
                Some(found) => found,
                None => {
                    node.children.push(TreeNode {
                        frame: Some(TreeFrame {
                            frames: frames.clone(),
                            index,
                        }),
                        ..TreeNode::default()
                    });
                    node.children.len() - 1
                }
            };
            node = &mut node.children[index];
            node.bytes = node.bytes.saturating_add(group.bytes);
            node.count += group.count;
        }
    }
    sort_tree(&mut root);
    root
}

fn sort_tree(node: &mut TreeNode) {
    node.children
        .sort_by_key(|child| std::cmp::Reverse(child.bytes));
    for child in &mut node.children {
        sort_tree(child);
    }
}

/// The placeholder frame for allocations without a stack.
pub fn no_stack_frame() -> SymFrame {
    SymFrame {
        function: Some(NO_STACK.into()),
        file: None,
        line: None,
        module: "".into(),
        offset: 0,
        inlined: false,
    }
}

/// What makes two frames the same place for grouping: function, file and line, so that call
/// sites the compiler duplicated (unrolled loops, inlined copies) group together; the module
/// and code offset only when nothing else is known: (function, file, line, module, offset).
type PlaceRef<'a> = (Option<&'a str>, Option<&'a str>, Option<u32>, &'a str, u64);

pub(crate) fn place(frame: &SymFrame) -> PlaceRef<'_> {
    let known = frame.function.is_some() || frame.line.is_some();
    (
        frame.function.as_deref(),
        frame.file.as_deref(),
        frame.line,
        if known { "" } else { &frame.module },
        if known { 0 } else { frame.offset },
    )
}

fn same_place(a: &SymFrame, b: &SymFrame) -> bool {
    place(a) == place(b)
}

pub(crate) fn same_places(a: &[SymFrame], b: &[SymFrame]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_place(a, b))
}

/// The hash of a group's key: its thread and the places of its frames.
pub(crate) fn group_hash(thread: Option<(u32, u32)>, frames: &[SymFrame]) -> u64 {
    let mut hasher = rustc_hash::FxHasher::default();
    thread.hash(&mut hasher);
    frames.len().hash(&mut hasher);
    for frame in frames {
        place(frame).hash(&mut hasher);
    }
    hasher.finish()
}
