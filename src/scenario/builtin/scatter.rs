//! The `scatter` kind: a GPU operator, scatter-add, with an `atomicAdd` control and its
//! deterministic twin.
//!
//! Each step every rank draws `elements` f32 values (normals scaled by `2^-8` to `2^8`, so that
//! they span 17 binades and the order of the adds changes the rounding) and as many bucket
//! indices (uniform below `buckets`) from its `data` stream, on the host, so a GPU run and a CPU
//! run get the same inputs. It scatter-adds the values into `buckets` sums, records them as
//! `scatter/out`, allreduces them in the run's mode and records the result as replicated
//! (`scatter/allreduce`).
//!
//! Where the scatter runs: on the GPU when the run is on one (`device: "gpu"`, or the GPU side
//! of the `devices` check; feature `nccl`), otherwise on the CPU.
//! - `scatter: "segmented"` (default), the deterministic twin: the values are sorted by bucket on
//!   the host (`value::segments`, a stable counting sort), and each bucket is folded in increasing
//!   position: on the GPU by `detcheck_segmented_sum_f32`, one thread per bucket
//!   (`device/ops.rs`); on the CPU by `value::segmented_sum_f32`. Both give the same bits, so
//!   `repeat`, `replicas` and `devices` hold.
//! - `scatter: "atomic"`, the negative control: on the GPU, one `atomicAdd` per value
//!   (`detcheck_scatter_atomic_f32`), whose adds land in an order that changes from launch to
//!   launch, and with them the bits: `repeat` must catch it. The CPU has no concurrent adds to
//!   race: there `atomic` is the same serial fold as `segmented` and repeats, so the control only
//!   means something on a GPU (its scenario file says `device: "gpu"`).
//!
//! Params: `elements` (values per rank per step, default 65536), `buckets` (default 64), both at
//! least 1 and at most `u32::MAX` (the kernels' index type), and `scatter`.
//!
//! Determinism: the inputs come from the seeded streams only; the segmented sum's bits depend on
//! them alone; the allreduce is the run's mode.

use super::size_param;
use crate::comm::RankError;
use crate::scenario::limits::{bytes_of, size};
use crate::scenario::{
    Capabilities, Footprint, ParamError, RankContext, RunPlan, Scenario, ScenarioSpec,
};
use crate::value::reduce::ReduceOp;
use crate::value::scatter::segmented_sum_f32;
use crate::value::seed::Stream;
use crate::value::tensor::Tensor;
use serde::Deserialize;

/// How the scatter adds its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ScatterMode {
    /// Sorted by bucket, each bucket folded in increasing position: deterministic.
    Segmented,
    /// One `atomicAdd` per value on a GPU (the negative control); the serial fold on the CPU.
    Atomic,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScatterParams {
    #[serde(default = "default_elements")]
    elements: usize,
    #[serde(default = "default_buckets")]
    buckets: usize,
    #[serde(default = "default_scatter")]
    scatter: ScatterMode,
}

fn default_elements() -> usize {
    1 << 16
}

fn default_buckets() -> usize {
    64
}

fn default_scatter() -> ScatterMode {
    ScatterMode::Segmented
}

/// The values span `2^-SPREAD` to `2^SPREAD` times a normal: wide enough that a different order
/// of the adds rounds differently, narrow enough that no sum overflows or underflows.
const SPREAD: i32 = 8;

pub(super) struct ScatterScenario {
    params: ScatterParams,
}

impl ScatterScenario {
    pub(super) fn from_spec(spec: &ScenarioSpec) -> Result<Self, ParamError> {
        let params: ScatterParams = spec.parse_params()?;
        for (field, value) in [
            ("params.elements", params.elements),
            ("params.buckets", params.buckets),
        ] {
            size_param(field, value, 1)?;
            // Positions and buckets are the GPU kernels' `unsigned int`s.
            if u32::try_from(value).is_err() {
                return Err(ParamError::new(
                    field,
                    format!("must be at most {}, got {value}", u32::MAX),
                ));
            }
        }
        Ok(ScatterScenario { params })
    }

    /// This step's scatter of `values` by `indices`: on the rank's GPU when it has one.
    fn scatter(
        &self,
        ctx: &RankContext<'_>,
        values: Vec<f32>,
        indices: &[u32],
    ) -> Result<Vec<f32>, RankError> {
        #[cfg(feature = "nccl")]
        if let Some(gpu) = ctx.gpu() {
            return self.scatter_on_gpu(gpu, values, indices);
        }
        #[cfg(not(feature = "nccl"))]
        let _ = ctx;
        match self.params.scatter {
            // The CPU has no concurrent adds to race: `atomic` is the serial fold too.
            ScatterMode::Segmented | ScatterMode::Atomic => {
                Ok(segmented_sum_f32(&values, indices, self.params.buckets)?)
            }
        }
    }

    #[cfg(feature = "nccl")]
    fn scatter_on_gpu(
        &self,
        gpu: &crate::device::Gpu,
        values: Vec<f32>,
        indices: &[u32],
    ) -> Result<Vec<f32>, RankError> {
        use crate::value::scatter::{check_indices, segments};
        let buckets = self.params.buckets;
        let values = gpu.upload(&Tensor::from_vec(values))?;
        let out = match self.params.scatter {
            ScatterMode::Segmented => {
                let segments = gpu.upload_segments(&segments(indices, buckets)?)?;
                gpu.segmented_sum(&values, &segments)?
            }
            ScatterMode::Atomic => {
                check_indices(indices, buckets)?;
                let indices = gpu.upload_indices(indices, buckets)?;
                gpu.scatter_add_atomic(&values, &indices)?
            }
        };
        let out = gpu.download(&out)?;
        Ok(out
            .values::<f32>()
            .expect("a scatter's sums are f32")
            .to_vec())
    }
}

impl Scenario for ScatterScenario {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_replicated_records()
    }

    /// Per element: the value and its index (8 bytes), the upload's copy of the value and the
    /// sort's position (8); per bucket: the sums, the fold's flags, the offsets, the allreduce and
    /// the records' copies (32 bytes). Two records a step.
    fn footprint(&self, _world_size: usize, _plan: &RunPlan) -> Footprint {
        Footprint::default()
            .with_bytes(
                "params.elements",
                bytes_of(&[size(self.params.elements), 16]),
            )
            .with_bytes("params.buckets", bytes_of(&[size(self.params.buckets), 32]))
            .with_records_per_step(2)
    }

    fn run_rank(&self, ctx: &mut RankContext<'_>) -> Result<(), RankError> {
        let n = self.params.elements;
        let buckets = self.params.buckets as u64;
        for step in 0..ctx.steps() {
            let mut rng = ctx.stream(Stream::Data, step);
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    let binade = rng.below(2 * SPREAD as u64 + 1) as i32 - SPREAD;
                    rng.normal_f32() * 2f32.powi(binade)
                })
                .collect();
            // `from_spec` bounded `buckets` by u32::MAX.
            let indices: Vec<u32> = (0..n).map(|_| rng.below(buckets) as u32).collect();
            let mut sums = Tensor::from_vec(self.scatter(ctx, values, &indices)?);
            ctx.record(step, "scatter/out", &sums);
            ctx.allreduce(&mut sums, ReduceOp::Sum)?;
            ctx.record_replicated_owned(step, "scatter/allreduce", sums);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{launch_threads, LaunchConfig};
    use crate::record::RecordLevel;
    use crate::scenario::{CheckKind, KindRegistry, LoadedScenario};
    use crate::value::reduce::ReductionMode;
    use std::path::Path;
    use std::sync::Arc;

    const SPEC: &str = r#"{"kind": "scatter", "world_size": 2, "steps": 2, "seed": 11,
        "reduction": "rank_ordered", "deterministic_comm": true, "expect": "identical",
        "params": PARAMS}"#;

    fn load(params: &str) -> Result<LoadedScenario, String> {
        let spec = serde_json::from_str(&SPEC.replace("PARAMS", params)).unwrap();
        KindRegistry::builtin()
            .build(spec, Path::new("scatter.json"))
            .map_err(|e| e.to_string())
    }

    /// Every rank's records (step, name, md5, replicated) of a run on CPU thread ranks.
    fn run(params: &str) -> Vec<Vec<String>> {
        let spec: ScenarioSpec = serde_json::from_str(&SPEC.replace("PARAMS", params)).unwrap();
        let scenario = Arc::new(ScatterScenario::from_spec(&spec).unwrap());
        let traces = launch_threads(&LaunchConfig::new(spec.world_size), move |comm| {
            let mut ctx =
                RankContext::new(comm, RecordLevel::Digest, 11, 2, ReductionMode::RankOrdered);
            scenario.run_rank(&mut ctx)?;
            Ok(ctx.into_recorder().finish())
        })
        .unwrap();
        traces
            .iter()
            .map(|trace| {
                trace
                    .records
                    .iter()
                    .map(|r| format!("{} {} {} {}", r.step, r.name, r.md5, r.replicated))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_kind_repeats_on_the_cpu_and_its_replicas_agree() {
        let loaded = load(r#"{"elements": 5000, "buckets": 37}"#).unwrap();
        // Replicated records: `replicas` joins `repeat` by default.
        assert_eq!(loaded.checks, [CheckKind::Repeat, CheckKind::Replicas]);
        for scatter in ["segmented", "atomic"] {
            let params = format!(r#"{{"elements": 5000, "buckets": 37, "scatter": "{scatter}"}}"#);
            let first = run(&params);
            assert_eq!(first, run(&params), "{scatter} repeats");
            // Two steps of `scatter/out` and `scatter/allreduce` on each rank; the ranks' inputs
            // differ, their allreduced sums do not.
            assert_eq!(first[0].len(), 4);
            assert_ne!(first[0][0], first[1][0]);
            assert_eq!(first[0][1], first[1][1]);
            assert!(first[0][1].contains("scatter/allreduce") && first[0][1].ends_with("true"));
        }
        // On the CPU, `atomic` is the serial fold: the same bits as `segmented`.
        assert_eq!(
            run(r#"{"elements": 300, "buckets": 5, "scatter": "atomic"}"#),
            run(r#"{"elements": 300, "buckets": 5}"#)
        );
    }

    #[test]
    fn bad_params_name_their_field() {
        for (params, field) in [
            (r#"{"elements": 0}"#, "params.elements"),
            (r#"{"buckets": 0}"#, "params.buckets"),
            (r#"{"buckets": 4294967296}"#, "params.buckets"),
            (r#"{"scatter": "sorted"}"#, "params.scatter"),
            (r#"{"bucket": 3}"#, "params"),
        ] {
            let err = load(params).unwrap_err();
            assert!(err.contains(&format!("`{field}")), "{params}: {err}");
        }
    }
}
