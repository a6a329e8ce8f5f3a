//! `timeline` views: live bytes over time per device, as a terminal chart, JSON and SVG.

use std::io::{self, Write};

use serde_json::{Value, json};
use vramshim_format::{HOST_DEVICE, UNKNOWN_DEVICE};

use super::svg::{Svg, num};
use super::{processes_json, thread_json};
use crate::analysis::groups::GroupThread;
use crate::analysis::timeline::{
    DeviceTimeline, LiveRange, MAX_BUCKETS, OtherThreads, PeakPoint, ThreadKey, ThreadTimeline,
    Timeline,
};
use crate::replay::Process;
use crate::units::{bytes, counted};

/// Rows of a terminal chart; a multiple of [`Y_TICKS`] so every tick sits on a row edge.
const ROWS: usize = 12;
/// Value ticks on the memory axis above zero.
const Y_TICKS: usize = 4;
/// Failures listed by name (text) or labelled (SVG) per device; the rest only get markers.
const LABELLED_FAILURES: usize = 8;
/// Marks (`vramshim.mark`) labelled per chart; the rest only get their line.
const LABELLED_MARKS: usize = 8;
/// Characters of a mark's text shown on a chart.
const MARK_TEXT_CHARS: usize = 40;
/// Partial blocks, by eighths of a row.
const BLOCKS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Everything a timeline view shows.
pub struct TimelineReport<'a> {
    pub processes: &'a [Process],
    pub timeline: &'a Timeline,
    /// Replay time of the last record: the right end of the time axis.
    pub end_ns: u64,
}

impl TimelineReport<'_> {
    /// Length of the time axis (at least 1 ns, so scales never divide by zero).
    fn span_ns(&self) -> u64 {
        self.end_ns.max(1)
    }
}

/// How a device is named on its chart.
pub fn chart_name(device: i32) -> String {
    match device {
        HOST_DEVICE => "pinned host".to_string(),
        UNKNOWN_DEVICE => "unknown device".to_string(),
        n => format!("device {n}"),
    }
}

/// The memory unit of an axis whose largest value is `max` bytes: GiB, or MiB below 1 GiB
/// (KiB and bytes for tiny ones).
pub fn memory_unit(max: u64) -> (&'static str, f64) {
    match max {
        m if m >= 1 << 30 => ("GiB", (1u64 << 30) as f64),
        m if m >= 1 << 20 => ("MiB", (1u64 << 20) as f64),
        m if m >= 1 << 10 => ("KiB", 1024.0),
        _ => ("bytes", 1.0),
    }
}

/// A time in seconds with three significant digits: `0.00163 s`, `12.3 s`, `0 s`.
pub fn seconds_label(ns: u64) -> String {
    if ns == 0 {
        return "0 s".to_string();
    }
    let seconds = ns as f64 / 1e9;
    let decimals = (2 - seconds.log10().floor() as i32).clamp(0, 9) as usize;
    let mut text = format!("{seconds:.decimals$}");
    if text.contains('.') {
        text.truncate(text.trim_end_matches('0').trim_end_matches('.').len());
    }
    format!("{text} s")
}

/// The label of a device's peak: `peak 1.17 GiB at 0.0026 s`.
pub fn peak_label(bytes_: u64, t_ns: u64) -> String {
    format!("peak {} at {}", bytes(bytes_), seconds_label(t_ns))
}

/// The label of a failed allocation: `failed cudaMalloc 1.17 GiB at 0.0027 s`.
pub fn failure_label(api: &str, request: u64, t_ns: u64) -> String {
    format!("failed {api} {} at {}", bytes(request), seconds_label(t_ns))
}

/// The smallest step ≥ `x` from 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k (memory axes: tight fit).
fn fine_step(x: f64) -> f64 {
    nice(x, &[1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0])
}

/// The smallest step ≥ `x` from 1, 2, 5 × 10^k (time axes: round labels).
fn round_step(x: f64) -> f64 {
    nice(x, &[1.0, 2.0, 5.0])
}

fn nice(x: f64, mantissas: &[f64]) -> f64 {
    if !x.is_finite() || x <= 0.0 {
        return 1.0;
    }
    let exponent = x.log10().floor() as i32;
    // Dividing by an exact power of ten gives the double nearest 0.3; multiplying by 0.1
    // would not.
    let scale = |m: f64| {
        if exponent < 0 {
            m / 10f64.powi(-exponent)
        } else {
            m * 10f64.powi(exponent)
        }
    };
    mantissas
        .iter()
        .map(|m| scale(*m))
        .find(|step| *step >= x * (1.0 - 1e-9))
        .unwrap_or_else(|| scale(10.0))
}

/// `value` with `places` decimals, trailing zeros dropped: `0`, `0.5`, `1.25`.
fn tick_label(value: f64, places: usize) -> String {
    let text = format!("{value:.places$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// Decimals needed to print multiples of `step` exactly.
fn decimals(step: f64) -> usize {
    (0..=9)
        .find(|d| {
            let scaled = step * 10f64.powi(*d as i32);
            (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
        })
        .unwrap_or(9)
}

/// The memory axis of one chart.
struct MemoryAxis {
    unit: &'static str,
    unit_bytes: f64,
    /// Tick step in units; the axis ends at `Y_TICKS * step`.
    step: f64,
    decimals: usize,
}

impl MemoryAxis {
    fn new(series: &DeviceTimeline) -> MemoryAxis {
        let top = series
            .peak
            .map_or(0, |p| p.bytes)
            .max(series.reserved_peak.map_or(0, |p| p.bytes))
            .max(series.used_max().unwrap_or(0))
            .max(1);
        let (unit, unit_bytes) = memory_unit(top);
        let step = fine_step(top as f64 / unit_bytes / Y_TICKS as f64);
        MemoryAxis {
            unit,
            unit_bytes,
            step,
            decimals: decimals(step),
        }
    }

    fn max_bytes(&self) -> f64 {
        self.step * Y_TICKS as f64 * self.unit_bytes
    }

    /// Label of tick `k` (0 = the axis).
    fn tick(&self, k: usize) -> String {
        tick_label(self.step * k as f64, self.decimals)
    }

    fn title(&self) -> String {
        format!("memory ({})", self.unit)
    }
}

/// Time ticks for an axis of `span_ns` with at most `count` labels: (seconds, label).
fn time_ticks(span_ns: u64, count: usize) -> Vec<(f64, String)> {
    let span = span_ns as f64 / 1e9;
    let step = round_step(span / count.max(1) as f64);
    let places = decimals(step);
    (0..)
        .map(|k| k as f64 * step)
        .take_while(|t| *t <= span * (1.0 + 1e-9))
        .map(|t| (t, tick_label(t, places)))
        .collect()
}

/// The column of a chart `width` columns wide that `t_ns` falls in.
fn column_of(t_ns: u64, span_ns: u64, width: usize) -> usize {
    ((t_ns as u128 * width as u128 / span_ns as u128) as usize).min(width.saturating_sub(1))
}

/// Per column of a chart: the highest live bytes in its time range. A column without changes
/// holds the level the previous one ended at; the exact `peak` reaches its own column.
fn live_columns(
    buckets: impl Iterator<Item = Option<LiveRange>>,
    peak: Option<PeakPoint>,
    bucket_ns: u64,
    span_ns: u64,
    width: usize,
) -> Vec<u64> {
    let mut maxima: Vec<Option<u64>> = vec![None; width];
    let mut lasts: Vec<Option<u64>> = vec![None; width];
    for (index, live) in buckets.enumerate() {
        if let Some(live) = live {
            let column = column_of(index as u64 * bucket_ns, span_ns, width);
            maxima[column] = Some(maxima[column].map_or(live.max, |m| m.max(live.max)));
            lasts[column] = Some(live.last);
        }
    }
    let mut level = 0;
    let mut live = Vec::with_capacity(width);
    for column in 0..width {
        live.push(maxima[column].map_or(level, |m| m.max(level)));
        level = lasts[column].unwrap_or(level);
    }
    // The peak is exact: its own column reaches it even where its bucket began a column early.
    if let Some(peak) = peak
        && let Some(value) = live.get_mut(column_of(peak.t_ns, span_ns, width))
    {
        *value = (*value).max(peak.bytes);
    }
    live
}

/// Per column of the chart: the highest live bytes and the highest used memory in its time
/// range. A column without changes holds the level the previous one ended at.
fn columns(
    series: &DeviceTimeline,
    bucket_ns: u64,
    span_ns: u64,
    width: usize,
) -> (Vec<u64>, Vec<Option<u64>>) {
    let live = live_columns(
        series.buckets.iter().map(|b| b.live),
        series.peak,
        bucket_ns,
        span_ns,
        width,
    );
    let mut used: Vec<Option<u64>> = vec![None; width];
    for (index, bucket) in series.buckets.iter().enumerate() {
        if let Some(value) = bucket.used {
            let column = column_of(index as u64 * bucket_ns, span_ns, width);
            used[column] = Some(used[column].map_or(value, |u| u.max(value)));
        }
    }
    (live, used)
}

/// The series as one JSON document: per device the buckets that changed, used-memory
/// samples, the exact peak and failures; split by thread, also `threads` and `other_threads`
/// per device (and `max_thread_series`); the program's marks.
pub fn json(report: &TimelineReport<'_>) -> Value {
    let bucket_ns = report.timeline.bucket_ns;
    let mut value = json!({
        "processes": processes_json(report.processes),
        "marks": marks_json(report.processes),
        "end_ns": report.end_ns,
        "bucket_ns": bucket_ns,
        "max_buckets": MAX_BUCKETS,
        "devices": report.timeline.devices.iter().map(|series| {
            let mut device = json!({
                "device": series.device,
                "name": chart_name(series.device),
                "peak": peak_json(series.peak),
                "total_bytes": series.total_bytes,
                "used_max_bytes": series.used_max(),
                "series": series_json(series.buckets.iter().map(|b| b.live), bucket_ns),
                "reserved_peak": peak_json(series.reserved_peak),
                "reserved": if series.reserved_peak.is_some() {
                    series_json(series.buckets.iter().map(|b| b.reserved), bucket_ns)
                } else {
                    Value::Null
                },
                "used": series.buckets.iter().enumerate().filter_map(|(i, b)| b.used.map(|used| json!({
                    "t_ns": i as u64 * bucket_ns,
                    "bytes": used,
                }))).collect::<Vec<_>>(),
                "failures": series.failures.iter().map(|f| json!({
                    "t_ns": f.t_ns,
                    "request": f.request,
                    "api": f.api,
                    "pid": f.pid,
                })).collect::<Vec<_>>(),
                "failures_omitted": series.failures_omitted,
            });
            if report.timeline.is_by_thread()
                && let Value::Object(map) = &mut device
            {
                map.insert("threads".to_string(), threads_json(report, series));
                map.insert(
                    "other_threads".to_string(),
                    series.other_threads.as_ref().map_or(Value::Null, |other| json!({
                        "threads": other.threads,
                        "peak": peak_json(other.series.peak),
                        "series": series_json(other.series.buckets.iter().copied(), bucket_ns),
                    })),
                );
            }
            device
        }).collect::<Vec<_>>(),
    });
    if let (Some(max), Value::Object(map)) = (report.timeline.max_thread_series(), &mut value) {
        map.insert("max_thread_series".to_string(), Value::from(max));
    }
    value
}

/// Every process's marks (`vramshim.mark`) in time order: `{t_ns, text, pid, thread}`, times
/// on the replay's clock.
fn marks_json(processes: &[Process]) -> Value {
    marks_in_order(processes)
        .into_iter()
        .map(|(t_ns, process, mark)| {
            json!({
                "t_ns": t_ns,
                "text": mark.text,
                "pid": process.header.pid,
                "thread": mark.thread,
            })
        })
        .collect()
}

/// Every process's marks with their time on the replay's clock, in time order.
fn marks_in_order(processes: &[Process]) -> Vec<(u64, &Process, &vramshim_format::Mark)> {
    let mut marks: Vec<(u64, &Process, &vramshim_format::Mark)> = processes
        .iter()
        .flat_map(|p| {
            p.marks
                .iter()
                .map(move |m| (p.start_offset_ns.saturating_add(m.t_ns), p, m))
        })
        .collect();
    marks.sort_by_key(|(t_ns, _, _)| *t_ns);
    marks
}

/// How a mark is labelled on a chart: `mark "epoch 3" at 1.5 s` (long texts cut).
fn mark_label(text: &str, t_ns: u64) -> String {
    let mut shown: String = text.chars().take(MARK_TEXT_CHARS).collect();
    if text.chars().count() > MARK_TEXT_CHARS {
        shown.push_str("...");
    }
    format!("mark {shown:?} at {}", seconds_label(t_ns))
}

fn peak_json(peak: Option<PeakPoint>) -> Value {
    peak.map_or(Value::Null, |p| json!({"bytes": p.bytes, "t_ns": p.t_ns}))
}

/// The buckets that changed: `{t_ns, max_bytes, last_bytes}` each.
fn series_json(buckets: impl Iterator<Item = Option<LiveRange>>, bucket_ns: u64) -> Value {
    buckets
        .enumerate()
        .filter_map(|(i, live)| {
            live.map(|live| {
                json!({
                    "t_ns": i as u64 * bucket_ns,
                    "max_bytes": live.max,
                    "last_bytes": live.last,
                })
            })
        })
        .collect()
}

/// A device's thread series: `{tid, name, pid, peak, series}` each, highest peak first.
fn threads_json(report: &TimelineReport<'_>, series: &DeviceTimeline) -> Value {
    series
        .threads
        .iter()
        .map(|thread| {
            let mut value = thread_json(&group_thread(report, thread.thread));
            if let Value::Object(map) = &mut value {
                map.insert("peak".to_string(), peak_json(thread.series.peak));
                map.insert(
                    "series".to_string(),
                    series_json(
                        thread.series.buckets.iter().copied(),
                        report.timeline.bucket_ns,
                    ),
                );
            }
            value
        })
        .collect()
}

/// How the other threads' series is named: `other threads (3 more threads, summed; 16
/// series at most)`.
fn other_threads_label(report: &TimelineReport<'_>, other: &OtherThreads) -> String {
    let plural = if other.threads == 1 { "" } else { "s" };
    let max = report.timeline.max_thread_series().unwrap_or(0);
    format!(
        "other threads ({} more thread{plural}, summed; {max} series at most)",
        other.threads
    )
}

/// The thread `(process, tid)` as the log names it.
fn group_thread(report: &TimelineReport<'_>, (process, tid): ThreadKey) -> GroupThread {
    GroupThread::of(report.processes, process, tid)
}

/// Terminal charts, `columns` characters wide.
pub fn text(out: &mut dyn Write, report: &TimelineReport<'_>, columns: usize) -> io::Result<()> {
    super::write_processes(out, report.processes)?;
    if report.timeline.devices.is_empty() {
        writeln!(out, "\nno device memory was allocated")?;
    }
    for series in &report.timeline.devices {
        writeln!(out)?;
        write_chart(out, report, series, columns)?;
        if report.timeline.is_by_thread() {
            write_thread_rows(out, report, series, columns)?;
        }
    }
    Ok(())
}

fn failure_count(series: &DeviceTimeline) -> u64 {
    series.failures.len() as u64 + series.failures_omitted
}

fn heading(series: &DeviceTimeline) -> String {
    let mut text = chart_name(series.device);
    match series.peak {
        Some(peak) if series.reserved_peak.is_some() => {
            text.push_str(&format!(
                ": allocated {}",
                peak_label(peak.bytes, peak.t_ns)
            ));
        }
        Some(peak) => text.push_str(&format!(": {}", peak_label(peak.bytes, peak.t_ns))),
        None => text.push_str(": nothing allocated"),
    }
    if let Some(reserved) = series.reserved_peak {
        text.push_str(&format!(
            ", reserved {}",
            peak_label(reserved.bytes, reserved.t_ns)
        ));
    }
    let failures = failure_count(series);
    if failures > 0 {
        let plural = if failures == 1 { "" } else { "s" };
        text.push_str(&format!(", {failures} failed allocation{plural}"));
    }
    text
}

fn write_chart(
    out: &mut dyn Write,
    report: &TimelineReport<'_>,
    series: &DeviceTimeline,
    columns: usize,
) -> io::Result<()> {
    let ChartLayout {
        axis,
        labels,
        label_width,
        width,
    } = ChartLayout::new(series, columns);
    let span = report.span_ns();
    let (live, used) = columns_of(report, series, width);
    let reserved = series.reserved_peak.map(|peak| {
        live_columns(
            series.buckets.iter().map(|b| b.reserved),
            Some(peak),
            report.timeline.bucket_ns,
            span,
            width,
        )
    });
    let max_bytes = axis.max_bytes();
    let eighths = |value: u64| -> usize {
        let scaled = (value as f64 / max_bytes * (ROWS * 8) as f64).round() as usize;
        // Anything live shows at least a sliver.
        if value > 0 { scaled.max(1) } else { 0 }
    };
    let pad = " ".repeat(label_width + 2);

    writeln!(out, "{}", heading(series))?;
    writeln!(out, "{pad}{}", axis.title())?;
    for row in (0..ROWS).rev() {
        let edge = row + 1;
        let tick = (edge % (ROWS / Y_TICKS) == 0).then(|| &labels[edge / (ROWS / Y_TICKS)]);
        let mut line = format!(
            "{:>label_width$} {}",
            tick.map_or("", |t| t.as_str()),
            if tick.is_some() { '┤' } else { '│' }
        );
        for column in 0..width {
            let filled = eighths(live[column]).saturating_sub(row * 8).min(8);
            let mut cell = BLOCKS[filled];
            if cell == ' '
                && let Some(value) = reserved.as_ref().map(|r| r[column])
                && value > 0
                && ((value as f64 / max_bytes * ROWS as f64) as usize).min(ROWS - 1) == row
            {
                cell = '─';
            }
            if cell == ' '
                && let Some(value) = used[column]
            {
                let used_row = ((value as f64 / max_bytes * ROWS as f64) as usize).min(ROWS - 1);
                if used_row == row {
                    cell = '•';
                }
            }
            line.push(cell);
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    writeln!(out, "{:>label_width$} ┼{}", labels[0], "─".repeat(width))?;

    // Markers under the axis: the peak, each failure and each mark, at their exact times.
    let column_of = |t_ns: u64| column_of(t_ns, span, width);
    let program_marks = marks_in_order(report.processes);
    if series.peak.is_some() || !series.failures.is_empty() || !program_marks.is_empty() {
        let mut marks = vec![' '; width];
        if let Some(peak) = series.peak {
            marks[column_of(peak.t_ns)] = '^';
        }
        for failure in &series.failures {
            // Beside the peak's mark rather than over it when they share a column.
            let mut at = column_of(failure.t_ns);
            if marks[at] == '^' && at + 1 < width {
                at += 1;
            }
            if marks[at] == ' ' {
                marks[at] = 'x';
            }
        }
        for (t_ns, _, _) in &program_marks {
            let at = column_of(*t_ns);
            if marks[at] == ' ' {
                marks[at] = '|';
            }
        }
        let marks: String = marks.into_iter().collect();
        writeln!(out, "{pad}{}", marks.trim_end())?;
    }

    // Time labels where they fit, about every 12 columns; one that would run past the axis
    // ends at its end instead.
    let mut ticks = vec![' '; width];
    let mut free_from = 0;
    for (seconds, label) in time_ticks(span, width / 12) {
        let at = (seconds * 1e9 / span as f64 * width as f64).round() as usize;
        let at = at.min(width.saturating_sub(label.len()));
        if at < free_from || label.len() > width {
            continue;
        }
        for (offset, c) in label.chars().enumerate() {
            ticks[at + offset] = c;
        }
        free_from = at + label.len() + 2;
    }
    let ticks: String = ticks.into_iter().collect();
    writeln!(out, "{pad}{}", ticks.trim_end())?;
    writeln!(out, "{pad}{:>width$}", "time (s)")?;

    let mut legend = vec![if series.reserved_peak.is_some() {
        "█ allocated (PyTorch's tensors and memory outside its allocator)"
    } else {
        "█ live bytes (hooked allocations)"
    }];
    if series.reserved_peak.is_some() {
        legend.push("─ reserved (PyTorch's segments in place of its tensors)");
    }
    if series.used_max().is_some() {
        legend.push("• device used memory (total - free, sampled)");
    }
    // One line when it fits the terminal, else one entry per line.
    let one_line = legend.join("   ");
    if pad.len() + one_line.chars().count() <= columns {
        writeln!(out, "{pad}{one_line}")?;
    } else {
        for entry in legend {
            writeln!(out, "{pad}{entry}")?;
        }
    }
    if let Some(peak) = series.peak {
        writeln!(out, "{pad}^ {}", peak_label(peak.bytes, peak.t_ns))?;
    }
    if let Some(reserved) = series.reserved_peak {
        writeln!(
            out,
            "{pad}  reserved {}",
            peak_label(reserved.bytes, reserved.t_ns)
        )?;
    }
    for failure in series.failures.iter().take(LABELLED_FAILURES) {
        writeln!(
            out,
            "{pad}x {} (pid {})",
            failure_label(&failure.api, failure.request, failure.t_ns),
            failure.pid
        )?;
    }
    let unlisted = failure_count(series).saturating_sub(LABELLED_FAILURES as u64);
    if unlisted > 0 {
        writeln!(
            out,
            "{pad}x ... and {}",
            counted(unlisted, "more failed allocation")
        )?;
    }
    for (t_ns, _, mark) in program_marks.iter().take(LABELLED_MARKS) {
        writeln!(out, "{pad}| {}", mark_label(&mark.text, *t_ns))?;
    }
    if program_marks.len() > LABELLED_MARKS {
        let more = (program_marks.len() - LABELLED_MARKS) as u64;
        writeln!(out, "{pad}| ... and {}", counted(more, "more mark"))?;
    }
    Ok(())
}

/// The memory axis and the widths of a device's chart.
struct ChartLayout {
    axis: MemoryAxis,
    /// Labels of the memory ticks, 0 first.
    labels: Vec<String>,
    label_width: usize,
    /// Columns of the plot.
    width: usize,
}

impl ChartLayout {
    fn new(series: &DeviceTimeline, columns: usize) -> ChartLayout {
        let axis = MemoryAxis::new(series);
        let labels: Vec<String> = (0..=Y_TICKS).map(|k| axis.tick(k)).collect();
        let label_width = labels.iter().map(String::len).max().unwrap_or(1);
        // No wider than the buckets resolve.
        let width = columns
            .saturating_sub(label_width + 4)
            .clamp(20, MAX_BUCKETS);
        ChartLayout {
            axis,
            labels,
            label_width,
            width,
        }
    }
}

/// Under a device's chart, split by thread: per thread series a line naming the thread and
/// its peak, and a one-row chart of its live bytes in the chart's columns, scaled to its own
/// peak; then the other threads' sum, if any.
fn write_thread_rows(
    out: &mut dyn Write,
    report: &TimelineReport<'_>,
    series: &DeviceTimeline,
    columns: usize,
) -> io::Result<()> {
    if series.threads.is_empty() && series.other_threads.is_none() {
        return Ok(());
    }
    let ChartLayout {
        label_width, width, ..
    } = ChartLayout::new(series, columns);
    let pad = " ".repeat(label_width + 2);
    let axis_pad = " ".repeat(label_width + 1);
    writeln!(out)?;
    writeln!(
        out,
        "{pad}by allocating thread (each row scaled to its own peak):"
    )?;
    let row = |out: &mut dyn Write, name: String, thread: &ThreadTimeline| -> io::Result<()> {
        let peak = thread.peak.map_or_else(
            || "nothing live".to_string(),
            |p| peak_label(p.bytes, p.t_ns),
        );
        // One line when it fits the terminal, else the peak on a line of its own.
        let line = format!("{name}: {peak}");
        if pad.len() + line.chars().count() <= columns {
            writeln!(out, "{pad}{line}")?;
        } else {
            writeln!(out, "{pad}{name}:")?;
            writeln!(out, "{pad}  {peak}")?;
        }
        let live = live_columns(
            thread.buckets.iter().copied(),
            thread.peak,
            report.timeline.bucket_ns,
            report.span_ns(),
            width,
        );
        let top = thread.peak.map_or(0, |p| p.bytes).max(1) as f64;
        let cells: String = live
            .iter()
            .map(|&value| {
                let eighths = (value as f64 / top * 8.0).round() as usize;
                // Anything live shows at least a sliver.
                BLOCKS[if value > 0 { eighths.clamp(1, 8) } else { 0 }]
            })
            .collect();
        writeln!(out, "{axis_pad}│{}", cells.trim_end())
    };
    for thread in &series.threads {
        let name = group_thread(report, thread.thread).label();
        row(out, name, &thread.series)?;
    }
    if let Some(other) = &series.other_threads {
        row(out, other_threads_label(report, other), &other.series)?;
    }
    Ok(())
}

fn columns_of(
    report: &TimelineReport<'_>,
    series: &DeviceTimeline,
    width: usize,
) -> (Vec<u64>, Vec<Option<u64>>) {
    columns(series, report.timeline.bucket_ns, report.span_ns(), width)
}

/// SVG layout, in pixels.
const SVG_WIDTH: f64 = 960.0;
const SVG_HEADING: f64 = 34.0;
const PANEL_HEIGHT: f64 = 310.0;
const PLOT_LEFT: f64 = 90.0;
const PLOT_RIGHT: f64 = SVG_WIDTH - 30.0;
/// From a panel's top to its plot's top, and the plot's height.
const PLOT_OFFSET: f64 = 60.0;
const PLOT_HEIGHT: f64 = 200.0;
const LIVE_COLOUR: &str = "#1f5fa8";
const USED_COLOUR: &str = "#e07b00";
/// Tensor view: PyTorch's reserved bytes (its segments).
const RESERVED_COLOUR: &str = "#2e8b57";
const FAILURE_COLOUR: &str = "#d00000";
const MARK_COLOUR: &str = "#2e8b57";
/// Split by thread: the thread legend's rows, under a panel's time axis.
const THREAD_ROW: f64 = 17.0;
/// Thread series' colours, in order of peak; apart from the live, used and failure colours.
const THREAD_COLOURS: [&str; 16] = [
    "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#393b79", "#e6550d",
    "#637939", "#7b4173", "#843c39", "#3182bd", "#8c6d31", "#31a354", "#756bb1", "#636363",
];
const OTHER_THREADS_COLOUR: &str = "#a0a0a0";

/// The colour of the `index`th thread series: the palette, then hues a golden angle apart.
fn thread_colour(index: usize) -> String {
    if let Some(colour) = THREAD_COLOURS.get(index) {
        return (*colour).to_string();
    }
    let hue = (index as f64 * 137.508) % 360.0;
    // HSL with saturation 0.65 and lightness 0.4, as RGB.
    let (s, l) = (0.65, 0.4);
    let c = (1.0 - (2.0 * l - 1.0_f64).abs()) * s;
    let x = c * (1.0 - ((hue / 60.0) % 2.0 - 1.0).abs());
    let (r, g, b) = match (hue / 60.0) as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let byte = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    format!("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b))
}

/// Rows of a panel's thread legend (a heading, a row per thread series, one for the other
/// threads); 0 when not split by thread or the device has no thread series.
fn thread_legend_rows(report: &TimelineReport<'_>, series: &DeviceTimeline) -> usize {
    if !report.timeline.is_by_thread()
        || (series.threads.is_empty() && series.other_threads.is_none())
    {
        return 0;
    }
    1 + series.threads.len() + usize::from(series.other_threads.is_some())
}

/// Height of a device's panel: the chart, and the thread legend when split by thread.
fn panel_height(report: &TimelineReport<'_>, series: &DeviceTimeline) -> f64 {
    match thread_legend_rows(report, series) {
        0 => PANEL_HEIGHT,
        rows => PANEL_HEIGHT + 8.0 + rows as f64 * THREAD_ROW,
    }
}

/// Names a recording in titles: `demo --flag (pid 1234)` (the program without its directory),
/// or the number of processes.
pub fn subject(processes: &[Process]) -> String {
    match processes {
        [one] => {
            let mut argv: Vec<&str> = one.header.argv.iter().map(String::as_str).collect();
            if let Some(program) = argv.first_mut() {
                *program = program.rsplit('/').next().unwrap_or(program);
            }
            let mut text = argv.join(" ");
            if text.chars().count() > 80 {
                text = text.chars().take(77).collect::<String>() + "...";
            }
            format!("{text} (pid {})", one.header.pid)
        }
        many => format!("{} processes", many.len()),
    }
}

/// The charts as one SVG picture, one panel per device.
pub fn svg(report: &TimelineReport<'_>) -> String {
    let title = format!("vramshim timeline: {}", subject(report.processes));
    let panels: f64 = if report.timeline.devices.is_empty() {
        PANEL_HEIGHT
    } else {
        let heights = report.timeline.devices.iter();
        heights.map(|series| panel_height(report, series)).sum()
    };
    let height = SVG_HEADING + panels;
    let mut svg = Svg::new(SVG_WIDTH, height, &title);
    svg.text(
        SVG_WIDTH / 2.0,
        22.0,
        &[("text-anchor", "middle"), ("font-size", "15")],
        &title,
    );
    if report.timeline.devices.is_empty() {
        svg.text(
            SVG_WIDTH / 2.0,
            SVG_HEADING + 40.0,
            &[("text-anchor", "middle")],
            "no device memory was allocated",
        );
    }
    let mut top = SVG_HEADING;
    for series in &report.timeline.devices {
        panel(&mut svg, report, series, top);
        top += panel_height(report, series);
    }
    svg.finish()
}

fn panel(svg: &mut Svg, report: &TimelineReport<'_>, series: &DeviceTimeline, top: f64) {
    let axis = MemoryAxis::new(series);
    let span = report.span_ns() as f64;
    let plot_top = top + PLOT_OFFSET;
    let bottom = plot_top + PLOT_HEIGHT;
    let x_of = |t_ns: f64| PLOT_LEFT + t_ns / span * (PLOT_RIGHT - PLOT_LEFT);
    let max_bytes = axis.max_bytes();
    let y_of = |value: u64| bottom - (value as f64 / max_bytes).min(1.0) * PLOT_HEIGHT;
    let bucket_ns = report.timeline.bucket_ns as f64;

    svg.open("g", &[("class", "device")]);
    svg.text(
        PLOT_LEFT,
        top + 20.0,
        &[("font-size", "14"), ("font-weight", "bold")],
        &heading(series),
    );
    legend(
        svg,
        top + 42.0,
        series,
        !report.processes.iter().all(|p| p.marks.is_empty()),
    );

    // Memory axis: grid, ticks, title.
    for k in 0..=Y_TICKS {
        let y = bottom - k as f64 / Y_TICKS as f64 * PLOT_HEIGHT;
        svg.line(
            (PLOT_LEFT, y),
            (PLOT_RIGHT, y),
            &[("stroke", "#dddddd"), ("stroke-width", "1")],
        );
        svg.text(
            PLOT_LEFT - 6.0,
            y + 4.0,
            &[("text-anchor", "end"), ("class", "y-tick")],
            &axis.tick(k),
        );
    }
    let (title_x, title_y) = (24.0, (plot_top + bottom) / 2.0);
    let rotate = format!("rotate(-90 {} {})", num(title_x), num(title_y));
    svg.text(
        title_x,
        title_y,
        &[
            ("text-anchor", "middle"),
            ("transform", &rotate),
            ("class", "y-label"),
        ],
        &axis.title(),
    );
    // Time axis.
    for (seconds, label) in time_ticks(report.span_ns(), 8) {
        let x = x_of(seconds * 1e9);
        svg.line((x, bottom), (x, bottom + 4.0), &[("stroke", "black")]);
        svg.text(
            x,
            bottom + 17.0,
            &[("text-anchor", "middle"), ("class", "x-tick")],
            &label,
        );
    }
    svg.text(
        (PLOT_LEFT + PLOT_RIGHT) / 2.0,
        bottom + 36.0,
        &[("text-anchor", "middle"), ("class", "x-label")],
        "time (s)",
    );
    svg.line(
        (PLOT_LEFT, plot_top),
        (PLOT_LEFT, bottom),
        &[("stroke", "black")],
    );
    svg.line(
        (PLOT_LEFT, bottom),
        (PLOT_RIGHT, bottom),
        &[("stroke", "black")],
    );

    // Live bytes as steps: each bucket rises to its maximum and settles at its last level.
    let mut d = format!("M{} {}", num(PLOT_LEFT), num(bottom));
    let mut level = 0;
    for (index, bucket) in series.buckets.iter().enumerate() {
        let Some(live) = bucket.live else { continue };
        let x = num(x_of(index as f64 * bucket_ns));
        d.push_str(&format!(
            " L{x} {} L{x} {} L{x} {}",
            num(y_of(level)),
            num(y_of(live.max)),
            num(y_of(live.last))
        ));
        level = live.last;
    }
    d.push_str(&format!(" L{} {}", num(PLOT_RIGHT), num(y_of(level))));
    let area = format!("{d} L{} {} Z", num(PLOT_RIGHT), num(bottom));
    svg.element(
        "path",
        &[
            ("d", &area),
            ("fill", LIVE_COLOUR),
            ("fill-opacity", "0.18"),
            ("stroke", "none"),
        ],
    );
    svg.element(
        "path",
        &[
            ("d", &d),
            ("fill", "none"),
            ("stroke", LIVE_COLOUR),
            ("stroke-width", "1.5"),
            ("class", "live"),
        ],
    );
    if series.reserved_peak.is_some() {
        let mut d = format!("M{} {}", num(PLOT_LEFT), num(bottom));
        let mut level = 0;
        for (index, bucket) in series.buckets.iter().enumerate() {
            let Some(reserved) = bucket.reserved else {
                continue;
            };
            let x = num(x_of(index as f64 * bucket_ns));
            d.push_str(&format!(
                " L{x} {} L{x} {} L{x} {}",
                num(y_of(level)),
                num(y_of(reserved.max)),
                num(y_of(reserved.last))
            ));
            level = reserved.last;
        }
        d.push_str(&format!(" L{} {}", num(PLOT_RIGHT), num(y_of(level))));
        svg.element(
            "path",
            &[
                ("d", &d),
                ("fill", "none"),
                ("stroke", RESERVED_COLOUR),
                ("stroke-width", "1.5"),
                ("class", "reserved"),
            ],
        );
    }
    if thread_legend_rows(report, series) > 0 {
        thread_lines(svg, report, series, top, &x_of, &y_of);
    }

    // Used memory: a dot at each sample and nothing between them (what the device held
    // between two samples is not known).
    let samples: Vec<(f64, f64)> = series
        .buckets
        .iter()
        .enumerate()
        .filter_map(|(index, bucket)| {
            bucket
                .used
                .map(|used| (x_of(index as f64 * bucket_ns), y_of(used)))
        })
        .collect();
    for (x, y) in &samples {
        svg.element(
            "circle",
            &[
                ("cx", &num(*x)),
                ("cy", &num(*y)),
                ("r", "2.5"),
                ("fill", USED_COLOUR),
                ("class", "used"),
            ],
        );
    }

    // The exact peak.
    if let Some(peak) = series.peak {
        let (x, y) = (x_of(peak.t_ns as f64), y_of(peak.bytes));
        svg.element(
            "circle",
            &[
                ("cx", &num(x)),
                ("cy", &num(y)),
                ("r", "4.5"),
                ("fill", "none"),
                ("stroke", "black"),
                ("stroke-width", "2"),
                ("class", "peak"),
            ],
        );
        let right_half = x > (PLOT_LEFT + PLOT_RIGHT) / 2.0;
        let label_x = if right_half { x - 8.0 } else { x + 8.0 };
        svg.text(
            label_x,
            (y - 8.0).max(plot_top + 12.0),
            &[
                ("text-anchor", if right_half { "end" } else { "start" }),
                ("font-weight", "bold"),
                ("class", "peak-label"),
                ("stroke", "white"),
                ("stroke-width", "3"),
                ("paint-order", "stroke"),
            ],
            &peak_label(peak.bytes, peak.t_ns),
        );
    }

    // Failed allocations: a red line and cross at the exact time, labelled.
    for (index, failure) in series.failures.iter().enumerate() {
        let x = x_of(failure.t_ns as f64);
        svg.line(
            (x, plot_top),
            (x, bottom),
            &[
                ("stroke", FAILURE_COLOUR),
                ("stroke-dasharray", "3 3"),
                ("class", "failure"),
            ],
        );
        let y = plot_top + 6.0;
        svg.line(
            (x - 5.0, y - 5.0),
            (x + 5.0, y + 5.0),
            &[("stroke", FAILURE_COLOUR), ("stroke-width", "2")],
        );
        svg.line(
            (x - 5.0, y + 5.0),
            (x + 5.0, y - 5.0),
            &[("stroke", FAILURE_COLOUR), ("stroke-width", "2")],
        );
        if index < LABELLED_FAILURES {
            let right_half = x > (PLOT_LEFT + PLOT_RIGHT) / 2.0;
            // Along the bottom of the plot, away from the peak's label at the top.
            svg.text(
                if right_half { x - 8.0 } else { x + 8.0 },
                bottom - 8.0 - 14.0 * index as f64,
                &[
                    ("text-anchor", if right_half { "end" } else { "start" }),
                    ("fill", FAILURE_COLOUR),
                    ("class", "failure-label"),
                    ("stroke", "white"),
                    ("stroke-width", "3"),
                    ("paint-order", "stroke"),
                ],
                &failure_label(&failure.api, failure.request, failure.t_ns),
            );
        }
    }
    // The program's marks: a green line at the exact time, labelled along the top.
    let program_marks = marks_in_order(report.processes);
    for (index, (t_ns, _, mark)) in program_marks.iter().enumerate() {
        let x = x_of(*t_ns as f64);
        svg.line(
            (x, plot_top),
            (x, bottom),
            &[
                ("stroke", MARK_COLOUR),
                ("stroke-dasharray", "6 3"),
                ("class", "mark"),
            ],
        );
        if index < LABELLED_MARKS {
            let right_half = x > (PLOT_LEFT + PLOT_RIGHT) / 2.0;
            svg.text(
                if right_half { x - 4.0 } else { x + 4.0 },
                plot_top + 24.0 + 14.0 * (index % 4) as f64,
                &[
                    ("text-anchor", if right_half { "end" } else { "start" }),
                    ("fill", MARK_COLOUR),
                    ("class", "mark-label"),
                    ("stroke", "white"),
                    ("stroke-width", "3"),
                    ("paint-order", "stroke"),
                ],
                &mark_label(&mark.text, *t_ns),
            );
        }
    }
    let unlabelled = failure_count(series).saturating_sub(LABELLED_FAILURES as u64);
    if unlabelled > 0 {
        svg.text(
            PLOT_RIGHT,
            bottom + 36.0,
            &[("text-anchor", "end"), ("fill", FAILURE_COLOUR)],
            &format!("{unlabelled} more failed allocations not labelled"),
        );
    }
    svg.close("g");
}

/// Split by thread: a step line per thread series over the device's, in its colour, and a
/// legend row naming each under the time axis.
fn thread_lines(
    svg: &mut Svg,
    report: &TimelineReport<'_>,
    series: &DeviceTimeline,
    top: f64,
    x_of: &dyn Fn(f64) -> f64,
    y_of: &dyn Fn(u64) -> f64,
) {
    let bucket_ns = report.timeline.bucket_ns as f64;
    let legend_top = top + PANEL_HEIGHT + 4.0;
    svg.text(
        PLOT_LEFT,
        legend_top + 4.0,
        &[("class", "thread-heading")],
        "live bytes by allocating thread (a free counts against the thread that allocated):",
    );
    let draw = |svg: &mut Svg, row: usize, thread: &ThreadTimeline, label: &str, other: bool| {
        let colour = if other {
            OTHER_THREADS_COLOUR.to_string()
        } else {
            thread_colour(row)
        };
        let class = if other { "other-threads" } else { "thread" };
        let dash = if other { "5 3" } else { "none" };
        let mut points = vec![format!("{},{}", num(PLOT_LEFT), num(y_of(0)))];
        let mut level = 0;
        for (index, live) in thread.buckets.iter().enumerate() {
            let Some(live) = live else { continue };
            let x = num(x_of(index as f64 * bucket_ns));
            for value in [level, live.max, live.last] {
                points.push(format!("{x},{}", num(y_of(value))));
            }
            level = live.last;
        }
        points.push(format!("{},{}", num(PLOT_RIGHT), num(y_of(level))));
        svg.element(
            "polyline",
            &[
                ("points", &points.join(" ")),
                ("fill", "none"),
                ("stroke", &colour),
                ("stroke-width", "1.5"),
                ("stroke-dasharray", dash),
                ("class", class),
            ],
        );
        let y = legend_top + (row + 1) as f64 * THREAD_ROW;
        svg.line(
            (PLOT_LEFT, y),
            (PLOT_LEFT + 12.0, y),
            &[
                ("stroke", &colour),
                ("stroke-width", "3"),
                ("stroke-dasharray", dash),
            ],
        );
        let peak = thread.peak.map_or_else(
            || "nothing live".to_string(),
            |p| peak_label(p.bytes, p.t_ns),
        );
        svg.text(
            PLOT_LEFT + 16.0,
            y + 4.0,
            &[("class", "thread-legend"), ("fill", &colour)],
            &format!("{label}: {peak}"),
        );
    };
    for (row, thread) in series.threads.iter().enumerate() {
        let label = group_thread(report, thread.thread).label();
        draw(svg, row, &thread.series, &label, false);
    }
    if let Some(other) = &series.other_threads {
        let label = other_threads_label(report, other);
        draw(svg, series.threads.len(), &other.series, &label, true);
    }
}

fn legend(svg: &mut Svg, y: f64, series: &DeviceTimeline, marks: bool) {
    let mut x = PLOT_LEFT;
    let entry = |svg: &mut Svg, x: &mut f64, label: &str| {
        svg.text(*x + 16.0, y + 4.0, &[("class", "legend")], label);
        *x += 16.0 + 7.5 * label.len() as f64 + 24.0;
    };
    svg.line(
        (x, y),
        (x + 12.0, y),
        &[("stroke", LIVE_COLOUR), ("stroke-width", "3")],
    );
    if series.reserved_peak.is_some() {
        entry(
            svg,
            &mut x,
            "allocated (PyTorch's tensors and memory outside its allocator)",
        );
        svg.line(
            (x, y),
            (x + 12.0, y),
            &[("stroke", RESERVED_COLOUR), ("stroke-width", "3")],
        );
        entry(svg, &mut x, "reserved (its segments)");
    } else {
        entry(svg, &mut x, "live bytes (hooked allocations)");
    }
    if series.used_max().is_some() {
        svg.element(
            "circle",
            &[
                ("cx", &num(x + 6.0)),
                ("cy", &num(y)),
                ("r", "3"),
                ("fill", USED_COLOUR),
            ],
        );
        entry(svg, &mut x, "device used memory (total - free, sampled)");
    }
    if series.peak.is_some() {
        svg.element(
            "circle",
            &[
                ("cx", &num(x + 6.0)),
                ("cy", &num(y)),
                ("r", "4"),
                ("fill", "none"),
                ("stroke", "black"),
                ("stroke-width", "2"),
            ],
        );
        entry(svg, &mut x, "peak");
    }
    if !series.failures.is_empty() {
        svg.line(
            (x + 2.0, y - 4.0),
            (x + 10.0, y + 4.0),
            &[("stroke", FAILURE_COLOUR), ("stroke-width", "2")],
        );
        svg.line(
            (x + 2.0, y + 4.0),
            (x + 10.0, y - 4.0),
            &[("stroke", FAILURE_COLOUR), ("stroke-width", "2")],
        );
        entry(svg, &mut x, "failed allocation");
    }
    if marks {
        svg.line(
            (x + 6.0, y - 6.0),
            (x + 6.0, y + 6.0),
            &[("stroke", MARK_COLOUR), ("stroke-width", "2")],
        );
        entry(svg, &mut x, "mark (vramshim.mark)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::timeline::{Bucket, FailurePoint, LiveRange, PeakPoint};

    #[test]
    fn timeline_labels_and_scales() {
        assert_eq!(seconds_label(2_600_000), "0.0026 s");
        assert_eq!(seconds_label(1_634_567), "0.00163 s");
        assert_eq!(seconds_label(12_345_000_000), "12.3 s");
        assert_eq!(seconds_label(0), "0 s");
        assert_eq!(
            peak_label(1_258_291_200, 2_600_000),
            "peak 1.17 GiB at 0.0026 s"
        );
        assert_eq!(memory_unit(1 << 30).0, "GiB");
        assert_eq!(memory_unit((1 << 30) - 1).0, "MiB");
        assert_eq!(fine_step(0.29), 0.3);
        assert_eq!(fine_step(1.0), 1.0);
        assert_eq!(fine_step(1.01), 1.5);
        assert_eq!(round_step(0.00026), 0.0005);
        assert_eq!(decimals(0.0005), 4);
        assert_eq!(decimals(2.5), 1);
        assert_eq!(decimals(300.0), 0);
        let ticks = time_ticks(2_000_000_000, 4);
        let labels: Vec<&str> = ticks.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["0", "0.5", "1", "1.5", "2"]);
    }

    fn sample() -> (Timeline, DeviceTimeline) {
        let mut buckets = vec![Bucket::default(); 100];
        buckets[10].live = Some(LiveRange {
            max: 600,
            last: 600,
        });
        buckets[50].live = Some(LiveRange {
            max: 1000,
            last: 200,
        });
        buckets[60].used = Some(900);
        let mut series = DeviceTimeline::default();
        series.buckets = buckets;
        series.peak = Some(PeakPoint {
            bytes: 1000,
            t_ns: 50,
        });
        series.failures = vec![FailurePoint {
            t_ns: 90,
            request: 5000,
            api: "cudaMalloc<&>".into(),
            pid: 7,
        }];
        let mut timeline = Timeline::new(None);
        timeline.devices.push(series.clone());
        (timeline, series)
    }

    #[test]
    fn timeline_thread_colours_are_distinct() {
        let mut colours: Vec<String> = (0..256).map(thread_colour).collect();
        assert!(colours.iter().all(|c| c.len() == 7 && c.starts_with('#')));
        assert_eq!(colours[0], THREAD_COLOURS[0]);
        let mut first: Vec<String> = colours[..THREAD_COLOURS.len() + 8].to_vec();
        first.push(OTHER_THREADS_COLOUR.to_string());
        for colour in [LIVE_COLOUR, USED_COLOUR, FAILURE_COLOUR] {
            first.push(colour.to_string());
        }
        let count = first.len();
        first.sort();
        first.dedup();
        assert_eq!(first.len(), count);
        colours.sort();
        colours.dedup();
        assert!(colours.len() > 200, "{}", colours.len());
    }

    #[test]
    fn timeline_columns_carry_levels_and_keep_maxima() {
        let (_, series) = sample();
        let (live, used) = columns(&series, 1, 100, 10);
        assert_eq!(live, [0, 600, 600, 600, 600, 1000, 200, 200, 200, 200]);
        assert_eq!(used[6], Some(900));
        assert_eq!(used.iter().flatten().count(), 1);
    }

    #[test]
    fn timeline_text_and_svg_show_peak_and_failures() {
        let (timeline, _) = sample();
        let report = TimelineReport {
            processes: &[],
            timeline: &timeline,
            end_ns: 100,
        };
        let mut out = Vec::new();
        text(&mut out, &report, 60).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("device 0: peak 1000 B at 0.00000005 s"),
            "{out}"
        );
        assert!(out.contains("memory (bytes)"), "{out}");
        assert!(
            out.contains('█') && out.contains('^') && out.contains('•'),
            "{out}"
        );
        assert!(out.contains("x failed cudaMalloc<&> 4.88 KiB at"), "{out}");
        // A tick right at the end of the axis stays inside the width.
        let report_end = TimelineReport {
            end_ns: 1_000_000_001,
            ..report
        };
        let mut out = Vec::new();
        text(&mut out, &report_end, 60).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains(" 1\n"), "{out}");
        for line in out.lines().filter(|l| !l.contains("failed")) {
            assert!(line.chars().count() <= 60, "{line:?}");
        }
        let picture = svg(&report);
        assert!(picture.contains("failed cudaMalloc&lt;&amp;&gt; 4.88 KiB"));
        assert!(picture.contains(">time (s)</text>"));
    }
}
