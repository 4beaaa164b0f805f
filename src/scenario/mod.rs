//! Scenarios: deterministic rank programs and the JSON files that configure them.
//!
//! The jobs are split by file: `spec.rs` (the file as written, parsing and validation, the check
//! vocabulary), `context.rs` (what a rank program may use while it runs), `registry.rs` (kinds by
//! name, loading files, the default checks) and `builtin/` (the shipped kinds).
//!
//! A [`Scenario`] is a rank program: [`Scenario::run_rank`] runs on every rank with a
//! [`RankContext`] (communicator, recorder, seeds). A [`ScenarioSpec`] is a scenario file: world
//! size, steps, seed, reduction mode, the deterministic-communication switch, what is expected, and
//! the kind's own `params`. A [`KindRegistry`] turns a spec into a program; it knows the built-in
//! kinds (`seed`, `collective`, `dataloader`, `train`, `scatter`) and any a user registers.
//! [`discover_scenarios`] loads every `*.json` of a folder, in file-name order. A [`RunPlan`] is
//! what a check changes in one run (loader workers, where to stop, checkpoint, resume).
//!
//! Bad input: unknown fields are rejected, and every error names the file and the field
//! ([`ScenarioError`]); nothing panics on a bad file.
//!
//! Determinism: a program must draw randomness only from [`RankContext::stream`] and
//! [`RankContext::shared_stream`], and combine across ranks only through the communicator. The
//! built-in kinds can plant a source of nondeterminism on purpose (`params.plant`): those are the
//! negative controls.
//!
//! A kind declares what it supports with [`Capabilities`] (a data loader, checkpoints,
//! replicated records); the default checks of its scenario files follow from that, for a user's
//! kind as for the built-in ones.

mod builtin;
pub(crate) mod command;
mod context;
pub mod limits;
mod registry;
pub(crate) mod spec;

pub use command::{CommandProgram, Launcher, RestartArgs, RESERVED_ENV};
pub use context::{RankContext, RunPlan};
pub use limits::Footprint;
pub use registry::{discover_scenarios, KindFactory, KindRegistry, LoadedScenario, ScenarioError};
pub use spec::{BucketLayout, CheckKind, Device, Expectation, ParamError, ScenarioSpec, Variant};

use crate::comm::RankError;
use std::sync::Arc;

/// What a scenario runs: a rank program on detcheck's ranks, or a program of its own in fresh
/// processes (the `command` kind).
#[derive(Clone)]
pub enum Program {
    /// A [`Scenario`]: one call of `run_rank` per rank, on thread or MPI ranks.
    Ranks(Arc<dyn Scenario>),
    /// A command launched as processes, which write their trace files themselves.
    Command(Arc<CommandProgram>),
}

impl Program {
    /// What the program supports. A command is taken to record replicated tensors (the
    /// `replicas` check compares nothing when it records none) and to resume when the file
    /// gives its restart arguments.
    #[must_use]
    pub fn capabilities(&self) -> Capabilities {
        match self {
            Program::Ranks(program) => program.capabilities(),
            Program::Command(command) => {
                let mut supports = Capabilities::default().with_replicated_records();
                supports.resumes = command.restart.is_some();
                supports
            }
        }
    }

    /// What one rank holds and records in a world of `world_size` under `plan`: the rank
    /// program's own [`Scenario::footprint`]; a command's processes are their own (only their
    /// records are counted, [`limits::DEFAULT_RECORDS_PER_STEP`] per step).
    #[must_use]
    pub fn footprint(&self, world_size: usize, plan: &RunPlan) -> Footprint {
        match self {
            Program::Ranks(program) => program.footprint(world_size, plan),
            Program::Command(_) => Footprint::default(),
        }
    }

    /// The rank program, when this is one.
    #[must_use]
    pub fn ranks(&self) -> Option<&Arc<dyn Scenario>> {
        match self {
            Program::Ranks(program) => Some(program),
            Program::Command(_) => None,
        }
    }
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Program::Ranks(_) => f.write_str("Ranks(..)"),
            Program::Command(command) => f.debug_tuple("Command").field(command).finish(),
        }
    }
}

/// A deterministic rank program.
///
/// `run_rank` runs once on every rank of a world. It must draw randomness only from the context's
/// streams, exchange data only through `ctx.comm()` (all ranks calling the same collectives in the
/// same order), and record what it wants compared with `ctx.record*`.
///
/// # Example
///
/// A kind that allreduces a seeded vector and records the result on every rank:
///
/// ```
/// use detcheck::{
///     Capabilities, KindRegistry, ParamError, RankContext, RankError, ReduceOp, Scenario,
///     ScenarioSpec, Stream, Tensor,
/// };
/// use std::sync::Arc;
///
/// struct Sum;
///
/// impl Scenario for Sum {
///     fn run_rank(&self, ctx: &mut RankContext<'_>) -> Result<(), RankError> {
///         for step in 0..ctx.steps() {
///             let mut rng = ctx.stream(Stream::Data, step);
///             let mut t = Tensor::from_vec((0..8).map(|_| rng.normal_f32()).collect());
///             ctx.record(step, "local", &t);
///             ctx.allreduce(&mut t, ReduceOp::Sum)?;
///             ctx.record_replicated(step, "sum", &t);
///         }
///         Ok(())
///     }
///     fn capabilities(&self) -> Capabilities {
///         Capabilities::default().with_replicated_records()
///     }
/// }
///
/// let mut registry = KindRegistry::builtin();
/// registry.register("sum", |_spec: &ScenarioSpec| -> Result<Arc<dyn Scenario>, ParamError> {
///     Ok(Arc::new(Sum))
/// });
/// let spec = serde_json::from_str(
///     r#"{"kind": "sum", "world_size": 3, "steps": 2, "seed": 7, "reduction": "ring",
///         "deterministic_comm": true, "expect": "identical"}"#,
/// )
/// .unwrap();
/// let scenario = registry.build(spec, std::path::Path::new("sum.json")).unwrap();
/// // Replicated records: `replicas` joins `repeat` by default.
/// assert_eq!(scenario.checks.len(), 2);
/// let report = detcheck::run_checks(&scenario, &detcheck::CheckOptions::default()).unwrap();
/// assert!(report.passed());
/// ```
pub trait Scenario: Send + Sync {
    /// Runs this rank's part of the program.
    ///
    /// # Errors
    /// Any error fails the run and is reported with the rank.
    fn run_rank(&self, ctx: &mut RankContext<'_>) -> Result<(), RankError>;

    /// What the program supports; the default checks follow from it. None by default.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// What one rank holds at most while it runs in a world of `world_size` under `plan` (its
    /// tensors, its loader's queue), each part named by the parameter that drives it, and how
    /// many records it writes per step. A scenario is refused when the estimate of its run
    /// exceeds the memory available ([`limits`]). Nothing known by default: the records then
    /// count [`limits::DEFAULT_RECORDS_PER_STEP`] per step.
    fn footprint(&self, world_size: usize, plan: &RunPlan) -> Footprint {
        let _ = (world_size, plan);
        Footprint::default()
    }
}

/// What a kind's program supports. Each capability adds a check to the defaults of a scenario
/// expected to be identical, and is required by the check that uses it when a file asks for it.
///
/// Built with `Capabilities::default()` and the `with_*` methods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The program loads data with worker threads whose number comes from
    /// [`RankContext::loader_workers`]: the `workers` check.
    pub loads_data: bool,
    /// The program resumes from checkpoints: it calls [`RankContext::resume`] first and
    /// [`RankContext::save_checkpoint`] after its last step: the `restart` check.
    pub resumes: bool,
    /// The program records tensors every rank must hold bit for bit
    /// ([`RankContext::record_replicated`]): the `replicas` check.
    pub replicated_records: bool,
    /// The program fuses its gradients into allreduce buckets laid out as
    /// [`RankContext::bucket_layout`] says: the `buckets` check (not a default: a schedule
    /// such as `ring` is expected to depend on the layout).
    pub fuses_buckets: bool,
}

impl Capabilities {
    /// With a data loader (`workers`).
    #[must_use]
    pub fn with_loader(mut self) -> Self {
        self.loads_data = true;
        self
    }

    /// With checkpoints (`restart`).
    #[must_use]
    pub fn with_checkpoints(mut self) -> Self {
        self.resumes = true;
        self
    }

    /// With replicated records (`replicas`).
    #[must_use]
    pub fn with_replicated_records(mut self) -> Self {
        self.replicated_records = true;
        self
    }

    /// With gradient buckets (`buckets`).
    #[must_use]
    pub fn with_buckets(mut self) -> Self {
        self.fuses_buckets = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::spec::parse_spec;
    use super::*;
    use crate::value::reduce::ReductionMode;
    use std::path::{Path, PathBuf};

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    const GOOD: &str = r#"{"kind": "collective", "world_size": 3, "steps": 2, "seed": 1,
        "reduction": "ring", "deterministic_comm": true, "expect": "identical",
        "params": {"elements": 16}}"#;

    fn load_error(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "bad.json", text);
        let err = KindRegistry::builtin().load_file(&path).unwrap_err();
        err.to_string()
            .replace(&dir.path().display().to_string(), "DIR")
    }

    #[test]
    fn a_good_file_loads_with_default_name_and_checks() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "ring_3.json", GOOD);
        let loaded = KindRegistry::builtin().load_file(&path).unwrap();
        assert_eq!(loaded.name, "ring_3");
        // The collective kind records replicated results: `replicas` joins `repeat`.
        assert_eq!(loaded.checks, [CheckKind::Repeat, CheckKind::Replicas]);
        assert_eq!(loaded.spec.effective_mode(), ReductionMode::Ring);
    }

    /// A kind's capabilities decide its default checks, for a user's kind as for a built-in one.
    #[test]
    fn default_checks_follow_the_capabilities() {
        struct Kind(Capabilities);
        impl Scenario for Kind {
            fn run_rank(&self, _ctx: &mut RankContext<'_>) -> Result<(), RankError> {
                Ok(())
            }
            fn capabilities(&self) -> Capabilities {
                self.0
            }
        }
        let checks = |capabilities: Capabilities, expect: &str| {
            let mut registry = KindRegistry::builtin();
            registry.register("mine", move |_spec: &ScenarioSpec| {
                Ok(std::sync::Arc::new(Kind(capabilities)) as std::sync::Arc<dyn Scenario>)
            });
            let text = format!(
                r#"{{"kind": "mine", "world_size": 2, "steps": 4, "seed": 1,
                    "reduction": "ring", "deterministic_comm": true, "expect": "{expect}"}}"#
            );
            let spec = parse_spec(&text).unwrap();
            registry.build(spec, Path::new("mine.json")).unwrap().checks
        };
        use CheckKind::{Repeat, Replicas, Restart, Workers};
        assert_eq!(checks(Capabilities::default(), "identical"), [Repeat]);
        let all = Capabilities::default()
            .with_replicated_records()
            .with_loader()
            .with_checkpoints();
        assert_eq!(
            checks(
                Capabilities::default().with_replicated_records(),
                "identical"
            ),
            [Repeat, Replicas]
        );
        assert_eq!(
            checks(all, "identical"),
            [Repeat, Replicas, Workers, Restart]
        );
        assert_eq!(
            checks(all, "diverges"),
            [Repeat],
            "a control runs `repeat` only"
        );
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        assert_eq!(
            load_error(&GOOD.replace("\"seed\"", "\"sede\"")),
            "DIR/bad.json: field `sede`: unknown field `sede`, expected one of `name`, \
             `description`, `kind`, `world_size`, `steps`, `seed`, `reduction`, \
             `deterministic_comm`, `expect`, `checks`, `ignored`, `world_sizes`, `workers`, \
             `restart_at`, `buckets`, `variants`, `batch_sizes`, `params`, `device` at line 1 \
             column 58"
        );
        assert!(load_error(&GOOD.replace("\"ring\"", "\"fast\""))
            .starts_with("DIR/bad.json: field `reduction`: unknown variant `fast`"));
        assert!(load_error(&GOOD.replace("\"elements\"", "\"elems\""))
            .starts_with("DIR/bad.json: field `params.elems`: unknown field `elems`"));
        assert!(
            load_error(&GOOD.replace("\"world_size\": 3", "\"world_size\": 0"))
                .starts_with("DIR/bad.json: field `world_size`: must be between 1 and 1024")
        );
        assert!(load_error(&GOOD.replace("collective", "nosuch")).contains(
            "field `kind`: unknown kind `nosuch`; known kinds: collective, command, dataloader, scatter, seed, train"
        ));
        assert!(load_error("{\"kind\": ").contains("EOF while parsing a value at line 1"));
        assert!(load_error(&format!("{GOOD} trailing"))
            .starts_with("DIR/bad.json: field `(top level)`: trailing characters"));
        assert!(load_error(&GOOD.replace("\"steps\": 2,", "")).contains("missing field `steps`"));
    }

    /// Issue 16: every struct of a scenario file (the file itself, a variant, each built-in
    /// kind's params and their nested structs) given as an array of its fields is refused naming
    /// the field; serde's derive alone reads each of these by position. (`checks` entries and
    /// `buckets` layouts are enums, which serde already refuses as arrays.)
    #[test]
    fn a_struct_given_as_an_array_is_refused_naming_the_field() {
        let spec = |kind: &str, params: &str, rest: &str| {
            format!(
                r#"{{"kind": "{kind}", "world_size": 3, "steps": 2, "seed": 1, "reduction": "ring",
                    "deterministic_comm": true, "expect": "identical", "params": {{{params}}}{rest}}}"#
            )
        };
        let cases = [
            (
                r#"[null, "", "collective", 3, 2, 1, "ring", true, "identical"]"#.to_owned(),
                "(top level)",
            ),
            (
                spec("collective", "", r#", "variants": [[{}, [], {}]]"#),
                "variants[0]",
            ),
            (
                spec("collective", r#""fault": [2, 1, "panic"]"#, ""),
                "params.fault",
            ),
            (
                spec(
                    "collective",
                    "",
                    r#", "variants": [{"params": {"fault": [0, 1, "error"]}}]"#,
                ),
                "variants[0].params.fault",
            ),
            (
                spec("dataloader", r#""augment": [1]"#, ""),
                "params.augment",
            ),
            (
                spec(
                    "train",
                    r#""global_batch": 48, "dataset_size": 960, "augment": [0, false, 0.1]"#,
                    "",
                ),
                "params.augment",
            ),
            (
                spec(
                    "train",
                    r#""global_batch": 48, "dataset_size": 960, "optimizer": ["sgd", 0.1]"#,
                    "",
                ),
                "params.optimizer",
            ),
            (
                spec(
                    "command",
                    r#""command": ["true"], "restart": [["--stop"], ["--resume"]]"#,
                    "",
                ),
                "params.restart",
            ),
        ];
        let accepted: Vec<String> = cases
            .iter()
            .filter_map(|(text, field)| {
                let dir = tempfile::tempdir().unwrap();
                let path = write(dir.path(), "bad.json", text);
                let error = match KindRegistry::builtin().load_file(&path) {
                    Ok(_) => "accepted".to_owned(),
                    Err(e) => e
                        .to_string()
                        .replace(&dir.path().display().to_string(), "DIR"),
                };
                let wanted =
                    format!("DIR/bad.json: field `{field}`: expected an object, got an array");
                (!error.starts_with(&wanted)).then(|| format!("{field}: {error}"))
            })
            .collect();
        assert!(accepted.is_empty(), "{accepted:#?}");
    }

    /// A user's kind reads its params through [`ScenarioSpec::parse_params`], and so gets the
    /// same strictness at every depth of its own types.
    #[test]
    fn a_user_kind_reads_its_params_strictly() {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Window {
            #[allow(dead_code)]
            from: u64,
            #[allow(dead_code)]
            to: u64,
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct MineParams {
            #[allow(dead_code)]
            windows: Vec<Window>,
        }
        struct Mine;
        impl Scenario for Mine {
            fn run_rank(&self, _ctx: &mut RankContext<'_>) -> Result<(), RankError> {
                Ok(())
            }
        }
        let build = |params: &str| {
            let mut registry = KindRegistry::builtin();
            registry.register("mine", |spec: &ScenarioSpec| {
                let _: MineParams = spec.parse_params()?;
                Ok(std::sync::Arc::new(Mine) as std::sync::Arc<dyn Scenario>)
            });
            let text = format!(
                r#"{{"kind": "mine", "world_size": 2, "steps": 2, "seed": 1, "reduction": "ring",
                    "deterministic_comm": true, "expect": "identical", "params": {params}}}"#
            );
            registry
                .build(parse_spec(&text).unwrap(), Path::new("mine.json"))
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        build(r#"{"windows": [{"from": 0, "to": 1}]}"#).unwrap();
        let error = build(r#"{"windows": [{"from": 0, "to": 1}, [1, 2]]}"#).unwrap_err();
        assert!(
            error.starts_with(
                "mine.json: field `params.windows[1]`: expected an object, got an array"
            ),
            "{error}"
        );
    }

    #[test]
    fn discovery_sorts_files_and_reports_each_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "b.json", GOOD);
        write(dir.path(), "a.json", GOOD);
        write(dir.path(), "c.json", "not json");
        write(
            dir.path(),
            "d.json",
            &GOOD.replace("{\"kind\"", "{\"name\": \"a\", \"kind\""),
        );
        write(dir.path(), "notes.txt", "ignored");
        let found = discover_scenarios(dir.path(), &KindRegistry::builtin()).unwrap();
        assert_eq!(found.len(), 4);
        assert_eq!(found[0].as_ref().unwrap().name, "a");
        assert_eq!(found[1].as_ref().unwrap().name, "b");
        assert!(found[2]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("c.json"));
        assert!(matches!(
            found[3].as_ref().unwrap_err(),
            ScenarioError::DuplicateName { .. }
        ));
        let missing = discover_scenarios(&dir.path().join("nope"), &KindRegistry::builtin());
        assert!(missing.unwrap_err().to_string().starts_with("cannot read "));
    }

    /// The (field, message) of the error of building `kind` with `params`, on a machine with
    /// 16 GB available; `None` when it builds.
    fn refusal(kind: &str, params: &str) -> Option<(String, String)> {
        let text = format!(
            r#"{{"kind": "{kind}", "world_size": 4, "steps": 3, "seed": 1, "reduction": "ring",
                "deterministic_comm": true, "expect": "identical", "params": {{{params}}}}}"#
        );
        let spec = match parse_spec(&text) {
            Ok(spec) => spec,
            Err(e) => return Some((e.field, e.message)),
        };
        let registry = KindRegistry::builtin().with_available_memory(16_000_000_000);
        match registry.build(spec, Path::new("big.json")) {
            Ok(_) => None,
            Err(ScenarioError::Invalid { field, message, .. }) => Some((field, message)),
            Err(other) => panic!("{other}"),
        }
    }

    /// Issue 16: every size of a scenario at 10^10 and at 2^63 is refused naming its field,
    /// before any rank starts (it aborted on allocation, or panicked with `capacity overflow`).
    #[test]
    fn every_size_field_at_1e10_and_2_pow_63_is_refused_naming_the_field() {
        let cases: [(&str, &str); 14] = [
            ("seed", "elements"),
            ("collective", "elements"),
            ("dataloader", "dataset_size"),
            ("dataloader", "channels"),
            ("dataloader", "height"),
            ("dataloader", "width"),
            ("dataloader", "batch_size"),
            ("dataloader", "prefetch"),
            ("dataloader", "workers"),
            ("train", "input_dim"),
            ("train", "hidden"),
            ("train", "classes"),
            ("train", "prefetch"),
            ("train", "workers"),
        ];
        for (kind, field) in cases {
            for value in [10_000_000_000u64, 1 << 63] {
                let (got, message) = refusal(kind, &format!(r#""{field}": {value}"#))
                    .unwrap_or_else(|| panic!("{kind} {field} {value} was accepted"));
                assert_eq!(got, format!("params.{field}"), "{kind} {value}: {message}");
            }
        }
        // Sizes that must stay multiples of the batch.
        for value in [10_000_000_000u64 * 64, 1 << 63] {
            let (got, message) = refusal("train", &format!(r#""dataset_size": {value}"#)).unwrap();
            assert_eq!(got, "params.dataset_size", "{message}");
            let params = format!(r#""global_batch": {value}, "dataset_size": {value}"#);
            let (got, message) = refusal("train", &params).unwrap();
            assert!(
                got == "params.global_batch" || got == "params.dataset_size",
                "{message}"
            );
        }
        // A class count costs no memory in a dataloader: refused only above the hard maximum.
        assert_eq!(refusal("dataloader", r#""classes": 10000000000"#), None);
        let (got, message) = refusal("dataloader", r#""classes": 9223372036854775808"#).unwrap();
        assert_eq!(got, "params.classes");
        assert!(
            message.contains("must be at most 1099511627776"),
            "{message}"
        );
        // The memory estimate is in the message, with the available bytes.
        let (_, message) = refusal("seed", r#""elements": 10000000000"#).unwrap();
        assert!(
            message.starts_with("the run would hold about 1.1 TB (params.elements 1.1 TB"),
            "{message}"
        );
        assert!(message.contains("more than the 16.0 GB available (set by a test)"));
    }

    /// `steps` has a hard maximum, and within it the traces a check keeps count in the estimate.
    #[test]
    fn steps_are_bounded_and_counted_in_the_estimate() {
        let steps = |n: u64| format!(r#", "steps": {n}"#);
        let with_steps = |n: u64| {
            let text = format!(
                r#"{{"kind": "collective", "world_size": 4, "seed": 1, "reduction": "ring",
                    "deterministic_comm": true, "expect": "identical"{}}}"#,
                steps(n)
            );
            let spec = parse_spec(&text).unwrap();
            KindRegistry::builtin()
                .with_available_memory(16_000_000_000)
                .build(spec, Path::new("long.json"))
        };
        let message = |n| match with_steps(n) {
            Err(ScenarioError::Invalid { field, message, .. }) => {
                assert_eq!(field, "steps");
                message
            }
            other => panic!("{other:?}"),
        };
        assert!(message(1_000_000_000).starts_with("must be between 1 and 1000000"));
        assert!(message(1_000_000).starts_with("the run would hold about"));
        assert!(with_steps(10_000).is_ok());
    }

    /// World sizes above the documented maximum are refused naming the field.
    #[test]
    fn world_sizes_above_the_maximum_are_refused() {
        assert_eq!(refusal("seed", ""), None);
        let error = |text: &str| load_error(&GOOD.replace("\"world_size\": 3", text));
        assert!(error("\"world_size\": 1025")
            .starts_with("DIR/bad.json: field `world_size`: must be between 1 and 1024, got 1025"));
        assert!(error(r#""world_size": 3, "world_sizes": [2, 4096]"#)
            .starts_with("DIR/bad.json: field `world_sizes[1]`: must be between 1 and 1024"));
        assert!(error(r#""world_size": 18446744073709551615"#)
            .starts_with("DIR/bad.json: field `world_size`: must be between 1 and 1024"));
    }

    /// The `batch_sizes` check (issue 56): a `command` scenario with at least two sizes, each
    /// in range and none twice; every refusal names its field.
    #[test]
    fn batch_sizes_need_a_command_and_two_distinct_sizes_in_range() {
        let command = |extra: &str| {
            format!(
                r#"{{"kind": "command", "world_size": 1, "steps": 2, "seed": 1,
                    "expect": "identical"{extra},
                    "params": {{"command": ["gen", "--batch-size", "{{batch}}"]}}}}"#
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "ok.json",
            &command(r#", "checks": ["batch_sizes"], "batch_sizes": [1, 8]"#),
        );
        let loaded = KindRegistry::builtin().load_file(&path).unwrap();
        assert_eq!(loaded.checks, [CheckKind::BatchSizes]);
        assert_eq!(loaded.spec.batch_sizes, [1, 8]);
        // Sizes without the check are kept for `{batch}` (every run at the first).
        let path = write(
            dir.path(),
            "sizes.json",
            &command(r#", "batch_sizes": [4, 2]"#),
        );
        let loaded = KindRegistry::builtin().load_file(&path).unwrap();
        assert!(!loaded.checks.contains(&CheckKind::BatchSizes));
        let cases = [
            (
                command(r#", "checks": ["batch_sizes"], "batch_sizes": [8]"#),
                "field `batch_sizes`: `batch_sizes` needs at least two batch sizes",
            ),
            (
                command(r#", "checks": ["batch_sizes"]"#),
                "field `batch_sizes`: `{batch}` in params.command[2] needs the batch sizes",
            ),
            (
                command(r#", "checks": ["batch_sizes"], "batch_sizes": [0, 8]"#),
                "field `batch_sizes[0]`: must be between 1 and 1048576, got 0",
            ),
            (
                command(r#", "batch_sizes": [1, 1048577]"#),
                "field `batch_sizes[1]`: must be between 1 and 1048576, got 1048577",
            ),
            (
                command(r#", "checks": ["batch_sizes"], "batch_sizes": [1, 8, 1]"#),
                "field `batch_sizes[2]`: 1 is listed twice",
            ),
            (
                command(r#", "batch_sizes": [1, -8]"#),
                "field `batch_sizes[1]`: invalid value",
            ),
            (
                GOOD.replace(
                    "\"params\"",
                    r#""checks": ["repeat", "batch_sizes"], "batch_sizes": [1, 8], "params""#,
                ),
                "field `checks[1]`: `batch_sizes` runs a program at each batch size",
            ),
        ];
        for (text, expected) in cases {
            let error = load_error(&text);
            assert!(
                error.starts_with(&format!("DIR/bad.json: {expected}")),
                "{error}"
            );
        }
    }

    /// Issue 16: a 70,000-character name panicked `check` (a format width over 65,535).
    #[test]
    fn names_are_bounded_and_cannot_be_paths() {
        let named =
            |name: &str| GOOD.replace("{\"kind\"", &format!("{{\"name\": \"{name}\", \"kind\""));
        assert!(load_error(&named(&"a".repeat(70_000)))
            .starts_with("DIR/bad.json: field `name`: must be at most 200 bytes"));
        assert!(load_error(&named("../x")).contains("field `name`: must not contain `/`"));
        // Issue 16's black-box battery: a NUL was accepted, then no report page could be named.
        for control in ["\\u0000", "\\u0001", "\\u007f"] {
            assert!(load_error(&named(&format!("a{control}b")))
                .contains("field `name`: must not contain control characters"));
        }
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "ok.json", &named(&"a".repeat(200)));
        assert!(KindRegistry::builtin().load_file(&path).is_ok());
    }

    /// The estimates stay far below a laptop's memory for every shipped scenario: the limits
    /// refuse sizes, not the scenarios detcheck ships.
    #[test]
    fn the_shipped_scenarios_are_estimated_small() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let registry = KindRegistry::builtin().with_available_memory(1 << 30);
        for loaded in discover_scenarios(&dir, &registry).unwrap() {
            let loaded = loaded.unwrap();
            let estimate = limits::estimate(&loaded.spec, &loaded.checks, &loaded.program);
            eprintln!("{}: {}", loaded.name, limits::show_bytes(estimate.total()));
            assert!(
                estimate.total() < 200_000_000,
                "{}: {estimate:?}",
                loaded.name
            );
        }
    }

    #[test]
    fn the_switch_off_means_arrival_order() {
        let spec = parse_spec(&GOOD.replace(
            "\"deterministic_comm\": true",
            "\"deterministic_comm\": false",
        ))
        .unwrap();
        assert_eq!(spec.effective_mode(), ReductionMode::ArrivalOrder);
    }
}
