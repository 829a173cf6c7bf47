//! The index as it was before the fact store: serde_json trees, a scan per clause.
//! Kept (tests and benchmarks only) as the oracle the store-backed index must equal,
//! result for result, and as the "before" of the benchmarks.

use super::Freshness;
use crate::facts::Node;
use crate::query::{Query, RoleSelector};
use serde_json::Value;
use std::collections::HashMap;

use super::GENERATION;

/// Positions into `Index::nodes`, ascending, i.e. already in result order.
type Positions = Vec<u32>;

#[derive(Debug, Default)]
pub struct Index {
    nodes: Vec<Node>,
    by_certname: HashMap<String, u32>,
    by_environment: HashMap<String, EnvironmentEntry>,
    /// Unix seconds when the data was collected from its source.
    built_at: i64,
    /// Unique per build in this process, so bindings can cache what they converted.
    generation: u64,
}

#[derive(Debug, Default)]
struct EnvironmentEntry {
    all: Positions,
    by_role: HashMap<String, Positions>,
}

impl Index {
    /// Builds the index; duplicate certnames keep the newest facts.
    pub fn build(mut nodes: Vec<Node>, role_fact: &str, built_at: i64) -> Index {
        nodes.sort_by(|a, b| a.certname.cmp(&b.certname).then(b.timestamp.cmp(&a.timestamp)));
        nodes.dedup_by(|later, first| later.certname == first.certname);
        nodes.sort_by(Node::canonical_cmp);

        let mut by_environment: HashMap<String, EnvironmentEntry> = HashMap::new();
        let mut by_certname = HashMap::with_capacity(nodes.len());
        for (position, node) in nodes.iter().enumerate() {
            let position = position as u32;
            by_certname.insert(node.certname.clone(), position);
            let entry = by_environment.entry(node.environment.clone()).or_default();
            entry.all.push(position);
            for role in role_names(crate::facts::lookup(&node.facts, &crate::facts::FactPath::new(role_fact))) {
                let positions = entry.by_role.entry(role.to_string()).or_default();
                if positions.last() != Some(&position) {
                    positions.push(position);
                }
            }
        }
        let generation = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Index { nodes, by_certname, by_environment, built_at, generation }
    }

    /// Unique per `build` within the process: a binding may keep converted servers
    /// keyed by (generation, position) and drop them when it changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn by_certname(&self, certname: &str) -> Option<&Node> {
        self.by_certname.get(certname).map(|p| self.node(*p))
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn built_at(&self) -> i64 {
        self.built_at
    }

    pub fn node(&self, position: u32) -> &Node {
        &self.nodes[position as usize]
    }

    /// `servers_with_role`: servers of `environment` whose role fact (a string, or a
    /// list containing one) is selected, in result order.
    pub fn with_role(&self, roles: &RoleSelector, environment: &str, fresh: Freshness) -> Vec<u32> {
        let Some(entry) = self.by_environment.get(environment) else {
            return Vec::new();
        };
        let mut lists: Vec<&Positions> = roles.names.iter().filter_map(|n| entry.by_role.get(n)).collect();
        if !roles.patterns.is_empty() {
            let matching = entry.by_role.iter().filter(|(role, _)| roles.patterns.iter().any(|re| re.is_match(role)));
            lists.extend(matching.map(|(_, positions)| positions));
        }
        let mut positions: Vec<u32> = match lists.as_slice() {
            [] => return Vec::new(),
            [one] => one.to_vec(),
            many => {
                let mut merged: Vec<u32> = many.iter().flat_map(|p| p.iter().copied()).collect();
                merged.sort_unstable();
                merged.dedup();
                merged
            }
        };
        positions.retain(|p| fresh.admits(self.node(*p).timestamp));
        positions
    }

    /// `servers_with_facts`: servers matching every clause, scoped to `environment`
    /// unless a clause names the environment itself.
    pub fn with_facts(&self, query: &Query, environment: &str, role_fact: &str, fresh: Freshness) -> Vec<u32> {
        let clauses = query.clauses();
        // An exact role clause narrows the scan to that role's servers, and is then
        // already answered: the index holds exactly the servers it matches.
        let seed = clauses.iter().enumerate().find_map(|(i, c)| {
            let role = (c.path() == role_fact).then(|| c.plain_equality()).flatten()?;
            Some((i, role))
        });
        let scope: Option<&EnvironmentEntry> = if query.names_environment() {
            None
        } else {
            match self.by_environment.get(environment) {
                Some(entry) => Some(entry),
                None => return Vec::new(),
            }
        };
        let candidates: &[u32] = match (scope, seed) {
            (Some(entry), Some((_, role))) => match entry.by_role.get(role) {
                Some(positions) => positions,
                None => return Vec::new(),
            },
            (Some(entry), None) => &entry.all,
            (None, _) => return self.filter_all(query, fresh),
        };
        let skip = seed.map(|(i, _)| i);
        candidates
            .iter()
            .copied()
            .filter(|p| {
                let node = self.node(*p);
                fresh.admits(node.timestamp)
                    && clauses.iter().enumerate().all(|(i, c)| Some(i) == skip || c.matches(node))
            })
            .collect()
    }

    /// A query naming the environment scans every server.
    fn filter_all(&self, query: &Query, fresh: Freshness) -> Vec<u32> {
        (0..self.nodes.len() as u32)
            .filter(|p| {
                let node = self.node(*p);
                fresh.admits(node.timestamp) && query.matches(node)
            })
            .collect()
    }
}

fn role_names(value: Option<&Value>) -> Vec<&str> {
    match value {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Facts;
    use serde_json::json;

    const NOW: i64 = 1_000_000;
    const FRESH: Freshness = Freshness { now: NOW, max_age: 3600 };

    fn node(certname: &str, facts: Value, age: i64) -> Node {
        let facts: Facts = facts.as_object().cloned().unwrap();
        Node::new(certname.into(), facts, NOW - age, None)
    }

    fn sample() -> Index {
        Index::build(
            vec![
                node("web3", json!({"fqdn": "c.example", "role": "node", "uptime": 5}), 0),
                node("web1", json!({"fqdn": "a.example", "role": "node", "uptime": 50}), 0),
                node("lb1", json!({"fqdn": "b.example", "role": ["haproxy", "edge"]}), 0),
                node("old", json!({"fqdn": "0.example", "role": "node"}), 7200),
                node("stage", json!({"role": "node", "environment": "staging"}), 0),
                node("web1", json!({"fqdn": "a.example", "role": "stale-duplicate"}), 10),
            ],
            "role",
            NOW,
        )
    }

    fn certnames(index: &Index, positions: Vec<u32>) -> Vec<&str> {
        positions.into_iter().map(|p| index.node(p).certname.as_str()).collect()
    }

    #[test]
    fn roles_come_from_the_inverted_index_in_fqdn_order() {
        let idx = sample();
        let names = RoleSelector::parse(&["node"]).unwrap();
        assert_eq!(certnames(&idx, idx.with_role(&names, "production", FRESH)), ["web1", "web3"]);
        let any = RoleSelector::parse(&["edge", "node"]).unwrap();
        assert_eq!(certnames(&idx, idx.with_role(&any, "production", FRESH)), ["web1", "lb1", "web3"]);
        let pattern = RoleSelector::parse(&["/^hap/"]).unwrap();
        assert_eq!(certnames(&idx, idx.with_role(&pattern, "production", FRESH)), ["lb1"]);
        let mixed = RoleSelector::parse(&["/^hap/", "node", "node"]).unwrap();
        assert_eq!(certnames(&idx, idx.with_role(&mixed, "production", FRESH)), ["web1", "lb1", "web3"]);
        assert_eq!(certnames(&idx, idx.with_role(&names, "staging", FRESH)), ["stage"]);
        assert!(idx.with_role(&names, "nowhere", FRESH).is_empty());
    }

    #[test]
    fn servers_older_than_max_age_are_left_out() {
        let idx = sample();
        let names = RoleSelector::names(["node"]);
        let lenient = Freshness { now: NOW, max_age: 86_400 };
        assert_eq!(certnames(&idx, idx.with_role(&names, "production", lenient)), ["old", "web1", "web3"]);
    }

    #[test]
    fn duplicates_keep_the_newest_facts() {
        let idx = sample();
        assert_eq!(idx.len(), 5);
        let web1 = idx.nodes().iter().find(|n| n.certname == "web1").unwrap();
        assert_eq!(web1.facts["role"], json!("node"));
    }

    #[test]
    fn fact_queries_are_scoped_to_the_environment_unless_a_clause_names_it() {
        let idx = sample();
        let q = Query::parse(&["role=node", "uptime>10"]).unwrap();
        assert_eq!(certnames(&idx, idx.with_facts(&q, "production", "role", FRESH)), ["web1"]);
        let q = Query::parse(&["role=node"]).unwrap();
        assert_eq!(certnames(&idx, idx.with_facts(&q, "production", "role", FRESH)), ["web1", "web3"]);
        let q = Query::parse(&["environment=staging"]).unwrap();
        assert_eq!(certnames(&idx, idx.with_facts(&q, "production", "role", FRESH)), ["stage"]);
        let q = Query::parse(&["role=/^(node|edge)$/"]).unwrap();
        assert_eq!(certnames(&idx, idx.with_facts(&q, "production", "role", FRESH)), ["web1", "lb1", "web3"]);
    }

    #[test]
    fn the_same_facts_give_the_same_order_whatever_the_input_order() {
        let mut nodes: Vec<Node> = sample().nodes().to_vec();
        nodes.reverse();
        let reversed = Index::build(nodes, "role", NOW);
        assert_eq!(reversed.nodes(), sample().nodes());
    }
}
