//! The one door both bindings use: the magnus extension (`ext/puppet_kicker`) and
//! the C-ABI library (`ext/puppet_kicker_ffi`) call these functions and only
//! convert values, so a rule about what Ruby sees lives here, once.
//!
//! - Requests are Rust types ([`Settings`], [`Query`], ...), deserializable so the
//!   C ABI takes them as JSON and the magnus extension builds them from arguments.
//! - Replies are Rust types that serialize to what Ruby gets ([`crate::reply`]):
//!   [`Selected`], [`Server`] (a server's entries, `certname` added), [`Status`],
//!   [`LogLine`].
//! - Failures carry one [`Kind`]; `PuppetKicker::ERRORS` in `lib/puppet_kicker.rb`
//!   maps each kind's name to the exception class Ruby raises.
//!
//! A new function: its core code, a function here, one line per binding, the
//! Puppet function file.

use crate::config::PuppetSettings;
use crate::error::{internal_error_message, Error, Result};
use crate::log::{Level, LogLine};
use crate::service::Service;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value as Json;
use std::path::PathBuf;
use std::sync::OnceLock;

pub use crate::error::Kind;
pub use crate::reply::{Entry, IdCounts, Selected, Server, Servers, Status, Values};

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
    select_known(Select { query, known: 0 })
}

/// [`select`] for a caller that may hold the answer already ([`Select::known`]).
pub fn select_known(request: Select) -> Result<Selected> {
    let service = Service::global()?;
    let (selection, first_only) = match request.query {
        Query::ServersWithRole { roles, environment } => (service.servers_with_role(&roles, &environment)?, false),
        Query::ServerWithRole { roles, environment } => (service.servers_with_role(&roles, &environment)?, true),
        Query::ServersWithFacts { clauses, environment } => {
            (service.servers_with_facts(&clauses, &environment)?, false)
        }
    };
    Ok(Selected::new(selection, first_only, request.known))
}

/// Whether `answer`, an answer id [`select`] gave, is still what an identical call
/// would get ([`crate::service::IndexService::answer_holds`]; it queues a refresh of a stale index, as
/// the call would). False for 0, an id not kept or aged out, or no service or
/// index: the caller then makes the call, which answers and reports any error.
pub fn answer_holds(answer: u64) -> bool {
    answer != 0 && Service::global().is_ok_and(|service| service.answer_holds(answer))
}

/// The servers at `at.positions` of index `at.generation`, or `None` once that
/// index has been replaced (the caller selects again).
pub fn servers_at(at: ServersAt) -> Result<Option<Servers>> {
    Ok(Service::global()?.servers_at(at.generation, &at.positions).map(Servers::new))
}

/// The values and names `at` asks for, or `None` once that index has been replaced
/// or when an id is not one of its own (the caller selects again).
pub fn values_at(at: ValuesAt) -> Result<Option<Values>> {
    let Some(index) = Service::global()?.index_at(at.generation) else { return Ok(None) };
    Ok(Values::new(index, at.values, at.keys))
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
    let helper = crate::helper_presence::describe(&index.cache_dir);
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
    crate::masterless_helper::run(settings.into()).map(|ending| format!("{ending:?}"))
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
