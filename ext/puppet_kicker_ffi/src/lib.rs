//! `libpuppet_kicker_ffi.so`: puppet-kicker's core behind a small C ABI, for Rubies
//! that cannot load a C extension: JRuby, so puppetserver, through Ruby's `ffi`. The
//! magnus extension (`ext/puppet_kicker`) and this library expose the same core and
//! convert its values the same way; `lib/puppet_kicker.rb` picks one of them.
//!
//! # The ABI (version [`ABI_VERSION`]; C declarations in `include/puppet_kicker_ffi.h`)
//!
//! | Function | Request (JSON) | `ok` value |
//! | --- | --- | --- |
//! | `uint32_t pk_abi_version(void)` | | (returns the number itself) |
//! | `char *pk_version(void)` | | `"0.1.0 (index format 1)"` |
//! | `char *pk_configure(req, len)` | `{"confdir","vardir","server_datadir"?,"config_file"?}` | `null` |
//! | `char *pk_query(req, len)` | `{"op":"servers_with_role"\|"server_with_role","roles":[..],"environment"}` or `{"op":"servers_with_facts","clauses":[..],"environment"}` | `[server, ..]`, or `server`/`null` for `server_with_role` |
//! | `char *pk_select(req, len)` | as `pk_query` | `{"generation": G, "positions": [P, ..]}`: the selection, by index generation and position (one position at most for `server_with_role`) |
//! | `char *pk_servers_at(req, len)` | `{"generation": G, "positions": [P, ..]}` | `[server, ..]` at those positions, or `null` when the index is no longer generation G |
//! | `char *pk_note_environment(req, len)` | `{"certname","environment"}` | `null` |
//! | `char *pk_take_warnings(void)` | | `["warning", ..]` |
//! | `char *pk_status(void)` | | `{"servers","built_at","last_error","config_file","cache_dir","failures","retry_at","work_left","helper"}` |
//! | `char *pk_kick(req, len)` | a report's kicks, as `lib/puppet_kicker/kick.rb` sends them | `[[level, message], ..]` to log |
//! | `char *pk_kick_flush(void)` | | `[[level, message], ..]` (waits, bounded, for due kicks) |
//! | `char *pk_take_kick_log(void)` | | `[[level, message], ..]` |
//! | `char *pk_kick_status(void)` | | the kick status document, as a JSON text in a string |
//! | `void pk_free(char *)` | | |
//!
//! - A request is `len` bytes of UTF-8 JSON at `req` (no NUL needed).
//! - Every `char *` returned is a new, NUL-terminated UTF-8 JSON document that the
//!   caller owns and must pass to `pk_free` exactly once (nothing else frees it).
//!   It is `{"ok": VALUE}` or `{"error": {"kind": KIND, "message": MESSAGE}}`, with
//!   KIND one of `query`, `config`, `no_data`, `io` (the core's error kinds),
//!   `request` (a malformed request: a bug in the caller), `unsupported`, `internal`.
//! - A server is a JSON object of its facts in the core's order, then `certname`
//!   when no fact has that name: the same Hash, key for key, that the magnus
//!   extension builds.
//! - Errors are data, never a panic crossing the boundary or an abort: every
//!   function runs inside `catch_unwind`; a panic is an `internal` error.
//! - Every function is safe to call from any number of threads at once: the core
//!   is one process-wide service (one per loaded library), which is what every
//!   JRuby instance of a puppetserver shares.
//! - The library is linked "nodelete": `dlclose` never unloads it, so a JRuby
//!   instance going away cannot unmap code the core's refresh thread runs.

use puppet_kicker::kick::{Level, LogLine};
use puppet_kicker::{Kicker, Node, PuppetSettings, RoleSelector, Selection};
use serde::{Deserialize, Serialize};
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

/// Bumped on any change to the functions, requests or replies (2: pk_select and
/// pk_servers_at, so callers can cache servers per index generation).
pub const ABI_VERSION: u32 = 2;

/// An error as it crosses the boundary: a kind the Ruby side maps to an exception
/// class, and the message the magnus extension would give.
#[derive(Debug)]
struct Failure {
    kind: &'static str,
    message: String,
}

impl From<puppet_kicker::Error> for Failure {
    fn from(e: puppet_kicker::Error) -> Failure {
        Failure { kind: e.kind(), message: e.message().to_string() }
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Failure {
        Failure { kind: "internal", message: format!("puppet-kicker internal error: cannot encode a reply: {e}") }
    }
}

type Outcome = Result<(), Failure>;

/// The ABI version this library implements; the Ruby side checks it before anything else.
#[no_mangle]
pub extern "C" fn pk_abi_version() -> u32 {
    ABI_VERSION
}

/// `{"ok": "<crate version> (index format N)"}`.
#[no_mangle]
pub extern "C" fn pk_version() -> *mut c_char {
    reply(|out| write_json(out, puppet_kicker::service::version()))
}

/// Configures the process-wide core from Puppet's settings; a no-op while they are
/// unchanged, a fresh core (configuration re-read) when they differ.
///
/// # Safety
/// `req` must point to `len` readable bytes (or be null with `len == 0`).
#[no_mangle]
pub unsafe extern "C" fn pk_configure(req: *const u8, len: usize) -> *mut c_char {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Configure {
        confdir: String,
        vardir: String,
        #[serde(default)]
        server_datadir: Option<String>,
        #[serde(default)]
        config_file: Option<String>,
    }
    let bytes = request_bytes(req, len);
    reply(|out| {
        let c: Configure = parse(bytes?)?;
        let settings = PuppetSettings {
            confdir: PathBuf::from(c.confdir),
            vardir: PathBuf::from(c.vardir),
            server_datadir: c.server_datadir.map(PathBuf::from),
            config_file: c.config_file.filter(|f| !f.is_empty()).map(PathBuf::from),
        };
        Kicker::configure(settings)?;
        write_json(out, ())
    })
}

/// `servers_with_role`, `server_with_role` and `servers_with_facts`, by `op`.
///
/// # Safety
/// `req` must point to `len` readable bytes (or be null with `len == 0`).
#[no_mangle]
pub unsafe extern "C" fn pk_query(req: *const u8, len: usize) -> *mut c_char {
    let bytes = request_bytes(req, len);
    reply(|out| {
        let (selection, first_only) = select(parse(bytes?)?)?;
        if !first_only {
            return write_servers(out, &selection);
        }
        let first = selection.nodes().next();
        match first {
            Some(node) => write_server(out, node),
            None => write_json(out, ()),
        }
    })
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Query {
    ServersWithRole { roles: Vec<String>, environment: String },
    ServerWithRole { roles: Vec<String>, environment: String },
    ServersWithFacts { clauses: Vec<String>, environment: String },
}

/// Runs a query; true when only its first server is wanted.
fn select(query: Query) -> Result<(Selection, bool), Failure> {
    Ok(match query {
        Query::ServersWithRole { roles, environment } => {
            (Kicker::global()?.servers_with_role(&RoleSelector::parse(&roles)?, &environment)?, false)
        }
        Query::ServerWithRole { roles, environment } => {
            (Kicker::global()?.servers_with_role(&RoleSelector::parse(&roles)?, &environment)?, true)
        }
        Query::ServersWithFacts { clauses, environment } => {
            (Kicker::global()?.servers_with_facts(&clauses, &environment)?, false)
        }
    })
}

/// The selection of a query as index generation and positions: a caller that keeps
/// the servers it converted, per generation, fetches only new ones with
/// `pk_servers_at` instead of parsing every server's facts on every call.
///
/// # Safety
/// `req` must point to `len` readable bytes (or be null with `len == 0`).
#[no_mangle]
pub unsafe extern "C" fn pk_select(req: *const u8, len: usize) -> *mut c_char {
    #[derive(Serialize)]
    struct Selected<'a> {
        generation: u64,
        positions: &'a [u32],
    }
    let bytes = request_bytes(req, len);
    reply(|out| {
        let (selection, first_only) = select(parse(bytes?)?)?;
        let (generation, positions) = selection.positions();
        let positions = if first_only { &positions[..positions.len().min(1)] } else { positions };
        write_json(out, Selected { generation, positions })
    })
}

/// The servers at `positions` of index `generation`, or `null` once that index has
/// been replaced (the caller selects again).
///
/// # Safety
/// `req` must point to `len` readable bytes (or be null with `len == 0`).
#[no_mangle]
pub unsafe extern "C" fn pk_servers_at(req: *const u8, len: usize) -> *mut c_char {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct At {
        generation: u64,
        positions: Vec<u32>,
    }
    let bytes = request_bytes(req, len);
    reply(|out| {
        let at: At = parse(bytes?)?;
        match Kicker::global()?.servers_at(at.generation, &at.positions) {
            Some(selection) => write_servers(out, &selection),
            None => write_json(out, ()),
        }
    })
}

/// Records the environment a certname compiles in.
///
/// # Safety
/// `req` must point to `len` readable bytes (or be null with `len == 0`).
#[no_mangle]
pub unsafe extern "C" fn pk_note_environment(req: *const u8, len: usize) -> *mut c_char {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Note {
        certname: String,
        environment: String,
    }
    let bytes = request_bytes(req, len);
    reply(|out| {
        let n: Note = parse(bytes?)?;
        Kicker::global()?.note_environment(&n.certname, &n.environment);
        write_json(out, ())
    })
}

/// Warnings from refreshes and snapshot reads since the last call (`[]` before
/// the core is configured).
#[no_mangle]
pub extern "C" fn pk_take_warnings() -> *mut c_char {
    reply(|out| write_json(out, Kicker::global().map(|k| k.take_warnings()).unwrap_or_default()))
}

/// The index's size and age, the last refresh error, the configuration in use.
#[no_mangle]
pub extern "C" fn pk_status() -> *mut c_char {
    /// Field order is the order of the magnus extension's Hash.
    #[derive(Serialize)]
    struct Status {
        servers: usize,
        built_at: Option<i64>,
        last_error: Option<String>,
        config_file: Option<String>,
        cache_dir: String,
        failures: u32,
        retry_at: Option<i64>,
        work_left: Vec<&'static str>,
        helper: serde_json::Value,
    }
    reply(|out| {
        let kicker = Kicker::global()?;
        let s = kicker.status();
        write_json(
            out,
            Status {
                servers: s.servers,
                built_at: s.built_at,
                last_error: s.last_error,
                config_file: s.config_file.map(|f| f.display().to_string()),
                cache_dir: s.cache_dir.display().to_string(),
                failures: s.failures,
                retry_at: s.retry_at,
                // A master starts no helper; the same fields as magnus all the same.
                work_left: kicker.work_left(),
                helper: puppet_kicker::helper::describe(&s.cache_dir),
            },
        )
    })
}

/// The `kick` report processor: a report's kicks (the JSON `lib/puppet_kicker/kick.rb`
/// builds) go to the core's planner, which dispatches in the background. `ok`: the
/// lines to log, `[[level, message], ..]`, level one of info, notice, warning, err.
///
/// # Safety
/// `req` must point to `len` readable bytes (or be null with `len == 0`).
#[no_mangle]
pub unsafe extern "C" fn pk_kick(req: *const u8, len: usize) -> *mut c_char {
    let bytes = request_bytes(req, len);
    reply(|out| {
        let report = puppet_kicker::kick::parse_report(bytes?)?;
        write_log(out, Kicker::global()?.kick_report(&report)?)
    })
}

/// Waits (bounded by `kick.exit_wait`) for due kicks to be sent, for a process about
/// to exit. `ok`: the lines to log.
#[no_mangle]
pub extern "C" fn pk_kick_flush() -> *mut c_char {
    reply(|out| write_log(out, Kicker::global().map(|k| k.kick_flush()).unwrap_or_default()))
}

/// What the kick dispatcher logged since the last call. `ok`: the lines to log.
#[no_mangle]
pub extern "C" fn pk_take_kick_log() -> *mut c_char {
    reply(|out| write_log(out, Kicker::global().map(|k| k.take_kick_log()).unwrap_or_default()))
}

/// The kick status document. `ok`: its JSON text, as a string (the text the magnus
/// extension returns, byte for byte).
#[no_mangle]
pub extern "C" fn pk_kick_status() -> *mut c_char {
    reply(|out| write_json(out, Kicker::global()?.kick_status()?.to_string()))
}

/// Frees a reply of any `pk_*` function. Null is ignored.
///
/// # Safety
/// `reply` must be null or a pointer returned by a `pk_*` function of this library,
/// not freed before.
#[no_mangle]
pub unsafe extern "C" fn pk_free(reply: *mut c_char) {
    if !reply.is_null() {
        // Dropping a CString cannot panic; catch_unwind keeps that a promise anyway.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { CString::from_raw(reply) })));
    }
}

/// The request's bytes, or a `request` error for a null pointer with a length.
unsafe fn request_bytes<'a>(req: *const u8, len: usize) -> Result<&'a [u8], Failure> {
    match (req.is_null(), len) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(Failure { kind: "request", message: format!("null request pointer with length {len}") }),
        (false, _) => Ok(unsafe { std::slice::from_raw_parts(req, len) }),
    }
}

fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, Failure> {
    serde_json::from_slice(bytes).map_err(|e| Failure { kind: "request", message: format!("malformed request: {e}") })
}

/// Runs `body`, which appends the JSON of the `ok` value to `out`, and wraps the
/// outcome (or a panic) into a reply the caller frees with `pk_free`.
fn reply(body: impl FnOnce(&mut Vec<u8>) -> Outcome) -> *mut c_char {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut out = Vec::with_capacity(1024);
        out.extend_from_slice(br#"{"ok":"#);
        body(&mut out).map(|()| {
            out.push(b'}');
            out
        })
    }));
    let json = match outcome {
        Ok(Ok(json)) => json,
        Ok(Err(failure)) => error_json(&failure),
        Err(panic) => {
            error_json(&Failure { kind: "internal", message: puppet_kicker::error::internal_error_message(&*panic) })
        }
    };
    // serde_json escapes every control character, so the JSON holds no NUL byte.
    match CString::new(json) {
        Ok(json) => json.into_raw(),
        Err(_) => CString::from(
            c"{\"error\":{\"kind\":\"internal\",\"message\":\"puppet-kicker internal error: NUL in a reply\"}}",
        )
        .into_raw(),
    }
}

fn error_json(failure: &Failure) -> Vec<u8> {
    #[derive(Serialize)]
    struct Error<'a> {
        kind: &'a str,
        message: &'a str,
    }
    #[derive(Serialize)]
    struct Envelope<'a> {
        error: Error<'a>,
    }
    serde_json::to_vec(&Envelope { error: Error { kind: failure.kind, message: &failure.message } })
        .unwrap_or_else(|_| br#"{"error":{"kind":"internal","message":"puppet-kicker internal error"}}"#.to_vec())
}

fn write_json<T: Serialize>(out: &mut Vec<u8>, value: T) -> Outcome {
    Ok(serde_json::to_writer(out, &value)?)
}

/// `[[level, message], ..]`, as the magnus extension's Arrays.
fn write_log(out: &mut Vec<u8>, lines: Vec<LogLine>) -> Outcome {
    let lines: Vec<(&str, String)> = lines
        .into_iter()
        .map(|line| {
            let level = match line.level {
                Level::Info => "info",
                Level::Notice => "notice",
                Level::Warning => "warning",
                Level::Err => "err",
            };
            (level, line.message)
        })
        .collect();
    write_json(out, lines)
}

fn write_servers(out: &mut Vec<u8>, selection: &Selection) -> Outcome {
    out.push(b'[');
    for (i, node) in selection.nodes().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_server(out, node)?;
    }
    out.push(b']');
    Ok(())
}

/// A server as the functions return it: its facts and what its source reported
/// beside them ([`Node::entries`]), then `certname` unless a fact already has that
/// name: the magnus extension's Hash, key for key. (Were an entry named `certname`,
/// the repeated key would replace its value in place in Ruby, as `Hash#[]=` does
/// in the magnus extension.)
fn write_server(out: &mut Vec<u8>, node: &Node) -> Outcome {
    out.push(b'{');
    let mut first = true;
    for (name, value) in node.entries() {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, name)?;
        out.push(b':');
        serde_json::to_writer(&mut *out, value)?;
    }
    if !node.facts.contains_key("certname") {
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(br#""certname":"#);
        serde_json::to_writer(&mut *out, &node.certname)?;
    }
    out.push(b'}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn text(reply: *mut c_char) -> String {
        let text = unsafe { CStr::from_ptr(reply) }.to_str().unwrap().to_string();
        unsafe { pk_free(reply) };
        text
    }

    #[test]
    fn a_panic_is_an_internal_error_not_an_unwind_across_the_boundary() {
        let reply = text(reply(|_| panic!("boom")));
        assert_eq!(reply, r#"{"error":{"kind":"internal","message":"puppet-kicker internal error: boom"}}"#);
    }

    #[test]
    fn replies_wrap_the_value_or_the_error() {
        assert_eq!(text(reply(|out| write_json(out, [1, 2]))), r#"{"ok":[1,2]}"#);
        let failure = || Err(Failure { kind: "query", message: "bad \"clause\"\n".into() });
        assert_eq!(text(reply(|_| failure())), r#"{"error":{"kind":"query","message":"bad \"clause\"\n"}}"#);
    }
}
