//! Indexes per fact path, built on first use in a generation and kept for it.
//!
//! A path's index gives each server a code, one per distinct value found there
//! (hash-consing made equal values one id). A clause is then tested once per
//! distinct value, not once per server: a regex over `os.family` runs a handful of
//! times however large the fleet, and a query is a table lookup per candidate.
//! Those per-value results are kept too, per clause, so a repeated clause costs
//! only the lookups.

use super::server::PathHints;
use super::Index;
use crate::query::Clause;
use crate::store::{StrId, ValueId};
use crate::unpoisoned::lock;
use hashbrown::HashMap;
use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

/// Paths with an index at once; the least recently queried goes first.
const PATHS: NonZeroUsize = NonZeroUsize::new(64).unwrap();
/// Clauses whose results are kept per path.
const CLAUSES_PER_PATH: NonZeroUsize = NonZeroUsize::new(16).unwrap();

/// What a server has at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Found {
    /// No fact there: matches nothing.
    Missing,
    Value(ValueId),
    /// Text tested as such: the server's environment, or its certname for a
    /// `certname` path without such a fact.
    Text(StrId),
}

#[derive(Debug)]
struct PathIndex {
    /// Per position, the code of what the server has there.
    codes: Vec<u32>,
    /// Per code, what it stands for.
    distinct: Vec<Found>,
    /// Per clause text, whether each code satisfies it (a bit per code).
    results: Mutex<LruCache<String, Arc<Vec<u64>>>>,
}

#[derive(Debug)]
pub(super) struct PathIndexes {
    paths: Mutex<LruCache<String, Arc<PathIndex>>>,
}

impl Default for PathIndexes {
    fn default() -> PathIndexes {
        PathIndexes { paths: Mutex::new(LruCache::new(PATHS)) }
    }
}

/// One clause, ready to test servers by position.
pub(super) struct ClauseTest {
    path: Arc<PathIndex>,
    results: Arc<Vec<u64>>,
}

impl ClauseTest {
    pub(super) fn holds(&self, position: u32) -> bool {
        let code = self.path.codes[position as usize] as usize;
        self.results[code / 64] >> (code % 64) & 1 == 1
    }

    /// What the server at `position` has at the path, as [`Self::holds`] tested it.
    pub(super) fn found(&self, position: u32) -> Found {
        self.path.distinct[self.path.codes[position as usize] as usize]
    }
}

impl PathIndexes {
    pub(super) fn test(&self, index: &Index, clause: &Clause) -> ClauseTest {
        let path = self.path(index, clause);
        let cached = lock(&path.results).get(clause.text()).cloned();
        let results = cached.unwrap_or_else(|| {
            let results = Arc::new(evaluate(index, &path, clause));
            lock(&path.results).put(clause.text().to_string(), results.clone());
            results
        });
        ClauseTest { path, results }
    }

    fn path(&self, index: &Index, clause: &Clause) -> Arc<PathIndex> {
        if let Some(hit) = lock(&self.paths).get(clause.path()) {
            return hit.clone();
        }
        // Built outside the lock; two threads may both build a new path once.
        let built = Arc::new(build(index, clause));
        lock(&self.paths).put(clause.path().to_string(), built.clone());
        built
    }

    /// Bytes held by the path indexes built so far.
    pub(super) fn heap_bytes(&self) -> usize {
        lock(&self.paths)
            .iter()
            .map(|(name, p)| {
                let results: usize = lock(&p.results).iter().map(|(k, r)| k.len() + 8 * r.len()).sum();
                name.len() + 4 * p.codes.capacity() + std::mem::size_of::<Found>() * p.distinct.capacity() + results
            })
            .sum()
    }
}

/// The path's index: one code per distinct [`Found`], in order of first sight.
fn build(index: &Index, clause: &Clause) -> PathIndex {
    let rows = &index.rows;
    let found: Vec<Found> = if clause.path() == "environment" {
        rows.environment.iter().map(|&id| Found::Text(id)).collect()
    } else {
        // Every server's facts object first, then the path in each: the objects lie
        // all over the store, and loops of independent reads let the CPU overlap
        // the cache misses that one loop doing everything would take one by one.
        let servers = (0..index.len() as u32).map(|p| index.server(p));
        let facts: Vec<_> = servers.clone().map(|server| server.facts()).collect();
        let (path, mut hints) = (clause.fact_path(), PathHints::new(clause.fact_path()));
        let certname_fallback = clause.path() == "certname";
        servers
            .zip(facts)
            .map(|(server, facts)| match server.fact_in(facts, path, &mut hints) {
                Some(value) => Found::Value(value.id()),
                None if certname_fallback => Found::Text(rows.certname[server.position() as usize]),
                None => Found::Missing,
            })
            .collect()
    };
    let mut codes = Vec::with_capacity(found.len());
    let mut distinct = Vec::new();
    let mut code_of: HashMap<Found, u32> = HashMap::with_capacity(found.len().min(1 << 16));
    for found in found {
        let code = *code_of.entry(found).or_insert_with(|| {
            distinct.push(found);
            distinct.len() as u32 - 1
        });
        codes.push(code);
    }
    PathIndex { codes, distinct, results: Mutex::new(LruCache::new(CLAUSES_PER_PATH)) }
}

/// Whether each distinct value at the path satisfies the clause.
fn evaluate(index: &Index, path: &PathIndex, clause: &Clause) -> Vec<u64> {
    let mut bits = vec![0u64; path.distinct.len().div_ceil(64)];
    for (code, found) in path.distinct.iter().enumerate() {
        let holds = match *found {
            Found::Missing => false,
            Found::Value(id) => clause.holds_on_view(index.store.view(id)),
            Found::Text(id) => clause.holds_on_text(index.store.str(id)),
        };
        if holds {
            bits[code / 64] |= 1 << (code % 64);
        }
    }
    bits
}
