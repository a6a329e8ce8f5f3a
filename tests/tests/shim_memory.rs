//! The recorder's own costs and counts under the real preload: exact event and drop counts
//! with a full buffer, host memory of many short-lived threads, and the limits on the
//! numeric settings.

mod common;

use std::ffi::OsStr;
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

/// The value of `key=` on the program's line starting with `prefix`.
fn printed(stdout: &str, prefix: &str, key: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|line| line.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{stdout}"));
    let field = format!("{key}=");
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(field.as_str()))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

fn of_type<'a>(dump: &'a [Value], kind: &str) -> Vec<&'a Value> {
    dump.iter().filter(|r| r["type"] == kind).collect()
}

fn assert_ok(run: &Run, what: &str) {
    assert!(
        run.output.status.success(),
        "{what} failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        run.output.status,
        run.stdout(),
        run.stderr()
    );
}

/// A 64-event buffer held full (another thread sits inside a hooked call, so nothing newer
/// can be written): every call is either recorded or counted as dropped, exactly once, and
/// device memory samples that find the buffer full are neither.
#[test]
fn dropped_counts_events_only() {
    const PAIRS: u64 = 5000;
    const STALL: &str = "777216";
    let run = run_under_shim(
        "dropcount",
        "dropcount",
        &[&PAIRS.to_string(), STALL],
        &[
            ("FAKECUDA_STALL_SIZE", STALL),
            ("VRAMSHIM_ON_FULL", "drop"),
            ("VRAMSHIM_BUFFER_EVENTS", "64"),
            ("VRAMSHIM_STACK", "none"),
        ],
    );
    assert_ok(&run, "dropcount");
    assert_eq!(run.stderr(), "");
    let calls = printed(&run.stdout(), "total ", "calls");
    assert_eq!(calls, 4 * PAIRS + 2);
    let dump = dump(&run.log());
    let recorded = of_type(&dump, "event").len() as u64;
    let dropped: u64 = of_type(&dump, "dropped")
        .iter()
        .map(|r| u64_of(r, "count"))
        .sum();
    // The main thread's 64 slots: device 0's first sample and its first 63 events; the
    // helper's allocation and free go to its own buffer.
    assert_eq!(recorded, 63 + 2, "events recorded");
    assert_eq!(dropped, calls - recorded, "dropped");
    let samples: Vec<i64> = of_type(&dump, "mem_info")
        .iter()
        .map(|r| i64_of(r, "device"))
        .collect();
    // Device 1's first sample found the main thread's buffer full; the helper's next event
    // on device 1 takes it.
    assert_eq!(samples, vec![0, 1], "device memory samples");
}

/// VmHWM at the program's `mem at=end` line, in bytes.
fn end_hwm(stdout: &str) -> u64 {
    printed(stdout, "mem at=end", "hwm") * 1024
}

/// Runs `thread_churn THREADS ALIVE` with and without the recorder; checks that every call
/// of every thread is in the log and returns the peak host memory (VmHWM) the recorder
/// added, in bytes.
fn churn_cost(threads: u64, alive: u64) -> u64 {
    let args = [threads.to_string(), alive.to_string()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let plain = run_plain("thread_churn", &args, &[]);
    assert!(plain.status.success(), "plain thread_churn failed");
    let plain_stdout = String::from_utf8_lossy(&plain.stdout).into_owned();
    let run = run_under_shim("churn", "thread_churn", &args, &[]);
    assert_ok(&run, "thread_churn");
    assert_eq!(run.stderr(), "");
    let calls = printed(&run.stdout(), "total ", "calls");
    assert_eq!(calls, 2 * threads + 2);
    let dump = dump(&run.log());
    let events = events(&dump);
    assert_eq!(
        events.len() as u64,
        calls,
        "every call of every thread is recorded"
    );
    assert_eq!(
        select(&events, "alloc", "cuMemAlloc_v2").len() as u64,
        threads + 1
    );
    assert_eq!(
        select(&events, "free", "cuMemFree_v2").len() as u64,
        threads + 1
    );
    assert_eq!(
        of_type(&dump, "thread").len() as u64,
        threads + 1,
        "one name per thread"
    );
    end_hwm(&run.stdout()).saturating_sub(end_hwm(&plain_stdout))
}

const MIB: u64 = 1 << 20;

/// Exited threads give their buffers back: 10,000 threads one after another cost what one
/// thread costs, not what 10,000 do.
#[test]
fn short_lived_threads_one_at_a_time_give_their_memory_back() {
    let added = churn_cost(10_000, 1);
    eprintln!("10,000 threads, one at a time: the recorder added {added} bytes of peak RSS");
    assert!(added < 16 * MIB, "added {} MiB", added / MIB);
}

/// A thread's buffer costs the pages it uses, not its capacity: 100 threads alive at once
/// that make two calls each cost a few pages each, not 100 full buffers.
#[test]
fn short_lived_threads_many_at_once_cost_only_what_they_use() {
    let added = churn_cost(10_000, 100);
    eprintln!("10,000 threads, 100 at a time: the recorder added {added} bytes of peak RSS");
    assert!(added < 32 * MIB, "added {} MiB", added / MIB);
}

/// `VRAMSHIM_BUFFER_EVENTS` far above its maximum gets the maximum (65,536 events, 5 MiB a
/// thread) and one warning line: four busy threads cost four capped buffers, not four
/// buffers of 16 million events (1.25 GiB each).
#[test]
fn an_oversized_buffer_is_capped_with_one_warning() {
    const PAIRS: u64 = 200_000;
    let args = ["4", "4", &PAIRS.to_string()].map(str::to_owned);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = [("VRAMSHIM_STACK", "none")];
    let plain = run_plain("thread_churn", &args, &env);
    assert!(plain.status.success(), "plain thread_churn failed");
    let run = run_under_shim(
        "buffer-cap",
        "thread_churn",
        &args,
        &[env[0], ("VRAMSHIM_BUFFER_EVENTS", "16777216")],
    );
    assert_ok(&run, "thread_churn");
    assert_eq!(
        run.stderr(),
        "vramshim: VRAMSHIM_BUFFER_EVENTS=\"16777216\" is above the maximum 65536; using 65536\n"
    );
    let calls = printed(&run.stdout(), "total ", "calls");
    assert_eq!(calls, 4 * 2 * PAIRS + 2);
    // Counted by `vramshim report` (a per-event JSON dump of 1.6 million events is slow).
    let report = json_of(&[
        OsStr::new("report"),
        OsStr::new("--json"),
        run.log().as_os_str(),
    ]);
    let driver = arr(&report["families"])
        .iter()
        .find(|family| family["family"] == "driver")
        .expect("driver family");
    assert_eq!(u64_of(driver, "allocs") + u64_of(driver, "frees"), calls);
    let added =
        end_hwm(&run.stdout()).saturating_sub(end_hwm(&String::from_utf8_lossy(&plain.stdout)));
    eprintln!("4 threads, buffer capped: the recorder added {added} bytes of peak RSS");
    // Four full buffers (21 MiB) and the writer's batch of what it drains at once (at most
    // as much again, twice while it grows), with a margin.
    assert!(added < 96 * MIB, "added {} MiB", added / MIB);
}

/// Runs `command` to its end; returns its stdout and its peak RSS in bytes (the kernel's
/// `ru_maxrss` of this child alone, so what runs at exit counts too).
// The child is reaped by `wait4`, which `Child::wait` cannot replace (it gives no usage).
#[allow(clippy::zombie_processes)]
fn run_with_peak(command: &mut Command) -> (String, u64) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start program");
    let mut stdout = String::new();
    let mut stderr = String::new();
    // The programs print a few lines: they fit the pipes, so reading after the exit is safe.
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    use std::io::Read;
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .expect("read stdout");
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status:#x}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(stderr, "");
    (stdout, usage.ru_maxrss as u64 * 1024)
}

/// Flight-recorder mode with the default window (a million events) filled: its memory is
/// what the window keeps (64 bytes a record), and the dump at exit does not copy it.
#[test]
fn ring_mode_memory_is_sized_by_what_it_keeps() {
    const PAIRS: u64 = 600_000;
    const WINDOW: u64 = 1_000_000;
    let args = ["1", "1", &PAIRS.to_string()].map(str::to_owned);
    let mut plain = Command::new(program("thread_churn"));
    plain.args(&args).env("LD_LIBRARY_PATH", fake_lib_dir());
    let (_, plain_peak) = run_with_peak(&mut plain);
    let dir = scratch("ring-memory");
    let mut shim = shim_command(&program("thread_churn"), &dir);
    shim.args(&args)
        .env("VRAMSHIM_MODE", "ring")
        .env("VRAMSHIM_STACK", "none");
    let (stdout, peak) = run_with_peak(&mut shim);
    assert_eq!(printed(&stdout, "total ", "calls"), 2 * PAIRS + 2);
    let added = peak.saturating_sub(plain_peak);
    eprintln!("ring mode, window of {WINDOW} filled: the recorder added {added} bytes of peak RSS");
    // The dump holds exactly the window (events and the device memory samples that fell
    // inside it) after the live set from before it.
    let log = std::fs::read_dir(&dir)
        .expect("scratch dir")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.extension() == Some(OsStr::new("vlog")))
        .expect("a log");
    let begin = first_dump_begin(&log);
    assert_eq!(u64_of(&begin, "window_count"), WINDOW);
    let report = json_of(&[OsStr::new("report"), OsStr::new("--json"), log.as_os_str()]);
    let driver = arr(&report["families"])
        .iter()
        .find(|family| family["family"] == "driver")
        .expect("driver family");
    let samples: u64 = arr(&report["devices"])
        .iter()
        .map(|device| u64_of(&device["memory_samples"], "count"))
        .sum();
    let (allocs, frees) = (u64_of(driver, "allocs"), u64_of(driver, "frees"));
    assert_eq!(allocs, frees, "everything is freed by the end");
    assert_eq!(
        allocs + frees + samples,
        u64_of(&begin, "live_count") + WINDOW
    );
    // A million records at 64 bytes (61 MiB), the thread's buffer, the log's chunk buffers.
    assert!(added < 96 * MIB, "added {} MiB", added / MIB);
}

/// The first `dump_begin` record of `log`, read from the start of `vramshim dump --json`
/// (the whole dump of a million events would take long to print and parse).
fn first_dump_begin(log: &std::path::Path) -> Value {
    use std::io::BufRead;
    let mut dump = Command::new(vramshim_tool())
        .args([OsStr::new("dump"), OsStr::new("--json"), log.as_os_str()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run vramshim dump");
    let lines = std::io::BufReader::new(dump.stdout.take().expect("stdout")).lines();
    let mut found = None;
    for line in lines {
        let record: Value = serde_json::from_str(&line.expect("read dump")).expect("JSON");
        if record["type"] == "dump_begin" {
            found = Some(record);
            break;
        }
    }
    let _ = dump.kill();
    let _ = dump.wait();
    found.expect("a dump_begin record")
}

/// Numbers outside their documented range (0, and one too large for any integer) get the
/// nearest end of it with one warning line each, and recording goes on with those values.
#[test]
fn numeric_settings_outside_their_range_get_its_nearest_end() {
    let run = run_under_shim(
        "ranges",
        "direct",
        &[],
        &[
            ("VRAMSHIM_MODE", "ring"),
            ("VRAMSHIM_MAX_FRAMES", "0"),
            ("VRAMSHIM_FLUSH_MS", "0"),
            ("VRAMSHIM_RING_EVENTS", "99999999999999999999999"),
        ],
    );
    assert_ok(&run, "direct");
    assert_eq!(
        run.stderr(),
        "vramshim: VRAMSHIM_MAX_FRAMES=\"0\" is below the minimum 1; using 1\n\
         vramshim: VRAMSHIM_FLUSH_MS=\"0\" is below the minimum 1; using 1\n\
         vramshim: VRAMSHIM_RING_EVENTS=\"99999999999999999999999\" is above the maximum \
         16777216; using 16777216\n"
    );
    let dump = dump(&run.log());
    // The window holds the whole run: the 19 recorded calls of `direct` (as in stream
    // mode, see lifecycle.rs) and both devices' first samples.
    let begins = of_type(&dump, "dump_begin");
    assert_eq!(begins.len(), 1);
    assert_eq!(u64_of(begins[0], "events_discarded"), 0);
    assert_eq!(u64_of(begins[0], "window_count"), 19 + 2);
    assert_eq!(events(&dump).len(), 19);
    assert_eq!(of_type(&dump, "mem_info").len(), 2);
    // One frame a stack: the program's function that made the call.
    let stacks = of_type(&dump, "stack");
    assert!(!stacks.is_empty());
    for stack in stacks {
        assert_eq!(arr(&stack["frames"]).len(), 1, "{stack}");
    }
}
