//! `vramshim export LOG... --pprof FILE --speedscope FILE --chrome-trace FILE --parquet FILE`:
//! the recording in the formats of tools an ML engineer already runs. Each is one streaming
//! replay; the traces (Chrome, Parquet) are written as the replay goes.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;

use crate::Failure;
use crate::analysis::allocated::Allocated;
use crate::analysis::events::Events;
use crate::analysis::groups::{IdTotals, Stacks, add_total, totals_by_id};
use crate::analysis::peaks::Peaks;
use crate::analysis::profile::{self, ProfileSample};
use crate::analysis::tracks::Tracks;
use crate::commands::common;
use crate::commands::export::{Args, replay_start_unix_ns};
use crate::render::chrome_trace::ChromeTraceWriter;
use crate::render::parquet::ParquetWriter;
use crate::render::timeline::subject;
use crate::render::{pprof, speedscope};
use crate::replay::{self, Stop};
use crate::units::bytes;

/// Which in-use bytes the profiles hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Inuse {
    /// Live at each device's peak (the moment its live bytes were highest).
    Peak,
    /// Still live when the log(s) end.
    End,
}

impl Inuse {
    fn describe(self) -> &'static str {
        match self {
            Inuse::Peak => "live at the peak",
            Inuse::End => "live at the end",
        }
    }
}

/// Writes every format asked for but the PyTorch snapshot.
pub fn run(args: &Args) -> Result<(), Failure> {
    if args.pprof.is_some() || args.speedscope.is_some() {
        profiles(args)?;
    }
    if let Some(path) = &args.chrome_trace {
        chrome_trace(args, path)?;
    }
    if let Some(path) = &args.parquet {
        parquet(args, path)?;
    }
    Ok(())
}

/// pprof and speedscope: one replay, the samples shared.
fn profiles(args: &Args) -> Result<(), Failure> {
    let mut allocated = Allocated::new(args.device, false);
    let mut peaks = Peaks::default();
    let replay = replay::run_view(
        &args.logs,
        &mut [&mut allocated, &mut peaks],
        Stop::End,
        args.segments.view(),
    )?;
    let mut inuse: FxHashMap<i32, IdTotals> = FxHashMap::default();
    match args.inuse {
        Inuse::Peak => {
            for snapshot in peaks.snapshots(&replay.state, args.device) {
                if let Some(device) = snapshot.device {
                    inuse.insert(device, totals_by_id(&snapshot.allocations, false));
                }
            }
        }
        Inuse::End => {
            for live in replay.state.live() {
                if args.device.is_none_or(|d| d == live.device) {
                    add_total(inuse.entry(live.device).or_default(), live, false);
                }
            }
        }
    }
    let mut stacks = Stacks::new(&replay.processes, args.view.stacks, false);
    let samples = profile::samples(&allocated.devices, &inuse, &mut stacks, &replay.processes);
    for warning in common::warnings(&replay, args.device, &stacks) {
        eprintln!("vramshim: warning: {warning}");
    }
    if samples.is_empty() {
        eprintln!("vramshim: note: nothing was allocated: the profiles are empty");
    }
    let what = args.inuse.describe();
    if let Some(path) = &args.pprof {
        let info = pprof::ProfileInfo {
            time_nanos: replay_start_unix_ns(&replay.processes),
            duration_nanos: replay.end_ns,
            comments: vec![
                format!("vramshim {}", env!("CARGO_PKG_VERSION")),
                format!("inuse_space/inuse_objects: {what} (--inuse)"),
                "alloc_space/alloc_objects: allocated over the run".to_string(),
            ],
        };
        let data = pprof::encode(&samples, &info).map_err(|err| output_failure(path, err))?;
        write_whole(path, &data)?;
        summary(path, &samples, what);
    }
    if let Some(path) = &args.speedscope {
        let name = format!("vramshim: {}", subject(&replay.processes));
        let document = speedscope::document(&samples, &name, what);
        let text = serde_json::to_vec(&document).map_err(|err| output_failure(path, err.into()))?;
        write_whole(path, &text)?;
        summary(path, &samples, what);
    }
    Ok(())
}

fn summary(path: &Path, samples: &[ProfileSample], what: &str) {
    let allocated: u64 = samples.iter().map(|s| s.alloc_bytes).sum();
    let inuse: u64 = samples.iter().map(|s| s.inuse_bytes).sum();
    eprintln!(
        "vramshim: wrote {}: {} stack(s), {} allocated over the run, {} {what}",
        path.display(),
        samples.len(),
        bytes(allocated),
        bytes(inuse)
    );
}

fn chrome_trace(args: &Args, path: &Path) -> Result<(), Failure> {
    let mut output = TempFile::create(path)?;
    let writer = output.take_writer(path)?;
    let mut tracks = Tracks::new(args.device, ChromeTraceWriter::new(writer));
    let replay = replay::run_view(
        &args.logs,
        &mut [&mut tracks],
        Stop::End,
        args.segments.view(),
    )?;
    let events = tracks
        .sink
        .finish(&replay.processes, replay_start_unix_ns(&replay.processes))
        .map_err(|err| output_failure(path, err))?;
    output.commit(path)?;
    for warning in replay
        .device_warning(args.device)
        .into_iter()
        .chain(replay.warnings())
    {
        eprintln!("vramshim: warning: {warning}");
    }
    eprintln!("vramshim: wrote {}: {events} trace events", path.display());
    Ok(())
}

fn parquet(args: &Args, path: &Path) -> Result<(), Failure> {
    let mut output = TempFile::create(path)?;
    let writer = output.take_writer(path)?;
    let mut events = Events::new(args.device, ParquetWriter::new(writer));
    let replay = replay::run(&args.logs, &mut [&mut events], Stop::End)?;
    let rows = events
        .sink
        .finish()
        .map_err(|err| output_failure(path, err))?;
    output.commit(path)?;
    for warning in replay
        .device_warning(args.device)
        .into_iter()
        .chain(replay.warnings())
    {
        eprintln!("vramshim: warning: {warning}");
    }
    eprintln!("vramshim: wrote {}: {rows} events", path.display());
    Ok(())
}

/// Writes `data` to `path` through a temporary file.
fn write_whole(path: &Path, data: &[u8]) -> Result<(), Failure> {
    let mut output = TempFile::create(path)?;
    let mut writer = output.take_writer(path)?;
    io::Write::write_all(&mut writer, data)
        .and_then(|()| io::Write::flush(&mut writer))
        .map_err(|err| output_failure(path, err))?;
    drop(writer);
    output.commit(path)
}

/// An output file written under a temporary name beside it, renamed when complete and
/// removed when not.
struct TempFile {
    temp: PathBuf,
    file: Option<File>,
    committed: bool,
}

impl TempFile {
    fn create(path: &Path) -> Result<TempFile, Failure> {
        if path.is_dir() {
            return Err(output_failure(path, io::Error::other("it is a directory")));
        }
        let Some(name) = path.file_name() else {
            return Err(output_failure(path, io::Error::other("not a file name")));
        };
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".{}.tmp", std::process::id()));
        let temp = path.with_file_name(temp_name);
        let file = File::create(&temp).map_err(|err| output_failure(path, err))?;
        Ok(TempFile {
            temp,
            file: Some(file),
            committed: false,
        })
    }

    /// The buffered writer of the file (once).
    fn take_writer(&mut self, path: &Path) -> Result<BufWriter<File>, Failure> {
        let file = self
            .file
            .take()
            .ok_or_else(|| output_failure(path, io::Error::other("written twice")))?;
        Ok(BufWriter::with_capacity(1 << 20, file))
    }

    /// Renames the finished file into place (its writer must be flushed and dropped).
    fn commit(&mut self, path: &Path) -> Result<(), Failure> {
        std::fs::rename(&self.temp, path).map_err(|err| output_failure(path, err))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

fn output_failure(path: &Path, err: io::Error) -> Failure {
    Failure {
        message: format!("cannot write {}: {err}", path.display()),
        code: 1,
    }
}
