//! Precision alignment (`detcheck compare --align A B`): where two runs of one program on
//! different devices, dtypes or library versions part beyond rounding, and which record's error
//! is its own.
//!
//! Between devices every tensor differs in its last bits from the first operator on, so a bitwise
//! comparison points at the first layer. Alignment measures each pair of records instead (B is
//! the reference, as msprobe's bench side), gives it a verdict, and names the first *culprit*:
//! the first record, in program order, whose error is larger than rounding and than what the
//! records before it explain.
//!
//! Main type: [`Alignment`], from [`align_dumps`]. Records are paired as the comparison engine
//! pairs them (`pair_by_occurrence`: name and occurrence within a step, rank by rank) and walked
//! in program order: step, then the record order of the step (the recorder writes a step's
//! forward outputs in execution order, then gradients, then parameters).
//!
//! The rule (docs/align.md says why each part is there). For a pair with reference `b`:
//! - its error `E` is max |a − b| (from the tensors; from the statistics when the dumps hold
//!   only those: the largest difference of max, min, mean and norm/√n, each a lower bound of
//!   `E`), its magnitude `M` is max |b|, its spread `s` the standard deviation of `b` (at least
//!   `M`/1000, and `M` for a scalar), `u` the unit roundoff of the coarser dtype of the pair
//!   (2⁻²⁴ for f32, 2⁻⁸ for bf16; 0 for integers and booleans, which must match exactly);
//! - its allowance is `max(F·u·M, G·ρ·s)`: `F` units of rounding at its own magnitude (a lossy
//!   but correct operation, such as adding 1000 in f32), or `G` times the largest relative
//!   error `ρ = E/s` of the aligned records before it on its rank, at its own spread. Errors
//!   measured against the spread, not the magnitude, pass unchanged through subtractions and
//!   normalisations, so an ill-conditioned but correct operation (a mean subtracted from
//!   activations near 1000) inherits its input's error instead of being blamed for it;
//! - its excess is `E / allowance`: aligned up to 1, a warning up to `error_excess`, an error
//!   beyond it; a NaN or infinity on one side only, a different shape, or a different value of
//!   an exact dtype is an error;
//! - a record that is not aligned is a culprit when its error is beyond the allowance computed
//!   from every record before it (aligned or not), else it inherits the error of the culprit
//!   before it. The first culprit is the first record that is not aligned.
//!
//! Invariant (a culprit only with evidence; `has_input_evidence`): `compare --align` calls an error
//! a record's own only where the dumps show its input (a call's input records, an operator trace,
//! or `run --dump`'s data flow, `site:flow`: each module input that code between modules made is
//! recorded as `in/<module>.N`); else the culprit is `unconfirmed`.
//!
//! Determinism: a pure function of the two dumps, walked in (rank, step, seq) order; metrics are
//! sums in element order in `f64`.
//!
//! Data flow: an output of an msprobe call whose inputs were recorded (`....forward.input.*`,
//! then `....forward.output.*`), or of an operator call of an operator trace
//! (`op/{i}/{module}/{operator}/in{j}`, then `.../out{j}`: `detcheck run --inside`), is allowed
//! the errors of those inputs alone (`CallInputs`). An operator trace's window inputs
//! (`window/in{j}`) are where it starts: any error is allowed them (it was made before the
//! module), and the operators after them inherit it. Two operator traces whose operators part
//! (the module computed another way) are compared up to that call, and their outputs whole
//! ([`OperatorsPart`]); the culprit's call is named with each side's arguments and line
//! ([`OperatorCallText`]).
//!
//! Limits: elsewhere (detcheck's traces, a module call with parameter records) the inherited
//! error is the largest of *all* earlier records on the rank, not of the record's own inputs
//! (the dumps do not say which they are), so a culprit whose error is smaller than an unrelated
//! earlier one is counted as inheriting; a culprit is found surely in the first step where it
//! acts. Replay of a module on the reference's inputs is a re-run of the program
//! (`crate::run::dump_inside`), whose traces this module then reads.

use super::operator::operator_call;
use super::{fill_f64, is_evidence, pair_by_occurrence};
use crate::file::format::Entry;
use crate::file::source::{Batch, Layout, RankSource, TensorReads};
use crate::file::{open_dump, DumpError};
use crate::record::environment::keys;
use crate::record::Environment;
use crate::value::digest::Stats;
use crate::value::tensor::{DType, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

/// The thresholds of [`align_dumps`] (defaults in [`AlignOptions::default`], docs/align.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlignOptions {
    /// `F`: units of roundoff at a record's own magnitude that are rounding (default 16).
    pub rounding_units: f64,
    /// `G`: how much larger than the relative error before it a record's may be (default 10).
    pub growth: f64,
    /// Excess beyond which a record is an error rather than a warning (default 10).
    pub error_excess: f64,
    /// The records that are not aligned kept for the report (the first ones; 0: all).
    pub max_rows: usize,
    /// The dtype whose roundoff every floating record is allowed at least (`bf16` for a run in
    /// bf16 autocast whose records say f32); `None`: each record's own dtypes.
    pub precision: Option<String>,
    /// Keep every measured record in [`Alignment::records`], aligned or not (for checking the
    /// metrics against another tool's, such as msprobe's compare: memory grows with the dumps).
    #[serde(default)]
    pub every_record: bool,
}

impl Default for AlignOptions {
    fn default() -> Self {
        AlignOptions {
            rounding_units: 16.0,
            growth: 10.0,
            error_excess: 10.0,
            max_rows: 50,
            precision: None,
            every_record: false,
        }
    }
}

/// Why two dumps cannot be aligned.
#[derive(Debug, thiserror::Error)]
pub enum AlignError {
    /// A dump cannot be read.
    #[error(transparent)]
    Dump(#[from] DumpError),
    /// The dumps have different numbers of ranks.
    #[error(
        "A has {left} ranks and B has {right}: --align compares each rank with the same rank of \
         the reference; record both runs at the same --ranks"
    )]
    WorldSizes {
        /// A's ranks.
        left: u32,
        /// B's ranks.
        right: u32,
    },
    /// No record of A has a partner in B.
    #[error(
        "A and B have no record in common (A's first is `{left}`, B's first is `{right}`): are \
         they dumps of the same program?"
    )]
    NothingInCommon {
        /// A's first record name.
        left: String,
        /// B's first record name.
        right: String,
    },
}

/// A record's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Within its allowance.
    Aligned,
    /// Beyond its allowance, by at most `error_excess`.
    Warning,
    /// Beyond its allowance by more; or non-finite values, shapes or exact values that differ.
    Error,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Aligned => "aligned",
            Verdict::Warning => "warning",
            Verdict::Error => "error",
        })
    }
}

/// Whose fault a record's error is (records that are not aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Blame {
    /// Aligned: nothing to blame.
    None,
    /// Its own: beyond what every record before it explains, and its input is known to be
    /// aligned (the dumps hold it: `has_input_evidence`).
    Own,
    /// Inherited from a culprit before it.
    Inherited,
    /// Beyond what every record before it explains, but the dumps do not show its input: code
    /// between the records (an added offset, a residual sum, a functional call, an in-place
    /// change) may have made the error. A culprit, not yet confirmed.
    Unconfirmed,
}

impl Blame {
    /// Why a culprit's error is blamed so, after "max |a-b| ... is N x its allowance ...".
    #[must_use]
    pub fn reason(self) -> &'static str {
        match self {
            Blame::Unconfirmed => {
                "the records before it explain less, but the dumps do not hold its input, which \
                 code between records may have changed (an offset, a residual sum, a functional \
                 call): unconfirmed; a dump of `detcheck run --dump` records every module's \
                 input, and a replay on B's inputs settles it (docs/align.md)"
            }
            Blame::Own => "the records before it explain less, so the error is its own",
            Blame::Inherited => "the records before it explain it: inherited from a culprit",
            Blame::None => "aligned",
        }
    }
}

impl fmt::Display for Blame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Blame::None => "-",
            Blame::Own => "own",
            Blame::Inherited => "inherited",
            Blame::Unconfirmed => "unconfirmed",
        })
    }
}

/// msprobe's per-tensor metrics (its compare's columns, the same definitions; B is the bench).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct AlignMetrics {
    /// `Cosine` (tensors of 2 or more elements whose norms are not both zero).
    pub cosine: Option<f64>,
    /// `EucDist`: ‖a − b‖₂.
    pub euc_dist: Option<f64>,
    /// `MaxAbsErr`.
    pub max_abs_err: Option<f64>,
    /// `MaxRelativeErr`: max |a − b| / |b|, with machine epsilon added to both where b is 0,
    /// in float32 for pairs of f32, f16, bf16 and fp8 tensors (as msprobe computes it).
    pub max_rel_err: Option<f64>,
    /// `One Thousandth Err Ratio`: the share of elements with relative error < 0.001 (the
    /// ratios, `Cosine` and `EucDist` need 2 or more elements).
    pub one_thousandth: Option<f64>,
    /// `Five Thousandths Err Ratio`: below 0.005.
    pub five_thousandths: Option<f64>,
    /// Statistics mode: (a − b) of max, min, mean and norm.
    pub stat_diffs: Option<[Option<f64>; 4]>,
}

/// One record pair, measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlignedRecord {
    /// Its step.
    pub step: u64,
    /// Its rank.
    pub rank: u32,
    /// Its position in A's step.
    pub seq: u32,
    /// Its name.
    pub name: String,
    /// Which record of that name in its step (0: the first).
    #[serde(default)]
    pub occurrence: u32,
    /// A's dtype and shape (`f32[8,16]`).
    pub left: String,
    /// B's.
    pub right: String,
    /// Whether the error was measured on the tensors (`false`: on statistics).
    pub from_tensors: bool,
    /// `E`: the largest absolute error (a lower bound of it, from statistics).
    pub error: f64,
    /// The allowance `E` was held to.
    pub allowance: f64,
    /// `E / allowance`.
    pub excess: f64,
    /// `E / s`: the error relative to the reference's spread.
    pub relative: f64,
    /// The verdict.
    pub verdict: Verdict,
    /// Whose fault.
    pub blame: Blame,
    /// msprobe's metrics.
    pub metrics: AlignMetrics,
    /// Why it is an error when no number says it (non-finite values, shapes, exact dtypes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl fmt::Display for AlignedRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(note) = &self.note {
            return write!(
                f,
                "step {} rank {} `{}`: {note} ({})",
                self.step, self.rank, self.name, self.verdict
            );
        }
        write!(
            f,
            "step {} rank {} `{}`: max |a-b| {:.3e} is {:.1}x its allowance {:.3e} ({})",
            self.step, self.rank, self.name, self.error, self.excess, self.allowance, self.verdict
        )
    }
}

/// The records of one step of one rank along the program order, for the picture of the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepExcess {
    /// The step.
    pub step: u64,
    /// The rank.
    pub rank: u32,
    /// Each record's excess, in record order (0 for an exact match).
    pub excess: Vec<f32>,
}

/// The result of aligning two dumps: data, not an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[must_use]
pub struct Alignment {
    /// What A is.
    pub left: String,
    /// What B is (the reference).
    pub right: String,
    /// The ranks of each.
    pub world_size: u32,
    /// The thresholds used.
    pub options: AlignOptions,
    /// Record pairs measured.
    pub num_records: u64,
    /// How many are aligned, warnings and errors.
    pub counts: [u64; 3],
    /// The first culprit: the first record (step, seq, rank) that is not aligned.
    pub culprit: Option<AlignedRecord>,
    /// The records whose error is their own, in order (at most 20).
    pub culprits: Vec<AlignedRecord>,
    /// The records inheriting the first culprit's error on its rank, in order (at most 20 names).
    pub chain: Vec<String>,
    /// How many records inherit it in all.
    pub chain_len: u64,
    /// The records that are not aligned, in (step, seq, rank) order, at most `max_rows`.
    pub rows: Vec<AlignedRecord>,
    /// The aligned record closest to its allowance (largest excess), when one differs at all.
    pub closest: Option<AlignedRecord>,
    /// The unit roundoff of `AlignOptions::precision` (0: each record's own dtypes).
    pub precision: f64,
    /// Each step's excesses along the program order.
    pub series: Vec<StepExcess>,
    /// Where the first culprit is in `series`: (index of its step's series, its position).
    pub culprit_index: Option<(usize, usize)>,
    /// Records one side lacks, evidence left out, bases used.
    pub notes: Vec<String>,
    /// Every measured record in (rank, step, seq) order, when [`AlignOptions::every_record`]
    /// asks for them (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<AlignedRecord>,
    /// Where two operator traces of one module (`detcheck run --inside`) first run different
    /// operators, if they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operators_part: Option<OperatorsPart>,
    /// The first culprit's operator call, when it is a record of an operator trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub culprit_call: Option<OperatorCallText>,
    /// Each side's program as `detcheck run` takes it, where its dump says (`site:program`):
    /// what the commands that look inside a culprit run.
    #[serde(default)]
    pub programs: [Option<String>; 2],
}

/// One operator call of an operator trace as each side made it: what the tensors do not show
/// (a `gelu` with `approximate='tanh'`), and the program's line that made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorCallText {
    /// The call's index in the window.
    pub index: u32,
    /// The operator.
    pub operator: String,
    /// The module whose forward ran it.
    pub module: String,
    /// A's call with its arguments (`site:call:{i}` of `run --inside` traces), and B's.
    pub calls: [Option<String>; 2],
    /// Where each program made it (`site:op:{i}`: the program's `file:line`).
    pub sites: [Option<String>; 2],
}

impl OperatorCallText {
    /// The call `index` of `operator` in `module`, as the two environments tell it.
    fn of(
        index: u32,
        operator: &str,
        module: &str,
        environments: [Option<&Environment>; 2],
    ) -> Self {
        let get =
            |key: String| environments.map(|e| e.and_then(|e| e.get(&key)).map(str::to_owned));
        OperatorCallText {
            index,
            operator: operator.to_owned(),
            module: module.to_owned(),
            calls: get(format!("site:call:{index}")),
            sites: get(format!("site:op:{index}")),
        }
    }
}

impl OperatorCallText {
    /// Side `i`'s call (`aten.mul.Tensor(float32[64, 64], ...)`, else the operator) and its
    /// line.
    fn side(&self, i: usize) -> String {
        let call = self.calls[i].as_deref().unwrap_or(&self.operator);
        match &self.sites[i] {
            Some(site) => format!("`{call}` at {site}"),
            None => format!("`{call}`"),
        }
    }
}

impl fmt::Display for OperatorCallText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` (call {} in `{}`)",
            self.operator, self.index, self.module
        )?;
        if self.calls[0] != self.calls[1] || self.sites[0] != self.sites[1] {
            write!(f, ": A calls {}, B {}", self.side(0), self.side(1))
        } else {
            write!(f, ": {}", self.side(0))
        }
    }
}

/// The first call at which two operator traces of one module run different operators: the
/// module's implementation differs between the runs, so its operators are compared up to that
/// call and its outputs (`window/out{j}`) as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorsPart {
    /// The rank.
    pub rank: u32,
    /// The step.
    pub step: u64,
    /// The call's index in the window.
    pub call: u32,
    /// The module whose forward ran the call (on the side that has it).
    pub module: String,
    /// A's operator at that call (`(none)` past A's last call).
    pub left: String,
    /// B's.
    pub right: String,
    /// Operator records of both sides from that call on, not compared.
    pub skipped: u64,
    /// A's call and B's there, with their arguments and lines where the traces hold them.
    pub at: OperatorCallText,
}

impl fmt::Display for OperatorsPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the operators part at call {} in `{}` (step {} rank {}): A runs `{}`, B `{}`: \
             the module is computed another way in A; its {} operator records from there on \
             are not compared, its outputs are",
            self.call, self.module, self.step, self.rank, self.left, self.right, self.skipped
        )?;
        write!(f, " (A {}, B {})", self.at.side(0), self.at.side(1))
    }
}

impl Alignment {
    /// `true` when every record is aligned.
    #[must_use]
    pub fn is_aligned(&self) -> bool {
        self.counts[1] == 0 && self.counts[2] == 0
    }
}

/// The unit roundoff of a dtype as a dump names it (`f32`, `torch.bfloat16`, `Float16`): 0 for
/// integers and booleans (exact), `None` for a name detcheck does not know.
pub fn unit_roundoff(dtype: &str) -> Option<f64> {
    if dtype.eq_ignore_ascii_case("tf32") {
        return Some(2f64.powi(-11));
    }
    let u = match DType::from_dump_name(dtype)? {
        DType::F64 | DType::C128 => 2f64.powi(-53),
        DType::F32 | DType::C64 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F8E4M3 => 2f64.powi(-4),
        DType::F8E5M2 => 2f64.powi(-3),
        DType::Bool | DType::U8 | DType::I8 | DType::I16 | DType::U16 | DType::I32 | DType::I64 => {
            0.0
        }
    };
    Some(u)
}

/// What one pass over a pair of tensors gives.
#[derive(Debug, Default)]
struct Measure {
    error: f64,
    magnitude: f64,
    spread: f64,
    metrics: AlignMetrics,
    note: Option<String>,
}

/// msprobe's `format_value`: the number rounded to `decimals` decimal places, as Python's
/// `float('{:.12f}'.format(v))` does (both round the exact binary value, ties to even).
fn msprobe_round(v: f64, decimals: usize) -> f64 {
    if v.is_finite() {
        format!("{v:.decimals$}").parse().unwrap_or(v)
    } else {
        v
    }
}

/// Whether msprobe computes a pair's relative errors in `float32`: its compare reads bf16 and
/// fp8 tensors as float32, f16 as float16 and casts integers and booleans to float64, then
/// works in `np.result_type(a, b, np.float32)` (msprobe/core/compare/utils.py,
/// `get_relative_err`): float32 unless a side is float64 or not a float.
fn relative_in_f32(a: DType, b: DType) -> bool {
    let narrow = |d: DType| {
        matches!(
            d,
            DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    };
    narrow(a) && narrow(b)
}

/// One element's relative error as msprobe's `get_relative_err` computes it: `|(a − b) / b|`
/// in the pair's working precision, with that precision's machine epsilon added to both
/// sides where `b` is 0.
fn relative_error(x: f64, y: f64, in_f32: bool) -> f64 {
    if in_f32 {
        // Exact: the values are f32, f16, bf16 or fp8 ones.
        let (mut n, mut b) = (x as f32, y as f32);
        if b == 0.0 {
            n += f32::EPSILON;
            b += f32::EPSILON;
        }
        f64::from(((n - b) / b).abs())
    } else {
        let (mut n, mut b) = (x, y);
        if b == 0.0 {
            n += f64::EPSILON;
            b += f64::EPSILON;
        }
        ((n - b) / b).abs()
    }
}

/// Measures two tensors of equal element counts in one pass, in `f64`, with msprobe 26.2's
/// definitions (its compare's columns; docs/align.md, "Checked against msprobe"):
/// - NaN and infinities at the same places on both sides (an infinity of either sign) are set
///   to 0 first; at different places the pair is an error without metrics;
/// - `Cosine` and `EucDist` and the ratios need 2 or more elements (msprobe squeezes a tensor's
///   dimensions of size 1, and a single value is a 0-d array it does not measure so);
///   `MaxAbsErr`, `MaxRelativeErr`, `Cosine` and the ratios are rounded to 12 decimals, as
///   msprobe's `format_value`, and a cosine above 0.9999 to 6, as its compare rounds it;
/// - relative errors are computed in the working precision of [`relative_in_f32`] (float32
///   for f32, f16, bf16 and fp8 pairs), and compared with 0.001 and 0.005 in it.
fn measure_tensors(a: &Tensor, b: &Tensor) -> Measure {
    let in_f32 = relative_in_f32(a.dtype(), b.dtype());
    let (t1, t5) = if in_f32 {
        (f64::from(1e-3f32), f64::from(5e-3f32))
    } else {
        (1e-3, 5e-3)
    };
    /// Elements converted at a time: both sides' chunks stay in the L1 cache.
    const CHUNK: usize = 1024;
    let n = b.len().min(a.len());
    let mut mismatched = 0u64;
    let mut first_mismatch = None;
    let mut opposite = 0u64;
    let mut first_opposite = None;
    let (mut max_abs, mut sq, mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64, 0.0, 0.0);
    let (mut max_rel, mut in1, mut in5) = (0.0f64, 0u64, 0u64);
    let (mut magnitude, mut sum, mut sum_sq) = (0.0f64, 0.0f64, 0.0f64);
    let (mut xs, mut ys) = ([0.0f64; CHUNK], [0.0f64; CHUNK]);
    let mut start = 0;
    while start < n {
        let len = fill_f64(a, start, &mut xs).min(fill_f64(b, start, &mut ys));
        if len == 0 {
            break;
        }
        for (k, (&x, &y)) in xs[..len].iter().zip(&ys[..len]).enumerate() {
            if y.is_finite() {
                // The reference's scale counts every finite element, matched or not.
                magnitude = magnitude.max(y.abs());
                sum += y;
                sum_sq += y * y;
            }
            let (x, y) = match (x.is_finite(), y.is_finite()) {
                (true, true) => (x, y),
                (false, false) if x.is_nan() == y.is_nan() => {
                    // msprobe matches the places of NaN and of infinities, not their signs.
                    if x != y && !x.is_nan() {
                        opposite += 1;
                        first_opposite.get_or_insert((start + k, x, y));
                    }
                    (0.0, 0.0)
                }
                _ => {
                    mismatched += 1;
                    first_mismatch.get_or_insert((start + k, x, y));
                    continue;
                }
            };
            let d = (x - y).abs();
            max_abs = max_abs.max(d);
            sq += d * d;
            dot += x * y;
            na += x * x;
            nb += y * y;
            let rel = relative_error(x, y, in_f32);
            // np.max propagates a NaN.
            max_rel = if rel.is_nan() || max_rel.is_nan() {
                f64::NAN
            } else {
                max_rel.max(rel)
            };
            in1 += u64::from(rel < t1);
            in5 += u64::from(rel < t5);
        }
        start += len;
    }
    let mean = if n == 0 { 0.0 } else { sum / n as f64 };
    let variance = if n == 0 {
        0.0
    } else {
        (sum_sq / n as f64 - mean * mean).max(0.0)
    };
    let mut m = Measure {
        error: max_abs,
        magnitude,
        spread: spread_of(variance.sqrt(), magnitude, n as u64),
        ..Measure::default()
    };
    if let Some((k, x, y)) = first_mismatch {
        m.error = f64::INFINITY;
        m.note = Some(format!(
            "non-finite values at different places: {mismatched} elements, the first at flat \
             index {k} (A {x}, B {y})"
        ));
        return m;
    }
    if let Some((k, x, y)) = first_opposite {
        m.error = f64::INFINITY;
        m.note = Some(format!(
            "infinities of opposite signs: {opposite} elements, the first at flat index {k} \
             (A {x}, B {y})"
        ));
    }
    if n == 0 {
        return m;
    }
    let vector = n >= 2;
    let norm_tiny = f64::EPSILON;
    let (norm_a, norm_b) = (na.sqrt(), nb.sqrt());
    let cosine = if !vector || (norm_a <= norm_tiny) != (norm_b <= norm_tiny) {
        None
    } else if norm_a <= norm_tiny {
        Some(1.0)
    } else {
        let c = dot / (norm_a * norm_b);
        let c = msprobe_round(c, 12);
        (!c.is_nan()).then(|| if c > 0.9999 { msprobe_round(c, 6) } else { c })
    };
    m.metrics = AlignMetrics {
        cosine,
        euc_dist: vector.then(|| sq.sqrt()),
        max_abs_err: Some(msprobe_round(max_abs, 12)),
        max_rel_err: (!max_rel.is_nan()).then(|| msprobe_round(max_rel, 12)),
        one_thousandth: vector.then(|| msprobe_round(in1 as f64 / n as f64, 12)),
        five_thousandths: vector.then(|| msprobe_round(in5 as f64 / n as f64, 12)),
        stat_diffs: None,
    };
    m
}

/// msprobe's metrics of two equal tensors of `n` elements (what [`measure_tensors`] gives them).
fn equal_metrics(n: u64) -> AlignMetrics {
    let vector = n >= 2;
    AlignMetrics {
        cosine: vector.then_some(1.0),
        euc_dist: vector.then_some(0.0),
        max_abs_err: (n > 0).then_some(0.0),
        max_rel_err: (n > 0).then_some(0.0),
        one_thousandth: vector.then_some(1.0),
        five_thousandths: vector.then_some(1.0),
        stat_diffs: None,
    }
}

/// The spread a relative error is measured against: the standard deviation, at least a
/// thousandth of the magnitude (a nearly constant tensor, such as a norm layer's weights,
/// would make any rounding look large), and the magnitude for a single value.
fn spread_of(std: f64, magnitude: f64, n: u64) -> f64 {
    if n <= 1 {
        magnitude
    } else {
        std.max(magnitude * 1e-3)
    }
}

/// Measures two records from their statistics: each difference of max, min, mean and
/// norm/√n is a lower bound of the largest element error.
fn measure_stats(a: &Stats, b: &Stats, n: u64) -> Measure {
    let pick = |s: &Stats| {
        [
            s.max.map(|v| v.0),
            s.min.map(|v| v.0),
            s.mean.map(|v| v.0),
            s.norm.map(|v| v.0),
        ]
    };
    let (sa, sb) = (pick(a), pick(b));
    let mut diffs = [None; 4];
    let mut error = 0.0f64;
    let root_n = (n.max(1) as f64).sqrt();
    for k in 0..4 {
        if let (Some(x), Some(y)) = (sa[k], sb[k]) {
            let d = x - y;
            diffs[k] = Some(d);
            let bound = if k == 3 { d.abs() / root_n } else { d.abs() };
            error = error.max(if bound.is_nan() { 0.0 } else { bound });
        }
    }
    let magnitude = match (sb[0], sb[1]) {
        (Some(mx), Some(mn)) => mx.abs().max(mn.abs()),
        _ => 0.0,
    };
    let std = match (sb[2], sb[3]) {
        (Some(mean), Some(norm)) => ((norm / root_n).powi(2) - mean * mean).max(0.0).sqrt(),
        _ => 0.0,
    };
    let mut m = Measure {
        error,
        magnitude,
        spread: spread_of(std, magnitude, n),
        metrics: AlignMetrics {
            stat_diffs: Some(diffs),
            ..AlignMetrics::default()
        },
        note: None,
    };
    let non_finite = |s: &Stats| (s.nan, s.pos_inf, s.neg_inf);
    if non_finite(a) != non_finite(b) {
        m.error = f64::INFINITY;
        let (x, y) = (non_finite(a), non_finite(b));
        m.note = Some(format!(
            "non-finite values differ: A has {} NaN, {} +Inf, {} -Inf; B has {} NaN, {} +Inf, {} -Inf",
            x.0, x.1, x.2, y.0, y.1, y.2
        ));
    }
    m
}

/// The walk of one rank: what the records before the current one explain.
#[derive(Default)]
struct RankWalk {
    /// The largest `E/s` of the aligned records so far.
    clean: f64,
    /// The largest `E/s` of all records so far.
    all: f64,
    /// Whether a record so far was not aligned.
    tainted: bool,
    /// Whether the chain of the rank's first culprit is still being collected.
    chain_open: bool,
    /// The window inputs of an operator trace (`window/in{j}`) measured, and how many were
    /// bitwise equal: all of them when A ran the module on B's inputs (`run --replay`).
    window_inputs: [u64; 2],
    /// The inputs of the call judged last, in msprobe dumps ([`CallInputs`]).
    call: Option<CallInputs>,
    /// Both dumps hold every module's input that no record before it holds (`site:flow`:
    /// `run --dump`'s recorder, `in/<module>.N`): a module's output then has its input in them.
    flow: bool,
}

/// The environment key a dump's recorder sets when it records each module's input that no
/// record before it holds (`in/<module>.N`, python/python/detcheck/_core/engine.py).
pub const FLOW_KEY: &str = "site:flow";

/// Whether the dumps show the input of the record `name` (whose call's input records, when it
/// is a call's output, are `inputs`): then an error beyond what the records before it explain
/// is its own. Evidence: a call's input record (where the error entered it), a call's output
/// after its own input records (msprobe, operator traces), an operator trace's window, and,
/// where both dumps hold the data flow (`flow`), a module's output or input record.
fn has_input_evidence(
    name: &str,
    part: Option<(&str, bool)>,
    inputs_seen: bool,
    flow: bool,
) -> bool {
    match part {
        Some((_, true)) => true,
        Some((_, false)) => inputs_seen,
        None => {
            name.starts_with("window/")
                || (flow && (name.starts_with("fwd/") || name.starts_with("in/")))
        }
    }
}

/// The input records of one call of an msprobe dump (`Functional.gelu.0.forward.input.*`): the
/// allowance of the call's outputs (`....output.*`), which follow them, comes from these alone,
/// the data flow the dump holds, not from every earlier record of the rank; whether an output
/// beyond it inherits an earlier culprit's error is still judged on every earlier record (a
/// module's output holds the errors of the APIs inside it). A call with parameter records is
/// left to the rank's rule: they come after its outputs.
#[derive(Debug, Clone, Default)]
struct CallInputs {
    /// The call's name (`Functional.gelu.0.forward`).
    call: String,
    /// The largest `E/s` of its aligned inputs.
    clean: f64,
}

/// Whether `name` is an input or an output record of an msprobe call (an API's,
/// `Functional.gelu.0.forward.input.0`, or a module's, `Module.fc.Linear.forward.0.output.0`)
/// or of an operator trace's call (`op/0003/blocks.0.act/aten.gelu.default/in0<in0`), and the
/// call's name.
fn call_part(name: &str) -> Option<(&str, bool)> {
    if let Some(record) = operator_call(name) {
        return Some((record.call, record.input));
    }
    let (at, input) = match (name.rfind(".input."), name.rfind(".output.")) {
        (Some(i), None) => (i, true),
        (None, Some(o)) => (o, false),
        _ => return None,
    };
    let call = &name[..at];
    let pass = call.trim_end_matches(|c: char| c.is_ascii_digit());
    let pass = pass
        .strip_suffix('.')
        .filter(|_| pass.len() < call.len())
        .unwrap_or(call);
    (pass.ends_with(".forward") || pass.ends_with(".backward")).then_some((call, input))
}

/// The calls of a step that have parameter records (`Module.fc.Linear.forward.0.parameters.*`,
/// after the call's outputs): their outputs cannot be judged on their inputs alone.
fn calls_with_parameters(entries: &[Entry], names: &[String]) -> BTreeSet<String> {
    entries
        .iter()
        .filter_map(|e| {
            let name = &names[e.name as usize];
            name.rfind(".parameters.").map(|at| name[..at].to_owned())
        })
        .collect()
}

/// Aligns two dump folders (detcheck traces or msprobe dumps) rank by rank, streaming: memory
/// holds one step of one rank of each side.
///
/// # Errors
/// [`AlignError`] when a dump cannot be read, the rank counts differ, or no record is common.
pub fn align_dumps(
    left: &Path,
    right: &Path,
    options: &AlignOptions,
) -> Result<Alignment, AlignError> {
    let (a, b) = (open_dump(left)?, open_dump(right)?);
    let (wa, wb) = (a.world_size(), b.world_size());
    if wa != wb {
        return Err(AlignError::WorldSizes {
            left: wa,
            right: wb,
        });
    }
    let mut out = Alignment {
        left: a.describe(),
        right: b.describe(),
        world_size: wa,
        options: options.clone(),
        num_records: 0,
        counts: [0; 3],
        culprit: None,
        culprits: Vec::new(),
        chain: Vec::new(),
        chain_len: 0,
        rows: Vec::new(),
        closest: None,
        precision: options
            .precision
            .as_deref()
            .and_then(unit_roundoff)
            .unwrap_or(0.0),
        series: Vec::new(),
        culprit_index: None,
        notes: Vec::new(),
        records: Vec::new(),
        operators_part: None,
        culprit_call: None,
        programs: [None, None],
    };
    let mut only = [0u64; 2];
    let mut replayed = false;
    let mut first_names: [Option<String>; 2] = [None, None];
    let mut stats_basis = 0u64;
    for rank in 0..wa {
        let mut sa = a.open_rank(rank)?;
        let mut sb = b.open_rank(rank)?;
        // Every record's tensor is measured where the dumps hold them: each file read once.
        sa.will_read(TensorReads::Every);
        sb.will_read(TensorReads::Every);
        let (mut ba, mut bb) = (Batch::default(), Batch::default());
        let flow = [sa.environment(), sb.environment()]
            .iter()
            .all(|e| e.is_some_and(|e| e.get(FLOW_KEY).is_some()));
        let mut walk = RankWalk {
            flow,
            ..RankWalk::default()
        };
        let mut step_a = sa.next_step(&mut ba)?;
        let mut step_b = sb.next_step(&mut bb)?;
        loop {
            match (step_a, step_b) {
                (None, None) => break,
                (Some(x), Some(y)) if x == y => {
                    align_step(
                        rank,
                        x,
                        (&ba, &bb),
                        (sa.as_mut(), sb.as_mut()),
                        options,
                        &mut walk,
                        &mut out,
                        &mut only,
                        &mut first_names,
                        &mut stats_basis,
                    )?;
                    step_a = sa.next_step(&mut ba)?;
                    step_b = sb.next_step(&mut bb)?;
                }
                (Some(x), y) if y.is_none_or(|y| x < y) => {
                    only[0] += ba.entries.len() as u64;
                    step_a = sa.next_step(&mut ba)?;
                }
                _ => {
                    only[1] += bb.entries.len() as u64;
                    step_b = sb.next_step(&mut bb)?;
                }
            }
        }
        if let Some(c) = out.culprit.as_ref().filter(|c| c.rank == rank) {
            if out.culprit_call.is_none() {
                out.culprit_call = operator_call(&c.name).map(|r| {
                    OperatorCallText::of(
                        r.index,
                        r.operator,
                        r.module,
                        [sa.environment(), sb.environment()],
                    )
                });
            }
        }
        if rank == 0 {
            out.programs = [sa.environment(), sb.environment()]
                .map(|e| e.and_then(|e| e.get(keys::PROGRAM)).map(str::to_owned));
        }
        let [inputs, equal] = walk.window_inputs;
        if inputs > 0 && inputs == equal && !replayed {
            replayed = true;
            out.notes.push(
                "the module ran on the same inputs on both sides (every `window/in` record is \
                 bitwise equal: `run --replay`): each difference inside it is A's own"
                    .to_owned(),
            );
        }
    }
    if out.num_records == 0 {
        return Err(AlignError::NothingInCommon {
            left: first_names[0].clone().unwrap_or_else(|| "(none)".into()),
            right: first_names[1].clone().unwrap_or_else(|| "(none)".into()),
        });
    }
    for (side, n) in ["A", "B"].iter().zip(only) {
        if n > 0 {
            out.notes.push(format!(
                "{n} records are only in {side} (not measured; records are paired by step, name \
                 and occurrence)"
            ));
        }
    }
    if stats_basis > 0 {
        out.notes.push(format!(
            "{stats_basis} of {} records were measured on their statistics (no tensors on both \
             sides: full mode or msprobe's tensor mode gives the elements); their error is a \
             lower bound",
            out.num_records
        ));
    }
    Ok(out)
}

/// Measures and judges the paired records of one step of one rank.
#[allow(clippy::too_many_arguments)]
fn align_step(
    rank: u32,
    step: u64,
    (ba, bb): (&Batch, &Batch),
    (sa, sb): (&mut dyn RankSource, &mut dyn RankSource),
    options: &AlignOptions,
    walk: &mut RankWalk,
    out: &mut Alignment,
    only: &mut [u64; 2],
    first_names: &mut [Option<String>; 2],
    stats_basis: &mut u64,
) -> Result<(), AlignError> {
    let pairs = pair_step((ba, bb), (sa.names(), sb.names()), first_names);
    let parted = if out.operators_part.is_none() {
        operators_part(
            rank,
            step,
            (ba, sa.names()),
            (bb, sb.names()),
            [sa.environment(), sb.environment()],
        )
    } else {
        None
    };
    let floor = out.precision;
    let parameters = calls_with_parameters(&ba.entries, sa.names());
    let mut series = Vec::with_capacity(pairs.len());
    // An operator record at or after the call where the traces part is counted in `skipped`.
    let after_part = |name: &str| {
        parted
            .as_ref()
            .is_some_and(|p| operator_call(name).is_some_and(|r| r.index >= p.call))
    };
    for (i, j) in pairs {
        let (i, j) = match (i, j) {
            (Some(i), Some(j)) => (i, j),
            (Some(i), None) => {
                only[0] += u64::from(!after_part(&sa.names()[ba.entries[i].name as usize]));
                continue;
            }
            (_, j) => {
                let j = j.unwrap_or_default();
                only[1] += u64::from(!after_part(&sb.names()[bb.entries[j].name as usize]));
                continue;
            }
        };
        let (x, y) = (&ba.entries[i], &bb.entries[j]);
        let name = sa.names()[x.name as usize].clone();
        if is_evidence(&name) {
            continue;
        }
        if after_part(&name) {
            continue;
        }
        let with_parameters = call_part(&name).is_some_and(|(call, _)| parameters.contains(call));
        let (la, lb): (Layout, Layout) = (
            sa.layouts()[x.layout as usize].clone(),
            sb.layouts()[y.layout as usize].clone(),
        );
        let u = pair_roundoff(&la, &lb, floor);
        let (measure, from_tensors) = measure_pair(
            (ba, bb),
            (i, j),
            (&mut *sa, &mut *sb),
            (&la, &lb),
            stats_basis,
        )?;
        if name.starts_with("window/in") {
            walk.window_inputs[0] += 1;
            walk.window_inputs[1] += u64::from(measure.error == 0.0 && measure.note.is_none());
        }
        let record = judge(
            rank,
            step,
            x.seq,
            name,
            &la,
            &lb,
            u,
            measure,
            (from_tensors, with_parameters),
            options,
            walk,
        );
        tally(
            record,
            (rank, step),
            (&ba.entries[..i], x),
            options,
            walk,
            out,
            &mut series,
        );
    }
    out.series.push(StepExcess {
        step,
        rank,
        excess: series,
    });
    if parted.is_some() {
        out.operators_part = parted;
    }
    Ok(())
}

/// The entries of one step's batches `ba` and `bb` (names `na` and `nb`), paired by name and
/// occurrence; each side's first record name is noted in `first_names` when none is yet.
fn pair_step(
    (ba, bb): (&Batch, &Batch),
    (na, nb): (&[String], &[String]),
    first_names: &mut [Option<String>; 2],
) -> Vec<(Option<usize>, Option<usize>)> {
    for (slot, (batch, names)) in first_names.iter_mut().zip([(ba, na), (bb, nb)]) {
        if slot.is_none() {
            *slot = batch
                .entries
                .first()
                .map(|e| names[e.name as usize].clone());
        }
    }
    pair_by_occurrence(&ba.entries, &bb.entries, na, nb)
}

/// The unit roundoff a pair of records of layouts `la` and `lb` is allowed: the larger of their
/// dtypes', at least `floor` (the run's precision) for floating ones.
fn pair_roundoff(la: &Layout, lb: &Layout, floor: f64) -> f64 {
    let ua = unit_roundoff(&la.dtype);
    let ub = unit_roundoff(&lb.dtype);
    let u = match (ua, ub) {
        (Some(p), Some(q)) => p.max(q),
        (p, q) => p.or(q).unwrap_or(0.0),
    };
    // Exact dtypes stay exact; floating ones get at least the run's precision.
    if u > 0.0 {
        u.max(floor)
    } else {
        u
    }
}

/// Measures the pair of entries `i` of `ba` and `j` of `bb` (of layouts `la` and `lb`): on
/// their tensors where both sides hold them, else their statistics (counted in `stats_basis`),
/// else their digests; with whether it was measured on the tensors.
fn measure_pair(
    (ba, bb): (&Batch, &Batch),
    (i, j): (usize, usize),
    (sa, sb): (&mut dyn RankSource, &mut dyn RankSource),
    (la, lb): (&Layout, &Layout),
    stats_basis: &mut u64,
) -> Result<(Measure, bool), AlignError> {
    let (x, y) = (&ba.entries[i], &bb.entries[j]);
    let mut from_tensors = false;
    let measure = if la.shape != lb.shape {
        Measure {
            error: f64::INFINITY,
            note: Some(format!(
                "shapes differ: A {} and B {}",
                la.describe(),
                lb.describe()
            )),
            ..Measure::default()
        }
    } else if !x.digest.is_none() && x.digest == y.digest && la.dtype == lb.dtype {
        // Bitwise equal: nothing to measure (and no tensor to read); the metrics are those
        // of equal tensors.
        let mut metrics = equal_metrics(lb.num_elements());
        if let (Some(s), Some(t)) = (ba.stats(i), bb.stats(j)) {
            metrics.stat_diffs = measure_stats(s, t, lb.num_elements()).metrics.stat_diffs;
        }
        Measure {
            magnitude: 0.0,
            metrics,
            ..Measure::default()
        }
    } else {
        match (sa.tensor(x)?, sb.tensor(y)?) {
            (Some(ta), Some(tb)) => {
                from_tensors = true;
                measure_tensors(&ta, &tb)
            }
            _ => match (ba.stats(i), bb.stats(j)) {
                (Some(s), Some(t)) => {
                    *stats_basis += 1;
                    measure_stats(s, t, lb.num_elements())
                }
                _ => {
                    *stats_basis += 1;
                    // Digests only: equal or not.
                    let differ = x.digest != y.digest;
                    Measure {
                        error: if differ { f64::INFINITY } else { 0.0 },
                        note: differ.then(|| {
                            "the digests differ and neither dump holds statistics or \
                             tensors (md5 mode): record in stats or full mode to measure"
                                .to_owned()
                        }),
                        ..Measure::default()
                    }
                }
            },
        }
    };
    Ok((measure, from_tensors))
}

/// Counts a judged `record` of `step` on `rank` into `out`: its excess into its step's
/// `series`, and, when it is not aligned, the culprits, the first culprit's chain and the rows
/// (`before`: the entries of its step before its own `entry`, for its occurrence).
fn tally(
    mut record: AlignedRecord,
    (rank, step): (u32, u64),
    (before, entry): (&[Entry], &Entry),
    options: &AlignOptions,
    walk: &mut RankWalk,
    out: &mut Alignment,
    series: &mut Vec<f32>,
) {
    out.num_records += 1;
    out.counts[record.verdict as usize] += 1;
    if options.every_record {
        out.records.push(record.clone());
    }
    series.push(if record.excess.is_finite() {
        record.excess as f32
    } else {
        f32::INFINITY
    });
    if record.verdict == Verdict::Aligned {
        if record.excess > out.closest.as_ref().map_or(0.0, |c| c.excess) {
            out.closest = Some(record);
        }
        return;
    }
    match record.blame {
        Blame::Own | Blame::Unconfirmed => {
            if out.culprits.len() < 20 {
                out.culprits.push(record.clone());
            }
            let earlier = out
                .culprit
                .as_ref()
                .is_none_or(|c| (step, record.seq, rank) < (c.step, c.seq, c.rank));
            if earlier {
                let occurrence = before.iter().filter(|e| e.name == entry.name).count();
                record.occurrence = u32::try_from(occurrence).unwrap_or(u32::MAX);
                out.culprit_index = Some((out.series.len(), series.len() - 1));
                out.culprit = Some(record.clone());
                out.chain.clear();
                out.chain_len = 0;
                walk.chain_open = true;
            } else {
                walk.chain_open = false;
            }
        }
        Blame::Inherited
            if walk.chain_open && out.culprit.as_ref().is_some_and(|c| c.rank == rank) =>
        {
            out.chain_len += 1;
            if out.chain.len() < 20 {
                out.chain.push(format!("step {step} `{}`", record.name));
            }
        }
        _ => {}
    }
    if options.max_rows == 0 || out.rows.len() < options.max_rows {
        out.rows.push(record);
    }
}

/// Where the operator traces of one step (`op/{i}/...` records, `detcheck run --inside`) first
/// run different operators: the first call, in call order, whose index or operator differs
/// between the sides, or that one side lacks; `None` when the records are no operator trace or
/// the calls agree.
fn operators_part(
    rank: u32,
    step: u64,
    (ba, na): (&Batch, &[String]),
    (bb, nb): (&Batch, &[String]),
    environments: [Option<&Environment>; 2],
) -> Option<OperatorsPart> {
    let calls = |batch: &Batch, names: &[String]| {
        let mut calls: Vec<(u32, String, String)> = Vec::new();
        for e in &batch.entries {
            if let Some(r) = operator_call(&names[e.name as usize]) {
                if calls.last().is_none_or(|c| c.0 != r.index) {
                    calls.push((r.index, r.operator.to_owned(), r.module.to_owned()));
                }
            }
        }
        calls
    };
    let (ca, cb) = (calls(ba, na), calls(bb, nb));
    let k = (0..ca.len().max(cb.len())).find(|&k| match (ca.get(k), cb.get(k)) {
        (Some(x), Some(y)) => (x.0, &x.1) != (y.0, &y.1),
        _ => true,
    })?;
    let call = match (ca.get(k), cb.get(k)) {
        (Some(x), Some(y)) => x.0.min(y.0),
        (x, y) => x.or(y).map_or(0, |c| c.0),
    };
    let at = |calls: &[(u32, String, String)]| calls.get(k).filter(|c| c.0 == call).cloned();
    let (a, b) = (at(&ca), at(&cb));
    let module = a
        .as_ref()
        .or(b.as_ref())
        .map_or_else(String::new, |c| c.2.clone());
    let operator =
        |c: Option<(u32, String, String)>| c.map_or_else(|| "(none)".to_owned(), |c| c.1);
    let skipped = [(ba, na), (bb, nb)]
        .iter()
        .map(|(batch, names)| {
            batch
                .entries
                .iter()
                .filter(|e| operator_call(&names[e.name as usize]).is_some_and(|r| r.index >= call))
                .count() as u64
        })
        .sum();
    let (left, right) = (operator(a), operator(b));
    Some(OperatorsPart {
        rank,
        step,
        call,
        at: OperatorCallText::of(call, &left, &module, environments),
        module,
        left,
        right,
        skipped,
    })
}

/// The verdict and blame of one measured pair, and the walk moved past it.
#[allow(clippy::too_many_arguments)]
fn judge(
    rank: u32,
    step: u64,
    seq: u32,
    name: String,
    la: &Layout,
    lb: &Layout,
    u: f64,
    m: Measure,
    (from_tensors, with_parameters): (bool, bool),
    options: &AlignOptions,
    walk: &mut RankWalk,
) -> AlignedRecord {
    let relative = if m.error == 0.0 {
        0.0
    } else if m.spread > 0.0 {
        m.error / m.spread
    } else {
        f64::INFINITY
    };
    let rounding = options.rounding_units * u * m.magnitude;
    let allowance_of = |rho: f64| {
        if rho == f64::INFINITY {
            // A NaN or infinity before it explains anything after it.
            return f64::INFINITY;
        }
        let inherited = options.growth * rho * m.spread;
        rounding.max(if inherited.is_nan() { 0.0 } else { inherited })
    };
    // An output of a call whose inputs were recorded is allowed their errors alone.
    let part = call_part(&name);
    let inputs = match (part, &walk.call) {
        (Some((call, false)), Some(c)) if c.call == call && !with_parameters => Some(c),
        _ => None,
    };
    // A window input of an operator trace (`run --inside`) is where the trace starts, and so
    // is an operator's input from outside the window (a parameter, a buffer): its error was
    // made before the module, so any is allowed, and it is what the module's own operators
    // inherit. (A Python float among an operator's arguments is judged: a constant that
    // differs, an `eps`, is the module's own.)
    let given = name.starts_with("window/in")
        || name.starts_with("window/grad_out")
        || operator_call(&name).is_some_and(|r| r.from_outside);
    let allowance = if given {
        f64::INFINITY
    } else {
        allowance_of(inputs.map_or(walk.clean, |c| c.clean))
    };
    let excess = if m.error == 0.0 {
        0.0
    } else if allowance > 0.0 {
        m.error / allowance
    } else {
        f64::INFINITY
    };
    let mut note = m.note;
    let verdict = if note.is_some() || (u == 0.0 && m.error > 0.0) {
        if note.is_none() {
            note = Some(format!("an exact dtype ({}) whose values differ", la.dtype));
        }
        Verdict::Error
    } else if excess <= 1.0 {
        Verdict::Aligned
    } else if excess <= options.error_excess {
        Verdict::Warning
    } else {
        Verdict::Error
    };
    // Blame looks at every earlier record: a module's output inherits the error of an API
    // inside it (recorded before it, and no input of its call).
    let inputs_seen =
        matches!((part, &walk.call), (Some((call, false)), Some(c)) if c.call == call);
    let blame = match verdict {
        Verdict::Aligned => Blame::None,
        _ if walk.tainted && m.error <= allowance_of(walk.all) => Blame::Inherited,
        _ if has_input_evidence(&name, part, inputs_seen, walk.flow) => Blame::Own,
        _ => Blame::Unconfirmed,
    };
    if let Some((call, true)) = part {
        if walk.call.as_ref().is_none_or(|c| c.call != call) {
            walk.call = Some(CallInputs {
                call: call.to_owned(),
                ..CallInputs::default()
            });
        }
        let c = walk.call.as_mut().expect("set above");
        if verdict == Verdict::Aligned {
            c.clean = c.clean.max(relative);
        }
    }
    if verdict == Verdict::Aligned {
        walk.clean = walk.clean.max(relative);
    } else {
        walk.tainted = true;
    }
    walk.all = walk.all.max(relative);
    AlignedRecord {
        step,
        rank,
        seq,
        name,
        occurrence: 0,
        left: la.describe(),
        right: lb.describe(),
        from_tensors,
        error: m.error,
        allowance,
        excess,
        relative,
        verdict,
        blame,
        metrics: m.metrics,
        note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::{compare_dumps, CompareOptions};
    use crate::file::{DumpMode, TraceWriter};
    use half::bf16;

    /// Deterministic inputs in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// y = W x for a 32x32 W, summed forward (the reference) or backward (another device).
    fn dense(x: &[f32], seed: u64, backward: bool) -> Vec<f32> {
        let w = values(x.len() * 32, seed);
        (0..32)
            .map(|i| {
                let row = &w[i * x.len()..(i + 1) * x.len()];
                let terms = row.iter().zip(x).map(|(a, b)| a * b);
                if backward {
                    terms.rev().sum()
                } else {
                    terms.sum()
                }
            })
            .collect()
    }

    /// What a planted bug does on the other device.
    #[derive(Clone, Copy, PartialEq)]
    enum Bug {
        None,
        /// The activation's output off by 1e-4 relative (an approximate kernel).
        ApproxActivation,
        /// NaN in the activation's output.
        Nan,
    }

    /// The records of one step of a small network, as `run --dump` records it: its input,
    /// `dense1`, the input of `recenter` (code between the modules added 1000 or 0: lossy but
    /// correct), `recenter` (the mean subtracted: ill-conditioned but correct after the
    /// offset), `act`, `dense2`.
    fn network(other: bool, bug: Bug) -> Vec<(&'static str, Vec<f32>)> {
        network_at(other, bug, 1000.0)
    }

    fn network_at(other: bool, bug: Bug, shift: f32) -> Vec<(&'static str, Vec<f32>)> {
        let x = values(64, 1);
        let h = dense(&x, 2, other);
        let offset: Vec<f32> = h.iter().map(|v| v + shift).collect();
        let mean = offset.iter().sum::<f32>() / offset.len() as f32;
        let recenter: Vec<f32> = offset.iter().map(|v| v - mean).collect();
        let mut act: Vec<f32> = recenter.iter().map(|v| v.tanh()).collect();
        if other {
            match bug {
                Bug::None => {}
                Bug::ApproxActivation => act.iter_mut().for_each(|v| *v *= 1.0 + 1e-4),
                Bug::Nan => act[3] = f32::NAN,
            }
        }
        let out = dense(&act, 3, other);
        vec![
            ("in/(model).0", x),
            ("fwd/dense1", h),
            ("in/recenter.0", offset),
            ("fwd/recenter", recenter),
            ("fwd/act", act),
            ("fwd/dense2", out),
        ]
    }

    /// A dump of `records`, whose recorder vouches for the data flow (`site:flow`).
    fn dump(records: &[(&str, Vec<f32>)], mode: DumpMode) -> tempfile::TempDir {
        dump_of(records, mode, true)
    }

    fn dump_of(records: &[(&str, Vec<f32>)], mode: DumpMode, flow: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut w = TraceWriter::create(dir.path(), 0, 1, mode).unwrap();
        if flow {
            w.set_environment(FLOW_KEY, "module inputs").unwrap();
        }
        for (name, v) in records {
            w.record(0, name, &Tensor::from_vec(v.clone())).unwrap();
        }
        w.finish().unwrap();
        dir
    }

    fn align(a: &tempfile::TempDir, b: &tempfile::TempDir) -> Alignment {
        align_dumps(a.path(), b.path(), &AlignOptions::default()).unwrap()
    }

    #[test]
    fn rounding_everywhere_is_aligned_though_no_tensor_is_bitwise_equal() {
        let (a, b) = (
            dump(&network(true, Bug::None), DumpMode::Full),
            dump(&network(false, Bug::None), DumpMode::Full),
        );
        let al = align(&a, &b);
        assert!(al.is_aligned(), "{:#?}", al.rows);
        assert_eq!(al.num_records, 6);
        assert!(al.culprit.is_none());
        // The subtraction after the offset (errors ~1e-4 relative to its values) is aligned:
        // its error is the offset's rounding, inherited.
        let bitwise = compare_dumps(a.path(), b.path(), &CompareOptions::default()).unwrap();
        assert!(bitwise.num_differing >= 4, "{}", bitwise.num_differing);
    }

    /// An offset added between two modules (no module's output holds it), then a correct
    /// but ill-conditioned module (the mean subtracted): where the dumps hold that module's
    /// input (`in/recenter.0`, `run --dump`'s data flow) it is aligned; where they do not, its
    /// error is beyond what the records before it explain, and it is a culprit only
    /// `unconfirmed`, never `own` (issue 53: the correct norm was `error, own, 32x`).
    #[test]
    fn an_error_made_between_modules_is_never_a_modules_own_without_its_input() {
        let without_input = |other| {
            network(other, Bug::None)
                .into_iter()
                .filter(|(name, _)| *name != "in/recenter.0")
                .collect::<Vec<_>>()
        };
        for flow in [false, true] {
            let a = dump_of(&without_input(true), DumpMode::Full, flow);
            let b = dump_of(&without_input(false), DumpMode::Full, flow);
            let al = align(&a, &b);
            let c = al
                .culprit
                .as_ref()
                .expect("the recentring is beyond its allowance");
            assert_eq!(c.name, "fwd/recenter", "{c:?}");
            // With the flow vouched for but the input missing (a dump that lost it), the
            // module's output would count as its own: the flow is what makes it so.
            let blame = if flow { Blame::Own } else { Blame::Unconfirmed };
            assert_eq!(c.blame, blame, "{c:?}");
            assert!(c
                .blame
                .reason()
                .contains(if flow { "its own" } else { "unconfirmed" }));
        }
        let (a, b) = (
            dump(&network(true, Bug::None), DumpMode::Full),
            dump(&network(false, Bug::None), DumpMode::Full),
        );
        assert!(align(&a, &b).is_aligned());
        // A culprit with evidence stays named without the flow: a call's output after its own
        // input records (msprobe's names).
        let msprobe = |other| {
            network_at(other, Bug::ApproxActivation, 0.0)
                .into_iter()
                .map(|(name, v)| {
                    let name = match name {
                        "fwd/recenter" => "Functional.tanh.0.forward.input.0",
                        "fwd/act" => "Functional.tanh.0.forward.output.0",
                        other => other,
                    };
                    (name, v)
                })
                .filter(|(name, _)| !name.starts_with("in/recenter"))
                .collect::<Vec<_>>()
        };
        let (a, b) = (
            dump_of(&msprobe(true), DumpMode::Full, false),
            dump_of(&msprobe(false), DumpMode::Full, false),
        );
        let al = align(&a, &b);
        let own: Vec<_> = al
            .culprits
            .iter()
            .filter(|c| c.blame == Blame::Own)
            .map(|c| c.name.as_str())
            .collect();
        assert!(
            own.contains(&"Functional.tanh.0.forward.output.0"),
            "{:#?}",
            al.culprits
        );
    }

    #[test]
    fn the_first_record_whose_error_is_its_own_is_the_culprit_and_later_ones_inherit() {
        let a = dump(
            &network_at(true, Bug::ApproxActivation, 0.0),
            DumpMode::Full,
        );
        let b = dump(&network_at(false, Bug::None, 0.0), DumpMode::Full);
        let al = align(&a, &b);
        assert!(!al.is_aligned());
        let c = al.culprit.as_ref().expect("a culprit");
        assert_eq!((c.name.as_str(), c.blame), ("fwd/act", Blame::Own), "{c:?}");
        assert!(c.excess > 1.0 && c.from_tensors, "{c:?}");
        // msprobe's columns: 1e-4 relative everywhere passes its 1e-3 ratio.
        assert_eq!(c.metrics.one_thousandth, Some(1.0), "{:?}", c.metrics);
        assert!(c.metrics.cosine.unwrap() > 0.999_999);
        let later = al.rows.iter().find(|r| r.name == "fwd/dense2");
        if let Some(r) = later {
            assert_eq!(r.blame, Blame::Inherited, "{r:?}");
        }
        // A looser growth rule cannot hide it: the rounding floor alone is far below it.
        let loose = AlignOptions {
            rounding_units: 64.0,
            ..AlignOptions::default()
        };
        let al = align_dumps(a.path(), b.path(), &loose).unwrap();
        assert_eq!(al.culprit.map(|c| c.name), Some("fwd/act".to_owned()));
        // The documented limit: after the offset of 1000 every value carries ~1e-4 of its
        // spread in rounding, so an error of 1e-4 after it is counted as inherited.
        let a = dump(&network(true, Bug::ApproxActivation), DumpMode::Full);
        let b = dump(&network(false, Bug::None), DumpMode::Full);
        assert!(align(&a, &b).is_aligned());
    }

    #[test]
    fn non_finite_values_on_one_side_are_an_error_naming_the_record() {
        let a = dump(&network(true, Bug::Nan), DumpMode::Full);
        let b = dump(&network(false, Bug::None), DumpMode::Full);
        let al = align(&a, &b);
        let c = al.culprit.expect("a culprit");
        assert_eq!((c.name.as_str(), c.verdict), ("fwd/act", Verdict::Error));
        let note = c.note.expect("a note");
        assert!(
            note.contains("flat index 3") && note.contains("NaN"),
            "{note}"
        );
        // NaN on both sides at the same places is no difference (as msprobe sets them to 0).
        let b = dump(&network(true, Bug::Nan), DumpMode::Full);
        assert!(align(&a, &b).is_aligned());
    }

    #[test]
    fn shapes_and_exact_values_that_differ_are_errors() {
        let a = dump(&[("x", vec![1.0, 2.0, 3.0])], DumpMode::Full);
        let b = dump(&[("x", vec![1.0, 2.0])], DumpMode::Full);
        let al = align(&a, &b);
        let c = al.culprit.expect("a culprit");
        assert!(c.note.unwrap().contains("shapes differ"));
        let write = |v: Vec<i64>| {
            let dir = tempfile::tempdir().unwrap();
            let mut w = TraceWriter::create(dir.path(), 0, 1, DumpMode::Full).unwrap();
            w.record(0, "ids", &Tensor::from_vec(v)).unwrap();
            w.finish().unwrap();
            dir
        };
        let al = align(&write(vec![1, 2, 3]), &write(vec![1, 2, 4]));
        let c = al.culprit.expect("a culprit");
        assert_eq!(c.verdict, Verdict::Error);
        assert!(c.note.unwrap().contains("exact dtype"));
        assert!(align(&write(vec![1, 2, 3]), &write(vec![1, 2, 3])).is_aligned());
    }

    #[test]
    fn dumps_that_cannot_be_aligned_are_errors() {
        let one = dump(&[("x", vec![1.0])], DumpMode::Full);
        let other = dump(&[("y", vec![1.0])], DumpMode::Full);
        let err = align_dumps(one.path(), other.path(), &AlignOptions::default()).unwrap_err();
        assert!(
            matches!(&err, AlignError::NothingInCommon { left, right } if left == "x" && right == "y"),
            "{err}"
        );
        let two = tempfile::tempdir().unwrap();
        for rank in 0..2 {
            let mut w = TraceWriter::create(two.path(), rank, 2, DumpMode::Full).unwrap();
            w.record(0, "x", &Tensor::from_vec(vec![1.0f32])).unwrap();
            w.finish().unwrap();
        }
        let err = align_dumps(one.path(), two.path(), &AlignOptions::default()).unwrap_err();
        assert!(
            err.to_string().starts_with("A has 1 ranks and B has 2"),
            "{err}"
        );
    }

    #[test]
    fn statistics_give_a_lower_bound_that_still_finds_a_gross_error() {
        let mut gross = network(true, Bug::None);
        gross[4].1.iter_mut().for_each(|v| *v *= 1.01);
        let (a, b) = (
            dump(&gross, DumpMode::Stats),
            dump(&network(false, Bug::None), DumpMode::Stats),
        );
        let al = align(&a, &b);
        let c = al.culprit.expect("a culprit");
        assert_eq!(c.name, "fwd/act");
        assert!(!c.from_tensors && c.metrics.stat_diffs.is_some());
        assert!(
            al.notes.iter().any(|n| n.contains("statistics")),
            "{:?}",
            al.notes
        );
        let (a, b) = (
            dump(&network(true, Bug::None), DumpMode::Stats),
            dump(&network(false, Bug::None), DumpMode::Stats),
        );
        assert!(align(&a, &b).is_aligned());
    }

    #[test]
    fn a_bf16_run_aligns_with_its_f32_reference_at_bf16_rounding() {
        let reference = network(false, Bug::None);
        let to_bf16 = |v: &[f32]| -> Vec<bf16> { v.iter().map(|&x| bf16::from_f32(x)).collect() };
        let write = |records: &[(&str, Vec<f32>)], low: bool| {
            let dir = tempfile::tempdir().unwrap();
            let mut w = TraceWriter::create(dir.path(), 0, 1, DumpMode::Full).unwrap();
            for (name, v) in records {
                let t = if low && *name != "in/(model).0" {
                    Tensor::from_vec(to_bf16(v))
                } else {
                    Tensor::from_vec(v.clone())
                };
                w.record(0, name, &t).unwrap();
            }
            w.finish().unwrap();
            dir
        };
        let (a, b) = (write(&reference, true), write(&reference, false));
        let al = align(&a, &b);
        assert!(al.is_aligned(), "{:#?}", al.rows);
        // The same values stored as f32 are held to f32's rounding unless --precision says.
        let as_f32: Vec<(&str, Vec<f32>)> = reference
            .iter()
            .map(|(n, v)| (*n, to_bf16(v).iter().map(|x| x.to_f32()).collect()))
            .collect();
        let a32 = write(&as_f32, false);
        assert!(!align(&a32, &b).is_aligned());
        let bf = AlignOptions {
            precision: Some("bf16".into()),
            ..AlignOptions::default()
        };
        assert!(align_dumps(a32.path(), b.path(), &bf).unwrap().is_aligned());
    }

    #[test]
    fn unit_roundoffs_follow_the_names_dumps_use() {
        assert_eq!(unit_roundoff("f32"), Some(2f64.powi(-24)));
        assert_eq!(unit_roundoff("torch.bfloat16"), Some(2f64.powi(-8)));
        assert_eq!(unit_roundoff("Float16"), Some(2f64.powi(-11)));
        assert_eq!(unit_roundoff("torch.int64"), Some(0.0));
        assert_eq!(unit_roundoff("quaternion"), None);
    }

    /// An output judged against its own call's inputs where the names say which they are (an
    /// msprobe dump's), and against every earlier record where they do not: after a record
    /// aligned by its rounding at magnitude 1000 (a relative error of 5e-4 of its floored
    /// spread), an error of 1e-4 is inherited, unless the call's recorded inputs are exact.
    #[test]
    fn an_output_inherits_from_its_own_calls_inputs_where_the_dump_names_them() {
        let ramp: Vec<f32> = (0..64).map(|i| i as f32 * 0.1).collect();
        let mut bumped = ramp.clone();
        bumped[7] += 1e-4;
        let pairs = |names: [&str; 3]| {
            let a = dump(
                &[
                    (names[0], vec![1000.0005; 8]),
                    (names[1], ramp.clone()),
                    (names[2], bumped.clone()),
                ],
                DumpMode::Full,
            );
            let b = dump(
                &[
                    (names[0], vec![1000.0; 8]),
                    (names[1], ramp.clone()),
                    (names[2], ramp.clone()),
                ],
                DumpMode::Full,
            );
            align(&a, &b)
        };
        // msprobe's call records, and an operator trace's (`run --inside`), name each call's
        // inputs and outputs.
        let named = [
            [
                "Tensor.mean.0.forward.output.0",
                "Functional.act.0.forward.input.0",
                "Functional.act.0.forward.output.0",
            ],
            [
                "op/0000/m/aten.mean.dim/out0",
                "op/0001/m/aten.gelu.default/in0",
                "op/0001/m/aten.gelu.default/out0",
            ],
        ];
        let [msprobe, operators] = named.map(|names| {
            let al = pairs(names);
            let culprit = al.culprit.as_ref().expect("a culprit");
            assert_eq!(
                (culprit.name.as_str(), culprit.blame),
                (names[2], Blame::Own)
            );
            al
        });
        assert_eq!(msprobe.culprit_call, None);
        let traces = pairs(["fwd/mean", "fwd/act_in", "fwd/act"]);
        assert!(traces.is_aligned(), "{:#?}", traces.rows);
        let call = operators.culprit_call.as_ref().expect("the culprit's call");
        assert_eq!(
            (call.index, call.operator.as_str()),
            (1, "aten.gelu.default")
        );
    }

    /// A module's inputs, and its operators' inputs from outside the window (parameters), are
    /// where its operator trace starts: their error, made before it, is no culprit, and the
    /// operators that pass it on inherit it; one that adds its own is still named.
    #[test]
    fn a_window_input_that_differs_is_what_the_module_inherits() {
        let x = values(64, 3);
        let x_a: Vec<f32> = x.iter().map(|v| v * (1.0 + 1e-5)).collect();
        let trace = |input: &[f32], out: Vec<f32>| {
            let name = "op/0000/m/aten.mul.Tensor";
            let records = [
                ("window/in0".to_owned(), input.to_vec()),
                (format!("{name}/in0<in0"), input.to_vec()),
                // A parameter: made before the window, as the input was.
                (format!("{name}/in1"), input.to_vec()),
                (format!("{name}/out0"), out),
            ];
            let records: Vec<(&str, Vec<f32>)> = records
                .iter()
                .map(|(n, v)| (n.as_str(), v.clone()))
                .collect();
            dump(&records, DumpMode::Full)
        };
        let double = |v: &[f32]| v.iter().map(|x| 2.0 * x).collect::<Vec<f32>>();
        let b = trace(&x, double(&x));
        let al = align(&trace(&x_a, double(&x_a)), &b);
        assert!(al.is_aligned(), "{:#?}", al.rows);
        let mut wrong = double(&x_a);
        wrong[5] += 0.05;
        let al = align(&trace(&x_a, wrong), &b);
        let culprit = al.culprit.expect("a culprit");
        assert_eq!(culprit.name, "op/0000/m/aten.mul.Tensor/out0");
    }

    /// Two operator traces of one module computed two ways (`run --inside`, `--replay`): the
    /// calls are compared up to where they part, never a call of one side with an unrelated
    /// call of the same name and number on the other; the module's outputs are compared, and
    /// the report says where the operators part, with each side's call and line.
    #[test]
    fn operator_traces_are_compared_up_to_where_their_operators_part() {
        let x = values(64, 1);
        let mean = x.iter().sum::<f32>() / 64.0;
        let y: Vec<f32> = x.iter().map(|v| v - mean).collect();
        let mut y_bad = y.clone();
        y_bad[3] += 1e-3;
        let side = |second: &str, added: Vec<f32>, out: Vec<f32>, line: &str| {
            let dir = tempfile::tempdir().unwrap();
            let mut w = TraceWriter::create(dir.path(), 0, 1, DumpMode::Full).unwrap();
            let records = [
                ("window/in0".to_owned(), x.clone()),
                ("op/0000/m/aten.mean.dim/in0<in0".to_owned(), x.clone()),
                ("op/0000/m/aten.mean.dim/out0".to_owned(), vec![mean]),
                (format!("op/0001/m/{second}/in0<in0"), x.clone()),
                (format!("op/0001/m/{second}/out0"), x.clone()),
                ("op/0002/m/aten.add.Tensor/out0".to_owned(), added),
                ("window/out0".to_owned(), out),
            ];
            for (name, v) in records {
                w.record(0, &name, &Tensor::from_vec(v)).unwrap();
            }
            w.set_environment("site:op:1", line).unwrap();
            w.set_environment("site:call:1", &format!("{second}(float32[64])"))
                .unwrap();
            w.finish().unwrap();
            dir
        };
        let a = side("aten.mul.Tensor", vec![7.0; 64], y_bad, "train.py:64");
        let b = side("aten.sub.Tensor", vec![-7.0; 64], y, "train.py:66");
        let al = align(&a, &b);
        let part = al.operators_part.as_ref().expect("the operators part");
        assert_eq!(
            (part.call, part.left.as_str(), part.right.as_str()),
            (1, "aten.mul.Tensor", "aten.sub.Tensor")
        );
        assert_eq!(part.skipped, 6, "calls 1 and 2 of both sides");
        let shown = part.to_string();
        assert!(
            shown.contains("`aten.mul.Tensor(float32[64])` at train.py:64"),
            "{shown}"
        );
        assert!(
            shown.contains("`aten.sub.Tensor(float32[64])` at train.py:66"),
            "{shown}"
        );
        // window/in0, call 0's input and output, window/out0: the adds are never paired.
        assert_eq!(al.num_records, 4);
        let culprit = al.culprit.as_ref().expect("a culprit");
        assert_eq!(
            (culprit.name.as_str(), culprit.blame),
            ("window/out0", Blame::Own)
        );
        assert!(
            al.notes
                .iter()
                .any(|n| n.contains("same inputs on both sides")),
            "{:?}",
            al.notes
        );
        assert!(
            !al.notes.iter().any(|n| n.contains("only in")),
            "{:?}",
            al.notes
        );
        // The same calls on both sides: nothing parts.
        let c = side(
            "aten.sub.Tensor",
            vec![-7.0; 64],
            values(64, 1),
            "train.py:66",
        );
        let same = align(&c, &b);
        assert_eq!(same.operators_part, None);
        assert_eq!(same.num_records, 7);
    }

    #[test]
    fn msprobe_calls_are_told_by_their_inputs_and_outputs() {
        let api = "Functional.gelu.0.forward";
        assert_eq!(call_part(&format!("{api}.input.0")), Some((api, true)));
        assert_eq!(call_part(&format!("{api}.input.w")), Some((api, true)));
        assert_eq!(call_part(&format!("{api}.output.0")), Some((api, false)));
        let module = "Module.blocks.1.act.Gelu.forward.0";
        assert_eq!(
            call_part(&format!("{module}.output.0")),
            Some((module, false))
        );
        let back = "Module.fc.Linear.backward.12";
        assert_eq!(call_part(&format!("{back}.input.0")), Some((back, true)));
        for name in [
            "fwd/blocks.1.act",
            "Module.fc.Linear.forward.0.parameters.weight",
            "Module.fc.Linear.parameters_grad.0.weight",
            "Functional.gelu.0.output.0",
            "Functional.in.0.forward.output.0.input.1",
        ] {
            assert_eq!(call_part(name), None, "{name}");
        }
    }

    /// `compare --align` reads each full-mode step file once and checks every tensor it reads
    /// against its record's digest instead of the file's md5: a changed byte anywhere in a
    /// tensor file is still an error naming the file, never "aligned".
    #[test]
    fn every_changed_byte_of_a_tensor_file_is_an_error_of_align() {
        let a = dump(&network(true, Bug::None), DumpMode::Full);
        let b = dump(&network(true, Bug::None), DumpMode::Full);
        assert!(align(&a, &b).is_aligned());
        let file = crate::file::tensor_path(a.path(), 0, 0);
        let good = std::fs::read(&file).unwrap();
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        let mut missed = Vec::new();
        for at in 0..good.len() {
            for mask in [0x01u8, 0x10, 0x80] {
                let mut bad = good.clone();
                bad[at] ^= mask;
                std::fs::write(&file, &bad).unwrap();
                match align_dumps(a.path(), b.path(), &AlignOptions::default()) {
                    Err(e) if e.to_string().contains(&name) => {}
                    other => missed.push((at, mask, other.map(|al| al.is_aligned()))),
                }
            }
        }
        std::fs::write(&file, &good).unwrap();
        assert!(
            missed.is_empty(),
            "{} of {}: {:?}",
            missed.len(),
            good.len() * 3,
            &missed[..missed.len().min(8)]
        );
        assert!(align(&a, &b).is_aligned());
    }
}

#[cfg(test)]
mod msprobe_parity {
    //! msprobe 26.2's own numbers for small pairs (its `ValidateTensor` then `compare_ops_apply`,
    //! run on these arrays in target/venv-msprobe): `measure_tensors` must give them exactly.
    use super::*;
    use crate::value::tensor::TensorData;

    fn f32s(v: &[f32]) -> Tensor {
        Tensor::new(vec![v.len()], TensorData::F32(v.to_vec())).unwrap()
    }

    fn f64s(v: &[f64]) -> Tensor {
        Tensor::new(vec![v.len()], TensorData::F64(v.to_vec())).unwrap()
    }

    /// (cosine, euc_dist, max_abs_err, max_rel_err, one_thousandth, five_thousandths).
    type Six = [Option<f64>; 6];

    fn six(m: &AlignMetrics) -> Six {
        [
            m.cosine,
            m.euc_dist,
            m.max_abs_err,
            m.max_rel_err,
            m.one_thousandth,
            m.five_thousandths,
        ]
    }

    fn assert_six(got: Six, want: Six) {
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            match (g, w) {
                (Some(g), Some(w)) => assert!(
                    (g - w).abs() <= 1e-15 * w.abs().max(1.0),
                    "column {k}: {g} vs msprobe's {w} ({got:?})"
                ),
                _ => assert_eq!(*g, w, "column {k} ({got:?})"),
            }
        }
    }

    const A: [f64; 7] = [1.0, 3.003, 0.001, 0.0, -2.5, 1e-3, 7.0];
    const B: [f64; 7] = [1.000_000_1, 3.0, 0.0, 0.0, -2.4999, 1.001e-3, 7.0];

    #[test]
    fn float32_relative_errors_and_rounding() {
        let (a, b) = (A.map(|x| x as f32), B.map(|x| x as f32));
        let m = measure_tensors(&f32s(&a), &f32s(&b));
        assert!(m.note.is_none());
        assert_six(
            six(&m.metrics),
            [
                Some(1.0),
                Some(0.003_163_875_231_757_658),
                Some(0.003_000_020_981),
                Some(8_388.608_398_437_5),
                Some(0.714_285_714_286),
                Some(0.857_142_857_143),
            ],
        );
    }

    #[test]
    fn float64_relative_errors() {
        let m = measure_tensors(&f64s(&A), &f64s(&B));
        assert_six(
            six(&m.metrics),
            [
                Some(1.0),
                Some(0.003_163_858_563_526_619_8),
                Some(0.003),
                Some(4_503_599_627_370.496),
                Some(0.714_285_714_286),
                Some(0.857_142_857_143),
            ],
        );
    }

    #[test]
    fn a_single_value_has_no_cosine_distance_or_ratios() {
        let m = measure_tensors(&f32s(&[2.0]), &f32s(&[1.0]));
        assert_six(
            six(&m.metrics),
            [None, None, Some(1.0), Some(1.0), None, None],
        );
    }

    #[test]
    fn non_finite_values_at_the_same_places_are_zeroed() {
        let a = [f32::INFINITY, f32::NAN, 1.0, 2.0];
        let b = [f32::NEG_INFINITY, f32::NAN, 1.5, 2.0];
        let m = measure_tensors(&f32s(&a), &f32s(&b));
        assert_six(
            six(&m.metrics),
            [
                Some(0.983_869_910_1),
                Some(0.5),
                Some(0.5),
                Some(0.333_333_343_267),
                Some(0.75),
                Some(0.75),
            ],
        );
        // Infinities of opposite signs: msprobe's metrics, and an error of ours.
        assert!(m.note.unwrap().contains("opposite signs"));
        let m = measure_tensors(&f32s(&[f32::INFINITY, 1.0]), &f32s(&[1.0, 1.0]));
        assert_six(six(&m.metrics), [None; 6]);
        assert!(m.note.unwrap().contains("different places"));
    }

    #[test]
    fn zeros() {
        let m = measure_tensors(&f32s(&[0.0, 0.0]), &f32s(&[0.0, 0.0]));
        let want = [
            Some(1.0),
            Some(0.0),
            Some(0.0),
            Some(0.0),
            Some(1.0),
            Some(1.0),
        ];
        assert_six(six(&m.metrics), want);
        assert_six(six(&equal_metrics(2)), want);
        // A zero bench: no cosine (msprobe's `Nan`), epsilon added to both sides.
        let m = measure_tensors(&f32s(&[1.0, 2.0]), &f32s(&[0.0, 0.0]));
        assert_six(
            six(&m.metrics),
            [
                None,
                Some(2.236_067_977_499_79),
                Some(2.0),
                Some(16_777_215.0),
                Some(0.0),
                Some(0.0),
            ],
        );
    }
}
