//! The launch contract: the environment detcheck gives a program it starts (the `command` kind),
//! and how a program finds where to write its trace file.
//!
//! This layer sits directly above `crate::file`: the trace format knows nothing of launches.
//! Here are the contract itself (this file), Slurm's side of it (`slurm.rs`), a re-run's capture
//! request and its reply (`capture.rs`), and what a launched rank's writer takes from its launch
//! (`writer.rs`: [`TraceWriter::from_env`](crate::file::TraceWriter::from_env) and
//! `from_env_for_rank`, built on `crate::file::TraceWriter`).
//!
//! [`Launch::to_env`] is what the runner (`crate::run`) sets; [`Launch::from_env`] is what
//! `TraceWriter::from_env` (and the Python package, through it) reads. Both sides are here, so
//! the names and formats exist once:
//!
//! | variable | value |
//! | --- | --- |
//! | `DETCHECK_TRACE_DIR` | the folder of this launch's trace files (fresh for every launch) |
//! | `DETCHECK_WORLD_SIZE` | the number of ranks |
//! | `DETCHECK_RANK` | this process's rank (`processes` launcher; otherwise `RANK` from torchrun, the MPI launcher's rank, with the `srun` launcher `SLURM_PROCID` (`crate::launch::slurm`), or with the `msrun` launcher a worker's `RANK_ID` (`MS_ROLE=MS_WORKER`; msrun's scheduler, `MS_ROLE=MS_SCHED`, is no rank)) |
//! | `DETCHECK_SEED`, `DETCHECK_STEPS` | the scenario's seed and steps |
//! | `DETCHECK_MODE` | `md5`, `stats` or `full`: what each record holds |
//! | `DETCHECK_LAUNCH` | `K:T`: launch K of the check and its start time T (ms since the Unix epoch) |
//! | `DETCHECK_RUN_ID` | 32 hex digits: the run id of this launch's trace files (`crate::file::RunId`) |
//! | `DETCHECK_LAUNCHER` | the scenario's launcher (`processes`, `mpirun`, `torchrun`, `msrun`, `srun`, `none`), for the environment snapshot; `srun`: the rank is read from `SLURM_PROCID` too; `msrun`: from a worker's `RANK_ID` |
//! | `DETCHECK_FINGERPRINT` | the scenario's fingerprint, for the environment snapshot |
//! | `DETCHECK_MPI_LIBRARY` | the MPI library the `mpirun` launcher reports (`mpirun --version`'s first line) |
//! | `DETCHECK_PROGRAM` | the program as `detcheck run` takes it (`--ranks 2 --launcher torchrun -- python3 train.py`, shell-quoted), for the environment snapshot (`site:program`): what `compare --align` prints in the commands that look inside a culprit |
//! | `DETCHECK_STOP_AFTER` | `N`: the zero-change recorder ends the program after its N-th optimizer step (unset: it runs to its end) |
//! | `DETCHECK_DETERMINISTIC` | `1`: the start-up hook applies `hints::deterministic()`'s calls with the scenario's seed; or a comma-separated list of those settings' names: only those (what `--deterministic` tries to learn which setting fixes a divergence) |
//! | `DETCHECK_RECORD` | `end`: an unperturbed run: the zero-change recorder reads nothing during the steps (no record, no evidence, no synchronisation) and records the end state once, after the last step: `param/*` of the last update; `flow` (`run --dump`): every record, and each module's tensor inputs that are no tensor recorded before them in the step (`in/<module>.N`: what code between modules made), so `compare --align` sees every module's input (unset or `all`: every record of every step); `rows` (the `batch_sizes` check): each sample's rows of every module output, at step = the sample's place in the stream of samples the program feeds its model |
//! | `DETCHECK_ROWS_INSIDE` | with `DETCHECK_RECORD=rows`: `<sample>:<call>:<record name>`: the recorder also writes, at the sample's step, the sample's rows of each `aten` operator that reads the batch inside that call of that record's module (`op/NNNN/<module>/<operator>/out0`, the operator trace's grammar: docs/operators.md), with each one's input shapes and line in the environment (`detcheck.rows.op:N`, `site:rows:N`): the `batch_sizes` check's drill-down to the operator; read by `detcheck._torch.rows` |
//!
//! `DETCHECK_STOP_AFTER`, `DETCHECK_DETERMINISTIC` and `DETCHECK_RECORD` are read by the Python
//! package's start-up hook ([`RecorderPlan`]), which records
//! a program that opens no writer of its own (python/README.md, "Zero-change recording").
//!
//! Determinism: the values are a function of the scenario and the launch. `DETCHECK_LAUNCH`
//! only moves timing: [`Launch::wait_for_start`] holds every rank until all have arrived
//! (marker files `.detcheck-start-R` in the trace folder), then rank r for slot × step, where the
//! slot is r rotated by K, so every launch starts its ranks in another order (what makes an
//! arrival-order bug show up every time, however slowly the ranks started). It reads the wall
//! clock (T bounds the wait), which is fine on a timing path and never touches a value.

pub mod capture;
pub mod slurm;
mod writer;
pub use capture::{Capture, InsideRequest};

use crate::file::{DumpError, DumpMode, RunId};
use crate::record::hints;
use slurm::SlurmTask;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `DETCHECK_TRACE_DIR`.
pub const TRACE_DIR_VAR: &str = "DETCHECK_TRACE_DIR";

/// The environment key a process launch sets on every rank when the program changed a file of
/// the user's working directory in place (`run/workdir.rs`); the comparison keeps it as a fact
/// even when both runs changed the file alike.
pub(crate) const WORKDIR_KEY: &str = "detcheck.workdir";
/// `DETCHECK_WORLD_SIZE`.
pub const WORLD_SIZE_VAR: &str = "DETCHECK_WORLD_SIZE";
/// `DETCHECK_RANK`.
pub const RANK_VAR: &str = "DETCHECK_RANK";
/// `DETCHECK_SEED`.
pub const SEED_VAR: &str = "DETCHECK_SEED";
/// `DETCHECK_STEPS`.
pub const STEPS_VAR: &str = "DETCHECK_STEPS";
/// `DETCHECK_MODE`.
pub const MODE_VAR: &str = "DETCHECK_MODE";
/// `DETCHECK_LAUNCH`.
pub const LAUNCH_VAR: &str = "DETCHECK_LAUNCH";
/// `DETCHECK_RUN_ID`.
pub const RUN_ID_VAR: &str = "DETCHECK_RUN_ID";
/// `DETCHECK_LAUNCHER`.
pub const LAUNCHER_VAR: &str = "DETCHECK_LAUNCHER";
/// `DETCHECK_FINGERPRINT`.
pub const FINGERPRINT_VAR: &str = "DETCHECK_FINGERPRINT";
/// `DETCHECK_MPI_LIBRARY`.
pub const MPI_LIBRARY_VAR: &str = "DETCHECK_MPI_LIBRARY";
/// `DETCHECK_PROGRAM`.
pub const PROGRAM_VAR: &str = "DETCHECK_PROGRAM";

/// `value` quoted for a POSIX shell when it has characters the shell would read: how a command
/// detcheck prints or records (`DETCHECK_PROGRAM`) can be pasted back.
#[must_use]
pub fn shell_quote(value: &str) -> String {
    if !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:/=,".contains(c))
    {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', "'\\''"))
    }
}

/// `DETCHECK_STOP_AFTER`.
pub const STOP_AFTER_VAR: &str = "DETCHECK_STOP_AFTER";
/// `DETCHECK_DETERMINISTIC`.
pub const DETERMINISTIC_VAR: &str = "DETCHECK_DETERMINISTIC";
/// `DETCHECK_RECORD`.
pub const RECORD_VAR: &str = "DETCHECK_RECORD";
/// `DETCHECK_ROWS_INSIDE`.
pub const ROWS_INSIDE_VAR: &str = "DETCHECK_ROWS_INSIDE";
/// The environment entry a recorder writes into a trace of samples (`DETCHECK_RECORD=rows`:
/// each sample's rows at the sample's step), `samples`: a run of the `batch_sizes` check whose
/// traces hold none wrote no samples (a recorder without rows, a program that records itself),
/// and the check is n/a.
pub const ROWS_KEY: &str = "detcheck.rows";
/// The environment entry a recorder writes when a wrapper shards the model's parameters over
/// the ranks rather than replicating them (DeepSpeed's engine at ZeRO stage 3); its value says
/// which, in words, and a `replicas` check that compared nothing gives them as its reason.
pub const SHARDED_KEY: &str = "detcheck.sharded";

/// What the zero-change recorder of the Python package is asked to do besides recording.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecorderPlan {
    /// End the program after this many optimizer steps (its trace finished first).
    pub stop_after: Option<u64>,
    /// The deterministic settings to apply (`crate::record::hints::deterministic`): bit `i` is
    /// its `i`-th setting; 0: none, [`all_settings`]: every one.
    pub deterministic: u32,
    /// What the recorder records (`DETCHECK_RECORD`).
    pub record: RecordMode,
}

/// What the zero-change recorder records (`DETCHECK_RECORD`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RecordMode {
    /// Every record of every step (`all`, or unset).
    #[default]
    All,
    /// An unperturbed run: nothing is read during the steps, the end state is recorded once
    /// after the last one (`end`).
    EndState,
    /// Every record, and each module's tensor inputs that no record before them in the step
    /// holds (`flow`): the data flow `compare --align` needs to call an error a module's own.
    Flow,
    /// Each sample's rows of every module output, at step = the sample's place in the stream of
    /// samples (`rows`): the `batch_sizes` check.
    Rows,
}

impl RecordMode {
    /// Its value of `DETCHECK_RECORD`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            RecordMode::All => "all",
            RecordMode::EndState => "end",
            RecordMode::Flow => "flow",
            RecordMode::Rows => "rows",
        }
    }
}

/// The mask of every deterministic setting ([`RecorderPlan::deterministic`]).
#[must_use]
pub fn all_settings() -> u32 {
    (1u32 << hints::deterministic().count()) - 1
}

/// The names of the settings of `mask`, in the table's order.
#[must_use]
pub fn setting_names(mask: u32) -> Vec<&'static str> {
    hints::deterministic()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, h)| h.name)
        .collect()
}

/// The mask of the settings named `names`; `None` when a name is none of them.
#[must_use]
pub fn settings_mask<'n>(names: impl IntoIterator<Item = &'n str>) -> Option<u32> {
    let mut mask = 0;
    for name in names {
        let i = hints::deterministic().position(|h| h.name == name)?;
        mask |= 1 << i;
    }
    Some(mask)
}

impl RecorderPlan {
    /// The variables of this plan, for the runner to set.
    #[must_use]
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut vars = Vec::new();
        if let Some(n) = self.stop_after {
            vars.push((STOP_AFTER_VAR, n.to_string()));
        }
        if self.deterministic == all_settings() {
            vars.push((DETERMINISTIC_VAR, "1".to_owned()));
        } else if self.deterministic != 0 {
            vars.push((
                DETERMINISTIC_VAR,
                setting_names(self.deterministic).join(","),
            ));
        }
        if self.record != RecordMode::All {
            vars.push((RECORD_VAR, self.record.as_str().to_owned()));
        }
        vars
    }

    /// The plan of this process's launch (what the variables say; nothing when unset).
    ///
    /// # Errors
    /// [`DumpError::Field`] naming a variable that is set but cannot be read.
    pub fn from_env() -> Result<Self, DumpError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, DumpError> {
        let stop_after = match var(STOP_AFTER_VAR) {
            None => None,
            Some(v) => Some(
                v.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad_variable(STOP_AFTER_VAR, &v, "a positive number"))?,
            ),
        };
        let deterministic = match var(DETERMINISTIC_VAR).as_deref() {
            None | Some("0") => 0,
            Some("1") => all_settings(),
            Some(v) => settings_mask(v.split(',').map(str::trim)).ok_or_else(|| {
                bad_variable(
                    DETERMINISTIC_VAR,
                    v,
                    "0, 1 or names of the deterministic settings (`detcheck env`)",
                )
            })?,
        };
        let record = match var(RECORD_VAR).as_deref().map(str::trim) {
            None | Some("" | "all") => RecordMode::All,
            Some("end") => RecordMode::EndState,
            Some("flow") => RecordMode::Flow,
            Some("rows") => RecordMode::Rows,
            Some(v) => {
                return Err(bad_variable(
                    RECORD_VAR,
                    v,
                    "`all`, `end`, `flow` or `rows`",
                ))
            }
        };
        Ok(RecorderPlan {
            stop_after,
            deterministic,
            record,
        })
    }
}

/// The note a rank's Python start-up hook leaves in the trace folder when it recorded nothing
/// and the program opened no writer of its own (one line: why), so a launch without that rank's
/// trace says why instead of only that the file is missing.
#[must_use]
pub fn no_records_note(trace_dir: &std::path::Path, rank: u32) -> PathBuf {
    RankFiles::new(trace_dir, rank).note
}

/// The files a rank's Python start-up hook keeps in the trace folder besides its trace, so
/// that a failed launch reads like the rank's own failure under every launcher (torchrun and
/// mpirun show the launcher's words, not the rank's):
///
/// | file | written | holds |
/// | --- | --- | --- |
/// | `rank{R}.no-records.txt` | at exit, when nothing was recorded | one line: why |
/// | `rank{R}.error.txt` | when the rank's program ends with an uncaught exception | `detcheck-error rank=R time=T` (T: seconds since the Unix epoch, a float), then the traceback |
/// | `rank{R}.pid` | at start-up | the rank's process id |
/// | `rank{R}.stacks.txt` | when detcheck sends the rank `SIGUSR2` (a launch past its timeout) | every thread's Python stack (`faulthandler`) |
/// | `rank{R}.started.txt` | when a process the program started joins its process group as rank R of a world larger than the launch's (`torch.multiprocessing.spawn`, Lightning's `devices=N`) | the program's line where it joined: the launch then has as many ranks as such files say |
///
/// Each is written whole (a temporary name, then a rename) except the stacks, which
/// `faulthandler` writes into a file opened at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFiles {
    /// `rank{R}.no-records.txt`.
    pub note: PathBuf,
    /// `rank{R}.error.txt`.
    pub error: PathBuf,
    /// `rank{R}.pid`.
    pub pid: PathBuf,
    /// `rank{R}.stacks.txt`.
    pub stacks: PathBuf,
    /// `rank{R}.started.txt`.
    pub started: PathBuf,
}

impl RankFiles {
    /// The files of rank `rank` in `trace_dir`.
    #[must_use]
    pub fn new(trace_dir: &std::path::Path, rank: u32) -> Self {
        let file = |what: &str| trace_dir.join(format!("rank{rank}.{what}"));
        RankFiles {
            note: file("no-records.txt"),
            error: file("error.txt"),
            pid: file("pid"),
            stacks: file("stacks.txt"),
            started: file("started.txt"),
        }
    }
}

/// The first line of a `rank{R}.error.txt` file: `detcheck-error rank=R time=T`.
pub const ERROR_FILE_MAGIC: &str = "detcheck-error";

/// The error of a launch variable that is set but cannot be read.
fn bad_variable(name: &str, value: &str, what: &str) -> DumpError {
    DumpError::Field {
        path: PathBuf::from("(environment)"),
        field: name.to_owned(),
        detail: format!("`{value}` is not {what}"),
    }
}

/// The variables other launchers set for a process's rank, in the order they are read after
/// `DETCHECK_RANK`: torchrun's, Open MPI's, MPICH/Hydra's, PMIx's.
const OTHER_RANK_VARS: [&str; 4] = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"];

/// `DETCHECK_LAUNCHER`'s value for the `srun` launcher, under which a rank is `SLURM_PROCID`.
pub const SRUN_LAUNCHER: &str = "srun";

/// `DETCHECK_LAUNCHER`'s value for the `msrun` launcher, under which a rank is a worker's
/// `RANK_ID`.
pub const MSRUN_LAUNCHER: &str = "msrun";

/// What msrun sets for the role of the process it starts: `MS_WORKER` (a rank) or `MS_SCHED`
/// (its scheduler, which runs the same script but is no rank).
const MS_ROLE_VAR: &str = "MS_ROLE";
/// The role of msrun's workers.
const MS_WORKER: &str = "MS_WORKER";
/// What msrun sets for a worker's rank (its node id, which MindSpore makes its rank when every
/// worker runs on one node).
const MS_RANK_VAR: &str = "RANK_ID";

/// Under detcheck's `srun` launcher (`DETCHECK_LAUNCHER=srun`), the variables of this task's
/// rank that a program reads: torch.distributed's from Slurm's
/// ([`SlurmTask::rank_variables`]) and `DETCHECK_RANK`; empty elsewhere. The Python start-up
/// hook sets them before the program's code runs.
///
/// # Errors
/// [`DumpError::Field`] naming a Slurm variable that is set but cannot be read.
pub fn srun_rank_variables() -> Result<Vec<(&'static str, String)>, DumpError> {
    srun_rank_variables_of(|name| std::env::var(name).ok())
}

fn srun_rank_variables_of(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(&'static str, String)>, DumpError> {
    if var(LAUNCHER_VAR).as_deref() != Some(SRUN_LAUNCHER) {
        return Ok(Vec::new());
    }
    let task = SlurmTask::from_vars(&var).map_err(|e| DumpError::Field {
        path: PathBuf::from("(environment)"),
        field: "SLURM_PROCID".to_owned(),
        detail: e.to_string(),
    })?;
    Ok(task.map_or_else(Vec::new, |task| {
        let mut vars = task.rank_variables();
        vars.push((RANK_VAR, task.rank.to_string()));
        vars
    }))
}

/// The longest a start is staggered over all ranks.
const MAX_STAGGER: Duration = Duration::from_millis(600);
/// The stagger between two consecutive start slots, at most.
const MAX_SLOT: Duration = Duration::from_millis(30);
/// The gap between two consecutive slots' first sends, at most ([`Launch::first_send_delay`]):
/// longer than a start slot, because ranks that left a process group's rendezvous together
/// drift apart by their own step's work before they send.
const MAX_SEND_SLOT: Duration = Duration::from_millis(100);

/// What a launched program is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// Where the trace files go.
    pub trace_dir: PathBuf,
    /// The number of ranks.
    pub world_size: u32,
    /// This process's rank, when the launcher gives one.
    pub rank: Option<u32>,
    /// The scenario's seed.
    pub seed: u64,
    /// The scenario's steps.
    pub steps: u64,
    /// What each record holds.
    pub mode: DumpMode,
    /// Which launch of the check (0, 1, ...) and its start time, for the start stagger.
    pub start: Option<(u32, u64)>,
    /// The run id of the launch's trace files.
    pub run_id: Option<RunId>,
    /// The scenario's launcher, for the environment snapshot.
    pub launcher: Option<String>,
    /// The scenario's fingerprint, for the environment snapshot.
    pub fingerprint: Option<String>,
    /// The MPI library the launcher reports, for the environment snapshot.
    pub mpi_library: Option<String>,
    /// The program as `detcheck run` takes it, for the environment snapshot.
    pub program: Option<String>,
}

impl Launch {
    /// The variables of this launch, for the runner to set (`DETCHECK_RANK` only when `rank` is
    /// given).
    #[must_use]
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            (TRACE_DIR_VAR, self.trace_dir.display().to_string()),
            (WORLD_SIZE_VAR, self.world_size.to_string()),
            (SEED_VAR, self.seed.to_string()),
            (STEPS_VAR, self.steps.to_string()),
            (MODE_VAR, self.mode.name().to_owned()),
        ];
        if let Some(rank) = self.rank {
            vars.push((RANK_VAR, rank.to_string()));
        }
        if let Some((launch, start_ms)) = self.start {
            vars.push((LAUNCH_VAR, format!("{launch}:{start_ms}")));
        }
        if let Some(id) = self.run_id {
            vars.push((RUN_ID_VAR, id.to_string()));
        }
        for (name, value) in [
            (LAUNCHER_VAR, &self.launcher),
            (FINGERPRINT_VAR, &self.fingerprint),
            (MPI_LIBRARY_VAR, &self.mpi_library),
            (PROGRAM_VAR, &self.program),
        ] {
            if let Some(value) = value {
                vars.push((name, value.clone()));
            }
        }
        vars
    }

    /// The launch this process belongs to: `None` when detcheck did not start it
    /// (`DETCHECK_TRACE_DIR` unset), so a program runs unchanged outside detcheck.
    ///
    /// # Errors
    /// [`DumpError::Field`] naming the variable that is set but cannot be read.
    pub fn from_env() -> Result<Option<Self>, DumpError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Launch::from_env`] over any source of variables (tests).
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, DumpError> {
        let Some(trace_dir) = var(TRACE_DIR_VAR) else {
            return Ok(None);
        };
        let number = |name: &str| -> Result<Option<u64>, DumpError> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| bad_variable(name, &v, "a number"))
                })
                .transpose()
        };
        let world_size = number(WORLD_SIZE_VAR)?.filter(|&w| w > 0).ok_or_else(|| {
            bad_variable(
                WORLD_SIZE_VAR,
                &var(WORLD_SIZE_VAR).unwrap_or_default(),
                "a positive number",
            )
        })?;
        let world_size = u32::try_from(world_size)
            .map_err(|_| bad_variable(WORLD_SIZE_VAR, &world_size.to_string(), "a world size"))?;
        let mut rank = None;
        for name in std::iter::once(RANK_VAR).chain(OTHER_RANK_VARS) {
            if let Some(r) = number(name)? {
                let r = u32::try_from(r)
                    .ok()
                    .filter(|&r| r < world_size)
                    .ok_or_else(|| bad_variable(name, &r.to_string(), "a rank of this world"))?;
                rank = Some(r);
                break;
            }
        }
        if rank.is_none()
            && var(LAUNCHER_VAR).as_deref() == Some(MSRUN_LAUNCHER)
            && var(MS_ROLE_VAR).as_deref() == Some(MS_WORKER)
        {
            // Only a worker of detcheck's `msrun` launcher: msrun's scheduler runs the script
            // too, with RANK_ID=0, and is no rank.
            if let Some(r) = number(MS_RANK_VAR)? {
                rank = Some(
                    u32::try_from(r)
                        .ok()
                        .filter(|&r| r < world_size)
                        .ok_or_else(|| {
                            bad_variable(MS_RANK_VAR, &r.to_string(), "a rank of this world")
                        })?,
                );
            }
        }
        if rank.is_none() && var(LAUNCHER_VAR).as_deref() == Some(SRUN_LAUNCHER) {
            // Only under detcheck's `srun` launcher: a batch script's own process has
            // SLURM_PROCID=0 too, and is no rank of a `none` or torchrun launch.
            let task = SlurmTask::from_vars(&var).map_err(|e| DumpError::Field {
                path: PathBuf::from("(environment)"),
                field: "SLURM_PROCID".to_owned(),
                detail: e.to_string(),
            })?;
            if let Some(task) = task {
                if task.rank >= world_size {
                    return Err(bad_variable(
                        "SLURM_PROCID",
                        &task.rank.to_string(),
                        "a rank of this world",
                    ));
                }
                rank = Some(task.rank);
            }
        }
        let mode = match var(MODE_VAR) {
            None => DumpMode::Stats,
            Some(m) => m
                .parse()
                .map_err(|_| bad_variable(MODE_VAR, &m, "md5, stats or full"))?,
        };
        let start = match var(LAUNCH_VAR) {
            None => None,
            Some(v) => {
                let parsed = v
                    .split_once(':')
                    .and_then(|(k, t)| Some((k.parse().ok()?, t.parse().ok()?)));
                Some(parsed.ok_or_else(|| bad_variable(LAUNCH_VAR, &v, "`launch:start_ms`"))?)
            }
        };
        let run_id = match var(RUN_ID_VAR) {
            None => None,
            Some(v) => Some(
                v.parse()
                    .map_err(|_| bad_variable(RUN_ID_VAR, &v, "32 hex digits"))?,
            ),
        };
        Ok(Some(Launch {
            trace_dir: PathBuf::from(trace_dir),
            world_size,
            rank,
            seed: number(SEED_VAR)?.unwrap_or(0),
            steps: number(STEPS_VAR)?.unwrap_or(0),
            mode,
            start,
            run_id,
            launcher: var(LAUNCHER_VAR),
            fingerprint: var(FINGERPRINT_VAR),
            mpi_library: var(MPI_LIBRARY_VAR),
            program: var(PROGRAM_VAR),
        }))
    }

    /// How long rank `rank` waits after the launch's start time: its slot (the rank rotated by
    /// the launch number) times the slot length.
    #[must_use]
    pub fn start_offset(&self, rank: u32) -> Duration {
        self.slot(rank, MAX_SLOT)
    }

    /// How long rank `rank` waits before its first point-to-point send (the Python recorder's
    /// `_launch.arrival`): its slot times a longer slot length, so a receive from any source sees
    /// the senders' first messages arrive in another order in every launch. Zero in a plain run.
    #[must_use]
    pub fn first_send_delay(&self, rank: u32) -> Duration {
        self.slot(rank, MAX_SEND_SLOT)
    }

    /// Rank `rank`'s slot (the rank rotated by the launch number) times a slot length of at
    /// most `longest`, all slots within [`MAX_STAGGER`]; zero without a start (a plain run).
    fn slot(&self, rank: u32, longest: Duration) -> Duration {
        let Some((launch, _)) = self.start else {
            return Duration::ZERO;
        };
        let world = self.world_size.max(1);
        let slot = (rank + launch % world) % world;
        longest.min(MAX_STAGGER / world) * slot
    }

    /// Waits until rank `rank`'s start slot: first until every rank of the launch has come
    /// this far (each leaves a marker file in the trace folder: ranks start at very different
    /// times when imports or `MPI_Init` are slow), then for its slot's offset. Without a start
    /// time (a plain run) it returns at once; it never waits longer than [`MAX_RENDEZVOUS`]
    /// for the others (a rank that never comes is the program's failure to report, not this).
    pub fn wait_for_start(&self, rank: u32) {
        let Some((_, start_ms)) = self.start else {
            return;
        };
        let marker = |r: u32| self.trace_dir.join(format!(".detcheck-start-{r}"));
        let arrived = std::fs::create_dir_all(&self.trace_dir)
            .and_then(|()| std::fs::write(marker(rank), b""))
            .is_ok();
        let give_up = UNIX_EPOCH + Duration::from_millis(start_ms) + MAX_RENDEZVOUS;
        while arrived
            && SystemTime::now() < give_up
            && (0..self.world_size).any(|r| !marker(r).exists())
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(self.start_offset(rank));
    }
}

/// The longest a rank waits for the others at the start of a staggered launch (from the
/// launch's start time).
pub const MAX_RENDEZVOUS: Duration = Duration::from_secs(20);

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(vars: &[(&str, &str)]) -> Result<Option<Launch>, DumpError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Launch::from_vars(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn the_environment_round_trips() {
        let sent = Launch {
            trace_dir: PathBuf::from("/tmp/t"),
            world_size: 4,
            rank: Some(2),
            seed: 7,
            steps: 3,
            mode: DumpMode::Md5,
            start: Some((1, 1_700_000_000_000)),
            run_id: Some(RunId([0xab; 16])),
            launcher: Some("processes".into()),
            fingerprint: Some("5d6e".into()),
            mpi_library: Some("mpirun (Open MPI) 4.1.4".into()),
            program: Some("--ranks 4 -- python3 'my train.py'".into()),
        };
        let vars = sent.to_env();
        let owned: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(launch(&owned).unwrap(), Some(sent));
        assert_eq!(launch(&[]).unwrap(), None, "not under detcheck");
    }

    #[test]
    fn the_rank_comes_from_other_launchers_and_bad_values_are_named() {
        let base = [("DETCHECK_TRACE_DIR", "/t"), ("DETCHECK_WORLD_SIZE", "4")];
        let with = |extra: (&'static str, &'static str)| {
            let mut v = base.to_vec();
            v.push(extra);
            launch(&v)
        };
        assert_eq!(with(("RANK", "3")).unwrap().unwrap().rank, Some(3));
        assert_eq!(with(("PMI_RANK", "1")).unwrap().unwrap().rank, Some(1));
        assert_eq!(launch(&base).unwrap().unwrap().rank, None);
        // SLURM_PROCID is a rank only under detcheck's srun launcher (a batch script has it).
        assert_eq!(with(("SLURM_PROCID", "1")).unwrap().unwrap().rank, None);
        let mut srun = base.to_vec();
        srun.extend([("DETCHECK_LAUNCHER", "srun"), ("SLURM_PROCID", "1")]);
        assert_eq!(launch(&srun).unwrap().unwrap().rank, Some(1));
        srun[3] = ("SLURM_PROCID", "4");
        assert!(launch(&srun)
            .unwrap_err()
            .to_string()
            .contains("SLURM_PROCID"));
        // RANK_ID is a rank only in a worker of detcheck's msrun launcher: msrun's scheduler
        // runs the script with RANK_ID=0 too.
        let mut msrun = base.to_vec();
        msrun.extend([("DETCHECK_LAUNCHER", "msrun"), ("RANK_ID", "2")]);
        assert_eq!(launch(&msrun).unwrap().unwrap().rank, None, "no role");
        msrun.push(("MS_ROLE", "MS_SCHED"));
        assert_eq!(launch(&msrun).unwrap().unwrap().rank, None, "the scheduler");
        msrun[4] = ("MS_ROLE", "MS_WORKER");
        assert_eq!(launch(&msrun).unwrap().unwrap().rank, Some(2));
        assert_eq!(with(("RANK_ID", "2")).unwrap().unwrap().rank, None);
        msrun[3] = ("RANK_ID", "4");
        assert!(launch(&msrun).unwrap_err().to_string().contains("RANK_ID"));
        let err = with(("OMPI_COMM_WORLD_RANK", "4")).unwrap_err().to_string();
        assert_eq!(
            err,
            "(environment): field `OMPI_COMM_WORLD_RANK`: `4` is not a rank of this world"
        );
        let err = with(("DETCHECK_MODE", "everything"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`DETCHECK_MODE`"), "{err}");
        let err = launch(&[("DETCHECK_TRACE_DIR", "/t")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`DETCHECK_WORLD_SIZE`"), "{err}");
        let err = with(("DETCHECK_RUN_ID", "12")).unwrap_err().to_string();
        assert!(
            err.contains("`DETCHECK_RUN_ID`: `12` is not 32 hex digits"),
            "{err}"
        );
    }

    #[test]
    fn an_srun_task_gets_torchs_and_detchecks_rank_variables() {
        let vars = |v: &[(&str, &str)]| {
            let v: Vec<(String, String)> = v
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            srun_rank_variables_of(|name| v.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
        };
        let task = [
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n[3-4]"),
        ];
        assert!(
            vars(&task).unwrap().is_empty(),
            "not detcheck's srun launcher"
        );
        let mut srun = task.to_vec();
        srun.push(("DETCHECK_LAUNCHER", "srun"));
        let got = vars(&srun).unwrap();
        assert_eq!(got.first(), Some(&("RANK", "1".to_owned())));
        assert!(got.contains(&("MASTER_ADDR", "n3".to_owned())));
        assert_eq!(got.last(), Some(&("DETCHECK_RANK", "1".to_owned())));
    }

    #[test]
    fn the_recorder_plan_round_trips_and_bad_values_are_named() {
        let plan = RecorderPlan {
            stop_after: Some(5),
            deterministic: all_settings(),
            record: RecordMode::EndState,
        };
        let vars = plan.to_env();
        let read = |extra: &[(&str, &str)]| {
            RecorderPlan::from_vars(|name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.clone())
                    .or_else(|| {
                        extra
                            .iter()
                            .find(|(k, _)| *k == name)
                            .map(|(_, v)| (*v).to_owned())
                    })
            })
        };
        assert_eq!(read(&[]).unwrap(), plan);
        assert_eq!(
            RecorderPlan::from_vars(|_| None).unwrap(),
            RecorderPlan::default()
        );
        let err = RecorderPlan::from_vars(|n| (n == STOP_AFTER_VAR).then(|| "0".to_owned()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`DETCHECK_STOP_AFTER`: `0` is not a positive number"),
            "{err}"
        );
        let err = RecorderPlan::from_vars(|n| (n == DETERMINISTIC_VAR).then(|| "yes".to_owned()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`DETCHECK_DETERMINISTIC`"), "{err}");
        let err = RecorderPlan::from_vars(|n| (n == RECORD_VAR).then(|| "some".to_owned()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`DETCHECK_RECORD`: `some`"), "{err}");
        // Every record mode round-trips through its value (`rows`: the `batch_sizes` check).
        for record in [
            RecordMode::All,
            RecordMode::EndState,
            RecordMode::Flow,
            RecordMode::Rows,
        ] {
            let plan = RecorderPlan {
                record,
                ..RecorderPlan::default()
            };
            let vars = plan.to_env();
            let back = RecorderPlan::from_vars(|name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.clone())
            });
            assert_eq!(back.unwrap(), plan, "{}", record.as_str());
        }
        // A subset of the settings, by name, round-trips.
        let some = settings_mask(["random.seed", "PYTHONHASHSEED"]).unwrap();
        let subset = RecorderPlan {
            stop_after: None,
            deterministic: some,
            record: RecordMode::All,
        };
        let vars = subset.to_env();
        assert_eq!(
            vars,
            [(DETERMINISTIC_VAR, "PYTHONHASHSEED,random.seed".to_owned())]
        );
        let back = RecorderPlan::from_vars(|n| (n == DETERMINISTIC_VAR).then(|| vars[0].1.clone()));
        assert_eq!(back.unwrap(), subset);
        assert_eq!(settings_mask(["random.seed", "no.such"]), None);
    }

    /// A launch of 3 ranks, started as launch `start` of a check (`None`: a plain run).
    fn of_three(start: Option<u32>) -> Launch {
        Launch {
            trace_dir: PathBuf::new(),
            world_size: 3,
            rank: None,
            seed: 0,
            steps: 0,
            mode: DumpMode::Stats,
            start: start.map(|launch| (launch, 0)),
            run_id: None,
            launcher: None,
            fingerprint: None,
            mpi_library: None,
            program: None,
        }
    }

    #[test]
    fn every_launch_starts_the_ranks_in_another_order() {
        let at = |launch: u32| {
            let l = of_three(Some(launch));
            let mut order: Vec<u32> = (0..3).collect();
            order.sort_by_key(|&r| l.start_offset(r));
            order
        };
        assert_eq!(at(0), [0, 1, 2]);
        assert_eq!(at(1), [2, 0, 1]);
        assert_eq!(at(2), [1, 2, 0]);
    }

    #[test]
    fn first_sends_follow_the_start_order_with_longer_gaps_within_the_stagger() {
        let mut l = of_three(None);
        assert_eq!(
            l.first_send_delay(2),
            Duration::ZERO,
            "a plain run waits for nothing"
        );
        l.start = Some((1, 0));
        let ms = |r| l.first_send_delay(r).as_millis();
        assert_eq!([ms(0), ms(1), ms(2)], [100, 200, 0]);
        l.world_size = 64;
        assert!(l.first_send_delay(62) <= MAX_STAGGER);
    }
}
