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

/// Every engine (one this CPU lacks falls back to md-5: [`ran`] says which).
fn engines() -> Vec<Engine> {
    vec![Engine::OneAtATime, Engine::Avx2Lanes, Engine::Avx512Lanes]
}

/// The CPU's feature flags as the kernel reports them (`/proc/cpuinfo`), read apart
/// from std's detection that the engines are chosen by.
fn cpu_flags() -> &'static [String] {
    static FLAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    FLAGS.get_or_init(|| {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo is readable");
        let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).and_then(|l| l.split_once(':'));
        flags.map_or_else(Vec::new, |(_, flags)| flags.split_whitespace().map(str::to_string).collect())
    })
}

/// Whether the CPU has `flag` (x86_64 only: the lanes are x86_64's).
fn has(flag: &str) -> bool {
    cfg!(target_arch = "x86_64") && cpu_flags().iter().any(|f| f == flag)
}

/// The engine that must hash when `engine` is asked for: itself where the CPU has
/// its instructions, else md-5.
fn ran(engine: Engine) -> Engine {
    match engine {
        Engine::Avx2Lanes if has("avx2") => Engine::Avx2Lanes,
        Engine::Avx512Lanes if has("avx512f") => Engine::Avx512Lanes,
        _ => Engine::OneAtATime,
    }
}

/// `engine`'s digests, asserting that the engine the CPU allows is the one that ran.
fn hashed(engine: Engine, messages: &[&[u8]], suffix: &[u8]) -> Vec<[u8; 16]> {
    let (by, digests) = hashed_by(engine, messages, suffix);
    let cpu = format!("avx2 {}, avx512f {}", has("avx2"), has("avx512f"));
    assert_eq!(by, ran(engine), "asked for {engine:?} on a CPU with {cpu}");
    digests
}

fn check(messages: &[Vec<u8>], suffix: &[u8]) {
    let refs: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
    let expected: Vec<[u8; 16]> = refs.iter().map(|m| one(m, suffix)).collect();
    for engine in engines() {
        let got = hashed(engine, &refs, suffix);
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
fn the_vector_engines_run_where_the_cpu_has_them() {
    let messages: Vec<&[u8]> = vec![b"body"; 40];
    let ran_by: Vec<Engine> = engines().into_iter().map(|engine| hashed_by(engine, &messages, b"psk").0).collect();
    eprintln!("CPU: avx2 {}, avx512f {}; asked {:?}, ran {ran_by:?}", has("avx2"), has("avx512f"), engines());
    let avx2 = if has("avx2") { Engine::Avx2Lanes } else { Engine::OneAtATime };
    let avx512 = if has("avx512f") { Engine::Avx512Lanes } else { Engine::OneAtATime };
    assert_eq!(ran_by, [Engine::OneAtATime, avx2, avx512]);
    // What `digests` picks by batch size: AVX-512 from 32 messages, AVX2 from 4.
    let widest = if has("avx512f") { avx512 } else { avx2 };
    assert_eq!(Engine::detected(), widest);
    assert_eq!(Engine::for_batch(3), Engine::OneAtATime);
    assert_eq!(Engine::for_batch(4), avx2);
    assert_eq!(Engine::for_batch(31), avx2);
    assert_eq!(Engine::for_batch(32), widest);
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
            for d in hashed(engine, &batch, case.1) {
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
        assert!(hashed(engine, &[], b"psk").is_empty());
    }
}
