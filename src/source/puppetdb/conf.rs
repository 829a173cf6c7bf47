//! `$confdir/puppetdb.conf`, the file the master's PuppetDB terminus reads: only
//! `[main] server_urls` is taken (and the older `server` + `port`). An INI subset:
//! `[section]`, `key = value`, comments after `#` or `;` at the start of a line.

use std::fmt;
use std::path::{Path, PathBuf};

/// A puppetdb.conf is a few lines.
const MAX_FILE_SIZE: u64 = 1 << 20;
/// The port of the older `server` setting when `port` is not given.
const DEFAULT_PORT: u16 = 8081;

/// Whether `url` is an `https://` URL with a host.
pub fn is_https_url(url: &str) -> bool {
    url.strip_prefix("https://")
        .map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default())
        .is_some_and(|authority| !authority.is_empty() && !authority.starts_with(':'))
        && !url.contains(|c: char| c.is_whitespace() || c.is_control())
}

/// Why puppetdb.conf gives no `server_urls`. Each names the file (when read from
/// one: [`parse_server_urls`] of a text has none), and the line when one is wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfError {
    /// The file could not be read (missing, unreadable, over 1 MiB).
    Read { file: PathBuf, source: std::io::Error },
    /// The file is not UTF-8.
    NotUtf8 { file: PathBuf },
    /// A line (1-based) that is wrong, and what it says.
    Line { file: Option<PathBuf>, line: usize, problem: LineProblem, text: String },
    /// `[main]` has neither `server_urls` nor `server`.
    NoServerUrls { file: Option<PathBuf> },
}

/// What is wrong with a line of puppetdb.conf.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LineProblem {
    /// `[section` without its `]`.
    UnclosedSection,
    /// Neither a section, a comment nor `key = value`.
    NotKeyValue,
    /// An entry of `server_urls` that is not an `https://` URL with a host.
    NotHttps { url: String },
    /// `port` is not a port number.
    BadPort,
    /// An older `server` setting that makes no https URL (`server = pdb prt = 84`).
    NotHostName { server: String },
}

impl ConfError {
    /// The same error, about the file `path`.
    fn in_file(self, path: &Path) -> ConfError {
        match self {
            ConfError::Line { line, problem, text, .. } => {
                ConfError::Line { file: Some(path.to_path_buf()), line, problem, text }
            }
            ConfError::NoServerUrls { .. } => ConfError::NoServerUrls { file: Some(path.to_path_buf()) },
            other => other,
        }
    }
}

impl fmt::Display for LineProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineProblem::UnclosedSection => f.write_str("a section without its closing ']'"),
            LineProblem::NotKeyValue => f.write_str("expected 'key = value'"),
            LineProblem::NotHttps { url } => write!(f, "server_urls holds {url:?}, not an https:// URL"),
            LineProblem::BadPort => f.write_str("port is not a port number"),
            LineProblem::NotHostName { server } => write!(f, "server {server:?} is not a host name"),
        }
    }
}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |file: &Option<PathBuf>| file.as_ref().map(|f| f.display().to_string()).unwrap_or_default();
        match self {
            ConfError::Read { file, source } => write!(
                f,
                "cannot read {} for PuppetDB's server_urls (or set puppetdb.server_urls): {source}",
                file.display()
            ),
            ConfError::NotUtf8 { file } => write!(f, "{}: not UTF-8", file.display()),
            ConfError::Line { file, line, problem, text } => write!(f, "{}:{line}: {problem}: {text:?}", shown(file)),
            ConfError::NoServerUrls { file } => write!(f, "{}: no server_urls in its [main] section", shown(file)),
        }
    }
}

impl std::error::Error for ConfError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfError::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The `server_urls` of the puppetdb.conf at `path`; the error names the file, and
/// the line when one is wrong.
pub fn server_urls(path: &Path) -> Result<Vec<String>, ConfError> {
    let bytes = crate::bounded_read::read(path, MAX_FILE_SIZE)
        .map_err(|source| ConfError::Read { file: path.to_path_buf(), source })?;
    let text = std::str::from_utf8(&bytes).map_err(|_| ConfError::NotUtf8 { file: path.to_path_buf() })?;
    parse_server_urls(text).map_err(|e| e.in_file(path))
}

/// [`server_urls`] of a file's text; the error names no file.
pub fn parse_server_urls(text: &str) -> Result<Vec<String>, ConfError> {
    let mut section = String::new();
    let (mut urls, mut server, mut port) = (None, None, None);
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        let wrong = |problem: LineProblem| ConfError::Line { file: None, line: n + 1, problem, text: line.to_string() };
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[') {
            section = name.strip_suffix(']').ok_or_else(|| wrong(LineProblem::UnclosedSection))?.trim().into();
            continue;
        }
        let (key, value) = line.split_once('=').ok_or_else(|| wrong(LineProblem::NotKeyValue))?;
        if section != "main" {
            continue;
        }
        let (key, value) = (key.trim(), value.trim());
        match key {
            "server_urls" => {
                let list: Vec<String> = value.split(',').map(|u| u.trim().to_string()).collect();
                if let Some(bad) = list.iter().find(|u| !is_https_url(u)) {
                    return Err(wrong(LineProblem::NotHttps { url: bad.clone() }));
                }
                urls = Some(list);
            }
            "server" if !value.is_empty() => {
                // The URL it makes, `https://SERVER:PORT`, is held to server_urls' rule.
                if !is_https_url(&format!("https://{value}")) || value.contains(['/', '?', '#']) {
                    return Err(wrong(LineProblem::NotHostName { server: value.to_string() }));
                }
                server = Some(value.to_string())
            }
            "port" => port = Some(value.parse::<u16>().map_err(|_| wrong(LineProblem::BadPort))?),
            _ => {}
        }
    }
    match (urls, server) {
        (Some(urls), _) => Ok(urls),
        (None, Some(server)) => Ok(vec![format!("https://{server}:{}", port.unwrap_or(DEFAULT_PORT))]),
        (None, None) => Err(ConfError::NoServerUrls { file: None }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_come_from_main_in_order() {
        let text = "# managed by Puppet\n[main]\nserver_urls = https://pdb1.example.com:8081, https://pdb2.example.com:8081/\nsoft_write_failure = false\n\n[other]\nserver_urls = https://elsewhere:8081\n";
        assert_eq!(
            parse_server_urls(text).unwrap(),
            ["https://pdb1.example.com:8081", "https://pdb2.example.com:8081/"]
        );
        assert_eq!(parse_server_urls("[main]\nserver = pdb\nport = 8443\n").unwrap(), ["https://pdb:8443"]);
        assert_eq!(parse_server_urls("; comment\n[main]\nserver=pdb\n").unwrap(), ["https://pdb:8081"]);
    }

    #[test]
    fn mistakes_name_the_line() {
        let e = parse_server_urls("[main]\nserver_urls = http://pdb:8080\n").unwrap_err();
        assert!(
            matches!(&e, ConfError::Line { file: None, line: 2, problem: LineProblem::NotHttps { url }, .. } if url == "http://pdb:8080"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            r#":2: server_urls holds "http://pdb:8080", not an https:// URL: "server_urls = http://pdb:8080""#
        );
        let e = parse_server_urls("[main\n").unwrap_err().to_string();
        assert!(e.starts_with(":1: a section without its closing ']'"), "{e}");
        let e = parse_server_urls("[main]\njust words\n").unwrap_err().to_string();
        assert!(e.starts_with(":2: expected 'key = value'"), "{e}");
        let e = parse_server_urls("[main]\nport = lots\n").unwrap_err().to_string();
        assert!(e.starts_with(":2: port is not a port number"), "{e}");
        assert_eq!(
            parse_server_urls("[other]\nserver_urls = https://a\n").unwrap_err().to_string(),
            ": no server_urls in its [main] section"
        );
        assert!(parse_server_urls("[main]\nserver_urls = https://a,\n").is_err(), "an empty entry");
        // Found by fuzz/fuzz_targets/conf_files.rs: `https://pdb prt = 84:8081` was taken.
        let e = parse_server_urls("[main]\nserver = pdb prt = 84\n").unwrap_err().to_string();
        assert!(e.starts_with(r#":2: server "pdb prt = 84" is not a host name"#), "{e}");
        assert!(parse_server_urls("[main]\nserver = pdb/x\n").is_err());
    }

    #[test]
    fn the_error_names_the_file() {
        let dir = std::env::temp_dir().join(format!("pk-pdbconf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("puppetdb.conf");
        std::fs::write(&path, "[main]\nserver_urls = pdb:8081\n").unwrap();
        let e = server_urls(&path).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:2: ", path.display())), "{e}");
        let e = server_urls(&dir.join("missing.conf")).unwrap_err();
        assert!(matches!(&e, ConfError::Read { file, .. } if file.ends_with("missing.conf")), "{e:?}");
        assert!(std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()));
        let e = e.to_string();
        assert!(e.contains("missing.conf") && e.contains("puppetdb.server_urls"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_https_urls_with_a_host() {
        assert!(is_https_url("https://pdb:8081"));
        assert!(is_https_url("https://10.0.0.1:8081/"));
        for bad in ["http://pdb", "https://", "https://:8081", "https://a b", "pdb:8081", ""] {
            assert!(!is_https_url(bad), "{bad}");
        }
    }
}
