//! The scenario file as written ([`ScenarioSpec`]), its parsing and validation, and the check
//! vocabulary it uses ([`CheckKind`], [`Expectation`]).
//!
//! Bad input: unknown fields are rejected, a struct is read from a JSON object only (never from
//! an array of its fields, `file::strict`), and every error names the field ([`ParamError`]).
//!
//! Invariant (bad input is an error naming the file and field; here and in `scenario/registry.rs`):
//! unknown fields are rejected; a struct is read from a JSON object only, never from an array of
//! its fields (`file/strict.rs`, at every depth, a user kind's params included); nothing panics on
//! a bad file. Every size is bounded before any rank starts (`scenario/limits.rs`): a maximum per
//! field, and the run's estimate (each kind's `footprint`, in saturating arithmetic) against the
//! memory available.
//!
//! Determinism: a spec's [`fingerprint`](ScenarioSpec::fingerprint) is a pure function of its
//! kind, effective reduction and parameters.

use crate::scenario::limits::{
    MAX_BATCH_SIZE, MAX_NAME_BYTES, MAX_STEPS, MAX_WORKERS, MAX_WORLD_SIZE,
};
use crate::value::reduce::ReductionMode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A check a scenario can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CheckKind {
    /// Two perturbed runs of one configuration give identical records.
    Repeat,
    /// Replicated records are identical on every rank.
    Replicas,
    /// A run on MPI ranks gives the same records as the same run on thread ranks.
    Backends,
    /// Runs at each of the spec's `world_sizes` give identical replicated records (loss,
    /// gradients, parameters): the bits do not depend on the number of ranks.
    WorldSizes,
    /// Runs with each of the spec's `workers` data-loader worker counts give identical records.
    Workers,
    /// A run checkpointed at step k and resumed in a fresh launch gives the continuous run's
    /// records from step k on (and before it).
    Restart,
    /// A run under each of the spec's `variants` (settings that must not change the bits: an
    /// environment variable, a thread count, a loader's workers) gives the first run's records.
    Variants,
    /// Runs with each of the spec's `buckets` layouts (the same gradients fused into other
    /// allreduce buckets) give identical records: fusion invariance.
    Buckets,
    /// A run whose collectives (and the kind's GPU operators) run on a GPU gives the same
    /// records as the same run on CPU thread ranks (feature `nccl`).
    Devices,
    /// A `command` program run at each of the spec's `batch_sizes` (`{batch}` in its arguments)
    /// gives every sample the first size's records: each sample's rows of every module output,
    /// at step = the sample's place in the stream of samples (batch invariance).
    BatchSizes,
}

/// Where a scenario's ranks compute: the CPU (default) or one GPU shared by its thread ranks
/// (feature `nccl`; under `mpirun`, one GPU per rank through NCCL).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// Host memory and the CPU's arithmetic.
    #[default]
    Cpu,
    /// Device buffers and detcheck's CUDA kernels; a machine without a usable GPU refuses the
    /// scenario (exit code 4).
    Gpu,
}

impl Device {
    /// The name used in scenario files and reports: `cpu`, `gpu`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        }
    }
}

impl CheckKind {
    /// What a record's step is in this check's reports: `step`, or `sample` for
    /// `batch_sizes`, whose recorder writes each sample at its own step.
    #[must_use]
    pub fn step_word(self) -> &'static str {
        match self {
            CheckKind::BatchSizes => "sample",
            _ => "step",
        }
    }
}

impl fmt::Display for CheckKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckKind::Repeat => "repeat",
            CheckKind::Replicas => "replicas",
            CheckKind::Backends => "backends",
            CheckKind::WorldSizes => "world_sizes",
            CheckKind::Workers => "workers",
            CheckKind::Restart => "restart",
            CheckKind::Variants => "variants",
            CheckKind::Buckets => "buckets",
            CheckKind::Devices => "devices",
            CheckKind::BatchSizes => "batch_sizes",
        })
    }
}

/// What a check must find.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expectation {
    /// No divergence.
    Identical,
    /// At least one divergence: a negative control.
    Diverges,
}

/// A scenario file, as written.
///
/// ```json
/// {
///   "kind": "collective", "world_size": 4, "steps": 5, "seed": 1234,
///   "reduction": "ring", "deterministic_comm": true, "expect": "identical",
///   "params": { "elements": 4096 }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioSpec {
    /// Trial name; defaults to the file name without `.json`. At most
    /// [`MAX_NAME_BYTES`](crate::scenario::limits::MAX_NAME_BYTES) bytes, without whitespace,
    /// control characters, `/` or `\`.
    #[serde(default)]
    pub name: Option<String>,
    /// What the scenario shows, for people.
    #[serde(default)]
    pub description: String,
    /// The kind of program: `seed`, `collective`, `dataloader`, `train`, or a registered one.
    pub kind: String,
    /// Number of ranks (at most [`MAX_WORLD_SIZE`](crate::scenario::limits::MAX_WORLD_SIZE)).
    pub world_size: usize,
    /// Number of steps (at most [`MAX_STEPS`](crate::scenario::limits::MAX_STEPS)).
    pub steps: u64,
    /// The seed every random stream derives from.
    pub seed: u64,
    /// The reduction mode of every allreduce (default `ring`).
    #[serde(default = "default_reduction")]
    pub reduction: ReductionMode,
    /// `false` models a job without deterministic communication (HCCL_DETERMINISTIC unset): every
    /// allreduce then adds in arrival order, whatever `reduction` says (default `true`).
    #[serde(default = "default_true")]
    pub deterministic_comm: bool,
    /// What the checks must find: `identical`, or `diverges` for a negative control.
    pub expect: Expectation,
    /// The checks to run; by default `repeat`, plus, when identical, what the kind's
    /// [`Capabilities`](crate::scenario::Capabilities) call for (`replicas`, `workers`, `restart`).
    #[serde(default)]
    pub checks: Vec<CheckKind>,
    /// `true` to run the trial only with `--ignored` (slow scenarios).
    #[serde(default)]
    pub ignored: bool,
    /// The world sizes the `world_sizes` check runs (default 1, 2, 3, 4 and 8).
    #[serde(default = "default_world_sizes")]
    pub world_sizes: Vec<usize>,
    /// The data-loader worker counts the `workers` check runs (default 0, 1, 2 and 4).
    #[serde(default = "default_workers")]
    pub workers: Vec<usize>,
    /// The step the `restart` check checkpoints at and resumes from (default `steps / 2`).
    #[serde(default)]
    pub restart_at: Option<u64>,
    /// The bucket layouts the `buckets` check runs (default: one flat buffer, one bucket per
    /// tensor, buckets of 64 and of 300 elements).
    #[serde(default = "default_buckets")]
    pub buckets: Vec<BucketLayout>,
    /// Settings that must not change the bits, each run and compared with the first run (the
    /// `variants` check).
    #[serde(default)]
    pub variants: Vec<Variant>,
    /// The batch sizes the `batch_sizes` check runs a `command` program at, the first being the
    /// base (`{batch}` in its arguments and `params.env`; default none). Each is between 1 and
    /// [`MAX_BATCH_SIZE`](crate::scenario::limits::MAX_BATCH_SIZE), none twice; every other
    /// check runs the program at the first.
    #[serde(default)]
    pub batch_sizes: Vec<usize>,
    /// The kind's own parameters.
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Where the ranks compute (`cpu` when absent): `gpu` runs every check on the GPU.
    #[serde(default)]
    pub device: Device,
}

/// One setting that must not change the bits: extra environment and arguments (a `command`
/// scenario), and parameters laid over the scenario's `params` (any kind).
///
/// ```json
/// "variants": [{"env": {"OMP_NUM_THREADS": "4"}}, {"args": ["--workers", "2"]},
///              {"params": {"workers": 4}}]
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Environment variables added to the launch (`command` only).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Arguments appended to the command (`command` only).
    #[serde(default)]
    pub args: Vec<String>,
    /// Fields laid over the scenario's `params`.
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

impl Variant {
    /// A short description for reports: `env OMP_NUM_THREADS=4, args --workers 2`.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.env.is_empty() {
            let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            parts.push(format!("env {}", env.join(" ")));
        }
        if !self.args.is_empty() {
            parts.push(format!("args {}", self.args.join(" ")));
        }
        if !self.params.is_empty() {
            let params = serde_json::to_string(&self.params).unwrap_or_default();
            parts.push(format!("params {params}"));
        }
        if parts.is_empty() {
            "no change".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// How a data-parallel program fuses its gradients into allreduce buckets (PyTorch DDP's
/// `bucket_cap_mb`, Megatron's buckets): `"flat"` (one buffer), `"per_tensor"`, or
/// `{"elements": N}` (consecutive buckets of N elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BucketLayout {
    /// Every gradient (and the loss) in one buffer.
    Flat,
    /// One bucket per tensor (the loss in its own).
    PerTensor,
    /// Consecutive buckets of this many elements, the last one shorter.
    Elements(usize),
}

impl BucketLayout {
    /// The buckets of a buffer of `len` elements whose tensors end at `ends` (increasing, the
    /// last one `len`): consecutive ranges covering it.
    #[must_use]
    pub fn buckets(self, len: usize, ends: &[usize]) -> Vec<std::ops::Range<usize>> {
        match self {
            BucketLayout::Flat => std::iter::once(0..len).collect(),
            BucketLayout::PerTensor => {
                let mut buckets = Vec::with_capacity(ends.len());
                let mut start = 0;
                for &end in ends {
                    if end > start {
                        buckets.push(start..end);
                        start = end;
                    }
                }
                buckets
            }
            BucketLayout::Elements(n) => (0..len)
                .step_by(n.max(1))
                .map(|start| start..start.saturating_add(n.max(1)).min(len))
                .collect(),
        }
    }
}

impl fmt::Display for BucketLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BucketLayout::Flat => f.write_str("flat"),
            BucketLayout::PerTensor => f.write_str("per_tensor"),
            BucketLayout::Elements(n) => write!(f, "{n}-element buckets"),
        }
    }
}

fn default_buckets() -> Vec<BucketLayout> {
    vec![
        BucketLayout::Flat,
        BucketLayout::PerTensor,
        BucketLayout::Elements(64),
        BucketLayout::Elements(300),
    ]
}

fn default_reduction() -> ReductionMode {
    ReductionMode::Ring
}

fn default_true() -> bool {
    true
}

fn default_workers() -> Vec<usize> {
    vec![0, 1, 2, 4]
}

fn default_world_sizes() -> Vec<usize> {
    vec![1, 2, 3, 4, 8]
}

impl ScenarioSpec {
    /// The reduction mode the run really uses, after the deterministic-communication switch.
    #[must_use]
    pub fn effective_mode(&self) -> ReductionMode {
        if self.deterministic_comm {
            self.reduction
        } else {
            ReductionMode::ArrivalOrder
        }
    }

    /// The step the `restart` check resumes from: `restart_at`, or half the steps.
    #[must_use]
    pub fn restart_step(&self) -> u64 {
        self.restart_at.unwrap_or(self.steps / 2)
    }

    /// md5 (hex) of the kind, the effective reduction and the parameters: what a checkpoint must
    /// have been written by. Steps, checks and the description may differ.
    #[must_use]
    pub fn fingerprint(&self) -> String {
        use md5::{Digest as _, Md5};
        let params = serde_json::to_string(&self.params).expect("JSON values serialize");
        let text = format!("{}\n{}\n{params}", self.kind, self.effective_mode());
        Md5::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The identity of the checkpoints rank `rank` of a run of this spec writes and reads.
    #[must_use]
    pub fn checkpoint_identity(&self, rank: usize) -> crate::checkpoint::CheckpointIdentity {
        crate::checkpoint::CheckpointIdentity {
            fingerprint: self.fingerprint(),
            seed: self.seed,
            world_size: self.world_size,
            rank,
        }
    }

    /// Parses `params` into the kind's own parameter type, naming the field on error. Every
    /// struct of `P`, at any depth, is read from a JSON object only: one given as an array of
    /// its fields is refused ("expected an object, got an array"), never read by position. (An
    /// internally tagged or untagged enum is read by serde through a buffer where this cannot
    /// be seen; such a field should ask for a map itself.)
    ///
    /// # Errors
    /// A [`ParamError`] whose field starts with `params.`.
    pub fn parse_params<P: DeserializeOwned>(&self) -> Result<P, ParamError> {
        let value = serde_json::Value::Object(self.params.clone());
        // Strict: a struct of the kind's, at any depth, is read from an object only.
        crate::file::strict::from_value(value).map_err(|e| {
            let path = e.path().to_string();
            ParamError {
                field: if path == "." {
                    "params".to_owned()
                } else {
                    format!("params.{path}")
                },
                message: e.into_inner().to_string(),
            }
        })
    }
}

/// A parameter a kind rejected: the field (as `params.x.y`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {message}")]
pub struct ParamError {
    /// The field, as a path from the top of the file.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl ParamError {
    /// A rejection of `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ParamError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Parses scenario JSON, naming the field of the first error.
pub(crate) fn parse_spec(text: &str) -> Result<ScenarioSpec, ParamError> {
    // Strict: the spec and its structs (variants, ...) are read from objects only.
    crate::file::strict::from_slice(text.as_bytes()).map_err(|e| {
        let path = e.path().to_string();
        ParamError::new(
            if path == "." {
                "(top level)".to_owned()
            } else {
                path
            },
            e.into_inner().to_string(),
        )
    })
}

pub(crate) fn validate_common(spec: &ScenarioSpec) -> Result<(), ParamError> {
    if spec.world_size == 0 || spec.world_size > MAX_WORLD_SIZE {
        return Err(ParamError::new(
            "world_size",
            format!(
                "must be between 1 and {MAX_WORLD_SIZE}, got {}",
                spec.world_size
            ),
        ));
    }
    if spec.steps == 0 || spec.steps > MAX_STEPS {
        return Err(ParamError::new(
            "steps",
            format!(
                "must be between 1 and {MAX_STEPS} (a check keeps every step's records in \
                 memory), got {}",
                spec.steps
            ),
        ));
    }
    for (i, &w) in spec.world_sizes.iter().enumerate() {
        if w == 0 || w > MAX_WORLD_SIZE {
            return Err(ParamError::new(
                format!("world_sizes[{i}]"),
                format!("must be between 1 and {MAX_WORLD_SIZE}, got {w}"),
            ));
        }
    }
    for (i, &w) in spec.workers.iter().enumerate() {
        if w > MAX_WORKERS {
            return Err(ParamError::new(
                format!("workers[{i}]"),
                format!("must be at most {MAX_WORKERS}, got {w}"),
            ));
        }
    }
    for (i, &b) in spec.batch_sizes.iter().enumerate() {
        if b == 0 || b > MAX_BATCH_SIZE {
            return Err(ParamError::new(
                format!("batch_sizes[{i}]"),
                format!("must be between 1 and {MAX_BATCH_SIZE}, got {b}"),
            ));
        }
        if spec.batch_sizes[..i].contains(&b) {
            return Err(ParamError::new(
                format!("batch_sizes[{i}]"),
                format!("{b} is listed twice"),
            ));
        }
    }
    for (i, check) in spec.checks.iter().enumerate() {
        if spec.checks[..i].contains(check) {
            return Err(ParamError::new(
                format!("checks[{i}]"),
                format!("`{check}` is listed twice"),
            ));
        }
        if *check == CheckKind::WorldSizes && spec.world_sizes.len() < 2 {
            return Err(ParamError::new(
                "world_sizes",
                "`world_sizes` needs at least two sizes to compare",
            ));
        }
        if *check == CheckKind::Devices && spec.effective_mode() == ReductionMode::ArrivalOrder {
            return Err(ParamError::new(
                format!("checks[{i}]"),
                "`devices` compares a GPU run with a CPU run of the same schedule, but \
                 arrival_order has none: its order is the run's timing",
            ));
        }
        if *check == CheckKind::Backends && !spec.effective_mode().is_backend_independent() {
            return Err(ParamError::new(
                format!("checks[{i}]"),
                format!(
                    "`backends` compares schedules detcheck computes itself (rank_ordered, \
                     ring), but this scenario reduces in {}",
                    spec.effective_mode()
                ),
            ));
        }
    }
    if let Some(name) = &spec.name {
        if name.is_empty() || name.chars().any(char::is_whitespace) {
            return Err(ParamError::new(
                "name",
                "must be non-empty and without whitespace (it is a test name)",
            ));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(ParamError::new(
                "name",
                format!(
                    "must be at most {MAX_NAME_BYTES} bytes (report pages are files named \
                     after it), got {}",
                    name.len()
                ),
            ));
        }
        if name.contains(['/', '\\']) {
            return Err(ParamError::new(
                "name",
                "must not contain `/` or `\\` (report pages are files named after it)",
            ));
        }
        // A NUL cannot be in a file name, and control characters have no place in JUnit's XML.
        if name.chars().any(char::is_control) {
            return Err(ParamError::new(
                "name",
                "must not contain control characters such as NUL (report pages are files named \
                 after it)",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_layouts_cover_the_buffer_in_order() {
        let ends = [6, 8, 11, 12];
        assert_eq!(BucketLayout::Flat.buckets(12, &ends), vec![(0..12)]);
        assert_eq!(
            BucketLayout::PerTensor.buckets(12, &ends),
            [0..6, 6..8, 8..11, 11..12]
        );
        assert_eq!(
            BucketLayout::Elements(5).buckets(12, &ends),
            [0..5, 5..10, 10..12]
        );
        let layouts: Vec<BucketLayout> =
            serde_json::from_str(r#"["flat", "per_tensor", {"elements": 64}]"#).unwrap();
        assert_eq!(
            layouts,
            [
                BucketLayout::Flat,
                BucketLayout::PerTensor,
                BucketLayout::Elements(64)
            ]
        );
    }

    #[test]
    fn device_is_cpu_unless_gpu_and_devices_refuses_arrival_order() {
        let spec = |extra: &str, reduction: &str| {
            let spec = parse_spec(&format!(
                r#"{{"kind": "collective", "world_size": 2, "steps": 1, "seed": 1,
                    "reduction": "{reduction}", "expect": "identical"{extra}}}"#
            ))?;
            validate_common(&spec).map(|()| spec)
        };
        assert_eq!(spec("", "ring").unwrap().device, Device::Cpu);
        let gpu = spec(r#", "device": "gpu", "checks": ["devices"]"#, "ring").unwrap();
        assert_eq!(
            (gpu.device, gpu.checks.as_slice()),
            (Device::Gpu, &[CheckKind::Devices][..])
        );
        let err = spec(r#", "device": "tpu""#, "ring").unwrap_err();
        assert!(err.to_string().contains("device"), "{err}");
        let err = spec(r#", "checks": ["devices"]"#, "arrival_order").unwrap_err();
        assert!(err.to_string().contains("arrival_order has none"), "{err}");
    }
}
