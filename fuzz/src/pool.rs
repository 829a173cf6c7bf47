//! Builders for a target's inputs, emptied (`Builder::clear`: as new, the same ids)
//! rather than made anew: a new builder's tables are about 150 KB the kernel maps and
//! zeroes, which was half of an input's time in the targets that fill two or three
//! builders per input.

use puppet_kicker::store::Builder;
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

thread_local! {
    static POOL: RefCell<Vec<Builder>> = const { RefCell::new(Vec::new()) };
}

/// An empty builder, back in the pool when dropped.
pub struct Pooled(Option<Builder>);

/// An empty builder: one of the pool's, cleared, or a new one.
pub fn builder() -> Pooled {
    let kept = POOL.with_borrow_mut(Vec::pop);
    Pooled(Some(kept.map_or_else(Builder::new, |mut b| {
        b.clear();
        b
    })))
}

impl Deref for Pooled {
    type Target = Builder;

    fn deref(&self) -> &Builder {
        self.0.as_ref().expect("a builder until dropped")
    }
}

impl DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Builder {
        self.0.as_mut().expect("a builder until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(builder) = self.0.take() {
            POOL.with_borrow_mut(|pool| pool.push(builder));
        }
    }
}
