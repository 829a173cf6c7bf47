//! A Choria server's reply (`kick::choria::decode_reply`), then read as each action
//! reads it: a `runonce`'s outcome, a `disable`'s or `enable`'s done or reason, a
//! `last_run_summary`'s last run. The first byte picks the layer the input replaces: the
//! transport as the broker delivers it (most fail early), the secure reply inside a
//! good transport, or the reply inside a good secure reply whose hash is made here
//! as a server makes it, so that the layers behind the hash are reached.
//!
//! Whatever the bytes: no panic, a typed error or a reply (never past the size
//! limit) from one of the request's two targets; a reply's outcome keeps a bounded
//! message, and status 0 is a started run; a reason for a refused `disable` is
//! bounded too, and a last run is read from any outputs without a panic. `claimed_sender` reads the same bytes
//! without a panic, and for an accepted reply names its sender.
#![no_main]

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use libfuzzer_sys::fuzz_target;
use puppet_kicker::kick::choria::{claimed_sender, decode_reply, Expected, RequestId, MAX_REPLY_BYTES};
use puppet_kicker::kick::Outcome;
use ring::digest::{digest, SHA256};

const TARGET: &str = "web1.example.com";
/// Another target of the same request: a reply from either is accepted.
const OTHER: &str = "db1.example.com";
const ID: &str = "0123456789abcdef0123456789abcdef";

fn transport(secure: &str) -> Vec<u8> {
    serde_json::json!({
        "protocol": "choria:transport:1",
        "data": BASE64.encode(secure),
        "headers": {"mc_sender": TARGET},
    })
    .to_string()
    .into_bytes()
}

fn secure(reply: &str) -> String {
    let hash = BASE64.encode(digest(&SHA256, reply.as_bytes()));
    serde_json::json!({"protocol": "choria:secure:reply:1", "message": reply, "hash": hash}).to_string()
}

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Some((&layer, rest)) = input.split_first() else { return };
    let bytes = match layer % 3 {
        0 => rest.to_vec(),
        layer => {
            let Ok(text) = std::str::from_utf8(rest) else { return };
            if layer == 1 {
                transport(text)
            } else {
                transport(&secure(text))
            }
        }
    };
    let id = RequestId::parse(ID).expect("a valid id");
    match decode_reply(&bytes, &Expected { request_id: &id, targets: &[OTHER, TARGET] }) {
        Ok(reply) => {
            assert!(bytes.len() <= MAX_REPLY_BYTES);
            assert!([OTHER, TARGET].contains(&reply.sender.as_str()), "{}", reply.sender);
            // A header an accepted reply carries names its sender.
            if let Some(claimed) = claimed_sender(&bytes) {
                assert_eq!(claimed, reply.sender);
            }
            let outcome = reply.outcome();
            let message = match &outcome {
                Outcome::Busy(m) | Outcome::Disabled(m) | Outcome::Failed(m) | Outcome::Refused(m) => m.as_str(),
                _ => "",
            };
            // 200 characters of the agent's, "..." and " (status N)".
            assert!(message.chars().count() <= 240, "{} characters kept", message.chars().count());
            if reply.statuscode == 0 {
                assert!(matches!(outcome, Outcome::Started | Outcome::StartedAt(_)), "{outcome:?}");
            }
            match reply.done() {
                Ok(()) => assert_eq!(reply.statuscode, 0),
                Err(why) => assert!(why.chars().count() <= 240, "{} characters kept", why.chars().count()),
            }
            if let Ok(last) = reply.last_run() {
                assert!(last.at.is_none_or(|at| at > 0), "{last:?}");
            }
        }
        Err(e) => {
            let _ = e.to_string();
            let _ = claimed_sender(&bytes);
        }
    }
});
