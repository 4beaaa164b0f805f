//! Thread ranks sharing one GPU (feature `nccl`): the collectives on device buffers, exchanged by
//! device copies.
//!
//! NCCL refuses two ranks on one GPU, so a world of several ranks on a one-GPU machine is thread
//! ranks: [`GpuThreadComm`] wraps a rank's [`ThreadComm`], whose rounds order the ranks and
//! catch mismatches, deadlines and failed peers as on the CPU, and moves the data on the GPU.
//! Each rank uploads its tensor and deposits the device buffer (an `Arc`) in the round; the
//! kernels read the other ranks' buffers in place (one device, one address space). An allreduce
//! takes the CPU's two rounds: rank `r` reduces chunk `r` of every contribution with the
//! mode's kernel ([`Gpu::reduce`]), in the mode's summation order; then every rank copies every
//! reduced chunk into its own buffer and downloads it. Broadcast and allgather are device copies
//! of the deposited buffers.
//!
//! Determinism: the same schedule as thread ranks on the CPU, each element reduced once by a
//! kernel with the CPU's bits, so every rank gets identical bits and they equal the CPU
//! communicator's in every deterministic mode (`rank_ordered`, `ring`, `native` (the ring
//! schedule, as on thread ranks), `reproducible`); `arrival_order` reads the arrival order as
//! the CPU does. The `devices` check compares a scenario on this communicator with the same
//! scenario on CPU thread ranks, record by record.
//!
//! Limits: one GPU for every rank (ordinal 0 unless given); the host tensors of the
//! [`Communicator`] API are copied to the device and back in each collective (the device API is
//! [`GpuThreadComm::allreduce_device`]). Dtypes as on the CPU: every dtype moves, allreduce and
//! reduce-scatter refuse the ones `reduce::unreducible` names.

use super::threads::{check_reducible, describe, downcast, Payload};
use super::{CollectiveId, CollectiveKind, CommError, Communicator, ThreadComm};
use crate::device::{CudaError, DeviceChunk, DeviceTensor, Gpu};
use crate::value::reduce::{chunk_range, summation_order, ReduceOp, ReductionMode};
use crate::value::tensor::Tensor;
use std::sync::Arc;

/// A thread rank whose collectives run on a GPU shared with the other thread ranks.
#[derive(Debug)]
pub struct GpuThreadComm<'a> {
    host: &'a ThreadComm,
    gpu: Arc<Gpu>,
}

impl<'a> GpuThreadComm<'a> {
    /// Rank `host.rank()` of `host`'s world, its collectives on `gpu`.
    #[must_use]
    pub fn new(host: &'a ThreadComm, gpu: Arc<Gpu>) -> Self {
        GpuThreadComm { host, gpu }
    }

    /// The GPU.
    #[must_use]
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// [`CommError::Device`] for `id`.
    fn failed(&self, id: &CollectiveId) -> impl Fn(CudaError) -> CommError + '_ {
        let id = id.clone();
        move |e| CommError::Device {
            rank: self.host.rank(),
            collective: id.clone(),
            message: e.to_string(),
        }
    }

    /// Replaces `tensor` with the elementwise reduction of every rank's `tensor`, on the device
    /// (see the module docs); the result has the bits the CPU's thread ranks give.
    ///
    /// # Errors
    /// As [`Communicator::allreduce`], and [`CommError::Device`] when the GPU fails.
    pub fn allreduce_device(
        &self,
        tensor: &mut DeviceTensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<(), CommError> {
        let id = self.host.begin(CollectiveKind::Allreduce);
        let signature = format!("{op} in {mode}, {}[{}]", tensor.dtype(), tensor.len());
        self.reduce_device(&id, &signature, tensor, op, mode, true)
            .map(drop)
    }

    /// The two rounds of an allreduce (or round 1 only, for a reduce-scatter: then the reduced
    /// chunk is returned and `tensor` is unchanged).
    fn reduce_device(
        &self,
        id: &CollectiveId,
        signature: &str,
        tensor: &mut DeviceTensor,
        op: ReduceOp,
        mode: ReductionMode,
        gather: bool,
    ) -> Result<Option<DeviceTensor>, CommError> {
        let (rank, size, len) = (self.host.rank(), self.host.size(), tensor.len());
        let dtype = tensor.dtype();
        let failed = self.failed(id);
        // The rank's buffer is deposited and read in place by every rank's kernel; a shared
        // `Arc` until round 2 completes, then this rank's again.
        let mine: Arc<DeviceTensor> = Arc::new(std::mem::replace(
            tensor,
            self.gpu.zeros(dtype, &[0]).map_err(&failed)?,
        ));
        let round_1 = self
            .host
            .exchange(id, signature, Arc::clone(&mine) as Payload);
        let restore = |tensor: &mut DeviceTensor, mine: Arc<DeviceTensor>| {
            if let Ok(own) = Arc::try_unwrap(mine) {
                *tensor = own;
            }
        };
        let exchanged = match round_1 {
            Ok(exchanged) => exchanged,
            Err(e) => {
                restore(tensor, mine);
                return Err(e);
            }
        };
        let range = chunk_range(len, size, rank);
        let order = summation_order(mode, size, rank, &exchanged.arrival);
        let chunks: Vec<DeviceChunk<'_>> = order
            .iter()
            .map(|&r| DeviceChunk {
                tensor: downcast::<DeviceTensor>(&exchanged.payloads[r]),
                start: range.start,
            })
            .collect();
        let mut part = self.gpu.zeros(dtype, &[range.len()]).map_err(&failed)?;
        self.gpu
            .reduce(op, mode, &chunks, range.len(), &mut part, 0)
            .map_err(&failed)?;
        drop(chunks);
        drop(exchanged);
        if !gather {
            restore(tensor, mine);
            return Ok(Some(part));
        }
        let round_2 = self.host.exchange(id, signature, Arc::new(part) as Payload);
        let exchanged = match round_2 {
            Ok(exchanged) => exchanged,
            Err(e) => {
                restore(tensor, mine);
                return Err(e);
            }
        };
        // Round 2 completed: no rank reads round 1's buffers any more, so this rank's buffer is
        // its own again (other ranks may still hold their `Arc` of round 1 for a moment).
        let mut out = match Arc::try_unwrap(mine) {
            Ok(own) => own,
            Err(_) => self.gpu.zeros(dtype, tensor.shape()).map_err(&failed)?,
        };
        for (chunk, part) in exchanged.payloads.iter().enumerate() {
            let part = downcast::<DeviceTensor>(part);
            let at = chunk_range(len, size, chunk).start;
            self.gpu
                .copy(part, 0..part.len(), &mut out, at)
                .map_err(&failed)?;
        }
        *tensor = out;
        Ok(None)
    }
}

impl Communicator for GpuThreadComm<'_> {
    fn rank(&self) -> usize {
        self.host.rank()
    }

    fn gpu(&self) -> Option<&Arc<Gpu>> {
        Some(&self.gpu)
    }

    fn size(&self) -> usize {
        self.host.size()
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.host.barrier()
    }

    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), CommError> {
        let id = self.host.begin(CollectiveKind::Broadcast);
        let rank = self.host.rank();
        if root >= self.size() {
            return Err(CommError::InvalidArgument {
                rank,
                collective: id,
                reason: format!("root {root} is not a rank of a world of {}", self.size()),
            });
        }
        let failed = self.failed(&id);
        let signature = format!("root {root}, {}", describe(tensor));
        let payload: Payload = if rank == root {
            Arc::new(self.gpu.upload(tensor).map_err(&failed)?)
        } else {
            Arc::new(())
        };
        let exchanged = self.host.exchange(&id, &signature, payload)?;
        if rank != root {
            let source = downcast::<DeviceTensor>(&exchanged.payloads[root]);
            let mut copy = self
                .gpu
                .zeros(source.dtype(), source.shape())
                .map_err(&failed)?;
            self.gpu
                .copy(source, 0..source.len(), &mut copy, 0)
                .map_err(&failed)?;
            *tensor = self.gpu.download(&copy).map_err(&failed)?;
        }
        Ok(())
    }

    fn allgather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, CommError> {
        let id = self.host.begin(CollectiveKind::Allgather);
        let failed = self.failed(&id);
        let mine = self.gpu.upload(tensor).map_err(&failed)?;
        let exchanged = self
            .host
            .exchange(&id, &describe(tensor), Arc::new(mine) as Payload)?;
        // Every rank's buffer copied into one of this rank's, then brought back at once.
        let parts: Vec<&DeviceTensor> = exchanged.payloads.iter().map(downcast).collect();
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut gathered = self.gpu.zeros(tensor.dtype(), &[total]).map_err(&failed)?;
        let mut at = 0;
        for part in &parts {
            self.gpu
                .copy(part, 0..part.len(), &mut gathered, at)
                .map_err(&failed)?;
            at += part.len();
        }
        let all = self.gpu.download(&gathered).map_err(&failed)?;
        let size = tensor.dtype().size_of();
        let mut at = 0;
        let tensors = all.with_view(|view| {
            parts
                .iter()
                .map(|part| {
                    let bytes = &view.bytes()[at * size..(at + part.len()) * size];
                    at += part.len();
                    crate::value::tensor::TensorView::new(part.dtype(), part.shape(), bytes)
                        .expect("a gathered part keeps its dtype and shape")
                        .to_tensor()
                })
                .collect()
        });
        Ok(tensors)
    }

    fn reduce_scatter(
        &self,
        tensor: &Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<Tensor, CommError> {
        let id = self.host.begin(CollectiveKind::ReduceScatter);
        check_reducible(self.rank(), &id, tensor)?;
        let signature = format!("{op} in {mode}, {}", describe(tensor));
        let failed = self.failed(&id);
        let mut device = self.gpu.upload(tensor).map_err(&failed)?;
        let part = self
            .reduce_device(&id, &signature, &mut device, op, mode, false)?
            .expect("round 1 alone returns the reduced chunk");
        let part = self.gpu.download(&part).map_err(&failed)?;
        Ok(Tensor::new(vec![part.len()], part.into_data()).expect("a chunk is 1-D"))
    }

    fn allreduce(
        &self,
        tensor: &mut Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<(), CommError> {
        let id = self.host.begin(CollectiveKind::Allreduce);
        check_reducible(self.rank(), &id, tensor)?;
        let signature = format!("{op} in {mode}, {}", describe(tensor));
        let failed = self.failed(&id);
        let mut device = self.gpu.upload(tensor).map_err(&failed)?;
        self.reduce_device(&id, &signature, &mut device, op, mode, true)?;
        let reduced = self.gpu.download(&device).map_err(&failed)?;
        *tensor = reduced;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{launch_threads, LaunchConfig, Perturbation};
    use crate::device::gpu::gpu_for_test;
    use crate::value::seed::{derive_stream, Stream};

    fn contribution(rank: usize, len: usize) -> Tensor {
        let mut rng = derive_stream(11, Stream::Data, rank as u64, 0);
        Tensor::from_vec(
            (0..len)
                .map(|_| rng.normal_f32() * 1e3)
                .collect::<Vec<f32>>(),
        )
    }

    /// Every collective of every world size 1-8 and every mode on the GPU, against the CPU's
    /// thread ranks, bit for bit, with and without perturbation.
    #[test]
    fn thread_ranks_on_one_gpu_get_the_cpus_bits() {
        let Some(gpu) = gpu_for_test(
            "allreduce (every mode, sum and max), reduce-scatter, broadcast and allgather among \
             1-8 thread ranks sharing the GPU give the CPU thread ranks' bits",
        ) else {
            return;
        };
        for size in 1..=8 {
            for mode in ReductionMode::ALL {
                if mode == ReductionMode::ArrivalOrder {
                    continue;
                }
                for op in [ReduceOp::Sum, ReduceOp::Max] {
                    let run = |on_gpu: bool| {
                        let config = LaunchConfig::new(size).with_perturbation(Perturbation {
                            seed: size as u64,
                            rotation: usize::from(on_gpu),
                            max_delay: std::time::Duration::from_micros(50),
                        });
                        let gpu = Arc::clone(&gpu);
                        launch_threads(&config, move |host| {
                            let gpu_comm = GpuThreadComm::new(host, Arc::clone(&gpu));
                            let comm: &dyn Communicator = if on_gpu { &gpu_comm } else { host };
                            let mut t = contribution(comm.rank(), 1001);
                            comm.allreduce(&mut t, op, mode)?;
                            let scattered = comm.reduce_scatter(&t, op, mode)?;
                            let mut b = contribution(comm.rank(), 7);
                            comm.broadcast(&mut b, size - 1)?;
                            let gathered = comm.allgather(&b)?;
                            let bits = |t: &Tensor| t.with_view(|v| v.bytes().to_vec());
                            let gathered: Vec<Vec<u8>> = gathered.iter().map(bits).collect();
                            Ok((bits(&t), bits(&scattered), bits(&b), gathered))
                        })
                        .unwrap()
                    };
                    let (gpu_run, cpu_run) = (run(true), run(false));
                    assert!(gpu_run == cpu_run, "{size} ranks, {op} in {mode}");
                }
            }
        }
    }
}
