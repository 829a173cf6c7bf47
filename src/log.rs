//! Lines for Puppet's log: what the core has to say (refresh warnings, kick
//! decisions, dispatch outcomes), queued until a binding drains them.

use serde::Serialize;

/// A line for Puppet's log, at the level it deserves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub level: Level,
    pub message: String,
}

/// Puppet's log levels that the core uses, serialized as Puppet names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Info,
    Notice,
    Warning,
    Err,
}

impl Level {
    /// The name of Puppet's logging method for this level (`Puppet.warning`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Notice => "notice",
            Level::Warning => "warning",
            Level::Err => "err",
        }
    }
}

impl LogLine {
    pub fn new(level: Level, message: impl Into<String>) -> LogLine {
        LogLine { level, message: message.into() }
    }
}

/// `[level, message]`, the pair both bindings hand to Ruby.
impl Serialize for LogLine {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (self.level.as_str(), &self.message).serialize(serializer)
    }
}
