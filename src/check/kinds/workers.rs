//! The `workers` check: the run at each of the spec's data-loader worker counts, every record
//! compared with the first count's.
//!
//! Main type: [`Workers`], its unit. Its runs are run 1 with each worker count
//! (`RunPlan::loader_workers`, `series.rs`); its drill-down re-runs the first differing pair of
//! counts.
//!
//! Determinism: each count's run is run 1 (its perturbation) with that count, so the outcome is a
//! function of the scenario and of how the loader delivers batches. Limits: a loader whose order
//! depends on its workers' timing may differ in one attempt and not in another (the shipped
//! controls are caught in each of ten attempts: `check/mod.rs`'s tests).

use super::series::compare_series;
use super::{run_planned, CheckUnit, Compared, Drill, Pair, Runs};
use crate::compare::{compare_traces, Divergence, TraceView};
use crate::run::RunError;
use crate::scenario::RunPlan;

/// The `workers` check's unit.
pub(super) struct Workers;

/// The plan of a run with `workers` loader workers.
fn workers_plan(workers: usize) -> RunPlan {
    RunPlan {
        loader_workers: Some(workers),
        ..RunPlan::default()
    }
}

impl CheckUnit for Workers {
    fn sides(&self) -> (&'static str, &'static str) {
        ("first", "other")
    }

    /// The scenario with each of its `workers` loader worker counts, every record compared with
    /// the first count's.
    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        let (runner, scenario, options) = (runs.runner, runs.scenario, runs.options);
        let run_at =
            |workers: usize| run_planned(runner, scenario, options, 1, &workers_plan(workers));
        compare_series(
            &scenario.spec.workers,
            run_at,
            |a, b| compare_traces(a, b, TraceView::All),
            |a, b| format!("{a} workers (first) vs {b} workers"),
            |w| format!("{w} workers"),
            "workers",
        )
    }

    fn drill_down<'a>(
        &self,
        runs: &Runs<'a>,
        d: &Divergence,
        pair: Option<&'a Pair>,
    ) -> Option<Drill<'a>> {
        let (left_label, right_label) = self.sides();
        let (runner, scenario) = (runs.runner, runs.scenario);
        pair.map(|(a, b, base)| Drill::Pair {
            left: runs.side(runner, scenario, 1, workers_plan(*a), d.rank, left_label),
            right: runs.side(runner, scenario, 1, workers_plan(*b), d.rank, right_label),
            left_trace: base,
        })
    }
}
