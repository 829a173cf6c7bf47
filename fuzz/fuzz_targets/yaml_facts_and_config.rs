//! YAML from the outside: `yaml::parse` (Puppet's Ruby-tagged fact cache files and
//! puppet_kicker.yaml), a fact file through the puppet cache source, and the
//! configuration file through `Config::parse`.
//!
//! The fact cache decodes YAML straight into the store (`yaml::decode`); it is held
//! to the tree path it replaced (`yaml::parse`, then the store): both refuse with
//! the same error, or give the same value (the same id), and the same server and
//! facts. A file that fails half way leaves the builder fit for the next one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::source::puppet_cache::{parse_fact_file, parse_yaml_fact_file_via_tree, Format};
use puppet_kicker::store::Builder;
use puppet_kicker::{Config, PuppetSettings};
use puppet_kicker_fuzz::pool;
use std::path::Path;
use std::sync::OnceLock;

const NEXT: &[u8] = b"name: next\nvalues:\n  b: [1, {c: d}]\n  a: 2.5\n";

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Ok(text) = std::str::from_utf8(input) else { return };
    let tree = puppet_kicker::yaml::parse(text);
    let mut builder = pool::builder();
    let mark = builder.open();
    match (&tree, puppet_kicker::yaml::decode(text, &mut builder)) {
        (Ok(tree), Ok(id)) => {
            assert_eq!(&builder.store().view(id).to_json(), tree);
            assert_eq!(builder.value(tree), id);
        }
        (Err(old), Err(new)) => {
            assert_eq!(old, &new);
            builder.discard_open(mark);
        }
        (old, new) => panic!("the tree gives {old:?}, the store {new:?}"),
    }
    // Written once per process: a file write per input would be most of the time.
    static SETTINGS: OnceLock<PuppetSettings> = OnceLock::new();
    let settings = SETTINGS.get_or_init(|| puppet_kicker_fuzz::fleet_settings(""));
    let _ = Config::parse(text, settings.config_file.as_deref().expect("a config file"), settings);

    let path = Path::new("fuzz.example.com.yaml");
    let decoded = parse_fact_file(input, Format::Yaml, path, 7, &mut builder);
    let mut tree_builder = pool::builder();
    let via_tree = parse_yaml_fact_file_via_tree(input, path, 7, &mut tree_builder);
    match (&decoded, &via_tree) {
        (Ok(new), Ok(old)) => {
            assert_eq!((&new.certname, new.timestamp), (&old.certname, old.timestamp));
            let facts = |b: &Builder, id| b.store().view(id).to_json();
            assert_eq!(facts(&builder, new.facts), facts(&tree_builder, old.facts));
        }
        (Err(new), Err(old)) => assert_eq!(new.to_string(), old.to_string()),
        _ => panic!("decoded {decoded:?} but via a tree {via_tree:?}"),
    }
    let next = parse_fact_file(NEXT, Format::Yaml, Path::new("next.yaml"), 0, &mut builder).expect("a good file");
    let expected = serde_json::json!({"a": 2.5, "b": [1, {"c": "d"}]});
    assert_eq!(builder.store().view(next.facts).to_json(), expected);
});
