//! What `puppet kicker` (lib/puppet/face/kicker/) asks of the core: one JSON request
//! per subcommand, one JSON answer. Both bindings carry every subcommand through one
//! function ([`crate::seam::command`]), so a new subcommand touches no binding.
//!
//! A request is `{"name": SUBCOMMAND, "args": {...}}`. Arguments are checked here:
//! an unknown one, or one of the wrong type, is a [`Error::Query`] that names it.

mod graph;
mod kick;
mod query;

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
    Ok(run(&*Service::global()?, args)?.to_string())
}

type Handler = fn(&Service, Value) -> Result<Value>;

/// The core's part of each subcommand, by name.
fn handler(name: &str) -> Option<Handler> {
    Some(match name {
        "query" => |service, args| query::run(service, arguments("query", args)?),
        "kick" => |service, args| kick::run(service, arguments("kick", args)?),
        "graph" => |service, args| graph::run(service, arguments("graph", args)?),
        _ => return None,
    })
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
