//! `vramshim html`: the page of a real log written under the real preload, opened in headless
//! Chromium (from `scripts/fetch-chromium.sh`, cached). The page must raise no console message
//! and its rendered DOM must hold the program's exact figures. Without Chromium the browser
//! checks print `SKIPPED: <why>`, unless `VRAMSHIM_REQUIRE_CONSUMERS=1`.
//!
//! The program is `report_views a`: on device 0, `weights` 64 MiB (freed at the end), `cache`
//! 24 MiB (never freed), 4 × 1 MiB churn, `activations` 16 MiB (the peak: 104 MiB in 3
//! allocations), then a 1 TiB `cudaMalloc` that fails; 2 MiB of pinned host memory.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// Chromium from `fetch-chromium.sh`, or why there is none.
fn chromium() -> Option<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-chromium.sh");
        let output = Command::new("bash")
            .arg(script)
            .output()
            .expect("run fetch-chromium.sh");
        assert!(output.status.success(), "fetch-chromium.sh: {output:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        for line in stdout.lines() {
            if let Some(path) = line.strip_prefix("chromium=") {
                return Ok(PathBuf::from(path));
            }
            if let Some(why) = line.strip_prefix("chromium!=") {
                return Err(why.to_string());
            }
        }
        Err(format!("fetch-chromium.sh said nothing: {stdout}"))
    });
    match found {
        Ok(path) => Some(path.clone()),
        Err(why) => {
            assert!(
                std::env::var_os("VRAMSHIM_REQUIRE_CONSUMERS").is_none(),
                "html: chromium unavailable: {why}"
            );
            skipped(&format!("html: chromium unavailable: {why}"));
            None
        }
    }
}

/// The DOM of `page` (with `fragment` after `#`, if any) once its scripts ran, and the
/// console messages the page raised.
fn render(chromium: &Path, page: &Path, fragment: &str, profile: &Path) -> (String, Vec<String>) {
    let mut url = format!("file://{}", page.display());
    if !fragment.is_empty() {
        url.push('#');
        url.push_str(fragment);
    }
    // `timeout`: a browser that hangs fails the test instead of the whole suite.
    let output = Command::new("timeout")
        .arg("300")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(&url)
        .output()
        .expect("run chromium");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "chromium {url} failed: {:?}\n{stderr}",
        output.status
    );
    let console = stderr
        .lines()
        .filter(|line| line.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        console,
    )
}

/// The part of `dom` from `start` to the next `end` after it (to the end when none).
fn part<'a>(dom: &'a str, start: &str, end: &str) -> &'a str {
    let from = dom
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} not in the page"));
    let rest = &dom[from..];
    let to = rest[start.len()..]
        .find(end)
        .map_or(rest.len(), |i| i + start.len());
    &rest[..to]
}

fn assert_contains(text: &str, wanted: &str, what: &str) {
    assert!(text.contains(wanted), "{what}: {wanted:?} not in:\n{text}");
}

#[test]
fn html_page_shows_the_recording_in_a_browser() {
    let run = run_under_shim("html-views", "report_views", &["a"], &[]);
    assert!(
        run.output.status.success(),
        "report_views: {}",
        run.stderr()
    );
    let log = run.log();
    let page = run.dir.join("report.html");
    let (code, _, stderr) = vramshim(&[
        "html".as_ref(),
        log.as_os_str(),
        "-o".as_ref(),
        page.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "vramshim html: {stderr}");
    assert_contains(&stderr, &format!("wrote {}", page.display()), "stderr");
    let html = std::fs::read_to_string(&page).expect("read the page");
    // Self-contained: nothing loaded from elsewhere.
    for outside in ["<link", " src=", "href=\"http", "url(http", "import "] {
        assert!(
            !html.contains(outside),
            "the page loads something: {outside:?}"
        );
    }

    let Some(chromium) = chromium() else {
        return;
    };
    let (dom, console) = render(&chromium, &page, "", &run.dir.join("profile"));
    assert_eq!(console, Vec::<String>::new(), "console messages");
    assert_contains(&dom, "data-ready=\"true\"", "the script finished");

    let source = source("report_views");
    let line_of = |marker: &str| marker_line(&source, marker);
    let peak_json = json_of(&["peak".as_ref(), "--json".as_ref(), log.as_os_str()]);
    let peak_t_ns = peak_json["devices"][0]["t_ns"].as_u64().expect("peak t_ns");
    let peak_seconds = format!("{:.6}s", peak_t_ns as f64 / 1e9);

    // The overview: device 0's row with its exact figures.
    let summary = part(&dom, "<tr data-device=\"0\">", "</tr>");
    assert_contains(
        summary,
        &format!("data-value=\"{}\">104.00 MiB<", 104 * MIB),
        "summary",
    );
    assert_contains(
        summary,
        &format!("data-value=\"{peak_t_ns}\">{peak_seconds}<"),
        "summary",
    );
    assert_contains(summary, "data-value=\"3\">3 allocations<", "summary");
    assert_contains(
        summary,
        &format!("data-value=\"{}\">24.00 MiB in 1<", 24 * MIB),
        "summary",
    );
    assert_contains(
        summary,
        "<td class=\"num\" data-value=\"1\">1</td>",
        "summary failures",
    );
    let host = part(&dom, "<tr data-device=\"-1\">", "</tr>");
    assert_contains(
        host,
        &format!("data-value=\"{}\">2.00 MiB<", 2 * MIB),
        "pinned host",
    );

    // A timeline per device, with the peak and the failure drawn.
    let timeline = part(&dom, "<div class=\"timeline\" data-device=\"0\">", "</svg>");
    assert_contains(
        timeline,
        &format!("device 0: peak 104.00 MiB at {peak_seconds}"),
        "timeline",
    );
    assert_contains(timeline, "class=\"peak\"", "timeline peak");
    assert_eq!(
        timeline.matches("class=\"failure\"").count(),
        1,
        "one failure line"
    );
    assert_contains(
        &dom,
        "<div class=\"timeline\" data-device=\"-1\">",
        "host timeline",
    );

    // Flame graphs: the peak's three stacks, the leak, the live set at the failure.
    let flame_peak = part(&dom, "id=\"flame-peak-0\"", "class=\"flamegraph\"");
    for (bytes, marker, function) in [
        (64 * MIB, "VIEW: weights", "weights"),
        (24 * MIB, "VIEW: cache", "cache"),
        (16 * MIB, "VIEW: activations", "activations"),
    ] {
        let label = format!("{function} (report_views.c:{})", line_of(marker));
        assert_contains(
            flame_peak,
            &format!("data-bytes=\"{bytes}\" style="),
            "peak flame graph",
        );
        assert_contains(flame_peak, &format!(">{label}</div>"), "peak flame graph");
    }
    assert_contains(
        flame_peak,
        &format!("class=\"root\" data-bytes=\"{}\"", 104 * MIB),
        "peak root",
    );
    let flame_leaks = part(&dom, "id=\"flame-leaks-0\"", "class=\"flamegraph\"");
    assert_contains(
        flame_leaks,
        &format!("class=\"root\" data-bytes=\"{}\"", 24 * MIB),
        "leaks root",
    );
    assert_contains(
        flame_leaks,
        &format!(">cache (report_views.c:{})</div>", line_of("VIEW: cache")),
        "leaks",
    );
    assert!(!flame_leaks.contains(">weights ("), "weights was freed");
    let flame_oom = part(&dom, "id=\"flame-oom-1\"", "</section>");
    assert_contains(
        flame_oom,
        &format!("class=\"root\" data-bytes=\"{}\"", 88 * MIB),
        "live at the failure: weights + cache",
    );

    // The OOM verdict.
    let failure = part(&dom, "<div class=\"failure\"", "</table>");
    assert_contains(
        failure,
        &format!("data-request=\"{}\" data-device=\"0\"", 1u64 << 40),
        "failure",
    );
    assert_contains(
        failure,
        "Failure 1: cudaMalloc of 1.00 TiB on device 0",
        "failure",
    );
    assert_contains(failure, "exceeded the device's free memory", "verdict");
    assert_contains(
        failure,
        &format!("oversized (report_views.c:{})", line_of("VIEW: oversized")),
        "failure stack",
    );

    // Top stacks at the peak, largest first.
    let top = part(&dom, "class=\"top-stacks\" data-device=\"0\"", "</table>");
    let weights = top.find(">weights (").expect("weights in top stacks");
    let cache = top.find(">cache (").expect("cache in top stacks");
    assert!(weights < cache, "largest stack first");

    // The allocator view: 6 successful cudaMallocs (weights, 4 churn, activations), 1
    // failed; the cache, a driver-API cuMemAlloc beside them, is shown apart.
    let allocator = part(
        &dom,
        "class=\"allocator-device\" data-device=\"0\"",
        "</table>",
    );
    assert_contains(
        allocator,
        &format!("data-value=\"6\">6 ({}), 1 failed<", "84.00 MiB"),
        "allocator",
    );
    assert_contains(
        allocator,
        &format!(
            "data-value=\"1\">1 ({}), peak {}<",
            "24.00 MiB", "24.00 MiB"
        ),
        "allocator libraries",
    );

    // The whatif table: the same rows as `vramshim whatif --json`.
    let whatif: Value = json_of(&["whatif".as_ref(), "--json".as_ref(), log.as_os_str()]);
    let configs = arr(&whatif["configs"]);
    let table = part(&dom, "id=\"whatif-table\"", "</table>");
    assert_eq!(
        table.matches("<tr>").count(),
        configs.len() + 1,
        "a row per setting"
    );
    let best = configs[0]["peak_reserved"].as_u64().expect("peak_reserved");
    assert_contains(
        table,
        &format!("<td>(default)</td><td class=\"num\" data-value=\"{best}\">"),
        "best setting",
    );

    // A search in the flame graphs: `cache` is 24 MiB of the 104 MiB peak.
    let (searched, console) = render(
        &chromium,
        &page,
        "search=cache",
        &run.dir.join("profile-search"),
    );
    assert_eq!(console, Vec::<String>::new(), "console messages");
    let flame_peak = part(&searched, "id=\"flame-peak-0\"", "class=\"flamegraph\"");
    assert_contains(flame_peak, "matched 24.00 MiB (23.1%)", "search");
    assert_contains(
        flame_peak,
        &format!("class=\"match\" data-bytes=\"{}\"", 24 * MIB),
        "search",
    );
}

#[test]
fn html_page_of_two_logs_says_why_whatif_is_absent() {
    let first = run_under_shim("html-two-a", "report_views", &["calm"], &[]);
    let second = run_under_shim("html-two-b", "report_views", &["b"], &[]);
    assert!(first.output.status.success() && second.output.status.success());
    let page = first.dir.join("both.html");
    let (code, _, stderr) = vramshim(&[
        "html".as_ref(),
        first.log().as_os_str(),
        second.log().as_os_str(),
        "-o".as_ref(),
        page.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "vramshim html: {stderr}");
    let Some(chromium) = chromium() else {
        return;
    };
    let (dom, console) = render(&chromium, &page, "", &first.dir.join("profile"));
    assert_eq!(console, Vec::<String>::new(), "console messages");
    assert_contains(&dom, "data-ready=\"true\"", "the script finished");
    assert_contains(
        &dom,
        "id=\"whatif-absent\">whatif simulates one log at a time",
        "whatif",
    );
    // Two processes in the overview.
    let processes = part(&dom, "<h3>Processes</h3>", "</table>");
    assert_eq!(processes.matches("<tr>").count(), 3, "header + 2 processes");
}

#[test]
fn html_refuses_a_file_that_is_not_a_log() {
    let dir = scratch("html-bad");
    let bad = dir.join("not-a-log.vlog");
    std::fs::write(&bad, b"hello").expect("write");
    let page = dir.join("out.html");
    let (code, _, stderr) = vramshim(&[
        "html".as_ref(),
        bad.as_os_str(),
        "-o".as_ref(),
        page.as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.starts_with("vramshim: "), "{stderr}");
    assert!(!page.exists(), "no page for a bad log");
}

#[test]
fn html_page_draws_the_programs_marks() {
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/marks.py");
    let dir = scratch("html-marks");
    let output = shim_command(&machine_python(), &dir)
        .arg(&script)
        .env("PYTHONPATH", &package)
        .output()
        .expect("run marks.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "marks.py: {output:?}");
    assert_eq!(
        stdout,
        "recording True\nmark epoch 1 True\nmark epoch 2 True\nmark free </script> & done True\n"
    );
    let run = Run { output, dir };
    let log = run.log();

    // The log holds the three marks, stamped between the allocations they surround.
    let records = dump(&log);
    let marks: Vec<(&str, u64)> = records
        .iter()
        .filter(|r| r["type"] == "mark")
        .map(|r| (r["text"].as_str().expect("text"), u64_of(r, "t_ns")))
        .collect();
    let texts: Vec<&str> = marks.iter().map(|(text, _)| *text).collect();
    assert_eq!(texts, ["epoch 1", "epoch 2", "free </script> & done"]);
    let allocs: Vec<u64> = events(&records)
        .into_iter()
        .filter(|e| e["event"] == "alloc" && u64_of(e, "size") == 64 * MIB)
        .map(|e| u64_of(e, "t_ns"))
        .collect();
    assert_eq!(allocs.len(), 2, "two 64 MiB allocations");
    assert!(
        marks[0].1 < allocs[0]
            && allocs[0] < marks[1].1
            && marks[1].1 < allocs[1]
            && allocs[1] < marks[2].1,
        "marks {marks:?} around allocations {allocs:?}"
    );
    let timeline = json_of(&["timeline".as_ref(), "--json".as_ref(), log.as_os_str()]);
    let timeline_marks: Vec<(&str, u64)> = arr(&timeline["marks"])
        .iter()
        .map(|m| (m["text"].as_str().expect("text"), u64_of(m, "t_ns")))
        .collect();
    assert_eq!(timeline_marks, marks, "timeline --json marks");

    // `peak --at mark:TEXT`: what was live at the mark.
    for (mark, bytes, count) in [
        ("epoch 1", 0, 0),
        ("epoch 2", 64 * MIB, 1),
        ("free </script> & done", 128 * MIB, 2),
    ] {
        let at = format!("mark:{mark}");
        let peak = json_of(&[
            "peak".as_ref(),
            "--json".as_ref(),
            "--at".as_ref(),
            at.as_ref(),
            log.as_os_str(),
        ]);
        let live: (u64, u64) = arr(&peak["devices"])
            .iter()
            .find(|d| d["device"] == 0)
            .map_or((0, 0), |d| (u64_of(d, "bytes"), u64_of(d, "count")));
        assert_eq!(live, (bytes, count), "live at {at}");
    }
    let (code, _, stderr) = vramshim(&[
        "peak".as_ref(),
        "--at".as_ref(),
        "mark:epoch 9".as_ref(),
        log.as_os_str(),
    ]);
    assert_eq!(code, Some(2));
    assert_eq!(
        stderr,
        "vramshim: --at mark:epoch 9: no such mark; the log's marks: \"epoch 1\", \"epoch 2\", \"free </script> & done\"\n"
    );

    let page = run.dir.join("marks.html");
    let (code, _, stderr) = vramshim(&[
        "html".as_ref(),
        log.as_os_str(),
        "-o".as_ref(),
        page.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "vramshim html: {stderr}");
    let Some(chromium) = chromium() else {
        return;
    };
    let (dom, console) = render(&chromium, &page, "", &run.dir.join("profile"));
    assert_eq!(console, Vec::<String>::new(), "console messages");
    let timeline = part(&dom, "<div class=\"timeline\" data-device=\"0\">", "</svg>");
    let labels: Vec<&str> = timeline
        .split("class=\"mark-label\">")
        .skip(1)
        .map(|rest| &rest[..rest.find('<').expect("label end")])
        .collect();
    assert_eq!(
        labels,
        ["epoch 1", "epoch 2", "free &lt;/script&gt; &amp; done"]
    );
    let table = part(&dom, "id=\"marks\"", "</table>");
    for (text, t_ns) in [
        ("epoch 1", marks[0].1),
        ("epoch 2", marks[1].1),
        ("free &lt;/script&gt; &amp; done", marks[2].1),
    ] {
        assert_contains(
            table,
            &format!(
                "data-value=\"{t_ns}\">{:.6}s</td><td>{text}</td>",
                t_ns as f64 / 1e9
            ),
            "marks table",
        );
    }
}

#[test]
fn html_pages_of_other_programs_raise_no_console_message() {
    // VMM on two devices (device 1 has no memory sample), stream-ordered pools, threads,
    // expandable segments, and a fork's two logs on one page.
    let mut pages = Vec::new();
    for program in [
        "vmm",
        "async",
        "report_threads",
        "report_alloc_expandable",
        "report_fork",
    ] {
        let run = run_under_shim(&format!("html-{program}"), program, &[], &[]);
        assert!(run.output.status.success(), "{program}: {}", run.stderr());
        let page = run.dir.join(format!("{program}.html"));
        let mut args = vec!["html".into(), "-o".into(), page.clone().into_os_string()];
        args.extend(run.logs().into_iter().map(PathBuf::into_os_string));
        let (code, _, stderr) = vramshim(&args);
        assert_eq!(code, Some(0), "vramshim html of {program}: {stderr}");
        pages.push((program, page, run));
    }
    let Some(chromium) = chromium() else {
        return;
    };
    for (program, page, run) in &pages {
        let (dom, console) = render(&chromium, page, "", &run.dir.join("profile"));
        assert_eq!(console, Vec::<String>::new(), "{program}: console messages");
        assert_contains(&dom, "data-ready=\"true\"", program);
        if *program == "vmm" {
            let device1 = part(
                &dom,
                "class=\"allocator-device\" data-device=\"1\"",
                "</table>",
            );
            assert_contains(device1, "no memory sample", "vmm device 1");
        }
        if *program == "report_fork" {
            let processes = part(&dom, "<h3>Processes</h3>", "</table>");
            assert_eq!(
                processes.matches("<tr>").count(),
                3,
                "header + parent + child"
            );
        }
    }
}
