//! One server of an index, read in place from the store.

use super::{Index, InvalidRows, Rows, NEVER_ANSWERED};
use crate::facts::{FactPath, Facts, Node};
use crate::store::{KeyHint, Kind, ObjectRef, Store, StrId, View};
use std::cmp::Ordering;

/// A server of an [`Index`]: what [`Node`] holds, without copying it out.
#[derive(Clone, Copy)]
pub struct ServerRef<'a> {
    index: &'a Index,
    position: u32,
}

impl<'a> ServerRef<'a> {
    pub(super) fn new(index: &'a Index, position: u32) -> ServerRef<'a> {
        ServerRef { index, position }
    }

    fn at<T: Copy>(self, column: &[T]) -> T {
        column[self.position as usize]
    }

    pub fn position(self) -> u32 {
        self.position
    }

    pub fn certname(self) -> &'a str {
        self.index.store.str(self.at(&self.index.rows.certname))
    }

    pub fn environment(self) -> &'a str {
        self.index.store.str(self.at(&self.index.rows.environment))
    }

    pub fn timestamp(self) -> i64 {
        self.at(&self.index.rows.timestamp)
    }

    pub fn answered_at(self) -> Option<i64> {
        Some(self.at(&self.index.rows.answered_at)).filter(|t| *t != NEVER_ANSWERED)
    }

    pub fn facts(self) -> ObjectRef<'a> {
        object(&self.index.store, self.at(&self.index.rows.facts))
    }

    pub fn extra(self) -> ObjectRef<'a> {
        object(&self.index.store, self.at(&self.index.rows.extra))
    }

    /// As [`Node::entries`]: the facts, then what the source reported beside them,
    /// never hiding a fact.
    pub fn entries(self) -> impl Iterator<Item = (&'a str, View<'a>)> + 'a {
        self.named_entries().map(|(_, name, value)| (name, value))
    }

    /// [`Self::entries`] with each name's string id in the store.
    pub fn named_entries(self) -> impl Iterator<Item = (StrId, &'a str, View<'a>)> + 'a {
        let facts = self.facts();
        facts.named().chain(self.extra().named().filter(move |(_, name, _)| !facts.contains_key(name)))
    }

    /// [`Self::named_entries`] without the names' text ([`Self::name`] gives it).
    pub fn entry_ids(self) -> impl Iterator<Item = (StrId, View<'a>)> + 'a {
        let (facts, store) = (self.facts(), &self.index.store);
        facts.ids().chain(self.extra().ids().filter(move |(id, _)| !facts.contains_key(store.str(*id))))
    }

    /// The text of a name [`Self::entry_ids`] gave.
    pub fn name(self, id: StrId) -> &'a str {
        self.index.store.str(id)
    }

    /// As [`Node::fact`]: a top-level fact named exactly `path` wins, else a dotted
    /// walk into hashes and, by number, arrays; else what the source reported.
    pub fn fact(self, path: &FactPath) -> Option<View<'a>> {
        self.fact_hinted(path, &mut PathHints::new(path))
    }

    /// [`Self::fact`] for a path asked of server after server of one index (a path's
    /// index): `hints`, made for `path`, keep where its keys were found last.
    pub fn fact_hinted(self, path: &FactPath, hints: &mut PathHints) -> Option<View<'a>> {
        self.fact_in(self.facts(), path, hints)
    }

    /// [`Self::fact_hinted`] with the server's facts already read ([`Self::facts`]):
    /// a path's index reads every server's first, so that the CPU overlaps those reads.
    pub(super) fn fact_in(self, facts: ObjectRef<'a>, path: &FactPath, hints: &mut PathHints) -> Option<View<'a>> {
        if let Some(value) = facts.get_hinted(&mut hints.whole) {
            return Some(value);
        }
        let walked = match path.segments() {
            [_, rest @ ..] if !rest.is_empty() => {
                let mut current = facts.get_hinted(&mut hints.first);
                for segment in rest {
                    current = match current.map(View::kind) {
                        Some(Kind::Object(map)) => map.get(segment),
                        Some(Kind::Array(items)) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
                        _ => None,
                    };
                }
                current
            }
            _ => None,
        };
        walked.or_else(|| self.extra().get(path.as_str()))
    }

    /// The roles its role fact names: a string, or the strings of a list.
    pub fn roles(self, role_fact: &str) -> impl Iterator<Item = &'a str> + 'a {
        roles_in(role_value(self.facts(), role_fact, &mut KeyHint::new(role_fact)))
    }

    /// [`Self::roles`], for server after server of one index: `hint` is made for
    /// the role fact.
    pub fn roles_hinted(self, role_fact: &str, hint: &mut KeyHint) -> impl Iterator<Item = &'a str> + 'a {
        roles_in(role_value(self.facts(), role_fact, hint))
    }

    /// The role fact's value, whatever it is (what `explain` shows).
    pub fn role_fact_value(self, role_fact: &str) -> Option<View<'a>> {
        role_value(self.facts(), role_fact, &mut KeyHint::new(role_fact))
    }

    /// The role fact when it is a string (what the kick planner records).
    pub fn role(self, role_fact: &str) -> Option<&'a str> {
        role_value(self.facts(), role_fact, &mut KeyHint::new(role_fact)).and_then(View::as_str)
    }

    /// As [`Node::sort_name`]: the `fqdn` fact, or the certname without one.
    pub fn sort_name(self) -> &'a str {
        self.sort_name_hinted(&mut KeyHint::new("fqdn"))
    }

    /// [`ServerRef::sort_name`], `fqdn` found through `hint` (a `KeyHint::new("fqdn")`
    /// used server after server: no text compared once it has the key's id).
    pub fn sort_name_hinted(self, hint: &mut KeyHint) -> &'a str {
        self.facts().get_hinted(hint).and_then(View::as_str).filter(|f| !f.is_empty()).unwrap_or(self.certname())
    }

    /// As [`Node::canonical_cmp`]: by `fqdn` (or certname), then certname.
    pub fn canonical_cmp(&self, other: &ServerRef) -> Ordering {
        self.sort_name().cmp(other.sort_name()).then_with(|| self.certname().cmp(other.certname()))
    }

    /// The server as a [`Node`], copied out (for the few paths that build new nodes
    /// from an old index, such as mcollective's grace period).
    pub fn to_node(self) -> Node {
        let copy = |o: ObjectRef| o.iter().map(|(k, v)| (k.to_string(), v.to_json())).collect::<Facts>();
        Node {
            certname: self.certname().to_string(),
            environment: self.environment().to_string(),
            facts: copy(self.facts()),
            timestamp: self.timestamp(),
            extra: copy(self.extra()),
            answered_at: self.answered_at(),
        }
    }
}

/// The role fact of a server with `facts`, as a query reads a path: a top-level fact
/// named exactly `role_fact` (found through `hint`, made for it) wins, else a dotted
/// walk into hashes and, by number, arrays (`trusted.extensions.pp_role`).
pub(super) fn role_value<'a>(facts: ObjectRef<'a>, role_fact: &str, hint: &mut KeyHint) -> Option<View<'a>> {
    if let Some(value) = facts.get_hinted(hint) {
        return Some(value);
    }
    let (first, rest) = role_fact.split_once('.')?;
    let mut current = facts.get(first);
    for segment in rest.split('.') {
        current = match current?.kind() {
            Kind::Object(map) => map.get(segment),
            Kind::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
    }
    current
}

/// The roles a role fact's value names: a string, or the strings of a list.
pub(super) fn roles_in(value: Option<View<'_>>) -> impl Iterator<Item = &str> {
    let (one, many) = match value.map(View::kind) {
        Some(Kind::Str(s)) => (Some(s), None),
        Some(Kind::Array(items)) => (None, Some(items.iter().filter_map(View::as_str))),
        _ => (None, None),
    };
    one.into_iter().chain(many.into_iter().flatten())
}

/// Where [`ServerRef::fact_hinted`] found a path's top-level keys last: the whole
/// path as one fact name, and its first segment.
#[derive(Clone, Copy, Debug)]
pub struct PathHints<'p> {
    whole: KeyHint<'p>,
    first: KeyHint<'p>,
}

impl<'p> PathHints<'p> {
    pub fn new(path: &'p FactPath) -> PathHints<'p> {
        let first = path.segments().first().map_or(path.as_str(), String::as_str);
        PathHints { whole: KeyHint::new(path.as_str()), first: KeyHint::new(first) }
    }
}

fn object(store: &Store, id: u32) -> ObjectRef<'_> {
    // `check_rows` (or `build`) made every facts and extra id an object.
    store.view(id).as_object().unwrap_or(ObjectRef::empty(store))
}

/// What [`Index::from_rows`] needs of stored rows before anything reads them.
pub(super) fn check_rows(store: &Store, rows: &Rows) -> Result<(), InvalidRows> {
    let n = rows.certname.len();
    let lengths =
        [rows.environment.len(), rows.facts.len(), rows.extra.len(), rows.timestamp.len(), rows.answered_at.len()];
    if let Some(other) = lengths.iter().find(|l| **l != n) {
        return Err(InvalidRows(format!("{n} certnames but a column of {other}")));
    }
    for p in 0..n {
        for (what, id) in [("certname", rows.certname[p]), ("environment", rows.environment[p])] {
            if id as usize >= store.strings() {
                return Err(InvalidRows(format!("server {p}: {what} string {id} past the end")));
            }
        }
        for (what, id) in [("facts", rows.facts[p]), ("extra", rows.extra[p])] {
            if id as usize >= store.values() || store.view(id).as_object().is_none() {
                return Err(InvalidRows(format!("server {p}: {what} value {id} is not a hash")));
            }
        }
    }
    Ok(())
}
