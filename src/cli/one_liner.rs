//! `detcheck check [FLAGS] -- PROGRAM [ARGS...]`: a `command` scenario made from flags, so a
//! program is checked without writing a scenario file first.
//!
//! [`scenario`] writes the scenario file the flags stand for (JSON, only the fields given, plus
//! the four a file must have: `world_size` 1, `steps` 3, `seed` 0, `expect` identical) and loads
//! it with the library's loader (`KindRegistry::load_text`), so the defaults, the validation and
//! the exit codes are a file's. An invalid value is reported naming its flag instead of its
//! field. `--save-scenario FILE` writes that JSON, so `detcheck check FILE` runs the same check
//! again (from the same folder: the program's arguments are kept as given).
//!
//! Determinism: the scenario is a pure function of the flags and the program's arguments.

use super::exit::CliError;
use super::ProgramFlags;
use detcheck::file::write_atomically;
use detcheck::scenario::ScenarioError;
use detcheck::{KindRegistry, LoadedScenario};
use serde_json::{json, Map, Value};
use std::ffi::OsString;
use std::path::Path;

/// What stands for the scenario file in errors and reports.
const ORIGIN: &str = "(command line)";

/// The flag of each field the flags can set (a field's error names its flag).
const FLAGS: [(&str, &str); 12] = [
    ("name", "--name"),
    ("world_size", "--ranks"),
    ("steps", "--steps"),
    ("seed", "--seed"),
    ("expect", "--expect"),
    ("checks", "--checks"),
    ("world_sizes", "--world-sizes"),
    ("batch_sizes", "--batch-sizes"),
    ("params.launcher", "--launcher"),
    ("params.srun_args", "--srun-args"),
    ("params.timeout_secs", "--timeout"),
    ("params.command", "-- PROGRAM"),
];

/// The program's arguments as one line, for messages.
pub(super) fn shown(program: &[OsString]) -> String {
    program
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The scenario's default name: the file name, without extension, of the first argument that
/// names a file (the script of `python train.py`), else the last part of the module a `-m` runs
/// (`python -m mypkg.train`: `train`), else of the program.
fn default_name(program: &[String]) -> String {
    let stem = |a: &String| {
        Path::new(a)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
    };
    let module = || {
        let at = program.iter().skip(1).position(|a| a == "-m")?;
        let name = program.get(at + 2)?;
        name.rsplit('.').next().map(str::to_owned)
    };
    program
        .iter()
        .skip(1)
        .find(|a| !a.starts_with('-') && Path::new(a).is_file())
        .and_then(stem)
        .or_else(module)
        .or_else(|| program.first().and_then(stem))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "program".to_owned())
}

/// The words of `--srun-args`: split at white space, quotes (`'...'`, `"..."`) grouping.
///
/// # Errors
/// The message of a quote without its end.
fn split_options(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(q) = quote {
        return Err(format!("`{text}`: a {q} without its end"));
    }
    words.extend(word);
    Ok(words)
}

/// The scenario file the flags stand for.
fn spec_json(flags: &ProgramFlags, program: Vec<String>) -> Result<Value, CliError> {
    let mut params = Map::new();
    params.insert("command".into(), json!(program));
    if let Some(launcher) = &flags.launcher {
        params.insert("launcher".into(), json!(launcher));
    }
    if let Some(options) = &flags.srun_args {
        let words =
            split_options(options).map_err(|m| CliError::Invalid(format!("--srun-args: {m}")))?;
        params.insert("srun_args".into(), json!(words));
    }
    if let Some(timeout) = flags.timeout {
        params.insert("timeout_secs".into(), json!(timeout));
    }
    if flags.deterministic {
        params.insert("deterministic".into(), json!(true));
    }
    if flags.run_to_end {
        params.insert("stop_after_steps".into(), json!(false));
    }
    let mut spec = Map::new();
    let name = flags.name.clone().unwrap_or_else(|| default_name(&program));
    spec.insert("name".into(), json!(name));
    spec.insert(
        "description".into(),
        json!(format!("detcheck check -- {}", program.join(" "))),
    );
    spec.insert("kind".into(), json!("command"));
    spec.insert("world_size".into(), json!(flags.ranks.unwrap_or(1)));
    spec.insert("steps".into(), json!(flags.steps.unwrap_or(3)));
    spec.insert("seed".into(), json!(flags.seed.unwrap_or(0)));
    spec.insert(
        "expect".into(),
        json!(flags.expect.as_deref().unwrap_or("identical")),
    );
    if !flags.checks.is_empty() {
        spec.insert("checks".into(), json!(flags.checks));
    }
    if !flags.world_sizes.is_empty() {
        spec.insert("world_sizes".into(), json!(flags.world_sizes));
    }
    if !flags.batch_sizes.is_empty() {
        // The sizes are the batch_sizes check's: alone without --checks, and never silently
        // unused with them.
        if flags.checks.is_empty() {
            spec.insert("checks".into(), json!(["batch_sizes"]));
        } else if !flags.checks.iter().any(|c| c == "batch_sizes") {
            return Err(CliError::Invalid(
                "--batch-sizes: the sizes are for the batch_sizes check; add batch_sizes to \
                 --checks"
                    .to_owned(),
            ));
        }
        spec.insert("batch_sizes".into(), json!(flags.batch_sizes));
    }
    spec.insert("params".into(), Value::Object(params));
    Ok(Value::Object(spec))
}

/// The flag that sets `field` (a field the flags cannot set is named as a field).
fn flag_of(field: &str) -> String {
    FLAGS
        .iter()
        .find(|(f, _)| field == *f || field.starts_with(&format!("{f}[")))
        .map_or_else(
            || format!("field `{field}`"),
            |(_, flag)| (*flag).to_owned(),
        )
}

/// The flags of a program's check that `run` (one launch, no checks) refuses: each would be
/// silently ignored.
const CHECK_ONLY: [&str; 5] = [
    "--checks",
    "--expect",
    "--world-sizes",
    "--batch-sizes",
    "--save-scenario",
];

/// The scenario of `detcheck run --dump DIR [FLAGS] -- PROGRAM`: the check's scenario, run once.
///
/// # Errors
/// As [`scenario`], and [`CliError::Invalid`] naming a flag of checks only.
pub(super) fn scenario_to_run(flags: &ProgramFlags) -> Result<LoadedScenario, CliError> {
    let given = [
        !flags.checks.is_empty(),
        flags.expect.is_some(),
        !flags.world_sizes.is_empty(),
        !flags.batch_sizes.is_empty(),
        flags.save_scenario.is_some(),
    ];
    if let Some((flag, _)) = CHECK_ONLY.iter().zip(given).find(|(_, g)| *g) {
        return Err(CliError::Invalid(format!(
            "{flag}: `run` launches the program once and dumps it; {flag} is for `detcheck \
             check`"
        )));
    }
    the_scenario(flags)
}

/// The scenario of `detcheck check [FLAGS] -- PROGRAM`, loaded as a file is; written to
/// `--save-scenario` first when asked.
///
/// # Errors
/// [`CliError::Invalid`] naming the flag of a value the scenario refuses, an argument that is
/// not UTF-8, or the file `--save-scenario` cannot write.
pub(super) fn scenario(flags: &ProgramFlags) -> Result<Vec<LoadedScenario>, CliError> {
    the_scenario(flags).map(|loaded| vec![loaded])
}

/// The one scenario the flags stand for (`scenario`'s, `scenario_to_run`'s).
fn the_scenario(flags: &ProgramFlags) -> Result<LoadedScenario, CliError> {
    let program = flags
        .program
        .iter()
        .map(|a| {
            a.to_str().map(str::to_owned).ok_or_else(|| {
                CliError::Invalid(format!(
                    "-- PROGRAM: the argument {a:?} is not UTF-8 (a scenario holds text)"
                ))
            })
        })
        .collect::<Result<Vec<String>, CliError>>()?;
    let spec = spec_json(flags, program)?;
    let text = serde_json::to_string_pretty(&spec).unwrap_or_default() + "\n";
    let loaded = KindRegistry::builtin()
        .load_text(&text, Path::new(ORIGIN))
        .map_err(|e| match e {
            ScenarioError::Invalid { field, message, .. } => {
                CliError::Invalid(format!("{}: {message}", flag_of(&field)))
            }
            other => CliError::Scenarios(vec![other]),
        })?;
    if let Some(path) = &flags.save_scenario {
        write_atomically(path, text.as_bytes())
            .map_err(|e| CliError::Invalid(format!("--save-scenario {}: {e}", path.display())))?;
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use detcheck::scenario::CheckKind;

    fn flags(program: &[&str]) -> ProgramFlags {
        ProgramFlags {
            program: program.iter().map(OsString::from).collect(),
            ..ProgramFlags::default()
        }
    }

    #[test]
    fn the_defaults_and_the_flags_make_a_scenario_file() {
        let spec = spec_json(
            &flags(&["python3", "-u", "train.py"]),
            vec!["python3".into(), "-u".into(), "train.py".into()],
        )
        .unwrap();
        assert_eq!(spec["world_size"], 1);
        assert_eq!(spec["steps"], 3);
        assert_eq!(spec["expect"], "identical");
        assert_eq!(spec["params"]["command"][2], "train.py");
        assert!(spec.get("checks").is_none(), "the kind's default checks");
        let mut f = flags(&["x"]);
        f.ranks = Some(4);
        f.checks = vec!["repeat".into(), "replicas".into()];
        f.launcher = Some("torchrun".into());
        f.deterministic = true;
        f.run_to_end = true;
        let spec = spec_json(&f, vec!["x".into()]).unwrap();
        assert_eq!(spec["params"]["deterministic"], true);
        assert_eq!(spec["params"]["stop_after_steps"], false);
        assert_eq!(spec["world_size"], 4);
        assert_eq!(spec["checks"], json!(["repeat", "replicas"]));
        assert_eq!(spec["params"]["launcher"], "torchrun");
        let loaded = scenario(&f).unwrap();
        assert_eq!(loaded[0].spec.world_size, 4);
        let detcheck::scenario::Program::Command(command) = &loaded[0].program else {
            panic!("a command scenario");
        };
        assert!(command.deterministic && !command.stop_after_steps);
    }

    /// Sets one flag of a command line.
    type SetFlag = fn(&mut ProgramFlags);

    #[test]
    fn a_bad_value_names_its_flag() {
        let cases: [(&str, SetFlag); 9] = [
            ("--ranks", |f| f.ranks = Some(0)),
            ("--batch-sizes", |f| f.batch_sizes = vec![8]),
            ("--batch-sizes", |f| f.batch_sizes = vec![0, 8]),
            ("--batch-sizes", |f| {
                f.batch_sizes = vec![1, 8];
                f.checks = vec!["repeat".into()];
            }),
            ("--batch-sizes", |f| f.checks = vec!["batch_sizes".into()]),
            ("--launcher", |f| f.launcher = Some("slurm".into())),
            ("--expect", |f| f.expect = Some("same".into())),
            ("--checks", |f| {
                f.checks = vec!["repeat".into(), "speed".into()]
            }),
            ("--name", |f| f.name = Some("a b".into())),
        ];
        for (flag, set) in cases {
            let mut f = flags(&["python3", "t.py"]);
            set(&mut f);
            let Err(CliError::Invalid(message)) = scenario(&f) else {
                panic!("{flag}: accepted");
            };
            assert!(
                message.starts_with(&format!("{flag}: ")),
                "{flag}: {message}"
            );
        }
    }

    /// `--batch-sizes` alone is the batch_sizes check; `{batch}` needs it, naming the flag; `run`
    /// refuses it.
    #[test]
    fn batch_sizes_make_the_batch_sizes_check() {
        let mut f = flags(&["python3", "gen.py", "--batch-size", "{batch}"]);
        let Err(CliError::Invalid(message)) = scenario(&f) else {
            panic!("{{batch}} without sizes: accepted");
        };
        assert!(
            message.starts_with("--batch-sizes: `{batch}` in params.command[3] needs"),
            "{message}"
        );
        f.batch_sizes = vec![1, 8];
        let spec = spec_json(&f, vec!["gen".into()]).unwrap();
        assert_eq!(spec["checks"], json!(["batch_sizes"]));
        assert_eq!(spec["batch_sizes"], json!([1, 8]));
        let loaded = scenario(&f).unwrap();
        assert_eq!(loaded[0].checks, [CheckKind::BatchSizes]);
        f.checks = vec!["repeat".into(), "batch_sizes".into()];
        let loaded = scenario(&f).unwrap();
        assert_eq!(loaded[0].checks, [CheckKind::Repeat, CheckKind::BatchSizes]);
        f.checks.clear();
        let Err(CliError::Invalid(message)) = scenario_to_run(&f) else {
            panic!("run --batch-sizes: accepted");
        };
        assert!(
            message.starts_with("--batch-sizes: `run` launches the program once"),
            "{message}"
        );
    }

    #[test]
    fn srun_options_are_split_as_a_shell_would() {
        assert_eq!(
            split_options(" -p gpu  --gpus-per-task=1 --comment='a b' \"\" ").unwrap(),
            ["-p", "gpu", "--gpus-per-task=1", "--comment=a b", ""]
        );
        assert!(split_options("--comment='a")
            .unwrap_err()
            .contains("without its end"));
        let mut f = flags(&["python3", "t.py"]);
        f.launcher = Some("srun".into());
        f.srun_args = Some("--mpi=pmi2 -t 1".into());
        let spec = spec_json(&f, vec!["python3".into(), "t.py".into()]).unwrap();
        assert_eq!(
            spec["params"]["srun_args"],
            json!(["--mpi=pmi2", "-t", "1"])
        );
        f.launcher = Some("processes".into());
        let Err(CliError::Invalid(message)) = scenario(&f) else {
            panic!("srun options without srun: accepted");
        };
        assert!(
            message.starts_with("--srun-args: only the `srun` launcher"),
            "{message}"
        );
    }

    #[test]
    fn the_name_is_the_scripts() {
        let here = file!();
        let name = default_name(&["python3".into(), "-u".into(), here.into()]);
        assert_eq!(name, "one_liner");
        assert_eq!(default_name(&["./run.sh".into(), "--x".into()]), "run");
        let module = [
            "python".into(),
            "-m".into(),
            "mypkg.train".into(),
            "--lr".into(),
        ];
        assert_eq!(default_name(&module), "train");
    }
}
