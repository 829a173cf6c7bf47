//! The MD5 of many messages, each followed by the same suffix: the PSK signatures
//! (`MD5(body ‖ psk)`) of a refresh's thousands of replies. MD5 is a serial chain
//! within one message, at its floor on one core; across independent messages it is
//! not, so with AVX2 eight are hashed at once, one in each 32-bit lane.
//!
//! The md-5 crate is the reference: it hashes when no lanes are available, for
//! batches too small to pay, and in the tests and fuzz target the lanes are held to.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod rounds;
mod schedule;

use md5::{Digest, Md5};

/// How the digests are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The md-5 crate, one message after the other.
    OneAtATime,
    /// Eight messages at once in AVX2's 32-bit lanes (x86_64 with AVX2 only).
    Avx2Lanes,
}

impl Engine {
    /// The fastest engine this CPU runs (std detects the features once per process).
    pub fn detected() -> Engine {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            return Engine::Avx2Lanes;
        }
        Engine::OneAtATime
    }

    /// Messages hashed at once.
    pub fn lanes(self) -> usize {
        match self {
            Engine::OneAtATime => 1,
            Engine::Avx2Lanes => 8,
        }
    }
}

/// Fewer messages than this go one at a time: with most lanes idle, the lanes
/// cost more than md-5.
const MIN_LANES_BATCH: usize = 2;

/// The MD5 of each `message ‖ suffix`, in the order of `messages`.
pub fn digests(messages: &[&[u8]], suffix: &[u8]) -> Vec<[u8; 16]> {
    let engine = if messages.len() < MIN_LANES_BATCH { Engine::OneAtATime } else { Engine::detected() };
    digests_with(engine, messages, suffix)
}

/// [`digests`] by `engine`; by md-5 when this CPU lacks it.
pub fn digests_with(engine: Engine, messages: &[&[u8]], suffix: &[u8]) -> Vec<[u8; 16]> {
    match engine {
        #[cfg(target_arch = "x86_64")]
        Engine::Avx2Lanes if std::arch::is_x86_feature_detected!("avx2") => {
            // SAFETY: the CPU has AVX2, checked just above.
            schedule::run(messages, suffix, |state, blocks| unsafe { avx2::compress(state, blocks) })
        }
        _ => messages.iter().map(|m| one(m, suffix)).collect(),
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
