//! Kicks: when a report shows a kick, the servers it targets run Puppet.
//!
//! [`Planner`] decides (who, when, why not) as a pure state machine driven by an
//! explicit clock, so coalescing, retries and loop suppression are tested without
//! sleeping. The dispatcher (a background thread) asks it what is due, sends
//! mcollective `runonce`, and reports outcomes back.

mod chain;
pub mod choria;
mod config;
mod graph;
mod planner;
mod policy;
pub mod postgresql;
mod service;
pub mod ssh;
mod store;
mod transport;
mod wire;

pub use chain::Chain;
pub use config::{KickSettings, ReplyTimeoutTooLong, TransportKind};
pub use graph::{RoleGraph, MAX_ROLE_CYCLES_LISTED, MAX_ROLE_EDGES};
pub use planner::{
    merge_states, Awaiting, Claim, Confirmation, Counters, Dispatch, Event, Outcome, Planner, PlannerState, Resolved,
    ResolvedKick, Suppression, Target, CONFIRM_BUCKETS, CONFIRM_POLL_MS,
};
pub use policy::{Policy, RateLedger, RateLimit};
pub use service::{
    load_state, now_ms, status_document, KickError, KickService, Level, LogLine, NoTransport, Progress,
    MAX_LOG_LINES_PER_REPORT, STATE_FILE, STATUS_FILE,
};
pub use ssh::{SshConfigError, SshSettings, SshTransport};
pub use store::{decode_state, read_state, Begun, FileStore, Health, Outage, StateError, StateStore, MAX_STATE_SIZE};
pub use transport::{classify, last_run_of, Agent, LastRun, McoTransport, Server, Transport};
pub use wire::parse_report;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// What a report asks to kick.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Selector {
    /// Servers with any of these roles (`/regex/` allowed), as `servers_with_role`.
    Roles(Vec<String>),
    /// Servers matching every clause, as `servers_with_facts`.
    Facts(Vec<String>),
}

/// One kick found in a report: a changed `Notify[kick -> ROLE]` or a refreshed
/// `Kick[...]` resource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KickSpec {
    /// The resource that asked, e.g. `Notify[kick -> haproxy]`, for the log.
    pub resource: String,
    pub selector: Selector,
    /// The targets' environment; the report's when absent.
    pub environment: Option<String>,
}

/// How a run ended, as its report says (`report.status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Changed,
    Unchanged,
    Failed,
}

impl RunStatus {
    /// Puppet's word for it, as reports and the metrics' `outcome` label say it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Changed => "changed",
            RunStatus::Unchanged => "unchanged",
            RunStatus::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<RunStatus> {
        match text {
            "changed" => Some(RunStatus::Changed),
            "unchanged" => Some(RunStatus::Unchanged),
            "failed" => Some(RunStatus::Failed),
            _ => None,
        }
    }
}

/// What confirms a kick (`kick.confirm_by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfirmBy {
    /// The target's report, through this machine's `kick` report processor.
    Reports,
    /// The transport's `last_run_summary` of the target, asked every 15 s.
    Transport,
    /// Reports, except for kicks from a masterless report (`puppet apply`): their
    /// targets' reports stay on the targets.
    Auto,
}

/// What the planner needs of a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportKicks {
    pub host: String,
    pub environment: String,
    /// When the run started (`report.time`), to tell a kicked run from an earlier one.
    pub run_started: Millis,
    pub noop: bool,
    pub kicks: Vec<KickSpec>,
    /// Masterless (`puppet apply`): the process whose run this report is. It holds
    /// the host's agent lock until it exits, so a kick of the host waits for that.
    pub reporter_pid: Option<u32>,
    /// How the run ended (`report.status`): confirms a kick of this server. Absent
    /// from a report the processor did not read it from (a test's, an old caller's).
    pub status: Option<RunStatus>,
}

/// Tunables, from `puppet_kicker.yaml`'s `kick` section (defaults: the `kick.*` keys of
/// `config::KEYS`).
#[derive(Clone, Debug, PartialEq)]
pub struct KickConfig {
    /// Kicks of one server within this window become one run.
    pub coalesce_ms: Millis,
    /// First retry delay after busy/disabled/no answer; doubles each attempt.
    pub retry_base_ms: Millis,
    pub retry_max_ms: Millis,
    /// Attempts before a kick is given up (and logged as failed).
    pub max_attempts: u32,
    /// A kicked run whose report has not arrived after this long counts as finished.
    pub run_timeout_ms: Millis,
    /// A kick whose server has not reported a run started after it, within this
    /// long, is unconfirmed (`kick.confirm_within`).
    pub confirm_within_ms: Millis,
    /// What confirms a kick: its server's report, or the transport's last-run summary.
    pub confirm_by: ConfirmBy,
    /// Longest causal chain; a kick beyond it is suppressed.
    pub max_hops: usize,
    /// Which roles may kick which.
    pub policy: Policy,
    /// Which environments a report's kick may name besides the report's own.
    pub environments: Policy,
    /// What one report may cost: kicks, roles and clauses, targets.
    pub budget: ReportBudget,
    /// A dispatch unanswered for this long was lost with the process that sent it
    /// (a master restarted, a `puppet apply` killed) and is sent again. Never
    /// sooner: another live process may be waiting for its reply right now.
    pub in_flight_timeout_ms: Millis,
    /// Without the agent's clock in the `runonce` reply, a report whose run started
    /// up to this long before the kick was sent still counts as the kicked run.
    pub clock_skew_ms: Millis,
    /// A role-to-role edge not seen for this long is forgotten, with its cycles.
    pub role_graph_ttl_ms: Millis,
    pub rate_limit: RateLimit,
    /// Log what would be kicked, kick nothing.
    pub dry_run: bool,
    /// Outcomes kept for the status file.
    pub keep_outcomes: usize,
}

/// What one report may make the master do; past a limit, the rest of the report's
/// kicks are suppressed and logged as over budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportBudget {
    /// Kicks processed per report.
    pub kicks: usize,
    /// Roles and fact clauses (each may be a regex matched over the fleet).
    pub clauses: usize,
    /// Servers all the report's kicks resolve to.
    pub targets: usize,
}

#[cfg(test)]
mod tests;
