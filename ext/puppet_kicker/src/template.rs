//! Hashes copied from a template with the same keys, instead of built by inserting
//! every key again.
//!
//! Most of a server's first conversion is MRI hashing fact names (SipHash) and
//! inserting them into new tables. Servers repeat their key sequences: the servers
//! of a role have the same top-level fact names, every `networking.interfaces.eth0`
//! the same keys. So the first Hash made with a key sequence is kept as its
//! template, and a later Hash with those keys is a copy of it (`rb_hash_dup`: the
//! table copied whole, keys' hashes included) whose values are replaced in place,
//! in entry order (`st_foreach_with_replace`), as MRI's own `Hash#transform_values!`
//! replaces them. A write barrier is owed only by an old object (or while the GC
//! marks incrementally): the conversion runs with the GC disabled, which first ends
//! any marking under way, so a new copy stays young and needs none. A copy found
//! promoted all the same gets one per value.
//!
//! Only Hashes of more than [`ARRAY_TABLE_MAX`] entries: smaller ones are MRI's array
//! tables, which no exported function replaces values of; they are built as before.
//! The table comes from `rb_hash_tbl_raw`, which MRI exports without declaring it
//! public; it and `rb_st_foreach_with_replace` are looked up when first needed, and
//! where either is missing every Hash is built by insertion. (The public
//! `rb_hash_tbl` marks each copy unprotected by write barriers, so every minor GC of
//! a compile would scan every copy again.) A copy whose keys are not exactly the
//! ones expected, one by one, is dropped and the Hash built by insertion.

use magnus::rb_sys::AsRawValue;
use magnus::value::Lazy;
use magnus::{RArray, Ruby};
use puppet_kicker::store::StrId;
use rb_sys::{rb_ary_entry, rb_ary_push, rb_gc_writebarrier, rb_hash_dup, VALUE};
use rustc_hash::FxHashMap;
use std::ffi::c_void;
use std::os::raw::{c_char, c_int, c_long};
use std::sync::{LazyLock, Mutex, OnceLock};

/// The most entries MRI keeps in an array table (`RHASH_AR_TABLE_MAX_SIZE`, 8 in
/// Ruby 2.7 to 3.4); a bigger Hash has an st table.
pub const ARRAY_TABLE_MAX: usize = 8;

/// The key id [`crate::convert`] gives the `certname` a server gets when no fact has
/// that name (no string of a store has this id).
pub const CERTNAME_ID: StrId = StrId::MAX;

/// The templates of the current generation, so the GC keeps them (and may move
/// them: the map below holds their indexes here, not their addresses).
static HASHES: Lazy<RArray> = Lazy::new(|ruby| ruby.ary_new());

/// Each key sequence's template, by its index in `HASHES`. At most one entry per
/// Hash converted in the generation, each far smaller than its Hash.
static BY_KEYS: LazyLock<Mutex<FxHashMap<Box<[StrId]>, c_long>>> = LazyLock::new(Mutex::default);

/// Forgets the templates of an earlier generation.
pub fn clear(ruby: &Ruby) -> Result<(), magnus::Error> {
    ruby.get_inner(&HASHES).clear()?;
    if let Ok(mut by_keys) = BY_KEYS.lock() {
        *by_keys = FxHashMap::default();
    }
    Ok(())
}

/// A copy of the template for `keys`, with the values of `pairs` (keys and values
/// alternating, the keys those of `keys`, in order), unfrozen; `None` when there is
/// no template for these keys or the copy cannot be made. Only while the GC is
/// disabled (see above).
pub fn copy(ruby: &Ruby, keys: &[StrId], pairs: &[VALUE]) -> Option<VALUE> {
    if keys.len() <= ARRAY_TABLE_MAX {
        return None;
    }
    let mri = Mri::found()?;
    let index = *BY_KEYS.lock().ok()?.get(keys)?;
    // SAFETY: the Array is ours; index came from pushing onto it this generation.
    let template = unsafe { rb_ary_entry(ruby.get_inner(&HASHES).as_raw(), index) };
    // SAFETY: template is a Hash this module kept; rb_hash_dup makes an unfrozen
    // copy of its table (it calls no Ruby method).
    let copy = unsafe { rb_hash_dup(template) };
    let table = unsafe { (mri.table)(copy, c"template.rs".as_ptr(), line!() as c_int) };
    let barrier = promoted(copy);
    let mut fill = Fill { hash: copy, pairs, at: 0, whole: true, barrier };
    // SAFETY: the table is the copy's, which nothing else has seen; the callbacks
    // only read `fill` and write the value they are handed.
    unsafe { (mri.foreach_with_replace)(table, replace_every, put_next, &mut fill as *mut Fill as usize) };
    (fill.whole && 2 * fill.at == pairs.len()).then_some(copy)
}

/// Keeps `hash` (frozen, built by insertion) as the template for `keys`, unless
/// these keys have one already.
pub fn keep(ruby: &Ruby, keys: &[StrId], hash: VALUE) {
    if keys.len() <= ARRAY_TABLE_MAX || Mri::found().is_none() {
        return;
    }
    if BY_KEYS.lock().map_or(true, |by_keys| by_keys.contains_key(keys)) {
        return;
    }
    // No lock is held here: rb_ary_push may raise (NoMemoryError only, on an Array
    // that is ours and never frozen), and a raise skips Rust destructors (see
    // convert.rs on its rb_protect). Nothing else runs meanwhile: this thread
    // holds the GVL, and the conversion calls nothing that releases it.
    let hashes = ruby.get_inner(&HASHES);
    unsafe { rb_ary_push(hashes.as_raw(), hash) };
    if let Ok(mut by_keys) = BY_KEYS.lock() {
        by_keys.insert(keys.into(), hashes.len() as c_long - 1);
    }
}

/// Where a copy's values come from while its table is walked.
struct Fill<'a> {
    hash: VALUE,
    pairs: &'a [VALUE],
    /// Entries filled so far.
    at: usize,
    /// False once an entry's key is not the one expected.
    whole: bool,
    /// Whether each value written needs its write barrier (the copy is old).
    barrier: bool,
}

const ST_CONTINUE: c_int = 0;
const ST_STOP: c_int = 1;
const ST_REPLACE: c_int = 4;

extern "C" fn replace_every(_key: usize, _value: usize, _fill: usize, _error: c_int) -> c_int {
    ST_REPLACE
}

/// Puts the next value in place if the entry's key is the next one expected;
/// otherwise stops the walk. Never panics: it runs inside MRI's frames.
extern "C" fn put_next(key: *mut usize, value: *mut usize, fill: usize, _existing: c_int) -> c_int {
    // SAFETY: `fill` is the `Fill` that `copy` handed to this walk, alive through it;
    // key and value point at the entry being walked.
    let fill = unsafe { &mut *(fill as *mut Fill) };
    let expected = (fill.pairs.get(2 * fill.at), fill.pairs.get(2 * fill.at + 1));
    match expected {
        (Some(&k), Some(&v)) if k as usize == unsafe { *key } => {
            unsafe { *value = v as usize };
            if fill.barrier && !special_const(v) {
                // SAFETY: both are live objects.
                unsafe { rb_gc_writebarrier(fill.hash, v) };
            }
            fill.at += 1;
            ST_CONTINUE
        }
        _ => {
            fill.whole = false;
            ST_STOP
        }
    }
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

type TableOf = unsafe extern "C" fn(VALUE, *const c_char, c_int) -> *mut c_void;
type CheckEach = extern "C" fn(usize, usize, usize, c_int) -> c_int;
type ReplaceEach = extern "C" fn(*mut usize, *mut usize, usize, c_int) -> c_int;
type ForeachWithReplace = unsafe extern "C" fn(*mut c_void, CheckEach, ReplaceEach, usize) -> c_int;

/// The two MRI functions a copy needs, found in the running Ruby.
#[derive(Clone, Copy)]
struct Mri {
    table: TableOf,
    foreach_with_replace: ForeachWithReplace,
}

impl Mri {
    fn found() -> Option<Mri> {
        static FOUND: OnceLock<Option<Mri>> = OnceLock::new();
        *FOUND.get_or_init(|| {
            // SAFETY: dlsym with RTLD_DEFAULT searches the loaded objects (libruby
            // among them); each symbol has the type declared in MRI's sources.
            unsafe {
                let table = libc::dlsym(libc::RTLD_DEFAULT, c"rb_hash_tbl_raw".as_ptr());
                let foreach = libc::dlsym(libc::RTLD_DEFAULT, c"rb_st_foreach_with_replace".as_ptr());
                (!table.is_null() && !foreach.is_null()).then(|| Mri {
                    table: std::mem::transmute::<*mut c_void, TableOf>(table),
                    foreach_with_replace: std::mem::transmute::<*mut c_void, ForeachWithReplace>(foreach),
                })
            }
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use magnus::value::ReprValue;
    use magnus::{rb_sys::FromRawValue, RHash, Value};

    /// On the Rubies puppet-kicker supports, Hashes of more than 8 entries are copied,
    /// and a copy is the Hash insertion builds: the same pairs in the same order, each
    /// key found by lookup. Other keys, or fewer, find no template.
    pub(crate) fn a_copy_is_the_hash_insertion_builds(ruby: &Ruby) {
        assert!(Mri::found().is_some(), "rb_hash_tbl_raw and rb_st_foreach_with_replace are in {}", ruby_version(ruby));
        clear(ruby).unwrap();
        let was_disabled = ruby.gc_disable();
        let names: Vec<VALUE> = (0..12).map(|i| frozen(ruby, &format!("fact_{i:02}"))).collect();
        let ids: Vec<StrId> = (100..112).collect();
        let pairs = |values: &[Value]| -> Vec<VALUE> {
            names.iter().zip(values).flat_map(|(&name, value)| [name, value.as_raw()]).collect()
        };
        let first: Vec<Value> = (0..12).map(|i| ruby.integer_from_i64(i).as_value()).collect();
        let built = ruby.hash_new();
        for (name, value) in names.iter().zip(&first) {
            built.aset(unsafe { Value::from_raw(*name) }, *value).unwrap();
        }
        built.freeze();
        keep(ruby, &ids, built.as_raw());

        // Heap objects, immediates, nil and false: the write barrier's every case.
        let mut second: Vec<Value> = (0..9).map(|i| ruby.str_new(&format!("value {i}")).as_value()).collect();
        second.extend([ruby.qnil().as_value(), ruby.qfalse().as_value(), ruby.float_from_f64(1.5).as_value()]);
        let made = copy(ruby, &ids, &pairs(&second)).expect("a copy of the template");
        let made = RHash::from_value(unsafe { Value::from_raw(made) }).unwrap();
        assert!(!made.is_frozen(), "the caller freezes the copy");
        assert!(!made.as_value().equal(built).unwrap(), "a new Hash");
        let expected = ruby.hash_new();
        for (name, value) in names.iter().zip(&second) {
            expected.aset(unsafe { Value::from_raw(*name) }, *value).unwrap();
        }
        assert!(made.as_value().eql(expected).unwrap(), "{made:?} is {expected:?}");
        let order: Value = made.funcall("keys", ()).unwrap();
        assert!(order.eql(expected.funcall::<_, _, Value>("keys", ()).unwrap()).unwrap(), "in insertion order");
        for (name, value) in names.iter().zip(&second) {
            let found: Value = made.aref(unsafe { Value::from_raw(*name) }).unwrap();
            assert!(found.equal(*value).unwrap(), "{name} looked up");
        }
        assert!(made.get(ruby.str_new("fact_12")).is_none(), "no other key");
        let kept: Value = built.aref(unsafe { Value::from_raw(names[0]) }).unwrap();
        assert!(kept.eql(first[0]).unwrap(), "the template unchanged");

        assert!(copy(ruby, &ids[..11], &pairs(&second)[..22]).is_none(), "fewer keys: no template");
        let mut other = ids.clone();
        other[5] = 999;
        assert!(copy(ruby, &other, &pairs(&second)).is_none(), "other keys: no template");
        let mut swapped = pairs(&second);
        swapped.swap(0, 2);
        assert!(copy(ruby, &ids, &swapped).is_none(), "keys out of their order: no copy");
        assert!(copy(ruby, &ids[..8], &pairs(&second)[..16]).is_none(), "8 keys: MRI's array tables, built");
        clear(ruby).unwrap();
        assert!(copy(ruby, &ids, &pairs(&second)).is_none(), "a new generation has no template");
        if !was_disabled {
            ruby.gc_enable();
        }
    }

    fn frozen(ruby: &Ruby, text: &str) -> VALUE {
        let s = ruby.str_new(text);
        s.freeze();
        s.as_raw()
    }

    fn ruby_version(ruby: &Ruby) -> String {
        ruby.eval::<String>("RUBY_DESCRIPTION").unwrap_or_default()
    }
}
