//! Scatter-add (segmented sums) on the CPU: the reference whose bits the GPU's deterministic
//! twin must give (`device/ops.rs`), and the stable counting sort that twin needs.
//!
//! A scatter-add of `values` by `indices` into `buckets` sums, for every bucket `b`, the values
//! whose index is `b` (PyTorch's `index_add_`, `scatter_add_`). Main items:
//! [`segmented_sum_f32`] (the definition), [`segments`] → [`Segments`] (which positions fall into
//! which bucket, in increasing position), [`Segments::sum_f32`] (the same sums, folded segment by
//! segment as the GPU kernel folds them) and [`ScatterError`].
//!
//! Determinism: the fold is fixed, so the bits depend only on the values and indices. Bucket
//! `b`'s sum starts from its first term (lowest position `i` with `indices[i] == b`) and adds the
//! others in increasing `i`, one IEEE f32 `+` (round to nearest even) at a time:
//! `((v[i0] + v[i1]) + v[i2]) + ...`. A bucket without terms is `+0.0`. Starting from the first
//! term rather than from `+0.0` keeps a lone `-0.0` as `-0.0`, as `reduce::reduce_chunk` keeps its
//! first contribution. An `atomicAdd` scatter has no such order: it adds in whatever order the
//! GPU's threads arrive, which is why its bits change from launch to launch.
//!
//! Limits: positions and buckets are `u32` (the GPU kernels' index type), so at most
//! `u32::MAX` values and `u32::MAX` buckets; NaN results are NaN on every device, but their
//! payload bits are the hardware's (the kinds draw finite values).

use std::fmt;

/// Why a scatter cannot be computed: the input is at fault, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScatterError {
    /// An index names no bucket.
    #[error("index {index} at position {position} is not below the {buckets} buckets")]
    IndexOutOfRange {
        /// Where in `indices`.
        position: usize,
        /// The index found there.
        index: u32,
        /// The number of buckets.
        buckets: usize,
    },
    /// `values` and `indices` differ in length.
    #[error("{values} values but {indices} indices")]
    LengthMismatch {
        /// The number of values.
        values: usize,
        /// The number of indices.
        indices: usize,
    },
    /// More positions or buckets than a `u32` counts.
    #[error("{count} {what}: at most {} fit a u32 index", u32::MAX)]
    TooMany {
        /// `values` or `buckets`.
        what: &'static str,
        /// How many were given.
        count: usize,
    },
}

/// Checks that every index is below `buckets` and that positions and buckets fit a `u32`.
///
/// # Errors
/// [`ScatterError::IndexOutOfRange`] naming the first bad index, [`ScatterError::TooMany`].
pub fn check_indices(indices: &[u32], buckets: usize) -> Result<(), ScatterError> {
    for (what, count) in [("values", indices.len()), ("buckets", buckets)] {
        if u32::try_from(count).is_err() {
            return Err(ScatterError::TooMany { what, count });
        }
    }
    match indices.iter().position(|&b| b as usize >= buckets) {
        Some(position) => Err(ScatterError::IndexOutOfRange {
            position,
            index: indices[position],
            buckets,
        }),
        None => Ok(()),
    }
}

/// Bucket `b` = the sum of `values[i]` with `indices[i] == b`, folded from the first such term
/// in increasing `i` (see the module docs); `+0.0` for a bucket without terms.
///
/// # Errors
/// [`ScatterError`] when the lengths differ or an index is not below `buckets`.
pub fn segmented_sum_f32(
    values: &[f32],
    indices: &[u32],
    buckets: usize,
) -> Result<Vec<f32>, ScatterError> {
    check_lengths(values, indices)?;
    check_indices(indices, buckets)?;
    let mut out = vec![0.0f32; buckets];
    let mut started = vec![false; buckets];
    for (&value, &bucket) in values.iter().zip(indices) {
        let b = bucket as usize;
        if started[b] {
            out[b] += value;
        } else {
            out[b] = value;
            started[b] = true;
        }
    }
    Ok(out)
}

fn check_lengths(values: &[f32], indices: &[u32]) -> Result<(), ScatterError> {
    if values.len() == indices.len() {
        Ok(())
    } else {
        Err(ScatterError::LengthMismatch {
            values: values.len(),
            indices: indices.len(),
        })
    }
}

/// The positions of each bucket, in increasing position: a stable counting sort of the indices.
///
/// `order` lists every position once, bucket 0's first; bucket `b`'s positions are
/// `order[offsets[b]..offsets[b + 1]]`, increasing. `offsets` has `buckets + 1` entries, from 0
/// to the number of positions, never decreasing. Only [`segments`] builds one, so these hold for
/// every `Segments` (the GPU kernel reads them without bounds checks of its own).
#[derive(Clone, PartialEq, Eq)]
pub struct Segments {
    order: Vec<u32>,
    offsets: Vec<u32>,
}

impl fmt::Debug for Segments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Segments({} positions in {} buckets)",
            self.len(),
            self.buckets()
        )
    }
}

/// Sorts the positions of `indices` by bucket, stably (see [`Segments`]).
///
/// # Errors
/// [`ScatterError`] when an index is not below `buckets`, or there are more than `u32::MAX`
/// positions or buckets.
pub fn segments(indices: &[u32], buckets: usize) -> Result<Segments, ScatterError> {
    check_indices(indices, buckets)?;
    // offsets[b + 1] counts bucket b first; the prefix sum then makes offsets[b] its start.
    let mut offsets = vec![0u32; buckets + 1];
    for &bucket in indices {
        offsets[bucket as usize + 1] += 1;
    }
    for b in 0..buckets {
        offsets[b + 1] += offsets[b];
    }
    // Positions in increasing order, each appended at its bucket's next free slot: stable.
    let mut next: Vec<u32> = offsets[..buckets].to_vec();
    let mut order = vec![0u32; indices.len()];
    for (position, &bucket) in indices.iter().enumerate() {
        let slot = &mut next[bucket as usize];
        // `check_indices` bounded the positions by u32::MAX.
        order[*slot as usize] = position as u32;
        *slot += 1;
    }
    Ok(Segments { order, offsets })
}

impl Segments {
    /// Every position, grouped by bucket, increasing within a bucket.
    #[must_use]
    pub fn order(&self) -> &[u32] {
        &self.order
    }

    /// Where each bucket's positions start in [`Segments::order`]; `buckets + 1` entries, the
    /// last one the number of positions.
    #[must_use]
    pub fn offsets(&self) -> &[u32] {
        &self.offsets
    }

    /// The number of buckets.
    #[must_use]
    pub fn buckets(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The number of positions (of values to scatter).
    #[must_use]
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// `true` without positions.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The positions that fall into `bucket`, increasing.
    ///
    /// # Panics
    /// When `bucket` is not below [`Segments::buckets`].
    #[must_use]
    pub fn bucket(&self, bucket: usize) -> &[u32] {
        &self.order[self.offsets[bucket] as usize..self.offsets[bucket + 1] as usize]
    }

    /// [`segmented_sum_f32`] folded segment by segment, as `detcheck_segmented_sum_f32` does on
    /// the GPU: the same bits, since each segment lists its positions in increasing order.
    ///
    /// # Errors
    /// [`ScatterError::LengthMismatch`] when `values` has not one value per position.
    pub fn sum_f32(&self, values: &[f32]) -> Result<Vec<f32>, ScatterError> {
        if values.len() != self.len() {
            return Err(ScatterError::LengthMismatch {
                values: values.len(),
                indices: self.len(),
            });
        }
        Ok((0..self.buckets())
            .map(|b| {
                let mut positions = self.bucket(b).iter().map(|&i| values[i as usize]);
                let first = positions.next().unwrap_or(0.0);
                positions.fold(first, |sum, value| sum + value)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::seed::{derive_stream, Stream};

    #[test]
    fn each_bucket_folds_its_values_left_to_right_from_the_first() {
        // f32's spacing at 1e8 is 8: (1e8 + 3) + 3 rounds to 1e8 twice; (3 + 3) + 1e8 is 1e8 + 8.
        let values = [1e8f32, 5.0, 3.0, 3.0, -0.0, 2.0];
        let indices = [0u32, 1, 0, 0, 2, 1];
        let out = segmented_sum_f32(&values, &indices, 4).unwrap();
        assert_eq!(out[0], 1e8);
        assert_eq!((3.0f32 + 3.0) + 1e8, 1e8 + 8.0);
        assert_eq!(out[1], 7.0);
        // A lone -0.0 stays -0.0 (the fold starts from it, not from +0.0); no terms: +0.0.
        assert_eq!(out[2].to_bits(), (-0.0f32).to_bits());
        assert_eq!(out[3].to_bits(), 0.0f32.to_bits());
    }

    #[test]
    fn segments_are_a_stable_counting_sort() {
        let indices = [2u32, 0, 2, 1, 0, 2];
        let segments = segments(&indices, 4).unwrap();
        assert_eq!(segments.order(), &[1, 4, 3, 0, 2, 5]);
        assert_eq!(segments.offsets(), &[0, 2, 3, 6, 6]);
        assert_eq!(segments.buckets(), 4);
        assert_eq!(segments.bucket(2), &[0, 2, 5]);
        assert!(segments.bucket(3).is_empty());

        let empty = super::segments(&[], 3).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.offsets(), &[0, 0, 0, 0]);
        assert_eq!(super::segments(&[], 0).unwrap().buckets(), 0);
    }

    #[test]
    fn folding_by_segments_gives_the_definitions_bits() {
        for (len, buckets) in [(1usize, 1usize), (1000, 7), (10_000, 64), (4097, 5000)] {
            let mut rng = derive_stream(3, Stream::User(11), len as u64, buckets as u64);
            let values: Vec<f32> = (0..len)
                .map(|_| rng.normal_f32() * 2f32.powi(rng.below(17) as i32 - 8))
                .collect();
            let indices: Vec<u32> = (0..len).map(|_| rng.below(buckets as u64) as u32).collect();
            let direct = segmented_sum_f32(&values, &indices, buckets).unwrap();
            let folded = segments(&indices, buckets)
                .unwrap()
                .sum_f32(&values)
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&direct),
                bits(&folded),
                "{len} values, {buckets} buckets"
            );
        }
    }

    #[test]
    fn the_order_of_adds_changes_the_bits_of_such_values() {
        // What makes the atomicAdd control a control: the same multiset, added in another
        // order, gives other bits.
        let mut rng = derive_stream(5, Stream::Data, 0, 0);
        let values: Vec<f32> = (0..4096)
            .map(|_| rng.normal_f32() * 2f32.powi(rng.below(17) as i32 - 8))
            .collect();
        let forward = segmented_sum_f32(&values, &vec![0; 4096], 1).unwrap();
        let reversed: Vec<f32> = values.iter().rev().copied().collect();
        let backward = segmented_sum_f32(&reversed, &vec![0; 4096], 1).unwrap();
        assert_ne!(forward[0].to_bits(), backward[0].to_bits());
    }

    #[test]
    fn a_bad_index_or_length_is_an_error_not_a_panic() {
        assert_eq!(
            segmented_sum_f32(&[1.0, 2.0, 3.0], &[0, 3, 9], 3),
            Err(ScatterError::IndexOutOfRange {
                position: 1,
                index: 3,
                buckets: 3
            })
        );
        let err = segments(&[0, 1, 2], 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "index 2 at position 2 is not below the 2 buckets"
        );
        assert!(segments(&[0], 0).is_err());
        assert_eq!(
            segmented_sum_f32(&[1.0], &[0, 0], 1),
            Err(ScatterError::LengthMismatch {
                values: 1,
                indices: 2
            })
        );
        let segments = segments(&[0, 0], 1).unwrap();
        assert!(segments.sum_f32(&[1.0]).is_err());
        assert!(matches!(
            check_indices(&[], u32::MAX as usize + 1),
            Err(ScatterError::TooMany {
                what: "buckets",
                ..
            })
        ));
    }
}
