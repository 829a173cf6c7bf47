//! Every engine held to md-5 (`one`), on both paths whatever the CPU picks.

use super::*;

const SUFFIXES: [usize; 5] = [0, 9, 55, 64, 200];

/// Bytes that differ from position to position and from seed to seed.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Every engine this CPU runs (any other falls back to md-5, and is tested as such).
fn engines() -> Vec<Engine> {
    vec![Engine::OneAtATime, Engine::Avx2Lanes, Engine::Avx512Lanes]
}

fn check(messages: &[Vec<u8>], suffix: &[u8]) {
    let refs: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
    let expected: Vec<[u8; 16]> = refs.iter().map(|m| one(m, suffix)).collect();
    for engine in engines() {
        let got = digests_with(engine, &refs, suffix);
        assert!(
            got == expected,
            "{engine:?}: lengths {:?}, suffix {}",
            refs.iter().map(|m| m.len()).collect::<Vec<_>>(),
            suffix.len()
        );
    }
    assert!(digests(&refs, suffix) == expected);
}

#[test]
fn md5_of_known_texts() {
    let hex = |d: [u8; 16]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    // RFC 1321, appendix A.5, the message split between message and suffix.
    let cases: [(&[u8], &[u8], &str); 3] = [
        (b"", b"", "d41d8cd98f00b204e9800998ecf8427e"),
        (b"message ", b"digest", "f96b697d7cb7938d525a2f31aaf161d0"),
        (b"abcdefghijklmnopqrstuvwxyz", b"", "c3fcd3d76192e4007dfb496cca67e13b"),
    ];
    for engine in engines() {
        let messages: Vec<&[u8]> = cases.iter().map(|c| c.0).collect();
        for (i, case) in cases.iter().enumerate() {
            // One suffix per batch: each case alone, and beside copies of itself.
            let batch = vec![messages[i]; 9];
            for d in digests_with(engine, &batch, case.1) {
                assert_eq!(hex(d), case.2, "{engine:?}");
            }
        }
    }
}

#[test]
fn every_length_up_to_300_with_every_suffix() {
    for suffix_len in SUFFIXES {
        let suffix = bytes(suffix_len, 7);
        // All lengths in one batch (lanes finish at different times), and each alone.
        let all: Vec<Vec<u8>> = (0..=300).map(|len| bytes(len, len as u64)).collect();
        check(&all, &suffix);
        for message in &all {
            check(std::slice::from_ref(message), &suffix);
        }
    }
}

#[test]
fn lengths_around_block_boundaries() {
    let around: Vec<usize> = (1..=6).flat_map(|b| [64 * b - 9, 64 * b - 8, 64 * b - 1, 64 * b, 64 * b + 1]).collect();
    for suffix_len in SUFFIXES {
        let suffix = bytes(suffix_len, 11);
        let messages: Vec<Vec<u8>> = around.iter().map(|&len| bytes(len, 3)).collect();
        check(&messages, &suffix);
        // Message and suffix together around the boundaries too.
        let shifted: Vec<Vec<u8>> = around.iter().map(|&len| bytes(len.saturating_sub(suffix_len), 5)).collect();
        check(&shifted, &suffix);
    }
}

#[test]
fn batches_of_1_to_20_with_mixed_lengths() {
    for size in 1..=20 {
        for suffix_len in SUFFIXES {
            let messages: Vec<Vec<u8>> =
                (0..size).map(|i| bytes((i * 97 + size * 31) % 700, (size * 100 + i) as u64)).collect();
            check(&messages, &bytes(suffix_len, 13));
        }
    }
}

#[test]
fn a_large_batch() {
    let lengths = bytes(3000, 17);
    let messages: Vec<Vec<u8>> = lengths
        .chunks(2)
        .enumerate()
        .map(|(i, l)| bytes(usize::from(l[0]) * 40 + usize::from(l[1]), i as u64))
        .collect();
    check(&messages, b"bench-psk");
}

#[test]
fn an_empty_batch() {
    for engine in engines() {
        assert!(digests_with(engine, &[], b"psk").is_empty());
    }
}
