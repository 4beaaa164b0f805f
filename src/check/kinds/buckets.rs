//! The `buckets` check (fusion invariance): the scenario with each of the spec's bucket layouts
//! (the same gradients fused into other allreduce buckets), every record compared with the first
//! layout's.
//!
//! Main type: [`Buckets`], its unit. Its runs are run 1 with each layout
//! (`RunPlan::bucket_layout`, `series.rs`); its drill-down re-runs the first differing pair of
//! layouts.
//!
//! Determinism: each layout's run is run 1 (its perturbation) with that layout, so the outcome is
//! a function of the scenario. Limits: only the layouts the spec lists are tried.

use super::series::compare_series;
use super::{run_planned, CheckUnit, Compared, Drill, Pair, Runs};
use crate::compare::{compare_traces, Divergence, TraceView};
use crate::run::RunError;
use crate::scenario::{BucketLayout, RunPlan};

/// The `buckets` check's unit.
pub(super) struct Buckets;

/// The plan of a run with bucket layout `layout`.
fn buckets_plan(layout: BucketLayout) -> RunPlan {
    RunPlan {
        bucket_layout: Some(layout),
        ..RunPlan::default()
    }
}

impl CheckUnit for Buckets {
    fn sides(&self) -> (&'static str, &'static str) {
        ("first", "other")
    }

    /// The scenario with each of its `buckets` layouts, every record compared with the first
    /// layout's.
    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        let (runner, scenario, options) = (runs.runner, runs.scenario, runs.options);
        let layouts = &scenario.spec.buckets;
        let run_at =
            |i: usize| run_planned(runner, scenario, options, 1, &buckets_plan(layouts[i]));
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

    fn drill_down<'a>(
        &self,
        runs: &Runs<'a>,
        d: &Divergence,
        pair: Option<&'a Pair>,
    ) -> Option<Drill<'a>> {
        let (left_label, right_label) = self.sides();
        let (runner, scenario) = (runs.runner, runs.scenario);
        let (a, b, base) = pair?;
        let layouts = &scenario.spec.buckets;
        Some(Drill::Pair {
            left: runs.side(
                runner,
                scenario,
                1,
                buckets_plan(*layouts.get(*a)?),
                d.rank,
                left_label,
            ),
            right: runs.side(
                runner,
                scenario,
                1,
                buckets_plan(*layouts.get(*b)?),
                d.rank,
                right_label,
            ),
            left_trace: base,
        })
    }
}
