//! `vramshim compact` and `vramshim run`'s compaction end to end: a log the real recorder wrote
//! plain is rewritten compressed with the same records (dump and report alike), its header
//! byte for byte; a damaged log, one a process still holds, a symlink, a directory or a file
//! that is no log is left untouched with one line saying why.

mod common;

use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::torch;
use common::*;

/// (chunks, compressed chunks) of the log at `path`, by its chunks' heads; the chunks must
/// end with the file.
fn chunk_kinds(path: &Path) -> (usize, usize) {
    let bytes = std::fs::read(path).expect("read log");
    let spans = vramshim_format::chunk_spans(&bytes);
    let end = spans.last().map_or(0, |span| span.start + span.len());
    assert_eq!(end, bytes.len(), "the chunks do not end with the file");
    (
        spans.len(),
        spans.iter().filter(|span| span.compressed).count(),
    )
}

/// The bytes before the first chunk.
fn header_bytes(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).expect("read log");
    let first = vramshim_format::chunk_spans(&bytes)
        .first()
        .map_or(bytes.len(), |span| span.start);
    bytes[..first].to_vec()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `vramshim ARGS` with the fakes on the library path and no recorder settings inherited.
fn vramshim_in(args: &[&OsStr], cwd: &Path) -> Output {
    Command::new(vramshim_tool())
        .args(args)
        .current_dir(cwd)
        .env("LD_LIBRARY_PATH", fake_lib_dir())
        .env("FAKECUDA_MEM", "unlimited")
        .env("VRAMSHIM_COMPRESS", "0")
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMSHIM_OUTPUT")
        .env_remove("VRAMSHIM_STACK")
        .env_remove("VRAMSHIM_MODE")
        .env_remove("VRAMSHIM_MANIFEST")
        .output()
        .expect("run vramshim")
}

fn compact(args: &[&Path]) -> Output {
    let mut all: Vec<&OsStr> = vec![OsStr::new("compact")];
    all.extend(args.iter().map(|path| path.as_os_str()));
    tool(&all)
}

/// The line `vramshim compact` prints for a log it rewrote from `before` to `after` bytes.
fn compacted_line(log: &Path, before: u64, after: u64) -> String {
    format!(
        "compacted {}: {} -> {} ({:.1}% of its bytes)\n",
        log.display(),
        printed_size(before),
        printed_size(after),
        100.0 * after as f64 / before as f64
    )
}

/// A log of `bench` (2 threads, 50,000 allocation/free pairs each, native stacks) as the
/// recorder writes it by default: plain chunks (of at most 256 KiB of records: several).
fn plain_bench_log(test: &str) -> (PathBuf, PathBuf) {
    plain_bench_log_of(test, &["2", "50000", "8"])
}

/// [`plain_bench_log`] of `bench THREADS PAIRS DEPTH` as `bench_args` say.
fn plain_bench_log_of(test: &str, bench_args: &[&str]) -> (PathBuf, PathBuf) {
    let run = run_under_shim(
        test,
        "bench",
        bench_args,
        &[
            ("FAKECUDA_MEM", "unlimited"),
            ("VRAMSHIM_STACK", "native"),
            ("VRAMSHIM_COMPRESS", "0"),
        ],
    );
    assert!(run.output.status.success(), "bench: {}", run.stderr());
    let log = run.log();
    let (chunks, compressed) = chunk_kinds(&log);
    assert!(chunks >= 2, "{chunks} chunks");
    assert_eq!(compressed, 0, "the recorder wrote plain chunks");
    (run.dir.clone(), log)
}

#[test]
fn compact_rewrites_a_recorded_log_compressed_with_the_same_records() {
    let (dir, log) = plain_bench_log("compact-bench");
    let name = file_name_of(&log);
    let recorded = std::fs::read(&log).expect("read log");
    let dump_before = dump(&log);
    let report_before = json_of(&[OsStr::new("report"), OsStr::new("--json"), log.as_os_str()]);
    // 2 threads x 50,000 allocation/free pairs.
    assert_eq!(events(&dump_before).len(), 200_000);

    let output = compact(&[&log]);
    let after = std::fs::metadata(&log).expect("log").len();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        text(&output.stdout),
        compacted_line(&log, recorded.len() as u64, after)
    );
    assert_eq!(text(&output.stderr), "");
    assert!(after < recorded.len() as u64 / 2, "{after} bytes");
    // Every record is in one compressed chunk now (its records are under 4 MiB).
    assert_eq!(chunk_kinds(&log), (1, 1));
    assert_eq!(header_bytes(&log), header_bytes_of(&recorded));
    assert_eq!(dump(&log), dump_before);
    assert_eq!(
        json_of(&[OsStr::new("report"), OsStr::new("--json"), log.as_os_str()]),
        report_before
    );
    // Same mode, nothing left beside it.
    let mode = std::fs::metadata(&log).expect("log").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(files_in(&dir), vec![name]);

    // Compacted already: a second run leaves it as it is.
    let compacted = std::fs::read(&log).expect("read log");
    let output = compact(&[&log]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        text(&output.stdout),
        format!(
            "{}: left as is ({}): compacting would not make it smaller\n",
            log.display(),
            printed_size(after)
        )
    );
    assert_eq!(std::fs::read(&log).expect("read log"), compacted);
}

/// The last component of `path`, as text.
fn file_name_of(path: &Path) -> String {
    path.file_name()
        .expect("a file name")
        .to_string_lossy()
        .into_owned()
}

fn header_bytes_of(log: &[u8]) -> Vec<u8> {
    let first = vramshim_format::chunk_spans(log)
        .first()
        .map_or(log.len(), |span| span.start);
    log[..first].to_vec()
}

#[test]
fn a_damaged_log_is_refused_and_left_byte_for_byte() {
    let (dir, log) = plain_bench_log("compact-damaged");
    let name = file_name_of(&log);
    let recorded = std::fs::read(&log).expect("read log");
    let spans = vramshim_format::chunk_spans(&recorded);

    // Torn: cut in the middle of the last chunk, as a writer killed mid-write leaves it.
    let last = *spans.last().expect("a chunk");
    let cut = last.start + last.len() / 2;
    std::fs::write(&log, &recorded[..cut]).expect("write torn log");
    let output = compact(&[&log]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(text(&output.stdout), "");
    assert_eq!(
        text(&output.stderr),
        format!(
            "vramshim: {} not compacted: it is damaged (log ends in an incomplete chunk at byte {} \
             ({} bytes unusable): the recorder was stopped mid-write; everything before is \
             intact); vramshim reads it as it is, compact rewrites undamaged logs only\n",
            log.display(),
            last.start,
            cut - last.start
        )
    );
    assert_eq!(std::fs::read(&log).expect("read log"), &recorded[..cut]);
    assert_eq!(files_in(&dir), vec![name.clone()]);

    // Corrupt: one byte of the first chunk's records flipped.
    let first = spans[0];
    let mut corrupt = recorded.clone();
    corrupt[first.start + first.head + first.payload / 2] ^= 0x55;
    std::fs::write(&log, &corrupt).expect("write corrupt log");
    let output = compact(&[&log]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let start = format!(
        "vramshim: {} not compacted: it is damaged (damaged chunk at byte {} (",
        log.display(),
        first.start
    );
    assert!(
        text(&output.stderr).starts_with(&start),
        "{:?} does not start with {start:?}",
        text(&output.stderr)
    );
    assert_eq!(text(&output.stderr).lines().count(), 1);
    assert_eq!(std::fs::read(&log).expect("read log"), corrupt);
    assert_eq!(files_in(&dir), vec![name]);
}

const STILL_WRITTEN: &str = "it is still being written by a running process (or compacted by \
                             another vramshim): compact it after that ends";

#[test]
fn a_log_someone_holds_locked_is_refused_until_released() {
    let (_dir, log) = plain_bench_log("compact-locked");
    let recorded = std::fs::read(&log).expect("read log");
    let held = std::fs::File::open(&log).expect("open log");
    // SAFETY: `held` is open; flock touches no memory.
    let locked = unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(locked, 0, "lock the log");
    let output = compact(&[&log]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(
        text(&output.stderr),
        format!(
            "vramshim: {} not compacted: {STILL_WRITTEN}\n",
            log.display()
        )
    );
    assert_eq!(std::fs::read(&log).expect("read log"), recorded);

    drop(held);
    let output = compact(&[&log]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(chunk_kinds(&log).1, chunk_kinds(&log).0);
}

/// The recorder holds its log locked while its process lives (`sigkill` sleeps 500 ms
/// between its allocations), and the lock goes with the process, SIGKILL included.
#[test]
fn a_log_its_process_still_writes_is_refused_and_compacted_once_it_died() {
    let dir = scratch("compact-running");
    let mut child = shim_command(&program("sigkill"), &dir)
        .env("VRAMSHIM_COMPRESS", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sigkill");
    let pid = child.id();
    let log = dir.join(format!("{pid}.vlog"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log.exists() {
        assert!(Instant::now() < deadline, "no log from pid {pid}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let output = compact(&[&log]);
    let status = child.wait().expect("wait for sigkill");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(
        text(&output.stderr),
        format!(
            "vramshim: {} not compacted: {STILL_WRITTEN}\n",
            log.display()
        )
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));

    let dump_before = dump(&log);
    let output = compact(&[&log]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(chunk_kinds(&log), (1, 1));
    assert_eq!(dump(&log), dump_before);
    // The first five allocations (1 MiB each) were flushed during the sleep, the last five
    // maybe (the process killed itself right after them).
    let recorded = events(&dump_before);
    assert!(
        (5..=10).contains(&recorded.len()),
        "{} events",
        recorded.len()
    );
    let sizes: Vec<u64> = recorded.iter().take(5).map(|e| u64_of(e, "size")).collect();
    assert_eq!(sizes, vec![1 << 20; 5]);
}

#[test]
fn only_regular_vramshim_logs_are_rewritten_and_the_others_named() {
    let (dir, log) = plain_bench_log("compact-kinds");
    let recorded = std::fs::read(&log).expect("read log");
    let link = dir.join("link.vlog");
    std::os::unix::fs::symlink(&log, &link).expect("symlink");
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, "not a log\n").expect("write notes");
    let subdir = dir.join("subdir");
    std::fs::create_dir(&subdir).expect("mkdir");
    let missing = dir.join("missing.vlog");
    let fifo = dir.join("fifo.vlog");
    let c_fifo = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: `c_fifo` is a NUL-terminated path for the call.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0, "mkfifo");

    let output = compact(&[&link, &subdir, &fifo, &notes, &missing, &log]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(
        text(&output.stderr),
        format!(
            "vramshim: {} not compacted: it is a symbolic link (compact rewrites regular files \
             only: name the file it points to)\n\
             vramshim: {} not compacted: not a regular file\n\
             vramshim: {} not compacted: not a regular file\n\
             vramshim: {} not compacted: not a vramshim log (no VRAMSHIM magic at the start)\n\
             vramshim: {} not compacted: cannot look at it: No such file or directory (os error 2)\n",
            link.display(),
            subdir.display(),
            fifo.display(),
            notes.display(),
            missing.display()
        )
    );
    // The log named after them is compacted all the same.
    let after = std::fs::metadata(&log).expect("log").len();
    assert_eq!(
        text(&output.stdout),
        compacted_line(&log, recorded.len() as u64, after)
    );
    assert!(
        std::fs::symlink_metadata(&link)
            .expect("link")
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read(&notes).expect("notes"), b"not a log\n");
    let mut names = files_in(&dir);
    names.retain(|name| name.starts_with('.'));
    assert_eq!(names, Vec::<String>::new(), "temporary files left");
}

/// `vramshim run` compacts each log after the program exits unless `--no-compact`; the
/// log's chunk kinds tell which.
#[test]
fn run_compacts_its_logs_unless_told_not_to() {
    for compact in [true, false] {
        let dir = scratch("compact-run");
        let output_path = dir.join("%p.vlog");
        let bench = program("bench");
        let mut args = vec![OsStr::new("run"), OsStr::new("-o"), output_path.as_os_str()];
        if !compact {
            args.push(OsStr::new("--no-compact"));
        }
        args.extend([
            OsStr::new("--stack"),
            OsStr::new("native"),
            OsStr::new("--"),
            bench.as_os_str(),
            OsStr::new("1"),
            OsStr::new("100000"),
            OsStr::new("4"),
        ]);
        let output = vramshim_in(&args, &dir);
        assert!(output.status.success(), "{output:?}");
        let logs = files_in(&dir);
        assert_eq!(logs.len(), 1, "{logs:?}");
        let log = dir.join(&logs[0]);
        let stderr = text(&output.stderr);
        let (chunks, compressed) = chunk_kinds(&log);
        if compact {
            assert_compacted_wrote_line(&log, stderr.strip_suffix('\n').expect("a line"));
            assert_eq!((chunks, compressed), (1, 1));
        } else {
            let size = std::fs::metadata(&log).expect("log").len();
            assert_eq!(
                stderr,
                format!(
                    "vramshim: wrote {} ({})\n",
                    log.display(),
                    printed_size(size)
                )
            );
            assert!(chunks >= 2, "{chunks} chunks");
            assert_eq!(compressed, 0);
        }
        assert_eq!(events(&dump(&log)).len(), 200_000);
    }
}

/// A log a surviving process still holds (here `flock(1)` holding it after the program's
/// shell exited) is left as recorded, with the reason on `run`'s line; `run`'s exit status
/// stays the program's.
#[test]
fn run_leaves_a_log_still_held_as_recorded() {
    let has_flock = Command::new("sh")
        .args(["-c", "command -v flock"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !has_flock {
        skipped("no flock(1) (util-linux) to hold a log after its program (compact)");
        return;
    }
    let dir = scratch("compact-run-held");
    let log = dir.join("held.vlog");
    let oom = program("oom");
    // The shell runs the program, hands its log to a background flock(1) and exits 3 once
    // that holds the lock (`flock -n` fails).
    let script = format!(
        "'{oom}' >/dev/null && \
         (flock -x '{log}' sleep 3 </dev/null >/dev/null 2>&1 &) && \
         until ! flock -n '{log}' true; do sleep 0.01; done; exit 3",
        oom = oom.display(),
        log = log.display()
    );
    let output = Command::new(vramshim_tool())
        .args([
            OsStr::new("run"),
            OsStr::new("-o"),
            log.as_os_str(),
            OsStr::new("--"),
            OsStr::new("sh"),
            OsStr::new("-c"),
            OsStr::new(&script),
        ])
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", fake_lib_dir())
        .env("FAKECUDA_MEM", "1G")
        .env("VRAMSHIM_COMPRESS", "0")
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMSHIM_OUTPUT")
        .env_remove("VRAMSHIM_STACK")
        .env_remove("VRAMSHIM_MANIFEST")
        .output()
        .expect("run vramshim");
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let size = std::fs::metadata(&log).expect("log").len();
    assert_eq!(
        text(&output.stderr),
        format!(
            "vramshim: wrote {} ({}, as recorded: not compacted: {STILL_WRITTEN})\n",
            log.display(),
            printed_size(size)
        )
    );
    assert_eq!(chunk_kinds(&log).1, 0);
    assert_eq!(files_in(&dir), vec!["held.vlog"]);
}

/// A real PyTorch training log (the default caching allocator: tensor events, free pairs,
/// mixed native and Python stacks), recorded by `vramshim run --no-compact`, compacts to the
/// same records and the same report.
#[test]
fn a_torch_training_log_compacts_to_the_same_records_and_report() {
    let Some(python) = torch::torch_python() else {
        return;
    };
    let dir = scratch("compact-torch");
    let log = dir.join("train.vlog");
    let script = torch::repo().join("tests/python/torch_judge.py");
    let output = Command::new(vramshim_tool())
        .arg("run")
        .arg("--no-compact")
        .arg("-o")
        .arg(&log)
        .arg("--")
        .arg(&python)
        .args(["-W", "ignore"])
        .arg(&script)
        .arg("mlp,transformer")
        .env("LD_PRELOAD", torch::fake_preload())
        .env("LD_LIBRARY_PATH", vramshim_fakegpu::LIB_DIR)
        .env("VRAMSHIM_FAKEGPU_MEMORY", (8u64 << 30).to_string())
        .env("VRAMSHIM_FAKEGPU_LOG", dir.join("unimplemented.txt"))
        .env("VRAMSHIM_COMPRESS", "0")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("PYTORCH_ALLOC_CONF")
        .env_remove("PYTORCH_NO_CUDA_MEMORY_CACHING")
        .env_remove("VRAMSHIM_OUTPUT")
        .env_remove("VRAMSHIM_STACK")
        .env_remove("VRAMSHIM_MODE")
        .output()
        .expect("vramshim run python");
    assert!(output.status.success(), "{output:?}");
    let recorded = std::fs::metadata(&log).expect("log").len();
    assert_eq!(
        text(&output.stderr),
        format!(
            "vramshim: wrote {} ({})\n",
            log.display(),
            printed_size(recorded)
        )
    );
    assert_eq!(chunk_kinds(&log).1, 0, "recorded plain");
    let dump_before = dump(&log);
    let tensor_frees = dump_before
        .iter()
        .filter(|record| record["event"] == "tensor_free")
        .count();
    assert!(tensor_frees > 100, "{tensor_frees} tensor frees");
    let report_before = json_of(&[OsStr::new("report"), OsStr::new("--json"), log.as_os_str()]);
    // Its JSON nests deeper than serde_json parses: compared as printed.
    let leaks = || {
        let output = tool(&[OsStr::new("leaks"), OsStr::new("--json"), log.as_os_str()]);
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        output.stdout
    };
    let leaks_before = leaks();

    let output = compact(&[&log]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let after = std::fs::metadata(&log).expect("log").len();
    assert_eq!(text(&output.stdout), compacted_line(&log, recorded, after));
    let (chunks, compressed) = chunk_kinds(&log);
    assert_eq!(compressed, chunks);
    assert_eq!(dump(&log), dump_before);
    assert_eq!(
        json_of(&[OsStr::new("report"), OsStr::new("--json"), log.as_os_str()]),
        report_before
    );
    assert!(leaks() == leaks_before, "leaks --json differs");
}

/// Ctrl-C (SIGINT) during a compaction stops it cleanly: the log byte for byte as recorded, no
/// temporary file left, one line, exit 130 as a shell reports a command Ctrl-C ended.
#[test]
fn an_interrupted_compaction_leaves_the_log_as_recorded() {
    use std::process::Stdio;
    // About 24 MB plain: its compaction takes most of a second, and the signal goes once the
    // temporary file exists (the compaction under way).
    let (dir, log) = plain_bench_log_of("compact-interrupted", &["1", "4000000", "4"]);
    let name = file_name_of(&log);
    let recorded = std::fs::read(&log).expect("read log");
    let mut child = Command::new(vramshim_tool())
        .arg("compact")
        .arg(&log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vramshim compact");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !files_in(&dir).iter().any(|file| file.contains(".compact-")) {
        assert!(
            child.try_wait().expect("poll compact").is_none(),
            "compact ended before it could be interrupted"
        );
        assert!(std::time::Instant::now() < deadline, "no temporary file");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // SAFETY: kill touches no memory; the child is ours and not yet waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let output = child.wait_with_output().expect("wait for compact");
    assert_eq!(output.status.code(), Some(130), "{output:?}");
    assert_eq!(text(&output.stdout), "");
    assert_eq!(
        text(&output.stderr),
        format!(
            "vramshim: {} not compacted: interrupted: left as recorded\n",
            log.display()
        )
    );
    assert!(
        std::fs::read(&log).expect("read log") == recorded,
        "the log changed"
    );
    assert_eq!(files_in(&dir), vec![name]);
}
