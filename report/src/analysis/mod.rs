//! Analyses: observers of the replay and the data they produce. Nothing here reads files or
//! formats output.

pub mod advise;
pub mod allocated;
pub mod allocator;
pub mod apis;
pub mod breakdown;
pub mod diff;
pub mod events;
pub mod groups;
pub mod lines;
pub mod oom;
pub mod peaks;
pub mod profile;
pub mod releases;
pub mod requests;
pub mod snapshot;
pub mod steps;
pub mod summary;
pub mod timeline;
pub mod trace;
pub mod tracks;
