//! The causal chain a kick carries: which servers' runs led to it, origin first.
//!
//! A report from a server whose run was started by a kick inherits that kick's chain
//! (the planner knows; the report's own content is not trusted for this). A kick
//! whose target is already on its chain would close a loop and is suppressed.
//!
//! One run can serve several kicks (coalesced): its chain is then the first kick's
//! path, plus the other kicks' servers as further causes. Every cause counts for
//! loops (conservative: it can only suppress more); the hops are the longest path's,
//! not the number of causes, so that ten web servers kicking one load balancer
//! together are one hop, as each alone would be.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Further causes named when a chain is shown; the rest are counted.
const CAUSES_SHOWN: usize = 3;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    /// The first cause's path, origin first: every run on it was caused by the one
    /// before.
    servers: Vec<String>,
    /// The servers of the other kicks merged into this one, not on `servers`, in
    /// order of first appearance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    also: Vec<String>,
    /// Kicks on the longest path. Absent from states saved before chains were
    /// merged this way: their one list was counted as a path, as then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hops: Option<usize>,
}

impl Chain {
    /// A chain that starts at `server`, whose run nobody kicked.
    pub fn origin(server: &str) -> Chain {
        Chain { servers: vec![server.to_string()], also: Vec::new(), hops: Some(0) }
    }

    /// Whether `server`'s run is among the causes.
    pub fn contains(&self, server: &str) -> bool {
        self.servers.iter().chain(&self.also).any(|s| s == server)
    }

    /// Kicks between servers on the longest path of causes.
    pub fn hops(&self) -> usize {
        self.hops.unwrap_or(self.servers.len().saturating_sub(1))
    }

    /// This chain followed by `server`.
    pub fn then(&self, server: &str) -> Chain {
        let mut next = self.clone();
        next.servers.push(server.to_string());
        next.also.retain(|s| s != server);
        next.hops = Some(self.hops() + 1);
        next
    }

    /// One run serving several kicks carries all their causes: this chain's path,
    /// and every other server of `other` as a further cause; the longer path's hops.
    pub fn merge(&self, other: &Chain) -> Chain {
        let mut merged = self.clone();
        for server in other.servers.iter().chain(&other.also) {
            if !merged.contains(server) {
                merged.also.push(server.clone());
            }
        }
        merged.hops = Some(self.hops().max(other.hops()));
        merged
    }
}

/// `node1 -> lb1`; with further causes, `node1 -> lb1 (also caused by node2, node3,
/// node4 and 7 more)`.
impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.servers.join(" -> "))?;
        if self.also.is_empty() {
            return Ok(());
        }
        let shown = &self.also[..self.also.len().min(CAUSES_SHOWN)];
        write!(f, " (also caused by {}", shown.join(", "))?;
        match self.also.len() - shown.len() {
            0 => f.write_str(")"),
            more => write!(f, " and {more} more)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_grow_count_hops_and_print_as_arrows() {
        let c = Chain::origin("node1").then("lb1");
        assert_eq!(c.hops(), 1);
        assert!(c.contains("node1") && !c.contains("node2"));
        assert_eq!(c.then("node1").to_string(), "node1 -> lb1 -> node1");
    }

    #[test]
    fn a_run_serving_several_kicks_has_every_cause_and_the_longest_path() {
        let lb = |web: &str| Chain::origin(web).then("lb1");
        let merged = (2..=10).fold(lb("web1"), |c, n| c.merge(&lb(&format!("web{n}"))));
        assert_eq!(merged.hops(), 1, "ten web servers kicking lb1 together are one hop");
        assert!((1..=10).all(|n| merged.contains(&format!("web{n}"))));
        assert_eq!(merged.to_string(), "web1 -> lb1 (also caused by web2, web3, web4 and 6 more)");
        let next = merged.then("mon1");
        assert_eq!(next.hops(), 2);
        assert_eq!(next.to_string(), "web1 -> lb1 -> mon1 (also caused by web2, web3, web4 and 6 more)");
        let longer = Chain::origin("db1").then("web2").then("lb1");
        assert_eq!(lb("web1").merge(&longer).hops(), 2, "the longer path's hops");
        assert_eq!(lb("web1").merge(&longer).to_string(), "web1 -> lb1 (also caused by db1, web2)");
        assert_eq!(lb("web1").merge(&lb("web1")), lb("web1"), "the same kick twice is one cause");
    }

    #[test]
    fn a_chain_saved_before_merges_counted_their_causes_reads_as_then() {
        #[derive(Serialize)]
        struct Before {
            servers: Vec<&'static str>,
        }
        let bytes = rmp_serde::to_vec_named(&Before { servers: vec!["node1", "lb1", "node2"] }).unwrap();
        let old: Chain = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(old.hops(), 2);
        assert!(old.contains("node2"));
        assert_eq!(old.to_string(), "node1 -> lb1 -> node2");
    }
}
