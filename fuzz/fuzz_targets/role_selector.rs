//! `servers_with_role` arguments: parsed (`RoleSelector::parse`), then selected in the
//! fixture fleet. Input: roles separated by newlines; the first line is the environment.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Some((environment, roles)) = puppet_kicker_fuzz::environment_and_arguments(input) else { return };
    if let Ok(selection) = puppet_kicker_fuzz::fleet().servers_with_role(&roles, environment) {
        std::hint::black_box(selection.servers().count());
    }
});
