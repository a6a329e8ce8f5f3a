//! Native stacks are exact on every event, under the real preload: one allocation site reached
//! by call paths that differ only in a return address further out (same stack and frame
//! pointers at the site) must get each path's own stack, every time, with and without frame
//! pointers. A walk that answers from what it found last time must notice the difference.

mod common;

use std::collections::HashMap;

use common::*;
use serde_json::Value;

/// The source line ("stack_paths.c:N") of return address `ip` (the call before it).
fn source_line(dump: &[Value], ip: u64) -> String {
    let module = dump
        .iter()
        .filter(|r| r["type"] == "module")
        .find(|m| u64_of(m, "start") <= ip && ip < u64_of(m, "end"))
        .unwrap_or_else(|| panic!("no module holds {ip:#x}"));
    let offset = ip - u64_of(module, "load_bias") - 1;
    let output = std::process::Command::new("addr2line")
        .arg("-e")
        .arg(module["path"].as_str().expect("module path"))
        .arg(format!("{offset:#x}"))
        .output()
        .expect("addr2line (binutils) runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let location = text.trim();
    let file = location.rsplit('/').next().unwrap_or(location);
    // addr2line may append " (discriminator N)".
    file.split(' ').next().unwrap_or(file).to_owned()
}

/// Runs `program_name ROUNDS` under the shim with native stacks (and `env`): its stacks by id
/// (return addresses) and its whole dump, after checking it succeeded and the shim printed
/// nothing.
fn record_native(
    program_name: &str,
    rounds: usize,
    env: &[(&str, &str)],
) -> (HashMap<u64, Vec<u64>>, Vec<Value>) {
    let mut env = env.to_vec();
    env.push(("VRAMSHIM_STACK", "native"));
    let run = run_under_shim(program_name, program_name, &[&rounds.to_string()], &env);
    assert!(
        run.output.status.success(),
        "{program_name} failed:\n{}",
        run.stderr()
    );
    assert_eq!(run.stderr(), "", "the shim printed something");
    let dump = dump(&run.log());
    let stacks = dump
        .iter()
        .filter(|r| r["type"] == "stack")
        .map(|r| {
            let frames = arr(&r["frames"])
                .iter()
                .map(|f| f.as_u64().expect("native frame"))
                .collect();
            (u64_of(r, "id"), frames)
        })
        .collect();
    (stacks, dump)
}

fn check_paths(program_name: &str) {
    const ROUNDS: usize = 300;
    let (stacks, dump) = record_native(program_name, ROUNDS, &[]);
    let events = events(&dump);
    let allocs = select(&events, "alloc", "cuMemAlloc_v2");
    assert_eq!(allocs.len(), ROUNDS, "one allocation per round");

    let source = source("stack_paths");
    let line = |marker: &str| format!("stack_paths.c:{}", marker_line(&source, marker));
    // Innermost frames of each path, in the order main takes them.
    let paths = [
        vec![line("site"), line("mid"), line("outer_a"), line("main_a")],
        vec![line("site"), line("mid"), line("outer_b"), line("main_b")],
        vec![line("site"), line("main_site")],
    ];
    let mut id_of_path: [Option<u64>; 3] = [None; 3];
    for (round, alloc) in allocs.iter().enumerate() {
        let id = u64_of(alloc, "stack");
        let path = round % 3;
        match id_of_path[path] {
            // A stack already checked: the same id on every round of that path.
            Some(known) => assert_eq!(id, known, "round {round}: path {path} got another stack"),
            None => {
                let frames = &stacks[&id];
                let lines: Vec<String> = frames
                    .iter()
                    .take(paths[path].len())
                    .map(|&ip| source_line(&dump, ip))
                    .collect();
                assert_eq!(lines, paths[path], "round {round}: frames {frames:x?}");
                id_of_path[path] = Some(id);
            }
        }
    }
    // Three paths, three stacks (and the two same-depth paths differ only past `mid`).
    assert_eq!(stacks.len(), 3, "{stacks:x?}");
    let (a, b) = (
        &stacks[&id_of_path[0].expect("a")],
        &stacks[&id_of_path[1].expect("b")],
    );
    assert_eq!(a.len(), b.len());
    assert_eq!(a[..2], b[..2]);
    assert_ne!(a[2], b[2]);
}

#[test]
fn same_site_through_different_callers_with_frame_pointers() {
    check_paths("stack_paths");
}

#[test]
fn same_site_through_different_callers_without_frame_pointers() {
    check_paths("stack_paths_nofp");
}

/// The function of each return address in `ips` (the call before it), all in one module.
fn functions(dump: &[Value], ips: &[u64]) -> Vec<String> {
    locations(dump, ips)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// The function and the source line ("file.c:N") of each return address in `ips` (the call
/// before it), all in one module.
fn locations(dump: &[Value], ips: &[u64]) -> Vec<(String, String)> {
    let module_of = |ip: u64| {
        dump.iter()
            .filter(|r| r["type"] == "module")
            .find(|m| u64_of(m, "start") <= ip && ip < u64_of(m, "end"))
            .unwrap_or_else(|| panic!("no module holds {ip:#x}"))
    };
    let module = module_of(ips[0]);
    let offsets: Vec<String> = ips
        .iter()
        .map(|&ip| {
            assert_eq!(module_of(ip)["path"], module["path"], "{ip:#x}");
            format!("{:#x}", ip - u64_of(module, "load_bias") - 1)
        })
        .collect();
    let output = std::process::Command::new("addr2line")
        .arg("-f")
        .arg("-e")
        .arg(module["path"].as_str().expect("module path"))
        .args(&offsets)
        .output()
        .expect("addr2line (binutils) runs");
    let text = String::from_utf8_lossy(&output.stdout);
    // Two lines an address: the function, then file:line (maybe " (discriminator N)").
    let lines: Vec<&str> = text.lines().collect();
    let found: Vec<(String, String)> = lines
        .chunks_exact(2)
        .map(|pair| {
            let file = pair[1].rsplit('/').next().unwrap_or(pair[1]);
            let file = file.split(' ').next().unwrap_or(file);
            (pair[0].to_owned(), file.to_owned())
        })
        .collect();
    assert_eq!(found.len(), ips.len(), "addr2line printed:\n{text}");
    found
}

/// A thread whose walks cross more distinct return addresses than framehop's 509-slot rule
/// cache holds moves to the shim's larger cache while it runs (`stack_many.c`: 1,024 callers
/// in turn, so at least 1,024 - 509 slot conflicts in the first pass, far above the 64 that
/// trigger the move). Every walk, before, during and after the move, must still find its own
/// caller: 2,048 rounds, each caller twice, each time the same stack, 1,024 stacks in all,
/// each `site <- f_<caller> <- main`.
fn check_many_callers(program_name: &str) {
    const CALLERS: usize = 1024;
    const ROUNDS: usize = 2 * CALLERS;
    let (stacks, dump) = record_native(program_name, ROUNDS, &[]);
    let events = events(&dump);
    let allocs = select(&events, "alloc", "cuMemAlloc_v2");
    assert_eq!(allocs.len(), ROUNDS, "one allocation per round");
    let mut id_of_caller: Vec<Option<u64>> = vec![None; CALLERS];
    for (round, alloc) in allocs.iter().enumerate() {
        let id = u64_of(alloc, "stack");
        let caller = round % CALLERS;
        match id_of_caller[caller] {
            Some(known) => assert_eq!(id, known, "round {round}: caller {caller}"),
            None => id_of_caller[caller] = Some(id),
        }
    }
    let ids: Vec<u64> = id_of_caller.iter().map(|id| id.expect("seen")).collect();
    let distinct: std::collections::HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), CALLERS, "one stack per caller");
    let innermost: Vec<u64> = ids
        .iter()
        .flat_map(|id| {
            let frames = &stacks[id];
            assert!(frames.len() >= 3, "stack {id}: {frames:x?}");
            frames[..3].to_vec()
        })
        .collect();
    let names = functions(&dump, &innermost);
    for (caller, found) in names.chunks(3).enumerate() {
        // The caller's name: its index in five base-4 digits.
        let digits: String = (0..5)
            .rev()
            .map(|place| char::from(b'0' + (caller >> (2 * place) & 3) as u8))
            .collect();
        assert_eq!(
            found,
            ["site".to_owned(), format!("f_{digits}"), "main".to_owned()],
            "caller {caller}"
        );
    }
}

#[test]
fn more_callers_than_one_rule_cache_holds_with_frame_pointers() {
    check_many_callers("stack_many");
}

#[test]
fn more_callers_than_one_rule_cache_holds_without_frame_pointers() {
    check_many_callers("stack_many_nofp");
}

/// Walks that join an earlier walk part-way take only what is exactly theirs
/// (`stack_joins.c`: 20 call paths in turn, three times, under `VRAMSHIM_MAX_FRAMES=256`):
/// six outer functions whose inner frames lie at the same stack pointer, one frame calling
/// the same chain from two places, the chain moved down by an alloca, and recursions deeper
/// and shallower than the frame limit that share their outer frames. Every round's stack is
/// checked frame by frame (function names through addr2line, the call lines in `main` and
/// `bounce`, the frames past `main` the same as every other round's), its length exactly the
/// stack's or the limit, and each path gets the same stack id on every pass.
fn check_joins(program_name: &str) {
    const PATHS: usize = 20;
    const ROUNDS: usize = 3 * PATHS;
    const MAX_FRAMES: usize = 256;
    const DEPTHS: [usize; 8] = [300, 310, 200, 250, 280, 150, 40, 1];
    let (stacks, dump) = record_native(
        program_name,
        ROUNDS,
        &[("VRAMSHIM_MAX_FRAMES", &MAX_FRAMES.to_string())],
    );
    let allocs = select(&events(&dump), "alloc", "cuMemAlloc_v2");
    assert_eq!(allocs.len(), ROUNDS, "one allocation per round");
    let source = source("stack_joins");
    let line = |marker: &str| format!("stack_joins.c:{}", marker_line(&source, marker));
    let chain = ["site", "inner_3", "inner_2", "inner_1"].map(str::to_owned);
    // The frames past `main` (the C library's start), as the first round found them.
    let mut start_frames: Option<Vec<u64>> = None;
    let mut id_of_path: [Option<u64>; PATHS] = [None; PATHS];
    for (round, alloc) in allocs.iter().enumerate() {
        let path = round % PATHS;
        let id = u64_of(alloc, "stack");
        let frames = &stacks[&id];
        // The program's frames, innermost first, and the call lines checked among them.
        let mut names: Vec<String> = Vec::new();
        let mut call_lines: Vec<(usize, String)> = Vec::new();
        match path {
            0..=5 => {
                names.extend(chain.iter().cloned());
                names.push(format!("outer_{path}"));
                call_lines.push((names.len(), line("main_outer")));
            }
            6 | 7 => {
                names.extend(chain.iter().cloned());
                call_lines.push((names.len(), line(&format!("bounce_{}", path - 6))));
                names.push("bounce".to_owned());
                call_lines.push((names.len(), line("main_bounce")));
            }
            8..=11 => {
                names.extend(chain.iter().cloned());
                names.push("shifted".to_owned());
                call_lines.push((names.len(), line("main_shifted")));
            }
            _ => {
                names.push("site".to_owned());
                names.extend(std::iter::repeat_n("rec".to_owned(), DEPTHS[path - 12] + 1));
                call_lines.push((names.len(), line("main_rec")));
            }
        }
        names.push("main".to_owned());
        let in_program = names.len().min(MAX_FRAMES);
        assert!(
            frames.len() >= in_program,
            "round {round} (path {path}): {} frames, {in_program} expected in the program",
            frames.len()
        );
        let found = locations(&dump, &frames[..in_program]);
        let found_names: Vec<&str> = found.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            found_names,
            names[..in_program],
            "round {round} (path {path})"
        );
        for (at, expected) in call_lines.iter().filter(|(at, _)| *at < in_program) {
            assert_eq!(
                &found[*at].1, expected,
                "round {round} (path {path}), frame {at}"
            );
        }
        let start = start_frames.get_or_insert_with(|| frames[in_program..].to_vec());
        assert!(!start.is_empty(), "no frames past main: {frames:x?}");
        let expected_len = (names.len() + start.len()).min(MAX_FRAMES);
        assert_eq!(frames.len(), expected_len, "round {round} (path {path})");
        assert_eq!(
            frames[in_program..],
            start[..expected_len - in_program],
            "round {round} (path {path}): the frames past main"
        );
        match id_of_path[path] {
            Some(known) => assert_eq!(id, known, "round {round}: path {path} got another stack"),
            None => id_of_path[path] = Some(id),
        }
    }
    // 6 outer paths, 2 bounce call sites, 1 for every alloca (the same frames), and the
    // recursions: 300, 310 and 280 are all cut to the same 256 frames.
    let distinct: std::collections::HashSet<u64> =
        id_of_path.iter().map(|id| id.expect("seen")).collect();
    assert_eq!(distinct.len(), 6 + 2 + 1 + 6, "{id_of_path:?}");
}

#[test]
fn walks_joining_earlier_walks_keep_their_own_frames_with_frame_pointers() {
    check_joins("stack_joins");
}

#[test]
fn walks_joining_earlier_walks_keep_their_own_frames_without_frame_pointers() {
    check_joins("stack_joins_nofp");
}

/// A remembered walk is replayed or joined only where `rbp` is the same wherever a later
/// frame's unwind rule reads it (`rbp_reads.c`, built without frame pointers but for `framed`,
/// which keeps its frame in `rbp`): two callers of different frame sizes call `framed`, whose
/// alloca lines `site` up at one stack pointer, in turn, from one call site, so the walks
/// start from the same registers but `rbp`, and read the same words but those at `rbp`; the
/// words at the other round's `rbp` are stale ones it left (with `rbp` never compared, the
/// far rounds got near_caller's stack). Every round names its own caller and call
/// lines, and each caller keeps one stack id.
#[test]
fn walks_that_differ_only_where_a_rule_reads_rbp_keep_their_own_frames() {
    const ROUNDS: usize = 40;
    let (stacks, dump) = record_native("rbp_reads", ROUNDS, &[]);
    let allocs = select(&events(&dump), "alloc", "cuMemAlloc_v2");
    assert_eq!(allocs.len(), ROUNDS, "one allocation per round");
    let source = source("rbp_reads");
    let line = |marker: &str| format!("rbp_reads.c:{}", marker_line(&source, marker));
    let mut id_of_caller: [Option<u64>; 2] = [None; 2];
    for (round, alloc) in allocs.iter().enumerate() {
        let id = u64_of(alloc, "stack");
        let frames = &stacks[&id];
        let (caller, call) = if round % 2 == 0 {
            ("near_caller", "near")
        } else {
            ("far_caller", "far")
        };
        assert!(frames.len() > 5, "round {round}: {frames:x?}");
        let found = locations(&dump, &frames[..5]);
        let names: Vec<&str> = found.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            ["site", "framed", caller, "visit", "main"],
            "round {round}"
        );
        assert_eq!(
            found[2].1,
            line(call),
            "round {round}: the call in {caller}"
        );
        assert_eq!(
            found[3].1,
            line("visit"),
            "round {round}: the call in visit"
        );
        assert_eq!(
            found[4].1,
            line("main_visit"),
            "round {round}: the call in main"
        );
        match id_of_caller[round % 2] {
            Some(known) => assert_eq!(id, known, "round {round}: {caller} got another stack"),
            None => id_of_caller[round % 2] = Some(id),
        }
    }
    assert_ne!(id_of_caller[0], id_of_caller[1]);
}
