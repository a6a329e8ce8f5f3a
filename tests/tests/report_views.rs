//! The picture commands (`timeline`, `flamegraph`, `diff`) on logs written by real programs
//! under the real preload. Expected sizes come from what the programs printed, lines from
//! markers in their sources, times from `vramshim dump --json` or `vramshim peak --json`.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------
// Helpers

/// `vramshim ARGS`, which must succeed; its stdout.
fn stdout_of<S: AsRef<OsStr>>(args: &[S]) -> String {
    let (code, stdout, stderr) = vramshim(args);
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_owned()).collect();
    assert_eq!(code, Some(0), "vramshim {shown:?} failed: {stderr}");
    stdout
}

/// The entry of `devices` for `device`.
fn device_entry(devices: &Value, device: i64) -> &Value {
    arr(devices)
        .iter()
        .find(|d| d["device"].as_i64() == Some(device))
        .unwrap_or_else(|| panic!("no device {device} in {devices}"))
}

/// The line holding `text`; exactly one must.
fn line_containing(program_source: &str, text: &str) -> u64 {
    let lines: Vec<u64> = program_source
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(text))
        .map(|(index, _)| index as u64 + 1)
        .collect();
    assert_eq!(lines.len(), 1, "{text:?} must be on exactly one line");
    lines[0]
}

/// Runs `report_views MODE` under the shim; the run must succeed.
fn run_views(mode: &str) -> Run {
    let run = run_under_shim(&format!("views-{mode}"), "report_views", &[mode], &[]);
    assert!(
        run.output.status.success(),
        "report_views {mode} failed: {}",
        run.stderr()
    );
    run
}

/// Bytes each function of `report_views` allocated successfully, from its own output.
fn sizes_by_function(run: &Run) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for op in program_ops(&run.stdout()) {
        if op.op == "alloc" && op.int("rc") == 0 {
            out.entry(op.fields["fn"].clone())
                .or_default()
                .push(op.num("size"));
        }
    }
    out
}

fn total(sizes: &BTreeMap<String, Vec<u64>>, function: &str) -> u64 {
    sizes.get(function).map_or(0, |s| s.iter().sum())
}

/// The number in seconds that follows `prefix` in `text` (`... at 0.00163 s`).
fn seconds_after(text: &str, prefix: &str) -> f64 {
    let at = text
        .find(prefix)
        .unwrap_or_else(|| panic!("{prefix:?} not in:\n{text}"));
    let rest = &text[at + prefix.len()..];
    let end = rest
        .find(" s")
        .unwrap_or_else(|| panic!("no seconds after {prefix:?}"));
    rest[..end]
        .parse()
        .unwrap_or_else(|err| panic!("{:?}: {err}", &rest[..end]))
}

/// Three significant digits, as the labels promise.
fn assert_close(shown: f64, t_ns: u64) {
    let exact = t_ns as f64 / 1e9;
    assert!(
        (shown - exact).abs() <= exact * 0.006,
        "label says {shown} s, exact {exact} s"
    );
}

/// `t_ns` of the first `alloc_failed` event of a log.
fn failure_time(log: &Path) -> u64 {
    let dump = dump(log);
    let events = events(&dump);
    let failed: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "alloc_failed")
        .collect();
    assert_eq!(failed.len(), 1, "one failed allocation");
    u64_of(failed[0], "t_ns")
}

// ---------------------------------------------------------------------------------------
// timeline

#[test]
fn timeline_json_has_the_exact_peak_and_failure() {
    let run = run_views("a");
    let log = run.log();
    let sizes = sizes_by_function(&run);
    let timeline = json_of(&[
        OsStr::new("timeline"),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    let peak = json_of(&[OsStr::new("peak"), OsStr::new("--json"), log.as_os_str()]);

    // Device 0 peaks with weights, cache and activations live.
    let device0 = device_entry(&timeline["devices"], 0);
    let expected = total(&sizes, "weights") + total(&sizes, "cache") + total(&sizes, "activations");
    assert_eq!(device0["peak"]["bytes"].as_u64(), Some(expected));
    let peak0 = device_entry(&peak["devices"], 0);
    assert_eq!(device0["peak"]["bytes"], peak0["bytes"]);
    assert_eq!(device0["peak"]["t_ns"], peak0["t_ns"]);
    assert_eq!(device0["name"], "device 0");

    // The failure, exactly.
    let failures = arr(&device0["failures"]);
    assert_eq!(failures.len(), 1, "{failures:?}");
    let failed = program_ops(&run.stdout())
        .into_iter()
        .find(|op| op.op == "alloc" && op.int("rc") != 0)
        .expect("the program reports its failed allocation");
    assert_eq!(failures[0]["request"].as_u64(), Some(failed.num("size")));
    assert_eq!(failures[0]["api"], "cudaMalloc");
    assert_eq!(failures[0]["t_ns"].as_u64(), Some(failure_time(&log)));
    assert_eq!(device0["failures_omitted"], 0);

    // The series: bounded, reaches the peak and no higher, ends at what leaked.
    let series = arr(&device0["series"]);
    assert!(!series.is_empty() && series.len() as u64 <= u64_of(&timeline, "max_buckets"));
    let highest = series.iter().map(|s| u64_of(s, "max_bytes")).max();
    assert_eq!(highest, Some(expected));
    let last = series.last().map(|s| u64_of(s, "last_bytes"));
    assert_eq!(last, Some(total(&sizes, "cache")));
    let times: Vec<u64> = series.iter().map(|s| u64_of(s, "t_ns")).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    let bucket = u64_of(&timeline, "bucket_ns");
    assert!(times.iter().all(|t| t % bucket == 0));
    assert!(u64_of(&timeline, "end_ns") >= u64_of(&device0["peak"], "t_ns"));
    // The driver's used memory was sampled at the device's first use.
    assert!(!arr(&device0["used"]).is_empty(), "{device0}");

    // Pinned host memory is its own series.
    let host = device_entry(&timeline["devices"], -1);
    assert_eq!(host["name"], "pinned host");
    assert_eq!(host["peak"]["bytes"].as_u64(), Some(total(&sizes, "stage")));
    assert_eq!(
        host["peak"]["t_ns"],
        device_entry(&peak["devices"], -1)["t_ns"]
    );
    assert!(arr(&host["failures"]).is_empty());

    // --device narrows.
    let only = json_of(&[
        OsStr::new("timeline"),
        OsStr::new("--json"),
        OsStr::new("--device"),
        OsStr::new("-1"),
        log.as_os_str(),
    ]);
    let devices: Vec<i64> = arr(&only["devices"])
        .iter()
        .map(|d| d["device"].as_i64().unwrap())
        .collect();
    assert_eq!(devices, [-1]);
}

#[test]
fn timeline_text_is_a_chart_per_device() {
    let run = run_views("a");
    let log = run.log();
    let output = Command::new(vramshim_tool())
        .args([OsStr::new("timeline"), log.as_os_str()])
        .env("COLUMNS", "72")
        .output()
        .expect("run vramshim");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    for line in text
        .lines()
        .filter(|l| !l.starts_with("process") && !l.starts_with("  log"))
    {
        assert!(line.chars().count() <= 72, "too wide: {line:?}");
    }
    assert!(text.contains("device 0: peak 104.00 MiB at "), "{text}");
    assert!(text.contains("pinned host: peak 2.00 MiB at "), "{text}");
    assert!(text.contains("memory (MiB)"), "{text}");
    assert!(text.contains("time (s)"), "{text}");
    assert!(text.contains('█'), "{text}");
    assert!(text.contains("x failed cudaMalloc 1.00 TiB at "), "{text}");
    assert!(text.find("device 0:") < text.find("pinned host:"), "{text}");
    // Twelve rows per chart, each starting with the axis.
    let rows = text
        .lines()
        .filter(|l| l.contains('┤') || l.contains('│'))
        .count();
    assert_eq!(rows, 24, "{text}");
}

#[test]
fn timeline_svg_is_well_formed_and_labelled() {
    let run = run_under_shim("views-demo-svg", "demo", &[], &[]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let log = run.log();
    let svg_path = run.dir.join("timeline.svg");
    let (code, stdout, stderr) = vramshim(&[
        OsStr::new("timeline"),
        log.as_os_str(),
        OsStr::new("--svg"),
        svg_path.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("device 0: peak 1.17 GiB at "), "{stdout}");
    assert!(
        stderr.contains(&format!("vramshim: wrote {}", svg_path.display())),
        "{stderr}"
    );
    let svg = std::fs::read_to_string(&svg_path).expect("SVG written");
    let text = well_formed(&svg);
    assert!(
        svg.contains("<title>vramshim timeline: demo (pid "),
        "{svg}"
    );

    let timeline = json_of(&[
        OsStr::new("timeline"),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    let device0 = device_entry(&timeline["devices"], 0);
    // demo's peak: weights 832 MiB + 4 leaked 16 MiB + 3 x 96 MiB + 16 MiB.
    assert_eq!(device0["peak"]["bytes"].as_u64(), Some(1200 * MIB));
    let shown = seconds_after(&text, "peak 1.17 GiB at ");
    assert_close(shown, u64_of(&device0["peak"], "t_ns"));
    let shown = seconds_after(&text, "failed cudaMalloc 1.17 GiB at ");
    assert_close(shown, failure_time(&log));
    assert!(text.contains("memory (GiB)"), "{text}");
    assert!(text.contains("memory (MiB)"), "pinned host: {text}");
    assert!(text.contains("time (s)"), "{text}");
    assert!(text.contains("device used memory"), "{text}");
    assert!(text.contains("pinned host: peak 64.00 MiB at "), "{text}");
    assert!(svg.contains("<path") && svg.contains("class=\"live\""));

    // `--svg -`: the picture on stdout instead of the chart.
    let to_stdout = stdout_of(&[
        OsStr::new("timeline"),
        log.as_os_str(),
        OsStr::new("--svg"),
        OsStr::new("-"),
    ]);
    assert_eq!(to_stdout, svg);
}

// ---------------------------------------------------------------------------------------
// flamegraph

/// `flamegraph --folded --what WHAT LOG`, as lines.
fn folded(log: &Path, what: &str) -> Vec<String> {
    stdout_of(&[
        OsStr::new("flamegraph"),
        OsStr::new("--folded"),
        OsStr::new("--what"),
        OsStr::new(what),
        log.as_os_str(),
    ])
    .lines()
    .map(str::to_owned)
    .collect()
}

/// Folded lines reduced to `root ... tail`: the device frame and everything from `main` on
/// (the frames outside `main` are the C library's and depend on the machine).
fn from_main(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = lines
        .iter()
        .map(|line| {
            let (root, rest) = line.split_once(';').expect("device frame first");
            let at = format!(";{rest}")
                .find(";main (")
                .unwrap_or_else(|| panic!("no main in {line}"));
            format!("{root} ... {}", &rest[at..])
        })
        .collect();
    out.sort();
    out
}

#[test]
fn flamegraph_folded_lines_are_exact() {
    let run = run_views("a");
    let log = run.log();
    let sizes = sizes_by_function(&run);
    let src = source("report_views");
    let frame = |function: &str| {
        format!(
            "main (report_views.c:{});{function} (report_views.c:{})",
            marker_line(&src, &format!("CALL: {function}")),
            marker_line(&src, &format!("VIEW: {function}"))
        )
    };
    let line = |device: &str, function: &str| {
        format!(
            "{device} ... {} {}",
            frame(function),
            total(&sizes, function)
        )
    };

    let leaks = folded(&log, "leaks");
    assert_eq!(leaks.len(), 1, "{leaks:?}");
    assert!(leaks[0].starts_with("device 0;"), "{leaks:?}");
    assert!(
        leaks[0].ends_with(&format!(";{} {}", frame("cache"), total(&sizes, "cache"))),
        "{leaks:?}"
    );

    let mut expected = vec![
        line("device 0", "weights"),
        line("device 0", "cache"),
        line("device 0", "activations"),
        line("pinned host memory", "stage"),
    ];
    expected.sort();
    assert_eq!(from_main(&folded(&log, "peak")), expected);

    expected.push(line("device 0", "churn"));
    expected.sort();
    assert_eq!(from_main(&folded(&log, "allocated")), expected);

    // At the failure, activations were already freed.
    let mut expected = vec![line("device 0", "weights"), line("device 0", "cache")];
    expected.sort();
    assert_eq!(from_main(&folded(&log, "oom")), expected);

    // -o FILE with --folded: the same lines in the file.
    let path = run.dir.join("peak.folded");
    let (code, stdout, stderr) = vramshim(&[
        OsStr::new("flamegraph"),
        OsStr::new("--folded"),
        OsStr::new("-o"),
        path.as_os_str(),
        log.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.is_empty());
    assert_eq!(stderr, format!("vramshim: wrote {}\n", path.display()));
    let written = std::fs::read_to_string(&path).expect("folded file");
    assert_eq!(written.lines().collect::<Vec<_>>(), folded(&log, "peak"));
}

#[test]
fn flamegraph_svg_of_demo_leaks() {
    let run = run_under_shim("views-demo-flame", "demo", &[], &[]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let log = run.log();
    let src = source("demo");
    let alloc_line = line_containing(&src, "check(cudaMalloc(&p, size), what);");
    let leak_line = line_containing(&src, "dalloc(16 * MiB, \"grad cache\")");

    // The folded line of the brief: 5 x 16 MiB leaked from one call site.
    let leaks = folded(&log, "leaks");
    assert_eq!(leaks.len(), 1, "{leaks:?}");
    assert!(
        leaks[0].ends_with(&format!(
            ";main (demo.c:{leak_line});dalloc (demo.c:{alloc_line}) {}",
            5 * 16 * MIB
        )),
        "{leaks:?}"
    );

    let path = run.dir.join("leaks.svg");
    let (code, _, stderr) = vramshim(&[
        OsStr::new("flamegraph"),
        OsStr::new("--what"),
        OsStr::new("leaks"),
        log.as_os_str(),
        OsStr::new("-o"),
        path.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.ends_with(&format!("vramshim: wrote {}\n", path.display())));
    let svg = std::fs::read_to_string(&path).expect("SVG written");
    let text = well_formed(&svg);
    assert!(
        text.contains("vramshim leaks: still live at exit, 80.00 MiB (83886080 bytes)"),
        "{text}"
    );
    assert!(
        text.contains(&format!("dalloc (demo.c:{alloc_line})")),
        "{text}"
    );
    assert!(
        text.contains(&format!("main (demo.c:{leak_line})")),
        "{text}"
    );
    assert!(text.contains("device 0"), "{text}");
    assert!(svg.contains("83,886,080 bytes"), "count name: {svg}");

    // Without -o: vramshim-flamegraph-<what>.svg in the current directory.
    let output = Command::new(vramshim_tool())
        .args([OsStr::new("flamegraph"), log.as_os_str()])
        .current_dir(&run.dir)
        .output()
        .expect("run vramshim");
    assert!(output.status.success(), "{output:?}");
    let default = run.dir.join("vramshim-flamegraph-peak.svg");
    let svg = std::fs::read_to_string(&default).expect("default output file");
    let text = well_formed(&svg);
    assert!(
        text.contains("vramshim peak: live at each device's peak"),
        "{text}"
    );
    assert!(text.contains("dalloc"), "{text}");
    assert!(text.contains("pinned host memory"), "{text}");
}

#[test]
fn flamegraph_bad_input_is_refused() {
    let calm = run_views("calm");
    let log = calm.log();
    let out = calm.dir.join("oom.svg");
    let (code, stdout, stderr) = vramshim(&[
        OsStr::new("flamegraph"),
        OsStr::new("--what"),
        OsStr::new("oom"),
        log.as_os_str(),
        OsStr::new("-o"),
        out.as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.starts_with("vramshim: no failed allocation"),
        "{stderr}"
    );
    assert!(!out.exists(), "no file for a refused view");

    let run = run_views("a");
    let log = run.log();
    let (code, _, stderr) = vramshim(&[
        OsStr::new("flamegraph"),
        OsStr::new("--what"),
        OsStr::new("oom"),
        OsStr::new("--failure"),
        OsStr::new("2"),
        log.as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("hold 1 failed allocation"), "{stderr}");

    let (code, _, stderr) = vramshim(&[
        OsStr::new("flamegraph"),
        OsStr::new("--failure"),
        OsStr::new("1"),
        log.as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--failure only applies to --what oom"),
        "{stderr}"
    );

    let nowhere = run.dir.join("missing-dir").join("x.svg");
    let (code, _, stderr) = vramshim(&[
        OsStr::new("flamegraph"),
        log.as_os_str(),
        OsStr::new("-o"),
        nowhere.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!("vramshim: cannot write {}", nowhere.display())),
        "{stderr}"
    );

    let not_a_log = run.dir.join("not-a-log.vlog");
    std::fs::write(&not_a_log, b"hello").unwrap();
    for command in [
        vec![OsStr::new("flamegraph"), not_a_log.as_os_str()],
        vec![OsStr::new("timeline"), not_a_log.as_os_str()],
        vec![OsStr::new("diff"), log.as_os_str(), not_a_log.as_os_str()],
    ] {
        let (code, _, stderr) = vramshim(&command);
        assert_eq!(code, Some(2), "{command:?}: {stderr}");
        assert!(stderr.starts_with("vramshim: "), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

// ---------------------------------------------------------------------------------------
// diff

#[test]
fn diff_gives_exact_changes_growth_first() {
    let a = run_views("a");
    let b = run_views("b");
    let (log_a, log_b) = (a.log(), b.log());
    let (sizes_a, sizes_b) = (sizes_by_function(&a), sizes_by_function(&b));
    let src = source("report_views");
    let diff = json_of(&[
        OsStr::new("diff"),
        OsStr::new("--json"),
        log_a.as_os_str(),
        log_b.as_os_str(),
    ]);
    let stacks = arr(&diff["stacks"]);
    let innermost = |row: &Value| arr(&row["frames"])[0].as_str().unwrap().to_owned();
    let order: Vec<String> = stacks.iter().map(innermost).collect();
    let label = |function: &str| {
        format!(
            "{function} (report_views.c:{})",
            marker_line(&src, &format!("VIEW: {function}"))
        )
    };
    // Growth first: weights grows at the peak, churn only over the run; cache shrinks.
    assert_eq!(order.len(), 5, "{order:?}");
    assert_eq!(order[0], label("weights"));
    assert_eq!(order[1], label("churn"));
    assert_eq!(order[4], label("cache"));
    let mut unchanged = order[2..4].to_vec();
    unchanged.sort();
    assert_eq!(unchanged, [label("activations"), label("stage")]);

    let row = |function: &str| {
        stacks
            .iter()
            .find(|row| innermost(row) == label(function))
            .unwrap_or_else(|| panic!("no row for {function}"))
    };
    let change = |a: u64, b: u64| b as i64 - a as i64;
    // Live at the peak: everything but churn (freed before the peak).
    for function in ["weights", "cache", "activations", "stage", "churn"] {
        let r = row(function);
        let (alloc_a, alloc_b) = (total(&sizes_a, function), total(&sizes_b, function));
        let (peak_a, peak_b) = if function == "churn" {
            (0, 0)
        } else {
            (alloc_a, alloc_b)
        };
        assert_eq!(r["peak_a"].as_u64(), Some(peak_a), "{function}: {r}");
        assert_eq!(r["peak_b"].as_u64(), Some(peak_b), "{function}: {r}");
        assert_eq!(r["peak_change"].as_i64(), Some(change(peak_a, peak_b)));
        assert_eq!(r["allocated_a"].as_u64(), Some(alloc_a), "{function}: {r}");
        assert_eq!(r["allocated_b"].as_u64(), Some(alloc_b), "{function}: {r}");
        assert_eq!(
            r["allocated_change"].as_i64(),
            Some(change(alloc_a, alloc_b))
        );
        assert_eq!(
            r["allocated_count_b"].as_u64(),
            Some(sizes_b[function].len() as u64)
        );
        // Frames, innermost first, continue into main at the marked call.
        let caller = format!(
            "main (report_views.c:{})",
            marker_line(&src, &format!("CALL: {function}"))
        );
        assert_eq!(arr(&r["frames"])[1], caller.as_str(), "{r}");
    }
    assert_eq!(
        row("weights")["peak_change"].as_i64(),
        Some(32 * MIB as i64)
    );
    assert_eq!(row("cache")["peak_change"].as_i64(), Some(-16 * MIB as i64));
    assert_eq!(
        row("churn")["allocated_change"].as_i64(),
        Some(6 * MIB as i64)
    );

    let sum = |sizes: &BTreeMap<String, Vec<u64>>, functions: &[&str]| -> u64 {
        functions.iter().map(|f| total(sizes, f)).sum()
    };
    let at_peak = ["weights", "cache", "activations", "stage"];
    let all = ["weights", "cache", "activations", "stage", "churn"];
    let totals = &diff["total"];
    assert_eq!(totals["peak_a"].as_u64(), Some(sum(&sizes_a, &at_peak)));
    assert_eq!(totals["peak_b"].as_u64(), Some(sum(&sizes_b, &at_peak)));
    assert_eq!(totals["peak_change"].as_i64(), Some(16 * MIB as i64));
    assert_eq!(totals["allocated_a"].as_u64(), Some(sum(&sizes_a, &all)));
    assert_eq!(totals["allocated_b"].as_u64(), Some(sum(&sizes_b, &all)));
    assert_eq!(totals["allocated_change"].as_i64(), Some(22 * MIB as i64));
    assert_eq!(diff["a"]["peak_bytes"], totals["peak_a"]);
    // No Python frames in either log: no per-category section.
    assert!(diff.get("categories").is_none(), "{diff}");

    // Text: the same order, signed changes, a totals line.
    let text = stdout_of(&[OsStr::new("diff"), log_a.as_os_str(), log_b.as_os_str()]);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("(report_views.c:"))
        .collect();
    assert_eq!(rows.len(), 5, "{text}");
    assert!(
        rows[0].contains("+32.00 MiB") && rows[0].contains(&label("weights")),
        "{text}"
    );
    assert!(
        rows[1].contains("+6.00 MiB") && rows[1].contains(&label("churn")),
        "{text}"
    );
    assert!(
        rows[4].contains("-16.00 MiB") && rows[4].contains(&label("cache")),
        "{text}"
    );
    let totals_line = text.lines().last().unwrap_or_default();
    assert!(totals_line.ends_with("total"), "{text}");
    assert!(totals_line.contains("+16.00 MiB") && totals_line.contains("+22.00 MiB"));

    // --device -1: only the pinned staging buffer, unchanged.
    let host = json_of(&[
        OsStr::new("diff"),
        OsStr::new("--json"),
        OsStr::new("--device"),
        OsStr::new("-1"),
        log_a.as_os_str(),
        log_b.as_os_str(),
    ]);
    let stacks = arr(&host["stacks"]);
    assert_eq!(stacks.len(), 1, "{host}");
    assert_eq!(innermost(&stacks[0]), label("stage"));
    assert_eq!(stacks[0]["peak_change"], 0);

    // A recording against itself: no change anywhere.
    let same = json_of(&[
        OsStr::new("diff"),
        OsStr::new("--json"),
        log_a.as_os_str(),
        log_a.as_os_str(),
    ]);
    assert!(
        arr(&same["stacks"])
            .iter()
            .all(|r| r["peak_change"] == 0 && r["allocated_change"] == 0)
    );
}
