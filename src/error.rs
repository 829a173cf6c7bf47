//! The core's error type. Every message names the input it is about, because it
//! ends up in front of an operator as a `Puppet::ParseError` or a log line.
//!
//! Each variant is one [`Kind`]; the bindings report the kind (the C ABI as a
//! string, the magnus extension as the class `lib/puppet_kicker.rb` maps it to), so
//! Ruby raises the right `PuppetKicker::*Error` for every kind.

use std::fmt;

/// What went wrong, by kind, so bindings can map it to the right Ruby exception.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A query clause or function argument a user wrote is malformed.
    Query(String),
    /// A setting is unusable (outside `puppet_kicker.yaml`'s own checks).
    Config(String),
    /// `puppet_kicker.yaml` cannot be read, or has an unknown key or a bad value.
    ConfigFile(crate::config::ConfigError),
    /// The index holds no server and no source could fill it.
    NoData(String),
    /// A kick report the `kick` processor cannot read.
    Report(String),
    /// A fact source or the snapshot could not be read or written.
    Io(String),
    /// The operating system refused what `context` describes.
    System { context: String, source: std::io::Error },
    /// `cache.dir` cannot be created, or others could write in it.
    CacheDir(crate::cache_dir::CacheDirError),
    /// A fact source cannot start: its settings or files are unusable. The source's
    /// own error (`source::mcollective::SourceError`, `source::puppetdb::SourceError`).
    SourceUnusable(Box<dyn std::error::Error + Send + Sync>),
    /// A fact source could not be read; the source's own error.
    SourceFailed(Box<dyn std::error::Error + Send + Sync>),
    /// The kick service cannot start; shared, because every later report gets it too.
    Kick(std::sync::Arc<crate::kick::KickError>),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The kinds of failure a binding reports: the core's, and the bindings' own.
/// [`Kind::as_str`] is the C ABI's `kind` and the key of `PuppetKicker::ERRORS`
/// in `lib/puppet_kicker.rb`, the one list of Ruby exception classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    Query,
    Config,
    NoData,
    Report,
    Io,
    /// A malformed request through the C ABI: a bug in the caller.
    Request,
    /// A panic caught, or an invariant broken, in the binding or the core.
    Internal,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Query => "query",
            Kind::Config => "config",
            Kind::NoData => "no_data",
            Kind::Report => "report",
            Kind::Io => "io",
            Kind::Request => "request",
            Kind::Internal => "internal",
        }
    }
}

impl Error {
    /// An operating-system error, with what was being done.
    pub fn system(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::System { context: context.into(), source }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Error::Query(_) => Kind::Query,
            Error::Config(_) | Error::ConfigFile(_) | Error::SourceUnusable(_) => Kind::Config,
            Error::NoData(_) => Kind::NoData,
            Error::Report(_) => Kind::Report,
            Error::Io(_) | Error::System { .. } | Error::CacheDir(_) | Error::Kick(_) | Error::SourceFailed(_) => {
                Kind::Io
            }
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
        match self {
            Error::Query(m) | Error::Config(m) | Error::NoData(m) | Error::Report(m) | Error::Io(m) => f.write_str(m),
            Error::ConfigFile(e) => e.fmt(f),
            Error::CacheDir(e) => e.fmt(f),
            Error::SourceUnusable(e) | Error::SourceFailed(e) => e.fmt(f),
            Error::Kick(e) => e.fmt(f),
            Error::System { context, source } => write!(f, "{context}: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::System { source, .. } => Some(source),
            // A module error's message is this one's; its cause comes next.
            Error::ConfigFile(e) => std::error::Error::source(e),
            Error::CacheDir(e) => std::error::Error::source(e),
            Error::SourceUnusable(e) | Error::SourceFailed(e) => e.source(),
            Error::Kick(e) => std::error::Error::source(&**e),
            _ => None,
        }
    }
}

impl From<crate::cache_dir::CacheDirError> for Error {
    fn from(e: crate::cache_dir::CacheDirError) -> Self {
        Error::CacheDir(e)
    }
}
