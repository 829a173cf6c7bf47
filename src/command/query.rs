//! `puppet kicker query`: exactly the servers the functions would return, in their
//! order, through the same service calls, with what the face shows of each.

use crate::error::{Error, Result};
use crate::facts::FactPath;
use crate::reply::Server;
use crate::service::{Selection, Service};
use crate::store::View;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// `servers_with_facts` clauses.
    #[serde(default)]
    clauses: Vec<String>,
    /// `servers_with_role` roles (names or `/regex/`): any of them.
    #[serde(default)]
    roles: Vec<String>,
    /// The compiling node's environment the functions would be called in.
    environment: String,
    /// Fact paths to show as columns.
    #[serde(default)]
    facts: Vec<String>,
}

/// Tries when a refresh swaps the index between the two selections of a query with
/// both roles and clauses.
const ATTEMPTS: usize = 3;

/// `{"generation": G, "facts": [path, ..], "servers": [{"certname", "environment",
/// "columns": [..], "hash": {...}}]}`: `hash` is the Hash the functions return, key
/// for key in their order, `columns` the value at each of `facts` (null where missing).
pub fn run(service: &Service, args: Args) -> Result<String> {
    let selection = select(service, &args)?;
    let paths: Vec<FactPath> = args.facts.iter().map(|p| FactPath::new(p)).collect();
    let servers = selection
        .servers()
        .map(|server| Row {
            certname: server.certname(),
            environment: server.environment(),
            columns: paths.iter().map(|path| server.fact(path)).collect(),
            hash: Server::from(server),
        })
        .collect();
    let answer = Answer { generation: selection.positions().0, facts: &args.facts, servers };
    serde_json::to_string(&answer).map_err(|e| Error::Io(format!("puppet kicker query: {e}")))
}

#[derive(Serialize)]
struct Answer<'a> {
    generation: u64,
    facts: &'a [String],
    servers: Vec<Row<'a>>,
}

#[derive(Serialize)]
struct Row<'a> {
    certname: &'a str,
    environment: &'a str,
    columns: Vec<Option<View<'a>>>,
    hash: Server<'a>,
}

fn select(service: &Service, args: &Args) -> Result<Selection> {
    let environment = &args.environment;
    match (args.roles.is_empty(), args.clauses.is_empty()) {
        (true, true) => Err(Error::Query("puppet kicker query: give a CLAUSE or --role ROLE".into())),
        (false, true) => service.servers_with_role(&args.roles, environment),
        (true, false) => service.servers_with_facts(&args.clauses, environment),
        (false, false) => {
            // Both: the servers the clauses select that also have one of the roles, in
            // the one order, from one index generation.
            for _ in 0..ATTEMPTS {
                let with_role = service.servers_with_role(&args.roles, environment)?;
                let with_facts = service.servers_with_facts(&args.clauses, environment)?;
                if with_role.positions().0 == with_facts.positions().0 {
                    let keep: HashSet<u32> = with_role.positions().1.iter().copied().collect();
                    return Ok(with_facts.retain(|p| keep.contains(&p)));
                }
            }
            Err(Error::Io("puppet kicker query: the index kept changing while it was read; try again".into()))
        }
    }
}
