//! Real PyTorch on the fake GPU libraries: the venv `scripts/fetch-torch.sh` installs (never
//! committed) and the fakes torch loads. Shared by fakegpu_torch.rs and torch_judge.rs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use super::{arr, dump, events, skipped, u64_of};

/// Device memory each cuBLAS handle takes for itself (one handle per thread that runs cuBLAS:
/// training makes two, the main thread's and the autograd thread's), as the fake cuBLAS
/// allocates it after a real H200's: 1 KiB + 128 KiB + 64 MiB (docs/gpus.md).
pub const CUBLAS_HANDLE: u64 = 1024 + (128 << 10) + (64 << 20);
/// Device memory each cuDNN handle takes for itself, likewise: 25,344 + 4 bytes.
pub const CUDNN_HANDLE: u64 = 25_344 + 4;
/// Device memory no hook sees that `vramshim dryrun` charges at a device's first cuBLAS handle
/// (its presets' `cublas_kernel_bytes`): what PyTorch 2.11's first matmul took outside its
/// allocator on an H100 and an H200, 69,206,016 bytes, less the handle (docs/gpus.md).
pub const CUBLAS_KERNELS: u64 = 69_206_016 - CUBLAS_HANDLE;
/// The same at a device's first cuDNN execution (`cudnn_kernel_bytes`): a first convolution
/// forward and backward took 18,874,368 bytes outside, less its two handles.
pub const CUDNN_KERNELS: u64 = 18_874_368 - 2 * CUDNN_HANDLE;

/// The fakes torch 2.15 (CUDA 13) loads, by SONAME. They are preloaded so that they win over
/// torch's RPATH to NVIDIA's wheels wherever those are installed.
pub const TORCH_FAKES: &[&str] = &[
    "libcuda.so.1",
    "libcudart.so.13",
    "libcublas.so.13",
    "libcublasLt.so.13",
    "libcudnn.so.9",
    "libnccl.so.2",
    "libnvidia-ml.so.1",
    "libcusparse.so.12",
    "libcusolver.so.12",
    "libcufft.so.12",
    "libcurand.so.10",
    "libnvrtc.so.13",
    "libnvJitLink.so.13",
    "libcupti.so.13",
    "libcufile.so.0",
    "libnvshmem_host.so.3",
    "libcusparseLt.so.0",
];

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The venv's python with torch, or `None` (with a loud note) when it cannot be installed.
pub fn torch_python() -> Option<PathBuf> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let output = Command::new("bash")
                .arg(repo().join("scripts/fetch-torch.sh"))
                .output()
                .expect("run fetch-torch.sh");
            let stderr = String::from_utf8_lossy(&output.stderr);
            if output.status.code() == Some(3)
                && std::env::var_os("VRAMSHIM_REQUIRE_TORCH").is_none()
            {
                skipped(&format!(
                    "torch tests: {} (set VRAMSHIM_REQUIRE_TORCH=1 to make this a failure)",
                    stderr.trim()
                ));
                return None;
            }
            assert!(output.status.success(), "fetch-torch.sh failed: {stderr}");
            let stdout = String::from_utf8_lossy(&output.stdout);
            Some(PathBuf::from(
                stdout.lines().last().expect("python path").trim(),
            ))
        })
        .clone()
}

/// `LD_PRELOAD` for the fakes, in [`TORCH_FAKES`] order.
pub fn fake_preload() -> String {
    preload_of(TORCH_FAKES)
}

/// Live bytes of device 0's stream-ordered allocations, each rounded up to `granularity`, at
/// their peak.
pub fn rounded_async_peak(log: &Path, granularity: u64) -> u64 {
    let dump = dump(log);
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut current, mut peak) = (0u64, 0u64);
    for event in events(&dump).iter().filter(|e| e["device"] == 0) {
        match (event["event"].as_str(), event["api"].as_str()) {
            (Some("alloc"), Some("cudaMallocAsync")) => {
                let size = u64_of(event, "size").div_ceil(granularity) * granularity;
                live.insert(u64_of(event, "addr"), size);
                current += size;
                peak = peak.max(current);
            }
            (Some("free"), Some("cudaFreeAsync")) => {
                current -= live
                    .remove(&u64_of(event, "addr"))
                    .expect("a free of a recorded address");
            }
            _ => {}
        }
    }
    peak
}

/// The fakes torch 2.6.0 (PyPI's build for CUDA 12.4) loads, by SONAME.
pub const TORCH_FAKES_CUDA12: &[&str] = &[
    "libcuda.so.1",
    "libcudart.so.12",
    "libcublas.so.12",
    "libcublasLt.so.12",
    "libcudnn.so.9",
    "libnccl.so.2",
    "libnvidia-ml.so.1",
    "libcusparse.so.12",
    "libcusolver.so.11",
    "libcufft.so.11",
    "libcurand.so.10",
    "libnvrtc.so.12",
    "libcupti.so.12",
    "libcusparseLt.so.0",
];

/// The fakes torch 2.4.1 (PyPI's build for CUDA 12.1) loads, by SONAME: no cuSPARSELt (it
/// bundles its own), and NVTX 2's `libnvToolsExt.so.1`.
pub const TORCH_FAKES_CUDA121: &[&str] = &[
    "libcuda.so.1",
    "libcudart.so.12",
    "libcublas.so.12",
    "libcublasLt.so.12",
    "libcudnn.so.9",
    "libnccl.so.2",
    "libnvidia-ml.so.1",
    "libcusparse.so.12",
    "libcusolver.so.11",
    "libcufft.so.11",
    "libcurand.so.10",
    "libnvrtc.so.12",
    "libcupti.so.12",
    "libnvToolsExt.so.1",
];

/// The venv's python of torch `version` (`scripts/fetch-torch.sh VERSION`), or `None` (with
/// a loud note) when it cannot be installed.
pub fn torch_python_of(version: &str) -> Option<PathBuf> {
    let output = Command::new("bash")
        .arg(repo().join("scripts/fetch-torch.sh"))
        .arg(version)
        .output()
        .expect("run fetch-torch.sh");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(3) && std::env::var_os("VRAMSHIM_REQUIRE_TORCH").is_none() {
        skipped(&format!(
            "torch {version} tests: {} (set VRAMSHIM_REQUIRE_TORCH=1 to make this a failure)",
            stderr.trim()
        ));
        return None;
    }
    assert!(
        output.status.success(),
        "fetch-torch.sh {version} failed: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    Some(PathBuf::from(
        stdout.lines().last().expect("python path").trim(),
    ))
}

/// `LD_PRELOAD` for `fakes`, in their order.
pub fn preload_of(fakes: &[&str]) -> String {
    fakes
        .iter()
        .map(|soname| {
            let path = Path::new(vramshim_fakegpu::LIB_DIR).join(soname);
            assert!(path.is_file(), "{} was not built", path.display());
            path.display().to_string()
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// Torch's trace entries as the workload scripts print them (`[action, address, size]` each):
/// (action, address, size).
pub fn trace_triples(entries: &Value) -> Vec<(String, u64, u64)> {
    arr(entries)
        .iter()
        .map(|entry| {
            let entry = arr(entry);
            (
                entry[0].as_str().expect("action").to_owned(),
                entry[1].as_u64().expect("addr"),
                entry[2].as_u64().expect("size"),
            )
        })
        .collect()
}

/// PyTorch's own trace action for a tensor event of the log.
pub fn torch_action(event: &str) -> Option<&'static str> {
    Some(match event {
        "tensor_alloc" => "alloc",
        "tensor_free_requested" => "free_requested",
        "tensor_free" => "free_completed",
        "tensor_segment" => "segment_alloc",
        "tensor_segment_map" => "segment_map",
        "tensor_segment_unmap" => "segment_unmap",
        _ => return None,
    })
}
