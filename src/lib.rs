//! detcheck: a multi-rank determinism checker.
//!
//! A *scenario* is a deterministic rank program plus its configuration. detcheck launches its
//! ranks, records every tensor the program observes as a [`Record`] (md5 of the canonical bytes
//! plus statistics), runs it again under a perturbation, and compares the traces: the first
//! [`Divergence`] is the earliest step, then record, then rank, where two runs differ.
//!
//! The parts, each a module with one job:
//! - [`seed`](derive_stream): every random stream from (seed, stream, rank, step);
//! - [`Tensor`], [`Md5Digest`], [`Stats`]: data and its digest;
//! - [`Communicator`] and [`launch_threads`]: ranks as threads, collectives with deadlines;
//! - [`ReductionMode`]: the order an allreduce adds in;
//! - [`Recorder`], [`Trace`], [`compare_runs`], [`compare_replicas`]: records and comparison;
//! - [`Scenario`], [`ScenarioSpec`], [`KindRegistry`]: rank programs and their files;
//! - [`run_checks`]: the checks (`repeat`, `replicas`) and their report;
//! - [`Dataset`], [`DistributedSampler`], [`Augmenter`], [`DataLoader`]: training data whose
//!   batches do not depend on the loader's workers or timing.
//!
//! Determinism: see `ARCHITECTURE.md` for the invariants each part keeps.
#![forbid(unsafe_code)]

/// `true` when this build has MPI ranks (cargo feature `mpi`).
pub const MPI_SUPPORT: bool = cfg!(feature = "mpi");

mod check;
mod checkpoint;
mod comm;
mod compare;
mod curves;
mod data;
mod digest;
mod dump;
mod overflow;
mod picture;
mod pinning;
mod reduce;
mod reprosum;
mod scenario;
mod seed;
mod session;
mod tensor;
mod tensorfile;
mod trace;

pub use check::{
    run_checks, run_once, CheckKind, CheckOptions, CheckOutcome, Expectation, RunError,
    ScenarioReport,
};
pub use checkpoint::{
    complete_steps, load_checkpoint, resumable_step, save_checkpoint, CheckpointError,
    CheckpointIdentity, RankCheckpoint, CHECKPOINT_VERSION,
};
pub use comm::{
    launch_threads, CollectiveId, CommError, Communicator, LaunchConfig, LaunchError, Perturbation,
    RankError, ThreadComm,
};
pub use compare::{
    compare_replicas, compare_runs, compare_world_sizes, CompareError, Comparison, Divergence,
    DivergenceKind,
};
pub use curves::{
    compare_curves, load_curve, write_curve_plots, Curve, CurveComparison, CurveError, Tolerance,
};
pub use data::{
    AugmentRng, Augmentation, Augmenter, Batch, BatchSampler, DataError, DataLoader, Dataset,
    Delivery, DistributedSampler, LoaderConfig, LoaderJitter, LoaderPosition, Sample,
    SyntheticImages, SyntheticVectors,
};
pub use digest::{ExactF64, Md5Digest, Stats};
pub use dump::{
    compare_dumps, dump_scenario, CompareOptions, Difference, DumpComparison, DumpDivergence,
    DumpError, DumpMode, DumpRunError, RecordSummary, TensorMetrics, TraceWriter,
};
pub use overflow::{first_overflow, Overflow, OverflowKind, FP16_MAX};
pub use picture::{DivergenceMap, MapCell};
pub use pinning::{pin_settings_for, PinSetting, MPI_STACKS, PIN_SETTINGS};
pub use reduce::{ReduceOp, ReductionMode};
pub use reprosum::{
    reproducible_sum_columns_f32, reproducible_sum_f32, reproducible_sum_f64, ColumnsError,
};
pub use scenario::{
    discover_scenarios, KindFactory, KindRegistry, LoadedScenario, ParamError, RankContext,
    RunPlan, Scenario, ScenarioError, ScenarioSpec,
};
pub use seed::{derive_stream, RankRng, Stream};
#[cfg(feature = "mpi")]
pub use session::run_on_mpi_world;
pub use session::{launcher_rank, Session, SessionError};
pub use tensor::{DType, Element, ShapeError, Tensor, TensorData};
pub use trace::{RankTrace, Record, RecordLevel, Recorder, Trace};
