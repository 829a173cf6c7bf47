//! Other processes sharing a cache directory: whether one is alive, and the file
//! locks that keep one refresh and one helper at a time per directory.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// How often a wait for a lock another process holds looks again.
const LOCK_POLL: Duration = Duration::from_millis(100);

/// Whether process `pid` (of this machine) still runs. A process we may not signal
/// (another user's) is alive; a zombie counts as alive until reaped.
pub fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Opens `path` (created, mode 0600) and takes an exclusive lock on it without
/// waiting: `Ok(None)` when another process holds it. The lock lasts as long as the
/// returned file is open, and ends with the process however it ends (`flock`).
pub fn try_lock(path: &Path) -> io::Result<Option<File>> {
    let file = open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Like [`try_lock`], but waits up to `timeout` for the holder to let go.
pub fn lock_within(path: &Path, timeout: Duration) -> io::Result<Option<File>> {
    let start = Instant::now();
    loop {
        if let Some(file) = try_lock(path)? {
            return Ok(Some(file));
        }
        if start.elapsed() >= timeout {
            return Ok(None);
        }
        std::thread::sleep(LOCK_POLL.min(timeout.saturating_sub(start.elapsed())));
    }
}

fn open(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// This host's name (`gethostname`), or `unknown host`: for records of who wrote
/// a shared state, never for a decision.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; POSIX gethostname writes at most
    // that many bytes (NUL-terminated unless truncated, which the search below handles).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown host".to_string();
    }
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!alive(pid));
        assert!(!alive(0), "pid 0 is the caller's process group, not a process");
        assert!(!alive(u32::MAX), "beyond pid_t");
    }

    #[test]
    fn a_held_lock_is_refused_without_waiting_and_taken_once_released() {
        let dir = crate::snapshot::tests::tempdir("process-lock");
        let path = dir.join("x.lock");
        let held = try_lock(&path).unwrap().expect("free");
        // flock locks belong to the open file: a second open is another holder.
        assert!(try_lock(&path).unwrap().is_none());
        let start = Instant::now();
        assert!(lock_within(&path, Duration::from_millis(300)).unwrap().is_none());
        assert!(start.elapsed() >= Duration::from_millis(300));
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(held);
        });
        assert!(lock_within(&path, Duration::from_secs(5)).unwrap().is_some());
        releaser.join().unwrap();
    }
}
