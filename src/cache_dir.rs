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

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

/// The mode a new cache dir gets: the group (puppet's) may read, no one else.
pub const NEW_DIR_MODE: u32 = 0o750;

/// Creates `dir` if it is missing and checks that no one else can write in it;
/// returns its metadata. The error names the directory and says what to change.
pub fn ensure(dir: &Path) -> Result<fs::Metadata, String> {
    let shown = dir.display();
    let link = match fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(NEW_DIR_MODE)
                .create(dir)
                .map_err(|e| format!("cannot create the cache directory {shown}: {e}"))?;
            fs::symlink_metadata(dir).map_err(|e| format!("cannot inspect the cache directory {shown}: {e}"))?
        }
        Err(e) => return Err(format!("cannot inspect the cache directory {shown}: {e}")),
    };
    let me = effective_uid();
    let meta = if link.file_type().is_symlink() {
        if link.uid() != me && link.uid() != 0 {
            return Err(format!(
                "refusing the cache directory {shown}: it is a symlink owned by uid {}, not by this user (uid {me}) \
                 or root; replace it with a directory, or set cache.dir to the real path",
                link.uid()
            ));
        }
        fs::metadata(dir).map_err(|e| format!("cannot inspect the cache directory {shown}: {e}"))?
    } else {
        link
    };
    if !meta.is_dir() {
        return Err(format!("the cache directory {shown} is not a directory"));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o002 != 0 {
        return Err(format!(
            "refusing the cache directory {shown}: it is writable by every user (mode {mode:04o}), who could plant \
             the snapshot or the kick state; run `chmod o-w {shown}` or set cache.dir to a private directory"
        ));
    }
    if mode & 0o020 != 0 && meta.uid() != me {
        return Err(format!(
            "refusing the cache directory {shown}: it is writable by its group (gid {}, mode {mode:04o}) and owned \
             by uid {}, not by this user (uid {me}); run `chmod g-w {shown}`, or `chown` it to this user",
            meta.gid(),
            meta.uid()
        ));
    }
    Ok(meta)
}

pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}
