//! Servers to Ruby: each server a deep-frozen Hash, built once per index generation
//! and shared by every later call, as are its fact names and every value many
//! servers have in common (an `os` Hash, a domain).
//!
//! A server is built under one `rb_protect` with raw C calls, not one protected call
//! per object: the protected calls were a third of a server's cost. Nothing between
//! that `rb_protect` and the C calls holds a value with a destructor (the frames
//! hold `Copy` values and borrows), so a Ruby exception (only `NoMemoryError` can
//! come from these calls) skips nothing that needed to run.

use crate::template;
use magnus::rb_sys::{protect, AsRawValue, FromRawValue};
use magnus::value::{Lazy, ReprValue};
use magnus::{Error, RArray, RHash, RString, Ruby, Value};
use puppet_kicker::api::{Entry, Failure, IdCounts, Selected, Server};
use puppet_kicker::store::{Kind, StrId, View};
use rb_sys::{
    rb_ary_cat, rb_ary_new_from_values, rb_hash_bulk_insert, rb_hash_new, rb_obj_freeze, rb_str_new, rb_utf8_encindex,
    ruby_encoding_consts, Qfalse, Qnil, Qtrue, RARRAY_CONST_PTR, RARRAY_LEN, VALUE,
};
use rustc_hash::FxHashMap;
use std::os::raw::{c_char, c_long};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// The generation's objects, in the order they were made, in a new Array every
/// generation (see [`Converter::new`]): it keeps them alive, and where the GC moves
/// one it updates the Array, so the binding keeps positions in it ([`Made`]), never
/// addresses.
static OBJECTS: Lazy<RArray> = Lazy::new(|ruby| ruby.ary_new_from_values(&[ruby.ary_new()]));
/// Frozen result Arrays by answer id ([`Selected::answer_id`]): an identical call
/// within a generation returns the very Array it returned before.
static ANSWERS: Lazy<RHash> = Lazy::new(|ruby| ruby.hash_new());
/// The name of the `certname` a server gets when no fact has that name.
static CERTNAME: Lazy<RString> = Lazy::new(|ruby| {
    let name = ruby.str_new("certname");
    name.freeze();
    name
});
/// Where each object of the generation is in `OBJECTS`.
static MADE: Mutex<Made> = Mutex::new(Made::new());

/// What one index generation has converted, by where each object is in `OBJECTS`
/// (its slot), in tables by id:
/// - servers' Hashes by position in their index;
/// - values by store id: equal values have one id, so each is built once;
/// - fact names by string id, frozen, so a Hash keeps them as they are (a Hash
///   copies an unfrozen String key);
///
/// and the template Hash of each key sequence ([`template`]).
///
/// The tables are kept from one generation to the next and never cleared, which
/// would cost a generation's first call a pass over every id: an entry is `base +
/// slot + 1`, and an entry at or below the generation's `base` is an earlier
/// generation's, so none.
struct Made {
    generation: u64,
    base: u32,
    /// Above every entry written so far: the next generation's base.
    next: u32,
    /// By [`Table`].
    tables: [Vec<u32>; 3],
    /// None until the generation's first template (a `const` Mutex cannot make one).
    templates: Option<FxHashMap<Box<[StrId]>, u32>>,
}

/// One of [`Made`]'s tables, the index of its entry in `Made::tables`.
#[derive(Clone, Copy)]
enum Table {
    Servers = 0,
    Values = 1,
    Keys = 2,
}

impl Made {
    const fn new() -> Made {
        Made { generation: 0, base: 0, next: 0, tables: [Vec::new(), Vec::new(), Vec::new()], templates: None }
    }

    /// Forgets what earlier generations made, for `generation`, whose index has
    /// these ids (the tables grow to them, zeroed).
    fn start(&mut self, generation: u64, ids: IdCounts) {
        self.generation = generation;
        self.templates = None;
        self.base = self.next;
        if self.base > u32::MAX / 2 {
            self.tables.iter_mut().for_each(|table| table.fill(0));
            (self.base, self.next) = (0, 0);
        }
        let lens = [ids.positions, ids.values, ids.names];
        for (table, len) in self.tables.iter_mut().zip(lens) {
            if table.len() < len {
                table.resize(len, 0);
            }
        }
    }

    /// Forgets what this generation made (after a failed conversion).
    fn restart(&mut self) {
        (self.base, self.templates) = (self.next, None);
    }

    /// The slot of the object made for `id`, if this generation made one.
    fn slot(&self, table: Table, id: usize) -> Option<u32> {
        let entry = *self.tables[table as usize].get(id)?;
        (entry > self.base).then(|| entry - self.base - 1)
    }

    fn set(&mut self, table: Table, id: usize, slot: u32) {
        // A generation's slots are below 2^31 (as many objects would be 16 GiB of
        // references), and its base at most half of u32::MAX (see `start`).
        let entry = self.base.checked_add(slot).and_then(|e| e.checked_add(1)).expect("fewer than 2^31 objects");
        let entries = &mut self.tables[table as usize];
        if id >= entries.len() {
            // Not for ids of the generation's index, which the tables hold.
            entries.resize(id + 1, 0);
        }
        entries[id] = entry;
        self.next = self.next.max(entry);
    }
}

/// What one call converts with: the caches of the selection's generation, with the
/// garbage collector held off, so that objects kept only on the Rust stack below
/// (until they are in their Hash or Array, or in `OBJECTS`) are neither freed nor
/// moved.
pub struct Converter<'r> {
    ruby: &'r Ruby,
    made: MutexGuard<'static, Made>,
    objects: Objects,
    was_disabled: bool,
    /// Pairs and items waiting for their container, innermost last.
    stack: Vec<VALUE>,
    /// The key ids of the pairs on `stack`, which pick a Hash's template.
    key_ids: Vec<StrId>,
}

impl<'r> Converter<'r> {
    /// Drops what was converted for an earlier index generation than `selected`'s.
    pub fn new(ruby: &'r Ruby, selected: &Selected) -> Result<Converter<'r>, Error> {
        // Only the thread holding the GVL converts, and one converter at a time. A
        // panic that dropped a converter (caught by `entry`) left the tables as they
        // were, maybe naming objects that never reached `OBJECTS`: start over.
        let mut made = match MADE.try_lock() {
            Ok(made) => made,
            Err(TryLockError::Poisoned(poisoned)) => {
                let mut made = poisoned.into_inner();
                *made = Made::new();
                MADE.clear_poison();
                made
            }
            Err(TryLockError::WouldBlock) => return Err(crate::raise(ruby, Failure::internal("converter busy"))),
        };
        let holder = ruby.get_inner(&OBJECTS);
        if made.generation != selected.generation() {
            // A new Array rather than a cleared one: young, appending to it costs
            // the write barrier's quick test only (storing a new object into an old
            // Array, as the old one was by then, takes its slow path), until GCs
            // age it; a generation's first call, the largest, runs before any.
            holder.store(0, ruby.ary_new())?;
            ruby.get_inner(&ANSWERS).clear()?;
            made.start(selected.generation(), selected.id_counts());
        }
        let was_disabled = ruby.gc_disable();
        let objects = Objects::new(holder.entry::<RArray>(0)?);
        let (stack, key_ids) = (Vec::with_capacity(1024), Vec::with_capacity(512));
        Ok(Converter { ruby, made, objects, was_disabled, stack, key_ids })
    }

    /// The frozen Array returned for this answer before, if any.
    pub fn kept_answer(&self, id: u64) -> Result<Option<Value>, Error> {
        if id == 0 {
            return Ok(None);
        }
        let kept: Value = self.ruby.get_inner(&ANSWERS).aref(id)?;
        Ok(Some(kept).filter(|v| !v.is_nil()))
    }

    /// Keeps `array` for this answer id (the core keeps at most `ANSWERS` a
    /// generation; older ids never come back).
    pub fn keep_answer(&self, id: u64, array: RArray) -> Result<(), Error> {
        if id == 0 {
            return Ok(());
        }
        let answers = self.ruby.get_inner(&ANSWERS);
        if answers.len() >= 2 * puppet_kicker::index::ANSWERS.get() {
            answers.clear()?;
        }
        answers.aset(id, array)
    }

    /// The server at `position` of `selected`'s index as a deep-frozen Hash.
    pub fn server(&mut self, selected: &Selected, position: u32) -> Result<Value, Error> {
        if let Some(slot) = self.made.slot(Table::Servers, position as usize) {
            return Ok(unsafe { Value::from_raw(self.objects.get(slot)) });
        }
        let Some(server) = selected.server_at(position) else {
            let what = format!("no server at position {position} of index {}", selected.generation());
            return Err(crate::raise(self.ruby, Failure::internal(what)));
        };
        let hash = self.protected(|build| {
            let (hash, slot) = build.server_hash(server);
            build.made.set(Table::Servers, position as usize, slot);
            build.objects.flush();
            hash
        })?;
        Ok(unsafe { Value::from_raw(hash) })
    }

    /// Runs `build` under one `rb_protect`; a panic in it is caught inside, so it
    /// never unwinds through Ruby's frames. After a failure the generation's tables
    /// are dropped: they may name objects that never reached `OBJECTS`.
    pub(crate) fn protected(&mut self, build: impl FnOnce(&mut Self) -> VALUE) -> Result<VALUE, Error> {
        let mut panic = None;
        let made = protect(|| match catch_unwind(AssertUnwindSafe(|| build(self))) {
            Ok(value) => value,
            Err(payload) => {
                panic = Some(payload);
                Qnil as VALUE
            }
        });
        self.stack.clear();
        self.key_ids.clear();
        if panic.is_some() || made.is_err() {
            self.made.restart();
            self.objects.pending.clear();
        }
        match panic {
            Some(payload) => Err(crate::raise(self.ruby, Failure::panic(&*payload))),
            None => made,
        }
    }

    /// The server's Hash, and its slot.
    fn server_hash(&mut self, server: Server) -> (VALUE, u32) {
        let base = (self.stack.len(), self.key_ids.len());
        for entry in server.entry_ids() {
            let (id, pair) = match entry {
                Entry::Value(id, value) => (id, [self.key(id, |id| server.name(id)), self.value(value)]),
                Entry::Certname(certname) => {
                    (template::CERTNAME_ID, [self.ruby.get_inner(&CERTNAME).as_raw(), frozen_str(certname)])
                }
            };
            self.stack.extend(pair);
            self.key_ids.push(id);
        }
        self.hash_from(base)
    }

    /// `object`, kept in `OBJECTS`, and its slot there.
    fn keep(&mut self, object: VALUE) -> (VALUE, u32) {
        (object, self.objects.push(object))
    }

    /// A fact name as a frozen String, made once per generation: its text is looked
    /// up only then.
    fn key<'s>(&mut self, id: StrId, text: impl FnOnce(StrId) -> &'s str) -> VALUE {
        if let Some(slot) = self.made.slot(Table::Keys, id as usize) {
            return self.objects.get(slot);
        }
        let (name, slot) = self.keep(frozen_str(text(id)));
        self.made.set(Table::Keys, id as usize, slot);
        name
    }

    /// A store value as a deep-frozen Ruby value, made once per generation.
    fn value(&mut self, value: View) -> VALUE {
        let id = value.id() as usize;
        if let Some(slot) = self.made.slot(Table::Values, id) {
            return self.objects.get(slot);
        }
        let (made, slot) = match value.kind() {
            Kind::Null => return Qnil as VALUE,
            Kind::Bool(b) => return (if b { Qtrue } else { Qfalse }) as VALUE,
            Kind::Int(i) => self.keep(self.ruby.integer_from_i64(i).as_raw()),
            Kind::UInt(u) => self.keep(self.ruby.integer_from_u64(u).as_raw()),
            Kind::Float(f) => self.keep(self.ruby.float_from_f64(f).as_raw()),
            Kind::Str(s) => self.keep(frozen_str(s)),
            Kind::Array(items) => {
                let base = self.stack.len();
                for item in items.iter() {
                    let item = self.value(item);
                    self.stack.push(item);
                }
                let items = &self.stack[base..];
                let array = unsafe { rb_obj_freeze(rb_ary_new_from_values(items.len() as c_long, items.as_ptr())) };
                self.stack.truncate(base);
                self.keep(array)
            }
            Kind::Object(object) => {
                let base = (self.stack.len(), self.key_ids.len());
                for (key_id, item) in object.ids() {
                    let pair = [self.key(key_id, |id| value.store().str(id)), self.value(item)];
                    self.stack.extend(pair);
                    self.key_ids.push(key_id);
                }
                self.hash_from(base)
            }
        };
        self.made.set(Table::Values, id, slot);
        made
    }

    /// A frozen Hash of the pairs on the stack from `base` (and their key ids from
    /// its second index), which it pops, and its slot: a copy of the template for
    /// these keys, if there is one ([`template`]), else built by insertion and kept
    /// as the template.
    fn hash_from(&mut self, (base, keys_base): (usize, usize)) -> (VALUE, u32) {
        let (pairs, keys) = (&self.stack[base..], &self.key_ids[keys_base..]);
        let templates = self.made.templates.get_or_insert_with(FxHashMap::default);
        let template = templates.get(keys).copied();
        let copied = template.and_then(|slot| template::copy(self.objects.get(slot), pairs));
        let made = match copied {
            Some(copy) => {
                let hash = unsafe { rb_obj_freeze(copy) };
                (hash, self.objects.push(hash))
            }
            None => {
                let hash = unsafe {
                    let hash = rb_hash_new();
                    rb_hash_bulk_insert(pairs.len() as c_long, pairs.as_ptr(), hash);
                    rb_obj_freeze(hash)
                };
                let slot = self.objects.push(hash);
                if template.is_none() && template::usable(hash, pairs) {
                    templates.insert(keys.into(), slot);
                }
                (hash, slot)
            }
        };
        self.stack.truncate(base);
        self.key_ids.truncate(keys_base);
        made
    }
}

impl Drop for Converter<'_> {
    fn drop(&mut self) {
        if !self.was_disabled {
            self.ruby.gc_enable();
        }
    }
}

/// `OBJECTS`' Array of the generation, read in place rather than through
/// `rb_ary_entry` (a call for each of the ~460 lookups of a server's first
/// conversion), with the objects made since its last [`Self::flush`] waiting in
/// `pending`: they are appended in one `rb_ary_cat` per server, which for more than
/// 16 objects remembers the Array once instead of a write barrier per object. Its
/// elements' address and length are taken when the converter is made and again
/// after each flush (which may move them). Nothing else writes the Array while a
/// converter lives, and the GC, which could move elements too, is off.
struct Objects {
    array: RArray,
    elements: *const VALUE,
    len: usize,
    pending: Vec<VALUE>,
}

impl Objects {
    fn new(array: RArray) -> Objects {
        let mut objects = Objects { array, elements: std::ptr::null(), len: 0, pending: Vec::with_capacity(1024) };
        objects.refresh();
        objects
    }

    fn refresh(&mut self) {
        // SAFETY: an Array of ours, alive (kept by a static).
        unsafe {
            self.len = RARRAY_LEN(self.array.as_raw()) as usize;
            self.elements = RARRAY_CONST_PTR(self.array.as_raw());
        }
    }

    /// The object at `slot` (a slot [`Self::push`] gave).
    fn get(&self, slot: u32) -> VALUE {
        let slot = slot as usize;
        if slot < self.len {
            // SAFETY: below the length taken since the last change (see above).
            unsafe { *self.elements.add(slot) }
        } else {
            self.pending[slot - self.len]
        }
    }

    /// Keeps `object` (with the GC off, until the next flush) and gives its slot.
    fn push(&mut self, object: VALUE) -> u32 {
        self.pending.push(object);
        (self.len + self.pending.len() - 1) as u32
    }

    /// Appends the pending objects to the Array.
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        // SAFETY (here and in Converter): the Array is ours and never frozen; the
        // only exception these calls raise is NoMemoryError (see the module's
        // comment).
        unsafe { rb_ary_cat(self.array.as_raw(), self.pending.as_ptr(), self.pending.len() as c_long) };
        self.pending.clear();
        self.refresh();
    }
}

/// A frozen UTF-8 String of `text`. Made as a binary String whose encoding is then
/// set in its flags, as MRI's public `RB_ENCODING_SET_INLINED` does, rather than by
/// `rb_utf8_str_new`, whose `rb_enc_associate` was a third of a String's cost: it
/// checks the old encoding and looks the new one up under the VM lock.
fn frozen_str(text: &str) -> VALUE {
    let (shift, mask) =
        (ruby_encoding_consts::RUBY_ENCODING_SHIFT as VALUE, ruby_encoding_consts::RUBY_ENCODING_MASK as VALUE);
    // SAFETY: a new String, seen by nothing else yet; UTF-8's index is below 127
    // (MRI's inline encodings), as it is in every MRI (1).
    unsafe {
        let string = rb_str_new(text.as_ptr() as *const c_char, text.len() as c_long);
        let basic = string as *mut rb_sys::RBasic;
        (*basic).flags = ((*basic).flags & !mask) | ((utf8_index() as VALUE) << shift);
        rb_obj_freeze(string)
    }
}

/// UTF-8's encoding index, asked of MRI once.
fn utf8_index() -> i32 {
    static INDEX: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    // SAFETY: no arguments; returns a constant.
    *INDEX.get_or_init(|| unsafe { rb_utf8_encindex() })
}

#[cfg(test)]
impl Converter<'_> {
    /// Values waiting for their container: none between calls.
    pub(crate) fn pending(&self) -> usize {
        self.stack.len()
    }

    /// Leaves `value` on the stack, as a conversion cut short would.
    pub(crate) fn push_pending(&mut self, value: Value) {
        self.stack.push(value.as_raw());
    }
}

/// `rb_ary_store` unprotected, as the conversion calls it: raises on a frozen Array.
#[cfg(test)]
pub(crate) fn store_raw(array: RArray, index: c_long, value: Value) -> VALUE {
    unsafe { rb_sys::rb_ary_store(array.as_raw(), index, value.as_raw()) };
    Qnil as VALUE
}

/// [`Made`]'s tables, which are never cleared: a new generation sees none of an
/// earlier one's slots, and neither does a generation restarted after a failure.
#[cfg(test)]
mod made_tests {
    use super::*;

    fn ids(positions: usize, names: usize, values: usize) -> IdCounts {
        IdCounts { positions, names, values }
    }

    #[test]
    fn a_generation_sees_only_its_own_slots() {
        let mut made = Made::new();
        made.start(1, ids(4, 3, 10));
        assert_eq!(made.slot(Table::Values, 9), None, "a new table is empty");
        made.set(Table::Values, 9, 0);
        made.set(Table::Keys, 2, 1);
        made.set(Table::Servers, 3, 2);
        assert_eq!(made.slot(Table::Values, 9), Some(0));
        assert_eq!(made.slot(Table::Keys, 2), Some(1));
        assert_eq!(made.slot(Table::Servers, 3), Some(2));
        assert_eq!(made.slot(Table::Values, 10), None, "past the table: none");

        made.start(2, ids(4, 3, 12));
        for (table, id) in [(Table::Values, 9), (Table::Keys, 2), (Table::Servers, 3)] {
            assert_eq!(made.slot(table, id), None, "generation 1's slot is not generation 2's");
        }
        assert_eq!(made.tables[Table::Values as usize].len(), 12, "the tables grow to the new index's ids");
        made.set(Table::Values, 9, 0);
        assert_eq!(made.slot(Table::Values, 9), Some(0), "slot 0 of the new generation");
        made.set(Table::Values, 20, 5);
        assert_eq!(made.slot(Table::Values, 20), Some(5), "an id past the index's still kept");

        made.restart();
        assert_eq!(made.slot(Table::Values, 9), None, "a restarted generation starts empty");
        assert!(made.templates.is_none());
    }

    #[test]
    fn entries_start_over_from_zero_before_they_overflow() {
        let mut made = Made::new();
        made.start(1, ids(2, 2, 2));
        made.next = u32::MAX / 2 + 1;
        made.set(Table::Values, 1, 3);
        made.start(2, ids(2, 2, 2));
        assert_eq!((made.base, made.next), (0, 0), "tables zeroed, entries from 1 again");
        assert_eq!(made.tables[Table::Values as usize], vec![0, 0]);
        assert_eq!(made.slot(Table::Values, 1), None);
        made.set(Table::Values, 1, u32::MAX / 2);
        assert_eq!(made.slot(Table::Values, 1), Some(u32::MAX / 2), "the largest slot a generation can have");
    }
}
