//! Opening logs with errors a user can act on.

use std::fs::File;
use std::path::Path;

use vramshim_format::{LogReader, OpenError};

use crate::Failure;

/// Opens `path` as a vramshim log; a missing file or a file that is not a log is an input
/// error (exit code 2) naming the file.
pub fn open(path: &Path) -> Result<LogReader<File>, Failure> {
    let file = File::open(path)
        .map_err(|err| Failure::input(format!("cannot open {}: {err}", path.display())))?;
    LogReader::new(file).map_err(|err| match err {
        OpenError::Io(err) => Failure::input(format!("cannot read {}: {err}", path.display())),
        other => Failure::input(format!("{}: {other}", path.display())),
    })
}
