//! The Trace Event Format (JSON object form) that Perfetto's UI and `chrome://tracing` open,
//! written as the replay goes. Per process (`pid` = the recorded pid): a counter per device,
//! `device N live` (bytes the hooks saw live) and `device N used` (the device's used memory,
//! where it was sampled); an instant event per failed allocation (on the failing thread) and
//! per note; `process_name` and `thread_name` metadata. `ts` is in microseconds since the
//! earliest process started.

use std::io::{self, Write};

use serde_json::{Value, json};

use crate::analysis::tracks::{TrackPoint, TrackSink};
use crate::render::device_name;
use crate::replay::Process;
use crate::units::bytes;

/// Streams a trace into `out`: [`TrackSink`] points as they come, then [`Self::finish`].
pub struct ChromeTraceWriter<W: Write> {
    out: W,
    events: u64,
    /// The first write error; nothing more is written after it.
    pub error: Option<io::Error>,
}

/// Microseconds, with the nanoseconds as a fraction.
fn micros(t_ns: u64) -> f64 {
    t_ns as f64 / 1000.0
}

fn pid_of(processes: &[Process], process: u32) -> u32 {
    processes
        .get(process as usize)
        .map_or(process, |p| p.header.pid)
}

impl<W: Write> ChromeTraceWriter<W> {
    pub fn new(mut out: W) -> ChromeTraceWriter<W> {
        let error = out.write_all(b"{\"traceEvents\":[").err();
        ChromeTraceWriter {
            out,
            events: 0,
            error,
        }
    }

    fn event(&mut self, event: &Value) {
        if self.error.is_some() {
            return;
        }
        let separator: &[u8] = if self.events == 0 { b"\n" } else { b",\n" };
        let result = self
            .out
            .write_all(separator)
            .and_then(|()| serde_json::to_writer(&mut self.out, event).map_err(io::Error::from));
        match result {
            Ok(()) => self.events += 1,
            Err(err) => self.error = Some(err),
        }
    }

    /// Ends the document: names of processes and threads, notes, and what the times mean
    /// (`start_unix_ns`: the wall-clock time of ts 0).
    pub fn finish(mut self, processes: &[Process], start_unix_ns: u64) -> io::Result<u64> {
        for process in processes {
            let pid = process.header.pid;
            let program = process
                .header
                .argv
                .first()
                .map_or("process", |path| path.rsplit('/').next().unwrap_or(path));
            self.event(&json!({
                "name": "process_name", "ph": "M", "pid": pid, "tid": pid,
                "args": {"name": format!("{program} (pid {pid})")},
            }));
            let mut threads: Vec<(&u32, &String)> = process.thread_names.iter().collect();
            threads.sort();
            for (tid, name) in threads {
                self.event(&json!({
                    "name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                    "args": {"name": name},
                }));
            }
            for note in &process.notes {
                self.event(&json!({
                    "name": format!("note: {}", note.text), "ph": "i", "s": "p",
                    "ts": micros(process.start_offset_ns + note.t_ns), "pid": pid, "tid": pid,
                    "args": {"text": note.text},
                }));
            }
        }
        if let Some(err) = self.error.take() {
            return Err(err);
        }
        let mut tail = json!({
            "recorded_by": format!("vramshim {}", env!("CARGO_PKG_VERSION")),
            "start_unix_ns": start_unix_ns,
        });
        // Times recorded coarser than 1 ns say so (the coarsest of the logs): `ts` shows
        // digits the recording does not have.
        let resolution_ns = processes
            .iter()
            .map(|p| p.header.time_resolution_ns)
            .max()
            .unwrap_or(1);
        if let (Some(note), Value::Object(map)) =
            (crate::units::resolution_note(resolution_ns), &mut tail)
        {
            map.insert("time_resolution_ns".into(), resolution_ns.into());
            map.insert("time_resolution".into(), note.into());
        }
        write!(
            self.out,
            "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{tail}}}\n"
        )?;
        self.out.flush()?;
        Ok(self.events)
    }
}

impl<W: Write> TrackSink for ChromeTraceWriter<W> {
    fn point(&mut self, point: &TrackPoint, processes: &[Process]) {
        let event = match *point {
            TrackPoint::Live {
                process,
                device,
                t_ns,
                bytes,
            } => {
                let pid = pid_of(processes, process);
                json!({
                    "name": format!("{} live", device_name(device)), "ph": "C",
                    "ts": micros(t_ns), "pid": pid, "tid": pid, "args": {"bytes": bytes},
                })
            }
            TrackPoint::Used {
                process,
                device,
                t_ns,
                used,
                ..
            } => {
                let pid = pid_of(processes, process);
                json!({
                    "name": format!("{} used", device_name(device)), "ph": "C",
                    "ts": micros(t_ns), "pid": pid, "tid": pid,
                    "args": {"bytes": used},
                })
            }
            TrackPoint::Failed {
                process,
                t_ns,
                event,
            } => {
                let info = processes.get(process as usize);
                let api = info.map_or_else(
                    || format!("api#{}", event.api),
                    |p| p.header.api_name(event.api).into_owned(),
                );
                let mut args = json!({
                    "device": event.device, "api": api, "size": event.size,
                    "result": event.result, "stream": event.stream,
                });
                if let Some((free, total)) = event.mem_info {
                    args["mem_free"] = json!(free);
                    args["mem_total"] = json!(total);
                }
                json!({
                    "name": format!("OOM: {api} {} on {}", bytes(event.size), device_name(event.device)),
                    "ph": "i", "s": "t", "ts": micros(t_ns),
                    "pid": pid_of(processes, process), "tid": event.thread, "args": args,
                })
            }
        };
        self.event(&event);
    }
}
