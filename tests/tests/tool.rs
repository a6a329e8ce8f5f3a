//! The `vramshim` binary: `run` (exit status, signals, log names, LD_PRELOAD, VRAMSHIM_LIB)
//! and `dump` (bad input, newer logs, torn and damaged logs, text output), on logs written by
//! real programs under the real preload.

mod common;

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::*;
use serde_json::Value;
use vramshim_format::{ChunkSpan, Item, LogReader, chunk_spans};

/// `vramshim ARGS` with the fake driver on the library path and no vramshim settings from the
/// test's own environment; `env` is applied last. `TMPDIR` is a fresh directory, which must be
/// empty again when `vramshim` has ended (`run`'s private manifest directory is removed).
fn vramshim(args: &[&OsStr], env: &[(&str, &OsStr)], cwd: &Path) -> (Output, u32) {
    let tmp = scratch("tool-tmpdir");
    let mut command = Command::new(vramshim_tool());
    command
        .args(args)
        .current_dir(cwd)
        .env("TMPDIR", &tmp)
        .env("LD_LIBRARY_PATH", fake_lib_dir())
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMSHIM_LIB")
        .env_remove("VRAMSHIM_OUTPUT")
        .env_remove("VRAMSHIM_STACK")
        .env_remove("VRAMSHIM_MODE")
        .env_remove("VRAMSHIM_MANIFEST");
    for (key, value) in env {
        command.env(key, value);
    }
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vramshim");
    let pid = child.id();
    let output = child.wait_with_output().expect("wait for vramshim");
    assert_eq!(files_in(&tmp), Vec::<String>::new(), "left in TMPDIR");
    (output, pid)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn run_passes_the_exit_code_of_a_program_without_cuda() {
    let dir = scratch("run-exit7");
    let output_path = dir.join("%p.vlog");
    let (output, _) = vramshim(
        &[
            OsStr::new("run"),
            OsStr::new("-o"),
            output_path.as_os_str(),
            OsStr::new("--"),
            OsStr::new("sh"),
            OsStr::new("-c"),
            OsStr::new("echo out; exit 7"),
        ],
        &[],
        &dir,
    );
    assert_eq!(output.status.code(), Some(7), "{output:?}");
    assert_eq!(text(&output.stdout), "out\n");
    assert_eq!(
        text(&output.stderr),
        "vramshim: no log written (the program made no CUDA memory call)\n"
    );
    assert_eq!(files_in(&dir), Vec::<String>::new());
}

#[test]
fn run_names_the_log_of_a_cuda_program() {
    let dir = scratch("run-oom");
    let output_path = dir.join("%p.vlog");
    let (output, vramshim_pid) = vramshim(
        &[
            OsStr::new("run"),
            OsStr::new("-o"),
            output_path.as_os_str(),
            OsStr::new("--"),
            program("oom").as_os_str(),
        ],
        &[("FAKECUDA_MEM", OsStr::new("1G"))],
        &dir,
    );
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{output:?}");
    let plain = run_plain("oom", &[], &[("FAKECUDA_MEM", "1G")]);
    assert_eq!(
        text(&output.stdout),
        text(&plain.stdout),
        "the program's output is untouched"
    );

    let logs = files_in(&dir);
    assert_eq!(logs.len(), 1, "{logs:?}");
    let log = dir.join(&logs[0]);
    let dump = dump(&log);
    let header = &dump[0];
    let pid = u64_of(header, "pid");
    assert_eq!(logs[0], format!("{pid}.vlog"));
    assert_eq!(
        u64_of(header, "ppid"),
        u64::from(vramshim_pid),
        "vramshim ran the program itself"
    );
    // Compacted after the program exited (`run` does by default).
    assert_compacted_wrote_line(&log, stderr.strip_suffix('\n').expect("one line"));
    let events = events(&dump);
    assert_eq!(
        events
            .iter()
            .map(|e| (e["event"].as_str().unwrap(), u64_of(e, "size")))
            .collect::<Vec<_>>(),
        vec![
            ("alloc", 512 << 20),
            ("alloc_failed", 768 << 20),
            ("free", 0)
        ]
    );
}

#[test]
fn run_names_every_log_of_a_process_tree() {
    let dir = scratch("run-fork");
    let output_path = dir.join("%p.vlog");
    let (output, vramshim_pid) = vramshim(
        &[
            OsStr::new("run"),
            OsStr::new("-o"),
            output_path.as_os_str(),
            OsStr::new("--"),
            program("fork").as_os_str(),
        ],
        &[],
        &dir,
    );
    assert!(output.status.success(), "{output:?}");
    let stdout = text(&output.stdout);
    let pid_after = |prefix: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in {stdout}"))
            .parse()
            .unwrap()
    };
    let (parent, child, exec) = (
        pid_after("done fork pid="),
        pid_after("child pid="),
        pid_after("exec pid="),
    );
    // Each process appends its log's name when it opens it: parent, fork child, exec child;
    // each is compacted (every process has ended, and with it its hold on its log).
    let stderr = text(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    for (pid, line) in [parent, child, exec].iter().zip(lines) {
        assert_compacted_wrote_line(&dir.join(format!("{pid}.vlog")), line);
    }
    assert_eq!(files_in(&dir).len(), 3);
    assert_eq!(
        u64_of(&dump(&dir.join(format!("{parent}.vlog")))[0], "ppid"),
        u64::from(vramshim_pid)
    );
}

#[test]
fn run_without_output_writes_the_default_name_in_the_working_directory() {
    let dir = scratch("run-default");
    let (output, _) = vramshim(
        &[
            OsStr::new("run"),
            OsStr::new("--stack"),
            OsStr::new("none"),
            OsStr::new("--"),
            program("oom").as_os_str(),
        ],
        &[("FAKECUDA_MEM", OsStr::new("1G"))],
        &dir,
    );
    assert!(output.status.success(), "{output:?}");
    let logs = files_in(&dir);
    assert_eq!(logs.len(), 1, "{logs:?}");
    let log = dir.join(&logs[0]);
    let dump = dump(&log);
    let pid = u64_of(&dump[0], "pid");
    assert_eq!(logs[0], format!("vramshim-oom.{pid}.vlog"));
    let stderr = text(&output.stderr);
    assert_compacted_wrote_line(&log, stderr.strip_suffix('\n').expect("one line"));
    assert_eq!(dump[0]["stack_mode"], "none");
    assert_eq!(events(&dump).len(), 3);
    assert!(events(&dump).iter().all(|e| u64_of(e, "stack") == 0));
}

#[test]
fn run_dies_by_the_signal_that_killed_the_program() {
    let dir = scratch("run-abort");
    let output_path = dir.join("%p.vlog");
    let (output, _) = vramshim(
        &[
            OsStr::new("run"),
            OsStr::new("-o"),
            output_path.as_os_str(),
            OsStr::new("--"),
            program("abort").as_os_str(),
        ],
        &[],
        &dir,
    );
    assert_eq!(output.status.signal(), Some(6), "{output:?}");
    let stdout = text(&output.stdout);
    let pid: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("aborting pid="))
        .expect("aborting line")
        .parse()
        .unwrap();
    let log = dir.join(format!("{pid}.vlog"));
    let stderr = text(&output.stderr);
    assert_compacted_wrote_line(&log, stderr.strip_suffix('\n').expect("one line"));
    // Every allocation made before the abort is there.
    let recorded: Vec<u64> = events(&dump(&log))
        .iter()
        .map(|e| u64_of(e, "addr"))
        .collect();
    let printed: Vec<u64> = program_ops(&stdout)
        .iter()
        .map(|op| op.num("addr"))
        .collect();
    assert_eq!(printed.len(), 5);
    assert_eq!(recorded, printed);
    // Core files, if the system writes any, land in the scratch dir; no other file does.
    assert!(
        files_in(&dir)
            .iter()
            .all(|f| f == &format!("{pid}.vlog") || f.starts_with("core")),
        "{:?}",
        files_in(&dir)
    );
}

#[test]
fn run_forwards_sigterm_to_the_program() {
    let dir = scratch("run-sigterm");
    let mut child = Command::new(vramshim_tool())
        .args(["run", "--", "sh", "-c"])
        .arg("trap 'kill $! 2>/dev/null; echo got TERM; exit 3' TERM; echo ready; sleep 5 >/dev/null 2>&1 & wait")
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", fake_lib_dir())
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMSHIM_LIB")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vramshim");
    // Wait until the program has set its trap.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 6];
    std::io::Read::read_exact(&mut stdout, &mut first).expect("ready line");
    assert_eq!(&first, b"ready\n");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let started = std::time::Instant::now();
    let status = child.wait().expect("wait");
    let waited = started.elapsed();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(3), "{status:?} {stderr}");
    assert_eq!(rest, "got TERM\n");
    assert!(
        waited < std::time::Duration::from_secs(4),
        "the program was not told"
    );
    assert_eq!(
        stderr,
        "vramshim: no log written (the program made no CUDA memory call)\n"
    );
}

#[test]
fn run_keeps_an_existing_ld_preload() {
    let dir = scratch("run-preload");
    let other = fake_lib_dir().join("libcuda.so.1");
    let (output, _) = vramshim(
        &[
            OsStr::new("run"),
            OsStr::new("--"),
            OsStr::new("sh"),
            OsStr::new("-c"),
            OsStr::new("printf '%s\\n' \"$LD_PRELOAD\""),
        ],
        &[("LD_PRELOAD", other.as_os_str())],
        &dir,
    );
    assert!(output.status.success(), "{output:?}");
    let library = shim().canonicalize().unwrap();
    assert_eq!(
        text(&output.stdout),
        format!("{}:{}\n", library.display(), other.display())
    );
    assert_eq!(
        text(&output.stderr),
        "vramshim: no log written (the program made no CUDA memory call)\n"
    );
}

#[test]
fn run_with_a_missing_vramshim_lib_fails_before_running_anything() {
    let dir = scratch("run-nolib");
    let missing = dir.join("no-such-libvramshim.so");
    let marker = dir.join("ran");
    let (output, _) = vramshim(
        &[
            OsStr::new("run"),
            OsStr::new("--"),
            OsStr::new("touch"),
            marker.as_os_str(),
        ],
        &[("VRAMSHIM_LIB", missing.as_os_str())],
        &dir,
    );
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert_eq!(text(&output.stdout), "");
    assert_eq!(
        text(&output.stderr),
        format!(
            "vramshim: VRAMSHIM_LIB={} is not a file\n",
            missing.display()
        )
    );
    assert!(!marker.exists(), "the program ran");
}

#[test]
fn run_of_a_program_that_cannot_be_executed_exits_126() {
    let dir = scratch("run-not-executable");
    // A file without execute permission, and an executable file no loader can run.
    let plain = dir.join("notes.txt");
    std::fs::write(&plain, "not a program\n").expect("write");
    let garbage = dir.join("garbage");
    std::fs::write(&garbage, [0u8; 64]).expect("write");
    std::fs::set_permissions(&garbage, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for program in [&plain, &garbage] {
        let (output, _) = vramshim(
            &[OsStr::new("run"), OsStr::new("--"), program.as_os_str()],
            &[],
            &dir,
        );
        assert_eq!(output.status.code(), Some(126), "{output:?}");
        let stderr = text(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!("vramshim: cannot run {}: ", program.display())),
            "{stderr}"
        );
    }
}

#[test]
fn run_without_the_double_dash_suggests_it() {
    let dir = scratch("run-no-dash");
    for launcher in ["run", "dryrun"] {
        let (output, _) = vramshim(
            &[OsStr::new(launcher), OsStr::new("ls"), OsStr::new("-l")],
            &[],
            &dir,
        );
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains("unexpected argument 'ls'"), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "tip: put the program after `--`: vramshim {launcher} [OPTIONS] -- PROGRAM [ARGS...]"
            )),
            "{stderr}"
        );
    }
}

#[test]
fn unfold_is_an_option_of_the_commands_that_print_stacks_only() {
    let dir = scratch("unfold-option");
    let help = |command: &str| -> String {
        let (output, _) = vramshim(&[OsStr::new(command), OsStr::new("--help")], &[], &dir);
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        text(&output.stdout)
    };
    for command in [
        "report",
        "peak",
        "leaks",
        "oom",
        "breakdown",
        "diff",
        "dryrun",
    ] {
        assert!(help(command).contains("--unfold"), "{command}");
    }
    for command in [
        "run",
        "lines",
        "steps",
        "advise",
        "timeline",
        "flamegraph",
        "html",
        "allocator",
        "whatif",
        "export",
        "dump",
    ] {
        assert!(!help(command).contains("--unfold"), "{command}");
    }
    // Not an option of the tool as a whole (it was, as a global flag, once).
    let (output, _) = vramshim(
        &[
            OsStr::new("timeline"),
            OsStr::new("--unfold"),
            OsStr::new("x.vlog"),
        ],
        &[],
        &dir,
    );
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        text(&output.stderr).contains("unexpected argument '--unfold'"),
        "{output:?}"
    );
}

#[test]
fn run_of_a_missing_program_exits_127() {
    let dir = scratch("run-missing-program");
    let missing = dir.join("no-such-program");
    let (output, _) = vramshim(
        &[OsStr::new("run"), OsStr::new("--"), missing.as_os_str()],
        &[],
        &dir,
    );
    assert_eq!(output.status.code(), Some(127), "{output:?}");
    assert_eq!(text(&output.stdout), "");
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("vramshim: cannot run {}: ", missing.display())),
        "{stderr}"
    );
    assert_eq!(files_in(&dir), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------
// dump

fn dump_output(log: &Path, json: bool) -> Output {
    let mut args = vec![OsStr::new("dump")];
    if json {
        args.push(OsStr::new("--json"));
    }
    args.push(log.as_os_str());
    tool(&args)
}

fn json_lines(output: &Output) -> Vec<Value> {
    text(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
        .collect()
}

#[test]
fn dump_of_a_missing_file_names_it() {
    let dir = scratch("dump-missing");
    let missing = dir.join("nothing-here.vlog");
    let output = dump_output(&missing, true);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(text(&output.stdout), "");
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("vramshim: cannot open {}", missing.display())),
        "{stderr}"
    );
}

#[test]
fn dump_of_a_text_file_says_it_is_not_a_log() {
    let dir = scratch("dump-text");
    let file = dir.join("notes.txt");
    std::fs::write(&file, "just some text\nnothing else\n").unwrap();
    let output = dump_output(&file, true);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(text(&output.stdout), "");
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&file.display().to_string()), "{stderr}");
    assert!(stderr.contains("not a vramshim log"), "{stderr}");
}

/// A small real log (`oom`: three events).
fn small_log(test: &str) -> PathBuf {
    let run = run_under_shim(test, "oom", &[], &[("FAKECUDA_MEM", "1G")]);
    assert!(run.output.status.success(), "{}", run.stderr());
    run.log()
}

#[test]
fn dump_of_a_newer_log_says_so() {
    let original = small_log("dump-newer-src");
    let mut bytes = std::fs::read(&original).unwrap();
    assert_eq!(&bytes[..8], b"VRAMSHIM");
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 7);
    bytes[8..12].copy_from_slice(&8u32.to_le_bytes());
    let dir = scratch("dump-newer");
    let newer = dir.join("newer.vlog");
    std::fs::write(&newer, &bytes).unwrap();
    let output = dump_output(&newer, true);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(text(&output.stdout), "");
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&newer.display().to_string()), "{stderr}");
    assert!(stderr.contains("newer"), "{stderr}");
    assert!(stderr.contains("version 8"), "{stderr}");
}

/// Where the chunks of a log lie (key and continued chunks, format 6).
fn chunks(bytes: &[u8]) -> Vec<ChunkSpan> {
    assert_eq!(&bytes[..8], b"VRAMSHIM");
    let spans = chunk_spans(bytes);
    let end = spans.last().map_or(0, |span| span.start + span.len());
    assert_eq!(end, bytes.len(), "the log ends with a whole chunk");
    spans
}

/// Records of `bytes` (a log cut anywhere), decoded with the format crate, and its damage.
fn read_records(bytes: &[u8]) -> (usize, Vec<String>) {
    let mut records = 0;
    let mut damage = Vec::new();
    for item in LogReader::new(std::io::Cursor::new(bytes)).expect("header") {
        match item {
            Item::Record(_) => records += 1,
            Item::Damage(found) => damage.push(found.to_string()),
        }
    }
    (records, damage)
}

/// Records in each chunk: those of the log up to its end less those before it (a continued
/// chunk decodes only after the chunks before it).
fn records_per_chunk(bytes: &[u8]) -> Vec<usize> {
    let mut before = 0;
    chunks(bytes)
        .iter()
        .map(|span| {
            let (upto, damage) = read_records(&bytes[..span.start + span.len()]);
            assert!(damage.is_empty(), "chunk at {}: {damage:?}", span.start);
            let count = upto - before;
            before = upto;
            count
        })
        .collect()
}

const BENCH_PAIRS: u64 = 100_000;

/// A real log with several chunks: one thread, 100,000 alloc/free pairs, about 1.2 MB of
/// records, so the writer's 256 KiB chunk limit alone makes at least 3 chunks however the
/// drains fall in time (with 20,000 pairs a quick run fitted in 2 since a chunk stays open
/// through a busy stretch, and format 5 writes no exit chunk of its own). Made once.
fn chunked_log() -> &'static (PathBuf, Vec<Value>) {
    static LOG: OnceLock<(PathBuf, Vec<Value>)> = OnceLock::new();
    LOG.get_or_init(|| {
        let pairs = BENCH_PAIRS.to_string();
        let run = run_under_shim("chunked", "bench", &["1", &pairs, "0"], &[]);
        assert!(run.output.status.success(), "{}", run.stderr());
        assert!(
            run.stdout()
                .starts_with(&format!("threads=1 pairs={BENCH_PAIRS} "))
        );
        let log = run.log();
        let output = dump_output(&log, true);
        assert!(output.status.success());
        assert_eq!(text(&output.stderr), "");
        let dump = json_lines(&output);
        let events = events(&dump);
        assert_eq!(
            select(&events, "alloc", "cuMemAlloc_v2").len() as u64,
            BENCH_PAIRS
        );
        assert_eq!(
            select(&events, "free", "cuMemFree_v2").len() as u64,
            BENCH_PAIRS
        );
        assert!(
            events
                .iter()
                .all(|e| u64_of(e, "size") == 4096 || e["event"] == "free")
        );
        let bytes = std::fs::read(&log).unwrap();
        assert!(chunks(&bytes).len() >= 3, "need at least 3 chunks");
        assert_eq!(
            records_per_chunk(&bytes).iter().sum::<usize>(),
            dump.len() - 1,
            "every record of the dump is in some chunk"
        );
        (log, dump)
    })
}

#[test]
fn dump_of_a_log_torn_in_its_last_chunk_prints_everything_before() {
    let (log, original) = chunked_log();
    let bytes = std::fs::read(log).unwrap();
    let chunks = chunks(&bytes);
    let per_chunk = records_per_chunk(&bytes);
    let last = chunks.last().unwrap();
    let last_start = last.start;
    let cut = last_start + last.head + last.payload / 2;
    let dir = scratch("dump-torn");
    let torn = dir.join("torn.vlog");
    std::fs::write(&torn, &bytes[..cut]).unwrap();

    let output = dump_output(&torn, true);
    assert_eq!(output.status.code(), Some(0));
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "vramshim: warning: {}: log ends in an incomplete chunk at byte {last_start} ({} bytes unusable)",
            torn.display(),
            cut - last_start
        )),
        "{stderr}"
    );
    let dump = json_lines(&output);
    let kept = 1 + per_chunk[..per_chunk.len() - 1].iter().sum::<usize>();
    assert_eq!(
        dump.len(),
        kept + 1,
        "every record before the torn chunk, then the damage"
    );
    assert_eq!(&dump[..kept], &original[..kept]);
    let damage = &dump[kept];
    assert_eq!(damage["type"], "damage");
    assert_eq!(u64_of(damage, "offset"), last_start as u64);
}

#[test]
fn dump_skips_a_damaged_middle_chunk_and_goes_on() {
    let (log, original) = chunked_log();
    let bytes = std::fs::read(log).unwrap();
    dump_of_damaged_chunk_reads_from_the_next_key_chunk("dump-flipped", &bytes, original, 1);
}

/// Flips a byte in the middle of chunk `victim`'s payload of the log `bytes` (whose `dump
/// --json` is `original`): `dump` must warn of the damaged chunk, then, if continued chunks
/// follow it, of exactly those (up to the next key chunk), and print every other record
/// exactly, a damage line for each warning in place. Returns the damaged log's path and the
/// warnings.
fn dump_of_damaged_chunk_reads_from_the_next_key_chunk(
    test: &str,
    bytes: &[u8],
    original: &[Value],
    victim: usize,
) -> (PathBuf, Vec<String>) {
    let chunks = chunks(bytes);
    let per_chunk = records_per_chunk(bytes);
    let damaged_chunk = chunks[victim];
    let mut bytes = bytes.to_vec();
    bytes[damaged_chunk.start + damaged_chunk.head + damaged_chunk.payload / 2] ^= 0xff;
    // The continued chunks right after it carry on from its state: lost with it.
    let lost_after = chunks[victim + 1..]
        .iter()
        .take_while(|span| !span.key)
        .count();
    let dir = scratch(test);
    let flipped = dir.join("flipped.vlog");
    std::fs::write(&flipped, &bytes).unwrap();

    let output = dump_output(&flipped, true);
    assert_eq!(output.status.code(), Some(0));
    let mut warnings = vec![format!(
        "{}: damaged chunk at byte {} ({} bytes, checksum mismatch) skipped",
        flipped.display(),
        damaged_chunk.start,
        // The whole chunk, its head included.
        damaged_chunk.len()
    )];
    if lost_after > 0 {
        let first = chunks[victim + 1];
        let bytes: usize = chunks[victim + 1..=victim + lost_after]
            .iter()
            .map(|span| span.len())
            .sum();
        warnings.push(format!(
            "{}: {lost_after} continued chunk{} at byte {} ({bytes} bytes) skipped: {} on the damaged chunk before {}; reading resumes at the next key chunk",
            flipped.display(),
            if lost_after == 1 { "" } else { "s" },
            first.start,
            if lost_after == 1 { "it carries" } else { "they carry" },
            if lost_after == 1 { "it" } else { "them" },
        ));
    }
    let expected_stderr: String = warnings
        .iter()
        .map(|warning| format!("vramshim: warning: {warning}\n"))
        .collect();
    assert_eq!(text(&output.stderr), expected_stderr);
    let dump = json_lines(&output);
    // The header line, then the records of the chunks before the damage.
    let before = 1 + per_chunk[..victim].iter().sum::<usize>();
    let skipped: usize = per_chunk[victim..=victim + lost_after].iter().sum();
    assert_eq!(dump.len(), original.len() - skipped + warnings.len());
    assert_eq!(&dump[..before], &original[..before]);
    for (at, warning) in warnings.iter().enumerate() {
        let line = &dump[before + at];
        assert_eq!(line["type"], "damage");
        assert_eq!(
            format!(
                "{}: {}",
                flipped.display(),
                line["message"].as_str().unwrap()
            ),
            *warning
        );
    }
    assert_eq!(u64_of(&dump[before], "offset"), damaged_chunk.start as u64);
    // Every record from the next key chunk on is there, exactly.
    assert_eq!(
        &dump[before + warnings.len()..],
        &original[before + skipped..]
    );
    (flipped, warnings)
}

#[test]
fn a_damaged_continued_chunk_loses_exactly_the_chunks_up_to_the_next_key_chunk() {
    // A drain every millisecond at full time resolution: 100,000 pairs in many small chunks,
    // most of them continued, a key chunk after every 64 KiB of records.
    let pairs = BENCH_PAIRS.to_string();
    let run = run_under_shim(
        "continued-damaged-src",
        "bench",
        &["1", &pairs, "0"],
        &[("VRAMSHIM_FLUSH_MS", "1")],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let log = run.log();
    let output = dump_output(&log, true);
    assert!(output.status.success());
    assert_eq!(text(&output.stderr), "");
    let original = json_lines(&output);
    assert_eq!(events(&original).len() as u64, 2 * BENCH_PAIRS);
    let bytes = std::fs::read(&log).unwrap();
    let chunks = chunks(&bytes);
    // A continued chunk followed by another continued one, then, later, a key chunk.
    let victim = (1..chunks.len().saturating_sub(2))
        .find(|&at| {
            !chunks[at].key && !chunks[at + 1].key && chunks[at + 2..].iter().any(|span| span.key)
        })
        .unwrap_or_else(|| {
            panic!(
                "no continued chunks before a key chunk: {:?}",
                chunks.iter().map(|span| span.key).collect::<Vec<_>>()
            )
        });
    let (flipped, warnings) = dump_of_damaged_chunk_reads_from_the_next_key_chunk(
        "continued-damaged",
        &bytes,
        &original,
        victim,
    );
    assert_eq!(warnings.len(), 2);
    // The report says the same, and counts the events of the chunks read.
    let (code, stdout, stderr) = common::vramshim(&[
        OsStr::new("report"),
        OsStr::new("--json"),
        flipped.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let json: Value = serde_json::from_str(&stdout).unwrap();
    let shown: Vec<&str> = json["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(shown[..2], [warnings[0].as_str(), warnings[1].as_str()]);
    let dump = json_lines(&dump_output(&flipped, true));
    assert_eq!(
        u64_of(&json["processes"][0], "events"),
        events(&dump).len() as u64
    );
}

#[test]
fn dump_text_shows_one_line_per_event() {
    let run = run_under_shim("dump-text-mode", "direct", &[], &[]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let log = run.log();
    let json = dump(&log);
    let events = events(&json);
    assert_eq!(events.len(), 19);
    let output = dump_output(&log, false);
    assert!(output.status.success());
    assert_eq!(text(&output.stderr), "");
    let stdout = text(&output.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains(" tid ")).collect();
    assert_eq!(lines.len(), events.len(), "{stdout}");
    for (line, event) in lines.iter().zip(&events) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[1], "tid", "{line}");
        assert_eq!(words[2], event["thread"].to_string(), "{line}");
        assert_eq!(words[3], event["event"].as_str().unwrap(), "{line}");
        assert_eq!(words[4], event["api"].as_str().unwrap(), "{line}");
        assert!(
            line.contains(&format!(" size {} ", u64_of(event, "size"))),
            "{line}"
        );
        match (u64_of(event, "addr"), u64_of(event, "handle")) {
            (0, handle) => {
                assert_ne!(handle, 0);
                assert!(!line.contains(" addr "), "{line}");
                assert!(line.contains(&format!(" handle {handle:#x}")), "{line}");
            }
            (addr, _) => assert!(line.contains(&format!(" addr {addr:#x} ")), "{line}"),
        }
    }
    // The header is shown as comments.
    assert!(stdout.starts_with("# vramshim log, format 7"), "{stdout}");
    assert!(
        stdout.contains(&format!("# pid {} ", json[0]["pid"])),
        "{stdout}"
    );
}

#[test]
fn run_refuses_an_output_it_cannot_write_before_starting_the_program() {
    let dir = scratch("run-bad-output");
    let started = dir.join("started");
    let script = format!("touch '{}'", started.display());
    let missing = dir.join("missing").join("%p.vlog");
    let (output, _) = vramshim(
        &[
            OsStr::new("run"),
            OsStr::new("-o"),
            missing.as_os_str(),
            OsStr::new("--"),
            OsStr::new("sh"),
            OsStr::new("-c"),
            OsStr::new(&script),
        ],
        &[],
        &dir,
    );
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert_eq!(
        text(&output.stderr),
        format!(
            "vramshim: cannot write the log to {}: {}: No such file or directory (os error 2); \
             the program was not started\n",
            missing.display(),
            dir.join("missing").display()
        )
    );
    assert!(!started.exists(), "the program was started");
    assert_eq!(files_in(&dir), Vec::<String>::new());
}

/// `scripts/demo.sh DIR` shows the build going on, keeps the log and the pictures in DIR and
/// ends with the commands that open them.
#[test]
fn demo_script_keeps_its_log_and_pictures_and_says_how_to_open_them() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf();
    let target = target_dir().parent().expect("cargo target").to_path_buf();
    let dir = scratch("demo-script").join("kept");
    let output = Command::new("timeout")
        .arg("900")
        .arg("bash")
        .arg(repo.join("scripts/demo.sh"))
        .arg(&dir)
        .current_dir(&repo)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMSHIM_OUTPUT")
        .output()
        .expect("run scripts/demo.sh");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    // Cargo's own progress lines are shown, not hidden by --quiet.
    assert!(
        stderr.contains("Finished `dev` profile"),
        "no build progress in:\n{stderr}"
    );
    let vramshim = vramshim_tool();
    let log = dir.join("demo.vlog");
    for expected in [
        format!("The log and the pictures are kept in {}:", dir.display()),
        format!(
            "  xdg-open {}/report.html       # the whole report, in a browser (works offline)",
            dir.display()
        ),
        format!(
            "  xdg-open {}/timeline.svg      # also leaks.svg, oom.svg: SVG opens in any browser",
            dir.display()
        ),
        format!(
            "  {} report {}   # or peak, leaks, oom, timeline, dump ... on the log",
            vramshim.display(),
            log.display()
        ),
    ] {
        assert!(
            stdout.lines().any(|line| line == expected),
            "no {expected:?} in:\n{stdout}"
        );
    }
    assert_eq!(
        files_in(&dir),
        [
            "demo.vlog",
            "leaks.svg",
            "oom.svg",
            "report.html",
            "timeline.svg"
        ]
    );
    // The kept log is the demo's: 5 leaked 16 MiB buffers and the failed 1200 MiB request.
    let (code, leaks, _) = common::vramshim(&[
        OsStr::new("leaks"),
        log.as_os_str(),
        OsStr::new("--device"),
        OsStr::new("0"),
    ]);
    assert_eq!(code, Some(0));
    assert!(leaks.contains("device 0: still live at exit"), "{leaks}");
    assert!(leaks.contains("80.00 MiB in 5 allocations"), "{leaks}");
    for picture in ["timeline.svg", "leaks.svg", "oom.svg"] {
        let svg = std::fs::read_to_string(dir.join(picture)).expect("picture");
        well_formed(&svg);
    }
    let page = std::fs::read_to_string(dir.join("report.html")).expect("page");
    assert!(page.starts_with("<!DOCTYPE html>"), "{}", &page[..100]);
}
