//! The shape of a divergence's cause, as reports carry it: one class from a fixed vocabulary
//! ([`CauseClass`]; docs/causes.md), in words, with the program's line where the evidence has
//! one and the change that fixes it ([`Cause`]); and the facts a launched rank records for the
//! rules (`site:*`, `detcheck.files`: the keys below). The rules that decide a cause are
//! `crate::diagnose::cause`'s (the one home for diagnosis); this is the data they fill in.
//!
//! Main type: [`Cause`]. Determinism: data only.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The vocabulary of causes (docs/causes.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseClass {
    /// A generator was seeded with a value that changes from run to run (a clock, a process
    /// id, OS entropy).
    SeededDifferently,
    /// A generator the program draws from was never seeded.
    UnseededGenerator,
    /// The parameters differed before the first step.
    InitialParameters,
    /// The data loader fetched other samples.
    DataOrder,
    /// The model's input differs with the same sample order (augmentation, worker seeding), or
    /// with no loader to tell.
    DataValues,
    /// Set or dict iteration order over strings: it follows `PYTHONHASHSEED`.
    HashOrder,
    /// An operator gave different outputs from identical inputs (also inside a compiled region).
    NondeterministicOperator,
    /// A reduction whose order follows the order in which ranks' messages arrive: a receive
    /// from any source, or a collective that gave different outputs from identical inputs.
    CollectiveOrder,
    /// A value entered torch from outside its operators (numpy, a file, the clock).
    ValueFromOutside,
    /// A file that an earlier run wrote or changed.
    FileLeftBehind,
    /// A difference in the environment (a variable, a library version).
    Environment,
    /// Runs that read nothing during their steps differ where the recorded runs agree: the
    /// divergence disappears when recorded, so it depends on timing (a race that recording's
    /// reads and synchronisation hide).
    Timing,
    /// The model changed before the recording saw it, in processes the program started that
    /// are no ranks (Hogwild-style trainers sharing one model): what they did is not recorded.
    UnrecordedProcesses,
    /// No evidence names the cause.
    Unknown,
}

impl CauseClass {
    /// Whether a run with one hash seed should be tried before this class is given: the
    /// classes that no generator, seed, data or operator evidence showed.
    #[must_use]
    pub fn needs_hash_probe(self) -> bool {
        matches!(
            self,
            CauseClass::Unknown | CauseClass::DataValues | CauseClass::ValueFromOutside
        )
    }
}

impl fmt::Display for CauseClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CauseClass::SeededDifferently => "a generator seeded differently in each run",
            CauseClass::UnseededGenerator => "an unseeded random generator",
            CauseClass::InitialParameters => "initial parameters differ",
            CauseClass::DataOrder => "data order",
            CauseClass::DataValues => "data values",
            CauseClass::HashOrder => "hash order (PYTHONHASHSEED)",
            CauseClass::NondeterministicOperator => "a nondeterministic operator",
            CauseClass::CollectiveOrder => "a collective or reduction order",
            CauseClass::ValueFromOutside => "a value from outside torch",
            CauseClass::FileLeftBehind => "a file an earlier run left",
            CauseClass::Environment => "an environment difference",
            CauseClass::Timing => "timing: the divergence disappears when recorded",
            CauseClass::UnrecordedProcesses => "processes that are no ranks changed the model",
            CauseClass::Unknown => "unknown",
        })
    }
}

/// A divergence's cause: its class, in words, with the evidence, the program's line and a fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// Its class.
    pub kind: CauseClass,
    /// What happened, in one sentence.
    pub summary: String,
    /// The program's line (`train.py:12`, relative to its working directory) where it happens,
    /// when the evidence has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// What to change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The evidence, one line each.
    pub evidence: Vec<String>,
    /// The generator it names (`torch`, `cuda`, `numpy`, `python`), for the classes of seeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<String>,
}

impl Cause {
    pub(crate) fn new(class: CauseClass, summary: String) -> Self {
        Cause {
            kind: class,
            summary,
            site: None,
            fix: None,
            evidence: Vec::new(),
            generator: None,
        }
    }

    pub(crate) fn at(mut self, site: Option<&str>) -> Self {
        self.site = site.map(str::to_owned);
        self
    }

    pub(crate) fn of(mut self, generator: &str) -> Self {
        self.generator = Some(generator.to_owned());
        self
    }

    pub(crate) fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    /// The cause as a report prints it, at `indent`: the class and summary, then the line, the
    /// fix and the evidence, one each.
    #[must_use]
    pub fn describe(&self, indent: &str) -> String {
        let mut out = format!("{indent}cause: {}: {}\n", self.kind, self.summary);
        if let Some(site) = &self.site {
            out.push_str(&format!("{indent}  at {site}\n"));
        }
        if let Some(fix) = &self.fix {
            out.push_str(&format!("{indent}  fix: {fix}\n"));
        }
        // The first divergence is evidence for machines; a text report prints it next anyway.
        for line in self
            .evidence
            .iter()
            .filter(|line| !line.starts_with("first divergence: "))
        {
            out.push_str(&format!("{indent}  evidence: {line}\n"));
        }
        out
    }
}

/// The environment entry of the files a Python rank opened outside its launch's private folder
/// (`detcheck._core.evidence`): `{"read": [...], "wrote": [...]}`, the paths it read before writing
/// them and those it wrote, sorted, at most 32 of each.
pub(crate) const FILES_KEY: &str = "detcheck.files";

/// The fact a Python rank records at its first receive from any source
/// (`detcheck._launch.arrival`): the program's line.
pub(crate) const ANY_SOURCE_KEY: &str = "site:any_source";

/// The fact a MindSpore rank records (`detcheck._mindspore.frontend`): `mindspore`. Without it
/// a program's seeds and fixes are PyTorch's.
pub(crate) const FRAMEWORK_KEY: &str = "site:framework";

/// The fact of the line that built the recorded model (python/python/detcheck/_core/evidence.py
/// `note_module_built`).
pub(crate) const MODEL_BUILT_KEY: &str = "site:model_built";
/// The fact beside it naming the framework helper that built the model from a configuration and
/// seeds through an option of its own (`LightningCLI`: the recorder's `MODEL_BUILDERS`).
pub(crate) const MODEL_BUILDER_KEY: &str = "site:model_builder";

/// The program's first line that started a `multiprocessing` process itself and handed it a
/// model (not a library's: data-loader workers, `torch.multiprocessing.spawn`'s ranks), noted
/// by the Python recorder.
pub(crate) const PROCESS_STARTED_KEY: &str = "site:process_started";

/// The program's first line that made a data loader whose workers hand over their batches as
/// they finish them (`in_order=False`), noted by the Python recorder: the batches' order is
/// timing.
pub(crate) const OUT_OF_ORDER_LOADER_KEY: &str = "site:out_of_order_loader";

/// The fact of a rank that is a process the program started itself and that joined its
/// process group at this line (python/python/detcheck/_launch/startup.py `_adopt`).
pub(crate) const RANK_STARTED_KEY: &str = "site:rank_started";
/// The fact of such a rank where the process that started it seeded a generator: where it first
/// did (`_core.evidence.SEEDED_VAR`, passed on in the environment).
pub(crate) const PARENT_SEEDED_KEY: &str = "site:parent_seeded";

/// The fact a Python rank records at its first call that made a generator without a seed, which
/// seeds itself from OS entropy (`numpy.random.default_rng()`, a gymnasium environment's first
/// `reset()` without `seed=`: `detcheck._core.evidence.UNSEEDED_MAKERS`): the program's line.
pub(crate) const UNSEEDED_GENERATOR_KEY: &str = "site:unseeded_generator";
/// The fact beside it naming its maker (`numpy`, `gymnasium`; absent: `numpy`, the first).
pub(crate) const UNSEEDED_MAKER_KEY: &str = "site:unseeded_maker";

/// The fact a Python rank records at the program's first draw from numpy's global generator
/// (or read of its state, from which a library derives a seed: `datasets`' `shuffle()`) before
/// anything seeded it (`detcheck._core.evidence`): the program's line.
pub(crate) const UNSEEDED_GLOBAL_KEY: &str = "site:unseeded_global";

/// The same fact of Python's `random` (`random.shuffle`, `random.randint`, ... before
/// `random.seed`).
pub(crate) const UNSEEDED_PYTHON_KEY: &str = "site:unseeded_python";

/// The fact a Python rank records at the program's first call that seeds torch when torch's
/// default generator had been drawn from before it (torch's draws are C calls, not followed one
/// by one: the seeding call's line, before which the draws happened).
pub(crate) const UNSEEDED_TORCH_KEY: &str = "site:unseeded_torch";

/// The fact a Python rank records when the program seeds a generator with a value it drew from
/// a global generator before anything seeded that one (`seed = random.randint(1, 10000)`, then
/// `torch.manual_seed(seed)`: pytorch/examples' dcgan without `--manualSeed`): the draw's line.
pub(crate) const SEED_DRAWN_KEY: &str = "site:seed_drawn";

/// The fact a Python rank records, the model's line (`site:model_built`'s), when torch's
/// generator was drawn from before that model was built and nothing had seeded it yet
/// (pytorch/examples' regression draws its target function first): a seed above the model's
/// line only would leave those draws differing.
pub(crate) const DRAWN_BEFORE_MODEL_KEY: &str = "site:drawn_before_model";
