//! Building one store from shares of work on a few threads, merged in share order
//! while the rest are still being read, so the merge is off the critical path.
//!
//! The store is the one a single thread reading every share in order would build:
//! the first shares are read straight into the target builder, in order, by the
//! calling thread, while the others read the later shares, each into a builder of
//! its own, absorbed in order ([`Builder::absorb`] adds a share's strings and
//! values in the order they first occurred in it). A share read straight into the
//! target is never absorbed: absorbing re-interns all that a share holds, about a
//! fifth of the cost of reading it, and on two cores it was what both waited on.

use super::{Builder, Remap};
use crate::unpoisoned::lock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What a share read into a builder of its own gave: the builder and the reader's
/// result for it.
struct Read<T> {
    builder: Builder,
    result: T,
}

/// The shares read but not merged yet, and the target while no thread reads or
/// merges into it.
struct Merging<T> {
    target: Option<Builder>,
    /// The next share to merge.
    next: usize,
    waiting: BTreeMap<usize, Read<T>>,
    results: Vec<T>,
    /// Builders of shares merged, emptied for the next shares.
    spare: Vec<Builder>,
}

/// The shares the calling thread reads straight into the target before it joins
/// the others: about a third, so that by the time it is done the others have read
/// about as many, which it then absorbs while they read the rest (absorbing a share
/// costs about a fifth of reading it). All of them on one thread.
fn read_directly(shares: usize, threads: usize) -> usize {
    if threads <= 1 {
        shares
    } else {
        (shares * 35 / 100).max(1).min(shares)
    }
}

/// Reads `shares` shares with `read` on up to `threads` threads (the caller's one of
/// them) into `target`, remapping each later share's result with `remap` when it is
/// merged. Gives the target and the results in share order; `Err` when a reader
/// panicked.
pub fn read_in_order<T: Send>(
    target: Builder,
    shares: usize,
    threads: usize,
    read: impl Fn(usize, &mut Builder) -> T + Sync,
    remap: impl Fn(&mut T, &Remap) + Sync,
) -> std::thread::Result<(Builder, Vec<T>)> {
    let direct = read_directly(shares, threads);
    // The target is out (with the calling thread) until the direct shares are read:
    // nothing is merged before them.
    let merging = Mutex::new(Merging {
        target: None,
        next: 0,
        waiting: BTreeMap::new(),
        results: Vec::with_capacity(shares),
        spare: Vec::new(),
    });
    let claimed = AtomicUsize::new(direct);
    let work = || loop {
        let share = claimed.fetch_add(1, Ordering::Relaxed);
        if share >= shares {
            return;
        }
        let mut builder = lock(&merging).spare.pop().unwrap_or_default();
        let result = read(share, &mut builder);
        lock(&merging).waiting.insert(share, Read { builder, result });
        merge_ready(&merging, &remap, || claimed.load(Ordering::Relaxed) < shares);
    };
    let mut target = Some(target);
    let first = || {
        let mut target = target.take().expect("the target, once");
        let results: Vec<T> = (0..direct).map(|share| read(share, &mut target)).collect();
        let mut state = lock(&merging);
        state.results.extend(results);
        state.next = direct;
        state.target = Some(target);
        drop(state);
        merge_ready(&merging, &remap, || claimed.load(Ordering::Relaxed) < shares);
        work();
    };
    let finished = std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads.min(shares)).map(|_| scope.spawn(work)).collect();
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(first));
        helpers.into_iter().map(|helper| helper.join()).fold(mine, Result::and)
    });
    finished?;
    let Merging { target, next, results, .. } = merging.into_inner().unwrap_or_else(|p| p.into_inner());
    debug_assert_eq!(next, shares);
    Ok((target.expect("every share merged"), results))
}

/// Merges the shares that are next in order, if no other thread is merging and the
/// direct shares are read: the target is taken out while it absorbs, so readers
/// only wait for the lock.
/// A merged share's builder is kept for the next share while `more_to_read`, and
/// freed once none is left: the target is at its largest then.
fn merge_ready<T>(merging: &Mutex<Merging<T>>, remap: &impl Fn(&mut T, &Remap), more_to_read: impl Fn() -> bool) {
    let mut state = lock(merging);
    let Some(mut target) = state.target.take() else { return };
    loop {
        let next = state.next;
        let Some(Read { builder, mut result }) = state.waiting.remove(&next) else { break };
        drop(state);
        let remapped = target.absorb(builder.store());
        remap(&mut result, &remapped);
        let spare = more_to_read().then(|| {
            let mut builder = builder;
            builder.clear();
            builder
        });
        state = lock(merging);
        state.spare.extend(spare);
        state.results.push(result);
        state.next += 1;
    }
    state.target = Some(target);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::json;
    use crate::store::ValueId;

    /// Documents that share values, repeat keys out of order, and fail half way.
    fn documents() -> Vec<String> {
        (0..40)
            .map(|i| match i % 7 {
                3 => format!(r#"{{"host": "h{i}", "os": {{"family": "Debian", "release": [12, {}]}}, "up": "#, i % 3),
                5 => "[]".to_string(),
                _ => format!(
                    r#"{{"z": {i}, "host": "h{i}", "os": {{"release": [12, {}], "family": "Debian"}}, "tags": ["a", "t{}"], "z": 1.5}}"#,
                    i % 3,
                    i % 4
                ),
            })
            .collect()
    }

    fn read_one(text: &str, builder: &mut Builder) -> Result<ValueId, String> {
        let mark = builder.open();
        json::decode(builder, text.as_bytes(), 8).map_err(|e| {
            builder.discard_open(mark);
            e.to_string()
        })
    }

    #[test]
    fn any_shares_on_any_threads_build_the_store_one_reader_builds_id_for_id() {
        let docs = documents();
        let mut alone = Builder::new();
        let expected: Vec<Result<ValueId, String>> = docs.iter().map(|d| read_one(d, &mut alone)).collect();
        for share in [1, 3, 7, 40] {
            let chunks: Vec<&[String]> = docs.chunks(share).collect();
            for threads in [1, 2, 3] {
                let read = |i: usize, builder: &mut Builder| -> Vec<Result<ValueId, String>> {
                    chunks[i].iter().map(|d| read_one(d, builder)).collect()
                };
                let remap = |results: &mut Vec<Result<ValueId, String>>, remap: &Remap| {
                    for id in results.iter_mut().flatten() {
                        *id = remap.values[*id as usize];
                    }
                };
                let (built, results) = read_in_order(Builder::new(), chunks.len(), threads, read, remap).unwrap();
                assert_eq!(built.store(), alone.store(), "{share} per share on {threads} threads");
                assert_eq!(results.concat(), expected, "{share} per share on {threads} threads");
            }
        }
    }

    #[test]
    fn the_first_third_of_the_shares_is_read_straight_into_the_target_and_all_on_one_thread() {
        const SHARES: usize = 20;
        for (threads, direct) in [(1, SHARES), (2, 7), (3, 7)] {
            let mut target = Builder::new();
            let marker = target.string("read into the target");
            // Whether each share was read into the target (which holds the marker).
            let read = |i: usize, builder: &mut Builder| {
                let store = builder.store();
                let into_target = store.strings() > marker as usize && store.str(marker) == "read into the target";
                builder.int(i as i64);
                into_target
            };
            let (_, results) = read_in_order(target, SHARES, threads, read, |_, _| {}).unwrap();
            let expected: Vec<bool> = (0..SHARES).map(|i| i < direct).collect();
            assert_eq!(results, expected, "{threads} threads");
        }
    }

    #[test]
    fn a_reader_that_panics_is_an_error_not_a_partial_store() {
        let read = |i: usize, builder: &mut Builder| {
            assert_ne!(i, 2, "a reader panics");
            builder.int(i as i64)
        };
        assert!(read_in_order(Builder::new(), 4, 2, read, |_, _| {}).is_err());
    }

    #[test]
    fn a_builder_cleared_is_as_new() {
        let mut used = Builder::new();
        read_one(&documents()[0], &mut used).unwrap();
        used.clear();
        assert_eq!(used.store(), Builder::new().store());
        let (mut again, mut fresh) = (used, Builder::new());
        let docs = documents();
        let ids: Vec<_> = docs.iter().map(|d| read_one(d, &mut again)).collect();
        assert_eq!(ids, docs.iter().map(|d| read_one(d, &mut fresh)).collect::<Vec<_>>());
        assert_eq!(again.store(), fresh.store());
    }
}
