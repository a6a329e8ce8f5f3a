//! Flame graphs weighted by bytes: folded stack lines and the SVG `inferno` draws from them.

use std::collections::BTreeMap;
use std::io;

use inferno::flamegraph::color::{BasicPalette, Palette};
use inferno::flamegraph::{self, Options};

use super::svg::Svg;
use crate::analysis::groups::{GroupThread, NO_STACK, StackGroup};
use crate::symbols::SymFrame;

/// The stacks of one device, drawn under a root frame naming the device.
pub struct DeviceStacks {
    pub device: i32,
    pub groups: Vec<StackGroup>,
}

/// A frame label made safe for the folded format: `;` separates frames, a line ends a stack.
fn folded_label(label: &str) -> String {
    label
        .chars()
        .map(|c| match c {
            ';' => ',',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect()
}

/// The frame naming a thread in flame graphs: `thread NAME (TID)`.
pub fn thread_frame(thread: &GroupThread) -> String {
    format!("thread {} ({})", thread.name_or_unnamed(), thread.tid)
}

/// Folded lines, `device;outermost;...;innermost bytes` (groups split by thread:
/// `device;thread NAME (TID);outermost;...`), sorted; identical stacks merged.
pub fn folded(parts: &[DeviceStacks]) -> Vec<String> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for part in parts {
        for group in &part.groups {
            if group.bytes == 0 {
                continue;
            }
            let mut stack = folded_label(&super::device_name(part.device));
            if let Some(thread) = &group.thread {
                stack.push(';');
                stack.push_str(&folded_label(&thread_frame(thread)));
            }
            if group.frames.is_empty() {
                stack.push(';');
                stack.push_str(NO_STACK);
            }
            for frame in group.frames.iter().rev() {
                stack.push(';');
                stack.push_str(&folded_label(&SymFrame::label(frame)));
            }
            let total = lines.entry(stack).or_default();
            *total = total.saturating_add(group.bytes);
        }
    }
    lines
        .into_iter()
        .map(|(stack, bytes)| format!("{stack} {bytes}"))
        .collect()
}

/// The flame graph of `lines` as SVG; with no lines, a small picture that says so.
pub fn svg(lines: &[String], title: &str, subtitle: &str, empty: &str) -> io::Result<Vec<u8>> {
    if lines.is_empty() {
        // inferno refuses empty input; the answer "nothing" is still a picture.
        let mut svg = Svg::new(1200.0, 110.0, title);
        svg.text(
            600.0,
            30.0,
            &[("text-anchor", "middle"), ("font-size", "17")],
            title,
        );
        svg.text(600.0, 55.0, &[("text-anchor", "middle")], subtitle);
        svg.text(600.0, 85.0, &[("text-anchor", "middle")], empty);
        return Ok(svg.finish().into_bytes());
    }
    // inferno sums the weights in a machine word: when the bytes (from a damaged or crafted
    // log) would overflow it, every weight is divided by the same power of two.
    let weights: Vec<u64> = lines
        .iter()
        .map(|line| {
            line.rsplit(' ')
                .next()
                .and_then(|weight| weight.parse().ok())
                .unwrap_or(0)
        })
        .collect();
    let fits = |shift: u32| {
        weights
            .iter()
            .try_fold(0u64, |sum, weight| sum.checked_add(weight >> shift))
            .is_some()
    };
    let shift = (0..64).find(|&shift| fits(shift)).unwrap_or(63);
    let scaled: Vec<String>;
    let lines: &[String] = if shift == 0 {
        lines
    } else {
        scaled = lines
            .iter()
            .zip(&weights)
            .map(|(line, weight)| {
                let stack = line
                    .rsplit_once(' ')
                    .map_or(line.as_str(), |(stack, _)| stack);
                format!("{stack} {}", weight >> shift)
            })
            .collect();
        &scaled
    };
    let mut options = Options::default();
    options.title = title.to_string();
    options.subtitle = Some(subtitle.to_string());
    options.count_name = if shift == 0 {
        "bytes".to_string()
    } else {
        format!("x {} bytes", 1u64 << shift)
    };
    options.colors = Palette::Basic(BasicPalette::Mem);
    // Same colour for the same frame in every graph, so two graphs compare at a glance.
    options.hash = true;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flamegraph_folded_lines_are_outermost_first_and_merged() {
        let frame = |name: &str, line: u32| SymFrame {
            function: Some(name.into()),
            file: Some("/src/a.c".into()),
            line: Some(line),
            module: "/bin/a".into(),
            offset: u64::from(line),
            inlined: false,
        };
        let groups = vec![
            StackGroup {
                frames: vec![frame("f;g", 3), frame("main", 9)].into(),
                bytes: 10,
                count: 1,
                processes: vec![0],
                thread: None,
            },
            StackGroup {
                frames: Vec::new().into(),
                bytes: 4,
                count: 1,
                processes: vec![0],
                thread: None,
            },
            StackGroup {
                // Another module, same labels: one line.
                frames: vec![
                    SymFrame {
                        module: "/bin/b".into(),
                        ..frame("f;g", 3)
                    },
                    frame("main", 9),
                ]
                .into(),
                bytes: 5,
                count: 1,
                processes: vec![1],
                thread: None,
            },
        ];
        let lines = folded(&[DeviceStacks { device: 0, groups }]);
        assert_eq!(
            lines,
            [
                "device 0;[no stack recorded] 4",
                "device 0;main (a.c:9);f,g (a.c:3) 15",
            ]
        );
        let picture = String::from_utf8(svg(&lines, "t", "s", "none").unwrap()).unwrap();
        assert!(picture.contains("main (a.c:9)"));
        let empty = String::from_utf8(svg(&[], "t<", "s", "nothing").unwrap()).unwrap();
        assert!(empty.contains("<title>t&lt;</title>") && empty.contains("nothing"));
    }

    #[test]
    fn flamegraph_folded_lines_of_groups_split_by_thread() {
        use crate::analysis::groups::tree;
        let frame = |name: &str| SymFrame {
            function: Some(name.into()),
            file: Some("/src/a.c".into()),
            line: Some(1),
            module: "/bin/a".into(),
            offset: 0,
            inlined: false,
        };
        let thread = |tid: u32, name: Option<&str>| GroupThread {
            process: 0,
            pid: 7,
            tid,
            name: name.map(str::to_string),
        };
        let group = |bytes: u64, t: GroupThread| StackGroup {
            frames: vec![frame("f"), frame("main")].into(),
            bytes,
            count: 1,
            processes: vec![0],
            thread: Some(t),
        };
        let groups = vec![
            group(8, thread(12, Some("loader;0"))),
            group(4, thread(11, None)),
            group(2, thread(12, Some("loader;0"))),
        ];
        assert_eq!(
            folded(&[DeviceStacks {
                device: 1,
                groups: groups.clone(),
            }]),
            [
                "device 1;thread [unnamed] (11);main (a.c:1);f (a.c:1) 4",
                "device 1;thread loader,0 (12);main (a.c:1);f (a.c:1) 10",
            ]
        );
        // The tree: a node per thread at the top, largest first, the stacks below.
        let root = tree(&groups);
        assert_eq!(root.bytes, 14);
        let top: Vec<(Option<u32>, u64)> = root
            .children
            .iter()
            .map(|c| (c.thread.as_ref().map(|t| t.tid), c.bytes))
            .collect();
        assert_eq!(top, [(Some(12), 10), (Some(11), 4)]);
        assert!(root.children.iter().all(|c| c.frame.is_none()));
        let below = &root.children[0].children;
        assert_eq!(below.len(), 1);
        assert_eq!(
            below[0].frame.as_deref().map(SymFrame::label).as_deref(),
            Some("main (a.c:1)")
        );
        assert!(below[0].thread.is_none());
        assert_eq!(
            root.children[1]
                .thread
                .as_ref()
                .map(|thread| thread.label())
                .as_deref(),
            Some("thread [unnamed] (tid 11, pid 7)")
        );
    }
}
