//! Shards of one global tensor: where a shard lies ([`Placement`]) and a digest of its elements
//! by their global position ([`PositionDigest`]) whose sum over the shards of a tensor is the
//! digest of the whole tensor.
//!
//! A sharded record (a DTensor's local shard under FSDP2 or tensor parallel, FSDP1's flat
//! parameter) holds only this rank's part of a tensor; the tree digest of its bytes says nothing
//! about the global tensor, so shards of one tensor at world size 2 cannot be compared with the
//! whole tensor at world size 1 through it. The position digest can: it is 128 bits, two 64-bit
//! lanes, each the wrapping sum over the elements of
//!
//! ```text
//! term(seed, i, x) = mix(w_k ^ ... mix(w_1 ^ mix(w_0 ^ mix(i ^ seed))))
//! ```
//!
//! where `i` is the element's global row-major index, `w_0, w_1, ...` the element's canonical
//! little-endian bytes read as 64-bit words (one word, zero-extended, for elements of up to 8
//! bytes; two for `c128`), `mix` the murmur3 64-bit finalizer and `seed` the lane's constant
//! (`SEEDS`). Sums commute, so the digest of a tensor is the wrapping sum of its shards'
//! digests, whatever the world size and in whatever order the shards are added; an element
//! moved to another index, or changed, changes the terms (a difference goes unnoticed with
//! probability about 2^-128, or 2^-64 against changes built to cancel one lane). Duplicated
//! shards (replicated mesh dimensions) must be counted once: callers dedupe by placement.
//!
//! Determinism: a pure function of the dtype's byte size, the placement and the bytes. The
//! kernels are multiversioned (AVX-512, AVX2, baseline) with the same integer arithmetic, so
//! the bits never depend on the CPU. Limits: the digest is not a cryptographic hash.

use crate::value::tensor::TensorView;
use multiversion::multiversion;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The lanes' seeds: the first 128 bits of pi's fraction.
pub(crate) const SEEDS: [u64; 2] = [0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344];

/// The murmur3 64-bit finalizer.
#[inline(always)]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// A 128-bit digest of elements by global position: see the module doc. Shards add up
/// (`+`) to the digest of the whole tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct PositionDigest(pub [u64; 2]);

/// The digest of the elements of both (disjoint) sets: each lane's wrapping sum.
impl std::ops::Add for PositionDigest {
    type Output = PositionDigest;

    fn add(self, other: PositionDigest) -> PositionDigest {
        PositionDigest([
            self.0[0].wrapping_add(other.0[0]),
            self.0[1].wrapping_add(other.0[1]),
        ])
    }
}

impl PositionDigest {
    /// The digest of no elements (the sum's zero).
    pub const ZERO: PositionDigest = PositionDigest([0, 0]);

    /// Its 16 bytes as the trace format stores them: lane 0 then lane 1, little-endian.
    #[must_use]
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.0[0].to_le_bytes());
        out[8..].copy_from_slice(&self.0[1].to_le_bytes());
        out
    }

    /// The digest of 16 bytes as [`PositionDigest::to_bytes`] writes them.
    #[must_use]
    pub fn from_bytes(b: [u8; 16]) -> PositionDigest {
        let lane = |at: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(x)
        };
        PositionDigest([lane(0), lane(8)])
    }

    /// The digest of a whole tensor (its element `i` at global index `i`).
    #[must_use]
    pub fn of_view(view: TensorView<'_>) -> PositionDigest {
        let mut lanes = [0u64; 2];
        digest_run(&mut lanes, 0, view.bytes(), view.dtype().size_of());
        PositionDigest(lanes)
    }

    /// The digest of a shard: the elements of `view` inside `placement`'s extent, at their
    /// global indices.
    ///
    /// # Errors
    /// [`PlacementError`] when the placement does not fit `view`'s shape or its global shape.
    pub fn of_shard(
        view: TensorView<'_>,
        placement: &Placement,
    ) -> Result<PositionDigest, PlacementError> {
        let size = view.dtype().size_of();
        let mut lanes = [0u64; 2];
        let bytes = view.bytes();
        for run in placement.runs(view.shape())? {
            let at = run.local as usize * size;
            let len = run.len as usize * size;
            digest_run(&mut lanes, run.global, &bytes[at..at + len], size);
        }
        Ok(PositionDigest(lanes))
    }
}

impl fmt::Display for PositionDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.to_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Adds the terms of the elements of `bytes` (each `size` bytes, the first at global index
/// `first`) to `lanes`.
fn digest_run(lanes: &mut [u64; 2], first: u64, bytes: &[u8], size: usize) {
    match size {
        1 => run_words(lanes, first, bytes.iter().map(|&b| u64::from(b))),
        2 => run_words(
            lanes,
            first,
            bytes
                .chunks_exact(2)
                .map(|c| u64::from(u16::from_le_bytes([c[0], c[1]]))),
        ),
        4 => run_4(lanes, first, bytes),
        8 => run_8(lanes, first, bytes),
        _ => run_wide(lanes, first, bytes, size),
    }
}

#[inline(always)]
fn run_words(lanes: &mut [u64; 2], first: u64, words: impl Iterator<Item = u64>) {
    let (mut a, mut b) = (lanes[0], lanes[1]);
    for (i, w) in (first..).zip(words) {
        a = a.wrapping_add(mix(w ^ mix(i ^ SEEDS[0])));
        b = b.wrapping_add(mix(w ^ mix(i ^ SEEDS[1])));
    }
    *lanes = [a, b];
}

#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq", "x86_64+avx2"))]
fn run_4(lanes: &mut [u64; 2], first: u64, bytes: &[u8]) {
    run_words(
        lanes,
        first,
        bytes
            .chunks_exact(4)
            .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
    );
}

#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq", "x86_64+avx2"))]
fn run_8(lanes: &mut [u64; 2], first: u64, bytes: &[u8]) {
    run_words(
        lanes,
        first,
        bytes.chunks_exact(8).map(|c| {
            let mut x = [0u8; 8];
            x.copy_from_slice(c);
            u64::from_le_bytes(x)
        }),
    );
}

/// Elements of more than 8 bytes (c128): one more `mix` per further word.
fn run_wide(lanes: &mut [u64; 2], first: u64, bytes: &[u8], size: usize) {
    for (i, element) in (first..).zip(bytes.chunks_exact(size)) {
        for (lane, seed) in lanes.iter_mut().zip(SEEDS) {
            let mut h = mix(i ^ seed);
            for word in element.chunks(8) {
                let mut x = [0u8; 8];
                x[..word.len()].copy_from_slice(word);
                h = mix(u64::from_le_bytes(x) ^ h);
            }
            *lane = lane.wrapping_add(h);
        }
    }
}

/// Where a shard lies in its global tensor: the global shape, and the box this shard holds,
/// from `offset` (per dimension) with `extent` elements per dimension. The shard's own data
/// may be larger than its extent (FSDP1 pads its flat parameter's last shard): only the
/// elements at local indices below `extent` belong to the global tensor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Placement {
    /// The global tensor's shape.
    pub global_shape: Vec<u64>,
    /// The global index of the shard's first element, per dimension.
    pub offset: Vec<u64>,
    /// The elements per dimension this shard holds of the global tensor.
    pub extent: Vec<u64>,
}

/// A sharded record's placement and the position digest of its elements (the trace format's
/// `P` entry, written after the record it describes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shard {
    /// Where the shard lies.
    pub placement: Placement,
    /// The position digest of its elements inside the placement's extent.
    pub digest: PositionDigest,
}

/// A placement that does not fit its shard or its global tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// The global shape, offset, extent and the shard's shape must have as many dimensions.
    #[error(
        "the placement has {global} global dimensions, {offset} offsets and {extent} extents, \
         and the shard {local} dimensions: they must agree"
    )]
    Dimensions {
        /// Dimensions of the global shape.
        global: usize,
        /// Offsets.
        offset: usize,
        /// Extents.
        extent: usize,
        /// Dimensions of the shard.
        local: usize,
    },
    /// A box that leaves the global tensor.
    #[error(
        "dimension {dim}: offset {offset} + extent {extent} runs past the global size {global}"
    )]
    Outside {
        /// The dimension.
        dim: usize,
        /// Its offset.
        offset: u64,
        /// Its extent.
        extent: u64,
        /// Its global size.
        global: u64,
    },
    /// An extent larger than the shard's data.
    #[error("dimension {dim}: extent {extent} is larger than the shard's {local} elements")]
    Larger {
        /// The dimension.
        dim: usize,
        /// Its extent.
        extent: u64,
        /// The shard's size in it.
        local: usize,
    },
    /// A trace of a format version before shard entries (version 3).
    #[error("trace format versions before 3 hold no shard placements")]
    Unsupported,
    /// A global tensor of more than 2^64 elements.
    #[error("the global shape has more than 2^64 elements")]
    Overflow,
}

/// A run of consecutive elements of a shard: `len` elements from local index `local`, at global
/// indices from `global`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) local: u64,
    pub(crate) global: u64,
    pub(crate) len: u64,
}

impl Placement {
    /// The placement of a whole tensor of `shape` (one shard at offset 0).
    #[must_use]
    pub fn whole(shape: &[usize]) -> Placement {
        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        Placement {
            offset: vec![0; dims.len()],
            extent: dims.clone(),
            global_shape: dims,
        }
    }

    /// Elements of the global tensor (`None` above 2^64).
    #[must_use]
    pub fn global_elements(&self) -> Option<u64> {
        self.global_shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Elements of the box this shard holds.
    #[must_use]
    pub fn num_elements(&self) -> u64 {
        self.extent
            .iter()
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Checks that the placement fits a shard of `local` shape: as many dimensions everywhere,
    /// the box inside the global shape, the extent within the shard.
    ///
    /// # Errors
    /// [`PlacementError`] naming the first dimension that does not fit.
    pub fn check(&self, local: &[usize]) -> Result<(), PlacementError> {
        let n = self.global_shape.len();
        if self.offset.len() != n || self.extent.len() != n || local.len() != n {
            return Err(PlacementError::Dimensions {
                global: n,
                offset: self.offset.len(),
                extent: self.extent.len(),
                local: local.len(),
            });
        }
        self.global_elements().ok_or(PlacementError::Overflow)?;
        for (dim, &held) in local.iter().enumerate() {
            let (offset, extent, global) =
                (self.offset[dim], self.extent[dim], self.global_shape[dim]);
            if offset.checked_add(extent).is_none_or(|end| end > global) {
                return Err(PlacementError::Outside {
                    dim,
                    offset,
                    extent,
                    global,
                });
            }
            if extent > held as u64 {
                return Err(PlacementError::Larger {
                    dim,
                    extent,
                    local: local[dim],
                });
            }
        }
        Ok(())
    }

    /// The shard's elements as runs of consecutive global indices, in local row-major order.
    ///
    /// # Errors
    /// As [`Placement::check`].
    pub(crate) fn runs(&self, local: &[usize]) -> Result<Vec<Run>, PlacementError> {
        self.check(local)?;
        let n = local.len();
        if self.extent.contains(&0) {
            return Ok(Vec::new());
        }
        if n == 0 {
            return Ok(vec![Run {
                local: 0,
                global: 0,
                len: 1,
            }]);
        }
        let strides = |shape: &mut dyn Iterator<Item = u64>| {
            let dims: Vec<u64> = shape.collect();
            let mut s = vec![1u64; n];
            for k in (0..n - 1).rev() {
                s[k] = s[k + 1] * dims[k + 1];
            }
            s
        };
        let local_strides = strides(&mut local.iter().map(|&d| d as u64));
        let global_strides = strides(&mut self.global_shape.iter().copied());
        let outer: u64 = self.extent[..n - 1].iter().product();
        let mut runs = Vec::with_capacity(outer.min(1 << 16) as usize);
        let mut index = vec![0u64; n - 1];
        for _ in 0..outer {
            let (mut l, mut g) = (0u64, 0u64);
            for k in 0..n - 1 {
                l += index[k] * local_strides[k];
                g += (self.offset[k] + index[k]) * global_strides[k];
            }
            g += self.offset[n - 1];
            runs.push(Run {
                local: l,
                global: g,
                len: self.extent[n - 1],
            });
            for k in (0..n - 1).rev() {
                index[k] += 1;
                if index[k] < self.extent[k] {
                    break;
                }
                index[k] = 0;
            }
        }
        Ok(runs)
    }

    /// `true` when the two boxes share an element.
    #[must_use]
    pub fn overlaps(&self, other: &Placement) -> bool {
        self.offset
            .iter()
            .zip(&self.extent)
            .zip(other.offset.iter().zip(&other.extent))
            .all(|((&a, &ea), (&b, &eb))| a < b + eb && b < a + ea)
    }

    /// The placement in words: `[0:2, 4:8] of [4, 8]`.
    #[must_use]
    pub fn describe(&self) -> String {
        let boxes: Vec<String> = self
            .offset
            .iter()
            .zip(&self.extent)
            .map(|(o, e)| format!("{o}:{}", o + e))
            .collect();
        let global: Vec<String> = self.global_shape.iter().map(ToString::to_string).collect();
        format!("[{}] of [{}]", boxes.join(", "), global.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::tensor::{DType, Tensor, TensorData};

    fn f32s(shape: &[usize], values: impl Iterator<Item = f32>) -> Tensor {
        Tensor::new(shape.to_vec(), TensorData::F32(values.collect())).unwrap()
    }

    /// The bytes `i % 251` read as `dtype`, as the golden vectors of the docs use them.
    fn golden(dtype: DType, n: usize) -> PositionDigest {
        let bytes: Vec<u8> = (0..n * dtype.size_of()).map(|i| (i % 251) as u8).collect();
        let shape = [n];
        PositionDigest::of_view(TensorView::new(dtype, &shape, &bytes).unwrap())
    }

    /// Pinned in docs/trace-format.md: a change to these is a format change.
    #[test]
    fn golden_vectors() {
        let cases = [
            (DType::F32, 0, "00000000000000000000000000000000"),
            (DType::F32, 1, "a2d7e832fbe6b768ecc63cb3efb871ce"),
            (DType::F32, 1000, "a67edec1868e53d71005d15ccf6f7bd3"),
            (DType::BF16, 1000, "71b20989bb2a44e8e0d3d58654a1afea"),
            (DType::C128, 10, "77d8ed56951f9f0455d99c929be958c1"),
        ];
        for (dtype, n, expected) in cases {
            assert_eq!(golden(dtype, n).to_string(), expected, "{dtype:?} x {n}");
        }
    }

    fn shard(t: &Tensor, placement: &Placement) -> PositionDigest {
        t.with_view(|v| PositionDigest::of_shard(v, placement))
            .unwrap()
    }

    #[test]
    fn shards_sum_to_the_whole_tensor() {
        let whole = f32s(&[4, 6], (0..24).map(|i| i as f32 * 0.5));
        let full = whole.with_view(PositionDigest::of_view);
        // 2 x 2 blocks of [2, 3], the sum taken in another order.
        let mut sum = PositionDigest::ZERO;
        for (r, c) in [(1, 1), (0, 0), (1, 0), (0, 1)] {
            let values = (0..2).flat_map(|i| (0..3).map(move |j| (r * 2 + i) * 6 + c * 3 + j));
            let part = f32s(&[2, 3], values.map(|i| i as f32 * 0.5));
            let p = Placement {
                global_shape: vec![4, 6],
                offset: vec![r as u64 * 2, c as u64 * 3],
                extent: vec![2, 3],
            };
            sum = sum + shard(&part, &p);
        }
        assert_eq!(sum, full);
        // The whole tensor as one shard of itself.
        assert_eq!(shard(&whole, &Placement::whole(&[4, 6])), full);
    }

    #[test]
    fn padding_beyond_the_extent_is_left_out() {
        let whole = f32s(&[5], (0..5).map(|i| i as f32));
        let full = whole.with_view(PositionDigest::of_view);
        // FSDP1: 5 elements on 2 ranks of 3, the last padded with one element.
        let a = f32s(&[3], [0.0, 1.0, 2.0].into_iter());
        let b = f32s(&[3], [3.0, 4.0, 99.0].into_iter());
        let pa = Placement {
            global_shape: vec![5],
            offset: vec![0],
            extent: vec![3],
        };
        let pb = Placement {
            offset: vec![3],
            extent: vec![2],
            ..pa.clone()
        };
        assert_eq!(shard(&a, &pa) + shard(&b, &pb), full);
    }

    #[test]
    fn a_permutation_or_a_changed_bit_changes_the_digest() {
        let base = f32s(&[8], (0..8).map(|i| i as f32));
        let d = base.with_view(PositionDigest::of_view);
        let swapped = f32s(&[8], [1.0, 0.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0].into_iter());
        assert_ne!(swapped.with_view(PositionDigest::of_view), d);
        let flipped = f32s(&[8], (0..8).map(|i| if i == 5 { -5.0 } else { i as f32 }));
        assert_ne!(flipped.with_view(PositionDigest::of_view), d);
        // The same elements at other global positions.
        let p = Placement {
            global_shape: vec![16],
            offset: vec![8],
            extent: vec![8],
        };
        assert_ne!(shard(&base, &p), d);
        let bytes = PositionDigest::from_bytes(d.to_bytes());
        assert_eq!(bytes, d);
    }

    #[test]
    fn placements_that_do_not_fit_are_refused() {
        let p = Placement {
            global_shape: vec![4],
            offset: vec![3],
            extent: vec![2],
        };
        assert!(matches!(
            p.check(&[2]),
            Err(PlacementError::Outside { dim: 0, .. })
        ));
        assert!(matches!(
            Placement::whole(&[4]).check(&[3]),
            Err(PlacementError::Larger { .. })
        ));
        assert!(matches!(
            Placement::whole(&[4]).check(&[4, 1]),
            Err(PlacementError::Dimensions { .. })
        ));
        let huge = Placement {
            global_shape: vec![u64::MAX, 2],
            offset: vec![0, 0],
            extent: vec![1, 1],
        };
        assert_eq!(huge.check(&[1, 1]), Err(PlacementError::Overflow));
        let edge = Placement {
            global_shape: vec![u64::MAX],
            offset: vec![u64::MAX],
            extent: vec![1],
        };
        assert!(edge.check(&[1]).is_err());
    }
}
