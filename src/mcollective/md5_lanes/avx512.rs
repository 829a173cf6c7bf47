//! One MD5 block of each of 16 messages per AVX-512 register, one in each 32-bit
//! lane: as `avx2` with twice the lanes, a rotate instruction and each round's
//! function in one ternary-logic instruction.

use super::rounds::{K, S, WORD};
use std::arch::x86_64::{
    __m512i, _mm512_add_epi32, _mm512_loadu_si512, _mm512_rol_epi32, _mm512_set1_epi32, _mm512_shuffle_i32x4,
    _mm512_storeu_si512, _mm512_ternarylogic_epi32, _mm512_unpackhi_epi32, _mm512_unpackhi_epi64,
    _mm512_unpacklo_epi32, _mm512_unpacklo_epi64, _mm_prefetch, _MM_HINT_T0,
};

/// How far ahead of each lane its bytes are asked for.
const AHEAD: usize = 512;

/// Messages per register.
pub(super) const LANES: usize = 16;

// MD5's functions of (x, y, z) as ternary-logic truth tables over x = 0xf0,
// y = 0xcc, z = 0xaa.
/// `(x & y) | (!x & z)`
const F: i32 = 0xca;
/// `(x & z) | (y & !z)`
const G: i32 = 0xe4;
/// `x ^ y ^ z`
const H: i32 = 0x96;
/// `y ^ (x | !z)`
const I: i32 = 0x39;

/// The N = 16 x SETS lanes' chaining values after one block each: `state[0]` holds
/// the A words of the lanes, then B, C, D. Lane `i` hashes `blocks[i]`.
#[target_feature(enable = "avx512f")]
pub(super) fn compress<const N: usize, const SETS: usize>(state: &mut [[u32; N]; 4], blocks: &[&[u8; 64]; N]) {
    const { assert!(N == LANES * SETS) };
    let w: [[__m512i; 16]; SETS] =
        std::array::from_fn(|s| transposed(blocks[LANES * s..][..LANES].try_into().expect("LANES blocks")));
    let rows = |k: usize| -> [__m512i; SETS] {
        std::array::from_fn(|s| {
            let row: &[u32; LANES] = state[k][LANES * s..].first_chunk().expect("LANES words");
            // SAFETY: `row` is LANES u32, the bytes read; loadu needs no alignment.
            unsafe { _mm512_loadu_si512(row.as_ptr().cast()) }
        })
    };
    let [mut a, mut b, mut c, mut d] = [rows(0), rows(1), rows(2), rows(3)];
    let start = [a, b, c, d];
    // One step: a = b + rotl(a + f(b, c, d) + w[WORD[i]] + K[i], S[i]), i a constant;
    // a + w + K first, off the chain through b.
    macro_rules! step {
        ($f:ident, $a:ident, $b:ident, $c:ident, $d:ident, $i:expr) => {
            for s in 0..SETS {
                let early = _mm512_add_epi32($a[s], _mm512_add_epi32(w[s][WORD[$i]], _mm512_set1_epi32(K[$i] as i32)));
                let sum = _mm512_add_epi32(early, _mm512_ternarylogic_epi32::<$f>($b[s], $c[s], $d[s]));
                $a[s] = _mm512_add_epi32($b[s], _mm512_rol_epi32::<{ S[$i] as i32 }>(sum));
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
    four!(F, 0);
    four!(F, 4);
    four!(F, 8);
    four!(F, 12);
    four!(G, 16);
    four!(G, 20);
    four!(G, 24);
    four!(G, 28);
    four!(H, 32);
    four!(H, 36);
    four!(H, 40);
    four!(H, 44);
    four!(I, 48);
    four!(I, 52);
    four!(I, 56);
    four!(I, 60);
    for (k, (now, before)) in [a, b, c, d].iter().zip(start).enumerate() {
        for s in 0..SETS {
            let row: &mut [u32; LANES] = state[k][LANES * s..].first_chunk_mut().expect("LANES words");
            // SAFETY: `row` is LANES u32, the bytes written; storeu needs no alignment.
            unsafe { _mm512_storeu_si512(row.as_mut_ptr().cast(), _mm512_add_epi32(now[s], before[s])) }
        }
    }
}

/// The 16 message words of the 16 blocks, word `j` of lane `i` in `w[j]`'s lane
/// `i` (a 16x16 transpose of 32-bit words; MD5's words are little-endian, as x86 is).
#[target_feature(enable = "avx512f")]
fn transposed(blocks: &[&[u8; 64]; LANES]) -> [__m512i; 16] {
    for block in blocks {
        // Streams of 16 or 32 lanes outrun the hardware prefetcher: ask for each
        // lane's data a few blocks ahead (past a message's end, a wasted hint).
        _mm_prefetch::<_MM_HINT_T0>(block.as_ptr().wrapping_add(AHEAD).cast());
    }
    // SAFETY: each block is 64 bytes, the 64 read; loadu needs no alignment.
    let r = blocks.map(|block| unsafe { _mm512_loadu_si512(block.as_ptr().cast()) });
    // t[2k], t[2k+1]: lanes 2k and 2k+1 interleaved, words 4c, 4c+1 and 4c+2, 4c+3
    // of each 128-bit chunk c.
    let t: [__m512i; 16] = std::array::from_fn(|n| {
        let (x, y) = (r[n & !1], r[n | 1]);
        if n % 2 == 0 {
            _mm512_unpacklo_epi32(x, y)
        } else {
            _mm512_unpackhi_epi32(x, y)
        }
    });
    // u[4k+j], chunk c: word 4c+j of lanes 4k..4k+4.
    let u: [__m512i; 16] = std::array::from_fn(|n| {
        let (k, j) = (n / 4, n % 4);
        let (x, y) = (t[4 * k + j / 2], t[4 * k + 2 + j / 2]);
        if j % 2 == 0 {
            _mm512_unpacklo_epi64(x, y)
        } else {
            _mm512_unpackhi_epi64(x, y)
        }
    });
    let mut w = [_mm512_set1_epi32(0); 16];
    for j in 0..4 {
        // Chunks 0, 1 (then 2, 3) of lanes 0-3, 4-7; of lanes 8-11, 12-15.
        let low_0_7 = _mm512_shuffle_i32x4::<0x44>(u[j], u[4 + j]);
        let high_0_7 = _mm512_shuffle_i32x4::<0xee>(u[j], u[4 + j]);
        let low_8_15 = _mm512_shuffle_i32x4::<0x44>(u[8 + j], u[12 + j]);
        let high_8_15 = _mm512_shuffle_i32x4::<0xee>(u[8 + j], u[12 + j]);
        w[j] = _mm512_shuffle_i32x4::<0x88>(low_0_7, low_8_15);
        w[4 + j] = _mm512_shuffle_i32x4::<0xdd>(low_0_7, low_8_15);
        w[8 + j] = _mm512_shuffle_i32x4::<0x88>(high_0_7, high_8_15);
        w[12 + j] = _mm512_shuffle_i32x4::<0xdd>(high_0_7, high_8_15);
    }
    w
}
