//! The report commands (`report`/`summary`, `peak`, `peak --at`, `leaks`, `oom`) on logs
//! written by real programs under the real preload. Every expected value comes from what the
//! program itself printed (sizes, addresses, devices, results), from `vramshim dump --json`
//! (event times) or from markers in the program's source (lines); none is copied from the
//! report under test.

mod common;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use common::*;
use serde_json::Value;
use vramshim_format::{Item, LogReader, Record};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The fake driver's default capacity per device.
const DEFAULT_CAPACITY: u64 = 80 * GIB;

// ---------------------------------------------------------------------------------------
// Running the tool

/// `vramshim COMMAND --json ARGS... LOGS...`, which must succeed, warning about nothing but
/// system libraries it cannot symbolise.
fn json_of(command: &str, args: &[&str], logs: &[&PathBuf]) -> Value {
    let mut all: Vec<&OsStr> = vec![OsStr::new(command), OsStr::new("--json")];
    all.extend(args.iter().map(OsStr::new));
    all.extend(logs.iter().map(|p| p.as_os_str()));
    // Tests share recordings; each distinct command runs once (symbolising takes time).
    static SEEN: Mutex<BTreeMap<Vec<OsString>, Value>> = Mutex::new(BTreeMap::new());
    let key: Vec<OsString> = all.iter().map(|a| a.to_os_string()).collect();
    if let Some(value) = SEEN.lock().unwrap().get(&key) {
        return value.clone();
    }
    let (code, stdout, stderr) = vramshim(&all);
    assert_eq!(code, Some(0), "vramshim {all:?} failed: {stderr}");
    let value: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|err| panic!("vramshim {all:?}: bad JSON: {err}\n{stdout}"));
    let warnings: Vec<&str> = arr(&value["warnings"])
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    let expected_stderr: String = warnings
        .iter()
        .map(|w| format!("vramshim: warning: {w}\n"))
        .collect();
    assert_eq!(stderr, expected_stderr, "vramshim {all:?}");
    for warning in warnings {
        assert!(
            is_system_library_warning(warning),
            "vramshim {all:?} warned: {warning}"
        );
    }
    SEEN.lock().unwrap().insert(key, value.clone());
    value
}

/// A symbolisation warning about a library outside the test fixtures (a C library without
/// debug symbols, say), which depends on the machine, not on the report.
fn is_system_library_warning(warning: &str) -> bool {
    let fixtures = c_dir().display().to_string();
    warning.starts_with('/')
        && !warning.starts_with(&fixtures)
        && (warning.contains("frames shown as module+offset")
            || warning.contains("some frames lack file and line"))
}

fn num(value: &Value, field: &str) -> u64 {
    u64_of(value, field)
}

// ---------------------------------------------------------------------------------------
// What the program says it did

/// Device of an operation line: `dev=`, or -1 (pinned host memory) when there is none.
fn device_of(op: &ProgramOp) -> i32 {
    op.fields
        .get("dev")
        .map_or(-1, |d| d.parse().expect("dev= is a number"))
}

fn succeeded(op: &ProgramOp) -> bool {
    op.int("rc") == 0
}

/// A live allocation of the program's own account.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Block {
    /// Index of the operation that allocated it.
    op: usize,
    device: i32,
    addr: u64,
    size: u64,
}

/// The memory operations a program printed (other lines dropped).
fn memory_ops(stdout: &str) -> Vec<ProgramOp> {
    program_ops(stdout)
        .into_iter()
        .filter(|op| op.op == "alloc" || op.op == "free")
        .collect()
}

/// What was live after the first `n` operations, oldest first.
fn live_after(ops: &[ProgramOp], n: usize) -> Vec<Block> {
    let mut live: Vec<Block> = Vec::new();
    for (index, op) in ops[..n].iter().enumerate() {
        if !succeeded(op) {
            continue;
        }
        match op.op.as_str() {
            "alloc" => live.push(Block {
                op: index,
                device: device_of(op),
                addr: op.num("addr"),
                size: op.num("size"),
            }),
            "free" => {
                let at = live
                    .iter()
                    .position(|b| b.addr == op.num("addr"))
                    .unwrap_or_else(|| panic!("op {index} frees what is not live: {op:?}"));
                live.remove(at);
            }
            other => panic!("unexpected op {other}"),
        }
    }
    live
}

fn on_device(live: &[Block], device: i32) -> Vec<Block> {
    live.iter()
        .filter(|b| b.device == device)
        .cloned()
        .collect()
}

fn bytes_of(blocks: &[Block]) -> u64 {
    blocks.iter().map(|b| b.size).sum()
}

/// The first moment `device` held the most: (bytes, live count, index of the operation).
fn peak_of(ops: &[ProgramOp], device: i32) -> (u64, u64, usize) {
    let mut best = (0, 0, usize::MAX);
    for index in 0..ops.len() {
        if ops[index].op != "alloc" || !succeeded(&ops[index]) {
            continue;
        }
        let here = on_device(&live_after(ops, index + 1), device);
        if bytes_of(&here) > best.0 {
            best = (bytes_of(&here), here.len() as u64, index);
        }
    }
    assert_ne!(best.2, usize::MAX, "nothing allocated on device {device}");
    best
}

/// The API family of an entry point, as the report names it (for the entry points the
/// report programs use).
fn family(api: &str) -> &'static str {
    if api.contains("Host") {
        "pinned_host"
    } else if api.starts_with("cuda") {
        "runtime"
    } else {
        "driver"
    }
}

/// (allocs, frees, failures, allocated bytes) per family, every family present.
type Families = BTreeMap<String, (u64, u64, u64, u64)>;

fn families_json(value: &Value) -> Families {
    arr(value)
        .iter()
        .map(|f| {
            (
                f["family"].as_str().unwrap().to_owned(),
                (
                    num(f, "allocs"),
                    num(f, "frees"),
                    num(f, "failures"),
                    num(f, "allocated_bytes"),
                ),
            )
        })
        .collect()
}

/// The families of `ops`; with `device`, only calls on that device's memory (a free counts
/// for the device of the memory it frees).
fn expected_families(ops: &[ProgramOp], device: Option<i32>) -> Families {
    let mut out: Families = [
        "runtime",
        "driver",
        "stream_ordered",
        "vmm",
        "managed",
        "pinned_host",
        "graph_pool",
    ]
    .iter()
    .map(|f| (f.to_string(), (0, 0, 0, 0)))
    .collect();
    for (index, op) in ops.iter().enumerate() {
        let memory_device = match op.op.as_str() {
            "free" => {
                live_after(ops, index)
                    .iter()
                    .find(|b| b.addr == op.num("addr"))
                    .expect("freed block")
                    .device
            }
            _ => device_of(op),
        };
        if device.is_some_and(|d| d != memory_device) {
            continue;
        }
        let entry = out.get_mut(family(&op.api)).unwrap();
        match (op.op.as_str(), succeeded(op)) {
            ("alloc", true) => {
                entry.0 += 1;
                entry.3 += op.num("size");
            }
            ("alloc", false) => entry.2 += 1,
            _ => entry.1 += 1,
        }
    }
    out
}

/// The line of `/* MARKER */` in a test program's source; exactly one must exist.
fn marker_line(program_source: &str, marker: &str) -> u64 {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("programs")
        .join(program_source);
    let source = std::fs::read_to_string(&path).expect("program source");
    let tag = format!("/* {marker} */");
    let lines: Vec<u64> = source
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(&tag))
        .map(|(index, _)| index as u64 + 1)
        .collect();
    assert_eq!(lines.len(), 1, "{tag} in {}: {lines:?}", path.display());
    lines[0]
}

// ---------------------------------------------------------------------------------------
// Recording

/// One process's recording: the program's operations, the log, and the time and thread
/// the log gives each operation.
struct Recorded {
    pid: u64,
    stdout: String,
    ops: Vec<ProgramOp>,
    log: PathBuf,
    dump: Vec<Value>,
    /// `t_ns` of the event of each operation (same index).
    times: Vec<u64>,
}

impl Recorded {
    /// Checks that the log holds exactly the program's operations, in order.
    fn new(stdout: &str, ops: Vec<ProgramOp>, log: PathBuf) -> Recorded {
        let dump = dump(&log);
        let events = events(&dump);
        assert_eq!(
            events.len(),
            ops.len(),
            "one event per operation\n{stdout}\n{events:?}"
        );
        for (op, event) in ops.iter().zip(&events) {
            let kind = match (op.op.as_str(), succeeded(op)) {
                ("alloc", true) => "alloc",
                ("alloc", false) => "alloc_failed",
                _ => "free",
            };
            assert_eq!(event["event"], kind, "{op:?} {event}");
            assert_eq!(event["api"], op.api.as_str(), "{op:?} {event}");
            assert_eq!(i64_of(event, "device"), i64::from(device_of(op)), "{op:?}");
            assert_eq!(i64_of(event, "result"), op.int("rc"), "{op:?} {event}");
            if kind != "alloc_failed" {
                assert_eq!(num(event, "addr"), op.num("addr"), "{op:?} {event}");
            }
            if kind != "free" {
                assert_eq!(num(event, "size"), op.num("size"), "{op:?} {event}");
            }
        }
        let times = events.iter().map(|e| num(e, "t_ns")).collect();
        Recorded {
            pid: num(&dump[0], "pid"),
            stdout: stdout.to_owned(),
            ops,
            log,
            dump,
            times,
        }
    }

    fn events(&self) -> Vec<&Value> {
        events(&self.dump)
    }

    /// Index of the first operation matching `pred`.
    fn find(&self, pred: impl Fn(&ProgramOp) -> bool) -> usize {
        self.ops
            .iter()
            .position(pred)
            .unwrap_or_else(|| panic!("no such operation in\n{}", self.stdout))
    }
}

/// Runs `program` under the shim (one process) and checks its log against its output.
fn record(test: &str, program: &str, env: &[(&str, &str)]) -> Recorded {
    let run = run_under_shim(test, program, &[], env);
    assert!(
        run.output.status.success(),
        "{program} failed: {}\n{}",
        run.stderr(),
        run.stdout()
    );
    let stdout = run.stdout();
    Recorded::new(&stdout, memory_ops(&stdout), run.log())
}

/// `report_peak`, recorded once for all the tests that read it.
fn peak_workload() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorded = record("report-peak", "report_peak", &[]);
        assert_eq!(recorded.ops.len(), 14, "{}", recorded.stdout);
        recorded
    })
}

/// `report_oom` with 1 GiB per device and 100 MiB requests failing, recorded once.
fn oom_workload() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorded = record(
            "report-oom",
            "report_oom",
            &[("FAKECUDA_MEM", "1G"), ("FAKECUDA_FAIL_SIZE", "100M")],
        );
        let failed = recorded.ops.iter().filter(|op| !succeeded(op)).count();
        assert_eq!(failed, 3, "{}", recorded.stdout);
        recorded
    })
}

// ---------------------------------------------------------------------------------------
// Views of a live set

/// (bytes, count, innermost function, its line) of every stack of a view, sorted.
fn stack_keys(stacks: &Value) -> Vec<(u64, u64, String, u64)> {
    let mut keys: Vec<_> = arr(stacks)
        .iter()
        .map(|s| {
            let frame = &s["frames"][0];
            (
                num(s, "bytes"),
                num(s, "count"),
                frame["function"].as_str().unwrap_or("?").to_owned(),
                frame["line"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    keys.sort();
    keys
}

/// The stack keys `report_peak` gives a set of its blocks: each was allocated in `main`, on
/// the line its output names, one per stack.
fn peak_program_keys(recorded: &Recorded, blocks: &[Block]) -> Vec<(u64, u64, String, u64)> {
    let mut keys: Vec<_> = blocks
        .iter()
        .map(|b| (b.size, 1, "main".to_owned(), recorded.ops[b.op].num("line")))
        .collect();
    keys.sort();
    keys
}

/// Checks every stack's innermost frame lies in `source` and its pids are `pids`.
fn check_stack_origin(stacks: &Value, source: &str, pids: &[u64]) {
    for stack in arr(stacks) {
        let file = stack["frames"][0]["file"].as_str().unwrap_or_default();
        assert!(file.ends_with(&format!("/{source}")), "{stack}");
        let got: Vec<u64> = arr(&stack["pids"])
            .iter()
            .map(|p| p.as_u64().unwrap())
            .collect();
        assert_eq!(got, pids, "{stack}");
    }
}

/// The device entries of a snapshot view by device.
fn views_by_device(json: &Value) -> BTreeMap<i64, &Value> {
    arr(&json["devices"])
        .iter()
        .map(|v| (i64_of(v, "device"), v))
        .collect()
}

// ---------------------------------------------------------------------------------------
// 1. A workload whose peaks are known to the byte and to the event

#[test]
fn peak_finds_each_devices_highest_moment_to_the_byte_and_the_event() {
    let rec = peak_workload();
    let json = json_of("peak", &[], &[&rec.log]);
    assert_eq!(json["what"], "peak");
    assert_eq!(num(&json["processes"][0], "pid"), rec.pid);
    let views = views_by_device(&json);
    assert_eq!(
        views.keys().copied().collect::<Vec<_>>(),
        vec![-1, 0, 1],
        "one view per device and one for pinned host memory"
    );
    for device in [0, 1, -1] {
        let (bytes, count, index) = peak_of(&rec.ops, device);
        let view = views[&i64::from(device)];
        assert_eq!(num(view, "bytes"), bytes, "device {device}");
        assert_eq!(num(view, "count"), count, "device {device}");
        assert_eq!(
            num(view, "t_ns"),
            rec.times[index],
            "device {device}: the time of the allocation that reached the peak ({:?})",
            rec.ops[index]
        );
        let live = on_device(&live_after(&rec.ops, index + 1), device);
        assert_eq!(
            stack_keys(&view["stacks"]),
            peak_program_keys(rec, &live),
            "device {device}"
        );
        check_stack_origin(&view["stacks"], "report_peak.c", &[rec.pid]);
        assert_eq!(num(&view["tree"], "bytes"), bytes);
        assert_eq!(num(&view["tree"], "count"), count);
    }
    // The numbers themselves, as the program's head comment states them.
    assert_eq!(num(views[&0], "bytes"), 224 * MIB + 512);
    assert_eq!(num(views[&1], "bytes"), 200 * MIB);
    assert_eq!(num(views[&-1], "bytes"), 200 * MIB);
}

#[test]
fn peak_lists_devices_in_report_order() {
    // `report` and `peak --at` list device 0, device 1, then pinned host memory
    // (render::device_order); `peak` should too, whatever the order the peaks came in.
    let rec = peak_workload();
    let json = json_of("peak", &[], &[&rec.log]);
    let order: Vec<i64> = arr(&json["devices"])
        .iter()
        .map(|v| i64_of(v, "device"))
        .collect();
    assert_eq!(order, vec![0, 1, -1]);
}

#[test]
fn report_shows_peaks_exit_state_families_and_largest_allocations() {
    let rec = peak_workload();
    let json = json_of("report", &[], &[&rec.log]);
    let at_exit = live_after(&rec.ops, rec.ops.len());

    let devices = arr(&json["devices"]);
    assert_eq!(
        devices
            .iter()
            .map(|d| i64_of(d, "device"))
            .collect::<Vec<_>>(),
        vec![0, 1],
        "pinned host memory is not a device"
    );
    let host = &json["pinned_host"];
    for (entry, device) in devices.iter().zip([0, 1]).chain([(host, -1)]) {
        let (bytes, count, index) = peak_of(&rec.ops, device);
        assert_eq!(i64_of(entry, "device"), i64::from(device));
        assert_eq!(num(entry, "peak_bytes"), bytes, "device {device}");
        assert_eq!(num(entry, "peak_count"), count, "device {device}");
        assert_eq!(num(entry, "peak_t_ns"), rec.times[index], "device {device}");
        let exit = on_device(&at_exit, device);
        assert_eq!(num(entry, "live_at_exit_bytes"), bytes_of(&exit));
        assert_eq!(num(entry, "live_at_exit_count"), exit.len() as u64);
        assert_eq!(num(entry, "failures"), 0);
        let peak_live = on_device(&live_after(&rec.ops, index + 1), device);
        assert_eq!(
            stack_keys(&entry["top_stacks_at_peak"]),
            peak_program_keys(rec, &peak_live)
        );
        check_stack_origin(&entry["top_stacks_at_peak"], "report_peak.c", &[rec.pid]);
        let per_process = arr(&entry["per_process"]);
        assert_eq!(per_process.len(), 1);
        assert_eq!(num(&per_process[0], "pid"), rec.pid);
        assert_eq!(num(&per_process[0], "peak_bytes"), bytes);
        assert_eq!(num(&per_process[0], "peak_t_ns"), rec.times[index]);
    }
    // The pinned buffer (200 MiB) is larger than anything on a device and counts in none.
    assert_eq!(num(host, "peak_bytes"), 200 * MIB);
    assert_eq!(num(&devices[0], "peak_bytes"), 224 * MIB + 512);
    assert_eq!(num(&devices[1], "peak_bytes"), 200 * MIB);
    // Exit: one buffer on each device, nothing pinned.
    assert_eq!(num(&devices[0], "live_at_exit_bytes"), 128 * MIB);
    assert_eq!(num(&devices[1], "live_at_exit_bytes"), 30 * MIB);
    assert_eq!(num(host, "live_at_exit_count"), 0);

    // Device memory samples: the first is taken right after the device's first event; the
    // fake driver has no context overhead, so everything used is tracked.
    for (entry, device) in devices.iter().zip([0, 1]) {
        let first_op = rec.find(|op| device_of(op) == device);
        let size = rec.ops[first_op].num("size");
        let first = &entry["memory_samples"]["first"];
        assert_eq!(num(first, "t_ns"), rec.times[first_op], "device {device}");
        assert_eq!(num(first, "used"), size);
        assert_eq!(num(first, "tracked"), size);
        assert_eq!(num(first, "untracked"), 0);
        assert_eq!(num(first, "total"), DEFAULT_CAPACITY);
    }
    assert_eq!(num(&host["memory_samples"], "count"), 0);

    let expected = expected_families(&rec.ops, None);
    assert_eq!(families_json(&json["families"]), expected);
    assert_eq!(expected["runtime"], (4, 3, 0, (64 + 100 + 128 + 120) * MIB));
    assert_eq!(expected["driver"], (3, 2, 0, (32 + 50 + 30) * MIB + 512));
    assert_eq!(expected["pinned_host"], (1, 1, 0, 200 * MIB));
    let per_process = arr(&json["per_process_families"]);
    assert_eq!(per_process.len(), 1);
    assert_eq!(num(&per_process[0], "pid"), rec.pid);
    assert_eq!(families_json(&per_process[0]["families"]), expected);

    // Largest allocations: all 8 (fewer than 10), largest first, with where they were made.
    let mut allocs: Vec<usize> = (0..rec.ops.len())
        .filter(|&i| rec.ops[i].op == "alloc")
        .collect();
    allocs.sort_by_key(|&i| (std::cmp::Reverse(rec.ops[i].num("size")), rec.times[i]));
    let largest = arr(&json["largest"]);
    assert_eq!(largest.len(), allocs.len());
    for (entry, &i) in largest.iter().zip(&allocs) {
        let op = &rec.ops[i];
        assert_eq!(num(entry, "size"), op.num("size"), "{entry}");
        assert_eq!(num(entry, "addr"), op.num("addr"), "{entry}");
        assert_eq!(i64_of(entry, "device"), i64::from(device_of(op)), "{entry}");
        assert_eq!(entry["api"], op.api.as_str(), "{entry}");
        assert_eq!(num(entry, "t_ns"), rec.times[i], "{entry}");
        assert_eq!(num(entry, "pid"), rec.pid);
        assert_eq!(entry["frames"][0]["function"], "main", "{entry}");
        assert_eq!(num(&entry["frames"][0], "line"), op.num("line"), "{entry}");
    }

    let process = &json["processes"][0];
    assert_eq!(num(process, "pid"), rec.pid);
    assert_eq!(num(process, "events"), rec.ops.len() as u64);
    assert_eq!(num(process, "unmatched_frees"), 0);
    assert_eq!(num(process, "duration_ns"), *rec.times.last().unwrap());
    assert_eq!(num(&json, "duration_ns"), *rec.times.last().unwrap());

    // `summary` is the same command.
    let summary = json_of("summary", &[], &[&rec.log]);
    assert_eq!(summary, json);
}

#[test]
fn peak_at_a_time_gives_the_exact_live_set_then() {
    let rec = peak_workload();
    // Between device 0's peak (an allocation) and the next operation (a free).
    let (_, _, index) = peak_of(&rec.ops, 0);
    assert_eq!(rec.ops[index + 1].op, "free");
    let (before, after) = (rec.times[index], rec.times[index + 1]);
    assert!(
        after - before > 1000,
        "the program pauses 1 ms between operations"
    );
    let cases = [
        ((before + after) / 2, index + 1),
        // An event exactly at the time given is included.
        (after, index + 2),
        (before - 1, index),
    ];
    for (at, applied) in cases {
        let at_arg = format!("{at}ns");
        let json = json_of("peak", &["--at", &at_arg], &[&rec.log]);
        assert_eq!(json["what"], "at");
        let live = live_after(&rec.ops, applied);
        let mut devices: Vec<i32> = live.iter().map(|b| b.device).collect();
        devices.sort_by_key(|d| (*d < 0, d.abs()));
        devices.dedup();
        let views = arr(&json["devices"]);
        assert_eq!(
            views
                .iter()
                .map(|v| i64_of(v, "device"))
                .collect::<Vec<_>>(),
            devices.iter().map(|d| i64::from(*d)).collect::<Vec<_>>(),
            "at {at_arg}: devices with something live, devices first, then pinned host"
        );
        for (view, device) in views.iter().zip(&devices) {
            let blocks = on_device(&live, *device);
            assert_eq!(num(view, "t_ns"), at);
            assert_eq!(
                num(view, "bytes"),
                bytes_of(&blocks),
                "at {at_arg} {device}"
            );
            assert_eq!(num(view, "count"), blocks.len() as u64);
            assert_eq!(
                stack_keys(&view["stacks"]),
                peak_program_keys(rec, &blocks),
                "at {at_arg} device {device}"
            );
        }
    }
    // The first case in plain numbers: a0 + b0 + c0 on device 0, a1 + b1 on device 1, the
    // pinned buffer.
    let mid = format!("{}ns", (before + after) / 2);
    let json = json_of("peak", &["--at", &mid], &[&rec.log]);
    let bytes: Vec<u64> = arr(&json["devices"])
        .iter()
        .map(|v| num(v, "bytes"))
        .collect();
    assert_eq!(bytes, vec![224 * MIB + 512, 150 * MIB, 200 * MIB]);

    // Before the first event nothing was live.
    let json = json_of("peak", &["--at", "0ns"], &[&rec.log]);
    assert_eq!(json["devices"], serde_json::json!([]));
}

// ---------------------------------------------------------------------------------------
// 7. --device

#[test]
fn device_option_narrows_every_view_to_that_device() {
    let rec = peak_workload();
    let on1: Vec<usize> = (0..rec.ops.len())
        .filter(|&i| rec.ops[i].op == "alloc" && device_of(&rec.ops[i]) == 1)
        .collect();
    assert_eq!(on1.len(), 4);

    let json = json_of("report", &["--device", "1"], &[&rec.log]);
    let devices = arr(&json["devices"]);
    assert_eq!(devices.len(), 1);
    let (bytes, count, index) = peak_of(&rec.ops, 1);
    assert_eq!(i64_of(&devices[0], "device"), 1);
    assert_eq!(num(&devices[0], "peak_bytes"), bytes);
    assert_eq!(num(&devices[0], "peak_count"), count);
    assert_eq!(num(&devices[0], "peak_t_ns"), rec.times[index]);
    assert_eq!(num(&devices[0], "live_at_exit_bytes"), 30 * MIB);
    assert_eq!(json["pinned_host"], Value::Null);
    let mut sizes: Vec<u64> = on1.iter().map(|&i| rec.ops[i].num("size")).collect();
    sizes.sort_by(|a, b| b.cmp(a));
    let largest = arr(&json["largest"]);
    assert_eq!(
        largest.iter().map(|l| num(l, "size")).collect::<Vec<_>>(),
        sizes
    );
    assert!(largest.iter().all(|l| i64_of(l, "device") == 1));
    // Allocations on device 1 by family (frees: see the next test).
    let families = families_json(&json["families"]);
    let expected = expected_families(&rec.ops, Some(1));
    for family in families.keys() {
        assert_eq!(
            (families[family].0, families[family].2, families[family].3),
            (expected[family].0, expected[family].2, expected[family].3),
            "{family}"
        );
    }
    assert_eq!(expected["runtime"].0, 2);
    assert_eq!(expected["driver"].0, 2);
    assert_eq!(expected["pinned_host"].0, 0);

    let json = json_of("peak", &["--device", "1"], &[&rec.log]);
    let views = arr(&json["devices"]);
    assert_eq!(views.len(), 1);
    assert_eq!(i64_of(&views[0], "device"), 1);
    assert_eq!(num(&views[0], "bytes"), 200 * MIB);
    assert_eq!(num(&views[0], "t_ns"), rec.times[index]);

    let json = json_of("leaks", &["--device", "1"], &[&rec.log]);
    let views = arr(&json["devices"]);
    assert_eq!(views.len(), 1);
    let left = on_device(&live_after(&rec.ops, rec.ops.len()), 1);
    assert_eq!(num(&views[0], "bytes"), bytes_of(&left));
    assert_eq!(
        stack_keys(&views[0]["stacks"]),
        peak_program_keys(rec, &left)
    );

    // -1 is pinned host memory.
    let json = json_of("report", &["--device", "-1"], &[&rec.log]);
    assert_eq!(json["devices"], serde_json::json!([]));
    assert_eq!(num(&json["pinned_host"], "peak_bytes"), 200 * MIB);
    assert_eq!(arr(&json["largest"]).len(), 1);

    let oom = oom_workload();
    let json = json_of("oom", &["--device", "1"], &[&oom.log]);
    let failures = arr(&json["failures"]);
    assert_eq!(failures.len(), 1);
    let index = oom.find(|op| !succeeded(op) && device_of(op) == 1);
    assert_eq!(num(&failures[0], "t_ns"), oom.times[index]);
    assert_eq!(num(&failures[0], "request"), oom.ops[index].num("size"));
}

#[test]
fn device_option_counts_a_free_for_the_device_of_the_memory_it_frees() {
    // report_peak frees a device-1 buffer with cudaFree while device 0 is current (the
    // recorded event says device 0, the memory was on device 1). With --device 1 the calls
    // must add up: allocations - frees = live at exit.
    let rec = peak_workload();
    let cross = (0..rec.ops.len())
        .find(|&i| {
            let op = &rec.ops[i];
            op.op == "free"
                && device_of(op) == 0
                && live_after(&rec.ops, i)
                    .iter()
                    .any(|b| b.addr == op.num("addr") && b.device == 1)
        })
        .expect("a device-1 buffer freed while device 0 is current");
    assert_eq!(i64_of(rec.events()[cross], "device"), 0);
    for device in [0, 1] {
        let arg = device.to_string();
        let json = json_of("report", &["--device", &arg], &[&rec.log]);
        let families = families_json(&json["families"]);
        let expected = expected_families(&rec.ops, Some(device));
        let (allocs, frees) = families
            .values()
            .fold((0, 0), |(a, f), c| (a + c.0, f + c.1));
        let live = num(&json["devices"][0], "live_at_exit_count");
        assert_eq!(
            families, expected,
            "--device {device}: a free counts for the device of the memory it frees, not for the device current at the call (allocs {allocs}, frees {frees}, live at exit {live})"
        );
        assert_eq!(allocs - frees, live, "--device {device}");
    }
}

// ---------------------------------------------------------------------------------------
// 2. Leaks at known lines

/// A stack expected among the leaks.
struct Leaked {
    device: i64,
    bytes: u64,
    count: u64,
    /// (function, line) of the frames in the program, innermost first.
    frames: Vec<(&'static str, u64)>,
}

#[test]
fn leaks_names_each_leaking_stack_at_its_source_lines() {
    let rec = record("report-leaks", "report_leaks", &[]);
    let src = "report_leaks.c";
    let line = |marker: &str| marker_line(src, marker);
    let expected = [
        Leaked {
            device: 0,
            bytes: 3 * 8 * MIB,
            count: 3,
            frames: vec![
                ("load_weights", line("LEAK: weights")),
                ("main", line("CALL: weights-from-main")),
            ],
        },
        Leaked {
            device: 0,
            bytes: 4 * MIB,
            count: 1,
            frames: vec![
                ("make_cache", line("LEAK: cache")),
                ("main", line("CALL: cache-from-main")),
            ],
        },
        Leaked {
            device: 0,
            bytes: 2 * MIB,
            count: 1,
            frames: vec![
                ("make_cache", line("LEAK: cache")),
                ("build_index", line("CALL: cache-from-build_index")),
                ("main", line("CALL: build_index-from-main")),
            ],
        },
        Leaked {
            device: 1,
            bytes: 5 * MIB,
            count: 1,
            frames: vec![
                ("load_weights", line("LEAK: weights")),
                ("main", line("CALL: weights-dev1-from-main")),
            ],
        },
        Leaked {
            device: -1,
            bytes: MIB,
            count: 1,
            frames: vec![
                ("stage", line("LEAK: stage")),
                ("main", line("CALL: stage-from-main")),
            ],
        },
    ];
    // The program's own account agrees with the table: what it left live, per device.
    let at_exit = live_after(&rec.ops, rec.ops.len());
    for device in [0, 1, -1] {
        let (bytes, count) = expected
            .iter()
            .filter(|e| e.device == i64::from(device))
            .fold((0, 0), |(b, c), e| (b + e.bytes, c + e.count));
        let left = on_device(&at_exit, device);
        assert_eq!((bytes_of(&left), left.len() as u64), (bytes, count));
    }

    let json = json_of("leaks", &[], &[&rec.log]);
    assert_eq!(json["what"], "leaks");
    let views = arr(&json["devices"]);
    assert_eq!(
        views
            .iter()
            .map(|v| i64_of(v, "device"))
            .collect::<Vec<_>>(),
        vec![0, 1, -1]
    );
    let end = *rec.times.last().unwrap();
    for view in views {
        let device = i64_of(view, "device");
        let want: Vec<&Leaked> = expected.iter().filter(|e| e.device == device).collect();
        assert_eq!(num(view, "t_ns"), end, "leaks are what is live at the end");
        assert_eq!(
            num(view, "bytes"),
            want.iter().map(|e| e.bytes).sum::<u64>()
        );
        assert_eq!(
            num(view, "count"),
            want.iter().map(|e| e.count).sum::<u64>()
        );
        let stacks = arr(&view["stacks"]);
        assert_eq!(stacks.len(), want.len(), "device {device}: {stacks:?}");
        // Largest first, as in the table.
        for (stack, leaked) in stacks.iter().zip(want) {
            let frames = &leaked.frames;
            assert_eq!(num(stack, "bytes"), leaked.bytes, "{stack}");
            assert_eq!(num(stack, "count"), leaked.count, "{stack}");
            assert_eq!(arr(&stack["pids"])[0].as_u64(), Some(rec.pid), "{stack}");
            let got = arr(&stack["frames"]);
            for (k, (function, line)) in frames.iter().enumerate() {
                assert_eq!(got[k]["function"], *function, "frame {k} of {stack}");
                assert_eq!(got[k]["line"].as_u64(), Some(*line), "frame {k} of {stack}");
                let file = got[k]["file"].as_str().unwrap_or_default();
                assert!(file.ends_with(&format!("/programs/{src}")), "{file}");
            }
            // main is the program's outermost frame: the next one is the C library's.
            let next = got[frames.len()]["file"].as_str().unwrap_or_default();
            assert!(!next.ends_with(src), "frame after main: {stack}");
        }
        // The caller -> callee tree: following each stack from the outermost frame ends at a
        // leaf holding exactly that stack.
        assert_eq!(num(&view["tree"], "bytes"), num(view, "bytes"));
        for stack in stacks {
            let mut node = &view["tree"];
            for frame in arr(&stack["frames"]).iter().rev() {
                node = arr(&node["children"])
                    .iter()
                    .find(|child| child["frame"] == *frame)
                    .unwrap_or_else(|| panic!("no tree node for {frame}"));
            }
            assert_eq!(num(node, "bytes"), num(stack, "bytes"));
            assert_eq!(num(node, "count"), num(stack, "count"));
            assert_eq!(node["children"], serde_json::json!([]));
        }
    }

    // The text names the same places.
    let (code, text, stderr) = vramshim(&[OsStr::new("leaks"), rec.log.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.lines().all(|l| l
            .strip_prefix("vramshim: warning: ")
            .is_some_and(is_system_library_warning)),
        "{stderr}"
    );
    for needle in [
        "device 0: still live at exit".to_string(),
        "30.00 MiB in 5 allocations".to_string(),
        format!("load_weights ({src}:{})", line("LEAK: weights")),
        format!(
            "build_index ({src}:{})",
            line("CALL: cache-from-build_index")
        ),
        "pinned host memory: still live at exit".to_string(),
    ] {
        assert!(text.contains(&needle), "{needle:?} not in\n{text}");
    }
    // The scratch buffer was freed: it is no leak.
    assert!(!text.contains("scratch_buffer"), "{text}");
}

// ---------------------------------------------------------------------------------------
// 3. OOM verdicts

#[test]
fn oom_gives_the_verdict_free_memory_and_live_set_of_each_failure() {
    let rec = oom_workload();
    let src = "report_oom.c";
    let json = json_of("oom", &[], &[&rec.log]);
    let failures = arr(&json["failures"]);
    let failed: Vec<usize> = (0..rec.ops.len())
        .filter(|&i| !succeeded(&rec.ops[i]))
        .collect();
    assert_eq!(failures.len(), failed.len());
    let cases = [
        ("exceeded_free_memory", "fail_exceeded", "FAIL: exceeded"),
        ("fragmentation_or_limit", "fail_limit", "FAIL: limit"),
        ("exceeded_free_memory", "fail_device1", "FAIL: device1"),
    ];
    for ((failure, &index), (verdict, function, marker)) in failures.iter().zip(&failed).zip(cases)
    {
        let op = &rec.ops[index];
        let device = device_of(op);
        let live = on_device(&live_after(&rec.ops, index), device);
        // The fake charges exactly the live device bytes: free = capacity - live.
        let free = GIB - bytes_of(&live);
        assert_eq!(num(failure, "pid"), rec.pid);
        assert_eq!(num(failure, "t_ns"), rec.times[index], "{failure}");
        assert_eq!(failure["api"], op.api.as_str());
        assert_eq!(i64_of(failure, "device"), i64::from(device));
        assert_eq!(num(failure, "request"), op.num("size"));
        assert_eq!(num(failure, "result"), 2);
        assert_eq!(num(failure, "free"), free, "{verdict}");
        assert_eq!(num(failure, "total"), GIB);
        assert_eq!(num(failure, "used"), bytes_of(&live));
        assert_eq!(num(failure, "tracked_bytes"), bytes_of(&live));
        assert_eq!(num(failure, "tracked_count"), live.len() as u64);
        assert_eq!(num(failure, "untracked_bytes"), 0);
        assert_eq!(failure["verdict"], verdict);
        assert_eq!(
            failure["retry"],
            Value::Null,
            "two different requests: no retry"
        );
        assert_eq!(failure["is_retry_of"], Value::Null);
        assert_eq!(failure["frames"][0]["function"], function);
        assert_eq!(
            failure["frames"][0]["line"].as_u64(),
            Some(marker_line(src, marker))
        );
        assert_eq!(failure["frames"][1]["function"], "main");
        // The largest live allocations: largest first, then oldest first.
        let mut by_size = live.clone();
        by_size.sort_by_key(|b| (std::cmp::Reverse(b.size), b.op));
        by_size.truncate(5);
        let largest = arr(&failure["largest_live"]);
        assert_eq!(largest.len(), by_size.len());
        for (entry, block) in largest.iter().zip(&by_size) {
            assert_eq!(num(entry, "addr"), block.addr, "{entry}");
            assert_eq!(num(entry, "size"), block.size, "{entry}");
            assert_eq!(entry["api"], rec.ops[block.op].api.as_str());
            assert_eq!(num(entry, "t_ns"), rec.times[block.op]);
            // Each carries the stack of its own allocation: the API says which call site.
            let (function, marker) = match (entry["device"].as_i64(), entry["api"].as_str()) {
                (Some(0), Some("cudaMalloc")) => ("hold_weights", "LIVE: weights"),
                (Some(0), Some("cuMemAlloc_v2")) => ("hold_kv", "LIVE: kv"),
                (Some(1), Some("cudaMalloc")) => ("hold_other_device", "LIVE: other-device"),
                other => panic!("unexpected live allocation {other:?}: {entry}"),
            };
            assert_eq!(entry["frames"][0]["function"], function, "{entry}");
            assert_eq!(num(&entry["frames"][0], "line"), marker_line(src, marker));
            assert_eq!(entry["frames"][1]["function"], "main", "{entry}");
        }
    }
    // The verdicts in numbers: 448 MiB live on device 0 leaves 576 MiB free; 600 MiB does not
    // fit, 100 MiB does (the fake's FAKECUDA_FAIL_SIZE refuses it anyway).
    assert_eq!(num(&failures[0], "free"), 576 * MIB);
    assert_eq!(num(&failures[1], "free"), 576 * MIB);
    assert_eq!(num(&failures[1], "request"), 100 * MIB);
    assert_eq!(num(&failures[2], "free"), 512 * MIB);
    assert_eq!(
        failures[0]["explanation"],
        "the request (600.00 MiB) exceeded the device's free memory (576.00 MiB)"
    );

    // Live by stack on device 0: the weights (one), the kv blocks (three, one call site);
    // nothing of device 1, of pinned memory, or freed.
    for failure in &failures[..2] {
        let stacks = arr(&failure["live_by_stack"]);
        let got: Vec<(u64, u64, &str, u64)> = stacks
            .iter()
            .map(|s| {
                (
                    num(s, "bytes"),
                    num(s, "count"),
                    s["frames"][0]["function"].as_str().unwrap(),
                    num(&s["frames"][0], "line"),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    256 * MIB,
                    1,
                    "hold_weights",
                    marker_line(src, "LIVE: weights")
                ),
                (192 * MIB, 3, "hold_kv", marker_line(src, "LIVE: kv")),
            ]
        );
        assert_eq!(stacks[0]["share"].as_f64(), Some(256.0 * 100.0 / 448.0));
    }
    let stacks = arr(&failures[2]["live_by_stack"]);
    assert_eq!(stacks.len(), 1);
    assert_eq!(num(&stacks[0], "bytes"), 512 * MIB);
    assert_eq!(stacks[0]["frames"][0]["function"], "hold_other_device");
    assert_eq!(
        num(&stacks[0]["frames"][0], "line"),
        marker_line(src, "LIVE: other-device")
    );

    // The log's own reading of the driver agrees.
    let logged: Vec<(u64, u64)> = rec
        .events()
        .iter()
        .filter(|e| e["event"] == "alloc_failed")
        .map(|e| (num(e, "mem_free"), num(e, "mem_total")))
        .collect();
    let reported: Vec<(u64, u64)> = failures
        .iter()
        .map(|f| (num(f, "free"), num(f, "total")))
        .collect();
    assert_eq!(logged, reported);

    // The summary counts the failures per device.
    let report = json_of("report", &[], &[&rec.log]);
    let per_device: Vec<u64> = arr(&report["devices"])
        .iter()
        .map(|d| num(d, "failures"))
        .collect();
    assert_eq!(per_device, vec![2, 1]);
}

// ---------------------------------------------------------------------------------------
// 4. PyTorch's release-and-retry

#[test]
fn oom_recognises_the_caching_allocators_retry_and_nothing_else() {
    let rec = record("report-retry", "report_retry", &[("FAKECUDA_MEM", "1G")]);
    let json = json_of("oom", &[], &[&rec.log]);
    let failures = arr(&json["failures"]);
    let failed: Vec<usize> = (0..rec.ops.len())
        .filter(|&i| !succeeded(&rec.ops[i]))
        .collect();
    assert_eq!(failures.len(), 6);
    assert_eq!(failed.len(), 6);
    for (failure, &index) in failures.iter().zip(&failed) {
        let live = on_device(&live_after(&rec.ops, index), 0);
        assert_eq!(num(failure, "t_ns"), rec.times[index]);
        assert_eq!(num(failure, "request"), rec.ops[index].num("size"));
        assert_eq!(num(failure, "free"), GIB - bytes_of(&live));
        assert_eq!(num(failure, "tracked_bytes"), bytes_of(&live));
        assert_eq!(failure["verdict"], "exceeded_free_memory");
    }
    let main_thread = num(rec.events()[0], "thread");
    assert!(failures.iter().all(|f| num(f, "thread") == main_thread));

    // What the failing thread released between a failure and its next allocation request.
    let released_after = |failure: usize| -> (u64, u64, usize) {
        let start = failed[failure];
        let next = (start + 1..rec.ops.len())
            .find(|&i| rec.ops[i].op == "alloc")
            .unwrap();
        let before = live_after(&rec.ops, start + 1);
        let after = live_after(&rec.ops, next);
        let gone: Vec<&Block> = before.iter().filter(|b| !after.contains(b)).collect();
        (gone.iter().map(|b| b.size).sum(), gone.len() as u64, next)
    };

    // 0: 3 segments released, the same 320 MiB request succeeded.
    let (bytes, count, next) = released_after(0);
    assert_eq!((bytes, count), (3 * 128 * MIB, 3));
    assert!(succeeded(&rec.ops[next]));
    assert_eq!(rec.ops[next].num("size"), num(&failures[0], "request"));
    let retry = &failures[0]["retry"];
    assert_eq!(num(retry, "released_bytes"), bytes);
    assert_eq!(num(retry, "released_count"), count);
    assert_eq!(retry["succeeded"], true);
    assert_eq!(num(retry, "t_ns"), rec.times[next]);
    assert_eq!(failures[0]["is_retry_of"], Value::Null);

    // 1 and 2: 2 segments released, the same 448 MiB request failed again.
    let (bytes, count, next) = released_after(1);
    assert_eq!((bytes, count), (2 * 128 * MIB, 2));
    assert_eq!(next, failed[2]);
    let retry = &failures[1]["retry"];
    assert_eq!(num(retry, "released_bytes"), bytes);
    assert_eq!(num(retry, "released_count"), count);
    assert_eq!(retry["succeeded"], false);
    assert_eq!(num(retry, "t_ns"), rec.times[failed[2]]);
    assert_eq!(failures[1]["is_retry_of"], Value::Null);
    assert_eq!(failures[2]["is_retry_of"], 1);
    assert_eq!(
        failures[2]["retry"],
        Value::Null,
        "a failed retry ends the sequence"
    );

    // 3: released, then a request of another size: no retry. 4: the same size as 3 fails
    // later, after that other allocation: a new failure, not a retry of 3.
    let (bytes, _, next) = released_after(3);
    assert_eq!(bytes, 384 * MIB);
    assert_ne!(rec.ops[next].num("size"), num(&failures[3], "request"));
    assert_eq!(failures[3]["retry"], Value::Null);
    assert_eq!(num(&failures[4], "request"), num(&failures[3], "request"));
    assert_eq!(failures[4]["is_retry_of"], Value::Null);

    // 4: another thread released memory and got the same size: not this thread's retry.
    let tid: u64 = rec
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("thread tid="))
        .expect("thread line")
        .parse()
        .unwrap();
    let other = rec.find(|op| op.op == "alloc" && succeeded(op) && op.num("size") == 512 * MIB);
    assert!(other > failed[4]);
    assert_eq!(num(rec.events()[other], "thread"), tid);
    assert_ne!(tid, main_thread);
    assert_eq!(failures[4]["retry"], Value::Null);

    // 5: released, then the same size on device 1: not a retry on device 0.
    let (bytes, _, next) = released_after(5);
    assert_eq!(bytes, 700 * MIB);
    assert_eq!(rec.ops[next].num("size"), num(&failures[5], "request"));
    assert_eq!(device_of(&rec.ops[next]), 1);
    assert_eq!(failures[5]["retry"], Value::Null);
    assert!(failures.iter().all(|f| f["is_retry_of"] != 0));
}

// ---------------------------------------------------------------------------------------
// 5. Two processes

#[test]
fn report_merges_the_logs_of_two_processes_by_time() {
    let run = run_under_shim("report-fork", "report_fork", &[], &[]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let stdout = run.stdout();
    let pid_after = |prefix: &str| -> u32 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {stdout}"))
            .parse()
            .unwrap()
    };
    let (parent_pid, child_pid) = (pid_after("parent pid="), pid_after("child pid="));
    assert_eq!(run.logs().len(), 2);
    let ops_of = |pid: u32| -> Vec<ProgramOp> {
        memory_ops(&stdout)
            .into_iter()
            .filter(|op| op.num("pid") == u64::from(pid))
            .collect()
    };
    let parent = Recorded::new(&stdout, ops_of(parent_pid), run.log_of(parent_pid));
    let child = Recorded::new(&stdout, ops_of(child_pid), run.log_of(child_pid));
    // Logs of one host and boot are aligned on CLOCK_MONOTONIC (exact), not wall clock.
    let start = |r: &Recorded| num(&r.dump[0], "start_mono_ns");
    let origin = start(&parent).min(start(&child));
    let offset = |r: &Recorded| start(r) - origin;
    let role = |r: &Recorded, role: &str| r.find(|op| op.fields["role"] == role);

    let json = json_of("report", &[], &[&parent.log, &child.log]);
    let processes = arr(&json["processes"]);
    assert_eq!(
        processes.iter().map(|p| num(p, "pid")).collect::<Vec<_>>(),
        vec![u64::from(parent_pid), u64::from(child_pid)]
    );
    assert_eq!(num(&processes[0], "start_offset_ns"), offset(&parent));
    assert_eq!(num(&processes[1], "start_offset_ns"), offset(&child));
    assert_eq!(num(&processes[0], "events"), parent.ops.len() as u64);
    assert_eq!(num(&processes[1], "events"), child.ops.len() as u64);

    let devices = arr(&json["devices"]);
    assert_eq!(devices.len(), 1);
    let device = &devices[0];
    // Both together: X (32) + Y1 (16) + Y2 (48) + W (8) when the parent allocated W while
    // the child held Y1 and Y2: more than either process alone, less than their sum.
    let sum = |r: &Recorded, roles: &[&str]| -> u64 {
        roles
            .iter()
            .map(|name| r.ops[role(r, name)].num("size"))
            .sum()
    };
    let together = sum(&parent, &["parent-x", "parent-w"]) + sum(&child, &["child-y1", "child-y2"]);
    assert_eq!(together, 104 * MIB);
    assert_eq!(num(device, "peak_bytes"), together);
    assert_eq!(num(device, "peak_count"), 4);
    let w = role(&parent, "parent-w");
    assert_eq!(num(device, "peak_t_ns"), offset(&parent) + parent.times[w]);
    assert_eq!(num(device, "live_at_exit_bytes"), 0);
    let per_process = arr(&device["per_process"]);
    assert_eq!(per_process.len(), 2);
    let (z, y2) = (role(&parent, "parent-z"), role(&child, "child-y2"));
    assert_eq!(num(&per_process[0], "pid"), u64::from(parent_pid));
    assert_eq!(num(&per_process[0], "peak_bytes"), 80 * MIB);
    assert_eq!(
        num(&per_process[0], "peak_bytes"),
        parent.ops[z].num("size")
    );
    assert_eq!(
        num(&per_process[0], "peak_t_ns"),
        offset(&parent) + parent.times[z]
    );
    assert_eq!(num(&per_process[1], "pid"), u64::from(child_pid));
    assert_eq!(num(&per_process[1], "peak_bytes"), 64 * MIB);
    assert_eq!(
        num(&per_process[1], "peak_t_ns"),
        offset(&child) + child.times[y2]
    );
    // The stacks at the peak say which process holds what.
    let stacks: Vec<(u64, u64)> = arr(&device["top_stacks_at_peak"])
        .iter()
        .map(|s| (num(s, "bytes"), arr(&s["pids"])[0].as_u64().unwrap()))
        .collect();
    let (p, c) = (u64::from(parent_pid), u64::from(child_pid));
    assert_eq!(
        stacks,
        vec![(48 * MIB, c), (32 * MIB, p), (16 * MIB, c), (8 * MIB, p)]
    );
    let families = families_json(&json["families"]);
    assert_eq!(families["runtime"], (5, 5, 0, 184 * MIB));
    let per_process_families = arr(&json["per_process_families"]);
    assert_eq!(
        families_json(&per_process_families[0]["families"])["runtime"],
        (3, 3, 0, 120 * MIB)
    );
    assert_eq!(
        families_json(&per_process_families[1]["families"])["runtime"],
        (2, 2, 0, 64 * MIB)
    );

    // The order of the logs on the command line changes nothing but the process order.
    let swapped = json_of("report", &[], &[&child.log, &parent.log]);
    for field in ["peak_bytes", "peak_count", "peak_t_ns"] {
        assert_eq!(swapped["devices"][0][field], device[field], "{field}");
    }
    // `peak` over both shows the same moment; nothing leaked.
    let peak = json_of("peak", &[], &[&parent.log, &child.log]);
    assert_eq!(num(&peak["devices"][0], "bytes"), together);
    assert_eq!(num(&peak["devices"][0], "t_ns"), num(device, "peak_t_ns"));
    let leaks = json_of("leaks", &[], &[&parent.log, &child.log]);
    assert_eq!(leaks["devices"], serde_json::json!([]));
}

// ---------------------------------------------------------------------------------------
// 6. Bad input

/// Where the chunks of a log lie: (start offset, length with its head, events in it). A
/// continued chunk (format 6) decodes after the chunks before it: its events are those of
/// the log up to its end less those before it.
fn chunks(bytes: &[u8]) -> Vec<(usize, usize, usize)> {
    assert_eq!(&bytes[..8], b"VRAMSHIM");
    let spans = vramshim_format::chunk_spans(bytes);
    let end = spans.last().map_or(0, |span| span.start + span.len());
    assert_eq!(end, bytes.len());
    let mut before = 0;
    spans
        .iter()
        .map(|span| {
            let mut upto = 0;
            let prefix = &bytes[..span.start + span.len()];
            for item in LogReader::new(std::io::Cursor::new(prefix)).expect("header") {
                match item {
                    Item::Record(Record::Event(_)) => upto += 1,
                    Item::Record(_) => {}
                    Item::Damage(damage) => panic!("chunk at {}: {damage}", span.start),
                }
            }
            let events = upto - before;
            before = upto;
            (span.start, span.len(), events)
        })
        .collect()
}

#[test]
fn report_commands_on_a_torn_log_report_everything_before_the_tear() {
    let rec = oom_workload();
    let bytes = std::fs::read(&rec.log).unwrap();
    let chunks = chunks(&bytes);
    assert!(chunks.len() >= 2, "failed allocations flush: {chunks:?}");
    // Tear the last chunk that holds events, in its middle; the events of the whole chunks
    // before it are what is left.
    let torn_chunk = chunks
        .iter()
        .rposition(|c| c.2 > 0)
        .expect("a chunk with events");
    let (last_start, last_len, _) = chunks[torn_chunk];
    let kept: usize = chunks[..torn_chunk].iter().map(|c| c.2).sum();
    let cut = last_start + last_len / 2;
    let dir = scratch("report-torn");
    let torn = dir.join("torn.vlog");
    std::fs::write(&torn, &bytes[..cut]).unwrap();
    assert!(
        kept > 0 && kept < rec.ops.len(),
        "{kept} of {}",
        rec.ops.len()
    );
    let ops = &rec.ops[..kept];
    let warning = format!(
        "{}: log ends in an incomplete chunk at byte {last_start} ({} bytes unusable): the recorder was stopped mid-write; everything before is intact",
        torn.display(),
        cut - last_start
    );

    let run = |command: &str| -> Value {
        let (code, stdout, stderr) =
            vramshim(&[OsStr::new(command), OsStr::new("--json"), torn.as_os_str()]);
        assert_eq!(code, Some(0), "{command}: {stderr}");
        let json: Value = serde_json::from_str(&stdout).unwrap();
        let warnings = arr(&json["warnings"]);
        assert_eq!(warnings[0], warning.as_str(), "{command}");
        assert!(
            warnings[1..]
                .iter()
                .all(|w| is_system_library_warning(w.as_str().unwrap())),
            "{command}: {warnings:?}"
        );
        assert!(
            stderr.starts_with(&format!("vramshim: warning: {warning}\n")),
            "{command}: {stderr}"
        );
        assert_eq!(
            stderr.lines().count(),
            warnings.len(),
            "{command}: {stderr}"
        );
        let damage = arr(&json["processes"][0]["damage"]);
        assert_eq!(damage.len(), 1, "{command}");
        assert_eq!(num(&damage[0], "offset"), last_start as u64, "{command}");
        assert_eq!(
            num(&json["processes"][0], "events"),
            kept as u64,
            "{command}"
        );
        json
    };

    let report = run("report");
    let at_end = live_after(ops, kept);
    for (entry, device) in arr(&report["devices"]).iter().zip([0, 1]) {
        let (bytes, count, index) = peak_of(ops, device);
        assert_eq!(num(entry, "peak_bytes"), bytes);
        assert_eq!(num(entry, "peak_count"), count);
        assert_eq!(num(entry, "peak_t_ns"), rec.times[index]);
        let live = on_device(&at_end, device);
        assert_eq!(num(entry, "live_at_exit_bytes"), bytes_of(&live));
        assert_eq!(num(entry, "live_at_exit_count"), live.len() as u64);
    }
    assert_eq!(arr(&report["devices"]).len(), 2);
    assert_eq!(
        families_json(&report["families"]),
        expected_families(ops, None)
    );

    // What the lost chunk freed is still live for `leaks`.
    let leaks = run("leaks");
    let views = views_by_device(&leaks);
    for device in [0, 1, -1] {
        let live = on_device(&at_end, device);
        match views.get(&i64::from(device)) {
            Some(view) => {
                assert_eq!(num(view, "bytes"), bytes_of(&live), "device {device}");
                assert_eq!(num(view, "count"), live.len() as u64);
            }
            None => assert!(live.is_empty(), "device {device}"),
        }
    }
    let oom = run("oom");
    let failed = ops.iter().filter(|op| !succeeded(op)).count();
    assert_eq!(arr(&oom["failures"]).len(), failed);
    let peak = run("peak");
    assert_eq!(num(views_by_device(&peak)[&0], "bytes"), peak_of(ops, 0).0);
}

const COMMANDS: [&str; 5] = ["report", "summary", "peak", "leaks", "oom"];

#[test]
fn report_commands_refuse_a_file_that_is_not_a_log() {
    let dir = scratch("report-not-a-log");
    let file = dir.join("notes.txt");
    std::fs::write(&file, "just some text\nnothing else\n").unwrap();
    let good = &peak_workload().log;
    for command in COMMANDS {
        for json in [false, true] {
            for logs in [vec![&file], vec![good, &file]] {
                let mut args = vec![OsStr::new(command)];
                if json {
                    args.push(OsStr::new("--json"));
                }
                args.extend(logs.iter().map(|p| p.as_os_str()));
                let (code, stdout, stderr) = vramshim(&args);
                assert_eq!(code, Some(2), "{args:?}");
                assert_eq!(stdout, "", "{args:?}");
                assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
                assert!(
                    stderr.starts_with(&format!("vramshim: {}: ", file.display())),
                    "{stderr}"
                );
                assert!(stderr.contains("not a vramshim log"), "{stderr}");
            }
        }
    }
}

#[test]
fn report_commands_name_a_missing_file() {
    let dir = scratch("report-missing");
    let missing = dir.join("nothing-here.vlog");
    for command in COMMANDS {
        let (code, stdout, stderr) = vramshim(&[
            OsStr::new(command),
            OsStr::new("--json"),
            missing.as_os_str(),
        ]);
        assert_eq!(code, Some(2), "{command}");
        assert_eq!(stdout, "", "{command}");
        assert_eq!(stderr.lines().count(), 1, "{command}: {stderr}");
        assert!(
            stderr.starts_with(&format!("vramshim: cannot open {}: ", missing.display())),
            "{command}: {stderr}"
        );
    }
}
