//! How a kick reaches a server: mcollective `runonce`, directed, in the collective
//! named after the server's environment (the main collective when there is none, as
//! the original did).

use super::planner::{Dispatch, Outcome};
use super::{Millis, RunStatus};
use crate::mcollective::marshal::Value;
use crate::mcollective::Client;
use std::time::Duration;

/// Sends one `runonce`; implemented over mcollective, SSH, and by tests. A rollout
/// also holds agents off and lets them go, and asks how their last run went: a
/// transport that can says so with [`Transport::controls_agents`].
pub trait Transport: Send + Sync {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome;

    /// How many `runonce` calls the dispatcher may make at once (each from a thread
    /// of its own); 1, one after the other, unless the transport says otherwise.
    fn max_parallel(&self) -> usize {
        1
    }

    /// Whether [`Transport::disable`], [`Transport::enable`] and
    /// [`Transport::last_run`] work: without them there is no rollout.
    fn controls_agents(&self) -> bool {
        false
    }

    /// Disables Puppet on `target` with `message` (`puppet agent --disable`): no
    /// scheduled run starts until it is enabled. An agent already disabled is an
    /// error (someone else's hold is not taken over).
    fn disable(&self, target: &Server<'_>, message: &str) -> Result<(), String> {
        let _ = (target, message);
        Err(self.no_control())
    }

    /// Enables Puppet on `target` again (`puppet agent --enable`).
    fn enable(&self, target: &Server<'_>) -> Result<(), String> {
        let _ = target;
        Err(self.no_control())
    }

    /// How `target`'s last run went (`last_run_summary`).
    fn last_run(&self, target: &Server<'_>) -> Result<LastRun, String> {
        let _ = target;
        Err(self.no_control())
    }

    /// Why a transport without agent control refuses.
    fn no_control(&self) -> String {
        "this kick transport cannot disable, enable or ask a server's agent for its last run".to_string()
    }
}

/// A server as a transport reaches it: its certname and its environment (which
/// decides its mcollective collective).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Server<'a> {
    pub certname: &'a str,
    pub environment: &'a str,
}

/// How a server's last Puppet run went, as its agent says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastRun {
    /// When the run ended, on the server's clock (`time.last_run`); `None`: it never
    /// ran.
    pub at: Option<Millis>,
    /// `failed` when a resource or an event failed, or when the summary has no
    /// resources (the catalog itself failed); else `changed` when a resource
    /// changed; else `unchanged`.
    pub status: RunStatus,
}

impl LastRun {
    /// Reads `last_run_summary`'s counts: failed and changed resources, failed
    /// events, and whether the summary has resources at all.
    pub fn from_counts(
        at: Option<Millis>,
        has_resources: bool,
        failed: i64,
        failed_events: i64,
        changed: i64,
    ) -> LastRun {
        let status = if !has_resources || failed > 0 || failed_events > 0 {
            RunStatus::Failed
        } else if changed > 0 {
            RunStatus::Changed
        } else {
            RunStatus::Unchanged
        };
        LastRun { at, status }
    }
}

/// Which mcollective agent runs Puppet on the servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Agent {
    /// mcollective-puppet-agent's `puppet`: `runonce` with `force`, `splay`, `splaylimit`.
    Puppet { force: bool, splay: bool, splaylimit: Option<u32> },
    /// The legacy `puppetd` agent the original used: `runonce` with `forcerun`, sent
    /// as the String `"true"` as `mco puppetd runonce` sends it: the DDLs in the field
    /// declare it a string, or not at all.
    Puppetd,
}

impl Agent {
    pub fn name(&self) -> &'static str {
        match self {
            Agent::Puppet { .. } => "puppet",
            Agent::Puppetd => "puppetd",
        }
    }

    fn inputs(&self) -> Vec<(String, Value)> {
        match self {
            Agent::Puppet { force, splay, splaylimit } => {
                let mut inputs =
                    vec![("force".to_string(), Value::Bool(*force)), ("splay".to_string(), Value::Bool(*splay))];
                if let Some(limit) = splaylimit {
                    inputs.push(("splaylimit".to_string(), Value::Int(i64::from(*limit))));
                }
                inputs
            }
            Agent::Puppetd => vec![("forcerun".to_string(), Value::str("true"))],
        }
    }
}

pub struct McoTransport {
    client: Client,
    agent: Agent,
    timeout: Duration,
}

impl McoTransport {
    pub fn new(client: Client, agent: Agent, timeout: Duration) -> McoTransport {
        McoTransport { client, agent, timeout }
    }

    fn collective_for(&self, environment: &str) -> String {
        let config = self.client.config();
        if config.collectives.iter().any(|c| c == environment) {
            environment.to_string()
        } else {
            config.main_collective.clone()
        }
    }
}

impl McoTransport {
    /// One directed request of the agent's `action` to `target`: its reply, or why
    /// none (no reply, a request error, a failed action with its message).
    fn call(&self, target: &Server<'_>, action: &str, inputs: &[(String, Value)]) -> Result<Value, String> {
        let collective = self.collective_for(target.environment);
        let nodes = [target.certname.to_string()];
        let outcome = self
            .client
            .rpc_directed(&collective, self.agent.name(), action, inputs, &nodes, self.timeout)
            .map_err(|e| format!("mcollective: {e}"))?;
        let reply = outcome
            .replies
            .into_iter()
            .find(|r| r.sender == target.certname)
            .ok_or_else(|| format!("no reply to {}#{action}", self.agent.name()))?;
        if reply.statuscode != 0 {
            return Err(format!("{} (status {})", reply.statusmsg, reply.statuscode));
        }
        Ok(reply.data)
    }
}

impl Transport for McoTransport {
    fn controls_agents(&self) -> bool {
        matches!(self.agent, Agent::Puppet { .. })
    }

    fn no_control(&self) -> String {
        "kick.agent puppetd (the legacy agent) cannot disable with a message nor give its last run summary: \
         use kick.agent puppet"
            .to_string()
    }

    fn disable(&self, target: &Server<'_>, message: &str) -> Result<(), String> {
        if !self.controls_agents() {
            return Err(self.no_control());
        }
        self.call(target, "disable", &[("message".to_string(), Value::str(message))]).map(|_| ())
    }

    fn enable(&self, target: &Server<'_>) -> Result<(), String> {
        if !self.controls_agents() {
            return Err(self.no_control());
        }
        self.call(target, "enable", &[]).map(|_| ())
    }

    fn last_run(&self, target: &Server<'_>) -> Result<LastRun, String> {
        if !self.controls_agents() {
            return Err(self.no_control());
        }
        let data = self.call(target, "last_run_summary", &[])?;
        Ok(last_run_of(&data))
    }

    fn runonce(&self, dispatch: &Dispatch) -> Outcome {
        let collective = self.collective_for(&dispatch.environment);
        let nodes = [dispatch.target.clone()];
        match self.client.rpc_directed(
            &collective,
            self.agent.name(),
            "runonce",
            &self.agent.inputs(),
            &nodes,
            self.timeout,
        ) {
            Ok(outcome) => match outcome.replies.into_iter().find(|r| r.sender == dispatch.target) {
                // The reply's msgtime is the agent's clock: the kicked run's report
                // is then matched whatever the skew between master and agent.
                Some(reply) => match classify(reply.statuscode, &reply.statusmsg) {
                    Outcome::Started if reply.msgtime > 0 => Outcome::StartedAt(reply.msgtime.saturating_mul(1000)),
                    outcome => outcome,
                },
                None => Outcome::NoReply,
            },
            Err(e) => Outcome::Failed(format!("mcollective: {e}")),
        }
    }
}

/// A `last_run_summary` reply's data (mcollective-puppet-agent's outputs).
pub fn last_run_of(data: &Value) -> LastRun {
    let int = |v: Option<&Value>| v.and_then(Value::as_int).unwrap_or(0);
    let at = int(data.get_sym("lastrun"));
    let summary = data.get_sym("summary");
    let resources = summary.and_then(|s| s.get_str("resources")).filter(|r| r.as_hash().is_some_and(|h| !h.is_empty()));
    let failed_events = int(summary.and_then(|s| s.get_str("events")).and_then(|e| e.get_str("failure")));
    LastRun::from_counts(
        (at > 0).then(|| at.saturating_mul(1000)),
        resources.is_some() || data.get_sym("total_resources").is_some_and(|t| t.as_int().unwrap_or(0) > 0),
        int(data.get_sym("failed_resources")),
        failed_events,
        int(data.get_sym("changed_resources")),
    )
}

/// mcollective's codes for a request the agent refuses as such (unknown action,
/// missing or invalid data: its DDL rejects an input): sending it again cannot help.
const REFUSED_REQUEST: [i64; 3] = [2, 3, 4];

/// Reads a `runonce` reply: both agents refuse a run with a message, not a distinct code.
pub fn classify(statuscode: i64, statusmsg: &str) -> Outcome {
    if statuscode == 0 {
        return Outcome::Started;
    }
    let message = statusmsg.to_ascii_lowercase();
    let why = format!("{statusmsg} (status {statuscode})");
    if REFUSED_REQUEST.contains(&statuscode) {
        return Outcome::Refused(why);
    }
    if message.contains("currently applying") || message.contains("is running") || message.contains("in progress") {
        Outcome::Busy(why)
    } else if message.contains("disabled") {
        Outcome::Disabled(why)
    } else {
        Outcome::Failed(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_agents_refusals_are_read() {
        assert_eq!(classify(0, "OK"), Outcome::Started);
        assert!(matches!(classify(1, "Puppet is currently applying a catalog, cannot run now"), Outcome::Busy(_)));
        assert!(matches!(classify(1, "Lock file and PID file exist; puppetd is running."), Outcome::Busy(_)));
        assert!(matches!(classify(1, "Puppet is disabled, cannot run now"), Outcome::Disabled(_)));
        assert!(matches!(classify(1, "Empty Lock file exists; puppetd is disabled."), Outcome::Disabled(_)));
        assert_eq!(classify(5, "boom"), Outcome::Failed("boom (status 5)".into()));
    }

    #[test]
    fn a_request_the_agents_ddl_rejects_is_refused_not_retried() {
        let why = "Input forcerun does not match validation regex (status 4)";
        assert_eq!(classify(4, "Input forcerun does not match validation regex"), Outcome::Refused(why.into()));
        assert!(matches!(classify(2, "Unknown action runonce"), Outcome::Refused(_)));
        assert!(matches!(classify(3, "missing data"), Outcome::Refused(_)));
        assert!(matches!(classify(1, "Puppet is currently applying a catalog"), Outcome::Busy(_)));
    }

    #[test]
    fn agents_send_their_own_inputs() {
        let puppet = Agent::Puppet { force: true, splay: false, splaylimit: Some(30) };
        assert_eq!(puppet.name(), "puppet");
        assert_eq!(
            puppet.inputs(),
            vec![
                ("force".to_string(), Value::Bool(true)),
                ("splay".to_string(), Value::Bool(false)),
                ("splaylimit".to_string(), Value::Int(30))
            ]
        );
        // A String, as `mco puppetd runonce --forcerun` sends it, not a Boolean.
        assert_eq!(Agent::Puppetd.inputs(), vec![("forcerun".to_string(), Value::str("true"))]);
    }
}

#[cfg(test)]
mod last_run_tests {
    use super::*;

    fn sym(name: &str, value: Value) -> (Value, Value) {
        (Value::sym(name), value)
    }

    fn summary(resources: &[(&str, i64)], failures: i64) -> Value {
        let counts =
            |pairs: &[(&str, i64)]| Value::Hash(pairs.iter().map(|(k, v)| (Value::str(*k), Value::Int(*v))).collect());
        Value::Hash(vec![
            (Value::str("resources"), counts(resources)),
            (Value::str("events"), counts(&[("failure", failures), ("success", 1)])),
            (Value::str("time"), counts(&[("last_run", 1_795_000_000)])),
        ])
    }

    fn reply(lastrun: i64, failed: i64, changed: i64, summary: Value) -> Value {
        Value::Hash(vec![
            sym("lastrun", Value::Int(lastrun)),
            sym("failed_resources", Value::Int(failed)),
            sym("changed_resources", Value::Int(changed)),
            sym("total_resources", Value::Int(7)),
            sym("summary", summary),
        ])
    }

    #[test]
    fn a_last_run_summary_says_when_the_run_ended_and_how() {
        let ok = reply(1_795_000_000, 0, 0, summary(&[("total", 7), ("changed", 0)], 0));
        assert_eq!(last_run_of(&ok), LastRun { at: Some(1_795_000_000_000), status: RunStatus::Unchanged });
        let changed = reply(1_795_000_000, 0, 2, summary(&[("total", 7), ("changed", 2)], 0));
        assert_eq!(last_run_of(&changed).status, RunStatus::Changed);
        let failed = reply(1_795_000_000, 1, 2, summary(&[("total", 7), ("failed", 1)], 0));
        assert_eq!(last_run_of(&failed).status, RunStatus::Failed, "a failed resource fails the run, changes or not");
        let event = reply(1_795_000_000, 0, 0, summary(&[("total", 7)], 1));
        assert_eq!(last_run_of(&event).status, RunStatus::Failed);
    }

    #[test]
    fn a_summary_without_resources_is_a_failed_catalog_and_none_at_all_never_ran() {
        // Puppet writes a summary with no resources when the catalog failed to compile.
        let no_catalog = Value::Hash(vec![
            sym("lastrun", Value::Int(1_795_000_000)),
            sym("summary", Value::Hash(vec![(Value::str("version"), Value::Hash(vec![]))])),
        ]);
        assert_eq!(last_run_of(&no_catalog).status, RunStatus::Failed);
        let never = Value::Hash(vec![sym("lastrun", Value::Int(0)), sym("summary", Value::Hash(vec![]))]);
        assert_eq!(last_run_of(&never).at, None);
    }
}
