//! Flight-recorder mode (`VRAMSHIM_MODE=ring`): keep the last N events in memory and the set of
//! allocations that were live when the oldest of them happened, and write both as one
//! self-contained dump on demand. Replaying a dump (live set, then window) gives the exact
//! state at the dump, for runs of days with bounded memory and disk.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};

use vramshim_format::{DumpBegin, Event, EventKind, MemInfo, Record};

/// One record of the window, in a fixed 64 bytes (a `Record` takes 96 and the window holds a
/// million by default): an event, or a device memory sample (`kind` = [`KEPT_MEM_INFO`],
/// `addr` = free, `size` = total). A failed allocation's device memory is kept aside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    t_ns: u64,
    addr: u64,
    size: u64,
    stream: u64,
    handle: u64,
    thread: u32,
    device: i32,
    result: u32,
    stack: u32,
    api: u16,
    kind: u8,
    /// The event's `mem_info` is the next one in [`Window::failure_info`].
    has_mem_info: bool,
}

const _: () = assert!(std::mem::size_of::<Kept>() == 64);

/// `Kept::kind` of a device memory sample (event kinds are their codes).
const KEPT_MEM_INFO: u8 = u8::MAX;

impl Kept {
    fn from_record(record: &Record) -> Option<(Kept, Option<(u64, u64)>)> {
        Some(match record {
            Record::Event(event) => (
                Kept {
                    t_ns: event.t_ns,
                    addr: event.addr,
                    size: event.size,
                    stream: event.stream,
                    handle: event.handle,
                    thread: event.thread,
                    device: event.device,
                    result: event.result,
                    stack: event.stack,
                    api: event.api,
                    kind: event.kind as u8,
                    has_mem_info: event.mem_info.is_some(),
                },
                event.mem_info,
            ),
            Record::MemInfo(sample) => (
                Kept {
                    t_ns: sample.t_ns,
                    addr: sample.free,
                    size: sample.total,
                    stream: 0,
                    handle: 0,
                    thread: 0,
                    device: sample.device,
                    result: 0,
                    stack: 0,
                    api: 0,
                    kind: KEPT_MEM_INFO,
                    has_mem_info: false,
                },
                None,
            ),
            _ => return None,
        })
    }

    /// The event this record holds (`None` for a device memory sample).
    fn event(&self, mem_info: Option<(u64, u64)>) -> Option<Event> {
        let kind = EventKind::from_code(self.kind)?;
        Some(Event {
            kind,
            api: self.api,
            t_ns: self.t_ns,
            thread: self.thread,
            device: self.device,
            stream: self.stream,
            addr: self.addr,
            size: self.size,
            handle: self.handle,
            result: self.result,
            stack: self.stack,
            mem_info,
        })
    }

    fn record(&self, mem_info: Option<(u64, u64)>) -> Record {
        match self.event(mem_info) {
            Some(event) => Record::Event(event),
            None => Record::MemInfo(MemInfo {
                t_ns: self.t_ns,
                device: self.device,
                free: self.addr,
                total: self.size,
            }),
        }
    }
}

/// The last events and the live set before them.
pub struct Window {
    capacity: usize,
    recent: VecDeque<Kept>,
    /// Device (free, total) of each failed allocation in `recent` that carries it, in order.
    failure_info: VecDeque<(u64, u64)>,
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
            // Grows as the window fills (a short run keeps little).
            recent: VecDeque::with_capacity(capacity.min(1 << 16)),
            failure_info: VecDeque::new(),
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

    /// Keeps an event or a device memory sample (other records are not part of the window).
    pub fn push(&mut self, record: &Record) {
        let Some((kept, mem_info)) = Kept::from_record(record) else {
            return;
        };
        self.recent.push_back(kept);
        if let Some(mem_info) = mem_info {
            self.failure_info.push_back(mem_info);
        }
        while self.recent.len() > self.capacity {
            if let Some(oldest) = self.recent.pop_front() {
                let mem_info = if oldest.has_mem_info {
                    self.failure_info.pop_front()
                } else {
                    None
                };
                if let Some(event) = oldest.event(mem_info) {
                    apply(&mut self.live_before, &event);
                }
            }
            self.discarded += 1;
        }
    }

    /// The dump, record by record to `emit`: a `DumpBegin`, the live set before the window
    /// (oldest first), the window.
    pub fn dump(&self, reason: &str, t_ns: u64, mut emit: impl FnMut(&Record)) {
        let mut live: Vec<&Event> = self.live_before.values().collect();
        live.sort_by_key(|event| (event.t_ns, event.addr, event.handle));
        emit(&Record::DumpBegin(DumpBegin {
            t_ns,
            reason: reason.to_owned(),
            events_discarded: self.discarded,
            live_count: live.len() as u64,
            window_count: self.recent.len() as u64,
        }));
        for event in live {
            emit(&Record::Event(*event));
        }
        self.emit_window(&mut emit);
    }
}

impl Window {
    /// The window's records, oldest first, each with the device memory its failed allocation
    /// carried (kept apart to keep records small). No allocation.
    fn emit_window(&self, emit: &mut impl FnMut(&Record)) {
        let mut failure_info = self.failure_info.iter();
        for kept in &self.recent {
            let mem_info = if kept.has_mem_info {
                failure_info.next().copied()
            } else {
                None
            };
            emit(&kept.record(mem_info));
        }
    }

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
        self.emit_window(&mut emit);
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
        EventKind::TensorAlloc => (4, event.addr, true),
        EventKind::TensorFree => (4, event.addr, false),
        EventKind::AllocFailed
        | EventKind::Trim
        | EventKind::TensorFreeRequested
        | EventKind::TensorOom
        | EventKind::TensorSegment
        | EventKind::TensorSegmentMap
        | EventKind::TensorSegmentUnmap
        | EventKind::GraphAlloc
        | EventKind::GraphFree
        | EventKind::GraphPool => return None,
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

    fn dumped(window: &Window) -> Vec<Record> {
        let mut records = Vec::new();
        window.dump("test", 7, |record| records.push(record.clone()));
        records
    }

    #[test]
    fn dump_replays_to_the_current_live_set() {
        let mut window = Window::new(3);
        window.push(&event(EventKind::Alloc, 0x1000, 1)); // live, falls out
        window.push(&event(EventKind::Alloc, 0x2000, 2)); // freed inside the window
        window.push(&event(EventKind::Alloc, 0x3000, 3)); // falls out, freed later
        window.push(&event(EventKind::Free, 0x2000, 4));
        window.push(&event(EventKind::Free, 0x3000, 5));
        window.push(&event(EventKind::Alloc, 0x4000, 6));
        let records = dumped(&window);
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

    /// Every field of every record comes back as it went in, samples and a failed
    /// allocation's device memory included, also once records fell out of the window.
    #[test]
    fn the_window_gives_back_exactly_what_it_kept() {
        let full = |t_ns: u64, kind: EventKind, mem_info: Option<(u64, u64)>| {
            Record::Event(Event {
                kind,
                api: 7,
                t_ns,
                thread: 4242,
                device: 1,
                stream: 0xabc,
                addr: 0x7000_0000_0000 + t_ns * 0x1000,
                size: 1 << 33,
                handle: 0x99,
                result: if mem_info.is_some() { 2 } else { 0 },
                stack: 17,
                mem_info,
            })
        };
        let sample = |t_ns: u64| {
            Record::MemInfo(MemInfo {
                t_ns,
                device: -1,
                free: u64::MAX - t_ns,
                total: u64::MAX,
            })
        };
        let pushed = vec![
            full(1, EventKind::AllocFailed, Some((10, 20))), // falls out
            sample(2),
            full(3, EventKind::AllocFailed, Some((30, 40))),
            full(4, EventKind::Trim, None),
            sample(5),
            full(6, EventKind::AllocFailed, Some((60, 80))),
            full(7, EventKind::Create, None),
        ];
        let mut window = Window::new(6);
        for record in &pushed {
            window.push(record);
        }
        let records = dumped(&window);
        let Record::DumpBegin(begin) = &records[0] else {
            panic!("no DumpBegin")
        };
        assert_eq!((begin.events_discarded, begin.live_count), (1, 0));
        assert_eq!(records[1..], pushed[1..]);
    }
}
