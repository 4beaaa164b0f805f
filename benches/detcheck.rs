//! `cargo bench --bench detcheck [md5|allreduce|record|reprosum|columns|train]...`: the figures in
//! docs/benchmarks.md. `allreduce_repro` (only when named) is the quick check for work on the
//! reproducible kernels: `reproducible` against `arrival_order` alone, 1–64 MiB.
//!
//! Every comparison is measured side by side in one run: the contenders alternate within each
//! repetition and the median of the repetitions is reported, so a noisy shared machine shifts both
//! sides alike. Ratios are the figures to quote; absolute times depend on the machine.

use detcheck::comm::{launch_threads, Communicator, LaunchConfig};
use detcheck::record::RecordLevel;
use detcheck::run::run_once;
use detcheck::value::{Md5Digest, ReductionMode, Stats};
use detcheck::{CheckOptions, KindRegistry, ReduceOp, ScenarioSpec, Tensor};
use md5::{Digest as _, Md5};
use std::hint::black_box;
use std::time::{Duration, Instant};

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn time(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64()
}

fn mib_per_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / (1024.0 * 1024.0)
}

/// Uniform values in [-0.5, 0.5): cheap to draw, and 40 sums of 4 ranks stay far from overflow.
fn random_f32(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = detcheck::value::derive_stream(seed, detcheck::value::Stream::Data, 0, 0);
    (0..len).map(|_| rng.uniform_f32() - 0.5).collect()
}

/// md5 throughput of the recorder's digest path vs raw md-5 over the same bytes.
fn bench_md5() {
    let len = 16 << 20; // 64 MiB of f32
    let tensor = Tensor::from_vec(random_f32(len, 1));
    let bytes: &[u8] = bytemuck::cast_slice(tensor.values::<f32>().expect("f32"));
    let reps = 7;
    let (mut raw, mut recorder, mut stats) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        raw.push(time(|| {
            black_box(Md5::digest(black_box(bytes)));
        }));
        recorder.push(time(|| {
            black_box(Md5Digest::of_tensor(black_box(&tensor)));
        }));
        stats.push(time(|| {
            black_box(Stats::of_tensor(black_box(&tensor)));
        }));
    }
    let (raw, recorder, stats) = (median(raw), median(recorder), median(stats));
    let record = recorder + stats;
    println!("## md5 of a 64 MiB f32 tensor (median of {reps})\n");
    println!("| path | MiB/s | vs raw md-5 |\n| --- | ---: | ---: |");
    println!(
        "| raw md-5 over the bytes | {:.0} | 1.00× |",
        mib_per_s(bytes.len(), raw)
    );
    println!(
        "| recorder digest (`Md5Digest::of_tensor`) | {:.0} | {:.2}× |",
        mib_per_s(bytes.len(), recorder),
        raw / recorder
    );
    println!(
        "| stats alone (`Stats::of_tensor`) | {:.0} | {:.2}× |",
        mib_per_s(bytes.len(), stats),
        raw / stats
    );
    println!(
        "| full record (md5 + stats) | {:.0} | {:.2}× |\n",
        mib_per_s(bytes.len(), record),
        raw / record
    );
}

/// Seconds per allreduce of `len` f32 on `ranks` thread ranks in `mode`, timed on rank 0 between
/// barriers over `iters` calls.
fn allreduce_secs(ranks: usize, len: usize, mode: ReductionMode, iters: usize) -> f64 {
    let config = LaunchConfig::new(ranks);
    let times = launch_threads(&config, move |comm| {
        let mut tensor = Tensor::from_vec(random_f32(len, comm.rank() as u64));
        comm.allreduce(&mut tensor, ReduceOp::Sum, mode)?; // warm-up: page faults, caches
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..iters {
            comm.allreduce(&mut tensor, ReduceOp::Sum, mode)?;
        }
        comm.barrier()?;
        black_box(&tensor);
        Ok(start.elapsed().as_secs_f64() / iters as f64)
    })
    .expect("benchmark ranks do not fail");
    times[0]
}

fn bench_allreduce() {
    let ranks = 4;
    let reps = 9;
    println!("## Allreduce on {ranks} thread ranks, f32 (median of {reps} launches)\n");
    println!(
        "busbw = bytes/time · 2(n−1)/n, as nccl-tests. Ratio: time / time of `arrival_order`.\n"
    );
    println!("| size | mode | time | busbw GB/s | vs arrival_order |");
    println!("| ---: | --- | ---: | ---: | ---: |");
    for size in [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20] {
        let len = size / 4;
        let iters = (((256usize << 20) / size).clamp(3, 40)).min(40);
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); ReductionMode::ALL.len()];
        for rep in 0..reps {
            // Rotate which mode goes first, so no mode always follows the same one.
            for k in 0..ReductionMode::ALL.len() {
                let i = (k + rep) % ReductionMode::ALL.len();
                samples[i].push(allreduce_secs(ranks, len, ReductionMode::ALL[i], iters));
            }
        }
        let medians: Vec<f64> = samples.into_iter().map(median).collect();
        let arrival = medians[ReductionMode::ALL
            .iter()
            .position(|&m| m == ReductionMode::ArrivalOrder)
            .expect("arrival_order is a mode")];
        for (&mode, &secs) in ReductionMode::ALL.iter().zip(&medians) {
            let busbw = size as f64 / secs * 2.0 * (ranks - 1) as f64 / ranks as f64 / 1e9;
            println!(
                "| {} | {mode} | {} | {busbw:.2} | {:.2}× |",
                human_size(size),
                human_time(secs),
                secs / arrival
            );
        }
    }
    println!();
}

/// `reproducible` against `arrival_order` only, alternating within each repetition: the quick
/// figure for work on the reproducible kernels (`cargo bench --bench detcheck -- allreduce_repro`).
fn bench_allreduce_repro() {
    let ranks = 4;
    let reps = 9;
    let modes = [ReductionMode::ArrivalOrder, ReductionMode::Reproducible];
    println!("## Allreduce on {ranks} thread ranks, f32, reproducible vs arrival_order (median of {reps})\n");
    println!("| size | arrival_order | reproducible | ratio |\n| ---: | ---: | ---: | ---: |");
    for size in [1 << 20, 16 << 20, 64 << 20] {
        let len = size / 4;
        let iters = ((256usize << 20) / size).clamp(3, 40);
        let mut samples = [Vec::new(), Vec::new()];
        for rep in 0..reps {
            for k in 0..2 {
                let i = (k + rep) % 2;
                samples[i].push(allreduce_secs(ranks, len, modes[i], iters));
            }
        }
        let [arrival, repro] = samples.map(median);
        println!(
            "| {} | {} | {} | {:.2}× |",
            human_size(size),
            human_time(arrival),
            human_time(repro),
            repro / arrival
        );
    }
    println!();
}

/// Single-core elementwise sum of 4 contributions (what a rank does with its allreduce chunk):
/// `reproducible_sum_columns_f32` against a plain f32 loop over the same columns (copy the first,
/// add the others: what a user would write, built for baseline x86-64), in ns per term, with the
/// data in L2 (64 K elements per contribution) and in memory (4 M).
fn bench_columns() {
    let reps = 9;
    println!("## Elementwise sum of 4 contributions, one core, f32 (median of {reps})\n");
    println!("| elements | plain f32 | reproducible | ratio |");
    println!("| ---: | ---: | ---: | ---: |");
    for len in [1usize << 16, 1 << 22] {
        let rows: Vec<Vec<f32>> = (0..4).map(|r| random_f32(len, 20 + r)).collect();
        let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let iters = ((1usize << 24) / len).max(1);
        let per_term = |secs: f64| secs * 1e9 / (iters * 4 * len) as f64;
        let plain = || {
            let mut out = refs[0].to_vec();
            for r in &refs[1..] {
                out.iter_mut().zip(r.iter()).for_each(|(a, &b)| *a += b);
            }
            out
        };
        let (mut p, mut r) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            p.push(time(|| {
                for _ in 0..iters {
                    black_box(plain());
                }
            }));
            r.push(time(|| {
                for _ in 0..iters {
                    black_box(detcheck::value::reproducible_sum_columns_f32(black_box(&refs)).ok());
                }
            }));
        }
        let (p, r) = (median(p), median(r));
        println!(
            "| {len} | {:.3} ns/term | {:.3} ns/term | {:.2}× |",
            per_term(p),
            per_term(r),
            r / p
        );
    }
    println!();
}

/// Single-core sum of one buffer: the reproducible sum against a plain sequential f32 sum.
fn bench_reprosum() {
    let reps = 9;
    println!("## Local sum, one core, f32 (median of {reps})\n");
    println!("| elements | plain f32 sum | reproducible | throughput vs plain |");
    println!("| ---: | ---: | ---: | ---: |");
    for len in [1usize << 16, 1 << 20, 1 << 24] {
        let data = random_f32(len, 7);
        let iters = ((1usize << 26) / len).max(1);
        let time = |f: &dyn Fn(&[f32]) -> f32| {
            let start = Instant::now();
            for _ in 0..iters {
                black_box(f(black_box(&data)));
            }
            start.elapsed().as_secs_f64() / iters as f64
        };
        let plain = |d: &[f32]| d.iter().fold(0.0f32, |a, &x| a + x);
        let repro = |d: &[f32]| detcheck::value::reproducible_sum_f32(d);
        let (mut p, mut r) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            p.push(time(&plain));
            r.push(time(&repro));
        }
        let (p, r) = (median(p), median(r));
        println!(
            "| {len} | {} | {} | {:.2}× |",
            human_time(p),
            human_time(r),
            p / r
        );
    }
    println!();
}

/// Step time of the train scenario (recording on) with `reproducible` against `ring`: the two
/// modes alternate within each repetition, the first of them rotating, and each repetition gives
/// one ratio; the medians and the range of the ratios are reported.
fn bench_train_modes() {
    let reps = 9;
    let modes = ["ring", "reproducible"];
    println!(
        "## Train step time by reduction mode, 4 thread ranks (median of {reps}, alternating, \
         the first mode rotating; ratio: median and range of the {reps} paired ratios)\n"
    );
    println!("| global batch | ring | reproducible | ratio | range |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for global_batch in [512, 4096] {
        let scenarios = modes.map(|mode| {
            let text = serde_json::to_string(&train_spec(global_batch))
                .expect("specs serialize")
                .replace("\"ring\"", &format!("\"{mode}\""));
            let spec: ScenarioSpec = serde_json::from_str(&text).expect("valid spec");
            KindRegistry::builtin()
                .build(spec, std::path::Path::new("bench.json"))
                .expect("valid scenario")
        });
        let mut samples = [Vec::new(), Vec::new()];
        for rep in 0..reps {
            for k in 0..modes.len() {
                let i = (rep + k) % modes.len();
                let scenario = &scenarios[i];
                let start = Instant::now();
                run_once(scenario, &CheckOptions::default(), None, 1).expect("runs");
                samples[i].push(start.elapsed().as_secs_f64() / scenario.spec.steps as f64);
            }
        }
        let mut ratios: Vec<f64> = samples[1]
            .iter()
            .zip(&samples[0])
            .map(|(repro, ring)| repro / ring)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let [ring, repro] = samples.map(median);
        println!(
            "| {global_batch} | {} | {} | {:.2}× | {:.2}–{:.2} |",
            human_time(ring),
            human_time(repro),
            median(ratios.clone()),
            ratios[0],
            ratios[ratios.len() - 1]
        );
    }
    println!();
}

fn train_spec(global_batch: usize) -> ScenarioSpec {
    let text = format!(
        r#"{{"name": "bench_train_{global_batch}", "kind": "train", "world_size": 4, "steps": 10,
            "seed": 1, "reduction": "ring", "deterministic_comm": true, "expect": "identical",
            "params": {{"input_dim": 64, "hidden": 256, "classes": 10, "dataset_size": 4096,
                        "global_batch": {global_batch}, "optimizer": {{"kind": "adam", "lr": 0.001}}}}}}"#
    );
    serde_json::from_str(&text).expect("the benchmark spec is valid")
}

/// Step time of the train scenario with recording off, digest only, and digest plus stats.
fn bench_record() {
    for global_batch in [512, 4096] {
        bench_record_at(global_batch);
    }
}

fn bench_record_at(global_batch: usize) {
    let reps = 5;
    let levels = [
        ("off", RecordLevel::Off),
        ("md5", RecordLevel::Digest),
        ("md5 + stats", RecordLevel::Stats),
    ];
    let spec = train_spec(global_batch);
    let steps = spec.steps as f64;
    let scenario = KindRegistry::builtin()
        .build(spec, std::path::Path::new("bench_train.json"))
        .expect("the benchmark spec builds");
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); levels.len()];
    let mut records = vec![0; levels.len()];
    for _ in 0..reps {
        for (i, &(_, level)) in levels.iter().enumerate() {
            let options = CheckOptions {
                record_level: level,
                ..CheckOptions::default()
            };
            let mut trace = None;
            samples[i].push(time(|| {
                trace = Some(run_once(&scenario, &options, None, 1).expect("bench run"));
            }));
            records[i] = trace.map_or(0, |t| t.num_records());
        }
    }
    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    println!(
        "## Recording overhead: `train`, 4 thread ranks, 64→256→10 MLP (19 k parameters), \
         global batch {global_batch}; every parameter, gradient and local gradient recorded every \
         step (median of {reps})\n"
    );
    println!("| recording | records | step time | vs off |\n| --- | ---: | ---: | ---: |");
    for (i, (name, _)) in levels.iter().enumerate() {
        println!(
            "| {name} | {} | {} | {:.3}× |",
            records[i],
            human_time(medians[i] / steps),
            medians[i] / medians[0]
        );
    }
    println!();
}

fn human_size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn human_time(secs: f64) -> String {
    let d = Duration::from_secs_f64(secs);
    if d < Duration::from_millis(1) {
        format!("{:.1} µs", secs * 1e6)
    } else {
        format!("{:.2} ms", secs * 1e3)
    }
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument selects groups by name.
    let selected: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |name: &str| selected.is_empty() || selected.iter().any(|s| s == name);
    if wants("md5") {
        bench_md5();
    }
    if wants("allreduce") {
        bench_allreduce();
    }
    if selected.iter().any(|s| s == "allreduce_repro") {
        bench_allreduce_repro();
    }
    if wants("record") {
        bench_record();
    }
    if wants("reprosum") {
        bench_reprosum();
    }
    if wants("columns") {
        bench_columns();
    }
    if wants("train") {
        bench_train_modes();
    }
}
