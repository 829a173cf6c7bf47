//! The master's own fact cache: one file per node, written by the master whenever an
//! agent sends its facts. puppetserver 7 writes JSON (`$server_datadir/facts`),
//! older masters wrote Ruby-tagged YAML (`$vardir/yaml/facts`); we read both.

use super::{Harvest, Observation};
use crate::error::{Error, Result};
use crate::time::parse_timestamp;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// A node's cached facts are tens of kilobytes; a larger file is skipped with a warning.
pub const MAX_FILE_SIZE: u64 = 16 << 20;

/// Reads every `*.json` and `*.yaml` file in `dirs`. Fails only when no directory
/// can be read at all; a file that does not parse is skipped with a warning.
pub fn load(dirs: &[PathBuf]) -> Result<Harvest> {
    let mut harvest = Harvest::default();
    let mut failures = Vec::new();
    let mut readable = 0;
    for dir in dirs {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                failures.push(format!("{} ({})", dir.display(), describe(&e)));
                continue;
            }
        };
        readable += 1;
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let Some(format) = Format::of(&path) else {
                continue;
            };
            match read_file(&path, format) {
                Ok(observation) => harvest.observations.push(observation),
                Err(reason) => harvest.warnings.push(format!("skipped fact cache file {}: {reason}", path.display())),
            }
        }
    }
    if readable == 0 {
        return Err(Error::Io(format!("no fact cache directory could be read: {}", failures.join(", "))));
    }
    Ok(harvest)
}

/// The two formats of Puppet's fact cache, by file extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

impl Format {
    pub fn of(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "json" => Some(Format::Json),
            "yaml" => Some(Format::Yaml),
            _ => None,
        }
    }
}

fn read_file(path: &Path, format: Format) -> Result<Observation, String> {
    let bytes = crate::bounded_read::read(path, MAX_FILE_SIZE).map_err(|e| describe(&e))?;
    let mtime = fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs() as i64);
    parse_fact_file(&bytes, format, path, mtime.unwrap_or(0))
}

/// One fact file's content, as [`load`] reads it: `path` names it (and gives the
/// certname when the document has none), `mtime` dates facts without a timestamp.
pub fn parse_fact_file(bytes: &[u8], format: Format, path: &Path, mtime: i64) -> Result<Observation, String> {
    let document = match format {
        // serde_json stops at 128 levels, before its recursion can hurt; facts from
        // every format and source stop at the same depth as YAML's.
        Format::Json => {
            let value = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
            if deeper_than(&value, crate::yaml::MAX_DEPTH) {
                return Err(format!("invalid JSON: nested deeper than {} levels", crate::yaml::MAX_DEPTH));
            }
            value
        }
        Format::Yaml => {
            let text = std::str::from_utf8(bytes).map_err(|e| format!("invalid YAML: not UTF-8 ({e})"))?;
            crate::yaml::parse(text).map_err(|e| format!("invalid YAML: {e}"))?
        }
    };
    observation(document, path, mtime)
}

/// Whether `value` has more than `max` collections nested in one another; without
/// recursion.
fn deeper_than(value: &Value, max: usize) -> bool {
    let mut pending = vec![(value, 0)];
    while let Some((value, depth)) = pending.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        if depth + 1 > max {
            return true;
        }
        pending.extend(children.map(|child| (child, depth + 1)));
    }
    false
}

/// `{name, values, timestamp, expiration}`, as `Puppet::Node::Facts` serializes.
fn observation(document: Value, path: &Path, mtime: i64) -> Result<Observation, String> {
    let Value::Object(mut top) = document else {
        return Err("not a Puppet::Node::Facts document (expected a mapping)".into());
    };
    let Some(Value::Object(facts)) = top.remove("values") else {
        return Err("no 'values' mapping of facts".into());
    };
    let certname = match top.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string(),
    };
    if certname.is_empty() || certname.contains(['/', '\0']) {
        return Err(format!("invalid certname {certname:?}"));
    }
    // Puppet 3 kept the time inside the values as `_timestamp`.
    let timestamp = [top.get("timestamp"), facts.get("_timestamp")]
        .into_iter()
        .flatten()
        .find_map(|t| t.as_str().and_then(parse_timestamp))
        .unwrap_or(mtime);
    Ok(Observation::new(certname, facts, timestamp))
}

fn describe(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "not found".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}
