//! `vramshim allocator` and `vramshim whatif` on logs written by real programs under the real
//! preload with the fake driver. Expected figures are worked out by hand in the programs'
//! head comments (`tests/programs/report_alloc_*.c`); times come from `vramshim dump --json`.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The allocator settings a test's own environment might carry.
const ALLOC_ENV: [&str; 3] = [
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
];

/// Runs `program ARGS` under the shim with exactly the allocator settings in `env`; its log.
fn record(test: &str, program_name: &str, args: &[&str], env: &[(&str, &str)]) -> PathBuf {
    let dir = scratch(test);
    let mut command = shim_command(&program(program_name), &dir);
    command.args(args);
    for name in ALLOC_ENV {
        command.env_remove(name);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run test program");
    let run = Run { output, dir };
    assert!(
        run.output.status.success(),
        "{program_name} failed: {}\n{}",
        run.stderr(),
        run.stdout()
    );
    run.log()
}

fn device0(report: &Value) -> &Value {
    let devices = arr(&report["devices"]);
    assert_eq!(devices.len(), 1, "one device expected: {report}");
    assert_eq!(devices[0]["device"], 0);
    &devices[0]
}

/// Replay times (ns) of the log's successful allocations of `size` bytes, in order.
fn alloc_times(log: &Path, size: u64) -> Vec<u64> {
    let dump = dump(log);
    events(&dump)
        .into_iter()
        .filter(|e| e["event"] == "alloc" && u64_of(e, "size") == size && u64_of(e, "result") == 0)
        .map(|e| u64_of(e, "t_ns"))
        .collect()
}

/// (size, count) pairs of the segment-size histogram.
fn histogram(device: &Value) -> Vec<(u64, u64)> {
    arr(&device["segment_sizes"])
        .iter()
        .map(|entry| {
            assert_eq!(
                u64_of(entry, "bytes"),
                u64_of(entry, "size") * u64_of(entry, "count")
            );
            (u64_of(entry, "size"), u64_of(entry, "count"))
        })
        .collect()
}

fn native_log(test: &str) -> PathBuf {
    record(
        test,
        "report_alloc_native",
        &[],
        &[("FAKECUDA_MEM", "256M")],
    )
}

fn expandable_log(test: &str) -> PathBuf {
    record(test, "report_alloc_expandable", &[], &[])
}

fn async_log(test: &str) -> PathBuf {
    record(
        test,
        "report_alloc_tensors",
        &["async"],
        &[("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")],
    )
}

fn plain_log(test: &str) -> PathBuf {
    record(
        test,
        "report_alloc_tensors",
        &["plain"],
        &[("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")],
    )
}

/// The config entry of a whatif report whose normalised string is `conf`.
fn config<'a>(report: &'a Value, conf: &str) -> &'a Value {
    arr(&report["configs"])
        .iter()
        .find(|c| c["conf"] == conf)
        .unwrap_or_else(|| panic!("no config {conf:?} in {report}"))
}

// ---------------------------------------------------------------------------------------
// allocator

#[test]
fn allocator_recognises_the_native_caching_allocator() {
    let log = native_log("alloc-native");
    let report = json_of(&[
        OsStr::new("allocator"),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    let d = device0(&report);
    assert_eq!(d["pattern"], "native_caching");
    // 3 x 2 MiB, 3 x 20 MiB, 24 MiB, 100 MiB, 130 MiB (the retry); the failure not counted.
    assert_eq!(u64_of(&d["cuda_malloc"], "count"), 9);
    assert_eq!(u64_of(&d["cuda_malloc"], "bytes"), 320 * MIB);
    assert_eq!(u64_of(&d["cuda_malloc"], "failed"), 1);
    assert_eq!(u64_of(&d["cuda_malloc"], "failed_bytes"), 130 * MIB);
    assert_eq!(u64_of(&d["cuda_free"], "count"), 5);
    assert_eq!(u64_of(&d["cuda_free"], "bytes"), 144 * MIB);
    assert_eq!(
        histogram(d),
        vec![
            (2 * MIB, 3),
            (20 * MIB, 3),
            (24 * MIB, 1),
            (100 * MIB, 1),
            (130 * MIB, 1)
        ]
    );
    assert_eq!(u64_of(&d["segment_sizes_other"], "count"), 0);
    // Peak: 46 MiB left after the retry's release, plus the 130 MiB segment.
    let retry_t = alloc_times(&log, 130 * MIB);
    assert_eq!(retry_t.len(), 1);
    assert_eq!(u64_of(&d["reserved"], "peak"), 176 * MIB);
    assert_eq!(u64_of(&d["reserved"], "peak_t_ns"), retry_t[0]);
    assert_eq!(u64_of(&d["reserved"], "final"), 176 * MIB);
    let series = arr(&d["reserved"]["series"]);
    assert!(!series.is_empty() && series.len() <= 256);
    assert_eq!(
        series.iter().map(|p| u64_of(p, "reserved")).max(),
        Some(176 * MIB)
    );
    // empty_cache(): 2 + 2 + 20 MiB; the retry's frees are not a burst.
    let empty = &d["empty_cache"];
    assert_eq!(u64_of(empty, "count"), 1);
    assert_eq!(u64_of(empty, "bytes"), 24 * MIB);
    let bursts = arr(&empty["bursts"]);
    assert_eq!(bursts.len(), 1);
    assert_eq!(u64_of(&bursts[0], "frees"), 3);
    assert_eq!(u64_of(&bursts[0], "bytes"), 24 * MIB);
    assert!(u64_of(&bursts[0], "t_ns") <= u64_of(&bursts[0], "end_t_ns"));
    assert!(u64_of(&bursts[0], "end_t_ns") < retry_t[0]);
    // The OOM retry: 100 + 20 MiB released in 2 frees, then 130 MiB succeeded.
    assert_eq!(u64_of(d, "failed_allocations"), 1);
    let retries = arr(&d["oom_retries"]);
    assert_eq!(retries.len(), 1);
    assert_eq!(u64_of(&retries[0], "request"), 130 * MIB);
    assert_eq!(u64_of(&retries[0], "released_bytes"), 120 * MIB);
    assert_eq!(u64_of(&retries[0], "released_count"), 2);
    assert_eq!(retries[0]["succeeded"], true);
    assert_eq!(u64_of(&retries[0], "retry_t_ns"), retry_t[0]);
    // The fake charges exactly what the hooks see: nothing outside the allocator.
    let outside = &d["outside_allocator"];
    assert!(u64_of(outside, "samples") >= 1, "{outside}");
    assert_eq!(u64_of(outside, "max"), 0);
    assert_eq!(u64_of(outside, "device_total"), 256 * MIB);
    // The header's allocator settings, all unset.
    let env = &arr(&report["env"])[0];
    for name in ALLOC_ENV {
        assert_eq!(env[name], Value::Null, "{name}");
    }

    let (code, text, stderr) = vramshim(&[OsStr::new("allocator"), log.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(text.contains("looks like native_caching"), "{text}");
    assert!(
        text.contains("empty_cache() bursts: 1 releasing 24.00 MiB"),
        "{text}"
    );
    assert!(
        text.contains("130.00 MiB failed, released 120.00 MiB in 2 frees, retry succeeded"),
        "{text}"
    );
}

#[test]
fn allocator_recognises_expandable_segments() {
    let log = expandable_log("alloc-expandable");
    let report = json_of(&[
        OsStr::new("allocator"),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    let d = device0(&report);
    assert_eq!(d["pattern"], "expandable_segments");
    // 3 x 20 MiB + 2 x 2 MiB mapped at once.
    assert_eq!(u64_of(&d["reserved"], "peak"), 64 * MIB);
    assert_eq!(u64_of(&d["reserved"], "final"), 0);
    assert_eq!(u64_of(&d["vmm"]["create"], "count"), 6);
    assert_eq!(u64_of(&d["vmm"]["create"], "bytes"), 84 * MIB);
    assert_eq!(u64_of(&d["vmm"]["release"], "count"), 6);
    assert_eq!(u64_of(&d["vmm"], "maps"), 6);
    assert_eq!(u64_of(&d["vmm"], "unmaps"), 6);
    assert_eq!(u64_of(&d["cuda_malloc"], "count"), 0);
    assert_eq!(histogram(d), vec![(2 * MIB, 2), (20 * MIB, 4)]);
    assert_eq!(u64_of(&report["address_reservations"], "count"), 2);
    assert_eq!(
        u64_of(&report["address_reservations"], "bytes"),
        1024 * MIB + 64 * MIB
    );
    // empty_cache() (2 chunks) and the release at the end (4 chunks).
    let bursts: Vec<(u64, u64)> = arr(&d["empty_cache"]["bursts"])
        .iter()
        .map(|b| (u64_of(b, "frees"), u64_of(b, "bytes")))
        .collect();
    assert_eq!(bursts, vec![(2, 40 * MIB), (4, 44 * MIB)]);
    assert_eq!(arr(&d["oom_retries"]).len(), 0);

    // The recorded setting is named as the reason.
    let log = record(
        "alloc-expandable-env",
        "report_alloc_expandable",
        &[],
        &[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")],
    );
    let report = json_of(&[
        OsStr::new("allocator"),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    let d = device0(&report);
    assert_eq!(d["pattern"], "expandable_segments");
    assert!(
        d["pattern_reason"]
            .as_str()
            .is_some_and(|r| r.contains("expandable_segments:True")),
        "{d}"
    );
    assert_eq!(
        arr(&report["env"])[0]["PYTORCH_CUDA_ALLOC_CONF"],
        "expandable_segments:True"
    );
}

#[test]
fn allocator_recognises_tensor_level_recordings() {
    let log = async_log("alloc-async-view");
    let report = json_of(&[
        OsStr::new("allocator"),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    let d = device0(&report);
    assert_eq!(d["pattern"], "cuda_malloc_async");
    assert_eq!(u64_of(&d["stream_ordered"]["alloc"], "count"), 5);
    assert_eq!(u64_of(&d["stream_ordered"]["free"], "count"), 5);
    assert_eq!(u64_of(&d["stream_ordered"], "trims"), 1);
    assert_eq!(u64_of(&d["cuda_malloc"], "count"), 1);
    // Live at most: the workspace and b + c + d.
    assert_eq!(u64_of(&d["reserved"], "peak"), 7 * MIB + 21 * MIB + 512_000);

    let log = plain_log("alloc-plain-view");
    let report = json_of(&[
        OsStr::new("allocator"),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    let d = device0(&report);
    assert_eq!(d["pattern"], "per_buffer");
    assert_eq!(u64_of(&d["cuda_malloc"], "count"), 5);
}

// ---------------------------------------------------------------------------------------
// whatif

/// Default settings on the async recording: a takes a 12 MiB segment whole, b a 20 MiB one,
/// c a 2 MiB small segment, d (18 MiB) fits no cached block: 52 MiB; the trim releases it
/// all and e takes a new 20 MiB segment. Expandable segments: a maps one 20 MiB page (b fits
/// in its tail), c one 2 MiB page, d extends the large segment by 20 MiB: 42 MiB; after the
/// trim e maps 20 MiB again.
#[test]
fn whatif_matches_hand_worked_numbers_for_a_cuda_malloc_async_recording() {
    let log = async_log("whatif-async");
    let d_time = alloc_times(&log, 18 * MIB);
    assert_eq!(d_time.len(), 1);
    let report = json_of(&[
        OsStr::new("whatif"),
        OsStr::new("--json"),
        OsStr::new("--config"),
        OsStr::new(""),
        OsStr::new("--config"),
        OsStr::new("expandable_segments:True"),
        log.as_os_str(),
    ]);
    assert_eq!(report["pattern"], "cuda_malloc_async");
    assert_eq!(report["device"], 0);
    assert_eq!(report["capacity_source"], "mem_info");
    assert_eq!(u64_of(&report, "capacity"), 80 * GIB);
    let requests = &report["requests"];
    assert_eq!(u64_of(requests, "allocs"), 5);
    assert_eq!(u64_of(requests, "frees"), 5);
    assert_eq!(u64_of(requests, "empty_cache"), 1);
    assert_eq!(u64_of(requests, "failed_in_recording"), 0);
    // The 7 MiB cudaMalloc is not a tensor under backend:cudaMallocAsync.
    assert_eq!(u64_of(requests, "left_out"), 1);
    assert_eq!(arr(&report["configs"]).len(), 2);

    let default = config(&report, "");
    assert_eq!(u64_of(default, "peak_reserved"), 52 * MIB);
    assert_eq!(u64_of(default, "peak_reserved_t_ns"), d_time[0]);
    assert_eq!(u64_of(default, "peak_allocated"), 21 * MIB + 512_000);
    // At the peak: a's 12 MiB segment free, 17 MiB free in b's: 30.5 MiB minus c's 500 KiB
    // block... exactly 52 MiB - (3 MiB + 512000 B + 18 MiB).
    assert_eq!(
        u64_of(default, "reserved_minus_allocated_at_peak"),
        52 * MIB - (21 * MIB + 512_000)
    );
    assert_eq!(u64_of(default, "largest_free_at_peak"), 17 * MIB);
    assert_eq!(u64_of(default, "num_device_alloc"), 5);
    assert_eq!(u64_of(default, "num_device_free"), 4);
    assert_eq!(u64_of(default, "num_alloc_retries"), 0);
    assert_eq!(default["fits"], true);
    assert_eq!(default["oom"], Value::Null);

    let expandable = config(&report, "expandable_segments:True");
    assert_eq!(u64_of(expandable, "peak_reserved"), 42 * MIB);
    assert_eq!(u64_of(expandable, "peak_reserved_t_ns"), d_time[0]);
    assert_eq!(u64_of(expandable, "num_device_alloc"), 4);
    assert_eq!(expandable["fits"], true);
    // Ranked by peak reserved: expandable first, and the one to copy.
    assert_eq!(report["configs"][0]["conf"], "expandable_segments:True");
    assert_eq!(u64_of(&report["configs"][0], "rank"), 1);
    assert_eq!(report["best"]["conf"], "expandable_segments:True");
}

/// With 48 MiB, of which the 7 MiB `cudaMalloc` that is no tensor holds 7 throughout (another
/// library's memory takes room on the device), the allocator has 41: the default settings hit
/// the limit at d, release a's free 12 MiB segment and retry: 40 MiB, no OOM. Expandable
/// segments need 42 MiB at d and have no free page to release: d fails.
#[test]
fn whatif_capacity_marks_what_fits() {
    let log = async_log("whatif-capacity");
    let d_time = alloc_times(&log, 18 * MIB);
    let args = |capacity: &str| {
        json_of(&[
            OsStr::new("whatif"),
            OsStr::new("--json"),
            OsStr::new("--capacity"),
            OsStr::new(capacity),
            OsStr::new("--config"),
            OsStr::new("expandable_segments:True"),
            OsStr::new("--config"),
            OsStr::new(""),
            log.as_os_str(),
        ])
    };
    let report = args("48MiB");
    assert_eq!(u64_of(&report, "capacity"), 48 * MIB);
    assert_eq!(report["capacity_source"], "option");
    assert_eq!(u64_of(&report["requests"], "other_libraries"), 1);
    let default = config(&report, "");
    assert_eq!(default["fits"], true);
    assert_eq!(u64_of(default, "peak_reserved"), 40 * MIB);
    assert_eq!(u64_of(default, "num_alloc_retries"), 1);
    assert_eq!(u64_of(default, "num_ooms"), 0);
    let expandable = config(&report, "expandable_segments:True");
    assert_eq!(expandable["fits"], false);
    assert_eq!(u64_of(expandable, "num_ooms"), 1);
    assert_eq!(u64_of(&expandable["oom"], "size"), 18 * MIB);
    assert_eq!(u64_of(&expandable["oom"], "t_ns"), d_time[0]);
    assert_eq!(report["configs"][0]["conf"], "");
    assert_eq!(report["configs"][1]["conf"], "expandable_segments:True");
    assert_eq!(report["best"]["conf"], "");

    // 64 GiB written the short way: both fit, expandable is best.
    let report = args("64G");
    assert_eq!(u64_of(&report, "capacity"), 64 * GIB);
    assert!(arr(&report["configs"]).iter().all(|c| c["fits"] == true));
    assert_eq!(report["best"]["conf"], "expandable_segments:True");

    // 20 MiB: nothing fits.
    let report = args("20MiB");
    assert!(arr(&report["configs"]).iter().all(|c| c["fits"] == false));
    assert_eq!(report["best"], Value::Null);

    let (code, text, stderr) = vramshim(&[
        OsStr::new("whatif"),
        OsStr::new("--capacity"),
        OsStr::new("48MiB"),
        log.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(text.contains("capacity: 48.00 MiB (--capacity)"), "{text}");
    assert!(text.contains("yes at"), "{text}");
    assert!(
        text.contains("best that fits: the defaults: leave PYTORCH_CUDA_ALLOC_CONF unset"),
        "{text}"
    );
}

/// Without the trim, e (8 MiB) reuses cached memory: 4 segments by default, and the
/// expandable segment's free 40 MiB takes it without a new mapping.
#[test]
fn whatif_replays_a_no_caching_recording() {
    let log = plain_log("whatif-plain");
    let report = json_of(&[
        OsStr::new("whatif"),
        OsStr::new("--json"),
        OsStr::new("--config"),
        OsStr::new(""),
        OsStr::new("--config"),
        OsStr::new(" expandable_segments : True "),
        log.as_os_str(),
    ]);
    assert_eq!(report["pattern"], "per_buffer");
    assert_eq!(u64_of(&report["requests"], "allocs"), 5);
    assert_eq!(u64_of(&report["requests"], "left_out"), 0);
    assert_eq!(u64_of(&report["requests"], "empty_cache"), 0);
    let default = config(&report, "");
    assert_eq!(u64_of(default, "peak_reserved"), 52 * MIB);
    assert_eq!(u64_of(default, "num_device_alloc"), 4);
    assert_eq!(u64_of(default, "num_device_free"), 0);
    let expandable = config(&report, "expandable_segments:True");
    assert_eq!(expandable["label"], "expandable_segments : True");
    assert_eq!(u64_of(expandable, "peak_reserved"), 42 * MIB);
    assert_eq!(u64_of(expandable, "num_device_alloc"), 3);
}

#[test]
fn whatif_simulates_the_default_set_ranked() {
    let log = async_log("whatif-default-set");
    let report = json_of(&[OsStr::new("whatif"), OsStr::new("--json"), log.as_os_str()]);
    let configs = arr(&report["configs"]);
    assert_eq!(configs.len(), 11);
    let peaks: Vec<u64> = configs.iter().map(|c| u64_of(c, "peak_reserved")).collect();
    let mut sorted = peaks.clone();
    sorted.sort_unstable();
    assert_eq!(peaks, sorted, "ranked by peak reserved");
    for (i, c) in configs.iter().enumerate() {
        assert_eq!(u64_of(c, "rank"), i as u64 + 1);
    }
    assert_eq!(u64_of(config(&report, ""), "peak_reserved"), 52 * MIB);
    assert_eq!(report["best"]["conf"], "expandable_segments:True");
    // garbage_collection_threshold needs a memory fraction: left out, and said so.
    assert!(
        arr(&report["notes"]).iter().any(|n| n
            .as_str()
            .is_some_and(|n| n.contains("garbage_collection_threshold"))),
        "{report}"
    );
    let report = json_of(&[
        OsStr::new("whatif"),
        OsStr::new("--json"),
        OsStr::new("--memory-fraction"),
        OsStr::new("0.5"),
        log.as_os_str(),
    ]);
    assert_eq!(arr(&report["configs"]).len(), 12);
    config(&report, "garbage_collection_threshold:0.8");
}

#[test]
fn whatif_refuses_caching_allocator_recordings() {
    for (name, log) in [
        ("native_caching", native_log("whatif-refuse-native")),
        (
            "expandable_segments",
            expandable_log("whatif-refuse-expandable"),
        ),
    ] {
        let (code, stdout, stderr) = vramshim(&[OsStr::new("whatif"), log.as_os_str()]);
        assert_eq!(code, Some(2), "{name}: {stdout}{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(
            stderr.contains("looks like a caching-allocator recording")
                && stderr.contains(name)
                && stderr.contains("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync")
                && stderr.contains("PYTORCH_NO_CUDA_MEMORY_CACHING=1"),
            "{stderr}"
        );
    }
}

#[test]
fn whatif_rejects_bad_arguments() {
    let log = async_log("whatif-bad-args");
    let (code, _, stderr) = vramshim(&[
        OsStr::new("whatif"),
        OsStr::new("--config"),
        OsStr::new("max_split_size_mb:5"),
        log.as_os_str(),
    ]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("--config \"max_split_size_mb:5\": max_split_size_mb"),
        "{stderr}"
    );
    let (code, _, stderr) = vramshim(&[
        OsStr::new("whatif"),
        OsStr::new("--config"),
        OsStr::new("backend:cudaMallocAsync"),
        log.as_os_str(),
    ]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("backend:cudaMallocAsync"), "{stderr}");
    let (code, _, stderr) = vramshim(&[
        OsStr::new("whatif"),
        OsStr::new("--capacity"),
        OsStr::new("lots"),
        log.as_os_str(),
    ]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("not a size"), "{stderr}");
    let (code, _, stderr) = vramshim(&[
        OsStr::new("whatif"),
        OsStr::new("--device"),
        OsStr::new("1"),
        log.as_os_str(),
    ]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("no allocation on device 1"), "{stderr}");
}

/// A program of its own on the driver API (`direct`: `cuMemAlloc_v2`, the legacy 32-bit
/// `cuMemAlloc`, pitch allocations, no runtime call): its driver-API allocations are its
/// reserved bytes, not "libraries" (those are driver-API allocations beside the allocator's
/// own runtime ones, such as cuBLAS's handle memory under PyTorch).
#[test]
fn a_driver_api_program_holds_its_own_allocations() {
    let log = record("alloc-driver-only", "direct", &[], &[]);
    // The device-0 allocations of the plain driver family, replayed by hand from the dump.
    let dump = dump(&log);
    let mut live: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let (mut count, mut held, mut peak) = (0u64, 0u64, 0u64);
    for e in events(&dump) {
        let api = e["api"].as_str().unwrap_or_default();
        let plain = matches!(api, "cuMemAlloc_v2" | "cuMemAlloc" | "cuMemAllocPitch_v2");
        if e["event"] == "alloc" && plain && e["device"] == 0 && u64_of(e, "result") == 0 {
            count += 1;
            held += u64_of(e, "size");
            peak = peak.max(held);
            live.insert(u64_of(e, "addr"), u64_of(e, "size"));
        } else if e["event"] == "free"
            && let Some(size) = live.remove(&u64_of(e, "addr"))
        {
            held -= size;
        }
    }
    assert!(
        count >= 3,
        "cuMemAlloc_v2, pitch and legacy allocations expected: {count}"
    );
    let d = allocator_device_0(&log);
    assert_eq!(u64_of(&d["cuda_malloc"], "count"), count, "{d}");
    assert_eq!(u64_of(&d["reserved"], "peak"), peak, "{d}");
    // The 3 MiB leak is still held at the end.
    assert_eq!(u64_of(&d["reserved"], "final"), held, "{d}");
    assert_eq!(u64_of(&d["libraries"]["alloc"], "count"), 0, "{d}");
}

/// The device-0 view of `vramshim allocator --json LOG`.
fn allocator_device_0(log: &Path) -> Value {
    let report = json_of(&[
        OsStr::new("allocator"),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    arr(&report["devices"])
        .iter()
        .find(|d| d["device"] == 0)
        .unwrap_or_else(|| panic!("no device 0: {report}"))
        .clone()
}

/// A real H200's ResNet at two tight capacities (`tests/fixtures/h200-tight/`, PyTorch 2.11,
/// judge check 6 with cuDNN off): the two native runs made the same requests and frees up to
/// their OOM, but the driver put their segments at different addresses, and PyTorch 2.11
/// breaks best-fit ties by address, so the 137 MiB run raised where whatif, laying segments
/// out rising, says it raises, and the 141 MiB run raised where rising says a retry saves
/// the run: laid out falling (the row's `other_order`), whatif gives that run's figures. Each
/// figure torch reported is read from the run's own log (the judge checked those logs against
/// `memory_stats()` on the card). Without `--torch-version` the version is not found here
/// (the log names the card's paths): ties by segment age, no other order, and the text says
/// how to give it.
#[test]
fn whatif_gives_both_address_orders_where_a_real_h200s_outcome_hung_on_them() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/h200-tight");
    let recording = fixtures.join("resnet-async.log");
    let whatif = |capacity: u64, version: Option<&str>| -> Value {
        let mut args = vec![
            OsStr::new("whatif").to_os_string(),
            OsStr::new("--json").to_os_string(),
            recording.clone().into_os_string(),
            format!("--capacity={capacity}").into(),
            "--config=".into(),
        ];
        if let Some(version) = version {
            args.push(format!("--torch-version={version}").into());
        }
        json_of(&args)
    };
    // What torch did: from each native run's own log.
    let ran = |name: &str| -> (u64, u64, u64, u64) {
        let d = allocator_device_0(&fixtures.join(name));
        (
            u64_of(&d["reserved"], "peak"),
            u64_of(&d["cuda_malloc"], "count"),
            u64_of(&d["cuda_free"], "count"),
            u64_of(&d["cuda_malloc"], "failed_bytes") / u64_of(&d["cuda_malloc"], "failed"),
        )
    };
    let oom_of = |oom: &Value| -> (u64, u64, u64, u64) {
        (
            u64_of(oom, "peak_reserved"),
            u64_of(oom, "num_device_alloc"),
            u64_of(oom, "num_device_free"),
            u64_of(oom, "alloc_size"),
        )
    };
    let at_141 = ran("resnet-default-141.log");
    let at_137 = ran("resnet-default-137.log");
    assert_eq!(at_141, (127_926_272, 13, 0, 18 * MIB));
    assert_eq!(at_137, (130_023_424, 14, 2, 18 * MIB));

    let report = whatif(280_365_056, Some("2.11.0+cu130"));
    assert_eq!(report["address_order"]["ties"], "address", "{report}");
    assert_eq!(report["address_order"]["order"], "rising", "{report}");
    let row = &arr(&report["configs"])[0];
    // Rising: the retry saves the run (15 cudaMalloc, peak reserved 138 MiB).
    assert_eq!(
        (
            row["fits"].as_bool(),
            u64_of(row, "peak_reserved"),
            u64_of(row, "num_alloc_retries"),
            u64_of(row, "num_device_alloc"),
        ),
        (Some(true), 144_703_488, 1, 15),
        "{row}"
    );
    let other = &row["other_order"];
    assert_eq!(other["order"], "falling", "{row}");
    assert_eq!(other["fits"], false, "{row}");
    assert_eq!(u64_of(&other["oom"], "num_alloc_retries"), 1, "{row}");
    assert_eq!(oom_of(&other["oom"]), at_141, "{row}");

    let report = whatif(276_170_752, Some("2.11.0+cu130"));
    let row = &arr(&report["configs"])[0];
    assert_eq!(row["fits"], false, "{row}");
    assert_eq!(u64_of(&row["oom"], "num_alloc_retries"), 1, "{row}");
    assert_eq!(oom_of(&row["oom"]), at_137, "{row}");
    assert_eq!(
        oom_of(&row["other_order"]["oom"]),
        at_141,
        "falling raises earlier: {row}"
    );

    let (code, text, _) = vramshim(&[
        OsStr::new("whatif"),
        recording.as_os_str(),
        OsStr::new("--capacity=280365056"),
        OsStr::new("--config="),
        OsStr::new("--torch-version=2.11.0+cu130"),
    ]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("note: (default) hangs on where the driver puts new segments (this PyTorch breaks best-fit ties by address; a real driver's order varies from run to run): laid out falling, it runs out of memory at a peak reserved of 122.00 MiB, with 1 retry and 13 cudaMallocs\n"),
        "{text}"
    );

    let report = whatif(280_365_056, None);
    assert_eq!(report["address_order"]["ties"], "segment_age", "{report}");
    assert!(
        report["address_order"]["torch_version"].is_null(),
        "{report}"
    );
    assert!(
        arr(&report["configs"])[0]["other_order"].is_null(),
        "{report}"
    );
    let (_, text, _) = vramshim(&[OsStr::new("whatif"), recording.as_os_str()]);
    assert!(
        text.contains("torch's version not found (--torch-version gives it), taken as the current release's breaks best-fit ties by segment age"),
        "{text}"
    );
}
