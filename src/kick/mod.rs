//! Kicks: when a report shows a kick, the servers it targets run Puppet.
//!
//! [`Planner`] decides (who, when, why not) as a pure state machine driven by an
//! explicit clock, so coalescing, retries and loop suppression are tested without
//! sleeping. The dispatcher (a background thread) asks it what is due, sends
//! mcollective `runonce`, and reports outcomes back.

mod chain;
mod config;
mod graph;
mod planner;
mod policy;
mod service;
mod transport;
mod wire;

pub use chain::Chain;
pub use config::{KickSettings, KEYS as CONFIG_KEYS};
pub use graph::RoleGraph;
pub use planner::{Dispatch, Event, Outcome, Planner, PlannerState, Suppression, Target};
pub use policy::{Policy, RateLedger, RateLimit};
pub use service::{now_ms, KickService, Level, LogLine, STATE_FILE, STATUS_FILE};
pub use transport::{classify, Agent, McoTransport, Transport};
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

/// What the planner needs of a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportKicks {
    pub host: String,
    pub environment: String,
    /// When the run started (`report.time`), to tell a kicked run from an earlier one.
    pub run_started: Millis,
    pub noop: bool,
    pub kicks: Vec<KickSpec>,
}

/// Tunables, from `puppet_kicker.yaml`'s `kick` section.
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
    /// Longest causal chain; a kick beyond it is suppressed.
    pub max_hops: usize,
    pub policy: Policy,
    pub rate_limit: RateLimit,
    /// Log what would be kicked, kick nothing.
    pub dry_run: bool,
    /// Outcomes kept for the status file.
    pub keep_outcomes: usize,
}

impl Default for KickConfig {
    fn default() -> KickConfig {
        KickConfig {
            coalesce_ms: 10_000,
            retry_base_ms: 30_000,
            retry_max_ms: 600_000,
            max_attempts: 6,
            run_timeout_ms: 3_600_000,
            max_hops: 5,
            policy: Policy::allow_all(),
            rate_limit: RateLimit { max: 30, window_ms: 3_600_000 },
            dry_run: false,
            keep_outcomes: 200,
        }
    }
}

#[cfg(test)]
mod tests;
