//! The query language of `servers_with_facts` (clauses, ANDed) and the role
//! arguments of `servers_with_role`.

mod clause;
mod compare;
mod cost;
mod role;

pub use clause::{Clause, Op, Step};
pub use compare::{Comparison, Operand};
pub use role::RoleSelector;

use crate::error::{Error, Result};
use crate::facts::Node;
use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

/// A compiled `servers_with_facts` call: every clause must hold.
#[derive(Clone, Debug, Default)]
pub struct Query {
    clauses: Vec<Arc<Clause>>,
}

impl Query {
    pub fn new(clauses: Vec<Arc<Clause>>) -> Query {
        Query { clauses }
    }

    /// Compiles clauses without a cache (tests, one-off tools).
    pub fn parse<S: AsRef<str>>(texts: &[S]) -> Result<Query> {
        Query::within_budget(texts.iter().map(|t| Clause::parse(t.as_ref()).map(Arc::new)))
    }

    /// Collects compiled clauses, refusing the query once their regexes together cost
    /// more than [`cost::QUERY_BUDGET`]: each clause within it is not enough when a
    /// kick report may carry a hundred.
    fn within_budget(clauses: impl Iterator<Item = Result<Arc<Clause>>>) -> Result<Query> {
        let mut total = 0;
        let mut kept = Vec::new();
        for clause in clauses {
            let clause = clause?;
            total += clause.cost();
            if total > cost::QUERY_BUDGET {
                return Err(Error::Query(format!(
                    "clause '{}': the query's regexes would take too long to compile together (cost {total} by \
                     this clause, at most {}); use fewer regex clauses or fewer character classes",
                    clause.text(),
                    cost::QUERY_BUDGET
                )));
            }
            kept.push(clause);
        }
        Ok(Query { clauses: kept })
    }

    pub fn clauses(&self) -> &[Arc<Clause>] {
        &self.clauses
    }

    /// A clause on `environment` replaces the compiling node's environment as scope.
    pub fn names_environment(&self) -> bool {
        self.clauses.iter().any(|c| c.path() == "environment")
    }

    pub fn matches(&self, node: &Node) -> bool {
        self.clauses.iter().all(|c| c.matches(node))
    }
}

/// Compiled clauses by their text: manifests repeat the same few clauses on every
/// compile, and compiling a regex costs far more than the lookup it serves.
pub struct ClauseCache {
    cache: Mutex<LruCache<String, Arc<Clause>>>,
}

impl ClauseCache {
    pub fn new(capacity: usize) -> ClauseCache {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        ClauseCache { cache: Mutex::new(LruCache::new(capacity)) }
    }

    pub fn compile<S: AsRef<str>>(&self, texts: &[S]) -> Result<Query> {
        Query::within_budget(texts.iter().map(|t| self.clause(t.as_ref())))
    }

    fn clause(&self, text: &str) -> Result<Arc<Clause>> {
        if let Some(hit) = self.lock().get(text) {
            return Ok(hit.clone());
        }
        // Compile outside the lock; two threads may both compile a new clause once.
        let clause = Arc::new(Clause::parse(text)?);
        self.lock().put(text.to_string(), clause.clone());
        Ok(clause)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, Arc<Clause>>> {
        // A poisoned cache only means another thread panicked mid-`put`; the map is
        // still consistent, so keep using it.
        crate::unpoisoned::lock(&self.cache)
    }
}

#[cfg(test)]
mod tests;
