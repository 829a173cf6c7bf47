//! A server's reply to a `runonce`, from the bytes the broker delivered: bounded,
//! its hash checked, its request id and sender ours, then read as the planner's
//! outcome.

use super::error::{clip, ReplyError};
use super::request::{RequestId, AGENT};
use super::{REPLY_V1, SECURE_REPLY_V1, TRANSPORT_V1};
use crate::kick::{classify, Outcome};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use ring::digest::{digest, SHA256};
use serde::Deserialize;
use serde_json::Value;

/// A `runonce` reply is a few hundred bytes (its summary quotes the agent's command);
/// anything past this is refused before it is parsed.
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

/// A checked `runonce` reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOnceReply {
    /// The target that sent it (the envelope's `senderid`).
    pub sender: String,
    /// The reply envelope's `time`: Unix seconds on the server's clock.
    pub time: i64,
    /// mcollective RPC's: 0 OK, 1 aborted, 2 unknown action, 3 missing data,
    /// 4 invalid data, 5 unknown error.
    pub statuscode: i64,
    pub statusmsg: String,
    /// `data.summary`: what the agent did ("Signalled the running Puppet Daemon").
    pub summary: Option<String>,
    /// `data.initiated_at`: Unix seconds on the server's clock when it started the run.
    pub initiated_at: Option<i64>,
}

impl RunOnceReply {
    /// The planner's outcome, read as every transport reads it ([`classify`]); a
    /// started run carries the server's clock (`initiated_at`, else the reply's time),
    /// so its report is told from an earlier run whatever the skew between clocks.
    pub fn outcome(&self) -> Outcome {
        let message = match (self.statusmsg.as_str(), self.summary.as_deref()) {
            ("", Some(summary)) => summary.to_string(),
            (msg, Some(summary)) if !summary.is_empty() && summary != msg && self.statuscode != 0 => {
                format!("{msg}: {summary}")
            }
            (msg, _) => msg.to_string(),
        };
        let message = match message.char_indices().nth(MAX_MESSAGE_CHARS) {
            Some((at, _)) => format!("{}...", &message[..at]),
            None => message,
        };
        match classify(self.statuscode, &message) {
            Outcome::Started => {
                let at = self.initiated_at.filter(|&t| t > 0).or(Some(self.time).filter(|&t| t > 0));
                match at {
                    Some(seconds) => Outcome::StartedAt(seconds.saturating_mul(1000)),
                    None => Outcome::Started,
                }
            }
            outcome => outcome,
        }
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
pub fn decode_reply(bytes: &[u8], expected: &Expected<'_>) -> Result<RunOnceReply, ReplyError> {
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
    let data = rpc.data.as_ref();
    let summary = data.and_then(|d| d.get("summary")).and_then(Value::as_str).map(str::to_string);
    let initiated_at = data.and_then(|d| d.get("initiated_at")).and_then(|v| {
        // Ruby's `Time.now.to_i`: an integer; a float is taken whole.
        v.as_i64().or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
    });
    Ok(RunOnceReply {
        sender: envelope.senderid,
        time: envelope.time,
        statuscode: rpc.statuscode,
        statusmsg: rpc.statusmsg,
        summary,
        initiated_at,
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
