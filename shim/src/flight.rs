//! Flight-recorder mode (`VRAMSHIM_MODE=ring`): keep the last N events in memory and the set of
//! allocations that were live when the oldest of them happened, and write both as one
//! self-contained dump on demand. Replaying a dump (live set, then window) gives the exact
//! state at the dump, for runs of days with bounded memory and disk.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};

use vramshim_format::{DumpBegin, Event, EventKind, Record};

/// The last events and the live set before them.
pub struct Window {
    capacity: usize,
    recent: VecDeque<Record>,
    /// Objects live before the first record of `recent`, by (kind class, address or handle).
    live_before: HashMap<(u8, u64), Event>,
    discarded: u64,
    /// The `DumpBegin` of a crash dump, made in advance: a crash may not allocate.
    crash_begin: Record,
}

impl Window {
    pub fn new(capacity: usize) -> Window {
        Window {
            capacity,
            recent: VecDeque::with_capacity(capacity.min(1 << 20)),
            live_before: HashMap::new(),
            discarded: 0,
            crash_begin: Record::DumpBegin(DumpBegin {
                t_ns: 0,
                reason: "crash".to_owned(),
                events_discarded: 0,
                live_count: 0,
                window_count: 0,
            }),
        }
    }

    pub fn push(&mut self, record: Record) {
        self.recent.push_back(record);
        while self.recent.len() > self.capacity {
            if let Some(Record::Event(event)) = self.recent.pop_front() {
                apply(&mut self.live_before, &event);
            }
            self.discarded += 1;
        }
    }

    /// The dump: a `DumpBegin`, the live set before the window (oldest first), the window.
    pub fn dump(&self, reason: &str, t_ns: u64) -> Vec<Record> {
        let mut live: Vec<Event> = self.live_before.values().copied().collect();
        live.sort_by_key(|event| (event.t_ns, event.addr, event.handle));
        let mut records = Vec::with_capacity(1 + live.len() + self.recent.len());
        records.push(Record::DumpBegin(DumpBegin {
            t_ns,
            reason: reason.to_owned(),
            events_discarded: self.discarded,
            live_count: live.len() as u64,
            window_count: self.recent.len() as u64,
        }));
        records.extend(live.into_iter().map(Record::Event));
        records.extend(self.recent.iter().cloned());
        records
    }
}

impl Window {
    /// The dump at a crash, without allocating: a `DumpBegin`, the live set before the window
    /// (in no particular order), the window, and then `newer` events the caller writes itself.
    pub fn crash_dump(&mut self, t_ns: u64, newer: usize, mut emit: impl FnMut(&Record)) {
        if let Record::DumpBegin(begin) = &mut self.crash_begin {
            begin.t_ns = t_ns;
            begin.events_discarded = self.discarded;
            begin.live_count = self.live_before.len() as u64;
            begin.window_count = (self.recent.len() + newer) as u64;
        }
        emit(&self.crash_begin);
        for event in self.live_before.values() {
            emit(&Record::Event(*event));
        }
        for record in &self.recent {
            emit(record);
        }
    }
}

/// Which live object an event creates or ends, if any: (class, key, creates).
fn identity(event: &Event) -> Option<(u8, u64, bool)> {
    if event.result != 0 {
        return None;
    }
    // Arrays have no address: they are known by handle.
    let by_addr_or_handle = if event.addr != 0 {
        event.addr
    } else {
        event.handle | 1 << 63
    };
    Some(match event.kind {
        EventKind::Alloc => (0, by_addr_or_handle, true),
        EventKind::Free => (0, by_addr_or_handle, false),
        EventKind::Create => (1, event.handle, true),
        EventKind::Release => (1, event.handle, false),
        EventKind::Map => (2, event.addr, true),
        EventKind::Unmap => (2, event.addr, false),
        EventKind::Reserve => (3, event.addr, true),
        EventKind::Unreserve => (3, event.addr, false),
        EventKind::AllocFailed | EventKind::Trim => return None,
    })
}

fn apply(live: &mut HashMap<(u8, u64), Event>, event: &Event) {
    if let Some((class, key, creates)) = identity(event) {
        if creates {
            live.insert((class, key), *event);
        } else {
            live.remove(&(class, key));
        }
    }
}

const NO_REQUEST: u8 = 0;
/// The dump signal (`VRAMSHIM_DUMP_SIGNAL`) arrived.
pub const REQUEST_SIGNAL: u8 = 1;
pub const REQUEST_ALLOC_FAILED: u8 = 2;

/// Why a dump was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    Signal,
    AllocFailed,
}

static REQUEST: AtomicU8 = AtomicU8::new(NO_REQUEST);

/// Asks for a dump at the next flush (async-signal-safe).
pub fn request(reason: u8) {
    REQUEST.store(reason, Ordering::Release);
}

/// The pending dump request, if any.
pub fn take_request() -> Option<Request> {
    match REQUEST.swap(NO_REQUEST, Ordering::AcqRel) {
        REQUEST_SIGNAL => Some(Request::Signal),
        REQUEST_ALLOC_FAILED => Some(Request::AllocFailed),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, addr: u64, t_ns: u64) -> Record {
        Record::Event(Event {
            kind,
            addr,
            t_ns,
            size: 4096,
            ..Event::default()
        })
    }

    #[test]
    fn dump_replays_to_the_current_live_set() {
        let mut window = Window::new(3);
        window.push(event(EventKind::Alloc, 0x1000, 1)); // live, falls out
        window.push(event(EventKind::Alloc, 0x2000, 2)); // freed inside the window
        window.push(event(EventKind::Alloc, 0x3000, 3)); // falls out, freed later
        window.push(event(EventKind::Free, 0x2000, 4));
        window.push(event(EventKind::Free, 0x3000, 5));
        window.push(event(EventKind::Alloc, 0x4000, 6));
        let records = window.dump("test", 7);
        let Record::DumpBegin(begin) = &records[0] else {
            panic!("no DumpBegin")
        };
        assert_eq!(begin.events_discarded, 3);
        // Live when the window opened: all three, since two are freed inside the window.
        assert_eq!(begin.live_count, 3);
        assert_eq!(begin.window_count, 3);
        // Replay: the live set before the window, then the window.
        let mut live = HashMap::new();
        for record in &records[1..] {
            if let Record::Event(e) = record {
                apply(&mut live, e);
            }
        }
        let mut addrs: Vec<u64> = live.keys().map(|(_, key)| *key).collect();
        addrs.sort();
        assert_eq!(addrs, vec![0x1000, 0x4000]);
    }
}
