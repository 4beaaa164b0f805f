//! `cargo bench --bench detcheck [md5|md5_many|stats|position|allreduce|record|reprosum|columns|train|strict]...`: the figures in
//! docs/benchmarks.md. `allreduce_repro` (only when named) is the quick check for work on the
//! reproducible kernels: `reproducible` against `arrival_order` alone, 1–64 MiB.
//! `allreduce_ranks` (only when named) is an allreduce's cost against 8 to 1024 thread ranks at
//! fixed bytes per rank.
//!
//! Every comparison is measured side by side in one run: the contenders alternate within each
//! repetition and the median of the repetitions is reported, so a noisy shared machine shifts both
//! sides alike. Ratios are the figures to quote; absolute times depend on the machine.

#[path = "support/cpu.rs"]
mod cpu;
use cpu::process_cpu_secs;
use detcheck::comm::{launch_threads, Communicator, LaunchConfig};
use detcheck::record::RecordLevel;
use detcheck::run::run_once;
use detcheck::value::{
    md5_of_many, DType, Md5Digest, PositionDigest, ReductionMode, Stats, TensorView,
};
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

/// Digest throughput of the recorder's path (the tree digest, `Md5Digest::of_tensor`: 4 KiB
/// chunks side by side in SIMD lanes) vs raw md-5 over the same bytes, for a 64 MiB tensor and
/// a 1 MiB one; contenders alternate, median and range of the repetitions.
fn bench_md5() {
    let reps = 11;
    println!("## The record digest of one tensor (median of {reps}, min-max)\n");
    println!(
        "| tensor | path | MiB/s | vs raw md-5 (median, min-max) |\n| --- | --- | ---: | ---: |"
    );
    for len in [16 << 20, 256 << 10] {
        let tensor = Tensor::from_vec(random_f32(len, 1));
        let bytes: &[u8] = bytemuck::cast_slice(tensor.values::<f32>().expect("f32"));
        let (mut raw, mut tree, mut stats) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            raw.push(time(|| {
                black_box(Md5::digest(black_box(bytes)));
            }));
            tree.push(time(|| {
                black_box(Md5Digest::of_tensor(black_box(&tensor)));
            }));
            stats.push(time(|| {
                black_box(Stats::of_tensor(black_box(&tensor)));
            }));
        }
        let ratios: Vec<f64> = raw.iter().zip(&tree).map(|(r, t)| r / t).collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        let mib = bytes.len() >> 20;
        let label = if mib > 0 {
            format!("{mib} MiB f32")
        } else {
            format!("{} KiB f32", bytes.len() >> 10)
        };
        let (raw, tree, stats) = (median(raw), median(tree), median(stats));
        println!(
            "| {label} | raw md-5 over the bytes | {:.0} | 1.00× |",
            mib_per_s(bytes.len(), raw)
        );
        println!(
            "| {label} | tree digest (`Md5Digest::of_tensor`) | {:.0} | {:.2}× ({lo:.2}-{hi:.2}) |",
            mib_per_s(bytes.len(), tree),
            median(ratios)
        );
        println!(
            "| {label} | stats alone (`Stats::of_tensor`) | {:.0} | {:.2}× |",
            mib_per_s(bytes.len(), stats),
            raw / stats
        );
    }
    println!();
}

/// Stats throughput (`Stats::of_tensor`: max, min, mean, norm, NaN and infinity counts) of f32
/// tensors that fit the core's cache (64 KiB, as `train`'s largest records) and that do not
/// (64 MiB), against single-stream md-5 over the same bytes; contenders alternate, median of
/// the repetitions.
fn bench_stats() {
    let reps = 15;
    println!("## Stats of an f32 tensor, one core (median of {reps})\n");
    println!("| tensor | md-5 | `Stats::of_tensor` | ns per element | vs md-5 |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (label, len) in [("64 KiB", 16usize << 10), ("64 MiB", 16 << 20)] {
        let tensor = Tensor::from_vec(random_f32(len, 7));
        let bytes: &[u8] = bytemuck::cast_slice(tensor.values::<f32>().expect("f32"));
        let iters = ((64usize << 20) / bytes.len()).max(1);
        let (mut md5, mut stats) = (Vec::new(), Vec::new());
        for rep in 0..reps {
            let md5_time = || {
                time(|| {
                    (0..iters).for_each(|_| {
                        black_box(Md5::digest(black_box(bytes)));
                    })
                })
            };
            let stats_time = || {
                time(|| {
                    (0..iters).for_each(|_| {
                        black_box(Stats::of_tensor(black_box(&tensor)));
                    })
                })
            };
            if rep % 2 == 0 {
                md5.push(md5_time());
                stats.push(stats_time());
            } else {
                stats.push(stats_time());
                md5.push(md5_time());
            }
        }
        let (md5, stats) = (median(md5) / iters as f64, median(stats) / iters as f64);
        println!(
            "| {label} | {:.0} MiB/s | {:.0} MiB/s | {:.2} | {:.2}× |",
            mib_per_s(bytes.len(), md5),
            mib_per_s(bytes.len(), stats),
            stats * 1e9 / len as f64,
            md5 / stats
        );
    }
    println!();
}

/// md5 throughput over a set of tensors: single-stream md-5, one tensor after the other, against
/// the recorder's path (`md5_of_many`: many at once in SIMD lanes), and against a `Recorder` at
/// `RecordLevel::Digest` (copy, batch, md5s, records), on the same bytes, alternating in rotated
/// order; median of the repetitions.
fn bench_md5_many() {
    let reps = 15;
    // One step of `train`'s records on one rank (64→256→10: local_grad, grad, param, loss) and
    // sets of equal tensors.
    let train_step: Vec<usize> = [256 * 64, 256, 10 * 256, 10]
        .iter()
        .copied()
        .cycle()
        .take(12)
        .chain([1])
        .collect();
    let mut sets: Vec<(String, Vec<usize>)> = vec![
        (
            "train, 1 step (13 tensors, 228 KiB)".into(),
            train_step.clone(),
        ),
        (
            "train, 5 steps (65 tensors, 1.1 MiB)".into(),
            train_step.repeat(5),
        ),
    ];
    for n in [1, 2, 4, 8, 16, 32] {
        sets.push((format!("{n} × 64 KiB"), vec![16 << 10; n]));
    }
    for n in [8, 16] {
        sets.push((format!("{n} × 1 MiB"), vec![256 << 10; n]));
    }
    println!("## md5 of many tensors at once, one core (median of {reps})\n");
    println!("| tensors | md-5, one by one | `md5_of_many` | vs md-5 | `Recorder` (md5 level) | vs md-5 |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (label, lens) in sets {
        let tensors: Vec<Tensor> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| Tensor::from_vec(random_f32(n, 100 + i as u64)))
            .collect();
        let buffers: Vec<&[u8]> = tensors
            .iter()
            .map(|t| bytemuck::cast_slice(t.values::<f32>().expect("f32")))
            .collect();
        let total: usize = buffers.iter().map(|b| b.len()).sum();
        // At least 8 steps: a recorder lives for a run, and its first batch's buffers are fresh
        // pages (faulted in once per run; a one-batch run of 16 x 1 MiB pays 2x for them).
        let iters = ((32usize << 20) / total).max(8);
        let contenders: [&dyn Fn(); 2] = [
            &|| {
                for b in &buffers {
                    black_box(Md5::digest(black_box(b)));
                }
            },
            &|| {
                black_box(md5_of_many(black_box(&buffers)));
            },
        ];
        // A recorder lives for a run: it records the set `iters` times, as steps, and finishes.
        let recorder = || {
            let mut rec = detcheck::record::Recorder::new(0, RecordLevel::Digest);
            for step in 0..iters as u64 {
                for t in &tensors {
                    rec.record(step, "t", black_box(t));
                }
            }
            black_box(rec.finish());
        };
        let mut samples = vec![Vec::new(); 3];
        for rep in 0..reps {
            for k in 0..3 {
                let i = (k + rep) % 3;
                samples[i].push(
                    match i {
                        2 => time(recorder),
                        _ => time(|| (0..iters).for_each(|_| contenders[i]())),
                    } / iters as f64,
                );
            }
        }
        let [one, many, rec] = [0, 1, 2].map(|i| median(samples[i].clone()));
        println!(
            "| {label} | {:.0} MiB/s | {:.0} MiB/s | {:.2}× | {:.0} MiB/s | {:.2}× |",
            mib_per_s(total, one),
            mib_per_s(total, many),
            one / many,
            mib_per_s(total, rec),
            one / rec
        );
    }
    println!();
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

/// Seconds per two waits on a `std::sync::Barrier` of `ranks` threads (timed on thread 0 over
/// `iters` pairs): the floor of any thread-per-rank collective of two rounds, the wakeups of the
/// operating system alone.
fn two_barriers_secs(ranks: usize, iters: usize) -> f64 {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(ranks));
    let threads: Vec<_> = (0..ranks)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                for _ in 0..iters {
                    barrier.wait();
                    barrier.wait();
                }
                barrier.wait();
                start.elapsed().as_secs_f64() / iters as f64
            })
        })
        .collect();
    let times: Vec<f64> = threads
        .into_iter()
        .map(|t| t.join().expect("barrier threads do not panic"))
        .collect();
    times[0]
}

/// The median and range of `values`, as `m (lo–hi)`.
fn median_range(values: &[f64]) -> String {
    let (low, high) = values
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
    format!("{:.2}× ({low:.2}–{high:.2})", median(values.to_vec()))
}

/// The cost of an allreduce against the number of thread ranks at fixed bytes per rank
/// (`cargo bench --bench detcheck -- allreduce_ranks`): the work is ranks × bytes, so a
/// coordination that grows no worse than linearly keeps the time per rank flat. Beside it, two
/// waits on a `std::sync::Barrier` of as many threads: what the operating system's wakeups alone
/// cost per rank. The contenders of a repetition (every rank count, allreduce and barrier) run
/// side by side in a rotated order; each repetition's time per rank is divided by that
/// repetition's at the fewest ranks, and the median and range of those ratios are reported.
fn bench_allreduce_ranks() {
    // `DETCHECK_BENCH_RANKS=8,1024` and `DETCHECK_BENCH_KIB=4` narrow the run (a profile).
    let rank_counts = env_list("DETCHECK_BENCH_RANKS", &[8, 16, 32, 64, 256, 1024]);
    let kib_per_rank = env_list("DETCHECK_BENCH_KIB", &[4, 256]);
    let reps = 5;
    for mode in [ReductionMode::Ring, ReductionMode::Reproducible] {
        for bytes_per_rank in kib_per_rank.iter().map(|k| k << 10) {
            let len = bytes_per_rank / 4;
            let n = rank_counts.len();
            let (mut allreduce, mut barrier) = (vec![Vec::new(); n], vec![Vec::new(); n]);
            for rep in 0..reps {
                for k in 0..2 * n {
                    let c = (k + rep) % (2 * n);
                    let ranks = rank_counts[c % n];
                    let iters = ((256usize << 20) / (ranks * bytes_per_rank)).clamp(3, 200);
                    if c < n {
                        allreduce[c].push(allreduce_secs(ranks, len, mode, iters));
                    } else {
                        barrier[c - n].push(two_barriers_secs(ranks, iters));
                    }
                }
            }
            println!(
                "## Allreduce cost vs ranks: {mode}, {} f32 per rank (median of {reps} launches)\n",
                human_size(bytes_per_rank)
            );
            println!(
                "| ranks | time per allreduce | per rank | per rank vs {0} ranks | two barrier waits per rank vs {0} ranks | allreduce / two barrier waits |",
                rank_counts[0]
            );
            println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
            let per_rank_ratio = |samples: &[Vec<f64>], i: usize| -> Vec<f64> {
                (0..reps)
                    .map(|r| {
                        (samples[i][r] / rank_counts[i] as f64)
                            / (samples[0][r] / rank_counts[0] as f64)
                    })
                    .collect()
            };
            for (i, &ranks) in rank_counts.iter().enumerate() {
                let secs = median(allreduce[i].clone());
                let vs_barrier: Vec<f64> =
                    (0..reps).map(|r| allreduce[i][r] / barrier[i][r]).collect();
                println!(
                    "| {ranks} | {} | {} | {} | {} | {} |",
                    human_time(secs),
                    human_time(secs / ranks as f64),
                    median_range(&per_rank_ratio(&allreduce, i)),
                    median_range(&per_rank_ratio(&barrier, i)),
                    median_range(&vs_barrier),
                );
            }
            println!();
        }
    }
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

/// A communicator that notes when each collective is called (the benchmark's clock inside the
/// ranks): a train step calls the same collectives every step, so the k-th call of step `s` marks
/// the same point of every step.
struct TimedComm<'a> {
    inner: &'a dyn Communicator,
    calls: std::cell::RefCell<Vec<(Instant, f64)>>,
}

impl TimedComm<'_> {
    fn mark(&self) {
        self.calls
            .borrow_mut()
            .push((Instant::now(), thread_cpu_secs()));
    }
}

/// The CPU time this thread has run, in seconds, from the scheduler's own count
/// (`/proc/thread-self/schedstat`, nanoseconds; 0 where there is none): unlike the clock, it does
/// not count time other processes on a shared machine took from this one.
fn thread_cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 * 1e-9)
}

impl Communicator for TimedComm<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn barrier(&self) -> Result<(), detcheck::comm::CommError> {
        self.mark();
        self.inner.barrier()
    }
    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<(), detcheck::comm::CommError> {
        self.mark();
        self.inner.broadcast(t, root)
    }
    fn allgather(&self, t: &Tensor) -> Result<Vec<Tensor>, detcheck::comm::CommError> {
        self.mark();
        self.inner.allgather(t)
    }
    fn reduce_scatter(
        &self,
        t: &Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<Tensor, detcheck::comm::CommError> {
        self.mark();
        self.inner.reduce_scatter(t, op, mode)
    }
    fn allreduce(
        &self,
        t: &mut Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<(), detcheck::comm::CommError> {
        self.mark();
        self.inner.allreduce(t, op, mode)
    }
}

/// Seconds per step of `scenario` recorded at `level` on thread ranks (no perturbation: no
/// seeded delays), timed inside the ranks: from the first collective of step `warmup` to the end
/// of the rank's recording (its last batch digested), over the steps from `warmup` on; the
/// slowest rank's. Thread launch, the loader's start and the first steps are outside the window.
/// Also the CPU seconds per step the ranks' threads ran in the same window (summed over ranks),
/// the process's CPU seconds per step over the whole run (every thread: ranks, the recorders'
/// digest workers, the loader), and the number of records of the run.
fn step_secs(
    scenario: &detcheck::LoadedScenario,
    level: RecordLevel,
    warmup: u64,
) -> (f64, f64, f64, usize) {
    let detcheck::scenario::Program::Ranks(program) = &scenario.program else {
        panic!("train is a rank program");
    };
    let program = std::sync::Arc::clone(program);
    let spec = scenario.spec.clone();
    let config = LaunchConfig::new(spec.world_size);
    let process_start = process_cpu_secs();
    let steps = spec.steps;
    let per_rank = launch_threads(&config, move |comm| {
        let timed = TimedComm {
            inner: comm,
            calls: std::cell::RefCell::new(Vec::new()),
        };
        let steps = spec.steps;
        let mut ctx =
            detcheck::RankContext::new(&timed, level, spec.seed, steps, spec.effective_mode());
        program.run_rank(&mut ctx)?;
        let trace = ctx.into_recorder().finish();
        let (end, end_cpu) = (Instant::now(), thread_cpu_secs());
        let calls = timed.calls.into_inner();
        assert_eq!(
            calls.len() as u64 % steps,
            0,
            "the same collectives every step"
        );
        let (start, start_cpu) = calls[(calls.len() as u64 / steps * warmup) as usize];
        let timed_steps = (steps - warmup) as f64;
        let secs = (end - start).as_secs_f64() / timed_steps;
        let cpu = (end_cpu - start_cpu) / timed_steps;
        Ok((secs, cpu, trace.records.len()))
    })
    .expect("benchmark ranks do not fail");
    let process = (process_cpu_secs() - process_start) / steps as f64;
    let secs = per_rank.iter().map(|r| r.0).fold(0.0, f64::max);
    let cpu = per_rank.iter().map(|r| r.1).sum();
    (secs, cpu, process, per_rank.iter().map(|r| r.2).sum())
}

/// The numbers in the environment variable `var` (`8,16`), or `default`.
fn env_list(var: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(var).map_or_else(
        |_| default.to_vec(),
        |v| {
            v.split(',')
                .map(|x| x.trim().parse().expect("a number"))
                .collect()
        },
    )
}

/// Step time of `train` with recording off (twice: the noise floor), md5 only, and md5 + stats,
/// timed inside the ranks, the contenders' order rotated each round.
fn bench_record() {
    // (global batch, steps, warm-up steps, rounds): ~0.3 s and ~1 s a run here; 41 rounds at
    // 512 resolve about 1% in the CPU-time ratio on a quiet machine. On a noisy one,
    // `DETCHECK_BENCH_BATCHES=512 DETCHECK_BENCH_ROUNDS=161` runs 512 alone, longer.
    let batches = env_list("DETCHECK_BENCH_BATCHES", &[512, 4096]);
    let rounds = env_list("DETCHECK_BENCH_ROUNDS", &[]).first().copied();
    for (global_batch, steps, warmup, default_rounds) in [(512, 60, 10, 41), (4096, 24, 4, 15)] {
        if batches.contains(&global_batch) {
            bench_record_at(
                global_batch,
                steps,
                warmup,
                rounds.unwrap_or(default_rounds),
            );
        }
    }
}

fn bench_record_at(global_batch: usize, steps: u64, warmup: u64, rounds: usize) {
    let levels = [
        ("off", RecordLevel::Off),
        ("off2 (off again: the noise floor)", RecordLevel::Off),
        ("md5", RecordLevel::Digest),
        ("md5 + stats", RecordLevel::Stats),
    ];
    let mut spec = train_spec(global_batch);
    spec.steps = steps;
    let scenario = KindRegistry::builtin()
        .build(spec, std::path::Path::new("bench_train.json"))
        .expect("the benchmark spec builds");
    let mut secs: Vec<Vec<f64>> = vec![Vec::new(); levels.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); levels.len()];
    let mut process: Vec<Vec<f64>> = vec![Vec::new(); levels.len()];
    let mut records = vec![0; levels.len()];
    for round in 0..rounds {
        for k in 0..levels.len() {
            let i = (k + round) % levels.len();
            let (s, c, p, n) = step_secs(&scenario, levels[i].1, warmup);
            secs[i].push(s);
            cpu[i].push(c);
            process[i].push(p);
            records[i] = n;
        }
    }
    println!(
        "## Recording overhead: `train`, 4 thread ranks, 64→256→10 MLP (19 k parameters), \
         global batch {global_batch}; every parameter, gradient and local gradient recorded every \
         step; steps {warmup}–{steps} timed inside the ranks, {rounds} rounds in rotated order\n"
    );
    println!(
        "Step time: the slowest rank's clock. Rank CPU: the ranks' threads' CPU time per step \
         (the scheduler's count), which other processes on the machine do not inflate; it leaves \
         out the recorders' digest threads. Process CPU: every thread of the process, the \
         digest threads included, over the whole run (10 ms ticks), per step.\n"
    );
    println!(
        "| recording | records | step time (median) | vs off, median of rounds | range | \
         rank CPU per step | vs off | range | process CPU per step | vs off | range |"
    );
    println!("| --- | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: | --- |");
    for (i, (name, _)) in levels.iter().enumerate() {
        let step = human_time(median(secs[i].clone()));
        let step_cpu = human_time(median(cpu[i].clone()));
        let step_process = human_time(median(process[i].clone()));
        if i == 0 {
            println!(
                "| {name} | {} | {step} | 1 | | {step_cpu} | 1 | | {step_process} | 1 | |",
                records[i]
            );
            continue;
        }
        // Recording is a superset of `off`'s work: a ratio below 1 is noise, not a speed-up.
        let shown = |(med, lo, hi): (f64, f64, f64)| {
            let ratio = if i >= 2 && med < 1.0 {
                "unresolved: noise".to_string()
            } else {
                format!("{med:.3}×")
            };
            format!("{ratio} | {lo:.3}–{hi:.3}")
        };
        println!(
            "| {name} | {} | {step} | {} | {step_cpu} | {} | {step_process} | {} |",
            records[i],
            shown(ratio_summary(&secs[i], &secs[0])),
            shown(ratio_summary(&cpu[i], &cpu[0])),
            shown(ratio_summary(&process[i], &process[0])),
        );
    }
    println!();
}

/// Median, lowest and highest of the per-round ratios `a[r] / b[r]`.
fn ratio_summary(a: &[f64], b: &[f64]) -> (f64, f64, f64) {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(0.0, f64::max);
    (median(ratios), lo, hi)
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

/// A kind's params as a bench kind of its own would declare them: scalars, a nested struct and
/// a list of nested structs (the shapes `file::strict` wraps).
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct BenchParams {
    elements: usize,
    hidden: usize,
    dropout: f64,
    zero: bool,
    optimizer: BenchOptimizer,
    #[serde(default)]
    faults: Vec<BenchFault>,
}

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct BenchOptimizer {
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
}

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct BenchFault {
    rank: usize,
    step: u64,
    kind: String,
}

/// The cost of strict JSON (issue 16): `ScenarioSpec::parse_params` (through `file::strict`, a
/// struct only from an object) against the same `serde_path_to_error` read without the wrapper,
/// alternating (order rotated each repetition), on a scenario's params and on 10,000 nested
/// structs.
fn bench_strict() {
    let spec_of = |faults: usize| -> ScenarioSpec {
        let faults: Vec<String> = (0..faults)
            .map(|i| format!(r#"{{"rank": {}, "step": {i}, "kind": "panic"}}"#, i % 8))
            .collect();
        serde_json::from_str(&format!(
            r#"{{"kind": "bench", "world_size": 4, "steps": 2, "seed": 1, "expect": "identical",
                "params": {{"elements": 4096, "hidden": 32, "dropout": 0.1, "zero": true,
                "optimizer": {{"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}},
                "faults": [{}]}}}}"#,
            faults.join(", ")
        ))
        .expect("the bench's spec parses")
    };
    let reps = 41;
    println!("## Strict JSON: params read with and without `file::strict` (median of {reps})\n");
    println!("| params | plain µs | strict µs | strict / plain (median, range) |");
    println!("| --- | ---: | ---: | ---: |");
    for (label, faults, inner) in [
        ("a scenario's (12 fields, 1 fault)", 1, 5000),
        ("10,000 nested structs", 10_000, 3),
    ] {
        let spec = spec_of(faults);
        let plain = || {
            let value = serde_json::Value::Object(spec.params.clone());
            let p: BenchParams = serde_path_to_error::deserialize(value).expect("plain parses");
            black_box(p);
        };
        let strict = || {
            let p: BenchParams = spec.parse_params().expect("strict parses");
            black_box(p);
        };
        let (mut plains, mut stricts, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..reps {
            let run = |f: &dyn Fn()| {
                time(|| {
                    for _ in 0..inner {
                        f();
                    }
                }) / inner as f64
            };
            let (p, s) = if rep % 2 == 0 {
                let p = run(&plain);
                (p, run(&strict))
            } else {
                let s = run(&strict);
                (run(&plain), s)
            };
            plains.push(p);
            stricts.push(s);
            ratios.push(s / p);
        }
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        println!(
            "| {label} | {:.1} | {:.1} | {:.2}× ({lo:.2}–{hi:.2}) |",
            median(plains) * 1e6,
            median(stricts) * 1e6,
            median(ratios),
        );
    }
    println!();
}

/// The position digest of a shard (`PositionDigest::of_view`, the `world_sizes` check's digest
/// of sharded records) against the tree digest of the same bytes: f32 and bf16 tensors of
/// 64 MiB and 1 MiB; contenders alternate, median of the per-repetition ratios.
fn bench_position() {
    let reps = 9;
    println!("## The position digest vs the tree digest (median of {reps}, min-max)\n");
    println!("| tensor | tree digest MiB/s | position digest MiB/s | position / tree time (median, min-max) | position ns/byte |\n| --- | ---: | ---: | ---: | ---: |");
    for (label, dtype, bytes_len) in [
        ("64 MiB f32", DType::F32, 64usize << 20),
        ("1 MiB f32", DType::F32, 1 << 20),
        ("64 MiB bf16", DType::BF16, 64 << 20),
    ] {
        let values = random_f32(bytes_len / 4, 3);
        let bytes: &[u8] = bytemuck::cast_slice(&values);
        let shape = [bytes_len / dtype.size_of()];
        let view = TensorView::new(dtype, &shape, bytes).expect("view");
        let (mut tree, mut position, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            let t = time(|| {
                black_box(Md5Digest::of_view(black_box(view)));
            });
            let p = time(|| {
                black_box(PositionDigest::of_view(black_box(view)));
            });
            tree.push(t);
            position.push(p);
            ratios.push(p / t);
        }
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        let p = median(position);
        println!(
            "| {label} | {:.0} | {:.0} | {:.2}x ({lo:.2}-{hi:.2}) | {:.3} |",
            mib_per_s(bytes_len, median(tree)),
            mib_per_s(bytes_len, p),
            median(ratios),
            p * 1e9 / bytes_len as f64,
        );
    }
    println!();
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
    if wants("md5") || selected.iter().any(|s| s == "stats") {
        bench_stats();
    }
    if wants("md5") || selected.iter().any(|s| s == "md5_many") {
        bench_md5_many();
    }
    if wants("position") {
        bench_position();
    }
    if wants("allreduce") {
        bench_allreduce();
    }
    if selected.iter().any(|s| s == "allreduce_repro") {
        bench_allreduce_repro();
    }
    if selected.iter().any(|s| s == "allreduce_ranks") {
        bench_allreduce_ranks();
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
    if wants("strict") {
        bench_strict();
    }
}
