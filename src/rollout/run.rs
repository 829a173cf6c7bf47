//! `puppet kicker rollout run`: a plan carried out through the kick transport, one
//! bounded step at a time, its whole state saved after each step so that a crash
//! loses nothing (`--resume`) and an abort re-enables what it disabled.
//!
//! The steps, as the seeds' Choria orchestrator does them:
//!
//! 1. disable Puppet on every target, with a message naming the rollout, so that no
//!    scheduled run interferes;
//! 2. per batch: enable each server, `runonce` it, and wait until every run of the
//!    batch is confirmed by the server's own last-run summary (a run that ended
//!    after it started: changed, unchanged or failed);
//! 3. stop at the first batch with a failure (a failed run, a `runonce` refused, no
//!    confirmation within `timeout_per_batch`) unless told to go on;
//! 4. at the end or on abort, enable every server it disabled and has not yet run.
//!
//! [`Rollout::step`] is the only thing that talks to servers, and it does a bounded
//! amount of work (at most [`STEP_CALLS`] transport calls), so the caller (the face)
//! can show progress and take a signal between steps. A server is never sent a
//! second `runonce` by the same rollout: a resumed one waits for the run it started.

use crate::kick::{Chain, Dispatch, Millis, Outcome, RunStatus, Server, Transport};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Transport calls one step makes at most.
pub const STEP_CALLS: usize = 16;
/// A `runonce` refused as busy (a run started before the disable) is tried again
/// after this long, until the batch's timeout.
const BUSY_RETRY_MS: Millis = 5_000;
/// Seconds of slack for the agent's whole-second clock.
const CLOCK_SLACK_MS: Millis = 1_000;

/// One batch of a group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// The group's name (its roles), for the operator.
    pub group: String,
    pub servers: Vec<String>,
}

/// Where one server stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ServerState {
    /// Not yet disabled.
    Planned,
    /// Disabled by this rollout, not yet run.
    Disabled,
    /// Enabled and sent `runonce`; `agent_started` is the agent's clock when it said
    /// so, `retry_at` when a busy agent is asked again.
    Running { kicked_at: Millis, agent_started: Option<Millis>, started: bool, retry_at: Millis },
    /// Its run ended: `changed` or `unchanged`.
    Done { status: String, after_ms: Millis },
    /// Its run failed, or it could not be disabled, enabled or run.
    Failed { why: String },
    /// Enabled again without running (the rollout stopped first).
    Released,
    /// Never disabled nor run (the rollout stopped while disabling).
    Skipped,
}

/// Where the rollout stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    Disabling,
    Batch {
        index: usize,
        started_at: Millis,
    },
    /// Re-enabling what it disabled and did not run, then `Stopped`.
    Stopping {
        why: String,
    },
    Stopped {
        why: String,
    },
    Finished,
}

/// A rollout and everything it did so far: what `rollout.json` holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    pub id: String,
    pub environment: String,
    /// The message servers are disabled with (it names the rollout).
    pub message: String,
    pub continue_on_failure: bool,
    pub timeout_per_batch_ms: Millis,
    pub batches: Vec<Batch>,
    pub servers: BTreeMap<String, ServerState>,
    pub phase: Phase,
    pub started_at: Millis,
    pub updated_at: Millis,
}

/// What a step did, for the log and the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub warning: bool,
    pub text: String,
}

/// A summary for the progress line and `rollout status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Progress {
    pub batch: usize,
    pub batches: usize,
    pub done: usize,
    pub failed: usize,
    pub running: usize,
    pub disabled: usize,
    pub servers: usize,
}

/// Largest `rollout.json` taken: a rollout of 100,000 servers is a few MB.
pub const MAX_STATE_BYTES: usize = 64 << 20;

/// A saved rollout from `rollout.json`'s bytes, checked: every server of its batches
/// has a state and every state a batch, once; its phase points into its batches. A
/// file edited by hand or cut short is refused with the reason, never half used.
pub fn decode(bytes: &[u8]) -> Result<Rollout, String> {
    if bytes.len() > MAX_STATE_BYTES {
        return Err(format!("{} bytes, more than {MAX_STATE_BYTES}", bytes.len()));
    }
    let rollout: Rollout = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    rollout.check()?;
    Ok(rollout)
}

impl Rollout {
    /// What [`decode`] checks.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for server in self.batches.iter().flat_map(|b| b.servers.iter()) {
            if !self.servers.contains_key(server) {
                return Err(format!("server {server:?} of a batch has no state"));
            }
            if !seen.insert(server) {
                return Err(format!("server {server:?} is in two batches"));
            }
        }
        if let Some(extra) = self.servers.keys().find(|s| !seen.contains(s)) {
            return Err(format!("server {extra:?} has a state but no batch"));
        }
        if let Phase::Batch { index, .. } = self.phase {
            if index >= self.batches.len() {
                return Err(format!("batch {} of {}", index + 1, self.batches.len()));
            }
        }
        if self.environment.is_empty() || self.id.is_empty() {
            return Err("no id or environment".into());
        }
        Ok(())
    }

    /// A rollout of `batches` (in order; a server in one batch only).
    pub fn new(
        id: &str,
        environment: &str,
        batches: Vec<Batch>,
        continue_on_failure: bool,
        timeout_per_batch_ms: Millis,
        now: Millis,
    ) -> Rollout {
        let servers =
            batches.iter().flat_map(|b| b.servers.iter()).map(|s| (s.clone(), ServerState::Planned)).collect();
        Rollout {
            id: id.to_string(),
            environment: environment.to_string(),
            message: format!("puppet kicker rollout {id}"),
            continue_on_failure,
            timeout_per_batch_ms,
            batches,
            servers,
            phase: Phase::Disabling,
            started_at: now,
            updated_at: now,
        }
    }

    /// Ended: nothing more to do, nothing left disabled.
    pub fn is_over(&self) -> bool {
        matches!(self.phase, Phase::Stopped { .. } | Phase::Finished)
    }

    /// Stops at the next step: what is running finishes on its own, what was
    /// disabled and not run is enabled again.
    pub fn abort(&mut self, why: &str) {
        if !self.is_over() && !matches!(self.phase, Phase::Stopping { .. }) {
            self.phase = Phase::Stopping { why: why.to_string() };
        }
    }

    /// Does at most [`STEP_CALLS`] transport calls of what comes next.
    pub fn step(&mut self, transport: &dyn Transport, now: Millis) -> Vec<Line> {
        self.updated_at = now;
        let mut lines = Vec::new();
        match self.phase.clone() {
            Phase::Disabling => self.disable_some(transport, &mut lines),
            Phase::Batch { index, started_at } => self.run_batch(transport, index, started_at, now, &mut lines),
            Phase::Stopping { why } => self.release_some(transport, &why, &mut lines),
            Phase::Stopped { .. } | Phase::Finished => {}
        }
        lines
    }

    fn server<'a>(&'a self, certname: &'a str) -> Server<'a> {
        Server { certname, environment: &self.environment }
    }

    /// Certnames in plan order.
    fn ordered(&self) -> impl Iterator<Item = &String> + '_ {
        self.batches.iter().flat_map(|b| b.servers.iter())
    }

    fn disable_some(&mut self, transport: &dyn Transport, lines: &mut Vec<Line>) {
        let planned: Vec<String> =
            self.ordered().filter(|s| self.servers[*s] == ServerState::Planned).take(STEP_CALLS).cloned().collect();
        for certname in &planned {
            let state = match transport.disable(&self.server(certname), &self.message) {
                Ok(()) => ServerState::Disabled,
                Err(why) => {
                    let why = format!("could not disable Puppet: {why}");
                    lines.push(warn(format!("{certname}: {why}")));
                    if !self.continue_on_failure {
                        self.servers.insert(certname.clone(), ServerState::Failed { why: why.clone() });
                        self.phase = Phase::Stopping { why: format!("{certname} {why}") };
                        return;
                    }
                    ServerState::Failed { why }
                }
            };
            self.servers.insert(certname.clone(), state);
        }
        if self.servers.values().all(|s| *s != ServerState::Planned) {
            lines.push(info(format!(
                "disabled Puppet on {} servers: {}",
                self.count(|s| *s == ServerState::Disabled),
                self.message
            )));
            self.start_batch(0, self.updated_at, lines);
        }
    }

    fn start_batch(&mut self, index: usize, now: Millis, lines: &mut Vec<Line>) {
        if index >= self.batches.len() {
            self.phase = Phase::Finished;
            lines.push(info(format!("rollout {} finished", self.id)));
            return;
        }
        let batch = &self.batches[index];
        lines.push(info(format!(
            "batch {} of {} ({}): {}",
            index + 1,
            self.batches.len(),
            batch.group,
            batch.servers.join(", ")
        )));
        self.phase = Phase::Batch { index, started_at: now };
    }

    fn run_batch(
        &mut self,
        transport: &dyn Transport,
        index: usize,
        started_at: Millis,
        now: Millis,
        lines: &mut Vec<Line>,
    ) {
        let servers = self.batches[index].servers.clone();
        let mut calls = 0;
        for certname in &servers {
            if calls >= STEP_CALLS {
                break;
            }
            let state = self.servers[certname].clone();
            let next = match state {
                ServerState::Disabled => {
                    calls += 2;
                    self.start_run(transport, certname, now)
                }
                ServerState::Running { started: false, retry_at, .. } if retry_at <= now => {
                    calls += 1;
                    self.start_run(transport, certname, now)
                }
                ServerState::Running { kicked_at, agent_started, started: true, .. } => {
                    calls += 1;
                    self.confirm(transport, certname, kicked_at, agent_started, now)
                }
                _ => None,
            };
            if let Some(next) = next {
                match &next {
                    ServerState::Done { status, after_ms } => {
                        lines.push(info(format!("{certname}: run {status}, {} s after runonce", after_ms / 1000)))
                    }
                    ServerState::Failed { why } => lines.push(warn(format!("{certname}: {why}"))),
                    _ => {}
                }
                self.servers.insert(certname.clone(), next);
            }
        }
        let open = |s: &ServerState| matches!(s, ServerState::Disabled | ServerState::Running { .. });
        if now.saturating_sub(started_at) >= self.timeout_per_batch_ms {
            for certname in &servers {
                if open(&self.servers[certname]) {
                    let why =
                        format!("no confirmed run within --timeout-per-batch {} s", self.timeout_per_batch_ms / 1000);
                    lines.push(warn(format!("{certname}: {why}")));
                    self.servers.insert(certname.clone(), ServerState::Failed { why });
                }
            }
        }
        if servers.iter().any(|s| open(&self.servers[s])) {
            return;
        }
        let failed: Vec<&String> =
            servers.iter().filter(|s| matches!(self.servers[*s], ServerState::Failed { .. })).collect();
        if !failed.is_empty() && !self.continue_on_failure {
            let names: Vec<&str> = failed.iter().map(|s| s.as_str()).collect();
            self.phase = Phase::Stopping { why: format!("batch {} failed: {}", index + 1, names.join(", ")) };
            return;
        }
        self.start_batch(index + 1, now, lines);
    }

    /// Enables `certname` (unless a busy retry) and sends it `runonce`.
    fn start_run(&mut self, transport: &dyn Transport, certname: &str, now: Millis) -> Option<ServerState> {
        let server = self.server(certname);
        if self.servers[certname] == ServerState::Disabled {
            if let Err(why) = transport.enable(&server) {
                return Some(ServerState::Failed { why: format!("could not enable Puppet: {why}") });
            }
        }
        let dispatch = Dispatch {
            target: certname.to_string(),
            environment: self.environment.clone(),
            chain: Chain::origin(&format!("rollout {}", self.id)),
            attempt: 1,
        };
        let running = |agent_started, started| ServerState::Running {
            kicked_at: now,
            agent_started,
            started,
            retry_at: now + BUSY_RETRY_MS,
        };
        Some(match transport.runonce(&dispatch) {
            Outcome::Started => running(None, true),
            Outcome::StartedAt(at) => running(Some(at), true),
            // A run that began before the disable: asked again until the batch's timeout.
            Outcome::Busy(_) => running(None, false),
            Outcome::Disabled(why) => ServerState::Failed { why: format!("runonce refused: {why}") },
            Outcome::NoReply => ServerState::Failed { why: "no reply to runonce".into() },
            Outcome::Failed(why) | Outcome::Refused(why) => {
                ServerState::Failed { why: format!("runonce failed: {why}") }
            }
        })
    }

    /// The server's last run, if it ended after this rollout's `runonce` started it.
    fn confirm(
        &self,
        transport: &dyn Transport,
        certname: &str,
        kicked_at: Millis,
        agent_started: Option<Millis>,
        now: Millis,
    ) -> Option<ServerState> {
        let last = transport.last_run(&self.server(certname)).ok()?;
        let ended = last.at?;
        let since = agent_started.unwrap_or(kicked_at) - CLOCK_SLACK_MS;
        if ended < since {
            return None;
        }
        let after_ms = now.saturating_sub(kicked_at);
        Some(match last.status {
            RunStatus::Failed => ServerState::Failed { why: "its run failed".into() },
            status => ServerState::Done { status: status.as_str().into(), after_ms },
        })
    }

    fn release_some(&mut self, transport: &dyn Transport, why: &str, lines: &mut Vec<Line>) {
        let disabled: Vec<String> =
            self.ordered().filter(|s| self.servers[*s] == ServerState::Disabled).take(STEP_CALLS).cloned().collect();
        for certname in &disabled {
            match transport.enable(&self.server(certname)) {
                Ok(()) => {
                    self.servers.insert(certname.clone(), ServerState::Released);
                }
                Err(e) => {
                    // Left in the state as disabled: the next step tries again.
                    lines.push(warn(format!("{certname}: could not enable Puppet again: {e}")));
                    return;
                }
            }
        }
        if self.servers.values().any(|s| *s == ServerState::Disabled) {
            return;
        }
        for state in self.servers.values_mut() {
            if *state == ServerState::Planned {
                *state = ServerState::Skipped;
            }
        }
        let failed: Vec<&str> = self
            .ordered()
            .filter(|s| matches!(self.servers[*s], ServerState::Failed { .. }))
            .map(String::as_str)
            .collect();
        lines.push(warn(format!(
            "rollout {} stopped: {why}; {} servers not run were enabled again; failed: {}",
            self.id,
            self.count(|s| *s == ServerState::Released),
            if failed.is_empty() { "none".to_string() } else { failed.join(", ") }
        )));
        self.phase = Phase::Stopped { why: why.to_string() };
    }

    fn count(&self, matches: impl Fn(&ServerState) -> bool) -> usize {
        self.servers.values().filter(|s| matches(s)).count()
    }

    pub fn progress(&self) -> Progress {
        let batch = match self.phase {
            Phase::Batch { index, .. } => index + 1,
            Phase::Finished => self.batches.len(),
            _ => 0,
        };
        Progress {
            batch,
            batches: self.batches.len(),
            done: self.count(|s| matches!(s, ServerState::Done { .. })),
            failed: self.count(|s| matches!(s, ServerState::Failed { .. })),
            running: self.count(|s| matches!(s, ServerState::Running { .. })),
            disabled: self.count(|s| *s == ServerState::Disabled),
            servers: self.servers.len(),
        }
    }
}

fn info(text: String) -> Line {
    Line { warning: false, text }
}

fn warn(text: String) -> Line {
    Line { warning: true, text }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kick::LastRun;
    use std::sync::Mutex;

    /// Agents in memory: disabled or not, their last run's end and status, and a log
    /// of every call. `fail_run` names servers whose runs fail; `busy` ones answer
    /// busy once.
    #[derive(Default)]
    struct Fleet {
        disabled: Mutex<BTreeMap<String, bool>>,
        last: Mutex<BTreeMap<String, LastRun>>,
        calls: Mutex<Vec<String>>,
        now: Mutex<Millis>,
        fail_run: Vec<&'static str>,
        busy: Mutex<Vec<&'static str>>,
        cannot_disable: Vec<&'static str>,
    }

    impl Fleet {
        fn call(&self, what: String) {
            self.calls.lock().unwrap().push(what);
        }
        fn runs(&self) -> Vec<String> {
            self.calls.lock().unwrap().iter().filter_map(|c| c.strip_prefix("runonce ").map(String::from)).collect()
        }
        /// The runs started so far end now.
        fn finish_runs(&self) {
            let now = *self.now.lock().unwrap();
            for name in self.runs() {
                let status =
                    if self.fail_run.contains(&name.as_str()) { RunStatus::Failed } else { RunStatus::Changed };
                self.last.lock().unwrap().entry(name).or_insert(LastRun { at: Some(now), status });
            }
        }
    }

    impl Transport for Fleet {
        fn runonce(&self, dispatch: &Dispatch) -> Outcome {
            let mut busy = self.busy.lock().unwrap();
            if let Some(i) = busy.iter().position(|b| *b == dispatch.target) {
                busy.remove(i);
                self.call(format!("busy {}", dispatch.target));
                return Outcome::Busy("Puppet is currently applying a catalog".into());
            }
            if self.disabled.lock().unwrap().get(&dispatch.target) == Some(&true) {
                return Outcome::Disabled("Puppet is disabled".into());
            }
            self.call(format!("runonce {}", dispatch.target));
            Outcome::StartedAt(*self.now.lock().unwrap())
        }
        fn controls_agents(&self) -> bool {
            true
        }
        fn disable(&self, target: &Server<'_>, message: &str) -> Result<(), String> {
            if self.cannot_disable.contains(&target.certname) {
                return Err("Already disabled".into());
            }
            assert!(message.starts_with("puppet kicker rollout "));
            self.call(format!("disable {}", target.certname));
            self.disabled.lock().unwrap().insert(target.certname.into(), true);
            Ok(())
        }
        fn enable(&self, target: &Server<'_>) -> Result<(), String> {
            self.call(format!("enable {}", target.certname));
            self.disabled.lock().unwrap().insert(target.certname.into(), false);
            Ok(())
        }
        fn last_run(&self, target: &Server<'_>) -> Result<LastRun, String> {
            Ok(self
                .last
                .lock()
                .unwrap()
                .get(target.certname)
                .cloned()
                .unwrap_or(LastRun { at: None, status: RunStatus::Failed }))
        }
    }

    fn batches() -> Vec<Batch> {
        let batch = |group: &str, servers: &[&str]| Batch {
            group: group.into(),
            servers: servers.iter().map(|s| s.to_string()).collect(),
        };
        vec![
            batch("db", &["db1", "db2"]),
            batch("node", &["node1", "node2"]),
            batch("node", &["node3"]),
            batch("haproxy", &["lb1"]),
        ]
    }

    /// Steps until the rollout is over, runs ending a second after each step.
    fn drive(rollout: &mut Rollout, fleet: &Fleet, mut now: Millis) -> Vec<Line> {
        let mut lines = Vec::new();
        for _ in 0..1000 {
            if rollout.is_over() {
                return lines;
            }
            *fleet.now.lock().unwrap() = now;
            lines.extend(rollout.step(fleet, now));
            now += 1_000;
            *fleet.now.lock().unwrap() = now;
            fleet.finish_runs();
        }
        panic!("never over: {rollout:?}");
    }

    #[test]
    fn disables_all_then_runs_batch_by_batch_in_order_and_leaves_none_disabled() {
        let fleet = Fleet::default();
        let mut rollout = Rollout::new("r1", "production", batches(), false, 600_000, 1_000_000);
        let lines = drive(&mut rollout, &fleet, 1_000_000);
        assert_eq!(rollout.phase, Phase::Finished, "{lines:?}");
        assert_eq!(fleet.runs(), ["db1", "db2", "node1", "node2", "node3", "lb1"]);
        let calls = fleet.calls.lock().unwrap().clone();
        let first_enable = calls.iter().position(|c| c.starts_with("enable")).unwrap();
        assert!(
            calls[..first_enable].iter().all(|c| c.starts_with("disable")),
            "every server disabled first: {calls:?}"
        );
        assert_eq!(calls.iter().filter(|c| c.starts_with("disable")).count(), 6);
        assert!(fleet.disabled.lock().unwrap().values().all(|d| !d), "none left disabled");
        // Each batch starts only once the one before is confirmed.
        let at = |c: &str| calls.iter().position(|x| x == c).unwrap();
        assert!(at("runonce node1") > at("runonce db2"));
        assert_eq!(
            rollout.progress(),
            Progress { batch: 4, batches: 4, done: 6, failed: 0, running: 0, disabled: 0, servers: 6 }
        );
    }

    #[test]
    fn a_failure_in_batch_two_stops_and_enables_the_servers_not_yet_run() {
        let fleet = Fleet { fail_run: vec!["node2"], ..Fleet::default() };
        let mut rollout = Rollout::new("r2", "production", batches(), false, 600_000, 1_000_000);
        let lines = drive(&mut rollout, &fleet, 1_000_000);
        assert_eq!(rollout.phase, Phase::Stopped { why: "batch 2 failed: node2".into() });
        assert_eq!(fleet.runs(), ["db1", "db2", "node1", "node2"], "nothing after the failed batch runs");
        assert_eq!(rollout.servers["node3"], ServerState::Released);
        assert_eq!(rollout.servers["lb1"], ServerState::Released);
        assert!(fleet.disabled.lock().unwrap().values().all(|d| !d), "none left disabled");
        let last = lines.last().unwrap();
        assert!(last.warning && last.text.contains("2 servers not run were enabled again; failed: node2"), "{last:?}");

        let fleet = Fleet { fail_run: vec!["node2"], ..Fleet::default() };
        let mut rollout = Rollout::new("r3", "production", batches(), true, 600_000, 1_000_000);
        drive(&mut rollout, &fleet, 1_000_000);
        assert_eq!(rollout.phase, Phase::Finished, "--continue-on-failure");
        assert_eq!(fleet.runs().len(), 6);
        assert_eq!(rollout.progress().failed, 1);
    }

    #[test]
    fn an_abort_midway_re_enables_and_a_resumed_rollout_runs_no_server_twice() {
        let fleet = Fleet::default();
        let mut rollout = Rollout::new("r4", "production", batches(), false, 600_000, 1_000_000);
        let mut now = 1_000_000;
        while rollout.progress().batch < 2 {
            rollout.step(&fleet, now);
            now += 1_000;
            *fleet.now.lock().unwrap() = now;
            fleet.finish_runs();
        }
        // A crash here: the saved state is read back and carried on.
        let saved = serde_json::to_string(&rollout).unwrap();
        let mut resumed: Rollout = serde_json::from_str(&saved).unwrap();
        assert_eq!(resumed, rollout);
        drive(&mut resumed, &fleet, now);
        assert_eq!(resumed.phase, Phase::Finished);
        assert_eq!(fleet.runs(), ["db1", "db2", "node1", "node2", "node3", "lb1"], "each once");

        let fleet = Fleet::default();
        let mut rollout = Rollout::new("r5", "production", batches(), false, 600_000, 1_000_000);
        rollout.step(&fleet, 1_000_000);
        rollout.step(&fleet, 1_001_000);
        rollout.abort("SIGTERM");
        drive(&mut rollout, &fleet, 1_002_000);
        assert_eq!(rollout.phase, Phase::Stopped { why: "SIGTERM".into() });
        assert!(fleet.disabled.lock().unwrap().values().all(|d| !d), "none left disabled");
    }

    #[test]
    fn a_busy_server_is_asked_again_and_an_unconfirmed_run_fails_its_batch_at_the_timeout() {
        let fleet = Fleet { busy: Mutex::new(vec!["db1"]), ..Fleet::default() };
        let mut rollout = Rollout::new("r6", "production", batches(), false, 600_000, 1_000_000);
        drive(&mut rollout, &fleet, 1_000_000);
        assert_eq!(rollout.phase, Phase::Finished);
        assert_eq!(fleet.runs()[0], "db2", "db1 was busy first, then ran");
        assert!(fleet.runs().contains(&"db1".to_string()));

        // Runs that never end: the batch times out and the rollout stops.
        let fleet = Fleet::default();
        let mut rollout = Rollout::new("r7", "production", batches(), false, 30_000, 1_000_000);
        let mut now = 1_000_000;
        while !rollout.is_over() {
            rollout.step(&fleet, now);
            now += 1_000;
        }
        assert_eq!(rollout.phase, Phase::Stopped { why: "batch 1 failed: db1, db2".into() });
        assert!(
            matches!(&rollout.servers["db1"], ServerState::Failed { why } if why.contains("--timeout-per-batch 30 s"))
        );
    }

    #[test]
    fn a_saved_rollout_that_does_not_hold_together_is_refused_with_the_reason() {
        let rollout = Rollout::new("r9", "production", batches(), false, 600_000, 1_000_000);
        let good = serde_json::to_vec(&rollout).unwrap();
        assert_eq!(decode(&good).unwrap(), rollout);
        let mut stray = rollout.clone();
        stray.batches[0].servers.push("ghost".into());
        assert_eq!(
            decode(&serde_json::to_vec(&stray).unwrap()).unwrap_err(),
            "server \"ghost\" of a batch has no state"
        );
        let mut twice = rollout.clone();
        twice.batches[1].servers.push("db1".into());
        assert_eq!(decode(&serde_json::to_vec(&twice).unwrap()).unwrap_err(), "server \"db1\" is in two batches");
        let mut orphan = rollout.clone();
        orphan.servers.insert("orphan".into(), ServerState::Planned);
        assert!(decode(&serde_json::to_vec(&orphan).unwrap())
            .unwrap_err()
            .contains("\"orphan\" has a state but no batch"));
        let mut past = rollout;
        past.phase = Phase::Batch { index: 9, started_at: 0 };
        assert_eq!(decode(&serde_json::to_vec(&past).unwrap()).unwrap_err(), "batch 10 of 4");
        assert!(decode(&good[..good.len() / 2]).is_err(), "cut short");
    }

    #[test]
    fn the_fuzz_targets_seeds_are_rollouts_it_can_carry_on() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus-seeds/rollout_state");
        let mut seeds = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rollout = decode(&std::fs::read(&path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!rollout.is_over());
            seeds += 1;
        }
        assert_eq!(seeds, 3);
    }

    #[test]
    fn a_server_that_cannot_be_disabled_stops_the_rollout_before_anything_runs() {
        let fleet = Fleet { cannot_disable: vec!["node1"], ..Fleet::default() };
        let mut rollout = Rollout::new("r8", "production", batches(), false, 600_000, 1_000_000);
        drive(&mut rollout, &fleet, 1_000_000);
        assert!(
            matches!(&rollout.phase, Phase::Stopped { why } if why.contains("node1 could not disable Puppet: Already disabled"))
        );
        assert!(fleet.runs().is_empty());
        assert!(fleet.disabled.lock().unwrap().values().all(|d| !d), "db1 and db2 enabled again");
    }
}
