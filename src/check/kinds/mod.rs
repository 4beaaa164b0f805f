//! Check kinds as units: each kind of check (`repeat`, `replicas`, `backends`, `world_sizes`,
//! `workers`, `restart`, `buckets`, `variants`, `devices`, `batch_sizes`) is one file here behind
//! one trait, [`CheckUnit`]: which runs it needs beyond run 1 and run 2 and how it compares them
//! (the comparison, or why it is n/a here, a note, the curves, the first differing pair), its two
//! sides' labels, and which sides a drill-down re-runs for the first differing element.
//!
//! [`unit()`] is the one registration, a `match` from [`CheckKind`] to its unit: a new check kind
//! is a new file here and one line there. [`Runs`] is what a unit sees of the check in progress
//! (the runner, the scenario, the options, run 1 and, when `repeat` is asked, run 2);
//! `run_checks_on` (`check/mod.rs`) makes run 1 and run 2, asks each kind's unit in the order of
//! the scenario's checks, and post-processes the outcomes ([`Runs::name_element`] is the
//! drill-down's part of it). Shared here: [`Runs::side`] (a side re-run as run k), [`run_of`],
//! [`curves_of`]; in `series.rs`, the series of runs that `world_sizes`, `workers`, `buckets` and
//! `batch_sizes` compare with their first (and the first differing pair, which `variants` keeps
//! too).
//!
//! Determinism: a unit's runs are run k of the scenario (or of a resized scenario, a variant)
//! under perturbation k, seeded by the scenario's seed, and each is independent of the others, so
//! the order the units are asked in changes no outcome; a drill-down's side is the same request
//! as the run it repeats, with a capture added.
//!
//! Limits: a unit is asked once per scenario: a kind listed twice in a hand-built scenario's
//! checks (a file cannot list one twice) is not run again, and its later listing finds what
//! [`CheckUnit::listed_again`] says.

mod backends;
mod batch_sizes;
mod buckets;
mod devices;
mod repeat;
mod replicas;
mod restart;
mod series;
mod variants;
mod workers;
mod world_sizes;

pub(crate) use backends::backends_applies;
#[cfg(test)]
pub(crate) use devices::NO_GPU;
pub use replicas::ONE_RANK_HAS_NO_REPLICAS;

use crate::check::{CheckOutcome, CURVE_NAME};
use crate::compare::curves::{curve_of_trace, Curve};
use crate::compare::{Comparison, Difference, Divergence, ElementFinding, NoElementDetail};
use crate::diagnose::element::{self, Side};
use crate::record::Trace;
use crate::run::{perturbation, runner_for, CheckOptions, RunError, RunRequest, Runner};
use crate::scenario::{CheckKind, LoadedScenario, Program, RunPlan};

/// The unit of a check kind: the one registration of every kind (module doc).
pub(crate) fn unit(kind: CheckKind) -> &'static dyn CheckUnit {
    match kind {
        CheckKind::Repeat => &repeat::Repeat,
        CheckKind::Replicas => &replicas::Replicas,
        CheckKind::Backends => &backends::Backends,
        CheckKind::WorldSizes => &world_sizes::WorldSizes,
        CheckKind::Workers => &workers::Workers,
        CheckKind::Restart => &restart::Restart,
        CheckKind::Variants => &variants::Variants,
        CheckKind::Buckets => &buckets::Buckets,
        CheckKind::Devices => &devices::Devices,
        CheckKind::BatchSizes => &batch_sizes::BatchSizes,
    }
}

/// One check kind: what it runs beyond run 1 and run 2, how it compares, its two sides, and which
/// sides a drill-down re-runs.
pub(crate) trait CheckUnit {
    /// What the two sides of the check's comparison are, left then right (`run 1` and `run 2`
    /// for `repeat`; `rank 0` and `this rank` for `replicas`).
    fn sides(&self) -> (&'static str, &'static str);

    /// Runs what the check needs beyond run 1 and run 2 (`runs.first`, `runs.second`) and
    /// compares: the comparison, or the reason the check is n/a here, with the note, the curves
    /// and the first differing pair (for the drill-down) where the kind has them.
    ///
    /// # Errors
    /// [`RunError`] when one of its runs fails.
    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError>;

    /// What a later listing of the kind in the same checks finds, `earlier` being what its first
    /// listing found (module doc, limits): by default nothing (an empty comparison), the first
    /// listing having taken the runs' result.
    fn listed_again(&self, earlier: &Compared) -> Compared {
        let _ = earlier;
        Compared::nothing()
    }

    /// The two sides a drill-down re-runs, each capturing the record of divergence `d`, to name
    /// its first differing element; `pair` is the first differing pair that
    /// [`CheckUnit::compare`] found. `None` where the kind's runs are not re-run for the element.
    fn drill_down<'a>(
        &self,
        runs: &Runs<'a>,
        d: &Divergence,
        pair: Option<&'a Pair>,
    ) -> Option<Drill<'a>>;
}

/// The first differing pair of a series of runs: (the base value, the other value, the base
/// run's trace), to run both sides again for the element detail.
pub(crate) type Pair = (usize, usize, Trace);

/// What a unit found ([`CheckUnit::compare`]).
pub(crate) struct Compared {
    /// The comparison the verdict and the divergence map come from.
    pub(crate) comparison: Comparison,
    /// Why the check cannot run here, when it cannot (`backends` on thread ranks, `devices`
    /// without a GPU).
    pub(crate) skipped: Option<&'static str>,
    /// What the check compared, when its labels need it.
    pub(crate) note: Option<String>,
    /// The loss curves of the two runs the comparison compared, left then right.
    pub(crate) curves: Option<(Curve, Curve)>,
    /// The first differing pair, for the drill-down.
    pub(crate) differing: Option<Pair>,
}

impl Compared {
    /// A comparison alone: no note, curves or pair.
    pub(crate) fn of(comparison: Comparison) -> Self {
        Compared {
            comparison,
            skipped: None,
            note: None,
            curves: None,
            differing: None,
        }
    }

    /// An empty comparison: nothing compared.
    pub(crate) fn nothing() -> Self {
        Compared::of(Comparison::empty())
    }

    /// n/a here, for `why`.
    pub(crate) fn not_applicable(why: &'static str) -> Self {
        Compared {
            skipped: Some(why),
            ..Compared::nothing()
        }
    }

    /// The same findings again, without the pair (the drill-down finds the first listing's).
    pub(crate) fn again(&self) -> Self {
        Compared {
            comparison: self.comparison.clone(),
            skipped: self.skipped,
            note: self.note.clone(),
            curves: self.curves.clone(),
            differing: None,
        }
    }
}

/// The sides a drill-down re-runs ([`CheckUnit::drill_down`]).
pub(crate) enum Drill<'a> {
    /// One side each, and the left side's trace in the check (`element::find`).
    Pair {
        left: Side<'a>,
        right: Side<'a>,
        left_trace: &'a Trace,
    },
    /// A global tensor's shards: every rank of each side, and the base run's trace
    /// (`element::find_sharded`).
    Sharded {
        left: Vec<Side<'a>>,
        right: Vec<Side<'a>>,
        base: &'a Trace,
    },
}

/// Run `k` of `scenario` (this one, or a variant of it) on `on`: under perturbation k (rotation
/// k − 1).
pub(crate) fn run_of(
    on: &dyn Runner,
    scenario: &LoadedScenario,
    options: &CheckOptions,
    k: usize,
) -> Result<Trace, RunError> {
    run_planned(on, scenario, options, k, &RunPlan::default())
}

/// The plan of run 1: the default, or, when `batch_sizes` is the only check, its first size's
/// (each sample's rows), so that the unit takes run 1 as its first size's run and a passing
/// check of N sizes launches the program N times.
pub(crate) fn first_plan(scenario: &LoadedScenario, checks: &[CheckKind]) -> RunPlan {
    match (checks, scenario.spec.batch_sizes.first()) {
        ([CheckKind::BatchSizes], Some(&first)) => batch_sizes::batch_plan(first),
        _ => RunPlan::default(),
    }
}

/// [`run_of`] under `plan` (a loader's workers, a bucket layout).
pub(crate) fn run_planned(
    on: &dyn Runner,
    scenario: &LoadedScenario,
    options: &CheckOptions,
    k: usize,
    plan: &RunPlan,
) -> Result<Trace, RunError> {
    let p = Some(perturbation(scenario.spec.seed, k, options));
    on.run(scenario, &RunRequest::new(scenario, options, p, k, plan))
}

/// The [`CURVE_NAME`] curves of two runs, labelled, when both record it.
pub(crate) fn curves_of(
    left: &Trace,
    right: &Trace,
    labels: (&str, &str),
) -> Option<(Curve, Curve)> {
    Some((
        curve_of_trace(left, CURVE_NAME, labels.0)?,
        curve_of_trace(right, CURVE_NAME, labels.1)?,
    ))
}

/// What a unit sees of the check in progress, and what the element detail of a check's
/// divergence re-runs: the check's runner and runs.
pub(crate) struct Runs<'a> {
    /// The runner of the check (the scenario's: `run::runner_for`).
    pub(crate) runner: &'a dyn Runner,
    pub(crate) scenario: &'a LoadedScenario,
    pub(crate) options: &'a CheckOptions,
    /// Run 1.
    pub(crate) first: &'a Trace,
    /// The plan run 1 was made under ([`first_plan`]).
    pub(crate) first_plan: RunPlan,
    /// Run 2, when `repeat` is asked, unless `repeat`'s unperturbed runs took its place.
    pub(crate) second: Option<&'a Trace>,
    /// The end states of run 1 and `repeat`'s two unperturbed runs, compared, when they agree
    /// and so took run 2's place (`check/mod.rs`, `unperturbed_runs`).
    pub(crate) unperturbed: Option<&'a Comparison>,
}

impl<'a> Runs<'a> {
    /// Run `k` of the check's scenario on `on` ([`run_of`]).
    pub(crate) fn run(&self, on: &dyn Runner, k: usize) -> Result<Trace, RunError> {
        run_of(on, self.scenario, self.options, k)
    }

    /// A side that runs `scenario` again on `runner` as run `run` (its perturbation) under
    /// `plan`, for rank `rank`'s record.
    pub(crate) fn side(
        &self,
        runner: &'a dyn Runner,
        scenario: &'a LoadedScenario,
        run: usize,
        plan: RunPlan,
        rank: u32,
        label: &'static str,
    ) -> Side<'a> {
        let options = self.options;
        let p = Some(perturbation(scenario.spec.seed, run, options));
        Side {
            rerun: Box::new(move |capture, dir| {
                let request =
                    RunRequest::new(scenario, options, p, run, &plan).with_capture(capture, dir);
                runner_for(scenario, runner)?.run(scenario, &request)
            }),
            rank,
            label,
        }
    }

    /// Names the first differing element of `outcome`'s divergence, when it is a digest
    /// difference: its two sides ([`CheckUnit::drill_down`]) are run again, capturing that
    /// record.
    pub(crate) fn name_element<'p>(&self, outcome: &mut CheckOutcome, pair: Option<&'p Pair>)
    where
        'a: 'p,
    {
        let Some(d) = outcome.comparison.first.clone() else {
            return;
        };
        if d.difference != Difference::Digest || d.element.is_some() {
            return;
        }
        let (finding, operator) = match unit(outcome.kind).drill_down(self, &d, pair) {
            Some(Drill::Sharded { left, right, base }) => {
                // A global tensor: every rank of each side is run again for its shard.
                let finding = element::find_sharded(&d, base, &left, &right);
                outcome
                    .comparison
                    .annotate(d.key(), |row| row.element = Some(finding.clone()));
                return;
            }
            Some(Drill::Pair {
                left,
                right,
                left_trace,
            }) => element::find(&d, left_trace, &left, &right),
            // What the unit's own comparison found of the operator stays (`batch_sizes`).
            None => (
                ElementFinding::Unavailable(NoElementDetail::NotCaptured {
                    reason: format!("`{}` runs are not re-run for the element", outcome.kind),
                }),
                d.operator.clone(),
            ),
        };
        // Operators are traced in programs (`detcheck.torch.watch`), never in built-in kinds,
        // whose records may share the names' prefixes.
        let operator = operator.filter(|_| matches!(self.scenario.program, Program::Command(_)));
        outcome.comparison.annotate(d.key(), |row| {
            row.element = Some(finding.clone());
            row.operator.clone_from(&operator);
        });
    }
}
