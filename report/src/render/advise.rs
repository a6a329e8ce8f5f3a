//! `vramshim advise`: the suggestions, most bytes first, each with its evidence.

use std::io::{self, Write};

use serde_json::{Value, json};

use super::device_name;
use crate::analysis::advise::Suggestion;
use crate::units::bytes;

pub struct AdviseReport<'a> {
    pub suggestions: &'a [Suggestion],
}

pub fn text(out: &mut dyn Write, report: &AdviseReport<'_>) -> io::Result<()> {
    if report.suggestions.is_empty() {
        writeln!(
            out,
            "no suggestion: no growth across steps, activations and optimizer state below their thresholds, no allocator setting that holds less"
        )?;
    }
    for (rank, suggestion) in report.suggestions.iter().enumerate() {
        let place = match (suggestion.device, suggestion.pid) {
            (Some(device), _) => device_name(device),
            (None, Some(pid)) => format!("process {pid}"),
            (None, None) => String::new(),
        };
        writeln!(
            out,
            "{}. [{}] {}: frees {}",
            rank + 1,
            suggestion.kind.name(),
            place,
            bytes(suggestion.bytes)
        )?;
        writeln!(out, "   {}", suggestion.action)?;
        for evidence in &suggestion.evidence {
            writeln!(out, "   - {evidence}")?;
        }
    }
    Ok(())
}

pub fn json(report: &AdviseReport<'_>) -> Value {
    json!({
        "suggestions": report.suggestions.iter().enumerate().map(|(rank, s)| json!({
            "rank": rank + 1,
            "kind": s.kind.name(),
            "device": s.device,
            "pid": s.pid,
            "bytes": s.bytes,
            "action": s.action,
            "evidence": s.evidence,
            "file": s.line.as_ref().map(|(file, _)| &**file),
            "line": s.line.as_ref().map(|(_, line)| line),
        })).collect::<Vec<_>>(),
    })
}
