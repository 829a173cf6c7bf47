//! The master's own fact cache: one file per node, written by the master whenever an
//! agent sends its facts. puppetserver 7 writes JSON (`$server_datadir/facts`),
//! older masters wrote Ruby-tagged YAML (`$vardir/yaml/facts`); we read both.

use super::{Harvest, Observation};
use crate::error::{Error, Result};
use crate::time::parse_timestamp;
use serde_json::Value;
use std::fmt;
use std::fs;
use std::io;
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
                Err(error) => harvest.warnings.push(format!("skipped {error}")),
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

/// Why a fact cache file was skipped. Each names the file.
#[derive(Debug)]
#[non_exhaustive]
pub enum FactFileError {
    /// The file could not be read, or is over [`MAX_FILE_SIZE`].
    Read { path: PathBuf, source: io::Error },
    /// A `.json` file that is not JSON.
    Json { path: PathBuf, source: serde_json::Error },
    /// A `.json` file nested deeper than `limit` ([`crate::yaml::MAX_DEPTH`]), like YAML.
    JsonTooDeep { path: PathBuf, limit: usize },
    /// A `.yaml` file that is not UTF-8.
    NotUtf8 { path: PathBuf, source: std::str::Utf8Error },
    /// A `.yaml` file that is not YAML or is over a limit of [`crate::yaml`].
    Yaml { path: PathBuf, source: crate::yaml::YamlError },
    /// The document is not a mapping.
    NotAMapping { path: PathBuf },
    /// The document has no `values` mapping of facts.
    NoValues { path: PathBuf },
    /// The certname (`name`, or the file's name) is empty or holds `/` or NUL.
    BadCertname { path: PathBuf, certname: String },
}

impl FactFileError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            FactFileError::Read { path, .. }
            | FactFileError::Json { path, .. }
            | FactFileError::JsonTooDeep { path, .. }
            | FactFileError::NotUtf8 { path, .. }
            | FactFileError::Yaml { path, .. }
            | FactFileError::NotAMapping { path }
            | FactFileError::NoValues { path }
            | FactFileError::BadCertname { path, .. } => path,
        }
    }
}

impl fmt::Display for FactFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fact cache file {}: ", self.path().display())?;
        match self {
            FactFileError::Read { source, .. } => f.write_str(&describe(source)),
            FactFileError::Json { source, .. } => write!(f, "invalid JSON: {source}"),
            FactFileError::JsonTooDeep { limit, .. } => write!(f, "invalid JSON: nested deeper than {limit} levels"),
            FactFileError::NotUtf8 { source, .. } => write!(f, "invalid YAML: not UTF-8 ({source})"),
            FactFileError::Yaml { source, .. } => write!(f, "invalid YAML: {source}"),
            FactFileError::NotAMapping { .. } => f.write_str("not a Puppet::Node::Facts document (expected a mapping)"),
            FactFileError::NoValues { .. } => f.write_str("no 'values' mapping of facts"),
            FactFileError::BadCertname { certname, .. } => write!(f, "invalid certname {certname:?}"),
        }
    }
}

impl std::error::Error for FactFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FactFileError::Read { source, .. } => Some(source),
            FactFileError::Json { source, .. } => Some(source),
            FactFileError::NotUtf8 { source, .. } => Some(source),
            FactFileError::Yaml { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn read_file(path: &Path, format: Format) -> std::result::Result<Observation, FactFileError> {
    let bytes = crate::bounded_read::read(path, MAX_FILE_SIZE)
        .map_err(|source| FactFileError::Read { path: path.to_path_buf(), source })?;
    let mtime = fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs() as i64);
    parse_fact_file(&bytes, format, path, mtime.unwrap_or(0))
}

/// One fact file's content, as [`load`] reads it: `path` names it (and gives the
/// certname when the document has none), `mtime` dates facts without a timestamp.
pub fn parse_fact_file(
    bytes: &[u8],
    format: Format,
    path: &Path,
    mtime: i64,
) -> std::result::Result<Observation, FactFileError> {
    let document = match format {
        // serde_json stops at 128 levels, before its recursion can hurt; facts from
        // every format and source stop at the same depth as YAML's.
        Format::Json => {
            let value = serde_json::from_slice(bytes)
                .map_err(|source| FactFileError::Json { path: path.to_path_buf(), source })?;
            if deeper_than(&value, crate::yaml::MAX_DEPTH) {
                return Err(FactFileError::JsonTooDeep { path: path.to_path_buf(), limit: crate::yaml::MAX_DEPTH });
            }
            value
        }
        Format::Yaml => {
            let text = std::str::from_utf8(bytes)
                .map_err(|source| FactFileError::NotUtf8 { path: path.to_path_buf(), source })?;
            crate::yaml::parse(text).map_err(|source| FactFileError::Yaml { path: path.to_path_buf(), source })?
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
fn observation(document: Value, path: &Path, mtime: i64) -> std::result::Result<Observation, FactFileError> {
    let Value::Object(mut top) = document else {
        return Err(FactFileError::NotAMapping { path: path.to_path_buf() });
    };
    let Some(Value::Object(facts)) = top.remove("values") else {
        return Err(FactFileError::NoValues { path: path.to_path_buf() });
    };
    let certname = match top.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string(),
    };
    if certname.is_empty() || certname.contains(['/', '\0']) {
        return Err(FactFileError::BadCertname { path: path.to_path_buf(), certname });
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_bad_fact_file_is_a_typed_error_naming_it() {
        let path = Path::new("/facts/web1.example.com.yaml");
        let err = parse_fact_file(b"values: [1\n", Format::Yaml, path, 0).unwrap_err();
        assert!(matches!(&err, FactFileError::Yaml { source: crate::yaml::YamlError::Syntax(_), .. }), "{err:?}");
        assert_eq!(err.path(), path);
        assert!(err.to_string().starts_with("fact cache file /facts/web1.example.com.yaml: invalid YAML: "), "{err}");
        assert!(err.source().is_some_and(|s| s.is::<crate::yaml::YamlError>()));

        let err = parse_fact_file(b"{\"name\": \"web1\"}", Format::Json, path, 0).unwrap_err();
        assert!(matches!(err, FactFileError::NoValues { .. }), "{err:?}");
        let err = parse_fact_file(b"{\"name\": \"a/b\", \"values\": {}}", Format::Json, path, 0).unwrap_err();
        assert_eq!(err.to_string(), "fact cache file /facts/web1.example.com.yaml: invalid certname \"a/b\"");
    }

    #[test]
    fn an_unreadable_fact_file_keeps_the_io_error_as_its_source() {
        let path = Path::new("/nonexistent/puppet-kicker/web1.example.com.json");
        let err = read_file(path, Format::Json).unwrap_err();
        assert!(matches!(&err, FactFileError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound));
        assert_eq!(err.to_string(), format!("fact cache file {}: not found", path.display()));
        let source = err.source().and_then(|s| s.downcast_ref::<io::Error>()).expect("the io error");
        assert_eq!(source.kind(), io::ErrorKind::NotFound);
    }
}
