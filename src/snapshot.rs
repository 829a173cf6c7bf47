//! The index on disk, so that each short-lived `puppet apply` (and a restarted
//! master) starts warm. MessagePack through rmp-serde, behind a magic and a format
//! version; written to a temporary file and renamed, so a reader never sees half.

use crate::facts::Node;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"PKINDEX\0";
/// Bump when `Snapshot` changes shape; older files are then ignored and rebuilt.
pub const FORMAT_VERSION: u32 = 1;
pub const FILE_NAME: &str = "index.msgpack";
/// A larger snapshot is neither written nor read: ~100,000 servers of Facter 4 facts.
pub const MAX_FILE_SIZE: u64 = 1 << 30;
/// Facts are at most [`crate::yaml::MAX_DEPTH`] deep from any source; the snapshot
/// adds four levels (snapshot, node list, node, facts) and a few to spare. rmp-serde
/// recurses per level, so this bounds its stack.
const MAX_NESTING: usize = crate::yaml::MAX_DEPTH + 8;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Unix seconds when the data was read from its source.
    pub built_at: i64,
    pub nodes: Vec<Node>,
    /// Where the master last saw each certname compile or report.
    pub seen_environments: BTreeMap<String, String>,
}

/// The same shape as [`Snapshot`], borrowed, so writing does not copy the index.
#[derive(Serialize)]
pub struct SnapshotRef<'a> {
    pub built_at: i64,
    pub nodes: &'a [Node],
    pub seen_environments: &'a BTreeMap<String, String>,
}

pub fn path_in(cache_dir: &Path) -> PathBuf {
    cache_dir.join(FILE_NAME)
}

/// `Ok(None)` when there is no snapshot; `Err` (a warning to log) when there is one
/// we cannot use: in a directory others can write (see [`crate::cache_dir`]), larger
/// than [`MAX_FILE_SIZE`], nested too deep, corrupt or of another format version.
pub fn read(path: &Path) -> Result<Option<Snapshot>, String> {
    let bytes = match crate::bounded_read::read(path, MAX_FILE_SIZE) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read snapshot {}: {e}", path.display())),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::cache_dir::ensure(dir).map_err(|e| format!("ignoring snapshot {}: {e}", path.display()))?;
    }
    decode(&bytes, path).map(Some)
}

/// The snapshot in `bytes`, as [`read`] decodes a file's content; `path` only names it
/// in errors. Bounded like the file: 72 levels of nesting at most.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Snapshot, String> {
    let Some(rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return Err(format!("ignoring snapshot {}: not a puppet-kicker index", path.display()));
    };
    let (version, payload) = rest.split_at(4.min(rest.len()));
    let version = <[u8; 4]>::try_from(version).map(u32::from_le_bytes).unwrap_or(0);
    if version != FORMAT_VERSION {
        return Err(format!(
            "ignoring snapshot {}: format version {version}, this version reads {FORMAT_VERSION}; it will be rebuilt",
            path.display()
        ));
    }
    let mut decoder = rmp_serde::Deserializer::from_read_ref(payload);
    decoder.set_max_depth(MAX_NESTING);
    Snapshot::deserialize(&mut decoder)
        .map_err(|e| format!("ignoring corrupt snapshot {}: {e}; it will be rebuilt", path.display()))
}

/// Writes the snapshot atomically (see [`crate::atomic_file`]); on failure the
/// previous snapshot is left as it was.
pub fn write(path: &Path, snapshot: &SnapshotRef<'_>) -> Result<(), String> {
    let payload =
        rmp_serde::to_vec_named(snapshot).map_err(|e| format!("cannot encode snapshot {}: {e}", path.display()))?;
    let size = (MAGIC.len() + 4 + payload.len()) as u64;
    if size > MAX_FILE_SIZE {
        return Err(format!(
            "not writing snapshot {}: {size} bytes, over the {} limit; the previous snapshot is kept",
            path.display(),
            crate::bounded_read::size(MAX_FILE_SIZE)
        ));
    }
    crate::atomic_file::write(path, &[MAGIC, &FORMAT_VERSION.to_le_bytes(), &payload])
        .map_err(|e| format!("cannot write snapshot {}: {e}; the previous snapshot is kept", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;
    use std::fs;

    fn sample() -> Snapshot {
        let facts = json!({"role": "node", "os": {"release": {"full": "12.5"}}, "load": 0.5, "n": -3, "ok": true, "l": [1, "a", null]});
        Snapshot {
            built_at: 1234,
            nodes: vec![Node::new("web1".into(), facts.as_object().cloned().unwrap(), 99, None)],
            seen_environments: BTreeMap::from([("web1".to_string(), "staging".to_string())]),
        }
    }

    #[test]
    fn round_trips_structured_facts() {
        let dir = tempdir("roundtrip");
        let path = path_in(&dir);
        assert_eq!(read(&path), Ok(None));
        write_owned(&path, &sample());
        assert_eq!(read(&path).unwrap(), Some(sample()));
        let leftovers: Vec<_> =
            fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).filter(|e| e.file_name() != FILE_NAME).collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    }

    #[test]
    fn corrupt_truncated_and_old_snapshots_are_refused_with_a_reason() {
        let dir = tempdir("corrupt");
        let path = path_in(&dir);
        write_owned(&path, &sample());
        let good = fs::read(&path).unwrap();

        fs::write(&path, &good[..good.len() / 2]).unwrap();
        assert!(read(&path).unwrap_err().contains("corrupt"));

        let mut old = good.clone();
        old[8..12].copy_from_slice(&0u32.to_le_bytes());
        fs::write(&path, &old).unwrap();
        assert!(read(&path).unwrap_err().contains("format version 0"));

        fs::write(&path, b"garbage").unwrap();
        assert!(read(&path).unwrap_err().contains("not a puppet-kicker index"));
    }

    fn write_owned(path: &Path, s: &Snapshot) {
        write(path, &SnapshotRef { built_at: s.built_at, nodes: &s.nodes, seen_environments: &s.seen_environments })
            .unwrap();
    }

    pub(crate) fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pk-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }
}
