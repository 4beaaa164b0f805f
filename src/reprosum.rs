//! Reproducible sums: bits that depend only on the multiset of terms.
//!
//! Floating-point addition is not associative, so a sum's bits depend on the order of additions
//! and, in a data-parallel job, on how the terms are split across ranks. Climate models solved this
//! for their global sums (CESM/E3SM's `shr_reprosum`) by adding in integers; so does this module.
//! Per element, every term `x` is put on a grid fixed by the largest magnitude among the terms
//! and by their count, `t = round(x · 2^(P − e))` where `2^e > max |x|` and `P = min(50, 62 −
//! ⌈log₂ n⌉)`; the integers are added exactly in `i64` (there are `62 − P` bits of headroom for
//! `n` terms) and the sum is rounded once to the float type. The maximum and the count are functions
//! of the multiset, rounding a term to the grid depends on nothing else, and integer addition is
//! associative: the bits depend on the multiset only, not on the order, the split across ranks, the
//! algorithm or the backend.
//!
//! Accuracy: each term is rounded on a grid of `2^(e − P)`, so the error of the sum is at most
//! `n · 2^(e − P − 1)` plus the final rounding (half an ulp of the result). For `n ≤ 4096` terms
//! `P = 50`: a term's rounding is 2⁻²⁶ of an f32 ulp of the largest term, far below a naive f32
//! sum's `(n − 1)` roundings of up to half an ulp of the partial sums. f64 terms are split over two
//! grids (`P` and `P + 50` bits below the largest), summed as `i128`: at most 2⁻⁴⁸ of an f64 ulp of
//! the largest term per term. The measured errors are in the tests and `docs/benchmarks.md`.
//!
//! Non-finite input is deterministic: any NaN gives NaN; +∞ and −∞ together give NaN; otherwise an
//! infinity wins with its sign. A finite sum beyond the type's range rounds to ±∞. Zero sums are
//! +0.0. The result is a canonical NaN (the type's `NAN`), whatever the payloads.
//!
//! Limits: `n` is at most 2⁶⁰ terms; the grid is per element, so a sum over ranks first needs the
//! largest magnitude of every element over every rank (one `max` allreduce: see
//! [`RankContext::reproducible_sum`](crate::RankContext::reproducible_sum)).

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

/// The f32 nearest to an integer sum on a grid of scale `scale` (one rounding, then an exact
/// scaling by the power of two `1/scale`; subnormal and overflowing results round once more,
/// deterministically). Scale 0 (every term zero) gives +0.
#[inline]
fn f32_from_grid(sum: i64, scale: f64) -> f32 {
    if scale == 0.0 {
        return 0.0;
    }
    // The inverse of a power of two 2^k is 2^-k: flip the exponent, exactly.
    let inverse = f64::from_bits((2046u64 << 52).wrapping_sub(scale.to_bits()));
    (f64::from(sum as f32) * inverse) as f32
}

/// `acc[j] += round(terms[j] · scales[j])`, written so that it vectorizes.
#[inline]
fn add_on_grid(acc: &mut [i64], terms: &[f32], scales: &[f64]) {
    let n = acc.len().min(terms.len()).min(scales.len());
    let (acc, terms, scales) = (&mut acc[..n], &terms[..n], &scales[..n]);
    for j in 0..n {
        acc[j] = acc[j].wrapping_add(round_to_i64(f64::from(terms[j]) * scales[j]));
    }
}

/// The grid scale for f32 terms whose largest magnitude has the bits `max_bits` (0 when every
/// term is zero or some term is not finite): integer operations only, so it vectorizes. The same
/// value as `Grid::new(max, n).f32_scale()`.
#[inline]
fn f32_scale_from_bits(max_bits: u32, precision: i32) -> f64 {
    let biased = (max_bits >> 23) as i32;
    // 2^e is the smallest power of two above the magnitude (2^-126 above every subnormal).
    let e = if biased == 0 { -126 } else { biased - 126 };
    if max_bits == 0 || max_bits >= f32::INFINITY.to_bits() {
        0.0
    } else {
        f64::from_bits(((precision - e + 1023) as u64) << 52)
    }
}

/// The reproducible sum of f32 terms: its bits depend only on the multiset of `terms`, and it is
/// within `n · 2^(e − P − 1)` plus half an ulp of the exact sum (see the module docs).
#[must_use]
pub fn reproducible_sum_f32(terms: &[f32]) -> f32 {
    // Pass 1, branch-free so it vectorizes: the largest magnitude as bits (|x| orders like its bit
    // pattern; NaN and ±∞ have the largest ones).
    let max_bits = terms
        .iter()
        .fold(0u32, |m, &x| m.max(x.to_bits() & 0x7fff_ffff));
    if max_bits >= f32::INFINITY.to_bits() {
        let mut specials = Specials::default();
        terms.iter().for_each(|&x| specials.note(f64::from(x)));
        if let Some(special) = specials.result() {
            return special as f32;
        }
    }
    let scale = f32_scale_from_bits(max_bits, precision(terms.len() as u64));
    if scale == 0.0 {
        return 0.0;
    }
    // Pass 2: eight independent integer sums so the additions pipeline and vectorize.
    let mut acc = [0i64; 8];
    let mut chunks = terms.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += round_to_i64(f64::from(x) * scale);
        }
    }
    let tail: i64 = chunks
        .remainder()
        .iter()
        .map(|&x| round_to_i64(f64::from(x) * scale))
        .sum();
    f32_from_grid(acc.iter().sum::<i64>() + tail, scale)
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
pub(crate) fn sum_columns_f32(contributions: &[&[f32]], out: &mut [f32]) {
    // Blocks small enough that a block of every contribution stays in cache between the passes.
    const BLOCK: usize = 2048;
    let n = contributions.len() as u64;
    let mut max_bits = [0u32; BLOCK];
    let mut scales = [0f64; BLOCK];
    let mut acc = [0i64; BLOCK];
    for start in (0..out.len()).step_by(BLOCK) {
        let end = (start + BLOCK).min(out.len());
        let width = end - start;
        let (max_bits, scales, acc) = (
            &mut max_bits[..width],
            &mut scales[..width],
            &mut acc[..width],
        );
        // Pass 1, branch-free: the largest magnitude per element as bits (NaN and ±∞ have the
        // largest, and are handled at the end).
        max_bits.fill(0);
        for c in contributions {
            for (m, &x) in max_bits.iter_mut().zip(&c[start..end]) {
                *m = (*m).max(x.to_bits() & 0x7fff_ffff);
            }
        }
        let precision = precision(n);
        let mut any_special = false;
        for (s, &m) in scales.iter_mut().zip(max_bits.iter()) {
            any_special |= m >= f32::INFINITY.to_bits();
            *s = f32_scale_from_bits(m, precision);
        }
        // Pass 2: integers on each element's grid (scale 0 for all-zero or non-finite elements).
        acc.fill(0);
        for c in contributions {
            add_on_grid(acc, &c[start..end], scales);
        }
        for ((o, &a), &s) in out[start..end]
            .iter_mut()
            .zip(acc.iter())
            .zip(scales.iter())
        {
            *o = f32_from_grid(a, s);
        }
        if any_special {
            for (j, o) in out[start..end].iter_mut().enumerate() {
                let mut specials = Specials::default();
                contributions
                    .iter()
                    .for_each(|c| specials.note(f64::from(c[start + j])));
                if let Some(s) = specials.result() {
                    *o = s as f32;
                }
            }
        }
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
    use super::{add_on_grid, f32_from_grid, f32_scale_from_bits, precision, Specials};

    /// Per element, the largest finite magnitude among this rank's terms, followed by one more
    /// element: 1 when some term is not finite, 0 otherwise (so one `max` allreduce carries both).
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

    /// The scale of each element's grid (0 where every term is zero).
    pub(crate) fn scales(global_max_abs: &[f32], total_terms: u64) -> Vec<f64> {
        let p = precision(total_terms);
        global_max_abs
            .iter()
            .map(|&m| f32_scale_from_bits(m.to_bits() & 0x7fff_ffff, p))
            .collect()
    }

    /// This rank's terms on the grid, summed exactly (non-finite terms contribute garbage that
    /// [`apply_specials`] overwrites).
    pub(crate) fn grid_sums(terms: &[&[f32]], scales: &[f64]) -> Vec<i64> {
        let mut acc = vec![0i64; scales.len()];
        for t in terms {
            add_on_grid(&mut acc, t, scales);
        }
        acc
    }

    /// The floats of the summed grid integers.
    pub(crate) fn finish(sums: &[i64], scales: &[f64]) -> Vec<f32> {
        sums.iter()
            .zip(scales)
            .map(|(&a, &s)| f32_from_grid(a, s))
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::seed::{derive_stream, Stream};

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
            let scale =
                f32_scale_from_bits((max_abs as f32).to_bits(), precision(terms.len() as u64));
            let step = 1.0 / scale;
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

    #[test]
    fn the_integer_scale_equals_the_grid_scale() {
        let p = precision(4);
        for bits in [0x0080_0000u32, 0x3f80_0000, 0x3fff_ffff, 0x7f7f_ffff] {
            let e = exponent_above(f64::from(f32::from_bits(bits)));
            assert_eq!(f32_scale_from_bits(bits, p), pow2(p - e), "{bits:#x}");
        }
        // Every subnormal gets the grid of 2^-126, finer than their spacing 2^-149: exact.
        assert_eq!(f32_scale_from_bits(1, p), pow2(p + 126));
        assert_eq!(f32_scale_from_bits(0, p), 0.0);
        assert_eq!(f32_scale_from_bits(f32::INFINITY.to_bits(), p), 0.0);
        assert_eq!(f32_from_grid(3, 0.25), 12.0);
    }

    #[test]
    fn precision_leaves_headroom_for_the_terms() {
        assert_eq!(precision(1), 50);
        assert_eq!(precision(4096), 50);
        assert_eq!(precision(4097), 49);
        assert_eq!(precision(1 << 24), 38);
    }
}
