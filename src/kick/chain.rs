//! The causal chain a kick carries: which servers' runs led to it, origin first.
//!
//! A report from a server whose run was started by a kick inherits that kick's chain
//! (the planner knows; the report's own content is not trusted for this). A kick
//! whose target is already on its chain would close a loop and is suppressed.
//!
//! One run can serve several kicks (coalesced): its chain is then the first kick's
//! path, plus the other kicks' servers as further causes. The hops are the longest
//! path's, not the number of causes, so that ten web servers kicking one load
//! balancer together are one hop, as each alone would be.
//!
//! The first [`MAX_CAUSES_NAMED`] further causes are kept by name and count for
//! loops (conservative: they can only suppress more); the rest are only counted.
//! Without a bound, a load balancer kicked by a whole fleet within one coalescing
//! window would carry every web server's name in each of its kicks, and every state
//! transaction (with `kick.state: postgresql`, every report's) would read and write
//! them all. A loop through a cause that is only counted is still stopped, one run
//! later: the run it kicks carries a chain on which the load balancer is named.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Further causes named when a chain is shown; the rest are counted.
const CAUSES_SHOWN: usize = 3;
/// Further causes a chain keeps by name; the rest are counted (see the module's
/// documentation).
pub const MAX_CAUSES_NAMED: usize = 16;

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
    /// Further causes past the first [`MAX_CAUSES_NAMED`] of `also`: counted, not
    /// named (one per kick merged, so a server that kicked twice counts twice).
    #[serde(default, skip_serializing_if = "is_zero")]
    more: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Chain {
    /// A chain that starts at `server`, whose run nobody kicked.
    pub fn origin(server: &str) -> Chain {
        Chain { servers: vec![server.to_string()], also: Vec::new(), hops: Some(0), more: 0 }
    }

    /// Whether `server`'s run is among the causes named.
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
    /// and every other server of `other` as a further cause (named up to
    /// [`MAX_CAUSES_NAMED`], then counted); the longer path's hops.
    pub fn merge(&self, other: &Chain) -> Chain {
        let mut merged = self.clone();
        for server in other.servers.iter().chain(&other.also) {
            if merged.contains(server) {
                continue;
            }
            if merged.also.len() < MAX_CAUSES_NAMED {
                merged.also.push(server.clone());
            } else {
                merged.more = merged.more.saturating_add(1);
            }
        }
        merged.more = merged.more.saturating_add(other.more);
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
        match (self.also.len() - shown.len()) as u64 + self.more {
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
    fn a_fleet_of_causes_keeps_its_first_names_and_counts_the_rest() {
        let lb = |n: usize| Chain::origin(&format!("web{n}")).then("lb1");
        let merged = (2..=300).fold(lb(1), |c, n| c.merge(&lb(n)));
        assert_eq!(merged.also.len(), MAX_CAUSES_NAMED, "the names kept are bounded");
        assert_eq!(merged.more, 299 - MAX_CAUSES_NAMED as u64);
        assert!(merged.contains("web2") && merged.contains(&format!("web{}", MAX_CAUSES_NAMED + 1)));
        assert!(!merged.contains("web300"), "a cause past the bound is counted, not named");
        assert_eq!(merged.to_string(), "web1 -> lb1 (also caused by web2, web3, web4 and 296 more)");
        assert_eq!(merged.hops(), 1);
        let bytes = rmp_serde::to_vec_named(&merged).unwrap();
        assert!(bytes.len() < 400, "a kick by 300 servers is {} bytes", bytes.len());
        // Merged again (a run's chain into its follow-up's): still counted, in order.
        let again = lb(1).merge(&merged);
        assert_eq!(again.also, merged.also);
        assert_eq!(again.more, merged.more);
        assert_eq!(rmp_serde::from_slice::<Chain>(&bytes).unwrap(), merged);
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
