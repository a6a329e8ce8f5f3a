//! Inputs of the flame graph views that no other analysis gathers.

use rustc_hash::FxHashMap;

use super::groups::IdTotals;
use crate::replay::{Effect, Observer, Process, State, Step};

/// Bytes allocated over the whole run per device and (process, stack id): the `allocated`
/// flame graph keeps devices apart, [`super::allocated::Allocated`] sums them.
#[derive(Default)]
pub struct AllocatedByDevice {
    device: Option<i32>,
    pub devices: FxHashMap<i32, IdTotals>,
}

impl AllocatedByDevice {
    /// Every device, or only `device`.
    pub fn new(device: Option<i32>) -> AllocatedByDevice {
        AllocatedByDevice {
            device,
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
            let entry = self
                .devices
                .entry(live.device)
                .or_default()
                .entry((live.process, live.stack))
                .or_default();
            entry.0 += live.size;
            entry.1 += 1;
        }
    }
}
