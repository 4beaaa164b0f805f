//! Sessions: where this process runs checks, alone on thread ranks or as one process of an MPI
//! job.
//!
//! A [`Session`] is what the CLI and the harness hold for the life of the process. On thread ranks
//! it runs [`run_checks`](crate::run_checks). Under `mpirun` (cargo feature `mpi`) every process is
//! one rank and process 0 is the *leader*: it decides which scenario runs next and tells the
//! others (the *followers*, in [`Session::follow`]), so every process runs the same runs in the
//! same order, whatever filters the leader's command line applies. A run's ranks are the first
//! `world_size` processes; each sends its trace (or its failure) to the leader, which compares and
//! reports. Only the leader prints. [`Session::finish`] tells the followers the exit code and
//! finalizes MPI, so every process exits with the same code.
//!
//! [`Session::from_env`] picks the backend: MPI when an MPI launcher started this process (it sets
//! `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE` or `PMIX_RANK`), thread ranks otherwise. Wrong usage gets a
//! [`SessionError`] that says what to do: started by `mpirun` but built without `mpi`, or linked
//! against a different MPI than the `mpirun` that started it.
//!
//! Determinism: the leader's order of runs is the only order; followers never choose.

use crate::check::{run_checks, CheckOptions, RunError, ScenarioReport};
#[cfg(feature = "mpi")]
use crate::comm::Communicator;
#[cfg(feature = "mpi")]
use crate::run::mpi as mpi_job;
use crate::scenario::{KindRegistry, LoadedScenario, Program};

/// The environment variables MPI launchers set in the processes they start: Open MPI, MPICH's
/// Hydra (and Intel MPI), PMIx launchers (Open MPI 5, Slurm).
const LAUNCHER_VARS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"];

/// The rank an MPI launcher gave this process, read from its environment without starting MPI
/// (`None` when no launcher started it). Use it to print from one process only before MPI starts,
/// e.g. for `--list`.
#[must_use]
pub fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|var| std::env::var(var).ok()?.parse().ok())
}

/// The number of processes an MPI launcher started, read from its environment without starting
/// MPI (`None` when no launcher started it, or when it does not say: PMIx's).
#[must_use]
pub fn launcher_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|var| std::env::var(var).ok()?.parse().ok())
}

/// The first launcher variable set in this process, with its value.
fn launcher_var() -> Option<(&'static str, String)> {
    LAUNCHER_VARS
        .iter()
        .find_map(|&var| std::env::var(var).ok().map(|value| (var, value)))
}

/// Why a session could not start or serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// An MPI launcher started this process, but MPI support is not compiled in.
    #[error(
        "this process was started by an MPI launcher ({var}={value}), but detcheck was built \
         without MPI support: rebuild with `--features mpi` (see scripts/install-mpi.sh)"
    )]
    MpiNotBuilt {
        /// The launcher's variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// MPI was already initialized, or refused to start.
    #[error("cannot initialize MPI (it is already initialized, or the library refused)")]
    MpiInit,
    /// The launcher started more processes than MPI sees: another MPI's `mpirun`.
    #[error(
        "the launcher started {launched} processes ({var}), but MPI sees a world of {seen}: this \
         binary is linked against a different MPI than the `mpirun` that started it (Open MPI and \
         MPICH do not mix); use the matching launcher (mpirun.openmpi or mpirun.mpich) or rebuild"
    )]
    FlavourMismatch {
        /// The launcher's variable.
        var: &'static str,
        /// The processes it says it started.
        launched: usize,
        /// The world size MPI reports.
        seen: usize,
    },
}

/// Where this process runs checks.
#[derive(Debug)]
pub struct Session {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Threads,
    #[cfg(feature = "mpi")]
    Mpi(mpi_job::MpiJob),
}

impl Session {
    /// A session on thread ranks in this process.
    #[must_use]
    pub fn threads() -> Self {
        Session {
            kind: Kind::Threads,
        }
    }

    /// MPI ranks when an MPI launcher started this process, thread ranks otherwise.
    ///
    /// # Errors
    /// [`SessionError`] when a launcher started this process but MPI cannot be used.
    pub fn from_env() -> Result<Self, SessionError> {
        match launcher_var() {
            None => Ok(Session::threads()),
            Some((var, value)) => Session::mpi(var, value),
        }
    }

    #[cfg(feature = "mpi")]
    fn mpi(var: &'static str, value: String) -> Result<Self, SessionError> {
        let job = mpi_job::MpiJob::start().ok_or(SessionError::MpiInit)?;
        if var != "PMIX_RANK" {
            if let Ok(launched) = value.parse::<usize>() {
                if launched != job.num_processes() {
                    return Err(SessionError::FlavourMismatch {
                        var,
                        launched,
                        seen: job.num_processes(),
                    });
                }
            }
        }
        Ok(Session {
            kind: Kind::Mpi(job),
        })
    }

    #[cfg(not(feature = "mpi"))]
    fn mpi(var: &'static str, value: String) -> Result<Self, SessionError> {
        Err(SessionError::MpiNotBuilt { var, value })
    }

    /// `true` for the process that decides and prints: the only one on thread ranks, process 0
    /// under MPI.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        match &self.kind {
            Kind::Threads => true,
            #[cfg(feature = "mpi")]
            Kind::Mpi(job) => job.is_leader(),
        }
    }

    /// The backend in words, for headers: `thread ranks` or `MPI, 4 processes (Open MPI …)`.
    #[must_use]
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Threads => "thread ranks".to_owned(),
            #[cfg(feature = "mpi")]
            Kind::Mpi(job) => job.describe(),
        }
    }

    /// The number of MPI processes, or `None` on thread ranks.
    #[must_use]
    pub fn num_processes(&self) -> Option<usize> {
        match &self.kind {
            Kind::Threads => None,
            #[cfg(feature = "mpi")]
            Kind::Mpi(job) => Some(job.num_processes()),
        }
    }

    /// Every process's `value`, by rank, on the leader (threads: just this one; an MPI
    /// follower gets an empty list). Every process of an MPI job must call it.
    #[must_use]
    pub fn gather(&self, value: String) -> Vec<String> {
        match &self.kind {
            Kind::Threads => vec![value],
            #[cfg(feature = "mpi")]
            Kind::Mpi(job) => job
                .gather(value.as_bytes(), std::time::Duration::from_secs(60))
                .into_iter()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .collect(),
        }
    }

    /// Why `scenario` cannot run in this session (`None`: it can): under MPI, a scenario that
    /// needs more ranks than the job has processes, or a `command` scenario (it launches its
    /// own processes; run it without `mpirun`).
    #[must_use]
    pub fn skip_reason(&self, scenario: &LoadedScenario) -> Option<&'static str> {
        self.num_processes()
            .and_then(|processes| mpi_skip_reason(scenario, processes))
    }

    /// Runs `scenario`'s checks (leader only; under MPI every process takes part). Under MPI,
    /// `backends` is added where it applies.
    ///
    /// # Errors
    /// [`RunError`] when a run fails, or when the scenario needs more ranks than the MPI job has.
    pub fn run_checks(
        &self,
        scenario: &LoadedScenario,
        options: &CheckOptions,
    ) -> Result<ScenarioReport, RunError> {
        match &self.kind {
            Kind::Threads => run_checks(scenario, options),
            #[cfg(feature = "mpi")]
            Kind::Mpi(job) => {
                if scenario.spec.world_size > job.num_processes() {
                    return Err(RunError::WorldTooLarge {
                        scenario: scenario.name.clone(),
                        needed: scenario.spec.world_size,
                        available: job.num_processes(),
                    });
                }
                crate::check::run_checks_on(&job.runner(), scenario, options)
            }
        }
    }

    /// Serves the leader's runs until it finishes (followers only); returns the leader's exit
    /// code. `registry` builds the scenarios the leader names, so it must know the same kinds (a
    /// scenario it cannot build fails that run on this rank, with the reason). On thread ranks,
    /// and on the leader, returns 0 at once. A command that cannot be read aborts the job.
    #[must_use]
    pub fn follow(&self, registry: &KindRegistry) -> u8 {
        match &self.kind {
            Kind::Threads => {
                let _ = registry;
                0
            }
            #[cfg(feature = "mpi")]
            Kind::Mpi(job) => job.follow(registry),
        }
    }

    /// Ends the session: the leader tells the followers `exit_code`; MPI is finalized. Returns
    /// `exit_code`, for `main` to return (never `process::exit`, which skips `MPI_Finalize`).
    #[must_use]
    pub fn finish(self, exit_code: u8) -> u8 {
        match self.kind {
            Kind::Threads => exit_code,
            #[cfg(feature = "mpi")]
            Kind::Mpi(job) => job.finish(exit_code),
        }
    }
}

/// Why `scenario` cannot run in an MPI job of `processes` processes (`None`: it can); what
/// [`Session::skip_reason`] says under MPI, for callers that decide before the session starts
/// (the harness's `--list`).
#[must_use]
pub fn mpi_skip_reason(scenario: &LoadedScenario, processes: usize) -> Option<&'static str> {
    if matches!(scenario.program, Program::Command(_)) {
        Some("a command scenario launches its own processes: run it without mpirun")
    } else if scenario.spec.world_size > processes {
        Some("needs more MPI processes")
    } else {
        None
    }
}

/// Runs `program` on the MPI world as it was launched (SPMD: every process calls this, and each
/// is one rank), with detcheck's MPI communicator and a collective `deadline`; MPI is initialized
/// before and finalized after. For programs of your own and benchmarks under `mpirun`; the
/// checks use [`Session`] instead.
///
/// # Errors
/// [`SessionError::MpiInit`] when MPI cannot be initialized.
#[cfg(feature = "mpi")]
pub fn run_on_mpi_world<R>(
    deadline: std::time::Duration,
    program: impl FnOnce(&dyn Communicator) -> R,
) -> Result<R, SessionError> {
    let job = mpi_job::MpiJob::start().ok_or(SessionError::MpiInit)?;
    Ok(job.run_spmd(deadline, program))
}
