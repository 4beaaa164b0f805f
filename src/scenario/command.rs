//! The `command` kind: a program of the user's own, launched in fresh processes.
//!
//! A scenario file of kind `command` names an argument vector (`params.command`) and how to
//! start it (`params.launcher`): `processes` (detcheck starts `world_size` processes and gives
//! each its rank), `mpirun` (Open MPI or MPICH), `torchrun`, `msrun` (MindSpore's launcher),
//! `srun` (a Slurm job step; extra options in `params.srun_args`), or `none` (one process writes
//! every rank's trace file).
//! Without `params.launcher` it is `processes`, or `srun` inside a Slurm allocation
//! (`SLURM_JOB_ID` set: `detcheck check` in an `sbatch` script or under `salloc`), which is the
//! one place this layer reads the environment. Every launch gets a fresh `DETCHECK_TRACE_DIR`; the program writes one
//! trace file per rank there (`TraceWriter::from_env`, or the Python package), and the checks
//! compare those traces as they compare a built-in kind's. [`CommandProgram`] is the validated
//! form; the run layer launches it.
//!
//! Templates: `{seed}`, `{steps}`, `{world_size}`, `{rank}` (the `processes` launcher only),
//! `{scenario_dir}` (the folder of the scenario file) and `{batch}` (the run's batch size: each
//! of the spec's `batch_sizes` under the `batch_sizes` check, the first one in every other run;
//! a `{batch}` without `batch_sizes` is refused, naming that field) are substituted in the
//! arguments and in the values of `params.env`; the restart arguments also take `{step}` and
//! `{dir}`. `{{` and `}}` are literal braces. A template naming another field is rejected when
//! the file is loaded.
//!
//! Determinism: what a launch receives is a function of the spec, the run (its seeded
//! perturbation) and the variant; see `crate::run` for what the runner varies between launches.

use crate::scenario::{ParamError, ScenarioSpec};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a command's ranks are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Launcher {
    /// detcheck starts `world_size` processes itself; each gets `DETCHECK_RANK`, `RANK`,
    /// `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` (a free loopback port), so
    /// `torch.distributed.init_process_group("gloo")` works without torchrun. At one rank the
    /// program runs as by hand: none of those but `DETCHECK_RANK` (the Python start-up hook
    /// gives a program that creates a process group a world of one).
    #[default]
    Processes,
    /// `mpirun -n world_size` (Open MPI or MPICH, flags and pinning as `DETCHECK_NP` uses).
    Mpirun,
    /// `torchrun --nproc-per-node world_size` on this host.
    Torchrun,
    /// MindSpore's `msrun --worker_num world_size --local_worker_num world_size` on this host:
    /// a scheduler process and `world_size` workers, each worker's rank its `RANK_ID`
    /// (`crate::launch`); the workers' logs are read on failure (`crate::run::msrun`).
    Msrun,
    /// `srun -n world_size` (a Slurm job step, or a job of one step outside an allocation);
    /// each task reads its rank from `SLURM_PROCID` (`crate::launch::slurm`). The default inside
    /// an allocation.
    Srun,
    /// One process, which writes every rank's trace file itself.
    None,
}

impl Launcher {
    /// The name used in scenario files.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Processes => "processes",
            Launcher::Mpirun => "mpirun",
            Launcher::Torchrun => "torchrun",
            Launcher::Msrun => "msrun",
            Launcher::Srun => "srun",
            Launcher::None => "none",
        }
    }

    /// The launcher of a scenario that names none: `srun` inside a Slurm allocation
    /// (`SLURM_JOB_ID` set), else `processes`.
    #[must_use]
    pub fn default_here() -> Self {
        if std::env::var_os("SLURM_JOB_ID").is_some_and(|id| !id.is_empty()) {
            Launcher::Srun
        } else {
            Launcher::Processes
        }
    }
}

/// The arguments that stop a run after a step with a checkpoint, and resume one from it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartArgs {
    /// Appended to the command to stop before step `{step}` and checkpoint into `{dir}`.
    pub stop: Vec<String>,
    /// Appended to the command to resume from the checkpoint in `{dir}`.
    pub resume: Vec<String>,
}

/// `params` of a `command` scenario, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandParams {
    command: Vec<String>,
    #[serde(default)]
    launcher: Option<Launcher>,
    #[serde(default)]
    srun_args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default = "default_timeout_secs")]
    timeout_secs: u64,
    #[serde(default)]
    restart: Option<RestartArgs>,
    #[serde(default)]
    deterministic: bool,
    #[serde(default = "default_true")]
    stop_after_steps: bool,
}

fn default_true() -> bool {
    true
}

fn default_timeout_secs() -> u64 {
    300
}

/// The longest a launch may be given, in seconds (a day).
const MAX_TIMEOUT_SECS: u64 = 86_400;

/// A validated `command` scenario: what to start, how, with what environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandProgram {
    /// The argument vector, templates not yet substituted.
    pub command: Vec<String>,
    /// How the ranks are started.
    pub launcher: Launcher,
    /// `params.srun_args`: options given to `srun` before the program (the `srun` launcher
    /// only), e.g. `["--partition=gpu", "--gpus-per-task=1"]`.
    pub srun_args: Vec<String>,
    /// Extra environment, values templated.
    pub env: BTreeMap<String, String>,
    /// The longest a launch may take before its processes are killed.
    pub timeout: Duration,
    /// How to stop and resume (the `restart` check), when the program supports it.
    pub restart: Option<RestartArgs>,
    /// The folder of the scenario file (`{scenario_dir}`).
    pub scenario_dir: PathBuf,
    /// `params.deterministic`: launch with `hints::deterministic()`'s settings (a fixed
    /// `PYTHONHASHSEED`, `CUBLAS_WORKSPACE_CONFIG`, and the Python start-up calls with the
    /// scenario's seed), to see whether they make the program reproducible.
    pub deterministic: bool,
    /// With `deterministic`: only these of the settings (by name; `None`: all). Set by the
    /// check that learns which setting fixes a divergence, never by a scenario file.
    pub deterministic_only: Option<Vec<String>>,
    /// `params.stop_after_steps` (default true): a program recorded without a change of its
    /// own (the Python package's start-up hook) is ended after `steps` optimizer steps.
    pub stop_after_steps: bool,
}

/// The values a launch substitutes into templates.
#[derive(Debug, Clone, Default)]
pub(crate) struct TemplateValues {
    pub(crate) seed: u64,
    pub(crate) steps: u64,
    pub(crate) world_size: usize,
    pub(crate) rank: Option<usize>,
    pub(crate) scenario_dir: PathBuf,
    pub(crate) step: Option<u64>,
    pub(crate) dir: Option<PathBuf>,
    /// `{batch}`: the run's batch size (`RunPlan::batch_size`, else the spec's first).
    pub(crate) batch: Option<usize>,
}

impl TemplateValues {
    fn value(&self, field: &str) -> Option<String> {
        match field {
            "seed" => Some(self.seed.to_string()),
            "steps" => Some(self.steps.to_string()),
            "world_size" => Some(self.world_size.to_string()),
            "rank" => self.rank.map(|r| r.to_string()),
            "scenario_dir" => Some(self.scenario_dir.display().to_string()),
            "step" => self.step.map(|s| s.to_string()),
            "dir" => self.dir.as_ref().map(|d| d.display().to_string()),
            "batch" => self.batch.map(|b| b.to_string()),
            _ => None,
        }
    }
}

/// The fields a template names, in order, or why it cannot be read.
fn template_fields(text: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
            }
            '{' => {
                let mut field = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == '}' {
                        closed = true;
                        break;
                    }
                    field.push(c);
                }
                if !closed || field.is_empty() || field.contains('{') {
                    return Err(format!(
                        "`{text}`: an empty or unclosed `{{...}}` (write `{{{{` for a brace)"
                    ));
                }
                fields.push(field);
            }
            '}' => return Err(format!("`{text}`: a `}}` without its `{{` (write `}}}}`)")),
            _ => {}
        }
    }
    Ok(fields)
}

/// `text` with its templates replaced by `values`.
///
/// Templates were checked when the file was loaded, so every field has a value here.
pub(crate) fn substitute(text: &str, values: &TemplateValues) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let field: String = chars.by_ref().take_while(|&c| c != '}').collect();
                out.push_str(&values.value(&field).unwrap_or_default());
            }
            _ => out.push(c),
        }
    }
    out
}

impl CommandProgram {
    /// Validates the `params` of a `command` spec read from `origin`.
    ///
    /// # Errors
    /// A [`ParamError`] naming the field: an empty command, a template naming an unknown
    /// field (or `{rank}` where the launcher starts the ranks itself, or `{batch}` without the
    /// spec's `batch_sizes`: then the field is `batch_sizes`), a timeout out of range, an
    /// environment variable detcheck sets itself.
    pub fn from_spec(spec: &ScenarioSpec, origin: &Path) -> Result<Self, ParamError> {
        let params: CommandParams = spec.parse_params()?;
        if params.command.is_empty() || params.command[0].is_empty() {
            return Err(ParamError::new(
                "params.command",
                "must name a program: a non-empty array, e.g. [\"python3\", \"train.py\"]",
            ));
        }
        let launcher = params.launcher.unwrap_or_else(Launcher::default_here);
        if !params.srun_args.is_empty() && launcher != Launcher::Srun {
            return Err(ParamError::new(
                "params.srun_args",
                format!(
                    "only the `srun` launcher takes srun's options (this scenario's launcher is                      `{}`)",
                    launcher.name()
                ),
            ));
        }
        if let Some(i) = params.srun_args.iter().position(|a| a.is_empty()) {
            return Err(ParamError::new(
                format!("params.srun_args[{i}]"),
                "an empty option",
            ));
        }
        let with_rank = launcher == Launcher::Processes;
        let check = |field: String, text: &str, extra: &[&str]| -> Result<(), ParamError> {
            for name in template_fields(text).map_err(|m| ParamError::new(&field, m))? {
                if name == "batch" && spec.batch_sizes.is_empty() {
                    return Err(ParamError::new(
                        "batch_sizes",
                        format!(
                            "`{{batch}}` in {field} needs the batch sizes: give `batch_sizes` \
                             (`--batch-sizes 1,8` on the command line)"
                        ),
                    ));
                }
                let known = ["seed", "steps", "world_size", "scenario_dir", "batch"]
                    .contains(&name.as_str())
                    || extra.contains(&name.as_str())
                    || (name == "rank" && with_rank);
                if !known {
                    let hint = if name == "rank" {
                        format!(
                            "`{{rank}}` exists only with the `processes` launcher (the `{}` \
                             launcher starts the ranks itself; read the rank from the \
                             environment)",
                            launcher.name()
                        )
                    } else {
                        format!(
                            "unknown template field `{{{name}}}`; known: {{seed}}, {{steps}}, \
                             {{world_size}}, {{rank}}, {{scenario_dir}}, {{batch}}{}",
                            if extra.is_empty() {
                                ""
                            } else {
                                ", and here {step} and {dir}"
                            }
                        )
                    };
                    return Err(ParamError::new(field, hint));
                }
            }
            Ok(())
        };
        for (i, arg) in params.command.iter().enumerate() {
            check(format!("params.command[{i}]"), arg, &[])?;
        }
        for (name, value) in &params.env {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(ParamError::new(
                    format!("params.env.{name}"),
                    "not a valid environment variable name",
                ));
            }
            if RESERVED_ENV.contains(&name.as_str()) {
                return Err(ParamError::new(
                    format!("params.env.{name}"),
                    "detcheck sets this variable itself for every launch",
                ));
            }
            check(format!("params.env.{name}"), value, &[])?;
        }
        if let Some(restart) = &params.restart {
            for (which, args) in [("stop", &restart.stop), ("resume", &restart.resume)] {
                for (i, arg) in args.iter().enumerate() {
                    check(
                        format!("params.restart.{which}[{i}]"),
                        arg,
                        &["step", "dir"],
                    )?;
                }
            }
        }
        if params.timeout_secs == 0 || params.timeout_secs > MAX_TIMEOUT_SECS {
            return Err(ParamError::new(
                "params.timeout_secs",
                format!(
                    "must be between 1 and {MAX_TIMEOUT_SECS} seconds, got {}",
                    params.timeout_secs
                ),
            ));
        }
        let scenario_dir = origin
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        Ok(CommandProgram {
            command: params.command,
            launcher,
            srun_args: params.srun_args,
            env: params.env,
            timeout: Duration::from_secs(params.timeout_secs),
            restart: params.restart,
            scenario_dir,
            deterministic: params.deterministic,
            deterministic_only: None,
            stop_after_steps: params.stop_after_steps,
        })
    }
}

/// The variables detcheck sets for every launch; a scenario's `params.env` may not set them.
pub const RESERVED_ENV: [&str; 20] = [
    "DETCHECK_TRACE_DIR",
    "DETCHECK_RUN_ID",
    "DETCHECK_LAUNCHER",
    "DETCHECK_FINGERPRINT",
    "DETCHECK_MPI_LIBRARY",
    "DETCHECK_CAPTURE",
    "DETCHECK_CAPTURE_DIR",
    "DETCHECK_SEED",
    "DETCHECK_STEPS",
    "DETCHECK_MODE",
    "DETCHECK_RANK",
    "DETCHECK_WORLD_SIZE",
    "DETCHECK_LAUNCH",
    "DETCHECK_STOP_AFTER",
    "DETCHECK_DETERMINISTIC",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn program(params: &str) -> Result<CommandProgram, ParamError> {
        let text = format!(
            r#"{{"kind": "command", "world_size": 2, "steps": 3, "seed": 7,
                "expect": "identical", "params": {params}}}"#
        );
        let spec = crate::scenario::spec::parse_spec(&text).unwrap();
        CommandProgram::from_spec(&spec, Path::new("dir/s.json"))
    }

    #[test]
    fn templates_are_substituted_and_braces_escaped() {
        let values = TemplateValues {
            seed: 7,
            steps: 3,
            world_size: 2,
            rank: Some(1),
            scenario_dir: PathBuf::from("dir"),
            step: Some(2),
            dir: Some(PathBuf::from("/ck")),
            batch: Some(8),
        };
        assert_eq!(
            substitute(
                "--seed={seed} {rank}/{world_size} {{x}} {scenario_dir}/p.py",
                &values
            ),
            "--seed=7 1/2 {x} dir/p.py"
        );
        assert_eq!(substitute("{dir}:{step}", &values), "/ck:2");
        assert_eq!(
            substitute("--batch-size={batch}", &values),
            "--batch-size=8"
        );
    }

    #[test]
    fn bad_templates_and_fields_are_named() {
        let err = |p: &str| program(p).unwrap_err().to_string();
        assert_eq!(
            err(r#"{"command": ["x", "--lr={lr}"]}"#),
            "field `params.command[1]`: unknown template field `{lr}`; known: {seed}, {steps}, \
             {world_size}, {rank}, {scenario_dir}, {batch}"
        );
        assert!(err(r#"{"command": ["x", "{rank}"], "launcher": "mpirun"}"#)
            .starts_with("field `params.command[1]`: `{rank}` exists only with the `processes`"));
        assert!(err(r#"{"command": []}"#).starts_with("field `params.command`: must name"));
        assert!(err(r#"{"command": ["x", "{seed"]}"#).contains("unclosed"));
        assert!(err(r#"{"command": ["x"], "env": {"RANK": "3"}}"#)
            .starts_with("field `params.env.RANK`: detcheck sets this variable"));
        assert!(err(r#"{"command": ["x"], "timeout_secs": 0}"#)
            .starts_with("field `params.timeout_secs`"));
        assert!(err(r#"{"command": ["x"], "launcher": "slurm"}"#)
            .starts_with("field `params.launcher`: unknown variant `slurm`"));
        assert!(err(
            r#"{"command": ["x"], "restart": {"stop": ["--at", "{when}"], "resume": []}}"#
        )
        .starts_with("field `params.restart.stop[1]`: unknown template field `{when}`"));
        let ok = program(
            r#"{"command": ["python3", "{scenario_dir}/p.py"], "env": {"A": "{seed}"},
                "restart": {"stop": ["--stop", "{step}", "--ckpt", "{dir}"], "resume": ["{dir}"]}}"#,
        )
        .unwrap();
        assert_eq!(ok.launcher, Launcher::default_here());
        assert!(
            err(r#"{"command": ["x"], "launcher": "mpirun", "srun_args": ["-p", "gpu"]}"#)
                .starts_with("field `params.srun_args`: only the `srun` launcher")
        );
        let srun = program(r#"{"command": ["x"], "launcher": "srun", "srun_args": ["-p", "gpu"]}"#)
            .unwrap();
        assert_eq!((srun.launcher, srun.srun_args.len()), (Launcher::Srun, 2));
        assert_eq!(ok.scenario_dir, PathBuf::from("dir"));
        assert_eq!(ok.timeout, Duration::from_secs(300));
    }

    #[test]
    fn a_batch_template_needs_the_batch_sizes_and_names_that_field() {
        let with_sizes = |sizes: &str, params: &str| {
            let text = format!(
                r#"{{"kind": "command", "world_size": 1, "steps": 3, "seed": 7,
                    "expect": "identical", "batch_sizes": {sizes}, "params": {params}}}"#
            );
            let spec = crate::scenario::spec::parse_spec(&text).unwrap();
            CommandProgram::from_spec(&spec, Path::new("dir/s.json"))
        };
        let err = with_sizes("[]", r#"{"command": ["gen", "--batch-size", "{batch}"]}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "field `batch_sizes`: `{batch}` in params.command[2] needs the batch sizes: give \
             `batch_sizes` (`--batch-sizes 1,8` on the command line)"
        );
        let err = with_sizes("[]", r#"{"command": ["gen"], "env": {"BS": "{batch}"}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("field `batch_sizes`: `{batch}` in params.env.BS needs"),
            "{err}"
        );
        let ok = with_sizes(
            "[1, 8]",
            r#"{"command": ["gen", "--batch-size={batch}"], "env": {"BS": "{batch}"}}"#,
        )
        .unwrap();
        assert_eq!(ok.command[1], "--batch-size={batch}");
    }
}
