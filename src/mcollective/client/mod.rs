//! Blocking mcollective client: discovery and RPC over one STOMP connection
//! per call, like `mco` does.
//!
//! Runs on plain threads (no async runtime) inside the Puppet master; a
//! [`Client`] is `Send + Sync` and can be shared. Every reply is verified
//! (PSK hash, our request id, expected sender) before it is returned; what is
//! dropped is counted in [`ClientStats`] so operators can see tampering or
//! crossed wires.
//!
//! - this module: the API ([`Client`]: discovery, broadcast and directed RPC) and
//!   one request's course ([`Client`]'s `call`);
//! - [`resolve`]: a broker's name looked up within the connect timeout;
//! - [`session`]: one STOMP connection: opened (DNS, TCP, TLS, handshake), frames
//!   sent and read, closed;
//! - [`collect`]: the collect loop, which keeps the replies that pass every check,
//!   in arrival order;
//! - [`verify`]: the batches of replies decoded and their signatures checked, on a
//!   second thread once replies come in bursts.

mod collect;
mod resolve;
mod session;
mod verify;

pub use collect::VERIFY_BATCH;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::config::Config;
use super::connector::{Connector, RequestRoute};
use super::error::{Error, Result};
use super::marshal::{DecodeLimits, Value};
use super::message::{self, Filter, Reply, Request, RpcStatus};
use collect::Expect;

/// UNSUBSCRIBE and DISCONNECT get this long (at most the connect timeout):
/// a broker that stops reading cannot hold a finished call.
const GOODBYE_TIME: Duration = Duration::from_secs(1);

/// Counters of what the client received, since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Replies verified and returned.
    pub accepted: u64,
    /// Dropped: `:hash` did not match the PSK.
    pub bad_hash: u64,
    /// Dropped: the reply was for another request id.
    pub foreign_requestid: u64,
    /// Dropped: undecodable Marshal, missing keys, wrong agent, not "pong".
    pub malformed: u64,
    /// Dropped: a second reply from the same sender.
    pub duplicate: u64,
    /// Dropped: a directed request answered by a node it was not sent to.
    pub unexpected_sender: u64,
    /// Frames other than MESSAGE (e.g. RECEIPT) ignored while collecting.
    pub other_frames: u64,
    /// Dropped: `:msgtime` (unsigned) more than the ttl before the request or
    /// after its reception: a replay, or a clock far off.
    pub bad_msgtime: u64,
    /// Dropped: over the call's [`ReplyLimits`](super::ReplyLimits) (count or bytes).
    pub over_limit: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    bad_hash: AtomicU64,
    foreign_requestid: AtomicU64,
    malformed: AtomicU64,
    duplicate: AtomicU64,
    unexpected_sender: AtomicU64,
    other_frames: AtomicU64,
    bad_msgtime: AtomicU64,
    over_limit: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[derive(Clone, Debug, PartialEq)]
pub struct RpcReply {
    /// The node's identity.
    pub sender: String,
    pub agent: String,
    /// The node's clock at reply time (epoch seconds).
    pub msgtime: i64,
    /// 0 OK, 1 aborted, 2 unknown action, 3 missing data, 4 invalid data, 5 error.
    pub statuscode: i64,
    pub statusmsg: String,
    /// The agent's outputs (Hash with symbol keys).
    pub data: Value,
}

impl RpcReply {
    /// The RPC reply inside a verified `reply`: its inner body read as
    /// `{:statuscode, :statusmsg, :data}`.
    pub fn from_reply(reply: Reply, limits: DecodeLimits) -> Result<RpcReply> {
        let status = RpcStatus::from_value(&reply.inner(limits)?)?;
        Ok(RpcReply {
            sender: reply.senderid,
            agent: reply.senderagent,
            msgtime: reply.msgtime,
            statuscode: status.statuscode,
            statusmsg: status.statusmsg,
            data: status.data,
        })
    }
}

/// The verified replies of an RPC call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RpcOutcome {
    /// Sorted by sender.
    pub replies: Vec<RpcReply>,
    /// Directed calls: nodes that did not answer in time (sorted).
    pub missing: Vec<String>,
    /// Senders whose exact signed body also came from another sender in this
    /// call (sorted). The psk signs only the body, so it cannot tell which of
    /// them sent it: callers whose replies must differ per server (inventory)
    /// drop these; replies alike by nature (runonce) keep them.
    pub ambiguous: Vec<String>,
}

/// The verified replies of an RPC call, inner bodies not decoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawOutcome {
    /// Sorted by sender.
    pub replies: Vec<Reply>,
    /// As [`RpcOutcome::ambiguous`].
    pub ambiguous: Vec<String>,
}

/// Verified replies of one call, by sender.
struct Collected {
    replies: BTreeMap<String, Reply>,
    /// Senders whose body another sender sent too.
    ambiguous: BTreeSet<String>,
}

impl From<Collected> for RawOutcome {
    fn from(collected: Collected) -> RawOutcome {
        RawOutcome {
            replies: collected.replies.into_values().collect(),
            ambiguous: collected.ambiguous.into_iter().collect(),
        }
    }
}

/// A blocking mcollective client.
pub struct Client {
    config: Config,
    connector: Connector,
    counters: Counters,
}

impl Client {
    pub fn new(config: Config) -> Client {
        Client { connector: Connector::new(&config), config, counters: Counters::default() }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Snapshot of the drop/accept counters.
    pub fn stats(&self) -> ClientStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClientStats {
            accepted: l(&c.accepted),
            bad_hash: l(&c.bad_hash),
            foreign_requestid: l(&c.foreign_requestid),
            malformed: l(&c.malformed),
            duplicate: l(&c.duplicate),
            unexpected_sender: l(&c.unexpected_sender),
            other_frames: l(&c.other_frames),
            bad_msgtime: l(&c.bad_msgtime),
            over_limit: l(&c.over_limit),
        }
    }

    /// Sends a discovery "ping" and returns the sorted identities that said
    /// "pong". Waits the whole `timeout`, as mco does, unless `expected`
    /// distinct nodes answered earlier.
    pub fn discover(
        &self,
        collective: &str,
        filter: &Filter,
        timeout: Duration,
        expected: Option<usize>,
    ) -> Result<Vec<String>> {
        self.check_collective(collective)?;
        let mut filter = filter.clone();
        // mco names the collective in a discovery filter, but daemons treat a filter
        // holding nothing else as non-empty and unmatched: nobody would answer.
        let unfiltered = filter.fact.is_empty()
            && filter.cf_class.is_empty()
            && filter.agent.is_empty()
            && filter.identity.is_empty()
            && filter.compound.is_empty();
        filter.collective = if unfiltered { None } else { Some(collective.to_string()) };
        let body = message::discovery_body()?;
        // Every "pong" is alike: `ambiguous` means nothing here.
        let replies = self.call(collective, "discovery", &filter, body, None, expected, timeout)?.replies;
        let mut nodes = Vec::new();
        for reply in replies.into_values() {
            match reply.inner(self.config.marshal_limits) {
                Ok(v) if message::is_pong(&v) => nodes.push(reply.senderid),
                _ => bump(&self.counters.malformed),
            }
        }
        self.account_accepted(nodes.len());
        Ok(nodes) // BTreeMap order: sorted
    }

    /// Broadcasts `agent#action` to every node matching `filter`; collects
    /// replies until `expected` nodes answered or `timeout` passed.
    #[allow(clippy::too_many_arguments)]
    pub fn rpc_broadcast(
        &self,
        collective: &str,
        agent: &str,
        action: &str,
        inputs: &[(String, Value)],
        filter: &Filter,
        expected: Option<usize>,
        timeout: Duration,
    ) -> Result<RpcOutcome> {
        let replies = self.broadcast(collective, agent, action, inputs, filter, expected, timeout)?;
        Ok(self.rpc_outcome(replies, None))
    }

    /// [`Client::rpc_broadcast`] with the replies' inner bodies left as their signed
    /// bytes, for a caller that reads them in place (`source::mcollective`). It
    /// reports what it made of them with [`Client::record_inner`].
    #[allow(clippy::too_many_arguments)]
    pub fn rpc_broadcast_raw(
        &self,
        collective: &str,
        agent: &str,
        action: &str,
        inputs: &[(String, Value)],
        filter: &Filter,
        expected: Option<usize>,
        timeout: Duration,
    ) -> Result<RawOutcome> {
        Ok(self.broadcast(collective, agent, action, inputs, filter, expected, timeout)?.into())
    }

    /// What both broadcasts do: the names checked, the request sent to every node
    /// matching `filter`, the replies collected.
    #[allow(clippy::too_many_arguments)]
    fn broadcast(
        &self,
        collective: &str,
        agent: &str,
        action: &str,
        inputs: &[(String, Value)],
        filter: &Filter,
        expected: Option<usize>,
        timeout: Duration,
    ) -> Result<Collected> {
        self.check_collective(collective)?;
        check_name("agent", agent)?;
        check_name("action", action)?;
        let body = message::rpc_body(agent, action, &self.config.callerid, inputs, true)?;
        self.call(collective, agent, filter, body, None, expected, timeout)
    }

    /// Counts inner bodies of [`Client::rpc_broadcast_raw`] replies as accepted or
    /// malformed, as [`Client::rpc_broadcast`] counts those it decodes.
    pub fn record_inner(&self, accepted: usize, malformed: usize) {
        self.account_accepted(accepted);
        self.counters.malformed.fetch_add(u64::try_from(malformed).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Sends `agent#action` to each of `nodes` directly (no discovery);
    /// collects replies until all answered or `timeout` passed.
    pub fn rpc_directed(
        &self,
        collective: &str,
        agent: &str,
        action: &str,
        inputs: &[(String, Value)],
        nodes: &[String],
        timeout: Duration,
    ) -> Result<RpcOutcome> {
        self.check_collective(collective)?;
        check_name("agent", agent)?;
        check_name("action", action)?;
        let mut nodes: Vec<String> = nodes.to_vec();
        nodes.sort();
        nodes.dedup();
        if nodes.is_empty() {
            return Ok(RpcOutcome::default());
        }
        for n in &nodes {
            check_identity(n)?;
        }
        // mco sends directed requests with an agent filter only.
        let filter = Filter { agent: vec![agent.to_string()], ..Filter::default() };
        let body = message::rpc_body(agent, action, &self.config.callerid, inputs, true)?;
        let replies = self.call(collective, agent, &filter, body, Some(&nodes), Some(nodes.len()), timeout)?;
        Ok(self.rpc_outcome(replies, Some(&nodes)))
    }

    fn rpc_outcome(&self, collected: Collected, nodes: Option<&[String]>) -> RpcOutcome {
        let mut out = RpcOutcome { ambiguous: collected.ambiguous.into_iter().collect(), ..RpcOutcome::default() };
        for reply in collected.replies.into_values() {
            match RpcReply::from_reply(reply, self.config.marshal_limits) {
                Ok(rpc) => out.replies.push(rpc),
                Err(_) => bump(&self.counters.malformed),
            }
        }
        self.account_accepted(out.replies.len());
        if let Some(nodes) = nodes {
            out.missing = nodes.iter().filter(|n| !out.replies.iter().any(|r| &r.sender == *n)).cloned().collect();
        }
        out
    }

    fn account_accepted(&self, n: usize) {
        self.counters.accepted.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn check_collective(&self, collective: &str) -> Result<()> {
        if self.config.collectives.iter().any(|c| c == collective) {
            Ok(())
        } else {
            Err(Error::InvalidInput(format!(
                "unknown collective {collective:?} (configured: {})",
                self.config.collectives.join(",")
            )))
        }
    }

    /// One request: connect, (subscribe), send, collect, (unsubscribe), disconnect.
    /// Returns verified replies by sender.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        collective: &str,
        agent: &str,
        filter: &Filter,
        body: Vec<u8>,
        nodes: Option<&[String]>,
        expected: Option<usize>,
        timeout: Duration,
    ) -> Result<Collected> {
        let now = crate::time::now();
        let request = Request {
            senderid: self.config.identity.clone(),
            requestid: message::new_request_id()?,
            filter: filter.clone(),
            collective: collective.to_string(),
            agent: agent.to_string(),
            callerid: self.config.callerid.clone(),
            ttl: i64::from(self.config.ttl),
            msgtime: now,
            body,
        };
        let payload = request.encode(&self.config.psk)?;

        let mut session = self.open()?;
        let reply_to = self.connector.reply_queue(collective, agent);
        // Subscribing and sending count against the call's timeout too.
        let deadline = deadline_after(timeout);
        let result = (|| {
            if let Some(f) = self.connector.subscribe(&reply_to, session.version) {
                session.send(&f, deadline)?;
            }
            let targets: Vec<Option<&str>> = match nodes {
                None => vec![None],
                Some(nodes) => nodes.iter().map(|n| Some(n.as_str())).collect(),
            };
            for node in targets {
                let route = RequestRoute {
                    collective,
                    agent,
                    node,
                    reply_to: &reply_to,
                    ttl: self.config.ttl,
                    now_secs: u64::try_from(now).unwrap_or(0),
                };
                session.send(&self.connector.request(&route, payload.clone()), deadline)?;
            }
            let expect = Expect {
                requestid: &request.requestid,
                agent,
                sent: now,
                ttl: request.ttl,
                count: expected,
                only: nodes,
                deadline,
            };
            self.collect(&mut session, &expect)
        })();
        let goodbye = deadline_after(GOODBYE_TIME.min(self.config.connect_timeout));
        if result.is_ok() {
            if let Some(f) = self.connector.unsubscribe(&reply_to, session.version) {
                // The replies are in hand; a failing goodbye does not undo them.
                let _ = session.send(&f, goodbye);
            }
        }
        session.close(&self.connector, goodbye);
        result
    }
}

/// `now + d`, capped at a day so a huge caller timeout cannot overflow.
fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d.min(Duration::from_secs(86_400))).unwrap_or(now)
}

/// Agent and action names become parts of destinations: keep them `\w+`.
fn check_name(what: &str, name: &str) -> Result<()> {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!("{what} {name:?} is not a \\w+ name")))
    }
}

/// mcollective identities match `/^[\w.\-]+$/`.
fn check_identity(node: &str) -> Result<()> {
    if !node.is_empty() && node.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!("node identity {node:?} does not match /^[\\w.\\-]+$/")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("agent", "rpc_util2").is_ok());
        assert!(check_name("agent", "a/b").is_err());
        assert!(check_name("agent", "").is_err());
        assert!(check_identity("node-1.example.com").is_ok());
        assert!(check_identity("node 1").is_err());
        assert!(check_identity("../x/").is_err());
    }
}
