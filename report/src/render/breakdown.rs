//! `vramshim breakdown`: bytes per category at each device's peak and over time, with the
//! top stacks of each category at the peak.

use std::io::{self, Write};

use serde_json::{Value, json};

use super::{device_name, group_json, processes_json, share, write_groups, write_processes};
use crate::analysis::breakdown::{Category, DeviceBreakdown};
use crate::analysis::groups::StackGroup;
use crate::replay::Process;
use crate::units::{bytes, seconds};

/// One device's breakdown with the stacks of each category at its peak.
pub struct DeviceView<'a> {
    pub breakdown: &'a DeviceBreakdown,
    /// Per category, in [`Category::ALL`] order: the peak's live set by stack.
    pub stacks: Vec<Vec<StackGroup>>,
}

pub struct BreakdownReport<'a> {
    pub processes: &'a [Process],
    pub devices: Vec<DeviceView<'a>>,
    /// Stacks and frames per category in text.
    pub top: usize,
    pub frames: usize,
}

pub fn text(out: &mut dyn Write, report: &BreakdownReport<'_>) -> io::Result<()> {
    write_processes(out, report.processes)?;
    if report.devices.is_empty() {
        writeln!(out, "\nno device allocations recorded")?;
    }
    for view in &report.devices {
        let device = view.breakdown;
        writeln!(
            out,
            "\n{}: peak {} at {}",
            device_name(device.device),
            bytes(device.peak_bytes),
            seconds(device.peak_t_ns)
        )?;
        writeln!(
            out,
            "  {:<16} {:>11} {:>7}  {:>11} (at)",
            "category", "at peak", "share", "own max"
        )?;
        for category in Category::ALL {
            let index = category as usize;
            writeln!(
                out,
                "  {:<16} {:>11} {:>6.1}%  {:>11} ({})",
                category.name(),
                bytes(device.at_peak[index]),
                share(device.at_peak[index], device.peak_bytes),
                bytes(device.max[index]),
                seconds(device.max_t_ns[index])
            )?;
        }
        writeln!(
            out,
            "  allocator cache: not known (a per-tensor recording has no reserved bytes)"
        )?;
        for category in Category::ALL {
            let groups = &view.stacks[category as usize];
            if groups.is_empty() {
                continue;
            }
            writeln!(out, "  {} at the peak, by stack:", category.name())?;
            write_groups(out, groups, device.peak_bytes, report.top, report.frames)?;
        }
    }
    Ok(())
}

pub fn json(report: &BreakdownReport<'_>) -> Value {
    json!({
        "processes": processes_json(report.processes),
        "devices": report.devices.iter().map(|view| {
            let device = view.breakdown;
            json!({
                "device": device.device,
                "peak_bytes": device.peak_bytes,
                "peak_t_ns": device.peak_t_ns,
                "allocator_cache_bytes": Value::Null,
                "categories": Category::ALL.iter().map(|&category| {
                    let index = category as usize;
                    json!({
                        "category": category.name(),
                        "at_peak_bytes": device.at_peak[index],
                        "at_peak_share": share(device.at_peak[index], device.peak_bytes),
                        "max_bytes": device.max[index],
                        "max_t_ns": device.max_t_ns[index],
                        "stacks": view.stacks[category as usize]
                            .iter()
                            .map(|group| group_json(group, device.peak_bytes, report.processes))
                            .collect::<Vec<_>>(),
                    })
                }).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
    })
}
