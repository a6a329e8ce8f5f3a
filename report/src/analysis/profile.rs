//! Per-stack totals for the profile exports (pprof, speedscope): per device and symbolised
//! stack, bytes and allocations allocated over the run and in use at one moment per device
//! (its peak, or the end of the log).

use std::rc::Rc;

use rustc_hash::FxHashMap;

use super::groups::{IdKey, IdTotals, Stacks};
use crate::replay::Process;
use crate::symbols::SymFrame;

/// One stack of one device with its figures.
#[derive(Clone, Debug)]
pub struct ProfileSample {
    pub device: i32,
    /// Innermost first; empty when no stack was captured.
    pub frames: Rc<[SymFrame]>,
    pub alloc_bytes: u64,
    pub alloc_count: u64,
    pub inuse_bytes: u64,
    pub inuse_count: u64,
}

/// Joins the per-device totals allocated over the run with those in use at the chosen moment,
/// one sample per (device, process, stack id), frames resolved; ordered by device, process and
/// stack id, so the output does not depend on hashing.
pub fn samples(
    allocated: &FxHashMap<i32, IdTotals>,
    inuse: &FxHashMap<i32, IdTotals>,
    stacks: &mut Stacks,
    processes: &[Process],
) -> Vec<ProfileSample> {
    let mut joined: FxHashMap<(i32, IdKey), [u64; 4]> = FxHashMap::default();
    for (device, totals) in allocated {
        for (key, (bytes, count)) in totals {
            let entry = joined.entry((*device, *key)).or_default();
            entry[0] += bytes;
            entry[1] += count;
        }
    }
    for (device, totals) in inuse {
        for (key, (bytes, count)) in totals {
            let entry = joined.entry((*device, *key)).or_default();
            entry[2] += bytes;
            entry[3] += count;
        }
    }
    let mut keys: Vec<(i32, IdKey)> = joined.keys().copied().collect();
    keys.sort_unstable();
    keys.into_iter()
        .map(|(device, key)| {
            let [alloc_bytes, alloc_count, inuse_bytes, inuse_count] = joined[&(device, key)];
            ProfileSample {
                device,
                frames: stacks.frames(processes, key.process, key.stack),
                alloc_bytes,
                alloc_count,
                inuse_bytes,
                inuse_count,
            }
        })
        .collect()
}
