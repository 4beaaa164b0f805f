//! md5 of many buffers at once: one md5 per SIMD lane, in safe portable code.
//!
//! md5 is a chain: each 64-byte block of a message depends on the previous one, so one message
//! cannot be hashed faster than one core's latency allows (~0.5-0.6 GB/s). Independent messages
//! can: [`Md5Lanes`] hashes each buffer it is given in a lane of its own, one block per lane per
//! round, and a buffer that finishes frees its lane for the next one waiting (Intel ISA-L's and
//! minio's md5-simd's multi-buffer scheme). [`md5_of_many`] is the one-call form.
//!
//! The lanes are arrays of `u32` (`[u32; 16]`, `[u32; 8]`, `[u32; 4]`) operated on element by
//! element with `wrapping_add` and `rotate_left`; `multiversion` compiles the rounds for AVX-512,
//! AVX2 and the baseline (SSE2), picked at run time with the same targets as the reduction
//! kernels (`value/reduce.rs`, [`crate::value::selected_kernel`]), and LLVM turns each array
//! operation into one vector instruction. The block's words are gathered into the lanes element
//! by element (a transpose), except at 16 lanes on a CPU with Ice Lake's AVX-512 set, where each
//! lane's block is one vector load and four stages of `vpermt2d` transpose them in registers
//! (`mod avx512`: 1.41–1.45× the element-by-element rounds). No `unsafe`: those shuffles are safe
//! intrinsics in a `target_feature` function, and `bytemuck` moves the bytes in and out of
//! `__m512i` by value.
//!
//! Widths: 16 lanes on AVX-512 (8 while at most 8 buffers are in flight), 8 on AVX2, 4 on the
//! baseline; with few buffers in flight (two or fewer on AVX-512, three on the others) the
//! rounds run one buffer after the other, which is quicker for so few. A vector round costs about
//! as much with one buffer as with all its lanes busy, so the more buffers at once the better.
//!
//! Determinism: every lane computes RFC 1321 md5 of its own buffer (the same 64 steps, the same
//! padding), so a digest is the `md-5` crate's (`hashlib.md5(bytes)`), whatever the lane, the
//! width, the CPU or the other buffers; the tests compare every length up to 300 bytes, large
//! buffers, and every number of buffers up to 40 with `md-5`.
//! Limits: one buffer alone is no faster than `md-5` (use [`Md5Digest::of_bytes`]); lanes of very
//! different lengths leave lanes idle once the short ones are done and nothing waits, which is
//! why [`md5_of_many`] starts the longest first (a recorder's batch of `train` records, 15 ×
//! 64 KiB among 49 small ones: 1.25–1.30× the call order).
//!
//! What bounds it (AMD EPYC, family 26 (Zen 5), measured with a throwaway intrinsics loop): a
//! simple vector integer operation (`vpaddd`, `vprold`, `vpternlogd`) has a latency of 2 cycles,
//! zmm and ymm alike, against 1 for a scalar add, and about 4 such operations retire per cycle.
//! A step's chain is `fn`, an addition, the rotation and an addition, so 8 cycles at best; 16
//! lanes at 4,200–4,400 MiB/s are ~13.5 cycles a step, 8 lanes (ymm) ~9.5, `md-5` ~6 (scalar).
//! Tried for issue 17 and not kept, each timed against this code side by side in one process
//! (21 rotated repetitions, paired ratios, medians; commit a4b531f holds the harness:
//! `MD5X_VARIANTS=0,1,2,4,5 MD5X_LANES=16,8,4 cargo bench --bench detcheck -- md5_ab`):
//! - `a + m + k` summed behind `black_box` (one spill per step, off the chain): LLVM then keeps
//!   the chain at 4 operations with no register copy, yet 0.92–0.95× at 16 and 8 lanes
//!   (1.10–1.15× at 4 lanes, xmm). The copy before `vpternlogd` is not what costs.
//! - the same and `fn` split so that its destructive operand is off the chain (a second
//!   `black_box` per step): 0.82–0.85× at 16 lanes, 0.89–0.91× at 8.
//! - every step's `m + k` into an array first, behind `black_box`: LLVM adds the loaded sum
//!   last (`a + fn`, then `+ mk`), one more addition on the chain: 0.72×; built from `words`
//!   with a loop over the step's message index, it vectorised the transpose into
//!   `vpgatherqd`/`vpscatterqd`: 0.27×.
//! - two independent chains of 8 lanes for 16 (to fill the 2-cycle latency): LLVM's SLP
//!   vectoriser merges the two halves back into zmm, identical code, 1.00×; 32 lanes as
//!   `[u32; 32]` spill (1,335 MiB/s on 32 × 64 KiB, against 4,242 at 16 lanes), and the AVX2
//!   build at 16 lanes (two ymm, no rotate or ternary logic): 0.49×.
//! - the transpose is ~20% at 16 lanes (none at 8): with each vector loaded from one block
//!   (wrong digests, an upper bound) 16 lanes reach 1.25–1.28×. A portable 16 × 16 in-register
//!   transpose (four stages swapping off-diagonal blocks) did not become shuffles: LLVM went
//!   through the stack and gathers, 0.56× (tried again for the kept version: written as
//!   constant-index selections from two arrays, it became 16-byte moves through the stack).
//!   Kept: the same four stages as `vpermt2d` intrinsics, unrolled (a loop over the pairs kept
//!   the rows in memory), 5.7–5.9 GiB/s against 4.0–4.2 on 16 × 64 KiB, side by side (1.41–1.45×,
//!   more than the bound above: the element-by-element transpose also stalled the loads of the
//!   words it had just stored). Unfinished lead: two interleaved 8-lane chains in a form SLP
//!   leaves apart.
//! - `multiversion` 0.9 for every kernel (its clones are what makes the intrinsics safe): it
//!   compiles AVX-512 clones for Ice Lake's whole set (`avx512bw`, `vbmi`, `gfni`, …), and with
//!   those LLVM half-scalarised the 8-lane rounds (0.43×) and the stats kernel (0.06×). So 0.9
//!   compiles only [`avx512::rounds_16`]; everything else stays on 0.8. A CPU with AVX-512 but
//!   without Ice Lake's set (Skylake-SP) runs the element-by-element 16 lanes.

use crate::value::digest::Md5Digest;
use multiversion::multiversion;
use std::collections::VecDeque;

/// md5's initial state (RFC 1321, 3.3).
const INIT: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];

/// md5's additive constants, `floor(abs(sin(i + 1)) * 2^32)`.
static K: [u32; 64] = [
    0xd76a_a478,
    0xe8c7_b756,
    0x2420_70db,
    0xc1bd_ceee,
    0xf57c_0faf,
    0x4787_c62a,
    0xa830_4613,
    0xfd46_9501,
    0x6980_98d8,
    0x8b44_f7af,
    0xffff_5bb1,
    0x895c_d7be,
    0x6b90_1122,
    0xfd98_7193,
    0xa679_438e,
    0x49b4_0821,
    0xf61e_2562,
    0xc040_b340,
    0x265e_5a51,
    0xe9b6_c7aa,
    0xd62f_105d,
    0x0244_1453,
    0xd8a1_e681,
    0xe7d3_fbc8,
    0x21e1_cde6,
    0xc337_07d6,
    0xf4d5_0d87,
    0x455a_14ed,
    0xa9e3_e905,
    0xfcef_a3f8,
    0x676f_02d9,
    0x8d2a_4c8a,
    0xfffa_3942,
    0x8771_f681,
    0x6d9d_6122,
    0xfde5_380c,
    0xa4be_ea44,
    0x4bde_cfa9,
    0xf6bb_4b60,
    0xbebf_bc70,
    0x289b_7ec6,
    0xeaa1_27fa,
    0xd4ef_3085,
    0x0488_1d05,
    0xd9d4_d039,
    0xe6db_99e5,
    0x1fa2_7cf8,
    0xc4ac_5665,
    0xf429_2244,
    0x432a_ff97,
    0xab94_23a7,
    0xfc93_a039,
    0x655b_59c3,
    0x8f0c_cc92,
    0xffef_f47d,
    0x8584_5dd1,
    0x6fa8_7e4f,
    0xfe2c_e6e0,
    0xa301_4314,
    0x4e08_11a1,
    0xf753_7e82,
    0xbd3a_f235,
    0x2ad7_d2bb,
    0xeb86_d391,
];

/// One `u32` per lane; the operations are lane by lane (the compiler vectorises them).
#[derive(Clone, Copy)]
struct V<const N: usize>([u32; N]);

impl<const N: usize> V<N> {
    #[inline(always)]
    fn splat(x: u32) -> Self {
        V([x; N])
    }
    #[inline(always)]
    fn zip(self, o: Self, f: impl Fn(u32, u32) -> u32) -> Self {
        V(std::array::from_fn(|i| f(self.0[i], o.0[i])))
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.zip(o, u32::wrapping_add)
    }
    #[inline(always)]
    fn and(self, o: Self) -> Self {
        self.zip(o, |a, b| a & b)
    }
    #[inline(always)]
    fn or(self, o: Self) -> Self {
        self.zip(o, |a, b| a | b)
    }
    #[inline(always)]
    fn xor(self, o: Self) -> Self {
        self.zip(o, |a, b| a ^ b)
    }
    #[inline(always)]
    fn not(self) -> Self {
        V(self.0.map(|a| !a))
    }
    #[inline(always)]
    fn rotl<const S: u32>(self) -> Self {
        V(self.0.map(|a| a.rotate_left(S)))
    }
}

#[inline(always)]
fn f<const N: usize>(b: V<N>, c: V<N>, d: V<N>) -> V<N> {
    d.xor(b.and(c.xor(d)))
}
#[inline(always)]
fn g<const N: usize>(b: V<N>, c: V<N>, d: V<N>) -> V<N> {
    c.xor(d.and(b.xor(c)))
}
#[inline(always)]
fn h<const N: usize>(b: V<N>, c: V<N>, d: V<N>) -> V<N> {
    b.xor(c).xor(d)
}
#[inline(always)]
fn i<const N: usize>(b: V<N>, c: V<N>, d: V<N>) -> V<N> {
    c.xor(b.or(d.not()))
}

/// One md5 step: `a = b + ((a + m + k + fn(b, c, d)) <<< s)`, summed in that order so that
/// only `fn`, one addition, the rotation and the last addition wait for `b` (the step before).
macro_rules! step {
    ($fn:ident, $a:ident, $b:ident, $c:ident, $d:ident, $m:expr, $k:expr, $s:literal) => {
        $a = $b.add(
            $a.add($m)
                .add(V::splat($k))
                .add($fn($b, $c, $d))
                .rotl::<$s>(),
        );
    };
}

/// md5's compression of one 64-byte block per lane (RFC 1321, 3.4), lanes side by side:
/// `state[word][lane]`, `words[j][lane]`.
#[inline(always)]
fn compress<const N: usize>(state: &mut [[u32; N]; 4], words: &[[u32; N]; 16]) {
    let m: [V<N>; 16] = std::array::from_fn(|j| V(words[j]));
    // Opaque to the optimiser: with the constants known, it adds them last, after `fn`, which
    // puts one more addition on the chain from step to step (about 15% slower).
    let k: &[u32; 64] = std::hint::black_box(&K);
    let (a0, b0, c0, d0) = (V(state[0]), V(state[1]), V(state[2]), V(state[3]));
    let (mut a, mut b, mut c, mut d) = (a0, b0, c0, d0);
    step!(f, a, b, c, d, m[0], k[0], 7);
    step!(f, d, a, b, c, m[1], k[1], 12);
    step!(f, c, d, a, b, m[2], k[2], 17);
    step!(f, b, c, d, a, m[3], k[3], 22);
    step!(f, a, b, c, d, m[4], k[4], 7);
    step!(f, d, a, b, c, m[5], k[5], 12);
    step!(f, c, d, a, b, m[6], k[6], 17);
    step!(f, b, c, d, a, m[7], k[7], 22);
    step!(f, a, b, c, d, m[8], k[8], 7);
    step!(f, d, a, b, c, m[9], k[9], 12);
    step!(f, c, d, a, b, m[10], k[10], 17);
    step!(f, b, c, d, a, m[11], k[11], 22);
    step!(f, a, b, c, d, m[12], k[12], 7);
    step!(f, d, a, b, c, m[13], k[13], 12);
    step!(f, c, d, a, b, m[14], k[14], 17);
    step!(f, b, c, d, a, m[15], k[15], 22);

    step!(g, a, b, c, d, m[1], k[16], 5);
    step!(g, d, a, b, c, m[6], k[17], 9);
    step!(g, c, d, a, b, m[11], k[18], 14);
    step!(g, b, c, d, a, m[0], k[19], 20);
    step!(g, a, b, c, d, m[5], k[20], 5);
    step!(g, d, a, b, c, m[10], k[21], 9);
    step!(g, c, d, a, b, m[15], k[22], 14);
    step!(g, b, c, d, a, m[4], k[23], 20);
    step!(g, a, b, c, d, m[9], k[24], 5);
    step!(g, d, a, b, c, m[14], k[25], 9);
    step!(g, c, d, a, b, m[3], k[26], 14);
    step!(g, b, c, d, a, m[8], k[27], 20);
    step!(g, a, b, c, d, m[13], k[28], 5);
    step!(g, d, a, b, c, m[2], k[29], 9);
    step!(g, c, d, a, b, m[7], k[30], 14);
    step!(g, b, c, d, a, m[12], k[31], 20);

    step!(h, a, b, c, d, m[5], k[32], 4);
    step!(h, d, a, b, c, m[8], k[33], 11);
    step!(h, c, d, a, b, m[11], k[34], 16);
    step!(h, b, c, d, a, m[14], k[35], 23);
    step!(h, a, b, c, d, m[1], k[36], 4);
    step!(h, d, a, b, c, m[4], k[37], 11);
    step!(h, c, d, a, b, m[7], k[38], 16);
    step!(h, b, c, d, a, m[10], k[39], 23);
    step!(h, a, b, c, d, m[13], k[40], 4);
    step!(h, d, a, b, c, m[0], k[41], 11);
    step!(h, c, d, a, b, m[3], k[42], 16);
    step!(h, b, c, d, a, m[6], k[43], 23);
    step!(h, a, b, c, d, m[9], k[44], 4);
    step!(h, d, a, b, c, m[12], k[45], 11);
    step!(h, c, d, a, b, m[15], k[46], 16);
    step!(h, b, c, d, a, m[2], k[47], 23);

    step!(i, a, b, c, d, m[0], k[48], 6);
    step!(i, d, a, b, c, m[7], k[49], 10);
    step!(i, c, d, a, b, m[14], k[50], 15);
    step!(i, b, c, d, a, m[5], k[51], 21);
    step!(i, a, b, c, d, m[12], k[52], 6);
    step!(i, d, a, b, c, m[3], k[53], 10);
    step!(i, c, d, a, b, m[10], k[54], 15);
    step!(i, b, c, d, a, m[1], k[55], 21);
    step!(i, a, b, c, d, m[8], k[56], 6);
    step!(i, d, a, b, c, m[15], k[57], 10);
    step!(i, c, d, a, b, m[6], k[58], 15);
    step!(i, b, c, d, a, m[13], k[59], 21);
    step!(i, a, b, c, d, m[4], k[60], 6);
    step!(i, d, a, b, c, m[11], k[61], 10);
    step!(i, c, d, a, b, m[2], k[62], 15);
    step!(i, b, c, d, a, m[9], k[63], 21);

    state[0] = a.add(a0).0;
    state[1] = b.add(b0).0;
    state[2] = c.add(c0).0;
    state[3] = d.add(d0).0;
}

/// The 16 little-endian message words of block `round` of each lane, lanes side by side:
/// `words[j][lane]`.
#[inline(always)]
fn words<const N: usize>(blocks: &[&[[u8; 64]]; N], round: usize) -> [[u32; N]; 16] {
    let mut m = [[0u32; N]; 16];
    for (lane, blocks) in blocks.iter().enumerate() {
        let (block_words, _) = blocks[round].as_chunks::<4>();
        for (j, w) in block_words.iter().enumerate() {
            m[j][lane] = u32::from_le_bytes(*w);
        }
    }
    m
}

/// `n` compressions of `N` lanes: lane `l` hashes `blocks[l][0..n]` one after the other.
/// 16 lanes go to [`avx512::rounds_16`] (which transposes in registers on AVX-512), the others
/// to [`rounds_portable`].
#[inline(always)]
fn rounds<const N: usize>(state: &mut [[u32; N]; 4], n: usize, blocks: &[&[[u8; 64]]; N]) {
    let Ok(blocks16) = <&[&[[u8; 64]]; 16]>::try_from(blocks.as_slice()) else {
        return rounds_portable(state, n, blocks);
    };
    let mut state16 = [[0u32; 16]; 4];
    for (to, from) in state16.iter_mut().zip(state.iter()) {
        to.copy_from_slice(from);
    }
    avx512::rounds_16(&mut state16, n, blocks16);
    for (to, from) in state.iter_mut().zip(state16.iter()) {
        to.copy_from_slice(from);
    }
}

/// [`rounds`] with the element-by-element transpose ([`words`]). Compiled for the reduction
/// kernels' targets (the same priority, so the same pick as [`crate::value::selected_kernel`]);
/// the operations are the same on each, only the vector width differs.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq", "x86_64+avx2"))]
fn rounds_portable<const N: usize>(state: &mut [[u32; N]; 4], n: usize, blocks: &[&[[u8; 64]]; N]) {
    for round in 0..n {
        compress(state, &words(blocks, round));
    }
}

/// 16 lanes with the message words transposed in registers on AVX-512: each lane's block is
/// one vector load, and four stages of `vpermt2d` (one per bit of the word and lane indices)
/// turn the 16 blocks into 16 vectors of one word each, where [`words`] moves the 256 words
/// one by one (about a fifth of a 16-lane round). Safe code: intrinsics without pointers are
/// safe in a `target_feature` function, which `multiversion` 0.9's clones are (0.8's are not,
/// hence the second version of the crate, used only here), and `bytemuck` moves bytes in and out
/// of `__m512i` by value.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::compress;
    use multiversion_tf11 as multiversion;
    use multiversion_tf11::{multiversion, target::match_target};
    use std::arch::x86_64::{__m512i, _mm512_permutex2var_epi32};

    /// [`super::rounds`] at 16 lanes: [`rounds16`] on a CPU with Ice Lake's AVX-512 set
    /// (`multiversion` 0.9's AVX-512 target), else [`super::rounds_portable`].
    #[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq"))]
    pub(super) fn rounds_16(state: &mut [[u32; 16]; 4], n: usize, blocks: &[&[[u8; 64]]; 16]) {
        match_target! {
            "x86_64+avx512f" => rounds16(state, n, blocks),
            _ => super::rounds_portable(state, n, blocks),
        }
    }

    /// For the stage that swaps bit `b` of the word index with bit `b` of the lane index, the
    /// `vpermt2d` indices of the pair's lower row (element `c` of itself where bit `b` of `c`
    /// is clear, else element `c - b` of its partner, index `16 + c - b`) and of its upper row
    /// (element `c + b` of the lower row, or `c` of itself).
    const fn stage_indices(b: usize) -> ([u32; 16], [u32; 16]) {
        let mut lo = [0u32; 16];
        let mut hi = [0u32; 16];
        let mut c = 0;
        while c < 16 {
            if c & b == 0 {
                lo[c] = c as u32;
                hi[c] = (c + b) as u32;
            } else {
                lo[c] = (16 + c - b) as u32;
                hi[c] = (16 + c) as u32;
            }
            c += 1;
        }
        (lo, hi)
    }

    const STAGES: [([u32; 16], [u32; 16]); 4] = [
        stage_indices(1),
        stage_indices(2),
        stage_indices(4),
        stage_indices(8),
    ];

    /// One stage on the listed pairs of rows (`i`, `i + b`), written out so that every row
    /// stays in a register (a loop over the pairs kept them in memory).
    macro_rules! stage {
        ($r:ident, $indices:expr, $(($i:literal, $j:literal)),*) => {{
            let (lo, hi): (__m512i, __m512i) =
                (bytemuck::cast($indices.0), bytemuck::cast($indices.1));
            $(
                let (x, y) = ($r[$i], $r[$j]);
                $r[$i] = _mm512_permutex2var_epi32(x, lo, y);
                $r[$j] = _mm512_permutex2var_epi32(x, hi, y);
            )*
        }};
    }

    /// `rows[lane]` (one block: 16 little-endian words) to `words[j][lane]`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[rustfmt::skip]
    fn transpose(mut r: [__m512i; 16]) -> [[u32; 16]; 16] {
        stage!(r, STAGES[0], (0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15));
        stage!(r, STAGES[1], (0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15));
        stage!(r, STAGES[2], (0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15));
        stage!(r, STAGES[3], (0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15));
        r.map(bytemuck::cast)
    }

    /// The rounds with [`transpose`].
    #[target_feature(enable = "avx512f,avx512vl,avx512dq")]
    fn rounds16(state: &mut [[u32; 16]; 4], n: usize, blocks: &[&[[u8; 64]]; 16]) {
        let blocks: [&[[u8; 64]]; 16] = std::array::from_fn(|lane| &blocks[lane][..n]);
        // `round` indexes the 16 lanes' slices at once.
        #[allow(clippy::needless_range_loop)]
        for round in 0..n {
            let words = transpose(std::array::from_fn(|lane| {
                bytemuck::cast(blocks[lane][round])
            }));
            compress(state, &words);
        }
    }
}

/// Elsewhere the 16 lanes are the portable ones.
#[cfg(not(target_arch = "x86_64"))]
mod avx512 {
    pub(super) use super::rounds_portable as rounds_16;
}

/// A buffer being hashed in a lane.
struct Lane<B, T> {
    /// The caller's buffer and its tag.
    data: B,
    tag: T,
    /// The byte offset of the next whole block of `data`.
    next: usize,
    /// Where the whole blocks end.
    whole: usize,
    /// The last partial block, the padding and the length: one or two blocks.
    tail: [[u8; 64]; 2],
    tail_blocks: usize,
    tail_next: usize,
    state: [u32; 4],
}

impl<B: AsRef<[u8]>, T> Lane<B, T> {
    fn new(data: B, tag: T) -> Self {
        let bytes = data.as_ref();
        let whole = bytes.len() / 64 * 64;
        let rest = &bytes[whole..];
        let mut tail = [0u8; 128];
        tail[..rest.len()].copy_from_slice(rest);
        tail[rest.len()] = 0x80;
        let tail_blocks = if rest.len() < 56 { 1 } else { 2 };
        let bits = (bytes.len() as u64).wrapping_mul(8);
        tail[tail_blocks * 64 - 8..tail_blocks * 64].copy_from_slice(&bits.to_le_bytes());
        let (tail_chunks, _) = tail.as_chunks::<64>();
        Lane {
            tail: [tail_chunks[0], tail_chunks[1]],
            data,
            tag,
            next: 0,
            whole,
            tail_blocks,
            tail_next: 0,
            state: INIT,
        }
    }

    fn remaining(&self) -> usize {
        (self.whole - self.next) / 64 + self.tail_blocks - self.tail_next
    }

    /// The next blocks that lie one after the other: the rest of the whole blocks, or (after
    /// them) the rest of the tail.
    fn contiguous(&self) -> &[[u8; 64]] {
        if self.next < self.whole {
            self.data.as_ref()[self.next..self.whole]
                .as_chunks::<64>()
                .0
        } else {
            &self.tail[self.tail_next..self.tail_blocks]
        }
    }

    fn advance(&mut self, blocks: usize) {
        let whole = ((self.whole - self.next) / 64).min(blocks);
        self.next += whole * 64;
        self.tail_next += blocks - whole;
    }

    fn digest(&self) -> Md5Digest {
        let mut out = [0u8; 16];
        for (chunk, word) in out.chunks_exact_mut(4).zip(self.state) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        Md5Digest(out)
    }
}

/// The most blocks per lane in one [`Md5Lanes::run`] (the zero blocks of an unused lane are this
/// long).
const MAX_ROUNDS: usize = 64;

/// What an unused lane of a vector hashes (its result is not used).
static ZEROS: [[u8; 64]; MAX_ROUNDS] = [[0; 64]; MAX_ROUNDS];

/// The most lanes the rounds this process runs fill: 16 (AVX-512), 8 (AVX2) or 4 (baseline).
fn widest() -> usize {
    match crate::value::reduce::selected_kernel() {
        "avx512" => 16,
        "avx2" => 8,
        _ => 4,
    }
}

/// Hashes buffers in SIMD lanes as they come: [`Md5Lanes::push`] a buffer with a tag, call
/// [`Md5Lanes::run`] until [`Md5Lanes::is_idle`]; each finished buffer comes back with its tag
/// and md5. `B` is any byte buffer (`Vec<u8>` to hand ownership over and get it back, `&[u8]`
/// to borrow).
pub struct Md5Lanes<B, T> {
    lanes: Vec<Option<Lane<B, T>>>,
    /// The fewest buffers in flight that the vector rounds take (fewer: one by one).
    vector_from: usize,
    waiting: VecDeque<(B, T)>,
}

impl<B: AsRef<[u8]>, T> Default for Md5Lanes<B, T> {
    fn default() -> Self {
        Md5Lanes::new()
    }
}

impl<B: AsRef<[u8]>, T> Md5Lanes<B, T> {
    /// As many lanes as this CPU's vectors hold (16, 8 or 4).
    #[must_use]
    pub fn new() -> Self {
        Md5Lanes::with_max_lanes(16)
    }

    /// At most `max` lanes (rounded down to 16, 8, 4 or 1; 1 hashes one buffer after the other):
    /// to compare widths, or to leave vector units to other work.
    #[must_use]
    pub fn with_max_lanes(max: usize) -> Self {
        let widest = widest();
        let width = [16, 8, 4, 1]
            .into_iter()
            .find(|&w| w <= max.min(widest))
            .unwrap_or(1);
        Md5Lanes {
            lanes: (0..width).map(|_| None).collect(),
            // AVX-512 rotates in one instruction: 8 lanes beat one by one from 3 buffers.
            vector_from: if widest == 16 { 3 } else { 4 },
            waiting: VecDeque::new(),
        }
    }

    /// How many buffers are hashed at once.
    #[must_use]
    pub fn num_lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Queues `data` for hashing.
    pub fn push(&mut self, data: B, tag: T) {
        self.waiting.push_back((data, tag));
    }

    /// `true` when no buffer is waiting or being hashed.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.lanes.iter().all(Option::is_none)
    }

    /// Hashes up to `budget` blocks per lane (at least one; fewer when a buffer finishes first),
    /// and hands each finished buffer to `done` with its tag and md5, in lane order.
    pub fn run(&mut self, budget: usize, mut done: impl FnMut(B, T, Md5Digest)) {
        for slot in &mut self.lanes {
            if slot.is_none() {
                if let Some((data, tag)) = self.waiting.pop_front() {
                    *slot = Some(Lane::new(data, tag));
                }
            }
        }
        let width = self.lanes.len();
        let mut active: Vec<&mut Lane<B, T>> = self.lanes.iter_mut().flatten().collect();
        // No lane crosses from its data into its tail within a run: each reads one slice.
        let Some(n) = active.iter().map(|l| l.contiguous().len()).min() else {
            return;
        };
        let n = n.min(budget.max(1)).min(MAX_ROUNDS);
        if active.len() < self.vector_from || width == 1 {
            for lane in &mut active {
                group::<1, B, T>(std::slice::from_mut(lane), n);
            }
        } else if width == 16 && active.len() > 8 {
            group::<16, B, T>(&mut active, n);
        } else if width >= 8 {
            for chunk in active.chunks_mut(8) {
                group::<8, B, T>(chunk, n);
            }
        } else {
            for chunk in active.chunks_mut(4) {
                group::<4, B, T>(chunk, n);
            }
        }
        for slot in &mut self.lanes {
            if slot.as_ref().is_some_and(|l| l.remaining() == 0) {
                if let Some(lane) = slot.take() {
                    let digest = lane.digest();
                    done(lane.data, lane.tag, digest);
                }
            }
        }
    }
}

/// `n` rounds of up to `N` lanes (the vector's other lanes hash zeros, unused).
fn group<const N: usize, B: AsRef<[u8]>, T>(lanes: &mut [&mut Lane<B, T>], n: usize) {
    let mut state = [[0u32; N]; 4];
    for (l, lane) in lanes.iter().enumerate() {
        for (w, word) in lane.state.iter().enumerate() {
            state[w][l] = *word;
        }
    }
    {
        let view: &[&mut Lane<B, T>] = lanes;
        let blocks: [&[[u8; 64]]; N] = std::array::from_fn(|l| match view.get(l) {
            Some(lane) => &lane.contiguous()[..n],
            None => &ZEROS[..n],
        });
        rounds(&mut state, n, &blocks);
    }
    for (l, lane) in lanes.iter_mut().enumerate() {
        for (w, word) in lane.state.iter_mut().enumerate() {
            *word = state[w][l];
        }
        lane.advance(n);
    }
}

/// The md5 of each buffer, in order, hashed in SIMD lanes ([`Md5Lanes`]): the same digests as
/// [`Md5Digest::of_bytes`] of each.
#[must_use]
pub fn md5_of_many(buffers: &[&[u8]]) -> Vec<Md5Digest> {
    if buffers.len() < 2 {
        return buffers.iter().map(|b| Md5Digest::of_bytes(b)).collect();
    }
    let mut lanes: Md5Lanes<&[u8], usize> = Md5Lanes::new();
    let mut out = vec![Md5Digest([0; 16]); buffers.len()];
    // Longest first: the long buffers run side by side in the full width while the lanes left
    // over cycle through the short ones, and the short ones fill the lanes at the end (in call
    // order, the long ones left last run with idle lanes, or at the narrower widths).
    let mut order: Vec<usize> = (0..buffers.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(buffers[i].len()));
    for i in order {
        lanes.push(buffers[i], i);
    }
    while !lanes.is_idle() {
        lanes.run(MAX_ROUNDS, |_, i, md5| out[i] = md5);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Hashes `inputs` with lanes of at most `max`, `budget` blocks per run, pushing while
    /// running; checks each buffer comes back with its tag.
    fn hash_all(max: usize, inputs: &[Vec<u8>], budget: usize) -> Vec<Md5Digest> {
        let mut lanes = Md5Lanes::with_max_lanes(max);
        let mut out = vec![None; inputs.len()];
        for (i, data) in inputs.iter().enumerate() {
            lanes.push(data.clone(), i);
            if i % 3 == 0 {
                lanes.run(budget, |_, tag, md5| out[tag] = Some(md5));
            }
        }
        while !lanes.is_idle() {
            lanes.run(budget, |data, tag, md5| {
                assert_eq!(data, inputs[tag]);
                out[tag] = Some(md5);
            });
        }
        out.into_iter().map(|d| d.expect("hashed")).collect()
    }

    #[test]
    fn every_length_up_to_300_and_large_buffers_are_md5() {
        let mut inputs: Vec<Vec<u8>> = (0..=300).map(|len| bytes(len, len as u64)).collect();
        for (i, len) in [4096, 65_536 + 7, 1 << 20, 3 * 64 * 1024 + 55, 100_000]
            .iter()
            .enumerate()
        {
            inputs.push(bytes(*len, 1000 + i as u64));
        }
        let want: Vec<Md5Digest> = inputs.iter().map(|d| Md5Digest::of_bytes(d)).collect();
        for max in [16, 8, 4, 1] {
            for budget in [1, 7, 64, 1 << 20] {
                assert_eq!(
                    hash_all(max, &inputs, budget),
                    want,
                    "{max} lanes, budget {budget}"
                );
            }
        }
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        assert_eq!(md5_of_many(&refs), want);
    }

    #[test]
    fn every_number_of_buffers_of_different_lengths_is_md5() {
        for max in [16, 8, 4, 1] {
            for count in 0..=40 {
                let inputs: Vec<Vec<u8>> = (0..count)
                    .map(|i| bytes(3000 + 577 * i + (i * i) % 131, i as u64))
                    .collect();
                let want: Vec<Md5Digest> = inputs.iter().map(|d| Md5Digest::of_bytes(d)).collect();
                assert_eq!(
                    hash_all(max, &inputs, 16),
                    want,
                    "{max} lanes, {count} buffers"
                );
                if max == 16 {
                    let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                    assert_eq!(md5_of_many(&refs), want, "{count} buffers at once");
                }
            }
        }
    }

    #[test]
    fn golden_digests_are_rfc_1321() {
        // RFC 1321, A.5.
        let cases: [(&[u8], &str); 4] = [
            (b"", "d41d8cd98f00b204e9800998ecf8427e"),
            (b"abc", "900150983cd24fb0d6963f7d28e17f72"),
            (b"message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
            (
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "57edf4a22be3c955ac49da2e2107b67a",
            ),
        ];
        let buffers: Vec<&[u8]> = cases.iter().map(|c| c.0).collect();
        let got = md5_of_many(&buffers);
        for ((_, want), got) in cases.iter().zip(got) {
            assert_eq!(got.to_string(), *want);
        }
    }

    #[test]
    fn lanes_are_capped_and_never_wider_than_the_cpu() {
        assert_eq!(Md5Lanes::<Vec<u8>, ()>::with_max_lanes(1).num_lanes(), 1);
        assert_eq!(Md5Lanes::<Vec<u8>, ()>::with_max_lanes(5).num_lanes(), 4);
        assert_eq!(Md5Lanes::<Vec<u8>, ()>::with_max_lanes(0).num_lanes(), 1);
        assert_eq!(Md5Lanes::<Vec<u8>, ()>::new().num_lanes(), widest());
    }
}
