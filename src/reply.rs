//! What the entry points of `api` return, as Rust types that serialize to
//! what Ruby gets: [`Selected`] (a query's positions), [`Servers`] and [`Values`]
//! (by id, for the C ABI's cache), [`Server`] (a server's entries, `certname`
//! added) and [`Status`]. The bindings convert them; `puppet kicker query` renders
//! [`Server`] as JSON, so the rule of what a server holds lives here, once.

use crate::index::{Index, ServerRef};
use crate::service::Selection;
use crate::store::{StrId, View};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::Value as Json;
use std::sync::Arc;

/// A query's answer. Serialized (the C ABI's `pk_select`): `{"generation": G,
/// "answer": A, "positions": [P, ..]}`, or `{"generation": G, "answer": A}` when A
/// is the non-zero answer id the caller said it holds (`known` of `api::Select`).
pub struct Selected {
    selection: Selection,
    first_only: bool,
    known: u64,
}

impl Selected {
    /// `selection`'s answer; `first_only` for `server_with_role`; `known`: the answer
    /// id the caller holds (0: none).
    pub fn new(selection: Selection, first_only: bool, known: u64) -> Selected {
        Selected { selection, first_only, known }
    }

    pub fn generation(&self) -> u64 {
        self.selection.positions().0
    }

    /// See [`Selection::answer_id`]: a binding keeps the Array it built per id.
    /// 0 for `server_with_role`, whose one position is not the answer's list.
    pub fn answer_id(&self) -> u64 {
        if self.first_only {
            0
        } else {
            self.selection.answer_id()
        }
    }

    /// The selected servers' positions: at most one for `server_with_role`.
    pub fn positions(&self) -> &[u32] {
        let positions = self.selection.positions().1;
        if self.first_only {
            &positions[..positions.len().min(1)]
        } else {
            positions
        }
    }

    /// Positions, name ids and value ids of this selection's index: what a binding's
    /// tables by id (see [`Entry::Value`]) need to hold.
    pub fn id_counts(&self) -> IdCounts {
        let (positions, names, values) = self.selection.id_counts();
        IdCounts { positions, names, values }
    }

    /// The server at `position` of this selection's index.
    pub fn server_at(&self, position: u32) -> Option<Server<'_>> {
        self.selection.server_at(position).map(Server)
    }
}

/// How many of each id an index has: its servers' positions are below `positions`,
/// its names' ids below `names` and its values' ids below `values`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdCounts {
    pub positions: usize,
    pub names: usize,
    pub values: usize,
}

impl Serialize for Selected {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let answer = self.answer_id();
        let held = answer != 0 && answer == self.known;
        let mut map = serializer.serialize_map(Some(if held { 2 } else { 3 }))?;
        map.serialize_entry("generation", &self.generation())?;
        map.serialize_entry("answer", &answer)?;
        if !held {
            map.serialize_entry("positions", self.positions())?;
        }
        map.end()
    }
}

/// Servers by position, serialized by reference: each server as `[[K, ..], [V, ..],
/// certname]`, the Ks its fact names' string ids and the Vs their value ids in the
/// index's store, in [`Server::entries`] order; `certname` is the certname to add
/// under that name, or null when a fact already has that name. A caller converts
/// each K and V once per index generation (`api::values_at`) and builds every server
/// from them, as the magnus extension does, instead of parsing every server's facts
/// again.
pub struct Servers(Selection);

impl Servers {
    pub fn new(selection: Selection) -> Servers {
        Servers(selection)
    }

    /// The servers, in the order their positions were asked for (the C ABI's
    /// binary `pk_fetch` encodes them itself).
    pub fn iter(&self) -> impl Iterator<Item = Server<'_>> {
        self.0.servers().map(Server)
    }
}

impl Serialize for Servers {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for server in self.0.servers() {
            seq.serialize_element(&ServerIds(Server(server)))?;
        }
        seq.end()
    }
}

struct ServerIds<'a>(Server<'a>);

impl Serialize for ServerIds<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        let mut certname = None;
        for (_, entry) in self.0.entries() {
            match entry {
                Entry::Value(key, value) => {
                    keys.push(key);
                    values.push(value.id());
                }
                Entry::Certname(text) => certname = Some(text),
            }
        }
        (keys, values, certname).serialize(serializer)
    }
}

/// Store values and names by id: `{"values": [value, ..], "keys": [name, ..]}`, in
/// the order they were asked for.
pub struct Values {
    index: Arc<Index>,
    values: Vec<u32>,
    keys: Vec<u32>,
}

impl Values {
    /// The values and names of `index` by id; `None` when an id is not one of its own.
    pub fn new(index: Arc<Index>, values: Vec<u32>, keys: Vec<u32>) -> Option<Values> {
        let store = index.store();
        if values.iter().any(|v| *v as usize >= store.values()) || keys.iter().any(|k| *k as usize >= store.strings()) {
            return None;
        }
        Some(Values { index, values, keys })
    }
}

impl Serialize for Values {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let store = self.index.store();
        let mut map = serializer.serialize_map(Some(2))?;
        let values: Vec<View> = self.values.iter().map(|id| store.view(*id)).collect();
        map.serialize_entry("values", &values)?;
        let keys: Vec<&str> = self.keys.iter().map(|id| store.str(*id)).collect();
        map.serialize_entry("keys", &keys)?;
        map.end()
    }
}

/// A server as the functions return it: its facts and what its source reported
/// beside them ([`crate::facts::Node::entries`]), then `certname` unless a fact already has that
/// name.
#[derive(Clone, Copy)]
pub struct Server<'a>(ServerRef<'a>);

impl<'a> From<ServerRef<'a>> for Server<'a> {
    fn from(server: ServerRef<'a>) -> Server<'a> {
        Server(server)
    }
}

/// The Hash itself, name by name, as JSON (`puppet kicker query --render-as json`).
impl Serialize for Server<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (name, entry) in self.entries() {
            match entry {
                Entry::Value(_, value) => map.serialize_entry(name, &value)?,
                Entry::Certname(certname) => map.serialize_entry(name, certname)?,
            }
        }
        map.end()
    }
}

/// One value of a [`Server`].
pub enum Entry<'a> {
    /// A value of the index's store, with its name's string id: bindings may cache
    /// what they convert of either by id, for the life of the index generation
    /// (equal values share one id).
    Value(StrId, View<'a>),
    /// The certname, added when no fact has that name.
    Certname(&'a str),
}

impl<'a> Server<'a> {
    pub fn entries(self) -> impl Iterator<Item = (&'a str, Entry<'a>)> {
        let server = self.0;
        let certname =
            Some(("certname", Entry::Certname(server.certname()))).filter(|_| !server.facts().contains_key("certname"));
        let named = server.named_entries();
        named.map(|(id, name, value)| (name, Entry::Value(id, value))).chain(certname)
    }

    /// [`Self::entries`] without the names' text, for bindings that keep names by
    /// id: [`Self::name`] gives a `Value`'s name, a `Certname`'s is `certname`.
    pub fn entry_ids(self) -> impl Iterator<Item = Entry<'a>> {
        let server = self.0;
        let certname = Some(Entry::Certname(server.certname())).filter(|_| !server.facts().contains_key("certname"));
        server.entry_ids().map(|(id, value)| Entry::Value(id, value)).chain(certname)
    }

    /// The text of a name id an [`Entry::Value`] holds.
    pub fn name(self, id: StrId) -> &'a str {
        self.0.name(id)
    }
}

/// What `status` reports, for operators and tests.
pub struct Status {
    pub index: crate::service::Status,
    /// Masterless: what this process leaves undone at exit (see [`crate::service::Service::work_left`]).
    pub work_left: Vec<&'static str>,
    /// The masterless helper finishing that work, if any ([`crate::helper_presence::describe`]).
    pub helper: Json,
}

impl Status {
    /// Its fields in the order Ruby's Hash has them.
    pub fn fields(&self) -> [(&'static str, Json); 10] {
        let s = &self.index;
        [
            ("servers", s.servers.into()),
            ("index_bytes", s.index_bytes.into()),
            ("built_at", s.built_at.into()),
            ("last_error", s.last_error.clone().into()),
            ("config_file", s.config_file.as_ref().map(|f| f.display().to_string()).into()),
            ("cache_dir", s.cache_dir.display().to_string().into()),
            ("failures", s.failures.into()),
            ("retry_at", s.retry_at.into()),
            ("work_left", self.work_left.clone().into()),
            ("helper", self.helper.clone()),
        ]
    }
}

impl Serialize for Status {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let fields = self.fields();
        let mut map = serializer.serialize_map(Some(fields.len()))?;
        for (name, value) in &fields {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}
