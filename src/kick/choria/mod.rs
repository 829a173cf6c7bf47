//! Choria's protocol version 1, as the kick transport speaks it: a request to the
//! `puppet` agent (`runonce`; a rollout's `disable`, `enable` and `last_run_summary`)
//! directed to one or more servers, and each server's reply, as bytes. Pure and
//! synchronous: no network here (the NATS connection is the transport's job), so every
//! rule below is tested on its own, and the reply decoder is fuzzed
//! (`fuzz/fuzz_targets/choria_reply.rs`).
//!
//! Why Choria: Puppet removed mcollective in Puppet 6, and Choria, its maintained
//! successor, ships the same `puppet` agent over NATS. Its messages nest:
//!
//! ```text
//! transport  {"protocol":"choria:transport:1","data":base64(secure),"headers":{...}}
//!  secure    {"protocol":"choria:secure:request:1","message":request,"signature":..,"pubcert":..}
//!   request  {"protocol":"choria:request:1","message":base64(rpc),"envelope":{...}}
//!    rpc     {"agent":"puppet","action":"runonce","data":{...}}
//! ```
//!
//! and a reply nests the same way: transport → `choria:secure:reply:1` (`message`,
//! `hash`) → `choria:reply:1` (`message`, `envelope`) → the RPC reply
//! `{"statuscode":..,"statusmsg":..,"data":{...}}`.
//!
//! Where each rule comes from (choria-io/go-choria unless said otherwise):
//! - The JSON shapes and their required fields: the schemas
//!   `protocol/v1/schema/{request,secure_request,secure_reply,transport}.json`
//!   (also under `internal/fs/schemas/choria/protocol/v1/`): `requestid` 32
//!   characters, `ttl` at least 30, the filter's `fact`, `cf_class`, `identity` and
//!   `compound` all required.
//! - Field names and their order: `protocol/v1/request.go` (`protocol`, `message`,
//!   `envelope{requestid, senderid, callerid, collective, agent, ttl, time, filter}`),
//!   `reply.go` (`envelope{requestid, senderid, agent, time}`), `security_request.go`
//!   (`message`, `signature`, `pubcert`: the field is `message`, not `request`),
//!   `security_reply.go` (`message`, `hash`), `transport.go` (`data`, `headers{reply-to,
//!   mc_sender, seen-by, federation}`, empty ones left out).
//! - The secure request's `message` is the request's JSON text itself, and
//!   `signature` is base64 of the signature over exactly that text
//!   (`security_request.go` `SetMessage`: `SignString(j)`); the signature is RSA
//!   PKCS#1 v1.5 with SHA-256 (`secure_request.json`'s description of `signature`).
//!   `pubcert` is the PEM certificate (`constructors.go` `NewSecureRequest`).
//! - The request's `message` is base64 of the RPC body: the server decodes it so
//!   (`message/message.go` `NewMessageFromRequest`: `SetBase64Payload(req.Message())`,
//!   which keeps the text as it is when it is not base64, so a server takes the plain
//!   JSON some go-choria clients send as well). The body is `{"agent","action","data"}`
//!   (`providers/agent/mcorpc/client/client.go` `RPCRequest`), `data` a JSON object
//!   whose keys Go writes sorted.
//! - A reply's `hash` is base64 of SHA-256 over the reply's JSON text, compared by
//!   `secureReply.Valid`; the reply's `message` is the RPC reply's JSON text, which
//!   the client parses as it is (`providers/agent/mcorpc/client/util.go`
//!   `ParseReply`). Base64 of it is accepted too (see [`decode_reply`]).
//! - Subjects: a directed request goes to `<collective>.node.<identity>`
//!   (`choria/connection.go` `NodeDirectedTarget`); replies come to
//!   `<collective>.reply.<md5 hex of callerid>.<requestid>` (`message/message.go`
//!   `ReplyTarget`), the subject a Choria broker lets a client with that caller id
//!   subscribe to (its `setClientPermissions`: `*.reply.<md5(caller)>.>`).
//! - The caller id is `choria=<certname>`: a Choria server caches the `pubcert` only
//!   when its name is the caller id's certname and matches its allow-list
//!   (`.mcollective` or `.choria` by default).
//! - A directed request's filter names its agent (`message/message.go` `SetType`:
//!   `AddAgentFilter` for `direct_request`); this codec also names the target's
//!   identity, so a request that reached another server by mistake is ignored there.
//! - The `runonce` inputs and outputs: choria-plugins/puppet-agent
//!   `files/mcollective/agent/puppet.json` (`force`, `splay` booleans, `splaylimit`
//!   a number, `environment` a string of at most 50 word characters; outputs
//!   `summary` and `initiated_at`, the agent's clock when the run was started).
//!   Failures come as a non-zero `statuscode` with the agent's message: they are read
//!   as the mcollective transport reads them ([`crate::kick::classify`]), so every
//!   transport maps to the planner's outcomes alike.
//! - `disable` (`message`: `shellsafe`, at most 120 characters), `enable` and
//!   `last_run_summary` (outputs `lastrun`, `failed_resources`, `changed_resources`,
//!   `total_resources` and the `summary` itself): the same DDL; the agent answers
//!   an agent already disabled, or already enabled, with `statuscode` 1 and its
//!   reason in `status`.
//!
//! Nothing from the peer is trusted: a reply is refused past [`MAX_REPLY_BYTES`]
//! before it is parsed, its hash is checked, and its request id and sender must be
//! ours. The hash only proves the reply's integrity: Choria v1 replies are not signed,
//! so that the sender is the target rests on the broker (TLS, and its ACLs that keep
//! servers off reply subjects).

mod credentials;
mod error;
mod reply;
mod request;
mod settings;
mod transport;

pub use credentials::Credentials;
pub use error::{CredentialError, ReplyError, RequestError};
pub use reply::{claimed_sender, decode_reply, ActionReply, Expected, MAX_REPLY_BYTES};
pub use request::{
    directed_request, directed_subject, reply_subject, Action, Caller, Destination, DirectedRequest, RequestId,
    RunOnce, AGENT, MAX_TARGETS, MIN_TTL,
};
pub use settings::{parse_brokers, runonce_inputs, Broker, ChoriaSettings, SetupError, DEFAULT_NATS_PORT};
pub use transport::ChoriaTransport;

/// `protocol` of each message, as go-choria's `protocol/protocol.go` names them.
pub const TRANSPORT_V1: &str = "choria:transport:1";
pub const SECURE_REQUEST_V1: &str = "choria:secure:request:1";
pub const REQUEST_V1: &str = "choria:request:1";
pub const SECURE_REPLY_V1: &str = "choria:secure:reply:1";
pub const REPLY_V1: &str = "choria:reply:1";

#[cfg(test)]
mod tests;
