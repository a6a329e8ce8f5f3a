//! `vramshim advise LOG...`: ranked suggestions, each with its evidence and the bytes it
//! would free, from the breakdown, the steps and (for the allocator's cache) `whatif`.

use std::process::ExitCode;

use crate::Failure;
use crate::analysis::advise::{self, CacheEvidence};
use crate::commands::common::{Select, emit};
use crate::commands::{breakdown, steps, whatif};
use crate::render::advise::{self as render, AdviseReport};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    select: Select,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let devices = breakdown::devices(&select.logs, select.device)?;
    let found = steps::find(&select.logs, select.device)?;
    let mut warnings = Vec::new();
    // The allocator setting that `whatif` proves best, for each device with a cache worth
    // asking about (one log only: whatif simulates one process).
    let mut caches = Vec::new();
    for device in devices.iter().filter(|d| advise::cache_worth_asking(d)) {
        let [log] = select.logs.as_slice() else {
            warnings.push("allocator settings are simulated for one log at a time".to_string());
            break;
        };
        let args = whatif::Args::defaults_for(log.clone(), Some(device.device));
        match whatif::with_report(&args, |report, _| {
            let default = report.rows.iter().find(|row| row.conf.is_empty())?;
            let best = report.rows.first()?;
            Some(CacheEvidence {
                device: device.device,
                default_peak_reserved: default.stats.peak_reserved,
                best_conf: best.conf.clone(),
                best_peak_reserved: best.stats.peak_reserved,
            })
        }) {
            Ok(Some(evidence)) => caches.push(evidence),
            Ok(None) => {}
            Err(failure) => warnings.push(format!(
                "device {}: no allocator setting simulated: {}",
                device.device, failure.message
            )),
        }
    }
    let suggestions = advise::suggest(&devices, &found, &caches);
    let report = AdviseReport {
        suggestions: &suggestions,
    };
    emit(
        select,
        &warnings,
        || render::json(&report),
        |out| render::text(out, &report),
    )
}
