//! Bytes allocated over the whole run, per stack (for "where does churn come from" views).

use super::groups::IdTotals;
use crate::replay::{Effect, Observer, Process, State, Step};

/// Sums every successful allocation per (process, stack id).
#[allow(dead_code)] // used by `flamegraph --what allocated` and `diff` (in progress)
#[derive(Default)]
pub struct Allocated {
    device: Option<i32>,
    pub totals: IdTotals,
}

#[allow(dead_code)]
impl Allocated {
    pub fn new(device: Option<i32>) -> Allocated {
        Allocated {
            device,
            totals: IdTotals::default(),
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
            let entry = self.totals.entry((live.process, live.stack)).or_default();
            entry.0 += live.size;
            entry.1 += 1;
        }
    }
}
