//! The vramshim log format, shared by the recorder (`libvramshim.so`) and the report tool.
//!
//! A log is a header followed by chunks:
//!
//! ```text
//! "VRAMSHIM" | version u32 | header length u32 | header crc32 u32 | header
//! chunk*:  "VSCK" u32 | payload length u32 | payload crc32 u32 | payload (records)
//!        |  "VSCZ" u32 | payload length u32 | payload crc32 u32 | payload:
//!                      zstd frame of the records, with their length (version 4+)
//!                    | records length u32 | zstd frame of the records (versions 2, 3)
//!        |  0xC5 | payload length varint | crc32 u32 of all before it and the payload |
//!                      payload (records)                        (version 6: continued)
//!        |  0xC7 | the same, the payload a zstd frame of the records (version 6: continued)
//! ```
//!
//! A `VSCK`/`VSCZ` chunk is a key chunk: its records decode on their own. A continued chunk
//! (format version 6) carries on from the delta state the chunk before it ended in (the
//! current thread, time, address, size, the recent events repeats refer to, the last run's
//! cycle), so a steady stream's chunk costs its new records and a 6-byte head, not its first
//! events in full and 12 bytes. Only a whole chunk read without damage can be continued: after
//! damage, a reader skips (and counts) continued chunks up to the next key chunk. The
//! recorder writes a key chunk at least every [`KEY_CHUNK_BYTES`] of records and every second.
//!
//! A `VSCZ` chunk (format version 2) holds the same records as a `VSCK` chunk, compressed; its
//! checksum covers the compressed payload, so damage is found before decompressing. Writers
//! compress where they may allocate and write plain chunks where they may not (the recorder's
//! crash path); readers take both, and version 1 logs have only plain chunks.
//!
//! All integers in the fixed parts are little-endian; records inside a payload use LEB128
//! varints with deltas against the previous record (of the same chunk, or of the chunks since
//! the last key chunk). A reader knows exactly where a torn tail begins (the first chunk that
//! is incomplete: only it is lost) and can skip a damaged chunk and carry on with the next key
//! chunk.

mod apis;
mod reader;
mod record;
mod varint;

pub use apis::KNOWN_APIS_V4;

pub use reader::{Damage, DamageKind, Item, LogReader, OpenError, RecordCounts};
pub use record::{
    CodeDef, DeltaState, Dropped, DumpBegin, Event, EventKind, Exit, Frame, HOST_DEVICE, Mark,
    MemInfo, ModuleDef, Note, Record, StackDef, ThreadName, UNKNOWN_DEVICE,
};
pub use varint::{Cursor, DecodeError};

use record::{NO_THREAD, RunWriter, TAG_FREE_REQUESTED};
use varint::{put_bytes, put_u64};

/// First eight bytes of every log.
pub const MAGIC: &[u8; 8] = b"VRAMSHIM";
/// The format version this crate writes and the newest it reads (2: compressed chunks; 3: the
/// graph memory event kinds `graph_alloc`, `graph_free`, `graph_pool`, which older readers do
/// not know; 4: entry-point names as runs of [`KNOWN_APIS_V4`], times in units of the time
/// resolution, one-byte repeats of an event at the same time, compressed chunks without their
/// own records length; 5: runs of same-time repeats, each chunk's thread starting at the pid,
/// modules as one address and two short distances, the recorded environment variables named
/// by their place in [`RECORDED_ENV`]; 6: continued chunks, runs of the last run's cycle; 7: a
/// block's `tensor_free_requested` and `tensor_free` in one record when the second follows the
/// first at once).
pub const FORMAT_VERSION: u32 = 7;
/// The first version of free pairs (one record for a block's `tensor_free_requested` and the
/// `tensor_free` right after it).
pub(crate) const FREE_PAIRS_VERSION: u32 = 7;
/// The first version of continued chunks and of runs of the last cycle.
pub(crate) const CONTINUED_VERSION: u32 = 6;
/// The first version of runs, chunks starting at the pid's thread, short module addresses
/// and environment variables by place.
const RUNS_VERSION: u32 = 5;
/// The first version whose header names entry points by their position in
/// [`KNOWN_APIS_V4`].
const COMPACT_APIS_VERSION: u32 = 4;
/// The first version whose chunks write times in units of the header's time resolution.
const TIME_UNITS_VERSION: u32 = 4;
/// The first version whose compressed chunks are the zstd frame alone (its header holds the
/// records' length); before, the length came first as a `u32`.
pub(crate) const FRAME_SIZE_VERSION: u32 = 4;
/// Marks the start of a plain chunk (chunk markers are what a reader resynchronises on after
/// damage).
pub const CHUNK_MAGIC: [u8; 4] = *b"VSCK";
/// Marks the start of a compressed chunk.
pub const COMPRESSED_CHUNK_MAGIC: [u8; 4] = *b"VSCZ";
/// Bytes before a key chunk's payload.
pub const CHUNK_HEADER_LEN: usize = 12;
/// First byte of a continued chunk of plain records (format version 6). Not `V`: a reader
/// tells it from a key chunk's marker by its first byte.
pub const CONTINUED_CHUNK: u8 = 0xc5;
/// First byte of a continued chunk whose payload is a zstd frame of the records.
pub const CONTINUED_COMPRESSED_CHUNK: u8 = 0xc7;
/// A writer that continues chunks writes a key chunk once this many record bytes (before
/// compression) were written since the last one: a damaged chunk loses at most the chunks up
/// to the next key chunk.
pub const KEY_CHUNK_BYTES: usize = 64 << 10;
/// Larger chunk lengths are treated as damage, never allocated.
pub const MAX_CHUNK_LEN: usize = 64 << 20;
const MAX_HEADER_LEN: usize = 16 << 20;

/// Environment variables whose values are kept in the header (allocator settings and device
/// visibility change what a recording means).
pub const RECORDED_ENV: [&str; 4] = [
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
];

/// Who wrote the log and under which settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub pid: u32,
    pub ppid: u32,
    pub argv: Vec<String>,
    /// Wall-clock start, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    /// `CLOCK_MONOTONIC` at start; event times are relative to it.
    pub start_mono_ns: u64,
    pub hostname: String,
    /// `(name, value)` for each of [`RECORDED_ENV`]; `None` if unset.
    pub env: Vec<(String, Option<String>)>,
    /// Entry-point names; [`Event::api`] indexes this list.
    pub apis: Vec<String>,
    /// `none` or `native` (what `VRAMSHIM_STACK` selected).
    pub stack_mode: String,
    /// `stream` (everything written) or `ring` (flight recorder dumps).
    pub mode: String,
    /// Version of the recorder that wrote the log.
    pub recorder: String,
    /// Resolution of every time in the log, in nanoseconds (`VRAMSHIM_TIME_RESOLUTION`): the
    /// recorder wrote each time rounded down to a multiple of it. 1 (the default) is full
    /// resolution; logs written before the field existed have it.
    pub time_resolution_ns: u64,
}

impl Default for Header {
    /// Every field empty, times at full resolution.
    fn default() -> Header {
        Header {
            version: 0,
            pid: 0,
            ppid: 0,
            argv: Vec::new(),
            start_unix_ns: 0,
            start_mono_ns: 0,
            hostname: String::new(),
            env: Vec::new(),
            apis: Vec::new(),
            stack_mode: String::new(),
            mode: String::new(),
            recorder: String::new(),
            time_resolution_ns: 1,
        }
    }
}

impl Header {
    /// The name of entry point `api`, or `api#N` for an index the header does not list.
    pub fn api_name(&self, api: u16) -> std::borrow::Cow<'_, str> {
        match self.apis.get(usize::from(api)) {
            Some(name) => std::borrow::Cow::Borrowed(name),
            None => std::borrow::Cow::Owned(format!("api#{api}")),
        }
    }

    /// The delta state each chunk of this log starts from (from version 4 on, times are
    /// written in units of the time resolution; before, in nanoseconds whatever it was).
    pub fn chunk_start_state(&self) -> DeltaState {
        let state = if self.version >= TIME_UNITS_VERSION {
            DeltaState::with_time_resolution(self.time_resolution_ns)
        } else {
            DeltaState::default()
        };
        if self.version >= FREE_PAIRS_VERSION {
            state
                .with_first_thread(self.pid)
                .with_runs_again()
                .with_free_pairs()
        } else if self.version >= CONTINUED_VERSION {
            state.with_first_thread(self.pid).with_runs_again()
        } else if self.version >= RUNS_VERSION {
            state.with_first_thread(self.pid)
        } else {
            state.with_absolute_modules()
        }
    }

    /// The recorded value of environment variable `name`.
    pub fn env_value(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_deref())
    }

    /// Serialises the header, magic and checksum included, as [`FORMAT_VERSION`].
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(FORMAT_VERSION)
    }

    /// Serialises the header as format `version` writes it (tests write older logs with it).
    /// Its chunks must hold only records that version knows.
    pub fn encode_as(&self, version: u32) -> Vec<u8> {
        let mut body = Vec::new();
        put_u64(&mut body, u64::from(self.pid));
        put_u64(&mut body, u64::from(self.ppid));
        put_u64(&mut body, self.argv.len() as u64);
        for arg in &self.argv {
            put_bytes(&mut body, arg.as_bytes());
        }
        put_u64(&mut body, self.start_unix_ns);
        put_u64(&mut body, self.start_mono_ns);
        put_bytes(&mut body, self.hostname.as_bytes());
        put_u64(&mut body, self.env.len() as u64);
        for (name, value) in &self.env {
            match RECORDED_ENV.iter().position(|known| known == name) {
                // Its place in the list, from 1: a name the list lacks is spelled out after a 0.
                Some(place) if version >= RUNS_VERSION => put_u64(&mut body, place as u64 + 1),
                _ => {
                    if version >= RUNS_VERSION {
                        put_u64(&mut body, 0);
                    }
                    put_bytes(&mut body, name.as_bytes());
                }
            }
            match value {
                Some(value) => {
                    body.push(1);
                    put_bytes(&mut body, value.as_bytes());
                }
                None => body.push(0),
            }
        }
        put_u64(&mut body, self.apis.len() as u64);
        if version >= COMPACT_APIS_VERSION {
            put_compact_apis(&mut body, &self.apis);
        } else {
            for api in &self.apis {
                put_bytes(&mut body, api.as_bytes());
            }
        }
        put_bytes(&mut body, self.stack_mode.as_bytes());
        put_bytes(&mut body, self.mode.as_bytes());
        put_bytes(&mut body, self.recorder.as_bytes());
        // Appended after the fields of the first version: older readers ignore it.
        put_u64(&mut body, self.time_resolution_ns);

        let mut out = Vec::with_capacity(body.len() + 20);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn decode(version: u32, body: &[u8]) -> Result<Header, DecodeError> {
        let mut cursor = Cursor::new(body);
        let pid = cursor.u32()?;
        let ppid = cursor.u32()?;
        let argc = cursor.u64()?;
        let mut argv = Vec::new();
        for _ in 0..argc {
            argv.push(cursor.string()?);
        }
        let start_unix_ns = cursor.u64()?;
        let start_mono_ns = cursor.u64()?;
        let hostname = cursor.string()?;
        let env_count = cursor.u64()?;
        let mut env = Vec::new();
        for _ in 0..env_count {
            let name = if version >= RUNS_VERSION {
                match cursor.u64()? {
                    0 => cursor.string()?,
                    place => RECORDED_ENV
                        .get(usize::try_from(place - 1).unwrap_or(usize::MAX))
                        .ok_or(DecodeError("recorded environment variable out of range"))?
                        .to_string(),
                }
            } else {
                cursor.string()?
            };
            let value = match cursor.u8()? {
                0 => None,
                _ => Some(cursor.string()?),
            };
            env.push((name, value));
        }
        let api_count = cursor.u64()?;
        let mut apis = Vec::new();
        if version >= COMPACT_APIS_VERSION {
            read_compact_apis(&mut cursor, api_count, &mut apis)?;
        } else {
            for _ in 0..api_count {
                apis.push(cursor.string()?);
            }
        }
        let stack_mode = cursor.string()?;
        let mode = cursor.string()?;
        let recorder = cursor.string()?;
        // Appended fields, each absent from logs written before it existed.
        let time_resolution_ns = if cursor.is_empty() {
            1
        } else {
            match cursor.u64()? {
                0 => return Err(DecodeError("time resolution of 0 ns")),
                ns => ns,
            }
        };
        // Later versions may append fields: anything after this point is ignored.
        Ok(Header {
            version,
            pid,
            ppid,
            argv,
            start_unix_ns,
            start_mono_ns,
            hostname,
            env,
            apis,
            stack_mode,
            mode,
            recorder,
            time_resolution_ns,
        })
    }
}

/// Writes `apis` as entries: `n > 0` then `start`: the `n` names of [`KNOWN_APIS_V4`] from
/// `start` on; `0` then a length-prefixed name: one name the table lacks (or holds out of
/// order). The recorder's names in the table's order cost three bytes.
fn put_compact_apis(body: &mut Vec<u8>, apis: &[String]) {
    let mut at = 0;
    while at < apis.len() {
        let Some(start) = KNOWN_APIS_V4.iter().position(|known| *known == apis[at]) else {
            put_u64(body, 0);
            put_bytes(body, apis[at].as_bytes());
            at += 1;
            continue;
        };
        let run = apis[at..]
            .iter()
            .zip(&KNOWN_APIS_V4[start..])
            .take_while(|(name, known)| name.as_str() == **known)
            .count();
        put_u64(body, run as u64);
        put_u64(body, start as u64);
        at += run;
    }
}

/// Reads what [`put_compact_apis`] wrote: `count` names into `apis`.
fn read_compact_apis(
    cursor: &mut Cursor<'_>,
    count: u64,
    apis: &mut Vec<String>,
) -> Result<(), DecodeError> {
    while (apis.len() as u64) < count {
        let run = cursor.u64()?;
        if run == 0 {
            apis.push(cursor.string()?);
            continue;
        }
        let start = cursor.u64()?;
        let end = start.checked_add(run).filter(|end| {
            *end <= KNOWN_APIS_V4.len() as u64 && *end - start <= count - apis.len() as u64
        });
        let Some(end) = end else {
            return Err(DecodeError("entry-point names out of range"));
        };
        apis.extend(
            KNOWN_APIS_V4[start as usize..end as usize]
                .iter()
                .map(|name| (*name).to_owned()),
        );
    }
    Ok(())
}

/// zstd level of compressed chunks of [`SMALL_LEVEL_BELOW`] record bytes or more. On a
/// recorder log of torch tensor events with mixed stacks (`examples/zstd_levels.rs`), levels 2
/// and 3 saved 4% and 9% more bytes than level 1 for 1.4x and 1.75x its CPU; the writer's time
/// is what the recorder is judged on.
pub const ZSTD_LEVEL: i32 = 1;

/// Chunks of at most this many record bytes are stored compressed whenever that is shorter;
/// larger ones only when it saves a quarter of their bytes.
const SMALL_CHUNK_BYTES: usize = 16 << 10;

/// Chunks of fewer record bytes are compressed at [`SMALL_CHUNK_LEVEL`], larger ones at
/// [`ZSTD_LEVEL`].
const SMALL_LEVEL_BELOW: usize = 16 << 10;

/// zstd level of chunks of fewer than [`SMALL_LEVEL_BELOW`] record bytes: zstd's fast mode with
/// acceleration 2 (its raw literals: no Huffman table, which costs some 40,000 instructions a
/// chunk however short it is, and a match search that skips ahead twice as fast through
/// bytes that do not match). On a mixed-stack torch log (14,617 records, 265,085 bytes of
/// records, `examples/chunk_costs.rs`) in chunks of 84 records: 8.8 M instructions for 149,861
/// bytes at level 1 with raw literals (zstd's `targetLength` 1, the setting before), 7.3 M for
/// 154,213 at this level; in chunks of 168 records 7.5 M for 140,041 before and 6.2 M for
/// 144,777. Chunks of 2,000 records (~33 KiB) keep level 1 and its Huffman table (1.3 M
/// instructions there for 12% of the bytes).
pub const SMALL_CHUNK_LEVEL: i32 = -2;

/// Collects records into one chunk.
pub struct ChunkBuilder {
    payload: Vec<u8>,
    delta: DeltaState,
    runs: RunWriter,
    records: usize,
    /// Created by the first compressed chunk and reused for every later one (a builder that
    /// writes plain chunks only never allocates one).
    compressor: Option<zstd_safe::CCtx<'static>>,
    /// The compressor's level (set for each chunk by its size; 0 before the first).
    level: i32,
    /// Every compressed chunk at this zstd level whatever its size (`vramshim compact`);
    /// `None`: by its size, as the recorder compresses.
    fixed_level: Option<i32>,
    compressed: Vec<u8>,
    /// Chunks may continue the one before them (format 6); off: every chunk is a key chunk.
    continues: bool,
    /// The chunk being built is a key chunk (decided at its first record).
    key: bool,
    /// The next chunk is a key chunk (none written yet, or one was asked for).
    key_due: bool,
    /// Record bytes of the chunks since the last key chunk began (as written: a run's
    /// records cost its few bytes).
    since_key: usize,
    /// A `tensor_free` right after a `tensor_free_requested` of the same block is folded into
    /// its record (format 7); off: each is written on its own.
    free_pairs: bool,
    /// The last record pushed is a `tensor_free_requested` written in full, this many bytes
    /// at the payload's end, that the next record may fold into (0: none).
    open_free: usize,
}

impl Default for ChunkBuilder {
    fn default() -> Self {
        ChunkBuilder {
            payload: Vec::new(),
            delta: DeltaState::default().with_first_thread(NO_THREAD),
            runs: RunWriter::default(),
            records: 0,
            compressor: None,
            level: 0,
            fixed_level: None,
            compressed: Vec::new(),
            continues: false,
            key: true,
            key_due: true,
            since_key: 0,
            free_pairs: true,
            open_free: 0,
        }
    }
}

impl ChunkBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder whose payload holds `bytes` without growing: a caller that closes chunks
    /// below that size appends records without allocating (the recorder's crash path).
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            payload: Vec::with_capacity(bytes),
            ..Self::default()
        }
    }

    /// A builder that writes every time rounded down to a multiple of `ns` nanoseconds (the
    /// header's `time_resolution_ns`; 1: full resolution). Records keep the order they are
    /// pushed in.
    pub fn with_time_resolution(mut self, ns: u64) -> Self {
        self.delta =
            DeltaState::with_time_resolution(ns).with_first_thread(self.delta.first_thread());
        self
    }

    /// A builder whose chunks start their thread at `thread`, as a reader of a log of
    /// [`FORMAT_VERSION`] does (at the header's pid): the first events of the process's main
    /// thread then cost no thread id. Without it, every chunk's first event writes its
    /// thread.
    pub fn with_first_thread(mut self, thread: u32) -> Self {
        self.delta = self.delta.with_first_thread(thread);
        self
    }

    /// A builder whose chunks continue the one before them (format 6) except the first, one
    /// after [`KEY_CHUNK_BYTES`] of records since the last key chunk, and one asked for with
    /// [`ChunkBuilder::request_key`]. Without it, every chunk is a key chunk.
    pub fn with_continued_chunks(mut self) -> Self {
        self.continues = true;
        self
    }

    /// A builder that writes a block's `tensor_free_requested` and `tensor_free` as two records
    /// even when they come together, as format versions before 7 do (for tests that write
    /// older logs).
    pub fn without_free_pairs(mut self) -> Self {
        self.free_pairs = false;
        self
    }

    /// A builder whose compressed chunks are all compressed at zstd level `level` (zstd
    /// clamps it to its range), not at a level chosen by the chunk's size.
    pub fn with_compression_level(mut self, level: i32) -> Self {
        self.fixed_level = Some(level);
        self
    }

    /// The next chunk begun (not one already holding records) is a key chunk.
    pub fn request_key(&mut self) {
        self.key_due = true;
    }

    /// Whether the chunk being built (or the next, when empty) is a key chunk.
    pub fn is_key(&self) -> bool {
        if self.records == 0 {
            !self.continues || self.key_due || self.since_key >= KEY_CHUNK_BYTES
        } else {
            self.key
        }
    }

    /// The first record of a chunk: the chunk is a key chunk (its state starts afresh) or
    /// continues the state the last one ended in.
    fn begin_chunk(&mut self) {
        let key = self.is_key();
        self.key = key;
        if key {
            self.delta = self.delta.restarted();
            self.since_key = 0;
            self.key_due = false;
        } else {
            self.delta = self.delta.continued();
        }
        self.runs = self.runs.next_chunk(key);
    }

    /// Appends one record (a `tensor_free` may join the record before it: a pair is written
    /// only within one chunk, so ending a chunk needs nothing more).
    pub fn push(&mut self, record: &Record) {
        if let Record::Event(event) = record {
            self.push_event(event);
            return;
        }
        if self.records == 0 {
            self.begin_chunk();
        }
        self.open_free = 0;
        let start = self.payload.len();
        self.delta.encode(record, &mut self.payload);
        self.runs.after_record(&mut self.payload, start);
        self.records += 1;
    }

    /// Appends one event record, as [`ChunkBuilder::push`] of a [`Record::Event`] does (the
    /// recorder's writer pushes its events so, without making each a `Record`).
    pub fn push_event(&mut self, event: &Event) {
        if self.records == 0 {
            self.begin_chunk();
        }
        let open_free = std::mem::take(&mut self.open_free);
        if open_free != 0 && self.delta.fold_free(event, open_free, &mut self.payload) {
            self.records += 1;
            return;
        }
        let start = self.payload.len();
        self.delta.encode_event(event, &mut self.payload);
        // A request written in full (not a repeat) stays whole at the payload's end: a run it
        // ends goes before it.
        if self.free_pairs && self.payload.get(start) == Some(&TAG_FREE_REQUESTED) {
            self.open_free = self.payload.len() - start;
        }
        self.runs.after_record(&mut self.payload, start);
        self.records += 1;
    }

    /// Payload bytes so far, a run's records counted as the byte each takes written plainly:
    /// a caller that closes chunks at a payload size bounds the records a chunk holds as
    /// before runs existed (and the payload itself, which is shorter).
    pub fn payload_len(&self) -> usize {
        self.payload.len() + self.runs.saved()
    }

    /// Records so far.
    pub fn records(&self) -> usize {
        self.records
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Appends the finished chunk (header and payload) to `out`, uncompressed, and starts a
    /// new one. Allocates nothing when `out` has room for the chunk.
    pub fn finish_into(&mut self, out: &mut Vec<u8>) {
        if self.records == 0 {
            return;
        }
        self.runs.end(&mut self.payload);
        let payload = std::mem::take(&mut self.payload);
        self.put(out, false, &payload);
        self.payload = payload;
        self.reset();
    }

    /// Appends the finished chunk to `out` compressed (plain if compressing saves less than a
    /// quarter of its bytes) and starts a new one. Allocates: not for a path that must not.
    pub fn finish_compressed_into(&mut self, out: &mut Vec<u8>) {
        if self.records == 0 {
            return;
        }
        self.runs.end(&mut self.payload);
        self.compressed.clear();
        // Room for the worst case, so that the frame is never cut short for want of space.
        self.compressed
            .reserve(zstd_safe::compress_bound(self.payload.len()));
        let level = if let Some(level) = self.fixed_level {
            level
        } else if self.payload.len() < SMALL_LEVEL_BELOW {
            SMALL_CHUNK_LEVEL
        } else {
            ZSTD_LEVEL
        };
        let compressed = match compressor(&mut self.compressor) {
            Some(compressor) => {
                // Should zstd refuse, the chunk is compressed as the last one was.
                if self.level != level
                    && compressor
                        .set_parameter(zstd_safe::CParameter::CompressionLevel(level))
                        .is_ok()
                {
                    self.level = level;
                }
                compressor
                    .compress2(&mut self.compressed, &self.payload)
                    .is_ok()
            }
            None => false,
        };
        if !compressed {
            self.compressed.clear();
        }
        // Decompressing costs the reader time: a chunk that shrinks by less than a quarter
        // is worth more plain, unless it is small (a log's first chunk, its modules and
        // stacks; a few microseconds to decompress): then any byte saved counts.
        let worth_it = if self.payload.len() <= SMALL_CHUNK_BYTES {
            self.compressed.len() < self.payload.len()
        } else {
            self.compressed.len() <= self.payload.len() / 4 * 3
        };
        if !self.compressed.is_empty() && worth_it {
            // The frame's header holds the records' length (zstd writes it for a one-shot
            // compression): nothing else is needed.
            let compressed = std::mem::take(&mut self.compressed);
            self.put(out, true, &compressed);
            self.compressed = compressed;
        } else {
            let payload = std::mem::take(&mut self.payload);
            self.put(out, false, &payload);
            self.payload = payload;
        }
        self.reset();
    }

    /// Appends the chunk of `payload` with the head its kind takes.
    fn put(&self, out: &mut Vec<u8>, compressed: bool, payload: &[u8]) {
        match (self.key, compressed) {
            (true, false) => put_chunk(out, CHUNK_MAGIC, &[payload]),
            (true, true) => put_chunk(out, COMPRESSED_CHUNK_MAGIC, &[payload]),
            (false, false) => put_continued_chunk(out, CONTINUED_CHUNK, payload),
            (false, true) => put_continued_chunk(out, CONTINUED_COMPRESSED_CHUNK, payload),
        }
    }

    /// The chunk is written: the next one starts empty (its state is set by its first record).
    fn reset(&mut self) {
        self.open_free = 0;
        self.since_key = self.since_key.saturating_add(self.payload.len());
        self.payload.clear();
        self.runs = self.runs.next_chunk(false);
        self.records = 0;
    }
}

/// The compression context in `slot`, created on first use (its level set by the caller);
/// `None` when zstd cannot allocate one (the chunk is then written plain).
fn compressor<'a>(
    slot: &'a mut Option<zstd_safe::CCtx<'static>>,
) -> Option<&'a mut zstd_safe::CCtx<'static>> {
    if slot.is_none() {
        *slot = Some(zstd_safe::CCtx::try_create()?);
    }
    slot.as_mut()
}

/// Appends one continued chunk: `kind`, the payload's length (LEB128), a CRC-32 of those bytes
/// and the payload, then the payload. Allocates nothing when `out` has room.
fn put_continued_chunk(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let start = out.len();
    out.push(kind);
    put_u64(out, payload.len() as u64);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[start..]);
    crc.update(payload);
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(payload);
}

/// Where one chunk lies in a log file (see [`chunk_spans`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSpan {
    /// Offset of its first byte.
    pub start: usize,
    /// Bytes before its payload (12 for a key chunk, 6 or more for a continued one).
    pub head: usize,
    /// Bytes of its payload (as stored: compressed or not).
    pub payload: usize,
    /// A key chunk (`VSCK`, `VSCZ`), not a continued one.
    pub key: bool,
    /// The payload is a zstd frame.
    pub compressed: bool,
}

impl ChunkSpan {
    /// Its bytes in the file, head included.
    pub fn len(&self) -> usize {
        self.head + self.payload
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The chunks of the log in `log` (a whole file, header first), in order, by their heads
/// alone (no checksum is checked); stops at the first bytes that do not start a whole chunk.
/// For tools and tests that look at a log's layout.
pub fn chunk_spans(log: &[u8]) -> Vec<ChunkSpan> {
    let mut spans = Vec::new();
    let Some(len) = log.get(12..16) else {
        return spans;
    };
    let mut at = 20 + u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    while let Some(&first) = log.get(at) {
        let (head, payload, key, compressed) = match first {
            CONTINUED_CHUNK | CONTINUED_COMPRESSED_CHUNK => {
                let mut cursor = Cursor::new(&log[at + 1..]);
                let Ok(payload) = cursor.u64() else { break };
                (
                    1 + cursor.pos + 4,
                    payload as usize,
                    false,
                    first == CONTINUED_COMPRESSED_CHUNK,
                )
            }
            _ => {
                let Some(head) = log.get(at..at + CHUNK_HEADER_LEN) else {
                    break;
                };
                let magic = [head[0], head[1], head[2], head[3]];
                if magic != CHUNK_MAGIC && magic != COMPRESSED_CHUNK_MAGIC {
                    break;
                }
                let payload = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
                (
                    CHUNK_HEADER_LEN,
                    payload,
                    true,
                    magic == COMPRESSED_CHUNK_MAGIC,
                )
            }
        };
        let span = ChunkSpan {
            start: at,
            head,
            payload,
            key,
            compressed,
        };
        if at.saturating_add(span.len()) > log.len() {
            break;
        }
        spans.push(span);
        at += span.len();
    }
    spans
}

/// Appends one chunk whose payload is the concatenation of `parts`.
fn put_chunk(out: &mut Vec<u8>, magic: [u8; 4], parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|part| part.len()).sum();
    let mut crc = crc32fast::Hasher::new();
    for part in parts {
        crc.update(part);
    }
    out.extend_from_slice(&magic);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    for part in parts {
        out.extend_from_slice(part);
    }
}

#[cfg(test)]
mod tests;
