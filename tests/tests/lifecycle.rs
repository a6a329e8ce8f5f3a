//! The recorder across a process's life, under the real preload: out-of-memory, fork, exec,
//! abort, SIGKILL, no CUDA at all, bad output paths and settings, flight-recorder mode, the
//! header, and many threads. Every check compares what `vramshim dump --json` reads from the
//! real log with what the program itself printed.

mod common;

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// `vramshim dump --json LOG`: the records and what the tool said on stderr. Fails the test
/// unless the tool exits 0.
fn dump_with_stderr(log: &Path) -> (Vec<Value>, String) {
    let output = tool(&[OsStr::new("dump"), OsStr::new("--json"), log.as_os_str()]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "vramshim dump {} failed: {stderr}",
        log.display()
    );
    let records = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {line:?}: {e}")))
        .collect();
    (records, stderr)
}

/// The value of `key=` on the first stdout line that starts with `prefix`.
fn printed(stdout: &str, prefix: &str, key: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|line| line.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{stdout}"));
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {line:?}"))
}

/// The events as (event, api, device, addr, size, result).
fn shapes(events: &[&Value]) -> Vec<(String, String, i64, u64, u64, u64)> {
    events
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or_default().to_owned(),
                e["api"].as_str().unwrap_or_default().to_owned(),
                i64_of(e, "device"),
                u64_of(e, "addr"),
                u64_of(e, "size"),
                u64_of(e, "result"),
            )
        })
        .collect()
}

/// What the program printed, in the same shape (frees carry no size in the log).
fn printed_shapes(ops: &[ProgramOp]) -> Vec<(String, String, i64, u64, u64, u64)> {
    ops.iter()
        .filter(|op| op.op == "alloc" || op.op == "free")
        .map(|op| {
            let failed = op.int("rc") != 0;
            let event = match (op.op.as_str(), failed) {
                ("alloc", true) => "alloc_failed",
                (op, _) => op,
            };
            let size = if event == "free" { 0 } else { op.num("size") };
            (
                event.to_owned(),
                op.api.clone(),
                op.int("dev"),
                op.num("addr"),
                size,
                op.num("rc"),
            )
        })
        .collect()
}

fn notes(dump: &[Value]) -> Vec<String> {
    dump.iter()
        .filter(|r| r["type"] == "note")
        .map(|r| r["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Every stack id an event uses is defined by a stack record of the same log.
fn assert_stacks_defined(dump: &[Value], what: &str) {
    let defined: HashSet<u64> = dump
        .iter()
        .filter(|r| r["type"] == "stack")
        .map(|r| u64_of(r, "id"))
        .collect();
    for event in events(dump) {
        let id = u64_of(event, "stack");
        assert!(
            id == 0 || defined.contains(&id),
            "{what}: event uses stack {id}, which this log never defines: {event}"
        );
    }
}

fn assert_ok(run: &Run, what: &str) {
    assert!(
        run.output.status.success(),
        "{what} failed ({:?}):\n{}{}",
        run.output.status,
        run.stdout(),
        run.stderr()
    );
}

/// The fake's numbers for `oom`.
const FAKE_1G: u64 = 1 << 30;

#[test]
fn oom_records_the_failed_allocation_with_device_memory() {
    let run = run_under_shim("oom", "oom", &[], &[("FAKECUDA_MEM", "1G")]);
    assert_ok(&run, "oom");
    assert_eq!(run.stderr(), "", "the shim printed something");
    let ops = program_ops(&run.stdout());
    let after = ops
        .iter()
        .find(|op| {
            op.op == "info" && op.fields.get("when").map(String::as_str) == Some("after-oom")
        })
        .expect("after-oom info line");
    assert_eq!(
        (after.num("free"), after.num("total")),
        (FAKE_1G - 512 * MIB, FAKE_1G)
    );

    let dump = dump(&run.log());
    let events = events(&dump);
    assert_eq!(shapes(&events), printed_shapes(&ops));
    assert_eq!(events.len(), 3, "alloc, alloc_failed, free");

    let failed = select(&events, "alloc_failed", "cuMemAlloc_v2");
    assert_eq!(failed.len(), 1);
    let failed = failed[0];
    assert_eq!(u64_of(failed, "size"), 768 * MIB);
    assert_eq!(u64_of(failed, "size"), 805_306_368);
    assert_eq!(u64_of(failed, "result"), 2);
    assert_eq!(u64_of(failed, "addr"), 0);
    assert_eq!(i64_of(failed, "device"), 0);
    assert_eq!(u64_of(failed, "mem_total"), FAKE_1G);
    assert_eq!(u64_of(failed, "mem_free"), FAKE_1G - 512 * MIB);
    assert_eq!(
        (u64_of(failed, "mem_free"), u64_of(failed, "mem_total")),
        (after.num("free"), after.num("total")),
        "device memory at the failure is what the program read right after it"
    );

    let allocs = select(&events, "alloc", "cuMemAlloc_v2");
    let frees = select(&events, "free", "cuMemFree_v2");
    assert_eq!(allocs.len(), 1);
    assert_eq!(frees.len(), 1);
    let printed_addr = ops[1].num("addr");
    assert_eq!(
        (u64_of(allocs[0], "addr"), u64_of(allocs[0], "size")),
        (printed_addr, 512 * MIB)
    );
    assert_eq!(u64_of(frees[0], "addr"), printed_addr);
    // Only the failure carries device memory figures.
    assert!(allocs[0].get("mem_free").is_none() && frees[0].get("mem_free").is_none());
}

/// The pids `fork` printed: (parent, fork child, exec child).
fn fork_pids(stdout: &str) -> (u32, u32, u32) {
    (
        printed(stdout, "done fork ", "pid") as u32,
        printed(stdout, "child pid=", "pid") as u32,
        printed(stdout, "exec pid=", "pid") as u32,
    )
}

/// The program's operation lines printed by process `pid`.
fn ops_of(ops: &[ProgramOp], pid: u32) -> Vec<ProgramOp> {
    ops.iter()
        .filter(|op| op.fields.get("pid") == Some(&pid.to_string()))
        .cloned()
        .collect()
}

#[test]
fn fork_and_exec_children_write_their_own_logs() {
    let run = run_under_shim("fork", "fork", &[], &[]);
    assert_ok(&run, "fork");
    let stdout = run.stdout();
    let ops = program_ops(&stdout);
    let (parent, child, exec) = fork_pids(&stdout);
    assert!(parent != child && child != exec && parent != exec);

    // Exactly three logs, each named by its process's pid; nothing else.
    let mut expected_files = vec![
        format!("{parent}.vlog"),
        format!("{child}.vlog"),
        format!("{exec}.vlog"),
    ];
    expected_files.sort();
    assert_eq!(files_in(&run.dir), expected_files);

    // The parent: its 1 MiB allocation and free, nothing of its children.
    let parent_dump = dump(&run.log_of(parent));
    assert_eq!(u64_of(&parent_dump[0], "pid"), u64::from(parent));
    let parent_events = events(&parent_dump);
    let parent_ops = ops_of(&ops, parent);
    assert_eq!(parent_ops.len(), 2);
    assert_eq!(shapes(&parent_events), printed_shapes(&parent_ops));
    assert_eq!(u64_of(parent_events[0], "size"), MIB);
    assert!(
        parent_events
            .iter()
            .all(|e| u64_of(e, "thread") == u64::from(parent))
    );
    assert_eq!(
        notes(&parent_dump),
        Vec::<String>::new(),
        "the parent neither forked-from nor exec'd"
    );
    assert_stacks_defined(&parent_dump, "parent");

    // The fork child: exactly its two 2 MiB allocations and their frees, and where it came from.
    let child_dump = dump(&run.log_of(child));
    assert_eq!(u64_of(&child_dump[0], "pid"), u64::from(child));
    assert_eq!(u64_of(&child_dump[0], "ppid"), u64::from(parent));
    let child_events = events(&child_dump);
    let child_ops = ops_of(&ops, child);
    assert_eq!(child_ops.len(), 4);
    assert_eq!(shapes(&child_events), printed_shapes(&child_ops));
    assert_eq!(
        child_events
            .iter()
            .map(|e| (e["event"].as_str().unwrap(), u64_of(e, "size")))
            .collect::<Vec<_>>(),
        vec![
            ("alloc", 2 * MIB),
            ("alloc", 2 * MIB),
            ("free", 0),
            ("free", 0)
        ]
    );
    assert!(
        child_events
            .iter()
            .all(|e| u64_of(e, "thread") == u64::from(child))
    );
    assert_eq!(
        notes(&child_dump),
        vec![format!("fork child of pid {parent}")]
    );
    // Its own device memory sample (the parent's sampling state is not inherited), and its own
    // stack definitions.
    assert_eq!(
        child_dump
            .iter()
            .filter(|r| r["type"] == "mem_info")
            .map(|r| i64_of(r, "device"))
            .collect::<Vec<_>>(),
        vec![0]
    );
    assert_stacks_defined(&child_dump, "fork child");

    // The exec'd image: its 3 MiB allocation, its own argv. The forked process that called
    // execv made no CUDA call before it, so it had no log and wrote no "exec" note.
    let exec_dump = dump(&run.log_of(exec));
    let header = &exec_dump[0];
    assert_eq!(u64_of(header, "pid"), u64::from(exec));
    assert_eq!(u64_of(header, "ppid"), u64::from(parent));
    let argv: Vec<&str> = header["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(argv.len(), 2, "{argv:?}");
    assert_eq!(argv[1], "exec-child");
    let exec_events = events(&exec_dump);
    let exec_ops = ops_of(&ops, exec);
    assert_eq!(exec_ops.len(), 1);
    assert_eq!(shapes(&exec_events), printed_shapes(&exec_ops));
    assert_eq!(u64_of(exec_events[0], "size"), 3 * MIB);
    assert_eq!(notes(&exec_dump), Vec::<String>::new());
    assert_stacks_defined(&exec_dump, "exec child");
}

/// `VRAMSHIM_OUTPUT` without `%p`: three processes want the same path. Whatever names the
/// shim picks, no process's log may be destroyed: each of the three must end up with a
/// readable, undamaged log of exactly its own events.
#[test]
fn fork_with_a_fixed_output_path_keeps_every_log_intact() {
    let dir = scratch("fork-fixed-out");
    let fixed = dir.join("fixed.vlog");
    let run = run_under_shim(
        "fork-fixed",
        "fork",
        &[],
        &[("VRAMSHIM_OUTPUT", fixed.to_str().unwrap())],
    );
    assert_ok(&run, "fork");
    let stdout = run.stdout();
    let ops = program_ops(&stdout);
    let (parent, child, exec) = fork_pids(&stdout);

    let mut by_pid: HashMap<u64, Vec<Value>> = HashMap::new();
    let mut damage = Vec::new();
    for name in files_in(&dir) {
        let path = dir.join(&name);
        let (records, stderr) = dump_with_stderr(&path);
        if !stderr.is_empty() {
            damage.push(format!("{name}: {}", stderr.trim_end()));
        }
        by_pid.insert(u64_of(&records[0], "pid"), records);
    }
    assert!(
        damage.is_empty(),
        "logs damaged by another process writing the same path:\n{}",
        damage.join("\n")
    );
    for (pid, count) in [(parent, 2), (child, 4), (exec, 1)] {
        let records = by_pid
            .get(&u64::from(pid))
            .unwrap_or_else(|| panic!("no log of pid {pid} in {:?}", files_in(&dir)));
        let mine = ops_of(&ops, pid);
        assert_eq!(mine.len(), count);
        assert_eq!(shapes(&events(records)), printed_shapes(&mine), "pid {pid}");
    }
}

/// A tiny program that records one 5 MiB allocation and then execs its arguments in the same
/// process (same pid): compiled here because no fixture records *before* an exec.
const RECORD_THEN_EXEC: &str = r#"
#include <stdio.h>
#include <stddef.h>
#include <unistd.h>
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(void **, int);
int cuCtxSetCurrent(void *);
int cuMemAlloc_v2(unsigned long long *, size_t);
int main(int argc, char **argv)
{
    void *ctx;
    unsigned long long p = 0;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx))
        return 3;
    int rc = cuMemAlloc_v2(&p, 5 << 20);
    printf("alloc cuMemAlloc_v2 dev=0 addr=0x%llx size=%d pid=%d role=pre-exec rc=%d\n", p,
           5 << 20, (int)getpid(), rc);
    fflush(stdout);
    if (rc != 0 || argc < 2)
        return 4;
    execv(argv[1], argv + 1);
    return 5;
}
"#;

fn compile_record_then_exec(dir: &Path) -> PathBuf {
    let source = dir.join("record_then_exec.c");
    let exe = dir.join("record_then_exec");
    std::fs::write(&source, RECORD_THEN_EXEC).expect("write C source");
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".to_owned());
    let status = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&source)
        .arg(format!("-L{}", fake_lib_dir().display()))
        .arg("-lcuda")
        .status()
        .unwrap_or_else(|e| panic!("run {cc}: {e}"));
    assert!(status.success(), "{cc} failed to build the exec helper");
    std::fs::remove_file(&source).expect("remove C source");
    exe
}

/// Runs `exe` with the shim preloaded; logs go to `<log_dir>/%p.vlog`.
fn run_exe_under_shim(exe: &Path, args: &[&OsStr], log_dir: &Path, env: &[(&str, &str)]) -> Output {
    let mut command = shim_command(exe, log_dir);
    command.args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run program")
}

#[test]
fn exec_after_recording_keeps_the_log_of_the_image_before_it() {
    let build = scratch("exec-helper");
    let helper = compile_record_then_exec(&build);
    let dir = scratch("exec");
    let fork = program("fork");
    let output = run_exe_under_shim(
        &helper,
        &[fork.as_os_str(), OsStr::new("exec-child")],
        &dir,
        &[],
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stdout}{stderr}");
    let ops = program_ops(&stdout);
    assert_eq!(ops.len(), 2, "{stdout}");
    let pid = ops[0].num("pid") as u32;
    assert_eq!(ops[1].num("pid") as u32, pid, "exec keeps the pid");

    // The image before exec keeps its log; the one after writes beside it, and says so.
    let first = dir.join(format!("{pid}.vlog"));
    assert_eq!(
        stderr,
        format!(
            "vramshim: {} already exists; logging to {}.2\n",
            first.display(),
            first.display()
        )
    );
    assert_eq!(
        files_in(&dir),
        vec![format!("{pid}.vlog"), format!("{pid}.vlog.2")]
    );
    let before = dump(&dir.join(format!("{pid}.vlog")));
    assert_eq!(u64_of(&before[0], "pid"), u64::from(pid));
    assert_eq!(
        before[0]["argv"][0].as_str(),
        Some(helper.to_str().unwrap())
    );
    assert_eq!(shapes(&events(&before)), printed_shapes(&ops[..1]));
    assert_eq!(u64_of(events(&before)[0], "size"), 5 * MIB);
    assert_eq!(notes(&before), vec!["exec".to_owned()]);

    let after = dump(&dir.join(format!("{pid}.vlog.2")));
    assert_eq!(u64_of(&after[0], "pid"), u64::from(pid));
    assert_eq!(
        after[0]["argv"],
        serde_json::json!([fork.to_str().unwrap(), "exec-child"])
    );
    assert_eq!(shapes(&events(&after)), printed_shapes(&ops[1..]));
    assert_eq!(u64_of(events(&after)[0], "size"), 3 * MIB);
    assert_eq!(notes(&after), Vec::<String>::new());
}

/// The "exec" note says when the image was replaced: it comes after the events that happened
/// before the exec, with a time no earlier than theirs (the log is in time order).
#[test]
fn exec_note_is_stamped_and_after_the_events_before_it() {
    let build = scratch("exec-note-helper");
    let helper = compile_record_then_exec(&build);
    let dir = scratch("exec-note");
    let output = run_exe_under_shim(&helper, &[program("nocuda").as_os_str()], &dir, &[]);
    assert!(output.status.success());
    let ops = program_ops(&String::from_utf8_lossy(&output.stdout));
    let pid = ops[0].num("pid") as u32;
    // nocuda makes no CUDA call: only the pre-exec log.
    assert_eq!(files_in(&dir), vec![format!("{pid}.vlog")]);
    let dump = dump(&dir.join(format!("{pid}.vlog")));
    let alloc_at = dump
        .iter()
        .position(|r| r["type"] == "event")
        .expect("the 5 MiB allocation");
    let note_at = dump
        .iter()
        .position(|r| r["type"] == "note" && r["text"] == "exec")
        .expect("exec note");
    let alloc_t = u64_of(&dump[alloc_at], "t_ns");
    let note_t = u64_of(&dump[note_at], "t_ns");
    assert!(
        note_at > alloc_at && note_t >= alloc_t,
        "the exec note (record {note_at}, t_ns {note_t}) precedes the allocation made before \
         the exec (record {alloc_at}, t_ns {alloc_t})"
    );
}

#[test]
fn abort_flushes_every_allocation_from_the_signal_handler() {
    let run = run_under_shim("abort", "abort", &[], &[]);
    assert_eq!(
        run.output.status.signal(),
        Some(6),
        "abort must die by SIGABRT: {:?}\n{}",
        run.output.status,
        run.stderr()
    );
    assert_eq!(run.stderr(), "");
    let stdout = run.stdout();
    let pid = printed(&stdout, "aborting", "pid");
    let ops = program_ops(&stdout);
    assert_eq!(ops.len(), 5);
    let log = run.log();
    assert_eq!(
        log.file_name().unwrap().to_str().unwrap(),
        format!("{pid}.vlog")
    );
    let (dump, stderr) = dump_with_stderr(&log);
    assert_eq!(stderr, "", "the log of an aborted process is complete");
    assert!(dump.iter().all(|r| r["type"] != "damage"));
    let events = events(&dump);
    assert_eq!(shapes(&events), printed_shapes(&ops));
    assert_eq!(select(&events, "alloc", "cuMemAlloc_v2").len(), 5);
    assert!(events.iter().all(|e| u64_of(e, "size") == MIB));
}

/// `vramshim leaks LOG`'s stdout (it must succeed).
fn leaks_text(log: &Path) -> String {
    let (code, stdout, stderr) = vramshim(&[OsStr::new("leaks"), log.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
    stdout
}

/// A return from `main` leaves the exit record last in the log, and reports name the end
/// "exit".
#[test]
fn a_normal_exit_ends_the_log_with_its_exit_record() {
    let run = run_under_shim("normal-exit", "report_leaks", &[], &[]);
    assert_ok(&run, "report_leaks");
    let (dump, stderr) = dump_with_stderr(&run.log());
    assert_eq!(stderr, "");
    let exits: Vec<usize> = (0..dump.len())
        .filter(|&at| dump[at]["type"] == "exit")
        .collect();
    assert_eq!(exits, [dump.len() - 1]);
    // Exit is stamped after every event.
    let last_event = events(&dump).iter().map(|e| u64_of(e, "t_ns")).max();
    assert!(Some(u64_of(&dump[dump.len() - 1], "t_ns")) >= last_event);
    let leaks = leaks_text(&run.log());
    // report_leaks leaves 8 MiB x3 + 4 + 2 MiB on device 0 (report_leaks.c).
    assert!(
        leaks.contains("device 0: still live at exit (")
            && leaks.contains(") 30.00 MiB in 5 allocations"),
        "{leaks}"
    );
    assert!(!leaks.contains("end of log"), "{leaks}");
}

#[test]
fn sigkill_leaves_a_readable_log_of_what_was_flushed() {
    let run = run_under_shim("sigkill", "sigkill", &[], &[]);
    assert_eq!(
        run.output.status.signal(),
        Some(9),
        "sigkill must die by SIGKILL: {:?}",
        run.output.status
    );
    let stdout = run.stdout();
    let ops = program_ops(&stdout);
    assert_eq!(ops.len(), 10);
    let (dump, stderr) = dump_with_stderr(&run.log());
    let events = events(&dump);
    // The first five were flushed during the 500 ms sleep; the last five maybe.
    assert!(
        (5..=10).contains(&events.len()),
        "{} events recorded",
        events.len()
    );
    assert_eq!(
        shapes(&events),
        printed_shapes(&ops)[..events.len()].to_vec(),
        "what was recorded is exactly the start of what the program did"
    );
    assert_eq!(
        events
            .iter()
            .take(5)
            .map(|e| u64_of(e, "size"))
            .collect::<Vec<_>>(),
        vec![MIB; 5]
    );
    // No exit record: every report names the end "end of log", the live memory exactly
    // what the recorded allocations hold (nothing freed: 1 MiB each, then 2 MiB each).
    assert!(dump.iter().all(|r| r["type"] != "exit"));
    let live = 5 * MIB + (events.len() as u64 - 5) * 2 * MIB;
    let leaks = leaks_text(&run.log());
    let expected = format!(") {}.00 MiB in {} allocations", live / MIB, events.len());
    assert!(
        leaks.contains("device 0: still live at end of log (") && leaks.contains(&expected),
        "{leaks}"
    );
    assert!(!leaks.contains("exit"), "{leaks}");
    // Damage, if any, is only a torn tail: the last record, one warning.
    let damage: Vec<usize> = dump
        .iter()
        .enumerate()
        .filter(|(_, r)| r["type"] == "damage")
        .map(|(i, _)| i)
        .collect();
    match damage.as_slice() {
        [] => assert_eq!(stderr, ""),
        [at] => {
            assert_eq!(*at, dump.len() - 1, "damage before the end: {}", dump[*at]);
            assert!(
                dump[*at]["message"]
                    .as_str()
                    .unwrap()
                    .contains("incomplete chunk"),
                "{}",
                dump[*at]
            );
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(stderr.contains("incomplete chunk"), "{stderr}");
        }
        _ => panic!("several damaged places: {stderr}"),
    }
}

#[test]
fn a_program_without_cuda_gets_no_log_and_no_output() {
    let run = run_under_shim("nocuda", "nocuda", &[], &[]);
    assert_ok(&run, "nocuda");
    assert_eq!(run.stdout(), "hello\n");
    assert_eq!(run.stderr(), "");
    assert_eq!(files_in(&run.dir), Vec::<String>::new());
}

/// `oom`'s stdout without the shim (deterministic: the fake's addresses).
fn plain_oom_stdout() -> String {
    let plain = run_plain("oom", &[], &[("FAKECUDA_MEM", "1G")]);
    assert!(plain.status.success());
    String::from_utf8_lossy(&plain.stdout).into_owned()
}

#[test]
fn unwritable_output_warns_once_and_the_program_runs_unchanged() {
    assert!(!Path::new("/nonexistent-dir").exists());
    let run = run_under_shim(
        "unwritable",
        "oom",
        &[],
        &[
            ("FAKECUDA_MEM", "1G"),
            ("VRAMSHIM_OUTPUT", "/nonexistent-dir/x.vlog"),
        ],
    );
    assert_ok(&run, "oom");
    assert_eq!(run.stdout(), plain_oom_stdout());
    let stderr = run.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("vramshim: cannot create log /nonexistent-dir/x.vlog"),
        "{stderr}"
    );
    assert_eq!(files_in(&run.dir), Vec::<String>::new());
}

#[test]
fn a_symlink_at_the_output_path_is_refused() {
    let dir = scratch("symlink");
    let target = dir.join("precious.txt");
    std::fs::write(&target, "do not overwrite\n").expect("write target");
    let link = dir.join("link.vlog");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let run = run_under_shim(
        "symlink-run",
        "oom",
        &[],
        &[
            ("FAKECUDA_MEM", "1G"),
            ("VRAMSHIM_OUTPUT", link.to_str().unwrap()),
        ],
    );
    assert_ok(&run, "oom");
    assert_eq!(run.stdout(), plain_oom_stdout());
    let stderr = run.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("vramshim: cannot create log {}", link.display())),
        "{stderr}"
    );
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "do not overwrite\n"
    );
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(files_in(&dir), vec!["link.vlog", "precious.txt"]);
    assert_eq!(files_in(&run.dir), Vec::<String>::new());
}

#[test]
fn the_log_is_private_to_its_owner() {
    let run = run_under_shim("mode", "oom", &[], &[("FAKECUDA_MEM", "1G")]);
    assert_ok(&run, "oom");
    let mode = std::fs::metadata(run.log()).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o600, "mode {mode:o}");
}

#[test]
fn invalid_settings_warn_once_each_and_recording_uses_the_defaults() {
    let run = run_under_shim(
        "bad-env",
        "oom",
        &[],
        &[
            ("FAKECUDA_MEM", "1G"),
            ("VRAMSHIM_STACK", "bogus"),
            ("VRAMSHIM_MAX_FRAMES", "abc"),
            ("VRAMSHIM_FLUSH_MS", "-5"),
        ],
    );
    assert_ok(&run, "oom");
    assert_eq!(run.stdout(), plain_oom_stdout());
    let stderr = run.stderr();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    for variable in ["VRAMSHIM_STACK", "VRAMSHIM_MAX_FRAMES", "VRAMSHIM_FLUSH_MS"] {
        let naming: Vec<&&str> = lines.iter().filter(|l| l.contains(variable)).collect();
        assert_eq!(naming.len(), 1, "{variable}: {stderr}");
        assert!(naming[0].starts_with("vramshim: "), "{stderr}");
    }
    let dump = dump(&run.log());
    assert_eq!(dump[0]["stack_mode"], "mixed");
    let events = events(&dump);
    assert_eq!(shapes(&events), printed_shapes(&program_ops(&run.stdout())));
    assert_default_stacks(&events);
    assert_stacks_defined(&dump, "oom");
}

#[test]
fn stack_none_records_no_stacks() {
    let run = run_under_shim("stack-none", "direct", &[], &[("VRAMSHIM_STACK", "none")]);
    assert_ok(&run, "direct");
    assert_eq!(run.stderr(), "");
    let dump = dump(&run.log());
    assert_eq!(dump[0]["stack_mode"], "none");
    let events = events(&dump);
    assert_eq!(events.len(), 19);
    assert!(events.iter().all(|e| u64_of(e, "stack") == 0));
    assert!(dump.iter().all(|r| r["type"] != "stack"));
}

/// Releases are attributed to their allocation: by default they carry no stack (no walk),
/// `VRAMSHIM_FREE_STACKS=1` gives them one; an odd value warns once and keeps the default.
#[test]
fn free_stacks_only_when_asked() {
    for (label, value) in [("default", None), ("on", Some("1")), ("odd", Some("maybe"))] {
        let env: Vec<(&str, &str)> = value
            .map(|v| ("VRAMSHIM_FREE_STACKS", v))
            .into_iter()
            .collect();
        let run = run_under_shim(&format!("free-stacks-{label}"), "direct", &[], &env);
        assert_ok(&run, "direct");
        if label == "odd" {
            let stderr = run.stderr();
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(
                stderr.starts_with("vramshim: ") && stderr.contains("VRAMSHIM_FREE_STACKS"),
                "{stderr}"
            );
        } else {
            assert_eq!(run.stderr(), "");
        }
        let dump = dump(&run.log());
        let events = events(&dump);
        assert_eq!(events.len(), 19, "{label}");
        let (releases, others): (Vec<&Value>, Vec<&Value>) =
            events.iter().partition(|e| is_release(e));
        // direct.c frees each of its 9 allocations; the other 10 events are allocations.
        assert_eq!((releases.len(), others.len()), (9, 10), "{label}");
        assert!(others.iter().all(|e| u64_of(e, "stack") != 0), "{label}");
        let with_stack = releases.iter().filter(|e| u64_of(e, "stack") != 0).count();
        let expected = if label == "on" { 9 } else { 0 };
        assert_eq!(with_stack, expected, "{label}: releases with a stack");
        assert_stacks_defined(&dump, "direct");
    }
}

/// Comparable view of an event or memory sample across two runs: host addresses and array
/// handles come from malloc and differ between runs; device addresses do not.
fn comparable(record: &Value) -> String {
    if record["type"] == "mem_info" {
        return format!("mem_info dev {}", record["device"]);
    }
    let device = i64_of(record, "device");
    let addr = if device >= 0 {
        u64_of(record, "addr")
    } else {
        1
    };
    format!(
        "{} {} dev {} addr {:#x} size {} handle? {} result {}",
        record["event"],
        record["api"],
        device,
        addr,
        record["size"],
        u64_of(record, "handle") != 0,
        record["result"]
    )
}

/// Key of the object an event creates or ends: its address, or an array's handle.
fn object_key(event: &Value) -> u64 {
    match u64_of(event, "addr") {
        0 => u64_of(event, "handle"),
        addr => addr,
    }
}

#[test]
fn ring_mode_dumps_the_live_set_and_the_last_events_at_exit() {
    // The whole history, for comparison.
    let stream = run_under_shim("ring-stream", "direct", &[], &[]);
    assert_ok(&stream, "direct");
    let stream_dump = dump(&stream.log());
    let history: Vec<&Value> = stream_dump
        .iter()
        .filter(|r| r["type"] == "event" || r["type"] == "mem_info")
        .collect();
    assert_eq!(history.len(), 21, "19 events and 2 device memory samples");

    let run = run_under_shim(
        "ring",
        "direct",
        &[],
        &[("VRAMSHIM_MODE", "ring"), ("VRAMSHIM_RING_EVENTS", "16")],
    );
    assert_ok(&run, "direct");
    assert_eq!(run.stderr(), "");
    let ops = program_ops(&run.stdout());
    let dump = dump(&run.log());
    assert_eq!(dump[0]["mode"], "ring");

    let begins: Vec<usize> = dump
        .iter()
        .enumerate()
        .filter(|(_, r)| r["type"] == "dump_begin")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(begins.len(), 1, "one dump, at exit");
    let at = begins[0];
    let begin = &dump[at];
    assert_eq!(begin["reason"], "exit");
    // Nothing recorded outside the dump.
    assert!(
        dump[..at]
            .iter()
            .all(|r| r["type"] != "event" && r["type"] != "mem_info")
    );
    let live_count = u64_of(begin, "live_count") as usize;
    let window_count = u64_of(begin, "window_count") as usize;
    assert!(window_count <= 16);
    assert_eq!(window_count, 16, "21 records of history fill the window");
    assert_eq!(
        u64_of(begin, "events_discarded") as usize,
        history.len() - window_count
    );
    // The dump is the last thing in the log but the exit record, written after it.
    assert_eq!(dump[dump.len() - 1]["type"], "exit");
    let rest = &dump[at + 1..dump.len() - 1];
    assert_eq!(rest.len(), live_count + window_count);
    let (live, window) = rest.split_at(live_count);
    assert!(
        live.iter()
            .all(|r| r["type"] == "event" && r["event"] == "alloc")
    );
    assert!(
        window
            .iter()
            .all(|r| r["type"] == "event" || r["type"] == "mem_info")
    );

    // The window is the last 16 records of the history; the live set is what was live before.
    let tail = &history[history.len() - window_count..];
    assert_eq!(
        window.iter().map(comparable).collect::<Vec<_>>(),
        tail.iter().map(|r| comparable(r)).collect::<Vec<_>>()
    );
    let mut live_before: Vec<&Value> = Vec::new();
    for record in &history[..history.len() - window_count] {
        if record["type"] != "event" {
            continue;
        }
        match record["event"].as_str() {
            Some("alloc") => live_before.push(record),
            Some("free") => live_before.retain(|a| object_key(a) != object_key(record)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        live.iter().map(comparable).collect::<Vec<_>>(),
        live_before
            .iter()
            .map(|r| comparable(r))
            .collect::<Vec<_>>()
    );

    // Replaying the dump gives exactly what was live at exit: the one 3 MiB leak.
    let mut replay: HashMap<u64, &Value> = HashMap::new();
    for event in live.iter().chain(window).filter(|r| r["type"] == "event") {
        match event["event"].as_str() {
            Some("alloc") => {
                assert!(replay.insert(object_key(event), event).is_none(), "{event}");
            }
            Some("free") => {
                assert!(
                    replay.remove(&object_key(event)).is_some(),
                    "free of nothing: {event}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let leak = ops
        .iter()
        .find(|op| op.fields.contains_key("leaked"))
        .expect("leak line");
    assert_eq!(replay.len(), 1, "{replay:?}");
    let (addr, event) = replay.into_iter().next().unwrap();
    assert_eq!(addr, leak.num("addr"));
    assert_eq!(u64_of(event, "size"), 3 * MIB);
    assert_eq!(i64_of(event, "device"), 0);
    assert_eq!(event["api"], "cuMemAlloc_v2");
}

#[test]
fn the_header_describes_the_process() {
    let unix_before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let run = run_under_shim(
        "header",
        "abort",
        &["first", "second arg"],
        &[
            ("CUDA_VISIBLE_DEVICES", "1,0"),
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ],
    );
    let unix_after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert_eq!(run.output.status.signal(), Some(6));
    let pid = printed(&run.stdout(), "aborting", "pid");
    let dump = dump(&run.log());
    let header = &dump[0];
    assert_eq!(header["type"], "header");
    assert_eq!(u64_of(header, "version"), 7);
    assert_eq!(u64_of(header, "pid"), pid);
    assert_eq!(u64_of(header, "ppid"), u64::from(std::process::id()));
    assert_eq!(
        header["argv"],
        serde_json::json!([program("abort").to_str().unwrap(), "first", "second arg"])
    );
    let env = header["env"].as_object().expect("env");
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "1,0");
    assert_eq!(env["PYTORCH_CUDA_ALLOC_CONF"], "expandable_segments:True");
    for unset in ["PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING"] {
        match std::env::var(unset) {
            Ok(value) => assert_eq!(env[unset], value.as_str()),
            Err(_) => assert_eq!(env[unset], Value::Null, "{unset}"),
        }
    }
    assert_eq!(env.len(), 4);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(header["hostname"], hostname.trim_end());
    assert_eq!(header["stack_mode"], "mixed");
    assert_eq!(header["mode"], "stream");
    assert_eq!(header["recorder"], env!("CARGO_PKG_VERSION"));
    let start = u64_of(header, "start_unix_ns");
    assert!((unix_before..=unix_after).contains(&start));
    assert_eq!(header["apis"][0], "cuMemAlloc_v2");
    // The thread is named after the program, and every event is that thread's.
    assert!(
        dump.iter()
            .any(|r| r["type"] == "thread" && u64_of(r, "thread") == pid && r["name"] == "abort")
    );
    assert!(events(&dump).iter().all(|e| u64_of(e, "thread") == pid));
}

/// One `thread name=worker-<t> tid=<tid> dev=<d> allocs=<n> frees=<n> bytes=<sum> rc=<rc>` line.
struct Worker {
    t: u64,
    tid: u64,
    dev: i64,
    allocs: u64,
    frees: u64,
    bytes: u64,
    rc: u64,
}

fn workers(stdout: &str) -> Vec<Worker> {
    stdout
        .lines()
        .filter(|line| line.starts_with("thread name=worker-"))
        .map(|line| {
            let fields: HashMap<&str, &str> = line
                .split_whitespace()
                .filter_map(|w| w.split_once('='))
                .collect();
            let num = |k: &str| -> u64 { fields[k].parse().unwrap() };
            Worker {
                t: fields["name"]
                    .strip_prefix("worker-")
                    .unwrap()
                    .parse()
                    .unwrap(),
                tid: num("tid"),
                dev: fields["dev"].parse().unwrap(),
                allocs: num("allocs"),
                frees: num("frees"),
                bytes: num("bytes"),
                rc: num("rc"),
            }
        })
        .collect()
}

#[test]
fn eight_threads_every_event_in_time_order() {
    let run = run_under_shim("threads", "threads", &[], &[]);
    // Any failure here is the shim changing what the program sees (threads passes without it).
    assert_ok(&run, "threads");
    let workers = workers(&run.stdout());
    assert_eq!(workers.len(), 8);
    let (dump, stderr) = dump_with_stderr(&run.log());
    assert_eq!(stderr, "", "no damage");
    assert!(
        dump.iter()
            .all(|r| r["type"] != "dropped" && r["type"] != "damage")
    );
    let events = events(&dump);
    assert_eq!(events.len(), 160_000);
    assert_eq!(select(&events, "alloc", "cuMemAlloc_v2").len(), 80_000);
    assert_eq!(select(&events, "free", "cuMemFree_v2").len(), 80_000);

    let names: HashMap<u64, &str> = dump
        .iter()
        .filter(|r| r["type"] == "thread")
        .map(|r| (u64_of(r, "thread"), r["name"].as_str().unwrap()))
        .collect();
    let mut by_thread: HashMap<u64, Vec<&Value>> = HashMap::new();
    for event in &events {
        by_thread
            .entry(u64_of(event, "thread"))
            .or_default()
            .push(event);
    }
    assert_eq!(by_thread.len(), 8, "only the workers allocate");
    for worker in &workers {
        let t = worker.t;
        assert_eq!(worker.rc, 0);
        assert_eq!((worker.allocs, worker.frees), (10_000, 10_000));
        assert_eq!(worker.dev, (t % 2) as i64);
        assert_eq!(
            names.get(&worker.tid).copied(),
            Some(format!("worker-{t}").as_str())
        );
        let mine = &by_thread[&worker.tid];
        assert_eq!(mine.len(), 20_000, "worker-{t}");
        // alloc, free, alloc, free ...: each free gives back the allocation just made.
        let mut sizes = Vec::with_capacity(10_000);
        for (i, pair) in mine.chunks(2).enumerate() {
            let (alloc, free) = (pair[0], pair[1]);
            assert_eq!(alloc["event"], "alloc", "worker-{t} pair {i}");
            assert_eq!(free["event"], "free", "worker-{t} pair {i}");
            assert_eq!(u64_of(free, "addr"), u64_of(alloc, "addr"));
            assert_eq!(i64_of(alloc, "device"), worker.dev);
            assert_eq!(i64_of(free, "device"), worker.dev);
            assert_eq!(u64_of(alloc, "result"), 0);
            sizes.push(u64_of(alloc, "size"));
        }
        let expected: Vec<u64> = (0..10_000u64)
            .map(|i| (t + 1) * 4096 + (i % 7) * 512)
            .collect();
        assert_eq!(sizes, expected, "worker-{t}'s sizes");
        assert_eq!(sizes.iter().sum::<u64>(), worker.bytes);
    }

    // In log order: time never goes back, and an address is reused only after its free.
    let mut last_t = 0;
    let mut live: HashMap<u64, u64> = HashMap::new();
    for (i, record) in dump.iter().enumerate() {
        if record["type"] != "event" && record["type"] != "mem_info" {
            continue;
        }
        let t = u64_of(record, "t_ns");
        assert!(
            t >= last_t,
            "record {i} at {t} ns after one at {last_t} ns: {record}"
        );
        last_t = t;
        if record["type"] != "event" {
            continue;
        }
        let (addr, thread) = (u64_of(record, "addr"), u64_of(record, "thread"));
        if record["event"] == "alloc" {
            if let Some(owner) = live.insert(addr, thread) {
                panic!("record {i}: {addr:#x} allocated again while thread {owner} holds it");
            }
        } else {
            assert_eq!(
                live.remove(&addr),
                Some(thread),
                "record {i}: free of {addr:#x}"
            );
        }
    }
    assert!(live.is_empty());
}

/// Many threads whose very first hooked call is at the same moment (`bench 8 1 0`: a barrier,
/// then one alloc/free pair each): every call must succeed exactly as without the shim.
#[test]
fn concurrent_first_calls_all_reach_the_driver() {
    let mut failures = Vec::new();
    const RUNS: usize = 40;
    for attempt in 0..RUNS {
        let run = run_under_shim(
            "first-calls",
            "bench",
            &["8", "1", "0"],
            &[("VRAMSHIM_STACK", "none")],
        );
        if !run.output.status.success() {
            failures.push(format!("run {attempt}: {}", run.stderr().trim_end()));
            let _ = std::fs::remove_dir_all(&run.dir);
            continue;
        }
        let dump = dump(&run.log());
        let events = events(&dump);
        assert_eq!(select(&events, "alloc", "cuMemAlloc_v2").len(), 8);
        assert_eq!(select(&events, "free", "cuMemFree_v2").len(), 8);
        let _ = std::fs::remove_dir_all(&run.dir);
    }
    assert!(
        failures.is_empty(),
        "{} of {RUNS} runs failed under the shim (bench never fails without it):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Flight-recorder mode writes a dump at the failed allocation (the evidence of an OOM is on
/// disk even if the process dies of it) and another at exit.
#[test]
fn ring_mode_dumps_at_a_failed_allocation_and_at_exit() {
    let run = run_under_shim(
        "ring-oom",
        "oom",
        &[],
        &[
            ("FAKECUDA_MEM", "1G"),
            ("VRAMSHIM_MODE", "ring"),
            ("VRAMSHIM_RING_EVENTS", "16"),
        ],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let dump = dump(&run.log());
    let dumps: Vec<(usize, &str)> = dump
        .iter()
        .enumerate()
        .filter(|(_, r)| r["type"] == "dump_begin")
        .map(|(i, r)| (i, r["reason"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(
        dumps.iter().map(|d| d.1).collect::<Vec<_>>(),
        ["alloc_failed", "exit"]
    );
    // The first dump holds the 512 MiB allocation (live) and the failed 768 MiB request.
    let first: Vec<&serde_json::Value> = dump[dumps[0].0 + 1..dumps[1].0]
        .iter()
        .filter(|r| r["type"] == "event")
        .collect();
    let kinds: Vec<(&str, u64)> = first
        .iter()
        .map(|e| (e["event"].as_str().unwrap_or_default(), u64_of(e, "size")))
        .collect();
    assert_eq!(kinds, [("alloc", 512 << 20), ("alloc_failed", 768 << 20)]);
}

/// SIGUSR2 asks for a dump while the program runs; it is on disk even though the program is
/// then killed with SIGKILL.
#[test]
fn ring_mode_dumps_on_sigusr2_and_the_dump_survives_sigkill() {
    use std::process::Stdio;
    let dir = scratch("ring-usr2");
    let mut child = shim_command(&program("sigkill"), &dir)
        .env("VRAMSHIM_MODE", "ring")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sigkill");
    // sigkill makes 5 allocations, sleeps 500 ms, makes 5 more and kills itself.
    std::thread::sleep(std::time::Duration::from_millis(250));
    unsafe { libc_kill(child.id() as i32, 12) }; // SIGUSR2
    let status = child.wait().expect("wait");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    let log = dir.join(format!("{}.vlog", child.id()));
    let dump = dump(&log);
    let begin = dump
        .iter()
        .position(|r| r["type"] == "dump_begin")
        .expect("a dump on SIGUSR2");
    assert_eq!(dump[begin]["reason"], "SIGUSR2");
    let allocs = dump[begin..]
        .iter()
        .filter(|r| r["type"] == "event" && r["event"] == "alloc")
        .count();
    assert_eq!(allocs, 5, "the five allocations made before the signal");
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

/// Whether another open file description could take `flock(LOCK_EX)` on `path` now (taken and
/// released again at once).
fn lock_is_free(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).expect("open the log");
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !taken {
        let error = std::io::Error::last_os_error();
        assert_eq!(error.raw_os_error(), Some(libc::EWOULDBLOCK), "{error}");
    }
    taken
}

/// The recorder holds `flock` on its log while it may still write it (so `vramshim compact`
/// leaves it alone), and the lock goes with the process however it ends: here by SIGKILL,
/// with nothing run at exit.
#[test]
fn the_log_is_locked_while_its_process_lives_and_freed_by_sigkill() {
    use std::process::Stdio;
    let dir = scratch("log-lock");
    let mut child = shim_command(&program("sigkill"), &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sigkill");
    let log = dir.join(format!("{}.vlog", child.id()));
    // sigkill makes 5 allocations, then sleeps 500 ms: its log exists (the header is written
    // after the lock is taken) well before it kills itself.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::metadata(&log).map_or(true, |meta| meta.len() == 0) {
        assert!(std::time::Instant::now() < deadline, "no log at {log:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let locked_while_running = !lock_is_free(&log);
    let status = child.wait().expect("wait");
    assert_eq!(status.signal(), Some(9), "sigkill must die by SIGKILL");
    assert!(
        locked_while_running,
        "the log was not locked while sigkill ran"
    );
    assert!(lock_is_free(&log), "the lock outlived the process");
    // What was flushed reads back: the first five during the sleep, the last five maybe.
    let allocs = dump(&log)
        .iter()
        .filter(|r| r["type"] == "event" && r["event"] == "alloc")
        .count();
    assert!(
        (5..=10).contains(&allocs),
        "{allocs} allocations in {log:?}"
    );
}
