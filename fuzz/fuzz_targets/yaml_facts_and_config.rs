//! YAML from the outside: `yaml::parse` (Puppet's Ruby-tagged fact cache files and
//! puppet_kicker.yaml), a fact file through the puppet cache source, and the
//! configuration file through `Config::parse`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::source::puppet_cache::{parse_fact_file, Format};
use puppet_kicker::store::Builder;
use puppet_kicker::{Config, PuppetSettings};
use std::path::Path;
use std::sync::OnceLock;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else { return };
    let _ = puppet_kicker::yaml::parse(text);
    // Written once per process: a file write per input would be most of the time.
    static SETTINGS: OnceLock<PuppetSettings> = OnceLock::new();
    let settings = SETTINGS.get_or_init(|| puppet_kicker_fuzz::fleet_settings(""));
    let _ = Config::parse(text, settings.config_file.as_deref().expect("a config file"), settings);
    let _ = parse_fact_file(input, Format::Yaml, Path::new("fuzz.example.com.yaml"), 0, &mut Builder::new());
});
