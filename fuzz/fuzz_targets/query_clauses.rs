//! `servers_with_facts` clauses, parsed and matched against the fixture fleet. Input:
//! clauses separated by newlines; the first line is the environment.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else { return };
    let mut lines = text.split('\n');
    let environment = lines.next().unwrap_or_default();
    let clauses: Vec<&str> = lines.take(32).collect();
    if let Ok(selection) = puppet_kicker_fuzz::fleet().servers_with_facts(&clauses, environment) {
        for node in selection.nodes() {
            std::hint::black_box(node.entries().count());
        }
    }
});
