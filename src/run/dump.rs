//! `detcheck run --dump`: one run of a scenario whose ranks write their trace files as they run.
//!
//! The rank body ([`run_rank`](super::run_rank)) writes the files; this module claims the folder
//! first, with a [`FolderLock`] (and the `--checkpoint` folder, when the run writes
//! checkpoints), so a second run into the same folder is refused at once rather than mixed in
//! or emptied; then checks that the folder holds no dump, and removes what the ranks wrote when
//! the run fails, so a failed run leaves no dump that looks usable. Since the folder held no
//! dump and no other run could write there meanwhile, what it removes is only this run's. The
//! locks are released when the run ends, whatever its outcome.
//!
//! Determinism: the files are a pure function of the records (see `crate::file`); the lock
//! file is not part of the dump.
//!
//! Limits: `detcheck run` is one process (its ranks are threads); the CLI refuses it under an
//! `mpirun` of several processes, each of which would be a whole run into the same folder.

use crate::comm::LaunchError;
use crate::file::{load_trace, trace_path, DumpError, DumpMode, FolderLock};
use crate::launch::{Capture, InsideRequest};
use crate::record::Trace;
use crate::run::{perturbation, runner_for, CheckOptions, RunError, RunRequest, ThreadRunner};
use crate::scenario::{Device, LoadedScenario, Program, RunPlan};
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
/// ([`run_checks`](crate::check::run_checks)), so two dumps made with 1 and 2 see the arrival
/// orders `repeat` sees; `None` is a plain run. The folder must not already hold a dump, so two
/// runs are never mixed in one folder, and is claimed ([`FolderLock`]) for the whole run, as is
/// `plan`'s checkpoint folder.
///
/// # Errors
/// [`DumpRunError::Dump`] when the folder cannot be created, already holds a dump, or is
/// claimed by another run (or was, by one that is gone: a stale lock);
/// [`DumpRunError::Run`] when a rank fails or cannot write its file.
pub fn dump_scenario(
    scenario: &LoadedScenario,
    dir: &Path,
    mode: DumpMode,
    options: &CheckOptions,
    perturb_as_run: Option<usize>,
    plan: &RunPlan,
) -> Result<Trace, DumpRunError> {
    let _dump_lock = claim_dump_folder(dir)?;
    let _checkpoint_lock = match &plan.checkpoint_to {
        Some(to) => claim_checkpoint_folder(to, dir)?,
        None => None,
    };
    let perturbation =
        perturb_as_run.map(|run| perturbation(scenario.spec.seed, run.max(1), options));
    let request = RunRequest::new(scenario, options, perturbation, 1, plan).with_dump(dir, mode);
    if let Program::Command(_) = scenario.program {
        // The program writes the files itself, into the dump folder.
        return runner_for(scenario, &ThreadRunner)
            .and_then(|runner| runner.run(scenario, &request))
            .map_err(|error| {
                remove_dump_files(dir, scenario.spec.world_size as u32);
                DumpRunError::Program(error)
            });
    }
    let launched = match scenario.spec.device {
        Device::Cpu => ThreadRunner.launch(scenario, &request),
        Device::Gpu => launch_on_gpu(scenario, &request)?,
    };
    launched.map_err(|source| {
        // The folder held no dump before and this run holds its lock, so every trace and
        // tensor file in it is this run's: remove what the ranks that did finish wrote, so a
        // failed run leaves no dump that looks usable (and never another run's files).
        remove_dump_files(dir, scenario.spec.world_size as u32);
        DumpRunError::Run {
            scenario: scenario.name.clone(),
            source,
        }
    })
}

/// Runs a program (a `command` scenario) once and writes into `dir`, as its dump, the operator
/// trace of one record's module (`detcheck run --dump DIR --inside NAME`): the window's inputs,
/// every operator's inputs and outputs, and the window's outputs, every tensor kept (full
/// mode), as the check's operator drill-down traces them (`detcheck/_torch/ops.py`); with
/// `inside.replay_from`, the module runs on the inputs that trace holds (`--replay`). The
/// trace is a world of one rank (the captured rank's). The program's own records go to a
/// scratch folder inside `dir`, removed afterwards; the trace's tensor files are moved into
/// `dir` before its trace file, so an interrupted move leaves no file that reads as a dump.
///
/// # Errors
/// As [`dump_scenario`]; [`DumpRunError::Dump`] when the run wrote no trace of the window (the
/// record is not one of a module of the program's model, or did not occur at that step), or
/// when the module could not run on the replayed inputs (the message says why). The trace
/// written is returned.
pub fn dump_inside(
    scenario: &LoadedScenario,
    dir: &Path,
    capture: &Capture,
    inside: &InsideRequest,
    options: &CheckOptions,
    plan: &RunPlan,
) -> Result<Trace, DumpRunError> {
    let _dump_lock = claim_dump_folder(dir)?;
    let scratch = ScratchFolder(dir.join(".inside-run"));
    let _ = std::fs::remove_dir_all(&scratch.0); // a killed run's, under this lock
    let (records, captured) = (scratch.0.join("records"), scratch.0.join("capture"));
    for folder in [&records, &captured] {
        std::fs::create_dir_all(folder).map_err(|e| DumpError::io("create folder", folder, e))?;
    }
    let request = RunRequest::new(scenario, options, None, 1, plan)
        .with_dump(&records, DumpMode::Md5)
        .with_capture(capture, &captured)
        .with_inside(inside);
    runner_for(scenario, &ThreadRunner)
        .and_then(|runner| runner.run(scenario, &request))
        .map_err(DumpRunError::Program)?;
    let ops = captured.join("ops");
    let trace = load_trace(&ops, 1).map_err(|e| match e {
        DumpError::Folder { .. } | DumpError::Io { .. } if !trace_path(&ops, 0).exists() => {
            DumpError::Folder {
                path: dir.to_owned(),
                detail: format!(
                    "the program ran no window of `{}` at step {} on rank {} (occurrence {}): \
                     give a record of `detcheck.torch.watch`'s forward, `fwd/<module>`, as \
                     `compare` names it, at a step the program runs",
                    capture.name, capture.step, capture.rank, capture.occurrence
                ),
            }
        }
        e => e,
    })?;
    let environment = trace.ranks.first().and_then(|r| r.environment.as_ref());
    if let Some(why) = environment.and_then(|e| e.get("site:replay:error")) {
        return Err(DumpError::Folder {
            path: dir.to_owned(),
            detail: format!("--replay: the module could not run on the replayed inputs: {why}"),
        }
        .into());
    }
    let tensors = ops.join("rank0");
    if tensors.is_dir() {
        let to = dir.join("rank0");
        std::fs::rename(&tensors, &to).map_err(|e| DumpError::io("move", &to, e))?;
    }
    let to = trace_path(dir, 0);
    std::fs::rename(trace_path(&ops, 0), &to).map_err(|e| DumpError::io("move", &to, e))?;
    Ok(trace)
}

/// A folder removed when dropped.
struct ScratchFolder(std::path::PathBuf);

impl Drop for ScratchFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Creates `dir` and claims it for one run's dump: refused when it holds a dump already. The
/// lock is taken before anything is read or written: from then on no other run writes there,
/// so what the check finds stays true, and the files of the ranks are this run's.
fn claim_dump_folder(dir: &Path) -> Result<FolderLock, DumpError> {
    std::fs::create_dir_all(dir).map_err(|e| DumpError::io("create folder", dir, e))?;
    let lock = FolderLock::claim(dir, "dump")?;
    if let Some(found) = dump_files(dir)? {
        return Err(DumpError::Folder {
            path: dir.to_owned(),
            detail: format!(
                "already holds a dump (`{found}`); choose a new folder or remove it first"
            ),
        });
    }
    Ok(lock)
}

/// The first file of a dump that `dir` holds (a trace file `rank{R}.dctrace` or a full-mode
/// folder `rank{R}/`), if any.
fn dump_files(dir: &Path) -> Result<Option<String>, DumpError> {
    let entries = std::fs::read_dir(dir).map_err(|e| DumpError::io("read folder", dir, e))?;
    let mut found: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            name.strip_prefix("rank").is_some_and(|rest| {
                let digits = rest.trim_start_matches(|c: char| c.is_ascii_digit());
                digits.len() < rest.len() && (digits.is_empty() || digits == ".dctrace")
            })
        })
        .collect();
    found.sort();
    Ok(found.into_iter().next())
}

/// Claims the checkpoint folder `to` of a run that dumps into `dump` (created if needed);
/// `None` when it is the dump folder itself, already claimed.
fn claim_checkpoint_folder(to: &Path, dump: &Path) -> Result<Option<FolderLock>, DumpError> {
    std::fs::create_dir_all(to).map_err(|e| DumpError::io("create folder", to, e))?;
    let same = match (to.canonicalize(), dump.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Ok(None);
    }
    FolderLock::claim(to, "checkpoint").map(Some)
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

/// Launches a `gpu` scenario's dump run on the GPU runner: the launch's result, or (outer
/// error) why this process has no GPU.
fn launch_on_gpu(
    scenario: &LoadedScenario,
    request: &RunRequest,
) -> Result<Result<Trace, LaunchError>, DumpRunError> {
    #[cfg(feature = "nccl")]
    {
        match super::gpu::gpu_runner() {
            Ok(runner) => Ok(runner.launch(scenario, request)),
            Err(reason) => Err(DumpRunError::Program(super::gpu::no_device(
                scenario, reason,
            ))),
        }
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = request;
        Err(DumpRunError::Program(super::gpu::no_device(
            scenario,
            super::gpu::gpu_runner_dyn().err().unwrap_or_default(),
        )))
    }
}
