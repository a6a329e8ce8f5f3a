//! `vramshim dryrun`: real programs run on the fake driver standing in for a simulated card
//! (the fixture driver reads the same `VRAMSHIM_FAKEGPU_*` variables as the product fakes),
//! under the real preload, judged by the real tool. Expected figures come from the program's
//! arguments, the card chosen and marker lines in the sources, never from the verdict itself.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The context the unmeasured presets (the T4 here) and custom cards charge (the estimate).
const CONTEXT: u64 = 512 * MIB;
/// What the T4 preset reports as its memory (deviceQuery, see docs/gpus.md).
const T4_MEMORY: u64 = 15_843_721_216;
/// The A10G preset's memory: 23030 MiB.
const A10G_MEMORY: u64 = 23_030 * MIB;
/// The L4 preset's memory (deviceQuery), the smallest above the T4's.
const L4_MEMORY: u64 = 23_583_784_960;

/// A directory laid out like the product's `fakegpu/`: `lib/` holds the fixture driver and
/// runtime under their SONAMEs (and nothing else of the fixture build, such as its second
/// interposer).
fn fakes_dir(test: &str) -> PathBuf {
    let dir = scratch(&format!("{test}-fakegpu"));
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).expect("create fakes lib dir");
    for name in ["libcuda.so.1", "libcudart.so.12"] {
        std::os::unix::fs::symlink(fake_lib_dir().join(name), lib.join(name))
            .expect("link a fake library");
    }
    dir
}

struct Dryrun {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    logs: PathBuf,
}

impl Dryrun {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|err| {
            panic!(
                "bad JSON ({err}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// `vramshim dryrun ARGS -o <scratch>/%p.vlog -- PROGRAM...` with the fakes of `fakes`.
fn dryrun(
    test: &str,
    fakes: Option<&Path>,
    args: &[&str],
    program: &[&str],
    env: &[(&str, &str)],
) -> Dryrun {
    let logs = scratch(test);
    let mut command = Command::new(vramshim_tool());
    command
        .arg("dryrun")
        .args(args)
        .arg("-o")
        .arg(logs.join("%p.vlog"))
        .arg("--")
        .args(program)
        .env_remove("VRAMSHIM_FAKEGPU_DIR")
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMSHIM_STACK")
        .env_remove("PYTORCH_NO_CUDA_MEMORY_CACHING")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF");
    if let Some(fakes) = fakes {
        command.env("VRAMSHIM_FAKEGPU_DIR", fakes);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run vramshim dryrun");
    Dryrun {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        logs,
    }
}

fn train(args: &[&str]) -> Vec<String> {
    let mut all = vec![program("dryrun_train").display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    all
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {value}"))
}

fn only_log(run: &Dryrun) -> PathBuf {
    let logs: Vec<PathBuf> = std::fs::read_dir(&run.logs)
        .expect("log dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}\n{}", run.stderr);
    logs[0].clone()
}

#[test]
fn a_job_that_fits_gets_exact_peaks_per_device() {
    let fakes = fakes_dir("fits");
    // 256 MiB of weights on each of 2 devices; 3 steps of 128 MiB + 1 MiB on device 0.
    let command = train(&["256", "128", "3", "2"]);
    let run = dryrun(
        "fits",
        Some(&fakes),
        &["--memory", "1GiB", "--gpus", "2", "--json"],
        &refs(&command),
        &[],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // --json: the program's own output went to stderr.
    assert!(run.stderr.contains("done steps=3"), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["fits"], true);
    assert_eq!(u(&v["count"]), 2);
    assert_eq!(u(&v["gpu"]["memory"]), GIB);
    assert_eq!(u(&v["gpu"]["context_bytes"]), CONTEXT);
    assert_eq!(v["exit"]["code"], 0);
    assert_eq!(v["exit"]["signal"], Value::Null);
    assert_eq!(v["failure"], Value::Null);
    let devices = arr(&v["devices"]);
    assert_eq!(devices.len(), 2);
    let peaks = [256 * MIB + 128 * MIB + MIB, 256 * MIB];
    for (device, peak) in devices.iter().zip(peaks) {
        assert_eq!(u(&device["peak_recorded"]), peak, "{device}");
        assert_eq!(u(&device["untracked"]), CONTEXT, "{device}");
        assert_eq!(u(&device["peak_used"]), peak + CONTEXT, "{device}");
        assert_eq!(u(&device["capacity"]), GIB, "{device}");
        assert_eq!(u(&device["headroom"]), GIB - peak - CONTEXT, "{device}");
        assert_eq!(u(&device["failures"]), 0, "{device}");
    }
    // Needs 897 MiB: the smallest preset is the T4.
    assert_eq!(u(&v["needed"]), peaks[0] + CONTEXT);
    assert_eq!(v["smallest_fitting_gpu"]["key"], "t4");
    assert_eq!(u(&v["smallest_fitting_gpu"]["memory"]), T4_MEMORY);
    let log = only_log(&run);
    assert_eq!(
        arr(&v["logs"]),
        &vec![Value::from(log.display().to_string())]
    );
    assert_eq!(
        v["report_command"],
        format!("vramshim report {}", log.display())
    );
    assert!(
        v["limits"]
            .as_str()
            .is_some_and(|l| l.contains("autotuning sees fake timings"))
    );
    // The recorded log is an ordinary one: the driver was told the card.
    let dump = dump(&log);
    let samples: Vec<&Value> = dump.iter().filter(|r| r["type"] == "mem_info").collect();
    assert!(!samples.is_empty());
    assert!(samples.iter().all(|s| u(&s["total"]) == GIB), "{samples:?}");
    // Compacted once the verdict read it, as `vramshim run` leaves its logs: one chunk, and
    // compressed (the recorder wrote it plain).
    let bytes = std::fs::read(&log).expect("read the log");
    let chunks = vramshim_format::chunk_spans(&bytes);
    assert_eq!(
        chunks
            .iter()
            .map(|chunk| chunk.compressed)
            .collect::<Vec<_>>(),
        [true],
        "{log:?}"
    );
}

#[test]
fn a_job_that_does_not_fit_names_its_line_and_the_card_that_would_fit() {
    let fakes = fakes_dir("oom");
    // 14 GiB of weights on both devices of two T4s, then 1 GiB of activations: 14 GiB +
    // 512 MiB context + 1 GiB > 14.76 GiB.
    let command = train(&["14336", "1024", "2", "2"]);
    let run = dryrun(
        "oom",
        Some(&fakes),
        &["--gpu", "T4", "--gpus", "2", "--json"],
        &refs(&command),
        &[],
    );
    assert_eq!(
        run.code,
        Some(3),
        "the program's exit status: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains(&format!("oom step=0 size={}", GIB)),
        "{}",
        run.stderr
    );
    let v = run.json();
    assert_eq!(v["fits"], false);
    assert_eq!(v["gpu"]["key"], "t4");
    assert_eq!(v["gpu"]["name"], "Tesla T4");
    assert_eq!(v["exit"]["code"], 3);
    let devices = arr(&v["devices"]);
    assert_eq!(u(&devices[0]["peak_recorded"]), 14 * GIB);
    assert_eq!(u(&devices[0]["peak_used"]), 14 * GIB + CONTEXT);
    assert_eq!(u(&devices[0]["failures"]), 1);
    assert_eq!(u(&devices[1]["peak_recorded"]), 14 * GIB);
    assert_eq!(u(&devices[1]["failures"]), 0);
    let failure = &v["failure"];
    assert_eq!(failure["api"], "cudaMalloc");
    assert_eq!(u(&failure["device"]), 0);
    assert_eq!(u(&failure["request"]), GIB);
    assert_eq!(u(&failure["used"]), 14 * GIB + CONTEXT);
    assert_eq!(u(&failure["free"]), T4_MEMORY - 14 * GIB - CONTEXT);
    assert_eq!(u(&failure["tracked_bytes"]), 14 * GIB);
    assert_eq!(failure["verdict"], "exceeded_free_memory");
    assert_eq!(failure["retry"], Value::Null);
    assert_eq!(failure["python_frame"], Value::Null);
    let source = source("dryrun_train");
    let frame = &failure["user_frame"];
    assert_eq!(frame["function"], "alloc_activations");
    assert!(
        frame["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("dryrun_train.c")),
        "{frame}"
    );
    assert_eq!(
        u(&frame["line"]),
        marker_line(&source, "ALLOC: activations")
    );
    // What was live: the weights, from their line.
    let live = arr(&failure["live_by_stack"]);
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(u(&live[0]["bytes"]), 14 * GIB);
    let top = &arr(&live[0]["frames"])[0];
    assert_eq!(u(&top["line"]), marker_line(&source, "ALLOC: weights"));
    // Needs 14 GiB + context + 1 GiB: more than a T4; the next card up, the L4, fits.
    assert_eq!(u(&v["needed"]), 15 * GIB + CONTEXT);
    assert_eq!(v["smallest_fitting_gpu"]["key"], "l4");
    assert_eq!(u(&v["smallest_fitting_gpu"]["memory"]), L4_MEMORY);
    // Segment-sized buffers look like the caching allocator: no whatif, but the way to get it.
    assert_eq!(v["whatif"], Value::Null);
    assert!(
        v["whatif_note"]
            .as_str()
            .is_some_and(|n| n.contains("backend:cudaMallocAsync"))
    );

    // The text verdict says the same.
    let run = dryrun(
        "oom-text",
        Some(&fakes),
        &["--gpu", "t4", "--gpus", "2"],
        &refs(&command),
        &[],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let line = marker_line(&source, "ALLOC: activations");
    for expected in [
        "verdict: DOES NOT FIT".to_string(),
        "first failed allocation: cudaMalloc of 1.00 GiB on device 0".to_string(),
        format!("  at: alloc_activations (dryrun_train.c:{line})"),
        "the smallest card that fits is l4 (NVIDIA L4, 21.96 GiB)".to_string(),
        "full report: vramshim report ".to_string(),
    ] {
        assert!(
            run.stdout.contains(&expected),
            "{expected:?} missing:\n{}",
            run.stdout
        );
    }
}

#[test]
fn a_per_tensor_log_gets_the_best_allocator_setting() {
    let fakes = fakes_dir("whatif");
    let command = train(&["256", "600", "1", "1"]);
    let run = dryrun(
        "whatif",
        Some(&fakes),
        &["--memory", "1GiB", "--json"],
        &refs(&command),
        &[("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["devices"][0]["allocator"], "per_buffer");
    assert_eq!(u(&v["failure"]["request"]), 600 * MIB);
    // One allocation (the weights) before the failure; every setting rounds 256 MiB to itself.
    let whatif = &v["whatif"];
    assert_eq!(u(&whatif["requests"]), 1, "{whatif}");
    assert_eq!(
        u(&whatif["peak_reserved_before_failure"]),
        256 * MIB,
        "{whatif}"
    );
    assert_eq!(whatif["conf"], "", "ties rank the defaults first: {whatif}");
    assert_eq!(v["whatif_note"], Value::Null);
}

#[test]
fn a_python_program_gets_its_failing_line() {
    let fakes = fakes_dir("python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/dryrun_oom.py");
    let python = machine_python();
    let run = dryrun(
        "python",
        Some(&fakes),
        &["--memory", "1GiB", "--json"],
        &[&python.display().to_string(), &script.display().to_string()],
        &[],
    );
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    let v = run.json();
    let frame = &v["failure"]["python_frame"];
    assert_eq!(frame["function"], "step", "{frame}");
    assert!(
        frame["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("dryrun_oom.py")),
        "{frame}"
    );
    let text = std::fs::read_to_string(&script).expect("read script");
    let line = text
        .lines()
        .position(|l| l.ends_with("# fail: step"))
        .expect("marker") as u64
        + 1;
    assert_eq!(u(&frame["line"]), line);
    assert_eq!(u(&v["failure"]["request"]), GIB);
    assert_eq!(u(&v["failure"]["used"]), 256 * MIB + CONTEXT);
    assert_eq!(u(&v["exit"]["code"]), 4);
}

/// `--gpu a100-80gb --mig 1g.10gb`: the card is the slice (1/8 of the A100 80GB's memory,
/// one compute slice of 14 SMs), in the verdict, in the driver's `cuMemGetInfo`, and in the
/// allocation that no longer fits.
#[test]
fn a_mig_slice_is_the_card() {
    let fakes = fakes_dir("mig");
    let slice_memory = (81_039 * MIB) / 8;
    // 8 GiB of weights, then 2 GiB of activations: 10 GiB + the context > 9.89 GiB.
    let command = train(&["8192", "2048", "1", "1"]);
    let run = dryrun(
        "mig",
        Some(&fakes),
        &["--gpu", "A100-80GB", "--mig", "1g.10gb", "--json"],
        &refs(&command),
        &[],
    );
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["fits"], false);
    assert_eq!(v["gpu"]["name"], "NVIDIA A100-SXM4-80GB MIG 1g.10gb");
    assert_eq!(u(&v["gpu"]["memory"]), slice_memory);
    assert_eq!(u(&v["gpu"]["sms"]), 14);
    let devices = arr(&v["devices"]);
    assert_eq!(u(&devices[0]["capacity"]), slice_memory, "{}", devices[0]);
    assert_eq!(u(&v["failure"]["request"]), 2 * GIB);
    let dump = dump(&only_log(&run));
    let samples: Vec<&Value> = dump.iter().filter(|r| r["type"] == "mem_info").collect();
    assert!(!samples.is_empty());
    assert!(
        samples.iter().all(|s| u(&s["total"]) == slice_memory),
        "{samples:?}"
    );
}

/// `--gpu a100-80gb --gpus 2 --mig "4g.40gb,1g.10gb;7g.80gb"` with `CUDA_VISIBLE_DEVICES`
/// naming card 0's second MIG device by a unique prefix of its UUID (the 1g.10gb, placed after
/// the 4g instance at memory slice 4: GPU instance 11): the verdict (and its `mig` part),
/// the driver's `cuMemGetInfo` and the failing allocation are that slice's (1/8 of the card,
/// 14 SMs); naming card 1 instead gives the whole card's 7g.80gb, where the same run fits.
/// The product fakes (which read the layout), not the test fakes.
#[test]
fn a_mig_layout_judges_the_mig_device_the_program_sees() {
    let fakes = Path::new(vramshim_fakegpu::LIB_DIR)
        .parent()
        .expect("fakegpu dir")
        .to_path_buf();
    let card = 81_039 * MIB;
    let command = train(&["8192", "2048", "1", "1"]);
    let layout = [
        "--gpu",
        "a100-80gb",
        "--gpus",
        "2",
        "--mig",
        "4g.40gb,1g.10gb;7g.80gb",
        "--json",
    ];
    let first = "MIG-46414b45-4d49-4700-0000-000000000100";
    // CUDA_VISIBLE_DEVICES, the device's profile, bytes, SMs, the program's exit code, and the
    // verdict's MIG device: card, index, GPU instance (the 1g.10gb is placed at slice 4), UUID.
    for (visible, name, memory, sms, code, device) in [
        (
            "MIG-46414b45-4d49-4700-0000-00000000010",
            "1g.10gb",
            card / 8,
            14,
            Some(3),
            (0, 1, 11, first),
        ),
        (
            "1",
            "7g.80gb",
            card,
            98,
            Some(0),
            (1, 0, 0, "MIG-46414b45-4d49-4700-0000-000000000001"),
        ),
    ] {
        let run = dryrun(
            "mig-layout",
            Some(&fakes),
            &layout,
            &refs(&command),
            &[("CUDA_VISIBLE_DEVICES", visible)],
        );
        assert_eq!(run.code, code, "{visible}: {}", run.stderr);
        let v = run.json();
        assert_eq!(v["fits"], code == Some(0), "{visible}");
        assert_eq!(
            v["gpu"]["name"],
            format!("NVIDIA A100-SXM4-80GB MIG {name}").as_str()
        );
        assert_eq!(u(&v["gpu"]["memory"]), memory);
        assert_eq!(u(&v["gpu"]["sms"]), sms);
        assert_eq!(
            v["mig"],
            serde_json::json!({
                "layout": "4g.40gb,1g.10gb;7g.80gb",
                "device": {
                    "card": device.0,
                    "index": device.1,
                    "gpu_instance": device.2,
                    "uuid": device.3,
                },
            })
        );
        let devices = arr(&v["devices"]);
        assert_eq!(devices.len(), 1, "{v}");
        assert_eq!(u(&devices[0]["capacity"]), memory, "{}", devices[0]);
        let dump = dump(&only_log(&run));
        let samples: Vec<&Value> = dump.iter().filter(|r| r["type"] == "mem_info").collect();
        assert!(!samples.is_empty());
        assert!(
            samples.iter().all(|s| u(&s["total"]) == memory),
            "{visible}: {samples:?}"
        );
    }
}

/// `--mig "3g.40gb[2c,1c],1g.10gb+me;7g.80gb"`: compute instances are MIG devices of their
/// own. `CUDA_VISIBLE_DEVICES` naming card 0's MIG device 1 (the 1c compute instance of the 3g
/// instance, GPU instance 1): the verdict judges its GPU instance's 40 GiB with its own 14 SMs
/// (the run fits); MIG device 2 (the +me instance, placed at memory slice 4: GPU instance 11):
/// an eighth of the card, where it does not. The product fakes, which read the layout.
#[test]
fn a_mig_layout_with_compute_instances_judges_the_compute_instance_the_program_sees() {
    let fakes = Path::new(vramshim_fakegpu::LIB_DIR)
        .parent()
        .expect("fakegpu dir")
        .to_path_buf();
    let card = 81_039 * MIB;
    let command = train(&["8192", "2048", "1", "1"]);
    let layout_text = "3g.40gb[2c,1c],1g.10gb+me;7g.80gb";
    let layout = [
        "--gpu",
        "a100-80gb",
        "--gpus",
        "2",
        "--mig",
        layout_text,
        "--json",
    ];
    for (index, name, memory, sms, code, gpu_instance) in [
        (1, "1c.3g.40gb", card / 8 * 4, 14, Some(0), 1),
        (2, "1g.10gb+me", card / 8, 14, Some(3), 11),
    ] {
        let uuid = format!("MIG-46414b45-4d49-4700-0000-00000000{index:02x}00");
        let run = dryrun(
            "mig-ci",
            Some(&fakes),
            &layout,
            &refs(&command),
            &[("CUDA_VISIBLE_DEVICES", uuid.as_str())],
        );
        assert_eq!(run.code, code, "{uuid}: {}", run.stderr);
        let v = run.json();
        assert_eq!(v["fits"], code == Some(0), "{uuid}");
        assert_eq!(
            v["gpu"]["name"],
            format!("NVIDIA A100-SXM4-80GB MIG {name}").as_str()
        );
        assert_eq!(u(&v["gpu"]["memory"]), memory);
        assert_eq!(u(&v["gpu"]["sms"]), sms);
        assert_eq!(
            v["mig"],
            serde_json::json!({
                "layout": layout_text,
                "device": {
                    "card": 0,
                    "index": index,
                    "gpu_instance": gpu_instance,
                    "uuid": uuid,
                },
            })
        );
        let devices = arr(&v["devices"]);
        assert_eq!(devices.len(), 1, "{v}");
        assert_eq!(u(&devices[0]["capacity"]), memory, "{}", devices[0]);
        let dump = dump(&only_log(&run));
        let samples: Vec<&Value> = dump.iter().filter(|r| r["type"] == "mem_info").collect();
        assert!(!samples.is_empty());
        assert!(
            samples.iter().all(|s| u(&s["total"]) == memory),
            "{uuid}: {samples:?}"
        );
    }
}

#[test]
fn bad_arguments_and_missing_fakes_are_clear_errors() {
    let fakes = fakes_dir("args");
    let command = train(&["1", "1", "1", "1"]);
    let cases: [(&[&str], &str); 11] = [
        (
            &["--gpu", "a100-80gb", "--mig", "3g.40gb,4g.40gb,1g.10gb"],
            "--mig: card 0: 3g.40gb,4g.40gb,1g.10gb take 8 compute slices, a a100-80gb has 7",
        ),
        (
            &[
                "--gpu",
                "h100",
                "--gpus",
                "2",
                "--mig",
                "7g.80gb;3g.40gb,3g.40gb,1g.10gb",
            ],
            "--mig: card 1: 3g.40gb,3g.40gb,1g.10gb do not fit the 8 memory slices of a h100 \
             at the placements the MIG user guide gives",
        ),
        (
            &["--gpu", "a100-40gb", "--gpus", "2", "--mig", "7g.40gb;none"],
            "--mig: card 1 out of MIG mode (none): dryrun simulates cards that are all in MIG \
             mode",
        ),
        (
            &["--gpu", "a100-80gb", "--mig", "3g.20gb"],
            "unknown MIG profile \"3g.20gb\" for a100-80gb: valid profiles are 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        (&["--gpu", "t4", "--mig", "1g.5gb"], "--mig: t4 has no MIG"),
        (&["--mig", "1g.10gb"], "--gpu <MODEL>"),
        (
            &["--gpu", "a100-80"],
            "unknown GPU \"a100-80\": did you mean a100-80gb?",
        ),
        (
            &["--gpu", "h100", "--memory", "1GiB"],
            "cannot be used with",
        ),
        (&["--memory", "12XB"], "not a size: \"12XB\""),
        (&["--memory", "0"], "--memory 0: a card needs some memory"),
        (&["--gpus", "0"], "not a device count: \"0\" (1 to 64)"),
    ];
    for (args, message) in cases {
        let run = dryrun("args", Some(&fakes), args, &refs(&command), &[]);
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains(message),
            "{args:?}: {message:?} not in {}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
    }
    // No fakes at VRAMSHIM_FAKEGPU_DIR: both places are named, and the product fakes that
    // `cargo build` put beside the executable are not used in its place.
    let missing = scratch("no-fakes").join("nowhere");
    let run = dryrun("no-fakes", Some(&missing), &[], &refs(&command), &[]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let beside = vramshim_tool()
        .parent()
        .expect("dir")
        .join("fakegpu")
        .join("lib");
    assert!(
        beside.is_dir(),
        "cargo build puts the fakes at {}",
        beside.display()
    );
    for expected in [
        format!("VRAMSHIM_FAKEGPU_DIR={} has no lib/", missing.display()),
        format!(
            "{} exists but is not used while VRAMSHIM_FAKEGPU_DIR is set",
            beside.display()
        ),
    ] {
        assert!(
            run.stderr.contains(&expected),
            "{expected:?} not in {}",
            run.stderr
        );
    }
    // Unset: the fakes beside the executable are found (a program without CUDA calls runs
    // and its status comes back).
    let run = dryrun("no-fakes", None, &[], &["/bin/sh", "-c", "exit 7"], &[]);
    assert_eq!(run.code, Some(7), "{}", run.stderr);
    assert!(!run.stderr.contains("were not found"), "{}", run.stderr);
}

#[test]
fn the_preset_table_is_listed() {
    let (code, stdout, stderr) = vramshim(&["dryrun", "--list-gpus"]);
    assert_eq!(code, Some(0), "{stderr}");
    for (key, memory) in [
        ("t4", T4_MEMORY),
        ("a10g", A10G_MEMORY),
        ("l4", L4_MEMORY),
        ("rtx4090", 24_217 * MIB),
        ("rtx3090", 24_269 * MIB),
        ("a100-40gb", 42_298_834_944),
        ("l40s", 45_486 * MIB),
        ("a100-80gb", 81_039 * MIB),
        ("h100", 85_017_493_504),
        ("h100-pcie", 85_017_493_504),
        ("h200", 150_109_880_320),
        ("b200", 182_630 * MIB),
    ] {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("{key} missing:\n{stdout}"));
        assert!(row.contains(&format!(" {memory} ")), "{key}: {row}");
    }
    // The contexts measured on an H100 and an H200 (552,402,944 bytes), the estimate else.
    for (key, context) in [
        ("h100", "526.81 MiB"),
        ("h200", "526.81 MiB"),
        ("t4", "512.00 MiB"),
    ] {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("{key} missing:\n{stdout}"));
        assert!(row.contains(context), "{key}: {row}");
    }
    // Smallest first: the order in which the smallest card that fits is chosen.
    let memories: Vec<u64> = stdout
        .lines()
        .skip(1)
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.parse::<u64>().ok().filter(|n| *n > GIB))
        })
        .collect();
    assert_eq!(memories.len(), 12, "{stdout}");
    assert!(memories.windows(2).all(|w| w[0] <= w[1]), "{memories:?}");
}

#[test]
fn a_program_killed_by_a_signal_gets_its_verdict_and_the_same_death() {
    use std::os::unix::process::ExitStatusExt;
    let fakes = fakes_dir("signal");
    let logs = scratch("signal");
    let output = Command::new(vramshim_tool())
        .args(["dryrun", "--memory", "2GiB", "--json", "-o"])
        .arg(logs.join("%p.vlog"))
        .arg("--")
        .arg(program("abort"))
        .env("VRAMSHIM_FAKEGPU_DIR", &fakes)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run vramshim dryrun");
    assert_eq!(output.status.signal(), Some(libc_sigabrt()), "{output:?}");
    let v: Value = serde_json::from_slice(&output.stdout).expect("verdict printed before dying");
    assert_eq!(v["exit"]["code"], Value::Null);
    assert_eq!(u(&v["exit"]["signal"]), libc_sigabrt() as u64);
    assert_eq!(v["fits"], true);
    // It died before its end, not for want of memory: the verdict covers the run so far.
    assert_eq!(v["completed"], false);
    // Five 1 MiB allocations through the driver, and the context its primary context took.
    assert_eq!(u(&v["devices"][0]["peak_recorded"]), 5 * MIB);
    assert_eq!(u(&v["devices"][0]["peak_used"]), 5 * MIB + CONTEXT);
}

/// A program that stops before its end for another reason than memory is not given a plain
/// FITS: the text says how far the verdict goes.
#[test]
fn a_program_that_stops_early_fits_only_as_far_as_it_ran() {
    let fakes = fakes_dir("stopped");
    let abort = program("abort").display().to_string();
    let run = dryrun(
        "stopped",
        Some(&fakes),
        &["--memory", "2GiB"],
        &[&abort],
        &[],
    );
    assert_eq!(run.code, None, "{}", run.stderr);
    let verdict = run
        .stdout
        .lines()
        .find(|l| l.starts_with("verdict: "))
        .unwrap_or_else(|| panic!("no verdict in:\n{}", run.stdout));
    assert_eq!(
        verdict,
        format!(
            "verdict: FITS AS FAR AS IT RAN: the program stopped (killed by signal {}) before its end, not for want of memory; what the rest of it needs is not known",
            libc_sigabrt()
        )
    );
    // The fixture driver logs no unimplemented call: no such line.
    assert!(!run.stdout.contains("does not implement"), "{}", run.stdout);
}

/// SIGABRT on Linux.
fn libc_sigabrt() -> i32 {
    6
}

#[test]
fn pytorchs_retry_is_recognised_whether_it_saves_the_job_or_not() {
    let fakes = fakes_dir("retry");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/dryrun_retry.py");
    let python = machine_python().display().to_string();
    let script = script.display().to_string();
    let args = ["--memory", "1GiB", "--json"];

    // Two cached blocks released: the repeated request fits, so the job fits.
    let run = dryrun(
        "retry-ok",
        Some(&fakes),
        &args,
        &[&python, &script, "ok"],
        &[],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("retry succeeded"), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["fits"], true);
    assert_eq!(v["failure"], Value::Null);
    assert_eq!(u(&v["recovered_failures"]), 1);
    assert_eq!(u(&v["devices"][0]["failures"]), 1);
    // Peak: 2 x 100 MiB still cached + 300 MiB (more than the 4 x 100 MiB before).
    assert_eq!(u(&v["devices"][0]["peak_recorded"]), 500 * MIB);
    assert_eq!(u(&v["devices"][0]["peak_used"]), 500 * MIB + CONTEXT);

    // One released: the retry fails as well, and the verdict says so.
    let run = dryrun(
        "retry-fail",
        Some(&fakes),
        &args,
        &[&python, &script, "fail"],
        &[],
    );
    assert_eq!(run.code, Some(5), "{}", run.stderr);
    let v = run.json();
    assert_eq!(v["fits"], false);
    assert_eq!(u(&v["recovered_failures"]), 0);
    let failure = &v["failure"];
    assert_eq!(u(&failure["request"]), 300 * MIB);
    assert_eq!(u(&failure["used"]), 400 * MIB + CONTEXT);
    assert_eq!(u(&failure["retry"]["released_bytes"]), 100 * MIB);
    assert_eq!(u(&failure["retry"]["released_count"]), 1);
    assert_eq!(failure["retry"]["succeeded"], false);
    assert_eq!(u(&v["devices"][0]["failures"]), 2);
    // Needed: 400 MiB + context + 300 MiB, over 1 GiB; the T4 fits.
    assert_eq!(u(&v["needed"]), 700 * MIB + CONTEXT);
    assert_eq!(v["smallest_fitting_gpu"]["key"], "t4");
}
