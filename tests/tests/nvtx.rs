//! NVTX through NVIDIA's real NVTX 2 library, `libnvToolsExt.so.1` (from PyPI's
//! nvidia-nvtx-cu12 wheel, `scripts/fetch-torch.sh --nvtx`), which loads libvramshim_nvtx.so
//! through NVTX_INJECTION64_PATH as `vramshim run` sets it: torch 2.4.1's ranges and marks
//! (torch 2.4 and older call NVTX through that library), and named domains from C. Without
//! the wheel (no network) both are skipped, and `scripts/test.sh`'s summary says so.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::torch::{TORCH_FAKES_CUDA121, repo, torch_python_of};
use common::*;

/// NVIDIA's libnvToolsExt.so.1, fetched once per test binary, or `None` (with a SKIPPED
/// line) when it cannot be.
fn real_nvtx_library() -> Option<PathBuf> {
    static LIBRARY: OnceLock<Option<PathBuf>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            let output = Command::new("bash")
                .arg(repo().join("scripts/fetch-torch.sh"))
                .arg("--nvtx")
                .output()
                .expect("run fetch-torch.sh --nvtx");
            let stderr = String::from_utf8_lossy(&output.stderr);
            if output.status.code() == Some(3)
                && std::env::var_os("VRAMSHIM_REQUIRE_TORCH").is_none()
            {
                skipped(&format!(
                    "nvtx: NVIDIA's libnvToolsExt.so.1 (nvidia-nvtx-cu12): {} (set VRAMSHIM_REQUIRE_TORCH=1 to make this a failure)",
                    // The last line says why; pip's lines before it would break the summary.
                    stderr.trim().lines().last().unwrap_or_default()
                ));
                return None;
            }
            assert!(output.status.success(), "fetch-torch.sh --nvtx: {stderr}");
            let stdout = String::from_utf8_lossy(&output.stdout);
            let path = PathBuf::from(stdout.lines().last().expect("library path").trim());
            assert!(path.is_file(), "{}", path.display());
            Some(path)
        })
        .clone()
}

/// A mark of a log: (t_ns, text).
type MarkAt = (u64, String);

/// The marks of a log, as (t_ns, text).
fn marks(log: &Path) -> Vec<MarkAt> {
    dump(log)
        .iter()
        .filter(|r| r["type"] == "mark")
        .map(|r| {
            (
                u64_of(r, "t_ns"),
                r["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// `vramshim run -o LOG -- python tests/python/nvtx_ranges.py` with torch 2.4.1 on the fakes
/// and `nvtx` as its libnvToolsExt.so.1, caching off: stdout, marks, `cudaMalloc`s (t_ns, size).
fn torch_nvtx_run(
    python: &Path,
    nvtx: &Path,
    name: &str,
) -> (String, Vec<MarkAt>, Vec<(u64, u64)>) {
    let dir = scratch(name);
    let log = dir.join("nvtx.vlog");
    // Every fake torch 2.4.1 loads but NVTX's: the real library replaces it.
    let mut preload: Vec<String> = TORCH_FAKES_CUDA121
        .iter()
        .filter(|soname| **soname != "libnvToolsExt.so.1")
        .map(|soname| {
            let path = Path::new(vramshim_fakegpu::LIB_DIR).join(soname);
            assert!(path.is_file(), "{} was not built", path.display());
            path.display().to_string()
        })
        .collect();
    preload.push(nvtx.display().to_string());
    let output = Command::new(vramshim_tool())
        .arg("run")
        .arg("-o")
        .arg(&log)
        .arg("--")
        .arg(python)
        .args(["-W", "ignore"])
        .arg(repo().join("tests/python/nvtx_ranges.py"))
        .env("LD_PRELOAD", preload.join(":"))
        .env("LD_LIBRARY_PATH", vramshim_fakegpu::LIB_DIR)
        .env("VRAMSHIM_FAKEGPU_LOG", dir.join("unimplemented.txt"))
        .env("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("NVTX_INJECTION64_PATH")
        .env_remove("VRAMSHIM_LIB")
        .env_remove("VRAMSHIM_OUTPUT")
        .env_remove("VRAMSHIM_STACK")
        .env_remove("VRAMSHIM_MODE")
        .output()
        .expect("vramshim run python");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let allocations = events(&dump(&log))
        .into_iter()
        .filter(|e| e["event"] == "alloc" && e["api"] == "cudaMalloc")
        .map(|e| (u64_of(e, "t_ns"), u64_of(e, "size")))
        .collect();
    (stdout, marks(&log), allocations)
}

/// torch 2.4.1 calls NVTX through libnvToolsExt.so.1: with NVIDIA's real library, `torch.cuda.nvtx.range_push/range_pop`, `range`, `mark` and
/// `range_start/range_end` become the same marks, in the same order, as with torch 2.15's
/// compiled-in NVTX 3, each allocation between its range's marks.
#[test]
fn torch_2_4_1_ranges_through_the_real_libnvtoolsext_are_marks() {
    let Some(nvtx) = real_nvtx_library() else {
        return;
    };
    let Some(python) = torch_python_of("2.4.1") else {
        return;
    };
    let (stdout, marks, allocations) = torch_nvtx_run(&python, &nvtx, "nvtx-torch-2.4.1");
    assert_torch_ranges(&stdout, &marks, &allocations);
}

/// The fake GPU's own libnvToolsExt.so.1 loads the injection library as NVIDIA's does: torch
/// 2.4.1 under `vramshim dryrun` (every library a fake, NVIDIA's NVTX not involved) records
/// the same marks, return values and allocations inside each range as with the real library.
#[test]
fn torch_2_4_1_ranges_through_the_fake_libnvtoolsext_under_dryrun_are_marks() {
    let Some(python) = torch_python_of("2.4.1") else {
        return;
    };
    let dir = scratch("nvtx-torch-2.4.1-dryrun");
    let log = dir.join("nvtx.vlog");
    let fakes = Path::new(vramshim_fakegpu::LIB_DIR)
        .parent()
        .expect("fakegpu dir");
    let output = Command::new(vramshim_tool())
        .arg("dryrun")
        .arg("-o")
        .arg(&log)
        .arg("--")
        .arg(&python)
        .args(["-W", "ignore"])
        .arg(repo().join("tests/python/nvtx_ranges.py"))
        .env("VRAMSHIM_FAKEGPU_DIR", fakes)
        .env("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("NVTX_INJECTION64_PATH")
        .env_remove("VRAMSHIM_LIB")
        .env_remove("VRAMSHIM_OUTPUT")
        .env_remove("VRAMSHIM_STACK")
        .env_remove("VRAMSHIM_MODE")
        .output()
        .expect("vramshim dryrun python");
    // The program's lines come first on stdout, then dryrun's verdict.
    let program_output = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{program_output}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let program_lines: String = program_output
        .lines()
        .filter(|l| {
            l.starts_with("injection ")
                || l.starts_with("push ")
                || l.starts_with("pop ")
                || *l == "done"
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let allocations = events(&dump(&log))
        .into_iter()
        .filter(|e| e["event"] == "alloc" && e["api"] == "cudaMalloc")
        .map(|e| (u64_of(e, "t_ns"), u64_of(e, "size")))
        .collect::<Vec<_>>();
    assert_torch_ranges(&program_lines, &marks(&log), &allocations);
}

/// What tests/python/nvtx_ranges.py prints, its marks in order, and each of its four
/// allocations (4, 8, 16, 32 MiB) between the marks of the range it was made in.
fn assert_torch_ranges(stdout: &str, marks: &[MarkAt], allocations: &[(u64, u64)]) {
    let library = target_dir().join("libvramshim_nvtx.so");
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            format!("injection {}", library.display()).as_str(),
            "push outer 0",
            "push inner 1",
            "pop inner 1",
            "pop outer 0",
            "pop nothing -1",
            "done",
        ]
    );
    let texts: Vec<&str> = marks.iter().map(|(_, text)| text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "nvtx push: outer",
            "nvtx push: inner",
            "nvtx pop: inner",
            "nvtx pop: outer",
            "nvtx push: step 3",
            "nvtx pop: step 3",
            "nvtx mark: checkpoint",
            "nvtx start: load",
            "nvtx end: load",
            "nvtx pop: (no open range)",
        ]
    );
    let at = |text: &str| marks.iter().find(|(_, t)| t == text).map(|(t_ns, _)| *t_ns);
    let mib = 1u64 << 20;
    for (size, (open, close)) in [
        (4 * mib, ("nvtx push: outer", "nvtx push: inner")),
        (8 * mib, ("nvtx push: inner", "nvtx pop: inner")),
        (16 * mib, ("nvtx push: step 3", "nvtx pop: step 3")),
        (32 * mib, ("nvtx start: load", "nvtx end: load")),
    ] {
        let inside = allocations
            .iter()
            .filter(|(t_ns, s)| {
                *s == size
                    && at(open).is_some_and(|o| o <= *t_ns)
                    && at(close).is_some_and(|c| *t_ns <= c)
            })
            .count();
        assert_eq!(
            inside, 1,
            "{size} B between {open:?} and {close:?}: {allocations:?}"
        );
    }
}

/// Named NVTX domains through the real library (`nvtxDomainCreateA`, `nvtxDomainRangePushEx`,
/// `nvtxDomainRangePop`, `nvtxDomainMarkEx`, `nvtxDomainRangeStartEx/End`, a registered
/// string): each mark carries its domain as `DOMAIN: NAME`; ranges nest per domain (the core
/// push between them has its own level); the default domain (a null handle) has no prefix.
#[test]
fn nvtx_domain_calls_are_marks_with_their_domain() {
    let Some(nvtx) = real_nvtx_library() else {
        return;
    };
    assert_domain_marks(&nvtx, "nvtx-domains");
}

/// The same domain calls through the fake GPU's libnvToolsExt.so.1: the same return values
/// and marks as through NVIDIA's.
#[test]
fn nvtx_domain_calls_through_the_fake_libnvtoolsext_are_marks_with_their_domain() {
    let fake = Path::new(vramshim_fakegpu::LIB_DIR).join("libnvToolsExt.so.1");
    assert_domain_marks(&fake, "nvtx-domains-fake");
}

/// `vramshim run -- nvtx_domains NVTX`: its printed results and the log's marks.
fn assert_domain_marks(nvtx: &Path, name: &str) {
    let dir = scratch(name);
    let log = dir.join("domains.vlog");
    let output = Command::new(vramshim_tool())
        .arg("run")
        .arg("-o")
        .arg(&log)
        .arg("--")
        .arg(program("nvtx_domains"))
        .arg(nvtx)
        .env_remove("NVTX_INJECTION64_PATH")
        .env_remove("VRAMSHIM_LIB")
        .env_remove("VRAMSHIM_OUTPUT")
        .output()
        .expect("vramshim run nvtx_domains");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout,
        "domains 1\npush outer 0\npush core 0\npush inner 1\npop inner 1\npop core 0\npop outer 0\npop nothing -1\ndone\n"
    );
    let texts: Vec<String> = marks(&log).into_iter().map(|(_, text)| text).collect();
    assert_eq!(
        texts,
        [
            "nvtx push: vramshim.test: outer",
            "nvtx push: core",
            "nvtx push: vramshim.test: inner",
            "nvtx mark: other: checkpoint",
            "nvtx pop: vramshim.test: inner",
            "nvtx pop: core",
            "nvtx pop: vramshim.test: outer",
            "nvtx pop: vramshim.test: (no open range)",
            "nvtx mark: vramshim.test: registered step",
            "nvtx start: other: load",
            "nvtx end: other: load",
            "nvtx mark: global",
        ]
    );
}
