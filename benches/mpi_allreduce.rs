//! `scripts/mpi-bench.sh` (or `mpirun -n 4 target/release/deps/mpi_allreduce-*`): allreduce on MPI
//! ranks, each mode against `native` (`MPI_Allreduce` with the pinned algorithm), f32, 4 KiB–64 MiB.
//! Every process runs the same loop (SPMD); rank 0 prints. In each repetition every mode is timed
//! once, in an order that rotates between repetitions, and its ratio to `native` of the same
//! repetition is taken: the table gives the median time, and the median and range of the ratios.
//!
//! Arguments (optional): the number of repetitions (default 7), then sizes in KiB (default 4 KiB
//! to 64 MiB).

use detcheck::check::run_on_mpi_world;
use detcheck::comm::Communicator;
use detcheck::value::{ReduceOp, ReductionMode, Tensor, TensorData};
use std::time::{Duration, Instant};

fn data(len: usize, rank: usize) -> Vec<f32> {
    let mut rng = detcheck::value::derive_stream(5, detcheck::value::Stream::Data, rank as u64, 0);
    (0..len).map(|_| rng.normal_f32()).collect()
}

/// Seconds per allreduce, timed between barriers over `iters` calls.
fn seconds(comm: &dyn Communicator, len: usize, mode: ReductionMode, iters: usize) -> f64 {
    let input = data(len, comm.rank());
    let mut tensor = Tensor::from_vec(input.clone());
    comm.allreduce(&mut tensor, ReduceOp::Sum, mode)
        .expect("benchmark ranks do not fail");
    comm.barrier().expect("barrier");
    let start = Instant::now();
    for _ in 0..iters {
        // Sums of the same inputs, so values stay finite over many calls.
        if let TensorData::F32(values) = tensor.data_mut() {
            values.copy_from_slice(&input);
        }
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

fn size_name(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let reps = args.first().copied().unwrap_or(7).max(1);
    let sizes: Vec<usize> = if args.len() > 1 {
        args[1..].iter().map(|kib| kib << 10).collect()
    } else {
        [
            4usize,
            16,
            64,
            256,
            512,
            1 << 10,
            4 << 10,
            16 << 10,
            64 << 10,
        ]
        .iter()
        .map(|kib| kib << 10)
        .collect()
    };
    let modes = [
        ReductionMode::Native,
        ReductionMode::Ring,
        ReductionMode::RankOrdered,
        ReductionMode::Reproducible,
        ReductionMode::ArrivalOrder,
    ];
    run_on_mpi_world(Duration::from_secs(120), |comm| {
        if comm.rank() == 0 {
            println!(
                "## Allreduce on {} MPI ranks, f32 ({reps} interleaved repetitions)\n",
                comm.size()
            );
            println!("| size | mode | time (median) | vs native: median | range |");
            println!("| ---: | --- | ---: | ---: | ---: |");
        }
        for &size in &sizes {
            // About 64 MiB of data per timed sample, at least 3 and at most 2000 calls.
            let iters = ((64usize << 20) / size).clamp(3, 2000);
            let mut samples = vec![Vec::new(); modes.len()];
            for rep in 0..reps {
                for k in 0..modes.len() {
                    let i = (k + rep) % modes.len();
                    samples[i].push(seconds(comm, size / 4, modes[i], iters));
                }
            }
            if comm.rank() == 0 {
                for (mode, times) in modes.iter().zip(&samples) {
                    let ratios: Vec<f64> = times
                        .iter()
                        .zip(&samples[0])
                        .map(|(t, native)| t / native)
                        .collect();
                    let (lo, hi) = ratios
                        .iter()
                        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
                    let t = median(times.clone());
                    let time = if t < 1e-3 {
                        format!("{:.1} µs", t * 1e6)
                    } else {
                        format!("{:.2} ms", t * 1e3)
                    };
                    println!(
                        "| {} | {mode} | {time} | {:.2}× | {lo:.2}–{hi:.2} |",
                        size_name(size),
                        median(ratios)
                    );
                }
            }
        }
    })
    .expect("MPI starts");
}
