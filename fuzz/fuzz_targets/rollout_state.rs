//! A saved rollout (`rollout.json`) as found in the cache dir: decoded and checked as
//! `puppet kicker rollout run --resume` and `rollout status` read it, then carried on
//! for a few steps through a transport whose every answer depends on the server (so
//! that started, busy, refused, failed and confirmed runs all happen), aborted, and
//! carried on until it ends or the steps run out; saved again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::kick::{Dispatch, LastRun, Outcome, RunStatus, Server, Transport};
use puppet_kicker::rollout::decode;

/// Answers by the certname's length and first byte: deterministic, and varied.
struct Varied;

fn pick(certname: &str) -> usize {
    certname.len() + usize::from(certname.bytes().next().unwrap_or(0))
}

impl Transport for Varied {
    fn runonce(&self, dispatch: &Dispatch) -> Outcome {
        match pick(&dispatch.target) % 5 {
            0 => Outcome::StartedAt(1_700_000_000_000),
            1 => Outcome::Busy("busy".into()),
            2 => Outcome::Disabled("disabled".into()),
            3 => Outcome::NoReply,
            _ => Outcome::Started,
        }
    }
    fn controls_agents(&self) -> bool {
        true
    }
    fn disable(&self, target: &Server<'_>, _: &str) -> Result<(), String> {
        if pick(target.certname) % 7 == 0 { Err("Already disabled".into()) } else { Ok(()) }
    }
    fn enable(&self, target: &Server<'_>) -> Result<(), String> {
        if pick(target.certname) % 11 == 0 { Err("no reply".into()) } else { Ok(()) }
    }
    fn last_run(&self, target: &Server<'_>) -> Result<LastRun, String> {
        let status = [RunStatus::Changed, RunStatus::Unchanged, RunStatus::Failed][pick(target.certname) % 3];
        Ok(LastRun { at: Some(1_700_000_000_000 + (pick(target.certname) as i64 % 4) * 1_000), status })
    }
}

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Ok(mut rollout) = decode(input) else { return };
    let mut now = 1_700_000_000_000;
    for step in 0..24 {
        if rollout.is_over() {
            break;
        }
        if step == 12 {
            rollout.abort("fuzz");
        }
        std::hint::black_box(rollout.step(&Varied, now));
        let p = rollout.progress();
        assert!(p.done + p.failed + p.running + p.disabled <= p.servers);
        now += 600_000;
    }
    let saved = serde_json::to_vec(&rollout).unwrap();
    assert_eq!(decode(&saved).unwrap(), rollout, "what is saved reads back the same");
});
