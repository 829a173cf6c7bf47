//! `puppet_kicker.yaml`: where facts come from, where the cache lives, and what a
//! compile does when there is no data. No file means the defaults; an unknown key or
//! a bad value is an error naming the key, so a typo never silently means "default".

use crate::error::{Error, Result};
use crate::time::parse_duration;
use serde_json::Value;
use std::path::{Path, PathBuf};

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
        }
    }

    /// Reads `$PUPPET_KICKER_CONFIG`, else `$confdir/puppet_kicker.yaml`, else defaults.
    pub fn load(settings: &PuppetSettings) -> Result<Config> {
        let (path, explicit) = match &settings.config_file {
            Some(path) => (path.clone(), true),
            None => (settings.confdir.join("puppet_kicker.yaml"), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(Config::defaults(settings)),
            Err(e) => return Err(Error::Config(format!("cannot read {}: {e}", path.display()))),
        };
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
        Ok(config)
    }

    fn set(&mut self, key: &str, value: &Value, base: &Path) -> Result<(), String> {
        let bad = |expected: &str| format!("'{key}' must be {expected}, got {value}");
        match key {
            "source" => {
                self.source = match value.as_str() {
                    Some("puppet_cache") => SourceKind::PuppetCache,
                    Some("mcollective") => {
                        return Err("'source: mcollective' is not available in this version; use puppet_cache".into())
                    }
                    _ => return Err(bad("one of: puppet_cache")),
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
            "role_fact" => {
                self.role_fact = value.as_str().filter(|s| !s.is_empty()).ok_or_else(|| bad("a fact name"))?.to_string()
            }
            _ => return Err(format!("unknown key '{key}'; known keys: {}", KNOWN_KEYS.join(", "))),
        }
        Ok(())
    }
}

/// Nested mappings become dotted keys (`cache: {ttl: 5}` is `cache.ttl`), except
/// under a known key, whose value is taken whole.
fn flatten<'a>(prefix: &str, value: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Object(map) if !KNOWN_KEYS.contains(&prefix) => {
            for (key, child) in map {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                flatten(&path, child, out);
            }
        }
        _ => out.push((prefix.to_string(), value)),
    }
}

fn duration(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => parse_duration(s),
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
    fn a_missing_default_file_means_defaults_but_a_named_one_is_an_error() {
        let missing = PuppetSettings { confdir: "/nonexistent".into(), ..settings() };
        assert_eq!(Config::load(&missing).unwrap(), Config::defaults(&missing));
        let named = PuppetSettings { config_file: Some("/nonexistent/pk.yaml".into()), ..settings() };
        assert!(Config::load(&named).unwrap_err().to_string().contains("/nonexistent/pk.yaml"));
    }
}
