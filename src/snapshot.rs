//! The index on disk, so that each short-lived `puppet apply` (and a restarted
//! master) starts warm. MessagePack through rmp-serde, behind a magic and a format
//! version; written to a temporary file and renamed, so a reader never sees half.

use crate::facts::Node;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::io;
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

/// Why a snapshot was not read (a warning: the index is rebuilt from the source)
/// or not written (the previous one is kept). Each names the file.
#[derive(Debug)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The file exists but could not be read, or is over [`MAX_FILE_SIZE`].
    Read { path: PathBuf, source: io::Error },
    /// The directory is not one puppet-kicker trusts (see [`crate::cache_dir`]).
    UnsafeDir { path: PathBuf, source: crate::cache_dir::CacheDirError },
    /// The file does not start with the snapshot's magic.
    NotAnIndex { path: PathBuf },
    /// The file is of another [`FORMAT_VERSION`].
    FormatVersion { path: PathBuf, found: u32 },
    /// The payload does not decode, or is nested deeper than the decoder allows.
    Corrupt { path: PathBuf, source: rmp_serde::decode::Error },
    /// The index could not be encoded.
    Encode { path: PathBuf, source: rmp_serde::encode::Error },
    /// The encoded index, `size` bytes, is over [`MAX_FILE_SIZE`].
    TooLarge { path: PathBuf, size: u64 },
    /// The file could not be written (a full disk, or the directory refused).
    Write { path: PathBuf, source: io::Error },
}

impl SnapshotError {
    /// The snapshot file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            SnapshotError::Read { path, .. }
            | SnapshotError::UnsafeDir { path, .. }
            | SnapshotError::NotAnIndex { path }
            | SnapshotError::FormatVersion { path, .. }
            | SnapshotError::Corrupt { path, .. }
            | SnapshotError::Encode { path, .. }
            | SnapshotError::TooLarge { path, .. }
            | SnapshotError::Write { path, .. } => path,
        }
    }
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path().display();
        match self {
            SnapshotError::Read { source, .. } => write!(f, "cannot read snapshot {path}: {source}"),
            SnapshotError::UnsafeDir { source, .. } => write!(f, "ignoring snapshot {path}: {source}"),
            SnapshotError::NotAnIndex { .. } => write!(f, "ignoring snapshot {path}: not a puppet-kicker index"),
            SnapshotError::FormatVersion { found, .. } => write!(
                f,
                "ignoring snapshot {path}: format version {found}, this version reads {FORMAT_VERSION}; it will be \
                 rebuilt"
            ),
            SnapshotError::Corrupt { source, .. } => {
                write!(f, "ignoring corrupt snapshot {path}: {source}; it will be rebuilt")
            }
            SnapshotError::Encode { source, .. } => write!(f, "cannot encode snapshot {path}: {source}"),
            SnapshotError::TooLarge { size, .. } => write!(
                f,
                "not writing snapshot {path}: {size} bytes, over the {} limit; the previous snapshot is kept",
                crate::bounded_read::size(MAX_FILE_SIZE)
            ),
            SnapshotError::Write { source, .. } => {
                write!(f, "cannot write snapshot {path}: {source}; the previous snapshot is kept")
            }
        }
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SnapshotError::Read { source, .. } | SnapshotError::Write { source, .. } => Some(source),
            SnapshotError::UnsafeDir { source, .. } => Some(source),
            SnapshotError::Corrupt { source, .. } => Some(source),
            SnapshotError::Encode { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// `Ok(None)` when there is no snapshot; `Err` (a warning to log) when there is one
/// we cannot use: in a directory others can write (see [`crate::cache_dir`]), larger
/// than [`MAX_FILE_SIZE`], nested too deep, corrupt or of another format version.
pub fn read(path: &Path) -> Result<Option<Snapshot>, SnapshotError> {
    let bytes = match crate::bounded_read::read(path, MAX_FILE_SIZE) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(SnapshotError::Read { path: path.to_path_buf(), source }),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::cache_dir::ensure(dir)
            .map_err(|source| SnapshotError::UnsafeDir { path: path.to_path_buf(), source })?;
    }
    decode(&bytes, path).map(Some)
}

/// The snapshot in `bytes`, as [`read`] decodes a file's content; `path` only names it
/// in errors. Bounded like the file: 72 levels of nesting at most.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Snapshot, SnapshotError> {
    let Some(rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return Err(SnapshotError::NotAnIndex { path: path.to_path_buf() });
    };
    let (version, payload) = rest.split_at(4.min(rest.len()));
    let version = <[u8; 4]>::try_from(version).map(u32::from_le_bytes).unwrap_or(0);
    if version != FORMAT_VERSION {
        return Err(SnapshotError::FormatVersion { path: path.to_path_buf(), found: version });
    }
    let mut decoder = rmp_serde::Deserializer::from_read_ref(payload);
    decoder.set_max_depth(MAX_NESTING);
    Snapshot::deserialize(&mut decoder).map_err(|source| SnapshotError::Corrupt { path: path.to_path_buf(), source })
}

/// Writes the snapshot atomically (see [`crate::atomic_file`]); on failure the
/// previous snapshot is left as it was.
pub fn write(path: &Path, snapshot: &SnapshotRef<'_>) -> Result<(), SnapshotError> {
    let payload = rmp_serde::to_vec_named(snapshot)
        .map_err(|source| SnapshotError::Encode { path: path.to_path_buf(), source })?;
    let size = (MAGIC.len() + 4 + payload.len()) as u64;
    if size > MAX_FILE_SIZE {
        return Err(SnapshotError::TooLarge { path: path.to_path_buf(), size });
    }
    crate::atomic_file::write(path, &[MAGIC, &FORMAT_VERSION.to_le_bytes(), &payload])
        .map_err(|source| SnapshotError::Write { path: path.to_path_buf(), source })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;
    use std::error::Error as _;
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
        assert!(matches!(read(&path), Ok(None)));
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
        let err = read(&path).unwrap_err();
        assert!(matches!(err, SnapshotError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().starts_with(&format!("ignoring corrupt snapshot {}: ", path.display())), "{err}");
        assert!(err.source().is_some_and(|s| s.is::<rmp_serde::decode::Error>()));

        let mut old = good.clone();
        old[8..12].copy_from_slice(&0u32.to_le_bytes());
        fs::write(&path, &old).unwrap();
        let err = read(&path).unwrap_err();
        assert!(matches!(err, SnapshotError::FormatVersion { found: 0, .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("ignoring snapshot {}: format version 0, this version reads 1; it will be rebuilt", path.display())
        );

        fs::write(&path, b"garbage").unwrap();
        let err = read(&path).unwrap_err();
        assert!(matches!(err, SnapshotError::NotAnIndex { .. }), "{err:?}");
        assert!(err.to_string().contains("not a puppet-kicker index"));
    }

    #[test]
    fn a_failed_write_keeps_the_io_error_as_its_source() {
        let dir = tempdir("snapshot-write-fails");
        // The snapshot's path is a directory: the rename onto it fails.
        let path = path_in(&dir);
        fs::create_dir(&path).unwrap();
        fs::write(path.join("keep"), b"").unwrap();
        let empty = BTreeMap::new();
        let err = write(&path, &SnapshotRef { built_at: 1, nodes: &[], seen_environments: &empty }).unwrap_err();
        assert!(matches!(err, SnapshotError::Write { .. }), "{err:?}");
        assert!(err.to_string().ends_with("; the previous snapshot is kept"), "{err}");
        assert!(err.source().is_some_and(|s| s.is::<io::Error>()));
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
