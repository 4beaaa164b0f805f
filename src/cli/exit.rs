//! detcheck's exit codes, written once: [`TABLE`] says what each code means, and [`CliError::exit`]
//! decides which code every error a command meets ends with.
//!
//! `detcheck --help` prints [`TABLE`] ([`long_help`]); the README's table of exit codes is a copy
//! that `tests/cli.rs` checks against that output, row by row. Commands return
//! `Result<Exit, CliError>`: `Ok` when the command ran to its end, with its verdict
//! ([`Exit::Ok`] or [`Exit::CheckFailed`]; `check`: the worst exit of its scenarios, a scenario
//! whose run failed counting as [`CliError::exit`] of its error), `Err` when it stopped, with the
//! error, which [`report`] prints once (`error: ...`) and turns into its code. No command picks a
//! code for an error itself.
//!
//! Invariant (one exit-code table): every command maps its errors to exit codes in one place, this
//! module; the README's table is checked against it.

use detcheck::check::SessionError;
use detcheck::checkpoint::CheckpointError;
use detcheck::compare::align::AlignError;
use detcheck::compare::curves::CurveError;
use detcheck::file::DumpError;
use detcheck::run::{DumpRunError, RunError};
use detcheck::scenario::ScenarioError;

/// How `detcheck` ends. The discriminant is the exit code; the order is severity, so the exit of
/// several outcomes is their [`Ord::max`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Exit {
    /// Every check holds; `compare`: identical; `curves`: allclose.
    Ok = 0,
    /// A check failed; `compare`: the dumps differ (`--align`: a record beyond its allowance);
    /// `curves`: beyond tolerance.
    CheckFailed = 1,
    /// A flag, scenario, dump or checkpoint that cannot be used; wrong MPI usage.
    BadInput = 2,
    /// A run failed: a rank errored, panicked or missed a collective deadline.
    RunFailed = 3,
    /// A scenario runs on a GPU and this machine or build has none it can use.
    NoDevice = 4,
}

/// Every exit code and what it means, in code order: the one table, printed by `detcheck --help`
/// and copied into the README (a test compares the two). One line of text per row, single spaces.
pub(crate) const TABLE: [(Exit, &str); 5] = [
    (
        Exit::Ok,
        "every check holds (negative controls caught); `run`: the dump is written; `compare`: \
         identical; `compare --align`: every record aligned; `curves`: allclose over the whole run",
    ),
    (
        Exit::CheckFailed,
        "a check failed: a divergence where none was expected, or a negative control not caught, \
         or nothing was compared (every check of a scenario n/a: verdict `n/a`); `compare`: the dumps differ; `compare --align`: a record \
         beyond its allowance; `curves`: a step beyond tolerance or missing on one side",
    ),
    (
        Exit::BadInput,
        "bad input: a flag, or a scenario file or folder that cannot be read or is invalid (the \
         message names the file and the field), or that asks for more than a documented maximum \
         or a run larger than the memory available (the message names the field and gives the \
         estimate); a dump that is missing, truncated, corrupt, of \
         another format version, or mixes files of two dumps (the message names the file); `compare --align` \
         of dumps with different rank counts or no record in common; a \
         `run --dump` folder that already holds a dump; a `run --inside` record the program \
         never ran, or a `--replay` folder whose inputs the module cannot take (the message \
         says which); a `run --dump` or `--checkpoint` folder \
         that another run holds, or that a killed run left locked (the message names the folder \
         and the holder); an input file that is a FIFO, a device or a folder (the message names \
         the file); a `run --resume` checkpoint that is \
         missing, corrupt, of another version or written by another run (the message names the \
         file); wrong MPI usage (started by `mpirun` without the `mpi` feature, an `mpirun` of \
         another MPI than the one linked, no scenario small enough for the job, `run` under an \
         `mpirun` of several processes); a `command` \
         scenario whose program or launcher cannot be started (the message names the field; \
         the `msrun` launcher: no `msrun` on PATH, or a program's Python without MindSpore)",
    ),
    (
        Exit::RunFailed,
        "a run failed: a rank returned an error, panicked, or missed a collective deadline (the \
         message names the rank and the collective), or could not write its trace file; under \
         MPI also a job aborted because a rank never arrived; a `command` scenario's process \
         that exited non-zero, was killed or outlived its timeout, or wrote no or a broken trace \
         (the message names the rank, the exit status and the end of its stderr)",
    ),
    (
        Exit::NoDevice,
        "no GPU: a scenario runs on a GPU (`device: \"gpu\"`) and this detcheck was built \
         without the `nccl` feature, or a CUDA library is missing (the message names the \
         library, the names tried and how to get it), or the driver sees no device",
    ),
];

impl Exit {
    /// The process exit code.
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    /// [`Exit::Ok`] when what was checked holds, [`Exit::CheckFailed`] when not.
    pub(crate) fn verdict(holds: bool) -> Exit {
        if holds {
            Exit::Ok
        } else {
            Exit::CheckFailed
        }
    }

    /// A short name, for the one-line summary of `detcheck -h`.
    fn label(self) -> &'static str {
        match self {
            Exit::Ok => "ok",
            Exit::CheckFailed => "a check failed",
            Exit::BadInput => "bad input",
            Exit::RunFailed => "a run failed",
            Exit::NoDevice => "no GPU",
        }
    }
}

/// The one-line summary after `detcheck -h`.
pub(crate) fn short_help() -> String {
    let codes: Vec<String> = TABLE
        .iter()
        .map(|(exit, _)| format!("{} {}", exit.code(), exit.label()))
        .collect();
    format!(
        "Exit codes: {} (`--help` says what each means).",
        codes.join(", ")
    )
}

/// The column the meanings of [`long_help`] start at, and the width they are wrapped to.
const INDENT: usize = 5;
const WIDTH: usize = 100;

/// [`TABLE`] after `detcheck --help`: `Exit codes:`, then one row per code, `  N  meaning`, the
/// meaning wrapped at word boundaries onto lines indented by five spaces.
pub(crate) fn long_help() -> String {
    let mut text = String::from("Exit codes:");
    for (exit, meaning) in TABLE {
        let mut line = format!("  {:<2} ", exit.code());
        for word in meaning.split(' ') {
            if line.len() > INDENT && line.len() + 1 + word.len() > WIDTH {
                text.push('\n');
                text.push_str(line.trim_end());
                line = " ".repeat(INDENT);
            } else if line.len() > INDENT {
                line.push(' ');
            }
            line.push_str(word);
        }
        text.push('\n');
        text.push_str(&line);
    }
    text
}

/// Why a command could not do its work. Each variant's exit code is decided in [`CliError::exit`]
/// and nowhere else.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// An argument the CLI itself finds unusable (a flag out of range or that does not apply, no
    /// scenario found, no scenario fits the MPI job): the message says which.
    #[error("{0}")]
    Invalid(String),
    /// Scenario files or folders that cannot be read or are invalid, every one of them.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\nerror: "))]
    Scenarios(Vec<ScenarioError>),
    /// The process cannot run as it was started (MPI usage).
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A dump or picture that cannot be read or written.
    #[error(transparent)]
    Dump(#[from] DumpError),
    /// `run --dump` could not use its folder or its run failed.
    #[error(transparent)]
    DumpRun(#[from] DumpRunError),
    /// A curve that cannot be read.
    #[error(transparent)]
    Curve(#[from] CurveError),
    /// Two dumps that `compare --align` cannot pair.
    #[error(transparent)]
    Align(#[from] AlignError),
    /// The checkpoint of `run --resume` cannot be used.
    #[error("--resume: {0}")]
    Resume(#[from] CheckpointError),
    /// A scenario's checks could not be evaluated.
    #[error(transparent)]
    Run(#[from] RunError),
}

impl From<ScenarioError> for CliError {
    fn from(error: ScenarioError) -> Self {
        CliError::Scenarios(vec![error])
    }
}

impl CliError {
    /// The exit code this error ends `detcheck` with: the mapping of the table's rows 2 to 4.
    pub(crate) fn exit(&self) -> Exit {
        match self {
            CliError::Invalid(_)
            | CliError::Scenarios(_)
            | CliError::Session(_)
            | CliError::Dump(_)
            | CliError::Curve(_)
            | CliError::Align(_)
            | CliError::Resume(_) => Exit::BadInput,
            CliError::DumpRun(DumpRunError::Dump(_)) => Exit::BadInput,
            CliError::DumpRun(DumpRunError::Program(RunError::CannotLaunch { .. })) => {
                Exit::BadInput
            }
            CliError::DumpRun(DumpRunError::Program(RunError::NoDevice { .. }))
            | CliError::Run(RunError::NoDevice { .. }) => Exit::NoDevice,
            CliError::DumpRun(_) => Exit::RunFailed,
            CliError::Run(RunError::WorldTooLarge { .. } | RunError::CannotLaunch { .. }) => {
                Exit::BadInput
            }
            CliError::Run(_) => Exit::RunFailed,
        }
    }
}

/// The exit of a command line that clap did not turn into a command: `--help` and `--version`
/// (printed) end with [`Exit::Ok`], a rejected flag or argument is [`Exit::BadInput`].
pub(crate) fn command_line(error: &clap::Error) -> Exit {
    if error.use_stderr() {
        Exit::BadInput
    } else {
        Exit::Ok
    }
}

/// A command's outcome as an exit: a verdict as it is, an error printed to stderr (`error: ...`,
/// one line per cause) and mapped by [`CliError::exit`].
pub(crate) fn report(outcome: Result<Exit, CliError>) -> Exit {
    outcome.unwrap_or_else(|error| {
        eprintln!("error: {error}");
        error.exit()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_each_exit_once_in_code_order_on_one_line_each() {
        let codes: Vec<u8> = TABLE.iter().map(|(exit, _)| exit.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4]);
        for (exit, meaning) in TABLE {
            assert!(
                !meaning.contains("  ") && !meaning.contains('\n') && !meaning.contains('|'),
                "row {exit:?} must be one line of single-spaced words without `|`"
            );
        }
    }

    #[test]
    fn the_long_help_unwraps_to_the_table() {
        let help = long_help();
        assert!(help.lines().all(|l| l.len() <= WIDTH), "{help}");
        let mut rows: Vec<String> = Vec::new();
        for line in help.lines().skip(1) {
            if line.starts_with(&" ".repeat(INDENT)) {
                let last = rows.last_mut().expect("a row before its continuation");
                last.push(' ');
                last.push_str(line.trim_start());
            } else {
                rows.push(line.trim_start().to_owned());
            }
        }
        let expected: Vec<String> = TABLE
            .iter()
            .map(|(exit, meaning)| format!("{}  {meaning}", exit.code()))
            .collect();
        assert_eq!(rows, expected);
    }

    #[test]
    fn the_worst_outcome_wins() {
        assert_eq!(
            [Exit::Ok, Exit::RunFailed, Exit::CheckFailed].iter().max(),
            Some(&Exit::RunFailed)
        );
        assert_eq!(Exit::verdict(false), Exit::CheckFailed);
        assert_eq!(
            CliError::Invalid("--atol".into()).exit().code(),
            2,
            "a flag is bad input"
        );
    }
}
