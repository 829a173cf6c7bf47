//! `servers_with_role` arguments: `RoleSelector::parse`, then selection in the
//! fixture fleet. Input: roles separated by newlines; the first line is the environment.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::RoleSelector;

fuzz_target!(|input: &[u8]| {
    let Some((environment, roles)) = puppet_kicker_fuzz::environment_and_arguments(input) else { return };
    let Ok(selector) = RoleSelector::parse(&roles) else { return };
    if let Ok(selection) = puppet_kicker_fuzz::fleet().servers_with_role(&selector, environment) {
        std::hint::black_box(selection.servers().count());
    }
});
