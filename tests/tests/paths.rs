//! Where the log and `vramshim run`'s manifest go, under the real preload: what is already at
//! the output path (a FIFO, a device, a symlink, someone else's file, a stale log), processes
//! started together on one fixed path, a file-size limit (`ulimit -f`), and planted files
//! around the manifest.
//! Every run is killed after a generous timeout, so a hang fails the test instead of hanging
//! the suite.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// Far more than any of these runs needs on a loaded 2-core machine.
const TIMEOUT: Duration = Duration::from_secs(120);

/// What a finished process left: status, stdout, stderr.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Waits for `child` (stdout and stderr piped); kills it and fails the test after `TIMEOUT`.
fn finish(mut child: Child, what: &str) -> Finished {
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} hung: killed after {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Finished {
        status,
        stdout: out_reader.join().expect("stdout reader"),
        stderr: err_reader.join().expect("stderr reader"),
    }
}

/// Starts `command` with piped output and no stdin.
fn start(command: &mut Command) -> Child {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start program")
}

/// Runs test program `name` under the shim with `VRAMSHIM_OUTPUT=output` and `env`.
fn run_with_output(name: &str, output: &OsStr, env: &[(&str, &str)]) -> Finished {
    let unused = scratch("unused-log-dir");
    let mut command = shim_command(&program(name), &unused);
    command.env("VRAMSHIM_OUTPUT", output);
    for (key, value) in env {
        command.env(key, value);
    }
    let finished = finish(start(&mut command), name);
    assert_eq!(files_in(&unused), Vec::<String>::new());
    finished
}

/// `oom`'s stdout without the shim (the fake's addresses are deterministic).
fn plain_oom_stdout() -> String {
    let plain = run_plain("oom", &[], &[("FAKECUDA_MEM", "1G")]);
    assert!(plain.status.success());
    String::from_utf8_lossy(&plain.stdout).into_owned()
}

/// The events of a log as (event, api, addr, size, result), after checking that the tool
/// reads it without a warning (no torn or damaged chunk).
fn event_shapes(log: &Path) -> Vec<(String, String, u64, u64, u64)> {
    let output = tool(&[OsStr::new("dump"), OsStr::new("--json"), log.as_os_str()]);
    assert!(output.status.success(), "dump {} failed", log.display());
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "",
        "{} is not clean",
        log.display()
    );
    let records: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect();
    events(&records)
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or_default().to_owned(),
                e["api"].as_str().unwrap_or_default().to_owned(),
                u64_of(e, "addr"),
                u64_of(e, "size"),
                u64_of(e, "result"),
            )
        })
        .collect()
}

/// What the program printed it did, in the shape of [`event_shapes`].
fn printed_shapes(stdout: &str) -> Vec<(String, String, u64, u64, u64)> {
    program_ops(stdout)
        .iter()
        .filter(|op| op.op == "alloc" || op.op == "free")
        .map(|op| {
            let failed = op.num("rc") != 0;
            (
                if failed && op.op == "alloc" {
                    "alloc_failed".to_owned()
                } else {
                    op.op.clone()
                },
                op.api.clone(),
                op.num("addr"),
                if op.op == "free" { 0 } else { op.num("size") },
                op.num("rc"),
            )
        })
        .collect()
}

fn header_pid(log: &Path) -> u64 {
    u64_of(&dump(log)[0], "pid")
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_fifo())
}

/// Anything but a new regular file is refused at once: one line, no log, the program's output
/// and exit status as without the shim.
#[test]
fn a_fifo_a_device_or_a_symlink_at_the_output_path_is_refused_without_blocking() {
    let dir = scratch("paths-special");
    let fifo = dir.join("fifo.vlog");
    mkfifo(&fifo);
    let fifo_link = dir.join("fifo-link.vlog");
    std::os::unix::fs::symlink(&fifo, &fifo_link).expect("symlink");
    let elsewhere = scratch("paths-elsewhere");
    let dir_link = dir.join("dir-link");
    std::os::unix::fs::symlink(&elsewhere, &dir_link).expect("symlink");
    let plain = plain_oom_stdout();
    for (output, what) in [
        (fifo.clone(), "a FIFO"),
        (fifo_link.clone(), "a symbolic link"),
        (PathBuf::from("/dev/null"), "a character device"),
        (dir_link.clone(), "a symbolic link"),
    ] {
        let run = run_with_output("oom", output.as_os_str(), &[("FAKECUDA_MEM", "1G")]);
        assert!(
            run.status.success(),
            "{output:?}: {:?} {}",
            run.status,
            run.stderr
        );
        assert_eq!(run.stdout, plain, "{output:?}");
        assert_eq!(
            run.stderr,
            format!(
                "vramshim: cannot create log {}: it is {what} (only a new regular file is \
                 written); the program runs unrecorded\n",
                output.display()
            )
        );
    }
    assert!(is_fifo(&fifo));
    assert_eq!(
        files_in(&dir),
        vec!["dir-link", "fifo-link.vlog", "fifo.vlog"]
    );
    assert_eq!(files_in(&elsewhere), Vec::<String>::new());
}

/// A file someone else made keeps its content and mode; the log is a new private file beside
/// it, and one line says where.
#[test]
fn an_existing_file_is_never_written_and_the_log_goes_beside_it() {
    let dir = scratch("paths-existing");
    let taken = dir.join("out.vlog");
    std::fs::write(&taken, "not yours\n").expect("write");
    std::fs::set_permissions(&taken, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let run = run_with_output("oom", taken.as_os_str(), &[("FAKECUDA_MEM", "1G")]);
    assert!(run.status.success(), "{:?} {}", run.status, run.stderr);
    assert_eq!(run.stdout, plain_oom_stdout());
    assert_eq!(std::fs::read_to_string(&taken).unwrap(), "not yours\n");
    let mode = std::fs::metadata(&taken).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o666);

    let names = files_in(&dir);
    assert_eq!(names.len(), 2, "{names:?}");
    let log = dir.join(names.iter().find(|n| *n != "out.vlog").unwrap());
    let pid = header_pid(&log);
    assert_eq!(log, dir.join(format!("out.{pid}.vlog")));
    let mode = std::fs::metadata(&log).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o600, "mode {mode:o}");
    assert_eq!(
        run.stderr,
        format!(
            "vramshim: {} already exists; logging to {}\n",
            taken.display(),
            log.display()
        )
    );
    assert_eq!(event_shapes(&log), printed_shapes(&run.stdout));
    assert_eq!(event_shapes(&log).len(), 3);
}

/// 24 processes started at once with one fixed `VRAMSHIM_OUTPUT`: 24 complete logs, each with
/// exactly its own process's events, and every name but the first said on stderr.
#[test]
fn processes_started_together_on_one_path_each_keep_a_complete_log() {
    const PROCESSES: usize = 24;
    let dir = scratch("paths-together");
    let fixed = dir.join("fixed.vlog");
    let unused = scratch("paths-together-unused");
    let children: Vec<Child> = (0..PROCESSES)
        .map(|_| {
            let mut command = shim_command(&program("oom"), &unused);
            command
                .env("VRAMSHIM_OUTPUT", &fixed)
                .env("FAKECUDA_MEM", "1G");
            start(&mut command)
        })
        .collect();
    let runs: Vec<(u32, Finished)> = children
        .into_iter()
        .map(|child| (child.id(), finish(child, "oom")))
        .collect();

    let names = files_in(&dir);
    let mut logs_by_pid: HashMap<u64, PathBuf> = HashMap::new();
    for name in &names {
        let log = dir.join(name);
        assert!(
            logs_by_pid.insert(header_pid(&log), log.clone()).is_none(),
            "two logs of one process"
        );
    }
    assert_eq!(
        names.len(),
        PROCESSES,
        "logs written: {names:?}\nstderr: {:?}",
        runs.iter().map(|(_, r)| &r.stderr).collect::<Vec<_>>()
    );
    let mut said = BTreeSet::new();
    let mut unannounced = 0;
    for (pid, run) in &runs {
        assert!(
            run.status.success(),
            "pid {pid}: {:?} {}",
            run.status,
            run.stderr
        );
        let log = logs_by_pid
            .get(&u64::from(*pid))
            .unwrap_or_else(|| panic!("no log of pid {pid} in {names:?}"));
        assert_eq!(event_shapes(log), printed_shapes(&run.stdout), "pid {pid}");
        assert_eq!(event_shapes(log).len(), 3, "pid {pid}");
        if *log == fixed {
            assert_eq!(run.stderr, "");
            unannounced += 1;
        } else {
            assert_eq!(*log, dir.join(format!("fixed.{pid}.vlog")));
            assert_eq!(
                run.stderr,
                format!(
                    "vramshim: {} already exists; logging to {}\n",
                    fixed.display(),
                    log.display()
                )
            );
            said.insert(log.clone());
        }
    }
    assert_eq!(unannounced, 1);
    assert_eq!(said.len(), PROCESSES - 1);
}

/// Runs `bench 1 PAIRS 1` under the shim with the file-size limit at `limit` bytes.
fn bench_under_fsize_limit(dir: &Path, limit: u64, pairs: u32, env: &[(&str, &str)]) -> Finished {
    let mut command = shim_command(&program("bench"), dir);
    command
        .args(["1", &pairs.to_string(), "1"])
        .env("VRAMSHIM_OUTPUT", dir.join("bench.vlog"))
        .env("FAKECUDA_MEM", "unlimited");
    for (key, value) in env {
        command.env(key, value);
    }
    finish_under_fsize_limit(command, limit)
}

/// Runs `command` with the file-size limit (soft and hard) at `limit` bytes and without stacks.
fn finish_under_fsize_limit(mut command: Command, limit: u64) -> Finished {
    command.env("VRAMSHIM_STACK", "none");
    unsafe {
        command.pre_exec(move || {
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    finish(start(&mut command), "program under a file-size limit")
}

/// `ulimit -f`: the log stops at the last whole chunk that fits, with one warning; the program
/// is not killed by SIGXFSZ and ends as it would. Checked with the writer thread's periodic
/// drain, and with a small buffer and a long interval, where chunks are written when a buffer
/// fills (by the program's thread or the writer woken early). The failed-allocation test below
/// pins the write to the program's own thread.
#[test]
fn a_file_size_limit_stops_recording_but_never_the_program() {
    // Plain (the recorder's default), the 400,000 events take about 1.2 MB, in chunks of at
    // most 256 KiB of records: the limit holds a few of them, well below the whole.
    const LIMIT: u64 = 1 << 19;
    const PAIRS: u32 = 200_000;
    for (case, env) in [
        ("writer thread", &[][..]),
        (
            "program thread",
            &[
                ("VRAMSHIM_FLUSH_MS", "60000"),
                ("VRAMSHIM_BUFFER_EVENTS", "1024"),
            ][..],
        ),
    ] {
        let dir = scratch("paths-fsize");
        let run = bench_under_fsize_limit(&dir, LIMIT, PAIRS, env);
        assert_eq!(run.status.signal(), None, "{case}: {:?}", run.status);
        assert_eq!(run.status.code(), Some(0), "{case}: {}", run.stderr);
        assert!(
            run.stdout
                .starts_with("threads=1 pairs=200000 depth=1 ns_per_pair="),
            "{case}: {}",
            run.stdout
        );
        let log = dir.join("bench.vlog");
        assert_eq!(
            run.stderr,
            format!(
                "vramshim: cannot write to {}: the file size limit (ulimit -f) of {LIMIT} bytes \
                 is reached; recording stops here (what was written stays readable)\n",
                log.display()
            ),
            "{case}"
        );
        let size = std::fs::metadata(&log).unwrap().len();
        assert!(size <= LIMIT, "{case}: {size}");
        // Whole chunks only, and a prefix of what the program did: alloc/free pairs of 4 KiB.
        let shapes = event_shapes(&log);
        assert!(shapes.len() > 100, "{case}: only {} events", shapes.len());
        assert!(shapes.len() < 2 * PAIRS as usize, "{case}");
        for (i, (event, api, _, size, result)) in shapes.iter().enumerate() {
            let expected = if i % 2 == 0 {
                ("alloc", "cuMemAlloc_v2", 4096)
            } else {
                ("free", "cuMemFree_v2", 0)
            };
            assert_eq!(
                (event.as_str(), api.as_str(), *size, *result),
                (expected.0, expected.1, expected.2, 0),
                "{case}: event {i}"
            );
        }
        assert_eq!(files_in(&dir), vec!["bench.vlog"], "{case}");
    }
}

/// The limit reached by the program's own thread: `oom`'s failed allocation writes at once
/// (the writer thread, with a long interval and a nearly empty buffer, never wakes), and the
/// limit leaves room for the header only. Before the fix SIGXFSZ killed `oom` there.
#[test]
fn a_file_size_limit_reached_at_a_failed_allocation_leaves_the_program_alone() {
    let slow_writer = [("FAKECUDA_MEM", "1G"), ("VRAMSHIM_FLUSH_MS", "60000")];
    let free = scratch("paths-fsize-free");
    let mut command = shim_command(&program("oom"), &free);
    command.envs(slow_writer);
    let unlimited = finish_under_fsize_limit(command, libc::RLIM_INFINITY);
    assert!(unlimited.status.success(), "{}", unlimited.stderr);
    let full = std::fs::read(dir_log(&free)).expect("read log");
    // Header: 8 magic bytes, version, body length, checksum (u32 each), then the body.
    let header_len = 20 + u64::from(u32::from_le_bytes(full[12..16].try_into().unwrap()));
    assert!(header_len + 10 < full.len() as u64);

    let dir = scratch("paths-fsize-oom");
    let mut command = shim_command(&program("oom"), &dir);
    command.envs(slow_writer);
    let run = finish_under_fsize_limit(command, header_len + 10);
    assert_eq!(run.status.signal(), None, "{:?}", run.status);
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, plain_oom_stdout());
    let log = dir_log(&dir);
    assert_eq!(
        run.stderr,
        format!(
            "vramshim: cannot write to {}: the file size limit (ulimit -f) of {} bytes is \
             reached; recording stops here (what was written stays readable)\n",
            log.display(),
            header_len + 10
        )
    );
    assert_eq!(std::fs::metadata(&log).unwrap().len(), header_len);
    assert_eq!(event_shapes(&log), Vec::new());
    assert_eq!(log, dir.join(format!("{}.vlog", header_pid(&log))));
}

/// The one log in `dir`.
fn dir_log(dir: &Path) -> PathBuf {
    let names = files_in(dir);
    assert_eq!(names.len(), 1, "{names:?}");
    dir.join(&names[0])
}

/// `vramshim ARGS` as the tests of `run` use it, with `TMPDIR` pointing at `tmp`; stdin is
/// piped so the caller can hold the program back.
fn vramshim_run(args: &[&OsStr], tmp: &Path, cwd: &Path, env: &[(&str, &OsStr)]) -> Child {
    let mut command = Command::new(vramshim_tool());
    command
        .args(args)
        .current_dir(cwd)
        .env("LD_LIBRARY_PATH", fake_lib_dir())
        .env("TMPDIR", tmp)
        .env("FAKECUDA_MEM", "1G")
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMSHIM_LIB")
        .env_remove("VRAMSHIM_OUTPUT")
        .env_remove("VRAMSHIM_STACK")
        .env_remove("VRAMSHIM_MODE")
        .env_remove("VRAMSHIM_MANIFEST");
    for (key, value) in env {
        command.env(key, value);
    }
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vramshim")
}

/// Checks that `stderr` is the one line `vramshim run` prints for `log`, compacted.
fn assert_wrote(log: &Path, stderr: &str) {
    let line = stderr
        .strip_suffix('\n')
        .unwrap_or_else(|| panic!("not one line: {stderr:?}"));
    assert!(!line.contains('\n'), "not one line: {stderr:?}");
    assert_compacted_wrote_line(log, line);
}

/// The manifest's old name was predictable (`$TMPDIR/vramshim-run-<pid>.manifest`): another
/// user could plant a symlink there (root then appends to any file, and `run` prints it) or a
/// FIFO (the program hangs). Planted while the program waits, neither changes anything now.
#[test]
fn run_ignores_a_symlink_or_fifo_planted_at_the_old_manifest_name() {
    for plant in ["symlink", "fifo"] {
        let tmp = scratch("paths-manifest-tmp");
        let dir = scratch("paths-manifest-logs");
        let victim = dir.join("victim.txt");
        std::fs::write(&victim, "/etc/shadow\n").expect("write victim");
        let script = format!("read go; exec {}", program("oom").display());
        let output = dir.join("%p.vlog");
        let mut child = vramshim_run(
            &[
                OsStr::new("run"),
                OsStr::new("-o"),
                output.as_os_str(),
                OsStr::new("--"),
                OsStr::new("sh"),
                OsStr::new("-c"),
                OsStr::new(&script),
            ],
            &tmp,
            &dir,
            &[],
        );
        let old_name = tmp.join(format!("vramshim-run-{}.manifest", child.id()));
        // `run` removed any stale manifest before it started the program: plant after that.
        std::thread::sleep(Duration::from_millis(500));
        match plant {
            "symlink" => std::os::unix::fs::symlink(&victim, &old_name).expect("plant symlink"),
            _ => mkfifo(&old_name),
        }
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(b"go\n")
            .expect("release the program");
        let run = finish(child, "vramshim run");
        assert!(
            run.status.success(),
            "{plant}: {:?} {}",
            run.status,
            run.stderr
        );
        assert_eq!(run.stdout, plain_oom_stdout(), "{plant}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "/etc/shadow\n");
        let logs: Vec<String> = files_in(&dir)
            .into_iter()
            .filter(|n| n.ends_with(".vlog"))
            .collect();
        assert_eq!(logs.len(), 1, "{plant}: {logs:?}");
        let log = dir.join(&logs[0]);
        assert_wrote(&log, &run.stderr);
        assert_eq!(event_shapes(&log), printed_shapes(&run.stdout), "{plant}");
        // Only the planted file is left in TMPDIR: the private directory was removed.
        let planted = old_name.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(files_in(&tmp), vec![planted], "{plant}");
    }
}

/// `VRAMSHIM_MANIFEST` in a directory someone else controls: a symlink, a FIFO, a hard link
/// to another file or a missing file is never written, never blocks, and costs one line.
#[test]
fn the_shim_appends_only_to_a_private_regular_manifest() {
    let dir = scratch("paths-manifest-shim");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep\n").expect("write victim");
    let symlink = dir.join("symlink.manifest");
    std::os::unix::fs::symlink(&victim, &symlink).expect("symlink");
    let fifo = dir.join("fifo.manifest");
    mkfifo(&fifo);
    let hardlink = dir.join("hardlink.manifest");
    std::fs::hard_link(&victim, &hardlink).expect("hard link");
    let missing = dir.join("missing.manifest");
    let plain = plain_oom_stdout();
    for (manifest, why) in [
        (&symlink, "it is a symbolic link"),
        (&fifo, "it is a FIFO"),
        (&hardlink, "it has other names (hard links)"),
        (&missing, "No such file or directory (os error 2)"),
    ] {
        let logs = scratch("paths-manifest-shim-logs");
        let mut command = shim_command(&program("oom"), &logs);
        command
            .env("VRAMSHIM_MANIFEST", manifest)
            .env("FAKECUDA_MEM", "1G");
        let run = finish(start(&mut command), "oom");
        assert!(
            run.status.success(),
            "{manifest:?}: {:?} {}",
            run.status,
            run.stderr
        );
        assert_eq!(run.stdout, plain);
        let names = files_in(&logs);
        assert_eq!(names.len(), 1, "{names:?}");
        assert_eq!(
            run.stderr,
            format!(
                "vramshim: log {} not added to the manifest {}: {why}\n",
                logs.join(&names[0]).display(),
                manifest.display()
            )
        );
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    assert!(is_fifo(&fifo));
    assert_eq!(
        files_in(&dir),
        vec![
            "fifo.manifest",
            "hardlink.manifest",
            "symlink.manifest",
            "victim.txt"
        ]
    );
}

/// `vramshim run -o PATH` twice: the second run replaces the first run's log (a vramshim log
/// of the same user whose writer has exited). A file that is not such a log is kept, and the
/// log goes beside it.
#[test]
fn run_replaces_its_own_stale_log_but_nothing_else() {
    let tmp = scratch("paths-rerun-tmp");
    let dir = scratch("paths-rerun");
    let fixed = dir.join("fixed.vlog");
    let oom = program("oom");
    let args = [
        OsStr::new("run"),
        OsStr::new("-o"),
        fixed.as_os_str(),
        OsStr::new("--"),
        oom.as_os_str(),
    ];
    let mut pids = Vec::new();
    for round in 0..2 {
        let run = finish(vramshim_run(&args, &tmp, &dir, &[]), "vramshim run");
        assert!(run.status.success(), "round {round}: {}", run.stderr);
        assert_eq!(files_in(&dir), vec!["fixed.vlog"], "round {round}");
        assert_wrote(&fixed, &run.stderr);
        assert_eq!(event_shapes(&fixed), printed_shapes(&run.stdout));
        pids.push(header_pid(&fixed));
    }
    assert_ne!(pids[0], pids[1], "the second run's log replaced the first");

    std::fs::write(&fixed, "notes\n").expect("write");
    let run = finish(vramshim_run(&args, &tmp, &dir, &[]), "vramshim run");
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(std::fs::read_to_string(&fixed).unwrap(), "notes\n");
    let names = files_in(&dir);
    assert_eq!(names.len(), 2, "{names:?}");
    let log = dir.join(names.iter().find(|n| *n != "fixed.vlog").unwrap());
    assert_eq!(log, dir.join(format!("fixed.{}.vlog", header_pid(&log))));
    let already = format!(
        "vramshim: {} already exists; logging to {}\n",
        fixed.display(),
        log.display()
    );
    let wrote = run
        .stderr
        .strip_prefix(&already)
        .unwrap_or_else(|| panic!("{:?} does not start with {already:?}", run.stderr));
    assert_wrote(&log, wrote);
    assert_eq!(
        files_in(&tmp),
        Vec::<String>::new(),
        "private directory left behind"
    );
}
