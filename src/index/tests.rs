//! The store-backed index on small hand-made fleets; tests/index_equivalence.rs
//! holds it to the reference index on generated ones.

use super::*;
use crate::facts::Facts;
use crate::query::Query;
use serde_json::{json, Value};
use std::sync::Arc;

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
    short.timestamp.make_mut().pop();
    let err = Index::from_rows(idx.store().clone(), short, "role", NOW).unwrap_err();
    assert!(err.0.contains("but a column of"), "{err:?}");
    let mut bad = idx.rows().clone();
    bad.certname.make_mut()[0] = u32::MAX;
    let err = Index::from_rows(idx.store().clone(), bad, "role", NOW).unwrap_err();
    assert!(err.0.contains("past the end"), "{err:?}");
}

#[test]
fn a_large_index_visits_its_servers_on_two_threads_alike() {
    let idx = Index::build(crate::synthetic::fleet(VISIT_IN_PARALLEL_FROM + 101, 3, NOW), "role", NOW);
    let n = idx.len();
    assert!(n >= VISIT_IN_PARALLEL_FROM);
    let (one, two) =
        (RolesAndSortNames::of_with(&idx, "role", true, false), RolesAndSortNames::of_with(&idx, "role", true, true));
    assert_eq!(one.sort_names, two.sort_names);
    assert_eq!(one.roles, two.roles);
    assert_eq!(one.sort_names.len(), n);
    assert!(one.roles.len() >= n / 2, "most synthetic servers have a role");
    // A snapshot's rows: the same role maps as the build's.
    let again = Index::from_rows(idx.store().clone(), idx.rows().clone(), "role", NOW).unwrap();
    assert_eq!(again.by_environment.len(), idx.by_environment.len());
    for (environment, entry) in &idx.by_environment {
        assert_eq!(again.by_environment[environment].all, entry.all);
        assert_eq!(again.by_environment[environment].by_role, entry.by_role);
    }
    // Rows out of order are found in either half, across the middle too.
    for at in [1, n / 2, n - 1] {
        let mut rows = idx.rows().clone();
        for column in [&mut rows.certname, &mut rows.environment, &mut rows.facts, &mut rows.extra] {
            column.make_mut().swap(at - 1, at);
        }
        for column in [&mut rows.timestamp, &mut rows.answered_at] {
            column.make_mut().swap(at - 1, at);
        }
        let err = Index::from_rows(idx.store().clone(), rows, "role", NOW).unwrap_err();
        assert_eq!(err.0, format!("servers {} and {at} are out of order", at - 1));
    }
}

#[test]
fn an_identical_question_gets_the_kept_answer_until_a_selected_server_ages_out() {
    let idx = sample();
    let names = RoleSelector::names(["node"]);
    let question = || Question::Role { roles: vec!["node".into()], environment: "production".into() };
    // `old` is 7,200 s old at NOW: admitted up to NOW + 1, out from NOW + 2.
    let lenient = Freshness { now: NOW, max_age: 7201 };
    let mut computed = 0;
    let mut ask = |fresh: Freshness| {
        idx.answer(question(), fresh, || {
            computed += 1;
            Ok::<_, ()>(idx.with_role(&names, "production", fresh))
        })
        .unwrap()
    };
    let first = ask(lenient);
    assert_eq!(certnames(&idx, first.positions.clone()), ["old", "web1", "web3"]);
    let again = ask(Freshness { now: NOW + 1, ..lenient });
    assert!(Arc::ptr_eq(&first, &again), "the same answer, not an equal one");
    // answer_holds says so without the question, exactly when `answer` would give it.
    assert!(idx.answer_holds(first.id, Freshness { now: NOW + 1, ..lenient }));
    assert!(!idx.answer_holds(first.id, Freshness { now: NOW + 2, ..lenient }), "`old` aged out");
    assert!(!idx.answer_holds(first.id, Freshness { now: NOW - 1, ..lenient }), "the clock went back");
    assert!(!idx.answer_holds(first.id, Freshness { now: NOW, max_age: 7200 }), "another max_age");
    assert!(
        !idx.answer_holds(0, lenient)
            && !idx.answer_holds(u64::MAX, lenient)
            && !idx.answer_holds(first.id + 1000, lenient)
    );
    let later = ask(Freshness { now: NOW + 1, max_age: 7200 });
    assert_ne!(later.id, first.id, "another max_age is another question");
    assert!(
        idx.answer_holds(first.id, lenient) && idx.answer_holds(later.id, Freshness { now: NOW + 1, max_age: 7200 })
    );
    // Once `old` ages out, the answer is computed again, without it.
    let aged = ask(Freshness { now: NOW + 2, ..lenient });
    assert_ne!(aged.id, first.id);
    assert_eq!(certnames(&idx, aged.positions.clone()), ["web1", "web3"]);
    // The answer it replaced is no longer held, even at a time it was true for.
    assert!(!idx.answer_holds(first.id, lenient));
    assert!(idx.answer_holds(aged.id, Freshness { now: NOW + 2, ..lenient }));
    // A clock that went back does not trust an answer from its future.
    let earlier = ask(Freshness { now: NOW - 10, ..lenient });
    assert_ne!(earlier.id, aged.id);
    assert!(!idx.answer_holds(aged.id, Freshness { now: NOW + 2, ..lenient }));
    assert_eq!(computed, 4);
    // Another index (generation) holds none of this one's answers.
    assert!(!sample().answer_holds(earlier.id, Freshness { now: NOW - 10, ..lenient }));
}

#[test]
fn answers_are_per_question_and_an_error_keeps_nothing() {
    let idx = sample();
    let role = |roles: &[&str], environment: &str| Question::Role {
        roles: roles.iter().map(|r| r.to_string()).collect(),
        environment: environment.into(),
    };
    let facts = Question::Facts { clauses: vec!["role=node".into()], environment: "production".into() };
    let positions = |p: Vec<u32>| move || Ok::<_, ()>(p.clone());
    let a = idx.answer(role(&["node"], "production"), FRESH, positions(vec![1, 2])).unwrap();
    let b = idx.answer(role(&["node"], "staging"), FRESH, positions(vec![3])).unwrap();
    let c = idx.answer(role(&["node", "edge"], "production"), FRESH, positions(vec![0])).unwrap();
    let d = idx.answer(facts.clone(), FRESH, positions(vec![1, 2])).unwrap();
    let ids = [a.id, b.id, c.id, d.id];
    assert!(ids.iter().all(|id| *id != 0));
    assert_eq!(ids.iter().collect::<std::collections::BTreeSet<_>>().len(), 4, "{ids:?}");
    let failed = idx.answer(role(&["bad"], "production"), FRESH, || Err::<Vec<u32>, _>("bad role"));
    assert_eq!(failed.unwrap_err(), "bad role");
    let retried = idx.answer(role(&["bad"], "production"), FRESH, positions(vec![])).unwrap();
    assert!(retried.positions.is_empty());
    // Each index generation keeps its own: a rebuilt index answers afresh.
    let rebuilt = sample();
    let e = rebuilt.answer(facts, FRESH, positions(vec![1, 2])).unwrap();
    assert_ne!(e.id, d.id);
}

#[test]
fn kept_answers_are_bounded() {
    let idx = sample();
    let ask = |i: usize| {
        let question = Question::Facts { clauses: vec![format!("uptime={i}")], environment: "production".into() };
        idx.answer(question, FRESH, || Ok::<_, ()>(vec![])).unwrap().id
    };
    let first = ask(0);
    assert_eq!(ask(0), first);
    let second = ask(1);
    for i in 2..ANSWERS.get() {
        ask(i);
    }
    // All 256 kept; answer_holds counts as a use: `first` is not the least recently used then.
    assert!(idx.answer_holds(first, FRESH));
    ask(ANSWERS.get());
    assert!(!idx.answer_holds(second, FRESH), "the least recently used was dropped");
    assert!(idx.answer_holds(first, FRESH));
    assert_eq!(ask(0), first);
    for i in 1000..1000 + ANSWERS.get() {
        ask(i);
    }
    assert!(!idx.answer_holds(first, FRESH), "dropped, and so no longer held");
    assert_ne!(ask(0), first, "the least recently asked of {} + 1 questions was dropped", ANSWERS);
}

/// A dotted role fact reaches into a structured fact (a trusted extension); a
/// top-level fact named exactly so wins, as in queries; a plain name is unchanged.
#[test]
fn a_dotted_role_fact_walks_into_structured_facts() {
    let nodes = || {
        vec![
            node("db1", json!({"trusted": {"extensions": {"pp_role": "db"}}, "role": "other"}), 0),
            node("db2", json!({"trusted": {"extensions": {"pp_role": ["db", "backup"]}}}), 0),
            node("flat", json!({"trusted.extensions.pp_role": "db", "trusted": {"extensions": {"pp_role": "no"}}}), 0),
            node("listed", json!({"roles": ["first", "db"], "trusted": "not a hash"}), 0),
            node("none", json!({"trusted": {"extensions": {}}}), 0),
        ]
    };
    let db = RoleSelector::parse(&["db"]).unwrap();
    let idx = Index::build(nodes(), "trusted.extensions.pp_role", NOW);
    assert_eq!(certnames(&idx, idx.with_role(&db, "production", FRESH)), ["db1", "db2", "flat"]);
    assert_eq!(idx.by_certname("db1").and_then(|s| s.role("trusted.extensions.pp_role")), Some("db"));
    assert_eq!(idx.by_certname("flat").and_then(|s| s.role("trusted.extensions.pp_role")), Some("db"));
    let backup = RoleSelector::parse(&["backup"]).unwrap();
    assert_eq!(certnames(&idx, idx.with_role(&backup, "production", FRESH)), ["db2"]);
    let reference = reference::Index::build(nodes(), "trusted.extensions.pp_role", NOW);
    assert_eq!(reference.with_role(&db, "production", FRESH).len(), 3);
    // A list is walked into by number.
    let by_number = Index::build(nodes(), "roles.1", NOW);
    assert_eq!(certnames(&by_number, by_number.with_role(&db, "production", FRESH)), ["listed"]);
    // A plain role fact reads the top-level fact only.
    let plain = Index::build(nodes(), "role", NOW);
    assert_eq!(
        certnames(&plain, plain.with_role(&RoleSelector::parse(&["other"]).unwrap(), "production", FRESH)),
        ["db1"]
    );
    assert!(plain.with_role(&db, "production", FRESH).is_empty());
}
