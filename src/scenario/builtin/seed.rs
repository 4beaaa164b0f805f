//! The `seed` kind: parameter init, dropout masks and a data order, per rank per step.
//!
//! Every step each rank draws an init tensor (f32 normals, scaled as He init) and a bias (f64
//! uniforms) from its own `init` stream, a dropout mask (u8) from its `dropout` stream, and the
//! global sample order (i64) from the shared `data_order` stream, which every rank must agree on
//! (recorded as replicated). No collectives: this checks the seeding alone.
//!
//! Params: `elements` (default 256), `dropout` (default 0.1), `plant`: `os_entropy_init` mixes OS
//! entropy into the init seed, the fault `seed_all` exists to prevent.

use super::{os_entropy, size_param};
use crate::comm::RankError;
use crate::scenario::limits::{bytes_of, size};
use crate::scenario::{
    Capabilities, Footprint, ParamError, RankContext, RunPlan, Scenario, ScenarioSpec,
};
use crate::value::seed::{derive_stream, Stream};
use crate::value::tensor::Tensor;
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SeedPlant {
    /// Init reads OS entropy.
    OsEntropyInit,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SeedParams {
    #[serde(default = "default_elements")]
    elements: usize,
    #[serde(default = "default_dropout")]
    dropout: f64,
    #[serde(default)]
    plant: Option<SeedPlant>,
}

fn default_elements() -> usize {
    256
}

fn default_dropout() -> f64 {
    0.1
}

pub(super) struct SeedScenario {
    params: SeedParams,
}

impl SeedScenario {
    pub(super) fn from_spec(spec: &ScenarioSpec) -> Result<Self, ParamError> {
        let params: SeedParams = spec.parse_params()?;
        size_param("params.elements", params.elements, 1)?;
        if !(0.0..1.0).contains(&params.dropout) {
            return Err(ParamError::new(
                "params.dropout",
                format!("must be in [0, 1), got {}", params.dropout),
            ));
        }
        Ok(SeedScenario { params })
    }
}

impl Scenario for SeedScenario {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_replicated_records()
    }

    /// A step's tensors (f32 weight, f64 bias of n/8, u8 mask, i64 order: 14 bytes an
    /// element), twice for their recording; four records a step.
    fn footprint(&self, _world_size: usize, _plan: &RunPlan) -> Footprint {
        Footprint::default()
            .with_bytes(
                "params.elements",
                bytes_of(&[size(self.params.elements), 28]),
            )
            .with_records_per_step(4)
    }

    fn run_rank(&self, ctx: &mut RankContext<'_>) -> Result<(), RankError> {
        let n = self.params.elements;
        let init_seed = match self.params.plant {
            Some(SeedPlant::OsEntropyInit) => ctx.seed() ^ os_entropy(),
            None => ctx.seed(),
        };
        let scale = (2.0 / n as f64).sqrt() as f32;
        for step in 0..ctx.steps() {
            let mut init = derive_stream(init_seed, Stream::Init, ctx.rank() as u64, step);
            let weight: Vec<f32> = (0..n).map(|_| init.normal_f32() * scale).collect();
            let bias: Vec<f64> = (0..n.div_ceil(8))
                .map(|_| init.uniform_f64() - 0.5)
                .collect();
            ctx.record(step, "init/weight", &Tensor::from_vec(weight));
            ctx.record(step, "init/bias", &Tensor::from_vec(bias));

            let mut dropout = ctx.stream(Stream::Dropout, step);
            let keep = 1.0 - self.params.dropout;
            let mask: Vec<u8> = (0..n).map(|_| u8::from(dropout.bernoulli(keep))).collect();
            ctx.record(step, "dropout/mask", &Tensor::from_vec(mask));

            let mut order: Vec<i64> = (0..n as i64).collect();
            ctx.shared_stream(Stream::DataOrder, step)
                .shuffle(&mut order);
            ctx.record_replicated(step, "data/order", &Tensor::from_vec(order));
        }
        Ok(())
    }
}
