//! `cargo bench --bench launch`: the cost of launching a `command` scenario's processes, the
//! figure in docs/benchmarks.md.
//!
//! A `processes` launch of 4 ranks of a program that records nothing (examples/trace_ranks.rs
//! with `--steps 0`: it starts, creates its trace file, finishes it), timed end to end through
//! `run_once` (spawn, wait, read the traces back, clean up), 15 times each way, interleaved:
//! - `staggered`: as every check launches, the ranks meet (all started), then each is held
//!   until its start slot, 30 ms apart (the start-order perturbation);
//! - `plain`: the same launch without the stagger (`run --dump`-like, perturbation off), which
//!   is the cost of the processes themselves.
//!
//! Needs the example built first: `cargo build --release --example trace_ranks`.

use detcheck::run::run_once;
use detcheck::{CheckOptions, KindRegistry, ScenarioSpec};
use std::path::PathBuf;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let exe = std::env::current_exe().unwrap();
    let program: PathBuf = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples/trace_ranks"))
        .unwrap();
    if !program.exists() {
        eprintln!(
            "{} is missing: cargo build --release --example trace_ranks",
            program.display()
        );
        std::process::exit(2);
    }
    let text = format!(
        r#"{{"kind": "command", "world_size": 4, "steps": 1, "seed": 1, "expect": "identical",
            "params": {{"command": [{:?}, "--steps", "0"]}}}}"#,
        program.display().to_string()
    );
    let spec: ScenarioSpec = serde_json::from_str(&text).unwrap();
    let scenario = KindRegistry::builtin()
        .build(spec, std::path::Path::new("launch.json"))
        .unwrap();
    let options = CheckOptions::default();
    let perturbed = detcheck::comm::Perturbation {
        seed: 1,
        rotation: 1,
        max_delay: options.max_delay,
    };
    let (mut staggered, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        let t = Instant::now();
        run_once(&scenario, &options, Some(perturbed), 1).unwrap();
        staggered.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        run_once(&scenario, &options, None, 1).unwrap();
        plain.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let range = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        format!("{lo:.1}–{hi:.1} ms")
    };
    println!("## Launch of a `command` scenario: 4 ranks, `processes` launcher, a program that records nothing (15 interleaved runs)\n");
    println!("| launch | median | range |");
    println!("| --- | ---: | ---: |");
    println!(
        "| staggered (as a check launches) | {:.1} ms | {} |",
        median(staggered.clone()),
        range(&staggered)
    );
    println!(
        "| plain (no start stagger) | {:.1} ms | {} |",
        median(plain.clone()),
        range(&plain)
    );
}
