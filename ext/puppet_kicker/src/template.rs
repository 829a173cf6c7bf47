//! Hashes copied from a template with the same keys, instead of built by inserting
//! every key again.
//!
//! Most of a server's first conversion was MRI hashing fact names (SipHash) and
//! inserting them into new tables. Servers repeat their key sequences: the servers
//! of a role have the same top-level fact names, every `os` and every
//! `networking.interfaces.eth0` the same keys. So the first Hash made with a key
//! sequence is kept as its template ([`usable`]), and a later Hash with those keys
//! is a copy of it (`rb_hash_dup`: the table copied whole, the keys' hashes and
//! hints included) whose values are written in place ([`copy`]), where
//! [`crate::layout`] finds them. A write barrier is owed only by an old object (or
//! while the GC marks incrementally): the conversion runs with the GC disabled,
//! which first ends any marking under way, so a new copy stays young and needs none.
//! A copy found promoted all the same gets one per value.
//!
//! A copy is used only if its table holds exactly the expected keys, one by one
//! ([`layout::Pairs::holds`]); else it is dropped and the Hash built by insertion.
//! Where this Ruby's layout is not known, every Hash is built by insertion.

use crate::layout;
use puppet_kicker::store::StrId;
use rb_sys::{rb_gc_writebarrier, rb_hash_dup, VALUE};

/// The key id [`crate::convert`] gives the `certname` a server gets when no fact has
/// that name (no string of a store has this id).
pub const CERTNAME_ID: StrId = StrId::MAX;

/// Whether `hash`, a Hash just built by inserting `pairs` (keys and values
/// alternating, keys distinct), can be the template of later Hashes with these
/// keys: its table is one [`layout`] reads, and it holds exactly these pairs.
pub fn usable(hash: VALUE, pairs: &[VALUE]) -> bool {
    if pairs.is_empty() {
        return false;
    }
    // SAFETY: a live Hash (the caller's, just built).
    let Some(entries) = (unsafe { layout::of(hash, pairs.len() / 2) }) else {
        return false;
    };
    entries.holds(pairs.iter().step_by(2).copied()) && (0..entries.len()).all(|i| entries.value(i) == pairs[2 * i + 1])
}

/// A copy of `template` (a Hash [`usable`] accepted, frozen since) with the values
/// of `pairs` (keys and values alternating, the keys the template's, in order),
/// unfrozen; `None` when the copy's table is not as expected. Only while the GC is
/// disabled (see above).
pub fn copy(template: VALUE, pairs: &[VALUE]) -> Option<VALUE> {
    // SAFETY: template is a live Hash; rb_hash_dup makes an unfrozen copy of its
    // table (it calls no Ruby method).
    let copy = unsafe { rb_hash_dup(template) };
    // SAFETY: a live Hash, new, unfrozen and seen by no one else; the values are
    // alive (on the converter's stack, with the GC off).
    let mut entries = unsafe { layout::of(copy, pairs.len() / 2) }?;
    if !unsafe { entries.fill(pairs) } {
        return None;
    }
    if promoted(copy) {
        for &value in pairs.iter().skip(1).step_by(2).filter(|&&v| !special_const(v)) {
            // SAFETY: both are live objects.
            unsafe { rb_gc_writebarrier(copy, value) };
        }
    }
    Some(copy)
}

/// `RB_OBJ_PROMOTED`: whether the GC has made `hash` old.
fn promoted(hash: VALUE) -> bool {
    let promoted = rb_sys::ruby_fl_type::RUBY_FL_PROMOTED as VALUE;
    // SAFETY: a live Hash, whose flags are readable.
    unsafe { (*(hash as *const rb_sys::RBasic)).flags & promoted != 0 }
}

/// `RB_SPECIAL_CONST_P`: an immediate (Integer, Symbol, Float, true) or false or
/// nil, which no write barrier may be given.
fn special_const(v: VALUE) -> bool {
    let (immediate_mask, nil) = (rb_sys::ruby_special_consts::RUBY_IMMEDIATE_MASK as VALUE, rb_sys::Qnil as VALUE);
    v & immediate_mask != 0 || v & !nil == 0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use magnus::rb_sys::{AsRawValue, FromRawValue};
    use magnus::value::ReprValue;
    use magnus::{RHash, Ruby, Value};
    use rb_sys::{rb_hash_bulk_insert, rb_hash_new, rb_obj_freeze};
    use std::os::raw::c_long;

    /// On the Rubies puppet-kicker is tested on (3.1 and 3.3), Hashes of every size
    /// are templates: array tables (1 to 8 entries) and st tables alike. A copy is
    /// the Hash insertion builds: the same pairs in the same order, each key found by
    /// lookup, the template unchanged. Other keys, or keys out of order, or a
    /// template of another size give no copy.
    pub(crate) fn a_copy_is_the_hash_insertion_builds(ruby: &Ruby) {
        let version = layout::ruby_version();
        assert!(layout::st_table(), "rb_hash_tbl_raw is in Ruby {version:?}");
        assert_eq!(layout::array_table(), layout::array_table_of(version));
        assert!(layout::array_table().is_some(), "Ruby {version:?}'s array table layout is listed in layout.rs");
        let was_disabled = ruby.gc_disable();
        for size in [1, 2, 7, 8, 9, 12, 40] {
            a_copy_of(ruby, size);
        }
        if !was_disabled {
            ruby.gc_enable();
        }
        ruby.gc_start();
    }

    fn a_copy_of(ruby: &Ruby, size: usize) {
        let names: Vec<VALUE> = (0..size).map(|i| frozen(ruby, &format!("fact_{i:02}"))).collect();
        let pairs = |values: &[VALUE]| -> Vec<VALUE> {
            names.iter().zip(values).flat_map(|(&name, &value)| [name, value]).collect()
        };
        let first: Vec<VALUE> = (0..size).map(|i| ruby.integer_from_i64(i as i64).as_raw()).collect();
        let template = built(&pairs(&first));
        assert!(usable(template, &pairs(&first)), "{size} entries: a template");
        let mut other_values = first.clone();
        other_values[size - 1] = ruby.qnil().as_raw();
        assert!(!usable(template, &pairs(&other_values)), "{size} entries: not the Hash of other values");
        assert!(!usable(template, &pairs(&first)[..2 * size - 2]), "{size} entries: not the Hash of fewer pairs");

        // Heap objects, immediates, nil and false: the write barrier's every case.
        let kinds = [
            ruby.str_new("a value").as_raw(),
            ruby.qnil().as_raw(),
            ruby.qfalse().as_raw(),
            ruby.float_from_f64(1.5).as_raw(),
            ruby.integer_from_u64(u64::MAX).as_raw(),
            ruby.ary_new().as_raw(),
        ];
        let second: Vec<VALUE> = (0..size)
            .map(|i| if i < kinds.len() { kinds[i] } else { ruby.str_new(&format!("v{i}")).as_raw() })
            .collect();
        let made = copy(template, &pairs(&second)).unwrap_or_else(|| panic!("{size} entries: a copy"));
        let made = RHash::from_value(unsafe { Value::from_raw(made) }).unwrap();
        assert!(!made.is_frozen(), "the caller freezes the copy");
        assert!(!made.as_value().equal(unsafe { Value::from_raw(template) }).unwrap(), "a new Hash");
        let expected = ruby.hash_new();
        for (&name, &value) in names.iter().zip(&second) {
            expected.aset(unsafe { Value::from_raw(name) }, unsafe { Value::from_raw(value) }).unwrap();
        }
        assert!(made.as_value().eql(expected).unwrap(), "{made:?} is {expected:?}");
        let order: Value = made.funcall("keys", ()).unwrap();
        assert!(order.eql(expected.funcall::<_, _, Value>("keys", ()).unwrap()).unwrap(), "in insertion order");
        for (&name, &value) in names.iter().zip(&second) {
            let found: Value = made.aref(unsafe { Value::from_raw(name) }).unwrap();
            assert!(found.equal(unsafe { Value::from_raw(value) }).unwrap(), "{size} entries: looked up");
            let by_text: Value = made.aref(ruby.str_new(&format!("{}", unsafe { Value::from_raw(name) }))).unwrap();
            assert!(by_text.equal(found).unwrap(), "{size} entries: looked up by an equal String");
        }
        assert!(made.get(ruby.str_new("fact_99")).is_none(), "no other key");
        let kept: Value = unsafe { RHash::from_value(Value::from_raw(template)) }
            .unwrap()
            .aref(unsafe { Value::from_raw(names[0]) })
            .unwrap();
        assert!(kept.eql(ruby.integer_from_i64(0)).unwrap(), "the template unchanged");

        let mut swapped = pairs(&second);
        if size > 1 {
            swapped.swap(0, 2);
            assert!(copy(template, &swapped).is_none(), "{size} entries: keys out of their order, no copy");
        }
        let mut renamed = pairs(&second);
        renamed[0] = frozen(ruby, "another_fact");
        assert!(copy(template, &renamed).is_none(), "{size} entries: another key, no copy");
        assert!(copy(template, &pairs(&second)[..2 * size - 2]).is_none(), "{size} entries: fewer, no copy");
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
