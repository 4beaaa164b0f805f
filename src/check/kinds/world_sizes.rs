//! The `world_sizes` check: rank 0's replicated records at each of the spec's world sizes (those
//! the runner can launch), compared with the smallest size's.
//!
//! Main type: [`WorldSizes`], its unit. Its runs are run 1 of the scenario resized to each size
//! (`series.rs`); its drill-down re-runs the first differing pair of sizes, every rank of each
//! for a global tensor's shards (`element::find_sharded`), rank 0 otherwise.
//!
//! Determinism: each size's run is run 1 of the resized scenario (its perturbation), so the
//! outcome is a function of the scenario. Limits: only the sizes the runner can launch are
//! compared (a note says `no world sizes fits` when none is), and only rank 0's replicated
//! records: what every world size must agree on.

use super::series::compare_series;
use super::{run_of, CheckUnit, Compared, Drill, Pair, Runs};
use crate::check::element::Side;
use crate::compare::{compare_traces, is_sharded, Divergence, TraceView};
use crate::record::Trace;
use crate::run::{perturbation, runner_for, RunError, RunRequest};
use crate::scenario::{LoadedScenario, RunPlan};

/// The `world_sizes` check's unit.
pub(super) struct WorldSizes;

/// The scenario resized to `size` ranks.
fn resized(scenario: &LoadedScenario, size: usize) -> LoadedScenario {
    let mut resized = scenario.clone();
    resized.spec.world_size = size;
    resized
}

impl CheckUnit for WorldSizes {
    fn sides(&self) -> (&'static str, &'static str) {
        ("smallest", "larger")
    }

    /// The scenario at each of its `world_sizes` (those the runner can launch), rank 0's
    /// replicated records compared with the smallest size's.
    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        let (runner, scenario, options) = (runs.runner, runs.scenario, runs.options);
        let mut sizes = scenario.spec.world_sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        sizes.retain(|&w| runner.max_world_size().is_none_or(|max| w <= max));
        let run_at = |world_size: usize| run_of(runner, &resized(scenario, world_size), options, 1);
        compare_series(
            &sizes,
            run_at,
            |a, b| {
                let narrowed = replicated_at_both(a, b);
                let (a, alone) = narrowed.as_ref().map_or((a, 0), |(t, n)| (t, *n));
                let mut c = compare_traces(a, b, TraceView::RankZeroReplicated);
                if alone > 0 {
                    c.notes.push(format!(
                        "{alone} record(s) replicated at world size 1 only (a world of one holds \
                         its records alike trivially), not compared"
                    ));
                }
                c
            },
            |a, b| format!("world size {a} (smallest) vs {b} (larger)"),
            |w| format!("world size {w}"),
            "world sizes",
        )
    }

    fn drill_down<'a>(
        &self,
        runs: &Runs<'a>,
        d: &Divergence,
        pair: Option<&'a Pair>,
    ) -> Option<Drill<'a>> {
        let (left_label, right_label) = self.sides();
        let (a, b, base) = pair?;
        let scenario = runs.scenario;
        if is_sharded(base, d) {
            // A global tensor: every rank of each side is run again for its shard.
            let sides = |size: usize, label| -> Vec<Side<'a>> {
                (0..size as u32)
                    .map(|r| {
                        runs.owned_side(resized(scenario, size), 1, RunPlan::default(), r, label)
                    })
                    .collect()
            };
            return Some(Drill::Sharded {
                left: sides(*a, left_label),
                right: sides(*b, right_label),
                base,
            });
        }
        Some(Drill::Pair {
            left: runs.owned_side(resized(scenario, *a), 1, RunPlan::default(), 0, left_label),
            right: runs.owned_side(resized(scenario, *b), 1, RunPlan::default(), 0, right_label),
            left_trace: base,
        })
    }
}

/// `small` with its rank 0's records that `large`'s rank 0 does not hold as replicated marked
/// as not replicated, and how many, where `small` is a world of one: its recorder holds every
/// gradient and parameter alike trivially (`world_of_one`), while at more ranks only what the
/// program's structure replicates is (a data-parallel wrapper). A record of the larger world that
/// nothing replicates (hand-written tensor parallelism: each rank's parameter is a shard, no
/// replica) is then not compared against the whole tensor of the world of one, where it would be
/// a record "only in" one run, not a difference of values. `None` (compare `small` as it is)
/// where `small` is more than one rank.
fn replicated_at_both(small: &Trace, large: &Trace) -> Option<(Trace, usize)> {
    if small.world_size() != 1 {
        return None;
    }
    let mut out = small.clone();
    let replicated: std::collections::BTreeSet<&str> = large
        .ranks
        .first()
        .map(|r| {
            r.records
                .iter()
                .filter(|x| x.replicated)
                .map(|x| x.name.as_str())
                .collect()
        })
        .unwrap_or_default();
    let mut alone = 0;
    for record in out.ranks.iter_mut().flat_map(|r| r.records.iter_mut()) {
        if record.replicated && record.shard.is_none() && !replicated.contains(record.name.as_str())
        {
            record.replicated = false;
            alone += 1;
        }
    }
    Some((out, alone))
}

impl<'a> Runs<'a> {
    /// As [`Runs::side`], for a scenario of its own (a resized one): the side owns it.
    fn owned_side(
        &self,
        scenario: LoadedScenario,
        run: usize,
        plan: RunPlan,
        rank: u32,
        label: &'static str,
    ) -> Side<'a> {
        let (runner, options) = (self.runner, self.options);
        let p = Some(perturbation(scenario.spec.seed, run, options));
        Side {
            rerun: Box::new(move |capture, dir| {
                let request =
                    RunRequest::new(&scenario, options, p, run, &plan).with_capture(capture, dir);
                runner_for(&scenario, runner)?.run(&scenario, &request)
            }),
            rank,
            label,
        }
    }
}
