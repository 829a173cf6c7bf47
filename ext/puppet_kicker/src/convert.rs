//! Servers to Ruby: each server a deep-frozen Hash, built once per index generation
//! and shared by every later call, as are its fact names and every value many
//! servers have in common (an `os` Hash, a domain).
//!
//! A server is built under one `rb_protect` with raw C calls, not one protected call
//! per object: the protected calls were a third of a server's cost. Nothing between
//! that `rb_protect` and the C calls holds a value with a destructor (the frames
//! hold `Copy` values and a borrowed stack), so a Ruby exception (only
//! `NoMemoryError` can come from these calls) skips nothing that needed to run.

use magnus::rb_sys::{protect, AsRawValue, FromRawValue};
use magnus::value::{Lazy, ReprValue};
use magnus::{Error, RArray, RHash, RString, Ruby, Value};
use puppet_kicker::seam::{Entry, Failure, Selected, Server};
use puppet_kicker::store::{Kind, StrId, View};
use rb_sys::{
    rb_ary_entry, rb_ary_new_from_values, rb_ary_store, rb_hash_bulk_insert, rb_hash_new, rb_obj_freeze,
    rb_utf8_str_new, Qfalse, Qnil, Qtrue, VALUE,
};
use std::os::raw::{c_char, c_long};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

/// Servers' Hashes by position in their index.
static SERVERS: Lazy<RArray> = Lazy::new(|ruby| ruby.ary_new());
/// Values by store id: equal values have one id, so each is built once.
static VALUES: Lazy<RArray> = Lazy::new(|ruby| ruby.ary_new());
/// Fact names by string id, frozen, so a Hash keeps them as they are (a Hash
/// copies an unfrozen String key).
static KEYS: Lazy<RArray> = Lazy::new(|ruby| ruby.ary_new());
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
    servers: RArray,
    values: RArray,
    keys: RArray,
    was_disabled: bool,
    /// Pairs and items waiting for their container, innermost last.
    stack: Vec<VALUE>,
}

impl<'r> Converter<'r> {
    /// Drops what was converted for an earlier index generation than `selected`'s.
    pub fn new(ruby: &'r Ruby, selected: &Selected) -> Result<Converter<'r>, Error> {
        let (servers, values, keys) = (ruby.get_inner(&SERVERS), ruby.get_inner(&VALUES), ruby.get_inner(&KEYS));
        if GENERATION.load(Ordering::Relaxed) != selected.generation() {
            servers.clear()?;
            values.clear()?;
            keys.clear()?;
            ruby.get_inner(&ANSWERS).clear()?;
            GENERATION.store(selected.generation(), Ordering::Relaxed);
        }
        let was_disabled = ruby.gc_disable();
        Ok(Converter { ruby, servers, values, keys, was_disabled, stack: Vec::with_capacity(1024) })
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
        // SAFETY: rb_ary_entry raises nothing (out of range is nil).
        let kept = unsafe { rb_ary_entry(self.servers.as_raw(), position as c_long) };
        if kept != Qnil as VALUE {
            return Ok(unsafe { Value::from_raw(kept) });
        }
        let Some(server) = selected.server_at(position) else {
            let what = format!("no server at position {position} of index {}", selected.generation());
            return Err(crate::raise(self.ruby, Failure::internal(what)));
        };
        let hash = self.protected(|build| {
            let hash = build.server_hash(server);
            // SAFETY: position is a u32, the Array ours and never frozen.
            unsafe { rb_ary_store(build.servers.as_raw(), position as c_long, hash) };
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
        match panic {
            Some(payload) => Err(crate::raise(self.ruby, Failure::panic(&*payload))),
            None => made,
        }
    }

    fn server_hash(&mut self, server: Server) -> VALUE {
        let base = self.stack.len();
        for entry in server.entry_ids() {
            let pair = match entry {
                Entry::Value(id, value) => [self.key(id, |id| server.name(id)), self.value(value)],
                Entry::Certname(certname) => [self.ruby.get_inner(&CERTNAME).as_raw(), frozen_str(certname)],
            };
            self.stack.extend(pair);
        }
        self.hash_from(base)
    }

    /// A fact name as a frozen String, made once per generation: its text is looked
    /// up only then.
    fn key<'s>(&mut self, id: StrId, text: impl FnOnce(StrId) -> &'s str) -> VALUE {
        // SAFETY (here and below): the Arrays are ours and never frozen; indexes are
        // u32 ids; the only exception these calls raise is NoMemoryError (see above).
        let kept = unsafe { rb_ary_entry(self.keys.as_raw(), id as c_long) };
        if kept != Qnil as VALUE {
            return kept;
        }
        let name = frozen_str(text(id));
        unsafe { rb_ary_store(self.keys.as_raw(), id as c_long, name) };
        name
    }

    /// A store value as a deep-frozen Ruby value, made once per generation.
    fn value(&mut self, value: View) -> VALUE {
        let id = value.id() as c_long;
        let kept = unsafe { rb_ary_entry(self.values.as_raw(), id) };
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
                let base = self.stack.len();
                for (key_id, item) in object.ids() {
                    let pair = [self.key(key_id, |id| value.store().str(id)), self.value(item)];
                    self.stack.extend(pair);
                }
                self.hash_from(base)
            }
        };
        unsafe { rb_ary_store(self.values.as_raw(), id, made) };
        made
    }

    /// A frozen Hash of the pairs on the stack from `base`, which it pops.
    fn hash_from(&mut self, base: usize) -> VALUE {
        let pairs = &self.stack[base..];
        let hash = unsafe {
            let hash = rb_hash_new();
            rb_hash_bulk_insert(pairs.len() as c_long, pairs.as_ptr(), hash);
            rb_obj_freeze(hash)
        };
        self.stack.truncate(base);
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

fn frozen_str(text: &str) -> VALUE {
    unsafe { rb_obj_freeze(rb_utf8_str_new(text.as_ptr() as *const c_char, text.len() as c_long)) }
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
