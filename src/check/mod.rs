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
//! - `devices` (feature `nccl`): run 1 with its collectives on a GPU (thread ranks sharing it)
//!   against the same run on CPU thread ranks; skipped, with the reason, where no GPU is usable.
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
//! hidden by recording fails with the cause `timing`.
//!
//! Invariant (the perturbations of a check are seeded): a check gives the same verdict every time,
//! and run 2's arrival order differs from run 1's in every collective. MPI ranks too: under a
//! perturbation a round's contributions count in its seeded order, never in the order
//! `MPI_ANY_SOURCE` delivered them (`comm/mpi.rs`, `round_order`).
//!
//! Invariant (a resumed run is the continuous run; the `restart` check): a program's checkpoint
//! holds every piece of state that later steps read (parameters, optimizer state, sequential
//! generators, the loader's position); per-sample streams have no state by design. The `restart`
//! check compares every record of both halves with the continuous run.
//!
//! Determinism: the perturbations are derived from the scenario's seed, so a check is repeatable;
//! the two runs' perturbations differ in every round, so an order-dependent reduction with three or
//! more ranks is caught every time.

mod element;
mod session;
mod settings;

pub use crate::run::{CheckOptions, RunError};
#[cfg(feature = "mpi")]
pub use session::run_on_mpi_world;
pub use session::{launcher_rank, launcher_size, mpi_skip_reason, Session, SessionError};
pub use settings::SettingsFinding;

use crate::compare::curves::{curve_of_trace, Curve};
use crate::compare::{
    compare_traces, decide_cause, is_sharded, CauseClass, Comparison, Difference, Divergence,
    DivergenceMap, ElementFinding, NoElementDetail, RecordSummary, TraceView,
};
use crate::file::{DumpError, FolderLock};
use crate::record::overflow::{first_overflow, Overflow};
use crate::record::Trace;
use crate::run::gpu::gpu_runner_dyn;
use crate::run::{perturbation, runner_for, RunRequest, Runner, ThreadRunner};
use crate::scenario::{
    BucketLayout, CheckKind, Device, Expectation, LoadedScenario, Program, RunPlan,
};
use crate::value::digest::{ExactF64, Stats};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What the two sides of a check's comparison are, left then right.
fn kind_sides(kind: CheckKind) -> (&'static str, &'static str) {
    match kind {
        CheckKind::Repeat => ("run 1", "run 2"),
        CheckKind::Replicas => ("rank 0", "this rank"),
        CheckKind::Backends => ("mpi", "threads"),
        CheckKind::WorldSizes => ("smallest", "larger"),
        CheckKind::Workers => ("first", "other"),
        CheckKind::Restart => ("continuous", "resumed"),
        CheckKind::Variants => ("first", "variant"),
        CheckKind::Buckets => ("first", "other"),
        CheckKind::Devices => ("gpu", "cpu"),
    }
}

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
        kind_sides(self.kind)
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
    let mut out = format!("  first divergence: {d}\n");
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

/// The first pair of a series that differs: its comparison, which value of the series (or
/// variant) it was, and the two runs' curves.
type FirstDiffering = (Comparison, usize, Option<(Curve, Curve)>);

/// The [`CURVE_NAME`] curves of two runs, labelled, when both record it.
fn curves_of(left: &Trace, right: &Trace, labels: (&str, &str)) -> Option<(Curve, Curve)> {
    Some((
        curve_of_trace(left, CURVE_NAME, labels.0)?,
        curve_of_trace(right, CURVE_NAME, labels.1)?,
    ))
}

/// Runs the scenario once per value of a series (world sizes, worker counts) under run 1's
/// perturbation and compares each run with the first: the total, and a note naming the first
/// pair that differs (`describe(first, other)`), or the whole series when none does. The first
/// differing pair's comparison is kept whole (its first divergence and map), with the two runs'
/// curves (labelled `label(value)`).
fn compare_series(
    values: &[usize],
    run_at: impl Fn(usize) -> Result<Trace, RunError>,
    compare: impl Fn(&Trace, &Trace) -> Comparison,
    describe: impl Fn(usize, usize) -> String,
    label: impl Fn(usize) -> String,
    series: &str,
) -> Result<SeriesOutcome, RunError> {
    let Some((&first, others)) = values.split_first() else {
        return Ok(SeriesOutcome {
            comparison: Comparison::empty(),
            note: format!("no {series} fits"),
            curves: None,
            differing: None,
        });
    };
    let base = run_at(first)?;
    let mut found: Option<FirstDiffering> = None;
    let (mut num_compared, mut num_differing) = (0, 0);
    for &value in others {
        let other = run_at(value)?;
        let c = compare(&base, &other);
        num_compared += c.num_compared;
        num_differing += c.num_differing;
        if found.is_none() && !c.is_identical() {
            let curves = curves_of(&base, &other, (&label(first), &label(value)));
            found = Some((c, value, curves));
        }
    }
    let differing = found
        .as_ref()
        .map(|(_, value, _)| (first, *value, base.clone()));
    let (mut comparison, note, curves) = match found {
        Some((c, value, curves)) => (c, describe(first, value), curves),
        None => (Comparison::empty(), format!("{series} {values:?}"), None),
    };
    comparison.num_compared = num_compared;
    comparison.num_differing = num_differing;
    Ok(SeriesOutcome {
        comparison,
        note,
        curves,
        differing,
    })
}

/// What a check over several runs found: the comparison (the totals of the series, the first
/// differing pair's divergence and map), a note naming what was compared, and the curves of the
/// first differing pair.
struct SeriesOutcome {
    comparison: Comparison,
    note: String,
    curves: Option<(Curve, Curve)>,
    /// The first differing pair: (the base value, the other value, the base run's trace), to
    /// run both sides again for the element detail.
    differing: Option<(usize, usize, Trace)>,
}

/// The `world_sizes` check: the scenario at each of its `world_sizes` (those the runner can
/// launch), rank 0's replicated records compared with the smallest size's.
fn compare_across_world_sizes(
    runner: &dyn Runner,
    scenario: &LoadedScenario,
    options: &CheckOptions,
) -> Result<SeriesOutcome, RunError> {
    let mut sizes = scenario.spec.world_sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    sizes.retain(|&w| runner.max_world_size().is_none_or(|max| w <= max));
    let run_at = |world_size: usize| {
        let mut resized = scenario.clone();
        resized.spec.world_size = world_size;
        let p = perturbation(scenario.spec.seed, 1, options);
        runner.run(
            &resized,
            &RunRequest::new(&resized, options, Some(p), 1, &RunPlan::default()),
        )
    };
    compare_series(
        &sizes,
        run_at,
        |a, b| compare_traces(a, b, TraceView::RankZeroReplicated),
        |a, b| format!("world size {a} (smallest) vs {b} (larger)"),
        |w| format!("world size {w}"),
        "world sizes",
    )
}

/// The `workers` check: the scenario with each of its `workers` loader worker counts, every
/// record compared with the first count's.
fn compare_across_workers(
    runner: &dyn Runner,
    scenario: &LoadedScenario,
    options: &CheckOptions,
) -> Result<SeriesOutcome, RunError> {
    let run_at = |workers: usize| {
        let p = perturbation(scenario.spec.seed, 1, options);
        let plan = RunPlan {
            loader_workers: Some(workers),
            ..RunPlan::default()
        };
        runner.run(
            scenario,
            &RunRequest::new(scenario, options, Some(p), 1, &plan),
        )
    };
    compare_series(
        &scenario.spec.workers,
        run_at,
        |a, b| compare_traces(a, b, TraceView::All),
        |a, b| format!("{a} workers (first) vs {b} workers"),
        |w| format!("{w} workers"),
        "workers",
    )
}

/// The `buckets` check: the scenario with each of its `buckets` layouts (the same gradients
/// fused into other allreduce buckets), every record compared with the first layout's.
fn compare_across_buckets(
    runner: &dyn Runner,
    scenario: &LoadedScenario,
    options: &CheckOptions,
) -> Result<SeriesOutcome, RunError> {
    let layouts = &scenario.spec.buckets;
    let run_at = |i: usize| {
        let p = perturbation(scenario.spec.seed, 1, options);
        let plan = buckets_plan(layouts[i]);
        runner.run(
            scenario,
            &RunRequest::new(scenario, options, Some(p), 1, &plan),
        )
    };
    let indices: Vec<usize> = (0..layouts.len()).collect();
    compare_series(
        &indices,
        run_at,
        |a, b| compare_traces(a, b, TraceView::All),
        |a, b| format!("bucket layout {} (first) vs {}", layouts[a], layouts[b]),
        |i| layouts[i].to_string(),
        "bucket layouts",
    )
}

/// The plan of a run with bucket layout `layout`.
fn buckets_plan(layout: BucketLayout) -> RunPlan {
    RunPlan {
        bucket_layout: Some(layout),
        ..RunPlan::default()
    }
}

/// The `variants` check: run 1 again under each of the spec's variants (run 1's perturbation),
/// every record compared with run 1's.
fn compare_variants(
    runner: &dyn Runner,
    scenario: &LoadedScenario,
    options: &CheckOptions,
    first: &Trace,
) -> Result<SeriesOutcome, RunError> {
    let p = Some(perturbation(scenario.spec.seed, 1, options));
    let mut found: Option<FirstDiffering> = None;
    let (mut num_compared, mut num_differing) = (0, 0);
    for (i, variant) in scenario.variants.iter().enumerate() {
        let request = RunRequest::new(variant, options, p, 1, &RunPlan::default());
        let trace = runner_for(variant, runner)?.run(variant, &request)?;
        let c = compare_traces(first, &trace, TraceView::All);
        num_compared += c.num_compared;
        num_differing += c.num_differing;
        if found.is_none() && !c.is_identical() {
            let curves = curves_of(first, &trace, ("as written", &format!("variant {i}")));
            found = Some((c, i, curves));
        }
    }
    let differing_variant = found.as_ref().map(|(_, i, _)| *i);
    let (mut comparison, note, curves) = match found {
        Some((c, i, curves)) => (
            c,
            format!(
                "variant {i} ({}) vs the scenario as written",
                scenario.spec.variants[i].describe()
            ),
            curves,
        ),
        None => (
            Comparison::empty(),
            format!("{} variants", scenario.variants.len()),
            None,
        ),
    };
    comparison.num_compared = num_compared;
    comparison.num_differing = num_differing;
    Ok(SeriesOutcome {
        comparison,
        note,
        curves,
        differing: differing_variant.map(|i| (0, i, first.clone())),
    })
}

/// A folder for one restart check's checkpoints, claimed ([`FolderLock`]) by the process that
/// runs the check (under MPI the leader, before any rank writes), and removed when dropped.
struct RestartFolder {
    dir: PathBuf,
    _lock: FolderLock,
}

impl RestartFolder {
    /// A new folder in the temporary folder. Its name is this process's and a counter's, and it
    /// is created exclusively (a name already taken, by a run killed earlier or one in another
    /// PID namespace that shares the folder, is skipped), so no other run's files are in it.
    fn new(scenario: &str) -> Result<Self, RunError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let failed = |source: DumpError| RunError::Checkpoints {
            scenario: scenario.to_owned(),
            source,
        };
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("detcheck-restart-{}-{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    let lock = FolderLock::claim(&dir, "checkpoint").map_err(|e| {
                        let _ = std::fs::remove_dir_all(&dir);
                        failed(e)
                    })?;
                    return Ok(RestartFolder { dir, _lock: lock });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(failed(DumpError::io("create folder", &dir, e))),
            }
        }
    }
}

impl Drop for RestartFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `restart` check: run 3 stops after `restart_step()` steps and saves a checkpoint; run 4,
/// a fresh launch, resumes from it and runs to the end. Both (under run 2's perturbation)
/// joined are compared with the continuous run 1, record by record.
fn compare_restart(
    runner: &dyn Runner,
    scenario: &LoadedScenario,
    options: &CheckOptions,
    continuous: &Trace,
) -> Result<SeriesOutcome, RunError> {
    let at = scenario.spec.restart_step();
    let folder = RestartFolder::new(&scenario.name)?;
    let p = Some(perturbation(scenario.spec.seed, 2, options));
    let before = RunPlan {
        stop_at: Some(at),
        checkpoint_to: Some(folder.dir.clone()),
        ..RunPlan::default()
    };
    let after = RunPlan {
        resume_from: Some(folder.dir.clone()),
        remove_after_resume: true,
        ..RunPlan::default()
    };
    let mut joined = runner.run(scenario, &RunRequest::new(scenario, options, p, 3, &before))?;
    let resumed = runner.run(scenario, &RunRequest::new(scenario, options, p, 4, &after))?;
    for (rank, tail) in joined.ranks.iter_mut().zip(resumed.ranks) {
        rank.records.extend(tail.records);
    }
    Ok(SeriesOutcome {
        comparison: compare_traces(continuous, &joined, TraceView::All),
        note: format!("checkpoint after step {at}, resumed in a fresh launch"),
        curves: curves_of(continuous, &joined, ("continuous", "resumed")),
        differing: None,
    })
}

/// What the element detail of a check's divergence re-runs: the check's runner and runs.
struct Runs<'a> {
    runner: &'a dyn Runner,
    scenario: &'a LoadedScenario,
    options: &'a CheckOptions,
    first: &'a Trace,
    second: Option<&'a Trace>,
}

impl<'a> Runs<'a> {
    /// A side that runs `scenario` again on `runner` as run `run` (its perturbation) under
    /// `plan`, for rank `rank`'s record.
    fn side(
        &self,
        runner: &'a dyn Runner,
        scenario: &'a LoadedScenario,
        run: usize,
        plan: RunPlan,
        rank: u32,
        label: &'static str,
    ) -> element::Side<'a> {
        let options = self.options;
        let p = Some(perturbation(scenario.spec.seed, run, options));
        element::Side {
            rerun: Box::new(move |capture, dir| {
                let request =
                    RunRequest::new(scenario, options, p, run, &plan).with_capture(capture, dir);
                runner_for(scenario, runner)?.run(scenario, &request)
            }),
            rank,
            label,
        }
    }

    /// As [`Runs::side`], for a scenario of its own (a resized one): the side owns it.
    fn owned_side(
        &self,
        scenario: LoadedScenario,
        run: usize,
        plan: RunPlan,
        rank: u32,
        label: &'static str,
    ) -> element::Side<'a> {
        let (runner, options) = (self.runner, self.options);
        let p = Some(perturbation(scenario.spec.seed, run, options));
        element::Side {
            rerun: Box::new(move |capture, dir| {
                let request =
                    RunRequest::new(&scenario, options, p, run, &plan).with_capture(capture, dir);
                runner_for(&scenario, runner)?.run(&scenario, &request)
            }),
            rank,
            label,
        }
    }

    /// The resumed side of `restart` at `step`: run 3 (stopped after the restart step, with its
    /// checkpoint) captures a step before it; a later step is run 4's, which resumes from run
    /// 3's checkpoint in a fresh launch, as the check ran them.
    fn resumed_side(&self, step: u64, rank: u32, label: &'static str) -> element::Side<'a> {
        let (runner, scenario, options) = (self.runner, self.scenario, self.options);
        let at = scenario.spec.restart_step();
        let p = Some(perturbation(scenario.spec.seed, 2, options));
        element::Side {
            rerun: Box::new(move |capture, dir| {
                let folder = RestartFolder::new(&scenario.name)?;
                let before = RunPlan {
                    stop_at: Some(at),
                    checkpoint_to: Some(folder.dir.clone()),
                    ..RunPlan::default()
                };
                let mut request = RunRequest::new(scenario, options, p, 3, &before);
                if step < at {
                    request = request.with_capture(capture, dir);
                }
                let stopped = runner_for(scenario, runner)?.run(scenario, &request)?;
                if step < at {
                    return Ok(stopped);
                }
                let after = RunPlan {
                    resume_from: Some(folder.dir.clone()),
                    remove_after_resume: true,
                    ..RunPlan::default()
                };
                let request =
                    RunRequest::new(scenario, options, p, 4, &after).with_capture(capture, dir);
                runner_for(scenario, runner)?.run(scenario, &request)
            }),
            rank,
            label,
        }
    }

    /// Names the first differing element of `outcome`'s divergence, when it is a digest
    /// difference: its two sides are run again, capturing that record.
    fn name_element(&self, outcome: &mut CheckOutcome, pair: Option<&(usize, usize, Trace)>) {
        let Some(d) = outcome.comparison.first.clone() else {
            return;
        };
        if d.difference != Difference::Digest || d.element.is_some() {
            return;
        }
        let (left_label, right_label) = outcome.side_labels();
        let (runner, scenario) = (self.runner, self.scenario);
        let plain = RunPlan::default;
        let resized = |size: usize| {
            let mut resized = scenario.clone();
            resized.spec.world_size = size;
            resized
        };
        if outcome.kind == CheckKind::WorldSizes {
            if let Some((a, b, base)) = pair.filter(|(_, _, base)| is_sharded(base, &d)) {
                // A global tensor: every rank of each side is run again for its shard.
                let sides = |size: usize, label| -> Vec<element::Side<'a>> {
                    (0..size as u32)
                        .map(|r| self.owned_side(resized(size), 1, plain(), r, label))
                        .collect()
                };
                let finding = element::find_sharded(
                    &d,
                    base,
                    &sides(*a, left_label),
                    &sides(*b, right_label),
                );
                outcome
                    .comparison
                    .annotate(d.key(), |row| row.element = Some(finding.clone()));
                return;
            }
        }
        let sides = match outcome.kind {
            CheckKind::Repeat => Some((
                self.side(runner, scenario, 1, plain(), d.rank, left_label),
                self.side(runner, scenario, 2, plain(), d.rank, right_label),
                self.first,
            )),
            CheckKind::Replicas => {
                // The run whose replicas differ: the first, unless only the second's do.
                let (run, trace) = match self.second {
                    Some(second)
                        if compare_traces(self.first, self.first, TraceView::Replicas)
                            .is_identical() =>
                    {
                        (2, second)
                    }
                    _ => (1, self.first),
                };
                Some((
                    self.side(runner, scenario, run, plain(), 0, left_label),
                    self.side(runner, scenario, run, plain(), d.rank, right_label),
                    trace,
                ))
            }
            CheckKind::Backends => Some((
                self.side(runner, scenario, 1, plain(), d.rank, left_label),
                self.side(&ThreadRunner, scenario, 1, plain(), d.rank, right_label),
                self.first,
            )),
            CheckKind::Workers => pair.map(|(a, b, base)| {
                let workers = |w: usize| RunPlan {
                    loader_workers: Some(w),
                    ..RunPlan::default()
                };
                (
                    self.side(runner, scenario, 1, workers(*a), d.rank, left_label),
                    self.side(runner, scenario, 1, workers(*b), d.rank, right_label),
                    base,
                )
            }),
            CheckKind::Buckets => pair.and_then(|(a, b, base)| {
                let layouts = &scenario.spec.buckets;
                Some((
                    self.side(
                        runner,
                        scenario,
                        1,
                        buckets_plan(*layouts.get(*a)?),
                        d.rank,
                        left_label,
                    ),
                    self.side(
                        runner,
                        scenario,
                        1,
                        buckets_plan(*layouts.get(*b)?),
                        d.rank,
                        right_label,
                    ),
                    base,
                ))
            }),
            CheckKind::Variants => pair.and_then(|(_, i, base)| {
                let variant = scenario.variants.get(*i)?;
                Some((
                    self.side(runner, scenario, 1, plain(), d.rank, left_label),
                    self.side(runner, variant, 1, plain(), d.rank, right_label),
                    base,
                ))
            }),
            CheckKind::WorldSizes => pair.map(|(a, b, base)| {
                (
                    self.owned_side(resized(*a), 1, plain(), 0, left_label),
                    self.owned_side(resized(*b), 1, plain(), 0, right_label),
                    base,
                )
            }),
            CheckKind::Restart => Some((
                self.side(runner, scenario, 1, plain(), d.rank, left_label),
                self.resumed_side(d.step, d.rank, right_label),
                self.first,
            )),
            CheckKind::Devices => pair.map(|(_, _, base)| {
                let gpu = gpu_runner_dyn().unwrap_or(runner);
                (
                    self.side(gpu, scenario, 1, plain(), d.rank, left_label),
                    self.side(&ThreadRunner, scenario, 1, plain(), d.rank, right_label),
                    base,
                )
            }),
        };
        let (finding, operator) = match sides {
            Some((left, right, left_trace)) => element::find(&d, left_trace, &left, &right),
            None => (
                ElementFinding::Unavailable(NoElementDetail::NotCaptured {
                    reason: format!("`{}` runs are not re-run for the element", outcome.kind),
                }),
                None,
            ),
        };
        // Operators are traced in programs (`detcheck.torch.watch`), never in built-in kinds,
        // whose records may share the names' prefixes.
        let operator = operator.filter(|_| matches!(scenario.program, Program::Command(_)));
        outcome.comparison.annotate(d.key(), |row| {
            row.element = Some(finding.clone());
            row.operator.clone_from(&operator);
        });
    }
}

/// Names the cause of a program's `repeat` divergence (`compare::decide_cause`). The hash seed,
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

/// Why `replicas` is skipped at one rank: it compares each rank with rank 0, so one rank has
/// nothing to compare, and a pass would claim what was never checked.
pub const ONE_RANK_HAS_NO_REPLICAS: &str =
    "not applicable at one rank (replicas compares every rank with rank 0)";

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
/// follows `DETCHECK_RECORD`; a program that records itself does not).
fn has_end_state(trace: &Trace) -> bool {
    trace
        .ranks
        .iter()
        .any(|r| r.records.iter().any(|x| x.name.starts_with(END_STATE)))
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
            .filter(|r| r.name.starts_with(END_STATE))
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
    if kind != CheckKind::Replicas {
        let (left, right) = kind_sides(kind);
        return format!(
            "compared nothing: the two sides ({left} and {right}) have no record in common"
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

/// Why `devices` is skipped: this process has no GPU it can use.
const NO_GPU: &str = "needs a GPU: build with --features nccl, on a machine with a CUDA driver, \
                      NVRTC and a device (`detcheck check` of a `device: \"gpu\"` scenario names \
                      what is missing)";

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

/// `true` when `backends` applies to the scenario: a deterministic schedule detcheck computes
/// itself, expected to be identical. Under MPI it is added to such scenarios' checks.
pub(crate) fn backends_applies(scenario: &LoadedScenario) -> bool {
    scenario.program.ranks().is_some()
        && scenario.spec.expect == Expectation::Identical
        && scenario.spec.effective_mode().is_backend_independent()
}

/// Runs the scenario's checks with `runner` and reports each outcome. On MPI ranks, `backends`
/// is added where it applies and compares run 1 with the same run on thread ranks.
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
    // Run k of a scenario (this one, or a variant of it) runs under perturbation k (rotation
    // k − 1).
    let run_of = |on: &dyn Runner, scenario: &LoadedScenario, k: usize| {
        let p = Some(perturbation(spec.seed, k, options));
        on.run(
            scenario,
            &RunRequest::new(scenario, options, p, k, &RunPlan::default()),
        )
    };
    let run_on = |on: &dyn Runner, k: usize| run_of(on, scenario, k);
    let first = run_on(runner, 1)?;
    let second = if checks.contains(&CheckKind::Repeat) {
        Some(run_on(runner, 2)?)
    } else {
        None
    };
    let on_threads = if runner.is_mpi() && checks.contains(&CheckKind::Backends) {
        Some(run_on(&ThreadRunner, 1)?)
    } else {
        None
    };
    let mut across_sizes = if checks.contains(&CheckKind::WorldSizes) {
        Some(compare_across_world_sizes(runner, scenario, options)?)
    } else {
        None
    };
    let mut across_workers = if checks.contains(&CheckKind::Workers) {
        Some(compare_across_workers(runner, scenario, options)?)
    } else {
        None
    };
    let mut restart = if checks.contains(&CheckKind::Restart) {
        Some(compare_restart(runner, scenario, options, &first)?)
    } else {
        None
    };
    let mut across_buckets = if checks.contains(&CheckKind::Buckets) {
        Some(compare_across_buckets(runner, scenario, options)?)
    } else {
        None
    };
    let mut variants = if checks.contains(&CheckKind::Variants) {
        Some(compare_variants(runner, scenario, options, &first)?)
    } else {
        None
    };
    // `devices`: run 1 on the GPU against run 1 on CPU thread ranks; skipped without a GPU
    // (a `gpu` scenario has one: its runner is the GPU's).
    let mut on_devices = if checks.contains(&CheckKind::Devices) && !runner.is_mpi() {
        match gpu_runner_dyn() {
            Ok(gpu) => {
                let (on_gpu, on_cpu) = if spec.device == Device::Gpu {
                    (first.clone(), run_on(&ThreadRunner, 1)?)
                } else {
                    (run_on(gpu, 1)?, first.clone())
                };
                let comparison = compare_traces(&on_gpu, &on_cpu, TraceView::All);
                Some(Ok(SeriesOutcome {
                    differing: comparison.first.as_ref().map(|_| (0, 1, on_gpu.clone())),
                    note: "gpu against cpu thread ranks".to_owned(),
                    curves: curves_of(&on_gpu, &on_cpu, ("gpu", "cpu")),
                    comparison,
                }))
            }
            Err(_) => Some(Err(NO_GPU)),
        }
    } else {
        None
    };
    // The first differing pair of each series check, for the element detail.
    let mut pairs: Vec<(CheckKind, (usize, usize, Trace))> = Vec::new();
    let mut outcomes = checks
        .iter()
        .map(|&kind| {
            let mut skipped = None;
            let mut note = None;
            let mut curves = None;
            let comparison = match kind {
                CheckKind::Repeat => match &second {
                    Some(second) => {
                        curves = curves_of(&first, second, ("run 1", "run 2"));
                        compare_traces(&first, second, TraceView::All)
                    }
                    None => Comparison::empty(),
                },
                // The ranks the run had: a program may start more than were launched.
                CheckKind::Replicas if first.ranks.len() < 2 => {
                    skipped = Some(ONE_RANK_HAS_NO_REPLICAS);
                    Comparison::empty()
                }
                CheckKind::Replicas => {
                    // Both runs must hold replicas; report the first run that does not.
                    let in_first = compare_traces(&first, &first, TraceView::Replicas);
                    match &second {
                        Some(second) if in_first.is_identical() => {
                            compare_traces(second, second, TraceView::Replicas)
                        }
                        _ => in_first,
                    }
                }
                CheckKind::Devices => match on_devices.take() {
                    Some(Ok(series)) => {
                        if let Some(pair) = series.differing {
                            pairs.push((kind, pair));
                        }
                        note = Some(series.note);
                        curves = series.curves;
                        series.comparison
                    }
                    Some(Err(reason)) => {
                        skipped = Some(reason);
                        Comparison::empty()
                    }
                    None => {
                        skipped = Some(
                            "runs on thread ranks, not under MPI (there `backends` compares a \
                             `gpu` scenario's NCCL ranks with CPU thread ranks)",
                        );
                        Comparison::empty()
                    }
                },
                CheckKind::Backends => match &on_threads {
                    Some(threads) => {
                        curves = curves_of(&first, threads, ("mpi", "threads"));
                        compare_traces(&first, threads, TraceView::All)
                    }
                    None => {
                        skipped =
                            Some("needs MPI ranks: build with --features mpi, run under mpirun");
                        Comparison::empty()
                    }
                },
                CheckKind::WorldSizes
                | CheckKind::Workers
                | CheckKind::Restart
                | CheckKind::Variants
                | CheckKind::Buckets => {
                    let computed = match kind {
                        CheckKind::WorldSizes => &mut across_sizes,
                        CheckKind::Workers => &mut across_workers,
                        CheckKind::Variants => &mut variants,
                        CheckKind::Buckets => &mut across_buckets,
                        _ => &mut restart,
                    };
                    match computed.take() {
                        Some(series) => {
                            if let Some(pair) = series.differing {
                                pairs.push((kind, pair));
                            }
                            note = Some(series.note);
                            curves = series.curves;
                            series.comparison
                        }
                        None => Comparison::empty(),
                    }
                }
            };
            CheckOutcome {
                kind,
                expectation: spec.expect,
                comparison,
                skipped: skipped.map(str::to_owned),
                empty: false,
                note,
                curves,
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
        let runs = Runs {
            runner,
            scenario,
            options,
            first: &first,
            second: second.as_ref(),
        };
        for outcome in &mut outcomes {
            let pair = pairs
                .iter()
                .find(|(kind, _)| *kind == outcome.kind)
                .map(|(_, pair)| pair);
            runs.name_element(outcome, pair);
        }
    }
    if matches!(scenario.program, Program::Command(_)) {
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
                let third = run_on(runner, 1)?;
                Ok(Some(
                    compare_traces(&first, &third, TraceView::All).is_identical(),
                ))
            };
            let repeats_with_one_hash_seed = probe(&outcome.comparison)?;
            name_cause(&mut outcome.comparison, repeats_with_one_hash_seed);
        }
    }
    let deterministic = match &scenario.program {
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
                        run_of(runner, &variant, k)
                    };
                    Some(settings::which_settings_fix(
                        &repeat.comparison,
                        spec.seed,
                        &first,
                        &run,
                    )?)
                }
                None => None,
            }
        }
        _ => None,
    };
    // A launched program whose two recorded runs agree is run twice more unperturbed (nothing
    // read during its steps): the program as it runs without detcheck.
    let unperturbed = options.unperturbed
        && matches!(scenario.program, Program::Command(_))
        && spec.expect == Expectation::Identical
        && has_end_state(&first);
    if let Some(repeat) = outcomes
        .iter_mut()
        .find(|o| o.kind == CheckKind::Repeat && o.holds() && o.skipped.is_none())
        .filter(|_| unperturbed)
    {
        let quiet = |k: usize| {
            let p = Some(perturbation(spec.seed, k, options));
            let request = RunRequest::new(scenario, options, p, k, &RunPlan::default());
            runner.run(scenario, &request.unperturbed())
        };
        match compare_end_states(&first, quiet)? {
            Some(EndStates {
                comparison,
                differing: Some(what),
            }) => hidden_by_recording(repeat, comparison, what),
            Some(end) => {
                let n = end.comparison.num_compared;
                repeat.comparison.num_compared += n;
                repeat.note = Some(format!(
                    "and the end states of 2 unperturbed runs ({n} records)"
                ));
            }
            None => {}
        }
    }
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
    use super::*;
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
