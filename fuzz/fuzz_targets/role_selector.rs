//! `servers_with_role` arguments: `RoleSelector::parse`, then selection in the
//! fixture fleet. Input: roles separated by newlines; the first line is the environment.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::RoleSelector;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else { return };
    let mut lines = text.split('\n');
    let environment = lines.next().unwrap_or_default();
    let roles: Vec<&str> = lines.take(32).collect();
    let Ok(selector) = RoleSelector::parse(&roles) else { return };
    if let Ok(selection) = puppet_kicker_fuzz::fleet().servers_with_role(&selector, environment) {
        std::hint::black_box(selection.nodes().count());
    }
});
