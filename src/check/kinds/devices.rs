//! The `devices` check (feature `nccl`): run 1 with its collectives (and the kind's GPU
//! operators) on a GPU, thread ranks sharing it, against the same run on CPU thread ranks.
//!
//! Main type: [`Devices`], its unit; [`NO_GPU`], why it is n/a where this process has no GPU it
//! can use. A `gpu` scenario's run 1 is the GPU's side and its one run of its own is on CPU thread
//! ranks; a CPU scenario's own run is on the GPU.
//!
//! Determinism: both sides are run 1 (its perturbation) of one schedule, which the GPU kernels
//! compute with the CPU's arithmetic (`device/kernels.rs`), so they are expected identical bit
//! for bit. Limits: it runs on thread ranks only; under MPI it is n/a, with the reason (there
//! `backends` compares a `gpu` scenario's NCCL ranks with CPU thread ranks).

use super::{curves_of, CheckUnit, Compared, Drill, Pair, Runs};
use crate::compare::{compare_traces, Divergence, TraceView};
use crate::run::gpu::gpu_runner_dyn;
use crate::run::{RunError, ThreadRunner};
use crate::scenario::{Device, RunPlan};

/// Why `devices` is skipped: this process has no GPU it can use.
pub(crate) const NO_GPU: &str =
    "needs a GPU: build with --features nccl, on a machine with a CUDA driver, NVRTC and a \
     device (`detcheck check` of a `device: \"gpu\"` scenario names what is missing)";

/// Why `devices` is skipped under MPI (and where it is listed twice).
const NOT_UNDER_MPI: &str = "runs on thread ranks, not under MPI (there `backends` compares a \
                             `gpu` scenario's NCCL ranks with CPU thread ranks)";

/// The `devices` check's unit.
pub(super) struct Devices;

impl CheckUnit for Devices {
    fn sides(&self) -> (&'static str, &'static str) {
        ("gpu", "cpu")
    }

    /// Run 1 on the GPU against run 1 on CPU thread ranks; skipped without a GPU (a `gpu`
    /// scenario has one: its runner is the GPU's).
    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        if runs.runner.is_mpi() {
            return Ok(Compared::not_applicable(NOT_UNDER_MPI));
        }
        let Ok(gpu) = gpu_runner_dyn() else {
            return Ok(Compared::not_applicable(NO_GPU));
        };
        let (on_gpu, on_cpu) = if runs.scenario.spec.device == Device::Gpu {
            (runs.first.clone(), runs.run(&ThreadRunner, 1)?)
        } else {
            (runs.run(gpu, 1)?, runs.first.clone())
        };
        let comparison = compare_traces(&on_gpu, &on_cpu, TraceView::All);
        Ok(Compared {
            differing: comparison.first.as_ref().map(|_| (0, 1, on_gpu.clone())),
            note: Some("gpu against cpu thread ranks".to_owned()),
            curves: curves_of(&on_gpu, &on_cpu, self.sides()),
            comparison,
            skipped: None,
        })
    }

    /// n/a: the first listing took the runs' result (as under MPI, with that reason).
    fn listed_again(&self, _earlier: &Compared) -> Compared {
        Compared::not_applicable(NOT_UNDER_MPI)
    }

    fn drill_down<'a>(
        &self,
        runs: &Runs<'a>,
        d: &Divergence,
        pair: Option<&'a Pair>,
    ) -> Option<Drill<'a>> {
        let (left_label, right_label) = self.sides();
        let (runner, scenario) = (runs.runner, runs.scenario);
        pair.map(|(_, _, base)| {
            let gpu = gpu_runner_dyn().unwrap_or(runner);
            Drill::Pair {
                left: runs.side(gpu, scenario, 1, RunPlan::default(), d.rank, left_label),
                right: runs.side(
                    &ThreadRunner,
                    scenario,
                    1,
                    RunPlan::default(),
                    d.rank,
                    right_label,
                ),
                left_trace: base,
            }
        })
    }
}
