//! The role-to-role kick graph seen in reports, and its cycles, so an operator learns
//! about `node -> haproxy -> node` from the status file before it bites.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleGraph {
    edges: BTreeMap<String, BTreeSet<String>>,
}

impl RoleGraph {
    /// Records that a server of role `from` kicked one of role `to`; true if new.
    pub fn add(&mut self, from: &str, to: &str) -> bool {
        self.edges.entry(from.to_string()).or_default().insert(to.to_string())
    }

    pub fn edges(&self) -> impl Iterator<Item = (&str, &str)> {
        self.edges.iter().flat_map(|(from, tos)| tos.iter().map(move |to| (from.as_str(), to.as_str())))
    }

    /// Every elementary cycle, each starting at its smallest role, e.g.
    /// `["haproxy", "node", "haproxy"]`; in a stable order.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        let mut cycles = Vec::new();
        for start in self.edges.keys() {
            let mut path = vec![start.as_str()];
            self.walk(start, start, &mut path, &mut cycles);
        }
        cycles
    }

    /// Depth-first from `node`, only through roles greater than `start`, so each
    /// cycle is found once, from its smallest role. Role graphs are tiny.
    fn walk<'a>(&'a self, start: &str, node: &str, path: &mut Vec<&'a str>, out: &mut Vec<Vec<String>>) {
        for next in self.edges.get(node).into_iter().flatten() {
            if next == start {
                let mut cycle: Vec<String> = path.iter().map(|s| s.to_string()).collect();
                cycle.push(start.to_string());
                out.push(cycle);
            } else if next.as_str() > start && !path.contains(&next.as_str()) {
                path.push(next);
                self.walk(start, next, path, out);
                path.pop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_cycle_once() {
        let mut g = RoleGraph::default();
        assert!(g.add("node", "haproxy"));
        assert!(!g.add("node", "haproxy"));
        g.add("haproxy", "node");
        g.add("db", "app");
        g.add("app", "cache");
        g.add("cache", "db");
        g.add("app", "app");
        assert_eq!(
            g.cycles(),
            vec![
                vec!["app".to_string(), "app".into()],
                vec!["app".to_string(), "cache".into(), "db".into(), "app".into()],
                vec!["haproxy".to_string(), "node".into(), "haproxy".into()],
            ]
        );
    }
}
