//! Collective communication between ranks.
//!
//! [`Communicator`] is what a rank program talks to: barrier, broadcast, allgather, allreduce and
//! reduce-scatter.
//! Backends implement it; the embedded one runs N ranks as threads of one process
//! ([`launch_threads`]). How an allreduce combines contributions is a [`ReductionMode`]
//! (see [`crate::value::ReductionMode`]).
//!
//! Invariant (a collective error crosses process boundaries as it is): `CommError` and
//! `CollectiveKind` are serde types; an MPI rank sends its error to the leader unchanged.
//!
//! Determinism: in every mode, every rank receives identical bits from every collective (each
//! element's result is computed once and shared); whether the bits repeat from run to run is the
//! mode's promise.
//!
//! Every collective waits at most a deadline; see [`CommError`] for how failures are named.
//! [`pin_settings_for`] lists the settings that pin other stacks' reductions (`detcheck env`).
//!
//! With the `nccl` feature: thread ranks sharing one GPU (`GpuThreadComm`), and NCCL ranks, one
//! process and one GPU each (`NcclComm`, made from an `NcclId`; under MPI by
//! `nccl_comm_over_mpi`, which sends the id over the MPI communicator). The GPU itself, its
//! kernels and CUDA's libraries are the layer below, [`crate::device`].

/// `true` when this build has MPI ranks (cargo feature `mpi`).
pub const MPI_SUPPORT: bool = cfg!(feature = "mpi");

/// The longest collective deadline: a week. A deadline is added to the clock, which a larger
/// duration could overflow (a panic); a longer one given to [`LaunchConfig`] or a run is cut to
/// this, and the CLI refuses a longer `--deadline`.
pub const MAX_DEADLINE: Duration = Duration::from_secs(7 * 24 * 3600);

#[cfg(feature = "nccl")]
mod gpu_threads;
mod launcher;
mod lint;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
#[cfg(all(feature = "nccl", feature = "mpi"))]
pub(crate) mod nccl_mpi;
mod pinning;
mod threads;
#[cfg(feature = "mpi")]
pub(crate) mod watcher;

#[cfg(feature = "nccl")]
pub use gpu_threads::GpuThreadComm;
pub use launcher::{Flavour, LauncherError, MpiLauncher, MPIRUN_VAR};
pub use lint::{differing_ranks, lint_environment, relevant_environment, Finding, FindingKind};
#[cfg(feature = "nccl")]
pub use nccl::{NcclComm, NcclId, NCCL_ID_BYTES};
pub use pinning::{pin_settings_for, PinSetting, MPI_STACKS};
pub(crate) use threads::panic_message;
pub use threads::{launch_threads, LaunchConfig, LaunchError, Perturbation, RankError, ThreadComm};

use crate::value::reduce::{ReduceOp, ReductionMode};
use crate::value::tensor::Tensor;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// The kind of a collective call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CollectiveKind {
    /// `barrier`.
    Barrier,
    /// `broadcast`.
    Broadcast,
    /// `allgather`.
    Allgather,
    /// `allreduce`.
    Allreduce,
    /// `reduce_scatter`.
    ReduceScatter,
}

impl CollectiveKind {
    /// The name reports use: `barrier`, `broadcast`, `allgather`, `allreduce`, `reduce_scatter`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::Barrier => "barrier",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Allgather => "allgather",
            CollectiveKind::Allreduce => "allreduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
        }
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A collective call as reports name it: its kind and its number on the calling rank, from 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveId {
    /// Which collective.
    pub kind: CollectiveKind,
    /// How many collectives the rank had called before this one.
    pub call: u64,
}

impl fmt::Display for CollectiveId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} #{}", self.kind, self.call)
    }
}

/// Why a collective failed. Every variant names the collective and the ranks involved.
/// Serializable: an MPI rank sends its error to the leader as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CommError {
    /// Some ranks did not arrive before the deadline.
    #[error("rank {rank} waited {waited:?} in {collective} for rank(s) {missing:?}, which never arrived")]
    Timeout {
        /// The waiting rank.
        rank: usize,
        /// The collective.
        collective: CollectiveId,
        /// The deadline that passed.
        waited: Duration,
        /// The ranks that had not arrived.
        missing: Vec<usize>,
    },
    /// Another rank failed, so this collective can never complete.
    #[error("rank {rank} left {collective} because rank {failed_rank} failed")]
    PeerFailed {
        /// The rank that was waiting.
        rank: usize,
        /// The collective.
        collective: CollectiveId,
        /// The rank that failed first.
        failed_rank: usize,
    },
    /// A rank finished its program without joining this collective.
    #[error("rank {exited_rank} finished without joining {collective}, which rank {rank} was waiting in")]
    PeerExited {
        /// The rank that was waiting.
        rank: usize,
        /// The collective.
        collective: CollectiveId,
        /// The rank that exited.
        exited_rank: usize,
    },
    /// Ranks called different collectives, or the same one with different arguments.
    #[error("rank {rank} called {collective} with {mine}, but rank {other_rank} called it with {theirs}")]
    Mismatch {
        /// The rank that noticed.
        rank: usize,
        /// The collective.
        collective: CollectiveId,
        /// What this rank called.
        mine: String,
        /// The other rank.
        other_rank: usize,
        /// What the other rank called.
        theirs: String,
    },
    /// An argument is invalid on its own (a root out of range, for instance).
    #[error("rank {rank} called {collective} with an invalid argument: {reason}")]
    InvalidArgument {
        /// The calling rank.
        rank: usize,
        /// The collective.
        collective: CollectiveId,
        /// What is wrong.
        reason: String,
    },
    /// The GPU failed during the collective (a copy, an allocation or a kernel).
    #[error("rank {rank}: the GPU failed in {collective}: {message}")]
    Device {
        /// The rank whose GPU call failed.
        rank: usize,
        /// The collective.
        collective: CollectiveId,
        /// What the driver said.
        message: String,
    },
}

/// Collective operations among the ranks of one world.
///
/// All ranks must call the same collectives in the same order with matching arguments; a backend
/// reports a mismatch as [`CommError::Mismatch`] where it can see one.
pub trait Communicator {
    /// This rank, from 0.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Returns once every rank has called it.
    ///
    /// # Errors
    /// A [`CommError`] naming the rank and collective when the world fails.
    fn barrier(&self) -> Result<(), CommError>;
    /// Replaces `tensor` on every rank with `root`'s.
    ///
    /// # Errors
    /// As [`Communicator::barrier`], and a mismatch when the tensors' dtypes or lengths differ.
    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), CommError>;
    /// Every rank's `tensor`, in rank order.
    ///
    /// # Errors
    /// As [`Communicator::broadcast`].
    fn allgather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, CommError>;
    /// The elementwise reduction of all ranks' tensors, of which this rank gets its chunk: the
    /// elements `len·r/n .. len·(r+1)/n` for rank `r` of `n` (contiguous, rank order), as a 1-D
    /// tensor. The chunk has the bits the same elements have after an allreduce in `mode`.
    ///
    /// # Errors
    /// As [`Communicator::allreduce`].
    fn reduce_scatter(
        &self,
        tensor: &Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<Tensor, CommError>;
    /// Replaces `tensor` on every rank with the elementwise reduction of all ranks' tensors.
    ///
    /// # Errors
    /// As [`Communicator::broadcast`], and a mismatch when ranks use different ops or modes.
    fn allreduce(
        &self,
        tensor: &mut Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<(), CommError>;

    /// The GPU this rank's collectives run on, if any (feature `nccl`): a rank program with
    /// GPU operators of its own runs them there, and on the CPU without one.
    #[cfg(feature = "nccl")]
    fn gpu(&self) -> Option<&std::sync::Arc<crate::device::Gpu>> {
        None
    }
}

/// The MPI library this build is linked with, as `MPI_Get_library_version` names it (its first
/// line, e.g. `Open MPI v4.1.4, package: ...`), for a trace's environment snapshot
/// (`TraceWriter::set_environment("mpi.library", ...)`). Callable before MPI is initialised.
/// `None` without the `mpi` feature, or when the library's answer is not text.
#[must_use]
pub fn mpi_library_version() -> Option<String> {
    #[cfg(feature = "mpi")]
    {
        // The library's buffer may hold its terminating NUL.
        ::mpi::environment::library_version()
            .ok()
            .and_then(|v| {
                v.lines().next().map(|l| {
                    l.trim_matches(|c: char| c == '\0' || c.is_whitespace())
                        .to_owned()
                })
            })
            .filter(|l| !l.is_empty())
    }
    #[cfg(not(feature = "mpi"))]
    {
        None
    }
}
