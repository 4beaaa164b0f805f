//! The `collective` kind: allreduce of per-rank random tensors, every step.
//!
//! Each step every rank draws `elements` normals from its `data` stream (with a per-rank scale,
//! so contributions differ in magnitude, as gradients do), records them, allreduces them in the
//! run's mode and records the result as replicated. It also broadcasts a small tensor from a root
//! that moves every step and allgathers a slice of each rank's input, so every collective is
//! exercised.
//!
//! Params: `elements` (default 4096), `dtype` (`f32` or `f64`, default `f32`), `op` (`sum` or
//! `max`, default `sum`), and `fault` to show how a failing rank is reported: `{"rank": r,
//! "step": s, "kind": k}` where `panic` panics, `error` returns an error, `exit` returns early
//! without joining the allreduce, `stall` never arrives (it sleeps for ten minutes), and `sigkill`
//! kills the rank's process with SIGKILL, as the out-of-memory killer would: under `mpirun` that is
//! one rank; on thread ranks it is the whole run, so use it under MPI only.

use super::size_param;
use crate::comm::RankError;
use crate::scenario::limits::{bytes_of, size};
use crate::scenario::{
    Capabilities, Footprint, ParamError, RankContext, RunPlan, Scenario, ScenarioSpec,
};
use crate::value::reduce::ReduceOp;
use crate::value::seed::Stream;
use crate::value::tensor::{DType, Tensor};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CollectiveParams {
    #[serde(default = "default_elements")]
    elements: usize,
    #[serde(default = "default_dtype")]
    dtype: DType,
    #[serde(default = "default_op")]
    op: ReduceOp,
    #[serde(default)]
    fault: Option<Fault>,
}

/// A planted rank failure, to show how the run reports it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fault {
    rank: usize,
    step: u64,
    kind: FaultKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FaultKind {
    Panic,
    Error,
    Exit,
    Stall,
    Sigkill,
}

fn default_elements() -> usize {
    4096
}

fn default_dtype() -> DType {
    DType::F32
}

fn default_op() -> ReduceOp {
    ReduceOp::Sum
}

pub(super) struct CollectiveScenario {
    params: CollectiveParams,
}

impl CollectiveScenario {
    pub(super) fn from_spec(spec: &ScenarioSpec) -> Result<Self, ParamError> {
        let params: CollectiveParams = spec.parse_params()?;
        size_param("params.elements", params.elements, 1)?;
        if !matches!(params.dtype, DType::F32 | DType::F64) {
            return Err(ParamError::new(
                "params.dtype",
                format!("must be f32 or f64, got {}", params.dtype),
            ));
        }
        if let Some(fault) = params.fault {
            if fault.rank >= spec.world_size {
                return Err(ParamError::new(
                    "params.fault.rank",
                    format!(
                        "{} is not a rank of a world of {}",
                        fault.rank, spec.world_size
                    ),
                ));
            }
        }
        Ok(CollectiveScenario { params })
    }
}

/// How many leading input values each rank contributes to the allgather.
const GATHERED: usize = 4;

impl Scenario for CollectiveScenario {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_replicated_records()
    }

    /// The f64 values, the tensor and the allreduce's buffers: 32 bytes an element, whatever
    /// the dtype; records: input, one allgather per rank, allreduce, broadcast.
    fn footprint(&self, world_size: usize, _plan: &RunPlan) -> Footprint {
        Footprint::default()
            .with_bytes(
                "params.elements",
                bytes_of(&[size(self.params.elements), 32]),
            )
            .with_records_per_step(size(world_size).saturating_add(3))
    }

    fn run_rank(&self, ctx: &mut RankContext<'_>) -> Result<(), RankError> {
        let n = self.params.elements;
        let scale = 1.0 + ctx.rank() as f64;
        for step in 0..ctx.steps() {
            let mut rng = ctx.stream(Stream::Data, step);
            let values: Vec<f64> = (0..n).map(|_| rng.normal_f64() * scale).collect();
            let head = Tensor::from_vec(values[..n.min(GATHERED)].to_vec());
            let mut tensor = match self.params.dtype {
                DType::F32 => Tensor::from_vec(values.iter().map(|&x| x as f32).collect()),
                _ => Tensor::from_vec(values),
            };
            ctx.record(step, "input", &tensor);
            let gathered = ctx.comm().allgather(&head)?;
            for (rank, part) in gathered.iter().enumerate() {
                ctx.record_replicated(step, &format!("allgather/{rank}"), part);
            }

            if let Some(fault) = self.params.fault {
                if fault.rank == ctx.rank() && fault.step == step {
                    match fault.kind {
                        FaultKind::Panic => panic!("planted panic at step {step}"),
                        FaultKind::Error => {
                            return Err(format!("planted error at step {step}").into())
                        }
                        FaultKind::Exit => return Ok(()),
                        FaultKind::Stall => std::thread::sleep(std::time::Duration::from_secs(600)),
                        FaultKind::Sigkill => {
                            // A real SIGKILL, from outside: no unwinding, no MPI_Finalize.
                            let _ = std::process::Command::new("kill")
                                .args(["-KILL", &std::process::id().to_string()])
                                .status();
                            std::thread::sleep(std::time::Duration::from_secs(600));
                        }
                    }
                }
            }
            ctx.allreduce(&mut tensor, self.params.op)?;
            ctx.record_replicated(step, &format!("allreduce/{}", self.params.op), &tensor);

            let root = (step % ctx.world_size() as u64) as usize;
            let mut token = Tensor::from_vec(vec![ctx.rank() as i64, step as i64]);
            ctx.comm().broadcast(&mut token, root)?;
            ctx.record_replicated(step, "broadcast", &token);
            ctx.comm().barrier()?;
        }
        Ok(())
    }
}
