//! The kick state machine. Per target server: at most one pending kick (coalescing
//! what arrives within the window), at most one kicked run in progress, and at most
//! one follow-up for kicks that arrive during that run. Nothing is dropped silently:
//! every kick ends as started, suppressed (with the reason) or given up (logged).

use super::chain::Chain;
use super::graph::RoleGraph;
use super::policy::RateLedger;
use super::{KickConfig, Millis, ReportKicks};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;

/// A server a kick resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub certname: String,
    pub role: Option<String>,
}

/// A `runonce` to send now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatch {
    pub target: String,
    pub environment: String,
    pub chain: Chain,
    pub attempt: u32,
}

/// How a `runonce` went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Started,
    /// "Puppet is currently applying a catalog": a run that began before the kick.
    Busy(String),
    Disabled(String),
    NoReply,
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Suppression {
    SelfKick,
    Cycle(Chain),
    HopLimit(Chain),
    Policy { source_role: Option<String>, target_role: Option<String> },
    RateLimited,
    Noop,
}

/// Something the operator should see in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Queued { target: String, chain: Chain, due: Millis },
    Coalesced { target: String, chain: Chain },
    FollowUp { target: String, chain: Chain },
    WouldKick { target: String, chain: Chain },
    Suppressed { source: String, target: Option<String>, resource: String, reason: Suppression },
    NoTargets { source: String, resource: String, environment: String },
    Started { target: String, chain: Chain, attempt: u32 },
    Retrying { target: String, why: String, attempt: u32, next: Millis },
    GaveUp { target: String, why: String, attempts: u32, chain: Chain },
    RunFinished { target: String, chain: Chain },
    RunTimedOut { target: String, chain: Chain },
    NewRoleCycle { cycle: Vec<String> },
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
                let why = match reason {
                    Suppression::SelfKick => "a server does not kick itself".to_string(),
                    Suppression::Cycle(chain) => format!("it would close a loop: {chain}"),
                    Suppression::HopLimit(chain) => format!("the chain exceeds max_hops: {chain}"),
                    Suppression::Policy { source_role, target_role } => format!(
                        "policy does not let role {} kick role {}",
                        source_role.as_deref().unwrap_or("(none)"),
                        target_role.as_deref().unwrap_or("(none)")
                    ),
                    Suppression::RateLimited => format!("{source} exceeded its kick rate limit"),
                    Suppression::Noop => "the run was --noop".to_string(),
                };
                write!(f, "kick of {target} by {source} ({resource}) suppressed: {why}")
            }
            Event::NoTargets { source, resource, environment } => {
                write!(f, "{resource} from {source} matches no server in environment {environment}")
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
    pub targets: BTreeMap<String, TargetState>,
    pub outcomes: VecDeque<OutcomeRecord>,
    pub rate: RateLedger,
    pub graph: RoleGraph,
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
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    pub started: Millis,
    pub chain: Chain,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeRecord {
    pub at: Millis,
    pub target: String,
    pub result: String,
    pub chain: String,
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
    /// the role of a certname (for policy and the role graph).
    pub fn on_report(
        &mut self,
        report: &ReportKicks,
        now: Millis,
        mut resolve: impl FnMut(&super::Selector, &str) -> Vec<Target>,
        role_of: impl Fn(&str) -> Option<String>,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        let chain = self.finish_run(&report.host, report.run_started, &mut events);
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
        let source_role = role_of(&report.host);
        for kick in &report.kicks {
            let environment = kick.environment.as_deref().unwrap_or(&report.environment);
            let targets = resolve(&kick.selector, environment);
            if targets.is_empty() {
                events.push(Event::NoTargets {
                    source: report.host.clone(),
                    resource: kick.resource.clone(),
                    environment: environment.to_string(),
                });
            }
            for target in targets {
                let suppressed = |reason| Event::Suppressed {
                    source: report.host.clone(),
                    target: Some(target.certname.clone()),
                    resource: kick.resource.clone(),
                    reason,
                };
                if target.certname == report.host {
                    events.push(suppressed(Suppression::SelfKick));
                    continue;
                }
                if let (Some(from), Some(to)) = (&source_role, &target.role) {
                    if self.state.graph.add(from, to) {
                        events.extend(self.new_cycles_through(from, to));
                    }
                }
                if !self.config.policy.allows(source_role.as_deref(), target.role.as_deref()) {
                    let reason =
                        Suppression::Policy { source_role: source_role.clone(), target_role: target.role.clone() };
                    events.push(suppressed(reason));
                    continue;
                }
                let extended = chain.then(&target.certname);
                if chain.contains(&target.certname) {
                    events.push(suppressed(Suppression::Cycle(extended)));
                    continue;
                }
                if extended.hops() > self.config.max_hops {
                    events.push(suppressed(Suppression::HopLimit(extended)));
                    continue;
                }
                if self.config.dry_run {
                    events.push(Event::WouldKick { target: target.certname, chain: extended });
                    continue;
                }
                events.push(self.enqueue(&target.certname, environment, extended, now));
            }
        }
        self.state.rate.prune(self.config.rate_limit, now);
        events
    }

    /// Kicks whose time has come; they are in flight until `on_outcome`.
    pub fn due(&mut self, now: Millis) -> (Vec<Dispatch>, Vec<Event>) {
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
            if target.running.is_some() {
                continue;
            }
            let ready =
                |p: &&mut Pending| (!p.in_flight || now - p.dispatched_at >= STALE_IN_FLIGHT_MS) && p.due <= now;
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
        (dispatches, events)
    }

    /// Records how a dispatched `runonce` went.
    pub fn on_outcome(&mut self, target_name: &str, outcome: Outcome, now: Millis) -> Vec<Event> {
        let config = &self.config;
        let Some(target) = self.state.targets.get_mut(target_name) else { return Vec::new() };
        let Some(mut pending) = target.pending.take() else { return Vec::new() };
        pending.in_flight = false;
        let why = match outcome {
            Outcome::Started => {
                let event = Event::Started {
                    target: target_name.into(),
                    chain: pending.chain.clone(),
                    attempt: pending.attempts,
                };
                target.running = Some(Running { started: now, chain: pending.chain.clone() });
                self.record(now, target_name, "started".into(), &pending.chain);
                return vec![event];
            }
            Outcome::Busy(why) | Outcome::Disabled(why) | Outcome::Failed(why) => why,
            Outcome::NoReply => "no reply".to_string(),
        };
        if pending.attempts >= config.max_attempts {
            let event = Event::GaveUp {
                target: target_name.into(),
                why: why.clone(),
                attempts: pending.attempts,
                chain: pending.chain.clone(),
            };
            // A kick that arrived meanwhile was never tried: it gets its own attempts.
            target.pending = target.follow_up.take();
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

    /// When the dispatcher should look again.
    pub fn next_wakeup(&self) -> Option<Millis> {
        self.state
            .targets
            .values()
            .filter_map(|t| match (&t.running, &t.pending) {
                (Some(running), _) => Some(running.started + self.config.run_timeout_ms),
                (None, Some(p)) if !p.in_flight => Some(p.due),
                _ => None,
            })
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

    /// Ends `host`'s kicked run if this report is from it, and returns the chain the
    /// report carries: the kick's, or a new one starting at `host`.
    fn finish_run(&mut self, host: &str, run_started: Millis, events: &mut Vec<Event>) -> Chain {
        let Some(target) = self.state.targets.get_mut(host) else { return Chain::origin(host) };
        match &target.running {
            Some(running) if run_started >= running.started - CLOCK_SKEW_MS => {
                let chain = running.chain.clone();
                events.push(Event::RunFinished { target: host.into(), chain: chain.clone() });
                target.running = None;
                if let Some(follow_up) = target.follow_up.take() {
                    target.pending = Some(follow_up);
                }
                chain
            }
            _ => Chain::origin(host),
        }
    }

    fn enqueue(&mut self, name: &str, environment: &str, chain: Chain, now: Millis) -> Event {
        let due = now + self.config.coalesce_ms;
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
        };
        let busy = target.running.is_some() || target.pending.as_ref().is_some_and(|p| p.in_flight);
        let slot = if busy { &mut target.follow_up } else { &mut target.pending };
        match slot {
            Some(existing) => {
                existing.chain = existing.chain.merge(&chain);
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

    fn new_cycles_through(&self, from: &str, to: &str) -> Vec<Event> {
        let through = |cycle: &Vec<String>| cycle.windows(2).any(|w| w[0] == from && w[1] == to);
        self.state.graph.cycles().into_iter().filter(through).map(|cycle| Event::NewRoleCycle { cycle }).collect()
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

/// A dispatch unanswered for this long was lost with the process that sent it (a
/// master restarted, a `puppet apply` killed); it is then sent again. Never sooner:
/// another live process may be sending it right now.
pub(crate) const STALE_IN_FLIGHT_MS: Millis = 120_000;

/// A report's start time may precede our dispatch by this much and still be the
/// kicked run (clocks of master and agent differ a little).
const CLOCK_SKEW_MS: Millis = 2_000;
