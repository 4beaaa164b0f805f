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
//!
//! `cargo bench --bench dump -- msprobe [MB] [--against OLD_BENCH_BINARY]...`: the msprobe case only
//! (it also ends the default run). Writes two msprobe dumps of one step of one rank,
//! `step0/rank0/dump.json`, of about MB megabytes each (default 26: ~80k tensor records, the size
//! of the real dump in issue 6) in msprobe 26.2's shape (md5 mode, `json.dump(indent=1)`'s
//! layout), B differing from A in the md5 of its last record, and times `compare_dumps(A, B)` in a
//! child process, 5 times; throughput is the JSON of both files over the compare's time (and over
//! the CPU time of all its threads). With `--against`, other builds of this bench (an older
//! commit's `target/release/deps/dump-*`) time the same pair as their child, alternating with
//! this one: before and after, side by side.
//! `-- --write-msprobe DIR MB` leaves such a pair in `DIR/a` and `DIR/b`.

#[path = "support/cpu.rs"]
mod cpu;
use cpu::process_cpu_secs;
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
                    shard: None,
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

/// The child: compares and prints "seconds peak_kib differing cpu_seconds".
fn child(a: &str, b: &str) {
    let (start, cpu) = (Instant::now(), process_cpu_secs());
    let cmp = compare_dumps(a.as_ref(), b.as_ref(), &CompareOptions::default()).expect("compare");
    let secs = start.elapsed().as_secs_f64();
    let cpu = process_cpu_secs() - cpu;
    println!("{secs} {} {} {cpu}", peak_rss_kib(), cmp.num_differing);
}

/// A statistic, varied by the record `i` and the field `k`.
fn stat(i: u64, k: u64) -> f64 {
    let h = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)) >> 11;
    (h as f64 / (1u64 << 53) as f64 - 0.3) * 7.0
}

/// `x` as Python's `repr` writes it (and so msprobe's dump.json): the shortest round-trip digits,
/// an exponent below 1e-4 or from 1e16 on (`3.2e-05`), `1.0` rather than `1`.
fn py_float(x: f64) -> String {
    let a = x.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        let e = format!("{x:e}");
        let (mantissa, exp) = e.split_once('e').expect("an exponent");
        let exp: i32 = exp.parse().expect("exponent");
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        let s = format!("{x}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    }
}

/// Appends one tensor of a call's list as `json.dump(obj, indent=1)` writes it (`pad` spaces
/// before its braces).
fn msprobe_tensor(out: &mut String, pad: usize, i: u64, shape: &[u64], md5: u32) {
    use std::fmt::Write as _;
    let p = " ".repeat(pad);
    let dims: Vec<String> = shape.iter().map(|d| format!("{p}  {d}")).collect();
    let _ = write!(
        out,
        "{p}{{\n{p} \"type\": \"torch.Tensor\",\n{p} \"dtype\": \"torch.float32\",\n{p} \"shape\": [\n{}\n{p} ],\n\
         {p} \"Max\": {},\n{p} \"Min\": {},\n{p} \"Mean\": {},\n{p} \"Norm\": {},\n\
         {p} \"requires_grad\": true,\n{p} \"md5\": \"{md5:08x}\"\n{p}}}",
        dims.join(",\n"),
        py_float(stat(i, 1).abs()),
        py_float(-stat(i, 2).abs()),
        py_float(stat(i, 3) / 9.0),
        py_float(stat(i, 4).abs() * 31.0),
    );
}

/// Writes `dir/step0/rank0/dump.json` of about `bytes` bytes in msprobe 26.2's shape (md5 mode):
/// forward calls with three inputs, a keyword and an output, backward calls with one input and
/// output. `flip` changes the md5 of the last record. Returns (bytes, records).
fn write_msprobe(dir: &Path, bytes: u64, flip: bool) -> (u64, u64) {
    use std::fmt::Write as _;
    let rank = dir.join("step0").join("rank0");
    std::fs::create_dir_all(&rank).expect("create dump folder");
    let mut out = String::with_capacity(bytes as usize + 4096);
    out.push_str(
        "{\n \"task\": \"statistics\",\n \"level\": \"L1\",\n \"framework\": \"pytorch\",\n \
         \"dump_data_dir\": null,\n \"data\": {\n",
    );
    let (mut records, mut call) = (0u64, 0u64);
    while (out.len() as u64) < bytes {
        if call > 0 {
            out.push_str(",\n");
        }
        let n = call / 4;
        let md5 = |i: u64| (i.wrapping_mul(2_654_435_761) >> 3) as u32;
        if call % 4 < 3 {
            let api = ["linear", "add", "matmul"][(call % 4) as usize];
            let _ = write!(
                out,
                "  \"Functional.{api}.{n}.forward\": {{\n   \"input_args\": [\n"
            );
            for k in 0..3 {
                msprobe_tensor(&mut out, 4, records, &[64, 32 << k], md5(records));
                records += 1;
                out.push_str(if k < 2 { ",\n" } else { "\n" });
            }
            out.push_str(
                "   ],\n   \"input_kwargs\": {\n    \"alpha\": {\n     \"type\": \"float\",\n     \
                 \"value\": 0.5\n    }\n   },\n   \"output\": [\n",
            );
            msprobe_tensor(&mut out, 4, records, &[64, 64], md5(records));
            records += 1;
            out.push_str("\n   ]\n  }");
        } else {
            let _ = write!(
                out,
                "  \"Functional.linear.{n}.backward\": {{\n   \"input\": [\n"
            );
            msprobe_tensor(&mut out, 4, records, &[64, 64], md5(records));
            records += 1;
            out.push_str("\n   ],\n   \"output\": [\n");
            msprobe_tensor(&mut out, 4, records, &[64, 32], md5(records));
            records += 1;
            out.push_str("\n   ]\n  }");
        }
        call += 1;
    }
    if flip {
        // The md5 of the last record.
        let at = out.rfind("\"md5\": \"").expect("an md5") + "\"md5\": \"".len();
        let old = &out[at..at + 8];
        let new = format!("{:08x}", u32::from_str_radix(old, 16).expect("hex") ^ 1);
        out.replace_range(at..at + 8, &new);
    }
    out.push_str("\n }\n}");
    let path = rank.join("dump.json");
    std::fs::write(&path, &out).expect("write dump.json");
    (out.len() as u64, records)
}

/// The msprobe case: two dumps of `mb` MB, compared 5 times by this binary's child (and, with
/// `against`, as often by another build's, alternating).
fn msprobe_case(root: &Path, mb: u64, against: &[&str]) {
    let exe = std::env::current_exe().expect("own path");
    let (a, b) = (root.join("msprobe_a"), root.join("msprobe_b"));
    let (bytes, records) = write_msprobe(&a, mb * 1_000_000, false);
    write_msprobe(&b, mb * 1_000_000, true);
    let mut runners: Vec<(String, std::path::PathBuf)> = against
        .iter()
        .map(|old| ((*old).to_owned(), old.into()))
        .collect();
    runners.push(("this build".into(), exe));
    let mut results: Vec<[Vec<f64>; 3]> = vec![Default::default(); runners.len()];
    for _ in 0..5 {
        for (k, (_, exe)) in runners.iter().enumerate() {
            let out = Command::new(exe)
                .args(["--child", &a.to_string_lossy(), &b.to_string_lossy()])
                .output()
                .expect("child runs");
            let text = String::from_utf8_lossy(&out.stdout);
            let fields: Vec<&str> = text.split_whitespace().collect();
            assert_eq!(fields.get(2), Some(&"1"), "one planted divergence: {text}");
            results[k][0].push(fields[0].parse::<f64>().expect("secs"));
            results[k][1].push(fields[1].parse::<f64>().expect("kib"));
            results[k][2].push(
                fields
                    .get(3)
                    .map_or(f64::NAN, |c| c.parse().expect("cpu secs")),
            );
        }
    }
    println!(
        "\n## `detcheck compare` of two msprobe dumps (one step of one rank, md5 mode), median of 5\n"
    );
    println!(
        "| build | dump.json | records | compare time (range) | MB/s of JSON (both files) | CPU time | MB/s per CPU second | peak RSS |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for ((name, _), [times, peaks, cpus]) in runners.iter().zip(results) {
        let lo = times.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = times.iter().copied().fold(0.0, f64::max);
        let (t, cpu) = (median(times), median(cpus));
        let json_mb = 2.0 * bytes as f64 / 1e6;
        println!(
            "| {name} | {:.1} MB | {records} | {t:.3} s ({lo:.3}–{hi:.3}) | {:.0} | {cpu:.3} s | {:.0} | {:.1} MiB |",
            bytes as f64 / 1e6,
            json_mb / t,
            json_mb / cpu,
            median(peaks) / 1024.0
        );
    }
    std::fs::remove_dir_all(&a).expect("clean a");
    std::fs::remove_dir_all(&b).expect("clean b");
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
    if args.first().map(String::as_str) == Some("--write-msprobe") {
        let (dir, mb) = (Path::new(&args[1]), &args[2]);
        let mb: u64 = mb.parse().expect("megabytes");
        write_msprobe(&dir.join("a"), mb * 1_000_000, false);
        write_msprobe(&dir.join("b"), mb * 1_000_000, true);
        return;
    }
    if args.first().map(String::as_str) == Some("msprobe") {
        let mb = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(26);
        let against: Vec<&str> = args
            .windows(2)
            .filter(|w| w[0] == "--against")
            .map(|w| w[1].as_str())
            .collect();
        let root = tempfile::tempdir_in(std::env::temp_dir()).expect("temp dir");
        msprobe_case(root.path(), mb, &against);
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
    msprobe_case(root.path(), 26, &[]);
}
