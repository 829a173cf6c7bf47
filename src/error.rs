//! One error type for the core. Every message names the input it is about, because it
//! ends up in front of an operator as a `Puppet::ParseError` or a log line.

use std::fmt;

/// What went wrong, by kind, so bindings can map it to the right Ruby exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A query clause or function argument a user wrote is malformed.
    Query(String),
    /// `puppet_kicker.yaml` has an unknown key or a bad value.
    Config(String),
    /// The index holds no server and no source could fill it.
    NoData(String),
    /// A fact source or the snapshot could not be read or written.
    Io(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Short machine-readable kind, used by the C ABI and the Ruby facade.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Query(_) => "query",
            Error::Config(_) => "config",
            Error::NoData(_) => "no_data",
            Error::Io(_) => "io",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Error::Query(m) | Error::Config(m) | Error::NoData(m) | Error::Io(m) => m,
        }
    }
}

/// What the bindings report for a panic they caught: the same words from both, so
/// MRI and JRuby users see one message.
pub fn internal_error_message(panic: &(dyn std::any::Any + Send)) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("puppet-kicker internal error: {what}")
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}
