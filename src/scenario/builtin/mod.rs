//! The built-in scenario kinds: `seed`, `collective`, `dataloader` and `train`.
//!
//! Each kind reads its `params` (unknown fields rejected) and may plant a source of
//! nondeterminism on purpose (`params.plant`) to serve as a negative control.

mod collective;
mod dataloader;
mod seed;
mod train;

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
}

fn build<S: Scenario + 'static>(
    scenario: Result<S, ParamError>,
) -> Result<Arc<dyn Scenario>, ParamError> {
    Ok(Arc::new(scenario?))
}

/// Rejects `value` of `field` when it is below `minimum`.
fn at_least(field: &str, value: usize, minimum: usize) -> Result<(), ParamError> {
    if value < minimum {
        return Err(ParamError::new(
            field,
            format!("must be at least {minimum}, got {value}"),
        ));
    }
    Ok(())
}

/// A seed mixed with OS entropy: a planted fault, never used on a deterministic path.
fn os_entropy() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // std seeds every RandomState from the OS's random source.
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}
