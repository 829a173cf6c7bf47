//! Where facts come from. A source is read on the refresh thread, never during a
//! compile, and reports unreadable entries as warnings rather than failing whole.

pub mod puppet_cache;

use crate::facts::Facts;

/// One server's facts as a source saw them.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub certname: String,
    pub facts: Facts,
    /// Unix seconds when the facts were collected.
    pub timestamp: i64,
}

/// What a refresh read: the servers, and what it had to skip and why.
#[derive(Debug, Default)]
pub struct Harvest {
    pub observations: Vec<Observation>,
    pub warnings: Vec<String>,
}
