//! Real PyTorch (PyPI's CUDA wheels of three releases: 2.15 built for CUDA 13, 2.6 for CUDA
//! 12.4, 2.4.1 for CUDA 12.1; installed by `scripts/fetch-torch.sh` into cached venvs, never
//! committed) on the fake GPU libraries (`fakegpu/`), with and without the real recorder:
//! torch's own figures must equal the fake driver's bookkeeping and the recorded log. The
//! allocator checks, the OOM message and `dryrun` run on every release. A release that cannot
//! be installed is SKIPPED, a failure under `VRAMSHIM_REQUIRE_TORCH=1`.

mod common;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::torch::{CUBLAS_HANDLE, CUDNN_HANDLE, TORCH_FAKES, repo, rounded_async_peak};
use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A PyTorch release from PyPI and the fakes it loads, by SONAME (its libraries' DT_NEEDED
/// entries, plus NVML, which it dlopens). They are preloaded so that they win over torch's
/// RPATH to NVIDIA's wheels wherever those are installed.
struct Release {
    version: &'static str,
    /// `torch.version.cuda`, and the runtime SONAME it loads.
    cuda: &'static str,
    cudart: &'static str,
    fakes: &'static [&'static str],
    /// The documentation link that ends this release's out-of-memory message.
    oom_docs: &'static str,
}

/// torch 2.15.0+cu132: the current release, the first in the list.
const CURRENT: Release = Release {
    version: "2.15.0",
    cuda: "13.2",
    cudart: "libcudart.so.13",
    fakes: TORCH_FAKES,
    oom_docs: "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf",
};

/// torch 2.6.0+cu124: PyPI's default build of that release is for CUDA 12.
const CUDA12: Release = Release {
    version: "2.6.0",
    cuda: "12.4",
    cudart: "libcudart.so.12",
    fakes: &[
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
    ],
    oom_docs: "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables",
};

/// torch 2.4.1+cu121: the oldest release with cuDNN 9 (2.3 and older need cuDNN 8); it still
/// links NVTX 2's libnvToolsExt.so.1 and bundles its own cuSPARSELt.
const CUDA12_OLD: Release = Release {
    version: "2.4.1",
    cuda: "12.1",
    cudart: "libcudart.so.12",
    fakes: &[
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
    ],
    oom_docs: "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables",
};

const RELEASES: [&Release; 3] = [&CURRENT, &CUDA12, &CUDA12_OLD];

/// An installed release: the venv's python and the fakes to preload.
struct Torch {
    release: &'static Release,
    python: PathBuf,
}

/// The venv's python with `release`, or `None` (with a loud note) when it cannot be installed.
fn install(release: &Release) -> Option<PathBuf> {
    fetch_torch(release, &[])
}

/// Runs `scripts/fetch-torch.sh OPTIONS VERSION`: the venv's python, or `None` (with a loud
/// note) when it cannot be installed.
fn fetch_torch(release: &Release, options: &[&str]) -> Option<PathBuf> {
    let output = Command::new("bash")
        .arg(repo().join("scripts/fetch-torch.sh"))
        .args(options)
        .arg(release.version)
        .output()
        .expect("run fetch-torch.sh");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(3) && std::env::var_os("VRAMSHIM_REQUIRE_TORCH").is_none() {
        skipped(&format!(
            "fakegpu_torch: torch {} {}: {} (set VRAMSHIM_REQUIRE_TORCH=1 to make this a failure)",
            release.version,
            options.join(" "),
            stderr.trim()
        ));
        return None;
    }
    assert!(
        output.status.success(),
        "fetch-torch.sh {} failed: {stderr}",
        release.version
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    Some(PathBuf::from(
        stdout.lines().last().expect("python path").trim(),
    ))
}

/// Every release that could be installed (each installed once per test binary).
fn torches() -> Vec<Torch> {
    static PYTHONS: OnceLock<Vec<Option<PathBuf>>> = OnceLock::new();
    let pythons = PYTHONS.get_or_init(|| RELEASES.iter().map(|r| install(r)).collect());
    RELEASES
        .iter()
        .zip(pythons)
        .filter_map(|(release, python)| python.clone().map(|python| Torch { release, python }))
        .collect()
}

/// The current release, when it could be installed.
fn current() -> Option<Torch> {
    torches()
        .into_iter()
        .find(|torch| torch.release.version == CURRENT.version)
}

/// The current release with the extras of `fetch-torch.sh --extras` (torchvision, triton),
/// when they could be installed (once per test binary).
fn current_with_extras() -> Option<Torch> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON
        .get_or_init(|| fetch_torch(&CURRENT, &["--extras"]))
        .clone()
        .map(|python| Torch {
            release: &CURRENT,
            python,
        })
}

impl Torch {
    fn fake_preload(&self) -> String {
        self.release
            .fakes
            .iter()
            .map(|soname| {
                let path = Path::new(vramshim_fakegpu::LIB_DIR).join(soname);
                assert!(path.is_file(), "{} was not built", path.display());
                path.display().to_string()
            })
            .collect::<Vec<_>>()
            .join(":")
    }
}

/// What one run printed (its last JSON line) and, when recorded, its log.
struct TorchRun {
    output: Output,
    result: Value,
    log: Option<PathBuf>,
}

/// Runs `tests/python/torch_fakegpu.py MODE` on a fake card of `memory` bytes; `recorded`
/// preloads the real recorder ahead of the fakes.
fn run_torch(
    torch: &Torch,
    mode: &str,
    memory: u64,
    env: &[(&str, &str)],
    recorded: bool,
) -> TorchRun {
    run_torch_script(torch, "torch_fakegpu.py", mode, memory, env, recorded)
}

/// Runs `tests/python/SCRIPT MODE` as `run_torch` does.
fn run_torch_script(
    torch: &Torch,
    script: &str,
    mode: &str,
    memory: u64,
    env: &[(&str, &str)],
    recorded: bool,
) -> TorchRun {
    let dir = scratch(&format!("torch-{}-{mode}", torch.release.version));
    let preload = if recorded {
        format!("{}:{}", shim().display(), torch.fake_preload())
    } else {
        torch.fake_preload()
    };
    let mut command = Command::new(&torch.python);
    command
        .arg("-W")
        .arg("ignore")
        .arg(repo().join("tests/python").join(script))
        .arg(mode)
        .env("LD_PRELOAD", preload)
        .env("LD_LIBRARY_PATH", vramshim_fakegpu::LIB_DIR)
        .env("VRAMSHIM_FAKEGPU_MEMORY", memory.to_string())
        .env("VRAMSHIM_FAKEGPU_LOG", dir.join("unimplemented.txt"))
        .env("VRAMSHIM_OUTPUT", dir.join("%p.vlog"))
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("VRAMSHIM_STACK")
        .env_remove("VRAMSHIM_MODE");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "torch {} {mode} failed:\n{stdout}\n{stderr}",
        torch.release.version
    );
    let last = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no output:\n{stderr}"));
    let result: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
    let log = recorded.then(|| {
        let run = Run {
            output: output.clone(),
            dir: dir.clone(),
        };
        run.log()
    });
    TorchRun {
        output,
        result,
        log,
    }
}

/// Device 0's allocations in the log, replayed: (allocations, frees, peak live bytes).
fn replay(log: &Path, alloc_api: &str, free_api: &str) -> (usize, usize, u64) {
    let dump = dump(log);
    let events = events(&dump);
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut allocs, mut frees, mut current, mut peak) = (0, 0, 0u64, 0u64);
    for event in events.iter().filter(|e| e["device"] == 0) {
        let api = event["api"].as_str().unwrap_or_default();
        if event["event"] == "alloc" && api == alloc_api {
            allocs += 1;
            let size = u64_of(event, "size");
            live.insert(u64_of(event, "addr"), size);
            current += size;
            peak = peak.max(current);
        } else if event["event"] == "free" && api == free_api {
            frees += 1;
            let size = live
                .remove(&u64_of(event, "addr"))
                .expect("free of a recorded address");
            current -= size;
        }
    }
    (allocs, frees, peak)
}

fn pairs(value: &Value) -> Vec<Vec<u64>> {
    arr(value)
        .iter()
        .map(|step| arr(step).iter().filter_map(Value::as_u64).collect())
        .collect()
}

#[test]
fn caching_allocator_segments_equal_the_driver_and_the_log() {
    for torch in torches() {
        eprintln!("torch {}", torch.release.version);
        let run = run_torch(&torch, "caching", 80 << 30, &[], true);
        let r = &run.result;
        // Reserved bytes equal the driver's used bytes at every step: 2 MiB small segment, a
        // 20 MiB large one, a 50 MiB oversize one, then all of it back after empty_cache.
        assert_eq!(
            pairs(&r["steps"]),
            vec![
                vec![2 * MIB, 2 * MIB],
                vec![22 * MIB, 22 * MIB],
                vec![72 * MIB, 72 * MIB],
                vec![72 * MIB, 72 * MIB],
                vec![0, 0]
            ],
            "{r}"
        );
        assert_eq!(r["reserved_peak"], 72 * MIB);
        assert_eq!(r["num_device_alloc"], 3);
        assert_eq!(r["num_device_free"], 3);
        let (allocs, frees, peak) =
            replay(run.log.as_ref().expect("log"), "cudaMalloc", "cudaFree");
        assert_eq!(
            (allocs, frees, peak),
            (3, 3, 72 * MIB),
            "{}",
            String::from_utf8_lossy(&run.output.stderr)
        );
    }
}

#[test]
fn out_of_memory_message_is_torchs_own_with_nvml_figures() {
    for torch in torches() {
        eprintln!("torch {}", torch.release.version);
        let run = run_torch(&torch, "oom", 1 << 30, &[], true);
        let r = &run.result;
        assert_eq!(
            r["message"].as_str().expect("an OutOfMemoryError"),
            format!(
                "CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity \
                 of 1024.00 MiB of which 424.00 MiB is free. Including non-PyTorch memory, this \
                 process has 600.00 MiB memory in use. Of the allocated memory 600.00 MiB is \
                 allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If \
                 reserved but unallocated memory is large try setting \
                 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See \
                 documentation for Memory Management  ({})",
                torch.release.oom_docs
            )
        );
        assert_eq!(r["used"], 600 * MIB);
        // The log has the failed request twice (torch retries once after releasing its cache,
        // which is empty here), each with the free memory the driver reported after it.
        let dump = dump(run.log.as_ref().expect("log"));
        let events = events(&dump);
        let failed = select(&events, "alloc_failed", "cudaMalloc");
        assert_eq!(failed.len(), 2, "{failed:?}");
        for failure in failed {
            assert_eq!(u64_of(failure, "size"), 600 * MIB);
            assert_eq!(u64_of(failure, "mem_free"), 424 * MIB);
            assert_eq!(u64_of(failure, "mem_total"), 1024 * MIB);
            assert_eq!(u64_of(failure, "result"), 2);
        }
    }
}

#[test]
fn expandable_segments_map_through_the_drivers_vmm() {
    for torch in torches() {
        eprintln!("torch {}", torch.release.version);
        let run = run_torch(
            &torch,
            "expandable",
            1 << 30,
            &[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")],
            true,
        );
        let r = &run.result;
        assert_eq!(
            pairs(&Value::Array(vec![
                r["grown"].clone(),
                r["emptied"].clone()
            ])),
            vec![vec![100 * MIB, 100 * MIB], vec![0, 0]]
        );
        assert_eq!(r["reserved_peak"], 100 * MIB);
        let dump = dump(run.log.as_ref().expect("log"));
        let events = events(&dump);
        // Five 20 MiB physical chunks, each created, mapped, unmapped and released (the log names
        // a release by its handle).
        let created = select(&events, "create", "cuMemCreate");
        assert_eq!(
            created
                .iter()
                .map(|e| u64_of(e, "size"))
                .collect::<Vec<_>>(),
            vec![20 * MIB; 5]
        );
        let handles = |list: Vec<&Value>| {
            let mut handles: Vec<u64> = list.iter().map(|e| u64_of(e, "handle")).collect();
            handles.sort_unstable();
            handles
        };
        assert_eq!(
            handles(select(&events, "release", "cuMemRelease")),
            handles(created)
        );
        let mapped: u64 = select(&events, "map", "cuMemMap")
            .iter()
            .map(|e| u64_of(e, "size"))
            .sum();
        let unmapped: u64 = select(&events, "unmap", "cuMemUnmap")
            .iter()
            .map(|e| u64_of(e, "size"))
            .sum();
        assert_eq!((mapped, unmapped), (100 * MIB, 100 * MIB));
        assert!(select(&events, "alloc", "cudaMalloc").is_empty());
    }
}

#[test]
fn malloc_async_backend_uses_the_pools_caching() {
    for torch in torches() {
        eprintln!("torch {}", torch.release.version);
        let run = run_torch(
            &torch,
            "async",
            1 << 30,
            &[("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")],
            true,
        );
        let r = &run.result;
        // (reserved, allocated, driver used): torch sets the pool's release threshold to the
        // maximum, so a freed block stays reserved (cached) through a synchronize until empty_cache.
        let live = vec![40 * MIB, 40 * MIB, 40 * MIB];
        let cached = vec![40 * MIB, 10 * MIB, 40 * MIB];
        assert_eq!(
            pairs(&Value::Array(vec![
                r["live"].clone(),
                r["freed"].clone(),
                r["synced"].clone(),
                r["emptied"].clone()
            ])),
            vec![live, cached.clone(), cached, vec![0, 0, 0]],
            "{r}"
        );
        let dump = dump(run.log.as_ref().expect("log"));
        let events = events(&dump);
        assert_eq!(select(&events, "alloc", "cudaMallocAsync").len(), 2);
        assert_eq!(select(&events, "free", "cudaFreeAsync").len(), 2);
    }
}

/// PyTorch's own trace action for a tensor event of the log.
fn torch_action(event: &str) -> Option<&'static str> {
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

#[test]
fn tensors_in_the_caching_allocator_equal_torchs_own_history() {
    for torch in torches() {
        eprintln!("torch {}", torch.release.version);
        tensors_equal_torchs_own_history(&torch, false);
    }
}

/// With `expandable_segments:True` the segments are ranges mapped page by page (`cuMemCreate`
/// + `cuMemMap`), never a `cudaMalloc`; the tracker checks its layout against those.
#[test]
fn tensors_in_expandable_segments_equal_torchs_own_history() {
    for torch in torches() {
        eprintln!("torch {}", torch.release.version);
        tensors_equal_torchs_own_history(&torch, true);
    }
}

fn tensors_equal_torchs_own_history(torch: &Torch, expandable: bool) {
    // No stacks: the peak's JSON tree of deep torch stacks nests past serde_json's limit.
    let mut env = vec![("VRAMSHIM_STACK", "none")];
    if expandable {
        env.push(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"));
    }
    let run = run_torch(torch, "trace", 80 << 30, &env, true);
    let r = &run.result;
    let (segment_call, segment_alloc, segment_free) = if expandable {
        ("cuMemMap", "segment_map", "segment_unmap")
    } else {
        ("cudaMalloc", "segment_alloc", "segment_free")
    };
    let stderr = String::from_utf8_lossy(&run.output.stderr);
    assert!(!stderr.contains("vramshim:"), "{stderr}");
    let log = run.log.as_ref().expect("log");
    let dump = dump(log);
    let notes: Vec<&str> = dump
        .iter()
        .filter(|v| v["type"] == "note")
        .filter_map(|v| v["text"].as_str())
        .collect();
    let verified = format!("torch: recording tensors: PyTorch's {segment_alloc} of ");
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with(&verified)
                && n.ends_with(&format!("the {segment_call} recorded"))),
        "{notes:?}"
    );
    let events = events(&dump);
    // Torch's history (an MLP and a transformer step) is the log's tensor events up to the
    // snapshot, entry for entry: action, address, size (requested bytes).
    let recorded: Vec<(String, u64, u64)> = events
        .iter()
        .filter_map(|e| {
            let action = torch_action(e["event"].as_str()?)?;
            assert_eq!(e["api"], "torch.CUDACachingAllocator");
            assert_eq!(e["device"], 0);
            Some((action.to_owned(), u64_of(e, "addr"), u64_of(e, "size")))
        })
        .collect();
    let torch: Vec<(String, u64, u64)> = arr(&r["entries"])
        .iter()
        .map(|entry| {
            let entry = arr(entry);
            (
                entry[0].as_str().expect("action").to_owned(),
                entry[1].as_u64().expect("addr"),
                entry[2].as_u64().expect("size"),
            )
        })
        .collect();
    let count = |action: &str| torch.iter().filter(|(a, _, _)| a == action).count();
    assert!(
        count("alloc") > 400 && count("free_completed") > 300,
        "{}",
        torch.len()
    );
    // Torch counts each mapped range as a device allocation, each unmapped one as a free.
    assert_eq!(count(segment_alloc) as u64, u64_of(r, "num_device_alloc"));
    if expandable {
        assert_eq!(count("segment_alloc"), 0);
        assert_eq!(count(segment_free) as u64, u64_of(r, "num_device_free"));
    } else {
        assert_eq!(count("segment_map") + count("segment_unmap"), 0);
    }
    assert!(u64_of(r, "num_device_free") > 0, "{r}");
    assert!(recorded.len() >= torch.len());
    assert_eq!(recorded[..torch.len()], torch[..]);
    // Requested sizes are the tensors' sizes.
    for known in arr(&r["known"]) {
        let (addr, bytes) = (known[0].as_u64().unwrap(), known[1].as_u64().unwrap());
        let first = recorded
            .iter()
            .find(|(action, a, _)| action == "alloc" && *a == addr)
            .expect("the known tensor's block");
        assert_eq!(first.2, bytes, "tensor at {addr:#x}");
    }
    // Every block lies inside a segment cudaMalloc returned and that is still held, or
    // (expandable) inside pages mapped back to back and still mapped.
    let mut segments: std::collections::BTreeMap<u64, u64> = Default::default();
    for event in &events {
        let (addr, size) = (u64_of(event, "addr"), u64_of(event, "size"));
        match (event["event"].as_str(), event["api"].as_str()) {
            (Some("alloc"), Some("cudaMalloc")) | (Some("map"), Some("cuMemMap")) => {
                segments.insert(addr, size);
            }
            (Some("free"), Some("cudaFree")) | (Some("unmap"), Some("cuMemUnmap")) => {
                segments.remove(&addr);
            }
            (Some("tensor_alloc"), _) => {
                // Walk the segments (pages) from the block's start to its end.
                let (mut at, end) = (addr, addr + size.max(1));
                while at < end {
                    let next = segments
                        .range(..=at)
                        .next_back()
                        .filter(|&(&base, &len)| at < base + len)
                        .map(|(&base, &len)| base + len);
                    at = next
                        .unwrap_or_else(|| panic!("block {addr:#x}+{size}: {at:#x} in no segment"));
                    if !expandable {
                        assert!(end <= at, "block {addr:#x}+{size} past its segment");
                    }
                }
            }
            _ => {}
        }
    }
    assert!(!segments.is_empty(), "no {segment_call} recorded");
    // The tensor view's peak is torch's allocated peak (block sizes, splits and merges
    // modelled) and the two cuBLAS handles' own memory; the driver view's is its reserved
    // peak and the same handles.
    let peak = json_of(&[OsStr::new("peak"), OsStr::new("--json"), log.as_os_str()]);
    assert_eq!(
        arr(&peak["warnings"])
            .iter()
            .filter(|w| w.as_str().unwrap_or_default().contains("allocator model"))
            .count(),
        0,
        "{peak}"
    );
    let device = &arr(&peak["devices"])[0];
    assert_eq!(
        u64_of(device, "bytes"),
        u64_of(r, "allocated_peak") + 2 * CUBLAS_HANDLE,
        "{peak}"
    );
    let segments_then = u64_of(&device["pytorch_segments"], "bytes");
    assert!(
        segments_then >= u64_of(r, "allocated_peak") && segments_then <= u64_of(r, "reserved_peak")
    );
    let driver = json_of(&[
        OsStr::new("peak"),
        OsStr::new("--segments"),
        OsStr::new("--device"),
        OsStr::new("0"),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    // The driver's view: torch's segments and the cuBLAS handles' own memory.
    assert_eq!(
        u64_of(&arr(&driver["devices"])[0], "bytes"),
        u64_of(r, "reserved_peak") + 2 * CUBLAS_HANDLE,
        "{driver}"
    );
    // At exit the program's tensors were freed (Python's finalisation); what remains is the
    // allocator's cache, shown as such: the segments of torch's snapshot (nothing was
    // emptied after it; an expandable segment is one however many ranges it mapped). The two
    // cuBLAS handles are never destroyed: their 6 allocations are leaks, and so are the
    // blocks torch itself still held once the program's tensors were gone (none in 2.15;
    // 2.6 and 2.4.1 keep their two cuBLAS workspaces to the end).
    let kept: Vec<u64> = arr(&r["kept"]).iter().filter_map(Value::as_u64).collect();
    let leaks = json_of(&[OsStr::new("leaks"), OsStr::new("--json"), log.as_os_str()]);
    let device = &arr(&leaks["devices"])[0];
    assert_eq!(
        (
            device["device"].as_i64(),
            device["count"].as_u64(),
            device["bytes"].as_u64()
        ),
        (
            Some(0),
            Some(6 + kept[0]),
            Some(2 * CUBLAS_HANDLE + kept[1])
        ),
        "{leaks}"
    );
    let torch_segments = pairs(&r["segments"]);
    let torch_segment_bytes: u64 = torch_segments.iter().map(|s| s[1]).sum();
    assert_eq!(torch_segment_bytes, u64_of(r, "reserved"));
    assert_eq!(
        device["pytorch_segments"]["count"].as_u64(),
        Some(torch_segments.len() as u64),
        "{leaks}"
    );
    assert_eq!(
        device["pytorch_segments"]["bytes"], r["reserved"],
        "{leaks}"
    );
    let (_, text, _) = vramshim(&[OsStr::new("leaks"), log.as_os_str()]);
    assert!(
        text.contains(&format!(
            "PyTorch's caching allocator held {} segments",
            torch_segments.len()
        )),
        "{text}"
    );
}

/// Under both segment kinds: `cudaMalloc` and expandable (mapped pages).
#[test]
fn tensors_on_two_devices_from_four_threads() {
    let Some(torch) = current() else { return };
    for conf in ["", "expandable_segments:True"] {
        eprintln!("PYTORCH_CUDA_ALLOC_CONF={conf}");
        tensors_on_two_devices(&torch, conf);
    }
}

fn tensors_on_two_devices(torch: &Torch, conf: &str) {
    let run = run_torch(
        torch,
        "two_devices",
        80 << 30,
        &[
            ("VRAMSHIM_FAKEGPU_COUNT", "2"),
            ("VRAMSHIM_STACK", "none"),
            ("PYTORCH_CUDA_ALLOC_CONF", conf),
        ],
        true,
    );
    let r = &run.result;
    assert_eq!(r["count"], 2);
    let log = run.log.as_ref().expect("log");
    let dump = dump(log);
    let events = events(&dump);
    // The second device's allocator is created after the tracker first attached: it is
    // reached by attaching again, and no entry is recorded twice.
    for device in 0..2u64 {
        let allocs = events
            .iter()
            .filter(|e| e["event"] == "tensor_alloc" && e["device"] == device)
            .count() as u64;
        assert_eq!(
            allocs,
            r["allocations"][device as usize].as_u64().unwrap(),
            "device {device}"
        );
        let frees = events
            .iter()
            .filter(|e| e["event"] == "tensor_free" && e["device"] == device)
            .count() as u64;
        assert_eq!(frees, allocs, "device {device}");
    }
    let peak = json_of(&[OsStr::new("peak"), OsStr::new("--json"), log.as_os_str()]);
    for device in arr(&peak["devices"])
        .iter()
        .filter(|d| d["device"].as_i64() >= Some(0))
    {
        let index = device["device"].as_u64().unwrap() as usize;
        assert_eq!(device["bytes"], r["allocated_peaks"][index], "{peak}");
    }
}

/// Checked against a `cudaMalloc` and, under expandable segments, against mapped pages.
#[test]
fn a_tensor_layout_that_does_not_match_steps_aside_with_one_note_and_one_warning() {
    let Some(torch) = current() else { return };
    for expandable in [false, true] {
        eprintln!("expandable: {expandable}");
        layout_that_does_not_match(&torch, expandable);
    }
}

fn layout_that_does_not_match(torch: &Torch, expandable: bool) {
    let conf = if expandable {
        "expandable_segments:True"
    } else {
        ""
    };
    let run = run_torch(
        torch,
        "train",
        80 << 30,
        &[
            ("VRAMSHIM_TEST_TORCH_LAYOUT_BREAK", "1"),
            ("PYTORCH_CUDA_ALLOC_CONF", conf),
        ],
        true,
    );
    // The program ran as usual (run_torch checks its exit status and its JSON line).
    assert_eq!(run.result["steps"], 3);
    let stderr = String::from_utf8_lossy(&run.output.stderr);
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("vramshim:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    let (entry, call) = if expandable {
        ("segment_map", "cuMemMap")
    } else {
        ("segment_alloc", "cudaMalloc")
    };
    assert!(
        warnings[0].starts_with(&format!("vramshim: PyTorch tensors not recorded (PyTorch's TraceEntry layout is not the one known: its first {entry} reads")),
        "{stderr}"
    );
    assert!(warnings[0].contains(&format!("the {call} was")), "{stderr}");
    let dump = dump(run.log.as_ref().expect("log"));
    let notes: Vec<&str> = dump
        .iter()
        .filter(|v| v["type"] == "note")
        .filter_map(|v| v["text"].as_str())
        .filter(|t| t.starts_with("torch: tensors not recorded"))
        .collect();
    assert_eq!(notes.len(), 1, "{notes:?}");
    let events = events(&dump);
    assert!(events.iter().all(|e| {
        !e["event"]
            .as_str()
            .unwrap_or_default()
            .starts_with("tensor_")
    }));
    // The segments are still recorded: torch's three cudaMallocs, or its mapped ranges'
    // pages.
    if expandable {
        assert!(
            select(&events, "map", "cuMemMap").len() as u64
                >= u64_of(&run.result, "num_device_alloc")
        );
        assert!(select(&events, "alloc", "cudaMalloc").is_empty());
    } else {
        assert_eq!(
            select(&events, "alloc", "cudaMalloc").len() as u64,
            run.result["num_device_alloc"].as_u64().unwrap()
        );
    }
}

#[test]
fn whatif_replays_the_tensors_of_a_default_allocator_recording() {
    let Some(torch) = current() else { return };
    let run = run_torch(
        &torch,
        "transformer",
        80 << 30,
        &[("VRAMSHIM_STACK", "none")],
        true,
    );
    let r = &run.result;
    let log = run.log.as_ref().expect("log");
    let whatif = json_of(&[
        OsStr::new("whatif"),
        OsStr::new("--config"),
        OsStr::new(""),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    // The model of the allocator, fed the tensors of the default-allocator run, reproduces
    // that run's own figures.
    let row = &arr(&whatif["configs"])[0];
    assert_eq!(row["peak_allocated"], r["allocated_peak"], "{whatif}");
    assert_eq!(row["peak_reserved"], r["reserved_peak"], "{whatif}");
}

#[test]
fn mlp_training_with_adam_and_device_queries() {
    for torch in torches() {
        eprintln!("torch {}", torch.release.version);
        let run = run_torch(&torch, "train", 80 << 30, &[], true);
        let r = &run.result;
        assert_eq!(r["steps"], 3);
        // The driver's used bytes: torch's reserved and the two cuBLAS handles' own memory.
        assert_eq!(
            u64_of(r, "reserved_now") + 2 * CUBLAS_HANDLE,
            u64_of(r, "used"),
            "{r}"
        );
        let (allocs, frees, peak) =
            replay(run.log.as_ref().expect("log"), "cudaMalloc", "cudaFree");
        assert_eq!(
            allocs as u64,
            r["num_device_alloc"].as_u64().expect("count")
        );
        assert_eq!(frees as u64, r["num_device_free"].as_u64().expect("count"));
        assert_eq!(peak, r["reserved_peak"].as_u64().expect("peak"), "{r}");

        // Host data round-trips through device memory; pinned memory is known; the machine is
        // the one the variables describe.
        let run = run_torch(
            &torch,
            "roundtrip",
            24 << 30,
            &[
                ("VRAMSHIM_FAKEGPU_COUNT", "2"),
                ("VRAMSHIM_FAKEGPU_NAME", "NVIDIA A100-SXM4-40GB"),
                ("VRAMSHIM_FAKEGPU_CC", "8.0"),
            ],
            false,
        );
        let r = &run.result;
        assert_eq!(r["equal"], true);
        assert_eq!(r["cuda"], torch.release.cuda);
        assert_eq!(r["runtimes"], serde_json::json!([torch.release.cudart]));
        assert_eq!(r["pinned"], true);
        assert_eq!(r["device"], "NVIDIA A100-SXM4-40GB");
        assert_eq!(r["capability"], serde_json::json!([8, 0]));
        assert_eq!(r["count"], 2);
        assert_eq!(r["total"], 24u64 << 30);
    }
}

#[test]
fn an_invalid_machine_makes_cuda_unavailable_with_one_line() {
    let Some(torch) = current() else { return };
    let output = Command::new(&torch.python)
        .args([
            "-W",
            "ignore",
            "-c",
            "import torch; print(torch.cuda.is_available())",
        ])
        .env("LD_PRELOAD", torch.fake_preload())
        .env("LD_LIBRARY_PATH", vramshim_fakegpu::LIB_DIR)
        .env("VRAMSHIM_FAKEGPU_MEMORY", "80GiB")
        .output()
        .expect("run python");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "False");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("vramshim fakegpu:"))
        .collect();
    assert_eq!(
        lines,
        vec![
            "vramshim fakegpu: VRAMSHIM_FAKEGPU_MEMORY=\"80GiB\" is invalid: expected a whole \
             number from 1 to 1125899906842624; CUDA initialisation fails"
        ],
        "{stderr}"
    );
}

/// `vramshim dryrun` of a real torch job that does not fit a 1 GiB card, on the product fakes:
/// the verdict's peak equals torch's own `max_memory_reserved()`, and the failure names the
/// script's line, torch's release-and-retry, and the smallest card that fits.
#[test]
fn dryrun_of_a_torch_job_names_its_failing_line() {
    for torch in torches() {
        eprintln!("torch {}", torch.release.version);
        let script = repo().join("tests/python/torch_dryrun.py");
        let logs = scratch("torch-dryrun");
        let fakes = Path::new(vramshim_fakegpu::LIB_DIR)
            .parent()
            .expect("fakegpu dir");
        let output = Command::new(vramshim_tool())
            .args(["dryrun", "--memory", "1GiB", "--json", "-o"])
            .arg(logs.join("%p.vlog"))
            .arg("--")
            .arg(&torch.python)
            .args(["-W", "ignore"])
            .arg(&script)
            .env("VRAMSHIM_FAKEGPU_DIR", fakes)
            .env_remove("LD_PRELOAD")
            .env_remove("PYTORCH_CUDA_ALLOC_CONF")
            .env_remove("VRAMSHIM_STACK")
            .output()
            .expect("run vramshim dryrun");
        let stderr = String::from_utf8_lossy(&output.stderr);
        // An uncaught OutOfMemoryError: Python exits 1, and so does dryrun.
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        let v: Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
        // The program's stdout went to stderr: torch's figures, printed before the failure.
        let torch: Value = stderr
            .lines()
            .find_map(|line| serde_json::from_str(line).ok())
            .unwrap_or_else(|| panic!("no torch figures in:\n{stderr}"));
        assert!(stderr.contains("torch.OutOfMemoryError"), "{stderr}");

        assert_eq!(v["fits"], false, "{v}");
        assert_eq!(v["exit"]["code"], 1);
        let device = &arr(&v["devices"])[0];
        // Weights (64 MiB in a 20 MiB-rounded segment: 64 MiB), bias (2 MiB small segment),
        // activations (256 MiB): torch's peak reserved, exactly what the recorder saw.
        assert_eq!(device["peak_recorded"], torch["reserved_peak"], "{device}");
        assert_eq!(u64_of(device, "peak_recorded"), (64 + 2 + 256) * MIB);
        let failure = &v["failure"];
        assert_eq!(failure["api"], "cudaMalloc", "{failure}");
        assert_eq!(u64_of(failure, "request"), 2048 * MIB);
        assert_eq!(failure["verdict"], "exceeded_free_memory");
        // torch frees its cached segments (none are free here) and asks once more.
        assert_eq!(failure["retry"]["succeeded"], false, "{failure}");
        let frame = &failure["python_frame"];
        assert!(
            frame["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("torch_dryrun.py")),
            "{frame}"
        );
        let text = std::fs::read_to_string(&script).expect("read script");
        let marked = text
            .lines()
            .position(|line| line.contains("# DRYRUN: too big"))
            .expect("marker line") as u64
            + 1;
        assert_eq!(u64_of(frame, "line"), marked);
        // What was live, by the user's lines: the largest stack is the activations' line (its
        // Python frames, not the allocator's native ones).
        let live = arr(&failure["live_by_stack"]);
        assert_eq!(u64_of(&live[0], "bytes"), 256 * MIB, "{failure}");
        let top = &arr(&live[0]["frames"])[0];
        assert!(
            top["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("torch_dryrun.py")),
            "{top}"
        );
        let activations = text
            .lines()
            .position(|line| line.contains("# DRYRUN: activations"))
            .expect("marker line") as u64
            + 1;
        assert_eq!(u64_of(top, "line"), activations, "{top}");
        // Needed: what was used at the failure (context included) plus the request.
        assert_eq!(
            u64_of(&v, "needed"),
            u64_of(failure, "used") + 2048 * MIB,
            "{v}"
        );
        assert_eq!(v["smallest_fitting_gpu"]["key"], "t4");
        assert_eq!(torch["num_device_alloc"], 3);
    }
}

/// Live bytes through the log of device 0: `up` events add their size, `down` events take
/// back the size their address was given (or their own size, for unmaps). Returns (ups, downs,
/// peak live bytes).
fn replay_live(log: &Path, up: (&str, &str), down: (&str, &str)) -> (u64, u64, u64) {
    let dump = dump(log);
    let events = events(&dump);
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut ups, mut downs, mut current, mut peak) = (0, 0, 0u64, 0u64);
    for event in events.iter().filter(|e| e["device"] == 0) {
        let kind = (
            event["event"].as_str().unwrap_or_default(),
            event["api"].as_str().unwrap_or_default(),
        );
        if kind == up {
            ups += 1;
            let size = u64_of(event, "size");
            live.insert(u64_of(event, "addr"), size);
            current += size;
            peak = peak.max(current);
        } else if kind == down {
            downs += 1;
            let size = match u64_of(event, "size") {
                0 => live
                    .remove(&u64_of(event, "addr"))
                    .expect("a free of a recorded address"),
                size => size,
            };
            current -= size;
        }
    }
    (ups, downs, peak)
}

/// The context a fake primary context takes in the transformer runs.
const CONTEXT: u64 = 500 * MIB;

/// Runs the transformer workload (fp32 then bf16 autocast training with varying sequence
/// lengths, then inference with `empty_cache` after each batch) on an 1100 MiB card (and the
/// two cuBLAS handles' own memory) with a 500 MiB context, recorded, under
/// `PYTORCH_CUDA_ALLOC_CONF=config` (none when empty). Checks that at every step the driver's
/// used bytes are torch's reserved bytes plus the context and the cuBLAS handles, and returns
/// the run.
fn transformer_run(torch: &Torch, config: &str) -> TorchRun {
    let context = CONTEXT.to_string();
    let mut env = vec![("VRAMSHIM_FAKEGPU_CONTEXT_BYTES", context.as_str())];
    if !config.is_empty() {
        env.push(("PYTORCH_CUDA_ALLOC_CONF", config));
    }
    let run = run_torch(
        torch,
        "transformer",
        1100 * MIB + 2 * CUBLAS_HANDLE,
        &env,
        true,
    );
    let r = &run.result;
    let steps = pairs(&r["steps"]);
    assert_eq!(steps.len(), 16, "{r}");
    for (reserved, used) in steps.iter().map(|s| (s[0], s[1])) {
        assert_eq!(
            used,
            reserved + CONTEXT + 2 * CUBLAS_HANDLE,
            "{config}: {r}"
        );
    }
    let inference = pairs(&r["inference"]);
    assert_eq!(inference.len(), 8, "{r}");
    for batch in &inference {
        assert_eq!(
            batch[2],
            batch[1] + CONTEXT + 2 * CUBLAS_HANDLE,
            "{config}: {r}"
        );
    }
    assert_eq!(r["num_ooms"], 0, "{config}: {r}");
    run
}

/// A small TransformerEncoder with Adam on the fakes, with torch's native caching allocator:
/// varying sequence lengths fragment the cache until a request fails and torch frees its
/// cached segments and retries; the recorded log replays to torch's own counters.
#[test]
fn transformer_training_with_varying_lengths_retries_as_torch_counts() {
    let Some(torch) = current() else { return };
    let run = transformer_run(&torch, "");
    let r = &run.result;
    let log = run.log.as_ref().expect("log");
    let (allocs, frees, peak) = replay_live(log, ("alloc", "cudaMalloc"), ("free", "cudaFree"));
    assert_eq!(allocs, u64_of(r, "num_device_alloc"), "{r}");
    assert_eq!(frees, u64_of(r, "num_device_free"), "{r}");
    assert_eq!(peak, u64_of(r, "reserved_peak"), "{r}");
    // Each retry is one failed cudaMalloc in the log (an OOM would be two).
    let dump = dump(log);
    let events = events(&dump);
    let failed = select(&events, "alloc_failed", "cudaMalloc");
    assert_eq!(failed.len() as u64, u64_of(r, "num_alloc_retries"), "{r}");
    // Torch's decisions on this workload, exactly: 600 MiB reserved at the peak, three
    // retries during training, every segment freed by them or by empty_cache.
    assert_eq!(u64_of(r, "reserved_peak"), 600 * MIB, "{r}");
    assert_eq!(u64_of(&r["trained"], "num_alloc_retries"), 3, "{r}");
    assert_eq!((allocs, frees), (98, 76), "{r}");
    // Inference: each empty_cache gives back every segment but the weights' and Adam's
    // (44 MiB); the frees it caused add up to the cudaFree calls after training.
    let inference = pairs(&r["inference"]);
    assert!(inference.iter().all(|b| b[1] == 44 * MIB), "{r}");
    let inference_frees: u64 = inference.iter().map(|b| b[0]).sum();
    assert_eq!(
        inference_frees,
        frees - u64_of(&r["trained"], "num_device_free"),
        "{r}"
    );
    assert_eq!(inference_frees, 34, "{r}");
}

/// The same workload with expandable segments (physical chunks mapped into one reserved
/// range, tensors placed across the chunks' boundaries) and with the cudaMallocAsync backend.
#[test]
fn transformer_training_under_expandable_segments_and_malloc_async() {
    let Some(torch) = current() else { return };
    let run = transformer_run(&torch, "expandable_segments:True");
    let r = &run.result;
    let log = run.log.as_ref().expect("log");
    // Mapped bytes in the log peak at torch's reserved peak: 554 MiB, less than the native
    // allocator's 600 MiB and without a retry.
    let (maps, unmaps, mapped_peak) =
        replay_live(log, ("map", "cuMemMap"), ("unmap", "cuMemUnmap"));
    assert_eq!(mapped_peak, u64_of(r, "reserved_peak"), "{r}");
    assert_eq!(mapped_peak, 554 * MIB, "{r}");
    assert_eq!(r["num_alloc_retries"], 0, "{r}");
    let expandable_dump = dump(log);
    let expandable_events = events(&expandable_dump);
    assert_eq!(
        select(&expandable_events, "create", "cuMemCreate").len() as u64,
        maps
    );
    assert_eq!(
        select(&expandable_events, "release", "cuMemRelease").len() as u64,
        unmaps
    );
    assert!(select(&expandable_events, "alloc", "cudaMalloc").is_empty());
    // empty_cache unmaps all but the weights' and Adam's chunks (42 MiB).
    assert!(
        pairs(&r["inference"]).iter().all(|b| b[1] == 42 * MIB),
        "{r}"
    );

    let run = transformer_run(&torch, "backend:cudaMallocAsync");
    let r = &run.result;
    let log = run.log.as_ref().expect("log");
    // The log has every stream-ordered request, each freed by the end. torch's allocated
    // peak is the driver pool's used-memory high watermark, which counts each block at the
    // fake driver's 512-byte granularity: the log's requests, so rounded, peak at it exactly
    // (unrounded they peak at 516,788,952 bytes, 4,904 fewer).
    let (allocs, frees, live_peak) =
        replay_live(log, ("alloc", "cudaMallocAsync"), ("free", "cudaFreeAsync"));
    assert_eq!((allocs, frees), (5502, 5502), "{r}");
    assert_eq!(live_peak, 516_788_952, "{r}");
    assert_eq!(
        rounded_async_peak(log, 512),
        u64_of(r, "allocated_peak"),
        "{r}"
    );
    let async_dump = dump(log);
    let events = events(&async_dump);
    // One trim per empty_cache of the inference loop.
    assert_eq!(select(&events, "trim", "cudaMemPoolTrimTo").len(), 8);
    assert!(select(&events, "alloc", "cudaMalloc").is_empty());
}

/// (reserved, used) before the GEMM, after it, and after a `Linear` with bias.
fn gemm_steps(result: &Value) -> Vec<Vec<u64>> {
    pairs(&Value::Array(vec![
        result["before"].clone(),
        result["gemm"].clone(),
        result["linear"].clone(),
    ]))
}

/// Torch's cuBLAS workspace is its own allocation: on a compute capability 9.0 card the
/// first GEMM makes torch reserve one 32 MiB segment (CublasHandlePool.cpp's default for
/// sm90: 4096 KiB x 8), which the log shows as a cudaMalloc; `CUBLAS_WORKSPACE_CONFIG=:16:8`
/// (128 KiB) fits in a segment torch already has. The cuBLASLt call after it takes no further
/// memory. The first GEMM also makes the thread's cuBLAS handle, whose own memory (through
/// cuMemAlloc_v2, not torch's) the driver's used bytes show beside torch's reserved bytes.
#[test]
fn cublas_workspace_is_torchs_and_follows_its_config() {
    let Some(torch) = current() else { return };
    let run = run_torch(&torch, "gemm", 24 << 30, &[], true);
    let r = &run.result;
    assert_eq!(
        gemm_steps(r),
        vec![
            vec![2 * MIB, 2 * MIB],
            vec![34 * MIB, 34 * MIB + CUBLAS_HANDLE],
            vec![36 * MIB, 36 * MIB + CUBLAS_HANDLE]
        ],
        "{r}"
    );
    let dump = dump(run.log.as_ref().expect("log"));
    let events = events(&dump);
    let mut sizes: Vec<u64> = select(&events, "alloc", "cudaMalloc")
        .iter()
        .map(|e| u64_of(e, "size"))
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes, vec![2 * MIB, 2 * MIB, 32 * MIB], "{r}");

    let run = run_torch(
        &torch,
        "gemm",
        24 << 30,
        &[("CUBLAS_WORKSPACE_CONFIG", ":16:8")],
        false,
    );
    let r = &run.result;
    assert_eq!(
        gemm_steps(r),
        vec![
            vec![2 * MIB, 2 * MIB],
            vec![2 * MIB, 2 * MIB + CUBLAS_HANDLE],
            vec![4 * MIB, 4 * MIB + CUBLAS_HANDLE]
        ],
        "{r}"
    );
}

/// Checks that the run's log replays (its `cudaMalloc`s and `cudaFree`s) to torch's own
/// `num_device_alloc`, `num_device_free` and reserved peak, that these are `expected`
/// (segments allocated, segments freed, peak bytes), and that torch counted no OOM.
fn assert_log_is_torchs(run: &TorchRun, expected: (u64, u64, u64)) {
    let r = &run.result;
    let log = run.log.as_ref().expect("log");
    let (allocs, frees, peak) = replay(log, "cudaMalloc", "cudaFree");
    let recorded = (allocs as u64, frees as u64, peak);
    let torchs = (
        u64_of(r, "num_device_alloc"),
        u64_of(r, "num_device_free"),
        u64_of(r, "reserved_bytes_peak"),
    );
    assert_eq!(recorded, torchs, "{r}");
    assert_eq!(recorded, expected, "{r}");
    assert_eq!(r["num_ooms"], 0, "{r}");
}

/// Runs `tests/python/torch_cudnn.py MODE` (convolutions through the fake cuDNN).
fn run_cudnn(torch: &Torch, mode: &str, memory: u64, env: &[(&str, &str)]) -> TorchRun {
    run_torch_script(torch, "torch_cudnn.py", mode, memory, env, true)
}

/// Sizes of the log's `cudaMalloc` calls on device 0, sorted.
fn malloc_sizes(log: &Path, event: &str) -> Vec<u64> {
    let dump = dump(log);
    let mut sizes: Vec<u64> = select(&events(&dump), event, "cudaMalloc")
        .iter()
        .map(|e| u64_of(e, "size"))
        .collect();
    sizes.sort_unstable();
    sizes
}

/// A convolution through the cuDNN v9 backend API (cudnn-frontend's heuristics, engine
/// configs, execution plans): the fake's first engine asks for one image's im2col matrix as
/// workspace (64 x 3x3 x 128x128 x 4 bytes = 36 MiB), which torch allocates from its caching
/// allocator, so the log shows it as its own 36 MiB segment. On a card where it does not fit,
/// torch falls back to the engine without workspace and the convolution still runs.
#[test]
fn cudnn_convolution_workspace_is_torchs_and_falls_back_when_it_does_not_fit() {
    let Some(torch) = current() else { return };
    let run = run_cudnn(&torch, "conv_workspace", 80 << 30, &[]);
    let r = &run.result;
    // Input (4 MiB) and weight (147456 bytes) before, the 4 MiB output after; at the peak the
    // 36 MiB workspace on top.
    assert_eq!(u64_of(r, "before"), 4 * MIB + 147456, "{r}");
    assert_eq!(u64_of(r, "after"), 8 * MIB + 147456, "{r}");
    assert_eq!(u64_of(r, "allocated_bytes_peak"), 44 * MIB + 147456, "{r}");
    assert_eq!(r["num_ooms"], 0, "{r}");
    // Segments: 2 MiB (small pool: the weight), 20 MiB (input and output), 36 MiB (workspace).
    let log = run.log.as_ref().expect("log");
    assert_eq!(
        malloc_sizes(log, "alloc"),
        vec![2 * MIB, 20 * MIB, 36 * MIB],
        "{r}"
    );
    assert_eq!(u64_of(r, "reserved_bytes_current"), 58 * MIB, "{r}");
    // Beside torch's segments, the one cuDNN handle's own memory (no cuBLAS here).
    assert_eq!(u64_of(r, "used"), 58 * MIB + CUDNN_HANDLE, "{r}");

    // A 52 MiB card: the workspace fails (torch frees its cache, which has nothing free, and
    // asks again), torch counts one OOM, and the engine without workspace runs.
    let run = run_cudnn(&torch, "conv_workspace", 52 * MIB, &[]);
    let r = &run.result;
    let log = run.log.as_ref().expect("log");
    assert_eq!(malloc_sizes(log, "alloc_failed"), vec![36 * MIB; 2], "{r}");
    assert_eq!(malloc_sizes(log, "alloc"), vec![2 * MIB, 20 * MIB], "{r}");
    assert_eq!(u64_of(r, "after"), 8 * MIB + 147456, "{r}");
    assert_eq!(u64_of(r, "allocated_bytes_peak"), 8 * MIB + 147456, "{r}");
    assert_eq!(r["num_ooms"], 1, "{r}");
}

/// A ResNet-18-like network (convolutions, batch norm, max pooling, residual additions)
/// trained with Adam for three steps, on a card whose context takes 500 MiB: at every step the
/// driver's used bytes are torch's reserved bytes plus the context and the libraries' own
/// memory (a cuBLAS and a cuDNN handle on each of the two threads), and the log replays to
/// torch's own counters.
#[test]
fn resnet_training_with_adam_through_the_fake_cudnn() {
    let Some(torch) = current() else { return };
    let context = CONTEXT.to_string();
    let run = run_cudnn(
        &torch,
        "resnet",
        80 << 30,
        &[("VRAMSHIM_FAKEGPU_CONTEXT_BYTES", context.as_str())],
    );
    let r = &run.result;
    let steps = pairs(&r["steps"]);
    assert_eq!(steps.len(), 3, "{r}");
    for step in &steps {
        assert_eq!(
            step[1],
            step[0] + CONTEXT + 2 * (CUBLAS_HANDLE + CUDNN_HANDLE),
            "{r}"
        );
    }
    // Torch's decisions on this workload, exactly: 15 segments, 138 MiB reserved.
    assert_log_is_torchs(&run, (15, 0, 138 * MIB));
}

/// Scaled dot-product attention forward and backward with cuDNN as the only allowed backend
/// (torch's cudnn-frontend graph API on the fake engines).
#[test]
fn cudnn_attention_runs_forward_and_backward() {
    let Some(torch) = current() else { return };
    let run = run_cudnn(&torch, "attention", 24 << 30, &[]);
    let r = &run.result;
    assert_eq!(r["shape"], serde_json::json!([4, 8, 128, 64]), "{r}");
    assert_eq!(r["grad"], serde_json::json!([4, 8, 128, 64]), "{r}");
    assert_eq!(r["num_ooms"], 0, "{r}");
}

/// Live bytes of `cudaMalloc`/`cudaFree` on DEVICE in a log: (allocations, frees, peak).
fn replay_device(log: &Path, device: u64) -> (u64, u64, u64) {
    let dump = dump(log);
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut allocs, mut frees, mut current, mut peak) = (0, 0, 0u64, 0u64);
    for event in events(&dump) {
        if event["device"] != device {
            continue;
        }
        if event["event"] == "alloc" && event["api"] == "cudaMalloc" {
            allocs += 1;
            live.insert(u64_of(event, "addr"), u64_of(event, "size"));
            current += u64_of(event, "size");
            peak = peak.max(current);
        } else if event["event"] == "free" && event["api"] == "cudaFree" {
            frees += 1;
            current -= live
                .remove(&u64_of(event, "addr"))
                .expect("a free of a recorded address");
        }
    }
    (allocs, frees, peak)
}

/// The command line of a 2-process run: torchrun (`--standalone`: a free port, so that tests
/// running at once do not meet) of `tests/python/torch_ddp.py OUT MODE` (`ddp` or `fsdp`).
fn torchrun_ddp(python: &Path, out: &Path, mode: &str) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec![python.into()];
    for arg in [
        "-W",
        "ignore",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
    ] {
        args.push(arg.into());
    }
    args.push(repo().join("tests/python/torch_ddp.py").into());
    args.push(out.into());
    args.push(mode.into());
    args
}

/// What each rank wrote (`rank0.json`, `rank1.json`).
fn ddp_ranks(out: &Path) -> Vec<Value> {
    (0..2)
        .map(|rank| {
            let path = out.join(format!("rank{rank}.json"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_json::from_str(&text).expect("rank JSON")
        })
        .collect()
}

/// `torchrun --nproc_per_node=2` DDP on two fake GPUs, recorded: the NCCL communicator spans
/// the two processes (rendezvous through shared memory named by the unique id), small
/// collectives carry each rank's real data, DDP's parameter checks and gradient all-reduces
/// complete, and each rank's log replays to its own `memory_stats()` on its own device.
#[test]
fn ddp_with_two_processes_over_the_fake_nccl() {
    let Some(torch) = current() else { return };
    // Torch's decisions, exactly: five segments, 88 MiB (the 32 MiB cuBLAS workspace and
    // DDP's gradient bucket among them).
    data_parallel_run(&torch, "ddp", (5, 0, 88 * MIB));
}

/// The same with FSDP2 (`fully_shard` per layer and on the model): parameters sharded
/// across the processes, gathered for each layer (all-gather) and gradients reduce-scattered.
#[test]
fn fsdp_with_two_processes_over_the_fake_nccl() {
    let Some(torch) = current() else { return };
    data_parallel_run(&torch, "fsdp", (8, 0, 100 * MIB));
}

/// Runs `torch_ddp.py` in MODE on 2 processes, recorded, and checks each rank's collectives,
/// steps and log; EXPECTED: each rank's (segments allocated, freed, reserved peak).
fn data_parallel_run(torch: &Torch, mode: &str, expected: (u64, u64, u64)) {
    let dir = scratch(&format!("torch-{mode}"));
    let args = torchrun_ddp(&torch.python, &dir, mode);
    let context = CONTEXT.to_string();
    let output = Command::new(&args[0])
        .args(&args[1..])
        .env(
            "LD_PRELOAD",
            format!("{}:{}", shim().display(), torch.fake_preload()),
        )
        .env("LD_LIBRARY_PATH", vramshim_fakegpu::LIB_DIR)
        .env("VRAMSHIM_FAKEGPU_COUNT", "2")
        .env("VRAMSHIM_FAKEGPU_CONTEXT_BYTES", &context)
        .env("VRAMSHIM_FAKEGPU_NCCL_TIMEOUT", "120")
        .env("VRAMSHIM_OUTPUT", dir.join("%p.vlog"))
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("VRAMSHIM_STACK")
        .env_remove("VRAMSHIM_MODE")
        .output()
        .expect("run torchrun");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "torchrun failed:\n{stderr}");
    let ranks = ddp_ranks(&dir);
    for (rank, r) in ranks.iter().enumerate() {
        assert_eq!(u64_of(r, "rank"), rank as u64);
        assert_eq!(u64_of(r, "device"), rank as u64, "{r}");
        // Ranks 1 and 2 (each rank's rank + 1): sum, gather, the root's value, the
        // reduce-scatter of [0 1 2 3] x (rank + 1), average and maximum.
        assert_eq!(
            r["all_reduce"],
            serde_json::json!([3.0, 3.0, 3.0, 3.0]),
            "{r}"
        );
        assert_eq!(
            r["all_gather"],
            serde_json::json!([[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0]]),
            "{r}"
        );
        assert_eq!(r["broadcast"], serde_json::json!([42.0]), "{r}");
        let scattered = [[0.0, 3.0], [6.0, 9.0]][rank];
        assert_eq!(r["reduce_scatter"], serde_json::json!(scattered), "{r}");
        assert_eq!(r["average"], serde_json::json!([0.5]), "{r}");
        assert_eq!(r["maximum"], serde_json::json!([17]), "{r}");
        // Every step: the driver's used bytes are torch's reserved bytes plus the context
        // and the rank's two cuBLAS handles.
        let steps = pairs(&r["steps"]);
        assert_eq!(steps.len(), 3, "{r}");
        for step in &steps {
            assert_eq!(step[1], step[0] + CONTEXT + 2 * CUBLAS_HANDLE, "{r}");
        }
        // The rank's own log, on the rank's own device, replays to its counters.
        let log = dir.join(format!("{}.vlog", u64_of(r, "pid")));
        let (allocs, frees, peak) = replay_device(&log, rank as u64);
        assert_eq!(allocs, u64_of(r, "num_device_alloc"), "{r}");
        assert_eq!(frees, u64_of(r, "num_device_free"), "{r}");
        assert_eq!(peak, u64_of(r, "reserved_peak"), "{r}");
        assert_eq!((allocs, frees, peak), expected, "{mode}: {r}");
    }
}

/// `vramshim dryrun --gpus 2 -- torchrun --nproc_per_node=2 ...`: one verdict over both
/// ranks' logs, a device each, each device's recorded peak equal to its rank's own
/// `max_memory_reserved()`, and the H100 preset's context on top.
#[test]
fn dryrun_of_a_two_process_ddp_job_gives_a_verdict_for_both_ranks() {
    let Some(torch) = current() else { return };
    let dir = scratch("torch-ddp-dryrun");
    let fakes = Path::new(vramshim_fakegpu::LIB_DIR)
        .parent()
        .expect("fakegpu dir");
    let output = Command::new(vramshim_tool())
        .args(["dryrun", "--gpus", "2", "--json", "-o"])
        .arg(dir.join("%p.vlog"))
        .arg("--")
        .args(torchrun_ddp(&torch.python, &dir, "ddp"))
        .env("VRAMSHIM_FAKEGPU_DIR", fakes)
        .env("VRAMSHIM_FAKEGPU_NCCL_TIMEOUT", "120")
        .env_remove("LD_PRELOAD")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("VRAMSHIM_STACK")
        .output()
        .expect("run vramshim dryrun");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let v: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    assert_eq!(v["fits"], true, "{v}");
    assert_eq!(arr(&v["logs"]).len(), 2, "{v}");
    let context = u64_of(&v["gpu"], "context_bytes");
    let ranks = ddp_ranks(&dir);
    let devices = arr(&v["devices"]);
    assert_eq!(devices.len(), 2, "{v}");
    for (rank, (device, r)) in devices.iter().zip(&ranks).enumerate() {
        assert_eq!(u64_of(device, "device"), rank as u64, "{v}");
        assert_eq!(u64_of(r, "device"), rank as u64, "{r}");
        // The recorded peak: torch's segments and the rank's two cuBLAS handles.
        assert_eq!(
            u64_of(device, "peak_recorded"),
            u64_of(r, "reserved_peak") + 2 * CUBLAS_HANDLE,
            "{v}\n{r}"
        );
        assert_eq!(u64_of(r, "reserved_peak"), 88 * MIB, "{r}");
        assert_eq!(
            u64_of(device, "peak_used"),
            88 * MIB + 2 * CUBLAS_HANDLE + context,
            "{v}"
        );
        assert_eq!(device["failures"], 0, "{v}");
    }
}

/// torchvision's ResNet-50 (25,557,032 parameters) trained for two steps with SGD and momentum
/// on 8 images of 3x224x224, on a card whose context takes 500 MiB: at every step the driver's
/// used bytes are torch's reserved bytes plus the context, and the log replays to torch's own
/// counters.
#[test]
fn torchvision_resnet50_training_step_through_the_fake_cudnn() {
    let Some(torch) = current_with_extras() else {
        return;
    };
    let context = CONTEXT.to_string();
    let run = run_torch_script(
        &torch,
        "torch_extras.py",
        "resnet50",
        80 << 30,
        &[("VRAMSHIM_FAKEGPU_CONTEXT_BYTES", context.as_str())],
        true,
    );
    let r = &run.result;
    assert_eq!(r["parameters"], 25_557_032, "{r}");
    let steps = pairs(&r["steps"]);
    assert_eq!(steps.len(), 2, "{r}");
    for step in &steps {
        assert_eq!(
            step[1],
            step[0] + CONTEXT + 2 * (CUBLAS_HANDLE + CUDNN_HANDLE),
            "{r}"
        );
    }
    // Torch's decisions on this workload, exactly: 71 segments, 964 MiB reserved.
    assert_log_is_torchs(&run, (71, 0, 964 * MIB));
}

/// torch.compile of a small MLP (inductor generating triton kernels; triton's bundled ptxas
/// compiles them to real cubins, loaded and launched through the fake driver): the compiled
/// forward and backward train for two steps, and the log replays to torch's counters.
#[test]
fn torch_compile_of_a_small_model_runs_its_triton_kernels() {
    let Some(torch) = current_with_extras() else {
        return;
    };
    let caches = scratch("torch-compile-caches");
    let triton_cache = caches.join("triton");
    let inductor_cache = caches.join("inductor");
    let run = run_torch_script(
        &torch,
        "torch_extras.py",
        "compile",
        80 << 30,
        &[
            (
                "TRITON_CACHE_DIR",
                triton_cache.to_str().expect("utf-8 path"),
            ),
            (
                "TORCHINDUCTOR_CACHE_DIR",
                inductor_cache.to_str().expect("utf-8 path"),
            ),
            // In-process compilation: no worker processes (each would write its own log).
            ("TORCHINDUCTOR_COMPILE_THREADS", "1"),
        ],
        true,
    );
    let r = &run.result;
    assert_eq!(r["graphs"], 1, "{r}");
    assert_eq!(r["kernels"], 3, "{r}");
    // Every kernel triton built is a real CUDA ELF (e_machine 190, EM_CUDA) from ptxas: the
    // forward's fused GELU, the backward's GELU and its two reductions.
    let mut cubins = Vec::new();
    let mut pending = vec![triton_cache];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read triton cache") {
            let path = entry.expect("cache entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "cubin") {
                cubins.push(path);
            }
        }
    }
    assert_eq!(cubins.len(), 4, "{cubins:?}");
    for cubin in &cubins {
        let bytes = std::fs::read(cubin).expect("read cubin");
        assert_eq!(&bytes[..4], b"\x7fELF", "{}", cubin.display());
        assert_eq!(
            u16::from_le_bytes([bytes[18], bytes[19]]),
            190,
            "{}",
            cubin.display()
        );
    }
    let steps = pairs(&r["steps"]);
    // Used: torch's segments and the two cuBLAS handles (forward and autograd threads).
    assert_eq!(
        steps,
        vec![vec![104 * MIB, 104 * MIB + 2 * CUBLAS_HANDLE]; 2],
        "{r}"
    );
    assert_log_is_torchs(&run, (5, 0, 104 * MIB));
}
