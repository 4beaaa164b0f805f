//! The MPI side of a [`Session`](super::Session): the leader/follower protocol and MPI runs.
//!
//! [`MpiJob`] owns MPI (initialized on start, finalized when dropped). The leader sends each
//! follower a *command* (JSON, tag [`TAG_COMMAND`], on `MPI_COMM_WORLD`): run a scenario once, or
//! stop with an exit code. For a run, every process joins the split of the world into the run's
//! ranks (the first `world_size` processes; the sub-communicator is cached per size), the ranks run
//! the program on [`MpiComm`] with a panic caught, end with [`MpiComm::finish`] (which drains the
//! communicator), and send their outcome (trace or failure, JSON, tag [`TAG_RESULT`]) to the
//! leader. The leader turns failures into the same [`LaunchError`]s the thread backend reports.
//!
//! Determinism: runs happen in the leader's order; a follower never chooses. Outcomes are
//! assembled by rank, whatever order they arrive in.

use crate::check::{run_checks_on, CheckOptions, RunError, Runner, ScenarioReport};
use crate::comm::mpi::{abort_job, Backoff, MpiComm};
use crate::comm::{CollectiveId, CommError, LaunchError, Perturbation, RankError};
use crate::scenario::{KindRegistry, LoadedScenario, RankContext, RunPlan, Scenario, ScenarioSpec};
use crate::session::SessionError;
use crate::trace::{RankTrace, RecordLevel, Trace};
use mpi::environment::Universe;
use mpi::point_to_point::MatchedReceiveVec;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, Destination as _, Source as _};
use mpi::Threading;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Leader to followers, on the world communicator.
const TAG_COMMAND: i32 = 18;
/// A rank's outcome to the leader, on the run's communicator.
const TAG_RESULT: i32 = 19;

/// What the leader tells a follower to do next.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
enum Command {
    Run(Box<RunCommand>),
    Stop { exit_code: u8 },
}

#[derive(Debug, Serialize, Deserialize)]
struct RunCommand {
    name: String,
    spec: ScenarioSpec,
    origin: PathBuf,
    run: usize,
    deadline_ns: u64,
    record_level: RecordLevel,
    perturbation: Option<(u64, usize, u64)>,
    plan: RunPlan,
}

impl RunCommand {
    fn deadline(&self) -> Duration {
        Duration::from_nanos(self.deadline_ns)
    }

    fn perturbation(&self) -> Option<Perturbation> {
        self.perturbation
            .map(|(seed, rotation, max_delay_ns)| Perturbation {
                seed,
                rotation,
                max_delay: Duration::from_nanos(max_delay_ns),
            })
    }
}

/// How one rank's part of a run ended.
#[derive(Debug, Serialize, Deserialize)]
enum Outcome {
    Trace(RankTrace),
    Panicked(String),
    Failed(String),
    Comm(WireCommError),
}

/// [`CommError`] as it travels: the collective's kind as a string.
#[derive(Debug, Serialize, Deserialize)]
enum WireCommError {
    Timeout {
        rank: usize,
        kind: String,
        call: u64,
        waited_ns: u64,
        missing: Vec<usize>,
    },
    PeerFailed {
        rank: usize,
        kind: String,
        call: u64,
        failed_rank: usize,
    },
    PeerExited {
        rank: usize,
        kind: String,
        call: u64,
        exited_rank: usize,
    },
    Mismatch {
        rank: usize,
        kind: String,
        call: u64,
        mine: String,
        other_rank: usize,
        theirs: String,
    },
    InvalidArgument {
        rank: usize,
        kind: String,
        call: u64,
        reason: String,
    },
}

fn static_kind(kind: &str) -> &'static str {
    match kind {
        "barrier" => "barrier",
        "broadcast" => "broadcast",
        "allgather" => "allgather",
        "allreduce" => "allreduce",
        "reduce_scatter" => "reduce_scatter",
        _ => "collective",
    }
}

impl From<CommError> for WireCommError {
    fn from(e: CommError) -> Self {
        match e {
            CommError::Timeout {
                rank,
                collective,
                waited,
                missing,
            } => WireCommError::Timeout {
                rank,
                kind: collective.kind.to_owned(),
                call: collective.call,
                waited_ns: waited.as_nanos() as u64,
                missing,
            },
            CommError::PeerFailed {
                rank,
                collective,
                failed_rank,
            } => WireCommError::PeerFailed {
                rank,
                kind: collective.kind.to_owned(),
                call: collective.call,
                failed_rank,
            },
            CommError::PeerExited {
                rank,
                collective,
                exited_rank,
            } => WireCommError::PeerExited {
                rank,
                kind: collective.kind.to_owned(),
                call: collective.call,
                exited_rank,
            },
            CommError::Mismatch {
                rank,
                collective,
                mine,
                other_rank,
                theirs,
            } => WireCommError::Mismatch {
                rank,
                kind: collective.kind.to_owned(),
                call: collective.call,
                mine,
                other_rank,
                theirs,
            },
            CommError::InvalidArgument {
                rank,
                collective,
                reason,
            } => WireCommError::InvalidArgument {
                rank,
                kind: collective.kind.to_owned(),
                call: collective.call,
                reason,
            },
        }
    }
}

impl From<WireCommError> for CommError {
    fn from(e: WireCommError) -> Self {
        let id = |kind: &str, call| CollectiveId {
            kind: static_kind(kind),
            call,
        };
        match e {
            WireCommError::Timeout {
                rank,
                kind,
                call,
                waited_ns,
                missing,
            } => CommError::Timeout {
                rank,
                collective: id(&kind, call),
                waited: Duration::from_nanos(waited_ns),
                missing,
            },
            WireCommError::PeerFailed {
                rank,
                kind,
                call,
                failed_rank,
            } => CommError::PeerFailed {
                rank,
                collective: id(&kind, call),
                failed_rank,
            },
            WireCommError::PeerExited {
                rank,
                kind,
                call,
                exited_rank,
            } => CommError::PeerExited {
                rank,
                collective: id(&kind, call),
                exited_rank,
            },
            WireCommError::Mismatch {
                rank,
                kind,
                call,
                mine,
                other_rank,
                theirs,
            } => CommError::Mismatch {
                rank,
                collective: id(&kind, call),
                mine,
                other_rank,
                theirs,
            },
            WireCommError::InvalidArgument {
                rank,
                kind,
                call,
                reason,
            } => CommError::InvalidArgument {
                rank,
                collective: id(&kind, call),
                reason,
            },
        }
    }
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
            Outcome::Comm(WireCommError::PeerExited { .. }) => 2,
            Outcome::Comm(WireCommError::PeerFailed { .. }) => 3,
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
    /// Dropped last: finalizes MPI after every communicator is freed.
    _universe: Universe,
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
    pub(crate) fn start() -> Result<Self, SessionError> {
        let (universe, _) =
            mpi::initialize_with_threading(Threading::Funneled).ok_or(SessionError::MpiInit)?;
        let library = mpi::environment::library_version()
            .unwrap_or_default()
            .split([',', '\n'])
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        Ok(MpiJob {
            world: universe.world(),
            runs: RefCell::new(BTreeMap::new()),
            library,
            _universe: universe,
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

    pub(crate) fn run_checks(
        &self,
        scenario: &LoadedScenario,
        options: &CheckOptions,
    ) -> Result<ScenarioReport, RunError> {
        if scenario.spec.world_size > self.num_processes() {
            return Err(RunError::WorldTooLarge {
                scenario: scenario.name.clone(),
                needed: scenario.spec.world_size,
                available: self.num_processes(),
            });
        }
        run_checks_on(&MpiRunner { job: self }, scenario, options)
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
                        .build(run.spec.clone(), &run.origin)
                        .map(|loaded| loaded.program)
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
        run: &RunCommand,
    ) -> Vec<Outcome> {
        let comm = self.run_comm(run.spec.world_size);
        let Some(comm) = comm.as_ref() else {
            return Vec::new();
        };
        let context = format!("scenario `{}`, run {}", run.name, run.run);
        let deadline = run.deadline();
        let mpi_comm = MpiComm::new(comm, deadline, run.perturbation(), context.clone());
        let ran = catch_unwind(AssertUnwindSafe(|| -> Result<RankTrace, RankError> {
            let program = program.map_err(RankError::from)?;
            let mut ctx = RankContext::for_run(
                &mpi_comm,
                run.record_level,
                &run.spec,
                &run.plan,
                run.perturbation(),
            );
            program.run_rank(&mut ctx)?;
            Ok(ctx.into_recorder().finish())
        }));
        let outcome = match ran {
            Ok(Ok(trace)) => Outcome::Trace(trace),
            Ok(Err(error)) => match error.downcast::<CommError>() {
                Ok(comm_error) => Outcome::Comm((*comm_error).into()),
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
struct MpiRunner<'j> {
    job: &'j MpiJob,
}

impl Runner for MpiRunner<'_> {
    fn run(
        &self,
        scenario: &LoadedScenario,
        options: &CheckOptions,
        perturbation: Option<Perturbation>,
        run: usize,
        plan: &RunPlan,
    ) -> Result<Trace, RunError> {
        let command = RunCommand {
            name: scenario.name.clone(),
            spec: scenario.spec.clone(),
            origin: scenario.origin.clone(),
            run,
            deadline_ns: options.deadline.as_nanos() as u64,
            record_level: options.record_level,
            perturbation: perturbation.map(|p| (p.seed, p.rotation, p.max_delay.as_nanos() as u64)),
            plan: plan.clone(),
        };
        let command = Command::Run(Box::new(command));
        self.job.broadcast_command(&command);
        let Command::Run(run_command) = &command else {
            unreachable!("built as a run")
        };
        let outcomes = self.job.run_part(Ok(scenario.program.clone()), run_command);
        assemble(outcomes).map_err(|source| RunError::Launch {
            scenario: scenario.name.clone(),
            run,
            source,
        })
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
            Outcome::Comm(e) => LaunchError::Collective(e.into()),
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

    fn trace(rank: u32) -> Outcome {
        Outcome::Trace(RankTrace {
            rank,
            records: Vec::new(),
        })
    }

    #[test]
    fn the_root_cause_is_reported_not_the_ranks_that_saw_it() {
        let seen = |rank, failed_rank| {
            Outcome::Comm(WireCommError::PeerFailed {
                rank,
                kind: "allreduce".into(),
                call: 3,
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
        let timeout = Outcome::Comm(WireCommError::Timeout {
            rank: 1,
            kind: "barrier".into(),
            call: 0,
            waited_ns: 1_000_000_000,
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
                kind: "broadcast",
                call: 4,
            },
            mine: "root 0, f32[3]".into(),
            other_rank: 0,
            theirs: "root 1, f32[3]".into(),
        };
        let wire: WireCommError = e.clone().into();
        let json = serde_json::to_string(&wire).unwrap();
        let back: CommError = serde_json::from_str::<WireCommError>(&json).unwrap().into();
        assert_eq!(back, e);
    }
}
