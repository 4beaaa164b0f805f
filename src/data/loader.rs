//! A multi-worker data loader whose batches do not depend on its workers.
//!
//! [`DataLoader`] delivers `num_batches` batches of one rank from a [`LoaderPosition`] on,
//! continuing into later epochs. With `workers = 0` it loads each batch in the calling thread when
//! asked; otherwise `workers` threads prefetch up to `workers · prefetch_per_worker` batches
//! ahead of the consumer. Any idle worker claims the next batch number from a shared counter,
//! loads its samples (`Dataset::get`, then `Augmenter::apply`) and collates them into a [`Batch`].
//! A worker that cannot claim one (the window is full, or every batch is claimed) helps: it loads
//! the next samples of the oldest batch still being loaded, so a descheduled worker holds back at
//! most the sample it is on, not the rest of its batch; whoever loads a batch's last sample
//! collates it.
//!
//! Determinism: a batch is computed the same way whichever worker computes it (its indices come
//! from the sampler, its augmentation draws from (sample, epoch)), and in
//! [`Delivery::SamplerOrder`] a reorder buffer hands batches over in sampler order however the
//! workers' timing falls. [`Delivery::CompletionOrder`] hands them over as workers finish: a
//! negative control, whose order changes from run to run. [`LoaderJitter`] adds seeded sleeps
//! before each sample to shake the timing; it never changes a value.
//!
//! Restart: a loader started at a position loads nothing before it (the work a checkpoint saves
//! is not redone) and nothing beyond its last batch; [`DataLoader::position`] is what to store.
//!
//! Failure: a panic in a worker (in the dataset or the augmentation) is caught; the other workers
//! stop and [`DataLoader::next_batch`] returns [`DataError::WorkerPanicked`]. Nothing waits
//! forever: every wait is woken by a delivered batch, a freed prefetch slot, a failure or the
//! stop of [`Drop`], which joins every worker.
//!
//! Limits: workers are threads (one process); a batch's values are `f32`, collated into one
//! `[B, ..sample_shape]` tensor; with `workers = 0` a panic of the dataset propagates to the
//! caller, as any callback's would.

use super::augment::Augmenter;
use super::dataset::{Dataset, Sample};
use super::sampler::{BatchSampler, LoaderPosition};
use super::DataError;
use crate::comm::panic_message;
use crate::value::seed::{derive_stream, Stream};
use crate::value::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Stream number of the loader jitter's delays (ASCII `jitter\0\0`).
const JITTER_STREAM: u64 = 0x6a69_7474_6572_0000;

/// The order in which a loader hands batches over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// The sampler's order, whatever the workers' timing (a reorder buffer).
    #[default]
    SamplerOrder,
    /// Negative control: as workers finish, so the order depends on timing.
    CompletionOrder,
}

/// Seeded timing noise: before loading each sample a worker sleeps a delay uniform in
/// `[0, max_delay]`, drawn from the jitter's own stream
/// `derive_stream(seed, Stream::User(0x6a69_7474_6572_0000), worker, n)` (the number is ASCII
/// `jitter`; `n` counts the samples that worker loaded before). It changes timing only, never
/// values. A loader with `workers = 0` has no workers to delay and ignores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderJitter {
    /// Seed of the delays.
    pub seed: u64,
    /// The longest delay.
    pub max_delay: Duration,
}

/// How a [`DataLoader`] runs: its workers, prefetch depth, delivery order and jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Worker threads (0: load in the calling thread, on demand).
    pub workers: usize,
    /// Batches each worker may load ahead of the consumer (at least 1; default 2).
    pub prefetch_per_worker: usize,
    /// The order batches are handed over in.
    pub delivery: Delivery,
    /// Seeded sleeps before each sample, to shake timing (tests and negative controls).
    pub jitter: Option<LoaderJitter>,
}

impl LoaderConfig {
    /// `workers` workers, 2 batches of prefetch each, sampler order, no jitter.
    #[must_use]
    pub fn new(workers: usize) -> Self {
        LoaderConfig {
            workers,
            prefetch_per_worker: 2,
            delivery: Delivery::SamplerOrder,
            jitter: None,
        }
    }

    /// The same configuration delivering in `delivery` order.
    #[must_use]
    pub fn with_delivery(self, delivery: Delivery) -> Self {
        LoaderConfig { delivery, ..self }
    }

    /// The same configuration with `jitter`.
    #[must_use]
    pub fn with_jitter(self, jitter: LoaderJitter) -> Self {
        LoaderConfig {
            jitter: Some(jitter),
            ..self
        }
    }
}

/// One batch: where it is in the data order, its sample indices, values `[B, ..sample_shape]`
/// (f32) and labels `[B]` (i64).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The batch's epoch and number within it.
    pub position: LoaderPosition,
    /// The dataset indices of its samples, in order.
    pub indices: Vec<u64>,
    /// The (augmented) samples' values, `[B, ..sample_shape]`, f32.
    pub values: Tensor,
    /// The samples' labels, `[B]`, i64.
    pub labels: Tensor,
}

/// Loads the batches of one rank, with worker threads or in the calling thread.
pub struct DataLoader {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// The calling thread's epoch cache, for `workers = 0`.
    inline_cache: EpochCache,
    /// Batches handed to the consumer so far.
    delivered: u64,
}

/// What the loader and its workers share.
struct Shared {
    maker: BatchMaker,
    num_batches: u64,
    /// Batches that may be claimed beyond those delivered.
    window: u64,
    delivery: Delivery,
    jitter: Option<LoaderJitter>,
    state: Mutex<State>,
    /// Workers wait here for a prefetch slot.
    slot_freed: Condvar,
    /// The consumer waits here for a batch.
    batch_ready: Condvar,
}

/// The loader's queue state, under `Shared::state`.
#[derive(Default)]
struct State {
    /// The next batch number (from the start) a worker will claim.
    next_claim: u64,
    /// Batches handed to the consumer.
    delivered: u64,
    /// Claimed batches still being loaded, by number.
    in_flight: BTreeMap<u64, InFlight>,
    /// Finished batches by number, for sampler order.
    reorder: BTreeMap<u64, Batch>,
    /// Finished batches as they finished, for completion order.
    completed: VecDeque<Batch>,
    /// The first worker that panicked and its message.
    failure: Option<(usize, String)>,
    /// Set by `Drop` or a failure: workers leave.
    stopping: bool,
}

/// A batch being loaded. Its samples are handed out one at a time, to the worker that claimed
/// it or to idle workers that help: in sampler order, a batch whose worker was descheduled
/// would otherwise hold back every later batch once the prefetch window is full.
struct InFlight {
    position: LoaderPosition,
    indices: Vec<u64>,
    /// Samples handed out so far, in order.
    handed_out: usize,
    /// Loaded samples, by place in the batch.
    samples: Vec<Option<Sample>>,
    /// How many of `samples` are loaded.
    loaded: usize,
}

/// What an idle worker does next.
enum Job {
    /// Claim batch `n` (the next one in order) and load it.
    Claim(u64),
    /// Load the remaining samples of in-flight batch `n`.
    Help(u64),
}

/// Computes the batches of a loader: the same work whichever thread runs it.
struct BatchMaker {
    dataset: Arc<dyn Dataset>,
    sampler: BatchSampler,
    augmenter: Augmenter,
    start: LoaderPosition,
    samples_loaded: AtomicU64,
}

/// A thread's copy of the current epoch's indices: rebuilt only when the epoch changes.
#[derive(Default)]
struct EpochCache {
    epoch: Option<u64>,
    indices: Vec<u64>,
}

/// A worker's jitter: its stream coordinates, and how many samples it has loaded.
struct Jitter {
    config: LoaderJitter,
    worker: u64,
    samples: u64,
}

impl Jitter {
    fn sleep(&mut self) {
        let max = u64::try_from(self.config.max_delay.as_nanos()).unwrap_or(u64::MAX);
        let mut rng = derive_stream(
            self.config.seed,
            Stream::User(JITTER_STREAM),
            self.worker,
            self.samples,
        );
        self.samples += 1;
        if max > 0 {
            std::thread::sleep(Duration::from_nanos(rng.below(max.saturating_add(1))));
        }
    }
}

impl BatchMaker {
    /// Batch `n` from the start: its position and sample indices.
    fn plan(&self, n: u64, cache: &mut EpochCache) -> (LoaderPosition, Vec<u64>) {
        let position = self.start.after(n, self.sampler.batches_per_epoch());
        if cache.epoch != Some(position.epoch) {
            cache.indices = self.sampler.sampler().epoch_indices(position.epoch);
            cache.epoch = Some(position.epoch);
        }
        let indices = cache.indices[self.sampler.batch_range(position.batch)].to_vec();
        (position, indices)
    }

    /// Sample `index` of `epoch`, loaded and augmented (after the jitter's sleep, if any).
    fn load(&self, index: u64, epoch: u64, jitter: Option<&mut Jitter>) -> Sample {
        if let Some(jitter) = jitter {
            jitter.sleep();
        }
        let mut sample = self.dataset.get(index);
        self.samples_loaded.fetch_add(1, Ordering::Relaxed);
        let shape = self.dataset.sample_shape();
        assert_eq!(
            sample.values.len(),
            shape.iter().product::<usize>(),
            "sample {index} holds {} values, but the dataset's sample shape is {shape:?}",
            sample.values.len()
        );
        self.augmenter.apply(&mut sample, epoch, index);
        sample
    }

    /// The batch at `position` from its samples, in order.
    fn collate(
        &self,
        position: LoaderPosition,
        indices: Vec<u64>,
        samples: impl ExactSizeIterator<Item = Sample>,
    ) -> Batch {
        let shape = self.dataset.sample_shape();
        let mut values = Vec::with_capacity(samples.len() * shape.iter().product::<usize>());
        let mut labels = Vec::with_capacity(samples.len());
        for sample in samples {
            values.extend_from_slice(&sample.values);
            labels.push(sample.label);
        }
        let mut batch_shape = vec![indices.len()];
        batch_shape.extend_from_slice(shape);
        let values = Tensor::new(batch_shape, TensorData::F32(values))
            .expect("every sample holds sample_shape's values");
        Batch {
            position,
            indices,
            values,
            labels: Tensor::from_vec(labels),
        }
    }

    /// Batch `n` from the start, loaded in the calling thread.
    fn make(&self, n: u64, cache: &mut EpochCache) -> Batch {
        let (position, indices) = self.plan(n, cache);
        let samples: Vec<Sample> = indices
            .iter()
            .map(|&index| self.load(index, position.epoch, None))
            .collect();
        self.collate(position, indices, samples.into_iter())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic never happens while the lock is held (workers catch theirs outside it), but a
        // poisoned lock must not turn a reported failure into a second panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops every worker and wakes everyone waiting.
    fn stop(&self, state: &mut State) {
        state.stopping = true;
        self.slot_freed.notify_all();
        self.batch_ready.notify_all();
    }

    /// A worker's loop: claim the next batch when a prefetch slot is free, or else help with the
    /// oldest batch that has samples left to hand out, or else wait for a slot.
    fn work(&self, worker: usize) {
        let mut cache = EpochCache::default();
        let mut jitter = self.jitter.map(|config| Jitter {
            config,
            worker: worker as u64,
            samples: 0,
        });
        loop {
            let Some(job) = self.next_job() else {
                return;
            };
            let n = match job {
                Job::Claim(n) => {
                    // The epoch's permutation is built outside the lock.
                    let (position, indices) = self.maker.plan(n, &mut cache);
                    let in_flight = InFlight {
                        position,
                        samples: (0..indices.len()).map(|_| None).collect(),
                        indices,
                        handed_out: 0,
                        loaded: 0,
                    };
                    self.lock().in_flight.insert(n, in_flight);
                    n
                }
                Job::Help(n) => n,
            };
            if !self.load_samples(n, jitter.as_mut()) {
                return;
            }
        }
    }

    /// What this worker does next, or `None` when it should leave.
    fn next_job(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.stopping {
                return None;
            }
            let claimable = state.next_claim < self.num_batches;
            if claimable && state.next_claim < state.delivered.saturating_add(self.window) {
                state.next_claim += 1;
                return Some(Job::Claim(state.next_claim - 1));
            }
            let unfinished = state
                .in_flight
                .iter()
                .find(|(_, batch)| batch.handed_out < batch.indices.len());
            if let Some((&n, _)) = unfinished {
                return Some(Job::Help(n));
            }
            if !claimable {
                return None;
            }
            state = self
                .slot_freed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Loads samples of in-flight batch `n` until none is left to hand out; whoever loads a
    /// batch's last sample collates and hands it in. `false` when the loader is stopping.
    fn load_samples(&self, n: u64, mut jitter: Option<&mut Jitter>) -> bool {
        loop {
            let (slot, index, epoch) = {
                let mut state = self.lock();
                if state.stopping {
                    return false;
                }
                let Some(batch) = state.in_flight.get_mut(&n) else {
                    return true;
                };
                if batch.handed_out == batch.indices.len() {
                    return true;
                }
                batch.handed_out += 1;
                let slot = batch.handed_out - 1;
                (slot, batch.indices[slot], batch.position.epoch)
            };
            let sample = self.maker.load(index, epoch, jitter.as_deref_mut());
            let mut state = self.lock();
            let batch = state
                .in_flight
                .get_mut(&n)
                .expect("a batch stays in flight until its last sample is loaded");
            batch.samples[slot] = Some(sample);
            batch.loaded += 1;
            if batch.loaded < batch.indices.len() {
                continue;
            }
            let batch = state.in_flight.remove(&n).expect("found above");
            drop(state);
            let samples = batch
                .samples
                .into_iter()
                .map(|sample| sample.expect("every sample is loaded"));
            let batch = self.maker.collate(batch.position, batch.indices, samples);
            self.hand_in(n, batch);
        }
    }

    /// Hands finished batch `n` to the consumer's side.
    fn hand_in(&self, n: u64, batch: Batch) {
        let mut state = self.lock();
        match self.delivery {
            Delivery::SamplerOrder => {
                // Only the batch the consumer waits for is worth waking it for.
                let wanted = n == state.delivered;
                state.reorder.insert(n, batch);
                if wanted {
                    self.batch_ready.notify_one();
                }
            }
            Delivery::CompletionOrder => {
                state.completed.push_back(batch);
                self.batch_ready.notify_one();
            }
        }
    }
}

impl DataLoader {
    /// Delivers `num_batches` batches starting at `start` (continuing into later epochs).
    /// `workers = 0` loads in the calling thread inside [`DataLoader::next_batch`]. Otherwise
    /// `workers` threads prefetch up to `workers · prefetch_per_worker` batches ahead, claiming
    /// batch numbers from a shared counter (any idle worker takes the next batch, or, when it
    /// cannot, helps with the oldest batch's remaining samples). Nothing before
    /// `start` is loaded (a restart does not redo earlier batches' loading work), and nothing
    /// beyond `start + num_batches`.
    ///
    /// # Errors
    /// [`DataError::Invalid`]: a sampler over another number of samples than the dataset's
    /// (`sampler`), an augmenter built for another sample shape (`augment`), `start.batch` not
    /// below the batches per epoch (`start.batch`), `prefetch_per_worker` 0; and
    /// [`DataError::Spawn`] if a worker thread cannot start.
    pub fn new(
        dataset: Arc<dyn Dataset>,
        sampler: BatchSampler,
        augmenter: Augmenter,
        config: LoaderConfig,
        start: LoaderPosition,
        num_batches: u64,
    ) -> Result<Self, DataError> {
        if sampler.sampler().len() != dataset.len() {
            return Err(DataError::invalid(
                "sampler",
                format!(
                    "the sampler covers {} samples, but the dataset holds {}",
                    sampler.sampler().len(),
                    dataset.len()
                ),
            ));
        }
        augmenter.check_shape(dataset.sample_shape())?;
        let per_epoch = sampler.batches_per_epoch();
        if start.batch >= per_epoch {
            return Err(DataError::invalid(
                "start.batch",
                format!(
                    "{} is not below the {per_epoch} batches of an epoch",
                    start.batch
                ),
            ));
        }
        if config.prefetch_per_worker == 0 {
            return Err(DataError::invalid(
                "prefetch_per_worker",
                "must be at least 1",
            ));
        }
        let window = (config.workers as u64).saturating_mul(config.prefetch_per_worker as u64);
        let shared = Arc::new(Shared {
            maker: BatchMaker {
                dataset,
                sampler,
                augmenter,
                start,
                samples_loaded: AtomicU64::new(0),
            },
            num_batches,
            window,
            delivery: config.delivery,
            jitter: config.jitter,
            state: Mutex::new(State::default()),
            slot_freed: Condvar::new(),
            batch_ready: Condvar::new(),
        });
        let mut loader = DataLoader {
            shared,
            workers: Vec::with_capacity(config.workers),
            inline_cache: EpochCache::default(),
            delivered: 0,
        };
        for worker in 0..config.workers {
            let shared = Arc::clone(&loader.shared);
            let spawned = std::thread::Builder::new()
                .name(format!("detcheck-loader-{worker}"))
                .spawn(move || {
                    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| shared.work(worker))) {
                        let mut state = shared.lock();
                        state
                            .failure
                            .get_or_insert_with(|| (worker, panic_message(payload.as_ref())));
                        shared.stop(&mut state);
                    }
                });
            // On an error, dropping `loader` stops and joins the workers already started.
            loader
                .workers
                .push(spawned.map_err(|source| DataError::Spawn { worker, source })?);
        }
        Ok(loader)
    }

    /// The next batch: in [`Delivery::SamplerOrder`] always the next one in the sampler's order
    /// whatever the workers' timing (a reorder buffer); in [`Delivery::CompletionOrder`] whichever
    /// batch a worker finished first. `Ok(None)` after `num_batches`.
    ///
    /// # Errors
    /// [`DataError::WorkerPanicked`] if a worker panicked (the other workers stop; this never
    /// hangs). Every later call returns the same error.
    pub fn next_batch(&mut self) -> Result<Option<Batch>, DataError> {
        let shared = Arc::clone(&self.shared);
        let failed = |(worker, message): &(usize, String)| DataError::WorkerPanicked {
            worker: *worker,
            message: message.clone(),
        };
        if self.workers.is_empty() {
            if self.delivered >= shared.num_batches {
                return Ok(None);
            }
            let batch = shared.maker.make(self.delivered, &mut self.inline_cache);
            self.delivered += 1;
            return Ok(Some(batch));
        }
        let mut state = shared.lock();
        loop {
            if let Some(failure) = &state.failure {
                return Err(failed(failure));
            }
            if state.delivered >= shared.num_batches {
                return Ok(None);
            }
            let ready = match shared.delivery {
                Delivery::SamplerOrder => {
                    let wanted = state.delivered;
                    state.reorder.remove(&wanted)
                }
                Delivery::CompletionOrder => state.completed.pop_front(),
            };
            if let Some(batch) = ready {
                state.delivered += 1;
                self.delivered = state.delivered;
                // One slot freed: one waiting worker can claim one more batch.
                shared.slot_freed.notify_one();
                return Ok(Some(batch));
            }
            state = shared
                .batch_ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Position of the next batch to deliver (for checkpoints): the start advanced by the
    /// batches delivered so far.
    #[must_use]
    pub fn position(&self) -> LoaderPosition {
        let maker = &self.shared.maker;
        maker
            .start
            .after(self.delivered, maker.sampler.batches_per_epoch())
    }

    /// Samples loaded (`Dataset::get` calls) so far, by all workers.
    #[must_use]
    pub fn samples_loaded(&self) -> u64 {
        self.shared.maker.samples_loaded.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for DataLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataLoader")
            .field("workers", &self.workers.len())
            .field("position", &self.position())
            .field("num_batches", &self.shared.num_batches)
            .finish_non_exhaustive()
    }
}

impl Drop for DataLoader {
    /// Stops the workers, wakes them and joins them: a worker in the middle of a batch leaves
    /// before its next sample, so this does not wait for the rest of the prefetch.
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            self.shared.stop(&mut state);
        }
        for worker in self.workers.drain(..) {
            // Workers catch their own panics, so joining cannot fail.
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{AugmentRng, Augmentation, DistributedSampler, SyntheticImages};
    use crate::value::seed::RankRng;
    use std::sync::mpsc;
    use std::time::Instant;

    /// 64 images of 3×8×8; rank 1 of 2 gets 32 a epoch: batches of 6, the last one of 2.
    fn images() -> Arc<dyn Dataset> {
        Arc::new(SyntheticImages::new(11, 64, 3, 8, 8, 10))
    }

    fn rank_batches(len: u64, batch_size: usize) -> BatchSampler {
        let sampler = DistributedSampler::new(len, 2, 1, 5, true, false).unwrap();
        BatchSampler::new(sampler, batch_size, false).unwrap()
    }

    fn crop_flip_noise() -> Augmentation {
        Augmentation {
            crop_padding: 2,
            flip: true,
            noise_std: 0.1,
        }
    }

    fn per_sample() -> Augmenter {
        Augmenter::new(
            crop_flip_noise(),
            AugmentRng::PerSample { seed: 3 },
            &[3, 8, 8],
        )
        .unwrap()
    }

    fn jitter(seed: u64) -> LoaderJitter {
        LoaderJitter {
            seed,
            max_delay: Duration::from_micros(200),
        }
    }

    fn load(
        dataset: &Arc<dyn Dataset>,
        sampler: &BatchSampler,
        augmenter: &Augmenter,
        config: LoaderConfig,
        start: LoaderPosition,
        num_batches: u64,
    ) -> (Vec<Batch>, u64) {
        let mut loader = DataLoader::new(
            Arc::clone(dataset),
            sampler.clone(),
            augmenter.clone(),
            config,
            start,
            num_batches,
        )
        .unwrap();
        let mut batches = Vec::new();
        while let Some(batch) = loader.next_batch().unwrap() {
            batches.push(batch);
            assert_eq!(
                loader.position(),
                start.after(batches.len() as u64, sampler.batches_per_epoch())
            );
        }
        assert_eq!(loader.next_batch().unwrap(), None, "stays finished");
        (batches, loader.samples_loaded())
    }

    fn positions(batches: &[Batch]) -> Vec<LoaderPosition> {
        batches.iter().map(|b| b.position).collect()
    }

    /// Runs `f` on a thread and fails the test if it takes longer than `limit` (a hang).
    fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (send, receive) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = send.send(f());
        });
        receive
            .recv_timeout(limit)
            .expect("finished in time: nothing hangs")
    }

    /// Batches are each sample's `get` + `apply`, collated: checks the reference itself.
    #[test]
    fn batches_collate_augmented_samples_in_sampler_order() {
        let (dataset, sampler, augmenter) = (images(), rank_batches(64, 6), per_sample());
        let (batches, loaded) = load(
            &dataset,
            &sampler,
            &augmenter,
            LoaderConfig::new(0),
            LoaderPosition::default(),
            7,
        );
        assert_eq!(
            loaded,
            32 + 6,
            "one epoch of 32 samples, then one batch of 6"
        );
        let epoch0 = sampler.sampler().epoch_indices(0);
        assert_eq!(batches[5].indices, epoch0[30..32], "the short last batch");
        assert_eq!(batches[5].values.shape(), [2, 3, 8, 8]);
        assert_eq!(batches[6].position, LoaderPosition { epoch: 1, batch: 0 });
        for batch in &batches {
            let mut values = Vec::new();
            let mut labels = Vec::new();
            for &index in &batch.indices {
                let mut sample = dataset.get(index);
                augmenter.apply(&mut sample, batch.position.epoch, index);
                values.extend(sample.values);
                labels.push(sample.label);
            }
            assert_eq!(batch.values.values::<f32>().unwrap(), values);
            assert_eq!(batch.labels.values::<i64>().unwrap(), labels);
            assert_eq!(batch.labels.shape(), [batch.indices.len()]);
        }
    }

    /// The determinism guarantee: same bits for 0, 1, 2 and 4 workers under jitter, over
    /// 2.5 epochs, with and without per-sample augmentation.
    #[test]
    fn batches_do_not_depend_on_workers_or_timing() {
        let (dataset, sampler) = (images(), rank_batches(64, 6));
        for augmenter in [Augmenter::none(), per_sample()] {
            let start = LoaderPosition::default();
            let config = LoaderConfig::new(0);
            let (reference, _) = load(&dataset, &sampler, &augmenter, config, start, 15);
            assert_eq!(reference.last().unwrap().position.epoch, 2);
            for (run, workers) in [1, 2, 4, 2, 4].into_iter().enumerate() {
                let config = LoaderConfig::new(workers).with_jitter(jitter(run as u64));
                let (batches, loaded) = load(&dataset, &sampler, &augmenter, config, start, 15);
                assert!(
                    batches == reference,
                    "{workers} workers (run {run}) delivered other batches"
                );
                assert_eq!(loaded, 2 * 32 + 3 * 6, "every sample loaded once");
            }
        }
    }

    /// Negative control: delivery as workers finish changes the order in every run.
    ///
    /// Sizes: 32 batches of 4 samples. With 16 batches of 8, 2 in 300 (9 in 1000 with the
    /// cores busy) loaders still delivered in sampler order: a sum of 8 delays varies by ~20%,
    /// so workers started one after another tend to finish one after another. With 32 batches
    /// of 4, none in 1000 did, idle or busy.
    #[test]
    fn completion_order_differs_from_sampler_order_under_jitter() {
        let dataset: Arc<dyn Dataset> = Arc::new(SyntheticImages::new(2, 256, 1, 4, 4, 3));
        let sampler = rank_batches(256, 4); // 128 per rank: 32 batches of 4
        let start = LoaderPosition::default();
        let augmenter = Augmenter::none();
        let (reference, _) = load(
            &dataset,
            &sampler,
            &augmenter,
            LoaderConfig::new(0),
            start,
            32,
        );
        for seed in 0..10 {
            let config = LoaderConfig::new(4)
                .with_delivery(Delivery::CompletionOrder)
                .with_jitter(jitter(100 + seed));
            let (mut batches, _) = load(&dataset, &sampler, &augmenter, config, start, 32);
            assert_ne!(
                positions(&batches),
                positions(&reference),
                "loader {seed} delivered in sampler order"
            );
            // The same batches, only in another order.
            batches.sort_by_key(|b| b.position);
            assert!(batches == reference, "loader {seed} changed a batch");
        }
    }

    /// Negative control: one generator shared by the workers gives samples other draws.
    #[test]
    fn a_shared_augmentation_generator_changes_values_with_workers() {
        let (dataset, sampler) = (images(), rank_batches(64, 6));
        let start = LoaderPosition::default();
        let shared = || {
            let rng: RankRng = derive_stream(3, Stream::Augment, 0, 0);
            let rng = AugmentRng::Shared(Arc::new(Mutex::new(rng)));
            Augmenter::new(crop_flip_noise(), rng, &[3, 8, 8]).unwrap()
        };
        let (reference, _) = load(
            &dataset,
            &sampler,
            &shared(),
            LoaderConfig::new(0),
            start,
            12,
        );
        // A fresh generator with the same seed and one thread repeats itself: the control is
        // about timing, not about the generator.
        let (again, _) = load(
            &dataset,
            &sampler,
            &shared(),
            LoaderConfig::new(0),
            start,
            12,
        );
        assert!(again == reference);
        for run in 0..10 {
            let workers = if run % 2 == 0 { 2 } else { 4 };
            let config = LoaderConfig::new(workers).with_jitter(jitter(run));
            let (batches, _) = load(&dataset, &sampler, &shared(), config, start, 12);
            assert_eq!(positions(&batches), positions(&reference));
            let values = |b: &[Batch]| b.iter().map(|b| b.values.clone()).collect::<Vec<_>>();
            assert_ne!(
                values(&batches),
                values(&reference),
                "run {run} with {workers} workers drew in sampler order"
            );
        }
    }

    /// Restart from a checkpointed position: the same batches as a continuous run, and only
    /// those batches' samples loaded, also across an epoch boundary (6 batches an epoch).
    #[test]
    fn a_restarted_loader_continues_without_reloading_earlier_batches() {
        let (dataset, sampler, augmenter) = (images(), rank_batches(64, 6), per_sample());
        let origin = LoaderPosition::default();
        let config = LoaderConfig::new(2);
        let (continuous, _) = load(&dataset, &sampler, &augmenter, config, origin, 15);
        for done in [1, 4, 5, 6, 9, 14] {
            let start = origin.after(done, 6);
            let rest = &continuous[done as usize..];
            let expected_loads: usize = rest.iter().map(|b| b.indices.len()).sum();
            for workers in [0, 2] {
                let config = LoaderConfig::new(workers).with_jitter(jitter(done));
                let (batches, loaded) =
                    load(&dataset, &sampler, &augmenter, config, start, 15 - done);
                assert!(batches == rest, "restart at {start:?}, {workers} workers");
                assert_eq!(
                    loaded, expected_loads as u64,
                    "restart at {start:?}, {workers} workers: samples loaded"
                );
            }
        }
    }

    /// Panics at one index of the dataset.
    struct PanickingAt {
        inner: SyntheticImages,
        index: u64,
    }

    impl Dataset for PanickingAt {
        fn len(&self) -> u64 {
            self.inner.len()
        }
        fn sample_shape(&self) -> &[usize] {
            self.inner.sample_shape()
        }
        fn get(&self, index: u64) -> Sample {
            assert_ne!(index, self.index, "planted failure at sample {index}");
            self.inner.get(index)
        }
    }

    #[test]
    fn a_panicking_worker_is_reported_and_nothing_hangs() {
        let sampler = rank_batches(64, 6);
        let bad = sampler.sampler().epoch_indices(0)[15]; // batch 2
        let outcome = within(Duration::from_secs(60), move || {
            let dataset = Arc::new(PanickingAt {
                inner: SyntheticImages::new(11, 64, 3, 8, 8, 10),
                index: bad,
            });
            let config = LoaderConfig::new(2).with_jitter(jitter(1));
            let mut loader = DataLoader::new(
                dataset,
                sampler,
                Augmenter::none(),
                config,
                LoaderPosition::default(),
                30,
            )
            .unwrap();
            let mut delivered = 0;
            let error = loop {
                match loader.next_batch() {
                    Ok(Some(_)) => delivered += 1,
                    Ok(None) => panic!("the loader finished despite the panic"),
                    Err(error) => break error,
                }
            };
            let again = loader.next_batch().unwrap_err().to_string();
            drop(loader);
            (delivered, error, again)
        });
        let (delivered, error, again) = outcome;
        assert!(delivered <= 2, "batch 2 and later never arrive");
        let DataError::WorkerPanicked { worker, message } = &error else {
            panic!("expected a worker panic, got {error:?}");
        };
        assert!(*worker < 2);
        assert!(
            message.contains(&format!("planted failure at sample {bad}")),
            "{message}"
        );
        assert_eq!(again, error.to_string());
        assert!(error.to_string().starts_with("loader worker "), "{error}");
    }

    /// Holds back one sample until opened, as a descheduled worker would.
    struct GatedAt {
        inner: SyntheticImages,
        index: u64,
        open: Mutex<bool>,
        opened: Condvar,
    }

    impl Dataset for GatedAt {
        fn len(&self) -> u64 {
            self.inner.len()
        }
        fn sample_shape(&self) -> &[usize] {
            self.inner.sample_shape()
        }
        fn get(&self, index: u64) -> Sample {
            if index == self.index {
                let open = self.open.lock().unwrap();
                drop(self.opened.wait_while(open, |open| !*open).unwrap());
            }
            self.inner.get(index)
        }
    }

    /// A stuck sample holds back only itself: the other worker loads the window's other
    /// batches, then the rest of the stuck batch, and the batches are still the reference's.
    #[test]
    fn idle_workers_help_with_a_held_back_batch() {
        let sampler = rank_batches(64, 6);
        let stuck = sampler.sampler().epoch_indices(0)[0]; // the first sample of batch 0
        let gated = Arc::new(GatedAt {
            inner: SyntheticImages::new(11, 64, 3, 8, 8, 10),
            index: stuck,
            open: Mutex::new(false),
            opened: Condvar::new(),
        });
        let (reference, _) = load(
            &images(),
            &sampler,
            &per_sample(),
            LoaderConfig::new(0),
            LoaderPosition::default(),
            10,
        );
        let dataset: Arc<dyn Dataset> = gated.clone();
        let loaded = within(Duration::from_secs(60), move || {
            // 2 workers, window 4: batches 0-3 may be claimed while batch 0 is held back.
            let mut loader = DataLoader::new(
                dataset,
                sampler,
                per_sample(),
                LoaderConfig::new(2),
                LoaderPosition::default(),
                10,
            )
            .unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while loader.samples_loaded() < 4 * 6 - 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let loaded_while_stuck = loader.samples_loaded();
            *gated.open.lock().unwrap() = true;
            gated.opened.notify_all();
            let mut batches = Vec::new();
            while let Some(batch) = loader.next_batch().unwrap() {
                batches.push(batch);
            }
            assert!(batches == reference, "helping changed a batch");
            loaded_while_stuck
        });
        assert_eq!(loaded, 4 * 6 - 1, "all but the stuck sample of the window");
    }

    #[test]
    fn dropping_a_loader_early_stops_its_workers_promptly() {
        for delivered in [0, 1, 3] {
            let loaded = within(Duration::from_secs(60), move || {
                let config = LoaderConfig::new(4).with_jitter(jitter(delivered));
                let mut loader = DataLoader::new(
                    images(),
                    rank_batches(64, 6),
                    per_sample(),
                    config,
                    LoaderPosition::default(),
                    10_000,
                )
                .unwrap();
                for _ in 0..delivered {
                    loader.next_batch().unwrap().unwrap();
                }
                let started = Instant::now();
                let loaded = loader.samples_loaded();
                drop(loader);
                assert!(started.elapsed() < Duration::from_secs(10));
                loaded
            });
            // Prefetch is bounded: delivered batches plus at most 4 · 2 in flight.
            assert!(loaded <= (delivered + 8) * 6, "{loaded} samples loaded");
        }
    }

    #[test]
    fn bad_settings_name_their_field() {
        let field = |dataset: Arc<dyn Dataset>, augmenter, config, start| match DataLoader::new(
            dataset,
            rank_batches(64, 6),
            augmenter,
            config,
            start,
            1,
        ) {
            Err(DataError::Invalid { field, .. }) => field,
            other => panic!("expected a rejection, got {other:?}"),
        };
        let origin = LoaderPosition::default();
        let config = LoaderConfig::new(1);
        let other_len: Arc<dyn Dataset> = Arc::new(SyntheticImages::new(1, 65, 3, 8, 8, 2));
        let other_shape: Arc<dyn Dataset> = Arc::new(SyntheticImages::new(1, 64, 3, 4, 4, 2));
        assert_eq!(
            field(other_len, Augmenter::none(), config, origin),
            "sampler"
        );
        assert_eq!(field(other_shape, per_sample(), config, origin), "augment");
        let past = LoaderPosition { epoch: 0, batch: 6 };
        assert_eq!(
            field(images(), Augmenter::none(), config, past),
            "start.batch"
        );
        let no_prefetch = LoaderConfig {
            prefetch_per_worker: 0,
            ..config
        };
        assert_eq!(
            field(images(), Augmenter::none(), no_prefetch, origin),
            "prefetch_per_worker"
        );
    }

    #[test]
    fn config_builders_and_delivery_names() {
        let config = LoaderConfig::new(3)
            .with_delivery(Delivery::CompletionOrder)
            .with_jitter(jitter(9));
        assert_eq!(config.workers, 3);
        assert_eq!(config.prefetch_per_worker, 2);
        assert_eq!(config.delivery, Delivery::CompletionOrder);
        assert_eq!(config.jitter, Some(jitter(9)));
        assert_eq!(LoaderConfig::new(1).delivery, Delivery::SamplerOrder);
        assert_eq!(
            serde_json::to_string(&Delivery::CompletionOrder).unwrap(),
            r#""completion_order""#
        );
    }
}
