//! The MD5 lanes (`md5_lanes`) held to the md-5 crate: the input split into a
//! suffix (its first byte says how long) and messages (the rest, split at each
//! `|`), and the MD5 of each `message ‖ suffix` compared, by each lane engine (md-5
//! itself where the CPU lacks one) and by `digests` as the PSK check calls it. Then
//! the PSK check itself (`psk::verify_many`, the suffix as the key) on signatures
//! right, upper-case or wrong: it accepts the first two, as the digest's number,
//! and so does `psk::verify` of one body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use md5::{Digest, Md5};
use puppet_kicker::mcollective::md5_lanes::{digests, digests_with, Engine};
use puppet_kicker::mcollective::psk;

fuzz_target!(|input: &[u8]| {
    let _cpu = puppet_kicker_fuzz::CpuBudget::start();
    let Some((&suffix_len, rest)) = input.split_first() else { return };
    let (suffix, rest) = rest.split_at(usize::from(suffix_len).min(rest.len()));
    let messages: Vec<&[u8]> = rest.split(|&b| b == b'|').collect();
    let expected: Vec<[u8; 16]> = messages
        .iter()
        .map(|m| {
            let mut h = Md5::new();
            h.update(m);
            h.update(suffix);
            h.finalize().into()
        })
        .collect();
    for engine in [Engine::Avx2Lanes, Engine::Avx512Lanes] {
        assert_eq!(digests_with(engine, &messages, suffix), expected, "{engine:?}");
    }
    assert_eq!(digests(&messages, suffix), expected);

    let Ok(key) = std::str::from_utf8(suffix) else { return };
    // Each signature right, in upper case, rotated or cut short: `verify_many` gives
    // the digest's number for the first two, in order.
    let mut verified = Vec::with_capacity(expected.len());
    let hashes: Vec<String> = expected
        .iter()
        .enumerate()
        .map(|(i, digest)| {
            let hex = hex(digest);
            let (hash, good) = match (i + usize::from(suffix_len)) % 4 {
                0 => (hex, true),
                1 => (hex.to_uppercase(), true),
                2 => (format!("{}{}", &hex[1..], &hex[..1]), hex.bytes().all(|b| b == hex.as_bytes()[0])),
                _ => (hex[..31].to_string(), false),
            };
            verified.push(good.then(|| u128::from_be_bytes(*digest)));
            hash
        })
        .collect();
    let signed: Vec<(&[u8], &str)> = messages.iter().copied().zip(hashes.iter().map(String::as_str)).collect();
    assert_eq!(psk::verify_many(&signed, key), verified);
    // One at a time, as a reply alone is checked.
    if let Some((body, hash)) = signed.first() {
        assert_eq!(psk::verify(body, key, hash), verified[0].is_some());
    }
});

/// Lowercase hex, by std (not instrumented: the target's own loop was a quarter of its time).
fn hex(digest: &[u8; 16]) -> String {
    format!("{:032x}", u128::from_be_bytes(*digest))
}
