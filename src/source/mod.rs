//! Where facts come from. A source is read on the refresh thread, never during a
//! compile, and reports unreadable entries as warnings rather than failing whole.

pub mod mcollective;
pub mod puppet_cache;
pub mod puppetdb;

use crate::facts::{decide_environment, Facts, Node};
use crate::index::{Index, Staged, NEVER_ANSWERED};
use crate::store::{Builder, KeyHint, Store, StrId, Tables, ValueId, View, EMPTY_OBJECT};
use std::collections::{BTreeMap, HashMap};

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
        self.into_index_and_tables(previous, seen, role_fact, built_at).0
    }

    /// [`SourceRead::into_index`], and the tables of the builder that made its store, for
    /// the next refresh to go on from (see [`puppet_cache::load_since`]).
    pub fn into_index_and_tables(
        self,
        previous: Option<&Index>,
        seen: &BTreeMap<String, String>,
        role_fact: &str,
        built_at: i64,
    ) -> (Index, Tables) {
        let SourceRead { mut builder, observations, kept, changes, .. } = self;
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
            return (Index::from_previous(previous, builder, &replaced, staged, built_at), tables);
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
        (Index::from_staged(builder, staged, role_fact, built_at), tables)
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
