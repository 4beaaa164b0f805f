//! The `restart` check: a run checkpointed and resumed in a fresh launch against the continuous
//! run 1.
//!
//! Main type: [`Restart`], its unit; [`RestartFolder`], the folder its checkpoints go to. Run 3
//! stops after the spec's restart step and saves a checkpoint; run 4, a fresh launch, resumes
//! from it and runs to the end. Both (under run 2's perturbation) joined are compared with run 1,
//! record by record. Its drill-down re-runs run 1, and run 3 (a step before the restart) or runs
//! 3 and 4 (a later one), as the check ran them.
//!
//! Invariant (a resumed run is the continuous run; the `restart` check): a program's checkpoint
//! holds every piece of state that later steps read (parameters, optimizer state, sequential
//! generators, the loader's position); per-sample streams have no state by design. The `restart`
//! check compares every record of both halves with the continuous run.
//!
//! Determinism: the resumed halves run under run 2's perturbation, seeded like every run of a
//! check, so the verdict is the same every time. Limits: one restart, at the spec's restart step;
//! a program saves at the end of a run, not every N steps (ARCHITECTURE.md, known limits).

use super::{curves_of, CheckUnit, Compared, Drill, Pair, Runs};
use crate::compare::{compare_traces, Divergence, TraceView};
use crate::diagnose::element::Side;
use crate::file::{DumpError, FolderLock};
use crate::run::{perturbation, runner_for, RunError, RunRequest};
use crate::scenario::RunPlan;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// The `restart` check's unit.
pub(super) struct Restart;

impl CheckUnit for Restart {
    fn sides(&self) -> (&'static str, &'static str) {
        ("continuous", "resumed")
    }

    /// Run 3 stops after `restart_step()` steps and saves a checkpoint; run 4, a fresh launch,
    /// resumes from it and runs to the end. Both (under run 2's perturbation) joined are compared
    /// with the continuous run 1, record by record.
    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        let (runner, scenario, options) = (runs.runner, runs.scenario, runs.options);
        let continuous = runs.first;
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
        let mut joined =
            runner.run(scenario, &RunRequest::new(scenario, options, p, 3, &before))?;
        let resumed = runner.run(scenario, &RunRequest::new(scenario, options, p, 4, &after))?;
        for (rank, tail) in joined.ranks.iter_mut().zip(resumed.ranks) {
            rank.records.extend(tail.records);
        }
        Ok(Compared {
            note: Some(format!(
                "checkpoint after step {at}, resumed in a fresh launch"
            )),
            curves: curves_of(continuous, &joined, self.sides()),
            ..Compared::of(compare_traces(continuous, &joined, TraceView::All))
        })
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
            right: runs.resumed_side(d.step, d.rank, right_label),
            left_trace: runs.first,
        })
    }
}

impl<'a> Runs<'a> {
    /// The resumed side of `restart` at `step`: run 3 (stopped after the restart step, with its
    /// checkpoint) captures a step before it; a later step is run 4's, which resumes from run
    /// 3's checkpoint in a fresh launch, as the check ran them.
    fn resumed_side(&self, step: u64, rank: u32, label: &'static str) -> Side<'a> {
        let (runner, scenario, options) = (self.runner, self.scenario, self.options);
        let at = scenario.spec.restart_step();
        let p = Some(perturbation(scenario.spec.seed, 2, options));
        Side {
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
