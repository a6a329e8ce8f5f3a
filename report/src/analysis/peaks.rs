//! Finds the moment each device's live bytes were highest, and the exact set of allocations
//! live then, in the same single pass.
//!
//! The set is kept without copying the live set at every new peak: an allocation live at the
//! peak is either still live at the end (allocated at or before the peak's event) or was freed
//! after the peak, and only the latter need remembering. A new peak forgets them all. So the
//! extra memory is bounded by the peak's live set.

use crate::analysis::snapshot::Snapshot;
use crate::replay::{Effect, Live, Observer, Process, SegmentChange, State, Step};

/// A device's highest live bytes and the first moment they were reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peak {
    /// Device ordinal; -1 is pinned host memory.
    pub device: i32,
    pub bytes: u64,
    pub count: u64,
    /// Replay time and event sequence number at which the peak was first reached.
    pub t_ns: u64,
    pub seq: u64,
    /// Tensor view: PyTorch's segments on the device at that moment (count, bytes).
    pub segments: (u64, u64),
}

/// Tensor view: a device's highest reserved bytes (what the driver handed out: PyTorch's
/// segments and every allocation outside its allocator), first reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReservedPeak {
    pub device: i32,
    pub bytes: u64,
    pub t_ns: u64,
    /// PyTorch's segments then (count, bytes).
    pub segments: (u64, u64),
}

/// Peaks over all processes, and per process.
#[derive(Default)]
pub struct Peaks {
    pub total: Vec<Peak>,
    /// Tensor view: the reserved peak of each device that held PyTorch segments, by device.
    reserved: Vec<ReservedPeak>,
    /// (process, peak of that process alone).
    pub per_process: Vec<(u32, Peak)>,
    /// Per device (same order as `total`): allocations live at the peak, freed since.
    freed_since_peak: Vec<Vec<Live>>,
}

impl Peaks {
    /// Tensor view: the reserved peak of `device`, if PyTorch held segments there.
    pub fn reserved(&self, device: i32) -> Option<ReservedPeak> {
        self.reserved
            .iter()
            .find(|p| p.device == device && p.segments.0 > 0)
            .copied()
    }

    /// Tensor view: follows the reserved bytes of `device` after a step that may raise them.
    /// (Always inlined: it runs at every allocation, and as a call it cost 50 instructions.)
    #[inline(always)]
    fn reserve(&mut self, state: &State, device: i32, t_ns: u64) {
        let bytes = state.reserved_bytes(device);
        // The segments are looked up only for a new peak (not at every allocation).
        let candidate = || ReservedPeak {
            device,
            bytes,
            t_ns,
            segments: state.segment_totals(device),
        };
        match self.reserved.iter_mut().find(|p| p.device == device) {
            Some(peak) if peak.bytes >= bytes => {}
            Some(peak) => *peak = candidate(),
            None => self.reserved.push(candidate()),
        }
    }
    /// The exact live set at each device's peak (devices in report order), given the state
    /// where the replay ended.
    pub fn snapshots(&self, state: &State, only: Option<i32>) -> Vec<Snapshot> {
        self.total
            .iter()
            .zip(&self.freed_since_peak)
            .filter(|(peak, _)| only.is_none_or(|d| d == peak.device))
            .map(|(peak, freed)| {
                let still_live = state
                    .live()
                    .filter(|live| live.device == peak.device && live.seq <= peak.seq);
                let mut snapshot = Snapshot::from_allocations(
                    Some(peak.device),
                    peak.t_ns,
                    still_live.chain(freed.iter()).copied().collect(),
                );
                snapshot.segments = peak.segments;
                snapshot
            })
            .collect()
    }

    #[inline(always)]
    fn ended(&mut self, live: &Live) {
        if let Some(index) = self.total.iter().position(|p| p.device == live.device)
            && live.seq <= self.total[index].seq
        {
            self.freed_since_peak[index].push(*live);
        }
    }
}

impl Observer for Peaks {
    #[inline(always)]
    fn step(&mut self, state: &State, _processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event {
                process,
                t_ns,
                effect,
                ..
            } => {
                // Reserved bytes rise with a new segment (first) or a new allocation.
                let segment_added = match state.segment_change_ref() {
                    Some(SegmentChange::Added(segment)) => Some(segment.device),
                    _ => None,
                };
                if let Effect::Added(live) = effect {
                    self.reserve(state, segment_added.unwrap_or(live.device), *t_ns);
                    self.added(state, *process, *t_ns, live);
                    return;
                }
                if let Some(device) = segment_added {
                    self.reserve(state, device, *t_ns);
                }
                if let Effect::Removed(live) = effect {
                    self.ended(live);
                }
            }
            Step::Dump { cleared, .. } => {
                for live in cleared.iter() {
                    self.ended(live);
                }
            }
            Step::MemInfo { .. } => {}
        }
    }
}

impl Peaks {
    /// An allocation: the only step that can raise a peak.
    #[inline(always)]
    fn added(&mut self, state: &State, process: u32, t_ns: u64, live: &Live) {
        let device = live.device;
        let Some(now) = state.device_totals(device) else {
            return;
        };
        let candidate = Peak {
            device,
            bytes: now.live_bytes,
            count: now.live_count,
            t_ns,
            seq: state.seq,
            segments: (0, 0),
        };
        match self.total.iter().position(|p| p.device == device) {
            Some(index) if self.total[index].bytes >= candidate.bytes => {}
            Some(index) => {
                self.total[index] = Peak {
                    segments: state.segment_totals(device),
                    ..candidate
                };
                self.freed_since_peak[index].clear();
            }
            None => {
                let index = self
                    .total
                    .partition_point(|p| device_order(p.device) < device_order(device));
                self.total.insert(
                    index,
                    Peak {
                        segments: state.segment_totals(device),
                        ..candidate
                    },
                );
                self.freed_since_peak.insert(index, Vec::new());
            }
        }
        let process_bytes = state.process_device_bytes(process, device);
        let candidate = Peak {
            bytes: process_bytes,
            count: 0,
            ..candidate
        };
        match self
            .per_process
            .iter_mut()
            .find(|(p, peak)| *p == process && peak.device == device)
        {
            Some((_, peak)) if peak.bytes >= process_bytes => {}
            Some((_, peak)) => *peak = candidate,
            None => {
                self.per_process.push((process, candidate));
                self.per_process
                    .sort_by_key(|(p, peak)| (*p, device_order(peak.device)));
            }
        }
    }
}

fn device_order(device: i32) -> (bool, u32) {
    crate::render::device_order(device)
}
