//! Thread names and `--by-thread` on logs written by real programs under the real preload:
//! `report_threads` allocates known sizes on named pthreads (two of them renaming themselves
//! after their first allocation), and the views must split every stack by thread, to the
//! byte, under the names the threads had last.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------
// Helpers

/// `vramshim ARGS`, which must succeed; its stdout.
fn stdout_of<S: AsRef<OsStr>>(args: &[S]) -> String {
    let args: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
    let output = tool(&args);
    assert!(
        output.status.success(),
        "vramshim {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `vramshim ARGS`, which must succeed with JSON on stdout.
fn json_of<S: AsRef<OsStr>>(args: &[S]) -> Value {
    let text = stdout_of(args);
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("bad JSON: {err}\n{text}"))
}

/// What `report_threads` said about one of its threads.
#[derive(Clone, Debug)]
struct ThreadInfo {
    /// The name it ends with.
    name: String,
    tid: u64,
    pid: u64,
}

/// One run of `report_threads`: its log, its threads by role, and the bytes and count each
/// role allocated successfully, by function.
struct Recorded {
    run: Run,
    log: PathBuf,
    threads: BTreeMap<String, ThreadInfo>,
    /// (role, function) -> (bytes, count).
    allocated: BTreeMap<(String, String), (u64, u64)>,
}

impl Recorded {
    fn thread(&self, role: &str) -> &ThreadInfo {
        self.threads
            .get(role)
            .unwrap_or_else(|| panic!("no thread {role}: {:?}", self.threads))
    }

    fn amount(&self, role: &str, function: &str) -> (u64, u64) {
        self.allocated
            .get(&(role.to_string(), function.to_string()))
            .copied()
            .unwrap_or_else(|| panic!("{role} did not allocate in {function}"))
    }
}

fn record(test: &str) -> Recorded {
    let run = run_under_shim(test, "report_threads", &[], &[]);
    assert!(
        run.output.status.success(),
        "report_threads failed: {}",
        run.stderr()
    );
    let stdout = run.stdout();
    let mut threads = BTreeMap::new();
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("thread ") else {
            continue;
        };
        let fields: BTreeMap<&str, &str> = rest
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .collect();
        threads.insert(
            fields["role"].to_string(),
            ThreadInfo {
                name: fields["name"].to_string(),
                tid: fields["tid"].parse().expect("tid"),
                pid: fields["pid"].parse().expect("pid"),
            },
        );
    }
    assert_eq!(threads.len(), 5, "{stdout}");
    let mut allocated: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for op in program_ops(&stdout) {
        if op.op == "alloc" && op.int("rc") == 0 {
            let role = op
                .fields
                .get("thread")
                .cloned()
                .unwrap_or_else(|| "main".to_string());
            let entry = allocated
                .entry((role, op.fields["fn"].clone()))
                .or_default();
            entry.0 += op.num("size");
            entry.1 += 1;
        }
    }
    let log = run.log();
    Recorded {
        run,
        log,
        threads,
        allocated,
    }
}

/// `report_threads`, recorded once for the tests that only read its log.
fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| record("threads-view"))
}

/// (thread name, tid, pid, bytes, count, innermost frame) per stack group of `device`.
type GroupKey = (String, u64, u64, u64, u64, String);

fn thread_groups(device: &Value) -> Vec<GroupKey> {
    arr(&device["stacks"])
        .iter()
        .map(|g| {
            let thread = &g["thread"];
            (
                thread["name"].as_str().expect("thread name").to_string(),
                u64_of(thread, "tid"),
                u64_of(thread, "pid"),
                u64_of(g, "bytes"),
                u64_of(g, "count"),
                g["frames"][0]["label"]
                    .as_str()
                    .expect("frame label")
                    .to_string(),
            )
        })
        .collect()
}

/// The only device of a snapshot report, which must be device 0.
fn device0(report: &Value) -> &Value {
    let devices = arr(&report["devices"]);
    assert_eq!(devices.len(), 1, "{report}");
    assert_eq!(devices[0]["device"], 0);
    &devices[0]
}

/// The expected group of `role`'s allocations in `function` (at marker `VIEW: function`).
fn expected_group(recorded: &Recorded, role: &str, function: &str) -> GroupKey {
    let src = source("report_threads");
    let thread = recorded.thread(role);
    let (bytes, count) = recorded.amount(role, function);
    (
        thread.name.clone(),
        thread.tid,
        thread.pid,
        bytes,
        count,
        format!(
            "{function} (report_threads.c:{})",
            marker_line(&src, &format!("VIEW: {function}"))
        ),
    )
}

/// Largest first, then more allocations first, as the views order them.
fn ordered(mut groups: Vec<GroupKey>) -> Vec<GroupKey> {
    groups.sort_by(|a, b| b.3.cmp(&a.3).then(b.4.cmp(&a.4)).then(a.5.cmp(&b.5)));
    groups
}

/// Every group of the run: main's weights, the loaders' batches, the gradients, prefetches.
fn all_groups(recorded: &Recorded) -> Vec<GroupKey> {
    ordered(vec![
        expected_group(recorded, "main", "weights"),
        expected_group(recorded, "loader-0", "load_batch"),
        expected_group(recorded, "loader-1", "load_batch"),
        expected_group(recorded, "autograd", "grad_buffer"),
        expected_group(recorded, "prefetch", "prefetch_buf"),
    ])
}

// ---------------------------------------------------------------------------------------
// The recorder: names, renames

#[test]
fn threads_are_named_with_the_name_they_end_with() {
    let recorded = recorded();
    let dump = dump(&recorded.log);
    // Names in log order, per thread.
    let mut names: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for record in dump.iter().filter(|r| r["type"] == "thread") {
        names
            .entry(u64_of(record, "thread"))
            .or_default()
            .push(record["name"].as_str().expect("name").to_string());
    }
    let main = recorded.thread("main");
    assert_eq!(main.tid, main.pid);
    let expected: BTreeMap<u64, Vec<String>> = [
        ("main", vec!["report_threads"]),
        ("loader-0", vec!["loader-0"]),
        ("loader-1", vec!["loader-1"]),
        // Its first allocation under the inherited name, then it renamed itself; the new
        // name is read when it exits (less than a second later).
        ("autograd", vec!["report_threads", "pt_autograd_0"]),
        // Renamed, then its next allocation more than a second later reads the new name
        // (it never exits before the process does).
        ("prefetch", vec!["prefetch", "prefetch_late"]),
    ]
    .into_iter()
    .map(|(role, names)| {
        (
            recorded.thread(role).tid,
            names.into_iter().map(str::to_string).collect(),
        )
    })
    .collect();
    assert_eq!(names, expected);

    // The prefetch thread's new name is written between its two allocations: read again at
    // the second one, not at exit.
    let prefetch = recorded.thread("prefetch").tid;
    let renamed = dump
        .iter()
        .position(|r| r["type"] == "thread" && r["name"] == "prefetch_late")
        .expect("the new name is recorded");
    let prefetch_events: Vec<usize> = dump
        .iter()
        .enumerate()
        .filter(|(_, r)| r["type"] == "event" && u64_of(r, "thread") == prefetch)
        .map(|(index, _)| index)
        .collect();
    assert_eq!(prefetch_events.len(), 2);
    assert!(
        prefetch_events[0] < renamed && renamed < prefetch_events[1],
        "{prefetch_events:?} {renamed}"
    );
}

// ---------------------------------------------------------------------------------------
// peak, leaks

#[test]
fn peak_and_leaks_by_thread_split_each_stack_by_thread_to_the_byte() {
    let recorded = recorded();
    let log = recorded.log.as_os_str();
    let peak = json_of(&[
        OsStr::new("peak"),
        OsStr::new("--by-thread"),
        OsStr::new("--json"),
        log,
    ]);
    let peak0 = device0(&peak);
    let expected = all_groups(recorded);
    assert_eq!(thread_groups(peak0), expected);
    // 8 + 3 + 6 + 8 + 1 MiB in 1 + 3 + 3 + 2 + 2 allocations.
    assert_eq!(u64_of(peak0, "bytes"), 26 * MIB);
    assert_eq!(u64_of(peak0, "count"), 11);
    let pid = recorded.thread("main").pid;
    for group in arr(&peak0["stacks"]) {
        assert_eq!(group["pids"], serde_json::json!([pid]));
    }

    // The tree: one node per thread at the top, its stacks below.
    let tree = &peak0["tree"];
    let top: Vec<(String, u64, u64)> = arr(&tree["children"])
        .iter()
        .map(|node| {
            assert!(node["frame"].is_null(), "{node}");
            (
                node["thread"]["name"].as_str().expect("name").to_string(),
                u64_of(&node["thread"], "tid"),
                u64_of(node, "bytes"),
            )
        })
        .collect();
    // In the order of the groups: one stack per thread here.
    let wanted: Vec<(String, u64, u64)> = expected
        .iter()
        .map(|(name, tid, _, bytes, _, _)| (name.clone(), *tid, *bytes))
        .collect();
    assert_eq!(top, wanted);
    // Below each thread: its own frames, outermost first, ending at the allocating function.
    for node in arr(&tree["children"]) {
        let mut leaf = node;
        while let Some(child) = arr(&leaf["children"]).first() {
            assert!(child["thread"].is_null(), "{child}");
            leaf = child;
        }
        let name = node["thread"]["name"].as_str().expect("name");
        let function = match name {
            "report_threads" => "weights",
            "loader-0" | "loader-1" => "load_batch",
            "pt_autograd_0" => "grad_buffer",
            "prefetch_late" => "prefetch_buf",
            other => panic!("unexpected thread {other}"),
        };
        assert_eq!(leaf["frame"]["function"], function, "{node}");
    }

    // Leaks: everything but main's weights, freed at the end.
    let leaks = json_of(&[
        OsStr::new("leaks"),
        OsStr::new("--json"),
        OsStr::new("--by-thread"),
        log,
    ]);
    let leaks0 = device0(&leaks);
    let expected_leaks: Vec<GroupKey> = expected
        .iter()
        .filter(|g| !g.5.starts_with("weights "))
        .cloned()
        .collect();
    assert_eq!(thread_groups(leaks0), expected_leaks);
    assert_eq!(u64_of(leaks0, "bytes"), 18 * MIB);
    assert_eq!(u64_of(leaks0, "count"), 10);

    // Without --by-thread: no thread anywhere, and the loaders' identical stacks are one
    // group of 3 + 6 MiB in 6 allocations.
    let plain = json_of(&[OsStr::new("peak"), OsStr::new("--json"), log]);
    let plain0 = device0(&plain);
    let groups: Vec<(u64, u64, String)> = arr(&plain0["stacks"])
        .iter()
        .map(|g| {
            assert!(g.get("thread").is_none(), "{g}");
            (
                u64_of(g, "bytes"),
                u64_of(g, "count"),
                g["frames"][0]["function"]
                    .as_str()
                    .expect("function")
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        groups,
        [
            (9 * MIB, 6, "load_batch".to_string()),
            (8 * MIB, 2, "grad_buffer".to_string()),
            (8 * MIB, 1, "weights".to_string()),
            (MIB, 2, "prefetch_buf".to_string()),
        ]
    );
    fn no_thread(node: &Value) {
        assert!(node.get("thread").is_none(), "{node}");
        arr(&node["children"]).iter().for_each(no_thread);
    }
    no_thread(&plain0["tree"]);
}

#[test]
fn text_views_show_a_thread_line_per_group_and_a_thread_level_in_the_tree() {
    let recorded = recorded();
    let log = recorded.log.as_os_str();
    let label = |role: &str| {
        let thread = recorded.thread(role);
        format!(
            "thread {} (tid {}, pid {})",
            thread.name, thread.tid, thread.pid
        )
    };
    let text = stdout_of(&[OsStr::new("peak"), OsStr::new("--by-thread"), log]);
    assert!(text.contains("\n  by thread and stack:\n"), "{text}");
    for role in ["main", "loader-0", "loader-1", "autograd", "prefetch"] {
        // In the flat list, right under the group's bytes line ...
        assert!(
            text.contains(&format!("\n        {}\n", label(role))),
            "{text}"
        );
        // ... and at the top of the tree.
        let tree_line = text
            .lines()
            .find(|l| l.ends_with(&format!("% {}", label(role))))
            .unwrap_or_else(|| panic!("no tree line for {role}:\n{text}"));
        assert!(tree_line.starts_with("  "), "{tree_line}");
    }
    let loader1 = text
        .find(&format!("        {}\n", label("loader-1")))
        .expect("loader-1 group");
    let group_line = text[..loader1].lines().last().expect("bytes line");
    assert_eq!(group_line.trim(), "6.00 MiB   23.1%  3 allocations");

    let leaks = stdout_of(&[OsStr::new("leaks"), OsStr::new("--by-thread"), log]);
    assert!(leaks.contains(&label("loader-0")), "{leaks}");
    assert!(!leaks.contains(&label("main")), "{leaks}");

    let report = stdout_of(&[OsStr::new("report"), OsStr::new("--by-thread"), log]);
    let at_peak = report
        .split("stacks holding most at the peak:")
        .nth(1)
        .expect("top stacks");
    for role in ["main", "loader-0", "loader-1", "autograd", "prefetch"] {
        assert!(at_peak.contains(&label(role)), "{report}");
    }
    let report_json = json_of(&[
        OsStr::new("report"),
        OsStr::new("--by-thread"),
        OsStr::new("--json"),
        log,
    ]);
    let top = &report_json["devices"][0]["top_stacks_at_peak"];
    assert_eq!(
        thread_groups(&serde_json::json!({ "stacks": top })),
        all_groups(recorded)
    );

    // Without --by-thread the text says nothing about threads.
    for command in ["peak", "leaks", "report"] {
        let plain = stdout_of(&[OsStr::new(command), log]);
        assert!(
            !plain.lines().any(|l| l.trim_start().starts_with("thread ")),
            "{command}:\n{plain}"
        );
        assert!(
            !plain.contains("(tid ") && !plain.contains("by thread"),
            "{command}:\n{plain}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// flamegraph

/// `flamegraph --folded ARGS LOG` lines, each reduced to `device;thread ... program frames`:
/// the frames between the thread frame and the program's own (C library start-up) depend on
/// the machine.
fn folded(log: &Path, args: &[&str]) -> Vec<String> {
    let mut all: Vec<&OsStr> = vec![OsStr::new("flamegraph"), OsStr::new("--folded")];
    all.extend(args.iter().map(OsStr::new));
    all.push(log.as_os_str());
    let mut lines: Vec<String> = stdout_of(&all)
        .lines()
        .map(|line| {
            let frames: Vec<&str> = line.split(';').collect();
            let first_own = frames
                .iter()
                .position(|f| f.contains("(report_threads.c:"))
                .unwrap_or_else(|| panic!("no program frame in {line}"));
            let head = if frames[1].starts_with("thread ") {
                2
            } else {
                1
            };
            format!(
                "{} ... {}",
                frames[..head].join(";"),
                frames[first_own..].join(";")
            )
        })
        .collect();
    lines.sort();
    lines
}

#[test]
fn flamegraph_by_thread_puts_a_thread_frame_under_the_device() {
    let recorded = recorded();
    let src = source("report_threads");
    let line = |role: &str, outer: &str, function: &str, thread: bool| {
        let head = if thread {
            let info = recorded.thread(role);
            format!("device 0;thread {} ({})", info.name, info.tid)
        } else {
            "device 0".to_string()
        };
        let (bytes, _) = recorded.amount(role, function);
        format!(
            "{head} ... {outer} (report_threads.c:{});{function} (report_threads.c:{}) {bytes}",
            marker_line(&src, &format!("CALL: {function}")),
            marker_line(&src, &format!("VIEW: {function}"))
        )
    };
    let sorted = |mut lines: Vec<String>| {
        lines.sort();
        lines
    };
    let threads = sorted(vec![
        line("loader-0", "loader_main", "load_batch", true),
        line("loader-1", "loader_main", "load_batch", true),
        line("autograd", "autograd_main", "grad_buffer", true),
        line("prefetch", "prefetch_main", "prefetch_buf", true),
    ]);
    let mut with_main = threads.clone();
    with_main.push(line("main", "main", "weights", true));
    let with_main = sorted(with_main);

    let log = &recorded.log;
    assert_eq!(folded(log, &["--by-thread"]), with_main);
    assert_eq!(
        folded(log, &["--by-thread", "--what", "allocated"]),
        with_main
    );
    assert_eq!(folded(log, &["--what", "leaks", "--by-thread"]), threads);

    // Without --by-thread: no thread frame, the two loaders' stacks in one line.
    let src_line = |function: &str| {
        format!(
            "(report_threads.c:{});{function} (report_threads.c:{})",
            marker_line(&src, &format!("CALL: {function}")),
            marker_line(&src, &format!("VIEW: {function}"))
        )
    };
    let plain = folded(log, &["--what", "leaks"]);
    assert_eq!(
        plain,
        sorted(vec![
            format!(
                "device 0 ... autograd_main {} {}",
                src_line("grad_buffer"),
                8 * MIB
            ),
            format!(
                "device 0 ... loader_main {} {}",
                src_line("load_batch"),
                9 * MIB
            ),
            format!(
                "device 0 ... prefetch_main {} {}",
                src_line("prefetch_buf"),
                MIB
            ),
        ])
    );
}

// ---------------------------------------------------------------------------------------
// timeline

/// Per thread id: the `t_ns` of each successful allocation it made, in log order.
fn alloc_times(log: &Path) -> BTreeMap<u64, Vec<u64>> {
    let dump = dump(log);
    let mut times: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for event in events(&dump) {
        if event["event"] == "alloc" && event["result"] == 0 {
            times
                .entry(u64_of(event, "thread"))
                .or_default()
                .push(u64_of(event, "t_ns"));
        }
    }
    times
}

/// (name, tid, pid, peak bytes, peak t_ns) of each thread series of a timeline device entry.
type ThreadPeak = (String, u64, u64, u64, u64);

fn thread_peaks(device: &Value) -> Vec<ThreadPeak> {
    arr(&device["threads"])
        .iter()
        .map(|t| {
            (
                t["name"].as_str().expect("thread name").to_string(),
                u64_of(t, "tid"),
                u64_of(t, "pid"),
                u64_of(&t["peak"], "bytes"),
                u64_of(&t["peak"], "t_ns"),
            )
        })
        .collect()
}

/// The expected series of `role`: everything it allocated is live at its last allocation
/// (main frees its weights only at the very end, the other threads never free).
fn expected_thread_peak(
    recorded: &Recorded,
    times: &BTreeMap<u64, Vec<u64>>,
    role: &str,
    function: &str,
) -> ThreadPeak {
    let thread = recorded.thread(role);
    let (bytes, count) = recorded.amount(role, function);
    let allocs = &times[&thread.tid];
    assert_eq!(allocs.len() as u64, count, "{role}: {allocs:?}");
    (
        thread.name.clone(),
        thread.tid,
        thread.pid,
        bytes,
        *allocs.last().expect("an allocation"),
    )
}

/// `vramshim timeline ARGS` with `COLUMNS` set; its stdout.
fn timeline_text(args: &[&OsStr], columns: &str) -> String {
    let output = std::process::Command::new(vramshim_tool())
        .arg("timeline")
        .args(args)
        .env("COLUMNS", columns)
        .output()
        .expect("run vramshim");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn timeline_by_thread_has_a_series_per_thread_with_its_exact_peak() {
    let recorded = recorded();
    let log = recorded.log.as_os_str();
    let times = alloc_times(&recorded.log);
    let timeline = json_of(&[
        OsStr::new("timeline"),
        OsStr::new("--by-thread"),
        OsStr::new("--json"),
        log,
    ]);
    assert_eq!(timeline["max_thread_series"], 16);
    let device = device0(&timeline);
    // Highest peak first; main's 8 MiB came before the gradients' 8 MiB.
    let expected = vec![
        expected_thread_peak(recorded, &times, "main", "weights"),
        expected_thread_peak(recorded, &times, "autograd", "grad_buffer"),
        expected_thread_peak(recorded, &times, "loader-1", "load_batch"),
        expected_thread_peak(recorded, &times, "loader-0", "load_batch"),
        expected_thread_peak(recorded, &times, "prefetch", "prefetch_buf"),
    ];
    assert_eq!(thread_peaks(device), expected);
    // Equal peaks: the one reached first comes first.
    assert_eq!((expected[0].3, expected[1].3), (8 * MIB, 8 * MIB));
    assert!(expected[0].4 < expected[1].4, "{expected:?}");
    // The renamed threads under the names they ended with.
    let names: Vec<&str> = arr(&device["threads"])
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        [
            "report_threads",
            "pt_autograd_0",
            "loader-1",
            "loader-0",
            "prefetch_late"
        ]
    );
    assert_eq!(device["other_threads"], Value::Null);

    // Each series reaches its peak and no higher, and ends at what the thread left live:
    // main freed its weights, the others leaked everything.
    let bucket = u64_of(&timeline, "bucket_ns");
    for (thread, (_, _, _, bytes, _)) in arr(&device["threads"]).iter().zip(&expected) {
        let series = arr(&thread["series"]);
        let highest = series.iter().map(|s| u64_of(s, "max_bytes")).max();
        assert_eq!(highest, Some(*bytes), "{thread}");
        let times: Vec<u64> = series.iter().map(|s| u64_of(s, "t_ns")).collect();
        assert!(times.iter().all(|t| t % bucket == 0), "{times:?}");
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
        let last = series.last().map(|s| u64_of(s, "last_bytes"));
        let leaked = if thread["name"] == "report_threads" {
            0
        } else {
            *bytes
        };
        assert_eq!(last, Some(leaked), "{thread}");
    }

    // The device's own series is the same as without --by-thread, and that has no threads.
    let plain = json_of(&[OsStr::new("timeline"), OsStr::new("--json"), log]);
    assert!(plain.get("max_thread_series").is_none());
    let plain0 = device0(&plain);
    assert!(plain0.get("threads").is_none() && plain0.get("other_threads").is_none());
    let mut split = device.clone();
    if let Value::Object(map) = &mut split {
        map.remove("threads");
        map.remove("other_threads");
    }
    assert_eq!(&split, plain0);
}

#[test]
fn timeline_by_thread_folds_threads_beyond_the_top_into_other_threads() {
    let recorded = recorded();
    let log = recorded.log.as_os_str();
    let times = alloc_times(&recorded.log);
    let timeline = json_of(&[
        OsStr::new("timeline"),
        OsStr::new("--by-thread"),
        OsStr::new("--top-threads"),
        OsStr::new("2"),
        OsStr::new("--json"),
        log,
    ]);
    assert_eq!(timeline["max_thread_series"], 2);
    let device = device0(&timeline);
    assert_eq!(
        thread_peaks(device),
        [
            expected_thread_peak(recorded, &times, "main", "weights"),
            expected_thread_peak(recorded, &times, "autograd", "grad_buffer"),
        ]
    );
    // The loaders' and prefetch's allocations, summed; all live at the last of them.
    let other = &device["other_threads"];
    assert_eq!(other["threads"], 3, "{other}");
    let folded = ["loader-0", "loader-1", "prefetch"];
    let bytes: u64 = [
        recorded.amount("loader-0", "load_batch").0,
        recorded.amount("loader-1", "load_batch").0,
        recorded.amount("prefetch", "prefetch_buf").0,
    ]
    .iter()
    .sum();
    assert_eq!(bytes, 10 * MIB);
    let last = folded
        .iter()
        .flat_map(|role| times[&recorded.thread(role).tid].iter().copied())
        .max();
    assert_eq!(u64_of(&other["peak"], "bytes"), bytes);
    assert_eq!(other["peak"]["t_ns"].as_u64(), last);

    let text = timeline_text(
        &[
            OsStr::new("--by-thread"),
            OsStr::new("--top-threads"),
            OsStr::new("2"),
            log,
        ],
        "100",
    );
    assert!(
        text.contains(
            "    other threads (3 more threads, summed; 2 series at most): peak 10.00 MiB at "
        ),
        "{text}"
    );
    // --top-threads means nothing without --by-thread.
    let (code, _, stderr) = vramshim(&[
        OsStr::new("timeline"),
        OsStr::new("--top-threads"),
        OsStr::new("2"),
        log,
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--by-thread"), "{stderr}");
}

#[test]
fn timeline_by_thread_text_has_a_row_per_thread_under_the_chart() {
    let recorded = recorded();
    let log = recorded.log.as_os_str();
    let text = timeline_text(&[OsStr::new("--by-thread"), log], "100");
    for line in text
        .lines()
        .filter(|l| !l.starts_with("process") && !l.starts_with("  log"))
    {
        assert!(line.chars().count() <= 100, "too wide: {line:?}");
    }
    let rows = text
        .split("    by allocating thread (each row scaled to its own peak):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no thread rows:\n{text}"));
    let lines: Vec<&str> = rows.lines().collect();
    let roles = ["main", "autograd", "loader-1", "loader-0", "prefetch"];
    assert_eq!(lines.len(), 2 * roles.len(), "{rows}");
    let label_width = lines[1].find('│').expect("axis");
    for (pair, role) in lines.chunks(2).zip(roles) {
        let thread = recorded.thread(role);
        let (bytes, _) = match role {
            "main" => recorded.amount(role, "weights"),
            "autograd" => recorded.amount(role, "grad_buffer"),
            "prefetch" => recorded.amount(role, "prefetch_buf"),
            _ => recorded.amount(role, "load_batch"),
        };
        let label = format!(
            "    thread {} (tid {}, pid {}): peak {:.2} MiB at ",
            thread.name,
            thread.tid,
            thread.pid,
            bytes as f64 / MIB as f64
        );
        assert!(pair[0].starts_with(&label), "{:?} vs {label:?}", pair[0]);
        // A one-row chart in the chart's columns: the full block at the thread's peak.
        assert_eq!(pair[1].find('│'), Some(label_width), "{rows}");
        assert!(pair[1].ends_with('█'), "{:?}", pair[1]);
    }
    // The rows line up with the device chart's axis.
    let axis = text
        .lines()
        .find(|l| l.contains('┼'))
        .expect("the chart's axis");
    assert_eq!(axis.find('┼'), Some(label_width), "{text}");

    let plain = timeline_text(&[log], "100");
    assert!(
        !plain.contains("by allocating thread") && !plain.contains("(tid "),
        "{plain}"
    );
}

/// The value of attribute `name` in one line of SVG (one element per line).
fn attribute<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = line[start..].find('"')?;
    Some(&line[start..start + end])
}

#[test]
fn timeline_by_thread_svg_has_a_line_and_a_legend_entry_per_thread() {
    let recorded = recorded();
    let log = recorded.log.as_os_str();
    let svg = stdout_of(&[
        OsStr::new("timeline"),
        OsStr::new("--by-thread"),
        OsStr::new("--svg"),
        OsStr::new("-"),
        log,
    ]);
    let text = well_formed(&svg);
    let lines: Vec<&str> = svg
        .lines()
        .filter(|l| l.starts_with("<polyline") && attribute(l, "class") == Some("thread"))
        .collect();
    let line_colours: Vec<&str> = lines
        .iter()
        .map(|l| attribute(l, "stroke").expect("stroke"))
        .collect();
    let legend: Vec<&str> = svg
        .lines()
        .filter(|l| l.starts_with("<text") && attribute(l, "class") == Some("thread-legend"))
        .collect();
    let legend_colours: Vec<&str> = legend
        .iter()
        .map(|l| attribute(l, "fill").expect("fill"))
        .collect();
    let roles = ["main", "autograd", "loader-1", "loader-0", "prefetch"];
    assert_eq!(line_colours.len(), roles.len(), "{svg}");
    // One colour per thread, the same in the line and its legend entry.
    assert_eq!(legend_colours, line_colours);
    let mut distinct = line_colours.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), roles.len(), "{line_colours:?}");
    for (entry, role) in legend.iter().zip(roles) {
        let thread = recorded.thread(role);
        let label = format!(
            ">thread {} (tid {}, pid {}): peak ",
            thread.name, thread.tid, thread.pid
        );
        assert!(entry.contains(&label), "{entry} vs {label}");
    }
    assert!(text.contains("live bytes by allocating thread"), "{text}");
    assert!(!svg.contains("other-threads"));

    // Folded: a dashed line and a legend entry for the other threads.
    let folded = stdout_of(&[
        OsStr::new("timeline"),
        OsStr::new("--by-thread"),
        OsStr::new("--top-threads"),
        OsStr::new("2"),
        OsStr::new("--svg"),
        OsStr::new("-"),
        log,
    ]);
    let text = well_formed(&folded);
    assert!(
        text.contains(
            "other threads (3 more threads, summed; 2 series at most): peak 10.00 MiB at "
        ),
        "{text}"
    );
    assert_eq!(
        folded
            .lines()
            .filter(|l| attribute(l, "class") == Some("other-threads"))
            .count(),
        1
    );

    // Without --by-thread: no thread lines.
    let plain = stdout_of(&[
        OsStr::new("timeline"),
        OsStr::new("--svg"),
        OsStr::new("-"),
        log,
    ]);
    well_formed(&plain);
    assert!(
        !plain.contains("class=\"thread") && !plain.contains("(tid "),
        "{plain}"
    );
}

// ---------------------------------------------------------------------------------------
// oom

#[test]
fn oom_by_thread_names_the_thread_of_each_live_stack() {
    let run = run_under_shim(
        "threads-oom",
        "report_oom",
        &[],
        &[("FAKECUDA_MEM", "1G"), ("FAKECUDA_FAIL_SIZE", "100M")],
    );
    let log = run.log();
    let report = json_of(&[
        OsStr::new("oom"),
        OsStr::new("--json"),
        OsStr::new("--by-thread"),
        log.as_os_str(),
    ]);
    let pid = u64_of(&report["processes"][0], "pid");
    let failures = arr(&report["failures"]);
    assert_eq!(failures.len(), 3, "{report}");
    for failure in failures {
        let live = arr(&failure["live_by_stack"]);
        assert!(!live.is_empty(), "{failure}");
        let bytes: u64 = live.iter().map(|g| u64_of(g, "bytes")).sum();
        assert_eq!(bytes, u64_of(failure, "tracked_bytes"));
        for group in live {
            // report_oom allocates on its main thread only.
            let thread = &group["thread"];
            assert_eq!(u64_of(thread, "tid"), u64_of(failure, "thread"), "{group}");
            assert_eq!(u64_of(thread, "pid"), pid);
            assert_eq!(thread["name"], "report_oom");
        }
    }
    let text = stdout_of(&[
        OsStr::new("oom"),
        OsStr::new("--by-thread"),
        log.as_os_str(),
    ]);
    let label = format!("        thread report_oom (tid {pid}, pid {pid})\n");
    let live_part = text
        .split("  live by stack:\n")
        .nth(1)
        .expect("live by stack");
    assert!(
        live_part.starts_with("  ") && live_part.contains(&label),
        "{text}"
    );
    let folded = stdout_of(&[
        OsStr::new("flamegraph"),
        OsStr::new("--folded"),
        OsStr::new("--what"),
        OsStr::new("oom"),
        OsStr::new("--by-thread"),
        log.as_os_str(),
    ]);
    let prefix = format!("device 0;thread report_oom ({pid});");
    assert!(!folded.is_empty());
    assert!(folded.lines().all(|l| l.starts_with(&prefix)), "{folded}");

    // Without --by-thread: no thread in the live stacks.
    let plain = json_of(&[OsStr::new("oom"), OsStr::new("--json"), log.as_os_str()]);
    for failure in arr(&plain["failures"]) {
        for group in arr(&failure["live_by_stack"]) {
            assert!(group.get("thread").is_none(), "{group}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// diff

#[test]
fn diff_by_thread_matches_threads_of_two_runs_by_name() {
    let a = recorded();
    let b = record("threads-view-b");
    // Two processes: other thread ids, the same names.
    assert_ne!(a.thread("loader-0").tid, b.thread("loader-0").tid);
    let report = json_of(&[
        OsStr::new("diff"),
        OsStr::new("--json"),
        OsStr::new("--by-thread"),
        a.log.as_os_str(),
        b.log.as_os_str(),
    ]);
    let rows: Vec<(String, String, u64, u64, i64)> = arr(&report["stacks"])
        .iter()
        .map(|row| {
            (
                row["thread"].as_str().expect("thread").to_string(),
                row["frames"][0].as_str().expect("frame").to_string(),
                u64_of(row, "peak_a"),
                u64_of(row, "peak_b"),
                i64_of(row, "peak_change"),
            )
        })
        .collect();
    let src = source("report_threads");
    let at = |function: &str| {
        format!(
            "{function} (report_threads.c:{})",
            marker_line(&src, &format!("VIEW: {function}"))
        )
    };
    let mut expected: Vec<(String, String, u64, u64, i64)> = [
        ("report_threads", "weights", 8 * MIB),
        ("loader-0", "load_batch", 3 * MIB),
        ("loader-1", "load_batch", 6 * MIB),
        ("pt_autograd_0", "grad_buffer", 8 * MIB),
        ("prefetch_late", "prefetch_buf", MIB),
    ]
    .into_iter()
    .map(|(thread, function, bytes)| (thread.to_string(), at(function), bytes, bytes, 0))
    .collect();
    // Equal changes: by frame labels, then thread name.
    expected.sort_by(|x, y| x.1.cmp(&y.1).then(x.0.cmp(&y.0)));
    assert_eq!(rows, expected);

    let text = stdout_of(&[
        OsStr::new("diff"),
        OsStr::new("--by-thread"),
        a.log.as_os_str(),
        b.log.as_os_str(),
    ]);
    assert!(
        text.contains("per thread name and stack, growth first"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "  thread loader-1: {} <- loader_main",
            at("load_batch")
        )),
        "{text}"
    );

    // Without --by-thread: one row per stack, no thread.
    let plain = json_of(&[
        OsStr::new("diff"),
        OsStr::new("--json"),
        a.log.as_os_str(),
        b.log.as_os_str(),
    ]);
    let rows = arr(&plain["stacks"]);
    assert_eq!(rows.len(), 4, "{plain}");
    assert!(rows.iter().all(|row| row.get("thread").is_none()));
    drop(b.run);
}

// ---------------------------------------------------------------------------------------
// Python threads

#[test]
fn python_threads_show_the_os_name_they_have() {
    let python = machine_python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/thread_names.py");
    let dir = scratch("threads-python");
    let output = shim_command(&python, &dir)
        .arg(&script)
        .output()
        .expect("run python");
    let run = Run { output, dir };
    assert!(
        run.output.status.success(),
        "python failed: {}",
        run.stderr()
    );
    let stdout = run.stdout();
    // role -> (native thread id, Python minor version)
    let mut tids: BTreeMap<String, u64> = BTreeMap::new();
    let mut minor = 0;
    for line in stdout.lines() {
        let fields: BTreeMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .collect();
        if let (Some(role), Some(tid)) = (fields.get("role"), fields.get("tid")) {
            tids.insert(role.to_string(), tid.parse().expect("tid"));
        }
        if let Some(m) = fields.get("minor") {
            minor = m.parse().expect("minor");
        }
    }
    assert_eq!(tids.len(), 3, "{stdout}");
    let log = run.log();
    let names: BTreeMap<u64, String> = dump(&log)
        .iter()
        .filter(|r| r["type"] == "thread")
        .map(|r| {
            (
                u64_of(r, "thread"),
                r["name"].as_str().expect("name").to_string(),
            )
        })
        .collect();
    let main_name = names[&tids["main"]].clone();
    // `threading.Thread(name=...)` names the OS thread only from Python 3.14 on; before, the
    // thread keeps the name it inherited from the thread that started it.
    let python_named = if minor >= 14 {
        "py-loader".to_string()
    } else {
        main_name.clone()
    };
    assert_eq!(names[&tids["python-named"]], python_named, "{names:?}");
    // A name set at the OS level (here with prctl through ctypes) is recorded on any version.
    assert_eq!(names[&tids["os-named"]], "py-os-named", "{names:?}");

    let peak = json_of(&[
        OsStr::new("peak"),
        OsStr::new("--json"),
        OsStr::new("--by-thread"),
        log.as_os_str(),
    ]);
    let mut got: Vec<(String, u64, u64)> = arr(&device0(&peak)["stacks"])
        .iter()
        .map(|g| {
            (
                g["thread"]["name"].as_str().expect("name").to_string(),
                u64_of(&g["thread"], "tid"),
                u64_of(g, "bytes"),
            )
        })
        .collect();
    got.sort();
    let mut expected = vec![
        (main_name, tids["main"], 3 * 4096),
        (python_named, tids["python-named"], 4096),
        ("py-os-named".to_string(), tids["os-named"], 2 * 4096),
    ];
    expected.sort();
    assert_eq!(got, expected);
}
