//! The store-backed index on small hand-made fleets; tests/index_equivalence.rs
//! holds it to the reference index on generated ones.

use super::*;
use crate::facts::Facts;
use crate::query::Query;
use serde_json::{json, Value};

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
    positions.into_iter().map(|p| index.server(p).certname()).collect()
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
    let web1 = idx.by_certname("web1").unwrap();
    assert_eq!(web1.facts().get("role").map(|v| v.to_json()), Some(json!("node")));
}

#[test]
fn fact_queries_are_scoped_to_the_environment_unless_a_clause_names_it() {
    let idx = sample();
    let q = Query::parse(&["role=node", "uptime>10"]).unwrap();
    assert_eq!(certnames(&idx, idx.with_facts(&q, "production", FRESH)), ["web1"]);
    let q = Query::parse(&["role=node"]).unwrap();
    assert_eq!(certnames(&idx, idx.with_facts(&q, "production", FRESH)), ["web1", "web3"]);
    let q = Query::parse(&["environment=staging"]).unwrap();
    assert_eq!(certnames(&idx, idx.with_facts(&q, "production", FRESH)), ["stage"]);
    let q = Query::parse(&["role=/^(node|edge)$/"]).unwrap();
    assert_eq!(certnames(&idx, idx.with_facts(&q, "production", FRESH)), ["web1", "lb1", "web3"]);
}

#[test]
fn the_same_facts_give_the_same_order_whatever_the_input_order() {
    let mut nodes: Vec<Node> = sample().servers().map(|s| s.to_node()).collect();
    nodes.reverse();
    let reversed = Index::build(nodes, "role", NOW);
    let certnames = |i: &Index| i.servers().map(|s| s.certname().to_string()).collect::<Vec<_>>();
    assert_eq!(certnames(&reversed), certnames(&sample()));
    assert_eq!(reversed.store(), sample().store(), "the same store, id for id");
}

#[test]
fn path_indexes_test_each_distinct_value_and_keep_the_rule_for_missing_facts() {
    let idx = sample();
    // `uptime` is missing on lb1: it matches neither `=` nor `!=`.
    let q = Query::parse(&["uptime!=5"]).unwrap();
    assert_eq!(certnames(&idx, idx.with_facts(&q, "production", FRESH)), ["web1"]);
    // A list fact matches when any element does; `!=` when none does.
    let q = Query::parse(&["role=edge"]).unwrap();
    assert_eq!(certnames(&idx, idx.with_facts(&q, "production", FRESH)), ["lb1"]);
    let q = Query::parse(&["role!=edge"]).unwrap();
    assert_eq!(certnames(&idx, idx.with_facts(&q, "production", FRESH)), ["web1", "web3"]);
    // `certname` tests the certname where no fact has that name.
    let q = Query::parse(&["certname=/^web/"]).unwrap();
    assert_eq!(certnames(&idx, idx.with_facts(&q, "production", FRESH)), ["web1", "web3"]);
    // The same clause again is answered from the kept per-value results.
    assert_eq!(certnames(&idx, idx.with_facts(&q, "production", FRESH)), ["web1", "web3"]);
    assert!(idx.heap_bytes() > idx.store().heap_bytes());
}

#[test]
fn stored_rows_are_checked_before_they_make_an_index() {
    let idx = sample();
    let again = Index::from_rows(idx.store().clone(), idx.rows().clone(), "role", NOW).unwrap();
    assert_eq!(certnames(&again, (0..again.len() as u32).collect()), certnames(&idx, (0..idx.len() as u32).collect()));
    let mut short = idx.rows().clone();
    short.timestamp.pop();
    let err = Index::from_rows(idx.store().clone(), short, "role", NOW).unwrap_err();
    assert!(err.0.contains("but a column of"), "{err:?}");
    let mut bad = idx.rows().clone();
    bad.certname[0] = u32::MAX;
    let err = Index::from_rows(idx.store().clone(), bad, "role", NOW).unwrap_err();
    assert!(err.0.contains("past the end"), "{err:?}");
}
