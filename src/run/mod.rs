//! Running a scenario once: the one rank body and the runners that launch it.
//!
//! A run is described by a `RunRequest`: the scenario's spec, which run of a check it is, its
//! perturbation, its [`RunPlan`], how records are kept and, for `detcheck run --dump`, where each
//! rank writes its trace file. `run_rank` is the *rank body*: the one place where a rank
//! program runs (a [`RankContext`] for the rank, the program, the recorder, the trace file).
//! A `Runner` is a backend: it launches the ranks of a request and gathers their traces;
//! `ThreadRunner` runs them as threads of this process, and `mpi::MpiJob` (feature `mpi`)
//! as the processes of an MPI job. A new backend adds a runner, never a copy of the rank body.
//!
//! Invariant (one rank body): a rank program runs only in `run::run_rank` (its context, its
//! recorder, its trace file). Thread ranks, `run --dump` and MPI processes all call it with a
//! `RunRequest`; a backend is a `Runner`, never another copy of the body. A `command` program has
//! no rank body in detcheck: its runner (`run/process.rs`) launches it, and its trace files come
//! back as the same `Trace` the checks compare.
//!
//! Determinism: a request holds everything a rank needs, so every backend runs the same program
//! on the same inputs; the perturbations are derived from the scenario's seed
//! (`perturbation`).

mod dump;
pub(crate) mod gpu;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
mod msrun;
mod process;
mod rank_failure;
mod srun;
mod workdir;

pub use dump::{dump_inside, dump_scenario, DumpRunError};

pub(crate) use crate::launch::WORKDIR_KEY;
pub use workdir::remove_kept as remove_kept_workdirs;

use crate::comm::{
    launch_threads, Communicator, LaunchConfig, LaunchError, Perturbation, RankError, ThreadComm,
};
use crate::file::{DumpError, DumpMode, RunId, TraceWriter};
use crate::launch::capture::CaptureMatcher;
use crate::launch::{Capture, InsideRequest};
use crate::record::environment::keys;
use crate::record::{RankTrace, RecordLevel, RecordTap, Trace};
use crate::scenario::{
    Device, LoadedScenario, Program, RankContext, RunPlan, Scenario, ScenarioSpec,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How checks run.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The collective deadline of every run.
    pub deadline: Duration,
    /// What the recorders compute.
    pub record_level: RecordLevel,
    /// The upper bound of the perturbation's seeded delays.
    pub max_delay: Duration,
    /// Name the first differing element of a check's divergence by running its two sides
    /// again, each capturing only that record (one more run per side, only when a check finds
    /// a divergence).
    pub element_detail: bool,
    /// With `repeat` on a launched program whose two recorded runs agree: whether to make two
    /// more runs that read nothing during their steps (`DETCHECK_RECORD=end`), their end
    /// states compared with each other and with run 1's (a race that recording hides).
    pub unperturbed: Unperturbed,
}

/// When `repeat` makes its two unperturbed runs of a launched program (docs/checks.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Unperturbed {
    /// Never (`--no-unperturbed`): a divergence that recording hides goes unseen.
    Never,
    /// Unless the recorded run shows that recording cannot change what the program computes
    /// (`detcheck.synchronous` in its environment: one process on the CPU, torch only, no
    /// thread or process of the program's own, no compiled graph), where an unperturbed run
    /// would compute what the recorded runs did.
    #[default]
    UnlessSynchronous,
    /// Always (`--unperturbed`).
    Always,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            deadline: Duration::from_secs(60),
            record_level: RecordLevel::Stats,
            max_delay: Duration::from_micros(100),
            element_detail: true,
            unperturbed: Unperturbed::default(),
        }
    }
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
    /// A launched program failed: a process exited non-zero or was killed, the launch outlived
    /// its timeout, or a rank wrote no trace or a broken one (a `command` scenario).
    #[error("scenario `{scenario}`, run {run}: {message}")]
    ProgramFailed {
        /// The scenario.
        scenario: String,
        /// Which run.
        run: usize,
        /// What failed: the rank, the exit status, the end of its stderr.
        message: String,
    },
    /// A program or launcher could not be started: bad input (a `command` scenario).
    #[error("scenario `{scenario}`: field `{field}`: {message}")]
    CannotLaunch {
        /// The scenario.
        scenario: String,
        /// The field of the scenario file that names what could not start.
        field: String,
        /// Why.
        message: String,
    },
    /// The folder for a check's checkpoints (`restart`) could not be created or claimed.
    #[error("scenario `{scenario}`: the folder for the restart check's checkpoints: {source}")]
    Checkpoints {
        /// The scenario.
        scenario: String,
        /// What failed, naming the folder.
        source: DumpError,
    },
    /// The scenario runs on a GPU (`device: "gpu"`) and this process has none it can use.
    #[error("scenario `{scenario}` runs on a GPU (`device: \"gpu\"`), but {reason}")]
    NoDevice {
        /// The scenario.
        scenario: String,
        /// What is missing: the feature, a library (named, with how to get it), a device.
        reason: String,
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

/// The perturbation of run `run` (1 or 2) of a scenario seeded with `seed`.
pub(crate) fn perturbation(seed: u64, run: usize, options: &CheckOptions) -> Perturbation {
    Perturbation {
        seed: seed ^ 0x9e37_79b9_7f4a_7c15,
        rotation: run - 1,
        max_delay: options.max_delay,
    }
}

/// Where a rank writes its trace file while it runs (`detcheck run --dump`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DumpTarget {
    /// The dump folder.
    pub(crate) dir: PathBuf,
    /// What each record holds.
    pub(crate) mode: DumpMode,
    /// The run id every rank's file carries.
    pub(crate) run_id: RunId,
}

/// A run id for a run of `request` (its files, or a launch's): the md5 of the scenario's name,
/// seed, world size, the run's number, `extra` (the fingerprint, for a launch), and a nonce: the
/// time now in nanoseconds, this process's id and a counter. Fresh on every call, so the files
/// of two runs never pass for one dump; it tells dumps apart and is never compared as data.
pub(crate) fn fresh_run_id(request: &RunRequest, extra: &str) -> RunId {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    RunId::of(&format!(
        "{}:{}:{}:{}:{extra}:{nanos}:{}:{}",
        request.name,
        request.spec.seed,
        request.spec.world_size,
        request.run,
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// One run of a scenario, as every rank receives it. Serializable: MPI followers receive it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunRequest {
    /// The scenario's name, for messages.
    pub(crate) name: String,
    /// The scenario file.
    pub(crate) spec: ScenarioSpec,
    /// Where the file came from (followers build the program from it).
    pub(crate) origin: PathBuf,
    /// Which run of a check (1, 2, ...), for messages.
    pub(crate) run: usize,
    /// The collective deadline.
    pub(crate) deadline: Duration,
    /// What the recorders compute.
    pub(crate) record_level: RecordLevel,
    /// The run's seeded perturbation (`None`: a plain run).
    pub(crate) perturbation: Option<Perturbation>,
    /// What the run does beyond its spec.
    pub(crate) plan: RunPlan,
    /// Where each rank writes its trace file, if anywhere.
    pub(crate) dump: Option<DumpTarget>,
    /// The record whose tensor the run keeps, and the folder it goes to (a re-run for the
    /// first differing element).
    pub(crate) capture: Option<(Capture, PathBuf)>,
    /// What `detcheck run --inside` asks of the capture's operator trace (a launched program's).
    pub(crate) inside: Option<InsideRequest>,
    /// An unperturbed run of a launched program: its recorder reads nothing during the steps
    /// and records the end state once (`DETCHECK_RECORD=end`); a rank program ignores it.
    #[serde(default)]
    pub(crate) unperturbed: bool,
}

impl RunRequest {
    /// Run `run` of `scenario` under `options`, `perturbation` and `plan`, kept in memory.
    pub(crate) fn new(
        scenario: &LoadedScenario,
        options: &CheckOptions,
        perturbation: Option<Perturbation>,
        run: usize,
        plan: &RunPlan,
    ) -> Self {
        RunRequest {
            name: scenario.name.clone(),
            spec: scenario.spec.clone(),
            origin: scenario.origin.clone(),
            run,
            deadline: options.deadline.min(crate::comm::MAX_DEADLINE),
            record_level: options.record_level,
            perturbation,
            plan: plan.clone(),
            dump: None,
            capture: None,
            inside: None,
            unperturbed: false,
        }
    }

    /// The same request as an unperturbed run ([`RunRequest::unperturbed`]).
    pub(crate) fn unperturbed(mut self) -> Self {
        self.unperturbed = true;
        self
    }

    /// The same request with every rank also writing its trace file into `dir` in `mode`
    /// (the records then hold what `mode` holds).
    pub(crate) fn with_dump(mut self, dir: &Path, mode: DumpMode) -> Self {
        self.record_level = if mode.has_stats() {
            RecordLevel::Stats
        } else {
            RecordLevel::Digest
        };
        self.dump = Some(DumpTarget {
            dir: dir.to_owned(),
            mode,
            run_id: fresh_run_id(&self, ""),
        });
        self
    }

    /// The same request, also keeping the tensor of `capture`'s record in `dir`.
    pub(crate) fn with_capture(mut self, capture: &Capture, dir: &Path) -> Self {
        self.capture = Some((capture.clone(), dir.to_owned()));
        self
    }

    /// The same request, its capture's operator trace in full with the window's outputs, and
    /// run on the window inputs of `inside.replay_from` (`detcheck run --inside`).
    pub(crate) fn with_inside(mut self, inside: &InsideRequest) -> Self {
        self.inside = Some(inside.clone());
        self
    }

    /// `RunError::Launch` for this request.
    pub(crate) fn failed(&self, source: LaunchError) -> RunError {
        RunError::Launch {
            scenario: self.name.clone(),
            run: self.run,
            source,
        }
    }
}

/// The rank body: runs `program` as rank `comm.rank()` of `request`, and returns the rank's
/// trace. With a dump target, every record (and in full mode its tensor) is also written to the
/// rank's trace file as it is recorded, and the file is finished before the trace is returned.
///
/// Every backend calls this, once per rank; catching panics and gathering traces is the
/// runner's job.
///
/// # Errors
/// The program's error, or a [`DumpError`] when the trace file cannot be written.
pub(crate) fn run_rank(
    program: &dyn Scenario,
    comm: &dyn Communicator,
    request: &RunRequest,
) -> Result<RankTrace, RankError> {
    let mut ctx = RankContext::for_run(
        comm,
        request.record_level,
        &request.spec,
        &request.plan,
        request.perturbation,
    );
    let rank = comm.rank() as u32;
    let writer = match &request.dump {
        Some(target) => {
            let world = request.spec.world_size as u32;
            let mut writer = TraceWriter::create(&target.dir, rank, world, target.mode)?;
            writer.set_run_id(target.run_id);
            writer.set_environment(keys::LAUNCHER, "threads")?;
            writer.set_environment(keys::FINGERPRINT, &request.spec.fingerprint())?;
            Some(writer)
        }
        None => None,
    };
    let matcher = request
        .capture
        .as_ref()
        .and_then(|(capture, dir)| CaptureMatcher::for_rank(capture, dir, rank));
    if writer.is_none() && matcher.is_none() {
        program.run_rank(&mut ctx)?;
        return Ok(ctx.into_recorder().finish());
    }
    // The tap runs inside `record`, which cannot fail: it keeps the first write error, and the
    // rank reports it when the program ends.
    let state: Arc<Mutex<Tapped>> = Arc::new(Mutex::new(Tapped {
        writer,
        matcher,
        error: None,
    }));
    let tap_state = Arc::clone(&state);
    ctx.recorder_mut()
        .set_tap(RecordTap(Box::new(move |record, view| {
            let mut guard = tap_state.lock().unwrap_or_else(|e| e.into_inner());
            let tapped = &mut *guard;
            if tapped.error.is_some() {
                return;
            }
            let mut result = Ok(());
            if let Some(w) = tapped.writer.as_mut() {
                result = w.write_record_view(record, Some(view));
            }
            if let (Ok(()), Some(m)) = (&result, tapped.matcher.as_mut()) {
                result = m.see(record.step, &record.name, Some(view));
            }
            if let Err(e) = result {
                tapped.error = Some(e);
            }
        })));
    program.run_rank(&mut ctx)?;
    let trace = ctx.into_recorder().finish();
    let mut guard = state.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = guard.error.take() {
        return Err(Box::new(e));
    }
    if let Some(writer) = guard.writer.take() {
        writer.finish()?;
    }
    Ok(trace)
}

/// What the rank body's record tap feeds: the rank's trace file, the captured record, and the
/// first error either met.
struct Tapped {
    writer: Option<TraceWriter>,
    matcher: Option<CaptureMatcher>,
    error: Option<DumpError>,
}

/// A backend: launches the ranks of a run and gathers their traces.
pub(crate) trait Runner {
    /// Runs `scenario` once as `request` says.
    ///
    /// # Errors
    /// [`RunError::Launch`] when a rank fails (errors, panics, misses a deadline).
    fn run(&self, scenario: &LoadedScenario, request: &RunRequest) -> Result<Trace, RunError>;

    /// `true` when the runs are on MPI ranks, so that `backends` can compare them with threads.
    fn is_mpi(&self) -> bool;

    /// The largest world this runner can launch (`None`: any).
    fn max_world_size(&self) -> Option<usize> {
        None
    }
}

/// Thread ranks in this process.
pub(crate) struct ThreadRunner;

impl ThreadRunner {
    /// Launches the request's ranks as threads and gathers their traces.
    pub(crate) fn launch(
        &self,
        scenario: &LoadedScenario,
        request: &RunRequest,
    ) -> Result<Trace, LaunchError> {
        launch_thread_ranks(scenario, request, |program, comm, request| {
            run_rank(program, comm, request)
        })
    }
}

/// Launches the request's ranks as threads, each running `body` (the rank body over the thread
/// communicator, or over a communicator wrapping it), and gathers their traces.
pub(crate) fn launch_thread_ranks<B>(
    scenario: &LoadedScenario,
    request: &RunRequest,
    body: B,
) -> Result<Trace, LaunchError>
where
    B: Fn(&dyn Scenario, &ThreadComm, &RunRequest) -> Result<RankTrace, RankError>
        + Send
        + Sync
        + 'static,
{
    let Some(program) = scenario.program.ranks() else {
        return Err(LaunchError::RankFailed {
            rank: 0,
            message: "a `command` scenario runs in its own processes, not on thread ranks"
                .to_owned(),
        });
    };
    let mut config = LaunchConfig::new(request.spec.world_size).with_deadline(request.deadline);
    config.perturbation = request.perturbation;
    let program = Arc::clone(program);
    let shared = Arc::new(request.clone());
    let ranks = launch_threads(&config, move |comm| body(program.as_ref(), comm, &shared))?;
    Ok(Trace { ranks })
}

impl Runner for ThreadRunner {
    fn run(&self, scenario: &LoadedScenario, request: &RunRequest) -> Result<Trace, RunError> {
        self.launch(scenario, request)
            .map_err(|source| request.failed(source))
    }

    fn is_mpi(&self) -> bool {
        false
    }
}

/// The runner of `scenario`'s runs: the process runner for a `command` scenario; for a rank
/// program, `default` (the session's: threads or MPI), or the GPU runner for a `device: "gpu"`
/// scenario on thread ranks (under MPI, a `gpu` scenario's ranks use NCCL: `run/mpi.rs`).
///
/// # Errors
/// [`RunError::NoDevice`] for a `gpu` scenario when this process has no GPU it can use.
pub(crate) fn runner_for<'r>(
    scenario: &LoadedScenario,
    default: &'r dyn Runner,
) -> Result<&'r dyn Runner, RunError> {
    match scenario.program {
        Program::Ranks(_) if scenario.spec.device == Device::Gpu && !default.is_mpi() => {
            gpu::gpu_runner_dyn().map_err(|reason| gpu::no_device(scenario, reason))
        }
        Program::Ranks(_) if scenario.spec.device == Device::Gpu => gpu::nccl_usable()
            .map(|()| default)
            .map_err(|reason| gpu::no_device(scenario, reason)),
        Program::Ranks(_) => Ok(default),
        Program::Command(_) => Ok(&process::ProcessRunner),
    }
}

/// Runs `scenario` once on thread ranks (a `command` scenario: in its own processes) and
/// returns its trace.
///
/// # Errors
/// [`RunError::Launch`] when a rank fails; `run` numbers the run in the message.
pub fn run_once(
    scenario: &LoadedScenario,
    options: &CheckOptions,
    perturbation: Option<Perturbation>,
    run: usize,
) -> Result<Trace, RunError> {
    let request = RunRequest::new(scenario, options, perturbation, run, &RunPlan::default());
    runner_for(scenario, &ThreadRunner)?.run(scenario, &request)
}
