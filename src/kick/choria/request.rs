//! A request to the `puppet` agent (`runonce`, and a rollout's `disable`, `enable`
//! and `last_run_summary`) directed to one or more servers, as the bytes to publish
//! and the subjects to publish them to and hear the replies on.
//!
//! Several servers share one request as go-choria's direct mode shares it: one
//! signed message, its identity filter naming every target, published unchanged to
//! each target's own subject; every target replies on the one reply subject, and
//! the replies are told apart by their sender. One RSA signature then serves a
//! batch of kicks, where signing was most of a kick's cost.

use super::credentials::Credentials;
use super::error::RequestError;
use super::{REQUEST_V1, SECURE_REQUEST_V1, TRANSPORT_V1};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use md5::{Digest, Md5};
use serde::Serialize;
use std::fmt;

/// The agent that runs Puppet (choria-plugins/puppet-agent).
pub const AGENT: &str = "puppet";
/// Choria's least `ttl` (`request.json`: `"minimum": 30`).
pub const MIN_TTL: u32 = 30;
/// The longest name this codec puts in a subject or envelope (a certname is a DNS
/// name: 253 characters).
const MAX_NAME: usize = 255;
/// The `puppet` DDL's `maxlength` of `environment`.
const MAX_ENVIRONMENT: usize = 50;
/// The `puppet` DDL's `maxlength` of `disable`'s `message`.
const MAX_MESSAGE: usize = 120;
/// The most targets one request names: its identity filter (about 30 bytes each,
/// sent to every target) stays a few kilobytes.
pub const MAX_TARGETS: usize = 64;

/// `runonce`'s inputs (the `puppet` agent's DDL, `puppet.json`); each is sent only
/// when set, as `mco puppet runonce` sends only the options given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunOnce {
    /// Run now, without the agent's splay.
    pub force: Option<bool>,
    pub splay: Option<bool>,
    /// Seconds; the DDL's type is `number`.
    pub splaylimit: Option<u32>,
    /// The Puppet environment to run in.
    pub environment: Option<String>,
}

/// An action of the `puppet` agent, with its inputs (`puppet.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action<'a> {
    RunOnce(&'a RunOnce),
    /// Holds scheduled runs off; `message` says why (`puppet agent --disable MSG`).
    Disable {
        message: &'a str,
    },
    Enable,
    /// The last run's summary (the agent's `load_summary`), without its logs.
    LastRunSummary,
}

impl Action<'_> {
    pub fn name(&self) -> &'static str {
        match self {
            Action::RunOnce(_) => "runonce",
            Action::Disable { .. } => "disable",
            Action::Enable => "enable",
            Action::LastRunSummary => "last_run_summary",
        }
    }

    /// The RPC request's `data`, checked against the DDL; its keys sorted as Go
    /// writes a map's.
    fn data(&self) -> Result<serde_json::Value, RequestError> {
        let mut data = serde_json::Map::new();
        match self {
            Action::RunOnce(inputs) => {
                if let Some(env) = &inputs.environment {
                    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
                    if env.is_empty() || env.len() > MAX_ENVIRONMENT || !env.bytes().all(word) {
                        return Err(RequestError::BadEnvironment(super::error::clip(env)));
                    }
                    data.insert("environment".into(), env.as_str().into());
                }
                if let Some(force) = inputs.force {
                    data.insert("force".into(), force.into());
                }
                if let Some(splay) = inputs.splay {
                    data.insert("splay".into(), splay.into());
                }
                if let Some(limit) = inputs.splaylimit {
                    data.insert("splaylimit".into(), limit.into());
                }
            }
            Action::Disable { message } => {
                // The DDL's `shellsafe` validator, and its length.
                let unsafe_text = ["`", "$", ";", "|", "&&", ">", "<"].iter().any(|s| message.contains(s))
                    || message.chars().any(char::is_control);
                if message.chars().count() > MAX_MESSAGE || unsafe_text {
                    return Err(RequestError::BadMessage(super::error::clip(message)));
                }
                data.insert("message".into(), (*message).into());
            }
            Action::Enable | Action::LastRunSummary => {}
        }
        Ok(serde_json::Value::Object(data))
    }
}

/// Who asks: the envelope's `senderid` and `callerid`, the transport's `mc_sender`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// This host's Choria identity (`senderid`, `mc_sender`), usually its FQDN.
    pub sender: String,
    /// The client certificate's name: the caller id is `choria=<certname>`, and a
    /// Choria server accepts the certificate only under that name.
    pub certname: String,
}

impl Caller {
    pub fn caller_id(&self) -> String {
        format!("choria={}", self.certname)
    }
}

/// A request's id: 32 lowercase hex digits (`request.json`: 32 characters; go-choria
/// makes them from a UUID without its dashes).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RequestId(String);

impl RequestId {
    /// 128 bits from the operating system.
    pub fn random() -> Result<RequestId, RequestError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|_| RequestError::NoRandomness)?;
        Ok(RequestId(hex(&bytes)))
    }

    pub fn parse(id: &str) -> Result<RequestId, RequestError> {
        if id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            Ok(RequestId(id.to_string()))
        } else {
            Err(RequestError::BadRequestId(super::error::clip(id)))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestId({})", self.0)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What to publish, where, and where the replies come.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectedRequest {
    /// `<collective>.node.<target>` of each target, in the destination's order: the
    /// payload is published unchanged to each.
    pub subjects: Vec<String>,
    /// `<collective>.reply.<md5(callerid)>.<requestid>`: subscribe before publishing.
    pub reply_to: String,
    pub request_id: RequestId,
    /// The transport message, JSON.
    pub payload: Vec<u8>,
}

/// `<collective>.node.<identity>` (go-choria `NodeDirectedTarget`).
pub fn directed_subject(collective: &str, target: &str) -> Result<String, RequestError> {
    Ok(format!("{}.node.{}", name("collective", collective, false)?, name("target", target, true)?))
}

/// `<collective>.reply.<md5 hex of callerid>.<requestid>` (go-choria `ReplyTarget`).
pub fn reply_subject(collective: &str, caller: &Caller, id: &RequestId) -> Result<String, RequestError> {
    let collective = name("collective", collective, false)?;
    let caller_md5 = hex(&Md5::digest(caller.caller_id().as_bytes()));
    Ok(format!("{collective}.reply.{caller_md5}.{id}"))
}

/// Where a request goes: servers (their Choria identities, their certnames) in one
/// collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Destination<'a> {
    pub collective: &'a str,
    /// One to [`MAX_TARGETS`], none twice.
    pub targets: &'a [&'a str],
}

/// `puppet#<action>` to each of `to`'s targets, signed with `credentials`, valid `ttl`
/// seconds from `now` (Unix seconds, this host's clock).
pub fn directed_request(
    credentials: &Credentials,
    caller: &Caller,
    to: Destination<'_>,
    action: Action<'_>,
    id: RequestId,
    ttl: u32,
    now: i64,
) -> Result<DirectedRequest, RequestError> {
    let Destination { collective, targets } = to;
    if targets.is_empty() || targets.len() > MAX_TARGETS {
        return Err(RequestError::TargetCount { count: targets.len(), limit: MAX_TARGETS });
    }
    let subjects = targets.iter().map(|target| directed_subject(collective, target)).collect::<Result<Vec<_>, _>>()?;
    if let Some(twice) = targets.iter().enumerate().find_map(|(i, t)| targets[..i].contains(t).then_some(*t)) {
        return Err(RequestError::TargetTwice(super::error::clip(twice)));
    }
    let reply_to = reply_subject(collective, caller, &id)?;
    name("sender", &caller.sender, true)?;
    name("certname", &caller.certname, true)?;
    if ttl < MIN_TTL {
        return Err(RequestError::TtlTooShort(ttl));
    }
    let rpc = RpcRequest { agent: AGENT, action: action.name(), data: action.data()? };
    let caller_id = caller.caller_id();
    let request = Request {
        protocol: REQUEST_V1,
        message: BASE64.encode(json(&rpc)),
        envelope: Envelope {
            requestid: id.as_str(),
            senderid: &caller.sender,
            callerid: &caller_id,
            collective,
            agent: AGENT,
            ttl,
            time: now,
            filter: Filter { fact: [], cf_class: [], agent: [AGENT], identity: targets, compound: [] },
        },
    };
    let request_json = json(&request);
    let signature = credentials.sign(request_json.as_bytes()).map_err(RequestError::Signing)?;
    let secure = SecureRequest {
        protocol: SECURE_REQUEST_V1,
        message: &request_json,
        signature: BASE64.encode(signature),
        pubcert: credentials.certificate_pem(),
    };
    let transport = Transport {
        protocol: TRANSPORT_V1,
        data: BASE64.encode(json(&secure)),
        headers: Headers { reply_to: &reply_to, mc_sender: &caller.sender },
    };
    let payload = json(&transport).into_bytes();
    Ok(DirectedRequest { subjects, reply_to, request_id: id, payload })
}

/// A name for a subject or an envelope: not empty, at most [`MAX_NAME`] bytes, no
/// space, control, `*` or `>`; with `dots`, `.`-separated tokens none empty (a
/// certname), without, no `.` at all (a collective is one token).
fn name<'a>(what: &'static str, value: &'a str, dots: bool) -> Result<&'a str, RequestError> {
    let bad_char = |c: char| c.is_whitespace() || c.is_control() || c == '*' || c == '>' || (!dots && c == '.');
    let ok = !value.is_empty()
        && value.len() <= MAX_NAME
        && !value.chars().any(bad_char)
        && value.split('.').all(|token| !token.is_empty());
    if ok {
        Ok(value)
    } else {
        Err(RequestError::BadName { what, value: super::error::clip(value) })
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes.iter().flat_map(|b| [DIGITS[usize::from(b >> 4)] as char, DIGITS[usize::from(b & 15)] as char]).collect()
}

/// These types hold only strings, numbers and options: serializing cannot fail.
fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

// The messages, their fields in go-choria's order (`protocol/v1/*.go`).

#[derive(Serialize)]
struct RpcRequest<'a> {
    agent: &'a str,
    action: &'a str,
    data: serde_json::Value,
}

#[derive(Serialize)]
struct Request<'a> {
    protocol: &'a str,
    message: String,
    envelope: Envelope<'a>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    requestid: &'a str,
    senderid: &'a str,
    callerid: &'a str,
    collective: &'a str,
    agent: &'a str,
    ttl: u32,
    time: i64,
    filter: Filter<'a>,
}

#[derive(Serialize)]
struct Filter<'a> {
    fact: [(); 0],
    cf_class: [&'a str; 0],
    agent: [&'a str; 1],
    identity: &'a [&'a str],
    compound: [(); 0],
}

#[derive(Serialize)]
struct SecureRequest<'a> {
    protocol: &'a str,
    message: &'a str,
    signature: String,
    pubcert: &'a str,
}

#[derive(Serialize)]
struct Transport<'a> {
    protocol: &'a str,
    data: String,
    headers: Headers<'a>,
}

#[derive(Serialize)]
struct Headers<'a> {
    #[serde(rename = "reply-to")]
    reply_to: &'a str,
    mc_sender: &'a str,
}
