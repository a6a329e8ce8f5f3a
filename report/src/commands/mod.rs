//! One module per subcommand.

pub mod advise;
pub mod allocator;
pub mod breakdown;
pub mod common;
pub mod compact;
pub mod diff;
pub mod dryrun;
pub mod dump;
pub mod export;
pub mod export_formats;
pub mod flamegraph;
pub mod html;
pub mod launch;
pub mod lines;
pub mod oom;
pub mod peak;
pub mod report;
pub mod run;
pub mod steps;
pub mod timeline;
pub mod whatif;
