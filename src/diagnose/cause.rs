//! The cause of a `repeat` check's first divergence, in words: one class from a fixed vocabulary
//! ([`CauseClass`]; docs/causes.md), decided from evidence, with the program's line where the
//! evidence has one and the change that fixes it.
//!
//! The evidence is what the comparison already holds: the evidence records that differ
//! (`seed/*`, `rng/*`, `data/indices`, `data/outside`: [`crate::compare::is_evidence`]) with
//! their lines (A's `site:` entries), the first divergence's name (`init/*`: the parameters
//! before the first step; `in/(model).N`: the model's input), its element (re-runs that
//! reproduce each run's values: a function of the launch) and operator finding, and the
//! environment differences. The rules are tried in a fixed order, most specific first;
//! "unknown" is an answer, a wrong class is a defect, so a rule names a class only on evidence
//! that shows it.
//!
//! Main type: `crate::compare::Cause`, which [`decide_cause`] fills in. Determinism: a pure
//! function of the comparison. Limits: only `repeat` (two runs of one configuration: in other
//! checks ranks, world sizes or settings differ on purpose, so generator states differ without
//! being a cause); the hash seed is shown to matter by re-runs that reproduce each run's values
//! with that run's hash seed, not by a run with one hash seed.

use super::operator::is_collective;
use crate::compare::cause::{
    Cause, CauseClass, ANY_SOURCE_KEY, DRAWN_BEFORE_MODEL_KEY, FILES_KEY, FRAMEWORK_KEY,
    MODEL_BUILDER_KEY, MODEL_BUILT_KEY, OUT_OF_ORDER_LOADER_KEY, PARENT_SEEDED_KEY,
    PROCESS_STARTED_KEY, RANK_STARTED_KEY, SEED_DRAWN_KEY, UNSEEDED_GENERATOR_KEY,
    UNSEEDED_GLOBAL_KEY, UNSEEDED_MAKER_KEY, UNSEEDED_PYTHON_KEY, UNSEEDED_TORCH_KEY,
};
use crate::compare::{
    Comparison, Divergence, EvidenceDifference, OperatorFinding, OUTSIDE_RECORD, SPLIT_RECORD,
};
use crate::launch::WORKDIR_KEY;
use crate::record::environment::keys;

/// A generator's name in a report, and the call that seeds it.
fn generator(name: &str) -> (&'static str, &'static str) {
    match name {
        "torch" => ("torch's default generator", "torch.manual_seed(0)"),
        "cuda" => ("torch's CUDA generator", "torch.cuda.manual_seed_all(0)"),
        "numpy" => ("numpy's global generator", "np.random.seed(0)"),
        "python" => ("Python's `random`", "random.seed(0)"),
        "mindspore" => ("MindSpore's global seed", "mindspore.set_seed(0)"),
        "loader" => (
            "the data loader's own `torch.Generator`",
            "generator=torch.Generator().manual_seed(0)",
        ),
        _ => ("a random generator", "seed it with a constant"),
    }
}

/// The evidence records that differ at or before the divergence, of kind `prefix`.
fn evidence_of<'c>(
    c: &'c Comparison,
    d: &Divergence,
    prefix: &'c str,
) -> impl Iterator<Item = &'c EvidenceDifference> + 'c {
    let (step, seq) = (d.step, d.seq);
    c.evidence
        .iter()
        .filter(move |e| e.name.starts_with(prefix) && (e.step, e.seq) <= (step, seq))
}

fn site_of<'c>(c: &'c Comparison, e: &EvidenceDifference) -> Option<&'c str> {
    c.site(e.rank, e.step, &e.name, e.occurrence)
}

/// The first line A noted for a record of `name`, on any rank and step (`Some` also says that
/// A recorded one).
fn first_site<'c>(c: &'c Comparison, name: &str) -> Option<&'c str> {
    let needle = format!(":{name}:");
    c.sites
        .iter()
        .find(|((_, key), _)| key.contains(&needle))
        .map(|(_, v)| v.as_str())
}

/// The cause of `c`'s first divergence (a `repeat` check's), or `None` when nothing diverged.
/// `repeats_with_one_hash_seed`: whether a third run with run 1's `PYTHONHASHSEED` repeated run
/// 1 (`None`: not tried), the evidence that the hash seed is the cause.
#[must_use]
pub fn decide_cause(c: &Comparison, repeats_with_one_hash_seed: Option<bool>) -> Option<Cause> {
    let d = c.first.as_ref()?;
    let mut cause = classify(c, d, repeats_with_one_hash_seed);
    // What else the evidence shows, below the cause's own.
    let mut named: Vec<&str> = Vec::new();
    for e in &c.evidence {
        let quoted = format!("`{}`", e.name);
        if named.len() == 4 || named.contains(&e.name.as_str()) {
            continue;
        }
        named.push(&e.name);
        if !cause.evidence.iter().any(|line| line.starts_with(&quoted)) {
            let line = format!("{quoted} differs from step {} on (rank {})", e.step, e.rank);
            cause.evidence.push(line);
        }
    }
    cause.evidence.push(format!("first divergence: {d}"));
    Some(cause)
}

/// The paths of a `FILES_KEY` value read and written; empty for a value that is not one.
fn files_opened(value: Option<&str>) -> (Vec<String>, Vec<String>) {
    #[derive(serde::Deserialize, Default)]
    struct Opened {
        #[serde(default)]
        read: Vec<String>,
        #[serde(default)]
        wrote: Vec<String>,
    }
    let opened: Opened = value
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default();
    (opened.read, opened.wrote)
}

/// A file one side read that the other wrote, as (reader, path, writer) in words: run 2 read
/// what run 1 wrote, or each run read what the run before it wrote (both sides read and wrote
/// it alike: no environment difference, the fact is A's).
fn file_from_earlier_run(c: &Comparison) -> Option<(&'static str, String, &'static str)> {
    let differs = c.environment.iter().find(|e| e.key == FILES_KEY);
    let (left, right) = match differs {
        Some(e) => (e.left.as_deref(), e.right.as_deref()),
        None => (c.fact(FILES_KEY), c.fact(FILES_KEY)),
    };
    let ((left_read, left_wrote), (right_read, right_wrote)) =
        (files_opened(left), files_opened(right));
    if let Some(path) = right_read.iter().find(|p| left_wrote.contains(p)) {
        let (reader, writer) = if differs.is_some() {
            ("run 2", "run 1")
        } else {
            ("each run", "the run before it")
        };
        return Some((reader, path.clone(), writer));
    }
    left_read
        .iter()
        .find(|p| right_wrote.contains(p))
        .map(|path| ("run 1", path.clone(), "run 2"))
}

/// A maker of generators that seed themselves from OS entropy when given no seed (the recorder's
/// `UNSEEDED_MAKERS`): its name (`site:unseeded_maker`), the call, what happened in words, and
/// the fix.
struct UnseededMaker {
    name: &'static str,
    call: &'static str,
    summary: &'static str,
    fix: &'static str,
}

/// The makers, numpy's first: a trace without `site:unseeded_maker` is numpy's.
const UNSEEDED_MAKERS: [UnseededMaker; 2] = [
    UnseededMaker {
        name: "numpy",
        call: "`np.random.default_rng()` without a seed",
        summary: "a numpy Generator made without a seed (`np.random.default_rng()` seeds itself \
                  from OS entropy) draws other values in each run, and nothing else explains the \
                  divergence",
        fix: "give it a seed: `np.random.default_rng(0)`",
    },
    UnseededMaker {
        name: "gymnasium",
        call: "a gymnasium environment's (or space's) generator made without a seed",
        summary: "a gymnasium environment reset without `seed=` (or a space sampled before \
                  `space.seed(...)`) makes its generator from OS entropy: its start states and \
                  draws differ in each run, and nothing else explains the divergence",
        fix: "seed it once, at its first use: `env.reset(seed=0)` (a space: `space.seed(0)`); \
              later resets without a seed go on from that generator",
    },
];

/// A framework helper that builds the model from a configuration and seeds through an option of
/// its own (the recorder's `MODEL_BUILDERS`, `site:model_builder`), and the fix that seeds it
/// there, given the line that called it.
struct ModelBuilder {
    name: &'static str,
    fix: fn(&str) -> String,
}

const MODEL_BUILDERS: [ModelBuilder; 1] = [ModelBuilder {
    name: "LightningCLI",
    fix: |at| {
        format!(
            "seed through the CLI, which seeds each process before it builds the model: \
             `seed_everything_default=0` in `LightningCLI(...)` at {at}, or `--seed_everything 0` \
             on the command line"
        )
    },
}];

/// The maker of the run's generator made without a seed (`site:unseeded_maker`).
fn unseeded_maker(c: &Comparison) -> &'static UnseededMaker {
    let name = c.fact(UNSEEDED_MAKER_KEY).unwrap_or("numpy");
    UNSEEDED_MAKERS
        .iter()
        .find(|m| m.name == name)
        .unwrap_or(&UNSEEDED_MAKERS[0])
}

fn unseeded_evidence(c: &Comparison, site: &str) -> String {
    let call = unseeded_maker(c).call;
    format!("`{UNSEEDED_GENERATOR_KEY}`: {call} at {site}")
}

fn unseeded_global_evidence(site: &str) -> String {
    format!("`{UNSEEDED_GLOBAL_KEY}`: numpy's global generator drawn from at {site} before it was seeded")
}

/// The global generators a program may draw from before seeding them, by name, with the fact
/// the recorder notes of that (numpy's first: its rule is the older). numpy's and Python's
/// `random`'s draws are followed one by one (`FOLLOWED`): the fact is the first draw's line;
/// torch's are C calls: the fact is the line of the first call that seeded it after a draw.
const DRAWN_BEFORE_SEEDING: [(&str, &str); 3] = [
    ("numpy", UNSEEDED_GLOBAL_KEY),
    ("python", UNSEEDED_PYTHON_KEY),
    ("torch", UNSEEDED_TORCH_KEY),
];

/// The generators of `DRAWN_BEFORE_SEEDING` whose fact is the draw's own line.
const FOLLOWED: &[(&str, &str)] = DRAWN_BEFORE_SEEDING.split_at(2).0;

/// The followed generator the program drew from at `site` before seeding it: its name and the
/// fact's key.
fn drawn_unseeded(c: &Comparison, site: &str) -> Option<(&'static str, &'static str)> {
    FOLLOWED
        .iter()
        .find(|(_, key)| c.fact(key) == Some(site))
        .copied()
}

/// The first `data/outside` record that differs at or before the divergence, with its line:
/// values that entered torch from the program's line (`torch.tensor`, `torch.as_tensor`,
/// `torch.from_numpy`) and differed between the runs.
fn outside_value<'c>(
    c: &'c Comparison,
    d: &Divergence,
) -> Option<(&'c EvidenceDifference, &'c str)> {
    evidence_of(c, d, OUTSIDE_RECORD).find_map(|e| site_of(c, e).map(|site| (e, site)))
}

fn outside_evidence(e: &EvidenceDifference, site: &str) -> String {
    format!(
        "`{OUTSIDE_RECORD}` differs at step {} rank {}: the values that entered torch at {site}",
        e.step, e.rank
    )
}

/// The cause of `d`: the rules in their fixed order, most specific first (docs/causes.md); the
/// first that holds decides.
fn classify(c: &Comparison, d: &Divergence, repeats_with_one_hash_seed: Option<bool>) -> Cause {
    if let Some(cause) = operator_cause(d) {
        return cause;
    }
    // A run read a file, outside the launch's private folder, that a run before it wrote: the
    // runs did not start from the same files, whatever else differs because of it.
    if let Some(cause) = file_from_earlier_run_cause(c) {
        return cause;
    }
    let mindspore = c.fact(FRAMEWORK_KEY) == Some("mindspore");
    if let Some(cause) = seeded_differently_cause(c, d) {
        return cause;
    }
    if let Some(cause) = unrecorded_processes_cause(c, d) {
        return cause;
    }
    if let Some(cause) = initial_parameters_cause(c, d, mindspore) {
        return cause;
    }
    if let Some(cause) = data_order_cause(c, d) {
        return cause;
    }
    let into_input = d.name.starts_with("in/");
    if let Some(cause) = generator_state_cause(c, d, into_input) {
        return cause;
    }
    if let Some(cause) = changed_files_cause(c) {
        return cause;
    }
    if let Some(cause) = any_source_cause(c) {
        return cause;
    }
    let outside = outside_value(c, d);
    if let Some(cause) = compiled_cause(c, d, outside.is_none(), into_input) {
        return cause;
    }
    if repeats_with_one_hash_seed == Some(true) {
        return hash_order_cause();
    }
    if let Some(cause) = value_from_outside_cause(c, d, outside) {
        return cause;
    }
    if into_input {
        return data_values_cause(c);
    }
    environment_cause(c).unwrap_or_else(|| {
        Cause::new(
            CauseClass::Unknown,
            "no seed, generator, data or operator evidence names it".to_owned(),
        )
    })
}

/// The operator drill-down's rule: a collective or an operator that gave different outputs
/// from identical inputs.
fn operator_cause(d: &Divergence) -> Option<Cause> {
    if let Some(OperatorFinding::Nondeterministic { call, .. }) = &d.operator {
        if is_collective(&call.operator) {
            return Some(
                Cause::new(
                    CauseClass::CollectiveOrder,
                    format!(
                        "the collective `{}` gave different outputs from identical inputs in `{}`: \
                         its reduction order changed between the runs",
                        call.operator, call.module
                    ),
                )
                .at(call.site.as_deref())
                .fix(
                    "pin the collective's algorithm (NCCL_ALGO=Ring, NCCL_PROTO=Simple; Open MPI: \
                     `detcheck env`'s settings), or reduce in a fixed order yourself",
                ),
            );
        }
    }
    if let Some(OperatorFinding::Nondeterministic { call, hint, .. }) = &d.operator {
        let mut cause = Cause::new(
            CauseClass::NondeterministicOperator,
            format!(
                "`{}` gave different outputs from identical inputs in `{}`",
                call.operator, call.module
            ),
        );
        cause.fix = hint.as_ref().map(|h| h.fix.to_string());
        cause.site.clone_from(&call.site);
        return Some(cause);
    }
    if let Some(OperatorFinding::RandomNotReproduced { call, hint, .. }) = &d.operator {
        let mut cause = Cause::new(
            CauseClass::NondeterministicOperator,
            format!(
                "`{}` in `{}` draws at random, and its module's output differed where every \
                 record before it was equal, from launch to launch: the draw depends on timing",
                call.operator, call.module
            ),
        );
        cause.fix = hint.as_ref().map(|h| h.fix.to_string());
        cause.site.clone_from(&call.site);
        return Some(cause);
    }
    None
}

/// The rule of a file outside the working directory that one run read and a run before it
/// wrote.
fn file_from_earlier_run_cause(c: &Comparison) -> Option<Cause> {
    if let Some((reader, path, writer)) = file_from_earlier_run(c) {
        let mut cause = Cause::new(
            CauseClass::FileLeftBehind,
            format!(
                "{reader} read `{path}`, which {writer} wrote: a file at a path outside the \
                 working directory is shared by the runs of a check (each run gets a private copy \
                 of the working directory only), so the runs did not start from the same files"
            ),
        )
        .fix(format!(
            "write it under the working directory (a relative path), or to a new path each \
             run; detcheck leaves `{path}` where the program wrote it"
        ));
        cause
            .evidence
            .push(format!("`{FILES_KEY}`: {reader} read `{path}`"));
        return Some(cause);
    }
    None
}

/// The rule of a `seed/*` record that differs: a generator seeded with another value in each
/// run.
fn seeded_differently_cause(c: &Comparison, d: &Divergence) -> Option<Cause> {
    // MindSpore's `set_seed` seeds numpy's generator inside it: its own seed is the cause.
    let seeded = evidence_of(c, d, "seed/mindspore")
        .next()
        .or_else(|| evidence_of(c, d, "seed/").next());
    if let Some(e) = seeded {
        let name = &e.name["seed/".len()..];
        let (words, call) = generator(name);
        if let Some(cause) = seed_drawn_cause(c, e, words) {
            return Some(cause);
        }
        return Some(
            Cause::new(
                CauseClass::SeededDifferently,
                format!(
                    "{words} was seeded with a different value in each run (a clock, a process id \
                     or OS entropy)"
                ),
            )
            .at(site_of(c, e))
            .fix(format!("seed it with a constant: `{call}`"))
            .of(name),
        );
    }
    None
}

/// A seed that differs because the program drew it from a global generator before anything
/// seeded that one (`SEED_DRAWN_KEY`): named at the draw, where a seed before it, or a constant
/// in place of the draw, makes the runs identical; the seeding call's line only follows (seeding
/// it with a constant there leaves the program's other seeding calls, given the same drawn
/// value, differing).
fn seed_drawn_cause(c: &Comparison, e: &EvidenceDifference, words: &str) -> Option<Cause> {
    let drawn = c.fact(SEED_DRAWN_KEY)?;
    let (name, key) = drawn_unseeded(c, drawn).unwrap_or(("", SEED_DRAWN_KEY));
    let (from, call) = match generator(name) {
        (_, "seed it with a constant") => ("a global generator", "seeding it with a constant"),
        known => known,
    };
    let seeded = site_of(c, e).map_or(String::new(), |s| format!(" at {s}"));
    let mut cause = Cause::new(
        CauseClass::SeededDifferently,
        format!(
            "{words} was seeded{seeded} with a value the program drew here from {from} before \
             anything seeded it (it seeds itself from OS entropy at start-up): the seed, and what \
             it seeds, differ in each run"
        ),
    )
    .at(Some(drawn))
    .fix(format!(
        "seed {from} with a constant before this line (`{call}`), or use a constant seed in \
         place of the draw"
    ))
    .of(name);
    cause.evidence.push(format!(
        "`{key}`: {from} drawn from at {drawn} before it was seeded"
    ));
    cause.evidence.push(format!(
        "`{SEED_DRAWN_KEY}`: the value drawn at {drawn} was then given to a seeding call"
    ));
    Some(cause)
}

/// The rule of an `init/*` divergence after the program started processes of its own that are
/// no ranks (Hogwild).
fn unrecorded_processes_cause(c: &Comparison, d: &Divergence) -> Option<Cause> {
    if let (Some(param), Some(at)) = (d.name.strip_prefix("init/"), c.fact(PROCESS_STARTED_KEY)) {
        // The first record of the model already differs, and the program started processes of
        // its own that joined no group: they ran on the model before its first recorded use.
        let mut cause = Cause::new(
            CauseClass::UnrecordedProcesses,
            format!(
                "the model differed when the recording first saw it (`{param}` first), after \
                 processes the program started itself, that are no ranks, ran on it: what they \
                 did is not recorded, and processes that train one shared model (Hogwild) \
                 update it in whatever order they run"
            ),
        )
        .at(Some(at))
        .fix(
            "none at a line: Hogwild-style training is not reproducible by design; train in one \
             process, or make each trainer a rank of a process group (DDP), for runs that \
             repeat",
        );
        cause.evidence.push(format!(
            "`{PROCESS_STARTED_KEY}`: the program started a process at {at}"
        ));
        return Some(cause);
    }
    None
}

/// The rule of an `init/*` divergence: the model was initialised before its generator was
/// seeded.
fn initial_parameters_cause(c: &Comparison, d: &Divergence, mindspore: bool) -> Option<Cause> {
    if let Some(param) = d.name.strip_prefix("init/") {
        let (seed_record, call) = if mindspore {
            ("seed/mindspore", "mindspore.set_seed")
        } else {
            ("seed/torch", "torch.manual_seed")
        };
        let seeded = first_site(c, seed_record);
        let mut cause = Cause::new(
            CauseClass::InitialParameters,
            format!(
                "the parameters differed before the first step (`{param}` first): the model \
                 was initialised from a generator that was not seeded yet"
            ),
        );
        cause = cause.at(c.fact(MODEL_BUILT_KEY));
        let built = c
            .fact(MODEL_BUILT_KEY)
            .map_or_else(String::new, |at| format!(" (at {at})"));
        // A model a `MODEL_BUILDERS` helper built, at the line that called it.
        let builder = c.fact(MODEL_BUILDER_KEY).and_then(|name| {
            let at = c.fact(MODEL_BUILT_KEY)?;
            Some((MODEL_BUILDERS.iter().find(|b| b.name == name)?, at))
        });
        match seeded {
            Some(site) => {
                cause = cause.fix(format!(
                    "build the model{built} after `{call}`, which this program calls at {site}, \
                     or seed before building it"
                ));
            }
            // A model a helper built that seeds through its own option: that option. A rank
            // the program started itself, whose parent seeded: the seed was not inherited.
            // Where the parent seeded nothing either (`fabric run` of a script that never
            // seeds), the plain fix.
            None => match (builder, c.fact(RANK_STARTED_KEY), c.fact(PARENT_SEEDED_KEY)) {
                (Some((builder, at)), _, _) => {
                    cause = cause.fix((builder.fix)(at));
                }
                (None, Some(at), Some(parent)) => {
                    cause = cause.fix(format!(
                        "call `{call}(0)` in the process that builds the model, before it \
                         builds it: this rank is a process the program started itself (it \
                         joined its process group at {at}), and a started process does not \
                         inherit its parent's seed (the parent seeded at {parent})"
                    ));
                }
                _ if c.fact(DRAWN_BEFORE_MODEL_KEY).is_some() => {
                    cause = cause.fix(format!(
                        "call `{call}(0)` at the start of the program, before its first draw: \
                         the generator was drawn from before the model was built{built}, so a \
                         seed just above that line would leave those draws differing"
                    ));
                }
                _ => {
                    cause = cause.fix(format!("call `{call}(0)` before the model is built{built}"));
                }
            },
        }
        return Some(cause);
    }
    None
}

/// The rules of data order: a `data/split` record that differs, then a `data/indices` one.
fn data_order_cause(c: &Comparison, d: &Divergence) -> Option<Cause> {
    if let Some(e) = evidence_of(c, d, SPLIT_RECORD).next() {
        let mut cause = Cause::new(
            CauseClass::DataOrder,
            "the dataset was split differently in each run: `random_split` drew from a generator \
             that was not seeded yet, or seeded differently, so each part holds other samples"
                .to_owned(),
        )
        .at(site_of(c, e))
        .fix(
            "seed before the split (move the seeding call above this line), or give the split its \
             own generator: `random_split(..., generator=torch.Generator().manual_seed(0))`",
        );
        cause.evidence.push(format!(
            "`{SPLIT_RECORD}` differs at step {} rank {}",
            e.step, e.rank
        ));
        return Some(cause);
    }
    if let Some(e) = evidence_of(c, d, "data/indices").next() {
        let mut cause = Cause::new(
            CauseClass::DataOrder,
            "the data loader fetched other samples in each run: its sampler's shuffle is not \
             seeded, or seeded differently"
                .to_owned(),
        )
        .at(site_of(c, e))
        .fix(
            "give the DataLoader a seeded generator (`generator=torch.Generator().manual_seed(0)`) \
             or seed torch before it is iterated",
        );
        cause.evidence.push(format!(
            "`data/indices` differs at step {} rank {}",
            e.step, e.rank
        ));
        return Some(cause);
    }
    // The loader fetched the same samples, but hands its batches over as its workers finish
    // them: the model's input is another batch in each run.
    if let (true, Some(at)) = (d.name.starts_with("in/"), c.fact(OUT_OF_ORDER_LOADER_KEY)) {
        let mut cause = Cause::new(
            CauseClass::DataOrder,
            "the data loader hands over its batches in the order its workers finish them \
             (`in_order=False`), which is timing: the model's input is another batch in each \
             run, though the loader fetched the same samples"
                .to_owned(),
        )
        .at(Some(at))
        .fix("drop `in_order=False` from the DataLoader (the default, `True`, keeps the order)");
        cause.evidence.push(format!(
            "`{OUT_OF_ORDER_LOADER_KEY}`: a DataLoader with workers and `in_order=False` at {at}"
        ));
        return Some(cause);
    }
    None
}

/// The rule of an `rng/*` record that differs: an unseeded generator, or (seeded alike) one in
/// another state, which names no class.
fn generator_state_cause(c: &Comparison, d: &Divergence, into_input: bool) -> Option<Cause> {
    if let Some(e) = evidence_of(c, d, "rng/").next() {
        let name = &e.name["rng/".len()..];
        let (words, call) = generator(name);
        let seeded = first_site(c, &format!("seed/{name}")).is_some();
        let summary = if seeded {
            format!(
                "{words} is in another state in each run, though seeded alike: something drew \
                 from it a different number of times"
            )
        } else if into_input {
            format!(
                "{words} is never seeded, and the program draws from it: the model's input \
                 differs first, so the data (its order or its values) comes from it"
            )
        } else {
            format!("{words} is never seeded, and the program draws from it")
        };
        let class = if seeded {
            CauseClass::Unknown
        } else {
            CauseClass::UnseededGenerator
        };
        let mut cause = Cause::new(class, summary).of(name);
        if !seeded {
            cause = cause.fix(format!("seed it at the top of the script: `{call}`"));
        }
        cause.evidence.push(format!(
            "`{}` differs at step {} rank {}: it was drawn from before that step",
            e.name, e.step, e.rank
        ));
        // Where its values entered torch, when they did through a line of the program; else
        // where the program first drew from it (numpy's and Python's global generators).
        if let Some((outside, site)) = outside_value(c, d).filter(|_| !seeded) {
            cause.site = Some(site.to_owned());
            cause.evidence.push(outside_evidence(outside, site));
        } else if let Some((key, site)) = first_draw(c, name).filter(|_| !seeded) {
            cause.site = Some(site.to_owned());
            cause.evidence.push(format!(
                "`{key}`: the program's first draw from it, at {site}"
            ));
        }
        return Some(cause);
    }
    None
}

/// The rule of a file of the working directory that the program changed in place.
fn changed_files_cause(c: &Comparison) -> Option<Cause> {
    let changed_files = c.fact(WORKDIR_KEY).or_else(|| {
        c.environment
            .iter()
            .find(|e| e.key == WORKDIR_KEY)
            .and_then(|e| e.left.as_deref().or(e.right.as_deref()))
    });
    if let Some(words) = changed_files {
        let mut cause = Cause::new(
            CauseClass::FileLeftBehind,
            "the program changed a file of its working directory in place, so each run read \
             what the run before it left"
                .to_owned(),
        )
        .fix(
            "do not write to the files a run reads: open them read-only (`mmap_mode=\"r\"`, \
             `\"rb\"`) and write results to a new file",
        );
        cause.evidence.push(format!("`{WORKDIR_KEY}`: {words}"));
        return Some(cause);
    }
    None
}

/// The rule of a receive from any source, summed in the order messages arrive.
fn any_source_cause(c: &Comparison) -> Option<Cause> {
    if let Some(site) = c.fact(ANY_SOURCE_KEY) {
        let mut cause = Cause::new(
            CauseClass::CollectiveOrder,
            "the program receives from any source and adds in the order messages arrive: each \
             run of a check lets the ranks' first messages arrive in another order, and the sum \
             came out different"
                .to_owned(),
        )
        .at(Some(site))
        .fix(
            "receive from each rank in turn (`dist.recv(t, src=r)` for r in a fixed order), or \
             reduce with a collective (`dist.all_reduce`)",
        );
        cause.evidence.push(format!(
            "`{ANY_SOURCE_KEY}`: a receive without `src` at {site}"
        ));
        return Some(cause);
    }
    None
}

/// The rule of a `torch.compile`d model where nothing traced, entered or fed in differs.
fn compiled_cause(
    c: &Comparison,
    d: &Divergence,
    nothing_entered_differs: bool,
    into_input: bool,
) -> Option<Cause> {
    let compiled = c.fact("site:compiled");
    let nothing_traced_differs = matches!(
        d.operator,
        None | Some(OperatorFinding::NoOperatorDiffers { .. })
            | Some(OperatorFinding::Unavailable { .. })
    );
    if let Some(module) =
        compiled.filter(|_| nothing_traced_differs && nothing_entered_differs && !into_input)
    {
        return Some(
            Cause::new(
                CauseClass::NondeterministicOperator,
                format!(
                    "inside the `torch.compile`d model (`{module}`), whose generated kernels the \
                     operator tracer cannot enter: no traced operator differs, and no seed, \
                     generator or data evidence does"
                ),
            )
            .fix(
                "call `torch.use_deterministic_algorithms(True)` before compiling: Inductor then \
                 lowers accumulating `index_put`/`scatter` (an embedding's gradient) to ATen's \
                 deterministic kernels instead of adding with atomics; on a GPU also set \
                 `torch._inductor.config.deterministic = True` (TORCHINDUCTOR_DETERMINISTIC=1: no \
                 kernel chosen by timing). `--deterministic` names the one that fixes it",
            ),
        );
    }
    None
}

/// The hash order's cause: a third run with run 1's hash seed repeated run 1.
fn hash_order_cause() -> Cause {
    let mut cause = Cause::new(
        CauseClass::HashOrder,
        "the runs follow their PYTHONHASHSEED: a third run with run 1's hash seed \
         repeated run 1 bit for bit, so a set or dict of strings decides an order"
            .to_owned(),
    )
    .fix("iterate in a fixed order (`sorted(...)`), or set PYTHONHASHSEED=0");
    cause
        .evidence
        .push("a run with run 1's PYTHONHASHSEED repeated run 1".to_owned());
    cause
}

/// The rules of values from outside torch, in order: an operator's input from outside, an
/// unseeded numpy `Generator`, then a `data/outside` record that differs.
fn value_from_outside_cause(
    c: &Comparison,
    d: &Divergence,
    outside: Option<(&EvidenceDifference, &str)>,
) -> Option<Cause> {
    let unseeded = c.fact(UNSEEDED_GENERATOR_KEY);
    if let Some(OperatorFinding::InputFromOutside { call, input, .. }) = &d.operator {
        let mut cause = Cause::new(
            CauseClass::ValueFromOutside,
            format!(
                "input {input} of `{}` in `{}` came from outside torch's operators (numpy, a \
                 file, the clock, the environment) and differed already",
                call.operator, call.module
            ),
        )
        .at(call.site.as_deref());
        if let Some((e, site)) = outside {
            cause.site.get_or_insert_with(|| site.to_owned());
            cause.evidence.push(outside_evidence(e, site));
        }
        if let Some(site) = unseeded {
            cause.evidence.push(unseeded_evidence(c, site));
        }
        return Some(cause);
    }
    if let Some(site) = unseeded {
        let maker = unseeded_maker(c);
        let mut cause = Cause::new(CauseClass::UnseededGenerator, maker.summary.to_owned())
            .at(Some(site))
            .fix(maker.fix)
            .of(maker.name);
        cause.evidence.push(unseeded_evidence(c, site));
        if let Some((e, site)) = outside {
            cause.evidence.push(outside_evidence(e, site));
        }
        return Some(cause);
    }
    // A draw from an unseeded global generator (numpy's, then Python's `random`, then torch's)
    // explains the divergence when no value that differed entered torch elsewhere (a value that
    // did, at another line, is the nearer cause).
    let global = DRAWN_BEFORE_SEEDING.into_iter().find_map(|(name, key)| {
        c.fact(key)
            .filter(|site| outside.is_none_or(|(_, entered)| entered == *site))
            .map(|site| (key, site, name))
    });
    if let Some((key, site, name)) = global {
        return Some(unseeded_global_cause(key, site, name, outside));
    }
    if let Some((e, site)) = outside {
        let mut cause = Cause::new(
            CauseClass::ValueFromOutside,
            "values that entered torch at this line (`torch.tensor`, `torch.as_tensor` or \
             `torch.from_numpy`) differed between the runs: they were computed outside torch \
             (the clock, numpy, a file, the environment), and the first divergence follows them"
                .to_owned(),
        )
        .at(Some(site))
        .fix(
            "compute them from constants or a seeded generator, not from the clock, the \
             process or a file that changes between runs",
        );
        cause.evidence.push(outside_evidence(e, site));
        if let Some(drawn) = c.fact(UNSEEDED_GLOBAL_KEY) {
            cause.evidence.push(unseeded_global_evidence(drawn));
        }
        return Some(cause);
    }
    None
}

/// The fact of the program's first draw from the global generator `name` before anything seeded
/// it, where one is kept (`FOLLOWED`): the fact's key and the line.
fn first_draw<'c>(c: &'c Comparison, name: &str) -> Option<(&'static str, &'c str)> {
    let &(_, key) = FOLLOWED.iter().find(|(followed, _)| *followed == name)?;
    c.fact(key).map(|site| (key, site))
}

/// The cause of a draw from the global generator `name` before anything seeded it, noted as the
/// fact `key` at `site`: for numpy and Python's `random`, the draw's line; for torch (whose
/// draws are not followed one by one), the line of the call that first seeded it after them.
fn unseeded_global_cause(
    key: &str,
    site: &str,
    name: &str,
    outside: Option<(&EvidenceDifference, &str)>,
) -> Cause {
    let (words, call) = generator(name);
    let (summary, fix) = match name {
        "torch" => (
            format!(
                "{words} was drawn from before the program seeded it here (each process starts \
                 it from OS entropy): what it gave before this line, a tensor kept and used \
                 later, differs in each run, and nothing else explains the divergence"
            ),
            format!("seed at the start of the program, before its first draw (`{call}`)"),
        ),
        _ => {
            let (when, example, own) = if name == "numpy" {
                (
                    "when numpy is imported",
                    "the order of a shuffle without a seed",
                    "`dataset.shuffle(seed=0)`",
                )
            } else {
                (
                    "at start-up",
                    "the order of `random.shuffle`",
                    "`random.Random(0).shuffle(x)`",
                )
            };
            (
                format!(
                    "{words} was drawn from here before anything seeded it (it seeds itself from \
                     OS entropy {when}): what it gave, such as {example}, differs in each run \
                     though the program seeds it later, and nothing else explains the divergence"
                ),
                format!(
                    "seed before this line (`{call}`, or the framework's seed helper), or give \
                     the call a seed of its own ({own})"
                ),
            )
        }
    };
    let mut cause = Cause::new(CauseClass::UnseededGenerator, summary)
        .at(Some(site))
        .fix(fix)
        .of(name);
    cause.evidence.push(if name == "numpy" {
        unseeded_global_evidence(site)
    } else {
        format!("`{key}`: {words} drawn from before it was seeded ({site})")
    });
    if let Some((e, site)) = outside {
        cause.evidence.push(outside_evidence(e, site));
    }
    cause
}

/// The data values' cause: the model's input differs first, with no other evidence.
fn data_values_cause(c: &Comparison) -> Cause {
    let summary = if first_site(c, "data/indices").is_some() {
        "the model's input differs while the data loader fetched the same samples: the \
         values are made differently (augmentation, or data-loader workers that are not \
         seeded)"
    } else {
        "the model's input differs first: the data is not reproducible (its order or values \
         come from outside the model)"
    };
    Cause::new(CauseClass::DataValues, summary.to_owned())
}

/// The environment rule: the runs' environments differ in a key that may steer the arithmetic.
fn environment_cause(c: &Comparison) -> Option<Cause> {
    // A difference that steers reductions (one with a hint) before any other; never the hash
    // seed (its own rule), the host's name, or detcheck's facts about a launch.
    let may_steer = |e: &&crate::compare::EnvDifference| {
        e.key != "PYTHONHASHSEED" && e.key != keys::HOST && !e.key.starts_with("detcheck.")
    };
    let other = c
        .environment
        .iter()
        .filter(may_steer)
        .find(|e| e.hint.is_some())
        .or_else(|| c.environment.iter().find(may_steer));
    if let Some(e) = other {
        let mut cause = Cause::new(
            CauseClass::Environment,
            format!("the runs' environments differ: {e}"),
        );
        cause.fix = e.hint.as_ref().map(|h| h.fix.to_string());
        return Some(cause);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fact of rank 0's trace (`site:<what>` → the program's line).
    fn note_fact(c: &mut Comparison, key: &str, site: &str) {
        c.sites.insert((0, key.to_owned()), site.to_owned());
    }
    use crate::compare::{Difference, EnvDifference, InputSource, OperatorCall};

    fn diverged_at(step: u64, seq: u32, name: &str) -> Comparison {
        let mut c = Comparison::empty();
        c.num_differing = 1;
        c.first = Some(Divergence {
            step,
            rank: 0,
            seq,
            name: name.to_owned(),
            difference: Difference::Digest,
            left: None,
            right: None,
            metrics: None,
            element: None,
            operator: None,
            cause: None,
        });
        c
    }

    fn evidence(c: &mut Comparison, step: u64, seq: u32, name: &str, site: Option<&str>) {
        c.evidence.push(EvidenceDifference {
            step,
            rank: 0,
            seq,
            name: name.to_owned(),
            occurrence: 0,
        });
        if let Some(site) = site {
            c.sites
                .insert((0, format!("site:{step}:{name}:0")), site.to_owned());
        }
    }

    fn hash_seed_differs(c: &mut Comparison) {
        c.environment.push(EnvDifference {
            key: "PYTHONHASHSEED".to_owned(),
            left: Some("1".to_owned()),
            right: Some("2".to_owned()),
            ranks: vec![0],
            hint: None,
        });
    }

    fn kind(c: &Comparison, probe: Option<bool>) -> CauseClass {
        decide_cause(c, probe).expect("a divergence").kind
    }

    #[test]
    fn a_seed_that_differs_is_named_with_its_line() {
        let mut c = diverged_at(0, 9, "in/(model).0");
        evidence(&mut c, 0, 0, "seed/torch", Some("train.py:5"));
        evidence(&mut c, 0, 3, "rng/python", None);
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::SeededDifferently);
        assert_eq!(cause.site.as_deref(), Some("train.py:5"));
        assert!(
            cause.summary.starts_with("torch's default generator"),
            "{cause:?}"
        );
        assert!(cause.evidence.iter().any(|e| e.starts_with("`rng/python`")));
    }

    #[test]
    fn a_loader_generator_seeded_from_a_clock_is_seeded_differently_not_data_order() {
        let mut c = diverged_at(0, 9, "in/(model).0");
        evidence(&mut c, 0, 0, "seed/loader", Some("main.py:125"));
        evidence(&mut c, 0, 3, "data/indices", Some("main.py:126"));
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::SeededDifferently);
        assert_eq!(cause.site.as_deref(), Some("main.py:125"));
        assert!(
            cause.summary.starts_with("the data loader's own"),
            "{cause:?}"
        );
        let fix = cause.fix.unwrap();
        assert!(fix.contains("torch.Generator().manual_seed(0)"), "{fix}");
    }

    #[test]
    fn a_split_that_differs_is_data_order_at_the_split_even_with_same_indices() {
        let mut c = diverged_at(0, 9, "in/(model).0");
        evidence(&mut c, 0, 0, SPLIT_RECORD, Some("transformer.py:46"));
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::DataOrder);
        assert_eq!(cause.site.as_deref(), Some("transformer.py:46"));
        assert!(cause.summary.contains("`random_split`"), "{cause:?}");
        assert!(cause.fix.unwrap().starts_with("seed before the split"));
    }

    /// The loader fetched the same samples (its indices agree), but hands its batches over as
    /// its workers finish them: data order at the loader's line, not data values.
    #[test]
    fn a_loader_handing_over_batches_as_they_finish_is_data_order_at_its_line() {
        let mut c = diverged_at(0, 9, "in/(model).0");
        c.sites.insert(
            (0, "site:0:data/indices:0".to_owned()),
            "train.py:31".to_owned(),
        );
        assert_eq!(decide_cause(&c, None).unwrap().kind, CauseClass::DataValues);
        c.sites.insert(
            (0, OUT_OF_ORDER_LOADER_KEY.to_owned()),
            "train.py:30".to_owned(),
        );
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::DataOrder);
        assert_eq!(cause.site.as_deref(), Some("train.py:30"));
        assert!(cause.summary.contains("`in_order=False`"), "{cause:?}");
        assert!(cause.fix.unwrap().starts_with("drop `in_order=False`"));
    }

    #[test]
    fn a_model_first_seen_after_processes_ran_on_it_is_not_blamed_on_its_seed() {
        let mut c = diverged_at(0, 2, "init/conv1.weight");
        c.sites.insert(
            (0, "site:0:seed/torch:0".to_owned()),
            "main.py:85".to_owned(),
        );
        c.sites
            .insert((0, MODEL_BUILT_KEY.to_owned()), "main.py:88".to_owned());
        c.sites
            .insert((0, PROCESS_STARTED_KEY.to_owned()), "main.py:96".to_owned());
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::UnrecordedProcesses);
        assert_eq!(cause.site.as_deref(), Some("main.py:96"));
        assert!(cause.summary.contains("Hogwild"), "{cause:?}");
    }

    #[test]
    fn evidence_after_the_divergence_is_no_cause() {
        let mut c = diverged_at(0, 4, "fwd/fc");
        evidence(&mut c, 1, 0, "seed/torch", None);
        evidence(&mut c, 0, 5, "rng/numpy", None);
        assert_eq!(kind(&c, None), CauseClass::Unknown);
    }

    #[test]
    fn initial_parameters_name_the_late_seeding_call() {
        let mut c = diverged_at(0, 2, "init/body.0.weight");
        c.sites.insert(
            (0, "site:0:seed/torch:0".to_owned()),
            "train.py:9".to_owned(),
        );
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::InitialParameters);
        assert!(cause.fix.unwrap().contains("train.py:9"));
    }

    #[test]
    fn initial_parameters_never_seeded_name_the_line_that_built_the_model() {
        let mut c = diverged_at(0, 2, "init/encoder.weight");
        c.sites
            .insert((0, MODEL_BUILT_KEY.to_owned()), "main.py:107".to_owned());
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::InitialParameters);
        assert_eq!(cause.site.as_deref(), Some("main.py:107"));
        let fix = cause.fix.unwrap();
        assert!(
            fix.ends_with("before the model is built (at main.py:107)"),
            "{fix}"
        ); // pytorch/examples' regression: torch's generator drew its target function before the
           // model was built, and nothing seeded it: the seed goes before the first draw.
        note_fact(&mut c, DRAWN_BEFORE_MODEL_KEY, "main.py:107");
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.site.as_deref(), Some("main.py:107"));
        let fix = cause.fix.unwrap();
        assert!(
            fix.contains("at the start of the program, before its first draw"),
            "{fix}"
        );
    }

    #[test]
    fn a_model_lightning_cli_built_is_seeded_through_the_cli() {
        // Lightning's examples/pytorch/domain_templates/imagenet.py with
        // `seed_everything_default=False`: the model is built inside `LightningCLI(...)`, which
        // seeds before it builds when told to; a `torch.manual_seed` the program adds is not its
        // way.
        let mut c = diverged_at(0, 2, "init/model.conv1.weight");
        c.sites.insert(
            (0, MODEL_BUILT_KEY.to_owned()),
            "imagenet.py:178".to_owned(),
        );
        note_fact(&mut c, MODEL_BUILDER_KEY, "LightningCLI");
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::InitialParameters);
        assert_eq!(cause.site.as_deref(), Some("imagenet.py:178"));
        let fix = cause.fix.unwrap();
        assert!(
            fix.contains("`seed_everything_default=0` in `LightningCLI(...)` at imagenet.py:178"),
            "{fix}"
        );
        assert!(fix.contains("`--seed_everything 0`"), "{fix}");
        // A builder the report does not know gives the plain fix.
        note_fact(&mut c, MODEL_BUILDER_KEY, "SomeOtherCLI");
        let fix = decide_cause(&c, None).unwrap().fix.unwrap();
        assert!(
            fix.ends_with("before the model is built (at imagenet.py:178)"),
            "{fix}"
        );
    }

    #[test]
    fn a_started_rank_is_told_of_its_parents_seed_only_where_the_parent_seeded() {
        let started = |parent: Option<&str>| {
            let mut c = diverged_at(0, 1, "init/embedding.weight");
            c.sites
                .insert((0, MODEL_BUILT_KEY.to_owned()), "train.py:18".to_owned());
            c.sites
                .insert((0, RANK_STARTED_KEY.to_owned()), "train.py:11".to_owned());
            if let Some(at) = parent {
                c.sites
                    .insert((0, PARENT_SEEDED_KEY.to_owned()), at.to_owned());
            }
            decide_cause(&c, None).unwrap().fix.unwrap()
        };
        // imagenet's `mp.spawn`: the parent seeded in `main()`, the worker did not inherit it
        let fix = started(Some("main.py:90"));
        assert!(fix.contains("does not inherit its parent's seed"), "{fix}");
        assert!(fix.contains("(the parent seeded at main.py:90)"), "{fix}");
        // `fabric run` of a script that never seeds: no parent's seed to speak of
        let fix = started(None);
        assert!(!fix.contains("parent"), "{fix}");
        assert!(
            fix.ends_with("before the model is built (at train.py:18)"),
            "{fix}"
        );
    }

    #[test]
    fn indices_that_differ_are_data_order_and_same_indices_data_values() {
        let mut c = diverged_at(0, 9, "in/(model).0");
        evidence(&mut c, 0, 3, "data/indices", Some("train.py:16"));
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::DataOrder);
        assert_eq!(cause.site.as_deref(), Some("train.py:16"));

        let mut c = diverged_at(0, 9, "in/(model).0");
        c.sites.insert(
            (0, "site:0:data/indices:0".to_owned()),
            "train.py:16".to_owned(),
        );
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::DataValues);
        assert!(cause.summary.contains("fetched the same samples"));
    }

    #[test]
    fn a_generator_drawn_from_and_never_seeded_is_unseeded() {
        let mut c = diverged_at(0, 9, "in/(model).0");
        evidence(&mut c, 0, 3, "rng/numpy", None);
        assert_eq!(kind(&c, None), CauseClass::UnseededGenerator);
        assert_eq!(decide_cause(&c, None).unwrap().site, None);
        // Named at the program's first draw from it, where the recorder saw one (siamese_network's
        // `random.randint` in its dataset's `__getitem__`).
        let mut p = diverged_at(0, 9, "in/(model).0");
        evidence(&mut p, 0, 3, "rng/python", None);
        note_fact(&mut p, UNSEEDED_PYTHON_KEY, "main.py:134");
        let cause = decide_cause(&p, None).unwrap();
        assert_eq!(cause.kind, CauseClass::UnseededGenerator);
        assert_eq!(cause.site.as_deref(), Some("main.py:134"));
        // Seeded alike, yet in another state: something else is the cause.
        c.sites.insert(
            (0, "site:0:seed/numpy:0".to_owned()),
            "train.py:2".to_owned(),
        );
        assert_eq!(kind(&c, None), CauseClass::Unknown);
    }

    #[test]
    fn the_hash_seed_is_the_cause_only_when_one_hash_seed_repeats() {
        let mut c = diverged_at(0, 2, "grad/mix");
        hash_seed_differs(&mut c);
        assert_eq!(kind(&c, None), CauseClass::Unknown);
        assert!(kind(&c, None).needs_hash_probe());
        assert_eq!(kind(&c, Some(false)), CauseClass::Unknown);
        assert_eq!(kind(&c, Some(true)), CauseClass::HashOrder);
    }

    #[test]
    fn operator_findings_decide_their_classes() {
        let call = OperatorCall {
            operator: "aten.add.Tensor".to_owned(),
            index: 3,
            module: "block".to_owned(),
            inputs: vec![],
            output: 0,
            site: Some("model.py:7".to_owned()),
        };
        let mut c = diverged_at(0, 4, "fwd/block");
        evidence(&mut c, 0, 0, "seed/torch", None);
        c.first.as_mut().unwrap().operator = Some(OperatorFinding::Nondeterministic {
            window: "forward".to_owned(),
            call: call.clone(),
            hint: None,
        });
        // Identical inputs outrank every other evidence.
        assert_eq!(kind(&c, None), CauseClass::NondeterministicOperator);
        let mut c = diverged_at(0, 4, "fwd/block");
        c.first.as_mut().unwrap().operator = Some(OperatorFinding::InputFromOutside {
            window: "forward".to_owned(),
            call,
            input: 1,
            source: InputSource::Untraced,
        });
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::ValueFromOutside);
        assert_eq!(cause.site.as_deref(), Some("model.py:7"));
        assert_eq!(kind(&c, Some(true)), CauseClass::HashOrder);
    }

    #[test]
    fn a_random_draw_that_the_reruns_did_not_repeat_is_the_operator_with_its_fix() {
        // MindSpore's `Dropout` drew differently in the checked runs, not in their re-runs
        // (examples/programs/python/mindspore/dropout_race.py): the one cause, whether or not
        // a pair of re-runs happened to diverge, is the random operator, with its row's fix.
        let mut c = diverged_at(0, 5, "fwd/drop");
        c.first.as_mut().unwrap().operator = Some(OperatorFinding::RandomNotReproduced {
            window: "forward".to_owned(),
            pairs: 4,
            call: OperatorCall {
                operator: "Dropout".to_owned(),
                index: 0,
                module: "drop".to_owned(),
                inputs: vec!["f32[64,512]".to_owned()],
                output: 0,
                site: Some("dropout_race.py:42".to_owned()),
            },
            hint: crate::record::hints::for_operator("Dropout")
                .map(crate::record::hints::Hint::advice),
        });
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::NondeterministicOperator);
        assert!(
            cause
                .summary
                .contains("`Dropout` in `drop` draws at random"),
            "{cause:?}"
        );
        assert_eq!(cause.site.as_deref(), Some("dropout_race.py:42"));
        assert!(cause
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("mindspore.ops.dropout")));
    }

    #[test]
    fn an_arrival_order_is_a_collective_order_cause_unless_a_seed_explains_it() {
        let mut c = diverged_at(0, 12, "grad/0.weight");
        c.sites
            .insert((0, ANY_SOURCE_KEY.to_owned()), "train.py:22".to_owned());
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::CollectiveOrder);
        assert_eq!(cause.site.as_deref(), Some("train.py:22"));
        assert!(!cause.kind.needs_hash_probe());
        // A seed that differs is a cause the arrival order cannot be.
        evidence(&mut c, 0, 0, "seed/torch", None);
        assert_eq!(kind(&c, None), CauseClass::SeededDifferently);
        // A traced collective that differs from identical inputs.
        let mut c = diverged_at(0, 12, "grad/0.weight");
        c.first.as_mut().unwrap().operator = Some(OperatorFinding::Nondeterministic {
            window: "backward".to_owned(),
            call: OperatorCall {
                operator: "c10d.allreduce_.default".to_owned(),
                index: 9,
                module: "(model)".to_owned(),
                inputs: vec![],
                output: 0,
                site: None,
            },
            hint: None,
        });
        assert_eq!(kind(&c, None), CauseClass::CollectiveOrder);
        assert!(!is_collective("aten.add.Tensor"));
    }

    #[test]
    fn an_unseeded_numpy_generator_is_named_when_nothing_more_specific_is() {
        let mut c = diverged_at(0, 9, "in/(model).0");
        assert_eq!(kind(&c, None), CauseClass::DataValues);
        note_fact(&mut c, UNSEEDED_GENERATOR_KEY, "augment.py:16");
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::UnseededGenerator);
        assert_eq!(cause.site.as_deref(), Some("augment.py:16"));
        assert_eq!(cause.generator.as_deref(), Some("numpy"));
        // The data loader fetched other samples: that is the cause, the Generator is not.
        evidence(&mut c, 0, 2, "data/indices", None);
        assert_eq!(kind(&c, None), CauseClass::DataOrder);
    }

    #[test]
    fn an_environment_reset_without_a_seed_is_named_at_the_programs_reset() {
        // pytorch/examples' reinforce.py without `env.reset(seed=args.seed)`: the start states
        // entered torch at `torch.from_numpy(state)` (line 55) from an environment whose first
        // `reset()` (line 85) made its generator from OS entropy.
        let mut c = diverged_at(0, 8, "in/(model).0");
        evidence(&mut c, 0, 4, OUTSIDE_RECORD, Some("reinforce.py:55"));
        assert_eq!(kind(&c, None), CauseClass::ValueFromOutside);
        note_fact(&mut c, UNSEEDED_GENERATOR_KEY, "reinforce.py:85");
        note_fact(&mut c, UNSEEDED_MAKER_KEY, "gymnasium");
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::UnseededGenerator);
        assert_eq!(cause.site.as_deref(), Some("reinforce.py:85"));
        assert_eq!(cause.generator.as_deref(), Some("gymnasium"));
        assert!(cause.fix.as_deref().unwrap().contains("env.reset(seed=0)"));
        assert!(
            cause.evidence[0].contains("gymnasium environment"),
            "{cause:?}"
        );
        assert!(cause.evidence[1].contains("reinforce.py:55"), "{cause:?}");
    }

    #[test]
    fn a_draw_from_numpys_global_generator_before_its_seed_is_named_at_its_line() {
        // TRL's SFT script with `dataset.shuffle()` (no seed) above the Trainer, which seeds
        // numpy later: the loader fetches the same indices of rows in another order.
        let mut c = diverged_at(0, 31, "in/(model).input_ids");
        evidence(&mut c, 1, 2, "rng/torch", None);
        assert_eq!(kind(&c, None), CauseClass::DataValues);
        note_fact(&mut c, UNSEEDED_GLOBAL_KEY, "trl/scripts/sft.py:98");
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::UnseededGenerator);
        assert_eq!(cause.site.as_deref(), Some("trl/scripts/sft.py:98"));
        assert_eq!(cause.generator.as_deref(), Some("numpy"));
        assert!(
            cause.fix.as_deref().unwrap().contains("seed=0"),
            "{cause:?}"
        );
        // A value that differed as it entered torch at another line is the nearer cause; at
        // the same line, the draw explains it.
        evidence(&mut c, 0, 4, OUTSIDE_RECORD, Some("trl/scripts/sft.py:120"));
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::ValueFromOutside);
        assert!(
            cause.evidence.iter().any(|e| e.contains("sft.py:98")),
            "{cause:?}"
        );
        let mut c = diverged_at(0, 31, "in/(model).input_ids");
        evidence(&mut c, 0, 4, OUTSIDE_RECORD, Some("trl/scripts/sft.py:98"));
        note_fact(&mut c, UNSEEDED_GLOBAL_KEY, "trl/scripts/sft.py:98");
        assert_eq!(kind(&c, None), CauseClass::UnseededGenerator);
        // A `Generator` made without a seed is the more particular fact, named first.
        note_fact(&mut c, UNSEEDED_GENERATOR_KEY, "augment.py:16");
        assert_eq!(
            decide_cause(&c, None).unwrap().site.as_deref(),
            Some("augment.py:16")
        );
    }

    #[test]
    fn a_seed_drawn_from_an_unseeded_generator_is_named_at_the_draw() {
        // pytorch/examples' dcgan without `--manualSeed`: `opt.manualSeed = random.randint(1,
        // 10000)` at main.py:46, then `random.seed(opt.manualSeed)` and
        // `torch.manual_seed(opt.manualSeed)`. A constant at main.py:48 would leave torch's seed
        // drawn: the fix is before the draw.
        let mut c = diverged_at(0, 8, "init/main.0.weight");
        evidence(&mut c, 0, 0, "seed/python", Some("main.py:48"));
        evidence(&mut c, 0, 1, "seed/torch", Some("main.py:49"));
        let plain = decide_cause(&c, None).unwrap();
        assert_eq!(plain.site.as_deref(), Some("main.py:48"));
        note_fact(&mut c, UNSEEDED_PYTHON_KEY, "main.py:46");
        note_fact(&mut c, SEED_DRAWN_KEY, "main.py:46");
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::SeededDifferently);
        assert_eq!(cause.site.as_deref(), Some("main.py:46"));
        assert_eq!(cause.generator.as_deref(), Some("python"));
        assert!(cause.summary.contains("seeded at main.py:48"), "{cause:?}");
        let fix = cause.fix.unwrap();
        assert!(fix.contains("before this line (`random.seed(0)`)"), "{fix}");
        // A draw whose generator's first unseeded draw was elsewhere: named, in general words.
        let mut c2 = diverged_at(0, 8, "init/main.0.weight");
        evidence(&mut c2, 0, 1, "seed/torch", Some("main.py:49"));
        note_fact(&mut c2, SEED_DRAWN_KEY, "main.py:46");
        let cause = decide_cause(&c2, None).unwrap();
        assert_eq!(cause.site.as_deref(), Some("main.py:46"));
        assert!(
            cause.summary.contains("from a global generator"),
            "{cause:?}"
        );
    }

    #[test]
    fn a_draw_from_pythons_random_before_its_seed_is_named_at_its_line() {
        // `random.shuffle(samples)` above `random.seed(0)`: the seed resets the state, so no
        // `rng/python` difference is left to show.
        let mut c = diverged_at(0, 9, "in/(model).0");
        assert_eq!(kind(&c, None), CauseClass::DataValues);
        note_fact(&mut c, UNSEEDED_PYTHON_KEY, "train.py:12");
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::UnseededGenerator);
        assert_eq!(cause.site.as_deref(), Some("train.py:12"));
        assert_eq!(cause.generator.as_deref(), Some("python"));
        assert!(
            cause.summary.starts_with("Python's `random` was drawn"),
            "{cause:?}"
        );
        assert!(cause.fix.unwrap().contains("`random.seed(0)`"));
        // numpy's, where both were drawn from before their seeds, first (its rule is older).
        note_fact(&mut c, UNSEEDED_GLOBAL_KEY, "train.py:20");
        assert_eq!(
            decide_cause(&c, None).unwrap().generator.as_deref(),
            Some("numpy")
        );
        // torch's: pytorch/examples' regression with `torch.manual_seed(0)` only above its model
        // (main.py:42): its target function, drawn at the top, differs; named at the seed.
        let mut c = diverged_at(0, 7, "loss");
        note_fact(&mut c, UNSEEDED_TORCH_KEY, "main.py:42");
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::UnseededGenerator);
        assert_eq!(cause.site.as_deref(), Some("main.py:42"));
        assert!(
            cause.summary.contains("before the program seeded it here"),
            "{cause:?}"
        );
        assert!(cause.fix.unwrap().contains("at the start of the program"));
    }

    #[test]
    fn a_value_that_entered_torch_from_the_program_is_named_with_its_line() {
        let mut c = diverged_at(0, 9, "in/(model).0");
        assert_eq!(kind(&c, None), CauseClass::DataValues);
        evidence(&mut c, 0, 4, OUTSIDE_RECORD, Some("train.py:31"));
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::ValueFromOutside);
        assert_eq!(cause.site.as_deref(), Some("train.py:31"));
        assert!(cause.kind.needs_hash_probe());
        // The hash seed's third run repeating run 1 says the values came from a hash order.
        assert_eq!(kind(&c, Some(true)), CauseClass::HashOrder);
        // Values that entered after the divergence are no cause of it.
        let mut c = diverged_at(0, 3, "fwd/fc");
        evidence(&mut c, 0, 4, OUTSIDE_RECORD, Some("train.py:31"));
        assert_eq!(kind(&c, None), CauseClass::Unknown);
        // Inside a compiled model, values that differed on the way in are the cause, not its
        // kernels.
        let mut c = diverged_at(1, 30, "grad/wte.weight");
        c.sites
            .insert((0, "site:compiled".to_owned()), "GPT".to_owned());
        assert_eq!(kind(&c, None), CauseClass::NondeterministicOperator);
        evidence(&mut c, 1, 2, OUTSIDE_RECORD, Some("train.py:31"));
        assert_eq!(kind(&c, None), CauseClass::ValueFromOutside);
    }

    #[test]
    fn an_unseeded_generator_is_named_at_the_line_its_values_entered_torch() {
        let mut c = diverged_at(0, 9, "in/(model).0");
        evidence(&mut c, 0, 3, "rng/numpy", None);
        evidence(&mut c, 0, 4, OUTSIDE_RECORD, Some("train.py:31"));
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::UnseededGenerator);
        assert_eq!(cause.generator.as_deref(), Some("numpy"));
        assert_eq!(cause.site.as_deref(), Some("train.py:31"));
        assert!(cause.evidence.iter().any(|e| e.contains("at train.py:31")));
        // A numpy Generator made without a seed outranks the line its values entered at.
        let mut c = diverged_at(0, 9, "in/(model).0");
        evidence(&mut c, 0, 4, OUTSIDE_RECORD, Some("train.py:31"));
        note_fact(&mut c, UNSEEDED_GENERATOR_KEY, "train.py:12");
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::UnseededGenerator);
        assert_eq!(cause.site.as_deref(), Some("train.py:12"));
    }

    #[test]
    fn a_compiled_model_with_nothing_traced_differing_is_its_kernels() {
        let mut c = diverged_at(0, 30, "grad/wte.weight");
        c.sites
            .insert((0, "site:compiled".to_owned()), "GPT".to_owned());
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::NondeterministicOperator);
        assert!(cause.summary.contains("`GPT`") && cause.fix.unwrap().contains("Inductor"));
    }

    #[test]
    fn a_file_outside_the_working_directory_that_run_1_wrote_and_run_2_read_is_named() {
        let files = |json: &str| Some(json.to_owned());
        let mut c = diverged_at(0, 3, "fwd/(model)");
        // Run 1 found no snapshot and saved one; run 2 resumed from it.
        c.environment.push(EnvDifference {
            key: FILES_KEY.to_owned(),
            left: files(r#"{"read":[],"wrote":["/tmp/ckpt/snapshot.pt"]}"#),
            right: files(r#"{"read":["/tmp/ckpt/snapshot.pt"],"wrote":["/tmp/ckpt/snapshot.pt"]}"#),
            ranks: vec![0],
            hint: None,
        });
        // Even a seed that differs too is no cause next to it: the resumed run skipped its draws.
        evidence(&mut c, 0, 0, "rng/torch", None);
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::FileLeftBehind);
        assert!(
            cause
                .summary
                .starts_with("run 2 read `/tmp/ckpt/snapshot.pt`, which run 1 wrote"),
            "{cause:?}"
        );
        assert!(cause.fix.unwrap().contains("relative path"));
        // Both runs read and wrote it alike (a file from an earlier check): the fact is A's.
        let mut c = diverged_at(0, 3, "fwd/(model)");
        c.sites.insert(
            (0, FILES_KEY.to_owned()),
            r#"{"read":["/data/cache.npy"],"wrote":["/data/cache.npy"]}"#.to_owned(),
        );
        let cause = decide_cause(&c, None).unwrap();
        assert!(cause.summary.starts_with("each run read `/data/cache.npy`"));
        // A file both runs only read, or a value that is no such entry: not this cause.
        for value in [r#"{"read":["/data/train.bin"],"wrote":[]}"#, "not json"] {
            let mut c = diverged_at(0, 3, "fwd/(model)");
            c.sites.insert((0, FILES_KEY.to_owned()), value.to_owned());
            assert_ne!(kind(&c, None), CauseClass::FileLeftBehind, "{value}");
        }
    }

    #[test]
    fn a_file_changed_in_place_is_named_whether_or_not_the_runs_agree_on_it() {
        let words = "changed in place in the working directory: features.npy";
        // Both runs changed it alike: no environment difference, the fact is in `sites`.
        let mut c = diverged_at(0, 7, "in/(model).0");
        c.sites
            .insert((0, WORKDIR_KEY.to_owned()), words.to_owned());
        let cause = decide_cause(&c, None).unwrap();
        assert_eq!(cause.kind, CauseClass::FileLeftBehind);
        assert!(cause.evidence[0].ends_with("features.npy"), "{cause:?}");
        // Only run 2 saw the change: an environment difference.
        let mut c = diverged_at(0, 7, "in/(model).0");
        c.environment.push(EnvDifference {
            key: WORKDIR_KEY.to_owned(),
            left: None,
            right: Some(words.to_owned()),
            ranks: vec![0],
            hint: None,
        });
        assert_eq!(kind(&c, None), CauseClass::FileLeftBehind);
        // Without it, the same divergence is the data's values.
        assert_eq!(
            kind(&diverged_at(0, 7, "in/(model).0"), None),
            CauseClass::DataValues
        );
    }
}
