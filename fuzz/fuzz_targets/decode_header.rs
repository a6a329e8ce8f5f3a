//! Arbitrary bytes as the body of a log header with a correct length and checksum, so the
//! fuzzer reaches header decoding. Opening must never panic, and a header that opens must
//! survive a round trip through the encoder unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramshim_format::{FORMAT_VERSION, LogReader, MAGIC};

fuzz_target!(|data: &[u8]| {
    let mut log = MAGIC.to_vec();
    log.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    log.extend_from_slice(&(data.len() as u32).to_le_bytes());
    log.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    log.extend_from_slice(data);
    let Ok(reader) = LogReader::new(&log[..]) else {
        return;
    };
    let header = reader.header().clone();
    // Nothing follows the header: the stream is empty.
    assert_eq!(reader.count(), 0);
    let again = header.encode();
    let reopened = LogReader::new(&again[..]).expect("an encoded header opens");
    assert_eq!(reopened.header(), &header);
});
