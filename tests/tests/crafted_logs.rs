//! Crafted logs with extreme values, written with the format crate's encoder, read by every
//! report command of the real `vramshim`. Each command must end within a timeout, in bounded
//! memory, with exit 0 (or 2 and one clear line), and never panic.

mod common;

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{scratch, vramshim_tool};
use vramshim_format::{
    ChunkBuilder, CodeDef, Dropped, Event, EventKind, Exit, FORMAT_VERSION, Frame, HOST_DEVICE,
    Header, Mark, MemInfo, ModuleDef, Record, StackDef, ThreadName, UNKNOWN_DEVICE,
};

/// Generous for a loaded 2-core machine and a debug build.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// Address-space limit for each command: a huge allocation fails (and aborts) instead of
/// swapping the machine.
const ADDRESS_SPACE_KIB: u64 = 4 << 20;

const APIS: [&str; 8] = [
    "cudaMalloc",
    "cudaFree",
    "cuMemCreate",
    "cuMemRelease",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cudaMallocHost",
    "cudaFreeHost",
];
const CUDA_MALLOC: u16 = 0;
const CUDA_FREE: u16 = 1;
const CU_MEM_CREATE: u16 = 2;
const CU_MEM_RELEASE: u16 = 3;
const CUDA_MALLOC_ASYNC: u16 = 4;
const CUDA_MALLOC_HOST: u16 = 6;
/// `cudaErrorMemoryAllocation`.
const OUT_OF_MEMORY: u32 = 2;

/// A header; `start_mono_ns` decides how far apart merged logs start.
fn header(pid: u32, start_mono_ns: u64) -> Header {
    Header {
        version: FORMAT_VERSION,
        pid,
        ppid: 1,
        argv: vec!["crafted".into()],
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns,
        hostname: "crafted-host".into(),
        env: Vec::new(),
        apis: APIS.iter().map(|s| s.to_string()).collect(),
        stack_mode: "native".into(),
        mode: "stream".into(),
        recorder: "crafted".into(),
        time_resolution_ns: 1,
    }
}

/// Writes `records` as one log: header, then chunks of at most 256 KiB of payload.
fn write_log(path: &Path, header: &Header, records: &[Record]) {
    let mut out = header.encode();
    let mut chunk = ChunkBuilder::new();
    for record in records {
        chunk.push(record);
        if chunk.payload_len() >= 256 << 10 {
            chunk.finish_into(&mut out);
        }
    }
    chunk.finish_into(&mut out);
    File::create(path)
        .and_then(|mut file| file.write_all(&out))
        .expect("write crafted log");
}

fn event(kind: EventKind, api: u16, t_ns: u64, device: i32, addr: u64, size: u64) -> Event {
    Event {
        kind,
        api,
        t_ns,
        thread: 7,
        device,
        addr,
        size,
        stack: 1,
        ..Event::default()
    }
}

/// Sizes, addresses, devices and times at their limits; times going backwards; frees
/// without allocations; the same address allocated twice; unknown stack, code and api ids;
/// a 256-frame stack; a bogus module map.
fn extreme_records(devices: &[i32]) -> Vec<Record> {
    let mut records = vec![
        Record::Module(ModuleDef {
            path: "/nonexistent/libbogus.so".into(),
            load_bias: u64::MAX,
            start: u64::MAX - 10,
            end: 5,
            build_id: vec![0xab],
        }),
        Record::Module(ModuleDef {
            path: "/nonexistent/libwhole.so".into(),
            load_bias: 0,
            start: 0,
            end: u64::MAX,
            build_id: Vec::new(),
        }),
        Record::Module(ModuleDef {
            path: String::new(),
            load_bias: 1 << 63,
            start: 1 << 40,
            end: 1 << 40,
            build_id: vec![0; 64],
        }),
        Record::Code(CodeDef {
            id: 3,
            python: 0x030b,
            filename: "model.py".into(),
            qualname: "Net.forward".into(),
            first_line: u32::MAX,
            line_table: vec![0xff; 40],
        }),
        Record::Code(CodeDef {
            id: 4,
            python: 0xffff,
            filename: String::new(),
            qualname: String::new(),
            first_line: 0,
            line_table: Vec::new(),
        }),
        Record::Stack(StackDef {
            id: 1,
            frames: (0..256u64)
                .map(|i| Frame::Native(u64::MAX - i * 0x1000))
                .collect(),
        }),
        Record::Stack(StackDef {
            id: 2,
            frames: vec![
                Frame::Native(0),
                Frame::Python {
                    code: 3,
                    offset: u32::MAX,
                    entry: true,
                },
                Frame::Python {
                    code: 99,
                    offset: 0,
                    entry: false,
                },
                Frame::Python {
                    code: 4,
                    offset: 7,
                    entry: true,
                },
                Frame::Native(1 << 40),
            ],
        }),
        Record::Stack(StackDef {
            id: u32::MAX,
            frames: Vec::new(),
        }),
        Record::ThreadName(ThreadName {
            thread: 7,
            name: "\u{1F525}\n\"<&>".into(),
        }),
        Record::ThreadName(ThreadName {
            thread: u32::MAX,
            name: String::new(),
        }),
        // Dropped-event counts that overflow when summed.
        Record::Dropped(Dropped {
            t_ns: u64::MAX,
            count: u64::MAX,
        }),
        Record::Dropped(Dropped {
            t_ns: 0,
            count: u64::MAX,
        }),
    ];
    let times = [0, u64::MAX, 5, u64::MAX / 2, 3, 0, u64::MAX - 1];
    for (i, (&device, &t_ns)) in devices.iter().zip(&times).enumerate() {
        let i = i as u64;
        let alloc_api = if device == HOST_DEVICE {
            CUDA_MALLOC_HOST
        } else {
            CUDA_MALLOC
        };
        records.push(Record::MemInfo(MemInfo {
            t_ns,
            device,
            free: u64::MAX,
            total: if i.is_multiple_of(2) { u64::MAX } else { 0 },
        }));
        // Two allocations of u64::MAX bytes at the top of the address space: sums overflow.
        let mut big = event(
            EventKind::Alloc,
            alloc_api,
            t_ns,
            device,
            u64::MAX - i,
            u64::MAX,
        );
        big.stack = [1, 2, u32::MAX, 12345][i as usize % 4];
        records.push(Record::Event(big));
        let mut second = event(
            EventKind::Alloc,
            CUDA_MALLOC_ASYNC,
            t_ns,
            device,
            i,
            u64::MAX,
        );
        second.stream = u64::MAX;
        second.thread = u32::MAX;
        records.push(Record::Event(second));
        // The same address again without a free (the free was lost).
        records.push(Record::Event(event(
            EventKind::Alloc,
            alloc_api,
            t_ns.saturating_sub(1),
            device,
            i,
            1,
        )));
        // A free of something never allocated, and one with an unknown api index.
        records.push(Record::Event(event(
            EventKind::Free,
            CUDA_FREE,
            t_ns,
            device,
            0xdead_0000 + i,
            0,
        )));
        let mut unknown_api = event(EventKind::Free, u16::MAX, t_ns, device, i, 0);
        unknown_api.stack = 0;
        records.push(Record::Event(unknown_api));
        // A failed allocation with impossible free/total figures.
        let mut failed = event(EventKind::AllocFailed, alloc_api, t_ns, device, 0, u64::MAX);
        failed.result = OUT_OF_MEMORY;
        failed.mem_info = Some((u64::MAX, if i.is_multiple_of(2) { 0 } else { u64::MAX }));
        records.push(Record::Event(failed));
        // VMM handles at the limits.
        let mut create = event(EventKind::Create, CU_MEM_CREATE, t_ns, device, 0, u64::MAX);
        create.handle = u64::MAX - i;
        records.push(Record::Event(create));
        let mut release = event(EventKind::Release, CU_MEM_RELEASE, 0, device, 0, 0);
        release.handle = u64::MAX - i - 1;
        records.push(Record::Event(release));
    }
    records
}

/// Devices of [`extreme_records`]: the limits, pinned host, unknown, and a high ordinal.
const EXTREME_DEVICES: [i32; 7] = [0, 1, i32::MAX, i32::MIN, HOST_DEVICE, UNKNOWN_DEVICE, 77];

/// A process that only ever uses device 2147483647.
fn huge_device_records() -> Vec<Record> {
    let mut records = vec![Record::Stack(StackDef {
        id: 1,
        frames: vec![Frame::Native(0x1000)],
    })];
    for i in 0..4u64 {
        records.push(Record::Event(event(
            EventKind::Alloc,
            CUDA_MALLOC,
            10 + i,
            i32::MAX,
            0x7000_0000 + i * 0x1000,
            1 << 20,
        )));
    }
    let mut failed = event(
        EventKind::AllocFailed,
        CUDA_MALLOC,
        20,
        i32::MAX,
        0,
        1 << 40,
    );
    failed.result = OUT_OF_MEMORY;
    failed.mem_info = Some((1 << 30, 2 << 30));
    records.push(Record::Event(failed));
    records.push(Record::Event(event(
        EventKind::Free,
        CUDA_FREE,
        30,
        i32::MAX,
        0x7000_0000,
        0,
    )));
    records
}

/// Many distinct deep stacks, each used by one allocation (half of them freed), and ids far
/// apart.
fn many_stacks_records() -> Vec<Record> {
    let mut records = Vec::new();
    for i in 0..2_000u64 {
        let id = (i as u32).wrapping_mul(2_654_435_761) | 1;
        records.push(Record::Stack(StackDef {
            id,
            frames: (0..40u64).map(|f| Frame::Native(f << 32 | i)).collect(),
        }));
        let mut alloc = event(EventKind::Alloc, CUDA_MALLOC, i, 0, 0x1_0000 * (i + 1), 512);
        alloc.stack = id;
        records.push(Record::Event(alloc));
        if i % 2 == 0 {
            records.push(Record::Event(event(
                EventKind::Free,
                CUDA_FREE,
                i,
                0,
                0x1_0000 * (i + 1),
                0,
            )));
        }
    }
    records
}

/// A log whose module paths name a FIFO, a character device and a directory, with stacks
/// pointing into them: symbolisation must neither block nor read them.
fn special_files_records(fifo: &Path, dir: &Path) -> Vec<Record> {
    let paths = [
        fifo.to_string_lossy().into_owned(),
        "/dev/zero".to_string(),
        dir.to_string_lossy().into_owned(),
    ];
    let mut records = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let start = 0x10_0000_0000 * (i as u64 + 1);
        records.push(Record::Module(ModuleDef {
            path: path.clone(),
            load_bias: start,
            start,
            end: start + 0x10_0000,
            // A build id, so that the separate debug file is looked for too.
            build_id: vec![0x12, 0x34, 0x56, i as u8],
        }));
        records.push(Record::Stack(StackDef {
            id: i as u32 + 1,
            frames: vec![Frame::Native(start + 0x100)],
        }));
        let mut alloc = event(
            EventKind::Alloc,
            CUDA_MALLOC,
            i as u64,
            0,
            0x1000 * (i as u64 + 1),
            4096,
        );
        alloc.stack = i as u32 + 1;
        records.push(Record::Event(alloc));
    }
    records
}

/// How one command ended.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `vramshim ARGS` under an address-space limit; fails the test on a timeout.
fn run_bounded(args: &[OsString], cwd: &Path) -> Outcome {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit -v {ADDRESS_SPACE_KIB} && exec \"$@\""))
        .arg("sh")
        .arg(vramshim_tool())
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn vramshim");
    // Drain both pipes on threads so a large output cannot block the child.
    let mut stdout_pipe = child.stdout.take().expect("stdout");
    let mut stderr_pipe = child.stderr.take().expect("stderr");
    let stdout_reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout_pipe.read_to_end(&mut out);
        out
    });
    let stderr_reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stderr_pipe.read_to_end(&mut out);
        out
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > COMMAND_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vramshim {args:?} still running after {COMMAND_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout_reader.join().expect("stdout reader");
    let stderr = stderr_reader.join().expect("stderr reader");
    Outcome {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// `vramshim ARGS --json`'s document: the command must succeed and print one JSON value.
fn json_document(args: &[OsString], cwd: &Path) -> serde_json::Value {
    let outcome = run_bounded(args, cwd);
    assert_eq!(outcome.code, Some(0), "{args:?}: {}", outcome.stderr);
    serde_json::from_str(&outcome.stdout)
        .unwrap_or_else(|err| panic!("{args:?}: not JSON ({err}):\n{}", outcome.stdout))
}

/// A `diff --json` document's rows: each stack's frame labels, innermost first.
fn diff_frames(doc: &serde_json::Value) -> Vec<Vec<String>> {
    let labels = |row: &serde_json::Value| -> Vec<String> {
        row["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .map(|f| f.as_str().expect("label").to_string())
            .collect()
    };
    doc["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(labels)
        .collect()
}

/// Every report command on `log` (diff: against itself and against `other`), text and JSON.
fn commands(log: &Path, other: &Path, out_dir: &Path) -> Vec<Vec<OsString>> {
    let log: OsString = log.into();
    let other: OsString = other.into();
    let out = |name: &str| -> OsString { out_dir.join(name).into() };
    let cmd = |args: &[&OsString]| -> Vec<OsString> { args.iter().map(|a| (*a).clone()).collect() };
    let s = |text: &str| -> OsString { text.into() };
    let mut all = Vec::new();
    for name in ["report", "peak", "leaks", "oom", "timeline", "allocator"] {
        all.push(cmd(&[&s(name), &log]));
        all.push(cmd(&[&s(name), &log, &s("--json")]));
    }
    all.push(cmd(&[
        &s("peak"),
        &log,
        &s("--by-thread"),
        &s("--at"),
        &s("1s"),
    ]));
    all.push(cmd(&[
        &s("timeline"),
        &log,
        &s("--svg"),
        &out("t.svg"),
        &s("--by-thread"),
    ]));
    for what in ["peak", "leaks", "allocated", "oom"] {
        all.push(cmd(&[
            &s("flamegraph"),
            &log,
            &s("--what"),
            &s(what),
            &s("-o"),
            &out(&format!("f-{what}.svg")),
        ]));
        all.push(cmd(&[
            &s("flamegraph"),
            &log,
            &s("--what"),
            &s(what),
            &s("--folded"),
        ]));
    }
    // Two logs merged in time order (start offsets added to extreme times).
    all.push(cmd(&[&s("report"), &log, &other, &s("--json")]));
    all.push(cmd(&[&s("timeline"), &other, &log]));
    all.push(cmd(&[&s("diff"), &log, &log]));
    all.push(cmd(&[&s("diff"), &other, &log, &s("--json")]));
    all.push(cmd(&[
        &s("export"),
        &log,
        &s("--pytorch-snapshot"),
        &s("-o"),
        &out("s.json"),
    ]));
    all.push(cmd(&[
        &s("export"),
        &log,
        &s("--pytorch-snapshot"),
        &s("--pickle"),
        &s("-o"),
        &out("s.pickle"),
    ]));
    all.push(cmd(&[&s("whatif"), &log]));
    all.push(cmd(&[
        &s("whatif"),
        &log,
        &s("--json"),
        &s("--capacity"),
        &s("1GiB"),
    ]));
    all
}

/// Runs every command on `log`; each must exit 0, or 2 with one line on stderr, and none may
/// panic. Returns the outcomes by command line, for checks of particular results.
fn check_all(test: &str, log: &Path, other: &Path) -> Vec<(Vec<OsString>, Outcome)> {
    let out_dir = scratch(&format!("{test}-out"));
    let mut outcomes = Vec::new();
    for args in commands(log, other, &out_dir) {
        let outcome = run_bounded(&args, &out_dir);
        let shown: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
        assert!(
            !outcome.stderr.contains("panicked") && !outcome.stderr.contains("RUST_BACKTRACE"),
            "vramshim {shown:?} panicked:\n{}",
            outcome.stderr
        );
        match outcome.code {
            Some(0) => {}
            Some(2) => {
                let lines: Vec<_> = outcome.stderr.lines().filter(|l| !l.is_empty()).collect();
                assert_eq!(
                    lines.len(),
                    1,
                    "vramshim {shown:?} exited 2 without exactly one line:\n{}",
                    outcome.stderr
                );
            }
            code => panic!(
                "vramshim {shown:?} ended with {code:?} (a signal or a memory failure):\n{}",
                outcome.stderr
            ),
        }
        outcomes.push((args, outcome));
    }
    outcomes
}

fn crafted(test: &str, records: &[Record]) -> (PathBuf, PathBuf) {
    let dir = scratch(test);
    let log = dir.join("crafted.vlog");
    // Starts long after `other`: merged, its extreme times are pushed further out.
    write_log(&log, &header(4242, u64::MAX / 2), records);
    let other = dir.join("other.vlog");
    write_log(&other, &header(4243, 0), &huge_device_records());
    (log, other)
}

#[test]
fn extreme_values_are_reported_without_panic_or_overflow() {
    let (log, other) = crafted("crafted-extreme", &extreme_records(&EXTREME_DEVICES));
    let outcomes = check_all("crafted-extreme", &log, &other);
    // The report still names every device the log used, extremes included.
    let (_, report) = outcomes
        .iter()
        .find(|(args, _)| args.len() == 3 && args[0] == "report" && args[2] == "--json")
        .expect("report --json ran");
    assert_eq!(report.code, Some(0), "{}", report.stderr);
    for device in [i32::MAX.to_string(), i32::MIN.to_string()] {
        assert!(
            report.stdout.contains(&format!("\"device\":{device}"))
                || report.stdout.contains(&format!("\"device\": {device}")),
            "report --json lacks device {device}"
        );
    }
}

#[test]
fn extreme_values_on_plausible_devices_are_exported() {
    // The same extremes on devices a snapshot can hold, so that export writes them.
    let devices = [0, 1, HOST_DEVICE, UNKNOWN_DEVICE, 5];
    let (log, other) = crafted("crafted-extreme-export", &extreme_records(&devices));
    let outcomes = check_all("crafted-extreme-export", &log, &other);
    for (args, outcome) in &outcomes {
        if args[0] != "whatif" {
            assert_eq!(outcome.code, Some(0), "{args:?}: {}", outcome.stderr);
        }
    }
}

#[test]
fn huge_device_ordinal_costs_no_memory() {
    let (log, other) = crafted("crafted-huge-device", &huge_device_records());
    let outcomes = check_all("crafted-huge-device", &log, &other);
    let (_, export) = outcomes
        .iter()
        .find(|(args, _)| args[0] == "export" && args.len() == 5)
        .expect("export ran");
    // The viewer needs one list per ordinal below the highest: refused, with one line.
    assert_eq!(export.code, Some(2), "export: {}", export.stderr);
    assert!(
        export
            .stderr
            .contains("device 2147483647: no GPU has that ordinal"),
        "export: {}",
        export.stderr
    );
    // Every other command reports the device.
    let (_, report) = outcomes
        .iter()
        .find(|(args, _)| args.len() == 2 && args[0] == "report")
        .expect("report ran");
    assert_eq!(report.code, Some(0), "report: {}", report.stderr);
    assert!(
        report.stdout.contains("device 2147483647"),
        "{}",
        report.stdout
    );
}

#[test]
fn many_deep_stacks_are_reported() {
    let (log, other) = crafted("crafted-many-stacks", &many_stacks_records());
    let outcomes = check_all("crafted-many-stacks", &log, &other);
    let (_, leaks) = outcomes
        .iter()
        .find(|(args, _)| args.len() == 3 && args[0] == "leaks" && args[2] == "--json")
        .expect("leaks --json ran");
    assert_eq!(leaks.code, Some(0), "{}", leaks.stderr);
    // The JSON tree is deeper than serde_json's default recursion limit: read the figures
    // from the device line, which comes before the tree.
    let head: String = leaks.stdout[..leaks.stdout.find("\"stacks\"").expect("stacks key")]
        .split_whitespace()
        .collect();
    // 1,000 allocations of 512 bytes (one per distinct stack) were never freed.
    assert!(
        head.contains("\"bytes\":512000,\"count\":1000,\"device\":0"),
        "leaks: {head}"
    );
    let (_, text) = outcomes
        .iter()
        .find(|(args, _)| args.len() == 2 && args[0] == "leaks")
        .expect("leaks ran");
    assert!(
        text.stdout.contains("500.00 KiB in 1000 allocations"),
        "{}",
        text.stdout
    );
}

#[test]
fn module_paths_naming_special_files_neither_block_nor_are_read() {
    let dir = scratch("crafted-special-files");
    let fifo = dir.join("module.fifo");
    let status = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(status.success());
    let subdir = dir.join("a-directory.so");
    std::fs::create_dir_all(&subdir).expect("directory");
    let log = dir.join("special.vlog");
    write_log(
        &log,
        &header(4244, 1_000_000_000),
        &special_files_records(&fifo, &subdir),
    );
    let started = Instant::now();
    let report = run_bounded(&["peak".into(), log.clone().into()], &dir);
    assert_eq!(report.code, Some(0), "peak: {}", report.stderr);
    assert!(started.elapsed() < COMMAND_TIMEOUT);
    // One warning per special file, naming it; frames fall back to module+offset.
    for path in [
        fifo.to_string_lossy(),
        "/dev/zero".into(),
        subdir.to_string_lossy(),
    ] {
        let warnings: Vec<_> = report
            .stderr
            .lines()
            .filter(|line| line.contains(&*path) && line.contains("not a regular file"))
            .collect();
        assert_eq!(warnings.len(), 1, "warning for {path}: {}", report.stderr);
    }
    assert!(
        report.stdout.contains("module.fifo+0x100"),
        "{}",
        report.stdout
    );
    assert!(report.stdout.contains("zero+0x100"), "{}", report.stdout);
    check_all("crafted-special-files", &log, &log);
}

/// A log of two stacks under one module: `(stack id, frame addresses, bytes allocated)`.
fn two_stacks_records(stacks: [(u32, [u64; 2], u64); 2]) -> Vec<Record> {
    let mut records = vec![Record::Module(ModuleDef {
        path: "/nonexistent/libdiff.so".into(),
        load_bias: 0x1000,
        start: 0x1000,
        end: 0x10_0000,
        build_id: Vec::new(),
    })];
    for (i, (id, frames, bytes)) in stacks.into_iter().enumerate() {
        records.push(Record::Stack(StackDef {
            id,
            frames: frames.iter().map(|&ip| Frame::Native(ip)).collect(),
        }));
        let mut alloc = event(
            EventKind::Alloc,
            CUDA_MALLOC,
            10 * (i as u64 + 1),
            0,
            0x10_0000 * (i as u64 + 1),
            bytes,
        );
        alloc.stack = id;
        records.push(Record::Event(alloc));
    }
    records
}

#[test]
fn diff_labels_rows_of_either_log_alone() {
    // One stack in both logs (other ids, the same frames), one only in A, one only in B:
    // `diff` keeps no labels per row, and makes A's again from A's stack definitions.
    let dir = scratch("crafted-diff-sides");
    let (log_a, log_b) = (dir.join("a.vlog"), dir.join("b.vlog"));
    let a = two_stacks_records([(1, [0x1100, 0x1200], 1000), (2, [0x1300, 0x1200], 300)]);
    let b = two_stacks_records([(5, [0x1100, 0x1200], 1500), (6, [0x1400, 0x1200], 200)]);
    write_log(&log_a, &header(100, 0), &a);
    write_log(&log_b, &header(200, 0), &b);
    let args = |extra: &[&str]| -> Vec<OsString> {
        let mut args: Vec<OsString> =
            vec!["diff".into(), log_a.clone().into(), log_b.clone().into()];
        args.extend(extra.iter().map(OsString::from));
        args
    };
    let doc = json_document(&args(&["--json"]), &dir);
    let rows: Vec<(Vec<String>, u64, u64, i64, u64, u64)> = diff_frames(&doc)
        .into_iter()
        .zip(doc["stacks"].as_array().expect("stacks"))
        .map(|(frames, row)| {
            (
                frames,
                row["peak_a"].as_u64().expect("peak_a"),
                row["peak_b"].as_u64().expect("peak_b"),
                row["peak_change"].as_i64().expect("peak_change"),
                row["allocated_count_a"].as_u64().expect("count a"),
                row["allocated_count_b"].as_u64().expect("count b"),
            )
        })
        .collect();
    let labels = |inner: &str| vec![inner.to_string(), "libdiff.so+0x200".to_string()];
    assert_eq!(
        rows,
        vec![
            (labels("libdiff.so+0x100"), 1000, 1500, 500, 1, 1),
            (labels("libdiff.so+0x400"), 0, 200, 200, 0, 1),
            (labels("libdiff.so+0x300"), 300, 0, -300, 1, 0),
        ]
    );
    let text = run_bounded(&args(&["--frames", "2"]), &dir);
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    // Columns compared word by word (their widths are the table's business).
    let row_lines: Vec<String> = text
        .stdout
        .lines()
        .filter(|line| line.contains("libdiff.so"))
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        row_lines,
        [
            "1000 B 1.46 KiB +500 B 1000 B 1.46 KiB +500 B libdiff.so+0x100 <- libdiff.so+0x200",
            "0 B 200 B +200 B 0 B 200 B +200 B libdiff.so+0x400 <- libdiff.so+0x200",
            "300 B 0 B -300 B 300 B 0 B -300 B libdiff.so+0x300 <- libdiff.so+0x200",
        ],
        "{}",
        text.stdout
    );
}

/// A log whose stacks run from an application (`/nonexistent/app`) through PyTorch's C++
/// library (`/nonexistent/libtorch_cpu.so`, folded in text views): `(stack id, frame
/// addresses, bytes allocated)`; the library spans 0x1000..0x10_0000, the application
/// 0x10_0000..0x20_0000 (each from offset 0).
fn torch_stacks_records(stacks: &[(u32, Vec<u64>, u64)]) -> Vec<Record> {
    let mut records = vec![
        Record::Module(ModuleDef {
            path: "/nonexistent/libtorch_cpu.so".into(),
            load_bias: 0x1000,
            start: 0x1000,
            end: 0x10_0000,
            build_id: Vec::new(),
        }),
        Record::Module(ModuleDef {
            path: "/nonexistent/app".into(),
            load_bias: 0x10_0000,
            start: 0x10_0000,
            end: 0x20_0000,
            build_id: Vec::new(),
        }),
    ];
    for (i, (id, frames, bytes)) in stacks.iter().enumerate() {
        records.push(Record::Stack(StackDef {
            id: *id,
            frames: frames.iter().map(|&ip| Frame::Native(ip)).collect(),
        }));
        let mut alloc = event(
            EventKind::Alloc,
            CUDA_MALLOC,
            10 * (i as u64 + 1),
            0,
            0x100_0000 * (i as u64 + 1),
            *bytes,
        );
        alloc.stack = *id;
        records.push(Record::Event(alloc));
    }
    records
}

#[test]
fn diff_text_folds_the_frameworks_frames_and_json_keeps_them() {
    // PyTorch's frames innermost, the application's outside: the text shows the
    // application's first (as `peak` does), `--unfold` every frame, JSON every frame.
    let dir = scratch("crafted-diff-fold");
    let (log_a, log_b) = (dir.join("a.vlog"), dir.join("b.vlog"));
    let through_two = vec![0x1100, 0x1200, 0x10_0100, 0x10_0200];
    let through_one = vec![0x1300, 0x10_0300, 0x10_0200];
    let a = torch_stacks_records(&[(1, through_two.clone(), 1000)]);
    let b = torch_stacks_records(&[(3, through_two, 1500), (4, through_one, 700)]);
    write_log(&log_a, &header(100, 0), &a);
    write_log(&log_b, &header(200, 0), &b);
    let run = |extra: &[&str]| -> String {
        let mut args: Vec<OsString> =
            vec!["diff".into(), log_a.clone().into(), log_b.clone().into()];
        args.extend(extra.iter().map(OsString::from));
        let outcome = run_bounded(&args, &dir);
        assert_eq!(outcome.code, Some(0), "{}", outcome.stderr);
        outcome.stdout
    };
    // The table's rows, columns compared word by word.
    let rows = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|line| line.contains("+0x"))
            .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    };
    assert_eq!(
        rows(&run(&["--frames", "2"])),
        [
            "0 B 700 B +700 B 0 B 700 B +700 B app+0x300 <- app+0x200",
            "1000 B 1.46 KiB +500 B 1000 B 1.46 KiB +500 B app+0x100 <- app+0x200",
        ]
    );
    assert_eq!(
        rows(&run(&["--frames", "2", "--unfold"])),
        [
            "0 B 700 B +700 B 0 B 700 B +700 B libtorch_cpu.so+0x300 <- app+0x300",
            "1000 B 1.46 KiB +500 B 1000 B 1.46 KiB +500 B libtorch_cpu.so+0x100 <- libtorch_cpu.so+0x200",
        ]
    );
    let mut args: Vec<OsString> = vec!["diff".into(), log_a.clone().into(), log_b.clone().into()];
    args.push("--json".into());
    assert_eq!(
        diff_frames(&json_document(&args, &dir)),
        [
            vec!["libtorch_cpu.so+0x300", "app+0x300", "app+0x200"],
            vec![
                "libtorch_cpu.so+0x100",
                "libtorch_cpu.so+0x200",
                "app+0x100",
                "app+0x200"
            ],
        ]
    );
}

#[test]
fn oom_text_folds_the_failed_calls_stack() {
    let dir = scratch("crafted-oom-fold");
    let log = dir.join("oom.vlog");
    let stack = vec![0x1100, 0x1200, 0x10_0100, 0x10_0200];
    let mut records = torch_stacks_records(&[(1, stack, 1000)]);
    let mut failed = event(EventKind::AllocFailed, CUDA_MALLOC, 20, 0, 0, 1 << 40);
    failed.result = OUT_OF_MEMORY;
    records.push(Record::Event(failed));
    write_log(&log, &header(100, 0), &records);
    // The lines after the failure's own line, up to the next line about it.
    let stack_lines = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<OsString> = vec!["oom".into(), log.clone().into()];
        args.extend(extra.iter().map(OsString::from));
        let outcome = run_bounded(&args, &dir);
        assert_eq!(outcome.code, Some(0), "{}", outcome.stderr);
        outcome
            .stdout
            .lines()
            .skip_while(|line| !line.starts_with("failure 1:"))
            .skip(1)
            .take_while(|line| line.starts_with("    "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        stack_lines(&[]),
        [
            "    [2 frames of PyTorch folded]",
            "    app+0x100",
            "    app+0x200"
        ]
    );
    assert_eq!(
        stack_lines(&["--unfold", "--frames", "3"]),
        [
            "    libtorch_cpu.so+0x100",
            "    libtorch_cpu.so+0x200",
            "    app+0x100",
            "    ... 1 more frame"
        ]
    );
}

#[test]
fn counts_of_one_are_singular() {
    // One allocation on a 5-frame stack (one more than `report` shows) and one device sample.
    let dir = scratch("crafted-singular");
    let log = dir.join("one.vlog");
    let mut alloc = event(EventKind::Alloc, CUDA_MALLOC, 20, 0, 0x10_0000, 4096);
    alloc.stack = 3;
    let records = vec![
        Record::Module(ModuleDef {
            path: "/nonexistent/libone.so".into(),
            load_bias: 0x1000,
            start: 0x1000,
            end: 0x10_0000,
            build_id: Vec::new(),
        }),
        Record::Stack(StackDef {
            id: 3,
            frames: (1..=5u64)
                .map(|f| Frame::Native(0x1000 + 0x10 * f))
                .collect(),
        }),
        Record::MemInfo(MemInfo {
            t_ns: 10,
            device: 0,
            free: 60 << 30,
            total: 80 << 30,
        }),
        Record::Event(alloc),
    ];
    write_log(&log, &header(300, 0), &records);
    let report = run_bounded(&["report".into(), log.clone().into()], &dir);
    assert_eq!(report.code, Some(0), "{}", report.stderr);
    let text = &report.stdout;
    for singular in [
        "(1 sample of cuMemGetInfo, 80.00 GiB total)",
        "... 1 more frame\n",
        ", 1 event over ",
        "4.00 KiB in 1 allocation\n",
    ] {
        assert!(text.contains(singular), "no {singular:?} in:\n{text}");
    }
    for plural in ["1 samples", "1 more frames", "1 events", "1 allocations"] {
        assert!(!text.contains(plural), "{plural:?} in:\n{text}");
    }
}

#[test]
fn a_log_given_twice_is_warned_about() {
    let dir = scratch("crafted-twice");
    let log = dir.join("a.vlog");
    write_log(
        &log,
        &header(400, 0),
        &two_stacks_records([(1, [0x1100, 0x1200], 1000), (2, [0x1300, 0x1200], 300)]),
    );
    let twice = format!(
        "vramshim: warning: {} is given twice: it is read twice, so its allocations count twice",
        log.display()
    );
    let report = run_bounded(
        &["report".into(), log.clone().into(), log.clone().into()],
        &dir,
    );
    assert_eq!(report.code, Some(0), "{}", report.stderr);
    assert_eq!(
        report.stderr.lines().filter(|line| *line == twice).count(),
        1,
        "{}",
        report.stderr
    );
    // Counted twice indeed: 2 x 1,300 bytes live at the end.
    assert!(
        report.stdout.contains("2.54 KiB in 4 allocations"),
        "{}",
        report.stdout
    );
    // Another name of the same file.
    let alias = dir.join("alias.vlog");
    std::os::unix::fs::symlink(&log, &alias).expect("symlink");
    let peak = run_bounded(
        &["peak".into(), log.clone().into(), alias.clone().into()],
        &dir,
    );
    assert_eq!(peak.code, Some(0), "{}", peak.stderr);
    assert!(
        peak.stderr.contains(&format!(
            "vramshim: warning: {} and {} are the same file: it is read twice",
            log.display(),
            alias.display()
        )),
        "{}",
        peak.stderr
    );
    // diff compares a log with itself on purpose: no warning.
    let diff = run_bounded(
        &["diff".into(), log.clone().into(), log.clone().into()],
        &dir,
    );
    assert_eq!(diff.code, Some(0), "{}", diff.stderr);
    assert!(!diff.stderr.contains("twice"), "{}", diff.stderr);
}

/// One device sample and three allocations (1, 2 and 4 MiB on device 0), the first freed;
/// the 4 MiB one alone in a second chunk, then the exit record when `exited`.
fn two_chunk_log(path: &Path, exited: bool) {
    let mut out = header(500, 0).encode();
    let mut chunk = ChunkBuilder::new();
    let mut freed = event(EventKind::Free, CUDA_FREE, 3_000, 0, 0x10_0000, 1 << 20);
    freed.stack = 0;
    for record in [
        Record::MemInfo(MemInfo {
            t_ns: 500,
            device: 0,
            free: 70 << 30,
            total: 80 << 30,
        }),
        Record::Event(event(
            EventKind::Alloc,
            CUDA_MALLOC,
            1_000,
            0,
            0x10_0000,
            1 << 20,
        )),
        Record::Event(event(
            EventKind::Alloc,
            CUDA_MALLOC,
            2_000,
            0,
            0x20_0000,
            2 << 20,
        )),
        Record::Event(freed),
    ] {
        chunk.push(&record);
    }
    chunk.finish_into(&mut out);
    chunk.push(&Record::Event(event(
        EventKind::Alloc,
        CUDA_MALLOC,
        4_000,
        0,
        0x40_0000,
        4 << 20,
    )));
    if exited {
        chunk.push(&Record::Exit(Exit { t_ns: 5_000 }));
    }
    chunk.finish_into(&mut out);
    std::fs::write(path, &out).expect("write crafted log");
}

/// A log that ends inside a chunk (the recorder was stopped mid-write) shows its end as "end
/// of log", not the program's exit; whatif says so too.
#[test]
fn a_cut_log_ends_at_end_of_log_not_at_exit() {
    let dir = scratch("crafted-cut");
    let whole = dir.join("whole.vlog");
    two_chunk_log(&whole, true);
    let cut = dir.join("cut.vlog");
    let bytes = std::fs::read(&whole).expect("read log");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).expect("write cut log");
    let torn = format!(
        "vramshim: warning: {}: log ends in an incomplete chunk at byte ",
        cut.display()
    );

    let report = run_bounded(&["report".into(), whole.clone().into()], &dir);
    assert_eq!(report.code, Some(0), "{}", report.stderr);
    assert!(
        report
            .stdout
            .contains("\n  live at exit  6.00 MiB in 2 allocations\n"),
        "{}",
        report.stdout
    );
    let report = run_bounded(&["report".into(), cut.clone().into()], &dir);
    assert_eq!(report.code, Some(0), "{}", report.stderr);
    assert!(
        report
            .stdout
            .contains("\n  live at end of log  2.00 MiB in 1 allocation\n"),
        "{}",
        report.stdout
    );
    assert!(report.stderr.contains(&torn), "{}", report.stderr);
    assert!(!report.stdout.contains("exit"), "{}", report.stdout);

    let leaks = run_bounded(&["leaks".into(), cut.clone().into()], &dir);
    assert_eq!(leaks.code, Some(0), "{}", leaks.stderr);
    assert!(
        leaks
            .stdout
            .contains("device 0: still live at end of log (0.000003s) 2.00 MiB in 1 allocation"),
        "{}",
        leaks.stdout
    );
    let leaks = run_bounded(&["leaks".into(), whole.clone().into()], &dir);
    assert!(
        leaks
            .stdout
            .contains("device 0: still live at exit (0.000004s) 6.00 MiB in 2 allocations"),
        "{}",
        leaks.stdout
    );
    // The same log whole but with no exit record (killed between two flushes, `_exit`, or a
    // recorder older than the record): "end of log" too, with no warning (nothing is cut).
    let killed = dir.join("killed.vlog");
    two_chunk_log(&killed, false);
    let report = run_bounded(&["report".into(), killed.clone().into()], &dir);
    assert_eq!((report.code, report.stderr.as_str()), (Some(0), ""));
    assert!(
        report
            .stdout
            .contains("\n  live at end of log  6.00 MiB in 2 allocations\n"),
        "{}",
        report.stdout
    );
    assert!(!report.stdout.contains("exit"), "{}", report.stdout);
    let svg = dir.join("leaks.svg");
    let flame = run_bounded(
        &[
            "flamegraph".into(),
            cut.clone().into(),
            "--what".into(),
            "leaks".into(),
            "-o".into(),
            svg.clone().into(),
        ],
        &dir,
    );
    assert_eq!(flame.code, Some(0), "{}", flame.stderr);
    let picture = std::fs::read_to_string(&svg).expect("flame graph");
    assert!(picture.contains("still live at end of log"), "{picture}");
    assert!(!picture.contains("exit"), "{picture}");

    // whatif keeps the warning (its table is the simulation's, the log's end is where it
    // stopped).
    let whatif = run_bounded(
        &[
            "whatif".into(),
            cut.clone().into(),
            "--config".into(),
            "".into(),
        ],
        &dir,
    );
    assert_eq!(whatif.code, Some(0), "{}", whatif.stderr);
    assert!(whatif.stderr.contains(&torn), "{}", whatif.stderr);
    let document = json_document(
        &[
            "whatif".into(),
            cut.clone().into(),
            "--config".into(),
            "".into(),
            "--json".into(),
        ],
        &dir,
    );
    let warnings = document["warnings"].as_array().expect("warnings");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0]
            .as_str()
            .is_some_and(|w| w.contains("log ends in an incomplete chunk")),
        "{warnings:?}"
    );
}

/// `--device N` for a device the log never names, and `peak --at` past the end, are warned
/// about (the views are still printed: empty, and at the end).
#[test]
fn a_missing_device_and_a_late_at_are_warned_about() {
    let dir = scratch("crafted-missing-device");
    let log = dir.join("one.vlog");
    two_chunk_log(&log, true);
    let missing = format!(
        "vramshim: warning: --device 3: nothing in {} is on device 3; its only device is 0\n",
        log.display()
    );
    for command in [
        "report",
        "peak",
        "leaks",
        "oom",
        "timeline",
        "allocator",
        "breakdown",
    ] {
        let outcome = run_bounded(
            &[
                command.into(),
                log.clone().into(),
                "--device".into(),
                "3".into(),
            ],
            &dir,
        );
        assert_eq!(outcome.code, Some(0), "{command}: {}", outcome.stderr);
        assert_eq!(outcome.stderr, missing, "{command}");
        // The device that is there: no warning.
        let outcome = run_bounded(
            &[
                command.into(),
                log.clone().into(),
                "--device".into(),
                "0".into(),
            ],
            &dir,
        );
        assert_eq!(outcome.code, Some(0), "{command}: {}", outcome.stderr);
        assert_eq!(outcome.stderr, "", "{command}");
    }
    let document = json_document(
        &[
            "report".into(),
            log.clone().into(),
            "--device".into(),
            "3".into(),
            "--json".into(),
        ],
        &dir,
    );
    assert_eq!(
        document["warnings"],
        serde_json::json!([missing.trim_start_matches("vramshim: warning: ").trim_end()])
    );

    let late = run_bounded(
        &[
            "peak".into(),
            log.clone().into(),
            "--at".into(),
            "10s".into(),
        ],
        &dir,
    );
    assert_eq!(late.code, Some(0), "{}", late.stderr);
    assert_eq!(
        late.stderr,
        "vramshim: warning: --at 10.000000s: past the end of the log (its last record is at 0.000004s); what was live at its end is shown\n"
    );
    assert!(
        late.stdout
            .contains("device 0: live at 10.000000s 6.00 MiB in 2 allocations"),
        "{}",
        late.stdout
    );
    // Within the log: no warning.
    let within = run_bounded(
        &[
            "peak".into(),
            log.clone().into(),
            "--at".into(),
            "2500ns".into(),
        ],
        &dir,
    );
    assert_eq!(within.code, Some(0), "{}", within.stderr);
    assert_eq!(within.stderr, "");
    assert!(
        within
            .stdout
            .contains("device 0: live at 0.000003s 3.00 MiB in 2 allocations"),
        "{}",
        within.stdout
    );
}

/// Two device samples, a 1 GiB allocation and two marks over one second.
fn marked_log(path: &Path) {
    let ms = 1_000_000u64;
    let sample = |t_ns: u64, used: u64| {
        Record::MemInfo(MemInfo {
            t_ns,
            device: 0,
            free: (80 << 30) - used,
            total: 80 << 30,
        })
    };
    let mark = |t_ns: u64, text: &str| {
        Record::Mark(Mark {
            t_ns,
            thread: 7,
            text: text.into(),
        })
    };
    let mut freed = event(
        EventKind::Free,
        CUDA_FREE,
        900 * ms,
        0,
        0x1000_0000,
        1 << 30,
    );
    freed.stack = 0;
    let records = vec![
        sample(100 * ms, 10 << 30),
        Record::Event(event(
            EventKind::Alloc,
            CUDA_MALLOC,
            200 * ms,
            0,
            0x1000_0000,
            1 << 30,
        )),
        mark(250 * ms, "epoch 0"),
        sample(500 * ms, 12 << 30),
        mark(600 * ms, "epoch 1"),
        Record::Event(freed),
        Record::Event(event(
            EventKind::Alloc,
            CUDA_MALLOC,
            1_000 * ms,
            0,
            0x2000_0000,
            1 << 20,
        )),
    ];
    write_log(path, &header(600, 0), &records);
}

/// Marks show on the text and SVG timelines; device-used samples are points with nothing
/// drawn between them.
#[test]
fn timelines_show_marks_and_used_samples_as_points() {
    let dir = scratch("crafted-marks");
    let log = dir.join("marked.vlog");
    marked_log(&log);
    let text = run_bounded(&["timeline".into(), log.clone().into()], &dir);
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    let lines: Vec<&str> = text.stdout.lines().collect();
    for label in [
        "    | mark \"epoch 0\" at 0.25 s",
        "    | mark \"epoch 1\" at 0.6 s",
    ] {
        assert!(lines.contains(&label), "no {label:?} in:\n{}", text.stdout);
    }
    // The row of markers under the axis: the peak and one bar per mark.
    let markers = lines
        .iter()
        .find(|line| line.trim_start().starts_with('^'))
        .expect("marker row");
    assert_eq!(markers.matches('|').count(), 2, "{markers:?}");
    assert!(
        markers.find('^') < markers.find('|'),
        "peak (0.2 s) before the first mark (0.25 s): {markers:?}"
    );
    let svg_path = dir.join("timeline.svg");
    let svg = run_bounded(
        &[
            "timeline".into(),
            log.clone().into(),
            "--svg".into(),
            svg_path.clone().into(),
        ],
        &dir,
    );
    assert_eq!(svg.code, Some(0), "{}", svg.stderr);
    let picture = std::fs::read_to_string(&svg_path).expect("svg");
    // A line at each mark's exact time (plot from x=90 to 930 over 1 s), labelled.
    for (x, label) in [
        ("300", "mark &quot;epoch 0&quot; at 0.25 s</text>"),
        ("594", "mark &quot;epoch 1&quot; at 0.6 s</text>"),
    ] {
        let line = format!(
            "<line x1=\"{x}\" y1=\"94\" x2=\"{x}\" y2=\"294\" stroke=\"#2e8b57\" stroke-dasharray=\"6 3\" class=\"mark\"/>"
        );
        assert!(picture.contains(&line), "no {line} in:\n{picture}");
        assert!(picture.contains(label), "no {label} in:\n{picture}");
    }
    assert_eq!(picture.matches("class=\"mark\"").count(), 2, "{picture}");
    assert!(
        picture.contains(">mark (vramshim.mark)</text>"),
        "{picture}"
    );
    // Used memory: one dot per sample (10 GiB, then 12 GiB, on a 12 GiB axis 200 px high
    // ending at y=294), no line holding a value between them.
    assert_eq!(picture.matches("class=\"used\"").count(), 2, "{picture}");
    assert!(
        picture.contains("cy=\"127.3\" r=\"2.5\" fill=\"#e07b00\" class=\"used\"/>"),
        "{picture}"
    );
    assert!(
        picture.contains("cy=\"94\" r=\"2.5\" fill=\"#e07b00\" class=\"used\"/>"),
        "{picture}"
    );
    assert!(!picture.contains("polyline"), "{picture}");
}
