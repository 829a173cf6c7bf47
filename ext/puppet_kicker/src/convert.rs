//! Servers to Ruby: each server a deep-frozen Hash, built once per index generation
//! and shared by every later call, as are its fact names and every value many
//! servers have in common (an `os` Hash, a domain).
//!
//! A server is built under one `rb_protect` with raw C calls, not one protected call
//! per object: the protected calls were a third of a server's cost. Nothing between
//! that `rb_protect` and the C calls holds a value with a destructor (the frames
//! hold `Copy` values and a borrowed stack), so a Ruby exception (only
//! `NoMemoryError` can come from these calls) skips nothing that needed to run.

use crate::template;
use magnus::rb_sys::{protect, AsRawValue, FromRawValue};
use magnus::value::{Lazy, ReprValue};
use magnus::{Error, RArray, RHash, RString, Ruby, Value};
use puppet_kicker::seam::{Entry, Failure, Selected, Server};
use puppet_kicker::store::{Kind, StrId, View};
use rb_sys::{
    rb_ary_new_from_values, rb_ary_store, rb_hash_bulk_insert, rb_hash_new, rb_obj_freeze, rb_str_new,
    rb_utf8_encindex, ruby_encoding_consts, Qfalse, Qnil, Qtrue, RARRAY_CONST_PTR, RARRAY_LEN, VALUE,
};
use std::os::raw::{c_char, c_long};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

/// The generation's caches, each a new Array every generation (see [`Converter::new`]):
/// - servers' Hashes by position in their index;
/// - values by store id: equal values have one id, so each is built once;
/// - fact names by string id, frozen, so a Hash keeps them as they are (a Hash
///   copies an unfrozen String key).
static CACHES: Lazy<RArray> =
    Lazy::new(|ruby| ruby.ary_new_from_values(&[ruby.ary_new(), ruby.ary_new(), ruby.ary_new()]));
/// Frozen result Arrays by answer id ([`Selected::answer_id`]): an identical call
/// within a generation returns the very Array it returned before.
static ANSWERS: Lazy<RHash> = Lazy::new(|ruby| ruby.hash_new());
/// The name of the `certname` a server gets when no fact has that name.
static CERTNAME: Lazy<RString> = Lazy::new(|ruby| {
    let name = ruby.str_new("certname");
    name.freeze();
    name
});
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// What one call converts with: the caches of the selection's generation, with the
/// garbage collector held off, so that objects kept only on the Rust stack below
/// (until they are in their Hash or Array) are neither freed nor moved.
pub struct Converter<'r> {
    ruby: &'r Ruby,
    servers: Cache,
    values: Cache,
    keys: Cache,
    was_disabled: bool,
    /// Pairs and items waiting for their container, innermost last.
    stack: Vec<VALUE>,
    /// The key ids of the pairs on `stack`, which pick a Hash's template.
    key_ids: Vec<StrId>,
}

impl<'r> Converter<'r> {
    /// Drops what was converted for an earlier index generation than `selected`'s.
    pub fn new(ruby: &'r Ruby, selected: &Selected) -> Result<Converter<'r>, Error> {
        let caches = ruby.get_inner(&CACHES);
        if GENERATION.load(Ordering::Relaxed) != selected.generation() {
            // New Arrays rather than cleared ones: young, a store into them costs
            // the write barrier's quick test only (storing a new object into an old
            // Array, as the old ones were by then, takes its slow path), until GCs
            // age them; a generation's first call, the largest, runs before any.
            for at in 0..3 {
                caches.store(at, ruby.ary_new())?;
            }
            ruby.get_inner(&ANSWERS).clear()?;
            template::clear(ruby)?;
            GENERATION.store(selected.generation(), Ordering::Relaxed);
        }
        let was_disabled = ruby.gc_disable();
        let cache = |at| caches.entry::<RArray>(at).map(Cache::new);
        let (servers, values, keys) = (cache(0)?, cache(1)?, cache(2)?);
        let (stack, key_ids) = (Vec::with_capacity(1024), Vec::with_capacity(512));
        Ok(Converter { ruby, servers, values, keys, was_disabled, stack, key_ids })
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
        let kept = self.servers.get(position as usize);
        if kept != Qnil as VALUE {
            return Ok(unsafe { Value::from_raw(kept) });
        }
        let Some(server) = selected.server_at(position) else {
            let what = format!("no server at position {position} of index {}", selected.generation());
            return Err(crate::raise(self.ruby, Failure::internal(what)));
        };
        let hash = self.protected(|build| {
            let hash = build.server_hash(server);
            build.servers.store(position as usize, hash);
            hash
        })?;
        Ok(unsafe { Value::from_raw(hash) })
    }

    /// Runs `build` under one `rb_protect`; a panic in it is caught inside, so it
    /// never unwinds through Ruby's frames.
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
        match panic {
            Some(payload) => Err(crate::raise(self.ruby, Failure::panic(&*payload))),
            None => made,
        }
    }

    fn server_hash(&mut self, server: Server) -> VALUE {
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

    /// A fact name as a frozen String, made once per generation: its text is looked
    /// up only then.
    fn key<'s>(&mut self, id: StrId, text: impl FnOnce(StrId) -> &'s str) -> VALUE {
        let kept = self.keys.get(id as usize);
        if kept != Qnil as VALUE {
            return kept;
        }
        let name = frozen_str(text(id));
        self.keys.store(id as usize, name);
        name
    }

    /// A store value as a deep-frozen Ruby value, made once per generation.
    fn value(&mut self, value: View) -> VALUE {
        let id = value.id() as usize;
        let kept = self.values.get(id);
        if kept != Qnil as VALUE {
            return kept;
        }
        let made = match value.kind() {
            Kind::Null => return Qnil as VALUE,
            Kind::Bool(b) => (if b { Qtrue } else { Qfalse }) as VALUE,
            Kind::Int(i) => self.ruby.integer_from_i64(i).as_raw(),
            Kind::UInt(u) => self.ruby.integer_from_u64(u).as_raw(),
            Kind::Float(f) => self.ruby.float_from_f64(f).as_raw(),
            Kind::Str(s) => frozen_str(s),
            Kind::Array(items) => {
                let base = self.stack.len();
                for item in items.iter() {
                    let item = self.value(item);
                    self.stack.push(item);
                }
                let items = &self.stack[base..];
                let array = unsafe { rb_obj_freeze(rb_ary_new_from_values(items.len() as c_long, items.as_ptr())) };
                self.stack.truncate(base);
                array
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
        self.values.store(id, made);
        made
    }

    /// A frozen Hash of the pairs on the stack from `base` (and their key ids from
    /// its second index), which it pops: a copy of the template for these keys, if
    /// there is one ([`template`]), else built by insertion and kept as the template.
    fn hash_from(&mut self, (base, keys_base): (usize, usize)) -> VALUE {
        let (pairs, keys) = (&self.stack[base..], &self.key_ids[keys_base..]);
        let hash = match template::copy(self.ruby, keys, pairs) {
            Some(copy) => unsafe { rb_obj_freeze(copy) },
            None => {
                let hash = unsafe {
                    let hash = rb_hash_new();
                    rb_hash_bulk_insert(pairs.len() as c_long, pairs.as_ptr(), hash);
                    rb_obj_freeze(hash)
                };
                template::keep(self.ruby, keys, hash);
                hash
            }
        };
        self.stack.truncate(base);
        self.key_ids.truncate(keys_base);
        hash
    }
}

impl Drop for Converter<'_> {
    fn drop(&mut self) {
        if !self.was_disabled {
            self.ruby.gc_enable();
        }
    }
}

/// One of the per-generation caches, read in place rather than through
/// `rb_ary_entry` (a call for each of the ~460 lookups of a server's first
/// conversion): its elements' address and length, taken when the converter is made
/// and again after each store (which may move them). Nothing else writes the caches
/// while a converter lives, and the GC, which could move elements too, is off.
struct Cache {
    array: RArray,
    elements: *const VALUE,
    len: usize,
}

impl Cache {
    fn new(array: RArray) -> Cache {
        let mut cache = Cache { array, elements: std::ptr::null(), len: 0 };
        cache.refresh();
        cache
    }

    fn refresh(&mut self) {
        // SAFETY: an Array of ours, alive (kept by a static).
        unsafe {
            self.len = RARRAY_LEN(self.array.as_raw()) as usize;
            self.elements = RARRAY_CONST_PTR(self.array.as_raw());
        }
    }

    /// `array[index]`, nil past its end.
    fn get(&self, index: usize) -> VALUE {
        if index < self.len {
            // SAFETY: below the length taken since the last change (see above).
            unsafe { *self.elements.add(index) }
        } else {
            Qnil as VALUE
        }
    }

    fn store(&mut self, index: usize, value: VALUE) {
        // SAFETY (here and in Converter): the Arrays are ours and never frozen;
        // indexes are u32 ids; the only exception these calls raise is NoMemoryError
        // (see the module's comment).
        unsafe { rb_ary_store(self.array.as_raw(), index as c_long, value) };
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
    unsafe { rb_ary_store(array.as_raw(), index, value.as_raw()) };
    Qnil as VALUE
}
