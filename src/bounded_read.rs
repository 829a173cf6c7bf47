//! Reading a whole file that may be hostile: refused when larger than a limit, and
//! never blocking on a FIFO or a device planted where a file was expected.

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The content of the regular file at `path`, or an error when it is larger than
/// `limit` bytes (`ErrorKind::FileTooLarge`, "N bytes, over the 16 MiB limit") or
/// not a regular file (`ErrorKind::InvalidInput`).
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    // O_NONBLOCK: opening a FIFO waits for a writer otherwise. No effect on files.
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    if meta.len() > limit {
        return Err(too_large(meta.len(), limit));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        // It grew while we read it.
        return Err(too_large(bytes.len() as u64, limit));
    }
    Ok(bytes)
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
        assert_eq!(read(&dir.join("nope"), 100).unwrap_err().kind(), io::ErrorKind::NotFound);
        fs::remove_dir_all(&dir).unwrap();
    }
}
