//! Whole answers, kept per index generation.
//!
//! Manifests and templates ask the same few questions on every compile. An answer
//! is kept with the index it came from, so an identical call costs one lookup, and
//! a binding can hand back the very Ruby Array it built the first time (see
//! [`Answer::id`]).
//!
//! The index never changes, but `max_age` is measured from now: servers only ever
//! age out. An answer therefore holds until its oldest selected server passes
//! `max_age`, and is computed again after that (or if the clock went back).

use super::{Freshness, Index};
use crate::unpoisoned::lock;
use hashbrown::HashMap;
use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Distinct questions answered per generation; manifests ask a few dozen.
pub const ANSWERS: NonZeroUsize = NonZeroUsize::new(256).unwrap();

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A function's arguments, as the caller gave them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Question {
    Role { roles: Vec<String>, environment: String },
    Facts { clauses: Vec<String>, environment: String },
}

/// Positions selected for a question, in result order.
#[derive(Debug)]
pub struct Answer {
    /// Unique in the process: the same id is the same answer, whatever the question.
    pub id: u64,
    pub positions: Vec<u32>,
    /// Computed at this Unix second...
    computed_at: i64,
    /// ...and true up to this one (inclusive).
    valid_until: i64,
}

impl Answer {
    fn holds_at(&self, now: i64) -> bool {
        (self.computed_at..=self.valid_until).contains(&now)
    }
}

type Key = (Question, u64);

#[derive(Debug)]
pub(super) struct Answers {
    kept: Mutex<CachedAnswers>,
}

/// The answers by question and max_age, and the key of each by its id (for
/// [`Index::answer_holds`]): the two always hold the same answers.
#[derive(Debug)]
struct CachedAnswers {
    by_key: LruCache<Key, Arc<Answer>>,
    by_id: HashMap<u64, Key>,
}

impl Default for Answers {
    fn default() -> Answers {
        Answers { kept: Mutex::new(CachedAnswers { by_key: LruCache::new(ANSWERS), by_id: HashMap::new() }) }
    }
}

impl Answers {
    pub(super) fn heap_bytes(&self) -> usize {
        lock(&self.kept).by_key.iter().map(|(_, answer)| 4 * answer.positions.capacity() + 64).sum()
    }
}

impl Index {
    /// The answer to `question`, kept from an earlier identical call while it holds,
    /// else computed by `compute` (outside the lock) and kept.
    pub fn answer<E>(
        &self,
        question: Question,
        fresh: Freshness,
        compute: impl FnOnce() -> Result<Vec<u32>, E>,
    ) -> Result<Arc<Answer>, E> {
        let key = (question, fresh.max_age);
        if let Some(kept) = lock(&self.answers.kept).by_key.get(&key).filter(|a| a.holds_at(fresh.now)) {
            return Ok(kept.clone());
        }
        let positions = compute()?;
        let oldest = positions.iter().map(|p| self.rows.timestamp[*p as usize]).min();
        let valid_until = oldest.map_or(i64::MAX, |t| t.saturating_add(fresh.max_age.min(i64::MAX as u64) as i64));
        let answer = Arc::new(Answer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            positions,
            computed_at: fresh.now,
            valid_until,
        });
        let mut kept = lock(&self.answers.kept);
        // The answer replaced (same key) or the least recently used one evicted.
        if let Some((_, dropped)) = kept.by_key.push(key.clone(), answer.clone()) {
            kept.by_id.remove(&dropped.id);
        }
        kept.by_id.insert(answer.id, key);
        Ok(answer)
    }

    /// Whether answer `id` is what [`Self::answer`] would return now for the
    /// question it answered, with `fresh.max_age`: kept by this index, and holding at
    /// `fresh.now` (no selected server past max_age). Counts as a use of that
    /// answer, as the identical call would. A caller that holds what it built for
    /// `id` may then return it without asking the question again.
    pub fn answer_holds(&self, id: u64, fresh: Freshness) -> bool {
        let mut kept = lock(&self.answers.kept);
        let CachedAnswers { by_key, by_id } = &mut *kept;
        let Some(key) = by_id.get(&id).filter(|key| key.1 == fresh.max_age) else { return false };
        by_key.get(key).is_some_and(|answer| answer.id == id && answer.holds_at(fresh.now))
    }
}
