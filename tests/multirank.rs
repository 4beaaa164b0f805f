//! `cargo test --test multirank`: every scenario in `scenarios/` as a trial.
//!
//! Each trial launches the scenario's ranks, runs its checks twice under different perturbations,
//! and fails with the first divergence; negative controls must be caught. Name filters (any
//! number: `cargo test --test multirank -- seed train`), `--skip`, `--list`, `--exact` and
//! `--ignored` work as with cargo test.

fn main() -> std::process::ExitCode {
    detcheck_harness::Harness::new()
        .scenario_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios"))
        .run()
}
