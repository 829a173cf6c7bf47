//! `puppet kicker query`: exactly the servers the functions would return, in their
//! order, through the same service calls, with what the face shows of each.

use crate::error::{Error, Result};
use crate::facts::FactPath;
use crate::seam::Server;
use crate::service::{Selection, Service};
use serde::Deserialize;
use serde_json::{json, Value};
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
/// "columns": [..], "hash": {...}}]}`: `hash` is the Hash the functions return,
/// `columns` the value at each of `facts` (null where missing).
pub fn run(service: &Service, args: Args) -> Result<Value> {
    let selection = select(service, &args)?;
    let paths: Vec<FactPath> = args.facts.iter().map(|p| FactPath::new(p)).collect();
    let servers: Vec<Value> = selection
        .servers()
        .map(|server| {
            let columns: Vec<Value> =
                paths.iter().map(|path| server.fact(path).map_or(Value::Null, |v| v.to_json())).collect();
            json!({
                "certname": server.certname(),
                "environment": server.environment(),
                "columns": columns,
                "hash": Server::from(server),
            })
        })
        .collect();
    Ok(json!({ "generation": selection.positions().0, "facts": args.facts, "servers": servers }))
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
