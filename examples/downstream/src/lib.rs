//! An example of a crate that tests its own rank program with detcheck.
//!
//! [`Histogram`] is a user-defined scenario kind: every rank bins random samples into integer
//! counts and the ranks allreduce the counts. Integer addition is associative, so the counts are
//! identical even when summed in arrival order; the optional float total is not, and needs a
//! deterministic reduction mode. `tests/multirank.rs` registers the kind and runs the files in
//! `scenarios/` with detcheck-harness.
#![forbid(unsafe_code)]

use detcheck::scenario::limits::{bytes_of, size};
use detcheck::scenario::{Footprint, RunPlan};
use detcheck::{
    Capabilities, ParamError, RankContext, RankError, ReduceOp, Scenario, ScenarioSpec, Stream,
    Tensor,
};
use serde::Deserialize;

/// Parameters of the `histogram` kind (the scenario file's `params`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistogramParams {
    /// Samples per rank per step.
    pub samples: usize,
    /// Number of bins over [0, 1).
    pub bins: usize,
    /// Also allreduce the f64 sum of the samples.
    #[serde(default)]
    pub float_total: bool,
}

/// The `histogram` scenario kind.
#[derive(Debug, Clone)]
pub struct Histogram {
    params: HistogramParams,
}

impl Histogram {
    /// Builds the scenario from a spec; the registered factory of the `histogram` kind.
    ///
    /// # Errors
    /// A [`ParamError`] naming the bad field.
    pub fn from_spec(spec: &ScenarioSpec) -> Result<Self, ParamError> {
        let params: HistogramParams = spec.parse_params()?;
        if params.bins == 0 {
            return Err(ParamError::new("params.bins", "must be at least 1"));
        }
        Ok(Histogram { params })
    }
}

impl Scenario for Histogram {
    /// Its allreduced counts are replicated: `replicas` is a default check of its files.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_replicated_records()
    }

    /// What one rank holds: the counts (8 bytes a bin) at most three times over (its own, the
    /// allreduce's buffer, the sum); the samples are drawn one at a time, never held. Two
    /// records a step, three with `float_total`. So a file asking for more bins than the
    /// machine holds is refused when it loads, naming `params.bins`, before any rank allocates.
    fn footprint(&self, _world_size: usize, _plan: &RunPlan) -> Footprint {
        Footprint::default()
            .with_bytes("params.bins", bytes_of(&[size(self.params.bins), 8, 3]))
            .with_records_per_step(if self.params.float_total { 3 } else { 2 })
    }

    fn run_rank(&self, ctx: &mut RankContext<'_>) -> Result<(), RankError> {
        let bins = self.params.bins;
        for step in 0..ctx.steps() {
            let mut rng = ctx.stream(Stream::Data, step);
            let mut counts = vec![0i64; bins];
            let mut total = 0.0f64;
            for _ in 0..self.params.samples {
                let x = rng.uniform_f64();
                counts[((x * bins as f64) as usize).min(bins - 1)] += 1;
                total += x * 1e6;
            }
            let mut counts = Tensor::from_vec(counts);
            ctx.record(step, "local_counts", &counts);
            ctx.allreduce(&mut counts, ReduceOp::Sum)?;
            ctx.record_replicated(step, "counts", &counts);
            if self.params.float_total {
                let mut total = Tensor::from_vec(vec![total]);
                ctx.allreduce(&mut total, ReduceOp::Sum)?;
                ctx.record_replicated(step, "total", &total);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use detcheck::KindRegistry;
    use std::path::Path;
    use std::sync::Arc;

    /// Builds a 4-rank `histogram` scenario with `params`, as the harness would load it.
    fn build(params: &str) -> Result<(), String> {
        let mut registry = KindRegistry::builtin();
        registry.register("histogram", |spec| {
            Ok(Arc::new(Histogram::from_spec(spec)?) as Arc<dyn Scenario>)
        });
        let text = format!(
            r#"{{"kind": "histogram", "world_size": 4, "steps": 2, "seed": 1,
                "reduction": "ring", "deterministic_comm": true, "expect": "identical",
                "params": {params}}}"#
        );
        let spec: ScenarioSpec = serde_json::from_str(&text).unwrap();
        registry
            .build(spec, Path::new("histogram.json"))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// With its footprint, 2^40 bins (26 TB of counts per rank) are refused naming the field;
    /// without it the file loaded and the first rank died allocating them.
    #[test]
    fn bins_beyond_the_machine_are_refused_naming_the_field() {
        build(r#"{"samples": 10, "bins": 16}"#).unwrap();
        let error = build(r#"{"samples": 10, "bins": 1099511627776}"#).unwrap_err();
        assert!(
            error.starts_with("histogram.json: field `params.bins`: the run would hold about"),
            "{error}"
        );
    }
}
