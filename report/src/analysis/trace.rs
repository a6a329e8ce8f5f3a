//! The allocation trace of PyTorch's memory snapshot (`device_traces`): what each replay step
//! means as the viewer's trace entries. In the tensor view, PyTorch's own events are its own
//! entries (`alloc`, `free_requested`, `free_completed`, `segment_alloc`, `segment_free`,
//! `oom`). Every other allocation the recorder saw is a segment holding one block of its full
//! size, so an allocation is `segment_alloc` + `alloc`, its free is `free_requested` +
//! `free_completed` + `segment_free`, and a failed allocation is `oom`.
//!
//! Entries go to a [`Sink`] as the replay makes them, numbered per device, so a caller can
//! count them in one pass and write only the last N of a device in another. A ring-mode log
//! with several dumps gives one history, each event once (see [`Resume`]).

use rustc_hash::FxHashMap;
use vramshim_format::EventKind;

use crate::replay::{Effect, Live, Observer, Process, SegmentChange, State, Step};

/// What a trace entry records (the viewer's `action`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    SegmentAlloc,
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentFree,
    Oom,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::SegmentAlloc => "segment_alloc",
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentFree => "segment_free",
            Action::Oom => "oom",
        }
    }
}

/// One trace entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub action: Action,
    pub device: i32,
    /// The address the viewer knows the allocation by ([`viewer_addr`]); 0 for `oom`.
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    /// Replay time (ns since the earliest start).
    pub t_ns: u64,
    /// Whose stack `stack` is (index into the replay's processes).
    pub process: u32,
    /// The allocating call's stack (frees too: the viewer shows a freed block with its
    /// entry's frames); for `oom`, the failed call's.
    pub stack: u32,
    /// `oom` only: the device's free memory read right after the failure (0 when none was
    /// recorded).
    pub device_free: u64,
}

/// Receives the entries of a replay, in time order.
pub trait Sink {
    /// `index` counts the entries of `entry.device` from 0.
    fn entry(&mut self, index: u64, entry: &Entry, processes: &[Process]);
}

/// Where objects without an address start in the viewer's address space: above any real
/// device address (x86-64 and GPU virtual addresses stay below 2^49) and below 2^53, so that
/// JavaScript numbers hold them exactly.
pub const SYNTHETIC_BASE: u64 = 1 << 52;
const SYNTHETIC_HANDLE_BITS: u32 = 50;

/// The address the viewer knows `live` by: its own, or for objects that have none (VMM
/// physical memory from `cuMemCreate`, CUDA arrays) one made from its handle.
pub fn viewer_addr(live: &Live) -> u64 {
    if live.addr != 0 {
        return live.addr;
    }
    let class = if live.kind == EventKind::Create {
        0
    } else {
        1 << SYNTHETIC_HANDLE_BITS
    };
    SYNTHETIC_BASE | class | (live.handle & ((1 << SYNTHETIC_HANDLE_BITS) - 1))
}

/// The observer: turns replay steps into entries for the selected device(s).
pub struct Trace<S> {
    /// Only this device; None: every device (never pinned host or unknown-device memory: the
    /// viewer shows devices).
    device: Option<i32>,
    pub sink: S,
    /// Entries made so far per device (a map: ordinals come from the log and may be huge).
    counts: FxHashMap<i32, u64>,
    /// Allocations left out because they are pinned host memory (when no device is selected).
    pub host_allocations: u64,
    /// Allocations left out because their device is unknown (when no device is selected).
    pub unknown_device_allocations: u64,
    /// Per process: the time of its last event so far.
    last_event: Vec<Option<u64>>,
    /// Per process: set while a ring-mode dump repeats what an earlier one gave.
    resume: Vec<Option<Resume>>,
    /// Tensor view: PyTorch's blocks freed by the program and not yet reusable, by (process,
    /// address).
    freeing: FxHashMap<(u32, u64), Live>,
}

/// A ring-mode dump after earlier events of its process. Its records start with the
/// allocations live when its window opened, then the window's events; whatever of them
/// happened by `after` was already traced from the earlier dump, whose window reached at
/// least as far back. So those are skipped, and the objects the dump's restart cleared are
/// ended only if the dump does not list them again (their frees fell between the windows).
struct Resume {
    /// Time of the process's last event before the dump.
    after: u64,
    /// Live-set records of the dump still to come.
    live_left: u64,
    /// What the restart cleared, by viewer address, not yet listed again.
    pending: FxHashMap<u64, Live>,
}

impl<S: Sink> Trace<S> {
    pub fn new(device: Option<i32>, sink: S) -> Trace<S> {
        Trace {
            device,
            sink,
            counts: FxHashMap::default(),
            host_allocations: 0,
            unknown_device_allocations: 0,
            last_event: Vec::new(),
            resume: Vec::new(),
            freeing: FxHashMap::default(),
        }
    }

    /// Ends what ring-mode dumps cleared and never listed again; call once the replay is over,
    /// with its end time.
    pub fn finish(&mut self, end_ns: u64, processes: &[Process]) {
        for index in 0..self.resume.len() {
            if let Some(resume) = self.resume[index].take() {
                self.end_pending(resume.pending, end_ns, processes);
            }
        }
    }

    /// Whether entries of `device` are made.
    pub fn selects(&self, device: i32) -> bool {
        device >= 0 && self.device.is_none_or(|d| d == device)
    }

    fn emit(&mut self, entry: Entry, processes: &[Process]) {
        if entry.device < 0 {
            return;
        }
        let count = self.counts.entry(entry.device).or_default();
        let index = *count;
        *count += 1;
        self.sink.entry(index, &entry, processes);
    }

    fn allocated(&mut self, live: &Live, t_ns: u64, processes: &[Process]) {
        if !self.selects(live.device) {
            if self.device.is_none() {
                if live.device == vramshim_format::HOST_DEVICE {
                    self.host_allocations += 1;
                } else if live.device < 0 {
                    self.unknown_device_allocations += 1;
                }
            }
            return;
        }
        for action in [Action::SegmentAlloc, Action::Alloc] {
            self.emit(of_live(action, live, t_ns), processes);
        }
    }

    /// Ends `pending` objects at `t_ns`, oldest first.
    fn end_pending(&mut self, pending: FxHashMap<u64, Live>, t_ns: u64, processes: &[Process]) {
        let mut ended: Vec<Live> = pending.into_values().collect();
        ended.sort_by_key(|live| live.seq);
        for live in &ended {
            self.freed(live, t_ns, processes);
        }
    }

    /// A ring-mode dump of `process` begins, having cleared `cleared`.
    fn dump(&mut self, process: usize, t_ns: u64, cleared: &[Live], processes: &[Process]) {
        if self.resume.len() <= process {
            self.resume.resize_with(process + 1, || None);
        }
        if let Some(earlier) = self.resume[process].take() {
            self.end_pending(earlier.pending, t_ns, processes);
        }
        let pending: FxHashMap<u64, Live> = cleared
            .iter()
            .map(|live| (viewer_addr(live), *live))
            .collect();
        match self.last_event.get(process).copied().flatten() {
            Some(after) => {
                let live_left = processes
                    .get(process)
                    .and_then(|p| p.dumps.last())
                    .map_or(0, |dump| dump.live_count);
                self.resume[process] = Some(Resume {
                    after,
                    live_left,
                    pending,
                });
            }
            // Nothing traced before: the restart ends what it cleared.
            None => self.end_pending(pending, t_ns, processes),
        }
    }

    /// Handles an event while `process` resumes after a dump; false when the event is to be
    /// traced as usual.
    fn resumed(
        &mut self,
        process: usize,
        t_ns: u64,
        effect: &Effect,
        processes: &[Process],
    ) -> bool {
        let Some(mut resume) = self.resume.get_mut(process).and_then(Option::take) else {
            return false;
        };
        let live_record = resume.live_left > 0;
        resume.live_left = resume.live_left.saturating_sub(1);
        let replayed = t_ns <= resume.after;
        if live_record || replayed {
            if let Effect::Added(live) = effect {
                let key = viewer_addr(live);
                if resume
                    .pending
                    .get(&key)
                    .is_some_and(|old| old.t_ns == live.t_ns)
                {
                    // Live at the earlier dump too: it goes on.
                    resume.pending.remove(&key);
                } else if !replayed {
                    // Listed live, allocated between the two windows.
                    self.allocated(live, t_ns, processes);
                }
            }
            self.resume[process] = Some(resume);
            return true;
        }
        // The first event past what was traced: what the dump did not list again was freed
        // between the windows.
        self.end_pending(resume.pending, t_ns, processes);
        false
    }

    fn freed(&mut self, live: &Live, t_ns: u64, processes: &[Process]) {
        if !self.selects(live.device) {
            return;
        }
        for action in [
            Action::FreeRequested,
            Action::FreeCompleted,
            Action::SegmentFree,
        ] {
            self.emit(of_live(action, live, t_ns), processes);
        }
    }

    /// Tensor view: PyTorch's own entries, as its allocator reported them (sizes as its
    /// trace gives them); true when the step was one of its events or segments.
    fn tensor_step(
        &mut self,
        state: &State,
        process: u32,
        t_ns: u64,
        event: &vramshim_format::Event,
        effect: &Effect,
        processes: &[Process],
    ) -> bool {
        match state.segment_change() {
            Some(SegmentChange::Added(segment)) => {
                // (Not held back, the allocation was traced as an allocation of its own.)
                if !matches!(effect, Effect::Removed(_)) && self.selects(segment.device) {
                    self.emit(of_live(Action::SegmentAlloc, &segment, t_ns), processes);
                }
                return true;
            }
            Some(SegmentChange::Removed(segment)) => {
                if self.selects(segment.device) {
                    self.emit(of_live(Action::SegmentFree, &segment, t_ns), processes);
                }
                return true;
            }
            None => {}
        }
        let entry = |action, live: &Live, size| Entry {
            size,
            ..of_live(action, live, t_ns)
        };
        match (event.kind, effect) {
            (EventKind::TensorAlloc, Effect::Added(live)) => {
                if self.selects(live.device) {
                    self.emit(entry(Action::Alloc, live, live.requested), processes);
                }
            }
            (EventKind::TensorFreeRequested, Effect::Removed(live)) => {
                if self.selects(live.device) {
                    self.emit(entry(Action::FreeRequested, live, event.size), processes);
                }
                self.freeing.insert((process, live.addr), *live);
            }
            (EventKind::TensorFree, _) => {
                if let Some(live) = self.freeing.remove(&(process, event.addr))
                    && self.selects(live.device)
                {
                    self.emit(entry(Action::FreeCompleted, &live, event.size), processes);
                }
            }
            (EventKind::TensorOom, _) => {
                if self.selects(event.device) {
                    let entry = Entry {
                        action: Action::Oom,
                        device: event.device,
                        addr: 0,
                        size: event.size,
                        stream: event.stream,
                        t_ns,
                        process,
                        stack: event.stack,
                        device_free: event.addr,
                    };
                    self.emit(entry, processes);
                }
            }
            (kind, _) if kind.is_tensor() => {}
            // PyTorch's failed segment allocations: its `oom` entry stands for them (PyTorch
            // 2.1's profiler report has none: there each failed call is one).
            (_, Effect::Failed)
                if processes.get(process as usize).is_some_and(|p| {
                    p.tensor_allocs > 0
                        && !p.tensors_reported_as_blocks()
                        && p.api(event.api) == "cudaMalloc"
                }) => {}
            _ => return false,
        }
        true
    }
}

fn of_live(action: Action, live: &Live, t_ns: u64) -> Entry {
    Entry {
        action,
        device: live.device,
        addr: viewer_addr(live),
        size: live.size,
        stream: live.stream,
        t_ns,
        process: live.process,
        stack: live.stack,
        device_free: 0,
    }
}

impl<S: Sink> Observer for Trace<S> {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event {
                process,
                t_ns,
                event,
                effect,
            } => {
                let index = *process as usize;
                if self.last_event.len() <= index {
                    self.last_event.resize(index + 1, None);
                }
                let last = &mut self.last_event[index];
                *last = Some(last.map_or(*t_ns, |t| t.max(*t_ns)));
                if self.resumed(index, *t_ns, effect, processes) {
                    return;
                }
                if self.tensor_step(state, *process, *t_ns, event, effect, processes) {
                    return;
                }
                match effect {
                    Effect::Added(live) => {
                        // The same address allocated again without a free: the free was lost,
                        // and the replay ended the older allocation here.
                        if let Some(old) = state.replaced() {
                            self.freed(old, *t_ns, processes);
                        }
                        self.allocated(live, *t_ns, processes);
                    }
                    Effect::Removed(live) => self.freed(live, *t_ns, processes),
                    Effect::Failed => {
                        if self.selects(event.device) {
                            let entry = Entry {
                                action: Action::Oom,
                                device: event.device,
                                addr: 0,
                                size: event.size,
                                stream: event.stream,
                                t_ns: *t_ns,
                                process: *process,
                                stack: event.stack,
                                device_free: event.mem_info.map_or(0, |(free, _)| free),
                            };
                            self.emit(entry, processes);
                        }
                    }
                    Effect::Unmatched | Effect::None => {}
                }
            }
            // A ring-mode dump restarts the process's live set.
            Step::Dump {
                process,
                t_ns,
                cleared,
            } => self.dump(*process as usize, *t_ns, cleared, processes),
            Step::MemInfo { .. } => {}
        }
    }
}

/// A sink that only counts: entries per device and which processes made them.
#[derive(Default)]
pub struct Census {
    /// Per device ordinal: entries, and the processes (indexes) with entries there.
    pub devices: std::collections::BTreeMap<i32, (u64, Vec<u32>)>,
}

impl Sink for Census {
    fn entry(&mut self, _index: u64, entry: &Entry, _processes: &[Process]) {
        let (count, processes) = self.devices.entry(entry.device).or_default();
        *count += 1;
        if !processes.contains(&entry.process) {
            processes.push(entry.process);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(kind: EventKind, addr: u64, handle: u64) -> Live {
        Live {
            process: 0,
            kind,
            api: 0,
            device: 0,
            addr,
            handle,
            size: 1,
            requested: 1,
            stack: 0,
            thread: 0,
            stream: 0,
            t_ns: 0,
            seq: 0,
        }
    }

    #[test]
    fn addresses_of_objects_without_one_are_distinct_and_exact_in_javascript() {
        let real = live(EventKind::Alloc, 0x7000_0000_0000, 0);
        assert_eq!(viewer_addr(&real), 0x7000_0000_0000);
        let physical = viewer_addr(&live(EventKind::Create, 0, 0x1000));
        let array = viewer_addr(&live(EventKind::Alloc, 0, 0x1000));
        assert_ne!(physical, array);
        for addr in [physical, array] {
            assert!((SYNTHETIC_BASE..1 << 53).contains(&addr), "{addr:#x}");
        }
        let big = viewer_addr(&live(EventKind::Create, 0, u64::MAX));
        assert!(big < 1 << 53);
    }
}
