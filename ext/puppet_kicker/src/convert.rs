//! Servers to Ruby: each server a deep-frozen Hash, built once per index generation
//! and shared by every later call, as are its fact names and every value many
//! servers have in common (an `os` Hash, a domain): the store gives equal values one
//! id, and each id is converted once.
//!
//! Only functions and macros of MRI's public headers, as rb-sys binds them (one
//! missing from a Ruby's headers fails the build against it): a Hash is
//! `rb_hash_new` filled by one `rb_hash_bulk_insert` (public in Ruby 2.7's
//! `ruby/intern.h` and 3.x's `ruby/internal/intern/hash.h`), or a copy of one
//! with the same keys ([`same_keys`]); an Array `rb_ary_new_from_values`; each frozen
//! with `rb_obj_freeze`.
//!
//! A server is built under one `rb_protect` with raw C calls, not one protected call
//! per object: the protected calls were a third of a server's cost. Nothing between
//! that `rb_protect` and the C calls holds a value with a destructor (the frames
//! hold `Copy` values and borrows), so a Ruby exception (only `NoMemoryError` can
//! come from these calls) skips nothing that needed to run.

use crate::same_keys::Scratch;
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
/// one it updates the Array, so the binding keeps positions in it ([`Converted`]),
/// never addresses.
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
/// Where each object the generation has converted is in `OBJECTS`.
static CONVERTED: Mutex<Converted> = Mutex::new(Converted::new());

/// What one index generation has converted, by where each object is in `OBJECTS`
/// (its slot), in tables by id:
/// - servers' Hashes by position in their index;
/// - values by store id: equal values have one id, so each is built once;
/// - fact names by string id, frozen, so a Hash keeps them as they are (a Hash
///   copies an unfrozen String key);
///
/// and the template of each key sequence (see [`same_keys`]): the first Hash built
/// with it.
///
/// The tables are kept from one generation to the next and never cleared, which
/// would cost a generation's first call a pass over every id: an entry is `base +
/// slot + 1`, and an entry at or below the generation's `base` is an earlier
/// generation's, so none.
struct Converted {
    generation: u64,
    base: u32,
    /// Above every entry written so far: the next generation's base.
    next: u32,
    /// By [`Table`].
    tables: [Vec<u32>; 3],
    /// Template slots by key sequence (name ids; [`CERTNAME_ID`] for the name the
    /// binding adds). None until the generation's first (a `const` Mutex cannot
    /// make a map).
    templates: Option<FxHashMap<Box<[StrId]>, u32>>,
}

/// The key id of the `certname` a server gets when no fact has that name (no string
/// of a store has this id).
const CERTNAME_ID: StrId = StrId::MAX;

/// Hashes with fewer entries are built by insertion, never copied: copying every
/// Hash showed no gain over this side by side (`script/bench --compare`), and a
/// copy of a small Hash would have the bigger table `RHASH_TBL` gives its scratch.
const COPIED_FROM: usize = 9;

/// One of [`Converted`]'s tables, the index of its entry in `Converted::tables`.
#[derive(Clone, Copy)]
enum Table {
    Servers = 0,
    Values = 1,
    Keys = 2,
}

impl Converted {
    const fn new() -> Converted {
        Converted { generation: 0, base: 0, next: 0, tables: [Vec::new(), Vec::new(), Vec::new()], templates: None }
    }

    /// Forgets what earlier generations converted, for `generation`, whose index has
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

    /// Forgets what this generation converted (after a failed conversion).
    fn restart(&mut self) {
        (self.base, self.templates) = (self.next, None);
    }

    /// The slot of the object converted for `id`, if this generation made one.
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
/// garbage collector held off while it lives. Objects between their making and
/// their place in `OBJECTS` are referenced only from Rust's heap (`stack`,
/// `Objects::pending`), where the GC neither sees them, so would free them, nor
/// updates them, so would leave them stale if it moved them; and [`Objects`] reads
/// the Array's elements in place, through an address that only a GC or a write of
/// ours can change; and its [`Scratch`] Hashes are referenced from Rust alone.
pub struct Converter<'r> {
    ruby: &'r Ruby,
    converted: MutexGuard<'static, Converted>,
    objects: Objects,
    was_disabled: bool,
    /// Pairs and items waiting for their container, innermost last.
    stack: Vec<VALUE>,
    /// The key ids of the pairs on `stack`, which pick a Hash's template.
    key_ids: Vec<StrId>,
    /// The scratch copy of each template used, by template slot.
    scratch: FxHashMap<u32, Scratch>,
    /// How many Hashes were copies (for the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    copies: usize,
}

impl<'r> Converter<'r> {
    /// Drops what was converted for an earlier index generation than `selected`'s.
    pub fn new(ruby: &'r Ruby, selected: &Selected) -> Result<Converter<'r>, Error> {
        // Only the thread holding the GVL converts, and one converter at a time. A
        // panic that dropped a converter (caught by `entry`) left the tables as they
        // were, maybe naming objects that never reached `OBJECTS`: start over.
        let mut converted = match CONVERTED.try_lock() {
            Ok(converted) => converted,
            Err(TryLockError::Poisoned(poisoned)) => {
                let mut converted = poisoned.into_inner();
                *converted = Converted::new();
                CONVERTED.clear_poison();
                converted
            }
            Err(TryLockError::WouldBlock) => return Err(crate::raise(ruby, Failure::internal("converter busy"))),
        };
        let holder = ruby.get_inner(&OBJECTS);
        if converted.generation != selected.generation() {
            // A new Array rather than a cleared one: young, appending to it costs
            // the write barrier's quick test only (storing a new object into an old
            // Array, as the old one was by then, takes its slow path), until GCs
            // age it; a generation's first call, the largest, runs before any.
            holder.store(0, ruby.ary_new())?;
            ruby.get_inner(&ANSWERS).clear()?;
            converted.start(selected.generation(), selected.id_counts());
        }
        let was_disabled = ruby.gc_disable();
        let objects = Objects::new(holder.entry::<RArray>(0)?);
        let (stack, key_ids) = (Vec::with_capacity(1024), Vec::with_capacity(512));
        Ok(Converter {
            ruby,
            converted,
            objects,
            was_disabled,
            stack,
            key_ids,
            scratch: FxHashMap::default(),
            copies: 0,
        })
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
        if let Some(slot) = self.converted.slot(Table::Servers, position as usize) {
            return Ok(unsafe { Value::from_raw(self.objects.get(slot)) });
        }
        let Some(server) = selected.server_at(position) else {
            let what = format!("no server at position {position} of index {}", selected.generation());
            return Err(crate::raise(self.ruby, Failure::internal(what)));
        };
        let hash = self.protected(|build| {
            let (hash, slot) = build.server_hash(server);
            build.converted.set(Table::Servers, position as usize, slot);
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
        let outcome = protect(|| match catch_unwind(AssertUnwindSafe(|| build(self))) {
            Ok(value) => value,
            Err(payload) => {
                panic = Some(payload);
                Qnil as VALUE
            }
        });
        self.stack.clear();
        self.key_ids.clear();
        if panic.is_some() || outcome.is_err() {
            self.converted.restart();
            self.objects.pending.clear();
            self.scratch.clear();
        }
        match panic {
            Some(payload) => Err(crate::raise(self.ruby, Failure::panic(&*payload))),
            None => outcome,
        }
    }

    /// The server's Hash, and its slot.
    fn server_hash(&mut self, server: Server) -> (VALUE, u32) {
        let base = (self.stack.len(), self.key_ids.len());
        for entry in server.entry_ids() {
            let (id, pair) = match entry {
                Entry::Value(id, value) => (id, [self.key(id, |id| server.name(id)), self.value(value)]),
                Entry::Certname(certname) => {
                    (CERTNAME_ID, [self.ruby.get_inner(&CERTNAME).as_raw(), frozen_str(certname)])
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
        if let Some(slot) = self.converted.slot(Table::Keys, id as usize) {
            return self.objects.get(slot);
        }
        let (name, slot) = self.keep(frozen_str(text(id)));
        self.converted.set(Table::Keys, id as usize, slot);
        name
    }

    /// A store value as a deep-frozen Ruby value, made once per generation.
    fn value(&mut self, value: View) -> VALUE {
        let id = value.id() as usize;
        if let Some(slot) = self.converted.slot(Table::Values, id) {
            return self.objects.get(slot);
        }
        let (object, slot) = match value.kind() {
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
        self.converted.set(Table::Values, id, slot);
        object
    }

    /// A frozen Hash of the pairs on the stack from `base` (keys and values
    /// alternating, keys distinct; their key ids from its second index), which it
    /// pops, and its slot: a copy of the template with these keys, if there is one
    /// ([`same_keys`]), else built by insertion and kept as the template.
    fn hash_from(&mut self, (base, keys_base): (usize, usize)) -> (VALUE, u32) {
        let (pairs, keys) = (&self.stack[base..], &self.key_ids[keys_base..]);
        let copied = keys.len() >= COPIED_FROM;
        let templates = self.converted.templates.get_or_insert_with(FxHashMap::default);
        let template = if copied { templates.get(keys).copied() } else { None };
        let copy = template.and_then(|slot| {
            let objects = &self.objects;
            // SAFETY: the template is a live Hash (kept), the pairs live objects or
            // immediates (kept), and the GC off while the converter lives.
            let scratch = self.scratch.entry(slot).or_insert_with(|| unsafe { Scratch::new(objects.get(slot)) });
            unsafe { scratch.copy(pairs) }
        });
        let hash = match copy {
            Some(copy) => {
                self.copies += 1;
                copy
            }
            // SAFETY: as above; `rb_hash_bulk_insert` sizes the new Hash's table
            // once for all of the pairs.
            None => unsafe {
                let hash = rb_hash_new();
                rb_hash_bulk_insert(pairs.len() as c_long, pairs.as_ptr(), hash);
                hash
            },
        };
        let (hash, slot) = self.keep(unsafe { rb_obj_freeze(hash) });
        if template.is_none() && copied {
            let templates = self.converted.templates.get_or_insert_with(FxHashMap::default);
            templates.insert(self.key_ids[keys_base..].into(), slot);
        }
        self.stack.truncate(base);
        self.key_ids.truncate(keys_base);
        (hash, slot)
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
/// set in its flags by what the public headers' inline `RB_ENCODING_SET_INLINED`
/// does (`ruby/internal/encoding/encoding.h` from Ruby 3.0, `ENCODING_SET_INLINED` in
/// `ruby/encoding.h` before; bindgen binds no inline function), with the public
/// `RBasic` and `RUBY_ENCODING_SHIFT`/`_MASK` of the headers built against; rather
/// than by `rb_utf8_str_new`, whose `rb_enc_associate` was a third of a String's
/// cost: it checks the old encoding and looks the new one up under the VM lock.
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
    /// How many Hashes were copies of a template.
    pub(crate) fn copies(&self) -> usize {
        self.copies
    }

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

/// [`Converted`]'s tables, which are never cleared: a new generation sees none of an
/// earlier one's slots, and neither does a generation restarted after a failure.
#[cfg(test)]
mod converted_tests {
    use super::*;

    fn ids(positions: usize, names: usize, values: usize) -> IdCounts {
        IdCounts { positions, names, values }
    }

    #[test]
    fn a_generation_sees_only_its_own_slots() {
        let mut converted = Converted::new();
        converted.start(1, ids(4, 3, 10));
        assert_eq!(converted.slot(Table::Values, 9), None, "a new table is empty");
        converted.set(Table::Values, 9, 0);
        converted.set(Table::Keys, 2, 1);
        converted.set(Table::Servers, 3, 2);
        assert_eq!(converted.slot(Table::Values, 9), Some(0));
        assert_eq!(converted.slot(Table::Keys, 2), Some(1));
        assert_eq!(converted.slot(Table::Servers, 3), Some(2));
        assert_eq!(converted.slot(Table::Values, 10), None, "past the table: none");

        converted.start(2, ids(4, 3, 12));
        for (table, id) in [(Table::Values, 9), (Table::Keys, 2), (Table::Servers, 3)] {
            assert_eq!(converted.slot(table, id), None, "generation 1's slot is not generation 2's");
        }
        assert_eq!(converted.tables[Table::Values as usize].len(), 12, "the tables grow to the new index's ids");
        converted.set(Table::Values, 9, 0);
        assert_eq!(converted.slot(Table::Values, 9), Some(0), "slot 0 of the new generation");
        converted.set(Table::Values, 20, 5);
        assert_eq!(converted.slot(Table::Values, 20), Some(5), "an id past the index's still kept");

        converted.restart();
        assert_eq!(converted.slot(Table::Values, 9), None, "a restarted generation starts empty");
        assert!(converted.templates.is_none());
    }

    #[test]
    fn entries_start_over_from_zero_before_they_overflow() {
        let mut converted = Converted::new();
        converted.start(1, ids(2, 2, 2));
        converted.next = u32::MAX / 2 + 1;
        converted.set(Table::Values, 1, 3);
        converted.start(2, ids(2, 2, 2));
        assert_eq!((converted.base, converted.next), (0, 0), "tables zeroed, entries from 1 again");
        assert_eq!(converted.tables[Table::Values as usize], vec![0, 0]);
        assert_eq!(converted.slot(Table::Values, 1), None);
        converted.set(Table::Values, 1, u32::MAX / 2);
        assert_eq!(converted.slot(Table::Values, 1), Some(u32::MAX / 2), "the largest slot a generation can have");
    }
}

/// The conversion in an embedded VM, on a fleet of its own (a new core, so a new
/// generation): run in turn by `tests` in lib.rs, after it, on the thread of the VM.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use magnus::block::Proc;
    use puppet_kicker::api::{self, Query};
    use serde_json::{json, Value as Json};
    use std::fs;
    use std::path::PathBuf;

    /// Servers whose Hashes are checked: above 8 entries (MRI's st tables) and up to
    /// 8 (its array tables), at the top and nested; an `os` Hash and a `domain` equal
    /// on all; every kind of value; one with a `certname` fact, the others without.
    fn facts(n: u64) -> Json {
        let networking: serde_json::Map<String, Json> = (1..=10)
            .map(|i| (format!("field{i:02}"), if i == 5 { json!(n * 10) } else { json!(format!("{n}-{i}")) }))
            .collect();
        let mut facts = json!({
            "fqdn": format!("db{n}.example.com"), "hostname": format!("db{n}"), "role": "db",
            "domain": "example.com", "uptime_days": n * 7, "memorysize_mb": 1024.5 * n as f64,
            "is_virtual": n % 2 == 1, "timezone": null, "big": u64::MAX, "negative": -(n as i64),
            "mounts": ["/", format!("/srv/{n}")], "networking": networking, "empty": {}, "none": [],
            "os": {"family": "Debian", "release": {"full": "12.5", "major": "12"}},
            "text": "é ü ß 漢字 🎉 nul\u{0}", "small": {"a": n, "b": [n, {"c": "d"}]},
        });
        if n == 2 {
            facts["certname"] = json!("db2-by-fact");
        }
        facts
    }

    /// Configures a new core on `servers`, in a directory of its own (`name`): a new
    /// index generation, which no refresh replaces while the test runs.
    fn fleet(ruby: &Ruby, name: &str, servers: &[Json]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("puppet-kicker-{name}-{}", std::process::id()));
        let facts_dir = dir.join("var/server_data/facts");
        fs::create_dir_all(&facts_dir).unwrap();
        fs::create_dir_all(dir.join("etc")).unwrap();
        fs::write(dir.join("etc/puppet_kicker.yaml"), "cache:\n  dir: cache\n").unwrap();
        for facts in servers {
            let name = facts["fqdn"].as_str().unwrap();
            let stamp = "2099-01-01T00:00:00.000000000+00:00";
            let document = json!({"name": name, "values": facts, "timestamp": stamp, "expiration": stamp});
            fs::write(facts_dir.join(format!("{name}.json")), document.to_string()).unwrap();
        }
        let path = |p: PathBuf| p.display().to_string();
        let settings = crate::settings(ruby, path(dir.join("etc")), path(dir.join("var")), None, None, None).unwrap();
        api::configure(settings).unwrap();
        dir
    }

    /// The servers of `role`, converted by one converter, and how many Hashes it
    /// copied.
    fn converted_copies(ruby: &Ruby, role: &str) -> (RArray, usize) {
        let query = Query::ServersWithRole { roles: vec![role.into()], environment: "production".into() };
        let selected = api::select(query).unwrap();
        let mut converter = Converter::new(ruby, &selected).unwrap();
        let servers = ruby.ary_new();
        for &position in selected.positions() {
            servers.push(converter.server(&selected, position).unwrap()).unwrap();
        }
        (servers, converter.copies())
    }

    fn converted(ruby: &Ruby, role: &str) -> RArray {
        converted_copies(ruby, role).0
    }

    /// What each server's Hash should be: its facts, with `certname` last when no
    /// fact has that name, keys in byte order (the store's).
    fn expected(ruby: &Ruby, servers: &[Json]) -> RArray {
        let expected = ruby.ary_new();
        for facts in servers {
            let mut entries: Vec<(String, Json)> = facts.as_object().unwrap().clone().into_iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            if facts.get("certname").is_none() {
                entries.push(("certname".into(), facts["fqdn"].clone()));
            }
            let pairs = ruby.ary_new();
            for (name, value) in entries {
                pairs.push((name, crate::to_ruby(ruby, &value).unwrap())).unwrap();
            }
            expected.push(pairs).unwrap();
        }
        expected
    }

    /// The problems found in `servers` against `expected` (Arrays of pairs), as Ruby
    /// sees them: each equal (`eql?`, so 1 is not 1.0) in the same key order, frozen
    /// through, its Strings UTF-8, each key found by lookup with an equal String; the
    /// `os` Hash, the `domain` and each fact name one object for every server (but
    /// `certname`, which is a fact's name or the name the binding adds).
    const CHECK: &str = r##"
        lambda do |servers, expected|
          problems = []
          frozen = ->(v) { v.frozen? && (v.is_a?(Hash) ? v.all? { |k, x| frozen.(k) && frozen.(x) } : !v.is_a?(Array) || v.all?(&frozen)) }
          strings = ->(v) { v.is_a?(Hash) ? v.flat_map { |k, x| [k, *strings.(x)] } : v.is_a?(Array) ? v.flat_map(&strings) : [v].grep(String) }
          found = ->(h) { h.all? { |k, v| h[k.dup].equal?(v) && (!v.is_a?(Hash) || found.(v)) } }
          servers.zip(expected).each do |server, pairs|
            name = pairs.to_h['fqdn']
            problems << "#{name}: #{server.inspect} is not #{pairs.to_h.inspect}" unless server.eql?(pairs.to_h)
            problems << "#{name}: keys #{server.keys}" unless server.keys == pairs.map(&:first)
            problems << "#{name}: not frozen through" unless frozen.(server)
            problems << "#{name}: not every String UTF-8" unless strings.(server).all? { |s| s.encoding == Encoding::UTF_8 && s.valid_encoding? }
            problems << "#{name}: a key not found by lookup" unless found.(server)
          end
          first = servers.first
          servers.drop(1).each do |server|
            problems << "#{server['fqdn']}: its own os Hash" unless server['os'].equal?(first['os'])
            problems << "#{server['fqdn']}: its own domain String" unless server['domain'].equal?(first['domain'])
            names = first.keys.to_h { |k| [k, k] }.reject { |k, _| k == 'certname' } # added, or a fact
            problems << "#{server['fqdn']}: its own fact names" unless server.keys.all? { |k| !names.key?(k) || names[k].equal?(k) }
          end
          problems
        end
    "##;

    fn problems(ruby: &Ruby, servers: RArray, expected: RArray) -> Vec<String> {
        let check: Proc = ruby.eval(CHECK).unwrap();
        check.call((servers, expected)).unwrap()
    }

    pub(crate) fn servers_are_deep_frozen_hashes_that_share_equal_values(ruby: &Ruby) {
        let servers: Vec<Json> = (1..=3).map(facts).collect();
        let dir = fleet(ruby, "converted", &servers);
        let (converted, copies) = converted_copies(ruby, "db");
        assert_eq!(converted.len(), 3);
        // Past 8 entries: db3's top-level names (db1's; db2 has a `certname` fact),
        // db2's and db3's `networking` (db1's).
        assert_eq!(copies, 3, "Hashes copied from the template of their keys");
        let found = problems(ruby, converted, expected(ruby, &servers));
        assert!(found.is_empty(), "{found:#?}");
        let again = self::converted(ruby, "db");
        for (first, second) in converted.into_iter().zip(again) {
            assert!(first.equal(second).unwrap(), "converted once per generation: {first:?}");
        }
        fs::remove_dir_all(dir).unwrap();
    }

    /// The GC, once the converter is gone, may move every object (compaction); the
    /// generation's objects are still found by slot, and a server converted after it
    /// shares the values converted before it and is copied from their templates.
    pub(crate) fn a_compacting_gc_leaves_every_converted_object_found_by_its_slot(ruby: &Ruby) {
        let mut servers: Vec<Json> = (1..=3).map(facts).collect();
        let mut late = facts(4);
        late["role"] = json!("late");
        servers.push(late);
        let dir = fleet(ruby, "compacted", &servers);
        let before = converted(ruby, "db");
        let addresses: Vec<VALUE> = before.into_iter().map(|server| server.as_raw()).collect();
        let compacted: bool = ruby
            .eval(
                "begin; GC.verify_compaction_references(toward: :empty, double_heap: true); true; \
                 rescue NotImplementedError, ArgumentError; GC.start; false; end",
            )
            .unwrap();
        let moved = before.into_iter().zip(&addresses).filter(|(server, &address)| server.as_raw() != address).count();
        assert!(moved > 0 || !compacted, "compaction moved none of the servers: the test tests nothing");
        let after = converted(ruby, "db");
        for (first, second) in before.into_iter().zip(after) {
            assert!(first.equal(second).unwrap(), "the same objects after the GC (compacted: {compacted})");
        }
        let (with_late, copies) = converted_copies(ruby, "late");
        assert_eq!(copies, 2, "db1's templates, found by slot after the GC, copied for its names and `networking`");
        with_late.unshift(before.entry::<Value>(0).unwrap()).unwrap();
        let found = problems(ruby, with_late, expected(ruby, &[servers[0].clone(), servers[3].clone()]));
        assert!(found.is_empty(), "after the GC (compacted: {compacted}): {found:#?}");
        fs::remove_dir_all(dir).unwrap();
    }
}
