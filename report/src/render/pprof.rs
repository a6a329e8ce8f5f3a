//! pprof's profile format (github.com/google/pprof, `proto/profile.proto`), gzipped, as
//! `go tool pprof` reads it. The protobuf encoding of the few messages used is written here
//! by hand: varints and length-delimited fields only.
//!
//! Sample types, in order: `alloc_objects`/count, `alloc_space`/bytes (allocated over the
//! run), `inuse_objects`/count, `inuse_space`/bytes (live at the chosen moment); the default
//! is `inuse_space`. Each frame is a location with one line of one function (file and line
//! from the symbolisation, Python frames included); each sample carries a `device` label.

use std::io::{self, Write};

use flate2::Compression;
use flate2::write::GzEncoder;
use rustc_hash::FxHashMap;

use crate::analysis::groups::no_stack_frame;
use crate::analysis::profile::ProfileSample;
use crate::render::device_name;

/// What the whole profile is about, beyond its samples.
pub struct ProfileInfo {
    /// Wall-clock start of the recording (Unix ns).
    pub time_nanos: u64,
    pub duration_nanos: u64,
    /// Comments shown by `pprof -comments`.
    pub comments: Vec<String>,
}

/// The gzipped profile.
pub fn encode(samples: &[ProfileSample], info: &ProfileInfo) -> io::Result<Vec<u8>> {
    let raw = profile(samples, info);
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&raw)?;
    gz.finish()
}

/// Field numbers of profile.proto's messages.
mod field {
    pub const PROFILE_SAMPLE_TYPE: u32 = 1;
    pub const PROFILE_SAMPLE: u32 = 2;
    pub const PROFILE_LOCATION: u32 = 4;
    pub const PROFILE_FUNCTION: u32 = 5;
    pub const PROFILE_STRING_TABLE: u32 = 6;
    pub const PROFILE_TIME_NANOS: u32 = 9;
    pub const PROFILE_DURATION_NANOS: u32 = 10;
    pub const PROFILE_COMMENT: u32 = 13;
    pub const PROFILE_DEFAULT_SAMPLE_TYPE: u32 = 14;
    pub const VALUE_TYPE_TYPE: u32 = 1;
    pub const VALUE_TYPE_UNIT: u32 = 2;
    pub const SAMPLE_LOCATION_ID: u32 = 1;
    pub const SAMPLE_VALUE: u32 = 2;
    pub const SAMPLE_LABEL: u32 = 3;
    pub const LABEL_KEY: u32 = 1;
    pub const LABEL_STR: u32 = 2;
    pub const LOCATION_ID: u32 = 1;
    pub const LOCATION_LINE: u32 = 4;
    pub const LINE_FUNCTION_ID: u32 = 1;
    pub const LINE_LINE: u32 = 2;
    pub const FUNCTION_ID: u32 = 1;
    pub const FUNCTION_NAME: u32 = 2;
    pub const FUNCTION_SYSTEM_NAME: u32 = 3;
    pub const FUNCTION_FILENAME: u32 = 4;
}

const VARINT: u32 = 0;
const LEN: u32 = 2;

/// A protobuf message being written.
#[derive(Default)]
struct Message(Vec<u8>);

impl Message {
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn tag(&mut self, field: u32, wire: u32) {
        self.varint(u64::from(field << 3 | wire));
    }

    /// A varint field; zero is the default and is left out, as protobuf does.
    fn uint(&mut self, field: u32, value: u64) {
        if value != 0 {
            self.tag(field, VARINT);
            self.varint(value);
        }
    }

    fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.tag(field, LEN);
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    fn message(&mut self, field: u32, message: Message) {
        self.bytes(field, &message.0);
    }

    /// A packed repeated varint field.
    fn packed(&mut self, field: u32, values: &[u64]) {
        let mut body = Message::default();
        for &value in values {
            body.varint(value);
        }
        self.bytes(field, &body.0);
    }
}

/// The string table: index 0 is the empty string.
struct Strings {
    index: FxHashMap<String, u64>,
    table: Vec<String>,
}

impl Strings {
    fn new() -> Strings {
        Strings {
            index: FxHashMap::from_iter([(String::new(), 0)]),
            table: vec![String::new()],
        }
    }

    fn id(&mut self, text: &str) -> u64 {
        if let Some(&id) = self.index.get(text) {
            return id;
        }
        let id = self.table.len() as u64;
        self.table.push(text.to_string());
        self.index.insert(text.to_string(), id);
        id
    }
}

/// The uncompressed profile message.
fn profile(samples: &[ProfileSample], info: &ProfileInfo) -> Vec<u8> {
    let mut strings = Strings::new();
    let mut out = Message::default();
    for (kind, unit) in [
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ] {
        let mut value_type = Message::default();
        value_type.uint(field::VALUE_TYPE_TYPE, strings.id(kind));
        value_type.uint(field::VALUE_TYPE_UNIT, strings.id(unit));
        out.message(field::PROFILE_SAMPLE_TYPE, value_type);
    }

    // Functions by (name, file); locations by (function, line). Ids start at 1.
    let mut functions: FxHashMap<(u64, u64), u64> = FxHashMap::default();
    let mut locations: FxHashMap<(u64, u64), u64> = FxHashMap::default();
    let mut function_messages = Vec::new();
    let mut location_messages = Vec::new();
    let placeholder = [no_stack_frame()];
    let device_key = strings.id("device");
    for sample in samples {
        let frames = if sample.frames.is_empty() {
            &placeholder[..]
        } else {
            &sample.frames[..]
        };
        let mut location_ids = Vec::with_capacity(frames.len());
        for frame in frames {
            let name = strings.id(&frame
                .function
                .as_deref()
                .map_or_else(|| frame.label(), str::to_string));
            let file = strings.id(frame.file.as_deref().unwrap_or(&frame.module));
            let function = *functions.entry((name, file)).or_insert_with(|| {
                let id = function_messages.len() as u64 + 1;
                let mut message = Message::default();
                message.uint(field::FUNCTION_ID, id);
                message.uint(field::FUNCTION_NAME, name);
                message.uint(field::FUNCTION_SYSTEM_NAME, name);
                message.uint(field::FUNCTION_FILENAME, file);
                function_messages.push(message);
                id
            });
            let line = frame.line.map_or(0, u64::from);
            let location = *locations.entry((function, line)).or_insert_with(|| {
                let id = location_messages.len() as u64 + 1;
                let mut message = Message::default();
                message.uint(field::LOCATION_ID, id);
                let mut line_message = Message::default();
                line_message.uint(field::LINE_FUNCTION_ID, function);
                line_message.uint(field::LINE_LINE, line);
                message.message(field::LOCATION_LINE, line_message);
                location_messages.push(message);
                id
            });
            location_ids.push(location);
        }
        let mut message = Message::default();
        message.packed(field::SAMPLE_LOCATION_ID, &location_ids);
        message.packed(
            field::SAMPLE_VALUE,
            &[
                sample.alloc_count,
                sample.alloc_bytes,
                sample.inuse_count,
                sample.inuse_bytes,
            ],
        );
        let mut label = Message::default();
        label.uint(field::LABEL_KEY, device_key);
        label.uint(field::LABEL_STR, strings.id(&device_name(sample.device)));
        message.message(field::SAMPLE_LABEL, label);
        out.message(field::PROFILE_SAMPLE, message);
    }
    for message in location_messages {
        out.message(field::PROFILE_LOCATION, message);
    }
    for message in function_messages {
        out.message(field::PROFILE_FUNCTION, message);
    }
    out.uint(field::PROFILE_TIME_NANOS, info.time_nanos);
    out.uint(field::PROFILE_DURATION_NANOS, info.duration_nanos);
    let comments: Vec<u64> = info.comments.iter().map(|c| strings.id(c)).collect();
    for comment in comments {
        out.uint(field::PROFILE_COMMENT, comment);
    }
    let default = strings.id("inuse_space");
    out.uint(field::PROFILE_DEFAULT_SAMPLE_TYPE, default);
    // Last: every string has been met.
    for text in &strings.table {
        out.bytes(field::PROFILE_STRING_TABLE, text.as_bytes());
    }
    out.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_fields_encode_as_protobuf_does() {
        let mut message = Message::default();
        message.uint(1, 150);
        assert_eq!(message.0, [0x08, 0x96, 0x01]);
        let mut message = Message::default();
        message.bytes(2, b"testing");
        assert_eq!(
            message.0,
            [0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']
        );
        let mut message = Message::default();
        message.packed(4, &[3, 270, 86942]);
        assert_eq!(message.0, [0x22, 0x06, 0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05]);
        let mut message = Message::default();
        message.uint(3, 0);
        assert!(message.0.is_empty());
    }

    #[test]
    fn string_table_starts_empty_and_shares_strings() {
        let mut strings = Strings::new();
        assert_eq!(strings.id(""), 0);
        assert_eq!(strings.id("a"), 1);
        assert_eq!(strings.id("b"), 2);
        assert_eq!(strings.id("a"), 1);
        assert_eq!(strings.table, ["", "a", "b"]);
    }
}
