//! `puppet kicker status`: the index as it is (never refreshed, never waited for),
//! the last refresh any process sharing the cache dir recorded, the kicks and the
//! masterless helper. Answers offline, from the snapshot.
//!
//! Times are Unix milliseconds (`*_ms`), sizes bytes; the kicks are
//! `kick-status.json` as the kick service last wrote it, read rather than asked of a
//! kick service: starting one here would dispatch due kicks (and refresh before
//! each) from a process about to exit.

use crate::error::Result;
use crate::kick::STATUS_FILE;
use crate::service::{Recorded, Service};
use crate::time::now_ms;
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::Path;

/// `kick-status.json` summarizes `kicks.msgpack`, itself at most 64 MiB.
const MAX_KICK_STATUS_BYTES: u64 = 64 << 20;
/// `--max-age` exceeded, or no data: a monitoring check's "critical".
pub const STALE_EXIT_CODE: i32 = 2;

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// Seconds: older data (or none) asks for [`STALE_EXIT_CODE`].
    #[serde(default)]
    max_age: Option<u64>,
}

#[cfg(test)]
impl Args {
    pub(super) fn with_max_age(max_age: Option<u64>) -> Args {
        Args { max_age }
    }
}

pub fn run(service: &Service, args: Args) -> Result<Value> {
    let now = now_ms();
    let config = service.config();
    let index = service.current().filter(|i| !i.is_empty());
    let built_at_ms = index.as_ref().map(|i| i.built_at().saturating_mul(1000));
    let age_ms = built_at_ms.map(|built| now.saturating_sub(built).max(0));
    let snapshot = crate::snapshot::path_in(&config.cache_dir);
    let snapshot_bytes = std::fs::metadata(&snapshot).ok().map(|m| m.len());
    let (last_refresh, unreadable) = match service.recorded_refresh() {
        Recorded::Found(record) => (Some(record), None),
        Recorded::Missing => (service.last_refresh(), None),
        Recorded::Unreadable(why) => (service.last_refresh(), Some(why)),
    };
    let stale = match (args.max_age, age_ms) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(max), Some(age)) => u64::try_from(age).unwrap_or(0) > max.saturating_mul(1000),
    };
    Ok(json!({
        "now_ms": now,
        "source": config.source.name(),
        "source_description": service.describe_source(),
        "config_file": config.file.as_ref().map(|f| f.display().to_string()),
        "cache_dir": config.cache_dir.display().to_string(),
        "index": {
            "generation": index.as_ref().map(|i| i.generation()),
            "servers": index.as_ref().map_or(0, |i| i.len()),
            "built_at_ms": built_at_ms,
            "age_ms": age_ms,
            "bytes": index.as_ref().map_or(0, |i| i.heap_bytes()),
            "snapshot": {"path": snapshot.display().to_string(), "bytes": snapshot_bytes},
        },
        "last_refresh": last_refresh,
        "last_refresh_unreadable": unreadable,
        "backoff": {
            "failures": last_refresh.as_ref().map_or(0, |r| r.failures),
            "retry_at_ms": last_refresh.as_ref().and_then(|r| r.retry_at_ms).filter(|at| *at > now),
        },
        "kicks": match service.shared_kick_status() {
            Some(document) => summarize(document),
            None => kicks(&config.cache_dir),
        },
        "helper": crate::helper_presence::describe(&config.cache_dir),
        "max_age_seconds": args.max_age,
        "stale": stale,
        "exit_code": if stale { STALE_EXIT_CODE } else { 0 },
    }))
}

/// `kick-status.json` and counts drawn from it; null when no kick was recorded.
fn kicks(cache_dir: &Path) -> Value {
    let path = cache_dir.join(STATUS_FILE);
    let document = match crate::bounded_read::read(&path, MAX_KICK_STATUS_BYTES) {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(document) if document.is_object() => document,
            Ok(_) => return json!({"unreadable": format!("{}: not a JSON object", path.display())}),
            Err(e) => return json!({"unreadable": format!("{}: {e}", path.display())}),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Value::Null,
        Err(e) => return json!({"unreadable": format!("{}: {e}", path.display())}),
    };
    summarize(document)
}

/// The summary of a kick status document, and the document.
fn summarize(document: Value) -> Value {
    if document.get("unreadable").is_some() {
        return document;
    }
    let list = |key: &str| document[key].as_array().map_or(&[][..], Vec::as_slice);
    let pending = list("pending");
    let outcomes = list("recent_outcomes");
    let result_is =
        |prefix: &str| outcomes.iter().filter(|o| o["result"].as_str().is_some_and(|r| r.starts_with(prefix))).count();
    let confirmations = list("confirmations");
    let outcome_in = |wanted: &[&str]| {
        confirmations.iter().filter(|c| c["outcome"].as_str().is_some_and(|o| wanted.contains(&o))).count()
    };
    let summary = json!({
        "pending": pending.iter().filter(|p| p["kind"] == "kick").count(),
        "follow_ups": pending.iter().filter(|p| p["kind"] == "follow-up").count(),
        "in_flight": pending.iter().filter(|p| p["in_flight"] == true).count(),
        "running": list("running").len(),
        "recent_started": result_is("started"),
        "recent_failed": result_is("failed"),
        "awaiting_confirmation": list("awaiting_confirmation").len(),
        "recent_confirmed": outcome_in(&["changed", "unchanged", "reported"]),
        "recent_run_failed": outcome_in(&["failed"]),
        "recent_unconfirmed": outcome_in(&["unconfirmed"]),
        "loops": list("role_cycles").len(),
        "updated_at_ms": document["updated_at"].as_i64(),
    });
    json!({"summary": summary, "document": document})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kicks_are_counted_from_the_status_document_and_a_bad_one_is_named() {
        let dir = crate::snapshot::tests::tempdir("status-kicks");
        assert_eq!(kicks(&dir), Value::Null);
        let document = json!({
            "updated_at": 5,
            "pending": [{"kind": "kick", "in_flight": true}, {"kind": "kick", "in_flight": false},
                        {"kind": "follow-up", "in_flight": false}],
            "running": [{"target": "a"}],
            "recent_outcomes": [{"result": "started"}, {"result": "failed: no reply"}, {"result": "started"}],
            "role_cycles": [["a", "b", "a"]],
            "awaiting_confirmation": [{"target": "a"}],
            "confirmations": [{"outcome": "changed"}, {"outcome": "failed"}, {"outcome": "unconfirmed"},
                              {"outcome": "reported"}],
        });
        std::fs::write(dir.join(STATUS_FILE), document.to_string()).unwrap();
        let answer = kicks(&dir);
        assert_eq!(
            answer["summary"],
            json!({"pending": 2, "follow_ups": 1, "in_flight": 1, "running": 1, "recent_started": 2,
                   "recent_failed": 1, "loops": 1, "updated_at_ms": 5, "awaiting_confirmation": 1,
                   "recent_confirmed": 2, "recent_run_failed": 1, "recent_unconfirmed": 1})
        );
        assert_eq!(answer["document"], document);
        std::fs::write(dir.join(STATUS_FILE), b"[1").unwrap();
        assert!(kicks(&dir)["unreadable"].as_str().unwrap().contains(STATUS_FILE));
    }
}
