//! Inputs of the flame graph views that no other analysis gathers.

use rustc_hash::FxHashMap;

use super::groups::{IdTotals, add_total};
use crate::replay::{Effect, Observer, Process, State, Step};

/// Bytes allocated over the whole run per device and (process, stack id): the `allocated`
/// flame graph keeps devices apart, [`super::allocated::Allocated`] sums them.
#[derive(Default)]
pub struct AllocatedByDevice {
    device: Option<i32>,
    by_thread: bool,
    pub devices: FxHashMap<i32, IdTotals>,
}

impl AllocatedByDevice {
    /// Every device, or only `device`; per thread too when `by_thread`.
    pub fn new(device: Option<i32>, by_thread: bool) -> AllocatedByDevice {
        AllocatedByDevice {
            device,
            by_thread,
            devices: FxHashMap::default(),
        }
    }
}

impl Observer for AllocatedByDevice {
    fn step(&mut self, _state: &State, _processes: &[Process], step: &Step<'_>) {
        if let Step::Event {
            effect: Effect::Added(live),
            ..
        } = step
            && self.device.is_none_or(|d| d == live.device)
        {
            let totals = self.devices.entry(live.device).or_default();
            add_total(totals, live, self.by_thread);
        }
    }
}
