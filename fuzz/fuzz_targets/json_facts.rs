//! A JSON fact file (puppetserver's `facts_terminus = json`) as the puppet cache
//! source decodes it straight into the store, held to the path it replaced (a
//! serde_json tree first): both refuse the same files, and read the same facts from
//! the others. A file that fails half way leaves the builder fit for the next one.
//! The fast path (where it takes the file) and serde_json alone give the same
//! outcome and the same store, id for id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::source::puppet_cache::{
    parse_fact_file, parse_fact_file_via_tree, parse_json_fact_file_with_serde, FactFileError, Format,
};
use puppet_kicker::store::Builder;
use puppet_kicker_fuzz::pool;
use std::path::Path;

const NEXT: &[u8] = br#"{"name": "next", "values": {"b": [1, {"c": "d"}], "a": 2.5}}"#;

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let path = Path::new("fuzz.example.com.json");
    let mut builder = pool::builder();
    let decoded = parse_fact_file(input, Format::Json, path, 7, &mut builder);
    let mut serde_builder = pool::builder();
    let serde_alone = parse_json_fact_file_with_serde(input, path, 7, &mut serde_builder);
    match (&decoded, &serde_alone) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("decoded {decoded:?} but serde_json alone {serde_alone:?}"),
    }
    assert!(builder.store() == serde_builder.store(), "the fast path left another store");
    let mut tree_builder = pool::builder();
    let via_tree = parse_fact_file_via_tree(input, path, 7, &mut tree_builder);
    match (&decoded, &via_tree) {
        (Ok(new), Ok(old)) => {
            assert_eq!((&new.certname, new.timestamp), (&old.certname, old.timestamp));
            let facts = |b: &Builder, id| b.store().view(id).to_json();
            assert_eq!(facts(&builder, new.facts), facts(&tree_builder, old.facts));
        }
        // Both refuse the file. Decoding stops at the first level too deep; the tree
        // is parsed whole first, so it reports a later syntax error (or serde_json's
        // own recursion limit) instead.
        (Err(FactFileError::JsonTooDeep { .. }), Err(FactFileError::Json { .. })) => {}
        (Err(new), Err(old)) => {
            assert_eq!(std::mem::discriminant(new), std::mem::discriminant(old), "{new} / {old}")
        }
        _ => panic!("decoded {decoded:?} but via a tree {via_tree:?}"),
    }
    let next = parse_fact_file(NEXT, Format::Json, Path::new("next.json"), 0, &mut builder).expect("a good file");
    let expected = serde_json::json!({"a": 2.5, "b": [1, {"c": "d"}]});
    assert_eq!(builder.store().view(next.facts).to_json(), expected);
});
