//! The last refresh as every process sharing the cache dir sees it: `refresh.json`,
//! written atomically by whichever process refreshed, after every refresh, good or
//! failed. `puppet kicker status` runs in a process of its own and reads it there.

use crate::index::Index;
use crate::source::ChangeSignal;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// In the cache dir.
pub const RECORD_FILE: &str = "refresh.json";
/// A record is a few hundred bytes; a larger file is not ours.
pub const MAX_RECORD_BYTES: u64 = 64 << 10;
/// A source's error text is kept up to this many bytes (it names the URL or dir first).
const MAX_ERROR_BYTES: usize = 4096;

/// One refresh: what it read, how it ended and what it changed. Times are Unix
/// milliseconds, durations milliseconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefreshRecord {
    /// The source's name ([`crate::source::SourceKind::name`]).
    pub source: String,
    /// The process that refreshed.
    pub pid: u32,
    /// The generation of the index it left (that process's numbering).
    pub generation: u64,
    /// Servers of the index it left.
    pub servers: u64,
    pub started_ms: i64,
    pub finished_ms: i64,
    pub duration_ms: u64,
    pub outcome: Outcome,
    /// The source's error text when it failed.
    pub error: Option<String>,
    pub added: u64,
    pub changed: u64,
    pub dropped: u64,
    /// Refreshes failed in a row (0 after a good one).
    pub failures: u32,
    /// While failing: no refresh is started by a compile before this.
    pub retry_at_ms: Option<i64>,
    /// Heap bytes of the index it left.
    pub index_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Read the source and swapped in a new index.
    Ok,
    /// Took the snapshot another process had just refreshed while this one waited.
    Adopted,
    /// The source failed; the last index still serves.
    Failed,
}

/// Servers added, changed and dropped by a refresh, certname by certname.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub added: u64,
    pub changed: u64,
    pub dropped: u64,
}

impl Counts {
    /// Compares the certnames of `before` and `after`.
    pub fn between(before: Option<&Index>, after: &Index, signal: ChangeSignal) -> Counts {
        let Some(before) = before else {
            return Counts { added: after.len() as u64, ..Counts::default() };
        };
        let old: HashMap<&str, i64> = before.servers().map(|s| (s.certname(), s.timestamp())).collect();
        let mut counts = Counts::default();
        let mut common = 0u64;
        let mut moved = 0u64;
        for server in after.servers() {
            match old.get(server.certname()) {
                None => counts.added += 1,
                Some(timestamp) => {
                    common += 1;
                    moved += u64::from(*timestamp != server.timestamp());
                }
            }
        }
        counts.dropped = (old.len() as u64).saturating_sub(common);
        counts.changed = match signal {
            ChangeSignal::Certnames(mut read_again) => {
                read_again.sort_unstable();
                read_again.dedup();
                let in_both = |c: &&String| old.contains_key(c.as_str()) && after.by_certname(c).is_some();
                read_again.iter().filter(in_both).count() as u64
            }
            ChangeSignal::Reused(reused) => common.saturating_sub(reused as u64),
            ChangeSignal::Timestamps => moved,
        };
        counts
    }
}

/// `error`, cut to [`MAX_ERROR_BYTES`] on a character boundary.
pub fn bounded_error(error: &str) -> String {
    if error.len() <= MAX_ERROR_BYTES {
        return error.to_string();
    }
    let mut end = MAX_ERROR_BYTES;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &error[..end])
}

/// What the cache dir says of the last refresh.
#[derive(Debug, PartialEq, Eq)]
pub enum Recorded {
    /// No refresh wrote one yet.
    Missing,
    /// Present but not a record (why, with the path).
    Unreadable(String),
    Found(RefreshRecord),
}

pub fn write(cache_dir: &Path, record: &RefreshRecord) -> std::io::Result<()> {
    let text = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    crate::atomic_file::write(&cache_dir.join(RECORD_FILE), &[&text, b"\n"])
}

pub fn read(cache_dir: &Path) -> Recorded {
    let path = cache_dir.join(RECORD_FILE);
    let bytes = match crate::bounded_read::read(&path, MAX_RECORD_BYTES) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Recorded::Missing,
        Err(e) => return Recorded::Unreadable(format!("{}: {e}", path.display())),
    };
    match serde_json::from_slice(&bytes) {
        Ok(record) => Recorded::Found(record),
        Err(e) => Recorded::Unreadable(format!("{}: not a refresh record: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Node;
    use serde_json::json;

    fn index(servers: &[(&str, i64)]) -> Index {
        let nodes = servers
            .iter()
            .map(|(certname, timestamp)| {
                let facts = json!({"fqdn": certname}).as_object().unwrap().clone();
                Node::new(certname.to_string(), facts, *timestamp, None)
            })
            .collect();
        Index::build(nodes, "role", 0)
    }

    #[test]
    fn counts_compare_certnames_and_each_sources_change_signal() {
        let before = index(&[("a", 1), ("b", 1), ("c", 1)]);
        let after = index(&[("b", 2), ("c", 1), ("d", 1)]);
        let counts = |signal| Counts::between(Some(&before), &after, signal);
        assert_eq!(counts(ChangeSignal::Timestamps), Counts { added: 1, changed: 1, dropped: 1 });
        let read_again = vec!["c".to_string(), "a".into(), "d".into(), "c".into()];
        assert_eq!(counts(ChangeSignal::Certnames(read_again)), Counts { added: 1, changed: 1, dropped: 1 });
        assert_eq!(counts(ChangeSignal::Reused(0)), Counts { added: 1, changed: 2, dropped: 1 });
        assert_eq!(Counts::between(None, &after, ChangeSignal::Timestamps), Counts { added: 3, ..Counts::default() });
    }

    #[test]
    fn a_record_is_read_back_and_a_missing_or_corrupt_one_is_said_so() {
        let dir = crate::snapshot::tests::tempdir("refresh-record");
        assert_eq!(read(&dir), Recorded::Missing);
        let record = RefreshRecord {
            source: "puppet_cache".into(),
            pid: 7,
            generation: 3,
            servers: 6,
            started_ms: 1_000,
            finished_ms: 1_250,
            duration_ms: 250,
            outcome: Outcome::Failed,
            error: Some(bounded_error(&"é".repeat(MAX_ERROR_BYTES))),
            added: 0,
            changed: 0,
            dropped: 0,
            failures: 2,
            retry_at_ms: Some(61_250),
            index_bytes: 4096,
        };
        assert!(record.error.as_ref().unwrap().len() <= MAX_ERROR_BYTES + 3);
        write(&dir, &record).unwrap();
        assert_eq!(read(&dir), Recorded::Found(record));
        std::fs::write(dir.join(RECORD_FILE), b"{\"source\":").unwrap();
        assert!(matches!(read(&dir), Recorded::Unreadable(why) if why.contains("not a refresh record")));
        std::fs::write(dir.join(RECORD_FILE), vec![b' '; MAX_RECORD_BYTES as usize + 1]).unwrap();
        assert!(matches!(read(&dir), Recorded::Unreadable(why) if why.contains(RECORD_FILE)));
    }
}
