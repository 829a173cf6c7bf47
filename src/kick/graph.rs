//! The role-to-role kick graph seen in reports, and its cycles, so an operator learns
//! about `node -> haproxy -> node` from the status file before it bites.
//!
//! Roles come from facts each server reports about itself, so the graph's shape is
//! not trusted: a complete graph of 12 roles has billions of elementary cycles.
//! Cycles are therefore found incrementally, only through a new edge, only up to a
//! length (a longer one is stopped by `max_hops` anyway), within a step budget, and
//! at most [`MAX_ROLE_CYCLES_LISTED`] are kept; the rest are counted. Edges not seen
//! for a while age out, and the graph holds at most [`MAX_ROLE_EDGES`] edges.

use super::Millis;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Cycles kept for the log and the status file; more are counted, not listed.
pub const MAX_ROLE_CYCLES_LISTED: usize = 100;
/// Edges kept; at the limit the one seen longest ago makes room.
pub const MAX_ROLE_EDGES: usize = 4096;
/// Path extensions one new edge's cycle search may try.
const STEPS_PER_EDGE: usize = 20_000;
/// Path extensions a full recount (after edges aged out) may try.
const STEPS_PER_RECOUNT: usize = 200_000;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleGraph {
    /// `from -> to -> when last seen`. (Named anew: the unbounded graph of earlier
    /// versions, stored as `edges`, is ignored on load rather than trusted.)
    #[serde(default)]
    role_edges: BTreeMap<String, BTreeMap<String, Millis>>,
    /// Known cycles, each starting at its smallest role, e.g. `["haproxy", "node", "haproxy"]`.
    #[serde(default)]
    cycles: BTreeSet<Vec<String>>,
    /// Cycles found but not listed (over the cap or the step budget): at least this many.
    #[serde(default)]
    cycles_left_out: u64,
    /// `from -> to -> kicks seen along the edge`, for the edges of `role_edges` only.
    /// (Apart, so that state files written before edges were counted stay readable.)
    #[serde(default)]
    edge_kicks: BTreeMap<String, BTreeMap<String, u64>>,
}

impl RoleGraph {
    /// Records that a server of role `from` kicked one of role `to` at `now`, and
    /// returns the cycles through this edge, of at most `max_len` edges, that are
    /// new and listed (empty when the edge was already known).
    pub fn add(&mut self, from: &str, to: &str, now: Millis, max_len: usize) -> Vec<Vec<String>> {
        if let Some(seen) = self.role_edges.get_mut(from).and_then(|tos| tos.get_mut(to)) {
            *seen = now.max(*seen);
            let kicks = self.edge_kicks.entry(from.to_string()).or_default().entry(to.to_string()).or_insert(1);
            *kicks = kicks.saturating_add(1);
            return Vec::new();
        }
        if self.edge_count() >= MAX_ROLE_EDGES {
            self.evict_oldest();
        }
        self.role_edges.entry(from.to_string()).or_default().insert(to.to_string(), now);
        self.edge_kicks.entry(from.to_string()).or_default().insert(to.to_string(), 1);
        let mut steps = STEPS_PER_EDGE;
        let (found, unfinished) = self.cycles_through(from, to, max_len, &mut steps);
        let mut listed = Vec::new();
        for cycle in found {
            if self.cycles.contains(&cycle) {
                continue;
            }
            if self.cycles.len() < MAX_ROLE_CYCLES_LISTED {
                self.cycles.insert(cycle.clone());
                listed.push(cycle);
            } else {
                self.cycles_left_out = self.cycles_left_out.saturating_add(1);
            }
        }
        if unfinished {
            self.cycles_left_out = self.cycles_left_out.saturating_add(1);
        }
        listed
    }

    pub fn edges(&self) -> impl Iterator<Item = (&str, &str)> {
        self.role_edges.iter().flat_map(|(from, tos)| tos.keys().map(move |to| (from.as_str(), to.as_str())))
    }

    /// Each edge with the kicks seen along it: at least 1 (an edge counted before
    /// counting began was seen once at least).
    pub fn counted_edges(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.edges().map(|(from, to)| {
            let kicks = self.edge_kicks.get(from).and_then(|tos| tos.get(to)).copied().unwrap_or(1);
            (from, to, kicks.max(1))
        })
    }

    pub fn edge_count(&self) -> usize {
        self.role_edges.values().map(BTreeMap::len).sum()
    }

    /// The listed cycles, in a stable order.
    pub fn cycles(&self) -> impl Iterator<Item = &Vec<String>> {
        self.cycles.iter()
    }

    /// Cycles known to exist but not listed: a lower bound.
    pub fn cycles_left_out(&self) -> u64 {
        self.cycles_left_out
    }

    /// Forgets edges not seen since `cutoff`, and the cycles that used them.
    pub fn age_out(&mut self, cutoff: Millis, max_len: usize) {
        let before = self.edge_count();
        for tos in self.role_edges.values_mut() {
            tos.retain(|_, seen| *seen >= cutoff);
        }
        self.role_edges.retain(|_, tos| !tos.is_empty());
        self.forget_uncounted_edges();
        if self.edge_count() != before {
            self.recount(max_len);
        }
    }

    /// Lists cycles again from scratch, within a budget (after edges went away, the
    /// cycles left out before may now fit).
    fn recount(&mut self, max_len: usize) {
        self.cycles.clear();
        self.cycles_left_out = 0;
        let mut steps = STEPS_PER_RECOUNT;
        let edges: Vec<(String, String)> = self.edges().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        let mut unfinished = false;
        for (from, to) in edges {
            let (found, cut) = self.cycles_through(&from, &to, max_len, &mut steps);
            unfinished |= cut;
            for cycle in found {
                if self.cycles.len() < MAX_ROLE_CYCLES_LISTED {
                    self.cycles.insert(cycle);
                } else if !self.cycles.contains(&cycle) {
                    // Counted once per edge it runs through: a rough lower bound is enough.
                    self.cycles_left_out = self.cycles_left_out.saturating_add(1);
                }
            }
        }
        if unfinished {
            self.cycles_left_out = self.cycles_left_out.max(1);
        }
    }

    /// Drops the counts of edges the graph no longer holds, so they stay as bounded as it.
    fn forget_uncounted_edges(&mut self) {
        let edges = &self.role_edges;
        self.edge_kicks.retain(|from, tos| {
            tos.retain(|to, _| edges.get(from).is_some_and(|seen| seen.contains_key(to)));
            !tos.is_empty()
        });
    }

    fn evict_oldest(&mut self) {
        let oldest = self
            .role_edges
            .iter()
            .flat_map(|(from, tos)| tos.iter().map(move |(to, seen)| (*seen, from.clone(), to.clone())))
            .min();
        if let Some((_, from, to)) = oldest {
            if let Some(tos) = self.role_edges.get_mut(&from) {
                tos.remove(&to);
                if tos.is_empty() {
                    self.role_edges.remove(&from);
                }
            }
            self.forget_uncounted_edges();
            self.cycles.retain(|c| !c.windows(2).any(|w| w[0] == from && w[1] == to));
        }
    }

    /// Cycles of at most `max_len` edges that use the edge `from -> to`, canonical,
    /// deduplicated; and whether the step budget ran out first. Iterative: the depth
    /// is bounded by `max_len`, never by the graph.
    fn cycles_through(&self, from: &str, to: &str, max_len: usize, steps: &mut usize) -> (BTreeSet<Vec<String>>, bool) {
        let mut found = BTreeSet::new();
        if from == to {
            found.insert(vec![from.to_string(), from.to_string()]);
            return (found, false);
        }
        if max_len < 2 {
            return (found, false);
        }
        // Simple paths to -> ... -> from; with the edge from -> to, each closes a cycle.
        let successors = |node: &str| -> Vec<&str> {
            self.role_edges.get(node).map(|tos| tos.keys().map(String::as_str).collect()).unwrap_or_default()
        };
        let mut path: Vec<&str> = vec![to];
        let mut stack: Vec<std::vec::IntoIter<&str>> = vec![successors(to).into_iter()];
        while let Some(next) = stack.last_mut().map(Iterator::next) {
            let Some(next) = next else {
                stack.pop();
                path.pop();
                continue;
            };
            if *steps == 0 {
                return (found, true);
            }
            *steps -= 1;
            if next == from {
                let mut cycle: Vec<&str> = std::iter::once(from).chain(path.iter().copied()).collect();
                found.insert(canonical(&mut cycle));
            } else if path.len() + 1 < max_len && !path.contains(&next) {
                path.push(next);
                stack.push(successors(next).into_iter());
            }
        }
        (found, false)
    }
}

/// The cycle rotated to start at its smallest role, closed: `[b, a]` -> `[a, b, a]`.
fn canonical(cycle: &mut [&str]) -> Vec<String> {
    let smallest = (0..cycle.len()).min_by_key(|i| cycle[*i]).unwrap_or(0);
    cycle.rotate_left(smallest);
    cycle.iter().chain(cycle.first()).map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycles(g: &RoleGraph) -> Vec<Vec<String>> {
        g.cycles().cloned().collect()
    }

    #[test]
    fn finds_each_cycle_once() {
        let mut g = RoleGraph::default();
        assert!(g.add("node", "haproxy", 0, 6).is_empty());
        assert!(g.add("node", "haproxy", 1, 6).is_empty(), "known edge");
        assert_eq!(g.add("haproxy", "node", 1, 6), [["haproxy", "node", "haproxy"]]);
        g.add("db", "app", 2, 6);
        g.add("app", "cache", 2, 6);
        assert_eq!(g.add("cache", "db", 2, 6), [["app", "cache", "db", "app"]]);
        assert_eq!(g.add("app", "app", 2, 6), [["app", "app"]]);
        assert_eq!(
            cycles(&g),
            vec![
                vec!["app".to_string(), "app".into()],
                vec!["app".to_string(), "cache".into(), "db".into(), "app".into()],
                vec!["haproxy".to_string(), "node".into(), "haproxy".into()],
            ]
        );
        assert_eq!(g.cycles_left_out(), 0);
    }

    #[test]
    fn cycles_longer_than_the_limit_are_not_searched() {
        let mut g = RoleGraph::default();
        g.add("a", "b", 0, 3);
        g.add("b", "c", 0, 3);
        assert_eq!(g.add("c", "a", 0, 3), [["a", "b", "c", "a"]], "3 edges: at the limit");
        g.add("c", "d", 0, 3);
        g.add("d", "e", 0, 3);
        assert!(g.add("e", "a", 0, 3).is_empty(), "a -> b -> c -> d -> e -> a has 5 edges");
    }

    #[test]
    fn a_complete_graph_lists_at_most_the_cap_and_counts_the_rest() {
        let roles: Vec<String> = (0..16).map(|i| format!("r{i:02}")).collect();
        let mut g = RoleGraph::default();
        let started = std::time::Instant::now();
        for from in &roles {
            for to in &roles {
                g.add(from, to, 0, 6);
            }
        }
        assert_eq!(g.edge_count(), 256);
        assert_eq!(g.cycles().count(), MAX_ROLE_CYCLES_LISTED);
        assert!(g.cycles_left_out() > 1000);
        assert!(g.cycles().all(|c| c.len() <= 7 && c.first() == c.last()));
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
    }

    #[test]
    fn edges_age_out_with_their_cycles_and_the_count_is_redone() {
        let mut g = RoleGraph::default();
        g.add("node", "haproxy", 0, 6);
        g.add("haproxy", "node", 1000, 6);
        g.add("db", "app", 1000, 6);
        g.age_out(500, 6);
        assert_eq!(g.edges().collect::<Vec<_>>(), [("db", "app"), ("haproxy", "node")]);
        assert_eq!(cycles(&g), Vec::<Vec<String>>::new());
    }

    #[test]
    fn kicks_are_counted_per_edge_and_forgotten_with_it() {
        let mut g = RoleGraph::default();
        g.add("node", "haproxy", 0, 6);
        g.add("node", "haproxy", 1, 6);
        g.add("node", "haproxy", 2, 6);
        g.add("db", "app", 1000, 6);
        assert_eq!(g.counted_edges().collect::<Vec<_>>(), [("db", "app", 1), ("node", "haproxy", 3)]);
        g.age_out(500, 6);
        assert_eq!(g.counted_edges().collect::<Vec<_>>(), [("db", "app", 1)]);
        g.add("node", "haproxy", 2000, 6);
        assert_eq!(g.counted_edges().collect::<Vec<_>>(), [("db", "app", 1), ("node", "haproxy", 1)], "counted anew");
        assert_eq!(g.edge_kicks.values().map(BTreeMap::len).sum::<usize>(), 2, "no count outlives its edge");
    }

    #[test]
    fn the_graph_holds_at_most_max_edges_dropping_the_oldest() {
        let mut g = RoleGraph::default();
        for i in 0..MAX_ROLE_EDGES {
            g.add(&format!("s{i}"), "t", i as Millis + 1, 6);
        }
        assert_eq!(g.edge_count(), MAX_ROLE_EDGES, "at the limit");
        g.add("new", "t", 1_000_000, 6);
        assert_eq!(g.edge_count(), MAX_ROLE_EDGES, "one over: the oldest made room");
        assert!(!g.edges().any(|(from, _)| from == "s0"));
        assert_eq!(g.edge_kicks.values().map(BTreeMap::len).sum::<usize>(), MAX_ROLE_EDGES, "counts as bounded");
        assert!(g.edges().any(|(from, _)| from == "new"));
    }
}
