//! Every way a program reaches the driver, under the real preload: what the program did (its
//! own printed view) must be exactly what `vramshim dump --json` shows.

mod common;

use common::*;
use serde_json::Value;

/// Host-memory entry points: recorded with device -1.
const HOST_APIS: [&str; 9] = [
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cudaMallocHost",
    "cudaHostAlloc",
    "cudaFreeHost",
    "cudaFreeHost",
];

/// The recorded view of one program operation: (event, api, device, addr, handle, size).
type Expected = (String, String, i64, u64, u64, u64);

/// Translates the program's operation lines into the events the recorder must have written.
/// Frees are recorded without a size (the report knows it from the allocation).
fn expected_events(ops: &[ProgramOp], recorded_apis: &[&str]) -> Vec<Expected> {
    ops.iter()
        .filter(|op| recorded_apis.contains(&op.api.as_str()))
        .map(|op| {
            let failed = op.int("rc") != 0;
            let event = match op.op.as_str() {
                "alloc" | "register" if failed => "alloc_failed",
                "alloc" | "register" => "alloc",
                "free" | "unregister" => "free",
                other => other,
            };
            let device = if HOST_APIS.contains(&op.api.as_str()) {
                -1
            } else {
                op.int("dev")
            };
            let addr = if failed {
                0
            } else {
                op.fields.get("addr").map_or(0, |_| op.num("addr"))
            };
            let handle = op.fields.get("handle").map_or(0, |_| op.num("handle"));
            let size = if event == "free" { 0 } else { op.num("size") };
            (event.to_owned(), op.api.clone(), device, addr, handle, size)
        })
        .collect()
}

fn recorded(events: &[&Value]) -> Vec<Expected> {
    events
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or_default().to_owned(),
                e["api"].as_str().unwrap_or_default().to_owned(),
                i64_of(e, "device"),
                u64_of(e, "addr"),
                u64_of(e, "handle"),
                u64_of(e, "size"),
            )
        })
        .collect()
}

#[test]
fn direct_link_records_every_driver_call_once() {
    let run = run_under_shim("direct", "direct", &[], &[]);
    assert!(
        run.output.status.success(),
        "direct failed:\n{}{}",
        run.stdout(),
        run.stderr()
    );
    let ops = program_ops(&run.stdout());
    let hooked = [
        "cuMemAlloc_v2",
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuMemFree_v2",
        "cuMemAllocHost_v2",
        "cuMemHostAlloc",
        "cuMemFreeHost",
        "cuMemHostRegister_v2",
        "cuMemHostUnregister",
        "cuArrayCreate_v2",
        "cuArray3DCreate_v2",
        "cuArrayDestroy",
    ];
    let expected = expected_events(&ops, &hooked);
    let dump = dump(&run.log());
    let events = events(&dump);
    assert_eq!(recorded(&events), expected);
    // The exact figures, not only "same as the program said".
    assert_eq!(expected.len(), 19);
    let pitch = &select(&events, "alloc", "cuMemAllocPitch_v2")[0];
    assert_eq!(
        u64_of(pitch, "size"),
        1024 * 10,
        "pitch (1000 B rounded to 1024) x 10 rows"
    );
    let array = &select(&events, "alloc", "cuArrayCreate_v2")[0];
    assert_eq!(u64_of(array, "size"), 256 * 256 * 4 * 4);
    // The legacy 32-bit cuMemAlloc is not a 64-bit entry point and is not recorded.
    assert!(events.iter().all(|e| e["api"] != "cuMemAlloc"));
    // One thread, named; every event carries a stack whose first frame is in the program.
    let pid = u64_of(&dump[0], "pid");
    assert!(events.iter().all(|e| u64_of(e, "thread") == pid));
    assert!(
        dump.iter()
            .any(|r| r["type"] == "thread" && r["name"] == "direct")
    );
    assert!(events.iter().all(|e| u64_of(e, "stack") != 0));
    // Device memory samples at first use of each device.
    let samples: Vec<i64> = dump
        .iter()
        .filter(|r| r["type"] == "mem_info")
        .map(|r| i64_of(r, "device"))
        .collect();
    assert_eq!(samples, vec![0, 1]);
    // The one leaked allocation is the last event.
    let last = events.last().expect("events");
    assert_eq!(
        (last["event"].as_str(), u64_of(last, "size")),
        (Some("alloc"), 3 << 20)
    );
}
