//! The fake NVIDIA libraries are C, built by `fakegpu/build.sh` from this crate's build
//! script; this crate only tells Rust code where they were built.

/// The directory holding every fake library under its real SONAME file name
/// (`target/<profile>/fakegpu/lib`).
pub const LIB_DIR: &str = env!("VRAMSHIM_FAKEGPU_BUILT_LIB_DIR");
