//! Comparing traces and finding the first divergence.
//!
//! [`compare_runs`] compares two runs of one scenario record by record: the records of a rank are
//! paired by (step, seq). [`compare_replicas`] compares, within one run, every rank's replicated
//! records with rank 0's: the k-th replicated record of a step on each rank is paired. Both return a
//! [`Comparison`]: how many pairs were compared, how many differ, and the first [`Divergence`] in
//! the order (step, seq, rank), overall and per rank.
//!
//! Guarantee: bitwise. Two records match when dtype, shape and md5 are equal, and the names agree.
//! Statistics are carried along to show the size of a difference, never to decide one.
//!
//! Determinism: a comparison is a pure function of its traces.

use crate::record::{Record, Trace};
use serde::{Deserialize, Serialize};
use std::fmt;

/// How two paired records differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceKind {
    /// Same name, dtype and shape; different bits.
    Digest,
    /// Same name; different dtype or shape.
    Layout,
    /// The two records at this position have different names: the runs recorded different things.
    Name,
    /// Only the left side has a record here.
    MissingRight,
    /// Only the right side has a record here.
    MissingLeft,
}

/// A place where two traces differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// Step of the differing record.
    pub step: u64,
    /// Its seq within the step.
    pub seq: u32,
    /// The rank whose record differs (for replicas: the rank that disagrees with rank 0).
    pub rank: u32,
    /// How they differ.
    pub kind: DivergenceKind,
    /// The left record (first run, or rank 0 for replicas), if there is one.
    pub left: Option<Record>,
    /// The right record (second run, or the disagreeing rank), if there is one.
    pub right: Option<Record>,
}

impl Divergence {
    fn between(left: Option<&Record>, right: Option<&Record>, rank: u32) -> Option<Self> {
        let kind = match (left, right) {
            (Some(l), Some(r)) if l.name != r.name => DivergenceKind::Name,
            (Some(l), Some(r)) if l.dtype != r.dtype || l.shape != r.shape => {
                DivergenceKind::Layout
            }
            (Some(l), Some(r)) if l.md5 != r.md5 => DivergenceKind::Digest,
            (Some(_), Some(_)) | (None, None) => return None,
            (Some(_), None) => DivergenceKind::MissingRight,
            (None, Some(_)) => DivergenceKind::MissingLeft,
        };
        let at = left.or(right)?;
        Some(Divergence {
            step: at.step,
            seq: at.seq,
            rank,
            kind,
            left: left.cloned(),
            right: right.cloned(),
        })
    }

    /// The sort key of "first": earliest step, then seq, then lowest rank.
    fn order_key(&self) -> (u64, u32, u32) {
        (self.step, self.seq, self.rank)
    }

    /// The name of the tensor where the divergence is.
    #[must_use]
    pub fn name(&self) -> &str {
        self.left
            .as_ref()
            .or(self.right.as_ref())
            .map_or("", |r| r.name.as_str())
    }
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {} rank {} seq {} `{}`",
            self.step,
            self.rank,
            self.seq,
            self.name()
        )?;
        match self.kind {
            DivergenceKind::Digest => f.write_str(": md5 differs"),
            DivergenceKind::Layout => f.write_str(": dtype or shape differs"),
            DivergenceKind::Name => write!(
                f,
                ": the other side recorded `{}` here",
                self.right.as_ref().map_or("", |r| r.name.as_str())
            ),
            DivergenceKind::MissingRight => f.write_str(": missing on the right"),
            DivergenceKind::MissingLeft => f.write_str(": missing on the left"),
        }
    }
}

/// The result of comparing traces: data, not an error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[must_use]
pub struct Comparison {
    /// Number of record pairs compared (including pairs with a missing side).
    pub num_compared: u64,
    /// Number of pairs that differ.
    pub num_differing: u64,
    /// The first divergence over all ranks.
    pub first: Option<Divergence>,
    /// The first divergence of each rank (index = rank).
    pub first_per_rank: Vec<Option<Divergence>>,
}

impl Comparison {
    /// `true` when nothing differs.
    #[must_use]
    pub fn is_identical(&self) -> bool {
        self.num_differing == 0
    }

    fn add(&mut self, rank: usize, divergence: Option<Divergence>) {
        self.num_compared += 1;
        let Some(d) = divergence else { return };
        self.num_differing += 1;
        let slot = &mut self.first_per_rank[rank];
        if slot.as_ref().is_none_or(|s| d.order_key() < s.order_key()) {
            *slot = Some(d);
        }
    }

    fn finish(mut self) -> Self {
        self.first = self
            .first_per_rank
            .iter()
            .flatten()
            .min_by_key(|d| d.order_key())
            .cloned();
        self
    }
}

/// Why two traces cannot be compared at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompareError {
    /// The traces have different numbers of ranks.
    #[error("the traces have different world sizes: {left} ranks and {right} ranks")]
    WorldSize {
        /// Ranks on the left.
        left: usize,
        /// Ranks on the right.
        right: usize,
    },
}

/// Compares two runs rank by rank, pairing records by (step, seq).
///
/// # Errors
/// [`CompareError::WorldSize`] when the runs have different numbers of ranks.
pub fn compare_runs(left: &Trace, right: &Trace) -> Result<Comparison, CompareError> {
    if left.world_size() != right.world_size() {
        return Err(CompareError::WorldSize {
            left: left.world_size(),
            right: right.world_size(),
        });
    }
    let mut out = Comparison {
        first_per_rank: vec![None; left.world_size()],
        ..Comparison::default()
    };
    for (rank, (l, r)) in left.ranks.iter().zip(&right.ranks).enumerate() {
        let (mut i, mut j) = (0, 0);
        while i < l.records.len() || j < r.records.len() {
            let key = |rec: &Record| (rec.step, rec.seq);
            let (a, b) = (l.records.get(i), r.records.get(j));
            let (a, b) = match (a, b) {
                (Some(x), Some(y)) if key(x) < key(y) => (Some(x), None),
                (Some(x), Some(y)) if key(x) > key(y) => (None, Some(y)),
                pair => pair,
            };
            i += usize::from(a.is_some());
            j += usize::from(b.is_some());
            out.add(rank, Divergence::between(a, b, rank as u32));
        }
    }
    Ok(out.finish())
}

/// Compares every rank's replicated records with rank 0's, step by step.
///
/// Within a step, the k-th replicated record of a rank is paired with rank 0's k-th.
pub fn compare_replicas(trace: &Trace) -> Comparison {
    let mut out = Comparison {
        first_per_rank: vec![None; trace.world_size()],
        ..Comparison::default()
    };
    let Some(reference) = trace.ranks.first() else {
        return out;
    };
    for (rank, other) in trace.ranks.iter().enumerate().skip(1) {
        compare_replicated(&mut out, rank, &reference.records, &other.records);
    }
    out.finish()
}

/// Compares rank 0's replicated records (loss, gradients, parameters) of two runs of one scenario
/// at different world sizes: the k-th replicated record of a step on each side is paired. Ranks'
/// own records (local gradients) are left out: their shards differ by design. The divergence's
/// `rank` is 0.
pub fn compare_world_sizes(left: &Trace, right: &Trace) -> Comparison {
    let mut out = Comparison {
        first_per_rank: vec![None],
        ..Comparison::default()
    };
    if let (Some(l), Some(r)) = (left.ranks.first(), right.ranks.first()) {
        compare_replicated(&mut out, 0, &l.records, &r.records);
    }
    out.finish()
}

/// Pairs the replicated records of `reference` and `other` by (step, k-th replicated record of
/// the step) and adds each pair to `out` under `rank`.
fn compare_replicated(out: &mut Comparison, rank: usize, reference: &[Record], other: &[Record]) {
    let replicated = |records: &'_ [Record]| -> Vec<(u64, usize, usize)> {
        // (step, k-th replicated record in the step, index into records)
        let mut keyed = Vec::new();
        let mut last_step = None;
        let mut k = 0;
        for (index, rec) in records.iter().enumerate().filter(|(_, r)| r.replicated) {
            if last_step != Some(rec.step) {
                last_step = Some(rec.step);
                k = 0;
            }
            keyed.push((rec.step, k, index));
            k += 1;
        }
        keyed
    };
    let (reference_keys, other_keys) = (replicated(reference), replicated(other));
    let (mut i, mut j) = (0, 0);
    while i < reference_keys.len() || j < other_keys.len() {
        let (a, b) = (reference_keys.get(i), other_keys.get(j));
        let (a, b) = match (a, b) {
            (Some(x), Some(y)) if (x.0, x.1) < (y.0, y.1) => (Some(x), None),
            (Some(x), Some(y)) if (x.0, x.1) > (y.0, y.1) => (None, Some(y)),
            pair => pair,
        };
        i += usize::from(a.is_some());
        j += usize::from(b.is_some());
        let left = a.map(|k| &reference[k.2]);
        let right = b.map(|k| &other[k.2]);
        let mut divergence = Divergence::between(left, right, rank as u32);
        if let (Some(d), Some(r)) = (divergence.as_mut(), right) {
            // Report the disagreeing side's own position.
            d.seq = r.seq;
        }
        out.add(rank, divergence);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::tensor::Tensor;
    use crate::record::{RecordLevel, Recorder};

    /// Builds a trace from (rank, step, name, value, replicated) rows.
    fn trace(rows: &[(u32, u64, &str, f32, bool)], world: u32) -> Trace {
        let mut recorders: Vec<_> = (0..world)
            .map(|r| Recorder::new(r, RecordLevel::Stats))
            .collect();
        for &(rank, step, name, value, replicated) in rows {
            let t = Tensor::from_vec(vec![value]);
            let rec = &mut recorders[rank as usize];
            if replicated {
                rec.record_replicated(step, name, &t);
            } else {
                rec.record(step, name, &t);
            }
        }
        Trace {
            ranks: recorders.into_iter().map(Recorder::finish).collect(),
        }
    }

    #[test]
    fn identical_runs_have_no_divergence() {
        let rows = [(0, 0, "a", 1.0, false), (1, 0, "a", 2.0, false)];
        let cmp = compare_runs(&trace(&rows, 2), &trace(&rows, 2)).unwrap();
        assert!(cmp.is_identical());
        assert_eq!(cmp.num_compared, 2);
        assert_eq!(cmp.first, None);
    }

    #[test]
    fn first_divergence_is_earliest_step_then_seq_then_rank() {
        let left = trace(
            &[
                (0, 0, "a", 1.0, false),
                (0, 0, "b", 1.0, false),
                (0, 1, "a", 1.0, false),
                (1, 0, "a", 1.0, false),
                (1, 0, "b", 1.0, false),
                (2, 0, "a", 1.0, false),
                (2, 0, "b", 1.0, false),
            ],
            3,
        );
        let right = trace(
            &[
                (0, 0, "a", 1.0, false),
                (0, 0, "b", 1.0, false),
                (0, 1, "a", 9.0, false), // later step on rank 0
                (1, 0, "a", 1.0, false),
                (1, 0, "b", 9.0, false), // step 0 seq 1 on rank 1
                (2, 0, "a", 1.0, false),
                (2, 0, "b", 9.0, false), // same position, higher rank
            ],
            3,
        );
        let cmp = compare_runs(&left, &right).unwrap();
        let first = cmp.first.clone().unwrap();
        assert_eq!((first.step, first.seq, first.rank), (0, 1, 1));
        assert_eq!(first.kind, DivergenceKind::Digest);
        assert_eq!(first.name(), "b");
        assert_eq!(cmp.num_differing, 3);
        assert_eq!(cmp.first_per_rank[0].as_ref().unwrap().step, 1);
        assert_eq!(first.to_string(), "step 0 rank 1 seq 1 `b`: md5 differs");
    }

    #[test]
    fn missing_and_renamed_records_are_divergences() {
        let left = trace(&[(0, 0, "a", 1.0, false), (0, 1, "a", 1.0, false)], 1);
        let right = trace(&[(0, 0, "z", 1.0, false)], 1);
        let cmp = compare_runs(&left, &right).unwrap();
        assert_eq!(cmp.num_compared, 2);
        assert_eq!(cmp.first.as_ref().unwrap().kind, DivergenceKind::Name);
        assert_eq!(
            cmp.first_per_rank[0].as_ref().unwrap().kind,
            DivergenceKind::Name
        );
        let cmp = compare_runs(&right, &left).unwrap();
        assert_eq!(cmp.num_differing, 2);
        let err = compare_runs(&left, &trace(&[], 2)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the traces have different world sizes: 1 ranks and 2 ranks"
        );
    }

    #[test]
    fn replicas_are_compared_with_rank_zero() {
        let ok = trace(
            &[
                (0, 0, "local", 1.0, false),
                (0, 0, "w", 5.0, true),
                (1, 0, "local", 2.0, false),
                (1, 0, "w", 5.0, true),
            ],
            2,
        );
        let cmp = compare_replicas(&ok);
        assert!(cmp.is_identical());
        assert_eq!(cmp.num_compared, 1);

        let bad = trace(
            &[
                (0, 0, "w", 5.0, true),
                (1, 0, "w", 5.0, true),
                (2, 0, "w", 6.0, true),
                (2, 1, "w", 6.0, true),
            ],
            3,
        );
        let cmp = compare_replicas(&bad);
        let first = cmp.first.unwrap();
        assert_eq!(
            (first.step, first.rank, first.kind),
            (0, 2, DivergenceKind::Digest)
        );
        assert_eq!(
            cmp.num_differing, 2,
            "the extra step-1 record is missing on rank 0"
        );
    }
}
