//! This crate's own determinism suite: its scenario files, its own kind, detcheck's harness.

use detcheck_downstream_example::Histogram;
use std::sync::Arc;

fn main() -> std::process::ExitCode {
    detcheck_harness::Harness::new()
        .with_kind("histogram", |spec| {
            Ok(Arc::new(Histogram::from_spec(spec)?))
        })
        .scenario_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios"))
        .run()
}
