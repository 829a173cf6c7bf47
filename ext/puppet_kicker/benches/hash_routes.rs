//! What a frozen Hash costs MRI by each route of its public C API that the magnus
//! binding could take for a server's Hash, and what keeping 3,787 of them (the
//! servers of `servers_with_role('node')` in the synthetic fleet) costs each minor
//! garbage collection afterwards. The figures src/same_keys.rs cites.
//!
//!   cargo bench -p puppet-kicker-ruby --bench hash_routes
//!
//! In an embedded VM (the Ruby rb-sys builds against), with the GC off while Hashes
//! are made, as in the converter. Each route makes 3,787 Hashes of N frozen String
//! keys (the top-level facts of a server: 146 on average in the synthetic fleet) with
//! other values each time; the median of 9 rounds, per Hash. Then, with a route's
//! 3,787 Hashes kept and promoted (three full GCs), the mean of 20 minor GCs.
//!
//! - insertion: `rb_hash_new` + `rb_hash_bulk_insert` (the binding's first Hash of a
//!   key sequence);
//! - dup only: `rb_hash_dup` of a template, its values unchanged (a floor);
//! - dup, `RHASH_TBL`, values replaced: a copy of the template whose values
//!   `st_foreach_with_replace` replaces, handed out (left unprotected by write
//!   barriers: `RHASH_TBL` makes it so);
//! - scratch refilled, then dup (src/same_keys.rs): one such copy kept as scratch,
//!   its values replaced for each Hash, and a `rb_hash_dup` of it handed out;
//! - dup, then `rb_hash_aset` each value.
//!
//! Also `rb_protect`'s own cost per call (the binding makes one per server).

use magnus::rb_sys::protect;
use magnus::value::ReprValue;
use magnus::{Ruby, Value};
use rb_sys::{
    rb_ary_clear, rb_ary_new, rb_ary_push, rb_gc_register_address, rb_hash_aset, rb_hash_bulk_insert, rb_hash_dup,
    rb_hash_new, rb_hash_tbl, rb_obj_freeze, rb_st_foreach_with_replace, rb_utf8_str_new, st_data_t, st_retval,
    st_table, VALUE,
};
use std::os::raw::{c_int, c_long};
use std::time::Instant;

const HASHES: usize = 3787;
const ROUNDS: usize = 9;

fn main() {
    // SAFETY: the only VM of this process, started and used on this thread.
    let _cleanup = unsafe { magnus::embed::init() };
    let ruby = Ruby::get().unwrap();
    println!("{}; {HASHES} Hashes a round, the median of {ROUNDS} rounds.", ruby_description(&ruby));
    println!();
    println!("| Route | Entries | per Hash | a minor GC with {HASHES} kept |");
    println!("| --- | ---: | ---: | ---: |");
    for entries in [8, 16, 146] {
        routes(&ruby, entries);
    }
    println!();
    let calls = 1_000_000;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let started = Instant::now();
        for i in 0..calls {
            let outcome = protect(|| std::hint::black_box(i as VALUE) | 1);
            std::hint::black_box(outcome.ok());
        }
        best = best.min(started.elapsed().as_secs_f64() / calls as f64);
    }
    println!("`rb_protect` (magnus's `protect`) of a closure that returns at once: {:.1} ns a call.", best * 1e9);
}

fn ruby_description(ruby: &Ruby) -> String {
    ruby.eval::<String>("RUBY_DESCRIPTION").unwrap()
}

/// A GC root that Rust holds.
fn root(value: VALUE) -> &'static VALUE {
    let held = Box::leak(Box::new(value));
    // SAFETY: a static address, registered once.
    unsafe { rb_gc_register_address(held as *mut VALUE) };
    held
}

fn frozen(text: &str) -> VALUE {
    // SAFETY: a new String from UTF-8 text.
    unsafe { rb_obj_freeze(rb_utf8_str_new(text.as_ptr() as *const _, text.len() as c_long)) }
}

fn routes(ruby: &Ruby, entries: usize) {
    let keys: Vec<VALUE> = (0..entries).map(|i| frozen(&format!("fact_name_{i:03}"))).collect();
    let values: Vec<VALUE> = (0..4 * entries).map(|i| frozen(&format!("value {i}"))).collect();
    // Kept alive by Arrays rooted here.
    let held = root(unsafe { rb_ary_new() });
    for &object in keys.iter().chain(&values) {
        unsafe { rb_ary_push(*held, object) };
    }
    let pairs: Vec<Vec<VALUE>> = (0..HASHES)
        .map(|h| keys.iter().enumerate().flat_map(|(k, &key)| [key, values[(k + h) % values.len()]]).collect())
        .collect();
    let template = *root(unsafe { rb_obj_freeze(inserted(&pairs[0])) });
    let kept = *root(unsafe { rb_ary_new() });
    let scratch = *root(unsafe { rb_hash_dup(template) });
    let scratch_table = unsafe { rb_hash_tbl(scratch, c"hash_routes.rs".as_ptr(), line!() as c_int) };

    let route = |name: &str, make: &mut dyn FnMut(&[VALUE]) -> VALUE| {
        let mut rounds = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            unsafe { rb_ary_clear(kept) };
            ruby.gc_start();
            let was_disabled = ruby.gc_disable();
            let started = Instant::now();
            for pairs in &pairs {
                let hash = unsafe { rb_obj_freeze(make(pairs)) };
                unsafe { rb_ary_push(kept, hash) };
            }
            rounds.push(started.elapsed().as_secs_f64() / HASHES as f64);
            if !was_disabled {
                ruby.gc_enable();
            }
        }
        rounds.sort_by(f64::total_cmp);
        let minor = minor_gc(ruby);
        println!("| {name} | {entries} | {:.2} µs | {:.3} ms |", rounds[ROUNDS / 2] * 1e6, minor * 1e3);
    };
    route("insertion (`rb_hash_new`, `rb_hash_bulk_insert`)", &mut |pairs| unsafe { inserted(pairs) });
    route("`rb_hash_dup` only", &mut |_| unsafe { rb_hash_dup(template) });
    route("`rb_hash_dup`, `RHASH_TBL`, values replaced, handed out", &mut |pairs| unsafe {
        let copy = rb_hash_dup(template);
        fill(rb_hash_tbl(copy, c"hash_routes.rs".as_ptr(), line!() as c_int), pairs);
        copy
    });
    route("scratch refilled, then `rb_hash_dup` (src/same_keys.rs)", &mut |pairs| unsafe {
        fill(scratch_table, pairs);
        rb_hash_dup(scratch)
    });
    route("`rb_hash_dup`, then `rb_hash_aset` each", &mut |pairs| unsafe {
        let copy = rb_hash_dup(template);
        for pair in pairs.chunks_exact(2) {
            rb_hash_aset(copy, pair[0], pair[1]);
        }
        copy
    });
    unsafe { rb_ary_clear(kept) };
}

unsafe fn inserted(pairs: &[VALUE]) -> VALUE {
    let hash = rb_hash_new();
    rb_hash_bulk_insert(pairs.len() as c_long, pairs.as_ptr(), hash);
    hash
}

/// Mean seconds of 20 minor GCs, after three full ones.
fn minor_gc(ruby: &Ruby) -> f64 {
    for _ in 0..3 {
        ruby.gc_start();
    }
    let timed: Value = ruby
        .eval(
            "t = Process.clock_gettime(Process::CLOCK_MONOTONIC); 20.times { GC.start(full_mark: false) }; \
             (Process.clock_gettime(Process::CLOCK_MONOTONIC) - t) / 20",
        )
        .unwrap();
    timed.funcall("to_f", ()).unwrap()
}

/// Replaces the values of `table` by those of `pairs`, in order, as src/same_keys.rs.
unsafe fn fill(table: *mut st_table, pairs: &[VALUE]) {
    let mut next = 0usize;
    let filled =
        rb_st_foreach_with_replace(table, Some(check), Some(replace), &mut (pairs, &mut next) as *mut _ as st_data_t);
    assert!(filled == 0 && next == pairs.len() / 2, "every value replaced");
}

type Fill<'a> = (&'a [VALUE], &'a mut usize);

unsafe extern "C" fn check(key: st_data_t, _value: st_data_t, fill: st_data_t, _error: c_int) -> c_int {
    let (pairs, next) = &*(fill as *const Fill);
    if pairs.get(2 * **next) == Some(&(key as VALUE)) {
        st_retval::ST_REPLACE as c_int
    } else {
        st_retval::ST_STOP as c_int
    }
}

unsafe extern "C" fn replace(_key: *mut st_data_t, value: *mut st_data_t, fill: st_data_t, _existing: c_int) -> c_int {
    let (pairs, next) = &mut *(fill as *mut Fill);
    *value = pairs[2 * **next + 1] as st_data_t;
    **next += 1;
    st_retval::ST_CONTINUE as c_int
}
