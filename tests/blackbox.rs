//! The black-box battery: the `detcheck` binary driven as a hostile user would (issue 16's
//! "a re-run of the same black-box cases finds none of them"), over a few thousand generated
//! cases, each checked against the README's exit-code table.
//!
//! Each case writes its files (a scenario, a dump, a checkpoint or an msprobe dump with one thing
//! altered) into a folder of its own, runs the binary there, and checks how it ended: never a
//! panic (exit 101, "panicked at"), an abort ("memory allocation of"), a signal or a hang (each
//! case has [`CASE_SECONDS`], then it is killed and reported as a hang); always one of the codes
//! the case allows, and for exit 2 a message that names the file, field or flag. An altered trace
//! or checkpoint must be exit 2: never 0 ("identical") or 1. The classes (docs/fuzzing.md, section
//! "Black-box battery"):
//!
//! | class | what is altered | command | allowed |
//! | --- | --- | --- | --- |
//! | `lock` | two `run --dump` into one folder at once; a second started while a first runs | `run` | one 0, one 2 naming the folder (and the holder); the dump identical to a lone run's |
//! | `sizes` | every size or count of every built-in kind and of the file at hostile values; names | `run` | 0, or 2 naming the field |
//! | `shapes` | objects and arrays of the scenario file replaced by other JSON shapes, unknown fields | `run` | 2 naming the field (0 where the shape is valid) |
//! | `flags` | flags out of range, of the wrong type, unknown; missing and unwritable paths | any | 2 naming the flag or file |
//! | `traces` | md5, stats and full dumps: byte flips, truncations, trailing bytes, tensor files, mixed dumps | `compare` | 2 naming the file |
//! | `checkpoints` | the checkpoint JSON's digits and bytes, its safetensors file | `run --resume` | 2 naming the file |
//! | `inputs` | FIFOs, devices and folders as input files; msprobe dump.json cut, followed by bytes, flipped; NaN/Infinity | any | 2 naming the file (msprobe flips: 0, 1 or 2) |
//!
//! Budget: `cargo test --test blackbox` runs a deterministic subset (every [`DEFAULT_STRIDE`]-th
//! case of each class, one trial of each lock race: seconds in a debug build);
//! `DETCHECK_BLACKBOX=full` runs every case (CI, with `DETCHECK_BLACKBOX_BIN=target/release/detcheck`
//! to drive the release binary); `DETCHECK_BLACKBOX_CLASS=traces` runs one class. Cases run on
//! [`THREADS`] threads; the order of cases, and so the subset, is a pure function of the code.
//! A summary table per class is printed; every failure is saved (its files before the run, the
//! command line and what the binary printed) under `target/blackbox-failures/<class>-<index>/`.
//!
//! Limits: a case checks the exit code and the names in the message, not the whole text; the
//! lock races depend on timing (each outcome allowed is one the README allows).

use detcheck::launch::shell_quote;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Cases run at once (the machine the battery was written for has two cores).
const THREADS: usize = 2;
/// The longest a case may run before it is killed and reported as a hang.
const CASE_SECONDS: u64 = 60;
/// Without `DETCHECK_BLACKBOX=full`, every this many-th case of each class runs.
const DEFAULT_STRIDE: usize = 8;

/// Codes an altered file may end with: bad input only.
const BAD_INPUT: &[i32] = &[2];
/// A value that may be valid (then the run is written) or refused naming it.
const OK_OR_BAD_INPUT: &[i32] = &[0, 2];

// ---------------------------------------------------------------------------------------------
// Cases

/// One black-box case: files to write, then what to run and what it may end with.
struct Case {
    class: &'static str,
    /// What is altered, for the report.
    what: String,
    /// Written into the case's folder before it runs (paths relative to it).
    files: Files,
    action: Action,
}

/// A case's files: (path relative to its folder, content), written in order.
type Files = Vec<(String, Content)>;

enum Content {
    Bytes(Vec<u8>),
    /// A file or folder copied as it is (recursively).
    Copy(PathBuf),
    Fifo,
    Dir,
    /// A file copied before is removed.
    Removed,
}

enum Action {
    /// One invocation.
    Run { args: Vec<String>, expect: Expect },
    /// Two `run SCENARIO --dump DUMP` at once, or (`staggered`) the second started once the
    /// first holds the folder: exactly one writes the dump, the other is refused naming the
    /// folder; the dump then compares identical to `reference`.
    Race {
        scenario: String,
        dump: String,
        reference: String,
        staggered: bool,
    },
}

/// What one invocation may end with.
struct Expect {
    codes: &'static [i32],
    /// With exit 2, the message (stderr) must hold each of these.
    names: Vec<String>,
    /// With exit 2 and a message "at byte N", N must be below this (the file's length).
    offset_below: Option<usize>,
}

impl Expect {
    fn bad_input(names: &[&str]) -> Expect {
        Expect::codes(BAD_INPUT, names)
    }

    fn codes(codes: &'static [i32], names: &[&str]) -> Expect {
        Expect {
            codes,
            names: names.iter().map(|name| name.to_string()).collect(),
            offset_below: None,
        }
    }
}

fn run_case(
    class: &'static str,
    what: String,
    files: Files,
    args: &[&str],
    expect: Expect,
) -> Case {
    Case {
        class,
        what,
        files,
        action: Action::Run {
            args: args.iter().map(|arg| arg.to_string()).collect(),
            expect,
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Scenario files as text (raw JSON literals: 2^64 and 1e300 are not serde_json values)

/// A scenario file: top-level fields and `params`, each a raw JSON value, in order.
#[derive(Clone)]
struct ScenarioText {
    top: Vec<(String, String)>,
    params: Vec<(String, String)>,
}

impl ScenarioText {
    /// A small, fast scenario of a built-in kind (2 ranks, 2 steps, small sizes).
    fn base(kind: &str) -> ScenarioText {
        let params: &[(&str, &str)] = match kind {
            "seed" => &[("elements", "16"), ("dropout", "0.1")],
            "collective" => &[("elements", "16")],
            "dataloader" => &[
                ("dataset_size", "16"),
                ("channels", "1"),
                ("height", "4"),
                ("width", "4"),
                ("classes", "2"),
                ("batch_size", "2"),
                ("workers", "1"),
                ("prefetch", "1"),
                (
                    "augment",
                    r#"{"crop_padding": 1, "flip": true, "noise_std": 0.05}"#,
                ),
            ],
            "train" => &[
                ("input_dim", "4"),
                ("hidden", "4"),
                ("classes", "2"),
                ("dataset_size", "16"),
                ("global_batch", "4"),
                ("dropout", "0.1"),
                ("workers", "1"),
                ("prefetch", "1"),
                ("bucket", r#"{"elements": 8}"#),
                ("augment", r#"{"noise_std": 0.05}"#),
                (
                    "optimizer",
                    r#"{"kind": "sgd", "lr": 0.05, "momentum": 0.9}"#,
                ),
            ],
            other => panic!("no base scenario of kind {other}"),
        };
        let top = [
            ("kind", format!("\"{kind}\"")),
            ("world_size", "2".into()),
            ("steps", "2".into()),
            ("seed", "1".into()),
            ("reduction", "\"ring\"".into()),
            ("deterministic_comm", "true".into()),
            ("expect", "\"identical\"".into()),
        ];
        ScenarioText {
            top: top.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// Sets (or adds) a field: `params.x` sets a parameter, another name a top-level field.
    fn with(mut self, field: &str, value: &str) -> ScenarioText {
        let (list, key) = match field.strip_prefix("params.") {
            Some(key) => (&mut self.params, key),
            None => (&mut self.top, field),
        };
        match list.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.to_string(),
            None => list.push((key.to_string(), value.to_string())),
        }
        self
    }

    fn text(&self) -> String {
        let object = |fields: &[(String, String)]| {
            let inner: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("\"{k}\": {v}"))
                .collect();
            format!("{{{}}}", inner.join(", "))
        };
        let mut top = self.top.clone();
        top.push(("params".into(), object(&self.params)));
        object(&top)
    }

    fn file(&self) -> Files {
        vec![("case.json".into(), Content::Bytes(self.text().into_bytes()))]
    }
}

/// `run case.json --dump out` on a scenario text: the command of the `sizes` and `shapes` cases.
fn run_scenario(
    class: &'static str,
    what: String,
    scenario: &ScenarioText,
    expect: Expect,
) -> Case {
    run_case(
        class,
        what,
        scenario.file(),
        &["run", "case.json", "--dump", "out"],
        expect,
    )
}

// ---------------------------------------------------------------------------------------------
// The classes

/// Finding 1: two runs into one folder.
fn lock_cases(base: &Base, trials: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    for trial in 0..trials {
        for staggered in [false, true] {
            cases.push(Case {
                class: "lock",
                what: format!(
                    "trial {trial}: two `run --dump` into one folder{}",
                    if staggered {
                        ", the second once the first holds it"
                    } else {
                        " at once"
                    }
                ),
                files: vec![
                    (
                        "case.json".into(),
                        Content::Copy(base.slow_scenario.clone()),
                    ),
                    (
                        "reference".into(),
                        Content::Copy(base.slow_reference.clone()),
                    ),
                ],
                action: Action::Race {
                    scenario: "case.json".into(),
                    dump: "out".into(),
                    reference: "reference".into(),
                    staggered,
                },
            });
        }
    }
    cases
}

/// Hostile values of a size or count.
const SIZE_VALUES: [&str; 11] = [
    "0",
    "1",
    "-1",
    "10000000000",
    "9007199254740992",
    "9223372036854775808",
    "18446744073709551616",
    "1e300",
    "\"10\"",
    "null",
    "true",
];

/// Finding 2: every size and count of every built-in kind, and of the file.
fn size_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    // (kind, field, template of the value (`X` is replaced), the field errors name)
    let mut fields: Vec<(&str, String, &str, String)> = Vec::new();
    for kind in ["collective", "train"] {
        for field in ["world_size", "steps", "seed", "restart_at"] {
            fields.push((kind, field.into(), "X", field.into()));
        }
        fields.push((kind, "world_sizes".into(), "[X]", "world_sizes".into()));
        fields.push((kind, "workers".into(), "[X]", "workers".into()));
        fields.push((
            kind,
            "buckets".into(),
            r#"[{"elements": X}]"#,
            "buckets".into(),
        ));
    }
    let params: [(&str, &[&str]); 4] = [
        ("seed", &["elements", "dropout"]),
        ("collective", &["elements"]),
        (
            "dataloader",
            &[
                "dataset_size",
                "channels",
                "height",
                "width",
                "classes",
                "batch_size",
                "workers",
                "prefetch",
            ],
        ),
        (
            "train",
            &[
                "input_dim",
                "hidden",
                "classes",
                "dataset_size",
                "global_batch",
                "dropout",
                "workers",
                "prefetch",
            ],
        ),
    ];
    for (kind, names) in params {
        for name in names {
            fields.push((
                kind,
                format!("params.{name}"),
                "X",
                format!("params.{name}"),
            ));
        }
    }
    for (kind, field, template, named) in [
        (
            "dataloader",
            "params.augment",
            r#"{"crop_padding": X, "flip": true, "noise_std": 0.05}"#,
            "params.augment.crop_padding",
        ),
        (
            "dataloader",
            "params.augment",
            r#"{"crop_padding": 1, "flip": true, "noise_std": X}"#,
            "params.augment.noise_std",
        ),
        (
            "train",
            "params.bucket",
            r#"{"elements": X}"#,
            "params.bucket",
        ),
        (
            "train",
            "params.optimizer",
            r#"{"kind": "sgd", "lr": X, "momentum": 0.9}"#,
            "params.optimizer.lr",
        ),
        (
            "collective",
            "params.fault",
            r#"{"rank": X, "step": 0, "kind": "error"}"#,
            "params.fault.rank",
        ),
        (
            "collective",
            "params.fault",
            r#"{"rank": 0, "step": X, "kind": "error"}"#,
            "params.fault.step",
        ),
    ] {
        fields.push((kind, field.into(), template, named.into()));
    }
    for (kind, field, template, named) in fields {
        // A planted fault that is valid fails its run on purpose (exit 3).
        let codes: &'static [i32] = if field == "params.fault" {
            &[0, 2, 3]
        } else {
            OK_OR_BAD_INPUT
        };
        // The message names the field by its path, or (a relation between fields, such as
        // global_batch dividing dataset_size) names a field and this one; an optimizer's fields
        // are named by the optimizer's path (serde reads a tagged enum as a whole).
        let leaf = match named.as_str() {
            "params.optimizer.lr" => "`params.optimizer",
            other => other.rsplit('.').next().unwrap_or(other),
        };
        for value in SIZE_VALUES {
            let scenario = ScenarioText::base(kind).with(&field, &template.replace('X', value));
            cases.push(run_scenario(
                "sizes",
                format!("{kind}: `{named}` = {value}"),
                &scenario,
                Expect::codes(codes, &["case.json: field `", leaf]),
            ));
        }
    }
    // The issue's own values: steps 10^9, world sizes of 0, 1025 and 10^6.
    for kind in ["seed", "collective", "dataloader", "train"] {
        for (field, value) in [
            ("steps", "1000000000"),
            ("world_size", "0"),
            ("world_size", "1025"),
            ("world_size", "1000000"),
        ] {
            let scenario = ScenarioText::base(kind).with(field, value);
            cases.push(run_scenario(
                "sizes",
                format!("{kind}: `{field}` = {value}"),
                &scenario,
                Expect::bad_input(&["case.json", &format!("`{field}`")]),
            ));
        }
    }
    // Names: at the maximum (valid), one past it, far past it, and with path characters.
    let long = |n: usize| format!("\"{}\"", "n".repeat(n));
    let names: [(String, &'static [i32]); 9] = [
        (long(200), &[0]),
        (long(201), BAD_INPUT),
        (long(65_536), BAD_INPUT),
        (long(70_000), BAD_INPUT),
        ("\"a/b\"".into(), BAD_INPUT),
        ("\"../escape\"".into(), BAD_INPUT),
        ("\"a\\u0000b\"".into(), BAD_INPUT),
        ("\"\"".into(), BAD_INPUT),
        ("\"a\\\\b\"".into(), BAD_INPUT),
    ];
    for (value, codes) in names {
        let scenario = ScenarioText::base("collective").with("name", &value);
        let shown: String = value.chars().take(24).collect();
        cases.push(run_scenario(
            "sizes",
            format!("`name` = {shown}... ({} bytes)", value.len()),
            &scenario,
            Expect::codes(codes, &["case.json", "`name`"]),
        ));
    }
    cases
}

/// Finding 6 (part): objects and arrays of the file given as other JSON shapes.
fn shape_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    // (kind, field, wrong shapes, the field the message names)
    let object_shapes: &[&str] = &["[1]", "[]", "1", "\"x\"", "true", "[{}]"];
    let array_shapes: &[&str] = &["{\"a\": 1}", "1", "\"x\"", "true", "[[1]]", "[{}]"];
    let mut fields: Vec<(&str, &str, &[&str])> = vec![
        ("dataloader", "params.augment", object_shapes),
        ("train", "params.augment", object_shapes),
        ("train", "params.optimizer", object_shapes),
        (
            "train",
            "params.bucket",
            &["[1]", "[]", "1", "true", "\"bogus\""],
        ),
        ("collective", "params.fault", object_shapes),
        ("collective", "checks", array_shapes),
        ("collective", "world_sizes", array_shapes),
        ("collective", "workers", array_shapes),
        (
            "train",
            "buckets",
            &[
                "{\"a\": 1}",
                "1",
                "[[1]]",
                "[{\"elements\": [1]}]",
                "[\"bogus\"]",
            ],
        ),
        (
            "collective",
            "variants",
            &[
                "{\"a\": 1}",
                "1",
                "[1]",
                "[[1]]",
                "[{\"params\": [1]}]",
                "[{\"env\": [1]}]",
                "[{\"params\": {\"elements\": [1]}}]",
            ],
        ),
        ("collective", "kind", &["1", "[]", "\"bogus\"", "null"]),
        ("collective", "expect", &["1", "[]", "\"maybe\"", "null"]),
        ("collective", "reduction", &["1", "[\"ring\"]", "\"bogus\""]),
        ("collective", "deterministic_comm", &["1", "\"yes\"", "[]"]),
        ("collective", "seed", &["-1", "1.5", "\"1\"", "[]", "{}"]),
        ("collective", "ignored", &["1", "\"yes\""]),
        ("collective", "description", &["1", "[]", "{}"]),
        ("seed", "params.plant", &["1", "[]", "\"bogus\""]),
        ("collective", "params.dtype", &["1", "\"f128\"", "[]"]),
        ("collective", "params.op", &["1", "\"mean\"", "{}"]),
        ("dataloader", "params.delivery", &["1", "\"bogus\""]),
        ("dataloader", "params.shuffle", &["1", "\"yes\""]),
        ("train", "params.zero", &["1", "\"yes\""]),
        ("train", "params.dropout_rng", &["1", "\"bogus\""]),
    ];
    fields.push(("collective", "params", &["[1]", "[]", "1", "\"x\"", "true"]));
    for (kind, field, shapes) in fields {
        for shape in shapes {
            let scenario = ScenarioText::base(kind).with(field, shape);
            cases.push(run_scenario(
                "shapes",
                format!("{kind}: `{field}` = {shape}"),
                &scenario,
                Expect::bad_input(&["case.json", &format!("`{field}")]),
            ));
        }
    }
    // Unknown fields, at the top, in params and deeper.
    for (kind, field, value, named) in [
        ("collective", "bogus", "1", "bogus"),
        ("collective", "params.bogus", "1", "bogus"),
        (
            "dataloader",
            "params.augment",
            r#"{"crop_padding": 1, "bogus": 1}"#,
            "bogus",
        ),
        (
            "train",
            "params.optimizer",
            r#"{"kind": "sgd", "lr": 0.1, "bogus": 1}"#,
            "bogus",
        ),
    ] {
        let scenario = ScenarioText::base(kind).with(field, value);
        cases.push(run_scenario(
            "shapes",
            format!("{kind}: unknown `{field}`"),
            &scenario,
            Expect::bad_input(&["case.json", named]),
        ));
    }
    // The whole file as another shape, or not JSON.
    for text in [
        "[1]",
        "1",
        "\"x\"",
        "null",
        "[]",
        "",
        "{",
        "{}",
        "\u{feff}{}",
        "{\"kind\": \"seed\"} x",
    ] {
        cases.push(run_case(
            "shapes",
            format!("the whole file: {text:?}"),
            vec![("case.json".into(), Content::Bytes(text.as_bytes().to_vec()))],
            &["run", "case.json", "--dump", "out"],
            Expect::bad_input(&["case.json"]),
        ));
    }
    cases
}

/// Flags out of range, of the wrong type or unknown; paths that are missing or cannot be written.
fn flag_cases(base: &Base) -> Vec<Case> {
    let mut cases = Vec::new();
    let scenario = || {
        vec![(
            "case.json".to_string(),
            Content::Bytes(ScenarioText::base("collective").text().into_bytes()),
        )]
    };
    let dumps = || {
        vec![
            ("a".to_string(), Content::Copy(base.dump("stats"))),
            ("b".to_string(), Content::Copy(base.dump("stats"))),
        ]
    };
    let train = || {
        vec![(
            "case.json".to_string(),
            Content::Copy(base.train_scenario.clone()),
        )]
    };
    let train_dumps = || {
        vec![
            ("a".to_string(), Content::Copy(base.dir.join("train-first"))),
            ("b".to_string(), Content::Copy(base.dir.join("train-first"))),
        ]
    };
    let run = |flag: &str, value: &str| -> Vec<String> {
        vec![
            "run".into(),
            "case.json".into(),
            "--dump".into(),
            "out".into(),
            flag.into(),
            value.into(),
        ]
    };
    // (files, arguments, the flag)
    let mut list: Vec<(Files, Vec<String>, &str)> = Vec::new();
    for (flag, values) in [
        ("--mode", &["bogus", "", "MD5", "1"][..]),
        ("--perturb", &["0", "3", "-1", "18446744073709551616", "x"]),
        (
            "--deadline",
            &["604801", "18446744073709551616", "-1", "1e300", "nan", "x"],
        ),
        ("--workers", &["65", "-1", "1000000", "x"]),
        ("--stop-at", &["-1", "18446744073709551616", "x"]),
        ("--resume", &["missing", "case.json"]),
        ("--checkpoint", &["case.json"]),
    ] {
        for value in values {
            let files = match flag {
                "--resume" | "--checkpoint" => train(),
                _ => scenario(),
            };
            list.push((files, run(flag, value), flag));
        }
    }
    for (flag, value) in [
        ("--deadline", "604801"),
        ("--deadline", "-5"),
        ("--format", "xml"),
        ("--junit", "case.json/x.xml"),
        ("--report-dir", "case.json"),
        ("--bogus", "1"),
    ] {
        list.push((
            scenario(),
            vec![
                "check".into(),
                "case.json".into(),
                "--no-progress".into(),
                flag.into(),
                value.into(),
            ],
            flag,
        ));
    }
    for (flag, value) in [
        ("--max-rows", "-1"),
        ("--max-rows", "x"),
        ("--map", "missing/x.png"),
        ("--map", "a"),
    ] {
        list.push((
            dumps(),
            vec![
                "compare".into(),
                "a".into(),
                "b".into(),
                flag.into(),
                value.into(),
            ],
            flag,
        ));
    }
    for (flag, value) in [
        ("--atol", "-1"),
        ("--atol", "nan"),
        ("--rtol", "-1e300"),
        ("--rtol", "inf"),
        ("--name", "bogus"),
        ("--plot", "missing/x"),
    ] {
        list.push((
            train_dumps(),
            vec![
                "curves".into(),
                "a".into(),
                "b".into(),
                flag.into(),
                value.into(),
            ],
            flag,
        ));
    }
    for (flag, value) in [("--stack", "bogus"), ("--bogus", "1")] {
        list.push((
            Vec::new(),
            vec!["env".into(), flag.into(), value.into()],
            flag,
        ));
    }
    for (files, args, flag) in list {
        let what = args.join(" ");
        // A value the flag's parser refuses names the flag; one refused later names the flag or
        // the path it was given.
        // A value that starts with `-` is taken for a flag by the parser, which names it.
        let value = args.last().cloned().unwrap_or_default();
        let names_path = matches!(
            flag,
            "--junit" | "--map" | "--plot" | "--resume" | "--checkpoint" | "--name"
        );
        let named = if value.starts_with('-') {
            "unexpected argument '-".to_string()
        } else if names_path {
            value.clone()
        } else {
            flag.to_string()
        };
        // Valid, though not what the help shows: any run number is a perturbation (check's
        // restart uses runs 3 and 4); an infinite tolerance (numpy's allclose takes it too); a
        // report folder that is a file, while no check fails and nothing is written there.
        let codes: &'static [i32] = match (flag, value.as_str()) {
            ("--perturb", "3") | ("--rtol", "inf") | ("--report-dir", _) => OK_OR_BAD_INPUT,
            _ => BAD_INPUT,
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cases.push(run_case(
            "flags",
            what,
            files,
            &args,
            Expect::codes(codes, &[&named]),
        ));
    }
    // Paths that do not exist or are not what the command needs.
    for args in [
        &["run", "missing.json", "--dump", "out"][..],
        &["check", "missing.json", "--no-progress"],
        &["compare", "missing", "b"],
        &["compare", "b", "missing"],
        &["curves", "missing", "b", "--no-plot"],
    ] {
        let named = args.iter().find(|arg| arg.starts_with("missing")).unwrap();
        cases.push(run_case(
            "flags",
            args.join(" "),
            dumps(),
            args,
            Expect::bad_input(&[named]),
        ));
    }
    cases
}

/// Offsets of `len` bytes to flip: every one of the first and last `edge` bytes, and every
/// `stride`-th byte between.
fn sampled_offsets(len: usize, edge: usize, stride: usize) -> Vec<usize> {
    (0..len)
        .filter(|&at| at < edge || at + edge >= len || (at - edge).is_multiple_of(stride))
        .collect()
}

/// A byte changed at `at`: the mask varies with the offset (one bit, the top bit, all bits).
fn flipped(bytes: &[u8], at: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[at] ^= [0x01, 0x80, 0xff, 0x10, 0x04][at % 5];
    out
}

/// Finding 4: dumps of each mode, damaged, compared with an undamaged copy.
fn trace_cases(base: &Base) -> Vec<Case> {
    let mut cases = Vec::new();
    for mode in ["md5", "stats", "full"] {
        let dump = base.dump(mode);
        let damaged = |file: &str, bytes: Vec<u8>| -> Files {
            vec![
                ("a".into(), Content::Copy(dump.clone())),
                (format!("a/{file}"), Content::Bytes(bytes)),
                ("b".into(), Content::Copy(dump.clone())),
            ]
        };
        let mut push = |what: String, files: Files, named: &str, len: Option<usize>| {
            let mut expect = Expect::bad_input(&[named]);
            expect.offset_below = len;
            cases.push(run_case(
                "traces",
                format!("{mode}: {what}"),
                files,
                &["compare", "a", "b"],
                expect,
            ));
        };
        for file in ["rank0.dctrace", "rank1.dctrace"] {
            let bytes = std::fs::read(dump.join(file)).unwrap();
            let len = bytes.len();
            let named = format!("a/{file}");
            // Rank 0's file: the first and last 64 bytes (header, footer) and every 9th byte;
            // rank 1's: the first and last 32 and every 16th.
            let offsets = if file == "rank0.dctrace" {
                sampled_offsets(len, 64, 9)
            } else {
                sampled_offsets(len, 32, 16)
            };
            for at in offsets {
                push(
                    format!("{file}: byte {at} flipped"),
                    damaged(file, flipped(&bytes, at)),
                    &named,
                    Some(len),
                );
            }
            for cut in (0..len).step_by(if file == "rank0.dctrace" { 19 } else { 41 }) {
                push(
                    format!("{file}: cut to {cut} bytes"),
                    damaged(file, bytes[..cut].to_vec()),
                    &named,
                    Some(len),
                );
            }
            for tail in [&b"\0"[..], b"x", b"DCTRACE", &[0u8; 4096], &bytes] {
                let mut longer = bytes.clone();
                longer.extend_from_slice(tail);
                push(
                    format!("{file}: {} bytes appended", tail.len()),
                    damaged(file, longer),
                    &named,
                    None,
                );
            }
        }
        // Rank files of two dumps of the same scenario mixed in one folder.
        let other = base.other_dump(mode);
        for rank in 0..2 {
            let file = format!("rank{rank}.dctrace");
            let bytes = std::fs::read(other.join(&file)).unwrap();
            let mut files = damaged(&file, bytes);
            if mode == "full" {
                // The tensor files go with their trace file (the mix is of whole ranks).
                files.push((
                    format!("a/rank{rank}"),
                    Content::Copy(other.join(format!("rank{rank}"))),
                ));
            }
            push(format!("rank {rank} from another dump"), files, "a", None);
        }
        // A rank file missing, or a folder in its place.
        let mut files = vec![
            ("a".into(), Content::Copy(dump.clone())),
            ("b".into(), Content::Copy(dump.clone())),
        ];
        files.push(("a/rank1.dctrace".into(), Content::Dir));
        push(
            "rank1.dctrace a folder".into(),
            files,
            "a/rank1.dctrace",
            None,
        );
        if mode != "full" {
            continue;
        }
        // Full mode's tensor files: deleted, cut, appended to, flipped.
        for step in 0..2 {
            let file = format!("rank0/step{step}.safetensors");
            let bytes = std::fs::read(dump.join(&file)).unwrap();
            let len = bytes.len();
            let named = format!("a/{file}");
            let mut files = vec![
                ("a".into(), Content::Copy(dump.clone())),
                ("b".into(), Content::Copy(dump.clone())),
            ];
            files.push((format!("a/{file}"), Content::Dir));
            push(format!("{file} a folder"), files, &named, None);
            let emptied = vec![
                ("a".into(), Content::Copy(dump.clone())),
                (format!("a/{file}"), Content::Bytes(Vec::new())),
                ("b".into(), Content::Copy(dump.clone())),
            ];
            push(format!("{file} emptied"), emptied, &named, None);
            for cut in (1..len).step_by(37) {
                push(
                    format!("{file}: cut to {cut} bytes"),
                    damaged(&file, bytes[..cut].to_vec()),
                    &named,
                    None,
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            push(
                format!("{file}: 1 byte appended"),
                damaged(&file, longer),
                &named,
                None,
            );
            for at in sampled_offsets(len, 16, 11) {
                push(
                    format!("{file}: byte {at} flipped"),
                    damaged(&file, flipped(&bytes, at)),
                    &named,
                    None,
                );
            }
        }
        cases.push(Case {
            class: "traces",
            what: "full: rank0/step1.safetensors deleted".into(),
            files: vec![
                ("a".into(), Content::Copy(dump.clone())),
                ("a/rank0/step1.safetensors".into(), Content::Removed),
                ("b".into(), Content::Copy(dump.clone())),
            ],
            action: Action::Run {
                args: vec!["compare".into(), "a".into(), "b".into()],
                expect: Expect::bad_input(&["a/rank0/step1.safetensors"]),
            },
        });
    }
    cases
}

/// Finding 5: the checkpoint given back to `run --resume`, damaged.
fn checkpoint_cases(base: &Base) -> Vec<Case> {
    let mut cases = Vec::new();
    let ck = &base.checkpoint;
    let damaged = |file: &str, bytes: Vec<u8>| -> Files {
        vec![
            (
                "case.json".into(),
                Content::Copy(base.train_scenario.clone()),
            ),
            ("ck".into(), Content::Copy(ck.clone())),
            (format!("ck/{file}"), Content::Bytes(bytes)),
        ]
    };
    let mut push = |what: String, files: Files, named: &str| {
        cases.push(run_case(
            "checkpoints",
            what,
            files,
            &["run", "case.json", "--dump", "out", "--resume", "ck"],
            Expect::bad_input(&["--resume", named]),
        ));
    };
    for rank in 0..2 {
        let json = format!("rank{rank}-step1.json");
        let bytes = std::fs::read(ck.join(&json)).unwrap();
        let named = format!("ck/{json}");
        // Every digit edited (rank 0), a digit changed to the next.
        if rank == 0 {
            for (at, byte) in bytes
                .iter()
                .enumerate()
                .filter(|(_, byte)| byte.is_ascii_digit())
            {
                let mut edited = bytes.clone();
                edited[at] = b'0' + (byte - b'0' + 1) % 10;
                push(
                    format!(
                        "{json}: digit at byte {at} {} -> {}",
                        *byte as char, edited[at] as char
                    ),
                    damaged(&json, edited),
                    &named,
                );
            }
        }
        for at in sampled_offsets(bytes.len(), 32, if rank == 0 { 4 } else { 9 }) {
            push(
                format!("{json}: byte {at} flipped"),
                damaged(&json, flipped(&bytes, at)),
                &named,
            );
        }
        for cut in (0..bytes.len()).step_by(23) {
            push(
                format!("{json}: cut to {cut} bytes"),
                damaged(&json, bytes[..cut].to_vec()),
                &named,
            );
        }
        for tail in ["\n", " x", "}", "\0"] {
            let mut longer = bytes.clone();
            longer.extend_from_slice(tail.as_bytes());
            // Whitespace after the JSON changes no byte the checksum covers... but the file is
            // not the one written: it must still be refused or read exactly.
            push(
                format!("{json}: {tail:?} appended"),
                damaged(&json, longer),
                &named,
            );
        }
        let tensors = format!("rank{rank}-step1.safetensors");
        let bytes = std::fs::read(ck.join(&tensors)).unwrap();
        let named = format!("ck/{tensors}");
        for at in sampled_offsets(bytes.len(), 16, if rank == 0 { 7 } else { 19 }) {
            push(
                format!("{tensors}: byte {at} flipped"),
                damaged(&tensors, flipped(&bytes, at)),
                &named,
            );
        }
        for cut in (0..bytes.len()).step_by(51) {
            push(
                format!("{tensors}: cut to {cut} bytes"),
                damaged(&tensors, bytes[..cut].to_vec()),
                &named,
            );
        }
        let mut files = damaged(&tensors, Vec::new());
        files.pop();
        files.push((format!("ck/{tensors}"), Content::Dir));
        push(format!("{tensors} a folder"), files, &named);
    }
    cases
}

/// Finding 6: input files that are not regular files, and msprobe dumps.
fn input_cases(base: &Base) -> Vec<Case> {
    let mut cases = Vec::new();
    let fifo = |path: &str| (path.to_string(), Content::Fifo);
    let stats = || ("b".to_string(), Content::Copy(base.dump("stats")));
    // (what, files, arguments, what the message names)
    type Input<'a> = (&'a str, Files, Vec<&'a str>, &'a str);
    let list: Vec<Input> = vec![
        (
            "a FIFO as the scenario of run",
            vec![fifo("case.json")],
            vec!["run", "case.json", "--dump", "out"],
            "case.json",
        ),
        (
            "a FIFO as the scenario of check",
            vec![fifo("case.json")],
            vec!["check", "case.json", "--no-progress"],
            "case.json",
        ),
        (
            "a FIFO in a folder of scenarios (not a scenario file: none is found)",
            vec![("s".into(), Content::Dir), fifo("s/case.json")],
            vec!["check", "s", "--no-progress"],
            "no scenario files found in s",
        ),
        (
            "/dev/zero as the scenario",
            vec![],
            vec!["run", "/dev/zero", "--dump", "out"],
            "/dev/zero",
        ),
        (
            "a folder as the scenario",
            vec![("case.json".into(), Content::Dir)],
            vec!["run", "case.json", "--dump", "out"],
            "case.json",
        ),
        (
            "a FIFO as a rank file",
            vec![
                ("a".into(), Content::Copy(base.dump("stats"))),
                fifo("a/rank1.dctrace"),
                stats(),
            ],
            vec!["compare", "a", "b"],
            "a/rank1.dctrace",
        ),
        (
            "a FIFO as a tensor file",
            vec![
                ("a".into(), Content::Copy(base.dump("full"))),
                fifo("a/rank0/step0.safetensors"),
                ("b".into(), Content::Copy(base.dump("full"))),
            ],
            vec!["compare", "a", "b"],
            "a/rank0/step0.safetensors",
        ),
        (
            "a FIFO as a checkpoint's JSON",
            vec![
                (
                    "case.json".into(),
                    Content::Copy(base.train_scenario.clone()),
                ),
                ("ck".into(), Content::Copy(base.checkpoint.clone())),
                fifo("ck/rank0-step1.json"),
            ],
            vec!["run", "case.json", "--dump", "out", "--resume", "ck"],
            "ck/rank0-step1.json",
        ),
        (
            "a FIFO as a checkpoint's tensors",
            vec![
                (
                    "case.json".into(),
                    Content::Copy(base.train_scenario.clone()),
                ),
                ("ck".into(), Content::Copy(base.checkpoint.clone())),
                fifo("ck/rank1-step1.safetensors"),
            ],
            vec!["run", "case.json", "--dump", "out", "--resume", "ck"],
            "ck/rank1-step1.safetensors",
        ),
        (
            "a FIFO as trainer_state.json",
            vec![fifo("a.json"), fifo("b.json")],
            vec!["curves", "a.json", "b.json", "--no-plot"],
            "a.json",
        ),
    ];
    let mut list = list;
    for (fixture, json) in base.msprobe_files() {
        let copy = |dir: &str| (dir.to_string(), Content::Copy(base.msprobe.join(&fixture)));
        list.push((
            "a FIFO as msprobe's dump.json",
            vec![copy("a"), copy("b"), fifo(&format!("a/{json}"))],
            vec!["compare", "a", "b"],
            "dump.json",
        ));
    }
    for (what, files, args, named) in list {
        cases.push(run_case(
            "inputs",
            what.to_string(),
            files,
            &args,
            Expect::bad_input(&[named]),
        ));
    }
    // msprobe dump.json: cut, followed by bytes, flipped; the unchanged file with itself.
    for (fixture, json) in base.msprobe_files() {
        let bytes = std::fs::read(base.msprobe.join(&fixture).join(&json)).unwrap();
        let damaged = |new: Vec<u8>| {
            vec![
                ("a".to_string(), Content::Copy(base.msprobe.join(&fixture))),
                (format!("a/{json}"), Content::Bytes(new)),
                ("b".to_string(), Content::Copy(base.msprobe.join(&fixture))),
            ]
        };
        let named = format!("a/{json}");
        cases.push(run_case(
            "inputs",
            format!("msprobe {fixture}: unchanged"),
            damaged(bytes.clone()),
            &["compare", "a", "b"],
            Expect::codes(&[0], &[]),
        ));
        for tail in [&b"x"[..], b"{}", b"\0", b"]", b"NaN", b"\n\n{\"data\": {}}"] {
            let mut longer = bytes.clone();
            longer.extend_from_slice(tail);
            cases.push(run_case(
                "inputs",
                format!(
                    "msprobe {fixture}: {:?} after the JSON",
                    String::from_utf8_lossy(tail)
                ),
                damaged(longer),
                &["compare", "a", "b"],
                Expect::bad_input(&[&named]),
            ));
        }
        let mut spaced = bytes.clone();
        spaced.extend_from_slice(b" \n\t\r\n");
        cases.push(run_case(
            "inputs",
            format!("msprobe {fixture}: whitespace after the JSON"),
            damaged(spaced),
            &["compare", "a", "b"],
            Expect::codes(&[0], &[]),
        ));
        for cut in (0..bytes.len()).step_by(97) {
            // Whitespace at the end of the file is all a cut may remove and stay valid.
            let codes: &'static [i32] = if bytes[cut..].iter().all(u8::is_ascii_whitespace) {
                OK_OR_BAD_INPUT
            } else {
                BAD_INPUT
            };
            cases.push(run_case(
                "inputs",
                format!("msprobe {fixture}: cut to {cut} bytes"),
                damaged(bytes[..cut].to_vec()),
                &["compare", "a", "b"],
                Expect::codes(codes, &[&named]),
            ));
        }
        // dump.json cannot tell a changed byte from other data: any verdict, never a crash.
        for at in (0..bytes.len()).step_by(53) {
            cases.push(run_case(
                "inputs",
                format!("msprobe {fixture}: byte {at} flipped"),
                damaged(flipped(&bytes, at)),
                &["compare", "a", "b"],
                Expect::codes(&[0, 1, 2], &[&named]),
            ));
        }
    }
    cases
}

// ---------------------------------------------------------------------------------------------
// The base files every class alters, made by the binary itself

struct Base {
    dir: PathBuf,
    slow_scenario: PathBuf,
    slow_reference: PathBuf,
    train_scenario: PathBuf,
    checkpoint: PathBuf,
    msprobe: PathBuf,
}

impl Base {
    fn make(dir: &Path) -> Base {
        std::fs::create_dir_all(dir).unwrap();
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let tiny = write(
            "tiny.json",
            ScenarioText::base("collective")
                .with("params.elements", "40")
                .text(),
        );
        for mode in ["md5", "stats", "full"] {
            for dump in [mode.to_string(), format!("other-{mode}")] {
                setup(
                    dir,
                    &[
                        "run",
                        tiny.to_str().unwrap(),
                        "--dump",
                        &dump,
                        "--mode",
                        mode,
                    ],
                );
            }
        }
        // Long enough (3 ranks, 300 000 elements, 6 steps) that two runs started together overlap.
        let slow_scenario = write(
            "slow.json",
            ScenarioText::base("collective")
                .with("world_size", "3")
                .with("steps", "6")
                .with("params.elements", "300000")
                .text(),
        );
        setup(
            dir,
            &[
                "run",
                "slow.json",
                "--dump",
                "slow-reference",
                "--mode",
                "md5",
            ],
        );
        let train_scenario = write("train.json", ScenarioText::base("train").text());
        setup(
            dir,
            &[
                "run",
                "train.json",
                "--dump",
                "train-first",
                "--stop-at",
                "1",
                "--checkpoint",
                "ck",
            ],
        );
        Base {
            dir: dir.to_path_buf(),
            slow_scenario,
            slow_reference: dir.join("slow-reference"),
            train_scenario,
            checkpoint: dir.join("ck"),
            msprobe: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/msprobe"),
        }
    }

    fn dump(&self, mode: &str) -> PathBuf {
        self.dir.join(mode)
    }

    fn other_dump(&self, mode: &str) -> PathBuf {
        self.dir.join(format!("other-{mode}"))
    }

    /// (fixture, its first dump.json relative to the fixture), for the fixtures of one process.
    fn msprobe_files(&self) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for fixture in ["md5_L1", "stats_L0", "nan_L1", "tensor_L1", "dist_md5_L1"] {
            let step = self.msprobe.join(fixture).join("step0");
            let mut procs: Vec<String> = std::fs::read_dir(&step)
                .unwrap()
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            procs.sort();
            found.push((fixture.to_string(), format!("step0/{}/dump.json", procs[0])));
        }
        found
    }
}

/// Runs the binary to make a base file; it must succeed.
fn setup(dir: &Path, args: &[&str]) {
    let out = Command::new(binary())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "setup `detcheck {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// Running a case

/// The binary the battery drives: `DETCHECK_BLACKBOX_BIN` (CI: the release build), or this
/// package's own.
fn binary() -> PathBuf {
    match std::env::var_os("DETCHECK_BLACKBOX_BIN") {
        Some(path) => std::fs::canonicalize(&path)
            .unwrap_or_else(|_| panic!("DETCHECK_BLACKBOX_BIN {path:?} does not exist")),
        None => PathBuf::from(env!("CARGO_BIN_EXE_detcheck")),
    }
}

/// How one invocation ended.
struct Ended {
    /// The exit code, or why there is none.
    code: Result<i32, String>,
    stdout: String,
    stderr: String,
}

/// Starts the binary in `dir`, its output into files of `dir` (a pipe could fill up and stall it).
fn spawn(dir: &Path, args: &[String], tag: &str) -> Child {
    let stdout = std::fs::File::create(dir.join(format!("{tag}.stdout"))).unwrap();
    let stderr = std::fs::File::create(dir.join(format!("{tag}.stderr"))).unwrap();
    Command::new(binary())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Waits for `child` until `deadline`; past it, kills it and reports a hang.
fn finish(mut child: Child, dir: &Path, tag: &str, deadline: Instant) -> Ended {
    let code = loop {
        match child.try_wait().unwrap() {
            Some(status) => {
                break match status.code() {
                    Some(code) => Ok(code),
                    None => Err(format!("killed by a signal ({status})")),
                }
            }
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!(
                    "hang: still running after {CASE_SECONDS} s, killed"
                ));
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    let read =
        |ext: &str| std::fs::read_to_string(dir.join(format!("{tag}.{ext}"))).unwrap_or_default();
    Ended {
        code,
        stdout: read("stdout"),
        stderr: read("stderr"),
    }
}

/// What is wrong with how an invocation ended, if anything.
fn judge(ended: &Ended, expect: &Expect) -> Option<String> {
    let code = match &ended.code {
        Ok(code) => *code,
        Err(why) => return Some(why.clone()),
    };
    if code == 101 || ended.stderr.contains("panicked at") {
        return Some(format!("panic (exit {code})"));
    }
    if ended.stderr.contains("memory allocation of") {
        return Some(format!("abort: allocation failed (exit {code})"));
    }
    if !expect.codes.contains(&code) {
        return Some(format!("exit {code}, allowed {:?}", expect.codes));
    }
    if code == 2 {
        let missing: Vec<&String> = expect
            .names
            .iter()
            .filter(|name| !ended.stderr.contains(name.as_str()))
            .collect();
        if !missing.is_empty() {
            return Some(format!("exit 2, but the message does not name {missing:?}"));
        }
        if let (Some(len), Some(at)) = (expect.offset_below, byte_offset(&ended.stderr)) {
            if at >= len {
                return Some(format!(
                    "the message names byte {at} of a file of {len} bytes"
                ));
            }
        }
    }
    None
}

/// N in the message's first "at byte N".
fn byte_offset(message: &str) -> Option<usize> {
    let rest = &message[message.find("at byte ")? + "at byte ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Writes a case's files into `dir` (created, empty).
fn write_files(dir: &Path, files: &[(String, Content)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (path, content) in files {
        let path = dir.join(path);
        if path.exists() || path.is_symlink() {
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
        match content {
            Content::Bytes(bytes) => std::fs::write(&path, bytes).unwrap(),
            Content::Copy(from) => copy(from, &path),
            Content::Dir => std::fs::create_dir_all(&path).unwrap(),
            Content::Removed => {}
            Content::Fifo => {
                let status = Command::new("mkfifo").arg(&path).status().unwrap();
                assert!(status.success(), "mkfifo {}", path.display());
            }
        }
    }
}

fn copy(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        let mut entries: Vec<_> = std::fs::read_dir(from)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
        entries.sort();
        for entry in entries {
            copy(&entry, &to.join(entry.file_name().unwrap()));
        }
    } else {
        std::fs::copy(from, to).unwrap();
    }
}

/// The shell line that reproduces an invocation in a saved case's folder.
fn command_line(args: &[String]) -> String {
    let quoted: Vec<String> = args.iter().map(|arg| shell_quote(arg)).collect();
    format!("detcheck {}", quoted.join(" "))
}

/// Runs a case in `dir`: `Err` says what went wrong, with the command lines.
fn run(case: &Case, dir: &Path) -> Result<(), String> {
    write_files(dir, &case.files);
    let deadline = Instant::now() + Duration::from_secs(CASE_SECONDS);
    match &case.action {
        Action::Run { args, expect } => {
            let ended = finish(spawn(dir, args, "out"), dir, "out", deadline);
            match judge(&ended, expect) {
                None => Ok(()),
                Some(why) => Err(format!(
                    "{why}\n  $ {}\n{}",
                    command_line(args),
                    indent(&ended.stderr)
                )),
            }
        }
        Action::Race {
            scenario,
            dump,
            reference,
            staggered,
        } => {
            let args: Vec<String> = ["run", scenario, "--dump", dump, "--mode", "md5"]
                .iter()
                .map(|arg| arg.to_string())
                .collect();
            let first = spawn(dir, &args, "first");
            if *staggered {
                // The second starts once the first has claimed the folder (or has ended).
                let lock = dir.join(dump).join("detcheck.lock");
                while !lock.exists()
                    && Instant::now() < deadline
                    && !dir.join(dump).join("rank0.dctrace").exists()
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let first_pid = first.id();
            let second = spawn(dir, &args, "second");
            let second_pid = second.id();
            let ends = [
                finish(first, dir, "first", deadline),
                finish(second, dir, "second", deadline),
            ];
            let shown = || {
                format!(
                    "  $ {0} & {0}\n  first: {1:?}\n{2}  second: {3:?}\n{4}",
                    command_line(&args),
                    ends[0].code,
                    indent(&ends[0].stderr),
                    ends[1].code,
                    indent(&ends[1].stderr)
                )
            };
            let codes = [ends[0].code.clone(), ends[1].code.clone()];
            let (loser, winner_pid) = match codes {
                [Ok(0), Ok(2)] => (1, first_pid),
                [Ok(2), Ok(0)] => (0, second_pid),
                _ => return Err(format!("exactly one run must write the dump (exit 0), the other be refused (exit 2)\n{}", shown())),
            };
            // Refused while the winner held the folder (it names the holder), or after it ended
            // (the folder holds a dump): both name the folder.
            let refusal = &ends[loser].stderr;
            let holder = format!("{dump}: in use by another run: pid {winner_pid}");
            let already =
                refusal.contains(dump.as_str()) && refusal.contains("already holds a dump");
            if !refusal.contains(&holder) && !already {
                return Err(format!(
                    "the refused run does not name the folder and its holder (`{holder}`)\n{}",
                    shown()
                ));
            }
            if dir.join(dump).join("detcheck.lock").exists() {
                return Err(format!("the lock file is left behind\n{}", shown()));
            }
            let compare: Vec<String> = ["compare", reference, dump]
                .iter()
                .map(|arg| arg.to_string())
                .collect();
            let ended = finish(spawn(dir, &compare, "compare"), dir, "compare", deadline);
            match judge(&ended, &Expect::codes(&[0], &[])) {
                None => Ok(()),
                Some(why) => Err(format!(
                    "the dump written is not identical to a lone run's: {why}\n  $ {}\n{}{}",
                    command_line(&compare),
                    indent(&ended.stdout),
                    shown()
                )),
            }
        }
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .take(12)
        .map(|line| format!("    | {}\n", truncate(line, 400)))
        .collect()
}

fn truncate(line: &str, max: usize) -> &str {
    match line.char_indices().nth(max) {
        Some((at, _)) => &line[..at],
        None => line,
    }
}

/// Saves a failed case: its files as they were before the run, the command and the failure.
fn save(case: &Case, index: usize, why: &str) -> PathBuf {
    let dir = target_dir()
        .join("blackbox-failures")
        .join(format!("{}-{index}", case.class));
    let _ = std::fs::remove_dir_all(&dir);
    write_files(&dir, &case.files);
    let command = match &case.action {
        Action::Run { args, .. } => command_line(args),
        Action::Race { scenario, dump, .. } => {
            let args: Vec<String> = ["run", scenario, "--dump", dump, "--mode", "md5"]
                .iter()
                .map(|arg| arg.to_string())
                .collect();
            let one = command_line(&args);
            format!("{one} & {one}")
        }
    };
    std::fs::write(
        dir.join("FAILURE"),
        format!("{}\n{command}\n\n{why}\n", case.what),
    )
    .unwrap();
    dir
}

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/tmp has a parent")
        .to_path_buf()
}

// ---------------------------------------------------------------------------------------------
// The battery

/// Every case, in a fixed order: (class, cases).
fn battery(base: &Base, full: bool) -> Vec<Case> {
    let mut all = Vec::new();
    // The default subset runs one trial of each race (lock cases are not strided).
    all.extend(lock_cases(base, if full { 10 } else { 1 }));
    all.extend(size_cases());
    all.extend(shape_cases());
    all.extend(flag_cases(base));
    all.extend(trace_cases(base));
    all.extend(checkpoint_cases(base));
    all.extend(input_cases(base));
    all
}

/// Runs `cases` on [`THREADS`] threads; returns each failure: (index, case's position, why).
fn run_all(cases: &[(usize, &Case)], work: &Path) -> Vec<(usize, String)> {
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| loop {
                let at = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(index, case)) = cases.get(at) else {
                    break;
                };
                let dir = work.join(format!("{}-{index}", case.class));
                let outcome = run(case, &dir);
                let _ = std::fs::remove_dir_all(&dir);
                if let Err(why) = outcome {
                    failures.lock().unwrap().push((index, why));
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|(index, _)| *index);
    failures
}

#[test]
fn the_binary_meets_the_exit_code_table_on_every_hostile_case() {
    let full = std::env::var("DETCHECK_BLACKBOX").is_ok_and(|value| value == "full");
    let only = std::env::var("DETCHECK_BLACKBOX_CLASS").ok();
    let work = target_dir()
        .join("blackbox-work")
        .join(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&work);
    let base = Base::make(&work.join("base"));
    let cases = battery(&base, full);
    // The subset: every DEFAULT_STRIDE-th case of each class, counted within the class.
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let chosen: Vec<(usize, &Case)> = cases
        .iter()
        .enumerate()
        .filter(|(_, case)| {
            let nth = seen.entry(case.class).or_default();
            *nth += 1;
            let in_class = only.as_deref().is_none_or(|class| class == case.class);
            // Lock cases are few (one trial of each race by default) and all run.
            in_class && (full || (*nth - 1).is_multiple_of(DEFAULT_STRIDE) || case.class == "lock")
        })
        .collect();
    let started = Instant::now();
    let failures = run_all(&chosen, &work.join("cases"));

    // One row per class: cases, passes, failures.
    let mut rows: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (_, case) in &chosen {
        rows.entry(case.class).or_default().0 += 1;
    }
    let mut report = String::new();
    let mut failed_cases = Vec::new();
    for (index, why) in &failures {
        let case = &cases[*index];
        rows.get_mut(case.class).unwrap().1 += 1;
        failed_cases.push((case, *index, why));
    }
    report.push_str(&format!(
        "black-box battery ({}, {} of {} cases, {:.1} s, binary {}):\n{:<12} {:>6} {:>6} {:>8}\n",
        if full {
            "full"
        } else {
            "default subset; DETCHECK_BLACKBOX=full for all"
        },
        chosen.len(),
        cases.len(),
        started.elapsed().as_secs_f64(),
        binary().display(),
        "class",
        "cases",
        "passed",
        "failed"
    ));
    for (class, (count, failed)) in &rows {
        report.push_str(&format!(
            "{class:<12} {count:>6} {:>6} {failed:>8}\n",
            count - failed
        ));
    }
    let total_failed = failures.len();
    report.push_str(&format!(
        "{:<12} {:>6} {:>6} {total_failed:>8}\n",
        "total",
        chosen.len(),
        chosen.len() - total_failed
    ));
    eprintln!("{report}");
    // Saved while the base files they copy still exist.
    let mut details = String::new();
    for (case, index, why) in failed_cases {
        let saved = save(case, index, why);
        details.push_str(&format!(
            "\n[{}-{index}] {}: {why}  saved: {} (cd there to re-run)\n",
            case.class,
            case.what,
            saved.display()
        ));
    }
    let _ = std::fs::remove_dir_all(&work);
    if total_failed == 0 {
        return;
    }
    panic!("{total_failed} black-box case(s) failed:{details}\n{report}");
}
