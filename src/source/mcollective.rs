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
//! `mcollective.grace`, counted from its last answer ([`Node::answered_at`], kept
//! in the snapshot), then dropped. A refresh that hears from no server at all
//! (broker down, login refused, wrong psk) fails: the service keeps serving the last
//! index and retries with backoff.

mod inventory;

use super::{Observation, SourceRead};
use crate::error::{Error, Result};
use crate::index::Index;
use crate::mcollective::message::Reply;
use crate::mcollective::{self as mco, Client, Filter, RpcReply};
use crate::source::puppet_cache::GARBAGE_FACTOR;
use crate::store::{Builder, Tables, ValueId, FALSE, NULL, TRUE};
use crate::time::now;
use crate::unpoisoned::lock;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

pub const AGENT: &str = "rpcutil";
pub const ACTION: &str = "inventory";
/// Keys of [`crate::facts::Node::extra`] this source fills: Puppet cannot have a fact
/// whose name holds `::`, so they never hide or replace a fact.
pub const CLASSES: &str = "mcollective::classes";
pub const AGENTS: &str = "mcollective::agents";
pub const COLLECTIVES: &str = "mcollective::collectives";

/// Marshal nesting the conversion follows; the client's decoder already bounds it.
const MAX_DEPTH: usize = 64;
/// Threads decoding inventories: two halves of the servers, merged in order (the
/// masters have few cores, shared with compiles).
pub const DECODE_THREADS: usize = 2;
/// Below this many servers one thread decodes them all: a thread costs more.
const MIN_SERVERS_PER_THREAD: usize = 256;
/// Servers per share of the decoding on several threads.
const SHARE_SERVERS: usize = 256;

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
    /// What the last refresh leaves the next, once the service has built its index
    /// ([`McollectiveSource::carry`]); and the memo of the refresh in flight.
    carried: Mutex<Option<IncrementalBase>>,
    pending: Mutex<Option<ReplyMemo>>,
}

/// The builder's tables for the store of index `generation`, and each server's
/// last body and observation in that store.
struct IncrementalBase {
    generation: u64,
    tables: Tables,
    memo: ReplyMemo,
}

/// What one collective answered.
struct Answer {
    discovered: Vec<String>,
    replies: Vec<Reply>,
    /// Senders whose inventory body another sender sent too (see [`mco::RpcOutcome::ambiguous`]).
    ambiguous: Vec<String>,
    /// Our clock when the replies were in.
    at: i64,
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
            pending: Mutex::new(None),
            client,
            timeout: Duration::from_secs(settings.timeout.max(1)),
            grace: i64::try_from(settings.grace).unwrap_or(i64::MAX),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Keeps the tables of the index the last refresh built (generation
    /// `generation`), with that refresh's memo, for the next refresh.
    pub fn carry(&self, generation: u64, tables: Tables) {
        if let Some(memo) = lock(&self.pending).take() {
            *lock(&self.carried) = Some(IncrementalBase { generation, tables, memo });
        }
    }

    /// The longest a refresh can take: collectives are asked in parallel, each with
    /// a discovery then an inventory, and each of those may try every broker of the
    /// pool for `connect_timeout`, then collect, then say goodbye (at most 1 s).
    pub fn worst_case(&self) -> Duration {
        let config = self.client.config();
        let pool = u32::try_from(config.pool.len()).unwrap_or(u32::MAX);
        let call = config.connect_timeout.saturating_mul(pool).saturating_add(Duration::from_secs(1));
        call.saturating_mul(2).saturating_add(config.discovery_timeout).saturating_add(self.timeout)
    }

    /// For messages: the file, the brokers and the collectives.
    pub fn describe(&self) -> String {
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

    /// The collectives a refresh asks, sorted: see the module documentation.
    pub fn targets(&self, previous: Option<&Index>) -> Vec<String> {
        let config = self.client.config();
        match previous.filter(|index| !index.is_empty()) {
            None => {
                let mut all = config.collectives.clone();
                all.sort();
                all.dedup();
                all
            }
            Some(index) => {
                let mut targets = BTreeSet::from([config.main_collective.clone()]);
                let environments: BTreeSet<&str> = index.servers().map(|s| s.environment()).collect();
                for environment in environments {
                    if config.collectives.iter().any(|c| c == environment) {
                        targets.insert(environment.to_string());
                    }
                }
                targets.into_iter().collect()
            }
        }
    }

    /// One refresh: discovery and inventory in every target collective, then the
    /// grace period for servers of `previous` that did not answer.
    pub fn refresh(&self, previous: Option<&Index>, started: i64) -> Result<SourceRead> {
        let targets = self.targets(previous);
        let before = self.client.stats();
        let answers: Vec<(String, mco::Result<Answer>)> = std::thread::scope(|scope| {
            let running: Vec<_> = targets.iter().map(|c| (c, scope.spawn(move || self.ask(c)))).collect::<Vec<_>>();
            running
                .into_iter()
                .map(|(c, handle)| {
                    let answer = handle.join().unwrap_or_else(|_| {
                        Err(mco::Error::InvalidInput(format!("internal error: asking collective {c} panicked")))
                    });
                    (c.clone(), answer)
                })
                .collect()
        });
        let after = self.client.stats();
        let forged = after.bad_hash.saturating_sub(before.bad_hash);
        let misdated = after.bad_msgtime.saturating_sub(before.bad_msgtime);
        let over_limit = after.over_limit.saturating_sub(before.over_limit);

        let mut read = SourceRead::default();
        if forged > 0 {
            read.warnings.push(format!(
                "mcollective: ignored {forged} {} with a bad psk signature (a daemon with another psk, or forged)",
                replies(forged)
            ));
        }
        if misdated > 0 {
            read.warnings.push(format!(
                "mcollective: ignored {misdated} {} whose msgtime is more than the ttl ({}s) away from the request: replayed, or a daemon's clock is off",
                replies(misdated),
                self.client.config().ttl
            ));
        }
        if over_limit > 0 {
            let limits = self.client.config().reply_limits;
            read.warnings.push(format!(
                "mcollective: dropped {over_limit} {} over the limit of {} servers or {} bytes per request (mcollective.max_servers, mcollective.max_reply_bytes)",
                replies(over_limit),
                limits.max_replies,
                limits.max_bytes
            ));
        }
        let mut failures = Vec::new();
        let mut discovered = BTreeSet::new();
        // identity -> (reply, our time) of each collective that answered, newest first
        // (the first one received among equals): the first well-formed is the inventory.
        let mut candidates: BTreeMap<String, Vec<(Reply, i64)>> = BTreeMap::new();
        for (collective, answer) in answers {
            match answer {
                Err(e) => failures.push((collective, e.to_string())),
                Ok(answer) => {
                    discovered.extend(answer.discovered);
                    if !answer.ambiguous.is_empty() {
                        read.warnings.push(format!(
                            "mcollective: collective {collective}: ignored the inventories of {}: the same signed reply came under more than one sender id, and the psk cannot tell who sent it (a replay on the broker?)",
                            join(&answer.ambiguous)
                        ));
                    }
                    let ambiguous: BTreeSet<&str> = answer.ambiguous.iter().map(String::as_str).collect();
                    for reply in answer.replies.into_iter().filter(|r| !ambiguous.contains(r.senderid.as_str())) {
                        candidates.entry(reply.senderid.clone()).or_default().push((reply, answer.at));
                    }
                }
            }
        }
        if failures.len() == targets.len() {
            return Err(Error::Io(format!("mcollective: {}", summarize(&failures))));
        }
        for (collective, error) in &failures {
            read.warnings.push(format!("mcollective: collective {collective}: {error}"));
        }

        let servers: Vec<Vec<(Reply, i64)>> = candidates
            .into_values()
            .map(|mut replies| {
                replies.sort_by_key(|r| std::cmp::Reverse(r.0.msgtime));
                replies
            })
            .collect();
        let config = self.client.config();
        // Taken: a refresh that fails leaves none, and the next decodes every reply.
        let carried = lock(&self.carried).take();
        let (memo, resumed) = match (carried, previous) {
            (Some(c), Some(index))
                if c.generation == index.generation()
                    && c.tables.fit(index.store())
                    && index.store().values() <= GARBAGE_FACTOR.saturating_mul(c.memo.values_after_full.max(1)) =>
            {
                read.builder = Builder::resume(index.store(), c.tables);
                (c.memo, true)
            }
            (c, _) => {
                (ReplyMemo { hasher: c.map(|c| c.memo.hasher).unwrap_or_default(), ..ReplyMemo::default() }, false)
            }
        };
        let (observed, memo, reused) = observe_since(
            &servers,
            &config.main_collective,
            config.marshal_limits,
            DECODE_THREADS,
            &mut read.builder,
            &memo,
        );
        let mut memo = memo;
        if !resumed {
            // Garbage (values no server uses any more) is bounded by this store's size.
            memo.values_after_full = read.builder.store().values();
        }
        *lock(&self.pending) = Some(memo);
        read.reused = reused;
        self.client.record_inner(observed.accepted, observed.malformed);
        read.observations = observed.observations;
        read.warnings.extend(observed.warnings);
        let answered_owned: Vec<String> = read.observations.iter().map(|o| o.certname.clone()).collect();
        let answered: BTreeSet<&str> = answered_owned.iter().map(String::as_str).collect();
        let silent: Vec<&String> = discovered.iter().filter(|d| !answered.contains(d.as_str())).collect();
        if !silent.is_empty() {
            read.warnings.push(format!(
                "mcollective: discovered but no {AGENT}#{ACTION} answer within {}s from: {}",
                self.timeout.as_secs(),
                join(silent)
            ));
        }
        if read.observations.is_empty() {
            let mut why = format!(
                "no mcollective server answered {AGENT}#{ACTION} in collective{} {} (discovery {}s{})",
                if targets.len() == 1 { "" } else { "s" },
                targets.join(", "),
                self.client.config().discovery_timeout.as_secs_f64(),
                if discovered.is_empty() { ", nobody" } else { "" }
            );
            if forged > 0 {
                why.push_str(&format!("; {forged} replies had a bad psk signature"));
            }
            why.push_str(
                ": check that mcollectived runs, that plugin.psk matches the daemons' and that the collectives exist",
            );
            if !failures.is_empty() {
                why.push_str(&format!("; also {}", summarize(&failures)));
            }
            return Err(Error::Io(why));
        }

        if let Some(previous) = previous {
            self.apply_grace(previous, &answered, started, &mut read);
        }
        Ok(read)
    }

    /// Keeps silent servers of `previous` for the grace period, with one warning when
    /// a server first goes silent and one when it is dropped.
    fn apply_grace(&self, previous: &Index, answered: &BTreeSet<&str>, started: i64, read: &mut SourceRead) {
        let mut newly_silent = Vec::new();
        let mut dropped = Vec::new();
        for server in previous.servers() {
            let Some(last) = server.answered_at() else { continue };
            if answered.contains(server.certname()) {
                continue;
            }
            if started.saturating_sub(last) <= self.grace {
                if last >= previous.built_at() {
                    newly_silent.push(server.certname());
                }
                read.kept.push(server.position());
            } else {
                dropped.push(server.certname());
            }
        }
        if !newly_silent.is_empty() {
            read.warnings.push(format!(
                "mcollective: no answer from {}; kept for the grace period of {}s",
                join(newly_silent),
                self.grace
            ));
        }
        if !dropped.is_empty() {
            read.warnings.push(format!(
                "mcollective: dropped {}: no answer for longer than the grace period of {}s",
                join(dropped),
                self.grace
            ));
        }
    }

    /// Discovery, then inventory of whoever answered, in one collective.
    fn ask(&self, collective: &str) -> mco::Result<Answer> {
        let config = self.client.config();
        let filter = Filter { agent: vec![AGENT.to_string()], ..Filter::default() };
        let discovered = self.client.discover(collective, &filter, config.discovery_timeout, None)?;
        if discovered.is_empty() {
            return Ok(Answer { discovered, replies: Vec::new(), ambiguous: Vec::new(), at: now() });
        }
        let outcome = self.client.rpc_broadcast_raw(
            collective,
            AGENT,
            ACTION,
            &[],
            &filter,
            Some(discovered.len()),
            self.timeout,
        )?;
        Ok(Answer { discovered, replies: outcome.replies, ambiguous: outcome.ambiguous, at: now() })
    }
}

fn replies(n: u64) -> &'static str {
    if n == 1 {
        "reply"
    } else {
        "replies"
    }
}

/// One failure per line of the message; the same error in several collectives once.
fn summarize(failures: &[(String, String)]) -> String {
    let mut by_error: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (collective, error) in failures {
        by_error.entry(error.as_str()).or_default().push(collective.as_str());
    }
    by_error
        .into_iter()
        .map(|(error, collectives)| {
            let plural = if collectives.len() == 1 { "" } else { "s" };
            format!("collective{plural} {}: {error}", collectives.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn join<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    const SHOWN: usize = 20;
    let items: Vec<S> = items.into_iter().collect();
    let mut text = items.iter().take(SHOWN).map(AsRef::as_ref).collect::<Vec<_>>().join(", ");
    if items.len() > SHOWN {
        text.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    text
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

/// Why a server's inventory reply was ignored (a warning that names the server).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InventoryError {
    /// The sender id cannot be a certname.
    BadIdentity { identity: String },
    /// The agent answered with a failure status.
    Status { code: i64, message: String },
    /// `:facts` is there but not a Hash.
    FactsNotAHash,
    /// The reply has no `:facts`.
    NoFacts,
}

impl fmt::Display for InventoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InventoryError::BadIdentity { identity } => write!(f, "identity {identity:?} is not a valid certname"),
            InventoryError::Status { code, message } => write!(f, "status {code} {message}"),
            InventoryError::FactsNotAHash => f.write_str(":facts is not a Hash"),
            InventoryError::NoFacts => f.write_str("no :facts in the reply"),
        }
    }
}

impl std::error::Error for InventoryError {}

/// A server from its inventory reply; `at` is when it answered, on our clock.
pub fn observation(
    reply: &RpcReply,
    at: i64,
    main_collective: &str,
    builder: &mut Builder,
) -> std::result::Result<Observation, InventoryError> {
    let identity = reply.sender.as_str();
    if !valid_identity(identity) {
        return Err(InventoryError::BadIdentity { identity: identity.to_string() });
    }
    if reply.statuscode != 0 {
        return Err(InventoryError::Status { code: reply.statuscode, message: reply.statusmsg.clone() });
    }
    let facts = match reply.data.get_sym("facts") {
        Some(facts @ mco::Value::Hash(_)) => facts,
        Some(_) => return Err(InventoryError::FactsNotAHash),
        None => return Err(InventoryError::NoFacts),
    };
    let list = |name: &str| -> Vec<Cow<'static, str>> {
        sorted(match reply.data.get_sym(name).map(to_json) {
            Some(Value::Array(items)) => {
                items.into_iter().filter_map(|i| i.as_str().map(|s| Cow::Owned(s.to_string()))).collect()
            }
            _ => Vec::new(),
        })
    };
    let lists = Lists { classes: list("classes"), agents: list("agents"), collectives: list("collectives") };
    let own_main = reply.data.get_sym("main_collective").and_then(mco::Value::as_str);
    let facts = add_to_store(facts, builder, 0);
    Ok(finish(identity, reply.msgtime, at, own_main, main_collective, facts, lists, builder))
}

/// What an inventory lists beside the facts, each sorted without repeats (text
/// borrowed from the body where it is UTF-8 already).
struct Lists<'a> {
    classes: Vec<Cow<'a, str>>,
    agents: Vec<Cow<'a, str>>,
    collectives: Vec<Cow<'a, str>>,
}

/// `items` sorted, without repeats: a list as [`Lists`] keeps it.
fn sorted(mut items: Vec<Cow<'_, str>>) -> Vec<Cow<'_, str>> {
    // Equal items are the same text: no order among them to keep.
    items.sort_unstable();
    items.dedup();
    items
}

/// The observation of a reply whose facts are in the store: the lists go after them.
#[allow(clippy::too_many_arguments)]
fn finish(
    identity: &str,
    msgtime: i64,
    at: i64,
    own_main: Option<&str>,
    main_collective: &str,
    facts: ValueId,
    lists: Lists<'_>,
    builder: &mut Builder,
) -> Observation {
    let own_main = own_main.unwrap_or(main_collective);
    let Lists { classes, agents, collectives } = lists;
    let others: Vec<&str> =
        collectives.iter().map(|c| c.as_ref()).filter(|c| *c != own_main && *c != main_collective).collect();
    let environment_hint = match others.as_slice() {
        [only] => Some((*only).to_string()),
        _ => None,
    };
    // `{agents, classes, collectives}` in key order, into the store as
    // `Builder::object` adds a JSON object: each key, then its Array's items.
    let extra_mark = builder.open();
    for (key, items) in [(AGENTS, &agents), (CLASSES, &classes), (COLLECTIVES, &collectives)] {
        let key = builder.string(key);
        builder.push_child(key);
        let mark = builder.open();
        for item in items {
            let id = builder.string_value(item);
            builder.push_child(id);
        }
        let array = builder.close_array(mark);
        builder.push_child(array);
    }
    let extra = builder.close_object(extra_mark);
    Observation {
        certname: identity.to_string(),
        facts,
        // The daemon's clock, but never ahead of ours: a far-future `:msgtime`
        // (unsigned) would keep these facts fresh forever.
        timestamp: if msgtime > 0 { msgtime.min(at) } else { at },
        extra,
        answered_at: Some(at),
        environment_hint,
    }
}

/// Each server's last inventory body (by its verified PSK signature, else a fast
/// hash of its bytes) and what it gave, for [`observe_since`]: an identical body
/// gives the identical observation, so it is not decoded again.
#[derive(Clone, Debug, Default)]
pub struct ReplyMemo {
    /// Seeded per process, kept across refreshes so hashes compare.
    hasher: hashbrown::DefaultHashBuilder,
    servers: HashMap<String, (BodyKey, Observation)>,
    /// Values in the store after the last refresh that decoded every server.
    values_after_full: usize,
}

/// What tells a body from another: its signature, which the client checked anyway
/// (reading 139 MB of bodies again to hash them was most of a refresh with nothing
/// changed), or, for a reply without one, a hash of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyKey {
    Signed(u128),
    Hashed(u64),
}

impl ReplyMemo {
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }
}

/// [`observe_replies`] into a builder resumed on the store of the refresh that left
/// `memo` (its ids still valid there): a server whose chosen reply has the body it
/// had then gets its observation again, dated by the new reply, without decoding.
/// Returns the memo for the next refresh, and how many servers were given again.
pub fn observe_since(
    servers: &[Vec<(Reply, i64)>],
    main_collective: &str,
    limits: mco::marshal::DecodeLimits,
    threads: usize,
    builder: &mut Builder,
    memo: &ReplyMemo,
) -> (Observed, ReplyMemo, usize) {
    use std::hash::BuildHasher;
    let hasher = memo.hasher;
    // Per server: its newest body's hash, and its observation when that body is unchanged.
    let mut again: Vec<(BodyKey, Option<Observation>)> = Vec::with_capacity(servers.len());
    let mut changed: Vec<&[(Reply, i64)]> = Vec::new();
    for replies in servers {
        let Some((reply, at)) = replies.first() else {
            again.push((BodyKey::Hashed(0), None));
            continue;
        };
        let hash = match reply.signature {
            Some(signature) => BodyKey::Signed(signature),
            None => BodyKey::Hashed(hasher.hash_one(&*reply.body)),
        };
        let hit = memo.servers.get(&reply.senderid).filter(|(last, _)| *last == hash).map(|(_, o)| Observation {
            timestamp: if reply.msgtime > 0 { reply.msgtime.min(*at) } else { *at },
            answered_at: Some(*at),
            ..o.clone()
        });
        if hit.is_none() {
            changed.push(replies);
        }
        again.push((hash, hit));
    }
    let reused = again.iter().filter(|(_, o)| o.is_some()).count();
    let decoded = observe_slices(&changed, main_collective, limits, threads, builder);
    let mut decoded_observations = decoded.observations.into_iter().zip(decoded.chosen).peekable();
    let mut next =
        ReplyMemo { hasher, servers: HashMap::with_capacity(servers.len()), values_after_full: memo.values_after_full };
    let (mut observations, mut chosen) = (Vec::with_capacity(servers.len()), Vec::with_capacity(servers.len()));
    for (replies, (hash, hit)) in servers.iter().zip(again) {
        let Some((newest, _)) = replies.first() else { continue };
        let (o, candidate) = match hit {
            Some(o) => (o, 0),
            None => match decoded_observations.next_if(|(o, _)| o.certname == newest.senderid) {
                Some(decoded) => decoded,
                None => continue,
            },
        };
        // Only an observation of the newest reply stands for its body next time.
        if candidate == 0 {
            next.servers.insert(o.certname.clone(), (hash, o.clone()));
        }
        observations.push(o);
        chosen.push(candidate);
    }
    let observed = Observed {
        observations,
        chosen,
        warnings: decoded.warnings,
        accepted: decoded.accepted + reused,
        malformed: decoded.malformed,
    };
    (observed, next, reused)
}

/// What [`observe_replies`] made of the servers' replies.
#[derive(Debug, Default)]
pub struct Observed {
    /// In the order of the servers given.
    pub observations: Vec<Observation>,
    /// For each observation, which of its server's replies it came from (0: the newest).
    pub chosen: Vec<usize>,
    pub warnings: Vec<String>,
    /// Inner bodies read as RPC replies, and those that were not.
    pub accepted: usize,
    pub malformed: usize,
}

/// Each server's observation from its replies (newest first: the first well-formed
/// one counts, as when malformed ones were dropped before choosing), its facts in
/// `builder`. Up to `threads` threads (at most the cores) decode contiguous shares
/// into builders of their own, merged in order by [`Builder::absorb`]: the store is
/// the same, id for id, whatever the number of threads.
pub fn observe_replies(
    servers: &[Vec<(Reply, i64)>],
    main_collective: &str,
    limits: mco::marshal::DecodeLimits,
    threads: usize,
    builder: &mut Builder,
) -> Observed {
    let servers: Vec<&[(Reply, i64)]> = servers.iter().map(Vec::as_slice).collect();
    observe_slices(&servers, main_collective, limits, threads, builder)
}

fn observe_slices(
    servers: &[&[(Reply, i64)]],
    main_collective: &str,
    limits: mco::marshal::DecodeLimits,
    threads: usize,
    builder: &mut Builder,
) -> Observed {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let threads = threads.min(cores).min(servers.len() / MIN_SERVERS_PER_THREAD).max(1);
    if threads == 1 {
        return observe_share(servers, main_collective, limits, builder);
    }
    // Shares handed out in order and merged while the other thread reads
    // (store::pool), as fact files are: the merge is off the critical path.
    let shares: Vec<&[&[(Reply, i64)]]> = servers.chunks(SHARE_SERVERS).collect();
    let read = |i: usize, own: &mut Builder| observe_share(shares[i], main_collective, limits, own);
    let remap = |observed: &mut Observed, remap: &crate::store::Remap| {
        for o in &mut observed.observations {
            o.facts = remap.values[o.facts as usize];
            o.extra = remap.values[o.extra as usize];
        }
    };
    let target = std::mem::take(builder);
    // A panic fails the refresh, as it did on one thread.
    let (target, results) = crate::store::pool::read_in_order(target, shares.len(), threads, read, remap)
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    *builder = target;
    let mut all = Observed::default();
    for observed in results {
        all.chosen.extend(observed.chosen);
        all.observations.extend(observed.observations);
        all.warnings.extend(observed.warnings);
        all.accepted += observed.accepted;
        all.malformed += observed.malformed;
    }
    all
}

fn observe_share(
    servers: &[&[(Reply, i64)]],
    main_collective: &str,
    limits: mco::marshal::DecodeLimits,
    builder: &mut Builder,
) -> Observed {
    let mut out = Observed::default();
    for replies in servers {
        for (candidate, (reply, at)) in replies.iter().enumerate() {
            let body = InnerBody {
                sender: &reply.senderid,
                msgtime: reply.msgtime,
                bytes: &reply.body,
                limits,
                at: *at,
                main_collective,
            };
            let got = observation_from_body(body, builder);
            let got = match got {
                Err(BodyError::Unsupported) => match RpcReply::from_reply(reply.clone(), limits) {
                    Ok(rpc) => observation(&rpc, *at, main_collective, builder).map_err(BodyError::Inventory),
                    Err(e) => Err(BodyError::Malformed(e)),
                },
                other => other,
            };
            match got {
                Ok(o) => {
                    out.observations.push(o);
                    out.chosen.push(candidate);
                }
                Err(BodyError::Malformed(_) | BodyError::Unsupported) => {
                    out.malformed += 1;
                    continue;
                }
                Err(BodyError::Inventory(why)) => {
                    out.warnings.push(format!("mcollective: ignored the inventory of {}: {why}", reply.senderid));
                }
            }
            out.accepted += 1;
            break;
        }
    }
    out
}

/// Why [`observation_from_body`] gave no observation.
#[derive(Debug)]
pub enum BodyError {
    /// The inner body is not an RPC reply: the client counts it as malformed.
    Malformed(mco::Error),
    /// A reply the source refuses, with its reason.
    Inventory(InventoryError),
    /// Outside the borrowed reader's subset: decode it with
    /// [`RpcReply::from_reply`] and [`observation`].
    Unsupported,
}

impl From<mco::Error> for BodyError {
    fn from(e: mco::Error) -> BodyError {
        BodyError::Malformed(e)
    }
}

fn valid_identity(identity: &str) -> bool {
    !identity.is_empty() && identity.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// A reply's inner body, and what reading it needs: who sent it and when (its
/// `:senderid` and `:msgtime`), when it arrived, the limits on it, and the main
/// collective.
#[derive(Clone, Copy, Debug)]
pub struct InnerBody<'a> {
    pub sender: &'a str,
    pub msgtime: i64,
    pub bytes: &'a [u8],
    pub limits: mco::marshal::DecodeLimits,
    /// When the reply arrived.
    pub at: i64,
    pub main_collective: &'a str,
}

/// [`RpcReply::from_reply`] then [`observation`], on the inner body's bytes in place:
/// the same refusals, and the same facts put in the store in the same order (so the
/// same ids), without Marshal values or copies of the strings. One pass checks the
/// body and reads it ([`inventory`]); a body whose status follows its facts takes two.
pub fn observation_from_body(body: InnerBody, builder: &mut Builder) -> std::result::Result<Observation, BodyError> {
    match inventory::read(body, builder) {
        inventory::Read::Done(got) => got,
        inventory::Read::TwoPasses => observation_two_passes(body, builder),
    }
}

/// [`observation_from_body`] in two passes, the whole body checked then read in
/// place: for a body whose status follows its facts, and the reference the one pass
/// is measured against (benches/inventory.rs).
pub fn observation_two_passes(body: InnerBody, builder: &mut Builder) -> std::result::Result<Observation, BodyError> {
    let InnerBody { sender, msgtime, bytes, limits, at, main_collective } = body;
    use mco::marshal_reader::{Doc, Item, Scan};
    let doc = match Doc::scan(bytes, limits) {
        Ok(doc) => doc,
        Err(Scan::Invalid(e)) => return Err(BodyError::Malformed(*e)),
        Err(Scan::Unsupported(_)) => return Err(BodyError::Unsupported),
    };
    let root = doc.root();
    let malformed = |key: &str, why: &str| BodyError::Malformed(mco::Error::Marshal(format!(":{key} {why}")));
    if !matches!(doc.item(root)?.0, Item::Hash(_)) {
        return Err(malformed("(message)", "is not a Hash"));
    }
    let [statuscode, statusmsg, data] = doc.get_syms(root, ["statuscode", "statusmsg", "data"])?;
    let statuscode = match statuscode {
        Some(pos) => match doc.item(pos)?.0 {
            Item::Int(i) => i,
            _ => return Err(malformed("statuscode", "not an Integer")),
        },
        None => return Err(malformed("statuscode", "missing")),
    };
    let statusmsg = match statusmsg {
        Some(pos) => match doc.item(pos)?.0 {
            Item::Str(bytes, _) => String::from_utf8_lossy(bytes).into_owned(),
            _ => String::new(),
        },
        None => return Err(malformed("statusmsg", "missing")),
    };
    if !valid_identity(sender) {
        return Err(BodyError::Inventory(InventoryError::BadIdentity { identity: sender.to_string() }));
    }
    if statuscode != 0 {
        return Err(BodyError::Inventory(InventoryError::Status { code: statuscode, message: statusmsg }));
    }
    let names = ["facts", "classes", "agents", "collectives", "main_collective"];
    let [facts, classes, agents, collectives, own_main] = match data {
        Some(data) => doc.get_syms(data, names)?,
        None => [None; 5],
    };
    let facts = match facts {
        Some(pos) if matches!(doc.item(pos)?.0, Item::Hash(_)) => pos,
        Some(_) => return Err(BodyError::Inventory(InventoryError::FactsNotAHash)),
        None => return Err(BodyError::Inventory(InventoryError::NoFacts)),
    };
    let list = |at: Option<usize>| -> mco::Result<Vec<Cow<'_, str>>> {
        let mut items = Vec::new();
        if let Some(pos) = at {
            for item in doc.items(pos)?.unwrap_or_default() {
                match doc.item(item)?.0 {
                    Item::Str(bytes, _) | Item::Sym(bytes) => items.push(crate::store::lossy_text(bytes)),
                    _ => {}
                }
            }
        }
        Ok(sorted(items))
    };
    let lists = Lists { classes: list(classes)?, agents: list(agents)?, collectives: list(collectives)? };
    let own_main = match own_main {
        Some(pos) => match doc.item(pos)?.0 {
            Item::Str(bytes, _) => std::str::from_utf8(bytes).ok(),
            _ => None,
        },
        None => None,
    };
    let facts = DocToStore { doc: &doc, builder }.value(facts, 0)?.0;
    Ok(finish(sender, msgtime, at, own_main, main_collective, facts, lists, builder))
}

/// [`add_to_store`] on a checked Marshal document, value by value in stream order.
struct DocToStore<'d, 'a, 'b> {
    doc: &'d mco::marshal_reader::Doc<'a>,
    builder: &'b mut Builder,
}

impl DocToStore<'_, '_, '_> {
    /// The id of the value at `pos`, and where it ends.
    fn value(&mut self, pos: usize, depth: usize) -> mco::Result<(ValueId, usize)> {
        use mco::marshal_reader::Item;
        let target = self.doc.deref(pos)?;
        if target != pos {
            let id = self.value(target, depth)?.0;
            return Ok((id, self.doc.skip(pos)?));
        }
        if depth > MAX_DEPTH {
            return Ok((NULL, self.doc.skip(pos)?));
        }
        let (item, mut next) = self.doc.head(pos)?;
        let id = match item {
            Item::Nil | Item::Other(_) => NULL,
            Item::Bool(true) => TRUE,
            Item::Bool(false) => FALSE,
            Item::Int(i) => self.builder.int(i),
            Item::Float(f) if f.is_finite() => self.builder.float(f),
            Item::Float(_) => NULL,
            Item::Str(bytes, _) | Item::Sym(bytes) => self.builder.string_value(&String::from_utf8_lossy(bytes)),
            Item::Array(n) => {
                let mark = self.builder.open();
                for _ in 0..n {
                    let (id, end) = self.value(next, depth + 1)?;
                    self.builder.push_child(id);
                    next = end;
                }
                self.builder.close_array(mark)
            }
            Item::Hash(n) => {
                let mark = self.builder.open();
                for _ in 0..n {
                    let key = if depth + 1 > MAX_DEPTH {
                        next = self.doc.skip(next)?;
                        self.builder.string("null")
                    } else {
                        let target = self.doc.deref(next)?;
                        match self.doc.head(target)? {
                            (Item::Str(bytes, _) | Item::Sym(bytes), end) => {
                                next = if target == next { end } else { self.doc.skip(next)? };
                                self.builder.string(&String::from_utf8_lossy(bytes))
                            }
                            _ => {
                                let key = self.doc.value(next)?;
                                next = self.doc.skip(next)?;
                                match convert(&key, depth + 1) {
                                    Value::String(s) => self.builder.string(&s),
                                    other => self.builder.string(&other.to_string()),
                                }
                            }
                        }
                    };
                    let (value, end) = self.value(next, depth + 1)?;
                    next = end;
                    self.builder.push_child(key);
                    self.builder.push_child(value);
                }
                self.builder.close_object(mark)
            }
        };
        Ok((id, next))
    }
}

/// A Ruby value as JSON: Strings and Symbols become strings, Hash keys strings.
pub fn to_json(value: &mco::Value) -> Value {
    convert(value, 0)
}

/// [`to_json`]'s value added to the store, without the JSON tree (the same value:
/// `facts_go_to_the_store_as_to_json_reads_them` and the inventory_reply fuzz target
/// hold one to the other).
fn add_to_store(value: &mco::Value, builder: &mut Builder, depth: usize) -> ValueId {
    use mco::Value as R;
    if depth > MAX_DEPTH {
        return NULL;
    }
    match value {
        R::Nil | R::Other(_) => NULL,
        R::Bool(b) => {
            if *b {
                TRUE
            } else {
                FALSE
            }
        }
        R::Int(i) => builder.int(*i),
        R::Float(f) if f.is_finite() => builder.float(*f),
        R::Float(_) => NULL,
        R::Str { bytes, .. } => builder.string_value(&String::from_utf8_lossy(bytes)),
        R::Sym(s) => builder.string_value(s),
        R::Array(items) => {
            let mark = builder.open();
            for item in items {
                let id = add_to_store(item, builder, depth + 1);
                builder.push_child(id);
            }
            builder.close_array(mark)
        }
        R::Hash(pairs) => {
            let mark = builder.open();
            for (k, v) in pairs {
                let key = match k {
                    _ if depth + 1 > MAX_DEPTH => builder.string("null"),
                    R::Str { bytes, .. } => builder.string(&String::from_utf8_lossy(bytes)),
                    R::Sym(s) => builder.string(s),
                    other => match convert(other, depth + 1) {
                        Value::String(s) => builder.string(&s),
                        other => builder.string(&other.to_string()),
                    },
                };
                let value = add_to_store(v, builder, depth + 1);
                builder.push_child(key);
                builder.push_child(value);
            }
            builder.close_object(mark)
        }
    }
}

fn convert(value: &mco::Value, depth: usize) -> Value {
    use mco::Value as R;
    if depth > MAX_DEPTH {
        return Value::Null;
    }
    match value {
        R::Nil | R::Other(_) => Value::Null,
        R::Bool(b) => Value::Bool(*b),
        R::Int(i) => Value::from(*i),
        R::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        R::Str { bytes, .. } => Value::String(String::from_utf8_lossy(bytes).into_owned()),
        R::Sym(s) => Value::String(s.clone()),
        R::Array(items) => Value::Array(items.iter().map(|i| convert(i, depth + 1)).collect()),
        R::Hash(pairs) => Value::Object(
            pairs
                .iter()
                .map(|(k, v)| {
                    let key = match convert(k, depth + 1) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, convert(v, depth + 1))
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Node;
    use crate::mcollective::config::{BrokerHost, Config, Overrides};
    use serde_json::json;

    fn ruby_facts() -> mco::Value {
        use mco::Value as R;
        R::Hash(vec![
            (R::str("role"), R::str("node")),
            (R::str("processorcount"), R::str("4")),
            (R::str("os"), R::Hash(vec![(R::str("release"), R::Hash(vec![(R::str("full"), R::str("12.5"))]))])),
            (R::str("addresses"), R::Array(vec![R::str("10.0.0.1"), R::str("10.0.0.2")])),
        ])
    }

    fn reply(sender: &str, collectives: &[&str]) -> RpcReply {
        use mco::Value as R;
        let strings = |items: &[&str]| R::Array(items.iter().map(|s| R::str(*s)).collect());
        RpcReply {
            sender: sender.into(),
            agent: AGENT.into(),
            msgtime: 1_700_000_000,
            statuscode: 0,
            statusmsg: "OK".into(),
            data: R::Hash(vec![
                (R::sym("agents"), strings(&["rpcutil", "discovery", "puppet"])),
                (R::sym("facts"), ruby_facts()),
                (R::sym("classes"), strings(&["settings", "role::node", "ntp", "ntp"])),
                (R::sym("version"), R::str("2.12.5")),
                (R::sym("collectives"), strings(collectives)),
                (R::sym("main_collective"), R::str("mcollective")),
            ]),
        }
    }

    #[test]
    fn an_inventory_reply_becomes_facts_plus_classes_agents_and_collectives() {
        let (o, read) = observe(&reply("web1.example.com", &["staging", "mcollective"]), 1_700_000_005).unwrap();
        assert_eq!(o.certname, "web1.example.com");
        let node = read.node(&o, None);
        assert_eq!(
            Value::Object(node.facts.clone()),
            json!({"role": "node", "processorcount": "4", "os": {"release": {"full": "12.5"}},
                   "addresses": ["10.0.0.1", "10.0.0.2"]})
        );
        assert_eq!(node.extra[CLASSES], json!(["ntp", "role::node", "settings"]));
        assert_eq!(node.extra[AGENTS], json!(["discovery", "puppet", "rpcutil"]));
        assert_eq!(node.extra[COLLECTIVES], json!(["mcollective", "staging"]));
        assert_eq!((o.timestamp, o.answered_at), (1_700_000_000, Some(1_700_000_005)));
        assert_eq!(o.environment_hint.as_deref(), Some("staging"));

        // The hint only decides when neither the facts nor the master name the environment.
        assert_eq!(node.environment, "staging");
        assert_eq!(read.node(&o, Some("dev")).environment, "dev");
        let (only_main, _) = observe(&reply("a.example.com", &["mcollective"]), 1).unwrap();
        assert_eq!(only_main.environment_hint, None);
        let (two, _) = observe(&reply("a.example.com", &["mcollective", "x", "y"]), 1).unwrap();
        assert_eq!(two.environment_hint, None);
    }

    #[test]
    fn facts_are_never_dated_in_the_future() {
        let mut r = reply("web1.example.com", &["mcollective"]);
        r.msgtime = 4_102_444_800; // 2100
        let (o, _) = observe(&r, 1_700_000_005).unwrap();
        assert_eq!(o.timestamp, 1_700_000_005);
        r.msgtime = 1_700_000_001;
        assert_eq!(observe(&r, 1_700_000_005).unwrap().0.timestamp, 1_700_000_001);
    }

    #[test]
    fn classes_and_friends_are_queryable_and_never_hide_a_fact() {
        let (o, read) = observe(&reply("web1.example.com", &["mcollective"]), 1).unwrap();
        let node = read.node(&o, None);
        let q = crate::Query::parse(&["mcollective::classes=role::node", "os.release.full>=12"]).unwrap();
        assert!(q.matches(&node));
        let q = crate::Query::parse(&["mcollective::agents=puppetd"]).unwrap();
        assert!(!q.matches(&node));
        let q = crate::Query::parse(&["processorcount>3"]).unwrap();
        assert!(q.matches(&node), "numeric strings compare numerically");
    }

    #[test]
    fn bad_replies_are_refused_with_a_reason() {
        let mut r = reply("bad identity", &["mcollective"]);
        let err = observe(&r, 1).unwrap_err();
        assert_eq!(err, InventoryError::BadIdentity { identity: "bad identity".into() });
        assert_eq!(err.to_string(), "identity \"bad identity\" is not a valid certname");
        r.sender = "ok.example.com".into();
        r.statuscode = 5;
        r.statusmsg = "boom".into();
        let err = observe(&r, 1).unwrap_err();
        assert_eq!(err, InventoryError::Status { code: 5, message: "boom".into() });
        assert_eq!(err.to_string(), "status 5 boom");
        r.statuscode = 0;
        r.data = mco::Value::Hash(vec![]);
        assert_eq!(observe(&r, 1).unwrap_err(), InventoryError::NoFacts);
    }

    fn observe(reply: &RpcReply, at: i64) -> std::result::Result<(Observation, SourceRead), InventoryError> {
        let mut read = SourceRead::default();
        let o = observation(reply, at, "mcollective", &mut read.builder)?;
        Ok((o, read))
    }

    fn source(collectives: &[&str], grace: u64) -> McollectiveSource {
        let overrides = Overrides {
            no_config_file: true,
            pool: Some(vec![BrokerHost {
                host: "127.0.0.1".into(),
                port: 1,
                user: String::new(),
                password: String::new(),
                tls: None,
            }]),
            psk: Some("k".into()),
            identity: Some("master".into()),
            collectives: Some(collectives.iter().map(|s| s.to_string()).collect()),
            ..Overrides::default()
        };
        let client = Client::new(Config::resolve("", None, &overrides, None).unwrap());
        McollectiveSource::with_client(client, &McollectiveSettings { grace, ..McollectiveSettings::default() })
    }

    fn node(certname: &str, environment: &str, answered_at: Option<i64>) -> Node {
        let facts = json!({"environment": environment}).as_object().cloned().unwrap();
        let mut node = Node::new(certname.into(), facts, 0, None);
        node.answered_at = answered_at;
        node
    }

    #[test]
    fn targets_are_the_environments_collectives_plus_the_main_one_or_all_on_a_cold_start() {
        let s = source(&["mcollective", "production", "staging", "dev"], 60);
        assert_eq!(s.targets(None), ["dev", "mcollective", "production", "staging"]);
        let empty = Index::build(vec![], "role", 0);
        assert_eq!(s.targets(Some(&empty)).len(), 4);
        let index = Index::build(
            vec![node("a", "production", None), node("b", "qa", None), node("c", "production", None)],
            "role",
            0,
        );
        // qa has no collective: the main collective stands in for it.
        assert_eq!(s.targets(Some(&index)), ["mcollective", "production"]);
    }

    #[test]
    fn silent_servers_are_kept_for_the_grace_period_then_dropped() {
        let s = source(&["mcollective"], 60);
        let previous = Index::build(
            vec![
                node("answered", "production", Some(1000)),
                node("silent-now", "production", Some(1000)),
                node("silent-long", "production", Some(900)),
                node("from-a-cache", "production", None),
            ],
            "role",
            1000,
        );
        let mut read = SourceRead::default();
        s.apply_grace(&previous, &BTreeSet::from(["answered"]), 1010, &mut read);
        let kept: Vec<&str> = read.kept.iter().map(|p| previous.server(*p).certname()).collect();
        assert_eq!(kept, ["silent-now"]);
        assert_eq!(read.warnings.len(), 2, "{:?}", read.warnings);
        assert!(read.warnings[0].contains("no answer from silent-now; kept"), "{:?}", read.warnings);
        assert!(read.warnings[1].contains("dropped silent-long"), "{:?}", read.warnings);

        // Still silent at the next refresh: kept, without a new warning, until the grace ends.
        let next = read.into_index(Some(&previous), &BTreeMap::new(), "role", 1010);
        let carried = next.by_certname("silent-now").expect("kept");
        assert_eq!((carried.environment(), carried.answered_at()), ("production", Some(1000)));
        assert_eq!(next.len(), 1);
        let mut again = SourceRead::default();
        s.apply_grace(&next, &BTreeSet::new(), 1060, &mut again);
        assert_eq!(again.kept.len(), 1);
        assert!(again.warnings.is_empty(), "{:?}", again.warnings);
        let mut last = SourceRead::default();
        s.apply_grace(&next, &BTreeSet::new(), 1061, &mut last);
        assert!(last.kept.is_empty());
        assert!(last.warnings[0].contains("dropped silent-now"));
    }

    #[test]
    fn an_unreachable_broker_fails_the_refresh_with_the_reason() {
        let s = source(&["mcollective", "production"], 60);
        let e = s.refresh(None, now()).unwrap_err().to_string();
        assert!(e.contains("collectives mcollective, production: no broker could be reached: 127.0.0.1:1"), "{e}");
    }

    #[test]
    fn an_unusable_client_config_is_a_config_error_carrying_the_mcollective_error() {
        use std::error::Error as _;
        let overrides = Overrides { no_config_file: true, ..Overrides::default() };
        let settings = McollectiveSettings { overrides, ..McollectiveSettings::default() };
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

    #[test]
    fn facts_go_to_the_store_as_to_json_reads_them() {
        use mco::Value as R;
        let mut deep = R::Hash(vec![(R::str("leaf"), R::Int(1))]);
        for level in 0..70 {
            deep = R::Hash(vec![(R::sym(format!("l{level}")), deep), (R::Int(level), R::Array(vec![R::Nil]))]);
        }
        let values = [
            ruby_facts(),
            R::Hash(
                [
                    odd_values(),
                    vec![
                        (R::Nil, R::Float(f64::NAN)),
                        (R::Array(vec![R::Int(1), R::str("x")]), R::Float(f64::INFINITY)),
                        (R::str("a"), R::str("the last of a repeated key")),
                        (R::Bool(false), R::Hash(vec![])),
                    ],
                ]
                .concat(),
            ),
            deep,
        ];
        for value in values {
            let mut builder = Builder::new();
            let id = add_to_store(&value, &mut builder, 0);
            assert_eq!(builder.store().view(id).to_json(), to_json(&value));
        }
    }

    /// Keys and values of every kind a reply may hold.
    fn odd_values() -> Vec<(mco::Value, mco::Value)> {
        use mco::Value as R;
        vec![
            (R::sym("a"), R::Int(-3)),
            (R::Int(1), R::Float(0.5)),
            (R::str("n"), R::Nil),
            (R::str("b"), R::Bool(true)),
            (R::str("o"), R::Other("Object".into())),
            (R::str("bin"), R::binary(vec![0xff, b'a'])),
        ]
    }

    #[test]
    fn marshal_values_convert_to_json() {
        let v = mco::Value::Hash(odd_values());
        assert_eq!(to_json(&v), json!({"a": -3, "1": 0.5, "n": null, "b": true, "o": null, "bin": "\u{fffd}a"}));
    }
}
