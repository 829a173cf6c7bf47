//! Where facts come from. A source is read on the refresh thread, never during a
//! compile, and reports unreadable entries as warnings rather than failing whole.
//!
//! Each source is a module implementing [`Source`]; `sources!` lists them once,
//! which gives [`SourceKind`] (what `source:` names), [`SourceSettings`] (every
//! source's section of `puppet_kicker.yaml`) and [`open`]. What a source reads
//! becomes the next index through [`SourceRead`], the same for all of them.
//!
//! A new source: its module here (settings with `unset`, a type with `open` and a
//! [`Source`] impl), its line in `sources!`, its keys in `config/keys.rs`.

pub mod mcollective;
pub mod puppet_cache;
pub mod puppetdb;

use crate::error::Result;
use crate::facts::{decide_environment, Facts, Node};
use crate::index::{Index, Staged, NEVER_ANSWERED};
use crate::puppet_settings::PuppetSettings;
use crate::store::{Builder, KeyHint, Store, StrId, Tables, ValueId, View, EMPTY_OBJECT};
use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

/// What the index service asks of a fact source: one extension point, one trait.
/// The service opens the configured source once ([`open`]) and holds it as a
/// `Box<dyn Source>`; refreshes call it from one refresh thread at a time (a thread
/// declared hung may still be finishing one).
pub trait Source: Send + Sync {
    /// The source and where it reads, for messages: `the puppet_cache source (/var/...)`.
    fn describe(&self) -> String;

    /// The longest a refresh may take, every deadline added up: the service declares
    /// a refresh running far beyond it hung, and the masterless helper lives for it.
    fn worst_case(&self) -> Duration;

    /// Reads the source: from `previous` when the base [`Source::carry`] kept last is
    /// that index's (only what changed is read again), else in full. `started` is the
    /// refresh's Unix second; `progress` counts the servers read so far, for a
    /// progress line. Fails, naming what failed, only when nothing usable was read.
    fn refresh(&self, previous: Option<&Index>, started: i64, progress: &AtomicUsize) -> Result<SourceRead>;

    /// Keeps `base` for the next refresh: the service built index `base.generation`
    /// from this source's last read and serves it. A read whose index was not kept
    /// (failed, or overtaken) is never carried: the next refresh reads in full.
    fn carry(&self, base: IncrementalBase);

    /// What the refresh record counts as a changed server when `read` does not list
    /// them ([`SourceRead::changes`]): by default a server whose facts' timestamp moved.
    fn change_signal(&self, read: &SourceRead) -> ChangeSignal {
        let _ = read;
        ChangeSignal::Timestamps
    }
}

/// The list of sources, each once: its [`SourceKind`] variant (documented), the name
/// `source:` takes, its field of [`SourceSettings`] and that field's type (with
/// `unset(&PuppetSettings)`: what the keys' defaults are applied to), and the
/// function that opens it from those settings.
macro_rules! sources {
    ($(
        $(#[doc = $doc:literal])*
        $kind:ident = $name:literal, settings $field:ident: $settings:ty, open $open:path;
    )*) => {
        /// Which source `source:` names.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum SourceKind {
            $( $(#[doc = $doc])* $kind, )*
        }

        impl SourceKind {
            /// Every source, in the order listed (the first is the default).
            pub const ALL: &'static [SourceKind] = &[$(SourceKind::$kind),*];

            /// The name `source:` takes, and the refresh record keeps.
            pub fn name(self) -> &'static str {
                match self {
                    $(SourceKind::$kind => $name,)*
                }
            }

            /// The source named `name`.
            pub fn named(name: &str) -> Option<SourceKind> {
                SourceKind::ALL.iter().copied().find(|kind| kind.name() == name)
            }
        }

        /// Every source's section of `puppet_kicker.yaml`.
        #[derive(Clone, Debug, PartialEq)]
        pub struct SourceSettings {
            $( pub $field: $settings, )*
        }

        impl SourceSettings {
            /// What the keys' defaults are applied to: what each source takes from
            /// Puppet's layout, and zeros.
            pub fn unset(puppet: &PuppetSettings) -> SourceSettings {
                SourceSettings { $( $field: <$settings>::unset(puppet), )* }
            }
        }

        /// Opens the source `kind` with its settings: a configuration error, naming
        /// the setting or the file, when they are unusable.
        pub fn open(kind: SourceKind, settings: &SourceSettings) -> Result<Box<dyn Source>> {
            Ok(match kind {
                $( SourceKind::$kind => Box::new($open(&settings.$field)?), )*
            })
        }
    };
}

sources! {
    /// The master's own fact cache, one file per node.
    PuppetCache = "puppet_cache", settings puppet_cache: puppet_cache::PuppetCacheSettings,
        open puppet_cache::PuppetCacheSource::open;
    /// `rpcutil#inventory` of the mcollective daemons, through the operator's client.cfg.
    Mcollective = "mcollective", settings mcollective: mcollective::McollectiveSettings,
        open mcollective::McollectiveSource::open;
    /// PuppetDB's `inventory`, through the master's puppetdb.conf and certificate.
    Puppetdb = "puppetdb", settings puppetdb: puppetdb::PuppetdbSettings,
        open puppetdb::PuppetdbSource::open;
}

/// What a source remembers of one read for the next, opaque to the service: it
/// travels with the read ([`SourceRead::memo`]) and comes back in the
/// [`IncrementalBase`] of the index built from it, so a read never goes on from
/// another read's memo.
pub struct Memo(Box<dyn Any + Send>);

impl Memo {
    pub fn new<T: Any + Send>(memo: T) -> Memo {
        Memo(Box::new(memo))
    }
}

/// What a refresh leaves the next one of its source, once index `generation` was
/// built from its read and is served: the tables of the builder that made that
/// index's store, to resume it, and the source's [`Memo`] of the read.
pub struct IncrementalBase {
    pub generation: u64,
    pub tables: Tables,
    memo: Option<Memo>,
}

impl IncrementalBase {
    /// Whether a read can go on from `index` with this base: it was built from the
    /// read that left it, and its store is the one the tables were taken from.
    pub fn goes_on_from(&self, index: &Index) -> bool {
        self.generation == index.generation() && self.tables.fit(index.store())
    }

    /// The memo the read left, if it is a `T`.
    pub fn take_memo<T: Any>(&mut self) -> Option<T> {
        self.memo.take().and_then(|memo| memo.0.downcast().ok()).map(|memo| *memo)
    }
}

/// What tells a changed server between two indexes, cheaply, per source.
pub enum ChangeSignal {
    /// An incremental read: the certnames read again (the others are the same).
    Certnames(Vec<String>),
    /// Servers given as the previous refresh read them (mcollective: the same signed
    /// reply body); every other server present in both counts as changed.
    Reused(usize),
    /// A full read: a server in both changed when its facts' timestamp moved.
    Timestamps,
}

// The store is built for documents as deep as the YAML reader accepts (the store
// cannot ask the reader, which writes into it).
const _: () = assert!(crate::yaml::MAX_DEPTH == crate::store::MAX_DOCUMENT_DEPTH);

/// One server as a source saw it, its facts decoded into the [`SourceRead`]'s store.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub certname: String,
    /// An object value of [`SourceRead::builder`].
    pub facts: ValueId,
    /// Unix seconds when the facts were collected.
    pub timestamp: i64,
    /// Reported beside the facts (see [`crate::facts::Node::extra`]): an object value.
    pub extra: ValueId,
    /// When a live source heard from the server (see [`crate::facts::Node::answered_at`]).
    pub answered_at: Option<i64>,
    /// The environment the source suggests when neither the facts nor the master
    /// name one (mcollective: the one collective besides the main one).
    pub environment_hint: Option<String>,
}

impl Observation {
    pub fn new(certname: String, facts: ValueId, timestamp: i64) -> Observation {
        Observation { certname, facts, timestamp, extra: EMPTY_OBJECT, answered_at: None, environment_hint: None }
    }

    /// Its environment by [`crate::facts::Node::new`]'s rule, with the source's hint
    /// after where the master last saw it.
    pub fn environment<'s>(&'s self, store: &'s Store, last_seen_env: Option<&'s str>) -> &'s str {
        self.environment_hinted(store, last_seen_env, &mut EnvironmentHints::default()).0
    }

    /// [`Self::environment`], for observation after observation of one store; and
    /// whether its facts named it.
    fn environment_hinted<'s>(
        &'s self,
        store: &'s Store,
        last_seen_env: Option<&'s str>,
        hints: &mut EnvironmentHints,
    ) -> (&'s str, bool) {
        let env = last_seen_env.filter(|e| !e.is_empty()).or(self.environment_hint.as_deref());
        environment_of(store, self.facts, env, hints)
    }
}

/// The environment of a server with `facts` by [`decide_environment`], `otherwise`
/// when its facts name none; and whether its facts named it.
fn environment_of<'s>(
    store: &'s Store,
    facts: ValueId,
    otherwise: Option<&'s str>,
    hints: &mut EnvironmentHints,
) -> (&'s str, bool) {
    let facts = store.view(facts).as_object();
    let mut named = false;
    let fact = |name: &str| {
        let object = facts?;
        let found = match name {
            "environment" => object.get_hinted(&mut hints.environment),
            "agent_specified_environment" => object.get_hinted(&mut hints.agent_specified),
            other => object.get(other),
        };
        let found = found.and_then(View::as_str);
        named |= found.is_some_and(|f| !f.is_empty());
        found
    };
    let environment = decide_environment(fact, otherwise);
    (environment, named)
}

/// Where the environment rule's two facts were found last.
struct EnvironmentHints {
    environment: KeyHint<'static>,
    agent_specified: KeyHint<'static>,
}

impl Default for EnvironmentHints {
    fn default() -> EnvironmentHints {
        EnvironmentHints {
            environment: KeyHint::new("environment"),
            agent_specified: KeyHint::new("agent_specified_environment"),
        }
    }
}

/// What a refresh read: the servers, and what it had to skip and why.
#[derive(Default)]
pub struct SourceRead {
    /// The store the observations' facts were decoded into.
    pub builder: Builder,
    pub observations: Vec<Observation>,
    /// Positions of servers of the previous index carried over unchanged: a live
    /// source keeps a server that stopped answering for a grace period.
    pub kept: Vec<u32>,
    pub warnings: Vec<String>,
    /// Servers given as the previous refresh read them, their source unchanged.
    pub reused: usize,
    /// What changed since the index this read goes on from, when it does.
    pub changes: Option<Changes>,
    /// Where the source recorded each server's environment (PuppetDB's), by
    /// certname: stands in for where the master saw servers compile.
    pub environments: Option<BTreeMap<String, String>>,
    /// What the source remembers of this read for the next one.
    pub memo: Option<Memo>,
}

/// What changed since index `since` was built from the read before: every
/// server whose certname is not listed is the one it holds.
#[derive(Debug, Default)]
pub struct Changes {
    /// The generation of that index.
    pub since: u64,
    /// Certnames of the sources read again, added or gone (the old and the new).
    pub certnames: Vec<String>,
}

impl std::fmt::Debug for SourceRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceRead")
            .field("observations", &self.observations.len())
            .field("kept", &self.kept)
            .field("warnings", &self.warnings)
            .field("reused", &self.reused)
            .field("changes", &self.changes)
            .field("environments", &self.environments.as_ref().map(BTreeMap::len))
            .field("memo", &self.memo.is_some())
            .finish()
    }
}

impl SourceRead {
    /// The facts of an observation, as JSON (tests and tools).
    pub fn facts_json(&self, observation: &Observation) -> serde_json::Value {
        self.builder.store().view(observation.facts).to_json()
    }

    /// An observation as a [`Node`], its facts copied out (tests and tools).
    pub fn node(&self, o: &Observation, last_seen_env: Option<&str>) -> Node {
        let store = self.builder.store();
        let copy = |id: ValueId| match store.view(id).to_json() {
            serde_json::Value::Object(map) => map,
            _ => Facts::new(),
        };
        Node {
            certname: o.certname.clone(),
            environment: o.environment(store, last_seen_env).to_string(),
            facts: copy(o.facts),
            timestamp: o.timestamp,
            extra: copy(o.extra),
            answered_at: o.answered_at,
        }
    }

    /// The new index: every observation, then the kept servers of `previous` copied
    /// over. `seen` is where the master last saw each certname compile. A read
    /// that goes on from `previous` ([`SourceRead::changes`]) examines only the
    /// servers that changed: the others keep their rows, order and role maps.
    pub fn into_index(
        self,
        previous: Option<&Index>,
        seen: &BTreeMap<String, String>,
        role_fact: &str,
        built_at: i64,
    ) -> Index {
        self.into_index_and_base(previous, seen, role_fact, built_at).0
    }

    /// [`SourceRead::into_index_and_base`] for a caller that keeps the memo of a read
    /// itself ([`puppet_cache::load_since`] gives it beside the read): the index, and
    /// the tables of the builder that made its store.
    pub fn into_index_and_tables(
        self,
        previous: Option<&Index>,
        seen: &BTreeMap<String, String>,
        role_fact: &str,
        built_at: i64,
    ) -> (Index, Tables) {
        let (index, base) = self.into_index_and_base(previous, seen, role_fact, built_at);
        (index, base.tables)
    }

    /// [`SourceRead::into_index`], and what the next refresh of the source goes on
    /// from: the tables of the builder that made its store, and the read's memo
    /// (hand it to [`Source::carry`] once the index is served).
    pub fn into_index_and_base(
        self,
        previous: Option<&Index>,
        seen: &BTreeMap<String, String>,
        role_fact: &str,
        built_at: i64,
    ) -> (Index, IncrementalBase) {
        let SourceRead { mut builder, observations, kept, changes, memo, .. } = self;
        let next = |index: &Index, tables: Tables| IncrementalBase { generation: index.generation(), tables, memo };
        let base = previous.zip(changes).filter(|(previous, changes)| {
            // Hints are not kept in the index, so an environment from one is decided again.
            changes.since == previous.generation()
                && previous.role_fact() == role_fact
                && previous.unsettled_environments().is_some()
                && kept.is_empty()
                && observations.iter().all(|o| o.environment_hint.is_none())
        });
        if let Some((previous, changes)) = base {
            let (replaced, staged) = changed_servers(previous, &mut builder, &observations, &changes, seen);
            let tables = builder.take_tables();
            let index = Index::from_previous(previous, builder, &replaced, staged, built_at);
            let next = next(&index, tables);
            return (index, next);
        }
        let mut staged = Vec::with_capacity(observations.len() + kept.len());
        let mut stager = Stager::default();
        for o in &observations {
            staged.push(stager.stage(&mut builder, o, seen));
        }
        if let Some(previous) = previous.filter(|_| !kept.is_empty()) {
            let mut memo = HashMap::new();
            for position in kept {
                let server = previous.server(position);
                let row = previous.rows();
                staged.push(Staged {
                    certname: builder.string(server.certname()),
                    environment: builder.string(server.environment()),
                    facts: builder.import(previous.store(), row.facts[position as usize], &mut memo),
                    extra: builder.import(previous.store(), row.extra[position as usize], &mut memo),
                    timestamp: server.timestamp(),
                    answered_at: row.answered_at[position as usize],
                    environment_from_facts: false,
                });
            }
        }
        let tables = builder.take_tables();
        let index = Index::from_staged(builder, staged, role_fact, built_at);
        let next = next(&index, tables);
        (index, next)
    }
}

/// Observations as rows: each one's environment decided, its names interned.
#[derive(Default)]
struct Stager {
    hints: EnvironmentHints,
    /// The environment copied out: the store grows while interning.
    environment: String,
}

impl Stager {
    fn stage(&mut self, builder: &mut Builder, o: &Observation, seen: &BTreeMap<String, String>) -> Staged {
        let last_seen = seen.get(&o.certname).map(String::as_str);
        let (environment, environment_from_facts) = o.environment_hinted(builder.store(), last_seen, &mut self.hints);
        self.environment.clear();
        self.environment.push_str(environment);
        Staged {
            certname: builder.string(&o.certname),
            environment: builder.string(&self.environment),
            facts: o.facts,
            extra: o.extra,
            timestamp: o.timestamp,
            answered_at: o.answered_at.unwrap_or(NEVER_ANSWERED),
            environment_from_facts,
        }
    }
}

/// The certnames whose servers `previous` cannot keep as they are (their sources
/// changed, or `seen` moved a server its facts give no environment), and every
/// observation of those.
fn changed_servers(
    previous: &Index,
    builder: &mut Builder,
    observations: &[Observation],
    changes: &Changes,
    seen: &BTreeMap<String, String>,
) -> (hashbrown::HashSet<StrId>, Vec<Staged>) {
    let mut names: hashbrown::HashSet<&str> = changes.certnames.iter().map(String::as_str).collect();
    let mut hints = EnvironmentHints::default();
    for &p in previous.unsettled_environments().unwrap_or(&[]) {
        let server = previous.server(p);
        let last_seen = seen.get(server.certname()).map(String::as_str).filter(|e| !e.is_empty());
        let facts = previous.rows().facts[p as usize];
        if environment_of(previous.store(), facts, last_seen, &mut hints).0 != server.environment() {
            names.insert(server.certname());
        }
    }
    let mut stager = Stager::default();
    let replaced = names.iter().map(|name| builder.string(name)).collect();
    let staged = observations
        .iter()
        .filter(|o| names.contains(o.certname.as_str()))
        .map(|o| stager.stage(builder, o, seen))
        .collect();
    (replaced, staged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_has_one_name_and_opens_by_it() {
        let names: Vec<&str> = SourceKind::ALL.iter().map(|kind| kind.name()).collect();
        assert_eq!(names, ["puppet_cache", "mcollective", "puppetdb"]);
        for kind in SourceKind::ALL {
            assert_eq!(SourceKind::named(kind.name()), Some(*kind));
        }
        assert_eq!(SourceKind::named("etcd"), None);
        let puppet = PuppetSettings { vardir: "/nonexistent/var".into(), ..PuppetSettings::default() };
        let source = open(SourceKind::PuppetCache, &SourceSettings::unset(&puppet)).unwrap();
        assert_eq!(
            source.describe(),
            "the puppet_cache source (/nonexistent/var/server_data/facts, /nonexistent/var/yaml/facts)"
        );
        assert_eq!(source.worst_case(), Duration::from_secs(300));
        // PuppetDB without Puppet's certificate settings: a configuration error.
        let mut settings = SourceSettings::unset(&puppet);
        settings.puppetdb.server_urls = Some(vec!["https://pdb:8081".into()]);
        let Err(e) = open(SourceKind::Puppetdb, &settings) else { panic!("opened") };
        assert_eq!(e.kind(), crate::error::Kind::Config, "{e}");
        assert!(e.to_string().starts_with("source: puppetdb needs puppetdb.ca"), "{e}");
    }

    #[test]
    fn a_memo_comes_back_only_as_its_own_type() {
        let mut base =
            IncrementalBase { generation: 1, tables: Builder::new().take_tables(), memo: Some(Memo::new(7u32)) };
        assert_eq!(base.take_memo::<String>(), None, "another source's memo is not taken for this one's");
        let mut base = IncrementalBase { memo: Some(Memo::new(7u32)), ..base };
        assert_eq!(base.take_memo::<u32>(), Some(7));
        assert_eq!(base.take_memo::<u32>(), None, "taken once");
    }
}
