//! The `detcheck` command line: [`run`] parses the arguments and runs a command.
//!
//! `detcheck check [SCENARIO...]` runs each scenario's checks and prints one row per scenario,
//! then the details of every failure: on thread ranks, or, started by `mpirun` from a build with
//! the `mpi` feature, on MPI ranks (process 0 prints; the others follow it). `detcheck env` prints
//! the settings that pin reductions on each stack. `detcheck run --dump`, `compare` and `curves`
//! (in `commands.rs`) write, compare and plot dumps. This is the only part of detcheck that knows
//! the terminal (progress bar, table) and exit codes; it sees the rest of the library through
//! its public API only (`detcheck::` paths, never `crate::<layer>`: `tests/tidy.rs`), as a
//! program of the user's would. Its callers are the cargo binary and the Python wheel.
//!
//! Exit codes: `exit.rs` holds their table (`exit::TABLE`, printed by `detcheck --help`; the
//! README's copy is checked against it by `tests/cli.rs`) and the one mapping from errors to codes.

/// `println!` that stops quietly when stdout is closed (`detcheck check | head`), instead of
/// panicking: the exit code still tells the outcome.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod commands;
mod exit;
mod html;
mod one_liner;
mod report;

use clap::{Parser, Subcommand};
use detcheck::check::Unperturbed;
use detcheck::comm::pin_settings_for;
use detcheck::compare::curves::Tolerance;
use detcheck::file::DumpMode;
use detcheck::launch::shell_quote;
use detcheck::launch::{Capture, InsideRequest};
use detcheck::scenario::{CheckKind, Program, RunPlan, ScenarioError};
use detcheck::{discover_scenarios, CheckOptions, KindRegistry, LoadedScenario, Session};
use exit::{CliError, Exit};
use indicatif::{ProgressBar, ProgressStyle};
use report::{Outcome, ScenarioResult};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest `--deadline`: a week. A deadline is added to the clock, which a larger number
/// would overflow.
const MAX_DEADLINE_SECS: u64 = detcheck::comm::MAX_DEADLINE.as_secs();

#[derive(Parser)]
#[command(
    name = "detcheck",
    version,
    about = "A multi-rank determinism checker",
    after_help = exit::short_help(),
    after_long_help = exit::long_help()
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `detcheck check`'s arguments.
#[derive(clap::Args)]
struct CheckArgs {
    /// Scenario files or folders of them (default: `scenarios`).
    scenarios: Vec<PathBuf>,
    /// Longest wait in one collective, in seconds (at most a week).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=MAX_DEADLINE_SECS))]
    deadline: u64,
    /// Do not draw a progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Also run scenarios marked `"ignored": true` (slow ones), as cargo test does.
    #[arg(long)]
    include_ignored: bool,
    /// Write a divergence map (PNG) and a report page (HTML) of each failed check into this
    /// folder.
    #[arg(long, value_name = "DIR")]
    report_dir: Option<PathBuf>,
    /// What to print: the table (text), or one JSON object per scenario and a summary
    /// (json: JSON lines, with a "format_version").
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Also write a JUnit XML report (one testcase per scenario) to this file.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Report the first divergence without diagnosing it: no re-runs for its element and
    /// operator (faster when only the verdict matters).
    #[arg(long)]
    no_diagnosis: bool,
    /// Skip `repeat`'s two unperturbed runs of a program (runs that read nothing during
    /// their steps, compared by their end states): faster, but a divergence that recording
    /// hides (one that depends on timing) goes unseen.
    #[arg(long, conflicts_with = "unperturbed")]
    no_unperturbed: bool,
    /// Make `repeat`'s two unperturbed runs even of a program whose recorded run shows that
    /// recording cannot change what it computes (each rank one process on the CPU with no
    /// thread or process of its own, ranks joined by gloo), which otherwise makes none.
    #[arg(long)]
    unperturbed: bool,
    #[command(flatten)]
    program: ProgramFlags,
}

/// `detcheck run`'s arguments.
#[derive(clap::Args)]
struct RunArgs {
    /// The scenario file (or a program after `--`).
    scenario: Option<PathBuf>,
    /// The folder to write the dump to (must not hold a dump yet).
    #[arg(long, value_name = "DIR")]
    dump: PathBuf,
    /// What each record holds: md5, stats (md5 + statistics) or full (+ tensors).
    #[arg(long, default_value = "stats")]
    mode: DumpMode,
    /// Perturb the run as run 1 or 2 of `check` does (seeded delays and arrival orders).
    #[arg(long, value_name = "RUN", value_parser = clap::value_parser!(u64).range(1..))]
    perturb: Option<u64>,
    /// Longest wait in one collective, in seconds (at most a week).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=MAX_DEADLINE_SECS))]
    deadline: u64,
    /// Data-loader worker threads per rank (default: the scenario's own).
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Stop before this step instead of the scenario's `steps`.
    #[arg(long, value_name = "STEP", value_parser = clap::value_parser!(u64).range(1..))]
    stop_at: Option<u64>,
    /// Save a checkpoint of every rank into this folder after the last step.
    #[arg(long, value_name = "DIR")]
    checkpoint: Option<PathBuf>,
    /// Resume from the newest checkpoint every rank has in this folder.
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    /// With a program: dump, instead of its records, the operators inside the module of
    /// this record (`fwd/<module>`, as `compare --align` names a culprit): the module's
    /// inputs, every operator's inputs and outputs, and its outputs, in full
    /// (docs/align.md, "Inside the culprit").
    #[arg(long, value_name = "RECORD")]
    inside: Option<String>,
    /// The step of the `--inside` record (default 0).
    #[arg(long, value_name = "STEP", requires = "inside")]
    inside_step: Option<u64>,
    /// The rank of the `--inside` record (default 0).
    #[arg(long, value_name = "RANK", requires = "inside")]
    inside_rank: Option<u32>,
    /// Which call of the module in that step (default 0: the first).
    #[arg(long, value_name = "K", requires = "inside")]
    inside_occurrence: Option<u32>,
    /// With `--inside`: run the module on the inputs held by another run's `--inside` dump
    /// (the reference's), so that each difference inside it is this run's own.
    #[arg(long, value_name = "DIR", requires = "inside")]
    replay: Option<PathBuf>,
    #[command(flatten)]
    program: ProgramFlags,
}

#[derive(Subcommand)]
enum Command {
    /// Run each scenario's checks and print one row per scenario.
    Check(CheckArgs),
    /// Run one scenario once and dump its trace: one file per rank; or a program, with `--`
    /// (`detcheck run --dump DIR -- python train.py`), to compare with another run of it later.
    Run(RunArgs),
    /// Compare two dumps (detcheck traces or msprobe dump folders): the first divergence and a
    /// table of differing tensors.
    Compare {
        /// The first dump folder (A).
        a: PathBuf,
        /// The second dump folder (B, the reference for relative errors).
        b: PathBuf,
        /// Rows of the table of differing tensors (0: all).
        #[arg(long, default_value_t = 50)]
        max_rows: usize,
        /// Write a ranks x steps divergence map to this PNG file.
        #[arg(long, value_name = "FILE.png")]
        map: Option<PathBuf>,
        /// What to print: the text, or one JSON object (the comparison, its text and the
        /// verdict; `detcheck.compare` in Python reads it).
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Precision alignment: measure every record against B (msprobe's metrics), give each a
        /// verdict beyond rounding, and name the first record whose error is its own
        /// (docs/align.md). For runs on different devices, dtypes or library versions.
        #[arg(long)]
        align: bool,
        /// With --align: units of the dtype's roundoff, at a record's own magnitude, that are
        /// rounding.
        #[arg(long, default_value_t = 16.0, requires = "align", value_name = "F")]
        rounding_units: f64,
        /// With --align: how many times the relative error of the records before it a record's
        /// error may be.
        #[arg(long, default_value_t = 10.0, requires = "align", value_name = "G")]
        growth: f64,
        /// With --align: how many times its allowance a record's error may be and still be a
        /// warning, not an error.
        #[arg(long, default_value_t = 10.0, requires = "align", value_name = "X")]
        error_excess: f64,
        /// With --align: the precision the runs compute in, whose roundoff every floating
        /// record is allowed at least (bf16 for a bf16 autocast run whose records are f32);
        /// default: each record's own dtypes (give tf32 for a CUDA run with TF32 products).
        #[arg(long, requires = "align", value_name = "DTYPE")]
        precision: Option<String>,
        /// With --align: also write an HTML page (the error of each record along the program
        /// order, one line per step; the records not aligned) to this file.
        #[arg(long, requires = "align", value_name = "FILE.html")]
        html: Option<PathBuf>,
        /// With --align: the loss curves to show beside the records, from these two files or
        /// folders (trainer_state.json or dumps; default: the dumps' own `loss` records, when
        /// both hold them).
        #[arg(long, num_args = 2, requires = "align", value_names = ["A", "B"])]
        curves: Vec<PathBuf>,
        /// With --align --format json: list every record's metrics and verdict in
        /// `alignment.records`, aligned or not (to check them against msprobe's compare).
        #[arg(long, requires = "align")]
        every_record: bool,
    },
    /// Compare a scalar per step (loss) of two runs: dumps or trainer_state.json files.
    Curves {
        /// The first run: a dump folder or a trainer_state.json.
        a: PathBuf,
        /// The second run (the reference of rtol).
        b: PathBuf,
        /// The scalar's name.
        #[arg(long, default_value = "loss")]
        name: String,
        /// Absolute tolerance.
        #[arg(long, default_value_t = 1e-3)]
        atol: f64,
        /// Relative tolerance.
        #[arg(long, default_value_t = 1e-3)]
        rtol: f64,
        /// Write the plot to STEM.png and STEM.svg.
        #[arg(long, value_name = "STEM", default_value = "curves")]
        plot: PathBuf,
        /// Do not write the plot.
        #[arg(long)]
        no_plot: bool,
    },
    /// Print the environment settings that pin reductions on each stack (seed_all for the
    /// environment), with what each pins and where this process's value comes from.
    Env {
        /// Only these stacks: openmpi, mpich, intel-mpi, nccl, hccl, cuda, python, or mpi for the
        /// three MPI stacks (repeatable; default: all).
        #[arg(long = "stack")]
        stacks: Vec<String>,
        /// Print `export NAME=VALUE` lines for a shell to eval instead of the table.
        #[arg(long)]
        export: bool,
        /// Lint this environment instead (under mpirun: every rank's): variables that do not
        /// exist, settings left unpinned or set otherwise, uncontrollable algorithms, ranks
        /// whose settings differ. Exit 1 when a problem is found.
        #[arg(long, conflicts_with = "export")]
        check: bool,
    },
}

/// What `detcheck check` prints on standard output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// One row per scenario, then the details of every failure.
    Text,
    /// One JSON object per line: one per scenario as it ends, then a summary.
    Json,
}

/// `detcheck check [FLAGS] -- PROGRAM [ARGS...]`: a `command` scenario made from flags, with no
/// file (`one_liner.rs`).
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "A program without a scenario file (after --)")]
struct ProgramFlags {
    /// With a program after `--`: how many ranks to launch it as (default 1).
    #[arg(
        long,
        value_name = "N",
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    ranks: Option<u64>,
    /// With a program: the steps it is told to run (`DETCHECK_STEPS`, default 3); a Python
    /// program recorded without a change is ended after that many optimizer steps.
    #[arg(
        long,
        value_name = "S",
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    steps: Option<u64>,
    /// With a program: the seed it is told (`DETCHECK_SEED`, default 0).
    #[arg(
        long,
        value_name = "X",
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    seed: Option<u64>,
    /// With a program: how its ranks are started: processes (default; srun inside a Slurm
    /// allocation), torchrun, msrun (MindSpore), mpirun, srun or none.
    #[arg(
        long,
        value_name = "LAUNCHER",
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    launcher: Option<String>,
    /// With a program and the srun launcher: options given to srun before the program, as one
    /// string (split at spaces; quotes group), e.g. "--partition=gpu --gpus-per-task=1".
    #[arg(
        long,
        value_name = "OPTIONS",
        requires = "program",
        allow_hyphen_values = true,
        help_heading = "A program without a scenario file (after --)"
    )]
    srun_args: Option<String>,
    /// With a program: the checks to run, comma-separated (default: repeat, and replicas where
    /// records are replicated).
    #[arg(
        long,
        value_name = "CHECKS",
        value_delimiter = ',',
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    checks: Vec<String>,
    /// With a program: identical (default), or diverges for a negative control.
    #[arg(
        long,
        value_name = "EXPECT",
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    expect: Option<String>,
    /// With a program: the world sizes of the world_sizes check, comma-separated.
    #[arg(
        long,
        value_name = "SIZES",
        value_delimiter = ',',
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    world_sizes: Vec<u64>,
    /// With a program: the batch sizes of the batch_sizes check, comma-separated (`1,8`): the
    /// program runs once at each (`{batch}` in its arguments takes each in turn, the first in
    /// every other check's runs), and each sample's records are compared with the first size's.
    /// Without --checks the check is batch_sizes alone; with --checks, list batch_sizes there.
    #[arg(
        long,
        value_name = "SIZES",
        value_delimiter = ',',
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    batch_sizes: Vec<u64>,
    /// With a program: the longest a launch may take, in seconds (default 300).
    #[arg(
        long,
        value_name = "SECS",
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    timeout: Option<u64>,
    /// With a program: the scenario's name (default: the script's file name without extension).
    #[arg(
        long,
        value_name = "NAME",
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    name: Option<String>,
    /// With a program: also write the scenario it ran to this file (for CI: `detcheck check
    /// FILE` runs it again).
    #[arg(
        long,
        value_name = "FILE",
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    save_scenario: Option<PathBuf>,
    /// With a program: launch it with the settings that make a PyTorch program reproducible
    /// (a fixed PYTHONHASHSEED, CUBLAS_WORKSPACE_CONFIG, seeds, deterministic algorithms), to
    /// see whether they fix a divergence; the report lists them.
    #[arg(
        long,
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    deterministic: bool,
    /// With a program recorded without a change: let it run to its end instead of ending it
    /// after --steps optimizer steps.
    #[arg(
        long,
        requires = "program",
        help_heading = "A program without a scenario file (after --)"
    )]
    run_to_end: bool,
    /// The program and its arguments, after `--` (`-- python train.py --lr 0.1`).
    #[arg(last = true, value_name = "PROGRAM")]
    program: Vec<std::ffi::OsString>,
}

/// Where `detcheck check` reports, besides standard output.
struct Reports<'a> {
    format: Format,
    junit: Option<&'a Path>,
    report_dir: Option<&'a Path>,
}

/// Runs the `detcheck` command line on `args` (the program's name first, as
/// `std::env::args_os` gives them) and returns its exit code (the table of `exit.rs`, printed
/// by `detcheck --help`).
///
/// The cargo binary (`src/bin/detcheck/main.rs`) and the Python wheel's `detcheck` command
/// (`python -m detcheck`, `detcheck._detcheck.cli`) both call this: one implementation.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return exit::command_line(&e).code();
        }
    };
    let code = match cli.command {
        Command::Check(args) => check_command(args),
        Command::Run(args) => run_command(args),
        Command::Compare {
            a,
            b,
            max_rows,
            format,
            align: true,
            rounding_units,
            growth,
            error_excess,
            precision,
            html,
            curves,
            every_record,
            ..
        } => exit::report(commands::align(
            &a,
            &b,
            &detcheck::compare::align::AlignOptions {
                rounding_units,
                growth,
                error_excess,
                max_rows,
                precision,
                every_record,
            },
            html.as_deref(),
            &curves,
            format == Format::Json,
        ))
        .code(),
        Command::Compare {
            a,
            b,
            max_rows,
            map,
            format,
            ..
        } => exit::report(commands::compare(
            &a,
            &b,
            max_rows,
            map.as_deref(),
            format == Format::Json,
        ))
        .code(),
        Command::Curves {
            a,
            b,
            name,
            atol,
            rtol,
            plot,
            no_plot,
        } => {
            let plot = (!no_plot).then_some(plot.as_path());
            exit::report(commands::curves(
                &a,
                &b,
                &name,
                Tolerance { atol, rtol },
                plot,
            ))
            .code()
        }
        Command::Env {
            stacks,
            check: true,
            ..
        } => env_check(&stacks),
        Command::Env { stacks, export, .. } => exit::report(env(&stacks, export)).code(),
    };
    // The private copies of working directories kept from launch to launch.
    detcheck::run::remove_kept_workdirs();
    code
}

/// `detcheck check`: the leader checks the scenarios, every
/// other MPI process follows it; the exit code.
fn check_command(args: CheckArgs) -> u8 {
    let CheckArgs {
        scenarios,
        deadline,
        no_progress,
        include_ignored,
        report_dir,
        format,
        junit,
        no_diagnosis,
        no_unperturbed,
        unperturbed,
        program,
    } = args;
    let options = CheckOptions {
        deadline: Duration::from_secs(deadline),
        element_detail: !no_diagnosis,
        unperturbed: match (no_unperturbed, unperturbed) {
            (true, _) => Unperturbed::Never,
            (false, true) => Unperturbed::Always,
            (false, false) => Unperturbed::UnlessSynchronous,
        },
        ..CheckOptions::default()
    };
    let session = match Session::from_env() {
        Ok(session) => session,
        Err(e) => return exit::report(Err(e.into())).code(),
    };
    // Every process ends through `finish`, whatever the outcome: MPI must be finalized.
    let code = if session.is_leader() {
        // Under mpirun every process has a pty: no progress bar there.
        let progress = !no_progress && session.num_processes().is_none();
        let reports = Reports {
            format,
            junit: junit.as_deref(),
            report_dir: report_dir.as_deref(),
        };
        let loaded = if program.program.is_empty() {
            load_checked(&scenarios)
        } else if scenarios.is_empty() {
            one_liner::scenario(&program)
        } else {
            Err(CliError::Invalid(format!(
                "-- {}: give scenario files or a program after `--`, not both ({} given)",
                one_liner::shown(&program.program),
                show_paths(&scenarios)
            )))
        };
        exit::report(loaded.and_then(|loaded| {
            check(
                &session,
                loaded,
                &options,
                progress,
                include_ignored,
                &reports,
            )
        }))
        .code()
    } else {
        session.follow(&KindRegistry::builtin())
    };
    session.finish(code)
}

/// `detcheck run`: one run of a scenario or a program, dumped;
/// the exit code.
fn run_command(args: RunArgs) -> u8 {
    let RunArgs {
        scenario,
        dump,
        mode,
        perturb,
        deadline,
        workers,
        stop_at,
        checkpoint,
        resume,
        inside,
        inside_step,
        inside_rank,
        inside_occurrence,
        replay,
        program,
    } = args;
    let options = CheckOptions {
        deadline: Duration::from_secs(deadline),
        ..CheckOptions::default()
    };
    let scenario = match load_to_run(scenario, &program) {
        Ok(scenario) => scenario,
        Err(e) => return exit::report(Err(e)).code(),
    };
    let perturb = perturb.map(|p| p as usize);
    let plan = RunPlan {
        loader_workers: workers,
        stop_at,
        checkpoint_to: checkpoint,
        resume_from: resume,
        ..RunPlan::default()
    };
    if let Some(name) = inside {
        let capture = Capture {
            rank: inside_rank.unwrap_or(0),
            step: inside_step.unwrap_or(0),
            name,
            occurrence: inside_occurrence.unwrap_or(0),
        };
        let inside = InsideRequest {
            replay_from: replay,
        };
        return exit::report(commands::run_inside(
            scenario, &dump, &capture, &inside, perturb, &options, &plan,
        ))
        .code();
    }
    exit::report(commands::run(
        scenario, &dump, mode, perturb, &options, &plan,
    ))
    .code()
}

/// The scenario `detcheck run` runs: the scenario file, or the program after `--`, not both.
fn load_to_run(
    scenario: Option<PathBuf>,
    program: &ProgramFlags,
) -> Result<LoadedScenario, CliError> {
    match (scenario, program.program.is_empty()) {
        (Some(path), true) => KindRegistry::builtin()
            .load_file(&path)
            .map_err(CliError::from),
        (None, false) => one_liner::scenario_to_run(program),
        (Some(path), false) => Err(CliError::Invalid(format!(
            "-- {}: give a scenario file or a program after `--`, not both ({} given)",
            one_liner::shown(&program.program),
            path.display()
        ))),
        (None, true) => Err(CliError::Invalid(
            "run: give a scenario file, or a program after `--` (`detcheck run --dump \
             DIR -- python train.py`)"
                .to_owned(),
        )),
    }
}

/// `detcheck env --check`: the lint of this environment (under mpirun, of every rank's, with the
/// ranks whose settings differ named). Every MPI process takes part; the leader prints.
fn env_check(stacks: &[String]) -> u8 {
    let session = match Session::from_env() {
        Ok(session) => session,
        Err(e) => return exit::report(Err(e.into())).code(),
    };
    let mine = serde_json::to_string(&detcheck::comm::relevant_environment()).unwrap_or_default();
    let gathered = session.gather(mine);
    let exit = if session.is_leader() {
        exit::report(lint_ranks(stacks, &gathered))
    } else {
        Exit::Ok
    };
    session.finish(exit.code())
}

/// Prints the findings of every rank's environment (`ranks[r]`, JSON) and the variables whose
/// values differ between ranks.
fn lint_ranks(stacks: &[String], ranks: &[String]) -> Result<Exit, CliError> {
    let environments: Vec<std::collections::BTreeMap<String, String>> = ranks
        .iter()
        .map(|r| serde_json::from_str(r).unwrap_or_default())
        .collect();
    let Some(first) = environments.first() else {
        return Ok(Exit::Ok);
    };
    let unknown = |unknown: String| {
        CliError::Invalid(format!(
            "--stack {unknown}: unknown stack; known: openmpi, mpich, intel-mpi, nccl, hccl, \
             cuda, python, mpi"
        ))
    };
    let mut problems = 0;
    // Rank 0's findings stand for every rank's; ranks that differ are listed after.
    for finding in detcheck::comm::lint_environment(first, stacks).map_err(unknown)? {
        out!("{finding}");
        problems += 1;
    }
    for (variable, values) in detcheck::comm::differing_ranks(&environments) {
        let shown: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(rank, v)| format!("rank {rank}: {}", v.as_deref().unwrap_or("(unset)")))
            .collect();
        out!("{variable} differs between ranks: {}", shown.join(", "));
        problems += 1;
    }
    if problems == 0 {
        out!(
            "no problem found in the environment of {} rank(s)",
            environments.len()
        );
        Ok(Exit::Ok)
    } else {
        out!("{problems} problem(s) found");
        Ok(Exit::CheckFailed)
    }
}

/// `detcheck env`: the table, or `export` lines.
fn env(stacks: &[String], export: bool) -> Result<Exit, CliError> {
    let settings = pin_settings_for(stacks).map_err(|unknown| {
        CliError::Invalid(format!(
            "--stack {unknown}: unknown stack; known: openmpi, mpich, intel-mpi, nccl, hccl, \
             cuda, python, mpi"
        ))
    })?;
    if export {
        for s in settings {
            out!("export {}={}", s.name, shell_quote(s.value));
        }
        return Ok(Exit::Ok);
    }
    for s in settings {
        let source = match s.current() {
            None => "not set here: detcheck's value".to_owned(),
            Some(v) if v == s.value => "set here to this value".to_owned(),
            Some(v) => format!("set here to `{v}`, which differs"),
        };
        out!("{:<10} {}={}", s.stack, s.name, s.value);
        out!("{:<10}   pins: {}", "", s.why);
        out!(
            "{:<10}   source: {}; documented in {}",
            "",
            source,
            s.reference
        );
    }
    Ok(Exit::Ok)
}

/// The error of scenario paths that could not be loaded; when the first names nothing that
/// exists and is no `.json` file (`detcheck check python train.py`), the user meant a program:
/// the message says to put `--` before it.
fn program_without_separator(paths: &[PathBuf], errors: Vec<ScenarioError>) -> CliError {
    let program = paths
        .first()
        .is_some_and(|p| !p.exists() && p.extension().is_none_or(|e| e != "json"));
    if !program {
        return CliError::Scenarios(errors);
    }
    let words: Vec<String> = paths
        .iter()
        .map(|p| shell_quote(&p.to_string_lossy()))
        .collect();
    CliError::Invalid(format!(
        "{}\nhint: `{}` is no scenario file or folder; to check a program, put `--` before \
         it: detcheck check [FLAGS] -- {}",
        CliError::Scenarios(errors),
        words[0],
        words.join(" ")
    ))
}

/// Loads every scenario named on the command line; any bad one is reported and stops the run.
fn load_all(paths: &[PathBuf]) -> Result<Vec<LoadedScenario>, Vec<ScenarioError>> {
    let registry = KindRegistry::builtin();
    let default = [PathBuf::from("scenarios")];
    let paths = if paths.is_empty() {
        &default[..]
    } else {
        paths
    };
    let mut loaded = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        let found = if path.is_dir() {
            match discover_scenarios(path, &registry) {
                Ok(found) => found,
                Err(e) => vec![Err(e)],
            }
        } else {
            vec![registry.load_file(path)]
        };
        for result in found {
            match result {
                Ok(scenario) => loaded.push(scenario),
                Err(e) => errors.push(e),
            }
        }
    }
    if errors.is_empty() {
        Ok(loaded)
    } else {
        Err(errors)
    }
}

/// The scenarios of `paths` (every file of every folder; `scenarios/` when none), at least one.
fn load_checked(paths: &[PathBuf]) -> Result<Vec<LoadedScenario>, CliError> {
    let scenarios = load_all(paths).map_err(|errors| program_without_separator(paths, errors))?;
    if scenarios.is_empty() {
        return Err(CliError::Invalid(format!(
            "no scenario files found in {}",
            show_paths(paths)
        )));
    }
    Ok(scenarios)
}

fn check(
    session: &Session,
    scenarios: Vec<LoadedScenario>,
    options: &CheckOptions,
    progress: bool,
    include_ignored: bool,
    reports: &Reports<'_>,
) -> Result<Exit, CliError> {
    let json = reports.format == Format::Json;

    let bar = progress_bar(progress, scenarios.len());
    let width = scenarios
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(8)
        .max(8);
    let mut rows = vec![table_row(
        width,
        [
            "scenario",
            "ranks",
            "steps",
            "reduction",
            "checks",
            "records",
            "verdict",
            "first divergence",
        ],
    )];
    let mut results: Vec<ScenarioResult<'_>> = Vec::new();
    // The exit of the whole check: the worst of its scenarios' exits.
    let mut worst = Exit::Ok;
    if let Some(processes) = session.num_processes() {
        if !json {
            out!("detcheck check on {}\n", session.describe());
        }
        if scenarios
            .iter()
            .all(|s| detcheck::check::mpi_skip_reason(s, processes).is_some())
        {
            return Err(CliError::Invalid(format!(
                "every scenario needs more than the {processes} processes mpirun started"
            )));
        }
    }
    for scenario in &scenarios {
        bar.set_message(scenario.name.clone());
        let (row, mut result) = check_scenario(
            session,
            scenario,
            options,
            include_ignored,
            reports.report_dir,
            width,
        );
        rows.push(row);
        if let Program::Command(command) = &scenario.program {
            if command.deterministic {
                add_deterministic_settings(&mut result);
            }
        }
        worst = worst.max(result.exit());
        if json {
            bar.suspend(|| out!("{}", report::scenario_line(&result)));
        }
        results.push(result);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if json {
        out!(
            "{}",
            report::summary_line(&results, &session.describe(), worst)
        );
    } else {
        print_table(&rows, &results, scenarios.len());
    }
    if let Some(path) = reports.junit {
        write_junit(path, &results)?;
    }
    Ok(worst)
}

/// The progress bar of `check`, over `len` scenarios: hidden when `progress` is false.
fn progress_bar(progress: bool, len: usize) -> ProgressBar {
    let bar = if progress {
        ProgressBar::new(len as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// A row of `check`'s table from its eight cells, the scenario's name padded to `width`.
fn table_row(width: usize, cells: [&str; 8]) -> String {
    let [name, ranks, steps, mode, checks, records, verdict, first] = cells;
    format!(
        "{name:<width$}  {ranks:>5}  {steps:>5}  {mode:<13}  {checks:<36}  {records:>8}  \
         {verdict:<16}  {first}"
    )
}

/// Checks one scenario (or ignores or skips it): its row of the table (names padded to
/// `width`) and its result, with the detail printed below the table and the report files
/// written into `report_dir`.
fn check_scenario<'s>(
    session: &Session,
    scenario: &'s LoadedScenario,
    options: &CheckOptions,
    include_ignored: bool,
    report_dir: Option<&Path>,
    width: usize,
) -> (String, ScenarioResult<'s>) {
    let spec = &scenario.spec;
    // Only reported (JUnit `time`), never on a deterministic path.
    let started = Instant::now();
    let outcome = if spec.ignored && !include_ignored {
        Outcome::Ignored
    } else if let Some(reason) = session.skip_reason(scenario) {
        Outcome::Skipped(reason)
    } else {
        match session.run_checks(scenario, options) {
            Ok(report) => Outcome::Ran(Box::new(report)),
            Err(e) => {
                let e = CliError::from(e);
                Outcome::Errored {
                    message: e.to_string(),
                    exit: e.exit(),
                }
            }
        }
    };
    let ran = match &outcome {
        Outcome::Ran(report) => Some(&**report),
        _ => None,
    };
    let mut result = ScenarioResult {
        scenario,
        reduction: report::reduction_label(scenario, ran),
        outcome,
        elapsed: started.elapsed(),
        detail: None,
        files: Vec::new(),
    };
    let (ranks, steps) = (spec.world_size.to_string(), spec.steps.to_string());
    // The checks column, the same form for every row: the checks that ran, then those
    // n/a. A row without a report knows one n/a beforehand: `replicas` at one rank.
    let listed = checks_column(
        scenario
            .checks
            .iter()
            .map(|&k| (k, k == CheckKind::Replicas && spec.world_size < 2)),
    );
    let scenario_row = |ranks: &str, checks: &str, records: &str, verdict: &str, first: &str| {
        table_row(
            width,
            [
                &scenario.name,
                ranks,
                &steps,
                &result.reduction,
                checks,
                records,
                verdict,
                first,
            ],
        )
    };
    let verdict = result.verdict();
    let row = match &result.outcome {
        Outcome::Ignored => scenario_row(&ranks, &listed, "-", verdict, "-"),
        Outcome::Skipped(reason) => scenario_row(&ranks, &listed, "-", verdict, reason),
        Outcome::Ran(report) => {
            let first = report
                .first_divergence()
                .map(|(check, d)| {
                    let step = check.step_word();
                    format!("{check}: {step} {} rank {} `{}`", d.step, d.rank, d.name)
                })
                .unwrap_or_else(|| "-".to_owned());
            let records = report.num_compared().to_string();
            // Checks that could not apply are listed as such, never as passes.
            let ran = checks_column(
                report
                    .outcomes
                    .iter()
                    .map(|o| (o.kind, o.skipped.is_some())),
            );
            // The ranks the runs had (a program may start more than were launched).
            let ranks = report.world_size.to_string();
            let row = scenario_row(&ranks, &ran, &records, verdict, &first);
            let written = commands::write_reports(scenario, report, report_dir);
            result.detail = ran_detail(scenario, report, &written.lines);
            result.files = written.files;
            row
        }
        Outcome::Errored { message, .. } => {
            result.detail = Some(format!("{}:\n  {message}\n", scenario.name));
            scenario_row(&ranks, &listed, "-", verdict, "-")
        }
    };
    (row, result)
}

/// The detail printed below the table of a scenario whose checks ran (`written`: the lines of
/// its report files): its failures, what a control caught, why a check compared nothing, or its
/// first overflow; `None` when there is nothing to say.
fn ran_detail(
    scenario: &LoadedScenario,
    report: &detcheck::check::ScenarioReport,
    written: &[String],
) -> Option<String> {
    if !report.passed() {
        let mut detail = format!("{}:\n{}", scenario.name, report.explain_failures());
        for line in written {
            detail.push_str(line);
            detail.push('\n');
        }
        Some(detail)
    } else if scenario.spec.expect == detcheck::scenario::Expectation::Diverges {
        // What the control caught, down to the element.
        let mut detail = format!("{}:\n{}", scenario.name, report.explain_caught());
        for line in written {
            detail.push_str(line);
            detail.push('\n');
        }
        Some(detail)
    } else if report.outcomes.iter().any(|o| o.empty) {
        // A check that ran and compared nothing says why, on a passing scenario too.
        let mut detail = format!("{}:\n", scenario.name);
        for o in report.outcomes.iter().filter(|o| o.empty) {
            detail.push_str(&o.not_applicable_line().unwrap_or_default());
        }
        detail.extend(written.iter().map(|l| format!("{l}\n")));
        Some(detail)
    } else if report.overflow.is_some() {
        Some(format!("{}:\n{}\n", scenario.name, written.join("\n")))
    } else {
        None
    }
}

/// Adds to the detail of a `command` scenario run with `--deterministic` what the settings
/// found and the settings themselves.
fn add_deterministic_settings(result: &mut ScenarioResult<'_>) {
    let mut detail = result
        .detail
        .take()
        .unwrap_or_else(|| format!("{}:\n", result.scenario.name));
    let mut frameworks: &[String] = &[];
    if let Outcome::Ran(ran) = &result.outcome {
        if let Some(finding) = &ran.deterministic {
            detail.push_str(&format!("  --deterministic: {}\n", finding.summary));
        }
        frameworks = &ran.frameworks;
    }
    // The settings of the frameworks the program imported (all when unknown).
    detail.push_str(&report::deterministic_settings(
        result.scenario.spec.seed,
        frameworks,
    ));
    result.detail = Some(detail);
}

/// Prints `check`'s table (`rows`), the details of its scenarios' `results` and the count of
/// each status, of `total` scenarios.
fn print_table(rows: &[String], results: &[ScenarioResult<'_>], total: usize) {
    for row in rows {
        out!("{row}");
    }
    for detail in results.iter().filter_map(|r| r.detail.as_ref()) {
        out!("\n{detail}");
    }
    let count = |status: &str| results.iter().filter(|r| r.status() == status).count();
    let (failed, errored, ignored, skipped) = (
        count("failed"),
        count("errored"),
        count("ignored"),
        count("skipped"),
    );
    let passed = count("passed");
    let skipped_note = if skipped > 0 {
        format!(", {skipped} skipped (under MPI: more ranks than processes, or a command)")
    } else {
        String::new()
    };
    out!(
        "\n{}: {passed} passed, {failed} failed, {errored} errored, {ignored} \
         ignored{skipped_note}",
        report::counted(total as u64, "scenario")
    );
}

/// Writes the JUnit XML of `results` to `path` atomically (its folder created if missing).
fn write_junit(path: &Path, results: &[ScenarioResult<'_>]) -> Result<(), CliError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| {
            CliError::Invalid(format!(
                "--junit {}: cannot create its folder: {e}",
                path.display()
            ))
        })?;
    }
    detcheck::file::write_atomically(path, report::junit_xml(results).as_bytes())?;
    Ok(())
}

/// The checks column of a row: the checks that ran joined by `+`, then each n/a one as
/// ` (replicas n/a)`, from (check, n/a) pairs.
fn checks_column(checks: impl Iterator<Item = (CheckKind, bool)>) -> String {
    let (na, ran): (Vec<_>, Vec<_>) = checks.partition(|&(_, na)| na);
    let mut text = ran
        .iter()
        .map(|(k, _)| k.to_string())
        .collect::<Vec<_>>()
        .join("+");
    for (k, _) in na {
        text.push_str(&format!(" ({k} n/a)"));
    }
    text
}

fn show_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return Path::new("scenarios").display().to_string();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
