//! Comparing two recordings stack by stack. Stack ids and addresses differ between processes
//! (and binaries between builds), so stacks are matched by their symbolised labels; groups
//! split by thread are matched by thread name and labels (thread ids differ between runs).
//!
//! A log can hold millions of distinct stacks whose frames are nearly all distinct labels
//! (unsymbolised addresses), so rows keep no labels: a row is keyed by a 128-bit hash of its
//! thread name and labels and points back to one stack of a replay ([`Diff::keep_stacks`]);
//! labels are made again from it when rows are sorted and written.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::rc::Rc;

use rustc_hash::{FxHashMap, FxHasher};

use super::groups::{GroupThread, IdKey, IdTotals, Stacks, group_hash, same_places};
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

/// Where a row's frames are found again.
#[derive(Clone, Copy)]
enum Source {
    /// Stack `stack` of process `process` of the replay of side `side` (0 = A, 1 = B).
    Stack { side: u8, process: u32, stack: u32 },
    /// `Diff::frames[index]`: the frames were given to `Diff::add` (unit tests).
    #[cfg(test)]
    Frames(u32),
}

/// One row as stored: no labels (see the module's comment).
struct Row {
    /// Interned thread name, or [`NO_THREAD`].
    thread: u32,
    /// The second half of the key's hash (the first half finds the chain).
    check: u64,
    /// The next row of the same first half, or [`END`].
    next: u32,
    source: Source,
    peak: [Amount; 2],
    allocated: [Amount; 2],
}

/// A stack group of one side whose frames have the same places but may have other labels
/// (see [`ambiguous`]): found again by its places, labelled by its first stack.
struct PlaceGroup {
    thread: Option<(u32, u32)>,
    frames: Rc<[SymFrame]>,
    /// The group's first stack (process, id).
    first: (u32, u32),
}

/// The stack tables of one side's replay, kept to make rows' labels again.
struct SideStacks {
    processes: Vec<Process>,
    stacks: RefCell<Stacks>,
}

/// Two recordings' amounts per stack, matched by (thread name, frame labels). Index 0 of
/// the amounts is A, 1 is B.
#[derive(Default)]
pub struct Diff {
    threads: Vec<Box<str>>,
    thread_index: FxHashMap<Box<str>, u32>,
    rows: Vec<Row>,
    /// The first row of each first half of a key hash.
    heads: FxHashMap<u64, u32>,
    /// Frames of rows added by `Diff::add`.
    #[cfg(test)]
    frames: Vec<Rc<[SymFrame]>>,
    /// Per side, the replay its rows' labels are made from.
    sides: [Option<SideStacks>; 2],
    /// The row order once sorted.
    order: Vec<u32>,
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

/// The 128-bit hash of a row's key, as two independent 64-bit hashes: (thread name, labels).
fn key_hash(thread: Option<&str>, frames: &[SymFrame]) -> (u64, u64) {
    let mut fx = FxHasher::default();
    let mut sip = DefaultHasher::new();
    thread.hash(&mut fx);
    thread.hash(&mut sip);
    frames.len().hash(&mut fx);
    frames.len().hash(&mut sip);
    for frame in frames {
        let label = frame.label();
        label.hash(&mut fx);
        label.hash(&mut sip);
    }
    (fx.finish(), sip.finish())
}

impl Diff {
    /// An empty comparison.
    pub fn new() -> Diff {
        Diff::default()
    }

    /// Adds one side's totals per (process, stack id[, thread]), given in parts (summed: an id
    /// can be in several; each part is dropped once read), as [`by_stack_totals`] would group
    /// them (by thread and places of the frames, each group labelled by the frames of its
    /// first id). Rows point back to the stacks of `processes` (B's are preferred); keep them
    /// with [`Diff::keep_stacks`] before sorting.
    ///
    /// [`by_stack_totals`]: super::groups::by_stack_totals
    pub fn add_side(
        &mut self,
        side: usize,
        measure: Measure,
        totals: impl IntoIterator<Item = IdTotals>,
        stacks: &mut Stacks,
        processes: &[Process],
    ) {
        // Ids in the table's order (no copy of millions of them), but those with ambiguous
        // frames in id order: a place group is labelled by its first id.
        let mut ambiguous_ids = Vec::new();
        for part in totals {
            for (&id, &(bytes, count)) in &part {
                let frames = stacks.frames(processes, id.process, id.stack);
                if frames.iter().any(ambiguous) {
                    ambiguous_ids.push((id, bytes, count));
                    continue;
                }
                self.add_stack(
                    side,
                    measure,
                    id,
                    frames,
                    processes,
                    Amount { bytes, count },
                );
            }
        }
        ambiguous_ids.sort_unstable_by_key(|(id, _, _)| *id);
        let mut place_groups: FxHashMap<u64, Vec<PlaceGroup>> = FxHashMap::default();
        for (mut id, bytes, count) in ambiguous_ids {
            let mut frames = stacks.frames(processes, id.process, id.stack);
            let thread = id.thread.map(|tid| (id.process, tid));
            let candidates = place_groups.entry(group_hash(thread, &frames)).or_default();
            match candidates
                .iter()
                .find(|g| g.thread == thread && same_places(&g.frames, &frames))
            {
                Some(group) => {
                    frames = group.frames.clone();
                    (id.process, id.stack) = group.first;
                }
                None => candidates.push(PlaceGroup {
                    thread,
                    frames: frames.clone(),
                    first: (id.process, id.stack),
                }),
            }
            self.add_stack(
                side,
                measure,
                id,
                frames,
                processes,
                Amount { bytes, count },
            );
        }
    }

    /// Adds `amount` to the row of stack `id.stack` of process `id.process` on `side`, whose
    /// frames are `frames`.
    fn add_stack(
        &mut self,
        side: usize,
        measure: Measure,
        id: IdKey,
        frames: Rc<[SymFrame]>,
        processes: &[Process],
        amount: Amount,
    ) {
        let thread_name = id.thread.map(|tid| {
            GroupThread::of(processes, id.process, tid)
                .name_or_unnamed()
                .to_string()
        });
        let source = Source::Stack {
            side: side as u8,
            process: id.process,
            stack: id.stack,
        };
        self.add_row(
            side,
            measure,
            thread_name.as_deref(),
            &frames,
            source,
            amount,
        );
    }

    /// Adds `amount` to the row of (`thread`, labels of `frames`) on `side` (0 or 1),
    /// keeping `frames` for the row's labels when it is new.
    #[cfg(test)]
    pub fn add(
        &mut self,
        side: usize,
        measure: Measure,
        thread: Option<&str>,
        frames: &[SymFrame],
        amount: Amount,
    ) {
        let source = Source::Frames(self.frames.len() as u32);
        let at = self.add_row(side, measure, thread, frames, source, amount);
        if matches!(self.rows[at as usize].source, Source::Frames(i) if i as usize == self.frames.len())
        {
            self.frames.push(frames.into());
        }
    }

    /// Adds `amount` to the row of (`thread`, labels of `frames`), made with `source` when
    /// new (or when it is B's and the row's is A's); returns the row's index.
    fn add_row(
        &mut self,
        side: usize,
        measure: Measure,
        thread: Option<&str>,
        frames: &[SymFrame],
        source: Source,
        amount: Amount,
    ) -> u32 {
        let (hash, check) = key_hash(thread, frames);
        let thread = match thread {
            Some(name) => intern(&mut self.threads, &mut self.thread_index, name),
            None => NO_THREAD,
        };
        let mut at = self.heads.get(&hash).copied().unwrap_or(END);
        while at != END {
            let row = &self.rows[at as usize];
            if row.thread == thread && row.check == check {
                break;
            }
            at = row.next;
        }
        if at == END {
            at = self.rows.len() as u32;
            self.rows.push(Row {
                thread,
                check,
                next: self.heads.insert(hash, at).unwrap_or(END),
                source,
                peak: [Amount::default(); 2],
                allocated: [Amount::default(); 2],
            });
        }
        let row = &mut self.rows[at as usize];
        if let (Source::Stack { side: 0, .. }, Source::Stack { side: 1, .. }) = (row.source, source)
        {
            row.source = source;
        }
        let sum = match measure {
            Measure::Peak => &mut row.peak[side],
            Measure::Allocated => &mut row.allocated[side],
        };
        sum.bytes = sum.bytes.saturating_add(amount.bytes);
        sum.count += amount.count;
        at
    }

    /// Whether some row's labels are made from `side`'s replay (which must then be kept).
    pub fn needs_stacks(&self, side: usize) -> bool {
        self.rows
            .iter()
            .any(|row| matches!(row.source, Source::Stack { side: s, .. } if s as usize == side))
    }

    /// Keeps `side`'s replay (`processes` with their stack tables, as [`Diff::add_side`] was
    /// given them, or read again from the same logs) to make its rows' labels from.
    pub fn keep_stacks(&mut self, side: usize, processes: Vec<Process>, stacks: Stacks) {
        self.sides[side] = Some(SideStacks {
            processes,
            stacks: RefCell::new(stacks),
        });
    }

    /// The processes kept for `side` by [`Diff::keep_stacks`].
    pub fn kept_processes(&self, side: usize) -> Option<&[Process]> {
        self.sides[side].as_ref().map(|s| s.processes.as_slice())
    }

    /// The frames of a row, innermost first; none when its side's replay was not kept.
    fn frames_of(&self, row: &Row) -> Rc<[SymFrame]> {
        match row.source {
            #[cfg(test)]
            Source::Frames(index) => self.frames[index as usize].clone(),
            Source::Stack {
                side,
                process,
                stack,
            } => match &self.sides[side as usize] {
                Some(kept) => kept
                    .stacks
                    .borrow_mut()
                    .frames(&kept.processes, process, stack),
                None => Rc::from(Vec::new()),
            },
        }
    }

    fn thread_name(&self, row: &Row) -> Option<&str> {
        (row.thread != NO_THREAD).then(|| &*self.threads[row.thread as usize])
    }

    /// Sorts the rows growth first: by peak change, then allocated change, both descending,
    /// then by labels and thread name. Labels are made only for rows whose changes tie.
    pub fn sort(&mut self) {
        self.heads = FxHashMap::default();
        let mut order: Vec<u32> = (0..self.rows.len() as u32).collect();
        order.sort_unstable_by_key(|&index| {
            let row = &self.rows[index as usize];
            (Reverse(change(row.peak)), Reverse(change(row.allocated)))
        });
        let same_changes = |x: u32, y: u32| {
            let (x, y) = (&self.rows[x as usize], &self.rows[y as usize]);
            change(x.peak) == change(y.peak) && change(x.allocated) == change(y.allocated)
        };
        let mut start = 0;
        while start < order.len() {
            let mut end = start + 1;
            while end < order.len() && same_changes(order[start], order[end]) {
                end += 1;
            }
            if end - start > 1 {
                self.sort_by_labels(&mut order[start..end]);
            }
            start = end;
        }
        self.order = order;
    }

    /// Sorts `run` (rows of equal changes) by labels, then thread name: by the first label,
    /// then rows of equal first labels by the second, and so on, so that only one label per
    /// row is held at a time.
    fn sort_by_labels(&self, run: &mut [u32]) {
        // (start, end, label index) of the parts of `run` still to sort.
        let mut pending = vec![(0, run.len(), 0usize)];
        let mut keyed: Vec<(Option<Box<str>>, u32)> = Vec::new();
        while let Some((start, end, level)) = pending.pop() {
            keyed.clear();
            keyed.extend(run[start..end].iter().map(|&index| {
                let frames = self.frames_of(&self.rows[index as usize]);
                (frames.get(level).map(|f| f.label().into_boxed_str()), index)
            }));
            // A stack that ends sorts before the longer ones (None < Some).
            keyed.sort_unstable_by(|x, y| x.0.cmp(&y.0));
            let mut at = 0;
            while at < keyed.len() {
                let mut to = at + 1;
                while to < keyed.len() && keyed[to].0 == keyed[at].0 {
                    to += 1;
                }
                if to - at > 1 {
                    if keyed[at].0.is_some() {
                        pending.push((start + at, start + to, level + 1));
                    } else {
                        // The same labels: rows of other threads.
                        keyed[at..to].sort_by(|x, y| {
                            self.thread_name(&self.rows[x.1 as usize])
                                .cmp(&self.thread_name(&self.rows[y.1 as usize]))
                        });
                    }
                }
                at = to;
            }
            for (slot, (_, index)) in run[start..end].iter_mut().zip(&keyed) {
                *slot = *index;
            }
        }
    }

    fn row(&self, index: u32) -> StackDiff<'_> {
        let row = &self.rows[index as usize];
        StackDiff {
            thread: self.thread_name(row),
            labels: Labels {
                frames: self.frames_of(row),
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

/// B minus A.
fn change(amounts: [Amount; 2]) -> i128 {
    i128::from(amounts[1].bytes) - i128::from(amounts[0].bytes)
}

/// The frame labels of a row, innermost first; empty when no stack was recorded.
#[derive(Clone)]
pub struct Labels {
    frames: Rc<[SymFrame]>,
}

impl Labels {
    /// The labels, innermost first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = String> + Clone + '_ {
        self.frames.iter().map(SymFrame::label)
    }

    /// The frames, innermost first.
    pub fn frames(&self) -> &[SymFrame] {
        &self.frames
    }
}

impl serde_core::Serialize for Labels {
    fn serialize<S: serde_core::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

/// One stack in both recordings; index 0 is A, 1 is B. A stack found in one recording only
/// has zeros on the other side.
#[derive(Clone)]
pub struct StackDiff<'a> {
    /// The thread's name when groups are split by thread ([`UNNAMED_THREAD`] for a thread
    /// without one).
    ///
    /// [`UNNAMED_THREAD`]: super::groups::UNNAMED_THREAD
    pub thread: Option<&'a str>,
    pub labels: Labels,
    pub peak: [Amount; 2],
    pub allocated: [Amount; 2],
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
                    change(r.peak),
                    change(r.allocated),
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
        let keys: Vec<(Vec<String>, Option<&str>)> = diff
            .rows()
            .map(|r| (r.labels.iter().collect(), r.thread))
            .collect();
        assert_eq!(
            keys,
            vec![
                (
                    vec!["a (a.c:3)".to_string(), "z (z.c:3)".to_string()],
                    Some("main")
                ),
                (vec!["a (a.c:3)".to_string()], Some("main")),
                (vec!["b (b.c:3)".to_string()], Some("main")),
                (vec!["b (b.c:3)".to_string()], Some("worker")),
            ]
        );
    }
}
