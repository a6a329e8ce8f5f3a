//! `vramshim breakdown`: bytes per category at each device's peak and over time, with the
//! top stacks of each category at the peak.

use std::io::{self, Write};

use serde_json::{Value, json};

use super::diff::signed_bytes;
use super::frames::Fold;
use super::{device_name, group_json, processes_json, share, write_groups, write_processes};
use crate::analysis::breakdown::{Category, DeviceBreakdown, DeviceChange, LIBRARIES};
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
    /// Which frames the text shows.
    pub fold: Fold,
}

pub fn text(out: &mut dyn Write, report: &BreakdownReport<'_>) -> io::Result<()> {
    write_processes(out, report.processes)?;
    if report.devices.is_empty() {
        writeln!(out, "\nno device allocations recorded")?;
    }
    for view in &report.devices {
        let device = view.breakdown;
        write_table(out, device)?;
        for category in Category::ALL {
            let groups = &view.stacks[category as usize];
            if groups.is_empty() {
                continue;
            }
            writeln!(out, "  {} at the peak, by stack:", category.name())?;
            write_groups(
                out,
                groups,
                device.whole(),
                report.top,
                report.frames,
                report.fold,
            )?;
        }
    }
    Ok(())
}

/// The categories of one device, with cache, context and used memory, as text.
pub fn write_table(out: &mut dyn Write, device: &DeviceBreakdown) -> io::Result<()> {
    let whole = device.whole();
    writeln!(
        out,
        "\n{}: peak {} of allocations at {}",
        device_name(device.device),
        bytes(device.peak_bytes),
        seconds(device.peak_t_ns)
    )?;
    writeln!(
        out,
        "  {:<20} {:>11} {:>7}  {:>11} {:>12} {:>11}",
        "category", "at peak", "share", "own max", "at", "allocated"
    )?;
    for category in Category::ALL {
        let index = category as usize;
        writeln!(
            out,
            "  {:<20} {:>11} {:>6.1}%  {:>11} {:>12} {:>11}",
            category.name(),
            bytes(device.at_peak[index]),
            share(device.at_peak[index], whole),
            bytes(device.max[index]),
            seconds(device.max_t_ns[index]),
            bytes(device.allocated[index])
        )?;
        if category == Category::Workspaces {
            for (library, (name, _)) in LIBRARIES.iter().enumerate() {
                if device.libraries_max[library] == 0 {
                    continue;
                }
                writeln!(
                    out,
                    "    {:<18} {:>11} {:>6.1}%  {:>11}",
                    name,
                    bytes(device.libraries_at_peak[library]),
                    share(device.libraries_at_peak[library], whole),
                    bytes(device.libraries_max[library]),
                )?;
            }
        }
    }
    if device.unused_activations_allocated > 0 {
        writeln!(
            out,
            "  of the activations, freed without a backward pass: {} allocated, at most {} live",
            bytes(device.unused_activations_allocated),
            bytes(device.unused_activations_max)
        )?;
    }
    if device.relu_kept_count > 0 {
        writeln!(
            out,
            "  of the activations, out-of-place ReLU outputs: {} in {}, at most {} live",
            bytes(device.relu_kept_allocated),
            device.relu_kept_count,
            bytes(device.relu_kept_max)
        )?;
    }
    match device.cache_at_peak {
        Some(cache) => writeln!(
            out,
            "  {:<20} {:>11} {:>6.1}%  {:>11}",
            "allocator_cache",
            bytes(cache),
            share(cache, whole),
            bytes(device.cache_max)
        )?,
        None => writeln!(
            out,
            "  allocator_cache      not known (the log has no allocator segments)"
        )?,
    }
    if let Some(unused) = device.unused_segments_at_peak.filter(|&unused| unused > 0) {
        writeln!(
            out,
            "    {:<18} {:>11} {:>6.1}%  (segments with no tensor in them: empty_cache() gives them back)",
            "unused segments",
            bytes(unused),
            share(unused, whole)
        )?;
    }
    match device.context {
        Some(context) => writeln!(
            out,
            "  {:<20} {:>11} {:>6.1}%  (device used less recorded, sampled)",
            "context_and_modules",
            bytes(context),
            share(context, whole)
        )?,
        None => writeln!(
            out,
            "  context_and_modules  not known (the log has no device memory samples)"
        )?,
    }
    match device.used_bytes() {
        Some(used) => writeln!(out, "  {:<20} {:>11}", "device used", bytes(used)),
        None => writeln!(out, "  {:<20} {:>11}", "held", bytes(device.held_bytes())),
    }
}

/// One device's figures as JSON, without stacks.
pub fn device_json(device: &DeviceBreakdown) -> Value {
    let whole = device.whole();
    json!({
        "device": device.device,
        "peak_bytes": device.peak_bytes,
        "peak_t_ns": device.peak_t_ns,
        "allocator_cache_bytes": device.cache_at_peak,
        "allocator_cache_share": device.cache_at_peak.map(|cache| share(cache, whole)),
        "allocator_cache_max_bytes": device.cache_at_peak.map(|_| device.cache_max),
        "allocator_cache_unused_segments_bytes": device.unused_segments_at_peak,
        "context_bytes": device.context,
        "context_share": device.context.map(|context| share(context, whole)),
        "held_bytes": device.held_bytes(),
        "autocast_seen": device.autocast,
        "relu_outputs_kept": {
            "count": device.relu_kept_count,
            "allocated_bytes": device.relu_kept_allocated,
            "max_bytes": device.relu_kept_max,
            "largest_bytes": device.relu_kept_largest,
            "inplace_peak_drop_bytes": device.relu_inplace_peak_drop,
            "inplace_forward_drop_bytes": device.relu_inplace_forward_drop,
        },
        "peak_in_forward": device.peak_in_forward,
        "activations_without_backward": {
            "max_bytes": device.unused_activations_max,
            "allocated_bytes": device.unused_activations_allocated,
        },
        "used_bytes": device.used_bytes(),
        "workspaces_by_library": LIBRARIES.iter().enumerate()
            .filter(|(library, _)| device.libraries_max[*library] > 0)
            .map(|(library, (name, _))| json!({
                "library": name,
                "at_peak_bytes": device.libraries_at_peak[library],
                "at_peak_share": share(device.libraries_at_peak[library], whole),
                "max_bytes": device.libraries_max[library],
            }))
            .collect::<Vec<_>>(),
        "categories": Category::ALL.iter().map(|&category| {
            let index = category as usize;
            json!({
                "category": category.name(),
                "at_peak_bytes": device.at_peak[index],
                "at_peak_share": share(device.at_peak[index], whole),
                "max_bytes": device.max[index],
                "max_t_ns": device.max_t_ns[index],
                "allocated_bytes": device.allocated[index],
            })
        }).collect::<Vec<_>>(),
    })
}

pub fn json(report: &BreakdownReport<'_>) -> Value {
    json!({
        "processes": processes_json(report.processes),
        "devices": report.devices.iter().map(|view| {
            let device = view.breakdown;
            let mut value = device_json(device);
            if let Some(categories) = value["categories"].as_array_mut() {
                for (category, stacks) in categories.iter_mut().zip(&view.stacks) {
                    category["stacks"] = stacks
                        .iter()
                        .map(|group| group_json(group, device.whole(), report.processes))
                        .collect();
                }
            }
            value
        }).collect::<Vec<_>>(),
    })
}

/// `report`'s breakdown section (text): each device's table, no stacks (pinned host memory
/// left out).
pub fn text_section(out: &mut dyn Write, devices: &[DeviceBreakdown]) -> io::Result<()> {
    let mut devices = devices.iter().filter(|d| d.device >= 0).peekable();
    if devices.peek().is_none() {
        return Ok(());
    }
    writeln!(out, "\nbreakdown (stacks: vramshim breakdown)")?;
    for device in devices {
        write_table(out, device)?;
    }
    Ok(())
}

/// `report`'s breakdown section (JSON), pinned host memory left out.
pub fn json_section(devices: &[DeviceBreakdown]) -> Value {
    Value::from(
        devices
            .iter()
            .filter(|d| d.device >= 0)
            .map(device_json)
            .collect::<Vec<_>>(),
    )
}

/// B − A where both sides know the figure.
fn side_change(sides: [Option<u64>; 2]) -> Option<i128> {
    match sides {
        [Some(a), Some(b)] => Some(i128::from(b) - i128::from(a)),
        _ => None,
    }
}

/// `diff`'s per-category section (text): each device's categories at each run's peak and
/// at their own highest, A, B and the change (pinned host memory left out).
pub fn diff_text_section(out: &mut dyn Write, devices: &[DeviceChange]) -> io::Result<()> {
    let mut devices = devices.iter().filter(|d| d.device >= 0).peekable();
    if devices.peek().is_none() {
        return Ok(());
    }
    let known = |figure: Option<u64>| figure.map_or_else(|| "-".to_string(), bytes);
    let changed =
        |sides: [Option<u64>; 2]| side_change(sides).map_or_else(|| "-".to_string(), signed_bytes);
    writeln!(
        out,
        "\nper category (at each run's own peak, and each category's own highest; vramshim breakdown for stacks):"
    )?;
    for device in devices {
        writeln!(
            out,
            "{}: peak A {}, B {} ({})",
            device_name(device.device),
            known(device.peak_bytes[0]),
            known(device.peak_bytes[1]),
            changed(device.peak_bytes)
        )?;
        writeln!(
            out,
            "  {:<32} {:>11} {:>11} {:>12}  {:>11} {:>11} {:>12}",
            "category", "at peak A", "at peak B", "change", "max A", "max B", "change"
        )?;
        for row in &device.rows {
            writeln!(
                out,
                "  {:<32} {:>11} {:>11} {:>12}  {:>11} {:>11} {:>12}",
                row.name,
                known(row.at_peak[0]),
                known(row.at_peak[1]),
                changed(row.at_peak),
                known(row.max[0]),
                known(row.max[1]),
                changed(row.max)
            )?;
        }
    }
    Ok(())
}

/// `diff`'s per-category section (JSON), pinned host memory left out; a figure a side does
/// not know (and its change) is null.
pub fn diff_json_section(devices: &[DeviceChange]) -> Value {
    let pair =
        |prefix: &str, sides: [Option<u64>; 2], value: &mut serde_json::Map<String, Value>| {
            value.insert(format!("{prefix}_a"), json!(sides[0]));
            value.insert(format!("{prefix}_b"), json!(sides[1]));
            value.insert(
                format!("{prefix}_change"),
                json!(
                    side_change(sides)
                        .map(|c| c.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
                ),
            );
        };
    Value::from(
        devices
            .iter()
            .filter(|d| d.device >= 0)
            .map(|device| {
                let mut value = serde_json::Map::new();
                value.insert("device".to_string(), json!(device.device));
                pair("peak", device.peak_bytes, &mut value);
                value.insert(
                    "categories".to_string(),
                    device
                        .rows
                        .iter()
                        .map(|row| {
                            let mut value = serde_json::Map::new();
                            value.insert("category".to_string(), json!(row.name));
                            pair("at_peak", row.at_peak, &mut value);
                            pair("max", row.max, &mut value);
                            pair("allocated", row.allocated, &mut value);
                            Value::Object(value)
                        })
                        .collect(),
                );
                Value::Object(value)
            })
            .collect::<Vec<_>>(),
    )
}
