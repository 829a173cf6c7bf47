//! The MD5 lanes (`md5_lanes`) held to the md-5 crate: the input split into a
//! suffix (its first byte says how long) and messages (the rest, split at each
//! `|`), and the MD5 of each `message ‖ suffix` compared, by each lane engine (md-5
//! itself where the CPU lacks one) and by `digests` as the PSK check calls it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use md5::{Digest, Md5};
use puppet_kicker::mcollective::md5_lanes::{digests, digests_with, Engine};

fuzz_target!(|input: &[u8]| {
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
});
