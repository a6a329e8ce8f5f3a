use super::*;
use crate::record::MAX_RUN_RECORDS;

fn header() -> Header {
    Header {
        version: FORMAT_VERSION,
        pid: 4242,
        ppid: 1,
        argv: vec!["python".into(), "train.py".into()],
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 123_456_789,
        hostname: "node7".into(),
        env: vec![
            ("CUDA_VISIBLE_DEVICES".into(), Some("0,1".into())),
            ("PYTORCH_CUDA_ALLOC_CONF".into(), None),
        ],
        apis: vec!["cuMemAlloc_v2".into(), "cuMemFree_v2".into()],
        stack_mode: "native".into(),
        mode: "stream".into(),
        recorder: "0.1.0".into(),
        time_resolution_ns: 1,
    }
}

fn sample_records() -> Vec<Record> {
    let mut records = vec![
        Record::Module(ModuleDef {
            path: "/usr/lib/libfoo.so".into(),
            load_bias: 0x7f00_0000_0000,
            start: 0x7f00_0000_1000,
            end: 0x7f00_0002_0000,
            build_id: vec![0xde, 0xad, 0xbe, 0xef],
        }),
        Record::Stack(StackDef {
            id: 1,
            frames: vec![
                Frame::Native(0x7f00_0000_1234),
                Frame::Native(0x5555_0000_0010),
            ],
        }),
        Record::ThreadName(ThreadName {
            thread: 77,
            name: "pt_autograd_0".into(),
        }),
        Record::Code(CodeDef {
            id: 4,
            python: 0x030b,
            filename: "/srv/model.py".into(),
            qualname: "Net.forward.<locals>.<lambda>".into(),
            first_line: 42,
            line_table: vec![0x80, 0x00, 0xd8, 0x04, 0xff],
        }),
        Record::Stack(StackDef {
            id: 2,
            frames: vec![
                Frame::Native(0x7f00_0000_1234),
                Frame::Python {
                    code: 4,
                    offset: 17,
                    entry: false,
                },
                Frame::Native(0x7f00_0000_1000),
                Frame::Python {
                    code: 4,
                    offset: 100_000,
                    entry: true,
                },
            ],
        }),
        Record::MemInfo(MemInfo {
            t_ns: 5,
            device: 1,
            free: 1 << 30,
            total: 80 << 30,
        }),
        Record::Note(Note {
            t_ns: 6,
            text: "fork: child 99".into(),
        }),
        Record::Dropped(Dropped { t_ns: 7, count: 3 }),
        Record::Mark(Mark {
            t_ns: 9,
            thread: 4242,
            text: "epoch 3".into(),
        }),
        Record::Exit(Exit { t_ns: 10 }),
        Record::DumpBegin(DumpBegin {
            t_ns: 8,
            reason: "SIGUSR2".into(),
            events_discarded: 10,
            live_count: 2,
            window_count: 5,
        }),
    ];
    for i in 0..1000u64 {
        records.push(Record::Event(Event {
            kind: EventKind::ALL[(i % 10) as usize],
            api: (i % 2) as u16,
            t_ns: 1_000 + i * 37,
            thread: 77 + (i % 3) as u32,
            device: (i % 4) as i32 - 2,
            stream: if i % 5 == 0 { 0x55_0000 + i } else { 0 },
            addr: if i % 7 == 0 {
                0
            } else {
                0x7000_0000_0000 + (i * 4096) % 100_000
            },
            size: [0, 1 << 20, 1 << 20, 4096, u64::MAX][(i % 5) as usize],
            handle: if i % 3 == 0 { i } else { 0 },
            result: if i % 11 == 0 { 2 } else { 0 },
            stack: (i % 4) as u32,
            mem_info: if i % 13 == 0 { Some((i, i * 2)) } else { None },
        }));
    }
    records
}

fn encode_log(records: &[Record], per_chunk: usize) -> Vec<u8> {
    let mut out = header().encode();
    let mut chunk = ChunkBuilder::new();
    for record in records {
        chunk.push(record);
        if chunk.records() == per_chunk {
            chunk.finish_into(&mut out);
        }
    }
    chunk.finish_into(&mut out);
    out
}

fn read_all(bytes: &[u8]) -> (Vec<Record>, Vec<Damage>) {
    let reader = LogReader::new(bytes).expect("header");
    let mut records = Vec::new();
    let mut damage = Vec::new();
    for item in reader {
        match item {
            Item::Record(record) => records.push(record),
            Item::Damage(d) => damage.push(d),
        }
    }
    (records, damage)
}

#[test]
fn round_trip_preserves_every_field() {
    let records = sample_records();
    let bytes = encode_log(&records, 100);
    let reader = LogReader::new(&bytes[..]).unwrap();
    assert_eq!(reader.header(), &header());
    let (decoded, damage) = read_all(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded, records);
}

#[test]
fn compressed_chunks_round_trip_every_field() {
    let records = sample_records();
    let mut bytes = header().encode();
    let mut chunk = ChunkBuilder::new();
    for (i, record) in records.iter().enumerate() {
        chunk.push(record);
        if i % 100 == 99 {
            chunk.finish_compressed_into(&mut bytes);
        }
    }
    chunk.finish_compressed_into(&mut bytes);
    // Walk the chunks: most are compressed (the records repeat enough), none is damaged.
    let mut at = header().encode().len();
    let (mut compressed, mut chunks) = (0, 0);
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        compressed += usize::from(bytes[at..at + 4] == crate::COMPRESSED_CHUNK_MAGIC);
        chunks += 1;
        at += CHUNK_HEADER_LEN + len;
    }
    assert!(
        compressed * 2 > chunks,
        "{compressed} of {chunks} chunks compressed"
    );
    let (decoded, damage) = read_all(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded, records);
}

/// The literals section type of a compressed key chunk's first zstd block (0 raw, 1 RLE,
/// 2 Huffman-coded, 3 Huffman with the previous table), or `None` when the chunk is plain or
/// its first block is not a compressed one.
fn first_literals_type(chunk: &[u8]) -> Option<u8> {
    if chunk[..4] != crate::COMPRESSED_CHUNK_MAGIC {
        return None;
    }
    let frame = &chunk[CHUNK_HEADER_LEN..];
    assert_eq!(frame[..4], [0x28, 0xb5, 0x2f, 0xfd], "a zstd frame");
    let descriptor = frame[4];
    let single_segment = descriptor & 0x20 != 0;
    let dictionary_id_len = [0, 1, 2, 4][usize::from(descriptor & 3)];
    let content_size_len = match descriptor >> 6 {
        0 => usize::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let block = 5 + usize::from(!single_segment) + dictionary_id_len + content_size_len;
    let block_type = (frame[block] >> 1) & 3;
    (block_type == 2).then_some(frame[block + 3] & 3)
}

#[test]
fn small_chunks_keep_their_literals_raw_and_large_ones_huffman_code_them() {
    let records = sample_records();
    let mut bytes = header().encode();
    let mut chunk = ChunkBuilder::new();
    // A chunk of 100 records (a few KiB), then one of at least 20 KiB.
    for record in &records[..100] {
        chunk.push(record);
    }
    assert!(chunk.payload_len() < 16 << 10, "{}", chunk.payload_len());
    chunk.finish_compressed_into(&mut bytes);
    let small_end = bytes.len();
    let mut pushed = records[..100].to_vec();
    for record in records.iter().cycle().skip(100) {
        chunk.push(record);
        pushed.push(record.clone());
        if chunk.payload_len() >= 20 << 10 {
            break;
        }
    }
    chunk.finish_compressed_into(&mut bytes);
    let start = header().encode().len();
    assert_eq!(first_literals_type(&bytes[start..small_end]), Some(0));
    assert_eq!(first_literals_type(&bytes[small_end..]), Some(2));
    let (decoded, damage) = read_all(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded, pushed);
}

#[test]
fn repeated_events_cost_their_time_only() {
    // Two threads, each allocating and freeing one buffer in a loop: four event shapes, each
    // repeated with a new time (tag and time delta: 3 bytes).
    let mut records = Vec::new();
    let mut t = 0;
    for i in 0..1_000u64 {
        for thread in [100, 200] {
            for (kind, size, stack) in [(EventKind::Alloc, 4096, 3), (EventKind::Free, 0, 0)] {
                t += 150 + i % 7;
                records.push(Record::Event(Event {
                    kind,
                    api: 1,
                    t_ns: t,
                    thread,
                    addr: 0x7000 + u64::from(thread),
                    size,
                    stack,
                    ..Event::default()
                }));
            }
        }
    }
    let mut payload = Vec::new();
    let mut delta = DeltaState::default();
    for record in &records {
        delta.encode(record, &mut payload);
    }
    let full: usize = records[..4]
        .iter()
        .map(|record| {
            let mut one = Vec::new();
            DeltaState::default().encode(record, &mut one);
            one.len()
        })
        .sum();
    assert!(
        payload.len() <= full + 16 + 3 * (records.len() - 4),
        "{} bytes for {} events",
        payload.len(),
        records.len()
    );
    let bytes = encode_log(&records, 4096);
    let (decoded, damage) = read_all(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded, records);
}

#[test]
fn a_repeat_before_any_event_is_a_bad_record() {
    // A repeat of slot 0 (tag 0x0a) with a zero time delta, as the chunk's first record.
    let payload = [0x0a, 0];
    let mut bytes = header().encode();
    bytes.extend_from_slice(&crate::CHUNK_MAGIC);
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    bytes.extend_from_slice(&payload);
    let (decoded, damage) = read_all(&bytes);
    assert!(decoded.is_empty());
    assert_eq!(
        damage.iter().map(|d| &d.kind).collect::<Vec<_>>(),
        [&crate::DamageKind::BadRecord {
            reason: "repeat of an event not in the chunk"
        }]
    );
}

#[test]
fn typical_events_are_compact() {
    // An alloc/free pair per call site as a caching allocator or a tensor program produces.
    let mut records = Vec::new();
    let mut t = 0;
    for i in 0..10_000u64 {
        let addr = 0x7f3a_0000_0000 + (i % 64) * (2 << 20);
        let size = [512u64, 4096, 1 << 20, 3 << 20][(i % 4) as usize];
        t += 900 + (i % 17) * 13;
        records.push(Record::Event(Event {
            kind: EventKind::Alloc,
            api: 3,
            t_ns: t,
            thread: 31337,
            device: 0,
            addr,
            size,
            stack: 1 + (i % 40) as u32,
            ..Event::default()
        }));
        t += 400;
        records.push(Record::Event(Event {
            kind: EventKind::Free,
            api: 4,
            t_ns: t,
            thread: 31337,
            device: 0,
            addr,
            stack: 41 + (i % 40) as u32,
            ..Event::default()
        }));
    }
    let header_len = header().encode().len();
    let bytes = encode_log(&records, 4096);
    let per_event = (bytes.len() - header_len) as f64 / records.len() as f64;
    assert!(per_event <= 24.0, "{per_event} bytes per event");
    assert!(per_event >= 4.0, "suspiciously small: {per_event}");
}

#[test]
fn torn_tail_keeps_everything_before_it() {
    let records = sample_records();
    let bytes = encode_log(&records, 100);
    let header_len = header().encode().len();
    // Cut at every byte of the last two chunks: all complete chunks survive.
    let (full, _) = read_all(&bytes);
    let mut boundary_free_cuts = 0;
    for cut in (bytes.len() - 2000)..bytes.len() {
        let (decoded, damage) = read_all(&bytes[..cut]);
        // A cut exactly between two chunks leaves a clean, shorter log.
        if !damage.is_empty() {
            assert_eq!(damage.len(), 1, "cut {cut}: {damage:?}");
            assert!(
                matches!(damage[0].kind, DamageKind::TornTail { .. }),
                "cut {cut}: {damage:?}"
            );
            assert!(damage[0].offset as usize >= header_len);
            boundary_free_cuts += 1;
        }
        assert_eq!(decoded[..], full[..decoded.len()], "cut {cut}");
        // Whole chunks of 100 records survive, nothing of the torn one.
        assert_eq!(decoded.len() % 100, 0, "cut {cut}");
        assert!(decoded.len() >= 800, "cut {cut}: only {}", decoded.len());
    }
    assert!(boundary_free_cuts >= 1990);
}

#[test]
fn damaged_chunk_is_skipped_and_reading_goes_on() {
    let records = sample_records();
    let bytes = encode_log(&records, 100);
    let header_len = header().encode().len();
    // Flip a byte inside the second chunk's payload.
    let (_, first_len) = chunk_bounds(&bytes, header_len);
    let second_start = header_len + first_len;
    let mut damaged = bytes.clone();
    damaged[second_start + CHUNK_HEADER_LEN + 5] ^= 0xff;
    let (decoded, damage) = read_all(&damaged);
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert_eq!(damage[0].offset as usize, second_start);
    assert!(matches!(damage[0].kind, DamageKind::BadChecksum { .. }));
    assert_eq!(decoded.len(), records.len() - 100);
    assert_eq!(decoded[..100], records[..100]);
    assert_eq!(decoded[100..], records[200..]);

    // Garbage between chunks: skipped up to the next chunk marker.
    let mut with_garbage = bytes[..second_start].to_vec();
    with_garbage.extend_from_slice(b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
    with_garbage.extend_from_slice(&bytes[second_start..]);
    let (decoded, damage) = read_all(&with_garbage);
    assert_eq!(decoded, records);
    assert_eq!(damage.len(), 1);
    assert_eq!(damage[0].kind, DamageKind::Garbage { bytes: 46 });
}

fn chunk_bounds(bytes: &[u8], at: usize) -> (usize, usize) {
    let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
    (at, CHUNK_HEADER_LEN + len)
}

#[test]
fn not_a_log_and_newer_versions_are_refused() {
    assert!(matches!(
        LogReader::new(&b"hello world, not a log at all"[..]),
        Err(OpenError::NotALog)
    ));
    assert!(matches!(LogReader::new(&b""[..]), Err(OpenError::NotALog)));
    let mut newer = header().encode();
    newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert!(matches!(
        LogReader::new(&newer[..]),
        Err(OpenError::NewerVersion { found, .. }) if found == FORMAT_VERSION + 1
    ));
    let good = header().encode();
    assert!(matches!(
        LogReader::new(&good[..good.len() - 1]),
        Err(OpenError::BadHeader(_))
    ));
    let mut bad_crc = good.clone();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 1;
    assert!(matches!(
        LogReader::new(&bad_crc[..]),
        Err(OpenError::BadHeader(_))
    ));
}

#[test]
fn random_corruption_never_panics() {
    let bytes = encode_log(&sample_records(), 50);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..300 {
        let mut damaged = bytes.clone();
        for _ in 0..4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let pos = (state % damaged.len() as u64) as usize;
            damaged[pos] = (state >> 32) as u8;
        }
        if let Ok(reader) = LogReader::new(&damaged[..]) {
            for _ in reader {}
        }
    }
}

#[test]
fn python_frames_and_code_defs_encode_exactly() {
    let mut state = DeltaState::default();
    let mut out = Vec::new();
    state.encode(
        &Record::Stack(StackDef {
            id: 3,
            frames: vec![
                Frame::Native(0x10),
                Frame::Python {
                    code: 5,
                    offset: 6,
                    entry: false,
                },
                Frame::Python {
                    code: 7,
                    offset: 8,
                    entry: true,
                },
            ],
        }),
        &mut out,
    );
    // tag, id, count, native (type 0, zigzag delta 0x10), python (1, code, offset), entry (2, ...)
    assert_eq!(out, [0x03, 3, 3, 0, 0x20, 1, 5, 6, 2, 7, 8]);
    out.clear();
    let code = CodeDef {
        id: 9,
        python: 0x030c,
        filename: "a.py".into(),
        qualname: "f".into(),
        first_line: 3,
        line_table: vec![0xaa],
    };
    state.encode(&Record::Code(code.clone()), &mut out);
    assert_eq!(
        out,
        [
            0x08, 9, 0x8c, 0x06, 4, b'a', b'.', b'p', b'y', 1, b'f', 3, 1, 0xaa
        ]
    );
    let mut cursor = Cursor::new(&out);
    assert_eq!(state.decode(&mut cursor), Ok(Record::Code(code)));
}

#[test]
fn unknown_frame_type_is_an_error() {
    let bytes = [0x03, 1, 1, 3, 0];
    let mut cursor = Cursor::new(&bytes);
    assert!(DeltaState::default().decode(&mut cursor).is_err());
}

#[test]
fn damaged_chunk_length_loses_only_that_chunk() {
    let records = sample_records();
    let bytes = encode_log(&records, 100);
    let header_len = header().encode().len();
    let (_, first_len) = chunk_bounds(&bytes, header_len);
    let second_start = header_len + first_len;
    let (_, second_len) = chunk_bounds(&bytes, second_start);
    let length_field = second_start + 4..second_start + 8;
    let original = u32::from_le_bytes(bytes[length_field.clone()].try_into().unwrap());
    // A length too large by 4 KiB (checksum fails), and one pointing past the end of the file
    // (looks like a torn tail): both lose the second chunk only.
    for wrong in [original + 4096, (bytes.len() * 2) as u32] {
        let mut damaged = bytes.clone();
        damaged[length_field.clone()].copy_from_slice(&wrong.to_le_bytes());
        let (decoded, damage) = read_all(&damaged);
        assert_eq!(
            decoded.len(),
            records.len() - 100,
            "length {wrong}: {damage:?}"
        );
        assert_eq!(decoded[..100], records[..100]);
        assert_eq!(decoded[100..], records[200..]);
        assert_eq!(damage.len(), 1, "length {wrong}: {damage:?}");
        assert_eq!(damage[0].offset as usize, second_start);
        let skipped = match damage[0].kind {
            DamageKind::BadChecksum { len } | DamageKind::Garbage { bytes: len } => len,
            ref other => panic!("length {wrong}: {other:?}"),
        };
        assert_eq!(skipped as usize, second_len, "length {wrong}");
    }
}

/// `record` with every time rounded down to a multiple of `ns`.
fn rounded(record: &Record, ns: u64) -> Record {
    retimed(record, |t| t - t % ns)
}

/// `record` with every time `t` replaced by `round(t)`.
fn retimed(record: &Record, round: impl Fn(u64) -> u64) -> Record {
    let mut record = record.clone();
    match &mut record {
        Record::Event(Event { t_ns, .. })
        | Record::MemInfo(MemInfo { t_ns, .. })
        | Record::Dropped(Dropped { t_ns, .. })
        | Record::Note(Note { t_ns, .. })
        | Record::Mark(Mark { t_ns, .. })
        | Record::DumpBegin(DumpBegin { t_ns, .. })
        | Record::Exit(Exit { t_ns }) => *t_ns = round(*t_ns),
        Record::ThreadName(_) | Record::Stack(_) | Record::Module(_) | Record::Code(_) => {}
    }
    record
}

#[test]
fn a_time_resolution_rounds_every_time_down_and_keeps_the_order() {
    let records = sample_records();
    for ns in [1_000, 10_000_000] {
        let mut bytes = Header {
            time_resolution_ns: ns,
            ..header()
        }
        .encode();
        let mut chunk = ChunkBuilder::new().with_time_resolution(ns);
        for (i, record) in records.iter().enumerate() {
            chunk.push(record);
            // Plain and compressed chunks, so that the resolution outlives a chunk's end.
            match i % 100 {
                49 => chunk.finish_into(&mut bytes),
                99 => chunk.finish_compressed_into(&mut bytes),
                _ => {}
            }
        }
        chunk.finish_compressed_into(&mut bytes);
        let reader = LogReader::new(&bytes[..]).unwrap();
        assert_eq!(reader.header().time_resolution_ns, ns);
        let (decoded, damage) = read_all(&bytes);
        assert!(damage.is_empty(), "{damage:?}");
        let expected: Vec<Record> = records.iter().map(|r| rounded(r, ns)).collect();
        assert_eq!(decoded, expected, "resolution {ns} ns");
        // The sample has times that are no multiple of either resolution.
        assert_ne!(decoded, records);
    }
}

#[test]
fn version_3_logs_at_a_coarse_resolution_read_their_times_as_nanoseconds() {
    // A version 3 recorder wrote times rounded to the resolution but in nanoseconds; version 4
    // writes units of the resolution. Each log reads back the same times.
    // The sample's times (a few µs), made whole and varied multiples of 10 ms.
    let records: Vec<Record> = sample_records()
        .iter()
        .map(|record| retimed(record, |t| t * 10_000_000))
        .collect();
    for (version, chunk_resolution) in [(3, 1), (4, 10_000_000), (FORMAT_VERSION, 10_000_000)] {
        let mut bytes = Header {
            time_resolution_ns: 10_000_000,
            ..header()
        }
        .encode_as(version);
        let mut state = DeltaState::with_time_resolution(chunk_resolution);
        if version < 5 {
            state = state.with_absolute_modules();
        } else {
            state = state.with_first_thread(header().pid);
        }
        let mut payload = Vec::new();
        for record in &records {
            state.encode(record, &mut payload);
        }
        // A plain chunk, then the same records compressed as that version lays them out.
        put_chunk(&mut bytes, CHUNK_MAGIC, &[&payload]);
        let mut frame = Vec::with_capacity(zstd_safe::compress_bound(payload.len()));
        zstd_safe::compress(&mut frame, &payload, 1).unwrap();
        let length = (payload.len() as u32).to_le_bytes();
        if version == 3 {
            put_chunk(&mut bytes, COMPRESSED_CHUNK_MAGIC, &[&length, &frame]);
        } else {
            put_chunk(&mut bytes, COMPRESSED_CHUNK_MAGIC, &[&frame]);
        }
        let (decoded, damage) = read_all(&bytes);
        assert!(damage.is_empty(), "{damage:?}");
        let twice: Vec<Record> = records.iter().chain(&records).cloned().collect();
        assert_eq!(decoded, twice, "version {version}");
    }
}

#[test]
fn repeated_events_at_a_coarse_resolution_cost_one_byte() {
    // One buffer allocated and freed every 150 ns: at 10 ms, every time delta after the first
    // two events is 0, so a repeat is its tag alone; the one event that crosses into the next
    // 10 ms is a repeat with its time delta.
    let events: Vec<Record> = (0..10_000u64)
        .map(|i| {
            Record::Event(Event {
                kind: if i % 2 == 0 {
                    EventKind::Alloc
                } else {
                    EventKind::Free
                },
                api: 1,
                t_ns: 1_000 + 150 * i + if i >= 6_000 { 10_000_000 } else { 0 },
                thread: 7,
                addr: 0x7000,
                size: if i % 2 == 0 { 4096 } else { 0 },
                ..Event::default()
            })
        })
        .collect();
    let mut payload = Vec::new();
    let mut delta = DeltaState::with_time_resolution(10_000_000);
    for record in &events[..2] {
        delta.encode(record, &mut payload);
    }
    let first_two = payload.len();
    for record in &events[2..] {
        delta.encode(record, &mut payload);
    }
    // The step to the next 10 ms is one unit of the resolution: one byte.
    assert_eq!(payload.len() - first_two, events.len() - 2 + 1);
    let mut cursor = Cursor::new(&payload);
    let mut decoder = DeltaState::with_time_resolution(10_000_000);
    let mut decoded = Vec::new();
    while !cursor.is_empty() {
        decoded.push(decoder.decode(&mut cursor).unwrap());
    }
    let expected: Vec<Record> = events
        .iter()
        .map(|record| match record {
            Record::Event(event) => Record::Event(Event {
                t_ns: event.t_ns - event.t_ns % 10_000_000,
                ..*event
            }),
            other => other.clone(),
        })
        .collect();
    assert_eq!(decoded, expected);
}

#[test]
fn a_header_without_a_time_resolution_reads_as_full_resolution() {
    // A header as recorders before the field wrote it: the same body without its last varint.
    let with_field = header().encode_as(3);
    let body = &with_field[20..with_field.len() - 1];
    assert_eq!(
        with_field[with_field.len() - 1],
        1,
        "resolution 1 ns is one byte"
    );
    let mut old = MAGIC.to_vec();
    old.extend_from_slice(&3u32.to_le_bytes());
    old.extend_from_slice(&(body.len() as u32).to_le_bytes());
    old.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    old.extend_from_slice(body);
    let reader = LogReader::new(&old[..]).unwrap();
    assert_eq!(
        reader.header(),
        &Header {
            version: 3,
            ..header()
        }
    );
    assert_eq!(reader.header().time_resolution_ns, 1);
    // A resolution of 0 ns is refused, never divided by.
    let zero = Header {
        time_resolution_ns: 0,
        ..header()
    }
    .encode();
    assert!(matches!(
        LogReader::new(&zero[..]),
        Err(OpenError::BadHeader(_))
    ));
}

fn reread(bytes: &[u8]) -> Result<Header, OpenError> {
    LogReader::new(bytes).map(|reader| reader.header().clone())
}

#[test]
fn entry_point_names_are_runs_of_the_known_table_and_names_it_lacks() {
    let known: Vec<String> = KNOWN_APIS_V4.iter().map(|name| name.to_string()).collect();
    let lists: Vec<Vec<String>> = vec![
        Vec::new(),
        known.clone(),
        // A hook added in the middle, one removed, two swapped, a duplicate, a stray name.
        known[..10]
            .iter()
            .cloned()
            .chain(["cuMemNewThing".to_owned()])
            .chain(known[11..40].iter().cloned())
            .chain([known[41].clone(), known[40].clone(), known[5].clone()])
            .chain(known[42..].iter().cloned())
            .chain(["".to_owned(), "ünïcode".to_owned()])
            .collect(),
        vec!["cuMemAlloc_v2".into(), "cuMemFree_v2".into()],
    ];
    for apis in lists {
        let written = Header {
            apis: apis.clone(),
            ..header()
        };
        for version in [3, FORMAT_VERSION] {
            let bytes = written.encode_as(version);
            let read = reread(&bytes).unwrap();
            assert_eq!(read.apis, apis, "version {version}");
            assert_eq!(
                read,
                Header {
                    version,
                    ..written.clone()
                }
            );
        }
    }
    // The recorder's own list, in the table's order, costs 3 bytes (a run: its length and
    // start) and the count, not 1.5 KB.
    let literal = Header {
        apis: known.clone(),
        ..header()
    }
    .encode_as(3)
    .len();
    let compact = Header {
        apis: known.clone(),
        ..header()
    }
    .encode_as(4)
    .len();
    let names: usize = known.iter().map(|name| name.len() + 1).sum();
    assert_eq!(literal - compact, names - 2);
}

#[test]
fn the_known_entry_point_table_is_frozen() {
    // Version 4 logs name entry points by position in this table: any change to it misreads
    // them. A new table needs a new format version.
    let joined = KNOWN_APIS_V4.join("\n");
    assert_eq!(
        (KNOWN_APIS_V4.len(), crc32fast::hash(joined.as_bytes())),
        (81, 0xe98a_d303)
    );
}

#[test]
fn entry_point_runs_out_of_the_table_are_damage() {
    // Hand-built bodies: a run past the table's end, a run longer than the count, a start
    // so large that start + length overflows.
    for (count, entries) in [
        (2u64, vec![2u64, 80]),
        (2, vec![3, 0]),
        (2, vec![2, u64::MAX]),
    ] {
        let mut body = Vec::new();
        put_u64(&mut body, 1); // pid
        put_u64(&mut body, 1); // ppid
        put_u64(&mut body, 0); // argc
        put_u64(&mut body, 0); // start_unix_ns
        put_u64(&mut body, 0); // start_mono_ns
        put_bytes(&mut body, b"host");
        put_u64(&mut body, 0); // env
        put_u64(&mut body, count);
        for value in &entries {
            put_u64(&mut body, *value);
        }
        for text in [&b"native"[..], b"stream", b"0.1.0"] {
            put_bytes(&mut body, text);
        }
        let mut log = MAGIC.to_vec();
        log.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        log.extend_from_slice(&(body.len() as u32).to_le_bytes());
        log.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        log.extend_from_slice(&body);
        assert!(
            matches!(reread(&log), Err(OpenError::BadHeader(_))),
            "{entries:?}"
        );
    }
}

/// Alloc/free pairs of thread 4242 (the header's pid) at address 0x7000_0000_0000, two every
/// microsecond from `from_ns` on.
fn loop_pairs(pairs: u64, from_ns: u64) -> Vec<Record> {
    (0..2 * pairs)
        .map(|i| {
            Record::Event(Event {
                kind: if i % 2 == 0 {
                    EventKind::Alloc
                } else {
                    EventKind::Free
                },
                api: 31,
                t_ns: from_ns + 500 * i,
                thread: 4242,
                addr: 0x7000_0000_0000,
                size: if i % 2 == 0 { 4096 } else { 0 },
                stack: if i % 2 == 0 { 1 } else { 0 },
                ..Event::default()
            })
        })
        .collect()
}

/// `records` with every time rounded down to 10 ms, as a log at that resolution reads them.
fn at_10ms(records: &[Record]) -> Vec<Record> {
    records
        .iter()
        .map(|record| retimed(record, |t| t - t % 10_000_000))
        .collect()
}

#[test]
fn a_loop_at_a_coarse_resolution_is_a_run_record_per_time_step() {
    // 100,000 alloc/free pairs over 100 ms at 10 ms: ten time steps. The chunk holds the
    // first pair in full (14 + 7 bytes: tag, flags, api, time, address, size, stack; the
    // free's address delta and size delta; no thread: the chunk starts at the pid's), two
    // more same-time repeats and a run of the rest of the first 10 ms (1 + 3 bytes); then,
    // for each of the nine later steps, the alloc that crosses into it (a repeat and its
    // time delta: 2 bytes), the free and the next alloc (1 byte each), and a run of the rest
    // of the step (4 bytes). Each later step's free, alloc, free, ... repeat the first step's
    // cycle (alloc, free) from its second record: one run of the last cycle (format 6: its
    // tag, which says where in the cycle it starts, and its count less the last such run's:
    // 19,999, 3 bytes, then 0, 1 byte; no cycle written): 21 + 2 + 4 + (2 + 1 + 3) +
    // 8 * (2 + 1 + 1) = 65 bytes for 200,000 events.
    let records = loop_pairs(100_000, 0);
    let header = Header {
        time_resolution_ns: 10_000_000,
        ..header()
    };
    let mut bytes = header.encode();
    let mut chunk = ChunkBuilder::new()
        .with_time_resolution(10_000_000)
        .with_first_thread(header.pid);
    for record in &records {
        chunk.push(record);
    }
    // Counted as the records would be written without runs: one byte each after the first
    // pair (and the crossing allocs' time deltas).
    assert_eq!(chunk.payload_len(), 21 + 200_000 - 2 + 9);
    let header_len = bytes.len();
    chunk.finish_into(&mut bytes);
    assert_eq!(bytes.len() - header_len, CHUNK_HEADER_LEN + 65);
    let (decoded, damage) = read_all(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded, at_10ms(&records));
    // A chunk this small is stored compressed whenever that is shorter (the nine steps' bytes
    // are alike).
    let mut bytes = header.encode();
    for record in &records {
        chunk.push(record);
    }
    chunk.finish_compressed_into(&mut bytes);
    assert_eq!(bytes[header_len..header_len + 4], COMPRESSED_CHUNK_MAGIC);
    assert!(bytes.len() - header_len <= CHUNK_HEADER_LEN + 65);
    assert_eq!(read_all(&bytes).0, at_10ms(&records));
    // The same chunk without the first thread: the first event writes its thread (2 bytes).
    let mut chunk = ChunkBuilder::new().with_time_resolution(10_000_000);
    let mut bytes = header.encode();
    for record in &records {
        chunk.push(record);
    }
    chunk.finish_into(&mut bytes);
    assert_eq!(bytes.len() - header_len, CHUNK_HEADER_LEN + 67);
    assert_eq!(read_all(&bytes).0, at_10ms(&records));
}

#[test]
fn runs_of_any_cycle_read_back_exactly() {
    // Cycles of 1 to 9 same-time events (9 is past the longest run: written plainly), cut
    // short, broken by another event or a definition, at two resolutions, plain and
    // compressed, split over chunks of several sizes.
    let shapes: Vec<Event> = (0..4u64)
        .map(|i| Event {
            kind: if i % 2 == 0 {
                EventKind::Alloc
            } else {
                EventKind::Free
            },
            api: i as u16,
            thread: 4242 + (i / 2) as u32,
            addr: 0x7000 + 0x100 * i,
            size: 64 << i,
            ..Event::default()
        })
        .collect();
    let mut records = Vec::new();
    let mut t = 0u64;
    let mut seed = 12345u64;
    for round in 0..400u64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let period = (seed >> 33) as usize % 9 + 1;
        let count = (seed >> 40) as usize % 40;
        let cycle: Vec<usize> = (0..period)
            .map(|at| (at * 3 + round as usize) % 4)
            .collect();
        for at in 0..count {
            t += (seed >> 20) % 3 * 1_000;
            records.push(Record::Event(Event {
                t_ns: t,
                ..shapes[cycle[at % period]]
            }));
        }
        match round % 5 {
            0 => records.push(Record::Event(Event {
                t_ns: t,
                size: round,
                ..shapes[0]
            })),
            1 => records.push(Record::Mark(Mark {
                t_ns: t,
                thread: 1,
                text: "m".into(),
            })),
            2 => t += 10_000_000,
            _ => {}
        }
    }
    for resolution in [1, 10_000_000] {
        for per_chunk in [7, 100, 100_000] {
            for (compressed, continued) in
                [(false, false), (true, false), (false, true), (true, true)]
            {
                let header = Header {
                    time_resolution_ns: resolution,
                    ..header()
                };
                let mut bytes = header.encode();
                let mut chunk = ChunkBuilder::new()
                    .with_time_resolution(resolution)
                    .with_first_thread(header.pid);
                if continued {
                    chunk = chunk.with_continued_chunks();
                }
                for record in &records {
                    chunk.push(record);
                    if chunk.records() == per_chunk {
                        if compressed {
                            chunk.finish_compressed_into(&mut bytes);
                        } else {
                            chunk.finish_into(&mut bytes);
                        }
                    }
                }
                chunk.finish_into(&mut bytes);
                let (decoded, damage) = read_all(&bytes);
                assert!(damage.is_empty(), "{damage:?}");
                let expected: Vec<Record> = records
                    .iter()
                    .map(|record| retimed(record, |t| t - t % resolution))
                    .collect();
                assert_eq!(decoded, expected, "{resolution} ns, {per_chunk} per chunk");
            }
        }
    }
}

#[test]
fn a_run_that_does_not_fit_its_chunk_is_damage() {
    // Each payload: an event (remembered in slot 0), then records that end in a bad run; the
    // reader reports the chunk's rest skipped and reads the next chunk.
    let mut event = Vec::new();
    DeltaState::default().encode(
        &Record::Event(Event {
            addr: 0x7000,
            ..Event::default()
        }),
        &mut event,
    );
    let same = 0xf0;
    let run = |period: u8| 0xf8 + period - 1;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![run(1), 5], "run of records not in the chunk"),
        (
            [&event[..], &[run(2), 5]].concat(),
            "run of records that are not same-time repeats",
        ),
        (
            [&event[..], &[same, run(1), 0]].concat(),
            "empty run of records",
        ),
        (
            [&event[..], &[same, run(1), 0x80, 0x80, 0x80, 0x01]].concat(),
            "runs of records longer than a chunk holds",
        ),
        (
            [
                &event[..],
                &[same, same, run(1), 0xff, 0xff, 0x1f, run(1), 0x02],
            ]
            .concat(),
            "runs of records longer than a chunk holds",
        ),
        (
            [&event[..], &[same, run(1)]].concat(),
            "record runs past the end of its chunk",
        ),
    ];
    for (payload, reason) in cases {
        let mut bytes = header().encode();
        let chunk_at = bytes.len() as u64;
        put_chunk(&mut bytes, CHUNK_MAGIC, &[&payload]);
        let mut next = ChunkBuilder::new();
        let mark = Record::Mark(Mark {
            t_ns: 5,
            thread: 1,
            text: "after".into(),
        });
        next.push(&mark);
        next.finish_into(&mut bytes);
        let (decoded, damage) = read_all(&bytes);
        assert_eq!(
            damage,
            [Damage {
                offset: chunk_at,
                kind: DamageKind::BadRecord { reason }
            }]
        );
        assert_eq!(decoded.last(), Some(&mark), "{reason}");
    }
    // A run up to the limit reads: that many records after the one written plainly.
    let mut payload = [&event[..], &[same]].concat();
    payload.push(run(1));
    varint::put_u64(&mut payload, u64::from(MAX_RUN_RECORDS));
    let mut bytes = header().encode();
    put_chunk(&mut bytes, CHUNK_MAGIC, &[&payload]);
    let (decoded, damage) = read_all(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded.len(), 2 + MAX_RUN_RECORDS as usize);
}

#[test]
fn recorded_environment_variables_are_named_by_their_place() {
    let env = vec![
        ("CUDA_VISIBLE_DEVICES".to_owned(), Some("0,1".to_owned())),
        ("PYTORCH_CUDA_ALLOC_CONF".to_owned(), None),
        (
            "PYTORCH_ALLOC_CONF".to_owned(),
            Some("expandable_segments:True".to_owned()),
        ),
        ("PYTORCH_NO_CUDA_MEMORY_CACHING".to_owned(), None),
        ("SOMETHING_ELSE".to_owned(), Some("x".to_owned())),
    ];
    let written = Header { env, ..header() };
    for version in [3, 4, FORMAT_VERSION] {
        let read = reread(&written.encode_as(version)).unwrap();
        assert_eq!(
            read,
            Header {
                version,
                ..written.clone()
            }
        );
    }
    // Each of the four known names costs one byte instead of its length and itself; the
    // other one byte more (the 0 before it).
    let names: usize = RECORDED_ENV.iter().map(|name| name.len() + 1 - 1).sum();
    assert_eq!(
        written.encode_as(4).len() - written.encode().len(),
        names - 1
    );
    // A place past the list is damage.
    let mut bad = Header {
        env: vec![("CUDA_VISIBLE_DEVICES".to_owned(), None)],
        ..header()
    }
    .encode();
    let at = bad
        .windows(2)
        .position(|pair| pair == [1, 1])
        .expect("the entry: count 1, place 1");
    bad[at + 1] = 9;
    let body_crc = crc32fast::hash(&bad[20..]);
    bad[16..20].copy_from_slice(&body_crc.to_le_bytes());
    assert!(matches!(reread(&bad), Err(OpenError::BadHeader(_))));
}

#[test]
fn modules_are_one_address_and_two_distances() {
    // A shared object (bias = start) and a non-PIE executable (bias 0), read back exactly
    // from this version and from version 4's absolute layout.
    let modules = [
        ModuleDef {
            path: "/lib/x86_64-linux-gnu/libc.so.6".into(),
            load_bias: 0x7f75_932a_a000,
            start: 0x7f75_932a_a000,
            end: 0x7f75_9348_bf50,
            build_id: vec![0x93; 20],
        },
        ModuleDef {
            path: "/usr/bin/prog".into(),
            load_bias: 0,
            start: 0x40_0000,
            end: 0x40_2000,
            build_id: Vec::new(),
        },
    ];
    for module in modules {
        let record = Record::Module(module.clone());
        let mut compact = Vec::new();
        DeltaState::default().encode(&record, &mut compact);
        let mut absolute = Vec::new();
        DeltaState::default()
            .with_absolute_modules()
            .encode(&record, &mut absolute);
        for (payload, mut state) in [
            (&compact, DeltaState::default()),
            (&absolute, DeltaState::default().with_absolute_modules()),
        ] {
            let mut cursor = Cursor::new(payload);
            assert_eq!(state.decode(&mut cursor), Ok(record.clone()));
            assert!(cursor.is_empty());
        }
        if module.load_bias == module.start {
            // 7-byte bias and end become a 1-byte 0 and a 3-byte length.
            assert_eq!(absolute.len() - compact.len(), 7 + 7 - 1 - 3);
        }
    }
}

#[test]
fn a_chunk_s_runs_stop_at_their_limit_and_the_rest_is_written_plainly() {
    // 600,000 same-time events in one chunk of a builder that never closes it early: the runs
    // take what the decoder accepts, the rest is one byte each; all read back.
    let records = at_10ms(
        &loop_pairs(300_000, 0)
            .iter()
            .map(|r| retimed(r, |_| 0))
            .collect::<Vec<_>>(),
    );
    let mut bytes = header().encode();
    let mut chunk = ChunkBuilder::new();
    for record in &records {
        chunk.push(record);
    }
    let header_len = bytes.len();
    chunk.finish_into(&mut bytes);
    let plain = 600_000 - MAX_RUN_RECORDS as usize;
    assert!(
        bytes.len() - header_len > plain,
        "{} bytes",
        bytes.len() - header_len
    );
    let (decoded, damage) = read_all(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded, records);
}

/// A log at 10 ms of `steps` chunks of a busy loop (1,000 pairs each, one 10 ms step apart),
/// written as the recorder writes them (continued chunks), a key chunk asked for before the
/// chunks whose index `key_at` holds; with the records each chunk holds.
fn continued_log(steps: u64, key_at: &[usize], compressed: bool) -> (Vec<u8>, Vec<Vec<Record>>) {
    let header = Header {
        time_resolution_ns: 10_000_000,
        ..header()
    };
    let mut bytes = header.encode();
    let mut chunk = ChunkBuilder::new()
        .with_time_resolution(10_000_000)
        .with_first_thread(header.pid)
        .with_continued_chunks();
    let mut per_chunk = Vec::new();
    for step in 0..steps {
        if key_at.contains(&(step as usize)) {
            chunk.request_key();
        }
        let records = loop_pairs(1_000, step * 10_000_000);
        for record in &records {
            chunk.push(record);
        }
        if compressed {
            chunk.finish_compressed_into(&mut bytes);
        } else {
            chunk.finish_into(&mut bytes);
        }
        per_chunk.push(at_10ms(&records));
    }
    (bytes, per_chunk)
}

#[test]
fn continued_chunks_carry_the_state_on_in_a_few_bytes() {
    let (bytes, per_chunk) = continued_log(6, &[4], false);
    let spans = chunk_spans(&bytes);
    let keys: Vec<bool> = spans.iter().map(|span| span.key).collect();
    assert_eq!(keys, [true, false, false, false, true, false]);
    // A key chunk: 12 head, the first pair in full (21), two same-time repeats and a run of
    // 1,997 records (tag and a 2-byte count). A continued one: a 6-byte head (kind, length,
    // CRC-32) and the step: the alloc with its time delta (2), then a run of the last cycle
    // from its second record (its tag and its count less the last such run's: 1,999, 2
    // bytes, then 0, 1 byte).
    let lens: Vec<usize> = spans.iter().map(|span| span.len()).collect();
    assert_eq!(lens, [12 + 26, 6 + 5, 6 + 4, 6 + 4, 12 + 26, 6 + 5]);
    assert_eq!(spans[1].head, 6);
    let (decoded, damage) = read_all(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded, per_chunk.concat());
    // Compressed where that is shorter (not at these sizes): the same records.
    let (compressed, _) = continued_log(6, &[4], true);
    assert_eq!(read_all(&compressed).0, per_chunk.concat());
    // A key chunk once 64 KiB of records were written since the last: chunks of 3,000
    // events of distinct sizes (no repeats).
    let mut bytes = header().encode();
    let mut chunk = ChunkBuilder::new()
        .with_first_thread(4242)
        .with_continued_chunks();
    let mut records = Vec::new();
    for step in 0..20u64 {
        for i in 0..3_000u64 {
            let record = Record::Event(Event {
                api: 1,
                t_ns: step * 1_000_000 + i * 100,
                thread: 4242,
                addr: 0x7000_0000 + i * 0x1000,
                size: 1_000 + i * 7 + step,
                ..Event::default()
            });
            chunk.push(&record);
            records.push(record);
        }
        chunk.finish_into(&mut bytes);
    }
    let spans = chunk_spans(&bytes);
    let mut since_key = 0;
    let expected: Vec<bool> = spans
        .iter()
        .map(|span| {
            let key = since_key == 0 || since_key >= KEY_CHUNK_BYTES;
            since_key = if key {
                span.payload
            } else {
                since_key + span.payload
            };
            key
        })
        .collect();
    assert_eq!(
        spans.iter().map(|span| span.key).collect::<Vec<_>>(),
        expected
    );
    assert!(
        expected.iter().filter(|key| **key).count() >= 4,
        "{expected:?}"
    );
    assert!(
        expected.iter().filter(|key| !**key).count() >= 4,
        "{expected:?}"
    );
    assert_eq!(read_all(&bytes), (records, vec![]));
}

#[test]
fn a_damaged_continued_chunk_loses_exactly_the_chunks_up_to_the_next_key_chunk() {
    let (bytes, per_chunk) = continued_log(6, &[4], false);
    let spans = chunk_spans(&bytes);
    // Chunk 2 (continued) damaged in its records: it and chunk 3 are lost, chunk 4 (a key
    // chunk) and chunk 5 read exactly.
    let mut damaged = bytes.clone();
    damaged[spans[2].start + spans[2].head + 1] ^= 0x40;
    let (decoded, damage) = read_all(&damaged);
    let expected: Vec<Record> = [&per_chunk[0], &per_chunk[1], &per_chunk[4], &per_chunk[5]]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    assert_eq!(decoded, expected);
    assert_eq!(
        damage,
        [
            Damage {
                offset: spans[2].start as u64,
                kind: DamageKind::BadChecksum {
                    len: spans[2].len() as u64
                },
            },
            Damage {
                offset: spans[3].start as u64,
                kind: DamageKind::ContinuedAfterDamage {
                    chunks: 1,
                    bytes: spans[3].len() as u64
                },
            },
        ]
    );
    assert_eq!(
        damage[1].to_string(),
        format!(
            "1 continued chunk at byte {} ({} bytes) skipped: it carries on the damaged chunk \
             before it; reading resumes at the next key chunk",
            spans[3].start,
            spans[3].len()
        )
    );
    // The key chunk 0 damaged: chunks 1 – 3 are counted, 4 and 5 read.
    let mut damaged = bytes.clone();
    damaged[spans[0].start + spans[0].head + 3] ^= 0x01;
    let (decoded, damage) = read_all(&damaged);
    assert_eq!(
        decoded,
        [per_chunk[4].clone(), per_chunk[5].clone()].concat()
    );
    assert_eq!(
        damage[1],
        Damage {
            offset: spans[1].start as u64,
            kind: DamageKind::ContinuedAfterDamage {
                chunks: 3,
                bytes: (spans[1].len() + spans[2].len() + spans[3].len()) as u64
            },
        }
    );
    // The length of continued chunk 1 damaged: not trusted; what follows up to the next key
    // chunk is skipped as unreadable bytes.
    let mut damaged = bytes.clone();
    damaged[spans[1].start + 1] ^= 0x03;
    let (decoded, damage) = read_all(&damaged);
    assert_eq!(
        decoded,
        [
            per_chunk[0].clone(),
            per_chunk[4].clone(),
            per_chunk[5].clone()
        ]
        .concat()
    );
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert_eq!(damage[0].offset, spans[1].start as u64);
    // The last chunk damaged: only it is lost.
    let mut damaged = bytes.clone();
    damaged[spans[5].start + spans[5].head] ^= 0x10;
    let (decoded, damage) = read_all(&damaged);
    assert_eq!(decoded, per_chunk[..5].concat());
    assert_eq!(
        damage,
        [Damage {
            offset: spans[5].start as u64,
            kind: DamageKind::BadChecksum {
                len: spans[5].len() as u64
            },
        }]
    );
}

#[test]
fn a_torn_continued_chunk_loses_only_itself() {
    let (bytes, per_chunk) = continued_log(6, &[4], false);
    let spans = chunk_spans(&bytes);
    // Cut inside each continued chunk's head and payload: every chunk before it reads.
    for (index, span) in spans.iter().enumerate().filter(|(_, span)| !span.key) {
        for cut in [1, 3, span.head, span.len() - 1] {
            let (decoded, damage) = read_all(&bytes[..span.start + cut]);
            assert_eq!(
                decoded,
                per_chunk[..index].concat(),
                "chunk {index} cut at {cut}"
            );
            assert_eq!(
                damage,
                [Damage {
                    offset: span.start as u64,
                    kind: DamageKind::TornTail { bytes: cut as u64 },
                }],
                "chunk {index} cut at {cut}"
            );
        }
    }
    // After damage, a torn tail: the skipped continued chunks are counted, then the tear.
    let mut damaged = bytes[..spans[3].start + 4].to_vec();
    damaged[spans[1].start + spans[1].head] ^= 0x20;
    let (decoded, damage) = read_all(&damaged);
    assert_eq!(decoded, per_chunk[0]);
    assert_eq!(
        damage.iter().map(|d| d.kind.clone()).collect::<Vec<_>>(),
        [
            DamageKind::BadChecksum {
                len: spans[1].len() as u64
            },
            DamageKind::ContinuedAfterDamage {
                chunks: 1,
                bytes: spans[2].len() as u64
            },
            DamageKind::TornTail { bytes: 4 },
        ]
    );
}

#[test]
fn continued_chunks_are_damage_in_a_version_5_log() {
    let (mut bytes, per_chunk) = continued_log(3, &[], false);
    let spans = chunk_spans(&bytes);
    // The same bytes under a version 5 header: the continued chunks are not chunks there.
    bytes[8..12].copy_from_slice(&5u32.to_le_bytes());
    let (decoded, damage) = read_all(&bytes);
    assert_eq!(decoded, per_chunk[0]);
    assert_eq!(
        damage,
        [Damage {
            offset: spans[1].start as u64,
            kind: DamageKind::Garbage {
                bytes: (spans[1].len() + spans[2].len()) as u64
            },
        }]
    );
}

#[test]
fn runs_of_the_last_cycle_out_of_bounds_are_bad_records() {
    // A loop's first step as the encoder writes it: an alloc and a free in full, then a run
    // of the cycle (same-time repeats of slots 0 and 1) written once and 4 more records long.
    let mut step = Vec::new();
    let mut chunk = ChunkBuilder::new().with_first_thread(4242);
    for record in loop_pairs(4, 0).iter().map(|r| retimed(r, |_| 0)) {
        chunk.push(&record);
    }
    chunk.finish_into(&mut step);
    let first = step[CHUNK_HEADER_LEN..].to_vec();
    assert_eq!(first[first.len() - 4..], [0xf0, 0xf1, 0xf9, 0x04]);
    let cases: [(&[u8], &[u8], &str); 4] = [
        (
            &[],
            &[0xe8, 0x02],
            "run of the last cycle with no run before it",
        ),
        (
            &first,
            &[0xea, 0x02],
            "run of the last cycle from past its end",
        ),
        // 0 less 1: a count of -1.
        (
            &first,
            &[0xe8, 0x01],
            "run of the last cycle with a count out of range",
        ),
        (&first, &[0xe8, 0x00], "empty run of records"),
    ];
    for (before, run, reason) in cases {
        let payload = [before, run].concat();
        let mut bytes = header().encode();
        bytes.extend_from_slice(&crate::CHUNK_MAGIC);
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        let (decoded, damage) = read_all(&bytes);
        assert_eq!(
            decoded.len(),
            if before.is_empty() { 0 } else { 8 },
            "{reason}"
        );
        assert_eq!(
            damage.iter().map(|d| &d.kind).collect::<Vec<_>>(),
            [&crate::DamageKind::BadRecord { reason }]
        );
    }
    // In range: 2 more records of the cycle, from its second (a free, then an alloc).
    let payload = [&first[..], &[0xe9, 0x04]].concat();
    let mut bytes = header().encode();
    bytes.extend_from_slice(&crate::CHUNK_MAGIC);
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    bytes.extend_from_slice(&payload);
    let (decoded, damage) = read_all(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    let kinds: Vec<EventKind> = decoded
        .iter()
        .map(|record| match record {
            Record::Event(event) => event.kind,
            _ => panic!("{record:?}"),
        })
        .collect();
    use EventKind::{Alloc, Free};
    assert_eq!(
        kinds,
        [
            Alloc, Free, Alloc, Free, Alloc, Free, Alloc, Free, Free, Alloc
        ]
    );
}

#[test]
fn a_peek_names_the_event_the_next_repeat_reads_and_nothing_else() {
    // An allocate/free loop: its first pair written in full, every later record a repeat.
    let records = loop_pairs(20, 1_000);
    let bytes = encode_log(&records, usize::MAX);
    let mut reader = LogReader::new(&bytes[..]).expect("header");
    let mut record = Record::Exit(Exit::default());
    let mut peeks_right = Vec::new();
    loop {
        let peek = reader.peek_repeat().copied();
        match reader.next_into(&mut record) {
            None => {
                assert_eq!(peek, None, "nothing to peek at the end");
                break;
            }
            Some(Ok(())) => {}
            Some(Err(damage)) => panic!("{damage:?}"),
        }
        let Record::Event(event) = &record else {
            panic!("not an event: {record:?}");
        };
        // The peek gives the event the repeat copies; its time is the repeat's own.
        peeks_right.push(
            peek.map(|peeked| Event {
                t_ns: event.t_ns,
                ..peeked
            }) == Some(*event),
        );
    }
    let mut expected = vec![false, false];
    expected.resize(40, true);
    assert_eq!(peeks_right, expected);
    // The chunk cut inside a repeat's time delta: decoding it is damage, so nothing to peek.
    let header_len = header().encode().len();
    let full = encode_log(&records[..3], usize::MAX);
    let payload = &full[header_len + CHUNK_HEADER_LEN..full.len() - 1];
    let mut torn = header().encode();
    torn.extend_from_slice(&crate::CHUNK_MAGIC);
    torn.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    torn.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    torn.extend_from_slice(payload);
    let mut reader = LogReader::new(&torn[..]).expect("header");
    for _ in 0..2 {
        assert_eq!(reader.next_into(&mut record), Some(Ok(())));
    }
    assert_eq!(reader.peek_repeat(), None);
    assert!(matches!(reader.next_into(&mut record), Some(Err(_))));
}

#[test]
fn a_repeat_read_in_place_is_the_event_decoding_gives() {
    // Two readers of a log of loops and other events: one decodes every record, the other
    // reads repeats in place (their kept events) and decodes the rest; both see the same.
    // (The first loop ends on a repeated allocation: the full event after it is written
    // against the repeat's fields.)
    let mut records = loop_pairs(30, 1_000);
    records.pop();
    records.extend(sample_records());
    records.extend(loop_pairs(30, 10_000_000));
    for per_chunk in [7, 64, usize::MAX] {
        let bytes = encode_log(&records, per_chunk);
        let mut decoding = LogReader::new(&bytes[..]).expect("header");
        let mut in_place = LogReader::new(&bytes[..]).expect("header");
        let (mut decoded, mut read) =
            (Record::Exit(Exit::default()), Record::Exit(Exit::default()));
        let mut repeats = 0;
        loop {
            let expected = decoding.next_into(&mut decoded);
            let got = match in_place.next_repeat() {
                Some(slot) => {
                    repeats += 1;
                    read = Record::Event(*in_place.repeated(slot).expect("kept event"));
                    Some(Ok(()))
                }
                None => in_place.next_into(&mut read),
            };
            assert_eq!(got, expected);
            if expected.is_none() {
                break;
            }
            assert_eq!(read, decoded);
        }
        assert!(repeats > 50, "{repeats} repeats read in place");
    }
}

#[test]
fn a_builder_told_no_first_thread_writes_the_thread_of_a_thread_with_its_own_id() {
    // A builder with no first thread keeps u32::MAX as the thread it knows; an event of that
    // very thread first in a chunk must still write it, or the reader's start state (the
    // header's pid) gives it another thread. (The decode_chunk fuzzer's round trip found it.)
    let event = |thread| {
        Record::Event(Event {
            kind: EventKind::Alloc,
            thread,
            size: 256,
            addr: 0x7000,
            ..Event::default()
        })
    };
    let records = vec![event(u32::MAX), event(u32::MAX), event(7), event(u32::MAX)];
    let bytes = encode_log(&records, 1);
    let (decoded, damage) = read_all(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded, records);
    let bytes = encode_log(&records, 100);
    assert_eq!(read_all(&bytes), (records, Vec::new()));
}

/// A block's events as PyTorch's caching allocator reports them: its `tensor_alloc` (with a
/// stack) at `t_ns`, then its `tensor_free_requested` and `tensor_free` (no stack) 400 and
/// 700 ns later, on the header's pid's thread.
fn block_events(addr: u64, size: u64, t_ns: u64) -> [Record; 3] {
    let event = |kind, t_ns, stack| {
        Record::Event(Event {
            kind,
            api: 3,
            t_ns,
            thread: 4242,
            device: 0,
            stream: 0x5000,
            addr,
            size,
            stack,
            ..Event::default()
        })
    };
    [
        event(EventKind::TensorAlloc, t_ns, 7),
        event(EventKind::TensorFreeRequested, t_ns + 400, 0),
        event(EventKind::TensorFree, t_ns + 700, 0),
    ]
}

/// `records` in one plain chunk of a log of format 7 (`pairs`) or format 6: the log and the
/// chunk's payload.
fn one_chunk(records: &[Record], pairs: bool, version: u32) -> (Vec<u8>, Vec<u8>) {
    let mut bytes = header().encode_as(version);
    let header_len = bytes.len();
    let mut chunk = ChunkBuilder::new().with_first_thread(4242);
    if !pairs {
        chunk = chunk.without_free_pairs();
    }
    for record in records {
        chunk.push(record);
    }
    assert_eq!(chunk.records(), records.len(), "records pushed");
    chunk.finish_into(&mut bytes);
    let payload = bytes[header_len + CHUNK_HEADER_LEN..].to_vec();
    (bytes, payload)
}

/// Reads `bytes` both ways a reader can (the iterator, and `next_into` with repeats read in
/// place as the replay reads them): the records, which must agree, and any damage.
fn read_both_ways(bytes: &[u8]) -> (Vec<Record>, Vec<Damage>) {
    let (records, damage) = read_all(bytes);
    let mut reader = LogReader::new(bytes).expect("header");
    let mut record = Record::Exit(Exit::default());
    let mut in_place = Vec::new();
    loop {
        let got = match reader.next_repeat() {
            Some(slot) => {
                record = Record::Event(*reader.repeated(slot).expect("kept event"));
                Some(Ok(()))
            }
            None => reader.next_into(&mut record),
        };
        match got {
            None => break,
            Some(Ok(())) => in_place.push(record.clone()),
            Some(Err(_)) => {}
        }
    }
    assert_eq!(in_place, records, "read in place and by the iterator");
    (records, damage)
}

#[test]
fn a_blocks_free_request_and_free_are_one_record() {
    let records = block_events(0x7000_0000_0000, 1 << 20, 5_000);
    let (bytes, payload) = one_chunk(&records, true, FORMAT_VERSION);
    let (_, plain) = one_chunk(&records, false, FORMAT_VERSION);
    // The alloc in full, then the free request in full under the pair's tag, then the 300 ns
    // to the free (a 2-byte varint) in place of the free's own record (its tag, flags, api,
    // time delta (2 bytes), address and size deltas, stream (3 bytes): 10 bytes).
    let mut alloc = Vec::new();
    let mut state = DeltaState::default().with_first_thread(4242);
    state.encode(&records[0], &mut alloc);
    let mut request = Vec::new();
    state.encode(&records[1], &mut request);
    let mut free = Vec::new();
    state.encode(&records[2], &mut free);
    assert_eq!(free.len(), 10, "{free:x?}");
    assert_eq!(request[0], 0x10 + EventKind::TensorFreeRequested as u8);
    let mut expected = alloc.clone();
    expected.push(0xe0);
    expected.extend_from_slice(&request[1..]);
    expected.extend_from_slice(&[0xac, 0x02]);
    assert_eq!(payload, expected);
    assert_eq!(plain, [alloc, request, free].concat());
    let (decoded, damage) = read_both_ways(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded, records);
    // Compressed, and at a coarse resolution (the free in the same 10 ms: a delta of 0).
    let mut bytes = header().encode();
    let mut chunk = ChunkBuilder::new();
    records.iter().for_each(|record| chunk.push(record));
    chunk.finish_compressed_into(&mut bytes);
    assert_eq!(read_both_ways(&bytes).0, records);
    let coarse = Header {
        time_resolution_ns: 10_000_000,
        ..header()
    };
    let mut bytes = coarse.encode();
    let mut chunk = ChunkBuilder::new().with_time_resolution(10_000_000);
    records.iter().for_each(|record| chunk.push(record));
    chunk.finish_into(&mut bytes);
    assert_eq!(*bytes.last().expect("payload"), 0, "the pair's time delta");
    assert_eq!(read_both_ways(&bytes).0, at_10ms(&records));
}

#[test]
fn a_pair_split_by_a_chunk_end_is_two_records() {
    let records = block_events(0x7000_0000_0000, 1 << 20, 5_000);
    for continued in [false, true] {
        let mut bytes = header().encode();
        let header_len = bytes.len();
        let mut chunk = ChunkBuilder::new().with_first_thread(4242);
        if continued {
            chunk = chunk.with_continued_chunks();
        }
        chunk.push(&records[0]);
        chunk.push(&records[1]);
        chunk.finish_into(&mut bytes);
        let first_chunk = bytes.len();
        chunk.push(&records[2]);
        chunk.finish_into(&mut bytes);
        // The free starts the second chunk as a record of its own.
        let spans = chunk_spans(&bytes);
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[1].start, first_chunk);
        assert_eq!(spans[1].key, !continued);
        let free_tag = bytes[spans[1].start + spans[1].head];
        assert_eq!(free_tag, 0x10 + EventKind::TensorFree as u8);
        assert!(!bytes[header_len..first_chunk].contains(&0xe0));
        let (decoded, damage) = read_both_ways(&bytes);
        assert!(damage.is_empty(), "{damage:?}");
        assert_eq!(decoded, records);
    }
}

#[test]
fn a_free_that_differs_from_its_request_in_any_field_is_its_own_record() {
    let records = block_events(0x7000_0000_0000, 1 << 20, 5_000);
    let Record::Event(request) = records[1] else {
        unreachable!()
    };
    let Record::Event(free) = records[2] else {
        unreachable!()
    };
    let differing: [(&str, Event); 12] = [
        ("thread", Event { thread: 9, ..free }),
        (
            "addr",
            Event {
                addr: 0x7000_0000_1000,
                ..free
            },
        ),
        ("size", Event { size: 512, ..free }),
        ("device", Event { device: 1, ..free }),
        ("stream", Event { stream: 0, ..free }),
        ("api", Event { api: 4, ..free }),
        ("handle", Event { handle: 1, ..free }),
        ("result", Event { result: 2, ..free }),
        (
            "mem_info",
            Event {
                mem_info: Some((1, 2)),
                ..free
            },
        ),
        ("stack", Event { stack: 7, ..free }),
        (
            "earlier",
            Event {
                t_ns: request.t_ns - 1,
                ..free
            },
        ),
        (
            "kind",
            Event {
                kind: EventKind::Free,
                ..free
            },
        ),
    ];
    for (field, second) in differing {
        let records = [
            records[0].clone(),
            records[1].clone(),
            Record::Event(second),
        ];
        let (bytes, payload) = one_chunk(&records, true, FORMAT_VERSION);
        assert_eq!(
            payload,
            one_chunk(&records, false, FORMAT_VERSION).1,
            "{field}"
        );
        let (decoded, damage) = read_both_ways(&bytes);
        assert!(damage.is_empty(), "{field}: {damage:?}");
        assert_eq!(decoded, records, "{field}");
    }
    // A request with a stack pairs with its free (which has none); one at the same time too.
    for first in [
        Event {
            stack: 9,
            ..request
        },
        Event {
            t_ns: free.t_ns,
            ..request
        },
    ] {
        let records = [records[0].clone(), Record::Event(first), records[2].clone()];
        let (bytes, payload) = one_chunk(&records, true, FORMAT_VERSION);
        assert!(payload.contains(&0xe0), "{first:?}");
        assert!(payload.len() < one_chunk(&records, false, FORMAT_VERSION).1.len());
        assert_eq!(read_both_ways(&bytes).0, records);
    }
    // A request written as a repeat of one before it is not folded.
    let mut again = records.to_vec();
    again.push(retimed(&records[1], |t| t + 5_000));
    again.push(retimed(&records[2], |t| t + 5_000));
    let (bytes, payload) = one_chunk(&again, true, FORMAT_VERSION);
    let (_, plain) = one_chunk(&again, false, FORMAT_VERSION);
    // Only the first pair is one record (the free's 10 bytes become 2); the repeats after it
    // (the request's and the free's, each a tag and a time delta) are as before.
    assert_eq!(payload.len() + 8, plain.len());
    assert_eq!(payload[payload.len() - 6..], plain[plain.len() - 6..]);
    assert_eq!(read_both_ways(&bytes).0, again);
}

#[test]
fn pairs_keep_repeats_and_runs_as_before() {
    // A loop over one block at 10 ms: 30,000 blocks in 30 ms. The first block's free request
    // and free are one record (its 9-byte free becomes a 1-byte time delta); every later
    // event is a same-time repeat of the first three (kept as if written in full), gathered
    // into runs exactly as before.
    let records: Vec<Record> = (0..30_000u64)
        .flat_map(|i| block_events(0x7000_0000_0000, 4096, i * 1_000))
        .collect();
    let coarse = Header {
        time_resolution_ns: 10_000_000,
        ..header()
    };
    let mut written = Vec::new();
    for pairs in [true, false] {
        let mut bytes = coarse.encode();
        let mut chunk = ChunkBuilder::new()
            .with_time_resolution(10_000_000)
            .with_first_thread(4242)
            .with_continued_chunks();
        if !pairs {
            chunk = chunk.without_free_pairs();
        }
        for (at, record) in records.iter().enumerate() {
            chunk.push(record);
            if at % 20_000 == 19_999 {
                chunk.finish_into(&mut bytes);
            }
        }
        chunk.finish_into(&mut bytes);
        let (decoded, damage) = read_both_ways(&bytes);
        assert!(damage.is_empty(), "{damage:?}");
        assert_eq!(decoded, at_10ms(&records));
        written.push(bytes.len());
    }
    assert_eq!(written[0] + 8, written[1], "{written:?}");
    // At full resolution, blocks cycling over three addresses: repeats of requests (not
    // folded), of frees kept from pairs, fresh pairs; cut into chunks of every length.
    let records: Vec<Record> = (0..60u64)
        .flat_map(|i| block_events(0x7000_0000_0000 + (i % 3 + i / 20) * 4096, 4096, i * 1_000))
        .collect();
    for per_chunk in [1, 2, 3, 4, 5, 7, 64, usize::MAX] {
        for continued in [false, true] {
            let mut bytes = header().encode();
            let mut chunk = ChunkBuilder::new().with_first_thread(4242);
            if continued {
                chunk = chunk.with_continued_chunks();
            }
            for record in &records {
                chunk.push(record);
                if chunk.records() == per_chunk {
                    chunk.finish_into(&mut bytes);
                }
            }
            chunk.finish_into(&mut bytes);
            let (decoded, damage) = read_both_ways(&bytes);
            assert!(damage.is_empty(), "{per_chunk} {continued}: {damage:?}");
            assert_eq!(decoded, records, "{per_chunk} {continued}");
        }
    }
}

#[test]
fn a_version_6_log_reads_as_before_and_a_pair_in_it_is_damage() {
    let records = block_events(0x7000_0000_0000, 1 << 20, 5_000);
    // A format 6 writer's log (the pair as two records) reads as written.
    let (bytes, _) = one_chunk(&records, false, 6);
    let (decoded, damage) = read_both_ways(&bytes);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(decoded, records);
    assert_eq!(
        LogReader::new(&bytes[..]).expect("header").header().version,
        6
    );
    // A pair record is not a record of format 6: the chunk is damage from it on.
    let (bytes, _) = one_chunk(&records, true, 6);
    let (decoded, damage) = read_all(&bytes);
    assert_eq!(decoded, records[..1]);
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert!(
        matches!(
            damage[0].kind,
            DamageKind::BadRecord {
                reason: "unknown record tag"
            }
        ),
        "{damage:?}"
    );
}

#[test]
fn a_pair_cut_short_is_a_bad_record() {
    // The pair's time delta missing: the chunk is damage, its first events kept.
    let records = block_events(0x7000_0000_0000, 1 << 20, 5_000);
    let (_, payload) = one_chunk(&records, true, FORMAT_VERSION);
    let payload = &payload[..payload.len() - 2];
    let mut torn = header().encode();
    torn.extend_from_slice(&CHUNK_MAGIC);
    torn.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    torn.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    torn.extend_from_slice(payload);
    let (decoded, damage) = read_all(&torn);
    assert_eq!(decoded, records[..1]);
    assert_eq!(damage.len(), 1, "{damage:?}");
}
