//! What `puppet kicker` (lib/puppet/face/kicker/) asks of the core: one JSON request
//! per subcommand, one JSON answer. Both bindings carry every subcommand through one
//! function (`api::command`), so a new subcommand touches no binding.
//!
//! A request is `{"name": SUBCOMMAND, "args": {...}}`. Arguments are checked here:
//! an unknown one, or one of the wrong type, is a [`Error::Query`] that names it.

mod explain;
mod graph;
mod kick;
mod metrics;
mod query;
mod refresh;
mod rollout;
mod rollout_run;
mod status;

use crate::error::{Error, Result};
use crate::service::Service;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

/// Largest request taken (a command line's arguments, as JSON).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    name: String,
    #[serde(default)]
    args: Option<Value>,
}

/// Runs the subcommand `request` names, with the process-wide service; its answer as
/// JSON text.
pub fn run(request: &[u8]) -> Result<String> {
    if request.len() > MAX_REQUEST_BYTES {
        return Err(Error::Query(format!(
            "puppet kicker: a request of {} bytes, more than {MAX_REQUEST_BYTES}",
            request.len()
        )));
    }
    let request: Request =
        serde_json::from_slice(request).map_err(|e| Error::Query(format!("puppet kicker: malformed request: {e}")))?;
    let args = request.args.unwrap_or_else(|| Value::Object(Default::default()));
    let name = request.name.as_str();
    let run = handler(name).ok_or_else(|| Error::Query(format!("puppet kicker: no subcommand {name:?}")))?;
    run(&*Service::global()?, args)
}

/// A subcommand's core part: its arguments in, its answer's JSON text out (text, not
/// a `Value`: a server's Hash keeps its key order, which a `Value` would sort).
type Handler = fn(&Service, Value) -> Result<String>;

/// The core's part of each subcommand, by name.
fn handler(name: &str) -> Option<Handler> {
    Some(match name {
        "query" => |service, args| query::run(service, arguments("query", args)?),
        "explain" => |service, args| text(explain::run(service, arguments("explain", args)?)),
        "status" => |service, args| text(status::run(service, arguments("status", args)?)),
        "refresh" => |service, args| text(refresh::start(service, arguments("refresh", args)?)),
        "refresh_progress" => |service, args| text(refresh::progress(service, arguments("refresh", args)?)),
        "metrics" => |service, args| text(metrics::run(service, arguments("metrics", args)?)),
        "kick" => |service, args| text(kick::run(service, arguments("kick", args)?)),
        "graph" => |service, args| text(graph::run(service, arguments("graph", args)?)),
        "rollout_plan" => |service, args| rollout::plan(service, arguments("rollout plan", args)?),
        "rollout_run" => |service, args| text(rollout_run::start(service, arguments("rollout run", args)?)),
        "rollout_step" => |service, args| text(rollout_run::step(service, arguments("rollout run", args)?)),
        "rollout_abort" => |service, args| text(rollout_run::abort(service, arguments("rollout run", args)?)),
        "rollout_status" => |service, args| text(rollout_run::status(service, arguments("rollout status", args)?)),
        _ => return None,
    })
}

/// The JSON text of an answer built as a `Value` (every subcommand but `query`).
fn text(answer: Result<Value>) -> Result<String> {
    answer.map(|value| value.to_string())
}

/// A subcommand's arguments, or an error that names the subcommand and the argument.
fn arguments<T: DeserializeOwned>(name: &str, args: Value) -> Result<T> {
    serde_json::from_value(args).map_err(|e| Error::Query(format!("puppet kicker {name}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_or_oversized_request_is_refused_by_name() {
        let error = |bytes: &[u8]| run(bytes).unwrap_err().to_string();
        assert!(error(b"{").contains("malformed request"));
        assert!(error(br#"{"name":"query","extra":1}"#).contains("unknown field `extra`"));
        assert!(error(&vec![b' '; MAX_REQUEST_BYTES + 1]).contains("more than 1048576"));
        assert!(error(br#"{"name":"frobnicate"}"#).contains(r#"no subcommand "frobnicate""#));
    }
}
