//! The `detcheck` binary end to end: its rows, its failure details and its exit codes.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

fn detcheck(args: &[&str], cwd: &Path) -> Outcome {
    let out = Command::new(env!("CARGO_BIN_EXE_detcheck"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("the detcheck binary runs");
    Outcome {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Writes a 3-rank scenario of `kind`; `extra` adds fields, `replace` edits the text (serde
/// rejects a field given twice, so changing a field is a replacement).
fn scenario(dir: &Path, kind: &str, extra: &str, replace: &[(&str, &str)]) -> PathBuf {
    let path = dir.join("case.json");
    let mut text = format!(
        r#"{{"kind": "{kind}", "world_size": 3, "steps": 2, "seed": 1,
            "reduction": "ring", "deterministic_comm": true, "expect": "identical"{extra}}}"#
    );
    for (from, to) in replace {
        text = text.replace(from, to);
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `detcheck check` on one scenario and checks the exit code and what the output holds.
fn check(
    (kind, extra, replace): (&str, &str, &[(&str, &str)]),
    code: i32,
    stdout_has: &[&str],
    stderr_has: &[&str],
) {
    let dir = tempfile::tempdir().unwrap();
    scenario(dir.path(), kind, extra, replace);
    let out = detcheck(
        &["check", "--no-progress", "--deadline", "1", "case.json"],
        dir.path(),
    );
    assert_eq!(
        out.code, code,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    for text in stdout_has {
        assert!(
            out.stdout.contains(text),
            "stdout lacks {text:?}:\n{}",
            out.stdout
        );
    }
    for text in stderr_has {
        assert!(
            out.stderr.contains(text),
            "stderr lacks {text:?}:\n{}",
            out.stderr
        );
    }
}

#[test]
fn the_shipped_scenarios_all_hold() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = detcheck(&["check", "--no-progress"], root);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.starts_with("scenario "), "{}", out.stdout);
    assert!(out.stdout.contains("control_arrival_order_3ranks"));
    assert!(out.stdout.contains("ok (caught)"));
    assert!(out.stdout.contains(" 0 failed, 0 errored, 1 ignored"));
}

#[test]
fn an_identical_scenario_exits_0() {
    check(("collective", "", &[]), 0, &["case ", " ok "], &[]);
}

#[test]
fn an_unexpected_divergence_exits_1_with_the_first_divergence() {
    // Arrival order on 3 ranks, claimed identical.
    check(
        ("collective", "", &[("\"ring\"", "\"arrival_order\"")]),
        1,
        &[
            "FAIL",
            "repeat: expected identical, but",
            "first divergence: step 0 rank 0 seq 4 `allreduce/sum`: md5 differs",
            "run 1",
            "run 2",
            "md5 ",
            "norm ",
        ],
        &[],
    );
}

#[test]
fn an_uncaught_negative_control_exits_1() {
    check(
        ("collective", "", &[("\"identical\"", "\"diverges\"")]),
        1,
        &["FAIL (missed)", "negative control not caught"],
        &[],
    );
}

#[test]
fn bad_input_exits_2_naming_file_and_field() {
    check(
        ("collective", r#", "params": {"elements": -3}"#, &[]),
        2,
        &[],
        &["case.json: field `params.elements`: invalid value: integer `-3`"],
    );
    check(
        ("nosuch", "", &[]),
        2,
        &[],
        &["case.json: field `kind`: unknown kind `nosuch`"],
    );
    let dir = tempfile::tempdir().unwrap();
    let out = detcheck(&["check", "missing.json"], dir.path());
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains("cannot read missing.json"),
        "{}",
        out.stderr
    );
    let out = detcheck(&["check"], dir.path());
    assert_eq!(out.code, 2, "no scenarios folder here");
    let out = detcheck(&["check", "--deadline", "0"], dir.path());
    assert_eq!(out.code, 2, "clap rejects the flag: {}", out.stderr);
    assert!(out.stderr.contains("--deadline"));
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let out = detcheck(&["check", "empty"], dir.path());
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains("no scenario files found in empty"),
        "{}",
        out.stderr
    );
}

#[test]
fn failing_ranks_exit_3_naming_the_rank_and_collective() {
    let fault = |kind: &str| {
        format!(r#", "params": {{"fault": {{"rank": 2, "step": 1, "kind": "{kind}"}}}}"#)
    };
    check(
        ("collective", &fault("panic"), &[]),
        3,
        &["ERROR", "rank 2 panicked: planted panic at step 1"],
        &[],
    );
    check(
        ("collective", &fault("error"), &[]),
        3,
        &["rank 2 failed: planted error at step 1"],
        &[],
    );
    check(
        ("collective", &fault("exit"), &[]),
        3,
        &["rank 2 finished without joining allreduce #5"],
        &[],
    );
    check(
        ("collective", &fault("stall"), &[]),
        3,
        &["in allreduce #5 for rank(s) [2], which never arrived"],
        &[],
    );
}
