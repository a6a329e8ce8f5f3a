//! Answers in a PyTorch user's terms, judged by real PyTorch on the fake GPU
//! (`tests/python/torch_tricks.py`: an MLP trained with Adam, an evaluation batch after each
//! step, recorded through the default allocator's tracker). `breakdown`'s cache, context and
//! used memory against torch's own figures; `steps` finding the `+= loss` leak with its line
//! and torch's per-step growth; the memory tricks as pairs, each with the category change
//! and `advise` flagging the variant without the trick (checkpointing, evaluation without
//! `no_grad`, autocast, gradient accumulation, `del` + `empty_cache()`, inplace ReLU), and
//! `diff`'s per-category section giving the same changes.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::torch::{CUBLAS_HANDLE, CUDNN_HANDLE, fake_preload, repo, torch_python};
use common::*;
use serde_json::Value;

/// The fake device's context (VRAMSHIM_FAKEGPU_CONTEXT_BYTES).
const CONTEXT: u64 = 500 << 20;
/// The script's batch × width × 4 bytes: one fp32 hidden activation.
const ACTIVATION: u64 = 8192 * 1024 * 4;
const STEPS: usize = 4;

/// Runs `torch_tricks.py MODE` for [`STEPS`] steps under the recorder; returns its figures
/// and the log.
fn recorded(python: &Path, mode: &str, probe: bool) -> (Value, PathBuf) {
    recorded_steps(python, mode, STEPS, probe)
}

fn recorded_steps(python: &Path, mode: &str, steps: usize, probe: bool) -> (Value, PathBuf) {
    let dir = scratch(&format!("tricks-{mode}-{probe}"));
    let mut command = Command::new(python);
    command
        .args(["-W", "ignore"])
        .arg(repo().join("tests/python/torch_tricks.py"))
        .args([mode, &steps.to_string()]);
    if probe {
        command.arg("probe");
    }
    command
        .env(
            "LD_PRELOAD",
            format!("{}:{}", shim().display(), fake_preload()),
        )
        .env("LD_LIBRARY_PATH", vramshim_fakegpu::LIB_DIR)
        .env("VRAMSHIM_FAKEGPU_MEMORY", (8u64 << 30).to_string())
        .env("VRAMSHIM_FAKEGPU_CONTEXT_BYTES", CONTEXT.to_string())
        .env("VRAMSHIM_FAKEGPU_LOG", dir.join("unimplemented.txt"))
        .env("VRAMSHIM_OUTPUT", dir.join("%p.vlog"))
        .env("VRAMSHIM_STACK", "mixed");
    for key in [
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        "VRAMSHIM_MODE",
    ] {
        command.env_remove(key);
    }
    let output = command.output().expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{mode} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().expect("the script's figures");
    let figures: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
    let log = Run { output, dir }.log();
    (figures, log)
}

fn device0(log: &Path) -> Value {
    let report = json_of(&[
        "breakdown".as_ref(),
        log.as_os_str(),
        "--device".as_ref(),
        "0".as_ref(),
        "--json".as_ref(),
    ]);
    arr(&report["devices"])[0].clone()
}

/// (at peak, own max, allocated) of a category.
fn category(device: &Value, name: &str) -> (u64, u64, u64) {
    let found = arr(&device["categories"])
        .iter()
        .find(|c| c["category"] == name)
        .unwrap_or_else(|| panic!("no category {name}: {device}"));
    (
        u64_of(found, "at_peak_bytes"),
        u64_of(found, "max_bytes"),
        u64_of(found, "allocated_bytes"),
    )
}

fn advice(log: &Path) -> Vec<Value> {
    let report = json_of(&["advise".as_ref(), log.as_os_str(), "--json".as_ref()]);
    arr(&report["suggestions"]).to_vec()
}

fn kinds(suggestions: &[Value]) -> Vec<String> {
    suggestions
        .iter()
        .map(|s| s["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The line of `torch_tricks.py` (1-based) that is `text` (indentation included).
fn script_line(text: &str) -> u64 {
    let source = std::fs::read_to_string(repo().join("tests/python/torch_tricks.py"))
        .expect("torch_tricks.py");
    source
        .lines()
        .position(|line| line == text)
        .unwrap_or_else(|| panic!("no line with {text}")) as u64
        + 1
}

#[test]
fn breakdown_shares_add_up_to_the_devices_used_memory() {
    let Some(python) = torch_python() else {
        return;
    };
    let (figures, log) = recorded(&python, "item", true);
    let probe = &figures["at_probe"];
    // The probe is the peak of allocated bytes: torch says so.
    assert_eq!(u64_of(probe, "allocated"), u64_of(probe, "max_allocated"));
    let device = device0(&log);
    // Allocations at the peak: torch's tensors plus the cuBLAS and cuDNN handles' own
    // memory.
    assert_eq!(
        u64_of(&device, "peak_bytes"),
        u64_of(probe, "allocated") + 2 * CUBLAS_HANDLE + CUDNN_HANDLE
    );
    // The cache: torch's reserved less allocated at that moment.
    assert_eq!(
        u64_of(&device, "allocator_cache_bytes"),
        u64_of(probe, "reserved") - u64_of(probe, "allocated")
    );
    assert_eq!(u64_of(&device, "context_bytes"), CONTEXT);
    // Used: what torch's mem_get_info says at the peak.
    assert_eq!(u64_of(&device, "used_bytes"), u64_of(probe, "used"));
    let categories: u64 = arr(&device["categories"])
        .iter()
        .map(|c| u64_of(c, "at_peak_bytes"))
        .sum();
    assert_eq!(
        categories + u64_of(&device, "allocator_cache_bytes") + CONTEXT,
        u64_of(probe, "used")
    );
    let shares: f64 = arr(&device["categories"])
        .iter()
        .map(|c| c["at_peak_share"].as_f64().unwrap_or(0.0))
        .sum::<f64>()
        + device["allocator_cache_share"].as_f64().unwrap_or(0.0)
        + device["context_share"].as_f64().unwrap_or(0.0);
    assert!((shares - 100.0).abs() < 1e-6, "{shares}");
    // Library workspaces split by library: cuBLAS's two handles (torch's own 32 MiB cuBLAS
    // workspace, freed before the probe, counts at its highest) and the convolution's cuDNN
    // handle.
    let libraries = arr(&device["workspaces_by_library"]);
    assert_eq!(libraries.len(), 2, "{device}");
    assert_eq!(libraries[0]["library"], "cublas");
    assert_eq!(u64_of(&libraries[0], "at_peak_bytes"), 2 * CUBLAS_HANDLE);
    assert_eq!(
        u64_of(&libraries[0], "max_bytes"),
        2 * CUBLAS_HANDLE + (32 << 20)
    );
    assert_eq!(libraries[1]["library"], "cudnn");
    assert_eq!(u64_of(&libraries[1], "at_peak_bytes"), CUDNN_HANDLE);
    assert_eq!(
        category(&device, "workspaces").0,
        2 * CUBLAS_HANDLE + CUDNN_HANDLE
    );
    assert_eq!(category(&device, "communication"), (0, 0, 0));
    // Adam: twice the parameters (the caching allocator's 512-byte blocks).
    assert_eq!(
        category(&device, "optimizer_state").0,
        2 * category(&device, "parameters").0
    );

    // `report` has the same section.
    let report = json_of(&["report".as_ref(), log.as_os_str(), "--json".as_ref()]);
    let section = arr(&report["breakdown"])
        .iter()
        .find(|d| d["device"] == 0)
        .cloned()
        .expect("report's breakdown");
    assert_eq!(section["used_bytes"], device["used_bytes"]);
    assert_eq!(section["categories"], {
        let mut categories = device["categories"].clone();
        for c in categories.as_array_mut().expect("categories") {
            c.as_object_mut().expect("category").remove("stacks");
        }
        categories
    });
    let (code, text, stderr) = vramshim(&["report".as_ref(), log.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("context_and_modules") && l.contains("500.00 MiB")),
        "{text}"
    );
}

#[test]
fn steps_flag_the_line_that_keeps_every_graph_and_not_its_item_variant() {
    let Some(python) = torch_python() else {
        return;
    };
    let leak_line = script_line("            val_total += criterion(model(val_data), val_target)");
    for mode in ["leak", "item"] {
        let (figures, log) = recorded(&python, mode, false);
        let report = json_of(&["steps".as_ref(), log.as_os_str(), "--json".as_ref()]);
        let found = arr(&report["steps"]);
        assert_eq!(found.len(), 1, "{report}");
        let steps = arr(&found[0]["steps"]);
        assert_eq!(steps.len(), STEPS, "{mode}: {report}");
        // Live at each step's end: torch's allocated after optimizer.step(), plus the two
        // cuBLAS handles.
        let torch_ends: Vec<u64> = arr(&figures["step_end_allocated"])
            .iter()
            .map(|v| v.as_u64().expect("bytes"))
            .collect();
        let ends: Vec<u64> = steps.iter().map(|s| u64_of(s, "end_bytes")).collect();
        assert_eq!(
            ends,
            torch_ends
                .iter()
                .map(|b| b + 2 * CUBLAS_HANDLE)
                .collect::<Vec<_>>(),
            "{mode}"
        );
        // Each step's end was seen (the evaluation after it allocates).
        assert!(
            steps.iter().all(|s| s["ends_with_log"] == false),
            "{report}"
        );
        let advice = advice(&log);
        if mode == "leak" {
            assert_eq!(found[0]["grows"], true);
            let leaks = arr(&found[0]["leaks"]);
            assert_eq!(leaks.len(), 1, "{report}");
            assert_eq!(u64_of(&leaks[0], "line"), leak_line);
            // Per step: exactly what torch's allocated grew by (steps 2 and 3 made what is
            // still live at the end of step 4).
            let per_step: Vec<u64> = arr(&leaks[0]["per_step_bytes"])
                .iter()
                .map(|v| v.as_u64().expect("bytes"))
                .collect();
            assert_eq!(
                per_step,
                vec![torch_ends[1] - torch_ends[0], torch_ends[2] - torch_ends[1]]
            );
            let growth = advice
                .iter()
                .find(|s| s["kind"] == "growth_per_step")
                .unwrap_or_else(|| panic!("{advice:?}"));
            assert_eq!(u64_of(growth, "line"), leak_line);
            assert_eq!(u64_of(growth, "bytes"), per_step.iter().sum::<u64>());
        } else {
            assert_eq!(found[0]["grows"], false);
            assert!(arr(&found[0]["leaks"]).is_empty());
            assert!(!kinds(&advice).contains(&"growth_per_step".to_string()));
        }
    }

    // An evaluation loop alone (no optimizer): steps are the model's calls, cut where the
    // loop's call starts again, so 5 iterations give 5 steps: 4 whose ends are torch's
    // allocated before the next call, plus the main thread's cuBLAS handle, and the last,
    // which ends with the log.
    let eval_line =
        script_line("                val_total += criterion(model(val_data), val_target)");
    // `eval_sequential`: as `eval_leak`, with a plain `nn.Sequential` whose Linear layers
    // allocate from one stack: each call repeats its first stack, and is still one step.
    for mode in ["eval_leak", "eval_item", "eval_sequential"] {
        let (figures, log) = recorded_steps(&python, mode, 5, false);
        let report = json_of(&["steps".as_ref(), log.as_os_str(), "--json".as_ref()]);
        let found = &arr(&report["steps"])[0];
        let split = &found["split_by"]["model_call"];
        assert_eq!(
            u64_of(split, "line"),
            if mode == "eval_item" {
                eval_line + 2
            } else {
                eval_line
            },
            "{report}"
        );
        let torch_ends: Vec<u64> = arr(&figures["step_end_allocated"])
            .iter()
            .map(|v| v.as_u64().expect("bytes"))
            .collect();
        let steps = arr(&found["steps"]);
        assert_eq!(
            steps
                .iter()
                .map(|s| s["ends_with_log"] == true)
                .collect::<Vec<_>>(),
            [false, false, false, false, true],
            "{report}"
        );
        let ends: Vec<u64> = steps[..4].iter().map(|s| u64_of(s, "end_bytes")).collect();
        assert_eq!(
            ends,
            torch_ends[1..]
                .iter()
                .map(|b| b + CUBLAS_HANDLE)
                .collect::<Vec<_>>(),
            "{mode}"
        );
        if mode != "eval_item" {
            assert_eq!(found["grows"], true);
            let leaks = arr(&found["leaks"]);
            assert_eq!(leaks.len(), 1, "{report}");
            assert_eq!(u64_of(&leaks[0], "line"), eval_line);
            let per_step: Vec<u64> = arr(&leaks[0]["per_step_bytes"])
                .iter()
                .map(|v| v.as_u64().expect("bytes"))
                .collect();
            assert_eq!(
                per_step,
                vec![torch_ends[2] - torch_ends[1], torch_ends[3] - torch_ends[2]]
            );
        } else {
            assert_eq!(found["grows"], false);
            assert!(arr(&found["leaks"]).is_empty());
        }
    }
}

/// A training loop with nothing allocated after its last optimizer step: the log ends within
/// that step, which still counts (it held the run's peak here). Every step's highest live
/// bytes are torch's `max_memory_allocated()` of the step, its counter reset where the step
/// begins, plus the two cuBLAS handles; the ends seen are torch's allocated there. The model
/// is a plain `nn.Sequential`, whose Linear layers allocate from one stack: one forward pass
/// a step all the same.
#[test]
fn steps_count_the_last_one_when_the_log_ends_within_it() {
    let Some(python) = torch_python() else {
        return;
    };
    let (figures, log) = recorded(&python, "train", false);
    let torch_figures = |key: &str| -> Vec<u64> {
        arr(&figures[key])
            .iter()
            .map(|v| v.as_u64().expect("bytes"))
            .collect()
    };
    let (torch_ends, torch_peaks) = (
        torch_figures("step_end_allocated"),
        torch_figures("step_peak_allocated"),
    );
    assert_eq!(torch_peaks.len(), STEPS, "{figures}");
    let report = json_of(&["steps".as_ref(), log.as_os_str(), "--json".as_ref()]);
    let found = arr(&report["steps"]);
    assert_eq!(found.len(), 1, "{report}");
    let steps = arr(&found[0]["steps"]);
    assert_eq!(steps.len(), STEPS, "{report}");
    assert_eq!(
        steps
            .iter()
            .map(|s| s["ends_with_log"] == true)
            .collect::<Vec<_>>(),
        [false, false, false, true],
        "{report}"
    );
    let ends: Vec<u64> = steps[..STEPS - 1]
        .iter()
        .map(|s| u64_of(s, "end_bytes"))
        .collect();
    assert_eq!(
        ends,
        torch_ends
            .iter()
            .map(|b| b + 2 * CUBLAS_HANDLE)
            .collect::<Vec<_>>()
    );
    // From step 2 on (step 1 also builds the model, its window starts with the log).
    let peaks: Vec<u64> = steps.iter().map(|s| u64_of(s, "peak_bytes")).collect();
    assert_eq!(
        peaks[1..],
        torch_peaks[1..]
            .iter()
            .map(|b| b + 2 * CUBLAS_HANDLE)
            .collect::<Vec<_>>(),
        "{report}"
    );
    // One model call in each step, the last one's too.
    assert_eq!(
        steps
            .iter()
            .map(|s| u64_of(s, "forward_calls"))
            .collect::<Vec<_>>(),
        vec![1; STEPS],
        "{report}"
    );
    assert_eq!(found[0]["grows"], false);
    assert_eq!(
        steps[STEPS - 1]["growth_bytes"],
        serde_json::Value::Null,
        "{report}"
    );
    let (code, text, stderr) = vramshim(&["steps".as_ref(), log.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        text.contains(&format!(
            ": {STEPS} steps (each ends where the optimizer's step ends; step {STEPS} ends with the log, its live bytes not compared)"
        )),
        "{text}"
    );
    // One step alone is a step (it was "no steps found").
    let (figures, log) = recorded_steps(&python, "train", 1, false);
    let report = json_of(&["steps".as_ref(), log.as_os_str(), "--json".as_ref()]);
    let steps = arr(&arr(&report["steps"])[0]["steps"]);
    assert_eq!(steps.len(), 1, "{report}");
    assert_eq!(steps[0]["ends_with_log"], true, "{report}");
    let (code, text, stderr) = vramshim(&["steps".as_ref(), log.as_os_str()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        text.contains(": 1 step (each ends where the optimizer's step ends; step 1 ends with the log, its live bytes not compared)"),
        "{text}"
    );
    assert_eq!(arr(&figures["step_peak_allocated"]).len(), 1, "{figures}");
}

#[test]
fn memory_tricks_change_their_category_and_advise_flags_the_variant_without() {
    let Some(python) = torch_python() else {
        return;
    };
    let (plain_figures, plain_log) = recorded(&python, "item", false);
    let plain = device0(&plain_log);
    let plain_advice = kinds(&advice(&plain_log));

    // Checkpointing the hidden block: one hidden activation fewer at the activations'
    // highest; advise asks for checkpointing without it, not with it.
    let (_, log) = recorded(&python, "checkpoint", false);
    let checkpointed = device0(&log);
    assert_eq!(
        category(&plain, "activations").1 - category(&checkpointed, "activations").1,
        ACTIVATION
    );
    assert!(
        plain_advice.contains(&"activations".to_string()),
        "{plain_advice:?}"
    );
    assert!(!kinds(&advice(&log)).contains(&"activations".to_string()));
    // `diff` says the same, with both sides' figures.
    let rows = category_diff(&plain_log, &log);
    let activations = row(&rows, "activations");
    assert_eq!(
        u64_of(activations, "max_a"),
        category(&plain, "activations").1
    );
    assert_eq!(
        u64_of(activations, "max_b"),
        category(&checkpointed, "activations").1
    );
    assert_eq!(signed(activations, "max_change"), -(ACTIVATION as i64));

    // Inplace ReLU: three ReLU outputs fewer per forward pass (a training and an evaluation
    // forward per step), all temporaries; activations unchanged.
    let (_, log) = recorded(&python, "inplace", false);
    let inplace = device0(&log);
    assert_eq!(
        category(&plain, "temporaries").2 - category(&inplace, "temporaries").2,
        3 * ACTIVATION * 2 * STEPS as u64
    );
    assert_eq!(
        category(&plain, "activations"),
        category(&inplace, "activations")
    );
    let rows = category_diff(&plain_log, &log);
    let temporaries = row(&rows, "temporaries");
    assert_eq!(
        u64_of(temporaries, "allocated_a"),
        category(&plain, "temporaries").2
    );
    assert_eq!(
        signed(temporaries, "allocated_change"),
        -((3 * ACTIVATION * 2 * STEPS as u64) as i64)
    );
    let activations = row(&rows, "activations");
    for key in ["at_peak_change", "max_change", "allocated_change"] {
        assert_eq!(signed(activations, key), 0, "{key}");
    }

    // Evaluation without no_grad: the activations its graph saves are freed without a
    // backward pass; at most exactly what torch saw the forward keep beyond no_grad's.
    let (figures, log) = recorded(&python, "grad_eval", false);
    let with_grad = device0(&log);
    let kept = |figures: &Value| figures["eval_kept"][0].as_u64().expect("eval_kept");
    let max = |device: &Value| u64_of(&device["activations_without_backward"], "max_bytes");
    assert_eq!(
        max(&with_grad) - max(&plain),
        kept(&figures) - kept(&plain_figures)
    );
    assert!(kinds(&advice(&log)).contains(&"evaluation_without_no_grad".to_string()));
    let rows = category_diff(&plain_log, &log);
    let unused = row(&rows, "activations_without_backward");
    assert_eq!(u64_of(unused, "max_a"), max(&plain));
    assert_eq!(
        signed(unused, "max_change"),
        (kept(&figures) - kept(&plain_figures)) as i64
    );
    assert!(!plain_advice.contains(&"evaluation_without_no_grad".to_string()));

    // Autocast (bfloat16) for the training forward: its allocations pass through
    // `at::autocast::`, activations at their highest drop (the hidden ones are 16-bit; the
    // recording has no dtype, so only the direction is checked here), and only the fp32 run
    // is told that autocast would halve its activations' bytes.
    let (_, log) = recorded(&python, "autocast", false);
    let autocast = device0(&log);
    assert_eq!(plain["autocast_seen"], false);
    assert_eq!(autocast["autocast_seen"], true);
    assert!(category(&autocast, "activations").1 < category(&plain, "activations").1);
    let rows = category_diff(&plain_log, &log);
    assert_eq!(
        signed(row(&rows, "activations"), "max_change"),
        category(&autocast, "activations").1 as i64 - category(&plain, "activations").1 as i64
    );
    let suggestions = advice(&plain_log);
    let halve = suggestions
        .iter()
        .find(|s| s["kind"] == "autocast")
        .unwrap_or_else(|| panic!("{suggestions:?}"));
    assert_eq!(
        u64_of(halve, "bytes"),
        category(&plain, "activations").1 / 2
    );
    assert!(!kinds(&advice(&log)).contains(&"autocast".to_string()));
}

/// `diff --json A B`'s per-category rows of device 0.
fn category_diff(a: &Path, b: &Path) -> Vec<Value> {
    let report = json_of(&[
        "diff".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        "--device".as_ref(),
        "0".as_ref(),
        "--json".as_ref(),
    ]);
    let devices = arr(&report["categories"]);
    assert_eq!(devices.len(), 1, "{report}");
    assert_eq!(devices[0]["device"], 0);
    arr(&devices[0]["categories"]).to_vec()
}

/// One row of [`category_diff`].
fn row<'a>(rows: &'a [Value], name: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["category"] == name)
        .unwrap_or_else(|| panic!("no row {name}: {rows:?}"))
}

fn signed(value: &Value, key: &str) -> i64 {
    value[key]
        .as_i64()
        .unwrap_or_else(|| panic!("no {key}: {value}"))
}

fn figure(figures: &Value, key: &str) -> u64 {
    figures[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key}: {figures}"))
}

#[test]
fn gradient_accumulation_and_empty_cache_show_in_breakdown_diff_and_advise() {
    let Some(python) = torch_python() else {
        return;
    };
    // Gradient accumulation: each step's 8192 samples as 4 micro-batches of 2048. What a
    // forward pass keeps (torch's allocated after the forward less before, a steady step's)
    // shrinks fourfold; the activations' highest is that plus the logits' first gradient
    // (batch x 10 classes x 4 bytes) at the start of the backward pass, and, with
    // accumulation, the gradient of the loss's scaling (one 512-byte block).
    let (plain_figures, plain_log) = recorded(&python, "item", false);
    let (figures, log) = recorded(&python, "accumulate", false);
    let kept = |figures: &Value| {
        let kept = arr(&figures["forward_kept"]);
        kept[kept.len() - 1].as_u64().expect("forward_kept")
    };
    let (plain_kept, micro_kept) = (kept(&plain_figures), kept(&figures));
    let plain = device0(&plain_log);
    let accumulated = device0(&log);
    assert_eq!(category(&plain, "activations").1, plain_kept + 8192 * 40);
    assert_eq!(
        category(&accumulated, "activations").1,
        micro_kept + 2048 * 40 + 512
    );
    let rows = category_diff(&plain_log, &log);
    let activations = row(&rows, "activations");
    assert_eq!(
        u64_of(activations, "max_a"),
        category(&plain, "activations").1
    );
    assert_eq!(
        u64_of(activations, "max_b"),
        category(&accumulated, "activations").1
    );
    assert_eq!(
        signed(activations, "max_change"),
        micro_kept as i64 + 2048 * 40 + 512 - (plain_kept as i64 + 8192 * 40)
    );
    // Parameters, gradients and Adam's state do not change.
    for name in ["parameters", "gradients", "optimizer_state"] {
        assert_eq!(signed(row(&rows, name), "max_change"), 0, "{name}");
    }
    // Only the full batch is told to checkpoint (or shrink its batch).
    assert!(kinds(&advice(&plain_log)).contains(&"activations".to_string()));
    assert!(!kinds(&advice(&log)).contains(&"activations".to_string()));
    // Forward passes per optimizer step (model calls at the training line): one without
    // accumulation, four with, in every step (each counted in the step it begins); only the
    // full batch is told to accumulate, with half its activations' highest for k = 2 and
    // three quarters for k = 4.
    let forward_calls = |log: &Path| {
        let report = json_of(&["steps".as_ref(), log.as_os_str(), "--json".as_ref()]);
        arr(&arr(&report["steps"])[0]["steps"])
            .iter()
            .map(|s| u64_of(s, "forward_calls"))
            .collect::<Vec<_>>()
    };
    assert_eq!(forward_calls(&plain_log), vec![1; STEPS]);
    assert_eq!(forward_calls(&log), vec![4; STEPS]);
    let suggestions = advice(&plain_log);
    let accumulate = suggestions
        .iter()
        .find(|s| s["kind"] == "gradient_accumulation")
        .unwrap_or_else(|| panic!("{suggestions:?}"));
    let highest = plain_kept + 8192 * 40;
    assert_eq!(u64_of(accumulate, "bytes"), highest - highest / 2);
    let action = accumulate["action"].as_str().unwrap_or_default();
    let mib = |n: u64| format!("{:.2} MiB", n as f64 / f64::from(1u32 << 20));
    assert!(
        action.contains(&format!("k = 4 about {}", mib(highest - highest / 4))),
        "{action}"
    );
    // Against what accumulating over 4 freed by torch's figures (the plain run's highest
    // less the micro-batch run's): the estimate is within the loss's few 512-byte blocks,
    // which do not shrink with the batch.
    let freed_by_four = highest - (micro_kept + 2048 * 40 + 512);
    let estimate = highest - highest / 4;
    assert!(
        estimate.abs_diff(freed_by_four) <= 4 * 512,
        "estimate {estimate}, torch {freed_by_four}"
    );
    assert!(!kinds(&advice(&log)).contains(&"gradient_accumulation".to_string()));

    // `del` of the training data and `torch.cuda.empty_cache()` before the probe (the peak):
    // the cache at the peak is torch's reserved less allocated in both runs; the change in
    // reserved memory is exactly the bytes of segments with no tensor in them (torch's
    // snapshot) in the run without the trick; the data leaves `other`.
    let (plain_figures, plain_log) = recorded(&python, "item", true);
    let (figures, log) = recorded(&python, "release", true);
    let (plain_probe, probe) = (&plain_figures["at_probe"], &figures["at_probe"]);
    let cache = |probe: &Value| figure(probe, "reserved") - figure(probe, "allocated");
    let plain = device0(&plain_log);
    let released = device0(&log);
    assert_eq!(u64_of(&plain, "allocator_cache_bytes"), cache(plain_probe));
    assert_eq!(u64_of(&released, "allocator_cache_bytes"), cache(probe));
    assert_eq!(
        figure(plain_probe, "reserved") - figure(probe, "reserved"),
        figure(plain_probe, "free_segments")
    );
    assert_eq!(figure(probe, "free_segments"), 0);
    let rows = category_diff(&plain_log, &log);
    let cached = row(&rows, "allocator_cache");
    assert_eq!(u64_of(cached, "at_peak_a"), cache(plain_probe));
    assert_eq!(u64_of(cached, "at_peak_b"), cache(probe));
    assert_eq!(
        signed(cached, "at_peak_change"),
        cache(probe) as i64 - cache(plain_probe) as i64
    );
    // The deleted data (8192 x 256 fp32 and 8192 int64 targets, in 512-byte blocks).
    let freed = figure(plain_probe, "allocated") - figure(probe, "allocated");
    assert_eq!(freed, 8192 * 256 * 4 + 8192 * 8);
    assert_eq!(
        signed(row(&rows, "other"), "at_peak_change"),
        -(freed as i64)
    );
    let at_peak_total: i64 = rows
        .iter()
        .take(8)
        .map(|r| signed(r, "at_peak_change"))
        .sum();
    assert_eq!(at_peak_total, -(freed as i64));
    // Of the cache at the peak, the segments with no tensor in them: torch's snapshot's.
    let unused = |device: &Value| u64_of(device, "allocator_cache_unused_segments_bytes");
    assert_eq!(unused(&plain), figure(plain_probe, "free_segments"));
    assert_eq!(unused(&released), 0);
    assert_eq!(
        signed(
            row(&rows, "allocator_cache_unused_segments"),
            "at_peak_change"
        ),
        -(figure(plain_probe, "free_segments") as i64)
    );
    // The run that keeps its cache is told to give it back, with what empty_cache() would
    // have returned (torch's reserved memory lower by exactly that in the run that did), and
    // about the allocator setting whatif finds best; the one that gave it back is told
    // neither.
    let suggestions = advice(&plain_log);
    let empty = suggestions
        .iter()
        .find(|s| s["kind"] == "empty_cache")
        .unwrap_or_else(|| panic!("{suggestions:?}"));
    assert_eq!(
        u64_of(empty, "bytes"),
        figure(plain_probe, "reserved") - figure(probe, "reserved")
    );
    assert!(kinds(&suggestions).contains(&"allocator_cache".to_string()));
    let released_advice = kinds(&advice(&log));
    assert!(!released_advice.contains(&"empty_cache".to_string()));
    assert!(!released_advice.contains(&"allocator_cache".to_string()));
}

/// `lines`' executions and net change per line against torch's own `memory_allocated()`
/// measured around each line of a known loop (`torch_tricks.py lines`): a line that keeps
/// one tensor, one that makes a temporary and keeps its result, one whose tensor another
/// line drops later, one more that keeps one.
#[test]
fn lines_net_change_per_execution_is_torchs_allocated_change_across_the_line() {
    let Some(python) = torch_python() else {
        return;
    };
    let (figures, log) = recorded(&python, "lines", false);
    let report = json_of(&[
        "lines".as_ref(),
        log.as_os_str(),
        "--file".as_ref(),
        "torch_tricks.py".as_ref(),
        "--json".as_ref(),
    ]);
    let files = arr(&report["files"]);
    assert_eq!(files.len(), 1, "{report}");
    let lines = arr(&files[0]["lines"]);
    let steps = STEPS as u64;
    let mut rows = Vec::new();
    for (name, text, allocations_per_execution) in [
        (
            "kept",
            "        kept.append(torch.empty(KEPT_BYTES // 4, device=\"cuda\"))",
            1,
        ),
        (
            "pair",
            "        kept.append(torch.ones(PAIR_BYTES // 4, device=\"cuda\") * 2)",
            2,
        ),
        (
            "scratch",
            "        scratch = torch.ones(SCRATCH_BYTES // 4, device=\"cuda\")",
            1,
        ),
        (
            "after",
            "        kept.append(torch.zeros(AFTER_BYTES // 4, device=\"cuda\"))",
            1,
        ),
    ] {
        let line = script_line(text);
        let found = lines
            .iter()
            .find(|l| u64_of(l, "line") == line)
            .unwrap_or_else(|| panic!("line {line} ({name}) missing: {report}"));
        let measured = arr(&figures["lines"][name]);
        assert_eq!(measured.len() as u64, steps, "{figures}");
        // torch: what each execution added, and the peak above the start within it (the
        // temporary and the result together on the `pair` line). Executions differ: a freed
        // block within 1 MiB of the request's size is handed out whole (the `kept` line gets
        // the `pair` line's freed 3 MiB temporary from the second step on).
        let added: u64 = measured.iter().map(|m| u64_of(m, "added")).sum();
        let peak_above: u64 = measured.iter().map(|m| u64_of(m, "peak_above")).sum();
        assert_eq!(u64_of(found, "executions"), steps, "{name}: {found}");
        assert_eq!(
            u64_of(found, "count"),
            steps * allocations_per_execution,
            "{name}: {found}"
        );
        assert_eq!(
            u64_of(found, "allocated_bytes"),
            peak_above,
            "{name}: {found}"
        );
        assert_eq!(u64_of(found, "net_bytes"), added, "{name}: {found}");
        assert_eq!(
            u64_of(found, "net_per_execution_bytes"),
            added / steps,
            "{name}: {found}"
        );
        rows.push((line, u64_of(found, "allocated_bytes"), added));
    }
    assert_eq!(rows.len(), 4);
    // What was kept is more than the temporaries' share: the figures are not all equal.
    assert!(rows[1].1 > rows[1].2, "{rows:?}");
    // The text view prints the same columns: line, allocated, count, executions, net live,
    // net per execution.
    let text = lines_text(&log);
    let mib = |n: u64| format!("{:.2} MiB", n as f64 / f64::from(1u32 << 20));
    for (index, (line, allocated, net)) in rows.iter().enumerate() {
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{line} ")))
            .unwrap_or_else(|| panic!("no row for line {line}:\n{text}"));
        let per_line = if index == 1 { 2 * steps } else { steps };
        let expected = format!(
            "{line} {} {per_line} {steps} {} {}",
            mib(*allocated),
            mib(*net),
            mib(net / steps)
        );
        let printed = row.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(printed.starts_with(&expected), "{printed}\n{expected}");
    }
}

/// `vramshim lines LOG --file torch_tricks.py` as text.
fn lines_text(log: &Path) -> String {
    let (code, stdout, stderr) = vramshim(&[
        "lines".as_ref(),
        log.as_os_str(),
        "--file".as_ref(),
        "torch_tricks.py".as_ref(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    stdout
}

/// Inplace ReLU: the run without `inplace=True` makes each ReLU output as a new tensor, kept
/// for backward, while its input is live; `breakdown` counts those outputs exactly as torch
/// measures them (numel x element size, a forward hook on each ReLU), and `advise` tells
/// only that run to use `inplace=True`, with what torch's own peak drops by in the run that
/// does.
#[test]
fn advise_flags_out_of_place_relu_with_what_inplace_saves() {
    let Some(python) = torch_python() else {
        return;
    };
    let (plain_figures, plain_log) = recorded(&python, "item", false);
    let (inplace_figures, inplace_log) = recorded(&python, "inplace", false);
    let outputs: Vec<u64> = arr(&plain_figures["relu_output_bytes"])
        .iter()
        .map(|v| v.as_u64().expect("bytes"))
        .collect();
    // Three ReLUs, each the hidden activation (8192 x 1024 fp32).
    assert_eq!(outputs, vec![ACTIVATION; 3]);
    let per_forward: u64 = outputs.iter().sum();
    let largest = outputs.iter().copied().max().unwrap_or(0);

    let plain = device0(&plain_log);
    let relu = &plain["relu_outputs_kept"];
    // One training forward per step; evaluation runs under no_grad (nothing kept).
    assert_eq!(u64_of(relu, "count"), 3 * STEPS as u64, "{relu}");
    assert_eq!(u64_of(relu, "allocated_bytes"), per_forward * STEPS as u64);
    assert_eq!(u64_of(relu, "max_bytes"), per_forward);
    assert_eq!(u64_of(relu, "largest_bytes"), largest);
    let inplace = device0(&inplace_log);
    let relu = &inplace["relu_outputs_kept"];
    assert_eq!(u64_of(relu, "count"), 0, "{relu}");
    assert_eq!(u64_of(relu, "allocated_bytes"), 0);

    // What inplace=True saves, replayed as if each kept output were its input: torch's
    // highest allocated bytes within any forward pass (training and evaluation, every step)
    // drop by that, and the run's peak (not in a forward pass) by what torch's drops.
    let forward_peak = |figures: &Value| {
        ["forward_peak", "eval_peak"]
            .iter()
            .flat_map(|key| {
                arr(&figures[*key])
                    .iter()
                    .map(|v| v.as_u64().expect("peak"))
            })
            .max()
            .expect("forward peaks")
    };
    let relu = &plain["relu_outputs_kept"];
    assert_eq!(
        u64_of(relu, "inplace_forward_drop_bytes"),
        forward_peak(&plain_figures) - forward_peak(&inplace_figures),
        "{relu}"
    );
    let peak_drop =
        figure(&plain_figures, "max_allocated") - figure(&inplace_figures, "max_allocated");
    assert_eq!(u64_of(relu, "inplace_peak_drop_bytes"), peak_drop, "{relu}");
    let suggestions = advice(&plain_log);
    let flagged = suggestions
        .iter()
        .find(|s| s["kind"] == "inplace_relu")
        .unwrap_or_else(|| panic!("{suggestions:?}"));
    assert_eq!(u64_of(flagged, "bytes"), peak_drop);
    let action = flagged["action"].as_str().unwrap_or_default();
    let mib = |n: u64| format!("{:.2} MiB", n as f64 / f64::from(1u32 << 20));
    for figure in [
        format!(
            "forward passes drop by {}",
            mib(u64_of(relu, "inplace_forward_drop_bytes"))
        ),
        format!(
            "{} of allocations are not made",
            mib(per_forward * STEPS as u64)
        ),
    ] {
        assert!(action.contains(&figure), "{action}");
    }
    assert!(!kinds(&advice(&inplace_log)).contains(&"inplace_relu".to_string()));
}
