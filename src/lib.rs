//! detcheck: a multi-rank determinism checker.
//!
//! A *scenario* is a deterministic rank program plus its configuration. detcheck launches its
//! ranks, records every tensor the program observes as a [`Record`](record::Record) (md5 of the
//! canonical bytes plus statistics), runs it again under a perturbation, and compares the
//! traces: the first [`Divergence`](compare::Divergence) is the earliest step, then record, then
//! rank, where two runs differ.
//!
//! The modules are the layers of the crate, from values up to checks; each may use only the
//! ones listed before it (`ARCHITECTURE.md`, enforced by `tests/tidy.rs`):
//! - [`value`]: tensors, digests, seeded streams, reduction arithmetic (reproducible sums);
//! - [`record`]: recording tensors as records, traces, overflow detection;
//! - [`file`](mod@file): trace files on disk (writer, readers, msprobe dumps), atomic writes;
//! - [`launch`]: the launch contract (the `DETCHECK_*` environment a launched program reads, and
//!   Slurm's), a launched rank's writer (`TraceWriter::from_env`), a re-run's capture;
//! - [`compare`]: the one comparison engine (checks and `detcheck compare`), a pure function of
//!   traces, with maps and curves;
//! - [`device`]: one GPU (feature `nccl`): CUDA's libraries, NVRTC, detcheck's kernels with the
//!   CPU's bits, GPU operators;
//! - [`comm`]: ranks and collectives with deadlines (threads; MPI with feature `mpi`; on GPUs,
//!   thread ranks sharing one and NCCL ranks, with feature `nccl`), the settings that pin other
//!   stacks' reductions;
//! - [`data`]: training data whose batches do not depend on the loader's workers or timing;
//! - [`checkpoint`]: one rank's state on disk, complete or absent;
//! - [`scenario`]: rank programs ([`Scenario`], [`RankContext`]) and their files;
//! - [`run`]: one run of a scenario (the rank body, the runners), `run --dump`;
//! - [`check`]: the checks (`repeat`, `replicas`, `backends`, `world_sizes`, `workers`,
//!   `restart`), their report, and the [`Session`] that runs them on threads or under MPI;
//! - [`cli`]: the `detcheck` command line ([`cli::run`]), which the cargo binary and the Python
//!   wheel both run; it uses the others through the public API only.
//!
//! The root re-exports what a user's kind and a test harness need. Everything else is reached
//! through its module.
//!
//! Determinism: each module's doc states the invariants it keeps (`Invariant (...)`);
//! `ARCHITECTURE.md` lists them and where each is.
//!
//! Invariant (the library never depends on the harness): the harness (`harness/`) adapts library
//! checks to libtest-mimic; the CLI uses the library directly. Launching thread ranks and running
//! checks live in the library so the CLI, in the same package, can use them without a dependency
//! cycle.
//!
//! Invariant (no unsafe code) outside `device/cuda.rs` (dlopen probes, NVRTC), `device/gpu.rs` and
//! `device/ops.rs` (kernel launches) and `comm/nccl.rs` (NCCL's C API): this file forbids it
//! without the `nccl` feature and denies it with it; those modules allow it. rsmpi's safe API is
//! enough (scoped requests; a request is completed before its scope ends, or the job is aborted).
//! CUDA's is not (a `dlopen` probe, NVRTC's cubin, kernel launches, NCCL's C API on raw device
//! pointers), so its FFI stays in those modules, each `unsafe` block with why it holds; a kernel
//! launch sits behind a safe method that checks every bound its kernel relies on. The Python
//! package has one such module, `python/src/buffer.rs`: the buffer protocol, and a torch
//! copy-on-write snapshot's memory lent to the writer's thread (`Lent`).
#![cfg_attr(not(feature = "nccl"), forbid(unsafe_code))]
#![cfg_attr(feature = "nccl", deny(unsafe_code))]

// The command line (`cli`) names the library as a user's program does, `detcheck::...`.
extern crate self as detcheck;

pub mod check;
pub mod checkpoint;
pub mod cli;
pub mod comm;
pub mod compare;
pub mod data;
pub mod device;
pub mod diagnose;
pub mod file;
pub mod launch;
mod picture;
pub mod record;
pub mod run;
pub mod scenario;
pub mod value;

pub use check::{run_checks, CheckOptions, Session};
pub use comm::RankError;
pub use scenario::{
    discover_scenarios, Capabilities, KindRegistry, LoadedScenario, ParamError, RankContext,
    Scenario, ScenarioSpec,
};
pub use value::{ReduceOp, Stream, Tensor};
