//! A report's kicks as the report processor hands them over (wire JSON), then taken
//! in by the fixture fleet's kick service (dry run: nothing is sent).
//!
//! The service is this target's own, with a rate-limit window of one second: the
//! inputs' sources are random names, each its own entry in the rate ledger, which is
//! saved with every kicking report. Over the default hour the ledger grew to hold
//! every source of the last hour's inputs, and saving it became most of the
//! campaign's time (from 6,000 inputs a second down to 800); over one second it holds
//! the last second's, as a real master's holds its fleet's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::Service;
use std::sync::OnceLock;

fn fleet() -> &'static Service {
    static FLEET: OnceLock<Service> = OnceLock::new();
    FLEET.get_or_init(|| {
        let settings = puppet_kicker_fuzz::fleet_settings("  rate_limit:\n    window: 1s\n");
        Service::start(settings).expect("the fixture fleet starts")
    })
}

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Ok(report) = puppet_kicker::kick::parse_report(input) else { return };
    let _ = fleet().kick_report(&report);
});
