//! `vramshim breakdown` on real PyTorch (the fake GPU): a known MLP trained with Adam, recorded
//! per tensor (no caching, and the cudaMallocAsync backend). Parameters must be exactly the
//! bytes torch reports (Σ numel × element size), gradients the same, Adam's state twice that,
//! and the ReLU outputs saved for backward must count as activations. `vramshim lines` on the
//! same recording charges the script's own lines with exact figures, `loss.backward()` with
//! exactly what the autograd thread allocated.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::torch::{CUBLAS_HANDLE, CUDNN_HANDLE, fake_preload, repo, torch_python};
use common::*;
use serde_json::Value;

/// Runs `tests/python/torch_breakdown.py` under the recorder with `env`; returns what the
/// script printed (its last line) and the log.
fn recorded_mlp(python: &Path, name: &str, env: &[(&str, &str)]) -> (Value, PathBuf) {
    recorded(python, "torch_breakdown.py", "3", name, env)
}

/// Runs `tests/python/SCRIPT ARG` under the recorder (fake GPU of 8 GiB) with `env`; returns
/// what the script printed (its last line) and the log.
fn recorded(
    python: &Path,
    script: &str,
    arg: &str,
    name: &str,
    env: &[(&str, &str)],
) -> (Value, PathBuf) {
    let dir = scratch(&format!("breakdown-{name}"));
    let mut command = Command::new(python);
    // faulthandler: a crash (an abort at exit was seen once in CI) names its thread and
    // Python stack on stderr, which the failure message shows.
    command
        .args(["-X", "faulthandler", "-W", "ignore"])
        .arg(repo().join("tests/python").join(script))
        .arg(arg)
        .env(
            "LD_PRELOAD",
            format!("{}:{}", shim().display(), fake_preload()),
        )
        .env("LD_LIBRARY_PATH", vramshim_fakegpu::LIB_DIR)
        .env("VRAMSHIM_FAKEGPU_MEMORY", (8u64 << 30).to_string())
        .env("VRAMSHIM_FAKEGPU_LOG", dir.join("unimplemented.txt"))
        .env("VRAMSHIM_OUTPUT", dir.join("%p.vlog"));
    for key in [
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        "VRAMSHIM_STACK",
        "VRAMSHIM_MODE",
    ] {
        command.env_remove(key);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{name} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let last = stdout.lines().last().expect("the script's figures");
    let figures: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
    let log = Run {
        output: output.clone(),
        dir,
    }
    .log();
    (figures, log)
}

/// (bytes at the peak, own highest bytes) of `category` in a device's breakdown.
fn category(device: &Value, name: &str) -> (u64, u64) {
    let found = arr(&device["categories"])
        .iter()
        .find(|c| c["category"] == name)
        .unwrap_or_else(|| panic!("no category {name}: {device}"));
    (u64_of(found, "at_peak_bytes"), u64_of(found, "max_bytes"))
}

/// The innermost Python frame's function of a category's largest stack at the peak.
fn top_python_function(device: &Value, name: &str) -> String {
    let found = arr(&device["categories"])
        .iter()
        .find(|c| c["category"] == name)
        .expect("category");
    let stack = &arr(&found["stacks"])[0];
    arr(&stack["frames"])
        .iter()
        .find(|f| f["file"].as_str().is_some_and(|file| file.ends_with(".py")))
        .and_then(|f| f["function"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn mlp_with_adam_breaks_down_into_parameters_gradients_and_state() {
    let Some(python) = torch_python() else {
        return;
    };
    for (name, env) in [
        ("no-caching", ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")),
        (
            "malloc-async",
            ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync"),
        ),
        // The default caching allocator: tensors come from the tracker the recorder attaches
        // to it (the driver sees only segments), and the figures must be the same.
        ("default-allocator", ("VRAMSHIM_STACK", "mixed")),
    ] {
        let (figures, log) = recorded_mlp(&python, name, &[env]);
        let relu_saved = u64_of(&figures, "relu_saved_bytes");
        assert_eq!(
            u64_of(&figures, "parameter_bytes"),
            6_340_648,
            "{name}: the model changed: {figures}"
        );
        // The caching allocator's tracker reports its blocks, each request rounded up to
        // 512 bytes (the last layer's 40-byte bias takes 512): torch's own snapshot says the
        // same. The other recordings see the requests themselves.
        let parameters = if name == "default-allocator" {
            u64_of(&figures, "parameter_block_bytes")
        } else {
            u64_of(&figures, "parameter_bytes")
        };

        let report = json_of(&[
            "breakdown".as_ref(),
            log.as_os_str(),
            "--device".as_ref(),
            "0".as_ref(),
            "--json".as_ref(),
        ]);
        let devices = arr(&report["devices"]);
        assert_eq!(devices.len(), 1, "{name}: {report}");
        let device = &devices[0];
        assert_eq!(device["device"], 0);

        // The categories add up to the peak.
        let at_peak_total: u64 = arr(&device["categories"])
            .iter()
            .map(|c| u64_of(c, "at_peak_bytes"))
            .sum();
        assert_eq!(at_peak_total, u64_of(device, "peak_bytes"), "{name}");

        // Parameters: exactly the model's bytes, all of them live at the peak.
        assert_eq!(
            category(device, "parameters"),
            (parameters, parameters),
            "{name}"
        );
        assert_eq!(
            top_python_function(device, "parameters"),
            "Module.cuda.<locals>.<lambda>"
        );
        // Gradients: at their highest (after backward, before zero_grad) one per parameter.
        assert_eq!(category(device, "gradients").1, parameters, "{name}");
        // Adam: exp_avg and exp_avg_sq per parameter, live from the first step on (the peak
        // comes in a later step's backward).
        assert_eq!(
            category(device, "optimizer_state"),
            (2 * parameters, 2 * parameters),
            "{name}"
        );
        assert_eq!(
            top_python_function(device, "optimizer_state"),
            "Adam._init_group"
        );
        // Activations: at least the ReLU outputs saved for backward.
        let (_, activations) = category(device, "activations");
        assert!(
            activations >= relu_saved && relu_saved == 2 * 256 * 1024 * 4,
            "{name}: activations {activations}, ReLU outputs {relu_saved}"
        );
        // cuBLAS's workspace is named as such (torch's 32 MiB), and so is the memory cuBLAS
        // takes for itself: two handles (the main thread's and the autograd thread's), each
        // 1 KiB + 128 KiB + 64 MiB through cuMemAlloc_v2, as on a real H200. (Their stacks
        // pass through an `at::...Workspace` frame here, so this does not tell the library
        // rule from the workspace rule.)
        assert_eq!(
            category(device, "workspaces").1,
            (32 << 20) + 2 * CUBLAS_HANDLE,
            "{name}"
        );

        if name == "no-caching" {
            check_lines(&log, parameters);
        }
        if name != "default-allocator" {
            check_backward_line(&log, parameters);
        }

        // The text report says the same.
        let (code, text, stderr) = vramshim(&["breakdown".as_ref(), log.as_os_str()]);
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            text.lines()
                .any(|line| line.trim_start().starts_with("optimizer_state")
                    && line.contains("12.09 MiB")),
            "{name}:\n{text}"
        );
    }
}

/// Workspaces of library `name` in a device's breakdown: (bytes at the peak, own highest).
fn library(device: &Value, name: &str) -> (u64, u64) {
    let found = arr(&device["workspaces_by_library"])
        .iter()
        .find(|l| l["library"] == name)
        .unwrap_or_else(|| panic!("no library {name}: {device}"));
    (u64_of(found, "at_peak_bytes"), u64_of(found, "max_bytes"))
}

/// `breakdown --json` of a log's device 0.
fn device_breakdown(log: &Path) -> Value {
    let report = json_of(&["breakdown".as_ref(), log.as_os_str(), "--json".as_ref()]);
    let devices = arr(&report["devices"]);
    let device = devices.iter().find(|d| d["device"] == 0);
    device
        .unwrap_or_else(|| panic!("no device 0: {report}"))
        .clone()
}

/// `breakdown` of `tests/python/torch_cudnn.py MODE`: one 3x3 convolution, 64 to 64 channels on
/// one 128x128 image, fp32, under no_grad; torch's peak is its workspace, input, output and
/// weight. The workspace and the handle's own memory are cuDNN's.
fn conv_workspace_at_peak(python: &Path, mode: &str) {
    let env = [("VRAMSHIM_STACK", "mixed")];
    let (figures, log) = recorded(python, "torch_cudnn.py", mode, mode, &env);
    let im2col = 64 * 3 * 3 * 128 * 128 * 4;
    let weight = 64 * 64 * 3 * 3 * 4;
    assert_eq!(
        u64_of(&figures, "allocated_bytes_peak"),
        im2col + 2 * (4 << 20) + weight,
        "{mode}: {figures}"
    );
    let device = device_breakdown(&log);
    // The peak is torch's plus the handle's own memory.
    assert_eq!(
        u64_of(&device, "peak_bytes"),
        u64_of(&figures, "allocated_bytes_peak") + CUDNN_HANDLE,
        "{mode}: {figures}"
    );
    assert_eq!(
        category(&device, "workspaces").0,
        im2col + CUDNN_HANDLE,
        "{mode}"
    );
    assert_eq!(
        library(&device, "cudnn"),
        (im2col + CUDNN_HANDLE, im2col + CUDNN_HANDLE),
        "{mode}"
    );
    // The rest: the weight as parameters, input and output (4 MiB each) in the others.
    assert_eq!(category(&device, "parameters").0, weight, "{mode}");
    let rest: u64 = [
        "temporaries",
        "other",
        "activations",
        "gradients",
        "optimizer_state",
    ]
    .iter()
    .map(|name| category(&device, name).0)
    .sum();
    assert_eq!(rest, 2 * (4 << 20), "{mode}");
}

/// A cuDNN convolution's workspace, which torch allocates from its own caching allocator (in
/// `at::native::run_conv_plan`, or `get_plans_from_find` while `cudnn.benchmark` times the
/// plans), counts as the `cudnn` workspace, not as a temporary: exactly what the fake cuDNN
/// asked for (its first engine: one image's im2col matrix), the handle's own memory beside it,
/// and the other categories hold exactly the rest of torch's peak.
#[test]
fn cudnn_convolution_workspace_is_a_cudnn_workspace() {
    let Some(python) = torch_python() else { return };
    for mode in ["conv_workspace", "conv_workspace_benchmark"] {
        conv_workspace_at_peak(&python, mode);
    }

    // Three training steps of a small ResNet (two threads, each with its cuDNN handle): the
    // largest workspace is the stem's (3 channels x 7x7 window x 56x56 outputs, fp32, in a
    // 512-byte block), forward and weight gradient alike; all are freed within their call.
    let env = [("VRAMSHIM_STACK", "mixed")];
    let (_, log) = recorded(&python, "torch_cudnn.py", "resnet", "resnet", &env);
    let device = device_breakdown(&log);
    let stem = (3 * 7 * 7 * 56 * 56 * 4u64).div_ceil(512) * 512;
    assert_eq!(
        library(&device, "cudnn"),
        (2 * CUDNN_HANDLE, stem + 2 * CUDNN_HANDLE)
    );
}

#[test]
fn breakdown_of_a_missing_log_is_an_input_error() {
    let (code, stdout, stderr) = vramshim(&["breakdown", "/nonexistent/run.vlog"]);
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("/nonexistent/run.vlog"), "{stderr}");
    assert!(stdout.is_empty());
}

/// The line of `tests/python/torch_breakdown.py` (1-based) that contains `text`.
fn script_line(text: &str) -> u64 {
    let source = std::fs::read_to_string(repo().join("tests/python/torch_breakdown.py"))
        .expect("torch_breakdown.py");
    let index = source
        .lines()
        .position(|line| line.contains(text))
        .unwrap_or_else(|| panic!("no line with {text}"));
    index as u64 + 1
}

/// `vramshim lines` on the MLP's recording: (allocated, count, at peak, live at end) of the
/// script's lines that move the figures.
fn check_lines(log: &Path, parameters: u64) {
    let default = json_of(&["lines".as_ref(), log.as_os_str(), "--json".as_ref()]);
    let named = json_of(&[
        "lines".as_ref(),
        log.as_os_str(),
        "--file".as_ref(),
        "python/torch_breakdown.py".as_ref(),
        "--json".as_ref(),
    ]);
    // The script is the only file outside the library and packages.
    assert_eq!(default["files"], named["files"]);
    let files = arr(&named["files"]);
    assert_eq!(files.len(), 1, "{named}");
    assert!(
        files[0]["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("/tests/python/torch_breakdown.py")),
        "{named}"
    );
    assert_eq!(files[0]["source_read"], true);
    let figures = |text: &str| {
        let line = script_line(text);
        let found = arr(&files[0]["lines"])
            .iter()
            .find(|l| u64_of(l, "line") == line)
            .unwrap_or_else(|| panic!("line {line} ({text}) missing: {named}"));
        assert!(
            found["source"]
                .as_str()
                .is_some_and(|source| source.contains(text)),
            "{found}"
        );
        (
            u64_of(found, "allocated_bytes"),
            u64_of(found, "count"),
            u64_of(found, "at_peak_bytes"),
            u64_of(found, "live_at_end_bytes"),
        )
    };
    // The model's `.cuda()`: every parameter, once; all freed at interpreter exit.
    assert_eq!(figures(".cuda()"), (parameters, 6, parameters, 0));
    assert_eq!(
        figures("data = torch.randn"),
        (256 * 512 * 4, 1, 256 * 512 * 4, 0)
    );
    assert_eq!(figures("target = torch.randint"), (256 * 8, 1, 256 * 8, 0));
    // `optimizer.step()`: at the peak exactly Adam's two buffers per parameter are live.
    let (allocated, _, at_peak, _) = figures("optimizer.step()");
    assert_eq!(at_peak, 2 * parameters);
    assert!(allocated > 2 * parameters, "{allocated}");

    // A file that allocated nothing gives no lines.
    let none = json_of(&[
        "lines".as_ref(),
        log.as_os_str(),
        "--file".as_ref(),
        "other.py".as_ref(),
        "--json".as_ref(),
    ]);
    assert!(arr(&none["files"]).is_empty(), "{none}");
}

/// `vramshim lines` on a recording of the MLP whose events are the tensors themselves (no
/// caching, or cudaMallocAsync): `loss.backward()` carries the backward pass.
fn check_backward_line(log: &Path, parameters: u64) {
    let report = json_of(&["lines".as_ref(), log.as_os_str(), "--json".as_ref()]);
    let files = arr(&report["files"]);
    assert_eq!(files.len(), 1, "{report}");
    // `loss.backward()` carries the backward pass: exactly what the autograd thread
    // allocated on the device (from the recording's own events, per thread name), as made
    // "via autograd", beside the 4-byte seed gradient its own thread makes once per step.
    let dump = dump(log);
    let thread_names: std::collections::HashMap<u64, String> = dump
        .iter()
        .filter(|record| record["type"] == "thread")
        .map(|record| {
            (
                u64_of(record, "thread"),
                record["name"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let (mut autograd_bytes, mut autograd_count, mut main_bytes) = (0u64, 0u64, 0u64);
    for event in events(&dump) {
        if event["event"] != "alloc" || event["device"].as_i64().is_none_or(|d| d < 0) {
            continue;
        }
        let name = thread_names
            .get(&u64_of(event, "thread"))
            .map_or("", String::as_str);
        if name.starts_with("pt_autograd") {
            autograd_bytes += u64_of(event, "size");
            autograd_count += 1;
        } else {
            main_bytes += u64_of(event, "size");
        }
    }
    assert!(autograd_count > 0, "no allocation on an autograd thread");
    let backward_line = script_line("loss.backward()");
    let lines = arr(&files[0]["lines"]);
    let backward = lines
        .iter()
        .find(|l| u64_of(l, "line") == backward_line)
        .expect("the backward line");
    assert_eq!(
        (
            u64_of(backward, "via_autograd_bytes"),
            u64_of(backward, "via_autograd_count")
        ),
        (autograd_bytes, autograd_count),
        "{backward}"
    );
    assert_eq!(
        (
            u64_of(backward, "allocated_bytes"),
            u64_of(backward, "count")
        ),
        (autograd_bytes + 3 * 4, autograd_count + 3),
        "{backward}"
    );
    // Its three executions, one per step; at the peak (in backward) it holds more than the
    // gradients, and all of what it holds there was made by the autograd thread.
    assert_eq!(u64_of(backward, "executions"), 3);
    let via_at_peak = u64_of(backward, "via_autograd_at_peak_bytes");
    assert!(via_at_peak >= parameters, "{backward}");
    assert!(
        u64_of(backward, "at_peak_bytes") >= via_at_peak,
        "{backward}"
    );
    // Every other line is charged with its own thread's allocations only, and the lines
    // together hold every device allocation of both threads: nothing counted twice or lost.
    let mut own_total = 0;
    for line in lines {
        if u64_of(line, "line") != backward_line {
            assert_eq!(u64_of(line, "via_autograd_count"), 0, "{line}");
            assert_eq!(u64_of(line, "via_autograd_bytes"), 0, "{line}");
        }
        own_total += u64_of(line, "allocated_bytes") - u64_of(line, "via_autograd_bytes");
    }
    assert_eq!(own_total, main_bytes);
    // The text table shows the backward's share beside the line.
    let (code, text, stderr) = vramshim(&["lines".as_ref(), log.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        text.lines().any(|line| line.contains("loss.backward()")
            && line.contains(&format!(" x{autograd_count} ("))),
        "{text}"
    );
}
