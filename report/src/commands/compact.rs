//! `vramshim compact [--level N] LOG...`: rewrites each log with its records in large
//! compressed chunks. The recorder writes its chunks plain (compressing in the program's
//! process cost its writer thread about 300 instructions a tensor event); the log is
//! compressed here, after the program ended, as `vramshim run` does by default.
//!
//! Nothing is lost: the new version goes to a temporary file beside the log, is synced, read
//! back and compared record by record with the original before it replaces it. A damaged log,
//! one a process still writes (it holds `flock` on it), anything but a regular file of the
//! current format version is left untouched.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use vramshim_format::{ChunkBuilder, FORMAT_VERSION, Item, LogReader};

use crate::Failure;
use crate::progress::Progress;
use crate::units::bytes;

/// zstd level of `compact` (and of `vramshim run`'s compaction). On a mixed-stack log of 250
/// torch training passes (README, "Compacting logs") level 3 stores it in 0.33 of its
/// recorded bytes at ~6 ms a MiB; level 1 in 0.44 (~4.5 ms), level 9 in 0.30 (~20 ms).
pub const DEFAULT_LEVEL: i32 = 3;

/// Record bytes of a compacted log's chunks: zstd finds its matches within a chunk, and
/// larger chunks gain little (4 MiB: 0.333 of the recorded bytes at level 3, 1 MiB: 0.345,
/// 256 KiB: 0.388) while a reader holds a whole chunk in memory and damage loses one.
const CHUNK_RECORD_BYTES: usize = 4 << 20;

/// Set by SIGINT, SIGTERM or SIGHUP once [`stop_on_interrupt`] is in place: every compaction
/// under way stops at its next check and leaves its log as it was.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Why a compaction stopped on [`INTERRUPTED`].
const INTERRUPTED_WHY: &str = "interrupted: left as recorded";

extern "C" fn on_interrupt(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// From now on Ctrl-C (SIGINT), SIGTERM and SIGHUP stop the compactions cleanly (the logs as
/// they were, no temporary file left) instead of killing the process half way; what
/// follows them (the lines, the exit status) still runs. Set by [`compact_logs`], so every
/// command that compacts (`compact`, `run` once its program has ended, `dryrun`) has it.
fn stop_on_interrupt() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, on_interrupt as *const () as libc::sighandler_t) };
    }
}

/// [`INTERRUPTED_WHY`] once a signal asked to stop.
fn check_interrupted() -> Result<(), String> {
    if INTERRUPTED.load(Ordering::Relaxed) {
        return Err(INTERRUPTED_WHY.to_string());
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct Args {
    /// zstd level, 1 (fastest) to 19 (smallest).
    #[arg(long, default_value_t = DEFAULT_LEVEL,
          value_parser = clap::value_parser!(i32).range(1..=19))]
    level: i32,
    /// The logs to rewrite.
    #[arg(required = true)]
    logs: Vec<PathBuf>,
}

/// What compacting one log did.
#[derive(Debug)]
pub enum Outcome {
    /// The log was rewritten: its bytes before and after.
    Compacted { before: u64, after: u64 },
    /// Compacting would not make it smaller (it is compacted already): left as it was.
    Unchanged { size: u64 },
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let mut failed = 0usize;
    for (log, outcome) in args.logs.iter().zip(compact_logs(&args.logs, args.level)) {
        match outcome {
            Ok(Outcome::Compacted { before, after }) => println!(
                "compacted {}: {} -> {} ({:.1}% of its bytes)",
                log.display(),
                bytes(before),
                bytes(after),
                100.0 * after as f64 / before.max(1) as f64
            ),
            Ok(Outcome::Unchanged { size }) => println!(
                "{}: left as is ({}): compacting would not make it smaller",
                log.display(),
                bytes(size)
            ),
            Err(why) => {
                eprintln!("vramshim: {} not compacted: {why}", log.display());
                failed += 1;
            }
        }
    }
    Ok(if INTERRUPTED.load(Ordering::Relaxed) {
        // As a shell reports a command Ctrl-C ended.
        ExitCode::from(130)
    } else if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Compacts each of `logs` ([`compact_log_in_chunks`]), their outcomes in the same order. Several logs
/// (a multi-process run's: one a rank) are compacted at once, a thread a core; a single log
/// draws the progress bar. From here on a signal stops them ([`stop_on_interrupt`]).
pub fn compact_logs(logs: &[PathBuf], level: i32) -> Vec<Result<Outcome, String>> {
    stop_on_interrupt();
    if logs.len() <= 1 {
        return logs
            .iter()
            .map(|log| compact_log_in_chunks(log, level, CHUNK_RECORD_BYTES, true))
            .collect();
    }
    let next = AtomicUsize::new(0);
    // Takes the next log not yet taken until none is left: (its index, its outcome).
    let work = || {
        let mut done = Vec::new();
        loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some(log) = logs.get(index) else {
                return done;
            };
            done.push((
                index,
                compact_log_in_chunks(log, level, CHUNK_RECORD_BYTES, false),
            ));
        }
    };
    let helpers = std::thread::available_parallelism()
        .map_or(1, |cores| cores.get())
        .min(logs.len())
        - 1;
    let mut outcomes: Vec<Option<Result<Outcome, String>>> = logs.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        // A thread that cannot be started is one helper fewer: this thread works too.
        let started: Vec<_> = (0..helpers)
            .map_while(|_| std::thread::Builder::new().spawn_scoped(scope, work).ok())
            .collect();
        let mut done = work();
        for helper in started {
            // A helper that panicked leaves its logs without an outcome (said below).
            done.extend(helper.join().unwrap_or_default());
        }
        for (index, outcome) in done {
            outcomes[index] = Some(outcome);
        }
    });
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| Err("its compaction stopped unexpectedly".to_string()))
        })
        .collect()
}

/// Rewrites the log at `path` with its records in compressed chunks of `chunk_bytes` of
/// records ([`CHUNK_RECORD_BYTES`]; tests write several chunks with small ones) at zstd
/// `level`, its header byte for byte, with a progress bar when `progress_bar` (on a terminal,
/// past half a second). On any failure (a one-line reason) the log is untouched and no
/// temporary file is left.
fn compact_log_in_chunks(
    path: &Path,
    level: i32,
    chunk_bytes: usize,
    progress_bar: bool,
) -> Result<Outcome, String> {
    check_interrupted()?;
    let seen =
        std::fs::symlink_metadata(path).map_err(|err| format!("cannot look at it: {err}"))?;
    if seen.file_type().is_symlink() {
        return Err(
            "it is a symbolic link (compact rewrites regular files only: name the file it points to)"
                .to_string(),
        );
    }
    if !seen.is_file() {
        return Err("not a regular file".to_string());
    }
    // Should a symlink have replaced it since, the open fails (O_NOFOLLOW); a FIFO does not
    // block it (O_NONBLOCK, which changes nothing for a regular file) and is refused below.
    let original = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|err| format!("cannot open it: {err}"))?;
    let opened = original
        .metadata()
        .map_err(|err| format!("cannot look at it: {err}"))?;
    if (opened.dev(), opened.ino()) != (seen.dev(), seen.ino()) || !opened.is_file() {
        return Err("it was replaced while being opened".to_string());
    }
    lock(&original)?;

    let mut reader = LogReader::new(&original).map_err(|err| err.to_string())?;
    let version = reader.header().version;
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}: compact rewrites logs of version {FORMAT_VERSION} only \
             (vramshim reads it as it is)"
        ));
    }
    // The reader has read the header and nothing more: these are the bytes before the first
    // chunk, kept as they are.
    let mut header_bytes = vec![0u8; reader.offset() as usize];
    original
        .read_exact_at(&mut header_bytes, 0)
        .map_err(|err| format!("cannot read its header: {err}"))?;

    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| "the path names no file".to_string())?;
    let mut temp = TempFile::create(dir, &name.to_string_lossy())?;
    let temp_path = temp.path.clone();
    let write_error = |err: std::io::Error| {
        format!(
            "cannot write its compacted version {}: {err}",
            temp_path.display()
        )
    };

    // Re-encode every record as the recorder does (its time resolution, chunks starting at
    // its pid's thread, continued chunks), in large compressed chunks.
    let header = reader.header();
    let mut chunk = ChunkBuilder::new()
        .with_time_resolution(header.time_resolution_ns)
        .with_first_thread(header.pid)
        .with_continued_chunks()
        .with_compression_level(level);
    let mut out = Vec::with_capacity(chunk_bytes);
    out.extend_from_slice(&header_bytes);
    // Both passes (encoding, then the check) in one bar: half of it each.
    let mut progress = Progress::new("compacting", if progress_bar { opened.len() } else { 0 });
    let mut records = 0u64;
    while let Some(item) = reader.next() {
        records += 1;
        if records.is_multiple_of(1 << 12) {
            check_interrupted()?;
        }
        match item {
            Item::Record(record) => chunk.push(&record),
            Item::Damage(damage) => {
                return Err(format!(
                    "it is damaged ({damage}); vramshim reads it as it is, compact rewrites \
                     undamaged logs only"
                ));
            }
        }
        if chunk.payload_len() >= chunk_bytes {
            chunk.finish_compressed_into(&mut out);
            temp.file.write_all(&out).map_err(&write_error)?;
            out.clear();
            progress.update(reader.offset() / 2);
        }
    }
    chunk.finish_compressed_into(&mut out);
    temp.file.write_all(&out).map_err(&write_error)?;
    drop(reader);

    let before = opened.len();
    let after = temp.file.metadata().map_err(&write_error)?.len();
    if after >= before {
        return Ok(Outcome::Unchanged { size: before });
    }

    // The new version gets the original's mode, owner and modification time (the time the
    // recording ended), then reaches the disk before anything refers to it.
    keep_attributes(&temp.file, &opened)?;
    temp.file.sync_all().map_err(&write_error)?;

    let checked = same_records(&original, &temp.file, &header_bytes, &mut progress);
    progress.finish();
    checked.map_err(|why| {
        if why == INTERRUPTED_WHY {
            why
        } else {
            format!("the compacted version does not read back as the original ({why})")
        }
    })?;

    // Nothing may have changed the original since it was read (a writer that ignores the
    // lock, or another path to it renamed over).
    let now = original
        .metadata()
        .map_err(|err| format!("cannot look at it: {err}"))?;
    let there =
        std::fs::symlink_metadata(path).map_err(|err| format!("cannot look at it: {err}"))?;
    if now.len() != opened.len()
        || now.mtime() != opened.mtime()
        || now.mtime_nsec() != opened.mtime_nsec()
        || (there.dev(), there.ino()) != (opened.dev(), opened.ino())
    {
        return Err("it changed while being compacted".to_string());
    }
    std::fs::rename(&temp.path, path)
        .map_err(|err| format!("cannot replace it with its compacted version: {err}"))?;
    temp.renamed = true;
    // The rename reaches the disk with the directory; a file system that cannot sync a
    // directory still has the file's bytes synced.
    if let Ok(dir) = File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(Outcome::Compacted { before, after })
}

/// Takes the log's lock (`flock`, exclusive, without waiting): the recorder holds it while it
/// writes the log, and so does a `compact` of it.
fn lock(file: &File) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    // SAFETY: `file` is open for the call; flock touches no memory.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Err(
            "it is still being written by a running process (or compacted by another vramshim): \
             compact it after that ends"
                .to_string(),
        ),
        // Without the lock, a recorder still writing it would go on writing the old file
        // once the new one replaced it: what it wrote after would be lost.
        _ => Err(format!(
            "cannot lock it ({err}), so cannot tell whether a process still writes it"
        )),
    }
}

/// Gives `temp` the mode, owner and modification time of the original (`of`).
fn keep_attributes(temp: &File, of: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mine = temp
        .metadata()
        .map_err(|err| format!("cannot look at the compacted version: {err}"))?;
    if (mine.uid(), mine.gid()) != (of.uid(), of.gid()) {
        std::os::unix::fs::fchown(temp, Some(of.uid()), Some(of.gid())).map_err(|err| {
            format!(
                "cannot give the compacted version the log's owner ({}:{}): {err}",
                of.uid(),
                of.gid()
            )
        })?;
    }
    temp.set_permissions(std::fs::Permissions::from_mode(of.mode() & 0o7777))
        .map_err(|err| format!("cannot give the compacted version the log's mode: {err}"))?;
    if let Ok(modified) = of.modified() {
        temp.set_times(std::fs::FileTimes::new().set_modified(modified))
            .map_err(|err| format!("cannot give the compacted version the log's time: {err}"))?;
    }
    Ok(())
}

/// Whether `compacted` holds `header` byte for byte and decodes to exactly the records of
/// `original`, in order, without damage; the first difference otherwise.
fn same_records(
    original: &File,
    compacted: &File,
    header: &[u8],
    progress: &mut Progress,
) -> Result<(), String> {
    let mut head = vec![0u8; header.len()];
    compacted
        .read_exact_at(&mut head, 0)
        .map_err(|err| format!("cannot read its header: {err}"))?;
    if head != header {
        return Err("its header differs".to_string());
    }
    let rewind = |mut file: &File| {
        file.seek(SeekFrom::Start(0))
            .map_err(|err| format!("cannot read it again: {err}"))
    };
    rewind(original)?;
    rewind(compacted)?;
    let mut old = LogReader::new(original).map_err(|err| format!("the original: {err}"))?;
    let mut new = LogReader::new(compacted).map_err(|err| err.to_string())?;
    let size = original.metadata().map_or(0, |meta| meta.len());
    let mut records = 0u64;
    loop {
        match (old.next(), new.next()) {
            (None, None) => return Ok(()),
            (Some(Item::Record(was)), Some(Item::Record(now))) if was == now => {
                records += 1;
                if records.is_multiple_of(1 << 12) {
                    check_interrupted()?;
                }
                if records.is_multiple_of(1 << 16) {
                    // The second half of the bar (the first was the encoding).
                    progress.update((size + old.offset()) / 2);
                }
            }
            (_, Some(Item::Damage(damage))) => return Err(format!("it is damaged: {damage}")),
            (Some(Item::Damage(damage)), _) => {
                return Err(format!("the original reads damaged now: {damage}"));
            }
            (Some(_), None) => return Err(format!("it ends after {records} records")),
            (None, Some(_)) => return Err(format!("it has more than the {records} records")),
            (Some(_), Some(_)) => return Err(format!("record {} differs", records + 1)),
        }
    }
}

/// The compacted version being written, removed again unless it replaced the log.
struct TempFile {
    path: PathBuf,
    file: File,
    renamed: bool,
}

impl TempFile {
    /// A new file `.NAME.compact-PID[-N].tmp` in `dir`, mode 0600, created (`O_EXCL`: never an
    /// existing file, never through a symlink).
    fn create(dir: &Path, name: &str) -> Result<TempFile, String> {
        let mut last = None;
        for attempt in 0..100u32 {
            let path = if attempt == 0 {
                dir.join(format!(".{name}.compact-{}.tmp", std::process::id()))
            } else {
                dir.join(format!(
                    ".{name}.compact-{}-{attempt}.tmp",
                    std::process::id()
                ))
            };
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
            {
                Ok(file) => {
                    return Ok(TempFile {
                        path,
                        file,
                        renamed: false,
                    });
                }
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => last = Some(err),
                Err(err) => {
                    return Err(format!(
                        "cannot create a temporary file in {}: {err}",
                        dir.display()
                    ));
                }
            }
        }
        Err(format!(
            "cannot create a temporary file in {}: {}",
            dir.display(),
            last.map_or_else(String::new, |err| err.to_string())
        ))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramshim_format::{Event, EventKind, Header, Record, chunk_spans};

    /// A log of `FORMAT_VERSION` in small plain chunks, as the recorder writes it, and its
    /// records.
    fn recorded_log(path: &Path) -> Vec<Record> {
        let header = Header {
            version: FORMAT_VERSION,
            pid: 4242,
            ppid: 1,
            argv: vec!["train".to_string()],
            apis: vec!["cuMemAlloc_v2".to_string(), "cuMemFree_v2".to_string()],
            stack_mode: "none".to_string(),
            mode: "stream".to_string(),
            recorder: "test".to_string(),
            time_resolution_ns: 1,
            ..Header::default()
        };
        let mut records = Vec::new();
        for i in 0..20_000u64 {
            let addr = 0x7f00_0000_0000 + (i % 97) * 0x20_0000;
            let thread = 4242 + (i % 3) as u32;
            for (kind, api) in [(EventKind::Alloc, 0), (EventKind::Free, 1)] {
                records.push(Record::Event(Event {
                    kind,
                    api,
                    t_ns: i * 1_000 + u64::from(api) * 7,
                    thread,
                    addr,
                    size: if api == 0 { 4096 << (i % 5) } else { 0 },
                    ..Event::default()
                }));
            }
        }
        let mut chunk = ChunkBuilder::new()
            .with_first_thread(header.pid)
            .with_continued_chunks();
        let mut bytes = header.encode();
        for record in &records {
            chunk.push(record);
            if chunk.payload_len() >= 2048 {
                chunk.finish_into(&mut bytes);
            }
        }
        chunk.finish_into(&mut bytes);
        std::fs::write(path, &bytes).expect("write log");
        records
    }

    #[test]
    fn a_log_compacted_in_several_chunks_reads_back_every_record() {
        let dir = std::env::temp_dir().join(format!("vramshim-compact-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let path = dir.join("log.vlog");
        let records = recorded_log(&path);
        let before = std::fs::metadata(&path).expect("log").len();

        // Chunks of 8 KiB of records: continued ones among them (a key chunk every 64 KiB).
        let outcome =
            compact_log_in_chunks(&path, DEFAULT_LEVEL, 8 << 10, false).expect("compacted");
        let bytes = std::fs::read(&path).expect("read log");
        match outcome {
            Outcome::Compacted { before: was, after } => {
                assert_eq!((was, after), (before, bytes.len() as u64));
            }
            other => panic!("{other:?}"),
        }
        let spans = chunk_spans(&bytes);
        assert!(spans.len() > 10, "{} chunks", spans.len());
        assert!(spans.iter().all(|span| span.compressed));
        assert!(spans.iter().any(|span| !span.key));
        let read: Vec<Record> = LogReader::new(bytes.as_slice())
            .expect("a log")
            .map(|item| match item {
                Item::Record(record) => record,
                Item::Damage(damage) => panic!("{damage}"),
            })
            .collect();
        assert_eq!(read, records);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
