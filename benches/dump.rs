//! `cargo bench --bench dump [SIZE_MB...]`: the figures of `detcheck compare` in docs/benchmarks.md.
//!
//! For each size (default 10, 100 and 1000 MB per trace) and each mode (md5, stats), writes a
//! synthetic 4-rank trace A with [`TraceWriter`] and a copy B that differs only in the very last
//! record, then times `compare_dumps(A, B)` in a fresh child process (this binary re-run with
//! `--child`), which also reports its peak resident memory (VmHWM from /proc/self/status).
//! Throughput is the bytes of both traces divided by the compare's time. The traces were just
//! written, so they are read from the page cache: this measures the compare, not the disk.
//!
//! `cargo bench --bench dump -- --write DIR md5 1000` leaves such a pair in `DIR/a` and `DIR/b`, to
//! time the CLI by hand: `/usr/bin/time -v target/release/detcheck compare DIR/a DIR/b`.

use detcheck::compare::{compare_dumps, CompareOptions};
use detcheck::file::{DumpMode, TraceWriter};
use detcheck::record::Record;
use detcheck::value::{DType, ExactF64, Md5Digest, Stats};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const WORLD: u32 = 4;
const NAMES_PER_STEP: u32 = 256;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Writes a synthetic trace of about `bytes` bytes per rank file set; `flip` changes the last
/// record of the last rank. Returns (bytes written, records written, seconds).
fn write_trace(dir: &Path, mode: DumpMode, bytes: u64, flip: bool) -> (u64, u64, f64) {
    let record_len: u64 = if mode == DumpMode::Md5 { 40 } else { 104 };
    let per_rank = bytes / record_len / u64::from(WORLD);
    let steps = per_rank.div_ceil(u64::from(NAMES_PER_STEP));
    let names: Vec<String> = (0..NAMES_PER_STEP)
        .map(|i| {
            format!(
                "layers.{}.{}",
                i / 4,
                ["weight", "bias", "grad/weight", "grad/bias"][i as usize % 4]
            )
        })
        .collect();
    let start = Instant::now();
    let mut total_records = 0;
    for rank in 0..WORLD {
        let mut w = TraceWriter::create(dir, rank, WORLD, mode).expect("create");
        for step in 0..steps {
            for (seq, name) in names.iter().enumerate() {
                let x = (step * 1000 + seq as u64 + u64::from(rank)) as f64;
                let mut md5 = [0u8; 16];
                md5[..8].copy_from_slice(&x.to_bits().to_le_bytes());
                let last = rank == WORLD - 1 && step == steps - 1 && seq == names.len() - 1;
                if flip && last {
                    md5[15] ^= 1;
                }
                let record = Record {
                    rank,
                    step,
                    seq: seq as u32,
                    name: name.clone(),
                    replicated: seq % 2 == 0,
                    dtype: DType::F32,
                    shape: vec![64, 16 << (seq % 4)],
                    md5: Md5Digest(md5),
                    stats: Stats {
                        max: Some(ExactF64(x)),
                        min: Some(ExactF64(-x)),
                        mean: Some(ExactF64(x / 7.0)),
                        norm: Some(ExactF64(x * 3.0)),
                        nan: 0,
                        pos_inf: 0,
                        neg_inf: 0,
                    },
                };
                w.write_record(&record, None).expect("write");
                total_records += 1;
            }
        }
        w.finish().expect("finish");
    }
    let secs = start.elapsed().as_secs_f64();
    (dir_bytes(dir), total_records, secs)
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").metadata().expect("metadata").len())
        .sum()
}

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The child: compares and prints "seconds peak_kib differing".
fn child(a: &str, b: &str) {
    let start = Instant::now();
    let cmp = compare_dumps(a.as_ref(), b.as_ref(), &CompareOptions::default()).expect("compare");
    let secs = start.elapsed().as_secs_f64();
    println!("{secs} {} {}", peak_rss_kib(), cmp.num_differing);
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("--child") {
        child(&args[1], &args[2]);
        return;
    }
    if args.first().map(String::as_str) == Some("--write") {
        // `--write DIR MODE MB`: leave DIR/a and DIR/b for timing the CLI by hand.
        let (dir, mode, mb) = (Path::new(&args[1]), &args[2], &args[3]);
        let mode: DumpMode = mode.parse().expect("md5 or stats");
        let mb: u64 = mb.parse().expect("megabytes");
        write_trace(&dir.join("a"), mode, mb * 1_000_000, false);
        write_trace(&dir.join("b"), mode, mb * 1_000_000, true);
        return;
    }
    let sizes: Vec<u64> = if args.is_empty() {
        vec![10, 100, 1000]
    } else {
        args.iter().filter_map(|a| a.parse().ok()).collect()
    };
    let root = tempfile::tempdir_in(std::env::temp_dir()).expect("temp dir");
    let exe = std::env::current_exe().expect("own path");
    println!("## `detcheck compare`: two 4-rank traces that differ in their last record (median of 3 runs)\n");
    println!("| mode | per trace | records per trace | write MB/s | compare time | compare GB/s (both traces) | peak RSS |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for mode in [DumpMode::Md5, DumpMode::Stats] {
        for &mb in &sizes {
            let (a, b) = (root.path().join("a"), root.path().join("b"));
            let (bytes_a, records, write_secs) = write_trace(&a, mode, mb * 1_000_000, false);
            let (bytes_b, _, _) = write_trace(&b, mode, mb * 1_000_000, true);
            let mut times = Vec::new();
            let mut peaks = Vec::new();
            for _ in 0..3 {
                let out = Command::new(&exe)
                    .args(["--child", &a.to_string_lossy(), &b.to_string_lossy()])
                    .output()
                    .expect("child runs");
                let text = String::from_utf8_lossy(&out.stdout);
                let fields: Vec<&str> = text.split_whitespace().collect();
                assert_eq!(fields.get(2), Some(&"1"), "one planted divergence: {text}");
                times.push(fields[0].parse::<f64>().expect("secs"));
                peaks.push(fields[1].parse::<f64>().expect("kib"));
            }
            let t = median(times);
            println!(
                "| {mode} | {:.0} MB | {} | {:.0} | {:.3} s | {:.2} | {:.1} MiB |",
                bytes_a as f64 / 1e6,
                records,
                bytes_a as f64 / 1e6 / write_secs,
                t,
                (bytes_a + bytes_b) as f64 / 1e9 / t,
                median(peaks) / 1024.0
            );
            std::fs::remove_dir_all(&a).expect("clean a");
            std::fs::remove_dir_all(&b).expect("clean b");
        }
    }
}
