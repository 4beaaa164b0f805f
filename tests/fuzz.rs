//! A fuzz suite on the stable toolchain (docs/fuzzing.md): the readers of scenario files, trace
//! files, msprobe dumps and checkpoints, fed with valid inputs that proptest mutates (byte flips,
//! truncation, insertion, appended garbage, removal, huge length fields, splices of two files,
//! JSON values and numbers in text replaced by extreme ones), read through the public API as the
//! CLI reads them.
//!
//! Main type: [`Target`], one reader with its valid seed cases and its property. Every case must
//! hold, whatever its bytes:
//! - nothing panics (caught, the input saved), hangs (a deadline per case) or aborts: the
//!   allocator is capped at [`ALLOCATION_CAP`], so an allocation sized by a length taken from a
//!   file without checking it against the file's size aborts at once instead of swapping, and
//!   the case being read is left, replayable, in `target/fuzz-work/<process id>/<target>/`;
//! - an error names the case's folder or one of its files;
//! - a file under checksums (trace format 2 and its tensor files, checkpoints) that was changed
//!   at all reads as an error, never as other values, and so does an msprobe `dump.json` cut
//!   short or followed by garbage. In half of the trace and checkpoint cases the test makes the
//!   checksums hold again after the change ([`reseal_trace`], [`reseal_checkpoint`]), so that
//!   the bytes reach the parsers behind them; those cases must only not crash.
//!
//! Determinism: cases come from proptest's ChaCha generator seeded with `DETCHECK_FUZZ_SEED`
//! (a fixed default) and the target's name, so a run is replayed by its seed.
//! `DETCHECK_FUZZ_CASES` sets the cases per round (default [`DEFAULT_CASES`], a few seconds for
//! all targets in `cargo test`), and `DETCHECK_FUZZ_SECONDS` a time budget per target: rounds
//! with seeds `seed`, `seed + 1`, ... run until it is spent (CI: `.ci/run`). A failure is shrunk
//! and saved as a folder under `target/fuzz-failures/` (its files, and `expect`: whether they
//! must read as an error), which `DETCHECK_FUZZ_REPLAY=<folder>` checks again. Limits: version 1
//! trace files (no checksums; their writer is not public) are not fuzzed, and the values an
//! edited `.pt`, `.npy` or `dump.json` reads as are not checked: those formats cannot tell a
//! changed byte from other data.

use cap::Cap;
use detcheck::checkpoint::{load_checkpoint, save_checkpoint, CheckpointIdentity, RankCheckpoint};
use detcheck::compare::{compare_dumps, CompareOptions};
use detcheck::file::{DumpMode, TraceWriter};
use detcheck::value::derive_stream;
use detcheck::{KindRegistry, Stream, Tensor};
use md5::{Digest as _, Md5};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use std::alloc::System;
use std::collections::BTreeMap;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most memory the whole test process may hold. The readers hold a step of a rank at most,
/// so this is far above what any case needs, and far below what a length of 2^32 would ask.
const ALLOCATION_CAP: usize = 512 << 20;

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, ALLOCATION_CAP);

/// Cases per round when `DETCHECK_FUZZ_CASES` is not set.
const DEFAULT_CASES: u32 = 32;

/// The first seed when `DETCHECK_FUZZ_SEED` is not set.
const DEFAULT_SEED: u64 = 0x16_f022;

/// How long one case may take before it counts as a hang (debug build, a busy machine).
const CASE_DEADLINE: Duration = Duration::from_secs(30);

/// The files of one case, by path relative to its folder, and the seed case it was made from.
#[derive(Clone, PartialEq)]
struct Case {
    files: BTreeMap<String, Vec<u8>>,
    origin: usize,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes: Vec<_> = self
            .files
            .iter()
            .map(|(name, bytes)| format!("{name} ({} bytes)", bytes.len()))
            .collect();
        write!(f, "Case[seed case {}: {}]", self.origin, sizes.join(", "))
    }
}

impl Case {
    /// Every file under `dir`, recursively, as a case made from seed case `origin`.
    fn read(dir: &Path, origin: usize) -> Case {
        fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) {
            let mut entries: Vec<_> = std::fs::read_dir(dir)
                .expect("a seed folder")
                .map(|entry| entry.expect("a folder entry").path())
                .collect();
            entries.sort();
            for path in entries {
                if path.is_dir() {
                    walk(root, &path, files);
                } else {
                    let name = path.strip_prefix(root).expect("under the root");
                    let name = name.to_str().expect("a UTF-8 name").to_owned();
                    files.insert(name, std::fs::read(&path).expect("a seed file"));
                }
            }
        }
        let mut files = BTreeMap::new();
        walk(dir, dir, &mut files);
        Case { files, origin }
    }

    /// Writes the case into `dir`, replacing what was there.
    fn write(&self, dir: &Path) {
        if dir.exists() {
            std::fs::remove_dir_all(dir).expect("remove the last case");
        }
        for (name, bytes) in &self.files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("create a folder");
            std::fs::write(&path, bytes).expect("write a case file");
        }
    }
}

/// One change to a file's bytes. Positions are [`Index`]es, resolved against the bytes at hand.
#[derive(Clone, Debug)]
enum Mutation {
    /// XOR one byte with a non-zero mask.
    Flip { at: Index, mask: u8 },
    /// Cut the file.
    Truncate { to: Index },
    /// Insert bytes.
    Insert { at: Index, bytes: Vec<u8> },
    /// Remove up to `len` bytes.
    Remove { at: Index, len: usize },
    /// Overwrite a little-endian length field with a huge value.
    Huge { at: Index, width: usize, value: u64 },
    /// Append bytes (trailing garbage).
    Append { bytes: Vec<u8> },
    /// Repeat a range of the file after itself.
    Repeat { at: Index, len: usize },
    /// The file's bytes before `at`, then another seed file's bytes from `from` on.
    Splice {
        at: Index,
        donor: Index,
        from: Index,
    },
    /// In a JSON file: replace the value at one path by an extreme one (sizes, long names).
    Json { path: Index, value: usize },
    /// In any file: replace one run of ASCII digits (a size in JSON, an `.npy` header's shape,
    /// a zip or pickle field written as text) by a huge number.
    Number { run: Index, digits: &'static str },
}

/// Values that were crashes before, or are edges: sizes that overflow, long and odd strings.
fn extreme_json(which: usize) -> serde_json::Value {
    use serde_json::json;
    let values = [
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1u64 << 62),
        json!(1u64 << 40),
        json!(1u64 << 32),
        json!(4_294_967_295u64),
        json!(-1),
        json!(0),
        json!(1e308),
        json!(-0.0),
        json!("x".repeat(100_000)),
        json!(""),
        json!("../../../../etc/passwd"),
        json!("\u{0}\u{ffff}"),
        json!(null),
        json!(true),
        json!([]),
        json!({}),
        json!([u64::MAX, u64::MAX]),
    ];
    values[which % values.len()].clone()
}

/// The paths of every value in a JSON document, in document order.
fn json_paths(value: &serde_json::Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    out.push(prefix.clone());
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                prefix.push(key.clone());
                json_paths(child, prefix, out);
                prefix.pop();
            }
        }
        serde_json::Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                prefix.push(i.to_string());
                json_paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

impl Mutation {
    fn apply(&self, bytes: &mut Vec<u8>, donors: &[Vec<u8>]) {
        let len = bytes.len();
        let pos = |at: &Index| if len == 0 { 0 } else { at.index(len) };
        match self {
            Mutation::Flip { at, mask } => {
                if len > 0 {
                    bytes[pos(at)] ^= *mask;
                }
            }
            Mutation::Truncate { to } => bytes.truncate(pos(to)),
            Mutation::Insert { at, bytes: new } => {
                let at = if len == 0 { 0 } else { at.index(len + 1) };
                bytes.splice(at..at, new.iter().copied());
            }
            Mutation::Remove { at, len: n } => {
                let at = pos(at);
                bytes.drain(at..(at + n).min(len));
            }
            Mutation::Huge { at, width, value } => {
                let at = pos(at);
                let end = (at + width).min(len);
                bytes[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
            }
            Mutation::Append { bytes: new } => bytes.extend_from_slice(new),
            Mutation::Repeat { at, len: n } => {
                let at = pos(at);
                let range = bytes[at..(at + n).min(len)].to_vec();
                let end = at + range.len();
                bytes.splice(end..end, range);
            }
            Mutation::Splice { at, donor, from } => {
                let donor = &donors[donor.index(donors.len())];
                let from = if donor.is_empty() {
                    0
                } else {
                    from.index(donor.len())
                };
                bytes.truncate(pos(at));
                bytes.extend_from_slice(&donor[from..]);
            }
            Mutation::Number { run, digits } => {
                let mut runs = Vec::new();
                let mut i = 0;
                while i < len {
                    if bytes[i].is_ascii_digit() {
                        let start = i;
                        while i < len && bytes[i].is_ascii_digit() {
                            i += 1;
                        }
                        runs.push(start..i);
                    } else {
                        i += 1;
                    }
                }
                if !runs.is_empty() {
                    let range = runs[run.index(runs.len())].clone();
                    bytes.splice(range, digits.bytes());
                }
            }
            Mutation::Json { path, value } => {
                let Ok(mut doc) = serde_json::from_slice::<serde_json::Value>(bytes) else {
                    return;
                };
                let mut paths = Vec::new();
                json_paths(&doc, &mut Vec::new(), &mut paths);
                let chosen = &paths[path.index(paths.len())];
                let mut slot = &mut doc;
                for key in chosen {
                    slot = match slot {
                        serde_json::Value::Object(map) => map.get_mut(key).expect("a key"),
                        serde_json::Value::Array(items) => {
                            &mut items[key.parse::<usize>().expect("an index")]
                        }
                        _ => unreachable!("paths lead through objects and arrays"),
                    };
                }
                *slot = extreme_json(*value);
                *bytes = serde_json::to_vec_pretty(&doc).expect("JSON serializes");
            }
        }
    }
}

/// Numbers in text that overflow a `u32`, an `i64`, a `u64`, or a size in bytes.
const HUGE_NUMBERS: &[&str] = &[
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "1099511627776",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    let huge = prop_oneof![
        Just(u64::MAX),
        Just(u64::from(u32::MAX)),
        Just(1u64 << 31),
        Just(1u64 << 40),
        Just(i64::MAX as u64),
    ];
    prop_oneof![
        4 => (any::<Index>(), 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        1 => any::<Index>().prop_map(|to| Mutation::Truncate { to }),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..12))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        1 => (any::<Index>(), 1..32usize).prop_map(|(at, len)| Mutation::Remove { at, len }),
        2 => (any::<Index>(), prop_oneof![Just(2usize), Just(4), Just(8)], huge)
            .prop_map(|(at, width, value)| Mutation::Huge { at, width, value }),
        1 => (any::<Index>(), 1..64usize).prop_map(|(at, len)| Mutation::Repeat { at, len }),
        1 => prop::collection::vec(any::<u8>(), 1..8).prop_map(|bytes| Mutation::Append { bytes }),
        1 => (any::<Index>(), any::<Index>(), any::<Index>())
            .prop_map(|(at, donor, from)| Mutation::Splice { at, donor, from }),
        2 => (any::<Index>(), any::<usize>()).prop_map(|(path, value)| Mutation::Json { path, value }),
        2 => (any::<Index>(), prop::sample::select(HUGE_NUMBERS))
            .prop_map(|(run, digits)| Mutation::Number { run, digits }),
    ]
}

/// A generated case: which seed, which of its files, the mutations applied to that file, and
/// whether the checksums are then made to hold again (to reach the parsing behind them).
type Recipe = (Index, Index, Vec<Mutation>, bool);

fn recipe() -> impl Strategy<Value = Recipe> {
    (
        any::<Index>(),
        any::<Index>(),
        prop::collection::vec(mutation(), 1..4),
        any::<bool>(),
    )
}

/// Makes a changed case's checksums hold again, given the name of the file that was changed.
type Reseal = fn(&mut Case, &str);

fn crc32(parts: &[&[u8]]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()
}

fn u32_at(bytes: &[u8], at: usize) -> usize {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Recomputes a version 2 trace file's CRC-32s (docs/trace-format.md) where its framing can
/// still be followed: the header, each section from byte 64 on, the footer.
fn reseal_trace_file(bytes: &mut [u8]) {
    let len = bytes.len();
    if len < 128 {
        return;
    }
    let crc = crc32(&[&bytes[..60]]);
    bytes[60..64].copy_from_slice(&crc.to_le_bytes());
    let footer = len - 64;
    let mut at = 64;
    while at + 16 <= footer {
        let Some(end) = (at + 16)
            .checked_add(u32_at(bytes, at + 4))
            .filter(|&end| end <= footer)
        else {
            break;
        };
        let crc = crc32(&[&bytes[at..at + 12], &bytes[at + 16..end]]);
        bytes[at + 12..at + 16].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
    let crc = crc32(&[&bytes[footer..footer + 52], &bytes[footer + 56..]]);
    bytes[footer + 52..footer + 56].copy_from_slice(&crc.to_le_bytes());
}

/// A trace dump's reseal: a changed tensor file `rank{R}/step{S}.safetensors` gets its size and
/// md5 in rank R's tensor-file section; then the rank's trace file gets its CRC-32s.
fn reseal_trace(case: &mut Case, changed: &str) {
    let (trace, tensors) = match changed.split_once('/') {
        Some((rank, file)) => (format!("{rank}.dctrace"), Some(file.to_owned())),
        None => (changed.to_owned(), None),
    };
    let step = tensors.as_deref().and_then(|file| {
        file.strip_prefix("step")?
            .strip_suffix(".safetensors")?
            .parse::<u64>()
            .ok()
    });
    let tensor_file = step.map(|step| (case.files[changed].clone(), step));
    let Some(bytes) = case.files.get_mut(&trace) else {
        return;
    };
    if let Some((contents, step)) = tensor_file {
        let len = bytes.len();
        let section = if len >= 128 {
            usize::try_from(u64_at(bytes, len - 64 + 40)).ok()
        } else {
            None
        };
        if let Some(at) = section.filter(|&at| at + 16 <= len - 64) {
            let count = u32_at(bytes, at + 8);
            for entry in (0..count).map(|i| at + 16 + 32 * i) {
                if entry + 32 <= len - 64 && u64_at(bytes, entry) == step {
                    bytes[entry + 8..entry + 16]
                        .copy_from_slice(&(contents.len() as u64).to_le_bytes());
                    bytes[entry + 16..entry + 32].copy_from_slice(&Md5::digest(&contents));
                }
            }
        }
    }
    reseal_trace_file(bytes);
}

/// The end of a checkpoint's JSON: its md5 follows (src/checkpoint/mod.rs).
const CHECKPOINT_CHECKSUM_FIELD: &str = ",\n  \"checksum\": \"";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A checkpoint's reseal: a changed tensor file gets its md5 in the JSON; then the JSON's own
/// md5 at its end.
fn reseal_checkpoint(case: &mut Case, changed: &str) {
    let Some(json) = case
        .files
        .keys()
        .find(|name| name.ends_with(".json"))
        .cloned()
    else {
        return;
    };
    if changed.ends_with(".safetensors") {
        let md5 = hex(&Md5::digest(&case.files[changed]));
        let text = case.files.get_mut(&json).expect("the JSON");
        let field = b"\"tensors_md5\": \"";
        if let Some(at) = text.windows(field.len()).position(|w| w == field) {
            let at = at + field.len();
            if at + 32 <= text.len() {
                text[at..at + 32].copy_from_slice(md5.as_bytes());
            }
        }
    }
    let text = case.files.get_mut(&json).expect("the JSON");
    let field = CHECKPOINT_CHECKSUM_FIELD.as_bytes();
    if let Some(at) = text.windows(field.len()).rposition(|w| w == field) {
        let md5 = hex(&Md5::digest(&text[..at]));
        let at = at + field.len();
        if at + 32 <= text.len() {
            text[at..at + 32].copy_from_slice(md5.as_bytes());
        }
    }
}

/// What one reader returned for a case: `Ok` or the error's text.
type Reading = Result<(), String>;

/// Reads a case's folder, given the index of the seed case it was made from.
type Reader = dyn Fn(&Path, usize) -> Reading + Send + Sync;

/// One reader to fuzz.
struct Target {
    name: &'static str,
    /// Valid cases the mutations start from.
    seeds: Vec<Case>,
    /// Whether a case whose file `name` was changed from the first bytes to the second must
    /// read as an error.
    must_fail: fn(name: &str, original: &[u8], changed: &[u8]) -> bool,
    /// How to make the checksums hold again after a change (half of the cases).
    reseal: Option<Reseal>,
    /// Reads the case written in the folder, made from the seed case of that index.
    read: Arc<Reader>,
    /// How long one case may take before it counts as a hang.
    deadline: Duration,
    /// How many cases read as valid, and as errors (printed: a target whose cases are all
    /// errors tests little beyond the first check of its reader).
    num_valid: AtomicU64,
    num_errors: AtomicU64,
}

impl Target {
    fn new(
        name: &'static str,
        seeds: Vec<Case>,
        must_fail: fn(&str, &[u8], &[u8]) -> bool,
        read: impl Fn(&Path, usize) -> Reading + Send + Sync + 'static,
    ) -> Self {
        Target {
            name,
            seeds,
            must_fail,
            reseal: None,
            read: Arc::new(read),
            deadline: CASE_DEADLINE,
            num_valid: AtomicU64::new(0),
            num_errors: AtomicU64::new(0),
        }
    }

    /// The case a recipe makes, and whether it must read as an error (a changed file under
    /// checksums that were not made to hold again).
    fn build(&self, (seed, file, mutations, resealed): &Recipe) -> (Case, bool) {
        let mut case = self.seeds[seed.index(self.seeds.len())].clone();
        let names: Vec<String> = case.files.keys().cloned().collect();
        let name = &names[file.index(names.len())];
        let donors: Vec<Vec<u8>> = self
            .seeds
            .iter()
            .flat_map(|seed| seed.files.values().cloned())
            .collect();
        let original = case.files[name].clone();
        let bytes = case.files.get_mut(name).expect("the chosen file");
        for mutation in mutations {
            mutation.apply(bytes, &donors);
        }
        let must_fail = (self.must_fail)(name, &original, bytes);
        match self.reseal {
            Some(reseal) if *resealed => {
                reseal(&mut case, name);
                (case, false)
            }
            _ => (case, must_fail),
        }
    }

    fn work_dir(&self) -> PathBuf {
        work_root().join(self.name)
    }

    /// Writes the case and reads it, on a thread of its own, within [`CASE_DEADLINE`].
    fn check(&self, case: &Case, must_fail: bool) -> Result<(), String> {
        // Replayable as it is, should the reader abort the process.
        write_case(&self.work_dir(), case, must_fail);
        let dir = self.work_dir().join("case");
        let read = Arc::clone(&self.read);
        let (send, receive) = std::sync::mpsc::channel();
        let thread_dir = dir.clone();
        let origin = case.origin;
        std::thread::Builder::new()
            .name(format!("fuzz-{}", self.name))
            .spawn(move || {
                let outcome =
                    std::panic::catch_unwind(AssertUnwindSafe(|| read(&thread_dir, origin)));
                let _ = send.send(outcome);
            })
            .expect("spawn a case's thread");
        let reading = match receive.recv_timeout(self.deadline) {
            Err(_) => return Err(format!("the reader did not finish in {:?}", self.deadline)),
            Ok(Err(panic)) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                return Err(format!("the reader panicked: {message}"));
            }
            Ok(Ok(reading)) => reading,
        };
        let count = if reading.is_ok() {
            &self.num_valid
        } else {
            &self.num_errors
        };
        count.fetch_add(1, Ordering::Relaxed);
        match reading {
            Ok(()) if must_fail => {
                Err("a damaged file (changed under checksums, cut or followed by garbage) was read as valid".to_owned())
            }
            Ok(()) => Ok(()),
            Err(message) if !message.contains(dir.to_str().expect("a UTF-8 path")) => Err(format!(
                "the error does not name the case's folder or files: {message}"
            )),
            Err(_) => Ok(()),
        }
    }

    /// Rounds of cases from `seed` on until the budget is spent (one round without a budget).
    fn run(&self) {
        if let Ok(folder) = std::env::var("DETCHECK_FUZZ_REPLAY") {
            return self.replay(Path::new(&folder));
        }
        let cases = env_number("DETCHECK_FUZZ_CASES").map_or(DEFAULT_CASES, |n| n as u32);
        let budget = Duration::from_secs(env_number("DETCHECK_FUZZ_SECONDS").unwrap_or(0));
        let first_seed = env_number("DETCHECK_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
        let start = Instant::now();
        let mut seed = first_seed;
        loop {
            self.round(seed, cases);
            seed += 1;
            if start.elapsed() >= budget {
                break;
            }
        }
        std::fs::remove_dir_all(self.work_dir()).ok();
        // The last target to finish removes the process's folder.
        std::fs::remove_dir(work_root()).ok();
        println!(
            "fuzz {}: {} rounds of {cases} cases, seeds {first_seed}..{seed}: {} read as valid, \
             {} as errors",
            self.name,
            seed - first_seed,
            self.num_valid.load(Ordering::Relaxed),
            self.num_errors.load(Ordering::Relaxed),
        );
    }

    fn round(&self, seed: u64, cases: u32) {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..8 + self.name.len().min(24)]
            .copy_from_slice(&self.name.as_bytes()[..self.name.len().min(24)]);
        let config = Config {
            cases,
            failure_persistence: None,
            max_shrink_time: 60_000,
            ..Config::default()
        };
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
        let result = runner.run(&recipe(), |recipe| {
            let (case, must_fail) = self.build(&recipe);
            self.check(&case, must_fail).map_err(TestCaseError::fail)
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(reason, recipe)) => {
                let (case, must_fail) = self.build(&recipe);
                let saved = self.save(seed, &case, must_fail);
                panic!(
                    "fuzz {}: seed {seed}: {reason}\n  input: {case:?} ({}), saved in {}\n  \
                     replay: DETCHECK_FUZZ_REPLAY={} cargo test --test fuzz {}\n  mutations: {:?}",
                    self.name,
                    if must_fail {
                        "must read as an error"
                    } else {
                        "must not crash"
                    },
                    saved.display(),
                    saved.display(),
                    self.name,
                    recipe.2
                );
            }
            Err(TestError::Abort(why)) => panic!("fuzz {}: seed {seed}: aborted: {why}", self.name),
        }
    }

    /// Saves a failing case in `target/fuzz-failures/<target>-<seed>/`.
    fn save(&self, seed: u64, case: &Case, must_fail: bool) -> PathBuf {
        let dir = target_dir()
            .join("fuzz-failures")
            .join(format!("{}-{seed}", self.name));
        std::fs::remove_dir_all(&dir).ok();
        write_case(&dir, case, must_fail);
        dir
    }

    /// Checks a saved case again when it is this target's: a failure ([`Target::save`],
    /// `<target>-<seed>`), or the case in flight when a run aborted (`<target>`).
    fn replay(&self, folder: &Path) {
        let is_mine = folder
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name == self.name || name.starts_with(&format!("{}-", self.name)));
        if !is_mine {
            return;
        }
        let expect =
            std::fs::read_to_string(folder.join("expect")).expect("a saved case has `expect`");
        let mut lines = expect.lines();
        let must_fail = lines.next() == Some("error");
        let origin = lines.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let case = Case::read(&folder.join("case"), origin);
        if let Err(reason) = self.check(&case, must_fail) {
            panic!(
                "fuzz {}: replay of {}: {reason}",
                self.name,
                folder.display()
            );
        }
    }
}

/// Writes `case` into `dir/case/`, and into `dir/expect` whether it must read as an error and
/// the seed case it came from: a folder `DETCHECK_FUZZ_REPLAY` takes.
fn write_case(dir: &Path, case: &Case, must_fail: bool) {
    case.write(&dir.join("case"));
    let expect = if must_fail { "error" } else { "any" };
    std::fs::write(dir.join("expect"), format!("{expect}\n{}\n", case.origin))
        .expect("write the expectation");
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.parse()
            .unwrap_or_else(|_| panic!("{name}={text} is not a number")),
    )
}

/// This process's folder for cases in flight and seed dumps: `target/fuzz-work/<process id>/`
/// (two runs at once must not share a case).
fn work_root() -> PathBuf {
    target_dir()
        .join("fuzz-work")
        .join(std::process::id().to_string())
}

/// Cargo's target folder (`target/`), where failures and cases in flight are kept.
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/tmp has a parent")
        .to_path_buf()
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `.json` files of `dir`, sorted.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("a folder of scenarios")
        .map(|entry| entry.expect("a folder entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    files
}

/// Files under checksums: any change must be an error.
fn any_change(_: &str, original: &[u8], changed: &[u8]) -> bool {
    original != changed
}

/// Files without checksums: only crashes are failures.
fn no_change(_: &str, _: &[u8], _: &[u8]) -> bool {
    false
}

/// An msprobe `dump.json` cut before its last value ends, or followed by more than whitespace,
/// must be an error (truncated copies and trailing garbage were misread before).
fn dump_json_cut_or_extended(name: &str, original: &[u8], changed: &[u8]) -> bool {
    if !name.ends_with("dump.json") {
        return false;
    }
    let content_end = original
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    let cut = changed.len() < content_end && original.starts_with(changed);
    let extended = changed.len() > original.len()
        && changed.starts_with(original)
        && !changed[original.len()..]
            .iter()
            .all(u8::is_ascii_whitespace);
    cut || extended
}

fn error_text(error: impl std::error::Error) -> Reading {
    Err(error.to_string())
}

/// Scenario files: parsed, validated and built into the kind's program (no rank runs).
fn scenarios() -> Target {
    let mut seeds = Vec::new();
    for dir in [
        "scenarios",
        "examples/programs",
        "tests/fuzz-corpus/scenario",
    ] {
        for path in json_files(&repo().join(dir)) {
            let bytes = std::fs::read(&path).expect("a scenario file");
            seeds.push(Case {
                files: BTreeMap::from([("scenario.json".to_owned(), bytes)]),
                origin: seeds.len(),
            });
        }
    }
    let registry = Arc::new(KindRegistry::builtin());
    Target::new("scenario", seeds, no_change, move |dir, _| {
        registry
            .load_file(&dir.join("scenario.json"))
            .map(drop)
            .or_else(error_text)
    })
}

/// Writes a small dump: 2 ranks, 3 steps, records of several dtypes and shapes.
fn write_dump(dir: &Path, mode: DumpMode, scale: f32) {
    for rank in 0..2u32 {
        let mut writer = TraceWriter::create(dir, rank, 2, mode).expect("create a trace");
        writer
            .set_environment("fuzz.scale", &scale.to_string())
            .expect("set a variable");
        for step in 0..3u64 {
            let base = scale * (step as f32 + 1.0) + rank as f32;
            let grad = Tensor::from_vec(vec![base, -base, base * 0.5, f32::MIN_POSITIVE]);
            writer.record(step, "layer.0.grad", &grad).expect("record");
            let weights = Tensor::from_vec(vec![f64::from(base); 6]);
            writer
                .record(step, "layer.0.weight", &weights)
                .expect("record");
            let ids = Tensor::from_vec(vec![step as i64, i64::from(rank), -7]);
            writer.record(step, "batch.ids", &ids).expect("record");
            let loss = Tensor::scalar(base / 3.0);
            writer
                .record_replicated(step, "loss", &loss)
                .expect("record");
        }
        writer.finish().expect("finish a trace");
    }
}

/// Trace files (format 2) of every mode, and full mode's tensor files, read to the end: compared
/// with a dump whose every record differs, so that every tensor file is read too.
fn traces(name: &'static str) -> Target {
    let seeds_dir = work_root().join(name).join("seeds");
    std::fs::remove_dir_all(&seeds_dir).ok();
    let mut seeds = Vec::new();
    let mut others = Vec::new();
    for mode in [DumpMode::Stats, DumpMode::Md5, DumpMode::Full] {
        let (seed, other) = (
            seeds_dir.join(mode.name()),
            seeds_dir.join(format!("{}-other", mode.name())),
        );
        write_dump(&seed, mode, 1.0);
        write_dump(&other, mode, 2.0);
        seeds.push(Case::read(&seed, seeds.len()));
        others.push(other);
    }
    let options = CompareOptions {
        max_rows: usize::MAX,
        map: true,
    };
    let mut target = Target::new(name, seeds, any_change, move |dir, origin| {
        compare_dumps(dir, &others[origin], &options)
            .map(drop)
            .or_else(error_text)
    });
    target.reseal = Some(reseal_trace);
    target
}

/// msprobe dumps (tests/fixtures/msprobe/): dump.json, construct.json, `.pt` and `.npy` files,
/// compared with the unchanged dump (every differing record's tensors are read).
fn msprobe() -> Target {
    let fixtures = repo().join("tests/fixtures/msprobe");
    let dumps = [
        "md5_L1",
        "dist_md5_L1",
        "nan_L1",
        "stats_L0",
        "tensor_L1",
        "npy/a",
        "npy/b",
    ];
    let seeds: Vec<Case> = (dumps.iter().enumerate())
        .map(|(i, dump)| Case::read(&fixtures.join(dump), i))
        .collect();
    let options = CompareOptions {
        max_rows: usize::MAX,
        map: true,
    };
    Target::new(
        "msprobe",
        seeds,
        dump_json_cut_or_extended,
        move |dir, origin| {
            // The unchanged fixture is the other side.
            compare_dumps(dir, &fixtures.join(dumps[origin]), &options)
                .map(drop)
                .or_else(error_text)
        },
    )
}

fn checkpoint_identity(rank: usize) -> CheckpointIdentity {
    CheckpointIdentity {
        fingerprint: "0123456789abcdef0123456789abcdef".to_owned(),
        seed: 16,
        world_size: 2,
        rank,
    }
}

/// Checkpoints (versioned JSON + safetensors), loaded and checked as a resumed rank loads them.
fn checkpoints(name: &'static str) -> Target {
    let seeds_dir = work_root().join(name).join("seeds");
    std::fs::remove_dir_all(&seeds_dir).ok();
    let mut seeds = Vec::new();
    for rank in 0..2usize {
        let dir = seeds_dir.join(rank.to_string());
        let mut checkpoint = RankCheckpoint::new(3 + rank as u64);
        let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - rank as f32).collect();
        let weight =
            Tensor::new(vec![4, 6], Tensor::from_vec(values).into_data()).expect("a 4x6 tensor");
        checkpoint
            .tensors
            .insert("layer.0.weight".to_owned(), weight);
        let moments = Tensor::from_vec(vec![1e-300f64, -0.0, f64::MAX]);
        checkpoint.tensors.insert("adam.m".to_owned(), moments);
        let flags = Tensor::from_vec(vec![1u8, 0, 255]);
        checkpoint.tensors.insert("mask".to_owned(), flags);
        checkpoint.generators.insert(
            "dropout".to_owned(),
            derive_stream(16, Stream::Dropout, rank as u64, 3),
        );
        checkpoint.counters.insert("loader.epoch".to_owned(), 1);
        checkpoint.counters.insert("optimizer.steps".to_owned(), 3);
        save_checkpoint(&dir, &checkpoint_identity(rank), &checkpoint).expect("save");
        seeds.push(Case::read(&dir, rank));
    }
    let mut target = Target::new(name, seeds, any_change, |dir, rank| {
        load_checkpoint(dir, &checkpoint_identity(rank), None)
            .map(drop)
            .or_else(error_text)
    });
    target.reseal = Some(reseal_checkpoint);
    target
}

#[test]
fn scenario_files_never_crash_and_errors_name_the_file() {
    scenarios().run();
}

#[test]
fn changed_trace_files_are_errors_and_nothing_crashes() {
    traces("trace").run();
}

#[test]
fn msprobe_dumps_never_crash_and_errors_name_the_file() {
    msprobe().run();
}

#[test]
fn changed_checkpoints_are_errors_and_nothing_crashes() {
    checkpoints("checkpoint").run();
}

// The fuzz harness itself: each kind of failure is caught, reported and saved for replay.

/// One seed case of a few bytes, for the harness's own tests.
fn tiny_seeds() -> Vec<Case> {
    vec![Case {
        files: BTreeMap::from([("file".to_owned(), b"{\"size\": 12}".to_vec())]),
        origin: 0,
    }]
}

/// Runs one round of `target` and returns its failure message (empty when it passed), leaving
/// neither its case nor its saved failure behind.
fn failure_of(target: &Target) -> String {
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| target.round(DEFAULT_SEED, 16)));
    std::fs::remove_dir_all(target.work_dir()).ok();
    std::fs::remove_dir(work_root()).ok();
    std::fs::remove_dir_all(saved_failure(target)).ok();
    match outcome {
        Ok(()) => String::new(),
        Err(panic) => panic.downcast_ref::<String>().cloned().unwrap_or_default(),
    }
}

/// Where a failure of the harness's tests (seed [`DEFAULT_SEED`]) is saved.
fn saved_failure(target: &Target) -> PathBuf {
    target_dir().join(format!("fuzz-failures/{}-{DEFAULT_SEED}", target.name))
}

#[test]
fn the_harness_reports_a_panic_saves_the_input_and_replays_it() {
    let target = Target::new("selftest-panic", tiny_seeds(), no_change, |dir, _| {
        let bytes = std::fs::read(dir.join("file")).expect("the case's file");
        assert_eq!(bytes.len(), 12, "a planted panic");
        Ok(())
    });
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| target.round(DEFAULT_SEED, 16)));
    let failure = outcome
        .expect_err("a planted panic fails the round")
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(failure.contains("the reader panicked"), "{failure}");
    assert!(failure.contains("a planted panic"), "{failure}");
    let saved = saved_failure(&target);
    assert!(failure.contains(&saved.display().to_string()), "{failure}");
    let replayed = std::panic::catch_unwind(AssertUnwindSafe(|| target.replay(&saved)));
    assert!(
        replayed.is_err(),
        "the saved case fails again when replayed"
    );
    failure_of(&target);
}

#[test]
fn the_harness_reports_a_hang() {
    let mut target = Target::new("selftest-hang", tiny_seeds(), no_change, |_, _| loop {
        std::thread::park();
    });
    target.deadline = Duration::from_millis(100);
    let failure = failure_of(&target);
    assert!(failure.contains("did not finish in 100ms"), "{failure}");
}

#[test]
fn the_harness_reports_a_changed_checksummed_file_read_as_valid() {
    let target = Target::new("selftest-misread", tiny_seeds(), any_change, |_, _| Ok(()));
    let failure = failure_of(&target);
    assert!(failure.contains("read as valid"), "{failure}");
    assert!(failure.contains("(must read as an error)"), "{failure}");
}

#[test]
fn the_harness_reports_an_error_that_names_no_file() {
    let target = Target::new("selftest-unnamed", tiny_seeds(), no_change, |_, _| {
        Err("something is wrong".to_owned())
    });
    let failure = failure_of(&target);
    assert!(
        failure.contains("does not name the case's folder"),
        "{failure}"
    );
}

#[test]
fn the_allocator_refuses_more_than_the_cap() {
    let mut buffer: Vec<u8> = Vec::new();
    assert!(buffer.try_reserve_exact(ALLOCATION_CAP + 1).is_err());
}

/// Replaces the first occurrence of `from` in a case's file by `to` (of the same length).
fn replace_in(case: &mut Case, name: &str, from: &[u8], to: &[u8]) {
    let bytes = case.files.get_mut(name).expect("the file");
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the bytes to replace");
    bytes[at..at + to.len()].copy_from_slice(to);
}

#[test]
fn resealed_trace_and_checkpoint_changes_read_as_valid_unresealed_ones_do_not() {
    // A changed environment value (trace file) and tensor byte (full mode's tensor file): the
    // resealed cases read as other values, so half of the fuzz cases reach the parsers.
    let trace = traces("reseal-trace");
    let read_trace = |case: &Case| {
        write_case(&trace.work_dir(), case, false);
        (trace.read)(&trace.work_dir().join("case"), case.origin)
    };
    let full = trace.seeds[2].clone();
    for (name, edit) in [
        ("rank0.dctrace", (&b"fuzz.scale1"[..], &b"fuzz.scale3"[..])),
        ("rank1/step1.safetensors", (&[][..], &[][..])),
    ] {
        let mut case = full.clone();
        if edit.0.is_empty() {
            *case
                .files
                .get_mut(name)
                .expect("the file")
                .last_mut()
                .expect("a byte") ^= 1;
        } else {
            replace_in(&mut case, name, edit.0, edit.1);
        }
        assert!(read_trace(&case).is_err(), "{name} changed is an error");
        reseal_trace(&mut case, name);
        assert_eq!(read_trace(&case), Ok(()), "{name} changed and resealed");
    }
    std::fs::remove_dir_all(trace.work_dir()).ok();

    let checkpoint = checkpoints("reseal-checkpoint");
    let dir = checkpoint.work_dir().join("case");
    let mut case = checkpoint.seeds[0].clone();
    let json = "rank0-step3.json";
    replace_in(
        &mut case,
        json,
        b"\"loader.epoch\": 1",
        b"\"loader.epoch\": 7",
    );
    case.write(&dir);
    assert!(load_checkpoint(&dir, &checkpoint_identity(0), None).is_err());
    reseal_checkpoint(&mut case, json);
    case.write(&dir);
    let loaded = load_checkpoint(&dir, &checkpoint_identity(0), None).expect("resealed");
    assert_eq!(loaded.counter("loader.epoch").expect("the counter"), 7);
    let tensors = "rank0-step3.safetensors";
    *case
        .files
        .get_mut(tensors)
        .expect("the file")
        .last_mut()
        .expect("a byte") ^= 1;
    case.write(&dir);
    assert!(load_checkpoint(&dir, &checkpoint_identity(0), None).is_err());
    reseal_checkpoint(&mut case, tensors);
    case.write(&dir);
    load_checkpoint(&dir, &checkpoint_identity(0), None).expect("resealed tensors");
    std::fs::remove_dir_all(checkpoint.work_dir()).ok();
    std::fs::remove_dir(work_root()).ok();
}
