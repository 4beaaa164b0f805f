//! The one table of what changes a run's bits and how to pin it: [`HINTS`].
//!
//! Every kind of finding that points at a cause outside the compared tensors reads its advice
//! here, so a failed check says *why* in one style wherever the cause was found:
//!
//! - [`Subject::Setting`]: a variable that pins a stack's reduction or hashing, with the value
//!   detcheck recommends (`detcheck env` prints these; `mpirun` launches set the MPI ones);
//! - [`Subject::Variable`]: an environment-snapshot key whose difference between two runs
//!   explains a divergence but has no single right value (thread counts, library versions);
//! - [`Subject::Nonexistent`]: a variable people set that no library reads
//!   (`NCCL_DETERMINISTIC`), with what they meant (`detcheck env --check` flags it);
//! - [`Subject::Operator`]: a PyTorch operator known to be nondeterministic (atomics, cuBLAS or
//!   cuDNN algorithm choice) and the setting that makes it deterministic. The operator
//!   drill-down (`crate::compare`) looks an operator up here by its base name.
//!
//! [`Hint::advice`] gives the serialisable, one-line form reports carry ([`Advice`]).
//!
//! Sources: each entry's `reference`. The operator rows follow PyTorch's documentation of
//! `torch.use_deterministic_algorithms` (the operators it makes deterministic, and those it
//! refuses), its reproducibility notes (cuDNN, cuBLAS's `CUBLAS_WORKSPACE_CONFIG`) and
//! `torch.nn.functional.scaled_dot_product_attention`'s notes; the settings follow each library's
//! documentation of its variables.
//!
//! Invariant (one hint table): every piece of advice a report gives about a cause outside the
//! tensors (a variable, a library, an operator) is a row here, printed in one style (`fix: why
//! (reference)`).
//!
//! Determinism: a constant table; lookups are pure functions of a name.
//!
//! Limits: the operator rows are for PyTorch 2.x on CUDA; most of these operators are
//! deterministic on the CPU, so a CPU run that diverges in one of them points elsewhere (the
//! finding still says what is known). A library that ignores a variable does so silently: the
//! checks remain the proof.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What a hint is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A variable that pins a stack, with the value detcheck recommends.
    Setting,
    /// An environment-snapshot key that explains a divergence when it differs.
    Variable,
    /// A variable people set that does not exist (`detcheck env --check` flags it).
    Nonexistent,
    /// An operator known to be nondeterministic.
    Operator,
    /// A call a Python program makes at start-up to pin its randomness and its kernels
    /// (`detcheck.seed_all`; `detcheck check --deterministic` makes it for an unmodified
    /// program): `name` is the call, `value` what it is given.
    Startup,
}

/// One row of [`HINTS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hint {
    /// What the row is about.
    pub subject: Subject,
    /// The stack it applies to: `openmpi`, `mpich`, `intel-mpi`, `nccl`, `hccl`, `cuda`,
    /// `python`, `openmp`, `torch`, `detcheck`.
    pub stack: &'static str,
    /// The variable or snapshot key; for an operator, its base name (`index_add` for
    /// `aten.index_add_.default`), where `*` stands for any run of characters.
    pub name: &'static str,
    /// A setting's recommended value (empty for other subjects).
    pub value: &'static str,
    /// What it does to the bits (a setting: what it pins).
    pub why: &'static str,
    /// What to do (a setting's is `set NAME=VALUE`, made by [`Hint::advice`]).
    pub fix: &'static str,
    /// Where it is documented.
    pub reference: &'static str,
}

/// A hint as reports carry it: owned, serialisable, one line when shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advice {
    /// What it is about: the variable, key or operator pattern.
    pub about: String,
    /// What it does to the bits.
    pub why: String,
    /// What to do.
    pub fix: String,
    /// Where it is documented.
    pub reference: String,
}

impl fmt::Display for Advice {
    /// `fix: why (reference)`, the one style every finding's hint is printed in.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.fix, self.why, self.reference)
    }
}

impl Hint {
    /// This process's value of a setting's variable, if it has one.
    #[must_use]
    pub fn current(&self) -> Option<String> {
        std::env::var(self.name).ok()
    }

    /// What applying a deterministic setting does (`hints::deterministic()`): `NAME=VALUE` for
    /// a launch variable, the Python statement for a start-up call, with `SEED` replaced by
    /// `seed` when one is given (only there: `PYTHONHASHSEED` keeps its name).
    #[must_use]
    pub fn statement(&self, seed: Option<u64>) -> String {
        match (self.subject, seed) {
            (Subject::Setting, _) => format!("{}={}", self.name, self.value),
            (_, Some(seed)) => self.fix.replace("SEED", &seed.to_string()),
            (_, None) => self.fix.to_owned(),
        }
    }

    /// The hint as reports carry it.
    #[must_use]
    pub fn advice(&self) -> Advice {
        let fix = match self.subject {
            Subject::Setting => format!("set {}={}", self.name, self.value),
            _ => self.fix.to_owned(),
        };
        Advice {
            about: self.name.to_owned(),
            why: self.why.to_owned(),
            fix,
            reference: self.reference.to_owned(),
        }
    }
}

/// The settings (rows of [`Subject::Setting`]), in table order.
pub fn settings() -> impl Iterator<Item = &'static Hint> {
    HINTS.iter().filter(|h| h.subject == Subject::Setting)
}

/// What `detcheck check --deterministic` and `detcheck.seed_all(seed, deterministic=True)`
/// apply, in order: the launch variables (`HCCL_DETERMINISTIC`, `CUBLAS_WORKSPACE_CONFIG`,
/// `PYTHONHASHSEED`; a running process can set the first two for itself only before its
/// communicators and CUDA start, and never the last), then the [`Subject::Startup`] calls of
/// Python, numpy, PyTorch and MindSpore. `SEED` in a value stands for the seed.
pub fn deterministic() -> impl Iterator<Item = &'static Hint> {
    HINTS.iter().filter(|h| {
        h.subject == Subject::Startup
            || (h.subject == Subject::Setting && DETERMINISTIC_VARIABLES.contains(&h.name))
    })
}

/// [`deterministic()`]'s settings that apply to a program of `frameworks` (`torch`,
/// `mindspore`): Python's, and each framework's own with its device stack's (torch: CUDA's;
/// MindSpore: HCCL's). Every setting when `frameworks` is empty (the program's are unknown).
pub fn deterministic_for<'a>(frameworks: &'a [String]) -> impl Iterator<Item = &'static Hint> + 'a {
    deterministic().filter(move |h| {
        frameworks.is_empty()
            || h.stack == "python"
            || frameworks.iter().any(|f| match f.as_str() {
                "torch" => matches!(h.stack, "torch" | "cuda"),
                "mindspore" => matches!(h.stack, "mindspore" | "hccl"),
                _ => false,
            })
    })
}

/// The launch variables among [`deterministic()`]'s settings.
const DETERMINISTIC_VARIABLES: [&str; 3] = [
    "HCCL_DETERMINISTIC",
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
];

/// The variables that do not exist though people set them (rows of [`Subject::Nonexistent`]),
/// with what they meant in `fix`.
pub fn nonexistent() -> impl Iterator<Item = &'static Hint> {
    HINTS.iter().filter(|h| h.subject == Subject::Nonexistent)
}

/// The hint for an environment-snapshot key that differs between two runs: a setting or a
/// variable row of that exact name.
#[must_use]
pub fn for_variable(key: &str) -> Option<&'static Hint> {
    HINTS.iter().find(|h| {
        matches!(
            h.subject,
            Subject::Setting | Subject::Variable | Subject::Nonexistent
        ) && h.name == key
    })
}

/// The hint for a PyTorch operator, named as the dispatcher names it
/// (`aten.index_add_.default`, `index_add`): matched on its base name, without namespace,
/// overload and in-place underscore.
#[must_use]
pub fn for_operator(op: &str) -> Option<&'static Hint> {
    let base = operator_base(op);
    HINTS
        .iter()
        .filter(|h| h.subject == Subject::Operator)
        .find(|h| glob(h.name, base))
}

/// The operators that draw from a random generator, by base name (PyTorch's and MindSpore's):
/// their output follows a generator's state, which is no input of the call.
const RANDOM_OPERATORS: [&str; 12] = [
    "rand*",
    "*dropout*",
    "bernoulli*",
    "multinomial",
    "normal*",
    "uniform*",
    "exponential*",
    "Dropout*",
    "Uniform*",
    "StandardNormal",
    "Multinomial",
    "RandomChoiceWithMask",
];

/// Whether `op` (named as [`for_operator`] takes it) draws from a random generator.
#[must_use]
pub fn is_random_operator(op: &str) -> bool {
    let base = operator_base(op);
    RANDOM_OPERATORS.iter().any(|p| glob(p, base))
}

/// `aten.index_add_.default` -> `index_add`; a name without dots is its own base.
fn operator_base(op: &str) -> &str {
    let mut parts = op.split('.');
    let base = match (parts.next(), parts.next()) {
        (Some(_namespace), Some(name)) => name,
        (Some(name), None) => name,
        _ => op,
    };
    base.strip_suffix('_')
        .filter(|b| !b.is_empty() && !b.ends_with('_'))
        .unwrap_or(base)
}

/// `pattern` with `*` standing for any run of characters, against all of `text`.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(tail) = text.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|&i| tail.is_char_boundary(i))
                .any(|i| glob(rest, &tail[i..]))
        }
    }
}

/// Where PyTorch documents its deterministic algorithms.
const TORCH_DETERMINISTIC: &str = "PyTorch: torch.use_deterministic_algorithms";
/// The fix for the operators that setting makes deterministic.
const USE_DETERMINISTIC: &str =
    "call torch.use_deterministic_algorithms(True) before the first step";
/// The fix for the operators that setting refuses (it raises: there is no deterministic kernel).
const NO_DETERMINISTIC_KERNEL: &str = "no deterministic CUDA kernel: \
    torch.use_deterministic_algorithms(True) makes it raise, so replace it (or run it on the CPU)";

/// Where MindSpore documents fixing a script's randomness (seed 002: set_seed, the dataset's
/// seed and workers, deterministic operators).
const MINDSPORE_RANDOMNESS: &str =
    "MindSpore: fixing randomness to reproduce a script's results (fixing_randomness)";

/// The fix for operators that draw from a generator.
const SEED_THE_GENERATOR: &str = "seed the generator identically in every run before the step \
    (torch.manual_seed(seed), or a torch.Generator seeded from the run's seed; data-loader \
    workers through worker_init_fn), never from the clock or OS entropy";

/// Every hint: settings by stack (the order `detcheck env` prints), then variables that do not
/// exist, snapshot keys, then operators.
pub const HINTS: &[Hint] = &[
    Hint {
        subject: Subject::Setting,
        stack: "openmpi",
        name: "OMPI_MCA_coll_tuned_use_dynamic_rules",
        value: "1",
        why: "lets the forced algorithm below override coll_tuned's size-based choice",
        fix: "",
        reference: "ompi_info --param coll tuned --level 9",
    },
    Hint {
        subject: Subject::Setting,
        stack: "openmpi",
        name: "OMPI_MCA_coll_tuned_allreduce_algorithm",
        value: "4",
        why: "MPI_Allreduce always uses the ring algorithm (4), whatever the message size",
        fix: "",
        reference: "ompi_info --param coll tuned --level 9",
    },
    Hint {
        subject: Subject::Setting,
        stack: "openmpi",
        name: "OMPI_MCA_coll",
        value: "^hcoll,ucc",
        why: "keeps HCOLL and UCC, which take precedence over coll_tuned where installed, out",
        fix: "",
        reference: "ompi_info --param coll all",
    },
    Hint {
        subject: Subject::Setting,
        stack: "mpich",
        name: "MPIR_CVAR_DEVICE_COLLECTIVES",
        value: "none",
        why: "the device (ch4) never overrides the MPIR-level algorithm chosen below",
        fix: "",
        reference: "mpivars (MPICH 4)",
    },
    Hint {
        subject: Subject::Setting,
        stack: "mpich",
        name: "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM",
        value: "recursive_doubling",
        why: "MPI_Allreduce always uses recursive doubling, whatever the message size",
        fix: "",
        reference: "mpivars (MPICH 4)",
    },
    Hint {
        subject: Subject::Setting,
        stack: "intel-mpi",
        name: "I_MPI_CBWR",
        value: "1",
        why: "conditional bitwise reproducibility of reductions for one rank count and \
               placement (2 also across CPU types, slower)",
        fix: "",
        reference: "Intel MPI Library Developer Reference, I_MPI_CBWR",
    },
    Hint {
        subject: Subject::Setting,
        stack: "nccl",
        name: "NCCL_ALGO",
        value: "Ring",
        why: "allreduce always uses the ring algorithm (not Tree, CollNet or NVLS)",
        fix: "",
        reference: "NCCL environment variables",
    },
    Hint {
        subject: Subject::Setting,
        stack: "nccl",
        name: "NCCL_PROTO",
        value: "Simple",
        why: "one protocol for every message size (LL and LL128 change the chunking)",
        fix: "",
        reference: "NCCL environment variables",
    },
    Hint {
        subject: Subject::Setting,
        stack: "nccl",
        name: "NCCL_MIN_NCHANNELS",
        value: "4",
        why: "with NCCL_MAX_NCHANNELS, a fixed channel count, so a fixed split of the buffer",
        fix: "",
        reference: "NCCL environment variables",
    },
    Hint {
        subject: Subject::Setting,
        stack: "nccl",
        name: "NCCL_MAX_NCHANNELS",
        value: "4",
        why: "with NCCL_MIN_NCHANNELS, a fixed channel count",
        fix: "",
        reference: "NCCL environment variables",
    },
    Hint {
        subject: Subject::Setting,
        stack: "nccl",
        name: "NCCL_NVLS_ENABLE",
        value: "0",
        why: "no NVLink SHARP in-switch reductions",
        fix: "",
        reference: "NCCL environment variables",
    },
    Hint {
        subject: Subject::Setting,
        stack: "nccl",
        name: "NCCL_COLLNET_ENABLE",
        value: "0",
        why: "no in-network (SHARP) reductions",
        fix: "",
        reference: "NCCL environment variables",
    },
    Hint {
        subject: Subject::Setting,
        stack: "hccl",
        name: "HCCL_DETERMINISTIC",
        value: "true",
        why: "deterministic reduction order in HCCL collectives (Ascend)",
        fix: "",
        reference: "msprobe seed_all; CANN HCCL environment variables; MindSpore: \
                    mindspore.set_deterministic",
    },
    Hint {
        subject: Subject::Setting,
        stack: "cuda",
        name: "CUBLAS_WORKSPACE_CONFIG",
        value: ":4096:8",
        why: "cuBLAS uses fixed workspaces, so its split-K reductions repeat",
        fix: "",
        reference: "cuBLAS reproducibility; torch.use_deterministic_algorithms",
    },
    Hint {
        subject: Subject::Setting,
        stack: "python",
        name: "PYTHONHASHSEED",
        value: "0",
        why: "str/bytes hashes, so set and dict-of-set iteration orders repeat",
        fix: "",
        reference: "Python command line and environment",
    },

    Hint {
        subject: Subject::Startup,
        stack: "python",
        name: "random.seed",
        value: "SEED",
        why: "Python's global generator (random.random, random.shuffle) starts from the seed",
        fix: "random.seed(SEED)",
        reference: "Python: random.seed",
    },
    Hint {
        subject: Subject::Startup,
        stack: "python",
        name: "numpy.random.seed",
        value: "SEED",
        why: "numpy's legacy global generator (np.random.rand, shuffle) starts from the seed \
              (applied when numpy is imported)",
        fix: "numpy.random.seed(SEED)",
        reference: "NumPy: numpy.random.seed",
    },
    Hint {
        subject: Subject::Startup,
        stack: "torch",
        name: "torch.manual_seed",
        value: "SEED",
        why: "torch's default generators, the CPU's and every CUDA device's, start from the \
              seed (dropout masks, random init, randperm)",
        fix: "torch.manual_seed(SEED)",
        reference: "PyTorch: Reproducibility, torch.manual_seed",
    },
    Hint {
        subject: Subject::Startup,
        stack: "torch",
        name: "torch.use_deterministic_algorithms",
        value: "True",
        why: "operators with atomics or algorithm choice use deterministic kernels; those \
              without one raise instead of varying",
        fix: "torch.use_deterministic_algorithms(True)",
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Startup,
        stack: "torch",
        name: "torch.backends.cudnn.deterministic",
        value: "True",
        why: "cuDNN convolutions pick deterministic algorithms",
        fix: "torch.backends.cudnn.deterministic = True",
        reference: "PyTorch: Reproducibility (cuDNN)",
    },
    Hint {
        subject: Subject::Startup,
        stack: "torch",
        name: "torch.backends.cudnn.benchmark",
        value: "False",
        why: "cuDNN does not time candidate algorithms, so it does not pick another one in \
              another run",
        fix: "torch.backends.cudnn.benchmark = False",
        reference: "PyTorch: Reproducibility (cuDNN)",
    },
    Hint {
        subject: Subject::Startup,
        stack: "torch",
        name: "torch._inductor.config.deterministic",
        value: "True",
        why: "torch.compile's Inductor skips the on-device benchmarking whose choice of kernel \
              changes numerics (autotuning, padding), so a compiled model picks the same kernels \
              in every run (set as TORCHINDUCTOR_DETERMINISTIC=1 until Inductor's config is \
              imported); Inductor's CPU kernels that add with atomics follow \
              torch.use_deterministic_algorithms instead",
        fix: "torch._inductor.config.deterministic = True",
        reference: "PyTorch: torch/_inductor/config.py, `deterministic` (TORCHINDUCTOR_DETERMINISTIC)",
    },
    Hint {
        subject: Subject::Startup,
        stack: "mindspore",
        name: "mindspore.set_seed",
        value: "SEED",
        why: "MindSpore's global seed: parameter initialisers, random operators, numpy's global \
              generator and the dataset pipeline start from it (applied when mindspore is \
              imported)",
        fix: "mindspore.set_seed(SEED)",
        reference: MINDSPORE_RANDOMNESS,
    },
    Hint {
        subject: Subject::Startup,
        stack: "mindspore",
        name: "mindspore.manual_seed",
        value: "SEED",
        why: "MindSpore's default generator (the mint random operators) starts from the seed \
              instead of a random one",
        fix: "mindspore.manual_seed(SEED)",
        reference: "MindSpore: mindspore.manual_seed",
    },
    Hint {
        subject: Subject::Startup,
        stack: "mindspore",
        name: "mindspore.dataset.config.set_seed",
        value: "SEED",
        why: "the dataset pipeline's shuffles and random augmentations start from the seed",
        fix: "mindspore.dataset.config.set_seed(SEED)",
        reference: MINDSPORE_RANDOMNESS,
    },
    Hint {
        subject: Subject::Startup,
        stack: "mindspore",
        name: "mindspore.dataset.config.set_num_parallel_workers",
        value: "1",
        why: "dataset operations run on one worker by default, so parallel processing cannot \
              change the data order (a dataset given its own num_parallel_workers keeps it)",
        fix: "mindspore.dataset.config.set_num_parallel_workers(1)",
        reference: MINDSPORE_RANDOMNESS,
    },
    Hint {
        subject: Subject::Startup,
        stack: "mindspore",
        name: "mindspore.set_deterministic",
        value: "True",
        why: "operators run deterministic kernels, and HCCL reduces in a fixed order (MindSpore \
              2.10's spelling of set_context(deterministic=\"ON\"))",
        fix: "mindspore.set_deterministic(True)",
        reference: "MindSpore: mindspore.set_deterministic",
    },
    Hint {
        subject: Subject::Nonexistent,
        stack: "nccl",
        name: "NCCL_DETERMINISTIC",
        value: "",
        why: "no such variable: setting it changes nothing",
        fix: "NCCL has no such variable; pin its algorithm, protocol and channels instead \
              (NCCL_ALGO=Ring, NCCL_PROTO=Simple, NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS), and turn \
              NVLS and CollNet off",
        reference: "NCCL environment variables",
    },
    Hint {
        subject: Subject::Nonexistent,
        stack: "nccl",
        name: "NCCL_DETERMINISM",
        value: "",
        why: "no such variable: setting it changes nothing",
        fix: "NCCL has no such variable; pin NCCL_ALGO, NCCL_PROTO and the channel count instead",
        reference: "NCCL environment variables",
    },
    Hint {
        subject: Subject::Nonexistent,
        stack: "torch",
        name: "TORCH_DETERMINISTIC",
        value: "",
        why: "no such variable: setting it changes nothing",
        fix: "PyTorch has no such variable; call torch.use_deterministic_algorithms(True) and set \
              CUBLAS_WORKSPACE_CONFIG=:4096:8",
        reference: "PyTorch reproducibility notes",
    },
    Hint {
        subject: Subject::Nonexistent,
        stack: "torch",
        name: "PYTORCH_DETERMINISTIC",
        value: "",
        why: "no such variable: setting it changes nothing",
        fix: "PyTorch has no such variable; call torch.use_deterministic_algorithms(True)",
        reference: "PyTorch reproducibility notes",
    },
    Hint {
        subject: Subject::Nonexistent,
        stack: "cuda",
        name: "CUDNN_DETERMINISTIC",
        value: "",
        why: "no such variable: setting it changes nothing",
        fix: "not a variable; set torch.backends.cudnn.deterministic = True and \
              torch.backends.cudnn.benchmark = False in the program",
        reference: "PyTorch reproducibility notes",
    },
    Hint {
        subject: Subject::Nonexistent,
        stack: "cuda",
        name: "CUBLAS_DETERMINISTIC",
        value: "",
        why: "no such variable: setting it changes nothing",
        fix: "cuBLAS has no such variable; set CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8)",
        reference: "PyTorch reproducibility notes",
    },
    Hint {
        subject: Subject::Nonexistent,
        stack: "hccl",
        name: "HCCL_DETERMINISM",
        value: "",
        why: "no such variable: setting it changes nothing",
        fix: "HCCL's switch is HCCL_DETERMINISTIC=true",
        reference: "CANN HCCL environment variables",
    },
    Hint {
        subject: Subject::Variable,
        stack: "openmp",
        name: "OMP_NUM_THREADS",
        value: "",
        why: "CPU kernels (BLAS, reductions) split their sums by thread count, so the order of \
              additions follows it",
        fix: "run both sides with the same OMP_NUM_THREADS (and torch.set_num_threads)",
        reference: "OpenMP specification, OMP_NUM_THREADS; PyTorch: CPU threading",
    },
    Hint {
        subject: Subject::Variable,
        stack: "hccl",
        name: "HCCL_ALGO",
        value: "",
        why: "selects HCCL's collective algorithm per level, and with it the order of additions",
        fix: "set the same HCCL_ALGO on both sides, and HCCL_DETERMINISTIC=true",
        reference: "CANN HCCL environment variables",
    },
    Hint {
        subject: Subject::Variable,
        stack: "detcheck",
        name: "detcheck.kernel",
        value: "",
        why: "the runs picked different CPU kernels (vector widths); detcheck's reductions give \
              the same bits on each, so a difference points at another library's kernels",
        fix: "compare on machines of one CPU type, or pin the libraries' CPU dispatch \
              (MKL_CBWR, ATEN_CPU_CAPABILITY)",
        reference: "detcheck: value/reduce.rs; PyTorch: ATEN_CPU_CAPABILITY",
    },
    Hint {
        subject: Subject::Variable,
        stack: "torch",
        name: "torch.version",
        value: "",
        why: "another PyTorch version may pick other kernels or change an operator's arithmetic",
        fix: "run both sides with one PyTorch version",
        reference: "PyTorch reproducibility notes",
    },
    Hint {
        subject: Subject::Variable,
        stack: "torch",
        name: "torch.cuda",
        value: "",
        why: "another CUDA version ships other cuBLAS and cuDNN kernels",
        fix: "run both sides with one CUDA build of PyTorch",
        reference: "PyTorch reproducibility notes",
    },
    Hint {
        subject: Subject::Variable,
        stack: "torch",
        name: "torch.cudnn",
        value: "",
        why: "another cuDNN version ships other convolution algorithms",
        fix: "run both sides with one cuDNN version",
        reference: "PyTorch reproducibility notes",
    },
    Hint {
        subject: Subject::Variable,
        stack: "mpi",
        name: "mpi.library",
        value: "",
        why: "another MPI library (or version) picks other collective algorithms",
        fix: "run both sides with one MPI library, pinned with `detcheck env --stack mpi`",
        reference: "detcheck env",
    },
    Hint {
        subject: Subject::Operator,
        stack: "mindspore",
        name: "Dropout",
        value: "",
        why: "MindSpore's `ops.Dropout` (what `nn.Dropout` runs) draws its mask in a CPU kernel \
              whose draws depend on timing in PyNative, even after `mindspore.set_seed` \
              (MindSpore 2.10: six plain runs of a seeded two-epoch script gave six losses; \
              neither `set_deterministic` nor one thread fixed it)",
        fix: "draw the mask with `mindspore.ops.dropout(x, p=P, training=self.training)`, which \
              follows the global seed call by call (the same script gave one loss in six runs), \
              and seed it with `mindspore.set_seed(0)`",
        reference: "MindSpore: mindspore.ops.dropout, mindspore.nn.Dropout",
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "rand*",
        value: "",
        why: "draws from a random generator (rand, randn, randint, randperm): its output follows the generator's state, which is no input of the \
              call, so a generator seeded differently (from the clock, OS entropy, or not at \
              all) gives other bits from the same inputs",
        fix: SEED_THE_GENERATOR,
        reference: "PyTorch reproducibility notes: controlling sources of randomness",
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "*dropout*",
        value: "",
        why: "draws its mask from a random generator: its output follows the generator's state, which is no input of the \
              call, so a generator seeded differently (from the clock, OS entropy, or not at \
              all) gives other bits from the same inputs",
        fix: SEED_THE_GENERATOR,
        reference: "PyTorch reproducibility notes: controlling sources of randomness",
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "bernoulli",
        value: "",
        why: "draws from a random generator (dropout's mask): its output follows the generator's state, which is no input of the \
              call, so a generator seeded differently (from the clock, OS entropy, or not at \
              all) gives other bits from the same inputs",
        fix: SEED_THE_GENERATOR,
        reference: "PyTorch reproducibility notes: controlling sources of randomness",
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "normal",
        value: "",
        why: "draws from a random generator: its output follows the generator's state, which is no input of the \
              call, so a generator seeded differently (from the clock, OS entropy, or not at \
              all) gives other bits from the same inputs",
        fix: SEED_THE_GENERATOR,
        reference: "PyTorch reproducibility notes: controlling sources of randomness",
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "uniform",
        value: "",
        why: "draws from a random generator (parameter initialisation): its output follows the generator's state, which is no input of the \
              call, so a generator seeded differently (from the clock, OS entropy, or not at \
              all) gives other bits from the same inputs",
        fix: SEED_THE_GENERATOR,
        reference: "PyTorch reproducibility notes: controlling sources of randomness",
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "multinomial",
        value: "",
        why: "draws from a random generator (sampling): its output follows the generator's state, which is no input of the \
              call, so a generator seeded differently (from the clock, OS entropy, or not at \
              all) gives other bits from the same inputs",
        fix: SEED_THE_GENERATOR,
        reference: "PyTorch reproducibility notes: controlling sources of randomness",
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "index_add",
        value: "",
        why: "on CUDA, adds into its destination with atomicAdd, in the order the threads arrive",
        fix: USE_DETERMINISTIC,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "scatter_add",
        value: "",
        why: "on CUDA, adds into its destination with atomicAdd (also gather's backward)",
        fix: USE_DETERMINISTIC,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "scatter_reduce",
        value: "",
        why: "on CUDA, reduces into its destination with atomics (sum and mean are made \
              deterministic; prod is not)",
        fix: USE_DETERMINISTIC,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "scatter",
        value: "",
        why: "on CUDA, writes duplicate indices in thread order",
        fix: USE_DETERMINISTIC,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "index_put",
        value: "",
        why: "with accumulate=True, adds duplicate indices with atomics (CUDA); with \
              accumulate=False, keeps one of them in thread order",
        fix: USE_DETERMINISTIC,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "put",
        value: "",
        why: "with accumulate=True on CUDA, adds with atomics",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "index_copy",
        value: "",
        why: "writes duplicate indices in thread order",
        fix: USE_DETERMINISTIC,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "cumsum",
        value: "",
        why: "on CUDA, its parallel scan adds in an order that can change between launches",
        fix: USE_DETERMINISTIC,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "embedding_dense_backward",
        value: "",
        why: "on CUDA, adds the gradients of repeated indices with atomics",
        fix: USE_DETERMINISTIC,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "*embedding_bag*backward",
        value: "",
        why: "on CUDA, adds the gradients of repeated indices with atomics (mode='max' has no \
              deterministic kernel)",
        fix: USE_DETERMINISTIC,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "*convolution*",
        value: "",
        why: "on CUDA, cuDNN picks a convolution algorithm per run (benchmark mode) and some \
              of its algorithms add with atomics",
        fix: "set torch.backends.cudnn.deterministic = True and torch.backends.cudnn.benchmark \
              = False (torch.use_deterministic_algorithms(True) does the first)",
        reference: "PyTorch reproducibility notes: cuDNN",
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "*mm",
        value: "",
        why: "on CUDA, cuBLAS may split the reduction differently when its workspace is \
              shared between streams",
        fix: "set CUBLAS_WORKSPACE_CONFIG=:4096:8 and call \
              torch.use_deterministic_algorithms(True)",
        reference: "PyTorch reproducibility notes: cuBLAS; CUDA cuBLAS results reproducibility",
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "upsample_*_backward",
        value: "",
        why: "on CUDA, interpolation's backward (linear, bilinear, bicubic, trilinear) adds \
              with atomics",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "grid_sampler_*_backward",
        value: "",
        why: "on CUDA, adds with atomics",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "*_pad*_backward",
        value: "",
        why: "on CUDA, reflection and replication padding's backward add with atomics",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "*pool*_backward",
        value: "",
        why: "on CUDA, adaptive, average (3d), fractional and max (3d) pooling's backward add \
              with atomics",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "max_unpool*",
        value: "",
        why: "on CUDA, writes duplicate indices in thread order",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "nll_loss*",
        value: "",
        why: "on CUDA, reduces with atomics",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "*ctc_loss_backward",
        value: "",
        why: "on CUDA, adds with atomics",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "histc",
        value: "",
        why: "on CUDA, counts with atomics",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "bincount",
        value: "",
        why: "on CUDA with weights, adds with atomics",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "kthvalue",
        value: "",
        why: "on CUDA, which of equal values' indices it returns depends on thread order",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "median",
        value: "",
        why: "on CUDA with indices, which of equal values' indices it returns depends on \
              thread order",
        fix: NO_DETERMINISTIC_KERNEL,
        reference: TORCH_DETERMINISTIC,
    },
    Hint {
        subject: Subject::Operator,
        stack: "torch",
        name: "*_attention_backward",
        value: "",
        why: "on CUDA, the memory-efficient and flash attention backward kernels add partial \
              gradients with atomics",
        fix: "use the math backend for the backward pass (torch.nn.attention.sdpa_kernel(\
              SDPBackend.MATH)), or accept run-to-run differences",
        reference: "PyTorch: torch.nn.functional.scaled_dot_product_attention",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_match_on_their_base_name() {
        let name = |op: &str| for_operator(op).map(|h| h.name);
        assert_eq!(name("aten.index_add_.default"), Some("index_add"));
        assert_eq!(name("aten.index_add.out"), Some("index_add"));
        assert_eq!(name("index_add_"), Some("index_add"));
        assert_eq!(name("aten.scatter_add_.default"), Some("scatter_add"));
        assert_eq!(
            name("aten.embedding_dense_backward.default"),
            Some("embedding_dense_backward")
        );
        assert_eq!(name("aten.addmm.default"), Some("*mm"));
        assert_eq!(
            name("aten.upsample_bilinear2d_backward.default"),
            Some("upsample_*_backward")
        );
        assert_eq!(
            name("aten._scaled_dot_product_efficient_attention_backward.default"),
            Some("*_attention_backward")
        );
        assert_eq!(
            name("aten.cudnn_convolution.default"),
            Some("*convolution*")
        );
        assert_eq!(name("aten.bernoulli_.float"), Some("bernoulli"));
        assert_eq!(name("aten.native_dropout.default"), Some("*dropout*"));
        assert_eq!(name("aten.randperm.default"), Some("rand*"));
        assert_eq!(name("aten.add.Tensor"), None);
        assert_eq!(name("aten.relu.default"), None);
        assert_eq!(name("myns.entropy_mean.default"), None);
        assert_eq!(name("aten.__and__.Tensor"), None);
    }

    #[test]
    fn variables_and_settings_are_found_by_their_exact_name() {
        assert_eq!(
            for_variable("PYTHONHASHSEED").unwrap().advice().fix,
            "set PYTHONHASHSEED=0"
        );
        assert_eq!(for_variable("OMP_NUM_THREADS").unwrap().stack, "openmp");
        assert!(for_variable("torch.version").is_some());
        assert!(for_variable("host.name").is_none());
        assert!(
            for_variable("index_add").is_none(),
            "operators are not variables"
        );
        let absent = for_variable("NCCL_DETERMINISTIC").unwrap();
        assert_eq!(absent.subject, Subject::Nonexistent);
        assert!(absent.fix.contains("NCCL_ALGO=Ring"), "{absent:?}");
        assert_eq!(nonexistent().count(), 7);
        let advice = for_variable("NCCL_ALGO").unwrap().advice();
        assert_eq!(
            advice.to_string(),
            "set NCCL_ALGO=Ring: allreduce always uses the ring algorithm (not Tree, CollNet or \
             NVLS) (NCCL environment variables)"
        );
    }

    #[test]
    fn every_name_is_listed_once_per_subject_and_rows_are_complete() {
        let mut names: Vec<_> = HINTS
            .iter()
            .map(|h| (h.subject == Subject::Operator, h.name))
            .collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), HINTS.len());
        for h in HINTS {
            assert!(!h.why.is_empty() && !h.reference.is_empty(), "{h:?}");
            let valued = matches!(h.subject, Subject::Setting | Subject::Startup);
            assert_eq!(valued, !h.value.is_empty(), "{h:?}");
            assert_eq!(h.subject == Subject::Setting, h.fix.is_empty(), "{h:?}");
            if h.subject == Subject::Startup {
                assert!(
                    h.fix.starts_with(h.name),
                    "the statement makes the call: {h:?}"
                );
            }
        }
    }

    #[test]
    fn deterministic_lists_the_launch_variables_then_the_start_up_calls() {
        let names: Vec<_> = deterministic().map(|h| h.name).collect();
        assert_eq!(
            names,
            [
                "HCCL_DETERMINISTIC",
                "CUBLAS_WORKSPACE_CONFIG",
                "PYTHONHASHSEED",
                "random.seed",
                "numpy.random.seed",
                "torch.manual_seed",
                "torch.use_deterministic_algorithms",
                "torch.backends.cudnn.deterministic",
                "torch.backends.cudnn.benchmark",
                "torch._inductor.config.deterministic",
                "mindspore.set_seed",
                "mindspore.manual_seed",
                "mindspore.dataset.config.set_seed",
                "mindspore.dataset.config.set_num_parallel_workers",
                "mindspore.set_deterministic",
            ]
        );
        assert!(
            for_variable("torch.manual_seed").is_none(),
            "calls are not variables"
        );
    }

    #[test]
    fn random_operators_are_known_by_their_base_names() {
        for op in [
            "aten.native_dropout.default",
            "aten.bernoulli_.float",
            "aten.randn.default",
            "Dropout",
            "DropoutGenMask",
            "aten.uniform_.default",
        ] {
            assert!(is_random_operator(op), "{op}");
        }
        for op in ["aten.addmm.default", "MatMul", "aten.index_add_.default"] {
            assert!(!is_random_operator(op), "{op}");
        }
        assert!(for_operator("Dropout").is_some_and(|h| h.stack == "mindspore"));
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(glob("a*c", "abc"));
        assert!(glob("a*c", "ac"));
        assert!(!glob("a*c", "abcd"));
        assert!(glob("*mm", "bmm"));
        assert!(!glob("*mm", "mmx"));
        assert!(glob("x*y*z", "x1y2z"));
    }

    /// Issue 53: `--deterministic` listed MindSpore's and HCCL's settings for a PyTorch script.
    #[test]
    fn deterministic_settings_follow_the_programs_frameworks() {
        let stacks = |frameworks: &[&str]| -> Vec<&str> {
            let frameworks: Vec<String> = frameworks.iter().map(|f| (*f).to_owned()).collect();
            let mut s: Vec<&str> = deterministic_for(&frameworks).map(|h| h.stack).collect();
            s.dedup();
            s
        };
        assert_eq!(stacks(&["torch"]), ["cuda", "python", "torch"]);
        assert_eq!(stacks(&["mindspore"]), ["hccl", "python", "mindspore"]);
        assert_eq!(stacks(&[]).len(), 5, "unknown: every stack");
    }
}
