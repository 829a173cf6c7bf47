//! Destinations and headers of mcollective's `rabbitmq` and `activemq`
//! connector plugins.
//!
//! Frames are built in the same header order as ruby-stomp writes them for
//! mco 2.12.5, so that with STOMP 1.0 they are byte-identical to captured
//! traffic (`content-length` then `content-type` last). This module only
//! builds frames; the client does the I/O.

use std::sync::atomic::{AtomicU64, Ordering};

use super::config::{BrokerHost, Config, ConnectorKind};
use super::stomp::{accept_version, Frame, Version};

/// ruby-stomp labels every frame like this, even binary Marshal bodies.
const CONTENT_TYPE: &str = "text/plain; charset=UTF-8";

/// Reply-queue sequence for activemq: unique across all clients of this
/// process (the queue name carries the pid, and a Puppet master runs many
/// requests at once on threads).
static REPLY_SEQ: AtomicU64 = AtomicU64::new(1);

/// Builds frames for one connector type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connector {
    pub kind: ConnectorKind,
    /// Our identity: `mc_sender`, and part of the activemq reply queue.
    pub identity: String,
    /// CONNECT `host` header.
    pub vhost: String,
}

/// Appends a body with `content-length` and `content-type`, as ruby-stomp does.
fn with_body(frame: Frame, body: Vec<u8>) -> Frame {
    frame.header("content-length", body.len().to_string()).header("content-type", CONTENT_TYPE).body(body)
}

impl Connector {
    pub fn new(config: &Config) -> Connector {
        Connector { kind: config.connector, identity: config.identity.clone(), vhost: config.vhost.clone() }
    }

    /// CONNECT offering `versions`; 1.1+ also asks for no heart-beats.
    pub fn connect(&self, broker: &BrokerHost, versions: &[Version]) -> Frame {
        let mut f = Frame::new("CONNECT")
            .header("accept-version", accept_version(versions))
            .header("host", self.vhost.as_str())
            .header("login", broker.user.as_str())
            .header("passcode", broker.password.as_str());
        if versions.iter().any(|v| *v > Version::V1_0) {
            f = f.header("heart-beat", "0,0");
        }
        with_body(f, Vec::new())
    }

    /// Where replies to a request for `agent` in `collective` arrive.
    /// rabbitmq: a temp-queue named after the agent (always `mcollective_`,
    /// whatever the collective); activemq: a fresh queue per request.
    pub fn reply_queue(&self, collective: &str, agent: &str) -> String {
        match self.kind {
            ConnectorKind::RabbitMq => format!("/temp-queue/mcollective_reply_{agent}"),
            ConnectorKind::ActiveMq => format!(
                "/queue/{collective}.reply.{}_{}.{}",
                self.identity,
                std::process::id(),
                REPLY_SEQ.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    /// activemq needs a SUBSCRIBE to its reply queue; RabbitMQ creates the
    /// temp-queue itself and delivers without one.
    pub fn subscribe(&self, reply_queue: &str, version: Version) -> Option<Frame> {
        if self.kind != ConnectorKind::ActiveMq {
            return None;
        }
        let mut f = Frame::new("SUBSCRIBE").header("destination", reply_queue);
        if version > Version::V1_0 {
            // 1.1+ brokers refuse a SUBSCRIBE without id.
            f = f.header("id", subscription_id(reply_queue)).header("ack", "auto");
        }
        Some(with_body(f, Vec::new()))
    }

    /// The UNSUBSCRIBE matching [`Connector::subscribe`].
    pub fn unsubscribe(&self, reply_queue: &str, version: Version) -> Option<Frame> {
        if self.kind != ConnectorKind::ActiveMq {
            return None;
        }
        let mut f = Frame::new("UNSUBSCRIBE").header("destination", reply_queue);
        if version > Version::V1_0 {
            f = f.header("id", subscription_id(reply_queue));
        }
        Some(with_body(f, Vec::new()))
    }

    /// A SEND of a request: broadcast to every daemon with `agent` when
    /// `node` is None, else directed to that one node.
    pub fn request(&self, req: &RequestRoute<'_>, body: Vec<u8>) -> Frame {
        let ttl_ms = (u64::from(req.ttl) + 10) * 1000;
        let f = match self.kind {
            ConnectorKind::RabbitMq => {
                let dest = match req.node {
                    None => format!("/exchange/{}_broadcast/{}", req.collective, req.agent),
                    Some(node) => format!("/exchange/{}_directed/{node}", req.collective),
                };
                Frame::new("SEND")
                    .header("reply-to", req.reply_to)
                    .header("expiration", ttl_ms.to_string())
                    .header("mc_sender", self.identity.as_str())
                    .header("destination", dest)
            }
            ConnectorKind::ActiveMq => {
                let now_ms = req.now_secs.saturating_mul(1000);
                let mut f = Frame::new("SEND")
                    .header("timestamp", now_ms.to_string())
                    .header("expires", now_ms.saturating_add(ttl_ms).to_string())
                    .header("reply-to", req.reply_to);
                let dest = match req.node {
                    None => format!("/topic/{}.{}.agent", req.collective, req.agent),
                    Some(node) => {
                        f = f.header("mc_identity", node);
                        format!("/queue/{}.nodes", req.collective)
                    }
                };
                f.header("mc_sender", self.identity.as_str()).header("destination", dest)
            }
        };
        with_body(f, body)
    }

    /// DISCONNECT.
    pub fn disconnect(&self) -> Frame {
        with_body(Frame::new("DISCONNECT"), Vec::new())
    }
}

/// Routing data of one request SEND.
#[derive(Clone, Copy, Debug)]
pub struct RequestRoute<'a> {
    pub collective: &'a str,
    pub agent: &'a str,
    /// None: broadcast; Some: directed to this identity.
    pub node: Option<&'a str>,
    pub reply_to: &'a str,
    pub ttl: u32,
    /// Epoch seconds (activemq `timestamp`/`expires`).
    pub now_secs: u64,
}

/// A stable subscription id for a reply queue (1.1+ only).
fn subscription_id(reply_queue: &str) -> String {
    format!("mco-{}", reply_queue.rsplit('/').next().unwrap_or(reply_queue))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(kind: ConnectorKind) -> Connector {
        Connector { kind, identity: "mco-client".into(), vhost: "mcollective".into() }
    }

    #[test]
    fn activemq_reply_queues_are_unique() {
        let c = conn(ConnectorKind::ActiveMq);
        let a = c.reply_queue("mcollective", "rpcutil");
        let b = c.reply_queue("mcollective", "rpcutil");
        assert_ne!(a, b);
        let prefix = format!("/queue/mcollective.reply.mco-client_{}.", std::process::id());
        assert!(a.starts_with(&prefix), "{a}");
    }

    #[test]
    fn subscribe_id_only_from_1_1() {
        let c = conn(ConnectorKind::ActiveMq);
        assert!(c.subscribe("/queue/x", Version::V1_0).unwrap().get("id").is_none());
        assert!(c.subscribe("/queue/x", Version::V1_2).unwrap().get("id").is_some());
        assert!(conn(ConnectorKind::RabbitMq).subscribe("/queue/x", Version::V1_2).is_none());
    }
}
