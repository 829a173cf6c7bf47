//! `source: puppetdb`: PuppetDB's `inventory` (certname, timestamp, environment,
//! facts, trusted), read through `/pdb/query/v4` with PQL over HTTPS.
//!
//! A full read lists every node's certname and facts timestamp, then asks for the
//! facts of `puppetdb.page_size` certnames at a time, each answer decoded into the
//! store as it arrives. An incremental refresh asks which nodes' facts were stored
//! since the newest it saw (less `puppetdb.overlap`), fetches those whose timestamp
//! differs from the one held, and drops the held nodes PuppetDB lists as deactivated
//! or expired; the other servers keep their rows. A full read again every
//! `puppetdb.full_refresh`.
//!
//! - [`conf`]: puppetdb.conf's `server_urls`;
//! - [`tls`]: the rustls configuration from Puppet's certificate, key, CA and CRL;
//! - [`client`]: the URLs in order, each request bounded in time and size;
//! - [`query`]: the PQL;
//! - [`decode`]: the answers, facts into the store;
//! - [`state`]: what one refresh leaves the next.

pub mod client;
pub mod conf;
pub mod decode;
pub mod query;
mod state;

use super::{Changes, IncrementalBase, Memo, Source, SourceRead};
use crate::error::{Error, Result};
use crate::index::Index;
use crate::puppet_settings::PuppetSettings;
use crate::store::{Builder, Tables};
use crate::tls_files as tls;
use crate::unpoisoned::lock;
use client::{Client, Session};
use decode::Entry;
use state::{Held, State};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A store may grow to this many times its values after the last full read
/// before a refresh reads everything again (what changed servers leave behind).
const GARBAGE_FACTOR: usize = crate::source::puppet_cache::GARBAGE_FACTOR;
/// Requests a refresh's worst case allows for at each URL, beyond decoding.
const WORST_CASE_REQUESTS: u32 = 3;
/// Decoding and building, beyond the network's share.
const WORST_CASE_WORK: Duration = Duration::from_secs(300);
/// Answers fetched ahead of the one being decoded.
const PAGES_AHEAD: usize = 1;

/// `puppetdb.*`: where PuppetDB is, how to prove who we are, and how to page and
/// refresh. `None` means "from Puppet": puppetdb.conf, Puppet's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct PuppetdbSettings {
    /// `puppetdb.config`: the puppetdb.conf giving `server_urls` when not set here.
    pub config_file: PathBuf,
    pub server_urls: Option<Vec<String>>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    /// Read only when the file exists.
    pub crl: Option<PathBuf>,
    /// Seconds one request (connect, send, answer read) may take.
    pub timeout: u64,
    /// Servers asked for per request.
    pub page_size: usize,
    /// Requests a full read has PuppetDB answer at once.
    pub requests_in_flight: usize,
    /// Most bytes of one answer.
    pub max_page_bytes: usize,
    /// Seconds before the newest change seen that an incremental refresh asks again.
    pub overlap: u64,
    /// Seconds between full reads.
    pub full_refresh: u64,
}

impl PuppetdbSettings {
    /// Puppet's puppetdb.conf, certificate, key, CA and CRL.
    pub fn unset(puppet: &PuppetSettings) -> PuppetdbSettings {
        PuppetdbSettings {
            config_file: puppet.confdir.join("puppetdb.conf"),
            server_urls: None,
            cert: puppet.hostcert.clone(),
            key: puppet.hostprivkey.clone(),
            ca: puppet.localcacert.clone(),
            crl: puppet.hostcrl.clone(),
            timeout: 0,
            page_size: 0,
            requests_in_flight: 0,
            max_page_bytes: 0,
            overlap: 0,
            full_refresh: 0,
        }
    }
}

/// The PuppetDB servers, and what the last refresh left the next.
pub struct PuppetdbSource {
    client: Client,
    /// The TLS files, and how they stood when `client` was made from them: a renewed
    /// certificate or a new CRL is used from the next refresh on.
    tls: Mutex<(tls::TlsFiles, tls::Stamp)>,
    settings: PuppetdbSettings,
    /// What the last refresh leaves the next ([`Source::carry`]): the tables of the
    /// index built from it, and every server held (a [`State`]) in its store.
    carried: Mutex<Option<IncrementalBase>>,
}

impl PuppetdbSource {
    /// The source the settings describe: `server_urls` from puppetdb.conf unless set,
    /// the TLS files read. An unusable setting or file is a configuration error.
    pub fn open(settings: &PuppetdbSettings) -> Result<PuppetdbSource> {
        let urls = match &settings.server_urls {
            Some(urls) => urls.clone(),
            None => conf::server_urls(&settings.config_file).map_err(SourceError::Conf)?,
        };
        let file = |file: &Option<PathBuf>, key: &'static str, puppet_setting: &'static str| {
            file.clone().ok_or(SourceError::MissingSetting { key, puppet_setting })
        };
        let files = tls::TlsFiles {
            prefix: "puppetdb",
            check_name: true,
            ca: file(&settings.ca, "puppetdb.ca", "localcacert")?,
            cert: file(&settings.cert, "puppetdb.cert", "hostcert")?,
            key: file(&settings.key, "puppetdb.key", "hostprivkey")?,
            crl: settings.crl.clone(),
        };
        let stamp = tls::Stamp::of(&files);
        let config = tls::client_config(&files).map_err(SourceError::Tls)?;
        let timeout = Duration::from_secs(settings.timeout);
        Ok(PuppetdbSource {
            client: Client::new(&urls, config, timeout, settings.max_page_bytes),
            tls: Mutex::new((files, stamp)),
            settings: settings.clone(),
            carried: Mutex::new(None),
        })
    }

    /// Makes the TLS configuration again when a file changed since it was made; an
    /// unusable file fails this refresh (and is read again by the next).
    fn reload_tls_if_changed(&self) -> Result<()> {
        let mut tls = lock(&self.tls);
        let (files, stamp) = &mut *tls;
        let now = tls::Stamp::of(files);
        if now != *stamp {
            let config = tls::client_config(files).map_err(SourceError::Tls)?;
            self.client.set_tls(config);
            *stamp = now;
        }
        Ok(())
    }

    /// Every node: the listing, then the facts a page at a time.
    fn full(&self, session: &mut Session, started: i64, progress: &AtomicUsize) -> Result<(SourceRead, State)> {
        let mut listed = self.list(session, None)?;
        listed.sort_by(|a, b| a.certname.cmp(&b.certname));
        listed.dedup_by(|a, b| a.certname == b.certname);
        let names: Vec<&str> = listed.iter().map(|l| l.certname.as_str()).collect();
        let mut builder = Builder::new();
        let mut warnings = Vec::new();
        let entries = self.fetch(session, &names, &mut builder, &mut warnings, progress)?;
        let newest = listed.iter().filter_map(|l| crate::time::parse_timestamp(&l.timestamp)).max().unwrap_or(0);
        let servers: BTreeMap<String, Held> = entries.into_iter().map(Held::of).collect();
        let state = State { servers, newest, full_at: started, values_after_full: builder.store().values() };
        let read = SourceRead { observations: state.observations(), builder, warnings, ..SourceRead::default() };
        Ok((read, state))
    }

    /// The nodes changed since the newest seen (less the overlap) fetched again, the
    /// nodes held that PuppetDB lists as inactive dropped; the others as they are.
    fn incremental(
        &self,
        session: &mut Session,
        index: &Index,
        (tables, mut state): (Tables, State),
        progress: &AtomicUsize,
    ) -> Result<(SourceRead, State)> {
        let since = query::timestamp(state.newest.saturating_sub(self.settings.overlap as i64));
        let listed = self.list(session, Some(&since))?;
        let answer = session.query(&query::gone()).map_err(SourceError::Query)?;
        let gone = decode::gone(&answer.bytes).map_err(|e| malformed(&answer.url, e))?;
        let mut changed: Vec<String> = Vec::new();
        for node in gone {
            if state.servers.remove(&node.certname).is_some() {
                changed.push(node.certname);
            }
        }
        let mut to_fetch: Vec<&str> = listed
            .iter()
            .filter(|l| state.servers.get(&l.certname).is_none_or(|held| held.timestamp != l.timestamp))
            .map(|l| l.certname.as_str())
            .collect();
        to_fetch.sort_unstable();
        to_fetch.dedup();
        let mut builder = Builder::resume(index.store(), tables);
        let mut warnings = Vec::new();
        let entries = self.fetch(session, &to_fetch, &mut builder, &mut warnings, progress)?;
        // Every server asked for changed: given again, or not (deactivated since the
        // listing, or skipped) and so dropped.
        let given: hashbrown::HashSet<&str> = entries.iter().map(|e| e.certname.as_str()).collect();
        for name in &to_fetch {
            if state.servers.remove(*name).is_some() || given.contains(name) {
                changed.push(name.to_string());
            }
        }
        drop(given);
        for (certname, held) in entries.into_iter().map(Held::of) {
            state.servers.insert(certname, held);
        }
        let newest = listed.iter().filter_map(|l| crate::time::parse_timestamp(&l.timestamp)).max();
        state.newest = state.newest.max(newest.unwrap_or(i64::MIN));
        changed.sort_unstable();
        changed.dedup();
        let changes = Some(Changes { since: index.generation(), certnames: changed });
        let read =
            SourceRead { observations: state.observations(), builder, warnings, changes, ..SourceRead::default() };
        Ok((read, state))
    }

    /// The listing since `since` (every node without it).
    fn list(&self, session: &mut Session, since: Option<&str>) -> Result<Vec<decode::Listed>> {
        let answer = session.query(&query::listing(since)).map_err(SourceError::Query)?;
        Ok(decode::listing(&answer.bytes).map_err(|e| malformed(&answer.url, e))?)
    }

    /// The entries of `certnames`, a page at a time, decoded into `builder` in page
    /// order. Only entries asked for are taken. `puppetdb.requests_in_flight` pages
    /// are asked for at once while one is decoded, so PuppetDB's cores and ours work
    /// together; per request in flight, at most [`PAGES_AHEAD`] answers wait.
    fn fetch(
        &self,
        session: &mut Session,
        certnames: &[&str],
        builder: &mut Builder,
        warnings: &mut Vec<String>,
        progress: &AtomicUsize,
    ) -> Result<Vec<Entry>> {
        let pages: Vec<&[&str]> = certnames.chunks(self.settings.page_size.max(1)).collect();
        let pages = &pages;
        let lanes = self.settings.requests_in_flight.clamp(1, pages.len().max(1));
        let mut entries = Vec::with_capacity(certnames.len());
        std::thread::scope(|scope| {
            // Lane k fetches pages k, k + lanes, ...: read lane by lane in turn, the
            // answers are decoded in page order, so the store is the same whatever `lanes`.
            let mut lane_answers = Vec::with_capacity(lanes);
            for lane in 0..lanes {
                let (send, answers) = crossbeam_channel::bounded(PAGES_AHEAD);
                let mut session = session.clone();
                let fetcher = move || {
                    for page in pages.iter().skip(lane).step_by(lanes) {
                        let answer = session.query(&query::inventory_of(page));
                        let failed = answer.is_err();
                        // Stops once the decoder has stopped.
                        if send.send(answer).is_err() || failed {
                            break;
                        }
                    }
                };
                std::thread::Builder::new()
                    .name("puppet-kicker-puppetdb".into())
                    .spawn_scoped(scope, fetcher)
                    .map_err(|e| Error::system("cannot start a PuppetDB fetch thread", e))?;
                lane_answers.push(answers);
            }
            for (k, page) in pages.iter().enumerate() {
                let answer = lane_answers[k % lanes]
                    .recv()
                    .map_err(|_| Error::Io("a PuppetDB fetch thread stopped before its page".into()))?;
                let answer = answer.map_err(SourceError::Query)?;
                let before = entries.len();
                decode::inventory(&answer.bytes, builder, &mut entries, warnings)
                    .map_err(|e| malformed(&answer.url, e))?;
                let asked = |e: &Entry| page.binary_search(&e.certname.as_str()).is_ok();
                if let Some(stranger) = entries[before..].iter().find(|e| !asked(e)) {
                    let certname = stranger.certname.clone();
                    return Err(malformed(&answer.url, decode::AnswerError::NotAskedFor { certname }).into());
                }
                progress.fetch_add(entries.len() - before, Ordering::Relaxed);
            }
            Ok(entries)
        })
    }
}

impl Source for PuppetdbSource {
    /// For messages: the URLs.
    fn describe(&self) -> String {
        format!("the puppetdb source ({})", self.client.urls().join(", "))
    }

    /// A few requests at every URL, each within the timeout, and the decoding.
    fn worst_case(&self) -> Duration {
        let urls = u32::try_from(self.client.urls().len()).unwrap_or(u32::MAX);
        self.client.timeout().saturating_mul(urls.saturating_mul(WORST_CASE_REQUESTS)).saturating_add(WORST_CASE_WORK)
    }

    /// Reads PuppetDB: incrementally from `previous` when the last refresh built it,
    /// else in full, counting the servers decoded page by page. Also gives where
    /// PuppetDB recorded each server's environment. The error names the URLs and
    /// what failed.
    fn refresh(&self, previous: Option<&Index>, started: i64, progress: &AtomicUsize) -> Result<SourceRead> {
        // Taken: a refresh that fails leaves none, and the next one reads in full.
        let carried = lock(&self.carried).take().and_then(|mut c| Some((c.take_memo::<State>()?, c)));
        let base = carried.zip(previous).filter(|((state, c), index)| {
            c.goes_on_from(index)
                && started.saturating_sub(state.full_at) < self.settings.full_refresh as i64
                && index.store().values() <= GARBAGE_FACTOR.saturating_mul(state.values_after_full.max(1))
        });
        self.reload_tls_if_changed()?;
        let mut session = self.client.session();
        let (mut read, state) = match base {
            Some(((state, c), index)) => self.incremental(&mut session, index, (c.tables, state), progress)?,
            None => self.full(&mut session, started, progress)?,
        };
        read.environments = Some(state.environments());
        read.memo = Some(Memo::new(state));
        Ok(read)
    }

    fn carry(&self, base: IncrementalBase) {
        *lock(&self.carried) = Some(base);
    }
}

/// A refresh error for an answer of the wrong shape.
fn malformed(url: &str, error: decode::AnswerError) -> SourceError {
    SourceError::Malformed { url: url.to_string(), error }
}

/// Why `source: puppetdb` cannot start (a configuration error for the bindings) or
/// a refresh failed. Each names the file, the setting or the URL.
#[derive(Debug)]
#[non_exhaustive]
pub enum SourceError {
    /// puppetdb.conf gives no `server_urls`.
    Conf(conf::ConfError),
    /// A TLS file Puppet gave no setting for, and `puppet_kicker.yaml` does not set.
    MissingSetting { key: &'static str, puppet_setting: &'static str },
    /// The TLS files do not make a client configuration (at start, or changed since).
    Tls(tls::TlsError),
    /// No URL answered a query.
    Query(client::QueryError),
    /// `url` gave an answer of the wrong shape.
    Malformed { url: String, error: decode::AnswerError },
}

impl SourceError {
    /// Whether an operator's setting or file is at fault (not PuppetDB's answer).
    pub fn is_configuration(&self) -> bool {
        matches!(self, SourceError::Conf(_) | SourceError::MissingSetting { .. } | SourceError::Tls(_))
    }
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceError::Conf(e) => e.fmt(f),
            SourceError::MissingSetting { key, puppet_setting } => {
                write!(f, "source: puppetdb needs {key}: Puppet gave no {puppet_setting} setting, so set {key}")
            }
            SourceError::Tls(e) => write!(f, "source: puppetdb: {e}"),
            SourceError::Query(e) => e.fmt(f),
            SourceError::Malformed { url, error } => write!(f, "PuppetDB {url} gave a malformed answer: {error}"),
        }
    }
}

impl std::error::Error for SourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SourceError::Conf(e) => Some(e),
            SourceError::Tls(e) => Some(e),
            SourceError::Query(e) => Some(e),
            SourceError::Malformed { error, .. } => Some(error),
            SourceError::MissingSetting { .. } => None,
        }
    }
}

/// A configuration error for the bindings when a setting or file is at fault, else
/// a refresh that failed.
impl From<SourceError> for Error {
    fn from(e: SourceError) -> Error {
        if e.is_configuration() {
            Error::SourceUnusable(Box::new(e))
        } else {
            Error::SourceFailed(Box::new(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;

    fn settings(ca: Option<&str>) -> PuppetdbSettings {
        let dir = std::env::temp_dir().join(format!("pk-pdb-open-{}", std::process::id()));
        PuppetdbSettings {
            config_file: dir.join("puppetdb.conf"),
            server_urls: Some(vec!["https://pdb:8081".into()]),
            cert: Some(dir.join("cert.pem")),
            key: Some(dir.join("key.pem")),
            ca: ca.map(|name| dir.join(name)),
            crl: None,
            timeout: 1,
            page_size: 1,
            requests_in_flight: 1,
            max_page_bytes: 1,
            overlap: 0,
            full_refresh: 0,
        }
    }

    #[test]
    fn unusable_settings_are_typed_configuration_errors_naming_the_setting() {
        let Err(err) = PuppetdbSource::open(&settings(None)) else { panic!("opened without a CA") };
        assert_eq!(err.kind(), Kind::Config);
        assert_eq!(
            err.to_string(),
            "source: puppetdb needs puppetdb.ca: Puppet gave no localcacert setting, so set puppetdb.ca"
        );
        let Error::SourceUnusable(e) = &err else { panic!("{err:?}") };
        assert!(matches!(
            e.downcast_ref::<SourceError>(),
            Some(SourceError::MissingSetting { key: "puppetdb.ca", puppet_setting: "localcacert" })
        ));

        let Err(err) = PuppetdbSource::open(&settings(Some("missing-ca.pem"))) else { panic!("opened without a CA") };
        assert_eq!(err.kind(), Kind::Config);
        let message = err.to_string();
        assert!(
            message.starts_with("source: puppetdb: puppetdb.ca: cannot read ") && message.contains("missing-ca.pem")
        );
        let Error::SourceUnusable(e) = &err else { panic!("{err:?}") };
        let Some(SourceError::Tls(tls::TlsError::Read { setting, path, .. })) = e.downcast_ref() else {
            panic!("{err:?}")
        };
        assert!(path.ends_with("missing-ca.pem") && setting == "puppetdb.ca");
        assert!(std::error::Error::source(&err).is_some_and(|s| s.is::<tls::TlsError>()));
    }

    #[test]
    fn a_failed_refresh_is_an_io_error_naming_the_url() {
        let failure = client::QueryError {
            failures: vec![("https://pdb:8081".into(), client::RequestError::TooLarge { limit: 10 })],
        };
        let err = Error::from(SourceError::Query(failure));
        assert_eq!(err.kind(), Kind::Io);
        assert_eq!(
            err.to_string(),
            "PuppetDB did not answer: https://pdb:8081: an answer larger than puppetdb.max_page_bytes (10 bytes); lower puppetdb.page_size or raise it"
        );
        let malformed = malformed("https://pdb:8081", decode::AnswerError::NotAskedFor { certname: "x".into() });
        let err = Error::from(malformed);
        assert_eq!(err.kind(), Kind::Io);
        assert_eq!(
            err.to_string(),
            "PuppetDB https://pdb:8081 gave a malformed answer: an entry for \"x\", which was not asked for"
        );
    }
}
