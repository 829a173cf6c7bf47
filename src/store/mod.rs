//! The fact store: every string and every value of one index generation, once.
//!
//! Fleets repeat themselves: the same OS names, versions, domains and roles, whole
//! `os` or `processors` hashes shared by thousands of servers. The store interns
//! strings and hash-conses values, so a value that occurs on many servers is held
//! once and has one id; comparing two values is comparing two ids. A server is then
//! an id (its facts hash); everything it holds is a flat array entry here.
//!
//! Layout (what the snapshot writes as is):
//! - `text` + `text_ends`: string `i` is `text[text_ends[i-1]..text_ends[i]]`;
//! - `slots`: one per value, a tag and two words (a string id, a number's bits, or
//!   a range of `children`);
//! - `children`: an array's value ids, or an object's key and value ids in pairs,
//!   keys in byte order (as serde_json's map keeps them).
//!
//! A container's children always have smaller ids than the container, so values
//! form no cycle and [`Store::validate`] can check a decoded store in one pass.

pub mod blob;
mod build;
mod column;
pub mod json;
pub mod pool;
mod recent;
mod view;

pub use build::{Builder, Remap, Tables};
pub use column::Column;
pub use view::{ArrayRef, KeyHint, Kind, ObjectRef, View};

use crate::bounded_read::FileBytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Index of a string in a [`Store`].
pub type StrId = u32;
/// Index of a value in a [`Store`].
pub type ValueId = u32;

/// The ids every store gives the constants, so code can name them.
pub const NULL: ValueId = 0;
pub const FALSE: ValueId = 1;
pub const TRUE: ValueId = 2;
pub const EMPTY_OBJECT: ValueId = 3;

/// Deepest nesting a store accepts: what the fact readers accept, plus room for the
/// wrapping a source adds. Traversals may recurse this deep and no deeper.
pub const MAX_DEPTH: u32 = crate::yaml::MAX_DEPTH as u32 + 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
enum Tag {
    Null = 0,
    Bool = 1,
    Int = 2,
    UInt = 3,
    Float = 4,
    Str = 5,
    Array = 6,
    Object = 7,
}

impl Tag {
    fn from_u8(b: u8) -> Option<Tag> {
        Some(match b {
            0 => Tag::Null,
            1 => Tag::Bool,
            2 => Tag::Int,
            3 => Tag::UInt,
            4 => Tag::Float,
            5 => Tag::Str,
            6 => Tag::Array,
            7 => Tag::Object,
            _ => return None,
        })
    }
}

/// One value: for numbers `lo`/`hi` are the 64 bits, for a string `lo` is its id,
/// for containers `lo` is the start in `children` and `hi` the element count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Slot {
    tag: Tag,
    lo: u32,
    hi: u32,
}

impl Slot {
    fn bits(self) -> u64 {
        (self.hi as u64) << 32 | self.lo as u64
    }

    fn of_bits(tag: Tag, bits: u64) -> Slot {
        Slot { tag, lo: bits as u32, hi: (bits >> 32) as u32 }
    }

    /// Range in `children`: pairs for an object.
    fn children(self) -> std::ops::Range<usize> {
        let width = if self.tag == Tag::Object { 2 } else { 1 };
        self.lo as usize..self.lo as usize + self.hi as usize * width
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Store {
    text: Column<u8>,
    text_ends: Column<u32>,
    tags: Column<u8>,
    lo: Column<u32>,
    hi: Column<u32>,
    children: Column<u32>,
}

/// Why a decoded store was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct Invalid(pub String);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Store {
    pub fn view(&self, id: ValueId) -> View<'_> {
        View::new(self, id)
    }

    pub fn str(&self, id: StrId) -> &str {
        let end = self.text_ends[id as usize] as usize;
        let start = if id == 0 { 0 } else { self.text_ends[id as usize - 1] as usize };
        let bytes = &self.text[start..end];
        debug_assert!(std::str::from_utf8(bytes).is_ok());
        // SAFETY: every string of a store is UTF-8: the builder appends only `&str`s
        // and `from_parts` refuses (`validate`) a text whose strings are not, and the
        // text and its ends are private to this module and never changed after.
        // Checking it again here cost a tenth of converting servers to Ruby.
        unsafe { std::str::from_utf8_unchecked(bytes) }
    }

    /// Empties the store, keeping the room of the arrays it alone holds.
    fn clear(&mut self) {
        for column in [&mut self.text_ends, &mut self.lo, &mut self.hi, &mut self.children] {
            column.clear();
        }
        self.text.clear();
        self.tags.clear();
    }

    pub fn strings(&self) -> usize {
        self.text_ends.len()
    }

    pub fn values(&self) -> usize {
        self.tags.len()
    }

    /// Heap bytes held, for `status` and the benchmarks.
    pub fn heap_bytes(&self) -> usize {
        self.text.heap_bytes()
            + self.text_ends.heap_bytes()
            + self.tags.heap_bytes()
            + self.lo.heap_bytes()
            + self.hi.heap_bytes()
            + self.children.heap_bytes()
    }

    /// Whether every array is read in place from a mapped snapshot.
    pub fn is_mapped(&self) -> bool {
        let words = [&self.text_ends, &self.lo, &self.hi, &self.children];
        self.text.is_mapped() && self.tags.is_mapped() && words.iter().all(|c| c.is_mapped())
    }

    fn slot(&self, id: ValueId) -> Slot {
        let i = id as usize;
        let tag = Tag::from_u8(self.tags[i]).unwrap_or(Tag::Null);
        Slot { tag, lo: self.lo[i], hi: self.hi[i] }
    }

    /// Appends the store to a snapshot: a MessagePack map of its arrays, one aligned
    /// blob each (see [`blob::write_entry`]), that [`StoreBlobs`] reads back.
    pub fn write(&self, out: &mut Vec<u8>) {
        rmp::encode::write_map_len(out, 2 * 6).expect("writing to a Vec");
        blob::write_entry(out, "text", &self.text);
        blob::write_entry(out, "text_ends", &self.text_ends);
        blob::write_entry(out, "tags", &self.tags);
        blob::write_entry(out, "lo", &self.lo);
        blob::write_entry(out, "hi", &self.hi);
        blob::write_entry(out, "children", &self.children);
    }

    /// A store over the arrays of a snapshot in `file`, read in place where they are
    /// aligned, after checking everything a reader relies on: lengths agree, strings
    /// are UTF-8, every reference points back to an earlier value, object keys are
    /// sorted and unique, nesting stays within [`MAX_DEPTH`].
    pub fn from_blobs(file: &Arc<FileBytes>, blobs: StoreBlobs<'_>) -> Result<Store, Invalid> {
        let store = Store {
            text: Column::from_blob(file, "text", blobs.text.0).map_err(Invalid)?,
            text_ends: Column::from_blob(file, "text_ends", blobs.text_ends.0).map_err(Invalid)?,
            tags: Column::from_blob(file, "tags", blobs.tags.0).map_err(Invalid)?,
            lo: Column::from_blob(file, "lo", blobs.lo.0).map_err(Invalid)?,
            hi: Column::from_blob(file, "hi", blobs.hi.0).map_err(Invalid)?,
            children: Column::from_blob(file, "children", blobs.children.0).map_err(Invalid)?,
        };
        store.validate()?;
        Ok(store)
    }

    fn validate(&self) -> Result<(), Invalid> {
        let bad = |what: String| Err(Invalid(what));
        // All the text UTF-8 and every string ending on a character boundary: then
        // each string is UTF-8 (one pass over the text, not one call per string).
        if let Err(e) = std::str::from_utf8(&self.text) {
            return bad(format!("the text is not UTF-8 at byte {}", e.valid_up_to()));
        }
        let mut start = 0usize;
        for (i, &end) in self.text_ends.iter().enumerate() {
            let end = end as usize;
            if end < start || end > self.text.len() {
                return bad(format!("string {i} ends at {end}, outside {start}..{}", self.text.len()));
            }
            if self.text.get(end).is_some_and(|&b| b & 0xc0 == 0x80) {
                return bad(format!("string {i} ends inside a character"));
            }
            start = end;
        }
        if start != self.text.len() {
            return bad(format!("{} bytes of text after the last string", self.text.len() - start));
        }
        let n = self.tags.len();
        if self.lo.len() != n || self.hi.len() != n {
            return bad(format!("{n} tags but {} and {} value words", self.lo.len(), self.hi.len()));
        }
        let constants = [(Tag::Null, 0, 0), (Tag::Bool, 0, 0), (Tag::Bool, 1, 0), (Tag::Object, 0, 0)];
        if n < constants.len() {
            return bad(format!("{n} values, fewer than the {} constants", constants.len()));
        }
        const _: () = assert!(MAX_DEPTH < u8::MAX as u32);
        let mut depth = vec![0u8; n];
        // Servers share their key sequences: the last key found to follow each key
        // spares comparing the same two strings again for every server.
        let mut checked_next = vec![u32::MAX; self.text_ends.len()];
        for id in 0..n {
            let Some(tag) = Tag::from_u8(self.tags[id]) else {
                return bad(format!("value {id} has unknown tag {}", self.tags[id]));
            };
            let slot = Slot { tag, lo: self.lo[id], hi: self.hi[id] };
            if let Some(&(t, lo, hi)) = constants.get(id) {
                if (slot.tag, slot.lo, slot.hi) != (t, lo, hi) {
                    return bad(format!("value {id} is not the constant {t:?}"));
                }
                depth[id] = 1;
                continue;
            }
            depth[id] = 1;
            match tag {
                Tag::Null | Tag::Bool => return bad(format!("value {id} repeats a constant")),
                Tag::Int | Tag::UInt => {}
                Tag::Float => {
                    if !f64::from_bits(slot.bits()).is_finite() {
                        return bad(format!("value {id} is a float that is not finite"));
                    }
                }
                Tag::Str => {
                    if slot.lo as usize >= self.text_ends.len() {
                        return bad(format!("value {id} names string {}, past the end", slot.lo));
                    }
                }
                Tag::Array | Tag::Object => {
                    let range =
                        (slot.lo as usize).checked_add(slot.hi as usize * if tag == Tag::Object { 2 } else { 1 });
                    if range.is_none_or(|end| end > self.children.len()) {
                        return bad(format!("value {id} has children past the end"));
                    }
                    let mut deepest = 0;
                    let mut previous_key: Option<StrId> = None;
                    for (k, &child) in self.children[slot.children()].iter().enumerate() {
                        if tag == Tag::Object && k % 2 == 0 {
                            if child as usize >= self.text_ends.len() {
                                return bad(format!("value {id} has key string {child}, past the end"));
                            }
                            if let Some(previous) = previous_key.filter(|&p| checked_next[p as usize] != child) {
                                if self.str(previous) >= self.str(child) {
                                    let key = self.str(child);
                                    return bad(format!("value {id} has keys out of order or repeated ('{key}')"));
                                }
                                checked_next[previous as usize] = child;
                            }
                            previous_key = Some(child);
                            continue;
                        }
                        if child as usize >= id {
                            return bad(format!("value {id} refers to value {child}, not an earlier one"));
                        }
                        deepest = deepest.max(depth[child as usize]);
                    }
                    depth[id] = deepest + 1;
                    if depth[id] as u32 > MAX_DEPTH {
                        return bad(format!("value {id} nests deeper than {MAX_DEPTH}"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A store's arrays as a snapshot holds them, borrowed from the file.
#[derive(Deserialize)]
pub struct StoreBlobs<'a> {
    #[serde(borrow)]
    pub text: blob::Blob<'a>,
    #[serde(borrow)]
    pub text_ends: blob::Blob<'a>,
    #[serde(borrow)]
    pub tags: blob::Blob<'a>,
    #[serde(borrow)]
    pub lo: blob::Blob<'a>,
    #[serde(borrow)]
    pub hi: blob::Blob<'a>,
    #[serde(borrow)]
    pub children: blob::Blob<'a>,
}

#[cfg(test)]
mod tests;
