//! Building a store: interning strings and hash-consing values.

use super::recent::{Found, Recent, NONE};
use super::{Slot, Store, StrId, Tag, ValueId, EMPTY_OBJECT, FALSE, NULL, TRUE};
use hashbrown::hash_table::{Entry, HashTable};
use hashbrown::DefaultHashBuilder;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::hash::{BuildHasher, Hasher};

/// Adds values to a store; each distinct string and value gets one id.
///
/// The tables hash with a per-process random seed (hashbrown's default, foldhash), so
/// facts crafted to collide on one master do not collide on another.
pub struct Builder {
    store: Store,
    hasher: DefaultHashBuilder,
    strings: IdTable,
    values: IdTable,
    /// The value id of each string id that is also a string value.
    string_values: Vec<ValueId>,
    /// Children of the containers being built, innermost last.
    scratch: Vec<u32>,
    /// Short strings given already, found again before the tables.
    recent: Recent,
    /// Key pairs known to be in order, for [`Builder::close_object`].
    ordered: OrderedPairs,
}

/// A builder's tables without its store: what [`Builder::resume`] needs to go on
/// adding to the store it made.
pub struct Tables {
    hasher: DefaultHashBuilder,
    strings: IdTable,
    values: IdTable,
    string_values: Vec<ValueId>,
}

/// Ids by content: a table of ids, and each id's hash in id order, so growing the
/// table rehashes from that array rather than from the strings and children
/// (mostly out of the cache: that was half the cost of merging shares).
#[derive(Default)]
struct IdTable {
    ids: HashTable<u32>,
    /// The hash of id `i`, at `i`: every id of the store was added here, in order.
    hashes: Vec<u32>,
}

impl IdTable {
    fn len(&self) -> usize {
        self.ids.len()
    }

    fn clear(&mut self) {
        self.ids.clear();
        self.hashes.clear();
    }

    fn reserve(&mut self, additional: usize) {
        let hashes = &self.hashes;
        self.ids.reserve(additional, |&id| widen(hashes[id as usize]));
        self.hashes.reserve(additional);
    }

    /// The id for which `same` holds among those hashing to `hash`, or else the one
    /// `add` gives (the next id of `store`), kept.
    fn find_or_add(
        &mut self,
        hash: u32,
        store: &mut Store,
        mut same: impl FnMut(&Store, u32) -> bool,
        add: impl FnOnce(&mut Store) -> u32,
    ) -> u32 {
        let IdTable { ids, hashes } = self;
        let found = ids.entry(widen(hash), |&id| same(store, id), |&id| widen(hashes[id as usize]));
        match found {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                let id = add(store);
                debug_assert_eq!(id as usize, hashes.len());
                e.insert(id);
                hashes.push(hash);
                id
            }
        }
    }
}

/// What the tables are given for a 32-bit hash: the same bits high and low, so the
/// bucket (low bits) and the tag hashbrown keeps per entry (top bits) both come from it.
fn widen(hash: u32) -> u64 {
    u64::from(hash) * 0x0000_0001_0000_0001
}

/// The 32 bits kept of a 64-bit hash.
fn narrow(hash: u64) -> u32 {
    (hash >> 32) as u32
}

impl Tables {
    /// Whether these are the tables of `store`: as many strings and values.
    pub fn fit(&self, store: &Store) -> bool {
        self.strings.len() == store.strings() && self.values.len() == store.values()
    }
}

impl std::fmt::Debug for Tables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tables").field("strings", &self.strings.len()).field("values", &self.values.len()).finish()
    }
}

/// What [`Builder::absorb`] made of another store's ids.
pub struct Remap {
    pub strings: Vec<StrId>,
    pub values: Vec<ValueId>,
}

impl Default for Builder {
    fn default() -> Builder {
        Builder::new()
    }
}

impl Builder {
    pub fn new() -> Builder {
        let mut builder = Builder {
            store: Store::default(),
            hasher: DefaultHashBuilder::default(),
            strings: IdTable::default(),
            values: IdTable::default(),
            string_values: Vec::new(),
            scratch: Vec::new(),
            recent: Recent::new(),
            ordered: OrderedPairs::new(),
        };
        builder.add_constants();
        builder
    }

    fn add_constants(&mut self) {
        for (id, slot) in [
            (NULL, Slot { tag: Tag::Null, lo: 0, hi: 0 }),
            (FALSE, Slot { tag: Tag::Bool, lo: 0, hi: 0 }),
            (TRUE, Slot { tag: Tag::Bool, lo: 1, hi: 0 }),
            (EMPTY_OBJECT, Slot { tag: Tag::Object, lo: 0, hi: 0 }),
        ] {
            let added = self.intern_slot(slot, &[]);
            debug_assert_eq!(added, id);
        }
    }

    /// Empties the builder, as new, but keeps its arrays' and tables' room: a reader
    /// building one share after another neither grows them again each time nor
    /// leaves the allocator freed memory it keeps resident.
    pub fn clear(&mut self) {
        self.store.clear();
        self.strings.clear();
        self.values.clear();
        self.string_values.clear();
        self.scratch.clear();
        self.recent.clear();
        self.ordered.clear();
        self.add_constants();
    }

    /// Room for as much again as `like` holds.
    fn reserve(&mut self, like: &Store) {
        let (values, strings) = (like.values(), like.strings());
        let store = &mut self.store;
        store.text.reserve(like.text.len());
        store.text_ends.reserve(strings);
        store.tags.reserve(values);
        store.lo.reserve(values);
        store.hi.reserve(values);
        store.children.reserve(like.children.len());
        self.strings.reserve(strings);
        self.values.reserve(values);
        self.string_values.reserve(strings);
    }

    /// Takes the tables out, for [`Builder::resume`] on the finished store later;
    /// this builder can then no longer add anything.
    pub fn take_tables(&mut self) -> Tables {
        Tables {
            hasher: self.hasher,
            strings: std::mem::take(&mut self.strings),
            values: std::mem::take(&mut self.values),
            string_values: std::mem::take(&mut self.string_values),
        }
    }

    /// A builder that goes on from `store` (sharing its arrays and appending past
    /// them: the store an index serves is never changed) with the `tables` taken from the builder that
    /// made it, so a refresh that changes a few servers adds only theirs. Every id
    /// of `store` stays valid.
    pub fn resume(store: &Store, tables: Tables) -> Builder {
        let Tables { hasher, strings, values, string_values } = tables;
        // Shares `store`'s arrays: this builder appends past them (see `Column`).
        Builder {
            store: store.clone(),
            hasher,
            strings,
            values,
            string_values,
            scratch: Vec::new(),
            recent: Recent::new(),
            ordered: OrderedPairs::new(),
        }
    }

    /// The store built, its arrays sealed for the next builder to resume from.
    pub fn finish(mut self) -> Store {
        let store = &mut self.store;
        for v in [&mut store.text_ends, &mut store.lo, &mut store.hi, &mut store.children] {
            v.seal();
        }
        store.text.seal();
        store.tags.seal();
        self.store
    }

    /// The store so far, to read what was added.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn string(&mut self, s: &str) -> StrId {
        let Ok(id) = self.recent_or(s.as_bytes(), false, |_| Ok::<_, Infallible>(Cow::Borrowed(s)));
        id
    }

    /// [`Builder::string`] of `bytes` as UTF-8, invalid sequences replaced.
    pub fn string_lossy(&mut self, bytes: &[u8]) -> StrId {
        let Ok(id) = self.recent_or(bytes, false, |b| Ok::<_, Infallible>(lossy_text(b)));
        id
    }

    /// [`Builder::string_value`] of `bytes` as UTF-8, invalid sequences replaced.
    pub fn string_value_lossy(&mut self, bytes: &[u8]) -> ValueId {
        let Ok(id) = self.recent_or(bytes, true, |b| Ok::<_, Infallible>(lossy_text(b)));
        id
    }

    /// [`Builder::string`] of `bytes`, or `None` when they are not UTF-8; checked only
    /// when they are not among the recent strings (which are).
    pub fn string_checked(&mut self, bytes: &[u8]) -> Option<StrId> {
        self.recent_or(bytes, false, |b| utf8(b).map(Cow::Borrowed)).ok()
    }

    /// [`Builder::string_value`] of `bytes`, or `None` when they are not UTF-8.
    pub fn string_value_checked(&mut self, bytes: &[u8]) -> Option<ValueId> {
        self.recent_or(bytes, true, |b| utf8(b).map(Cow::Borrowed)).ok()
    }

    /// The string id (or, `as_value`, the string value's id) of `text(bytes)`,
    /// found by `bytes` among the recent strings first.
    fn recent_or<'a, E>(
        &mut self,
        bytes: &'a [u8],
        as_value: bool,
        text: impl FnOnce(&'a [u8]) -> Result<Cow<'a, str>, E>,
    ) -> Result<u32, E> {
        Ok(match self.recent.find(bytes) {
            Found::Hit { string, .. } if !as_value => string,
            Found::Hit { value, .. } if value != NONE => value,
            Found::Hit { at, string, .. } => {
                let value = self.string_value_of(string);
                self.recent.set_value(at, value);
                value
            }
            Found::Miss { at } => {
                let text = text(bytes)?;
                // Only bytes that are their own text are kept: a hit then proves them
                // UTF-8, whichever of the methods above finds them.
                let kept = at.filter(|_| matches!(text, Cow::Borrowed(_)));
                let string = self.intern_string(&text);
                let value = if as_value { self.string_value_of(string) } else { NONE };
                if let Some(at) = kept {
                    self.recent.put(at, bytes, string, value);
                }
                if as_value {
                    value
                } else {
                    string
                }
            }
        })
    }

    fn intern_string(&mut self, s: &str) -> StrId {
        let hash = narrow(self.hasher.hash_one(s.as_bytes()));
        let text = s.as_bytes();
        self.strings.find_or_add(
            hash,
            &mut self.store,
            |store, id| store_str_bytes(store, id) == text,
            |store| {
                let id = store.text_ends.len() as StrId;
                store.text.extend_from_slice(text);
                let end = store.text.len() as u32;
                store.text_ends.push(end);
                id
            },
        )
    }

    /// Adds a JSON value. Its depth is the caller's bound: every fact reader limits it
    /// (and [`super::MAX_DEPTH`] is above all of theirs).
    pub fn value(&mut self, value: &Value) -> ValueId {
        match value {
            Value::Null => NULL,
            Value::Bool(false) => FALSE,
            Value::Bool(true) => TRUE,
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    self.int(i)
                } else if let Some(u) = n.as_u64() {
                    self.uint(u)
                } else {
                    self.float(n.as_f64().unwrap_or(0.0))
                }
            }
            Value::String(s) => self.string_value(s),
            Value::Array(items) => {
                let mark = self.scratch.len();
                for item in items {
                    let id = self.value(item);
                    self.scratch.push(id);
                }
                self.close(Tag::Array, mark)
            }
            Value::Object(map) => {
                let mark = self.scratch.len();
                for (key, item) in map {
                    let key = self.string(key);
                    let id = self.value(item);
                    self.scratch.extend([key, id]);
                }
                self.close(Tag::Object, mark)
            }
        }
    }

    /// An object from pairs already in key order (a serde_json map's order).
    pub fn object<'a>(&mut self, pairs: impl IntoIterator<Item = (&'a str, &'a Value)>) -> ValueId {
        let mark = self.scratch.len();
        for (key, item) in pairs {
            let key = self.string(key);
            let id = self.value(item);
            self.scratch.extend([key, id]);
        }
        self.close(Tag::Object, mark)
    }

    pub fn int(&mut self, i: i64) -> ValueId {
        self.intern_slot(Slot::of_bits(Tag::Int, i as u64), &[])
    }

    /// An unsigned integer: as serde_json keeps it, an `Int` when it fits one.
    pub fn uint(&mut self, u: u64) -> ValueId {
        match i64::try_from(u) {
            Ok(i) => self.int(i),
            Err(_) => self.intern_slot(Slot::of_bits(Tag::UInt, u), &[]),
        }
    }

    /// A float; a reader passes only finite ones (JSON and Marshal have no others
    /// that a fact can hold, and [`Store::validate`] refuses them).
    pub fn float(&mut self, f: f64) -> ValueId {
        debug_assert!(f.is_finite());
        self.intern_slot(Slot::of_bits(Tag::Float, f.to_bits()), &[])
    }

    /// Where the children of a container being decoded start: push them with
    /// [`Builder::push_child`] (an object's as key, value), then close it.
    pub fn open(&self) -> usize {
        self.scratch.len()
    }

    pub fn push_child(&mut self, id: u32) {
        self.scratch.push(id);
    }

    pub fn close_array(&mut self, mark: usize) -> ValueId {
        self.close(Tag::Array, mark)
    }

    /// Closes an object whose pairs came in document order: sorted by key, and of a
    /// key given twice the last value kept (as a serde_json map would).
    pub fn close_object(&mut self, mark: usize) -> ValueId {
        let Builder { store, scratch, ordered, .. } = self;
        let store = &*store;
        let key = |id: u32| store_str_bytes(store, id);
        let pairs = &scratch[mark..];
        let in_order = pairs
            .chunks_exact(2)
            .zip(pairs.chunks_exact(2).skip(1))
            .all(|(a, b)| ordered.known(a[0], b[0]) || ordered.learn(a[0], b[0], key(a[0]) < key(b[0])));
        if !in_order {
            let mut sorted: Vec<(u32, u32)> = pairs.chunks_exact(2).map(|p| (p[0], p[1])).collect();
            sorted.sort_by(|a, b| key(a.0).cmp(key(b.0)));
            self.scratch.truncate(mark);
            for (k, v) in sorted {
                match self.scratch[mark..].len() {
                    n if n >= 2 && self.scratch[mark + n - 2] == k => self.scratch[mark + n - 1] = v,
                    _ => self.scratch.extend([k, v]),
                }
            }
        }
        self.close(Tag::Object, mark)
    }

    /// Forgets the children pushed since `mark` (a decode that failed half way).
    /// What was interned stays, unreferenced.
    pub fn discard_open(&mut self, mark: usize) {
        self.scratch.truncate(mark);
    }

    /// Copies value `id` of another store into this one; `memo` maps the other
    /// store's ids already copied, so a value shared by many servers is copied once.
    pub fn import(&mut self, from: &Store, id: ValueId, memo: &mut HashMap<ValueId, ValueId>) -> ValueId {
        if let Some(&done) = memo.get(&id) {
            return done;
        }
        let slot = from.slot(id);
        let copied = match slot.tag {
            Tag::Str => self.string_value(from.str(slot.lo)),
            Tag::Array | Tag::Object => {
                let mark = self.scratch.len();
                for (i, &child) in from.children[slot.children()].iter().enumerate() {
                    let child = if slot.tag == Tag::Object && i % 2 == 0 {
                        self.string(from.str(child))
                    } else {
                        // Children have smaller ids: the recursion is bounded by MAX_DEPTH.
                        self.import(from, child, memo)
                    };
                    self.scratch.push(child);
                }
                self.close(slot.tag, mark)
            }
            _ => self.intern_slot(slot, &[]),
        };
        memo.insert(id, copied);
        copied
    }

    /// Copies every value of `other` (another builder's store) into this one, giving
    /// for each of its value ids and string ids the id here. Children come before
    /// their containers, so one pass in id order suffices.
    pub fn absorb(&mut self, other: &Store) -> Remap {
        self.reserve(other);
        let strings: Vec<StrId> = (0..other.strings() as StrId).map(|id| self.string(other.str(id))).collect();
        let mut values: Vec<ValueId> = Vec::with_capacity(other.values());
        for id in 0..other.values() as ValueId {
            let slot = other.slot(id);
            let copied = match slot.tag {
                Tag::Str => self.string_value_of(strings[slot.lo as usize]),
                Tag::Array | Tag::Object => {
                    let mark = self.scratch.len();
                    for (i, &child) in other.children[slot.children()].iter().enumerate() {
                        let object_key = slot.tag == Tag::Object && i % 2 == 0;
                        self.scratch.push(if object_key { strings[child as usize] } else { values[child as usize] });
                    }
                    self.close(slot.tag, mark)
                }
                _ => self.intern_slot(slot, &[]),
            };
            values.push(copied);
        }
        Remap { strings, values }
    }

    pub fn string_value(&mut self, s: &str) -> ValueId {
        let Ok(id) = self.recent_or(s.as_bytes(), true, |_| Ok::<_, Infallible>(Cow::Borrowed(s)));
        id
    }

    fn string_value_of(&mut self, sid: StrId) -> ValueId {
        if let Some(&id) = self.string_values.get(sid as usize).filter(|&&id| id != NONE) {
            return id;
        }
        let id = self.intern_slot(Slot { tag: Tag::Str, lo: sid, hi: 0 }, &[]);
        if self.string_values.len() <= sid as usize {
            self.string_values.resize(sid as usize + 1, NONE);
        }
        self.string_values[sid as usize] = id;
        id
    }

    /// Interns the container whose children were pushed on `scratch` since `mark`.
    fn close(&mut self, tag: Tag, mark: usize) -> ValueId {
        let scratch = std::mem::take(&mut self.scratch);
        let width = if tag == Tag::Object { 2 } else { 1 };
        let count = ((scratch.len() - mark) / width) as u32;
        let id = self.intern_slot(Slot { tag, lo: 0, hi: count }, &scratch[mark..]);
        self.scratch = scratch;
        self.scratch.truncate(mark);
        id
    }

    /// The id of `slot` (for containers, with `children`), added when new.
    fn intern_slot(&mut self, slot: Slot, children: &[u32]) -> ValueId {
        let hash = narrow(slot_hash(&self.hasher, slot.tag, slot.lo, slot.hi, children));
        self.values.find_or_add(
            hash,
            &mut self.store,
            |store, id| same_value(store, id, slot, children),
            |store| {
                let id = store.tags.len() as ValueId;
                let lo = if is_container(slot.tag) {
                    let start = store.children.len() as u32;
                    store.children.extend_from_slice(children);
                    start
                } else {
                    slot.lo
                };
                store.tags.push(slot.tag as u8);
                store.lo.push(lo);
                store.hi.push(slot.hi);
                id
            },
        )
    }
}

/// Pairs of string ids whose texts are known to be in order (the first before the
/// second), in a small direct-mapped table: fleets repeat the same objects (`os`,
/// `processors`, each interface) with the same keys, so the texts of most pairs a
/// reader closes were compared before; comparing them again was most of closing
/// an object. Ids are the builder's own, so [`Builder::clear`] forgets them.
struct OrderedPairs {
    slots: Box<[u64]>,
}

impl OrderedPairs {
    const SLOTS_LOG2: u32 = 12;
    /// No pair: a string is never before itself.
    const EMPTY: u64 = u64::MAX;

    fn new() -> OrderedPairs {
        OrderedPairs { slots: vec![Self::EMPTY; 1 << Self::SLOTS_LOG2].into_boxed_slice() }
    }

    fn clear(&mut self) {
        self.slots.fill(Self::EMPTY);
    }

    fn slot(pair: u64) -> usize {
        (pair.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - Self::SLOTS_LOG2)) as usize
    }

    fn known(&self, first: StrId, second: StrId) -> bool {
        let pair = (u64::from(first) << 32) | u64::from(second);
        self.slots[Self::slot(pair)] == pair
    }

    /// `in_order`, remembered when true.
    fn learn(&mut self, first: StrId, second: StrId, in_order: bool) -> bool {
        if in_order {
            let pair = (u64::from(first) << 32) | u64::from(second);
            self.slots[Self::slot(pair)] = pair;
        }
        in_order
    }
}

fn is_container(tag: Tag) -> bool {
    matches!(tag, Tag::Array | Tag::Object)
}

/// `bytes` as text if they are UTF-8: ASCII (nearly every fact) checked a word at a
/// time first. `from_utf8` goes byte by byte up to its first aligned word, which
/// for the short strings facts are is all of them: it was 5 % of reading an
/// inventory.
fn utf8(bytes: &[u8]) -> Result<&str, std::str::Utf8Error> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is UTF-8.
        Ok(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes)
    }
}

/// Bytes as UTF-8 text, invalid sequences replaced: checked the fast way first
/// (`from_utf8_lossy` walks every byte even when all are valid).
pub fn lossy_text(bytes: &[u8]) -> Cow<'_, str> {
    match utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

fn store_str_bytes(store: &Store, id: StrId) -> &[u8] {
    let end = store.text_ends[id as usize] as usize;
    let start = if id == 0 { 0 } else { store.text_ends[id as usize - 1] as usize };
    &store.text[start..end]
}

fn same_value(store: &Store, id: ValueId, slot: Slot, children: &[u32]) -> bool {
    let have = store.slot(id);
    if have.tag != slot.tag || have.hi != slot.hi {
        return false;
    }
    if is_container(slot.tag) {
        store.children[have.children()] == *children
    } else {
        have.lo == slot.lo
    }
}

fn slot_hash(hasher: &DefaultHashBuilder, tag: Tag, lo: u32, hi: u32, children: &[u32]) -> u64 {
    // The tag and both words as one: a number's 64 bits fill `lo` and `hi`, and the
    // tag only tells apart values whose bits agree (an int and a float).
    let head = (u64::from(hi) << 32 | u64::from(lo)).rotate_left(3) ^ tag as u64;
    if children.is_empty() {
        return hasher.hash_one(head);
    }
    let mut h = hasher.build_hasher();
    h.write_u64(head);
    // As one byte slice: one write, not one per child.
    h.write(bytemuck_u32s(children));
    h.finish()
}

fn bytemuck_u32s(words: &[u32]) -> &[u8] {
    // SAFETY: u32 has no padding and any byte pattern is a valid u8; the length is
    // the same memory, in bytes.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words)) }
}
