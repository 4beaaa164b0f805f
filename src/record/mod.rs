//! Records and traces: what a rank observed, tensor by tensor.
//!
//! A [`Recorder`] belongs to one rank. Each call to [`Recorder::record`] turns a tensor into a
//! [`Record`] at (rank, step, seq, name): dtype, shape, the md5 of its canonical bytes and its
//! [`Stats`]. [`Recorder::record_view`] does the same for a [`TensorView`] (a buffer held
//! elsewhere, e.g. numpy's), reading its bytes in place. `seq` counts the records of one step on
//! one rank, from 0, in call order. A finished recorder is a [`RankTrace`]; the traces of all
//! ranks of a run form a [`Trace`].
//!
//! Speed: md5 is a chain (one buffer runs at one core's ~0.5 GB/s), so the recorder copies each
//! tensor's canonical bytes (memcpy speed) and digests the records in batches, the 4 KiB chunks of
//! many buffers at once in SIMD lanes ([`crate::value::tree_digest_of_many`]): when `BATCH_RECORDS` (64) records or
//! `BATCH_BYTES` (16 MiB) wait, and when the recorder finishes. A tensor of `BATCH_BYTES` or more
//! is digested in place at once (no copy; alone in its lane it would gain nothing). Stats are
//! computed when a tensor is recorded, from its own bytes, which the program has usually just
//! written (in the cache), not later from the copy.
//!
//! Determinism: a record is a pure function of the tensor and of the call order on its rank; no
//! clock, address or thread identity is stored. Two runs that record the same tensors in the same
//! order give equal traces. Batching changes when a digest is computed, never its value (the md5
//! of the bytes as they were when recorded) nor the records' order: the tap sees them in call
//! order, at the batch's end.
//!
//! Limits: traces live in memory; the trace files of `crate::file` are written through a tap
//! that sees each record with a view of its tensor as it is recorded. [`first_overflow`] finds the first
//! NaN, infinity or fp16 saturation of a trace. An [`Environment`] is the snapshot of what could
//! change a run's bits (variables, versions, host, CPU kernel) that a trace file carries.

pub mod environment;
pub mod hints;
pub(crate) mod overflow;

pub use environment::Environment;
pub use overflow::{first_overflow, Overflow, OverflowKind, FP16_MAX};

use crate::value::digest::{Md5Digest, Stats};
use crate::value::md5tree::{tree_digest_of_many, DigestKind};
use crate::value::position::Shard;
use crate::value::tensor::{DType, Tensor, TensorView};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How much a [`Recorder`] computes per tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordLevel {
    /// Record nothing (to measure what recording costs).
    Off,
    /// The md5 only; stats are left empty.
    Digest,
    /// The md5 and the stats.
    #[default]
    Stats,
}

/// One observed tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The rank that recorded it.
    pub rank: u32,
    /// The step it was recorded in.
    pub step: u64,
    /// Its position among the records of this step on this rank, from 0.
    pub seq: u32,
    /// The name the program gave it, e.g. `grad/fc1.weight`.
    pub name: String,
    /// `true` when every rank must hold identical bits for it (data-parallel replicas).
    pub replicated: bool,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// The digest of the canonical bytes: the tree digest (`value/md5tree.rs`; plain md5 up to
    /// 4 KiB), or plain md5 in a trace of format version 1 or 2 (its [`RankTrace::digest`]).
    pub md5: Md5Digest,
    /// Summary statistics (empty at [`RecordLevel::Digest`]).
    pub stats: Stats,
    /// For a shard of a larger tensor (a DTensor's local shard, FSDP's flat parameter): where it
    /// lies and the position digest of its elements (`value/position.rs`); `None` for a whole
    /// tensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
}

impl Record {
    /// The record of `view` at (rank, step, seq): its md5, and its stats when `with_stats`
    /// (empty otherwise).
    #[must_use]
    pub(crate) fn of_view(
        (rank, step, seq): (u32, u64, u32),
        name: &str,
        replicated: bool,
        view: TensorView<'_>,
        with_stats: bool,
    ) -> Record {
        Record {
            rank,
            step,
            seq,
            name: name.to_owned(),
            replicated,
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            md5: Md5Digest::of_view(view),
            stats: if with_stats {
                Stats::of_view(view)
            } else {
                Stats::default()
            },
            shard: None,
        }
    }

    /// `true` when dtype, shape and digest agree: the two tensors had the same bits.
    #[must_use]
    pub fn same_bits(&self, other: &Record) -> bool {
        self.md5 == other.md5 && self.dtype == other.dtype && self.shape == other.shape
    }
}

/// The callback of a [`RecordTap`].
pub(crate) type TapFn = dyn FnMut(&Record, TensorView<'_>) + Send;

/// Sees every record with a view of its tensor as it is recorded (the dump writer uses it).
pub(crate) struct RecordTap(pub(crate) Box<TapFn>);

impl std::fmt::Debug for RecordTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordTap")
    }
}

/// A batch is digested once this many records wait (two rounds of 16 lanes, and more to refill
/// the lanes that finish first).
pub(crate) const BATCH_RECORDS: usize = 64;

/// A batch is digested once this many bytes wait; a tensor this large is digested in place.
pub(crate) const BATCH_BYTES: usize = 16 << 20;

/// The bytes a waiting record is digested from.
#[derive(Debug)]
enum PendingBytes {
    /// A copy: the caller keeps (and may change) its tensor.
    Copy(Vec<u8>),
    /// The tensor itself, given to the recorder ([`Recorder::record_owned`]): no copy.
    Owned(Tensor),
}

/// A record whose md5 waits for its batch: where it goes, its stats (computed when it was
/// recorded, while its bytes were in the cache) and its bytes.
#[derive(Debug)]
struct Pending {
    step: u64,
    seq: u32,
    name: String,
    replicated: bool,
    dtype: DType,
    shape: Vec<usize>,
    stats: Stats,
    bytes: PendingBytes,
}

impl Pending {
    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            PendingBytes::Copy(copy) => copy,
            PendingBytes::Owned(tensor) => tensor
                .view_in_place()
                .expect("only a little-endian machine keeps a tensor's own bytes")
                .bytes(),
        }
    }

    fn view(&self) -> TensorView<'_> {
        TensorView::new(self.dtype, &self.shape, self.bytes())
            .expect("the bytes are of a view of this dtype and shape")
    }
}

/// Turns tensors into records for one rank.
#[derive(Debug)]
pub struct Recorder {
    rank: u32,
    level: RecordLevel,
    next_seq: BTreeMap<u64, u32>,
    records: Vec<Record>,
    /// Records in call order whose digests wait for the batch (after every record of `records`).
    pending: Vec<Pending>,
    pending_bytes: usize,
    /// The buffers of digested batches, reused for the next copies (fresh pages would fault in
    /// every batch: a third of the md5's time for 1 MiB tensors).
    spare: Vec<Vec<u8>>,
    tap: Option<RecordTap>,
}

impl Recorder {
    /// A recorder for `rank` at `level`.
    #[must_use]
    pub fn new(rank: u32, level: RecordLevel) -> Self {
        Recorder {
            rank,
            level,
            next_seq: BTreeMap::new(),
            records: Vec::new(),
            pending: Vec::new(),
            pending_bytes: 0,
            spare: Vec::new(),
            tap: None,
        }
    }

    /// Calls `tap` with every record and a view of its tensor from now on.
    pub(crate) fn set_tap(&mut self, tap: RecordTap) {
        self.tap = Some(tap);
    }

    /// Records `tensor` as `name` at `step`.
    pub fn record(&mut self, step: u64, name: &str, tensor: &Tensor) {
        if self.level != RecordLevel::Off {
            tensor.with_view(|view| self.push(step, name, view, false));
        }
    }

    /// Records a tensor that every rank must hold with identical bits (checked by `replicas`).
    pub fn record_replicated(&mut self, step: u64, name: &str, tensor: &Tensor) {
        if self.level != RecordLevel::Off {
            tensor.with_view(|view| self.push(step, name, view, true));
        }
    }

    /// Records a view as `name` at `step`, reading its bytes in place: the same record as
    /// [`Recorder::record`] gives for a tensor of the same dtype, shape and values.
    pub fn record_view(&mut self, step: u64, name: &str, view: TensorView<'_>) {
        self.push(step, name, view, false);
    }

    /// Records a view that every rank must hold with identical bits (checked by `replicas`).
    pub fn record_replicated_view(&mut self, step: u64, name: &str, view: TensorView<'_>) {
        self.push(step, name, view, true);
    }

    /// Records `tensor`, which the caller gives away, as `name` at `step`: the same record as
    /// [`Recorder::record`] gives, without copying its bytes (the tensor waits in the batch).
    pub fn record_owned(&mut self, step: u64, name: &str, tensor: Tensor) {
        self.push_owned(step, name, tensor, false);
    }

    /// [`Recorder::record_replicated`] of a tensor the caller gives away (no copy).
    pub fn record_replicated_owned(&mut self, step: u64, name: &str, tensor: Tensor) {
        self.push_owned(step, name, tensor, true);
    }

    /// `false` at [`RecordLevel::Off`]: a program may skip building what it would record.
    #[must_use]
    pub fn is_recording(&self) -> bool {
        self.level != RecordLevel::Off
    }

    fn push(&mut self, step: u64, name: &str, view: TensorView<'_>, replicated: bool) {
        if self.level == RecordLevel::Off {
            return;
        }
        if view.bytes().len() >= BATCH_BYTES {
            self.digest_pending();
            let at = (self.rank, step, self.next_seq(step));
            let with_stats = self.level == RecordLevel::Stats;
            let record = Record::of_view(at, name, replicated, view, with_stats);
            self.keep(record, view);
            return;
        }
        let stats = self.stats_of(view);
        let bytes = PendingBytes::Copy(self.copy_of(view.bytes()));
        let (dtype, shape) = (view.dtype(), view.shape().to_vec());
        self.wait(step, name, replicated, (dtype, shape, stats), bytes);
    }

    fn push_owned(&mut self, step: u64, name: &str, tensor: Tensor, replicated: bool) {
        if self.level == RecordLevel::Off {
            return;
        }
        match tensor.view_in_place() {
            Some(view) if view.bytes().len() < BATCH_BYTES => {
                let stats = self.stats_of(view);
                let (dtype, shape) = (view.dtype(), view.shape().to_vec());
                let bytes = PendingBytes::Owned(tensor);
                self.wait(step, name, replicated, (dtype, shape, stats), bytes);
            }
            _ => tensor.with_view(|view| self.push(step, name, view, replicated)),
        }
    }

    /// This record's `seq`: the next of `step`.
    fn next_seq(&mut self, step: u64) -> u32 {
        let seq = self.next_seq.entry(step).or_insert(0);
        *seq += 1;
        *seq - 1
    }

    /// Adds a record to the batch; digests the batch when it is full.
    fn wait(
        &mut self,
        step: u64,
        name: &str,
        replicated: bool,
        (dtype, shape, stats): (DType, Vec<usize>, Stats),
        bytes: PendingBytes,
    ) {
        let seq = self.next_seq(step);
        let pending = Pending {
            step,
            seq,
            name: name.to_owned(),
            replicated,
            dtype,
            shape,
            stats,
            bytes,
        };
        self.pending_bytes += pending.bytes().len();
        self.pending.push(pending);
        if self.pending.len() >= BATCH_RECORDS || self.pending_bytes >= BATCH_BYTES {
            self.digest_pending();
        }
    }

    /// The stats of `view` at this recorder's level (empty below [`RecordLevel::Stats`]).
    fn stats_of(&self, view: TensorView<'_>) -> Stats {
        if self.level == RecordLevel::Stats {
            Stats::of_view(view)
        } else {
            Stats::default()
        }
    }

    /// A copy of `bytes` in the smallest spare buffer that holds it (or a new one).
    fn copy_of(&mut self, bytes: &[u8]) -> Vec<u8> {
        let fit = (0..self.spare.len())
            .filter(|&i| self.spare[i].capacity() >= bytes.len())
            .min_by_key(|&i| self.spare[i].capacity());
        let mut copy = match fit {
            Some(i) => self.spare.swap_remove(i),
            None => Vec::with_capacity(bytes.len()),
        };
        copy.clear();
        copy.extend_from_slice(bytes);
        copy
    }

    /// Hands `record` to the tap and keeps it.
    fn keep(&mut self, record: Record, view: TensorView<'_>) {
        if let Some(tap) = &mut self.tap {
            (tap.0)(&record, view);
        }
        self.records.push(record);
    }

    /// Digests the waiting records together (md5s in SIMD lanes) and keeps them in call order.
    fn digest_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let buffers: Vec<&[u8]> = pending.iter().map(Pending::bytes).collect();
        let md5s = tree_digest_of_many(&buffers);
        for (p, md5) in pending.iter().zip(md5s) {
            let view = p.view();
            let record = Record {
                rank: self.rank,
                step: p.step,
                seq: p.seq,
                name: p.name.clone(),
                replicated: p.replicated,
                dtype: p.dtype,
                shape: p.shape.clone(),
                md5,
                stats: p.stats,
                shard: None,
            };
            self.keep(record, view);
        }
        // At most a batch's bytes are kept (one batch's buffers).
        self.spare = pending
            .into_iter()
            .filter_map(|p| match p.bytes {
                PendingBytes::Copy(copy) => Some(copy),
                PendingBytes::Owned(_) => None,
            })
            .collect();
    }

    /// The number of records so far.
    #[must_use]
    pub fn num_records(&self) -> usize {
        self.records.len() + self.pending.len()
    }

    /// Finishes recording: the records sorted by (step, seq).
    #[must_use]
    pub fn finish(mut self) -> RankTrace {
        self.digest_pending();
        // Stable sort: records of one step keep their call order, which is their seq order.
        self.records.sort_by_key(|r| (r.step, r.seq));
        RankTrace {
            rank: self.rank,
            records: self.records,
            environment: None,
            digest: DigestKind::CURRENT,
        }
    }
}

/// All records of one rank, sorted by (step, seq).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankTrace {
    /// The rank.
    pub rank: u32,
    /// Its records, sorted by (step, seq).
    pub records: Vec<Record>,
    /// The environment snapshot of the trace file it was read from (`None` for a rank recorded
    /// in this process, or a file of format version 1).
    #[serde(default)]
    pub environment: Option<Environment>,
    /// The digest its records carry: this build's, or plain md5 for a trace file of format
    /// version 1 or 2.
    #[serde(default)]
    pub digest: DigestKind,
}

/// All records of one run: one [`RankTrace`] per rank, in rank order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// One trace per rank, rank 0 first.
    pub ranks: Vec<RankTrace>,
}

impl Trace {
    /// The number of ranks.
    #[must_use]
    pub fn world_size(&self) -> usize {
        self.ranks.len()
    }

    /// The number of records over all ranks.
    #[must_use]
    pub fn num_records(&self) -> usize {
        self.ranks.iter().map(|r| r.records.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_counts_per_step_in_call_order() {
        let mut rec = Recorder::new(2, RecordLevel::Stats);
        let t = Tensor::from_vec(vec![1.0f32]);
        rec.record(0, "a", &t);
        rec.record(0, "b", &t);
        rec.record(1, "a", &t);
        rec.record_replicated(0, "c", &t);
        let trace = rec.finish();
        let keys: Vec<_> = trace
            .records
            .iter()
            .map(|r| (r.step, r.seq, r.name.as_str(), r.replicated))
            .collect();
        assert_eq!(
            keys,
            [
                (0, 0, "a", false),
                (0, 1, "b", false),
                (0, 2, "c", true),
                (1, 0, "a", false)
            ]
        );
        assert!(trace.records.iter().all(|r| r.rank == 2));
    }

    #[test]
    fn levels_control_what_is_computed() {
        let t = Tensor::from_vec(vec![1.0f64, 2.0]);
        let mut off = Recorder::new(0, RecordLevel::Off);
        off.record(0, "x", &t);
        assert_eq!(off.num_records(), 0);
        let mut digest = Recorder::new(0, RecordLevel::Digest);
        digest.record(0, "x", &t);
        let mut stats = Recorder::new(0, RecordLevel::Stats);
        stats.record(0, "x", &t);
        let (d, s) = (&digest.finish().records[0], &stats.finish().records[0]);
        assert!(d.same_bits(s));
        assert_eq!(d.stats, Stats::default());
        assert_ne!(s.stats, Stats::default());
    }

    #[test]
    fn a_view_records_as_its_tensor_does() {
        let tensors = [
            Tensor::new(
                vec![2, 2],
                crate::value::TensorData::F32(vec![1.0, -0.0, 7.5, 2.0]),
            )
            .unwrap(),
            Tensor::from_vec(vec![half::f16::from_f32(0.5), half::f16::NAN]),
            Tensor::from_vec(vec![half::bf16::from_f32(-3.0)]),
            Tensor::from_vec(vec![-5i32, 9]),
            Tensor::from_vec(vec![true, false, true]),
        ];
        let mut by_tensor = Recorder::new(1, RecordLevel::Stats);
        let mut by_view = Recorder::new(1, RecordLevel::Stats);
        for (i, t) in tensors.iter().enumerate() {
            let mut bytes = Vec::new();
            t.for_each_canonical_chunk(|c| bytes.extend_from_slice(c));
            let view = TensorView::new(t.dtype(), t.shape(), &bytes).unwrap();
            by_tensor.record(0, &format!("t{i}"), t);
            by_view.record_view(0, &format!("t{i}"), view);
            by_tensor.record_replicated(1, "r", t);
            by_view.record_replicated_view(1, "r", view);
        }
        let (a, b) = (by_tensor.finish(), by_view.finish());
        assert_eq!(a, b);
        assert_eq!(a.records[4].dtype, DType::Bool);
        assert!(a
            .records
            .iter()
            .filter(|r| r.step == 1)
            .all(|r| r.replicated));
    }

    /// Records digested in batches (across batch boundaries, with a tensor large enough to be
    /// digested in place between them) are the records of each tensor digested alone, in call
    /// order, and the tap sees each with its own bytes; changing a buffer after `record_view`
    /// returns does not change its record (the batch hashes a copy).
    #[test]
    fn batched_records_are_the_records_of_each_tensor_in_call_order() {
        let large = BATCH_BYTES / 4 + 3;
        let lens: Vec<usize> = (0..3 * BATCH_RECORDS + 5)
            .map(|i| {
                if i == BATCH_RECORDS + 7 {
                    large
                } else {
                    (i * 37) % 700
                }
            })
            .collect();
        let tensors: Vec<Tensor> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| Tensor::from_vec((0..n).map(|k| (k * 31 + i) as f32 * 0.25).collect()))
            .collect();
        let seen: std::sync::Arc<std::sync::Mutex<Vec<(u32, Md5Digest)>>> = Default::default();
        let mut rec = Recorder::new(3, RecordLevel::Stats);
        let tap_seen = std::sync::Arc::clone(&seen);
        rec.set_tap(RecordTap(Box::new(move |record, view| {
            let mut seen = tap_seen.lock().unwrap();
            seen.push((record.seq, Md5Digest::of_view(view)));
        })));
        let mut want = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            let step = (i / 50) as u64;
            let name = format!("t{i}");
            t.with_view(|view| {
                let seq = want.iter().filter(|r: &&Record| r.step == step).count() as u32;
                want.push(Record::of_view(
                    (3, step, seq),
                    &name,
                    i % 2 == 0,
                    view,
                    true,
                ));
            });
            let mut bytes = Vec::new();
            t.for_each_canonical_chunk(|c| bytes.extend_from_slice(c));
            let view = TensorView::new(t.dtype(), t.shape(), &bytes).unwrap();
            if i % 2 == 0 {
                rec.record_replicated_view(step, &name, view);
            } else {
                rec.record_view(step, &name, view);
            }
            bytes.iter_mut().for_each(|b| *b ^= 0xff);
        }
        assert_eq!(rec.num_records(), tensors.len());
        let trace = rec.finish();
        assert_eq!(trace.records, want);
        let seen = seen.lock().unwrap();
        let want_seen: Vec<(u32, Md5Digest)> = want.iter().map(|r| (r.seq, r.md5)).collect();
        assert_eq!(*seen, want_seen);
    }

    /// A tensor given away records as the same tensor lent: small ones wait in the batch
    /// uncopied, one of `BATCH_BYTES` is digested at once, and the order and seqs are kept when
    /// both kinds are mixed; at `Off` nothing is recorded.
    #[test]
    fn a_tensor_given_away_records_as_a_lent_one() {
        let tensors: Vec<Tensor> = vec![
            Tensor::from_vec((0..700).map(|i| i as f32 * 0.5 - 3.0).collect()),
            Tensor::from_vec(vec![half::bf16::from_f32(-3.0), half::bf16::NAN]),
            Tensor::from_vec(vec![7i64, -9, 11]),
            Tensor::from_vec(vec![0.25f64; BATCH_BYTES / 8]),
            Tensor::from_vec(vec![true, false]),
        ];
        let mut lent = Recorder::new(1, RecordLevel::Stats);
        let mut given = Recorder::new(1, RecordLevel::Stats);
        let mut off = Recorder::new(1, RecordLevel::Off);
        assert!(given.is_recording() && !off.is_recording());
        for round in 0..3u64 {
            for (i, t) in tensors.iter().enumerate() {
                // The batch-sized tensor once: it fills a batch alone (and is slow unoptimised).
                if i == 3 && round > 0 {
                    continue;
                }
                let name = format!("t{i}");
                lent.record(round, &name, t);
                lent.record_replicated(round, "r", t);
                // Every other record of `given` lent, so both kinds share batches.
                if i % 2 == 0 {
                    given.record_owned(round, &name, t.clone());
                } else {
                    given.record(round, &name, t);
                }
                given.record_replicated_owned(round, "r", t.clone());
                off.record_owned(round, &name, t.clone());
            }
        }
        assert_eq!(off.num_records(), 0);
        assert_eq!(given.num_records(), lent.num_records());
        assert_eq!(given.finish(), lent.finish());
    }

    #[test]
    fn records_round_trip_through_json() {
        let mut rec = Recorder::new(0, RecordLevel::Stats);
        rec.record(3, "x", &Tensor::from_vec(vec![f32::NAN, -0.0, 7.5]));
        let trace = rec.finish();
        let json = serde_json::to_string(&trace).unwrap();
        let back: RankTrace = serde_json::from_str(&json).unwrap();
        assert_eq!(back, trace);
    }
}
