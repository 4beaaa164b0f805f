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

/// Asserts that `text` (the `what` stream) holds every one of `needles`.
fn assert_contains(what: &str, text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{what} lacks {needle:?}:\n{text}");
    }
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
    assert_contains("stdout", &out.stdout, stdout_has);
    assert_contains("stderr", &out.stderr, stderr_has);
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
    assert_contains("stderr", &out.stderr, &["cannot read missing.json"]);
    assert!(!out.stderr.contains("put `--`"), "{}", out.stderr);
    // A program named without `--`: the error says how to name it.
    let out = detcheck(&["check", "python3", "train.py"], dir.path());
    assert_eq!(out.code, 2);
    assert_contains(
        "stderr",
        &out.stderr,
        &[
            "cannot read python3",
            "hint: `python3` is no scenario file or folder; to check a program, put `--` before \
             it: detcheck check [FLAGS] -- python3 train.py",
        ],
    );
    let out = detcheck(&["check"], dir.path());
    assert_eq!(out.code, 2, "no scenarios folder here");
    let out = detcheck(&["check", "--deadline", "0"], dir.path());
    assert_eq!(out.code, 2, "clap rejects the flag: {}", out.stderr);
    assert!(out.stderr.contains("--deadline"));
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let out = detcheck(&["check", "empty"], dir.path());
    assert_eq!(out.code, 2);
    assert_contains("stderr", &out.stderr, &["no scenario files found in empty"]);
}

/// Issue 56: bad batch sizes of the `batch_sizes` check exit 2 naming `--batch-sizes` (or the
/// file's `batch_sizes`), before anything is launched; `run` refuses the flag.
#[test]
fn bad_batch_sizes_exit_2_naming_the_flag_or_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (
            &["check", "--batch-sizes", "8", "--", "gen"],
            "error: --batch-sizes: `batch_sizes` needs at least two batch sizes to compare",
        ),
        (
            &["check", "--batch-sizes", "0,8", "--", "gen"],
            "error: --batch-sizes: must be between 1 and 1048576, got 0",
        ),
        (
            &["check", "--batch-sizes", "1,8,1", "--", "gen"],
            "error: --batch-sizes: 1 is listed twice",
        ),
        (
            &["check", "--", "gen", "--batch-size", "{batch}"],
            "error: --batch-sizes: `{batch}` in params.command[2] needs the batch sizes: give \
             `batch_sizes`",
        ),
        (
            &[
                "check",
                "--checks",
                "repeat",
                "--batch-sizes",
                "1,8",
                "--",
                "gen",
            ],
            "error: --batch-sizes: the sizes are for the batch_sizes check; add batch_sizes to \
             --checks",
        ),
        (
            &["run", "--dump", "d", "--batch-sizes", "1,2", "--", "gen"],
            "error: --batch-sizes: `run` launches the program once and dumps it",
        ),
    ];
    for (args, expected) in cases {
        let out = detcheck(args, dir.path());
        assert_eq!(out.code, 2, "{args:?}: {}{}", out.stdout, out.stderr);
        assert_contains("stderr", &out.stderr, &[expected]);
    }
    assert!(!dir.path().join("d").exists(), "nothing was dumped");
    check(
        (
            "command",
            r#", "checks": ["batch_sizes"], "params": {"command": ["gen"]}"#,
            &[],
        ),
        2,
        &[],
        &["case.json: field `batch_sizes`: `batch_sizes` needs at least two batch sizes"],
    );
    check(
        (
            "collective",
            r#", "checks": ["batch_sizes"], "batch_sizes": [1, 8]"#,
            &[],
        ),
        2,
        &[],
        &["case.json: field `checks[0]`: `batch_sizes` runs a program at each batch size"],
    );
}

/// Issue 16: sizes and counts beyond the machine or the documented maxima exit 2 naming the
/// field, before any rank starts: never an abort (10^10 elements), a panic (`capacity overflow`
/// at 2^63; a name of 70,000 characters, exit 101) or a silent run of 10^9 steps.
#[test]
fn limits_exit_2_naming_the_field_never_abort_or_panic() {
    let long_name = format!(r#", "name": "{}""#, "n".repeat(70_000));
    check(
        ("seed", &long_name, &[]),
        2,
        &[],
        &["case.json: field `name`: must be at most 200 bytes"],
    );
    check(
        ("seed", "", &[("\"steps\": 2", "\"steps\": 1000000000")]),
        2,
        &[],
        &["case.json: field `steps`: must be between 1 and 1000000"],
    );
    check(
        (
            "collective",
            r#", "params": {"elements": 10000000000}"#,
            &[],
        ),
        2,
        &[],
        &["case.json: field `params.elements`: the run would hold about 960.0 GB"],
    );
    check(
        (
            "collective",
            r#", "params": {"elements": 9223372036854775808}"#,
            &[],
        ),
        2,
        &[],
        &["case.json: field `params.elements`: must be at most 1099511627776"],
    );
    check(
        (
            "train",
            r#", "params": {"hidden": 10000000000, "global_batch": 63, "dataset_size": 63}"#,
            &[],
        ),
        2,
        &[],
        &["case.json: field `params.hidden`: the run would hold about"],
    );
    check(
        ("seed", "", &[("\"world_size\": 3", "\"world_size\": 1025")]),
        2,
        &[],
        &["case.json: field `world_size`: must be between 1 and 1024, got 1025"],
    );
    let dir = tempfile::tempdir().unwrap();
    scenario(dir.path(), "dataloader", "", &[]);
    let out = expect(
        &["run", "case.json", "--dump", "d", "--workers", "100000"],
        dir.path(),
        2,
    );
    assert_contains("stderr", &out.stderr, &["--workers 100000: at most 64"]);
    let out = expect(
        &["check", "--deadline", "18446744073709551615", "case.json"],
        dir.path(),
        2,
    );
    assert_contains("stderr", &out.stderr, &["--deadline", "not in 1..=604800"]);
}

/// A 1024-rank run that MemAvailable admits but the address-space limit cannot hold: before,
/// a rank's allocation failed and the process aborted ("memory allocation of 4000000 bytes
/// failed", SIGABRT); now the limit counts as memory available and the run is refused before
/// any rank starts, naming the field.
#[test]
fn a_run_beyond_the_address_space_limit_exits_2_naming_the_field_never_aborts() {
    let dir = tempfile::tempdir().unwrap();
    scenario(
        dir.path(),
        "seed",
        r#", "params": {"elements": 500000}"#,
        &[("\"world_size\": 3", "\"world_size\": 1024")],
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 8000000 && exec {} check --no-progress case.json",
            env!("CARGO_BIN_EXE_detcheck")
        ))
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_contains(
        "stderr",
        &stderr,
        &[
            "case.json: field `params.elements`: the run would hold about",
            "(the address-space limit, ulimit -v)",
        ],
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

/// A `device: "gpu"` scenario on a machine or build without a usable GPU is exit 4, naming what
/// is missing: the feature (a default build), or the CUDA driver's library (an `nccl` build on
/// a machine without the driver). `run --dump` of one too, leaving no dump behind.
#[test]
fn a_gpu_scenario_without_a_gpu_exits_4_naming_what_is_missing() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let gpu_scenarios = root.join("scenarios/gpu");
    let out = detcheck(&["check", gpu_scenarios.to_str().unwrap()], root);
    if out.code == 0 {
        println!("a GPU is usable here: the no-GPU exit is checked on machines without one");
        return;
    }
    assert_eq!(
        out.code, 4,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let missing = if cfg!(feature = "nccl") {
        "libcuda.so.1"
    } else {
        "built without GPU support: build it with `--features nccl`"
    };
    assert_contains(
        "stdout",
        &out.stdout,
        &["ERROR", "runs on a GPU (`device: \"gpu\"`), but", missing],
    );
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("dump");
    let file = gpu_scenarios.join("gpu_collective_ring_4ranks.json");
    let out = detcheck(
        &[
            "run",
            file.to_str().unwrap(),
            "--dump",
            dump.to_str().unwrap(),
        ],
        root,
    );
    assert_eq!(
        out.code, 4,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    assert_contains("stderr", &out.stderr, &[missing]);
    let left: Vec<_> = std::fs::read_dir(&dump)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter()
            .all(|n| !n.to_string_lossy().ends_with(".dctrace")),
        "{left:?}"
    );
}

/// Runs `detcheck` in `dir` and asserts the exit code, with the output in the message.
fn expect(args: &[&str], dir: &Path, code: i32) -> Outcome {
    let out = detcheck(args, dir);
    assert_eq!(
        out.code, code,
        "detcheck {args:?}\nstdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    out
}

#[test]
fn run_dumps_and_compare_finds_the_first_divergence_with_a_map() {
    let dir = tempfile::tempdir().unwrap();
    scenario(
        dir.path(),
        "collective",
        "",
        &[("\"ring\"", "\"arrival_order\"")],
    );
    let out = expect(
        &["run", "case.json", "--dump", "a", "--perturb", "1"],
        dir.path(),
        0,
    );
    assert_contains("stdout", &out.stdout, &["wrote a: 3 ranks, steps 0 to 1"]);
    expect(
        &["run", "case.json", "--dump", "b", "--perturb", "2"],
        dir.path(),
        0,
    );
    expect(
        &["run", "case.json", "--dump", "c", "--perturb", "1"],
        dir.path(),
        0,
    );
    let same = expect(&["compare", "a", "c"], dir.path(), 0);
    assert!(same.stdout.contains("identical"), "{}", same.stdout);
    let out = expect(&["compare", "a", "b", "--map", "map.png"], dir.path(), 1);
    assert_contains(
        "stdout",
        &out.stdout,
        &[
            "first divergence: step 0 rank 0 seq 4 `allreduce/sum`: md5 differs",
            "difference",
            "dmean",
            "overflow in A: none",
            "divergence map: map.png",
        ],
    );
    let png = std::fs::read(dir.path().join("map.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    // Refuses to mix two runs in one folder.
    let out = expect(&["run", "case.json", "--dump", "a"], dir.path(), 2);
    assert_contains("stderr", &out.stderr, &["a: already holds a dump"]);
}

/// `compare` prints how the two dumps' environment snapshots differ first, before the counts
/// and the first divergence; files of two dumps mixed in one folder, and a damaged byte, are bad
/// input (exit 2) naming the file.
#[test]
fn compare_prints_environment_differences_first_and_rejects_mixed_or_damaged_dumps() {
    let dir = tempfile::tempdir().unwrap();
    scenario(
        dir.path(),
        "collective",
        "",
        &[("\"ring\"", "\"arrival_order\"")],
    );
    for (name, perturb, algo) in [("a", "1", "Ring"), ("b", "2", "Tree"), ("c", "1", "Ring")] {
        let out = Command::new(env!("CARGO_BIN_EXE_detcheck"))
            .args(["run", "case.json", "--dump", name, "--perturb", perturb])
            .current_dir(dir.path())
            .env("NCCL_ALGO", algo)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let out = expect(&["compare", "a", "b"], dir.path(), 1);
    let at = |needle: &str| {
        out.stdout
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in:\n{}", out.stdout))
    };
    let env = at("environment differs (A -> B):\n  NCCL_ALGO: Ring -> Tree (ranks 0..=2)\n");
    assert!(env > at("B: b (") && env < at("compared ") && env < at("first divergence: "));
    assert!(!out.stdout.contains("launcher:"), "{}", out.stdout);
    let same = expect(&["compare", "a", "c"], dir.path(), 0);
    assert!(!same.stdout.contains("environment"), "{}", same.stdout);
    // Rank 1 of another dump (another run id) in c.
    std::fs::copy(
        dir.path().join("b/rank1.dctrace"),
        dir.path().join("c/rank1.dctrace"),
    )
    .unwrap();
    let out = expect(&["compare", "a", "c"], dir.path(), 2);
    assert_contains(
        "stderr",
        &out.stderr,
        &[
            "c/rank1.dctrace says rank 1 of 3",
            "files of different dumps are mixed",
        ],
    );
    // One damaged byte in the middle of a file.
    let path = dir.path().join("a/rank2.dctrace");
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x04;
    std::fs::write(&path, &bytes).unwrap();
    let out = expect(&["compare", "a", "b"], dir.path(), 2);
    assert_contains(
        "stderr",
        &out.stderr,
        &["a/rank2.dctrace: corrupt trace at byte "],
    );
}

#[test]
fn run_resumes_from_a_checkpoint_in_a_fresh_process_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    scenario(
        dir.path(),
        "train",
        r#", "params": {"dataset_size": 48, "global_batch": 12, "dropout_rng": "sequential"}"#,
        &[("\"steps\": 2", "\"steps\": 5")],
    );
    expect(&["run", "case.json", "--dump", "whole"], dir.path(), 0);
    let first = [
        "run",
        "case.json",
        "--dump",
        "first",
        "--stop-at",
        "3",
        "--checkpoint",
        "ck",
    ];
    let out = expect(&first, dir.path(), 0);
    assert_contains(
        "stdout",
        &out.stdout,
        &["steps 0 to 2", "checkpoint of step 3 in ck"],
    );
    let resume = ["run", "case.json", "--dump", "rest", "--resume", "ck"];
    let out = expect(&resume, dir.path(), 0);
    assert_contains(
        "stdout",
        &out.stdout,
        &["wrote rest: 3 ranks, steps 3 to 4"],
    );
    // Steps 3 and 4 match the whole run; steps 0 to 2 are only in it (and match `first`).
    let out = expect(
        &["compare", "whole", "rest", "--max-rows", "0"],
        dir.path(),
        1,
    );
    assert_contains("stdout", &out.stdout, &["steps 0..=2 are only in A"]);
    assert!(!out.stdout.contains("md5 differs"), "{}", out.stdout);
    let out = expect(
        &["compare", "whole", "first", "--max-rows", "0"],
        dir.path(),
        1,
    );
    assert_contains("stdout", &out.stdout, &["steps 3..=4 are only in A"]);
    assert!(!out.stdout.contains("md5 differs"), "{}", out.stdout);

    // A corrupt or foreign checkpoint is bad input, named before any rank starts.
    let json = dir.path().join("ck/rank1-step3.json");
    let text = std::fs::read_to_string(&json).unwrap();
    std::fs::write(&json, text.replace("\"seed\": 1", "\"seed\": 2")).unwrap();
    let out = expect(
        &["run", "case.json", "--dump", "x", "--resume", "ck"],
        dir.path(),
        2,
    );
    assert_contains(
        "stderr",
        &out.stderr,
        &["rank1-step3.json is corrupt: its checksum does not match its bytes"],
    );
    assert!(!dir.path().join("x").exists(), "no rank started");
    std::fs::write(&json, &text).unwrap();
    let tensors = dir.path().join("ck/rank2-step3.safetensors");
    let good = std::fs::read(&tensors).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x10;
    std::fs::write(&tensors, &bad).unwrap();
    let out = expect(
        &["run", "case.json", "--dump", "x", "--resume", "ck"],
        dir.path(),
        2,
    );
    assert_contains(
        "stderr",
        &out.stderr,
        &["rank2-step3.safetensors is corrupt: its md5 is"],
    );
    std::fs::write(&tensors, &good).unwrap();
    let seed2 = std::fs::read_to_string(dir.path().join("case.json"))
        .unwrap()
        .replace("\"seed\": 1", "\"seed\": 2");
    std::fs::write(dir.path().join("seed2.json"), seed2).unwrap();
    expect(
        &[
            "run",
            "seed2.json",
            "--dump",
            "f2",
            "--stop-at",
            "3",
            "--checkpoint",
            "ck2",
        ],
        dir.path(),
        0,
    );
    let out = expect(
        &["run", "case.json", "--dump", "x", "--resume", "ck2"],
        dir.path(),
        2,
    );
    assert_contains(
        "stderr",
        &out.stderr,
        &["rank0-step3.json was written by a run with seed = 2, but this run has seed = 1"],
    );
    std::fs::write(&json, &text[..text.len() / 3]).unwrap();
    let out = expect(
        &["run", "case.json", "--dump", "y", "--resume", "ck"],
        dir.path(),
        2,
    );
    assert_contains("stderr", &out.stderr, &["rank1-step3.json is corrupt"]);
    let out = expect(
        &["run", "case.json", "--dump", "z", "--resume", "nowhere"],
        dir.path(),
        2,
    );
    assert_contains(
        "stderr",
        &out.stderr,
        &["no complete checkpoint of rank 0 in nowhere"],
    );
}

#[test]
fn compare_of_full_dumps_shows_numeric_metrics_and_aligns_them() {
    let dir = tempfile::tempdir().unwrap();
    scenario(
        dir.path(),
        "collective",
        "",
        &[("\"ring\"", "\"arrival_order\"")],
    );
    for (name, run) in [("a", "1"), ("b", "2")] {
        let args = [
            "run",
            "case.json",
            "--dump",
            name,
            "--mode",
            "full",
            "--perturb",
            run,
        ];
        expect(&args, dir.path(), 0);
    }
    assert!(dir.path().join("a/rank2/step1.safetensors").is_file());
    let out = expect(&["compare", "a", "b", "--max-rows", "3"], dir.path(), 1);
    assert_contains(
        "stdout",
        &out.stdout,
        &[
            "max_abs",
            "max_rel",
            "cosine",
            "<1e-3",
            "<5e-3",
            "more differing records",
        ],
    );
    // The sums were reduced in another arrival order: they differ in their last bits only, and
    // `compare --align` counts that as rounding (exit 0), with its page; dumps it cannot pair
    // and bad thresholds exit 2 naming why.
    let out = expect(
        &["compare", "--align", "a", "b", "--html", "align.html"],
        dir.path(),
        0,
    );
    assert_contains("stdout", &out.stdout, &["aligned: all", "page: align.html"]);
    let page = std::fs::read_to_string(dir.path().join("align.html")).unwrap();
    assert_contains(
        "page",
        &page,
        &["<svg", "precision alignment", "aligned: all"],
    );
    // One more rank on one side: refused, naming both counts.
    scenario(
        dir.path(),
        "collective",
        "",
        &[
            ("\"ring\"", "\"arrival_order\""),
            ("\"world_size\": 3", "\"world_size\": 2"),
        ],
    );
    expect(
        &["run", "case.json", "--dump", "c", "--mode", "full"],
        dir.path(),
        0,
    );
    let out = expect(&["compare", "--align", "a", "c"], dir.path(), 2);
    assert_contains("stderr", &out.stderr, &["A has 3 ranks and B has 2"]);
    let out = expect(
        &["compare", "--align", "--growth=-1", "a", "b"],
        dir.path(),
        2,
    );
    assert_contains(
        "stderr",
        &out.stderr,
        &["--growth must be a positive number"],
    );
    let out = expect(&["compare", "--html", "x.html", "a", "b"], dir.path(), 2);
    assert_contains("stderr", &out.stderr, &["--align"]);
}

#[test]
fn compare_rejects_bad_dumps_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    scenario(dir.path(), "collective", "", &[]);
    expect(
        &["run", "case.json", "--dump", "a", "--mode", "md5"],
        dir.path(),
        0,
    );
    let out = expect(&["compare", "a", "missing"], dir.path(), 2);
    assert!(out.stderr.contains("missing"), "{}", out.stderr);
    let path = dir.path().join("a/rank1.dctrace");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
    let out = expect(&["compare", "a", "a"], dir.path(), 2);
    assert!(
        out.stderr
            .contains("rank1.dctrace: truncated or incomplete trace"),
        "{}",
        out.stderr
    );
    let out = expect(
        &["run", "case.json", "--dump", "x", "--mode", "zip"],
        dir.path(),
        2,
    );
    assert!(out.stderr.contains("--mode"), "{}", out.stderr);
    let out = expect(&["run", "nosuch.json", "--dump", "x"], dir.path(), 2);
    assert!(out.stderr.contains("nosuch.json"), "{}", out.stderr);
}

#[test]
fn compare_reads_msprobe_dumps() {
    let dir = tempfile::tempdir().unwrap();
    // Two single-card msprobe dumps of step 0 (summary_mode md5), differing at masked_fill's
    // input, as in the seeds' case study.
    for (side, crc) in [("gpu", "1a2b3c4d"), ("npu", "99999999")] {
        let rank = dir.path().join(side).join("step0").join("rank");
        std::fs::create_dir_all(&rank).unwrap();
        let t = |md5: &str| {
            format!(
                r#"{{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 4],
                   "Max": 1.0, "Min": 0.0, "Mean": 0.5, "Norm": 2.0, "requires_grad": true,
                   "md5": "{md5}"}}"#
            )
        };
        let json = format!(
            r#"{{"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": null,
               "data": {{"Tensor.add.0.forward": {{"input_args": [{a}, {a}], "input_kwargs": {{}}, "output": [{a}]}},
                         "Tensor.masked_fill.23.forward": {{"input_args": [{b}], "input_kwargs": {{}}, "output": [{b}]}}}}}}"#,
            a = t("00000001"),
            b = t(crc)
        );
        std::fs::write(rank.join("dump.json"), json).unwrap();
    }
    let out = expect(&["compare", "gpu", "npu"], dir.path(), 1);
    assert!(
        out.stdout.contains(
            "first divergence: step 0 rank 0 seq 3 `Tensor.masked_fill.23.forward.input.0`: md5 differs"
        ),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("msprobe dump at gpu"), "{}", out.stdout);
}

#[test]
fn curves_compares_loss_and_plots_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = |name: &str, bump: f64| {
        let history: Vec<String> = (0..6)
            .map(|s| {
                let loss = 2.0 - 0.1 * f64::from(s) + if s >= 3 { bump } else { 0.0 };
                format!(r#"{{"step": {s}, "loss": {loss}, "learning_rate": 0.1}}"#)
            })
            .collect();
        let text = format!(r#"{{"log_history": [{}]}}"#, history.join(", "));
        std::fs::write(dir.path().join(name), text).unwrap();
    };
    state("gpu.json", 0.0);
    state("npu.json", 0.05);
    let out = expect(
        &["curves", "npu.json", "gpu.json", "--plot", "loss"],
        dir.path(),
        1,
    );
    assert_contains(
        "stdout",
        &out.stdout,
        &[
            "first two steps allclose: yes",
            "whole run allclose: NO",
            "first step beyond tolerance: 3",
            "plots: loss.png loss.svg",
        ],
    );
    assert!(std::fs::read(dir.path().join("loss.png"))
        .unwrap()
        .starts_with(b"\x89PNG"));
    let svg = std::fs::read_to_string(dir.path().join("loss.svg")).unwrap();
    assert!(svg.starts_with("<svg ") && svg.contains("polyline"));
    expect(
        &["curves", "gpu.json", "gpu.json", "--no-plot"],
        dir.path(),
        0,
    );
    let out = expect(
        &["curves", "gpu.json", "npu.json", "--name", "acc"],
        dir.path(),
        2,
    );
    assert_contains("stderr", &out.stderr, &["gpu.json: no scalar named `acc`"]);
    // From dumps: the train scenario records its loss; md5 dumps have no value to plot.
    scenario(
        dir.path(),
        "train",
        r#", "params": {"dataset_size": 72, "global_batch": 12}"#,
        &[],
    );
    expect(&["run", "case.json", "--dump", "t1"], dir.path(), 0);
    expect(
        &["run", "case.json", "--dump", "t2", "--mode", "md5"],
        dir.path(),
        0,
    );
    let out = expect(&["curves", "t1", "t1", "--no-plot"], dir.path(), 0);
    assert_contains("stdout", &out.stdout, &["loss: A t1 (2 steps)"]);
    let out = expect(&["curves", "t1", "t2", "--no-plot"], dir.path(), 2);
    assert!(out.stderr.contains("holds no statistics"), "{}", out.stderr);
}

#[test]
fn check_writes_a_divergence_map_and_reports_overflow() {
    let dir = tempfile::tempdir().unwrap();
    scenario(
        dir.path(),
        "collective",
        "",
        &[("\"ring\"", "\"arrival_order\"")],
    );
    let out = expect(
        &[
            "check",
            "--no-progress",
            "--report-dir",
            "reports",
            "case.json",
        ],
        dir.path(),
        1,
    );
    assert!(
        out.stdout
            .contains("repeat: divergence map reports/case.repeat.png"),
        "{}",
        out.stdout
    );
    let png = std::fs::read(dir.path().join("reports/case.repeat.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    // A learning rate that blows the weights up: deterministic, so identical, but overflowing.
    scenario(
        dir.path(),
        "train",
        r#", "params": {"dataset_size": 72, "global_batch": 12, "optimizer": {"kind": "sgd", "lr": 1e30}}"#,
        &[],
    );
    let out = expect(&["check", "--no-progress", "case.json"], dir.path(), 0);
    assert_contains("stdout", &out.stdout, &["first overflow: step "]);
}

/// The rows of the `Exit codes:` section of `detcheck --help`: `  N  meaning`, the meaning
/// wrapped onto lines indented further (joined back with single spaces).
fn help_exit_codes(help: &str) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = Vec::new();
    let section = help
        .split_once("\nExit codes:\n")
        .expect("`detcheck --help` has an `Exit codes:` section")
        .1;
    for line in section.lines().take_while(|l| !l.trim().is_empty()) {
        let indent = line.len() - line.trim_start().len();
        if indent == 2 {
            let (code, meaning) = line.trim_start().split_once(' ').expect("`N  meaning`");
            rows.push((code.to_owned(), meaning.trim_start().to_owned()));
        } else {
            let (_, meaning) = rows.last_mut().expect("a continuation follows its row");
            meaning.push(' ');
            meaning.push_str(line.trim_start());
        }
    }
    rows
}

/// The rows of the README's `### Exit codes` table: `| N | meaning |`.
fn readme_exit_codes(readme: &str) -> Vec<(String, String)> {
    let section = readme
        .split_once("\n### Exit codes\n")
        .expect("the README has an `### Exit codes` section")
        .1;
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter(|l| !l.starts_with("| code ") && !l.starts_with("| ---"))
        .map(|l| {
            let cells = l.trim_start_matches("| ").trim_end_matches(" |");
            let (code, meaning) = cells.split_once(" | ").expect("`| N | meaning |`");
            (code.to_owned(), meaning.to_owned())
        })
        .collect()
}

/// The exit codes are written once, in `src/cli/exit.rs`: the README's table must have
/// exactly the rows `detcheck --help` prints, in the same order, word for word.
#[test]
fn the_readme_exit_code_table_is_the_one_detcheck_help_prints() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let help = detcheck(&["--help"], root);
    assert_eq!(help.code, 0, "{}", help.stderr);
    let printed = help_exit_codes(&help.stdout);
    let codes: Vec<&str> = printed.iter().map(|(code, _)| code.as_str()).collect();
    assert_eq!(codes, ["0", "1", "2", "3", "4"], "{}", help.stdout);
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert_eq!(
        readme_exit_codes(&readme),
        printed,
        "README.md's exit-code table differs from `detcheck --help` (src/cli/exit.rs)"
    );
    // `-h` names every code too, and a rejected flag is bad input.
    let short = detcheck(&["-h"], root);
    assert_contains("stdout", &short.stdout, &["Exit codes: 0 ok, 1 ", ", 3 "]);
    assert_eq!(detcheck(&["check", "--no-such-flag"], root).code, 2);
}

/// `cargo test -p detcheck --test multirank -- ARGS` (built as this test was: same features and
/// profile), from the crate root; returns its outcome (stdout: the harness's own output).
fn multirank(args: &[&str]) -> Outcome {
    let mut command = Command::new(env!("CARGO"));
    command.args(["test", "--quiet", "-p", "detcheck", "--test", "multirank"]);
    // The same features, or cargo would rebuild the crate, and with it the `detcheck` binary
    // that other tests of this run launch, without them.
    let features: Vec<&str> = [
        ("mpi", cfg!(feature = "mpi")),
        ("nccl", cfg!(feature = "nccl")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let out = command
        .arg("--")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("DETCHECK_NP")
        .output()
        .expect("cargo runs");
    Outcome {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The trial names of a `--list --format terse` output.
fn listed(out: &Outcome) -> Vec<String> {
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    out.stdout
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

/// Several name filters, as with cargo test: a trial is listed and run when its name matches any
/// of them, and an option's value (`--skip NAME`, `--format terse`) is not taken for a filter.
#[test]
fn the_multirank_harness_takes_several_name_filters() {
    let all = listed(&multirank(&["--list", "--format", "terse"]));
    let expected: Vec<&String> = all
        .iter()
        .filter(|name| name.contains("seed") || name.contains("train"))
        .collect();
    assert!(expected.iter().any(|n| n.starts_with("seed_")), "{all:?}");
    assert!(expected.iter().any(|n| n.starts_with("train_")), "{all:?}");
    assert!(
        expected.len() < all.len(),
        "some trials match neither: {all:?}"
    );

    let both = listed(&multirank(&[
        "seed", "train", "--list", "--format", "terse",
    ]));
    assert_eq!(both.iter().collect::<Vec<_>>(), expected);

    let skipped = listed(&multirank(&[
        "--skip",
        "train_large",
        "seed",
        "--format",
        "terse",
        "train",
        "--list",
    ]));
    assert_eq!(
        skipped,
        expected
            .iter()
            .filter(|n| !n.contains("train_large"))
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
    );

    // Run one trial of each group, exactly named: both run, nothing else does.
    let out = multirank(&["seed_4ranks", "train_sgd_2ranks", "--exact"]);
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let ran: Vec<String> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("test ") && !l.starts_with("test result"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        ran,
        ["test seed_4ranks ... ok", "test train_sgd_2ranks ... ok"],
        "{}",
        out.stdout
    );
    assert_contains("stdout", &out.stdout, &["2 passed; 0 failed"]);
}

/// `detcheck env --check` flags a variable that does not exist and a missing NCCL_ALGO (exit 1),
/// and passes a pinned environment (exit 0).
#[test]
fn env_check_flags_nccl_deterministic_and_a_missing_algorithm() {
    let lint = |vars: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_detcheck"));
        cmd.args(["env", "--check", "--stack", "nccl"]);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NCCL_")) {
            cmd.env_remove(k);
        }
        cmd.envs(vars.iter().copied());
        let out = cmd.output().unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, stdout) = lint(&[("NCCL_DETERMINISTIC", "1")]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("NCCL_DETERMINISTIC=1 does not exist"),
        "{stdout}"
    );
    assert!(
        stdout.contains("NCCL_ALGO is not set: set NCCL_ALGO=Ring"),
        "{stdout}"
    );
    let (code, stdout) = lint(&[
        ("NCCL_ALGO", "Ring"),
        ("NCCL_PROTO", "Simple"),
        ("NCCL_MIN_NCHANNELS", "4"),
        ("NCCL_MAX_NCHANNELS", "4"),
        ("NCCL_NVLS_ENABLE", "0"),
        ("NCCL_COLLNET_ENABLE", "0"),
    ]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("no problem found"), "{stdout}");
}

// Issue 16, parts 1 and 6: concurrent writers, non-regular files, the augment field.

/// Runs `detcheck` in `dir`, killing it (and failing the test) if it has not ended within
/// `seconds`: a command that hangs on its input fails here instead of hanging the test.
fn detcheck_within(args: &[&str], dir: &Path, seconds: u64) -> Outcome {
    let child = Command::new(env!("CARGO_BIN_EXE_detcheck"))
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    ended_within(child, seconds, &format!("detcheck {args:?}"))
}

/// The outcome of `child` once it ends, or a failed test if it outlives `seconds`.
fn ended_within(mut child: std::process::Child, seconds: u64, what: &str) -> Outcome {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > give_up {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still ran after {seconds} s: it hangs");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Outcome {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A `detcheck run --dump` started in `dir`, running.
fn spawn_run(dir: &Path, scenario: &str, dump: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_detcheck"))
        .args(["run", scenario, "--dump", dump])
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A collective scenario whose run takes about a second (debug build), so that two runs
/// started together overlap.
fn slow_scenario(dir: &Path) -> PathBuf {
    scenario(
        dir,
        "collective",
        r#", "params": {"elements": 300000}"#,
        &[],
    )
}

#[test]
fn two_runs_into_one_folder_exactly_one_writes_the_other_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    slow_scenario(dir.path());
    expect(&["run", "case.json", "--dump", "reference"], dir.path(), 0);
    for trial in 0..10 {
        let dump = format!("d{trial}");
        let first = spawn_run(dir.path(), "case.json", &dump);
        let second = spawn_run(dir.path(), "case.json", &dump);
        let pids = [first.id(), second.id()];
        let outs = [
            ended_within(first, 120, "the first run"),
            ended_within(second, 120, "the second run"),
        ];
        let codes = [outs[0].code, outs[1].code];
        let show = format!(
            "trial {trial}: {codes:?}\n{}{}",
            outs[0].stderr, outs[1].stderr
        );
        assert!(codes == [0, 2] || codes == [2, 0], "{show}");
        let (winner, loser) = if codes[0] == 0 { (0, 1) } else { (1, 0) };
        assert_contains(
            "stderr of the refused run",
            &outs[loser].stderr,
            &[
                &format!("error: {dump}: in use by another run: pid {}", pids[winner]),
                "for a dump (`",
                &format!("lock file {dump}/detcheck.lock"),
            ],
        );
        assert!(
            outs[winner]
                .stdout
                .starts_with(&format!("wrote {dump}: 3 ranks")),
            "{show}"
        );
        // The dump is complete (it reads back, identical to a run alone) and the lock is gone.
        let same = expect(&["compare", "reference", &dump], dir.path(), 0);
        assert!(same.stdout.contains("identical"), "{}", same.stdout);
        assert!(!dir.path().join(&dump).join("detcheck.lock").exists());
    }
}

#[test]
fn a_run_started_while_another_writes_the_folder_is_refused_and_the_dump_survives() {
    let dir = tempfile::tempdir().unwrap();
    slow_scenario(dir.path());
    let first = spawn_run(dir.path(), "case.json", "d");
    let holder = first.id();
    let lock = dir.path().join("d/detcheck.lock");
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !lock.exists() {
        assert!(
            std::time::Instant::now() < give_up,
            "the first run never claimed d"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let second = detcheck_within(&["run", "case.json", "--dump", "d"], dir.path(), 60);
    let first = ended_within(first, 120, "the first run");
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert_eq!(second.code, 2, "{}{}", second.stdout, second.stderr);
    assert_contains(
        "stderr",
        &second.stderr,
        &[&format!(
            "error: d: in use by another run: pid {holder} on host "
        )],
    );
    let same = expect(&["compare", "d", "d"], dir.path(), 0);
    assert_contains("stdout", &same.stdout, &["identical"]);
    // Once finished, the dump is refused as a dump, and never emptied.
    let out = expect(&["run", "case.json", "--dump", "d"], dir.path(), 2);
    assert_contains("stderr", &out.stderr, &["d: already holds a dump"]);
    expect(&["compare", "d", "d"], dir.path(), 0);
}

/// The pid of a process that has ended and been reaped: no process has it (for now).
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn a_lock_left_by_a_killed_run_is_explained_and_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    scenario(dir.path(), "collective", "", &[]);
    let folder = dir.path().join("d");
    std::fs::create_dir(&folder).unwrap();
    // The lock of a run on this host whose process is gone.
    let lock = detcheck::file::FolderLock::claim(&folder, "dump").unwrap();
    let mut holder: detcheck::file::Holder =
        serde_json::from_slice(&std::fs::read(lock.path()).unwrap()).unwrap();
    drop(lock);
    let pid = dead_pid();
    holder.pid = pid;
    holder.process_start = None;
    let stale = serde_json::to_string(&holder).unwrap();
    std::fs::write(folder.join("detcheck.lock"), &stale).unwrap();
    let out = expect(&["run", "case.json", "--dump", "d"], dir.path(), 2);
    assert_contains(
        "stderr",
        &out.stderr,
        &[
            &format!("error: d: locked by a run that is gone: pid {pid} on host "),
            "remove the folder, or only its lock file d/detcheck.lock",
        ],
    );
    assert_eq!(
        std::fs::read_to_string(folder.join("detcheck.lock")).unwrap(),
        stale,
        "a stale lock is not taken over"
    );
    std::fs::remove_file(folder.join("detcheck.lock")).unwrap();
    expect(&["run", "case.json", "--dump", "d"], dir.path(), 0);
}

#[test]
fn a_checkpoint_folder_in_use_is_refused_before_any_rank_writes() {
    let dir = tempfile::tempdir().unwrap();
    scenario(
        dir.path(),
        "train",
        r#", "params": {"dataset_size": 48, "global_batch": 12}"#,
        &[],
    );
    let ck = dir.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    // This test process holds it, as a running `detcheck run --checkpoint ck` would.
    let held = detcheck::file::FolderLock::claim(&ck, "checkpoint").unwrap();
    let args = [
        "run",
        "case.json",
        "--dump",
        "d",
        "--stop-at",
        "1",
        "--checkpoint",
        "ck",
    ];
    let out = expect(&args, dir.path(), 2);
    assert_contains(
        "stderr",
        &out.stderr,
        &[&format!(
            "error: ck: in use by another run: pid {} on host ",
            std::process::id()
        )],
    );
    let written: Vec<_> = std::fs::read_dir(dir.path().join("d")).unwrap().collect();
    assert!(written.is_empty(), "{written:?}");
    assert_eq!(std::fs::read_dir(&ck).unwrap().count(), 1, "only the lock");
    drop(held);
    let out = expect(&args, dir.path(), 0);
    assert_contains("stdout", &out.stdout, &["checkpoint of step 1 in ck"]);
    assert!(!ck.join("detcheck.lock").exists() && !dir.path().join("d/detcheck.lock").exists());
}

/// Makes a FIFO at `path` (`mkfifo`).
fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

#[test]
fn a_fifo_or_device_given_as_input_is_refused_at_once_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    mkfifo(&d.join("fifo.json"));
    let refused = |args: &[&str], names: &str| {
        let out = detcheck_within(args, d, 30);
        assert_eq!(
            out.code, 2,
            "detcheck {args:?}: {}{}",
            out.stdout, out.stderr
        );
        assert_contains("stderr", &out.stderr, &[names, "not a regular file"]);
    };
    // A scenario file.
    refused(&["check", "fifo.json"], "fifo.json: is a FIFO");
    refused(&["run", "fifo.json", "--dump", "x"], "fifo.json: is a FIFO");
    refused(&["check", "/dev/zero"], "/dev/zero: is a device");
    // A rank's trace file.
    scenario(
        d,
        "train",
        r#", "params": {"dataset_size": 48, "global_batch": 12}"#,
        &[],
    );
    expect(&["run", "case.json", "--dump", "a"], d, 0);
    expect(
        &[
            "run",
            "case.json",
            "--dump",
            "b",
            "--stop-at",
            "1",
            "--checkpoint",
            "ck",
        ],
        d,
        0,
    );
    std::fs::remove_file(d.join("a/rank1.dctrace")).unwrap();
    mkfifo(&d.join("a/rank1.dctrace"));
    refused(&["compare", "a", "b"], "a/rank1.dctrace: is a FIFO");
    // A checkpoint file.
    std::fs::remove_file(d.join("ck/rank0-step1.json")).unwrap();
    mkfifo(&d.join("ck/rank0-step1.json"));
    refused(
        &["run", "case.json", "--dump", "c", "--resume", "ck"],
        "ck/rank0-step1.json: is a FIFO",
    );
    // An msprobe dump.json.
    std::fs::create_dir_all(d.join("ms/step0/rank")).unwrap();
    mkfifo(&d.join("ms/step0/rank/dump.json"));
    refused(&["compare", "ms", "ms"], "dump.json: is a FIFO");
    // A curves file.
    refused(
        &["curves", "fifo.json", "fifo.json"],
        "fifo.json: is a FIFO",
    );
}

/// Issue 16: a struct of a scenario file given as an array of its fields (which serde's derive
/// reads by position) exits 2 naming the field, for `check` and `run` alike.
#[test]
fn a_struct_given_as_an_array_exits_2_naming_the_field() {
    check(
        (
            "collective",
            r#", "params": {"fault": [2, 1, "panic"]}"#,
            &[],
        ),
        2,
        &[],
        &["case.json: field `params.fault`: expected an object, got an array"],
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("case.json"),
        r#"[null, "", "collective", 3, 2, 1, "ring", true, "identical"]"#,
    )
    .unwrap();
    let out = expect(&["run", "case.json", "--dump", "x"], dir.path(), 2);
    assert_contains(
        "stderr",
        &out.stderr,
        &["case.json: field `(top level)`: expected an object, got an array"],
    );
}

#[test]
fn augment_of_the_wrong_shape_is_bad_input_naming_the_field() {
    for kind in ["dataloader", "train"] {
        for augment in ["[1]", "[0, true, 0.5]", "1", "true", "\"flip\"", "null"] {
            let params = format!(r#", "params": {{"augment": {augment}}}"#);
            let dir = tempfile::tempdir().unwrap();
            scenario(dir.path(), kind, &params, &[]);
            let out = expect(&["run", "case.json", "--dump", "x"], dir.path(), 2);
            let why = if augment.starts_with('[') {
                "expected an object, got an array"
            } else {
                "invalid type"
            };
            assert_contains(
                "stderr",
                &out.stderr,
                &[&format!("case.json: field `params.augment`: {why}")],
            );
        }
    }
    // A wrong field inside it is named as it was.
    check(
        ("dataloader", r#", "params": {"augment": {"flip": 3}}"#, &[]),
        2,
        &[],
        &["case.json: field `params.augment.flip`: invalid type: integer `3`"],
    );
}

#[test]
fn run_under_an_mpi_launcher_of_several_processes_is_refused_by_every_process() {
    let dir = tempfile::tempdir().unwrap();
    scenario(dir.path(), "collective", "", &[]);
    for rank in ["0", "1"] {
        let out = Command::new(env!("CARGO_BIN_EXE_detcheck"))
            .args(["run", "case.json", "--dump", "d"])
            .current_dir(dir.path())
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .env("OMPI_COMM_WORLD_RANK", rank)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_contains(
            "stderr",
            &stderr,
            &["run: started by an MPI launcher with 2 processes, each of which would write"],
        );
        assert!(!dir.path().join("d").exists(), "nothing is written");
    }
}

#[test]
fn a_failed_run_releases_its_folder_and_leaves_no_files() {
    let dir = tempfile::tempdir().unwrap();
    let fault = r#", "params": {"fault": {"rank": 2, "step": 1, "kind": "panic"}}"#;
    scenario(dir.path(), "collective", fault, &[]);
    expect(&["run", "case.json", "--dump", "d"], dir.path(), 3);
    let left: Vec<_> = std::fs::read_dir(dir.path().join("d")).unwrap().collect();
    assert!(
        left.is_empty(),
        "no lock and no trace file is left: {left:?}"
    );
    scenario(dir.path(), "collective", "", &[]);
    expect(&["run", "case.json", "--dump", "d"], dir.path(), 0);
}
