//! The index snapshot (`index.msgpack`) as found in the cache dir.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::snapshot;

fuzz_target!(|input: &[u8]| {
    let file = puppet_kicker_fuzz::scratch_file("snapshot", "index.msgpack", input);
    let _ = snapshot::read(&file);
});
