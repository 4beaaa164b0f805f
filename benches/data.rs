//! `cargo bench --bench data`: data loader throughput, deterministic delivery against delivery
//! as workers finish; the figures in docs/benchmarks.md ("Data loader").
//!
//! For each worker count, the two deliveries alternate within each repetition (which one goes
//! first alternates too) and the median of the repetitions is reported, so a noisy shared machine
//! shifts both sides alike. The ratio is the median of the repetitions' ratios (each from two
//! runs side by side), the figure to quote; absolute rates depend on the machine. Many short
//! repetitions rather than a few long ones: on a busy machine, two runs close in time see the
//! same load, and the median of many pairs is repeatable where a ratio of two medians is not.
//!
//! `cargo bench --bench data -- N` runs with N batches of prefetch per worker (default 2).

use detcheck::data::{
    AugmentRng, Augmentation, Augmenter, BatchSampler, DataLoader, Dataset, Delivery,
    DistributedSampler, LoaderConfig, LoaderPosition, SyntheticImages,
};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

const BATCHES: u64 = 128;
const BATCH_SIZE: usize = 32;
const SHAPE: [usize; 3] = [3, 32, 32];
const REPS: usize = 25;

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Seconds to load and read all batches: from building the loader to dropping it (thread start
/// and join included), the consumer summing each batch's values as a training step would read them.
fn run(
    dataset: &Arc<dyn Dataset>,
    sampler: &BatchSampler,
    augmenter: &Augmenter,
    config: LoaderConfig,
) -> f64 {
    let start = Instant::now();
    let mut loader = DataLoader::new(
        Arc::clone(dataset),
        sampler.clone(),
        augmenter.clone(),
        config,
        LoaderPosition::default(),
        BATCHES,
    )
    .expect("the benchmark loader is valid");
    let mut delivered = 0;
    while let Some(batch) = loader.next_batch().expect("no worker panics") {
        let values = batch.values.values::<f32>().expect("f32 batches");
        black_box(values.iter().fold(0.0f32, |acc, &v| acc + v));
        black_box(&batch);
        delivered += 1;
    }
    drop(loader);
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(delivered, BATCHES);
    secs
}

fn main() {
    let samples = BATCHES * BATCH_SIZE as u64;
    let dataset: Arc<dyn Dataset> = Arc::new(SyntheticImages::new(
        1, samples, SHAPE[0], SHAPE[1], SHAPE[2], 10,
    ));
    let sampler = DistributedSampler::new(samples, 1, 0, 1, true, false).expect("valid sampler");
    let sampler = BatchSampler::new(sampler, BATCH_SIZE, false).expect("valid batches");
    let augmentation = Augmentation {
        crop_padding: 4,
        flip: true,
        noise_std: 0.1,
    };
    let augmenter = Augmenter::new(augmentation, AugmentRng::PerSample { seed: 1 }, &SHAPE)
        .expect("valid augmentation");
    let bytes = samples as f64 * SHAPE.iter().product::<usize>() as f64 * 4.0;
    let deliveries = [Delivery::SamplerOrder, Delivery::CompletionOrder];
    // `cargo bench` passes `--bench`; a number sets the prefetch per worker.
    let prefetch_per_worker = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(LoaderConfig::new(1).prefetch_per_worker);

    println!(
        "## Data loader throughput: {BATCHES} batches of {BATCH_SIZE} SyntheticImages \
         3×32×32 (f32), crop 4 + flip + noise, prefetch {prefetch_per_worker} per worker, \
         median of {REPS}\n"
    );
    println!(
        "| workers | sampler order (samples/s) | MiB/s | completion order (samples/s) | MiB/s | \
         deterministic / completion |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for workers in [1, 2, 4] {
        let mut times = [Vec::new(), Vec::new()];
        for rep in 0..REPS {
            for k in 0..deliveries.len() {
                let i = (k + rep) % deliveries.len();
                let config = LoaderConfig {
                    prefetch_per_worker,
                    ..LoaderConfig::new(workers).with_delivery(deliveries[i])
                };
                times[i].push(run(&dataset, &sampler, &augmenter, config));
            }
        }
        // Throughput ratio of each repetition's pair: load drifts slowly, so a pair sees the same.
        let ratio = median(times[1].iter().zip(&times[0]).map(|(c, o)| c / o).collect());
        let [ordered, completion] = times.map(median);
        let rate = |secs: f64| samples as f64 / secs;
        let mib = |secs: f64| bytes / secs / (1024.0 * 1024.0);
        println!(
            "| {workers} | {:.0} | {:.1} | {:.0} | {:.1} | {:.2}× |",
            rate(ordered),
            mib(ordered),
            rate(completion),
            mib(completion),
            ratio
        );
    }
    println!();
}
