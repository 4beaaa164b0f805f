//! MPI runs: the leader/follower protocol of an MPI job and its [`Runner`].
//!
//! [`MpiJob`] owns MPI (initialized on start, finalized when dropped). The leader sends each
//! follower a *command* (JSON, tag [`TAG_COMMAND`], on `MPI_COMM_WORLD`): run a scenario once, or
//! stop with an exit code. For a run, every process joins the split of the world into the run's
//! ranks (the first `world_size` processes; the sub-communicator is cached per size), the ranks run
//! the program on [`MpiComm`] with a panic caught, end with [`MpiComm::finish`] (which drains the
//! communicator), and send their outcome (trace or failure, JSON, tag [`TAG_RESULT`]) to the
//! leader. The leader turns failures into the same [`LaunchError`]s the thread backend reports.
//!
//! Invariant (the leader decides, followers follow): the order of runs, and their outcome, are the
//! leader's; followers never filter or choose, so processes cannot disagree.
//!
//! Determinism: runs happen in the leader's order; a follower never chooses. Outcomes are
//! assembled by rank, whatever order they arrive in.

use crate::comm::mpi::{abort_job, Backoff, MpiComm};
use crate::comm::watcher::RankWatcher;
use crate::comm::{CommError, LaunchError, RankError};
use crate::record::{RankTrace, Trace};
use crate::run::{run_rank, RunError, RunRequest, Runner};
use crate::scenario::{Device, KindRegistry, LoadedScenario, Scenario};
use mpi::environment::Universe;
use mpi::point_to_point::MatchedReceiveVec;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, Destination as _, Source as _};
use mpi::Threading;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Leader to followers, on the world communicator.
const TAG_COMMAND: i32 = 18;
/// A rank's outcome to the leader, on the run's communicator.
const TAG_RESULT: i32 = 19;
/// A process's part of a gather to the leader, on the world communicator.
const TAG_GATHER: i32 = 20;

/// What the leader tells a follower to do next.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
enum Command {
    Run(Box<RunRequest>),
    Stop { exit_code: u8 },
}

/// How one rank's part of a run ended.
#[derive(Debug, Serialize, Deserialize)]
enum Outcome {
    Trace(RankTrace),
    Panicked(String),
    Failed(String),
    Comm(CommError),
}

impl Outcome {
    fn is_failure(&self) -> bool {
        !matches!(self, Outcome::Trace(_))
    }

    /// How telling a failure is: a rank's own error or panic (0) over a collective that failed
    /// by itself (1), a peer that exited (2), and a peer's failure seen from afar (3).
    fn precedence(&self) -> u8 {
        match self {
            Outcome::Trace(_) => u8::MAX,
            Outcome::Panicked(_) | Outcome::Failed(_) => 0,
            Outcome::Comm(CommError::PeerExited { .. }) => 2,
            Outcome::Comm(CommError::PeerFailed { .. }) => 3,
            Outcome::Comm(_) => 1,
        }
    }
}

/// MPI, initialized for the life of the session.
pub(crate) struct MpiJob {
    world: SimpleCommunicator,
    /// The communicator of each run size, split from the world on first use; `None` on the
    /// processes outside it.
    runs: RefCell<BTreeMap<usize, Option<SimpleCommunicator>>>,
    library: String,
    /// Finalizes MPI after every communicator is freed.
    _universe: Universe,
    /// Dropped last, after `MPI_Finalize`: tells the watcher (Hydra only) this rank ends
    /// normally, so it names only a rank whose process dies (`comm/watcher.rs`).
    _watcher: Option<RankWatcher>,
}

impl std::fmt::Debug for MpiJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiJob")
            .field("rank", &self.world.rank())
            .field("size", &self.world.size())
            .finish_non_exhaustive()
    }
}

impl MpiJob {
    /// Initializes MPI (`None` when it is already initialized or refuses to start).
    pub(crate) fn start() -> Option<Self> {
        // Before `MPI_Init`: the watcher inherits the launcher's descriptors (the PMI socket it
        // must hold, comm/watcher.rs), not MPI's.
        let watcher = RankWatcher::start();
        let (universe, _) = mpi::initialize_with_threading(Threading::Funneled)?;
        let library = mpi::environment::library_version()
            .unwrap_or_default()
            .split([',', '\n'])
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        Some(MpiJob {
            world: universe.world(),
            runs: RefCell::new(BTreeMap::new()),
            library,
            _universe: universe,
            _watcher: watcher,
        })
    }

    pub(crate) fn num_processes(&self) -> usize {
        self.world.size() as usize
    }

    pub(crate) fn is_leader(&self) -> bool {
        self.world.rank() == 0
    }

    pub(crate) fn describe(&self) -> String {
        format!("MPI, {} processes ({})", self.num_processes(), self.library)
    }

    /// The runner of this job's runs (leader only).
    pub(crate) fn runner(&self) -> MpiRunner<'_> {
        MpiRunner { job: self }
    }

    /// Sends `command` to every follower.
    fn broadcast_command(&self, command: &Command) {
        let bytes = serde_json::to_vec(command).expect("commands serialize");
        for r in 1..self.world.size() {
            self.world
                .process_at_rank(r)
                .send_with_tag(&bytes[..], TAG_COMMAND);
        }
    }

    pub(crate) fn follow(&self, registry: &KindRegistry) -> u8 {
        if self.is_leader() {
            return 0;
        }
        let rank = self.world.rank() as usize;
        loop {
            let mut backoff = Backoff::new();
            let bytes = loop {
                if let Some(found) = self
                    .world
                    .process_at_rank(0)
                    .immediate_matched_probe_with_tag(TAG_COMMAND)
                {
                    break found.matched_receive_vec::<u8>().0;
                }
                backoff.wait();
            };
            let command: Command = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                abort_job(
                    &format!("process {rank}"),
                    &format!("malformed command from the leader: {e}"),
                )
            });
            match command {
                Command::Stop { exit_code } => return exit_code,
                Command::Run(run) => {
                    let program = registry
                        .clone()
                        .without_memory_check()
                        .build(run.spec.clone(), &run.origin)
                        .map_err(|e| e.to_string())
                        .and_then(|loaded| {
                            loaded.program.ranks().cloned().ok_or_else(|| {
                                "a `command` scenario runs in its own processes".to_owned()
                            })
                        })
                        .map_err(|e| format!("process {rank} cannot build the scenario: {e}"));
                    self.run_part(program, &run);
                }
            }
        }
    }

    /// Runs `program` on every process with a communicator over the whole world.
    pub(crate) fn run_spmd<R>(
        &self,
        deadline: Duration,
        program: impl FnOnce(&dyn crate::comm::Communicator) -> R,
    ) -> R {
        let comm = MpiComm::new(&self.world, deadline, None, "run_on_mpi_world".to_owned());
        let result = program(&comm);
        comm.finish(false);
        result
    }

    /// Every process's `bytes`, by rank, on the leader (an empty list on the others). Every
    /// process must call it. The leader waits at most `deadline` for each part, then aborts the
    /// job naming the process that sent none.
    pub(crate) fn gather(&self, bytes: &[u8], deadline: Duration) -> Vec<Vec<u8>> {
        if !self.is_leader() {
            self.world
                .process_at_rank(0)
                .send_with_tag(bytes, TAG_GATHER);
            return Vec::new();
        }
        let mut parts = vec![bytes.to_vec()];
        let until = Instant::now() + deadline;
        for source in 1..self.world.size() {
            let mut backoff = Backoff::new();
            let part = loop {
                if let Some(found) = self
                    .world
                    .process_at_rank(source)
                    .immediate_matched_probe_with_tag(TAG_GATHER)
                {
                    break found.matched_receive_vec::<u8>().0;
                }
                if Instant::now() >= until {
                    abort_job(
                        "gather",
                        &format!("process {source} sent nothing within {deadline:?}"),
                    );
                }
                backoff.wait();
            };
            parts.push(part);
        }
        parts
    }

    pub(crate) fn finish(self, exit_code: u8) -> u8 {
        if self.is_leader() {
            self.broadcast_command(&Command::Stop { exit_code });
        }
        exit_code
    }

    /// The communicator of a run of `size` ranks (every process must call this, in order).
    fn run_comm(&self, size: usize) -> std::cell::Ref<'_, Option<SimpleCommunicator>> {
        if !self.runs.borrow().contains_key(&size) {
            let inside = (self.world.rank() as usize) < size;
            let color = if inside {
                Color::with_value(0)
            } else {
                Color::undefined()
            };
            let comm = self.world.split_by_color(color);
            self.runs.borrow_mut().insert(size, comm);
        }
        std::cell::Ref::map(self.runs.borrow(), |runs| &runs[&size])
    }

    /// This process's part of a run: every process calls it; the run's ranks run `program`. On
    /// the leader, returns every rank's outcome by rank.
    fn run_part(
        &self,
        program: Result<Arc<dyn Scenario>, String>,
        run: &RunRequest,
    ) -> Vec<Outcome> {
        let comm = self.run_comm(run.spec.world_size);
        let Some(comm) = comm.as_ref() else {
            return Vec::new();
        };
        let context = format!("scenario `{}`, run {}", run.name, run.run);
        let deadline = run.deadline;
        let mpi_comm = MpiComm::new(comm, deadline, run.perturbation, context.clone());
        let ran = catch_unwind(AssertUnwindSafe(|| -> Result<RankTrace, RankError> {
            let program = program.map_err(RankError::from)?;
            match run.spec.device {
                Device::Cpu => run_rank(program.as_ref(), &mpi_comm, run),
                // One GPU per process through NCCL, the unique id sent over this run's MPI
                // communicator; a process that cannot take part fails on every rank.
                #[cfg(feature = "nccl")]
                Device::Gpu => {
                    let nccl = crate::comm::nccl_mpi::nccl_comm_over_mpi(&mpi_comm)?;
                    run_rank(program.as_ref(), &nccl, run)
                }
                #[cfg(not(feature = "nccl"))]
                Device::Gpu => Err(format!(
                    "scenario `{}` runs on a GPU (`device: \"gpu\"`), but this detcheck was built \
                     without GPU support: build it with `--features mpi,nccl`",
                    run.name
                )
                .into()),
            }
        }));
        let outcome = match ran {
            Ok(Ok(trace)) => Outcome::Trace(trace),
            Ok(Err(error)) => match error.downcast::<CommError>() {
                Ok(comm_error) => Outcome::Comm(*comm_error),
                Err(other) => Outcome::Failed(other.to_string()),
            },
            Err(payload) => Outcome::Panicked(crate::comm::panic_message(payload.as_ref())),
        };
        mpi_comm.finish(outcome.is_failure());

        let rank = comm.rank();
        if rank != 0 {
            let bytes = serde_json::to_vec(&outcome).expect("outcomes serialize");
            comm.process_at_rank(0)
                .send_with_tag(&bytes[..], TAG_RESULT);
            return Vec::new();
        }
        let mut outcomes = vec![outcome];
        let until = Instant::now() + deadline;
        for source in 1..comm.size() {
            let mut backoff = Backoff::new();
            let bytes = loop {
                if let Some(found) = comm
                    .process_at_rank(source)
                    .immediate_matched_probe_with_tag(TAG_RESULT)
                {
                    break found.matched_receive_vec::<u8>().0;
                }
                if Instant::now() >= until {
                    abort_job(
                        &context,
                        &format!("rank {source} finished but sent no outcome within {deadline:?}"),
                    );
                }
                backoff.wait();
            };
            outcomes.push(serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                Outcome::Failed(format!("its outcome could not be read: {e}"))
            }));
        }
        outcomes
    }
}

/// Runs on the MPI job, from the leader.
pub(crate) struct MpiRunner<'j> {
    job: &'j MpiJob,
}

impl Runner for MpiRunner<'_> {
    fn run(&self, scenario: &LoadedScenario, request: &RunRequest) -> Result<Trace, RunError> {
        let command = Command::Run(Box::new(request.clone()));
        self.job.broadcast_command(&command);
        let program = scenario
            .program
            .ranks()
            .cloned()
            .ok_or_else(|| "a `command` scenario runs in its own processes".to_owned());
        let outcomes = self.job.run_part(program, request);
        assemble(outcomes).map_err(|source| request.failed(source))
    }

    fn is_mpi(&self) -> bool {
        true
    }

    fn max_world_size(&self) -> Option<usize> {
        Some(self.job.num_processes())
    }
}

/// Every rank's trace, or the most telling failure (the lowest rank among equals).
fn assemble(outcomes: Vec<Outcome>) -> Result<Trace, LaunchError> {
    let worst = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_failure())
        .min_by_key(|(rank, o)| (o.precedence(), *rank))
        .map(|(rank, _)| rank);
    if let Some(rank) = worst {
        let outcome = outcomes.into_iter().nth(rank).expect("the rank exists");
        return Err(match outcome {
            Outcome::Panicked(message) => LaunchError::RankPanicked { rank, message },
            Outcome::Failed(message) => LaunchError::RankFailed { rank, message },
            Outcome::Comm(e) => LaunchError::Collective(e),
            Outcome::Trace(_) => unreachable!("a failure was chosen"),
        });
    }
    let ranks = outcomes
        .into_iter()
        .map(|o| match o {
            Outcome::Trace(trace) => trace,
            _ => unreachable!("no failures"),
        })
        .collect();
    Ok(Trace { ranks })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{CollectiveId, CollectiveKind};
    use crate::value::DigestKind;

    fn trace(rank: u32) -> Outcome {
        Outcome::Trace(RankTrace {
            rank,
            records: Vec::new(),
            environment: None,
            digest: DigestKind::CURRENT,
        })
    }

    #[test]
    fn the_root_cause_is_reported_not_the_ranks_that_saw_it() {
        let seen = |rank, failed_rank| {
            Outcome::Comm(CommError::PeerFailed {
                rank,
                collective: CollectiveId {
                    kind: CollectiveKind::Allreduce,
                    call: 3,
                },
                failed_rank,
            })
        };
        let outcomes = vec![
            seen(0, 2),
            seen(1, 2),
            Outcome::Panicked("boom".into()),
            trace(3),
        ];
        match assemble(outcomes) {
            Err(LaunchError::RankPanicked { rank, message }) => {
                assert_eq!((rank, message.as_str()), (2, "boom"));
            }
            other => panic!("{other:?}"),
        }
        let timeout = Outcome::Comm(CommError::Timeout {
            rank: 1,
            collective: CollectiveId {
                kind: CollectiveKind::Barrier,
                call: 0,
            },
            waited: Duration::from_secs(1),
            missing: vec![0],
        });
        let err = assemble(vec![seen(0, 1), timeout]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rank 1 waited 1s in barrier #0 for rank(s) [0], which never arrived"
        );
        let ok = assemble(vec![trace(0), trace(1)]).unwrap();
        assert_eq!(ok.world_size(), 2);
    }

    #[test]
    fn comm_errors_survive_the_wire() {
        let e = CommError::Mismatch {
            rank: 1,
            collective: CollectiveId {
                kind: CollectiveKind::Broadcast,
                call: 4,
            },
            mine: "root 0, f32[3]".into(),
            other_rank: 0,
            theirs: "root 1, f32[3]".into(),
        };
        let json = serde_json::to_string(&Outcome::Comm(e.clone())).unwrap();
        let Outcome::Comm(back) = serde_json::from_str::<Outcome>(&json).unwrap() else {
            panic!("an outcome of another kind: {json}");
        };
        assert_eq!(back, e);
    }
}
