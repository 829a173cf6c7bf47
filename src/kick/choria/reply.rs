//! A server's reply to a request of the `puppet` agent, from the bytes the broker
//! delivered: bounded, its hash checked, its request id and sender ours; then read
//! as the planner's outcome (`runonce`), as done or refused (`disable`, `enable`), or
//! as the last run (`last_run_summary`).

use super::error::{clip, ReplyError};
use super::request::{RequestId, AGENT};
use super::{REPLY_V1, SECURE_REPLY_V1, TRANSPORT_V1};
use crate::kick::{classify, LastRun, Outcome};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use ring::digest::{digest, SHA256};
use serde::Deserialize;
use serde_json::Value;

/// A `runonce` reply is a few hundred bytes (its summary quotes the agent's command),
/// a `last_run_summary` a few kilobytes (the summary, and the count of each resource
/// type); anything past this is refused before it is parsed.
pub const MAX_REPLY_BYTES: usize = 64 * 1024;
/// At most this many characters of the agent's message are kept in an outcome.
const MAX_MESSAGE_CHARS: usize = 200;

/// What the reply must answer: our request, from one of its targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected<'a> {
    pub request_id: &'a RequestId,
    /// The targets' Choria identities (their certnames).
    pub targets: &'a [&'a str],
}

/// A checked reply.
#[derive(Clone, Debug, PartialEq)]
pub struct ActionReply {
    /// The target that sent it (the envelope's `senderid`).
    pub sender: String,
    /// The reply envelope's `time`: Unix seconds on the server's clock.
    pub time: i64,
    /// mcollective RPC's: 0 OK, 1 aborted, 2 unknown action, 3 missing data,
    /// 4 invalid data, 5 unknown error.
    pub statuscode: i64,
    pub statusmsg: String,
    /// The action's outputs (`Null` when the reply has none).
    pub data: Value,
}

impl ActionReply {
    /// `data.summary` of a `runonce`: what the agent did ("Signalled the running
    /// Puppet Daemon").
    pub fn summary(&self) -> Option<&str> {
        self.data.get("summary").and_then(Value::as_str)
    }

    /// `data.initiated_at` of a `runonce`: Unix seconds on the server's clock when it
    /// started the run. Ruby's `Time.now.to_i`: an integer; a float is taken whole.
    pub fn initiated_at(&self) -> Option<i64> {
        let v = self.data.get("initiated_at")?;
        v.as_i64().or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
    }

    /// The agent's message, bounded: `statusmsg`, with `summary` where it says more.
    fn message(&self) -> String {
        let message = match (self.statusmsg.as_str(), self.summary()) {
            ("", Some(summary)) => summary.to_string(),
            (msg, Some(summary)) if !summary.is_empty() && summary != msg && self.statuscode != 0 => {
                format!("{msg}: {summary}")
            }
            (msg, _) => msg.to_string(),
        };
        match message.char_indices().nth(MAX_MESSAGE_CHARS) {
            Some((at, _)) => format!("{}...", &message[..at]),
            None => message,
        }
    }

    /// A `runonce` reply as the planner's outcome, read as every transport reads it
    /// ([`classify`]); a started run carries the server's clock (`initiated_at`,
    /// else the reply's time), so its report is told from an earlier run whatever
    /// the skew between clocks.
    pub fn outcome(&self) -> Outcome {
        match classify(self.statuscode, &self.message()) {
            Outcome::Started => {
                let at = self.initiated_at().filter(|&t| t > 0).or(Some(self.time).filter(|&t| t > 0));
                match at {
                    Some(seconds) => Outcome::StartedAt(seconds.saturating_mul(1000)),
                    None => Outcome::Started,
                }
            }
            outcome => outcome,
        }
    }

    /// A `disable` or `enable` reply: done, or the agent's reason ("Could not
    /// disable Puppet: Already disabled").
    pub fn done(&self) -> Result<(), String> {
        if self.statuscode == 0 {
            Ok(())
        } else {
            let status = self.data.get("status").and_then(Value::as_str).filter(|s| !s.is_empty());
            let said = status.map_or_else(|| self.message(), clip);
            Err(format!("{said} (status {})", self.statuscode))
        }
    }

    /// A `last_run_summary` reply as the last run: `lastrun` (0: never ran), the
    /// failed and changed resources, and the summary's failed events and resources.
    pub fn last_run(&self) -> Result<LastRun, String> {
        self.done()?;
        let int = |v: Option<&Value>| v.and_then(Value::as_i64).unwrap_or(0);
        let summary = self.data.get("summary");
        let resources =
            summary.and_then(|s| s.get("resources")).and_then(Value::as_object).is_some_and(|r| !r.is_empty());
        let failed_events = int(summary.and_then(|s| s.get("events")).and_then(|e| e.get("failure")));
        let at = int(self.data.get("lastrun"));
        Ok(LastRun::from_counts(
            (at > 0).then(|| at.saturating_mul(1000)),
            resources || int(self.data.get("total_resources")) > 0,
            int(self.data.get("failed_resources")),
            failed_events,
            int(self.data.get("changed_resources")),
        ))
    }
}

/// Reads a reply published on our reply subject: the transport, the secure reply
/// (its `hash` must be the SHA-256 of its `message`), the reply (its `requestid`
/// ours, its `senderid` one of the targets and the transport's `mc_sender` where
/// given, its agent `puppet`), and the RPC reply in it.
///
/// The RPC reply is taken as JSON text, as go-choria writes it, or as base64 of it
/// (as the request's is): a JSON object starts with `{`, which base64 never does,
/// so the two cannot be mistaken for each other.
pub fn decode_reply(bytes: &[u8], expected: &Expected<'_>) -> Result<ActionReply, ReplyError> {
    if bytes.len() > MAX_REPLY_BYTES {
        return Err(ReplyError::TooLarge { len: bytes.len(), limit: MAX_REPLY_BYTES });
    }
    let transport: TransportIn = parse("transport", bytes)?;
    protocol("transport", &transport.protocol, TRANSPORT_V1)?;
    let mc_sender = transport.headers.and_then(|h| h.mc_sender);
    if let Some(sender) = &mc_sender {
        if !expected.targets.contains(&sender.as_str()) {
            return Err(ReplyError::Sender { field: "mc_sender", found: clip(sender) });
        }
    }
    let secure_json = base64_text("data", &transport.data)?;
    let secure: SecureReplyIn = parse("secure reply", secure_json.as_bytes())?;
    protocol("secure reply", &secure.protocol, SECURE_REPLY_V1)?;
    let hash = BASE64.decode(secure.hash.as_bytes()).map_err(|_| ReplyError::Base64 { field: "hash" })?;
    if hash != digest(&SHA256, secure.message.as_bytes()).as_ref() {
        return Err(ReplyError::HashMismatch);
    }

    let reply: ReplyIn = parse("reply", secure.message.as_bytes())?;
    protocol("reply", &reply.protocol, REPLY_V1)?;
    let envelope = reply.envelope;
    if envelope.requestid != expected.request_id.as_str() {
        return Err(ReplyError::RequestId { found: clip(&envelope.requestid) });
    }
    let named = mc_sender.as_ref().is_none_or(|sender| *sender == envelope.senderid);
    if !named || !expected.targets.contains(&envelope.senderid.as_str()) {
        return Err(ReplyError::Sender { field: "senderid", found: clip(&envelope.senderid) });
    }
    if envelope.agent != AGENT {
        return Err(ReplyError::Agent { found: clip(&envelope.agent) });
    }

    let rpc_json = if reply.message.trim_start().starts_with('{') {
        reply.message
    } else {
        base64_text("message", &reply.message)?
    };
    let rpc: RpcReplyIn = parse("RPC reply", rpc_json.as_bytes())?;
    Ok(ActionReply {
        sender: envelope.senderid,
        time: envelope.time,
        statuscode: rpc.statuscode,
        statusmsg: rpc.statusmsg,
        data: rpc.data.unwrap_or(Value::Null),
    })
}

/// Who a reply says it is from: its transport's `mc_sender` header, read without
/// checking anything else. Not to be trusted (anyone on the reply subject can write
/// it): it only says which target a refused reply claimed to answer for, so that
/// the refusal is reported against that target rather than every one still waiting.
pub fn claimed_sender(bytes: &[u8]) -> Option<String> {
    if bytes.len() > MAX_REPLY_BYTES {
        return None;
    }
    let transport: TransportIn = serde_json::from_slice(bytes).ok()?;
    transport.headers?.mc_sender
}

fn parse<'de, T: Deserialize<'de>>(layer: &'static str, bytes: &'de [u8]) -> Result<T, ReplyError> {
    serde_json::from_slice(bytes).map_err(|e| ReplyError::Json { layer, why: clip(&e.to_string()) })
}

fn protocol(layer: &'static str, found: &str, expected: &str) -> Result<(), ReplyError> {
    if found == expected {
        Ok(())
    } else {
        Err(ReplyError::Protocol { layer, found: clip(found) })
    }
}

fn base64_text(field: &'static str, encoded: &str) -> Result<String, ReplyError> {
    let bytes = BASE64.decode(encoded.as_bytes()).map_err(|_| ReplyError::Base64 { field })?;
    String::from_utf8(bytes).map_err(|_| ReplyError::NotText { field })
}

// The messages as go-choria writes them; fields not listed are ignored, as Go does.

#[derive(Deserialize)]
struct TransportIn {
    protocol: String,
    data: String,
    #[serde(default)]
    headers: Option<HeadersIn>,
}

#[derive(Deserialize)]
struct HeadersIn {
    #[serde(default)]
    mc_sender: Option<String>,
}

#[derive(Deserialize)]
struct SecureReplyIn {
    protocol: String,
    message: String,
    hash: String,
}

#[derive(Deserialize)]
struct ReplyIn {
    protocol: String,
    message: String,
    envelope: ReplyEnvelopeIn,
}

#[derive(Deserialize)]
struct ReplyEnvelopeIn {
    requestid: String,
    senderid: String,
    agent: String,
    time: i64,
}

#[derive(Deserialize)]
struct RpcReplyIn {
    statuscode: i64,
    #[serde(default)]
    statusmsg: String,
    #[serde(default)]
    data: Option<Value>,
}
