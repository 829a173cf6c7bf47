//! The puppet_cache source on files written by Puppet's own JSON and YAML termini.

use puppet_kicker::source::puppet_cache;
use serde_json::json;
use std::path::PathBuf;

fn fixture(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/puppet_cache").join(dir)
}

#[test]
fn reads_puppetserver_json_and_legacy_yaml_caches() {
    let harvest = puppet_cache::load(&[fixture("server_data/facts"), fixture("yaml/facts")]).unwrap();
    let mut names: Vec<&str> = harvest.observations.iter().map(|o| o.certname.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "lb1.example.com",
            "lb1.example.com",
            "node0.example.com",
            "node1.example.com",
            "node2.example.com",
            "node3.example.com",
            "node9.staging.example.com",
            "node9.staging.example.com",
        ]
    );
    let from_yaml = harvest.observations.iter().rfind(|o| o.certname == "lb1.example.com").unwrap();
    let from_json = harvest.observations.iter().find(|o| o.certname == "lb1.example.com").unwrap();
    assert_eq!(from_yaml.facts, from_json.facts, "both formats carry the same structured facts");
    assert_eq!(from_json.facts["os"]["release"]["full"], json!("12.5"));
    assert_eq!(from_json.facts["memory"]["system"]["total_bytes"], json!(2147483648u64));
    assert!(from_json.timestamp > 1_700_000_000, "timestamp parsed from the file, not defaulted");
    let node0 = harvest.observations.iter().find(|o| o.certname == "node0.example.com").unwrap();
    assert!(from_json.timestamp - node0.timestamp >= 29 * 86_400, "node0's facts are a month old");
}

#[test]
fn unparsable_files_are_skipped_with_a_warning_naming_them() {
    let harvest = puppet_cache::load(&[fixture("server_data/facts"), fixture("yaml/facts")]).unwrap();
    assert_eq!(harvest.warnings.len(), 2, "{:?}", harvest.warnings);
    assert!(harvest.warnings[0].contains("broken.example.com.json") && harvest.warnings[0].contains("invalid JSON"));
    assert!(
        harvest.warnings[1].contains("notfacts.example.com.yaml") && harvest.warnings[1].contains("expected a mapping")
    );
}

#[test]
fn a_missing_directory_is_fine_while_another_is_readable_but_not_when_none_is() {
    assert!(puppet_cache::load(&[fixture("nope"), fixture("yaml/facts")]).is_ok());
    let err = puppet_cache::load(&[fixture("nope"), fixture("also-nope")]).unwrap_err().to_string();
    assert!(err.contains("no fact cache directory could be read") && err.contains("nope (not found)"), "{err}");
}
