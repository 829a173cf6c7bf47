//! How a kick reaches a server: mcollective `runonce`, directed, in the collective
//! named after the server's environment (the main collective when there is none, as
//! the original did).

use super::planner::{Dispatch, Outcome};
use crate::mcollective::marshal::Value;
use crate::mcollective::Client;
use std::time::Duration;

/// Sends one `runonce`; implemented over mcollective, SSH, and by tests.
pub trait Transport: Send + Sync {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome;

    /// How many `runonce` calls the dispatcher may make at once (each from a thread
    /// of its own); 1, one after the other, unless the transport says otherwise.
    fn max_parallel(&self) -> usize {
        1
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

impl Transport for McoTransport {
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
