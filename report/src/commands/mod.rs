//! One module per subcommand.

pub mod common;
pub mod dump;
pub mod oom;
pub mod peak;
pub mod report;
pub mod run;
