//! Short strings a fleet repeats (fact names, common values), found again without
//! the builder's tables: one small direct-mapped table per builder, whose entries
//! stay in the CPU's cache while the tables do not. Interning is most of the
//! cost of reading facts, and most of what is interned is a string seen before.

use super::{StrId, ValueId};

/// Strings up to this many bytes are kept. 32 (class names such as
/// `profile::component12::part3`) saved 2.8 % of the instructions of decoding 10k
/// inventories and no measurable time; 40 added 2 % (more to copy and compare).
const MAX_LEN: usize = 24;
const SLOTS_LOG2: u32 = 12;
/// Not given yet: a slot's value id until the string is used as a value.
pub(super) const NONE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Slot {
    /// The bytes, zero-padded; `len` 0 is an empty slot (the empty string is not kept).
    bytes: [u8; MAX_LEN],
    len: u32,
    string: StrId,
    value: ValueId,
}

const EMPTY: Slot = Slot { bytes: [0; MAX_LEN], len: 0, string: 0, value: NONE };

/// Ids one builder gave to short strings: an id found here is the one the builder
/// gives for the same bytes, so the store is the same with or without it. Only
/// UTF-8 bytes are kept (the builder puts a string's own bytes, never bytes whose
/// text was repaired), so finding bytes here proves them UTF-8. Not
/// keyed: strings crafted to collide here only miss, and go to the builder's
/// tables, which are.
pub(super) struct Recent {
    slots: Box<[Slot]>,
}

/// Where a string is, or would go, in [`Recent`].
pub(super) enum Found {
    /// Its string id, and its value id ([`NONE`] if not a value yet), at slot `at`.
    Hit { at: usize, string: StrId, value: ValueId },
    /// Not kept; [`Recent::put`] it at `at` (`None`: too long or empty, never kept).
    Miss { at: Option<usize> },
}

impl Recent {
    pub(super) fn new() -> Recent {
        Recent { slots: vec![EMPTY; 1 << SLOTS_LOG2].into_boxed_slice() }
    }

    /// Forgets every string (the builder's ids are no longer valid).
    pub(super) fn clear(&mut self) {
        self.slots.fill(EMPTY);
    }

    pub(super) fn find(&self, bytes: &[u8]) -> Found {
        if bytes.is_empty() || bytes.len() > MAX_LEN {
            return Found::Miss { at: None };
        }
        let mut padded = [0u8; MAX_LEN];
        padded[..bytes.len()].copy_from_slice(bytes);
        let at = index(&padded, bytes.len());
        let slot = &self.slots[at];
        if slot.len as usize == bytes.len() && slot.bytes == padded {
            Found::Hit { at, string: slot.string, value: slot.value }
        } else {
            Found::Miss { at: Some(at) }
        }
    }

    /// Keeps `bytes` at `at` (from [`Recent::find`] of the same bytes).
    pub(super) fn put(&mut self, at: usize, bytes: &[u8], string: StrId, value: ValueId) {
        let mut padded = [0u8; MAX_LEN];
        padded[..bytes.len()].copy_from_slice(bytes);
        self.slots[at] = Slot { bytes: padded, len: bytes.len() as u32, string, value };
    }

    /// Records the value id of the string at `at`.
    pub(super) fn set_value(&mut self, at: usize, value: ValueId) {
        self.slots[at].value = value;
    }
}

/// Where `padded` goes.
fn index(padded: &[u8; MAX_LEN], len: usize) -> usize {
    let word = |i: usize| u64::from_le_bytes(padded[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    let mixed =
        (word(0) ^ word(1).rotate_left(21) ^ word(2).rotate_left(42) ^ len as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> (64 - SLOTS_LOG2)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_up_to_the_longest_kept_length_are_found_again_and_longer_ones_never_kept() {
        let mut recent = Recent::new();
        for len in [1, MAX_LEN - 1, MAX_LEN] {
            // Two strings alike but for their last byte: both found, each with its own ids.
            let a = vec![b'a'; len];
            let mut b = a.clone();
            b[len - 1] = b'b';
            for (bytes, id) in [(&a, 7), (&b, 8)] {
                let Found::Miss { at: Some(at) } = recent.find(bytes) else { panic!("{len} bytes: kept before") };
                recent.put(at, bytes, id, NONE);
            }
            for (bytes, id) in [(&a, 7), (&b, 8)] {
                match recent.find(bytes) {
                    Found::Hit { string, value, .. } => assert_eq!((string, value), (id, NONE), "{len} bytes"),
                    Found::Miss { .. } => panic!("{len} bytes: not found again"),
                }
            }
        }
        assert!(matches!(recent.find(&[b'a'; MAX_LEN + 1]), Found::Miss { at: None }));
        assert!(matches!(recent.find(b""), Found::Miss { at: None }));
    }
}
