//! Requests through the C ABI that puppetserver's JRuby calls: the first byte picks
//! the function, the rest is its request. The library is configured once over the
//! fixture fleet, so requests reach the core behind the JSON: `pk_select`,
//! `pk_servers_at`, `pk_values`, `pk_note_environment`, `pk_kick` and `pk_command`
//! (the `puppet kicker` subcommands) take the rest as JSON; `pk_fetch` takes `have`
//! (a byte) and positions (u32s) over the current generation (or the next, stale
//! one), and `pk_answer_holds` an answer id.
//!
//! Every reply is a JSON document, never an `internal` error (a panic the library
//! caught); a fetch reply's length, handed over beside it, is its own record of it
//! and its parts', it is never FAILED, and when OK it gives as many servers as
//! positions were asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker_ffi::fetch::{FAILED, HEADER_BYTES, OK, STALE};
use puppet_kicker_ffi::*;
use std::ffi::{c_char, CStr};
use std::sync::Once;

type Call = unsafe extern "C" fn(*const u8, usize) -> *mut c_char;
/// By the input's first byte (the seeds in fuzz/corpus-seeds/ffi_request follow it);
/// 5 is `pk_command`, 6 `pk_fetch`, 7 `pk_answer_holds`.
const CALLS: [Call; 5] = [pk_select, pk_servers_at, pk_values, pk_note_environment, pk_kick];
const WAYS: usize = 8;

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    static CONFIGURED: Once = Once::new();
    CONFIGURED.call_once(|| {
        let settings = puppet_kicker_fuzz::fleet_settings("");
        let request = serde_json::json!({
            "confdir": settings.confdir, "vardir": settings.vardir, "config_file": settings.config_file,
        });
        let request = request.to_string();
        // SAFETY: a valid buffer; the reply is freed by the library.
        unsafe { json_reply(pk_configure(request.as_ptr(), request.len())) };
    });
    let Some((&which, request)) = input.split_first() else { return };
    match which as usize % WAYS {
        5 if !waits(request) => unsafe { json_reply(pk_command(request.as_ptr(), request.len())) },
        5 => {}
        6 => fetches(request),
        7 => {
            let answer = request.iter().take(8).fold(0u64, |a, &b| a << 8 | u64::from(b));
            assert!(pk_answer_holds(answer) <= 1);
        }
        // SAFETY: `request` is valid for its length; the reply is the library's, freed by it.
        i => unsafe { json_reply(CALLS[i](request.as_ptr(), request.len())) },
    }
});

/// Checks and frees a reply of the JSON functions: `{"ok": ..}` or `{"error": ..}`.
///
/// # Safety
/// `reply` is a reply of a `pk_*` JSON function, freed here.
unsafe fn json_reply(reply: *mut c_char) {
    assert!(!reply.is_null());
    let text = unsafe { CStr::from_ptr(reply) }.to_str().expect("a UTF-8 reply");
    let value: serde_json::Value = serde_json::from_str(text).expect("a JSON reply");
    assert!(value.get("ok").is_some() != value.get("error").is_some(), "{text}");
    assert_ne!(value["error"]["kind"], "internal", "{text}");
    unsafe { pk_free(reply) };
}

/// A subcommand that waits on purpose (for a kick's outcome, up to `--wait` or
/// `kick.exit_wait`; for a refresh's end, up to a second): not fuzzed, as libFuzzer
/// would count the wait as a hang. Their arguments are read as the others' are.
fn waits(request: &[u8]) -> bool {
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(request) else { return false };
    let args = &request["args"];
    match request["name"].as_str() {
        Some("kick") => args["dry_run"] != true && args["wait"] != 0,
        Some("refresh_progress") => args["wait_ms"].as_u64().is_some_and(|ms| ms > 0),
        _ => false,
    }
}

/// `pk_fetch` of the positions in `request` (after its first byte, `have`), in a
/// new session.
fn fetches(request: &[u8]) {
    let Some((&have, rest)) = request.split_first() else { return };
    let positions: Vec<u32> =
        rest.chunks_exact(4).take(64).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes"))).collect();
    let current = puppet_kicker::Service::global().ok().and_then(|s| s.current()).map_or(0, |i| i.generation());
    // Now and then a generation that is not the current one: the reply is STALE.
    let generation = current + u64::from(have >> 7);
    let have = u64::from(have & 0x7f);
    let session = pk_session_new();
    // SAFETY: a live session; the positions are valid for their count; the reply is
    // freed once, the session last.
    unsafe {
        let mut length = 0;
        let reply = pk_fetch(session, generation, have, positions.as_ptr(), positions.len(), &mut length);
        let servers = fetched(reply, length);
        assert!(servers.is_none_or(|n| n == positions.len()), "{servers:?} of {} servers", positions.len());
        pk_session_free(session);
    }
}

/// The servers of a fetch reply of `length` bytes, as `pk_fetch` handed it over
/// (`None`: STALE), its layout checked; frees it.
///
/// # Safety
/// `reply` is a reply of `pk_fetch`, freed here, and `length` the length it gave.
unsafe fn fetched(reply: *mut u8, length: usize) -> Option<usize> {
    assert!(!reply.is_null());
    assert!(length >= HEADER_BYTES, "a header at least: {length}");
    let own = unsafe { reply.cast::<u64>().read_unaligned() } as usize;
    assert_eq!(own, length, "the reply's own length is the one handed over");
    let bytes = unsafe { std::slice::from_raw_parts(reply, length) };
    let field = |i: usize| u32::from_ne_bytes(bytes[8 + 4 * i..12 + 4 * i].try_into().expect("4 bytes")) as usize;
    let (status, servers, words, text, json) = (field(0), field(5), field(6), field(7), field(8));
    assert_eq!(length, HEADER_BYTES + 4 * words + text + json, "the reply's length is its parts'");
    if status == FAILED as usize {
        let error = String::from_utf8_lossy(&bytes[length - json..]);
        panic!("a FAILED reply: {error}");
    }
    unsafe { pk_free_fetch(reply) };
    match status as u32 {
        OK => Some(servers),
        STALE => None,
        other => panic!("status {other}"),
    }
}
