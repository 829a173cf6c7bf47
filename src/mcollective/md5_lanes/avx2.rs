//! One MD5 block of each of 8 messages at once, in the 8 32-bit lanes of AVX2
//! registers (the "multi-buffer" layout of Intel ISA-L's md5_mb): MD5 is a serial
//! chain within a message, so the parallelism is across messages.

use super::rounds::{K, S, WORD};
use std::arch::x86_64::{
    __m256i, _mm256_add_epi32, _mm256_and_si256, _mm256_andnot_si256, _mm256_loadu_si256, _mm256_or_si256,
    _mm256_permute2x128_si256, _mm256_set1_epi32, _mm256_slli_epi32, _mm256_srli_epi32, _mm256_storeu_si256,
    _mm256_unpackhi_epi32, _mm256_unpackhi_epi64, _mm256_unpacklo_epi32, _mm256_unpacklo_epi64, _mm256_xor_si256,
};

/// Messages hashed at once.
pub(super) const LANES: usize = 8;

/// The lanes' chaining values after one block each: `state[0]` holds the A words
/// of the 8 lanes, then B, C, D. Lane `i` hashes `blocks[i]`.
#[target_feature(enable = "avx2")]
pub(super) fn compress(state: &mut [[u32; LANES]; 4], blocks: &[&[u8; 64]; LANES]) {
    let w = transposed(blocks);
    let [mut a, mut b, mut c, mut d] = state.map(|row| load(row));
    let (a0, b0, c0, d0) = (a, b, c, d);
    // One step: a = b + rotl(a + f(b, c, d) + w[WORD[i]] + K[i], S[i]), i a constant;
    // a + w + K first, off the chain through b.
    macro_rules! step {
        ($f:ident, $a:ident, $b:ident, $c:ident, $d:ident, $i:expr) => {
            let early = _mm256_add_epi32($a, _mm256_add_epi32(w[WORD[$i]], _mm256_set1_epi32(K[$i] as i32)));
            let sum = $f(early, $b, $c, $d);
            let rotated = _mm256_or_si256(
                _mm256_slli_epi32::<{ S[$i] as i32 }>(sum),
                _mm256_srli_epi32::<{ 32 - S[$i] as i32 }>(sum),
            );
            $a = _mm256_add_epi32($b, rotated);
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
    let sums = [_mm256_add_epi32(a, a0), _mm256_add_epi32(b, b0), _mm256_add_epi32(c, c0), _mm256_add_epi32(d, d0)];
    for (row, sum) in state.iter_mut().zip(sums) {
        // SAFETY: `row` is 8 u32, the 32 bytes written; storeu needs no alignment.
        unsafe { _mm256_storeu_si256(row.as_mut_ptr().cast(), sum) }
    }
}

#[target_feature(enable = "avx2")]
fn load(row: [u32; LANES]) -> __m256i {
    // SAFETY: `row` is 8 u32, the 32 bytes read; loadu needs no alignment.
    unsafe { _mm256_loadu_si256(row.as_ptr().cast()) }
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
