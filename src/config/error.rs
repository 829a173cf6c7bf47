//! What can be wrong with `puppet_kicker.yaml`. Every error names the file, and the key
//! when there is one, because it reaches an operator as a failed compile or a log line.

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;

/// An error reading or checking `puppet_kicker.yaml`.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read (missing when named explicitly, unreadable, over
    /// [`super::MAX_FILE_SIZE`]).
    Read { file: PathBuf, source: std::io::Error },
    /// The file is not UTF-8.
    NotUtf8 { file: PathBuf, source: std::string::FromUtf8Error },
    /// The file is not YAML, or over a limit of the YAML reader (nesting, aliases).
    Yaml { file: PathBuf, source: crate::yaml::YamlError },
    /// The document is YAML but not a mapping of settings.
    NotAMapping { file: PathBuf },
    /// A key that is not in [`super::KEYS`] (a typo never silently means "default").
    UnknownKey { file: PathBuf, key: String, known: Vec<&'static str> },
    /// A value of the wrong kind or out of range.
    BadValue { file: PathBuf, key: String, expected: Cow<'static, str>, got: String },
    /// A value that is well-formed but not allowed here (with another key's value, or
    /// for this agent).
    Invalid { file: PathBuf, key: String, reason: String },
}

/// What a key's parser found wrong with a value, before the file and key are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// The value is not what the key takes: "must be {0}".
    Expected(Cow<'static, str>),
    /// The value is not allowed: the reason, after the key's name.
    Invalid(String),
}

impl Problem {
    pub(crate) fn into_error(self, file: PathBuf, key: &str, value: &serde_json::Value) -> ConfigError {
        let key = key.to_string();
        match self {
            Problem::Expected(expected) => ConfigError::BadValue { file, key, expected, got: value.to_string() },
            Problem::Invalid(reason) => ConfigError::Invalid { file, key, reason },
        }
    }
}

impl ConfigError {
    /// The file the error is about.
    pub fn file(&self) -> &std::path::Path {
        match self {
            ConfigError::Read { file, .. }
            | ConfigError::NotUtf8 { file, .. }
            | ConfigError::Yaml { file, .. }
            | ConfigError::NotAMapping { file }
            | ConfigError::UnknownKey { file, .. }
            | ConfigError::BadValue { file, .. }
            | ConfigError::Invalid { file, .. } => file,
        }
    }

    /// The key the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownKey { key, .. }
            | ConfigError::BadValue { key, .. }
            | ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self.file().display();
        match self {
            ConfigError::Read { source, .. } => write!(f, "cannot read {file}: {source}"),
            ConfigError::NotUtf8 { source, .. } => write!(f, "cannot read {file}: not UTF-8 ({source})"),
            ConfigError::Yaml { source, .. } => write!(f, "{file}: not valid YAML: {source}"),
            ConfigError::NotAMapping { .. } => write!(f, "{file}: must be a mapping of settings"),
            ConfigError::UnknownKey { key, known, .. } => {
                write!(f, "{file}: unknown key '{key}'; known keys: {}", known.join(", "))
            }
            ConfigError::BadValue { key, expected, got, .. } => {
                write!(f, "{file}: '{key}' must be {expected}, got {got}")
            }
            ConfigError::Invalid { key, reason, .. } => write!(f, "{file}: '{key}' {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Read { source, .. } => Some(source),
            ConfigError::NotUtf8 { source, .. } => Some(source),
            ConfigError::Yaml { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The core's error kind for the bindings: a configuration error.
impl From<ConfigError> for crate::error::Error {
    fn from(e: ConfigError) -> Self {
        crate::error::Error::ConfigFile(e)
    }
}
