//! Finds the moment each device's live bytes were highest (pass one of every peak view).

use crate::replay::{Effect, Observer, Process, State, Step};

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
}

/// Peaks over all processes, and per process.
#[derive(Default)]
pub struct Peaks {
    pub total: Vec<Peak>,
    /// (process, peak of that process alone).
    pub per_process: Vec<(u32, Peak)>,
}

impl Observer for Peaks {
    fn step(&mut self, state: &State, _processes: &[Process], step: &Step<'_>) {
        let Step::Event {
            process,
            t_ns,
            effect: Effect::Added(live),
            ..
        } = step
        else {
            return;
        };
        // Only an allocation can raise a peak.
        let device = live.device;
        let bytes = state.device_bytes(device);
        let count = state
            .devices()
            .iter()
            .find(|d| d.device == device)
            .map_or(0, |d| d.live_count);
        raise(
            &mut self.total,
            |p| p.device == device,
            Peak {
                device,
                bytes,
                count,
                t_ns: *t_ns,
                seq: state.seq,
            },
        );
        let process_bytes = state.process_device_bytes(*process, device);
        let entry = self
            .per_process
            .iter_mut()
            .find(|(p, peak)| *p == *process && peak.device == device);
        let candidate = Peak {
            device,
            bytes: process_bytes,
            count: 0,
            t_ns: *t_ns,
            seq: state.seq,
        };
        match entry {
            Some((_, peak)) if peak.bytes >= process_bytes => {}
            Some((_, peak)) => *peak = candidate,
            None => {
                self.per_process.push((*process, candidate));
                self.per_process
                    .sort_by_key(|(p, peak)| (*p, crate::render::device_order(peak.device)));
            }
        }
    }
}

fn raise(peaks: &mut Vec<Peak>, matches: impl Fn(&Peak) -> bool, candidate: Peak) {
    match peaks.iter_mut().find(|peak| matches(peak)) {
        Some(peak) if peak.bytes >= candidate.bytes => {}
        Some(peak) => *peak = candidate,
        None => {
            peaks.push(candidate);
            peaks.sort_by_key(|peak| crate::render::device_order(peak.device));
        }
    }
}
