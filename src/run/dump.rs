//! `detcheck run --dump`: one run of a scenario whose ranks write their trace files as they run.
//!
//! The rank body ([`run_rank`](super::run_rank)) writes the files; this module claims the folder
//! first (it must not already hold a dump) and removes what the ranks wrote when the run fails,
//! so a failed run leaves no dump that looks usable.
//!
//! Determinism: the files are a pure function of the records (see `crate::file`).

use crate::comm::LaunchError;
use crate::file::{trace_path, DumpError, DumpMode};
use crate::record::Trace;
use crate::run::{perturbation, runner_for, CheckOptions, RunError, RunRequest, ThreadRunner};
use crate::scenario::{LoadedScenario, Program, RunPlan};
use std::path::Path;

/// Why a scenario could not be dumped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DumpRunError {
    /// The dump folder cannot be used.
    #[error(transparent)]
    Dump(#[from] DumpError),
    /// A `command` scenario's launch failed, or could not start.
    #[error(transparent)]
    Program(RunError),
    /// The run failed (a rank errored, panicked, missed a deadline, or could not write its file).
    #[error("scenario `{scenario}`: {source}")]
    Run {
        /// The scenario.
        scenario: String,
        /// What failed.
        source: LaunchError,
    },
}

/// Runs `scenario` once on thread ranks and writes its trace to `dir` in `mode`.
///
/// Each rank writes its own file while it runs (`rank{R}.dctrace`, and in full mode its tensors
/// under `rank{R}/`). `perturb_as_run` applies the perturbation of run 1 or 2 of a check
/// ([`run_checks`](crate::check::run_checks)), so two dumps made with 1 and 2 see the arrival orders `repeat` sees;
/// `None` is a plain run. The folder must not already hold a dump, so two runs are never mixed
/// in one folder.
///
/// # Errors
/// [`DumpRunError::Dump`] when the folder cannot be created or already holds a dump;
/// [`DumpRunError::Run`] when a rank fails or cannot write its file.
pub fn dump_scenario(
    scenario: &LoadedScenario,
    dir: &Path,
    mode: DumpMode,
    options: &CheckOptions,
    perturb_as_run: Option<usize>,
    plan: &RunPlan,
) -> Result<Trace, DumpRunError> {
    std::fs::create_dir_all(dir).map_err(|e| DumpError::io("create folder", dir, e))?;
    let existing = std::fs::read_dir(dir)
        .map_err(|e| DumpError::io("read folder", dir, e))?
        .filter_map(Result::ok)
        .any(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.starts_with("rank") && name.ends_with(".dctrace")
        });
    if existing {
        return Err(DumpError::Folder {
            path: dir.to_owned(),
            detail: "already holds a dump; choose a new folder or remove it first".into(),
        }
        .into());
    }
    let perturbation =
        perturb_as_run.map(|run| perturbation(scenario.spec.seed, run.max(1), options));
    let request = RunRequest::new(scenario, options, perturbation, 1, plan).with_dump(dir, mode);
    if let Program::Command(_) = scenario.program {
        // The program writes the files itself, into the dump folder.
        return runner_for(scenario, &ThreadRunner)
            .run(scenario, &request)
            .map_err(|error| {
                remove_dump_files(dir, scenario.spec.world_size as u32);
                DumpRunError::Program(error)
            });
    }
    ThreadRunner.launch(scenario, &request).map_err(|source| {
        // The folder held no dump before: remove what the ranks that did finish wrote, so a
        // failed run leaves no dump that looks usable.
        remove_dump_files(dir, scenario.spec.world_size as u32);
        DumpRunError::Run {
            scenario: scenario.name.clone(),
            source,
        }
    })
}

/// Removes the trace files of ranks `0..world` and their safetensors files (best effort; a
/// `rank{R}/` folder is removed only when nothing else is in it).
fn remove_dump_files(dir: &Path, world: u32) {
    for rank in 0..world {
        let _ = std::fs::remove_file(trace_path(dir, rank));
        let tensors = dir.join(format!("rank{rank}"));
        if let Ok(entries) = std::fs::read_dir(&tensors) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("step") && name.ends_with(".safetensors") {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
            let _ = std::fs::remove_dir(&tensors);
        }
    }
}
