//! Short strings an inventory repeats (fact names, common values), found again
//! without the builder's tables: one small direct-mapped table per builder, whose
//! entries stay in the CPU's cache while the store's tables do not.

use crate::store::Builder;

/// Strings up to this many bytes are kept.
const MAX_LEN: usize = 24;
const SLOTS_LOG2: u32 = 11;

#[derive(Clone, Copy)]
struct Slot {
    /// The bytes, zero-padded; `len` 0 is an empty slot (the empty string is not kept).
    bytes: [u8; MAX_LEN],
    len: u32,
    id: u32,
}

const EMPTY: Slot = Slot { bytes: [0; MAX_LEN], len: 0, id: 0 };

/// Ids one builder gave to short strings: an id found here is the one the builder
/// gives for the same bytes, so the store is the same with or without it.
pub(super) struct Recent {
    keys: Box<[Slot]>,
    values: Box<[Slot]>,
}

impl Recent {
    pub(super) fn new() -> Recent {
        let slots = 1usize << SLOTS_LOG2;
        Recent { keys: vec![EMPTY; slots].into_boxed_slice(), values: vec![EMPTY; slots].into_boxed_slice() }
    }

    /// `builder.string` of `bytes` read as UTF-8 (invalid sequences replaced).
    pub(super) fn string(&mut self, builder: &mut Builder, bytes: &[u8]) -> u32 {
        cached(&mut self.keys, bytes, |text| builder.string(text))
    }

    /// `builder.string_value` of `bytes` read as UTF-8 (invalid sequences replaced).
    pub(super) fn string_value(&mut self, builder: &mut Builder, bytes: &[u8]) -> u32 {
        cached(&mut self.values, bytes, |text| builder.string_value(text))
    }
}

fn cached(slots: &mut [Slot], bytes: &[u8], add: impl FnOnce(&str) -> u32) -> u32 {
    if bytes.is_empty() || bytes.len() > MAX_LEN {
        return add(&text(bytes));
    }
    let mut padded = [0u8; MAX_LEN];
    padded[..bytes.len()].copy_from_slice(bytes);
    let slot = &mut slots[index(&padded, bytes.len())];
    if slot.len as usize == bytes.len() && slot.bytes == padded {
        return slot.id;
    }
    let id = add(&text(bytes));
    *slot = Slot { bytes: padded, len: bytes.len() as u32, id };
    id
}

/// Where `padded` goes. Not keyed: colliding strings only miss here and go to the
/// builder, whose tables are.
fn index(padded: &[u8; MAX_LEN], len: usize) -> usize {
    let word = |i: usize| u64::from_le_bytes(padded[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    let mixed =
        (word(0) ^ word(1).rotate_left(21) ^ word(2).rotate_left(42) ^ len as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> (64 - SLOTS_LOG2)) as usize
}

/// Bytes as UTF-8 text, invalid sequences replaced (checked the fast way first).
pub(super) fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}
