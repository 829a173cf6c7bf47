//! A report's kicks as the report processor hands them over (wire JSON), then taken
//! in by the fixture fleet's kick service (dry run: nothing is sent).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Ok(report) = puppet_kicker::kick::parse_report(input) else { return };
    let _ = puppet_kicker_fuzz::fleet().kick_report(&report);
});
