//! The event encoder against the one it replaced (format/src/record.rs at f66bfd1, byte by byte
//! into a `Vec`): the same bytes and the same state after every event, over pseudo-random
//! events whose fields reach their extremes (values of ten LEB128 bytes, negative deltas,
//! `u64::MAX`), at full and coarse time resolutions, with and without free pairs.

use super::*;

/// Unsigned LEB128, a byte at a time (as the old encoder wrote it).
fn put_u64_plainly(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_i64_plainly(out: &mut Vec<u8>, value: i64) {
    put_u64_plainly(out, ((value << 1) ^ (value >> 63)) as u64);
}

/// The old `DeltaState::encode_event`.
fn encode_event_plainly(state: &mut DeltaState, event: &Event, out: &mut Vec<u8>) {
    let t_ns = state.time(event.t_ns);
    let filled = usize::from(state.recent_filled);
    if let Some(slot) = state.recent[..filled]
        .iter()
        .position(|recent| same_but_time(recent, event))
    {
        if t_ns == state.t_ns {
            out.push(TAG_REPEAT_SAME_TIME + slot as u8);
        } else {
            out.push(TAG_REPEAT + slot as u8);
            put_i64_plainly(out, state.time_delta_units(t_ns));
        }
        state.follow(event);
        state.t_ns = t_ns;
        return;
    }
    state.remember(event);
    let mut flags = 0u8;
    if event.thread != state.thread || state.thread == NO_THREAD {
        flags |= F_THREAD;
    }
    if event.device != state.device {
        flags |= F_DEVICE;
    }
    if event.stream != 0 {
        flags |= F_STREAM;
    }
    if event.handle != 0 {
        flags |= F_HANDLE;
    }
    if event.result != 0 {
        flags |= F_RESULT;
    }
    if event.mem_info.is_some() {
        flags |= F_MEM_INFO;
    }
    if event.stack != 0 {
        flags |= F_STACK;
    }
    if event.addr != 0 {
        flags |= F_ADDR;
    }
    out.push(TAG_EVENT + event.kind as u8);
    out.push(flags);
    put_u64_plainly(out, u64::from(event.api));
    put_i64_plainly(out, state.time_delta_units(t_ns));
    if flags & F_THREAD != 0 {
        put_u64_plainly(out, u64::from(event.thread));
    }
    if flags & F_DEVICE != 0 {
        put_i64_plainly(out, i64::from(event.device));
    }
    if flags & F_ADDR != 0 {
        put_i64_plainly(out, event.addr.wrapping_sub(state.addr) as i64);
        state.addr = event.addr;
    }
    put_i64_plainly(out, event.size.wrapping_sub(state.size) as i64);
    state.size = event.size;
    if flags & F_STREAM != 0 {
        put_u64_plainly(out, event.stream);
    }
    if flags & F_HANDLE != 0 {
        put_u64_plainly(out, event.handle);
    }
    if flags & F_RESULT != 0 {
        put_u64_plainly(out, u64::from(event.result));
    }
    if let Some((free, total)) = event.mem_info {
        put_u64_plainly(out, free);
        put_u64_plainly(out, total);
    }
    if flags & F_STACK != 0 {
        put_u64_plainly(out, u64::from(event.stack));
    }
    state.t_ns = t_ns;
    state.thread = event.thread;
    state.device = event.device;
}

/// The old `DeltaState::fold_free`.
fn fold_free_plainly(
    state: &mut DeltaState,
    event: &Event,
    first_len: usize,
    out: &mut Vec<u8>,
) -> bool {
    let last = (usize::from(state.recent_next) + RECENT - 1) % RECENT;
    let first = &state.recent[last];
    let t_ns = state.time(event.t_ns);
    let Some(at) = out.len().checked_sub(first_len) else {
        return false;
    };
    if event.kind != EventKind::TensorFree
        || first.kind != EventKind::TensorFreeRequested
        || event.stack != 0
        || t_ns < state.t_ns
        || out[at] != TAG_FREE_REQUESTED
        || !same_block(first, event)
    {
        return false;
    }
    out[at] = TAG_FREE_PAIR;
    put_u64_plainly(out, (t_ns - state.t_ns) / state.time_unit());
    state.remember(event);
    state.t_ns = t_ns;
    true
}

/// One encoder's side: its state, its payload and the length of a free request it may fold
/// the next event into (as `ChunkBuilder::push_event` keeps it).
struct Side {
    state: DeltaState,
    out: Vec<u8>,
    open_free: usize,
}

impl Side {
    fn push(&mut self, event: &Event, free_pairs: bool, plainly: bool) {
        let open_free = std::mem::take(&mut self.open_free);
        let folded = open_free != 0
            && if plainly {
                fold_free_plainly(&mut self.state, event, open_free, &mut self.out)
            } else {
                self.state.fold_free(event, open_free, &mut self.out)
            };
        if folded {
            return;
        }
        let start = self.out.len();
        if plainly {
            encode_event_plainly(&mut self.state, event, &mut self.out);
        } else {
            self.state.encode_event(event, &mut self.out);
        }
        if free_pairs && self.out.get(start) == Some(&TAG_FREE_REQUESTED) {
            self.open_free = self.out.len() - start;
        }
    }
}

/// A xorshift generator: the same events on every run.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize]
    }

    /// A value of any length: one of the extremes, or a random one of random bit length.
    fn wide(&mut self) -> u64 {
        match self.next() % 4 {
            0 => self.pick(&[
                0,
                1,
                0x7f,
                0x80,
                0x3fff,
                0x4000,
                1 << 56,
                u64::MAX,
                u64::MAX - 1,
            ]),
            1 => self.next() >> (self.next() % 64),
            _ => self.next(),
        }
    }
}

/// Events drawn mostly from small pools (so that repeats, pairs and same-time repeats come),
/// now and then with a field at an extreme.
fn events(seed: u64, count: usize) -> Vec<Event> {
    let mut draw = Draw(seed);
    let addrs: Vec<u64> = (0..6).map(|_| draw.wide()).collect();
    let mut t_ns = 1_000_000u64;
    let mut events = Vec::with_capacity(count);
    for _ in 0..count {
        let rare = draw.next().is_multiple_of(8);
        t_ns = match draw.next() % 16 {
            0 => t_ns.wrapping_sub(draw.next() % 5_000_000),
            1 => draw.wide(),
            2..=5 => t_ns,
            _ => t_ns.wrapping_add(draw.next() % 40_000),
        };
        let kind = draw.pick(&[
            EventKind::TensorAlloc,
            EventKind::TensorFreeRequested,
            EventKind::TensorFreeRequested,
            EventKind::TensorFree,
            EventKind::TensorFree,
            EventKind::Alloc,
            EventKind::GraphPool,
        ]);
        let mut event = Event {
            kind,
            api: draw.pick(&[0, 1, 3, 127, 128, 300, u16::MAX]),
            t_ns,
            thread: draw.pick(&[4242, 4242, 4243, 0, NO_THREAD, u32::MAX - 1]),
            device: draw.pick(&[0, 0, 1, HOST_DEVICE, UNKNOWN_DEVICE, i32::MIN, i32::MAX]),
            stream: draw.pick(&[0, 0, 0, 0x5555_0000]),
            addr: draw.pick(&addrs),
            size: draw.pick(&[512, 512, 1 << 20, 3 << 30, 0]),
            handle: 0,
            result: 0,
            stack: draw.pick(&[0, 0, 1, 7, 300, u32::MAX]),
            mem_info: None,
        };
        if rare {
            match draw.next() % 7 {
                0 => event.stream = draw.wide(),
                1 => event.handle = draw.wide(),
                2 => event.result = draw.wide() as u32,
                3 => event.mem_info = Some((draw.wide(), draw.wide())),
                4 => event.addr = draw.wide(),
                5 => event.size = draw.wide(),
                _ => event.addr = 0,
            }
        }
        // Often one of the last few events again (a loop's repeat), at the new time.
        if events.len() >= 6 && draw.next().is_multiple_of(3) {
            let back = (draw.next() % 6) as usize + 1;
            event = Event {
                t_ns,
                ..events[events.len() - back]
            };
        }
        // A free request is most often followed by the same block's free (a pair).
        let pair = event.kind == EventKind::TensorFreeRequested && !draw.next().is_multiple_of(4);
        events.push(event);
        if pair {
            events.push(Event {
                kind: EventKind::TensorFree,
                t_ns: t_ns.wrapping_add(draw.pick(&[0, 0, 900, 100_000, u64::MAX / 2])),
                stack: 0,
                ..event
            });
        }
    }
    events
}

#[test]
fn events_encode_as_the_byte_by_byte_encoder_wrote_them() {
    for resolution in [0, 1, 1_000, 10_000_000] {
        for free_pairs in [true, false] {
            for seed in 1..=40u64 {
                let state = DeltaState::with_time_resolution(resolution).with_first_thread(4242);
                let mut new = Side {
                    state,
                    out: Vec::new(),
                    open_free: 0,
                };
                let mut old = Side {
                    state,
                    out: Vec::new(),
                    open_free: 0,
                };
                for (index, event) in events(seed, 400).iter().enumerate() {
                    // Now and then a payload with no room to spare (the stack buffer's way)
                    // or a new chunk's state.
                    if index.is_multiple_of(97) {
                        new.out.shrink_to_fit();
                    }
                    if index.is_multiple_of(151) {
                        new.state = new.state.restarted();
                        old.state = old.state.restarted();
                        new.open_free = 0;
                        old.open_free = 0;
                    }
                    new.push(event, free_pairs, false);
                    old.push(event, free_pairs, true);
                    assert_eq!(
                        new.out, old.out,
                        "resolution {resolution}, free pairs {free_pairs}, seed {seed}, event \
                         {index}: {event:?}"
                    );
                    assert_eq!(format!("{:?}", new.state), format!("{:?}", old.state));
                    assert_eq!(new.open_free, old.open_free);
                }
            }
        }
    }
}

#[test]
fn the_longest_event_fits_its_room_and_reads_back() {
    let event = Event {
        kind: EventKind::TensorOom,
        api: u16::MAX,
        // Deltas of `i64::MIN` from a start state's zeros: zigzag `u64::MAX`, ten bytes.
        t_ns: 1 << 63,
        thread: u32::MAX - 1,
        device: i32::MIN,
        stream: u64::MAX,
        addr: 1 << 63,
        size: 1 << 63,
        handle: u64::MAX,
        result: u32::MAX,
        stack: u32::MAX,
        mem_info: Some((u64::MAX, u64::MAX)),
    };
    let mut state = DeltaState::default().with_first_thread(1);
    let mut out = Vec::new();
    state.encode_event(&event, &mut out);
    let mut plain = Vec::new();
    encode_event_plainly(
        &mut DeltaState::default().with_first_thread(1),
        &event,
        &mut plain,
    );
    assert_eq!(out, plain);
    // Tag and flags, api 3, time 10, thread 5, device 5, address 10, size 10, stream 10,
    // handle 10, result 5, memory 20, stack 5.
    assert_eq!(
        out.len(),
        2 + 3 + 10 + 5 + 5 + 10 + 10 + 10 + 10 + 5 + 20 + 5
    );
    assert!(out.len() <= MAX_EVENT_BYTES);
    let mut decoder = DeltaState::default().with_first_thread(1);
    let mut cursor = Cursor::new(&out);
    assert_eq!(decoder.decode(&mut cursor), Ok(Record::Event(event)));
    assert!(cursor.is_empty());
}
