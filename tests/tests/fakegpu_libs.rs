//! The fake GPU libraries (`fakegpu/`) without PyTorch: a plain CUDA C program built against
//! the fake runtime runs under the real recorder; the log, the program's own view and the
//! fake driver's bookkeeping agree; a function that is not implemented returns its library's
//! "not supported" status and is logged once.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const MIB: u64 = 1 << 20;

fn build_app(dir: &Path) -> PathBuf {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fakegpu/cuda_app.c");
    let exe = dir.join("cuda_app");
    let status = Command::new("gcc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&source)
        .arg(format!("-L{}", vramshim_fakegpu::LIB_DIR))
        .arg(format!("-Wl,-rpath-link,{}", vramshim_fakegpu::LIB_DIR))
        .args(["-l:libcudart.so.13", "-ldl"])
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc failed for {}", source.display());
    exe
}

#[test]
fn a_cuda_program_on_the_fake_runtime_is_recorded_exactly() {
    let dir = scratch("fakegpu-app");
    let exe = build_app(&dir);
    let unimplemented = dir.join("unimplemented.txt");
    let output = Command::new(&exe)
        .env("LD_PRELOAD", shim())
        .env("LD_LIBRARY_PATH", vramshim_fakegpu::LIB_DIR)
        .env("VRAMSHIM_OUTPUT", dir.join("%p.vlog"))
        .env("VRAMSHIM_FAKEGPU_MEMORY", (1u64 << 30).to_string())
        .env("VRAMSHIM_FAKEGPU_CONTEXT_BYTES", (300 * MIB).to_string())
        .env("VRAMSHIM_FAKEGPU_NAME", "Test Card")
        .env("VRAMSHIM_FAKEGPU_LOG", &unimplemented)
        .env_remove("VRAMSHIM_STACK")
        .output()
        .expect("run cuda_app");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The context takes its 300 MiB when the runtime first needs it, and keeps them.
    let context = 300 * MIB;
    assert_eq!(
        stdout,
        format!(
            "count rc=0 count=1\n\
             props rc=0 name=Test Card total=1073741824\n\
             malloc rc=0\n\
             malloc rc=0\n\
             info used={} total=1073741824\n\
             oom rc=2 last=2 text=out of memory\n\
             copy rc=0 rc=0 back=round trip\n\
             async rc=0\n\
             freeasync rc=0 cached={} sync rc=0 after={}\n\
             free rc=0 rc=0 rc=0\n\
             info used={context}\n\
             cublasXtCreate rc=15 rc=15\n",
            context + 8 * MIB,
            context + 9 * MIB,
            context + 8 * MIB
        )
    );
    assert_eq!(
        std::fs::read_to_string(&unimplemented).expect("log of unimplemented"),
        "cublasXtCreate\n"
    );

    let run = Run { output, dir };
    let dump = dump(&run.log());
    let events = events(&dump);
    let sizes =
        |list: Vec<&serde_json::Value>| list.iter().map(|e| u64_of(e, "size")).collect::<Vec<_>>();
    assert_eq!(
        sizes(select(&events, "alloc", "cudaMalloc")),
        vec![3 * MIB, 5 * MIB]
    );
    assert_eq!(select(&events, "free", "cudaFree").len(), 2);
    let failed = select(&events, "alloc_failed", "cudaMalloc");
    assert_eq!(sizes(failed.clone()), vec![1 << 40]);
    assert_eq!(u64_of(failed[0], "mem_free"), (1 << 30) - context - 8 * MIB);
    assert_eq!(
        sizes(select(&events, "alloc", "cudaMallocAsync")),
        vec![MIB]
    );
    assert_eq!(select(&events, "free", "cudaFreeAsync").len(), 1);
    assert_eq!(
        sizes(select(&events, "alloc", "cudaMallocHost")),
        vec![4096]
    );
}
