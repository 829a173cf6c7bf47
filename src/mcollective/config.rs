//! Reads the operator's existing mcollective `client.cfg`.
//!
//! The file is the one `mco` already uses, so operators configure brokers and
//! the PSK once. Syntax as mcollective 2.x reads it: `key = value` lines,
//! `#` comment lines, the value is everything after the first `=`, a later
//! line wins, unknown keys and lines without `=` are ignored. Every setting can
//! be overridden by the caller ([`Overrides`]), e.g. from Puppet settings.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{Error, Result};
use super::marshal::DecodeLimits;
use super::stomp::{Limits, Version};
use super::tls::TlsSettings;

/// Where mco looks for its client config, in order.
pub const DEFAULT_PATHS: [&str; 2] = ["/etc/mcollective/client.cfg", "/etc/puppetlabs/mcollective/client.cfg"];

/// Which mcollective connector plugin the brokers are set up for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectorKind {
    RabbitMq,
    ActiveMq,
}

impl ConnectorKind {
    /// The name used in `connector =` and `plugin.<name>.` keys.
    pub fn name(self) -> &'static str {
        match self {
            ConnectorKind::RabbitMq => "rabbitmq",
            ConnectorKind::ActiveMq => "activemq",
        }
    }

    /// Parses a `connector =` value (case-insensitive).
    pub fn parse(s: &str) -> Option<ConnectorKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "rabbitmq" => Some(ConnectorKind::RabbitMq),
            "activemq" => Some(ConnectorKind::ActiveMq),
            _ => None,
        }
    }

    /// The STOMP `host` header mcollective sends when no vhost is configured.
    fn default_vhost(self) -> &'static str {
        match self {
            ConnectorKind::RabbitMq => "/",
            ConnectorKind::ActiveMq => "mcollective",
        }
    }
}

/// One broker of the pool.
#[derive(Clone, PartialEq, Eq)]
pub struct BrokerHost {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    /// TLS to this broker (`pool.N.ssl = 1`), always verified.
    pub tls: Option<TlsSettings>,
}

impl BrokerHost {
    /// `host:port`, as errors name it.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

// The password stays out of logs.
crate::redact::debug_showing!(BrokerHost: host, port, user, tls);

/// Everything the client needs, resolved.
#[derive(Clone, PartialEq)]
pub struct Config {
    pub connector: ConnectorKind,
    /// Tried in order; the next one on failure.
    pub pool: Vec<BrokerHost>,
    /// STOMP `host` header of CONNECT.
    pub vhost: String,
    pub psk: String,
    /// Our `:senderid` and `mc_sender`.
    pub identity: String,
    pub main_collective: String,
    pub collectives: Vec<String>,
    /// `uid=N` by default.
    pub callerid: String,
    /// Seconds a request stays valid (daemons drop older ones).
    pub ttl: u32,
    pub discovery_timeout: Duration,
    /// TCP connect plus CONNECTED wait, per broker.
    pub connect_timeout: Duration,
    /// STOMP versions offered in CONNECT.
    pub stomp_versions: Vec<Version>,
    pub stomp_limits: Limits,
    pub marshal_limits: DecodeLimits,
    /// How much one call collects.
    pub reply_limits: ReplyLimits,
    /// The file read, if any.
    pub source: Option<PathBuf>,
}

/// Upper bounds on the replies one call keeps, so that a flood from the
/// broker (or a fleet far larger than expected) cannot exhaust the master's
/// memory. Replies beyond them are dropped and counted
/// ([`super::ClientStats::over_limit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyLimits {
    /// Distinct senders kept per call.
    pub max_replies: usize,
    /// Bytes of reply messages kept per call.
    pub max_bytes: usize,
}

impl Default for ReplyLimits {
    /// Well above any real fleet: 100,000 servers, 1 GiB (an inventory reply
    /// is a few KiB to a few tens of KiB).
    fn default() -> Self {
        ReplyLimits { max_replies: 100_000, max_bytes: 1 << 30 }
    }
}

// The PSK stays out of logs.
crate::redact::debug_showing!(Config: connector, pool, vhost, identity, main_collective, collectives,
    callerid, ttl, discovery_timeout, connect_timeout, stomp_versions, reply_limits, source);

/// Caller-supplied values that win over the file.
#[derive(Clone, Default, PartialEq)]
pub struct Overrides {
    /// Read this file instead of [`DEFAULT_PATHS`] (it must exist).
    pub config_path: Option<PathBuf>,
    /// Read no file at all.
    pub no_config_file: bool,
    pub connector: Option<ConnectorKind>,
    pub pool: Option<Vec<BrokerHost>>,
    pub vhost: Option<String>,
    pub psk: Option<String>,
    pub identity: Option<String>,
    pub main_collective: Option<String>,
    pub collectives: Option<Vec<String>>,
    pub callerid: Option<String>,
    pub ttl: Option<u32>,
    pub discovery_timeout: Option<Duration>,
    pub connect_timeout: Option<Duration>,
    pub stomp_versions: Option<Vec<Version>>,
    pub stomp_limits: Option<Limits>,
    pub marshal_limits: Option<DecodeLimits>,
    pub reply_limits: Option<ReplyLimits>,
}

// The psk stays out of logs (brokers' passwords are hidden by BrokerHost).
crate::redact::debug_showing!(Overrides: config_path, connector, pool, identity, main_collective, collectives,
    callerid);

/// `key = value` lines with the line number each came from.
struct Raw {
    path: Option<PathBuf>,
    values: HashMap<String, (String, usize)>,
}

impl Raw {
    fn parse(text: &str, path: Option<&Path>) -> Raw {
        let mut values = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            values.insert(k.trim().to_string(), (v.trim().to_string(), i + 1));
        }
        Raw { path: path.map(Path::to_path_buf), values }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(|(v, _)| v.as_str())
    }

    fn err(&self, key: &str, reason: impl Into<String>) -> Error {
        Error::Config {
            file: self.path.clone(),
            line: self.values.get(key).map(|(_, l)| *l),
            key: Some(key.to_string()),
            reason: reason.into(),
        }
    }

    fn number<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| self.err(key, format!("{v:?} is not a valid number"))),
        }
    }

    fn seconds(&self, key: &str) -> Result<Option<Duration>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 && s < 86_400.0 => Ok(Some(Duration::from_secs_f64(s))),
                _ => Err(self.err(key, format!("{v:?} is not a number of seconds"))),
            },
        }
    }
}

fn list(v: &str) -> Vec<String> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

impl Config {
    /// Reads the config file (the override path, else the first of
    /// [`DEFAULT_PATHS`] that exists, else none) and applies `overrides`.
    /// The PSK comes from the override, else `plugin.psk`, else `MCOLLECTIVE_PSK`.
    pub fn load(overrides: &Overrides) -> Result<Config> {
        let path = if overrides.no_config_file {
            None
        } else if let Some(p) = &overrides.config_path {
            Some(p.clone())
        } else {
            DEFAULT_PATHS.iter().map(PathBuf::from).find(|p| p.is_file())
        };
        let text = match &path {
            Some(p) => std::fs::read_to_string(p).map_err(|e| Error::Config {
                file: Some(p.clone()),
                line: None,
                key: None,
                reason: format!("cannot read: {e}"),
            })?,
            None => String::new(),
        };
        let env_psk = std::env::var("MCOLLECTIVE_PSK").ok();
        Config::resolve(&text, path.as_deref(), overrides, env_psk)
    }

    /// Builds a config from `text` (as if read from `path`) and `overrides`;
    /// `env_psk` stands for the `MCOLLECTIVE_PSK` environment variable.
    pub fn resolve(text: &str, path: Option<&Path>, overrides: &Overrides, env_psk: Option<String>) -> Result<Config> {
        let raw = Raw::parse(text, path);
        let general = |key: &str, reason: String| Error::Config {
            file: raw.path.clone(),
            line: None,
            key: Some(key.to_string()),
            reason,
        };

        // Only psk exists natively; anything else would be silently insecure or unreadable.
        if let Some(sp) = raw.get("securityprovider") {
            if !sp.eq_ignore_ascii_case("psk") {
                return Err(
                    raw.err("securityprovider", format!("security provider {sp:?} is not supported (only psk)"))
                );
            }
        }

        let connector = match overrides.connector {
            Some(c) => c,
            None => match raw.get("connector") {
                None => ConnectorKind::ActiveMq, // mcollective 2.x default
                Some(c) => ConnectorKind::parse(c).ok_or_else(|| {
                    raw.err("connector", format!("connector {c:?} is not supported (rabbitmq or activemq)"))
                })?,
            },
        };
        let prefix = format!("plugin.{}", connector.name());

        let pool = match &overrides.pool {
            Some(p) => check_override_tls(p)?,
            None => read_pool(&raw, &prefix)?,
        };
        if pool.is_empty() {
            return Err(general(&format!("{prefix}.pool.size"), "no broker configured".into()));
        }

        let vhost = overrides
            .vhost
            .clone()
            .or_else(|| raw.get(&format!("{prefix}.vhost")).map(str::to_string))
            .unwrap_or_else(|| connector.default_vhost().to_string());

        let psk = overrides
            .psk
            .clone()
            .or_else(|| raw.get("plugin.psk").map(str::to_string))
            .or(env_psk)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| general("plugin.psk", "no pre-shared key (set plugin.psk or MCOLLECTIVE_PSK)".into()))?;

        let identity = match overrides.identity.clone().or_else(|| raw.get("identity").map(str::to_string)) {
            Some(i) => i,
            None => hostname().ok_or_else(|| general("identity", "not set and the host name is unknown".into()))?,
        };
        if identity.is_empty() || identity.contains(char::is_whitespace) {
            return Err(raw.err("identity", format!("invalid identity {identity:?}")));
        }

        let collectives = overrides
            .collectives
            .clone()
            .or_else(|| raw.get("collectives").map(list))
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| vec!["mcollective".to_string()]);
        let main_collective = overrides
            .main_collective
            .clone()
            .or_else(|| raw.get("main_collective").map(str::to_string))
            .unwrap_or_else(|| collectives[0].clone());
        if !collectives.contains(&main_collective) {
            return Err(
                raw.err("main_collective", format!("{main_collective:?} is not in collectives {collectives:?}"))
            );
        }

        let ttl = match overrides.ttl {
            Some(t) => t,
            None => raw.number::<u32>("ttl")?.unwrap_or(60),
        };
        if ttl == 0 {
            return Err(raw.err("ttl", "must be at least 1 second"));
        }
        let discovery_timeout = match overrides.discovery_timeout {
            Some(t) => t,
            None => raw.seconds("discovery_timeout")?.unwrap_or(Duration::from_secs(2)),
        };
        let connect_timeout = match overrides.connect_timeout {
            Some(t) => t,
            None => raw.seconds(&format!("{prefix}.connect_timeout"))?.unwrap_or(Duration::from_secs(10)),
        };

        if discovery_timeout.is_zero() || connect_timeout.is_zero() {
            return Err(general("discovery_timeout", "timeouts must be longer than zero".into()));
        }

        let callerid = overrides.callerid.clone().unwrap_or_else(default_callerid);
        super::message::check_callerid(&callerid)?;

        Ok(Config {
            connector,
            pool,
            vhost,
            psk,
            identity,
            main_collective,
            collectives,
            callerid,
            ttl,
            discovery_timeout,
            connect_timeout,
            stomp_versions: overrides
                .stomp_versions
                .clone()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| vec![Version::V1_0, Version::V1_1, Version::V1_2]),
            stomp_limits: overrides.stomp_limits.unwrap_or_default(),
            marshal_limits: overrides.marshal_limits.unwrap_or_default(),
            reply_limits: overrides.reply_limits.unwrap_or_default(),
            source: raw.path.clone(),
        })
    }
}

/// `plugin.<c>.pool.size` and `pool.N.{host,port,user,password}`.
fn read_pool(raw: &Raw, prefix: &str) -> Result<Vec<BrokerHost>> {
    let size_key = format!("{prefix}.pool.size");
    let Some(size) = raw.number::<usize>(&size_key)? else {
        return Ok(Vec::new());
    };
    if size == 0 || size > 64 {
        return Err(raw.err(&size_key, format!("pool size {size} is not in 1..=64")));
    }
    let mut pool = Vec::with_capacity(size);
    for n in 1..=size {
        let key = |field: &str| format!("{prefix}.pool.{n}.{field}");
        let host = raw
            .get(&key("host"))
            .filter(|h| !h.is_empty())
            .ok_or_else(|| raw.err(&key("host"), format!("missing, but pool.size is {size}")))?
            .to_string();
        let port = raw.number::<u16>(&key("port"))?.unwrap_or(61613);
        let tls = read_tls(raw, &key, &host)?;
        pool.push(BrokerHost {
            host,
            port,
            user: raw.get(&key("user")).unwrap_or_default().to_string(),
            password: raw.get(&key("password")).unwrap_or_default().to_string(),
            tls,
        });
    }
    Ok(pool)
}

/// `pool.N.ssl` and, when it is on, `pool.N.ssl.{ca,cert,key,fallback}`, as
/// mcollective 2.12's connectors read them. The files are read here so that a
/// wrong path is reported with its line, not at the first refresh.
fn read_tls(raw: &Raw, key: &dyn Fn(&str) -> String, host: &str) -> Result<Option<TlsSettings>> {
    let on = match raw.get(&key("ssl")) {
        None => false,
        Some(v) => {
            boolean(v).ok_or_else(|| raw.err(&key("ssl"), format!("{v:?} is not a boolean (1/0, true/false)")))?
        }
    };
    if !on {
        return Ok(None);
    }
    if let Some(v) = raw.get(&key("ssl.fallback")) {
        // mco falls back to an unverified connection when the files are missing or
        // wrong; a man in the middle could then read the PSK-signed requests.
        if boolean(v) != Some(false) {
            return Err(raw.err(
                &key("ssl.fallback"),
                format!("{v:?}: falling back to unverified TLS is not supported (the broker's certificate is always verified); remove the key or set it to 0"),
            ));
        }
    }
    let path = |field: &str| raw.get(&key(field)).filter(|v| !v.is_empty()).map(PathBuf::from);
    let settings = TlsSettings {
        ca: raw.get(&key("ssl.ca")).map(list).unwrap_or_default().into_iter().map(PathBuf::from).collect(),
        cert: path("ssl.cert"),
        key: path("ssl.key"),
    };
    settings.client_config().map_err(|e| {
        let field = e.setting.cfg_key();
        let what = if raw.get(&key(field)).is_some() { e.reason } else { format!("{} (ssl is on)", e.reason) };
        raw.err(&key(field), what)
    })?;
    super::tls::server_name(host).map_err(|e| raw.err(&key("host"), format!("{e}, and ssl is on")))?;
    Ok(Some(settings))
}

/// The caller's pool, its TLS files read now like client.cfg's.
fn check_override_tls(pool: &[BrokerHost]) -> Result<Vec<BrokerHost>> {
    for (i, broker) in pool.iter().enumerate() {
        let Some(tls) = &broker.tls else { continue };
        let fail = |key: &str, reason: String| Error::Config {
            file: None,
            line: None,
            key: Some(format!("pool entry {} ({}) {key}", i + 1, broker.address())),
            reason,
        };
        tls.client_config().map_err(|e| fail(&e.setting.cfg_key().replace('.', "_"), e.reason))?;
        super::tls::server_name(&broker.host).map_err(|e| fail("host", e.to_string()))?;
    }
    Ok(pool.to_vec())
}

/// mcollective's `Util.str_to_bool`.
fn boolean(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "y" => Some(true),
        "0" | "false" | "no" | "n" => Some(false),
        _ => None,
    }
}

/// Like Ruby's `Socket.gethostname`, mco's default identity.
fn hostname() -> Option<String> {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
}

/// `uid=<effective uid>`, as mco sets it; the owner of /proc/self is the euid.
fn default_callerid() -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata("/proc/self") {
        Ok(m) => format!("uid={}", m.uid()),
        Err(_) => "uid=unknown".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = "\
# mcollective client
main_collective = mcollective
collectives = mcollective,production
connector = rabbitmq
plugin.rabbitmq.vhost = /mcollective
plugin.rabbitmq.pool.size = 2
plugin.rabbitmq.pool.1.host = 127.0.0.1
plugin.rabbitmq.pool.1.port = 61613
plugin.rabbitmq.pool.1.user = mcollective
plugin.rabbitmq.pool.1.password = mari=onette
plugin.rabbitmq.pool.2.host = broker2
securityprovider = psk
plugin.psk = feas-psk-secret
identity = mco-client
logger_type = console
this line has no equals sign
";

    fn resolve(text: &str, o: &Overrides) -> Result<Config> {
        Config::resolve(text, Some(Path::new("/x/client.cfg")), o, None)
    }

    #[test]
    fn reads_a_typical_file() {
        let c = resolve(CFG, &Overrides::default()).unwrap();
        assert_eq!(c.connector, ConnectorKind::RabbitMq);
        assert_eq!(c.vhost, "/mcollective");
        assert_eq!(c.pool.len(), 2);
        assert_eq!(c.pool[0].password, "mari=onette");
        assert_eq!(c.pool[1].port, 61613);
        assert_eq!(c.pool[1].address(), "broker2:61613");
        assert_eq!(c.psk, "feas-psk-secret");
        assert_eq!(c.identity, "mco-client");
        assert_eq!(c.collectives, ["mcollective", "production"]);
        assert_eq!(c.ttl, 60);
        assert_eq!(c.discovery_timeout, Duration::from_secs(2));
        assert!(c.callerid.starts_with("uid="));
        assert!(!format!("{c:?}").contains("feas-psk-secret"));
        assert!(!format!("{c:?}").contains("onette"));
    }

    #[test]
    fn overrides_win() {
        let o = Overrides {
            psk: Some("other".into()),
            identity: Some("master".into()),
            connector: Some(ConnectorKind::ActiveMq),
            pool: Some(vec![BrokerHost {
                host: "h".into(),
                port: 1,
                user: String::new(),
                password: String::new(),
                tls: None,
            }]),
            ttl: Some(30),
            callerid: Some("cert=master".into()),
            ..Overrides::default()
        };
        let c = resolve(CFG, &o).unwrap();
        assert_eq!(c.psk, "other");
        assert_eq!(c.identity, "master");
        assert_eq!(c.connector, ConnectorKind::ActiveMq);
        assert_eq!(c.vhost, "mcollective");
        assert_eq!(c.pool[0].host, "h");
        assert_eq!((c.ttl, c.callerid.as_str()), (30, "cert=master"));
    }

    #[test]
    fn psk_from_environment_when_not_in_file() {
        let text = CFG.replace("plugin.psk = feas-psk-secret", "");
        let o = Overrides::default();
        let c = Config::resolve(&text, None, &o, Some("envkey".into())).unwrap();
        assert_eq!(c.psk, "envkey");
        let e = Config::resolve(&text, None, &o, None).unwrap_err();
        assert!(e.to_string().contains("plugin.psk"), "{e}");
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let text = CFG.replace("securityprovider = psk", "securityprovider = ssl");
        let e = resolve(&text, &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("/x/client.cfg") && e.contains("line 12"), "{e}");
        assert!(e.contains("securityprovider") && e.contains("\"ssl\""), "{e}");

        let text = CFG.replace("pool.1.port = 61613", "pool.1.port = http");
        let e = resolve(&text, &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("line 8") && e.contains("plugin.rabbitmq.pool.1.port"), "{e}");

        let text = CFG.replace("plugin.rabbitmq.pool.2.host = broker2", "");
        let e = resolve(&text, &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("plugin.rabbitmq.pool.2.host"), "{e}");

        let text = CFG.replace("connector = rabbitmq", "connector = stomp");
        let e = resolve(&text, &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("line 4") && e.contains("stomp"), "{e}");

        let text = CFG.replace("main_collective = mcollective", "main_collective = other");
        assert!(resolve(&text, &Overrides::default()).is_err());

        let text = CFG.replace("connector = rabbitmq", "connector = activemq");
        let e = resolve(&text, &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("plugin.activemq.pool.size"), "{e}");
    }

    #[test]
    fn missing_file_is_an_error_naming_it() {
        let o = Overrides { config_path: Some("/nonexistent/client.cfg".into()), ..Overrides::default() };
        let e = Config::load(&o).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/client.cfg"), "{e}");
    }
}
