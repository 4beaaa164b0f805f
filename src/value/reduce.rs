//! Reduction modes: in which order an allreduce adds the contributions of the ranks.
//!
//! Floating-point addition is not associative, so the order of additions decides the bits. The
//! modes, and what they promise:
//!
//! | mode | order of additions | deterministic? |
//! | --- | --- | --- |
//! | `rank_ordered` | rank 0, 1, …, n−1 for every element | yes, for one world size |
//! | `ring` | chunk c: ranks c, c+1, …, c−1 (mod n), as a ring reduce-scatter adds | yes, for one world size |
//! | `arrival_order` | the order contributions arrive in | **no**: the negative control |
//! | `native` | the backend's own: `MPI_Allreduce` on MPI ranks; `ring` on thread ranks | as the library is |
//! | `reproducible` | none: an exact integer sum on a per-element grid ([`crate::value::reprosum`]) | yes, for any order, split, world size and backend |
//!
//! With two ranks `arrival_order` is deterministic anyway, because IEEE addition is commutative;
//! it takes three or more ranks to see it differ. Integers add with wrap-around. `max` returns a
//! canonical NaN if any contribution is NaN and prefers +0.0 over −0.0, so it does not depend on
//! order. A float sum that is NaN is the canonical NaN too, whatever the terms' payloads: IEEE 754
//! leaves a NaN sum's payload to the hardware (a GPU has its own) and to the compiler's order of
//! operands, so the bits of every schedule are the same on the CPU and on the GPU's kernels.
//!
//! [`chunk_range`], [`summation_order`] and [`reduce_chunk`] are the arithmetic every backend
//! shares, so a schedule gives the same bits on threads as on any other backend.
//!
//! Dtypes: f32 and f64 reduce as above; i64, i32 and u8 exactly (wrap-around sums, integer max),
//! so in any order. f16, bf16, f8e4m3fn, f8e5m2, bool, i8, i16, u16, c64 and c128 are not
//! reduced: [`unreducible`] gives the reason, which every backend returns as
//! `CommError::InvalidArgument` before any data moves. Summing half precision (or 8-bit floats) on
//! the CPU would have to choose an accumulation precision (the narrow type after every addition,
//! or f32, or wider, rounded once) that no backend promises, so detcheck's bits would stand for no
//! real library's; a bool sum has no agreed meaning; a narrow integer sum would have to choose
//! between wrapping at 8 or 16 bits and accumulating wider, which backends do differently; a
//! complex `max` has no meaning (complex numbers have no order). Cast to f32 (or u8/i32, or view a
//! complex tensor as its real pairs) first. Broadcast and allgather move every dtype.
//!
//! Invariant (a kernel's bits do not depend on the CPU; here and in `value/reprosum.rs`): the
//! multiversioned kernels (baseline, AVX2, AVX-512, picked at run time) run the same operations per
//! element; only the vector width differs. A new kernel must not use FMA or reassociate.
//!
//! Invariant (a reduction schedule is backend-independent arithmetic): chunking, summation order
//! and the kernel are shared, so a schedule gives the same bits on any backend.
//!
//! Limits: only `reproducible` is invariant to the number of ranks, and only for sums of floats
//! (`max` and integer sums are order-independent in every mode). It gives the multiset of the
//! ranks' contributions one sum; for a batch split across ranks to sum to the same bits at any
//! world size, sum the per-sample terms with `RankContext::reproducible_sum` instead.

use crate::value::reprosum;
use crate::value::tensor::{DType, Element, TensorData};
use multiversion::multiversion;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;

/// How an allreduce combines contributions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReductionMode {
    /// Adds contributions in rank order: deterministic for a fixed world size.
    RankOrdered,
    /// Adds in the order a ring reduce-scatter does: deterministic for a fixed world size.
    Ring,
    /// Adds contributions in arrival order: nondeterministic, a negative control.
    ArrivalOrder,
    /// The backend's own allreduce: `MPI_Allreduce` on MPI ranks (whatever algorithm the MPI
    /// library picks), the `ring` schedule on thread ranks, which have no library of their own.
    Native,
    /// Sums floats exactly on a per-element integer grid: the bits depend only on the multiset of
    /// contributions (see `reprosum.rs`).
    Reproducible,
}

impl ReductionMode {
    /// The name used in scenario files and reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            ReductionMode::RankOrdered => "rank_ordered",
            ReductionMode::Ring => "ring",
            ReductionMode::ArrivalOrder => "arrival_order",
            ReductionMode::Native => "native",
            ReductionMode::Reproducible => "reproducible",
        }
    }

    /// Every mode, in a fixed order (for benchmarks and docs).
    pub const ALL: [ReductionMode; 5] = [
        ReductionMode::RankOrdered,
        ReductionMode::Ring,
        ReductionMode::ArrivalOrder,
        ReductionMode::Native,
        ReductionMode::Reproducible,
    ];

    /// `true` for the modes detcheck computes itself (`rank_ordered`, `ring`, `reproducible`):
    /// their bits are the same on every backend, which the `backends` check verifies.
    #[must_use]
    pub fn is_backend_independent(self) -> bool {
        matches!(
            self,
            ReductionMode::RankOrdered | ReductionMode::Ring | ReductionMode::Reproducible
        )
    }
}

impl fmt::Display for ReductionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The elementwise operation of an allreduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        })
    }
}

/// Why tensors of `dtype` cannot be reduced (allreduce, reduce-scatter), or `None` when they can.
#[must_use]
pub(crate) fn unreducible(dtype: DType) -> Option<String> {
    match dtype {
        DType::F32 | DType::F64 | DType::I64 | DType::I32 | DType::U8 => None,
        DType::F16 | DType::BF16 => Some(format!(
            "{dtype} tensors are not reduced: a half-precision sum on the CPU would have to pick \
             an accumulation precision that no backend promises; cast to f32 first"
        )),
        DType::Bool => Some(
            "bool tensors are not reduced: a sum of booleans has no agreed meaning; cast to u8 \
             or i32 first"
                .to_owned(),
        ),
        DType::F8E4M3 | DType::F8E5M2 => Some(format!(
            "{dtype} tensors are not reduced: an 8-bit float sum on the CPU would have to pick \
             an accumulation precision that no backend promises; cast to f32 first"
        )),
        DType::I8 | DType::I16 | DType::U16 => Some(format!(
            "{dtype} tensors are not reduced: a narrow integer sum would have to pick between \
             wrapping at {} bits and accumulating wider, which backends do differently; cast to \
             i32 first",
            dtype.size_of() * 8
        )),
        DType::C64 | DType::C128 => Some(format!(
            "{dtype} tensors are not reduced: a complex max has no meaning (complex numbers have \
             no order); view the tensor as its real parts (torch.view_as_real) and reduce those"
        )),
    }
}

/// The elements of chunk `chunk` when `len` elements are split into `parts` near-equal chunks.
#[must_use]
pub(crate) fn chunk_range(len: usize, parts: usize, chunk: usize) -> Range<usize> {
    let bound = |c: usize| (c as u128 * len as u128 / parts as u128) as usize;
    bound(chunk)..bound(chunk + 1)
}

/// The order in which the ranks' contributions to chunk `chunk` are added.
///
/// `arrival` is the order in which contributions arrived; only `arrival_order` reads it.
#[must_use]
pub(crate) fn summation_order(
    mode: ReductionMode,
    size: usize,
    chunk: usize,
    arrival: &[usize],
) -> Vec<usize> {
    match mode {
        ReductionMode::RankOrdered | ReductionMode::Reproducible => (0..size).collect(),
        ReductionMode::Ring | ReductionMode::Native => {
            (0..size).map(|k| (chunk + k) % size).collect()
        }
        ReductionMode::ArrivalOrder => arrival.to_vec(),
    }
}

/// Reduces `range` of every contribution, adding (or taking the max) in `order`.
///
/// # Panics
/// Panics if the contributions differ in dtype, are shorter than `range` or are of a dtype that
/// [`unreducible`] refuses: callers check that.
#[must_use]
pub(crate) fn reduce_chunk(
    contributions: &[&TensorData],
    range: Range<usize>,
    order: &[usize],
    op: ReduceOp,
    mode: ReductionMode,
) -> TensorData {
    fn typed<T: Reducible>(
        contributions: &[&TensorData],
        range: Range<usize>,
        order: &[usize],
        op: ReduceOp,
    ) -> TensorData {
        let view = |rank: usize| {
            &T::view(contributions[rank]).expect("contributions share one dtype")[range.clone()]
        };
        let mut out = view(order[0]).to_vec();
        for &rank in &order[1..] {
            combine_into(&mut out, view(rank), op);
        }
        T::wrap(out)
    }
    if mode == ReductionMode::Reproducible && op == ReduceOp::Sum {
        // The order does not matter: every float sum is exact on the grid.
        match contributions[0] {
            TensorData::F32(_) => {
                let columns: Vec<&[f32]> = contributions
                    .iter()
                    .map(|c| &f32::view(c).expect("contributions share one dtype")[range.clone()])
                    .collect();
                return TensorData::F32(reprosum::columns_f32(&columns, range.len()));
            }
            TensorData::F64(_) => {
                let columns: Vec<&[f64]> = contributions
                    .iter()
                    .map(|c| &f64::view(c).expect("contributions share one dtype")[range.clone()])
                    .collect();
                let mut out = vec![0.0f64; range.len()];
                reprosum::sum_columns_f64(&columns, &mut out);
                return TensorData::F64(out);
            }
            _ => {}
        }
    }
    match contributions[0] {
        TensorData::F32(_) => typed::<f32>(contributions, range, order, op),
        TensorData::F64(_) => typed::<f64>(contributions, range, order, op),
        TensorData::I64(_) => typed::<i64>(contributions, range, order, op),
        TensorData::I32(_) => typed::<i32>(contributions, range, order, op),
        TensorData::U8(_) => typed::<u8>(contributions, range, order, op),
        TensorData::F16(_)
        | TensorData::BF16(_)
        | TensorData::Bool(_)
        | TensorData::I8(_)
        | TensorData::I16(_)
        | TensorData::U16(_)
        | TensorData::F8E4M3(_)
        | TensorData::F8E5M2(_)
        | TensorData::C64(_)
        | TensorData::C128(_) => {
            panic!(
                "{}",
                unreducible(contributions[0].dtype()).unwrap_or_default()
            )
        }
    }
}

/// `out[j] = out[j] op next[j]`, compiled for the baseline and for AVX2 and AVX-512, picked at run
/// time: the same operations on wider vectors, so the same bits (there is no FMA to contract).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq", "x86_64+avx2"))]
fn combine_into<T: Reducible>(out: &mut [T], next: &[T], op: ReduceOp) {
    match op {
        ReduceOp::Sum => out.iter_mut().zip(next).for_each(|(a, &b)| *a = a.add(b)),
        ReduceOp::Max => out
            .iter_mut()
            .zip(next)
            .for_each(|(a, &b)| *a = a.max_of(b)),
    }
}

/// The version of the multiversioned kernels this process runs: `avx512`, `avx2` or `baseline`.
///
/// `combine_into` and the reproducible-sum kernels (`value/reprosum.rs`) are compiled for the
/// same targets, in the same priority, so the dispatcher picks the same one for all of them;
/// this function is compiled for those targets too and names the one it was dispatched to.
/// Their bits do not depend on it (the same operations per element, only the vector width
/// differs), but a trace records it (`detcheck.kernel` in its environment snapshot), so two runs
/// that differ say so.
#[must_use]
pub fn selected_kernel() -> &'static str {
    // The vector width in bits of the version dispatched to (the macro cannot return a
    // `&'static str`).
    #[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq", "x86_64+avx2"))]
    fn width() -> u32 {
        let target = multiversion::target::selected_target!();
        if target.supports_feature_str("avx512f") {
            512
        } else if target.supports_feature_str("avx2") {
            256
        } else {
            128
        }
    }
    match width() {
        512 => "avx512",
        256 => "avx2",
        _ => "baseline",
    }
}

/// Elementwise arithmetic with order-independent `max` and wrap-around integer sums.
trait Reducible: Element {
    fn add(self, other: Self) -> Self;
    fn max_of(self, other: Self) -> Self;
}

macro_rules! float_reducible {
    ($t:ty) => {
        impl Reducible for $t {
            #[inline]
            fn add(self, other: Self) -> Self {
                // One NaN, whatever the operands' payloads: IEEE 754 does not say which payload
                // a sum keeps (x86 keeps the first NaN operand's, and a compiler may swap the
                // operands; a GPU gives its own 0x7fffffff), so a NaN sum is the canonical NaN
                // on every backend and device, as max's and the reproducible sum's are.
                let sum = self + other;
                if sum.is_nan() {
                    <$t>::NAN
                } else {
                    sum
                }
            }
            #[inline]
            fn max_of(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() {
                    <$t>::NAN
                } else if self.total_cmp(&other).is_ge() {
                    self
                } else {
                    other
                }
            }
        }
    };
}
float_reducible!(f32);
float_reducible!(f64);

macro_rules! int_reducible {
    ($t:ty) => {
        impl Reducible for $t {
            #[inline]
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            #[inline]
            fn max_of(self, other: Self) -> Self {
                Ord::max(self, other)
            }
        }
    };
}
int_reducible!(i64);
int_reducible!(i32);
int_reducible!(u8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_element_once() {
        for (len, parts) in [(10, 3), (2, 4), (0, 2), (7, 1)] {
            let ranges: Vec<_> = (0..parts).map(|c| chunk_range(len, parts, c)).collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[parts - 1].end, len);
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
        }
    }

    #[test]
    fn ring_order_starts_at_the_chunk() {
        assert_eq!(
            summation_order(ReductionMode::Ring, 4, 2, &[]),
            [2, 3, 0, 1]
        );
        assert_eq!(
            summation_order(ReductionMode::RankOrdered, 3, 2, &[]),
            [0, 1, 2]
        );
        assert_eq!(
            summation_order(ReductionMode::ArrivalOrder, 3, 0, &[2, 0, 1]),
            [2, 0, 1]
        );
    }

    #[test]
    fn sum_order_changes_bits_and_max_does_not() {
        let a = TensorData::F32(vec![1e8, 0.0]);
        let b = TensorData::F32(vec![-1e8, -0.0]);
        let c = TensorData::F32(vec![1.0, f32::NAN]);
        let all = [&a, &b, &c];
        let sum =
            |order: &[usize]| reduce_chunk(&all, 0..1, order, ReduceOp::Sum, ReductionMode::Ring);
        // (1e8 + -1e8) + 1 = 1, but (1e8 + 1) + -1e8 = 0 in f32.
        assert_eq!(sum(&[0, 1, 2]), TensorData::F32(vec![1.0]));
        assert_eq!(sum(&[0, 2, 1]), TensorData::F32(vec![0.0]));
        let max = |order: &[usize]| {
            reduce_chunk(&all[..2], 0..2, order, ReduceOp::Max, ReductionMode::Ring)
        };
        assert_eq!(format!("{:?}", max(&[0, 1])), format!("{:?}", max(&[1, 0])));
        let TensorData::F32(m) = max(&[1, 0]) else {
            unreachable!()
        };
        assert_eq!(m[1].to_bits(), 0.0f32.to_bits(), "+0.0 wins over -0.0");
        let with_nan = reduce_chunk(&all, 1..2, &[2, 0, 1], ReduceOp::Max, ReductionMode::Ring);
        let TensorData::F32(m) = with_nan else {
            unreachable!()
        };
        assert!(m[0].is_nan());
    }

    #[test]
    fn integer_sums_wrap() {
        let a = TensorData::U8(vec![200]);
        let b = TensorData::U8(vec![100]);
        assert_eq!(
            reduce_chunk(&[&a, &b], 0..1, &[0, 1], ReduceOp::Sum, ReductionMode::Ring),
            TensorData::U8(vec![44])
        );
    }

    #[test]
    fn i32_reduces_exactly_in_every_mode_and_order() {
        let a = TensorData::I32(vec![i32::MAX, -7, 3]);
        let b = TensorData::I32(vec![1, 5, -3]);
        let c = TensorData::I32(vec![2, i32::MIN, 0]);
        let all = [&a, &b, &c];
        for mode in ReductionMode::ALL {
            for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
                assert_eq!(
                    reduce_chunk(&all, 0..3, &order, ReduceOp::Sum, mode),
                    TensorData::I32(vec![i32::MIN + 2, i32::MAX - 1, 0]),
                    "{mode} {order:?}"
                );
                assert_eq!(
                    reduce_chunk(&all, 1..3, &order, ReduceOp::Max, mode),
                    TensorData::I32(vec![5, 3]),
                    "{mode} {order:?}"
                );
            }
        }
    }

    #[test]
    fn the_selected_kernel_is_the_best_one_the_cpu_runs() {
        let kernel = selected_kernel();
        #[cfg(target_arch = "x86_64")]
        {
            let expected = if std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512vl")
                && std::is_x86_feature_detected!("avx512dq")
            {
                "avx512"
            } else if std::is_x86_feature_detected!("avx2") {
                "avx2"
            } else {
                "baseline"
            };
            assert_eq!(kernel, expected);
        }
        #[cfg(not(target_arch = "x86_64"))]
        assert_eq!(kernel, "baseline");
    }

    #[test]
    fn half_precision_and_bool_are_refused_with_a_reason() {
        for dtype in DType::ALL {
            let refused = unreducible(dtype);
            let expected = !matches!(
                dtype,
                DType::F32 | DType::F64 | DType::I64 | DType::I32 | DType::U8
            );
            assert_eq!(refused.is_some(), expected, "{dtype}");
            if let Some(why) = refused {
                assert!(
                    why.starts_with(&format!("{dtype} tensors are not reduced")),
                    "{why}"
                );
            }
        }
        assert!(unreducible(DType::I16).unwrap().contains("16 bits"));
        assert!(unreducible(DType::F8E4M3)
            .unwrap()
            .starts_with("f8e4m3fn tensors"));
        assert!(unreducible(DType::C64).unwrap().contains("view_as_real"));
        let why = unreducible(DType::BF16).unwrap();
        assert!(why.starts_with("bf16 tensors are not reduced"), "{why}");
        assert!(why.contains("accumulation precision"), "{why}");
        assert!(unreducible(DType::Bool)
            .unwrap()
            .starts_with("bool tensors"));
    }
}
