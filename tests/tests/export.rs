//! `vramshim export --pytorch-snapshot` on logs written by real programs under the real
//! preload: the snapshot must hold exactly what the programs did (addresses, sizes and streams
//! from their own output, times and free memory from `vramshim dump --json`, frames at source
//! lines found from markers), in the structure PyTorch's memory viewer reads. The viewer's
//! own checks are modelled here (`viewer_accepts`): what it parses, pairs and draws, and what
//! would make it throw.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;
const K: u64 = 4096;
/// Where addresses of objects without one (cuMemCreate) start in the snapshot.
const SYNTHETIC_BASE: u64 = 1 << 52;

// ---------------------------------------------------------------------------------------
// Helpers

/// Runs `report_export [ROUNDS]` under the shim on a 1 GiB fake device.
fn run_program(test: &str, rounds: u32) -> Run {
    let rounds = rounds.to_string();
    let run = run_under_shim(test, "report_export", &[&rounds], &[("FAKECUDA_MEM", "1G")]);
    assert!(
        run.output.status.success(),
        "report_export failed: {}",
        run.stderr()
    );
    run
}

/// `vramshim export LOGS --pytorch-snapshot -o OUT ARGS`: exit code and stderr.
fn export(logs: &[&Path], out: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut all: Vec<&OsStr> = vec![OsStr::new("export")];
    all.extend(logs.iter().map(|l| l.as_os_str()));
    all.extend([
        OsStr::new("--pytorch-snapshot"),
        OsStr::new("-o"),
        out.as_os_str(),
    ]);
    all.extend(args.iter().map(OsStr::new));
    let (code, _, stderr) = vramshim(&all);
    (code, stderr)
}

/// Exports and parses the JSON snapshot; the export must succeed and the viewer accept it.
fn snapshot(log: &Path, dir: &Path, name: &str, args: &[&str]) -> (Value, String) {
    let out = dir.join(name);
    let (code, stderr) = export(&[log], &out, args);
    assert_eq!(code, Some(0), "export failed: {stderr}");
    let text = std::fs::read_to_string(&out).expect("snapshot written");
    let value: Value = serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("snapshot is not JSON: {err}\n{text}"));
    viewer_accepts(&value);
    (value, stderr)
}

/// One trace entry as the test expects it (frames checked apart).
fn entry(action: &str, addr: u64, size: u64, stream: u64, time_us: u64) -> Value {
    json!({"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time_us})
}

/// The entries of a device trace without their frames.
fn without_frames(trace: &Value) -> Vec<Value> {
    arr(trace)
        .iter()
        .map(|e| {
            let mut e = e.clone();
            if let Some(map) = e.as_object_mut() {
                map.remove("frames");
            }
            e
        })
        .collect()
}

/// The first frame in `frames` from `file_suffix`: (name, line).
fn frame_in(frames: &Value, file_suffix: &str) -> (String, u64) {
    let frame = arr(frames)
        .iter()
        .find(|f| {
            f["filename"]
                .as_str()
                .is_some_and(|n| n.ends_with(file_suffix))
        })
        .unwrap_or_else(|| panic!("no frame from {file_suffix} in {frames}"));
    (
        frame["name"].as_str().unwrap_or_default().to_owned(),
        u64_of(frame, "line"),
    )
}

// ---------------------------------------------------------------------------------------
// What PyTorch's memory viewer does with a snapshot (torch/utils/viz/MemoryViz.js and
// process_alloc_data.js), reduced to what can fail.

const ACTIONS: [&str; 9] = [
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
];

fn check_frames(frames: &Value) {
    for frame in arr(frames) {
        assert!(frame["filename"].is_string(), "{frame}");
        assert!(frame["line"].is_u64(), "{frame}");
        assert!(frame["name"].is_string(), "{frame}");
    }
}

/// Every check below mirrors a step of the viewer; a failure names what would break.
fn viewer_accepts(snapshot: &Value) {
    let traces = arr(&snapshot["device_traces"]);
    let segments = arr(&snapshot["segments"]);
    assert!(snapshot["allocator_settings"].is_object());
    let truncated = snapshot["allocator_settings"]["trace_alloc_overflowed"] == true;

    // Fields: every entry and segment has what the viewer reads, of the right type.
    for trace in traces {
        for e in arr(trace) {
            let action = e["action"].as_str().expect("action is a string");
            assert!(ACTIONS.contains(&action), "{e}");
            for field in ["size", "stream", "time_us"] {
                assert!(e[field].is_u64(), "{field} in {e}");
            }
            if action == "oom" {
                // formatSize(event.device_free) throws on a missing number.
                assert!(e["device_free"].is_u64(), "{e}");
                assert!(e.get("addr").is_none(), "{e}");
            } else {
                assert!(e["addr"].is_u64(), "{e}");
                assert!(
                    u64_of(e, "addr") < 1 << 53,
                    "addresses must be exact in JS: {e}"
                );
            }
            check_frames(&e["frames"]);
        }
    }
    for s in segments {
        for field in [
            "device",
            "address",
            "total_size",
            "allocated_size",
            "active_size",
            "requested_size",
            "stream",
        ] {
            assert!(s[field].is_u64(), "{field} in {s}");
        }
        assert!(["large", "small"].contains(&s["segment_type"].as_str().unwrap_or("")));
        check_frames(&s["frames"]);
        // annotate_snapshot numbers blocks from the segment's address by their sizes.
        let mut addr = u64_of(s, "address");
        for b in arr(&s["blocks"]) {
            assert_eq!(u64_of(b, "address"), addr, "{s}");
            assert!(b["requested_size"].is_u64() && b["size"].is_u64(), "{b}");
            assert!(
                ["active_allocated", "active_pending_free", "inactive"]
                    .contains(&b["state"].as_str().unwrap_or(""))
            );
            check_frames(&b["frames"]);
            addr += u64_of(b, "size");
        }
        assert_eq!(addr, u64_of(s, "address") + u64_of(s, "total_size"), "{s}");
        assert!((u64_of(s, "device") as usize) < traces.len().max(1), "{s}");
    }

    for (device, trace) in traces.iter().enumerate() {
        let device = device as u64;
        let trace = arr(trace);
        let on_device: Vec<&Value> = segments
            .iter()
            .filter(|s| u64_of(s, "device") == device)
            .collect();
        // annotate_snapshot merges free_requested + free_completed of one address into
        // `free`; a free_requested left alone would mark a block the viewer never finds.
        let mut events: Vec<(String, &Value)> = Vec::new();
        for e in trace {
            let action = e["action"].as_str().unwrap_or_default().to_owned();
            if action == "free_completed"
                && let Some((last, prev)) = events.last_mut()
                && last == "free_requested"
                && prev["addr"] == e["addr"]
            {
                *last = "free".to_owned();
                continue;
            }
            events.push((action, e));
        }
        assert!(
            events.iter().all(|(a, _)| a != "free_requested"),
            "device {device}: a free_requested without its free_completed"
        );

        // Active Memory Timeline and Active Cached Segment Timeline (process_alloc_data):
        // allocations paired with their frees by address; what is open at the end must be
        // what `segments` lists (else the plot shows it twice or not at all). A free whose
        // allocation is not in the trace only happens when the trace was cut.
        for (alloc, frees) in [
            ("alloc", ["free", "free_completed"]),
            ("segment_alloc", ["segment_free", "segment_free"]),
        ] {
            let mut open: BTreeMap<u64, u64> = BTreeMap::new();
            for (action, e) in &events {
                if action == alloc {
                    assert!(
                        open.insert(u64_of(e, "addr"), u64_of(e, "size")).is_none(),
                        "device {device}: {alloc} of a live address: {e}"
                    );
                } else if frees.contains(&action.as_str()) {
                    let found = open.remove(&u64_of(e, "addr"));
                    assert!(
                        found.is_some() || truncated,
                        "device {device}: {action} without its {alloc}: {e}"
                    );
                    if let Some(size) = found {
                        assert_eq!(size, u64_of(e, "size"), "{e}");
                    }
                }
            }
            let at_end: BTreeMap<u64, u64> = on_device
                .iter()
                .flat_map(|s| arr(&s["blocks"]))
                .map(|b| (u64_of(b, "address"), u64_of(b, "requested_size")))
                .collect();
            // Open at the end, and in the trace: must be live in `segments`.
            for (addr, size) in &open {
                assert_eq!(
                    at_end.get(addr),
                    Some(size),
                    "device {device}: {alloc} at {addr:#x} open at the end but not a live block"
                );
            }
            if !truncated {
                assert_eq!(
                    open, at_end,
                    "device {device}: live set differs from the trace"
                );
            }
        }

        // Allocator State History (MemoryView.simulate_memory): from `segments`, undo the
        // events from the end back to each one; every block must lie in a segment then
        // (find_segment returning null throws), and a segment_alloc must undo an existing one.
        let mut live_segments: BTreeMap<u64, u64> = on_device
            .iter()
            .map(|s| (u64_of(s, "address"), u64_of(s, "total_size")))
            .collect();
        let mut blocks: BTreeMap<u64, u64> = on_device
            .iter()
            .flat_map(|s| arr(&s["blocks"]))
            .filter(|b| b["state"] != "inactive")
            .map(|b| (u64_of(b, "address"), u64_of(b, "size")))
            .collect();
        let inside = |segments: &BTreeMap<u64, u64>, addr: u64| {
            segments
                .range(..=addr)
                .next_back()
                .is_some_and(|(start, size)| addr < start + size)
        };
        for (index, (action, e)) in events.iter().enumerate().rev() {
            for addr in blocks.keys() {
                assert!(
                    inside(&live_segments, *addr),
                    "device {device}, event {index}: block {addr:#x} outside every segment"
                );
            }
            let addr = e["addr"].as_u64().unwrap_or(0);
            match action.as_str() {
                "free" | "free_completed" => {
                    blocks.insert(addr, u64_of(e, "size"));
                }
                "alloc" => {
                    blocks.remove(&addr);
                }
                "segment_free" => {
                    live_segments.insert(addr, u64_of(e, "size"));
                }
                "segment_alloc" => {
                    assert!(
                        live_segments.remove(&addr).is_some(),
                        "device {device}: segment_alloc of a segment the viewer does not have: {e}"
                    );
                }
                "oom" => {}
                other => panic!("the export never writes {other}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// A pickle reader that knows exactly the opcodes of the viewer's own unpickler (MemoryViz.js
// `unpickle`), and nothing else: a pickle it reads, the viewer reads.

fn unpickle(bytes: &[u8]) -> Value {
    enum Item {
        Mark,
        Value(Value),
    }
    let mut stack: Vec<Item> = Vec::new();
    let mut memo: BTreeMap<u32, Value> = BTreeMap::new();
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> &[u8] {
        let slice = &bytes[*at..*at + n];
        *at += n;
        slice
    };
    let u32_at = |at: &mut usize| u32::from_le_bytes(take(at, 4).try_into().expect("4 bytes"));
    let since_mark = |stack: &mut Vec<Item>| -> Vec<Value> {
        let mark = stack
            .iter()
            .rposition(|i| matches!(i, Item::Mark))
            .expect("MARK");
        let items = stack
            .split_off(mark + 1)
            .into_iter()
            .map(|i| match i {
                Item::Value(v) => v,
                Item::Mark => panic!("nested MARK"),
            })
            .collect();
        stack.pop();
        items
    };
    let top = |stack: &mut Vec<Item>| -> Value {
        match stack.last() {
            Some(Item::Value(v)) => v.clone(),
            _ => panic!("memo of a mark"),
        }
    };
    loop {
        let opcode = take(&mut at, 1)[0];
        match opcode {
            0x80 => {
                let version = take(&mut at, 1)[0];
                assert!((2..=4).contains(&version), "protocol {version}");
            }
            b'}' => stack.push(Item::Value(json!({}))),
            b']' => stack.push(Item::Value(json!([]))),
            b'(' => stack.push(Item::Mark),
            b'u' => {
                let items = since_mark(&mut stack);
                let Some(Item::Value(Value::Object(dict))) = stack.last_mut() else {
                    panic!("SETITEMS without a dict");
                };
                for pair in items.chunks(2) {
                    let key = pair[0].as_str().expect("string keys").to_owned();
                    dict.insert(key, pair[1].clone());
                }
            }
            b'e' => {
                let items = since_mark(&mut stack);
                assert!(items.len() <= 1000, "a batch of {} items", items.len());
                let Some(Item::Value(Value::Array(list))) = stack.last_mut() else {
                    panic!("APPENDS without a list");
                };
                list.extend(items);
            }
            b'K' => stack.push(Item::Value(json!(take(&mut at, 1)[0]))),
            b'M' => {
                let v = u16::from_le_bytes(take(&mut at, 2).try_into().expect("2 bytes"));
                stack.push(Item::Value(json!(v)));
            }
            b'J' => {
                let v = i32::from_le_bytes(take(&mut at, 4).try_into().expect("4 bytes"));
                stack.push(Item::Value(json!(v)));
            }
            0x8a => {
                let n = take(&mut at, 1)[0] as usize;
                let raw = take(&mut at, n);
                assert!(
                    n <= 8,
                    "the viewer reads LONG1 of more than 8 bytes as a BigInt"
                );
                let mut buffer = [if raw[n - 1] >= 0x80 { 0xff } else { 0 }; 8];
                buffer[..n].copy_from_slice(raw);
                stack.push(Item::Value(json!(i64::from_le_bytes(buffer))));
            }
            b'X' => {
                let n = u32_at(&mut at) as usize;
                let text = std::str::from_utf8(take(&mut at, n)).expect("UTF-8");
                stack.push(Item::Value(json!(text)));
            }
            0x88 => stack.push(Item::Value(json!(true))),
            0x89 => stack.push(Item::Value(json!(false))),
            // TUPLE2: the viewer makes a list of the top two values.
            0x86 => {
                let second = stack.pop();
                let first = stack.pop();
                let (Some(Item::Value(first)), Some(Item::Value(second))) = (first, second) else {
                    panic!("TUPLE2 over a mark");
                };
                stack.push(Item::Value(json!([first, second])));
            }
            b'N' => stack.push(Item::Value(Value::Null)),
            b'q' => {
                let id = u32::from(take(&mut at, 1)[0]);
                memo.insert(id, top(&mut stack));
            }
            b'r' => {
                let id = u32_at(&mut at);
                memo.insert(id, top(&mut stack));
            }
            b'h' => {
                let id = u32::from(take(&mut at, 1)[0]);
                stack.push(Item::Value(memo[&id].clone()));
            }
            b'j' => {
                let id = u32_at(&mut at);
                stack.push(Item::Value(memo[&id].clone()));
            }
            b'.' => break,
            other => panic!(
                "opcode {other:#x} ({:?}) unknown to the viewer",
                other as char
            ),
        }
    }
    assert_eq!(at, bytes.len(), "bytes after STOP");
    assert_eq!(stack.len(), 1, "one value left");
    match stack.pop() {
        Some(Item::Value(v)) => v,
        _ => panic!("no value"),
    }
}

// ---------------------------------------------------------------------------------------
// Tests

#[test]
fn snapshot_holds_every_device_allocation_free_and_failure_exactly() {
    let run = run_program("export-exact", 3);
    let log = run.log();
    let src = source("report_export");
    let ops = program_ops(&run.stdout());
    let dump = dump(&log);
    let events = events(&dump);
    // Entry times are wall-clock microseconds: the log's start plus the event's offset.
    let start_unix_ns = u64_of(&dump[0], "start_unix_ns");
    assert!(start_unix_ns > 1_600_000_000 * 1_000_000_000, "{}", dump[0]);

    let (snap, stderr) = snapshot(&log, &run.dir, "snap.json", &[]);
    assert!(
        stderr.contains("1 pinned host allocation(s) left out"),
        "{stderr}"
    );
    assert!(stderr.contains("wrote"), "{stderr}");
    let traces = arr(&snap["device_traces"]);
    assert_eq!(traces.len(), 2, "one list per device, devices 0 and 1");

    // The expected trace of each device, from the program's own output (addresses, sizes,
    // streams, handles) and the dump (times, free memory), in order.
    let mut expected: BTreeMap<i64, Vec<Value>> = BTreeMap::new();
    let mut lines: BTreeMap<i64, Vec<(String, u64)>> = BTreeMap::new();
    let mut live: BTreeMap<u64, (u64, u64, String)> = BTreeMap::new(); // addr -> size, stream, fn
    let device_events: Vec<&&Value> = events.iter().filter(|e| i64_of(e, "device") >= 0).collect();
    let device_ops: Vec<&ProgramOp> = ops
        .iter()
        .filter(|op| op.fields.contains_key("dev"))
        .collect();
    assert_eq!(device_events.len(), device_ops.len(), "{device_events:#?}");
    for (op, event) in device_ops.iter().zip(&device_events) {
        assert_eq!(op.api, event["api"], "{op:?} / {event}");
        let device = op.int("dev");
        let time_us = (start_unix_ns + u64_of(event, "t_ns")) / 1000;
        let function = op.fields["fn"].clone();
        let list = expected.entry(device).or_default();
        let at = lines.entry(device).or_default();
        if op.op == "alloc" && op.int("rc") != 0 {
            let free = u64_of(event, "mem_free");
            list.push(
                json!({"action": "oom", "device_free": free, "size": op.num("size"),
                "stream": 0, "time_us": time_us}),
            );
            at.push((
                function.clone(),
                marker_line(&src, &format!("EXPORT: {function}")),
            ));
        } else if op.op == "alloc" {
            let addr = match op.fields.get("handle") {
                Some(_) => SYNTHETIC_BASE | op.num("handle"),
                None => op.num("addr"),
            };
            let stream = op.fields.get("stream").map_or(0, |_| op.num("stream"));
            assert_eq!(stream, u64_of(event, "stream"));
            let size = op.num("size");
            for action in ["segment_alloc", "alloc"] {
                list.push(entry(action, addr, size, stream, time_us));
                at.push((
                    function.clone(),
                    marker_line(&src, &format!("EXPORT: {function}")),
                ));
            }
            live.insert(addr, (size, stream, function));
        } else {
            let addr = op.num("addr");
            let (size, stream, function) = live.remove(&addr).expect("freed what it allocated");
            for action in ["free_requested", "free_completed", "segment_free"] {
                list.push(entry(action, addr, size, stream, time_us));
                // A free shows the allocating call's frames.
                at.push((
                    function.clone(),
                    marker_line(&src, &format!("EXPORT: {function}")),
                ));
            }
        }
    }
    assert_eq!(
        expected[&0].len(),
        2 + 5 + 3 * 5 + 2 + 1,
        "{:#?}",
        expected[&0]
    );
    assert_eq!(expected[&1].len(), 2);
    for (device, want) in &expected {
        let trace = &traces[*device as usize];
        assert_eq!(without_frames(trace), *want, "device {device}");
        let got_lines: Vec<(String, u64)> = arr(trace)
            .iter()
            .map(|e| frame_in(&e["frames"], "/report_export.c"))
            .collect();
        assert_eq!(got_lines, lines[device], "device {device}");
        // Innermost first: the allocating function is the first frame (the recorder's own
        // frames are gone).
        for e in arr(trace) {
            assert!(
                e["frames"][0]["filename"]
                    .as_str()
                    .is_some_and(|f| f.ends_with("/report_export.c"))
            );
        }
    }
    // The failure: the free memory the driver reported right after it.
    let oom = arr(&traces[0]).last().expect("entries");
    let failed = events
        .iter()
        .find(|e| e["event"] == "alloc_failed")
        .expect("failed event");
    assert_eq!(oom["device_free"], failed["mem_free"]);
    assert_eq!(oom["size"], 2048 * MIB);

    // Segments: exactly what was live at exit on the devices, by (device, address).
    let segments = arr(&snap["segments"]);
    let weights = ops
        .iter()
        .find(|op| op.fields.get("fn").is_some_and(|f| f == "weights"))
        .expect("weights");
    let remote = ops
        .iter()
        .find(|op| op.fields.get("fn").is_some_and(|f| f == "remote"))
        .expect("remote");
    let physical = ops
        .iter()
        .find(|op| op.fields.get("fn").is_some_and(|f| f == "physical"))
        .expect("physical");
    let want = [
        (0, weights.num("addr"), 64 * MIB, "large", "weights"),
        (
            0,
            SYNTHETIC_BASE | physical.num("handle"),
            2 * MIB,
            "large",
            "physical",
        ),
        (1, remote.num("addr"), 4 * MIB, "large", "remote"),
    ];
    assert_eq!(segments.len(), want.len(), "{segments:#?}");
    for (segment, (device, addr, size, kind, function)) in segments.iter().zip(want) {
        let line = marker_line(&src, &format!("EXPORT: {function}"));
        let frames = &segment["frames"];
        assert_eq!(
            frame_in(frames, "/report_export.c"),
            (function.to_owned(), line)
        );
        assert_eq!(
            *segment,
            json!({
                "device": device, "address": addr, "total_size": size, "allocated_size": size,
                "active_size": size, "requested_size": size, "stream": 0, "segment_type": kind,
                "segment_pool_id": [0, 0], "is_expandable": false, "frames": frames,
                "blocks": [{"address": addr, "size": size, "requested_size": size,
                    "state": "active_allocated", "frames": frames}],
            })
        );
    }
    let settings = &snap["allocator_settings"];
    assert_eq!(settings["trace_alloc_overflowed"], false);
    assert_eq!(settings["trace_alloc_max_entries"], 500_000);
    assert!(
        settings["recorded_by"]
            .as_str()
            .is_some_and(|s| s.starts_with("vramshim "))
    );
}

#[test]
fn max_events_keeps_exactly_the_last_entries_of_each_device() {
    let run = run_program("export-ring", 50);
    let log = run.log();
    let (full, stderr) = snapshot(&log, &run.dir, "full.json", &["--max-events", "0"]);
    assert!(!stderr.contains("left out (--max-events)"), "{stderr}");
    let full0 = arr(&full["device_traces"][0]).clone();
    assert_eq!(full0.len(), 2 + 5 + 50 * 5 + 2 + 1);
    assert!(
        full["allocator_settings"]
            .get("trace_alloc_max_entries")
            .is_none()
    );

    // The default keeps them all too (well under the limit).
    let (default, _) = snapshot(&log, &run.dir, "default.json", &[]);
    assert_eq!(default["device_traces"], full["device_traces"]);

    for keep in [7usize, 1, 259] {
        let name = format!("last{keep}.json");
        let (cut, stderr) = snapshot(&log, &run.dir, &name, &["--max-events", &keep.to_string()]);
        let trace0 = arr(&cut["device_traces"][0]);
        assert_eq!(
            *trace0,
            full0[full0.len() - keep..].to_vec(),
            "--max-events {keep}"
        );
        // Device 1 has 2 entries: its own last `keep`.
        let full1 = arr(&full["device_traces"][1]);
        assert_eq!(full1.len(), 2);
        let kept1 = &full1[full1.len() - keep.min(2)..];
        assert_eq!(
            *arr(&cut["device_traces"][1]),
            kept1.to_vec(),
            "--max-events {keep}"
        );
        assert_eq!(cut["segments"], full["segments"]);
        assert!(
            stderr.contains(&format!(
                "device 0: kept the last {keep} of {} trace entries; the {} older ones are left out",
                full0.len(),
                full0.len() - keep
            )),
            "{stderr}"
        );
        assert_eq!(
            stderr.contains("device 1: kept the last 1 of 2"),
            keep == 1,
            "{stderr}"
        );
        assert_eq!(cut["allocator_settings"]["trace_alloc_overflowed"], true);
        assert_eq!(cut["allocator_settings"]["trace_alloc_max_entries"], keep);
    }
}

#[test]
fn device_option_exports_one_device_and_pickle_holds_the_same_document() {
    let run = run_program("export-device", 3);
    let log = run.log();
    let (all, _) = snapshot(&log, &run.dir, "all.json", &[]);

    let (one, stderr) = snapshot(&log, &run.dir, "one.json", &["--device", "1"]);
    assert!(!stderr.contains("pinned host"), "{stderr}");
    assert_eq!(one["device_traces"], json!([[], all["device_traces"][1]]));
    let segments: Vec<&Value> = arr(&all["segments"])
        .iter()
        .filter(|s| s["device"] == 1)
        .collect();
    assert_eq!(arr(&one["segments"]).iter().collect::<Vec<_>>(), segments);

    // A device with nothing: an empty list for it, and a note.
    let (none, stderr) = snapshot(&log, &run.dir, "none.json", &["--device", "3"]);
    assert_eq!(none["device_traces"], json!([[], [], [], []]));
    assert_eq!(none["segments"], json!([]));
    assert!(stderr.contains("nothing recorded on device 3"), "{stderr}");

    // The pickle: protocol 2, only opcodes the viewer's unpickler knows, the same document.
    let pickle = run.dir.join("snap.pickle");
    let (code, stderr) = export(&[&log], &pickle, &["--pickle"]);
    assert_eq!(code, Some(0), "{stderr}");
    let bytes = std::fs::read(&pickle).expect("pickle written");
    assert_eq!(&bytes[..2], &[0x80, 2]);
    assert_eq!(unpickle(&bytes), all);
    // And Python's own pickle module reads it as the JSON document, with each
    // segment_pool_id a tuple, as torch writes it.
    let check = "import json, pickle, sys\n\
                 a = pickle.load(open(sys.argv[1], 'rb'))\n\
                 b = json.load(open(sys.argv[2]))\n\
                 pools = [s['segment_pool_id'] for s in a['segments']]\n\
                 assert pools and all(p == (0, 0) for p in pools), pools\n\
                 print('same' if json.loads(json.dumps(a)) == b else 'different')";
    let output = Command::new(machine_python())
        .args(["-c", check])
        .arg(&pickle)
        .arg(run.dir.join("all.json"))
        .output()
        .expect("run python3");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "same",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The default file name, in the working directory.
    let status = Command::new(vramshim_tool())
        .current_dir(&run.dir)
        .args([
            OsStr::new("export"),
            log.as_os_str(),
            OsStr::new("--pytorch-snapshot"),
        ])
        .output()
        .expect("run vramshim");
    assert!(status.status.success());
    let default: Value = serde_json::from_slice(
        &std::fs::read(run.dir.join("vramshim-snapshot.json")).expect("default name"),
    )
    .expect("JSON");
    assert_eq!(default, all);
}

#[test]
fn flight_recorder_dumps_give_one_history_without_repeats() {
    // Two dumps (at the failure, at exit) with 16-event windows: the second repeats part of
    // the first's and misses what happened between the windows (weights freed, `late`
    // allocated and listed live).
    let args = ["10", "tail"];
    let ring = run_under_shim(
        "export-ring-mode",
        "report_export",
        &args,
        &[
            ("FAKECUDA_MEM", "1G"),
            ("VRAMSHIM_MODE", "ring"),
            ("VRAMSHIM_RING_EVENTS", "16"),
        ],
    );
    assert!(ring.output.status.success(), "{}", ring.stderr());
    let stream = run_under_shim(
        "export-stream-mode",
        "report_export",
        &args,
        &[("FAKECUDA_MEM", "1G")],
    );
    assert!(stream.output.status.success(), "{}", stream.stderr());
    let ring_dump = dump(&ring.log());
    let dumps: Vec<&Value> = ring_dump
        .iter()
        .filter(|r| r["type"] == "dump_begin")
        .collect();
    assert_eq!(dumps.len(), 2, "{dumps:#?}");
    assert!(
        dumps.iter().all(|d| u64_of(d, "events_discarded") > 0),
        "{dumps:#?}"
    );

    let (from_ring, stderr) = snapshot(&ring.log(), &ring.dir, "ring.json", &[]);
    assert!(stderr.contains("1 pinned host allocation(s)"), "{stderr}");
    let (from_stream, _) = snapshot(&stream.log(), &stream.dir, "stream.json", &[]);
    // The same program, the same fake addresses: the same allocations live at exit.
    assert_eq!(from_ring["segments"], from_stream["segments"]);
    let key = |e: &Value| (e["action"].clone(), e["addr"].clone(), e["size"].clone());
    let ops = program_ops(&ring.stdout());
    let weights = ops
        .iter()
        .find(|op| op.op == "alloc" && op.fields["fn"] == "weights")
        .expect("weights")
        .num("addr");
    let late = ops
        .iter()
        .find(|op| op.fields["fn"] == "late")
        .expect("late")
        .num("addr");
    for device in 0..2 {
        let ring_trace = arr(&from_ring["device_traces"][device]);
        let stream_trace = arr(&from_stream["device_traces"][device]);
        // What the windows held, in order, each once; time never goes back.
        let mut rest = stream_trace.iter().map(key);
        for e in ring_trace {
            assert!(
                rest.any(|k| k == key(e)),
                "device {device}: {e} out of order or repeated"
            );
        }
        let times: Vec<u64> = ring_trace.iter().map(|e| u64_of(e, "time_us")).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    }
    let trace0 = arr(&from_ring["device_traces"][0]);
    let has = |action: &str, addr: u64| {
        trace0
            .iter()
            .any(|e| e["action"] == action && e["addr"] == addr)
    };
    assert!(
        has("free_completed", weights),
        "the free between the windows"
    );
    assert!(has("alloc", late), "the allocation between the windows");
    assert!(trace0.len() < arr(&from_stream["device_traces"][0]).len());
}

#[test]
fn flight_recorder_dumps_at_a_coarse_resolution_say_their_overlap_is_found_by_time() {
    // The same two overlapping dumps as above, their times at 10 ms: where the second
    // dump's window goes past the first is found by time, so the export says it may be off.
    let args = ["10", "tail"];
    let env = |resolution| {
        [
            ("FAKECUDA_MEM", "1G"),
            ("VRAMSHIM_MODE", "ring"),
            ("VRAMSHIM_RING_EVENTS", "16"),
            ("VRAMSHIM_TIME_RESOLUTION", resolution),
        ]
    };
    let coarse = run_under_shim("export-ring-10ms", "report_export", &args, &env("10ms"));
    assert!(coarse.output.status.success(), "{}", coarse.stderr());
    let exact = run_under_shim("export-ring-1ns", "report_export", &args, &env("1ns"));
    assert!(exact.output.status.success(), "{}", exact.stderr());
    let note = format!(
        "vramshim: note: {}: its 2 ring-mode dumps overlap, and the overlap is found by time, \
         recorded at 10 ms resolution: events within one step of an earlier dump's last event \
         may be missing from the history or in it twice (record with \
         VRAMSHIM_TIME_RESOLUTION=1ns for an exact one)",
        coarse.log().display()
    );
    let (code, stderr) = export(&[&coarse.log()], &coarse.dir.join("ring.json"), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stderr.lines().filter(|line| *line == note).count(),
        1,
        "{stderr}"
    );
    let (code, stderr) = export(&[&exact.log()], &exact.dir.join("ring.json"), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("ring-mode dumps overlap"), "{stderr}");
}

#[test]
fn demo_snapshot_shows_the_leaks_and_the_failure() {
    let run = run_under_shim("export-demo", "demo", &[], &[("FAKECUDA_MEM", "2G")]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let log = run.log();
    let (snap, _) = snapshot(&log, &run.dir, "demo.json", &[]);
    let dump = dump(&log);
    let failed = events(&dump)
        .into_iter()
        .find(|e| e["event"] == "alloc_failed")
        .expect("the demo fails an allocation");
    let trace = arr(&snap["device_traces"][0]);
    let ooms: Vec<&Value> = trace.iter().filter(|e| e["action"] == "oom").collect();
    assert_eq!(ooms.len(), 1);
    assert_eq!(ooms[0]["size"], 1200 * MIB);
    assert_eq!(ooms[0]["device_free"], failed["mem_free"]);
    // 4 weights + 5 x (3 activations + 1 grad cache), each 2 entries, 4 + 15 frees of 3.
    assert_eq!(trace.len(), (4 + 5 * 4) * 2 + (4 + 15) * 3 + 1);
    // The five leaked grad caches are what is live at exit.
    let segments = arr(&snap["segments"]);
    assert_eq!(segments.len(), 5);
    for s in segments {
        assert_eq!(s["total_size"], 16 * MIB);
        assert_eq!(frame_in(&s["frames"], "/demo.c").0, "dalloc");
    }
}

#[test]
fn python_frames_name_the_script_line_and_function() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/alloc_stacks.py");
    let dir = scratch("export-python");
    let output = shim_command(&machine_python(), &dir)
        .arg(&script)
        .output()
        .expect("run python");
    assert!(output.status.success(), "{output:?}");
    let run = Run { output, dir };
    let log = run.log();
    let text = std::fs::read_to_string(&script).expect("script");
    let line = |marker: &str| {
        text.lines()
            .position(|l| l.trim_end().ends_with(&format!("# {marker}")))
            .map(|i| i as u64 + 1)
            .expect("marker")
    };
    let script_name = script.to_string_lossy().into_owned();
    for view in ["mixed", "python"] {
        let (snap, _) = snapshot(&log, &run.dir, &format!("{view}.json"), &["--stacks", view]);
        let alloc = arr(&snap["device_traces"][0])
            .iter()
            .find(|e| e["action"] == "alloc" && e["size"] == 2 * K)
            .expect("the method's allocation");
        let frames = arr(&alloc["frames"]);
        let python: Vec<&Value> = frames
            .iter()
            .filter(|f| f["filename"] == script_name.as_str())
            .collect();
        assert_eq!(python.len(), 2, "{view}: {frames:#?}");
        assert!(
            ["Model.forward", "forward"].contains(&python[0]["name"].as_str().unwrap_or("")),
            "{}",
            python[0]
        );
        assert_eq!(python[0]["line"], line("site: method"));
        assert_eq!(python[1]["name"], "<module>");
        assert_eq!(python[1]["line"], line("call: method"));
        if view == "python" {
            assert_eq!(frames[0], *python[0], "python frames only: innermost first");
        } else {
            assert_eq!(
                frames[0]["name"], "cudaMalloc",
                "the fake runtime's frame is innermost"
            );
        }
    }
}

#[test]
fn bad_input_exits_2_and_unwritable_output_exits_1_leaving_no_file() {
    let run = run_program("export-errors", 1);
    let log = run.log();
    let out = run.dir.join("out.json");

    let (code, stderr) = export(&[&run.dir.join("missing.vlog")], &out, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    let not_a_log = run.dir.join("text.vlog");
    std::fs::write(&not_a_log, "hello\n").expect("write");
    let (code, stderr) = export(&[&not_a_log], &out, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    let (code, stderr) = export(&[&log], &out, &["--device", "-1"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("device memory only"), "{stderr}");
    // The same process twice: one device ordinal, two processes.
    let (code, stderr) = export(&[&log, &log], &out, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("device 0 is used by 2 processes"),
        "{stderr}"
    );
    // Without the format flag.
    let (code, _, stderr) = vramshim(&[OsStr::new("export"), log.as_os_str()]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(!out.exists());

    let (code, stderr) = export(&[&log], &run.dir.join("no/such/dir/out.json"), &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot write"), "{stderr}");
    let (code, stderr) = export(&[&log], &run.dir, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("is a directory"), "{stderr}");

    // Nothing half-written is left: only the program's log and the text file.
    let left: BTreeSet<PathBuf> = std::fs::read_dir(&run.dir)
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(left, BTreeSet::from([log.clone(), not_a_log]));
}
