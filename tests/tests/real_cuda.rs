//! The real NVIDIA libraries (libcudart.so.12 from PyPI, libcuda.so.535 from Debian non-free,
//! downloaded at test time and cached, never committed) on a machine without a GPU: under the
//! shim, cudart's one `dlsym` of `cuGetProcAddress_v2` must return the shim's resolver, and the
//! resolver must hand out wrappers for the allocation entry points (the exact variant, `_ptsz`
//! included) and pass everything else through.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The cache directory holding the real libraries, or `None` (with a loud note) when they
/// cannot be downloaded here.
fn real_libraries() -> Option<PathBuf> {
    let output = Command::new("bash")
        .arg(repo().join("scripts/fetch-real-cuda.sh"))
        .output()
        .expect("run fetch-real-cuda.sh");
    if output.status.code() == Some(3) && std::env::var_os("VRAMSHIM_REQUIRE_REAL_CUDA").is_none() {
        skipped(&format!(
            "real_cuda: {} (set VRAMSHIM_REQUIRE_REAL_CUDA=1 to make this a failure)",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
        return None;
    }
    assert!(
        output.status.success(),
        "fetch-real-cuda.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    Some(PathBuf::from(
        stdout.lines().last().expect("cache dir").trim(),
    ))
}

#[test]
fn real_cudart_is_handed_the_shims_resolver_and_wrappers() {
    let Some(libs) = real_libraries() else { return };
    let bin = scratch("real-cuda");
    let built = Command::new("bash")
        .arg(repo().join("tests/real/build.sh"))
        .arg(&bin)
        .status()
        .expect("build real_cudart");
    assert!(built.success());

    let plain = Command::new(bin.join("real_cudart"))
        .env("LD_LIBRARY_PATH", &libs)
        .output()
        .expect("run real_cudart");
    let traced = Command::new(bin.join("real_cudart"))
        .env("LD_LIBRARY_PATH", &libs)
        .env("LD_PRELOAD", shim())
        .env("VRAMSHIM_DEBUG", "1")
        .env("VRAMSHIM_OUTPUT", bin.join("%p.vlog"))
        .output()
        .expect("run real_cudart under the shim");
    let stderr = String::from_utf8_lossy(&traced.stderr);
    let stdout = String::from_utf8_lossy(&traced.stdout);

    // Same answers with and without the shim (no GPU: cudaGetDeviceCount fails with 100).
    assert_eq!(plain.status.code(), traced.status.code(), "{stderr}");
    let device_count = |text: &str| {
        text.lines()
            .find(|line| line.starts_with("cudaGetDeviceCount"))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no cudaGetDeviceCount line in:\n{text}"))
    };
    let plain_stdout = String::from_utf8_lossy(&plain.stdout);
    assert_eq!(device_count(&plain_stdout), device_count(&stdout));
    assert!(
        device_count(&stdout).contains("100"),
        "{}",
        device_count(&stdout)
    );

    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("vramshim: debug: "))
        .collect();
    let has = |needle: &str| lines.iter().any(|line| line.contains(needle));
    assert!(
        has("dlsym(cuGetProcAddress_v2) on libcuda -> shim wrapper"),
        "{stderr}"
    );
    assert!(
        has("(cuGetProcAddress, 12000, flags 0) -> shim wrapper of cuGetProcAddress_v2"),
        "{stderr}"
    );
    assert!(
        has("(cuGetProcAddress, 11030, flags 0) -> shim wrapper of cuGetProcAddress"),
        "{stderr}"
    );
    assert!(
        has("(cuMemAlloc, 3020, flags 0) -> shim wrapper of cuMemAlloc_v2"),
        "{stderr}"
    );
    assert!(
        has("(cuMemFree, 3020, flags 0) -> shim wrapper of cuMemFree_v2"),
        "{stderr}"
    );
    assert!(
        has("flags 2) -> shim wrapper of cuMemAllocAsync_ptsz"),
        "{stderr}"
    );
    assert!(
        has("flags 0) -> shim wrapper of cuMemAllocAsync\n")
            || lines
                .iter()
                .any(|l| l.ends_with("flags 0) -> shim wrapper of cuMemAllocAsync")),
        "{stderr}"
    );
    assert!(
        has("flags 2) -> shim wrapper of cuMemFreeAsync_ptsz"),
        "{stderr}"
    );
    assert!(has("(cuMemHostAlloc, "), "{stderr}");
    // Every variant through which the real runtime begins or ends a stream capture reaches
    // the shim's count of captures in progress.
    for wrapped in [
        "(cuStreamBeginCapture, 10000, flags 0) -> shim wrapper of cuStreamBeginCapture",
        "(cuStreamBeginCapture, 10000, flags 2) -> shim wrapper of cuStreamBeginCapture_ptsz",
        "(cuStreamBeginCapture, 10010, flags 0) -> shim wrapper of cuStreamBeginCapture_v2",
        "(cuStreamBeginCapture, 10010, flags 2) -> shim wrapper of cuStreamBeginCapture_v2_ptsz",
        "(cuStreamEndCapture, 10000, flags 0) -> shim wrapper of cuStreamEndCapture",
        "(cuStreamEndCapture, 10000, flags 2) -> shim wrapper of cuStreamEndCapture_ptsz",
    ] {
        assert!(
            lines.iter().any(|line| line.ends_with(wrapped)),
            "{wrapped}\n{stderr}"
        );
    }
    // Functions the shim does not wrap come back unchanged.
    assert!(
        has("(cuLaunchKernel, ")
            && lines
                .iter()
                .any(|l| l.contains("(cuLaunchKernel, ") && l.ends_with("passed through")),
        "{stderr}"
    );
    let wrapped = lines
        .iter()
        .filter(|l| l.contains("-> shim wrapper of"))
        .count();
    let passed = lines
        .iter()
        .filter(|l| l.ends_with("-> passed through"))
        .count();
    assert!(wrapped >= 10, "only {wrapped} wrappers handed out");
    assert!(passed >= 300, "only {passed} look-ups passed through");
}
