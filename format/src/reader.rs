//! Streaming decoder: header first, then records chunk by chunk, with damage reported as
//! items in the stream rather than as errors that end it.

use std::fmt;
use std::io::{self, BufReader, Read};

use crate::record::{DeltaState, Event, Record, TAG_FREE_PAIR, is_run};
use crate::varint::Cursor;
use crate::{
    CHUNK_HEADER_LEN, CHUNK_MAGIC, COMPRESSED_CHUNK_MAGIC, CONTINUED_CHUNK,
    CONTINUED_COMPRESSED_CHUNK, CONTINUED_VERSION, FORMAT_VERSION, FRAME_SIZE_VERSION, Header,
    MAGIC, MAX_CHUNK_LEN, MAX_HEADER_LEN,
};

/// Why a log could not be opened at all.
#[derive(Debug)]
pub enum OpenError {
    /// The file does not start with the vramshim magic.
    NotALog,
    /// Written by a newer vramshim than this one understands.
    NewerVersion {
        found: u32,
        supported: u32,
    },
    /// The header is cut short or fails its checksum.
    BadHeader(&'static str),
    Io(io::Error),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NotALog => write!(f, "not a vramshim log (no VRAMSHIM magic at the start)"),
            OpenError::NewerVersion { found, supported } => write!(
                f,
                "log format version {found} is newer than this vramshim understands (up to {supported}); upgrade vramshim"
            ),
            OpenError::BadHeader(why) => write!(f, "damaged log header: {why}"),
            OpenError::Io(err) => write!(f, "{err}"),
        }
    }
}

impl std::error::Error for OpenError {}

/// What kind of damage a reader met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DamageKind {
    /// The file ends inside a chunk (the writer was killed mid-write): `bytes` are unusable.
    TornTail { bytes: u64 },
    /// A chunk does not match its checksum; `len` bytes were skipped, from the chunk's start
    /// up to the next chunk marker (or the end).
    BadChecksum { len: u64 },
    /// Bytes that are not a chunk; skipped up to the next chunk marker (or the end).
    Garbage { bytes: u64 },
    /// A chunk passed its checksum but a record in it did not decode; the rest of the chunk
    /// was skipped.
    BadRecord { reason: &'static str },
    /// The file could not be read further.
    Io { message: String },
    /// Whole continued chunks (format 6) skipped because the chunk before them was damaged
    /// or skipped: they carry on from its state. Reading resumes at the next key chunk.
    ContinuedAfterDamage { chunks: u64, bytes: u64 },
}

/// Damage at a byte offset of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub offset: u64,
    pub kind: DamageKind,
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            DamageKind::TornTail { bytes } => write!(
                f,
                "log ends in an incomplete chunk at byte {} ({bytes} bytes unusable): the recorder was stopped mid-write; everything before is intact",
                self.offset
            ),
            DamageKind::BadChecksum { len } => write!(
                f,
                "damaged chunk at byte {} ({len} bytes, checksum mismatch) skipped",
                self.offset
            ),
            DamageKind::Garbage { bytes } => {
                write!(
                    f,
                    "{bytes} unreadable bytes at byte {} skipped",
                    self.offset
                )
            }
            DamageKind::BadRecord { reason } => write!(
                f,
                "undecodable record in chunk at byte {} ({reason}); rest of that chunk skipped",
                self.offset
            ),
            DamageKind::Io { message } => {
                write!(f, "read error at byte {}: {message}", self.offset)
            }
            DamageKind::ContinuedAfterDamage { chunks, bytes } => write!(
                f,
                "{chunks} continued chunk{} at byte {} ({bytes} bytes) skipped: {} on the damaged chunk before {}; reading resumes at the next key chunk",
                if *chunks == 1 { "" } else { "s" },
                self.offset,
                if *chunks == 1 {
                    "it carries"
                } else {
                    "they carry"
                },
                if *chunks == 1 { "it" } else { "them" },
            ),
        }
    }
}

/// One item of the stream: a record, or a note that something was skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Record(Record),
    Damage(Damage),
}

/// Reads a log as a stream of [`Item`]s. Memory use is one chunk, whatever the log's length.
pub struct LogReader<R: Read> {
    source: Source<R>,
    header: Header,
    /// Offset of the next unread byte of `source`.
    offset: u64,
    chunk: Vec<u8>,
    /// A compressed chunk's payload, kept to reuse its memory.
    compressed: Vec<u8>,
    /// The zstd decompression context, created by the first compressed chunk and reused.
    decompressor: Option<zstd_safe::DCtx<'static>>,
    chunk_offset: u64,
    chunk_pos: usize,
    delta: DeltaState,
    finished: bool,
    /// The delta state is not the one the next continued chunk carries on from (no key chunk
    /// read yet, or damage since): continued chunks are skipped and counted.
    lost: bool,
    /// Continued chunks skipped since the last damage: (offset of the first, count, bytes).
    skipped: Option<(u64, u64, u64)>,
    /// Damage met right after skipped continued chunks, reported after them.
    pending: Option<Damage>,
    /// What the iterator has read so far, record by record.
    counts: RecordCounts,
}

/// Events against the records that hold them, as [`LogReader`]'s iterator read them: a run
/// record or a free pair holds several events (counted when its last event is read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordCounts {
    /// Events read.
    pub events: u64,
    /// Records that held them.
    pub event_records: u64,
    /// Of those, free pairs (format 7): a block's `tensor_free_requested` and `tensor_free`.
    pub free_pairs: u64,
    /// Of those, runs of repeated events (format 5).
    pub runs: u64,
    /// Other records read (stacks, modules, notes, ...).
    pub other_records: u64,
    /// Chunks whose records were read (damaged or skipped ones not counted): how the
    /// writer batched its records (a chunk is sealed when its drains end or it fills).
    pub chunks: u64,
    /// Of those, key chunks (the others continue the chunk before them, format 6).
    pub key_chunks: u64,
    /// Of those, compressed ones (a zstd frame).
    pub compressed_chunks: u64,
}

impl<R: Read> LogReader<R> {
    /// Reads and checks the header.
    pub fn new(source: R) -> Result<Self, OpenError> {
        let mut source = BufReader::with_capacity(1 << 20, source);
        let mut fixed = [0u8; 20];
        let got = read_full(&mut source, &mut fixed).map_err(OpenError::Io)?;
        if got < MAGIC.len() || &fixed[..8] != MAGIC {
            return Err(OpenError::NotALog);
        }
        if got < fixed.len() {
            return Err(OpenError::BadHeader("file ends inside the header"));
        }
        let version = u32::from_le_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]);
        if version > FORMAT_VERSION {
            return Err(OpenError::NewerVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        if version == 0 {
            return Err(OpenError::BadHeader("format version 0"));
        }
        let len = u32::from_le_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]) as usize;
        let crc = u32::from_le_bytes([fixed[16], fixed[17], fixed[18], fixed[19]]);
        if len > MAX_HEADER_LEN {
            return Err(OpenError::BadHeader("header length implausible"));
        }
        let mut body = vec![0u8; len];
        if read_full(&mut source, &mut body).map_err(OpenError::Io)? < len {
            return Err(OpenError::BadHeader("file ends inside the header"));
        }
        if crc32fast::hash(&body) != crc {
            return Err(OpenError::BadHeader("header checksum mismatch"));
        }
        let header = Header::decode(version, &body).map_err(|err| OpenError::BadHeader(err.0))?;
        Ok(LogReader {
            source: Source {
                front: Vec::new(),
                front_pos: 0,
                inner: source,
            },
            offset: (fixed.len() + len) as u64,
            chunk: Vec::new(),
            compressed: Vec::new(),
            decompressor: None,
            chunk_offset: 0,
            chunk_pos: 0,
            delta: header.chunk_start_state(),
            header,
            finished: false,
            lost: true,
            skipped: None,
            pending: None,
            counts: RecordCounts::default(),
        })
    }

    /// The log's header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Bytes consumed so far (for progress display).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads the next chunk into `self.chunk`; returns damage met on the way, if any: the
    /// continued chunks skipped after damage first, then what ended them.
    fn load_chunk(&mut self) -> Option<Damage> {
        let damage = loop {
            let damage = self.load_one_chunk();
            if damage.is_some() {
                self.lost = true;
                break damage;
            }
            // A chunk loaded, the end, or a continued chunk skipped: then the next.
            if !self.chunk.is_empty() || self.finished {
                break None;
            }
        };
        match self.skipped.take() {
            Some((offset, chunks, bytes)) => {
                self.pending = damage;
                Some(Damage {
                    offset,
                    kind: DamageKind::ContinuedAfterDamage { chunks, bytes },
                })
            }
            None => damage,
        }
    }

    /// Reads one chunk into `self.chunk` (left empty for a continued chunk that is skipped);
    /// returns damage met on the way, if any.
    fn load_one_chunk(&mut self) -> Option<Damage> {
        let start = self.offset;
        let mut head = [0u8; CHUNK_HEADER_LEN];
        let got = match read_full(&mut self.source, &mut head[..1]) {
            Ok(got) => got,
            Err(err) => return Some(self.io_damage(err)),
        };
        self.offset += got as u64;
        if got == 0 {
            self.finished = true;
            return None;
        }
        if self.header.version >= CONTINUED_VERSION
            && matches!(head[0], CONTINUED_CHUNK | CONTINUED_COMPRESSED_CHUNK)
        {
            return self.load_continued(start, head[0]);
        }
        let got = match read_full(&mut self.source, &mut head[1..]) {
            Ok(rest) => 1 + rest,
            Err(err) => return Some(self.io_damage(err)),
        };
        self.offset += (got - 1) as u64;
        if got < 4 || !is_chunk_marker(&head[..4]) {
            return Some(self.resync(start, &head[..got]));
        }
        let compressed = head[..4] == COMPRESSED_CHUNK_MAGIC;
        if got < CHUNK_HEADER_LEN {
            self.finished = true;
            return Some(Damage {
                offset: start,
                kind: DamageKind::TornTail { bytes: got as u64 },
            });
        }
        let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let crc = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if len > MAX_CHUNK_LEN {
            return Some(self.resync(start, &head));
        }
        self.chunk.resize(len, 0);
        let got = match read_full(&mut self.source, &mut self.chunk) {
            Ok(got) => got,
            Err(err) => return Some(self.io_damage(err)),
        };
        self.offset += got as u64;
        if got < len {
            // Either the writer was stopped mid-chunk, or the length field itself is damaged
            // and whole chunks follow: a chunk marker in what was read tells them apart.
            let mut consumed = head.to_vec();
            consumed.extend_from_slice(&self.chunk[..got]);
            self.chunk.clear();
            if consumed[1..].windows(4).any(is_chunk_marker) {
                return Some(self.resync(start, &consumed));
            }
            self.finished = true;
            return Some(Damage {
                offset: start,
                kind: DamageKind::TornTail {
                    bytes: consumed.len() as u64,
                },
            });
        }
        if crc32fast::hash(&self.chunk) != crc {
            if self.header.version >= CONTINUED_VERSION && self.next_starts_chunk() {
                // What follows the chunk as its length says is a chunk (or the end): the
                // length is right, and the continued chunks after it can be counted.
                self.chunk.clear();
                return Some(Damage {
                    offset: start,
                    kind: DamageKind::BadChecksum {
                        len: (CHUNK_HEADER_LEN + len) as u64,
                    },
                });
            }
            // The damage may be in the length field: rather than trust it, carry on from the
            // next chunk marker after this chunk's own.
            let mut consumed = head.to_vec();
            consumed.append(&mut self.chunk);
            return Some(self.resync_after_bad_checksum(start, &consumed));
        }
        self.chunk_offset = start;
        self.chunk_pos = 0;
        self.delta = self.header.chunk_start_state();
        self.lost = false;
        if compressed && let Err(reason) = self.decompress_chunk() {
            self.chunk.clear();
            return Some(Damage {
                offset: start,
                kind: DamageKind::BadRecord { reason },
            });
        }
        self.count_chunk(true, compressed);
        None
    }

    /// A continued chunk (format 6) whose first byte, `kind`, was read at `start`: loaded
    /// when the state it carries on from is there, else checked and counted as skipped.
    fn load_continued(&mut self, start: u64, kind: u8) -> Option<Damage> {
        let mut consumed = vec![kind];
        // The payload's length, a LEB128 varint of at most 10 bytes, then the checksum.
        let mut len = 0u64;
        let mut shift = 0;
        loop {
            let mut byte = [0u8; 1];
            match read_full(&mut self.source, &mut byte) {
                Ok(1) => {}
                Ok(_) => return Some(self.torn(start, consumed.len())),
                Err(err) => return Some(self.io_damage(err)),
            }
            self.offset += 1;
            consumed.push(byte[0]);
            if shift < 64 {
                len |= u64::from(byte[0] & 0x7f) << shift;
            }
            shift += 7;
            if byte[0] & 0x80 == 0 {
                break;
            }
            if consumed.len() > 10 {
                return Some(self.resync(start, &consumed));
            }
        }
        if len > MAX_CHUNK_LEN as u64 {
            return Some(self.resync(start, &consumed));
        }
        let head_len = consumed.len() + 4;
        let len = len as usize;
        let mut crc = [0u8; 4];
        self.chunk.resize(len, 0);
        let got = match read_full(&mut self.source, &mut crc).and_then(|got| {
            if got < 4 {
                Ok(got)
            } else {
                read_full(&mut self.source, &mut self.chunk).map(|payload| got + payload)
            }
        }) {
            Ok(got) => got,
            Err(err) => return Some(self.io_damage(err)),
        };
        self.offset += got as u64;
        if got < 4 + len {
            consumed.extend_from_slice(&crc[..got.min(4)]);
            consumed.extend_from_slice(&self.chunk[..got.saturating_sub(4)]);
            self.chunk.clear();
            if consumed[1..].windows(4).any(is_chunk_marker) {
                return Some(self.resync(start, &consumed));
            }
            return Some(self.torn(start, consumed.len()));
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&consumed);
        hasher.update(&self.chunk);
        if hasher.finalize() != u32::from_le_bytes(crc) {
            if self.next_starts_chunk() {
                self.chunk.clear();
                return Some(Damage {
                    offset: start,
                    kind: DamageKind::BadChecksum {
                        len: (head_len + len) as u64,
                    },
                });
            }
            consumed.extend_from_slice(&crc);
            consumed.append(&mut self.chunk);
            return Some(self.resync_after_bad_checksum(start, &consumed));
        }
        if self.lost {
            self.chunk.clear();
            let (_, chunks, bytes) = self.skipped.get_or_insert((start, 0, 0));
            *chunks += 1;
            *bytes += (head_len + len) as u64;
            return None;
        }
        self.chunk_offset = start;
        self.chunk_pos = 0;
        self.delta = self.delta.continued();
        if kind == CONTINUED_COMPRESSED_CHUNK
            && let Err(reason) = self.decompress_chunk()
        {
            self.chunk.clear();
            return Some(Damage {
                offset: start,
                kind: DamageKind::BadRecord { reason },
            });
        }
        self.count_chunk(false, kind == CONTINUED_COMPRESSED_CHUNK);
        None
    }

    /// A chunk loaded whole (its records are read next).
    fn count_chunk(&mut self, key: bool, compressed: bool) {
        self.counts.chunks += 1;
        self.counts.key_chunks += u64::from(key);
        self.counts.compressed_chunks += u64::from(compressed);
    }

    /// The file ends inside the chunk at `start`, of which `bytes` were read.
    fn torn(&mut self, start: u64, bytes: usize) -> Damage {
        self.finished = true;
        Damage {
            offset: start,
            kind: DamageKind::TornTail {
                bytes: bytes as u64,
            },
        }
    }

    /// Whether the next bytes start a chunk (a key chunk's marker or a continued chunk's
    /// first byte) or the file ends there; they stay unread.
    fn next_starts_chunk(&mut self) -> bool {
        let mut next = [0u8; 4];
        let got = match read_full(&mut self.source, &mut next) {
            Ok(got) => got,
            Err(_) => return false,
        };
        self.offset += got as u64;
        let starts = got == 0
            || matches!(next[0], CONTINUED_CHUNK | CONTINUED_COMPRESSED_CHUNK)
            || (got == 4 && is_chunk_marker(&next));
        self.pushback(next[..got].to_vec());
        starts
    }

    /// Replaces the compressed payload in `self.chunk` by the records it holds.
    fn decompress_chunk(&mut self) -> Result<(), &'static str> {
        std::mem::swap(&mut self.chunk, &mut self.compressed);
        let (len, frame) = if self.header.version >= FRAME_SIZE_VERSION {
            // The frame's own header says how many bytes it holds.
            match zstd_safe::get_frame_content_size(&self.compressed) {
                Ok(Some(len)) => (
                    usize::try_from(len).unwrap_or(usize::MAX),
                    &self.compressed[..],
                ),
                Ok(None) => return Err("compressed chunk's frame does not say its length"),
                Err(_) => return Err("compressed chunk does not decompress"),
            }
        } else {
            let Some((len, frame)) = self.compressed.split_first_chunk::<4>() else {
                return Err("compressed chunk too short");
            };
            (u32::from_le_bytes(*len) as usize, frame)
        };
        if len > MAX_CHUNK_LEN {
            return Err("compressed chunk's records length implausible");
        }
        self.chunk.clear();
        // Decompressed in one call into the room the chunk says it needs (the buffer may keep
        // more from an earlier chunk): a frame that holds more bytes than that is damage too.
        self.chunk.reserve_exact(len);
        if self.decompressor.is_none() {
            self.decompressor = zstd_safe::DCtx::try_create();
        }
        let Some(decompressor) = self.decompressor.as_mut() else {
            return Err("no memory to decompress a chunk");
        };
        match decompressor.decompress(&mut self.chunk, frame) {
            Ok(written) if written == len => Ok(()),
            Ok(_) => Err("compressed chunk's records length does not match its frame"),
            Err(_) => Err("compressed chunk does not decompress"),
        }
    }

    /// After a chunk whose checksum failed: skips forward to the next chunk marker (its length
    /// field may be the damage, so it is not trusted), and reports the bytes skipped as that
    /// chunk's damage.
    fn resync_after_bad_checksum(&mut self, start: u64, consumed: &[u8]) -> Damage {
        let damage = self.resync(start, consumed);
        let kind = match damage.kind {
            DamageKind::Garbage { bytes } | DamageKind::TornTail { bytes } => {
                DamageKind::BadChecksum { len: bytes }
            }
            other => other,
        };
        Damage { kind, ..damage }
    }

    /// Skips forward to the next chunk marker. `consumed` are bytes already read at `start`.
    fn resync(&mut self, start: u64, consumed: &[u8]) -> Damage {
        // The marker may begin inside what was already read.
        let mut window: Vec<u8> = consumed.get(1..).unwrap_or_default().to_vec();
        let mut skipped = 1u64;
        loop {
            if let Some(pos) = window.windows(4).position(is_chunk_marker) {
                skipped += pos as u64;
                let rest = window.split_off(pos);
                // Put the marker and what follows back in front of the stream.
                self.pushback(rest);
                break;
            }
            let keep = window.len().saturating_sub(3);
            skipped += keep as u64;
            window.drain(..keep);
            let mut buf = [0u8; 8192];
            match self.source.read(&mut buf) {
                Ok(0) => {
                    skipped += window.len() as u64;
                    self.finished = true;
                    let kind = if skipped < CHUNK_HEADER_LEN as u64 {
                        DamageKind::TornTail { bytes: skipped }
                    } else {
                        DamageKind::Garbage { bytes: skipped }
                    };
                    return Damage {
                        offset: start,
                        kind,
                    };
                }
                Ok(n) => {
                    self.offset += n as u64;
                    window.extend_from_slice(&buf[..n]);
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return self.io_damage(err),
            }
        }
        Damage {
            offset: start,
            kind: DamageKind::Garbage { bytes: skipped },
        }
    }

    /// Re-inserts bytes read ahead during a resync in front of the remaining input.
    fn pushback(&mut self, bytes: Vec<u8>) {
        self.offset -= bytes.len() as u64;
        self.source.unread(bytes);
    }

    fn io_damage(&mut self, err: io::Error) -> Damage {
        self.finished = true;
        Damage {
            offset: self.offset,
            kind: DamageKind::Io {
                message: err.to_string(),
            },
        }
    }
}

impl<R: Read> LogReader<R> {
    /// Loads chunks until one has records left to read: Ok(false) at the end of the log, the
    /// damage met on the way as an error.
    #[inline]
    fn ready(&mut self) -> Result<bool, Damage> {
        loop {
            if self.chunk_pos < self.chunk.len() {
                return Ok(true);
            }
            if let Some(damage) = self.pending.take() {
                return Err(damage);
            }
            if self.finished {
                return Ok(false);
            }
            self.chunk.clear();
            self.chunk_pos = 0;
            if let Some(damage) = self.load_chunk() {
                return Err(damage);
            }
        }
    }

    /// A record of the current chunk did not decode: the rest of the chunk is skipped.
    #[cold]
    fn bad_record(&mut self, reason: &'static str) -> Damage {
        self.chunk_pos = self.chunk.len();
        self.lost = true;
        Damage {
            offset: self.chunk_offset,
            kind: DamageKind::BadRecord { reason },
        }
    }

    /// What the iterator ([`Iterator::next`], not [`LogReader::next_into`]) has read so far;
    /// its chunk counts are both's (a chunk is counted as it loads).
    pub fn counts(&self) -> RecordCounts {
        self.counts
    }

    /// The event that the next record repeats, when it is a repeat in the chunk being read
    /// that will decode (see [`DeltaState::peek_repeat`]); reads nothing. Its time is not
    /// given.
    #[inline(always)]
    pub fn peek_repeat(&self) -> Option<&Event> {
        self.delta.peek_repeat(self.chunk.get(self.chunk_pos..)?)
    }

    /// Reads the next record when it is a repeat in the chunk being read that decodes (see
    /// [`DeltaState::read_repeat`]), as [`LogReader::next_into`] would, without copying its
    /// event: the slot where [`LogReader::repeated`] finds it, at the repeat's time. None, and
    /// nothing read, for any other record.
    #[inline(always)]
    pub fn next_repeat(&mut self) -> Option<usize> {
        let mut cursor = Cursor::new(&self.chunk);
        cursor.pos = self.chunk_pos;
        let slot = self.delta.read_repeat(&mut cursor)?;
        self.chunk_pos = cursor.pos;
        Some(slot)
    }

    /// The event that the repeat [`LogReader::next_repeat`] read last gave as `slot`.
    #[inline(always)]
    pub fn repeated(&self, slot: usize) -> Option<&Event> {
        self.delta.kept(slot)
    }

    /// Like [`Iterator::next`], but decodes into `record` (overwritten; an event in place,
    /// with no copy of it on the way): `Some(Ok(()))` when it now holds the next record,
    /// `Some(Err(damage))` when damage came first (`record` then holds anything), None at the
    /// end. For readers of millions of events.
    #[inline(always)]
    pub fn next_into(&mut self, record: &mut Record) -> Option<Result<(), Damage>> {
        match self.ready() {
            Ok(true) => {}
            Ok(false) => return None,
            Err(damage) => return Some(Err(damage)),
        }
        let mut cursor = Cursor::new(&self.chunk);
        cursor.pos = self.chunk_pos;
        Some(match self.delta.decode_into(&mut cursor, record) {
            Ok(()) => {
                self.chunk_pos = cursor.pos;
                Ok(())
            }
            Err(err) => Err(self.bad_record(err.0)),
        })
    }
}

impl<R: Read> Iterator for LogReader<R> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        match self.ready() {
            Ok(true) => {}
            Ok(false) => return None,
            Err(damage) => return Some(Item::Damage(damage)),
        }
        let mut cursor = Cursor::new(&self.chunk);
        cursor.pos = self.chunk_pos;
        let tag = self.chunk[self.chunk_pos];
        Some(match self.delta.decode(&mut cursor) {
            Ok(record) => {
                // A record that holds several events leaves the cursor on itself until its
                // last one.
                let whole = cursor.pos != self.chunk_pos;
                self.chunk_pos = cursor.pos;
                let counts = &mut self.counts;
                if matches!(record, Record::Event(_)) {
                    counts.events += 1;
                    if whole {
                        counts.event_records += 1;
                        counts.free_pairs += u64::from(tag == TAG_FREE_PAIR);
                        counts.runs += u64::from(is_run(tag));
                    }
                } else {
                    counts.other_records += 1;
                }
                Item::Record(record)
            }
            Err(err) => Item::Damage(self.bad_record(err.0)),
        })
    }
}

fn is_chunk_marker(bytes: &[u8]) -> bool {
    bytes == CHUNK_MAGIC || bytes == COMPRESSED_CHUNK_MAGIC
}

fn read_full(source: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match source.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(filled)
}

/// The input with room for bytes put back after looking ahead for a chunk marker.
struct Source<R> {
    front: Vec<u8>,
    front_pos: usize,
    inner: BufReader<R>,
}

impl<R: Read> Source<R> {
    fn unread(&mut self, bytes: Vec<u8>) {
        let mut front = bytes;
        front.extend_from_slice(&self.front[self.front_pos..]);
        self.front = front;
        self.front_pos = 0;
    }
}

impl<R: Read> Read for Source<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.front_pos < self.front.len() {
            let n = (self.front.len() - self.front_pos).min(buf.len());
            buf[..n].copy_from_slice(&self.front[self.front_pos..self.front_pos + n]);
            self.front_pos += n;
            return Ok(n);
        }
        self.inner.read(buf)
    }
}
