//! The `variants` check: run 1 again under each of the spec's variants (settings that must not
//! change the bits: an environment variable, a thread count, a loader's workers), every record
//! compared with run 1's.
//!
//! Main type: [`Variants`], its unit. Its runs are run 1 of each variant (its own runner:
//! `run::runner_for`); its drill-down re-runs run 1 and the first differing variant.
//!
//! Determinism: each variant's run is run 1 (its perturbation) of that variant, so the outcome is
//! a function of the scenario and its variants. Limits: only the variants the spec lists are
//! tried, each against the scenario as written, never against each other.

use super::series::FirstDiffering;
use super::{curves_of, CheckUnit, Compared, Drill, Pair, Runs};
use crate::compare::{compare_traces, Comparison, Divergence, TraceView};
use crate::run::{perturbation, runner_for, RunError, RunRequest};
use crate::scenario::RunPlan;

/// The `variants` check's unit.
pub(super) struct Variants;

impl CheckUnit for Variants {
    fn sides(&self) -> (&'static str, &'static str) {
        ("first", "variant")
    }

    /// Run 1 again under each of the spec's variants (run 1's perturbation), every record
    /// compared with run 1's.
    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        let (runner, scenario, options) = (runs.runner, runs.scenario, runs.options);
        let first = runs.first;
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
        Ok(Compared {
            comparison,
            skipped: None,
            note: Some(note),
            curves,
            differing: differing_variant.map(|i| (0, i, first.clone())),
        })
    }

    fn drill_down<'a>(
        &self,
        runs: &Runs<'a>,
        d: &Divergence,
        pair: Option<&'a Pair>,
    ) -> Option<Drill<'a>> {
        let (left_label, right_label) = self.sides();
        let (runner, scenario) = (runs.runner, runs.scenario);
        let (_, i, base) = pair?;
        let variant = scenario.variants.get(*i)?;
        Some(Drill::Pair {
            left: runs.side(runner, scenario, 1, RunPlan::default(), d.rank, left_label),
            right: runs.side(runner, variant, 1, RunPlan::default(), d.rank, right_label),
            left_trace: base,
        })
    }
}
