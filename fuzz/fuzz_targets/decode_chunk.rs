//! Arbitrary bytes as the payload of one well-formed chunk (correct length and checksum)
//! after a valid header, so the fuzzer works on record decoding rather than on the checksum.
//! Reading must never panic, and the records decoded must survive a round trip through the
//! encoder unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramshim_format::{
    CHUNK_MAGIC, ChunkBuilder, DamageKind, FORMAT_VERSION, Header, Item, LogReader, Record,
};

fn header() -> Header {
    Header {
        version: FORMAT_VERSION,
        pid: 4242,
        ppid: 1,
        argv: vec!["fuzz".into()],
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 1_000,
        hostname: "fuzz".into(),
        env: Vec::new(),
        apis: vec!["cudaMalloc".into(), "cudaFree".into()],
        stack_mode: "native".into(),
        mode: "stream".into(),
        recorder: "fuzz".into(),
        time_resolution_ns: 1,
    }
}

fn records(log: &[u8]) -> (Vec<Record>, Vec<DamageKind>) {
    let reader = LogReader::new(log).expect("a valid header opens");
    let mut records = Vec::new();
    let mut damage = Vec::new();
    for item in reader {
        match item {
            Item::Record(record) => records.push(record),
            Item::Damage(d) => damage.push(d.kind),
        }
    }
    (records, damage)
}

fuzz_target!(|data: &[u8]| {
    let mut log = header().encode();
    log.extend_from_slice(&CHUNK_MAGIC);
    log.extend_from_slice(&(data.len() as u32).to_le_bytes());
    log.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    log.extend_from_slice(data);
    let (decoded, damage) = records(&log);
    // The chunk is well formed: the only possible damage is an undecodable record.
    assert!(damage.len() <= 1, "{damage:?}");
    assert!(
        damage
            .iter()
            .all(|kind| matches!(kind, DamageKind::BadRecord { .. })),
        "{damage:?}"
    );

    // What was decoded, encoded again, decodes to the same records.
    let mut again = header().encode();
    let mut chunk = ChunkBuilder::new();
    for record in &decoded {
        chunk.push(record);
    }
    chunk.finish_into(&mut again);
    let (round_trip, damage) = records(&again);
    assert!(damage.is_empty(), "{damage:?}");
    assert_eq!(round_trip, decoded);
});
