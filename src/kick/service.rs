//! The kick side of the process-wide service: takes reports in (fast: record and
//! enqueue), and dispatches on a background thread that never touches Ruby.
//!
//! Everything the planner knows is written to `kicks.msgpack` after each change, so
//! a restarted master neither loses nor repeats kicks; `kick-status.json` shows the
//! operator what is pending, what happened lately, and the role cycles seen. The
//! status is a view of the state, rebuilt from it: it is written off the report's
//! thread, at most every [`STATUS_INTERVAL`] while kicks go out, and not synced.

use super::planner::{changed_servers, Claim, Event, Planner, PlannerState, Resolved, Target};
use super::store::{FileStore, Health, StateError, StateStore};
use super::transport::Transport;
use super::{KickConfig, Millis, ReportKicks, RunStatus, Selector};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::mpsc::{SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::log::{Level, LogLine};
pub use crate::time::now_ms;
use crate::unpoisoned::lock;

pub const STATE_FILE: &str = "kicks.msgpack";
pub const STATUS_FILE: &str = "kick-status.json";
/// Lines kept for the bindings to log; a flood beyond this is counted, not kept.
const MAX_LOG_LINES: usize = 1000;
/// Lines one report logs; the rest are counted in one more line (the status file
/// has the whole picture).
pub const MAX_LOG_LINES_PER_REPORT: usize = 100;
/// How soon a save that failed (a full disk) is tried again.
const SAVE_RETRY: Duration = Duration::from_secs(5);
/// How long the dispatcher sleeps when nothing is scheduled.
const IDLE_WAKEUP: Duration = Duration::from_secs(60);
/// How often `flush` takes in the shared state while it waits.
const FLUSH_SYNC: Duration = Duration::from_millis(250);
/// How long a report with no kick waits at most to be taken in when it ends no kick
/// this process knows of (see `KickService::report`).
const ENDINGS_DELAY: Duration = Duration::from_secs(1);
/// How often the dispatcher looks whether a process holding a server's kicks exited.
pub const HOLD_POLL: Duration = Duration::from_secs(1);
/// `kick-status.json` is rewritten at most this often while kicks are being sent,
/// and at the latest this long after the state changed.
pub const STATUS_INTERVAL: Duration = Duration::from_millis(200);

/// What the kick service could not do: start, or read the kick state. Each names
/// the file or the database when there is one.
#[derive(Debug)]
#[non_exhaustive]
pub enum KickError {
    /// The kick state could not be read.
    State(StateError),
    /// The dispatcher thread could not be started.
    StartDispatcher { source: io::Error },
}

impl fmt::Display for KickError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KickError::State(e) => e.fmt(f),
            KickError::StartDispatcher { source } => write!(f, "cannot start the kick dispatcher: {source}"),
        }
    }
}

impl std::error::Error for KickError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KickError::State(e) => e.source(),
            KickError::StartDispatcher { source } => Some(source),
        }
    }
}

impl From<StateError> for KickError {
    fn from(e: StateError) -> KickError {
        KickError::State(e)
    }
}

/// Why the service has no transport: every due kick then fails with this reason.
#[derive(Debug)]
#[non_exhaustive]
pub enum NoTransport {
    /// `kick.dry_run`: kicks are logged, never sent.
    DryRun,
    /// The mcollective client configuration is unusable.
    Mcollective(crate::mcollective::Error),
    /// The `choria.*` settings or files are unusable.
    Choria(super::choria::SetupError),
    /// An `ssh.*` setting is unusable (known_hosts unreadable since the configuration was read).
    Ssh(super::SshConfigError),
}

impl fmt::Display for NoTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoTransport::DryRun => f.write_str("dry run"),
            NoTransport::Mcollective(e) => write!(f, "mcollective is not usable for kicks: {e}"),
            NoTransport::Choria(e) => write!(f, "Choria is not usable for kicks: {e}"),
            NoTransport::Ssh(e) => write!(f, "ssh is not usable for kicks: {e}"),
        }
    }
}

impl std::error::Error for NoTransport {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NoTransport::Mcollective(e) => Some(e),
            NoTransport::Choria(e) => Some(e),
            NoTransport::Ssh(e) => Some(e),
            _ => None,
        }
    }
}

pub struct KickService {
    inner: Arc<Inner>,
    wake: Sender<Wake>,
}

/// What a message to the dispatcher asks of it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// Take in the state, end holds and send what is due, now.
    Now,
    /// Only look again at when to wake: a report with no kick is waiting
    /// (at most [`ENDINGS_DELAY`]).
    Soon,
}

struct Inner {
    planner: Mutex<Planner>,
    /// The planner's configuration, for work done outside its lock.
    config: KickConfig,
    /// A change this process could not save yet: kept, merged with what other
    /// processes write meanwhile, and saved again (see `transact`).
    unsaved: Mutex<Option<Unsaved>>,
    /// Where the state is kept; held for a transaction (before the planner's lock).
    store: Mutex<Box<dyn StateStore>>,
    /// The servers this process changed while the shared store was unreachable:
    /// only these keep this process's view when the shared state is merged back
    /// (see `transact`). Held under the store's lock.
    kept: Mutex<BTreeSet<String>>,
    /// What the store said of itself after the last transaction.
    health: Mutex<Health>,
    /// The shared store's clock minus this host's, in milliseconds (see [`Health`]).
    clock_offset: AtomicI64,
    transport: Option<Box<dyn Transport>>,
    before_dispatch: Box<dyn Fn() + Send + Sync>,
    /// Why there is no transport, for the log.
    transport_error: Option<String>,
    /// The store's description, for messages.
    store_name: String,
    status_path: PathBuf,
    log: Mutex<Log>,
    /// Hosts whose reports this process took in. In a `puppet apply` that host's run
    /// (this process) holds its agent's lock, so a kick of it cannot start before this
    /// process exits: `flush` does not wait for one.
    reporters: Mutex<BTreeSet<String>>,
    /// Claims and outcomes of the senders, waiting to be saved (see `commit`).
    commits: Mutex<Vec<(Change, SyncSender<bool>)>>,
    /// Reports with no kick, and when each arrived, waiting for the next transaction
    /// (see `KickService::report`).
    endings: Mutex<Vec<(ReportKicks, Millis)>>,
    /// Held by the sender whose transaction saves the waiting changes.
    committer: Mutex<()>,
    /// The state changed since `kick-status.json` was last written.
    status_dirty: AtomicBool,
    /// When `kick-status.json` was last written; held while it is written.
    status_written: Mutex<Option<Instant>>,
}

/// When [`Inner::write_status`] writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StatusWrite {
    /// The state changed since the last write.
    IfChanged,
    /// The state changed and the last write is [`STATUS_INTERVAL`] old (or another
    /// thread is writing it now: that one is left to it).
    IfDue,
    /// In any case.
    Always,
}

/// What a sender saves in the kick state around a `runonce`.
enum Change {
    /// Claims a due kick for this process before it is sent; answered whether it
    /// is this process's to send.
    Claim(super::Dispatch),
    /// A kick's outcome (of the target named).
    Outcome(String, super::Outcome),
    /// Nothing: saves what is queued (see [`Inner::queue`]).
    Nothing,
}

impl KickService {
    /// Loads the persisted state from `cache_dir` (`kicks.msgpack`) and starts the
    /// dispatcher.
    pub fn start(
        config: KickConfig,
        cache_dir: &Path,
        transport: Result<Box<dyn Transport>, NoTransport>,
        before_dispatch: Box<dyn Fn() + Send + Sync>,
    ) -> Result<KickService, KickError> {
        let mut warnings = Vec::new();
        // kicks.lock is opened before anything else writes to a new cache dir
        if let Err(e) = crate::cache_dir::ensure(cache_dir) {
            warnings.push(format!("kick state cannot be kept: {e}"));
        }
        let store = Box::new(FileStore::new(cache_dir.join(STATE_FILE)));
        KickService::start_with(config, cache_dir, store, warnings, transport, before_dispatch)
    }

    /// Starts the dispatcher over `store` (the kick state's), with `warnings` to log
    /// first; `cache_dir` holds `kick-status.json`.
    pub fn start_with(
        config: KickConfig,
        cache_dir: &Path,
        mut store: Box<dyn StateStore>,
        mut warnings: Vec<String>,
        transport: Result<Box<dyn Transport>, NoTransport>,
        before_dispatch: Box<dyn Fn() + Send + Sync>,
    ) -> Result<KickService, KickError> {
        let state = store.load().unwrap_or_else(|e| {
            warnings.push(format!("{e}; starting without it"));
            PlannerState::default()
        });
        let planner = Planner::new(config.clone(), state);
        let (transport, transport_error) = match transport {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let inner = Arc::new(Inner {
            planner: Mutex::new(planner),
            config,
            unsaved: Mutex::new(None),
            health: Mutex::new(store.health()),
            clock_offset: AtomicI64::new(store.health().clock_offset_ms),
            store_name: store.describe(),
            store: Mutex::new(store),
            kept: Mutex::new(BTreeSet::new()),
            transport,
            before_dispatch,
            transport_error,
            status_path: cache_dir.join(STATUS_FILE),
            log: Mutex::new(Log {
                lines: warnings.into_iter().map(|m| LogLine { level: Level::Warning, message: m }).collect(),
                left_out: 0,
            }),
            reporters: Mutex::new(BTreeSet::new()),
            commits: Mutex::new(Vec::new()),
            endings: Mutex::new(Vec::new()),
            committer: Mutex::new(()),
            status_dirty: AtomicBool::new(true),
            status_written: Mutex::new(None),
        });
        let (wake, wakeups) = crossbeam_channel::unbounded();
        let worker = inner.clone();
        std::thread::Builder::new()
            .name("puppet-kicker-dispatch".into())
            .spawn(move || dispatch_loop(&worker, &wakeups))
            .map_err(|source| KickError::StartDispatcher { source })?;
        let _ = wake.send(Wake::Now);
        Ok(KickService { inner, wake })
    }

    /// Records a report's kicks and wakes the dispatcher; returns what to log now,
    /// at most [`MAX_LOG_LINES_PER_REPORT`] lines about the report and one counting
    /// the rest. Targets are resolved (within the report's budget) before the
    /// planner's lock is taken: that is the expensive part.
    pub fn report(
        &self,
        report: &ReportKicks,
        resolve: impl FnMut(&Selector, &str) -> Vec<Target>,
        role_of: impl Fn(&str) -> Option<String>,
    ) -> Vec<LogLine> {
        lock(&self.inner.reporters).insert(report.host.clone());
        // Most reports kick nothing: all they may do is end a kicked run, confirm its
        // kick, or hold a masterless server's kicks. That is left to the next
        // transaction (the dispatcher's, woken now, or any other first), so that the
        // report's thread neither waits for the state's file lock nor for its save:
        // a kicked fleet's reports arrive together, and the dispatcher saves them in
        // one write. Nothing is lost: a kick that a report queues, and anything that
        // reads the state, goes through a transaction, which takes them in first.
        //
        // The dispatcher is woken at once when the report may end a kick this process
        // knows of (a kicked run, a kick awaiting confirmation) or holds a masterless
        // server's kicks. Any other waits at most ENDINGS_DELAY, with those that
        // arrive meanwhile: with a shared state, a transaction for each would lock the
        // row that the compilers' kicking reports wait for. (One that ends a kick this
        // process has not yet seen, another compiler's, is still taken in, with its
        // arrival time, within ENDINGS_DELAY.)
        if report.kicks.is_empty() {
            let urgent = report.reporter_pid.is_some() || self.inner.may_end_a_kick(&report.host);
            let first = {
                let mut endings = lock(&self.inner.endings);
                endings.push((report.clone(), self.inner.now()));
                endings.len() == 1
            };
            if urgent || first {
                let _ = self.wake.send(if urgent { Wake::Now } else { Wake::Soon });
            }
            return self.take_log();
        }
        let resolved = Planner::resolve(&self.inner.config, report, resolve, role_of);
        let events = self.inner.transact(|planner| {
            let events = planner.on_resolved(report, resolved, self.inner.now());
            // Nothing happened (no kick, no kicked run ended): nothing to write.
            let changed = !events.is_empty() || !report.kicks.is_empty();
            (events, changed)
        });
        // The dispatcher sends what was queued, and writes the status file: neither
        // on the report's thread.
        if self.inner.status_dirty.load(Ordering::Acquire) {
            let _ = self.wake.send(Wake::Now);
        }
        let mut lines = most_severe_first(events.iter().map(log_line).collect(), MAX_LOG_LINES_PER_REPORT);
        if events.len() > MAX_LOG_LINES_PER_REPORT {
            let left_out = events.len() - MAX_LOG_LINES_PER_REPORT;
            lines.push(LogLine {
                level: Level::Warning,
                message: format!(
                    "{left_out} more kick log lines about this report left out (at most {MAX_LOG_LINES_PER_REPORT} per report; {} lists pending kicks and role cycles)",
                    self.inner.status_path.display()
                ),
            });
        }
        lines.extend(self.take_log());
        lines
    }

    /// Records an operator's kick (`puppet kicker kick`; see [`Planner::on_operator`]),
    /// puts its log lines where a report's dispatch lines go (the log drain), wakes
    /// the dispatcher, and returns what the planner decided, with the attempts each
    /// queued target's kick had made before (it may have joined one in backoff).
    pub fn operator(&self, report: &ReportKicks, resolved: Resolved) -> (Vec<Event>, BTreeMap<String, u32>) {
        let (events, attempts) = self.inner.transact(|planner| {
            let events = planner.on_operator(report, resolved, self.inner.now());
            let attempts = planner
                .state()
                .targets
                .iter()
                .filter_map(|(name, t)| t.pending.as_ref().map(|p| (name.clone(), p.attempts)))
                .collect();
            ((events, attempts), true)
        });
        events.iter().for_each(|e| self.inner.log(log_line(e)));
        // An operator's process may exit at once: its status is written now.
        self.inner.write_status(StatusWrite::IfChanged);
        if events.iter().any(|e| matches!(e, Event::Queued { .. } | Event::Coalesced { .. })) {
            let _ = self.wake.send(Wake::Now);
        }
        (events, attempts)
    }

    /// Where the kick of each of `targets` stands, with what other processes saved
    /// meanwhile taken in; an outcome counts only from `since` on.
    pub fn progress(&self, targets: &[String], since: Millis) -> Vec<Progress> {
        self.inner.transact(|planner| {
            let progress = targets.iter().map(|target| Progress::of(planner, target, since)).collect();
            (progress, false)
        })
    }

    /// How many lines [`Self::take_log`] would return now.
    pub fn log_pending(&self) -> usize {
        let log = lock(&self.inner.log);
        log.lines.len() + usize::from(log.left_out > 0)
    }

    /// Lines the dispatcher logged since the last call, and one counting those
    /// left out when more than the log holds were waiting.
    pub fn take_log(&self) -> Vec<LogLine> {
        let mut log = lock(&self.inner.log);
        let mut lines = std::mem::take(&mut log.lines);
        if log.left_out > 0 {
            lines.push(LogLine {
                level: Level::Warning,
                message: format!(
                    "{} more kick log lines left out (at most {MAX_LOG_LINES} wait to be logged)",
                    log.left_out
                ),
            });
            log.left_out = 0;
        }
        lines
    }

    /// Waits up to `timeout` for every kick due by then to be sent: a short-lived
    /// `puppet apply` calls this at exit. What is still undelivered stays persisted
    /// for the next process. Returns how many kicks remain undelivered.
    ///
    /// It does not wait for a kick of a host whose report this process took in: that
    /// host's agent is busy with this very run until the process exits.
    pub fn flush(&self, timeout: Duration) -> usize {
        // The wait is timed by the monotonic clock: a step of the wall clock (a VM's
        // clock set right) must not end it at once. The deadline by the state's clock
        // says which kicks are due by then.
        let started = Instant::now();
        let deadline = self.inner.now() + timeout.as_millis() as Millis;
        // This process's reports with no kick are taken in now: it may exit next.
        if !lock(&self.inner.endings).is_empty() {
            self.inner.transact(|_| ((), false));
        }
        let _ = self.wake.send(Wake::Now);
        let reporters = lock(&self.inner.reporters).clone();
        let mut synced = Instant::now();
        loop {
            let (busy, undelivered) = {
                let planner = lock(&self.inner.planner);
                let busy = planner.state().targets.iter().any(|(name, t)| {
                    t.pending.as_ref().is_some_and(|p| {
                        let stale_after = planner.config().in_flight_timeout_ms;
                        let sending = p.in_flight && self.inner.now() - p.dispatched_at < stale_after;
                        let held = reporters.contains(name) || planner.state().holds.contains_key(name);
                        sending || (t.running.is_none() && p.due <= deadline && !held)
                    })
                });
                (busy, planner.undelivered())
            };
            if !busy || started.elapsed() >= timeout {
                // A `puppet apply` exits next: the status shows where it left off.
                self.inner.write_status(StatusWrite::IfChanged);
                return undelivered;
            }
            std::thread::sleep(Duration::from_millis(20));
            // A kick in flight may be another process's (another compiler's): its
            // outcome is seen only by taking in the shared state now and then.
            if synced.elapsed() >= FLUSH_SYNC {
                self.inner.transact(|_| ((), false));
                synced = Instant::now();
            }
        }
    }

    /// The status document (also written to `kick-status.json`).
    pub fn status(&self) -> serde_json::Value {
        // Reports queued with no kick are taken in (and saved) first.
        if !lock(&self.inner.endings).is_empty() {
            self.inner.transact(|_| ((), false));
        }
        let store = self.inner.state_json();
        status_json(&lock(&self.inner.planner), self.inner.now(), self.inner.helper(), &store)
    }

    /// Kicks not yet started: pending (due, scheduled for a retry, in flight,
    /// waiting for a local process) and follow-ups.
    pub fn undelivered(&self) -> usize {
        lock(&self.inner.planner).undelivered()
    }

    /// Makes the dispatcher look at once: it re-reads the shared state, ends the holds
    /// of processes that exited, and sends what is due.
    pub fn wake(&self) {
        let _ = self.wake.send(Wake::Now);
    }

    /// Takes in what other processes wrote to the shared state since this one last
    /// looked, and rewrites `kick-status.json` (its `helper` entry included).
    pub fn sync(&self) {
        self.inner.transact(|_| ((), false));
        self.inner.write_status(StatusWrite::Always);
    }

    /// Writes `kick-status.json` now if the state changed since it was last written
    /// (the dispatcher does so within [`STATUS_INTERVAL`]): for a process about to exit.
    pub fn write_status(&self) {
        self.inner.write_status(StatusWrite::IfChanged);
    }

    /// What each undelivered kick waits for, one line each, soonest first.
    pub fn waiting_for(&self) -> Vec<String> {
        let planner = lock(&self.inner.planner);
        let state = planner.state();
        let mut lines: Vec<(Millis, String)> = Vec::new();
        for (name, target) in &state.targets {
            if let Some(p) = &target.pending {
                match state.holds.get(name) {
                    Some(hold) => {
                        lines.push((p.due, format!("kick of {name}: process {} (its run) to exit", hold.pid)))
                    }
                    None if p.in_flight => lines.push((p.dispatched_at, format!("kick of {name}: runonce in flight"))),
                    None => {
                        lines.push((p.due, format!("kick of {name}: due at {} (attempt {})", p.due, p.attempts + 1)))
                    }
                }
            }
            if target.follow_up.is_some() {
                let until = target.running.as_ref().map_or(0, |r| r.started + planner.config().run_timeout_ms);
                lines.push((until, format!("follow-up of {name}: its kicked run to report (at the latest {until})")));
            }
        }
        lines.sort();
        lines.into_iter().map(|(_, line)| line).collect()
    }
}

impl Inner {
    /// Changes the planner's state as one step across processes: under the store's
    /// lock (`kicks.lock`, or the row of the shared state), takes in what another
    /// process saved, applies `change`, and saves the state if `change` says it
    /// changed it (most reports change nothing, and a save is an fsync) or an earlier
    /// change is still unsaved.
    ///
    /// A change that could not be saved is kept: what another process saved
    /// meanwhile is merged into it rather than replacing it, and the save is tried
    /// again. So are the changes made during an outage of the shared store.
    fn transact<R>(&self, change: impl FnOnce(&mut Planner) -> (R, bool)) -> R {
        let mut store = lock(&self.store);
        let mut planner = lock(&self.planner);
        let begun = store.begin(planner.state().generation);
        begun.warnings.into_iter().for_each(|message| self.log(LogLine { level: Level::Warning, message }));
        let health = store.health();
        let outage = health.outage.is_some();
        self.took_health(health);
        let unsaved = lock(&self.unsaved).is_some();
        let mut kept = lock(&self.kept);
        if let Some(theirs) = begun.theirs {
            if begun.merge && !outage {
                // Back from an outage: this process's view is as old as the outage,
                // except for the servers it changed meanwhile.
                planner.merge_kept(theirs, &kept);
                kept.clear();
            } else if unsaved || begun.merge {
                planner.merge_unsaved(theirs);
            } else {
                planner.replace_state(theirs);
            }
        }
        let before = outage.then(|| planner.state().clone());
        let ended = self.take_endings(&mut planner);
        let (result, changed) = change(&mut planner);
        if let Some(before) = before {
            kept.extend(changed_servers(&before, planner.state()));
        }
        drop(kept);
        if changed || unsaved || ended || begun.save {
            self.persist(&mut **store, &mut planner);
            self.took_health(store.health());
        } else {
            store.release();
        }
        drop(planner);
        drop(store);
        result
    }

    /// Keeps what the store said of itself; logs an outage of the shared store when
    /// it begins and when it ends.
    fn took_health(&self, health: Health) {
        self.clock_offset.store(health.clock_offset_ms, Ordering::Relaxed);
        let mut known = lock(&self.health);
        match (&known.outage, &health.outage) {
            (None, Some(outage)) => self.log(LogLine {
                level: Level::Warning,
                message: format!(
                    "shared kick state {} unreachable: {}; kicks are kept in this host's cache dir and merged when it is back (next try in {}s); due kicks wait for it",
                    self.store_name,
                    outage.reason,
                    ((outage.retry_at - outage.since).max(0) + 999) / 1000
                ),
            }),
            (Some(outage), None) => self.log(LogLine {
                level: Level::Notice,
                message: format!(
                    "shared kick state {} is back after {}s; what was kept meanwhile is merged into it",
                    self.store_name,
                    ((now_ms() - outage.since).max(0) + 999) / 1000
                ),
            }),
            _ => {}
        }
        if known.outage.is_some() && health.outage.is_some() {
            // The same outage: its start is the first failure's.
            let since = known.outage.as_ref().map_or(0, |o| o.since);
            *known = health;
            if let Some(o) = known.outage.as_mut() {
                o.since = since;
            }
        } else {
            *known = health;
        }
    }

    /// Where the state is kept and whether it can be reached, for the status.
    fn state_json(&self) -> serde_json::Value {
        state_json(&self.store_name, &lock(&self.health))
    }

    /// Whether a report with no kick from `host` may end a kick this process knows
    /// of: a kicked run, or a kick awaiting confirmation. True when the planner is
    /// busy (a transaction in progress): the report's thread does not wait for it.
    fn may_end_a_kick(&self, host: &str) -> bool {
        match self.planner.try_lock() {
            Ok(planner) => planner.awaits_report_of(host),
            Err(std::sync::TryLockError::Poisoned(planner)) => planner.into_inner().awaits_report_of(host),
            Err(std::sync::TryLockError::WouldBlock) => true,
        }
    }

    /// The shared store is unreachable: due kicks wait (their claims could not be
    /// seen by the other compilers).
    fn in_outage(&self) -> bool {
        lock(&self.health).outage.is_some()
    }

    /// The time by the shared store's clock (this host's when the state is local).
    fn now(&self) -> Millis {
        now_ms() + self.clock_offset.load(Ordering::Relaxed)
    }

    /// Takes in the reports with no kick queued by `KickService::report`, in the
    /// order they arrived, each at its arrival time. True when one changed the state.
    fn take_endings(&self, planner: &mut Planner) -> bool {
        let endings = std::mem::take(&mut *lock(&self.endings));
        let mut changed = false;
        for (report, at) in endings {
            let none = Resolved { source_role: None, kicks: Vec::new() };
            let events = planner.on_resolved(&report, none, at);
            events.iter().for_each(|e| self.log(log_line(e)));
            changed |= !events.is_empty() || report.reporter_pid.is_some();
        }
        changed
    }

    /// Saves `change` in the kick state and returns its answer once it is on disk.
    ///
    /// A group commit: each transaction reads and writes the whole state file with
    /// an fsync, and the senders (up to the transport's `max_parallel`) would
    /// otherwise queue for it one by one: a thousand kicks, two thousand writes.
    /// Instead a sender queues its change and takes the committer's lock; whoever
    /// holds it saves every change queued so far in one transaction. A change is
    /// answered only after its transaction, so a claim is saved before its kick is
    /// sent and an outcome before the planner shows it, as with a transaction each.
    fn commit(&self, change: Change) -> bool {
        let (done, answer) = std::sync::mpsc::sync_channel(1);
        lock(&self.commits).push((change, done));
        loop {
            match answer.try_recv() {
                Ok(answer) => return answer,
                // Its transaction panicked (the dispatcher logs that): not claimed,
                // or the outcome unsaved, as when this process dies mid-kick.
                Err(TryRecvError::Disconnected) => return false,
                Err(TryRecvError::Empty) => {}
            }
            let _committer = lock(&self.committer);
            if let Ok(answer) = answer.try_recv() {
                return answer;
            }
            let batch = std::mem::take(&mut *lock(&self.commits));
            if batch.is_empty() {
                continue;
            }
            let answers = self.transact(|planner| {
                let now = self.now();
                let mut changed = false;
                let answers: Vec<_> = batch
                    .into_iter()
                    .map(|(change, done)| match change {
                        // Not claimed where the other compilers would see it: not sent.
                        Change::Claim(_) if self.in_outage() => (done, false),
                        Change::Claim(dispatch) => match planner.claim(&dispatch, now) {
                            Claim::Held => (done, true),
                            Claim::Renewed => {
                                changed = true;
                                (done, true)
                            }
                            Claim::Lost => (done, false),
                        },
                        Change::Outcome(target, outcome) => {
                            planner.on_outcome(&target, outcome, now).iter().for_each(|e| self.log(log_line(e)));
                            changed = true;
                            (done, true)
                        }
                        Change::Nothing => (done, true),
                    })
                    .collect();
                (answers, changed)
            });
            for (done, answer) in answers {
                let _ = done.send(answer);
            }
            self.write_status(StatusWrite::IfDue);
        }
    }

    /// This process claimed `dispatch` (saved) recently enough that
    /// [`Planner::claim`] would answer `Held` ([`Planner::holds_fresh`]), and the
    /// shared state is reachable: known without a transaction.
    fn claim_is_fresh(&self, dispatch: &super::Dispatch) -> bool {
        let now = self.now();
        let fresh = lock(&self.planner).holds_fresh(dispatch, now);
        fresh && !self.in_outage() && lock(&self.unsaved).is_none()
    }

    /// Queues `change` for the next transaction of [`Self::commit`], without waiting
    /// for it: a sender's outcome goes with the next claim (its own or another
    /// sender's) into one save, rather than a save each. Until then the kick stays in
    /// flight in the saved state; were this process to die first, it would be sent
    /// again after `kick.in_flight_timeout`, as when it dies right after sending.
    fn queue(&self, change: Change) {
        let (done, _) = std::sync::mpsc::sync_channel(1);
        lock(&self.commits).push((change, done));
    }

    /// The masterless helper of this cache dir, if one runs (`helper.json`).
    fn helper(&self) -> serde_json::Value {
        self.status_path.parent().map_or(serde_json::Value::Null, crate::helper_presence::describe)
    }

    fn log(&self, line: LogLine) {
        let mut log = lock(&self.log);
        if log.lines.len() < MAX_LOG_LINES {
            log.lines.push(line);
        } else {
            log.left_out = log.left_out.saturating_add(1);
        }
    }

    /// Saves the state as the next generation (the status file follows: see
    /// [`Self::write_status`]) and ends the store's transaction. A failure is logged
    /// once, and remembered so the next transaction (at the latest after
    /// `SAVE_RETRY`) tries again.
    fn persist(&self, store: &mut dyn StateStore, planner: &mut Planner) {
        let previous = planner.state().generation;
        planner.saved_as(planner.next_generation());
        let saved = store.commit(planner.state());
        let mut unsaved = lock(&self.unsaved);
        match (saved, unsaved.as_mut()) {
            (Ok(()), None) => {}
            (Ok(()), Some(failed)) => {
                self.log(LogLine {
                    level: Level::Notice,
                    message: format!(
                        "kick state saved to {} again, after {} failed attempt(s)",
                        self.store_name, failed.attempts
                    ),
                });
                *unsaved = None;
            }
            (Err(e), failed) => {
                planner.saved_as(previous);
                match failed {
                    Some(failed) => failed.attempts = failed.attempts.saturating_add(1),
                    None => {
                        self.log(LogLine {
                            level: Level::Err,
                            message: format!(
                                "cannot save kick state to {}: {e}; kept in memory, retrying every {}s",
                                self.store_name,
                                SAVE_RETRY.as_secs()
                            ),
                        });
                        *unsaved = Some(Unsaved { attempts: 1 });
                    }
                }
            }
        }
        drop(unsaved);
        self.status_dirty.store(true, Ordering::Release);
    }

    /// Rewrites `kick-status.json` from the planner, `when` says (see [`StatusWrite`]).
    /// Not synced: it is a view, rebuilt from the state at the next change.
    fn write_status(&self, when: StatusWrite) {
        // Taken before `status_dirty` is looked at: a write in progress (it cleared
        // the flag) has then ended, and the file is there.
        let mut written = match when {
            StatusWrite::IfDue => match self.status_written.try_lock() {
                Ok(written) if written.is_some_and(|at| at.elapsed() < STATUS_INTERVAL) => return,
                Ok(written) => written,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            },
            StatusWrite::IfChanged | StatusWrite::Always => lock(&self.status_written),
        };
        if when != StatusWrite::Always && !self.status_dirty.load(Ordering::Acquire) {
            return;
        }
        // Cleared before the status is built: a change made meanwhile sets it again.
        self.status_dirty.store(false, Ordering::Release);
        let status = {
            let store = self.state_json();
            let planner = lock(&self.planner);
            serde_json::to_vec_pretty(&status_json(&planner, self.now(), self.helper(), &store)).unwrap_or_default()
        };
        let _ = crate::atomic_file::write_unsynced(&self.status_path, &[&status, b"\n"]);
        *written = Some(Instant::now());
    }
}

/// Where one server's kick stands, as an operator waiting for it sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Not sent yet, or sent again later: `attempts` made so far, the last one's error.
    Queued { due: Millis, in_flight: bool, attempts: u32, last_error: Option<String>, held_by: Option<u32> },
    /// Its `runonce` started a run, not yet confirmed by its report.
    Started,
    /// Its run reported: `outcome` changed, unchanged, failed or reported (no status).
    Confirmed { outcome: String, after_ms: Option<Millis> },
    /// No report within `kick.confirm_within`.
    Unconfirmed,
    /// Given up (`result` as the status file records it: `failed: WHY`).
    Failed { why: String },
    /// Runs once more after the kicked run in progress reports.
    FollowUp,
    /// The state knows nothing of it (another process's view replaced it, or it was
    /// answered and its record pushed out of the recent outcomes).
    Unknown,
}

impl Progress {
    fn of(planner: &Planner, target: &str, since: Millis) -> Progress {
        let state = planner.state();
        let confirmed = state.confirmations.iter().rev().find(|c| c.target == target && c.at >= since);
        if let Some(confirmation) = confirmed {
            return match confirmation.outcome.as_str() {
                "unconfirmed" => Progress::Unconfirmed,
                outcome => Progress::Confirmed { outcome: outcome.to_string(), after_ms: confirmation.after_ms },
            };
        }
        let outcome = state.outcomes.iter().rev().find(|o| o.target == target && o.at >= since);
        if let Some(outcome) = outcome {
            return match outcome.result.strip_prefix("failed: ") {
                Some(why) => Progress::Failed { why: why.to_string() },
                None => Progress::Started,
            };
        }
        let Some(kicked) = state.targets.get(target) else { return Progress::Unknown };
        match (&kicked.pending, &kicked.running, &kicked.follow_up) {
            (Some(p), _, _) => Progress::Queued {
                due: p.due,
                in_flight: p.in_flight,
                attempts: p.attempts,
                last_error: p.last_error.clone(),
                held_by: state.holds.get(target).map(|h| h.pid),
            },
            (None, Some(_), Some(_)) => Progress::FollowUp,
            (None, Some(running), None) if running.started >= since => Progress::Started,
            _ => Progress::Unknown,
        }
    }
}

/// Lines waiting for the bindings, and how many did not fit.
struct Log {
    lines: Vec<LogLine>,
    left_out: u64,
}

/// A change not yet saved, and how often saving it failed.
struct Unsaved {
    attempts: u64,
}

fn dispatch_loop(inner: &Inner, wakeups: &Receiver<Wake>) {
    loop {
        let now = inner.now();
        let mut wait = lock(&inner.planner).next_wakeup().map_or(IDLE_WAKEUP, |at| {
            Duration::from_millis((at - now).clamp(0, IDLE_WAKEUP.as_millis() as i64) as u64)
        });
        if lock(&inner.unsaved).is_some() {
            wait = wait.min(SAVE_RETRY);
        }
        // The shared store is tried again (and what was kept merged) when its backoff ends.
        if let Some(outage) = &lock(&inner.health).outage {
            let until =
                Duration::from_millis((outage.retry_at - now_ms()).clamp(0, SAVE_RETRY.as_millis() as i64) as u64);
            wait = wait.min(until);
        }
        if lock(&inner.planner).holds().next().is_some() {
            wait = wait.min(HOLD_POLL);
        }
        if inner.status_dirty.load(Ordering::Acquire) {
            wait = wait.min(STATUS_INTERVAL);
        }
        if let Some((_, arrived)) = lock(&inner.endings).first() {
            let waited = Duration::from_millis((inner.now() - arrived).max(0) as u64);
            wait = wait.min(ENDINGS_DELAY.saturating_sub(waited));
        }
        let mut act = match wakeups.recv_timeout(wait) {
            Ok(wake) => wake == Wake::Now,
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        while let Ok(wake) = wakeups.try_recv() {
            act |= wake == Wake::Now;
        }
        if !act {
            continue;
        }
        let _ = catch_unwind(AssertUnwindSafe(|| dispatch_due(inner)));
        let _ = catch_unwind(AssertUnwindSafe(|| confirm_by_transport(inner)));
        let _ = catch_unwind(AssertUnwindSafe(|| inner.write_status(StatusWrite::IfChanged)));
    }
}

/// Asks the servers of kicks confirmed by the transport (`kick.confirm_by`) for
/// their last run, outside the planner's lock, and confirms those whose run ended.
fn confirm_by_transport(inner: &Inner) {
    let Some(transport) = inner.transport.as_ref().filter(|t| t.controls_agents()) else { return };
    // Most loops have nobody to ask: they take neither the file lock nor a stat, which
    // a report's transaction would wait for. (The loop's `dispatch_due` has just
    // brought the planner up to date with the state file.)
    if !lock(&inner.planner).any_to_ask(inner.now()) {
        return;
    }
    let ask = inner.transact(|planner| {
        let ask = planner.to_ask(inner.now());
        let changed = !ask.is_empty();
        (ask, changed)
    });
    if ask.is_empty() {
        return;
    }
    let answers: Vec<_> = ask
        .into_iter()
        .filter_map(|(certname, environment)| {
            let server = super::transport::Server { certname: &certname, environment: &environment };
            let last = catch_unwind(AssertUnwindSafe(|| transport.last_run(&server))).ok()?.ok()?;
            Some((certname, last))
        })
        .collect();
    inner.transact(|planner| {
        let now = inner.now();
        let mut changed = false;
        for (certname, last) in answers {
            let events = planner.on_last_run(&certname, last.at, last.status, now);
            changed |= !events.is_empty();
            events.iter().for_each(|e| inner.log(log_line(e)));
        }
        ((), changed)
    });
}

/// Sends what is due, outside the planner's lock (a `runonce` takes a round trip).
///
/// Events are logged inside the transaction: `flush` returns as soon as the planner
/// shows an outcome, and a `puppet apply` exits right after taking the log, so the
/// line must be in the log by the time the outcome is visible.
fn dispatch_due(inner: &Inner) {
    let workers = inner.transport.as_ref().map_or(1, |t| t.max_parallel()).max(1);
    // Claimed a round at a time, twice what is sent at once: a claim is sent soon
    // after it is made (no renewal needed), and with a shared state the other
    // compilers' dispatchers take the next rounds meanwhile.
    let round = workers.saturating_mul(2);
    let mut refreshed = false;
    loop {
        let dispatches = inner.transact(|planner| {
            let released = planner.release_exited(inner.now(), crate::process::alive);
            if inner.in_outage() {
                return (Vec::new(), released);
            }
            let (dispatches, events) = planner.due_at_most(inner.now(), round);
            events.iter().for_each(|e| inner.log(log_line(e)));
            let changed = released || !dispatches.is_empty() || !events.is_empty();
            (dispatches, changed)
        });
        if dispatches.is_empty() {
            return;
        }
        if !refreshed {
            (inner.before_dispatch)();
            refreshed = true;
        }
        let full = dispatches.len() >= round;
        send_all(inner, dispatches, workers);
        if !full {
            return;
        }
    }
}

/// Sends `dispatches`, up to `workers` at once, each worker taking the next in order.
fn send_all(inner: &Inner, dispatches: Vec<super::Dispatch>, workers: usize) {
    let send = |dispatch: super::Dispatch| {
        // Renewed (and saved) just before sending, so another process waits a whole
        // in-flight timeout from here, whatever came before in this batch; a claim
        // made within the last quarter of it needs no renewal (`Planner::claim`), and
        // no transaction: nobody else may take it over before it turns stale.
        if !inner.claim_is_fresh(&dispatch) && !inner.commit(Change::Claim(dispatch.clone())) {
            return;
        }
        let outcome = match &inner.transport {
            Some(transport) => catch_unwind(AssertUnwindSafe(|| transport.runonce(&dispatch)))
                .unwrap_or_else(|_| super::Outcome::Failed("internal error: the transport panicked".into())),
            None => super::Outcome::Failed(inner.transport_error.clone().unwrap_or_else(|| "no transport".into())),
        };
        inner.queue(Change::Outcome(dispatch.target, outcome));
    };
    let workers = workers.clamp(1, dispatches.len().max(1));
    if workers == 1 {
        dispatches.into_iter().for_each(send);
        inner.commit(Change::Nothing);
        return;
    }
    let queue = Mutex::new(dispatches.into_iter());
    let next = || lock(&queue).next();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let spawned = std::thread::Builder::new()
                .name("puppet-kicker-send".into())
                .spawn_scoped(scope, || std::iter::from_fn(next).for_each(send));
            if spawned.is_err() {
                break;
            }
        }
    });
    // Were no thread started, this thread sends them all.
    std::iter::from_fn(next).for_each(send);
    // The outcomes still queued are saved before the next round is claimed.
    inner.commit(Change::Nothing);
}

/// The kick state saved in `cache_dir`, read without starting a service (no
/// dispatcher, nothing sent or written); empty when there is none yet.
pub fn load_state(cache_dir: &Path) -> Result<PlannerState, KickError> {
    Ok(super::store::read_state(&cache_dir.join(STATE_FILE))?)
}

/// At most `cap` of `lines`, the most severe ones (a budget cut, a suppression) before
/// the routine ones (queued, would kick), each kept in its place.
fn most_severe_first(lines: Vec<LogLine>, cap: usize) -> Vec<LogLine> {
    if lines.len() <= cap {
        return lines;
    }
    let rank = |level: Level| match level {
        Level::Err => 0,
        Level::Warning => 1,
        Level::Notice => 2,
        Level::Info => 3,
    };
    let mut order: Vec<usize> = (0..lines.len()).collect();
    order.sort_by_key(|i| rank(lines[*i].level));
    let mut keep = vec![false; lines.len()];
    order.into_iter().take(cap).for_each(|i| keep[i] = true);
    lines.into_iter().zip(keep).filter(|(_, keep)| *keep).map(|(line, _)| line).collect()
}

fn log_line(event: &Event) -> LogLine {
    let level = match event {
        Event::Suppressed { .. }
        | Event::NoTargets { .. }
        | Event::RunTimedOut { .. }
        | Event::NewRoleCycle { .. }
        | Event::Unconfirmed { .. }
        | Event::Confirmed { status: Some(RunStatus::Failed), .. } => Level::Warning,
        Event::GaveUp { .. } => Level::Err,
        Event::Queued { .. }
        | Event::Started { .. }
        | Event::WouldKick { .. }
        | Event::FollowUp { .. }
        | Event::NotItself { .. } => Level::Notice,
        _ => Level::Info,
    };
    LogLine { level, message: event.to_string() }
}

/// The status document of `state` (as `kick-status.json` holds it), for a process
/// that read the state without starting a service (`puppet kicker status` with a
/// shared state); `store` as [`StateStore::describe`] says, `health` as it stands.
pub fn status_document(config: &KickConfig, state: PlannerState, store: &str, health: &Health) -> serde_json::Value {
    let now = now_ms() + health.clock_offset_ms;
    status_json(&Planner::new(config.clone(), state), now, serde_json::Value::Null, &state_json(store, health))
}

/// Where the state is kept, and whether it can be reached, for the status document.
fn state_json(store: &str, health: &Health) -> serde_json::Value {
    json!({
        "store": store,
        "shared": health.shared,
        "outage": health.outage.as_ref().map(|o| json!({"reason": o.reason, "since": o.since, "retry_at": o.retry_at})),
    })
}

fn status_json(
    planner: &Planner,
    now: Millis,
    helper: serde_json::Value,
    store: &serde_json::Value,
) -> serde_json::Value {
    let state = planner.state();
    let pending: Vec<_> = state
        .targets
        .iter()
        .flat_map(|(name, t)| {
            let entry = move |p: &super::planner::Pending, kind: &str| {
                json!({"target": name, "environment": t.environment, "kind": kind, "due": p.due, "attempts": p.attempts,
                       "in_flight": p.in_flight, "chain": p.chain.to_string(), "last_error": p.last_error})
            };
            t.pending
                .iter()
                .map(move |p| entry(p, "kick"))
                .chain(t.follow_up.iter().map(move |p| entry(p, "follow-up")))
        })
        .collect();
    let running: Vec<_> = state
        .targets
        .iter()
        .filter_map(|(name, t)| {
            t.running.as_ref().map(|r| json!({"target": name, "started": r.started, "chain": r.chain.to_string()}))
        })
        .collect();
    json!({
        "updated_at": now,
        "dry_run": planner.config().dry_run,
        "pending": pending,
        "running": running,
        "recent_outcomes": state.outcomes,
        "role_edges": state.graph.edges().map(|(from, to)| [from, to]).collect::<Vec<_>>(),
        "role_cycles": state.graph.cycles().collect::<Vec<_>>(),
        "role_cycles_left_out": state.graph.cycles_left_out(),
        "generation": state.generation,
        "pending_count": planner.undelivered(),
        "counters": state.counters,
        "awaiting_confirmation": state.awaiting.iter().map(|(target, a)| json!({"target": target, "kicked_at": a.kicked_at,
            "chain": a.chain.to_string()})).collect::<Vec<_>>(),
        "confirmations": state.confirmations,
        "holds": state.holds.iter().map(|(target, h)| json!({"target": target, "pid": h.pid, "since": h.since})).collect::<Vec<_>>(),
        "helper": helper,
        "state": store,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::tests::tempdir;

    #[test]
    fn an_unreadable_state_file_is_a_warning_naming_it_and_the_service_starts_empty() {
        let dir = tempdir("kick-state-corrupt");
        let path = dir.join(STATE_FILE);
        std::fs::write(&path, b"\xc1").unwrap();
        let err = crate::kick::decode_state(&path, b"\xc1").unwrap_err();
        assert!(matches!(err, StateError::Unreadable { .. }), "{err:?}");
        assert!(std::error::Error::source(&err).is_some_and(|s| s.is::<rmp_serde::decode::Error>()));

        let service = KickService::start(KickConfig::default(), &dir, Err(NoTransport::DryRun), Box::new(|| {}))
            .expect("the service starts without its state");
        let log = service.take_log();
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0].level, Level::Warning);
        assert_eq!(log[0].message, format!("{err}; starting without it"));
        assert!(log[0].message.starts_with(&format!("unreadable kick state {}: ", path.display())));
    }

    #[test]
    fn a_kick_service_that_cannot_start_is_an_io_error_for_ruby() {
        let err = KickError::StartDispatcher { source: io::Error::from(io::ErrorKind::OutOfMemory) };
        let core = crate::Error::Kick(Arc::new(err));
        assert_eq!(core.kind(), crate::error::Kind::Io, "Ruby's PuppetKicker::IoError, as before");
        assert!(core.to_string().starts_with("cannot start the kick dispatcher: "), "{core}");
        let cause = std::error::Error::source(&core).and_then(|s| s.downcast_ref::<io::Error>());
        assert_eq!(cause.map(io::Error::kind), Some(io::ErrorKind::OutOfMemory));
        assert_eq!(NoTransport::DryRun.to_string(), "dry run");
    }
}
