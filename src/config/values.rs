//! How one YAML value becomes a setting: the readers the key table ([`super::keys`])
//! uses. Each says what it expected, for the error that names the key.

use super::error::Problem;
use super::SourceKind;
use crate::kick::Policy;
use crate::mcollective::tls::TlsSettings;
use crate::mcollective::BrokerHost;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// "must be `what`".
pub(crate) const fn expected(what: &'static str) -> Problem {
    Problem::Expected(Cow::Borrowed(what))
}

/// Seconds: a number, or a string such as `5m` ([`crate::time::parse_duration`]).
pub(crate) fn duration(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => crate::time::parse_duration(s),
        _ => None,
    }
}

pub(crate) fn seconds(value: &Value, what: &'static str) -> Result<u64, Problem> {
    duration(value).ok_or(expected(what))
}

/// Seconds, not zero.
pub(crate) fn positive_seconds(value: &Value, what: &'static str) -> Result<u64, Problem> {
    duration(value).filter(|s| *s > 0).ok_or(expected(what))
}

/// A duration in milliseconds, for the kick planner.
pub(crate) fn millis(value: &Value) -> Result<i64, Problem> {
    let seconds = seconds(value, "a duration (30, 10s, 5m)")?;
    Ok(i64::try_from(seconds).unwrap_or(i64::MAX).saturating_mul(1000))
}

/// A whole number above zero.
pub(crate) fn count(value: &Value) -> Result<u64, Problem> {
    value.as_u64().filter(|n| *n > 0).ok_or(expected("a positive whole number"))
}

/// A count that must also fit a `u32`.
pub(crate) fn small_count(value: &Value) -> Result<u32, Problem> {
    u32::try_from(count(value)?).map_err(|_| expected("a small number"))
}

/// A count as a `usize` (saturating: a limit this large is no limit).
pub(crate) fn usize_count(value: &Value) -> Result<usize, Problem> {
    Ok(usize::try_from(count(value)?).unwrap_or(usize::MAX))
}

/// `n`, if it is at most `max`.
pub(crate) fn at_most(n: usize, max: usize) -> Result<usize, Problem> {
    if n > max {
        return Err(Problem::Invalid(format!("must be at most {max}, not {n}")));
    }
    Ok(n)
}

pub(crate) fn flag(value: &Value) -> Result<bool, Problem> {
    value.as_bool().ok_or(expected("true or false"))
}

/// Any string, the empty one included (a broker login may be empty).
pub(crate) fn string(value: &Value) -> Result<String, Problem> {
    value.as_str().map(str::to_string).ok_or(expected("a string"))
}

/// A non-empty string.
pub(crate) fn text(value: &Value, what: &'static str) -> Result<String, Problem> {
    value.as_str().filter(|s| !s.is_empty()).map(str::to_string).ok_or(expected(what))
}

/// A source's name: one of [`SourceKind::ALL`].
pub(crate) fn source_kind(value: &Value) -> Result<SourceKind, Problem> {
    let names: Vec<&str> = SourceKind::ALL.iter().map(|kind| kind.name()).collect();
    let expected = || Problem::Expected(Cow::Owned(format!("one of: {}", names.join(", "))));
    value.as_str().and_then(SourceKind::named).ok_or_else(expected)
}

/// One of `choices`, by name.
pub(crate) fn choice<T: Clone>(value: &Value, choices: &[(&str, T)], what: &'static str) -> Result<T, Problem> {
    let name = value.as_str().ok_or(expected(what))?;
    choices.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()).ok_or(expected(what))
}

/// A directory or a list of them, relative to `base`.
pub(crate) fn directories(value: &Value, base: &Path) -> Result<Vec<PathBuf>, Problem> {
    let dirs = match value {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) => {
            items.iter().map(Value::as_str).collect::<Option<Vec<_>>>().ok_or(expected("a list of directories"))?
        }
        _ => return Err(expected("a list of directories")),
    };
    if dirs.is_empty() {
        return Err(expected("a non-empty list of directories"));
    }
    Ok(dirs.into_iter().map(|d| base.join(d)).collect())
}

/// `a, b` or `[a, b]`, no name empty.
pub(crate) fn collectives(value: &Value) -> Result<Vec<String>, Problem> {
    let list: Vec<String> = match value {
        Value::String(s) => s.split(',').map(str::trim).map(str::to_string).collect(),
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or(expected("a list of collectives"))?,
        _ => return Err(expected("a list of collectives")),
    };
    if list.is_empty() || list.iter().any(String::is_empty) {
        return Err(expected("a non-empty list of collectives"));
    }
    Ok(list)
}

/// Bytes: a number, or a string with a binary suffix K, M or G (`512M`); not zero.
pub(crate) fn byte_size(value: &Value) -> Result<usize, Problem> {
    let bytes = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => {
            let s = s.trim();
            let (digits, shift) = match s.char_indices().last() {
                Some((i, 'K' | 'k')) => (&s[..i], 10),
                Some((i, 'M' | 'm')) => (&s[..i], 20),
                Some((i, 'G' | 'g')) => (&s[..i], 30),
                _ => (s, 0),
            };
            digits.trim().parse::<u64>().ok().and_then(|n| n.checked_mul(1 << shift))
        }
        _ => None,
    };
    let bytes = bytes.filter(|n| *n > 0).ok_or(expected("a size in bytes (1G, 512M)"))?;
    Ok(usize::try_from(bytes).unwrap_or(usize::MAX))
}

/// `{node: [haproxy], admin: '*'}`: a name, `*`, or a list of them per source.
pub(crate) fn policy(value: &Value, what: &'static str) -> Result<Policy, Problem> {
    let mut rules = BTreeMap::new();
    for (source, targets) in value.as_object().ok_or(expected(what))? {
        let targets = match targets {
            Value::String(s) => vec![s.clone()],
            Value::Array(items) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or(expected(what))?,
            Value::Null => Vec::new(),
            _ => return Err(expected(what)),
        };
        rules.insert(source.clone(), targets);
    }
    Ok(Policy::from_rules(rules))
}

/// `mcollective.pool`: a list of `{host, port, user, password, ssl, ssl_ca, ssl_cert, ssl_key}`
/// or `host[:port]`; relative TLS file names are relative to `base`.
pub(crate) fn pool(value: &Value, base: &Path) -> Result<Vec<BrokerHost>, Problem> {
    const EXPECTED: &str = "a list of brokers ({host, port, user, password} or host:port)";
    const BROKER_KEYS: [&str; 8] = ["host", "port", "user", "password", "ssl", "ssl_ca", "ssl_cert", "ssl_key"];
    let wrong = |why: String| Problem::Expected(Cow::Owned(format!("{EXPECTED}; {why}")));
    let items = value.as_array().filter(|items| !items.is_empty()).ok_or(expected(EXPECTED))?;
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
        _ => Err(wrong(format!("'{h}' has no valid host and port"))),
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
                    return Err(wrong(format!("unknown broker key '{unknown}'")));
                }
                let mut broker = host(field("host"), port(map.get("port")), field("user"), field("password"))?;
                broker.tls = broker_tls(map, base).map_err(|why| wrong(format!("'{}' {why}", broker.host)))?;
                Ok(broker)
            }
            _ => Err(expected(EXPECTED)),
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

/// `https://a:8081,https://b:8081` or a list of them: at least one, each `https://`.
pub(crate) fn https_urls(value: &Value) -> Result<Vec<String>, Problem> {
    const WHAT: &str = "a list of https:// URLs";
    let urls: Vec<String> = match value {
        Value::String(s) => s.split(',').map(|u| u.trim().to_string()).collect(),
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(|u| u.trim().to_string()))
            .collect::<Option<_>>()
            .ok_or(expected(WHAT))?,
        _ => return Err(expected(WHAT)),
    };
    if urls.is_empty() || urls.iter().any(|u| !crate::source::puppetdb::conf::is_https_url(u)) {
        return Err(expected(WHAT));
    }
    Ok(urls)
}
