//! detcheck-harness: runs detcheck scenarios as `cargo test` trials.
//!
//! A [`Harness`] finds the scenario files of one or more folders, turns each into a
//! [libtest-mimic](https://docs.rs/libtest-mimic) trial named after the scenario, and runs the
//! trials with cargo test's command line: name filters, `--exact`, `--skip`, `--list`,
//! `--ignored`, `--include-ignored`, `--test-threads`. `--list --format terse` prints only
//! `name: test` lines, so `cargo nextest run` works too.
//!
//! Each trial launches the scenario's ranks, runs its checks ([`detcheck::run_checks`]) and fails
//! with the first divergence (step, rank, tensor, both md5s and stats) when a check does not hold:
//! a divergence where `identical` was expected, or a negative control that was not caught. A
//! scenario file that cannot be loaded becomes a failing trial that names the file and field.
//!
//! Use it from any crate: put scenario files in a folder, add a `[[test]]` with `harness = false`,
//! and register your own kinds with [`Harness::with_kind`]:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     detcheck_harness::Harness::new()
//!         .scenario_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios"))
//!         .run()
//! }
//! ```
//!
//! Under MPI (cargo feature `mpi` of detcheck): `mpirun -n 4 <test binary>` runs every trial on
//! MPI ranks, each process one rank. Process 0 runs libtest-mimic (one test thread, no colour) and
//! prints; the other processes follow it, so they run the same runs in the same order. A scenario
//! that needs more ranks than processes is ignored, with a note. `--list` never starts MPI. With
//! `DETCHECK_NP=4` set, the binary re-launches itself under `mpirun -n 4` (see [`relaunch`]), so
//! `DETCHECK_NP=4 cargo test --features mpi --test multirank` works from cargo.
//!
//! Determinism: trials are built in file-name order; each trial's outcome depends only on its
//! scenario, not on which trials run beside it.

pub mod relaunch;

use detcheck::check::launcher_rank;
use detcheck::scenario::ScenarioError;
use detcheck::{
    discover_scenarios, CheckOptions, KindRegistry, LoadedScenario, ParamError, Scenario,
    ScenarioSpec, Session,
};
use libtest_mimic::{Arguments, ColorSetting, Conclusion, Failed, Trial};
use std::cell::RefCell;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

thread_local! {
    /// The session trials run in. libtest-mimic runs trials on the main thread when it has one
    /// test thread, which is how the harness runs under MPI (MPI is called from that thread only).
    static SESSION: RefCell<Option<Session>> = const { RefCell::new(None) };
}

/// Builds and runs the trials of one test binary.
#[derive(Debug, Clone)]
pub struct Harness {
    dirs: Vec<PathBuf>,
    registry: KindRegistry,
    options: CheckOptions,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// A harness with the built-in kinds, default options and no scenario folders yet.
    #[must_use]
    pub fn new() -> Self {
        Harness {
            dirs: Vec::new(),
            registry: KindRegistry::builtin(),
            options: CheckOptions::default(),
        }
    }

    /// Adds a folder whose `*.json` files are scenarios.
    #[must_use]
    pub fn scenario_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dirs.push(dir.into());
        self
    }

    /// Registers a scenario kind of your own, usable as `"kind": name` in scenario files.
    #[must_use]
    pub fn with_kind(
        mut self,
        name: impl Into<String>,
        factory: impl Fn(&ScenarioSpec) -> Result<Arc<dyn Scenario>, ParamError> + Send + Sync + 'static,
    ) -> Self {
        self.registry.register(name, factory);
        self
    }

    /// Replaces the check options (deadline, record level, perturbation delays).
    #[must_use]
    pub fn with_options(mut self, options: CheckOptions) -> Self {
        self.options = options;
        self
    }

    /// The trials, one per scenario file, in folder then file-name order.
    #[must_use]
    pub fn trials(&self) -> Vec<Trial> {
        self.trials_for(None)
    }

    /// The trials for a job of `processes` MPI processes (`None` on thread ranks): a scenario
    /// that needs more ranks is ignored.
    fn trials_for(&self, processes: Option<usize>) -> Vec<Trial> {
        let mut trials = Vec::new();
        for dir in &self.dirs {
            let found = match discover_scenarios(dir, &self.registry) {
                Ok(found) => found,
                Err(e) => {
                    let name = dir.display().to_string();
                    let message = e.to_string();
                    trials.push(Trial::test(name, move || Err(message.into())));
                    continue;
                }
            };
            for result in found {
                trials.push(match result {
                    Ok(scenario) => {
                        let too_large = processes.is_some_and(|p| scenario.spec.world_size > p);
                        self.trial(scenario, too_large)
                    }
                    Err(e) => {
                        let name = match &e {
                            ScenarioError::Invalid { path, .. }
                            | ScenarioError::Read { path, .. }
                            | ScenarioError::DuplicateName { second: path, .. } => {
                                path.file_stem().map_or_else(
                                    || path.display().to_string(),
                                    |s| s.to_string_lossy().into_owned(),
                                )
                            }
                            _ => "scenario".to_owned(),
                        };
                        let message = e.to_string();
                        Trial::test(name, move || Err(message.into()))
                    }
                });
            }
        }
        trials
    }

    fn trial(&self, scenario: LoadedScenario, too_large: bool) -> Trial {
        let options = self.options.clone();
        let ignored = scenario.spec.ignored || too_large;
        Trial::test(scenario.name.clone(), move || {
            check_trial(&scenario, &options)
        })
        .with_ignored_flag(ignored)
    }

    /// Runs the trials with the given command line.
    pub fn run_with_args(&self, args: &Arguments) -> Conclusion {
        libtest_mimic::run(args, self.trials())
    }

    /// Runs the trials with this process's command line; the exit code is cargo test's (101
    /// when a trial failed, 2 when MPI cannot be used as started).
    ///
    /// With `DETCHECK_NP` set, re-launches this binary under `mpirun` instead; started by
    /// `mpirun`, runs on MPI ranks (see the crate docs).
    #[must_use]
    pub fn run(&self) -> ExitCode {
        let mut args = Arguments::from_args();
        if args.list {
            // Listing starts no MPI; under mpirun, one process lists.
            return if launcher_rank().unwrap_or(0) == 0 {
                self.run_with_args(&args).exit_code()
            } else {
                ExitCode::SUCCESS
            };
        }
        if let Some(code) = relaunch::relaunch_if_asked() {
            return code;
        }
        let session = match Session::from_env() {
            Ok(session) => session,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let Some(processes) = session.num_processes() else {
            return self.run_with_args(&args).exit_code();
        };
        if !session.is_leader() {
            let code = session.follow(&self.registry);
            return ExitCode::from(session.finish(code));
        }
        args.test_threads = Some(1);
        args.color = Some(ColorSetting::Never);
        println!(
            "detcheck-harness on {}; scenarios needing more than {processes} ranks are ignored",
            session.describe()
        );
        let trials = self.trials_for(Some(processes));
        SESSION.with(|s| *s.borrow_mut() = Some(session));
        let failed = libtest_mimic::run(&args, trials).has_failed();
        let session = SESSION
            .with(|s| s.borrow_mut().take())
            .expect("the session outlives the trials");
        ExitCode::from(session.finish(if failed { 101 } else { 0 }))
    }
}

/// The body of one trial: run the checks (in this thread's session, thread ranks without one),
/// fail with an explanation when one does not hold.
fn check_trial(scenario: &LoadedScenario, options: &CheckOptions) -> Result<(), Failed> {
    let report = SESSION
        .with(|s| match s.borrow().as_ref() {
            Some(session) => session.run_checks(scenario, options),
            None => detcheck::run_checks(scenario, options),
        })
        .map_err(|e| Failed::from(e.to_string()))?;
    if report.passed() {
        Ok(())
    } else {
        Err(format!(
            "{} ({}, {} ranks, {} steps, reduction {}):\n{}",
            scenario.name,
            scenario.origin.display(),
            report.world_size,
            report.steps,
            scenario.spec.effective_mode(),
            report.explain_failures()
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    // These tests inspect trials and run trial bodies directly: running libtest-mimic here would
    // print a nested `test result:` line into this binary's own output.
    use super::*;

    fn write(dir: &std::path::Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    const RING: &str = r#"{"kind": "collective", "world_size": 3, "steps": 2, "seed": 7,
        "reduction": "ring", "deterministic_comm": true, "expect": "EXPECT",
        "params": {"elements": 64}}"#;

    #[test]
    fn an_uncaught_negative_control_fails_its_trial() {
        let dir = tempfile::tempdir().unwrap();
        // A deterministic scenario that claims to be a negative control.
        write(
            dir.path(),
            "not_a_control.json",
            &RING.replace("EXPECT", "diverges"),
        );
        let registry = KindRegistry::builtin();
        let scenario = registry
            .load_file(&dir.path().join("not_a_control.json"))
            .unwrap();
        let failed = check_trial(&scenario, &CheckOptions::default()).unwrap_err();
        let message = failed.message().unwrap();
        assert!(message.contains("negative control not caught"), "{message}");
        assert!(message.contains("not_a_control.json"), "{message}");

        write(
            dir.path(),
            "good.json",
            &RING.replace("EXPECT", "identical"),
        );
        let good = registry.load_file(&dir.path().join("good.json")).unwrap();
        assert!(check_trial(&good, &CheckOptions::default()).is_ok());
    }

    #[test]
    fn trials_are_named_after_files_in_order_and_keep_the_ignored_flag() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "b_typo.json",
            &RING.replace("\"steps\"", "\"stpes\""),
        );
        write(
            dir.path(),
            "a_slow.json",
            &RING
                .replace("EXPECT", "identical")
                .replace("\"seed\": 7", "\"seed\": 7, \"ignored\": true"),
        );
        let trials = Harness::new().scenario_dir(dir.path()).trials();
        let names: Vec<_> = trials
            .iter()
            .map(|t| (t.name(), t.has_ignored_flag()))
            .collect();
        assert_eq!(names, [("a_slow", true), ("b_typo", false)]);
        let missing = Harness::new()
            .scenario_dir(dir.path().join("nope"))
            .trials();
        assert_eq!(missing.len(), 1, "a missing folder is one failing trial");
    }
}
