//! The process-wide service the bindings call: one per Puppet process, shared by
//! every compile and (under puppetserver) every JRuby instance.
//!
//! A compile reads the current index through an atomic pointer and never waits for
//! a refresh, except on a cold start with no snapshot at all. Refreshes run on one
//! background thread fed through a channel; they read the fact source, build a new
//! index, swap it in and write the snapshot.

use crate::config::{Config, OnNoData, PuppetSettings, SourceKind};
use crate::error::{Error, Result};
use crate::facts::Node;
use crate::index::{Freshness, Index, RoleSelector};
use crate::kick::{KickService, Level, LogLine, McoTransport, ReportKicks, Selector, Target, Transport};
use crate::query::ClauseCache;
use crate::snapshot::{self, SnapshotRef};
use crate::source::mcollective::McollectiveSource;
use crate::source::{puppet_cache, Harvest};
use crate::time::now;
use arc_swap::ArcSwapOption;
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Distinct clauses kept compiled; manifests use a few dozen.
const CLAUSE_CACHE_SIZE: usize = 1024;
/// An empty index is not refreshed again on every compile: at most this often.
const EMPTY_RETRY_SECONDS: i64 = 5;
/// Warnings kept for the bindings to log; newer ones are dropped, counted.
const MAX_PENDING_WARNINGS: usize = 256;
/// A refresh reading the fact cache has no network deadline; past this it is hung.
const PUPPET_CACHE_WORST_CASE: Duration = Duration::from_secs(300);
/// Refresh threads declared hung that may linger; past this, no new one is started.
const MAX_ABANDONED_REFRESHES: usize = 4;
/// Held by the process refreshing a cache dir: one refresh at a time across the
/// processes sharing it (concurrent `puppet apply` runs, the masterless helper).
pub const REFRESH_LOCK: &str = "refresh.lock";

pub struct Kicker {
    settings: PuppetSettings,
    shared: Arc<Shared>,
    clauses: ClauseCache,
    refresh: Sender<Refresh>,
    /// Started by the first report that reaches the `kick` processor.
    kicks: OnceLock<Result<KickService, String>>,
}

/// State the refresh thread and the compiles share.
struct Shared {
    config: Config,
    current: ArcSwapOption<Index>,
    refresh_state: Mutex<RefreshState>,
    /// Unix seconds when the last refresh finished, well or not.
    last_finished: AtomicI64,
    last_error: Mutex<Option<String>>,
    warnings: Mutex<Warnings>,
    seen_environments: Mutex<BTreeMap<String, String>>,
    /// Refreshes failed in a row, and the Unix second before which a compile does not
    /// start another (0: no backoff).
    failures: AtomicU32,
    retry_at: AtomicI64,
    /// `source: mcollective`: the client, from the operator's client.cfg.
    mcollective: Option<McollectiveSource>,
    /// Where refresh threads take their work (a new thread replaces a hung one).
    requests: Receiver<Refresh>,
    /// A refresh's worst case, network deadlines included.
    worst_case: Duration,
}

/// Warnings waiting for the bindings, and how many did not fit.
#[derive(Default)]
struct Warnings {
    pending: Vec<String>,
    left_out: u64,
}

/// Wakes a refresh thread to run refresh number `.0` (see `RefreshState::ticket`).
struct Refresh(u64);

/// Whether a refresh is queued or running, and who waits for it to finish. One lock,
/// so a waiter can never register just after the refresh it waits for has ended.
struct RefreshState {
    in_flight: bool,
    waiters: Vec<Sender<()>>,
    /// The number of the latest refresh requested; an older one that finishes late
    /// (declared hung) changes nothing.
    ticket: u64,
    /// When the refresh in flight was requested.
    since: Option<Instant>,
    /// A refresh in flight for longer is declared hung: far beyond its worst case.
    stuck_after: Duration,
    /// Refresh threads declared hung and not finished yet.
    abandoned: usize,
}

/// Servers selected by a query: positions into the index they were read from, which
/// stays alive (and unchanged) as long as the selection does.
pub struct Selection {
    index: Option<Arc<Index>>,
    positions: Vec<u32>,
}

impl Selection {
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// The index generation and positions of the selected servers, for bindings
    /// that cache converted servers per generation.
    pub fn positions(&self) -> (u64, &[u32]) {
        (self.index.as_ref().map_or(0, |i| i.generation()), &self.positions)
    }

    /// The server at `position` of the index this selection came from.
    pub fn node_at(&self, position: u32) -> Option<&Node> {
        self.index.as_deref().filter(|i| (position as usize) < i.len()).map(|i| i.node(position))
    }

    pub fn nodes(&self) -> impl ExactSizeIterator<Item = &Node> + '_ {
        let index = self.index.as_deref();
        self.positions.iter().map(move |p| index.expect("positions come from an index").node(*p))
    }
}

/// What `status` reports, for operators and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub servers: usize,
    pub built_at: Option<i64>,
    pub last_error: Option<String>,
    pub config_file: Option<PathBuf>,
    pub cache_dir: PathBuf,
    /// Refreshes failed in a row (0 after a good one).
    pub failures: u32,
    /// While failing: no refresh is started by a compile before this Unix second.
    pub retry_at: Option<i64>,
}

static GLOBAL: Mutex<Option<Arc<Kicker>>> = Mutex::new(None);

impl Kicker {
    /// The process-wide instance for these settings: reused when they are unchanged,
    /// replaced (configuration re-read) when they differ.
    pub fn configure(settings: PuppetSettings) -> Result<Arc<Kicker>> {
        let mut global = lock(&GLOBAL);
        if let Some(kicker) = global.as_ref().filter(|k| k.settings == settings) {
            return Ok(kicker.clone());
        }
        let kicker = Arc::new(Kicker::start(settings)?);
        *global = Some(kicker.clone());
        Ok(kicker)
    }

    /// The instance `configure` made last.
    pub fn global() -> Result<Arc<Kicker>> {
        lock(&GLOBAL).clone().ok_or_else(|| Error::Config("puppet-kicker is not configured yet".into()))
    }

    /// Reads the configuration and the snapshot, and starts the refresh thread.
    pub fn start(settings: PuppetSettings) -> Result<Kicker> {
        let config = Config::load(&settings)?;
        let mcollective = match config.source {
            SourceKind::Mcollective => Some(McollectiveSource::open(&config.mcollective)?),
            SourceKind::PuppetCache => None,
        };
        // Every network wait of a refresh is bounded; twice the worst case and a
        // minute more means something below us (resolver, file system) hangs.
        let worst_case = mcollective.as_ref().map_or(PUPPET_CACHE_WORST_CASE, McollectiveSource::worst_case);
        let stuck_after = worst_case.saturating_mul(2).saturating_add(Duration::from_secs(60));
        let (refresh, requests) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared {
            current: ArcSwapOption::empty(),
            refresh_state: Mutex::new(RefreshState {
                in_flight: false,
                waiters: Vec::new(),
                ticket: 0,
                since: None,
                stuck_after,
                abandoned: 0,
            }),
            last_finished: AtomicI64::new(0),
            last_error: Mutex::new(None),
            warnings: Mutex::new(Warnings::default()),
            seen_environments: Mutex::new(BTreeMap::new()),
            failures: AtomicU32::new(0),
            retry_at: AtomicI64::new(0),
            mcollective,
            requests,
            config,
            worst_case,
        });
        match snapshot::read(&snapshot::path_in(&shared.config.cache_dir)) {
            Ok(Some(snap)) => {
                *lock(&shared.seen_environments) = snap.seen_environments;
                let index = Index::build(snap.nodes, &shared.config.role_fact, snap.built_at);
                shared.current.store(Some(Arc::new(index)));
            }
            Ok(None) => {}
            Err(warning) => shared.warn(warning),
        }
        start_refresh_thread(&shared).map_err(|e| Error::Io(format!("cannot start the refresh thread: {e}")))?;
        Ok(Kicker { settings, shared, clauses: ClauseCache::new(CLAUSE_CACHE_SIZE), refresh, kicks: OnceLock::new() })
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// `servers_with_role`: servers of `environment` with any of the roles.
    pub fn servers_with_role(&self, roles: &RoleSelector, environment: &str) -> Result<Selection> {
        let Some(index) = self.index()? else {
            return Ok(Selection::empty());
        };
        let positions = index.with_role(roles, environment, self.freshness());
        Ok(Selection { index: Some(index), positions })
    }

    /// `servers_with_facts`: servers matching every clause.
    pub fn servers_with_facts<S: AsRef<str>>(&self, clauses: &[S], environment: &str) -> Result<Selection> {
        let query = self.clauses.compile(clauses)?;
        let Some(index) = self.index()? else {
            return Ok(Selection::empty());
        };
        let positions = index.with_facts(&query, environment, &self.shared.config.role_fact, self.freshness());
        Ok(Selection { index: Some(index), positions })
    }

    /// The servers at `positions` of the current index, if it is still `generation`
    /// (a binding fetching what it has not cached of an earlier selection).
    pub fn servers_at(&self, generation: u64, positions: &[u32]) -> Option<Selection> {
        let index = self.shared.current.load_full()?;
        if index.generation() != generation || positions.iter().any(|p| *p as usize >= index.len()) {
            return None;
        }
        Some(Selection { index: Some(index), positions: positions.to_vec() })
    }

    /// Records where a certname compiled, for servers whose facts name no environment.
    pub fn note_environment(&self, certname: &str, environment: &str) {
        let mut seen = lock(&self.shared.seen_environments);
        if seen.get(certname).map(String::as_str) != Some(environment) {
            seen.insert(certname.to_string(), environment.to_string());
        }
    }

    /// Starts a refresh, or joins the one in flight, and waits up to `timeout` for
    /// it to finish; true when it did.
    pub fn refresh_and_wait(&self, timeout: Duration) -> bool {
        refresh_and_wait(&self.shared, &self.refresh, timeout)
    }

    /// How long a refresh may take at worst (every network deadline added up).
    pub fn refresh_worst_case(&self) -> Duration {
        self.shared.worst_case
    }

    /// What this process leaves undone if it exits now: `refresh` while a refresh
    /// is in flight, `kicks` while kicks wait to be delivered. A short-lived process
    /// (`puppet apply`) hands these to the masterless helper (see [`crate::helper`]).
    pub fn work_left(&self) -> Vec<&'static str> {
        let mut work = Vec::new();
        if lock(&self.shared.refresh_state).in_flight {
            work.push("refresh");
        }
        if let Some(Ok(service)) = self.kicks.get() {
            if service.undelivered() > 0 {
                work.push("kicks");
            }
        }
        work
    }

    /// The kick service, started if it is not yet (for the masterless helper).
    pub fn kicks(&self) -> Result<&KickService> {
        self.kick_service()
    }

    /// Warnings from refreshes and snapshot reads since the last call, for logging.
    pub fn take_warnings(&self) -> Vec<String> {
        let mut warnings = lock(&self.shared.warnings);
        let mut pending = std::mem::take(&mut warnings.pending);
        if warnings.left_out > 0 {
            pending.push(format!(
                "{} more puppet-kicker warnings left out (at most {MAX_PENDING_WARNINGS} wait to be logged)",
                warnings.left_out
            ));
            warnings.left_out = 0;
        }
        pending
    }

    pub fn status(&self) -> Status {
        let index = self.shared.current.load_full();
        Status {
            servers: index.as_ref().map_or(0, |i| i.len()),
            built_at: index.as_ref().map(|i| i.built_at()),
            last_error: lock(&self.shared.last_error).clone(),
            config_file: self.shared.config.file.clone(),
            cache_dir: self.shared.config.cache_dir.clone(),
            failures: self.shared.failures.load(Ordering::SeqCst),
            retry_at: Some(self.shared.retry_at.load(Ordering::SeqCst)).filter(|t| *t > 0),
        }
    }

    /// Takes in a report's kicks: resolves their targets in the index, lets the
    /// planner decide, and returns what to log. Dispatch happens in the background.
    pub fn kick_report(&self, report: &ReportKicks) -> Result<Vec<LogLine>> {
        let service = self.kick_service()?;
        let mut index = if report.kicks.is_empty() { self.shared.current.load_full() } else { self.index()? };
        // A server new to the index kicks on its first run: learn its role (policy,
        // role graph) before deciding, bounded like a cold start.
        if !report.kicks.is_empty() && index.as_deref().is_some_and(|i| i.by_certname(&report.host).is_none()) {
            self.refresh_and_wait(Duration::from_secs(self.shared.config.cold_start_timeout));
            index = self.shared.current.load_full().or(index);
        }
        let role_fact = &self.shared.config.role_fact;
        let role_of = |node: &Node| node.facts.get(role_fact).and_then(|r| r.as_str()).map(str::to_string);
        let fresh = self.freshness();
        let mut errors = Vec::new();
        let resolve = |selector: &Selector, environment: &str| -> Vec<Target> {
            let Some(index) = index.as_deref() else { return Vec::new() };
            let positions = match selector {
                Selector::Roles(roles) => RoleSelector::parse(roles).map(|r| index.with_role(&r, environment, fresh)),
                Selector::Facts(clauses) => {
                    self.clauses.compile(clauses).map(|q| index.with_facts(&q, environment, role_fact, fresh))
                }
            };
            match positions {
                Ok(positions) => positions
                    .into_iter()
                    .map(|p| index.node(p))
                    .map(|node| Target { certname: node.certname.clone(), role: role_of(node) })
                    .collect(),
                Err(e) => {
                    errors.push(LogLine { level: Level::Err, message: format!("kick from {}: {e}", report.host) });
                    Vec::new()
                }
            }
        };
        let source_role = |host: &str| index.as_deref().and_then(|i| i.by_certname(host)).and_then(role_of);
        let mut lines = service.report(report, resolve, source_role);
        lines.append(&mut errors);
        Ok(lines)
    }

    /// Waits (bounded by `kick.exit_wait`) for due kicks to be sent; for processes
    /// about to exit. Returns what to log, including how many kicks wait for later.
    pub fn kick_flush(&self) -> Vec<LogLine> {
        let Some(Ok(service)) = self.kicks.get() else { return Vec::new() };
        let undelivered = service.flush(self.shared.config.kick.exit_wait);
        let mut lines = service.take_log();
        if undelivered > 0 {
            let file = self.shared.config.cache_dir.join(crate::kick::STATE_FILE);
            lines.push(LogLine {
                level: Level::Notice,
                message: format!(
                    "{undelivered} kick(s) not yet delivered, kept in {} for the next run",
                    file.display()
                ),
            });
        }
        lines
    }

    /// Lines the kick dispatcher logged since the last call.
    pub fn take_kick_log(&self) -> Vec<LogLine> {
        match self.kicks.get() {
            Some(Ok(service)) => service.take_log(),
            _ => Vec::new(),
        }
    }

    /// The kick status document, as in `kick-status.json`.
    pub fn kick_status(&self) -> Result<serde_json::Value> {
        Ok(self.kick_service()?.status())
    }

    fn kick_service(&self) -> Result<&KickService> {
        let config = &self.shared.config;
        let started = self.kicks.get_or_init(|| {
            let transport: std::result::Result<Box<dyn Transport>, String> = if config.kick.planner.dry_run {
                Err("dry run".to_string())
            } else {
                config
                    .mcollective
                    .client_config()
                    .map(|mco| {
                        let client = crate::mcollective::Client::new(mco);
                        Box::new(McoTransport::new(client, config.kick.agent.clone(), config.kick.reply_timeout))
                            as Box<dyn Transport>
                    })
                    .map_err(|e| format!("mcollective is not usable for kicks: {e}"))
            };
            // A kicked server must see what changed: refresh the index before each
            // dispatch (bounded), so its compile (here, or from the snapshot) is fresh.
            let (shared, refresh) = (self.shared.clone(), self.refresh.clone());
            let timeout = Duration::from_secs(config.cold_start_timeout);
            let before_dispatch = Box::new(move || {
                refresh_and_wait(&shared, &refresh, timeout);
            });
            KickService::start(config.kick.planner.clone(), &config.cache_dir, transport, before_dispatch)
        });
        started.as_ref().map_err(|e| Error::Io(e.clone()))
    }

    /// The index to answer from, per the no-data policy. Never waits when any
    /// non-empty index exists; starts a background refresh when it is older than
    /// `cache.ttl`.
    fn index(&self) -> Result<Option<Arc<Index>>> {
        let config = &self.shared.config;
        let mut index = self.shared.current.load_full();
        match &index {
            Some(current) if !current.is_empty() => {
                if now() - current.built_at() >= config.cache_ttl as i64 && self.backoff_over() {
                    self.request_refresh();
                }
            }
            _ => {
                // No data: wait for a refresh, unless one just failed or found nothing.
                let in_flight = lock(&self.shared.refresh_state).in_flight;
                let last_finished = self.shared.last_finished.load(Ordering::SeqCst);
                if in_flight || (now() - last_finished >= EMPTY_RETRY_SECONDS && self.backoff_over()) {
                    self.refresh_and_wait(Duration::from_secs(config.cold_start_timeout));
                    index = self.shared.current.load_full();
                }
            }
        }
        match index {
            Some(index) if !index.is_empty() => Ok(Some(index)),
            _ if config.on_no_data == OnNoData::Empty => Ok(None),
            _ => Err(Error::NoData(self.no_data_message())),
        }
    }

    fn no_data_message(&self) -> String {
        let config = &self.shared.config;
        let source = match config.source {
            SourceKind::PuppetCache => format!(
                "the puppet_cache source ({})",
                config.puppet_cache_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
            SourceKind::Mcollective => self.shared.mcollective.as_ref().map_or_else(String::new, |m| m.describe()),
        };
        let why = match lock(&self.shared.last_error).as_deref() {
            Some(error) => format!("the last refresh failed: {error}"),
            None if self.shared.current.load().is_some() => format!("{source} holds no server"),
            None => format!("{source} did not answer within {}s", config.cold_start_timeout),
        };
        let file = config.file.as_ref().map_or("puppet_kicker.yaml".to_string(), |f| f.display().to_string());
        format!("puppet-kicker has no fact data, so it will not return an empty list of servers: {why}. Set `on_no_data: empty` in {file} to return [] instead")
    }

    /// False while failed refreshes back off.
    fn backoff_over(&self) -> bool {
        now() >= self.shared.retry_at.load(Ordering::SeqCst)
    }

    fn freshness(&self) -> Freshness {
        Freshness { now: now(), max_age: self.shared.config.max_age }
    }

    fn request_refresh(&self) {
        request_refresh(&self.shared, &self.refresh);
    }
}

/// Starts a refresh unless one is in flight. One in flight far beyond its worst
/// case is declared hung: logged, left to finish on its own thread (its result is
/// then discarded), and a new thread takes this refresh, so a hang below us (a
/// resolver, a file system) never stops refreshes for good.
fn request_refresh(shared: &Arc<Shared>, refresh: &Sender<Refresh>) {
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

fn start_refresh_thread(shared: &Arc<Shared>) -> std::io::Result<()> {
    let worker = shared.clone();
    std::thread::Builder::new().name("puppet-kicker-refresh".into()).spawn(move || refresh_loop(&worker)).map(drop)
}

fn refresh_and_wait(shared: &Arc<Shared>, refresh: &Sender<Refresh>, timeout: Duration) -> bool {
    let (done, finished) = crossbeam_channel::bounded(1);
    lock(&shared.refresh_state).waiters.push(done);
    request_refresh(shared, refresh);
    finished.recv_timeout(timeout).is_ok()
}

impl Selection {
    fn empty() -> Selection {
        Selection { index: None, positions: Vec::new() }
    }
}

impl Shared {
    fn warn(&self, warning: String) {
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
    /// `ticket` changes nothing once a newer one replaced it.
    fn refresh(&self, ticket: u64) -> Result<()> {
        let lock_path = self.config.cache_dir.join(REFRESH_LOCK);
        // A refused cache dir is warned about where the snapshot is written.
        let lockable = crate::cache_dir::ensure(&self.config.cache_dir).is_ok();
        let wait = self.worst_case.saturating_add(Duration::from_secs(10));
        let requested = now();
        let contended = lockable && matches!(crate::process::try_lock(&lock_path), Ok(None));
        let taken = if lockable { crate::process::lock_within(&lock_path, wait) } else { Ok(None) };
        let _held = match taken {
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
        if contended && self.adopt_fresher_snapshot(ticket, requested) {
            return Ok(());
        }
        let started = now();
        let harvest: Harvest = match (self.config.source, &self.mcollective) {
            (SourceKind::Mcollective, Some(mcollective)) => {
                mcollective.refresh(self.current.load().as_deref(), started)?
            }
            _ => puppet_cache::load(&self.config.puppet_cache_dirs)?,
        };
        for warning in harvest.warnings {
            self.warn(warning);
        }
        let seen = lock(&self.seen_environments).clone();
        let mut nodes: Vec<Node> = harvest
            .observations
            .into_iter()
            .map(|o| {
                let seen_env = seen.get(&o.certname).map(String::as_str);
                o.into_node(seen_env)
            })
            .collect();
        nodes.extend(harvest.kept);
        let index = Index::build(nodes, &self.config.role_fact, started);
        if !self.is_current(ticket) {
            return Ok(());
        }
        let snap = SnapshotRef { built_at: started, nodes: index.nodes(), seen_environments: &seen };
        if let Err(warning) = snapshot::write(&snapshot::path_in(&self.config.cache_dir), &snap) {
            self.warn(warning);
        }
        let state = lock(&self.refresh_state);
        if state.ticket == ticket {
            self.current.store(Some(Arc::new(index)));
        }
        Ok(())
    }
}

impl Shared {
    /// Takes the snapshot another process wrote while this one waited for the
    /// refresh lock, when it is newer than the index and younger than `cache.ttl`:
    /// that refresh just happened, and doing it again would only load the fleet.
    fn adopt_fresher_snapshot(&self, ticket: u64, requested: i64) -> bool {
        let path = snapshot::path_in(&self.config.cache_dir);
        let current = self.current.load().as_ref().map_or(i64::MIN, |i| i.built_at());
        let written = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        let written = written.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs() as i64);
        if written.is_none_or(|w| w < current.max(requested) || now() - w >= self.config.cache_ttl as i64) {
            return false;
        }
        let Ok(Some(snap)) = snapshot::read(&path) else { return false };
        if snap.built_at <= current || now() - snap.built_at >= self.config.cache_ttl as i64 || snap.nodes.is_empty() {
            return false;
        }
        let mut seen = lock(&self.seen_environments);
        for (certname, environment) in snap.seen_environments {
            seen.entry(certname).or_insert(environment);
        }
        drop(seen);
        let index = Index::build(snap.nodes, &self.config.role_fact, snap.built_at);
        let state = lock(&self.refresh_state);
        if state.ticket == ticket {
            self.current.store(Some(Arc::new(index)));
        }
        true
    }
}

fn refresh_loop(shared: &Shared) {
    while let Ok(Refresh(ticket)) = shared.requests.recv() {
        let outcome = catch_unwind(AssertUnwindSafe(|| shared.refresh(ticket)))
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
        match outcome {
            Ok(()) => {
                *last_error = None;
                shared.failures.store(0, Ordering::SeqCst);
                shared.retry_at.store(0, Ordering::SeqCst);
            }
            Err(e) => {
                let failures = shared.failures.fetch_add(1, Ordering::SeqCst).saturating_add(1);
                let delay = backoff(failures, shared.config.retry_min, shared.config.retry_max);
                shared.retry_at.store(now().saturating_add(delay as i64), Ordering::SeqCst);
                let serving = if shared.current.load().as_ref().is_some_and(|i| !i.is_empty()) {
                    "still serving the last snapshot"
                } else {
                    "no snapshot to serve yet"
                };
                shared.warn(format!(
                    "puppet-kicker refresh failed ({failures} in a row; {serving}; next try in {delay}s at the earliest): {e}"
                ));
                *last_error = Some(e.to_string());
            }
        }
        drop(last_error);
        shared.last_finished.store(now(), Ordering::SeqCst);
        let waiters = {
            let mut state = lock(&shared.refresh_state);
            if state.ticket != ticket {
                // Declared hung just now: the newer refresh wakes the waiters.
                state.abandoned = state.abandoned.saturating_sub(1);
                return;
            }
            state.in_flight = false;
            state.since = None;
            std::mem::take(&mut state.waiters)
        };
        for waiter in waiters {
            let _ = waiter.send(());
        }
    }
}

/// Seconds to wait after `failures` failed refreshes in a row: `min`, doubled per
/// further failure, at most `max`.
fn backoff(failures: u32, min: u64, max: u64) -> u64 {
    let max = max.max(min);
    min.saturating_mul(1u64 << failures.saturating_sub(1).min(32)).min(max)
}

/// Locks, ignoring poisoning: every critical section here leaves its data whole.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Kept for bindings that want the version they loaded.
pub fn version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| format!("{} (index format {})", env!("CARGO_PKG_VERSION"), snapshot::FORMAT_VERSION))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A refresh that hangs (here: on a lock the test holds, as it could on a hung
    /// file system) is declared hung once past `stuck_after`; the next request
    /// starts a new refresh on a new thread instead of waiting forever, and the
    /// hung one, when it ends, changes nothing.
    #[test]
    fn a_hung_refresh_never_blocks_later_ones() {
        let root = std::env::temp_dir().join(format!("pk-service-hung-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let (etc, facts) = (root.join("etc"), root.join("facts"));
        fs::create_dir_all(&etc).unwrap();
        fs::create_dir_all(&facts).unwrap();
        let config =
            format!("puppet_cache:\n  dirs: [{}]\ncache:\n  dir: {}\n", facts.display(), root.join("cache").display());
        fs::write(etc.join("puppet_kicker.yaml"), config).unwrap();
        let settings = PuppetSettings { confdir: etc, vardir: root.join("var"), ..Default::default() };
        let kicker = Kicker::start(settings).unwrap();
        let state = || lock(&kicker.shared.refresh_state);
        let counts = || {
            let s = state();
            (s.ticket, s.abandoned)
        };
        assert_eq!(state().stuck_after, Duration::from_secs(660));

        let hang = lock(&kicker.shared.seen_environments);
        kicker.request_refresh();
        std::thread::sleep(Duration::from_millis(200));
        assert!(state().in_flight);
        // Within the limit, a request joins the refresh in flight.
        assert!(!kicker.refresh_and_wait(Duration::from_millis(200)));
        assert_eq!(counts(), (1, 0));
        assert!(kicker.take_warnings().is_empty());

        state().stuck_after = Duration::from_millis(100);
        kicker.request_refresh();
        assert_eq!(counts(), (2, 1));
        let warnings = kicker.take_warnings();
        assert!(
            warnings.iter().any(|w| w.contains("is still running, far beyond") && w.contains("starting another")),
            "{warnings:?}"
        );

        // The hang ends: the new refresh completes, the old one is discarded.
        drop(hang);
        let start = Instant::now();
        while state().in_flight || counts().1 > 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "refreshes did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
        let warnings = kicker.take_warnings();
        assert!(warnings.iter().any(|w| w.contains("finished after all; its result was discarded")), "{warnings:?}");
        assert!(kicker.shared.current.load_full().is_some());
        assert!(kicker.refresh_and_wait(Duration::from_secs(10)), "refreshes go on");
        assert_eq!(state().ticket, 3);
        let _ = fs::remove_dir_all(&root);
    }
}
