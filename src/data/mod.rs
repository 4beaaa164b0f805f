//! Training data: a dataset, its distributed sampler, per-sample augmentation and a multi-worker
//! loader whose batches do not depend on how many workers load them or how fast.
//!
//! The pieces, in the order data flows through them:
//! - [`Dataset`]: sample `i` as a pure function of `i` ([`SyntheticVectors`], the `train` kind's
//!   data; [`SyntheticImages`], `[C, H, W]` pixels);
//! - [`DistributedSampler`]: this rank's indices of an epoch, as PyTorch's `DistributedSampler`
//!   (a seeded permutation, padded or truncated to a multiple of the world size, strided over
//!   ranks); [`BatchSampler`] cuts them into batches; a [`LoaderPosition`] (epoch, batch) names a
//!   batch and is what a checkpoint stores;
//! - [`Augmenter`]: random crop, flip and noise ([`Augmentation`]), drawing from a stream keyed by
//!   (sample, epoch) ([`AugmentRng::PerSample`]);
//! - [`DataLoader`]: worker threads that prefetch batches and deliver them in sampler order.
//!
//! Invariant (a batch is a function of its position): batch (epoch, b) of a rank depends only on
//! the dataset, the sampler's seed, world size and rank, and the augmentation seed. Augmentation
//! draws from (sample, epoch), never from a worker or the order of work, and `SamplerOrder`
//! delivery goes through a reorder buffer; `CompletionOrder` and `AugmentRng::Shared` are the
//! negative controls. A loader started at a position loads nothing before it.
//!
//! Determinism: the bits of batch `(epoch, b)` are a function of the dataset, the sampler's
//! (seed, world size, rank) and the augmentation seed alone. Which worker loads a batch, how many
//! workers there are, and when they finish change only timing: every random draw is keyed by
//! (sample, epoch), never by worker or by the order of work, and [`Delivery::SamplerOrder`]
//! delivers through a reorder buffer. With a fixed global batch and a dataset length divisible by
//! it, the set of samples in each global batch does not depend on the world size either.
//! Two negative controls break this on purpose: [`Delivery::CompletionOrder`] (batches as workers
//! finish) and [`AugmentRng::Shared`] (one generator consumed in timing order).
//! [`LoaderJitter`] adds seeded sleeps to make timing differ between runs.
//!
//! Limits: samples are `f32` values with an `i64` label; a batch is collated into one tensor
//! (no ragged samples); workers are threads of this process, so a dataset's `get` must be
//! thread-safe and cheap enough to share cores with training.

mod augment;
pub(crate) mod dataset;
mod loader;
mod sampler;

pub use augment::{AugmentRng, Augmentation, Augmenter};
pub use dataset::{Dataset, Sample, SyntheticImages, SyntheticVectors};
pub use loader::{Batch, DataLoader, Delivery, LoaderConfig, LoaderJitter};
pub use sampler::{BatchSampler, DistributedSampler, LoaderPosition};

/// The rank coordinate of streams every rank shares (never a real rank); the same coordinate as
/// `RankContext::shared_stream`, so a dataset here draws what a rank program's shared stream draws.
pub(crate) const SHARED_RANK: u64 = u64::MAX;

/// Why a data pipeline could not be built or could not deliver a batch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A bad setting: the field (as `augment.flip`, `batch_size`, ...) and why.
    #[error("field `{field}`: {message}")]
    Invalid {
        /// The setting, named as in a configuration.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A loader worker panicked (in the dataset or the augmentation); the other workers stopped.
    #[error("loader worker {worker} panicked: {message}")]
    WorkerPanicked {
        /// The worker, from 0.
        worker: usize,
        /// The panic's message.
        message: String,
    },
    /// The operating system refused to start a worker thread.
    #[error("cannot start loader worker {worker}: {source}")]
    Spawn {
        /// The worker, from 0.
        worker: usize,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl DataError {
    /// A rejection of `field`.
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        DataError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}
