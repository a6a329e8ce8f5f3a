//! The replay's live set: live objects by [`Key`], in one open-addressed table.
//!
//! Every event of a log looks an object up, files one or ends one, so this is the replay's
//! hottest structure. Keys are mostly device addresses (aligned, so their low bits say
//! nothing): a multiplicative (Fibonacci) hash takes the table index from the product's high
//! bits, which every key bit reaches. Linear probing keeps a lookup to one or two adjacent
//! slots, and deletion shifts later entries back (no tombstones), so a loop that allocates
//! and frees the same buffers keeps hitting the same slots however long it runs.

use super::{Key, Live};

/// Marks an empty slot in `Key::class` (real classes are 0..=3).
const EMPTY: u8 = u8::MAX;

#[derive(Clone, Copy)]
struct Slot {
    key: Key,
    live: Live,
}

const EMPTY_SLOT: Slot = Slot {
    key: Key {
        process: 0,
        class: EMPTY,
        value: 0,
    },
    live: Live {
        process: 0,
        kind: vramshim_format::EventKind::Alloc,
        api: 0,
        device: 0,
        addr: 0,
        handle: 0,
        size: 0,
        requested: 0,
        stack: 0,
        thread: 0,
        stream: 0,
        t_ns: 0,
        seq: 0,
    },
};

/// Live objects by key.
#[derive(Default)]
pub(super) struct LiveMap {
    /// A power of two long (or empty); at most three quarters full.
    slots: Vec<Slot>,
    len: usize,
    /// 64 − log2(slots.len()): the hash's top bits index the table.
    shift: u32,
}

impl LiveMap {
    #[inline]
    fn home(&self, key: &Key) -> usize {
        let mixed = key.value
            ^ (u64::from(key.process) << 8 | u64::from(key.class))
                .wrapping_mul(0xff51_afd7_ed55_8ccd);
        (mixed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: &Key) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut at = self.home(key);
        loop {
            let slot = &self.slots[at];
            if slot.key == *key {
                return Some(at);
            }
            if slot.key.class == EMPTY {
                return None;
            }
            at = (at + 1) & mask;
        }
    }

    /// Files `live` under `key`; returns what the key held before, if anything.
    #[inline(always)]
    pub(super) fn insert(&mut self, key: Key, live: Live) -> Option<Live> {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut at = self.home(&key);
        loop {
            let slot = &mut self.slots[at];
            if slot.key == key {
                return Some(std::mem::replace(&mut slot.live, live));
            }
            if slot.key.class == EMPTY {
                *slot = Slot { key, live };
                self.len += 1;
                return None;
            }
            at = (at + 1) & mask;
        }
    }

    /// Takes `key`'s object out, if it is there.
    #[cfg(test)]
    fn remove(&mut self, key: &Key) -> Option<Live> {
        self.remove_with(key, |live| *live)
    }

    /// Takes `key`'s object out, if it is there, as `made` makes it from the object (where it
    /// lies: made into its final place, a `Live` is not copied on the way).
    #[inline(always)]
    pub(super) fn remove_with<T>(&mut self, key: &Key, made: impl FnOnce(&Live) -> T) -> Option<T> {
        let found = self.find(key)?;
        let removed = Some(made(&self.slots[found].live));
        // Backward shift: later entries of the probe run move up into the hole unless their
        // home lies after the hole (cyclically), so every entry stays reachable from its home.
        let mask = self.slots.len() - 1;
        let mut hole = found;
        let mut at = (found + 1) & mask;
        loop {
            let next = self.slots[at].key;
            if next.class == EMPTY {
                break;
            }
            let home = self.home(&next);
            if (at.wrapping_sub(home) & mask) >= (at.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[at];
                hole = at;
            }
            at = (at + 1) & mask;
        }
        self.slots[hole].key.class = EMPTY;
        self.len -= 1;
        removed
    }

    /// Every live object, in table order.
    pub(super) fn values(&self) -> impl Iterator<Item = &Live> {
        self.slots
            .iter()
            .filter(|slot| slot.key.class != EMPTY)
            .map(|slot| &slot.live)
    }

    /// Every key, in table order.
    pub(super) fn keys(&self) -> impl Iterator<Item = &Key> {
        self.slots
            .iter()
            .map(|slot| &slot.key)
            .filter(|key| key.class != EMPTY)
    }

    /// Doubles the table (16 slots at first) and files every entry anew.
    #[cold]
    fn grow(&mut self) {
        let capacity = (self.slots.len() * 2).max(16);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY_SLOT; capacity]);
        self.shift = 64 - capacity.trailing_zeros();
        self.len = 0;
        for slot in old {
            if slot.key.class != EMPTY {
                self.insert(slot.key, slot.live);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: u64) -> Key {
        Key {
            process: (value % 3) as u32,
            class: (value % 4) as u8,
            value: value << 12,
        }
    }

    fn live(seq: u64) -> Live {
        Live {
            seq,
            ..EMPTY_SLOT.live
        }
    }

    /// Against a std map, through growth, replacement and removals that shift runs back.
    #[test]
    fn matches_a_std_map_through_inserts_and_removes() {
        let mut map = LiveMap::default();
        let mut model = std::collections::HashMap::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for step in 0..200_000u64 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let k = key(state % 5_000);
            if state.is_multiple_of(3) {
                assert_eq!(map.remove(&k), model.remove(&k), "step {step}");
            } else {
                assert_eq!(
                    map.insert(k, live(step)),
                    model.insert(k, live(step)),
                    "step {step}"
                );
            }
            assert_eq!(map.len, model.len());
        }
        for (k, v) in &model {
            assert_eq!(map.find(k).map(|at| map.slots[at].live), Some(*v));
        }
        assert_eq!(map.values().count(), model.len());
        assert_eq!(map.keys().count(), model.len());
        assert_eq!(map.find(&key(1_000_000)), None);
    }
}
