//! The `train` kind: a small MLP trained data-parallel.
//!
//! The model is `input_dim → hidden (ReLU, dropout) → classes` with softmax cross-entropy, in f32.
//! The dataset is synthetic ([`SyntheticVectors`]): sample i's features are normals from the
//! shared `data` stream at coordinate i, its label the argmax of a fixed random teacher. Each
//! rank loads its batches with a [`DataLoader`] (`workers` threads, per-sample augmentation) over
//! a [`DistributedSampler`]: each epoch is shuffled from (seed, epoch) and rank r takes every
//! `world_size`-th sample, so global batch b is the same set of samples at any world size. Each
//! rank runs forward (with a dropout mask
//! drawn from the `dropout` stream at (sample, step), so a sample's mask does not depend on which
//! rank runs it) and backward, sums its samples' gradients in batch order, allreduces gradients and
//! loss in the buckets of `params.bucket` (one flat buffer by default), divides by the global batch and applies the optimizer (SGD with momentum,
//! or Adam).
//!
//! In the `reproducible` mode the rank keeps each sample's factors of its gradient (a layer's
//! output deltas and inputs, and the loss: a few hundred values, not the 19 k of a gradient) and
//! sums the outer products over all ranks on a grid fixed from their bounds
//! ([`outer`](crate::value::reprosum::outer)): one `max` allreduce of the factors' magnitudes,
//! then every exact product `delta · input` is rounded to its element's grid and added in `i64`
//! (an integer matrix product, blocked for the cache), the integers are summed over ranks exactly
//! and rounded to f32 once. The bits of loss, gradients and parameters are then the same at any
//! world size (the `world_sizes` check), and each element is within a few grid steps of the exact
//! sum (`2^−50` of its bound per sample): more accurate than the f32 sum of `ring`. This replaced,
//! on 2026-11-22, per-sample gradients summed with [`RankContext::reproducible_sum`] (products
//! rounded to f32 first, a grid per element from the largest term): the bits of that mode's
//! `train` runs changed then. With `"zero": true` the optimizer is sharded
//! as in ZeRO: gradients are reduce-scattered, each rank updates its chunk of the parameters (and
//! keeps only that chunk's optimizer state), and the chunks are allgathered.
//!
//! Exact restart: the checkpoint holds the parameters, the optimizer state, the loader's
//! position and, with `"dropout_rng": "sequential"` (masks drawn one after another from one
//! generator per rank, as a framework's global generator), that generator's position; the
//! planted `resume_without_rng` forgets it.
//!
//! Records per step: `local_grad/*` (before the allreduce, per rank), then `loss`, `grad/*` and
//! `param/*` (replicated: every rank must hold the same bits); with `zero`, `grad_shard` (this
//! rank's chunk of the reduced gradient) replaces `grad/*`. Step 0 starts with `init/*`.
//!
//! Determinism: `exp`, `ln` and `pow` come from `libm`; every sum runs in a fixed order. Planted
//! faults (`params.plant`): `hashmap_grad_order` sums per-sample gradients in `HashMap` iteration
//! order (random per map); `rank_seeded_init` initialises each rank from its own stream without
//! a broadcast, so replicas differ.
//!
//! Limits: outside `reproducible`, the kernels are plain per-sample loops and a rank's shard
//! depends on the world size, so its local sum (and so the bits) do too. In `reproducible`,
//! `local_grad/*` is the rank's own samples on the global grid, rounded once.

use super::dataloader::{
    loader_bytes, loader_config, next_batch, open_loader, param_error, restored_position,
    store_position,
};
use super::{largest_field, size_param, workers_param};
use crate::checkpoint::{CheckpointError, RankCheckpoint};
use crate::comm::RankError;
use crate::data::dataset::dot;
use crate::data::{
    AugmentRng, Augmentation, Augmenter, Batch, BatchSampler, Delivery, DistributedSampler,
    LoaderPosition, SyntheticVectors,
};
use crate::scenario::limits::{bytes_of, size};
use crate::scenario::{
    BucketLayout, Capabilities, Footprint, ParamError, RankContext, RunPlan, Scenario, ScenarioSpec,
};
use crate::value::reduce::{chunk_range, ReduceOp, ReductionMode};
use crate::value::reprosum::{distributed, outer};
use crate::value::seed::{derive_stream, RankRng, Stream};
use crate::value::tensor::{Tensor, TensorData};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum TrainPlant {
    /// Per-sample gradients summed in `HashMap` iteration order.
    HashmapGradOrder,
    /// Each rank initialises from its own stream: replicas differ from step 0.
    RankSeededInit,
    /// A resume that restores parameters and optimizer state but restarts the dropout
    /// generator from its initial position (needs `dropout_rng: sequential`).
    ResumeWithoutRng,
}

/// Where dropout masks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum DropoutRng {
    /// Sample i's mask at step s from the stream (seed, dropout, i, s): no state to checkpoint,
    /// and the same mask on any rank (needed by `world_sizes`).
    #[default]
    PerSample,
    /// One generator per rank, drawn mask after mask as a framework's global generator is: its
    /// position is part of the checkpoint.
    Sequential,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum OptimizerSpec {
    Sgd {
        lr: f32,
        #[serde(default)]
        momentum: f32,
    },
    Adam {
        lr: f32,
        #[serde(default = "default_beta1")]
        beta1: f32,
        #[serde(default = "default_beta2")]
        beta2: f32,
        #[serde(default = "default_eps")]
        eps: f32,
    },
}

fn default_beta1() -> f32 {
    0.9
}
fn default_beta2() -> f32 {
    0.999
}
fn default_eps() -> f32 {
    1e-8
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrainParams {
    #[serde(default = "defaults::input_dim")]
    input_dim: usize,
    #[serde(default = "defaults::hidden")]
    hidden: usize,
    #[serde(default = "defaults::classes")]
    classes: usize,
    #[serde(default = "defaults::dataset_size")]
    dataset_size: usize,
    #[serde(default = "defaults::global_batch")]
    global_batch: usize,
    #[serde(default = "defaults::dropout")]
    dropout: f64,
    /// An internally tagged enum, which serde reads through `deserialize_any` (and so would
    /// also take from `["sgd", 0.1]`): an object only.
    #[serde(
        default = "defaults::optimizer",
        deserialize_with = "crate::file::strict::object"
    )]
    optimizer: OptimizerSpec,
    #[serde(default)]
    plant: Option<TrainPlant>,
    /// Shard the optimizer across ranks (ZeRO): reduce-scatter, update a chunk, allgather.
    #[serde(default)]
    zero: bool,
    #[serde(default)]
    dropout_rng: DropoutRng,
    /// Loader worker threads per rank (the `workers` check overrides it).
    #[serde(default = "defaults::workers")]
    workers: usize,
    /// Batches each worker may load ahead.
    #[serde(default = "defaults::prefetch")]
    prefetch: usize,
    /// Per-sample augmentation: only `noise_std` applies to feature vectors.
    #[serde(default)]
    augment: Augmentation,
    /// How gradients (and the loss) are fused into allreduce buckets (the `buckets` check
    /// overrides it); one flat buffer by default.
    #[serde(default = "defaults::bucket")]
    bucket: BucketLayout,
}

mod defaults {
    pub(super) fn bucket() -> super::BucketLayout {
        super::BucketLayout::Flat
    }
    pub(super) fn input_dim() -> usize {
        16
    }
    pub(super) fn hidden() -> usize {
        32
    }
    pub(super) fn classes() -> usize {
        4
    }
    pub(super) fn dataset_size() -> usize {
        1024
    }
    pub(super) fn global_batch() -> usize {
        64
    }
    pub(super) fn dropout() -> f64 {
        0.1
    }
    pub(super) fn workers() -> usize {
        2
    }
    pub(super) fn prefetch() -> usize {
        2
    }
    pub(super) fn optimizer() -> super::OptimizerSpec {
        super::OptimizerSpec::Adam {
            lr: 1e-2,
            beta1: super::default_beta1(),
            beta2: super::default_beta2(),
            eps: super::default_eps(),
        }
    }
}

/// Where each layer's tensors live in the flat parameter vector.
#[derive(Debug, Clone)]
struct Layout {
    d: usize,
    h: usize,
    c: usize,
}

impl Layout {
    fn w1(&self) -> std::ops::Range<usize> {
        0..self.h * self.d
    }
    fn b1(&self) -> std::ops::Range<usize> {
        self.w1().end..self.w1().end + self.h
    }
    fn w2(&self) -> std::ops::Range<usize> {
        self.b1().end..self.b1().end + self.c * self.h
    }
    fn b2(&self) -> std::ops::Range<usize> {
        self.w2().end..self.w2().end + self.c
    }
    fn len(&self) -> usize {
        self.b2().end
    }
    /// (name, range, shape) of every tensor, in recording order.
    fn tensors(&self) -> [(&'static str, std::ops::Range<usize>, Vec<usize>); 4] {
        [
            ("fc1.weight", self.w1(), vec![self.h, self.d]),
            ("fc1.bias", self.b1(), vec![self.h]),
            ("fc2.weight", self.w2(), vec![self.c, self.h]),
            ("fc2.bias", self.b2(), vec![self.c]),
        ]
    }
}

pub(super) struct TrainScenario {
    params: TrainParams,
    layout: Layout,
}

impl TrainScenario {
    pub(super) fn from_spec(spec: &ScenarioSpec) -> Result<Self, ParamError> {
        let params: TrainParams = spec.parse_params()?;
        size_param("params.input_dim", params.input_dim, 1)?;
        size_param("params.hidden", params.hidden, 1)?;
        size_param("params.classes", params.classes, 2)?;
        size_param("params.global_batch", params.global_batch, 1)?;
        size_param("params.prefetch", params.prefetch, 1)?;
        size_param("params.dataset_size", params.dataset_size, 1)?;
        workers_param(params.workers)?;
        Augmenter::new(
            params.augment,
            AugmentRng::PerSample { seed: spec.seed },
            &[params.input_dim],
        )
        .map_err(param_error)?;
        if !params.global_batch.is_multiple_of(spec.world_size) {
            return Err(ParamError::new(
                "params.global_batch",
                format!(
                    "{} must be divisible by world_size ({})",
                    params.global_batch, spec.world_size
                ),
            ));
        }
        let runs_world_sizes = spec
            .checks
            .contains(&crate::scenario::CheckKind::WorldSizes);
        if let Some(&w) = spec
            .world_sizes
            .iter()
            .find(|&&w| runs_world_sizes && !params.global_batch.is_multiple_of(w))
        {
            return Err(ParamError::new(
                "params.global_batch",
                format!(
                    "{} must be divisible by every size in world_sizes, and {w} does not divide it",
                    params.global_batch
                ),
            ));
        }
        if params.plant == Some(TrainPlant::HashmapGradOrder)
            && spec.effective_mode() == ReductionMode::Reproducible
        {
            return Err(ParamError::new(
                "params.plant",
                "`hashmap_grad_order` plants an order-dependent local sum, which the \
                 reproducible mode does not have: use another reduction",
            ));
        }
        if params.plant == Some(TrainPlant::ResumeWithoutRng)
            && params.dropout_rng != DropoutRng::Sequential
        {
            return Err(ParamError::new(
                "params.plant",
                "`resume_without_rng` forgets the dropout generator's position, which exists \
                 only with `\"dropout_rng\": \"sequential\"`",
            ));
        }
        if params.dataset_size == 0 || !params.dataset_size.is_multiple_of(params.global_batch) {
            return Err(ParamError::new(
                "params.dataset_size",
                format!(
                    "{} must be a positive multiple of global_batch ({})",
                    params.dataset_size, params.global_batch
                ),
            ));
        }
        if !(0.0..1.0).contains(&params.dropout) {
            return Err(ParamError::new(
                "params.dropout",
                format!("must be in [0, 1), got {}", params.dropout),
            ));
        }
        let lr = match params.optimizer {
            OptimizerSpec::Sgd { lr, .. } | OptimizerSpec::Adam { lr, .. } => lr,
        };
        if !(lr.is_finite() && lr > 0.0) {
            return Err(ParamError::new(
                "params.optimizer.lr",
                format!("must be a positive number, got {lr}"),
            ));
        }
        let layout = Layout {
            d: params.input_dim,
            h: params.hidden,
            c: params.classes,
        };
        Ok(TrainScenario { params, layout })
    }

    fn init(&self, ctx: &RankContext<'_>) -> Vec<f32> {
        let mut rng = match self.params.plant {
            Some(TrainPlant::RankSeededInit) => ctx.stream(Stream::Init, 0),
            _ => ctx.shared_stream(Stream::Init, 0),
        };
        let l = &self.layout;
        let mut params = vec![0.0f32; l.len()];
        let he = |fan_in: usize| (2.0 / fan_in as f64).sqrt() as f32;
        for w in &mut params[l.w1()] {
            *w = rng.normal_f32() * he(l.d);
        }
        for w in &mut params[l.w2()] {
            *w = rng.normal_f32() * he(l.h);
        }
        params
    }

    fn record_all(
        &self,
        ctx: &mut RankContext<'_>,
        step: u64,
        prefix: &str,
        flat: &[f32],
        replicated: bool,
    ) {
        if !ctx.is_recording() {
            return;
        }
        for (name, range, shape) in self.layout.tensors() {
            // The recorder keeps this copy in its batch: the only copy made.
            let tensor = Tensor::new(shape, TensorData::F32(flat[range].to_vec()))
                .expect("layout shapes match their ranges");
            let name = format!("{prefix}/{name}");
            if replicated {
                ctx.record_replicated_owned(step, &name, tensor);
            } else {
                ctx.record_owned(step, &name, tensor);
            }
        }
    }
}

/// Forward and backward of one sample; adds its gradient into `grad` and returns its loss: the
/// per-sample loop of every mode but `reproducible` (which keeps the factors, [`Backprop`], and
/// sums their products on a grid).
fn sample_gradient(
    l: &Layout,
    params: &[f32],
    x: &[f32],
    label: usize,
    mask: &[f32],
    grad: &mut [f32],
) -> f32 {
    let pass = Backprop::new(l, params, x, label, mask);
    pass.add_gradient(l, x, grad);
    pass.loss
}

/// One sample's forward and backward pass: what its gradient is made of. The gradient of a
/// layer's weights is the outer product of its output deltas and its inputs, of its bias the
/// deltas.
struct Backprop {
    /// The hidden layer's output after ReLU and dropout: the input of `fc2`.
    hidden: Vec<f32>,
    /// The loss's gradient at the logits: `fc2`'s deltas.
    d_logits: Vec<f32>,
    /// The loss's gradient at the hidden layer's pre-activation: `fc1`'s deltas.
    d_hidden: Vec<f32>,
    loss: f32,
}

impl Backprop {
    /// Forward and backward of one sample.
    fn new(l: &Layout, params: &[f32], x: &[f32], label: usize, mask: &[f32]) -> Backprop {
        let (w1, b1, w2, b2) = (
            &params[l.w1()],
            &params[l.b1()],
            &params[l.w2()],
            &params[l.b2()],
        );
        let h: Vec<f32> = (0..l.h)
            .map(|k| b1[k] + dot(&w1[k * l.d..(k + 1) * l.d], x))
            .collect();
        let a: Vec<f32> = h.iter().zip(mask).map(|(&v, &m)| v.max(0.0) * m).collect();
        let z: Vec<f32> = (0..l.c)
            .map(|c| b2[c] + dot(&w2[c * l.h..(c + 1) * l.h], &a))
            .collect();
        let z_max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = z.iter().map(|&v| libm::expf(v - z_max)).collect();
        let total: f32 = e.iter().sum();
        let loss = libm::logf(total) - (z[label] - z_max);

        let mut dz: Vec<f32> = e.iter().map(|&v| v / total).collect();
        dz[label] -= 1.0;
        let mut da = vec![0.0f32; l.h];
        for (c, &d) in dz.iter().enumerate() {
            da.iter_mut()
                .zip(&w2[c * l.h..(c + 1) * l.h])
                .for_each(|(acc, &w)| *acc += w * d);
        }
        let dh = (0..l.h)
            .map(|k| if h[k] > 0.0 { da[k] * mask[k] } else { 0.0 })
            .collect();
        Backprop {
            hidden: a,
            d_logits: dz,
            d_hidden: dh,
            loss,
        }
    }

    /// Adds this sample's gradient (input `x`) into `grad`, one f32 product per element.
    fn add_gradient(&self, l: &Layout, x: &[f32], grad: &mut [f32]) {
        let (g_w2_start, g_b2_start) = (l.w2().start, l.b2().start);
        for (c, &dz) in self.d_logits.iter().enumerate() {
            let row = &mut grad[g_w2_start + c * l.h..g_w2_start + (c + 1) * l.h];
            row.iter_mut()
                .zip(&self.hidden)
                .for_each(|(g, &v)| *g += dz * v);
            grad[g_b2_start + c] += dz;
        }
        let (g_w1_start, g_b1_start) = (l.w1().start, l.b1().start);
        for (k, &dh) in self.d_hidden.iter().enumerate() {
            let row = &mut grad[g_w1_start + k * l.d..g_w1_start + (k + 1) * l.d];
            row.iter_mut().zip(x).for_each(|(g, &v)| *g += dh * v);
            grad[g_b1_start + k] += dh;
        }
    }
}

/// A rank's samples of one step in the reproducible mode, as the factors of their gradients
/// (row after row, one per sample, in batch order): the gradients are summed from them
/// ([`outer`]) and never formed per sample.
#[derive(Default)]
struct Factors {
    inputs: Vec<f32>,
    hidden: Vec<f32>,
    d_logits: Vec<f32>,
    d_hidden: Vec<f32>,
    losses: Vec<f32>,
    /// A 1 per sample: the input of the biases (and of the loss).
    ones: Vec<f32>,
}

/// Optimizer state: momentum buffers for SGD, moments for Adam.
struct Optimizer {
    spec: OptimizerSpec,
    first: Vec<f32>,
    second: Vec<f32>,
    steps_taken: i32,
}

impl Optimizer {
    fn new(spec: OptimizerSpec, len: usize) -> Self {
        Optimizer {
            spec,
            first: vec![0.0; len],
            second: vec![0.0; len],
            steps_taken: 0,
        }
    }

    fn apply(&mut self, params: &mut [f32], grad: &[f32]) {
        self.steps_taken += 1;
        match self.spec {
            OptimizerSpec::Sgd { lr, momentum } => {
                for ((w, v), &g) in params.iter_mut().zip(&mut self.first).zip(grad) {
                    *v = momentum * *v + g;
                    *w -= lr * *v;
                }
            }
            OptimizerSpec::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                let t = self.steps_taken as f32;
                let correction1 = 1.0 - libm::powf(beta1, t);
                let correction2 = 1.0 - libm::powf(beta2, t);
                let moments = self.first.iter_mut().zip(&mut self.second);
                for ((w, (m, v)), &g) in params.iter_mut().zip(moments).zip(grad) {
                    *m = beta1 * *m + (1.0 - beta1) * g;
                    *v = beta2 * *v + (1.0 - beta2) * g * g;
                    let m_hat = *m / correction1;
                    let v_hat = *v / correction2;
                    *w -= lr * m_hat / (v_hat.sqrt() + eps);
                }
            }
        }
    }
}

impl TrainScenario {
    /// Hands every sample of `batch`, in batch order, to `each`: its input, label and dropout
    /// mask. Dropout masks come from `sequential` when the run draws them from one generator.
    fn for_each_sample(
        &self,
        ctx: &RankContext<'_>,
        batch: &Batch,
        step: u64,
        mut sequential: Option<&mut RankRng>,
        mut each: impl FnMut(&[f32], usize, &[f32]),
    ) -> Result<(), RankError> {
        let l = &self.layout;
        let keep = 1.0 - self.params.dropout;
        let scale = (1.0 / keep) as f32;
        let (Some(values), Some(labels)) =
            (batch.values.values::<f32>(), batch.labels.values::<i64>())
        else {
            return Err(
                "the loader delivered a batch that is not f32 values and i64 labels".into(),
            );
        };
        for (i, &index) in batch.indices.iter().enumerate() {
            let x = &values[i * l.d..(i + 1) * l.d];
            let label = usize::try_from(labels[i]).unwrap_or(0).min(l.c - 1);
            let draw = |rng: &mut RankRng| -> Vec<f32> {
                (0..l.h)
                    .map(|_| if rng.bernoulli(keep) { scale } else { 0.0 })
                    .collect()
            };
            let mask = match sequential.as_deref_mut() {
                Some(generator) => draw(generator),
                // The mask of a sample is drawn at (sample, step): the same on any rank.
                None => draw(&mut derive_stream(ctx.seed(), Stream::Dropout, index, step)),
            };
            each(x, label, &mask);
        }
        Ok(())
    }

    /// This step's per-sample gradients (each with its loss as a last element), in batch order,
    /// written into `terms`: the vectors of the previous step are reused, so that a step does not
    /// give the heap back to the system and fault it in again (glibc trims a freed heap top:
    /// 10 MB a step at global batch 512 made unrecorded steps 2x slower than recorded ones).
    fn sample_terms(
        &self,
        ctx: &RankContext<'_>,
        batch: &Batch,
        params: &[f32],
        step: u64,
        sequential: Option<&mut RankRng>,
        terms: &mut Vec<Vec<f32>>,
    ) -> Result<(), RankError> {
        let l = &self.layout;
        let mut filled = 0;
        self.for_each_sample(ctx, batch, step, sequential, |x, label, mask| {
            if filled == terms.len() {
                terms.push(Vec::new());
            }
            let term = &mut terms[filled];
            term.clear();
            term.resize(l.len() + 1, 0.0);
            term[l.len()] = sample_gradient(l, params, x, label, mask, &mut term[..l.len()]);
            filled += 1;
        })?;
        terms.truncate(filled);
        Ok(())
    }

    /// This step's samples as the factors of their gradients, in batch order.
    fn sample_factors(
        &self,
        ctx: &RankContext<'_>,
        batch: &Batch,
        params: &[f32],
        step: u64,
        sequential: Option<&mut RankRng>,
    ) -> Result<Factors, RankError> {
        let mut f = Factors::default();
        let l = &self.layout;
        self.for_each_sample(ctx, batch, step, sequential, |x, label, mask| {
            let pass = Backprop::new(l, params, x, label, mask);
            f.inputs.extend_from_slice(x);
            f.hidden.extend_from_slice(&pass.hidden);
            f.d_logits.extend_from_slice(&pass.d_logits);
            f.d_hidden.extend_from_slice(&pass.d_hidden);
            f.losses.push(pass.loss);
            f.ones.push(1.0);
        })?;
        Ok(f)
    }

    /// This rank's sum of its terms: in batch order, or in `HashMap` order for the planted fault.
    fn local_sum(&self, terms: &[Vec<f32>]) -> Vec<f32> {
        let len = self.layout.len() + 1;
        let mut bucket = vec![0.0f32; len];
        if self.params.plant == Some(TrainPlant::HashmapGradOrder) {
            // The planted fault: iteration order of a HashMap is random per map.
            let by_index: HashMap<usize, &Vec<f32>> = terms.iter().enumerate().collect();
            for term in by_index.values() {
                bucket
                    .iter_mut()
                    .zip(term.iter())
                    .for_each(|(b, g)| *b += g);
            }
        } else {
            for term in terms {
                bucket.iter_mut().zip(term).for_each(|(b, g)| *b += g);
            }
        }
        bucket
    }

    /// The ranges of the allreduce buckets over the gradients then the loss (one flat buffer by
    /// default).
    fn buckets(&self, ctx: &RankContext<'_>) -> Vec<std::ops::Range<usize>> {
        let n = self.layout.len();
        let ends: Vec<usize> = self
            .layout
            .tensors()
            .iter()
            .map(|(_, range, _)| range.end)
            .chain([n + 1])
            .collect();
        ctx.bucket_layout(self.params.bucket).buckets(n + 1, &ends)
    }

    /// The summed gradient bucket (gradients then loss) over all ranks: the whole bucket, or with
    /// `zero` this rank's chunk of the gradients and the loss.
    fn reduce(&self, ctx: &RankContext<'_>, local: Vec<f32>) -> Result<Summed, RankError> {
        let n = self.layout.len();
        if self.params.zero {
            let loss_sum = local[n];
            let grads = Tensor::from_vec(local[..n].to_vec());
            let shard = ctx
                .comm()
                .reduce_scatter(&grads, ReduceOp::Sum, ctx.mode())?;
            let mut loss = Tensor::scalar(loss_sum);
            ctx.allreduce(&mut loss, ReduceOp::Sum)?;
            let (TensorData::F32(shard), TensorData::F32(loss)) =
                (shard.into_data(), loss.into_data())
            else {
                unreachable!("reductions keep the dtype");
            };
            return Ok((shard, loss[0]));
        }
        let mut sum = Vec::with_capacity(n + 1);
        for range in self.buckets(ctx) {
            let mut reduced = Tensor::from_vec(local[range].to_vec());
            ctx.allreduce(&mut reduced, ReduceOp::Sum)?;
            let TensorData::F32(part) = reduced.into_data() else {
                unreachable!("an allreduce keeps the dtype");
            };
            sum.extend(part);
        }
        let loss = sum.pop().expect("the bucket ends with the loss");
        Ok((sum, loss))
    }

    /// The reproducible mode's sums: this rank's local sum (gradients then loss, to record) and,
    /// as [`Self::reduce`], the sum over all ranks. Every element is the sum of its samples'
    /// exact products on a grid fixed by one `max` allreduce of the factors' magnitudes
    /// ([`outer`]), so its bits do not depend on how the global batch is split; the grid integers
    /// are summed over ranks by an exact allreduce per bucket.
    fn reproducible_reduce(
        &self,
        ctx: &RankContext<'_>,
        f: &Factors,
    ) -> Result<(Vec<f32>, Summed), RankError> {
        let l = &self.layout;
        let n = l.len();
        // The largest magnitudes of every factor (and a non-finite flag), over all ranks.
        let widths = [l.h, l.d, l.c, l.h, 1];
        let sources = [&f.d_hidden, &f.inputs, &f.d_logits, &f.hidden, &f.losses];
        let mut max_abs = vec![0.0f32; widths.iter().sum::<usize>() + 1];
        let mut special = false;
        let mut start = 0;
        for (&width, values) in widths.iter().zip(sources) {
            special |= outer::fold_max_abs(values, &mut max_abs[start..start + width]);
            start += width;
        }
        max_abs[start] = f32::from(u8::from(special));
        let mut max_abs = Tensor::from_vec(max_abs);
        ctx.exact_allreduce(&mut max_abs, ReduceOp::Max)?;
        let TensorData::F32(max_abs) = max_abs.into_data() else {
            unreachable!("an allreduce keeps the dtype");
        };
        let mut parts = &max_abs[..];
        let mut next = |width: usize| {
            let (part, rest) = parts.split_at(width);
            parts = rest;
            part
        };
        let (d_hidden, inputs, d_logits, hidden, losses) =
            (next(l.h), next(l.d), next(l.c), next(l.h), next(1));
        let special = next(1)[0] > 0.0;
        // The blocks of the bucket, in its order: each an outer product's sum over samples.
        let total = self.params.global_batch as u64;
        let one = [1.0f32];
        let blocks = [
            (&f.d_hidden, l.h, &f.inputs, l.d, d_hidden, inputs),
            (&f.d_hidden, l.h, &f.ones, 1, d_hidden, &one[..]),
            (&f.d_logits, l.c, &f.hidden, l.h, d_logits, hidden),
            (&f.d_logits, l.c, &f.ones, 1, d_logits, &one[..]),
            (&f.losses, 1, &f.ones, 1, losses, &one[..]),
        ];
        let grids: Vec<outer::OuterGrid> = blocks
            .iter()
            .map(|&(_, _, _, _, u_max, v_max)| outer::OuterGrid::new(u_max, v_max, total))
            .collect();
        let mut sums = vec![0i64; n + 1];
        let mut counts = special.then(|| vec![0i64; 3 * (n + 1)]);
        let mut start = 0;
        for (grid, &(u, p, v, q, _, _)) in grids.iter().zip(&blocks) {
            let range = start..start + grid.len();
            grid.add_sums(u, v, &mut sums[range.clone()]);
            if let Some(counts) = counts.as_mut() {
                let block = outer::special_counts(u, p, v, q);
                for (kind, part) in block.chunks_exact(grid.len()).enumerate() {
                    let at = kind * (n + 1) + range.start;
                    counts[at..at + grid.len()].copy_from_slice(part);
                }
            }
            start = range.end;
        }
        let finish = |sums: &[i64], counts: Option<&Vec<i64>>| {
            let mut out = vec![0.0f32; n + 1];
            let mut start = 0;
            for grid in &grids {
                let range = start..start + grid.len();
                grid.finish(&sums[range.clone()], &mut out[range.clone()]);
                start = range.end;
            }
            if let Some(counts) = counts {
                distributed::apply_specials(&mut out, counts);
            }
            out
        };
        let local = finish(&sums, counts.as_ref());
        for range in self.buckets(ctx) {
            let mut reduced = Tensor::from_vec(sums[range.clone()].to_vec());
            ctx.exact_allreduce(&mut reduced, ReduceOp::Sum)?;
            let TensorData::I64(part) = reduced.into_data() else {
                unreachable!("an allreduce keeps the dtype");
            };
            sums[range].copy_from_slice(&part);
        }
        if let Some(counts) = counts.as_mut() {
            let mut reduced = Tensor::from_vec(std::mem::take(counts));
            ctx.exact_allreduce(&mut reduced, ReduceOp::Sum)?;
            let TensorData::I64(all) = reduced.into_data() else {
                unreachable!("an allreduce keeps the dtype");
            };
            *counts = all;
        }
        let mut sum = finish(&sums, counts.as_ref());
        let loss = sum.pop().expect("the bucket ends with the loss");
        if self.params.zero {
            sum = sum[chunk_range(n, ctx.world_size(), ctx.rank())].to_vec();
        }
        Ok((local, (sum, loss)))
    }
}

/// The gradients (all of them, or with `zero` this rank's chunk) and the loss, summed over all
/// ranks.
type Summed = (Vec<f32>, f32);

/// Names in checkpoints.
const DROPOUT_GENERATOR: &str = "dropout";
const OPTIMIZER_STEPS: &str = "optimizer_steps";
const OPTIMIZER_FIRST: &str = "optimizer/first_moment";
const OPTIMIZER_SECOND: &str = "optimizer/second_moment";

impl TrainScenario {
    /// The state after `step` steps, as a checkpoint.
    fn checkpoint(
        &self,
        step: u64,
        params: &[f32],
        optimizer: &Optimizer,
        dropout: Option<&RankRng>,
    ) -> RankCheckpoint {
        let mut c = RankCheckpoint::new(step);
        for (name, range, shape) in self.layout.tensors() {
            let tensor = Tensor::new(shape, TensorData::F32(params[range].to_vec()))
                .expect("layout shapes match their ranges");
            c.tensors.insert(format!("param/{name}"), tensor);
        }
        c.tensors.insert(
            OPTIMIZER_FIRST.into(),
            Tensor::from_vec(optimizer.first.clone()),
        );
        c.tensors.insert(
            OPTIMIZER_SECOND.into(),
            Tensor::from_vec(optimizer.second.clone()),
        );
        c.counters
            .insert(OPTIMIZER_STEPS.into(), optimizer.steps_taken as u64);
        if let Some(generator) = dropout {
            c.generators
                .insert(DROPOUT_GENERATOR.into(), generator.clone());
        }
        c
    }

    /// Restores parameters, optimizer state and the dropout generator from a checkpoint.
    fn restore(
        &self,
        mut c: RankCheckpoint,
        params: &mut [f32],
        optimizer: &mut Optimizer,
        dropout: &mut Option<RankRng>,
    ) -> Result<(), RankError> {
        for (name, range, shape) in self.layout.tensors() {
            let tensor = c.take_tensor(&format!("param/{name}"), &shape)?;
            params[range].copy_from_slice(tensor.values::<f32>().ok_or_else(|| {
                CheckpointError::Content {
                    what: format!("tensor `param/{name}`"),
                    problem: "is not f32".to_owned(),
                }
            })?);
        }
        let state_len = [optimizer.first.len()];
        for (name, slot) in [
            (OPTIMIZER_FIRST, &mut optimizer.first),
            (OPTIMIZER_SECOND, &mut optimizer.second),
        ] {
            let tensor = c.take_tensor(name, &state_len)?;
            slot.copy_from_slice(tensor.values::<f32>().ok_or_else(|| {
                CheckpointError::Content {
                    what: format!("tensor `{name}`"),
                    problem: "is not f32".to_owned(),
                }
            })?);
        }
        optimizer.steps_taken =
            i32::try_from(c.counter(OPTIMIZER_STEPS)?).map_err(|_| CheckpointError::Content {
                what: format!("counter `{OPTIMIZER_STEPS}`"),
                problem: "is too large".to_owned(),
            })?;
        if let Some(generator) = dropout.as_mut() {
            let saved = c.take_generator(DROPOUT_GENERATOR)?;
            // The planted fault: the generator keeps its initial position.
            if self.params.plant != Some(TrainPlant::ResumeWithoutRng) {
                *generator = saved;
            }
        }
        Ok(())
    }
}

impl Scenario for TrainScenario {
    fn capabilities(&self) -> Capabilities {
        let supports = Capabilities::default()
            .with_loader()
            .with_checkpoints()
            .with_replicated_records();
        // ZeRO reduce-scatters one flat buffer: it has no buckets to lay out.
        if self.params.zero {
            supports
        } else {
            supports.with_buckets()
        }
    }

    /// The model (parameters, gradients, optimizer state, buckets, the teacher: ten copies of
    /// it), each sample's gradient of the rank's batch (twice: the reproducible sum's columns),
    /// the loader's batches and the sampler's order of the dataset; records: `local_grad/*`, `loss`, `grad/*`, `param/*` and, at
    /// step 0, `init/*`.
    fn footprint(&self, world_size: usize, plan: &RunPlan) -> Footprint {
        let p = &self.params;
        let (d, h, c) = (size(p.input_dim), size(p.hidden), size(p.classes));
        let dims = [
            ("params.input_dim", d),
            ("params.hidden", h),
            ("params.classes", c),
        ];
        // h·d + h + c·h + c, and the loss.
        let model = bytes_of(&[h, d])
            .saturating_add(bytes_of(&[c, h.saturating_add(1)]))
            .saturating_add(h)
            .saturating_add(1);
        let local_batch = p.global_batch / world_size.max(1);
        let mut sample_factors = dims.to_vec();
        sample_factors.push(("params.global_batch", size(local_batch)));
        let workers = plan.loader_workers.unwrap_or(p.workers);
        let (loader_field, loader) = loader_bytes(&[dims[0]], local_batch, workers, p.prefetch);
        Footprint::default()
            .with_bytes(largest_field(&dims), bytes_of(&[model, 4, 10]))
            .with_bytes(
                largest_field(&sample_factors),
                bytes_of(&[model, size(local_batch), 4, 2]),
            )
            .with_bytes(loader_field, loader)
            .with_bytes("params.dataset_size", bytes_of(&[size(p.dataset_size), 8]))
            .with_records_per_step(17)
    }

    fn run_rank(&self, ctx: &mut RankContext<'_>) -> Result<(), RankError> {
        let p = &self.params;
        let l = &self.layout;
        let local_batch = p.global_batch / ctx.world_size();
        let reproducible = ctx.mode() == ReductionMode::Reproducible;
        let own = chunk_range(l.len(), ctx.world_size(), ctx.rank());
        let state_len = if p.zero { own.len() } else { l.len() };
        let mut optimizer = Optimizer::new(p.optimizer, state_len);
        let mut dropout =
            (p.dropout_rng == DropoutRng::Sequential).then(|| ctx.stream(Stream::Dropout, 0));
        let mut params = self.init(ctx);
        let size = p.dataset_size as u64;
        let sampler =
            DistributedSampler::new(size, ctx.world_size(), ctx.rank(), ctx.seed(), true, false)?;
        let batches = BatchSampler::new(sampler, local_batch, false)?;
        let per_epoch = batches.batches_per_epoch();
        let start = match ctx.resume()? {
            Some(checkpoint) => {
                let position = restored_position(&checkpoint, per_epoch)?;
                self.restore(checkpoint, &mut params, &mut optimizer, &mut dropout)?;
                position
            }
            None => {
                self.record_all(ctx, 0, "init", &params, true);
                LoaderPosition::default()
            }
        };
        let dataset = Arc::new(SyntheticVectors::new(ctx.seed(), size, l.d, l.c));
        let augmenter = Augmenter::new(
            p.augment,
            AugmentRng::PerSample { seed: ctx.seed() },
            &[l.d],
        )?;
        let config = loader_config(ctx, p.workers, p.prefetch, Delivery::SamplerOrder);
        let mut loader = open_loader(ctx, dataset, batches, augmenter, config, start)?;

        // `ring`'s per-sample terms, reused from step to step (see `sample_terms`).
        let mut terms: Vec<Vec<f32>> = Vec::new();
        for step in ctx.start_step()..ctx.steps() {
            let batch = next_batch(&mut loader, step)?;
            let (local, reduced) = if reproducible {
                let factors = self.sample_factors(ctx, &batch, &params, step, dropout.as_mut())?;
                let (local, reduced) = self.reproducible_reduce(ctx, &factors)?;
                (local, Some(reduced))
            } else {
                self.sample_terms(ctx, &batch, &params, step, dropout.as_mut(), &mut terms)?;
                (self.local_sum(&terms), None)
            };
            self.record_all(ctx, step, "local_grad", &local[..l.len()], false);
            let (mut grad, loss) = match reduced {
                Some(reduced) => reduced,
                None => self.reduce(ctx, local)?,
            };
            let batch = p.global_batch as f32;
            grad.iter_mut().for_each(|g| *g /= batch);
            ctx.record_replicated(step, "loss", &Tensor::scalar(loss / batch));
            if p.zero {
                ctx.record(step, "grad_shard", &Tensor::from_vec(grad.clone()));
                optimizer.apply(&mut params[own.clone()], &grad);
                // Chunks differ in length by at most one; an allgather takes equal lengths.
                let width = l.len().div_ceil(ctx.world_size());
                let mut mine = params[own.clone()].to_vec();
                mine.resize(width, 0.0);
                let gathered = ctx.comm().allgather(&Tensor::from_vec(mine))?;
                for (rank, part) in gathered.into_iter().enumerate() {
                    let TensorData::F32(part) = part.into_data() else {
                        unreachable!("an allgather keeps the dtype");
                    };
                    let range = chunk_range(l.len(), ctx.world_size(), rank);
                    let n = range.len();
                    params[range].copy_from_slice(&part[..n]);
                }
            } else {
                self.record_all(ctx, step, "grad", &grad, true);
                optimizer.apply(&mut params, &grad);
            }
            self.record_all(ctx, step, "param", &params, true);
        }
        if ctx.wants_checkpoint() {
            let mut state = self.checkpoint(ctx.steps(), &params, &optimizer, dropout.as_ref());
            store_position(&mut state, loader.position());
            ctx.save_checkpoint(&state)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{launch_threads, LaunchConfig};
    use crate::record::RecordLevel;

    /// Rank 0's replicated records (step, name, md5) of a small `reproducible` run at
    /// `world_size` thread ranks, one line each.
    fn replicated_records(world_size: usize) -> Vec<String> {
        records_of(world_size, ReductionMode::Reproducible, true)
    }

    /// Rank 0's records (step, name, md5) of a small run in `mode`, the replicated ones only or all.
    fn records_of(world_size: usize, mode: ReductionMode, replicated_only: bool) -> Vec<String> {
        let text = r#"{"kind": "train", "world_size": 1, "steps": 3, "seed": 11,
            "reduction": "ring", "deterministic_comm": true, "expect": "identical",
            "params": {"dataset_size": 96, "global_batch": 24, "workers": 1, "hidden": 20}}"#;
        let spec: ScenarioSpec = serde_json::from_str(text).expect("a valid spec");
        let scenario = Arc::new(TrainScenario::from_spec(&spec).expect("valid params"));
        let traces = launch_threads(&LaunchConfig::new(world_size), move |comm| {
            let mut ctx = RankContext::new(comm, RecordLevel::Digest, 11, 3, mode);
            scenario.run_rank(&mut ctx)?;
            Ok(ctx.into_recorder().finish())
        })
        .expect("the run succeeds");
        traces[0]
            .records
            .iter()
            .filter(|r| r.replicated || !replicated_only)
            .map(|r| format!("{} {} {}", r.step, r.name, r.md5))
            .collect()
    }

    /// Golden bits of `ring` (and so of every mode but `reproducible`: they share the per-sample
    /// loop): the md5 of rank 0's records at 2 ranks (local gradients, gradients, parameters,
    /// losses of 3 steps). Pinned on 2026-11-22 before `sample_gradient` was rewritten on
    /// [`Backprop`], whose bits it must keep.
    #[test]
    fn ring_training_matches_the_golden_bits() {
        let records = records_of(2, ReductionMode::Ring, false);
        let digest = crate::value::digest::Md5Digest::of_bytes(records.join("\n").as_bytes());
        assert_eq!(
            digest.to_string(),
            "cd2bdb07c81f884ec6563ebbc2216ba2",
            "{records:?}"
        );
    }

    /// Golden bits of the reproducible mode: the md5 of rank 0's replicated records (loss,
    /// gradients, parameters of 3 steps), the same at world sizes 1 to 8. Computed when the mode
    /// moved to sums of outer products on a grid from bounds (2026-11-22; the per-sample sums it
    /// replaced gave other bits): a change here changes what users' `reproducible` runs of
    /// `train` produce.
    #[test]
    fn reproducible_training_matches_the_golden_bits_at_every_world_size() {
        let one = replicated_records(1);
        assert_eq!(one.len(), 4 + 3 * 9, "{one:?}");
        for world_size in [2, 3, 4, 8] {
            assert_eq!(replicated_records(world_size), one, "{world_size} ranks");
        }
        let digest = crate::value::digest::Md5Digest::of_bytes(one.join("\n").as_bytes());
        assert_eq!(digest.to_string(), "2964833c7201485e29cd9988944df5d4");
    }
}
