//! `puppet kicker explain`: why a server is, or is not, returned by a query. Each
//! part of the verdict is read from the tables the query itself answers from (the
//! path indexes, the role maps, the environment and `max_age` rules), and the
//! verdict is the query's own answer.

use crate::error::{Error, Result};
use crate::facts::DEFAULT_ENVIRONMENT;
use crate::index::{AtPath, Freshness, Index, RoleSelector, ServerRef};
use crate::query::{Clause, Query, Step};
use crate::service::Service;
use crate::store::{Kind, View};
use crate::time::CalendarTime;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// `servers_with_facts` clauses.
    #[serde(default)]
    clauses: Vec<String>,
    /// `servers_with_role` roles (names or `/regex/`): any of them.
    #[serde(default)]
    roles: Vec<String>,
    /// The certname of the server to explain.
    node: String,
    /// The compiling node's environment the functions would be called in.
    environment: String,
}

/// Certnames suggested for an unknown one, at most.
const SUGGESTIONS: usize = 5;

/// `{"certname", "call", "generation", "returned", "reason", "environment": {...},
/// "max_age": {...}, "role": {...} | null, "clauses": [{...}]}`: `returned` is the
/// query's answer, `reason` the first part that fails (null when returned).
pub fn run(service: &Service, args: Args) -> Result<Value> {
    if args.clauses.is_empty() && args.roles.is_empty() {
        return Err(Error::Query("puppet kicker explain: give a CLAUSE or --role ROLE".into()));
    }
    if args.node.is_empty() {
        return Err(Error::Query("puppet kicker explain: give the server to explain with --node CERTNAME".into()));
    }
    // Bad arguments before missing data, as the functions report them.
    let query = Query::parse(&args.clauses)?;
    let roles = if args.roles.is_empty() { None } else { Some(RoleSelector::parse(&args.roles)?) };
    let index = service.current_index()?;
    let server = index.by_certname(&args.node).ok_or_else(|| unknown_node(&index, &args.node))?;
    let question = Question { args: &args, query: &query, roles: roles.as_ref() };
    let seen = service.seen_environment(server.certname());
    Ok(explain(&index, server, &question, service.freshness(), seen.as_deref()))
}

/// What is asked (the clauses, the roles, the compile's environment), and the
/// clauses and roles compiled.
struct Question<'a> {
    args: &'a Args,
    query: &'a Query,
    roles: Option<&'a RoleSelector>,
}

impl Question<'_> {
    /// Whether the server's environment must be the compile's: always for roles,
    /// for clauses unless one names the environment itself.
    fn scoped(&self) -> bool {
        self.roles.is_some() || (!self.query.clauses().is_empty() && !self.query.names_environment())
    }

    /// Whether the query returns the server: the functions' own answer.
    fn returns(&self, index: &Index, position: u32, fresh: Freshness) -> bool {
        let has = |positions: Vec<u32>| positions.binary_search(&position).is_ok();
        let by_facts =
            self.query.clauses().is_empty() || has(index.with_facts(self.query, &self.args.environment, fresh));
        let by_role = self.roles.is_none_or(|roles| has(index.with_role(roles, &self.args.environment, fresh)));
        by_facts && by_role
    }
}

fn explain(index: &Index, server: ServerRef, question: &Question, fresh: Freshness, seen: Option<&str>) -> Value {
    let args = question.args;
    let position = server.position();
    let environment = environment_part(server, question, seen);
    let max_age = max_age_part(server, fresh);
    let role = question.roles.map(|roles| role_part(index, server, roles, &args.roles));
    let clauses: Vec<Value> = question.query.clauses().iter().map(|c| clause_part(index, c, position)).collect();
    let returned = question.returns(index, position, fresh);
    let failed = |part: &Value| (part["holds"] == false).then(|| part["says"].clone());
    let reason = if returned {
        Value::Null
    } else {
        let parts = [Some(&environment), Some(&max_age), role.as_ref()].into_iter().flatten().chain(&clauses);
        parts.filter_map(failed).next().unwrap_or(Value::Null)
    };
    json!({
        "certname": server.certname(),
        "call": call(&args.clauses, &args.roles),
        "generation": index.generation(),
        "returned": returned,
        "reason": reason,
        "environment": environment,
        "max_age": max_age,
        "role": role,
        "clauses": clauses,
    })
}

/// The functions' calls the question stands for, as a manifest would write them.
fn call(clauses: &[String], roles: &[String]) -> String {
    let quoted = |items: &[String]| {
        items.iter().map(|i| format!("'{}'", i.replace('\\', "\\\\").replace('\'', "\\'"))).collect::<Vec<_>>()
    };
    let mut calls = Vec::new();
    if !roles.is_empty() {
        calls.push(format!("servers_with_role({})", quoted(roles).join(", ")));
    }
    if !clauses.is_empty() {
        calls.push(format!("servers_with_facts({})", quoted(clauses).join(", ")));
    }
    calls.join(" and ")
}

/// The server's environment, the rule that decided it, and whether it is in scope.
fn environment_part(server: ServerRef, question: &Question, seen: Option<&str>) -> Value {
    let environment = server.environment();
    let fact = |name: &str| server.facts().get(name).and_then(View::as_str).filter(|s| !s.is_empty());
    let (rule, why) = if fact("environment").is_some() {
        ("fact", "its `environment` fact".to_string())
    } else if fact("agent_specified_environment").is_some() {
        ("agent_specified_environment", "its `agent_specified_environment` fact".to_string())
    } else if seen == Some(environment) {
        ("last_seen", "where the master last saw it, no fact naming one".to_string())
    } else if environment == DEFAULT_ENVIRONMENT {
        ("default", format!("the default, {DEFAULT_ENVIRONMENT}: no fact names one, the master has not seen it"))
    } else {
        ("source", "what the source or the master gave when the index was built, no fact naming one".to_string())
    };
    let scoped = question.scoped();
    let holds = !scoped || environment == question.args.environment;
    let says = if !scoped {
        format!("environment {environment} ({why}); any environment: a clause names the environment")
    } else if holds {
        format!("environment {environment} ({why}), the compile's")
    } else {
        format!("environment {environment} ({why}), not the compile's {}", question.args.environment)
    };
    json!({
        "server": environment,
        "asked": question.args.environment,
        "rule": rule,
        "scoped": scoped,
        "holds": holds,
        "says": says,
    })
}

/// The age of the server's facts against `max_age`.
fn max_age_part(server: ServerRef, fresh: Freshness) -> Value {
    let age = fresh.now.saturating_sub(server.timestamp());
    let holds = fresh.admits(server.timestamp());
    let verdict = if holds { "within" } else { "older than" };
    let at = CalendarTime::utc(server.timestamp());
    let says = format!(
        "facts of {:04}-{:02}-{:02} {:02}:{:02} UTC, {} old, {verdict} max_age {}",
        at.year,
        at.month,
        at.day,
        at.hour,
        at.minute,
        duration(age),
        duration(fresh.max_age as i64)
    );
    json!({ "timestamp": server.timestamp(), "age": age, "max_age": fresh.max_age, "holds": holds, "says": says })
}

/// The role fact against the roles asked, as `servers_with_role` decides.
fn role_part(index: &Index, server: ServerRef, roles: &RoleSelector, asked: &[String]) -> Value {
    let role_fact = index.role_fact();
    let found = server.role_fact_value(role_fact);
    let holds = index.has_role(roles, server.position());
    let says = match found {
        None => format!("no role fact `{role_fact}`"),
        Some(value) => {
            let verdict = if holds { "one of" } else { "not one of" };
            format!("role fact `{role_fact}` is {}, {verdict} {}", shown(value), asked.join(", "))
        }
    };
    json!({
        "roles": asked,
        "fact": role_fact,
        "found": found.map(View::to_json),
        "holds": holds,
        "says": says,
    })
}

/// What the server has at the clause's path, how it was compared, and the verdict.
fn clause_part(index: &Index, clause: &Clause, position: u32) -> Value {
    let (found, holds) = index.clause_at(clause, position);
    let (value, steps, elements) = match found {
        AtPath::Missing => (None, Vec::new(), None),
        AtPath::Text(text) => (Some(Value::from(text)), vec![clause.step_on_text(text)], None),
        AtPath::Value(view) => {
            let steps = clause.steps_on_view(view);
            let elements = match view.kind() {
                Kind::Array(items) => Some(items.iter().zip(&steps).map(|(v, s)| element(v, s)).collect::<Vec<_>>()),
                _ => None,
            };
            (Some(view.to_json()), steps, elements)
        }
    };
    let comparison = comparison(&found, &steps);
    let shown_value = match found {
        AtPath::Missing => "missing".to_string(),
        AtPath::Text(text) => text.to_string(),
        AtPath::Value(view) => shown(view),
    };
    let says = match (found, holds) {
        (AtPath::Missing, _) => format!("'{}': no fact {}", clause.text(), clause.path()),
        (_, true) => format!("'{}' holds on {shown_value}", clause.text()),
        (_, false) => format!("'{}' does not hold on {shown_value}", clause.text()),
    };
    json!({
        "clause": clause.text(),
        "path": clause.path(),
        "missing": matches!(found, AtPath::Missing),
        "found": value,
        "comparison": comparison,
        "negated": clause.negated(),
        "elements": elements,
        "holds": holds,
        "says": says,
    })
}

fn element(value: View, step: &Step) -> Value {
    json!({ "value": value.to_json(), "comparison": step.comparison.as_str(), "matched": step.matched })
}

/// The comparisons made, in order of first use ("version", "string/integer" for a
/// list of mixed elements); "none" for a null or an empty list, null when missing.
fn comparison(found: &AtPath, steps: &[Step]) -> Value {
    if matches!(found, AtPath::Missing) {
        return Value::Null;
    }
    let mut names: Vec<&str> = Vec::new();
    for step in steps {
        if !names.contains(&step.comparison.as_str()) {
            names.push(step.comparison.as_str());
        }
    }
    Value::from(if names.is_empty() { "none".to_string() } else { names.join("/") })
}

/// A value as people read it: text as it is, anything else as JSON.
fn shown(value: View) -> String {
    match value.kind() {
        Kind::Str(s) => s.to_string(),
        _ => value.to_json().to_string(),
    }
}

/// Seconds as the largest unit that keeps two digits of sense: `42s`, `12m`, `5h`, `30d`.
fn duration(seconds: i64) -> String {
    let seconds = seconds.max(0);
    match seconds {
        s if s >= 2 * 86_400 => format!("{}d", s / 86_400),
        s if s >= 2 * 3_600 => format!("{}h", s / 3_600),
        s if s >= 2 * 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// No server `certname`: the error names it, with the certnames it may stand for:
/// those it begins or whose host name it is, else those a typo or two away.
fn unknown_node(index: &Index, certname: &str) -> Error {
    let host = |name: &str| name.split('.').next().unwrap_or(name).to_string();
    let wanted = host(certname);
    let closest = |close: &dyn Fn(&str) -> bool| -> Vec<&str> {
        index.certnames().filter(|c| close(c)).take(SUGGESTIONS).collect()
    };
    let mut close = closest(&|c| c.starts_with(certname) || host(c) == wanted);
    if close.is_empty() && wanted.len() >= 3 {
        close = closest(&|c| edits_within(&wanted, &host(c), 2));
    }
    let hint = match close.as_slice() {
        [] => String::new(),
        some => format!("; did you mean {}?", some.join(", ")),
    };
    Error::Query(format!("puppet kicker explain: no server {certname} in the index ({} servers){hint}", index.len()))
}

/// Whether `a` becomes `b` in at most `limit` single-character edits (Levenshtein).
fn edits_within(a: &str, b: &str, limit: usize) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len().abs_diff(b.len()) > limit {
        return false;
    }
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, x) in a.iter().enumerate() {
        let mut row = vec![i + 1];
        for (j, y) in b.iter().enumerate() {
            row.push((previous[j] + usize::from(x != y)).min(previous[j + 1] + 1).min(row[j] + 1));
        }
        previous = row;
    }
    previous[b.len()] <= limit
}

#[cfg(test)]
mod tests;
