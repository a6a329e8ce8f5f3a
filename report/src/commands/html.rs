//! `vramshim html LOG... [-o FILE]`: one self-contained HTML page of the whole recording (the
//! overview, timelines, flame graphs, OOM verdicts, allocator view, whatif table), built from
//! the same JSON documents the `--json` views print.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{Map, Value};

use crate::Failure;
use crate::commands::common::{ByThread, SegmentsArg, Select, StacksArg, write_file};
use crate::commands::{allocator, oom, peak, report, timeline, whatif};
use crate::render;

#[derive(clap::Args)]
pub struct Args {
    /// Log(s) to read; several logs of one job (one per process or rank) are merged in time
    /// order.
    #[arg(required = true, value_name = "LOG")]
    logs: Vec<PathBuf>,
    /// The page to write.
    #[arg(
        short,
        long,
        value_name = "FILE",
        default_value = "vramshim-report.html"
    )]
    output: PathBuf,
    /// Only this device ordinal (as the process numbered it; -1 = pinned host memory).
    #[arg(long, allow_hyphen_values = true)]
    device: Option<i32>,
    #[command(flatten)]
    view: StacksArg,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = Select {
        logs: args.logs.clone(),
        device: args.device,
        json: true,
    };
    let threads = ByThread { by_thread: false };
    let mut warnings: Vec<String> = Vec::new();
    let mut document = Map::new();
    let mut keep = |name: &str, (value, more): (Value, Vec<String>)| {
        for warning in more {
            if !warnings.contains(&warning) {
                warnings.push(warning);
            }
        }
        document.insert(name.to_string(), value);
    };
    keep(
        "summary",
        report::with_report(
            &select,
            args.view,
            threads,
            SegmentsArg::default(),
            |report, w| (render::summary::json(report), w),
        )?,
    );
    keep(
        "timeline",
        timeline::with_report(&select, None, SegmentsArg::default(), |report, w| {
            (render::timeline::json(report), w)
        })?,
    );
    keep(
        "allocator",
        allocator::with_report(&select, |report, w| (render::allocator::json(report), w))?,
    );
    keep(
        "oom",
        oom::with_report(
            &select,
            args.view,
            threads,
            SegmentsArg::default(),
            |report, w| (render::oom::json(&report), w),
        )?,
    );
    for (name, leaks) in [("peak", false), ("leaks", true)] {
        let mut view = peak::json_document(&select, args.view, leaks)?;
        let more = take_warnings(&mut view);
        keep(name, (view, more));
    }
    // whatif replays one tensor-level log; for anything else the page says why it is absent.
    let whatif_result = match args.logs.as_slice() {
        [log] => {
            let whatif_args = whatif::Args::defaults_for(log.clone(), args.device);
            whatif::with_report(&whatif_args, |report, w| (render::whatif::json(report), w))
                .map_err(|failure| failure.message)
        }
        _ => Err(
            "whatif simulates one log at a time: run `vramshim whatif LOG` on one process's log"
                .to_string(),
        ),
    };
    match whatif_result {
        Ok(table) => keep("whatif", table),
        Err(why) => keep("whatif", (Value::from(why), Vec::new())),
    }
    document.insert(
        "version".to_string(),
        Value::from(env!("CARGO_PKG_VERSION")),
    );
    document.insert(
        "logs".to_string(),
        args.logs
            .iter()
            .map(|log| Value::from(log.display().to_string()))
            .collect(),
    );
    document.insert("warnings".to_string(), Value::from(warnings.clone()));
    for warning in &warnings {
        eprintln!("vramshim: warning: {warning}");
    }
    let page = render::html::page(&Value::Object(document));
    write_file(&args.output, page.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// Removes a view's `warnings` (the page lists them once, for all views) and returns them.
fn take_warnings(view: &mut Value) -> Vec<String> {
    match view.as_object_mut().and_then(|map| map.remove("warnings")) {
        Some(Value::Array(list)) => list
            .into_iter()
            .filter_map(|w| w.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}
