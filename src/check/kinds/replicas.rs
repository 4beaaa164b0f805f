//! The `replicas` check: in each run, every rank's replicated records (data-parallel parameters)
//! equal rank 0's.
//!
//! Main type: [`Replicas`], its unit; [`ONE_RANK_HAS_NO_REPLICAS`], why it is n/a at one rank. It
//! runs nothing of its own: it compares the ranks within run 1, then within run 2 when `repeat`
//! made one, and reports the first run whose replicas differ.
//!
//! Determinism: a comparison of ranks within one run is a function of that run's trace. Limits:
//! it compares only the records the engine holds as replicated (`TraceView::Replicas`); a program
//! whose ranks hold none has nothing to compare, which `check/mod.rs` reports as n/a with its
//! reason.

use super::{CheckUnit, Compared, Drill, Pair, Runs};
use crate::compare::{compare_traces, Divergence, TraceView};
use crate::run::RunError;
use crate::scenario::RunPlan;

/// Why `replicas` is skipped at one rank: it compares each rank with rank 0, so one rank has
/// nothing to compare, and a pass would claim what was never checked.
pub const ONE_RANK_HAS_NO_REPLICAS: &str =
    "not applicable at one rank (replicas compares every rank with rank 0)";

/// The `replicas` check's unit.
pub(super) struct Replicas;

impl CheckUnit for Replicas {
    fn sides(&self) -> (&'static str, &'static str) {
        ("rank 0", "this rank")
    }

    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        // The ranks the run had: a program may start more than were launched.
        if runs.first.ranks.len() < 2 {
            return Ok(Compared::not_applicable(ONE_RANK_HAS_NO_REPLICAS));
        }
        // Both runs must hold replicas; report the first run that does not.
        let in_first = compare_traces(runs.first, runs.first, TraceView::Replicas);
        Ok(Compared::of(match runs.second {
            Some(second) if in_first.is_identical() => {
                compare_traces(second, second, TraceView::Replicas)
            }
            _ => in_first,
        }))
    }

    /// The same comparison of the same runs.
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
        // The run whose replicas differ: the first, unless only the second's do.
        let (run, trace) = match runs.second {
            Some(second)
                if compare_traces(runs.first, runs.first, TraceView::Replicas).is_identical() =>
            {
                (2, second)
            }
            _ => (1, runs.first),
        };
        Some(Drill::Pair {
            left: runs.side(runner, scenario, run, RunPlan::default(), 0, left_label),
            right: runs.side(
                runner,
                scenario,
                run,
                RunPlan::default(),
                d.rank,
                right_label,
            ),
            left_trace: trace,
        })
    }
}
