//! The `dataloader` kind: the data order alone, as a training job would see it.
//!
//! Each rank builds a [`DistributedSampler`] over a synthetic image dataset (shuffled per epoch
//! from the seed, sharded as PyTorch's DistributedSampler), batches it, and loads the batches
//! with `workers` prefetching threads that augment every sample (random crop, flip, noise).
//! Every step records the batch's sample indices (`batch/indices`), its pixels
//! (`batch/values`, whose md5 is the data's) and labels (`batch/labels`).
//!
//! Determinism: the order comes from (seed, epoch), each sample's augmentation from (seed,
//! epoch, sample index), and the loader delivers batches in sampler order whatever its workers'
//! timing; so the records are the same for any number of workers (the `workers` check) and a
//! resumed run continues at the loader's position (the `restart` check) without loading the
//! earlier batches again. Planted faults: `"delivery": "completion_order"` hands batches over as
//! workers finish; `"plant": "shared_augment_rng"` draws every augmentation from one generator
//! that the workers consume in timing order.
//!
//! Limits: with the planted shared generator, a checkpoint does not hold that generator's
//! position (the fault is about timing; a restart with it diverges too).

use super::{largest_field, size_param, workers_param};
use crate::checkpoint::RankCheckpoint;
use crate::comm::RankError;
use crate::data::{
    AugmentRng, Augmentation, Augmenter, Batch, BatchSampler, DataError, DataLoader, Dataset,
    Delivery, DistributedSampler, LoaderConfig, LoaderPosition, SyntheticImages,
};
use crate::scenario::limits::{bytes_of, size, size_in_range};
use crate::scenario::{
    Capabilities, Footprint, ParamError, RankContext, RunPlan, Scenario, ScenarioSpec,
};
use crate::value::seed::Stream;
use crate::value::tensor::Tensor;
use serde::Deserialize;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum LoaderPlant {
    /// One augmentation generator shared by the workers, consumed in timing order.
    SharedAugmentRng,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoaderParams {
    #[serde(default = "defaults::dataset_size")]
    dataset_size: u64,
    #[serde(default = "defaults::channels")]
    channels: usize,
    #[serde(default = "defaults::side")]
    height: usize,
    #[serde(default = "defaults::side")]
    width: usize,
    #[serde(default = "defaults::classes")]
    classes: usize,
    /// Samples per rank per batch.
    #[serde(default = "defaults::batch_size")]
    batch_size: usize,
    #[serde(default = "defaults::shuffle")]
    shuffle: bool,
    /// Drop the samples that do not fill the last batch (and the sampler's padding).
    #[serde(default)]
    drop_last: bool,
    #[serde(default = "defaults::augment")]
    augment: Augmentation,
    /// Worker threads per rank (the `workers` check overrides it).
    #[serde(default = "defaults::workers")]
    workers: usize,
    /// Batches each worker may load ahead.
    #[serde(default = "defaults::prefetch")]
    prefetch: usize,
    #[serde(default)]
    delivery: Delivery,
    #[serde(default)]
    plant: Option<LoaderPlant>,
}

mod defaults {
    use crate::data::Augmentation;
    pub(super) fn dataset_size() -> u64 {
        500
    }
    pub(super) fn channels() -> usize {
        3
    }
    pub(super) fn side() -> usize {
        16
    }
    pub(super) fn classes() -> usize {
        10
    }
    pub(super) fn batch_size() -> usize {
        8
    }
    pub(super) fn shuffle() -> bool {
        true
    }
    pub(super) fn augment() -> Augmentation {
        Augmentation {
            crop_padding: 2,
            flip: true,
            noise_std: 0.05,
        }
    }
    pub(super) fn workers() -> usize {
        2
    }
    pub(super) fn prefetch() -> usize {
        2
    }
}

/// A data error of a parameter, as a parameter error of the scenario file.
pub(super) fn param_error(e: DataError) -> ParamError {
    match e {
        DataError::Invalid { field, message } => {
            ParamError::new(format!("params.{field}"), message)
        }
        other => ParamError::new("params", other.to_string()),
    }
}

pub(super) struct DataLoaderScenario {
    params: LoaderParams,
}

/// Checkpoint counters of a loader's position.
pub(super) const LOADER_EPOCH: &str = "loader/epoch";
pub(super) const LOADER_BATCH: &str = "loader/batch";

/// The loader position stored in `checkpoint`, checked against its step: a checkpoint whose
/// loader is not where its step says would silently train on other data.
pub(super) fn restored_position(
    checkpoint: &RankCheckpoint,
    batches_per_epoch: u64,
) -> Result<LoaderPosition, RankError> {
    let position = LoaderPosition {
        epoch: checkpoint.counter(LOADER_EPOCH)?,
        batch: checkpoint.counter(LOADER_BATCH)?,
    };
    let expected = LoaderPosition::default().after(checkpoint.step, batches_per_epoch);
    if position != expected {
        return Err(Box::new(crate::checkpoint::CheckpointError::Content {
            what: "loader position".to_owned(),
            problem: format!(
                "is epoch {} batch {}, but after step {} it must be epoch {} batch {}",
                position.epoch, position.batch, checkpoint.step, expected.epoch, expected.batch
            ),
        }));
    }
    Ok(position)
}

/// Stores a loader's position in a checkpoint.
pub(super) fn store_position(checkpoint: &mut RankCheckpoint, position: LoaderPosition) {
    checkpoint
        .counters
        .insert(LOADER_EPOCH.into(), position.epoch);
    checkpoint
        .counters
        .insert(LOADER_BATCH.into(), position.batch);
}

/// The loader configuration of this run: the plan's workers, the perturbation's jitter.
pub(super) fn loader_config(
    ctx: &RankContext<'_>,
    workers: usize,
    prefetch: usize,
    delivery: Delivery,
) -> LoaderConfig {
    let mut config = LoaderConfig::new(ctx.loader_workers(workers)).with_delivery(delivery);
    config.prefetch_per_worker = prefetch;
    if let Some(jitter) = ctx.loader_jitter() {
        config = config.with_jitter(jitter);
    }
    config
}

/// A loader over this run's steps, from `start` (the checkpoint's position on a resume):
/// it loads nothing before `start` and nothing after the run's last step.
pub(super) fn open_loader(
    ctx: &RankContext<'_>,
    dataset: Arc<dyn Dataset>,
    batches: BatchSampler,
    augmenter: Augmenter,
    config: LoaderConfig,
    start: LoaderPosition,
) -> Result<DataLoader, RankError> {
    let num_batches = ctx.steps().saturating_sub(ctx.start_step());
    Ok(DataLoader::new(
        dataset,
        batches,
        augmenter,
        config,
        start,
        num_batches,
    )?)
}

/// The batch of `step`: the loader's next one.
pub(super) fn next_batch(loader: &mut DataLoader, step: u64) -> Result<Batch, RankError> {
    Ok(loader
        .next_batch()?
        .ok_or_else(|| format!("the loader ended before step {step}"))?)
}

/// What a loader holds at most, and the field that drives it: the `workers · prefetch` batches
/// of its window (one batch without workers), each of `batch` samples of f32 values of the
/// `sample` dimensions, twice (a batch is assembled from augmented copies), plus the batch the
/// rank is using.
pub(super) fn loader_bytes(
    sample: &[(&'static str, u64)],
    batch: usize,
    workers: usize,
    prefetch: usize,
) -> (&'static str, u64) {
    let window = bytes_of(&[size(workers.max(1)), size(prefetch)]).saturating_add(1);
    let values = sample
        .iter()
        .fold(4u64, |acc, &(_, n)| acc.saturating_mul(n));
    let bytes = bytes_of(&[window, size(batch), values, 2]);
    let mut factors = sample.to_vec();
    factors.push(("params.prefetch", size(prefetch)));
    factors.push(("params.batch_size", size(batch)));
    (largest_field(&factors), bytes)
}

impl DataLoaderScenario {
    pub(super) fn from_spec(spec: &ScenarioSpec) -> Result<Self, ParamError> {
        let params: LoaderParams = spec.parse_params()?;
        size_param("params.channels", params.channels, 1)?;
        size_param("params.height", params.height, 1)?;
        size_param("params.width", params.width, 1)?;
        size_param("params.classes", params.classes, 1)?;
        size_param("params.prefetch", params.prefetch, 1)?;
        size_param("params.batch_size", params.batch_size, 1)?;
        size_in_range("params.dataset_size", params.dataset_size, 1)?;
        workers_param(params.workers)?;
        let scenario = DataLoaderScenario { params };
        // Every world this spec may run at must give a valid sampler.
        let mut worlds = vec![spec.world_size];
        worlds.extend(&spec.world_sizes);
        for world in worlds {
            scenario.batches(spec.seed, world, 0).map_err(param_error)?;
        }
        Augmenter::new(
            scenario.params.augment,
            AugmentRng::PerSample { seed: spec.seed },
            &[
                scenario.params.channels,
                scenario.params.height,
                scenario.params.width,
            ],
        )
        .map_err(param_error)?;
        Ok(scenario)
    }

    fn batches(&self, seed: u64, world: usize, rank: usize) -> Result<BatchSampler, DataError> {
        let p = &self.params;
        let sampler =
            DistributedSampler::new(p.dataset_size, world, rank, seed, p.shuffle, p.drop_last)?;
        BatchSampler::new(sampler, p.batch_size, p.drop_last)
    }
}

impl Scenario for DataLoaderScenario {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_loader().with_checkpoints()
    }

    /// The loader's batches in flight (see [`loader_bytes`]) and the sampler's order of the
    /// dataset (8 bytes a sample); records: indices, values, labels.
    fn footprint(&self, _world_size: usize, plan: &RunPlan) -> Footprint {
        let p = &self.params;
        let sample = [
            ("params.channels", size(p.channels)),
            ("params.height", size(p.height)),
            ("params.width", size(p.width)),
        ];
        let workers = plan.loader_workers.unwrap_or(p.workers);
        let (field, bytes) = loader_bytes(&sample, p.batch_size, workers, p.prefetch);
        Footprint::default()
            .with_bytes(field, bytes)
            .with_bytes("params.dataset_size", bytes_of(&[p.dataset_size, 8]))
            .with_records_per_step(3)
    }

    fn run_rank(&self, ctx: &mut RankContext<'_>) -> Result<(), RankError> {
        let p = &self.params;
        let shape = [p.channels, p.height, p.width];
        let dataset = Arc::new(SyntheticImages::new(
            ctx.seed(),
            p.dataset_size,
            p.channels,
            p.height,
            p.width,
            p.classes,
        ));
        let batches = self.batches(ctx.seed(), ctx.world_size(), ctx.rank())?;
        let per_epoch = batches.batches_per_epoch();
        let start = match ctx.resume()? {
            Some(checkpoint) => restored_position(&checkpoint, per_epoch)?,
            None => LoaderPosition::default(),
        };
        let rng = match p.plant {
            Some(LoaderPlant::SharedAugmentRng) => {
                AugmentRng::Shared(Arc::new(Mutex::new(ctx.stream(Stream::Augment, 0))))
            }
            None => AugmentRng::PerSample { seed: ctx.seed() },
        };
        let augmenter = Augmenter::new(p.augment, rng, &shape)?;
        let config = loader_config(ctx, p.workers, p.prefetch, p.delivery);
        let mut loader = open_loader(ctx, dataset, batches, augmenter, config, start)?;
        for step in ctx.start_step()..ctx.steps() {
            let batch = next_batch(&mut loader, step)?;
            let indices: Vec<i64> = batch
                .indices
                .iter()
                .map(|&i| i64::try_from(i).unwrap_or(i64::MAX))
                .collect();
            ctx.record(step, "batch/indices", &Tensor::from_vec(indices));
            ctx.record(step, "batch/values", &batch.values);
            ctx.record(step, "batch/labels", &batch.labels);
        }
        if ctx.wants_checkpoint() {
            let mut checkpoint = RankCheckpoint::new(ctx.steps());
            store_position(&mut checkpoint, loader.position());
            ctx.save_checkpoint(&checkpoint)?;
        }
        Ok(())
    }
}
