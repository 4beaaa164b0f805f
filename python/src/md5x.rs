//! md5 of many buffers at once: one md5 per SIMD lane (16 lanes of AVX-512, 8 of AVX2).
//!
//! md5 is a chain: each 64-byte block of a message depends on the previous one, so one
//! message cannot be hashed faster than one core's latency allows (about 600 MB/s). Independent
//! messages can: [`Lanes`] hashes each buffer it is given in a lane of its own, a block per lane
//! per round, and a buffer that finishes frees its lane for the next one waiting. On AVX-512 the
//! rounds run 16 lanes (8 while at most 8 buffers are in flight); on AVX2 8 lanes; with two
//! buffers or fewer (three on AVX2, where a lane is slower) scalar rounds, one buffer after the
//! other, which are quicker for so few. A vector round costs about as much with one buffer as
//! with all its lanes busy, so the more buffers at once the better (the writer hands its thread
//! records in batches). Without either, [`Simd::None`], callers hash each buffer whole with the `md-5` crate
//! (`detcheck::value::Md5Digest`), and `Lanes` is not used.
//!
//! Determinism: every lane computes RFC 1321 md5 of its own buffer (the same 64 steps, the same
//! padding), so a digest is `hashlib.md5(bytes)` whatever the lane, the width or the other
//! buffers; the tests compare every length up to 300 bytes and large buffers with `md-5`.
//!
//! `unsafe`: to call the `#[target_feature]` functions, each after the CPU was found to have the
//! feature ([`Simd::detect`]), and for the unaligned vector loads and stores of the transposes
//! (`simd`), each of a 64-byte block or row it borrows. The rounds themselves are safe Rust
//! (arrays of `u32` the compiler turns into vector instructions).

#![allow(unsafe_code)]

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

/// The 16 little-endian message words of each lane's block, lanes side by side:
/// `words[j][lane]` (element by element; the vector versions transpose in registers).
#[inline(always)]
fn words<const N: usize>(blocks: &[&[u8; 64]; N]) -> [[u32; N]; 16] {
    let mut m = [[0u32; N]; 16];
    for (lane, block) in blocks.iter().enumerate() {
        for (j, w) in block.chunks_exact(4).enumerate() {
            m[j][lane] = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        }
    }
    m
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

/// Block `round` of each lane: lane `l` hashes the blocks of `blocks[l]` one after the other.
#[inline(always)]
fn round_blocks<'a, const N: usize>(blocks: &[&'a [u8]; N], round: usize) -> [&'a [u8; 64]; N] {
    let at = round * 64;
    std::array::from_fn(|l| {
        blocks[l][at..at + 64]
            .try_into()
            .expect("n blocks per lane")
    })
}

/// Runs `n` compressions of `N` lanes, element by element.
#[inline(always)]
fn rounds<const N: usize>(state: &mut [[u32; N]; 4], n: usize, blocks: &[&[u8]; N]) {
    for round in 0..n {
        compress(state, &words(&round_blocks(blocks, round)));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl")]
fn rounds16_avx512(state: &mut [[u32; 16]; 4], n: usize, blocks: &[&[u8]; 16]) {
    for round in 0..n {
        compress(state, &simd::transpose16(&round_blocks(blocks, round)));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl")]
fn rounds8_avx512(state: &mut [[u32; 8]; 4], n: usize, blocks: &[&[u8]; 8]) {
    for round in 0..n {
        compress(state, &simd::transpose8(&round_blocks(blocks, round)));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn rounds8_avx2(state: &mut [[u32; 8]; 4], n: usize, blocks: &[&[u8]; 8]) {
    for round in 0..n {
        compress(state, &simd::transpose8(&round_blocks(blocks, round)));
    }
}

/// The message words of 16 (or 8) lanes' blocks, transposed in vector registers: each lane's
/// block is one load (two), and four (three) rounds of shuffles turn rows into columns (an
/// element-by-element gather costs a third of the AVX-512 rounds' speed, and of AVX2's).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// `words[j][lane]` of 16 lanes' blocks.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) fn transpose16(blocks: &[&[u8; 64]; 16]) -> [[u32; 16]; 16] {
        // SAFETY: each block is 64 readable bytes, one unaligned 512-bit load.
        let mut r: [__m512i; 16] =
            std::array::from_fn(|l| unsafe { _mm512_loadu_si512(blocks[l].as_ptr().cast()) });
        let mut t = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        for b in [0, 4, 8, 12] {
            r[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
            r[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
            r[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
            r[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
        }
        for b in [0, 8] {
            for k in b..b + 4 {
                t[k] = _mm512_shuffle_i32x4::<0x88>(r[k], r[k + 4]);
                t[k + 4] = _mm512_shuffle_i32x4::<0xdd>(r[k], r[k + 4]);
            }
        }
        let mut out = [[0u32; 16]; 16];
        for k in 0..8 {
            let lo = _mm512_shuffle_i32x4::<0x88>(t[k], t[k + 8]);
            let hi = _mm512_shuffle_i32x4::<0xdd>(t[k], t[k + 8]);
            // SAFETY: each row of `out` is 64 writable bytes, one unaligned 512-bit store.
            unsafe {
                _mm512_storeu_si512(out[k].as_mut_ptr().cast(), lo);
                _mm512_storeu_si512(out[k + 8].as_mut_ptr().cast(), hi);
            }
        }
        out
    }

    /// `words[j][lane]` of 8 lanes' blocks: two 8 x 8 transposes (words 0-7, 8-15).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) fn transpose8(blocks: &[&[u8; 64]; 8]) -> [[u32; 8]; 16] {
        let mut out = [[0u32; 8]; 16];
        for half in 0..2 {
            // SAFETY: bytes 32 * half .. 32 * half + 32 of each 64-byte block, one unaligned
            // 256-bit load.
            let r: [__m256i; 8] = std::array::from_fn(|l| unsafe {
                _mm256_loadu_si256(blocks[l][32 * half..].as_ptr().cast())
            });
            let mut t = [_mm256_setzero_si256(); 8];
            for i in 0..4 {
                t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
            }
            let mut u = [_mm256_setzero_si256(); 8];
            for b in [0, 4] {
                u[b] = _mm256_unpacklo_epi64(t[b], t[b + 2]);
                u[b + 1] = _mm256_unpackhi_epi64(t[b], t[b + 2]);
                u[b + 2] = _mm256_unpacklo_epi64(t[b + 1], t[b + 3]);
                u[b + 3] = _mm256_unpackhi_epi64(t[b + 1], t[b + 3]);
            }
            for k in 0..4 {
                let lo = _mm256_permute2x128_si256::<0x20>(u[k], u[k + 4]);
                let hi = _mm256_permute2x128_si256::<0x31>(u[k], u[k + 4]);
                // SAFETY: each row of `out` is 32 writable bytes, one unaligned 256-bit store.
                unsafe {
                    _mm256_storeu_si256(out[8 * half + k].as_mut_ptr().cast(), lo);
                    _mm256_storeu_si256(out[8 * half + k + 4].as_mut_ptr().cast(), hi);
                }
            }
        }
        out
    }
}

/// The vector instructions the lanes run on, found once at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Simd {
    /// AVX-512 F and VL: 16 lanes (ternary logic and rotations in one instruction each).
    Avx512,
    /// AVX2: 8 lanes.
    Avx2,
    /// Neither (or not x86-64): hash buffers one by one with `md-5`.
    None,
}

impl Simd {
    /// What this CPU has (`DETCHECK_MD5_LANES=0`, `8` or `16` caps it, for tests and benches).
    pub(crate) fn detect() -> Simd {
        let cap = std::env::var("DETCHECK_MD5_LANES").ok();
        let cap = cap
            .as_deref()
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(16);
        #[cfg(target_arch = "x86_64")]
        {
            if cap >= 16
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                return Simd::Avx512;
            }
            if cap >= 8 && std::arch::is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
        }
        let _ = cap;
        Simd::None
    }

    /// How many buffers [`Lanes`] hashes at once.
    pub(crate) fn lanes(self) -> usize {
        match self {
            Simd::Avx512 => 16,
            Simd::Avx2 => 8,
            Simd::None => 1,
        }
    }
}

/// A buffer being hashed in a lane.
struct Lane<T> {
    /// The caller's buffer and its tag.
    data: Vec<u8>,
    tag: T,
    /// The byte offset of the next whole block of `data`.
    next: usize,
    /// Where the whole blocks end.
    whole: usize,
    /// The last partial block, the padding and the length: one or two blocks.
    tail: [u8; 128],
    tail_blocks: usize,
    tail_next: usize,
    state: [u32; 4],
}

impl<T> Lane<T> {
    fn new(data: Vec<u8>, tag: T) -> Self {
        let whole = data.len() / 64 * 64;
        let rest = &data[whole..];
        let mut tail = [0u8; 128];
        tail[..rest.len()].copy_from_slice(rest);
        tail[rest.len()] = 0x80;
        let tail_blocks = if rest.len() < 56 { 1 } else { 2 };
        let bits = (data.len() as u64).wrapping_mul(8);
        tail[tail_blocks * 64 - 8..tail_blocks * 64].copy_from_slice(&bits.to_le_bytes());
        Lane {
            data,
            tag,
            next: 0,
            whole,
            tail,
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
    fn contiguous(&self) -> &[u8] {
        if self.next < self.whole {
            &self.data[self.next..self.whole]
        } else {
            &self.tail[self.tail_next * 64..self.tail_blocks * 64]
        }
    }

    fn advance(&mut self, blocks: usize) {
        let whole = ((self.whole - self.next) / 64).min(blocks);
        self.next += whole * 64;
        self.tail_next += blocks - whole;
    }

    fn digest(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (chunk, word) in out.chunks_exact_mut(4).zip(self.state) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }
}

/// The most blocks per lane in one `run` (the zero blocks of an unused lane are this long).
const MAX_ROUNDS: usize = 64;

/// What an unused lane of a vector hashes (its result is not used).
static ZEROS: [u8; 64 * MAX_ROUNDS] = [0; 64 * MAX_ROUNDS];

/// Hashes buffers in SIMD lanes as they come: [`Lanes::push`] a buffer with a tag, call
/// [`Lanes::run`] until [`Lanes::is_idle`]; each finished buffer comes back with its tag and md5.
pub(crate) struct Lanes<T> {
    simd: Simd,
    lanes: Vec<Option<Lane<T>>>,
    waiting: VecDeque<(Vec<u8>, T)>,
}

impl<T> Lanes<T> {
    /// Lanes on `simd`, which is not [`Simd::None`].
    pub(crate) fn new(simd: Simd) -> Self {
        assert!(simd != Simd::None, "no SIMD lanes without AVX2 or AVX-512");
        Lanes {
            simd,
            lanes: (0..simd.lanes()).map(|_| None).collect(),
            waiting: VecDeque::new(),
        }
    }

    /// Queues `data` for hashing.
    pub(crate) fn push(&mut self, data: Vec<u8>, tag: T) {
        self.waiting.push_back((data, tag));
    }

    /// `true` when no buffer is waiting or being hashed.
    pub(crate) fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.lanes.iter().all(Option::is_none)
    }

    /// Hashes up to `budget` blocks per lane (fewer when a buffer finishes first), and hands each
    /// finished buffer to `done` with its tag and md5.
    pub(crate) fn run(&mut self, budget: usize, mut done: impl FnMut(Vec<u8>, T, [u8; 16])) {
        for slot in &mut self.lanes {
            if slot.is_none() {
                if let Some((data, tag)) = self.waiting.pop_front() {
                    *slot = Some(Lane::new(data, tag));
                }
            }
        }
        let mut active: Vec<&mut Lane<T>> = self.lanes.iter_mut().flatten().collect();
        // No lane crosses from its data into its tail within a run: each reads one slice.
        let Some(n) = active.iter().map(|l| l.contiguous().len() / 64).min() else {
            return;
        };
        let n = n.min(budget.max(1)).min(MAX_ROUNDS);
        match (self.simd, active.len()) {
            #[cfg(target_arch = "x86_64")]
            (Simd::Avx512, 9..) => group::<16, T>(&mut active, n, run16_avx512),
            #[cfg(target_arch = "x86_64")]
            (Simd::Avx512, 3..=8) => group::<8, T>(&mut active, n, run8_avx512),
            #[cfg(target_arch = "x86_64")]
            (Simd::Avx2, 4..) => {
                for chunk in active.chunks_mut(8) {
                    group::<8, T>(chunk, n, run8_avx2);
                }
            }
            _ => {
                for lane in &mut active {
                    group::<1, T>(std::slice::from_mut(lane), n, run1);
                }
            }
        }
        for slot in &mut self.lanes {
            if slot.as_ref().is_some_and(|l| l.remaining() == 0) {
                let lane = slot.take().expect("checked");
                let digest = lane.digest();
                done(lane.data, lane.tag, digest);
            }
        }
    }
}

/// The rounds of a group of lanes: `(state, rounds, each lane's blocks)`.
type Run<const N: usize> = fn(&mut [[u32; N]; 4], usize, &[&[u8]; N]);

/// `n` rounds of up to `N` lanes (the vector's other lanes hash zeros, unused).
fn group<const N: usize, T>(lanes: &mut [&mut Lane<T>], n: usize, run: Run<N>) {
    let mut state = [[0u32; N]; 4];
    for (l, lane) in lanes.iter().enumerate() {
        for (w, word) in lane.state.iter().enumerate() {
            state[w][l] = *word;
        }
    }
    {
        let view: &[&mut Lane<T>] = lanes;
        let blocks: [&[u8]; N] = std::array::from_fn(|l| match view.get(l) {
            Some(lane) => &lane.contiguous()[..n * 64],
            None => &ZEROS[..n * 64],
        });
        run(&mut state, n, &blocks);
    }
    for (l, lane) in lanes.iter_mut().enumerate() {
        for (w, word) in lane.state.iter_mut().enumerate() {
            *word = state[w][l];
        }
        lane.advance(n);
    }
}

fn run1(state: &mut [[u32; 1]; 4], n: usize, blocks: &[&[u8]; 1]) {
    rounds(state, n, blocks);
}

#[cfg(target_arch = "x86_64")]
fn run16_avx512(state: &mut [[u32; 16]; 4], n: usize, blocks: &[&[u8]; 16]) {
    // SAFETY: `Simd::Avx512` (the only way here) means `Simd::detect` found AVX-512 F and VL.
    unsafe { rounds16_avx512(state, n, blocks) }
}

#[cfg(target_arch = "x86_64")]
fn run8_avx512(state: &mut [[u32; 8]; 4], n: usize, blocks: &[&[u8]; 8]) {
    // SAFETY: as `run16_avx512`.
    unsafe { rounds8_avx512(state, n, blocks) }
}

#[cfg(target_arch = "x86_64")]
fn run8_avx2(state: &mut [[u32; 8]; 4], n: usize, blocks: &[&[u8]; 8]) {
    // SAFETY: `Simd::Avx2` (the only way here) means `Simd::detect` found AVX2.
    unsafe { rounds8_avx2(state, n, blocks) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use detcheck::value::Md5Digest;

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

    fn hash_all(simd: Simd, inputs: &[Vec<u8>], budget: usize) -> Vec<[u8; 16]> {
        let mut lanes = Lanes::new(simd);
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

    fn available() -> Vec<Simd> {
        let mut all = vec![];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                all.push(Simd::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                all.push(Simd::Avx2);
            }
        }
        all
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
        let want: Vec<[u8; 16]> = inputs.iter().map(|d| Md5Digest::of_bytes(d).0).collect();
        for simd in available() {
            for budget in [1, 7, 64, 1 << 20] {
                assert_eq!(
                    hash_all(simd, &inputs, budget),
                    want,
                    "{simd:?}, budget {budget}"
                );
            }
        }
    }

    #[test]
    fn few_buffers_take_the_narrow_and_scalar_paths() {
        for simd in available() {
            for count in 1..=10 {
                let inputs: Vec<Vec<u8>> =
                    (0..count).map(|i| bytes(5000 + 64 * i, i as u64)).collect();
                let want: Vec<[u8; 16]> = inputs.iter().map(|d| Md5Digest::of_bytes(d).0).collect();
                assert_eq!(
                    hash_all(simd, &inputs, 16),
                    want,
                    "{simd:?}, {count} buffers"
                );
            }
        }
    }

    #[test]
    fn one_lane_rounds_are_md5() {
        let data = bytes(1000, 3);
        let mut state = [[INIT[0]], [INIT[1]], [INIT[2]], [INIT[3]]];
        let mut lane = Lane::new(data.clone(), ());
        while lane.remaining() > 0 {
            let n = lane.contiguous().len() / 64;
            rounds::<1>(&mut state, n, &[lane.contiguous()]);
            lane.advance(n);
        }
        lane.state = [state[0][0], state[1][0], state[2][0], state[3][0]];
        assert_eq!(lane.digest(), Md5Digest::of_bytes(&data).0);
    }
}
