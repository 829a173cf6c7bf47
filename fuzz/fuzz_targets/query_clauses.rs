//! `servers_with_facts` clauses, parsed and matched against the fixture fleet, and
//! the store-backed index held to the serde_json index it replaced (same servers,
//! same order). Input: clauses separated by newlines; the first line is the
//! environment.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::{Freshness, Query};

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Some((environment, clauses)) = puppet_kicker_fuzz::environment_and_arguments(input) else { return };
    if let Ok(selection) = puppet_kicker_fuzz::fleet().servers_with_facts(&clauses, environment) {
        for server in selection.servers() {
            std::hint::black_box(server.entries().count());
        }
    }
    let Ok(query) = Query::parse(&clauses) else { return };
    let (index, reference) = puppet_kicker_fuzz::indexes();
    let fresh = Freshness { now: 0, max_age: u64::MAX / 2 };
    assert_eq!(
        index.with_facts(&query, environment, fresh),
        reference.with_facts(&query, environment, "role", fresh),
        "the store-backed index and the reference disagree on {clauses:?} in {environment:?}"
    );
});
