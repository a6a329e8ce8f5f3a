//! `pip install vramshim`: `scripts/build-wheel.sh` packages this build (`--from`
//! target/debug), the wheel is installed into a fresh venv with pip (no index, no network),
//! and the installed `vramshim` command, `python -m vramshim` and `vramshim.mark` are used as a
//! user would: a recorded run of the demo program, a dry run of it on a simulated 2 GiB card,
//! and marks from Python.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::torch::repo;
use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn run_ok(command: &mut Command, what: &str) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|err| panic!("{what}: {err}"));
    assert!(
        output.status.success(),
        "{what} failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The wheel built from this build's outputs (`scripts/build-wheel.sh --from target/debug`),
/// once per test binary; its name checked.
fn wheel() -> &'static Path {
    static WHEEL: OnceLock<PathBuf> = OnceLock::new();
    WHEEL.get_or_init(|| {
        let wheels = scratch("wheel-build").join("wheels");
        let built = run_ok(
            Command::new("bash")
                .arg(repo().join("scripts/build-wheel.sh"))
                .arg("--from")
                .arg(target_dir())
                .arg("--out")
                .arg(&wheels),
            "build-wheel.sh",
        );
        let stdout = String::from_utf8_lossy(&built.stdout);
        let wheel = PathBuf::from(stdout.lines().last().expect("the wheel's path"));
        let name = wheel.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(
            name.starts_with(&format!(
                "vramshim-{}-py3-none-manylinux_2_",
                env!("CARGO_PKG_VERSION")
            )) && name.ends_with("_x86_64.whl"),
            "{name}"
        );
        wheel
    })
}

/// [`wheel`] installed into a fresh venv under `dir`; the venv's `bin/`.
fn install_wheel(dir: &Path) -> PathBuf {
    let venv = dir.join("venv");
    run_ok(
        Command::new(machine_python())
            .arg("-m")
            .arg("venv")
            .arg(&venv),
        "python3 -m venv",
    );
    let bin = venv.join("bin");
    run_ok(
        Command::new(bin.join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-index",
                "--disable-pip-version-check",
            ])
            .arg(wheel()),
        "pip install",
    );
    bin
}

#[test]
fn installed_wheel_records_runs_dry_runs_and_marks() {
    let dir = scratch("wheel");
    let bin = install_wheel(&dir);

    // The console script and `python -m vramshim` are the bundled command.
    for command in [
        Command::new(bin.join("vramshim")).arg("--version"),
        Command::new(bin.join("python")).args(["-m", "vramshim", "--version"]),
    ] {
        let output = run_ok(command, "vramshim --version");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("vramshim {}\n", env!("CARGO_PKG_VERSION"))
        );
    }

    // The demo, recorded with the installed recorder against the test fakes: 5 leaked
    // 16 MiB buffers, then a failed 1200 MiB cudaMalloc.
    let log = dir.join("demo.vlog");
    let output = Command::new(bin.join("vramshim"))
        .arg("run")
        .arg("-o")
        .arg(&log)
        .arg("--")
        .arg(program("demo"))
        .env("LD_LIBRARY_PATH", fake_lib_dir())
        .output()
        .expect("vramshim run demo");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let leaks = json_of(&["leaks".as_ref(), "--json".as_ref(), log.as_os_str()]);
    let device0 = arr(&leaks["devices"])
        .iter()
        .find(|d| d["device"] == 0)
        .expect("device 0 leaks");
    assert_eq!(device0["bytes"], 80 * MIB, "5 x 16 MiB leaked");
    assert_eq!(device0["count"], 5);
    let oom = json_of(&["oom".as_ref(), "--json".as_ref(), log.as_os_str()]);
    let failures = arr(&oom["failures"]);
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0]["request"], 1200 * MIB);

    // The same program as a dry run on a 2 GiB card, through `python -m vramshim`, with the
    // wheel's fake GPU libraries: 512 MiB context + 832 MiB weights + 80 MiB leaked leave
    // 624 MiB, too little for the 1200 MiB buffer.
    let dry_log = dir.join("dry.vlog");
    let output = Command::new(bin.join("python"))
        .args([
            "-m", "vramshim", "dryrun", "--memory", "2GiB", "--json", "-o",
        ])
        .arg(&dry_log)
        .arg("--")
        .arg(program("demo"))
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("python -m vramshim dryrun");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let verdict: Value = serde_json::from_slice(&output.stdout).expect("dryrun --json");
    assert_eq!(verdict["fits"], false, "{verdict}");
    assert_eq!(verdict["failure"]["request"], 1200 * MIB, "{verdict}");
    assert_eq!(verdict["failure"]["device"], 0);
    assert_eq!(
        verdict["failure"]["explanation"],
        "the request (1.17 GiB) exceeded the device's free memory (624.00 MiB)"
    );

    // vramshim.mark from the installed package: recorded under the recorder, a no-op outside.
    let script = repo().join("tests/python/marks.py");
    let marks_log = dir.join("marks.vlog");
    let output = run_ok(
        Command::new(bin.join("vramshim"))
            .arg("run")
            .arg("-o")
            .arg(&marks_log)
            .arg("--")
            .arg(bin.join("python"))
            .arg(&script)
            .env("LD_LIBRARY_PATH", fake_lib_dir())
            .env_remove("PYTHONPATH"),
        "vramshim run python marks.py",
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).starts_with("recording True\nmark epoch 1 True\n"),
        "{output:?}"
    );
    let timeline = json_of(&[
        "timeline".as_ref(),
        "--json".as_ref(),
        marks_log.as_os_str(),
    ]);
    let texts: Vec<&str> = arr(&timeline["marks"])
        .iter()
        .map(|m| m["text"].as_str().expect("text"))
        .collect();
    assert_eq!(texts, ["epoch 1", "epoch 2", "free </script> & done"]);
    let output = run_ok(
        Command::new(bin.join("python"))
            .arg(&script)
            .env("LD_LIBRARY_PATH", fake_lib_dir())
            .env_remove("PYTHONPATH")
            .env_remove("LD_PRELOAD"),
        "python marks.py without the recorder",
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "recording False\nmark epoch 1 False\nmark epoch 2 False\nmark free </script> & done False\n"
    );
}

/// `auditwheel` from `scripts/fetch-consumers.sh`, or why there is none.
fn auditwheel() -> Result<PathBuf, String> {
    let output = Command::new("bash")
        .arg(repo().join("scripts/fetch-consumers.sh"))
        .output()
        .map_err(|err| format!("fetch-consumers.sh: {err}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in stdout.lines() {
        if let Some(path) = line.strip_prefix("auditwheel=") {
            return Ok(PathBuf::from(path));
        }
        if let Some(why) = line.strip_prefix("auditwheel!=") {
            return Err(why.to_string());
        }
    }
    Err("fetch-consumers.sh said nothing about auditwheel".to_string())
}

/// The wheel's binaries carry no debug sections (`strip --strip-debug`; a debug build's are
/// most of its size), it holds the NVTX injection library, and auditwheel finds it consistent
/// with the manylinux tag in its name: every library a packaged binary needs is in the wheel
/// (the fakes find the fake driver beside themselves) or one manylinux allows.
#[test]
fn wheel_is_stripped_holds_the_nvtx_library_and_auditwheel_agrees_with_its_tag() {
    let dir = scratch("wheel-audit");
    let wheel = wheel();
    let unpacked = dir.join("unpacked");
    run_ok(
        Command::new(machine_python())
            .args(["-m", "zipfile", "-e"])
            .arg(wheel)
            .arg(&unpacked),
        "unzip the wheel",
    );
    let bin = unpacked.join("vramshim/_bin");
    let mut binaries = vec![
        bin.join("vramshim"),
        bin.join("libvramshim.so"),
        bin.join("libvramshim_nvtx.so"),
    ];
    for name in files_in(&bin.join("fakegpu/lib")) {
        binaries.push(bin.join("fakegpu/lib").join(name));
    }
    for binary in &binaries {
        let sections = run_ok(
            Command::new("readelf").arg("-S").arg("--wide").arg(binary),
            "readelf -S",
        );
        let sections = String::from_utf8_lossy(&sections.stdout);
        assert!(
            sections.contains(".symtab"),
            "{}: {sections}",
            binary.display()
        );
        // (Rust keeps an allocated `.debug_gdb_scripts`: not debug information.)
        for debug in [".debug_info", ".debug_line", ".debug_str", ".debug_abbrev"] {
            assert!(
                !sections.contains(debug),
                "{}: {sections}",
                binary.display()
            );
        }
    }
    // The source was built with them (a debug build): stripping took them out.
    let source = run_ok(
        Command::new("readelf")
            .arg("-S")
            .arg("--wide")
            .arg(target_dir().join("libvramshim_nvtx.so")),
        "readelf -S",
    );
    assert!(String::from_utf8_lossy(&source.stdout).contains(".debug_info"));
    let symbols = run_ok(
        Command::new("nm")
            .arg("-D")
            .arg("--defined-only")
            .arg(bin.join("libvramshim_nvtx.so")),
        "nm -D",
    );
    assert!(
        String::from_utf8_lossy(&symbols.stdout)
            .lines()
            .any(|line| line.ends_with(" T InitializeInjectionNvtx2")),
        "{symbols:?}"
    );

    let auditwheel = match auditwheel() {
        Ok(path) => path,
        Err(why) => {
            skipped(&format!("wheel: auditwheel show: {why}"));
            return;
        }
    };
    let shown = run_ok(
        Command::new(auditwheel).arg("show").arg(wheel),
        "auditwheel show",
    );
    let text = String::from_utf8_lossy(&shown.stdout);
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let name = wheel.file_name().and_then(|n| n.to_str()).expect("name");
    let tag = name
        .strip_prefix(&format!("vramshim-{}-py3-none-", env!("CARGO_PKG_VERSION")))
        .and_then(|rest| rest.strip_suffix(".whl"))
        .expect("platform tag");
    assert!(
        words.contains(&format!(
            "{name} is consistent with the following platform tag: \"{tag}\""
        )),
        "{text}"
    );
}
