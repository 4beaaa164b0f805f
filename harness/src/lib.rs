//! detcheck-harness: runs detcheck scenarios as `cargo test` trials.
//!
//! A [`Harness`] finds the scenario files of one or more folders, turns each into a
//! [libtest-mimic](https://docs.rs/libtest-mimic) trial named after the scenario, and runs the
//! trials with cargo test's command line ([`CommandLine`]): name filters, as many as you like
//! (`cargo test --test multirank -- seed train` runs the trials whose names contain `seed` or
//! `train`), `--exact`, `--skip`, `--list`, `--ignored`, `--include-ignored`, `--test-threads`.
//! `--list --format terse` prints only `name: test` lines, so `cargo nextest run` works too.
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
#![forbid(unsafe_code)]

pub mod relaunch;

use detcheck::check::{launcher_rank, mpi_skip_reason};
use detcheck::scenario::ScenarioError;
use detcheck::{
    discover_scenarios, CheckOptions, KindRegistry, LoadedScenario, ParamError, Scenario,
    ScenarioSpec, Session,
};
use libtest_mimic::{Arguments, ColorSetting, Conclusion, Failed, Trial};
use std::cell::RefCell;
use std::ffi::OsString;
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
                        let skip =
                            processes.is_some_and(|p| mpi_skip_reason(&scenario, p).is_some());
                        self.trial(scenario, skip)
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

    fn trial(&self, scenario: LoadedScenario, skip: bool) -> Trial {
        let options = self.options.clone();
        let ignored = scenario.spec.ignored || skip;
        Trial::test(scenario.name.clone(), move || {
            check_trial(&scenario, &options)
        })
        .with_ignored_flag(ignored)
    }

    /// Runs the trials with the given libtest-mimic arguments (one name filter at most; see
    /// [`Harness::run_with_command_line`] for several).
    pub fn run_with_args(&self, args: &Arguments) -> Conclusion {
        libtest_mimic::run(args, self.trials())
    }

    /// Runs the trials with the given command line: those that match one of its filters.
    pub fn run_with_command_line(&self, command_line: &CommandLine) -> Conclusion {
        command_line.run(self.trials())
    }

    /// Runs the trials with this process's command line; the exit code is cargo test's (101
    /// when a trial failed, 2 when MPI cannot be used as started).
    ///
    /// With `DETCHECK_NP` set, re-launches this binary under `mpirun` instead; started by
    /// `mpirun`, runs on MPI ranks (see the crate docs).
    #[must_use]
    pub fn run(&self) -> ExitCode {
        let mut command_line = CommandLine::from_args();
        if command_line.arguments.list {
            // Listing starts no MPI; under mpirun, one process lists.
            return if launcher_rank().unwrap_or(0) == 0 {
                self.run_with_command_line(&command_line).exit_code()
            } else {
                ExitCode::SUCCESS
            };
        }
        // The re-launched binary gets this process's arguments as they are, filters included.
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
            return self.run_with_command_line(&command_line).exit_code();
        };
        if !session.is_leader() {
            // A follower runs what the leader's filters chose, as the leader says.
            let code = session.follow(&self.registry);
            return ExitCode::from(session.finish(code));
        }
        command_line.arguments.test_threads = Some(1);
        command_line.arguments.color = Some(ColorSetting::Never);
        println!(
            "detcheck-harness on {}; scenarios needing more than {processes} ranks are ignored",
            session.describe()
        );
        let trials = self.trials_for(Some(processes));
        SESSION.with(|s| *s.borrow_mut() = Some(session));
        let failed = command_line.run(trials).has_failed();
        let session = SESSION
            .with(|s| s.borrow_mut().take())
            .expect("the session outlives the trials");
        ExitCode::from(session.finish(if failed { 101 } else { 0 }))
    }
}

/// cargo test's command line: libtest-mimic's [`Arguments`] and every name filter.
///
/// libtest-mimic takes one positional filter; cargo test takes any number, and runs a test whose
/// name matches one of them. [`CommandLine::parse_from`] takes the filters out of the arguments
/// first (an option's value, as in `--skip NAME` or `--format terse`, is never taken for a
/// filter) and parses the rest with libtest-mimic.
///
/// Known limitation: with two filters or more, the trials they leave out are removed before
/// libtest-mimic sees them, so its summary line does not count them as `filtered out`.
#[derive(Debug, Clone, Default)]
pub struct CommandLine {
    /// Everything but the name filters. A `filter` set here counts as one more filter.
    pub arguments: Arguments,
    /// The name filters, in command-line order. A trial is kept when its name contains one (with
    /// `--exact`: equals one); with no filter, every trial is kept.
    pub filters: Vec<String>,
}

impl CommandLine {
    /// This process's command line. Exits with a usage message, as libtest-mimic does, when
    /// the arguments cannot be parsed (before any MPI is started).
    #[must_use]
    pub fn from_args() -> Self {
        Self::parse_from(std::env::args_os())
    }

    /// Parses `args`, the first being the program's name (like [`Arguments::from_iter`]).
    #[must_use]
    pub fn parse_from<I>(args: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<OsString>,
    {
        let (rest, filters) = split_filters(args.into_iter().map(Into::into));
        CommandLine {
            arguments: Arguments::from_iter(rest),
            filters,
        }
    }

    /// Every filter: [`CommandLine::filters`], then `arguments.filter` if set.
    fn all_filters(&self) -> impl Iterator<Item = &String> {
        self.filters.iter().chain(&self.arguments.filter)
    }

    /// `true` when `trial` matches one of the filters (or there is none), by libtest-mimic's
    /// own rule for one filter: a substring of the name, or with `--exact` the whole name.
    #[must_use]
    pub fn matches(&self, trial: &Trial) -> bool {
        let mut filters = self.all_filters().peekable();
        filters.peek().is_none()
            || filters.any(|filter| {
                let one = Arguments {
                    filter: Some(filter.clone()),
                    exact: self.arguments.exact,
                    ..Arguments::default()
                };
                !one.is_filtered_out(trial)
            })
    }

    /// Runs (or with `--list`, lists) the trials that match a filter, with libtest-mimic.
    pub fn run(&self, trials: Vec<Trial>) -> Conclusion {
        let mut arguments = self.arguments.clone();
        if self.all_filters().count() <= 1 {
            // One filter: libtest-mimic applies it, and counts what it leaves out.
            arguments.filter = self.all_filters().next().cloned();
            return libtest_mimic::run(&arguments, trials);
        }
        arguments.filter = None;
        let kept = trials.into_iter().filter(|t| self.matches(t)).collect();
        libtest_mimic::run(&arguments, kept)
    }
}

/// Splits a command line (program name first) into the arguments for libtest-mimic and the name
/// filters: every positional argument, and everything after `--`. The value of an option that
/// takes one (`--skip NAME`, `--format terse`, `--test-threads N`, `-Z X` ...) stays with its
/// option; which options take a value is read from libtest-mimic's own parser.
fn split_filters(args: impl IntoIterator<Item = OsString>) -> (Vec<OsString>, Vec<String>) {
    use clap::CommandFactory as _;
    let parser = Arguments::command();
    let valued: Vec<&clap::Arg> = parser
        .get_arguments()
        .filter(|a| !a.is_positional() && a.get_action().takes_values())
        .collect();
    let long_takes_value = |name: &str| valued.iter().any(|a| a.get_long() == Some(name));
    let short_takes_value = |c: char| valued.iter().any(|a| a.get_short() == Some(c));

    let mut args = args.into_iter();
    let mut rest: Vec<OsString> = args.next().into_iter().collect();
    let mut filters = Vec::new();
    let mut only_filters = false;
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        if only_filters {
            filters.push(text);
        } else if text == "--" {
            only_filters = true;
        } else if let Some(long) = text.strip_prefix("--") {
            // `--skip=NAME` carries its value; `--skip NAME` takes the next argument.
            let takes_next = !long.contains('=') && long_takes_value(long);
            rest.push(arg);
            if takes_next {
                rest.extend(args.next());
            }
        } else if text.len() > 1 && text.starts_with('-') {
            // A cluster of short flags (`-q`, `-Z X`, `-Zunstable-options`, `-qZ X`): the first
            // one that takes a value takes the rest of the cluster, or the next argument.
            let cluster = &text[1..];
            let takes_next = cluster
                .char_indices()
                .find(|&(_, c)| short_takes_value(c))
                .is_some_and(|(i, c)| i + c.len_utf8() == cluster.len());
            rest.push(arg);
            if takes_next {
                rest.extend(args.next());
            }
        } else {
            filters.push(text);
        }
    }
    (rest, filters)
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

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn several_filters_are_taken_out_and_option_values_stay_with_their_options() {
        let (rest, filters) = split_filters(os(&[
            "multirank",
            "seed",
            "--skip",
            "large",
            "train",
            "--format",
            "terse",
            "--test-threads",
            "1",
            "--color=never",
            "--logfile",
            "log.txt",
            "-Z",
            "unstable-options",
            "--color",
            "never",
            "--exact",
            "control",
            "--",
            "--list",
        ]));
        assert_eq!(filters, ["seed", "train", "control", "--list"]);
        assert_eq!(
            rest,
            os(&[
                "multirank",
                "--skip",
                "large",
                "--format",
                "terse",
                "--test-threads",
                "1",
                "--color=never",
                "--logfile",
                "log.txt",
                "-Z",
                "unstable-options",
                "--color",
                "never",
                "--exact",
            ])
        );
        // A short option's value attached, or next after a cluster of flags.
        let (rest, filters) = split_filters(os(&["m", "-Zunstable-options", "a", "-qZ", "x", "b"]));
        assert_eq!(filters, ["a", "b"]);
        assert_eq!(rest, os(&["m", "-Zunstable-options", "-qZ", "x"]));
        // Nothing to take out.
        assert_eq!(
            split_filters(os(&["m", "--list"])),
            (os(&["m", "--list"]), vec![])
        );
    }

    #[test]
    fn a_trial_runs_when_it_matches_any_filter() {
        let trials: Vec<Trial> = [
            "seed_4ranks",
            "train_sgd_2ranks",
            "train_large_8ranks",
            "dataloader_4ranks",
            "control_rank_seeded_init_2ranks",
        ]
        .into_iter()
        .map(|name| Trial::test(name, || Ok(())))
        .collect();
        let kept = |command_line: &CommandLine| -> Vec<&str> {
            trials
                .iter()
                .filter(|t| command_line.matches(t))
                .map(Trial::name)
                .collect()
        };

        let substring = CommandLine::parse_from([
            "multirank",
            "seed",
            "--skip",
            "train_large",
            "train",
            "--list",
            "--format",
            "terse",
        ]);
        assert!(substring.arguments.list);
        assert_eq!(substring.arguments.skip, ["train_large"]);
        assert_eq!(substring.arguments.filter, None);
        assert_eq!(substring.filters, ["seed", "train"]);
        // `--skip` is libtest-mimic's to apply; the filters keep any trial matching one.
        assert_eq!(
            kept(&substring),
            [
                "seed_4ranks",
                "train_sgd_2ranks",
                "train_large_8ranks",
                "control_rank_seeded_init_2ranks"
            ]
        );

        let exact = CommandLine::parse_from(["multirank", "seed_4ranks", "train", "--exact"]);
        assert!(exact.arguments.exact);
        assert_eq!(kept(&exact), ["seed_4ranks"]);

        let none = CommandLine::parse_from(["multirank", "--include-ignored"]);
        assert_eq!(kept(&none).len(), trials.len());
        // A filter set in `arguments` counts as one more.
        let mut one = none.clone();
        one.arguments.filter = Some("dataloader".to_owned());
        one.filters = vec!["seed_4".to_owned()];
        assert_eq!(kept(&one), ["seed_4ranks", "dataloader_4ranks"]);
    }

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
