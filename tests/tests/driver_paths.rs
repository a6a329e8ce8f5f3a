//! Every way a program reaches the driver, under the real preload: what the program did (its
//! own printed view) must be exactly what `vramshim dump --json` shows.

mod common;

use common::*;
use serde_json::Value;

/// Host-memory entry points: recorded with device -1.
const HOST_APIS: [&str; 8] = [
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cudaMallocHost",
    "cudaHostAlloc",
    "cudaFreeHost",
];

/// The recorded view of one program operation.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    event: String,
    api: String,
    device: i64,
    addr: u64,
    handle: u64,
    size: u64,
    stream: u64,
    result: u64,
}

/// Translates the program's operation lines into the events the recorder must have written,
/// for the entry points the log header lists as hooked.
///
/// Rules (what the recorder promises): frees and releases carry no size (the report takes it
/// from the allocation); a failed allocation is `alloc_failed` with address 0; pinned host
/// memory has device -1; VMM calls other than `cuMemCreate` carry the calling thread's current
/// device; `cudaFree(NULL)` is not an event.
fn expected_events(ops: &[ProgramOp], hooked: &[String]) -> Vec<Seen> {
    let mut current_device = 0i64;
    let mut expected = Vec::new();
    for op in ops {
        if op.op == "ctx" {
            current_device = op.int("dev");
            continue;
        }
        if !hooked.contains(&op.api) {
            continue;
        }
        let failed = op.int("rc") != 0;
        let event = match (op.op.as_str(), op.api.as_str()) {
            ("alloc", "cuMemCreate") if failed => "alloc_failed",
            ("alloc", "cuMemCreate") => "create",
            ("free", "cuMemRelease") => "release",
            ("alloc" | "register", _) if failed => "alloc_failed",
            ("alloc" | "register", _) => "alloc",
            ("free" | "unregister", _) => "free",
            ("pool_trim", _) => "trim",
            (other @ ("reserve" | "unreserve" | "map" | "unmap"), _) => other,
            _ => continue,
        };
        let field = |key: &str| op.fields.get(key).map_or(0, |_| op.num(key));
        let device = if HOST_APIS.contains(&op.api.as_str()) {
            -1
        } else if matches!(event, "reserve" | "unreserve" | "map" | "unmap" | "release") {
            current_device
        } else {
            op.int("dev")
        };
        let (addr, size) = match event {
            "alloc_failed" => (0, field("size")),
            "free" | "release" => (field("addr"), 0),
            "trim" => (0, field("keep")),
            _ => (field("addr"), field("size")),
        };
        let handle = if event == "trim" {
            field("pool")
        } else {
            field("handle")
        };
        let pool = if matches!(event, "alloc" | "alloc_failed") {
            field("pool")
        } else {
            0
        };
        expected.push(Seen {
            event: event.to_owned(),
            api: op.api.clone(),
            device,
            addr,
            handle: handle.max(pool),
            size,
            stream: field("stream"),
            result: field("rc"),
        });
    }
    expected
}

fn recorded(events: &[&Value]) -> Vec<Seen> {
    events
        .iter()
        .map(|e| Seen {
            event: e["event"].as_str().unwrap_or_default().to_owned(),
            api: e["api"].as_str().unwrap_or_default().to_owned(),
            device: i64_of(e, "device"),
            addr: u64_of(e, "addr"),
            handle: u64_of(e, "handle"),
            size: u64_of(e, "size"),
            stream: u64_of(e, "stream"),
            result: u64_of(e, "result"),
        })
        .collect()
}

/// Runs `program` under the shim and checks the log against the program's own account.
/// Returns the dump and the expected events for further checks.
fn check_program(program: &str, env: &[(&str, &str)]) -> (Vec<Value>, Vec<Seen>) {
    let run = run_under_shim(program, program, &[], env);
    assert!(
        run.output.status.success(),
        "{program} failed:\n{}{}",
        run.stdout(),
        run.stderr()
    );
    assert_eq!(run.stderr(), "", "the shim printed something");
    let dump = dump(&run.log());
    let hooked: Vec<String> = dump[0]["apis"]
        .as_array()
        .expect("header lists apis")
        .iter()
        .map(|api| api.as_str().unwrap_or_default().to_owned())
        .collect();
    let expected = expected_events(&program_ops(&run.stdout()), &hooked);
    let events = events(&dump);
    let got = recorded(&events);
    for (i, (want, have)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(want, have, "{program}: event {i} differs");
    }
    assert_eq!(expected.len(), got.len(), "{program}: event counts differ");
    (dump, expected)
}

#[test]
fn direct_link_records_every_driver_call_once() {
    let (dump, expected) = check_program("direct", &[]);
    let events = events(&dump);
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
    let array3d = &select(&events, "alloc", "cuArray3DCreate_v2")[0];
    assert_eq!(u64_of(array3d, "size"), 128 * 64 * 8 * 2 * 2);
    // The legacy 32-bit cuMemAlloc is not a 64-bit entry point and is not recorded.
    assert!(events.iter().all(|e| e["api"] != "cuMemAlloc"));
    // One thread, named; every allocation carries a stack (releases, by default, none).
    let pid = u64_of(&dump[0], "pid");
    assert!(events.iter().all(|e| u64_of(e, "thread") == pid));
    assert!(
        dump.iter()
            .any(|r| r["type"] == "thread" && r["name"] == "direct")
    );
    assert_default_stacks(&events);
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

#[test]
fn dlopen_and_dlsym_reach_the_wrappers() {
    let (dump, expected) = check_program("dlsym", &[]);
    assert_eq!(expected.len(), 7);
    // The invalid free is recorded with its error code.
    let failed: Vec<&Value> = events(&dump)
        .into_iter()
        .filter(|e| u64_of(e, "result") == 1)
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["event"], "free");
}

#[test]
fn resolver_hands_out_the_exact_variant_at_every_version_and_flag() {
    let (dump, expected) = check_program("resolver", &[]);
    let events = events(&dump);
    // cuMemAlloc/cuMemFree through both resolvers at 3 versions, the async pair at flags 0
    // and 2 through both: 6 + 4 allocations and their frees. The v1 look-up at version 2000
    // gives the legacy 32-bit cuMemAlloc, which is not recorded.
    assert_eq!(expected.len(), 20);
    let t = tally(&events);
    assert_eq!(t[&("alloc".into(), "cuMemAlloc_v2".into())], 6);
    assert_eq!(t[&("alloc".into(), "cuMemAllocAsync".into())], 2);
    assert_eq!(t[&("alloc".into(), "cuMemAllocAsync_ptsz".into())], 2);
    assert_eq!(t[&("free".into(), "cuMemFreeAsync_ptsz".into())], 2);
}

#[test]
fn runtime_calls_are_recorded_once_not_twice() {
    let (dump, expected) = check_program("runtime", &[]);
    let events = events(&dump);
    // No driver event from inside a runtime call: the only driver-level events are the
    // calls the program made through pointers from cudaGetDriverEntryPoint*.
    let driver: Vec<String> = events
        .iter()
        .filter(|e| {
            e["api"]
                .as_str()
                .is_some_and(|api| api.starts_with("cu") && !api.starts_with("cuda"))
        })
        .map(|e| {
            format!(
                "{} {}",
                e["event"].as_str().unwrap_or_default(),
                e["api"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        driver,
        [
            "alloc cuMemAlloc_v2",
            "free cuMemFree_v2",
            "create cuMemCreate",
            "release cuMemRelease",
            "alloc cuMemAllocAsync_ptsz"
        ]
    );
    let t = tally(&events);
    assert_eq!(t[&("alloc".into(), "cudaMalloc".into())], 3);
    assert_eq!(t[&("trim".into(), "cudaMemPoolTrimTo".into())], 2);
    assert!(expected.len() >= 25, "{}", expected.len());
    // cudaMalloc on device 1 after cudaSetDevice(1).
    let on_device_1 = select(&events, "alloc", "cudaMalloc")
        .into_iter()
        .filter(|e| i64_of(e, "device") == 1)
        .count();
    assert_eq!(on_device_1, 1);
}

#[test]
fn virtual_memory_calls_are_recorded_by_handle_and_range() {
    let (dump, expected) = check_program("vmm", &[]);
    let kinds: Vec<&str> = expected.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "reserve",
            "create",
            "create",
            "map",
            "map",
            "map",
            "unmap",
            "unmap",
            "release",
            "release",
            "unreserve"
        ]
    );
    let events = events(&dump);
    let creates = select(&events, "create", "cuMemCreate");
    assert!(
        creates
            .iter()
            .all(|e| i64_of(e, "device") == 1 && u64_of(e, "size") == 20 << 20)
    );
    // The map with a bad handle failed and says so.
    let maps = select(&events, "map", "cuMemMap");
    assert_eq!(
        maps.iter().map(|e| u64_of(e, "result")).collect::<Vec<_>>(),
        [0, 0, 1]
    );
}

#[test]
fn stream_ordered_and_pool_allocations_keep_their_streams() {
    let (dump, expected) = check_program("async", &[]);
    assert_eq!(expected.len(), 9);
    let events = events(&dump);
    let streams: std::collections::BTreeSet<u64> =
        events.iter().map(|e| u64_of(e, "stream")).collect();
    assert_eq!(
        streams.len(),
        3,
        "stream 0 (trim) and the two streams: {streams:?}"
    );
    let trim = &select(&events, "trim", "cuMemPoolTrimTo")[0];
    assert_ne!(u64_of(trim, "handle"), 0);
}

#[test]
fn an_interposer_loaded_after_the_shim_still_finds_the_next_definition() {
    let interposer = fake_lib_dir().join("libinterpose.so");
    let preload = format!("{}:{}", shim().display(), interposer.display());
    let run = run_under_shim("interposed", "interposed", &[], &[("LD_PRELOAD", &preload)]);
    assert!(
        run.output.status.success(),
        "{}{}",
        run.stdout(),
        run.stderr()
    );
    assert!(
        run.stderr()
            .contains("interposer cudaMalloc=100 cudaFree=100"),
        "{}",
        run.stderr()
    );
    let dump = dump(&run.log());
    let events = events(&dump);
    let t = tally(&events);
    assert_eq!(t[&("alloc".into(), "cudaMalloc".into())], 100);
    assert_eq!(t[&("free".into(), "cudaFree".into())], 100);
    assert_eq!(events.len(), 200);
    let sizes: Vec<u64> = select(&events, "alloc", "cudaMalloc")
        .iter()
        .map(|e| u64_of(e, "size"))
        .collect();
    assert_eq!(sizes, (1..=100).map(|i| 4096 * i).collect::<Vec<u64>>());
}

/// `file:line` of a return address, from the log's own module map and `addr2line`.
fn source_line(dump: &[Value], ip: u64) -> String {
    let module = dump
        .iter()
        .filter(|r| r["type"] == "module")
        .find(|m| u64_of(m, "start") <= ip && ip < u64_of(m, "end"))
        .unwrap_or_else(|| panic!("no module holds {ip:#x}"));
    let offset = ip - u64_of(module, "load_bias") - 1; // the call, not the return address
    let output = std::process::Command::new("addr2line")
        .arg("-e")
        .arg(module["path"].as_str().expect("module path"))
        .arg(format!("{offset:#x}"))
        .output()
        .expect("addr2line (binutils) runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let location = text.trim();
    let file = location.rsplit('/').next().unwrap_or(location);
    // addr2line may append " (discriminator N)".
    file.split(' ').next().unwrap_or(file).to_owned()
}

fn line_of(source: &str, needle: &str) -> usize {
    source
        .lines()
        .position(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the source"))
        + 1
}

#[test]
fn native_stacks_point_at_the_calling_line() {
    let (dump, _) = check_program("direct", &[]);
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/programs/direct.c"))
        .expect("direct.c");
    let stacks: std::collections::HashMap<u64, Vec<u64>> = dump
        .iter()
        .filter(|r| r["type"] == "stack")
        .map(|r| {
            let frames = r["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .map(|f| f.as_u64().expect("frame"))
                .collect();
            (u64_of(r, "id"), frames)
        })
        .collect();
    let events = events(&dump);
    let allocs = select(&events, "alloc", "cuMemAlloc_v2");
    let first = &stacks[&u64_of(allocs[0], "stack")];
    let leak = &stacks[&u64_of(allocs.last().expect("leak"), "stack")];
    // Innermost frame: the line of the call in main; no frame of the shim above it.
    assert_eq!(
        source_line(&dump, first[0]),
        format!(
            "direct.c:{}",
            line_of(&source, "cuMemAlloc_v2(&d_buf, 1 * MiB)")
        )
    );
    assert_eq!(
        source_line(&dump, leak[0]),
        format!(
            "direct.c:{}",
            line_of(&source, "cuMemAlloc_v2(&leak, 3 * MiB)")
        )
    );
    // main <- __libc_start_call_main <- __libc_start_main <- _start.
    assert_eq!(first.len(), 4, "{first:x?}");
}

/// Eight threads whose very first CUDA call happens at once (after a barrier): every one must
/// reach the real driver. (The shim once published the driver handle before resolving the real
/// functions, and a racing thread got CUDA_ERROR_NOT_INITIALIZED.)
#[test]
fn simultaneous_first_calls_all_reach_the_driver() {
    for attempt in 0..10 {
        let run = run_under_shim(
            "first-calls",
            "bench",
            &["8", "200", "0"],
            &[("FAKECUDA_MEM", "unlimited"), ("VRAMSHIM_STACK", "none")],
        );
        assert!(
            run.output.status.success(),
            "attempt {attempt}: {}{}",
            run.stdout(),
            run.stderr()
        );
        let dump = dump(&run.log());
        assert_eq!(events(&dump).len(), 8 * 200 * 2, "attempt {attempt}");
        let _ = std::fs::remove_dir_all(&run.dir);
    }
}
