//! The `backends` check: under MPI, run 1 against the same run on thread ranks.
//!
//! Main type: [`Backends`], its unit; [`backends_applies`], where MPI adds it to a scenario's
//! checks. Its one run of its own is run 1 on thread ranks; on thread ranks it is n/a, with the
//! reason.
//!
//! Determinism: it applies only to schedules detcheck computes itself (`rank_ordered`, `ring`,
//! `reproducible`: backend-independent arithmetic, `value/reduce.rs`), so both runs are expected
//! identical bit for bit. Limits: it needs MPI ranks (feature `mpi`, under `mpirun`), and rank
//! programs: a launched program's backend is its own.

use super::{curves_of, CheckUnit, Compared, Drill, Pair, Runs};
use crate::compare::{compare_traces, Divergence, TraceView};
use crate::run::{RunError, ThreadRunner};
use crate::scenario::{Expectation, LoadedScenario, RunPlan};

/// `true` when `backends` applies to the scenario: a deterministic schedule detcheck computes
/// itself, expected to be identical. Under MPI it is added to such scenarios' checks.
pub(crate) fn backends_applies(scenario: &LoadedScenario) -> bool {
    scenario.program.ranks().is_some()
        && scenario.spec.expect == Expectation::Identical
        && scenario.spec.effective_mode().is_backend_independent()
}

/// The `backends` check's unit.
pub(super) struct Backends;

impl CheckUnit for Backends {
    fn sides(&self) -> (&'static str, &'static str) {
        ("mpi", "threads")
    }

    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        if !runs.runner.is_mpi() {
            return Ok(Compared::not_applicable(
                "needs MPI ranks: build with --features mpi, run under mpirun",
            ));
        }
        let threads = runs.run(&ThreadRunner, 1)?;
        Ok(Compared {
            curves: curves_of(runs.first, &threads, self.sides()),
            ..Compared::of(compare_traces(runs.first, &threads, TraceView::All))
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
            right: runs.side(
                &ThreadRunner,
                scenario,
                1,
                RunPlan::default(),
                d.rank,
                right_label,
            ),
            left_trace: runs.first,
        })
    }
}
