//! The masterless helper: finishes what a short-lived `puppet apply` leaves undone.
//!
//! A `puppet apply` exits seconds after it starts: a refresh it started in the
//! background, a kick to retry in 30 s, a follow-up run, an operator's kick of this
//! machine (which cannot start before this very run ends) would all die with it. When it
//! exits with such work left, the Ruby side spawns `ruby lib/puppet_kicker/helper.rb`,
//! detached, which calls [`run`]:
//!
//! * it takes `helper.lock` in the cache dir without waiting; held, another helper
//!   runs and this one exits at once: the running one re-reads the shared state each
//!   second, so new work reaches it (a wanted refresh is left as `refresh.wanted`);
//! * it refreshes the index when the snapshot is older than `cache.ttl` (the refresh
//!   takes `refresh.lock`, so it waits for a refresh another process runs);
//! * it runs the kick dispatcher until no kick is left undelivered: retries when they
//!   are due, follow-ups once their kicked run reported, kicks of a server whose
//!   `puppet apply` is still running once that process exited;
//! * it exits when nothing is left, or after [`max_lifetime`], whichever comes first;
//!   what is left stays in `kicks.msgpack` for the next process.
//!
//! `helper.json` says what it waits for ([`crate::helper_presence`]); `kick-status.json` and the status call show
//! it under `helper`. It logs to `helper.log` in the cache dir, kept under
//! [`MAX_LOG_BYTES`] (rotated once, to `helper.log.1`).
//!
//! Exiting has a race to close: work written just after the last look and before
//! the lock is released would find the lock held (its spawned helper exits) and
//! then no helper at all. So the helper releases the lock, looks once more, and
//! takes the lock again (or leaves it to the helper that did) when work appeared.

pub use crate::helper_presence::{describe, HELPER_FILE};

use crate::config::{Config, PuppetSettings};
use crate::error::{Error, Result};
use crate::kick::{KickService, STATE_FILE};
use crate::process;
use crate::service::Service;
use serde_json::json;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Held by the running helper; `flock`, so it ends with the process however it ends.
pub const HELPER_LOCK: &str = "helper.lock";
/// The helper's log, in the cache dir.
pub const HELPER_LOG: &str = "helper.log";
/// Left by a process that wants a refresh while a helper runs.
pub const REFRESH_WANTED: &str = "refresh.wanted";
/// `helper.log` is rotated (once, to `helper.log.1`) before it grows past this.
pub const MAX_LOG_BYTES: u64 = 1 << 20;
/// Lines of "waiting for" kept in `helper.json`.
const MAX_WAITING_LINES: usize = 20;

/// How a helper run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Another helper holds the lock: this one did nothing.
    AlreadyRunning,
    /// Nothing left to do.
    Done,
    /// [`max_lifetime`] is over; this many kicks stay for the next process.
    LifetimeOver { undelivered: usize },
}

/// Knobs for tests; [`run`] uses the defaults.
#[derive(Clone, Debug)]
pub struct Options {
    /// How often the helper looks at the shared state.
    pub poll: Duration,
    /// Overrides [`max_lifetime`].
    pub lifetime: Option<Duration>,
}

impl Default for Options {
    fn default() -> Options {
        Options { poll: Duration::from_secs(1), lifetime: None }
    }
}

/// The longest a helper lives: a refresh at its worst, twice (the one another process
/// holds the lock for, then its own), plus a kicked run's `run_timeout` (a follow-up
/// waits for its report), plus every retry of a kick (`max_attempts` sends of up to
/// `reply_timeout` each, the backoff between them) and `in_flight_timeout` (a send a
/// killed process left in flight). About 1 h 20 min with the defaults.
pub fn max_lifetime(config: &Config, refresh_worst_case: Duration) -> Duration {
    let kick = &config.kick;
    let planner = &kick.planner;
    let ms = |ms: i64| Duration::from_millis(ms.max(0) as u64);
    let mut retries = Duration::ZERO;
    for attempt in 1..planner.max_attempts {
        let backoff = planner.retry_base_ms.saturating_mul(1 << (attempt - 1).min(20)).min(planner.retry_max_ms);
        retries = retries.saturating_add(ms(backoff));
    }
    let sends = kick.reply_timeout.saturating_mul(planner.max_attempts);
    refresh_worst_case
        .saturating_mul(2)
        .saturating_add(ms(planner.run_timeout_ms))
        .saturating_add(retries)
        .saturating_add(sends)
        .saturating_add(ms(planner.in_flight_timeout_ms))
        .saturating_add(ms(planner.coalesce_ms))
}

/// Runs the helper for the cache dir of `settings` (see the module's doc).
pub fn run(settings: PuppetSettings) -> Result<Ending> {
    run_with(settings, &Options::default())
}

pub fn run_with(settings: PuppetSettings, options: &Options) -> Result<Ending> {
    let config = Config::load(&settings)?;
    let dir = config.cache_dir.clone();
    crate::cache_dir::ensure(&dir)?;
    let kicker = Service::start(settings)?;
    let wanted = dir.join(REFRESH_WANTED);
    if stale(&kicker) {
        // Seen by the helper already running, if there is one.
        let _ = crate::atomic_file::write(&wanted, &[]);
    }
    let Some(held) = process::try_lock(&dir.join(HELPER_LOCK)).map_err(|e| lock_error(&dir, e))? else {
        return Ok(Ending::AlreadyRunning);
    };
    let mut held = Some(held);
    let mut log = HelperLog::open(&dir);
    let lifetime = options.lifetime.unwrap_or_else(|| max_lifetime(&config, kicker.refresh_worst_case()));
    let started = Instant::now();
    let started_at = crate::time::now();
    let ends_by = started_at.saturating_add(lifetime.as_secs() as i64);
    log.line(&format!(
        "helper started for {} (at most {}s, until {})",
        dir.display(),
        lifetime.as_secs(),
        utc(ends_by)
    ));
    let record = |waiting: &[String]| {
        let doc = json!({"pid": std::process::id(), "started_at": started_at, "ends_by": ends_by,
                         "waiting_for": waiting.iter().take(MAX_WAITING_LINES).collect::<Vec<_>>()});
        let _ = crate::atomic_file::write(&dir.join(HELPER_FILE), &[doc.to_string().as_bytes(), b"\n"]);
    };
    let mut last_waiting = Vec::new();
    let ending = loop {
        if std::fs::remove_file(&wanted).is_ok() && stale(&kicker) {
            record(&["refresh".to_string()]);
            refresh(&kicker, &mut log);
        }
        let kicks = kick_service(&kicker, &dir)?;
        let waiting = match kicks {
            Some(kicks) => {
                kicks.wake();
                // The dispatcher re-reads the state and sends what is due; give it a moment.
                std::thread::sleep(options.poll.min(Duration::from_millis(200)));
                kicks.sync();
                drain_log(kicks, &mut log);
                kicks.waiting_for()
            }
            None => Vec::new(),
        };
        if waiting != last_waiting || waiting.is_empty() {
            record(&waiting);
            if let Some(kicks) = kicks {
                kicks.sync();
            }
            if !waiting.is_empty() {
                log.line(&format!("waiting for: {}", waiting.join("; ")));
            }
            last_waiting = waiting.clone();
        }
        if waiting.is_empty() && !wanted.exists() {
            // Release, then look once more (see the module's doc).
            let _ = std::fs::remove_file(dir.join(HELPER_FILE));
            if let Some(kicks) = kicks {
                kicks.sync();
            }
            drop(held.take());
            let more = kicks.is_some_and(|k| {
                k.sync();
                k.undelivered() > 0
            }) || wanted.exists();
            if !more {
                break Ending::Done;
            }
            match process::try_lock(&dir.join(HELPER_LOCK)).map_err(|e| lock_error(&dir, e))? {
                Some(again) => held = Some(again),
                None => break Ending::Done, // another helper took over
            }
            continue;
        }
        if started.elapsed() >= lifetime {
            let undelivered = kicks.map_or(0, KickService::undelivered);
            log.line(&format!(
                "lifetime of {}s over; {undelivered} kick(s) stay in {} for the next run",
                lifetime.as_secs(),
                dir.join(STATE_FILE).display()
            ));
            break Ending::LifetimeOver { undelivered };
        }
        std::thread::sleep(options.poll);
    };
    if held.is_some() {
        let _ = std::fs::remove_file(dir.join(HELPER_FILE));
        if let Ok(Some(kicks)) = kick_service(&kicker, &dir) {
            kicks.sync();
            drain_log(kicks, &mut log);
        }
    }
    log.line(&format!("helper exits after {}s: {ending:?}", started.elapsed().as_secs()));
    Ok(ending)
}

/// Whether the index is missing or older than `cache.ttl`.
fn stale(kicker: &Service) -> bool {
    let ttl = kicker.config().cache_ttl as i64;
    kicker.status().built_at.is_none_or(|built| crate::time::now() - built >= ttl)
}

fn refresh(kicker: &Service, log: &mut HelperLog) {
    let started = Instant::now();
    let done = kicker.refresh_and_wait(kicker.refresh_worst_case().saturating_mul(2));
    let status = kicker.status();
    let how = match (&status.last_error, done) {
        (_, false) => "did not finish in time".to_string(),
        (Some(error), true) => format!("failed: {error}"),
        (None, true) => format!("done: {} servers", status.servers),
    };
    log.line(&format!("refresh {how} ({:.1}s)", started.elapsed().as_secs_f64()));
    kicker.take_warnings().iter().for_each(|w| log.line(&format!("warning: {w}")));
}

/// The kick service, once there is kick state to look at.
fn kick_service<'a>(kicker: &'a Service, dir: &Path) -> Result<Option<&'a KickService>> {
    if !dir.join(STATE_FILE).exists() {
        return Ok(None);
    }
    kicker.kicks().map(Some)
}

fn drain_log(kicks: &KickService, log: &mut HelperLog) {
    for line in kicks.take_log() {
        log.line(&format!("{}: {}", line.level.as_str(), line.message));
    }
}

fn lock_error(dir: &Path, e: std::io::Error) -> Error {
    Error::system(format!("cannot lock {}", dir.join(HELPER_LOCK).display()), e)
}

/// `helper.log`: appended to, mode 0600, rotated once past [`MAX_LOG_BYTES`].
struct HelperLog {
    path: PathBuf,
    file: Option<File>,
}

impl HelperLog {
    fn open(dir: &Path) -> HelperLog {
        let path = dir.join(HELPER_LOG);
        let file = open_log(&path);
        HelperLog { path, file }
    }

    fn line(&mut self, message: &str) {
        let line = format!("{} helper[{}]: {message}\n", utc(crate::time::now()), std::process::id());
        let size = self.file.as_ref().and_then(|f| f.metadata().ok()).map_or(0, |m| m.len());
        if size.saturating_add(line.len() as u64) > MAX_LOG_BYTES {
            let _ = std::fs::rename(&self.path, self.path.with_extension("log.1"));
            self.file = open_log(&self.path);
        }
        if let Some(file) = self.file.as_mut() {
            let _ = file.write_all(line.as_bytes());
        }
    }
}

fn open_log(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new().create(true).append(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path).ok()
}

/// `2026-05-01T12:00:00Z` for Unix seconds.
pub fn utc(seconds: i64) -> String {
    let t = crate::time::CalendarTime::utc(seconds);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", t.year, t.month, t.day, t.hour, t.minute, t.second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_reads_as_a_calendar_date() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_777_636_799), "2026-05-01T11:59:59Z");
    }

    #[test]
    fn the_log_is_rotated_once_before_it_passes_its_cap() {
        let dir = crate::snapshot::tests::tempdir("helper-log");
        let mut log = HelperLog::open(&dir);
        let line = "x".repeat(1000);
        for _ in 0..(MAX_LOG_BYTES / 1000 + 10) {
            log.line(&line);
        }
        let size = |name: &str| std::fs::metadata(dir.join(name)).map(|m| m.len()).unwrap_or(0);
        assert!(size(HELPER_LOG) <= MAX_LOG_BYTES && size(HELPER_LOG) > 0);
        assert!(size("helper.log.1") <= MAX_LOG_BYTES && size("helper.log.1") > MAX_LOG_BYTES - 2000);
        for _ in 0..(MAX_LOG_BYTES / 1000 * 2) {
            log.line(&line);
        }
        assert!(size(HELPER_LOG) <= MAX_LOG_BYTES && size("helper.log.1") <= MAX_LOG_BYTES, "two files at most");
        assert!(!dir.join("helper.log.2").exists());
    }
}
