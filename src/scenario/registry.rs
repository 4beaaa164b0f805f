//! Kinds by name ([`KindRegistry`]), loading scenario files ([`LoadedScenario`],
//! [`discover_scenarios`]) and the default checks, which follow from a kind's [`Capabilities`].
//!
//! Bad input: every error names the file, and the field where there is one ([`ScenarioError`]);
//! a scenario whose run would not fit in the available memory is refused when it is built,
//! naming the field that dominates the estimate (`limits`).
//!
//! Invariant (a kind's capabilities decide its default checks): `replicas` for replicated records,
//! `workers` for a loader, `restart` for checkpoints; nothing depends on a kind's name.
//!
//! Determinism: files are loaded in file-name order.

use crate::scenario::command::CommandProgram;
use crate::scenario::limits::{available_memory, check_memory, estimate, Available};
use crate::scenario::spec::{parse_spec, validate_common};
use crate::scenario::{
    builtin, CheckKind, Expectation, ParamError, Program, Scenario, ScenarioSpec,
};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Builds a kind's program from a validated spec.
pub type KindFactory =
    Arc<dyn Fn(&ScenarioSpec) -> Result<Arc<dyn Scenario>, ParamError> + Send + Sync>;

/// How a kind's program is made.
#[derive(Clone)]
enum KindEntry {
    /// A rank program, built by its factory.
    Ranks(KindFactory),
    /// The `command` kind: a program of the user's own, in fresh processes.
    Command,
}

/// The scenario kinds a loader knows, by name.
#[derive(Clone)]
pub struct KindRegistry {
    kinds: BTreeMap<String, KindEntry>,
    /// The memory a run may hold: measured when a scenario is built (`None`), or set by a test.
    memory: Option<Available>,
}

impl fmt::Debug for KindRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.kinds.keys()).finish()
    }
}

impl Default for KindRegistry {
    fn default() -> Self {
        Self::builtin()
    }
}

impl KindRegistry {
    /// The built-in kinds: `seed`, `collective`, `dataloader`, `train`, and `command` (a
    /// program of the user's own).
    #[must_use]
    pub fn builtin() -> Self {
        let mut registry = KindRegistry {
            kinds: BTreeMap::new(),
            memory: None,
        };
        builtin::register(&mut registry);
        registry
            .kinds
            .insert("command".to_owned(), KindEntry::Command);
        registry
    }

    /// Adds (or replaces) a kind.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        factory: impl Fn(&ScenarioSpec) -> Result<Arc<dyn Scenario>, ParamError> + Send + Sync + 'static,
    ) {
        self.kinds
            .insert(name.into(), KindEntry::Ranks(Arc::new(factory)));
    }

    /// This registry with `bytes` taken as the available memory instead of the machine's.
    #[cfg(test)]
    pub(crate) fn with_available_memory(mut self, bytes: u64) -> Self {
        self.memory = Some(Available {
            bytes,
            source: "set by a test",
        });
        self
    }

    /// This registry without the memory check: an MPI follower builds what its leader already
    /// accepted (the leader decides, followers follow), and holds only its own ranks.
    #[cfg(feature = "mpi")]
    pub(crate) fn without_memory_check(mut self) -> Self {
        self.memory = Some(Available {
            bytes: u64::MAX,
            source: "not checked: the leader checked it",
        });
        self
    }

    /// The names of the known kinds, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }

    /// Validates `spec` and builds its program. `origin` names the file in errors.
    ///
    /// # Errors
    /// [`ScenarioError::Invalid`] naming `origin` and the field.
    pub fn build(
        &self,
        spec: ScenarioSpec,
        origin: &Path,
    ) -> Result<LoadedScenario, ScenarioError> {
        let invalid = |e: ParamError| ScenarioError::Invalid {
            path: origin.to_path_buf(),
            field: e.field,
            message: e.message,
        };
        validate_common(&spec).map_err(invalid)?;
        let entry = self.kinds.get(&spec.kind).ok_or_else(|| {
            invalid(ParamError::new(
                "kind",
                format!(
                    "unknown kind `{}`; known kinds: {}",
                    spec.kind,
                    self.names().collect::<Vec<_>>().join(", ")
                ),
            ))
        })?;
        let program = Self::make(entry, &spec, origin).map_err(invalid)?;
        let variants = spec
            .variants
            .iter()
            .enumerate()
            .map(|(i, variant)| {
                let in_variant = |e: ParamError| ParamError {
                    field: format!("variants[{i}].{}", e.field),
                    message: e.message,
                };
                let varied = variant_spec(&spec, variant, matches!(entry, KindEntry::Command))
                    .map_err(in_variant)?;
                let program = Self::make(entry, &varied, origin).map_err(in_variant)?;
                Ok((varied, program))
            })
            .collect::<Result<Vec<_>, ParamError>>()
            .map_err(invalid)?;
        let name = match &spec.name {
            Some(name) => name.clone(),
            None => origin
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| spec.kind.clone()),
        };
        let mut checks = spec.checks.clone();
        if checks.is_empty() {
            checks.push(CheckKind::Repeat);
            if spec.expect == Expectation::Identical {
                let supports = program.capabilities();
                if supports.replicated_records {
                    checks.push(CheckKind::Replicas);
                }
                if supports.loads_data {
                    checks.push(CheckKind::Workers);
                }
                if supports.resumes && spec.steps >= 2 {
                    checks.push(CheckKind::Restart);
                }
                if !spec.variants.is_empty() {
                    checks.push(CheckKind::Variants);
                }
            }
        }
        validate_capabilities(&spec, &checks, &program).map_err(invalid)?;
        // Before any rank starts: the largest configuration the checks run, and each variant's.
        let available = self.memory.unwrap_or_else(available_memory);
        check_memory(&estimate(&spec, &checks, &program), available).map_err(invalid)?;
        for (i, (varied, program)) in variants.iter().enumerate() {
            check_memory(&estimate(varied, &checks, program), available).map_err(|e| {
                invalid(ParamError {
                    field: format!("variants[{i}].{}", e.field),
                    message: e.message,
                })
            })?;
        }
        let variants = variants
            .into_iter()
            .enumerate()
            .map(|(i, (spec, program))| LoadedScenario {
                name: format!("{name}[variant {i}]"),
                origin: origin.to_path_buf(),
                checks: Vec::new(),
                spec,
                program,
                variants: Vec::new(),
            })
            .collect();
        Ok(LoadedScenario {
            name,
            origin: origin.to_path_buf(),
            checks,
            spec,
            program,
            variants,
        })
    }

    /// Builds the program of a kind's entry for `spec`.
    fn make(entry: &KindEntry, spec: &ScenarioSpec, origin: &Path) -> Result<Program, ParamError> {
        Ok(match entry {
            KindEntry::Ranks(factory) => Program::Ranks(factory(spec)?),
            KindEntry::Command => {
                Program::Command(Arc::new(CommandProgram::from_spec(spec, origin)?))
            }
        })
    }

    /// Reads, parses, validates and builds the scenario file at `path`.
    ///
    /// # Errors
    /// [`ScenarioError`] naming the file, and the field where there is one.
    pub fn load_file(&self, path: &Path) -> Result<LoadedScenario, ScenarioError> {
        let text = crate::file::read_input(path)
            .and_then(|bytes| {
                String::from_utf8(bytes)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            })
            .map_err(|source| ScenarioError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        self.load_text(&text, path)
    }

    /// Parses, validates and builds a scenario from the text of a scenario file; `origin` stands
    /// for the file in errors and reports (its folder is `{scenario_dir}`). What `load_file`
    /// does after reading, so a scenario made elsewhere (the command line's
    /// `detcheck check -- PROGRAM`) has the same defaults, validation and errors as a file.
    ///
    /// # Errors
    /// [`ScenarioError`] naming `origin`, and the field where there is one.
    pub fn load_text(&self, text: &str, origin: &Path) -> Result<LoadedScenario, ScenarioError> {
        let spec = parse_spec(text).map_err(|e| ScenarioError::Invalid {
            path: origin.to_path_buf(),
            field: e.field,
            message: e.message,
        })?;
        self.build(spec, origin)
    }
}

/// The spec of one variant: its `params` laid over the spec's, and (a command) its environment
/// merged into `params.env` and its arguments appended to `params.command`.
fn variant_spec(
    spec: &ScenarioSpec,
    variant: &crate::scenario::Variant,
    is_command: bool,
) -> Result<ScenarioSpec, ParamError> {
    use serde_json::Value;
    if !is_command && !variant.env.is_empty() {
        return Err(ParamError::new(
            "env",
            "only a `command` scenario has an environment of its own; vary `params` instead",
        ));
    }
    if !is_command && !variant.args.is_empty() {
        return Err(ParamError::new(
            "args",
            "only a `command` scenario has arguments; vary `params` instead",
        ));
    }
    let mut varied = spec.clone();
    varied.variants = Vec::new();
    varied.checks = Vec::new();
    for (key, value) in &variant.params {
        varied.params.insert(key.clone(), value.clone());
    }
    if is_command {
        if !variant.env.is_empty() {
            let env = varied
                .params
                .entry("env")
                .or_insert_with(|| Value::Object(serde_json::Map::new()));
            let Value::Object(env) = env else {
                return Err(ParamError::new("params.env", "must be an object"));
            };
            for (key, value) in &variant.env {
                env.insert(key.clone(), Value::String(value.clone()));
            }
        }
        if !variant.args.is_empty() {
            let Some(Value::Array(command)) = varied.params.get_mut("command") else {
                return Err(ParamError::new(
                    "params.command",
                    "must be an array of strings",
                ));
            };
            command.extend(variant.args.iter().cloned().map(Value::String));
        }
    }
    Ok(varied)
}

/// The `workers`, `restart`, `variants`, `backends` and `batch_sizes` checks need a program
/// that can honour them, and sensible values.
fn validate_capabilities(
    spec: &ScenarioSpec,
    checks: &[CheckKind],
    program: &Program,
) -> Result<(), ParamError> {
    let capabilities = program.capabilities();
    let field = |check: CheckKind| match spec.checks.iter().position(|&c| c == check) {
        Some(i) => format!("checks[{i}]"),
        None => "checks".to_owned(),
    };
    if checks.contains(&CheckKind::Workers) {
        if !capabilities.loads_data {
            return Err(ParamError::new(
                field(CheckKind::Workers),
                format!(
                    "`workers` varies data-loader worker threads, but kind `{}` has no loader \
                     (the built-in kinds with one: dataloader, train)",
                    spec.kind
                ),
            ));
        }
        if spec.workers.len() < 2 {
            return Err(ParamError::new(
                "workers",
                "`workers` needs at least two worker counts to compare",
            ));
        }
    }
    if checks.contains(&CheckKind::Restart) {
        if !capabilities.resumes {
            return Err(ParamError::new(
                field(CheckKind::Restart),
                format!(
                    "`restart` resumes from a checkpoint, but kind `{}` does not write any \
                     (the built-in kinds that do: dataloader, train; a `command` scenario gives \
                     `params.restart`)",
                    spec.kind
                ),
            ));
        }
        let at = spec.restart_step();
        if at == 0 || at >= spec.steps {
            return Err(ParamError::new(
                if spec.restart_at.is_some() {
                    "restart_at"
                } else {
                    "steps"
                },
                format!(
                    "the restart check needs 1 <= restart_at < steps, but restart_at is {at} \
                     and steps is {}",
                    spec.steps
                ),
            ));
        }
    }
    if checks.contains(&CheckKind::Buckets) {
        if !capabilities.fuses_buckets {
            return Err(ParamError::new(
                field(CheckKind::Buckets),
                format!(
                    "`buckets` varies how gradients are fused into allreduce buckets, but kind \
                     `{}` has none (the built-in kind with them: train, without zero)",
                    spec.kind
                ),
            ));
        }
        if spec.buckets.len() < 2 {
            return Err(ParamError::new(
                "buckets",
                "`buckets` needs at least two bucket layouts to compare",
            ));
        }
        if let Some(i) = spec
            .buckets
            .iter()
            .position(|b| *b == crate::scenario::BucketLayout::Elements(0))
        {
            return Err(ParamError::new(
                format!("buckets[{i}]"),
                "a bucket holds at least one element",
            ));
        }
    }
    if checks.contains(&CheckKind::Variants) && spec.variants.is_empty() {
        return Err(ParamError::new(
            field(CheckKind::Variants),
            "`variants` runs each of the spec's `variants`, but the spec lists none",
        ));
    }
    if checks.contains(&CheckKind::BatchSizes) {
        if !matches!(program, Program::Command(_)) {
            return Err(ParamError::new(
                field(CheckKind::BatchSizes),
                format!(
                    "`batch_sizes` runs a program at each batch size (`{{batch}}` in its \
                     arguments), but kind `{}` is no `command` scenario",
                    spec.kind
                ),
            ));
        }
        if spec.batch_sizes.len() < 2 {
            return Err(ParamError::new(
                "batch_sizes",
                "`batch_sizes` needs at least two batch sizes to compare (`--batch-sizes 1,8`)",
            ));
        }
    }
    if checks.contains(&CheckKind::Backends) && matches!(program, Program::Command(_)) {
        return Err(ParamError::new(
            field(CheckKind::Backends),
            "`backends` compares detcheck's MPI ranks with its thread ranks; a `command` \
             scenario runs its own processes",
        ));
    }
    Ok(())
}

/// A scenario ready to run: its spec, its program, its checks.
#[derive(Clone)]
pub struct LoadedScenario {
    /// The trial name.
    pub name: String,
    /// The file it came from.
    pub origin: PathBuf,
    /// The checks to run, defaults applied.
    pub checks: Vec<CheckKind>,
    /// The spec as written.
    pub spec: ScenarioSpec,
    /// The program.
    pub program: Program,
    /// The spec and program of each of the spec's `variants`, in order (for the `variants`
    /// check; their own `checks` and `variants` are empty).
    pub variants: Vec<LoadedScenario>,
}

impl fmt::Debug for LoadedScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedScenario")
            .field("name", &self.name)
            .field("origin", &self.origin)
            .field("checks", &self.checks)
            .field("spec", &self.spec)
            .field("program", &self.program)
            .finish_non_exhaustive()
    }
}

/// Why scenarios could not be loaded. Each names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file or folder could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid scenario.
    #[error("{}: field `{field}`: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field, as a path (`params.hidden`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Two files give the same scenario name.
    #[error("{} and {} both name a scenario `{name}`", first.display(), second.display())]
    DuplicateName {
        /// The name.
        name: String,
        /// The first file.
        first: PathBuf,
        /// The second file.
        second: PathBuf,
    },
}

/// Loads every `*.json` file in `dir`, sorted by file name.
///
/// Returns one result per file, so that one bad file does not hide the others; a duplicate name is
/// reported on the second file.
///
/// # Errors
/// [`ScenarioError::Read`] when the folder cannot be listed.
pub fn discover_scenarios(
    dir: &Path,
    registry: &KindRegistry,
) -> Result<Vec<Result<LoadedScenario, ScenarioError>>, ScenarioError> {
    let read_error = |source| ScenarioError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let path = entry.map_err(read_error)?.path();
        if path.extension().is_some_and(|e| e == "json") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    Ok(files
        .into_iter()
        .map(|path| {
            let loaded = registry.load_file(&path)?;
            if let Some(first) = seen.get(&loaded.name) {
                return Err(ScenarioError::DuplicateName {
                    name: loaded.name,
                    first: first.clone(),
                    second: path,
                });
            }
            seen.insert(loaded.name.clone(), path);
            Ok(loaded)
        })
        .collect())
}
