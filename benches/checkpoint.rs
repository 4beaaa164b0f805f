//! `cargo bench --bench checkpoint`: checkpoint write and read time for the `train` scenario's
//! state (the figures in docs/benchmarks.md).
//!
//! One rank's state, as `train` saves it: the four parameter tensors, Adam's two moments, the
//! dropout generator and the counters. Write = safetensors + JSON, each written to a temporary
//! file, fsynced and renamed; read = both files read, md5 and identity checked, tensors decoded.
//! Medians of the repetitions, writes and reads alternating.

use detcheck::checkpoint::{load_checkpoint, save_checkpoint, CheckpointIdentity, RankCheckpoint};
use detcheck::value::{derive_stream, Stream, Tensor, TensorData};
use std::time::Instant;

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// The state `train` checkpoints for a `d → h → c` MLP with Adam.
fn train_state(d: usize, h: usize, c: usize, step: u64) -> RankCheckpoint {
    let mut rng = derive_stream(1, Stream::Init, 0, 0);
    let mut tensor = |shape: Vec<usize>| {
        let n = shape.iter().product();
        Tensor::new(
            shape,
            TensorData::F32((0..n).map(|_| rng.normal_f32()).collect()),
        )
        .expect("shape matches")
    };
    let mut state = RankCheckpoint::new(step);
    let len = h * d + h + c * h + c;
    for (name, shape) in [
        ("param/fc1.weight", vec![h, d]),
        ("param/fc1.bias", vec![h]),
        ("param/fc2.weight", vec![c, h]),
        ("param/fc2.bias", vec![c]),
        ("optimizer/first_moment", vec![len]),
        ("optimizer/second_moment", vec![len]),
    ] {
        state.tensors.insert(name.into(), tensor(shape));
    }
    state
        .generators
        .insert("dropout".into(), derive_stream(1, Stream::Dropout, 0, 0));
    for (name, value) in [
        ("optimizer_steps", step),
        ("loader/epoch", 1),
        ("loader/batch", 3),
    ] {
        state.counters.insert(name.into(), value);
    }
    state
}

fn main() {
    let reps = 7;
    println!("## Checkpoint write and read, one rank of `train` with Adam (median of {reps})\n");
    println!("| model (d → h → c) | parameters | bytes | write | read | write MB/s | read MB/s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let identity = CheckpointIdentity {
        fingerprint: "bench".into(),
        seed: 1,
        world_size: 1,
        rank: 0,
    };
    for (d, h, c, label) in [
        (16, 32, 4, "16 → 32 → 4 (train_adam_4ranks)"),
        (64, 256, 10, "64 → 256 → 10 (train_large_8ranks)"),
        (1024, 4096, 1000, "1024 → 4096 → 1000"),
    ] {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let mut writes = Vec::new();
        let mut reads = Vec::new();
        let mut bytes = 0;
        for rep in 0..reps {
            let state = train_state(d, h, c, rep as u64 + 1);
            let start = Instant::now();
            let json = save_checkpoint(dir.path(), &identity, &state).expect("written");
            writes.push(start.elapsed().as_secs_f64());
            let start = Instant::now();
            let back = load_checkpoint(dir.path(), &identity, None).expect("read");
            reads.push(start.elapsed().as_secs_f64());
            assert_eq!(back, state, "a checkpoint reads back exactly");
            bytes = std::fs::metadata(&json).map_or(0, |m| m.len())
                + std::fs::metadata(json.with_extension("safetensors")).map_or(0, |m| m.len());
        }
        let params = h * d + h + c * h + c;
        let (write, read) = (median(writes), median(reads));
        let mb = bytes as f64 / 1e6;
        println!(
            "| {label} | {params} | {bytes} | {:.2} ms | {:.2} ms | {:.0} | {:.0} |",
            write * 1e3,
            read * 1e3,
            mb / write,
            mb / read
        );
    }
}
