//! PQL queries to PuppetDB's `/pdb/query/v4` over HTTPS: the server URLs tried in
//! order, each request bounded in time and in answer size. Every error names the
//! URLs tried and why each failed.

use rustls::ClientConfig;
use std::fmt;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of an error answer's body quoted in the error (PuppetDB says there what
/// is wrong with a query).
const QUOTED_BODY_BYTES: u64 = 300;

/// The PuppetDB servers and how to reach them.
pub struct Client {
    urls: Vec<String>,
    /// Replaced whole when the TLS files change; a session keeps the one it began with.
    agent: std::sync::RwLock<ureq::Agent>,
    timeout: Duration,
    max_answer_bytes: usize,
}

/// An answer, and the URL that gave it.
pub struct Answer {
    pub url: String,
    pub bytes: Vec<u8>,
}

impl Client {
    /// `urls` as configured (a trailing `/` is dropped); every request, connect and
    /// TLS included, ends within `timeout`.
    pub fn new(urls: &[String], tls: Arc<ClientConfig>, timeout: Duration, max_answer_bytes: usize) -> Client {
        let urls = urls.iter().map(|u| u.trim_end_matches('/').to_string()).collect();
        let agent = std::sync::RwLock::new(agent(tls, timeout));
        Client { urls, agent, timeout, max_answer_bytes }
    }

    /// From now on, TLS as `tls` says.
    pub fn set_tls(&self, tls: Arc<ClientConfig>) {
        *self.agent.write().unwrap_or_else(std::sync::PoisonError::into_inner) = agent(tls, self.timeout);
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A series of queries (one refresh): each starts with the URL that answered
    /// the one before, then the others in order.
    pub fn session(&self) -> Session<'_> {
        let agent = self.agent.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        Session { client: self, agent, first: 0 }
    }

    /// The answer of `url` to `pql`, through `agent`.
    fn ask(&self, agent: &ureq::Agent, url: &str, pql: &str) -> Result<Vec<u8>, RequestError> {
        let body = serde_json::json!({ "query": pql }).to_string();
        let response = agent
            .post(&format!("{url}/pdb/query/v4"))
            .set("Content-Type", "application/json")
            .set("Accept", "application/json")
            .send_string(&body)
            .map_err(describe)?;
        let mut bytes = Vec::new();
        let limit = self.max_answer_bytes as u64;
        response
            .into_reader()
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(RequestError::ReadAnswer)?;
        if bytes.len() as u64 > limit {
            return Err(RequestError::TooLarge { limit });
        }
        Ok(bytes)
    }
}

/// Queries of one refresh, sticking to the URL that answers.
#[derive(Clone)]
pub struct Session<'c> {
    client: &'c Client,
    agent: ureq::Agent,
    first: usize,
}

impl Session<'_> {
    /// The first answer to `pql`, trying every URL; else every URL's failure.
    pub fn query(&mut self, pql: &str) -> Result<Answer, QueryError> {
        let urls = &self.client.urls;
        let mut failures = Vec::new();
        for i in (0..urls.len()).map(|k| (self.first + k) % urls.len()) {
            match self.client.ask(&self.agent, &urls[i], pql) {
                Ok(bytes) => {
                    self.first = i;
                    return Ok(Answer { url: urls[i].clone(), bytes });
                }
                Err(why) => failures.push((urls[i].clone(), why)),
            }
        }
        Err(QueryError { failures })
    }
}

fn agent(tls: Arc<ClientConfig>, timeout: Duration) -> ureq::Agent {
    ureq::AgentBuilder::new().tls_config(tls).timeout(timeout).redirects(0).build()
}

/// No URL answered a query: each URL tried, in order, with why it failed.
#[derive(Debug)]
#[non_exhaustive]
pub struct QueryError {
    pub failures: Vec<(String, RequestError)>,
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PuppetDB did not answer: ")?;
        for (n, (url, why)) in self.failures.iter().enumerate() {
            write!(f, "{}{url}: {why}", if n == 0 { "" } else { "; " })?;
        }
        Ok(())
    }
}

impl std::error::Error for QueryError {}

/// Why one URL gave no answer to a query.
#[derive(Debug)]
#[non_exhaustive]
pub enum RequestError {
    /// PuppetDB answered with an error status; `body`: the start of its
    /// explanation, whitespace collapsed.
    Status { code: u16, status: String, body: String },
    /// No answer within `puppetdb.timeout`; `detail`: what timed out.
    Timeout { detail: String },
    /// The connection, TLS or the request failed below HTTP.
    Transport { kind: ureq::ErrorKind, detail: String },
    /// The answer could not be read to its end.
    ReadAnswer(std::io::Error),
    /// The answer is larger than `puppetdb.max_page_bytes`.
    TooLarge { limit: u64 },
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Status { code, status, body } if body.is_empty() => write!(f, "HTTP {code} {status}"),
            RequestError::Status { code, status, body } => write!(f, "HTTP {code} {status}: {body}"),
            RequestError::Timeout { detail } => write!(f, "no answer within puppetdb.timeout ({detail})"),
            RequestError::Transport { kind, detail } if detail.is_empty() => write!(f, "{kind}"),
            RequestError::Transport { kind, detail } => write!(f, "{kind}: {detail}{}", tls_hint(detail)),
            RequestError::ReadAnswer(e) => write!(f, "reading the answer: {e}"),
            RequestError::TooLarge { limit } => write!(
                f,
                "an answer larger than puppetdb.max_page_bytes ({limit} bytes); lower puppetdb.page_size or raise it"
            ),
        }
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RequestError::ReadAnswer(e) => Some(e),
            _ => None,
        }
    }
}

/// A failed request as a [`RequestError`]: the HTTP status with the start of
/// PuppetDB's explanation, or what failed below HTTP (connection, TLS, timeout).
fn describe(error: ureq::Error) -> RequestError {
    match error {
        ureq::Error::Status(code, response) => {
            let status = response.status_text().to_string();
            let mut body = String::new();
            let _ = response.into_reader().take(QUOTED_BODY_BYTES).read_to_string(&mut body);
            let body = body.split_whitespace().collect::<Vec<_>>().join(" ");
            RequestError::Status { code, status, body }
        }
        ureq::Error::Transport(transport) => {
            let message = transport.message().map(str::to_string).unwrap_or_default();
            let source = std::error::Error::source(&transport).map(|s| s.to_string()).unwrap_or_default();
            let detail = [message, source].into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>().join(": ");
            match transport.kind() {
                ureq::ErrorKind::Io if detail.contains("timed out") || detail.contains("WouldBlock") => {
                    RequestError::Timeout { detail }
                }
                kind => RequestError::Transport { kind, detail },
            }
        }
    }
}

/// What a TLS failure means for the settings to check.
fn tls_hint(detail: &str) -> &'static str {
    const CLOSED: &str = " (PuppetDB closed the connection: does it accept our certificate, puppetdb.cert?)";
    const HINTS: [(&str, &str); 8] = [
        ("UnknownIssuer", " (PuppetDB's certificate is not signed by the CA of puppetdb.ca)"),
        ("Revoked", " (PuppetDB's certificate is revoked by puppetdb.crl)"),
        ("NotValidForName", " (PuppetDB's certificate does not name the host of this URL)"),
        ("CertificateRequired", " (PuppetDB requires a client certificate: puppetdb.cert)"),
        ("UnknownCA", " (PuppetDB does not trust our certificate, puppetdb.cert)"),
        ("BadCertificate", " (PuppetDB refused our certificate, puppetdb.cert)"),
        // With TLS 1.3 a refused client certificate shows only once the request is sent.
        ("Broken pipe", CLOSED),
        ("Connection reset", CLOSED),
    ];
    HINTS.iter().find(|(error, _)| detail.contains(error)).map_or("", |(_, hint)| hint)
}
