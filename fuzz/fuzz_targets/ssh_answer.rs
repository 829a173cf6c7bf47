//! What an `ssh` run to a target brought back (its exit status, stdout and stderr,
//! each as much as was kept of it), read as the planner's outcome
//! (`kick::ssh::read_answer`). The target's answer line and its other output are
//! outside bytes: a compromised or misconfigured host writes what it likes.
//!
//! The first byte picks the exit status (none: killed; 0; the script's 1 and 2; a
//! shell's 126 and 127; ssh's own 255; or any other), the second where stdout ends
//! and stderr begins. Whatever the bytes: no panic; a reason is one line (no
//! control characters) and bounded; status 0 without an answer line is a start.
#![no_main]

use libfuzzer_sys::fuzz_target;
use puppet_kicker::kick::ssh::{read_answer, Captured, REASON_BYTES};
use puppet_kicker::kick::Outcome;

const HOST: &str = "lb1.example.com";

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let [selector, split, rest @ ..] = input else { return };
    let status = match selector % 8 {
        0 => None,
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(126),
        5 => Some(127),
        6 => Some(255),
        _ => Some(i32::from(*selector)),
    };
    let at = rest.len() * usize::from(*split) / 255;
    let (out, err) = rest.split_at(at);
    let stdout = Captured { bytes: out.to_vec(), truncated: false };
    let stderr = Captured { bytes: err.to_vec(), truncated: false };
    let outcome = read_answer(HOST, status, &stdout, &stderr);
    let reason = match &outcome {
        Outcome::Busy(m) | Outcome::Disabled(m) | Outcome::Failed(m) | Outcome::Refused(m) => m.as_str(),
        _ => "",
    };
    // The host, the words around the reason, and at most REASON_BYTES of text and "...".
    assert!(reason.len() <= REASON_BYTES + 3 + HOST.len() + 128, "{} bytes kept", reason.len());
    assert!(!reason.chars().any(char::is_control), "{reason:?}");
    if status == Some(0) && !String::from_utf8_lossy(out).contains("puppet-kicker runonce: ") {
        assert_eq!(outcome, Outcome::Started);
    }
});
