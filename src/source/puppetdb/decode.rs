//! PuppetDB's answers to this source's queries, decoded. An inventory entry's
//! facts go straight into the store (the JSON fast path, serde_json where it
//! declines), with `trusted` added to them.
//!
//! An answer of the wrong shape (not JSON, not an array of objects, a field
//! missing or of the wrong type) is an error: never silently fewer servers. One
//! server over the limits one fact cache file has (16 MiB, 64 levels), or with an
//! unusable certname, is skipped with a warning, as that file would be.

use crate::source::puppet_cache::{TextOrSkip, MAX_FILE_SIZE};
use crate::store::json::{self, fast, Depth, JsonError, Skip, ValueSeed};
use crate::store::{Builder, ValueId};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;

/// One server of an inventory answer; its facts (with `trusted`) in the builder.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub certname: String,
    /// As PuppetDB wrote it: compared as text with the listing's.
    pub timestamp: String,
    /// Unix seconds of `timestamp`.
    pub seconds: i64,
    pub environment: Option<String>,
    pub facts: ValueId,
}

/// A server of a listing: its certname and when its facts were stored.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Listed {
    pub certname: String,
    pub timestamp: String,
}

/// A node deactivated or expired.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Gone {
    pub certname: String,
    pub deactivated: Option<String>,
    pub expired: Option<String>,
}

/// The entries of an inventory answer, appended to `entries`; servers skipped go
/// to `warnings`. The error says what is wrong with the answer.
pub fn inventory(
    bytes: &[u8],
    builder: &mut Builder,
    entries: &mut Vec<Entry>,
    warnings: &mut Vec<String>,
) -> Result<(), AnswerError> {
    inventory_by(bytes, builder, entries, warnings, Path::Fast)
}

/// [`inventory`] by serde_json alone: what the fast path is held to.
#[cfg(any(test, feature = "synthetic"))]
pub fn inventory_with_serde(
    bytes: &[u8],
    builder: &mut Builder,
    entries: &mut Vec<Entry>,
    warnings: &mut Vec<String>,
) -> Result<(), AnswerError> {
    inventory_by(bytes, builder, entries, warnings, Path::Serde)
}

/// Which reader decodes an entry first.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// The fast path, serde_json where it declines.
    Fast,
    #[cfg(any(test, feature = "synthetic"))]
    Serde,
}

fn inventory_by(
    bytes: &[u8],
    builder: &mut Builder,
    entries: &mut Vec<Entry>,
    warnings: &mut Vec<String>,
    path: Path,
) -> Result<(), AnswerError> {
    let raw: Vec<&RawValue> = serde_json::from_slice(bytes)
        .map_err(|e| AnswerError::NotAnArray { of: "inventory entries", reason: e.to_string() })?;
    for (i, element) in raw.into_iter().enumerate() {
        let text = element.get().as_bytes();
        if text.len() as u64 > MAX_FILE_SIZE {
            warnings.push(format!(
                "skipped PuppetDB inventory entry {i} ({}): larger than {MAX_FILE_SIZE} bytes",
                certname_in(text)
            ));
            continue;
        }
        match entry(text, builder, path) {
            Ok(entry) => entries.push(entry),
            Err(EntryError::Skipped(why)) => {
                warnings.push(format!("skipped PuppetDB inventory entry {i} ({}): {why}", certname_in(text)))
            }
            Err(EntryError::Malformed(reason)) => return Err(AnswerError::Entry { index: i, reason }),
        }
    }
    Ok(())
}

/// The servers of a listing answer.
pub fn listing(bytes: &[u8]) -> Result<Vec<Listed>, AnswerError> {
    let listed: Vec<Listed> = serde_json::from_slice(bytes)
        .map_err(|e| AnswerError::NotAnArray { of: "{certname, timestamp} strings", reason: e.to_string() })?;
    match listed.iter().find(|l| crate::time::parse_timestamp(&l.timestamp).is_none()) {
        Some(bad) => {
            Err(AnswerError::UnreadableTimestamp { certname: bad.certname.clone(), timestamp: bad.timestamp.clone() })
        }
        None => Ok(listed),
    }
}

/// The nodes of a `nodes` answer.
pub fn gone(bytes: &[u8]) -> Result<Vec<Gone>, AnswerError> {
    serde_json::from_slice(bytes)
        .map_err(|e| AnswerError::NotAnArray { of: "{certname, deactivated, expired}", reason: e.to_string() })
}

/// What is wrong with an answer of the wrong shape (never silently fewer servers).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AnswerError {
    /// Not a JSON array of what the query asks for (`of`); `reason`: serde_json's.
    NotAnArray { of: &'static str, reason: String },
    /// Inventory entry `index` (0-based) is not an inventory entry, and why.
    Entry { index: usize, reason: String },
    /// A listed server whose timestamp is not a date and time.
    UnreadableTimestamp { certname: String, timestamp: String },
    /// An entry for a server the request did not ask for.
    NotAskedFor { certname: String },
}

impl fmt::Display for AnswerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnswerError::NotAnArray { of, reason } => write!(f, "not a JSON array of {of}: {reason}"),
            AnswerError::Entry { index, reason } => write!(f, "inventory entry {index}: {reason}"),
            AnswerError::UnreadableTimestamp { certname, timestamp } => {
                write!(f, "{certname:?} has an unreadable timestamp {timestamp:?}")
            }
            AnswerError::NotAskedFor { certname } => write!(f, "an entry for {certname:?}, which was not asked for"),
        }
    }
}

impl std::error::Error for AnswerError {}

enum EntryError {
    /// Over a limit, or a certname the index cannot hold: this server only.
    Skipped(String),
    /// Not an inventory entry: the whole answer is wrong.
    Malformed(String),
}

/// An entry's fields as read, before they are checked.
#[derive(Default)]
struct Fields {
    certname: Option<String>,
    timestamp: Option<String>,
    environment: Option<String>,
    environment_given: bool,
    facts: Option<ValueId>,
    trusted: Option<ValueId>,
}

fn entry(text: &[u8], builder: &mut Builder, path: Path) -> Result<Entry, EntryError> {
    let mark = builder.open();
    let fast = if path == Path::Fast { fields_fast(text, builder) } else { None };
    let fields = match fast {
        Some(fields) => fields,
        None => {
            builder.discard_open(mark);
            fields_with_serde(text, builder).map_err(|e| {
                builder.discard_open(mark);
                match e {
                    JsonError::TooDeep { limit } => EntryError::Skipped(format!("nested deeper than {limit} levels")),
                    JsonError::Syntax(e) => EntryError::Malformed(e.to_string()),
                }
            })?
        }
    };
    checked(fields, builder)
}

/// The fields by the fast path; `None` where it declines.
fn fields_fast(text: &[u8], builder: &mut Builder) -> Option<Fields> {
    let mut reader = fast::Reader::new(text);
    reader.open_object()?;
    // The entry is the first of the containers the limit counts.
    let depth = crate::yaml::MAX_DEPTH - 1;
    let mut fields = Fields::default();
    let mut first = true;
    while let Some(key) = reader.next_key(first)? {
        reader.colon()?;
        match std::str::from_utf8(&key).ok()? {
            "certname" => fields.certname = reader.text_or_skip(depth)?,
            "timestamp" => fields.timestamp = reader.text_or_skip(depth)?,
            "environment" => {
                fields.environment = reader.text_or_skip(depth)?;
                fields.environment_given = true;
            }
            "facts" => fields.facts = Some(reader.value(builder, depth)?),
            "trusted" => fields.trusted = Some(reader.value(builder, depth)?),
            _ => reader.skip(depth)?,
        }
        first = false;
    }
    reader.at_end().then_some(fields)
}

fn fields_with_serde(text: &[u8], builder: &mut Builder) -> Result<Fields, JsonError> {
    json::decode_with(text, crate::yaml::MAX_DEPTH, |input, depth| FieldsSeed { builder, depth }.deserialize(input))
}

struct FieldsSeed<'b> {
    builder: &'b mut Builder,
    depth: &'b mut Depth,
}

impl<'de> DeserializeSeed<'de> for FieldsSeed<'_> {
    type Value = Fields;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Fields, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FieldsSeed<'_> {
    type Value = Fields;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an inventory entry (an object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
        self.depth.enter()?;
        let mut fields = Fields::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "facts" => {
                    fields.facts =
                        Some(map.next_value_seed(ValueSeed { builder: &mut *self.builder, depth: &mut *self.depth })?)
                }
                "trusted" => {
                    fields.trusted =
                        Some(map.next_value_seed(ValueSeed { builder: &mut *self.builder, depth: &mut *self.depth })?)
                }
                "certname" => fields.certname = map.next_value_seed(TextOrSkip { depth: &mut *self.depth })?,
                "timestamp" => fields.timestamp = map.next_value_seed(TextOrSkip { depth: &mut *self.depth })?,
                "environment" => {
                    fields.environment = map.next_value_seed(TextOrSkip { depth: &mut *self.depth })?;
                    fields.environment_given = true;
                }
                _ => map.next_value_seed(Skip { depth: &mut *self.depth })?,
            }
        }
        self.depth.leave();
        Ok(fields)
    }
}

/// The entry `fields` make: every field there, facts and trusted objects; the
/// facts with `trusted` set to the trusted facts.
fn checked(fields: Fields, builder: &mut Builder) -> Result<Entry, EntryError> {
    let malformed = |what: &str| EntryError::Malformed(what.to_string());
    let certname = fields.certname.ok_or_else(|| malformed("no certname string"))?;
    if certname.is_empty() || certname.contains(['/', '\0']) {
        return Err(EntryError::Skipped(format!("invalid certname {certname:?}")));
    }
    let timestamp = fields.timestamp.ok_or_else(|| malformed("no timestamp string"))?;
    let seconds = crate::time::parse_timestamp(&timestamp)
        .ok_or_else(|| malformed(&format!("timestamp {timestamp:?} is not a date and time")))?;
    if !fields.environment_given {
        return Err(malformed("no environment (a string or null)"));
    }
    let object = |id: Option<ValueId>, name: &str| {
        let id = id.ok_or_else(|| malformed(&format!("no {name}")))?;
        let store = builder.store();
        let pairs: Vec<(u32, ValueId)> = store
            .view(id)
            .as_object()
            .ok_or_else(|| malformed(&format!("{name} is not an object")))?
            .ids()
            .map(|(key, value)| (key, value.id()))
            .collect();
        Ok::<_, EntryError>((id, pairs))
    };
    let (_, facts) = object(fields.facts, "facts")?;
    let (trusted, _) = object(fields.trusted, "trusted")?;
    let key = builder.string("trusted");
    let mark = builder.open();
    for (name, value) in facts.into_iter().filter(|(name, _)| *name != key) {
        builder.push_child(name);
        builder.push_child(value);
    }
    builder.push_child(key);
    builder.push_child(trusted);
    let facts = builder.close_object(mark);
    Ok(Entry { certname, timestamp, seconds, environment: fields.environment, facts })
}

/// The certname of an entry's text, for a warning about it (bounded).
fn certname_in(text: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Named<'a> {
        #[serde(borrow)]
        certname: Option<std::borrow::Cow<'a, str>>,
    }
    match serde_json::from_slice::<Named>(text) {
        Ok(Named { certname: Some(name) }) => format!("certname {:?}", name.chars().take(256).collect::<String>()),
        _ => "no readable certname".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decoded(text: &str) -> (Builder, Result<Vec<Entry>, AnswerError>, Vec<String>) {
        let mut builder = Builder::new();
        let (mut entries, mut warnings) = (Vec::new(), Vec::new());
        let result = inventory(text.as_bytes(), &mut builder, &mut entries, &mut warnings).map(|()| entries);
        (builder, result, warnings)
    }

    const WEB: &str = r#"{"certname": "web1.example.com", "timestamp": "2026-11-26T02:33:00.123Z", "environment": "production",
        "facts": {"role": "web", "os": {"family": "Debian"}, "trusted": {"stale": true}},
        "trusted": {"certname": "web1.example.com", "extensions": {"pp_role": "web"}, "authenticated": "remote"}}"#;

    #[test]
    fn an_entry_is_its_facts_with_trusted() {
        let (builder, entries, warnings) = decoded(&format!("[{WEB}]"));
        let entries = entries.unwrap();
        assert!(warnings.is_empty());
        let entry = &entries[0];
        assert_eq!(entry.certname, "web1.example.com");
        assert_eq!((entry.timestamp.as_str(), entry.seconds), ("2026-11-26T02:33:00.123Z", 1_795_660_380));
        assert_eq!(entry.environment.as_deref(), Some("production"));
        assert_eq!(
            builder.store().view(entry.facts).to_json(),
            json!({"role": "web", "os": {"family": "Debian"},
                   "trusted": {"certname": "web1.example.com", "extensions": {"pp_role": "web"}, "authenticated": "remote"}})
        );
        let (_, none, _) = decoded("[]");
        assert_eq!(none.unwrap(), []);
        let (_, null_env, _) = decoded(&format!("[{}]", WEB.replace(r#""production""#, "null")));
        assert_eq!(null_env.unwrap()[0].environment, None);
    }

    /// The fast path and serde_json (what it declines: here `-0`) give the same entry and store.
    #[test]
    fn the_fast_path_and_serde_agree() {
        let declined = WEB.replace(r#""role": "web""#, r#""role": "web", "zero": -0"#);
        let (fast, _, _) = decoded(&format!("[{WEB}]"));
        let mut serde = Builder::new();
        let fields = fields_with_serde(WEB.as_bytes(), &mut serde).map_err(|_| ()).unwrap();
        let entry = checked(fields, &mut serde).map_err(|_| ()).unwrap();
        assert_eq!(fast.store().view(0).to_json(), serde.store().view(0).to_json());
        assert_eq!(fast.store().values(), serde.store().values());
        assert_eq!(serde.store().view(entry.facts).to_json()["trusted"]["extensions"]["pp_role"], "web");
        assert!(fields_fast(declined.as_bytes(), &mut Builder::new()).is_none());
        let (builder, entries, _) = decoded(&format!("[{declined}]"));
        assert_eq!(builder.store().view(entries.unwrap()[0].facts).to_json()["zero"], json!(-0.0));
    }

    #[test]
    fn every_malformed_shape_is_an_error_saying_what() {
        let cases = [
            ("not json", "not a JSON array of inventory entries"),
            (r#"{"certname": "a"}"#, "not a JSON array of inventory entries"),
            ("[1]", "inventory entry 0: invalid type: integer `1`, expected an inventory entry"),
            (
                r#"[{"timestamp": "2026-11-26T02:33:00Z", "environment": null, "facts": {}, "trusted": {}}]"#,
                "inventory entry 0: no certname string",
            ),
            (
                r#"[{"certname": 7, "timestamp": "2026-11-26T02:33:00Z", "environment": null, "facts": {}, "trusted": {}}]"#,
                "no certname string",
            ),
            (r#"[{"certname": "a", "environment": null, "facts": {}, "trusted": {}}]"#, "no timestamp string"),
            (
                r#"[{"certname": "a", "timestamp": "yesterday", "environment": null, "facts": {}, "trusted": {}}]"#,
                r#"timestamp "yesterday" is not a date and time"#,
            ),
            (
                r#"[{"certname": "a", "timestamp": "2026-11-26T02:33:00Z", "facts": {}, "trusted": {}}]"#,
                "no environment",
            ),
            (
                r#"[{"certname": "a", "timestamp": "2026-11-26T02:33:00Z", "environment": null, "trusted": {}}]"#,
                "no facts",
            ),
            (
                r#"[{"certname": "a", "timestamp": "2026-11-26T02:33:00Z", "environment": null, "facts": [], "trusted": {}}]"#,
                "facts is not an object",
            ),
            (
                r#"[{"certname": "a", "timestamp": "2026-11-26T02:33:00Z", "environment": null, "facts": {}}]"#,
                "no trusted",
            ),
            (
                r#"[{"certname": "a", "timestamp": "2026-11-26T02:33:00Z", "environment": null, "facts": {}, "trusted": "x"}]"#,
                "trusted is not an object",
            ),
            (
                r#"[{"certname": "a", "timestamp": "2026-11-26T02:33:00Z", "environment": null, "facts": {}, "trusted": {}}"#,
                "not a JSON array",
            ),
        ];
        for (text, expected) in cases {
            let (builder, result, _) = decoded(text);
            let error = result.unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
            assert!(builder.store().values() < 64, "nothing much left behind");
        }
    }

    #[test]
    fn a_server_over_a_limit_is_skipped_with_a_warning_at_the_limit_it_is_kept() {
        let entry = |certname: &str, facts: &str| {
            format!(
                r#"{{"certname": "{certname}", "timestamp": "2026-11-26T02:33:00Z", "environment": null, "facts": {facts}, "trusted": {{}}}}"#
            )
        };
        let nested = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        // The entry and its facts are two of the 64 levels.
        let deepest = entry("deep-ok", &format!(r#"{{"a": {}}}"#, nested(62)));
        let too_deep = entry("too-deep", &format!(r#"{{"a": {}}}"#, nested(63)));
        let (_, result, warnings) = decoded(&format!("[{deepest}, {too_deep}, {}]", entry("bad/name", "{}")));
        assert_eq!(result.unwrap().iter().map(|e| e.certname.as_str()).collect::<Vec<_>>(), ["deep-ok"]);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains(r#"entry 1 (certname "too-deep"): nested deeper than 64 levels"#), "{warnings:?}");
        assert!(warnings[1].contains(r#"invalid certname "bad/name""#), "{warnings:?}");

        let filler = |len: usize| format!(r#"{{"pad": "{}"}}"#, "x".repeat(len));
        let at_limit = entry("big", &filler(0));
        let pad = MAX_FILE_SIZE as usize - at_limit.len();
        let (_, result, warnings) = decoded(&format!("[{}]", entry("big", &filler(pad))));
        assert_eq!(result.unwrap().len(), 1, "{warnings:?}");
        let (_, result, warnings) = decoded(&format!("[{}]", entry("big", &filler(pad + 1))));
        assert!(result.unwrap().is_empty());
        assert!(warnings[0].contains(r#"(certname "big"): larger than 16777216 bytes"#), "{warnings:?}");
    }

    #[test]
    fn a_pretty_printed_page_as_puppetdb_writes_it() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/puppetdb/inventory-page.json");
        let (builder, entries, warnings) = decoded(&std::fs::read_to_string(path).unwrap());
        let entries = entries.unwrap();
        assert!(warnings.is_empty());
        let names: Vec<_> = entries.iter().map(|e| (e.certname.as_str(), e.environment.as_deref())).collect();
        assert_eq!(names, [("db1.example.com", Some("production")), ("web1.example.com", Some("staging"))]);
        let db1 = builder.store().view(entries[0].facts).to_json();
        assert_eq!(db1["trusted"]["extensions"]["pp_role"], "db");
        assert_eq!(db1["os"]["release"]["major"], "12");
    }

    #[test]
    fn listings_and_gone_nodes() {
        let listed = listing(br#"[{"certname": "a", "timestamp": "2026-11-26T02:33:00.000Z"}]"#).unwrap();
        assert_eq!(listed, [Listed { certname: "a".into(), timestamp: "2026-11-26T02:33:00.000Z".into() }]);
        assert!(listing(br#"[{"certname": "a"}]"#).unwrap_err().to_string().contains("missing field `timestamp`"));
        let e = listing(br#"[{"certname": "a", "timestamp": "soon"}]"#).unwrap_err();
        assert_eq!(e, AnswerError::UnreadableTimestamp { certname: "a".into(), timestamp: "soon".into() });
        assert!(e.to_string().contains("unreadable timestamp"));
        let gone = gone(br#"[{"certname": "a", "deactivated": "2026-11-26T02:33:00.000Z", "expired": null}]"#).unwrap();
        assert_eq!(gone[0].deactivated.as_deref(), Some("2026-11-26T02:33:00.000Z"));
        assert!(super::gone(b"{}").is_err());
    }
}
