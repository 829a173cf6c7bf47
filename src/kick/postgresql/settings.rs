//! The `kick.state` and `kick.postgresql.*` keys (declared in `config::keys`), and the
//! connection they describe: a `tokio_postgres::Config` with TLS verified against Puppet's
//! CA, the password read from its file. Nothing here is logged with a secret: the
//! connection string and the password are shown as `[redacted]`.

use crate::puppet_settings::PuppetSettings;
use crate::tls_files::{client_config, TlsFiles};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// Where the kick state is kept (`kick.state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateKind {
    /// `kicks.msgpack` in the cache dir: shared by the processes of one host.
    Local,
    /// A PostgreSQL database shared by several compilers (`kick.postgresql.*`).
    Postgresql,
}

impl StateKind {
    pub const ALL: &'static [(&'static str, StateKind)] =
        &[("local", StateKind::Local), ("postgresql", StateKind::Postgresql)];

    pub fn name(self) -> &'static str {
        StateKind::ALL.iter().find(|(_, k)| *k == self).map_or("?", |(name, _)| name)
    }
}

/// How the server's certificate is checked (`kick.postgresql.sslmode`), as libpq names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Chain to the CA, dates, and the host name connected to.
    VerifyFull,
    /// Chain to the CA and dates; any name.
    VerifyCa,
}

impl SslMode {
    pub const ALL: &'static [(&'static str, SslMode)] =
        &[("verify-full", SslMode::VerifyFull), ("verify-ca", SslMode::VerifyCa)];

    pub fn name(self) -> &'static str {
        SslMode::ALL.iter().find(|(_, k)| *k == self).map_or("?", |(name, _)| name)
    }
}

/// The `kick.postgresql.*` keys.
#[derive(Clone, PartialEq)]
pub struct PgSettings {
    /// A libpq connection string or `postgresql://` URL; when set, it gives the host,
    /// port, database and user (and may hold a password: it is never shown).
    pub connection: Option<String>,
    /// A host name, an IP address, or a Unix socket's directory (`/var/run/postgresql`:
    /// no TLS there, the socket's permissions guard it).
    pub host: String,
    pub port: u16,
    pub database: String,
    pub user: String,
    /// The schema the module's tables are in; nothing is created outside it.
    pub schema: String,
    pub sslmode: SslMode,
    /// Puppet's `localcacert`, `hostcert`, `hostprivkey` and `hostcrl` when unset.
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// A file whose first line is the password (none: the certificate, or trust).
    pub password_file: Option<PathBuf>,
    /// Connections kept open at most.
    pub pool_size: usize,
    /// Every statement's bound, waiting for another compiler's transaction included.
    pub statement_timeout: Duration,
    pub connect_timeout: Duration,
}

crate::redact::debug_showing!(PgSettings: host, port, database, user, schema, sslmode, ca, cert, key, password_file, pool_size, statement_timeout, connect_timeout);

impl PgSettings {
    /// What the keys' defaults are applied to.
    pub(crate) fn unset() -> PgSettings {
        PgSettings {
            connection: None,
            host: String::new(),
            port: 0,
            database: String::new(),
            user: String::new(),
            schema: String::new(),
            sslmode: SslMode::VerifyFull,
            ca: None,
            cert: None,
            key: None,
            password_file: None,
            pool_size: 0,
            statement_timeout: Duration::ZERO,
            connect_timeout: Duration::ZERO,
        }
    }
}

/// A schema name the module accepts (it is written into statements unquoted):
/// lower case letters, digits and `_`, not starting with a digit, at most 63 bytes.
pub fn valid_schema(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 63
}

/// Why the settings make no connection; each names the key.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetupError {
    /// `kick.postgresql.connection` does not parse (the string itself is not shown).
    Connection(String),
    /// A TLS file is unusable.
    Tls(crate::tls_files::TlsError),
    /// The password file cannot be read, or is empty.
    PasswordFile { path: PathBuf, reason: String },
    /// A TLS file has no default: Puppet's setting is unknown here.
    NoDefault { key: &'static str, puppet_setting: &'static str },
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Connection(why) => write!(f, "kick.postgresql.connection does not parse: {why}"),
            SetupError::Tls(e) => e.fmt(f),
            SetupError::PasswordFile { path, reason } => {
                write!(f, "kick.postgresql.password_file {}: {reason}", path.display())
            }
            SetupError::NoDefault { key, puppet_setting } => {
                write!(f, "{key} is not set and Puppet's {puppet_setting} is unknown")
            }
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SetupError::Tls(e) => Some(e),
            _ => None,
        }
    }
}

/// A connection's configuration, ready to connect.
pub struct Connection {
    pub config: tokio_postgres::Config,
    /// TLS, unless the host is a Unix socket.
    pub tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    /// `postgresql://user@host:port/database`, for messages.
    pub name: String,
}

/// The longest password file read.
const MAX_PASSWORD_FILE_BYTES: u64 = 4096;

impl PgSettings {
    /// The connection these settings describe: files read, TLS set up.
    pub fn connection(&self, puppet: &PuppetSettings) -> Result<Connection, SetupError> {
        let mut config = match &self.connection {
            // The parser's message may quote the string: only its kind is kept.
            Some(text) => tokio_postgres::Config::from_str(text).map_err(|e| SetupError::Connection(kind_of(&e)))?,
            None => {
                let mut config = tokio_postgres::Config::new();
                config.host(&self.host).port(self.port).dbname(&self.database).user(&self.user);
                config
            }
        };
        if let Some(path) = &self.password_file {
            config.password(read_password(path)?);
        }
        let millis = self.statement_timeout.as_millis();
        // A compiler that stops halfway through a transaction (a stopped VM) holds the
        // state's row: the server ends its session after four statement timeouts.
        config.application_name("puppet-kicker").connect_timeout(self.connect_timeout).keepalives(true).options(
            &format!(
                "-c statement_timeout={millis} -c idle_in_transaction_session_timeout={}",
                millis.saturating_mul(4)
            ),
        );
        let unix = config.get_hosts().iter().all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
        let tls = if unix {
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
            None
        } else {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
            let file = |set: &Option<PathBuf>, default: Option<PathBuf>, key, puppet_setting| {
                set.clone().or(default).ok_or(SetupError::NoDefault { key, puppet_setting })
            };
            let files = TlsFiles {
                prefix: "kick.postgresql",
                check_name: self.sslmode == SslMode::VerifyFull,
                ca: file(&self.ca, puppet.localcacert.clone(), "kick.postgresql.ca", "localcacert")?,
                cert: file(&self.cert, puppet.hostcert.clone(), "kick.postgresql.cert", "hostcert")?,
                key: file(&self.key, puppet.hostprivkey.clone(), "kick.postgresql.key", "hostprivkey")?,
                crl: puppet.hostcrl.clone(),
            };
            let tls = client_config(&files).map_err(SetupError::Tls)?;
            Some(tokio_postgres_rustls::MakeRustlsConnect::new((*tls).clone()))
        };
        let name = describe(&config);
        Ok(Connection { config, tls, name })
    }
}

/// `postgresql://user@host:port/database` of `config`: never its password.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) if host.contains(':') => format!("[{host}]"),
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("?");
    let database = config.get_dbname().unwrap_or(user);
    format!("postgresql://{user}@{host}:{port}/{database}")
}

/// What kind of error a connection string's parse is, without the string.
fn kind_of(e: &tokio_postgres::Error) -> String {
    let text = e.to_string();
    // tokio-postgres says "invalid connection string: unexpected EOF" and the like; a
    // value it quotes could be a password.
    match text.split_once('`') {
        Some((before, _)) => before.trim_end().to_string(),
        None => text,
    }
}

fn read_password(path: &Path) -> Result<String, SetupError> {
    let fail = |reason: String| SetupError::PasswordFile { path: path.to_path_buf(), reason };
    let bytes = crate::bounded_read::read(path, MAX_PASSWORD_FILE_BYTES).map_err(|e| fail(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| fail("not UTF-8".into()))?;
    let password = text.lines().next().unwrap_or("").trim_end_matches('\r');
    if password.is_empty() {
        return Err(fail("its first line is empty".into()));
    }
    Ok(password.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        for good in ["puppet_kicker", "_k", "kicks2"] {
            assert!(valid_schema(good), "{good}");
        }
        for bad in ["", "2kicks", "Kicks", "a-b", "a;drop", "pg catalog", &"a".repeat(64)] {
            assert!(!valid_schema(bad), "{bad}");
        }
    }

    #[test]
    fn a_connection_string_is_described_without_its_password() {
        let settings = PgSettings {
            connection: Some("postgresql://kicker:s3cret@db.example:6432/kicks".into()),
            ca: Some("/nonexistent/ca.pem".into()),
            cert: Some("/nonexistent/cert.pem".into()),
            key: Some("/nonexistent/key.pem".into()),
            ..PgSettings::unset()
        };
        let config = tokio_postgres::Config::from_str(settings.connection.as_deref().unwrap()).unwrap();
        assert_eq!(describe(&config), "postgresql://kicker@db.example:6432/kicks");
        let shown = format!("{settings:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        let e = settings.connection(&PuppetSettings::default()).err().unwrap().to_string();
        assert!(
            e.starts_with("kick.postgresql.ca /nonexistent/ca.pem")
                || e.starts_with("kick.postgresql.ca: cannot read /nonexistent/ca.pem"),
            "{e}"
        );
        let e = PgSettings { connection: Some("host='unclosed password=s3cret".into()), ..PgSettings::unset() }
            .connection(&PuppetSettings::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with("kick.postgresql.connection does not parse") && !e.contains("s3cret"), "{e}");
    }

    #[test]
    fn the_password_is_the_first_line_of_its_file() {
        let dir = crate::snapshot::tests::tempdir("pg-password");
        let path = dir.join("password");
        std::fs::write(&path, "hunter2\nignored\n").unwrap();
        assert_eq!(read_password(&path).unwrap(), "hunter2");
        std::fs::write(&path, "\n").unwrap();
        let e = read_password(&path).unwrap_err().to_string();
        assert_eq!(e, format!("kick.postgresql.password_file {}: its first line is empty", path.display()));
        let _ = std::fs::remove_dir_all(dir);
    }
}
