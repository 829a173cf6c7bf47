//! Where facts come from. A source is read on the refresh thread, never during a
//! compile, and reports unreadable entries as warnings rather than failing whole.

pub mod mcollective;
pub mod puppet_cache;

use crate::facts::{Facts, Node};

/// One server's facts as a source saw them.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub certname: String,
    pub facts: Facts,
    /// Unix seconds when the facts were collected.
    pub timestamp: i64,
    /// Reported beside the facts (see [`Node::extra`]).
    pub extra: Facts,
    /// When a live source heard from the server (see [`Node::answered_at`]).
    pub answered_at: Option<i64>,
    /// The environment the source suggests when neither the facts nor the master
    /// name one (mcollective: the one collective besides the main one).
    pub environment_hint: Option<String>,
}

impl Observation {
    pub fn new(certname: String, facts: Facts, timestamp: i64) -> Observation {
        Observation { certname, facts, timestamp, extra: Facts::new(), answered_at: None, environment_hint: None }
    }

    /// The node, its environment decided by [`Node::new`]'s rule with the source's
    /// hint after where the master last saw it.
    pub fn into_node(self, last_seen_env: Option<&str>) -> Node {
        let env = last_seen_env.filter(|e| !e.is_empty()).or(self.environment_hint.as_deref());
        let mut node = Node::new(self.certname, self.facts, self.timestamp, env);
        node.extra = self.extra;
        node.answered_at = self.answered_at;
        node
    }
}

/// What a refresh read: the servers, and what it had to skip and why.
#[derive(Debug, Default)]
pub struct Harvest {
    pub observations: Vec<Observation>,
    /// Servers of the previous index carried over unchanged: a live source keeps a
    /// server that stopped answering for a grace period.
    pub kept: Vec<Node>,
    pub warnings: Vec<String>,
}
