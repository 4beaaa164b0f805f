//! The built-in scenario kinds: `seed`, `collective`, `dataloader`, `train` and `scatter`.
//!
//! Each kind reads its `params` (unknown fields rejected) and may plant a source of
//! nondeterminism on purpose (`params.plant`) to serve as a negative control.

mod collective;
mod dataloader;
mod scatter;
mod seed;
mod train;

use super::limits::{size, size_in_range, MAX_WORKERS};
use super::{KindRegistry, ParamError, Scenario};
use std::sync::Arc;

pub(super) fn register(registry: &mut KindRegistry) {
    registry.register("seed", |spec| build(seed::SeedScenario::from_spec(spec)));
    registry.register("collective", |spec| {
        build(collective::CollectiveScenario::from_spec(spec))
    });
    registry.register("dataloader", |spec| {
        build(dataloader::DataLoaderScenario::from_spec(spec))
    });
    registry.register("train", |spec| build(train::TrainScenario::from_spec(spec)));
    registry.register("scatter", |spec| {
        build(scatter::ScatterScenario::from_spec(spec))
    });
}

fn build<S: Scenario + 'static>(
    scenario: Result<S, ParamError>,
) -> Result<Arc<dyn Scenario>, ParamError> {
    Ok(Arc::new(scenario?))
}

/// Rejects a size or count `value` of `field` below `minimum` or above
/// [`MAX_SIZE`](crate::scenario::limits::MAX_SIZE).
fn size_param(field: &str, value: usize, minimum: u64) -> Result<(), ParamError> {
    size_in_range(field, size(value), minimum)
}

/// Rejects a loader's `params.workers` above [`MAX_WORKERS`].
fn workers_param(workers: usize) -> Result<(), ParamError> {
    if workers > MAX_WORKERS {
        return Err(ParamError::new(
            "params.workers",
            format!("must be at most {MAX_WORKERS}, got {workers}"),
        ));
    }
    Ok(())
}

/// The field of the largest of `factors`, which name a part of a footprint: the one to lower.
fn largest_field(factors: &[(&'static str, u64)]) -> &'static str {
    factors
        .iter()
        .fold(
            None::<(&'static str, u64)>,
            |best, &(field, value)| match best {
                Some((_, most)) if most >= value => best,
                _ => Some((field, value)),
            },
        )
        .map_or("params", |(field, _)| field)
}

/// A seed mixed with OS entropy: a planted fault, never used on a deterministic path.
fn os_entropy() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // std seeds every RandomState from the OS's random source.
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}
