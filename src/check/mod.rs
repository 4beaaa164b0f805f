//! Checks: properties verified by running a scenario and comparing traces.
//!
//! [`run_checks`] runs a [`LoadedScenario`] (on thread ranks; [`Session::run_checks`] under MPI
//! too) and evaluates its checks:
//! - `repeat` (CIME's REP): two runs of the same configuration, each under a different
//!   perturbation (seeded delays, a rotated arrival order), compared record by record;
//! - `replicas`: in each run, every rank's replicated records (data-parallel parameters) equal
//!   rank 0's;
//! - `backends`: under MPI, run 1 against the same run on thread ranks;
//! - `world_sizes`: rank 0's replicated records at each of the spec's world sizes;
//! - `workers`: the run at each data-loader worker count;
//! - `restart`: a run checkpointed and resumed in a fresh launch against the continuous run;
//! - `buckets`: the run with each of the spec's allreduce bucket layouts;
//! - `variants`: run 1 again under each of the spec's variants;
//! - `devices` (feature `nccl`): run 1 with its collectives on a GPU (thread ranks sharing it)
//!   against the same run on CPU thread ranks; skipped, with the reason, where no GPU is usable;
//! - `batch_sizes`: a `command` program at each of the spec's batch sizes, each sample's records
//!   (a record's step is its sample) against the first size's.
//!
//! Each kind is a unit in `kinds/`, one file each behind one trait (`kinds::CheckUnit`): the runs
//! it needs beyond run 1 and run 2, how it compares them, its two sides, and what a drill-down
//! re-runs. `run_checks_on` makes run 1 (and run 2 when `repeat` is asked), asks each kind's unit
//! in the order of the scenario's checks, and then does what is common to all: n/a for a check
//! that compared nothing, the element detail (`element.rs`), the cause of a program's `repeat`,
//! `--deterministic`'s settings (`settings.rs`) and the unperturbed runs.
//!
//! Every check's verdict and its divergence map come from one pass of the comparison engine
//! (`crate::compare`). Each check has an [`Expectation`]: `identical`, or `diverges` for a
//! negative control, which holds only when the check finds a divergence. A [`ScenarioReport`]
//! holds the outcomes; it is data, and a failed check is not an `Err`. `Err` ([`RunError`])
//! means a run itself failed.
//!
//! Invariant (a verdict is earned): a check that compared nothing is n/a with its reason
//! (`CheckOutcome::skipped`, `empty`), never a pass; a scenario whose every check is n/a has not
//! passed. A launched program's passing `repeat` is also run unperturbed (`DETCHECK_RECORD=end`:
//! nothing read during its steps) and its end state compared (`compare_end_states`): a difference
//! hidden by recording fails with the cause `timing`; unless its recorded run shows that
//! recording cannot change what it computes (`synchronous`: each rank one process on the CPU,
//! no thread or process of its own, ranks joined by gloo with no collective left running),
//! where an unperturbed run would compute what the recorded runs did.
//!
//! Invariant (the perturbations of a check are seeded): a check gives the same verdict every time,
//! and run 2's arrival order differs from run 1's in every collective. MPI ranks too: under a
//! perturbation a round's contributions count in its seeded order, never in the order
//! `MPI_ANY_SOURCE` delivered them (`comm/mpi.rs`, `round_order`).
//!
//! Determinism: the perturbations are derived from the scenario's seed, so a check is repeatable;
//! the two runs' perturbations differ in every round, so an order-dependent reduction with three or
//! more ranks is caught every time.

mod kinds;
mod session;

pub use crate::diagnose::SettingsFinding;
pub use crate::run::{CheckOptions, RunError, Unperturbed};
pub use kinds::ONE_RANK_HAS_NO_REPLICAS;
#[cfg(feature = "mpi")]
pub use session::run_on_mpi_world;
pub use session::{launcher_rank, launcher_size, mpi_skip_reason, Session, SessionError};

use crate::compare::curves::Curve;
use crate::compare::{
    compare_traces, CauseClass, Comparison, Divergence, DivergenceMap, RecordSummary, TraceView,
};
use crate::diagnose::decide_cause;
use crate::record::overflow::{first_overflow, Overflow};
use crate::record::Trace;
use crate::run::{perturbation, runner_for, RunRequest, Runner, ThreadRunner};
use crate::scenario::{CheckKind, Expectation, LoadedScenario, Program, RunPlan};
use crate::value::digest::{ExactF64, Stats};
use kinds::{backends_applies, Compared, Pair, Runs};
use std::fmt::Write as _;
use std::sync::Arc;

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct CheckOutcome {
    /// The check.
    pub kind: CheckKind,
    /// What it had to find.
    pub expectation: Expectation,
    /// What it found: the one comparison its verdict and its divergence map come from.
    pub comparison: Comparison,
    /// Why the check is n/a, when it is: it could not run here (`backends` on thread ranks,
    /// `devices` without a GPU), or it ran and compared nothing (no record in common, no
    /// replicated record). A check that compared nothing is never a pass.
    pub skipped: Option<String>,
    /// `true` when the check ran and compared nothing ([`CheckOutcome::skipped`] says why):
    /// an n/a found in the program, not in this machine, and shown with the report.
    pub empty: bool,
    /// What the check compared, when its labels need it (`world_sizes`: the two sizes).
    pub note: Option<String>,
    /// The loss curves of the two runs its comparison compared ([`CURVE_NAME`] on rank 0, left
    /// then right, each labelled by its run: `run 1`, `world size 4`, ...), when both runs
    /// record one; `None` for `replicas`, which compares ranks within a run.
    pub curves: Option<(Curve, Curve)>,
}

/// The scalar a check keeps the curves of ([`CheckOutcome::curves`]): `loss`.
pub const CURVE_NAME: &str = "loss";

impl CheckOutcome {
    /// What the two sides of the check's comparison are, left then right (`run 1` and `run 2`
    /// for `repeat`; `rank 0` and `this rank` for `replicas`).
    #[must_use]
    pub fn side_labels(&self) -> (&'static str, &'static str) {
        kinds::unit(self.kind).sides()
    }

    /// The ranks of a divergence's left and right records: the divergence's own rank on both
    /// sides, except for `replicas`, whose left record is rank 0's.
    #[must_use]
    pub fn record_ranks(&self, divergence: &Divergence) -> (u32, u32) {
        if self.kind == CheckKind::Replicas {
            (0, divergence.rank)
        } else {
            (divergence.rank, divergence.rank)
        }
    }

    /// `  replicas: n/a: why` (with its newline) when the check is n/a, for reports.
    #[must_use]
    pub fn not_applicable_line(&self) -> Option<String> {
        let why = self.skipped.as_deref()?;
        Some(format!("  {}: n/a: {why}\n", self.kind))
    }

    /// `true` when the finding matches the expectation, or the check was skipped.
    #[must_use]
    pub fn holds(&self) -> bool {
        if self.skipped.is_some() {
            return true;
        }
        match self.expectation {
            Expectation::Identical => self.comparison.is_identical(),
            Expectation::Diverges => !self.comparison.is_identical(),
        }
    }
}

/// The checks of one scenario.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct ScenarioReport {
    /// The scenario's name.
    pub name: String,
    /// Its world size.
    pub world_size: usize,
    /// Its steps.
    pub steps: u64,
    /// One outcome per check, in the scenario's order.
    pub outcomes: Vec<CheckOutcome>,
    /// The first NaN, Inf or fp16 saturation in the first run, if any.
    pub overflow: Option<Overflow>,
    /// The frameworks the program imported (`torch`, `mindspore`), as its first run's
    /// environment snapshot shows them (empty for a rank program or when none shows).
    pub frameworks: Vec<String>,
    /// For a program launched with `--deterministic`: which of the settings make its runs
    /// identical (`settings.rs`).
    pub deterministic: Option<SettingsFinding>,
}

impl ScenarioReport {
    /// `true` when every check holds and at least one of them compared something: a scenario
    /// whose every check is n/a ([`ScenarioReport::compared_nothing`]) has not passed.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.outcomes.iter().all(CheckOutcome::holds) && !self.compared_nothing()
    }

    /// `true` when every check is n/a (none could run, or each compared nothing): the
    /// scenario's verdict is `n/a`, not `ok`.
    #[must_use]
    pub fn compared_nothing(&self) -> bool {
        self.outcomes.iter().all(|o| o.skipped.is_some())
    }

    /// Record pairs compared over all checks.
    #[must_use]
    pub fn num_compared(&self) -> u64 {
        self.outcomes
            .iter()
            .map(|o| o.comparison.num_compared)
            .sum()
    }

    /// The first divergence of the first check that found one.
    #[must_use]
    pub fn first_divergence(&self) -> Option<(CheckKind, &Divergence)> {
        self.outcomes
            .iter()
            .find_map(|o| o.comparison.first.as_ref().map(|d| (o.kind, d)))
    }

    /// The ranks × steps divergence map of each check that does not hold and found a
    /// divergence: the map of the comparison that gave the check its verdict.
    pub fn maps(&self) -> impl Iterator<Item = (CheckKind, &DivergenceMap)> {
        self.outcomes
            .iter()
            .filter(|o| !o.holds() && !o.comparison.is_identical())
            .filter_map(|o| o.comparison.map.as_ref().map(|m| (o.kind, m)))
    }

    /// A plain-text explanation of every check that does not hold (empty when all hold).
    #[must_use]
    pub fn explain_failures(&self) -> String {
        let mut out = String::new();
        if self.compared_nothing() {
            out.push_str("every check is n/a: nothing was compared, so nothing is verified\n");
            for o in &self.outcomes {
                out.push_str(&o.not_applicable_line().unwrap_or_default());
            }
        }
        for outcome in self.outcomes.iter().filter(|o| !o.holds()) {
            let c = &outcome.comparison;
            match (&c.first, outcome.expectation) {
                (None, _) => {
                    let _ = writeln!(
                        out,
                        "{}: negative control not caught: expected a divergence, but all {} \
                         compared records are identical",
                        outcome.kind, c.num_compared
                    );
                }
                (Some(first), _) => {
                    let _ = writeln!(
                        out,
                        "{}: expected identical, but {} of {} compared records differ{}",
                        outcome.kind,
                        c.num_differing,
                        c.num_compared,
                        outcome
                            .note
                            .as_ref()
                            .map_or(String::new(), |n| format!(" ({n})"))
                    );
                    if let Some(cause) = &first.cause {
                        out.push_str(&cause.describe("  "));
                    }
                    let _ = write!(out, "{}", describe_environment(c, outcome.side_labels()));
                    let _ = write!(out, "{}", describe_divergence(first, outcome));
                }
            }
        }
        out
    }

    /// A plain-text account of what each negative control's check caught: the counts, the
    /// first divergence with both records, and its first differing element (empty when no
    /// check caught anything).
    #[must_use]
    pub fn explain_caught(&self) -> String {
        let mut out = String::new();
        for outcome in self
            .outcomes
            .iter()
            .filter(|o| o.holds() && o.expectation == Expectation::Diverges && o.skipped.is_none())
        {
            let c = &outcome.comparison;
            if let Some(first) = &c.first {
                let _ = writeln!(
                    out,
                    "{}: caught: {} of {} compared records differ{}",
                    outcome.kind,
                    c.num_differing,
                    c.num_compared,
                    outcome
                        .note
                        .as_ref()
                        .map_or(String::new(), |n| format!(" ({n})"))
                );
                if let Some(cause) = &first.cause {
                    out.push_str(&cause.describe("  "));
                }
                let _ = write!(out, "{}", describe_environment(c, outcome.side_labels()));
                let _ = write!(out, "{}", describe_divergence(first, outcome));
            }
        }
        out
    }
}

/// The environment entries that differ between the two sides of a comparison, one per line
/// (nothing when the snapshots agree or the runs have none: ranks in this process share its
/// environment). Printed before the divergence, which they may explain.
fn describe_environment(c: &Comparison, (left, right): (&str, &str)) -> String {
    if c.environment.is_empty() {
        return String::new();
    }
    let mut out = format!("  environment differs ({left} -> {right}):\n");
    for d in &c.environment {
        out.push_str(&d.describe("    "));
    }
    out
}

/// A multi-line description of a divergence: where, and both records' md5s and stats.
#[must_use]
fn describe_divergence(d: &Divergence, outcome: &CheckOutcome) -> String {
    // `step N rank R ...`, or `sample N ...` where a record's step is its sample.
    let text = d.to_string();
    let text = match text.strip_prefix("step ") {
        Some(rest) => format!("{} {rest}", outcome.kind.step_word()),
        None => text,
    };
    let mut out = format!("  first divergence: {text}\n");
    let (left_label, right_label) = outcome.side_labels();
    let (left_rank, right_rank) = outcome.record_ranks(d);
    for (label, rank, record) in [
        (left_label, left_rank, &d.left),
        (right_label, right_rank, &d.right),
    ] {
        let _ = match record {
            Some(r) => writeln!(out, "    {label:<9} {}", describe_record(rank, &d.name, r)),
            None => writeln!(out, "    {label:<9} (no record)"),
        };
    }
    if let Some(element) = &d.element {
        let _ = writeln!(
            out,
            "  first differing element: {}",
            element.describe(left_label, right_label)
        );
    }
    if let Some(operator) = &d.operator {
        let _ = writeln!(out, "  first differing operator: {operator}");
    }
    out
}

fn describe_record(rank: u32, name: &str, r: &RecordSummary) -> String {
    let mut text = format!(
        "rank {rank} {name} {} md5 {}",
        r.layout,
        r.digest.as_deref().unwrap_or("-")
    );
    if let Some(stats) = &r.stats {
        let _ = write!(text, " {}", describe_stats(stats));
    }
    text
}

fn describe_stats(s: &Stats) -> String {
    let show = |x: Option<ExactF64>| x.map_or("-".to_owned(), |v| format!("{:.9e}", v.0));
    let mut text = format!(
        "max {} min {} mean {} norm {}",
        show(s.max),
        show(s.min),
        show(s.mean),
        show(s.norm)
    );
    if s.nan + s.pos_inf + s.neg_inf > 0 {
        let _ = write!(text, " nan {} +inf {} -inf {}", s.nan, s.pos_inf, s.neg_inf);
    }
    text
}

/// Names the cause of a program's `repeat` divergence (`diagnose::decide_cause`). The hash seed,
/// which detcheck changes from launch to launch on purpose, is left out of the environment
/// differences unless it is the cause: shown there, it would be a false lead.
/// `repeats_with_one_hash_seed`: whether a run with run 1's hash seed repeated run 1 (`None`:
/// not tried).
fn name_cause(c: &mut Comparison, repeats_with_one_hash_seed: Option<bool>) {
    let Some(cause) = decide_cause(c, repeats_with_one_hash_seed) else {
        return;
    };
    if cause.kind != CauseClass::HashOrder {
        c.environment.retain(|e| e.key != "PYTHONHASHSEED");
    }
    if let Some(at) = c.first.as_ref().map(Divergence::key) {
        c.annotate(at, |row| row.cause = Some(cause.clone()));
    }
}

/// What `repeat`'s unperturbed runs found: a launched program run again, reading nothing
/// during its steps (`DETCHECK_RECORD=end`), under run 1's and then run 2's launch
/// perturbation; their end states compared with run 1's records of the same names and with
/// each other.
struct EndStates {
    /// The comparison: of both pairs, summed, when they agree; else of the pair that differs.
    comparison: Comparison,
    /// Which pair differs (`None` when both agree).
    differing: Option<&'static str>,
}

/// Runs the unperturbed runs (`quiet(k)`: run k, unperturbed) and compares their end states:
/// the first with run 1's records, then (when they agree) the second with the first. `None`
/// when the first end state holds no record (no update happened): nothing to compare.
fn compare_end_states(
    first: &Trace,
    quiet: impl Fn(usize) -> Result<Trace, RunError>,
) -> Result<Option<EndStates>, RunError> {
    // Their end-state records alone (a run records nothing else unless a program of its own
    // wrote some).
    let quiet1 = quiet(1)?;
    let quiet1 = end_state_of(&quiet1, &quiet1);
    let against_recorded = compare_traces(&end_state_of(first, &quiet1), &quiet1, TraceView::All);
    if against_recorded.num_compared == 0 {
        return Ok(None);
    }
    if !against_recorded.is_identical() {
        return Ok(Some(EndStates {
            comparison: against_recorded,
            differing: Some("run 1 recorded vs run 1 unperturbed"),
        }));
    }
    let quiet2 = quiet(2)?;
    let between = compare_traces(&quiet1, &end_state_of(&quiet2, &quiet2), TraceView::All);
    if !between.is_identical() {
        return Ok(Some(EndStates {
            comparison: between,
            differing: Some("unperturbed runs 1 and 2"),
        }));
    }
    let mut comparison = against_recorded;
    comparison.num_compared += between.num_compared;
    Ok(Some(EndStates {
        comparison,
        differing: None,
    }))
}

/// `repeat` failed by its unperturbed runs (`what`: the pair that differs) while its two
/// recorded runs agree: the end states' divergence becomes the check's, with the cause
/// [`CauseClass::Timing`].
fn hidden_by_recording(repeat: &mut CheckOutcome, mut comparison: Comparison, what: &str) {
    if let Some(first) = comparison.first.as_mut() {
        let mut cause = crate::compare::Cause::new(
            CauseClass::Timing,
            format!(
                "the recorded runs agree, but runs that read nothing during their steps end with \
                 other values ({what}: `{}` at step {} rank {}): the result depends on timing, \
                 which recording's reads and synchronisation change",
                first.name, first.step, first.rank
            ),
        );
        cause.evidence.push(format!(
            "{} of {} end-state records differ ({what}); the two recorded runs' {} records agree",
            comparison.num_differing, comparison.num_compared, repeat.comparison.num_compared
        ));
        cause.fix = Some(
            "find the race: threads or streams that share a value, an operator that runs \
             asynchronously, a data loader's workers; run with --deterministic"
                .to_owned(),
        );
        first.cause = Some(cause);
    }
    comparison.num_compared += repeat.comparison.num_compared;
    repeat.note = Some(format!("{what}: the end states differ"));
    repeat.curves = None;
    repeat.comparison = comparison;
}

/// The prefix of the end state's records (`end/<param>`): what the zero-change recorder writes
/// when a recording ends, and all an unperturbed run writes.
const END_STATE: &str = "end/";

/// Whether a run holds an end state (its recorder is detcheck's zero-change recorder, which
/// follows `DETCHECK_RECORD`; a program that records itself does not) with values to compare.
fn has_end_state(trace: &Trace) -> bool {
    trace
        .ranks
        .iter()
        .any(|r| r.records.iter().any(is_end_state))
}

/// An end-state record that holds values: an empty tensor (a parameter a framework released
/// to a placeholder, as DeepSpeed ZeRO-3 does between forwards when its recorder could not read
/// the rank's part) compares nothing, so it neither makes the unperturbed runs nor counts.
fn is_end_state(record: &crate::record::Record) -> bool {
    record.name.starts_with(END_STATE) && record.shape.iter().all(|&d| d > 0)
}

/// The end-state records of `first` that hold no values, when it has some and none with values:
/// why no unperturbed run was made.
fn empty_end_state(first: &Trace) -> Option<usize> {
    let named = |r: &&crate::record::Record| r.name.starts_with(END_STATE);
    let n = first
        .ranks
        .iter()
        .flat_map(|r| r.records.iter().filter(named))
        .count();
    (n > 0 && !has_end_state(first)).then_some(n)
}

/// The end-state records of `trace` named as `end`'s (`end/*`, once a run), each moved to the step `end` holds it at: a recorded run writes its end state at the
/// last update's step, or at the next when that step already holds records (a program run to
/// its end that evaluates after its last update), an unperturbed run always at the last
/// update's.
fn end_state_of(trace: &Trace, end: &Trace) -> Trace {
    let mut out = trace.clone();
    for (rank, of_end) in out.ranks.iter_mut().zip(&end.ranks) {
        let steps: std::collections::BTreeMap<&str, u64> = of_end
            .records
            .iter()
            .filter(|r| is_end_state(r))
            .map(|r| (r.name.as_str(), r.step))
            .collect();
        rank.records
            .retain_mut(|r| match steps.get(r.name.as_str()) {
                Some(&step) => {
                    r.step = step;
                    true
                }
                None => false,
            });
        rank.records.sort_by_key(|r| (r.step, r.seq));
    }
    out.ranks.truncate(end.ranks.len());
    out
}

/// Why a check that ran compared nothing, in words: the program recorded nothing; for
/// `replicas`, no record is replicated, and whether the ranks then train different models (a
/// same-named parameter of rank r differs from rank 0's, which no data-parallel wrapper would
/// allow); otherwise the runs had no record in common.
fn nothing_compared(kind: CheckKind, first: &Trace) -> String {
    if first.ranks.iter().all(|r| r.records.is_empty()) {
        return "compared nothing: the program recorded no record (detcheck's recorder saw no \
                model, tensor or training step)"
            .to_owned();
    }
    if kind == CheckKind::WorldSizes {
        return "compared nothing: no record is held alike at two of the world sizes (at one \
                rank every record is, trivially; at more, what a data-parallel wrapper or a \
                replicated DTensor replicates and what every rank holds with equal bits: a \
                hand-written tensor-parallel layer's parameters are shards, not replicas)"
            .to_owned();
    }
    if kind != CheckKind::Replicas {
        let (left, right) = kinds::unit(kind).sides();
        return format!(
            "compared nothing: the two sides ({left} and {right}) have no record in common"
        );
    }
    let sharded = first.ranks.iter().find_map(|r| {
        r.environment
            .as_ref()
            .and_then(|e| e.get(crate::launch::SHARDED_KEY))
    });
    if let Some(sharded) = sharded {
        return format!(
            "compared nothing: no record is replicated: {sharded} (`repeat` compares each \
             rank with itself)"
        );
    }
    match different_models(first) {
        Some((rank, step, name)) => format!(
            "the ranks train different models: rank {rank}'s `{name}` differs from rank 0's at \
             step {step}, and nothing wraps the model for data parallelism (DDP, FSDP, DeepSpeed \
             ZeRO, a replicated DTensor), so no record is replicated and none was compared"
        ),
        None => "compared nothing: no record is replicated (nothing wraps the model for data \
                 parallelism: DDP, FSDP, DeepSpeed ZeRO, a replicated DTensor), so the ranks \
                 hold nothing that must be equal"
            .to_owned(),
    }
}

/// The first (step, seq) record among a rank's initial parameters and parameters (`init/*`,
/// `param/*`) whose digest differs from rank 0's record of the same step and name, over ranks
/// 1.., as (rank, step, name): ranks that hold the same-named model but not the same values.
fn different_models(trace: &Trace) -> Option<(u32, u64, String)> {
    let is_parameter = |name: &str| name.starts_with("init/") || name.starts_with("param/");
    let zero = trace.ranks.first()?;
    let of_zero: std::collections::BTreeMap<(u64, &str), &crate::value::digest::Md5Digest> = zero
        .records
        .iter()
        .filter(|r| is_parameter(&r.name))
        .map(|r| ((r.step, r.name.as_str()), &r.md5))
        .collect();
    trace
        .ranks
        .iter()
        .skip(1)
        .filter_map(|rank| {
            rank.records
                .iter()
                .filter(|r| is_parameter(&r.name))
                .find(|r| {
                    of_zero
                        .get(&(r.step, r.name.as_str()))
                        .is_some_and(|md5| **md5 != r.md5)
                })
                .map(|r| (r.step, r.seq, rank.rank, r.name.clone()))
        })
        .min()
        .map(|(step, _, rank, name)| (rank, step, name))
}

/// Runs the scenario's checks on thread ranks and reports each outcome.
///
/// # Errors
/// [`RunError`] when a run fails (a rank errors, panics or misses a deadline).
pub fn run_checks(
    scenario: &LoadedScenario,
    options: &CheckOptions,
) -> Result<ScenarioReport, RunError> {
    run_checks_on(&ThreadRunner, scenario, options)
}

/// Runs the scenario's checks with `runner` and reports each outcome. On MPI ranks, `backends`
/// is added where it applies and compares run 1 with the same run on thread ranks.
///
/// Run 1 (under `kinds::first_plan`); when `repeat` is asked, its unperturbed runs
/// ([`unperturbed_runs`]) and run 2 unless they took its place; then each check's unit
/// (`kinds/`) in the order of the checks, each making the runs of its own; then what follows
/// from the outcomes: n/a for a check that compared nothing, the element detail, the cause of a
/// program's `repeat`, `--deterministic`'s settings, what the unperturbed runs found.
pub(crate) fn run_checks_on(
    runner: &dyn Runner,
    scenario: &LoadedScenario,
    options: &CheckOptions,
) -> Result<ScenarioReport, RunError> {
    let spec = &scenario.spec;
    let runner = runner_for(scenario, runner)?;
    let mut checks = scenario.checks.clone();
    if runner.is_mpi() && backends_applies(scenario) && !checks.contains(&CheckKind::Backends) {
        checks.push(CheckKind::Backends);
    }
    // Run k runs under perturbation k (rotation k − 1).
    let first_plan = kinds::first_plan(scenario, &checks);
    let first = kinds::run_planned(runner, scenario, options, 1, &first_plan)?;
    let repeat = checks.contains(&CheckKind::Repeat);
    let quiet = if repeat {
        unperturbed_runs(runner, scenario, options, &first)?
    } else {
        Quiet::NotMade(None)
    };
    // Unperturbed runs that agree with run 1 take run 2's place (`unperturbed_runs`).
    let in_place_of_second = match &quiet {
        Quiet::Made(end) if end.differing.is_none() => Some(&end.comparison),
        _ => None,
    };
    let second = if repeat && in_place_of_second.is_none() {
        Some(kinds::run_of(runner, scenario, options, 2)?)
    } else {
        None
    };
    let runs = Runs {
        runner,
        scenario,
        options,
        first: &first,
        first_plan,
        second: second.as_ref(),
        unperturbed: in_place_of_second,
    };
    // Each kind's unit makes its own runs and compares, in the order of the checks; a kind
    // listed twice is asked once (`CheckUnit::listed_again`).
    let mut found: Vec<(CheckKind, Compared)> = Vec::with_capacity(checks.len());
    for &kind in &checks {
        let unit = kinds::unit(kind);
        let compared = match found.iter().find(|(k, _)| *k == kind) {
            Some((_, earlier)) => unit.listed_again(earlier),
            None => unit.compare(&runs)?,
        };
        found.push((kind, compared));
    }
    // The first differing pair of each check, for the element detail.
    let mut pairs: Vec<(CheckKind, Pair)> = Vec::new();
    let mut outcomes = found
        .into_iter()
        .map(|(kind, compared)| {
            if let Some(pair) = compared.differing {
                pairs.push((kind, pair));
            }
            CheckOutcome {
                kind,
                expectation: spec.expect,
                comparison: compared.comparison,
                skipped: compared.skipped.map(str::to_owned),
                empty: false,
                note: compared.note,
                curves: compared.curves,
            }
        })
        .collect::<Vec<CheckOutcome>>();
    // A check that compared nothing is n/a with its reason, never a pass (a negative control
    // that compared nothing stays a failure: it caught nothing).
    for o in &mut outcomes {
        if o.skipped.is_none()
            && o.expectation == Expectation::Identical
            && o.comparison.num_compared == 0
            && o.comparison.is_identical()
        {
            o.skipped = Some(nothing_compared(o.kind, &first));
            o.empty = true;
        }
    }
    if options.element_detail {
        for outcome in &mut outcomes {
            let pair = pairs
                .iter()
                .find(|(kind, _)| *kind == outcome.kind)
                .map(|(_, pair)| pair);
            runs.name_element(outcome, pair);
        }
    }
    name_repeat_causes(&runs, &mut outcomes)?;
    let deterministic = deterministic_settings(&runs, &outcomes)?;
    add_unperturbed(quiet, &mut outcomes);
    Ok(ScenarioReport {
        name: scenario.name.clone(),
        // The ranks the runs had: more than launched where the program started its own.
        world_size: spec.world_size.max(first.ranks.len()),
        steps: spec.steps,
        outcomes,
        overflow: first_overflow(&first),
        frameworks: frameworks_of(&first),
        deterministic,
    })
}

/// Names the cause of a launched program's `repeat` divergence ([`name_cause`]), with the hash
/// seed probed where the evidence needs it.
fn name_repeat_causes(runs: &Runs<'_>, outcomes: &mut [CheckOutcome]) -> Result<(), RunError> {
    if !matches!(runs.scenario.program, Program::Command(_)) {
        return Ok(());
    }
    let (runner, options, first) = (runs.runner, runs.options, runs.first);
    for outcome in outcomes.iter_mut().filter(|o| o.kind == CheckKind::Repeat) {
        // The hash seed is shown to matter by a third run with run 1's hash seed (its
        // perturbation): it repeats run 1 where the hash seed is the cause. Only where the
        // evidence names nothing else, and not without the drill-down.
        let probe = |c: &Comparison| -> Result<Option<bool>, RunError> {
            let varied = c.environment.iter().any(|e| e.key == "PYTHONHASHSEED");
            if !varied
                || !options.element_detail
                || !decide_cause(c, None).is_some_and(|k| k.kind.needs_hash_probe())
            {
                return Ok(None);
            }
            let third = runs.run(runner, 1)?;
            Ok(Some(
                compare_traces(first, &third, TraceView::All).is_identical(),
            ))
        };
        let repeats_with_one_hash_seed = probe(&outcome.comparison)?;
        name_cause(&mut outcome.comparison, repeats_with_one_hash_seed);
    }
    Ok(())
}

/// For a program launched with `--deterministic` (every setting, with the drill-down): which of
/// the settings make its runs identical (`settings.rs`), from its `repeat` outcome.
fn deterministic_settings(
    runs: &Runs<'_>,
    outcomes: &[CheckOutcome],
) -> Result<Option<SettingsFinding>, RunError> {
    let (runner, scenario, options) = (runs.runner, runs.scenario, runs.options);
    Ok(match &scenario.program {
        Program::Command(command)
            if command.deterministic
                && command.deterministic_only.is_none()
                && options.element_detail =>
        {
            let repeat = outcomes.iter().find(|o| o.kind == CheckKind::Repeat);
            match repeat {
                Some(repeat) => {
                    let run = |only: Option<&[String]>, k: usize| -> Result<Trace, RunError> {
                        let mut changed = (**command).clone();
                        match only {
                            None => changed.deterministic = false,
                            Some(names) => changed.deterministic_only = Some(names.to_vec()),
                        }
                        let mut variant = scenario.clone();
                        variant.program = Program::Command(Arc::new(changed));
                        kinds::run_of(runner, &variant, options, k)
                    };
                    Some(crate::diagnose::settings::which_settings_fix(
                        &repeat.comparison,
                        scenario.spec.seed,
                        runs.first,
                        &run,
                    )?)
                }
                None => None,
            }
        }
        _ => None,
    })
}

/// What `repeat`'s unperturbed runs came to, decided once run 1 is made ([`unperturbed_runs`]).
enum Quiet {
    /// None were made: nothing to add, or why (`repeat`'s note when it passes).
    NotMade(Option<String>),
    /// They were made, before run 2: their end states against run 1's and each other's.
    Made(Box<EndStates>),
}

/// A launched program's `repeat`, after run 1: unless run 1 shows the program synchronous
/// ([`synchronous`]; [`Unperturbed::Always`] makes them anyway), it is run twice unperturbed
/// (nothing read during its steps): the program as it runs without detcheck, compared by end
/// states ([`compare_end_states`]). *Decision (issue 53's cost):* these runs take run 2's place
/// where they agree with run 1, so a passing check of a program that can race costs three
/// launches; run 2 is recorded only when they differ, to say where and why
/// ([`add_unperturbed`]). A negative control, a scenario of rank programs and `--no-unperturbed`
/// make none.
fn unperturbed_runs(
    runner: &dyn Runner,
    scenario: &LoadedScenario,
    options: &CheckOptions,
    first: &Trace,
) -> Result<Quiet, RunError> {
    let spec = &scenario.spec;
    let applies = options.unperturbed != Unperturbed::Never
        && matches!(scenario.program, Program::Command(_))
        && spec.expect == Expectation::Identical;
    if !applies {
        return Ok(Quiet::NotMade(None));
    }
    if let Some(n) = empty_end_state(first) {
        return Ok(Quiet::NotMade(Some(format!(
            "no unperturbed run: the end state's {n} records hold no values"
        ))));
    }
    if !has_end_state(first) {
        return Ok(Quiet::NotMade(None));
    }
    if let (Some(words), Unperturbed::UnlessSynchronous) = (synchronous(first), options.unperturbed)
    {
        return Ok(Quiet::NotMade(Some(format!(
            "no unperturbed run: {words}, so recording cannot change what it computes"
        ))));
    }
    let quiet = |k: usize| {
        let p = Some(perturbation(spec.seed, k, options));
        let request = RunRequest::new(scenario, options, p, k, &RunPlan::default());
        runner.run(scenario, &request.unperturbed())
    };
    Ok(match compare_end_states(first, quiet)? {
        Some(end) => Quiet::Made(Box::new(end)),
        None => Quiet::NotMade(None),
    })
}

/// Adds what the unperturbed runs found to a passing `repeat`: the reason none were made, or,
/// where they differ while the two recorded runs agree, the failure with the cause "timing"
/// ([`hidden_by_recording`]). Where they agreed, `repeat` compared their end states in run
/// 2's place (`kinds/repeat.rs`); where the recorded runs differ too, that failure stands.
fn add_unperturbed(quiet: Quiet, outcomes: &mut [CheckOutcome]) {
    let Some(repeat) = outcomes
        .iter_mut()
        .find(|o| o.kind == CheckKind::Repeat && o.holds() && o.skipped.is_none())
    else {
        return;
    };
    match quiet {
        Quiet::NotMade(note) => {
            if note.is_some() {
                repeat.note = note;
            }
        }
        Quiet::Made(end) => {
            if let Some(what) = end.differing {
                hidden_by_recording(repeat, end.comparison, what);
            }
        }
    }
}

/// The environment key a recorded run of the zero-change recorder writes when it shows that
/// recording cannot change what the program computes (python/detcheck/_core/lifecycle.py,
/// from the framework's `_synchronous`: torch's `_torch/frontend.py` `synchronous`), with that
/// in words.
const SYNCHRONOUS_KEY: &str = "detcheck.synchronous";

/// The words (rank 0's) of a run whose every rank shows that recording cannot change what it
/// computes: then `repeat`'s unperturbed runs would compute what its recorded runs did, and
/// are not made (unless `--unperturbed`). The evidence must be positive, from each rank of the
/// run itself: a run where one rank says nothing gets its unperturbed runs.
fn synchronous(first: &Trace) -> Option<&str> {
    let mut words = first
        .ranks
        .iter()
        .map(|rank| rank.environment.as_ref()?.get(SYNCHRONOUS_KEY));
    let zero = words.next()??;
    words.all(|w| w.is_some()).then_some(zero)
}

/// The frameworks a run's environment snapshot shows (`torch.version`, `mindspore.version`
/// on any rank), in that order.
fn frameworks_of(trace: &Trace) -> Vec<String> {
    ["torch", "mindspore"]
        .into_iter()
        .filter(|f| {
            let key = format!("{f}.version");
            trace.ranks.iter().any(|r| {
                r.environment
                    .as_ref()
                    .is_some_and(|e| e.get(&key).is_some())
            })
        })
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::kinds::NO_GPU;
    use super::*;
    use crate::run::gpu::gpu_runner_dyn;
    use crate::scenario::KindRegistry;

    fn scenario(kind: &str, world: usize, extra: &str, params: &str) -> LoadedScenario {
        // `extra` may switch deterministic communication off; it is on otherwise.
        let det = if extra.contains("deterministic_comm") {
            ""
        } else {
            r#", "deterministic_comm": true"#
        };
        let text = format!(
            r#"{{"kind": "{kind}", "world_size": {world}, "steps": 2, "seed": 3,
                "reduction": "ring", "expect": "diverges"{det}{extra},
                "params": {params}}}"#
        );
        let spec = serde_json::from_str(&text).unwrap();
        KindRegistry::builtin()
            .build(spec, std::path::Path::new("inline.json"))
            .unwrap()
    }

    /// The first divergence of each planted fault is where the fault is, not downstream of it.
    fn first(s: &LoadedScenario) -> (CheckKind, u64, u32, String) {
        let report = run_checks(s, &CheckOptions::default()).unwrap();
        assert!(
            report.passed(),
            "the control must be caught:\n{}",
            report.explain_failures()
        );
        let (kind, d) = report.first_divergence().unwrap();
        (kind, d.step, d.rank, d.name.clone())
    }

    const SMALL_TRAIN: &str = r#"{"dataset_size": 64, "global_batch": 16"#;

    #[test]
    fn arrival_order_gradients_diverge_after_the_allreduce_not_before() {
        let s = scenario(
            "train",
            4,
            r#", "deterministic_comm": false"#,
            &format!("{SMALL_TRAIN}}}"),
        );
        assert_eq!(
            first(&s),
            (CheckKind::Repeat, 0, 0, "grad/fc1.weight".into())
        );
    }

    #[test]
    fn hashmap_accumulation_diverges_in_the_local_gradient() {
        let s = scenario(
            "train",
            2,
            "",
            &format!(r#"{SMALL_TRAIN}, "plant": "hashmap_grad_order"}}"#),
        );
        let (kind, step, _, name) = first(&s);
        assert_eq!(
            (kind, step, name.as_str()),
            (CheckKind::Repeat, 0, "local_grad/fc1.weight")
        );
    }

    #[test]
    fn os_entropy_diverges_at_init_and_rank_seeded_init_breaks_replicas() {
        let s = scenario("seed", 2, "", r#"{"plant": "os_entropy_init"}"#);
        assert_eq!(first(&s), (CheckKind::Repeat, 0, 0, "init/weight".into()));
        let s = scenario(
            "train",
            2,
            r#", "checks": ["replicas"]"#,
            &format!(r#"{SMALL_TRAIN}, "plant": "rank_seeded_init"}}"#),
        );
        assert_eq!(
            first(&s),
            (CheckKind::Replicas, 0, 1, "init/fc1.weight".into())
        );
    }

    /// A check that compared nothing is n/a with its reason, never a pass; a scenario whose
    /// every check is n/a has not passed (issue 53: `replicas` passed with 0 compared on a
    /// program whose ranks train different models).
    #[test]
    fn a_check_that_compared_nothing_is_not_applicable_never_a_pass() {
        let loader = |checks: &str| {
            let text = format!(
                r#"{{"kind": "dataloader", "world_size": 2, "steps": 2, "seed": 3,
                    "reduction": "ring", "deterministic_comm": true, "expect": "identical",
                    "checks": {checks}, "params": {{"dataset_size": 32, "batch_size": 4}}}}"#
            );
            let spec = serde_json::from_str(&text).unwrap();
            KindRegistry::builtin()
                .build(spec, std::path::Path::new("loader.json"))
                .unwrap()
        };
        // The loader's records are per rank: nothing is replicated.
        let report = run_checks(
            &loader(r#"["repeat", "replicas"]"#),
            &CheckOptions::default(),
        )
        .unwrap();
        assert!(report.passed(), "{}", report.explain_failures());
        let replicas = &report.outcomes[1];
        assert_eq!(replicas.comparison.num_compared, 0);
        assert!(replicas.empty);
        let why = replicas.skipped.as_deref().unwrap();
        assert!(why.contains("no record is replicated"), "{why}");
        assert!(!report.compared_nothing() && report.outcomes[0].skipped.is_none());
        // Its only check compared nothing: not a pass.
        let report = run_checks(&loader(r#"["replicas"]"#), &CheckOptions::default()).unwrap();
        assert!(report.compared_nothing() && !report.passed());
        assert!(
            report.explain_failures().contains("every check is n/a"),
            "{}",
            report.explain_failures()
        );
    }

    /// The end states of unperturbed runs are paired with run 1's by name, whatever step
    /// each wrote them at; a difference names its pair; a run with no end state (a program
    /// that records itself) has none to compare.
    #[test]
    fn end_states_pair_by_name_and_a_difference_names_its_pair() {
        use crate::record::{RecordLevel, Recorder};
        let run = |end_step: u64, value: f32, with_steps: bool| {
            let mut r = Recorder::new(0, RecordLevel::Stats);
            if with_steps {
                r.record(
                    0,
                    "loss",
                    &crate::value::tensor::Tensor::from_vec(vec![1.0f32]),
                );
                r.record(
                    1,
                    "loss",
                    &crate::value::tensor::Tensor::from_vec(vec![2.0f32]),
                );
            }
            r.record(
                end_step,
                "end/w",
                &crate::value::tensor::Tensor::from_vec(vec![value]),
            );
            Trace {
                ranks: vec![r.finish()],
            }
        };
        // Run 1 evaluated after its last update: its end state is at step 2, the quiet runs' at 1.
        let first = run(2, 5.0, true);
        assert!(has_end_state(&first));
        let agree = compare_end_states(&first, |_| Ok(run(1, 5.0, false)))
            .unwrap()
            .unwrap();
        assert_eq!((agree.differing, agree.comparison.num_compared), (None, 2));
        let apart = compare_end_states(&first, |_| Ok(run(1, 6.0, false)))
            .unwrap()
            .unwrap();
        assert_eq!(apart.differing, Some("run 1 recorded vs run 1 unperturbed"));
        let second = compare_end_states(&first, |k| {
            Ok(run(1, if k == 1 { 5.0 } else { 7.0 }, false))
        })
        .unwrap()
        .unwrap();
        assert_eq!(second.differing, Some("unperturbed runs 1 and 2"));
        let mut itself = Recorder::new(0, RecordLevel::Stats);
        itself.record(
            0,
            "loss",
            &crate::value::tensor::Tensor::from_vec(vec![1.0f32]),
        );
        assert!(!has_end_state(&Trace {
            ranks: vec![itself.finish()]
        }));
    }

    /// A run shows itself synchronous only by its recorder's words, at every rank: a run
    /// where one rank says nothing gets its unperturbed runs.
    #[test]
    fn only_a_run_whose_every_rank_says_so_is_synchronous() {
        use crate::record::environment::Environment;
        use crate::record::{RecordLevel, Recorder};
        let rank = |rank: u32, says: bool| {
            let mut trace = Recorder::new(rank, RecordLevel::Stats).finish();
            trace.environment = Some(Environment::from_iter(
                says.then_some((SYNCHRONOUS_KEY, "one process")),
            ));
            trace
        };
        let one = |says| Trace {
            ranks: vec![rank(0, says)],
        };
        assert_eq!(synchronous(&one(true)), Some("one process"));
        assert_eq!(synchronous(&one(false)), None);
        let two = |says| Trace {
            ranks: vec![rank(0, true), rank(1, says)],
        };
        assert_eq!(synchronous(&two(true)), Some("one process"));
        assert_eq!(synchronous(&two(false)), None);
        assert_eq!(synchronous(&Trace { ranks: vec![] }), None);
    }

    /// An end state of empty tensors (parameters released to placeholders, as DeepSpeed ZeRO-3's
    /// were before the recorder read each rank's part) holds no values: it makes no unperturbed
    /// run and counts as no record; beside one with values, only that one is compared.
    #[test]
    fn an_end_state_without_values_is_not_compared() {
        use crate::record::{RecordLevel, Recorder};
        use crate::value::tensor::Tensor;
        let run = |with_values: bool| {
            let mut r = Recorder::new(0, RecordLevel::Stats);
            r.record(0, "end/placeholder", &Tensor::from_vec(Vec::<f32>::new()));
            if with_values {
                r.record(0, "end/w", &Tensor::from_vec(vec![1.0f32]));
            }
            Trace {
                ranks: vec![r.finish()],
            }
        };
        let empty = run(false);
        assert!(!has_end_state(&empty));
        assert_eq!(empty_end_state(&empty), Some(1));
        let some = run(true);
        assert!(has_end_state(&some) && empty_end_state(&some).is_none());
        let end = compare_end_states(&some, |_| Ok(run(true)))
            .unwrap()
            .unwrap();
        assert_eq!((end.differing, end.comparison.num_compared), (None, 2));
    }

    /// Ranks that hold a same-named parameter with other values, and no replicated record,
    /// train different models: the reason names the rank, the step and the record.
    #[test]
    fn ranks_with_different_same_named_parameters_train_different_models() {
        use crate::record::{RecordLevel, Recorder};
        let trace = |values: [f32; 2]| Trace {
            ranks: (0..2u32)
                .map(|rank| {
                    let mut r = Recorder::new(rank, RecordLevel::Stats);
                    r.record(
                        0,
                        "data/x",
                        &crate::value::tensor::Tensor::from_vec(vec![rank as f32]),
                    );
                    r.record(
                        0,
                        "init/fc.weight",
                        &crate::value::tensor::Tensor::from_vec(vec![values[0]]),
                    );
                    r.record(
                        1,
                        "param/fc.weight",
                        &crate::value::tensor::Tensor::from_vec(vec![values[1] * rank as f32]),
                    );
                    r.finish()
                })
                .collect(),
        };
        let why = nothing_compared(CheckKind::Replicas, &trace([1.0, 2.0]));
        assert!(
            why.contains(
                "the ranks train different models: rank 1's `param/fc.weight` differs \
                          from rank 0's at step 1"
            ),
            "{why}"
        );
        // Same parameters on both ranks (only their data differs): no replicated record.
        let why = nothing_compared(CheckKind::Replicas, &trace([1.0, 0.0]));
        assert!(why.contains("no record is replicated"), "{why}");
        // A wrapper that shards the parameters (DeepSpeed ZeRO-3) is named, not "nothing wraps
        // the model", and its ranks' parts are not "different models".
        let mut sharded = trace([1.0, 2.0]);
        let mut environment = crate::record::Environment::new();
        environment.set(
            crate::launch::SHARDED_KEY,
            "ZeRO stage 3 partitions the parameters",
        );
        sharded.ranks[1].environment = Some(environment);
        let why = nothing_compared(CheckKind::Replicas, &sharded);
        assert!(
            why.contains("no record is replicated: ZeRO stage 3 partitions the parameters"),
            "{why}"
        );
        let empty = Trace {
            ranks: vec![Recorder::new(0, RecordLevel::Stats).finish()],
        };
        assert!(nothing_compared(CheckKind::Repeat, &empty).contains("recorded no record"));
    }

    #[test]
    fn world_sizes_hold_in_reproducible_mode_and_rank_ordered_is_caught_at_step_0() {
        let train = |mode: &str, expect: &str| {
            let text = format!(
                r#"{{"kind": "train", "world_size": 2, "steps": 2, "seed": 5,
                    "reduction": "{mode}", "deterministic_comm": true, "expect": "{expect}",
                    "checks": ["world_sizes"], "world_sizes": [1, 2, 3, 4, 8],
                    "params": {{"dataset_size": 96, "global_batch": 24}}}}"#
            );
            KindRegistry::builtin()
                .build(
                    serde_json::from_str(&text).unwrap(),
                    std::path::Path::new("ws.json"),
                )
                .unwrap()
        };
        let report = run_checks(
            &train("reproducible", "identical"),
            &CheckOptions::default(),
        );
        let report = report.unwrap();
        assert!(report.passed(), "{}", report.explain_failures());
        assert!(report.num_compared() > 0);
        let control = train("rank_ordered", "diverges");
        assert_eq!(
            first(&control),
            (CheckKind::WorldSizes, 0, 0, "grad/fc1.weight".into())
        );
        let report = run_checks(&control, &CheckOptions::default()).unwrap();
        let note = report.outcomes[0].note.as_deref().unwrap();
        assert!(note.starts_with("world size 1 (smallest) vs "), "{note}");
    }

    #[test]
    fn restart_resumes_bit_for_bit_and_a_forgotten_generator_is_caught_at_the_restart_step() {
        let train = |optimizer: &str, plant: &str, expect: &str| {
            let text = format!(
                r#"{{"kind": "train", "world_size": 2, "steps": 6, "seed": 9,
                    "reduction": "ring", "deterministic_comm": true, "expect": "{expect}",
                    "checks": ["restart"], "restart_at": 4,
                    "params": {{"dataset_size": 64, "global_batch": 16, "dropout": 0.3,
                               "dropout_rng": "sequential", "optimizer": {optimizer}{plant}}}}}"#
            );
            KindRegistry::builtin()
                .build(
                    serde_json::from_str(&text).unwrap(),
                    std::path::Path::new("restart.json"),
                )
                .unwrap()
        };
        for optimizer in [
            r#"{"kind": "adam", "lr": 0.01}"#,
            r#"{"kind": "sgd", "lr": 0.05, "momentum": 0.9}"#,
        ] {
            let report =
                run_checks(&train(optimizer, "", "identical"), &CheckOptions::default()).unwrap();
            assert!(report.passed(), "{}", report.explain_failures());
            // Per rank: `init/*` (4), then per step local_grad, grad, param (4 each) and loss.
            assert_eq!(report.outcomes[0].comparison.num_compared, 2 * (4 + 6 * 13));
        }
        let control = train(
            r#"{"kind": "adam", "lr": 0.01}"#,
            r#", "plant": "resume_without_rng""#,
            "diverges",
        );
        assert_eq!(
            first(&control),
            (CheckKind::Restart, 4, 0, "local_grad/fc1.weight".into())
        );
    }

    /// The loader and restart controls depend on worker timing (the first two) or not at all
    /// (the third); each must be caught on every attempt, by every check it lists.
    #[test]
    fn loader_and_restart_controls_are_caught_every_time() {
        let registry = KindRegistry::builtin();
        for (file, check) in [
            ("control_completion_order_loader", CheckKind::Workers),
            ("control_shared_augment_rng", CheckKind::Workers),
            ("control_resume_without_rng_state", CheckKind::Restart),
        ] {
            let path = format!("{}/scenarios/{file}.json", env!("CARGO_MANIFEST_DIR"));
            let control = registry.load_file(std::path::Path::new(&path)).unwrap();
            assert!(control.checks.contains(&check));
            for attempt in 0..10 {
                let report = run_checks(&control, &CheckOptions::default()).unwrap();
                assert!(
                    report.passed(),
                    "{file}, attempt {attempt}: {}",
                    report.explain_failures()
                );
            }
        }
    }

    #[test]
    fn a_run_error_is_an_error_not_a_divergence() {
        let s = scenario(
            "collective",
            3,
            "",
            r#"{"fault": {"rank": 1, "step": 0, "kind": "error"}}"#,
        );
        let err = run_checks(&s, &CheckOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "scenario `inline`, run 1: rank 1 failed: planted error at step 0"
        );
    }

    /// `devices` on a CPU scenario runs it on the GPU against the CPU; without a GPU it is
    /// skipped with the reason, never a failure and never a silent pass.
    #[test]
    fn devices_compares_the_gpu_with_the_cpu_or_says_why_not() {
        let text = r#"{"kind": "collective", "world_size": 3, "steps": 2, "seed": 3,
            "reduction": "ring", "deterministic_comm": true, "expect": "identical",
            "checks": ["devices"], "params": {"elements": 1000}}"#;
        let spec = serde_json::from_str(text).unwrap();
        let scenario = KindRegistry::builtin()
            .build(spec, std::path::Path::new("inline.json"))
            .unwrap();
        let report = run_checks(&scenario, &CheckOptions::default()).unwrap();
        let outcome = &report.outcomes[0];
        assert_eq!(outcome.kind, CheckKind::Devices);
        match gpu_runner_dyn() {
            Ok(_) => {
                assert!(outcome.skipped.is_none());
                assert!(
                    outcome.comparison.is_identical(),
                    "{:?}",
                    outcome.comparison.first
                );
                assert!(outcome.comparison.num_compared > 0);
            }
            Err(reason) => {
                println!("no GPU ({reason}): `devices` is skipped");
                assert_eq!(outcome.skipped.as_deref(), Some(NO_GPU));
                assert!(outcome.holds());
            }
        }
    }
}
