//! Training iterations found in a recording: a step ends where the optimizer's `step` ends
//! (a run of allocations under a Python frame in `torch/optim/`, then one that is not). A
//! process without an optimizer (an evaluation or inference loop) is split where its most
//! repeated model call starts (the line calling the outermost `Module._call_impl`), found
//! by a first replay and applied in a second.
//! Per step: the highest live bytes within it and the bytes live at its end. Live bytes
//! that grow at the end of every step are growth, charged to the lines of the training loop
//! (the function that calls the optimizer) whose allocations are never freed.

use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::analysis::lines::UserFiles;
use crate::python;
use crate::replay::{Effect, Live, Observer, Process, State, Step};

/// One training step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepFigures {
    pub start_t_ns: u64,
    pub end_t_ns: u64,
    /// Highest live bytes within the step.
    pub peak_bytes: u64,
    /// Live bytes when it ended (before the next step's first allocation).
    pub end_bytes: u64,
    /// Model calls started within the step at its most called call site: the forward passes
    /// per optimizer step (more than one: gradients accumulated over micro-batches).
    pub forward_calls: u32,
    /// The log ends within this step (always the last one): the optimizer's step ran, or the
    /// model call started, but what ends a step (the next one's first allocation) never came.
    /// It ends at the process's last allocation or free; its live bytes then are not compared
    /// with the other steps' (a program may free its model before it exits).
    pub open: bool,
}

/// A line of the training loop whose allocations outlive the steps that made them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leak {
    pub file: Rc<str>,
    pub line: u32,
    pub function: String,
    /// Bytes and count allocated in steps 2 to N−1 and still live at the end of step N.
    pub bytes: u64,
    pub count: u64,
    /// Those bytes per step (steps 2 to N−1).
    pub per_step: Vec<u64>,
}

/// One process's steps.
#[derive(Clone, Debug, Default)]
pub struct ProcessSteps {
    pub process: u32,
    /// Split at a model call's starts (file, line) instead of the optimizer's steps.
    pub by_call: Option<(Rc<str>, u32)>,
    pub steps: Vec<StepFigures>,
    /// Lines leaking, most bytes first (filled by [`Steps::finish`]).
    pub leaks: Vec<Leak>,
}

impl ProcessSteps {
    /// The steps whose end was seen: every step but an [`StepFigures::open`] last one.
    pub fn closed(&self) -> &[StepFigures] {
        match self.steps.split_last() {
            Some((last, closed)) if last.open => closed,
            _ => &self.steps,
        }
    }

    /// Forward passes per optimizer step: the most model calls at one site in a step after
    /// the first (the first may differ: set-up); None for a process split by model calls or
    /// with fewer than two steps.
    pub fn forwards_per_step(&self) -> Option<u32> {
        if self.by_call.is_some() {
            return None;
        }
        self.steps
            .iter()
            .skip(1)
            .map(|step| step.forward_calls)
            .max()
    }

    /// End-of-step live bytes minus the previous step's, from step 2 on (closed steps only).
    pub fn growth(&self) -> Vec<i64> {
        self.closed()
            .windows(2)
            .map(|pair| {
                (i128::from(pair[1].end_bytes) - i128::from(pair[0].end_bytes))
                    .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
            })
            .collect()
    }

    /// Whether memory grows across steps: at least three closed steps, and the live bytes at
    /// the end of every step from the third on are above the step before's. (The first step
    /// also builds the model and the optimizer's state, and the second may still set up
    /// what runs once; their ends are not compared.)
    pub fn grows(&self) -> bool {
        let closed = self.closed();
        closed.len() >= 3
            && closed
                .windows(2)
                .skip(1)
                .all(|pair| pair[1].end_bytes > pair[0].end_bytes)
    }
}

/// The model call site a process without an optimizer is split at (from a first replay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitSite {
    /// (code, instruction offset) that called the outermost `Module._call_impl`.
    pub site: (u32, u32),
    /// Whether the stack of a call's first allocation coming again starts a call (calls made
    /// back to back), or is a layer like the first within one call (see
    /// `Tracker::repeats_are_layers`).
    pub repeats_start_calls: bool,
}

/// Calls of one model call site within a step: started from outside the call, and started by
/// the call's first stack coming again.
#[derive(Clone, Copy, Debug, Default)]
struct StepCalls {
    from_outside: u32,
    repeated: u32,
}

/// Where an allocation came from, for charging growth.
#[derive(Clone, Debug, Default)]
struct Origin {
    optimizer: bool,
    /// (code, instruction offset) that called the outermost `Module._call_impl`: the model
    /// call. By instruction, not line: `criterion(model(x), y)` makes two calls on one line,
    /// and the loss's allocations are outside the model's call.
    call_site: Option<(u32, u32)>,
    /// The user's innermost Python frame: (code, line).
    user: Option<(u32, u32)>,
    /// (code, line) of every Python frame, innermost first.
    frames: Vec<(u32, u32)>,
}

impl Tracker {
    /// Whether the site's first stack coming again is a layer like the first within one call
    /// (a model whose forward runs identical layers one after another, as `nn.Sequential` of
    /// `Linear`s does, repeats its first stack in every call), not a call made back to back:
    /// its calls came from outside it (from other code of the thread) at least twice, and the
    /// first stack came again the same number of times (at least once) after each of them
    /// (fewer after the last, which may have been cut short). Calls back to back come from
    /// outside once, or a few times with other counts between.
    fn repeats_are_layers(&self, site: (u32, u32)) -> bool {
        let Some((last, before)) = self
            .repeats_after_outside
            .get(&site)
            .and_then(|runs| runs.split_last())
        else {
            return false;
        };
        let Some(&layers) = before.first() else {
            return false;
        };
        layers >= 1 && before.iter().all(|&run| run == layers) && *last <= layers
    }

    /// Model calls per step at the most called site (see [`StepFigures::forward_calls`]).
    fn forward_calls(&self, calls: &FxHashMap<(u32, u32), StepCalls>) -> u32 {
        calls
            .iter()
            .map(|(&site, counted)| {
                if self.repeats_are_layers(site) {
                    counted.from_outside
                } else {
                    counted.from_outside.saturating_add(counted.repeated)
                }
            })
            .max()
            .unwrap_or(0)
    }

    /// Adds the current step, ended at `t_ns` with the bytes live now (`open`: the log ended
    /// within it), with its model calls.
    fn end_step(&mut self, t_ns: u64, open: bool) {
        self.calls_per_step
            .push(std::mem::take(&mut self.step_calls));
        self.current.end_t_ns = t_ns;
        self.current.end_bytes = self.live_bytes;
        self.current.open = open;
        self.steps.push(self.current);
    }

    /// Ends the current step before the allocation at `t_ns`; the next one begins.
    fn close(&mut self, t_ns: u64) {
        self.end_step(t_ns, false);
        self.optimizer_ran = false;
        self.current = StepFigures {
            start_t_ns: t_ns,
            peak_bytes: self.live_bytes,
            ..StepFigures::default()
        };
        self.at_last_end = self.survivors.values().copied().collect();
    }
}

#[derive(Default)]
struct Tracker {
    steps: Vec<StepFigures>,
    in_optimizer: bool,
    /// The optimizer allocated since the last step ended: the step in progress has run it.
    optimizer_ran: bool,
    /// The time of the process's latest allocation or free (where an open step ends).
    last_t_ns: u64,
    live_bytes: u64,
    current: StepFigures,
    /// The training loop's code: the user function that called the optimizer.
    loop_code: Option<u32>,
    /// Allocations made after the first step, live: seq → (stack, size, step index).
    survivors: FxHashMap<u64, (u32, u64, usize)>,
    /// Survivors at the last step end: (stack, size, step index).
    at_last_end: Vec<(u32, u64, usize)>,
    /// Thread → the model call of its latest allocation.
    thread_call: FxHashMap<u32, Option<(u32, u32)>>,
    /// Model call site → calls started.
    calls: FxHashMap<(u32, u32), u32>,
    /// Model call site → calls started in the current step.
    step_calls: FxHashMap<(u32, u32), StepCalls>,
    /// `step_calls` of each step ended so far.
    calls_per_step: Vec<FxHashMap<(u32, u32), StepCalls>>,
    /// Model call site → for each call started from outside it, how often its first stack
    /// came again before the next such call.
    repeats_after_outside: FxHashMap<(u32, u32), Vec<u32>>,
    /// Model call site → the stack of its current call's first allocation, and allocations
    /// since.
    call_first: FxHashMap<(u32, u32), (u32, u32)>,
    /// Calls started at the site the process is split by.
    split_calls: u32,
}

/// Observer finding steps per process.
pub struct Steps {
    device: Option<i32>,
    files: UserFiles,
    origins: FxHashMap<(u32, u32), Rc<Origin>>,
    processes: FxHashMap<u32, Tracker>,
    /// Process → the model call site that splits it (second replay).
    split: FxHashMap<u32, SplitSite>,
}

impl Steps {
    /// Steps on `device` (None: every device, pinned host memory excluded).
    pub fn new(device: Option<i32>) -> Steps {
        Steps {
            device,
            files: UserFiles::Default,
            origins: FxHashMap::default(),
            processes: FxHashMap::default(),
            split: FxHashMap::default(),
        }
    }

    /// Steps of the processes in `split`, each cut where its model call site starts a call.
    pub fn by_calls(device: Option<i32>, split: FxHashMap<u32, SplitSite>) -> Steps {
        Steps {
            split,
            ..Steps::new(device)
        }
    }

    /// After a replay: for each process without an optimizer step, its most repeated model
    /// call site, if called at least three times.
    pub fn call_split(&self) -> FxHashMap<u32, SplitSite> {
        self.processes
            .iter()
            .filter(|(_, tracker)| tracker.steps.is_empty() && tracker.loop_code.is_none())
            .filter_map(|(&process, tracker)| {
                let (&site, &calls) = tracker
                    .calls
                    .iter()
                    .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))?;
                let split = SplitSite {
                    site,
                    repeats_start_calls: !tracker.repeats_are_layers(site),
                };
                (calls >= 3).then_some((process, split))
            })
            .collect()
    }

    fn counts(&self, device: i32) -> bool {
        match self.device {
            Some(only) => device == only,
            None => device >= 0,
        }
    }

    fn origin(&mut self, processes: &[Process], process: u32, stack: u32) -> Rc<Origin> {
        if let Some(origin) = self.origins.get(&(process, stack)) {
            return origin.clone();
        }
        let mut origin = Origin::default();
        if let Some(info) = processes.get(process as usize)
            && let Some(frames) = info.python_stacks.get(&stack)
        {
            let mut outermost_call = None;
            // (code, offset) of each frame kept in `origin.frames`.
            let mut instructions = Vec::with_capacity(frames.len());
            for frame in frames {
                let Some(code) = info.codes.get(&frame.code) else {
                    continue;
                };
                let line = python::line_of(code, frame.offset).unwrap_or(0);
                origin.frames.push((frame.code, line));
                instructions.push((frame.code, frame.offset));
                if code.filename.ends_with("/torch/nn/modules/module.py")
                    && code.qualname.ends_with("_call_impl")
                {
                    outermost_call = Some(origin.frames.len());
                }
                if code.filename.contains("/torch/optim/") {
                    origin.optimizer = true;
                }
                if origin.user.is_none() && self.files.is_user(&code.filename) {
                    origin.user = Some((frame.code, line));
                }
            }
            origin.call_site = outermost_call.and_then(|index| instructions.get(index).copied());
        }
        let origin = Rc::new(origin);
        self.origins.insert((process, stack), origin.clone());
        origin
    }

    fn added(&mut self, processes: &[Process], t_ns: u64, live: &Live) {
        let origin = self.origin(processes, live.process, live.stack);
        let split = self.split.get(&live.process).copied();
        let repeats_start_calls = split.is_none_or(|split| split.repeats_start_calls);
        let tracker = self.processes.entry(live.process).or_default();
        tracker.last_t_ns = tracker.last_t_ns.max(t_ns);
        let previous = tracker.thread_call.insert(live.thread, origin.call_site);
        let mut call_start = None;
        if let Some(site) = origin.call_site {
            // A call starts when the thread comes from outside it, or when the call's first
            // stack comes again (calls made back to back: the repeating stack pattern).
            let first = tracker.call_first.entry(site).or_insert((live.stack, 0));
            let from_outside = previous.flatten() != Some(site);
            let repeated = first.0 == live.stack && first.1 > 0;
            if from_outside {
                tracker
                    .repeats_after_outside
                    .entry(site)
                    .or_default()
                    .push(0);
                call_start = Some(StepCalls {
                    from_outside: 1,
                    repeated: 0,
                });
            } else if repeated {
                if let Some(run) = tracker
                    .repeats_after_outside
                    .get_mut(&site)
                    .and_then(|runs| runs.last_mut())
                {
                    *run = run.saturating_add(1);
                }
                call_start = Some(StepCalls {
                    from_outside: 0,
                    repeated: 1,
                });
            }
            if call_start.is_some() {
                *first = (live.stack, 0);
                let calls = tracker.calls.entry(site).or_default();
                *calls = calls.saturating_add(1);
            } else {
                first.1 = first.1.saturating_add(1);
            }
        }
        if let Some(split) = split {
            tracker.loop_code = Some(split.site.0);
            let starts_split =
                call_start.is_some_and(|start| start.from_outside > 0 || repeats_start_calls);
            if starts_split && origin.call_site == Some(split.site) {
                tracker.split_calls = tracker.split_calls.saturating_add(1);
                if tracker.split_calls > 1 {
                    tracker.close(t_ns);
                }
            }
        } else if origin.optimizer {
            if tracker.loop_code.is_none() {
                tracker.loop_code = origin.user.map(|(code, _)| code);
            }
            tracker.in_optimizer = true;
            tracker.optimizer_ran = true;
        } else if tracker.in_optimizer {
            // The optimizer's step is over: so is the training step.
            tracker.in_optimizer = false;
            tracker.close(t_ns);
        }
        // Counted once the step before has ended at this allocation: in the step it begins.
        if let (Some(start), Some(site)) = (call_start, origin.call_site) {
            let calls = tracker.step_calls.entry(site).or_default();
            calls.from_outside = calls.from_outside.saturating_add(start.from_outside);
            calls.repeated = calls.repeated.saturating_add(start.repeated);
        }
        tracker.live_bytes = tracker.live_bytes.saturating_add(live.size);
        tracker.current.peak_bytes = tracker.current.peak_bytes.max(tracker.live_bytes);
        if !tracker.steps.is_empty() {
            tracker
                .survivors
                .insert(live.seq, (live.stack, live.size, tracker.steps.len()));
        }
    }

    fn ended(&mut self, live: &Live) {
        if !self.counts(live.device) {
            return;
        }
        if let Some(tracker) = self.processes.get_mut(&live.process) {
            tracker.live_bytes = tracker.live_bytes.saturating_sub(live.size);
            tracker.survivors.remove(&live.seq);
        }
    }

    /// Each process's steps (processes with none left out), with the lines that leak.
    pub fn finish(mut self, processes: &[Process]) -> Vec<ProcessSteps> {
        let mut trackers: Vec<(u32, Tracker)> = self.processes.drain().collect();
        trackers.sort_by_key(|(process, _)| *process);
        let mut found = Vec::new();
        for (process, mut tracker) in trackers {
            // Survivors are charged to the steps whose end was seen, whatever comes after.
            let closed = tracker.steps.len();
            let step_in_progress = match self.split.contains_key(&process) {
                // Every model call after the first began a step: the last one's is running.
                true => tracker.split_calls > 1,
                false => tracker.optimizer_ran,
            };
            if step_in_progress {
                let end = tracker.last_t_ns.max(tracker.current.start_t_ns);
                tracker.end_step(end, true);
            }
            // Model calls per step, now that every call's start is known for what it was.
            let forward_calls: Vec<u32> = tracker
                .calls_per_step
                .iter()
                .map(|calls| tracker.forward_calls(calls))
                .collect();
            for (step, calls) in tracker.steps.iter_mut().zip(forward_calls) {
                step.forward_calls = calls;
            }
            if tracker.steps.is_empty() {
                continue;
            }
            let by_call = self.split.get(&process).and_then(|split| {
                let (code, offset) = split.site;
                let code = processes.get(process as usize)?.codes.get(&code)?;
                let line = python::line_of(code, offset).unwrap_or(0);
                Some((Rc::from(code.filename.as_str()), line))
            });
            let mut result = ProcessSteps {
                process,
                by_call,
                steps: tracker.steps,
                leaks: Vec::new(),
            };
            let last = closed;
            if result.grows() {
                // Made in steps 2..N−1 (indices 1..N−2), still live at the end of step N.
                let mut by_line: FxHashMap<(u32, u32), (u64, u64, Vec<u64>)> = FxHashMap::default();
                for &(stack, size, step) in &tracker.at_last_end {
                    if step + 1 >= last {
                        continue;
                    }
                    let origin = self.origin(processes, process, stack);
                    let line = tracker
                        .loop_code
                        .and_then(|code| origin.frames.iter().find(|(c, _)| *c == code))
                        .copied()
                        .or(origin.user);
                    let Some(line) = line else {
                        continue;
                    };
                    let entry = by_line
                        .entry(line)
                        .or_insert_with(|| (0, 0, vec![0; last - 2]));
                    entry.0 = entry.0.saturating_add(size);
                    entry.1 += 1;
                    if let Some(slot) = entry.2.get_mut(step - 1) {
                        *slot = slot.saturating_add(size);
                    }
                }
                let info = processes.get(process as usize);
                let mut leaks: Vec<Leak> = by_line
                    .into_iter()
                    .filter_map(|((code, line), (bytes, count, per_step))| {
                        let code = info?.codes.get(&code)?;
                        Some(Leak {
                            file: code.filename.as_str().into(),
                            line,
                            function: code.qualname.clone(),
                            bytes,
                            count,
                            per_step,
                        })
                    })
                    .collect();
                leaks.sort_by(|a, b| {
                    b.bytes
                        .cmp(&a.bytes)
                        .then_with(|| a.file.cmp(&b.file))
                        .then(a.line.cmp(&b.line))
                });
                result.leaks = leaks;
            }
            found.push(result);
        }
        found
    }
}

impl Observer for Steps {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event { t_ns, effect, .. } => match effect {
                Effect::Added(live) => {
                    if let Some(replaced) = state.replaced().copied() {
                        self.ended(&replaced);
                    }
                    if self.counts(live.device) {
                        self.added(processes, *t_ns, live);
                    }
                }
                Effect::Removed(live) => {
                    if self.counts(live.device)
                        && let Some(tracker) = self.processes.get_mut(&live.process)
                    {
                        tracker.last_t_ns = tracker.last_t_ns.max(*t_ns);
                    }
                    self.ended(live);
                }
                _ => {}
            },
            Step::Dump { cleared, .. } => {
                for live in cleared.iter() {
                    self.ended(live);
                }
            }
            Step::MemInfo { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending(ends: &[u64]) -> ProcessSteps {
        ProcessSteps {
            steps: ends
                .iter()
                .map(|&end_bytes| StepFigures {
                    end_bytes,
                    ..StepFigures::default()
                })
                .collect(),
            ..ProcessSteps::default()
        }
    }

    #[test]
    fn growth_needs_three_steps_each_ending_above_the_one_before_from_the_third_on() {
        assert_eq!(ending(&[10, 30, 25]).growth(), vec![20, -5]);
        // The second step's end is not compared with the first's (setup, optimizer state).
        assert!(ending(&[100, 10, 20, 30]).grows());
        assert!(!ending(&[10, 20, 30, 30]).grows());
        assert!(!ending(&[10, 20]).grows());
        assert!(!ending(&[]).grows());
    }
}
