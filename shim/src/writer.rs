//! The consumer side: drains every thread's ring up to the watermark, writes definitions and
//! events in time order as checksummed chunks, and owns the log file.

use std::ffi::{CString, OsString, c_int};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

use vramshim_format::{ChunkBuilder, Dropped, Event, EventKind, Mark, MemInfo, Record, ThreadName};

use crate::flight::Window;
use crate::process;
use crate::ring::{
    ENTERING, IDLE, MergeKey, Ring, Run, SLOT_MEM_INFO, Slot, for_each_in_time_order,
};
use crate::sync::Lock;

/// Why a flush runs; decides the watermark and whether to wait for the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushKind {
    /// The writer thread's periodic drain.
    Periodic,
    /// A failed allocation: write now and wait for it.
    Now,
    /// A producer's ring is full.
    MakeRoom,
    /// Exit, exec: write everything, whatever other threads are doing.
    Final,
    /// A fatal signal: like `Final`, but never wait long for a lock, and never allocate or
    /// free (the crashed thread may hold the heap's locks): only what fits in the buffers
    /// allocated when the log was opened is written.
    Crash,
}

/// The open log.
pub struct Output {
    fd: c_int,
    pub path: OsString,
    start_mono_ns: u64,
    /// Bytes in the file so far (kept under the file-size limit).
    written: u64,
    out: Vec<u8>,
    chunk: ChunkBuilder,
    /// Drained slots, ring after ring. Its capacity bounds a crash flush.
    batch: Vec<Slot>,
    /// The batch's stretches in time order, each of one thread. Its capacity bounds a crash
    /// flush too.
    runs: Vec<Run>,
    /// Scratch of the merge of many runs (as long as the batch can be in a crash flush).
    merge_keys: Vec<MergeKey>,
    write_failed: bool,
    /// A crash flush is running: no formatted (allocating) warning.
    crashing: bool,
    /// `VRAMSHIM_COMPRESS=1`: chunks are compressed here (else written plain).
    compress: bool,
    /// Flight-recorder mode: events go to this window, not to the file.
    pub window: Option<Window>,
    /// When the chunk being built got its first record (monotonic ns; 0: it is empty).
    chunk_opened_ns: u64,
    /// When the last key chunk got its first record (monotonic ns).
    key_opened_ns: u64,
}

static OUTPUT: Lock<Option<Output>> = Lock::new(None);
static RINGS: Lock<Vec<Arc<Ring>>> = Lock::new(Vec::new());
static DEFS: Lock<Vec<Record>> = Lock::new(Vec::new());
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The open log's descriptor (-1 = none), for a fork child to close without a lock.
static LOG_FD: AtomicI32 = AtomicI32::new(-1);
/// The open log's start on the monotonic clock, for records stamped outside the writer.
static START_MONO_NS: AtomicU64 = AtomicU64::new(0);
/// The exit record is written (or being written): never twice.
static EXIT_WRITTEN: AtomicBool = AtomicBool::new(false);
/// When the chunk a busy flush left open must be written (monotonic ns; 0: none is open), so
/// that the writer thread wakes for it.
static OPEN_CHUNK_DUE_NS: AtomicU64 = AtomicU64::new(0);
/// A flush that drained at least this many events leaves its chunk open for the next ones
/// (for at most one flush interval: what it holds is at most two intervals old when it is
/// written, the bound a SIGKILL in a busy stretch is documented with): a busy loop's
/// drains, a few thousand events apart, and a training loop's, some 80 tensor events every
/// 50 ms, then share a chunk instead of paying a chunk's fixed costs each (its head, a zstd
/// frame and its tables, its first event in full). A mixed-stack torch log re-chunked
/// (`format/examples/chunk_costs.rs`, under callgrind) in chunks of 168 records instead of 84:
/// zstd 7.3 M -> 6.2 M instructions, the chunks 153,548 -> 143,067 bytes. Quieter recordings
/// write every flush's chunk at once, as before.
const KEEP_OPEN_EVENTS: usize = 64;
/// A chunk begun this long after the last key chunk is a key chunk too (others continue the
/// chunk before them, format 6): damage loses at most the chunks up to the next key chunk,
/// about a second of recording (or `KEY_CHUNK_BYTES` of records, whichever comes first).
const KEY_CHUNK_NS: u64 = 1_000_000_000;
/// Longer mark texts are cut to this many bytes.
const MARK_TEXT_MAX: usize = 4096;
/// Chunks are closed at this payload size.
const CHUNK_BYTES: usize = 256 << 10;
/// More than any one record encodes to (a stack of 256 native and 64 Python frames, a
/// module with a `PATH_MAX` path): a chunk payload never outgrows `CHUNK_BYTES` plus this.
const RECORD_HEADROOM: usize = 64 << 10;
/// Drained slots a crash flush can hold (beyond them it gives up: the rest stays unwritten).
const BATCH_SLOTS: usize = 16 << 10;
/// Runs of drained slots in time order a crash flush can hold: a run per recording thread,
/// and one more each time a thread's slots go back in time (beyond them it gives up too).
const BATCH_RUNS: usize = 1 << 10;

/// Queues a definition (stack, module, thread name, note): written before the next events.
pub fn define(record: Record) {
    DEFS.lock().push(record);
}

pub fn count_dropped() {
    DROPPED.fetch_add(1, Ordering::Relaxed);
}

/// Queues the program's annotation `text` (cut to [`MARK_TEXT_MAX`] bytes) as a `mark`
/// stamped now, by thread `tid`. Returns whether it was queued: not when the queue stays
/// taken for 100 ms (or by this very thread), so it never waits long.
pub fn mark(tid: u32, text: &[u8]) -> bool {
    let t_ns = process::now_ns().saturating_sub(START_MONO_NS.load(Ordering::Acquire));
    let mut end = text.len().min(MARK_TEXT_MAX);
    // Cut on a character boundary (a lossy decode keeps whatever was not UTF-8 visible).
    while end > 0 && end < text.len() && (text[end] & 0xc0) == 0x80 {
        end -= 1;
    }
    let text = String::from_utf8_lossy(&text[..end]).into_owned();
    let record = Record::Mark(Mark {
        t_ns,
        thread: tid,
        text,
    });
    match DEFS.try_lock_for(Duration::from_millis(100)) {
        Some(mut defs) => {
            defs.push(record);
            true
        }
        None => false,
    }
}

/// Adds a thread's new ring to those the writer drains.
pub fn add_ring(ring: Arc<Ring>) {
    RINGS.lock().push(ring);
}

/// Names thread `tid` in the log (again, when it renamed itself: the report keeps the last).
pub fn name_thread(tid: u32, name: String) {
    define(Record::ThreadName(ThreadName { thread: tid, name }));
}

/// Called when a thread that recorded exits: its ring is written out and then freed.
pub fn release_thread_ring(ring: *const Ring) {
    let ring = unsafe { Arc::from_raw(ring) };
    ring.in_progress.store(IDLE, Ordering::Release);
    ring.orphaned.store(true, Ordering::Release);
}

/// Installs the opened log.
pub fn install(output: Output) {
    START_MONO_NS.store(output.start_mono_ns, Ordering::Release);
    LOG_FD.store(output.fd, Ordering::Release);
    *OUTPUT.lock() = Some(output);
}

/// Why [`open_log`] made no log.
pub enum OpenError {
    /// Something (a file, a link, a FIFO, ...) is already at the path.
    Exists,
    /// Anything else, said in words.
    Failed(String),
}

/// Creates `path` as a new log: atomically, never through a symlink, never opening what is
/// already there (`O_EXCL`: an existing FIFO or device is not opened, so nothing blocks),
/// mode 0600. `pid` is the header's: every chunk starts its thread there.
pub fn open_log(
    path: &OsString,
    header: &[u8],
    pid: u32,
    start_mono_ns: u64,
    ring_events: Option<usize>,
) -> Result<Output, OpenError> {
    let cpath = CString::new(path.as_bytes())
        .map_err(|_| OpenError::Failed("the path contains a NUL byte".to_owned()))?;
    let fd = unsafe {
        libc::open(
            cpath.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return Err(if err.raw_os_error() == Some(libc::EEXIST) {
            OpenError::Exists
        } else {
            OpenError::Failed(err.to_string())
        });
    }
    // Held while the log is written (released when the process ends, however it ends):
    // `vramshim compact` leaves a log alone while its writer may still append to it. A file
    // system without locks just goes without.
    unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
    if let Err(why) = write_within_limit(fd, 0, header) {
        // The file is ours and holds nothing readable: take it away again.
        unsafe {
            libc::close(fd);
            libc::unlink(cpath.as_ptr());
        }
        return Err(OpenError::Failed(why.to_string()));
    }
    Ok(Output {
        fd,
        path: path.clone(),
        start_mono_ns,
        written: header.len() as u64,
        out: Vec::with_capacity(CHUNK_BYTES + 2 * RECORD_HEADROOM),
        // Times are rounded to the resolution only as they are encoded: the merge of the
        // threads' rings (`flush_locked`) orders them at full resolution.
        chunk: ChunkBuilder::with_capacity(CHUNK_BYTES + RECORD_HEADROOM)
            .with_time_resolution(crate::process::config().time_resolution_ns)
            .with_first_thread(pid)
            .with_continued_chunks(),
        batch: Vec::with_capacity(BATCH_SLOTS),
        runs: Vec::with_capacity(BATCH_RUNS),
        merge_keys: Vec::with_capacity(BATCH_SLOTS),
        write_failed: false,
        crashing: false,
        compress: crate::process::config().compress,
        window: ring_events.map(Window::new),
        chunk_opened_ns: 0,
        key_opened_ns: 0,
    })
}

/// What the thing at `path` is, in words, when it is not a regular file (`lstat`: a symlink
/// is not followed); `None` for a regular file or nothing.
pub fn special_file_kind(path: &OsString) -> Option<&'static str> {
    let cpath = CString::new(path.as_bytes()).ok()?;
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::lstat(cpath.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    kind_of(stat.st_mode)
}

/// `None` for a regular file, else what it is.
fn kind_of(mode: libc::mode_t) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFLNK => Some("a symbolic link"),
        libc::S_IFIFO => Some("a FIFO"),
        libc::S_IFCHR => Some("a character device"),
        libc::S_IFBLK => Some("a block device"),
        libc::S_IFSOCK => Some("a socket"),
        libc::S_IFDIR => Some("a directory"),
        _ => Some("not a regular file"),
    }
}

/// `RLIMIT_FSIZE` in bytes, or `None` when unlimited (or unreadable).
fn file_size_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(limit.rlim_cur)
}

/// Writes all of `bytes` at offset `size` of `fd`, or nothing when that would pass the
/// file-size limit: a write past it raises SIGXFSZ, which kills the program. EFBIG (the
/// limit lowered meanwhile with SIGXFSZ ignored, or the file system's own maximum) says the
/// same.
fn write_within_limit(fd: c_int, size: u64, bytes: &[u8]) -> Result<(), WriteError> {
    if let Some(limit) = file_size_limit()
        && size.saturating_add(bytes.len() as u64) > limit
    {
        return Err(WriteError::SizeLimit(limit));
    }
    write_all(fd, bytes).map_err(|err| match (err.raw_os_error(), file_size_limit()) {
        (Some(libc::EFBIG), Some(limit)) => WriteError::SizeLimit(limit),
        _ => WriteError::Io(err),
    })
}

/// Why a chunk was not written. Built without allocating (the crash path writes too).
enum WriteError {
    SizeLimit(u64),
    Io(std::io::Error),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::SizeLimit(limit) => write!(
                f,
                "the file size limit (ulimit -f) of {limit} bytes is reached"
            ),
            WriteError::Io(err) => err.fmt(f),
        }
    }
}

fn write_all(fd: c_int, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// The time below which no thread can still produce an event, or `None` if a thread is
/// between announcing its entry and reading the clock for too long (try again later).
fn watermark(rings: &[Arc<Ring>]) -> Option<u64> {
    let mut watermark = process::now_ns();
    for ring in rings {
        let mut spins = 0u32;
        loop {
            match ring.in_progress.load(Ordering::SeqCst) {
                ENTERING => {
                    spins += 1;
                    if spins > 2000 {
                        return None;
                    }
                    std::thread::yield_now();
                }
                IDLE => break,
                since => {
                    watermark = watermark.min(since);
                    break;
                }
            }
        }
    }
    Some(watermark)
}

/// Whether the calling thread holds one of the shim's locks: it was interrupted (by a signal
/// whose handler now flushes or exits) inside the shim, and must not wait for itself.
pub fn busy_on_this_thread() -> bool {
    crate::sync::any_taken_here()
}

/// Drains rings and writes what is ready. A thread that is already inside the writer (a
/// signal handler interrupted its flush) does nothing: what it was writing stays unwritten.
pub fn flush(kind: FlushKind) {
    if busy_on_this_thread() {
        return;
    }
    let mut guard = match kind {
        FlushKind::Crash => match OUTPUT.try_lock_for(Duration::from_millis(500)) {
            Some(guard) => guard,
            None => return,
        },
        _ => OUTPUT.lock(),
    };
    if let Some(output) = guard.as_mut() {
        output.crashing = kind == FlushKind::Crash;
        flush_locked(output, kind, true);
        output.crashing = false;
    }
}

/// Drains and writes; `finish`: false leaves the last chunk open for a record to follow (a
/// crash's chunk is always written).
fn flush_locked(output: &mut Output, kind: FlushKind, finish: bool) {
    let crash = kind == FlushKind::Crash;
    {
        let mut rings = match kind {
            FlushKind::Crash => match RINGS.try_lock_for(Duration::from_millis(200)) {
                Some(rings) => rings,
                None => return,
            },
            _ => RINGS.lock(),
        };
        let watermark = match kind {
            FlushKind::Final | FlushKind::Crash => Some(u64::MAX),
            _ => watermark(&rings),
        };
        let Some(watermark) = watermark else { return };
        output.batch.clear();
        output.runs.clear();
        // A crash flush takes only what the batch, its runs and the merge's keys hold without
        // growing (the batch may have grown past the keys in an earlier flush).
        let (limit, run_limit) = if crash {
            (
                output.batch.capacity().min(output.merge_keys.capacity()),
                output.runs.capacity(),
            )
        } else {
            (usize::MAX, usize::MAX)
        };
        for ring in rings.iter() {
            ring.drain_before(
                watermark,
                &mut output.batch,
                &mut output.runs,
                limit,
                run_limit,
            );
        }
        // Threads that exited and whose events are all out: forget their rings (not in a
        // crash: that frees memory).
        if !crash {
            rings.retain(|ring| !(ring.orphaned.load(Ordering::Acquire) && ring.is_empty()));
        }
    }
    // Definitions are queued before the events that use them, so taking them after the drain
    // covers every drained event. A crash writes them and leaks them (freeing is not safe
    // there), and goes on without them when another thread holds the queue.
    let defs = if crash {
        DEFS.try_lock_for(Duration::from_millis(100))
            .map(|mut defs| std::mem::take(&mut *defs))
            .unwrap_or_default()
    } else {
        std::mem::take(&mut *DEFS.lock())
    };
    // The batch's runs (each ring's slots, in time order) are merged as they are written,
    // same-time slots in the order drained (a thread's own order): `for_each_in_time_order`.
    // Sorting the batch itself moved each slot (with its thread and place) several times and
    // allocated the sort's scratch: ~52 instructions a tensor event of a torch training
    // loop's, of ~167 the drain cost in all (callgrind, `flush_locked` less `push_event` and
    // `finish_chunk`).
    let dropped = DROPPED.swap(0, Ordering::Relaxed);

    for record in &defs {
        push_record(output, record);
    }
    if crash {
        std::mem::forget(defs);
    } else {
        drop(defs);
    }
    if dropped > 0 {
        let t_ns = process::now_ns().saturating_sub(output.start_mono_ns);
        push_record(
            output,
            &Record::Dropped(Dropped {
                t_ns,
                count: dropped,
            }),
        );
    }
    // Taken out while written (and put back, buffers kept): the records go to `output`.
    let batch = std::mem::take(&mut output.batch);
    let runs = std::mem::take(&mut output.runs);
    let mut merge_keys = std::mem::take(&mut output.merge_keys);
    let busy = batch.len() >= KEEP_OPEN_EVENTS;
    let start = output.start_mono_ns;
    if crash && let Some(mut window) = output.window.take() {
        // The flight recorder's dump without allocating: the window as it is, then the
        // events drained now.
        let t_ns = process::now_ns().saturating_sub(start);
        window.crash_dump(t_ns, batch.len(), |record| push_record(output, record));
        for_each_in_time_order(&batch, &runs, &mut merge_keys, |tid, slot| {
            push_record(output, &slot_record(tid, slot, start));
        });
        output.window = Some(window);
        output.batch = batch;
        output.runs = runs;
        output.merge_keys = merge_keys;
        finish_chunk(output);
        return;
    }
    if let Some(window) = output.window.as_mut() {
        for_each_in_time_order(&batch, &runs, &mut merge_keys, |tid, slot| {
            window.push(&slot_record(tid, slot, start));
        });
    } else {
        // The stream's events go to the chunk as they are, not each made a `Record` first.
        for_each_in_time_order(&batch, &runs, &mut merge_keys, |tid, slot| {
            if slot.tag == SLOT_MEM_INFO {
                push_record(output, &slot_record(tid, slot, start));
            } else {
                push_event(output, &slot_event(tid, slot, start));
            }
        });
    }
    output.batch = batch;
    output.runs = runs;
    output.merge_keys = merge_keys;
    // A dump asked for (dump signal, failed allocation) is written even when the process
    // ends before the writer thread's next turn, and before the dump at exit.
    let requested = crate::flight::take_request().map(|request| match request {
        crate::flight::Request::Signal => process::config().dump_signal_name(),
        crate::flight::Request::AllocFailed => "alloc_failed",
    });
    let at_end = (kind == FlushKind::Final).then_some("exit");
    let dumping = requested.is_some() || at_end.is_some();
    for reason in [requested, at_end].into_iter().flatten() {
        let t_ns = process::now_ns().saturating_sub(output.start_mono_ns);
        // Encoded record by record: a copy of the whole window would double its memory.
        if let Some(window) = output.window.take() {
            window.dump(reason, t_ns, |record| push_record(output, record));
            output.window = Some(window);
        }
    }
    let routine = matches!(kind, FlushKind::Periodic | FlushKind::MakeRoom);
    if routine && busy && !dumping && !output.chunk.is_empty() {
        let keep_ns = process::config().flush_ms.saturating_mul(1_000_000);
        let due = output.chunk_opened_ns.saturating_add(keep_ns);
        if process::now_ns() < due {
            OPEN_CHUNK_DUE_NS.store(due, Ordering::Release);
            return;
        }
    }
    if finish {
        finish_chunk(output);
    }
}

/// How long the writer thread may sleep: `interval`, or less when a chunk left open is due
/// before then.
pub fn next_wait(interval: Duration) -> Duration {
    match OPEN_CHUNK_DUE_NS.load(Ordering::Acquire) {
        0 => interval,
        due => interval.min(Duration::from_nanos(
            due.saturating_sub(process::now_ns()).max(1),
        )),
    }
}

fn slot_record(tid: u32, slot: &Slot, start: u64) -> Record {
    let t_ns = slot.t_ns.saturating_sub(start);
    if slot.tag == SLOT_MEM_INFO {
        return Record::MemInfo(MemInfo {
            t_ns,
            device: slot.device,
            free: slot.aux[0],
            total: slot.aux[1],
        });
    }
    Record::Event(slot_event(tid, slot, start))
}

/// An event slot's event (not a [`SLOT_MEM_INFO`] slot's).
#[inline]
fn slot_event(tid: u32, slot: &Slot, start: u64) -> Event {
    Event {
        kind: EventKind::from_code(slot.kind).unwrap_or_default(),
        api: slot.api,
        t_ns: slot.t_ns.saturating_sub(start),
        thread: tid,
        device: slot.device,
        stream: slot.stream,
        addr: slot.addr,
        size: slot.size,
        handle: slot.handle,
        result: slot.result,
        stack: slot.stack,
        mem_info: slot.has_mem_info.then_some((slot.aux[0], slot.aux[1])),
    }
}

fn push_record(output: &mut Output, record: &Record) {
    open_chunk_if_empty(output);
    output.chunk.push(record);
    close_chunk_if_full(output);
}

/// [`push_record`] of an event, without making it a [`Record`].
fn push_event(output: &mut Output, event: &Event) {
    open_chunk_if_empty(output);
    output.chunk.push_event(event);
    close_chunk_if_full(output);
}

/// Before a record is pushed: a chunk begun now is stamped, and is a key chunk when the last
/// one began long enough ago.
#[inline]
fn open_chunk_if_empty(output: &mut Output) {
    if output.chunk.is_empty() {
        let now = process::now_ns();
        output.chunk_opened_ns = now;
        if now.saturating_sub(output.key_opened_ns) >= KEY_CHUNK_NS {
            output.chunk.request_key();
        }
        if output.chunk.is_key() {
            output.key_opened_ns = now;
        }
    }
}

/// After a record is pushed: the chunk is sealed once it holds [`CHUNK_BYTES`].
#[inline]
fn close_chunk_if_full(output: &mut Output) {
    if output.chunk.payload_len() >= CHUNK_BYTES {
        finish_chunk(output);
    }
}

fn finish_chunk(output: &mut Output) {
    OPEN_CHUNK_DUE_NS.store(0, Ordering::Release);
    if output.compress && !output.crashing {
        output.chunk.finish_compressed_into(&mut output.out);
    } else {
        // Plain by default: zstd cost the writer ~290 instructions a tensor event on the torch
        // steps (issue 12), compressing after the program exits costs the program nothing.
        // Compressing allocates too: a crash writes its chunk plain, into the buffer set aside.
        output.chunk.finish_into(&mut output.out);
    }
    if output.out.is_empty() {
        return;
    }
    // `out` holds whole chunks: written entirely or not at all, so the log stays readable up
    // to the last chunk written.
    if !output.write_failed {
        match write_within_limit(output.fd, output.written, &output.out) {
            Ok(()) => output.written += output.out.len() as u64,
            Err(why) => {
                output.write_failed = true;
                if output.crashing {
                    // No formatting (it allocates) on the crash path.
                    crate::warn_static("vramshim: cannot write the log at the crash\n");
                } else {
                    crate::warn(&format!(
                        "cannot write to {}: {why}; recording stops here (what was written \
                         stays readable)",
                        output.path.to_string_lossy()
                    ));
                }
            }
        }
    }
    output.out.clear();
}

/// Writes everything buffered, then `text` as a note stamped now (so it follows every event
/// that happened before it, as the exec note must).
pub fn final_note(text: &str) {
    if busy_on_this_thread() {
        return;
    }
    flush(FlushKind::Final);
    let mut guard = OUTPUT.lock();
    if let Some(output) = guard.as_mut() {
        let t_ns = process::now_ns().saturating_sub(output.start_mono_ns);
        push_record(
            output,
            &Record::Note(vramshim_format::Note {
                t_ns,
                text: text.to_owned(),
            }),
        );
        finish_chunk(output);
    }
}

/// Writes everything buffered, then the exit record stamped now, at the end of the same chunk
/// (format 5: no reader older than the record reads the log, so it needs no chunk of its
/// own). Once per process: `exit` called again from an `atexit` handler, or from two
/// threads, writes one record.
pub fn exit_record() {
    if busy_on_this_thread() || EXIT_WRITTEN.swap(true, Ordering::AcqRel) {
        return;
    }
    let mut guard = OUTPUT.lock();
    if let Some(output) = guard.as_mut() {
        flush_locked(output, FlushKind::Final, false);
        let t_ns = process::now_ns().saturating_sub(output.start_mono_ns);
        push_record(output, &Record::Exit(vramshim_format::Exit { t_ns }));
        finish_chunk(output);
    }
}

/// In a fork child: forgets the parent's log, rings and queued definitions (the parent
/// writes those). The parent's buffers are leaked, not freed: a thread that vanished with the
/// fork may have been changing them. Plain stores and `close`: async-signal-safe.
///
/// # Safety
/// Only in a fork child's after-fork handler.
pub unsafe fn reset_in_fork_child() {
    let fd = LOG_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        unsafe { libc::close(fd) };
    }
    unsafe {
        OUTPUT.reset_in_fork_child(None);
        RINGS.reset_in_fork_child(Vec::new());
        DEFS.reset_in_fork_child(Vec::new());
    }
    DROPPED.store(0, Ordering::Relaxed);
    OPEN_CHUNK_DUE_NS.store(0, Ordering::Relaxed);
    EXIT_WRITTEN.store(false, Ordering::Release);
    crate::ring::clear_writer_thread();
}

/// Appends the log's path to `vramshim run`'s manifest; one warning line when it cannot.
pub fn append_manifest(manifest: &OsString, log: &OsString) {
    let mut line = log.clone().into_vec();
    line.push(b'\n');
    if let Err(why) = append_to_manifest(manifest, &line) {
        crate::warn(&format!(
            "log {} not added to the manifest {}: {why}",
            log.to_string_lossy(),
            manifest.to_string_lossy()
        ));
    }
}

/// The manifest may sit in a directory someone else controls: only an existing regular file
/// of ours with no other name is written (never created, never through a symlink), and a
/// FIFO or device is never even opened.
fn append_to_manifest(manifest: &OsString, line: &[u8]) -> Result<(), String> {
    let cpath =
        CString::new(manifest.as_bytes()).map_err(|_| "the path contains a NUL byte".to_owned())?;
    let mut seen: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::lstat(cpath.as_ptr(), &mut seen) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    if let Some(kind) = kind_of(seen.st_mode) {
        return Err(format!("it is {kind}"));
    }
    let fd = unsafe {
        libc::open(
            cpath.as_ptr(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return Err(if err.raw_os_error() == Some(libc::ELOOP) {
            "it is a symbolic link".to_owned()
        } else {
            err.to_string()
        });
    }
    let result = (|| {
        let mut opened: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut opened) } != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino) {
            return Err("it was replaced while being opened".to_owned());
        }
        if let Some(kind) = kind_of(opened.st_mode) {
            return Err(format!("it is {kind}"));
        }
        if opened.st_uid != unsafe { libc::geteuid() } {
            return Err("it belongs to another user".to_owned());
        }
        if opened.st_nlink != 1 {
            return Err("it has other names (hard links)".to_owned());
        }
        // One write with O_APPEND: lines of concurrent processes do not interleave.
        write_within_limit(fd, opened.st_size as u64, line).map_err(|why| why.to_string())
    })();
    unsafe { libc::close(fd) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::SLOT_EVENT;

    /// The chunk the writer makes of what it drained: `merge` orders the drained slots.
    fn chunk_of(order: &[(u32, Slot)]) -> Vec<u8> {
        let mut chunk = ChunkBuilder::new()
            .with_time_resolution(1_000)
            .with_first_thread(100);
        for (tid, slot) in order {
            chunk.push_event(&slot_event(*tid, slot, 1_000_000));
        }
        let mut bytes = Vec::new();
        chunk.finish_into(&mut bytes);
        bytes
    }

    #[test]
    fn merged_drain_writes_the_bytes_the_sorted_drain_wrote() {
        // Rings of 1 to 12 threads with allocations and frees at few distinct times (ties),
        // some going back in time, drained below a watermark as `flush_locked` does; the
        // chunk must be byte for byte the one of the old drain's stable sort of
        // (order drained, thread, slot) by time.
        let mut next = crate::ring::below_from(0x2545_f491_4f6c_dd1d);
        for round in 0..300 {
            let threads = 1 + next(12) as u32;
            let rings: Vec<Ring> = (0..threads)
                .map(|t| Ring::new(100 + t, 64).expect("ring"))
                .collect();
            for ring in &rings {
                let mut t_ns = 1_000_000 + next(50_000);
                for i in 0..next(40) {
                    t_ns = if next(10) == 0 {
                        t_ns.saturating_sub(next(3_000))
                    } else {
                        t_ns + next(3) * 1_000
                    };
                    let alloc = i % 2 == 0;
                    ring.push(&Slot {
                        t_ns,
                        addr: 0x7f00_0000 + (ring.tid as u64) * 0x10_0000 + (i / 2) * 512,
                        size: if alloc { 512 } else { 0 },
                        stack: if alloc { 1 + next(3) as u32 } else { 0 },
                        kind: if alloc {
                            EventKind::Alloc as u8
                        } else {
                            EventKind::Free as u8
                        },
                        tag: SLOT_EVENT,
                        ..Slot::default()
                    });
                }
            }
            let watermark = 1_000_000 + next(150_000);
            let mut batch = Vec::new();
            let mut runs = Vec::new();
            for ring in &rings {
                ring.drain_before(watermark, &mut batch, &mut runs, usize::MAX, usize::MAX);
            }
            // The old drain's batch: the same slots in the same order, each with its place
            // and thread.
            let mut old: Vec<(u32, u32, Slot)> = Vec::new();
            for run in &runs {
                for index in run.start..run.end {
                    assert_eq!(old.len(), index as usize);
                    old.push((index, run.tid, batch[index as usize]));
                }
            }
            assert_eq!(old.len(), batch.len());
            old.sort_by_key(|(_, _, slot)| slot.t_ns);
            let old: Vec<(u32, Slot)> = old.into_iter().map(|(_, tid, s)| (tid, s)).collect();
            let mut new = Vec::new();
            let mut keys = Vec::new();
            for_each_in_time_order(&batch, &runs, &mut keys, |tid, slot| new.push((tid, *slot)));
            assert_eq!(chunk_of(&new), chunk_of(&old), "round {round}");
        }
    }
}
