//! Python call stacks: a real CPython runs `tests/python/alloc_stacks.py` under the real
//! preload, allocating through the fake runtime with the GIL released (`ctypes.CDLL`) and held
//! (`ctypes.PyDLL`), and the reports must name the exact `file:line` and function of every
//! Python frame. `python3` runs every test; `other_cpython_versions` runs the exact check on
//! every other supported version installed with pyenv (3.9 to 3.14).

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// The script, by absolute path (code objects record the path the script was run by).
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/alloc_stacks.py")
}

/// An installed interpreter of version `3.minor` (pyenv layout), if any; `free_threaded` picks
/// the free-threaded build (`3.13.0t`) instead of the default one.
fn python_version(minor: u32, free_threaded: bool) -> Option<PathBuf> {
    let home = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(home.join("versions"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(OsStr::to_str).is_some_and(|n| {
                n.starts_with(&format!("3.{minor}.")) && n.ends_with('t') == free_threaded
            })
        })
        .map(|p| p.join("bin/python3"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop()
}

fn minor_of(python: &Path) -> u32 {
    let output = Command::new(python)
        .args(["-c", "import sys; print(sys.version_info[1])"])
        .output()
        .expect("run python");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("python minor version")
}

fn run_script(test: &str, python: &Path, env: &[(&str, &str)]) -> Run {
    run_script_at(&script(), test, python, env)
}

/// Runs `script` under the shim (scratch directory `test`); it must succeed and print "done".
fn run_script_at(script: &Path, test: &str, python: &Path, env: &[(&str, &str)]) -> Run {
    let dir = scratch(test);
    let mut command = shim_command(python, &dir);
    command.arg(script);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run python");
    let run = Run { output, dir };
    assert!(
        run.output.status.success(),
        "python failed: {}",
        run.stderr()
    );
    assert_eq!(run.stdout(), "done\n");
    run
}

/// The line of the script ending in `# MARKER`.
fn line_of(marker: &str) -> u64 {
    let text = std::fs::read_to_string(script()).expect("read script");
    let lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_end().ends_with(&format!("# {marker}")))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(lines.len(), 1, "marker {marker}");
    lines[0] as u64
}

/// `vramshim COMMAND --json --stacks VIEW LOG`: (bytes, count, frames) per stack of device 0.
fn groups(command: &str, view: &str, log: &Path) -> Vec<(u64, u64, Vec<Value>)> {
    let output = tool(&[
        OsStr::new(command),
        OsStr::new("--json"),
        OsStr::new("--stacks"),
        OsStr::new(view),
        log.as_os_str(),
    ]);
    assert!(output.status.success(), "{output:?}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("report JSON");
    let devices = report["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 1, "{report}");
    assert_eq!(devices[0]["device"], 0);
    devices[0]["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|g| {
            (
                u64_of(g, "bytes"),
                u64_of(g, "count"),
                g["frames"].as_array().expect("frames").clone(),
            )
        })
        .collect()
}

const K: u64 = 4096;

/// Bytes, allocation count and (function, line) of the Python frames of one stack.
type Expected = (u64, u64, Vec<(&'static str, u64)>);

/// The name reports give a function on CPython 3.`minor`: its qualified name from 3.11, its
/// plain name (`co_name`) before, as code objects have no qualified name there.
fn name(minor: u32, qualified: &'static str, plain: &'static str) -> &'static str {
    if minor >= 11 { qualified } else { plain }
}

/// Python frames expected for each allocation site (innermost first) on CPython 3.`minor`:
/// bytes, count, and (function, line in the script). Thread frames below `worker` are in
/// threading.py.
fn expected(minor: u32) -> Vec<Expected> {
    vec![
        (
            (20 + 21 + 22 + 23) * K,
            4,
            vec![("worker", line_of("site: thread"))],
        ),
        (8 * K, 1, vec![("<module>", line_of("site: module"))]),
        (
            7 * K,
            1,
            vec![
                ("with_gil", line_of("site: gil")),
                ("<module>", line_of("call: gil")),
            ],
        ),
        (
            6 * K,
            1,
            vec![
                ("in_except", line_of("site: except")),
                ("<module>", line_of("call: except")),
            ],
        ),
        (
            5 * K,
            1,
            vec![
                ("in_with", line_of("site: with")),
                ("<module>", line_of("call: with")),
            ],
        ),
        (
            4 * K,
            1,
            vec![
                ("gen", line_of("site: generator")),
                ("<module>", line_of("call: generator")),
            ],
        ),
        (
            3 * K,
            1,
            vec![
                ("<lambda>", line_of("site: lambda")),
                ("<module>", line_of("call: lambda")),
            ],
        ),
        (
            2 * K,
            1,
            vec![
                (
                    name(minor, "Model.forward", "forward"),
                    line_of("site: method"),
                ),
                ("<module>", line_of("call: method")),
            ],
        ),
        (
            K,
            1,
            vec![
                (
                    name(minor, "outer.<locals>.inner", "inner"),
                    line_of("site: inner"),
                ),
                ("outer", line_of("call: inner")),
                ("<module>", line_of("call: outer")),
            ],
        ),
    ]
}

fn is_python(frame: &Value) -> bool {
    frame["module"] == "[python]"
}

/// Checks the python, mixed and native views of `leaks` and `peak` for the script's log,
/// written by CPython 3.`minor`.
fn check_exact_python_stacks(log: &Path, minor: u32) {
    let script = script().to_string_lossy().into_owned();
    let thread_tail = [
        name(minor, "Thread.run", "run"),
        name(minor, "Thread._bootstrap_inner", "_bootstrap_inner"),
        name(minor, "Thread._bootstrap", "_bootstrap"),
    ];
    for command in ["leaks", "peak"] {
        let python = groups(command, "python", log);
        let want = expected(minor);
        assert_eq!(python.len(), want.len(), "{command}: {python:#?}");
        for ((bytes, count, frames), (want_bytes, want_count, want_frames)) in
            python.iter().zip(&want)
        {
            assert_eq!((*bytes, *count), (*want_bytes, *want_count), "{command}");
            let got: Vec<(String, u64)> = frames
                .iter()
                .take(want_frames.len())
                .map(|f| {
                    assert!(is_python(f), "{f}");
                    assert_eq!(f["file"], script.as_str(), "{f}");
                    (
                        f["function"].as_str().unwrap_or("").to_owned(),
                        u64_of(f, "line"),
                    )
                })
                .collect();
            let want_frames: Vec<(String, u64)> = want_frames
                .iter()
                .map(|(f, l)| ((*f).to_owned(), *l))
                .collect();
            assert_eq!(got, want_frames, "{command}, {bytes} bytes");
            let rest: Vec<&str> = frames[want_frames.len()..]
                .iter()
                .map(|f| f["function"].as_str().unwrap_or(""))
                .collect();
            if want_frames[0].0 == "worker" {
                assert_eq!(rest, thread_tail, "{command}");
                assert!(frames[1..].iter().all(|f| {
                    f["file"]
                        .as_str()
                        .is_some_and(|p| p.ends_with("/threading.py"))
                        && u64_of(f, "line") > 0
                }));
            } else {
                assert!(rest.is_empty(), "{command}: {rest:?}");
            }
        }

        // Mixed: the same Python frames, in order, in place of the eval loop's frames; the
        // fake runtime's cudaMalloc is innermost.
        let mixed = groups(command, "mixed", log);
        assert_eq!(mixed.len(), python.len());
        for ((bytes, _, frames), (py_bytes, _, py_frames)) in mixed.iter().zip(&python) {
            assert_eq!(bytes, py_bytes);
            assert_eq!(frames[0]["function"], "cudaMalloc", "{command}");
            let python_part: Vec<&Value> = frames.iter().filter(|f| is_python(f)).collect();
            assert_eq!(
                python_part,
                py_frames.iter().collect::<Vec<_>>(),
                "{command}"
            );
            assert!(
                frames
                    .iter()
                    .all(|f| f["function"] != "_PyEval_EvalFrameDefault"),
                "{command}: an eval-loop frame was not replaced"
            );
            // Python frames come after the ctypes call that made the allocation.
            let first_python = frames.iter().position(is_python).expect("python frame");
            assert!(
                frames[..first_python]
                    .iter()
                    .any(|f| f["function"] == "_ctypes_callproc")
            );
        }

        // Native: no Python frames; the eval loop shows.
        let native = groups(command, "native", log);
        assert!(!native.is_empty());
        for (_, _, frames) in &native {
            assert!(!frames.iter().any(is_python), "{command}");
            assert!(
                frames
                    .iter()
                    .any(|f| f["function"] == "_PyEval_EvalFrameDefault")
            );
        }
    }
}

fn notes(dump: &[Value]) -> Vec<String> {
    dump.iter()
        .filter(|r| r["type"] == "note")
        .map(|r| r["text"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Runs the script on CPython 3.`minor` and checks its log exactly: no note, each code object
/// defined once with its version, and every view of every stack.
fn check_version(python: &Path, minor: u32) {
    let run = run_script(&format!("py-exact-3{minor}"), python, &[]);
    assert_eq!(run.stderr(), "");
    let log = run.log();
    let dump = dump(&log);
    assert_eq!(dump[0]["stack_mode"], "mixed");
    assert_eq!(notes(&dump), Vec::<String>::new(), "3.{minor}");
    let codes: Vec<&Value> = dump.iter().filter(|r| r["type"] == "code").collect();
    // Each code object defined once: the 10 of the script plus threading's 3.
    assert_eq!(codes.len(), 13, "3.{minor}: {codes:#?}");
    for code in &codes {
        assert_eq!(code["python"], format!("3.{minor}"));
    }
    check_exact_python_stacks(&log, minor);
}

/// With a wrong offset (the test hook moves the frame's code field), the one-time check must
/// catch it: one note, no Python frame, native stacks as usual.
fn check_layout_mismatch(python: &Path, minor: u32) {
    let run = run_script(
        &format!("py-mismatch-3{minor}"),
        python,
        &[("VRAMSHIM_TEST_PY_LAYOUT_BREAK", "1")],
    );
    assert_eq!(run.stderr(), "");
    let log = run.log();
    let dump = dump(&log);
    assert_eq!(
        notes(&dump),
        [format!(
            "python stacks unavailable: the frame layout of CPython 3.{minor} does not match \
             the running interpreter; recording native stacks only"
        )]
    );
    assert!(!dump.iter().any(|r| r["type"] == "code"));
    let events = events(&dump);
    assert_eq!(events.len(), 12);
    assert_default_stacks(&events);
    for stack in dump.iter().filter(|r| r["type"] == "stack") {
        let frames = stack["frames"].as_array().expect("frames");
        assert!(!frames.is_empty() && frames.iter().all(Value::is_u64));
    }
    let mixed = groups("leaks", "mixed", &log);
    assert_eq!(mixed.iter().map(|g| g.1).sum::<u64>(), 12);
    for (_, _, frames) in &mixed {
        assert!(!frames.iter().any(is_python));
        assert!(
            frames
                .iter()
                .any(|f| f["function"] == "_PyEval_EvalFrameDefault")
        );
    }
}

/// An interpreter the recorder has no layout for: one note saying `why`, native stacks, the
/// program's behaviour unchanged.
fn check_refused(python: &Path, label: &str, why: &str) {
    let run = run_script(&format!("py-refused-{label}"), python, &[]);
    assert_eq!(run.stderr(), "");
    let dump = dump(&run.log());
    assert_eq!(
        notes(&dump),
        [format!(
            "python stacks unavailable: {why}; recording native stacks only"
        )]
    );
    assert!(!dump.iter().any(|r| r["type"] == "code"));
    let events = events(&dump);
    assert_eq!(events.len(), 12);
    assert_default_stacks(&events);
}

#[test]
fn python_stacks_name_exact_lines_with_and_without_the_gil() {
    let python = machine_python();
    let minor = minor_of(&python);
    assert!(
        (9..=13).contains(&minor),
        "machine python 3.{minor}: these tests expect 3.9 to 3.13 (set VRAMSHIM_TEST_PYTHON)"
    );
    check_version(&python, minor);
}

#[test]
fn python_stack_mode_records_python_frames_only() {
    let python = machine_python();
    let minor = minor_of(&python);
    let run = run_script("py-only", &python, &[("VRAMSHIM_STACK", "python")]);
    let dump = dump(&run.log());
    assert_eq!(dump[0]["stack_mode"], "python");
    let stacks: Vec<&Value> = dump.iter().filter(|r| r["type"] == "stack").collect();
    assert_eq!(stacks.len(), 9);
    for stack in stacks {
        let frames = stack["frames"].as_array().expect("frames");
        assert!(frames.iter().all(|f| f.is_object()), "{stack}");
    }
    let python = groups("leaks", "mixed", &run.log());
    let want = expected(minor);
    assert_eq!(python.len(), want.len());
    for ((_, _, frames), (_, _, want_frames)) in python.iter().zip(&want) {
        assert_eq!(frames[0]["function"], want_frames[0].0);
        assert_eq!(u64_of(&frames[0], "line"), want_frames[0].1);
    }
}

#[test]
fn native_stack_mode_records_no_python_frames() {
    let run = run_script(
        "py-native",
        &machine_python(),
        &[("VRAMSHIM_STACK", "native")],
    );
    let dump = dump(&run.log());
    assert!(!dump.iter().any(|r| r["type"] == "code"));
    for stack in dump.iter().filter(|r| r["type"] == "stack") {
        assert!(
            stack["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .all(Value::is_u64)
        );
    }
}

/// (function, line) of a stack's Python frames, innermost first.
type PyFrames = Vec<(String, u64)>;

/// A script of tests/python run to its end under the shim with the machine's Python (it
/// prints "done"), its lines marked `# marker` to find them.
struct ScriptRun {
    run: Run,
    minor: u32,
    text: String,
    file: String,
}

impl ScriptRun {
    fn new(name: &str, scratch_name: &str) -> ScriptRun {
        let python = machine_python();
        let minor = minor_of(&python);
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("python")
            .join(name);
        ScriptRun {
            run: run_script_at(&script, scratch_name, &python, &[]),
            minor,
            text: std::fs::read_to_string(&script).expect("read script"),
            file: script.to_string_lossy().into_owned(),
        }
    }

    /// The line ending with `# marker` (there must be exactly one).
    fn line(&self, marker: &str) -> u64 {
        let found: Vec<usize> = self
            .text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.trim_end().ends_with(&format!("# {marker}")))
            .map(|(i, _)| i + 1)
            .collect();
        assert_eq!(found.len(), 1, "marker {marker}");
        found[0] as u64
    }

    /// The Python frames among `frames` (each in this script), innermost first.
    fn python_frames(&self, frames: &[Value]) -> PyFrames {
        frames
            .iter()
            .filter(|f| is_python(f))
            .map(|f| {
                assert_eq!(f["file"], self.file.as_str(), "{f}");
                (
                    f["function"].as_str().unwrap_or("").to_owned(),
                    u64_of(f, "line"),
                )
            })
            .collect()
    }
}

/// A thread's next stack reuses the native or the Python part of its last one when its walk
/// finds that part unchanged (`tests/python/alloc_alternating.py`): one Python line reached
/// through two native paths in turn, then two lines through one native path in turn. Each
/// allocation must get its own whole stack: per mixed stack, its exact bytes, count and Python
/// frames; the two native paths differ and the two lines share theirs.
#[test]
fn consecutive_stacks_sharing_one_part_stay_whole() {
    let script = ScriptRun::new("alloc_alternating.py", "py-alternating");
    let (minor, run) = (script.minor, &script.run);
    let line = |marker: &str| script.line(marker);
    let python_frames = |frames: &[Value]| script.python_frames(frames);
    let native_frames = |frames: &[Value]| -> Vec<Value> {
        frames.iter().filter(|f| !is_python(f)).cloned().collect()
    };
    let one_line = vec![
        (
            "one_line_two_native_paths".to_owned(),
            line("site: one line"),
        ),
        ("<module>".to_owned(), line("call: one line")),
    ];
    let lines = |site: &str| {
        vec![
            ("two_lines_one_native_path".to_owned(), line(site)),
            ("<module>".to_owned(), line("call: two lines")),
        ]
    };
    // leaks --stacks mixed: largest first; every allocation is alive at exit.
    let mixed = groups("leaks", "mixed", &run.log());
    let got: Vec<(u64, u64, PyFrames)> = mixed
        .iter()
        .map(|(bytes, count, frames)| (*bytes, *count, python_frames(frames)))
        .collect();
    assert_eq!(
        got,
        vec![
            (12 * K, 3, lines("site: even")),
            (9 * K, 3, lines("site: odd")),
            (6 * K, 3, one_line.clone()),
            (3 * K, 3, one_line.clone()),
        ],
        "minor {minor}"
    );
    for (_, _, frames) in &mixed {
        assert_eq!(frames[0]["function"], "cudaMalloc");
        assert!(
            frames
                .iter()
                .all(|f| f["function"] != "_PyEval_EvalFrameDefault"),
            "an eval-loop frame was not replaced: {frames:?}"
        );
    }
    // The one line's two native paths differ; the two lines' native frames are the same.
    assert_ne!(native_frames(&mixed[2].2), native_frames(&mixed[3].2));
    assert_eq!(native_frames(&mixed[0].2), native_frames(&mixed[1].2));
    // The native view: the partial's path is a stack of its own (the direct calls' stacks
    // may differ by the eval loop's call site, from version to version).
    let native = groups("leaks", "native", &run.log());
    let total = native.iter().fold((0, 0), |(b, c), g| (b + g.0, c + g.1));
    assert_eq!(total, (30 * K, 12));
    assert!(
        native.iter().any(|g| (g.0, g.1) == (6 * K, 3)),
        "{native:?}"
    );
}

/// One innermost Python frame, at the same place and instruction each time, reached from six
/// caller lines in turn (`tests/python/alloc_many_callers.py`): more than the walks a thread
/// keeps for one innermost frame, so walks are replayed from several kept ones and some are
/// displaced. Each allocation must get its own caller's line: per mixed stack, its exact
/// bytes, count and Python frames.
#[test]
fn one_frame_reached_from_more_lines_than_kept_names_each_line() {
    let script = ScriptRun::new("alloc_many_callers.py", "py-many-callers");
    let (minor, line) = (script.minor, |marker: &str| script.line(marker));
    let got: Vec<(u64, u64, PyFrames)> = groups("leaks", "mixed", &script.run.log())
        .iter()
        .map(|(bytes, count, frames)| (*bytes, *count, script.python_frames(frames)))
        .collect();
    // leaks: largest first; every allocation is alive at exit (4 rounds of each line).
    let expected: Vec<(u64, u64, PyFrames)> = (1..=6u64)
        .rev()
        .map(|n| {
            (
                4 * n * K,
                4,
                vec![
                    ("inner".to_owned(), line("site: inner")),
                    (
                        "six_lines_one_inner".to_owned(),
                        line(&format!("call: {n}")),
                    ),
                    ("<module>".to_owned(), line("call: six lines")),
                ],
            )
        })
        .collect();
    assert_eq!(got, expected, "minor {minor}");
}

#[test]
fn frame_layout_mismatch_turns_python_capture_off_cleanly() {
    let python = machine_python();
    let minor = minor_of(&python);
    check_layout_mismatch(&python, minor);
}

/// Every supported version installed with pyenv gets the exact check and the mismatch check
/// (3.9 / 3.10: frame objects and their own line tables, plain names; 3.11 / 3.12: tables;
/// 3.13: `_Py_DebugOffsets`; 3.14: `_Py_DebugOffsets`, untested until a 3.14 is installed).
/// Versions without a layout and free-threaded builds must be refused with a note. Versions
/// not installed are skipped and named (CI has only its `python3`).
#[test]
fn other_cpython_versions() {
    let mut checked = Vec::new();
    let mut missing = Vec::new();
    for minor in 9u32..=14 {
        match python_version(minor, false) {
            Some(python) => {
                assert_eq!(minor_of(&python), minor, "{}", python.display());
                check_version(&python, minor);
                check_layout_mismatch(&python, minor);
                checked.push(format!("3.{minor}"));
            }
            None => missing.push(format!("3.{minor}")),
        }
    }
    // Versions without a layout: one note, native stacks, nothing else changes.
    for minor in [8u32, 15] {
        match python_version(minor, false) {
            Some(python) => {
                check_refused(
                    &python,
                    &format!("3{minor}"),
                    &format!("no frame layout for CPython 3.{minor} (supported: 3.9 to 3.14)"),
                );
                checked.push(format!("3.{minor} (refused)"));
            }
            None => missing.push(format!("3.{minor}")),
        }
    }
    // Free-threaded builds: other object headers, and no table for them.
    for minor in [13u32, 14] {
        match python_version(minor, true) {
            Some(python) => {
                check_refused(
                    &python,
                    &format!("3{minor}t"),
                    &format!(
                        "free-threaded CPython 3.{minor} (no frame layout for free-threaded \
                         builds)"
                    ),
                );
                checked.push(format!("3.{minor}t (refused)"));
            }
            None => missing.push(format!("3.{minor}t")),
        }
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.join(", ")
        }
    };
    eprintln!(
        "other_cpython_versions: checked {}; not installed, skipped: {}",
        list(&checked),
        list(&missing)
    );
    if !missing.is_empty() {
        skipped(&format!(
            "python_stacks: CPython {} not installed (pyenv), their exact checks did not run",
            list(&missing)
        ));
    }
}
