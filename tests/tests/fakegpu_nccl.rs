//! The fake NCCL (`fakegpu/src/nccl/`) across processes, without PyTorch:
//! `tests/python/nccl_ranks.py` forks the ranks of one communicator and calls the library
//! through ctypes. Collectives must give each rank exactly what NCCL defines; a rank that
//! exits, calls another collective or never comes must make the others' calls fail with one
//! line, never hang.

mod common;

use std::process::{Command, Output};

use common::*;
use serde_json::Value;

/// Runs `nccl_ranks.py MODE NRANKS` on the fakes; returns its output and each rank's JSON,
/// by rank.
fn ranks(mode: &str, nranks: usize, env: &[(&str, &str)]) -> (Output, Vec<Value>) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/nccl_ranks.py");
    let output = Command::new(machine_python())
        .arg(&script)
        .arg(mode)
        .arg(nranks.to_string())
        .env("LD_LIBRARY_PATH", vramshim_fakegpu::LIB_DIR)
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMSHIM_FAKEGPU_NCCL_TIMEOUT")
        .envs(env.iter().copied())
        .output()
        .expect("run nccl_ranks.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{mode}: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut by_rank: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    by_rank.sort_by_key(|v| u64_of(v, "rank"));
    (output, by_rank)
}

fn stderr_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every collective (sum, max in place, int64 product, average, bfloat16 sum, all-gather,
/// reduce-scatter, broadcast, reduce, all-to-all, split) and point to point (a ring of sends and
/// receives in one group, a send alone, two messages in order, a rank to itself) on 2 and on 3
/// processes, with 300,000 floats per rank: more than one round through the 1 MiB slots and
/// the 256 KiB mailboxes.
#[test]
fn collectives_give_every_rank_exactly_what_nccl_defines() {
    for nranks in [2, 3] {
        let (_, ranks) = ranks("data", nranks, &[]);
        assert_eq!(ranks.len(), nranks);
        for (rank, r) in ranks.iter().enumerate() {
            assert_eq!(u64_of(r, "rank"), rank as u64);
            assert_eq!(r["init"], 0, "{r}");
            let results = r["results"].as_object().expect("results");
            assert_eq!(results.len(), 14, "{r}");
            for (name, ok) in results {
                assert_eq!(ok, true, "{nranks} ranks, rank {rank}: {name}: {r}");
            }
        }
    }
}

/// Rank 1 exits after joining: rank 0's all-reduce fails with ncclRemoteError and one line
/// naming the rank and its pid (the fake checks its peers' processes while it waits).
#[test]
fn a_rank_that_exits_makes_the_others_collective_fail() {
    let (output, ranks) = ranks("exit", 2, &[]);
    let r = &ranks[0];
    assert_eq!(r["status"], 6, "{r}");
    let error = r["error"].as_str().expect("error");
    let pid = error
        .strip_prefix("NCCL rank 0 of 2: rank 1 (pid ")
        .and_then(|rest| rest.strip_suffix(") exited in ncclAllReduce #1"))
        .unwrap_or_else(|| panic!("{error}"));
    assert!(pid.parse::<u32>().is_ok(), "{error}");
    assert_eq!(
        stderr_lines(&output),
        vec![format!("vramshim fakegpu: {error}")]
    );
}

/// Rank 0 calls all-reduce where rank 1 calls all-gather: both calls fail (ncclInvalidUsage)
/// naming both collectives, instead of mixing their data or waiting forever.
#[test]
fn ranks_calling_different_collectives_both_fail() {
    let (output, ranks) = ranks("mismatch", 2, &[]);
    let expected = [
        "NCCL rank 0 of 2 called ncclAllReduce #1 (4 elements of type 7, root 0) while rank 1 \
         called ncclAllGather #1 (4 elements of type 7, root 0)",
        "NCCL rank 1 of 2 called ncclAllGather #1 (4 elements of type 7, root 0) while rank 0 \
         called ncclAllReduce #1 (4 elements of type 7, root 0)",
    ];
    for (r, error) in ranks.iter().zip(expected) {
        assert_eq!(r["status"], 5, "{r}");
        assert_eq!(r["error"], error, "{r}");
    }
    let mut lines = stderr_lines(&output);
    lines.sort();
    assert_eq!(
        lines,
        expected
            .iter()
            .map(|e| format!("vramshim fakegpu: {e}"))
            .collect::<Vec<_>>()
    );
}

/// Rank 1 is alive but never calls the collective: rank 0 gives up after
/// `VRAMSHIM_FAKEGPU_NCCL_TIMEOUT` seconds with ncclSystemError and one line.
#[test]
fn a_rank_that_never_comes_times_out() {
    let (output, ranks) = ranks("late", 2, &[("VRAMSHIM_FAKEGPU_NCCL_TIMEOUT", "1")]);
    let r = &ranks[0];
    let error = "NCCL rank 0 of 2: waited 1 s for the other ranks in ncclAllReduce #1; giving \
                 up (VRAMSHIM_FAKEGPU_NCCL_TIMEOUT)";
    assert_eq!(r["status"], 2, "{r}");
    assert_eq!(r["error"], error, "{r}");
    assert_eq!(
        stderr_lines(&output),
        vec![format!("vramshim fakegpu: {error}")]
    );
}
