//! Selecting a snapshot: the exact set of allocations live at one moment.

use crate::replay::{Live, Observer, Process, State, Step};

/// Allocations live at one moment (on one device, or on all).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Device ordinal the snapshot is restricted to; None: every device and host.
    pub device: Option<i32>,
    pub t_ns: u64,
    pub allocations: Vec<Live>,
    /// Tensor view: PyTorch's caching-allocator segments at that moment (count, bytes),
    /// which hold the tensors among `allocations`.
    pub segments: (u64, u64),
}

impl Snapshot {
    /// Copies what `state` holds now.
    pub fn of(state: &State, device: Option<i32>, t_ns: u64) -> Snapshot {
        let allocations = state
            .live()
            .filter(|live| device.is_none_or(|d| live.device == d))
            .copied()
            .collect();
        let mut snapshot = Snapshot::from_allocations(device, t_ns, allocations);
        if let Some(device) = device {
            snapshot.segments = state.segment_totals(device);
        }
        snapshot
    }

    /// A snapshot of `allocations`, put in a deterministic order (oldest first).
    pub fn from_allocations(
        device: Option<i32>,
        t_ns: u64,
        mut allocations: Vec<Live>,
    ) -> Snapshot {
        allocations.sort_by_key(|live| live.seq);
        Snapshot {
            device,
            t_ns,
            allocations,
            segments: (0, 0),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.allocations
            .iter()
            .map(|live| live.size)
            .fold(0, u64::saturating_add)
    }
}

/// Captures each device's live set right after the event with the given sequence number
/// (for moments found by an earlier pass, such as a failed allocation).
pub struct SnapshotsAt {
    /// (sequence number, device), sorted by sequence number.
    targets: Vec<(u64, i32)>,
    pub taken: Vec<Snapshot>,
}

impl SnapshotsAt {
    pub fn new(mut targets: Vec<(u64, i32)>) -> SnapshotsAt {
        targets.sort();
        SnapshotsAt {
            targets,
            taken: Vec::new(),
        }
    }

    /// The last sequence number needed: the replay can stop there.
    pub fn last_seq(&self) -> Option<u64> {
        self.targets.last().map(|(seq, _)| *seq)
    }
}

impl Observer for SnapshotsAt {
    fn step(&mut self, state: &State, _processes: &[Process], step: &Step<'_>) {
        let Step::Event { t_ns, .. } = step else {
            return;
        };
        while let Some(&(seq, device)) = self.targets.first() {
            if seq != state.seq {
                break;
            }
            self.targets.remove(0);
            self.taken.push(Snapshot::of(state, Some(device), *t_ns));
        }
    }
}
