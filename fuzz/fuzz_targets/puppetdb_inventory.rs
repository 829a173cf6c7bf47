//! An answer of PuppetDB's inventory as the puppetdb source decodes it, facts
//! straight into the store: the fast path (where it takes an entry) and serde_json
//! alone give the same entries, warnings, error and store, id for id; a refused
//! answer leaves the builder fit for the next one. The same bytes as the source's
//! two other answers: a listing (certnames and timestamps, each of which must then
//! read as a time) and the nodes deactivated or expired.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::source::puppetdb::decode::{gone, inventory, inventory_with_serde, listing};
use puppet_kicker_fuzz::pool;

const NEXT: &[u8] = br#"[{"certname": "next", "timestamp": "2026-11-26T02:33:00.000Z", "environment": null,
    "facts": {"b": [1, {"c": "d"}], "a": 2.5}, "trusted": {"certname": "next"}}]"#;

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    if let Ok(listed) = listing(input) {
        assert!(listed.iter().all(|l| puppet_kicker::time::parse_timestamp(&l.timestamp).is_some()), "{listed:?}");
    }
    std::hint::black_box(gone(input).ok());
    let (mut builder, mut entries, mut warnings) = (pool::builder(), Vec::new(), Vec::new());
    let decoded = inventory(input, &mut builder, &mut entries, &mut warnings);
    let (mut serde_builder, mut serde_entries, mut serde_warnings) = (pool::builder(), Vec::new(), Vec::new());
    let serde_alone = inventory_with_serde(input, &mut serde_builder, &mut serde_entries, &mut serde_warnings);
    assert_eq!(decoded, serde_alone);
    assert_eq!(entries, serde_entries);
    assert_eq!(warnings, serde_warnings);
    assert!(builder.store() == serde_builder.store(), "the fast path left another store");
    for entry in &entries {
        let facts = builder.store().view(entry.facts).as_object().expect("facts are an object");
        assert!(facts.get("trusted").and_then(|t| t.as_object()).is_some(), "trusted is an object");
    }
    let mut next = Vec::new();
    inventory(NEXT, &mut builder, &mut next, &mut warnings).expect("a good answer");
    let expected = serde_json::json!({"a": 2.5, "b": [1, {"c": "d"}], "trusted": {"certname": "next"}});
    assert_eq!(builder.store().view(next[0].facts).to_json(), expected);
});
