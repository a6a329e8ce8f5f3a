//! Builds the fake NVIDIA libraries with `fakegpu/build.sh` into `target/<profile>/fakegpu/lib`,
//! beside the `vramshim` binary, which looks for them there.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is target/<profile>/build/<crate>-<hash>/out.
    let profile_dir = out_dir
        .ancestors()
        .nth(3)
        .expect("OUT_DIR lies three levels under the profile directory");
    let fakegpu_dir = profile_dir.join("fakegpu");
    for watched in ["build.sh", "build.py", "src", "include", "symbols"] {
        println!(
            "cargo:rerun-if-changed={}",
            manifest.join(watched).display()
        );
    }
    let status = Command::new("bash")
        .arg(manifest.join("build.sh"))
        .arg(&fakegpu_dir)
        .status()
        .expect("bash runs fakegpu/build.sh");
    assert!(status.success(), "fakegpu/build.sh failed");
    println!(
        "cargo:rustc-env=VRAMSHIM_FAKEGPU_BUILT_LIB_DIR={}",
        Path::new(&fakegpu_dir).join("lib").display()
    );
}
