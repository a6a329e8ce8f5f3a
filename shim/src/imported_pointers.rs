//! Pool pointers imported from another process (`cu(da)MemPoolImportPointer`) and not yet
//! freed, so that the importer's free of one is recorded as its unmapping, not as a free of
//! memory it never allocated.
//!
//! Addresses with how many imports each holds (0 = free slot). Lock-free: a free in a signal
//! handler or on any thread only looks. A process importing more at once than there are slots
//! records the rest's frees as frees.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

const SLOTS: usize = 256;
static ADDR: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static REFS: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
/// Imports held in all slots: frees look at the slots only while some are.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// One more import of `addr` (the driver gives the same address to a second import of the
/// same pointer).
pub fn imported(addr: u64) {
    let counted = ADDR
        .iter()
        .position(|slot| slot.load(Ordering::Acquire) == addr)
        .or_else(|| {
            ADDR.iter().position(|slot| {
                slot.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            })
        });
    if let Some(slot) = counted {
        REFS[slot].fetch_add(1, Ordering::AcqRel);
        LIVE.fetch_add(1, Ordering::AcqRel);
    }
}

/// Whether a successful free of `addr` gave back one import of it (then counted off). The
/// common case, nothing imported, is one atomic load.
pub fn freed(addr: u64) -> bool {
    if LIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    for (slot, held) in ADDR.iter().enumerate() {
        if held.load(Ordering::Acquire) != addr {
            continue;
        }
        let refs = &REFS[slot];
        let mut current = refs.load(Ordering::Acquire);
        while current > 0 {
            match refs.compare_exchange(current, current - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    LIVE.fetch_sub(1, Ordering::AcqRel);
                    if current == 1 {
                        let _ = held.compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Acquire);
                    }
                    return true;
                }
                Err(now) => current = now,
            }
        }
    }
    false
}
