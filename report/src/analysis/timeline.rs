//! Live bytes over time per device, in bounded memory: time is cut into at most
//! [`MAX_BUCKETS`] buckets of equal width, and when the replay runs past the span they cover,
//! the width doubles and neighbouring buckets merge. The peak and the failed allocations are
//! kept exactly, apart from the buckets, so drawing them never depends on the resolution.
//!
//! Split by thread (`--by-thread`), each device also gets a series per allocating thread:
//! the live bytes of the allocations that thread made, whichever thread frees them. At most
//! a set number of threads per device get a series, those with the highest peak; the rest
//! are summed into one "other threads" series. The peak of every thread is kept (a few words
//! per thread); the series are chosen from them. When a device has more allocating threads
//! than series, the choice is known only at the end, so a second replay draws the series
//! ([`Timeline::second_pass`]).

use rustc_hash::{FxHashMap, FxHashSet};

use crate::replay::{Effect, Live, Observer, Process, SegmentChange, State, Step};

/// Buckets per device at most; a long log costs the same memory as a short one.
pub const MAX_BUCKETS: usize = 2048;
/// Failed allocations kept per device; later ones are only counted.
pub const MAX_FAILURES: usize = 1000;
/// Thread series per device, by default, when split by thread.
pub const DEFAULT_THREAD_SERIES: usize = 16;

/// Live bytes within one bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveRange {
    /// Highest live bytes in the bucket, including the level it started at.
    pub max: u64,
    /// Live bytes at the end of the bucket.
    pub last: u64,
}

/// One slice of time of one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// None when live bytes did not change in the bucket (the previous level holds).
    pub live: Option<LiveRange>,
    /// Tensor view: what the driver had handed out (PyTorch's segments in place of its
    /// tensors), likewise.
    pub reserved: Option<LiveRange>,
    /// Highest device used memory (total - free) sampled in the bucket.
    pub used: Option<u64>,
}

/// Two neighbouring buckets' live bytes as one.
fn merge_live(earlier: Option<LiveRange>, later: Option<LiveRange>) -> Option<LiveRange> {
    match (earlier, later) {
        (Some(a), Some(b)) => Some(LiveRange {
            max: a.max.max(b.max),
            last: b.last,
        }),
        (a, b) => b.or(a),
    }
}

/// Halves the resolution of `buckets`: each pair of neighbours becomes one.
fn coarsen<T: Copy + Default>(buckets: &mut Vec<T>, merge: impl Fn(T, T) -> T) {
    *buckets = buckets
        .chunks(2)
        .map(|pair| match pair {
            [a, b] => merge(*a, *b),
            [a] => *a,
            _ => T::default(),
        })
        .collect();
}

/// Records in a bucket's `live` that live bytes went from `before` to `after`.
fn record_level(live: &mut Option<LiveRange>, before: u64, after: u64) {
    *live = Some(match *live {
        Some(range) => LiveRange {
            max: range.max.max(after),
            last: after,
        },
        // The level the bucket started at counts too: a free right at its start must not
        // hide what was live just before.
        None => LiveRange {
            max: before.max(after),
            last: after,
        },
    });
}

impl Bucket {
    fn merge(self, later: Bucket) -> Bucket {
        let live = merge_live(self.live, later.live);
        let reserved = merge_live(self.reserved, later.reserved);
        let used = match (self.used, later.used) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Bucket {
            live,
            reserved,
            used,
        }
    }
}

/// Where and when a device's live bytes were highest (first reached).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeakPoint {
    pub bytes: u64,
    pub t_ns: u64,
}

/// A failed allocation, exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailurePoint {
    pub t_ns: u64,
    pub request: u64,
    /// The API called, by name.
    pub api: String,
    pub pid: u32,
}

/// A thread of one process: (index into the replay's processes, thread id).
pub type ThreadKey = (u32, u32);

/// Live bytes over time of the allocations one thread made on one device (or of several
/// threads summed), in the device's buckets.
#[derive(Clone, Debug, Default)]
pub struct ThreadTimeline {
    /// Bucket `i` covers what the device's bucket `i` covers; None when nothing changed.
    pub buckets: Vec<Option<LiveRange>>,
    /// None when nothing was ever allocated.
    pub peak: Option<PeakPoint>,
    /// Live bytes now.
    current: u64,
}

impl ThreadTimeline {
    /// Adds or removes `size` bytes at `t_ns` (bucket `index`).
    fn change(&mut self, index: usize, t_ns: u64, size: u64, add: bool) {
        let before = self.current;
        let after = if add {
            before.saturating_add(size)
        } else {
            before.saturating_sub(size)
        };
        self.current = after;
        if self.buckets.len() <= index {
            self.buckets.resize(index + 1, None);
        }
        record_level(&mut self.buckets[index], before, after);
        if self.peak.is_none_or(|p| after > p.bytes) {
            self.peak = Some(PeakPoint { bytes: after, t_ns });
        }
    }
}

/// The series of one thread on one device.
#[derive(Clone, Debug)]
pub struct ThreadSeries {
    pub thread: ThreadKey,
    pub series: ThreadTimeline,
}

/// The threads of a device beyond its thread series, summed into one series.
#[derive(Clone, Debug, Default)]
pub struct OtherThreads {
    /// How many threads were folded.
    pub threads: usize,
    pub series: ThreadTimeline,
}

/// What is kept of every allocating thread of a device, with or without a series: enough to
/// choose the series.
#[derive(Clone, Copy, Debug, Default)]
struct ThreadTally {
    current: u64,
    /// Highest live bytes, first reached (bytes 0: nothing live yet).
    peak: PeakPoint,
}

/// The time series of one device (pinned host memory is device -1).
#[derive(Clone, Debug, Default)]
pub struct DeviceTimeline {
    pub device: i32,
    /// Bucket `i` covers `[i * bucket_ns, (i + 1) * bucket_ns)` of replay time.
    pub buckets: Vec<Bucket>,
    /// None when nothing was ever allocated on the device.
    pub peak: Option<PeakPoint>,
    /// Tensor view: the highest reserved bytes; None unless PyTorch held segments on the
    /// device (then `buckets` carry the reserved series).
    pub reserved_peak: Option<PeakPoint>,
    /// Tensor view: whether PyTorch ever held a segment on the device.
    had_segments: bool,
    /// Reserved bytes now.
    reserved_current: u64,
    pub failures: Vec<FailurePoint>,
    /// Failures past [`MAX_FAILURES`].
    pub failures_omitted: u64,
    /// The device's total memory, from the last sample.
    pub total_bytes: Option<u64>,
    /// Live bytes now (summed over processes).
    current: u64,
    /// Split by thread: a series per allocating thread, highest peak first (after
    /// [`Timeline::finish`]).
    pub threads: Vec<ThreadSeries>,
    /// Split by thread: the threads without a series of their own, if any.
    pub other_threads: Option<OtherThreads>,
    /// Split by thread: every allocating thread.
    tallies: FxHashMap<ThreadKey, ThreadTally>,
    /// More allocating threads than series, with no choice made: the series were dropped
    /// and a second replay draws the chosen ones.
    overflowed: bool,
}

impl DeviceTimeline {
    /// Highest used memory sampled, if any.
    pub fn used_max(&self) -> Option<u64> {
        self.buckets.iter().filter_map(|b| b.used).max()
    }

    /// The device's allocating threads, highest peak first (earlier first among equal
    /// peaks, then by process and thread id).
    fn threads_by_peak(&self) -> Vec<ThreadKey> {
        let mut threads: Vec<(ThreadKey, PeakPoint)> = self
            .tallies
            .iter()
            .map(|(thread, tally)| (*thread, tally.peak))
            .collect();
        threads.sort_by(|(a, pa), (b, pb)| {
            pb.bytes
                .cmp(&pa.bytes)
                .then(pa.t_ns.cmp(&pb.t_ns))
                .then(a.cmp(b))
        });
        threads.into_iter().map(|(thread, _)| thread).collect()
    }
}

/// Per device, the threads that get a series of their own.
pub type ThreadChoice = FxHashMap<i32, FxHashSet<ThreadKey>>;

/// How series are split by thread.
#[derive(Clone, Debug)]
struct ByThread {
    /// Thread series per device at most.
    max_series: usize,
    /// The threads with a series, from an earlier replay; None: every thread, until a device
    /// has more than `max_series`.
    chosen: Option<ThreadChoice>,
}

/// Observer building the series of every device (or of one).
pub struct Timeline {
    device: Option<i32>,
    /// Width of a bucket in nanoseconds; a power of two.
    pub bucket_ns: u64,
    /// Sorted by report order of devices.
    pub devices: Vec<DeviceTimeline>,
    /// None: no thread series.
    by_thread: Option<ByThread>,
}

impl Timeline {
    /// A timeline of every device, or only of `device`.
    pub fn new(device: Option<i32>) -> Timeline {
        Timeline {
            device,
            bucket_ns: 1,
            devices: Vec::new(),
            by_thread: None,
        }
    }

    /// A timeline split by thread: besides each device's series, one per allocating thread
    /// (at most `max_series` per device, at least 1). `chosen`: the threads that get them,
    /// from [`Timeline::second_pass`]; None at the first replay.
    pub fn by_thread(
        device: Option<i32>,
        max_series: usize,
        chosen: Option<ThreadChoice>,
    ) -> Timeline {
        Timeline {
            by_thread: Some(ByThread {
                max_series: max_series.max(1),
                chosen,
            }),
            ..Timeline::new(device)
        }
    }

    /// Whether the series are split by thread.
    pub fn is_by_thread(&self) -> bool {
        self.by_thread.is_some()
    }

    /// Thread series per device at most, when split by thread.
    pub fn max_thread_series(&self) -> Option<usize> {
        self.by_thread.as_ref().map(|b| b.max_series)
    }

    /// After a first replay split by thread: when some device had more allocating threads
    /// than series, the threads that get them (per device, those with the highest peak), for
    /// a second replay with [`Timeline::by_thread`]. None when this replay's series are
    /// complete.
    pub fn second_pass(&self) -> Option<ThreadChoice> {
        let by_thread = self.by_thread.as_ref()?;
        if by_thread.chosen.is_some() || !self.devices.iter().any(|d| d.overflowed) {
            return None;
        }
        Some(
            self.devices
                .iter()
                .map(|d| {
                    let chosen = d.threads_by_peak().into_iter().take(by_thread.max_series);
                    (d.device, chosen.collect())
                })
                .collect(),
        )
    }

    /// Puts each device's thread series in order, highest peak first, and counts the threads
    /// folded into "other threads". Call once the replay is over.
    pub fn finish(&mut self) {
        self.drop_plain_reserved();
        for device in &mut self.devices {
            let order: FxHashMap<ThreadKey, usize> = device
                .threads_by_peak()
                .into_iter()
                .enumerate()
                .map(|(rank, thread)| (thread, rank))
                .collect();
            device
                .threads
                .sort_by_key(|t| order.get(&t.thread).copied().unwrap_or(usize::MAX));
            let folded = device.tallies.len().saturating_sub(device.threads.len());
            if let Some(other) = &mut device.other_threads {
                other.threads = folded;
            }
        }
    }

    /// The series of `device`, created on first use; None when the device is filtered out.
    fn series(&mut self, device: i32) -> Option<&mut DeviceTimeline> {
        if self.device.is_some_and(|d| d != device) {
            return None;
        }
        let index = match self.devices.iter().position(|d| d.device == device) {
            Some(index) => index,
            None => {
                self.devices.push(DeviceTimeline {
                    device,
                    ..DeviceTimeline::default()
                });
                self.devices
                    .sort_by_key(|d| crate::render::device_order(d.device));
                self.devices.iter().position(|d| d.device == device)?
            }
        };
        self.devices.get_mut(index)
    }

    /// The bucket index of `t_ns`, coarsening every series until it fits.
    fn index(&mut self, t_ns: u64) -> usize {
        while t_ns / self.bucket_ns >= MAX_BUCKETS as u64 {
            self.bucket_ns *= 2;
            for series in &mut self.devices {
                coarsen(&mut series.buckets, Bucket::merge);
                for thread in &mut series.threads {
                    coarsen(&mut thread.series.buckets, merge_live);
                }
                if let Some(other) = &mut series.other_threads {
                    coarsen(&mut other.series.buckets, merge_live);
                }
            }
        }
        (t_ns / self.bucket_ns) as usize
    }

    /// Records that `device` now holds `after` live bytes.
    fn level(&mut self, device: i32, t_ns: u64, after: u64) {
        let index = self.index(t_ns);
        let Some(series) = self.series(device) else {
            return;
        };
        let before = series.current;
        series.current = after;
        let bucket = bucket_at(&mut series.buckets, index);
        record_level(&mut bucket.live, before, after);
        if series.peak.is_none_or(|p| after > p.bytes) {
            series.peak = Some(PeakPoint { bytes: after, t_ns });
        }
    }

    /// Records that `device` now has `after` reserved bytes, `segments` telling whether
    /// PyTorch holds segments there now.
    fn reserved_level(&mut self, device: i32, t_ns: u64, after: u64, segments: bool) {
        let index = self.index(t_ns);
        let Some(series) = self.series(device) else {
            return;
        };
        series.had_segments |= segments;
        let before = series.reserved_current;
        if before == after && series.reserved_peak.is_some() {
            return;
        }
        series.reserved_current = after;
        let bucket = bucket_at(&mut series.buckets, index);
        record_level(&mut bucket.reserved, before, after);
        if series.reserved_peak.is_none_or(|p| after > p.bytes) {
            series.reserved_peak = Some(PeakPoint { bytes: after, t_ns });
        }
    }

    /// Drops the reserved series of devices where PyTorch never held a segment (there they
    /// equal the live bytes).
    fn drop_plain_reserved(&mut self) {
        for device in &mut self.devices {
            if !device.had_segments {
                device.reserved_peak = None;
                for bucket in &mut device.buckets {
                    bucket.reserved = None;
                }
            }
        }
    }

    /// Split by thread: `live` (allocated by its thread) began (`add`) or ended at `t_ns`.
    fn thread_change(&mut self, live: &Live, t_ns: u64, add: bool) {
        let Some(by_thread) = &self.by_thread else {
            return;
        };
        let max_series = by_thread.max_series;
        let thread: ThreadKey = (live.process, live.thread);
        // Some(whether it has a series) when the choice is made; None: while there is room.
        let chosen = by_thread.chosen.as_ref().map(|choice| {
            choice
                .get(&live.device)
                .is_some_and(|threads| threads.contains(&thread))
        });
        let index = self.index(t_ns);
        let Some(series) = self.series(live.device) else {
            return;
        };
        let tally = series.tallies.entry(thread).or_default();
        tally.current = if add {
            tally.current.saturating_add(live.size)
        } else {
            tally.current.saturating_sub(live.size)
        };
        if tally.current > tally.peak.bytes {
            tally.peak = PeakPoint {
                bytes: tally.current,
                t_ns,
            };
        }
        let own = match chosen {
            Some(own) => own,
            None if series.overflowed => return,
            None if series.tallies.len() > max_series => {
                // No room: which threads get series is known only at the end.
                series.overflowed = true;
                series.threads = Vec::new();
                return;
            }
            None => true,
        };
        let target = if own {
            let at = match series.threads.iter().position(|t| t.thread == thread) {
                Some(at) => at,
                None => {
                    series.threads.push(ThreadSeries {
                        thread,
                        series: ThreadTimeline::default(),
                    });
                    series.threads.len() - 1
                }
            };
            &mut series.threads[at].series
        } else {
            &mut series
                .other_threads
                .get_or_insert_with(OtherThreads::default)
                .series
        };
        target.change(index, t_ns, live.size, add);
    }

    fn used(&mut self, device: i32, t_ns: u64, free: u64, total: u64) {
        let index = self.index(t_ns);
        let Some(series) = self.series(device) else {
            return;
        };
        series.total_bytes = Some(total);
        let used = total.saturating_sub(free);
        let bucket = bucket_at(&mut series.buckets, index);
        bucket.used = Some(bucket.used.map_or(used, |u| u.max(used)));
    }
}

fn bucket_at(buckets: &mut Vec<Bucket>, index: usize) -> &mut Bucket {
    if buckets.len() <= index {
        buckets.resize(index + 1, Bucket::default());
    }
    &mut buckets[index]
}

impl Observer for Timeline {
    fn step(&mut self, state: &State, processes: &[Process], step: &Step<'_>) {
        match step {
            Step::Event {
                process,
                t_ns,
                event,
                effect,
            } => {
                let device = match (state.segment_change(), effect) {
                    (Some(SegmentChange::Added(s) | SegmentChange::Removed(s)), _) => {
                        Some(s.device)
                    }
                    (_, Effect::Added(live) | Effect::Removed(live)) => Some(live.device),
                    _ => None,
                };
                if let Some(device) = device {
                    let segments = state.segment_totals(device).0 > 0;
                    self.reserved_level(device, *t_ns, state.reserved_bytes(device), segments);
                }
                match effect {
                    Effect::Added(live) | Effect::Removed(live) => {
                        self.level(live.device, *t_ns, state.device_bytes(live.device));
                        if self.by_thread.is_some() {
                            let added = matches!(effect, Effect::Added(_));
                            if added && let Some(old) = state.replaced() {
                                // Its free was lost; it ends here, against its own thread.
                                self.thread_change(old, *t_ns, false);
                            }
                            self.thread_change(live, *t_ns, added);
                        }
                    }
                    Effect::Failed => {
                        if let Some((free, total)) = event.mem_info {
                            self.used(event.device, *t_ns, free, total);
                        }
                        let Some(info) = processes.get(*process as usize) else {
                            return;
                        };
                        let failure = FailurePoint {
                            t_ns: *t_ns,
                            request: event.size,
                            api: info.api(event.api).into_owned(),
                            pid: info.header.pid,
                        };
                        // Created here too, so a device whose only event is a failure gets a chart.
                        let Some(series) = self.series(event.device) else {
                            return;
                        };
                        if series.failures.len() < MAX_FAILURES {
                            series.failures.push(failure);
                        } else {
                            series.failures_omitted += 1;
                        }
                    }
                    Effect::Unmatched | Effect::None => {}
                }
            }
            Step::MemInfo { t_ns, info, .. } => {
                self.used(info.device, *t_ns, info.free, info.total);
            }
            Step::Dump { t_ns, cleared, .. } => {
                // A ring-mode dump cleared one process's live set without events.
                let devices: Vec<i32> = self.devices.iter().map(|d| d.device).collect();
                for device in devices {
                    let now = state.device_bytes(device);
                    if self.series(device).is_some_and(|s| s.current != now) {
                        self.level(device, *t_ns, now);
                    }
                }
                if self.by_thread.is_some() {
                    for live in cleared.iter() {
                        self.thread_change(live, *t_ns, false);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(max: u64, last: u64) -> Option<LiveRange> {
        Some(LiveRange { max, last })
    }

    #[test]
    fn timeline_buckets_stay_bounded_and_keep_maxima() {
        let mut timeline = Timeline::new(None);
        // A sawtooth: up to `i` at time 10*i, down to 0 right after.
        for i in 1..=100_000u64 {
            timeline.level(0, i * 10, i);
            timeline.level(0, i * 10 + 1, 0);
        }
        let series = &timeline.devices[0];
        assert!(series.buckets.len() <= MAX_BUCKETS);
        assert!(timeline.bucket_ns >= 1_000_010 / MAX_BUCKETS as u64);
        assert_eq!(
            series.peak,
            Some(PeakPoint {
                bytes: 100_000,
                t_ns: 1_000_000
            })
        );
        let top = series
            .buckets
            .iter()
            .filter_map(|b| b.live)
            .map(|l| l.max)
            .max();
        assert_eq!(top, Some(100_000));
        assert_eq!(
            series.buckets.last().and_then(|b| b.live).map(|l| l.last),
            Some(0)
        );
    }

    #[test]
    fn timeline_merge_keeps_the_later_last_and_the_carried_level() {
        let a = Bucket {
            live: range(5, 3),
            used: Some(7),
            ..Bucket::default()
        };
        let empty = Bucket::default();
        let b = Bucket {
            live: range(4, 1),
            used: None,
            ..Bucket::default()
        };
        assert_eq!(a.merge(b).live, range(5, 1));
        assert_eq!(a.merge(b).used, Some(7));
        assert_eq!(a.merge(empty), a);
        assert_eq!(empty.merge(b), b);
        // A free at the very start of a bucket still shows the level before it.
        let mut timeline = Timeline::new(None);
        timeline.level(0, 0, 100);
        timeline.level(0, 5000, 0);
        let series = &timeline.devices[0];
        let index = (5000 / timeline.bucket_ns) as usize;
        assert_eq!(series.buckets[index].live, range(100, 0));
    }

    /// `size` bytes allocated by thread `tid` of process 0 on device 0.
    fn live(tid: u32, addr: u64, size: u64) -> Live {
        Live {
            process: 0,
            kind: vramshim_format::EventKind::Alloc,
            api: 0,
            device: 0,
            addr,
            handle: 0,
            size,
            requested: size,
            stack: 0,
            thread: tid,
            stream: 0,
            t_ns: 0,
            seq: 0,
        }
    }

    /// (tid, peak bytes, peak time, last level) of each thread series of device 0.
    fn thread_summary(timeline: &Timeline) -> Vec<(u32, u64, u64, u64)> {
        timeline.devices[0]
            .threads
            .iter()
            .map(|t| {
                let peak = t.series.peak.unwrap_or_default();
                let last = t
                    .series
                    .buckets
                    .iter()
                    .flatten()
                    .last()
                    .map_or(0, |l| l.last);
                (t.thread.1, peak.bytes, peak.t_ns, last)
            })
            .collect()
    }

    #[test]
    fn timeline_thread_series_charge_frees_to_the_allocating_thread() {
        let mut timeline = Timeline::by_thread(None, 16, None);
        let a = live(1, 0x1000, 100);
        let b = live(2, 0x2000, 300);
        timeline.thread_change(&a, 10, true);
        timeline.thread_change(&b, 20, true);
        // Thread 2 frees thread 1's allocation: thread 1's series drops.
        timeline.thread_change(&a, 30, false);
        timeline.thread_change(&live(1, 0x3000, 50), 40, true);
        timeline.finish();
        assert_eq!(
            thread_summary(&timeline),
            [(2, 300, 20, 300), (1, 100, 10, 50)]
        );
        assert!(timeline.devices[0].other_threads.is_none());
        assert!(timeline.second_pass().is_none());
        // Without --by-thread, nothing per thread.
        let mut plain = Timeline::new(None);
        plain.thread_change(&a, 10, true);
        assert!(plain.devices.is_empty());
    }

    #[test]
    fn timeline_an_allocation_replacing_a_lost_free_ends_the_old_one_on_its_thread() {
        let mut timeline = Timeline::by_thread(None, 16, None);
        let old = live(1, 0x1000, 100);
        timeline.thread_change(&old, 10, true);
        // Thread 2 allocates the same address; thread 1's free was never recorded.
        let new = live(2, 0x1000, 40);
        let event = vramshim_format::Event {
            kind: vramshim_format::EventKind::Alloc,
            ..Default::default()
        };
        let step = Step::Event {
            process: 0,
            t_ns: 20,
            event: &event,
            effect: &Effect::Added(new),
        };
        timeline.step(&State::replacing(old), &[], &step);
        timeline.finish();
        assert_eq!(
            thread_summary(&timeline),
            [(1, 100, 10, 0), (2, 40, 20, 40)]
        );
    }

    #[test]
    fn timeline_more_threads_than_series_take_a_second_pass() {
        // Thread t allocates t * 10 bytes at time t; thread 2 frees at 100.
        let events: Vec<(Live, u64, bool)> = (1..=4u32)
            .map(|t| {
                (
                    live(t, u64::from(t) << 12, u64::from(t) * 10),
                    u64::from(t),
                    true,
                )
            })
            .chain([(live(2, 2 << 12, 20), 100, false)])
            .collect();
        let replay = |timeline: &mut Timeline| {
            for (live, t_ns, add) in &events {
                timeline.thread_change(live, *t_ns, *add);
            }
            timeline.finish();
        };
        let mut first = Timeline::by_thread(None, 2, None);
        replay(&mut first);
        // The series were dropped when the third thread came.
        assert!(first.devices[0].threads.is_empty());
        let chosen = first.second_pass().expect("a second pass");
        let expected: FxHashSet<ThreadKey> = [(0, 4), (0, 3)].into_iter().collect();
        assert_eq!(chosen.get(&0), Some(&expected));

        let mut second = Timeline::by_thread(None, 2, Some(chosen));
        replay(&mut second);
        assert!(second.second_pass().is_none());
        assert_eq!(thread_summary(&second), [(4, 40, 4, 40), (3, 30, 3, 30)]);
        let other = second.devices[0].other_threads.as_ref().expect("folded");
        assert_eq!(other.threads, 2);
        assert_eq!(other.series.peak, Some(PeakPoint { bytes: 30, t_ns: 2 }));
        let last = other.series.buckets.iter().flatten().last();
        assert_eq!(last.map(|l| l.last), Some(10));
    }

    #[test]
    fn timeline_thread_series_coarsen_with_the_device() {
        let mut timeline = Timeline::by_thread(None, 16, None);
        for i in 1..=10_000u64 {
            let a = live(7, 0x1000, i);
            timeline.level(0, i * 100, i);
            timeline.thread_change(&a, i * 100, true);
            timeline.level(0, i * 100 + 1, 0);
            timeline.thread_change(&a, i * 100 + 1, false);
        }
        timeline.finish();
        let device = &timeline.devices[0];
        let thread = &device.threads[0].series;
        assert!(thread.buckets.len() <= MAX_BUCKETS);
        assert_eq!(thread.buckets.len(), device.buckets.len());
        assert_eq!(
            thread.peak,
            Some(PeakPoint {
                bytes: 10_000,
                t_ns: 1_000_000
            })
        );
        let maxima = |live: &mut dyn Iterator<Item = Option<LiveRange>>| -> Vec<Option<u64>> {
            live.map(|l| l.map(|l| l.max)).collect()
        };
        assert_eq!(
            maxima(&mut thread.buckets.iter().copied()),
            maxima(&mut device.buckets.iter().map(|b| b.live))
        );
    }

    #[test]
    fn timeline_device_filter_and_order() {
        let mut timeline = Timeline::new(Some(1));
        timeline.level(0, 1, 10);
        timeline.level(1, 2, 20);
        assert_eq!(timeline.devices.len(), 1);
        assert_eq!(timeline.devices[0].device, 1);
        let mut timeline = Timeline::new(None);
        timeline.level(-1, 1, 10);
        timeline.used(1, 2, 5, 10);
        timeline.level(0, 3, 10);
        let order: Vec<i32> = timeline.devices.iter().map(|d| d.device).collect();
        assert_eq!(order, vec![0, 1, -1]);
        assert_eq!(timeline.devices[1].used_max(), Some(5));
        assert_eq!(timeline.devices[1].total_bytes, Some(10));
    }
}
