//! `cache.dir`: created private, and refused when someone else could write in it.
//!
//! Whoever can write in the cache dir can plant the snapshot (the fleet's facts the
//! compiles answer from) or the kick state, so puppet-kicker reads and writes only a
//! directory that no one but its owner (and root) can write:
//!
//! * missing, it is created with mode 0750 (its parents with the usual mode);
//! * writable by every user (`o+w`) is refused;
//! * writable by its group (`g+w`) is refused unless this user owns it;
//! * a symlink is followed only when this user or root owns the link.
//!
//! Owned by another user and not writable by others is fine: root's `puppet apply`
//! may use the directory puppetserver's user owns.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The mode a new cache dir gets: the group (puppet's) may read, no one else.
pub const NEW_DIR_MODE: u32 = 0o750;

/// Why the cache dir is unusable. Each names the directory, and a refusal says what
/// to change.
#[derive(Debug)]
#[non_exhaustive]
pub enum CacheDirError {
    /// The missing directory could not be created.
    Create { dir: PathBuf, source: io::Error },
    /// The directory (or the link's target) could not be inspected.
    Inspect { dir: PathBuf, source: io::Error },
    /// A symlink owned by `owner`, neither this user (`me`) nor root.
    ForeignSymlink { dir: PathBuf, owner: u32, me: u32 },
    /// The path is a file, or a link to one.
    NotADirectory { dir: PathBuf },
    /// Writable by every user (`o+w`).
    WritableByOthers { dir: PathBuf, mode: u32 },
    /// Writable by its group (`g+w`) and owned by `owner`, not this user (`me`).
    GroupWritableNotOwned { dir: PathBuf, mode: u32, gid: u32, owner: u32, me: u32 },
}

impl CacheDirError {
    /// The directory the error is about.
    pub fn dir(&self) -> &Path {
        match self {
            CacheDirError::Create { dir, .. }
            | CacheDirError::Inspect { dir, .. }
            | CacheDirError::ForeignSymlink { dir, .. }
            | CacheDirError::NotADirectory { dir }
            | CacheDirError::WritableByOthers { dir, .. }
            | CacheDirError::GroupWritableNotOwned { dir, .. } => dir,
        }
    }
}

impl fmt::Display for CacheDirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.dir().display();
        match self {
            CacheDirError::Create { source, .. } => write!(f, "cannot create the cache directory {shown}: {source}"),
            CacheDirError::Inspect { source, .. } => write!(f, "cannot inspect the cache directory {shown}: {source}"),
            CacheDirError::ForeignSymlink { owner, me, .. } => write!(
                f,
                "refusing the cache directory {shown}: it is a symlink owned by uid {owner}, not by this user \
                 (uid {me}) or root; replace it with a directory, or set cache.dir to the real path"
            ),
            CacheDirError::NotADirectory { .. } => write!(f, "the cache directory {shown} is not a directory"),
            CacheDirError::WritableByOthers { mode, .. } => write!(
                f,
                "refusing the cache directory {shown}: it is writable by every user (mode {mode:04o}), who could \
                 plant the snapshot or the kick state; run `chmod o-w {shown}` or set cache.dir to a private directory"
            ),
            CacheDirError::GroupWritableNotOwned { mode, gid, owner, me, .. } => write!(
                f,
                "refusing the cache directory {shown}: it is writable by its group (gid {gid}, mode {mode:04o}) and \
                 owned by uid {owner}, not by this user (uid {me}); run `chmod g-w {shown}`, or `chown` it to this user"
            ),
        }
    }
}

impl std::error::Error for CacheDirError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CacheDirError::Create { source, .. } | CacheDirError::Inspect { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Creates `dir` if it is missing and checks that no one else can write in it;
/// returns its metadata. The error names the directory and says what to change.
pub fn ensure(dir: &Path) -> Result<fs::Metadata, CacheDirError> {
    let inspect = |source| CacheDirError::Inspect { dir: dir.to_path_buf(), source };
    let link = match fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(NEW_DIR_MODE)
                .create(dir)
                .map_err(|source| CacheDirError::Create { dir: dir.to_path_buf(), source })?;
            fs::symlink_metadata(dir).map_err(inspect)?
        }
        Err(e) => return Err(inspect(e)),
    };
    let me = effective_uid();
    let meta = if link.file_type().is_symlink() {
        if link.uid() != me && link.uid() != 0 {
            return Err(CacheDirError::ForeignSymlink { dir: dir.to_path_buf(), owner: link.uid(), me });
        }
        fs::metadata(dir).map_err(inspect)?
    } else {
        link
    };
    if !meta.is_dir() {
        return Err(CacheDirError::NotADirectory { dir: dir.to_path_buf() });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o002 != 0 {
        return Err(CacheDirError::WritableByOthers { dir: dir.to_path_buf(), mode });
    }
    if mode & 0o020 != 0 && meta.uid() != me {
        return Err(CacheDirError::GroupWritableNotOwned {
            dir: dir.to_path_buf(),
            mode,
            gid: meta.gid(),
            owner: meta.uid(),
            me,
        });
    }
    Ok(meta)
}

pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::tests::tempdir;
    use std::error::Error as _;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_directory_others_can_write_is_refused_with_the_chmod_to_run() {
        let dir = tempdir("cache-dir-o+w");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure(&dir).unwrap_err();
        assert!(matches!(err, CacheDirError::WritableByOthers { mode: 0o777, .. }), "{err:?}");
        assert_eq!(err.dir(), dir);
        let shown = dir.display();
        assert_eq!(
            err.to_string(),
            format!(
                "refusing the cache directory {shown}: it is writable by every user (mode 0777), who could plant \
                 the snapshot or the kick state; run `chmod o-w {shown}` or set cache.dir to a private directory"
            )
        );
        let core = crate::Error::from(err);
        assert_eq!(core.kind(), crate::error::Kind::Io, "Ruby's PuppetKicker::IoError, as before");
        assert!(core.to_string().starts_with("refusing the cache directory"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_path_that_cannot_be_inspected_keeps_the_io_error_as_its_source() {
        let dir = tempdir("cache-dir-under-file");
        let file = dir.join("file");
        fs::write(&file, b"").unwrap();
        let err = ensure(&file.join("cache")).unwrap_err();
        assert!(matches!(&err, CacheDirError::Inspect { source, .. } if source.kind() == io::ErrorKind::NotADirectory));
        assert!(err.to_string().starts_with(&format!("cannot inspect the cache directory {}/cache: ", file.display())));
        assert!(err.source().is_some_and(|s| s.is::<io::Error>()));
        let core = crate::Error::from(err);
        assert_eq!(core.kind(), crate::error::Kind::Io);
        assert!(core.source().is_some_and(|s| s.is::<io::Error>()), "the core error passes the cause on");

        let err = ensure(&file).unwrap_err();
        assert!(matches!(err, CacheDirError::NotADirectory { .. }), "{err:?}");
        assert_eq!(err.to_string(), format!("the cache directory {} is not a directory", file.display()));
        fs::remove_dir_all(&dir).unwrap();
    }
}
