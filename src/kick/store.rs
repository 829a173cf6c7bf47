//! Where the kick state is kept between transactions, and the lock that makes one
//! change a single step across every process sharing it: [`StateStore`], the one
//! extension point, with [`FileStore`] (`kicks.msgpack` under `kicks.lock`, the
//! default, shared by the processes of one host) and the PostgreSQL store of
//! `kick.state: postgresql` (src/kick/postgresql, shared by several compilers).
//!
//! A store moves the whole [`PlannerState`]: the planner decides coalescing, rate
//! limits, budgets, loops and claims on all of it at once, so that N processes
//! sharing one store behave as one.

use super::planner::PlannerState;
use super::Millis;
use serde::Deserialize;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// `kicks.msgpack` holds one entry per kicked server plus bounded history: far below
/// this even for 100,000 servers. A larger file (or row) is not ours to trust.
pub const MAX_STATE_SIZE: u64 = 64 << 20;
/// The state is a few levels deep; rmp's default (1024) would let a hostile file
/// recurse far enough to overflow a small thread stack.
const MAX_STATE_NESTING: usize = 16;

/// One store of the kick state. Calls come one at a time (the service holds the
/// store's mutex from [`Self::begin`] to [`Self::commit`] or [`Self::release`]).
pub trait StateStore: Send {
    /// Where the state is, for messages: a path, or a PostgreSQL address. Never a secret.
    fn describe(&self) -> String;

    /// Takes the lock shared with the other processes and returns what they saved
    /// since this process last read or wrote the state (`known` is the generation it
    /// holds); `None` when nothing changed.
    fn begin(&mut self, known: u64) -> Begun;

    /// Saves `state` (its generation already the next one) and releases the lock.
    fn commit(&mut self, state: &PlannerState) -> Result<(), String>;

    /// Releases the lock without saving.
    fn release(&mut self);

    /// The state as saved, read without the lock and without keeping anything (for
    /// `puppet kicker graph` and the like).
    fn load(&mut self) -> Result<PlannerState, StateError>;

    /// What the service should know besides the state: whether the state is shared
    /// right now, and the clock to use. The file store is always itself.
    fn health(&self) -> Health {
        Health::default()
    }
}

/// What [`StateStore::begin`] found.
#[derive(Debug, Default)]
pub struct Begun {
    /// What the other processes saved, when it changed.
    pub theirs: Option<PlannerState>,
    /// `theirs` is to be merged with this process's state rather than replace it:
    /// this process holds changes the shared state has not seen (made during an
    /// outage of the shared store).
    pub merge: bool,
    /// Save the state at the end of this transaction even if nothing changes: what
    /// was kept during an outage goes into the shared state.
    pub save: bool,
    /// Lines for the log (a lock that cannot be taken, a state that does not read).
    pub warnings: Vec<String>,
}

/// How a store stands, for the dispatcher, `status` and `metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// The shared store is unreachable: changes are kept locally and merged when it
    /// is back. Due kicks wait for it (a claim must be seen by every compiler).
    pub outage: Option<Outage>,
    /// Milliseconds to add to this host's clock to get the shared store's (the
    /// database's `now()`), so that every compiler's leases and windows agree.
    pub clock_offset_ms: Millis,
    /// A store shared by several hosts (PostgreSQL), rather than by one host's processes.
    pub shared: bool,
}

/// An outage of the shared store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outage {
    /// Why: the last connection's or statement's error (no secret in it).
    pub reason: String,
    /// Since when (this host's clock).
    pub since: Millis,
    /// When the shared store is tried next (this host's clock).
    pub retry_at: Millis,
}

/// The kick state could not be read; each names where it is.
#[derive(Debug)]
#[non_exhaustive]
pub enum StateError {
    /// The state file exists but could not be read, or is over [`MAX_STATE_SIZE`].
    Read { path: PathBuf, source: io::Error },
    /// The saved state does not decode (corrupt, another format, nested too deep).
    Unreadable { path: PathBuf, source: rmp_serde::decode::Error },
    /// The shared store could not be used (its description and why).
    Shared { store: String, reason: String },
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::Read { path, source } => write!(f, "cannot read kick state {}: {source}", path.display()),
            StateError::Unreadable { path, source } => write!(f, "unreadable kick state {}: {source}", path.display()),
            StateError::Shared { store, reason } => write!(f, "shared kick state {store}: {reason}"),
        }
    }
}

impl std::error::Error for StateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StateError::Read { source, .. } => Some(source),
            StateError::Unreadable { source, .. } => Some(source),
            StateError::Shared { .. } => None,
        }
    }
}

/// The kick state in `bytes`, as saved; `path` names it in errors. Bounded: 16
/// levels of nesting at most.
pub fn decode_state(path: &Path, bytes: &[u8]) -> Result<PlannerState, StateError> {
    let mut decoder = rmp_serde::Deserializer::from_read_ref(bytes);
    decoder.set_max_depth(MAX_STATE_NESTING);
    PlannerState::deserialize(&mut decoder)
        .map_err(|source| StateError::Unreadable { path: path.to_path_buf(), source })
}

/// The kick state saved at `path`, or empty when there is none yet.
pub fn read_state(path: &Path) -> Result<PlannerState, StateError> {
    match crate::bounded_read::read(path, MAX_STATE_SIZE) {
        Ok(bytes) => decode_state(path, &bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(PlannerState::default()),
        Err(source) => Err(StateError::Read { path: path.to_path_buf(), source }),
    }
}

/// `kicks.msgpack` in the cache dir, changed under an exclusive lock on `kicks.lock`:
/// the processes of one host (puppetserver, `puppet apply`, the operator's commands)
/// share it.
pub struct FileStore {
    path: PathBuf,
    /// What this process last wrote or read of the file, to notice when another
    /// process (a concurrent `puppet apply`) changed it.
    seen: Option<FileStamp>,
    /// Held from `begin` to `commit` or `release`.
    lock: Option<std::fs::File>,
}

impl FileStore {
    pub fn new(path: PathBuf) -> FileStore {
        FileStore { seen: FileStamp::of(&path), path, lock: None }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl StateStore for FileStore {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    /// Another process's write is noticed by the file's stamp (inode, length, mtime:
    /// each write renames a new file into place) or by the generation at its start,
    /// which every save bumps (a reused inode, an equal length and a coarse mtime can
    /// make a stamp look the same). Only then is the whole file read: a state this
    /// process just wrote is not read back.
    fn begin(&mut self, known: u64) -> Begun {
        let mut begun = Begun::default();
        let lock_file = self.path.with_extension("lock");
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_file);
        match file {
            Ok(file) if file.lock().is_ok() => self.lock = Some(file),
            _ => begun.warnings.push(format!(
                "cannot lock {}; kick state is not shared safely between processes",
                lock_file.display()
            )),
        }
        let on_disk = FileStamp::of(&self.path);
        let unchanged = on_disk.is_some() && on_disk == self.seen && leading_generation(&self.path) == Some(known);
        if on_disk.is_some() && !unchanged {
            match crate::bounded_read::read(&self.path, MAX_STATE_SIZE) {
                Ok(bytes) => {
                    match decode_state(&self.path, &bytes) {
                        Ok(theirs) => begun.theirs = Some(theirs),
                        Err(e) => begun.warnings.push(e.to_string()),
                    }
                    self.seen = on_disk;
                }
                Err(e) => begun.warnings.push(format!("cannot read kick state {}: {e}", self.path.display())),
            }
        }
        begun
    }

    fn commit(&mut self, state: &PlannerState) -> Result<(), String> {
        let saved = match rmp_serde::to_vec_named(state) {
            Ok(bytes) => crate::atomic_file::write(&self.path, &[&bytes]).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if saved.is_ok() {
            self.seen = FileStamp::of(&self.path);
        }
        self.lock = None;
        saved
    }

    fn release(&mut self) {
        self.lock = None;
    }

    fn load(&mut self) -> Result<PlannerState, StateError> {
        read_state(&self.path)
    }
}

/// Which file is at a path (device and inode), its size and modification time:
/// enough to notice another writer, since each write renames a new file into place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: SystemTime,
}

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileStamp { dev: meta.dev(), ino: meta.ino(), len: meta.len(), modified: meta.modified().ok()? })
    }
}

/// The generation a state file starts with, read from its first bytes: the state
/// is saved as a map whose first entry is `generation` (see [`PlannerState`]).
/// `None` when the file does not start so (a file of an earlier version).
fn leading_generation(path: &Path) -> Option<u64> {
    use std::io::Read;
    let mut head = [0u8; 32];
    let mut file = std::fs::File::open(path).ok()?;
    let mut len = 0;
    while len < head.len() {
        match file.read(&mut head[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let mut rest = &head[..len];
    rmp::decode::read_map_len(&mut rest).ok().filter(|n| *n > 0)?;
    let mut key = [0u8; 16];
    let key = rmp::decode::read_str(&mut rest, &mut key).ok()?;
    (key == "generation").then_some(())?;
    rmp::decode::read_int(&mut rest).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::tests::tempdir;

    #[test]
    fn a_state_file_at_the_size_limit_is_read_and_one_byte_over_is_refused() {
        let dir = tempdir("kick-state-size");
        let path = dir.join("kicks.msgpack");
        let state = rmp_serde::to_vec_named(&PlannerState::default()).unwrap();
        // Trailing bytes after the state are ignored by the decoder, so padding the
        // file to the limit keeps it readable: only the size decides.
        let mut bytes = state.clone();
        bytes.resize(MAX_STATE_SIZE as usize, 0);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read_state(&path).unwrap(), PlannerState::default());
        bytes.push(0);
        std::fs::write(&path, &bytes).unwrap();
        let error = read_state(&path).unwrap_err();
        assert!(matches!(&error, StateError::Read { path: p, .. } if *p == path), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains(&path.display().to_string()) && message.contains("over the 64 MiB limit"),
            "{message}"
        );
        assert!(std::error::Error::source(&error).is_some_and(|s| s.is::<io::Error>()));
    }

    #[test]
    fn a_deeply_nested_state_file_is_refused_not_a_stack_overflow() {
        let dir = tempdir("kick-state-depth");
        let path = dir.join("kicks.msgpack");
        // 100,000 nested one-element arrays, then nil: decoding recursed once per level.
        let mut bytes = vec![0x91u8; 100_000];
        bytes.push(0xc0);
        std::fs::write(&path, &bytes).unwrap();
        let error = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || read_state(&path))
            .unwrap()
            .join()
            .expect("decoding overflowed the stack")
            .unwrap_err();
        assert!(matches!(error, StateError::Unreadable { .. }), "{error:?}");
        assert!(error.to_string().starts_with("unreadable kick state "), "{error}");
    }
}
