//! The recorder inside programs that do what real training jobs do to a preloaded library:
//! fork from allocating threads, crash inside malloc, `_exit` from a signal handler, wait for
//! signals with `sigwait`, recover from faults, overflow their stack, handle the dump signal
//! themselves, and start children with `vfork` and `posix_spawn` (`tests/programs/hostile.c`,
//! `tests/python/fork_workers.py`). Every run has a deadline: a hang fails the test, it never
//! stalls the suite. Exit status and signal are compared with the same run without the shim.

mod common;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// How a bounded run ended.
struct Bounded {
    /// `None`: still running at the deadline (then killed with its process group).
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
    dir: PathBuf,
}

impl Bounded {
    fn status(&self) -> ExitStatus {
        self.status.unwrap_or_else(|| {
            panic!(
                "hung: killed at the deadline\nstdout:\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
    /// The `key=value` printed on stdout (the first line that has it).
    fn value(&self, key: &str) -> i64 {
        let prefix = format!("{key}=");
        self.stdout
            .split_whitespace()
            .find_map(|word| word.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {key}= in stdout:\n{}\n{}", self.stdout, self.stderr))
            .parse()
            .unwrap_or_else(|_| panic!("{key} is not a number in:\n{}", self.stdout))
    }
    fn logs(&self) -> Vec<PathBuf> {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .expect("scratch dir")
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "vlog"))
            .collect();
        logs.sort();
        logs
    }
    fn log(&self) -> PathBuf {
        let logs = self.logs();
        assert_eq!(logs.len(), 1, "expected one log: {logs:?}\n{}", self.stderr);
        logs[0].clone()
    }
}

/// Runs `command` (in its own process group) for at most `limit`; stdout and stderr go to
/// files in `dir`.
fn bounded(mut command: Command, dir: &Path, limit: Duration) -> Bounded {
    let stdout_path = dir.join("stdout.txt");
    let stderr_path = dir.join("stderr.txt");
    command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
        .process_group(0);
    let mut child = command.spawn().expect("start test program");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for test program") {
            break Some(status);
        }
        if started.elapsed() > limit {
            unsafe { libc_kill(-(child.id() as i32), 9) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Bounded {
        status,
        stdout: std::fs::read_to_string(&stdout_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&stderr_path).unwrap_or_default(),
        dir: dir.to_path_buf(),
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

/// `hostile ARGS` under the shim (logs in a fresh scratch directory as `<pid>.vlog`).
fn hostile(test: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Bounded {
    let dir = scratch(test);
    let mut command = shim_command(&program("hostile"), &dir);
    command.args(args).envs(env.iter().copied());
    bounded(command, &dir, limit)
}

/// `hostile ARGS` without the shim.
fn hostile_plain(test: &str, args: &[&str], limit: Duration) -> Bounded {
    let dir = scratch(&format!("{test}-plain"));
    let mut command = Command::new(program("hostile"));
    command.args(args).env("LD_LIBRARY_PATH", fake_lib_dir());
    bounded(command, &dir, limit)
}

/// Exit code and signal of a status, for comparisons and messages.
fn ending(status: ExitStatus) -> (Option<i32>, Option<i32>, bool) {
    (status.code(), status.signal(), status.core_dumped())
}

/// The 1 MiB cuMemAlloc_v2 / cuMemFree_v2 events of a log: (allocations, frees).
fn counted(dump: &[Value]) -> (usize, usize) {
    let events = events(dump);
    let counts = tally(&events);
    let get = |event: &str, api: &str| {
        counts
            .get(&(event.to_owned(), api.to_owned()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        get("alloc", "cuMemAlloc_v2") + get("free", "cuMemFree_v2"),
        events.len(),
        "only cuMemAlloc_v2 / cuMemFree_v2 events expected: {counts:?}"
    );
    (get("alloc", "cuMemAlloc_v2"), get("free", "cuMemFree_v2"))
}

fn notes(dump: &[Value]) -> Vec<String> {
    dump.iter()
        .filter(|r| r["type"] == "note")
        .map(|r| r["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

const MINUTE: Duration = Duration::from_secs(60);

/// The program exited 0, by no signal and with no core dump.
fn assert_exited_cleanly(run: &Bounded) {
    assert_eq!(
        ending(run.status()),
        (Some(0), None, false),
        "{}",
        run.stderr
    );
}

#[test]
fn forks_from_eight_allocating_threads_never_hang_a_child() {
    let run = hostile(
        "fork-storm",
        &["fork-storm", "8", "1000"],
        &[("VRAMSHIM_BUFFER_EVENTS", "64"), ("VRAMSHIM_FLUSH_MS", "1")],
        5 * MINUTE,
    );
    assert_exited_cleanly(&run);
    assert_eq!((run.value("forks"), run.value("hung")), (1000, 0));
    // The children never called CUDA: one log, the parent's, with every pair of every thread.
    let pairs = run.value("pairs") as usize;
    assert!(pairs > 0);
    assert_eq!(counted(&dump(&run.log())), (pairs, pairs));
}

/// The children open their own logs, which walks the loader's list (`dl_iterate_phdr`), while
/// the parent's threads walk it all the time: glibc does not reset that list's lock in a fork
/// child, so the shim holds forks back until no walk is in flight.
#[test]
fn fork_children_that_record_while_the_parent_walks_the_loader_never_hang() {
    let run = hostile(
        "fork-walk",
        &["fork-walk", "4", "300"],
        &[("VRAMSHIM_BUFFER_EVENTS", "64"), ("VRAMSHIM_FLUSH_MS", "1")],
        5 * MINUTE,
    );
    assert_exited_cleanly(&run);
    assert_eq!((run.value("forks"), run.value("hung")), (300, 0));
    let pairs = run.value("pairs") as usize;
    let logs = run.logs();
    assert_eq!(logs.len(), 301, "the parent's log and one per child");
    let mut parent = 0;
    for log in &logs {
        let dump = dump(log);
        // Every child, forked before or after the parent started recording, says so.
        if notes(&dump).is_empty() {
            assert_eq!(counted(&dump), (pairs, pairs), "the parent's log");
            parent += 1;
        } else {
            assert_eq!(counted(&dump), (1, 1), "{log:?}");
        }
    }
    assert_eq!(parent, 1);
}

/// Each `cuMemMap` may look for PyTorch's allocator (`dlopen(RTLD_NOLOAD)` at most every
/// 50 ms), as expandable segments map their pages: in fork children too (each waits 60 ms
/// first, so it looks), while the parent's threads map and walk the loader's list.
#[test]
fn fork_children_that_map_vmm_pages_while_the_parent_maps_and_walks_never_hang() {
    let run = hostile(
        "fork-map",
        &["fork-map", "4", "100"],
        &[("VRAMSHIM_BUFFER_EVENTS", "64"), ("VRAMSHIM_FLUSH_MS", "1")],
        5 * MINUTE,
    );
    assert_exited_cleanly(&run);
    assert_eq!((run.value("forks"), run.value("hung")), (100, 0));
    let cycles = run.value("pairs") as usize;
    assert!(cycles > 0);
    let logs = run.logs();
    assert_eq!(logs.len(), 101, "the parent's log and one per child");
    let mut parent = 0;
    for log in &logs {
        let dump = dump(log);
        let counts = tally(&events(&dump));
        let count = |event: &str, api: &str| {
            counts
                .get(&(event.to_owned(), api.to_owned()))
                .copied()
                .unwrap_or(0)
        };
        let vmm = [
            count("reserve", "cuMemAddressReserve"),
            count("create", "cuMemCreate"),
            count("map", "cuMemMap"),
            count("unmap", "cuMemUnmap"),
            count("release", "cuMemRelease"),
            count("unreserve", "cuMemAddressFree"),
        ];
        assert_eq!(
            counts.values().sum::<usize>(),
            vmm.iter().sum::<usize>(),
            "{counts:?}"
        );
        // Every child says it was forked; the parent has no note.
        if notes(&dump).is_empty() {
            assert_eq!(vmm, [cycles; 6], "the parent's log");
            parent += 1;
        } else {
            assert_eq!(vmm, [1; 6], "{log:?}");
        }
    }
    assert_eq!(parent, 1);
}

#[test]
fn python_fork_workers_never_hang_and_each_writes_its_own_log() {
    let dir = scratch("py-fork-workers");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/fork_workers.py");
    let mut command = shim_command(&machine_python(), &dir);
    command
        .arg(&script)
        .args(["200", "20"])
        .env("VRAMSHIM_BUFFER_EVENTS", "64")
        .env("VRAMSHIM_FLUSH_MS", "1");
    let run = bounded(command, &dir, 8 * MINUTE);
    assert_exited_cleanly(&run);
    assert_eq!(
        (
            run.value("workers"),
            run.value("hung"),
            run.value("bad_exit")
        ),
        (200, 0, 0)
    );
    // worker=i pid=P allocs=N, one line per worker.
    let mut allocs_by_pid: HashMap<u64, usize> = HashMap::new();
    for line in run.stdout.lines().filter(|l| l.starts_with("worker=")) {
        let field = |key: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("bad line {line:?}"))
        };
        allocs_by_pid.insert(field("pid="), field("allocs=") as usize);
    }
    assert_eq!(allocs_by_pid.len(), 200, "one line per worker");
    let mut parent = None;
    let mut seen = 0;
    for log in run.logs() {
        let dump = dump(&log);
        let pid = u64_of(&dump[0], "pid");
        // ctypes finds the fake runtime's own cudaMalloc (not the shim's export), so each
        // call is recorded as the driver call the runtime makes.
        let pairs = counted(&dump);
        match allocs_by_pid.get(&pid) {
            Some(&allocs) => {
                assert!(allocs > 0, "worker {pid} made no CUDA call but has a log");
                assert_eq!(pairs, (allocs, allocs), "worker {pid}'s log is complete");
                let ppid = u64_of(&dump[0], "ppid");
                assert_eq!(notes(&dump), vec![format!("fork child of pid {ppid}")]);
                seen += 1;
            }
            None => {
                assert!(parent.is_none(), "two logs of unknown processes");
                parent = Some(pairs);
            }
        }
    }
    let expected = allocs_by_pid.values().filter(|&&n| n > 0).count();
    assert_eq!(seen, expected, "every worker that allocated wrote a log");
    let pairs = run.value("pairs") as usize;
    assert_eq!(
        parent,
        Some((pairs, pairs)),
        "the parent's log has every pair"
    );
}

#[test]
fn abort_inside_malloc_dies_by_sigabrt_with_the_events_before_it() {
    let args = ["double-free", "50"];
    let plain = hostile_plain("double-free", &args, MINUTE);
    let run = hostile(
        "double-free",
        &args,
        &[("VRAMSHIM_FLUSH_MS", "60000")],
        MINUTE,
    );
    assert_eq!(ending(plain.status()).1, Some(SIGABRT));
    assert_eq!(
        ending(run.status()),
        ending(plain.status()),
        "{}",
        run.stderr
    );
    assert_eq!(run.value("allocated"), 50);
    assert_eq!(counted(&dump(&run.log())), (50, 0));
}

const SIGABRT: i32 = 6;

#[test]
fn exit_from_a_signal_handler_that_interrupted_a_flush_never_deadlocks() {
    for i in 0..40 {
        let usec = (2000 + i * 377).to_string();
        let run = hostile(
            "exit-in-handler",
            &["exit-in-handler", "7", &usec],
            &[("VRAMSHIM_BUFFER_EVENTS", "64"), ("VRAMSHIM_FLUSH_MS", "1")],
            MINUTE,
        );
        assert_eq!(
            ending(run.status()),
            (Some(7), None, false),
            "run {i}: {}",
            run.stderr
        );
        // Whatever was written is a readable log: a pair, then pairs each followed by a
        // failure, cut anywhere (a handler that interrupted the shim's own locks writes
        // nothing more, so even the first pair may be missing on a loaded machine).
        let dump = dump(&run.log());
        let kinds: Vec<&str> = events(&dump)
            .iter()
            .map(|e| e["event"].as_str().unwrap_or_default())
            .collect();
        let expected = ["alloc", "free"]
            .into_iter()
            .chain(["alloc", "free", "alloc_failed"].into_iter().cycle());
        assert!(
            kinds.iter().zip(expected).all(|(kind, want)| *kind == want),
            "run {i}: {kinds:?}"
        );
    }
}

#[test]
fn a_process_directed_signal_never_reaches_the_shims_threads() {
    let run = hostile("sigwait", &["sigwait", "100"], &[], MINUTE);
    assert_exited_cleanly(&run);
    assert_eq!(run.value("got"), 15, "sigwait received SIGTERM");
    assert_eq!(counted(&dump(&run.log())), (100, 100));
}

/// Runs `args` with and without the shim; both must end the same way, by `signal`. Returns
/// the run under the shim.
fn same_ending(test: &str, args: &[&str], signal: i32) -> Bounded {
    let plain = hostile_plain(test, args, MINUTE);
    let run = hostile(test, args, &[("VRAMSHIM_FLUSH_MS", "60000")], MINUTE);
    assert_eq!(ending(plain.status()).1, Some(signal), "{}", plain.stderr);
    assert_eq!(
        ending(run.status()),
        ending(plain.status()),
        "{test}: with the shim vs without\n{}",
        run.stderr
    );
    assert_eq!(run.stderr, plain.stderr, "{test}: stderr");
    run
}

#[test]
fn a_fault_handler_sees_the_original_siginfo_recovers_and_the_crash_is_recorded() {
    let run = same_ending("segv-recover", &["segv-recover", "1000"], 11);
    assert_eq!(run.value("recovered"), 1);
    // One allocation before the recovered fault, 1000 pairs after it, all flushed by the
    // second (fatal) fault: the shim's handler stayed installed.
    assert_eq!(counted(&dump(&run.log())), (1001, 1000));
}

#[test]
fn a_plain_handler_with_resethand_is_chained_then_the_default_kills() {
    let run = same_ending("segv-plain", &["segv-plain", "100"], 11);
    assert_eq!(counted(&dump(&run.log())), (100, 100));
}

#[test]
fn default_fatal_signals_end_the_process_as_without_the_shim() {
    let run = same_ending("segv-dfl", &["segv-dfl", "100"], 11);
    assert_eq!(counted(&dump(&run.log())), (100, 100));
    for signal in [6, 7, 8, 11] {
        let sig = signal.to_string();
        let run = same_ending("kill-self", &["kill-self", &sig, "100"], signal);
        assert_eq!(counted(&dump(&run.log())), (100, 100), "signal {signal}");
    }
}

#[test]
fn a_stack_overflow_crash_keeps_the_events() {
    let run = same_ending("overflow", &["overflow", "100"], 11);
    assert_eq!(counted(&dump(&run.log())), (100, 100));
}

/// The `dump_begin` reasons of a log, in order.
fn dump_reasons(dump: &[Value]) -> Vec<String> {
    dump.iter()
        .filter(|r| r["type"] == "dump_begin")
        .map(|r| r["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn ring_mode_chains_the_programs_dump_signal_handler() {
    let ring = [("VRAMSHIM_MODE", "ring"), ("VRAMSHIM_RING_EVENTS", "16")];
    // Default: SIGUSR2 (12). The program's handler runs for both signals; the shim dumps.
    let run = hostile("dump-usr2", &["dump-signal", "12", "50"], &ring, MINUTE);
    assert_exited_cleanly(&run);
    assert_eq!(run.value("handled"), 2);
    let reasons = dump_reasons(&dump(&run.log()));
    assert_eq!(reasons.last().map(String::as_str), Some("exit"));
    assert!(
        reasons[..reasons.len() - 1].iter().all(|r| r == "SIGUSR2") && reasons.len() >= 2,
        "{reasons:?}"
    );
    assert_eq!(run.stderr, "");

    // Another signal, by name.
    let mut env = ring.to_vec();
    env.push(("VRAMSHIM_DUMP_SIGNAL", "SIGUSR1"));
    let run = hostile("dump-usr1", &["dump-signal", "10", "50"], &env, MINUTE);
    assert_exited_cleanly(&run);
    assert_eq!(run.value("handled"), 2);
    let reasons = dump_reasons(&dump(&run.log()));
    assert!(reasons.len() >= 2 && reasons[0] == "SIGUSR1", "{reasons:?}");

    // By number (SIGRTMIN+2 = 36 on glibc), with the program's handler on it.
    env.pop();
    env.push(("VRAMSHIM_DUMP_SIGNAL", "36"));
    let run = hostile("dump-36", &["dump-signal", "36", "50"], &env, MINUTE);
    assert_exited_cleanly(&run);
    assert_eq!(run.value("handled"), 2);
    let reasons = dump_reasons(&dump(&run.log()));
    assert!(
        reasons.len() >= 2 && reasons[0] == "signal 36",
        "{reasons:?}"
    );

    // None: SIGUSR2 is the program's alone; the only dump is at exit.
    env.pop();
    env.push(("VRAMSHIM_DUMP_SIGNAL", "none"));
    let run = hostile("dump-none", &["dump-signal", "12", "50"], &env, MINUTE);
    assert_exited_cleanly(&run);
    assert_eq!(run.value("handled"), 2);
    assert_eq!(dump_reasons(&dump(&run.log())), ["exit"]);

    // An invalid value: one warning, and the default.
    env.pop();
    env.push(("VRAMSHIM_DUMP_SIGNAL", "SIGNOPE"));
    let run = hostile("dump-bad", &["dump-signal", "12", "50"], &env, MINUTE);
    assert_exited_cleanly(&run);
    assert_eq!(run.value("handled"), 2);
    assert_eq!(
        run.stderr,
        "vramshim: VRAMSHIM_DUMP_SIGNAL=\"SIGNOPE\" is not a signal name or number, or none; \
         using SIGUSR2\n"
    );
    let reasons = dump_reasons(&dump(&run.log()));
    assert!(reasons.len() >= 2 && reasons[0] == "SIGUSR2", "{reasons:?}");
}

#[test]
fn vfork_and_posix_spawn_children_leave_the_parents_log_alone() {
    for (scenario, child_status) in [("vfork-exit", 3), ("vfork-exec", 0), ("spawn", 0)] {
        let run = hostile(scenario, &[scenario, "3"], &[], MINUTE);
        assert_eq!(
            ending(run.status()),
            (Some(0), None, false),
            "{scenario}: {}",
            run.stderr
        );
        assert_eq!(run.value("child_status"), child_status, "{scenario}");
        assert_eq!(run.stderr, "", "{scenario}");
        // Exactly what the parent did: 3 allocations, 3 frees, in that order, and no note.
        let dump = dump(&run.log());
        let kinds: Vec<&str> = events(&dump)
            .iter()
            .map(|e| e["event"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(
            kinds,
            ["alloc", "alloc", "alloc", "free", "free", "free"],
            "{scenario}"
        );
        assert_eq!(notes(&dump), Vec::<String>::new(), "{scenario}");
        // The child's `_exit` wrote nothing: the one exit record is the parent's, last.
        assert_eq!(exit_records(&dump), [dump.len() - 1], "{scenario}");
        let pid = u64_of(&dump[0], "pid");
        assert!(
            events(&dump).iter().all(|e| u64_of(e, "thread") == pid),
            "{scenario}: events of another thread"
        );
    }
}

/// Where the exit records of a dump are.
fn exit_records(dump: &[Value]) -> Vec<usize> {
    dump.iter()
        .enumerate()
        .filter(|(_, record)| record["type"] == "exit")
        .map(|(at, _)| at)
        .collect()
}

/// `vramshim report LOG`'s stdout (it must succeed).
fn report_text(log: &Path) -> String {
    let (code, stdout, stderr) = vramshim(&[OsStr::new("report"), log.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
    stdout
}

#[test]
fn exit_from_a_thread_while_four_others_allocate_writes_one_exit_record() {
    for round in 0..5 {
        let run = hostile(
            "exit-thread",
            &["exit-thread", "4", "5"],
            &[("VRAMSHIM_BUFFER_EVENTS", "64"), ("VRAMSHIM_FLUSH_MS", "1")],
            MINUTE,
        );
        assert_eq!(
            ending(run.status()),
            (Some(5), None, false),
            "round {round}: {}",
            run.stderr
        );
        assert_eq!(run.stderr, "", "round {round}");
        let dump = dump(&run.log());
        assert!(dump.iter().all(|r| r["type"] != "damage"), "round {round}");
        assert_eq!(exit_records(&dump).len(), 1, "round {round}");
        // Each thread made at least 100 pairs and holds at most one allocation at the end.
        let (allocs, frees) = counted(&dump);
        assert!(
            frees >= 400 && allocs - frees <= 4,
            "round {round}: {allocs} {frees}"
        );
        assert!(
            report_text(&run.log()).contains("\n  live at exit  "),
            "round {round}"
        );
    }
}

#[test]
fn exit_called_inside_an_atexit_handler_writes_one_exit_record_after_its_events() {
    let run = hostile("exit-in-atexit", &["exit-in-atexit", "3", "7"], &[], MINUTE);
    assert_eq!(
        ending(run.status()),
        (Some(7), None, false),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr, "");
    let dump = dump(&run.log());
    // The handler's pair is in the log too, before the exit record, which is last.
    assert_eq!(counted(&dump), (4, 4));
    assert_eq!(exit_records(&dump), [dump.len() - 1]);
    let report = report_text(&run.log());
    assert!(
        report.contains("\n  live at exit  0 B in 0 allocations\n"),
        "{report}"
    );
}

#[test]
fn ring_mode_writes_its_dump_at_a_crash() {
    let run = hostile(
        "ring-crash",
        &["segv-dfl", "100"],
        &[
            ("VRAMSHIM_MODE", "ring"),
            ("VRAMSHIM_RING_EVENTS", "16"),
            ("VRAMSHIM_FLUSH_MS", "60000"),
        ],
        MINUTE,
    );
    assert_eq!(ending(run.status()).1, Some(11), "{}", run.stderr);
    let dump = dump(&run.log());
    assert_eq!(dump_reasons(&dump), ["crash"]);
    let begin = dump
        .iter()
        .find(|r| r["type"] == "dump_begin")
        .expect("dump_begin");
    // Nothing reached the window before the crash (no flush ran): the crash dump is what was
    // drained at the crash, the 200 events and the device's memory sample, after an empty
    // live set; it is the last thing in the log.
    assert_eq!(
        (u64_of(begin, "live_count"), u64_of(begin, "window_count")),
        (0, 201)
    );
    let at = dump
        .iter()
        .position(|r| r["type"] == "dump_begin")
        .expect("dump_begin");
    assert_eq!(dump.len() - at - 1, 201);
    assert_eq!(counted(&dump), (100, 100));
}

/// `nvtx_client ARGS` (an NVTX 3 client, no GPU) with NVTX_INJECTION64_PATH naming
/// libvramshim_nvtx.so, under the shim (`recorded`) or without it.
fn nvtx_client(test: &str, args: &[&str], recorded: bool) -> Bounded {
    let dir = scratch(test);
    let mut command = if recorded {
        shim_command(&program("nvtx_client"), &dir)
    } else {
        Command::new(program("nvtx_client"))
    };
    command.args(args).env(
        "NVTX_INJECTION64_PATH",
        target_dir().join("libvramshim_nvtx.so"),
    );
    bounded(command, &dir, 2 * MINUTE)
}

/// NVTX's injection interface, driven as NVTX 3's headers drive it: every core call gets the
/// return value NVTX specifies and one mark, in order; without the recorder the library
/// declines (NVTX then makes every call a no-op).
#[test]
fn nvtx_calls_become_marks_and_the_library_declines_without_the_recorder() {
    let plain = nvtx_client("nvtx-plain", &["basic"], false);
    assert_exited_cleanly(&plain);
    assert_eq!(plain.stdout, "init 0\n");

    let run = nvtx_client("nvtx-basic", &["basic"], true);
    assert_exited_cleanly(&run);
    assert_eq!(
        run.stdout,
        "init 1\npush outer 0\npush inner 1\npop 1\npop 0\npop -1\nids 1\n"
    );
    let marks: Vec<String> = dump(&run.log())
        .iter()
        .filter(|r| r["type"] == "mark")
        .map(|r| r["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        marks,
        [
            "nvtx push: outer",
            "nvtx push: inner ex",
            "nvtx pop: inner ex",
            "nvtx pop: outer",
            "nvtx pop: (no open range)",
            "nvtx mark: here",
            "nvtx mark: wide \u{e9}",
            "nvtx start: load",
            "nvtx start: save",
            "nvtx end: load",
            "nvtx end: save",
            "nvtx end: (range 12345)",
        ]
    );
}

/// Forks while 8 threads push, pop, start and end NVTX ranges and create a domain and push and
/// pop in it (a thread may hold the start/end table's or the domain table's lock when the
/// fork comes): every child records its own ranges, each named, domain ones included, and
/// exits 0; none hangs. A child's log once held `nvtx end: (range N)` here: the start/end
/// table's lock was copied held, and the child gave up on it.
#[test]
fn forks_while_threads_record_nvtx_ranges_never_hang_a_child() {
    let run = nvtx_client("nvtx-fork-storm", &["fork-storm", "8", "100"], true);
    assert_exited_cleanly(&run);
    assert_eq!(
        run.stdout,
        format!(
            "init 1\nforks 100\nhung 0\nfailed 0\noutcomes {}\n",
            ".".repeat(100)
        )
    );
    // The parent's log and one per child (each child's first mark starts its recording).
    let logs = run.logs();
    assert_eq!(logs.len(), 101, "{}", run.stderr);
    // Each child's ranges, its domain's included, are all named: the library holds its
    // tables' locks across the fork, so no child inherits one held by a vanished thread.
    let mut children = 0;
    for log in &logs {
        let marks: Vec<String> = dump(log)
            .iter()
            .filter(|r| r["type"] == "mark")
            .map(|r| r["text"].as_str().unwrap_or("").to_string())
            .collect();
        // The parent's log holds its threads' marks only.
        if !marks.iter().any(|m| m.contains("child")) {
            continue;
        }
        assert_eq!(
            marks,
            [
                "nvtx push: child",
                "nvtx start: child range",
                "nvtx end: child range",
                "nvtx pop: child",
                "nvtx push: children: child",
                "nvtx pop: children: child",
            ],
            "{}",
            log.display()
        );
        children += 1;
    }
    assert_eq!(children, 100);
}

/// Forks while 4 threads take and release the domain table's lock without pause (creating a
/// domain, which writes no mark): the library holds its tables' locks across `fork`, so no
/// child inherits one held by a thread that does not exist there. Every child gets its
/// domain and records its range in it; before, children whose fork caught the lock held
/// gave up on it after 10 ms and got no domain (the range's name was lost).
#[test]
fn forks_while_threads_create_domains_give_every_child_its_domain() {
    let run = nvtx_client("nvtx-fork-tables", &["fork-tables", "4", "100"], true);
    assert_exited_cleanly(&run);
    assert_eq!(run.stdout, "init 1\nforks 100\nhung 0\nunnamed 0\n");
    // The parent writes no mark (it records nothing): one log per child.
    let logs = run.logs();
    assert_eq!(logs.len(), 100, "{}", run.stderr);
    for log in &logs {
        let marks: Vec<String> = dump(log)
            .iter()
            .filter(|r| r["type"] == "mark")
            .map(|r| r["text"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(
            marks,
            ["nvtx push: children: child", "nvtx pop: children: child"],
            "{}",
            log.display()
        );
    }
}

/// The fake GPU's libnvToolsExt.so.1 initialises at its first call: 8 threads make their
/// first NVTX calls at once (racing to initialise) while the main thread forks 100 children
/// that call NVTX too (the first may fork while another thread is loading the injection
/// library). Nobody deadlocks, no child hangs, and the children forked after the
/// initialisation record their own ranges, their domain's included; a child that went on
/// without the tool fails its domain range (level -2), so the failed children are exactly
/// those without marks, and only children forked before the initialisation ended can be:
/// the failures, if any, are the first children in fork order, never one after a child that
/// had the tool. (How many the loading window covers depends on the machine's load: 100 of
/// 100 recorded on an idle machine, 91 beside a busy CI run.)
#[test]
fn the_fake_libnvtoolsext_initialises_once_under_racing_threads_and_forks() {
    let library = Path::new(vramshim_fakegpu::LIB_DIR).join("libnvToolsExt.so.1");
    let library = library.to_str().expect("library path");
    let run = nvtx_client(
        "nvtx-fake-fork-storm",
        &["library", library, "fork-storm", "8", "100"],
        true,
    );
    assert_exited_cleanly(&run);
    let (failed, outcomes): (usize, &str) = run
        .stdout
        .strip_prefix("library 1\nforks 100\nhung 0\nfailed ")
        .and_then(|rest| rest.trim_end().split_once("\noutcomes "))
        .and_then(|(failed, outcomes)| Some((failed.parse().ok()?, outcomes)))
        .unwrap_or_else(|| panic!("{}", run.stdout));
    assert_eq!(outcomes.len(), 100, "{}", run.stdout);
    // Failures only as a prefix: once a child had the tool, every later one did.
    let first_ok = outcomes.find('.').unwrap_or(outcomes.len());
    assert!(outcomes[first_ok..].chars().all(|c| c == '.'), "{outcomes}");
    assert_eq!(first_ok, failed, "{outcomes}");
    let with_mark = |text: &str| {
        run.logs()
            .into_iter()
            .filter(|log| {
                dump(log)
                    .iter()
                    .any(|r| r["type"] == "mark" && r["text"] == text)
            })
            .count()
    };
    assert_eq!(with_mark("nvtx push: worker"), 1, "{}", run.stderr);
    // A child forked while a thread was loading the injection library goes on without it
    // (that thread does not exist in the child): only the first children can be, and most
    // come after the loading.
    let children = with_mark("nvtx push: child");
    assert!(children >= 50, "{children} children recorded: {outcomes}");
    assert_eq!(with_mark("nvtx pop: children: child"), children);
    assert_eq!(failed, 100 - children);
}

/// PyTorch 2.1's `c10::reportMemoryUsageToProfiler`, which the shim defines, called where
/// PyTorch is not loaded: from a constructor before anything is recorded, from 8 threads at
/// once (CUDA and CPU devices) beside allocations, VMM cycles and 4 forked children that call
/// it too. Nothing to pass the calls on to and no PyTorch allocator: each call returns, no
/// event, no warning, every child exits 0. Without the shim nothing defines the function.
#[test]
fn the_profiler_report_interposer_is_inert_without_pytorch_on_any_thread_and_in_children() {
    let run = hostile(
        "profiler-report",
        &["profiler-report", "8", "2000"],
        &[],
        MINUTE,
    );
    assert_exited_cleanly(&run);
    assert_eq!(run.value("found"), 1, "{}", run.stdout);
    assert_eq!(run.value("calls"), 1 + 8 * 2000);
    assert_eq!(run.value("children"), 4);
    assert!(!run.stderr.contains("vramshim:"), "{}", run.stderr);
    let logs = run.logs();
    // The parent's log and one per child (each made a pair).
    assert_eq!(logs.len(), 5, "{logs:?}");
    for log in &logs {
        let dump = dump(log);
        let events = events(&dump);
        assert!(
            events.iter().all(|e| !e["event"]
                .as_str()
                .unwrap_or_default()
                .starts_with("tensor_")),
            "{}",
            log.display()
        );
        assert!(
            notes(&dump).iter().all(|n| !n.starts_with("torch:")),
            "{}",
            log.display()
        );
    }
    let plain = hostile_plain("profiler-report", &["profiler-report", "8", "2000"], MINUTE);
    assert_exited_cleanly(&plain);
    assert_eq!(plain.value("found"), 0, "{}", plain.stdout);
}
