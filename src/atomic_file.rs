//! Writing a file so that a reader sees the old content or the new, never half, and
//! a crash keeps one of them: a private temporary file beside it, synced, renamed
//! over it, then the directory synced so that the rename itself is on disk.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The mode of what we write: the files hold the whole fleet's facts.
pub const FILE_MODE: u32 = 0o600;

/// Writes `parts`, in order, as the new content of `path`, with mode 0600.
///
/// The directory must pass [`crate::cache_dir::ensure`] (it is created when
/// missing). The temporary file has an unpredictable name and is created with
/// `O_EXCL | O_NOFOLLOW`, so nothing planted in the directory can redirect the
/// write. Run as root in a directory another user owns, the file is given to that
/// user, who can then still read and replace it.
pub fn write(path: &Path, parts: &[&[u8]]) -> io::Result<()> {
    write_with(path, |file| parts.iter().try_for_each(|part| file.write_all(part)))
}

/// [`write`] without the syncs, for a file rebuilt from others at each change (a
/// status view): a reader still sees the old content or the new, never half, but a
/// machine that loses power may lose the last writes.
pub fn write_unsynced(path: &Path, parts: &[&[u8]]) -> io::Result<()> {
    replace(path, |file| parts.iter().try_for_each(|part| file.write_all(part)), false)
}

/// [`write`], the content written by `content` to the temporary file as it comes
/// (a large file need not be in memory whole); when it fails, the old file stays.
pub fn write_with(path: &Path, content: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    replace(path, content, true)
}

/// The temporary file written by `content`, synced when `sync`, renamed over
/// `path`; then, when `sync`, the directory synced.
fn replace(path: &Path, content: impl FnOnce(&mut dyn Write) -> io::Result<()>, sync: bool) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir_meta = crate::cache_dir::ensure(dir).map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let (tmp, mut file) = create_temporary(dir, name)?;
    let result = (|| {
        content(&mut file)?;
        if crate::cache_dir::effective_uid() == 0 && dir_meta.uid() != 0 {
            std::os::unix::fs::fchown(&file, Some(dir_meta.uid()), Some(dir_meta.gid()))?;
        }
        if sync {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    if !sync {
        return Ok(());
    }
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| {
        io::Error::new(e.kind(), format!("written, but syncing its directory {} failed: {e}", dir.display()))
    })
}

/// A new file `.{name}.{random}.tmp` in `dir`, never an existing file or symlink.
fn create_temporary(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
    let mut last = None;
    for _ in 0..16 {
        let mut random = [0u8; 8];
        getrandom::fill(&mut random)
            .map_err(|e| io::Error::other(format!("no OS randomness for a temporary name: {e}")))?;
        let tmp = dir.join(format!(".{name}.{:016x}.tmp", u64::from_le_bytes(random)));
        match create_new(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
}

fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_file_is_never_opened_through_an_existing_name() {
        let dir = crate::snapshot::tests::tempdir("atomic-excl");
        let victim = dir.join("victim");
        fs::write(&victim, "precious").unwrap();
        let planted = dir.join(".x.tmp");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        assert_eq!(create_new(&planted).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        fs::write(dir.join("plain"), "").unwrap();
        assert_eq!(create_new(&dir.join("plain")).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temporary_names_differ_and_are_cleaned_up() {
        let dir = crate::snapshot::tests::tempdir("atomic-names");
        let (a, _) = create_temporary(&dir, "f").unwrap();
        let (b, _) = create_temporary(&dir, "f").unwrap();
        assert_ne!(a, b);
        fs::remove_file(a).unwrap();
        fs::remove_file(b).unwrap();
        write(&dir.join("f"), &[b"one", b"two"]).unwrap();
        assert_eq!(fs::read(dir.join("f")).unwrap(), b"onetwo");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
