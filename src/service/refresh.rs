//! The index's refreshes: one background thread at a time reading the fact source,
//! building a new index and swapping it in; backoff after failures; a refresh hung
//! below us (a resolver, a file system) declared so and replaced.

use super::record::{self, bounded_error, Counts, Outcome, RefreshRecord};
use super::{MAX_PENDING_WARNINGS, REFRESH_LOCK};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::index::Index;
use crate::snapshot::{self, SnapshotRef};
use crate::source::{ChangeSignal, Source};
use crate::time::{now, now_ms};
use crate::unpoisoned::lock;
use arc_swap::ArcSwapOption;
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Refresh threads declared hung that may linger; past this, no new one is started.
const MAX_ABANDONED_REFRESHES: usize = 4;

/// State the refresh thread and the compiles share.
pub(super) struct Shared {
    pub(super) config: Config,
    pub(super) current: ArcSwapOption<Index>,
    pub(super) refresh_state: Mutex<RefreshState>,
    /// Unix seconds when the last refresh finished, well or not.
    pub(super) last_finished: AtomicI64,
    pub(super) last_error: Mutex<Option<String>>,
    pub(super) warnings: Mutex<Warnings>,
    pub(super) seen_environments: Mutex<BTreeMap<String, String>>,
    /// Refreshes failed in a row, and the Unix second before which a compile does not
    /// start another (0: no backoff).
    pub(super) failures: AtomicU32,
    pub(super) retry_at: AtomicI64,
    /// The configured source, opened.
    pub(super) source: Box<dyn Source>,
    /// Where refresh threads take their work (a new thread replaces a hung one).
    pub(super) requests: Receiver<Refresh>,
    /// A refresh's worst case, network deadlines included.
    pub(super) worst_case: Duration,
    /// Servers read so far by the refresh in flight (a progress line's count).
    pub(super) progress: AtomicUsize,
    /// This process's last refresh, as written to [`record::RECORD_FILE`].
    pub(super) last_record: Mutex<Option<RefreshRecord>>,
    /// Servers the read that built the index in use gave as the read before it did
    /// (tests check that refreshes go on from each other).
    #[cfg(test)]
    pub(super) reused: AtomicUsize,
}

/// Warnings waiting for the bindings, and how many did not fit.
#[derive(Default)]
pub(super) struct Warnings {
    pub(super) pending: Vec<String>,
    pub(super) left_out: u64,
}

/// Wakes a refresh thread to run refresh number `.0` (see `RefreshState::ticket`).
pub(super) struct Refresh(pub(super) u64);

/// Whether a refresh is queued or running, and who waits for it to finish. One lock,
/// so a waiter can never register just after the refresh it waits for has ended.
pub(super) struct RefreshState {
    pub(super) in_flight: bool,
    pub(super) waiters: Vec<Sender<()>>,
    /// A waiter reports the refresh in flight's failure itself (`puppet kicker
    /// refresh` as its error): no warning then, so it is said once.
    pub(super) failure_reported: bool,
    /// The number of the latest refresh requested; an older one that finishes late
    /// (declared hung) changes nothing.
    pub(super) ticket: u64,
    /// When the refresh in flight was requested.
    pub(super) since: Option<Instant>,
    /// A refresh in flight for longer is declared hung: far beyond its worst case.
    pub(super) stuck_after: Duration,
    /// Refresh threads declared hung and not finished yet.
    pub(super) abandoned: usize,
}

/// Starts a refresh unless one is in flight. One in flight far beyond its worst
/// case is declared hung: logged, left to finish on its own thread (its result is
/// then discarded), and a new thread takes this refresh, so a hang below us (a
/// resolver, a file system) never stops refreshes for good.
pub(super) fn request_refresh(shared: &Arc<Shared>, refresh: &Sender<Refresh>) {
    let mut state = lock(&shared.refresh_state);
    if state.in_flight {
        let running = state.since.map_or(Duration::ZERO, |since| since.elapsed());
        if running < state.stuck_after || state.abandoned >= MAX_ABANDONED_REFRESHES {
            return;
        }
        let started = match start_refresh_thread(shared) {
            Ok(()) => "starting another",
            Err(_) => "and no thread could be started for another",
        };
        shared.warn(format!(
            "puppet-kicker: the refresh started {}s ago is still running, far beyond the {}s it may take (a hung resolver or file system?); {started}",
            running.as_secs(),
            state.stuck_after.as_secs()
        ));
        state.abandoned += 1;
    }
    state.in_flight = true;
    state.ticket += 1;
    state.since = Some(Instant::now());
    let _ = refresh.send(Refresh(state.ticket));
}

pub(super) fn start_refresh_thread(shared: &Arc<Shared>) -> std::io::Result<()> {
    let worker = shared.clone();
    std::thread::Builder::new().name("puppet-kicker-refresh".into()).spawn(move || refresh_loop(&worker)).map(drop)
}

pub(super) fn refresh_and_wait(shared: &Arc<Shared>, refresh: &Sender<Refresh>, timeout: Duration) -> bool {
    start_and_notify(shared, refresh, false).recv_timeout(timeout).is_ok()
}

/// Starts a refresh (or joins the one in flight); the receiver hears when it ends.
/// With `reports_failure`, the caller reports a failure itself, and the refresh
/// thread does not warn of it.
pub(super) fn start_and_notify(shared: &Arc<Shared>, refresh: &Sender<Refresh>, reports_failure: bool) -> Receiver<()> {
    let (done, finished) = crossbeam_channel::bounded(1);
    let mut state = lock(&shared.refresh_state);
    state.waiters.push(done);
    state.failure_reported |= reports_failure;
    drop(state);
    request_refresh(shared, refresh);
    finished
}

impl Shared {
    fn warn_opt(&self, warning: Option<String>) {
        if let Some(warning) = warning {
            self.warn(warning);
        }
    }

    pub(super) fn warn(&self, warning: String) {
        let mut warnings = lock(&self.warnings);
        if warnings.pending.len() < MAX_PENDING_WARNINGS {
            warnings.pending.push(warning);
        } else {
            warnings.left_out = warnings.left_out.saturating_add(1);
        }
    }

    /// Whether refresh `ticket` is still the latest one (not declared hung).
    fn is_current(&self, ticket: u64) -> bool {
        lock(&self.refresh_state).ticket == ticket
    }

    /// Reads the source and swaps in a new index; the snapshot follows. Refresh
    /// `ticket` changes nothing once a newer one replaced it. Says how it ended and
    /// what it changed.
    ///
    /// `held`: the refresh lock, once taken; the caller keeps it until the refresh
    /// is recorded, so that processes failing one after the other count their row
    /// from each other's records ([`Shared::failures_in_a_row`]).
    fn refresh(&self, ticket: u64, held: &mut Option<std::fs::File>) -> Result<(Outcome, Counts)> {
        let lock_path = self.config.cache_dir.join(REFRESH_LOCK);
        // A refused cache dir is warned about where the snapshot is written.
        let lockable = crate::cache_dir::ensure(&self.config.cache_dir).is_ok();
        let wait = self.worst_case.saturating_add(Duration::from_secs(10));
        let requested = now();
        let contended = lockable && matches!(crate::process::try_lock(&lock_path), Ok(None));
        let taken = if lockable { crate::process::lock_within(&lock_path, wait) } else { Ok(None) };
        *held = match taken {
            Ok(Some(file)) => Some(file),
            Ok(None) if !lockable => None,
            Ok(None) => {
                return Err(Error::Io(format!(
                    "another process has held {} for more than {}s; not refreshing meanwhile",
                    lock_path.display(),
                    wait.as_secs()
                )))
            }
            Err(e) => {
                // A cache dir we cannot lock in (read-only) still gets refreshes.
                self.warn(format!("cannot lock {}: {e}; refreshing without it", lock_path.display()));
                None
            }
        };
        // Only a refresh that ran while this one waited is taken: one asked for
        // without contention reads the source, as it always did.
        if contended {
            if let Some(counts) = self.adopt_fresher_snapshot(ticket, requested) {
                return Ok((Outcome::Adopted, counts));
            }
        }
        let started = now();
        let previous = self.current.load_full();
        let mut read = self.source.refresh(previous.as_deref(), started, &self.progress)?;
        self.progress.store(read.observations.len(), Ordering::Relaxed);
        let signal = match &read.changes {
            Some(changes) if previous.as_ref().is_some_and(|p| p.generation() == changes.since) => {
                ChangeSignal::Certnames(changes.certnames.clone())
            }
            _ => self.source.change_signal(&read),
        };
        for warning in std::mem::take(&mut read.warnings) {
            self.warn(warning.to_string());
        }
        #[cfg(test)]
        let reused = read.reused;
        // Where the source recorded servers (PuppetDB) stands in for where the master saw them.
        let seen = read.environments.take().unwrap_or_else(|| lock(&self.seen_environments).clone());
        let (index, base) = read.into_index_and_base(previous.as_deref(), &seen, &self.config.role_fact, started);
        if !self.is_current(ticket) {
            return Ok((Outcome::Ok, Counts::default()));
        }
        let index = Arc::new(index);
        {
            let state = lock(&self.refresh_state);
            if state.ticket == ticket {
                self.current.store(Some(index.clone()));
                self.source.carry(base);
                #[cfg(test)]
                self.reused.store(reused, Ordering::SeqCst);
            }
        }
        // The new index serves first; counting and writing the snapshot come after.
        let counts = Counts::between(previous.as_deref(), &index, signal);
        drop(previous);
        let snap = SnapshotRef::of(&index, &seen);
        if let Err(warning) = snapshot::write(&snapshot::path_in(&self.config.cache_dir), &snap) {
            self.warn(warning.to_string());
        }
        Ok((Outcome::Ok, counts))
    }
}

impl Shared {
    /// Takes the snapshot another process wrote while this one waited for the
    /// refresh lock, when it is newer than the index and younger than `cache.ttl`:
    /// that refresh just happened, and doing it again would only load the fleet.
    /// What it changed, when it took it.
    fn adopt_fresher_snapshot(&self, ticket: u64, requested: i64) -> Option<Counts> {
        let path = snapshot::path_in(&self.config.cache_dir);
        let current = self.current.load().as_ref().map_or(i64::MIN, |i| i.built_at());
        let written = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        let written = written.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs() as i64);
        if written.is_none_or(|w| w < current.max(requested) || now() - w >= self.config.cache_ttl as i64) {
            return None;
        }
        let Ok(Some(snap)) = snapshot::read(&path, &self.config.role_fact) else { return None };
        if snap.built_at <= current || now() - snap.built_at >= self.config.cache_ttl as i64 || snap.index.is_empty() {
            return None;
        }
        let mut seen = lock(&self.seen_environments);
        for (certname, environment) in snap.seen_environments {
            seen.entry(certname).or_insert(environment);
        }
        drop(seen);
        let index = snap.index;
        let counts = Counts::between(self.current.load().as_deref(), &index, ChangeSignal::Timestamps);
        let state = lock(&self.refresh_state);
        if state.ticket == ticket {
            self.current.store(Some(Arc::new(index)));
        }
        Some(counts)
    }
}

fn refresh_loop(shared: &Shared) {
    while let Ok(Refresh(ticket)) = shared.requests.recv() {
        let (started_ms, clock) = (now_ms(), Instant::now());
        shared.progress.store(0, Ordering::Relaxed);
        // The refresh lock, held from the refresh until its record is written.
        let mut held = None;
        let outcome = catch_unwind(AssertUnwindSafe(|| shared.refresh(ticket, &mut held)))
            .unwrap_or_else(|_| Err(Error::Io("internal error: the refresh panicked".into())));
        if !shared.is_current(ticket) {
            // Declared hung while it ran: a newer refresh owns the state, and
            // another thread serves requests.
            let mut state = lock(&shared.refresh_state);
            state.abandoned = state.abandoned.saturating_sub(1);
            drop(state);
            shared.warn("puppet-kicker: a refresh declared hung finished after all; its result was discarded".into());
            return;
        }
        let mut last_error = lock(&shared.last_error);
        let mut failure_warning = None;
        match &outcome {
            Ok(_) => {
                *last_error = None;
                shared.failures.store(0, Ordering::SeqCst);
                shared.retry_at.store(0, Ordering::SeqCst);
            }
            Err(e) => {
                let failures = shared.failures_in_a_row();
                shared.failures.store(failures, Ordering::SeqCst);
                let delay = backoff(failures, shared.config.retry_min, shared.config.retry_max);
                shared.retry_at.store(now().saturating_add(delay as i64), Ordering::SeqCst);
                let serving = if shared.current.load().as_ref().is_some_and(|i| !i.is_empty()) {
                    "still serving the last snapshot"
                } else {
                    "no snapshot to serve yet"
                };
                failure_warning = Some(format!(
                    "puppet-kicker refresh failed ({failures} in a row; {serving}; next try in {delay}s at the earliest): {e}"
                ));
                *last_error = Some(e.to_string());
            }
        }
        drop(last_error);
        shared.last_finished.store(now(), Ordering::SeqCst);
        shared.record(&outcome, started_ms, clock.elapsed());
        drop(held);
        let waiters = {
            let mut state = lock(&shared.refresh_state);
            if state.ticket != ticket {
                // Declared hung just now: the newer refresh wakes the waiters.
                state.abandoned = state.abandoned.saturating_sub(1);
                drop(state);
                shared.warn_opt(failure_warning);
                return;
            }
            state.in_flight = false;
            state.since = None;
            // Decided with the waiters taken: one who joins later starts a new refresh.
            if std::mem::take(&mut state.failure_reported) {
                failure_warning = None;
            }
            std::mem::take(&mut state.waiters)
        };
        // Before the waiters wake: a caller that polls sees this refresh's end
        // with its warning, never the warning first.
        shared.warn_opt(failure_warning);
        for waiter in waiters {
            let _ = waiter.send(());
        }
    }
}

impl Shared {
    /// Refreshes failed in a row, the one just failed included, as the processes
    /// sharing the cache dir count them: after the record on disk when it is a
    /// failure of this source (another process's `puppet kicker refresh` or
    /// masterless run may have failed since this one last did, or this process is
    /// new), 1 when it is another process's success (the row was broken), else after
    /// this process's own count. Read and then written under the refresh lock (see
    /// `refresh_loop`), so two processes failing at once count two failures.
    fn failures_in_a_row(&self) -> u32 {
        let own = self.failures.load(Ordering::SeqCst);
        let before = match record::read(&self.config.cache_dir) {
            record::Recorded::Found(r) if r.source == self.config.source.name() => match r.outcome {
                Outcome::Failed => r.failures.max(own),
                // This process's own success is older than its own failures, which
                // it could not record.
                Outcome::Ok | Outcome::Adopted if r.pid == std::process::id() => own,
                Outcome::Ok | Outcome::Adopted => 0,
            },
            _ => own,
        };
        before.saturating_add(1)
    }

    /// Writes what refresh `outcome` did to [`record::RECORD_FILE`] for the processes
    /// sharing the cache dir, and keeps it for this one.
    fn record(&self, outcome: &Result<(Outcome, Counts)>, started_ms: i64, took: Duration) {
        let index = self.current.load_full();
        let (outcome, counts, error) = match outcome {
            Ok((outcome, counts)) => (*outcome, *counts, None),
            Err(e) => (Outcome::Failed, Counts::default(), Some(bounded_error(&e.to_string()))),
        };
        let retry_at = self.retry_at.load(Ordering::SeqCst);
        let record = RefreshRecord {
            source: self.config.source.name().to_string(),
            pid: std::process::id(),
            generation: index.as_ref().map_or(0, |i| i.generation()),
            servers: index.as_ref().map_or(0, |i| i.len() as u64),
            started_ms,
            finished_ms: now_ms(),
            duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            outcome,
            error,
            added: counts.added,
            changed: counts.changed,
            dropped: counts.dropped,
            failures: self.failures.load(Ordering::SeqCst),
            retry_at_ms: (retry_at > 0).then(|| retry_at.saturating_mul(1000)),
            index_bytes: index.as_ref().map_or(0, |i| i.heap_bytes() as u64),
        };
        if let Err(e) = record::write(&self.config.cache_dir, &record) {
            self.warn(format!("cannot write {}: {e}", self.config.cache_dir.join(record::RECORD_FILE).display()));
        }
        *lock(&self.last_record) = Some(record);
    }
}

/// Seconds to wait after `failures` failed refreshes in a row: `min`, doubled per
/// further failure, at most `max`.
fn backoff(failures: u32, min: u64, max: u64) -> u64 {
    let max = max.max(min);
    min.saturating_mul(1u64 << failures.saturating_sub(1).min(32)).min(max)
}
