//! The GPU runner: a scenario's thread ranks with their collectives on one GPU (`device: "gpu"`,
//! the `devices` check).
//!
//! [`gpu_runner`] opens GPU 0 once per process and returns the runner, or why there is none: a
//! build without the `nccl` feature, a missing CUDA library (named, with the names tried and how
//! to get it), no device. The runner launches thread ranks as [`ThreadRunner`] does, each rank
//! body talking to a [`GpuThreadComm`](crate::comm::GpuThreadComm) over its thread
//! communicator, so the rank body, the rounds and the failure handling are the thread ranks'.
//!
//! Determinism: as thread ranks; the kernels give the CPU's bits in the deterministic modes
//! (checked by the `devices` check and the GPU self-test).
//!
//! Limits: one GPU (ordinal 0) for every thread rank. Under `mpirun` a `gpu` scenario's ranks
//! are MPI processes with NCCL, one GPU each (`comm/nccl.rs`), not this runner.

#[cfg(feature = "nccl")]
use super::RunRequest;
#[cfg(feature = "nccl")]
use super::{launch_thread_ranks, run_rank};
use super::{RunError, Runner};
#[cfg(feature = "nccl")]
use crate::comm::{GpuThreadComm, LaunchError};
#[cfg(feature = "nccl")]
use crate::device::Gpu;
#[cfg(feature = "nccl")]
use crate::record::Trace;
use crate::scenario::LoadedScenario;
#[cfg(feature = "nccl")]
use std::sync::{Arc, OnceLock};

/// Thread ranks whose collectives run on one GPU.
#[cfg(feature = "nccl")]
pub(crate) struct GpuRunner {
    gpu: Arc<Gpu>,
}

#[cfg(feature = "nccl")]
impl GpuRunner {
    /// Launches the request's ranks as threads with their collectives on the GPU.
    pub(crate) fn launch(
        &self,
        scenario: &LoadedScenario,
        request: &RunRequest,
    ) -> Result<Trace, LaunchError> {
        let gpu = Arc::clone(&self.gpu);
        launch_thread_ranks(scenario, request, move |program, comm, request| {
            run_rank(
                program,
                &GpuThreadComm::new(comm, Arc::clone(&gpu)),
                request,
            )
        })
    }
}

#[cfg(feature = "nccl")]
impl Runner for GpuRunner {
    fn run(&self, scenario: &LoadedScenario, request: &RunRequest) -> Result<Trace, RunError> {
        self.launch(scenario, request)
            .map_err(|source| request.failed(source))
    }

    fn is_mpi(&self) -> bool {
        false
    }
}

/// The GPU runner, or why this process has none (the reason names what is missing).
#[cfg(feature = "nccl")]
pub(crate) fn gpu_runner() -> Result<&'static GpuRunner, String> {
    static RUNNER: OnceLock<Result<GpuRunner, String>> = OnceLock::new();
    RUNNER
        .get_or_init(|| {
            Gpu::open(0)
                .map(|gpu| GpuRunner { gpu })
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The GPU runner as a [`Runner`], or why there is none.
pub(crate) fn gpu_runner_dyn() -> Result<&'static dyn Runner, String> {
    #[cfg(feature = "nccl")]
    {
        gpu_runner().map(|r| r as &dyn Runner)
    }
    #[cfg(not(feature = "nccl"))]
    {
        Err("this detcheck was built without GPU support: build it with `--features nccl`".into())
    }
}

/// Whether this process could run NCCL ranks (under `mpirun`): the feature, the driver with a
/// device, NVRTC and NCCL; or why not. The leader asks before it launches a `gpu` scenario, so a
/// machine without them is exit 4 at once rather than a failed run.
pub(crate) fn nccl_usable() -> Result<(), String> {
    // Asked before every run of a `gpu` scenario under MPI: probed once per process (the probes
    // open libraries and initialise the driver).
    static USABLE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    USABLE
        .get_or_init(|| {
            #[cfg(feature = "nccl")]
            {
                use crate::device::{count_devices, locate_library, CudaLibrary};
                count_devices().map_err(|e| e.to_string())?;
                for library in [CudaLibrary::Nvrtc, CudaLibrary::Nccl] {
                    locate_library(library).map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            #[cfg(not(feature = "nccl"))]
            {
                Err(
                    "this detcheck was built without GPU support: build it with `--features \
                     mpi,nccl`"
                        .into(),
                )
            }
        })
        .clone()
}

/// [`RunError::NoDevice`] for `scenario`, which needs the GPU that `reason` says is missing.
pub(crate) fn no_device(scenario: &LoadedScenario, reason: String) -> RunError {
    RunError::NoDevice {
        scenario: scenario.name.clone(),
        reason,
    }
}
