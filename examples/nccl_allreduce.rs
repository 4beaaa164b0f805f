//! detcheck's NCCL communicator across GPUs: an rsmpi program, one rank per GPU; build with
//! `--features mpi,nccl` and run as `mpirun -n <gpus> nccl_allreduce [--len N] [--seed S]`.
//!
//! Every rank draws its tensors from the seed (f32 and f64), allreduces them on device buffers
//! with `NcclComm::allreduce_device` in every mode, and checks
//! (a) every rank holds identical bits (the md5s of the results, allgathered over MPI), and
//! (b) `rank_ordered`, `ring` and `reproducible` equal the CPU's bits: the inputs of every rank
//! are allgathered to the host and allreduced by detcheck's CPU thread ranks (`reduce_chunk` in
//! the same schedule). `native` (`ncclAllReduce`) is checked for (a) only: its bits are NCCL's;
//! `arrival_order` must be refused. Rank 0 prints one line per mode and dtype; the exit code is
//! 1 when any check fails, 2 when the program cannot run.
//!
//! The GPU of a rank is its local rank (`OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID` or
//! `PMI_LOCAL_RANK`; else its world rank) modulo the devices the driver counts. The NCCL id is
//! created by rank 0 and broadcast over MPI.

use detcheck::comm::{
    launch_threads, CommError, Communicator, LaunchConfig, NcclComm, NcclId, NCCL_ID_BYTES,
};
use detcheck::device::{count_devices, Gpu};
use detcheck::value::{derive_stream, DType, Md5Digest, ReduceOp, ReductionMode, Stream};
use detcheck::Tensor;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::traits::*;
use std::process::ExitCode;

/// Rank `rank`'s input: values over many exponents, so the order of additions shows in the bits.
fn input(seed: u64, rank: usize, len: usize, dtype: DType) -> Tensor {
    let mut rng = derive_stream(seed, Stream::Data, rank as u64, 0);
    let mut value = || f64::from(rng.normal_f32()) * 2f64.powi(rng.below(40) as i32 - 20);
    match dtype {
        DType::F32 => Tensor::from_vec((0..len).map(|_| value() as f32).collect::<Vec<f32>>()),
        _ => Tensor::from_vec((0..len).map(|_| value()).collect::<Vec<f64>>()),
    }
}

fn bytes(tensor: &Tensor) -> Vec<u8> {
    tensor.with_view(|v| v.bytes().to_vec())
}

/// The local rank the launcher gives, or `fallback`.
fn local_rank(fallback: usize) -> usize {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "PMI_LOCAL_RANK",
    ]
    .iter()
    .find_map(|name| std::env::var(name).ok()?.trim().parse().ok())
    .unwrap_or(fallback)
}

/// Rank 0's NCCL id, over MPI: a status byte first, so the other ranks stop when it failed.
fn shared_id(world: &SimpleCommunicator) -> Result<NcclId, String> {
    let mut message = [0u8; 1 + NCCL_ID_BYTES];
    let mut failure = None;
    if world.rank() == 0 {
        match NcclId::new() {
            Ok(id) => {
                message[0] = 1;
                message[1..].copy_from_slice(id.as_bytes());
            }
            Err(e) => failure = Some(e.to_string()),
        }
    }
    world.process_at_rank(0).broadcast_into(&mut message[..]);
    match (failure, message[0]) {
        (Some(e), _) => Err(e),
        (None, 1) => NcclId::from_bytes(&message[1..]).map_err(|e| e.to_string()),
        (None, _) => Err("rank 0 could not create the NCCL id".to_owned()),
    }
}

/// The CPU's allreduce of every rank's `inputs` in `mode` (thread ranks: `reduce_chunk` in the
/// schedule NCCL ranks use).
fn cpu_allreduce(inputs: &[Tensor], op: ReduceOp, mode: ReductionMode) -> Result<Vec<u8>, String> {
    let inputs = inputs.to_vec();
    let results = launch_threads(&LaunchConfig::new(inputs.len()), move |host| {
        let mut t = inputs[host.rank()].clone();
        host.allreduce(&mut t, op, mode)?;
        Ok(bytes(&t))
    })
    .map_err(|e| e.to_string())?;
    Ok(results.into_iter().next().unwrap_or_default())
}

fn run() -> Result<bool, String> {
    let mut args = std::env::args().skip(1);
    let (mut len, mut seed) = (100_003usize, 7u64);
    while let Some(flag) = args.next() {
        let value = args.next().and_then(|v| v.parse::<u64>().ok());
        match (flag.as_str(), value) {
            ("--len", Some(v)) => len = v as usize,
            ("--seed", Some(v)) => seed = v,
            _ => {
                return Err(format!(
                    "usage: nccl_allreduce [--len N] [--seed S] (at `{flag}`)"
                ))
            }
        }
    }
    let universe = mpi::initialize().ok_or("MPI is already initialized")?;
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let devices = count_devices().map_err(|e| e.to_string())?;
    let gpu = Gpu::open(local_rank(rank) % devices).map_err(|e| e.to_string())?;
    let id = shared_id(&world)?;
    let comm = NcclComm::new(gpu.clone(), rank, size, &id).map_err(|e| e.to_string())?;
    let mut all_passed = true;
    for dtype in [DType::F32, DType::F64] {
        let mine = input(seed, rank, len, dtype);
        // Every rank's input, gathered over MPI as bytes: the CPU reference's contributions.
        let mut gathered = vec![0u8; bytes(&mine).len() * size];
        world.all_gather_into(&bytes(&mine)[..], &mut gathered[..]);
        let inputs: Vec<Tensor> = gathered
            .chunks_exact(bytes(&mine).len().max(1))
            .take(size)
            .map(|part| {
                detcheck::value::TensorView::new(dtype, &[len], part)
                    .expect("a rank's input bytes")
                    .to_tensor()
            })
            .collect();
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            for mode in ReductionMode::ALL {
                let mut device = gpu.upload(&mine).map_err(|e| e.to_string())?;
                let outcome = comm.allreduce_device(&mut device, op, mode);
                let line = format!("{mode} {op} {dtype}[{len}] x{size}");
                if mode == ReductionMode::ArrivalOrder {
                    let refused = matches!(outcome, Err(CommError::InvalidArgument { .. }));
                    all_passed &= refused;
                    if rank == 0 {
                        let verdict = if refused { "PASS" } else { "FAIL" };
                        println!("{verdict} {line}: refused (a thread-rank control): {refused}");
                    }
                    continue;
                }
                outcome.map_err(|e| e.to_string())?;
                let result = bytes(&gpu.download(&device).map_err(|e| e.to_string())?);
                // (a) identical on every rank: every rank's md5 of its result.
                let digest = Md5Digest::of_bytes(&result).0;
                let mut digests = vec![0u8; 16 * size];
                world.all_gather_into(&digest[..], &mut digests[..]);
                let identical = digests.chunks_exact(16).all(|d| d == digest);
                // (b) the CPU's bits, for detcheck's own schedules; every rank's verdict.
                let cpu = if mode.is_backend_independent() {
                    Some(cpu_allreduce(&inputs, op, mode)? == result)
                } else {
                    None
                };
                let mut verdicts = vec![0u8; size];
                world.all_gather_into(&[u8::from(cpu.unwrap_or(true))][..], &mut verdicts[..]);
                let cpu_equal = verdicts.iter().all(|&v| v == 1);
                let passed = identical && cpu_equal;
                all_passed &= passed;
                if rank == 0 {
                    let verdict = if passed { "PASS" } else { "FAIL" };
                    let cpu = match cpu {
                        Some(_) => format!("the CPU's bits on every rank: {cpu_equal}"),
                        None => "the CPU's bits: not promised (NCCL's own)".to_owned(),
                    };
                    println!("{verdict} {line}: identical on every rank: {identical}; {cpu}");
                }
            }
        }
    }
    Ok(all_passed)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("nccl_allreduce: {e}");
            ExitCode::from(2)
        }
    }
}
