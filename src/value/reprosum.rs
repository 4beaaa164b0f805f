//! Reproducible sums: bits that depend only on the multiset of terms.
//!
//! Floating-point addition is not associative, so a sum's bits depend on the order of additions
//! and, in a data-parallel job, on how the terms are split across ranks. Climate models solved this
//! for their global sums (CESM/E3SM's `shr_reprosum`) by adding in integers; so does this module.
//! Per element, every term `x` is put on a grid fixed by the largest magnitude among the terms
//! and by their count, `t = round(x · 2^(P − e))` where `2^e > max |x|` and `P = min(50, 62 −
//! ⌈log₂ n⌉)`; the integers are added exactly (there are `62 − P` bits of headroom for `n` terms
//! in an `i64`) and the sum is rounded once to the float type. The maximum and the count are
//! functions of the multiset, rounding a term to the grid depends on nothing else, and exact
//! addition is associative: the bits depend on the multiset only, not on the order, the split
//! across ranks, the algorithm or the backend.
//!
//! How f32 terms are put on the grid (`grid_magic`, the one definition every path uses): with the
//! rounding constant `M = 1.5 · 2^(52 + e − P)`, `fl(x + M) − M` is `x` rounded to the grid,
//! ties to even, in two f64 additions that SSE2 vectorizes, and `bits(x + M) − bits(M)` is `t`.
//! One buffer and the distributed sum add the `t`s in `i64`. The columns of an allreduce with up to
//! 8 contributions (`columns_in_f64`) never leave f64: a pair `fl(a + M) + fl(b − M)` is exactly
//! the pair's rounded sum, and 8 terms of at most `2^50` steps add exactly in an f64's 53 bits;
//! more contributions are added in `i64`. A block of columns whose terms all lie on their grids
//! already (every nonzero term within 26 binades of its element's largest: the common case) skips
//! the rounding and adds the terms in f64 as they are, exactly. Every path rounds the exact sum
//! to f32 once, so they agree bit for bit (a test checks them against each other on random,
//! special, subnormal and overflowing columns), and with the integer implementation this
//! replaced.
//!
//! Accuracy: each term is rounded on a grid of `2^(e − P)`, so the error of the sum is at most
//! `n · 2^(e − P − 1)` plus the final rounding (half an ulp of the result). For `n ≤ 4096` terms
//! `P = 50`: a term's rounding is 2⁻²⁶ of an f32 ulp of the largest term, far below a naive f32
//! sum's `(n − 1)` roundings of up to half an ulp of the partial sums. f64 terms are split over two
//! grids (`P` and `P + 50` bits below the largest), summed as `i128`: at most 2⁻⁴⁸ of an f64 ulp of
//! the largest term per term. The measured errors are in the tests and `docs/benchmarks.md`.
//!
//! Sums of outer products (`outer`: the `train` kind's weight gradients, `Σ_s delta(s) ·
//! input(s)ᵀ`) use a grid fixed before the sum from bounds, `2^(e_j + e_i − P)` with `2^e_j` above
//! the largest `|delta_j|` and `2^e_i` above the largest `|input_i|`: one `max` allreduce of
//! `p + q` values instead of one per element of `p × q`. Every exact product (two f32 multiply
//! exactly in f64) is rounded to it once and added in `i64`, so no per-sample term is ever formed
//! or rounded to f32; its accuracy is in `outer`'s docs and tests, its bits are pinned by a golden
//! digest.
//!
//! Non-finite input is deterministic: any NaN gives NaN; +∞ and −∞ together give NaN; otherwise an
//! infinity wins with its sign. A finite sum beyond the type's range rounds to ±∞. Zero sums are
//! +0.0. The result is a canonical NaN (the type's `NAN`), whatever the payloads.
//!
//! Invariant (a reproducible sum is a function of the multiset of its terms): the grid comes from
//! the largest magnitude and the count, each term is rounded to it alone, and the rounded terms add
//! exactly (in `i64`, or in f64 for up to 8 terms). Every path that must agree (one buffer, columns
//! of an allreduce, the distributed per-sample sum) uses the same grid function, `grid_magic`, and
//! rounds the exact sum once; a test checks the paths against each other, and a golden digest pins
//! the column sums' bits. Blocks whose terms are all on the grid skip the rounding (an exact f64
//! sum gives the same bits). Sums of outer products (`outer`, `train`'s weight gradients) round
//! each exact product `u_j · v_i` to a grid fixed from the bounds `max |u_j|`, `max |v_i|` and the
//! count, so they are a function of the multiset of samples; golden digests pin their bits and
//! `train`'s.
//!
//! Limits: `n` is at most 2⁶⁰ terms; the grid is per element, so a sum over ranks first needs the
//! largest magnitude of every element over every rank (one `max` allreduce: see
//! [`RankContext::reproducible_sum`](crate::RankContext::reproducible_sum)).
//!
//! Speed: the column kernels are portable Rust compiled three times (baseline x86-64, AVX2,
//! AVX-512) by the `multiversion` crate, which picks one at run time from the CPU's features. The
//! versions run the same IEEE operations in the same order per element on wider vectors (Rust
//! never contracts `a * b + c` into an FMA), so their bits are the same; the tests compare the
//! dispatched kernel with the one-buffer sum, which is not multiversioned, and a golden digest
//! pins the column sums. With AVX2 or AVX-512 an elementwise sum of 4 contributions costs
//! 1.8×–2× a plain f32 loop with the data in L2 and 0.8×–0.85× from memory, where it reads each
//! term once (`cargo bench --bench detcheck -- columns`; `docs/benchmarks.md`).

use multiversion::multiversion;

/// Headroom bits: `i64` sums of up to 2^(62 − P) grid values cannot overflow.
const MAX_PRECISION: i32 = 50;

/// Bits of a term kept on the grid below the largest magnitude, for `num_terms` terms.
pub(crate) fn precision(num_terms: u64) -> i32 {
    let log2 = 64 - num_terms.saturating_sub(1).leading_zeros() as i32;
    MAX_PRECISION.min(62 - log2)
}

/// `2^k` as an f64, for `k` in the normal range.
fn pow2(k: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&k));
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// Rounds `t` (|t| < 2^51) to the nearest integer, ties to even, without a libm call: adding and
/// subtracting 1.5 · 2^52 leaves the integer in the low mantissa bits.
#[inline]
fn round_to_i64(t: f64) -> i64 {
    const MAGIC: f64 = 6_755_399_441_055_744.0; // 1.5 · 2^52
    (t + MAGIC).to_bits() as i64 - MAGIC.to_bits() as i64
}

/// The smallest `e` with `2^e > m` for a finite `m > 0`.
fn exponent_above(m: f64) -> i32 {
    let bits = m.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    if biased == 0 {
        // Subnormal: 2^-1022 is above it.
        -1022
    } else {
        biased - 1022
    }
}

/// What the non-finite terms of a sum decide, if anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Specials {
    pub(crate) nan: bool,
    pub(crate) pos_inf: bool,
    pub(crate) neg_inf: bool,
}

impl Specials {
    pub(crate) fn note(&mut self, x: f64) {
        if x.is_nan() {
            self.nan = true;
        } else if x == f64::INFINITY {
            self.pos_inf = true;
        } else if x == f64::NEG_INFINITY {
            self.neg_inf = true;
        }
    }

    /// The result when a non-finite term decides it.
    pub(crate) fn result(self) -> Option<f64> {
        match (
            self.nan || (self.pos_inf && self.neg_inf),
            self.pos_inf,
            self.neg_inf,
        ) {
            (true, _, _) => Some(f64::NAN),
            (false, true, _) => Some(f64::INFINITY),
            (false, _, true) => Some(f64::NEG_INFINITY),
            _ => None,
        }
    }
}

/// The grid of one element's sum: terms are scaled by `2^(precision − exponent)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grid {
    exponent: i32,
    precision: i32,
}

impl Grid {
    /// The grid for terms whose largest magnitude is `max_abs` (finite), `num_terms` of them;
    /// `None` when every term is zero.
    pub(crate) fn new(max_abs: f64, num_terms: u64) -> Option<Grid> {
        (max_abs > 0.0).then(|| Grid {
            exponent: exponent_above(max_abs),
            precision: precision(num_terms),
        })
    }

    /// The scale that puts a term on the first grid. Split in two factors so that neither leaves
    /// the normal range for tiny or huge exponents.
    #[inline]
    fn scale(self) -> (f64, f64) {
        let k = self.precision - self.exponent;
        let half = k / 2;
        (pow2(half), pow2(k - half))
    }

    /// An f64 term on two grids: the integer at `P` bits and the rest at `P + 50` bits.
    #[inline]
    pub(crate) fn f64_term(self, x: f64) -> (i64, i64) {
        let (a, b) = self.scale();
        let t = x * a * b;
        let high = round_to_i64(t);
        // `t − high` is exact (|t| < 2^51, and `high` is t's nearest integer), so is its scaling;
        // the second grid has the same headroom as the first.
        let low = round_to_i64((t - high as f64) * pow2(self.precision));
        (high, low)
    }

    /// The f64 nearest to a two-grid sum.
    pub(crate) fn f64_sum(self, high: i64, low: i64) -> f64 {
        let (a, b) = self.scale();
        let exact = (i128::from(high) << self.precision) + i128::from(low);
        // i128 → f64 rounds once; dividing by powers of two is exact in the normal range.
        (exact as f64) / pow2(self.precision) / a / b
    }
}

/// The power of two of `|x|`'s binade, `2^(E − 127)` for a biased exponent `E`: 0 for zeros and
/// subnormals, +∞ for ±∞ and NaN. Masking the mantissa turns NaN into +∞, so the largest binade
/// of a set of terms is a plain `>` maximum (SSE2's `maxps`), with no NaN to propagate.
#[inline]
fn binade(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0x7f80_0000)
}

/// `max(top, binade(x))`, branch-free.
#[inline]
fn max_binade(top: f32, x: f32) -> f32 {
    let b = binade(x);
    if b > top {
        b
    } else {
        top
    }
}

/// `1.5 · 2^(53 − P)`: the factor that turns an element's largest binade into its rounding
/// constant ([`grid_magic`]).
#[inline]
fn magic_factor(precision: i32) -> f64 {
    1.5 * pow2(53 - precision)
}

/// The grid of one f32 element's sum, as a rounding constant: `M = 1.5 · 2^(52 + e − P)`, where
/// `top` is the largest binade among the terms ([`binade`]), `2^e > max |x|` (`e = −126` when
/// every term is zero or subnormal) and `factor = magic_factor(P)`. `M` is +∞ when a term is not
/// finite.
///
/// This is the one definition of the f32 grid: every path (one buffer, columns, distributed) puts
/// a term `x` on it as `fl(x + M) − M`, which is `x` rounded to a multiple of the grid step
/// `2^(e − P)`, ties to even, exactly (`M`'s binade has that step as its ulp and holds `x + M`
/// for `|x| < 2^(51 + e − P)`). The integer count of steps is `bits(x + M) − bits(M)`;
/// `fl(x − M) + M` rounds `x` the same way (`M / step` is even, so ties go to even steps).
#[inline]
fn grid_magic(top: f32, factor: f64) -> f64 {
    magic_of_top(if top > LOWEST_TOP { top } else { LOWEST_TOP }, factor)
}

/// The zero/subnormal binade's stand-in, `2^-127`: twice it is `2^e` for `e = −126`. A maximum of
/// binades that starts from it needs no further clamp ([`magic_of_top`]).
const LOWEST_TOP: f32 = 1.0 / (1u128 << 127) as f32;

/// [`grid_magic`] for a `top` of at least [`LOWEST_TOP`]: `2^e = 2 · top`, so
/// `M = top · 1.5 · 2^(53 − P)`.
#[inline]
fn magic_of_top(top: f32, factor: f64) -> f64 {
    f64::from(top) * factor
}

/// The grid step `2^(e − P)` of a rounding constant `M = 1.5 · 2^(52 + e − P)`: clearing the
/// mantissa leaves `2^(52 + e − P)`, and the division by `2^52` is exact.
#[inline]
fn grid_step(magic: f64) -> f64 {
    f64::from_bits(magic.to_bits() & 0xfff0_0000_0000_0000) * pow2(-52)
}

/// The number of grid steps of `x` (rounded to nearest, ties to even) on the grid of `magic`.
#[inline]
fn grid_steps(x: f32, magic: f64) -> i64 {
    ((f64::from(x) + magic).to_bits() as i64).wrapping_sub(magic.to_bits() as i64)
}

/// The f32 nearest to `sum` grid steps of `step` (a power of two, at least `2^-970`), rounded
/// once (ties to even; beyond the range, ±∞). Up to 2^53 steps the product is exact in f64 and
/// only the conversion rounds. A larger sum is first rounded to odd at 53 bits (the bits shifted
/// out collapse into the last bit kept), which is exact in f64 and, having more than 24 + 1
/// bits, rounds to the same f32 as the exact sum, whether that is normal, subnormal or ±∞.
#[inline]
fn f32_from_grid(sum: i64, step: f64) -> f32 {
    let magnitude = sum.unsigned_abs();
    if magnitude <= 1 << 53 {
        return (sum as f64 * step) as f32;
    }
    let shift = 11 - magnitude.leading_zeros();
    let sticky = u64::from(magnitude & ((1 << shift) - 1) != 0);
    let odd = ((magnitude >> shift) | sticky) as f64 * f64::from(1u32 << shift);
    let value = odd * step;
    (if sum < 0 { -value } else { value }) as f32
}

/// The reproducible sum of f32 terms: its bits depend only on the multiset of `terms`, and it is
/// within `n · 2^(e − P − 1)` plus half an ulp of the exact sum (see the module docs).
#[must_use]
pub fn reproducible_sum_f32(terms: &[f32]) -> f32 {
    // Pass 1, branch-free so it vectorizes: the largest binade (+∞ if a term is not finite).
    let mut tops = [0.0f32; 8];
    let mut chunks = terms.chunks_exact(8);
    for c in &mut chunks {
        for (t, &x) in tops.iter_mut().zip(c) {
            *t = max_binade(*t, x);
        }
    }
    let top = chunks
        .remainder()
        .iter()
        .chain(&tops)
        .fold(0.0f32, |t, &x| max_binade(t, x));
    if top == f32::INFINITY {
        let mut specials = Specials::default();
        terms.iter().for_each(|&x| specials.note(f64::from(x)));
        return specials.result().map_or(f32::NAN, |s| s as f32);
    }
    let n = terms.len() as u64;
    let magic = grid_magic(top, magic_factor(precision(n)));
    // Pass 2: `bits(x + M)` summed with wrap-around in eight lanes (so that it vectorizes), less
    // `n · bits(M)`: the exact sum of the steps, which fits an i64.
    let mut acc = [0i64; 8];
    let mut chunks = terms.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add((f64::from(x) + magic).to_bits() as i64);
        }
    }
    let biased = chunks
        .remainder()
        .iter()
        .map(|&x| (f64::from(x) + magic).to_bits() as i64)
        .chain(acc)
        .fold(0i64, i64::wrapping_add);
    let sum = biased.wrapping_sub((n as i64).wrapping_mul(magic.to_bits() as i64));
    f32_from_grid(sum, grid_step(magic))
}

/// The reproducible sum of f64 terms (two grids: see the module docs).
#[must_use]
pub fn reproducible_sum_f64(terms: &[f64]) -> f64 {
    let mut specials = Specials::default();
    let mut max_abs = 0.0f64;
    for &x in terms {
        if x.is_finite() {
            max_abs = max_abs.max(x.abs());
        } else {
            specials.note(x);
        }
    }
    if let Some(special) = specials.result() {
        return special;
    }
    let Some(grid) = Grid::new(max_abs, terms.len() as u64) else {
        return 0.0;
    };
    let (mut high, mut low) = (0i64, 0i64);
    for &x in terms {
        let (h, l) = grid.f64_term(x);
        high += h;
        low += l;
    }
    grid.f64_sum(high, low)
}

/// Elementwise reproducible sums of `contributions` (equal lengths), into `out`: element `j` is
/// the reproducible sum of every contribution's element `j`. The order of `contributions` does not
/// matter.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq", "x86_64+avx2"))]
pub(crate) fn sum_columns_f32(contributions: &[&[f32]], out: &mut [f32]) {
    columns_for_any_cpu(contributions, out);
}

/// [`sum_columns_f32`]'s body, inlined into each of its CPU versions; called directly, it is the
/// baseline version (the tests compare the two).
#[inline(always)]
fn columns_for_any_cpu(contributions: &[&[f32]], out: &mut [f32]) {
    let factor = magic_factor(precision(contributions.len() as u64));
    let special = match contributions {
        [] => {
            out.fill(0.0);
            false
        }
        [a] => columns_in_f64([*a], out, factor),
        [a, b] => columns_in_f64([*a, *b], out, factor),
        [a, b, c] => columns_in_f64([*a, *b, *c], out, factor),
        [a, b, c, d] => columns_in_f64([*a, *b, *c, *d], out, factor),
        [a, b, c, d, e] => columns_in_f64([*a, *b, *c, *d, *e], out, factor),
        [a, b, c, d, e, f] => columns_in_f64([*a, *b, *c, *d, *e, *f], out, factor),
        [a, b, c, d, e, f, g] => columns_in_f64([*a, *b, *c, *d, *e, *f, *g], out, factor),
        [a, b, c, d, e, f, g, h] => columns_in_f64([*a, *b, *c, *d, *e, *f, *g, *h], out, factor),
        _ => columns_in_i64(contributions, out, factor),
    };
    if special {
        // A non-finite term made its element's rounding constant +∞, and the element NaN.
        for (j, o) in out.iter_mut().enumerate() {
            if o.is_nan() {
                let mut specials = Specials::default();
                contributions
                    .iter()
                    .for_each(|c| specials.note(f64::from(c[j])));
                *o = specials.result().map_or(f32::NAN, |s| s as f32);
            }
        }
    }
}

/// Elementwise reproducible sums: element `j` of the result is the reproducible sum of element
/// `j` of every contribution, with the bits of [`reproducible_sum_f32`] over those terms. The
/// order of `contributions` does not matter. This is what a `reproducible` allreduce computes for
/// its chunk; use it to accumulate gradients (micro-batches, experts) in a way that does not
/// depend on their order.
///
/// # Errors
/// [`ColumnsError`] when the contributions differ in length.
pub fn reproducible_sum_columns_f32(contributions: &[&[f32]]) -> Result<Vec<f32>, ColumnsError> {
    let len = contributions.first().map_or(0, |c| c.len());
    if let Some((index, c)) = contributions
        .iter()
        .enumerate()
        .find(|(_, c)| c.len() != len)
    {
        return Err(ColumnsError {
            index,
            len: c.len(),
            expected: len,
        });
    }
    Ok(columns_f32(contributions, len))
}

/// Contributions of different lengths given to [`reproducible_sum_columns_f32`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("contribution {index} has {len} elements, contribution 0 has {expected}")]
pub struct ColumnsError {
    /// The first contribution whose length differs.
    pub index: usize,
    /// Its length.
    pub len: usize,
    /// The length of contribution 0.
    pub expected: usize,
}

/// [`sum_columns_f32`] into a new vector of `len` elements, without first filling it with zeros:
/// the sums go through a small buffer that stays in L1.
pub(crate) fn columns_f32(contributions: &[&[f32]], len: usize) -> Vec<f32> {
    const BLOCK: usize = 2048;
    let mut out = Vec::with_capacity(len);
    let mut buffer = [0.0f32; BLOCK];
    let mut block = Vec::with_capacity(contributions.len());
    for start in (0..len).step_by(BLOCK) {
        let end = (start + BLOCK).min(len);
        block.clear();
        block.extend(contributions.iter().map(|c| &c[start..end]));
        let buffer = &mut buffer[..end - start];
        sum_columns_f32(&block, buffer);
        out.extend_from_slice(buffer);
    }
    out
}

/// Elements per block of the column kernels: a block's terms are read from memory once, by the
/// first pass, and again from L1 by the second. Measured on AVX-512 and AVX2, 4 contributions
/// (ns per term, in L2 / from memory): blocks of 64 0.18 / 0.26, 32 0.21 / 0.27, 128 0.19 / 0.29,
/// 1024 0.20 / 0.33.
const COLUMN_BLOCK: usize = 64;

/// Columns of up to 8 contributions, in blocks of [`COLUMN_BLOCK`] elements: the largest binade
/// per element, then the terms rounded to the grid in pairs, `fl(a + M) + fl(b − M)`. The two
/// are `M + steps(a)` and `−M + steps(b)` exactly, within a factor 2 of each other, so their sum
/// is exact (Sterbenz) and is the pair's rounded sum; an odd term is `fl(x + M) − M`. A pair is
/// at most `2^51` steps and 8 terms `2^53`, so the sums are exact in f64 and the result is
/// rounded to f32 once. Returns whether some term is not finite (its element's `M` is +∞ and its
/// sum NaN).
#[inline(always)]
fn columns_in_f64<const N: usize>(columns: [&[f32]; N], out: &mut [f32], factor: f64) -> bool {
    let mut tops = [0u32; COLUMN_BLOCK];
    let mut special = false;
    let mut blocks = out.chunks_exact_mut(COLUMN_BLOCK);
    let mut start = 0;
    for out in &mut blocks {
        // Fixed-length blocks: the compiler sees the trip count, so the loops are vector code
        // with no scalar remainder.
        let block: [&[f32; COLUMN_BLOCK]; N] = columns.map(|c| {
            c[start..start + COLUMN_BLOCK]
                .try_into()
                .expect("a block of COLUMN_BLOCK elements")
        });
        let out: &mut [f32; COLUMN_BLOCK] = out.try_into().expect("a whole block");
        special |= block_in_f64(block.map(|b| &b[..]), out, &mut tops, factor);
        start += COLUMN_BLOCK;
    }
    let rest = blocks.into_remainder();
    let width = rest.len();
    special |= block_in_f64(
        columns.map(|c| &c[start..]),
        rest,
        &mut tops[..width],
        factor,
    );
    special
}

/// Whether every term of a block is already on its element's grid, so that rounding to it can be
/// skipped: `largest` is the bits of the largest binade among the block's elements (+∞ if a term
/// is not finite) and `smallest` the bits of the smallest nonzero magnitude, less one. With `P =
/// 50` (up to 8 terms per element) the grid step of an element whose largest binade is `2^(E −
/// 127)` is `2^(E − 176)`; a normal term of biased exponent `Ex` has an ulp of `2^(Ex − 150)`, so
/// it is on the grid when `Ex ≥ E − 26`; a block whose elements all pass with the block's largest
/// `E` passes with its own. Subnormals fail the test (a conservative answer: the slow path is
/// exact too). Then every element's sum of at most 8 terms is exact in f64 in any order.
#[inline(always)]
fn on_grid(largest: u32, smallest: u32) -> bool {
    let biased = largest >> 23;
    if biased >= 255 {
        return false;
    }
    let threshold = biased.saturating_sub(26) << 23;
    u64::from(smallest) + 1 >= u64::from(threshold.max(1))
}

/// One block of [`columns_in_f64`]: every slice has `out.len()` elements.
#[inline(always)]
fn block_in_f64<const N: usize>(
    columns: [&[f32]; N],
    out: &mut [f32],
    tops: &mut [u32],
    factor: f64,
) -> bool {
    const { assert!(N <= 8, "8 · 2^50 steps is the most an f64 holds exactly") };
    let width = out.len();
    let columns = columns.map(|c| &c[..width]);
    let tops = &mut tops[..width];
    // Per element the largest magnitude's bits (NaN above +∞, so its binade is +∞), and over the
    // block the smallest nonzero magnitude's bits less one (`0 − 1` wraps above everything).
    tops.fill(0);
    let mut smallest = u32::MAX;
    for c in columns {
        for (t, &x) in tops.iter_mut().zip(c) {
            let magnitude = x.to_bits() & 0x7fff_ffff;
            *t = (*t).max(magnitude);
            smallest = smallest.min(magnitude.wrapping_sub(1));
        }
    }
    let largest = tops.iter().fold(0u32, |m, &t| m.max(t)) & 0x7f80_0000;
    if on_grid(largest, smallest) {
        for (j, o) in out.iter_mut().enumerate() {
            let term = |k: usize| f64::from(columns[k][j]);
            let mut sum = if N == 1 { term(0) } else { term(0) + term(1) };
            for k in (2..N.saturating_sub(1)).step_by(2) {
                sum += term(k) + term(k + 1);
            }
            if N % 2 == 1 && N > 1 {
                sum += term(N - 1);
            }
            // `+ 0.0` turns a sum of negative zeros into +0.0, as the grid does.
            *o = sum as f32 + 0.0;
        }
        return false;
    }
    let special = largest == f32::INFINITY.to_bits();
    for (j, (o, &top)) in out.iter_mut().zip(tops.iter()).enumerate() {
        let magic = magic_of_top(f32::from_bits(top & 0x7f80_0000).max(LOWEST_TOP), factor);
        let term = |k: usize| f64::from(columns[k][j]);
        let pair = |k: usize| (term(k) + magic) + (term(k + 1) - magic);
        // The first pair (or single term) starts the sum: `0.0 + x` is not free in IEEE terms.
        let mut sum = if N == 1 {
            (term(0) + magic) - magic
        } else {
            pair(0)
        };
        for k in (2..N.saturating_sub(1)).step_by(2) {
            sum += pair(k);
        }
        if N % 2 == 1 && N > 1 {
            sum += (term(N - 1) + magic) - magic;
        }
        *o = sum as f32;
    }
    special
}

/// Columns of any number of contributions, in blocks that stay in L1 between the two passes:
/// the largest binade per element, then the steps of every term summed in i64, four
/// contributions at a time.
#[inline(always)]
fn columns_in_i64<'a>(contributions: &[&'a [f32]], out: &mut [f32], factor: f64) -> bool {
    const BLOCK: usize = 1024;
    const GROUP: usize = 4;
    let n = contributions.len() as i64;
    let mut tops = [0.0f32; BLOCK];
    let mut magics = [0.0f64; BLOCK];
    let mut acc = [0i64; BLOCK];
    let mut special = false;
    for (start, out) in (0..out.len()).step_by(BLOCK).zip(out.chunks_mut(BLOCK)) {
        let width = out.len();
        let (tops, magics, acc) = (&mut tops[..width], &mut magics[..width], &mut acc[..width]);
        let range = start..start + width;
        let block = |c: &'a [f32]| &c[range.clone()];
        tops.fill(LOWEST_TOP);
        for group in contributions.chunks(GROUP) {
            match *group {
                [a, b, c, d] => max_of_group([a, b, c, d].map(block), tops),
                [a, b, c] => max_of_group([a, b, c].map(block), tops),
                [a, b] => max_of_group([a, b].map(block), tops),
                [a] => max_of_group([a].map(block), tops),
                _ => unreachable!("chunks of at most {GROUP}"),
            }
        }
        for (m, &t) in magics.iter_mut().zip(tops.iter()) {
            special |= t == f32::INFINITY;
            *m = magic_of_top(t, factor);
        }
        acc.fill(0);
        for group in contributions.chunks(GROUP) {
            match *group {
                [a, b, c, d] => add_group([a, b, c, d].map(block), magics, acc),
                [a, b, c] => add_group([a, b, c].map(block), magics, acc),
                [a, b] => add_group([a, b].map(block), magics, acc),
                [a] => add_group([a].map(block), magics, acc),
                _ => unreachable!("chunks of at most {GROUP}"),
            }
        }
        for ((o, &a), &m) in out.iter_mut().zip(acc.iter()).zip(magics.iter()) {
            let sum = a.wrapping_sub(n.wrapping_mul(m.to_bits() as i64));
            // A non-finite top gives NaN, as in `columns_in_f64`.
            *o = if m.is_finite() {
                f32_from_grid(sum, grid_step(m))
            } else {
                f32::NAN
            };
        }
    }
    special
}

/// `tops[j] = max(tops[j], binade(c[j]) for c in columns)`. Vectorizes.
#[inline(always)]
fn max_of_group<const N: usize>(columns: [&[f32]; N], tops: &mut [f32]) {
    let len = tops.len();
    let columns = columns.map(|c| &c[..len]);
    for (j, t) in tops.iter_mut().enumerate() {
        *t = columns.iter().fold(*t, |t, c| max_binade(t, c[j]));
    }
}

/// `acc[j] += bits(c[j] + magics[j])` for each of `columns`, with wrap-around: the steps of each
/// term, biased by `bits(M)` (subtracted once per term at the end). Vectorizes.
#[inline(always)]
fn add_group<const N: usize>(columns: [&[f32]; N], magics: &[f64], acc: &mut [i64]) {
    let len = acc.len();
    let (columns, magics) = (columns.map(|c| &c[..len]), &magics[..len]);
    for (j, a) in acc.iter_mut().enumerate() {
        let magic = magics[j];
        *a = columns.iter().fold(*a, |a, c| {
            a.wrapping_add((f64::from(c[j]) + magic).to_bits() as i64)
        });
    }
}

/// [`sum_columns_f32`] for f64.
pub(crate) fn sum_columns_f64(contributions: &[&[f64]], out: &mut [f64]) {
    let n = contributions.len() as u64;
    for (j, o) in out.iter_mut().enumerate() {
        let mut specials = Specials::default();
        let mut max_abs = 0.0f64;
        for c in contributions {
            let x = c[j];
            if x.is_finite() {
                max_abs = max_abs.max(x.abs());
            } else {
                specials.note(x);
            }
        }
        *o = if let Some(s) = specials.result() {
            s
        } else if let Some(g) = Grid::new(max_abs, n) {
            let (mut high, mut low) = (0i64, 0i64);
            for c in contributions {
                let (h, l) = g.f64_term(c[j]);
                high += h;
                low += l;
            }
            g.f64_sum(high, low)
        } else {
            0.0
        };
    }
}

/// The parts of a partition-invariant sum over ranks (`RankContext::reproducible_sum`): every
/// rank's terms are put on one grid per element, fixed by the largest magnitude over all ranks.
pub(crate) mod distributed {
    use multiversion::multiversion;

    use super::{
        binade, f32_from_grid, grid_magic, grid_step, grid_steps, magic_factor, precision, Specials,
    };

    /// Per element, the largest finite magnitude among this rank's terms, followed by one more
    /// element: 1 when some term is not finite, 0 otherwise (so one `max` allreduce carries both).
    #[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq", "x86_64+avx2"))]
    pub(crate) fn local_max_abs(terms: &[&[f32]], len: usize) -> Vec<f32> {
        let mut max_abs = vec![0.0f32; len + 1];
        let mut special = false;
        for t in terms {
            for (m, &x) in max_abs.iter_mut().zip(t.iter()) {
                let a = x.abs();
                if a.is_finite() {
                    *m = m.max(a);
                } else {
                    special = true;
                }
            }
        }
        max_abs[len] = f32::from(u8::from(special));
        max_abs
    }

    /// The rounding constant of each element's grid ([`grid_magic`]), from the largest magnitudes
    /// over all ranks.
    pub(crate) fn magics(global_max_abs: &[f32], total_terms: u64) -> Vec<f64> {
        let factor = magic_factor(precision(total_terms));
        global_max_abs
            .iter()
            .map(|&m| grid_magic(binade(m), factor))
            .collect()
    }

    /// This rank's terms on the grid, summed exactly (non-finite terms contribute garbage that
    /// [`apply_specials`] overwrites).
    #[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq", "x86_64+avx2"))]
    pub(crate) fn grid_sums(terms: &[&[f32]], magics: &[f64]) -> Vec<i64> {
        let mut acc = vec![0i64; magics.len()];
        for t in terms {
            for ((a, &x), &m) in acc.iter_mut().zip(t.iter()).zip(magics) {
                *a = a.wrapping_add(grid_steps(x, m));
            }
        }
        acc
    }

    /// The floats of the summed grid integers.
    pub(crate) fn finish(sums: &[i64], magics: &[f64]) -> Vec<f32> {
        sums.iter()
            .zip(magics)
            .map(|(&a, &m)| f32_from_grid(a, grid_step(m)))
            .collect()
    }

    /// Per element, counts of NaN, +∞ and −∞ terms (three blocks of `len`), to be summed.
    pub(crate) fn local_special_counts(terms: &[&[f32]], len: usize) -> Vec<i64> {
        let mut counts = vec![0i64; 3 * len];
        for t in terms {
            for (j, &x) in t.iter().enumerate() {
                if x.is_nan() {
                    counts[j] += 1;
                } else if x == f32::INFINITY {
                    counts[len + j] += 1;
                } else if x == f32::NEG_INFINITY {
                    counts[2 * len + j] += 1;
                }
            }
        }
        counts
    }

    /// Overwrites the elements that non-finite terms decide.
    pub(crate) fn apply_specials(out: &mut [f32], counts: &[i64]) {
        let len = out.len();
        for (j, o) in out.iter_mut().enumerate() {
            let specials = Specials {
                nan: counts[j] > 0,
                pos_inf: counts[len + j] > 0,
                neg_inf: counts[2 * len + j] > 0,
            };
            if let Some(s) = specials.result() {
                *o = s as f32;
            }
        }
    }
}

/// Sums over samples of outer products, `Σ_s u(s) v(s)ᵀ`, reproducibly and without forming the
/// per-sample terms: a layer's weight gradient is its output deltas (`u`, `p` per sample) times
/// its inputs (`v`, `q` per sample), and a bias gradient is the deltas times a constant 1.
///
/// The grid of element `(j, i)` is fixed from bounds known before the sum: `2^(e_j + e_i − P)`,
/// where `2^e_j > max |u_j|` and `2^e_i > max |v_i|` over every sample of every rank (one `max`
/// allreduce of `p + q` values; `e ≥ −126`, as in [`grid_magic`]) and `P = precision(n)` for the
/// `n` samples. It is separable, so the factors are scaled once, `u'_j = u_j · 2^(P_u − e_j)` and
/// `v'_i = v_i · 2^(P_v − e_i)` with `P_u + P_v = P` (exact: powers of two, far from f64's limits),
/// and the product of two scaled f32 values is exact in f64 (48 bits) and below `2^P`; adding
/// `1.5 · 2^52` rounds it to an integer (ties to even), and its bits less those of the constant
/// are that integer. The integers add exactly in `i64` (`n · 2^P < 2^63`), in any order, on any
/// rank, so an element's sum is a function of the multiset of its exact products: the same bits at
/// any world size. Summed over ranks (an exact `i64` allreduce), it is rounded to f32 once.
///
/// Accuracy: each exact product is rounded once, to `2^(e_j + e_i − P)`, at most `2^−50` of the
/// bound on the element's products for up to 4096 samples; the error of a sum is at most `n`
/// half steps plus half an ulp of the result (a naive f32 sum rounds every product and every
/// partial sum to 24 bits). The bound is looser than the element's largest product when the
/// largest `u_j` and `v_i` come from different samples, which costs grid bits, not correctness.
///
/// Non-finite factors: the element of a NaN or infinite product is decided as in
/// [`reproducible_sum_f32`] ([`special_counts`], then [`distributed::apply_specials`]); finite
/// products never overflow (a sum beyond f32's range rounds to ±∞ once).
pub(crate) mod outer {
    use multiversion::multiversion;

    use super::{f32_from_grid, pow2, precision, Specials};

    /// `1.5 · 2^52`: added to a product of magnitude below `2^51`, it leaves the product rounded
    /// to an integer in the low bits of the sum.
    const ROUNDING: f64 = 6_755_399_441_055_744.0;

    /// Samples per block of the kernel: the block's scaled `v` rows (`q` f64 each) stay in L1
    /// while every row of the accumulator passes over them.
    const SAMPLE_BLOCK: usize = 32;

    /// Per column of `values` (rows of `max_abs.len()` values, one per sample), the largest
    /// finite magnitude, folded into `max_abs`; returns whether some value is not finite.
    pub(crate) fn fold_max_abs(values: &[f32], max_abs: &mut [f32]) -> bool {
        let mut special = false;
        for row in values.chunks_exact(max_abs.len().max(1)) {
            for (m, &x) in max_abs.iter_mut().zip(row) {
                let a = x.abs();
                if a.is_finite() {
                    *m = m.max(a);
                } else {
                    special = true;
                }
            }
        }
        special
    }

    /// The smallest `e ≥ −126` with `2^e > m`, for a finite `m ≥ 0`.
    fn exponent_above(m: f32) -> i32 {
        match (m.to_bits() >> 23) & 0xff {
            0 => -126,
            biased => biased as i32 - 126,
        }
    }

    /// The grid of a sum of outer products: an exponent per row of `u` and per column of `v`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct OuterGrid {
        row_exponents: Vec<i32>,
        col_exponents: Vec<i32>,
        precision: i32,
    }

    impl OuterGrid {
        /// The grid for factors whose largest finite magnitudes over every sample of every rank
        /// are `u_max` (per row) and `v_max` (per column), for `total_samples` samples.
        pub(crate) fn new(u_max: &[f32], v_max: &[f32], total_samples: u64) -> OuterGrid {
            OuterGrid {
                row_exponents: u_max.iter().map(|&m| exponent_above(m)).collect(),
                col_exponents: v_max.iter().map(|&m| exponent_above(m)).collect(),
                precision: precision(total_samples),
            }
        }

        /// The number of elements, `p × q`.
        pub(crate) fn len(&self) -> usize {
            self.row_exponents.len() * self.col_exponents.len()
        }

        /// `values` (rows of `exponents.len()`) scaled to `|x| < 2^bits`, in f64.
        fn scaled(values: &[f32], exponents: &[i32], bits: i32) -> Vec<f64> {
            let scales: Vec<f64> = exponents.iter().map(|&e| pow2(bits - e)).collect();
            values
                .chunks_exact(scales.len().max(1))
                .flat_map(|row| row.iter().zip(&scales).map(|(&x, &s)| f64::from(x) * s))
                .collect()
        }

        /// Adds this rank's samples' products, each rounded to the grid, into `sums` (`p × q`,
        /// row-major): `u` holds `p` values per sample, `v` `q`, for the same samples in the same
        /// order. Exact, so the order of samples (and their split over calls) does not matter.
        pub(crate) fn add_sums(&self, u: &[f32], v: &[f32], sums: &mut [i64]) {
            let (p, q) = (self.row_exponents.len(), self.col_exponents.len());
            debug_assert_eq!(sums.len(), p * q);
            debug_assert_eq!(u.len() / p.max(1), v.len() / q.max(1));
            let u_bits = self.precision / 2;
            let u = Self::scaled(u, &self.row_exponents, u_bits);
            let v = Self::scaled(v, &self.col_exponents, self.precision - u_bits);
            add_products(&u, &v, p, q, sums);
        }

        /// The f32 of each summed element (`p × q`), rounded once.
        pub(crate) fn finish(&self, sums: &[i64], out: &mut [f32]) {
            let q = self.col_exponents.len();
            for (j, (sums, out)) in sums
                .chunks_exact(q)
                .zip(out.chunks_exact_mut(q))
                .enumerate()
            {
                let row = self.row_exponents[j] - self.precision;
                for ((o, &sum), &e) in out.iter_mut().zip(sums).zip(&self.col_exponents) {
                    *o = f32_from_grid(sum, pow2(row + e));
                }
            }
        }
    }

    /// The kernel of [`OuterGrid::add_sums`]: `u` (`p` per sample) and `v` (`q` per sample) are
    /// scaled, so every product is below `2^50` and exact. Per row of the sums, each sample whose
    /// `u` is zero is skipped (its products are zero steps: ReLU's zeros are about half of a
    /// hidden layer's deltas); the others add `bits(u · v + ROUNDING)` with wrap-around, and the
    /// bits of `ROUNDING` are taken away once per sample added.
    #[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq", "x86_64+avx2"))]
    fn add_products(u: &[f64], v: &[f64], p: usize, q: usize, sums: &mut [i64]) {
        if p == 0 || q == 0 {
            return;
        }
        let bias = ROUNDING.to_bits() as i64;
        let samples = u.len() / p;
        let mut added = vec![0i64; p];
        for start in (0..samples).step_by(SAMPLE_BLOCK) {
            let end = (start + SAMPLE_BLOCK).min(samples);
            for (j, (row, added)) in sums.chunks_exact_mut(q).zip(&mut added).enumerate() {
                for s in start..end {
                    let c = u[s * p + j];
                    if c == 0.0 {
                        continue;
                    }
                    *added += 1;
                    let v = &v[s * q..(s + 1) * q];
                    for (a, &x) in row.iter_mut().zip(v) {
                        *a = a.wrapping_add((c * x + ROUNDING).to_bits() as i64);
                    }
                }
            }
        }
        for (row, &added) in sums.chunks_exact_mut(q).zip(&added) {
            let total = added.wrapping_mul(bias);
            row.iter_mut().for_each(|a| *a = a.wrapping_sub(total));
        }
    }

    /// Per element (`p × q`), counts of NaN, +∞ and −∞ products among these samples (three
    /// blocks of `p × q`, for [`distributed::apply_specials`](super::distributed::apply_specials)).
    /// Only needed when some factor is not finite.
    pub(crate) fn special_counts(u: &[f32], p: usize, v: &[f32], q: usize) -> Vec<i64> {
        let len = p * q;
        let mut counts = vec![0i64; 3 * len];
        if len == 0 {
            return counts;
        }
        for (u, v) in u.chunks_exact(p).zip(v.chunks_exact(q)) {
            for (j, &a) in u.iter().enumerate() {
                for (i, &b) in v.iter().enumerate() {
                    let mut specials = Specials::default();
                    specials.note(f64::from(a) * f64::from(b));
                    let k = j * q + i;
                    counts[k] += i64::from(specials.nan);
                    counts[len + k] += i64::from(specials.pos_inf);
                    counts[2 * len + k] += i64::from(specials.neg_inf);
                }
            }
        }
        counts
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::value::seed::{derive_stream, Stream};

    /// An exact sum as a non-overlapping expansion of f64 (Shewchuk's grow-expansion), for
    /// reference: exact for any f32 or f64 terms that do not overflow.
    pub(crate) fn exact_expansion(terms: impl IntoIterator<Item = f64>) -> Vec<f64> {
        let mut e: Vec<f64> = Vec::new();
        for mut q in terms {
            let mut next = Vec::with_capacity(e.len() + 1);
            for &x in &e {
                let s = q + x;
                let bv = s - q;
                let err = (q - (s - bv)) + (x - bv);
                if err != 0.0 {
                    next.push(err);
                }
                q = s;
            }
            if q != 0.0 {
                next.push(q);
            }
            e = next;
        }
        e
    }

    /// The exact sum's nearest f64 (within an ulp): the expansion's components added from the
    /// smallest.
    pub(crate) fn exact_f64(terms: impl IntoIterator<Item = f64>) -> f64 {
        exact_expansion(terms).iter().sum()
    }

    /// |value − exact| as f64, computed exactly then rounded.
    fn abs_error(value: f64, terms: &[f64]) -> f64 {
        exact_f64(std::iter::once(-value).chain(terms.iter().copied())).abs()
    }

    fn normals(n: usize, stream: u64, scale_spread: f64) -> Vec<f32> {
        let mut rng = derive_stream(99, Stream::User(stream), 0, 0);
        (0..n)
            .map(|_| {
                let magnitude = libm::exp2(rng.uniform_f64() * scale_spread - scale_spread / 2.0);
                (rng.normal_f64() * magnitude) as f32
            })
            .collect()
    }

    #[test]
    fn bits_depend_only_on_the_multiset() {
        let terms = normals(1000, 1, 40.0);
        let base = reproducible_sum_f32(&terms);
        for seed in 0..20 {
            let mut shuffled = terms.clone();
            derive_stream(seed, Stream::User(2), 0, 0).shuffle(&mut shuffled);
            assert_eq!(
                reproducible_sum_f32(&shuffled).to_bits(),
                base.to_bits(),
                "seed {seed}"
            );
        }
        let wide: Vec<f64> = terms.iter().map(|&x| f64::from(x) * 1e200).collect();
        let mut reversed = wide.clone();
        reversed.reverse();
        assert_eq!(
            reproducible_sum_f64(&wide).to_bits(),
            reproducible_sum_f64(&reversed).to_bits()
        );
    }

    #[test]
    fn columns_equal_the_sum_of_each_column_in_any_contribution_order() {
        let rows: Vec<Vec<f32>> = (0..5).map(|r| normals(64, 10 + r, 30.0)).collect();
        let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let mut out = vec![0.0f32; 64];
        sum_columns_f32(&refs, &mut out);
        let mut reversed = refs.clone();
        reversed.reverse();
        let mut out_reversed = vec![0.0f32; 64];
        sum_columns_f32(&reversed, &mut out_reversed);
        for j in 0..64 {
            let column: Vec<f32> = rows.iter().map(|r| r[j]).collect();
            assert_eq!(out[j].to_bits(), reproducible_sum_f32(&column).to_bits());
            assert_eq!(out[j].to_bits(), out_reversed[j].to_bits());
        }
    }

    /// Errors in units of the f32 ulp of the exact sum's largest term: naive f32 (in the given
    /// order) vs reproducible, on random, wide-range and ill-conditioned inputs.
    #[test]
    fn at_least_as_accurate_as_a_naive_f32_sum() {
        let random = normals(10_000, 3, 0.0);
        let wide = normals(10_000, 4, 60.0);
        // Ill-conditioned: big terms that cancel exactly, hiding small ones.
        let mut cancel = normals(5_000, 5, 20.0);
        let mirrored: Vec<f32> = cancel.iter().map(|x| -x * 1.0e6).collect();
        cancel.extend(mirrored.iter().map(|x| -x));
        cancel.extend(mirrored);
        for (name, terms) in [("random", random), ("wide", wide), ("cancel", cancel)] {
            let exact: Vec<f64> = terms.iter().map(|&x| f64::from(x)).collect();
            let naive = terms.iter().fold(0.0f32, |a, &x| a + x);
            let ours = reproducible_sum_f32(&terms);
            let (e_naive, e_ours) = (
                abs_error(f64::from(naive), &exact),
                abs_error(f64::from(ours), &exact),
            );
            let truth = exact_f64(exact.iter().copied());
            // The documented bound: half a grid step per term, plus the final rounding.
            let max_abs = exact.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let factor = magic_factor(precision(terms.len() as u64));
            let step = grid_step(grid_magic(binade(max_abs as f32), factor));
            let half_ulp = f64::from((truth as f32).abs()) * f64::from(f32::EPSILON) / 2.0;
            let bound = terms.len() as f64 * step / 2.0 + half_ulp;
            eprintln!(
                "{name}: |error| naive f32 {e_naive:.3e}, reproducible {e_ours:.3e} \
                 (bound {bound:.3e}, result {truth:.6e})"
            );
            assert!(e_ours <= bound, "{name}: error {e_ours} > bound {bound}");
            assert!(e_ours <= e_naive, "{name}: {e_ours} > naive {e_naive}");
        }
    }

    #[test]
    fn f64_sums_are_within_an_ulp_of_exact() {
        let terms: Vec<f64> = normals(4096, 6, 80.0)
            .iter()
            .zip(normals(4096, 7, 0.0))
            .map(|(&a, b)| f64::from(a) * (1.0 + f64::from(b) * 1e-9))
            .collect();
        let ours = reproducible_sum_f64(&terms);
        let truth = exact_f64(terms.iter().copied());
        let ulp = f64::from_bits(truth.abs().to_bits() + 1) - truth.abs();
        assert!(abs_error(ours, &terms) <= ulp, "{ours} vs {truth}");
    }

    #[test]
    fn non_finite_and_overflowing_inputs_are_deterministic() {
        let n = f32::NAN;
        let (inf, ninf) = (f32::INFINITY, f32::NEG_INFINITY);
        assert!(reproducible_sum_f32(&[1.0, n, 2.0]).is_nan());
        assert!(reproducible_sum_f32(&[inf, 1.0, ninf]).is_nan());
        assert_eq!(reproducible_sum_f32(&[inf, 1.0, -5.0]), inf);
        assert_eq!(reproducible_sum_f32(&[-1.0, ninf]), ninf);
        assert_eq!(reproducible_sum_f32(&[f32::MAX, f32::MAX]), inf);
        assert_eq!(
            reproducible_sum_f32(&[f32::MAX, f32::MAX, -f32::MAX]),
            f32::MAX
        );
        assert_eq!(
            reproducible_sum_f32(&[0.0, -0.0]).to_bits(),
            0.0f32.to_bits()
        );
        assert_eq!(reproducible_sum_f32(&[]), 0.0);
        assert_eq!(reproducible_sum_f64(&[f64::MAX, f64::MAX]), f64::INFINITY);
        assert_eq!(
            reproducible_sum_f64(&[f64::MIN_POSITIVE / 4.0; 3]),
            f64::MIN_POSITIVE * 0.75
        );
        let tiny = f32::from_bits(1); // the smallest subnormal
        assert_eq!(reproducible_sum_f32(&[tiny, tiny, tiny]), f32::from_bits(3));
    }

    /// The grid of `grid_magic` is the documented one, `2^(e − P)` with `2^e` the smallest power
    /// of two above the largest magnitude (`e = −126` for zeros and subnormals), for every
    /// exponent; and `grid_steps` rounds to it, ties to even.
    #[test]
    fn the_rounding_constant_is_the_documented_grid() {
        for p in [2, 20, 38, 49, 50] {
            let factor = magic_factor(p);
            for biased in 0..=254u32 {
                for mantissa in [0, 1, 0x40_0000, 0x7f_ffff] {
                    let max = f32::from_bits(biased << 23 | mantissa);
                    // Zeros and subnormals: the grid of 2^-126.
                    let e = if biased == 0 {
                        -126
                    } else {
                        exponent_above(f64::from(max))
                    };
                    let magic = grid_magic(binade(max), factor);
                    assert_eq!(magic, 1.5 * pow2(52 + e - p), "{max:e}, P {p}");
                    assert_eq!(grid_step(magic), pow2(e - p), "{max:e}, P {p}");
                    for x in [max, -max, max * 0.7, max * 0.5 + max * 0.25, max * 1e-9] {
                        let t = f64::from(x) * pow2(p - e);
                        assert_eq!(grid_steps(x, magic), t.round_ties_even() as i64, "{x:e}");
                    }
                }
            }
            for special in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
                assert_eq!(grid_magic(binade(special), factor), f64::INFINITY);
            }
        }
        // Ties: on a grid of 0.5 (P = 2, largest magnitude 1), 0.25 → 0 and 0.75 → 1.0.
        let magic = grid_magic(binade(1.0), magic_factor(2));
        assert_eq!(grid_step(magic), 0.5);
        assert_eq!(
            [0.25f32, 0.75, -0.25, -0.75].map(|x| grid_steps(x, magic)),
            [0, 2, 0, -2]
        );
    }

    #[test]
    fn the_sum_of_grid_steps_is_rounded_once() {
        assert_eq!(f32_from_grid(3, 4.0), 12.0);
        assert_eq!(f32_from_grid(0, 4.0).to_bits(), 0.0f32.to_bits());
        // 1.5 − 2^-27 subnormal ulps: rounding to 24 bits first would make a tie, then 2 ulps.
        let step = pow2(-176);
        assert_eq!(f32_from_grid((3 << 26) - 1, step), f32::from_bits(1));
        assert_eq!(f32_from_grid(-(3 << 26) - 1, step), -f32::from_bits(2));
        // Beyond 2^53 steps: one rounding to 24 bits, then an exact scaling; or +∞.
        assert_eq!(
            f32_from_grid((1 << 60) + (1 << 36), 1.0),
            (1u64 << 60) as f32
        );
        assert_eq!(f32_from_grid((1 << 60) + (1 << 36) + 1, 1.0), 1.1529216e18);
        assert_eq!(f32_from_grid(1 << 60, pow2(80)), f32::INFINITY);
    }

    /// Columns of `n` contributions (`rows`, the terms of rank `r` are row `r`) summed by every
    /// path: one buffer per column, `sum_columns_f32` in two contribution orders, and the
    /// distributed sum with the rows split over `ranks` ranks.
    fn assert_paths_agree(rows: &[Vec<f32>], ranks: usize) {
        let len = rows[0].len();
        let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let mut columns = vec![0.0f32; len];
        sum_columns_f32(&refs, &mut columns);
        let mut reversed = refs.clone();
        reversed.reverse();
        let mut columns_reversed = vec![0.0f32; len];
        sum_columns_f32(&reversed, &mut columns_reversed);
        // The distributed sum: the collectives are an elementwise max and integer sums.
        let split: Vec<Vec<&[f32]>> = (0..ranks)
            .map(|r| refs.iter().copied().skip(r).step_by(ranks).collect())
            .collect();
        let max_abs = split
            .iter()
            .map(|terms| distributed::local_max_abs(terms, len))
            .reduce(|a, b| a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect())
            .expect("at least one rank");
        let magics = distributed::magics(&max_abs[..len], rows.len() as u64);
        let add =
            |a: Vec<i64>, b: Vec<i64>| a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
        let sums = split
            .iter()
            .map(|terms| distributed::grid_sums(terms, &magics))
            .reduce(add)
            .expect("at least one rank");
        let mut spread = distributed::finish(&sums, &magics);
        if max_abs[len] > 0.0 {
            let counts = split
                .iter()
                .map(|terms| distributed::local_special_counts(terms, len))
                .reduce(add)
                .expect("at least one rank");
            distributed::apply_specials(&mut spread, &counts);
        }
        for j in 0..len {
            let column: Vec<f32> = rows.iter().map(|r| r[j]).collect();
            let one = reproducible_sum_f32(&column).to_bits();
            let n = rows.len();
            assert_eq!(
                columns[j].to_bits(),
                one,
                "columns, n {n}, element {j}: {column:?}"
            );
            assert_eq!(
                columns_reversed[j].to_bits(),
                one,
                "reversed, n {n}, element {j}"
            );
            assert_eq!(spread[j].to_bits(), one, "distributed, n {n}, element {j}");
        }
    }

    /// Every kernel (f64 for up to 8 contributions, i64 beyond) against the other paths, on
    /// random columns with special, subnormal, zero and overflowing elements.
    #[test]
    fn every_path_gives_the_same_bits() {
        let tiny = f32::from_bits(1);
        let specials: [&[f32]; 10] = [
            &[f32::NAN],
            &[f32::INFINITY],
            &[f32::NEG_INFINITY],
            &[f32::INFINITY, f32::NEG_INFINITY],
            &[f32::MAX, f32::MAX],
            &[-f32::MAX, -f32::MAX, f32::MAX],
            &[tiny, 3.0 * tiny, -tiny],
            &[f32::MIN_POSITIVE, -tiny],
            &[-0.0, 0.0],
            &[1.0e30, 1.0, -1.0e30],
        ];
        for n in 1..=12 {
            let mut rows: Vec<Vec<f32>> =
                (0..n).map(|r| normals(1000, 20 + r as u64, 50.0)).collect();
            for (j, column) in specials.iter().enumerate() {
                for (r, row) in rows.iter_mut().enumerate() {
                    // The special terms, then zeros (or the column's terms, over again).
                    row[j] = column.get(r).copied().unwrap_or(0.0);
                    row[100 + j] = column[r % column.len()];
                }
            }
            for ranks in [1, 2, 3] {
                assert_paths_agree(&rows, ranks);
            }
        }
    }

    /// The shortcut of `columns_in_f64` (a block whose terms are all on the grid is summed in
    /// f64 without rounding them) takes the blocks it may and gives the same bits as the grid.
    #[test]
    fn blocks_on_the_grid_give_the_bits_of_the_grid() {
        // The test of `on_grid`: a normal term is on the grid when its binade is within 26 of
        // the largest; zeros never matter; subnormals only below 2^-100; non-finite never.
        let bits = |x: f32| x.to_bits() & 0x7f80_0000;
        let smallest = |x: f32| x.to_bits().wrapping_sub(1);
        assert!(on_grid(bits(1.0), smallest(pow2(-26) as f32)));
        assert!(!on_grid(bits(1.0), smallest(pow2(-27) as f32)));
        assert!(!on_grid(bits(1.0), smallest(1.9 * pow2(-27) as f32)));
        assert!(on_grid(bits(1.0), u32::MAX), "zeros only");
        assert!(on_grid(0, u32::MAX), "nothing but zeros");
        assert!(
            !on_grid(bits(1.0), smallest(f32::from_bits(1))),
            "a subnormal"
        );
        assert!(on_grid(
            bits(pow2(-101) as f32),
            smallest(f32::from_bits(1))
        ));
        assert!(!on_grid(f32::INFINITY.to_bits(), smallest(1.0)));
        assert!(!on_grid(bits(f32::NAN), smallest(1.0)));

        // Whole blocks of 1024 and a tail: on the grid; one term off it; zeros and negative
        // zeros among terms on the grid; subnormals.
        let block = COLUMN_BLOCK;
        for n in 1..=8 {
            let mut rows: Vec<Vec<f32>> = (0..n)
                .map(|r| normals(3 * block + 300, 40 + r as u64, 8.0))
                .collect();
            rows[n - 1][block + 17] = 1.0e-12;
            for row in rows.iter_mut() {
                row[2 * block + 5] = -0.0;
                row[2 * block + 6] = if n % 2 == 0 { 0.0 } else { -0.0 };
                row[3 * block + 7] = f32::from_bits(77);
            }
            rows[0][2 * block + 9] = 0.0;
            assert_paths_agree(&rows, 2);
            let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
            let mut out = vec![1.0f32; rows[0].len()];
            sum_columns_f32(&refs, &mut out);
            assert_eq!(
                out[2 * block + 5].to_bits(),
                0,
                "negative zeros sum to +0.0"
            );
        }
    }

    #[test]
    fn the_public_column_sum_checks_lengths() {
        let (a, b) = ([1.0f32, 2.0], [3.0f32]);
        assert_eq!(
            reproducible_sum_columns_f32(&[&a, &b]),
            Err(ColumnsError {
                index: 1,
                len: 1,
                expected: 2
            })
        );
        assert_eq!(reproducible_sum_columns_f32(&[&a, &a]), Ok(vec![2.0, 4.0]));
        assert_eq!(reproducible_sum_columns_f32(&[]), Ok(vec![]));
    }

    /// The kernel picked for this CPU (AVX2 or AVX-512 where there is one) against the same code
    /// compiled for baseline x86-64, for 1 to 12 contributions (the f64 and the i64 kernels).
    #[test]
    fn every_cpu_version_gives_the_same_bits() {
        for n in 1..=12usize {
            for spread in [4.0, 60.0] {
                let rows: Vec<Vec<f32>> = (0..n)
                    .map(|r| normals(1000, 300 + r as u64, spread))
                    .collect();
                let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
                let (mut picked, mut baseline) = (vec![0.0f32; 1000], vec![0.0f32; 1000]);
                sum_columns_f32(&refs, &mut picked);
                columns_for_any_cpu(&refs, &mut baseline);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&picked), bits(&baseline), "{n} contributions");
            }
        }
    }

    /// Golden bits: the md5 of the column sums of fixed random columns (1 to 12 contributions;
    /// narrow and wide ranges; zeros, subnormals, non-finite terms, overflow). Computed by the
    /// integer implementation of 2026-11 and unchanged by every kernel since: a change here
    /// changes what users' `reproducible` runs produce.
    #[test]
    fn column_sums_match_the_golden_bits() {
        let mut bytes = Vec::new();
        for n in 1..=12usize {
            for spread in [4.0, 30.0, 90.0] {
                let mut rows: Vec<Vec<f32>> = (0..n)
                    .map(|r| normals(2500, 1000 + 10 * r as u64 + spread as u64, spread))
                    .collect();
                for (k, special) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -0.0]
                    .into_iter()
                    .enumerate()
                {
                    rows[k % n][1500 + k] = special;
                }
                rows[0][1600] = f32::from_bits(3);
                for row in rows.iter_mut() {
                    row[1700] = -0.0;
                    row[1701] = f32::MAX;
                }
                let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
                let mut out = vec![0.0f32; 2500];
                sum_columns_f32(&refs, &mut out);
                for x in out {
                    bytes.extend(x.to_bits().to_le_bytes());
                }
            }
        }
        let digest = crate::value::digest::Md5Digest::of_bytes(&bytes).to_string();
        assert_eq!(digest, "c8b1979007454f6dab68adda9120b082");
    }

    /// The sum of grid steps is rounded once even where the result is subnormal and the sum
    /// beyond 2^53 steps (the grids of products go down to `2^-302`): rounding the sum to 24
    /// bits first would round twice.
    #[test]
    fn a_large_sum_on_a_fine_grid_is_rounded_once() {
        let step = pow2(-209);
        // (2^60 + 2^59 ∓ 1) · 2^-209 = 1.5 · 2^-149 ∓ 2^-209: just below and just above a tie
        // between the subnormals 2^-149 and 2^-148.
        assert_eq!(
            f32_from_grid((1 << 60) + (1 << 59) - 1, step),
            f32::from_bits(1)
        );
        assert_eq!(
            f32_from_grid((1 << 60) + (1 << 59) + 1, step),
            f32::from_bits(2)
        );
        assert_eq!(
            f32_from_grid(-(1 << 60) - (1 << 59) + 1, step),
            -f32::from_bits(1)
        );
        assert_eq!(f32_from_grid(i64::MIN, pow2(-100)), -pow2(-37) as f32);
        assert_eq!(f32_from_grid(i64::MAX, pow2(100)), f32::INFINITY);
    }

    /// Random factors of `samples` rows: `p` deltas and `q` inputs per sample, with magnitudes
    /// spread over `2^±(spread/2)`, some zeros (ReLU) and a subnormal.
    fn factors(samples: usize, p: usize, q: usize, seed: u64, spread: f64) -> (Vec<f32>, Vec<f32>) {
        let mut u = normals(samples * p, 500 + seed, spread);
        let v = normals(samples * q, 600 + seed, spread);
        for (k, x) in u.iter_mut().enumerate() {
            if k % 3 == 1 {
                *x = 0.0;
            }
        }
        u[p + 1] = f32::from_bits(5);
        (u, v)
    }

    /// `Σ_s u(s) v(s)ᵀ` with the samples dealt to `ranks` ranks in contiguous blocks: each rank's
    /// largest magnitudes, their `max`, the grid, each rank's sums, their integer sum, one
    /// rounding (what `train` does with its collectives).
    fn outer_sum(u: &[f32], v: &[f32], p: usize, q: usize, ranks: usize) -> Vec<f32> {
        let samples = u.len() / p;
        let shares: Vec<std::ops::Range<usize>> = (0..ranks)
            .map(|r| samples * r / ranks..samples * (r + 1) / ranks)
            .collect();
        let (mut u_max, mut v_max) = (vec![0.0f32; p], vec![0.0f32; q]);
        for share in &shares {
            let (mut mu, mut mv) = (vec![0.0f32; p], vec![0.0f32; q]);
            outer::fold_max_abs(&u[share.start * p..share.end * p], &mut mu);
            outer::fold_max_abs(&v[share.start * q..share.end * q], &mut mv);
            u_max.iter_mut().zip(&mu).for_each(|(m, x)| *m = m.max(*x));
            v_max.iter_mut().zip(&mv).for_each(|(m, x)| *m = m.max(*x));
        }
        let grid = outer::OuterGrid::new(&u_max, &v_max, samples as u64);
        let mut total = vec![0i64; p * q];
        for share in shares.iter().rev() {
            let mut sums = vec![0i64; p * q];
            grid.add_sums(
                &u[share.start * p..share.end * p],
                &v[share.start * q..share.end * q],
                &mut sums,
            );
            total
                .iter_mut()
                .zip(&sums)
                .for_each(|(t, s)| *t = t.wrapping_add(*s));
        }
        let mut out = vec![0.0f32; p * q];
        grid.finish(&total, &mut out);
        out
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The same bits at world sizes 1 to 8, for any order of the samples, on narrow and wide
    /// ranges and more samples than a kernel block.
    #[test]
    fn outer_sums_are_the_same_at_any_world_size_and_order() {
        for (samples, spread) in [(48, 4.0), (100, 40.0), (240, 90.0)] {
            let (p, q) = (7, 33);
            let (u, v) = factors(samples, p, q, samples as u64, spread);
            let one = outer_sum(&u, &v, p, q, 1);
            for ranks in 2..=8 {
                assert_eq!(bits(&outer_sum(&u, &v, p, q, ranks)), bits(&one), "{ranks}");
            }
            // The samples in another order.
            let mut order: Vec<usize> = (0..samples).collect();
            derive_stream(7, Stream::User(8), 0, 0).shuffle(&mut order);
            let gather = |x: &[f32], w: usize| -> Vec<f32> {
                order
                    .iter()
                    .flat_map(|&s| x[s * w..(s + 1) * w].to_vec())
                    .collect()
            };
            let shuffled = outer_sum(&gather(&u, p), &gather(&v, q), p, q, 3);
            assert_eq!(bits(&shuffled), bits(&one), "shuffled");
        }
    }

    /// Against an exact sum of the exact products (an f64 expansion): the error of every element
    /// is within the documented bound (n half steps of its grid plus half an ulp), and the
    /// largest error in ulps of the exact sum is at most a naive f32 sum's (products rounded to
    /// f32 and added in sample order, as `ring`'s local sum does), on narrow, wide and
    /// cancelling factors.
    #[test]
    fn outer_sums_are_at_least_as_accurate_as_a_naive_f32_sum() {
        let ulp = |x: f64| {
            let x = (x as f32).abs();
            f64::from(f32::from_bits(x.to_bits() + 1) - x).max(f64::from(f32::from_bits(1)))
        };
        for (name, samples, spread) in [
            ("narrow", 512, 2.0),
            ("wide", 512, 40.0),
            ("cancel", 512, 8.0),
        ] {
            let (p, q) = (5, 17);
            let (mut u, mut v) = factors(samples, p, q, 1 + samples as u64, spread);
            if name == "cancel" {
                // The second half of the samples repeats the first with `u` negated and scaled
                // by 2^20 in the first, so that large products cancel, leaving small ones.
                let half = samples / 2;
                for s in 0..half {
                    for j in 0..p {
                        u[s * p + j] *= 1.0e6;
                        u[(s + half) * p + j] = -u[s * p + j];
                    }
                    for i in 0..q {
                        v[(s + half) * q + i] = v[s * q + i];
                    }
                }
                u[0] = 1.0e-3;
            }
            let ours = outer_sum(&u, &v, p, q, 4);
            let (mut worst_ours, mut worst_naive) = (0.0f64, 0.0f64);
            let (u_max, v_max) = {
                let (mut a, mut b) = (vec![0.0f32; p], vec![0.0f32; q]);
                outer::fold_max_abs(&u, &mut a);
                outer::fold_max_abs(&v, &mut b);
                (a, b)
            };
            for j in 0..p {
                for i in 0..q {
                    let products: Vec<f64> = (0..samples)
                        .map(|s| f64::from(u[s * p + j]) * f64::from(v[s * q + i]))
                        .collect();
                    let exact = exact_f64(products.iter().copied());
                    let naive = (0..samples).fold(0.0f32, |a, s| a + u[s * p + j] * v[s * q + i]);
                    let got = ours[j * q + i];
                    let e_ours = abs_error(f64::from(got), &products);
                    let e_naive = abs_error(f64::from(naive), &products);
                    let bound_exponent = |m: f32| {
                        if m >= f32::MIN_POSITIVE {
                            exponent_above(f64::from(m))
                        } else {
                            -126
                        }
                    };
                    let step = pow2(
                        bound_exponent(u_max[j]) + bound_exponent(v_max[i])
                            - precision(samples as u64),
                    );
                    let bound = samples as f64 * step / 2.0 + ulp(exact) / 2.0;
                    assert!(
                        e_ours <= bound,
                        "{name} ({j}, {i}): {e_ours:e} > bound {bound:e}"
                    );
                    worst_ours = worst_ours.max(e_ours / ulp(exact));
                    worst_naive = worst_naive.max(e_naive / ulp(exact));
                }
            }
            eprintln!(
                "{name}: largest error in ulps of the exact sum: outer grid {worst_ours:.3}, \
                 naive f32 {worst_naive:.3}"
            );
            assert!(worst_ours <= 0.5 + 1e-9, "{name}: {worst_ours} ulp");
            assert!(
                worst_ours <= worst_naive,
                "{name}: {worst_ours} > naive {worst_naive}"
            );
        }
    }

    /// Non-finite factors decide their elements as in `reproducible_sum_f32`; finite products
    /// beyond f32's range add exactly and the sum rounds to ±∞ once, or comes back in range.
    #[test]
    fn outer_sums_of_non_finite_and_huge_factors() {
        let (p, q) = (2, 3);
        // Two samples: u rows, v rows.
        let u = [f32::NAN, 1.0e30, 0.0, -1.0e30];
        let v = [1.0, f32::INFINITY, 1.0e30, 2.0, 1.0, -1.0e30];
        let (mut u_max, mut v_max) = (vec![0.0f32; p], vec![0.0f32; q]);
        assert!(outer::fold_max_abs(&u, &mut u_max));
        assert!(outer::fold_max_abs(&v, &mut v_max));
        let grid = outer::OuterGrid::new(&u_max, &v_max, 2);
        let mut sums = vec![0i64; p * q];
        grid.add_sums(&u, &v, &mut sums);
        let mut out = vec![0.0f32; p * q];
        grid.finish(&sums, &mut out);
        distributed::apply_specials(&mut out, &outer::special_counts(&u, p, &v, q));
        // Row 0: NaN · anything; row 1: 1e30·1 + (−1e30)·2, 1e30·∞ + (−1e30)·1, 1e30·1e30 + (−1e30)(−1e30).
        assert!(out[..3].iter().all(|x| x.is_nan()), "{out:?}");
        assert_eq!(out[3], -1.0e30);
        assert_eq!(out[4], f32::INFINITY);
        assert_eq!(out[5], f32::INFINITY);
        // 0 · ∞ is NaN, however the kernel skips zero factors.
        let counts = outer::special_counts(&[0.0], 1, &[f32::INFINITY], 1);
        assert_eq!(counts, [1, 0, 0]);
    }

    /// Golden bits: the md5 of outer-product sums of fixed random factors at 1 to 8 ranks
    /// (narrow and wide ranges, zeros, a subnormal). Computed when the `train` kind's
    /// reproducible mode moved to these sums (2026-11-22): a change here changes its bits.
    #[test]
    fn outer_sums_match_the_golden_bits() {
        let mut bytes = Vec::new();
        for (k, (samples, spread)) in [(64, 4.0), (96, 30.0), (48, 90.0)].into_iter().enumerate() {
            let (p, q) = (9, 21);
            let (u, v) = factors(samples, p, q, 900 + k as u64, spread);
            for ranks in [1, 3, 8] {
                for x in outer_sum(&u, &v, p, q, ranks) {
                    bytes.extend(x.to_bits().to_le_bytes());
                }
            }
        }
        let digest = crate::value::digest::Md5Digest::of_bytes(&bytes).to_string();
        assert_eq!(digest, "bf6ff8e1e3b5d84cae6041dc1ed6d34a");
    }

    #[test]
    fn precision_leaves_headroom_for_the_terms() {
        assert_eq!(precision(1), 50);
        assert_eq!(precision(4096), 50);
        assert_eq!(precision(4097), 49);
        assert_eq!(precision(1 << 24), 38);
    }
}
