//! `libpuppet_kicker_ffi.so`: puppet-kicker's core behind a small C ABI, for Rubies
//! that cannot load a C extension: JRuby, so puppetserver, through Ruby's `ffi`. The
//! magnus extension (`ext/puppet_kicker`) and this library call the same entry points
//! ([`puppet_kicker::api`]) and only convert its values; `lib/puppet_kicker.rb`
//! picks one of them.
//!
//! # The ABI (version [`ABI_VERSION`]; C declarations in `include/puppet_kicker_ffi.h`)
//!
//! | Function | Request (JSON) | `ok` value |
//! | --- | --- | --- |
//! | `uint32_t pk_abi_version(void)` | | (returns the number itself) |
//! | `char *pk_version(void)` | | `"0.1.0 (index format 2)"` |
//! | `char *pk_configure(req, len)` | `{"confdir","vardir","server_datadir"?,"config_file"?,"hostcert"?,"hostprivkey"?,"localcacert"?,"hostcrl"?}` | `null` |
//! | `char *pk_select(req, len)` | `{"op":"servers_with_role"\|"server_with_role","roles":[..],"environment"}` or `{"op":"servers_with_facts","clauses":[..],"environment"}`, each with an optional `"known": A` | `{"generation": G, "answer": A, "positions": [P, ..]}`: the selection, by index generation and position (one position at most for `server_with_role`); the same `A` (non-zero) is the same answer to an identical call, and when it is the `known` one, `positions` is left out |
//! | `uint32_t pk_answer_holds(uint64_t A)` | | (returns 1 when answer `A` of `pk_select` is still the answer to that call, queuing a refresh of a stale index as the call would; else 0; no JSON) |
//! | `char *pk_servers_at(req, len)` | `{"generation": G, "positions": [P, ..]}` | `[[[K, ..], [V, ..], certname], ..]`: each server at those positions as its fact names' ids, their values' ids, and the certname to add (or `null`); `null` when the index is no longer generation G |
//! | `void *pk_session_new(void)` | | (a fetch session for one caller, freed with `pk_session_free`) |
//! | `uint8_t *pk_fetch(void *session, uint64_t G, uint64_t have, const uint32_t *positions, size_t count, size_t *length)` | | (binary, see [`fetch`]: the servers at `positions` of index generation G with the fact names and values they hold that the caller lacks, for its table of `have` objects; its length in bytes written to `*length`, which bounds what the caller reads; freed with `pk_free_fetch`) |
//! | `char *pk_values(req, len)` | `{"generation": G, "values": [V, ..], "keys": [K, ..]}` | `{"values": [value, ..], "keys": [name, ..]}`, or `null` when the index is no longer generation G (or an id is not its own) |
//! | `char *pk_note_environment(req, len)` | `{"certname","environment"}` | `null` |
//! | `char *pk_run_helper(req, len)` | as `pk_configure`'s | how the masterless helper ended (`"Done"`, `"AlreadyRunning"`, ..), once it has |
//! | `char *pk_take_log(void)` | | `[[level, message], ..]`: refresh warnings, then kick lines |
//! | `uint32_t pk_log_pending(void)` | | (returns how many lines `pk_take_log` would give now; no JSON) |
//! | `char *pk_status(void)` | | `{"servers","index_bytes","built_at","last_error","config_file","cache_dir","failures","retry_at","work_left","helper"}` |
//! | `char *pk_kick(req, len)` | a report's kicks, as `lib/puppet_kicker/kick.rb` sends them | `[[level, message], ..]` to log |
//! | `char *pk_kick_flush(void)` | | `[[level, message], ..]` (waits, bounded, for due kicks) |
//! | `char *pk_kick_status(void)` | | the kick status document, as a JSON text in a string |
//! | `char *pk_command(req, len)` | `{"name": SUBCOMMAND, "args": {..}}`, a `puppet kicker` subcommand | its answer, as a JSON text in a string |
//! | `void pk_free(char *)` | | |
//! | `void pk_free_fetch(uint8_t *)` | | |
//! | `void pk_session_free(void *)` | | |
//!
//! - A request is `len` bytes of UTF-8 JSON at `req` (no NUL needed).
//! - Every `char *` returned is a new, NUL-terminated UTF-8 JSON document that the
//!   caller owns and must pass to `pk_free` exactly once (nothing else frees it).
//!   It is `{"ok": VALUE}` or `{"error": {"kind": KIND, "message": MESSAGE}}`, with
//!   KIND one of `query`, `config`, `no_data`, `report`, `io` (the core's error
//!   kinds), `request` (a malformed request: a bug in the caller), `internal`.
//! - A server is its facts in the core's order, then `certname` when no fact has
//!   that name ([`api::Server`]): the same Hash, key for key, that the magnus
//!   extension builds. `pk_servers_at` gives it by reference (name and value ids of
//!   the index generation) and `pk_values` the names and values themselves, so a
//!   caller parses each distinct value once per index, not once per server.
//! - Errors are data, never a panic crossing the boundary or an abort: every
//!   function runs inside `catch_unwind`; a panic is an `internal` error.
//! - Every function is safe to call from any number of threads at once: the core
//!   is one process-wide service (one per loaded library), which is what every
//!   JRuby instance of a puppetserver shares.
//! - The library is linked "nodelete": `dlclose` never unloads it, so a JRuby
//!   instance going away cannot unmap code the core's refresh thread runs.

pub mod fetch;

use puppet_kicker::api::{self, Failure};
use serde::{Deserialize, Serialize};
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Bumped on any change to the functions, requests or replies (2: pk_select and
/// pk_servers_at, so callers can cache servers per index generation; 3: pk_query
/// and the `unsupported` kind dropped, pk_take_log replaces pk_take_warnings and
/// pk_take_kick_log, the `report` kind added; 4: pk_select's `answer` and `known`,
/// pk_servers_at by ids, pk_values; 5: pk_log_pending, pk_answer_holds; 6:
/// pk_session_new, pk_fetch, pk_free_fetch, pk_session_free; 7: pk_configure's
/// certificate settings; 8: pk_command; 9: pk_fetch_stream, pk_fetch_next,
/// pk_fetch_stream_free; 10: pk_run_helper; 11: pk_fetch_stream, pk_fetch_next and
/// pk_fetch_stream_free removed; 12: pk_fetch's `length`).
pub const ABI_VERSION: u32 = 12;

/// The ABI version this library implements; the Ruby side checks it before anything else.
#[no_mangle]
pub extern "C" fn pk_abi_version() -> u32 {
    ABI_VERSION
}

/// `char *$name(void)`: the `ok` value is `$call()`'s.
macro_rules! without_request {
    ($(#[$doc:meta])* $name:ident => $call:expr) => {
        $(#[$doc])*
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_char {
            reply(|| Ok($call()?))
        }
    };
}

/// `char *$name(req, len)`: the request is JSON of `$call`'s argument type.
macro_rules! with_request {
    ($(#[$doc:meta])* $name:ident => $call:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `req` must point to `len` readable bytes (or be null with `len == 0`).
        #[no_mangle]
        pub unsafe extern "C" fn $name(req: *const u8, len: usize) -> *mut c_char {
            let bytes = request_bytes(req, len);
            reply(|| Ok($call(parse(bytes?)?)?))
        }
    };
}

with_request!(
    /// Configures the process-wide core from Puppet's settings ([`api::Settings`]);
    /// a no-op while they are unchanged. `ok`: `null`.
    pk_configure => api::configure);
with_request!(
    /// A query ([`api::Query`]) as index generation and positions: a caller that
    /// keeps the servers it converted, per generation, fetches only new ones with
    /// `pk_servers_at` instead of parsing every server's facts on every call.
    pk_select => api::select_known);
with_request!(
    /// The servers at `positions` of index `generation`, or `null` once that index
    /// has been replaced (the caller selects again).
    pk_servers_at => api::servers_at);
with_request!(
    /// Values and fact names of index `generation` by id, for the servers
    /// `pk_servers_at` gave: `{"values": [..], "keys": [..]}`, or `null` once that
    /// index has been replaced.
    pk_values => api::values_at);
with_request!(
    /// Records the environment a certname compiles in. `ok`: `null`.
    pk_note_environment => api::note_environment);
with_request!(
    /// The masterless helper ([`api::run_helper`]): finishes, in this process, what a
    /// `puppet apply` left undone for these settings (`pk_configure`'s request), and
    /// returns when it is done (or another helper holds the cache directory). `ok`:
    /// how it ended, as a string. For `lib/puppet_kicker/helper.rb` on an MRI whose
    /// magnus extension was built for another Ruby.
    pk_run_helper => api::run_helper);
without_request!(
    /// `{"ok": "<crate version> (index format N)"}`.
    pk_version => api::version);
without_request!(
    /// What to log since the last call: refresh warnings, then kick lines (`[]`
    /// before the core is configured).
    pk_take_log => api::take_log);
/// 1 when `answer`, a non-zero answer id `pk_select` gave, is still what that
/// identical call would get now: the same index generation, the answer still kept,
/// none of its servers past `max_age`. Then, exactly as the call would, it queues a
/// refresh when the index is older than `cache.ttl`. 0 otherwise (0, an unknown or
/// replaced id, no index, not configured, a panic): the caller makes the call with
/// `pk_select`, which answers and reports any error. No JSON either way, so a
/// caller that kept what it built for `answer` returns it for the cost of one call.
#[no_mangle]
pub extern "C" fn pk_answer_holds(answer: u64) -> u32 {
    catch_unwind(|| api::answer_holds(answer)).map_or(0, u32::from)
}

/// How many lines `pk_take_log` would give now (0 before the core is configured),
/// with no JSON either way, so a caller skips `pk_take_log` when there is nothing
/// to take. Lines logged right after are taken by the next call. Saturates at
/// `u32::MAX`; a panic (a bug) answers 1, so the caller takes the log.
#[no_mangle]
pub extern "C" fn pk_log_pending() -> u32 {
    catch_unwind(api::log_pending).unwrap_or(1)
}

without_request!(
    /// The index's size and age, the last refresh error, the configuration in use.
    pk_status => api::status);
without_request!(
    /// Waits (bounded by `kick.exit_wait`) for due kicks to be sent, for a process
    /// about to exit. `ok`: the lines to log.
    pk_kick_flush => api::kick_flush);
without_request!(
    /// The kick status document. `ok`: its JSON text, as a string.
    pk_kick_status => api::kick_status);

/// The `kick` report processor: a report's kicks (the JSON `lib/puppet_kicker/kick.rb`
/// builds, passed on as bytes) to the core's planner. `ok`: the lines to log,
/// `[[level, message], ..]`, level one of info, notice, warning, err.
///
/// # Safety
/// `req` must point to `len` readable bytes (or be null with `len == 0`).
#[no_mangle]
pub unsafe extern "C" fn pk_kick(req: *const u8, len: usize) -> *mut c_char {
    let bytes = request_bytes(req, len);
    reply(|| Ok(api::kick_report(bytes?)?))
}

/// A `puppet kicker` subcommand (`{"name", "args"}`, see `puppet_kicker::command`).
/// `ok`: its answer, as a JSON text in a string.
///
/// # Safety
/// `req` must point to `len` readable bytes (or be null with `len == 0`).
#[no_mangle]
pub unsafe extern "C" fn pk_command(req: *const u8, len: usize) -> *mut c_char {
    let bytes = request_bytes(req, len);
    reply(|| Ok(api::command(bytes?)?))
}

/// A new fetch session ([`fetch::Session`]): what one caller holds of an index
/// generation, so `pk_fetch` sends each name and value once. Free it with
/// `pk_session_free`. Null only if the allocation panicked.
#[no_mangle]
pub extern "C" fn pk_session_new() -> *mut fetch::Session {
    catch_unwind(|| Box::into_raw(Box::default())).unwrap_or(std::ptr::null_mut())
}

/// Frees a session of `pk_session_new`. Null is ignored.
///
/// # Safety
/// `session` must be null or a pointer `pk_session_new` returned, not freed
/// before, and no `pk_fetch` may be using it.
#[no_mangle]
pub unsafe extern "C" fn pk_session_free(session: *mut fetch::Session) {
    if !session.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(session) })));
    }
}

/// The servers at `count` `positions` of index `generation`, with the names and
/// values they hold that the caller, holding `have` objects of `session`, lacks:
/// one binary buffer ([`fetch`]) that the caller passes to `pk_free_fetch` exactly
/// once. Its length in bytes is written to `*length` (unless `length` is null): a
/// caller reads no byte past it, and checks the buffer's first 8 bytes, its own
/// record of its length, against it. A stale generation or a position beyond the
/// index is [`fetch::STALE`]; an error or a panic, [`fetch::FAILED`] with the JSON
/// error. Never null.
///
/// # Safety
/// `session` must be null or a live session of `pk_session_new`; `positions` must
/// point to `count` readable u32s (or be null with `count == 0`); `length` must be
/// null or point to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn pk_fetch(
    session: *const fetch::Session,
    generation: u64,
    have: u64,
    positions: *const u32,
    count: usize,
    length: *mut usize,
) -> *mut u8 {
    let reply = match (unsafe { session.as_ref() }, unsafe { positions_at(positions, count) }) {
        (None, _) => fetch::failed(Failure::request("null session".to_string())),
        (_, Err(message)) => fetch::failed(Failure::request(message)),
        (Some(session), Ok(positions)) => catch_unwind(AssertUnwindSafe(|| session.fetch(generation, have, positions)))
            .unwrap_or_else(|panic| fetch::failed(Failure::panic(&*panic))),
    };
    if let Some(length) = unsafe { length.as_mut() } {
        *length = reply.bytes().len();
    }
    reply.into_raw()
}

/// `count` positions at `positions`.
///
/// # Safety
/// `positions` must point to `count` readable u32s (or be null with `count == 0`).
unsafe fn positions_at<'a>(positions: *const u32, count: usize) -> Result<&'a [u32], String> {
    match (positions.is_null(), count) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(format!("null positions with count {count}")),
        (false, _) => Ok(unsafe { std::slice::from_raw_parts(positions, count) }),
    }
}

/// Frees a reply of `pk_fetch`. Null is ignored.
///
/// # Safety
/// `reply` must be null or a pointer `pk_fetch` returned, not freed before.
#[no_mangle]
pub unsafe extern "C" fn pk_free_fetch(reply: *mut u8) {
    if !reply.is_null() {
        // Kept for the next reply, or freed (locking cannot panic: catch_unwind keeps that a promise).
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { fetch::Reply::from_raw(reply) })));
    }
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
        (true, _) => Err(Failure::request(format!("null request pointer with length {len}"))),
        (false, _) => Ok(unsafe { std::slice::from_raw_parts(req, len) }),
    }
}

fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, Failure> {
    serde_json::from_slice(bytes).map_err(|e| Failure::request(format!("malformed request: {e}")))
}

/// Runs `body` and wraps its value, its failure or its panic into a reply the
/// caller frees with `pk_free`.
fn reply<T: Serialize>(body: impl FnOnce() -> Result<T, Failure>) -> *mut c_char {
    #[derive(Serialize)]
    #[serde(rename_all = "lowercase")]
    enum Reply<T> {
        Ok(T),
        Error(Failure),
    }
    let encoded = catch_unwind(AssertUnwindSafe(|| {
        let reply = match body() {
            Ok(value) => Reply::Ok(value),
            Err(failure) => Reply::Error(failure),
        };
        serde_json::to_vec(&reply).or_else(|e| {
            serde_json::to_vec(&Reply::<()>::Error(Failure::internal(format!("cannot encode a reply: {e}"))))
        })
    }));
    let json = match encoded {
        Ok(Ok(json)) => Ok(json),
        Ok(Err(e)) => Err(Failure::internal(e)),
        Err(panic) => Err(Failure::panic(&*panic)),
    }
    .or_else(|failure| serde_json::to_vec(&Reply::<()>::Error(failure)));
    // serde_json escapes every control character, so the JSON holds no NUL byte.
    match json.ok().and_then(|json| CString::new(json).ok()) {
        Some(json) => json.into_raw(),
        None => CString::from(c"{\"error\":{\"kind\":\"internal\",\"message\":\"puppet-kicker internal error\"}}")
            .into_raw(),
    }
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
        let reply = text(reply::<()>(|| panic!("boom")));
        assert_eq!(reply, r#"{"error":{"kind":"internal","message":"puppet-kicker internal error: boom"}}"#);
    }

    #[test]
    fn replies_wrap_the_value_or_the_error() {
        assert_eq!(text(reply(|| Ok([1, 2]))), r#"{"ok":[1,2]}"#);
        let failure = || Err::<(), _>(Failure::from(puppet_kicker::Error::Query("bad \"clause\"\n".into())));
        assert_eq!(text(reply(failure)), r#"{"error":{"kind":"query","message":"bad \"clause\"\n"}}"#);
    }
}
