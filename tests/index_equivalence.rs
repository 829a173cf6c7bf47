//! The store-backed index against the serde_json index it replaced
//! (`index::reference`): the same servers in the same order for thousands of
//! generated queries on the synthetic fleet, and for role lookups.

use puppet_kicker::facts::Node;
use puppet_kicker::index::reference;
use puppet_kicker::synthetic::{self, Rng};
use puppet_kicker::{Freshness, Index, Query, RoleSelector};
use serde_json::Value;

const NOW: i64 = 1_700_000_000;
const FRESH: Freshness = Freshness { now: NOW, max_age: 7 * 86_400 };

/// Dotted paths to every value of `facts`, arrays by index, at most three deep.
fn paths(prefix: &str, value: &Value, depth: usize, out: &mut Vec<(String, Value)>) {
    out.push((prefix.to_string(), value.clone()));
    if depth == 3 {
        return;
    }
    match value {
        Value::Object(map) => map.iter().for_each(|(k, v)| paths(&format!("{prefix}.{k}"), v, depth + 1, out)),
        Value::Array(items) => {
            items.iter().enumerate().for_each(|(i, v)| paths(&format!("{prefix}.{i}"), v, depth + 1, out))
        }
        _ => {}
    }
}

/// A clause about `value` at `path`: its own value, a neighbour, a regex on part
/// of it, or something no server has.
fn clause(rng: &mut Rng, path: &str, value: &Value) -> String {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.first().map(|v| v.to_string().trim_matches('"').to_string()).unwrap_or_default(),
        other => other.to_string(),
    };
    let op = *rng.pick(&["=", "!=", "<", ">", "<=", ">=", "=~", "!~"]);
    let operand = match rng.below(5) {
        0 => "nothing-has-this".to_string(),
        1 if !text.is_empty() => text[..text.len() / 2].to_string(),
        2 => text.chars().rev().collect(),
        _ => text,
    };
    let operand = if operand.is_empty() { "x".to_string() } else { operand };
    let operand = if op.contains('~') { format!("^{}", regex_escape(&operand)) } else { operand };
    format!("{path}{op}{operand}")
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_string() } else { format!("\\x{{{:x}}}", c as u32) })
        .collect()
}

fn fleet() -> Vec<Node> {
    let mut nodes = synthetic::fleet(1_200, 7, NOW);
    // Servers an index must also get right: no fqdn (sorted by certname), a role
    // list, a `certname` fact, an environment only from the fact.
    nodes[3].facts.remove("fqdn");
    nodes[4].facts.insert("role".into(), serde_json::json!(["web", "cache"]));
    nodes[5].facts.insert("certname".into(), Value::String("not-its-certname".into()));
    nodes
}

#[test]
fn thousands_of_generated_queries_select_what_the_reference_selects() {
    let nodes = fleet();
    let index = Index::build(nodes.clone(), "role", NOW);
    let before = reference::Index::build(nodes.clone(), "role", NOW);
    let mut rng = Rng::new(42);
    let environments = ["production", "staging", "dev", "nowhere"];
    let mut selected = 0;
    for i in 0..3_000 {
        let clauses: Vec<String> = (0..=rng.below(3))
            .map(|_| {
                let node = rng.pick(&nodes);
                let (name, value) = node.facts.iter().nth(rng.below(node.facts.len() as u64) as usize).unwrap();
                let mut found = Vec::new();
                paths(name, value, 1, &mut found);
                let (path, value) = rng.pick(&found).clone();
                match rng.below(20) {
                    0 => format!("environment={}", rng.pick(&environments)),
                    1 => format!("certname=/^{}/", &node.certname[..3]),
                    2 => format!("role={}", rng.pick(synthetic::ROLES).0),
                    _ => clause(&mut rng, &path, &value),
                }
            })
            .collect();
        let Ok(query) = Query::parse(&clauses) else { continue };
        let environment = rng.pick(&environments);
        let new = index.with_facts(&query, environment, FRESH);
        let old = before.with_facts(&query, environment, "role", FRESH);
        assert_eq!(new, old, "query {i}: {clauses:?} in {environment}");
        // Asked again, from the kept per-value results: still the same.
        assert_eq!(index.with_facts(&query, environment, FRESH), old, "query {i} again");
        selected += new.len();
    }
    assert!(selected > 10_000, "the generated queries select servers ({selected} in all)");
}

#[test]
fn role_lookups_select_what_the_reference_selects() {
    let nodes = fleet();
    let index = Index::build(nodes.clone(), "role", NOW);
    let before = reference::Index::build(nodes, "role", NOW);
    let mut rng = Rng::new(9);
    for _ in 0..500 {
        let mut roles: Vec<String> = (0..=rng.below(2)).map(|_| rng.pick(synthetic::ROLES).0.to_string()).collect();
        if rng.chance(0.3) {
            roles.push(format!("/^{}/", &rng.pick(synthetic::ROLES).0[..2]));
        }
        let selector = RoleSelector::parse(&roles).unwrap();
        for environment in ["production", "staging", "dev", "nowhere"] {
            assert_eq!(
                index.with_role(&selector, environment, FRESH),
                before.with_role(&selector, environment, FRESH),
                "{roles:?} in {environment}"
            );
        }
    }
}

#[test]
fn servers_read_back_as_the_nodes_they_were_built_from() {
    let nodes = fleet();
    let index = Index::build(nodes.clone(), "role", NOW);
    let before = reference::Index::build(nodes, "role", NOW);
    let again: Vec<Node> = index.servers().map(|s| s.to_node()).collect();
    assert_eq!(again, before.nodes());
    for (p, node) in before.nodes().iter().enumerate() {
        let server = index.server(p as u32);
        let entries: Vec<(String, Value)> = server.entries().map(|(k, v)| (k.to_string(), v.to_json())).collect();
        let expected: Vec<(String, Value)> = node.entries().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(entries, expected, "{}", node.certname);
        assert_eq!(index.by_certname(&node.certname).map(|s| s.position()), Some(p as u32));
    }
}

/// A dotted role fact (a trusted extension): role lookups, and clauses on that path
/// (answered from the role map), select what the reference selects.
#[test]
fn a_dotted_role_fact_selects_what_the_reference_selects() {
    const ROLE_FACT: &str = "trusted.extensions.pp_role";
    let mut nodes = fleet();
    for (i, node) in nodes.iter_mut().enumerate() {
        let role = node.facts.remove("role").unwrap_or(Value::Null);
        // Some servers keep theirs in the fact only, or in neither.
        match i % 7 {
            0 => {
                node.facts.insert("role".into(), role);
            }
            1 => {}
            _ => {
                node.facts.insert("trusted".into(), serde_json::json!({"extensions": {"pp_role": role}}));
            }
        }
    }
    let index = Index::build(nodes.clone(), ROLE_FACT, NOW);
    let before = reference::Index::build(nodes, ROLE_FACT, NOW);
    let mut selected = 0;
    for (role, _) in synthetic::ROLES {
        let selector = RoleSelector::parse(&[*role]).unwrap();
        let clause = Query::parse(&[format!("{ROLE_FACT}={role}")]).unwrap();
        for environment in ["production", "staging", "dev"] {
            let expected = before.with_role(&selector, environment, FRESH);
            assert_eq!(index.with_role(&selector, environment, FRESH), expected, "{role} in {environment}");
            let by_clause = before.with_facts(&clause, environment, ROLE_FACT, FRESH);
            assert_eq!(index.with_facts(&clause, environment, FRESH), by_clause, "{role} in {environment}");
            assert_eq!(by_clause, expected, "the clause and the role map agree");
            selected += expected.len();
        }
    }
    assert!(selected > 500, "the roles select servers ({selected})");
}
