//! Checks: properties verified by running a scenario and comparing traces.
//!
//! [`run_checks`] runs a [`LoadedScenario`] on thread ranks and evaluates its checks:
//! - `repeat` (CIME's REP): two runs of the same configuration, each under a different
//!   [`Perturbation`] (seeded delays, a rotated arrival order), compared record by record;
//! - `replicas`: in each run, every rank's replicated records (data-parallel parameters) equal
//!   rank 0's.
//!
//! Each check has an [`Expectation`]: `identical`, or `diverges` for a negative control, which
//! holds only when the check finds a divergence. A [`ScenarioReport`] holds the outcomes; it is
//! data, and a failed check is not an `Err`. `Err` ([`RunError`]) means a run itself failed.
//!
//! Determinism: the perturbations are derived from the scenario's seed, so a check is repeatable;
//! the two runs' perturbations differ in every round, so an order-dependent reduction with three or
//! more ranks is caught every time.

use crate::comm::{launch_threads, LaunchConfig, LaunchError, Perturbation};
use crate::compare::{compare_replicas, compare_runs, compare_world_sizes, Comparison, Divergence};
use crate::digest::Stats;
use crate::overflow::{first_overflow, Overflow};
use crate::picture::{map_of_runs, DivergenceMap};
use crate::scenario::{LoadedScenario, RankContext, RunPlan};
use crate::trace::{Record, RecordLevel, Trace};
use serde::{Deserialize, Serialize};
use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A check a scenario can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CheckKind {
    /// Two perturbed runs of one configuration give identical records.
    Repeat,
    /// Replicated records are identical on every rank.
    Replicas,
    /// A run on MPI ranks gives the same records as the same run on thread ranks.
    Backends,
    /// Runs at each of the spec's `world_sizes` give identical replicated records (loss,
    /// gradients, parameters): the bits do not depend on the number of ranks.
    WorldSizes,
    /// Runs with each of the spec's `workers` data-loader worker counts give identical records.
    Workers,
    /// A run checkpointed at step k and resumed in a fresh launch gives the continuous run's
    /// records from step k on (and before it).
    Restart,
}

impl fmt::Display for CheckKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckKind::Repeat => "repeat",
            CheckKind::Replicas => "replicas",
            CheckKind::Backends => "backends",
            CheckKind::WorldSizes => "world_sizes",
            CheckKind::Workers => "workers",
            CheckKind::Restart => "restart",
        })
    }
}

/// What a check must find.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expectation {
    /// No divergence.
    Identical,
    /// At least one divergence: a negative control.
    Diverges,
}

/// How checks run.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The collective deadline of every run.
    pub deadline: Duration,
    /// What the recorders compute.
    pub record_level: RecordLevel,
    /// The upper bound of the perturbation's seeded delays.
    pub max_delay: Duration,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            deadline: Duration::from_secs(60),
            record_level: RecordLevel::Stats,
            max_delay: Duration::from_micros(100),
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct CheckOutcome {
    /// The check.
    pub kind: CheckKind,
    /// What it had to find.
    pub expectation: Expectation,
    /// What it found.
    pub comparison: Comparison,
    /// Why the check was not run, when it was not (`backends` on thread ranks only).
    pub skipped: Option<&'static str>,
    /// What the check compared, when its labels need it (`world_sizes`: the two sizes).
    pub note: Option<String>,
}

impl CheckOutcome {
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The ranks × steps divergence map of each check that does not hold and found a divergence.
    pub maps: Vec<(CheckKind, DivergenceMap)>,
    /// The first NaN, Inf or fp16 saturation in the first run, if any.
    pub overflow: Option<Overflow>,
}

impl ScenarioReport {
    /// `true` when every check holds.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.outcomes.iter().all(CheckOutcome::holds)
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

    /// A plain-text explanation of every check that does not hold (empty when all hold).
    #[must_use]
    pub fn explain_failures(&self) -> String {
        let mut out = String::new();
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
                    let (left, right) = match outcome.kind {
                        CheckKind::Repeat => ("run 1", "run 2"),
                        CheckKind::Replicas => ("rank 0", "this rank"),
                        CheckKind::Backends => ("mpi", "threads"),
                        CheckKind::WorldSizes => ("smallest", "larger"),
                        CheckKind::Workers => ("first", "other"),
                        CheckKind::Restart => ("continuous", "resumed"),
                    };
                    let _ = write!(out, "{}", describe_divergence(first, left, right));
                }
            }
        }
        out
    }
}

/// A multi-line description of a divergence: where, and both records' md5s and stats.
#[must_use]
pub(crate) fn describe_divergence(d: &Divergence, left_label: &str, right_label: &str) -> String {
    let mut out = format!("  first divergence: {d}\n");
    for (label, record) in [(left_label, &d.left), (right_label, &d.right)] {
        let _ = match record {
            Some(r) => writeln!(out, "    {label:<9} {}", describe_record(r)),
            None => writeln!(out, "    {label:<9} (no record)"),
        };
    }
    out
}

fn describe_record(r: &Record) -> String {
    let shape: Vec<String> = r.shape.iter().map(ToString::to_string).collect();
    format!(
        "rank {} {} {}[{}] md5 {} {}",
        r.rank,
        r.name,
        r.dtype,
        shape.join(","),
        r.md5,
        describe_stats(&r.stats)
    )
}

fn describe_stats(s: &Stats) -> String {
    let show =
        |x: Option<crate::digest::ExactF64>| x.map_or("-".to_owned(), |v| format!("{:.9e}", v.0));
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

/// Why a check could not be evaluated: a run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A run's ranks failed.
    #[error("scenario `{scenario}`, run {run}: {source}")]
    Launch {
        /// The scenario.
        scenario: String,
        /// Which run (1 or 2).
        run: usize,
        /// What failed.
        source: LaunchError,
    },
    /// The scenario needs more ranks than the MPI job has processes.
    #[error(
        "scenario `{scenario}` needs {needed} ranks, but the MPI job has {available} processes: \
         run it with `mpirun -n {needed}` or more"
    )]
    WorldTooLarge {
        /// The scenario.
        scenario: String,
        /// Its world size.
        needed: usize,
        /// Processes in the MPI job.
        available: usize,
    },
}

/// Runs `scenario` once on thread ranks and returns its trace.
///
/// # Errors
/// [`RunError::Launch`] when a rank fails; `run` numbers the run in the message.
pub fn run_once(
    scenario: &LoadedScenario,
    options: &CheckOptions,
    perturbation: Option<Perturbation>,
    run: usize,
) -> Result<Trace, RunError> {
    run_planned(scenario, options, perturbation, run, &RunPlan::default())
}

/// [`run_once`] under a check's `plan` (loader workers, stop, checkpoint, resume).
fn run_planned(
    scenario: &LoadedScenario,
    options: &CheckOptions,
    perturbation: Option<Perturbation>,
    run: usize,
    plan: &RunPlan,
) -> Result<Trace, RunError> {
    let spec = scenario.spec.clone();
    let mut config = LaunchConfig::new(spec.world_size).with_deadline(options.deadline);
    config.perturbation = perturbation;
    let (program, level, plan) = (scenario.program.clone(), options.record_level, plan.clone());
    let ranks = launch_threads(&config, move |comm| {
        let mut ctx = RankContext::for_run(comm, level, &spec, &plan, perturbation);
        program.run_rank(&mut ctx)?;
        Ok(ctx.into_recorder().finish())
    })
    .map_err(|source| RunError::Launch {
        scenario: scenario.name.clone(),
        run,
        source,
    })?;
    Ok(Trace { ranks })
}

/// The perturbation of run `run` (1 or 2) of a scenario seeded with `seed`.
pub(crate) fn perturbation(seed: u64, run: usize, options: &CheckOptions) -> Perturbation {
    Perturbation {
        seed: seed ^ 0x9e37_79b9_7f4a_7c15,
        rotation: run - 1,
        max_delay: options.max_delay,
    }
}

/// Runs one run of a scenario on some backend: thread ranks, or the processes of an MPI job.
pub(crate) trait Runner {
    /// Runs `scenario` once under `perturbation` and `plan`; `run` numbers the run in messages.
    fn run(
        &self,
        scenario: &LoadedScenario,
        options: &CheckOptions,
        perturbation: Option<Perturbation>,
        run: usize,
        plan: &RunPlan,
    ) -> Result<Trace, RunError>;

    /// `true` when the runs are on MPI ranks, so that `backends` can compare them with threads.
    fn is_mpi(&self) -> bool;

    /// The largest world this runner can launch (`None`: any).
    fn max_world_size(&self) -> Option<usize> {
        None
    }
}

/// Thread ranks in this process.
pub(crate) struct ThreadRunner;

impl Runner for ThreadRunner {
    fn run(
        &self,
        scenario: &LoadedScenario,
        options: &CheckOptions,
        perturbation: Option<Perturbation>,
        run: usize,
        plan: &RunPlan,
    ) -> Result<Trace, RunError> {
        run_planned(scenario, options, perturbation, run, plan)
    }

    fn is_mpi(&self) -> bool {
        false
    }
}

/// Runs the scenario once per value of a series (world sizes, worker counts) under run 1's
/// perturbation and compares each run with the first: the total, and a note naming the first
/// pair that differs (`describe(first, other)`), or the whole series when none does.
fn compare_series(
    values: &[usize],
    run_at: impl Fn(usize) -> Result<Trace, RunError>,
    compare: impl Fn(&Trace, &Trace) -> Comparison,
    describe: impl Fn(usize, usize) -> String,
    series: &str,
) -> Result<SeriesOutcome, RunError> {
    let Some((&first, others)) = values.split_first() else {
        return Ok(SeriesOutcome {
            comparison: Comparison::default(),
            note: format!("no {series} fits"),
            differing: None,
        });
    };
    let base = run_at(first)?;
    let mut out = SeriesOutcome {
        comparison: Comparison::default(),
        note: format!("{series} {values:?}"),
        differing: None,
    };
    for &value in others {
        let other = run_at(value)?;
        let c = compare(&base, &other);
        let total = &mut out.comparison;
        total.num_compared += c.num_compared;
        total.num_differing += c.num_differing;
        if total.first.is_none() && c.first.is_some() {
            total.first.clone_from(&c.first);
            total.first_per_rank.clone_from(&c.first_per_rank);
            out.note = describe(first, value);
            out.differing = Some((base.clone(), other));
        }
    }
    Ok(out)
}

/// What a check over several runs found: the comparison, a note naming what was compared,
/// and the first pair of runs that differ (for its divergence map).
#[derive(Clone)]
struct SeriesOutcome {
    comparison: Comparison,
    note: String,
    differing: Option<(Trace, Trace)>,
}

/// The `world_sizes` check: the scenario at each of its `world_sizes` (those the runner can
/// launch), replicated records compared with the smallest size's.
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
        runner.run(&resized, options, Some(p), 1, &RunPlan::default())
    };
    compare_series(
        &sizes,
        run_at,
        compare_world_sizes,
        |a, b| format!("world size {a} (smallest) vs {b} (larger)"),
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
        runner.run(scenario, options, Some(p), 1, &plan)
    };
    let compare = |a: &Trace, b: &Trace| compare_runs(a, b).expect("same world size");
    compare_series(
        &scenario.spec.workers,
        run_at,
        compare,
        |a, b| format!("{a} workers (first) vs {b} workers"),
        "workers",
    )
}

/// A folder for one restart check's checkpoints, removed when dropped.
struct RestartFolder(PathBuf);

impl RestartFolder {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("detcheck-restart-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        RestartFolder(dir)
    }
}

impl Drop for RestartFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
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
    let folder = RestartFolder::new();
    let p = Some(perturbation(scenario.spec.seed, 2, options));
    let before = RunPlan {
        stop_at: Some(at),
        checkpoint_to: Some(folder.0.clone()),
        ..RunPlan::default()
    };
    let after = RunPlan {
        resume_from: Some(folder.0.clone()),
        remove_after_resume: true,
        ..RunPlan::default()
    };
    let mut joined = runner.run(scenario, options, p, 3, &before)?;
    let resumed = runner.run(scenario, options, p, 4, &after)?;
    for (rank, tail) in joined.ranks.iter_mut().zip(resumed.ranks) {
        rank.records.extend(tail.records);
    }
    let comparison = compare_runs(continuous, &joined).expect("same world size");
    let differing = (!comparison.is_identical()).then(|| (continuous.clone(), joined));
    Ok(SeriesOutcome {
        comparison,
        note: format!("checkpoint after step {at}, resumed in a fresh launch"),
        differing,
    })
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

/// `true` when `backends` applies to the scenario: a deterministic schedule detcheck computes
/// itself, expected to be identical. Under MPI it is added to such scenarios' checks.
pub(crate) fn backends_applies(scenario: &LoadedScenario) -> bool {
    scenario.spec.expect == Expectation::Identical
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
    let mut checks = scenario.checks.clone();
    if runner.is_mpi() && backends_applies(scenario) && !checks.contains(&CheckKind::Backends) {
        checks.push(CheckKind::Backends);
    }
    // Run k runs under perturbation k (rotation k − 1).
    let run_on = |on: &dyn Runner, k: usize| {
        on.run(
            scenario,
            options,
            Some(perturbation(spec.seed, k, options)),
            k,
            &RunPlan::default(),
        )
    };
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
    let across_sizes = if checks.contains(&CheckKind::WorldSizes) {
        Some(compare_across_world_sizes(runner, scenario, options)?)
    } else {
        None
    };
    let across_workers = if checks.contains(&CheckKind::Workers) {
        Some(compare_across_workers(runner, scenario, options)?)
    } else {
        None
    };
    let restart = if checks.contains(&CheckKind::Restart) {
        Some(compare_restart(runner, scenario, options, &first)?)
    } else {
        None
    };
    let outcomes = checks
        .iter()
        .map(|&kind| {
            let mut skipped = None;
            let mut note = None;
            let comparison = match kind {
                CheckKind::Repeat => {
                    let second = second.as_ref().expect("repeat runs twice");
                    compare_runs(&first, second).expect("both runs have the spec's world size")
                }
                CheckKind::Replicas => {
                    // Both runs must hold replicas; report the first run that does not.
                    let in_first = compare_replicas(&first);
                    match &second {
                        Some(second) if in_first.is_identical() => compare_replicas(second),
                        _ => in_first,
                    }
                }
                CheckKind::Backends => match &on_threads {
                    Some(threads) => {
                        compare_runs(&first, threads).expect("both runs have the spec's world size")
                    }
                    None => {
                        skipped =
                            Some("needs MPI ranks: build with --features mpi, run under mpirun");
                        Comparison::default()
                    }
                },
                CheckKind::WorldSizes | CheckKind::Workers | CheckKind::Restart => {
                    let computed = match kind {
                        CheckKind::WorldSizes => &across_sizes,
                        CheckKind::Workers => &across_workers,
                        _ => &restart,
                    };
                    let computed = computed.as_ref().expect("computed above");
                    note = Some(computed.note.clone());
                    computed.comparison.clone()
                }
            };
            CheckOutcome {
                kind,
                expectation: spec.expect,
                comparison,
                skipped,
                note,
            }
        })
        .collect::<Vec<CheckOutcome>>();
    let maps = outcomes
        .iter()
        .filter(|o| !o.holds() && !o.comparison.is_identical())
        .filter_map(|o| {
            let pair = |series: &Option<SeriesOutcome>| {
                let (a, b) = series.as_ref()?.differing.as_ref()?;
                Some(map_of_runs(a, b, false))
            };
            let map = match (o.kind, &second) {
                (CheckKind::Repeat, Some(second)) => Some(map_of_runs(&first, second, false)),
                (CheckKind::Replicas, Some(second)) if compare_replicas(&first).is_identical() => {
                    Some(map_of_runs(second, second, true))
                }
                (CheckKind::Replicas, _) => Some(map_of_runs(&first, &first, true)),
                (CheckKind::Backends, _) => {
                    on_threads.as_ref().map(|t| map_of_runs(&first, t, false))
                }
                (CheckKind::Workers, _) => pair(&across_workers),
                (CheckKind::Restart, _) => pair(&restart),
                // Runs of different sizes have no common ranks x steps grid.
                _ => None,
            };
            map.map(|map| (o.kind, map))
        })
        .collect();
    Ok(ScenarioReport {
        name: scenario.name.clone(),
        world_size: spec.world_size,
        steps: spec.steps,
        outcomes,
        maps,
        overflow: first_overflow(&first),
    })
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
        (kind, d.step, d.rank, d.name().to_owned())
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
}
