//! Live bytes over time per device, in bounded memory: time is cut into at most
//! [`MAX_BUCKETS`] buckets of equal width, and when the replay runs past the span they cover,
//! the width doubles and neighbouring buckets merge. The peak and the failed allocations are
//! kept exactly, apart from the buckets, so drawing them never depends on the resolution.

use crate::replay::{Effect, Observer, Process, State, Step};

/// Buckets per device at most; a long log costs the same memory as a short one.
pub const MAX_BUCKETS: usize = 2048;
/// Failed allocations kept per device; later ones are only counted.
pub const MAX_FAILURES: usize = 1000;

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
    /// Highest device used memory (total - free) sampled in the bucket.
    pub used: Option<u64>,
}

impl Bucket {
    fn merge(self, later: Bucket) -> Bucket {
        let live = match (self.live, later.live) {
            (Some(a), Some(b)) => Some(LiveRange {
                max: a.max.max(b.max),
                last: b.last,
            }),
            (a, b) => b.or(a),
        };
        let used = match (self.used, later.used) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Bucket { live, used }
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

/// The time series of one device (pinned host memory is device -1).
#[derive(Clone, Debug, Default)]
pub struct DeviceTimeline {
    pub device: i32,
    /// Bucket `i` covers `[i * bucket_ns, (i + 1) * bucket_ns)` of replay time.
    pub buckets: Vec<Bucket>,
    /// None when nothing was ever allocated on the device.
    pub peak: Option<PeakPoint>,
    pub failures: Vec<FailurePoint>,
    /// Failures past [`MAX_FAILURES`].
    pub failures_omitted: u64,
    /// The device's total memory, from the last sample.
    pub total_bytes: Option<u64>,
    /// Live bytes now (summed over processes).
    current: u64,
}

impl DeviceTimeline {
    /// Highest used memory sampled, if any.
    pub fn used_max(&self) -> Option<u64> {
        self.buckets.iter().filter_map(|b| b.used).max()
    }
}

/// Observer building the series of every device (or of one).
pub struct Timeline {
    device: Option<i32>,
    /// Width of a bucket in nanoseconds; a power of two.
    pub bucket_ns: u64,
    /// Sorted by report order of devices.
    pub devices: Vec<DeviceTimeline>,
}

impl Timeline {
    /// A timeline of every device, or only of `device`.
    pub fn new(device: Option<i32>) -> Timeline {
        Timeline {
            device,
            bucket_ns: 1,
            devices: Vec::new(),
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
                let merged = series
                    .buckets
                    .chunks(2)
                    .map(|pair| match pair {
                        [a, b] => a.merge(*b),
                        [a] => *a,
                        _ => Bucket::default(),
                    })
                    .collect();
                series.buckets = merged;
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
        bucket.live = Some(match bucket.live {
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
        if series.peak.is_none_or(|p| after > p.bytes) {
            series.peak = Some(PeakPoint { bytes: after, t_ns });
        }
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
            } => match effect {
                Effect::Added(live) | Effect::Removed(live) => {
                    self.level(live.device, *t_ns, state.device_bytes(live.device));
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
            },
            Step::MemInfo { t_ns, info, .. } => {
                self.used(info.device, *t_ns, info.free, info.total);
            }
            Step::Dump { t_ns, .. } => {
                // A ring-mode dump cleared one process's live set without events.
                let devices: Vec<i32> = self.devices.iter().map(|d| d.device).collect();
                for device in devices {
                    let now = state.device_bytes(device);
                    if self.series(device).is_some_and(|s| s.current != now) {
                        self.level(device, *t_ns, now);
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
        };
        let empty = Bucket::default();
        let b = Bucket {
            live: range(4, 1),
            used: None,
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
