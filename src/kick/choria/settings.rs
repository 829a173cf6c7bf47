//! The `choria.*` keys of `puppet_kicker.yaml` (declared in `config::keys`), and what
//! the transport makes of them when it starts: the files read, the certificate's
//! name checked against the caller id, the broker list.

use super::credentials::Credentials;
use super::error::CredentialError;
use super::request::{directed_request, Action, Caller, Destination, RequestId, RunOnce, MIN_TTL};
use crate::puppet_settings::PuppetSettings;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Choria's NATS port, for a broker given without one (`plugin.choria.middleware_hosts`
/// entries usually carry it).
pub const DEFAULT_NATS_PORT: u16 = 4222;
/// Largest CA, certificate or key file read.
const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

/// One NATS broker: where to connect, and the name its certificate must be valid for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broker {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The `choria.*` keys as read; paths and names left unset fall back to Puppet's own
/// when the transport starts ([`ChoriaSettings::resolve`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChoriaSettings {
    /// `choria.brokers`, tried in order; empty: not set (a configuration error when
    /// the transport is Choria).
    pub brokers: Vec<Broker>,
    /// `choria.certname`: the caller id is `choria=<certname>`.
    pub certname: Option<String>,
    pub ssl_ca: Option<PathBuf>,
    pub ssl_cert: Option<PathBuf>,
    pub ssl_key: Option<PathBuf>,
    /// `choria.collective`: the main collective.
    pub collective: String,
    /// `choria.collectives`: a kick whose environment is one of these goes to the
    /// collective of that name, as with mcollective.
    pub collectives: Vec<String>,
    /// `choria.ttl`, seconds (at least [`MIN_TTL`]).
    pub ttl: u32,
    /// `choria.connect_timeout`: TCP, TLS and the NATS handshake, per broker.
    pub connect_timeout: Duration,
    /// `choria.send_environment`: send the kick's environment as `runonce`'s input.
    pub send_environment: bool,
    /// `choria.max_parallel`: kicks awaiting their replies at once.
    pub max_parallel: usize,
}

impl ChoriaSettings {
    /// What the keys' defaults are applied to.
    pub(crate) fn unset() -> ChoriaSettings {
        ChoriaSettings {
            brokers: Vec::new(),
            certname: None,
            ssl_ca: None,
            ssl_cert: None,
            ssl_key: None,
            collective: String::new(),
            collectives: Vec::new(),
            ttl: MIN_TTL,
            connect_timeout: Duration::ZERO,
            send_environment: false,
            max_parallel: 1,
        }
    }

    /// The settings with Puppet's files and certname where a key is unset, the files
    /// read, and the certificate checked to be the key's and named as the certname.
    pub fn resolve(&self, puppet: &PuppetSettings) -> Result<Resolved, SetupError> {
        if self.brokers.is_empty() {
            return Err(SetupError::NoBrokers);
        }
        let file = |key: &'static str, set: &Option<PathBuf>, puppet_default: &Option<PathBuf>, what| {
            set.clone().or_else(|| puppet_default.clone()).ok_or(SetupError::NotSet { key, what })
        };
        let ca = file("choria.ssl_ca", &self.ssl_ca, &puppet.localcacert, "Puppet's localcacert")?;
        let cert = file("choria.ssl_cert", &self.ssl_cert, &puppet.hostcert, "Puppet's hostcert")?;
        let key = file("choria.ssl_key", &self.ssl_key, &puppet.hostprivkey, "Puppet's hostprivkey")?;
        // Puppet names its certificate `<certname>.pem` (`hostcert` is `$certdir/$certname.pem`).
        let puppet_certname = puppet.hostcert.as_ref().and_then(|p| p.file_stem()).and_then(|s| s.to_str());
        let certname = match (&self.certname, puppet_certname) {
            (Some(name), _) => name.clone(),
            (None, Some(name)) => name.to_string(),
            (None, None) => {
                return Err(SetupError::NotSet { key: "choria.certname", what: "Puppet's certname (its hostcert)" })
            }
        };

        let key_pem = read_pem("choria.ssl_key", &key)?;
        let cert_pem = read_pem("choria.ssl_cert", &cert)?;
        let credentials = Credentials::from_pem(&key_pem, &cert_pem).map_err(|source| SetupError::Credentials {
            cert: cert.clone(),
            key: key.clone(),
            source,
        })?;
        let cn = common_name(&cert_pem).ok_or_else(|| SetupError::NoCommonName { cert: cert.clone() })?;
        if cn != certname {
            return Err(SetupError::CertnameMismatch { cert, cn, certname });
        }
        let caller = Caller { sender: certname.clone(), certname };
        // Every name, the ttl and the key are checked once now, by building a request.
        let id = RequestId::random().map_err(|e| SetupError::Request(e.to_string()))?;
        let probe = Destination { collective: &self.collective, targets: &["probe.invalid"] };
        directed_request(&credentials, &caller, probe, Action::RunOnce(&RunOnce::default()), id, self.ttl, 0)
            .map_err(|e| SetupError::Request(e.to_string()))?;
        for collective in &self.collectives {
            super::request::directed_subject(collective, "probe.invalid")
                .map_err(|e| SetupError::Request(e.to_string()))?;
        }
        Ok(Resolved { settings: self.clone(), ca, credentials, caller, cert, key })
    }
}

/// `runonce`'s inputs from `kick.agent`'s (`force`, `splay`, `splaylimit`): Choria's
/// agent is `puppet` (choria-plugins/puppet-agent), never the legacy `puppetd`.
pub fn runonce_inputs(agent: &crate::kick::Agent) -> Result<RunOnce, SetupError> {
    match agent {
        crate::kick::Agent::Puppet { force, splay, splaylimit } => {
            Ok(RunOnce { force: Some(*force), splay: Some(*splay), splaylimit: *splaylimit, environment: None })
        }
        crate::kick::Agent::Puppetd => Err(SetupError::NotThePuppetAgent),
    }
}

/// The settings the transport runs with: files read and checked.
#[derive(Debug)]
pub struct Resolved {
    pub settings: ChoriaSettings,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub credentials: Credentials,
    pub caller: Caller,
}

/// The Choria transport cannot start: each names the key or file at fault.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetupError {
    /// `choria.brokers` is not set.
    NoBrokers,
    /// A key is not set and Puppet did not tell its default (`what`).
    NotSet { key: &'static str, what: &'static str },
    /// A file cannot be read (or is over the size limit).
    Read { key: &'static str, path: PathBuf, reason: String },
    /// The key or certificate cannot sign.
    Credentials { cert: PathBuf, key: PathBuf, source: CredentialError },
    /// The certificate has no subject CN to compare with the certname.
    NoCommonName { cert: PathBuf },
    /// The certificate is not the certname's: Choria servers refuse its requests.
    CertnameMismatch { cert: PathBuf, cn: String, certname: String },
    /// A name, the ttl or the key cannot make a request.
    Request(String),
    /// The CA, certificate or key cannot make a TLS configuration.
    Tls { key: &'static str, reason: String },
    /// The transport's thread or runtime could not start.
    Runtime(String),
    /// `kick.agent: puppetd`: mcollective's legacy agent, which Choria does not have.
    NotThePuppetAgent,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::NoBrokers => write!(
                f,
                "'choria.brokers' is not set: list the NATS brokers of your Choria fleet \
                 (host:port, as plugin.choria.middleware_hosts in /etc/choria/client.conf)"
            ),
            SetupError::NotSet { key, what } => {
                write!(f, "'{key}' is not set, and {what} is not known to default to: set it")
            }
            SetupError::Read { key, path, reason } => write!(f, "'{key}': cannot read {}: {reason}", path.display()),
            SetupError::Credentials { cert, key, source } => {
                write!(f, "'choria.ssl_cert' {} and 'choria.ssl_key' {}: {source}", cert.display(), key.display())
            }
            SetupError::NoCommonName { cert } => {
                write!(f, "'choria.ssl_cert' {}: the certificate has no subject CN to check", cert.display())
            }
            SetupError::CertnameMismatch { cert, cn, certname } => write!(
                f,
                "'choria.ssl_cert' {} is the certificate of {cn:?}, not of the certname {certname:?} \
                 (caller id choria={certname}): Choria servers refuse it; set 'choria.certname' to {cn:?} \
                 or 'choria.ssl_cert'/'choria.ssl_key' to {certname:?}'s",
                cert.display()
            ),
            SetupError::Request(why) => write!(f, "{why}"),
            SetupError::Tls { key, reason } => write!(f, "'{key}': {reason}"),
            SetupError::Runtime(why) => write!(f, "the Choria transport's thread could not start: {why}"),
            SetupError::NotThePuppetAgent => write!(
                f,
                "'kick.agent' is puppetd, mcollective's legacy agent: Choria runs Puppet through the puppet agent \
                 (set kick.agent: puppet, or leave it unset)"
            ),
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SetupError::Credentials { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn read_pem(key: &'static str, path: &Path) -> Result<Vec<u8>, SetupError> {
    let fail = |reason: String| SetupError::Read { key, path: path.to_path_buf(), reason };
    let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| fail(e.to_string()))?;
    if bytes.len() as u64 > MAX_PEM_FILE_BYTES {
        return Err(fail(format!("larger than {MAX_PEM_FILE_BYTES} bytes")));
    }
    Ok(bytes)
}

/// The subject CN of the (first) PEM certificate in `pem`.
fn common_name(pem: &[u8]) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(cn)
}

/// `choria.brokers`: a list of `host:port` (or `host`: port 4222), `[v6]:port`, with an
/// optional `nats://` or `tls://` in front (as client.conf's `middleware_hosts` may have).
pub fn parse_brokers(value: &serde_json::Value) -> Result<Vec<Broker>, String> {
    let entries: Vec<&str> = match value {
        serde_json::Value::String(s) => s.split(',').map(str::trim).collect(),
        serde_json::Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().map(str::trim).ok_or(()))
            .collect::<Result<_, _>>()
            .map_err(|_| "a list of brokers as host:port strings (puppet.example.com:4222)".to_string())?,
        _ => return Err("a list of brokers as host:port strings (puppet.example.com:4222)".to_string()),
    };
    if entries.is_empty() || entries.iter().any(|e| e.is_empty()) {
        return Err("a non-empty list of brokers as host:port strings (puppet.example.com:4222)".to_string());
    }
    entries.into_iter().map(parse_broker).collect()
}

fn parse_broker(entry: &str) -> Result<Broker, String> {
    let bad = || format!("a list of host:port brokers; {entry:?} is not one");
    let rest = entry.strip_prefix("nats://").or_else(|| entry.strip_prefix("tls://")).unwrap_or(entry);
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    let port = match port {
        None => DEFAULT_NATS_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?,
    };
    let host_ok = !host.is_empty()
        && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
        && (rest.starts_with('[') || !host.contains(':'));
    if !host_ok {
        return Err(bad());
    }
    Ok(Broker { host: host.to_string(), port })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::kick::TransportKind;
    use serde_json::json;

    fn parse(yaml: &str, puppet: &PuppetSettings) -> Result<crate::kick::KickSettings, String> {
        Config::parse(yaml, Path::new("/etc/puppet/puppet_kicker.yaml"), puppet)
            .map(|c| c.kick)
            .map_err(|e| e.to_string())
    }

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/choria").join(name)
    }

    #[test]
    fn the_keys_are_read_with_choria_defaults() {
        let puppet = PuppetSettings::default();
        let k = parse("", &puppet).unwrap();
        assert_eq!(k.transport, TransportKind::Mcollective);
        let c = &k.choria;
        assert_eq!((c.collective.as_str(), c.ttl, c.connect_timeout), ("mcollective", 60, Duration::from_secs(10)));
        assert!(c.brokers.is_empty() && c.collectives.is_empty() && !c.send_environment);
        assert_eq!(c.max_parallel, 32);
        assert_eq!((&c.certname, &c.ssl_ca, &c.ssl_cert, &c.ssl_key), (&None, &None, &None, &None));

        let k = parse(
            "kick:\n  transport: choria\nchoria:\n  brokers: [nats1:4222, nats2]\n  certname: kicker.mcollective\n  ssl_ca: ca.pem\n  ssl_cert: /pki/c.pem\n  ssl_key: k.pem\n  collective: main\n  collectives: [production, staging]\n  ttl: 2m\n  connect_timeout: 3\n  send_environment: true\n  max_parallel: 4\n",
            &puppet,
        )
        .unwrap();
        assert_eq!(k.transport, TransportKind::Choria);
        let c = &k.choria;
        assert_eq!(
            c.brokers,
            [Broker { host: "nats1".into(), port: 4222 }, Broker { host: "nats2".into(), port: 4222 }]
        );
        assert_eq!(c.certname.as_deref(), Some("kicker.mcollective"));
        assert_eq!(c.ssl_ca.as_deref(), Some(Path::new("/etc/puppet/ca.pem")));
        assert_eq!(c.ssl_cert.as_deref(), Some(Path::new("/pki/c.pem")));
        assert_eq!((c.collective.as_str(), c.collectives.len(), c.ttl), ("main", 2, 120));
        assert!(c.send_environment && c.connect_timeout == Duration::from_secs(3) && c.max_parallel == 4);

        for (yaml, expected) in [
            ("kick:\n  transport: ssh-ish\n", "'kick.transport' must be 'mcollective', 'choria' or 'ssh'"),
            ("choria:\n  ttl: 29\n", "'choria.ttl' must be at least 30 seconds"),
            ("choria:\n  max_parallel: 1000\n", "'choria.max_parallel' must be at most 256"),
            ("choria:\n  brokers: [a:70000]\n", "'choria.brokers' must be a list of host:port brokers"),
            ("choria:\n  brokers: []\n", "'choria.brokers' must be a non-empty list"),
            ("choria:\n  brokr: [a]\n", "unknown key 'choria.brokr'"),
        ] {
            let e = parse(yaml, &puppet).unwrap_err();
            assert!(e.contains(expected), "{yaml}: {e}");
        }
    }

    #[test]
    fn starting_names_what_is_missing_or_wrong() {
        let mut c = parse("choria:\n  brokers: [127.0.0.1:4222]\n", &PuppetSettings::default()).unwrap().choria;
        let none = PuppetSettings::default();
        let e = ChoriaSettings { brokers: Vec::new(), ..c.clone() }.resolve(&none).unwrap_err().to_string();
        assert!(e.contains("'choria.brokers' is not set"), "{e}");
        let e = c.resolve(&none).unwrap_err().to_string();
        assert!(e.contains("'choria.ssl_ca' is not set, and Puppet's localcacert is not known"), "{e}");

        // Puppet's files are the defaults, its certname the name of its hostcert file.
        let puppet = PuppetSettings {
            hostcert: Some(fixture("kicker.mcollective.cert.pem")),
            hostprivkey: Some(fixture("kicker.mcollective.key.pem")),
            localcacert: Some(fixture("kicker.mcollective.cert.pem")),
            ..PuppetSettings::default()
        };
        let e = c.resolve(&puppet).unwrap_err().to_string();
        // The fixture is named kicker.mcollective.cert.pem: its stem is not the CN.
        assert!(
            e.contains(r#"is the certificate of "kicker.mcollective", not of the certname "kicker.mcollective.cert""#),
            "{e}"
        );
        c.certname = Some("kicker.mcollective".into());
        let resolved = c.resolve(&puppet).unwrap();
        assert_eq!(resolved.caller.caller_id(), "choria=kicker.mcollective");
        assert_eq!(resolved.key, fixture("kicker.mcollective.key.pem"));

        c.ssl_key = Some(fixture("other.key.pem"));
        let e = c.resolve(&puppet).unwrap_err().to_string();
        assert!(e.contains("'choria.ssl_key'") && e.contains("not the client key's"), "{e}");
        let key = std::fs::read_to_string(fixture("other.key.pem")).unwrap();
        let secret = key.lines().nth(1).unwrap();
        assert!(!e.contains(secret) && !format!("{:?}", c.resolve(&puppet)).contains(secret));
        c.ssl_key = Some(fixture("nonexistent.pem"));
        let e = c.resolve(&puppet).unwrap_err().to_string();
        assert!(e.contains("'choria.ssl_key': cannot read") && e.contains("nonexistent.pem"), "{e}");
        let e = runonce_inputs(&crate::kick::Agent::Puppetd).unwrap_err().to_string();
        assert!(e.contains("'kick.agent' is puppetd"), "{e}");
    }

    #[test]
    fn brokers_are_host_port_in_order() {
        let b = parse_brokers(&json!(["nats1.example.com:4223", "nats://nats2", "tls://[::1]:4000"])).unwrap();
        assert_eq!(
            b.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["nats1.example.com:4223", "nats2:4222", "[::1]:4000"]
        );
        assert_eq!(parse_brokers(&json!("a:1, b:2")).unwrap().len(), 2);
        for bad in
            [json!([]), json!(["a:0"]), json!(["a:x"]), json!(["a b:1"]), json!([1]), json!({"a": 1}), json!([""])]
        {
            assert!(parse_brokers(&bad).is_err(), "{bad}");
        }
    }
}
