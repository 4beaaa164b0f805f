//! Which samples a rank reads, and in which batches: PyTorch's `DistributedSampler` semantics.
//!
//! [`DistributedSampler`] gives a rank its indices of an epoch: the epoch's order of `0..len` (a
//! permutation from the shared `data_order` stream at the epoch, or `0..len` unshuffled), padded
//! by repeating the order from its start to a multiple of the world size (or truncated to one, with
//! `drop_last`), then strided over ranks: rank `r` takes positions `r, r + W, r + 2W, ...`.
//! [`BatchSampler`] cuts those into batches of `batch_size`; a [`LoaderPosition`] (epoch, batch)
//! names the next batch to load, which is all a checkpoint needs to resume the data order.
//!
//! Determinism: the order is a function of (seed, epoch, len) alone, shared by all ranks; a rank's
//! indices add the world size and rank. Strided sharding makes global batch `b` (the union of
//! batch `b` over ranks, global batch `G = batch_size · W`) exactly positions `b·G .. (b+1)·G` of
//! the epoch's order: with a fixed `G` and `len` divisible by `G`, the set of samples in each
//! global batch does not depend on the world size.
//!
//! Limits: without `drop_last`, padding repeats samples (as PyTorch does), so some samples count
//! twice in an epoch; the permutation is built whole (`len` indices per epoch).

use super::{DataError, SHARED_RANK};
use crate::value::seed::{derive_stream, Stream};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// One rank's share of each epoch's sample order, as PyTorch's `DistributedSampler`.
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    len: u64,
    world_size: usize,
    rank: usize,
    seed: u64,
    shuffle: bool,
    drop_last: bool,
}

impl DistributedSampler {
    /// The sampler of `rank` among `world_size` ranks over a dataset of `len` samples; with
    /// `shuffle`, each epoch's order is a permutation drawn from `seed`.
    ///
    /// # Errors
    /// [`DataError::Invalid`] naming the field: `len` 0, `world_size` 0, `rank` not below
    /// `world_size`, or `drop_last` with fewer samples than ranks (no rank would get any).
    pub fn new(
        len: u64,
        world_size: usize,
        rank: usize,
        seed: u64,
        shuffle: bool,
        drop_last: bool,
    ) -> Result<Self, DataError> {
        if len == 0 {
            return Err(DataError::invalid("len", "the dataset has no samples"));
        }
        if world_size == 0 {
            return Err(DataError::invalid("world_size", "must be at least 1"));
        }
        if rank >= world_size {
            return Err(DataError::invalid(
                "rank",
                format!("{rank} is not below world_size {world_size}"),
            ));
        }
        if drop_last && len < world_size as u64 {
            return Err(DataError::invalid(
                "drop_last",
                format!(
                    "{len} samples are fewer than world_size {world_size}, so every rank \
                     would get none"
                ),
            ));
        }
        Ok(DistributedSampler {
            len,
            world_size,
            rank,
            seed,
            shuffle,
            drop_last,
        })
    }

    /// Samples per rank per epoch: `len / W` with `drop_last`, `ceil(len / W)` otherwise.
    #[must_use]
    pub fn num_samples(&self) -> u64 {
        let world_size = self.world_size as u64;
        if self.drop_last {
            self.len / world_size
        } else {
            self.len.div_ceil(world_size)
        }
    }

    /// The number of samples of the dataset this sampler covers.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// This rank's indices for `epoch`, as PyTorch's `DistributedSampler`: the epoch's order of
    /// `0..len` (a permutation shuffled with
    /// `derive_stream(seed, Stream::DataOrder, u64::MAX, epoch).shuffle(..)`, or `0..len` when
    /// not shuffling); without `drop_last` padded by repeating the order from its start
    /// (repeatedly if needed) to `num_samples · W`; with `drop_last` truncated to
    /// `num_samples · W`; then this rank takes positions `rank, rank + W, rank + 2W, ...`.
    #[must_use]
    pub fn epoch_indices(&self, epoch: u64) -> Vec<u64> {
        let mut order: Vec<u64> = (0..self.len).collect();
        if self.shuffle {
            derive_stream(self.seed, Stream::DataOrder, SHARED_RANK, epoch).shuffle(&mut order);
        }
        let world_size = self.world_size as u64;
        // Position p of the padded (or truncated) order is order[p % len]: padding repeats the
        // order from its start, and truncation keeps positions below len.
        (0..self.num_samples())
            .map(|k| {
                let position = self.rank as u64 + k * world_size;
                order[(position % self.len) as usize]
            })
            .collect()
    }
}

/// Cuts a rank's epoch indices into batches.
#[derive(Debug, Clone)]
pub struct BatchSampler {
    sampler: DistributedSampler,
    batch_size: usize,
    drop_last: bool,
}

impl BatchSampler {
    /// Batches of `batch_size` samples per rank (the global batch is `batch_size · W`); with
    /// `drop_last`, a short last batch of an epoch is dropped.
    ///
    /// # Errors
    /// [`DataError::Invalid`] naming `batch_size`: zero, or larger than a rank's samples per
    /// epoch with `drop_last` (no batch at all).
    pub fn new(
        sampler: DistributedSampler,
        batch_size: usize,
        drop_last: bool,
    ) -> Result<Self, DataError> {
        if batch_size == 0 {
            return Err(DataError::invalid("batch_size", "must be at least 1"));
        }
        let batch_sampler = BatchSampler {
            sampler,
            batch_size,
            drop_last,
        };
        if batch_sampler.batches_per_epoch() == 0 {
            return Err(DataError::invalid(
                "batch_size",
                format!(
                    "{batch_size} is more than the {} samples a rank gets per epoch, and \
                     drop_last drops the only, short batch",
                    batch_sampler.sampler.num_samples()
                ),
            ));
        }
        Ok(batch_sampler)
    }

    /// Batches per rank per epoch (the same on every rank).
    #[must_use]
    pub fn batches_per_epoch(&self) -> u64 {
        let (samples, size) = (self.sampler.num_samples(), self.batch_size as u64);
        if self.drop_last {
            samples / size
        } else {
            samples.div_ceil(size)
        }
    }

    /// Samples per rank per batch (the last batch of an epoch may be shorter without `drop_last`).
    #[must_use]
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The sampler the batches are cut from.
    #[must_use]
    pub fn sampler(&self) -> &DistributedSampler {
        &self.sampler
    }

    /// Where batch `batch` lies in the rank's epoch indices.
    pub(crate) fn batch_range(&self, batch: u64) -> Range<usize> {
        let start = batch * self.batch_size as u64;
        let end = (start + self.batch_size as u64).min(self.sampler.num_samples());
        start as usize..end as usize
    }
}

/// Where a loader is: the epoch and the batch within it of the next batch to deliver.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(deny_unknown_fields)]
pub struct LoaderPosition {
    /// The epoch, from 0.
    pub epoch: u64,
    /// The batch within the epoch, from 0.
    pub batch: u64,
}

impl LoaderPosition {
    /// The position after this one (the next epoch's first batch after an epoch's last batch).
    ///
    /// # Panics
    /// Panics if `batches_per_epoch` is zero.
    #[must_use]
    pub fn advanced(self, batches_per_epoch: u64) -> Self {
        self.after(1, batches_per_epoch)
    }

    /// The position `n` batches later.
    ///
    /// # Panics
    /// Panics if `batches_per_epoch` is zero, or the epoch overflows `u64`.
    #[must_use]
    pub fn after(self, n: u64, batches_per_epoch: u64) -> Self {
        assert!(batches_per_epoch > 0, "an epoch has at least one batch");
        // In u128, so a position near the end of an epoch plus a large n cannot overflow.
        let batch = u128::from(self.batch) + u128::from(n);
        let per_epoch = u128::from(batches_per_epoch);
        let epochs = u64::try_from(batch / per_epoch).expect("the epoch fits in u64");
        LoaderPosition {
            epoch: self
                .epoch
                .checked_add(epochs)
                .expect("the epoch fits in u64"),
            batch: (batch % per_epoch) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn sampler(len: u64, world_size: usize, rank: usize, shuffle: bool, drop: bool) -> Vec<u64> {
        DistributedSampler::new(len, world_size, rank, 42, shuffle, drop)
            .unwrap()
            .epoch_indices(0)
    }

    /// Expected values computed by hand from torch/utils/data/distributed.py (shuffle=False):
    /// `indices += indices[:padding_size]` (or the list repeated), then `indices[rank:total:W]`.
    #[test]
    fn unshuffled_indices_match_pytorch() {
        // len 10, W 3: padded to 12 with [0, 1].
        assert_eq!(sampler(10, 3, 0, false, false), [0, 3, 6, 9]);
        assert_eq!(sampler(10, 3, 1, false, false), [1, 4, 7, 0]);
        assert_eq!(sampler(10, 3, 2, false, false), [2, 5, 8, 1]);
        // drop_last: truncated to 9.
        assert_eq!(sampler(10, 3, 0, false, true), [0, 3, 6]);
        assert_eq!(sampler(10, 3, 1, false, true), [1, 4, 7]);
        assert_eq!(sampler(10, 3, 2, false, true), [2, 5, 8]);
        // len 3, W 8: padding (5) is longer than the dataset, so the order repeats:
        // [0, 1, 2, 0, 1, 2, 0, 1].
        let all: Vec<u64> = (0..8)
            .flat_map(|r| sampler(3, 8, r, false, false))
            .collect();
        assert_eq!(all, [0, 1, 2, 0, 1, 2, 0, 1]);
        // len 7, W 2, drop_last: 3 each, sample 6 dropped.
        assert_eq!(sampler(7, 2, 0, false, true), [0, 2, 4]);
        assert_eq!(sampler(7, 2, 1, false, true), [1, 3, 5]);
    }

    #[test]
    fn num_samples_match_pytorch() {
        let num = |len, w, drop| {
            DistributedSampler::new(len, w, 0, 0, true, drop)
                .unwrap()
                .num_samples()
        };
        assert_eq!(num(10, 3, false), 4);
        assert_eq!(num(10, 3, true), 3);
        assert_eq!(num(12, 3, true), 4);
        assert_eq!(num(3, 8, false), 1);
        assert_eq!(num(1, 1, true), 1);
    }

    #[test]
    fn shuffled_order_is_the_data_order_stream_permutation() {
        let mut order: Vec<u64> = (0..20).collect();
        derive_stream(42, Stream::DataOrder, u64::MAX, 3).shuffle(&mut order);
        let s = DistributedSampler::new(20, 1, 0, 42, true, false).unwrap();
        assert_eq!(s.epoch_indices(3), order);
        assert_ne!(s.epoch_indices(3), s.epoch_indices(4), "epochs reshuffle");
        assert_ne!(order, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn union_over_ranks_covers_every_index() {
        for (len, world_size) in [(10, 3), (3, 8), (17, 4), (64, 8), (5, 1)] {
            for drop in [false, true] {
                if drop && len < world_size as u64 {
                    continue;
                }
                let mut counts = vec![0u32; len as usize];
                for rank in 0..world_size {
                    for index in sampler(len, world_size, rank, true, drop) {
                        counts[index as usize] += 1;
                    }
                }
                let total: u32 = counts.iter().sum();
                let num = DistributedSampler::new(len, world_size, 0, 42, true, drop)
                    .unwrap()
                    .num_samples();
                assert_eq!(u64::from(total), num * world_size as u64);
                if drop {
                    // Truncation drops fewer than W samples, each at most once.
                    assert!(counts.iter().all(|&c| c <= 1));
                    let dropped = counts.iter().filter(|&&c| c == 0).count();
                    assert!(dropped < world_size, "len {len} W {world_size}");
                } else {
                    assert!(counts.iter().all(|&c| c >= 1), "len {len} W {world_size}");
                }
            }
        }
    }

    /// Global batch b (the union of batch b over ranks) with a fixed global batch G:
    /// exactly positions b·G..(b+1)·G of the epoch's order, whatever the world size.
    #[test]
    fn global_batches_hold_the_same_samples_at_any_world_size() {
        let (len, global_batch) = (96u64, 24usize);
        for epoch in [0, 5] {
            let order = DistributedSampler::new(len, 1, 0, 42, true, false)
                .unwrap()
                .epoch_indices(epoch);
            for world_size in [1, 2, 3, 4, 8] {
                let batch_size = global_batch / world_size;
                let ranks: Vec<BatchSampler> = (0..world_size)
                    .map(|rank| {
                        let s = DistributedSampler::new(len, world_size, rank, 42, true, false);
                        BatchSampler::new(s.unwrap(), batch_size, false).unwrap()
                    })
                    .collect();
                assert_eq!(ranks[0].batches_per_epoch(), len / global_batch as u64);
                for b in 0..ranks[0].batches_per_epoch() {
                    let union: BTreeSet<u64> = ranks
                        .iter()
                        .flat_map(|s| s.sampler().epoch_indices(epoch)[s.batch_range(b)].to_vec())
                        .collect();
                    let lo = b as usize * global_batch;
                    let expected: BTreeSet<u64> =
                        order[lo..lo + global_batch].iter().copied().collect();
                    assert_eq!(union, expected, "epoch {epoch} W {world_size} batch {b}");
                }
            }
        }
    }

    #[test]
    fn bad_settings_name_their_field() {
        let field = |r: Result<DistributedSampler, DataError>| match r {
            Err(DataError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        };
        assert_eq!(
            field(DistributedSampler::new(0, 1, 0, 0, true, false)),
            "len"
        );
        assert_eq!(
            field(DistributedSampler::new(4, 0, 0, 0, true, false)),
            "world_size"
        );
        assert_eq!(
            field(DistributedSampler::new(4, 2, 2, 0, true, false)),
            "rank"
        );
        assert_eq!(
            field(DistributedSampler::new(3, 4, 0, 0, true, true)),
            "drop_last"
        );
        // Without drop_last, fewer samples than ranks is fine: padding repeats them.
        assert!(DistributedSampler::new(3, 4, 0, 0, true, false).is_ok());

        let s = DistributedSampler::new(10, 2, 0, 0, true, false).unwrap();
        for (size, drop) in [(0, false), (6, true)] {
            match BatchSampler::new(s.clone(), size, drop) {
                Err(DataError::Invalid { field, .. }) => assert_eq!(field, "batch_size"),
                other => panic!("expected batch_size rejected, got {other:?}"),
            }
        }
        // 5 samples per rank in one short batch, kept without drop_last.
        assert_eq!(
            BatchSampler::new(s, 6, false).unwrap().batches_per_epoch(),
            1
        );
    }

    #[test]
    fn batches_cut_the_epoch_with_a_short_last_batch_unless_dropped() {
        let s = DistributedSampler::new(22, 2, 1, 0, true, false).unwrap(); // 11 per rank
        let keep = BatchSampler::new(s.clone(), 4, false).unwrap();
        assert_eq!(keep.batches_per_epoch(), 3);
        assert_eq!(keep.batch_range(0), 0..4);
        assert_eq!(keep.batch_range(2), 8..11);
        let drop = BatchSampler::new(s, 4, true).unwrap();
        assert_eq!(drop.batches_per_epoch(), 2);
        assert_eq!(drop.batch_size(), 4);
    }

    #[test]
    fn positions_advance_across_epochs() {
        let p = LoaderPosition { epoch: 2, batch: 3 };
        assert_eq!(p.advanced(5), LoaderPosition { epoch: 2, batch: 4 });
        assert_eq!(p.advanced(4), LoaderPosition { epoch: 3, batch: 0 });
        assert_eq!(p.after(0, 4), p);
        assert_eq!(p.after(9, 4), LoaderPosition { epoch: 5, batch: 0 });
        assert_eq!(
            LoaderPosition::default().after(u64::MAX, 1),
            LoaderPosition {
                epoch: u64::MAX,
                batch: 0
            }
        );
        let mut q = LoaderPosition::default();
        for _ in 0..7 {
            q = q.advanced(3);
        }
        assert_eq!(q, LoaderPosition::default().after(7, 3));
        assert!(LoaderPosition { epoch: 1, batch: 0 } > LoaderPosition { epoch: 0, batch: 9 });
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, r#"{"epoch":2,"batch":3}"#);
        assert_eq!(serde_json::from_str::<LoaderPosition>(&json).unwrap(), p);
    }
}
