//! `source: mcollective`: the facts every mcollectived reports to `rpcutil#inventory`,
//! as the original puppet-kicker read them, but on the refresh thread instead of
//! during a compile.
//!
//! A refresh asks, in parallel, the collective named after each environment of the
//! current index (the main collective when no such collective is configured) plus the
//! main collective; with no index yet, every configured collective. In each it runs
//! a discovery, then `rpcutil#inventory` until every discovered server has answered
//! or `mcollective.timeout` has passed. A server is its identity (the certname), its
//! facts as its daemon has them (mcollective 2.x sends every leaf as a String), and,
//! beside the facts, its classes, agents and collectives
//! (`mcollective::classes`, ...).
//!
//! A server of the previous index that does not answer is kept for
//! `mcollective.grace`, counted from its last answer ([`crate::facts::Node::answered_at`], kept
//! in the snapshot), then dropped. A refresh that hears from no server at all
//! (broker down, login refused, wrong psk) fails: the service keeps serving the last
//! index and retries with backoff.
//!
//! - [`refresh`]: a refresh: the collectives asked, the replies chosen, the grace
//!   period of silent servers;
//! - [`observation`]: the replies' observations, decoded on up to two threads, and
//!   the memo that gives a server whose reply body is unchanged without decoding it;
//! - [`conversion`]: one inventory reply into an observation, its Marshal values
//!   into the store (and JSON); `inventory` reads a body in the one pass that
//!   checks it.

mod conversion;
mod inventory;
mod observation;
mod refresh;

pub use conversion::{
    observation, observation_from_body, observation_two_passes, to_json, BodyError, InnerBody, InventoryError,
};
pub use observation::{observe_replies, observe_since, Observed, ReplyMemo, DECODE_THREADS};
// What `inventory`, the one-pass reader, shares with the two passes.
use conversion::{convert, finish, sorted, valid_identity, Lists, MAX_DEPTH};

use super::{ChangeSignal, IncrementalBase, Source, SourceRead};
use crate::error::{Error, Result};
use crate::index::Index;
use crate::mcollective::{self as mco, Client};
use crate::puppet_settings::PuppetSettings;
use crate::unpoisoned::lock;
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
use std::time::Duration;

pub const AGENT: &str = "rpcutil";
pub const ACTION: &str = "inventory";
/// Keys of [`crate::facts::Node::extra`] this source fills: Puppet cannot have a fact
/// whose name holds `::`, so they never hide or replace a fact.
pub const CLASSES: &str = "mcollective::classes";
pub const AGENTS: &str = "mcollective::agents";
pub const COLLECTIVES: &str = "mcollective::collectives";

/// `mcollective.*`: which client.cfg to read, the values that override it, and the
/// source's own settings.
#[derive(Clone, PartialEq)]
pub struct McollectiveSettings {
    /// Overrides of client.cfg values; `config_path` is `mcollective.client_config`
    /// (`None`: the first of `/etc/mcollective/client.cfg`, `/etc/puppetlabs/mcollective/client.cfg`).
    pub overrides: mco::Overrides,
    /// Broker login for every host of the pool.
    pub user: Option<String>,
    pub password: Option<String>,
    /// Seconds to wait for inventory replies once discovery has answered.
    pub timeout: u64,
    /// Seconds a server that stopped answering stays in the index.
    pub grace: u64,
}

crate::redact::debug_showing!(McollectiveSettings: overrides, user, timeout, grace);

impl McollectiveSettings {
    /// Nothing overridden: client.cfg's values.
    pub fn unset(_puppet: &PuppetSettings) -> McollectiveSettings {
        McollectiveSettings { overrides: mco::Overrides::default(), user: None, password: None, timeout: 0, grace: 0 }
    }

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
}

pub struct McollectiveSource {
    client: Client,
    /// Wait for inventory replies after discovery.
    timeout: Duration,
    /// Seconds a silent server is kept.
    grace: i64,
    /// What the last refresh leaves the next ([`Source::carry`]): the tables of the
    /// index built from it, and each server's last body and observation (a
    /// [`ReplyMemo`]) in that index's store.
    carried: Mutex<Option<IncrementalBase>>,
}

impl McollectiveSource {
    /// Reads the operator's client.cfg (with the overrides of `puppet_kicker.yaml`).
    /// An unusable one (missing, no broker, a security provider other than psk, no
    /// psk) is a configuration error naming the file and the key.
    pub fn open(settings: &McollectiveSettings) -> Result<McollectiveSource> {
        let config = settings.client_config().map_err(|source| {
            let no_default_file = settings.overrides.config_path.is_none()
                && !mco::config::DEFAULT_PATHS.iter().any(|p| std::path::Path::new(p).is_file());
            Error::SourceUnusable(Box::new(SourceError::ClientConfig { source, no_default_file }))
        })?;
        Ok(McollectiveSource::with_client(Client::new(config), settings))
    }

    pub fn with_client(client: Client, settings: &McollectiveSettings) -> McollectiveSource {
        McollectiveSource {
            carried: Mutex::new(None),
            client,
            timeout: Duration::from_secs(settings.timeout.max(1)),
            grace: i64::try_from(settings.grace).unwrap_or(i64::MAX),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl Source for McollectiveSource {
    /// For messages: the file, the brokers and the collectives.
    fn describe(&self) -> String {
        let config = self.client.config();
        let file = config.source.as_ref().map_or("no client.cfg".to_string(), |f| f.display().to_string());
        let brokers: Vec<String> = config.pool.iter().map(|b| b.address()).collect();
        format!(
            "the mcollective source ({file}; {} {}; collectives {})",
            config.connector.name(),
            brokers.join(", "),
            config.collectives.join(", ")
        )
    }

    /// Collectives are asked in parallel, each with a discovery then an inventory,
    /// and each of those may try every broker of the pool for `connect_timeout`,
    /// then collect, then say goodbye (at most 1 s).
    fn worst_case(&self) -> Duration {
        let config = self.client.config();
        let pool = u32::try_from(config.pool.len()).unwrap_or(u32::MAX);
        let call = config.connect_timeout.saturating_mul(pool).saturating_add(Duration::from_secs(1));
        call.saturating_mul(2).saturating_add(config.discovery_timeout).saturating_add(self.timeout)
    }

    /// Discovery and inventory in every target collective, then the grace period
    /// (see [`refresh`]).
    fn refresh(&self, previous: Option<&Index>, started: i64, _progress: &AtomicUsize) -> Result<SourceRead> {
        self.ask_and_observe(previous, started)
    }

    fn carry(&self, base: IncrementalBase) {
        *lock(&self.carried) = Some(base);
    }

    /// Every reply's msgtime moves: a server counts as changed unless its reply body
    /// is the one the last refresh read.
    fn change_signal(&self, read: &SourceRead) -> ChangeSignal {
        ChangeSignal::Reused(read.reused)
    }
}

/// Why `source: mcollective` cannot start. A configuration error for the bindings
/// ([`crate::error::Kind::Config`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum SourceError {
    /// The client configuration (client.cfg with the overrides) is unusable;
    /// `no_default_file` when none was named and none is at the default paths.
    ClientConfig { source: mco::Error, no_default_file: bool },
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::ClientConfig { source, no_default_file } => {
                write!(f, "source: mcollective: {source}")?;
                if *no_default_file {
                    write!(
                        f,
                        " (no client.cfg found at {}; set mcollective.client_config)",
                        mco::config::DEFAULT_PATHS.join(" or ")
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for SourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SourceError::ClientConfig { source, .. } => Some(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults of the `mcollective.*` keys.
    fn defaults() -> McollectiveSettings {
        crate::config::Config::defaults(&crate::PuppetSettings::default()).sources.mcollective
    }
    use crate::mcollective::config::Overrides;

    #[test]
    fn an_unusable_client_config_is_a_config_error_carrying_the_mcollective_error() {
        use std::error::Error as _;
        let overrides = Overrides { no_config_file: true, ..Overrides::default() };
        let settings = McollectiveSettings { overrides, ..defaults() };
        let Err(err) = McollectiveSource::open(&settings) else { panic!("opened without a broker") };
        assert_eq!(err.kind(), crate::error::Kind::Config, "Ruby's PuppetKicker::ConfigError, as before");
        let Error::SourceUnusable(unusable) = &err else { panic!("not a source error: {err:?}") };
        assert!(
            matches!(
                unusable.downcast_ref::<SourceError>(),
                Some(SourceError::ClientConfig { source: mco::Error::Config { .. }, .. })
            ),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("source: mcollective: mcollective config"), "{err}");
        let cause = err.source().and_then(|s| s.downcast_ref::<mco::Error>()).expect("the mcollective error");
        assert!(matches!(cause, mco::Error::Config { .. }), "{cause:?}");
    }
}
