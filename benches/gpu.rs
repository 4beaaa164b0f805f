//! `cargo bench --bench gpu --features nccl` (on a GPU machine: `scripts/gpu-selftest.sh` runs
//! the carried binary): the figures of issue 26 in docs/benchmarks.md.
//!
//! - `reprosum`: the reproducible sum of one device buffer of f32 (`Gpu::reproducible_sum_f32`,
//!   the CPU's bits) against a plain device sum (`Gpu::plain_sum_f32`: per-block partials and
//!   float atomics, not deterministic), 1 to 256 MiB, interleaved; and 64 MiB of mixed scales
//!   (one tile near 1, the rest 2^-30 below), which takes the pending path (three launches).
//! - `allreduce`: a deterministic allreduce among 2, 4 and 8 thread ranks sharing the GPU
//!   (`GpuThreadComm::allreduce_device`, ring, rank_ordered and reproducible) against one device
//!   memcpy of the same bytes (a rank's buffer), 64 MiB per rank, interleaved.
//!
//! Each figure is the median of the repetitions with its range, and the ratio of medians. Without
//! a GPU it says why and exits 0 (CI builds it with `--no-run`).

#[cfg(feature = "nccl")]
mod on_gpu {
    use detcheck::comm::{launch_threads, Communicator, GpuThreadComm, LaunchConfig};
    use detcheck::device::Gpu;
    use detcheck::value::{ReduceOp, ReductionMode};
    use detcheck::Tensor;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const REPEATS: usize = 15;

    /// The median and range of `times`, in milliseconds.
    fn summary(times: &mut [Duration]) -> (f64, f64, f64) {
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        (
            ms(times[times.len() / 2]),
            ms(times[0]),
            ms(times[times.len() - 1]),
        )
    }

    fn values(len: usize) -> Tensor {
        let mut rng = detcheck::value::derive_stream(1, detcheck::Stream::Data, 0, 0);
        Tensor::from_vec((0..len).map(|_| rng.normal_f32()).collect::<Vec<f32>>())
    }

    /// `values(len)` with every term after the first tile 2^-30 smaller: a buffer of mixed
    /// scales, whose far tiles the one-launch sum leaves to the fixup and finish kernels.
    fn mixed_scales(len: usize) -> Tensor {
        let tile = detcheck::device::REPROSUM_TILE_ELEMENTS as usize;
        let mut terms = values(len).values::<f32>().unwrap().to_vec();
        terms[tile..].iter_mut().for_each(|v| *v *= 2f32.powi(-30));
        Tensor::from_vec(terms)
    }

    fn reprosum(gpu: &Gpu) {
        println!(
            "reprosum: reproducible sum vs plain device sum, f32, median of {REPEATS} (range)"
        );
        let cases = [1usize, 4, 16, 64, 256]
            .map(|mib| (mib, "", values(mib << 18)))
            .into_iter()
            .chain([(64, " mixed scales", mixed_scales(64 << 18))]);
        for (mib, what, terms) in cases {
            let device = gpu.upload(&terms).unwrap();
            // Warm up both (module load, allocator).
            gpu.reproducible_sum_f32(&device).unwrap();
            gpu.plain_sum_f32(&device).unwrap();
            let (mut repro, mut plain) = (Vec::new(), Vec::new());
            for _ in 0..REPEATS {
                let start = Instant::now();
                gpu.reproducible_sum_f32(&device).unwrap();
                repro.push(start.elapsed());
                let start = Instant::now();
                gpu.plain_sum_f32(&device).unwrap();
                plain.push(start.elapsed());
            }
            let (r, r_lo, r_hi) = summary(&mut repro);
            let (p, p_lo, p_hi) = summary(&mut plain);
            println!(
                "  {mib:>4} MiB{what}: reproducible {r:.3} ms ({r_lo:.3}-{r_hi:.3}), plain {p:.3} ms \
                 ({p_lo:.3}-{p_hi:.3}), ratio {:.2}x",
                r / p
            );
        }
    }

    fn allreduce(gpu: &Arc<Gpu>) {
        const MIB: usize = 64;
        println!(
            "allreduce: thread ranks on one GPU vs a device memcpy of one rank's {MIB} MiB, \
             median of {REPEATS} (range)"
        );
        let len = MIB << 18;
        let source = gpu.upload(&values(len)).unwrap();
        let mut target = gpu.zeros(source.dtype(), source.shape()).unwrap();
        for size in [2usize, 4, 8] {
            for mode in [
                ReductionMode::Ring,
                ReductionMode::RankOrdered,
                ReductionMode::Reproducible,
            ] {
                let (mut reduce, mut copy) = (Vec::new(), Vec::new());
                for _ in 0..REPEATS {
                    let g = Arc::clone(gpu);
                    let times = launch_threads(&LaunchConfig::new(size), move |host| {
                        let comm = GpuThreadComm::new(host, Arc::clone(&g));
                        let mut mine = g.upload(&values(len)).unwrap();
                        g.synchronize()?;
                        host.barrier()?;
                        let start = Instant::now();
                        comm.allreduce_device(&mut mine, ReduceOp::Sum, mode)?;
                        g.synchronize()?;
                        host.barrier()?;
                        Ok(start.elapsed())
                    })
                    .unwrap();
                    reduce.push(times.into_iter().max().unwrap());
                    let start = Instant::now();
                    gpu.copy(&source, 0..len, &mut target, 0).unwrap();
                    gpu.synchronize().unwrap();
                    copy.push(start.elapsed());
                }
                let (r, r_lo, r_hi) = summary(&mut reduce);
                let (c, c_lo, c_hi) = summary(&mut copy);
                println!(
                    "  {size} ranks, {:<12} {r:.3} ms ({r_lo:.3}-{r_hi:.3}), memcpy {c:.3} ms \
                     ({c_lo:.3}-{c_hi:.3}), ratio {:.2}x",
                    mode.name(),
                    r / c
                );
            }
        }
    }

    pub(crate) fn main() {
        let gpu = match Gpu::open(0) {
            Ok(gpu) => gpu,
            Err(e) => {
                println!("no GPU ({e}): nothing to measure");
                return;
            }
        };
        println!("device: {}", gpu.name());
        let which: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        let wanted = |name: &str| which.is_empty() || which.iter().any(|w| w == name);
        if wanted("reprosum") {
            reprosum(&gpu);
        }
        if wanted("allreduce") {
            allreduce(&gpu);
        }
    }
}

fn main() {
    #[cfg(feature = "nccl")]
    on_gpu::main();
    #[cfg(not(feature = "nccl"))]
    println!("built without the `nccl` feature: cargo bench --bench gpu --features nccl");
}
