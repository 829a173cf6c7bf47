//! The causal chain a kick carries: which servers' runs led to it, origin first.
//!
//! A report from a server whose run was started by a kick inherits that kick's chain
//! (the planner knows; the report's own content is not trusted for this). A kick
//! whose target is already on its chain would close a loop and is suppressed.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    /// Certnames, origin first; every run on it was caused by the one before.
    servers: Vec<String>,
}

impl Chain {
    /// A chain that starts at `server`, whose run nobody kicked.
    pub fn origin(server: &str) -> Chain {
        Chain { servers: vec![server.to_string()] }
    }

    pub fn contains(&self, server: &str) -> bool {
        self.servers.iter().any(|s| s == server)
    }

    /// Kicks between servers on the chain.
    pub fn hops(&self) -> usize {
        self.servers.len().saturating_sub(1)
    }

    /// This chain followed by `server`.
    pub fn then(&self, server: &str) -> Chain {
        let mut servers = self.servers.clone();
        servers.push(server.to_string());
        Chain { servers }
    }

    /// One run serving several kicks carries all their causes: the servers of both
    /// chains, in order of first appearance. Conservative: it can only suppress more.
    pub fn merge(&self, other: &Chain) -> Chain {
        let mut servers = self.servers.clone();
        for server in &other.servers {
            if !servers.contains(server) {
                servers.push(server.clone());
            }
        }
        Chain { servers }
    }

    pub fn servers(&self) -> &[String] {
        &self.servers
    }
}

impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.servers.join(" -> "))
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
        assert_eq!(c.merge(&Chain::origin("node2").then("lb1")).to_string(), "node1 -> lb1 -> node2");
    }
}
