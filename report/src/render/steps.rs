//! `vramshim steps`: per process, each training step's peak and end-of-step live bytes, and
//! the lines that leak when memory grows across steps.

use std::io::{self, Write};

use serde_json::{Value, json};

use super::lines::FileView;
use super::{processes_json, write_processes};
use crate::analysis::lines::LineStats;
use crate::analysis::steps::{Leak, ProcessSteps};
use crate::replay::Process;
use crate::units::{bytes, counted, seconds};

pub struct StepsReport<'a> {
    pub processes: &'a [Process],
    pub steps: &'a [ProcessSteps],
}

/// The source text of a leak's line, where the recorded file can be read.
pub fn source_of(leak: &Leak) -> Option<String> {
    FileView::read(leak.file.clone(), vec![(leak.line, LineStats::default())])
        .lines
        .pop()
        .and_then(|(_, _, text)| text)
}

fn signed(delta: i64) -> String {
    if delta < 0 {
        format!("-{}", bytes(delta.unsigned_abs()))
    } else {
        format!("+{}", bytes(delta.unsigned_abs()))
    }
}

pub fn text(out: &mut dyn Write, report: &StepsReport<'_>) -> io::Result<()> {
    write_processes(out, report.processes)?;
    if report.steps.is_empty() {
        writeln!(
            out,
            "\nno steps found (no allocation under a torch/optim/ frame, and no model call made three times)"
        )?;
    }
    for found in report.steps {
        let pid = report
            .processes
            .get(found.process as usize)
            .map_or(0, |p| p.header.pid);
        // The last step, when the log ends within it: said once, in the heading.
        let open = match found.steps.last() {
            Some(last) if last.open => format!(
                "; step {} ends with the log, its live bytes not compared",
                found.steps.len()
            ),
            _ => String::new(),
        };
        match &found.by_call {
            Some((file, line)) => writeln!(
                out,
                "\nprocess {pid}: {} (no optimizer; each ends where the model call at {file}:{line} starts again{open})",
                counted(found.steps.len() as u64, "step")
            )?,
            None => writeln!(
                out,
                "\nprocess {pid}: {} (each ends where the optimizer's step ends{open})",
                counted(found.steps.len() as u64, "step")
            )?,
        }
        writeln!(
            out,
            "  {:>5} {:>11} {:>11} {:>11} {:>11} {:>12}",
            "step", "start", "end", "peak", "live at end", "growth"
        )?;
        let growth = found.growth();
        for (index, step) in found.steps.iter().enumerate() {
            let delta = index
                .checked_sub(1)
                .and_then(|i| growth.get(i))
                .map_or_else(String::new, |d| signed(*d));
            writeln!(
                out,
                "  {:>5} {:>11} {:>11} {:>11} {:>11} {:>12}",
                index + 1,
                seconds(step.start_t_ns),
                seconds(step.end_t_ns),
                bytes(step.peak_bytes),
                bytes(step.end_bytes),
                delta
            )?;
        }
        if !found.grows() {
            writeln!(out, "  no growth across steps")?;
            continue;
        }
        writeln!(
            out,
            "  memory grows at the end of every step from step 3 on; never freed:"
        )?;
        if found.leaks.is_empty() {
            writeln!(out, "    (no allocation of steps 2 to N-1 is still live)")?;
        }
        for leak in &found.leaks {
            writeln!(
                out,
                "    {}:{} in {}: {} in {} allocations over {} steps ({} per step)",
                leak.file,
                leak.line,
                leak.function,
                bytes(leak.bytes),
                leak.count,
                leak.per_step.len(),
                leak.per_step
                    .iter()
                    .map(|b| bytes(*b))
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
            if let Some(source) = source_of(leak) {
                writeln!(out, "      {}", source.trim())?;
            }
        }
    }
    Ok(())
}

/// One leak as JSON.
pub fn leak_json(leak: &Leak) -> Value {
    json!({
        "file": &*leak.file,
        "line": leak.line,
        "function": leak.function,
        "source": source_of(leak),
        "bytes": leak.bytes,
        "count": leak.count,
        "per_step_bytes": leak.per_step,
    })
}

pub fn json(report: &StepsReport<'_>) -> Value {
    json!({
        "processes": processes_json(report.processes),
        "steps": report.steps.iter().map(|found| {
            let growth = found.growth();
            json!({
                "pid": report.processes.get(found.process as usize).map(|p| p.header.pid),
                "grows": found.grows(),
                "split_by": match &found.by_call {
                    Some((file, line)) => json!({"model_call": {"file": &**file, "line": line}}),
                    None => json!("optimizer_step"),
                },
                "steps": found.steps.iter().enumerate().map(|(index, step)| json!({
                    "step": index + 1,
                    "start_t_ns": step.start_t_ns,
                    "end_t_ns": step.end_t_ns,
                    "peak_bytes": step.peak_bytes,
                    "end_bytes": step.end_bytes,
                    "forward_calls": step.forward_calls,
                    "ends_with_log": step.open,
                    "growth_bytes": index.checked_sub(1).and_then(|i| growth.get(i)),
                })).collect::<Vec<_>>(),
                "leaks": found.leaks.iter().map(leak_json).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
    })
}
