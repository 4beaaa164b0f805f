//! `cargo test --test slurm` (and `--features mpi` for the rsmpi program): the `srun` launcher
//! against a real Slurm, the one-node cluster of `bash scripts/slurm-local.sh start`.
//!
//! Each test that needs Slurm skips, saying so, when `srun` is missing or no node is up, unless
//! `DETCHECK_REQUIRE_SLURM=1` (as `.ci/run` sets): then a missing Slurm fails it. What they
//! check: a program of the user's own under MPI through `srun --mpi=pmix`; a job step that
//! `scancel` ends is exit 3 naming the step, within the timeout; an `srun` still waiting for
//! resources at the timeout is exit 3 with Slurm's reason, and its queued job is cancelled; a
//! step Slurm cannot allocate, and a program the node cannot execute, are exit 2; a rank that
//! cannot write the trace folder is named with the shared-folder hint; and
//! `examples/slurm/smoke.sbatch` submitted with `sbatch --wait` passes with its JUnit and HTML
//! reports written (the default launcher inside the allocation). Without Slurm at all: the `srun`
//! launcher is exit 2 naming it and how to get it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Whether a Slurm answers here: `srun` on PATH and a node up. `None` when it does, else why
/// not; panics instead where `DETCHECK_REQUIRE_SLURM` is set.
fn slurm_missing() -> Option<String> {
    let nodes = Command::new("sinfo")
        .args(["--noheader", "--Node", "--format=%T"])
        .output();
    let why = match nodes {
        Err(e) => Some(format!("sinfo cannot run ({e})")),
        Ok(out) => {
            let states = String::from_utf8_lossy(&out.stdout).into_owned();
            let up = states
                .split_whitespace()
                .any(|s| ["idle", "mixed", "allocated", "completing"].contains(&s));
            (!up).then(|| format!("no Slurm node is up (sinfo: `{}`)", states.trim()))
        }
    };
    let why = why.or_else(|| {
        Command::new("srun")
            .arg("--version")
            .output()
            .err()
            .map(|e| format!("srun cannot run ({e})"))
    })?;
    let why = format!("{why}: `bash scripts/slurm-local.sh start` runs a one-node Slurm here");
    assert!(
        std::env::var_os("DETCHECK_REQUIRE_SLURM").is_none(),
        "DETCHECK_REQUIRE_SLURM is set, but {why}"
    );
    eprintln!("skipped: {why} (DETCHECK_REQUIRE_SLURM=1 makes this a failure)");
    Some(why)
}

/// The one node, for one test at a time (their jobs would queue behind each other's, and the
/// timeouts they check would be other tests' waits); `None` when Slurm is missing (skipped).
fn the_node() -> Option<MutexGuard<'static, ()>> {
    static NODE: Mutex<()> = Mutex::new(());
    if slurm_missing().is_some() {
        return None;
    }
    Some(NODE.lock().unwrap_or_else(PoisonError::into_inner))
}

/// `detcheck ARGS` in `dir`, with `env` on top of this process's environment; its output and
/// how long it took.
fn detcheck(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_detcheck"))
        .args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("the detcheck binary runs");
    (out, started.elapsed())
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The example program, built by `cargo test` beside this test (target/<profile>/examples/).
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    let path = deps
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(path.exists(), "{} is not built", path.display());
    path
}

/// The jobs and steps in Slurm's queue whose name starts with `prefix`.
fn queued(prefix: &str) -> Vec<String> {
    let out = Command::new("squeue")
        .args(["--noheader", "--steps", "--format=%i %j"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut found: Vec<String> = out
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|n| n.starts_with(prefix))
        })
        .map(str::to_owned)
        .collect();
    let jobs = Command::new("squeue")
        .args(["--noheader", "--format=%i %j"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    found.extend(
        jobs.lines()
            .filter(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .map(str::to_owned),
    );
    found
}

#[test]
fn without_srun_the_srun_launcher_is_exit_2_naming_it_and_how_to_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = detcheck(
        &["check", "--no-progress", "--launcher", "srun", "--", "true"],
        dir.path(),
        &[("PATH", "/nonexistent")],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("field `params.launcher`: cannot start `srun`"),
        "{said}"
    );
    assert!(said.contains("scripts/slurm-local.sh start"), "{said}");
}

/// An rsmpi program (examples/mpi_sum.rs) as a Slurm step: detcheck sees it links libmpi and
/// runs `srun --mpi=pmix`; repeat, replicas and world sizes 1 and 2 hold.
#[cfg(feature = "mpi")]
#[test]
fn an_mpi_program_runs_through_srun_mpi_pmix() {
    let Some(_node) = the_node() else {
        return;
    };
    let program = example("mpi_sum");
    let program = program.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = detcheck(
        &[
            "check",
            "--no-progress",
            "--launcher",
            "srun",
            "--ranks",
            "2",
            "--checks",
            "repeat,replicas,world_sizes",
            "--world-sizes",
            "1,2",
            "--timeout",
            "120",
            "--",
            program,
            "--seed",
            "21",
            "--steps",
            "3",
        ],
        dir.path(),
        &[],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("1 passed, 0 failed"), "{said}");
}

#[test]
fn a_step_cancelled_by_scancel_is_exit_3_naming_the_step_within_the_timeout() {
    let Some(_node) = the_node() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_detcheck"))
        .args([
            "check",
            "--no-progress",
            "--launcher",
            "srun",
            "--ranks",
            "2",
            "--checks",
            "repeat",
            "--timeout",
            "60",
            "--",
            "sh",
            "-c",
            "sleep 50",
        ])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let prefix = format!("detcheck-{}-", child.id());
    // Once the step runs, cancel it as an operator would.
    let mut cancelled = false;
    while started.elapsed() < Duration::from_secs(30) && !cancelled {
        std::thread::sleep(Duration::from_millis(200));
        let ids: Vec<String> = queued(&prefix)
            .iter()
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect();
        if !ids.is_empty() {
            std::thread::sleep(Duration::from_millis(500));
            cancelled = Command::new("scancel")
                .args(&ids)
                .status()
                .unwrap()
                .success();
        }
    }
    assert!(cancelled, "the launch's job never showed in squeue");
    let out = child.wait_with_output().unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.contains("Slurm cancelled it: STEP"), "{said}");
    assert!(said.contains("CANCELLED AT"), "{said}");
    // Both ranks named: alike ("ranks 0-1: Terminated"), or each in its own words when one
    // ended before Slurm's signal reached it ("rank 1: Exited with exit code 143").
    let both = said.contains("ranks 0-1") || (said.contains("rank 0:") && said.contains("rank 1:"));
    assert!(both, "{said}");
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "took {:?}",
        started.elapsed()
    );
    // Nothing left: the job leaves the queue once Slurm has finished completing it.
    let gone = Instant::now();
    while !queued(&prefix).is_empty() && gone.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        queued(&prefix).is_empty(),
        "left in the queue: {:?}",
        queued(&prefix)
    );
}

#[test]
fn an_srun_waiting_for_resources_is_exit_3_at_the_timeout_with_slurms_reason() {
    let Some(_node) = the_node() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // More tasks than the cluster has CPUs: Slurm queues the job, and it never starts.
    let ranks = (std::thread::available_parallelism().map_or(1, usize::from) * 64).to_string();
    let (out, took) = detcheck(
        &[
            "check",
            "--no-progress",
            "--launcher",
            "srun",
            "--ranks",
            &ranks,
            "--checks",
            "repeat",
            "--timeout",
            "4",
            "--",
            "true",
        ],
        dir.path(),
        &[],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("srun was still waiting for resources: Slurm job"),
        "{said}"
    );
    assert!(said.contains("PENDING"), "{said}");
    assert!(took < Duration::from_secs(20), "took {took:?}: {said}");
    // The queued job went with the launch.
    let job = said
        .split("Slurm job ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .to_owned();
    let still = Command::new("squeue")
        .args(["--noheader", "--format=%i", &format!("--jobs={job}")])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&still.stdout).trim().is_empty(),
        "job {job} is still queued"
    );
}

#[test]
fn a_step_slurm_cannot_start_is_exit_2_in_slurms_words() {
    let Some(_node) = the_node() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = detcheck(
        &[
            "check",
            "--no-progress",
            "--launcher",
            "srun",
            "--srun-args",
            "--nodelist=no-such-node",
            "--timeout",
            "30",
            "--",
            "true",
        ],
        dir.path(),
        &[],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("field `params.launcher`: srun cannot start the step: Slurm cannot allocate the step: Invalid node name specified"),
        "{said}"
    );
    let (out, _) = detcheck(
        &[
            "check",
            "--no-progress",
            "--launcher",
            "srun",
            "--timeout",
            "30",
            "--",
            "./no-such-program",
        ],
        dir.path(),
        &[],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("field `params.command[0]`: srun cannot start the step: the node cannot execute the program"),
        "{said}"
    );
}

/// Tasks run as `nobody` (`srun --uid`, root only) cannot write root's trace folder: the rank
/// is named, with what the folder needs.
#[test]
fn a_rank_that_cannot_write_the_trace_folder_is_named() {
    let Some(_node) = the_node() else {
        return;
    };
    let uid = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        eprintln!("skipped: srun --uid needs root");
        return;
    }
    let program = example("trace_ranks");
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = detcheck(
        &[
            "check",
            "--no-progress",
            "--launcher",
            "srun",
            "--srun-args",
            "--uid=nobody",
            "--timeout",
            "30",
            "--",
            program.to_str().unwrap(),
            "--steps",
            "2",
        ],
        dir.path(),
        &[],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.contains("rank 0: Exited with exit code"), "{said}");
    assert!(said.contains("Permission denied"), "{said}");
    assert!(said.contains("set DETCHECK_SHARED_DIR"), "{said}");
}

/// `examples/slurm/smoke.sbatch` under `sbatch --wait`: detcheck inside the allocation launches
/// srun steps by default; the clean check passes, the planted failure is caught, and the JUnit
/// and HTML reports are written. Needs a `python3` with torch and the detcheck package first on
/// PATH (`scripts/install-python.sh --torch`; CI puts target/venv/bin there).
#[test]
fn the_sbatch_smoke_test_passes_and_writes_its_reports() {
    let Some(_node) = the_node() else {
        return;
    };
    let python_ok = Command::new("python3")
        .args(["-c", "import torch, detcheck"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !python_ok {
        let why = "the python3 on PATH lacks torch or detcheck (scripts/install-python.sh --torch)";
        assert!(
            std::env::var_os("DETCHECK_REQUIRE_SLURM").is_none(),
            "{why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let reports = tempfile::tempdir().unwrap();
    let log = reports.path().join("job.out");
    let started = Instant::now();
    let out = Command::new("sbatch")
        .args([
            "--wait",
            "--parsable",
            &format!("--output={}", log.display()),
        ])
        .arg("examples/slurm/smoke.sbatch")
        .current_dir(ROOT)
        .env("DETCHECK", env!("CARGO_BIN_EXE_detcheck"))
        .env("DETCHECK_REPORTS", reports.path())
        .env("DETCHECK_SMOKE_CHECKS", "repeat,replicas")
        .output()
        .unwrap();
    let job_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(out.status.success(), "{}\n{job_log}", text(&out));
    let junit = std::fs::read_to_string(reports.path().join("junit.xml")).unwrap();
    assert!(
        junit.contains("<testcase") && junit.contains("ddp_train"),
        "{junit}"
    );
    assert!(!junit.contains("<failure"), "{junit}");
    let pages = reports.path().join("pages");
    let page = pages.join("planted_clock_reseed.repeat.html");
    assert!(page.is_file(), "no {}: {job_log}", page.display());
    assert!(job_log.contains("clean check: exit 0"), "{job_log}");
    eprintln!("sbatch smoke test: {:?}", started.elapsed());
}
