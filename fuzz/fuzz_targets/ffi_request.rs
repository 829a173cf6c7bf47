//! Request JSON through the C ABI that puppetserver's JRuby calls: the first byte
//! picks the function, the rest is its request. The library is configured once over
//! the fixture fleet, so requests reach the core behind the JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker_ffi::*;
use std::sync::Once;

type Call = unsafe extern "C" fn(*const u8, usize) -> *mut std::ffi::c_char;
/// By the input's first byte (the seeds in fuzz/corpus-seeds/ffi_request follow it).
const CALLS: [Call; 5] = [pk_select, pk_servers_at, pk_values, pk_note_environment, pk_kick];

fuzz_target!(|input: &[u8]| {
    static CONFIGURED: Once = Once::new();
    CONFIGURED.call_once(|| {
        let settings = puppet_kicker_fuzz::fleet_settings("");
        let request = serde_json::json!({
            "confdir": settings.confdir, "vardir": settings.vardir, "config_file": settings.config_file,
        });
        let request = request.to_string();
        // SAFETY: a valid buffer; the reply is freed by the library.
        unsafe { pk_free(pk_configure(request.as_ptr(), request.len())) };
    });
    let Some((&which, request)) = input.split_first() else { return };
    let call = CALLS[which as usize % CALLS.len()];
    // SAFETY: `request` is valid for its length; the reply is the library's, freed by it.
    unsafe { pk_free(call(request.as_ptr(), request.len())) };
});
