//! Bytes allocated over the whole run, per stack (for "where does churn come from" views).

use super::groups::{IdTotals, add_total};
use crate::replay::{Effect, Observer, Process, State, Step};

/// Sums every successful allocation per (process, stack id), and per thread when asked.
#[allow(dead_code)] // used by `flamegraph --what allocated` and `diff` (in progress)
#[derive(Default)]
pub struct Allocated {
    device: Option<i32>,
    by_thread: bool,
    pub totals: IdTotals,
}

#[allow(dead_code)]
impl Allocated {
    pub fn new(device: Option<i32>, by_thread: bool) -> Allocated {
        Allocated {
            device,
            by_thread,
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
            add_total(&mut self.totals, live, self.by_thread);
        }
    }
}
