//! A report's kicks as the Ruby report processor hands them over, in JSON (which
//! both MRI and JRuby have): the same bytes for the magnus and the C-ABI binding.
//!
//! ```json
//! {"host": "node1.example.com", "environment": "production", "time": 1795333867000,
//!  "noop": false, "status": "changed", "kicks": [{"resource": "Notify[kick -> haproxy]", "roles": ["haproxy"]},
//!                           {"resource": "Kick[lb]", "facts": ["role=lb"], "environment": "prod"}]}
//! ```
//!
//! A masterless `puppet apply` adds `"pid": <its process id>` (see [`ReportKicks::reporter_pid`]).
//!
//! Reports come from servers: sizes and counts are bounded, and every field checked.

use super::{KickSpec, ReportKicks, RunStatus, Selector};
use crate::error::{Error, Result};
use serde::Deserialize;

pub const MAX_BYTES: usize = 1 << 20;
pub const MAX_KICKS: usize = 256;
const MAX_ITEMS: usize = 64;
const MAX_NAME: usize = 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireReport {
    host: String,
    environment: String,
    time: i64,
    #[serde(default)]
    noop: bool,
    #[serde(default)]
    kicks: Vec<WireKick>,
    /// Masterless only: the `puppet apply` process whose run this is.
    pid: Option<u32>,
    /// `report.status`: changed, unchanged or failed.
    status: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireKick {
    resource: String,
    roles: Option<Vec<String>>,
    facts: Option<Vec<String>>,
    environment: Option<String>,
}

pub fn parse_report(json: &[u8]) -> Result<ReportKicks> {
    let bad = |what: String| Error::Report(format!("kick report: {what}"));
    if json.len() > MAX_BYTES {
        return Err(bad(format!("{} bytes, more than {MAX_BYTES}", json.len())));
    }
    let wire: WireReport = serde_json::from_slice(json).map_err(|e| bad(e.to_string()))?;
    check_name("host", &wire.host).map_err(bad)?;
    check_name("environment", &wire.environment).map_err(bad)?;
    if wire.kicks.len() > MAX_KICKS {
        return Err(bad(format!("{} kicks, more than {MAX_KICKS}", wire.kicks.len())));
    }
    let status = match wire.status.as_deref() {
        None => None,
        Some(text) => Some(RunStatus::parse(text).ok_or_else(|| {
            bad(format!("invalid status {:?} (changed, unchanged or failed)", truncate(text.to_string())))
        })?),
    };
    let kicks = wire
        .kicks
        .into_iter()
        .map(|k| {
            let selector = match (k.roles, k.facts) {
                (Some(roles), None) => Selector::Roles(check_list(&k.resource, "roles", roles)?),
                (None, Some(facts)) => Selector::Facts(check_list(&k.resource, "facts", facts)?),
                _ => return Err(format!("{}: exactly one of roles and facts is needed", k.resource)),
            };
            if let Some(env) = &k.environment {
                check_name("environment", env)?;
            }
            Ok(KickSpec { resource: truncate(k.resource), selector, environment: k.environment })
        })
        .collect::<std::result::Result<Vec<_>, String>>()
        .map_err(bad)?;
    Ok(ReportKicks {
        host: wire.host,
        environment: wire.environment,
        run_started: wire.time,
        noop: wire.noop,
        kicks,
        reporter_pid: wire.pid.filter(|pid| *pid > 0),
        status,
    })
}

fn check_name(what: &str, value: &str) -> std::result::Result<(), String> {
    if value.is_empty() || value.len() > MAX_NAME || value.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!("invalid {what} {value:?}"));
    }
    Ok(())
}

fn check_list(resource: &str, what: &str, items: Vec<String>) -> std::result::Result<Vec<String>, String> {
    if items.is_empty() || items.len() > MAX_ITEMS || items.iter().any(|i| i.trim().is_empty() || i.len() > MAX_NAME) {
        return Err(format!("{resource}: {what} must be 1 to {MAX_ITEMS} non-empty names"));
    }
    Ok(items)
}

fn truncate(mut resource: String) -> String {
    if resource.len() > MAX_NAME {
        let mut end = MAX_NAME;
        while !resource.is_char_boundary(end) {
            end -= 1;
        }
        resource.truncate(end);
    }
    resource
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_kinds_of_kick() {
        let r = parse_report(
            br#"{"host":"node1","environment":"production","time":5,"noop":false,"kicks":[
            {"resource":"Notify[kick -> haproxy]","roles":["haproxy"]},
            {"resource":"Kick[lb]","facts":["role=lb"],"environment":"staging"}]}"#,
        )
        .unwrap();
        assert_eq!(r.host, "node1");
        assert_eq!(r.run_started, 5);
        assert_eq!(r.kicks[0].selector, Selector::Roles(vec!["haproxy".into()]));
        assert_eq!(r.kicks[1].selector, Selector::Facts(vec!["role=lb".into()]));
        assert_eq!(r.kicks[1].environment.as_deref(), Some("staging"));
        assert_eq!(r.status, None, "a report without its status confirms nothing by it");
        let failed = parse_report(br#"{"host":"n","environment":"p","time":5,"status":"failed"}"#).unwrap();
        assert_eq!(failed.status, Some(RunStatus::Failed));
    }

    #[test]
    fn hostile_reports_are_refused_with_a_reason() {
        let e = |json: &str| parse_report(json.as_bytes()).unwrap_err().to_string();
        assert!(e(r#"{"host":"a b","environment":"p","time":1}"#).contains("invalid host"));
        assert!(e(r#"{"host":"a","environment":"p","time":1,"kicks":[{"resource":"K","roles":["x"],"facts":["y"]}]}"#)
            .contains("exactly one of roles and facts"));
        assert!(e(r#"{"host":"a","environment":"p","time":1,"kicks":[{"resource":"K","roles":[]}]}"#)
            .contains("roles must be"));
        assert!(e(r#"{"host":"a","environment":"p","time":1,"extra":1}"#).contains("unknown field"));
        assert!(e(r#"{"host":"a","environment":"p","time":1,"status":"exploded"}"#)
            .contains(r#"invalid status "exploded" (changed, unchanged or failed)"#));
        let many = format!(
            r#"{{"host":"a","environment":"p","time":1,"kicks":[{}]}}"#,
            vec![r#"{"resource":"K","roles":["x"]}"#; 300].join(",")
        );
        assert!(e(&many).contains("300 kicks"));
        assert!(e(&" ".repeat(MAX_BYTES + 1)).contains("bytes"));
    }
}
