//! The index on disk, so that each short-lived `puppet apply` (and a restarted
//! master) starts warm. MessagePack through rmp-serde, behind a magic and a format
//! version; written to a temporary file and renamed, so a reader never sees half.
//!
//! Format 2 is the index's own layout ([`crate::store`]): the string table, the
//! value arrays and the row columns, each one MessagePack `bin` starting at a
//! multiple of 8 bytes in the file. Reading maps the file and uses those arrays in
//! place ([`crate::store::Column`]) after one checking pass: nothing is copied or
//! allocated per fact. (A file whose blobs are not aligned, written before they
//! were, is read by copying them.)

use crate::bounded_read::FileBytes;
use crate::index::{Index, InvalidRows, RowBlobs, Rows};
use crate::store::blob::Spool;
use crate::store::{Store, StoreBlobs};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"PKINDEX\0";
/// Bump when the layout changes; older files are then ignored and rebuilt.
pub const FORMAT_VERSION: u32 = 2;
pub const FILE_NAME: &str = "index.msgpack";
/// A larger snapshot is neither written nor read: ~100,000 servers of Facter 4 facts.
pub const MAX_FILE_SIZE: u64 = 1 << 30;
/// The layout is flat (blobs in a few maps); this only bounds a hostile file.
const MAX_NESTING: usize = 8;

/// A snapshot as read: the index, checked, and what the master remembers.
#[derive(Debug)]
pub struct Snapshot {
    /// Unix seconds when the data was read from its source.
    pub built_at: i64,
    pub index: Index,
    /// Where the master last saw each certname compile or report.
    pub seen_environments: BTreeMap<String, String>,
}

/// What is written, borrowed from the index: `encode` copies each array once, into
/// the file's bytes.
pub struct SnapshotRef<'a> {
    pub built_at: i64,
    store: &'a Store,
    rows: &'a Rows,
    pub seen_environments: &'a BTreeMap<String, String>,
}

impl<'a> SnapshotRef<'a> {
    pub fn of(index: &'a Index, seen_environments: &'a BTreeMap<String, String>) -> SnapshotRef<'a> {
        SnapshotRef { built_at: index.built_at(), store: index.store(), rows: index.rows(), seen_environments }
    }
}

/// The payload as read: the arrays borrowed from the file, checked after.
#[derive(Deserialize)]
struct SnapshotFile<'a> {
    built_at: i64,
    #[serde(borrow)]
    store: StoreBlobs<'a>,
    #[serde(borrow)]
    rows: RowBlobs<'a>,
    seen_environments: BTreeMap<String, String>,
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
    /// The payload decodes but is not an index this version wrote: a reference out
    /// of range, keys or servers out of order, nesting too deep.
    Invalid { path: PathBuf, reason: String },
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
            | SnapshotError::Invalid { path, .. }
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
            SnapshotError::Invalid { reason, .. } => {
                write!(f, "ignoring corrupt snapshot {path}: {reason}; it will be rebuilt")
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
pub fn read(path: &Path, role_fact: &str) -> Result<Option<Snapshot>, SnapshotError> {
    // Mapped: the snapshot is only ever replaced by rename (`write`), never rewritten
    // in place, in a directory only this user writes (checked below, before use).
    let bytes = match crate::bounded_read::map(path, MAX_FILE_SIZE) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(SnapshotError::Read { path: path.to_path_buf(), source }),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::cache_dir::ensure(dir)
            .map_err(|source| SnapshotError::UnsafeDir { path: path.to_path_buf(), source })?;
    }
    decode(bytes, path, role_fact).map(Some)
}

/// The snapshot in `bytes`, as [`read`] decodes a file's content, with role maps for
/// `role_fact`; `path` only names it in errors. The index reads its arrays in place
/// from `bytes` where they are aligned. Everything is checked before use (see
/// [`Store::from_blobs`] and [`Index::from_rows`]).
pub fn decode(bytes: impl Into<FileBytes>, path: &Path, role_fact: &str) -> Result<Snapshot, SnapshotError> {
    let bytes = Arc::new(bytes.into());
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
    let file = SnapshotFile::deserialize(&mut decoder)
        .map_err(|source| SnapshotError::Corrupt { path: path.to_path_buf(), source })?;
    let invalid = |reason: String| SnapshotError::Invalid { path: path.to_path_buf(), reason };
    let store = Store::from_blobs(&bytes, file.store).map_err(|e| invalid(e.0))?;
    let rows = Rows::from_blobs(&bytes, file.rows).map_err(|InvalidRows(e)| invalid(e))?;
    let index = Index::from_rows(store, rows, role_fact, file.built_at).map_err(|InvalidRows(e)| invalid(e))?;
    Ok(Snapshot { built_at: file.built_at, index, seen_environments: file.seen_environments })
}

/// Writes the snapshot atomically (see [`crate::atomic_file`]); on failure the
/// previous snapshot is left as it was.
///
/// The bytes go to the file as they are encoded, each array straight from the
/// index ([`Spool`]): writing a snapshot holds no second copy of the index, which
/// during a refresh would be on top of the old index and the new one.
pub fn write(path: &Path, snapshot: &SnapshotRef<'_>) -> Result<(), SnapshotError> {
    let size = encoded_size(snapshot);
    if size > MAX_FILE_SIZE {
        return Err(SnapshotError::TooLarge { path: path.to_path_buf(), size });
    }
    let mut encoding = None;
    let written = crate::atomic_file::write_with(path, |file| {
        let mut spool = Spool::to(file);
        if let Err(e) = encode_into(&mut spool, snapshot) {
            encoding = Some(e);
            return Err(io::Error::other("the index could not be encoded"));
        }
        let written = spool.finish()? as u64;
        if written != size {
            return Err(io::Error::other(format!("{written} bytes written where {size} were foreseen")));
        }
        Ok(())
    });
    match (written, encoding) {
        (_, Some(source)) => Err(SnapshotError::Encode { path: path.to_path_buf(), source }),
        (Err(source), None) => Err(SnapshotError::Write { path: path.to_path_buf(), source }),
        (Ok(()), None) => Ok(()),
    }
}

/// The file's bytes for `snapshot`, as [`write`] writes them (fuzz seeds, tests):
/// the magic, the format version, then a MessagePack map with `built_at`, `store`,
/// `rows` and `seen_environments`.
pub fn encode(snapshot: &SnapshotRef<'_>) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    let mut spool = Spool::in_memory(encoded_size(snapshot) as usize);
    encode_into(&mut spool, snapshot)?;
    Ok(spool.into_bytes())
}

/// The size of `snapshot`'s file, without encoding it: what [`encode`] gives, byte
/// for byte (a test holds it), so an oversized index is refused before any write.
pub fn encoded_size(snapshot: &SnapshotRef<'_>) -> u64 {
    let mut counter = Counter(0);
    let mut spool = Spool::to(&mut counter);
    if encode_into(&mut spool, snapshot).is_err() {
        return u64::MAX;
    }
    spool.finish().map_or(u64::MAX, |n| n as u64)
}

/// Counts what it is given and keeps nothing.
struct Counter(usize);

impl io::Write for Counter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn encode_into(out: &mut Spool, snapshot: &SnapshotRef<'_>) -> Result<(), rmp_serde::encode::Error> {
    let key = |out: &mut Spool, key: &str| rmp::encode::write_str(out, key).expect("a spool takes every write");
    out.put(MAGIC);
    out.put(&FORMAT_VERSION.to_le_bytes());
    rmp::encode::write_map_len(out, 4).expect("a spool takes every write");
    key(out, "built_at");
    rmp::encode::write_sint(out, snapshot.built_at).expect("a spool takes every write");
    key(out, "store");
    snapshot.store.write(out);
    key(out, "rows");
    snapshot.rows.write(out);
    key(out, "seen_environments");
    rmp_serde::encode::write_named(out, snapshot.seen_environments)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::facts::Node;
    use serde_json::json;
    use std::error::Error as _;
    use std::fs;

    fn sample() -> (Index, BTreeMap<String, String>) {
        let facts = json!({"role": "node", "os": {"release": {"full": "12.5"}}, "load": 0.5, "n": -3, "ok": true, "l": [1, "a", null], "big": 18446744073709551615u64});
        let mut web2 = Node::new("web2".into(), facts.as_object().cloned().unwrap(), 98, None);
        web2.extra.insert("mcollective::agents".into(), json!(["puppet", "rpcutil"]));
        web2.answered_at = Some(97);
        let nodes = vec![Node::new("web1".into(), facts.as_object().cloned().unwrap(), 99, None), web2];
        let seen = BTreeMap::from([("web1".to_string(), "staging".to_string())]);
        (Index::build(nodes, "role", 1234), seen)
    }

    fn nodes(index: &Index) -> Vec<Node> {
        index.servers().map(|s| s.to_node()).collect()
    }

    #[test]
    fn round_trips_the_index_and_what_the_master_remembers() {
        let dir = tempdir("roundtrip");
        let path = path_in(&dir);
        assert!(matches!(read(&path, "role"), Ok(None)));
        let (index, seen) = sample();
        write(&path, &SnapshotRef::of(&index, &seen)).unwrap();
        let snap = read(&path, "role").unwrap().unwrap();
        assert_eq!(snap.built_at, 1234);
        assert_eq!(snap.seen_environments, seen);
        assert_eq!(nodes(&snap.index), nodes(&index));
        assert_eq!(snap.index.store(), index.store());
        assert_eq!(snap.index.rows(), index.rows());
        assert_eq!(snap.index.store().is_mapped(), cfg!(target_endian = "little"), "read in place");
        let leftovers: Vec<_> =
            fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).filter(|e| e.file_name() != FILE_NAME).collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    }

    #[test]
    fn corrupt_truncated_and_old_snapshots_are_refused_with_a_reason() {
        let dir = tempdir("corrupt");
        let path = path_in(&dir);
        let (index, seen) = sample();
        write(&path, &SnapshotRef::of(&index, &seen)).unwrap();
        let good = fs::read(&path).unwrap();

        fs::write(&path, &good[..good.len() / 2]).unwrap();
        let err = read(&path, "role").unwrap_err();
        assert!(matches!(err, SnapshotError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().starts_with(&format!("ignoring corrupt snapshot {}: ", path.display())), "{err}");
        assert!(err.source().is_some_and(|s| s.is::<rmp_serde::decode::Error>()));

        let mut old = good.clone();
        old[8..12].copy_from_slice(&1u32.to_le_bytes());
        fs::write(&path, &old).unwrap();
        let err = read(&path, "role").unwrap_err();
        assert!(matches!(err, SnapshotError::FormatVersion { found: 1, .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("ignoring snapshot {}: format version 1, this version reads 2; it will be rebuilt", path.display())
        );

        fs::write(&path, b"garbage").unwrap();
        let err = read(&path, "role").unwrap_err();
        assert!(matches!(err, SnapshotError::NotAnIndex { .. }), "{err:?}");
        assert!(err.to_string().contains("not a puppet-kicker index"));
    }

    #[test]
    fn a_snapshot_that_decodes_but_is_not_an_index_is_refused() {
        let dir = tempdir("invalid");
        let path = path_in(&dir);
        let (index, seen) = sample();
        let mut rows = index.rows().clone();
        let reorder = |rows: &mut Rows| {
            rows.certname.make_mut().swap(0, 1);
            rows.facts.make_mut().swap(0, 1);
        };
        type Change<'a> = &'a dyn Fn(&mut Rows);
        let cases: [(Change, &str); 3] = [
            (&|r| r.facts.make_mut()[0] = crate::store::NULL, "is not a hash"),
            (&|r| r.certname.make_mut()[1] = r.certname[0], "stored twice"),
            (&reorder, "out of order"),
        ];
        for (change, reason) in cases {
            rows.clone_from(index.rows());
            change(&mut rows);
            let bad = SnapshotRef { built_at: 1, store: index.store(), rows: &rows, seen_environments: &seen };
            write(&path, &bad).unwrap();
            let err = read(&path, "role").unwrap_err();
            assert!(matches!(err, SnapshotError::Invalid { .. }), "{err:?}");
            assert!(err.to_string().contains(reason), "{err} should say {reason}");
            assert!(err.to_string().ends_with("; it will be rebuilt"), "{err}");
        }
    }

    /// The snapshot fuzz target starts from these; they must be of this format, or
    /// it only ever fuzzes the version check. `PK_WRITE_SEEDS=1` rewrites them.
    #[test]
    fn the_fuzz_seeds_are_snapshots_of_this_format() {
        let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus-seeds/snapshot");
        let (index, seen) = sample();
        let empty = Index::build(Vec::new(), "role", 1);
        for (name, bytes) in [
            ("two-servers", encode(&SnapshotRef::of(&index, &seen)).unwrap()),
            ("empty", encode(&SnapshotRef::of(&empty, &BTreeMap::new())).unwrap()),
        ] {
            let path = seeds.join(name);
            if std::env::var_os("PK_WRITE_SEEDS").is_some() {
                fs::write(&path, &bytes).unwrap();
            }
            assert_eq!(
                fs::read(&path).ok(),
                Some(bytes.clone()),
                "{} is stale: PK_WRITE_SEEDS=1 cargo test",
                path.display()
            );
            assert!(decode(bytes, &path, "role").is_ok());
        }
    }

    /// Format 2 as written before its blobs were aligned: still read, by copying.
    #[test]
    fn a_snapshot_with_unaligned_blobs_is_read_by_copying_them() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus-seeds/snapshot/two-servers-unaligned");
        let bytes = fs::read(&path).unwrap();
        let snap = decode(bytes, &path, "role").unwrap();
        let (index, seen) = sample();
        assert_eq!(nodes(&snap.index), nodes(&index));
        assert_eq!(snap.seen_environments, seen);
        assert!(!snap.index.store().is_mapped());
    }

    #[test]
    fn a_failed_write_keeps_the_io_error_as_its_source() {
        let dir = tempdir("snapshot-write-fails");
        // The snapshot's path is a directory: the rename onto it fails.
        let path = path_in(&dir);
        fs::create_dir(&path).unwrap();
        fs::write(path.join("keep"), b"").unwrap();
        let empty = BTreeMap::new();
        let index = Index::build(Vec::new(), "role", 1);
        let err = write(&path, &SnapshotRef::of(&index, &empty)).unwrap_err();
        assert!(matches!(err, SnapshotError::Write { .. }), "{err:?}");
        assert!(err.to_string().ends_with("; the previous snapshot is kept"), "{err}");
        assert!(err.source().is_some_and(|s| s.is::<io::Error>()));
    }

    /// What `write` streams to the file is what `encode` gives, byte for byte, and
    /// its size is foreseen exactly: here for an index of more than a spool's
    /// buffer, so that arrays go straight from the index to the file.
    #[test]
    fn the_streamed_file_is_the_encoded_snapshot() {
        let nodes: Vec<Node> = (0..3000)
            .map(|i| {
                let motd = format!("node{i:05}: {}", "this server is managed by Puppet; ".repeat(8));
                let facts = json!({"role": "node", "hostname": format!("node{i:05}"), "uptime": i * 7, "motd": motd,
                    "interfaces": {"eth0": {"ip": format!("10.0.{}.{}", i / 250, i % 250), "mtu": 1500}}});
                Node::new(format!("node{i:05}.example.com"), facts.as_object().cloned().unwrap(), 99, None)
            })
            .collect();
        let index = Index::build(nodes, "role", 1234);
        let seen = BTreeMap::from([("node00001.example.com".to_string(), "staging".to_string())]);
        let snapshot = SnapshotRef::of(&index, &seen);
        let encoded = encode(&snapshot).unwrap();
        assert!(encoded.len() > Spool::BUFFER, "{} bytes: not more than one buffer", encoded.len());
        assert_eq!(encoded_size(&snapshot), encoded.len() as u64);
        let dir = tempdir("streamed");
        let path = path_in(&dir);
        write(&path, &snapshot).unwrap();
        assert!(fs::read(&path).unwrap() == encoded, "the file is the encoding");
        let read_back = read(&path, "role").unwrap().unwrap();
        assert_eq!(read_back.index.store(), index.store());
    }

    /// A file that fails partway: the error is the file's, and the old snapshot stays.
    #[test]
    fn a_write_that_fails_partway_keeps_the_previous_snapshot() {
        let (index, seen) = sample();
        let snapshot = SnapshotRef::of(&index, &seen);
        let encoded = encode(&snapshot).unwrap();
        for fail_at in [0, 7, encoded.len() / 2, encoded.len() - 1] {
            let mut file = Failing { taken: Vec::new(), fail_at };
            let mut spool = Spool::to(&mut file);
            encode_into(&mut spool, &snapshot).unwrap();
            let err = spool.finish().unwrap_err();
            assert_eq!(err.to_string(), "no space left (test)");
            assert!(file.taken.len() <= fail_at, "nothing taken past the failure");
            assert_eq!(file.taken[..], encoded[..file.taken.len()], "what it took is the encoding's start");
        }
        let dir = tempdir("write-partway");
        let path = path_in(&dir);
        write(&path, &snapshot).unwrap();
        let empty = BTreeMap::new();
        let other = Index::build(Vec::new(), "role", 5);
        // A directory the writer cannot rename over stands for a full disk here.
        let blocked = dir.join("blocked");
        fs::create_dir_all(path_in(&blocked)).unwrap();
        assert!(write(&path_in(&blocked), &SnapshotRef::of(&other, &empty)).is_err());
        assert_eq!(fs::read(&path).unwrap(), encoded, "the previous snapshot is kept");
    }

    /// Takes bytes until `fail_at`, then fails every write.
    struct Failing {
        taken: Vec<u8>,
        fail_at: usize,
    }

    impl io::Write for Failing {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if self.taken.len() + bytes.len() > self.fail_at {
                return Err(io::Error::other("no space left (test)"));
            }
            self.taken.extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A scratch directory, removed with what it holds when dropped.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    thread_local! {
        /// The scratch directories made on this thread, removed when it ends: libtest
        /// runs each test on a thread of its own, so when the test does, passed or
        /// failed.
        static SCRATCH: std::cell::RefCell<Vec<Scratch>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// A fresh directory `$TMPDIR/pk-test-{name}-{pid}` for the calling test, removed
    /// when the test ends (its thread's [`SCRATCH`]), so that a test leaves nothing
    /// behind without having to outlive a guard: some make it in a helper that
    /// returns only what uses it.
    pub(crate) fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pk-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        SCRATCH.with(|scratch| scratch.borrow_mut().push(Scratch(dir.clone())));
        dir
    }
}
