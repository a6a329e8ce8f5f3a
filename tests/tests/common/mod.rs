//! Running the C test programs under the real preload and reading what the real `vramshim`
//! tool says about the log.

#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

/// Where the fakes and the test programs were built.
pub fn c_dir() -> PathBuf {
    PathBuf::from(env!("VRAMSHIM_TEST_C_DIR"))
}

pub fn program(name: &str) -> PathBuf {
    c_dir().join("bin").join(name)
}

pub fn fake_lib_dir() -> PathBuf {
    c_dir().join("lib")
}

/// The cargo target directory of this build (`target/debug`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/<test> -> target/debug
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

pub fn shim() -> PathBuf {
    let path = target_dir().join("libvramshim.so");
    assert!(
        path.is_file(),
        "{} missing: run `cargo build --workspace` before the tests (scripts/test.sh does)",
        path.display()
    );
    path
}

pub fn vramshim_tool() -> PathBuf {
    let path = target_dir().join("vramshim");
    assert!(
        path.is_file(),
        "{} missing: run `cargo build --workspace` first",
        path.display()
    );
    path
}

/// A fresh, empty directory for one test's logs.
pub fn scratch(name: &str) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let dir = target_dir().join("test-scratch").join(format!(
        "{name}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A program run under the shim, with its logs.
pub struct Run {
    pub output: Output,
    pub dir: PathBuf,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    /// Every `.vlog` file written, sorted by name.
    pub fn logs(&self) -> Vec<PathBuf> {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .expect("scratch dir")
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension() == Some(OsStr::new("vlog")))
            .collect();
        logs.sort();
        logs
    }
    /// The single log written; fails the test if there is not exactly one.
    pub fn log(&self) -> PathBuf {
        let logs = self.logs();
        assert_eq!(
            logs.len(),
            1,
            "expected one log, got {logs:?}\nstderr:\n{}",
            self.stderr()
        );
        logs[0].clone()
    }
    /// The log of process `pid`.
    pub fn log_of(&self, pid: u32) -> PathBuf {
        let path = self.dir.join(format!("{pid}.vlog"));
        assert!(path.is_file(), "no log for pid {pid}: {:?}", self.logs());
        path
    }
}

/// Runs a test program with the shim preloaded and the fake driver on the library path; each
/// process writes `<scratch>/<pid>.vlog`.
pub fn run_under_shim(test: &str, program_name: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = scratch(test);
    let mut command = shim_command(&program(program_name), &dir);
    command.args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run test program");
    Run { output, dir }
}

/// `exe` with the shim preloaded, the fakes on the library path, default settings, and each
/// process logging to `<log_dir>/<pid>.vlog`.
pub fn shim_command(exe: &Path, log_dir: &Path) -> Command {
    let mut command = Command::new(exe);
    command
        .env("LD_PRELOAD", shim())
        .env("LD_LIBRARY_PATH", fake_lib_dir())
        .env("VRAMSHIM_OUTPUT", log_dir.join("%p.vlog"))
        .env_remove("VRAMSHIM_STACK")
        .env_remove("VRAMSHIM_MODE");
    command
}

/// Runs a test program without the shim (for comparisons).
pub fn run_plain(program_name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(program(program_name));
    command.args(args).env("LD_LIBRARY_PATH", fake_lib_dir());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run test program")
}

/// Runs `vramshim ARGS` and returns its output.
pub fn tool(args: &[&OsStr]) -> Output {
    Command::new(vramshim_tool())
        .args(args)
        .output()
        .expect("run vramshim")
}

/// `value` as a JSON array (fails the test otherwise).
pub fn arr(value: &Value) -> &Vec<Value> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
}

/// The source text of test program `program` (tests/programs/PROGRAM.c).
pub fn source(program: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("programs")
        .join(format!("{program}.c"));
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The line of `/* MARKER */` in a test program's source text; exactly one must exist.
pub fn marker_line(program_source: &str, marker: &str) -> u64 {
    let text = format!("/* {marker} */");
    let lines: Vec<u64> = program_source
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(&text))
        .map(|(index, _)| index as u64 + 1)
        .collect();
    assert_eq!(lines.len(), 1, "{text:?} must be on exactly one line");
    lines[0]
}

/// `vramshim ARGS`: exit code, stdout, stderr (lossily decoded).
pub fn vramshim<S: AsRef<OsStr>>(args: &[S]) -> (Option<i32>, String, String) {
    let args: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
    let output = tool(&args);
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `vramshim ARGS`, which must succeed with JSON on stdout.
pub fn json_of<S: AsRef<OsStr>>(args: &[S]) -> Value {
    let (code, stdout, stderr) = vramshim(args);
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_owned()).collect();
    assert_eq!(code, Some(0), "vramshim {shown:?} failed: {stderr}");
    serde_json::from_str(&stdout)
        .unwrap_or_else(|err| panic!("vramshim {shown:?}: bad JSON: {err}\n{stdout}"))
}

/// The real interpreter behind `python3` (not a launcher script such as pyenv's shim);
/// `VRAMSHIM_TEST_PYTHON` overrides it.
pub fn machine_python() -> PathBuf {
    if let Some(python) = std::env::var_os("VRAMSHIM_TEST_PYTHON") {
        return PathBuf::from(python);
    }
    let output = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 runs (the tests need Python 3)");
    assert!(output.status.success(), "python3 failed: {output:?}");
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// `vramshim dump --json LOG`, parsed: one value per line. Fails the test on any error.
pub fn dump(log: &Path) -> Vec<Value> {
    let output = tool(&[OsStr::new("dump"), OsStr::new("--json"), log.as_os_str()]);
    assert!(
        output.status.success(),
        "vramshim dump failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|err| panic!("bad JSON line {line:?}: {err}"))
        })
        .collect()
}

/// The event records of a dump.
pub fn events(dump: &[Value]) -> Vec<&Value> {
    dump.iter().filter(|v| v["type"] == "event").collect()
}

/// The log's graph-pool levels, in order: (the call that set it, the pool's bytes).
pub fn graph_pool_levels(events: &[&Value]) -> Vec<(String, u64)> {
    events
        .iter()
        .filter(|e| e["event"] == "graph_pool")
        .map(|e| {
            (
                e["api"].as_str().unwrap_or("").to_string(),
                u64_of(e, "size"),
            )
        })
        .collect()
}

/// Events with the given `event` kind and `api`.
pub fn select<'a>(events: &[&'a Value], event: &str, api: &str) -> Vec<&'a Value> {
    events
        .iter()
        .copied()
        .filter(|e| e["event"] == event && e["api"] == api)
        .collect()
}

/// Whether an event gives memory back (free, release, unmap, unreserve, a PyTorch block's
/// free): such events carry
/// no stack unless `VRAMSHIM_FREE_STACKS=1`.
pub fn is_release(event: &Value) -> bool {
    [
        "free",
        "release",
        "unmap",
        "unreserve",
        "tensor_free_requested",
        "tensor_free",
    ]
    .iter()
    .any(|kind| event["event"] == *kind)
}

/// Every acquiring event has a stack and, with the default `VRAMSHIM_FREE_STACKS`, no release
/// has one.
pub fn assert_default_stacks(events: &[&Value]) {
    for event in events {
        assert_eq!(
            u64_of(event, "stack") != 0,
            !is_release(event),
            "stack of {event}"
        );
    }
}

pub fn u64_of(value: &Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} missing or not an integer in {value}"))
}

pub fn i64_of(value: &Value, field: &str) -> i64 {
    value[field]
        .as_i64()
        .unwrap_or_else(|| panic!("{field} missing or not an integer in {value}"))
}

/// Count of events by (event, api).
pub fn tally(events: &[&Value]) -> HashMap<(String, String), usize> {
    let mut counts = HashMap::new();
    for event in events {
        let key = (
            event["event"].as_str().unwrap_or_default().to_owned(),
            event["api"].as_str().unwrap_or_default().to_owned(),
        );
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

/// One line the test programs print per operation:
/// `<op> <api> dev=<d> addr=0x<hex> size=<n> rc=<code>` plus optional `key=value` fields.
#[derive(Debug, Clone)]
pub struct ProgramOp {
    pub op: String,
    pub api: String,
    pub fields: HashMap<String, String>,
}

impl ProgramOp {
    pub fn num(&self, key: &str) -> u64 {
        let raw = self
            .fields
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing in {self:?}"));
        match raw.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("bad hex {raw}")),
            None => raw
                .parse::<i64>()
                .map(|n| n as u64)
                .unwrap_or_else(|_| panic!("bad number {raw}")),
        }
    }
    pub fn int(&self, key: &str) -> i64 {
        self.num(key) as i64
    }
}

/// Parses the operation lines of a program's stdout (other lines are ignored).
pub fn program_ops(stdout: &str) -> Vec<ProgramOp> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let op = words.next()?.to_owned();
            let api = words.next()?.to_owned();
            let fields: HashMap<String, String> = words
                .filter_map(|w| w.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
                .collect();
            fields
                .contains_key("rc")
                .then_some(ProgramOp { op, api, fields })
        })
        .collect()
}

/// Checks that `xml` is one well-formed XML document (balanced, matching tags, valid
/// attributes, only predefined or character references) and returns its character data,
/// references resolved, one line per element end.
pub fn well_formed(xml: &str) -> String {
    use quick_xml::events::Event;

    let mut reader = quick_xml::Reader::from_str(xml);
    let mut depth = 0usize;
    let mut roots = 0;
    let mut text = String::new();
    let check_attributes = |start: &quick_xml::events::BytesStart<'_>| {
        for attribute in start.attributes() {
            let attribute = attribute.unwrap_or_else(|err| panic!("bad attribute: {err}"));
            attribute
                .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                .unwrap_or_else(|err| panic!("bad attribute value: {err}"));
        }
    };
    loop {
        let event = reader.read_event().unwrap_or_else(|err| {
            panic!("not well-formed at byte {}: {err}", reader.error_position())
        });
        match event {
            Event::Eof => break,
            Event::Start(start) => {
                check_attributes(&start);
                if depth == 0 {
                    roots += 1;
                }
                depth += 1;
            }
            Event::Empty(start) => {
                check_attributes(&start);
                if depth == 0 {
                    roots += 1;
                }
            }
            Event::End(_) => {
                depth = depth.checked_sub(1).expect("end tag without start");
                text.push('\n');
            }
            Event::Text(chars) => {
                let chars = chars.decode().expect("text decodes");
                assert!(
                    depth > 0 || chars.trim().is_empty(),
                    "text outside the root: {chars:?}"
                );
                text.push_str(&chars);
            }
            Event::GeneralRef(reference) => {
                if let Some(c) = reference
                    .resolve_char_ref()
                    .expect("valid character reference")
                {
                    text.push(c);
                } else {
                    let name = reference.decode().expect("reference decodes");
                    let resolved = quick_xml::escape::resolve_xml_entity(&name)
                        .unwrap_or_else(|| panic!("undefined entity &{name};"));
                    text.push_str(resolved);
                }
            }
            _ => {}
        }
    }
    assert_eq!(depth, 0, "unclosed elements");
    assert_eq!(roots, 1, "one root element");
    text
}

/// Says that a check could not run: `SKIPPED: <what>` on stderr, and the same line appended to
/// `$VRAMSHIM_SKIPPED_FILE` when set, so that `scripts/test.sh` names every skip in its final
/// summary (the test harness keeps a passing test's output to itself).
pub fn skipped(what: &str) {
    let line = format!("SKIPPED: {what}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("VRAMSHIM_SKIPPED_FILE") {
        use std::io::Write;
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(file, "{line}");
        }
    }
}

/// The names of every entry in `dir` (not only `*.vlog`), sorted.
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| {
            entry
                .expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}
pub mod torch;

/// A size as `vramshim` prints it (`report/src/units.rs`): bytes below 1 KiB, else binary
/// units with two decimals.
pub fn printed_size(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// Bytes of a size as `vramshim` prints it ([`printed_size`]), to the print's precision.
pub fn parse_printed_size(text: &str) -> f64 {
    let (number, unit) = text
        .split_once(' ')
        .unwrap_or_else(|| panic!("not a printed size: {text:?}"));
    let number: f64 = number
        .parse()
        .unwrap_or_else(|err| panic!("not a printed size: {text:?}: {err}"));
    let scale = match unit {
        "B" => 1u64,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => panic!("not a printed size: {text:?}"),
    };
    number * scale as f64
}

/// Checks that `printed` is the line `vramshim run` prints for a log it compacted:
/// `vramshim: wrote LOG (SIZE; RECORDED as recorded)`, SIZE the log's size now and RECORDED
/// larger (the recorded size itself depends on how the recorder's chunks fell).
pub fn assert_compacted_wrote_line(log: &Path, printed: &str) {
    let size = std::fs::metadata(log)
        .unwrap_or_else(|err| panic!("{}: {err}", log.display()))
        .len();
    let start = format!(
        "vramshim: wrote {} ({}; ",
        log.display(),
        printed_size(size)
    );
    let recorded = printed
        .strip_prefix(&start)
        .and_then(|rest| rest.strip_suffix(" as recorded)"))
        .unwrap_or_else(|| panic!("{printed:?} is not {start:?}... as recorded)"));
    assert!(
        parse_printed_size(recorded) > size as f64,
        "{printed:?}: the recorded size is not larger"
    );
}
