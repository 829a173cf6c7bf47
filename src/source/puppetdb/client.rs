//! PQL queries to PuppetDB's `/pdb/query/v4` over HTTPS: the server URLs tried in
//! order, each request bounded in time and in answer size. Every error names the
//! URLs tried and why each failed.

use rustls::ClientConfig;
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
    fn ask(&self, agent: &ureq::Agent, url: &str, pql: &str) -> Result<Vec<u8>, String> {
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
            .map_err(|e| format!("reading the answer: {e}"))?;
        if bytes.len() as u64 > limit {
            return Err(format!(
                "an answer larger than puppetdb.max_page_bytes ({limit} bytes); lower puppetdb.page_size or raise it"
            ));
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
    pub fn query(&mut self, pql: &str) -> Result<Answer, String> {
        let urls = &self.client.urls;
        let mut failures = Vec::new();
        for i in (0..urls.len()).map(|k| (self.first + k) % urls.len()) {
            match self.client.ask(&self.agent, &urls[i], pql) {
                Ok(bytes) => {
                    self.first = i;
                    return Ok(Answer { url: urls[i].clone(), bytes });
                }
                Err(why) => failures.push(format!("{}: {why}", urls[i])),
            }
        }
        Err(format!("PuppetDB did not answer: {}", failures.join("; ")))
    }
}

fn agent(tls: Arc<ClientConfig>, timeout: Duration) -> ureq::Agent {
    ureq::AgentBuilder::new().tls_config(tls).timeout(timeout).redirects(0).build()
}

/// A failed request in words: the HTTP status with the start of PuppetDB's
/// explanation, or what failed below HTTP (connection, TLS, timeout).
fn describe(error: ureq::Error) -> String {
    match error {
        ureq::Error::Status(code, response) => {
            let status = response.status_text().to_string();
            let mut body = String::new();
            let _ = response.into_reader().take(QUOTED_BODY_BYTES).read_to_string(&mut body);
            let body = body.split_whitespace().collect::<Vec<_>>().join(" ");
            if body.is_empty() {
                format!("HTTP {code} {status}")
            } else {
                format!("HTTP {code} {status}: {body}")
            }
        }
        ureq::Error::Transport(transport) => {
            let message = transport.message().map(str::to_string).unwrap_or_default();
            let source = std::error::Error::source(&transport).map(|s| s.to_string()).unwrap_or_default();
            let detail = [message, source].into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>().join(": ");
            match transport.kind() {
                ureq::ErrorKind::Io if detail.contains("timed out") || detail.contains("WouldBlock") => {
                    format!("no answer within puppetdb.timeout ({detail})")
                }
                kind if detail.is_empty() => kind.to_string(),
                kind => format!("{kind}: {detail}{}", tls_hint(&detail)),
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
