//! What a rank program may use while it runs: [`RankContext`] (communicator, recorder, seeded
//! streams, checkpoints) and the [`RunPlan`] a check or the CLI sets for one run.
//!
//! Determinism: every stream derives from (seed, stream, rank, step); the context adds no other
//! source of randomness. The loader's timing noise changes timing only, never values.

use crate::checkpoint::{self, CheckpointIdentity, RankCheckpoint};
use crate::comm::{CommError, Communicator, Perturbation, RankError};
use crate::data::LoaderJitter;
use crate::record::{RecordLevel, Recorder};
use crate::scenario::{BucketLayout, ScenarioSpec};
use crate::value::reduce::{ReduceOp, ReductionMode};
use crate::value::seed::{derive_stream, RankRng, Stream};
use crate::value::tensor::Tensor;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    /// How gradients are fused into allreduce buckets (`None`: the scenario's own layout; the
    /// `buckets` check sets it).
    #[serde(default)]
    pub bucket_layout: Option<BucketLayout>,
    /// The batch size a `command` program is run at (`{batch}`), its recorder recording each
    /// sample's rows (`None`: the spec's first `batch_sizes`, recorded as usual; the
    /// `batch_sizes` check sets it).
    #[serde(default)]
    pub batch_size: Option<usize>,
    /// With `batch_size`: the operators of one module call to record too, for one sample
    /// (`DETCHECK_ROWS_INSIDE`, `launch`): `<sample>:<call>:<record name>`, the `batch_sizes`
    /// check's drill-down to the operator.
    #[serde(default)]
    pub rows_inside: Option<String>,
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

    /// The GPU this rank computes on: `Some` when the run is on a GPU (a `device: "gpu"`
    /// scenario, or the GPU side of the `devices` check), `None` on the CPU.
    #[cfg(feature = "nccl")]
    #[must_use]
    pub fn gpu(&self) -> Option<&std::sync::Arc<crate::device::Gpu>> {
        self.comm.gpu()
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

    /// Records `tensor`, given away, as `name` at `step`: the record of [`RankContext::record`],
    /// without a copy of its bytes.
    pub fn record_owned(&mut self, step: u64, name: &str, tensor: Tensor) {
        self.recorder.record_owned(step, name, tensor);
    }

    /// Records a tensor, given away, that must be bitwise identical on every rank.
    pub fn record_replicated_owned(&mut self, step: u64, name: &str, tensor: Tensor) {
        self.recorder.record_replicated_owned(step, name, tensor);
    }

    /// `false` when this run records nothing (level `off`): skip building what would be
    /// recorded.
    #[must_use]
    pub fn is_recording(&self) -> bool {
        self.recorder.is_recording()
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
    /// when some rank has one). See [`reproducible_sum_f32`](crate::value::reproducible_sum_f32) for the
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
        use crate::value::reprosum::distributed as d;
        use crate::value::tensor::TensorData;
        let mut max_abs = Tensor::from_vec(d::local_max_abs(terms, len));
        self.exact_allreduce(&mut max_abs, ReduceOp::Max)?;
        let TensorData::F32(max_abs) = max_abs.into_data() else {
            unreachable!("an allreduce keeps the dtype");
        };
        let magics = d::magics(&max_abs[..len], total_terms);
        let mut sums = Tensor::from_vec(d::grid_sums(terms, &magics));
        self.exact_allreduce(&mut sums, ReduceOp::Sum)?;
        let TensorData::I64(sums) = sums.into_data() else {
            unreachable!("an allreduce keeps the dtype");
        };
        let mut out = d::finish(&sums, &magics);
        if max_abs[len] > 0.0 {
            let mut counts = Tensor::from_vec(d::local_special_counts(terms, len));
            self.exact_allreduce(&mut counts, ReduceOp::Sum)?;
            let TensorData::I64(counts) = counts.into_data() else {
                unreachable!("an allreduce keeps the dtype");
            };
            d::apply_specials(&mut out, &counts);
        }
        Ok(out)
    }

    /// Allreduces a tensor whose reduction is exact in any order, whatever the run's mode: integer
    /// sums (the grid integers of a reproducible sum) and `max`. `rank_ordered` keeps them off any
    /// float path.
    ///
    /// # Errors
    /// The communicator's error, naming the collective.
    pub(crate) fn exact_allreduce(
        &self,
        tensor: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.comm.allreduce(tensor, op, ReductionMode::RankOrdered)
    }

    /// The number of data-loader worker threads this run uses: the plan's (the `workers` check
    /// sets it), or the program's own `default`.
    #[must_use]
    pub fn loader_workers(&self, default: usize) -> usize {
        self.plan.loader_workers.unwrap_or(default)
    }

    /// How this run fuses gradients into allreduce buckets: the plan's (the `buckets` check sets
    /// it), or the program's own `default`.
    #[must_use]
    pub fn bucket_layout(&self, default: BucketLayout) -> BucketLayout {
        self.plan.bucket_layout.unwrap_or(default)
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
    /// A [`CheckpointError`](crate::checkpoint::CheckpointError) naming the file (missing, corrupt, written by another run), or the
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
    /// A [`CheckpointError`](crate::checkpoint::CheckpointError) naming the file; the previous checkpoints stay intact.
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
