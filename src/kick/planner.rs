//! The kick state machine. Per target server: at most one pending kick (coalescing
//! what arrives within the window), at most one kicked run in progress, and at most
//! one follow-up for kicks that arrive during that run. Nothing is dropped silently:
//! every kick ends as started, suppressed (with the reason) or given up (logged).

use super::chain::Chain;
use super::graph::RoleGraph;
use super::policy::RateLedger;
use super::{ConfirmBy, KickConfig, KickSpec, Millis, ReportKicks, RunStatus, Selector};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

/// A server a kick resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub certname: String,
    pub role: Option<String>,
}

/// A report's kicks with their targets found, by [`Planner::resolve`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub source_role: Option<String>,
    /// Per kick of the report, in order: its environment, and its targets or why not.
    pub kicks: Vec<(String, ResolvedKick)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolvedKick {
    Targets(Vec<Target>),
    Refused(Suppression),
}

/// A `runonce` to send now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatch {
    pub target: String,
    pub environment: String,
    pub chain: Chain,
    pub attempt: u32,
}

/// What [`Planner::claim`] found of a dispatch about to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Still this dispatch's, handed out recently enough: nothing changed.
    Held,
    /// Still this dispatch's; its in-flight time now counts from the send (a change to save).
    Renewed,
    /// No longer this dispatch's: not to be sent.
    Lost,
}

/// How a `runonce` went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Started,
    /// Started, and the reply says when on the agent's clock (mcollective's `msgtime`,
    /// whole seconds): the kicked run's report is then told from an earlier run
    /// whatever the skew between the clocks.
    StartedAt(Millis),
    /// "Puppet is currently applying a catalog": a run that began before the kick.
    Busy(String),
    Disabled(String),
    NoReply,
    Failed(String),
    /// The agent refused the request itself (its DDL rejects an input, an unknown
    /// action): given up at once, since sending it again cannot help.
    Refused(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Suppression {
    Cycle(Chain),
    HopLimit(Chain),
    Policy {
        source_role: Option<String>,
        target_role: Option<String>,
    },
    RateLimited,
    Noop,
    /// The kick names another environment than the report's, which `kick.environments` does not allow.
    Environment {
        from: String,
        to: String,
    },
    /// Over the report's budget (`what` names the limit and its key).
    OverBudget {
        what: String,
    },
}

impl Suppression {
    /// Why a kick from `source` was suppressed, for the log and the operator's table.
    pub fn why(&self, source: &str) -> String {
        match self {
            Suppression::Cycle(chain) => format!("it would close a loop: {chain}"),
            Suppression::HopLimit(chain) => format!("the chain exceeds max_hops: {chain}"),
            Suppression::Policy { source_role, target_role } => format!(
                "policy does not let role {} kick role {}",
                source_role.as_deref().unwrap_or("(none)"),
                target_role.as_deref().unwrap_or("(none)")
            ),
            Suppression::RateLimited => format!("{source} exceeded its kick rate limit"),
            Suppression::Noop => "the run was --noop".to_string(),
            Suppression::Environment { from, to } => {
                format!("kick.environments does not let a server in environment {from} kick environment {to}")
            }
            Suppression::OverBudget { what } => format!("the report exceeds its budget: {what}"),
        }
    }
}

/// Who asked for a kick: a report (the usual way), or an operator's `puppet kicker
/// kick` on this machine, which is no run: it ends no kicked run, draws no role-graph
/// edge, and is due at once (it still joins a kick already queued).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Report,
    Operator,
}

/// Something the operator should see in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Queued {
        target: String,
        chain: Chain,
        due: Millis,
    },
    Coalesced {
        target: String,
        chain: Chain,
    },
    FollowUp {
        target: String,
        chain: Chain,
    },
    WouldKick {
        target: String,
        chain: Chain,
    },
    Suppressed {
        source: String,
        target: Option<String>,
        resource: String,
        reason: Suppression,
    },
    NoTargets {
        source: String,
        resource: String,
        environment: String,
    },
    /// A report's kick matched the reporting server itself, which is left out: it has
    /// just run, with the index's latest data, so another run would change nothing
    /// and its report would kick its peers a second time.
    NotItself {
        source: String,
        resource: String,
    },
    Started {
        target: String,
        chain: Chain,
        attempt: u32,
    },
    Retrying {
        target: String,
        why: String,
        attempt: u32,
        next: Millis,
    },
    GaveUp {
        target: String,
        why: String,
        attempts: u32,
        chain: Chain,
    },
    RunFinished {
        target: String,
        chain: Chain,
    },
    /// The first report of a run that started after the kick arrived: the kick is
    /// confirmed, with how the run ended (`None`: the report did not say).
    Confirmed {
        target: String,
        chain: Chain,
        status: Option<RunStatus>,
        run_started: Millis,
        after_ms: Millis,
    },
    /// No such report within `kick.confirm_within` of the kick.
    Unconfirmed {
        target: String,
        chain: Chain,
        within_ms: Millis,
    },
    RunTimedOut {
        target: String,
        chain: Chain,
    },
    NewRoleCycle {
        cycle: Vec<String>,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Queued { target, chain, .. } => write!(f, "kick queued for {target} (chain {chain})"),
            Event::Coalesced { target, chain } => {
                write!(f, "kick of {target} joins the one already queued (chain {chain})")
            }
            Event::FollowUp { target, chain } => {
                write!(f, "{target} is running a kicked run; one follow-up run queued (chain {chain})")
            }
            Event::WouldKick { target, chain } => write!(f, "dry run: would kick {target} (chain {chain})"),
            Event::Suppressed { source, target, resource, reason } => {
                let target = target.as_deref().unwrap_or("all targets");
                write!(f, "kick of {target} by {source} ({resource}) suppressed: {}", reason.why(source))
            }
            Event::NoTargets { source, resource, environment } => {
                write!(f, "{resource} from {source} matches no server in environment {environment}")
            }
            Event::NotItself { source, resource } => {
                write!(f, "{resource} from {source} does not kick {source} itself: it has just run")
            }
            Event::Started { target, chain, attempt } => {
                write!(f, "kicked {target}: Puppet run started (attempt {attempt}, chain {chain})")
            }
            Event::Retrying { target, why, attempt, .. } => {
                write!(f, "kick of {target} not started ({why}); retrying (attempt {attempt} failed)")
            }
            Event::GaveUp { target, why, attempts, chain } => {
                write!(f, "kick of {target} FAILED after {attempts} attempts: {why} (chain {chain})")
            }
            Event::RunFinished { target, chain } => write!(f, "kicked run of {target} reported (chain {chain})"),
            Event::Confirmed { target, chain, status, run_started, after_ms } => {
                let status = match status {
                    Some(RunStatus::Failed) => "FAILED",
                    Some(status) => status.as_str(),
                    None => "no status given",
                };
                write!(
                    f,
                    "kicked run of {target} reported (chain {chain}): {status}, the run of {} {}",
                    utc_text(*run_started),
                    after_kick(*after_ms)
                )
            }
            Event::Unconfirmed { target, chain, within_ms } => write!(
                f,
                "kick of {target} UNCONFIRMED: no report of a run started after it within {} (kick.confirm_within; chain {chain})",
                duration_text(*within_ms)
            ),
            Event::RunTimedOut { target, chain } => {
                write!(
                    f,
                    "kicked run of {target} sent no report within run_timeout; treated as finished (chain {chain})"
                )
            }
            Event::NewRoleCycle { cycle } => write!(f, "kick cycle between roles: {}", cycle.join(" -> ")),
        }
    }
}

/// What is persisted: everything the planner knows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PlannerState {
    /// Bumped by every save, so a process notices another's write whatever the
    /// file system's timestamps (coarse mtimes, equal lengths).
    #[serde(default)]
    pub generation: u64,
    pub targets: BTreeMap<String, TargetState>,
    pub outcomes: VecDeque<OutcomeRecord>,
    pub rate: RateLedger,
    pub graph: RoleGraph,
    /// Masterless: servers whose Puppet run is a local process still alive, which
    /// holds the server's agent lock; kicks of them wait for it to exit.
    #[serde(default)]
    pub holds: BTreeMap<String, Hold>,
    /// Totals since the state began (absent from older files: zeros), for monitoring.
    #[serde(default)]
    pub counters: Counters,
    /// Kicks whose run started and whose report has not yet confirmed them.
    #[serde(default)]
    pub awaiting: BTreeMap<String, Awaiting>,
    /// The latest confirmations (and kicks left unconfirmed), oldest first, at most
    /// `keep_outcomes`.
    #[serde(default)]
    pub confirmations: VecDeque<Confirmation>,
}

/// A kick whose run started, waiting for the report that confirms it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Awaiting {
    /// When the `runonce` reply said the run started (this machine's clock).
    pub kicked_at: Millis,
    /// The same on the agent's clock, when its reply said.
    pub agent_started: Option<Millis>,
    pub chain: Chain,
    /// Confirmed by the transport's last-run summary (asked every
    /// [`CONFIRM_POLL_MS`]) rather than by a report.
    #[serde(default)]
    pub by_transport: bool,
    #[serde(default)]
    pub environment: String,
    /// When the transport was last asked.
    #[serde(default)]
    pub checked_at: Millis,
}

/// How often a kick confirmed by the transport asks the server for its last run.
pub const CONFIRM_POLL_MS: Millis = 15_000;

/// How a kick ended, as the status file and `puppet kicker status` list it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmation {
    /// When it was confirmed, or found unconfirmed.
    pub at: Millis,
    pub target: String,
    /// changed, unchanged, failed, reported (no status given) or unconfirmed.
    pub outcome: String,
    /// When the kicked server's run started (its report's time).
    pub run_started: Option<Millis>,
    /// From the kick to its confirmation.
    pub after_ms: Option<Millis>,
    pub chain: String,
}

/// Upper bounds, in seconds, of the kick-to-report histogram's buckets (`+Inf` is
/// the count): a run takes from seconds to tens of minutes.
pub const CONFIRM_BUCKETS: [u64; 10] = [5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600];

/// Cumulative kick counts; they only grow (wrapping is out of reach of a u64).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Kicks whose `runonce` started a run.
    #[serde(default)]
    pub sent: u64,
    /// Kicks given up (attempts exhausted or refused by the agent).
    #[serde(default)]
    pub failed: u64,
    /// Suppression decisions (policy, rate limit, loops, hops, noop, environment, budget).
    #[serde(default)]
    pub suppressed: u64,
    /// Kicks confirmed by a report, by how the run ended.
    #[serde(default)]
    pub confirmed_changed: u64,
    #[serde(default)]
    pub confirmed_unchanged: u64,
    #[serde(default)]
    pub confirmed_failed: u64,
    /// Confirmed by a report that did not say how the run ended.
    #[serde(default)]
    pub confirmed_unknown: u64,
    /// Kicks no report confirmed within `kick.confirm_within`.
    #[serde(default)]
    pub unconfirmed: u64,
    /// Confirmed kicks per kick-to-report bucket ([`CONFIRM_BUCKETS`]), not cumulative.
    #[serde(default)]
    pub confirm_buckets: [u64; CONFIRM_BUCKETS.len()],
    /// Kick-to-report time of all confirmed kicks, summed, in milliseconds.
    #[serde(default)]
    pub confirm_ms_sum: u64,
}

impl Counters {
    /// The larger of each count: two processes' views of one monotonic history.
    fn max(self, other: Counters) -> Counters {
        let mut confirm_buckets = self.confirm_buckets;
        for (mine, theirs) in confirm_buckets.iter_mut().zip(other.confirm_buckets) {
            *mine = (*mine).max(theirs);
        }
        Counters {
            sent: self.sent.max(other.sent),
            failed: self.failed.max(other.failed),
            suppressed: self.suppressed.max(other.suppressed),
            confirmed_changed: self.confirmed_changed.max(other.confirmed_changed),
            confirmed_unchanged: self.confirmed_unchanged.max(other.confirmed_unchanged),
            confirmed_failed: self.confirmed_failed.max(other.confirmed_failed),
            confirmed_unknown: self.confirmed_unknown.max(other.confirmed_unknown),
            unconfirmed: self.unconfirmed.max(other.unconfirmed),
            confirm_buckets,
            confirm_ms_sum: self.confirm_ms_sum.max(other.confirm_ms_sum),
        }
    }

    /// Counts a confirmed kick: its outcome, and its kick-to-report time.
    fn confirmed(&mut self, status: Option<RunStatus>, after_ms: Millis) {
        let count = match status {
            Some(RunStatus::Changed) => &mut self.confirmed_changed,
            Some(RunStatus::Unchanged) => &mut self.confirmed_unchanged,
            Some(RunStatus::Failed) => &mut self.confirmed_failed,
            None => &mut self.confirmed_unknown,
        };
        *count = count.saturating_add(1);
        let after_ms = after_ms.max(0) as u64;
        if let Some(bucket) = CONFIRM_BUCKETS.iter().position(|le| after_ms <= le * 1000) {
            self.confirm_buckets[bucket] = self.confirm_buckets[bucket].saturating_add(1);
        }
        self.confirm_ms_sum = self.confirm_ms_sum.saturating_add(after_ms);
    }

    /// Kicks confirmed, whatever the outcome: the histogram's count.
    pub fn confirmed_total(&self) -> u64 {
        [self.confirmed_changed, self.confirmed_unchanged, self.confirmed_failed, self.confirmed_unknown]
            .iter()
            .fold(0u64, |sum, n| sum.saturating_add(*n))
    }
}

/// A server's run in progress as a process on this machine (`puppet apply`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub pid: u32,
    pub since: Millis,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetState {
    pub environment: String,
    pub pending: Option<Pending>,
    pub running: Option<Running>,
    pub follow_up: Option<Pending>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub due: Millis,
    pub queued_at: Millis,
    pub attempts: u32,
    /// Handed to the dispatcher and not yet answered.
    pub in_flight: bool,
    /// When it was handed over; a dispatcher that died leaves it in flight, so after
    /// `STALE_IN_FLIGHT_MS` another may send it again.
    #[serde(default)]
    pub dispatched_at: Millis,
    pub chain: Chain,
    pub last_error: Option<String>,
    /// Its run is confirmed by the transport's last-run summary, not by a report
    /// (see `kick.confirm_by`).
    #[serde(default)]
    pub by_transport: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    pub started: Millis,
    /// When the run started on the agent's clock, if its reply said.
    #[serde(default)]
    pub agent_started: Option<Millis>,
    pub chain: Chain,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeRecord {
    pub at: Millis,
    pub target: String,
    pub result: String,
    pub chain: String,
}

/// What one kick of a report brings to each of its targets' decision.
#[derive(Clone, Copy)]
struct Decision<'a> {
    kick: &'a KickSpec,
    source_role: &'a Option<String>,
    chain: &'a Chain,
    environment: &'a str,
}

pub struct Planner {
    config: KickConfig,
    state: PlannerState,
}

impl Planner {
    pub fn new(config: KickConfig, state: PlannerState) -> Planner {
        Planner { config, state }
    }

    pub fn state(&self) -> &PlannerState {
        &self.state
    }

    pub fn config(&self) -> &KickConfig {
        &self.config
    }

    /// Takes a report in. `resolve` finds the servers a kick targets; `role_of`
    /// the role of a certname (for policy and the role graph). The same as
    /// [`Planner::resolve`] then [`Planner::on_resolved`].
    pub fn on_report(
        &mut self,
        report: &ReportKicks,
        now: Millis,
        resolve: impl FnMut(&Selector, &str) -> Vec<Target>,
        role_of: impl Fn(&str) -> Option<String>,
    ) -> Vec<Event> {
        let resolved = Planner::resolve(&self.config, report, resolve, role_of);
        self.on_resolved(report, resolved, now)
    }

    /// Finds a report's targets within its budget, without the planner's state (so
    /// a service does it outside its lock: resolving regexes over a fleet is the
    /// expensive part of a report). Kicks past a limit are not resolved.
    pub fn resolve(
        config: &KickConfig,
        report: &ReportKicks,
        mut resolve: impl FnMut(&Selector, &str) -> Vec<Target>,
        role_of: impl Fn(&str) -> Option<String>,
    ) -> Resolved {
        let mut resolved = Resolved { source_role: None, kicks: Vec::new() };
        if report.noop || report.kicks.is_empty() {
            return resolved;
        }
        resolved.source_role = role_of(&report.host);
        let budget = config.budget;
        let (mut clauses, mut targets) = (0usize, 0usize);
        for (n, kick) in report.kicks.iter().enumerate() {
            let environment = kick.environment.clone().unwrap_or_else(|| report.environment.clone());
            let over = |what: String| ResolvedKick::Refused(Suppression::OverBudget { what });
            let outcome = if n >= budget.kicks {
                over(format!("more than {} kicks (kick.budget.kicks)", budget.kicks))
            } else if environment != report.environment
                && !config.environments.allows(Some(&report.environment), Some(&environment))
            {
                ResolvedKick::Refused(Suppression::Environment {
                    from: report.environment.clone(),
                    to: environment.clone(),
                })
            } else {
                clauses += match &kick.selector {
                    Selector::Roles(items) | Selector::Facts(items) => items.len(),
                };
                if clauses > budget.clauses {
                    over(format!("more than {} roles and clauses (kick.budget.clauses)", budget.clauses))
                } else if targets >= budget.targets {
                    over(format!("more than {} targets (kick.budget.targets)", budget.targets))
                } else {
                    let found = resolve(&kick.selector, &environment);
                    targets += found.len();
                    if targets > budget.targets {
                        over(format!("more than {} targets (kick.budget.targets)", budget.targets))
                    } else {
                        ResolvedKick::Targets(found)
                    }
                }
            };
            resolved.kicks.push((environment, outcome));
        }
        resolved
    }

    /// Takes a report in, with its targets found by [`Planner::resolve`]. A report
    /// from a local process (masterless) that leaves a kick of its own server pending
    /// holds that kick until the process exits (see [`Planner::release_exited`]).
    pub fn on_resolved(&mut self, report: &ReportKicks, resolved: Resolved, now: Millis) -> Vec<Event> {
        let events = self.take_report(report, resolved, now, Origin::Report);
        let waits = self.state.targets.get(&report.host).is_some_and(|t| t.pending.is_some() || t.follow_up.is_some());
        match report.reporter_pid {
            Some(pid) if waits => {
                self.state.holds.insert(report.host.clone(), Hold { pid, since: now });
            }
            _ => {}
        }
        events
    }

    /// Whether a report from `host` would end something: its kicked run, or its kick
    /// awaiting confirmation.
    pub fn awaits_report_of(&self, host: &str) -> bool {
        self.state.awaiting.contains_key(host) || self.state.targets.get(host).is_some_and(|t| t.running.is_some())
    }

    /// Takes in an operator's kick (`puppet kicker kick`), its targets found by
    /// [`Planner::resolve`] as a report's from `report.host` (this machine's
    /// certname): the same policy (as that certname's role), rate limit, loop and hop
    /// checks and coalescing as a report's; see [`Origin::Operator`] for the rest.
    pub fn on_operator(&mut self, report: &ReportKicks, resolved: Resolved, now: Millis) -> Vec<Event> {
        self.take_report(report, resolved, now, Origin::Operator)
    }

    /// Ends the holds of processes that exited (`alive` says), or that have held
    /// for longer than `run_timeout` (a pid reused). True when one ended.
    pub fn release_exited(&mut self, now: Millis, alive: impl Fn(u32) -> bool) -> bool {
        let before = self.state.holds.len();
        let run_timeout = self.config.run_timeout_ms;
        self.state.holds.retain(|_, hold| alive(hold.pid) && now - hold.since < run_timeout);
        self.state.holds.len() != before
    }

    /// Servers whose kicks wait for a local process to exit, and its pid.
    pub fn holds(&self) -> impl Iterator<Item = (&String, u32)> + '_ {
        self.state.holds.iter().map(|(host, hold)| (host, hold.pid))
    }

    fn take_report(&mut self, report: &ReportKicks, resolved: Resolved, now: Millis, origin: Origin) -> Vec<Event> {
        let events = self.decide(report, resolved, now, origin);
        let suppressed = events.iter().filter(|e| matches!(e, Event::Suppressed { .. })).count() as u64;
        self.state.counters.suppressed = self.state.counters.suppressed.saturating_add(suppressed);
        events
    }

    fn decide(&mut self, report: &ReportKicks, resolved: Resolved, now: Millis, origin: Origin) -> Vec<Event> {
        let mut events = Vec::new();
        let chain = match origin {
            Origin::Report => {
                let confirmed = self.confirm(report, now, &mut events);
                self.finish_run(&report.host, report.run_started, confirmed, &mut events)
            }
            Origin::Operator => Chain::origin(&report.host),
        };
        if report.kicks.is_empty() {
            return events;
        }
        let suppress_all = |reason: Suppression, events: &mut Vec<Event>| {
            for kick in &report.kicks {
                events.push(Event::Suppressed {
                    source: report.host.clone(),
                    target: None,
                    resource: kick.resource.clone(),
                    reason: reason.clone(),
                });
            }
        };
        if report.noop {
            suppress_all(Suppression::Noop, &mut events);
            return events;
        }
        if !self.state.rate.admit(self.config.rate_limit, &report.host, now) {
            suppress_all(Suppression::RateLimited, &mut events);
            return events;
        }
        let source_role = resolved.source_role;
        // Kicks cut by the same limit in a row make one line: `K[a] and 223 more kicks`.
        let mut cut: Option<(usize, String, usize)> = None;
        for (kick, (environment, outcome)) in report.kicks.iter().zip(resolved.kicks) {
            let targets = match outcome {
                ResolvedKick::Refused(reason @ Suppression::OverBudget { .. }) => {
                    let last = events.len().checked_sub(1);
                    match (&mut cut, events.last_mut()) {
                        (Some((at, first, more)), Some(Event::Suppressed { reason: same, resource, .. }))
                            if Some(*at) == last && *same == reason =>
                        {
                            *more += 1;
                            *resource = format!("{first} and {more} more kicks");
                        }
                        _ => {
                            events.push(Event::Suppressed {
                                source: report.host.clone(),
                                target: None,
                                resource: kick.resource.clone(),
                                reason,
                            });
                            cut = Some((events.len() - 1, kick.resource.clone(), 0));
                        }
                    }
                    continue;
                }
                ResolvedKick::Targets(targets) => targets,
                ResolvedKick::Refused(reason) => {
                    events.push(Event::Suppressed {
                        source: report.host.clone(),
                        target: None,
                        resource: kick.resource.clone(),
                        reason,
                    });
                    continue;
                }
            };
            if targets.is_empty() {
                events.push(Event::NoTargets {
                    source: report.host.clone(),
                    resource: kick.resource.clone(),
                    environment: environment.clone(),
                });
            }
            for target in targets {
                // The reporting server has just run: kicking it would run it again
                // for nothing, and that run's report would kick its peers twice.
                if origin == Origin::Report && target.certname == report.host {
                    events.push(Event::NotItself { source: report.host.clone(), resource: kick.resource.clone() });
                    continue;
                }
                let decision = Decision { kick, source_role: &source_role, chain: &chain, environment: &environment };
                self.kick_one(report, &decision, target, origin, now, &mut events);
            }
        }
        self.state.rate.prune(self.config.rate_limit, now);
        let max_len = self.max_cycle_len();
        self.state.graph.age_out(now.saturating_sub(self.config.role_graph_ttl_ms), max_len);
        events
    }

    /// Decides one target of one kick.
    fn kick_one(
        &mut self,
        report: &ReportKicks,
        decision: &Decision<'_>,
        target: Target,
        origin: Origin,
        now: Millis,
        events: &mut Vec<Event>,
    ) {
        let Decision { kick, source_role, chain, environment } = *decision;
        let suppressed = |reason| Event::Suppressed {
            source: report.host.clone(),
            target: Some(target.certname.clone()),
            resource: kick.resource.clone(),
            reason,
        };
        if !self.config.policy.allows(source_role.as_deref(), target.role.as_deref()) {
            let reason = Suppression::Policy { source_role: source_role.clone(), target_role: target.role.clone() };
            events.push(suppressed(reason));
            return;
        }
        // Only kicks the policy allows shape the graph: a node cannot grow it at will.
        // An operator's kick is no role kicking a role: it stays out of the graph.
        if let (Origin::Report, Some(from), Some(to)) = (origin, source_role, &target.role) {
            let max_len = self.max_cycle_len();
            let cycles = self.state.graph.add(from, to, now, max_len);
            events.extend(cycles.into_iter().map(|cycle| Event::NewRoleCycle { cycle }));
        }
        let extended = chain.then(&target.certname);
        // An operator's kick may include the machine it is typed on (its chain starts
        // there); a report's never targets its own server (see `kick_one`'s caller).
        let this_machine = origin == Origin::Operator && target.certname == report.host;
        if chain.contains(&target.certname) && !this_machine {
            events.push(suppressed(Suppression::Cycle(extended)));
            return;
        }
        if extended.hops() > self.config.max_hops {
            events.push(suppressed(Suppression::HopLimit(extended)));
            return;
        }
        if self.config.dry_run {
            events.push(Event::WouldKick { target: target.certname, chain: extended });
            return;
        }
        let by_transport = match self.config.confirm_by {
            ConfirmBy::Reports => false,
            ConfirmBy::Transport => true,
            // A masterless report's targets report to their own machines, not here.
            ConfirmBy::Auto => report.reporter_pid.is_some(),
        };
        events.push(self.enqueue(&target.certname, environment, extended, now, origin, by_transport));
    }

    /// Role cycles longer than this cannot happen: `max_hops` stops the chain first.
    fn max_cycle_len(&self) -> usize {
        self.config.max_hops.saturating_add(1)
    }

    /// Kicks whose time has come; they are in flight until `on_outcome`.
    pub fn due(&mut self, now: Millis) -> (Vec<Dispatch>, Vec<Event>) {
        self.due_at_most(now, usize::MAX)
    }

    /// [`Self::due`], handing out at most `max` kicks: the rest stay due, for the next
    /// call (or another process's: with a shared state, every compiler's dispatcher
    /// takes a share). A sender claims only what it can send soon, so that its claims
    /// need no renewal while the earlier ones are sent.
    pub fn due_at_most(&mut self, now: Millis, max: usize) -> (Vec<Dispatch>, Vec<Event>) {
        let mut dispatches = Vec::new();
        let mut events = Vec::new();
        for (name, target) in self.state.targets.iter_mut() {
            if let Some(running) = &target.running {
                if now - running.started >= self.config.run_timeout_ms {
                    events.push(Event::RunTimedOut { target: name.clone(), chain: running.chain.clone() });
                    target.running = None;
                    target.pending = target.follow_up.take().or(target.pending.take());
                }
            }
            if target.running.is_some() || self.state.holds.contains_key(name) {
                continue;
            }
            let stale_after = self.config.in_flight_timeout_ms;
            let ready = |p: &&mut Pending| (!p.in_flight || now - p.dispatched_at >= stale_after) && p.due <= now;
            if dispatches.len() >= max {
                continue;
            }
            if let Some(pending) = target.pending.as_mut().filter(ready) {
                pending.in_flight = true;
                pending.dispatched_at = now;
                pending.attempts += 1;
                dispatches.push(Dispatch {
                    target: name.clone(),
                    environment: target.environment.clone(),
                    chain: pending.chain.clone(),
                    attempt: pending.attempts,
                });
            }
        }
        self.forget_idle();
        self.expire_unconfirmed(now, &mut events);
        (dispatches, events)
    }

    /// Records how a dispatched `runonce` went.
    pub fn on_outcome(&mut self, target_name: &str, outcome: Outcome, now: Millis) -> Vec<Event> {
        let config = &self.config;
        let Some(target) = self.state.targets.get_mut(target_name) else { return Vec::new() };
        let Some(mut pending) = target.pending.take() else { return Vec::new() };
        pending.in_flight = false;
        let why = match outcome {
            Outcome::Started | Outcome::StartedAt(_) => {
                let agent_started = match outcome {
                    Outcome::StartedAt(at) => Some(at),
                    _ => None,
                };
                let event = Event::Started {
                    target: target_name.into(),
                    chain: pending.chain.clone(),
                    attempt: pending.attempts,
                };
                target.running = Some(Running { started: now, agent_started, chain: pending.chain.clone() });
                let environment = target.environment.clone();
                self.state.counters.sent = self.state.counters.sent.saturating_add(1);
                self.record(now, target_name, "started".into(), &pending.chain);
                let mut events = vec![event];
                let awaiting = Awaiting {
                    kicked_at: now,
                    agent_started,
                    chain: pending.chain.clone(),
                    by_transport: pending.by_transport,
                    environment,
                    checked_at: now,
                };
                // One before it still unconfirmed (its report later than run_timeout,
                // and confirm_within longer still): it ends unconfirmed, so that every
                // kick started ends once, confirmed or not.
                if let Some(earlier) = self.state.awaiting.insert(target_name.to_string(), awaiting) {
                    self.unconfirmed(now, target_name.to_string(), earlier, &mut events);
                }
                return events;
            }
            Outcome::Busy(why) | Outcome::Disabled(why) | Outcome::Failed(why) => (why, false),
            Outcome::Refused(why) => (format!("the agent refused the request: {why}"), true),
            Outcome::NoReply => ("no reply".to_string(), false),
        };
        let (why, refused) = why;
        if refused || pending.attempts >= config.max_attempts {
            let event = Event::GaveUp {
                target: target_name.into(),
                why: why.clone(),
                attempts: pending.attempts,
                chain: pending.chain.clone(),
            };
            // A kick that arrived meanwhile was never tried: it gets its own attempts.
            target.pending = target.follow_up.take();
            self.state.counters.failed = self.state.counters.failed.saturating_add(1);
            self.record(now, target_name, format!("failed: {why}"), &pending.chain);
            return vec![event];
        }
        // Nothing started, so the run still to come serves a follow-up queued meanwhile.
        if let Some(follow_up) = target.follow_up.take() {
            pending.chain = pending.chain.merge(&follow_up.chain);
        }
        let exponent = pending.attempts.saturating_sub(1).min(20);
        let delay = config.retry_base_ms.saturating_mul(1 << exponent).min(config.retry_max_ms);
        pending.due = now + delay;
        pending.last_error = Some(why.clone());
        let event = Event::Retrying { target: target_name.into(), why, attempt: pending.attempts, next: pending.due };
        target.pending = Some(pending);
        vec![event]
    }

    /// Renews a dispatch just before it is sent, so that at least three quarters of
    /// the in-flight timeout are left from the send, not from when a batch was handed
    /// out (a batch is sent `max_parallel` at a time, each waiting up to
    /// `reply_timeout`, at most half that timeout). A dispatch handed out less than a
    /// quarter of it ago is left as it is, and nothing needs saving: in a batch sent
    /// at once, most are. [`Claim::Lost`] when the kick is no longer this dispatch's:
    /// another process took it over or it was answered meanwhile.
    pub fn claim(&mut self, dispatch: &Dispatch, now: Millis) -> Claim {
        let pending = self.state.targets.get_mut(&dispatch.target).and_then(|t| t.pending.as_mut());
        match pending {
            Some(p) if is_dispatch_of(p, dispatch) => {
                if is_fresh(&self.config, p, now) {
                    Claim::Held
                } else {
                    p.dispatched_at = now;
                    Claim::Renewed
                }
            }
            _ => Claim::Lost,
        }
    }

    /// Whether [`Self::claim`] would answer [`Claim::Held`] for `dispatch` at `now`
    /// (still its kick's, handed out or renewed less than a quarter of
    /// `kick.in_flight_timeout` ago), asked without changing anything: a sender that
    /// knows this needs no transaction before sending.
    pub fn holds_fresh(&self, dispatch: &Dispatch, now: Millis) -> bool {
        let pending = self.state.targets.get(&dispatch.target).and_then(|t| t.pending.as_ref());
        pending.is_some_and(|p| is_dispatch_of(p, dispatch) && is_fresh(&self.config, p, now))
    }

    /// When the dispatcher should look again.
    pub fn next_wakeup(&self) -> Option<Millis> {
        self.state
            .targets
            .iter()
            // A held server is looked at again when its process exits (polled).
            .filter(|(name, _)| !self.state.holds.contains_key(*name))
            .filter_map(|(_, t)| match (&t.running, &t.pending) {
                (Some(running), _) => Some(running.started + self.config.run_timeout_ms),
                (None, Some(p)) if !p.in_flight => Some(p.due),
                // Its sender may have died: look again when it turns stale.
                (None, Some(p)) => Some(p.dispatched_at.saturating_add(self.config.in_flight_timeout_ms)),
                _ => None,
            })
            .chain(self.state.awaiting.values().map(|a| a.kicked_at.saturating_add(self.config.confirm_within_ms)))
            .chain(self.state.awaiting.values().filter(|a| a.by_transport).map(|a| a.checked_at + CONFIRM_POLL_MS))
            .min()
    }

    /// Kicks not yet started (pending, follow-ups, in flight).
    pub fn undelivered(&self) -> usize {
        self.state.targets.values().map(|t| t.pending.is_some() as usize + t.follow_up.is_some() as usize).sum()
    }

    /// Takes the state another process wrote (kicks are shared through the cache dir).
    pub fn replace_state(&mut self, state: PlannerState) {
        self.state = state;
    }

    /// Takes what another process wrote while this one holds changes it could not
    /// save (a full disk): its kicks of servers this one knows nothing about, and its
    /// outcomes; this process's own view wins where both know a server. Nothing of
    /// either is lost; at worst a kick is sent twice, never not at all.
    pub fn merge_unsaved(&mut self, theirs: PlannerState) {
        merge_states(&mut self.state, theirs, self.config.keep_outcomes);
    }

    /// Takes the shared state again after an outage of it: the servers in `kept`,
    /// which this process changed while the state was kept locally, keep this
    /// process's entries; every other server takes the shared state's (see
    /// [`merge_kept`]).
    pub fn merge_kept(&mut self, theirs: PlannerState, kept: &BTreeSet<String>) {
        merge_kept(&mut self.state, theirs, kept, self.config.keep_outcomes);
    }

    /// The generation the next save writes.
    pub fn next_generation(&self) -> u64 {
        self.state.generation.wrapping_add(1)
    }

    /// Records that the state was saved as `generation`.
    pub fn saved_as(&mut self, generation: u64) {
        self.state.generation = generation;
    }

    /// Confirms the kick of `report.host` awaiting its report, if this is the report
    /// of a run started after the kick (by the rule that tells the kicked run, see
    /// [`is_kicked_run`]); a `--noop` run is not the kicked one. True when confirmed.
    fn confirm(&mut self, report: &ReportKicks, now: Millis, events: &mut Vec<Event>) -> bool {
        let skew = self.config.clock_skew_ms;
        let kicked = |a: &Awaiting| is_kicked_run(a.kicked_at, a.agent_started, report.run_started, skew);
        if report.noop || !self.state.awaiting.get(&report.host).is_some_and(kicked) {
            return false;
        }
        let Some(awaiting) = self.state.awaiting.remove(&report.host) else { return false };
        let after_ms = now.saturating_sub(awaiting.kicked_at).max(0);
        self.state.counters.confirmed(report.status, after_ms);
        let outcome = report.status.map_or("reported", RunStatus::as_str);
        self.confirmation(now, &report.host, outcome, Some(report.run_started), Some(after_ms), &awaiting.chain);
        events.push(Event::Confirmed {
            target: report.host.clone(),
            chain: awaiting.chain,
            status: report.status,
            run_started: report.run_started,
            after_ms,
        });
        true
    }

    /// Kicks no report confirmed within `kick.confirm_within`: unconfirmed.
    fn expire_unconfirmed(&mut self, now: Millis, events: &mut Vec<Event>) {
        let within_ms = self.config.confirm_within_ms;
        let expired: Vec<String> = self
            .state
            .awaiting
            .iter()
            .filter(|(_, a)| now.saturating_sub(a.kicked_at) >= within_ms)
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            if let Some(awaiting) = self.state.awaiting.remove(&name) {
                self.unconfirmed(now, name, awaiting, events);
            }
        }
    }

    fn unconfirmed(&mut self, now: Millis, target: String, awaiting: Awaiting, events: &mut Vec<Event>) {
        self.state.counters.unconfirmed = self.state.counters.unconfirmed.saturating_add(1);
        self.confirmation(now, &target, "unconfirmed", None, None, &awaiting.chain);
        events.push(Event::Unconfirmed { target, chain: awaiting.chain, within_ms: self.config.confirm_within_ms });
    }

    fn confirmation(
        &mut self,
        at: Millis,
        target: &str,
        outcome: &str,
        run_started: Option<Millis>,
        after_ms: Option<Millis>,
        chain: &Chain,
    ) {
        let chain = chain.to_string();
        let record = Confirmation { at, target: target.into(), outcome: outcome.into(), run_started, after_ms, chain };
        self.state.confirmations.push_back(record);
        while self.state.confirmations.len() > self.config.keep_outcomes {
            self.state.confirmations.pop_front();
        }
    }

    /// Whether [`Planner::to_ask`] would name a server now: a look that changes
    /// nothing, so the dispatcher takes the state file's lock only when it would.
    pub fn any_to_ask(&self, now: Millis) -> bool {
        self.state.awaiting.values().any(|a| a.by_transport && now.saturating_sub(a.checked_at) >= CONFIRM_POLL_MS)
    }

    /// Kicks to confirm by the transport whose server is due to be asked again, as
    /// (certname, environment); each is marked asked now.
    pub fn to_ask(&mut self, now: Millis) -> Vec<(String, String)> {
        let mut ask = Vec::new();
        for (name, awaiting) in self.state.awaiting.iter_mut() {
            if awaiting.by_transport && now.saturating_sub(awaiting.checked_at) >= CONFIRM_POLL_MS {
                awaiting.checked_at = now;
                ask.push((name.clone(), awaiting.environment.clone()));
            }
        }
        ask
    }

    /// What a server's agent says of its last run (`ended`: when it ended, on the
    /// agent's clock): confirms the kick awaiting it if that run ended after the kick
    /// started it (by the same rule as a report's start).
    pub fn on_last_run(&mut self, target: &str, ended: Option<Millis>, status: RunStatus, now: Millis) -> Vec<Event> {
        let skew = self.config.clock_skew_ms;
        let Some(ended) = ended else { return Vec::new() };
        let confirms = |a: &Awaiting| is_kicked_run(a.kicked_at, a.agent_started, ended, skew);
        if !self.state.awaiting.get(target).is_some_and(confirms) {
            return Vec::new();
        }
        let Some(awaiting) = self.state.awaiting.remove(target) else { return Vec::new() };
        let after_ms = now.saturating_sub(awaiting.kicked_at).max(0);
        self.state.counters.confirmed(Some(status), after_ms);
        self.confirmation(now, target, status.as_str(), None, Some(after_ms), &awaiting.chain);
        vec![Event::Confirmed {
            target: target.to_string(),
            chain: awaiting.chain,
            status: Some(status),
            run_started: ended,
            after_ms,
        }]
    }

    /// Kicks waiting for their report: each server's, with when it was kicked.
    pub fn awaiting(&self) -> impl Iterator<Item = (&String, &Awaiting)> + '_ {
        self.state.awaiting.iter()
    }

    /// Ends `host`'s kicked run if this report is from it, and returns the chain the
    /// report carries: the kick's, or a new one starting at `host`. `confirmed`: the
    /// report's line is the confirmation's, not a second one.
    fn finish_run(&mut self, host: &str, run_started: Millis, confirmed: bool, events: &mut Vec<Event>) -> Chain {
        let skew = self.config.clock_skew_ms;
        let Some(target) = self.state.targets.get_mut(host) else { return Chain::origin(host) };
        match &target.running {
            Some(running) if is_kicked_run(running.started, running.agent_started, run_started, skew) => {
                let chain = running.chain.clone();
                if !confirmed {
                    events.push(Event::RunFinished { target: host.into(), chain: chain.clone() });
                }
                target.running = None;
                if let Some(follow_up) = target.follow_up.take() {
                    target.pending = Some(follow_up);
                }
                chain
            }
            _ => Chain::origin(host),
        }
    }

    /// Queues a kick of `name`, due after the coalescing window; one already queued
    /// takes it in. An operator's kick is due now, and brings a queued one forward
    /// (a retry's backoff included): they asked for a run now.
    fn enqueue(
        &mut self,
        name: &str,
        environment: &str,
        chain: Chain,
        now: Millis,
        origin: Origin,
        by_transport: bool,
    ) -> Event {
        let due = match origin {
            Origin::Report => now + self.config.coalesce_ms,
            Origin::Operator => now,
        };
        let target = self.state.targets.entry(name.to_string()).or_default();
        target.environment = environment.to_string();
        let fresh = |chain: Chain| Pending {
            due,
            queued_at: now,
            attempts: 0,
            in_flight: false,
            dispatched_at: 0,
            chain,
            last_error: None,
            by_transport,
        };
        let busy = target.running.is_some() || target.pending.as_ref().is_some_and(|p| p.in_flight);
        let slot = if busy { &mut target.follow_up } else { &mut target.pending };
        match slot {
            Some(existing) => {
                existing.chain = existing.chain.merge(&chain);
                existing.by_transport |= by_transport;
                if origin == Origin::Operator && !existing.in_flight {
                    existing.due = existing.due.min(due);
                }
                if busy {
                    Event::FollowUp { target: name.into(), chain: existing.chain.clone() }
                } else {
                    Event::Coalesced { target: name.into(), chain: existing.chain.clone() }
                }
            }
            None => {
                *slot = Some(fresh(chain.clone()));
                if busy {
                    Event::FollowUp { target: name.into(), chain }
                } else {
                    Event::Queued { target: name.into(), chain, due }
                }
            }
        }
    }

    fn record(&mut self, at: Millis, target: &str, result: String, chain: &Chain) {
        self.state.outcomes.push_back(OutcomeRecord { at, target: target.into(), result, chain: chain.to_string() });
        while self.state.outcomes.len() > self.config.keep_outcomes {
            self.state.outcomes.pop_front();
        }
    }

    fn forget_idle(&mut self) {
        self.state.targets.retain(|_, t| t.pending.is_some() || t.running.is_some() || t.follow_up.is_some());
    }
}

/// `pending` is still `dispatch`'s: in flight, at the dispatch's attempt.
fn is_dispatch_of(pending: &Pending, dispatch: &Dispatch) -> bool {
    pending.in_flight && pending.attempts == dispatch.attempt
}

/// `pending` was handed out (or its claim renewed) less than a quarter of
/// `kick.in_flight_timeout` before `now`: its claim is held without renewal.
fn is_fresh(config: &KickConfig, pending: &Pending, now: Millis) -> bool {
    now.saturating_sub(pending.dispatched_at) < config.in_flight_timeout_ms / 4
}

/// Whether a run that started at `run_started` (the agent's clock) is the kicked
/// one: by the agent's own clock when its reply gave it (whole seconds, so one
/// second of slack), else within `clock_skew` of the master's.
fn is_kicked_run(kicked_at: Millis, agent_started: Option<Millis>, run_started: Millis, clock_skew_ms: Millis) -> bool {
    match agent_started {
        Some(agent_started) => run_started >= agent_started - 1_000,
        None => run_started >= kicked_at - clock_skew_ms,
    }
}

/// A Unix time in milliseconds as UTC, to the second: `2026-11-29T03:00:00Z`.
fn utc_text(at: Millis) -> String {
    let t = crate::time::CalendarTime::utc(at.div_euclid(1000));
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", t.year, t.month, t.day, t.hour, t.minute, t.second)
}

/// `42 s after the kick`, `3 min 5 s after the kick`.
fn after_kick(after_ms: Millis) -> String {
    format!("{} after the kick", duration_text(after_ms))
}

/// A duration in words an operator reads at a glance: `42 s`, `3 min 5 s`, `2 h`.
fn duration_text(ms: Millis) -> String {
    let s = ms.max(0) / 1000;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s} s"),
        (0, m, 0) => format!("{m} min"),
        (0, m, s) => format!("{m} min {s} s"),
        (h, 0, _) => format!("{h} h"),
        (h, m, _) => format!("{h} h {m} min"),
    }
}

/// The servers whose kicks or awaited runs differ between two states: what a
/// transaction changed.
pub fn changed_servers(before: &PlannerState, after: &PlannerState) -> BTreeSet<String> {
    fn differ<'a, V: PartialEq>(
        a: &'a BTreeMap<String, V>,
        b: &'a BTreeMap<String, V>,
    ) -> impl Iterator<Item = &'a String> + 'a {
        a.keys().chain(b.keys()).filter(move |name| a.get(*name) != b.get(*name))
    }
    differ(&before.targets, &after.targets).chain(differ(&before.awaiting, &after.awaiting)).cloned().collect()
}

/// Merges the shared state `theirs`, read again after an outage, into `ours`, this
/// process's view, of which only the servers in `kept` changed during the outage.
/// Those keep this process's entry (or its absence: a kick sent meanwhile); every
/// other server takes the shared state's, so that what this view did not see while
/// the database was away (a kick another compiler sent, a run since reported) is
/// not brought back. Histories and counters merge as in [`merge_states`].
pub fn merge_kept(ours: &mut PlannerState, mut theirs: PlannerState, kept: &BTreeSet<String>, keep: usize) {
    for name in kept {
        match ours.targets.remove(name) {
            Some(target) => theirs.targets.insert(name.clone(), target),
            None => theirs.targets.remove(name),
        };
        match ours.awaiting.remove(name) {
            Some(awaiting) => theirs.awaiting.insert(name.clone(), awaiting),
            None => theirs.awaiting.remove(name),
        };
    }
    ours.targets = std::mem::take(&mut theirs.targets);
    ours.awaiting = std::mem::take(&mut theirs.awaiting);
    merge_states(ours, theirs, keep);
}

/// Merges `theirs` into `ours` as [`Planner::merge_unsaved`] does: `ours` wins where
/// both know a server; of the bounded histories, the latest `keep` entries stay.
pub fn merge_states(ours: &mut PlannerState, theirs: PlannerState, keep: usize) {
    ours.generation = ours.generation.max(theirs.generation);
    ours.counters = ours.counters.max(theirs.counters);
    for (name, target) in theirs.targets {
        ours.targets.entry(name).or_insert(target);
    }
    for (name, awaiting) in theirs.awaiting {
        ours.awaiting.entry(name).or_insert(awaiting);
    }
    let mut confirmations: Vec<Confirmation> = ours.confirmations.drain(..).chain(theirs.confirmations).collect();
    confirmations.sort_by(|a, b| (a.at, &a.target, &a.outcome).cmp(&(b.at, &b.target, &b.outcome)));
    confirmations.dedup();
    let skip = confirmations.len().saturating_sub(keep);
    ours.confirmations = confirmations.into_iter().skip(skip).collect();
    let mut outcomes: Vec<OutcomeRecord> = ours.outcomes.drain(..).chain(theirs.outcomes).collect();
    outcomes.sort_by(|a, b| (a.at, &a.target, &a.result).cmp(&(b.at, &b.target, &b.result)));
    outcomes.dedup();
    let skip = outcomes.len().saturating_sub(keep);
    ours.outcomes = outcomes.into_iter().skip(skip).collect();
}
