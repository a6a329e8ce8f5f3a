//! What a timeline trace (Chrome/Perfetto trace JSON) shows, as the replay makes it: each
//! process's live bytes per device after every change, the device's used memory wherever it
//! was sampled, and failed allocations. Entries go to a [`TrackSink`] in time order.

use rustc_hash::FxHashMap;
use vramshim_format::{Event, EventKind};

use crate::replay::{Effect, Observer, Process, State, Step};

/// One point of a track.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrackPoint {
    /// Live bytes of `process` on `device` after a change.
    Live {
        process: u32,
        device: i32,
        t_ns: u64,
        bytes: u64,
    },
    /// The device's used memory (total − free) as the driver reported it.
    Used {
        process: u32,
        device: i32,
        t_ns: u64,
        used: u64,
        total: u64,
    },
    /// A failed allocating call.
    Failed {
        process: u32,
        t_ns: u64,
        event: Event,
    },
}

/// Receives the points of a replay, in time order.
pub trait TrackSink {
    fn point(&mut self, point: &TrackPoint, processes: &[Process]);
}

/// The observer: only `device` when set.
pub struct Tracks<S> {
    device: Option<i32>,
    /// Live bytes per (process, device).
    live: FxHashMap<(u32, i32), u64>,
    pub sink: S,
}

impl<S: TrackSink> Tracks<S> {
    pub fn new(device: Option<i32>, sink: S) -> Tracks<S> {
        Tracks {
            device,
            live: FxHashMap::default(),
            sink,
        }
    }

    fn selects(&self, device: i32) -> bool {
        self.device.is_none_or(|d| d == device)
    }

    /// Changes the live bytes of (process, device) and reports them.
    fn change(
        &mut self,
        processes: &[Process],
        key: (u32, i32),
        t_ns: u64,
        added: u64,
        removed: u64,
    ) {
        let bytes = self.live.entry(key).or_default();
        *bytes = bytes.saturating_add(added).saturating_sub(removed);
        let point = TrackPoint::Live {
            process: key.0,
            device: key.1,
            t_ns,
            bytes: *bytes,
        };
        self.sink.point(&point, processes);
    }
}

impl<S: TrackSink> Observer for Tracks<S> {
    fn step(&mut self, _state: &State, processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event {
                process,
                t_ns,
                event,
                effect,
            } => match effect {
                Effect::Added(live) if self.selects(live.device) => {
                    self.change(processes, (*process, live.device), *t_ns, live.size, 0);
                }
                Effect::Removed(live) if self.selects(live.device) => {
                    self.change(processes, (*process, live.device), *t_ns, 0, live.size);
                }
                Effect::Failed
                    if event.kind == EventKind::AllocFailed && self.selects(event.device) =>
                {
                    let point = TrackPoint::Failed {
                        process: *process,
                        t_ns: *t_ns,
                        event: **event,
                    };
                    self.sink.point(&point, processes);
                }
                _ => {}
            },
            Step::MemInfo {
                process,
                t_ns,
                info,
            } if self.selects(info.device) => {
                let point = TrackPoint::Used {
                    process: *process,
                    device: info.device,
                    t_ns: *t_ns,
                    used: info.total.saturating_sub(info.free),
                    total: info.total,
                };
                self.sink.point(&point, processes);
            }
            Step::Dump {
                process,
                t_ns,
                cleared,
            } => {
                // The dump restarts the process's live set: what it lists comes back as
                // additions.
                let mut removed: FxHashMap<i32, u64> = FxHashMap::default();
                for live in cleared.iter().filter(|l| self.selects(l.device)) {
                    *removed.entry(live.device).or_default() += live.size;
                }
                let mut devices: Vec<(i32, u64)> = removed.into_iter().collect();
                devices.sort_unstable();
                for (device, bytes) in devices {
                    self.change(processes, (*process, device), *t_ns, 0, bytes);
                }
            }
            _ => {}
        }
    }
}
