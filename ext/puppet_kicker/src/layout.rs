//! Where a Hash keeps its keys and values in MRI's memory, so that a copy of a
//! template Hash can take its own values in place ([`crate::template`]).
//!
//! MRI keeps a Hash of up to 8 entries in an array table (key and value pairs, a
//! one-byte hint of each key's hash beside them) and a bigger one in an st table
//! (entries of hash, key and value). No exported function writes a value of an
//! array table in place, and the st one (`st_foreach_with_replace`) calls back per
//! entry; so this module reads the layouts themselves, which are private:
//!
//! - st table: `struct st_table` is public (`ruby/st.h`); its entries are
//!   `{ hash, key, record }` (`st.c`), unchanged from Ruby 2.4 to 3.4. Reached
//!   through `rb_hash_tbl_raw`, which MRI exports without declaring it.
//! - array table, Ruby 3.1 (and 3.2): `struct RHash { RBasic; union { st, ar } as;
//!   ifnone; ar_hint; }`, the table `{ pairs[8] }` elsewhere, at `as.ar`.
//! - array table, Ruby 3.3: `struct RHash { RBasic; ifnone; }` with the table
//!   `{ ar_hint; pairs[8] }` right behind it, in the same slot.
//!
//! Array tables are read only on the Rubies whose layout is listed above and
//! tested (3.1, Debian 12's; 3.3, Debian 13's); elsewhere small Hashes are built
//! by insertion. And every table is read only once its flags say it is the
//! expected kind and size; its keys are then compared, one by one, with the ones
//! expected ([`Pairs::holds`]) before any value is written.

use rb_sys::{ruby_fl_type, RBasic, VALUE};
use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::OnceLock;

/// The most entries MRI keeps in an array table (`RHASH_AR_TABLE_MAX_SIZE`, 8 on
/// 64-bit machines in Ruby 2.7 to 3.4); a bigger Hash has an st table.
const ARRAY_TABLE_MAX: usize = 8;

// The flags of `internal/hash.h` (the same from Ruby 2.7 to 3.4).
const ST_TABLE_FLAG: VALUE = ruby_fl_type::RUBY_FL_USER3 as VALUE;
const FL_USHIFT: u32 = rb_sys::ruby_fl_ushift::RUBY_FL_USHIFT as u32;
const AR_SIZE_SHIFT: u32 = FL_USHIFT + 4;
const AR_BOUND_SHIFT: u32 = FL_USHIFT + 8;
const AR_FIELD_MASK: VALUE = 0b1111;

/// A Hash's entries as they lie in its table: key `i` at `first[i * stride]`, its
/// value in the word after it.
pub struct Pairs {
    first: *mut VALUE,
    stride: usize,
    len: usize,
}

impl Pairs {
    /// Whether the table's keys are exactly `keys` (the same objects), in order.
    pub fn holds(&self, keys: impl ExactSizeIterator<Item = VALUE>) -> bool {
        // SAFETY: `first` and `stride` come from `of`, which checked the table's size.
        keys.len() == self.len && keys.enumerate().all(|(i, key)| unsafe { *self.first.add(i * self.stride) } == key)
    }

    /// The value of entry `i` (below [`Self::len`]).
    pub fn value(&self, i: usize) -> VALUE {
        assert!(i < self.len, "entry {i} of {}", self.len);
        // SAFETY: within the table (checked above).
        unsafe { *self.first.add(i * self.stride + 1) }
    }

    /// Writes the values of `pairs` (keys and values alternating) into the table,
    /// entry by entry, each only once its key is found to be the pair's key; false
    /// at the first that is not (the table then holds some of the values), or when
    /// the counts differ. No write barrier: the caller owes it (none for a Hash made
    /// while the GC is off and never promoted).
    ///
    /// # Safety
    /// The Hash must be alive, unfrozen and seen by no one else yet, and every value
    /// a live object or an immediate.
    pub unsafe fn fill(&mut self, pairs: &[VALUE]) -> bool {
        if pairs.len() != 2 * self.len {
            return false;
        }
        let mut at = self.first;
        for pair in pairs.chunks_exact(2) {
            if *at != pair[0] {
                return false;
            }
            *at.add(1) = pair[1];
            at = at.add(self.stride);
        }
        true
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

/// The entries of `hash`, if its table is one this module knows and holds exactly
/// `len` entries with none deleted.
///
/// # Safety
/// `hash` must be a live Hash.
pub unsafe fn of(hash: VALUE, len: usize) -> Option<Pairs> {
    let known = Mri::found()?;
    let flags = (*(hash as *const RBasic)).flags;
    if flags & ST_TABLE_FLAG != 0 {
        let table = (known.st_table?)(hash, c"layout.rs".as_ptr(), line!() as c_int) as *mut rb_sys::st_table;
        let table = table.as_mut()?;
        let (start, bound) = (table.entries_start as usize, table.entries_bound as usize);
        if table.num_entries as usize != len || bound.checked_sub(start) != Some(len) || table.entries.is_null() {
            return None;
        }
        let entries = table.entries as *mut StEntry;
        return Some(Pairs { first: &raw mut (*entries.add(start)).key, stride: 3, len });
    }
    let size = ((flags >> AR_SIZE_SHIFT) & AR_FIELD_MASK) as usize;
    let bound = ((flags >> AR_BOUND_SHIFT) & AR_FIELD_MASK) as usize;
    if size != len || bound != len || len == 0 || len > ARRAY_TABLE_MAX {
        return None;
    }
    let pairs = match known.array_table? {
        ArrayTable::Pointed => *(hash as *const *mut VALUE).add(2),
        ArrayTable::Embedded => (hash as *mut VALUE).add(4),
    };
    (!pairs.is_null()).then_some(Pairs { first: pairs, stride: 2, len })
}

/// `struct st_table_entry` (`st.c`).
#[repr(C)]
struct StEntry {
    hash: usize,
    key: VALUE,
    record: VALUE,
}

/// Where an array table lies, by Ruby version.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArrayTable {
    /// Ruby 3.1: at the pointer in `RHash.as` (the third word).
    Pointed,
    /// Ruby 3.3: behind the two words of `RHash` after `RBasic`'s two, its hint
    /// word first (so its pairs start at the fifth word).
    Embedded,
}

type TableOf = unsafe extern "C" fn(VALUE, *const c_char, c_int) -> *mut c_void;

/// What this Ruby offers: `rb_hash_tbl_raw`, if exported, and the array table's
/// layout, if this Ruby's is one listed above.
#[derive(Clone, Copy)]
struct Mri {
    st_table: Option<TableOf>,
    array_table: Option<ArrayTable>,
}

impl Mri {
    fn found() -> Option<Mri> {
        static FOUND: OnceLock<Option<Mri>> = OnceLock::new();
        *FOUND.get_or_init(|| {
            // SAFETY: dlsym with RTLD_DEFAULT searches the loaded objects (libruby
            // among them); the symbol has the type declared in MRI's sources.
            let table = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"rb_hash_tbl_raw".as_ptr()) };
            let st_table = (!table.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, TableOf>(table) });
            let found = Mri { st_table, array_table: array_table_of(ruby_version()) };
            (found.st_table.is_some() || found.array_table.is_some()).then_some(found)
        })
    }
}

/// The running Ruby's major and minor version (`ruby_api_version`).
pub fn ruby_version() -> (i32, i32) {
    // SAFETY: a constant array MRI exports.
    let version = unsafe { rb_sys::ruby_api_version };
    (version[0], version[1])
}

/// The array table layout of a Ruby version, for the versions listed above.
pub fn array_table_of(version: (i32, i32)) -> Option<ArrayTable> {
    match version {
        (3, 1) => Some(ArrayTable::Pointed),
        (3, 3) => Some(ArrayTable::Embedded),
        _ => None,
    }
}

/// The layout this Ruby's small Hashes are read with, if any.
#[cfg(test)]
pub fn array_table() -> Option<ArrayTable> {
    Mri::found().and_then(|mri| mri.array_table)
}

/// Whether this Ruby's big Hashes' tables can be reached.
#[cfg(test)]
pub fn st_table() -> bool {
    Mri::found().is_some_and(|mri| mri.st_table.is_some())
}
