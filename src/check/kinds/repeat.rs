//! The `repeat` check (CIME's REP): run 1 against run 2, the same configuration under two
//! perturbations (seeded delays, a rotated arrival order), compared record by record.
//!
//! Main type: [`Repeat`], its unit. It runs nothing of its own: `run_checks_on` makes run 2
//! whenever `repeat` is asked (`replicas` reads it too), except for a launched program that can
//! race, whose two unperturbed runs take run 2's place where their end states agree with run
//! 1's: `repeat` then compares those end states. What follows a program's `repeat` (its cause,
//! `--deterministic`'s settings, the unperturbed runs) is `check/mod.rs`'s.
//!
//! Determinism: both runs' perturbations are derived from the scenario's seed and differ in every
//! round (`check/mod.rs`, the perturbations of a check are seeded), so the verdict is the same
//! every time. Limits: two runs catch an order dependence that their two orders expose; a
//! divergence rarer than that is not promised to show.

use super::{curves_of, CheckUnit, Compared, Drill, Pair, Runs};
use crate::compare::{compare_traces, Divergence, TraceView};
use crate::run::RunError;
use crate::scenario::RunPlan;

/// The `repeat` check's unit.
pub(super) struct Repeat;

impl CheckUnit for Repeat {
    fn sides(&self) -> (&'static str, &'static str) {
        ("run 1", "run 2")
    }

    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        Ok(match (runs.second, runs.unperturbed) {
            (Some(second), _) => Compared {
                curves: curves_of(runs.first, second, self.sides()),
                ..Compared::of(compare_traces(runs.first, second, TraceView::All))
            },
            (None, Some(end)) => Compared {
                note: Some(format!(
                    "by end states: run 1 and 2 unperturbed runs end alike ({} records); run 2 \
                     is recorded only where they differ",
                    end.num_compared
                )),
                ..Compared::of(end.clone())
            },
            (None, None) => Compared::nothing(),
        })
    }

    /// The same comparison of the same two runs.
    fn listed_again(&self, earlier: &Compared) -> Compared {
        earlier.again()
    }

    fn drill_down<'a>(
        &self,
        runs: &Runs<'a>,
        d: &Divergence,
        _pair: Option<&'a Pair>,
    ) -> Option<Drill<'a>> {
        let (left_label, right_label) = self.sides();
        let (runner, scenario) = (runs.runner, runs.scenario);
        Some(Drill::Pair {
            left: runs.side(runner, scenario, 1, RunPlan::default(), d.rank, left_label),
            right: runs.side(runner, scenario, 2, RunPlan::default(), d.rank, right_label),
            left_trace: runs.first,
        })
    }
}
