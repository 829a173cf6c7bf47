//! Hashes with the keys of a Hash built before, copied rather than built by
//! inserting every key again; through Ruby's public API only.
//!
//! Building a Hash hashes each of its keys (SipHash), and that is most of a server's
//! first conversion: a Hash of 146 entries (a server's top-level facts, on average)
//! costs 4.2 µs built by `rb_hash_bulk_insert`, 0.9 µs copied by `rb_hash_dup`,
//! which copies the table whole, the keys' hashes included (`cargo bench -p
//! puppet-kicker-ruby --bench hash_routes`). Servers repeat their key sequences (the
//! servers of a role have the same top-level fact names), so the converter keeps the
//! first Hash built with each key sequence as its template, and makes a later one
//! with those keys so:
//!
//! 1. once per converter, a [`Scratch`] copy of the template (`rb_hash_dup`), whose
//!    table `RHASH_TBL` (`rb_hash_tbl`, `ruby/internal/core/rhash.h`) gives;
//! 2. for each Hash, the scratch's values replaced in place, entry by entry, by
//!    `st_foreach_with_replace` (`ruby/st.h`), each entry's key first checked to be
//!    the expected key object;
//! 3. a copy of the scratch (`rb_hash_dup`) handed out: 1.7 µs in all for 146
//!    entries.
//!
//! `RHASH_TBL` leaves the scratch Hash unprotected by write barriers, as a table an
//! extension may write must be: the GC then scans such a Hash whole at every minor
//! collection once it is old (with 3,787 kept, as many servers, a minor GC took 6.8
//! ms instead of 0.02). So a scratch is never handed out: it lives while its
//! converter does (the GC off), referenced from Rust alone, and every Hash handed out
//! is a new copy, protected as any other. The template and its key sequence are the
//! converter's ([`crate::convert`]).

use rb_sys::{
    rb_hash_dup, rb_hash_size_num, rb_hash_tbl, rb_st_foreach_with_replace, st_data_t, st_retval, st_table, VALUE,
};
use std::os::raw::c_int;

/// A copy of a template Hash whose values are replaced in place, for copies.
pub struct Scratch {
    hash: VALUE,
    table: *mut st_table,
    entries: usize,
}

impl Scratch {
    /// A scratch copy of `template`.
    ///
    /// # Safety
    /// `template` must be a live Hash, and the scratch used only while the GC is
    /// off (it is referenced from Rust alone).
    pub unsafe fn new(template: VALUE) -> Scratch {
        let hash = rb_hash_dup(template);
        let table = rb_hash_tbl(hash, c"same_keys.rs".as_ptr(), line!() as c_int);
        Scratch { hash, table, entries: rb_hash_size_num(hash) as usize }
    }

    /// A new Hash with the keys of the template and the values of `pairs` (keys and
    /// values alternating, keys distinct), unfrozen; `None`, and no Hash made, when
    /// the template's keys are not the keys of `pairs`, the same objects in the same
    /// order.
    ///
    /// # Safety
    /// The values must be live objects or immediates, and the GC off.
    pub unsafe fn copy(&mut self, pairs: &[VALUE]) -> Option<VALUE> {
        if pairs.len() != 2 * self.entries {
            return None;
        }
        let mut fill = Fill { pairs, next: 0, matched: true };
        rb_st_foreach_with_replace(self.table, Some(check), Some(replace), &mut fill as *mut Fill as st_data_t);
        if !fill.matched || fill.next != self.entries {
            return None;
        }
        Some(rb_hash_dup(self.hash))
    }
}

/// Where a fill of the scratch's table is: the entry to write next.
struct Fill<'p> {
    pairs: &'p [VALUE],
    next: usize,
    matched: bool,
}

/// Asks for entry `next`'s value to be replaced if its key is the one expected;
/// stops at the first that is not.
unsafe extern "C" fn check(key: st_data_t, _value: st_data_t, fill: st_data_t, _error: c_int) -> c_int {
    // SAFETY: `fill` is the `&mut Fill` that `copy` passed, alive for the call.
    let fill = unsafe { &mut *(fill as *mut Fill) };
    if fill.pairs.get(2 * fill.next) == Some(&(key as VALUE)) {
        st_retval::ST_REPLACE as c_int
    } else {
        fill.matched = false;
        st_retval::ST_STOP as c_int
    }
}

/// Writes entry `next`'s value (its key checked by `check`).
unsafe extern "C" fn replace(_key: *mut st_data_t, value: *mut st_data_t, fill: st_data_t, _existing: c_int) -> c_int {
    // SAFETY: as in `check`; `value` points to the entry's value, for this call.
    let fill = unsafe { &mut *(fill as *mut Fill) };
    if let Some(&new) = fill.pairs.get(2 * fill.next + 1) {
        unsafe { *value = new as st_data_t };
        fill.next += 1;
    }
    st_retval::ST_CONTINUE as c_int
}

/// Run in turn by `tests` in lib.rs, on the thread of its embedded VM.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use magnus::rb_sys::{AsRawValue, FromRawValue};
    use magnus::value::ReprValue;
    use magnus::{RHash, Ruby, Value};
    use rb_sys::{rb_hash_bulk_insert, rb_hash_new, rb_obj_freeze};
    use std::os::raw::c_long;

    /// Whether Ruby's `ObjectSpace.dump` says `object` is protected by write barriers.
    fn write_barrier_protected(ruby: &Ruby, object: VALUE) -> bool {
        let dump: String = ruby
            .eval::<Value>("require 'objspace'; ->(o) { ObjectSpace.dump(o) }")
            .unwrap()
            .funcall("call", (unsafe { Value::from_raw(object) },))
            .unwrap();
        dump.contains("\"wb_protected\":true")
    }

    /// A copy is the Hash insertion builds (the same pairs in the same order, each
    /// key found by lookup, with an equal String too), a new Hash protected by write
    /// barriers as any, its template unchanged; the scratch is neither handed out nor
    /// protected. Other keys, keys out of order, or fewer give no copy. Small and
    /// large tables alike.
    pub(crate) fn a_copy_is_the_hash_insertion_builds(ruby: &Ruby) {
        let was_disabled = ruby.gc_disable();
        for size in [1, 2, 8, 9, 40, 146] {
            a_copy_of(ruby, size);
        }
        if !was_disabled {
            ruby.gc_enable();
        }
        ruby.gc_start();
    }

    fn a_copy_of(ruby: &Ruby, size: usize) {
        let names: Vec<VALUE> = (0..size).map(|i| frozen(ruby, &format!("fact_{i:03}"))).collect();
        let pairs = |values: &[VALUE]| -> Vec<VALUE> {
            names.iter().zip(values).flat_map(|(&name, &value)| [name, value]).collect()
        };
        let first: Vec<VALUE> = (0..size).map(|i| ruby.integer_from_i64(i as i64).as_raw()).collect();
        let template = built(&pairs(&first));
        let mut scratch = unsafe { Scratch::new(template) };
        assert!(!write_barrier_protected(ruby, scratch.hash), "RHASH_TBL unprotects the scratch");

        // Heap objects, immediates, nil and false.
        let kinds = [
            ruby.str_new("a value").as_raw(),
            ruby.qnil().as_raw(),
            ruby.qfalse().as_raw(),
            ruby.float_from_f64(1.5).as_raw(),
            ruby.integer_from_u64(u64::MAX).as_raw(),
            ruby.ary_new().as_raw(),
        ];
        for round in 0..2 {
            let values: Vec<VALUE> = (0..size)
                .map(|i| match kinds.get(i + round) {
                    Some(&kind) => kind,
                    None => ruby.str_new(&format!("v{i}-{round}")).as_raw(),
                })
                .collect();
            let copy = unsafe { scratch.copy(&pairs(&values)) }.unwrap_or_else(|| panic!("{size} entries: a copy"));
            assert!(write_barrier_protected(ruby, copy), "{size} entries: the copy is protected");
            assert_ne!(copy, scratch.hash, "{size} entries: the scratch is not handed out");
            let copy = RHash::from_value(unsafe { Value::from_raw(copy) }).unwrap();
            assert!(!copy.is_frozen(), "the caller freezes the copy");
            let expected = RHash::from_value(unsafe { Value::from_raw(built(&pairs(&values))) }).unwrap();
            assert!(copy.as_value().eql(expected).unwrap(), "{copy:?} is {expected:?}");
            let keys = |h: RHash| -> Value { h.funcall("keys", ()).unwrap() };
            assert!(keys(copy).eql(keys(expected)).unwrap(), "{size} entries: in insertion order");
            for (&name, &value) in names.iter().zip(&values) {
                let name = unsafe { Value::from_raw(name) };
                let found: Value = copy.aref(name).unwrap();
                assert!(found.equal(unsafe { Value::from_raw(value) }).unwrap(), "{size} entries: looked up");
                let by_text: Value = copy.aref(ruby.str_new(&name.to_string())).unwrap();
                assert!(by_text.equal(found).unwrap(), "{size} entries: looked up by an equal String");
            }
            assert!(copy.get(ruby.str_new("fact_999")).is_none(), "no other key");
        }
        let template = RHash::from_value(unsafe { Value::from_raw(template) }).unwrap();
        let kept: Value = template.aref(unsafe { Value::from_raw(names[0]) }).unwrap();
        assert!(kept.eql(ruby.integer_from_i64(0)).unwrap(), "the template unchanged");

        let mut swapped = pairs(&first);
        if size > 1 {
            swapped.swap(0, 2);
            assert!(unsafe { scratch.copy(&swapped) }.is_none(), "{size} entries: keys out of their order, no copy");
        }
        let mut renamed = pairs(&first);
        renamed[0] = frozen(ruby, "another_fact");
        assert!(unsafe { scratch.copy(&renamed) }.is_none(), "{size} entries: another key, no copy");
        assert!(unsafe { scratch.copy(&pairs(&first)[..2 * size - 2]) }.is_none(), "{size} entries: fewer, no copy");
        let again = unsafe { scratch.copy(&pairs(&first)) }.expect("a copy after refusals");
        assert!(unsafe { Value::from_raw(again) }.eql(template).unwrap(), "{size} entries: the template's values");
    }

    /// A frozen Hash of `pairs` built as the converter builds one.
    fn built(pairs: &[VALUE]) -> VALUE {
        unsafe {
            let hash = rb_hash_new();
            rb_hash_bulk_insert(pairs.len() as c_long, pairs.as_ptr(), hash);
            rb_obj_freeze(hash)
        }
    }

    fn frozen(ruby: &Ruby, text: &str) -> VALUE {
        let s = ruby.str_new(text);
        s.freeze();
        s.as_raw()
    }
}
