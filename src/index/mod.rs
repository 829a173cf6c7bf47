//! The immutable fact index a compile reads: every server's facts in one [`Store`],
//! rows in the one result order, inverted maps from environment and role to
//! positions, and per-path indexes built on first use.
//!
//! A refresh builds a new `Index` and swaps it in whole. Nothing a reader sees is
//! mutated after `build`: the lazily built path indexes are computed aside and
//! added under a lock, and answer the same whenever they are built.

mod answers;
mod explain;
mod incremental;
mod path;
#[cfg(any(test, feature = "synthetic"))]
pub mod reference;
mod server;
#[cfg(test)]
mod tests;

pub use crate::query::RoleSelector;
pub use answers::{Answer, Question, ANSWERS};
pub use explain::AtPath;
pub use server::ServerRef;

use crate::bounded_read::FileBytes;
use crate::facts::Node;
use crate::query::Query;
use crate::store::blob::{self, Blob};
use crate::store::{Builder, Column, KeyHint, Store, StrId, ValueId, View, EMPTY_OBJECT};
use answers::Answers;
use path::PathIndexes;
use serde::Deserialize;
// foldhash, seeded per process (as the store's tables): the role and environment
// maps are hashed once per server at every refresh.
use hashbrown::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Positions into the rows, ascending, i.e. already in result order.
type Positions = Vec<u32>;

/// Leaves out servers whose facts are older than `max_age` seconds at `now`.
#[derive(Clone, Copy, Debug)]
pub struct Freshness {
    pub now: i64,
    pub max_age: u64,
}

impl Freshness {
    pub fn admits(&self, timestamp: i64) -> bool {
        self.now.saturating_sub(timestamp) <= self.max_age as i64
    }
}

/// The servers, one column per field, position `p` in each being server `p`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rows {
    pub certname: Column<StrId>,
    pub environment: Column<StrId>,
    /// An object value: the server's facts.
    pub facts: Column<ValueId>,
    /// An object value: what the source reported beside the facts ([`Node::extra`]).
    pub extra: Column<ValueId>,
    /// Unix seconds at which the facts were collected.
    pub timestamp: Column<i64>,
    /// [`Node::answered_at`], with [`NEVER_ANSWERED`] for `None`.
    pub answered_at: Column<i64>,
}

/// The rows as a snapshot holds them, borrowed from the file.
#[derive(Deserialize)]
pub struct RowBlobs<'a> {
    #[serde(borrow)]
    certname: Blob<'a>,
    #[serde(borrow)]
    environment: Blob<'a>,
    #[serde(borrow)]
    facts: Blob<'a>,
    #[serde(borrow)]
    extra: Blob<'a>,
    #[serde(borrow)]
    timestamp: Blob<'a>,
    #[serde(borrow)]
    answered_at: Blob<'a>,
}

/// `answered_at` of a server whose source reads a cache.
pub const NEVER_ANSWERED: i64 = i64::MIN;

impl Rows {
    pub fn len(&self) -> usize {
        self.certname.len()
    }

    pub fn is_empty(&self) -> bool {
        self.certname.is_empty()
    }

    /// Appends the rows to a snapshot: a map of aligned blobs that [`RowBlobs`] reads.
    pub fn write(&self, out: &mut blob::Spool) {
        rmp::encode::write_map_len(out, 2 * 6).expect("a spool takes every write");
        blob::write_entry(out, "certname", &self.certname);
        blob::write_entry(out, "environment", &self.environment);
        blob::write_entry(out, "facts", &self.facts);
        blob::write_entry(out, "extra", &self.extra);
        blob::write_entry(out, "timestamp", &self.timestamp);
        blob::write_entry(out, "answered_at", &self.answered_at);
    }

    /// Rows over the blobs of a snapshot in `file` (checked by [`Index::from_rows`]).
    pub fn from_blobs(file: &Arc<FileBytes>, blobs: RowBlobs<'_>) -> Result<Rows, InvalidRows> {
        let ragged = |e: crate::store::RaggedColumn| InvalidRows(e.to_string());
        Ok(Rows {
            certname: Column::from_blob(file, "certname", blobs.certname.0).map_err(ragged)?,
            environment: Column::from_blob(file, "environment", blobs.environment.0).map_err(ragged)?,
            facts: Column::from_blob(file, "facts", blobs.facts.0).map_err(ragged)?,
            extra: Column::from_blob(file, "extra", blobs.extra.0).map_err(ragged)?,
            timestamp: Column::from_blob(file, "timestamp", blobs.timestamp.0).map_err(ragged)?,
            answered_at: Column::from_blob(file, "answered_at", blobs.answered_at.0).map_err(ragged)?,
        })
    }
}

/// A server whose facts are in a [`Builder`]'s store, before [`Index::from_staged`]
/// places it: what a row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staged {
    pub certname: StrId,
    pub environment: StrId,
    /// An object value.
    pub facts: ValueId,
    /// An object value ([`EMPTY_OBJECT`] for none).
    pub extra: ValueId,
    pub timestamp: i64,
    /// [`NEVER_ANSWERED`] for a source that reads a cache.
    pub answered_at: i64,
    /// Whether the facts alone named the environment: else where the master last
    /// saw the server (or the source's hint) did, and may change it.
    pub environment_from_facts: bool,
}

#[derive(Debug)]
pub struct Index {
    store: Store,
    rows: Rows,
    /// Positions ordered by certname, for [`Index::by_certname`].
    by_certname: Vec<u32>,
    by_environment: HashMap<String, EnvironmentEntry>,
    role_fact: String,
    paths: PathIndexes,
    answers: Answers,
    /// Unix seconds when the data was collected from its source.
    built_at: i64,
    /// Unique per build in this process, so bindings can cache what they converted.
    generation: u64,
    /// Positions (ascending) whose environment did not come from their facts alone
    /// (see [`Staged::environment_from_facts`]); `None` for stored rows, whose
    /// index no later build goes on from.
    unsettled: Option<Positions>,
}

/// What the role maps and the order check read of each server: its roles and its
/// sort name, found in one visit a server. The visits are reads scattered across
/// the store, a few cache misses each, so a large index makes them on two threads
/// (a snapshot's first answer waits for them).
struct RolesAndSortNames<'a> {
    /// Each server's sort name (`fqdn`, or its certname), if asked for.
    sort_names: Vec<&'a str>,
    /// (position, role) for every role of every server, positions ascending.
    roles: Vec<(u32, &'a str)>,
}

/// How many servers ahead [`RolesAndSortNames::of`] starts loading a server's facts.
const PREFETCH_AHEAD: u32 = 8;

/// Servers from which [`RolesAndSortNames::of`] runs on two threads.
const VISIT_IN_PARALLEL_FROM: usize = 4096;

impl<'a> RolesAndSortNames<'a> {
    fn of(index: &'a Index, role_fact: &str, sort_names: bool) -> RolesAndSortNames<'a> {
        RolesAndSortNames::of_with(index, role_fact, sort_names, index.len() >= VISIT_IN_PARALLEL_FROM)
    }

    fn of_with(index: &'a Index, role_fact: &str, sort_names: bool, parallel: bool) -> RolesAndSortNames<'a> {
        let servers = index.len() as u32;
        let visit = |positions: std::ops::Range<u32>| {
            let mut visits = RolesAndSortNames { sort_names: Vec::new(), roles: Vec::with_capacity(positions.len()) };
            if sort_names {
                visits.sort_names.reserve(positions.len());
            }
            let (mut role_hint, mut fqdn_hint) = (KeyHint::new(role_fact), KeyHint::new("fqdn"));
            let end = positions.end;
            for position in positions {
                // Each visit is a few cache misses: start those of the servers ahead.
                if let Some(ahead) = Some(position + 2 * PREFETCH_AHEAD).filter(|&p| p < end) {
                    index.store.prefetch_value(index.rows.facts[ahead as usize]);
                }
                if let Some(ahead) = Some(position + PREFETCH_AHEAD).filter(|&p| p < end) {
                    let facts = index.server(ahead).facts();
                    facts.prefetch_hinted(&role_hint);
                    if sort_names {
                        facts.prefetch_hinted(&fqdn_hint);
                    }
                }
                let server = index.server(position);
                visits.roles.extend(server.roles_hinted(role_fact, &mut role_hint).map(|role| (position, role)));
                if sort_names {
                    visits.sort_names.push(server.sort_name_hinted(&mut fqdn_hint));
                }
            }
            visits
        };
        if !parallel {
            return visit(0..servers);
        }
        let middle = servers / 2;
        std::thread::scope(|scope| {
            let later = scope.spawn(|| visit(middle..servers));
            let mut visits = visit(0..middle);
            let later = later.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            visits.sort_names.extend(later.sort_names);
            visits.roles.extend(later.roles);
            visits
        })
    }

    /// The servers of each environment, and of each role in it.
    fn role_maps(&self, index: &Index) -> HashMap<String, EnvironmentEntry> {
        let mut by_environment: HashMap<String, EnvironmentEntry> = HashMap::new();
        let mut roles = self.roles.iter().peekable();
        for position in 0..index.len() as u32 {
            let environment = index.server(position).environment();
            if !by_environment.contains_key(environment) {
                by_environment.insert(environment.to_string(), EnvironmentEntry::default());
            }
            let entry = by_environment.get_mut(environment).expect("inserted above");
            entry.all.push(position);
            while let Some(&(_, role)) = roles.next_if(|(at, _)| *at == position) {
                if !entry.by_role.contains_key(role) {
                    entry.by_role.insert(role.to_string(), Positions::new());
                }
                let positions = entry.by_role.get_mut(role).expect("inserted above");
                if positions.last() != Some(&position) {
                    positions.push(position);
                }
            }
        }
        by_environment
    }
}

#[derive(Debug, Default)]
struct EnvironmentEntry {
    all: Positions,
    by_role: HashMap<String, Positions>,
}

/// Why stored rows do not make an index (a snapshot that is not what we wrote).
#[derive(Debug, PartialEq, Eq)]
pub struct InvalidRows(pub String);

impl Index {
    /// Builds the index; duplicate certnames keep the newest facts.
    pub fn build(nodes: Vec<Node>, role_fact: &str, built_at: i64) -> Index {
        Index::build_from(&nodes, role_fact, built_at)
    }

    /// [`Index::build`] from borrowed servers, so the caller drops their trees when
    /// it suits it.
    pub fn build_from(nodes: &[Node], role_fact: &str, built_at: i64) -> Index {
        // Interned in result order: the same servers give the same store, id for id,
        // in whatever order they come.
        let mut order: Vec<&Node> = nodes.iter().collect();
        order.sort_by(|a, b| a.certname.cmp(&b.certname).then(b.timestamp.cmp(&a.timestamp)));
        order.dedup_by(|later, first| later.certname == first.certname);
        order.sort_by(|a, b| a.canonical_cmp(b));
        let mut builder = Builder::new();
        let staged = order
            .into_iter()
            .map(|node| Staged {
                certname: builder.string(&node.certname),
                environment: builder.string(&node.environment),
                facts: builder.object(node.facts.iter().map(|(k, v)| (k.as_str(), v))),
                extra: if node.extra.is_empty() {
                    EMPTY_OBJECT
                } else {
                    builder.object(node.extra.iter().map(|(k, v)| (k.as_str(), v)))
                },
                timestamp: node.timestamp,
                answered_at: node.answered_at.unwrap_or(NEVER_ANSWERED),
                // Decided before: not known here.
                environment_from_facts: false,
            })
            .collect();
        Index::from_staged(builder, staged, role_fact, built_at)
    }

    /// The index over servers already in `builder`'s store (decoded straight into
    /// it by a source): duplicate certnames keep the newest facts (the first given,
    /// of equal ones), then the rows are put in the one result order.
    pub fn from_staged(builder: Builder, staged: Vec<Staged>, role_fact: &str, built_at: i64) -> Index {
        let (placed, by_certname) = place(builder.store(), staged);
        let rows = rows_of(&placed);
        let unsettled = unsettled_in(&placed);
        drop(placed);
        let mut index = Index::assemble(builder.finish(), rows, role_fact, built_at, Some(by_certname));
        index.unsettled = Some(unsettled);
        index
    }

    /// An index over stored rows (a snapshot's), checked first: every id in range,
    /// facts and extras objects, certnames unique, rows in the one result order.
    pub fn from_rows(store: Store, rows: Rows, role_fact: &str, built_at: i64) -> Result<Index, InvalidRows> {
        server::check_rows(&store, &rows)?;
        let mut index = Index::without_role_maps(store, rows, role_fact, built_at, None);
        let (a, b) = (index.by_certname.iter(), index.by_certname.iter().skip(1));
        if let Some((x, _)) = a.zip(b).find(|(x, y)| index.server(**x).certname() == index.server(**y).certname()) {
            return Err(InvalidRows(format!("certname '{}' is stored twice", index.server(*x).certname())));
        }
        let visits = RolesAndSortNames::of(&index, role_fact, true);
        // As `canonical_cmp` on each neighbour pair, each server's sort name found once.
        let mut previous: Option<(&str, &str)> = None;
        for (p, &sort_name) in visits.sort_names.iter().enumerate() {
            let key = (sort_name, index.server(p as u32).certname());
            if previous.is_some_and(|previous| previous >= key) {
                return Err(InvalidRows(format!("servers {} and {p} are out of order", p - 1)));
            }
            previous = Some(key);
        }
        index.by_environment = visits.role_maps(&index);
        Ok(index)
    }

    /// The index over `rows`; `by_certname`, when the caller has it, is the positions
    /// in certname order.
    fn assemble(store: Store, rows: Rows, role_fact: &str, built_at: i64, by_certname: Option<Vec<u32>>) -> Index {
        let mut index = Index::without_role_maps(store, rows, role_fact, built_at, by_certname);
        index.by_environment = RolesAndSortNames::of(&index, role_fact, false).role_maps(&index);
        index
    }

    /// [`Index::assemble`] but for the role maps (see [`RolesAndSortNames`]).
    fn without_role_maps(
        store: Store,
        rows: Rows,
        role_fact: &str,
        built_at: i64,
        by_certname: Option<Vec<u32>>,
    ) -> Index {
        let mut index = Index {
            store,
            rows,
            by_certname: Vec::new(),
            by_environment: HashMap::new(),
            role_fact: role_fact.to_string(),
            paths: PathIndexes::default(),
            answers: Answers::default(),
            built_at,
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            unsettled: None,
        };
        index.by_certname = by_certname.unwrap_or_else(|| {
            let mut by_certname: Vec<u32> = (0..index.len() as u32).collect();
            by_certname.sort_by(|a, b| index.server(*a).certname().cmp(index.server(*b).certname()));
            by_certname
        });
        index
    }

    /// Unique per `build` within the process: a binding may keep converted servers
    /// keyed by (generation, position) and drop them when it changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn rows(&self) -> &Rows {
        &self.rows
    }

    /// The role fact the role maps were built from.
    pub fn role_fact(&self) -> &str {
        &self.role_fact
    }

    /// Bytes this index holds: the store, the rows and the maps (path indexes built
    /// so far included), for `status` and the benchmarks.
    pub fn heap_bytes(&self) -> usize {
        let rows = &self.rows;
        let row_bytes = rows.certname.heap_bytes()
            + rows.environment.heap_bytes()
            + rows.facts.heap_bytes()
            + rows.extra.heap_bytes()
            + rows.timestamp.heap_bytes()
            + rows.answered_at.heap_bytes();
        let maps: usize = self
            .by_environment
            .iter()
            .map(|(name, e)| {
                name.len()
                    + 4 * e.all.capacity()
                    + e.by_role.iter().map(|(r, p)| r.len() + 4 * p.capacity()).sum::<usize>()
            })
            .sum();
        self.store.heap_bytes()
            + row_bytes
            + 4 * self.by_certname.capacity()
            + maps
            + self.paths.heap_bytes()
            + self.answers.heap_bytes()
    }

    pub fn by_certname(&self, certname: &str) -> Option<ServerRef<'_>> {
        let found = self.by_certname.binary_search_by(|p| self.server(*p).certname().cmp(certname)).ok()?;
        Some(self.server(self.by_certname[found]))
    }

    pub fn server(&self, position: u32) -> ServerRef<'_> {
        ServerRef::new(self, position)
    }

    pub fn servers(&self) -> impl ExactSizeIterator<Item = ServerRef<'_>> + '_ {
        (0..self.len() as u32).map(|p| self.server(p))
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn built_at(&self) -> i64 {
        self.built_at
    }

    /// `servers_with_role`: servers of `environment` whose role fact (a string, or a
    /// list containing one) is selected, in result order.
    pub fn with_role(&self, roles: &RoleSelector, environment: &str, fresh: Freshness) -> Vec<u32> {
        let Some(entry) = self.by_environment.get(environment) else {
            return Vec::new();
        };
        let mut lists: Vec<&Positions> = roles.names.iter().filter_map(|n| entry.by_role.get(n)).collect();
        if !roles.patterns.is_empty() {
            let matching = entry.by_role.iter().filter(|(role, _)| roles.patterns.iter().any(|re| re.is_match(role)));
            lists.extend(matching.map(|(_, positions)| positions));
        }
        let mut positions: Vec<u32> = match lists.as_slice() {
            [] => return Vec::new(),
            [one] => one.to_vec(),
            many => {
                let mut merged: Vec<u32> = many.iter().flat_map(|p| p.iter().copied()).collect();
                merged.sort_unstable();
                merged.dedup();
                merged
            }
        };
        positions.retain(|p| fresh.admits(self.rows.timestamp[*p as usize]));
        positions
    }

    /// `servers_with_facts`: servers matching every clause, scoped to `environment`
    /// unless a clause names the environment itself.
    ///
    /// An exact clause on the role fact starts from that role's servers (and is then
    /// answered). Every other clause is tested once per distinct value at its path
    /// (see [`path`]), then per server by a table lookup.
    pub fn with_facts(&self, query: &Query, environment: &str, fresh: Freshness) -> Vec<u32> {
        let clauses = query.clauses();
        let seed = clauses.iter().enumerate().find_map(|(i, c)| {
            let role = (c.path() == self.role_fact).then(|| c.plain_equality()).flatten()?;
            Some((i, role))
        });
        let all: Positions;
        let candidates: &[u32] = if query.names_environment() {
            all = (0..self.len() as u32).collect();
            &all
        } else {
            let Some(entry) = self.by_environment.get(environment) else {
                return Vec::new();
            };
            match seed {
                Some((_, role)) => match entry.by_role.get(role) {
                    Some(positions) => positions,
                    None => return Vec::new(),
                },
                None => &entry.all,
            }
        };
        // With no environment scope the role list is not per environment: test it.
        let skip = seed.filter(|_| !query.names_environment()).map(|(i, _)| i);
        let tests: Vec<path::ClauseTest> = clauses
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != skip)
            .map(|(_, clause)| self.paths.test(self, clause))
            .collect();
        candidates
            .iter()
            .copied()
            .filter(|p| fresh.admits(self.rows.timestamp[*p as usize]) && tests.iter().all(|t| t.holds(*p)))
            .collect()
    }
}

/// The servers in the one result order, duplicate certnames dropped (the newest
/// facts kept, the first given of equal ones), and the positions in certname order.
fn place(store: &Store, mut staged: Vec<Staged>) -> (Vec<Staged>, Vec<u32>) {
    staged.sort_by(|a, b| store.str(a.certname).cmp(store.str(b.certname)).then(b.timestamp.cmp(&a.timestamp)));
    staged.dedup_by(|later, first| later.certname == first.certname);
    let mut fqdn = KeyHint::new("fqdn");
    // (sort name, certname, rank by certname, server)
    let mut keyed: Vec<(&str, &str, u32, Staged)> = staged
        .into_iter()
        .enumerate()
        .map(|(k, s)| (sort_name(store, &s, &mut fqdn), store.str(s.certname), k as u32, s))
        .collect();
    keyed.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let mut by_certname = vec![0u32; keyed.len()];
    for (position, k) in keyed.iter().enumerate() {
        by_certname[k.2 as usize] = position as u32;
    }
    (keyed.into_iter().map(|k| k.3).collect(), by_certname)
}

/// As [`ServerRef::sort_name`]: the `fqdn` fact, or the certname without one.
fn sort_name<'s>(store: &'s Store, server: &Staged, fqdn: &mut KeyHint) -> &'s str {
    let found = store.view(server.facts).as_object().and_then(|f| f.get_hinted(fqdn)).and_then(View::as_str);
    found.filter(|f| !f.is_empty()).unwrap_or(store.str(server.certname))
}

/// The rows of servers already in result order.
fn rows_of(placed: &[Staged]) -> Rows {
    Rows {
        certname: placed.iter().map(|s| s.certname).collect::<Vec<_>>().into(),
        environment: placed.iter().map(|s| s.environment).collect::<Vec<_>>().into(),
        facts: placed.iter().map(|s| s.facts).collect::<Vec<_>>().into(),
        extra: placed.iter().map(|s| s.extra).collect::<Vec<_>>().into(),
        timestamp: placed.iter().map(|s| s.timestamp).collect::<Vec<_>>().into(),
        answered_at: placed.iter().map(|s| s.answered_at).collect::<Vec<_>>().into(),
    }
}

/// The positions of servers whose environment did not come from their facts.
fn unsettled_in(placed: &[Staged]) -> Positions {
    (0..placed.len() as u32).filter(|p| !placed[*p as usize].environment_from_facts).collect()
}
