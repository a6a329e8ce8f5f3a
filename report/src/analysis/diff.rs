//! Comparing two recordings stack by stack. Stack ids and addresses differ between processes
//! (and binaries between builds), so stacks are matched by their symbolised labels; groups
//! split by thread are matched by thread name and labels (thread ids differ between runs).

use std::cmp::{Ordering, Reverse};
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use rustc_hash::FxHashMap;

use super::groups::{GroupThread, IdTotals, Stacks, group_hash, same_places};
use crate::replay::Process;
use crate::symbols::SymFrame;

/// Bytes and allocation count of one stack on one side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Amount {
    pub bytes: u64,
    pub count: u64,
}

/// What an amount measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Live at each selected device's peak.
    Peak,
    /// Allocated over the whole run.
    Allocated,
}

/// No thread (rows not split by thread), in [`Row::thread`].
const NO_THREAD: u32 = u32::MAX;
/// End of a hash chain, in [`Row::next`].
const END: u32 = u32::MAX;

/// One row as stored: its key is interned (a log can have millions of rows, each of a few
/// dozen frames out of a few thousand distinct labels).
struct Row {
    /// Interned thread name, or [`NO_THREAD`].
    thread: u32,
    /// The row's label ids: `Diff::label_ids[labels_start..labels_start + labels_len]`.
    labels_start: usize,
    labels_len: u32,
    /// The next row of the same key hash, or [`END`].
    next: u32,
    peak: [Amount; 2],
    allocated: [Amount; 2],
}

/// A stack group of one side whose frames have the same places but may have other labels
/// (see [`ambiguous`]): found again by its places, labelled by its first stack.
struct PlaceGroup {
    thread: Option<(u32, u32)>,
    frames: Rc<[SymFrame]>,
}

/// Two recordings' amounts per stack, matched by (thread name, frame labels). Index 0 of
/// the amounts is A, 1 is B.
#[derive(Default)]
pub struct Diff {
    labels: Vec<Box<str>>,
    label_index: FxHashMap<Box<str>, u32>,
    threads: Vec<Box<str>>,
    thread_index: FxHashMap<Box<str>, u32>,
    /// Every row's label ids, one after the other.
    label_ids: Vec<u32>,
    rows: Vec<Row>,
    /// The first row of each key hash.
    heads: FxHashMap<u64, u32>,
    /// The row order once sorted.
    order: Vec<u32>,
    scratch: Vec<u32>,
}

/// Whether two frames of the same place (as stacks are grouped on one side) can have other
/// labels: a frame with a line but no function is placed by its file and line, labelled by
/// its module and offset.
fn ambiguous(frame: &SymFrame) -> bool {
    frame.function.is_none() && frame.line.is_some()
}

fn intern(names: &mut Vec<Box<str>>, index: &mut FxHashMap<Box<str>, u32>, name: &str) -> u32 {
    if let Some(&id) = index.get(name) {
        return id;
    }
    let id = names.len() as u32;
    names.push(name.into());
    index.insert(name.into(), id);
    id
}

impl Diff {
    /// An empty comparison.
    pub fn new() -> Diff {
        Diff::default()
    }

    /// Adds one side's totals per (process, stack id[, thread]) as [`by_stack_totals`] would
    /// group them (by thread and places of the frames, each group labelled by the frames of
    /// its first id), without keeping any group's frames: where the places of a stack
    /// determine its labels (nearly always), the labels are the key straight away.
    ///
    /// [`by_stack_totals`]: super::groups::by_stack_totals
    pub fn add_side(
        &mut self,
        side: usize,
        measure: Measure,
        totals: &IdTotals,
        stacks: &mut Stacks,
        processes: &[Process],
    ) {
        let mut ids: Vec<_> = totals.iter().map(|(id, totals)| (*id, *totals)).collect();
        ids.sort_unstable_by_key(|(id, _)| *id);
        let mut place_groups: FxHashMap<u64, Vec<PlaceGroup>> = FxHashMap::default();
        for (id, (bytes, count)) in ids {
            let mut frames = stacks.frames(processes, id.process, id.stack);
            let thread = id.thread.map(|tid| (id.process, tid));
            if frames.iter().any(ambiguous) {
                let candidates = place_groups.entry(group_hash(thread, &frames)).or_default();
                match candidates
                    .iter()
                    .find(|g| g.thread == thread && same_places(&g.frames, &frames))
                {
                    Some(group) => frames = group.frames.clone(),
                    None => candidates.push(PlaceGroup {
                        thread,
                        frames: frames.clone(),
                    }),
                }
            }
            let thread_name = thread
                .map(|(process, tid)| GroupThread::of(processes, process, tid))
                .map(|t| t.name_or_unnamed().to_string());
            self.add(
                side,
                measure,
                thread_name.as_deref(),
                &frames,
                Amount { bytes, count },
            );
        }
    }

    /// Adds `amount` to the row of (`thread`, labels of `frames`) on `side` (0 or 1).
    pub fn add(
        &mut self,
        side: usize,
        measure: Measure,
        thread: Option<&str>,
        frames: &[SymFrame],
        amount: Amount,
    ) {
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        for frame in frames {
            key.push(intern(
                &mut self.labels,
                &mut self.label_index,
                &frame.label(),
            ));
        }
        let thread = match thread {
            Some(name) => intern(&mut self.threads, &mut self.thread_index, name),
            None => NO_THREAD,
        };
        let mut hasher = rustc_hash::FxHasher::default();
        (thread, &key).hash(&mut hasher);
        let hash = hasher.finish();
        let mut at = self.heads.get(&hash).copied().unwrap_or(END);
        while at != END {
            let row = &self.rows[at as usize];
            if row.thread == thread && self.row_labels(row) == key.as_slice() {
                break;
            }
            at = row.next;
        }
        if at == END {
            at = self.rows.len() as u32;
            self.rows.push(Row {
                thread,
                labels_start: self.label_ids.len(),
                labels_len: key.len() as u32,
                next: self.heads.insert(hash, at).unwrap_or(END),
                peak: [Amount::default(); 2],
                allocated: [Amount::default(); 2],
            });
            self.label_ids.extend_from_slice(&key);
        }
        let row = &mut self.rows[at as usize];
        let sum = match measure {
            Measure::Peak => &mut row.peak[side],
            Measure::Allocated => &mut row.allocated[side],
        };
        sum.bytes = sum.bytes.saturating_add(amount.bytes);
        sum.count += amount.count;
        self.scratch = key;
    }

    fn row_labels(&self, row: &Row) -> &[u32] {
        &self.label_ids[row.labels_start..row.labels_start + row.labels_len as usize]
    }

    /// Sorts the rows growth first: by peak change, then allocated change, both descending,
    /// then by labels and thread name.
    pub fn sort(&mut self) {
        self.heads = FxHashMap::default();
        self.scratch = Vec::new();
        let mut order: Vec<u32> = (0..self.rows.len() as u32).collect();
        order.sort_by(|&x, &y| {
            let (x, y) = (self.row(x), self.row(y));
            Reverse(x.peak_change())
                .cmp(&Reverse(y.peak_change()))
                .then(Reverse(x.allocated_change()).cmp(&Reverse(y.allocated_change())))
                .then_with(|| x.labels.cmp(y.labels))
                .then_with(|| x.thread.cmp(&y.thread))
        });
        self.order = order;
    }

    fn row(&self, index: u32) -> StackDiff<'_> {
        let row = &self.rows[index as usize];
        StackDiff {
            thread: (row.thread != NO_THREAD).then(|| &*self.threads[row.thread as usize]),
            labels: Labels {
                ids: self.row_labels(row),
                names: &self.labels,
            },
            peak: row.peak,
            allocated: row.allocated,
        }
    }

    /// How many rows (stacks) there are.
    pub fn row_count(&self) -> usize {
        self.rows.len()
    }

    /// The rows in the order [`Diff::sort`] put them in.
    pub fn rows(&self) -> impl Iterator<Item = StackDiff<'_>> + Clone {
        self.order.iter().map(|&index| self.row(index))
    }
}

/// The frame labels of a row, innermost first; empty when no stack was recorded.
#[derive(Clone, Copy)]
pub struct Labels<'a> {
    ids: &'a [u32],
    names: &'a [Box<str>],
}

impl<'a> Labels<'a> {
    /// The labels, innermost first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &'a str> + Clone + use<'a> {
        let names = self.names;
        self.ids.iter().map(move |&id| &*names[id as usize])
    }

    /// Whether no stack was recorded.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Compares as the label strings do (lexicographically).
    pub fn cmp(&self, other: Labels<'_>) -> Ordering {
        self.iter().cmp(other.iter())
    }
}

impl serde_core::Serialize for Labels<'_> {
    fn serialize<S: serde_core::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

/// One stack in both recordings; index 0 is A, 1 is B. A stack found in one recording only
/// has zeros on the other side.
#[derive(Clone, Copy)]
pub struct StackDiff<'a> {
    /// The thread's name when groups are split by thread ([`UNNAMED_THREAD`] for a thread
    /// without one).
    ///
    /// [`UNNAMED_THREAD`]: super::groups::UNNAMED_THREAD
    pub thread: Option<&'a str>,
    pub labels: Labels<'a>,
    pub peak: [Amount; 2],
    pub allocated: [Amount; 2],
}

impl StackDiff<'_> {
    /// B minus A at the peak.
    pub fn peak_change(&self) -> i128 {
        i128::from(self.peak[1].bytes) - i128::from(self.peak[0].bytes)
    }

    /// B minus A over the run.
    pub fn allocated_change(&self) -> i128 {
        i128::from(self.allocated[1].bytes) - i128::from(self.allocated[0].bytes)
    }
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

    fn add(
        diff: &mut Diff,
        side: usize,
        measure: Measure,
        names: &[&str],
        offset: u64,
        bytes: u64,
    ) {
        let frames: Vec<SymFrame> = names.iter().map(|n| frame(n, offset)).collect();
        diff.add(side, measure, None, &frames, Amount { bytes, count: 1 });
    }

    #[test]
    fn diff_matches_by_label_and_sorts_growth_first() {
        let mut diff = Diff::new();
        add(&mut diff, 0, Measure::Peak, &["f", "main"], 1, 100);
        add(&mut diff, 0, Measure::Peak, &["g", "main"], 1, 50);
        add(&mut diff, 0, Measure::Allocated, &["f", "main"], 1, 300);
        // Other offsets (another build): same labels, so the same stacks.
        add(&mut diff, 1, Measure::Peak, &["f", "main"], 9, 100);
        add(&mut diff, 1, Measure::Peak, &["g", "main"], 9, 10);
        add(&mut diff, 1, Measure::Peak, &["h", "main"], 9, 70);
        add(&mut diff, 1, Measure::Peak, &[], 0, 5);
        add(&mut diff, 1, Measure::Allocated, &["f", "main"], 9, 400);
        add(&mut diff, 1, Measure::Allocated, &["h", "main"], 9, 70);
        diff.sort();
        let rows: Vec<StackDiff<'_>> = diff.rows().collect();
        let order: Vec<(String, i128, i128)> = rows
            .iter()
            .map(|r| {
                (
                    r.labels.iter().next().unwrap_or_default().to_string(),
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
        assert_eq!(
            rows[2].peak[0],
            Amount {
                bytes: 100,
                count: 1
            }
        );
        assert_eq!(diff.row_count(), 4);
    }

    #[test]
    fn diff_ties_sort_by_labels_then_thread() {
        let mut diff = Diff::new();
        let frames =
            |names: &[&str]| -> Vec<SymFrame> { names.iter().map(|n| frame(n, 1)).collect() };
        let one = Amount { bytes: 8, count: 1 };
        diff.add(0, Measure::Peak, Some("worker"), &frames(&["b"]), one);
        diff.add(0, Measure::Peak, Some("main"), &frames(&["b"]), one);
        diff.add(0, Measure::Peak, Some("main"), &frames(&["a", "z"]), one);
        diff.add(1, Measure::Peak, Some("main"), &frames(&["a", "z"]), one);
        diff.add(0, Measure::Peak, Some("main"), &frames(&["a"]), one);
        diff.sort();
        let keys: Vec<(Vec<&str>, Option<&str>)> = diff
            .rows()
            .map(|r| (r.labels.iter().collect(), r.thread))
            .collect();
        assert_eq!(
            keys,
            vec![
                (vec!["a (a.c:3)", "z (z.c:3)"], Some("main")),
                (vec!["a (a.c:3)"], Some("main")),
                (vec!["b (b.c:3)"], Some("main")),
                (vec!["b (b.c:3)"], Some("worker")),
            ]
        );
    }
}
