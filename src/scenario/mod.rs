//! Scenarios: deterministic rank programs and the JSON files that configure them.
//!
//! A [`Scenario`] is a rank program: [`Scenario::run_rank`] runs on every rank with a
//! [`RankContext`] (communicator, recorder, seeds). A [`ScenarioSpec`] is a scenario file: world
//! size, steps, seed, reduction mode, the deterministic-communication switch, what is expected, and
//! the kind's own `params`. A [`KindRegistry`] turns a spec into a program; it knows the built-in
//! kinds (`seed`, `collective`, `dataloader`, `train`) and any a user registers.
//! [`discover_scenarios`] loads every `*.json` of a folder, in file-name order. A [`RunPlan`] is
//! what a check changes in one run (loader workers, where to stop, checkpoint, resume).
//!
//! Bad input: unknown fields are rejected, and every error names the file and the field
//! ([`ScenarioError`]); nothing panics on a bad file.
//!
//! Determinism: a program must draw randomness only from [`RankContext::stream`] and
//! [`RankContext::shared_stream`], and combine across ranks only through the communicator. The
//! built-in kinds can plant a source of nondeterminism on purpose (`params.plant`): those are the
//! negative controls.

mod builtin;

use crate::check::{CheckKind, Expectation};
use crate::checkpoint::{self, CheckpointIdentity, RankCheckpoint};
use crate::comm::{CommError, Communicator, Perturbation, RankError};
use crate::data::LoaderJitter;
use crate::reduce::{ReduceOp, ReductionMode};
use crate::seed::{derive_stream, RankRng, Stream};
use crate::tensor::Tensor;
use crate::trace::{RecordLevel, Recorder};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A deterministic rank program.
///
/// `run_rank` runs once on every rank of a world. It must draw randomness only from the context's
/// streams, exchange data only through `ctx.comm()` (all ranks calling the same collectives in the
/// same order), and record what it wants compared with `ctx.record*`.
pub trait Scenario: Send + Sync {
    /// Runs this rank's part of the program.
    ///
    /// # Errors
    /// Any error fails the run and is reported with the rank.
    fn run_rank(&self, ctx: &mut RankContext<'_>) -> Result<(), RankError>;

    /// `true` when the program resumes from checkpoints: it calls [`RankContext::resume`] first
    /// and [`RankContext::save_checkpoint`] after its last step (the `restart` check).
    fn resumes(&self) -> bool {
        false
    }

    /// `true` when the program loads data with worker threads whose number comes from
    /// [`RankContext::loader_workers`] (the `workers` check).
    fn loads_data(&self) -> bool {
        false
    }
}

/// What one run does beyond its spec: the data loader's workers, where the run stops, where it
/// saves or resumes a checkpoint. The checks set it (`workers`, `restart`), and so does
/// `detcheck run` (`--workers`, `--stop-at`, `--checkpoint`, `--resume`). Serializable: MPI
/// followers receive it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunPlan {
    /// Data-loader worker threads (`None`: the scenario's own number).
    pub loader_workers: Option<usize>,
    /// Stop before this step instead of the spec's `steps`.
    pub stop_at: Option<u64>,
    /// Save a checkpoint into this folder after the last step.
    pub checkpoint_to: Option<PathBuf>,
    /// Resume from the newest checkpoint every rank has in this folder.
    pub resume_from: Option<PathBuf>,
    /// Remove this rank's checkpoint files once they are loaded (a check's own folder).
    pub remove_after_resume: bool,
}

/// Everything a rank program may use: its communicator, its recorder and its random streams.
pub struct RankContext<'a> {
    comm: &'a dyn Communicator,
    recorder: Recorder,
    seed: u64,
    steps: u64,
    mode: ReductionMode,
    plan: RunPlan,
    /// md5 of the scenario's kind, reduction and parameters: the identity of its checkpoints.
    fingerprint: String,
    /// The loader's timing noise, from the run's perturbation.
    jitter: Option<LoaderJitter>,
    start_step: u64,
}

/// The rank coordinate of streams every rank shares (never a real rank).
const SHARED_RANK: u64 = u64::MAX;

impl<'a> RankContext<'a> {
    /// A context for one rank; the recorder records at `level`.
    #[must_use]
    pub fn new(
        comm: &'a dyn Communicator,
        level: RecordLevel,
        seed: u64,
        steps: u64,
        mode: ReductionMode,
    ) -> Self {
        RankContext {
            recorder: Recorder::new(comm.rank() as u32, level),
            comm,
            seed,
            steps,
            mode,
            plan: RunPlan::default(),
            fingerprint: String::new(),
            jitter: None,
            start_step: 0,
        }
    }

    /// The context of one rank of a run of `spec` under `plan`: steps stop at the plan's
    /// `stop_at`, checkpoints carry the spec's fingerprint, and the loader's timing noise comes
    /// from `perturbation`.
    pub(crate) fn for_run(
        comm: &'a dyn Communicator,
        level: RecordLevel,
        spec: &ScenarioSpec,
        plan: &RunPlan,
        perturbation: Option<Perturbation>,
    ) -> Self {
        let steps = plan.stop_at.unwrap_or(spec.steps);
        let mut ctx = RankContext::new(comm, level, spec.seed, steps, spec.effective_mode());
        ctx.plan = plan.clone();
        ctx.fingerprint = spec.fingerprint();
        let rank = comm.rank() as u64;
        ctx.jitter = perturbation.map(|p| LoaderJitter {
            seed: p.seed ^ (p.rotation as u64) ^ rank.rotate_left(32),
            max_delay: p.max_delay,
        });
        ctx
    }

    /// This rank.
    #[must_use]
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of ranks.
    #[must_use]
    pub fn world_size(&self) -> usize {
        self.comm.size()
    }

    /// The run's seed.
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The number of steps to run.
    #[must_use]
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The reduction mode every allreduce of this run uses.
    #[must_use]
    pub fn mode(&self) -> ReductionMode {
        self.mode
    }

    /// The communicator.
    #[must_use]
    pub fn comm(&self) -> &dyn Communicator {
        self.comm
    }

    /// This rank's own stream (dropout, local data).
    #[must_use]
    pub fn stream(&self, stream: Stream, step: u64) -> RankRng {
        derive_stream(self.seed, stream, self.rank() as u64, step)
    }

    /// A stream that is the same on every rank (replicated init, the global data order).
    #[must_use]
    pub fn shared_stream(&self, stream: Stream, step: u64) -> RankRng {
        derive_stream(self.seed, stream, SHARED_RANK, step)
    }

    /// Records `tensor` as `name` at `step`.
    pub fn record(&mut self, step: u64, name: &str, tensor: &Tensor) {
        self.recorder.record(step, name, tensor);
    }

    /// Records a tensor that must be bitwise identical on every rank.
    pub fn record_replicated(&mut self, step: u64, name: &str, tensor: &Tensor) {
        self.recorder.record_replicated(step, name, tensor);
    }

    /// Allreduces `tensor` in the run's reduction mode.
    ///
    /// # Errors
    /// The communicator's error, naming the collective.
    pub fn allreduce(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<(), CommError> {
        self.comm.allreduce(tensor, op, self.mode)
    }

    /// The recorder, to attach a tap (dumps).
    pub(crate) fn recorder_mut(&mut self) -> &mut Recorder {
        &mut self.recorder
    }

    /// Sums per-sample terms over every rank so that the bits depend only on the multiset of all
    /// ranks' terms, however they are split: the same result at any world size. `terms` are this
    /// rank's (each `len` long, e.g. one gradient per sample); `total_terms` is their number over
    /// all ranks. Every rank must call it with the same `len` and `total_terms`.
    ///
    /// Two collectives: an allreduce `max` of magnitudes, which fixes every element's grid, and an
    /// exact integer allreduce of the terms on that grid (a third counts NaN and infinities, only
    /// when some rank has one). See [`reproducible_sum_f32`](crate::reproducible_sum_f32) for the
    /// accuracy and the handling of NaN and infinities.
    ///
    /// # Errors
    /// The communicator's error, naming the collective.
    pub fn reproducible_sum(
        &self,
        terms: &[&[f32]],
        len: usize,
        total_terms: u64,
    ) -> Result<Vec<f32>, CommError> {
        use crate::reprosum::distributed as d;
        use crate::tensor::TensorData;
        // Integer sums and max are exact in any order; `rank_ordered` keeps them off any float path.
        let exact = ReductionMode::RankOrdered;
        let mut max_abs = Tensor::from_vec(d::local_max_abs(terms, len));
        self.comm.allreduce(&mut max_abs, ReduceOp::Max, exact)?;
        let TensorData::F32(max_abs) = max_abs.into_data() else {
            unreachable!("an allreduce keeps the dtype");
        };
        let magics = d::magics(&max_abs[..len], total_terms);
        let mut sums = Tensor::from_vec(d::grid_sums(terms, &magics));
        self.comm.allreduce(&mut sums, ReduceOp::Sum, exact)?;
        let TensorData::I64(sums) = sums.into_data() else {
            unreachable!("an allreduce keeps the dtype");
        };
        let mut out = d::finish(&sums, &magics);
        if max_abs[len] > 0.0 {
            let mut counts = Tensor::from_vec(d::local_special_counts(terms, len));
            self.comm.allreduce(&mut counts, ReduceOp::Sum, exact)?;
            let TensorData::I64(counts) = counts.into_data() else {
                unreachable!("an allreduce keeps the dtype");
            };
            d::apply_specials(&mut out, &counts);
        }
        Ok(out)
    }

    /// The number of data-loader worker threads this run uses: the plan's (the `workers` check
    /// sets it), or the program's own `default`.
    #[must_use]
    pub fn loader_workers(&self, default: usize) -> usize {
        self.plan.loader_workers.unwrap_or(default)
    }

    /// The timing noise a data loader adds before each sample in a perturbed run (`None` when
    /// the run is not perturbed), different on every rank and run. It changes timing only,
    /// never values.
    #[must_use]
    pub fn loader_jitter(&self) -> Option<LoaderJitter> {
        self.jitter
    }

    /// The first step this run executes: 0, or the step of the checkpoint it resumed from.
    #[must_use]
    pub fn start_step(&self) -> u64 {
        self.start_step
    }

    fn checkpoint_identity(&self) -> CheckpointIdentity {
        CheckpointIdentity {
            fingerprint: self.fingerprint.clone(),
            seed: self.seed,
            world_size: self.world_size(),
            rank: self.rank(),
        }
    }

    /// This rank's checkpoint when the run resumes (`None` otherwise), and the first step to
    /// run becomes its step. Every rank must call it, first: the ranks agree on the newest step
    /// they all have complete, so ranks that crashed at different moments still resume together.
    ///
    /// # Errors
    /// A [`CheckpointError`](crate::CheckpointError) naming the file (missing, corrupt, written by another run), or the
    /// communicator's error.
    pub fn resume(&mut self) -> Result<Option<RankCheckpoint>, RankError> {
        let Some(dir) = self.plan.resume_from.clone() else {
            return Ok(None);
        };
        let identity = self.checkpoint_identity();
        let newest = checkpoint::complete_steps(&dir, identity.rank)?
            .first()
            .map_or(-1, |&s| i64::try_from(s).unwrap_or(i64::MAX));
        let all = self.comm.allgather(&Tensor::scalar(newest))?;
        let common = all
            .iter()
            .filter_map(|t| t.values::<i64>().and_then(|v| v.first().copied()))
            .min()
            .unwrap_or(-1);
        let Ok(step) = u64::try_from(common) else {
            // Every rank reports the same rank: the lowest one without a checkpoint.
            let missing = all
                .iter()
                .position(|t| t.values::<i64>().and_then(|v| v.first().copied()) == Some(-1))
                .unwrap_or(identity.rank);
            return Err(Box::new(checkpoint::CheckpointError::NotFound {
                dir,
                rank: missing,
                wanted: None,
            }));
        };
        let loaded = checkpoint::load_checkpoint(&dir, &identity, Some(step))?;
        if self.plan.remove_after_resume {
            checkpoint::remove_rank_files(&dir, identity.rank);
        }
        self.start_step = loaded.step;
        Ok(Some(loaded))
    }

    /// `true` when the run must save a checkpoint after its last step.
    #[must_use]
    pub fn wants_checkpoint(&self) -> bool {
        self.plan.checkpoint_to.is_some()
    }

    /// Saves this rank's checkpoint where the run's plan says (nothing when it says nowhere).
    ///
    /// # Errors
    /// A [`CheckpointError`](crate::CheckpointError) naming the file; the previous checkpoints stay intact.
    pub fn save_checkpoint(&self, checkpoint: &RankCheckpoint) -> Result<(), RankError> {
        if let Some(dir) = &self.plan.checkpoint_to {
            checkpoint::save_checkpoint(dir, &self.checkpoint_identity(), checkpoint)?;
        }
        Ok(())
    }

    /// Finishes the rank: its recorder.
    #[must_use]
    pub fn into_recorder(self) -> Recorder {
        self.recorder
    }
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
    /// Trial name; defaults to the file name without `.json`.
    #[serde(default)]
    pub name: Option<String>,
    /// What the scenario shows, for people.
    #[serde(default)]
    pub description: String,
    /// The kind of program: `seed`, `collective`, `dataloader`, `train`, or a registered one.
    pub kind: String,
    /// Number of ranks.
    pub world_size: usize,
    /// Number of steps.
    pub steps: u64,
    /// The seed every random stream derives from.
    pub seed: u64,
    /// The reduction mode of every allreduce.
    pub reduction: ReductionMode,
    /// `false` models a job without deterministic communication (HCCL_DETERMINISTIC unset): every
    /// allreduce then adds in arrival order, whatever `reduction` says.
    pub deterministic_comm: bool,
    /// What the checks must find: `identical`, or `diverges` for a negative control.
    pub expect: Expectation,
    /// The checks to run; by default `repeat`, plus `replicas` for `train` when identical.
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
    /// The kind's own parameters.
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
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

    /// Parses `params` into the kind's own parameter type, naming the field on error.
    ///
    /// # Errors
    /// A [`ParamError`] whose field starts with `params.`.
    pub fn parse_params<P: DeserializeOwned>(&self) -> Result<P, ParamError> {
        let value = serde_json::Value::Object(self.params.clone());
        serde_path_to_error::deserialize(value).map_err(|e| {
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

/// Builds a kind's program from a validated spec.
pub type KindFactory =
    Arc<dyn Fn(&ScenarioSpec) -> Result<Arc<dyn Scenario>, ParamError> + Send + Sync>;

/// The scenario kinds a loader knows, by name.
#[derive(Clone)]
pub struct KindRegistry {
    kinds: BTreeMap<String, KindFactory>,
}

impl fmt::Debug for KindRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.kinds.keys()).finish()
    }
}

impl Default for KindRegistry {
    fn default() -> Self {
        Self::builtin()
    }
}

impl KindRegistry {
    /// The built-in kinds: `seed`, `collective`, `dataloader`, `train`.
    #[must_use]
    pub fn builtin() -> Self {
        let mut registry = KindRegistry {
            kinds: BTreeMap::new(),
        };
        builtin::register(&mut registry);
        registry
    }

    /// Adds (or replaces) a kind.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        factory: impl Fn(&ScenarioSpec) -> Result<Arc<dyn Scenario>, ParamError> + Send + Sync + 'static,
    ) {
        self.kinds.insert(name.into(), Arc::new(factory));
    }

    /// The names of the known kinds, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }

    /// Validates `spec` and builds its program. `origin` names the file in errors.
    ///
    /// # Errors
    /// [`ScenarioError::Invalid`] naming `origin` and the field.
    pub fn build(
        &self,
        spec: ScenarioSpec,
        origin: &Path,
    ) -> Result<LoadedScenario, ScenarioError> {
        let invalid = |e: ParamError| ScenarioError::Invalid {
            path: origin.to_path_buf(),
            field: e.field,
            message: e.message,
        };
        validate_common(&spec).map_err(invalid)?;
        let factory = self.kinds.get(&spec.kind).ok_or_else(|| {
            invalid(ParamError::new(
                "kind",
                format!(
                    "unknown kind `{}`; known kinds: {}",
                    spec.kind,
                    self.names().collect::<Vec<_>>().join(", ")
                ),
            ))
        })?;
        let program = factory(&spec).map_err(invalid)?;
        let name = match &spec.name {
            Some(name) => name.clone(),
            None => origin
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| spec.kind.clone()),
        };
        let mut checks = spec.checks.clone();
        if checks.is_empty() {
            checks.push(CheckKind::Repeat);
            if spec.expect == Expectation::Identical {
                if spec.kind == "train" {
                    checks.push(CheckKind::Replicas);
                }
                if program.loads_data() {
                    checks.push(CheckKind::Workers);
                }
                if program.resumes() && spec.steps >= 2 {
                    checks.push(CheckKind::Restart);
                }
            }
        }
        validate_capabilities(&spec, &checks, program.as_ref()).map_err(invalid)?;
        Ok(LoadedScenario {
            name,
            origin: origin.to_path_buf(),
            checks,
            spec,
            program,
        })
    }

    /// Reads, parses, validates and builds the scenario file at `path`.
    ///
    /// # Errors
    /// [`ScenarioError`] naming the file, and the field where there is one.
    pub fn load_file(&self, path: &Path) -> Result<LoadedScenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let spec = parse_spec(&text).map_err(|e| ScenarioError::Invalid {
            path: path.to_path_buf(),
            field: e.field,
            message: e.message,
        })?;
        self.build(spec, path)
    }
}

/// Parses scenario JSON, naming the field of the first error.
fn parse_spec(text: &str) -> Result<ScenarioSpec, ParamError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let spec: ScenarioSpec = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        ParamError::new(
            if path == "." {
                "(top level)".to_owned()
            } else {
                path
            },
            e.into_inner().to_string(),
        )
    })?;
    deserializer
        .end()
        .map_err(|e| ParamError::new("(top level)", e.to_string()))?;
    Ok(spec)
}

/// The largest world a scenario file may ask for.
const MAX_WORLD_SIZE: usize = 1024;

fn validate_common(spec: &ScenarioSpec) -> Result<(), ParamError> {
    if spec.world_size == 0 || spec.world_size > MAX_WORLD_SIZE {
        return Err(ParamError::new(
            "world_size",
            format!(
                "must be between 1 and {MAX_WORLD_SIZE}, got {}",
                spec.world_size
            ),
        ));
    }
    if spec.steps == 0 {
        return Err(ParamError::new("steps", "must be at least 1"));
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
    }
    Ok(())
}

/// The `workers` and `restart` checks need a program that can honour them, and sensible values.
fn validate_capabilities(
    spec: &ScenarioSpec,
    checks: &[CheckKind],
    program: &dyn Scenario,
) -> Result<(), ParamError> {
    let field = |check: CheckKind| match spec.checks.iter().position(|&c| c == check) {
        Some(i) => format!("checks[{i}]"),
        None => "checks".to_owned(),
    };
    if checks.contains(&CheckKind::Workers) {
        if !program.loads_data() {
            return Err(ParamError::new(
                field(CheckKind::Workers),
                format!(
                    "`workers` varies data-loader worker threads, but kind `{}` has no loader \
                     (the built-in kinds with one: dataloader, train)",
                    spec.kind
                ),
            ));
        }
        if spec.workers.len() < 2 {
            return Err(ParamError::new(
                "workers",
                "`workers` needs at least two worker counts to compare",
            ));
        }
    }
    if checks.contains(&CheckKind::Restart) {
        if !program.resumes() {
            return Err(ParamError::new(
                field(CheckKind::Restart),
                format!(
                    "`restart` resumes from a checkpoint, but kind `{}` does not write any \
                     (the built-in kinds that do: dataloader, train)",
                    spec.kind
                ),
            ));
        }
        let at = spec.restart_step();
        if at == 0 || at >= spec.steps {
            return Err(ParamError::new(
                if spec.restart_at.is_some() {
                    "restart_at"
                } else {
                    "steps"
                },
                format!(
                    "the restart check needs 1 <= restart_at < steps, but restart_at is {at} \
                     and steps is {}",
                    spec.steps
                ),
            ));
        }
    }
    Ok(())
}

/// The largest number of loader workers a scenario file may ask for.
const MAX_WORKERS: usize = 64;

/// A scenario ready to run: its spec, its program, its checks.
#[derive(Clone)]
pub struct LoadedScenario {
    /// The trial name.
    pub name: String,
    /// The file it came from.
    pub origin: PathBuf,
    /// The checks to run, defaults applied.
    pub checks: Vec<CheckKind>,
    /// The spec as written.
    pub spec: ScenarioSpec,
    /// The program.
    pub program: Arc<dyn Scenario>,
}

impl fmt::Debug for LoadedScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedScenario")
            .field("name", &self.name)
            .field("origin", &self.origin)
            .field("checks", &self.checks)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

/// Why scenarios could not be loaded. Each names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file or folder could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid scenario.
    #[error("{}: field `{field}`: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field, as a path (`params.hidden`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Two files give the same scenario name.
    #[error("{} and {} both name a scenario `{name}`", first.display(), second.display())]
    DuplicateName {
        /// The name.
        name: String,
        /// The first file.
        first: PathBuf,
        /// The second file.
        second: PathBuf,
    },
}

/// Loads every `*.json` file in `dir`, sorted by file name.
///
/// Returns one result per file, so that one bad file does not hide the others; a duplicate name is
/// reported on the second file.
///
/// # Errors
/// [`ScenarioError::Read`] when the folder cannot be listed.
pub fn discover_scenarios(
    dir: &Path,
    registry: &KindRegistry,
) -> Result<Vec<Result<LoadedScenario, ScenarioError>>, ScenarioError> {
    let read_error = |source| ScenarioError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let path = entry.map_err(read_error)?.path();
        if path.extension().is_some_and(|e| e == "json") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    Ok(files
        .into_iter()
        .map(|path| {
            let loaded = registry.load_file(&path)?;
            if let Some(first) = seen.get(&loaded.name) {
                return Err(ScenarioError::DuplicateName {
                    name: loaded.name,
                    first: first.clone(),
                    second: path,
                });
            }
            seen.insert(loaded.name.clone(), path);
            Ok(loaded)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    const GOOD: &str = r#"{"kind": "collective", "world_size": 3, "steps": 2, "seed": 1,
        "reduction": "ring", "deterministic_comm": true, "expect": "identical",
        "params": {"elements": 16}}"#;

    fn load_error(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "bad.json", text);
        let err = KindRegistry::builtin().load_file(&path).unwrap_err();
        err.to_string()
            .replace(&dir.path().display().to_string(), "DIR")
    }

    #[test]
    fn a_good_file_loads_with_default_name_and_checks() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "ring_3.json", GOOD);
        let loaded = KindRegistry::builtin().load_file(&path).unwrap();
        assert_eq!(loaded.name, "ring_3");
        assert_eq!(loaded.checks, [CheckKind::Repeat]);
        assert_eq!(loaded.spec.effective_mode(), ReductionMode::Ring);
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        assert_eq!(
            load_error(&GOOD.replace("\"seed\"", "\"sede\"")),
            "DIR/bad.json: field `sede`: unknown field `sede`, expected one of `name`, \
             `description`, `kind`, `world_size`, `steps`, `seed`, `reduction`, \
             `deterministic_comm`, `expect`, `checks`, `ignored`, `world_sizes`, `workers`, \
             `restart_at`, `params` at line 1 column 58"
        );
        assert!(load_error(&GOOD.replace("\"ring\"", "\"fast\""))
            .starts_with("DIR/bad.json: field `reduction`: unknown variant `fast`"));
        assert!(load_error(&GOOD.replace("\"elements\"", "\"elems\""))
            .starts_with("DIR/bad.json: field `params.elems`: unknown field `elems`"));
        assert!(
            load_error(&GOOD.replace("\"world_size\": 3", "\"world_size\": 0"))
                .starts_with("DIR/bad.json: field `world_size`: must be between 1 and 1024")
        );
        assert!(load_error(&GOOD.replace("collective", "nosuch")).contains(
            "field `kind`: unknown kind `nosuch`; known kinds: collective, dataloader, seed, train"
        ));
        assert!(load_error("{\"kind\": ").contains("EOF while parsing a value at line 1"));
        assert!(load_error(&format!("{GOOD} trailing"))
            .starts_with("DIR/bad.json: field `(top level)`: trailing characters"));
        assert!(load_error(&GOOD.replace("\"steps\": 2,", "")).contains("missing field `steps`"));
    }

    #[test]
    fn discovery_sorts_files_and_reports_each_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "b.json", GOOD);
        write(dir.path(), "a.json", GOOD);
        write(dir.path(), "c.json", "not json");
        write(
            dir.path(),
            "d.json",
            &GOOD.replace("{\"kind\"", "{\"name\": \"a\", \"kind\""),
        );
        write(dir.path(), "notes.txt", "ignored");
        let found = discover_scenarios(dir.path(), &KindRegistry::builtin()).unwrap();
        assert_eq!(found.len(), 4);
        assert_eq!(found[0].as_ref().unwrap().name, "a");
        assert_eq!(found[1].as_ref().unwrap().name, "b");
        assert!(found[2]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("c.json"));
        assert!(matches!(
            found[3].as_ref().unwrap_err(),
            ScenarioError::DuplicateName { .. }
        ));
        let missing = discover_scenarios(&dir.path().join("nope"), &KindRegistry::builtin());
        assert!(missing.unwrap_err().to_string().starts_with("cannot read "));
    }

    #[test]
    fn the_switch_off_means_arrival_order() {
        let spec = parse_spec(&GOOD.replace(
            "\"deterministic_comm\": true",
            "\"deterministic_comm\": false",
        ))
        .unwrap();
        assert_eq!(spec.effective_mode(), ReductionMode::ArrivalOrder);
    }
}
