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

pub use build::{lossy_text, Builder, Remap, Tables};
pub use column::{Column, RaggedColumn};
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

/// Deepest nesting of a fact document the fact readers accept (YAML's `MAX_DEPTH`,
/// which the sources hold equal to this, and JSON's).
pub const MAX_DOCUMENT_DEPTH: usize = 64;

/// Deepest nesting a store accepts: what the fact readers accept, plus room for the
/// wrapping a source adds. Traversals may recurse this deep and no deeper.
pub const MAX_DEPTH: u32 = MAX_DOCUMENT_DEPTH as u32 + 8;

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

    /// Starts loading what viewing value `id` reads first (its tag and words), so a
    /// loop over scattered values overlaps their cache misses.
    pub fn prefetch_value(&self, id: ValueId) {
        let i = id as usize;
        if i < self.tags.len() && i < self.lo.len() && i < self.hi.len() {
            prefetch(&self.tags[i]);
            prefetch(&self.lo[i]);
            prefetch(&self.hi[i]);
        }
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
    pub fn write(&self, out: &mut blob::Spool) {
        rmp::encode::write_map_len(out, 2 * 6).expect("a spool takes every write");
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
        let ragged = |e: RaggedColumn| Invalid(e.to_string());
        let store = Store {
            text: Column::from_blob(file, "text", blobs.text.0).map_err(ragged)?,
            text_ends: Column::from_blob(file, "text_ends", blobs.text_ends.0).map_err(ragged)?,
            tags: Column::from_blob(file, "tags", blobs.tags.0).map_err(ragged)?,
            lo: Column::from_blob(file, "lo", blobs.lo.0).map_err(ragged)?,
            hi: Column::from_blob(file, "hi", blobs.hi.0).map_err(ragged)?,
            children: Column::from_blob(file, "children", blobs.children.0).map_err(ragged)?,
        };
        store.validate()?;
        Ok(store)
    }

    /// Checks a decoded store: the text, then every value. A large store's object
    /// keys are checked on a second thread while this one checks the rest (a
    /// snapshot's first answer waits for this); either way the error reported is
    /// the first in value order, as one pass would find it.
    fn validate(&self) -> Result<(), Invalid> {
        self.validate_with(self.tags.len() >= VALIDATE_IN_PARALLEL_FROM)
    }

    fn validate_with(&self, parallel: bool) -> Result<(), Invalid> {
        let (keys, values) = if !parallel {
            (self.check_text().map(|()| self.check_keys()), self.check_values())
        } else {
            std::thread::scope(|scope| {
                let keys = scope.spawn(|| self.check_text().map(|()| self.check_keys()));
                let values = self.check_values();
                // A panic there is a bug, not a bad file: refuse the store all the same.
                let keys = keys.join().unwrap_or_else(|_| Err(Invalid("checking the keys failed".into())));
                (keys, values)
            })
        };
        match (keys?, values) {
            (Some(a), Some(b)) => Err(if a.0 <= b.0 { a.1 } else { b.1 }),
            (Some(first), None) | (None, Some(first)) => Err(first.1),
            (None, None) => Ok(()),
        }
    }

    /// All the text UTF-8 and every string ending on a character boundary: then
    /// each string is UTF-8 (one pass over the text, not one call per string). The
    /// text is checked a chunk at a time and each chunk's string ends while it is
    /// still in the cache, so a large snapshot's text (17 MB) is read once, not
    /// twice. The errors are those of one check of the whole text, then of its ends.
    fn check_text(&self) -> Result<(), Invalid> {
        let text: &[u8] = &self.text;
        let not_utf8 = |from: usize| {
            let at = from + std::str::from_utf8(&text[from..]).err().map_or(0, |e| e.valid_up_to());
            Err(Invalid(format!("the text is not UTF-8 at byte {at}")))
        };
        let mut ends = self.text_ends.iter().map(|&end| end as usize).enumerate().peekable();
        let mut misplaced: Option<String> = None;
        let (mut start, mut checked) = (0, 0);
        loop {
            let mut stop = (checked + TEXT_CHUNK).min(text.len());
            if stop < text.len() {
                // A chunk ends before a character's first byte, never inside one; a
                // character has at most three bytes after its first.
                match (stop - 3..=stop).rev().find(|&at| text[at] & 0xc0 != 0x80) {
                    Some(first_byte) => stop = first_byte,
                    None => return not_utf8(checked),
                }
            }
            if std::str::from_utf8(&text[checked..stop]).is_err() {
                return not_utf8(checked);
            }
            // The ends in this chunk; at the end of the text, every end left.
            while let Some(&(i, end)) = ends.peek() {
                if end > stop && stop < text.len() {
                    break;
                }
                ends.next();
                if misplaced.is_some() {
                    continue;
                }
                if end < start || end > text.len() {
                    misplaced = Some(format!("string {i} ends at {end}, outside {start}..{}", text.len()));
                } else if text.get(end).is_some_and(|&b| b & 0xc0 == 0x80) {
                    misplaced = Some(format!("string {i} ends inside a character"));
                } else {
                    start = end;
                }
            }
            if stop == text.len() {
                break;
            }
            checked = stop;
        }
        if let Some(why) = misplaced {
            return Err(Invalid(why));
        }
        if start != text.len() {
            return Err(Invalid(format!("{} bytes of text after the last string", text.len() - start)));
        }
        Ok(())
    }

    /// Every value but its object keys: tags, constants, numbers, string ids,
    /// children in range and earlier, depth. The first failure, and where.
    fn check_values(&self) -> Option<Failure> {
        let fail = |id: usize, step: usize, what: String| Some(((id, step), Invalid(what)));
        let n = self.tags.len();
        if self.lo.len() != n || self.hi.len() != n {
            return fail(0, 0, format!("{n} tags but {} and {} value words", self.lo.len(), self.hi.len()));
        }
        let constants = [(Tag::Null, 0, 0), (Tag::Bool, 0, 0), (Tag::Bool, 1, 0), (Tag::Object, 0, 0)];
        if n < constants.len() {
            return fail(0, 0, format!("{n} values, fewer than the {} constants", constants.len()));
        }
        const _: () = assert!(MAX_DEPTH < u8::MAX as u32);
        let mut depth = vec![0u8; n];
        for id in 0..n {
            let Some(tag) = Tag::from_u8(self.tags[id]) else {
                return fail(id, 0, format!("value {id} has unknown tag {}", self.tags[id]));
            };
            let slot = Slot { tag, lo: self.lo[id], hi: self.hi[id] };
            depth[id] = 1;
            if let Some(&(t, lo, hi)) = constants.get(id) {
                if (slot.tag, slot.lo, slot.hi) != (t, lo, hi) {
                    return fail(id, 0, format!("value {id} is not the constant {t:?}"));
                }
                continue;
            }
            match tag {
                Tag::Null | Tag::Bool => return fail(id, 0, format!("value {id} repeats a constant")),
                Tag::Int | Tag::UInt => {}
                Tag::Float => {
                    if !f64::from_bits(slot.bits()).is_finite() {
                        return fail(id, 0, format!("value {id} is a float that is not finite"));
                    }
                }
                Tag::Str => {
                    if slot.lo as usize >= self.text_ends.len() {
                        return fail(id, 0, format!("value {id} names string {}, past the end", slot.lo));
                    }
                }
                Tag::Array | Tag::Object => {
                    let Some(children) = self.children_of(slot) else {
                        return fail(id, 0, format!("value {id} has children past the end"));
                    };
                    // Branch-free over the children: the latest id and the deepest
                    // child, then one test (the failing child looked for only then).
                    let (first, stride) = if tag == Tag::Object { (1, 2) } else { (0, 1) };
                    let values = || children.iter().enumerate().skip(first).step_by(stride);
                    let (latest, deepest) = values().fold((0u32, 0u8), |(latest, deepest), (_, &child)| {
                        (latest.max(child), deepest.max(depth.get(child as usize).copied().unwrap_or(0)))
                    });
                    if latest as usize >= id {
                        let (k, child) = values().find(|(_, &child)| child as usize >= id).expect("the latest child");
                        return fail(id, k + 1, format!("value {id} refers to value {child}, not an earlier one"));
                    }
                    depth[id] = deepest + 1;
                    if depth[id] as u32 > MAX_DEPTH {
                        return fail(id, children.len() + 1, format!("value {id} nests deeper than {MAX_DEPTH}"));
                    }
                }
            }
        }
        None
    }

    /// Every object's keys: strings of the store, in strictly increasing order.
    /// Only after [`Store::check_text`]; objects whose children are out of range
    /// are [`Store::check_values`]'s to report.
    fn check_keys(&self) -> Option<Failure> {
        // Servers share their key sequences: the last two keys found to follow each
        // key spare comparing the same two strings again for every server. (10,000
        // servers have 303 distinct pairs of neighbour keys in 2.3 million; one
        // remembered key missed 211,000 times as sequences alternate, two 35,000.)
        let mut checked_next = vec![[u32::MAX; 2]; self.text_ends.len()];
        let values = self.tags.len().min(self.lo.len()).min(self.hi.len());
        for id in 0..values {
            if self.tags[id] != Tag::Object as u8 {
                continue;
            }
            let slot = Slot { tag: Tag::Object, lo: self.lo[id], hi: self.hi[id] };
            let Some(children) = self.children_of(slot) else { continue };
            let mut previous_key: Option<StrId> = None;
            for (k, &key) in children.iter().enumerate().step_by(2) {
                if key as usize >= self.text_ends.len() {
                    return Some(((id, k + 1), Invalid(format!("value {id} has key string {key}, past the end"))));
                }
                if let Some(previous) = previous_key.filter(|&p| !checked_next[p as usize].contains(&key)) {
                    if self.str(previous) >= self.str(key) {
                        let text = self.str(key);
                        let why = format!("value {id} has keys out of order or repeated ('{text}')");
                        return Some(((id, k + 1), Invalid(why)));
                    }
                    let next = &mut checked_next[previous as usize];
                    *next = [key, next[0]];
                }
                previous_key = Some(key);
            }
        }
        None
    }

    /// A container's children, if they are within the array.
    fn children_of(&self, slot: Slot) -> Option<&[u32]> {
        let width = if slot.tag == Tag::Object { 2 } else { 1 };
        let end = (slot.lo as usize).checked_add(slot.hi as usize * width)?;
        self.children.get(slot.lo as usize..end)
    }
}

/// A hint to the CPU to load `value`'s cache line; no effect on what is read.
fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults nor changes memory, and SSE, which it needs,
    // is part of every x86_64 CPU.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// Where a check failed (value id, then 0 for the value itself or 1 + the child's
/// place), and why: the lowest is the first a single pass meets.
type Failure = ((usize, usize), Invalid);

/// Bytes of text [`Store::check_text`] checks at a time: well within a core's L2.
const TEXT_CHUNK: usize = 1 << 16;

/// Values from which a store is checked on two threads.
const VALIDATE_IN_PARALLEL_FROM: usize = 1 << 16;

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
