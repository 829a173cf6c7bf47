//! A JSON fact file (puppetserver's `facts_terminus = json`) as the puppet cache
//! source parses a file's content.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::source::puppet_cache::{parse_fact_file, Format};
use std::path::Path;

fuzz_target!(|input: &[u8]| {
    let _ = parse_fact_file(input, Format::Json, Path::new("fuzz.example.com.json"), 0);
});
