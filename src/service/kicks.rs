//! The service the bindings call: the index service composed with the kick
//! service, which resolves a report's kicks in the index and dispatches them.

use super::IndexService;
use crate::config::PuppetSettings;
use crate::error::{Error, Result};
use crate::index::{Index, RoleSelector, ServerRef};
use crate::kick::choria::{self, ChoriaTransport};
use crate::kick::postgresql::{PgStore, SharedStore, StateKind};
use crate::kick::{
    Event, KickError, KickService, McoTransport, NoTransport, Planner, PlannerState, Progress, ReportKicks, Resolved,
    Selector, SshTransport, Target, Transport, TransportKind,
};
use crate::kick::{StateError, StateStore};
use crate::log::{Level, LogLine};
use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// An operator's kick as the planner took it (or would take it: a dry run).
pub struct OperatorKick {
    pub resolved: Resolved,
    pub events: Vec<Event>,
    /// Attempts each queued target's kick had made before this one joined it.
    pub attempts_before: BTreeMap<String, u32>,
}

/// One Puppet process's puppet-kicker: its [`IndexService`] (reached through
/// `Deref`: queries, refreshes, status) and, once a report brings kicks, its
/// [`KickService`].
pub struct Service {
    index: IndexService,
    /// Started by the first report that reaches the `kick` processor. The error is
    /// shared: every later report gets the same one.
    kicks: OnceLock<std::result::Result<KickService, Arc<KickError>>>,
}

impl Deref for Service {
    type Target = IndexService;

    fn deref(&self) -> &IndexService {
        &self.index
    }
}

impl Service {
    /// Reads the configuration and the snapshot, and starts the refresh thread.
    pub fn start(settings: PuppetSettings) -> Result<Service> {
        Ok(Service { index: IndexService::start(settings)?, kicks: OnceLock::new() })
    }

    /// What this process leaves undone if it exits now: `refresh` while a refresh
    /// is in flight, `kicks` while kicks wait to be delivered. A short-lived process
    /// (`puppet apply`) hands these to the masterless helper (the module `masterless_helper`).
    pub fn work_left(&self) -> Vec<&'static str> {
        let mut work = Vec::new();
        if self.index.refreshing() {
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

    /// Takes in a report's kicks: resolves their targets in the index, lets the
    /// planner decide, and returns what to log. Dispatch happens in the background.
    pub fn kick_report(&self, report: &ReportKicks) -> Result<Vec<LogLine>> {
        let service = self.kick_service()?;
        let mut index = if report.kicks.is_empty() { self.current() } else { self.index.index()? };
        // A server new to the index kicks on its first run: learn its role (policy,
        // role graph) before deciding, bounded like a cold start.
        if !report.kicks.is_empty() && index.as_deref().is_some_and(|i| i.by_certname(&report.host).is_none()) {
            self.refresh_and_wait(Duration::from_secs(self.config().cold_start_timeout));
            index = self.current().or(index);
        }
        let mut errors = Vec::new();
        let resolve = self.resolver(index.as_deref(), &mut errors);
        let source_role = |host: &str| self.role_in(index.as_deref(), host);
        let mut lines = service.report(report, resolve, source_role);
        lines.extend(errors.into_iter().map(|e| LogLine::new(Level::Err, format!("kick from {}: {e}", report.host))));
        Ok(lines)
    }

    /// An operator's kick (`puppet kicker kick`), given as a report from this machine:
    /// its targets found as a report's, then recorded and dispatched in the background
    /// (see [`KickService::operator`]). A bad role or clause is an error, not a line.
    pub fn kick_operator(&self, report: &ReportKicks) -> Result<OperatorKick> {
        let service = self.kick_service()?;
        let resolved = self.resolve_operator(report)?;
        let (events, attempts_before) = service.operator(report, resolved.clone());
        Ok(OperatorKick { resolved, events, attempts_before })
    }

    /// What [`Self::kick_operator`] would decide now, on a copy of the saved kick
    /// state: nothing is recorded, sent or logged, and no dispatcher is started.
    pub fn preview_operator(&self, report: &ReportKicks) -> Result<OperatorKick> {
        let state = self.kick_state()?;
        let resolved = self.resolve_operator(report)?;
        let mut planner = Planner::new(self.config().kick.planner.clone(), state);
        let events = planner.on_operator(report, resolved.clone(), crate::kick::now_ms());
        Ok(OperatorKick { resolved, events, attempts_before: BTreeMap::new() })
    }

    /// Where each of `targets`' kicks stands (outcomes from `since` on).
    /// `kick-status.json` is brought up to date too: the operator's process (`puppet
    /// kicker kick`) exits once it has seen its outcomes.
    pub fn kick_progress(&self, targets: &[String], since: crate::kick::Millis) -> Result<Vec<Progress>> {
        let service = self.kick_service()?;
        let progress = service.progress(targets, since);
        service.write_status();
        Ok(progress)
    }

    /// The kick state as saved (in the cache dir, or the shared state), read without
    /// starting the kick service (for `puppet kicker graph`: sends nothing).
    pub fn kick_state(&self) -> Result<PlannerState> {
        let config = self.config();
        let loaded = match config.kick.state {
            StateKind::Local => crate::kick::load_state(&config.cache_dir),
            StateKind::Postgresql => self.shared_store().and_then(|mut store| store.load().map_err(KickError::State)),
        };
        loaded.map_err(|e| Error::Kick(Arc::new(e)))
    }

    /// With `kick.state: postgresql`, the status document of the shared state, read
    /// now (the one in the cache dir is this compiler's view as of its last
    /// transaction): `{"unreadable": WHY, "document": {"state": ...}}` when it cannot
    /// be read, the outage in `state`. `None` with a local state.
    pub fn shared_kick_status(&self) -> Option<serde_json::Value> {
        let config = self.config();
        if config.kick.state != StateKind::Postgresql {
            return None;
        }
        let mut store = match self.shared_store() {
            Ok(store) => store,
            Err(e) => return Some(serde_json::json!({"unreadable": e.to_string()})),
        };
        let document = match store.load() {
            Ok(state) => crate::kick::status_document(&config.kick.planner, state, &store.describe(), &store.health()),
            Err(e) => serde_json::json!({
                "unreadable": e.to_string(),
                "document": {"state": crate::kick::status_document(&config.kick.planner, PlannerState::default(),
                    &store.describe(), &store.health())["state"]},
            }),
        };
        Some(document)
    }

    /// The shared kick state of `kick.state: postgresql`. A configuration the server
    /// refuses (a password, a certificate, a schema newer than this module) is an
    /// error; an unreachable server is not: the store keeps kicks in the cache dir
    /// until it is back.
    fn shared_store(&self) -> std::result::Result<SharedStore, KickError> {
        let config = self.config();
        let settings = &config.kick.postgresql;
        let shared_error = |store: String, reason: String| KickError::State(StateError::Shared { store, reason });
        let connection = settings
            .connection(&self.index.settings)
            .map_err(|e| shared_error("kick.postgresql".into(), e.to_string()))?;
        let writer = format!("{} pid {}", crate::process::host_name(), std::process::id());
        let mut pg = PgStore::new(connection, &settings.schema, settings.pool_size, &writer);
        match pg.check() {
            Err(e) if !e.outage => return Err(shared_error(pg.name(), e.reason)),
            _ => {}
        }
        Ok(SharedStore::new(pg, &config.cache_dir, config.kick.planner.keep_outcomes))
    }

    fn resolve_operator(&self, report: &ReportKicks) -> Result<Resolved> {
        let index = self.index.index()?;
        let mut errors = Vec::new();
        let resolve = self.resolver(index.as_deref(), &mut errors);
        let source_role = |host: &str| self.role_in(index.as_deref(), host);
        let resolved = Planner::resolve(&self.config().kick.planner, report, resolve, source_role);
        match errors.into_iter().next() {
            Some(error) => Err(error),
            None => Ok(resolved),
        }
    }

    /// Finds a kick's targets in `index` as the functions would; an unreadable role
    /// or clause resolves to nothing and is kept in `errors`.
    fn resolver<'a>(
        &'a self,
        index: Option<&'a Index>,
        errors: &'a mut Vec<Error>,
    ) -> impl FnMut(&Selector, &str) -> Vec<Target> + 'a {
        let fresh = self.freshness();
        move |selector: &Selector, environment: &str| -> Vec<Target> {
            let Some(index) = index else { return Vec::new() };
            let positions = match selector {
                Selector::Roles(roles) => RoleSelector::parse(roles).map(|r| index.with_role(&r, environment, fresh)),
                Selector::Facts(clauses) => {
                    self.index.clauses.compile(clauses).map(|q| index.with_facts(&q, environment, fresh))
                }
            };
            match positions {
                Ok(positions) => positions
                    .into_iter()
                    .map(|p| index.server(p))
                    .map(|server| Target { certname: server.certname().to_string(), role: self.role(server) })
                    .collect(),
                Err(e) => {
                    errors.push(e);
                    Vec::new()
                }
            }
        }
    }

    /// The role of `certname` in `index` (policy and the role graph), if it has one.
    fn role_in(&self, index: Option<&Index>, certname: &str) -> Option<String> {
        index.and_then(|i| i.by_certname(certname)).and_then(|server| self.role(server))
    }

    fn role(&self, server: ServerRef) -> Option<String> {
        server.role(&self.config().role_fact).map(str::to_string)
    }

    /// Waits (bounded by `kick.exit_wait`) for due kicks to be sent; for processes
    /// about to exit. Returns what to log, including how many kicks wait for later.
    pub fn kick_flush(&self) -> Vec<LogLine> {
        let Some(Ok(service)) = self.kicks.get() else { return Vec::new() };
        let undelivered = service.flush(self.config().kick.exit_wait);
        let mut lines = service.take_log();
        if undelivered > 0 {
            let file = self.config().cache_dir.join(crate::kick::STATE_FILE);
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

    /// How many lines [`Self::take_kick_log`] would return now.
    pub fn kick_log_pending(&self) -> usize {
        match self.kicks.get() {
            Some(Ok(service)) => service.log_pending(),
            _ => 0,
        }
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

    /// A transport of its own for `puppet kicker rollout run` (the dispatcher's stays
    /// the dispatcher's), as `kick.transport` names it.
    pub fn kick_transport(&self) -> std::result::Result<Box<dyn Transport>, NoTransport> {
        self.transport()
    }

    /// The transport `kick.transport` names, built from its settings.
    fn transport(&self) -> std::result::Result<Box<dyn Transport>, NoTransport> {
        let kick = &self.config().kick;
        match kick.transport {
            TransportKind::Mcollective => self
                .config()
                .sources
                .mcollective
                .client_config()
                .map(|mco| {
                    let client = crate::mcollective::Client::new(mco);
                    Box::new(McoTransport::new(client, kick.agent.clone(), kick.reply_timeout)) as Box<dyn Transport>
                })
                .map_err(NoTransport::Mcollective),
            TransportKind::Choria => {
                let inputs = choria::runonce_inputs(&kick.agent).map_err(NoTransport::Choria)?;
                ChoriaTransport::new(&kick.choria, &self.index.settings, inputs, kick.reply_timeout)
                    .map(|t| Box::new(t) as Box<dyn Transport>)
                    .map_err(NoTransport::Choria)
            }
            TransportKind::Ssh => {
                let config = self.config();
                let address_of = Box::new(self.index.fact_reader(&kick.ssh.address_fact));
                let control_dir = config.cache_dir.join("ssh");
                SshTransport::new(kick.ssh.clone(), kick.reply_timeout, &control_dir, address_of)
                    .map(|t| Box::new(t) as Box<dyn Transport>)
                    .map_err(NoTransport::Ssh)
            }
        }
    }

    fn kick_service(&self) -> Result<&KickService> {
        let config = self.config();
        let started = self.kicks.get_or_init(|| {
            let transport = if config.kick.planner.dry_run { Err(NoTransport::DryRun) } else { self.transport() };
            // A kicked server must see what changed: refresh the index before each
            // dispatch (bounded), so its compile (here, or from the snapshot) is fresh.
            let before_dispatch = Box::new(self.index.refresher(Duration::from_secs(config.cold_start_timeout)));
            match config.kick.state {
                StateKind::Local => {
                    KickService::start(config.kick.planner.clone(), &config.cache_dir, transport, before_dispatch)
                }
                StateKind::Postgresql => self.shared_store().and_then(|store| {
                    KickService::start_with(
                        config.kick.planner.clone(),
                        &config.cache_dir,
                        Box::new(store),
                        Vec::new(),
                        transport,
                        before_dispatch,
                    )
                }),
            }
            .map_err(Arc::new)
        });
        started.as_ref().map_err(|e| Error::Kick(e.clone()))
    }
}
