//! The index snapshot (`index.msgpack`) as found in the cache dir, decoded as
//! `snapshot::read` decodes a file's content.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::snapshot;
use std::path::Path;

fuzz_target!(|input: &[u8]| {
    let _ = snapshot::decode(input, Path::new("index.msgpack"));
});
