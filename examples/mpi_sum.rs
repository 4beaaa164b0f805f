//! An MPI program of the user's own (rsmpi, no detcheck communicator) under detcheck's `command`
//! kind with the `mpirun` launcher; build with `--features mpi`.
//!
//! Every rank holds its shard of one global dataset (rows drawn from the row's global index, so
//! the data does not depend on the number of ranks). Each step the ranks send their rows to rank
//! 0, which adds them in global row order and broadcasts the column sums: the same bits at any
//! world size. Every rank records its shard (`shard/sum`) and the replicated result
//! (`global/sum`) with [`TraceWriter::from_env`].
//!
//! `--plant-any-source` is the negative control: rank 0 receives the ranks' partial sums from
//! `MPI_ANY_SOURCE` and adds them in the order they arrive. detcheck starts the ranks in another
//! order in every launch, so `repeat` catches it every time (with 3 ranks or more).
//!
//! ```text
//! mpirun -n 4 mpi_sum --seed S --steps N [--plant-any-source]
//! ```

use detcheck::file::TraceWriter;
use detcheck::value::{derive_stream, Stream};
use detcheck::Tensor;
use mpi::traits::*;
use std::process::ExitCode;

/// Rows of the global dataset and columns of a row.
const ROWS: usize = 96;
const COLUMNS: usize = 64;

fn row(seed: u64, step: u64, index: usize) -> Vec<f32> {
    let mut rng = derive_stream(seed, Stream::Data, index as u64, step);
    (0..COLUMNS)
        .map(|c| rng.normal_f32() * (1.0 + c as f32))
        .collect()
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (mut seed, mut steps, mut plant) = (0u64, 3u64, false);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--seed" => seed = args.next().and_then(|v| v.parse().ok()).ok_or("--seed N")?,
            "--steps" => {
                steps = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--steps N")?
            }
            "--plant-any-source" => plant = true,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let universe = mpi::initialize().ok_or("MPI is already initialized")?;
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let mut writer = TraceWriter::from_env().map_err(|e| e.to_string())?;
    if let (Some(w), Some(library)) = (writer.as_mut(), detcheck::comm::mpi_library_version()) {
        // The exact library this program is linked with, in the trace's environment snapshot.
        w.set_environment("mpi.library", &library)
            .map_err(|e| e.to_string())?;
    }
    let mine = (rank * ROWS / size)..((rank + 1) * ROWS / size);
    for step in 0..steps {
        let rows: Vec<Vec<f32>> = mine.clone().map(|i| row(seed, step, i)).collect();
        let mut partial = vec![0.0f32; COLUMNS];
        for r in &rows {
            for (p, x) in partial.iter_mut().zip(r) {
                *p += x;
            }
        }
        let mut global = vec![0.0f32; COLUMNS];
        if plant {
            // Partial sums added in arrival order: depends on timing and on the world size.
            if rank == 0 {
                global.copy_from_slice(&partial);
                for _ in 1..size {
                    let (other, _) = world.any_process().receive_vec::<f32>();
                    for (g, x) in global.iter_mut().zip(&other) {
                        *g += x;
                    }
                }
            } else {
                world.process_at_rank(0).send(&partial[..]);
            }
        } else {
            // Every row to rank 0, added in global row order: the same at any world size.
            let flat: Vec<f32> = rows.concat();
            if rank == 0 {
                let mut all = flat;
                for source in 1..size {
                    let (more, _) = world.process_at_rank(source as i32).receive_vec::<f32>();
                    all.extend(more);
                }
                for r in all.chunks(COLUMNS) {
                    for (g, x) in global.iter_mut().zip(r) {
                        *g += x;
                    }
                }
            } else {
                world.process_at_rank(0).send(&flat[..]);
            }
        }
        world.process_at_rank(0).broadcast_into(&mut global[..]);
        if let Some(w) = writer.as_mut() {
            w.record(step, "shard/sum", &Tensor::from_vec(partial))
                .map_err(|e| e.to_string())?;
            w.record_replicated(step, "global/sum", &Tensor::from_vec(global))
                .map_err(|e| e.to_string())?;
        }
    }
    if let Some(w) = writer {
        w.finish().map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mpi_sum: {e}");
            ExitCode::from(2)
        }
    }
}
