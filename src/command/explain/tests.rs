use super::*;
use crate::facts::{Facts, Node};
use serde_json::json;

const NOW: i64 = 2_000_000_000;
const WEEK: u64 = 7 * 86_400;
const FRESH: Freshness = Freshness { now: NOW, max_age: WEEK };

/// The example's servers (examples/haproxy/servers.yaml), `age_days` as their age.
fn example() -> Vec<Node> {
    let servers = crate::yaml::parse(include_str!("../../../examples/haproxy/servers.yaml")).unwrap();
    let servers = servers.as_object().unwrap().clone();
    servers
        .into_iter()
        .map(|(certname, facts)| {
            let mut facts: Facts = facts.as_object().unwrap().clone();
            let age = facts.remove("age_days").and_then(|d| d.as_i64()).unwrap_or(0) * 86_400;
            Node::new(certname, facts, NOW - age, None)
        })
        .collect()
}

/// Servers with what the example lacks: lists (of text, of numbers, mixed), nulls,
/// booleans, numbers, hashes, no environment fact, `agent_specified_environment`,
/// role lists and missing roles; ages on both sides of `max_age`.
fn generated(count: usize) -> Vec<Node> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    (0..count)
        .map(|i| {
            let count = [1, 2, 4, 8][next(4) as usize];
            let full = ["11.10", "11.2", "12", "12.5", "9"][next(5) as usize];
            let tags = [json!(["blue", "canary"]), json!(["blue"]), json!([]), json!(["green", 7, true])];
            let tags = tags[next(4) as usize].clone();
            let ports = [json!([80, 443]), json!([8080]), json!(["80"])][next(3) as usize].clone();
            let load = [0.5, 2.25, -1.0][next(3) as usize];
            let mut facts = json!({
                "hostname": format!("gen{i}"),
                "processors": {"count": count},
                "os": {"release": {"full": full}},
                "tags": tags,
                "ports": ports,
                "load": load,
                "virtual": next(2) == 0,
                "nothing": null,
                "nested": {"a": 1},
            });
            let facts = facts.as_object_mut().unwrap();
            match next(4) {
                0 => drop(facts.insert("role".into(), json!("node"))),
                1 => drop(facts.insert("role".into(), json!(["haproxy", "node"]))),
                2 => drop(facts.insert("role".into(), json!("db"))),
                _ => {}
            }
            match next(4) {
                0 => drop(facts.insert("environment".into(), json!("staging"))),
                1 => drop(facts.insert("agent_specified_environment".into(), json!("dev"))),
                2 => drop(facts.insert("environment".into(), json!("production"))),
                _ => {}
            }
            let age = [0, 3600, WEEK as i64, WEEK as i64 + 1, 30 * 86_400][next(5) as usize];
            let seen = (next(3) == 0).then_some("dev");
            Node::new(format!("gen{i:03}.example.com"), facts.clone(), NOW - age, seen)
        })
        .collect()
}

const CLAUSES: &[&str] = &[
    "role=node",
    "role!=node",
    "role=/^hap/",
    "os.release.full>=12",
    "os.release.full<11.5",
    "os.release.major=12",
    "processors.count>2",
    "processors.count<=2",
    "ipaddress=~/^10\\.0\\./",
    "hostname!~/^node/",
    "tags=blue",
    "tags!=blue",
    "tags=7",
    "tags=true",
    "ports>100",
    "ports=80",
    "load>0",
    "load=2.25",
    "virtual=true",
    "virtual!=false",
    "nothing=x",
    "nothing!=x",
    "nested=x",
    "missing=x",
    "missing!=x",
    "environment=staging",
    "environment!=production",
    "certname=/^gen00/",
    "certname=node1.example.com",
];

fn args(clauses: &[&str], roles: &[&str], node: &str, environment: &str) -> Args {
    Args {
        clauses: clauses.iter().map(|c| c.to_string()).collect(),
        roles: roles.iter().map(|r| r.to_string()).collect(),
        node: node.into(),
        environment: environment.into(),
    }
}

fn explained(index: &Index, args: &Args) -> Value {
    let query = Query::parse(&args.clauses).unwrap();
    let roles = (!args.roles.is_empty()).then(|| RoleSelector::parse(&args.roles).unwrap());
    let question = Question { args, query: &query, roles: roles.as_ref() };
    let server = index.by_certname(&args.node).unwrap();
    explain(index, server, &question, FRESH, None)
}

fn holds(part: &Value) -> bool {
    part["holds"].as_bool().unwrap()
}

/// Whether a list's elements, combined as the clause combines them, give its verdict;
/// and that a missing fact or a null never matches.
fn steps_agree(part: &Value) -> bool {
    if part["missing"] == true || part["found"].is_null() {
        return !holds(part);
    }
    part["elements"].as_array().is_none_or(|elements| {
        let any = elements.iter().any(|e| e["matched"] == true);
        (any != (part["negated"] == true)) == holds(part)
    })
}

/// The heart of `explain`: its parts, ANDed, are whether the query returns the
/// server, for every server of the example and of a generated fleet, for single
/// clauses, pairs of them, and roles, in three environments; and each clause's
/// verdict is the tree-walking `Clause::matches` on the same server.
#[test]
fn the_parts_anded_are_the_query_answer() {
    let nodes: Vec<Node> = example().into_iter().chain(generated(120)).collect();
    let index = Index::build(nodes.clone(), "role", NOW);
    let mut questions: Vec<(Vec<&str>, Vec<&str>)> = CLAUSES.iter().map(|c| (vec![*c], vec![])).collect();
    for (i, a) in CLAUSES.iter().enumerate() {
        questions.push((vec![*a, CLAUSES[(i * 7 + 3) % CLAUSES.len()]], vec![]));
        questions.push((vec![*a], vec!["node"]));
    }
    questions.push((vec![], vec!["node"]));
    questions.push((vec![], vec!["/^hap/", "db"]));
    let mut checked = (0, 0);
    for environment in ["production", "staging", "dev"] {
        for (clauses, roles) in &questions {
            let query = Query::parse(clauses).unwrap();
            let selector = (!roles.is_empty()).then(|| RoleSelector::parse(roles).unwrap());
            let mut returned: Vec<u32> = (0..index.len() as u32).collect();
            if !clauses.is_empty() {
                returned = index.with_facts(&query, environment, FRESH);
            }
            if let Some(selector) = &selector {
                let with_role = index.with_role(selector, environment, FRESH);
                returned.retain(|p| with_role.contains(p));
            }
            for node in &nodes {
                let answer = explained(&index, &args(clauses, roles, &node.certname, environment));
                let position = index.by_certname(&node.certname).unwrap().position();
                let mut parts = vec![&answer["environment"], &answer["max_age"]];
                parts.extend(answer["role"].as_object().map(|_| &answer["role"]));
                parts.extend(answer["clauses"].as_array().unwrap());
                let anded = parts.iter().all(|p| holds(p));
                let context = format!("{clauses:?} {roles:?} in {environment} on {}: {answer:#}", node.certname);
                assert_eq!(anded, returned.contains(&position), "{context}");
                assert_eq!(answer["returned"], anded, "{context}");
                assert_eq!(answer["reason"].is_null(), anded, "{context}");
                for (clause, part) in query.clauses().iter().zip(answer["clauses"].as_array().unwrap()) {
                    assert_eq!(holds(part), clause.matches(node), "{context}");
                    assert!(steps_agree(part), "{context}");
                }
                checked.0 += 1;
                checked.1 += usize::from(anded);
            }
        }
    }
    assert!(checked.1 > 500 && checked.0 - checked.1 > 500, "too one-sided: {checked:?}");
}

#[test]
fn each_clause_shows_what_it_found_and_how_it_compared() {
    let index = Index::build(example(), "role", NOW);
    let answer = explained(
        &index,
        &args(&["os.release.full>=12", "hostname=~/^node/", "kernel=Linux"], &[], "node3.example.com", "production"),
    );
    let clauses = answer["clauses"].as_array().unwrap();
    assert_eq!(clauses[0]["found"], "11.10");
    assert_eq!(clauses[0]["comparison"], "version");
    assert_eq!(clauses[0]["holds"], false);
    assert_eq!(clauses[1]["comparison"], "regex");
    assert_eq!(clauses[1]["holds"], true);
    assert_eq!((clauses[2]["missing"].clone(), clauses[2]["found"].clone()), (json!(true), Value::Null));
    assert_eq!(answer["returned"], false);
    assert_eq!(answer["reason"], "'os.release.full>=12' does not hold on 11.10");
    assert_eq!(answer["call"], "servers_with_facts('os.release.full>=12', 'hostname=~/^node/', 'kernel=Linux')");
    let numbers = explained(&index, &args(&["processors.count>2"], &["node"], "node3.example.com", "production"));
    assert_eq!(numbers["clauses"][0]["comparison"], "integer");
    assert_eq!(numbers["role"]["says"], "role fact `role` is node, one of node");
    assert_eq!(numbers["returned"], true);
}

#[test]
fn the_environment_rule_and_max_age_are_reasons() {
    let index = Index::build(example(), "role", NOW);
    let staging = explained(&index, &args(&["role=node"], &[], "node9.staging.example.com", "production"));
    assert_eq!(staging["environment"]["rule"], "fact");
    assert_eq!(staging["reason"], "environment staging (its `environment` fact), not the compile's production");
    let stale = explained(&index, &args(&[], &["node"], "node0.example.com", "production"));
    assert_eq!(stale["max_age"]["age"], 30 * 86_400);
    assert_eq!(stale["reason"], "facts of 2033-04-18 03:33 UTC, 30d old, older than max_age 7d");
    let anywhere = explained(&index, &args(&["environment=staging"], &[], "node9.staging.example.com", "production"));
    assert_eq!((anywhere["environment"]["scoped"].clone(), anywhere["returned"].clone()), (json!(false), json!(true)));
}

#[test]
fn how_the_environment_was_decided_is_named() {
    let node = |certname: &str, facts: Value, seen: Option<&str>| {
        Node::new(certname.into(), facts.as_object().unwrap().clone(), NOW, seen)
    };
    let index = Index::build(
        vec![
            node("a", json!({"agent_specified_environment": "dev"}), None),
            node("b", json!({}), Some("qa")),
            node("c", json!({}), None),
        ],
        "role",
        NOW,
    );
    let rule = |certname: &str, seen: Option<&str>| {
        let (args, query) = (args(&["x=1"], &[], certname, "production"), Query::parse(&["x=1"]).unwrap());
        let question = Question { args: &args, query: &query, roles: None };
        let server = index.by_certname(certname).unwrap();
        let answer = explain(&index, server, &question, FRESH, seen);
        answer["environment"]["rule"].as_str().unwrap().to_string()
    };
    assert_eq!(rule("a", None), "agent_specified_environment");
    assert_eq!(rule("b", Some("qa")), "last_seen");
    assert_eq!(rule("b", None), "source");
    assert_eq!(rule("c", None), "default");
}

#[test]
fn a_list_fact_is_told_element_by_element() {
    let facts = json!({"tags": ["blue", "canary", 7]}).as_object().unwrap().clone();
    let index = Index::build(vec![Node::new("t".into(), facts, NOW, None)], "role", NOW);
    let answer = explained(&index, &args(&["tags!=canary", "tags<10"], &[], "t", "production"));
    let not_canary = &answer["clauses"][0];
    assert_eq!(not_canary["negated"], true);
    assert_eq!(not_canary["holds"], false);
    let matched: Vec<&Value> = not_canary["elements"].as_array().unwrap().iter().map(|e| &e["matched"]).collect();
    assert_eq!(matched, [false, true, false]);
    assert_eq!(answer["clauses"][1]["comparison"], "string/integer");
}

#[test]
fn an_unknown_node_is_named_with_the_closest_certnames() {
    let index = Index::build(example(), "role", NOW);
    let message = |certname: &str| unknown_node(&index, certname).to_string();
    assert_eq!(
        message("node3"),
        "puppet kicker explain: no server node3 in the index (6 servers); did you mean node3.example.com?"
    );
    assert!(message("nod3.example.org").ends_with(
        "did you mean node0.example.com, node1.example.com, node2.example.com, node3.example.com, node9.staging.example.com?"
    ));
    assert!(message("web3").ends_with("(6 servers)"));
}

#[test]
fn calls_are_written_as_a_manifest_would_and_ages_compactly() {
    assert_eq!(
        call(&["a='b'".into()], &["node".into()]),
        r"servers_with_role('node') and servers_with_facts('a=\'b\'')"
    );
    let ages: Vec<String> = [-5, 59, 119, 120, 7200, 172_800, 2_592_000].map(duration).to_vec();
    assert_eq!(ages, ["0s", "59s", "119s", "2m", "2h", "2d", "30d"]);
}
