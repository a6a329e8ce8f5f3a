//! The user's source lines that allocated: for each allocation, the innermost Python frame in
//! the user's code (a file named on the command line, else any file outside the interpreter's
//! library and installed packages) is charged with it. An allocation of PyTorch's autograd
//! threads (no user frame) made while a thread of its process waits in a backward call is
//! charged to the line that called it, as made "via autograd".

use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::python;
use crate::replay::{Effect, Live, Observer, Process, State, Step};

/// A source line: (file as recorded, line number).
pub type LineKey = (Rc<str>, u32);

/// What one line allocated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineStats {
    /// Bytes and count of every allocation the line made.
    pub allocated_bytes: u64,
    pub count: u64,
    /// Bytes of the line's allocations freed before the recording ended (the rest were
    /// still live at its end). A free is charged to the line that made the allocation.
    pub freed_bytes: u64,
    /// Times the line ran and allocated: runs of its allocations on one thread, each ended
    /// by an allocation of another user line on that thread.
    pub executions: u64,
    /// Bytes of the line's allocations freed within the execution that made them (on its
    /// thread, before the thread's next allocation of another line): its temporaries.
    pub freed_in_execution_bytes: u64,
    /// Bytes live at the device's peak that the line allocated.
    pub at_peak_bytes: u64,
    /// Of the above, what autograd's threads allocated for the line's backward call (included
    /// in `allocated_bytes`, `count`, `freed_bytes`, `freed_in_execution_bytes` and
    /// `at_peak_bytes`).
    pub via_autograd_bytes: u64,
    pub via_autograd_count: u64,
    pub via_autograd_at_peak_bytes: u64,
}

impl LineStats {
    /// Bytes still live when the recording ended (allocated less every free of the line's
    /// allocations; a process that exits normally frees everything, so mostly 0).
    pub fn live_at_end_bytes(&self) -> u64 {
        self.allocated_bytes.saturating_sub(self.freed_bytes)
    }

    /// What the line's executions added to live memory, summed over the run: bytes
    /// allocated less the frees of those same allocations within the execution that made
    /// them (what `memory_allocated()` gains across the line, when the line frees nothing
    /// else).
    pub fn net_bytes(&self) -> u64 {
        self.allocated_bytes
            .saturating_sub(self.freed_in_execution_bytes)
    }

    /// [`LineStats::net_bytes`] per execution, rounded down (0 with no execution).
    pub fn net_per_execution_bytes(&self) -> u64 {
        self.net_bytes().checked_div(self.executions).unwrap_or(0)
    }
}

/// Which files are the user's.
pub enum UserFiles {
    /// Any file outside `/lib/pythonX.Y/`, `site-packages` and `dist-packages`, and not a
    /// pseudo-file (`<frozen ...>`, `<string>`).
    Default,
    /// Only these: a recorded path matches when it is one of them or ends with `/` + one of
    /// them.
    Named(Vec<String>),
}

impl UserFiles {
    pub fn is_user(&self, file: &str) -> bool {
        match self {
            UserFiles::Default => {
                !file.starts_with('<')
                    && !file.contains("/site-packages/")
                    && !file.contains("/dist-packages/")
                    && !file.contains("/lib/python")
            }
            UserFiles::Named(names) => names.iter().any(|name| {
                file == name
                    || (file.len() > name.len()
                        && file.ends_with(name.as_str())
                        && file.as_bytes()[file.len() - name.len() - 1] == b'/')
            }),
        }
    }
}

/// A thread waiting in a backward call that a user line made.
struct Waiting {
    thread: u32,
    line: LineKey,
    execution: u64,
}

/// Observer charging each allocation to its user line.
pub struct Lines {
    files: UserFiles,
    device: Option<i32>,
    /// (process, stack) → the stack's user line, if any.
    line_of_stack: FxHashMap<(u32, u32), Option<LineKey>>,
    /// Interned file names.
    names: FxHashMap<String, Rc<str>>,
    /// (process, thread) → the user line of the thread's latest allocation that had one,
    /// and that execution's number.
    running: FxHashMap<(u32, u32), (LineKey, u64)>,
    /// Executions numbered so far.
    executions: u64,
    /// Sequence number of a live allocation charged to a line → its execution's number and
    /// the thread that ran the execution (for one made via autograd, the waiting thread).
    execution_of: FxHashMap<u64, (u64, u32)>,
    /// Process → the thread waiting in a backward call, its line and that execution: set by
    /// an allocation whose stack is in a backward call, ended by the thread's next
    /// allocation on a user line outside one.
    waiting: FxHashMap<u32, Waiting>,
    /// Sequence number of an allocation made via autograd → the line charged with it.
    via_autograd: FxHashMap<u64, LineKey>,
    /// (process, stack) → whether the stack is inside a backward call.
    backward_stack: FxHashMap<(u32, u32), bool>,
    pub lines: FxHashMap<LineKey, LineStats>,
}

impl Lines {
    /// Lines of `files`, on `device` (None: every device, pinned host memory excluded).
    pub fn new(files: UserFiles, device: Option<i32>) -> Lines {
        Lines {
            files,
            device,
            line_of_stack: FxHashMap::default(),
            names: FxHashMap::default(),
            running: FxHashMap::default(),
            executions: 0,
            execution_of: FxHashMap::default(),
            waiting: FxHashMap::default(),
            via_autograd: FxHashMap::default(),
            backward_stack: FxHashMap::default(),
            lines: FxHashMap::default(),
        }
    }

    /// The line charged with `live` and whether it was made via autograd: its own user line,
    /// else the backward call's line it was made for.
    pub fn charged(&mut self, processes: &[Process], live: &Live) -> Option<(LineKey, bool)> {
        if let Some(key) = self.via_autograd.get(&live.seq) {
            return Some((key.clone(), true));
        }
        self.line(processes, live).map(|key| (key, false))
    }

    /// Whether `stack` runs inside a backward call: a Python frame of `torch.autograd`'s
    /// `backward`/`grad`, `Tensor.backward` or `_engine_run_backward`.
    fn in_backward(&mut self, processes: &[Process], process: u32, stack: u32) -> bool {
        if let Some(found) = self.backward_stack.get(&(process, stack)) {
            return *found;
        }
        let found = processes.get(process as usize).is_some_and(|info| {
            info.python_stacks.get(&stack).is_some_and(|frames| {
                frames.iter().any(|frame| {
                    info.codes.get(&frame.code).is_some_and(|code| {
                        let file = code.filename.as_str();
                        let torch_autograd = file.contains("/torch/autograd/")
                            || file.ends_with("/torch/_tensor.py");
                        torch_autograd
                            && matches!(
                                code.qualname.as_str(),
                                "backward" | "Tensor.backward" | "_engine_run_backward" | "grad"
                            )
                    })
                })
            })
        });
        self.backward_stack.insert((process, stack), found);
        found
    }

    /// Whether `thread` is one of PyTorch's autograd threads (`pt_autograd_N`).
    fn autograd_thread(processes: &[Process], process: u32, thread: u32) -> bool {
        processes.get(process as usize).is_some_and(|info| {
            info.thread_names
                .get(&thread)
                .is_some_and(|name| name.starts_with("pt_autograd"))
        })
    }

    /// Whether allocations on `device` count.
    pub fn counts(&self, device: i32) -> bool {
        match self.device {
            Some(only) => device == only,
            None => device >= 0,
        }
    }

    /// The user line that made `live`, if any.
    pub fn line(&mut self, processes: &[Process], live: &Live) -> Option<LineKey> {
        if let Some(found) = self.line_of_stack.get(&(live.process, live.stack)) {
            return found.clone();
        }
        let found = processes.get(live.process as usize).and_then(|info| {
            let frames = info.python_stacks.get(&live.stack)?;
            frames.iter().find_map(|frame| {
                let code = info.codes.get(&frame.code)?;
                if !self.files.is_user(&code.filename) {
                    return None;
                }
                let line = python::line_of(code, frame.offset)?;
                let name = self
                    .names
                    .entry(code.filename.clone())
                    .or_insert_with(|| code.filename.as_str().into())
                    .clone();
                Some((name, line))
            })
        });
        self.line_of_stack
            .insert((live.process, live.stack), found.clone());
        found
    }

    /// `live` ended; `thread` freed it (None: it went without a free of the program's).
    fn ended(&mut self, processes: &[Process], live: &Live, thread: Option<u32>) {
        if !self.counts(live.device) {
            return;
        }
        let execution = self.execution_of.remove(&live.seq);
        if let Some((key, via)) = self.charged(processes, live) {
            // Within the execution: freed while the thread that ran it has not allocated on
            // another line since; by that thread, or for an allocation made via autograd, by
            // any thread of the program (the backward pass frees on its own threads).
            let in_execution = execution.is_some_and(|(number, owner)| {
                thread.is_some_and(|thread| via || thread == owner)
                    && self
                        .running
                        .get(&(live.process, owner))
                        .is_some_and(|(_, running)| *running == number)
            });
            let stats = self.lines.entry(key).or_default();
            stats.freed_bytes = stats.freed_bytes.saturating_add(live.size);
            if in_execution {
                stats.freed_in_execution_bytes =
                    stats.freed_in_execution_bytes.saturating_add(live.size);
            }
        }
    }
}

impl Observer for Lines {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event { event, effect, .. } => match effect {
                Effect::Added(live) => {
                    if let Some(replaced) = state.replaced().copied() {
                        self.ended(processes, &replaced, None);
                    }
                    if !self.counts(live.device) {
                        return;
                    }
                    if let Some(key) = self.line(processes, live) {
                        // A new execution unless the thread's last allocating line was this
                        // one (an execution that allocates several times counts once).
                        let thread = (live.process, live.thread);
                        let again = self.running.get(&thread).is_none_or(|(k, _)| *k != key);
                        if again {
                            self.executions += 1;
                            self.running.insert(thread, (key.clone(), self.executions));
                        }
                        let execution = self
                            .running
                            .get(&thread)
                            .map_or(self.executions, |(_, number)| *number);
                        self.execution_of.insert(live.seq, (execution, live.thread));
                        if self.in_backward(processes, live.process, live.stack) {
                            self.waiting.insert(
                                live.process,
                                Waiting {
                                    thread: live.thread,
                                    line: key.clone(),
                                    execution,
                                },
                            );
                        } else if self
                            .waiting
                            .get(&live.process)
                            .is_some_and(|waiting| waiting.thread == live.thread)
                        {
                            self.waiting.remove(&live.process);
                        }
                        let stats = self.lines.entry(key).or_default();
                        stats.allocated_bytes = stats.allocated_bytes.saturating_add(live.size);
                        stats.count += 1;
                        stats.executions += u64::from(again);
                    } else if let Some(waiting) = self.waiting.get(&live.process)
                        && waiting.thread != live.thread
                        && Self::autograd_thread(processes, live.process, live.thread)
                    {
                        // Made by autograd for the backward call a user line waits in.
                        self.execution_of
                            .insert(live.seq, (waiting.execution, waiting.thread));
                        let key = waiting.line.clone();
                        self.via_autograd.insert(live.seq, key.clone());
                        let stats = self.lines.entry(key).or_default();
                        stats.allocated_bytes = stats.allocated_bytes.saturating_add(live.size);
                        stats.count += 1;
                        stats.via_autograd_bytes =
                            stats.via_autograd_bytes.saturating_add(live.size);
                        stats.via_autograd_count += 1;
                    }
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
