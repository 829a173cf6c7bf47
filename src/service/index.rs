//! The index service: the fact index every compile reads, kept fresh in the
//! background (see [`super::refresh`]), and the no-data rule.
//!
//! A compile reads the current index through an atomic pointer and never waits for
//! a refresh, except on a cold start with no snapshot at all.

use super::record::{self, Recorded, RefreshRecord};
use super::refresh::{self, Refresh, RefreshState, Shared, Warnings};
use super::MAX_PENDING_WARNINGS;
use crate::config::{Config, OnNoData, PuppetSettings};
use crate::error::{Error, Result};
use crate::index::{Answer, Freshness, Index, Question, RoleSelector, ServerRef};
use crate::query::ClauseCache;
use crate::snapshot;
use crate::time::now;
use crate::unpoisoned::lock;
use arc_swap::ArcSwapOption;
use crossbeam_channel::Sender;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Distinct clauses kept compiled; manifests use a few dozen.
const CLAUSE_CACHE_SIZE: usize = 1024;
/// An empty index is not refreshed again on every compile: at most this often.
const EMPTY_RETRY_SECONDS: i64 = 5;

/// The fact index of one Puppet process, its refreshes and its queries.
pub struct IndexService {
    pub(super) settings: PuppetSettings,
    pub(super) shared: Arc<Shared>,
    pub(super) clauses: ClauseCache,
    pub(super) refresh: Sender<Refresh>,
}

/// Servers selected by a query: positions into the index they were read from, which
/// stays alive (and unchanged) as long as the selection does.
pub struct Selection {
    index: Option<Arc<Index>>,
    answer: Option<Arc<Answer>>,
    positions: Vec<u32>,
}

impl Selection {
    fn of(index: Arc<Index>, answer: Arc<Answer>) -> Selection {
        Selection { index: Some(index), answer: Some(answer), positions: Vec::new() }
    }

    fn positions_slice(&self) -> &[u32] {
        self.answer.as_deref().map_or(&self.positions, |a| &a.positions)
    }

    pub fn len(&self) -> usize {
        self.positions_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions_slice().is_empty()
    }

    /// The index generation and positions of the selected servers, for bindings
    /// that cache converted servers per generation.
    pub fn positions(&self) -> (u64, &[u32]) {
        (self.index.as_ref().map_or(0, |i| i.generation()), self.positions_slice())
    }

    /// Same id, same answer: an identical call within a generation, while no
    /// selected server has aged out, gets the answer it got before (a binding may
    /// return the same frozen Array). 0 for a selection that is not a kept answer.
    pub fn answer_id(&self) -> u64 {
        self.answer.as_ref().map_or(0, |a| a.id)
    }

    /// How many positions, string ids and value ids the index this selection came
    /// from has: the sizes of a binding's tables by id (all 0 for an empty one).
    pub fn id_counts(&self) -> (usize, usize, usize) {
        self.index.as_deref().map_or((0, 0, 0), |i| (i.len(), i.store().strings(), i.store().values()))
    }

    /// The server at `position` of the index this selection came from.
    pub fn server_at(&self, position: u32) -> Option<ServerRef<'_>> {
        self.index.as_deref().filter(|i| (position as usize) < i.len()).map(|i| i.server(position))
    }

    /// The servers of this selection at the positions `keep` accepts, in the same
    /// order: not a kept answer (id 0).
    pub fn retain(self, keep: impl Fn(u32) -> bool) -> Selection {
        let positions = self.positions_slice().iter().copied().filter(|p| keep(*p)).collect();
        Selection { index: self.index, answer: None, positions }
    }

    /// The selected servers, in result order.
    pub fn servers(&self) -> impl Iterator<Item = ServerRef<'_>> + '_ {
        // A selection with positions always has its index; an empty one has neither.
        let positions = self.positions_slice();
        self.index.as_deref().into_iter().flat_map(move |index| positions.iter().map(|p| index.server(*p)))
    }
}

/// What `status` reports, for operators and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub servers: usize,
    /// Heap bytes the index holds (store, rows, maps, path indexes, kept answers).
    pub index_bytes: usize,
    pub built_at: Option<i64>,
    pub last_error: Option<String>,
    pub config_file: Option<PathBuf>,
    pub cache_dir: PathBuf,
    /// Refreshes failed in a row (0 after a good one).
    pub failures: u32,
    /// While failing: no refresh is started by a compile before this Unix second.
    pub retry_at: Option<i64>,
}

impl IndexService {
    /// Reads the configuration and the snapshot, and starts the refresh thread.
    pub fn start(settings: PuppetSettings) -> Result<IndexService> {
        let config = Config::load(&settings)?;
        let source = crate::source::open(config.source, &config.sources)?;
        // Every network wait of a refresh is bounded; twice the worst case and a
        // minute more means something below us (resolver, file system) hangs.
        let worst_case = source.worst_case();
        let stuck_after = worst_case.saturating_mul(2).saturating_add(Duration::from_secs(60));
        let (refresh, requests) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared {
            current: ArcSwapOption::empty(),
            refresh_state: Mutex::new(RefreshState {
                in_flight: false,
                waiters: Vec::new(),
                failure_reported: false,
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
            source,
            requests,
            config,
            worst_case,
            progress: AtomicUsize::new(0),
            last_record: Mutex::new(None),
            #[cfg(test)]
            reused: AtomicUsize::new(0),
        });
        match snapshot::read(&snapshot::path_in(&shared.config.cache_dir), &shared.config.role_fact) {
            Ok(Some(snap)) => {
                *lock(&shared.seen_environments) = snap.seen_environments;
                shared.current.store(Some(Arc::new(snap.index)));
            }
            Ok(None) => {}
            Err(warning) => shared.warn(warning.to_string()),
        }
        refresh::start_refresh_thread(&shared).map_err(|e| Error::system("cannot start the refresh thread", e))?;
        Ok(IndexService { settings, shared, clauses: ClauseCache::new(CLAUSE_CACHE_SIZE), refresh })
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// `servers_with_role`: servers of `environment` with any of the roles (names,
    /// or `/regex/` on the role fact).
    pub fn servers_with_role<S: AsRef<str>>(&self, roles: &[S], environment: &str) -> Result<Selection> {
        // Bad arguments are reported before missing data, as for clauses.
        let index = match self.index() {
            Ok(index) => index,
            Err(no_data) => return Err(RoleSelector::parse(roles).err().unwrap_or(no_data)),
        };
        let Some(index) = index else {
            RoleSelector::parse(roles)?;
            return Ok(Selection::empty());
        };
        let question = Question::Role { roles: owned(roles), environment: environment.to_string() };
        let fresh = self.freshness();
        let answer = index.answer(question, fresh, || {
            Ok::<_, Error>(index.with_role(&RoleSelector::parse(roles)?, environment, fresh))
        })?;
        Ok(Selection::of(index, answer))
    }

    /// `servers_with_facts`: servers matching every clause.
    pub fn servers_with_facts<S: AsRef<str>>(&self, clauses: &[S], environment: &str) -> Result<Selection> {
        let query = self.clauses.compile(clauses)?;
        let Some(index) = self.index()? else {
            return Ok(Selection::empty());
        };
        let question = Question::Facts { clauses: owned(clauses), environment: environment.to_string() };
        let fresh = self.freshness();
        let answer = index.answer(question, fresh, || Ok::<_, Error>(index.with_facts(&query, environment, fresh)))?;
        Ok(Selection::of(index, answer))
    }

    /// The index the queries answer from, for a subcommand that looks inside it: the
    /// no-data error even under `on_no_data: empty` (an empty index explains nothing).
    pub fn current_index(&self) -> Result<Arc<Index>> {
        self.index()?.ok_or_else(|| Error::NoData(self.no_data_message()))
    }

    /// Where the master last saw `certname` compile or report, if it noted it.
    pub fn seen_environment(&self, certname: &str) -> Option<String> {
        lock(&self.shared.seen_environments).get(certname).cloned()
    }

    /// The servers at `positions` of the current index, if it is still `generation`
    /// (a binding fetching what it has not cached of an earlier selection).
    pub fn servers_at(&self, generation: u64, positions: &[u32]) -> Option<Selection> {
        let index = self.index_at(generation)?;
        if positions.iter().any(|p| *p as usize >= index.len()) {
            return None;
        }
        Some(Selection { index: Some(index), answer: None, positions: positions.to_vec() })
    }

    /// The current index if it is still `generation` (the C ABI's value fetches).
    pub fn index_at(&self, generation: u64) -> Option<Arc<Index>> {
        self.shared.current.load_full().filter(|index| index.generation() == generation)
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
        refresh::refresh_and_wait(&self.shared, &self.refresh, timeout)
    }

    /// How long a refresh may take at worst (every network deadline added up).
    pub fn refresh_worst_case(&self) -> Duration {
        self.shared.worst_case
    }

    /// The index as it is now, if any was built or read yet: never waits, never
    /// refreshes (`puppet kicker status`).
    pub fn current(&self) -> Option<Arc<Index>> {
        self.shared.current.load_full()
    }

    /// Starts a refresh, or joins the one in flight; the receiver hears when it ended
    /// (its record is then [`Self::last_refresh`]). The caller reports a failure
    /// itself: the refresh thread does not warn of it.
    pub fn start_refresh(&self) -> crossbeam_channel::Receiver<()> {
        refresh::start_and_notify(&self.shared, &self.refresh, true)
    }

    /// Servers read so far by the refresh in flight.
    pub fn refresh_progress(&self) -> usize {
        self.shared.progress.load(Ordering::Relaxed)
    }

    /// This process's last refresh, if it ran one.
    pub fn last_refresh(&self) -> Option<RefreshRecord> {
        lock(&self.shared.last_record).clone()
    }

    /// The last refresh any process sharing the cache dir recorded.
    pub fn recorded_refresh(&self) -> Recorded {
        record::read(&self.shared.config.cache_dir)
    }

    /// Whether a refresh is queued or running.
    pub fn refreshing(&self) -> bool {
        lock(&self.shared.refresh_state).in_flight
    }

    /// Waits up to `timeout` for a refresh, from a thread of the caller's own: what
    /// the kick dispatcher does before each dispatch.
    pub(super) fn refresher(&self, timeout: Duration) -> impl Fn() + Send + Sync + 'static {
        let (shared, refresh) = (self.shared.clone(), self.refresh.clone());
        move || {
            refresh::refresh_and_wait(&shared, &refresh, timeout);
        }
    }

    /// The string value of `fact` (a name or dotted path) of a certname in the index
    /// as it is when asked, for a kick transport that reaches a server by a fact.
    pub(super) fn fact_reader(&self, fact: &str) -> impl Fn(&str) -> Option<String> + Send + Sync + 'static {
        let (shared, path) = (self.shared.clone(), crate::facts::FactPath::new(fact));
        move |certname| {
            let index = shared.current.load_full()?;
            let value = index.by_certname(certname)?.fact(&path)?;
            value.as_str().map(str::to_string)
        }
    }

    /// How many warnings [`Self::take_warnings`] would return now.
    pub fn warnings_pending(&self) -> usize {
        let warnings = lock(&self.shared.warnings);
        warnings.pending.len() + usize::from(warnings.left_out > 0)
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
            index_bytes: index.as_ref().map_or(0, |i| i.heap_bytes()),
            built_at: index.as_ref().map(|i| i.built_at()),
            last_error: lock(&self.shared.last_error).clone(),
            config_file: self.shared.config.file.clone(),
            cache_dir: self.shared.config.cache_dir.clone(),
            failures: self.shared.failures.load(Ordering::SeqCst),
            retry_at: Some(self.shared.retry_at.load(Ordering::SeqCst)).filter(|t| *t > 0),
        }
    }

    /// The index to answer from, per the no-data policy. Never waits when any
    /// non-empty index exists; starts a background refresh when it is older than
    /// `cache.ttl`.
    pub(super) fn index(&self) -> Result<Option<Arc<Index>>> {
        let config = &self.shared.config;
        let mut index = self.shared.current.load_full();
        match &index {
            Some(current) if !current.is_empty() => self.refresh_if_stale(current),
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

    /// Queues a refresh when `current` (the index, with servers) is older than
    /// `cache.ttl` and no failure asks to wait: what every query does first.
    fn refresh_if_stale(&self, current: &Index) {
        if now() - current.built_at() >= self.shared.config.cache_ttl as i64 && self.backoff_over() {
            self.request_refresh();
        }
    }

    /// Whether kept answer `id` is still what an identical query would get now
    /// ([`Index::answer_holds`] on the current index): then, as that query would,
    /// queues a refresh if the index is stale. False (nothing done: the caller asks
    /// the query, which does it all and reports any error) for an id no longer
    /// kept, an answer a server aged out of, or no index with servers.
    pub fn answer_holds(&self, id: u64) -> bool {
        let Some(current) = self.shared.current.load_full().filter(|i| !i.is_empty()) else { return false };
        if !current.answer_holds(id, self.freshness()) {
            return false;
        }
        self.refresh_if_stale(&current);
        true
    }

    /// The source and where it reads, e.g. `the puppet_cache source (/var/...)`.
    pub fn describe_source(&self) -> String {
        self.shared.source.describe()
    }

    fn no_data_message(&self) -> String {
        let config = &self.shared.config;
        let source = self.describe_source();
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

    /// Now, and the `max_age` every query leaves older servers out by.
    pub fn freshness(&self) -> Freshness {
        Freshness { now: now(), max_age: self.shared.config.max_age }
    }

    fn request_refresh(&self) {
        refresh::request_refresh(&self.shared, &self.refresh);
    }
}

fn owned<S: AsRef<str>>(strings: &[S]) -> Vec<String> {
    strings.iter().map(|s| s.as_ref().to_string()).collect()
}

impl Selection {
    fn empty() -> Selection {
        Selection { index: None, answer: None, positions: Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::time::Instant;

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
        let kicker = IndexService::start(settings).unwrap();
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

    /// A refresh of the fact cache reads only the files changed since the one that
    /// built the current index, and serves what a full read would.
    #[test]
    fn refreshes_read_only_changed_fact_files() {
        let root = std::env::temp_dir().join(format!("pk-service-since-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let (etc, facts) = (root.join("etc"), root.join("facts"));
        fs::create_dir_all(&etc).unwrap();
        let config =
            format!("puppet_cache:\n  dirs: [{}]\ncache:\n  dir: {}\n", facts.display(), root.join("cache").display());
        fs::write(etc.join("puppet_kicker.yaml"), config).unwrap();
        let mut nodes = crate::synthetic::fleet(30, 2, crate::time::now());
        crate::synthetic::write_puppet_cache(&facts, &nodes).unwrap();
        let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        for entry in fs::read_dir(&facts).unwrap() {
            fs::File::options().write(true).open(entry.unwrap().path()).unwrap().set_modified(an_hour_ago).unwrap();
        }
        let settings = PuppetSettings { confdir: etc, vardir: root.join("var"), ..Default::default() };
        let kicker = IndexService::start(settings).unwrap();
        // Files given as the refresh that built the index in use read them.
        let reused = || kicker.shared.reused.load(Ordering::SeqCst);

        assert!(kicker.refresh_and_wait(Duration::from_secs(10)));
        assert_eq!(reused(), 0, "a first refresh reads everything");
        assert!(kicker.refresh_and_wait(Duration::from_secs(10)));
        assert_eq!(reused(), 30, "then nothing changed");

        nodes[0].facts.insert("role".into(), serde_json::json!("changed"));
        crate::synthetic::write_puppet_cache(&facts, &nodes[..1]).unwrap();
        assert!(kicker.refresh_and_wait(Duration::from_secs(10)));
        assert_eq!(reused(), 29);
        let index = kicker.shared.current.load_full().unwrap();
        assert_eq!(index.by_certname(&nodes[0].certname).and_then(|s| s.role("role")), Some("changed"));
        assert_eq!(index.len(), 30);
        let _ = fs::remove_dir_all(&root);
    }
}
