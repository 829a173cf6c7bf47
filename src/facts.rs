//! A server as the index sees it: its certname, its environment and its structured
//! facts, plus where dotted fact paths lead.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::cmp::Ordering;

/// Structured facts, as Facter 4 produces them. A `BTreeMap` underneath, so keys
/// always come out in the same order.
pub type Facts = serde_json::Map<String, Value>;

/// The environment assumed for a server that tells us nothing else.
pub const DEFAULT_ENVIRONMENT: &str = "production";

/// [`Node::new`]'s rule, over any store of facts: `fact` gives a top-level fact when
/// it is a string.
pub fn decide_environment<'a>(
    mut fact: impl FnMut(&str) -> Option<&'a str>,
    last_seen_env: Option<&'a str>,
) -> &'a str {
    ["environment", "agent_specified_environment"]
        .iter()
        .find_map(|name| fact(name).filter(|s| !s.is_empty()))
        .or(last_seen_env.filter(|s| !s.is_empty()))
        .unwrap_or(DEFAULT_ENVIRONMENT)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub certname: String,
    pub environment: String,
    pub facts: Facts,
    /// Unix seconds at which these facts were collected.
    pub timestamp: i64,
    /// What a source reports beside the facts, under names no fact can have (Puppet
    /// cannot use `::` in a fact name): `mcollective::classes`, `mcollective::agents`,
    /// `mcollective::collectives`. Returned with the facts and queryable like them.
    #[serde(default, skip_serializing_if = "Facts::is_empty")]
    pub extra: Facts,
    /// Unix seconds, on this master's clock, when a live source (mcollective) last
    /// heard from this server; `None` for sources that read a cache. A server that
    /// stops answering is kept for a grace period counted from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_at: Option<i64>,
}

impl Node {
    /// Builds a node, deciding its environment the way every master must agree on:
    /// the `environment` fact, else `agent_specified_environment`, else where the
    /// master last saw it compile or report, else `production`.
    pub fn new(certname: String, facts: Facts, timestamp: i64, last_seen_env: Option<&str>) -> Node {
        let fact = |name: &str| facts.get(name).and_then(Value::as_str);
        let environment = decide_environment(fact, last_seen_env).to_string();
        Node { certname, environment, facts, timestamp, extra: Facts::new(), answered_at: None }
    }

    /// What the functions return for this server, in this order: its facts, then what
    /// its source reported beside them (`mcollective::classes`, ...), never hiding a
    /// fact. Each binding adds `certname` when no fact has that name.
    pub fn entries(&self) -> impl Iterator<Item = (&String, &Value)> + '_ {
        self.facts.iter().chain(self.extra.iter().filter(|(name, _)| !self.facts.contains_key(*name)))
    }

    /// The name results are sorted by: the `fqdn` fact, or the certname without one.
    pub fn sort_name(&self) -> &str {
        match self.facts.get("fqdn") {
            Some(Value::String(fqdn)) if !fqdn.is_empty() => fqdn,
            _ => &self.certname,
        }
    }

    /// The one result order: by `fqdn` (or certname), then certname.
    pub fn canonical_cmp(&self, other: &Node) -> Ordering {
        self.sort_name().cmp(other.sort_name()).then_with(|| self.certname.cmp(&other.certname))
    }

    /// The value at a fact path: a top-level fact named exactly `path` wins (legacy
    /// facts may contain dots), else `a.b.c` walks into hashes and, by number, arrays.
    pub fn fact(&self, path: &FactPath) -> Option<&Value> {
        lookup(&self.facts, path).or_else(|| self.extra.get(path.as_str()))
    }
}

/// A parsed fact path such as `networking.interfaces.eth0.ip`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactPath {
    full: String,
    segments: Vec<String>,
}

impl FactPath {
    pub fn new(path: &str) -> FactPath {
        FactPath { full: path.to_string(), segments: path.split('.').map(str::to_string).collect() }
    }

    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The path split at dots: `["networking", "interfaces", "eth0", "ip"]`.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }
}

pub fn lookup<'a>(facts: &'a Facts, path: &FactPath) -> Option<&'a Value> {
    if let Some(value) = facts.get(&path.full) {
        return Some(value);
    }
    if path.segments.len() < 2 {
        return None;
    }
    let mut current = facts.get(&path.segments[0])?;
    for segment in &path.segments[1..] {
        current = match current {
            Value::Object(map) => map.get(segment)?,
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn facts(v: Value) -> Facts {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn environment_comes_from_fact_then_agent_specified_then_last_seen_then_production() {
        let n = Node::new(
            "a".into(),
            facts(json!({"environment": "dev", "agent_specified_environment": "x"})),
            0,
            Some("y"),
        );
        assert_eq!(n.environment, "dev");
        let n = Node::new("a".into(), facts(json!({"agent_specified_environment": "x"})), 0, Some("y"));
        assert_eq!(n.environment, "x");
        let n = Node::new("a".into(), facts(json!({})), 0, Some("y"));
        assert_eq!(n.environment, "y");
        let n = Node::new("a".into(), facts(json!({})), 0, None);
        assert_eq!(n.environment, "production");
    }

    #[test]
    fn dotted_paths_walk_hashes_and_arrays_and_exact_names_win() {
        let f = facts(json!({
            "os": {"release": {"full": "12.5"}},
            "disks": [{"name": "sda"}],
            "legacy.dotted": "yes",
        }));
        assert_eq!(lookup(&f, &FactPath::new("os.release.full")), Some(&json!("12.5")));
        assert_eq!(lookup(&f, &FactPath::new("disks.0.name")), Some(&json!("sda")));
        assert_eq!(lookup(&f, &FactPath::new("legacy.dotted")), Some(&json!("yes")));
        assert_eq!(lookup(&f, &FactPath::new("os.nope")), None);
        assert_eq!(lookup(&f, &FactPath::new("disks.x.name")), None);
    }

    #[test]
    fn canonical_order_is_fqdn_then_certname() {
        let a = Node::new("z".into(), facts(json!({"fqdn": "a.example"})), 0, None);
        let b = Node::new("b".into(), facts(json!({})), 0, None);
        let c = Node::new("c".into(), facts(json!({"fqdn": "b"})), 0, None);
        let mut v = [c.clone(), b.clone(), a.clone()];
        v.sort_by(Node::canonical_cmp);
        assert_eq!(v.iter().map(|n| n.certname.as_str()).collect::<Vec<_>>(), ["z", "b", "c"]);
    }
}
