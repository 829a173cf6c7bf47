//! `puppet_kicker.yaml`: where facts come from, where the cache lives, what a compile
//! does when there is no data, and how kicks are sent. No file means the defaults; an
//! unknown key or a bad value is an error naming the file and the key, so a typo never
//! silently means "default". Every key is declared once, in [`keys`].

mod error;
pub mod keys;
mod values;

pub use error::ConfigError;
pub(crate) use error::Problem;
pub use keys::{Key, KeyDefault, KEYS};

use crate::kick::{KickConfig, KickSettings, ReportBudget};
pub use crate::puppet_settings::PuppetSettings;
pub use crate::source::{SourceKind, SourceSettings};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A larger `puppet_kicker.yaml` is a configuration error: it is a few lines.
pub const MAX_FILE_SIZE: u64 = 1 << 20;

/// What the functions do when the index holds no server at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnNoData {
    /// Fail the compile: an empty pool rendered into a load balancer is an outage.
    Fail,
    /// Return `[]`, as the original did.
    Empty,
}

#[derive(Clone, PartialEq)]
pub struct Config {
    /// The file these settings came from, if any.
    pub file: Option<PathBuf>,
    /// The source in use (`source`).
    pub source: SourceKind,
    /// Every source's section (`puppet_cache.*`, `mcollective.*`, `puppetdb.*`), the
    /// one in use or not: the mcollective section also configures the client kicks
    /// are sent with.
    pub sources: SourceSettings,
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
    pub kick: KickSettings,
    /// Seconds before the first retry of a failed refresh; doubled per failure...
    pub retry_min: u64,
    /// ... up to this many.
    pub retry_max: u64,
}

/// Each key with its value, as named in the file; secrets only say whether they are set.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut map = f.debug_map();
        map.entry(&"file", &self.file);
        for key in KEYS {
            let value = key.show(self);
            if key.secret {
                let set = format!("{value:?}") != "None";
                map.entry(&key.name, &format_args!("{}", if set { "<redacted>" } else { "None" }));
            } else {
                map.entry(&key.name, &value);
            }
        }
        map.finish()
    }
}

impl Default for KickSettings {
    /// The defaults of the `kick.*` keys.
    fn default() -> KickSettings {
        Config::defaults(&PuppetSettings::default()).kick
    }
}

impl Default for KickConfig {
    fn default() -> KickConfig {
        KickSettings::default().planner
    }
}

impl Default for ReportBudget {
    fn default() -> ReportBudget {
        KickConfig::default().budget
    }
}

impl Config {
    /// Puppet's layout, then every key's default from [`KEYS`].
    pub fn defaults(settings: &PuppetSettings) -> Config {
        let mut config = Config {
            file: None,
            source: SourceKind::ALL[0],
            sources: SourceSettings::unset(settings),
            cache_dir: settings.vardir.join("puppet_kicker"),
            cache_ttl: 0,
            cold_start_timeout: 0,
            on_no_data: OnNoData::Fail,
            max_age: 0,
            role_fact: String::new(),
            kick: KickSettings::unset(),
            retry_min: 0,
            retry_max: 0,
        };
        for key in KEYS {
            if let KeyDefault::Value(text) = key.default {
                // A test reads every default through its key; nothing here can fail.
                let applied = crate::yaml::parse(text).ok().map(|value| key.set(&mut config, &value, Path::new("")));
                debug_assert!(matches!(applied, Some(Ok(()))), "default of {}: {applied:?}", key.name);
            }
        }
        config
    }

    /// Reads `$PUPPET_KICKER_CONFIG`, else `$confdir/puppet_kicker.yaml`, else defaults.
    pub fn load(settings: &PuppetSettings) -> Result<Config, ConfigError> {
        let (path, explicit) = match &settings.config_file {
            Some(path) => (path.clone(), true),
            None => (settings.confdir.join("puppet_kicker.yaml"), false),
        };
        let bytes = match crate::bounded_read::read(&path, MAX_FILE_SIZE) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(Config::defaults(settings)),
            Err(source) => return Err(ConfigError::Read { file: path, source }),
        };
        let text = String::from_utf8(bytes).map_err(|source| ConfigError::NotUtf8 { file: path.clone(), source })?;
        Config::parse(&text, &path, settings)
    }

    /// Reads `text` as if from the file `path`: every key through [`KEYS`], then the
    /// checks no single key can make.
    pub fn parse(text: &str, path: &Path, settings: &PuppetSettings) -> Result<Config, ConfigError> {
        let file = || path.to_path_buf();
        let document = crate::yaml::parse(text).map_err(|source| ConfigError::Yaml { file: file(), source })?;
        let mut config = Config::defaults(settings);
        config.file = Some(file());
        let mut entries = Vec::new();
        match &document {
            Value::Null => {}
            Value::Object(_) => flatten("", &document, &mut entries),
            _ => return Err(ConfigError::NotAMapping { file: file() }),
        }
        let base = path.parent().unwrap_or(&settings.confdir);
        for (name, value) in entries {
            let key = keys::key(&name).ok_or_else(|| ConfigError::UnknownKey {
                file: file(),
                known: known_keys_near(&name),
                key: name.clone(),
            })?;
            key.set(&mut config, value, base).map_err(|p| p.into_error(file(), key.name, value))?;
        }
        config
            .kick
            .validate()
            .map_err(|e| Problem::Invalid(e.to_string()).into_error(file(), "kick.reply_timeout", &Value::Null))?;
        if config.kick.transport == crate::kick::TransportKind::Ssh {
            config.kick.ssh.check().map_err(|e| Problem::Invalid(e.reason).into_error(file(), e.key, &Value::Null))?;
        }
        Ok(config)
    }
}

/// The keys to list for an unknown `name`: those of its section (`mcollective.`), else all.
fn known_keys_near(name: &str) -> Vec<&'static str> {
    let all = KEYS.iter().map(|k| k.name);
    match name.split_once('.') {
        Some((section, _)) if KEYS.iter().any(|k| k.name.starts_with(&format!("{section}."))) => {
            all.filter(|k| k.starts_with(section) && k[section.len()..].starts_with('.')).collect()
        }
        _ => all.collect(),
    }
}

/// Nested mappings become dotted keys (`cache: {ttl: 5}` is `cache.ttl`), except
/// under a known key, whose value is taken whole.
fn flatten<'a>(prefix: &str, value: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Object(map) if keys::key(prefix).is_none() => {
            for (key, child) in map {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                flatten(&path, child, out);
            }
        }
        _ => out.push((prefix.to_string(), value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcollective::{BrokerHost, ConnectorKind};
    use std::time::Duration;

    fn settings() -> PuppetSettings {
        PuppetSettings { confdir: "/etc/puppet".into(), vardir: "/var/lib/puppet".into(), ..Default::default() }
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/puppet/puppet_kicker.yaml"), &settings())
    }

    #[test]
    fn defaults_follow_puppets_layout() {
        let c = Config::defaults(&settings());
        assert_eq!(
            c.sources.puppet_cache.dirs,
            [PathBuf::from("/var/lib/puppet/server_data/facts"), PathBuf::from("/var/lib/puppet/yaml/facts")]
        );
        assert_eq!(c.cache_dir, PathBuf::from("/var/lib/puppet/puppet_kicker"));
        assert_eq!(c.on_no_data, OnNoData::Fail);
        assert_eq!(c.max_age, 604_800);
        let with_datadir = PuppetSettings { server_datadir: Some("/srv/data".into()), ..settings() };
        assert_eq!(Config::defaults(&with_datadir).sources.puppet_cache.dirs[0], PathBuf::from("/srv/data/facts"));
    }

    #[test]
    fn every_key_is_read() {
        let c = parse("source: puppet_cache\npuppet_cache:\n  dirs: [facts, /abs/facts]\ncache:\n  dir: /tmp/pk\n  ttl: 5m\n  cold_start_timeout: 3\non_no_data: empty\nmax_age: 2d\nrole_fact: pp_role\n").unwrap();
        assert_eq!(c.sources.puppet_cache.dirs, [PathBuf::from("/etc/puppet/facts"), PathBuf::from("/abs/facts")]);
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
        assert!(e.contains(r#"'source' must be one of: puppet_cache, mcollective, puppetdb, got "etcd""#), "{e}");
        for kind in SourceKind::ALL {
            assert_eq!(parse(&format!("source: {}\n", kind.name())).unwrap().source, *kind);
        }
    }

    #[test]
    fn mcollective_keys_override_the_client_cfg() {
        let c = parse("source: mcollective\nmcollective:\n  client_config: mco/client.cfg\n  connector: activemq\n  pool:\n    - {host: mq1, port: 61614, user: u, password: p}\n    - mq2:6163\n    - mq3\n  password: secret\n  psk: k\n  collectives: mcollective, production\n  main_collective: mcollective\n  discovery_timeout: 3\n  connect_timeout: 4\n  ttl: 1m\n  timeout: 20s\n  grace: 15m\ncache:\n  retry_min: 2\n  retry_max: 1m\n").unwrap();
        assert_eq!(c.source, SourceKind::Mcollective);
        let m = &c.sources.mcollective;
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
        let limits = c.sources.mcollective.overrides.reply_limits.unwrap();
        assert_eq!((limits.max_replies, limits.max_bytes), (1, 512 << 20));
        let c = parse("mcollective:\n  max_reply_bytes: 4096\n").unwrap();
        assert_eq!(c.sources.mcollective.overrides.reply_limits.unwrap().max_bytes, 4096);
        let d = Config::defaults(&settings());
        assert_eq!(
            (d.sources.mcollective.timeout, d.sources.mcollective.grace, d.retry_min, d.retry_max),
            (10, 600, 5, 300)
        );
        assert_eq!(d.sources.mcollective.overrides.config_path, None);
    }

    #[test]
    fn puppetdb_keys_default_to_puppets_own_settings() {
        let puppet = PuppetSettings {
            hostcert: Some("/ssl/certs/m.pem".into()),
            hostprivkey: Some("/ssl/private_keys/m.pem".into()),
            localcacert: Some("/ssl/certs/ca.pem".into()),
            hostcrl: Some("/ssl/crl.pem".into()),
            ..settings()
        };
        let d = Config::defaults(&puppet).sources.puppetdb;
        assert_eq!(d.config_file, PathBuf::from("/etc/puppet/puppetdb.conf"));
        assert_eq!(d.server_urls, None);
        assert_eq!(
            (d.cert.as_deref(), d.key.as_deref(), d.ca.as_deref(), d.crl.as_deref()),
            (
                Some(Path::new("/ssl/certs/m.pem")),
                Some(Path::new("/ssl/private_keys/m.pem")),
                Some(Path::new("/ssl/certs/ca.pem")),
                Some(Path::new("/ssl/crl.pem"))
            )
        );
        assert_eq!(
            (d.timeout, d.page_size, d.max_page_bytes, d.overlap, d.full_refresh),
            (30, 500, 256 << 20, 60, 3600)
        );

        let c = Config::parse(
            "source: puppetdb\npuppetdb:\n  server_urls: https://a:8081, https://b:8081\n  cert: c.pem\n  key: k.pem\n  ca: /ca.pem\n  crl: crl.pem\n  timeout: 5\n  page_size: 50\n  max_page_bytes: 8M\n  overlap: 2m\n  full_refresh: 30m\n  config: pdb.conf\n",
            Path::new("/etc/puppet/puppet_kicker.yaml"),
            &puppet,
        )
        .unwrap();
        assert_eq!(c.source, SourceKind::Puppetdb);
        let p = &c.sources.puppetdb;
        assert_eq!(p.server_urls.as_deref(), Some(&["https://a:8081".to_string(), "https://b:8081".to_string()][..]));
        assert_eq!(p.cert.as_deref(), Some(Path::new("/etc/puppet/c.pem")));
        assert_eq!(p.ca.as_deref(), Some(Path::new("/ca.pem")));
        assert_eq!(p.config_file, PathBuf::from("/etc/puppet/pdb.conf"));
        assert_eq!((p.timeout, p.page_size, p.max_page_bytes, p.overlap, p.full_refresh), (5, 50, 8 << 20, 120, 1800));
        let e = parse("puppetdb:\n  server_urls: [http://a:8080]\n").unwrap_err().to_string();
        assert!(e.contains("'puppetdb.server_urls' must be a list of https:// URLs"), "{e}");
        let e = parse("puppetdb:\n  page_size: 0\n").unwrap_err().to_string();
        assert!(e.contains("'puppetdb.page_size'"), "{e}");
        assert_eq!(parse("puppetdb:\n  requests_in_flight: 8\n").unwrap().sources.puppetdb.requests_in_flight, 8);
        let e = parse("puppetdb:\n  requests_in_flight: 9\n").unwrap_err().to_string();
        assert!(e.contains("'puppetdb.requests_in_flight'") && e.contains("at most 8, not 9"), "{e}");
        let e = parse("puppetdb:\n  requests_in_flight: 0\n").unwrap_err().to_string();
        assert!(e.contains("'puppetdb.requests_in_flight'"), "{e}");
    }

    #[test]
    fn pool_entries_take_tls_files_relative_to_the_file() {
        let c = parse("mcollective:\n  pool:\n    - {host: mq1, port: 61614, ssl: true, ssl_ca: ca.pem, ssl_cert: /pki/m.pem, ssl_key: /pki/m.key}\n    - {host: mq2, ssl: true, ssl_ca: [a.pem, b.pem]}\n    - {host: mq3, ssl: false}\n").unwrap();
        let pool = c.sources.mcollective.overrides.pool.unwrap();
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
    fn errors_are_typed_and_name_the_file_and_key() {
        use std::error::Error as _;
        match parse("cache:\n  tll: 5\n").unwrap_err() {
            ConfigError::UnknownKey { file, key, known } => {
                assert_eq!((file.to_str(), key.as_str()), (Some("/etc/puppet/puppet_kicker.yaml"), "cache.tll"));
                assert_eq!(
                    known,
                    ["cache.dir", "cache.ttl", "cache.cold_start_timeout", "cache.retry_min", "cache.retry_max"]
                );
            }
            other => panic!("{other:?}"),
        }
        let e = parse("mcollective:\n  conector: rabbitmq\n").unwrap_err().to_string();
        assert!(
            e.contains("known keys: mcollective.client_config, mcollective.connector,") && !e.contains("kick."),
            "{e}"
        );
        let e = parse("rolefact: x\n").unwrap_err().to_string();
        assert!(e.contains("known keys: source, ") && e.contains("kick.exit_wait"), "{e}");
        let e = parse("cache:\n  ttl: soon\n").unwrap_err();
        assert_eq!(e.key(), Some("cache.ttl"));
        assert!(matches!(e, ConfigError::BadValue { ref got, .. } if got == "\"soon\""), "{e:?}");
        let named = PuppetSettings { config_file: Some("/nonexistent/pk.yaml".into()), ..settings() };
        let e = Config::load(&named).unwrap_err();
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("the io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        let core: crate::Error = e.into();
        assert_eq!(core.kind(), crate::error::Kind::Config);
        let e = parse("cache: [\n").unwrap_err();
        assert!(matches!(e, ConfigError::Yaml { source: crate::yaml::YamlError::Syntax(_), .. }), "{e:?}");
        assert!(e.source().is_some_and(|s| s.is::<crate::yaml::YamlError>()));
    }

    #[test]
    fn a_missing_default_file_means_defaults_but_a_named_one_is_an_error() {
        let missing = PuppetSettings { confdir: "/nonexistent".into(), ..settings() };
        assert_eq!(Config::load(&missing).unwrap(), Config::defaults(&missing));
        let named = PuppetSettings { config_file: Some("/nonexistent/pk.yaml".into()), ..settings() };
        assert!(Config::load(&named).unwrap_err().to_string().contains("/nonexistent/pk.yaml"));
    }
}
