//! Compiles the fake CUDA driver, the fake runtime and the C test programs with
//! `tests/build-c.sh`, and tells the tests where they are.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("c");
    for watched in ["build-c.sh", "fake", "programs"] {
        println!(
            "cargo:rerun-if-changed={}",
            manifest.join(watched).display()
        );
    }
    let status = Command::new("bash")
        .arg(manifest.join("build-c.sh"))
        .arg(&out)
        .status()
        .expect("bash runs tests/build-c.sh");
    assert!(status.success(), "tests/build-c.sh failed");
    println!("cargo:rustc-env=VRAMSHIM_TEST_C_DIR={}", out.display());
}
