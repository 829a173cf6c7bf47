//! Reading a whole file that may be hostile: refused when larger than a limit, and
//! never blocking on a FIFO or a device planted where a file was expected.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::ops::Deref;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;

/// The content of the regular file at `path`, or an error when it is larger than
/// `limit` bytes (`ErrorKind::FileTooLarge`, "N bytes, over the 16 MiB limit") or
/// not a regular file (`ErrorKind::InvalidInput`).
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let (file, len) = open(path, limit)?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        // It grew while we read it.
        return Err(too_large(bytes.len() as u64, limit));
    }
    Ok(bytes)
}

/// The regular file at `path`, opened for reading, and its length within `limit`.
fn open(path: &Path, limit: u64) -> io::Result<(File, u64)> {
    // O_NONBLOCK: opening a FIFO waits for a writer otherwise. No effect on files.
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    if meta.len() > limit {
        return Err(too_large(meta.len(), limit));
    }
    Ok((file, meta.len()))
}

/// The regular file at `path` mapped read-only, under the same checks as [`read`].
///
/// Reading a large file into memory costs a page fault and a zeroed page per 4 KiB
/// before the copy (18 ms for a 42 MB snapshot); its pages are already in the page
/// cache. They are mapped on first touch, 16 pages a fault, by whichever thread reads
/// them: `MAP_POPULATE` mapped all 10,000 up front on one thread, 1.3 ms longer to a
/// snapshot's first answer in a new process.
///
/// A mapping sees the file as it is on disk: were the file truncated in place while
/// mapped, reading past the new end would raise SIGBUS. Map only files that are
/// replaced by rename and never rewritten in place, in a directory only this user
/// writes (the snapshot: [`crate::atomic_file`], [`crate::cache_dir`]).
pub fn map(path: &Path, limit: u64) -> io::Result<FileBytes> {
    let (file, len) = open(path, limit)?;
    if len == 0 {
        return Ok(FileBytes::from(Vec::new()));
    }
    let len = usize::try_from(len).map_err(|_| too_large(len, limit))?;
    // SAFETY: a fresh private read-only mapping of an open file descriptor; the
    // kernel picks the address. The mapping outlives the descriptor by design.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned a null address"))?;
    Ok(FileBytes(Bytes::Mapped { ptr, len }))
}

/// A file's content: mapped ([`map`]) or on the heap. Dereferences to its bytes.
pub struct FileBytes(Bytes);

enum Bytes {
    Heap(Vec<u8>),
    Mapped { ptr: NonNull<u8>, len: usize },
}

// SAFETY: the bytes are never written after creation; a mapping is read-only and
// unmapped only on drop.
unsafe impl Send for FileBytes {}
// SAFETY: as for Send: shared access only ever reads.
unsafe impl Sync for FileBytes {}

impl From<Vec<u8>> for FileBytes {
    fn from(bytes: Vec<u8>) -> FileBytes {
        FileBytes(Bytes::Heap(bytes))
    }
}

impl Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Bytes::Heap(bytes) => bytes,
            // SAFETY: `len` readable bytes mapped at `ptr` until drop (see [`map`]).
            Bytes::Mapped { ptr, len } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), *len) },
        }
    }
}

impl Drop for FileBytes {
    fn drop(&mut self) {
        if let Bytes::Mapped { ptr, len } = self.0 {
            // SAFETY: the mapping made in `map`, unmapped once; no borrow outlives self.
            unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
        }
    }
}

impl std::fmt::Debug for FileBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if matches!(self.0, Bytes::Mapped { .. }) { "mapped" } else { "heap" };
        write!(f, "FileBytes({how}, {} bytes)", self.len())
    }
}

/// `16 MiB` for whole mebibytes, else `N bytes`.
pub fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b => format!("{b} bytes"),
    }
}

fn too_large(len: u64, limit: u64) -> io::Error {
    io::Error::new(io::ErrorKind::FileTooLarge, format!("{len} bytes, over the {} limit", size(limit)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn at_the_limit_is_read_one_byte_over_is_refused() {
        let dir = crate::snapshot::tests::tempdir("bounded-read");
        let path = dir.join("f");
        fs::write(&path, vec![b'x'; 1 << 20]).unwrap();
        assert_eq!(read(&path, 1 << 20).unwrap().len(), 1 << 20);
        let err = read(&path, (1 << 20) - 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(err.to_string(), "1048576 bytes, over the 1048575 bytes limit");
        assert_eq!(size(16 << 20), "16 MiB");
        let mapped = map(&path, 1 << 20).unwrap();
        assert_eq!(*mapped, *vec![b'x'; 1 << 20]);
        assert!(format!("{mapped:?}").starts_with("FileBytes(mapped"), "{mapped:?}");
        assert_eq!(map(&path, (1 << 20) - 1).unwrap_err().kind(), io::ErrorKind::FileTooLarge);
        fs::write(&path, b"").unwrap();
        assert!(map(&path, 10).unwrap().is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fifo_or_a_directory_is_refused_without_blocking() {
        let dir = crate::snapshot::tests::tempdir("bounded-fifo");
        let fifo = dir.join("node.json");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        assert_eq!(read(&fifo, 100).unwrap_err().to_string(), "not a regular file");
        assert_eq!(read(&dir, 100).unwrap_err().to_string(), "not a regular file");
        assert_eq!(map(&fifo, 100).unwrap_err().to_string(), "not a regular file");
        assert_eq!(read(&dir.join("nope"), 100).unwrap_err().kind(), io::ErrorKind::NotFound);
        fs::remove_dir_all(&dir).unwrap();
    }
}
