//! Analyses: observers of the replay and the data they produce. Nothing here reads files or
//! formats output.

pub mod allocated;
pub mod apis;
pub mod groups;
pub mod oom;
pub mod peaks;
pub mod snapshot;
pub mod summary;
