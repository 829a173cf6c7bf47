//! `puppet_kicker.yaml`: where facts come from, where the cache lives, and what a
//! compile does when there is no data. No file means the defaults; an unknown key or
//! a bad value is an error naming the key, so a typo never silently means "default".

use crate::error::{Error, Result};
use crate::mcollective::tls::TlsSettings;
use crate::mcollective::{BrokerHost, ConnectorKind, Overrides};
use crate::time::parse_duration;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A larger `puppet_kicker.yaml` is a configuration error: it is a few lines.
pub const MAX_FILE_SIZE: u64 = 1 << 20;

/// What Puppet tells us about its own layout; the bindings read these from
/// `Puppet.settings` (never hard-coded: puppetserver and agents differ).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PuppetSettings {
    pub confdir: PathBuf,
    pub vardir: PathBuf,
    /// `Puppet[:server_datadir]`; `$vardir/server_data` when not given.
    pub server_datadir: Option<PathBuf>,
    /// `PUPPET_KICKER_CONFIG`, read by the caller (JRuby's ENV is not the process's).
    pub config_file: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// The master's own fact cache, one file per node.
    PuppetCache,
    /// `rpcutil#inventory` of the mcollective daemons, through the operator's client.cfg.
    Mcollective,
}

/// What the functions do when the index holds no server at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnNoData {
    /// Fail the compile: an empty pool rendered into a load balancer is an outage.
    Fail,
    /// Return `[]`, as the original did.
    Empty,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The file these settings came from, if any.
    pub file: Option<PathBuf>,
    pub source: SourceKind,
    pub puppet_cache_dirs: Vec<PathBuf>,
    pub cache_dir: PathBuf,
    /// Seconds before a snapshot is refreshed in the background.
    pub cache_ttl: u64,
    /// Seconds a compile waits for the very first refresh.
    pub cold_start_timeout: u64,
    pub on_no_data: OnNoData,
    /// Servers whose facts are older than this many seconds are left out.
    pub max_age: u64,
    /// The fact holding a server's role.
    pub role_fact: String,
    /// The `kick` section: planner, agent and dispatch settings.
    pub kick: crate::kick::KickSettings,
    /// Seconds before the first retry of a failed refresh; doubled per failure...
    pub retry_min: u64,
    /// ... up to this many.
    pub retry_max: u64,
    pub mcollective: McollectiveSettings,
}

/// `mcollective.*`: which client.cfg to read, the values that override it, and the
/// source's own settings.
#[derive(Clone, PartialEq)]
pub struct McollectiveSettings {
    /// Overrides of client.cfg values; `config_path` is `mcollective.client_config`
    /// (`None`: the first of `/etc/mcollective/client.cfg`, `/etc/puppetlabs/mcollective/client.cfg`).
    pub overrides: Overrides,
    /// Broker login for every host of the pool.
    pub user: Option<String>,
    pub password: Option<String>,
    /// Seconds to wait for inventory replies once discovery has answered.
    pub timeout: u64,
    /// Seconds a server that stopped answering stays in the index.
    pub grace: u64,
}

impl Default for McollectiveSettings {
    fn default() -> Self {
        McollectiveSettings { overrides: Overrides::default(), user: None, password: None, timeout: 10, grace: 600 }
    }
}

impl std::fmt::Debug for McollectiveSettings {
    // The password stays out of logs (and the psk: see Overrides).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McollectiveSettings")
            .field("overrides", &self.overrides)
            .field("user", &self.user)
            .field("timeout", &self.timeout)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl McollectiveSettings {
    /// The operator's client.cfg with these overrides, `user` and `password` applied
    /// to every broker of the pool.
    pub fn client_config(&self) -> crate::mcollective::Result<crate::mcollective::Config> {
        let mut config = crate::mcollective::Config::load(&self.overrides)?;
        for broker in &mut config.pool {
            if let Some(user) = &self.user {
                broker.user.clone_from(user);
            }
            if let Some(password) = &self.password {
                broker.password.clone_from(password);
            }
        }
        Ok(config)
    }

    fn set(&mut self, key: &str, value: &Value, base: &Path) -> Result<(), String> {
        let bad = |expected: &str| format!("'mcollective.{key}' must be {expected}, got {value}");
        let text =
            |expected: &str| value.as_str().filter(|s| !s.is_empty()).map(str::to_string).ok_or_else(|| bad(expected));
        let seconds = |expected: &str| duration(value).filter(|s| *s > 0).ok_or_else(|| bad(expected));
        match key {
            "client_config" => self.overrides.config_path = Some(base.join(text("a file")?)),
            "connector" => {
                self.overrides.connector =
                    Some(value.as_str().and_then(ConnectorKind::parse).ok_or_else(|| bad("rabbitmq or activemq"))?)
            }
            "pool" => self.overrides.pool = Some(pool(value, base).map_err(|what| bad(&what))?),
            "user" => self.user = Some(value.as_str().ok_or_else(|| bad("a string"))?.to_string()),
            "password" => self.password = Some(value.as_str().ok_or_else(|| bad("a string"))?.to_string()),
            "vhost" => self.overrides.vhost = Some(text("a vhost")?),
            "psk" => self.overrides.psk = Some(text("a pre-shared key")?),
            "identity" => self.overrides.identity = Some(text("an identity")?),
            "main_collective" => self.overrides.main_collective = Some(text("a collective")?),
            "collectives" => {
                let list: Vec<String> = match value {
                    Value::String(s) => s.split(',').map(str::trim).map(str::to_string).collect(),
                    Value::Array(items) => items
                        .iter()
                        .map(|i| i.as_str().map(str::to_string))
                        .collect::<Option<_>>()
                        .ok_or_else(|| bad("a list of collectives"))?,
                    _ => return Err(bad("a list of collectives")),
                };
                if list.is_empty() || list.iter().any(String::is_empty) {
                    return Err(bad("a non-empty list of collectives"));
                }
                self.overrides.collectives = Some(list);
            }
            "callerid" => self.overrides.callerid = Some(text("a callerid such as cert=puppet")?),
            "ttl" => {
                self.overrides.ttl = Some(
                    seconds("a duration (60)").and_then(|s| u32::try_from(s).map_err(|_| bad("a duration (60)")))?,
                )
            }
            "discovery_timeout" => {
                self.overrides.discovery_timeout = Some(Duration::from_secs(seconds("a duration (2)")?))
            }
            "connect_timeout" => {
                self.overrides.connect_timeout = Some(Duration::from_secs(seconds("a duration (10)")?))
            }
            "timeout" => self.timeout = seconds("a duration (10)")?,
            "max_servers" => {
                let n = value.as_u64().filter(|n| *n > 0).ok_or_else(|| bad("a number of servers (100000)"))?;
                let limits = self.overrides.reply_limits.get_or_insert_with(Default::default);
                limits.max_replies = usize::try_from(n).unwrap_or(usize::MAX);
            }
            "max_reply_bytes" => {
                let n = byte_size(value).filter(|n| *n > 0).ok_or_else(|| bad("a size in bytes (1G, 512M)"))?;
                let limits = self.overrides.reply_limits.get_or_insert_with(Default::default);
                limits.max_bytes = usize::try_from(n).unwrap_or(usize::MAX);
            }
            "grace" => self.grace = duration(value).ok_or_else(|| bad("a duration (10m)"))?,
            _ => return Err(format!("unknown key 'mcollective.{key}'; known keys: {}", KNOWN_KEYS.join(", "))),
        }
        Ok(())
    }
}

/// `mcollective.pool`: a list of `{host, port, user, password, ssl, ssl_ca, ssl_cert, ssl_key}`
/// or `host[:port]`; relative TLS file names are relative to `base`.
fn pool(value: &Value, base: &Path) -> Result<Vec<BrokerHost>, String> {
    const EXPECTED: &str = "a list of brokers ({host, port, user, password} or host:port)";
    const BROKER_KEYS: [&str; 8] = ["host", "port", "user", "password", "ssl", "ssl_ca", "ssl_cert", "ssl_key"];
    let items = value.as_array().filter(|items| !items.is_empty()).ok_or(EXPECTED)?;
    let port = |v: Option<&Value>| -> Option<u16> {
        match v {
            None => Some(61613),
            Some(Value::Number(n)) => n.as_u64().and_then(|p| u16::try_from(p).ok()),
            Some(Value::String(s)) => s.parse().ok(),
            Some(_) => None,
        }
    };
    let host = |h: &str, port: Option<u16>, user: &str, password: &str| match port {
        Some(port) if !h.is_empty() && port > 0 => Ok(BrokerHost {
            host: h.to_string(),
            port,
            user: user.to_string(),
            password: password.to_string(),
            tls: None,
        }),
        _ => Err(format!("{EXPECTED}; '{h}' has no valid host and port")),
    };
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => match s.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => host(h, p.parse().ok(), "", ""),
                _ => host(s, Some(61613), "", ""),
            },
            Value::Object(map) => {
                let field = |k: &str| map.get(k).and_then(Value::as_str).unwrap_or_default();
                if let Some(unknown) = map.keys().find(|k| !BROKER_KEYS.contains(&k.as_str())) {
                    return Err(format!("{EXPECTED}; unknown broker key '{unknown}'"));
                }
                let mut broker = host(field("host"), port(map.get("port")), field("user"), field("password"))?;
                broker.tls = broker_tls(map, base).map_err(|why| format!("{EXPECTED}; '{}' {why}", broker.host))?;
                Ok(broker)
            }
            _ => Err(EXPECTED.to_string()),
        })
        .collect()
}

/// A pool entry's `ssl: true` and its `ssl_ca` (a file or a list), `ssl_cert`, `ssl_key`.
/// The files are checked when the client config is resolved.
fn broker_tls(map: &serde_json::Map<String, Value>, base: &Path) -> Result<Option<TlsSettings>, String> {
    let on = match map.get("ssl") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(other) => return Err(format!("has ssl: {other}, expected true or false")),
    };
    let file = |k: &str| -> Result<Option<PathBuf>, String> {
        match map.get(k) {
            None => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(base.join(s))),
            Some(other) => Err(format!("has {k}: {other}, expected a file name")),
        }
    };
    let ca = match map.get("ssl_ca") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().filter(|s| !s.is_empty()).map(|s| base.join(s)))
            .collect::<Option<Vec<_>>>()
            .ok_or("has an ssl_ca list with an entry that is not a file name")?,
        _ => file("ssl_ca")?.into_iter().collect(),
    };
    let (cert, key) = (file("ssl_cert")?, file("ssl_key")?);
    if !on {
        if let Some(k) = ["ssl_ca", "ssl_cert", "ssl_key"].into_iter().find(|k| map.contains_key(*k)) {
            return Err(format!("has {k} but not ssl: true"));
        }
        return Ok(None);
    }
    Ok(Some(TlsSettings { ca, cert, key }))
}

const KNOWN_KEYS: &[&str] = &[
    "source",
    "puppet_cache.dirs",
    "cache.dir",
    "cache.ttl",
    "cache.cold_start_timeout",
    "on_no_data",
    "max_age",
    "role_fact",
    "cache.retry_min",
    "cache.retry_max",
    "mcollective.client_config",
    "mcollective.connector",
    "mcollective.pool",
    "mcollective.user",
    "mcollective.password",
    "mcollective.vhost",
    "mcollective.psk",
    "mcollective.identity",
    "mcollective.main_collective",
    "mcollective.collectives",
    "mcollective.callerid",
    "mcollective.ttl",
    "mcollective.discovery_timeout",
    "mcollective.connect_timeout",
    "mcollective.timeout",
    "mcollective.grace",
    "mcollective.max_servers",
    "mcollective.max_reply_bytes",
];

impl Config {
    pub fn defaults(settings: &PuppetSettings) -> Config {
        let server_datadir = settings.server_datadir.clone().unwrap_or_else(|| settings.vardir.join("server_data"));
        Config {
            file: None,
            source: SourceKind::PuppetCache,
            puppet_cache_dirs: vec![server_datadir.join("facts"), settings.vardir.join("yaml").join("facts")],
            cache_dir: settings.vardir.join("puppet_kicker"),
            cache_ttl: 60,
            cold_start_timeout: 20,
            on_no_data: OnNoData::Fail,
            max_age: 7 * 86_400,
            role_fact: "role".to_string(),
            kick: crate::kick::KickSettings::default(),
            retry_min: 5,
            retry_max: 300,
            mcollective: McollectiveSettings::default(),
        }
    }

    /// Reads `$PUPPET_KICKER_CONFIG`, else `$confdir/puppet_kicker.yaml`, else defaults.
    pub fn load(settings: &PuppetSettings) -> Result<Config> {
        let (path, explicit) = match &settings.config_file {
            Some(path) => (path.clone(), true),
            None => (settings.confdir.join("puppet_kicker.yaml"), false),
        };
        let bytes = match crate::bounded_read::read(&path, MAX_FILE_SIZE) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(Config::defaults(settings)),
            Err(e) => return Err(Error::Config(format!("cannot read {}: {e}", path.display()))),
        };
        let text = String::from_utf8(bytes)
            .map_err(|e| Error::Config(format!("cannot read {}: not UTF-8 ({e})", path.display())))?;
        Config::parse(&text, &path, settings)
    }

    pub fn parse(text: &str, path: &Path, settings: &PuppetSettings) -> Result<Config> {
        let fail = |what: String| Error::Config(format!("{}: {what}", path.display()));
        let document = crate::yaml::parse(text).map_err(|e| fail(format!("not valid YAML: {e}")))?;
        let mut config = Config::defaults(settings);
        config.file = Some(path.to_path_buf());
        let mut entries = Vec::new();
        match &document {
            Value::Null => {}
            Value::Object(_) => flatten("", &document, &mut entries),
            _ => return Err(fail("must be a mapping of settings".into())),
        }
        for (key, value) in entries {
            config.set(&key, value, path.parent().unwrap_or(&settings.confdir)).map_err(fail)?;
        }
        config.kick.validate().map_err(fail)?;
        Ok(config)
    }

    fn set(&mut self, key: &str, value: &Value, base: &Path) -> Result<(), String> {
        let bad = |expected: &str| format!("'{key}' must be {expected}, got {value}");
        match key {
            "source" => {
                self.source = match value.as_str() {
                    Some("puppet_cache") => SourceKind::PuppetCache,
                    Some("mcollective") => SourceKind::Mcollective,
                    _ => return Err(bad("one of: puppet_cache, mcollective")),
                }
            }
            "puppet_cache.dirs" => {
                let dirs = match value {
                    Value::String(s) => vec![s.as_str()],
                    Value::Array(items) => items
                        .iter()
                        .map(Value::as_str)
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| bad("a list of directories"))?,
                    _ => return Err(bad("a list of directories")),
                };
                if dirs.is_empty() {
                    return Err(bad("a non-empty list of directories"));
                }
                self.puppet_cache_dirs = dirs.into_iter().map(|d| base.join(d)).collect();
            }
            "cache.dir" => {
                self.cache_dir = base.join(value.as_str().filter(|s| !s.is_empty()).ok_or_else(|| bad("a directory"))?)
            }
            "cache.ttl" => self.cache_ttl = duration(value).ok_or_else(|| bad("a duration (300, 5m, 1h)"))?,
            "cache.cold_start_timeout" => {
                self.cold_start_timeout = duration(value).ok_or_else(|| bad("a duration (20, 1m)"))?
            }
            "max_age" => self.max_age = duration(value).ok_or_else(|| bad("a duration (604800, 7d)"))?,
            "on_no_data" => {
                self.on_no_data = match value.as_str() {
                    Some("fail") => OnNoData::Fail,
                    Some("empty") => OnNoData::Empty,
                    _ => return Err(bad("'fail' or 'empty'")),
                }
            }
            "cache.retry_min" => {
                self.retry_min = duration(value).filter(|s| *s > 0).ok_or_else(|| bad("a duration (5s)"))?
            }
            "cache.retry_max" => {
                self.retry_max = duration(value).filter(|s| *s > 0).ok_or_else(|| bad("a duration (5m)"))?
            }
            _ if key.starts_with("mcollective.") => self.mcollective.set(&key["mcollective.".len()..], value, base)?,
            "role_fact" => {
                self.role_fact = value.as_str().filter(|s| !s.is_empty()).ok_or_else(|| bad("a fact name"))?.to_string()
            }
            _ if key.starts_with("kick.") && crate::kick::CONFIG_KEYS.contains(&key) => self.kick.set(key, value)?,
            _ => {
                let known = KNOWN_KEYS.iter().chain(crate::kick::CONFIG_KEYS).copied().collect::<Vec<_>>();
                return Err(format!("unknown key '{key}'; known keys: {}", known.join(", ")));
            }
        }
        Ok(())
    }
}

/// Nested mappings become dotted keys (`cache: {ttl: 5}` is `cache.ttl`), except
/// under a known key, whose value is taken whole.
fn flatten<'a>(prefix: &str, value: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Object(map) if !KNOWN_KEYS.contains(&prefix) && !crate::kick::CONFIG_KEYS.contains(&prefix) => {
            for (key, child) in map {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                flatten(&path, child, out);
            }
        }
        _ => out.push((prefix.to_string(), value)),
    }
}

pub(crate) fn duration(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => parse_duration(s),
        _ => None,
    }
}

/// Bytes: a number, or a string with a binary suffix K, M or G (`512M`).
fn byte_size(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => {
            let s = s.trim();
            let (digits, shift) = match s.char_indices().last()? {
                (i, 'K' | 'k') => (&s[..i], 10),
                (i, 'M' | 'm') => (&s[..i], 20),
                (i, 'G' | 'g') => (&s[..i], 30),
                _ => (s, 0),
            };
            digits.trim().parse::<u64>().ok()?.checked_mul(1 << shift)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PuppetSettings {
        PuppetSettings { confdir: "/etc/puppet".into(), vardir: "/var/lib/puppet".into(), ..Default::default() }
    }

    fn parse(text: &str) -> Result<Config> {
        Config::parse(text, Path::new("/etc/puppet/puppet_kicker.yaml"), &settings())
    }

    #[test]
    fn defaults_follow_puppets_layout() {
        let c = Config::defaults(&settings());
        assert_eq!(
            c.puppet_cache_dirs,
            [PathBuf::from("/var/lib/puppet/server_data/facts"), PathBuf::from("/var/lib/puppet/yaml/facts")]
        );
        assert_eq!(c.cache_dir, PathBuf::from("/var/lib/puppet/puppet_kicker"));
        assert_eq!(c.on_no_data, OnNoData::Fail);
        assert_eq!(c.max_age, 604_800);
        let with_datadir = PuppetSettings { server_datadir: Some("/srv/data".into()), ..settings() };
        assert_eq!(Config::defaults(&with_datadir).puppet_cache_dirs[0], PathBuf::from("/srv/data/facts"));
    }

    #[test]
    fn every_key_is_read() {
        let c = parse("source: puppet_cache\npuppet_cache:\n  dirs: [facts, /abs/facts]\ncache:\n  dir: /tmp/pk\n  ttl: 5m\n  cold_start_timeout: 3\non_no_data: empty\nmax_age: 2d\nrole_fact: pp_role\n").unwrap();
        assert_eq!(c.puppet_cache_dirs, [PathBuf::from("/etc/puppet/facts"), PathBuf::from("/abs/facts")]);
        assert_eq!(c.cache_dir, PathBuf::from("/tmp/pk"));
        assert_eq!((c.cache_ttl, c.cold_start_timeout, c.max_age), (300, 3, 172_800));
        assert_eq!(c.on_no_data, OnNoData::Empty);
        assert_eq!(c.role_fact, "pp_role");
        assert!(parse("").is_ok());
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = parse("cache:\n  tll: 5\n").unwrap_err().to_string();
        assert!(e.contains("puppet_kicker.yaml") && e.contains("unknown key 'cache.tll'"), "{e}");
        let e = parse("cache:\n  ttl: soon\n").unwrap_err().to_string();
        assert!(e.contains("'cache.ttl' must be a duration"), "{e}");
        let e = parse("on_no_data: maybe\n").unwrap_err().to_string();
        assert!(e.contains("'on_no_data' must be 'fail' or 'empty'"), "{e}");
        let e = parse("- a\n").unwrap_err().to_string();
        assert!(e.contains("must be a mapping"), "{e}");
        let e = parse("source: etcd\n").unwrap_err().to_string();
        assert!(e.contains("'source' must be"), "{e}");
    }

    #[test]
    fn mcollective_keys_override_the_client_cfg() {
        let c = parse("source: mcollective\nmcollective:\n  client_config: mco/client.cfg\n  connector: activemq\n  pool:\n    - {host: mq1, port: 61614, user: u, password: p}\n    - mq2:6163\n    - mq3\n  password: secret\n  psk: k\n  collectives: mcollective, production\n  main_collective: mcollective\n  discovery_timeout: 3\n  connect_timeout: 4\n  ttl: 1m\n  timeout: 20s\n  grace: 15m\ncache:\n  retry_min: 2\n  retry_max: 1m\n").unwrap();
        assert_eq!(c.source, SourceKind::Mcollective);
        let m = &c.mcollective;
        let o = &m.overrides;
        assert_eq!(o.config_path, Some(PathBuf::from("/etc/puppet/mco/client.cfg")));
        assert_eq!(o.connector, Some(ConnectorKind::ActiveMq));
        let pool = o.pool.as_ref().unwrap();
        assert_eq!(pool.iter().map(BrokerHost::address).collect::<Vec<_>>(), ["mq1:61614", "mq2:6163", "mq3:61613"]);
        assert_eq!((pool[0].user.as_str(), pool[0].password.as_str()), ("u", "p"));
        assert_eq!(o.collectives.as_deref(), Some(&["mcollective".to_string(), "production".to_string()][..]));
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(
            (o.discovery_timeout, o.connect_timeout, o.ttl, m.timeout, m.grace),
            (secs(3), secs(4), Some(60), 20, 900)
        );
        assert_eq!(m.password.as_deref(), Some("secret"));
        assert_eq!((c.retry_min, c.retry_max), (2, 60));
        let debug = format!("{c:?}");
        assert!(!debug.contains("secret") && !debug.contains("psk: Some"), "{debug}");
        assert_eq!(o.psk.as_deref(), Some("k"));
        assert_eq!(o.reply_limits, None);
        let c = parse("mcollective:\n  max_servers: 1\n  max_reply_bytes: 512M\n").unwrap();
        let limits = c.mcollective.overrides.reply_limits.unwrap();
        assert_eq!((limits.max_replies, limits.max_bytes), (1, 512 << 20));
        let c = parse("mcollective:\n  max_reply_bytes: 4096\n").unwrap();
        assert_eq!(c.mcollective.overrides.reply_limits.unwrap().max_bytes, 4096);
        let d = Config::defaults(&settings());
        assert_eq!((d.mcollective.timeout, d.mcollective.grace, d.retry_min, d.retry_max), (10, 600, 5, 300));
        assert_eq!(d.mcollective.overrides.config_path, None);
    }

    #[test]
    fn pool_entries_take_tls_files_relative_to_the_file() {
        let c = parse("mcollective:\n  pool:\n    - {host: mq1, port: 61614, ssl: true, ssl_ca: ca.pem, ssl_cert: /pki/m.pem, ssl_key: /pki/m.key}\n    - {host: mq2, ssl: true, ssl_ca: [a.pem, b.pem]}\n    - {host: mq3, ssl: false}\n").unwrap();
        let pool = c.mcollective.overrides.pool.unwrap();
        let base = Path::new("/etc/puppet");
        let tls = pool[0].tls.as_ref().unwrap();
        assert_eq!(tls.ca, [base.join("ca.pem")]);
        assert_eq!(
            (tls.cert.as_deref(), tls.key.as_deref()),
            (Some(Path::new("/pki/m.pem")), Some(Path::new("/pki/m.key")))
        );
        assert_eq!(pool[1].tls.as_ref().unwrap().ca, [base.join("a.pem"), base.join("b.pem")]);
        assert_eq!(pool[2].tls, None);
    }

    #[test]
    fn bad_mcollective_values_name_the_key() {
        for (yaml, expected) in [
            ("mcollective:\n  conector: rabbitmq\n", "unknown key 'mcollective.conector'"),
            ("mcollective:\n  connector: stomp\n", "'mcollective.connector' must be rabbitmq or activemq"),
            ("mcollective:\n  pool: []\n", "'mcollective.pool' must be a list of brokers"),
            ("mcollective:\n  pool: {host: a}\n", "'mcollective.pool' must be a list of brokers"),
            ("mcollective:\n  pool: [{host: a, port: 99999}]\n", "'a' has no valid host and port"),
            ("mcollective:\n  pool: [{hots: a}]\n", "unknown broker key 'hots'"),
            ("mcollective:\n  pool: [{host: a, ssl_ca: ca.pem}]\n", "'a' has ssl_ca but not ssl: true"),
            ("mcollective:\n  pool: [{host: a, ssl: 1}]\n", "'a' has ssl: 1, expected true or false"),
            ("mcollective:\n  pool: [{host: a, ssl: true, ssl_ca: [ca.pem, 3]}]\n", "'a' has an ssl_ca list"),
            ("mcollective:\n  collectives: []\n", "'mcollective.collectives' must be a non-empty list"),
            ("mcollective:\n  grace: soon\n", "'mcollective.grace' must be a duration"),
            ("mcollective:\n  timeout: 0\n", "'mcollective.timeout' must be a duration"),
            ("mcollective:\n  max_servers: 0\n", "'mcollective.max_servers' must be a number of servers"),
            ("mcollective:\n  max_reply_bytes: 1T\n", "'mcollective.max_reply_bytes' must be a size in bytes"),
            ("cache:\n  retry_max: never\n", "'cache.retry_max' must be a duration"),
        ] {
            let e = parse(yaml).unwrap_err().to_string();
            assert!(e.contains("puppet_kicker.yaml") && e.contains(expected), "{yaml}: {e}");
        }
    }

    #[test]
    fn a_missing_default_file_means_defaults_but_a_named_one_is_an_error() {
        let missing = PuppetSettings { confdir: "/nonexistent".into(), ..settings() };
        assert_eq!(Config::load(&missing).unwrap(), Config::defaults(&missing));
        let named = PuppetSettings { config_file: Some("/nonexistent/pk.yaml".into()), ..settings() };
        assert!(Config::load(&named).unwrap_err().to_string().contains("/nonexistent/pk.yaml"));
    }
}
