//! `vramshim`: runs programs under the recorder and reads what it recorded.

use std::process::ExitCode;

fn main() -> ExitCode {
    vramshim_report::run(std::env::args_os())
}
