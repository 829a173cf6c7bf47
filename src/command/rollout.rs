//! `puppet kicker rollout plan`: the order in which an environment's servers would run
//! Puppet, by role group in the kick graph's dependency order (or as given), in
//! batches; changes nothing. The servers come from the index as the functions select
//! them (as `query` does), the graph from the saved kick state as `graph` reads it (no
//! kick service started, nothing sent); the order itself is [`crate::rollout::plan`]'s.

use crate::error::{Error, Result};
use crate::rollout::{self, Cycle, Group, Member, Options, Order, RolloutError, Totals};
use crate::service::{Selection, Service};
use crate::store::KeyHint;
use crate::RoleSelector;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// What the face sends.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// The environment whose servers roll out.
    environment: String,
    /// `--roles`: role names or `/regex/`, any of them (as `servers_with_role`).
    #[serde(default)]
    roles: Vec<String>,
    /// `--facts`: clauses, all of them (as `servers_with_facts`).
    #[serde(default)]
    clauses: Vec<String>,
    /// `--batch`: servers per batch (none: a group in one batch).
    #[serde(default)]
    batch: Option<u64>,
    /// `--order`: `graph` (the default) or `given`.
    #[serde(default)]
    order: Option<String>,
}

impl Args {
    /// The plan `rollout run` asks for.
    pub(super) fn new(
        environment: &str,
        roles: &[String],
        clauses: &[String],
        batch: Option<u64>,
        order: Option<String>,
    ) -> Args {
        Args { environment: environment.into(), roles: roles.to_vec(), clauses: clauses.to_vec(), batch, order }
    }
}

/// The answer: the request as understood, then the plan ([`rollout::Plan`]'s fields).
#[derive(Serialize)]
struct Answer<'a> {
    environment: &'a str,
    roles: &'a [String],
    clauses: &'a [String],
    /// Entries of `roles` that selected no server (a typo shows here, not as a plan
    /// that silently lacks a role).
    unmatched_roles: Vec<&'a str>,
    order: Order,
    batch: Option<usize>,
    groups: &'a [Group],
    cycles: &'a [Cycle],
    totals: Totals,
}

const NAME: &str = "puppet kicker rollout plan";

/// `{"environment", "roles", "clauses", "unmatched_roles", "order", "batch", "groups":
/// [{"name", "roles", "cycle", "servers", "batches"}], "cycles": [{"roles", "edges",
/// "group", "rule"}], "totals": {"servers", "roles", "groups", "batches"}}`.
pub fn plan(service: &Service, args: Args) -> Result<String> {
    let (plan, unmatched) = make_plan(service, &args)?;
    let answer = Answer {
        environment: &args.environment,
        roles: &args.roles,
        clauses: &args.clauses,
        unmatched_roles: unmatched.iter().map(String::as_str).collect(),
        order: plan.order,
        batch: plan.batch,
        groups: &plan.groups,
        cycles: &plan.cycles,
        totals: plan.totals,
    };
    serde_json::to_string(&answer).map_err(|e| Error::Io(format!("{NAME}: {e}")))
}

/// The plan `args` ask for, and the entries of `--roles` that selected no server.
pub(super) fn make_plan(service: &Service, args: &Args) -> Result<(rollout::Plan, Vec<String>)> {
    let order = Order::parse(args.order.as_deref().unwrap_or("graph")).map_err(refused)?;
    let batch = match args.batch {
        Some(n) => Some(usize::try_from(n).map_err(|_| Error::Query(format!("{NAME}: --batch {n}: too large")))?),
        None => None,
    };
    Options { order, given: &args.roles, batch }.check().map_err(refused)?;
    if !args.roles.is_empty() && !args.clauses.is_empty() {
        return Err(Error::Query(format!("{NAME}: give --roles or --facts, not both")));
    }

    let selection = select(service, args)?;
    if selection.is_empty() {
        return Err(Error::Query(format!(
            "{NAME}: nothing to roll out: no server of environment {:?} matches {} (servers whose facts are older \
             than max_age are left out)",
            args.environment,
            describe_selector(args)
        )));
    }
    let role_fact = service.config().role_fact.as_str();
    let members = members(&selection, role_fact, &args.roles)?;
    let present: BTreeSet<&str> = members.iter().flat_map(|m| m.roles.iter().copied()).collect();
    let (given, unmatched) = expand_given(&args.roles, &present)?;

    let state = match order {
        Order::Graph => Some(service.kick_state()?),
        Order::Given => None,
    };
    let edges = state.iter().flat_map(|s| s.graph.edges());
    let plan = rollout::plan(&members, edges, &Options { order, given: &given, batch }).map_err(refused)?;
    let unmatched = unmatched.into_iter().map(String::from).collect();
    Ok((plan, unmatched))
}

fn refused(error: RolloutError) -> Error {
    Error::Query(format!("{NAME}: {error}"))
}

/// The servers as the functions select them: by role, by clauses, or (neither) every
/// server of the environment (no clause: the environment's servers within `max_age`).
fn select(service: &Service, args: &Args) -> Result<Selection> {
    if !args.roles.is_empty() {
        service.servers_with_role(&args.roles, &args.environment)
    } else {
        service.servers_with_facts(&args.clauses, &args.environment)
    }
}

fn describe_selector(args: &Args) -> String {
    if !args.roles.is_empty() {
        format!("--roles {}", args.roles.join(","))
    } else if !args.clauses.is_empty() {
        let quoted: Vec<String> = args.clauses.iter().map(|c| format!("'{c}'")).collect();
        format!("--facts {}", quoted.join(" "))
    } else {
        "any selector (the environment has no server)".to_string()
    }
}

/// Each selected server with its roles: those `roles` selects when given (a server of
/// roles `node` and `monitor` selected by `--roles node` rolls out as a node), else
/// every role its role fact names.
fn members<'s>(selection: &'s Selection, role_fact: &str, roles: &[String]) -> Result<Vec<Member<'s>>> {
    let selector = if roles.is_empty() { None } else { Some(RoleSelector::parse(roles)?) };
    let selects = |role: &str| {
        selector
            .as_ref()
            .is_none_or(|s| s.names.iter().any(|n| n == role) || s.patterns.iter().any(|p| p.is_match(role)))
    };
    let mut hint = KeyHint::new(role_fact);
    Ok(selection
        .servers()
        .map(|server| Member {
            certname: server.certname(),
            roles: server.roles_hinted(role_fact, &mut hint).filter(|role| selects(role)).collect(),
        })
        .collect())
}

/// The roles of the plan in the order `--roles` gives them: each name as typed, each
/// `/regex/` as the roles it matches by name; a role once, where it is first given.
/// Also the entries that matched no selected server's role.
fn expand_given<'a>(roles: &'a [String], present: &BTreeSet<&str>) -> Result<(Vec<String>, Vec<&'a str>)> {
    let mut given: Vec<String> = Vec::new();
    let mut listed: BTreeSet<&str> = BTreeSet::new();
    let mut unmatched = Vec::new();
    for entry in roles {
        let selector = RoleSelector::parse(std::slice::from_ref(entry))?;
        let matching: Vec<&str> = present
            .iter()
            .copied()
            .filter(|role| {
                selector.names.iter().any(|n| n == role) || selector.patterns.iter().any(|p| p.is_match(role))
            })
            .collect();
        if matching.is_empty() {
            unmatched.push(entry.as_str());
        }
        for role in matching {
            if listed.insert(role) {
                given.push(role.to_string());
            }
        }
    }
    Ok((given, unmatched))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PuppetSettings;
    use crate::kick::{PlannerState, STATE_FILE};
    use serde_json::{json, Value};
    use std::fs;

    /// A service over a fact cache of `servers` (certname, role or none, environment)
    /// whose saved kick state holds `edges`.
    fn service(name: &str, servers: &[(&str, Option<&str>, &str)], edges: &[(&str, &str)]) -> Service {
        let root = crate::snapshot::tests::tempdir(&format!("command-rollout-{name}"));
        let (etc, facts, cache) = (root.join("etc"), root.join("facts"), root.join("cache"));
        for dir in [&etc, &facts, &cache] {
            fs::create_dir_all(dir).unwrap();
        }
        let config = format!("puppet_cache:\n  dirs: [{}]\ncache:\n  dir: {}\n", facts.display(), cache.display());
        fs::write(etc.join("puppet_kicker.yaml"), config).unwrap();
        for (certname, role, environment) in servers {
            let mut values = json!({"fqdn": certname, "environment": environment});
            if let Some(role) = role {
                values["role"] = json!(role);
            }
            let doc = json!({"name": certname, "values": values});
            fs::write(facts.join(format!("{certname}.json")), doc.to_string()).unwrap();
        }
        let mut state = PlannerState::default();
        for (from, to) in edges {
            state.graph.add(from, to, crate::kick::now_ms(), 6);
        }
        fs::write(cache.join(STATE_FILE), rmp_serde::to_vec_named(&state).unwrap()).unwrap();
        let settings = PuppetSettings { confdir: etc, vardir: root.join("var"), ..Default::default() };
        Service::start(settings).unwrap()
    }

    fn fleet(name: &str) -> Service {
        let servers = [
            ("node2.example.com", Some("node"), "production"),
            ("node1.example.com", Some("node"), "production"),
            ("node3.example.com", Some("node"), "production"),
            ("lb1.example.com", Some("haproxy"), "production"),
            ("db1.example.com", Some("db"), "production"),
            ("mon1.example.com", Some("monitor"), "production"),
            ("bare.example.com", None, "production"),
            ("node9.staging.example.com", Some("node"), "staging"),
        ];
        // db -> node <-> haproxy: a cycle after db; monitor kicks nothing and is kicked by none.
        service(name, &servers, &[("node", "haproxy"), ("haproxy", "node"), ("db", "node")])
    }

    fn run(service: &Service, args: Value) -> Result<Value> {
        let args: Args = serde_json::from_value(args).map_err(|e| Error::Query(e.to_string()))?;
        plan(service, args).map(|text| serde_json::from_str(&text).unwrap())
    }

    fn names(answer: &Value) -> Vec<&str> {
        answer["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect()
    }

    #[test]
    fn every_server_of_the_environment_in_graph_order_with_the_cycle_and_the_roleless_last() {
        let service = fleet("all");
        let answer = run(&service, json!({"environment": "production", "batch": 2})).unwrap();
        assert_eq!(names(&answer), ["db", "haproxy, node", "monitor", "(no role)"]);
        assert_eq!(
            answer["groups"][1],
            json!({"name": "haproxy, node", "roles": ["haproxy", "node"], "cycle": true,
                   "servers": ["lb1.example.com", "node1.example.com", "node2.example.com", "node3.example.com"],
                   "batches": [["lb1.example.com", "node1.example.com"], ["node2.example.com", "node3.example.com"]]})
        );
        assert_eq!(answer["groups"][3]["servers"], json!(["bare.example.com"]));
        assert_eq!(
            answer["cycles"],
            json!([{"roles": ["haproxy", "node"], "edges": [["haproxy", "node"], ["node", "haproxy"]],
                    "group": 2, "rule": rollout::CYCLE_RULE}])
        );
        assert_eq!(answer["totals"], json!({"servers": 7, "roles": 4, "groups": 4, "batches": 5}));
        assert_eq!((answer["environment"].as_str(), answer["order"].as_str()), (Some("production"), Some("graph")));
        let again = run(&service, json!({"environment": "production", "batch": 2})).unwrap();
        assert_eq!(again, answer, "the same inputs, the same plan");
    }

    #[test]
    fn roles_select_as_the_functions_do_and_given_order_follows_them_as_typed() {
        let service = fleet("roles");
        let answer = run(
            &service,
            json!({"environment": "production", "roles": ["/^(mon|hap)/", "db", "nope"],
                                          "order": "given"}),
        )
        .unwrap();
        assert_eq!(names(&answer), ["haproxy", "monitor", "db"], "a regex's roles by name, where it was typed");
        assert_eq!(answer["cycles"], json!([]));
        assert_eq!(answer["unmatched_roles"], json!(["nope"]));
        assert_eq!(answer["groups"][0]["batches"], json!([["lb1.example.com"]]), "no --batch: one batch");
        let staging = run(&service, json!({"environment": "staging", "roles": ["node"]})).unwrap();
        assert_eq!(staging["groups"][0]["servers"], json!(["node9.staging.example.com"]));
        let facts = run(&service, json!({"environment": "production", "clauses": ["fqdn=/^(db|node1)/"]})).unwrap();
        assert_eq!(names(&facts), ["db", "node"]);
        assert_eq!(facts["clauses"], json!(["fqdn=/^(db|node1)/"]));
    }

    #[test]
    fn bad_arguments_and_an_empty_selection_are_errors_naming_them() {
        let service = fleet("errors");
        let error = |args: Value| run(&service, args).unwrap_err().to_string();
        let production = |extra: Value| {
            let mut args = json!({"environment": "production"});
            args.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            args
        };
        assert!(error(production(json!({"batch": 0}))).contains("--batch 0: a batch holds at least 1 server"));
        assert!(error(production(json!({"order": "random"}))).contains("--order \"random\": use graph or given"));
        assert!(error(production(json!({"order": "given"}))).contains("--order given needs --roles"));
        let both = error(production(json!({"roles": ["db"], "clauses": ["a=b"]})));
        assert!(both.contains("give --roles or --facts, not both"), "{both}");
        let nothing = error(production(json!({"roles": ["web", "/^x/"]})));
        assert!(
            nothing.contains("nothing to roll out: no server of environment \"production\" matches --roles web,/^x/"),
            "{nothing}"
        );
        let nothing = error(json!({"environment": "qa"}));
        assert!(
            nothing.contains("environment \"qa\" matches any selector (the environment has no server)"),
            "{nothing}"
        );
        assert!(error(production(json!({"clauses": ["uptime"]}))).contains("clause 'uptime'"));
        assert!(error(production(json!({"roles": ["/(/"]}))).contains("role /(/: invalid regex"));
        assert!(error(production(json!({"batch": -1}))).contains("invalid value"));
        assert!(error(production(json!({"extra": 1}))).contains("unknown field `extra`"));
    }
}
