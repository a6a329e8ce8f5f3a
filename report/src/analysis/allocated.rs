//! Bytes allocated over the whole run, per device and stack (where churn comes from): the
//! `allocated` flame graph keeps devices apart, `diff` sums them.

use rustc_hash::FxHashMap;

use super::groups::{IdTotals, add_total};
use crate::replay::{Effect, Observer, Process, State, Step};

/// Sums every successful allocation per device and (process, stack id), and per thread when
/// asked.
#[derive(Default)]
pub struct Allocated {
    device: Option<i32>,
    by_thread: bool,
    pub devices: FxHashMap<i32, IdTotals>,
}

impl Allocated {
    /// Every device, or only `device`; per thread too when `by_thread`.
    pub fn new(device: Option<i32>, by_thread: bool) -> Allocated {
        Allocated {
            device,
            by_thread,
            devices: FxHashMap::default(),
        }
    }
}

impl Observer for Allocated {
    fn step(&mut self, _state: &State, _processes: &[Process], step: &Step<'_>) {
        if let Step::Event {
            effect: Effect::Added(live),
            ..
        } = step
            && self.device.is_none_or(|d| d == live.device)
        {
            add_total(
                self.devices.entry(live.device).or_default(),
                live,
                self.by_thread,
            );
        }
    }
}
