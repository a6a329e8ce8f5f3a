//! `VRAMSHIM_TIME_RESOLUTION`: the recorder writes every time rounded down to a multiple of the
//! chosen resolution, in the order a full-resolution run writes, and says so in the header;
//! reports say it where they describe a log. Real programs under the real preload, checked
//! through `vramshim` output.

mod common;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

const MS10: u64 = 10_000_000;
const US1: u64 = 1_000;

/// Every record of `dump` that carries a time, in log order (the header does not).
fn times(dump: &[Value]) -> Vec<u64> {
    dump.iter()
        .filter(|record| record.get("t_ns").is_some())
        .map(|record| u64_of(record, "t_ns"))
        .collect()
}

/// What identifies an event across two runs of a deterministic program (addresses and
/// thread ids may differ): kind, entry point, device, size, result.
fn shape(event: &Value) -> (String, String, i64, u64, u64) {
    (
        event["event"].as_str().unwrap_or("?").to_owned(),
        event["api"].as_str().unwrap_or("?").to_owned(),
        i64_of(event, "device"),
        u64_of(event, "size"),
        u64_of(event, "result"),
    )
}

/// Checks one log written at `resolution_ns`: the header says it, every time is a multiple
/// of it, and times never go back in log order.
fn check_rounded(dump: &[Value], resolution_ns: u64) -> Vec<u64> {
    assert_eq!(dump[0]["type"], "header");
    assert_eq!(u64_of(&dump[0], "time_resolution_ns"), resolution_ns);
    let times = times(dump);
    assert!(times.len() > 10, "{} timed records", times.len());
    for t in &times {
        assert_eq!(
            t % resolution_ns,
            0,
            "{t} ns is no multiple of {resolution_ns}"
        );
    }
    assert!(
        times.windows(2).all(|pair| pair[0] <= pair[1]),
        "times go back in log order: {times:?}"
    );
    times
}

/// Whether some time is not a whole microsecond: what a full-resolution recording shows (the
/// chance that 20 nanosecond clock readings all end in 000 is 10^-60).
fn has_nanoseconds(dump: &[Value]) -> bool {
    times(dump).iter().any(|t| t % US1 != 0)
}

#[test]
fn times_at_10ms_and_1us_are_multiples_in_the_order_of_a_default_run() {
    // report_peak: 14 operations on two devices and pinned memory, 1 ms apart.
    let default = run_under_shim("time-res-default", "report_peak", &[], &[]);
    assert!(default.output.status.success(), "{}", default.stderr());
    let default_dump = dump(&default.log());
    assert_eq!(u64_of(&default_dump[0], "time_resolution_ns"), 1);
    assert!(has_nanoseconds(&default_dump));
    let default_events: Vec<_> = events(&default_dump).into_iter().map(shape).collect();
    assert!(default_events.len() >= 14, "{default_events:?}");

    for (setting, ns) in [("10ms", MS10), ("1us", US1)] {
        let run = run_under_shim(
            &format!("time-res-{setting}"),
            "report_peak",
            &[],
            &[("VRAMSHIM_TIME_RESOLUTION", setting)],
        );
        assert!(run.output.status.success(), "{}", run.stderr());
        assert!(
            !run.stderr().contains("VRAMSHIM_TIME_RESOLUTION"),
            "{}",
            run.stderr()
        );
        let dump = dump(&run.log());
        let times = check_rounded(&dump, ns);
        let events: Vec<_> = events(&dump).into_iter().map(shape).collect();
        assert_eq!(events, default_events, "events at {setting}");
        // The run spans more than one step of the resolution (14 sleeps of 1 ms), so the
        // check above saw times that differ, not only zeros.
        let distinct: std::collections::BTreeSet<_> = times.iter().collect();
        assert!(distinct.len() >= 2, "{setting}: {distinct:?}");
        if ns == US1 {
            // 1 ms apart: no two operations share a microsecond.
            assert!(distinct.len() >= 14, "{setting}: {distinct:?}");
        }
    }
}

#[test]
fn threads_at_10ms_keep_each_thread_s_order_and_the_merged_order() {
    // threads: 8 threads x 10,000 alloc/free pairs each, with sizes of their own.
    let per_thread = |dump: &[Value]| -> HashMap<String, Vec<(String, u64)>> {
        let names: HashMap<u64, String> = dump
            .iter()
            .filter(|r| r["type"] == "thread")
            .map(|r| {
                (
                    u64_of(r, "thread"),
                    r["name"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        let mut sequences: HashMap<String, Vec<(String, u64)>> = HashMap::new();
        for event in events(dump) {
            let name = names
                .get(&u64_of(event, "thread"))
                .cloned()
                .unwrap_or_default();
            if name.starts_with("worker-") {
                sequences.entry(name).or_default().push((
                    event["event"].as_str().unwrap_or("?").to_owned(),
                    u64_of(event, "size"),
                ));
            }
        }
        sequences
    };
    let default = run_under_shim("time-res-threads-default", "threads", &[], &[]);
    assert!(default.output.status.success(), "{}", default.stderr());
    let default_dump = dump(&default.log());
    assert!(has_nanoseconds(&default_dump));
    let expected = per_thread(&default_dump);
    assert_eq!(expected.len(), 8, "{:?}", expected.keys());
    assert!(expected.values().all(|s| s.len() == 20_000));

    let run = run_under_shim(
        "time-res-threads-10ms",
        "threads",
        &[],
        &[("VRAMSHIM_TIME_RESOLUTION", "10ms")],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let dump = dump(&run.log());
    check_rounded(&dump, MS10);
    assert_eq!(per_thread(&dump), expected);
}

#[test]
fn reports_say_the_resolution_and_keep_the_figures() {
    let default = run_under_shim("time-res-reports-default", "report_peak", &[], &[]);
    let coarse = run_under_shim(
        "time-res-reports-10ms",
        "report_peak",
        &[],
        &[("VRAMSHIM_TIME_RESOLUTION", "10ms")],
    );
    let (default_log, coarse_log) = (default.log(), coarse.log());
    let note = "times recorded at 10 ms resolution (VRAMSHIM_TIME_RESOLUTION): each is \
                rounded down to a multiple of it";
    let text = |command: &str, log: &Path| -> String {
        let (code, stdout, stderr) = vramshim(&[OsStr::new(command), log.as_os_str()]);
        assert_eq!(code, Some(0), "{command}: {stderr}");
        stdout
    };
    for command in ["report", "timeline", "dump"] {
        let coarse_text = text(command, &coarse_log);
        let lines: Vec<&str> = coarse_text.lines().filter(|l| l.contains(note)).collect();
        assert_eq!(lines.len(), 1, "{command}:\n{coarse_text}");
        assert!(
            !text(command, &default_log).contains("resolution"),
            "{command} of a full-resolution log"
        );
    }

    // JSON: the resolution with each process; the peaks are the same bytes as at 1 ns, at
    // times rounded down.
    let json = |log: &Path| json_of(&[OsStr::new("report"), OsStr::new("--json"), log.as_os_str()]);
    let (default_json, coarse_json) = (json(&default_log), json(&coarse_log));
    assert_eq!(
        u64_of(&coarse_json["processes"][0], "time_resolution_ns"),
        MS10
    );
    assert_eq!(
        u64_of(&default_json["processes"][0], "time_resolution_ns"),
        1
    );
    let devices = |json: &Value| arr(&json["devices"]).clone();
    let (default_devices, coarse_devices) = (devices(&default_json), devices(&coarse_json));
    assert_eq!(default_devices.len(), 2);
    assert_eq!(coarse_devices.len(), 2);
    for (d, c) in default_devices.iter().zip(&coarse_devices) {
        assert_eq!(u64_of(c, "peak_bytes"), u64_of(d, "peak_bytes"));
        assert_eq!(u64_of(c, "peak_count"), u64_of(d, "peak_count"));
        assert_eq!(u64_of(c, "peak_t_ns") % MS10, 0);
    }

    // The Chrome/Perfetto trace says it in otherData; a full-resolution one does not.
    let trace = |log: &Path, name: &str| -> Value {
        let path = log.with_file_name(name);
        let (code, _, stderr) = vramshim(&[
            OsStr::new("export"),
            log.as_os_str(),
            OsStr::new("--chrome-trace"),
            path.as_os_str(),
        ]);
        assert_eq!(code, Some(0), "{stderr}");
        serde_json::from_slice(&std::fs::read(&path).expect("trace written")).expect("JSON")
    };
    let coarse_trace = trace(&coarse_log, "coarse.json");
    assert_eq!(coarse_trace["otherData"]["time_resolution_ns"], MS10);
    assert_eq!(coarse_trace["otherData"]["time_resolution"], note);
    for event in arr(&coarse_trace["traceEvents"]) {
        if let Some(ts) = event["ts"].as_f64() {
            // Microseconds: whole multiples of 10,000.
            assert_eq!(ts % 10_000.0, 0.0, "{event}");
        }
    }
    let default_trace = trace(&default_log, "default.json");
    assert!(
        default_trace["otherData"]
            .get("time_resolution_ns")
            .is_none()
    );
}

#[test]
fn merged_processes_at_10ms_say_their_order_within_a_step_is_the_logs() {
    // report_fork: a parent and its child allocate 1 ms apart, so within one 10 ms step the
    // order of their events is not in the logs; the replay takes the first log's first, and a
    // device figure adding both may be off (the merged peak is exact at 1 ns: report.rs).
    let coarse = run_under_shim(
        "time-res-fork-10ms",
        "report_fork",
        &[],
        &[("VRAMSHIM_TIME_RESOLUTION", "10ms")],
    );
    assert!(coarse.output.status.success(), "{}", coarse.stderr());
    let default = run_under_shim("time-res-fork-default", "report_fork", &[], &[]);
    assert!(default.output.status.success(), "{}", default.stderr());
    let note = "events of different processes less than 10 ms apart are merged in log order, \
                not as they happened (times recorded at that resolution): a device's figures \
                that add up several processes may be off within a step; record with \
                VRAMSHIM_TIME_RESOLUTION=1ns for exact merged figures";
    let report = |logs: &[PathBuf]| -> String {
        let mut args = vec![OsStr::new("report")];
        args.extend(logs.iter().map(|log| log.as_os_str()));
        let (code, stdout, stderr) = vramshim(&args);
        assert_eq!(code, Some(0), "{stderr}");
        stdout
    };
    let (coarse_logs, default_logs) = (coarse.logs(), default.logs());
    assert_eq!(coarse_logs.len(), 2);
    assert_eq!(default_logs.len(), 2);
    let both = report(&coarse_logs);
    assert_eq!(
        both.lines().filter(|line| *line == note).count(),
        1,
        "{both}"
    );
    // One process alone, or both at full resolution: nothing to say.
    for log in &coarse_logs {
        let alone = report(std::slice::from_ref(log));
        assert!(!alone.contains("merged in log order"), "{alone}");
    }
    let exact = report(&default_logs);
    assert!(!exact.contains("merged in log order"), "{exact}");
}

#[test]
fn a_bad_time_resolution_warns_once_and_records_nanoseconds() {
    for bad in ["5ms", "10", "fast", "10s"] {
        let run = run_under_shim(
            &format!("time-res-bad-{bad}"),
            "report_peak",
            &[],
            &[("VRAMSHIM_TIME_RESOLUTION", bad)],
        );
        assert!(run.output.status.success(), "{}", run.stderr());
        let stderr = run.stderr();
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("VRAMSHIM_TIME_RESOLUTION"))
            .collect();
        assert_eq!(
            warnings,
            [format!(
                "vramshim: VRAMSHIM_TIME_RESOLUTION={bad:?} is not a power of ten from 1ns to \
                 1s (1ns, 1us, 1ms, 10ms, ...); using 1ns"
            )],
            "{stderr}"
        );
        let dump = dump(&run.log());
        assert_eq!(u64_of(&dump[0], "time_resolution_ns"), 1);
        assert!(has_nanoseconds(&dump), "{bad}");
    }
}

/// The chunks of a log file (key and continued): (offset, whole length).
fn chunk_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    let spans: Vec<(usize, usize)> = vramshim_format::chunk_spans(bytes)
        .iter()
        .map(|span| (span.start, span.len()))
        .collect();
    let end = spans.last().map_or(0, |(at, len)| at + len);
    assert_eq!(end, bytes.len(), "the log ends inside a chunk");
    spans
}

#[test]
fn a_busy_loop_s_drains_share_chunks() {
    // 400,000 events from one thread: its 8192-event buffer is drained about every 4096
    // events (about 98 drains). Each drain of 64 events or more leaves the chunk open for
    // one flush interval (here 60 s: with 10 s a run slowed by a loaded machine outlasted it
    // and closed a chunk a drain, 9 chunks), so chunks close at their 256 KiB instead.
    const PAIRS: usize = 200_000;
    let run = run_under_shim(
        "time-res-busy",
        "bench",
        &["1", &PAIRS.to_string(), "8"],
        &[
            ("FAKECUDA_MEM", "unlimited"),
            ("VRAMSHIM_STACK", "native"),
            ("VRAMSHIM_FLUSH_MS", "60000"),
            ("VRAMSHIM_TIME_RESOLUTION", "10ms"),
        ],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let log = run.log();
    let bytes = std::fs::read(&log).expect("log");
    let spans = chunk_spans(&bytes);
    // About 1 byte an event as counted for a chunk's size (a same-time repeat; a run's records
    // count one byte each though the run is a few bytes): 400 KB in chunks of 256 KiB, the
    // definitions in the first, the exit record at the end of the last.
    assert!(
        (2..=8).contains(&spans.len()),
        "{} chunks: {spans:?}",
        spans.len()
    );
    let dump = dump(&log);
    check_rounded(&dump, MS10);
    let events = events(&dump);
    assert_eq!(events.len(), 2 * PAIRS);
    assert!(
        events
            .chunks(2)
            .all(|pair| pair[0]["event"] == "alloc" && pair[1]["event"] == "free"),
        "alloc/free pairs in order"
    );
}
