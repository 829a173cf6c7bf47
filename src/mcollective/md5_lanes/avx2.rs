//! One MD5 block of each of 8 messages per AVX2 register, one in each 32-bit lane
//! (the "multi-buffer" layout of Intel ISA-L's md5_mb): MD5 is a serial chain within
//! a message, so the parallelism is across messages. With SETS registers, their
//! steps interleaved, one chain's latency hides behind the others' work.

use super::rounds::{K, S, WORD};
use std::arch::x86_64::{
    __m256i, _mm256_add_epi32, _mm256_and_si256, _mm256_andnot_si256, _mm256_loadu_si256, _mm256_or_si256,
    _mm256_permute2x128_si256, _mm256_set1_epi32, _mm256_slli_epi32, _mm256_srli_epi32, _mm256_storeu_si256,
    _mm256_unpackhi_epi32, _mm256_unpackhi_epi64, _mm256_unpacklo_epi32, _mm256_unpacklo_epi64, _mm256_xor_si256,
    _mm_prefetch, _MM_HINT_T0,
};

/// How far ahead of each lane its bytes are asked for.
const AHEAD: usize = 512;

/// Messages per register.
pub(super) const LANES: usize = 8;

/// The N = 8 x SETS lanes' chaining values after one block each: `state[0]` holds
/// the A words of the lanes, then B, C, D. Lane `i` hashes `blocks[i]`.
#[target_feature(enable = "avx2")]
pub(super) fn compress<const N: usize, const SETS: usize>(state: &mut [[u32; N]; 4], blocks: &[&[u8; 64]; N]) {
    const { assert!(N == LANES * SETS) };
    let w: [[__m256i; 16]; SETS] =
        std::array::from_fn(|s| transposed(blocks[LANES * s..][..LANES].try_into().expect("LANES blocks")));
    let rows = |k: usize| -> [__m256i; SETS] {
        std::array::from_fn(|s| {
            let row: &[u32; LANES] = state[k][LANES * s..].first_chunk().expect("LANES words");
            // SAFETY: `row` is LANES u32, the bytes read; loadu needs no alignment.
            unsafe { _mm256_loadu_si256(row.as_ptr().cast()) }
        })
    };
    let [mut a, mut b, mut c, mut d] = [rows(0), rows(1), rows(2), rows(3)];
    let start = [a, b, c, d];
    // One step: a = b + rotl(a + f(b, c, d) + w[WORD[i]] + K[i], S[i]), i a constant;
    // a + w + K first, off the chain through b.
    macro_rules! step {
        ($f:ident, $a:ident, $b:ident, $c:ident, $d:ident, $i:expr) => {
            for s in 0..SETS {
                let early = _mm256_add_epi32($a[s], _mm256_add_epi32(w[s][WORD[$i]], _mm256_set1_epi32(K[$i] as i32)));
                let sum = $f(early, $b[s], $c[s], $d[s]);
                let rotated = _mm256_or_si256(
                    _mm256_slli_epi32::<{ S[$i] as i32 }>(sum),
                    _mm256_srli_epi32::<{ 32 - S[$i] as i32 }>(sum),
                );
                $a[s] = _mm256_add_epi32($b[s], rotated);
            }
        };
    }
    macro_rules! four {
        ($f:ident, $i:expr) => {
            step!($f, a, b, c, d, $i);
            step!($f, d, a, b, c, $i + 1);
            step!($f, c, d, a, b, $i + 2);
            step!($f, b, c, d, a, $i + 3);
        };
    }
    four!(f, 0);
    four!(f, 4);
    four!(f, 8);
    four!(f, 12);
    four!(g, 16);
    four!(g, 20);
    four!(g, 24);
    four!(g, 28);
    four!(h, 32);
    four!(h, 36);
    four!(h, 40);
    four!(h, 44);
    four!(i, 48);
    four!(i, 52);
    four!(i, 56);
    four!(i, 60);
    for (k, (now, before)) in [a, b, c, d].iter().zip(start).enumerate() {
        for s in 0..SETS {
            let row: &mut [u32; LANES] = state[k][LANES * s..].first_chunk_mut().expect("LANES words");
            // SAFETY: `row` is LANES u32, the bytes written; storeu needs no alignment.
            unsafe { _mm256_storeu_si256(row.as_mut_ptr().cast(), _mm256_add_epi32(now[s], before[s])) }
        }
    }
}

// `early` plus MD5's four functions of x, y, z (bitwise on each lane), each with the
// fewest operations after x, the word the previous step just made.
#[target_feature(enable = "avx2")]
fn f(early: __m256i, x: __m256i, y: __m256i, z: __m256i) -> __m256i {
    _mm256_add_epi32(early, _mm256_xor_si256(z, _mm256_and_si256(x, _mm256_xor_si256(y, z))))
}

/// `(x & z) | (y & !z)`: the two have no bit in common, so they can be added apart.
#[target_feature(enable = "avx2")]
fn g(early: __m256i, x: __m256i, y: __m256i, z: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_add_epi32(early, _mm256_andnot_si256(z, y)), _mm256_and_si256(x, z))
}

#[target_feature(enable = "avx2")]
fn h(early: __m256i, x: __m256i, y: __m256i, z: __m256i) -> __m256i {
    _mm256_add_epi32(early, _mm256_xor_si256(x, _mm256_xor_si256(y, z)))
}

/// `y ^ (x | !z)`, with `!z` as `z andnot all-ones`.
#[target_feature(enable = "avx2")]
fn i(early: __m256i, x: __m256i, y: __m256i, z: __m256i) -> __m256i {
    _mm256_add_epi32(early, _mm256_xor_si256(y, _mm256_or_si256(x, _mm256_andnot_si256(z, _mm256_set1_epi32(-1)))))
}

/// The 16 message words of the 8 blocks, word `j` of lane `i` in `w[j]`'s lane `i`
/// (two 8x8 transposes of 32-bit words; MD5's words are little-endian, as x86 is).
#[target_feature(enable = "avx2")]
fn transposed(blocks: &[&[u8; 64]; LANES]) -> [__m256i; 16] {
    for block in blocks {
        // Streams of 16 or 32 lanes outrun the hardware prefetcher: ask for each
        // lane's data a few blocks ahead (past a message's end, a wasted hint).
        _mm_prefetch::<_MM_HINT_T0>(block.as_ptr().wrapping_add(AHEAD).cast());
    }
    let mut w = [_mm256_set1_epi32(0); 16];
    for half in 0..2 {
        // SAFETY: each block is 64 bytes; this reads bytes 32*half .. 32*half+32 of it,
        // and loadu needs no alignment.
        let r = blocks.map(|block| unsafe { _mm256_loadu_si256(block.as_ptr().add(32 * half).cast()) });
        let t = [
            _mm256_unpacklo_epi32(r[0], r[1]),
            _mm256_unpackhi_epi32(r[0], r[1]),
            _mm256_unpacklo_epi32(r[2], r[3]),
            _mm256_unpackhi_epi32(r[2], r[3]),
            _mm256_unpacklo_epi32(r[4], r[5]),
            _mm256_unpackhi_epi32(r[4], r[5]),
            _mm256_unpacklo_epi32(r[6], r[7]),
            _mm256_unpackhi_epi32(r[6], r[7]),
        ];
        // u[k]: words k and k+4 of lanes 0-3 (u[0..4]) and of lanes 4-7 (u[4..8]).
        let u = [
            _mm256_unpacklo_epi64(t[0], t[2]),
            _mm256_unpackhi_epi64(t[0], t[2]),
            _mm256_unpacklo_epi64(t[1], t[3]),
            _mm256_unpackhi_epi64(t[1], t[3]),
            _mm256_unpacklo_epi64(t[4], t[6]),
            _mm256_unpackhi_epi64(t[4], t[6]),
            _mm256_unpacklo_epi64(t[5], t[7]),
            _mm256_unpackhi_epi64(t[5], t[7]),
        ];
        for k in 0..4 {
            w[8 * half + k] = _mm256_permute2x128_si256::<0x20>(u[k], u[k + 4]);
            w[8 * half + k + 4] = _mm256_permute2x128_si256::<0x31>(u[k], u[k + 4]);
        }
    }
    w
}
