//! `scripts/mpi-bench.sh` (or `mpirun -n 4 target/release/deps/mpi_allreduce-*`): allreduce on MPI
//! ranks, each mode against `native` (`MPI_Allreduce` with the pinned algorithm), f32, 1–64 MiB.
//! Every process runs the same loop (SPMD); rank 0 prints. Modes are interleaved and repeated, and
//! each figure is the median of the repetitions, so the ratios are taken side by side.

use detcheck::check::run_on_mpi_world;
use detcheck::comm::Communicator;
use detcheck::value::{ReduceOp, ReductionMode, Tensor};
use std::time::{Duration, Instant};

fn data(len: usize, rank: usize) -> Vec<f32> {
    let mut rng = detcheck::value::derive_stream(5, detcheck::value::Stream::Data, rank as u64, 0);
    (0..len).map(|_| rng.normal_f32()).collect()
}

/// Seconds per allreduce, timed between barriers over `iters` calls.
fn seconds(comm: &dyn Communicator, len: usize, mode: ReductionMode, iters: usize) -> f64 {
    let mut tensor = Tensor::from_vec(data(len, comm.rank()));
    comm.allreduce(&mut tensor, ReduceOp::Sum, mode)
        .expect("benchmark ranks do not fail");
    comm.barrier().expect("barrier");
    let start = Instant::now();
    for _ in 0..iters {
        comm.allreduce(&mut tensor, ReduceOp::Sum, mode)
            .expect("benchmark ranks do not fail");
    }
    comm.barrier().expect("barrier");
    start.elapsed().as_secs_f64() / iters as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let modes = [
        ReductionMode::Native,
        ReductionMode::Ring,
        ReductionMode::Reproducible,
        ReductionMode::ArrivalOrder,
    ];
    run_on_mpi_world(Duration::from_secs(120), |comm| {
        let reps = 5;
        if comm.rank() == 0 {
            println!(
                "## Allreduce on {} MPI ranks, f32 (median of {reps} repetitions)\n",
                comm.size()
            );
            println!("| size | mode | time | vs native |");
            println!("| ---: | --- | ---: | ---: |");
        }
        for size in [1usize << 20, 4 << 20, 16 << 20, 64 << 20] {
            let iters = ((256usize << 20) / size).clamp(3, 40);
            let mut samples = vec![Vec::new(); modes.len()];
            for rep in 0..reps {
                for k in 0..modes.len() {
                    let i = (k + rep) % modes.len();
                    samples[i].push(seconds(comm, size / 4, modes[i], iters));
                }
            }
            let medians: Vec<f64> = samples.into_iter().map(median).collect();
            if comm.rank() == 0 {
                for (mode, secs) in modes.iter().zip(&medians) {
                    println!(
                        "| {} MiB | {mode} | {:.2} ms | {:.2}× |",
                        size >> 20,
                        secs * 1e3,
                        secs / medians[0]
                    );
                }
            }
        }
    })
    .expect("MPI starts");
}
