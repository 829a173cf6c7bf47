//! The MD5 of many messages, each followed by the same suffix: the PSK signatures
//! (`MD5(body ‖ psk)`) of a refresh's thousands of replies. MD5 is a serial chain
//! within one message, at its floor on one core; across independent messages it is
//! not: with AVX2 each 32-bit lane of a register hashes its own message, and two
//! registers' worth are interleaved so that one chain's latency hides the other's.
//!
//! The md-5 crate is the reference: it hashes when no lanes are available, for
//! batches too small to pay, and in the tests and fuzz target the lanes are held to.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod rounds;
mod schedule;

use md5::{Digest, Md5};

/// How the digests are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The md-5 crate, one message after the other.
    OneAtATime,
    /// 16 messages at once: two AVX2 registers of 8 lanes (x86_64 with AVX2 only).
    Avx2Lanes,
    /// 32 messages at once: two AVX-512 registers of 16 lanes (x86_64 with AVX-512F only).
    Avx512Lanes,
}

impl Engine {
    /// The widest engine this CPU runs (std detects the features once per process).
    pub fn detected() -> Engine {
        Engine::for_batch(usize::MAX)
    }

    /// The engine for `messages` at once: AVX-512 once the batch fills its lanes
    /// (below, its round costs more than AVX2's for the lanes in use), AVX2 from 4
    /// (below, md-5 is as fast), else md-5.
    fn for_batch(messages: usize) -> Engine {
        #[cfg(target_arch = "x86_64")]
        if messages >= 32 && std::arch::is_x86_feature_detected!("avx512f") {
            return Engine::Avx512Lanes;
        }
        #[cfg(target_arch = "x86_64")]
        if messages >= 4 && std::arch::is_x86_feature_detected!("avx2") {
            return Engine::Avx2Lanes;
        }
        Engine::OneAtATime
    }

    /// Messages hashed at once.
    pub fn lanes(self) -> usize {
        match self {
            Engine::OneAtATime => 1,
            Engine::Avx2Lanes => 16,
            Engine::Avx512Lanes => 32,
        }
    }
}

/// The MD5 of each `message ‖ suffix`, in the order of `messages`.
pub fn digests(messages: &[&[u8]], suffix: &[u8]) -> Vec<[u8; 16]> {
    digests_with(Engine::for_batch(messages.len()), messages, suffix)
}

/// [`digests`] by `engine`; by md-5 when this CPU lacks it.
pub fn digests_with(engine: Engine, messages: &[&[u8]], suffix: &[u8]) -> Vec<[u8; 16]> {
    hashed_by(engine, messages, suffix).1
}

/// [`digests_with`], and the engine that hashed: `engine`, or md-5 where this CPU
/// lacks it (the tests assert which ran).
fn hashed_by(engine: Engine, messages: &[&[u8]], suffix: &[u8]) -> (Engine, Vec<[u8; 16]>) {
    match engine {
        #[cfg(target_arch = "x86_64")]
        Engine::Avx2Lanes if std::arch::is_x86_feature_detected!("avx2") => {
            // SAFETY: the CPU has AVX2, checked just above.
            let digests =
                schedule::run(messages, suffix, |state, blocks| unsafe { avx2::compress::<16, 2>(state, blocks) });
            (Engine::Avx2Lanes, digests)
        }
        #[cfg(target_arch = "x86_64")]
        Engine::Avx512Lanes if std::arch::is_x86_feature_detected!("avx512f") => {
            // SAFETY: the CPU has AVX-512F, checked just above.
            let digests =
                schedule::run(messages, suffix, |state, blocks| unsafe { avx512::compress::<32, 2>(state, blocks) });
            (Engine::Avx512Lanes, digests)
        }
        _ => (Engine::OneAtATime, messages.iter().map(|m| one(m, suffix)).collect()),
    }
}

fn one(message: &[u8], suffix: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update(message);
    h.update(suffix);
    h.finalize().into()
}

#[cfg(test)]
mod tests;
