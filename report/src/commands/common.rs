//! What every report command shares: which logs, which device, text or JSON, and output.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use crate::Failure;
use crate::analysis::groups::Stacks;
use crate::python::StackView;
use crate::render::frames::Fold;
use crate::replay::{Replay, View};

/// Which recording(s) to read and how to print.
#[derive(clap::Args, Clone, Debug)]
pub struct Select {
    /// Log(s) to read; several logs of one job (one per process or rank) are merged in time
    /// order and reported per process and in total.
    #[arg(required = true, value_name = "LOG")]
    pub logs: Vec<PathBuf>,
    /// Only this device ordinal (as the process numbered it; -1 = pinned host memory).
    #[arg(long, allow_hyphen_values = true)]
    pub device: Option<i32>,
    /// The same content as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Which frames stacks show (commands that print stacks flatten this beside [`Select`]).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct StacksArg {
    /// mixed: Python frames in place of the interpreter's eval loop; python: Python frames
    /// only (native ones where a stack has none); native: native frames only.
    #[arg(long, value_enum, default_value_t = StackView::Mixed)]
    pub stacks: StackView,
}

/// Whether text views fold the machinery's frames (commands that print stacks as text flatten
/// this; JSON always has every frame).
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct UnfoldArg {
    /// Text: show every frame of each stack, each name whole. By default the interpreter's,
    /// libffi's, pybind11's, the C++ runtime's, PyTorch's own frames (its C++ allocator, ATen,
    /// dispatcher and `Module.__call__` wrappers) and those where a process or thread began
    /// are folded so the program's frames come first, and C++ names longer than 80
    /// characters show with their parameters (then template arguments) elided.
    #[arg(long)]
    pub unfold: bool,
}

impl UnfoldArg {
    /// What the text views fold.
    pub fn fold(self) -> Fold {
        if self.unfold {
            Fold::Nothing
        } else {
            Fold::Machinery
        }
    }
}

/// Whether views that group by stack also split by thread (commands that group by stack
/// flatten this beside [`StacksArg`]).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct ByThread {
    /// Split each stack by the thread that allocated: groups are keyed by (process, thread,
    /// stack) and name their thread (`thread NAME (tid N, pid P)`; JSON: `thread`).
    #[arg(long)]
    pub by_thread: bool,
}

/// Tensors or segments, for logs of PyTorch's default caching allocator recorded with its
/// tensors (commands that count live memory flatten this). Logs without tensors read the same
/// either way.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct SegmentsArg {
    /// Count PyTorch's caching-allocator segments, as the driver handed them out, instead of
    /// the tensors inside them (for logs recorded with the allocator's tracker).
    #[arg(long)]
    pub segments: bool,
}

impl SegmentsArg {
    /// The replay's view: tensors unless `--segments`.
    pub fn view(self) -> View {
        if self.segments {
            View::Driver
        } else {
            View::Tensors
        }
    }
}

/// Prints `warnings` on stderr, then the JSON document or the text report on stdout.
pub fn emit(
    select: &Select,
    warnings: &[String],
    json: impl FnOnce() -> Value,
    text: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<ExitCode, Failure> {
    for warning in warnings {
        eprintln!("vramshim: warning: {warning}");
    }
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let written = if select.json {
        let mut value = json();
        if let Value::Object(map) = &mut value {
            map.insert("warnings".to_string(), Value::from(warnings.to_vec()));
        }
        serde_json::to_writer_pretty(&mut out, &value)
            .map_err(io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        text(&mut out)
    }
    .and_then(|()| out.flush());
    finish_stdout(written)
}

/// [`emit`] for documents too large to build whole: `json` writes the document (with
/// `"warnings"` in it) to the output as it goes.
pub fn emit_streamed(
    select: &Select,
    warnings: &[String],
    json: impl FnOnce(&mut dyn Write, &[String]) -> io::Result<()>,
    text: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<ExitCode, Failure> {
    for warning in warnings {
        eprintln!("vramshim: warning: {warning}");
    }
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let written = if select.json {
        json(&mut out, warnings).and_then(|()| writeln!(out))
    } else {
        text(&mut out)
    }
    .and_then(|()| out.flush());
    finish_stdout(written)
}

/// The exit of a command that wrote to stdout: a closed pipe (`| head`) is the reader's
/// choice, not an error; any other failure is exit code 1.
pub fn finish_stdout(written: io::Result<()>) -> Result<ExitCode, Failure> {
    match written {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(err) => Err(Failure {
            message: format!("cannot write output: {err}"),
            code: 1,
        }),
    }
}

/// Writes `data` to stdout.
pub fn write_stdout(data: &[u8]) -> Result<ExitCode, Failure> {
    let mut stdout = io::stdout().lock();
    finish_stdout(stdout.write_all(data).and_then(|()| stdout.flush()))
}

/// Writes an output file whole (nothing is left half-written by a failed render) and says so
/// on stderr.
pub fn write_file(path: &Path, data: &[u8]) -> Result<(), Failure> {
    std::fs::write(path, data).map_err(|err| Failure {
        message: format!("cannot write {}: {err}", path.display()),
        code: 1,
    })?;
    eprintln!("vramshim: wrote {}", path.display());
    Ok(())
}

/// A replay's warnings (with one for a `device` the logs do not have) followed by those of
/// symbolising its stacks.
pub fn warnings(replay: &Replay, device: Option<i32>, stacks: &Stacks) -> Vec<String> {
    let mut warnings = repeated_logs(replay);
    warnings.extend(replay.device_warning(device));
    warnings.extend(replay.warnings());
    warnings.extend(stacks.warnings());
    warnings
}

/// One line per log file read more than once (the same file under one or several names):
/// merged with itself, its allocations count twice.
fn repeated_logs(replay: &Replay) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut seen: Vec<((u64, u64), &Path)> = Vec::new();
    let mut warnings = Vec::new();
    for process in &replay.processes {
        let Ok(meta) = std::fs::metadata(&process.path) else {
            continue;
        };
        let id = (meta.dev(), meta.ino());
        match seen.iter().find(|(other, _)| *other == id) {
            Some((_, first)) if *first == process.path => warnings.push(format!(
                "{} is given twice: it is read twice, so its allocations count twice",
                first.display()
            )),
            Some((_, first)) => warnings.push(format!(
                "{} and {} are the same file: it is read twice, so its allocations count twice",
                first.display(),
                process.path.display()
            )),
            None => seen.push((id, &process.path)),
        }
    }
    warnings
}
