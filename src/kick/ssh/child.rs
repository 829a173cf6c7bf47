//! One child process run to a deadline: its stdout and stderr read on threads of
//! their own, each kept up to a bound (the rest is read and dropped, so the child
//! never blocks on a full pipe), and the child killed and reaped when the deadline
//! passes.

use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How often the child is looked at while it runs.
const POLL: Duration = Duration::from_millis(5);
/// After the child exited, its output is waited for until the deadline, and at
/// least this long (a process it left behind may hold the pipes open: what was read
/// by then is kept). Not shorter: on a starved machine the reader threads run late.
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// How a child run ended.
#[derive(Debug)]
pub struct Finished {
    /// `None`: killed at the deadline.
    pub status: Option<ExitStatus>,
    pub stdout: Captured,
    pub stderr: Captured,
}

/// What was read of one stream: at most the bound, and whether more came.
#[derive(Debug, Default)]
pub struct Captured {
    pub bytes: Vec<u8>,
    pub truncated: bool,
}

/// Runs `command` (stdin from /dev/null, in a process group of its own) until it
/// exits or `deadline` passes; then kills its group and reaps it. Each stream keeps
/// at most `limit` bytes.
pub fn run(mut command: Command, deadline: Instant, limit: usize) -> io::Result<Finished> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = command.spawn()?;
    let stdout = reader(child.stdout.take(), limit);
    let stderr = reader(child.stderr.take(), limit);
    let status = wait_until(&mut child, deadline)?;
    let drained = deadline.max(Instant::now() + DRAIN_GRACE);
    let take = |rx: mpsc::Receiver<Captured>| {
        rx.recv_timeout(drained.saturating_duration_since(Instant::now())).unwrap_or_default()
    };
    Ok(Finished { status, stdout: take(stdout), stderr: take(stderr) })
}

/// The child's exit status, or `None` when it was killed at `deadline`.
fn wait_until(child: &mut Child, deadline: Instant) -> io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            // The whole group: a ProxyCommand the child started goes too.
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill(2) with a process group id; no memory is involved.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let _ = child.kill();
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(POLL);
    }
}

/// Reads `stream` to its end on a thread, keeping the first `limit` bytes.
fn reader(stream: Option<impl Read + Send + 'static>, limit: usize) -> mpsc::Receiver<Captured> {
    let (tx, rx) = mpsc::channel();
    match stream {
        Some(mut stream) => {
            let spawned = std::thread::Builder::new().name("puppet-kicker-ssh-output".into()).spawn(move || {
                let mut captured = Captured::default();
                let mut buffer = [0u8; 8192];
                loop {
                    match stream.read(&mut buffer) {
                        Ok(0) => break,
                        Ok(n) => {
                            let room = limit.saturating_sub(captured.bytes.len());
                            captured.bytes.extend_from_slice(&buffer[..n.min(room)]);
                            captured.truncated |= n > room;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                let _ = tx.send(captured);
            });
            if spawned.is_err() {
                // No thread: the stream is dropped (the child then sees a closed pipe).
                return rx;
            }
        }
        None => {
            let _ = tx.send(Captured::default());
        }
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut command = Command::new("/bin/sh");
        command.arg("-c").arg(script);
        command
    }

    #[test]
    fn output_is_kept_up_to_the_limit_and_the_rest_drained() {
        let deadline = Instant::now() + Duration::from_secs(20);
        let finished = run(sh("head -c 200000 /dev/zero; echo oops >&2; exit 3"), deadline, 1000).unwrap();
        assert_eq!(finished.status.and_then(|s| s.code()), Some(3));
        assert_eq!(finished.stdout.bytes.len(), 1000);
        assert!(finished.stdout.truncated);
        assert_eq!(finished.stderr.bytes, b"oops\n");
        assert!(!finished.stderr.truncated);
    }

    #[test]
    fn a_child_past_its_deadline_is_killed_with_its_group_and_reaped() {
        let started = Instant::now();
        // A grandchild in the background, its pid told: it goes with the group.
        let finished = run(sh("sleep 60 & echo $!; exec sleep 60"), started + Duration::from_secs(3), 1000).unwrap();
        assert!(finished.status.is_none(), "{finished:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        let grandchild = String::from_utf8(finished.stdout.bytes).unwrap();
        let grandchild = grandchild.trim();
        assert!(!grandchild.is_empty(), "the shell did not start within 3 s");
        // Dead: gone, or a zombie waiting for init to reap it.
        let stat = format!("/proc/{grandchild}/stat");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let state = std::fs::read_to_string(&stat).ok().and_then(|s| s.rsplit(") ").next().map(|r| r.to_string()));
            match state {
                None => break,
                Some(rest) if rest.starts_with('Z') => break,
                Some(rest) => assert!(Instant::now() < deadline, "the grandchild outlived the deadline: {rest}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
