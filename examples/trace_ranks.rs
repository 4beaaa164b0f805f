//! A program of the user's own under detcheck's `command` kind (`processes` launcher): each rank
//! draws its shard of a dataset, weighs it by named features, and records what it computed with
//! [`TraceWriter::from_env`]; outside detcheck it runs and records nothing.
//!
//! ```text
//! trace_ranks --seed S --steps N [--plant-hashmap-order]
//!             [--stop-at K --checkpoint DIR | --resume DIR]
//! trace_ranks --seed S --steps N --batch-size B [--plant-batch-split]
//! ```
//!
//! `--plant-hashmap-order` sums the features in `HashMap` iteration order, which Rust seeds from
//! OS entropy in every process: the negative control `repeat` must catch. `--stop-at` and
//! `--resume` checkpoint and restore the running total (the `restart` check). The scenarios are
//! in `examples/programs/`.
//!
//! `--batch-size B` serves a stream of `4 × N` samples in batches of B (the last one shorter),
//! each sample's output row two weighted sums of its features, and records as the Python
//! recorder does: each batch's outputs at step = the batch, or, when the launch asks for rows
//! (`DETCHECK_RECORD=rows`: the `batch_sizes` check), each sample's row at step = the sample.
//! `--plant-batch-split` splits each sum into as many partial sums as the batch has samples (a
//! kernel that picks its split by the batch size): the negative control `batch_sizes` must
//! catch.

use detcheck::file::TraceWriter;
use detcheck::launch::{RecordMode, RecorderPlan, ROWS_KEY};
use detcheck::value::{derive_stream, Stream, TensorData};
use detcheck::Tensor;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

/// How many named features every rank weighs.
const FEATURES: usize = 32;

/// The feature names and weights every rank uses: `f00`..`f31`, weights of mixed signs and
/// magnitudes (so that the order of their sum shows in the bits).
fn features() -> Vec<(String, f32)> {
    (0..FEATURES)
        .map(|i| {
            let w = (i as f32 * 0.37 - 5.0) * if i.is_multiple_of(3) { 10.0 } else { 0.1 };
            (format!("f{i:02}"), w)
        })
        .collect()
}

struct Args {
    seed: u64,
    steps: u64,
    plant_hashmap_order: bool,
    stop_at: Option<u64>,
    checkpoint: Option<PathBuf>,
    resume: Option<PathBuf>,
    batch_size: Option<usize>,
    plant_batch_split: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seed: 0,
        steps: 4,
        plant_hashmap_order: false,
        stop_at: None,
        checkpoint: None,
        resume: None,
        batch_size: None,
        plant_batch_split: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--seed" => args.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--steps" => args.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--stop-at" => {
                args.stop_at = Some(value()?.parse().map_err(|e| format!("--stop-at: {e}"))?);
            }
            "--checkpoint" => args.checkpoint = Some(PathBuf::from(value()?)),
            "--resume" => args.resume = Some(PathBuf::from(value()?)),
            "--plant-hashmap-order" => args.plant_hashmap_order = true,
            "--batch-size" => {
                let b: usize = value()?.parse().map_err(|e| format!("--batch-size: {e}"))?;
                args.batch_size = Some(b.max(1));
            }
            "--plant-batch-split" => args.plant_batch_split = true,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(args)
}

fn run() -> Result<(), String> {
    let args = parse()?;
    let Some(mut writer) = TraceWriter::from_env().map_err(|e| e.to_string())? else {
        eprintln!(
            "trace_ranks: not launched by detcheck (no DETCHECK_TRACE_DIR): nothing recorded"
        );
        return Ok(());
    };
    let rank = writer_rank();
    if let Some(batch) = args.batch_size {
        serve(&mut writer, &args, rank, batch)?;
        writer.finish().map_err(|e| e.to_string())?;
        return Ok(());
    }
    let state_file = |dir: &PathBuf| dir.join(format!("rank{rank}.total"));
    let (mut total, first) = match &args.resume {
        Some(dir) => {
            let text = std::fs::read_to_string(state_file(dir)).map_err(|e| e.to_string())?;
            let (step, bits) = text.trim().split_once(' ').ok_or("a bad checkpoint")?;
            let step: u64 = step.parse().map_err(|_| "a bad checkpoint step")?;
            let bits = u64::from_str_radix(bits, 16).map_err(|_| "bad checkpoint bits")?;
            (f64::from_bits(bits), step)
        }
        None => (0.0f64, 0),
    };
    let last = args.stop_at.unwrap_or(args.steps);
    let named = features();
    let weights: HashMap<String, f32> = named.iter().cloned().collect();
    for step in first..last {
        let mut rng = derive_stream(args.seed, Stream::Data, rank, step);
        let shard: Vec<f32> = (0..8 * FEATURES).map(|_| rng.normal_f32()).collect();
        let names: Vec<&String> = if args.plant_hashmap_order {
            weights.keys().collect() // the order of this process's random hash keys
        } else {
            let mut sorted: Vec<&String> = weights.keys().collect();
            sorted.sort();
            sorted
        };
        // One weighted sum per feature, then their sum in the order above: f32 addition is not
        // associative, so the order shows in the bits.
        let mut score = 0.0f32;
        for name in names {
            let feature = named.iter().position(|(n, _)| n == name).unwrap_or(0);
            let column: f32 = shard.iter().skip(feature).step_by(FEATURES).sum();
            score += column * weights[name];
        }
        total += f64::from(score);
        writer
            .record(step, "shard", &Tensor::from_vec(shard))
            .map_err(|e| e.to_string())?;
        writer
            .record(step, "score", &Tensor::scalar(score))
            .map_err(|e| e.to_string())?;
        writer
            .record(step, "total", &Tensor::from_vec(vec![total]))
            .map_err(|e| e.to_string())?;
    }
    if let (Some(at), Some(dir)) = (args.stop_at, &args.checkpoint) {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        std::fs::write(state_file(dir), format!("{at} {:016x}\n", total.to_bits()))
            .map_err(|e| e.to_string())?;
    }
    writer.finish().map_err(|e| e.to_string())?;
    Ok(())
}

/// Serves `4 × steps` samples in batches of `batch`: each sample's output row is two weighted
/// sums of its features, recorded per batch, or per sample when the launch asks for rows.
fn serve(writer: &mut TraceWriter, args: &Args, rank: u64, batch: usize) -> Result<(), String> {
    let rows = RecorderPlan::from_env().map_err(|e| e.to_string())?.record == RecordMode::Rows;
    if rows {
        // What tells the `batch_sizes` check that this trace holds samples.
        writer
            .environment_handle()
            .set(ROWS_KEY, "samples")
            .map_err(|e| e.to_string())?;
    }
    let samples = 4 * args.steps;
    let named = features();
    let heads: [Vec<f32>; 2] = [
        named.iter().map(|(_, w)| *w).collect(),
        named.iter().map(|(_, w)| 1.0 / (w + 0.05)).collect(),
    ];
    // A kernel that splits its sum into one partial sum per sample of the batch (the control).
    let split = if args.plant_batch_split {
        batch.min(FEATURES)
    } else {
        1
    };
    let mut first = 0;
    for step in 0.. {
        let end = (first + batch as u64).min(samples);
        if first == end {
            break;
        }
        let mut out = Vec::with_capacity(2 * batch);
        for sample in first..end {
            let mut rng = derive_stream(args.seed, Stream::Data, rank, sample);
            let x: Vec<f32> = (0..FEATURES).map(|_| rng.normal_f32()).collect();
            for head in &heads {
                let chunk = FEATURES.div_ceil(split);
                let partial =
                    |c: &[f32], w: &[f32]| -> f32 { c.iter().zip(w).map(|(a, b)| a * b).sum() };
                let y: f32 = x
                    .chunks(chunk)
                    .zip(head.chunks(chunk))
                    .map(|(c, w)| partial(c, w))
                    .sum();
                out.push(y);
            }
        }
        if rows {
            for (i, row) in out.chunks(2).enumerate() {
                let tensor = Tensor::from_vec(row.to_vec());
                writer
                    .record(first + i as u64, "head", &tensor)
                    .map_err(|e| e.to_string())?;
            }
        } else {
            let n = (end - first) as usize;
            let tensor =
                Tensor::new(vec![n, 2], TensorData::F32(out)).map_err(|e| e.to_string())?;
            writer
                .record(step, "head", &tensor)
                .map_err(|e| e.to_string())?;
        }
        first = end;
    }
    Ok(())
}

/// This process's rank, as detcheck's `processes` launcher gives it.
fn writer_rank() -> u64 {
    std::env::var("DETCHECK_RANK")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trace_ranks: {e}");
            ExitCode::from(2)
        }
    }
}
