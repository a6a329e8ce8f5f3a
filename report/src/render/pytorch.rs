//! PyTorch's memory snapshot (`torch.cuda.memory._snapshot()`), as the memory viewer
//! (pytorch.org/memory_viz, `torch/utils/viz/MemoryViz.js`) and `torch/cuda/_memory_viz.py`
//! read it, written as a stream: JSON (current viewers try JSON first) or a protocol-2 pickle
//! (what `_dump_snapshot()` writes; older viewers and the Python tools read only pickles).
//!
//! ```text
//! { "device_traces": [ [entry, ...] per device ordinal ],
//!   "segments": [ { "device", "address", "total_size", "allocated_size", "active_size",
//!                   "requested_size", "stream", "segment_type", "segment_pool_id",
//!                   "is_expandable", "frames",
//!                   "blocks": [ { "address", "size", "requested_size", "state", "frames" } ] } ],
//!   "allocator_settings": { ... } }
//! entry = { "action", "addr" (oom: "device_free"), "size", "stream", "time_us", "frames" }
//!   (time_us: microseconds since the Unix epoch, as PyTorch records them)
//! segment_pool_id = (0, 0): a tuple in the pickle, a list in JSON
//! frame = { "filename", "line", "name" }, innermost first
//! ```

use std::collections::hash_map::Entry as Slot;
use std::io::{self, Write};
use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::analysis::groups::no_stack_frame;
use crate::analysis::trace::{Action, Entry};
use crate::symbols::SymFrame;

/// Stack `stack` of process `process`: what frames are cached by.
pub type StackKey = (u32, u32);

/// A streaming writer of the values a snapshot is made of. Containers are opened and closed
/// explicitly; inside a dict, each value follows its [`SnapshotWriter::key`].
pub trait SnapshotWriter {
    fn begin_dict(&mut self) -> io::Result<()>;
    fn end_dict(&mut self) -> io::Result<()>;
    fn begin_list(&mut self) -> io::Result<()>;
    fn end_list(&mut self) -> io::Result<()>;
    fn key(&mut self, key: &'static str) -> io::Result<()>;
    /// A string from a small fixed set (action names, states): the pickle shares one copy.
    fn word(&mut self, word: &'static str) -> io::Result<()>;
    fn str(&mut self, value: &str) -> io::Result<()>;
    fn uint(&mut self, value: u64) -> io::Result<()>;
    fn bool(&mut self, value: bool) -> io::Result<()>;
    /// A pair of integers: a 2-tuple in the pickle (as Python writes a tuple), a list in JSON.
    fn pair(&mut self, first: u64, second: u64) -> io::Result<()>;
    /// The frames of a stack: resolved with `resolve` the first time a key is met, then
    /// repeated from a cache (JSON: the text; pickle: a reference to the first copy).
    fn frames(
        &mut self,
        key: StackKey,
        resolve: &mut dyn FnMut() -> Rc<[SymFrame]>,
    ) -> io::Result<()>;
    /// Ends the document and flushes it.
    fn finish(&mut self) -> io::Result<()>;
}

/// What a viewer frame says for a symbolised frame: file (or module), line (or 0), function
/// (or the frame's label). A stack with no frames gets one placeholder frame, so the viewer
/// does not blame PyTorch's history settings.
fn viewer_frames(frames: &[SymFrame]) -> Vec<(String, u64, String)> {
    let placeholder = [no_stack_frame()];
    let frames = if frames.is_empty() {
        &placeholder[..]
    } else {
        frames
    };
    frames
        .iter()
        .map(|frame| {
            (
                frame.file.as_deref().unwrap_or(&frame.module).to_string(),
                frame.line.map_or(0, u64::from),
                frame
                    .function
                    .as_deref()
                    .map_or_else(|| frame.label(), str::to_string),
            )
        })
        .collect()
}

/// Writes one trace entry; `start_unix_ns` is the wall-clock time of replay time 0.
pub fn write_entry(
    out: &mut dyn SnapshotWriter,
    entry: &Entry,
    start_unix_ns: u64,
    resolve: &mut dyn FnMut() -> Rc<[SymFrame]>,
) -> io::Result<()> {
    out.begin_dict()?;
    out.key("action")?;
    out.word(entry.action.name())?;
    if entry.action == Action::Oom {
        out.key("device_free")?;
        out.uint(entry.device_free)?;
    } else {
        out.key("addr")?;
        out.uint(entry.addr)?;
    }
    out.key("size")?;
    out.uint(entry.size)?;
    out.key("stream")?;
    out.uint(entry.stream)?;
    out.key("time_us")?;
    out.uint(start_unix_ns.saturating_add(entry.t_ns) / 1000)?;
    out.key("frames")?;
    out.frames((entry.process, entry.stack), resolve)?;
    out.end_dict()
}

/// A segment live at the end: one of PyTorch's, with its blocks, or any other allocation as
/// a segment holding one active block of its full size.
#[derive(Clone, Debug)]
pub struct Segment {
    pub device: i32,
    pub address: u64,
    pub size: u64,
    pub stream: u64,
    pub process: u32,
    pub stack: u32,
    /// PyTorch's blocks, by address (they tile the segment); empty: one block, all of it.
    pub blocks: Vec<Block>,
    /// Memory outside PyTorch's allocator in a log that has its tensors: the API that
    /// allocated it (cuBLAS's handles, NCCL...), written as the segment's `vramshim_outside`.
    pub outside: Option<String>,
}

/// A block of one of PyTorch's segments.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// The bytes last asked for from the block, as PyTorch keeps them.
    pub requested: u64,
    /// `active_allocated`, `active_pending_free` or `inactive`, as PyTorch names them.
    pub state: &'static str,
    /// The allocating call's stack, for an active block.
    pub stack: Option<u32>,
}

/// Segments larger than this are PyTorch's "large" pool; the rest "small".
const SMALL_SEGMENT_MAX: u64 = 1 << 20;
/// PyTorch's small pool takes segments of exactly this size.
const SMALL_POOL_SEGMENT: u64 = 2 << 20;

/// Writes one segment; `resolve` gives the frames of a stack.
pub fn write_segment(
    out: &mut dyn SnapshotWriter,
    segment: &Segment,
    resolve: &mut dyn FnMut(StackKey) -> Rc<[SymFrame]>,
) -> io::Result<()> {
    let key = (segment.process, segment.stack);
    let whole = [Block {
        address: segment.address,
        size: segment.size,
        requested: segment.size,
        state: "active_allocated",
        stack: Some(segment.stack),
    }];
    let (blocks, small) = if segment.blocks.is_empty() {
        (&whole[..], segment.size <= SMALL_SEGMENT_MAX)
    } else {
        (&segment.blocks[..], segment.size == SMALL_POOL_SEGMENT)
    };
    let sum = |active_only: bool, allocated_only: bool, requested: bool| -> u64 {
        blocks
            .iter()
            .filter(|b| {
                if allocated_only {
                    b.state == "active_allocated"
                } else {
                    !active_only || b.state != "inactive"
                }
            })
            .map(|b| if requested { b.requested } else { b.size })
            .sum()
    };
    out.begin_dict()?;
    out.key("device")?;
    out.uint(u64::try_from(segment.device).unwrap_or(0))?;
    out.key("address")?;
    out.uint(segment.address)?;
    out.key("total_size")?;
    out.uint(segment.size)?;
    out.key("allocated_size")?;
    out.uint(sum(true, true, false))?;
    out.key("active_size")?;
    out.uint(sum(true, false, false))?;
    out.key("requested_size")?;
    out.uint(sum(true, false, true))?;
    out.key("stream")?;
    out.uint(segment.stream)?;
    out.key("segment_type")?;
    out.word(if small { "small" } else { "large" })?;
    out.key("segment_pool_id")?;
    out.pair(0, 0)?;
    out.key("is_expandable")?;
    out.bool(false)?;
    if let Some(api) = &segment.outside {
        out.key("vramshim_outside")?;
        out.str(&format!("outside PyTorch's allocator: {api}"))?;
    }
    out.key("frames")?;
    out.frames(key, &mut || resolve(key))?;
    out.key("blocks")?;
    out.begin_list()?;
    for block in blocks {
        out.begin_dict()?;
        out.key("address")?;
        out.uint(block.address)?;
        out.key("size")?;
        out.uint(block.size)?;
        out.key("requested_size")?;
        out.uint(block.requested)?;
        out.key("state")?;
        out.word(block.state)?;
        out.key("frames")?;
        // An inactive block has no frames of its own: stack 0 is no stack.
        let key = (segment.process, block.stack.unwrap_or(0));
        out.frames(key, &mut || match block.stack {
            Some(_) => resolve(key),
            None => Rc::from(Vec::new()),
        })?;
        out.end_dict()?;
    }
    out.end_list()?;
    out.end_dict()
}

/// A value of `allocator_settings`.
pub enum Setting {
    Text(String),
    Count(u64),
    Flag(bool),
}

pub fn write_settings(
    out: &mut dyn SnapshotWriter,
    settings: &[(&'static str, Setting)],
) -> io::Result<()> {
    out.begin_dict()?;
    for (key, value) in settings {
        out.key(key)?;
        match value {
            Setting::Text(text) => out.str(text)?,
            Setting::Count(count) => out.uint(*count)?,
            Setting::Flag(flag) => out.bool(*flag)?,
        }
    }
    out.end_dict()
}

// ---------------------------------------------------------------------------------------
// JSON

/// Compact JSON, one trace entry or segment per line.
pub struct JsonWriter<W: Write> {
    out: W,
    /// Per open container: whether it holds a value yet.
    open: Vec<bool>,
    /// After a key: the value needs no comma.
    after_key: bool,
    frames: FxHashMap<StackKey, Box<str>>,
    /// Bytes of text in `frames`: it is emptied when they pass [`CACHED_TEXT_MAX`] (a log
    /// can have millions of distinct stacks, each used once or twice).
    cached_bytes: usize,
}

/// Bytes of frame lists [`JsonWriter`] keeps for stacks met again.
const CACHED_TEXT_MAX: usize = 64 << 20;

impl<W: Write> JsonWriter<W> {
    pub fn new(out: W) -> JsonWriter<W> {
        JsonWriter {
            out,
            open: Vec::new(),
            after_key: false,
            frames: FxHashMap::default(),
            cached_bytes: 0,
        }
    }

    /// Separates a value from the one before it. Dicts and lists nested one or two deep (an
    /// entry in a device's list, a segment) start on a line of their own.
    fn value(&mut self) -> io::Result<()> {
        if std::mem::take(&mut self.after_key) {
            return Ok(());
        }
        let depth = self.open.len();
        if let Some(has_value) = self.open.last_mut() {
            if std::mem::replace(has_value, true) {
                self.out.write_all(b",")?;
            }
            if depth <= 3 {
                self.out.write_all(b"\n")?;
            }
        }
        Ok(())
    }

    fn string(&mut self, text: &str) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, text).map_err(io::Error::from)
    }
}

impl<W: Write> SnapshotWriter for JsonWriter<W> {
    fn begin_dict(&mut self) -> io::Result<()> {
        self.value()?;
        self.open.push(false);
        self.out.write_all(b"{")
    }

    fn end_dict(&mut self) -> io::Result<()> {
        self.open.pop();
        self.out.write_all(b"}")
    }

    fn begin_list(&mut self) -> io::Result<()> {
        self.value()?;
        self.open.push(false);
        self.out.write_all(b"[")
    }

    fn end_list(&mut self) -> io::Result<()> {
        self.open.pop();
        self.out.write_all(b"]")
    }

    fn key(&mut self, key: &'static str) -> io::Result<()> {
        let depth = self.open.len();
        if let Some(has_value) = self.open.last_mut()
            && std::mem::replace(has_value, true)
        {
            self.out.write_all(b",")?;
        }
        // The document's own keys start lines.
        if depth == 1 {
            self.out.write_all(b"\n")?;
        }
        self.string(key)?;
        self.out.write_all(b":")?;
        self.after_key = true;
        Ok(())
    }

    fn word(&mut self, word: &'static str) -> io::Result<()> {
        self.str(word)
    }

    fn str(&mut self, value: &str) -> io::Result<()> {
        self.value()?;
        self.string(value)
    }

    fn uint(&mut self, value: u64) -> io::Result<()> {
        self.value()?;
        write!(self.out, "{value}")
    }

    fn bool(&mut self, value: bool) -> io::Result<()> {
        self.value()?;
        self.out.write_all(if value { b"true" } else { b"false" })
    }

    fn pair(&mut self, first: u64, second: u64) -> io::Result<()> {
        self.value()?;
        write!(self.out, "[{first},{second}]")
    }

    fn frames(
        &mut self,
        key: StackKey,
        resolve: &mut dyn FnMut() -> Rc<[SymFrame]>,
    ) -> io::Result<()> {
        self.value()?;
        if !self.frames.contains_key(&key) && self.cached_bytes > CACHED_TEXT_MAX {
            self.frames.clear();
            self.cached_bytes = 0;
        }
        let text = match self.frames.entry(key) {
            Slot::Occupied(known) => known.into_mut(),
            Slot::Vacant(slot) => {
                let list: Vec<serde_json::Value> = viewer_frames(&resolve())
                    .into_iter()
                    .map(|(filename, line, name)| {
                        serde_json::json!({"filename": filename, "line": line, "name": name})
                    })
                    .collect();
                let text = serde_json::to_string(&list).map_err(io::Error::from)?;
                self.cached_bytes += text.len();
                slot.insert(text.into())
            }
        };
        self.out.write_all(text.as_bytes())
    }

    fn finish(&mut self) -> io::Result<()> {
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}

// ---------------------------------------------------------------------------------------
// Pickle (protocol 2), with only the opcodes the viewer's own unpickler knows.

mod op {
    pub const PROTO: u8 = 0x80;
    pub const STOP: u8 = b'.';
    pub const MARK: u8 = b'(';
    pub const EMPTY_DICT: u8 = b'}';
    pub const EMPTY_LIST: u8 = b']';
    pub const SETITEMS: u8 = b'u';
    pub const APPENDS: u8 = b'e';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const LONG1: u8 = 0x8a;
    pub const BINUNICODE: u8 = b'X';
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const TUPLE2: u8 = 0x86;
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
}

/// Items appended per `APPENDS`, as Python's pickler batches them (the viewer's unpickler
/// spreads one batch into one call's arguments, so batches must stay small).
const BATCH: usize = 1000;

/// An open pickle container.
enum Open {
    Dict,
    /// Items since the last `MARK` (0: no mark open).
    List(usize),
}

pub struct PickleWriter<W: Write> {
    out: W,
    open: Vec<Open>,
    next_memo: u32,
    words: FxHashMap<&'static str, u32>,
    frames: FxHashMap<StackKey, u32>,
}

impl<W: Write> PickleWriter<W> {
    pub fn new(mut out: W) -> io::Result<PickleWriter<W>> {
        out.write_all(&[op::PROTO, 2])?;
        Ok(PickleWriter {
            out,
            open: Vec::new(),
            next_memo: 0,
            words: FxHashMap::default(),
            frames: FxHashMap::default(),
        })
    }

    /// Before a value: the first item of a list batch opens a mark.
    fn before(&mut self) -> io::Result<()> {
        if let Some(Open::List(pending)) = self.open.last_mut() {
            if *pending == 0 {
                self.out.write_all(&[op::MARK])?;
            }
            *pending += 1;
        }
        Ok(())
    }

    /// After a value: a full list batch is appended.
    fn after(&mut self) -> io::Result<()> {
        if let Some(Open::List(pending)) = self.open.last_mut()
            && *pending >= BATCH
        {
            *pending = 0;
            self.out.write_all(&[op::APPENDS])?;
        }
        Ok(())
    }

    /// Remembers the value on top of the stack; returns its memo id.
    fn memoize(&mut self) -> io::Result<u32> {
        let id = self.next_memo;
        self.next_memo += 1;
        match u8::try_from(id) {
            Ok(small) => self.out.write_all(&[op::BINPUT, small])?,
            Err(_) => {
                self.out.write_all(&[op::LONG_BINPUT])?;
                self.out.write_all(&id.to_le_bytes())?;
            }
        }
        Ok(id)
    }

    fn recall(&mut self, id: u32) -> io::Result<()> {
        match u8::try_from(id) {
            Ok(small) => self.out.write_all(&[op::BINGET, small]),
            Err(_) => {
                self.out.write_all(&[op::LONG_BINGET])?;
                self.out.write_all(&id.to_le_bytes())
            }
        }
    }

    fn raw_str(&mut self, text: &str) -> io::Result<()> {
        let len = u32::try_from(text.len())
            .map_err(|_| io::Error::other("string too long for a pickle"))?;
        self.out.write_all(&[op::BINUNICODE])?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(text.as_bytes())
    }

    /// A shared copy of a fixed string.
    fn raw_word(&mut self, word: &'static str) -> io::Result<()> {
        match self.words.get(word) {
            Some(&id) => self.recall(id),
            None => {
                self.raw_str(word)?;
                let id = self.memoize()?;
                self.words.insert(word, id);
                Ok(())
            }
        }
    }

    fn raw_uint(&mut self, value: u64) -> io::Result<()> {
        if let Ok(small) = u8::try_from(value) {
            self.out.write_all(&[op::BININT1, small])
        } else if let Ok(medium) = u16::try_from(value) {
            self.out.write_all(&[op::BININT2])?;
            self.out.write_all(&medium.to_le_bytes())
        } else if let Ok(int) = i32::try_from(value) {
            self.out.write_all(&[op::BININT])?;
            self.out.write_all(&int.to_le_bytes())
        } else {
            // Two's complement, little-endian, as few bytes as keep the sign bit clear.
            let bytes = value.to_le_bytes();
            let mut len = 8 - (value.leading_zeros() as usize / 8);
            let mut buffer = [0u8; 9];
            buffer[..8].copy_from_slice(&bytes);
            if buffer[len - 1] & 0x80 != 0 {
                len += 1;
            }
            self.out.write_all(&[op::LONG1, len as u8])?;
            self.out.write_all(&buffer[..len])
        }
    }
}

impl<W: Write> SnapshotWriter for PickleWriter<W> {
    fn begin_dict(&mut self) -> io::Result<()> {
        self.before()?;
        self.open.push(Open::Dict);
        self.out.write_all(&[op::EMPTY_DICT, op::MARK])
    }

    fn end_dict(&mut self) -> io::Result<()> {
        self.open.pop();
        self.out.write_all(&[op::SETITEMS])?;
        self.after()
    }

    fn begin_list(&mut self) -> io::Result<()> {
        self.before()?;
        self.open.push(Open::List(0));
        self.out.write_all(&[op::EMPTY_LIST])
    }

    fn end_list(&mut self) -> io::Result<()> {
        if let Some(Open::List(pending)) = self.open.pop()
            && pending > 0
        {
            self.out.write_all(&[op::APPENDS])?;
        }
        self.after()
    }

    fn key(&mut self, key: &'static str) -> io::Result<()> {
        self.raw_word(key)
    }

    fn word(&mut self, word: &'static str) -> io::Result<()> {
        self.before()?;
        self.raw_word(word)?;
        self.after()
    }

    fn str(&mut self, value: &str) -> io::Result<()> {
        self.before()?;
        self.raw_str(value)?;
        self.after()
    }

    fn uint(&mut self, value: u64) -> io::Result<()> {
        self.before()?;
        self.raw_uint(value)?;
        self.after()
    }

    fn bool(&mut self, value: bool) -> io::Result<()> {
        self.before()?;
        self.out
            .write_all(&[if value { op::NEWTRUE } else { op::NEWFALSE }])?;
        self.after()
    }

    fn pair(&mut self, first: u64, second: u64) -> io::Result<()> {
        self.before()?;
        self.raw_uint(first)?;
        self.raw_uint(second)?;
        self.out.write_all(&[op::TUPLE2])?;
        self.after()
    }

    fn frames(
        &mut self,
        key: StackKey,
        resolve: &mut dyn FnMut() -> Rc<[SymFrame]>,
    ) -> io::Result<()> {
        if let Some(&id) = self.frames.get(&key) {
            self.before()?;
            self.recall(id)?;
            return self.after();
        }
        let frames = viewer_frames(&resolve());
        self.begin_list()?;
        for (filename, line, name) in &frames {
            self.begin_dict()?;
            self.key("filename")?;
            self.str(filename)?;
            self.key("line")?;
            self.uint(*line)?;
            self.key("name")?;
            self.str(name)?;
            self.end_dict()?;
        }
        // Closed by hand: the memo must name the finished list, before its parent counts it.
        if let Some(Open::List(pending)) = self.open.pop()
            && pending > 0
        {
            self.out.write_all(&[op::APPENDS])?;
        }
        let id = self.memoize()?;
        self.frames.insert(key, id);
        self.after()
    }

    fn finish(&mut self) -> io::Result<()> {
        self.out.write_all(&[op::STOP])?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str, line: u32) -> SymFrame {
        SymFrame {
            function: Some(function.into()),
            file: Some(file.into()),
            line: Some(line),
            module: "/bin/app".into(),
            offset: 0x10,
            inlined: false,
        }
    }

    fn document(out: &mut dyn SnapshotWriter) -> io::Result<()> {
        let frames: Rc<[SymFrame]> = vec![frame("f", "a.c", 3)].into();
        out.begin_dict()?;
        out.key("device_traces")?;
        out.begin_list()?;
        out.begin_list()?;
        for index in 0..2500u64 {
            let entry = Entry {
                action: if index % 2 == 0 {
                    Action::Alloc
                } else {
                    Action::Oom
                },
                device: 0,
                addr: 0x7000_0000_0000 + index,
                size: index * 70_000,
                stream: 0,
                t_ns: index * 1500,
                process: 0,
                stack: (index % 3) as u32,
                device_free: 1 << 40,
            };
            write_entry(out, &entry, 1_700_000_000_000_000_000, &mut || {
                frames.clone()
            })?;
        }
        out.end_list()?;
        out.begin_list()?;
        out.end_list()?;
        out.end_list()?;
        out.key("allocator_settings")?;
        write_settings(
            out,
            &[
                ("PYTORCH_CUDA_ALLOC_CONF", Setting::Text("é\"x".to_string())),
                ("trace_alloc_overflowed", Setting::Flag(true)),
            ],
        )?;
        out.end_dict()?;
        out.finish()
    }

    #[test]
    fn json_document_parses() {
        let mut bytes = Vec::new();
        document(&mut JsonWriter::new(&mut bytes)).expect("write");
        let value: serde_json::Value = serde_json::from_slice(&bytes).expect("valid JSON");
        let trace = &value["device_traces"][0];
        assert_eq!(trace.as_array().map(Vec::len), Some(2500));
        assert_eq!(trace[1]["action"], "oom");
        assert_eq!(trace[1]["device_free"], 1u64 << 40);
        assert!(trace[1].get("addr").is_none());
        assert_eq!(trace[2]["addr"], 0x7000_0000_0002u64);
        assert_eq!(trace[2]["time_us"], 1_700_000_000_000_003u64);
        assert_eq!(trace[2]["frames"][0]["name"], "f");
        assert_eq!(value["device_traces"][1], serde_json::json!([]));
        assert_eq!(
            value["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"],
            "é\"x"
        );
    }

    #[test]
    fn pickle_integers_use_the_smallest_opcode() {
        let encode = |value: u64| {
            let mut out = PickleWriter::new(Vec::new()).expect("header");
            out.raw_uint(value).expect("write");
            out.out[2..].to_vec()
        };
        assert_eq!(encode(7), [b'K', 7]);
        assert_eq!(encode(0x1234), [b'M', 0x34, 0x12]);
        assert_eq!(encode(0x7fff_ffff), [b'J', 0xff, 0xff, 0xff, 0x7f]);
        assert_eq!(encode(0x8000_0000), [0x8a, 5, 0, 0, 0, 0x80, 0]);
        assert_eq!(encode(0x7000_0000_0000), [0x8a, 6, 0, 0, 0, 0, 0, 0x70]);
        assert_eq!(
            encode(u64::MAX),
            [0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]
        );
    }

    #[test]
    fn pickle_batches_appends_and_shares_frames() {
        let mut out = PickleWriter::new(Vec::new()).expect("header");
        document(&mut out).expect("write");
        let bytes = out.out;
        assert_eq!(&bytes[..2], &[0x80, 2]);
        assert_eq!(bytes.last(), Some(&b'.'));
        let count = |needle: &[u8]| bytes.windows(needle.len()).filter(|w| *w == needle).count();
        // Keys and actions are written once, then fetched from the memo.
        assert_eq!(count(b"filename"), 1);
        assert_eq!(count(b"free_requested"), 0);
        assert_eq!(count(b"oom"), 1);
        // Three stacks: each one's frames written once.
        assert_eq!(count(b"a.c"), 3);
    }
}
