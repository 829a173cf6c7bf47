//! The one door both bindings use: the magnus extension (`ext/puppet_kicker`) and
//! the C-ABI library (`ext/puppet_kicker_ffi`) call these functions and only
//! convert values, so a rule about what Ruby sees lives here, once.
//!
//! - Requests are Rust types ([`Settings`], [`Query`], ...), deserializable so the
//!   C ABI takes them as JSON and the magnus extension builds them from arguments.
//! - Replies are Rust types that serialize to what Ruby gets: [`Selected`],
//!   [`Server`] (a server's entries, `certname` added), [`Status`], [`LogLine`].
//! - Failures carry one [`Kind`]; `PuppetKicker::ERRORS` in `lib/puppet_kicker.rb`
//!   maps each kind's name to the exception class Ruby raises.
//!
//! A new function: its core code, a function here, one line per binding, the
//! Puppet function file.

use crate::config::PuppetSettings;
use crate::error::{internal_error_message, Error, Result};
use crate::index::ServerRef;
use crate::log::{Level, LogLine};
use crate::service::{Selection, Service};
use crate::store::{StrId, View};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value as Json;
use std::path::PathBuf;
use std::sync::OnceLock;

pub use crate::error::Kind;

/// Puppet's settings as strings, as both bindings receive them; an empty
/// `server_datadir`, `config_file` or certificate path means not given.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub confdir: String,
    pub vardir: String,
    #[serde(default)]
    pub server_datadir: Option<String>,
    #[serde(default)]
    pub config_file: Option<String>,
    /// Puppet's own certificate, key, CA and CRL: the PuppetDB source's defaults.
    #[serde(default)]
    pub hostcert: Option<String>,
    #[serde(default)]
    pub hostprivkey: Option<String>,
    #[serde(default)]
    pub localcacert: Option<String>,
    #[serde(default)]
    pub hostcrl: Option<String>,
}

impl Settings {
    /// The names of the certificate settings, as Puppet and both bindings spell them.
    pub const SSL: [&'static str; 4] = ["hostcert", "hostprivkey", "localcacert", "hostcrl"];

    /// Sets the certificate setting `name` (one of [`Settings::SSL`]); false for any other name.
    pub fn set_ssl(&mut self, name: &str, path: Option<String>) -> bool {
        let slot = match name {
            "hostcert" => &mut self.hostcert,
            "hostprivkey" => &mut self.hostprivkey,
            "localcacert" => &mut self.localcacert,
            "hostcrl" => &mut self.hostcrl,
            _ => return false,
        };
        *slot = path;
        true
    }
}

impl From<Settings> for PuppetSettings {
    fn from(s: Settings) -> PuppetSettings {
        let given = |path: Option<String>| path.filter(|p| !p.is_empty()).map(PathBuf::from);
        PuppetSettings {
            confdir: PathBuf::from(s.confdir),
            vardir: PathBuf::from(s.vardir),
            server_datadir: given(s.server_datadir),
            config_file: given(s.config_file),
            hostcert: given(s.hostcert),
            hostprivkey: given(s.hostprivkey),
            localcacert: given(s.localcacert),
            hostcrl: given(s.hostcrl),
        }
    }
}

/// A query function's call, by name (`op` in JSON).
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Query {
    ServersWithRole {
        roles: Vec<String>,
        environment: String,
    },
    /// The first server only, or none.
    ServerWithRole {
        roles: Vec<String>,
        environment: String,
    },
    ServersWithFacts {
        clauses: Vec<String>,
        environment: String,
    },
}

/// `pk_select`'s request: a [`Query`] (its fields at the top level) and, in `known`,
/// the answer id the caller holds for that same query (absent or 0: none). When the
/// answer is still that one, the reply leaves the positions out: a caller that kept
/// the Array it built returns it without reading a position.
#[derive(Debug)]
pub struct Select {
    pub query: Query,
    pub known: u64,
}

impl<'de> Deserialize<'de> for Select {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Select, D::Error> {
        use serde::de::Error as _;
        let mut fields = serde_json::Map::<String, Json>::deserialize(deserializer)?;
        let known = match fields.remove("known") {
            None | Some(Json::Null) => 0,
            Some(value) => {
                value.as_u64().ok_or_else(|| D::Error::custom("`known` must be an answer id (an unsigned integer)"))?
            }
        };
        let query = Query::deserialize(Json::Object(fields)).map_err(D::Error::custom)?;
        Ok(Select { query, known })
    }
}

/// Servers to fetch by position from index `generation` (the C ABI's cache).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServersAt {
    pub generation: u64,
    pub positions: Vec<u32>,
}

/// Store values and fact names of index `generation`, by id (the C ABI's
/// `pk_values`): what a caller lacks to build the servers `pk_servers_at` gave it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValuesAt {
    pub generation: u64,
    #[serde(default)]
    pub values: Vec<u32>,
    #[serde(default)]
    pub keys: Vec<u32>,
}

/// `note_environment`'s arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoteEnvironment {
    pub certname: String,
    pub environment: String,
}

/// A failure as it crosses into Ruby: its kind and its message.
#[derive(Debug, Serialize)]
pub struct Failure {
    #[serde(serialize_with = "kind_name")]
    pub kind: Kind,
    pub message: String,
}

fn kind_name<S: Serializer>(kind: &Kind, serializer: S) -> std::result::Result<S::Ok, S::Error> {
    serializer.serialize_str(kind.as_str())
}

impl Failure {
    /// A panic caught in a binding or the core.
    pub fn panic(panic: &(dyn std::any::Any + Send)) -> Failure {
        Failure { kind: Kind::Internal, message: internal_error_message(panic) }
    }

    /// A request the C ABI cannot read: a bug in the caller.
    pub fn request(message: String) -> Failure {
        Failure { kind: Kind::Request, message }
    }

    pub fn internal(what: impl std::fmt::Display) -> Failure {
        Failure { kind: Kind::Internal, message: format!("puppet-kicker internal error: {what}") }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure { kind: e.kind(), message: e.to_string() }
    }
}

/// Configures the process-wide service; a no-op while the settings are unchanged.
pub fn configure(settings: Settings) -> Result<()> {
    Service::configure(settings.into()).map(drop)
}

/// A query's servers: by index generation and position, so a binding can convert
/// each server once per index.
pub fn select(query: Query) -> Result<Selected> {
    let service = Service::global()?;
    let (selection, first_only) = match query {
        Query::ServersWithRole { roles, environment } => (service.servers_with_role(&roles, &environment)?, false),
        Query::ServerWithRole { roles, environment } => (service.servers_with_role(&roles, &environment)?, true),
        Query::ServersWithFacts { clauses, environment } => {
            (service.servers_with_facts(&clauses, &environment)?, false)
        }
    };
    Ok(Selected { selection, first_only, known: 0 })
}

/// [`select`] for a caller that may hold the answer already ([`Select::known`]).
pub fn select_known(request: Select) -> Result<Selected> {
    let mut selected = select(request.query)?;
    selected.known = request.known;
    Ok(selected)
}

/// Whether `answer`, an answer id [`select`] gave, is still what an identical call
/// would get ([`Service::answer_holds`]; it queues a refresh of a stale index, as
/// the call would). False for 0, an id not kept or aged out, or no service or
/// index: the caller then makes the call, which answers and reports any error.
pub fn answer_holds(answer: u64) -> bool {
    answer != 0 && Service::global().is_ok_and(|service| service.answer_holds(answer))
}

/// The servers at `at.positions` of index `at.generation`, or `None` once that
/// index has been replaced (the caller selects again).
pub fn servers_at(at: ServersAt) -> Result<Option<Servers>> {
    Ok(Service::global()?.servers_at(at.generation, &at.positions).map(Servers))
}

/// The values and names `at` asks for, or `None` once that index has been replaced
/// or when an id is not one of its own (the caller selects again).
pub fn values_at(at: ValuesAt) -> Result<Option<Values>> {
    let Some(index) = Service::global()?.index_at(at.generation) else { return Ok(None) };
    let store = index.store();
    if at.values.iter().any(|v| *v as usize >= store.values()) || at.keys.iter().any(|k| *k as usize >= store.strings())
    {
        return Ok(None);
    }
    Ok(Some(Values { index, at }))
}

/// Records the environment a certname compiles in.
pub fn note_environment(note: NoteEnvironment) -> Result<()> {
    Service::global()?.note_environment(&note.certname, &note.environment);
    Ok(())
}

/// Everything to log since the last call: refresh and snapshot warnings, then what
/// the kick dispatcher logged (nothing before the service is configured).
pub fn take_log() -> Result<Vec<LogLine>> {
    let Ok(service) = Service::global() else { return Ok(Vec::new()) };
    let mut lines: Vec<LogLine> =
        service.take_warnings().into_iter().map(|warning| LogLine::new(Level::Warning, warning)).collect();
    lines.append(&mut service.take_kick_log());
    Ok(lines)
}

/// How many lines [`take_log`] would return now (0 before the service is
/// configured), so a binding for which that call is dear skips it when there is
/// nothing to take. Lines may arrive just after: the next call takes them.
pub fn log_pending() -> u32 {
    let Ok(service) = Service::global() else { return 0 };
    let pending = service.warnings_pending() + service.kick_log_pending();
    u32::try_from(pending).unwrap_or(u32::MAX)
}

/// The index's size and age, the last refresh error, the configuration in use and
/// what this process leaves undone.
pub fn status() -> Result<Status> {
    let service = Service::global()?;
    let index = service.status();
    // A master starts no helper; the same fields all the same.
    let helper = crate::helper::describe(&index.cache_dir);
    Ok(Status { index, work_left: service.work_left(), helper })
}

/// The `kick` report processor: a report's kicks (the JSON `lib/puppet_kicker/kick.rb`
/// builds) to the planner; returns what to log.
pub fn kick_report(report: &[u8]) -> Result<Vec<LogLine>> {
    let report = crate::kick::parse_report(report)?;
    Service::global()?.kick_report(&report)
}

/// Waits (bounded by `kick.exit_wait`) for due kicks to be sent, for a process
/// about to exit; returns what to log.
pub fn kick_flush() -> Result<Vec<LogLine>> {
    Ok(Service::global().map(|s| s.kick_flush()).unwrap_or_default())
}

/// The kick status document, as JSON text.
pub fn kick_status() -> Result<String> {
    Ok(Service::global()?.kick_status()?.to_string())
}

/// The masterless helper's one call (lib/puppet_kicker/helper.rb): finishes the
/// cache dir's refresh and pending kicks, then says how it ended.
pub fn run_helper(settings: Settings) -> Result<String> {
    crate::helper::run(settings.into()).map(|ending| format!("{ending:?}"))
}

/// A `puppet kicker` subcommand ([`crate::command`]): `{"name", "args"}` in, its
/// answer as JSON text out.
pub fn command(request: &[u8]) -> Result<String> {
    crate::command::run(request)
}

/// `<crate version> (index format N)`, for bindings that want the core they loaded.
pub fn version() -> Result<&'static str> {
    static VERSION: OnceLock<String> = OnceLock::new();
    Ok(VERSION
        .get_or_init(|| format!("{} (index format {})", env!("CARGO_PKG_VERSION"), crate::snapshot::FORMAT_VERSION)))
}

/// A query's answer. Serialized (the C ABI's `pk_select`): `{"generation": G,
/// "answer": A, "positions": [P, ..]}`, or `{"generation": G, "answer": A}` when A
/// is the non-zero answer id the caller said it holds ([`Select::known`]).
pub struct Selected {
    selection: Selection,
    first_only: bool,
    known: u64,
}

impl Selected {
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
/// each K and V once per index generation ([`values_at`]) and builds every server
/// from them, as the magnus extension does, instead of parsing every server's facts
/// again.
pub struct Servers(Selection);

impl Servers {
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
    index: std::sync::Arc<crate::index::Index>,
    at: ValuesAt,
}

impl Serialize for Values {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let store = self.index.store();
        let mut map = serializer.serialize_map(Some(2))?;
        let values: Vec<View> = self.at.values.iter().map(|id| store.view(*id)).collect();
        map.serialize_entry("values", &values)?;
        let keys: Vec<&str> = self.at.keys.iter().map(|id| store.str(*id)).collect();
        map.serialize_entry("keys", &keys)?;
        map.end()
    }
}

/// A server as the functions return it: its facts and what its source reported
/// beside them ([`Node::entries`]), then `certname` unless a fact already has that
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
    /// Masterless: what this process leaves undone at exit (see [`Service::work_left`]).
    pub work_left: Vec<&'static str>,
    /// The masterless helper finishing that work, if any ([`crate::helper::describe`]).
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
