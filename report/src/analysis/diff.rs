//! Comparing two recordings stack by stack. Stack ids and addresses differ between processes
//! (and binaries between builds), so stacks are matched by their symbolised labels; groups
//! split by thread are matched by thread name and labels (thread ids differ between runs).

use std::cmp::Reverse;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use rustc_hash::FxHashMap;

use super::groups::{StackGroup, UNNAMED_THREAD};
use crate::symbols::SymFrame;

/// What one recording says per stack.
pub struct Side<'a> {
    /// Live at each selected device's peak, grouped by stack.
    pub peak: &'a [StackGroup],
    /// Allocated over the whole run, grouped by stack.
    pub allocated: &'a [StackGroup],
}

/// Bytes and allocation count of one stack on one side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Amount {
    pub bytes: u64,
    pub count: u64,
}

/// One stack in both recordings; index 0 is A, 1 is B. A stack found in one recording only
/// has zeros on the other side.
#[derive(Clone, Debug)]
pub struct StackDiff {
    /// The thread's name when groups are split by thread ([`UNNAMED_THREAD`] for a thread
    /// without one).
    pub thread: Option<String>,
    /// Frame labels, innermost first; empty when no stack was recorded.
    pub labels: Vec<String>,
    /// The frames themselves (from A where A has the stack).
    pub frames: Rc<[SymFrame]>,
    pub peak: [Amount; 2],
    pub allocated: [Amount; 2],
}

impl StackDiff {
    /// B minus A at the peak.
    pub fn peak_change(&self) -> i128 {
        i128::from(self.peak[1].bytes) - i128::from(self.peak[0].bytes)
    }

    /// B minus A over the run.
    pub fn allocated_change(&self) -> i128 {
        i128::from(self.allocated[1].bytes) - i128::from(self.allocated[0].bytes)
    }
}

/// Matches the stacks of `a` and `b` by label (and thread name) and sorts growth first: by
/// peak change, then allocated change, both descending.
pub fn diff(a: &Side<'_>, b: &Side<'_>) -> Vec<StackDiff> {
    // Rows by the hash of (thread, labels), compared in full on a hash match: keeping the
    // keys would copy every row's labels.
    let mut by_hash: FxHashMap<u64, Vec<usize>> = FxHashMap::default();
    let mut rows: Vec<StackDiff> = Vec::new();
    let sides = [a, b];
    for (side, input) in sides.iter().enumerate() {
        for (peak, groups) in [(true, input.peak), (false, input.allocated)] {
            for group in groups {
                let labels: Vec<String> = group.frames.iter().map(SymFrame::label).collect();
                let thread = group
                    .thread
                    .as_ref()
                    .map(|t| t.name.clone().unwrap_or_else(|| UNNAMED_THREAD.to_string()));
                let mut hasher = rustc_hash::FxHasher::default();
                (&thread, &labels).hash(&mut hasher);
                let candidates = by_hash.entry(hasher.finish()).or_default();
                let found = candidates
                    .iter()
                    .copied()
                    .find(|&index| rows[index].thread == thread && rows[index].labels == labels);
                let index = match found {
                    Some(index) => index,
                    None => {
                        rows.push(StackDiff {
                            thread,
                            labels,
                            frames: group.frames.clone(),
                            peak: [Amount::default(); 2],
                            allocated: [Amount::default(); 2],
                        });
                        candidates.push(rows.len() - 1);
                        rows.len() - 1
                    }
                };
                // Frames differing only where labels do not look (offsets, module paths)
                // land in one row.
                let amount = if peak {
                    &mut rows[index].peak[side]
                } else {
                    &mut rows[index].allocated[side]
                };
                amount.bytes = amount.bytes.saturating_add(group.bytes);
                amount.count += group.count;
            }
        }
    }
    rows.sort_by(|x, y| {
        Reverse(x.peak_change())
            .cmp(&Reverse(y.peak_change()))
            .then(Reverse(x.allocated_change()).cmp(&Reverse(y.allocated_change())))
            .then_with(|| x.labels.cmp(&y.labels))
            .then_with(|| x.thread.cmp(&y.thread))
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, offset: u64) -> SymFrame {
        SymFrame {
            function: Some(name.into()),
            file: Some(format!("/src/{name}.c").into()),
            line: Some(3),
            module: "/bin/a".into(),
            offset,
            inlined: false,
        }
    }

    fn group(names: &[&str], offset: u64, bytes: u64) -> StackGroup {
        StackGroup {
            frames: names.iter().map(|n| frame(n, offset)).collect(),
            bytes,
            count: 1,
            processes: vec![0],
            thread: None,
        }
    }

    #[test]
    fn diff_matches_by_label_and_sorts_growth_first() {
        let a_peak = [group(&["f", "main"], 1, 100), group(&["g", "main"], 1, 50)];
        let a_alloc = [group(&["f", "main"], 1, 300)];
        // Other offsets (another build): same labels, so the same stacks.
        let b_peak = [
            group(&["f", "main"], 9, 100),
            group(&["g", "main"], 9, 10),
            group(&["h", "main"], 9, 70),
            group(&[], 0, 5),
        ];
        let b_alloc = [group(&["f", "main"], 9, 400), group(&["h", "main"], 9, 70)];
        let rows = diff(
            &Side {
                peak: &a_peak,
                allocated: &a_alloc,
            },
            &Side {
                peak: &b_peak,
                allocated: &b_alloc,
            },
        );
        let order: Vec<(String, i128, i128)> = rows
            .iter()
            .map(|r| {
                (
                    r.labels.first().cloned().unwrap_or_default(),
                    r.peak_change(),
                    r.allocated_change(),
                )
            })
            .collect();
        assert_eq!(
            order,
            vec![
                ("h (h.c:3)".to_string(), 70, 70),
                (String::new(), 5, 0),
                ("f (f.c:3)".to_string(), 0, 100),
                ("g (g.c:3)".to_string(), -40, 0),
            ]
        );
        assert_eq!(rows[0].peak[0], Amount::default());
        assert_eq!(rows[2].allocated[1].bytes, 400);
    }
}
