//! `vramshim lines LOG [--file FILE]...`: the user's source lines that allocated, beside
//! their source text.

use std::process::ExitCode;
use std::rc::Rc;

use crate::Failure;
use crate::analysis::lines::{LineKey, LineStats, Lines, UserFiles};
use crate::analysis::peaks::Peaks;
use crate::commands::common::{Select, emit};
use crate::render::lines::{self, FileView, LinesReport};
use crate::replay::{self, Stop, View};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    select: Select,
    /// Only lines of this source file (the recorded path, or its trailing components:
    /// `train.py`, `models/net.py`); repeatable. Default: every file outside the Python
    /// library and installed packages.
    #[arg(long = "file", value_name = "FILE")]
    files: Vec<String>,
}

/// One file's lines that allocated, in line order.
type FileLines = (Rc<str>, Vec<(u32, LineStats)>);

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let files = if args.files.is_empty() {
        UserFiles::Default
    } else {
        UserFiles::Named(args.files.clone())
    };
    let mut analysis = Lines::new(files, select.device);
    let mut peaks = Peaks::default();
    let replay = replay::run_view(
        &select.logs,
        &mut [&mut analysis, &mut peaks],
        Stop::End,
        View::Tensors,
    )?;
    let processes = &replay.processes;
    for snapshot in peaks.snapshots(&replay.state, select.device) {
        if !snapshot.device.is_some_and(|d| analysis.counts(d)) {
            continue;
        }
        for live in &snapshot.allocations {
            if let Some((key, via)) = analysis.charged(processes, live) {
                let stats = analysis.lines.entry(key).or_default();
                stats.at_peak_bytes = stats.at_peak_bytes.saturating_add(live.size);
                if via {
                    stats.via_autograd_at_peak_bytes =
                        stats.via_autograd_at_peak_bytes.saturating_add(live.size);
                }
            }
        }
    }
    // Files by bytes allocated, largest first; lines in source order.
    let mut by_file: Vec<FileLines> = Vec::new();
    let mut entries: Vec<(LineKey, _)> = analysis.lines.into_iter().collect();
    entries.sort_by(|(a, _), (b, _)| a.cmp(b));
    for ((file, line), stats) in entries {
        match by_file.last_mut() {
            Some((last, lines)) if *last == file => lines.push((line, stats)),
            _ => by_file.push((file, vec![(line, stats)])),
        }
    }
    let total = |lines: &[(u32, LineStats)]| {
        lines
            .iter()
            .map(|(_, s)| s.allocated_bytes)
            .fold(0u64, u64::saturating_add)
    };
    by_file.sort_by(|(a_file, a), (b_file, b)| total(b).cmp(&total(a)).then(a_file.cmp(b_file)));
    let files = by_file
        .into_iter()
        .map(|(file, lines)| FileView::read(file, lines))
        .collect();
    let report = LinesReport { processes, files };
    let mut warnings: Vec<String> = replay.device_warning(select.device).into_iter().collect();
    warnings.extend(replay.warnings());
    emit(
        select,
        &warnings,
        || lines::json(&report),
        |out| lines::text(out, &report),
    )
}
