//! What can go wrong building a Choria request or reading its reply, each naming the
//! input at fault. Keys are never quoted: only which file or field was refused.

use std::fmt;

/// The client key or certificate (`kick.choria.*` paths) cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CredentialError {
    /// No PEM private key in the key file (nor a PEM that could be read).
    KeyNotPem,
    /// The key is PEM, but not an RSA key (Choria v1 signs with RSA).
    KeyNotRsa,
    /// `ring` refused the RSA key: a bad encoding, or a length outside 2048..=4096 bits.
    KeyRejected(String),
    /// No PEM certificate in the certificate file.
    CertificateNotPem,
    /// The certificate file holds more than one certificate; which one signs is unclear.
    SeveralCertificates(usize),
    /// The certificate does not hold the key's public key: another pair's half.
    KeyNotCertificates,
    /// `ring` could not sign (it fails only on a buffer of the wrong length).
    SigningFailed,
}

impl fmt::Display for CredentialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialError::KeyNotPem => write!(f, "the Choria client key is not a PEM private key"),
            CredentialError::KeyNotRsa => write!(f, "the Choria client key is not an RSA key (PKCS#1 or PKCS#8)"),
            CredentialError::KeyRejected(why) => write!(f, "the Choria client key was refused: {why}"),
            CredentialError::CertificateNotPem => write!(f, "the Choria client certificate is not a PEM certificate"),
            CredentialError::SeveralCertificates(n) => {
                write!(f, "the Choria client certificate file holds {n} certificates, not one")
            }
            CredentialError::KeyNotCertificates => {
                write!(f, "the Choria client certificate is not the client key's (their public keys differ)")
            }
            CredentialError::SigningFailed => write!(f, "the Choria client key could not sign a request"),
        }
    }
}

impl std::error::Error for CredentialError {}

/// A request that cannot be built as asked.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// A name that goes into a NATS subject or the envelope is empty, too long, or holds
    /// a character a subject cannot (space, control, `*`, `>`, an empty `.` token).
    /// `what` is the input: `target`, `collective`, `sender` or `certname`.
    BadName { what: &'static str, value: String },
    /// `ttl` below Choria's minimum of 30 seconds (`request.json`).
    TtlTooShort(u32),
    /// The `environment` input is not what the `puppet` agent's DDL accepts
    /// (`puppet_variable`: word characters, at most 50).
    BadEnvironment(String),
    /// `disable`'s `message` is not what the DDL accepts (`shellsafe`: none of
    /// `` ` `` `$` `;` `|` `&&` `>` `<`, no control character; at most 120 characters).
    BadMessage(String),
    /// The operating system gave no randomness for a request id.
    NoRandomness,
    /// A request id that is not 32 lowercase hex digits.
    BadRequestId(String),
    /// The client key could not sign the request.
    Signing(CredentialError),
    /// A request names no target, or more than one request may.
    TargetCount { count: usize, limit: usize },
    /// A request names this target twice: it would run twice.
    TargetTwice(String),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::BadName { what, value } => {
                write!(f, "Choria {what} {value:?} cannot be used in a NATS subject or a Choria envelope")
            }
            RequestError::TtlTooShort(ttl) => write!(f, "Choria ttl {ttl} s is below the protocol's minimum of 30 s"),
            RequestError::BadEnvironment(env) => {
                write!(f, "environment {env:?} is not a Puppet environment name the puppet agent accepts")
            }
            RequestError::BadMessage(message) => write!(
                f,
                "disable message {message:?} is not one the puppet agent accepts (at most 120 characters, none of ` $ ; | && > <)"
            ),
            RequestError::NoRandomness => write!(f, "no randomness from the operating system for a Choria request id"),
            RequestError::BadRequestId(id) => write!(f, "Choria request id {id:?} is not 32 lowercase hex digits"),
            RequestError::Signing(e) => write!(f, "{e}"),
            RequestError::TargetCount { count, limit } => {
                write!(f, "a Choria request names {count} targets; it must name 1 to {limit}")
            }
            RequestError::TargetTwice(target) => write!(f, "a Choria request names target {target:?} twice"),
        }
    }
}

impl std::error::Error for RequestError {}

/// A reply refused: each names the layer and field at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplyError {
    /// Longer than the limit: refused before it is parsed.
    TooLarge { len: usize, limit: usize },
    /// A layer is not the JSON it should be (`layer`: transport, secure reply, reply,
    /// RPC reply); `why` is serde's message, without the input.
    Json { layer: &'static str, why: String },
    /// A layer's `protocol` is not the expected one.
    Protocol { layer: &'static str, found: String },
    /// A base64 field that does not decode (`field`: `data`, `hash`, `message`).
    Base64 { field: &'static str },
    /// The decoded bytes are not UTF-8 text.
    NotText { field: &'static str },
    /// The secure reply's `hash` is not the SHA-256 of its `message`: altered on the way.
    HashMismatch,
    /// The reply answers another request.
    RequestId { found: String },
    /// The reply claims a sender that is not a target of the request (`field`: the
    /// envelope's `senderid` or the transport's `mc_sender`), or the two differ.
    Sender { field: &'static str, found: String },
    /// The reply is from another agent than `puppet`.
    Agent { found: String },
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::TooLarge { len, limit } => {
                write!(f, "Choria reply of {len} bytes refused: the limit is {limit}")
            }
            ReplyError::Json { layer, why } => write!(f, "Choria {layer} is not valid: {why}"),
            ReplyError::Protocol { layer, found } => {
                write!(f, "Choria {layer} has protocol {:?}, not version 1", clip(found))
            }
            ReplyError::Base64 { field } => write!(f, "Choria reply field {field} is not base64"),
            ReplyError::NotText { field } => write!(f, "Choria reply field {field} is not UTF-8 text"),
            ReplyError::HashMismatch => write!(f, "Choria secure reply's hash is not the SHA-256 of its message"),
            ReplyError::RequestId { found } => {
                write!(f, "Choria reply answers request {:?}, not ours", clip(found))
            }
            ReplyError::Sender { field, found } => {
                write!(f, "Choria reply's {field} {:?} is not a target of the request", clip(found))
            }
            ReplyError::Agent { found } => write!(f, "Choria reply is from agent {:?}, not puppet", clip(found)),
        }
    }
}

impl std::error::Error for ReplyError {}

/// At most this many characters of a peer's value in a message.
const CLIP_CHARS: usize = 80;

/// A peer's value for a message: at most [`CLIP_CHARS`] characters.
pub(super) fn clip(value: &str) -> String {
    match value.char_indices().nth(CLIP_CHARS) {
        Some((at, _)) => format!("{}...", &value[..at]),
        None => value.to_string(),
    }
}
