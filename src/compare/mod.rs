//! The comparison engine: the one place where two traces are paired and their differences found,
//! for `detcheck compare` and for every check.
//!
//! A *side* is a set of ranks whose records can be read step by step: a dump folder on disk
//! (detcheck's trace files, msprobe's dump folders) or a trace in memory (a check's runs, seen
//! whole or through a `TraceView`). [`compare_dumps`] compares two folders;
//! `compare_traces` compares two in-memory runs for a check, and gives the check its verdict
//! and its divergence map from the same pass.
//!
//! Each rank of the two sides is read step by step, in lockstep; memory holds one step of one rank
//! of each side, plus the rows kept for the report. Within a step, records are matched by (name,
//! occurrence): the k-th record named `x` on one side with the k-th named `x` on the other, so an
//! extra or missing record shifts nothing after it. Two matched records differ when their dtype or
//! shape differ, or their digests differ (md5, or msprobe's checksum); when neither side holds a
//! digest, when their statistics differ. With full tensors on both sides, each differing row also
//! gets numeric metrics (max absolute and relative error, cosine similarity, shares within 1e-3
//! and 5e-3 relative error).
//!
//! Guarantee: bitwise, as the digests; the metrics only describe a difference. The result is a pure
//! function of the two dumps: the first divergence is the earliest step, then record (seq), then
//! rank, and rows are kept in that order.
//!
//! The environment snapshots of the two sides (trace files of format version 2, and the traces a
//! `command` scenario's program wrote) are compared rank by rank: [`Comparison::environment`]
//! lists the keys whose values differ, which a report prints before the first divergence. They
//! describe the runs and are never divergences: a comparison with different snapshots and equal
//! records is identical. Ranks recorded in this process (thread ranks) hold no snapshot, and
//! neither do msprobe dumps and version 1 files (a note says so).
//!
//! Invariant (comparison is a pure function of traces): the first divergence is ordered by (step,
//! seq, rank). A divergence is data (`Comparison`), not an error; `Err` is for runs and files that
//! fail.
//!
//! Invariant (compare streams): it holds one step of one rank per side, the rows it reports
//! (bounded by `max_rows`) and, with `--map`, one cell per (rank, step); never a whole trace.
//! Records are matched by (rank, step, name, occurrence); the first divergence is (step, seq,
//! rank).
//!
//! Invariant (one engine for every source): trace files, msprobe dumps and in-memory traces are all
//! `RankSource`s, paired by one rule, (rank, step, name, occurrence), and reported with one
//! vocabulary (`Comparison`, `Divergence`, `Difference`). A check's verdict and its divergence map
//! come from the same pass of the engine (`compare_traces`); maps and curves never special-case a
//! format.

pub mod align;
pub(crate) mod cause;
pub mod curves;
mod element;
mod map;
pub(crate) mod operator;
mod shards;
#[cfg(test)]
mod tests;

pub(crate) use cause::FRAMEWORK_KEY;
pub use cause::{Cause, CauseClass};
pub use element::{ElementDetail, NoElementDetail};
pub use map::{DivergenceMap, MapCell};
pub(crate) use operator::{operator_call, window_input_index};
pub use operator::{
    operator_record_name, traced_window, window_record_name, InputSource, OperatorCall,
    OperatorFinding, Port, SampleRows,
};
pub(crate) use shards::{is_sharded, put_together};

use crate::file::format::Entry;
use crate::file::source::{Batch, Layout, RankSource};
use crate::file::{open_dump, Dump, DumpError};
use crate::record::hints::{self, Advice};
use crate::record::overflow::{classify, Overflow};
use crate::record::{Environment, Record, Trace};
use crate::value::digest::Stats;
use crate::value::md5tree::DigestKind;
use crate::value::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;

/// How to compare dumps.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// The most differing records kept for the report (the first ones, in order).
    pub max_rows: usize,
    /// Build the ranks × steps [`DivergenceMap`].
    pub map: bool,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            max_rows: 50,
            map: false,
        }
    }
}

/// How two matched records differ, or which side lacks one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Difference {
    /// Same dtype and shape, different digest.
    Digest,
    /// No digests to compare; the statistics differ.
    Stats,
    /// Different dtype or shape.
    Layout,
    /// Only the left dump (A) has this record.
    OnlyLeft,
    /// Only the right dump (B) has this record.
    OnlyRight,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Difference::Digest => "md5 differs",
            Difference::Stats => "stats differ",
            Difference::Layout => "dtype/shape differ",
            Difference::OnlyLeft => "only in A",
            Difference::OnlyRight => "only in B",
        })
    }
}

/// One side of a differing record, as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordSummary {
    /// dtype and shape, e.g. `f32[4,8]`.
    pub layout: String,
    /// The digest in hex, if the dump holds one.
    pub digest: Option<String>,
    /// The statistics, if the dump holds them.
    pub stats: Option<Stats>,
}

/// Numeric differences between two full tensors (B is the reference, as msprobe's bench side).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TensorMetrics {
    /// max |a - b|.
    pub max_abs_err: f64,
    /// max |a - b| / |b| (0 where both are 0, Inf where only b is).
    pub max_rel_err: f64,
    /// a·b / (|a| |b|) (1 when both are all zeros).
    pub cosine: f64,
    /// Share of elements with relative error ≤ 1e-3 (msprobe's "One Thousandth Err Ratio").
    pub within_1e3: f64,
    /// Share of elements with relative error ≤ 5e-3 ("Five Thousandths Err Ratio").
    pub within_5e3: f64,
}

impl TensorMetrics {
    /// The metrics of two tensors of the same number of elements, read as `f64` (8-bit floats
    /// decoded exactly; a complex tensor as its real parts, real then imaginary per element, as
    /// `torch.view_as_real` gives them).
    #[must_use]
    pub fn between(a: &Tensor, b: &Tensor) -> Option<Self> {
        let (a, b) = (values_f64(a), values_f64(b));
        if a.len() != b.len() {
            return None;
        }
        let (mut max_abs, mut max_rel, mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0, 0.0, 0.0);
        let (mut in1, mut in5) = (0u64, 0u64);
        for (&x, &y) in a.iter().zip(&b) {
            let same = x == y || (x.is_nan() && y.is_nan());
            let abs = if same { 0.0 } else { (x - y).abs() };
            let abs = if abs.is_nan() { f64::INFINITY } else { abs };
            let rel = if same {
                0.0
            } else if y == 0.0 {
                f64::INFINITY
            } else {
                abs / y.abs()
            };
            max_abs = max_abs.max(abs);
            max_rel = max_rel.max(rel);
            in1 += u64::from(rel <= 1e-3);
            in5 += u64::from(rel <= 5e-3);
            if x.is_finite() && y.is_finite() {
                dot += x * y;
                na += x * x;
                nb += y * y;
            }
        }
        let n = a.len().max(1) as f64;
        let cosine = if na == 0.0 && nb == 0.0 {
            1.0
        } else if na == 0.0 || nb == 0.0 {
            0.0
        } else {
            dot / (na.sqrt() * nb.sqrt())
        };
        Some(TensorMetrics {
            max_abs_err: max_abs,
            max_rel_err: max_rel,
            cosine,
            within_1e3: in1 as f64 / n,
            within_5e3: in5 as f64 / n,
        })
    }
}

/// A tensor's elements as `f64`: 8-bit floats decoded exactly, a complex tensor as its real parts
/// (real then imaginary per element, as `torch.view_as_real` gives them).
pub(crate) fn values_f64(t: &Tensor) -> Vec<f64> {
    match t.data() {
        TensorData::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
        TensorData::F64(v) => v.clone(),
        TensorData::I64(v) => v.iter().map(|&x| x as f64).collect(),
        TensorData::U8(v) => v.iter().map(|&x| f64::from(x)).collect(),
        TensorData::F16(v) => v.iter().map(|&x| f64::from(x)).collect(),
        TensorData::BF16(v) => v.iter().map(|&x| f64::from(x)).collect(),
        TensorData::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
        TensorData::Bool(v) => v.iter().map(|&x| f64::from(u8::from(x))).collect(),
        TensorData::I8(v) => v.iter().map(|&x| f64::from(x)).collect(),
        TensorData::I16(v) => v.iter().map(|&x| f64::from(x)).collect(),
        TensorData::U16(v) => v.iter().map(|&x| f64::from(x)).collect(),
        TensorData::F8E4M3(v) | TensorData::F8E5M2(v) => {
            let dtype = t.dtype();
            v.iter()
                .map(|&b| dtype.f8_to_f64(b).expect("an 8-bit float dtype"))
                .collect()
        }
        TensorData::C64(v) => v.iter().flatten().map(|&x| f64::from(x)).collect(),
        TensorData::C128(v) => v.iter().flatten().copied().collect(),
    }
}

/// Fills `out` with a tensor's elements from flat index `start` on, as `f64` (as
/// [`values_f64`] gives them), and returns how many it wrote: streaming the elements of large
/// tensors without a second copy of them.
pub(crate) fn fill_f64(t: &Tensor, start: usize, out: &mut [f64]) -> usize {
    fn fill<T: Copy>(v: &[T], start: usize, out: &mut [f64], f: impl Fn(T) -> f64) -> usize {
        let src = v.get(start..).unwrap_or(&[]);
        let n = src.len().min(out.len());
        for (o, &x) in out.iter_mut().zip(&src[..n]) {
            *o = f(x);
        }
        n
    }
    match t.data() {
        TensorData::F32(v) => fill(v, start, out, f64::from),
        TensorData::F64(v) => fill(v, start, out, |x| x),
        TensorData::I64(v) => fill(v, start, out, |x| x as f64),
        TensorData::U8(v) => fill(v, start, out, f64::from),
        TensorData::F16(v) => fill(v, start, out, f64::from),
        TensorData::BF16(v) => fill(v, start, out, f64::from),
        TensorData::I32(v) => fill(v, start, out, f64::from),
        TensorData::Bool(v) => fill(v, start, out, |x| f64::from(u8::from(x))),
        TensorData::I8(v) => fill(v, start, out, f64::from),
        TensorData::I16(v) => fill(v, start, out, f64::from),
        TensorData::U16(v) => fill(v, start, out, f64::from),
        TensorData::F8E4M3(v) | TensorData::F8E5M2(v) => {
            let dtype = t.dtype();
            fill(v, start, out, |b| {
                dtype.f8_to_f64(b).expect("an 8-bit float dtype")
            })
        }
        // Complex: real parts, real then imaginary per element.
        TensorData::C64(_) | TensorData::C128(_) => {
            let all = values_f64(t);
            fill(&all, start, out, |x| x)
        }
    }
}

/// Whether records named `name` are evidence of a divergence's cause, not results: generator
/// states (`rng/<generator>`), states right after a seeding call (`seed/<generator>`), the
/// sample indices a data loader fetched (`data/indices`), the indices a dataset was split into
/// (`data/split`: `random_split`'s subsets, in order) and the digest of the values that
/// entered torch at one of the program's lines (`data/outside`), which the Python recorder makes
/// (python/detcheck/_core/evidence.py). The engine compares them but never counts them as
/// divergences: an unseeded generator that the program's results do not depend on is no
/// failure. Their differences are listed in [`Comparison::evidence`].
#[must_use]
pub fn is_evidence(name: &str) -> bool {
    name.starts_with("rng/")
        || name.starts_with("seed/")
        || name == "data/indices"
        || name == SPLIT_RECORD
        || name == OUTSIDE_RECORD
}

/// The record of the indices `random_split` gave each part of a dataset (one record per call,
/// the parts' indices one after another), its line in the `site:` entry.
pub(crate) const SPLIT_RECORD: &str = "data/split";

/// The record of the values that entered torch at one of the program's lines
/// (python/detcheck/_core/evidence.py): a digest of them, its line in the `site:` entry.
pub(crate) const OUTSIDE_RECORD: &str = "data/outside";

/// The most differing evidence records a comparison keeps.
const MAX_EVIDENCE: usize = 256;

/// A record of evidence ([`is_evidence`]) that differs between the sides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceDifference {
    /// Its step.
    pub step: u64,
    /// Its rank.
    pub rank: u32,
    /// Its position in the step.
    pub seq: u32,
    /// Its name (`seed/torch`).
    pub name: String,
    /// How many records of that name came before it in the step (its `site:` key's `k`).
    pub occurrence: u32,
}

/// One differing record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// Its step.
    pub step: u64,
    /// Its rank.
    pub rank: u32,
    /// Its position in the step (on A, or on B when only B has it).
    pub seq: u32,
    /// The tensor's name.
    pub name: String,
    /// How it differs.
    pub difference: Difference,
    /// A's record.
    pub left: Option<RecordSummary>,
    /// B's record.
    pub right: Option<RecordSummary>,
    /// Numeric differences, when both dumps hold the full tensors.
    pub metrics: Option<TensorMetrics>,
    /// The first differing element: from the full tensors when both sides hold them, or (a
    /// check) from a re-run that captured this record; why not, when it could not be named.
    pub element: Option<ElementFinding>,
    /// The first operator whose output differs inside the divergent record's module, and why
    /// (a check's divergence at a record of `detcheck.torch.watch`; `crate::diagnose::operator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<OperatorFinding>,
    /// Why it diverged, in words (a `repeat` check's first divergence: `crate::diagnose::cause`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
}

/// What is known of a divergence's first differing element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ElementFinding {
    /// The element, both values and their distance.
    Found(ElementDetail),
    /// The re-runs did not reproduce the checked runs' values (the divergence changes from
    /// launch to launch: OS entropy, timing), but differed from each other at this record: the
    /// element between the two re-runs.
    FoundInReruns(ElementDetail),
    /// Why no element is named.
    Unavailable(NoElementDetail),
}

impl ElementFinding {
    /// The finding of two tensors whose digests differ (`None` when every bit is equal: then
    /// the digests were of other tensors, and nothing is said).
    #[must_use]
    pub fn between(left: &Tensor, right: &Tensor) -> Option<Self> {
        match ElementDetail::between(left, right) {
            Ok(Some(detail)) => Some(ElementFinding::Found(detail)),
            Ok(None) => None,
            Err(why) => Some(ElementFinding::Unavailable(why)),
        }
    }

    /// One line for reports, with the sides' labels.
    #[must_use]
    pub fn describe(&self, left: &str, right: &str) -> String {
        match self {
            ElementFinding::Found(detail) => detail.describe(left, right),
            ElementFinding::FoundInReruns(detail) => format!(
                "{} (between the two re-runs: they did not reproduce the checked runs' values, \
                 so this divergence changes from launch to launch)",
                detail.describe(&format!("re-run of {left}"), &format!("re-run of {right}"))
            ),
            ElementFinding::Unavailable(why) => format!("not named: {why}"),
        }
    }
}

/// An environment entry whose value differs between the two sides, on the ranks listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvDifference {
    /// The key: a variable (`NCCL_ALGO`) or one of detcheck's (`detcheck.kernel`).
    pub key: String,
    /// Its value on A's side (`None`: not set there).
    pub left: Option<String>,
    /// Its value on B's side.
    pub right: Option<String>,
    /// The ranks where the two sides' snapshots differ this way, ascending.
    pub ranks: Vec<u32>,
    /// What the key does to the bits and how to pin it (`crate::record::hints`), when known
    /// (always serialised, so every difference has the same fields).
    #[serde(default)]
    pub hint: Option<Advice>,
}

impl fmt::Display for EnvDifference {
    /// `NCCL_ALGO: Ring -> Tree (ranks 0..=3)`; an unset side reads `(unset)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| match v {
            None => "(unset)".to_owned(),
            Some(v) if v.chars().any(char::is_control) => format!("{:?}", v),
            Some(v) => v.clone(),
        };
        write!(
            f,
            "{}: {} -> {} ({})",
            self.key,
            show(&self.left),
            show(&self.right),
            describe_ranks(&self.ranks).trim_end_matches(':')
        )
    }
}

impl EnvDifference {
    /// The difference on one line at `indent`, and its hint on the next, indented further
    /// (the style every report prints environment differences in).
    #[must_use]
    pub fn describe(&self, indent: &str) -> String {
        match &self.hint {
            Some(hint) => format!("{indent}{self}\n{indent}  hint: {hint}\n"),
            None => format!("{indent}{self}\n"),
        }
    }
}

impl Divergence {
    /// Which record it is: (step, seq, rank), the order of a comparison's rows.
    pub(crate) fn key(&self) -> (u64, u32, u32) {
        (self.step, self.seq, self.rank)
    }
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {} rank {} seq {} `{}`: {}",
            self.step, self.rank, self.seq, self.name, self.difference
        )
    }
}

/// The result of comparing two dumps: data, not an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[must_use]
pub struct Comparison {
    /// What A is (`detcheck trace, md5 mode`, `msprobe dump at ...`).
    pub left: String,
    /// What B is.
    pub right: String,
    /// The ranks of A and of B.
    pub world_sizes: (u32, u32),
    /// Record pairs compared, including records present on one side only.
    pub num_compared: u64,
    /// Pairs that differ.
    pub num_differing: u64,
    /// The first divergence: earliest step, then seq, then rank.
    pub first: Option<Divergence>,
    /// The first differing records, in order, at most `max_rows`.
    pub rows: Vec<Divergence>,
    /// Explanations of structural differences: world sizes, steps, names, missing statistics
    /// and environment snapshots.
    pub notes: Vec<String>,
    /// The environment entries that differ between the sides, by key (then values), with the
    /// ranks where they do; empty when the snapshots agree or a side has none. Reports print
    /// them first: a changed variable or library often explains the divergence.
    pub environment: Vec<EnvDifference>,
    /// The first overflow (NaN, Inf, fp16 saturation) in A and in B.
    pub overflow: [Option<Overflow>; 2],
    /// The ranks × steps map, when asked for.
    pub map: Option<DivergenceMap>,
    /// The evidence records ([`is_evidence`]) that differ, in (step, seq, rank) order, at most
    /// 256: never divergences, what a divergence's cause is decided from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<EvidenceDifference>,
    /// The program's lines, from A's environment snapshots: (rank, `site:<step>:<name>:<k>`)
    /// -> `file:line` (python/detcheck/_core/evidence.py), its other `site:` facts,
    /// `detcheck.workdir` and `detcheck.files` (kept though both runs agree on them). Never
    /// differences between the sides.
    #[serde(skip)]
    pub sites: BTreeMap<(u32, String), String>,
}

impl Comparison {
    /// Writes a finding into the divergence of the record `at` (its step, seq and rank:
    /// [`Divergence::key`]): the first divergence and its row in the table alike. The one place
    /// a diagnosis (a cause, an element, an operator) is written into a comparison's rows.
    pub(crate) fn annotate(&mut self, at: (u64, u32, u32), write: impl Fn(&mut Divergence)) {
        for row in self.rows.iter_mut().chain(self.first.as_mut()) {
            if row.key() == at {
                write(row);
            }
        }
    }

    /// A comparison of nothing (a check that compared no runs).
    pub(crate) fn empty() -> Self {
        Comparison {
            left: String::new(),
            right: String::new(),
            world_sizes: (0, 0),
            num_compared: 0,
            num_differing: 0,
            first: None,
            rows: Vec::new(),
            notes: Vec::new(),
            environment: Vec::new(),
            overflow: [None, None],
            map: None,
            evidence: Vec::new(),
            sites: BTreeMap::new(),
        }
    }

    /// The line A's rank `rank` gave for its `k`-th record `name` of step `step`.
    #[must_use]
    pub fn site(&self, rank: u32, step: u64, name: &str, k: u32) -> Option<&str> {
        self.sites
            .get(&(rank, format!("site:{step}:{name}:{k}")))
            .map(String::as_str)
    }

    /// A fact A recorded about its run, on its lowest rank that has it: `site:compiled` (the
    /// compiled module), `site:collective` (its process group's backend), `detcheck.workdir`.
    #[must_use]
    pub fn fact(&self, key: &str) -> Option<&str> {
        self.sites
            .iter()
            .find(|((_, k), _)| k == key)
            .map(|(_, value)| value.as_str())
    }

    /// `true` when nothing differs.
    #[must_use]
    pub fn is_identical(&self) -> bool {
        self.num_differing == 0
    }
}

/// A set of ranks that can be compared: a dump on disk or a trace in memory.
pub(crate) trait Side {
    fn world_size(&self) -> u32;
    fn describe(&self) -> String;
    fn has_stats(&self) -> bool;
    fn open_rank(&self, rank: u32) -> Result<Box<dyn RankSource + '_>, DumpError>;
    /// Why this side's ranks hold no environment snapshot, when a note should say so.
    fn no_environment(&self) -> Option<&'static str> {
        None
    }
}

impl Side for Dump {
    fn world_size(&self) -> u32 {
        Dump::world_size(self)
    }
    fn describe(&self) -> String {
        Dump::describe(self)
    }
    fn has_stats(&self) -> bool {
        Dump::has_stats(self)
    }
    fn open_rank(&self, rank: u32) -> Result<Box<dyn RankSource + '_>, DumpError> {
        Dump::open_rank(self, rank)
    }
    fn no_environment(&self) -> Option<&'static str> {
        Dump::no_environment(self)
    }
}

/// Compares two dump folders (detcheck traces or msprobe dumps), streaming.
///
/// # Errors
/// [`DumpError`] when a folder or file cannot be read, or is truncated, corrupt or of another
/// format version. Differences are not errors: they are in the [`Comparison`].
pub fn compare_dumps(
    left: &Path,
    right: &Path,
    options: &CompareOptions,
) -> Result<Comparison, DumpError> {
    let (a, b) = (open_dump(left)?, open_dump(right)?);
    compare_sources(&a, &b, options)
}

/// Which records of an in-memory trace a check compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TraceView {
    /// Every record of every rank, each rank with the same rank of the other run (`repeat`,
    /// `backends`, `workers`, `restart`).
    All,
    /// Within one run, every rank's replicated records against rank 0's; rank 0 itself is the
    /// reference and is not compared (`replicas`).
    Replicas,
    /// Rank 0's replicated records, so runs of different world sizes compare, and the global
    /// tensors of sharded records, put together from every rank's shards (`world_sizes`,
    /// `shards.rs`).
    RankZeroReplicated,
}

/// The most differing records a check's comparison keeps (its failure text shows the first).
const CHECK_ROWS: usize = 8;

/// Compares two in-memory runs as `view` says, with the divergence map: the verdict and the map
/// of a check come from this one pass. For [`TraceView::Replicas`], `right` is the run whose
/// ranks are compared with its own rank 0 (`left` is not read).
pub(crate) fn compare_traces(left: &Trace, right: &Trace, view: TraceView) -> Comparison {
    let options = CompareOptions {
        max_rows: CHECK_ROWS,
        map: true,
    };
    // `replicas` compares ranks of one run: their snapshots differ by host, not by run.
    let with_environment = view != TraceView::Replicas;
    let side = |trace, replicas_of, replicated_only, num_ranks: Option<u32>| MemoryDump {
        trace,
        replicas_of,
        replicated_only,
        num_ranks: num_ranks.unwrap_or(trace.world_size() as u32),
        with_environment,
    };
    let (a, b, first_rank) = match view {
        TraceView::All => (
            side(left, None, false, None),
            side(right, None, false, None),
            0,
        ),
        TraceView::Replicas => (
            side(right, Some(0), true, None),
            side(right, None, true, None),
            1,
        ),
        TraceView::RankZeroReplicated => (
            side(left, None, true, Some(1)),
            side(right, None, true, Some(1)),
            0,
        ),
    };
    let Ok(mut comparison) = compare_ranks(&a, &b, &options, first_rank) else {
        unreachable!("an in-memory side never fails to read")
    };
    if view == TraceView::RankZeroReplicated {
        shards::compare_sharded(left, right, &mut comparison, options.max_rows);
    }
    comparison
}

/// An in-memory trace as a comparison side: every record, or (for the `replicas` check) the
/// replicated records of one rank standing in for every rank.
struct MemoryDump<'t> {
    trace: &'t Trace,
    /// `Some(r)`: every rank reads rank r's records; `None`: each rank its own records.
    replicas_of: Option<u32>,
    /// Only replicated records.
    replicated_only: bool,
    /// The ranks this side shows (the first ones of the trace).
    num_ranks: u32,
    /// Whether its ranks show their environment snapshots.
    with_environment: bool,
}

impl Side for MemoryDump<'_> {
    fn world_size(&self) -> u32 {
        self.num_ranks
    }
    fn describe(&self) -> String {
        "trace in memory".into()
    }
    fn has_stats(&self) -> bool {
        true
    }
    fn open_rank(&self, rank: u32) -> Result<Box<dyn RankSource + '_>, DumpError> {
        let from = self.replicas_of.unwrap_or(rank) as usize;
        let records = self.trace.ranks.get(from).map_or(&[][..], |r| &r.records);
        let environment = self
            .trace
            .ranks
            .get(from)
            .and_then(|r| r.environment.as_ref())
            .filter(|_| self.with_environment);
        let digest = self
            .trace
            .ranks
            .get(from)
            .map_or(DigestKind::CURRENT, |r| r.digest);
        Ok(Box::new(MemoryRank {
            records,
            environment,
            digest,
            replicated_only: self.replicated_only,
            pos: 0,
            names: Vec::new(),
            name_ids: HashMap::new(),
            layouts: Vec::new(),
        }))
    }
}

struct MemoryRank<'t> {
    records: &'t [Record],
    environment: Option<&'t Environment>,
    digest: DigestKind,
    replicated_only: bool,
    pos: usize,
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    layouts: Vec<Layout>,
}

impl RankSource for MemoryRank<'_> {
    fn next_step(&mut self, out: &mut Batch) -> Result<Option<u64>, DumpError> {
        out.clear();
        let Some(step) = self.records.get(self.pos).map(|r| r.step) else {
            return Ok(None);
        };
        while let Some(r) = self.records.get(self.pos).filter(|r| r.step == step) {
            self.pos += 1;
            if self.replicated_only && !r.replicated {
                continue;
            }
            let name = *self.name_ids.entry(r.name.clone()).or_insert_with(|| {
                self.names.push(r.name.clone());
                (self.names.len() - 1) as u32
            });
            let layout = Layout {
                dtype: r.dtype.name().to_owned(),
                shape: r.shape.iter().map(|&d| d as u64).collect(),
            };
            let layout = match self.layouts.iter().position(|l| *l == layout) {
                Some(i) => i as u32,
                None => {
                    self.layouts.push(layout);
                    (self.layouts.len() - 1) as u32
                }
            };
            let entry = Entry {
                step,
                seq: r.seq,
                name,
                layout,
                replicated: r.replicated,
                digest: crate::file::format::Digest::of_kind(self.digest, r.md5.0),
            };
            out.push(entry, Some(r.stats));
        }
        Ok(Some(step))
    }
    fn names(&self) -> &[String] {
        &self.names
    }
    fn layouts(&self) -> &[Layout] {
        &self.layouts
    }
    fn tensor(&mut self, _entry: &Entry) -> Result<Option<Tensor>, DumpError> {
        Ok(None)
    }
    fn environment(&self) -> Option<&Environment> {
        self.environment
    }
}

/// Steps seen on one side only, as ranges.
#[derive(Default)]
struct StepRanges(Vec<(u64, u64)>);

impl StepRanges {
    fn push(&mut self, step: u64) {
        match self.0.last_mut() {
            Some((_, end)) if *end + 1 == step => *end = step,
            _ => self.0.push((step, step)),
        }
    }
    fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .0
            .iter()
            .take(4)
            .map(|&(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}..={b}")
                }
            })
            .collect();
        if self.0.len() > 4 {
            parts.push("...".into());
        }
        parts.join(", ")
    }
}

/// Records that only one side has within steps both have.
#[derive(Default)]
struct OnlyIn {
    count: u64,
    example: Option<(u64, u32, String)>,
}

struct Engine<'o> {
    options: &'o CompareOptions,
    num_compared: u64,
    num_differing: u64,
    first: Option<Divergence>,
    rows: BTreeMap<(u64, u32, u32), Divergence>,
    overflow: [Option<Overflow>; 2],
    only: [OnlyIn; 2],
    step_notes: BTreeMap<String, Vec<u32>>,
    /// step -> one cell per rank (when a map is asked for).
    map: Option<BTreeMap<u64, Vec<u32>>>,
    map_names: Vec<String>,
    map_name_ids: HashMap<String, u32>,
    world: u32,
    /// (key, A's value, B's value) -> the ranks where the snapshots differ so.
    environment: BTreeMap<(String, Option<String>, Option<String>), Vec<u32>>,
    /// Whether a rank of A (of B) was read without a snapshot.
    no_environment: [bool; 2],
    /// The differing evidence records, in (step, seq, rank) order.
    evidence: BTreeMap<(u64, u32, u32), EvidenceDifference>,
    /// A's `site:` entries, by rank.
    sites: BTreeMap<(u32, String), String>,
}

/// Map cell codes; a tensor's cell is `TENSOR + its index` in the map's names.
pub(crate) mod cell_codes {
    pub(crate) const NO_DATA: u32 = u32::MAX;
    pub(crate) const IDENTICAL: u32 = 0;
    pub(crate) const ONE_SIDE: u32 = 1;
    pub(crate) const TENSOR: u32 = 2;
}
use cell_codes::{
    IDENTICAL as CELL_IDENTICAL, NO_DATA as CELL_NO_DATA, ONE_SIDE as CELL_ONE_SIDE,
    TENSOR as CELL_TENSOR,
};

/// For one rank: which name and layout ids of A are known to equal which ids of B, so the hot
/// loop compares integers, not strings.
#[derive(Default)]
struct IdMaps {
    names: Vec<u32>,
    layouts: Vec<u32>,
}

impl IdMaps {
    /// `true` when id `a` of A means the same as id `b` of B (`equal` decides the first time).
    #[inline]
    fn same(map: &mut Vec<u32>, a: u32, b: u32, equal: impl Fn(u32, u32) -> bool) -> bool {
        if map.get(a as usize) == Some(&b) {
            return true;
        }
        if !equal(a, b) {
            return false;
        }
        if map.len() <= a as usize {
            map.resize(a as usize + 1, u32::MAX);
        }
        map[a as usize] = b;
        true
    }
}

/// A differing pair within one step: indices into the two step batches.
type Pair = (Option<usize>, Option<usize>, Difference);

/// Pairs the records of one step of one rank: the k-th record named `x` on one side with the
/// k-th named `x` on the other (so an extra or missing record shifts nothing after it). The
/// pairs come in A's order, then B's records that A lacks in B's order; the comparison engine
/// and `compare --align` pair records only through this.
pub(crate) fn pair_by_occurrence(
    ea: &[Entry],
    eb: &[Entry],
    na: &[String],
    nb: &[String],
) -> Vec<(Option<usize>, Option<usize>)> {
    let mut right: HashMap<(&str, u32), usize> = HashMap::with_capacity(eb.len());
    let mut seen: HashMap<&str, u32> = HashMap::new();
    for (j, y) in eb.iter().enumerate() {
        let name = nb[y.name as usize].as_str();
        let k = seen.entry(name).or_insert(0);
        right.insert((name, *k), j);
        *k += 1;
    }
    seen.clear();
    let mut all = Vec::with_capacity(ea.len().max(eb.len()));
    for (i, x) in ea.iter().enumerate() {
        let name = na[x.name as usize].as_str();
        let k = seen.entry(name).or_insert(0);
        all.push((Some(i), right.remove(&(name, *k))));
        *k += 1;
    }
    // The rest in B's order: a HashMap's order must never reach a result.
    let mut rest: Vec<usize> = right.into_values().collect();
    rest.sort_unstable();
    all.extend(rest.into_iter().map(|j| (None, Some(j))));
    all
}

/// Compares two sides rank by rank.
fn compare_sources(
    a: &dyn Side,
    b: &dyn Side,
    options: &CompareOptions,
) -> Result<Comparison, DumpError> {
    compare_ranks(a, b, options, 0)
}

/// Compares two sides rank by rank, from rank `first_rank` on (the ranks below it are left out
/// of the counts and show no data on the map).
fn compare_ranks(
    a: &dyn Side,
    b: &dyn Side,
    options: &CompareOptions,
    first_rank: u32,
) -> Result<Comparison, DumpError> {
    let (wa, wb) = (a.world_size(), b.world_size());
    let world = wa.max(wb);
    let mut engine = Engine {
        options,
        num_compared: 0,
        num_differing: 0,
        first: None,
        rows: BTreeMap::new(),
        overflow: [None, None],
        only: [OnlyIn::default(), OnlyIn::default()],
        step_notes: BTreeMap::new(),
        map: options.map.then(BTreeMap::new),
        map_names: Vec::new(),
        map_name_ids: HashMap::new(),
        world,
        environment: BTreeMap::new(),
        no_environment: [false; 2],
        evidence: BTreeMap::new(),
        sites: BTreeMap::new(),
    };
    for rank in first_rank..world {
        let sa = if rank < wa {
            Some(a.open_rank(rank)?)
        } else {
            None
        };
        let sb = if rank < wb {
            Some(b.open_rank(rank)?)
        } else {
            None
        };
        engine.compare_environments(rank, sa.as_deref(), sb.as_deref());
        engine.compare_rank(rank, sa, sb)?;
    }
    let mut notes = Vec::new();
    if wa != wb {
        let (more, fewer, side) = if wa > wb {
            (wa, wb, "A")
        } else {
            (wb, wa, "B")
        };
        notes.push(format!(
            "different world sizes: A has {wa} ranks and B has {wb}; ranks {fewer}..={} are only in \
             {side}, and all their records count as differing",
            more - 1
        ));
    }
    for (text, ranks) in &engine.step_notes {
        notes.push(format!("{} {text}", describe_ranks(ranks)));
    }
    for (side, only) in ["A", "B"].iter().zip(&engine.only) {
        if let Some((step, rank, name)) = &only.example {
            notes.push(format!(
                "{} records are only in {side} within steps both have (records are matched by \
                 name and occurrence), the first at step {step} rank {rank}: `{name}`",
                only.count
            ));
        }
    }
    for ((side, s), missing) in [("A", a), ("B", b)].into_iter().zip(engine.no_environment) {
        if let Some(why) = s.no_environment().filter(|_| missing) {
            notes.push(format!(
                "{side} holds no environment snapshot ({why}): environment differences are not shown"
            ));
        }
    }
    for (side, s) in [("A", a), ("B", b)] {
        if !s.has_stats() {
            notes.push(format!(
                "{side} holds no statistics (md5 mode): stat deltas and overflows are not shown for it"
            ));
        }
    }
    let map = engine.map.take().map(|cells| {
        let steps: Vec<u64> = cells.keys().copied().collect();
        let cells = cells.into_values().flatten().collect();
        DivergenceMap::new(world, steps, cells, std::mem::take(&mut engine.map_names))
    });
    Ok(Comparison {
        left: a.describe(),
        right: b.describe(),
        world_sizes: (wa, wb),
        num_compared: engine.num_compared,
        num_differing: engine.num_differing,
        first: engine.first,
        rows: engine.rows.into_values().collect(),
        notes,
        environment: engine
            .environment
            .into_iter()
            .map(|((key, left, right), ranks)| EnvDifference {
                hint: hints::for_variable(&key).map(hints::Hint::advice),
                key,
                left,
                right,
                ranks,
            })
            .collect(),
        overflow: engine.overflow,
        map,
        evidence: engine.evidence.into_values().collect(),
        sites: engine.sites,
    })
}

fn describe_ranks(ranks: &[u32]) -> String {
    if ranks.len() == 1 {
        return format!("rank {}:", ranks[0]);
    }
    let contiguous = ranks.windows(2).all(|w| w[1] == w[0] + 1);
    if contiguous {
        format!("ranks {}..={}:", ranks[0], ranks[ranks.len() - 1])
    } else {
        let list: Vec<String> = ranks.iter().map(ToString::to_string).collect();
        format!("ranks {}:", list.join(", "))
    }
}

fn summary(batch: &Batch, i: usize, src: &dyn RankSource) -> RecordSummary {
    let e = &batch.entries[i];
    RecordSummary {
        layout: src.layouts()[e.layout as usize].describe(),
        digest: (!e.digest.is_none()).then(|| e.digest.hex()),
        stats: batch.stats(i).copied(),
    }
}

impl Engine<'_> {
    /// Records how the environment snapshots of one rank's two sides differ (when both have one).
    fn compare_environments(
        &mut self,
        rank: u32,
        a: Option<&(dyn RankSource + '_)>,
        b: Option<&(dyn RankSource + '_)>,
    ) {
        let (Some(a), Some(b)) = (a, b) else {
            return;
        };
        let (ea, eb) = (a.environment(), b.environment());
        self.no_environment[0] |= ea.is_none();
        self.no_environment[1] |= eb.is_none();
        let (Some(ea), Some(eb)) = (ea, eb) else {
            return;
        };
        // `detcheck.workdir` is a fact even when both runs changed the same file alike.
        for (key, value) in ea.iter().filter(|(k, _)| {
            k.starts_with("site:") || *k == crate::launch::WORKDIR_KEY || *k == cause::FILES_KEY
        }) {
            self.sites.insert((rank, key.to_owned()), value.to_owned());
        }
        for d in ea
            .differences(eb)
            .into_iter()
            .filter(|d| !d.key.starts_with("site:"))
        {
            let key = (
                d.key.to_owned(),
                d.left.map(str::to_owned),
                d.right.map(str::to_owned),
            );
            self.environment.entry(key).or_default().push(rank);
        }
    }

    fn compare_rank(
        &mut self,
        rank: u32,
        mut a: Option<Box<dyn RankSource + '_>>,
        mut b: Option<Box<dyn RankSource + '_>>,
    ) -> Result<(), DumpError> {
        let (mut ea, mut eb) = (Batch::default(), Batch::default());
        let mut step_a = match a.as_mut() {
            Some(s) => s.next_step(&mut ea)?,
            None => None,
        };
        let mut step_b = match b.as_mut() {
            Some(s) => s.next_step(&mut eb)?,
            None => None,
        };
        let (mut only_a, mut only_b) = (StepRanges::default(), StepRanges::default());
        let mut ids = IdMaps::default();
        loop {
            let (take_a, take_b) = match (step_a, step_b) {
                (None, None) => break,
                (Some(x), Some(y)) => (x <= y, y <= x),
                (Some(_), None) => (true, false),
                (None, Some(_)) => (false, true),
            };
            let step = if take_a { step_a } else { step_b }.expect("a step");
            if take_a {
                let src = a.as_deref().expect("side A");
                self.scan_overflow(0, rank, &ea, src);
            }
            if take_b {
                let src = b.as_deref().expect("side B");
                self.scan_overflow(1, rank, &eb, src);
            }
            match (take_a, take_b) {
                (true, true) => {
                    let (sa, sb) = (a.as_deref_mut().expect("A"), b.as_deref_mut().expect("B"));
                    self.compare_step(rank, step, &ea, &eb, sa, sb, &mut ids)?;
                }
                (true, false) => {
                    if b.is_some() {
                        only_a.push(step);
                    }
                    let pairs: Vec<Pair> = (0..ea.entries.len())
                        .map(|i| (Some(i), None, Difference::OnlyLeft))
                        .collect();
                    self.num_compared += pairs.len() as u64;
                    self.report(rank, step, &pairs, &ea, &eb, a.as_deref_mut(), None, false)?;
                }
                _ => {
                    if a.is_some() {
                        only_b.push(step);
                    }
                    let pairs: Vec<Pair> = (0..eb.entries.len())
                        .map(|j| (None, Some(j), Difference::OnlyRight))
                        .collect();
                    self.num_compared += pairs.len() as u64;
                    self.report(rank, step, &pairs, &ea, &eb, None, b.as_deref_mut(), false)?;
                }
            }
            if take_a {
                step_a = a.as_mut().expect("A").next_step(&mut ea)?;
            }
            if take_b {
                step_b = b.as_mut().expect("B").next_step(&mut eb)?;
            }
        }
        for (ranges, side) in [(only_a, "A"), (only_b, "B")] {
            if !ranges.0.is_empty() {
                let text = format!("steps {} are only in {side}", ranges.describe());
                self.step_notes.entry(text).or_default().push(rank);
            }
        }
        Ok(())
    }

    fn scan_overflow(&mut self, side: usize, rank: u32, batch: &Batch, src: &dyn RankSource) {
        let best = &mut self.overflow[side];
        if batch.stats(0).is_none() {
            return;
        }
        for (i, e) in batch.entries.iter().enumerate() {
            if best
                .as_ref()
                .is_some_and(|o| (e.step, e.seq, rank) >= (o.step, o.seq, o.rank))
            {
                return;
            }
            let dtype = src.layouts()[e.layout as usize].dtype();
            let kind = batch.stats(i).zip(dtype).and_then(|(s, d)| classify(s, d));
            if let Some(kind) = kind {
                *best = Some(Overflow {
                    step: e.step,
                    rank,
                    seq: e.seq,
                    name: src.names()[e.name as usize].clone(),
                    kind,
                });
                return;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn compare_step<'s>(
        &mut self,
        rank: u32,
        step: u64,
        a: &Batch,
        b: &Batch,
        sa: &mut (dyn RankSource + 's),
        sb: &mut (dyn RankSource + 's),
        ids: &mut IdMaps,
    ) -> Result<(), DumpError> {
        let (ea, eb) = (&a.entries, &b.entries);
        let (na, nb) = (sa.names(), sb.names());
        let (la, lb) = (sa.layouts(), sb.layouts());
        let mut pairs: Vec<Pair> = Vec::new();
        let positional = ea.len() == eb.len()
            && ea.iter().zip(eb).all(|(x, y)| {
                IdMaps::same(&mut ids.names, x.name, y.name, |i, j| {
                    na[i as usize] == nb[j as usize]
                })
            });
        let layouts = &mut ids.layouts;
        // The first pair whose digests are of kinds that differ at its size: an error, not a
        // difference.
        let mut mixed: Option<(usize, usize)> = None;
        let mut differ = |i: usize, j: usize| -> Option<Difference> {
            let (x, y) = (&ea[i], &eb[j]);
            if !IdMaps::same(layouts, x.layout, y.layout, |i, j| {
                la[i as usize] == lb[j as usize]
            }) {
                return Some(Difference::Layout);
            }
            if !x.digest.is_none() && !y.digest.is_none() {
                if x.digest.len == 16 && y.digest.len == 16 && x.digest.kind != y.digest.kind {
                    let len = la[x.layout as usize].num_bytes().unwrap_or(u64::MAX);
                    let agree = usize::try_from(len)
                        .is_ok_and(|len| x.digest.kind.agree_at(y.digest.kind, len));
                    if !agree {
                        mixed.get_or_insert((i, j));
                        return None;
                    }
                }
                return (x.digest.bytes != y.digest.bytes || x.digest.len != y.digest.len)
                    .then_some(Difference::Digest);
            }
            match (a.stats(i), b.stats(j)) {
                (Some(s), Some(t)) if s != t => Some(Difference::Stats),
                _ => None,
            }
        };
        if positional {
            self.num_compared += ea.len() as u64;
            for i in 0..ea.len() {
                if let Some(d) = differ(i, i) {
                    pairs.push((Some(i), Some(i), d));
                }
            }
        } else {
            let all: Vec<Pair> = pair_by_occurrence(ea, eb, na, nb)
                .into_iter()
                .map(|(i, j)| {
                    let d = match (i, j) {
                        (Some(_), None) => Difference::OnlyLeft,
                        (None, Some(_)) => Difference::OnlyRight,
                        _ => Difference::Digest,
                    };
                    (i, j, d)
                })
                .collect();
            self.num_compared += all.len() as u64;
            for (i, j, d) in all {
                match (i, j) {
                    (Some(i), Some(j)) => {
                        if let Some(d) = differ(i, j) {
                            pairs.push((Some(i), Some(j), d));
                        }
                    }
                    _ => pairs.push((i, j, d)),
                }
            }
            let seq = |p: &Pair| {
                p.0.map_or_else(|| eb[p.1.expect("a side")].seq, |i| ea[i].seq)
            };
            pairs.sort_by_key(seq);
        }
        if let Some((i, j)) = mixed {
            return Err(DumpError::MixedDigests {
                name: na[ea[i].name as usize].clone(),
                step,
                rank,
                left: ea[i].digest.kind,
                right: eb[j].digest.kind,
            });
        }
        if pairs.is_empty() {
            if let Some(map) = self.map.as_mut() {
                let cells = map
                    .entry(step)
                    .or_insert_with(|| vec![CELL_NO_DATA; self.world as usize]);
                if cells[rank as usize] == CELL_NO_DATA {
                    cells[rank as usize] = CELL_IDENTICAL;
                }
            }
            return Ok(());
        }
        self.report(rank, step, &pairs, a, b, Some(sa), Some(sb), true)
    }

    /// Accounts for the differing pairs of one step of one rank (in seq order).
    #[allow(clippy::too_many_arguments)]
    fn report<'s>(
        &mut self,
        rank: u32,
        step: u64,
        pairs: &[Pair],
        a: &Batch,
        b: &Batch,
        mut sa: Option<&mut (dyn RankSource + 's)>,
        mut sb: Option<&mut (dyn RankSource + 's)>,
        both_sides: bool,
    ) -> Result<(), DumpError> {
        let mut marked = false;
        for &(i, j, difference) in pairs {
            let x = i.map(|i| &a.entries[i]);
            let y = j.map(|j| &b.entries[j]);
            let (seq, name) = match (x, y) {
                (Some(x), _) => (
                    x.seq,
                    sa.as_deref().expect("A").names()[x.name as usize].as_str(),
                ),
                (None, Some(y)) => (
                    y.seq,
                    sb.as_deref().expect("B").names()[y.name as usize].as_str(),
                ),
                (None, None) => continue,
            };
            if is_evidence(name) {
                let key = (step, seq, rank);
                if self.evidence.len() < MAX_EVIDENCE
                    || self
                        .evidence
                        .last_key_value()
                        .is_some_and(|(k, _)| key < *k)
                {
                    let (batch, entry, names) = match (x, y) {
                        (Some(x), _) => (a, x, sa.as_deref().expect("A").names()),
                        (None, Some(y)) => (b, y, sb.as_deref().expect("B").names()),
                        (None, None) => continue,
                    };
                    let occurrence = batch
                        .entries
                        .iter()
                        .take_while(|e| e.seq < entry.seq)
                        .filter(|e| names[e.name as usize] == name)
                        .count() as u32;
                    let name = name.to_owned();
                    let evidence = EvidenceDifference {
                        step,
                        rank,
                        seq,
                        name,
                        occurrence,
                    };
                    self.evidence.insert(key, evidence);
                    if self.evidence.len() > MAX_EVIDENCE {
                        self.evidence.pop_last();
                    }
                }
                continue;
            }
            self.num_differing += 1;
            if both_sides {
                let side = match difference {
                    Difference::OnlyLeft => Some(0),
                    Difference::OnlyRight => Some(1),
                    _ => None,
                };
                if let Some(side) = side {
                    let only = &mut self.only[side];
                    only.count += 1;
                    if only.example.is_none() {
                        only.example = Some((step, rank, name.to_owned()));
                    }
                }
            }
            if !marked {
                marked = true;
                if let Some(map) = self.map.as_mut() {
                    let code = if both_sides {
                        let id = match self.map_name_ids.get(name) {
                            Some(&id) => id,
                            None => {
                                let id = self.map_names.len() as u32;
                                self.map_names.push(name.to_owned());
                                self.map_name_ids.insert(name.to_owned(), id);
                                id
                            }
                        };
                        CELL_TENSOR + id
                    } else {
                        CELL_ONE_SIDE
                    };
                    let cells = map
                        .entry(step)
                        .or_insert_with(|| vec![CELL_NO_DATA; self.world as usize]);
                    cells[rank as usize] = code;
                }
            }
            let key = (step, seq, rank);
            let want_row = self.rows.len() < self.options.max_rows
                || self.rows.last_key_value().is_some_and(|(k, _)| key < *k);
            let want_first = self.first.as_ref().is_none_or(|f| key < f.key());
            if !want_row && !want_first {
                continue;
            }
            let name = name.to_owned();
            let (metrics, element) = match (x, y, difference) {
                (Some(x), Some(y), Difference::Digest) => {
                    let ta = sa.as_deref_mut().expect("A").tensor(x)?;
                    let tb = sb.as_deref_mut().expect("B").tensor(y)?;
                    match (ta, tb) {
                        (Some(ta), Some(tb)) => (
                            TensorMetrics::between(&ta, &tb),
                            ElementFinding::between(&ta, &tb),
                        ),
                        _ => (None, None),
                    }
                }
                _ => (None, None),
            };
            let row = Divergence {
                step,
                rank,
                seq,
                name,
                difference,
                left: i.map(|i| summary(a, i, sa.as_deref().expect("A"))),
                right: j.map(|j| summary(b, j, sb.as_deref().expect("B"))),
                metrics,
                element,
                operator: None,
                cause: None,
            };
            if want_first {
                self.first = Some(row.clone());
            }
            if want_row {
                self.rows.insert(key, row);
                if self.rows.len() > self.options.max_rows {
                    self.rows.pop_last();
                }
            }
        }
        Ok(())
    }
}

/// The engine on in-memory traces, as the checks use it (moved here with the old `compare.rs`
/// tests when the checks' own pairing was replaced by this engine).
#[cfg(test)]
mod trace_tests {
    use super::*;
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
    fn evidence_records_are_listed_never_counted_as_divergences() {
        let left = trace(
            &[
                (0, 0, "seed/torch", 1.0, false),
                (0, 0, "rng/numpy", 1.0, false),
                (0, 0, "rng/numpy", 2.0, false),
                (0, 0, "data/order", 1.0, false),
                (0, 1, "data/indices", 1.0, false),
            ],
            1,
        );
        let right = trace(
            &[
                (0, 0, "seed/torch", 1.0, false),
                (0, 0, "rng/numpy", 1.0, false),
                (0, 0, "rng/numpy", 7.0, false),
                (0, 0, "data/order", 1.0, false),
                (0, 1, "data/indices", 3.0, false),
            ],
            1,
        );
        let cmp = compare_traces(&left, &right, TraceView::All);
        assert!(cmp.is_identical(), "{cmp:?}");
        assert_eq!(cmp.first, None);
        let listed: Vec<_> = cmp
            .evidence
            .iter()
            .map(|e| (e.step, e.seq, e.name.as_str(), e.occurrence))
            .collect();
        assert_eq!(listed, [(0, 2, "rng/numpy", 1), (1, 0, "data/indices", 0)]);
        // `data/order` (the seed kind's record) is a result like any other.
        let right = trace(&[(0, 0, "data/order", 2.0, false)], 1);
        let left = trace(&[(0, 0, "data/order", 1.0, false)], 1);
        let cmp = compare_traces(&left, &right, TraceView::All);
        assert_eq!(cmp.first.map(|d| d.name), Some("data/order".to_owned()));
    }

    #[test]
    fn identical_runs_have_no_divergence() {
        let rows = [(0, 0, "a", 1.0, false), (1, 0, "a", 2.0, false)];
        let cmp = compare_traces(&trace(&rows, 2), &trace(&rows, 2), TraceView::All);
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
        let cmp = compare_traces(&left, &right, TraceView::All);
        let first = cmp.first.clone().unwrap();
        assert_eq!((first.step, first.seq, first.rank), (0, 1, 1));
        assert_eq!(first.difference, Difference::Digest);
        assert_eq!(first.name, "b");
        assert_eq!(cmp.num_differing, 3);
        let rank0 = cmp.rows.iter().find(|d| d.rank == 0).unwrap();
        assert_eq!(rank0.step, 1);
        assert_eq!(first.to_string(), "step 0 rank 1 seq 1 `b`: md5 differs");
        // The map of the same pass shows where (tensors numbered as found, rank 0 first).
        let map = cmp.map.unwrap();
        assert_eq!(map.tensors(), ["a", "b"]);
        assert_eq!(map.cell(1, 0), MapCell::Diverged(1));
        assert_eq!(map.cell(0, 0), MapCell::Identical);
        assert_eq!(map.cell(0, 1), MapCell::Diverged(0));
    }

    /// Records are paired by (rank, step, name, occurrence), as `detcheck compare` pairs them: a
    /// renamed record is one record only on the left and one only on the right.
    #[test]
    fn missing_and_renamed_records_are_divergences() {
        let left = trace(&[(0, 0, "a", 1.0, false), (0, 1, "a", 1.0, false)], 1);
        let right = trace(&[(0, 0, "z", 1.0, false)], 1);
        let cmp = compare_traces(&left, &right, TraceView::All);
        assert_eq!(cmp.num_compared, 3);
        assert_eq!(cmp.num_differing, 3);
        let first = cmp.first.as_ref().unwrap();
        assert_eq!(
            (first.step, first.name.as_str(), first.difference),
            (0, "a", Difference::OnlyLeft)
        );
        let cmp = compare_traces(&right, &left, TraceView::All);
        assert_eq!(cmp.num_differing, 3);
        // Different world sizes compare: the extra ranks' records differ, with a note.
        let cmp = compare_traces(&left, &trace(&[], 2), TraceView::All);
        assert_eq!(cmp.world_sizes, (1, 2));
        assert!(
            cmp.notes[0].starts_with("different world sizes"),
            "{:?}",
            cmp.notes
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
        let cmp = compare_traces(&ok, &ok, TraceView::Replicas);
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
        let cmp = compare_traces(&bad, &bad, TraceView::Replicas);
        let first = cmp.first.unwrap();
        assert_eq!(
            (first.step, first.rank, first.difference),
            (0, 2, Difference::Digest)
        );
        assert_eq!(
            cmp.num_differing, 2,
            "the extra step-1 record is missing on rank 0"
        );
    }

    /// `world_sizes` compares rank 0's replicated records only: local records (shards) and the
    /// other ranks are left out.
    #[test]
    fn world_sizes_compare_rank_zero_replicas() {
        let small = trace(&[(0, 0, "local", 1.0, false), (0, 0, "w", 5.0, true)], 1);
        let large = trace(
            &[
                (0, 0, "local", 2.0, false),
                (0, 0, "w", 5.0, true),
                (1, 0, "local", 3.0, false),
                (1, 0, "w", 7.0, true),
            ],
            2,
        );
        let cmp = compare_traces(&small, &large, TraceView::RankZeroReplicated);
        assert!(cmp.is_identical(), "{:?}", cmp.first);
        assert_eq!(cmp.num_compared, 1);
    }
}
