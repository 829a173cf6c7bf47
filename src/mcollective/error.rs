//! The one error type of the mcollective client.
//!
//! Every failure names what failed (host, frame, key, file and line) so an
//! operator reading a Puppet master log can act on it without a debugger.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Shorthand used throughout the module.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong talking to mcollective.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call failed; `context` says which (host, frame being read, file).
    Io { context: String, source: io::Error },
    /// A STOMP frame was malformed or over a configured limit.
    Frame(String),
    /// A Marshal stream could not be decoded or encoded.
    Marshal(String),
    /// A message was well-formed Marshal but lacked a key or had a wrong type.
    Message { key: String, reason: String },
    /// The PSK signature did not match.
    Signature(String),
    /// The client configuration is unusable.
    Config { file: Option<PathBuf>, line: Option<usize>, key: Option<String>, reason: String },
    /// The broker sent an ERROR frame or an unexpected reply.
    Broker { host: String, message: String },
    /// No host of the pool accepted the connection: each host and why.
    NoBroker(Vec<(String, String)>),
    /// A caller-supplied argument is invalid (empty agent name, bad callerid...).
    InvalidInput(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    pub(crate) fn message(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Message { key: key.into(), reason: reason.into() }
    }

    /// True when the error is a socket read timeout: the client uses this to
    /// poll its deadline without tearing the connection down.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Io { source, .. }
            if matches!(source.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { context, source } => write!(f, "{context}: {source}"),
            Error::Frame(m) => write!(f, "STOMP frame: {m}"),
            Error::Marshal(m) => write!(f, "Ruby Marshal: {m}"),
            Error::Message { key, reason } => write!(f, "mcollective message key {key}: {reason}"),
            Error::Signature(m) => write!(f, "PSK signature: {m}"),
            Error::Config { file, line, key, reason } => {
                write!(f, "mcollective config")?;
                if let Some(file) = file {
                    write!(f, " {}", file.display())?;
                }
                if let Some(line) = line {
                    write!(f, " line {line}")?;
                }
                if let Some(key) = key {
                    write!(f, " key {key}")?;
                }
                write!(f, ": {reason}")
            }
            Error::Broker { host, message } => write!(f, "broker {host}: {message}"),
            Error::NoBroker(attempts) => {
                write!(f, "no broker could be reached")?;
                if attempts.is_empty() {
                    return write!(f, " (the pool is empty)");
                }
                for (i, (host, why)) in attempts.iter().enumerate() {
                    let sep = if i == 0 { ": " } else { "; " };
                    write!(f, "{sep}{host}: {why}")?;
                }
                Ok(())
            }
            Error::InvalidInput(m) => write!(f, "invalid input: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
