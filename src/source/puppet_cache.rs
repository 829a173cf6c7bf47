//! The master's own fact cache: one file per node, written by the master whenever an
//! agent sends its facts. puppetserver 7 writes JSON (`$server_datadir/facts`),
//! older masters wrote Ruby-tagged YAML (`$vardir/yaml/facts`); we read both.

use super::{Changes, IncrementalBase, Memo, Observation, Source, SourceRead};
use crate::error::{Error, Result};
use crate::index::Index;
use crate::puppet_settings::PuppetSettings;
use crate::store::json::{self, Depth, JsonError, Skip, ValueSeed};
use crate::store::{self, Builder, Remap, Store, Tables, ValueId, View};
use crate::time::parse_timestamp;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
#[cfg(any(test, feature = "synthetic"))]
use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

/// A node's cached facts are tens of kilobytes; a larger file is skipped with a warning.
pub const MAX_FILE_SIZE: u64 = 16 << 20;
/// A refresh reading the fact cache has no network deadline; past this it is hung.
const WORST_CASE: Duration = Duration::from_secs(300);

/// `puppet_cache.*`: the directories of cached facts.
#[derive(Clone, Debug, PartialEq)]
pub struct PuppetCacheSettings {
    /// `puppet_cache.dirs`: JSON (`$server_datadir/facts`) and YAML (`$vardir/yaml/facts`).
    pub dirs: Vec<PathBuf>,
}

impl PuppetCacheSettings {
    /// Puppet's own fact cache directories.
    pub fn unset(puppet: &PuppetSettings) -> PuppetCacheSettings {
        let server_datadir = puppet.server_datadir.clone().unwrap_or_else(|| puppet.vardir.join("server_data"));
        PuppetCacheSettings { dirs: vec![server_datadir.join("facts"), puppet.vardir.join("yaml").join("facts")] }
    }
}

/// `source: puppet_cache`: the directories, and what the last refresh read of them.
pub struct PuppetCacheSource {
    dirs: Vec<PathBuf>,
    /// Kept by [`Source::carry`]: the next refresh reads only the files changed since.
    carried: Mutex<Option<IncrementalBase>>,
}

impl PuppetCacheSource {
    /// Never fails: a directory that cannot be read fails the refresh that reads it.
    pub fn open(settings: &PuppetCacheSettings) -> Result<PuppetCacheSource> {
        Ok(PuppetCacheSource { dirs: settings.dirs.clone(), carried: Mutex::new(None) })
    }
}

impl Source for PuppetCacheSource {
    fn describe(&self) -> String {
        let dirs: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        format!("the puppet_cache source ({})", dirs.join(", "))
    }

    fn worst_case(&self) -> Duration {
        WORST_CASE
    }

    /// [`load_since_counting`] from the files the refresh that built `previous` read.
    fn refresh(&self, previous: Option<&Index>, _started: i64, progress: &AtomicUsize) -> Result<SourceRead> {
        // Taken: a refresh that fails leaves none, and the next one reads every file.
        let carried = crate::unpoisoned::lock(&self.carried).take();
        let base = carried
            .zip(previous)
            .filter(|(c, index)| c.generation == index.generation())
            .and_then(|(mut c, index)| Some(Previous { index, memo: c.take_memo::<ReadMemo>()?, tables: c.tables }));
        let (mut read, memo) = load_since_counting(&self.dirs, base, progress)?;
        read.memo = Some(Memo::new(memo));
        Ok(read)
    }

    fn carry(&self, base: IncrementalBase) {
        *crate::unpoisoned::lock(&self.carried) = Some(base);
    }
}

/// Reads every `*.json` and `*.yaml` file in `dirs`. Fails only when no directory
/// can be read at all; a file that does not parse is skipped with a warning.
///
/// The files are read by up to [`MAX_READERS`] threads (never more than the cores),
/// each decoding its share into a store of its own; the stores are then merged in
/// file order, so the index is the same whatever the number of threads.
pub fn load(dirs: &[PathBuf]) -> Result<SourceRead> {
    load_with_readers(dirs, default_readers())
}

/// [`load`] on `readers` threads at most.
pub fn load_with_readers(dirs: &[PathBuf], readers: usize) -> Result<SourceRead> {
    Ok(load_since_with_readers(dirs, None, readers, &AtomicUsize::new(0))?.0)
}

/// [`load`], reading only the files that changed since `previous`: a file whose
/// size, modification time, inode and device are those of the previous read gives
/// what it gave then, its facts already in the previous store (whose arrays the new
/// store shares, appending past them). Also gives what the next refresh needs of
/// this one.
///
/// Every refresh reads everything again once the store holds
/// [`GARBAGE_FACTOR`] times the values of the last full read (the values of
/// changed and removed servers stay in the store until then). A file modified
/// less than [`RACY_SECONDS`] before the read is read again next time: a rewrite
/// within the same tick of the file system's clock could keep its stamp.
pub fn load_since(dirs: &[PathBuf], previous: Option<Previous<'_>>) -> Result<(SourceRead, ReadMemo)> {
    load_since_counting(dirs, previous, &AtomicUsize::new(0))
}

/// [`load_since`], counting in `progress` the files given or read so far.
pub fn load_since_counting(
    dirs: &[PathBuf],
    previous: Option<Previous<'_>>,
    progress: &AtomicUsize,
) -> Result<(SourceRead, ReadMemo)> {
    load_since_with_readers(dirs, previous, default_readers(), progress)
}

fn default_readers() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from).clamp(1, MAX_READERS)
}

/// Threads reading fact files at most: a refresh shares the master with compiles.
pub const MAX_READERS: usize = 2;
/// Files below which a second thread is not worth starting.
const MIN_SHARE: usize = 64;
/// Files per share of a read on several threads: small enough that merging the
/// shares read keeps pace with reading the next, and that the last merge is short.
const SHARE_FILES: usize = 512;
/// A file modified this recently (seconds) before it was listed is read again at
/// the next refresh whatever its stamp (see [`load_since`]).
pub const RACY_SECONDS: i64 = 2;
/// How many times the values of its last full read a store may grow to before a
/// refresh reads every file again, dropping what no server uses any more.
pub const GARBAGE_FACTOR: usize = 2;

/// The index a refresh built, the tables of the builder that made its store, and
/// what that refresh read: the base of an incremental [`load_since`].
pub struct Previous<'a> {
    pub index: &'a Index,
    pub tables: Tables,
    pub memo: ReadMemo,
}

/// What one read of the fact cache found, per file, for the next one.
#[derive(Debug, Default)]
pub struct ReadMemo {
    /// Per directory, by file name: no path joined for a file not read again.
    dirs: Vec<(PathBuf, Files)>,
    /// Values in the store after the last full read.
    values_after_full: usize,
}

/// A directory's files by name, as bytes: `Path` hashes component by component.
type Files = hashbrown::HashMap<OsString, Seen>;

#[derive(Debug)]
struct Seen {
    /// `None`: not trusted (see [`RACY_SECONDS`]), the file is read again.
    stamp: Option<Stamp>,
    outcome: Outcome,
}

/// What tells a rewritten fact file from the one read before. Puppet writes each
/// by renaming a new file over it, so the inode alone changes on every write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: (i64, i64),
    inode: u64,
    device: u64,
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(path).ok()?;
        Some(Stamp { len: m.len(), modified: (m.mtime(), m.mtime_nsec()), inode: m.ino(), device: m.dev() })
    }

    /// The stamp of `name` in the open directory `dir`, as [`Stamp::of`] gives it
    /// (symbolic links followed): `fstatat` spares resolving the whole path again.
    // The field types of `libc::stat` differ between platforms.
    #[allow(clippy::unnecessary_cast)]
    fn at(dir: &fs::File, name: &OsStr) -> Option<Stamp> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::io::AsRawFd;
        let bytes = name.as_bytes();
        if bytes.contains(&0) {
            return None;
        }
        // A file name fits (NAME_MAX is 255): no allocation per file.
        let mut buffer = [0u8; 256];
        let owned;
        let name: &std::ffi::CStr = if bytes.len() < buffer.len() {
            buffer[..bytes.len()].copy_from_slice(bytes);
            std::ffi::CStr::from_bytes_until_nul(&buffer).ok()?
        } else {
            owned = std::ffi::CString::new(bytes).ok()?;
            &owned
        };
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `dir` is an open descriptor, `name` a NUL-terminated string, and
        // `st` room for one `stat`, written in full when the call succeeds.
        let st = unsafe {
            if libc::fstatat(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), 0) != 0 {
                return None;
            }
            st.assume_init()
        };
        Some(Stamp {
            len: st.st_size as u64,
            modified: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            inode: st.st_ino as u64,
            device: st.st_dev as u64,
        })
    }
}

/// A directory's fact files in name order (one component each), and their stamps.
struct Listing {
    dir: PathBuf,
    names: Vec<(OsString, Format)>,
    stamps: Vec<Option<Stamp>>,
}

/// One file to read: where, in which format, and its stamp before the read.
struct Listed {
    path: PathBuf,
    format: Format,
    stamp: Option<Stamp>,
}

/// What a file gave: its server, or the warning that says why it was skipped.
type Outcome = std::result::Result<Observation, String>;
/// A reader's store and what each of its files gave.
type Part = (Builder, Vec<(usize, Outcome)>);

fn load_since_with_readers(
    dirs: &[PathBuf],
    previous: Option<Previous<'_>>,
    readers: usize,
    progress: &AtomicUsize,
) -> Result<(SourceRead, ReadMemo)> {
    let listed_at = crate::time::now();
    let listings = list(dirs)?;
    let mut previous = previous.filter(|p| {
        let store = p.index.store();
        p.tables.fit(store) && store.values() <= GARBAGE_FACTOR.saturating_mul(p.memo.values_after_full.max(1))
    });
    let mut old_dirs = previous.as_mut().map(|p| std::mem::take(&mut p.memo.dirs)).unwrap_or_default();
    // Certnames whose servers may differ from the previous index's: read again, gone.
    let mut changed = Vec::new();
    let gone = |files: Files| files.into_values().filter_map(|seen| seen.outcome.ok()).map(|o| o.certname);
    let listed = listings.iter().map(|l| l.names.len()).sum();
    // Each file's outcome in listing order; the files to read, and where each goes.
    let (mut outcomes, mut to_read, mut read_into) = (Vec::with_capacity(listed), Vec::new(), Vec::new());
    for listing in &listings {
        let at = old_dirs.iter().position(|(dir, _)| *dir == listing.dir);
        // Moved out of the old memo, not cloned: it is this refresh's now.
        let mut old = at.map(|at| old_dirs.swap_remove(at).1).unwrap_or_default();
        for ((name, format), stamp) in listing.names.iter().zip(&listing.stamps) {
            match old.remove(name.as_os_str()) {
                Some(seen) if seen.stamp.is_some() && seen.stamp == *stamp => outcomes.push(Some(seen.outcome)),
                stale => {
                    changed.extend(stale.and_then(|seen| seen.outcome.ok()).map(|o| o.certname));
                    read_into.push(outcomes.len());
                    to_read.push(Listed { path: listing.dir.join(name), format: *format, stamp: *stamp });
                    outcomes.push(None);
                }
            }
        }
        changed.extend(gone(old));
    }
    changed.extend(old_dirs.into_iter().flat_map(|(_, files)| gone(files)));
    let reused = listed - to_read.len();
    progress.store(reused, Ordering::Relaxed);
    let (base, values_after_full, since) = match previous {
        Some(p) => {
            let base = Builder::resume(p.index.store(), p.tables);
            (Some(base), Some(p.memo.values_after_full), Some(p.index.generation()))
        }
        None => (None, None, None),
    };
    let every: Vec<usize> = (0..to_read.len()).collect();
    let (builder, read) = read_files(&to_read, &every, readers, base, progress)?;
    for (i, outcome) in read {
        changed.extend(outcome.as_ref().ok().map(|o| o.certname.clone()));
        outcomes[read_into[i]] = Some(outcome);
    }
    let changes = since.map(|since| Changes { since, certnames: changed });
    let mut read = SourceRead { builder, reused, changes, ..SourceRead::default() };
    let mut memo = ReadMemo {
        dirs: Vec::with_capacity(listings.len()),
        values_after_full: values_after_full.unwrap_or(read.builder.store().values()),
    };
    let mut outcomes = outcomes.into_iter();
    for listing in listings {
        let mut files = Files::with_capacity(listing.names.len());
        for ((name, _), stamp) in listing.names.into_iter().zip(listing.stamps) {
            let Some(outcome) = outcomes.next().flatten() else { continue };
            match &outcome {
                Ok(observation) => read.observations.push(observation.clone()),
                Err(warning) => read.warnings.push(warning.clone()),
            }
            // A file modified in the last seconds may be written again within the
            // same tick of the file system's clock, in place, at the same size: its
            // stamp would not show it. It is read again next time, its server known.
            let stamp = stamp.filter(|s| s.modified.0 < listed_at - RACY_SECONDS);
            files.insert(name, Seen { stamp, outcome });
        }
        memo.dirs.push((listing.dir, files));
    }
    Ok((read, memo))
}

/// The fact files of `dirs`, each directory's in name order, stamped (on up to
/// [`MAX_READERS`] threads: a refresh that reads few files mostly stats).
fn list(dirs: &[PathBuf]) -> Result<Vec<Listing>> {
    let mut failures = Vec::new();
    let mut listings = Vec::new();
    for dir in dirs {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                failures.push(format!("{} ({})", dir.display(), describe(&e)));
                continue;
            }
        };
        // One component each: byte order is the order of their paths.
        let mut names: Vec<(OsString, Format)> = entries
            .filter_map(|e| {
                let name = e.ok()?.file_name();
                let format = Format::of(Path::new(&name))?;
                Some((name, format))
            })
            .collect();
        names.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let stamps = stamp_all(dir, &names);
        listings.push(Listing { dir: dir.clone(), names, stamps });
    }
    if listings.is_empty() {
        return Err(Error::Io(format!("no fact cache directory could be read: {}", failures.join(", "))));
    }
    Ok(listings)
}

/// The stamp of each of `names` in `dir`.
fn stamp_all(dir: &Path, names: &[(OsString, Format)]) -> Vec<Option<Stamp>> {
    let Ok(open) = fs::File::open(dir) else {
        return names.iter().map(|(name, _)| Stamp::of(&dir.join(name))).collect();
    };
    let stamp_share = |share: &[(OsString, Format)]| -> Vec<Option<Stamp>> {
        share.iter().map(|(name, _)| Stamp::at(&open, name)).collect()
    };
    let share = names.len().div_ceil(default_readers()).max(MIN_SHARE * 4);
    if share >= names.len() {
        return stamp_share(names);
    }
    std::thread::scope(|scope| {
        let running: Vec<_> = names.chunks(share).map(|share| scope.spawn(move || stamp_share(share))).collect();
        // A thread that panicked leaves its files unstamped: read again, not trusted.
        let stamped = running.into_iter().zip(names.chunks(share));
        stamped.flat_map(|(t, share)| t.join().unwrap_or_else(|_| vec![None; share.len()])).collect()
    })
}

/// Reads `files[i]` for each `i` of `which` into `base` (or a new store), on up to
/// `readers` threads: shares of [`SHARE_FILES`] files, each later one read into a
/// store of its own and merged in order while the next are read (see
/// [`store::pool`]), so the store is the one a single reader would build.
fn read_files(
    files: &[Listed],
    which: &[usize],
    readers: usize,
    base: Option<Builder>,
    progress: &AtomicUsize,
) -> Result<Part> {
    let share = if readers > 1 && which.len() >= 2 * MIN_SHARE { SHARE_FILES } else { which.len().max(1) };
    let shares: Vec<&[usize]> = which.chunks(share).collect();
    let read_share = |share: usize, builder: &mut Builder| -> Vec<(usize, Outcome)> {
        let read = |&i: &usize| {
            let file = &files[i];
            let mtime = file.stamp.map(|s| s.modified.0);
            progress.fetch_add(1, Ordering::Relaxed);
            (i, read_file(&file.path, file.format, mtime, builder).map_err(|e| format!("skipped {e}")))
        };
        shares[share].iter().map(read).collect()
    };
    let remap = |outcomes: &mut Vec<(usize, Outcome)>, remap: &Remap| {
        for (_, outcome) in outcomes.iter_mut() {
            if let Ok(o) = outcome {
                (o.facts, o.extra) = (remap.values[o.facts as usize], remap.values[o.extra as usize]);
            }
        }
    };
    let target = base.unwrap_or_default();
    let (builder, outcomes) = store::pool::read_in_order(target, shares.len(), readers, read_share, remap)
        .map_err(|_| Error::Io("internal error: reading the fact cache panicked".into()))?;
    Ok((builder, outcomes.into_iter().flatten().collect()))
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

/// Reads and decodes one file; `mtime` (seconds), when its stamp has it, dates facts
/// without a timestamp.
fn read_file(
    path: &Path,
    format: Format,
    mtime: Option<i64>,
    builder: &mut Builder,
) -> std::result::Result<Observation, FactFileError> {
    let bytes = crate::bounded_read::read(path, MAX_FILE_SIZE)
        .map_err(|source| FactFileError::Read { path: path.to_path_buf(), source })?;
    let mtime = mtime.or_else(|| {
        let modified = fs::metadata(path).and_then(|m| m.modified()).ok()?;
        Some(modified.duration_since(UNIX_EPOCH).ok()?.as_secs() as i64)
    });
    parse_fact_file(&bytes, format, path, mtime.unwrap_or(0), builder)
}

/// One fact file's content, as [`load`] reads it, its facts added to `builder`:
/// `path` names it (and gives the certname when the document has none), `mtime`
/// dates facts without a timestamp.
///
/// JSON and YAML are decoded straight into the store. Facts from every format and source stop
/// at the same depth as YAML's ([`crate::yaml::MAX_DEPTH`]).
pub fn parse_fact_file(
    bytes: &[u8],
    format: Format,
    path: &Path,
    mtime: i64,
    builder: &mut Builder,
) -> std::result::Result<Observation, FactFileError> {
    let document = match format {
        Format::Json => json_document(bytes, path, builder, decode_document)?,
        Format::Yaml => {
            let text = std::str::from_utf8(bytes)
                .map_err(|source| FactFileError::NotUtf8 { path: path.to_path_buf(), source })?;
            let mark = builder.open();
            let decoded = crate::yaml::decode(text, builder);
            if decoded.is_err() {
                builder.discard_open(mark);
            }
            let root = decoded.map_err(|source| FactFileError::Yaml { path: path.to_path_buf(), source })?;
            Document::of_store(root, builder.store())
        }
    };
    document.observation(builder.store(), path, mtime)
}

/// `{name, values, timestamp, expiration}`, as `Puppet::Node::Facts` serializes,
/// with `values` in the store and only what the index keeps of the rest.
enum Document {
    NotAMapping,
    Mapping { name: Option<String>, timestamp: Option<String>, values: Option<ValueId> },
}

impl Document {
    /// A document parsed as a tree first (the paths kept as references).
    #[cfg(any(test, feature = "synthetic"))]
    fn of_tree(tree: Value, builder: &mut Builder) -> Document {
        let Value::Object(top) = tree else { return Document::NotAMapping };
        let text = |key: &str| top.get(key).and_then(Value::as_str).map(str::to_string);
        Document::Mapping {
            name: text("name"),
            timestamp: text("timestamp"),
            values: top.get("values").map(|v| builder.value(v)),
        }
    }

    /// A document already in the store (YAML): its other keys stay there, unreferenced.
    fn of_store(root: ValueId, store: &Store) -> Document {
        let Some(top) = store.view(root).as_object() else { return Document::NotAMapping };
        let text = |key: &str| top.get(key).and_then(View::as_str).map(str::to_string);
        Document::Mapping { name: text("name"), timestamp: text("timestamp"), values: top.get("values").map(View::id) }
    }

    fn observation(self, store: &Store, path: &Path, mtime: i64) -> std::result::Result<Observation, FactFileError> {
        let Document::Mapping { name, timestamp, values } = self else {
            return Err(FactFileError::NotAMapping { path: path.to_path_buf() });
        };
        let Some((values, facts)) = values.and_then(|id| Some((id, store.view(id).as_object()?))) else {
            return Err(FactFileError::NoValues { path: path.to_path_buf() });
        };
        let certname = match name {
            Some(name) if !name.is_empty() => name,
            _ => path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string(),
        };
        if certname.is_empty() || certname.contains(['/', '\0']) {
            return Err(FactFileError::BadCertname { path: path.to_path_buf(), certname });
        }
        // Puppet 3 kept the time inside the values as `_timestamp`.
        let timestamp = timestamp
            .as_deref()
            .and_then(parse_timestamp)
            .or_else(|| facts.get("_timestamp").and_then(View::as_str).and_then(parse_timestamp))
            .unwrap_or(mtime);
        Ok(Observation::new(certname, values, timestamp))
    }
}

/// The document the fast way when it takes it, else with serde_json (the same
/// store either way: see [`json::fast`]).
fn decode_document(bytes: &[u8], builder: &mut Builder) -> std::result::Result<Document, JsonError> {
    let mark = builder.open();
    if let Some(document) = decode_document_fast(bytes, builder) {
        return Ok(document);
    }
    builder.discard_open(mark);
    decode_document_with_serde(bytes, builder)
}

/// [`DocumentSeed::read_mapping`] on the fast path; `None` where it declines.
fn decode_document_fast(bytes: &[u8], builder: &mut Builder) -> Option<Document> {
    let mut reader = json::fast::Reader::new(bytes);
    reader.open_object()?;
    // The document itself is the first of the containers the limit counts.
    let depth = crate::yaml::MAX_DEPTH - 1;
    let (mut name, mut timestamp, mut values) = (None, None, None);
    let mut first = true;
    while let Some(key) = reader.next_key(first)? {
        reader.colon()?;
        match std::str::from_utf8(&key).ok()? {
            "values" => values = Some(reader.value(builder, depth)?),
            "name" => name = reader.text_or_skip(depth)?,
            "timestamp" => timestamp = reader.text_or_skip(depth)?,
            _ => reader.skip(depth)?,
        }
        first = false;
    }
    reader.at_end().then_some(Document::Mapping { name, timestamp, values })
}

/// Whether the JSON fast path takes `bytes` (rather than leave them to serde_json).
#[cfg(any(test, feature = "synthetic"))]
pub fn json_fast_path_takes(bytes: &[u8]) -> bool {
    decode_document_fast(bytes, &mut Builder::new()).is_some()
}

/// The document read by serde_json alone: what the fast path is held to.
#[cfg(any(test, feature = "synthetic"))]
pub fn parse_json_fact_file_with_serde(
    bytes: &[u8],
    path: &Path,
    mtime: i64,
    builder: &mut Builder,
) -> std::result::Result<Observation, FactFileError> {
    json_document(bytes, path, builder, decode_document_with_serde)?.observation(builder.store(), path, mtime)
}

fn decode_document_with_serde(bytes: &[u8], builder: &mut Builder) -> std::result::Result<Document, JsonError> {
    json::decode_with(bytes, crate::yaml::MAX_DEPTH, |input, depth| DocumentSeed { builder, depth }.deserialize(input))
}

/// The document `decode` reads from `bytes`; refused, nothing of it is left open
/// in the builder, and the error names `path`.
fn json_document(
    bytes: &[u8],
    path: &Path,
    builder: &mut Builder,
    decode: fn(&[u8], &mut Builder) -> std::result::Result<Document, JsonError>,
) -> std::result::Result<Document, FactFileError> {
    let mark = builder.open();
    decode(bytes, builder).map_err(|e| {
        builder.discard_open(mark);
        match e {
            JsonError::Syntax(source) => FactFileError::Json { path: path.to_path_buf(), source },
            JsonError::TooDeep { limit } => FactFileError::JsonTooDeep { path: path.to_path_buf(), limit },
        }
    })
}

struct DocumentSeed<'b> {
    builder: &'b mut Builder,
    depth: &'b mut Depth,
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_> {
    type Value = Document;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Document, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_> {
    type Value = Document;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Puppet::Node::Facts document")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Document, A::Error> {
        self.read_mapping(map)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Document, A::Error> {
        Skip { depth: self.depth }.visit_seq(seq).map(|()| Document::NotAMapping)
    }

    fn visit_unit<E>(self) -> std::result::Result<Document, E> {
        Ok(Document::NotAMapping)
    }

    fn visit_bool<E>(self, _: bool) -> std::result::Result<Document, E> {
        Ok(Document::NotAMapping)
    }

    fn visit_i64<E>(self, _: i64) -> std::result::Result<Document, E> {
        Ok(Document::NotAMapping)
    }

    fn visit_u64<E>(self, _: u64) -> std::result::Result<Document, E> {
        Ok(Document::NotAMapping)
    }

    fn visit_f64<E>(self, _: f64) -> std::result::Result<Document, E> {
        Ok(Document::NotAMapping)
    }

    fn visit_str<E>(self, _: &str) -> std::result::Result<Document, E> {
        Ok(Document::NotAMapping)
    }
}

impl DocumentSeed<'_> {
    fn read_mapping<'de, A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Document, A::Error> {
        self.depth.enter()?;
        let (mut name, mut timestamp, mut values) = (None, None, None);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "values" => {
                    values =
                        Some(map.next_value_seed(ValueSeed { builder: &mut *self.builder, depth: &mut *self.depth })?)
                }
                "name" => name = map.next_value_seed(TextOrSkip { depth: &mut *self.depth })?,
                "timestamp" => timestamp = map.next_value_seed(TextOrSkip { depth: &mut *self.depth })?,
                _ => map.next_value_seed(Skip { depth: &mut *self.depth })?,
            }
        }
        self.depth.leave();
        Ok(Document::Mapping { name, timestamp, values })
    }
}

/// A string kept, anything else read past (within the depth bound).
pub(crate) struct TextOrSkip<'b> {
    pub(crate) depth: &'b mut Depth,
}

impl<'de> DeserializeSeed<'de> for TextOrSkip<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Option<String>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TextOrSkip<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E>(self, s: &str) -> std::result::Result<Option<String>, E> {
        Ok(Some(s.to_string()))
    }

    fn visit_unit<E>(self) -> std::result::Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> std::result::Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> std::result::Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> std::result::Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> std::result::Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Option<String>, A::Error> {
        Skip { depth: self.depth }.visit_seq(seq).map(|()| None)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Option<String>, A::Error> {
        Skip { depth: self.depth }.visit_map(map).map(|()| None)
    }
}

/// The path before the store (kept to show the new one reads the same): a
/// serde_json tree first, then the store.
#[cfg(any(test, feature = "synthetic"))]
pub fn parse_fact_file_via_tree(
    bytes: &[u8],
    path: &Path,
    mtime: i64,
    builder: &mut Builder,
) -> std::result::Result<Observation, FactFileError> {
    let tree: Value =
        serde_json::from_slice(bytes).map_err(|source| FactFileError::Json { path: path.to_path_buf(), source })?;
    if deeper_than(&tree, crate::yaml::MAX_DEPTH) {
        return Err(FactFileError::JsonTooDeep { path: path.to_path_buf(), limit: crate::yaml::MAX_DEPTH });
    }
    Document::of_tree(tree, builder).observation(builder.store(), path, mtime)
}

/// The YAML path before the store (kept to show the new one reads the same):
/// [`crate::yaml::parse`]'s serde_json tree first, then the store.
#[cfg(any(test, feature = "synthetic"))]
pub fn parse_yaml_fact_file_via_tree(
    bytes: &[u8],
    path: &Path,
    mtime: i64,
    builder: &mut Builder,
) -> std::result::Result<Observation, FactFileError> {
    let text =
        std::str::from_utf8(bytes).map_err(|source| FactFileError::NotUtf8 { path: path.to_path_buf(), source })?;
    let tree = crate::yaml::parse(text).map_err(|source| FactFileError::Yaml { path: path.to_path_buf(), source })?;
    Document::of_tree(tree, builder).observation(builder.store(), path, mtime)
}

/// Whether `value` has more than `max` collections nested in one another; without
/// recursion.
#[cfg(any(test, feature = "synthetic"))]
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
        let err = parse_fact_file(b"values: [1\n", Format::Yaml, path, 0, &mut Builder::new()).unwrap_err();
        assert!(matches!(&err, FactFileError::Yaml { source: crate::yaml::YamlError::Syntax(_), .. }), "{err:?}");
        assert_eq!(err.path(), path);
        assert!(err.to_string().starts_with("fact cache file /facts/web1.example.com.yaml: invalid YAML: "), "{err}");
        assert!(err.source().is_some_and(|s| s.is::<crate::yaml::YamlError>()));

        let err = parse_fact_file(b"{\"name\": \"web1\"}", Format::Json, path, 0, &mut Builder::new()).unwrap_err();
        assert!(matches!(err, FactFileError::NoValues { .. }), "{err:?}");
        let err = parse_fact_file(b"{\"name\": \"a/b\", \"values\": {}}", Format::Json, path, 0, &mut Builder::new())
            .unwrap_err();
        assert_eq!(err.to_string(), "fact cache file /facts/web1.example.com.yaml: invalid certname \"a/b\"");
    }

    #[test]
    fn an_unreadable_fact_file_keeps_the_io_error_as_its_source() {
        let path = Path::new("/nonexistent/puppet-kicker/web1.example.com.json");
        let err = read_file(path, Format::Json, None, &mut Builder::new()).unwrap_err();
        assert!(matches!(&err, FactFileError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound));
        assert_eq!(err.to_string(), format!("fact cache file {}: not found", path.display()));
        let source = err.source().and_then(|s| s.downcast_ref::<io::Error>()).expect("the io error");
        assert_eq!(source.kind(), io::ErrorKind::NotFound);
    }
}
