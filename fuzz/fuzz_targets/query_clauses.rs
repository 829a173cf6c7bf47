//! `servers_with_facts` clauses, parsed and matched against the fixture fleet. Input:
//! clauses separated by newlines; the first line is the environment.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((environment, clauses)) = puppet_kicker_fuzz::environment_and_arguments(input) else { return };
    if let Ok(selection) = puppet_kicker_fuzz::fleet().servers_with_facts(&clauses, environment) {
        for node in selection.nodes() {
            std::hint::black_box(node.entries().count());
        }
    }
});
