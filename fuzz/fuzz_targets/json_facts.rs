//! A JSON fact file (puppetserver's `facts_terminus = json`) through the puppet
//! cache source.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::source::puppet_cache;

fuzz_target!(|input: &[u8]| {
    let file = puppet_kicker_fuzz::scratch_file("json", "fuzz.example.com.json", input);
    let _ = puppet_cache::load(&[file.parent().expect("in a dir").to_path_buf()]);
});
