//! Every recorded event as a row (the Parquet export), in replay order. A free records no
//! size; its row gets the size of what it freed (0 when that was never seen allocated), so
//! that sums over frees mean bytes given back.

use vramshim_format::Event;

use crate::replay::{Effect, Observer, Process, State, Step};

/// Receives the events of a replay, in time order.
pub trait EventSink {
    /// `event` of process `process` (an index into `processes`) at replay time `t_ns`.
    fn event(&mut self, process: u32, t_ns: u64, event: &Event, processes: &[Process]);
}

/// The observer: every event, or those of one device.
pub struct Events<S> {
    device: Option<i32>,
    pub sink: S,
}

impl<S: EventSink> Events<S> {
    pub fn new(device: Option<i32>, sink: S) -> Events<S> {
        Events { device, sink }
    }
}

impl<S: EventSink> Observer for Events<S> {
    fn step(&mut self, _state: &State, processes: &[Process], step: &Step<'_>) {
        if let Step::Event {
            process,
            t_ns,
            event,
            effect,
        } = step
            && self.device.is_none_or(|d| d == event.device)
        {
            let mut row = **event;
            if let Effect::Removed(live) = effect
                && row.size == 0
            {
                row.size = live.size;
            }
            self.sink.event(*process, *t_ns, &row, processes);
        }
    }
}
