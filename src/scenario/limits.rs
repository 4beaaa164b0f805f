//! Limits of a scenario file as input validation: hard maxima per field, and what a run would
//! hold in memory ([`MemoryEstimate`]) against what the machine has, checked when a scenario is
//! loaded, before any rank starts.
//!
//! Each kind says what one of its ranks holds and records ([`Footprint`], from
//! [`Scenario::footprint`](crate::scenario::Scenario::footprint)); [`estimate`] multiplies that
//! by the world sizes, steps and loader workers the scenario's checks run, in saturating
//! arithmetic, so no size from a file overflows. [`check_memory`] refuses a scenario whose
//! estimate exceeds the available memory ([`available_memory`]: `MemAvailable` of
//! `/proc/meminfo`, lowered to a cgroup v2 limit when one is set), naming the field that
//! dominates, the estimate and the available bytes.
//!
//! Determinism: nothing here reaches a run; only whether a scenario is accepted depends on the
//! machine.
//!
//! The built-in kinds' estimates were checked against the peak RSS of `detcheck check` (debug
//! build, 2 steps): collective of 5M elements on 3 ranks, 480 MB estimated, 217 MB measured;
//! seed 5M, 3 ranks: 420 / 221 MB; dataloader of 3×256×256 images, batches of 32, 3 ranks:
//! 1.4 GB (4 workers under `workers`) / 359 MB; train 512→2048, 3 ranks: 535 / 301 MB;
//! collective 1M on 16 ranks: 512 / 222 MB.
//!
//! Limits: the estimate is an upper bound of the large parts (tensors, loader queues, the
//! traces a check keeps), not of the allocator's overhead or the threads' stacks; where
//! `/proc/meminfo` cannot be read (not Linux), [`FALLBACK_AVAILABLE`] is assumed. It counts
//! every rank in one process, as thread ranks are (under MPI the leader checks it, since it also
//! runs `backends` on thread ranks; followers build what it accepted without checking again).

use crate::scenario::{CheckKind, ParamError, Program, RunPlan, ScenarioSpec};

/// The longest run a scenario file may ask for: a check keeps every step's records in memory
/// (about [`RECORD_BYTES`] per record), so the steps bound a trace.
pub const MAX_STEPS: u64 = 1_000_000;

/// The largest world a scenario file may ask for (`world_size`, each of `world_sizes`): thread
/// ranks are threads of one process.
pub const MAX_WORLD_SIZE: usize = 1024;

/// The most data-loader worker threads per rank a scenario may ask for (`workers`,
/// `params.workers`, `run --workers`).
pub const MAX_WORKERS: usize = 64;

/// The largest batch size the `batch_sizes` check runs a program at (each of `batch_sizes`):
/// 2^20 samples, far beyond a real batch, so a typo (an extra digit) is caught when the file
/// loads.
pub const MAX_BATCH_SIZE: usize = 1 << 20;

/// The longest scenario name, in bytes: report pages are files named after it
/// (`NAME.repeat.html`), and a file name has at most 255 bytes.
pub const MAX_NAME_BYTES: usize = 200;

/// The largest value of any size or count among a kind's parameters (elements, dimensions,
/// dataset sizes): 2^40, so that the product of a few of them stays far from overflowing
/// 64 bits before the memory estimate refuses it.
pub const MAX_SIZE: u64 = 1 << 40;

/// Bytes one record takes in an in-memory trace: the record itself (rank, step, name, dtype,
/// shape, md5, statistics: about 200 bytes) with its name and shape on the heap, rounded up
/// (measured: `seed_4ranks` with 16 elements, 2,000 and 8,000 steps, peak RSS grows 8.6 kB a
/// step for 16 records in 2 traces: 270 bytes a record).
pub const RECORD_BYTES: u64 = 320;

/// How many traces a check holds at once: run 1, run 2, and the two runs a series check
/// (`world_sizes`, `workers`, `restart`, ...) compares.
pub const TRACES_HELD: u64 = 4;

/// Records per rank per step assumed for a kind whose [`Footprint`] does not say.
pub const DEFAULT_RECORDS_PER_STEP: u64 = 16;

/// The memory assumed available where neither `/proc/meminfo` nor a cgroup limit can be read.
pub const FALLBACK_AVAILABLE: u64 = 8 << 30;

/// What one rank of a kind holds while it runs, and how many records it writes per step.
///
/// Built with `Footprint::default()` and the `with_*` methods; each part of the bytes is named by
/// the parameter that drives it, so that a refusal names the field to lower.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Footprint {
    /// Bytes one rank holds at once, by the field (`params.elements`) that drives them.
    pub rank_bytes: Vec<(String, u64)>,
    /// Records one rank writes per step; `None`: unknown, [`DEFAULT_RECORDS_PER_STEP`] assumed.
    pub records_per_step: Option<u64>,
}

impl Footprint {
    /// Adds `bytes` held by one rank, driven by `field`.
    #[must_use]
    pub fn with_bytes(mut self, field: impl Into<String>, bytes: u64) -> Self {
        self.rank_bytes.push((field.into(), bytes));
        self
    }

    /// Sets the records one rank writes per step.
    #[must_use]
    pub fn with_records_per_step(mut self, records: u64) -> Self {
        self.records_per_step = Some(records);
        self
    }
}

/// The bytes `a × b × ...` in saturating arithmetic: a size from a file never overflows.
#[must_use]
pub fn bytes_of(factors: &[u64]) -> u64 {
    factors.iter().fold(1u64, |acc, &f| acc.saturating_mul(f))
}

/// `value` as a `u64` (a `usize` from a file), saturating.
#[must_use]
pub fn size(value: usize) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// What a whole run of a scenario holds at most: the parts of its largest configuration, each
/// named by its field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// (field, bytes), summed over every rank of the world they belong to.
    pub parts: Vec<(String, u64)>,
    /// The world size of this configuration.
    pub world_size: usize,
}

impl MemoryEstimate {
    /// All the parts together (saturating).
    #[must_use]
    pub fn total(&self) -> u64 {
        self.parts
            .iter()
            .fold(0u64, |acc, (_, b)| acc.saturating_add(*b))
    }

    /// The part with the most bytes (the first of equals), with its bytes summed over every part
    /// of the same field.
    #[must_use]
    pub fn dominant(&self) -> Option<(&str, u64)> {
        let mut best: Option<(&str, u64)> = None;
        for (field, _) in &self.parts {
            let bytes = self
                .parts
                .iter()
                .filter(|(f, _)| f == field)
                .fold(0u64, |acc, (_, b)| acc.saturating_add(*b));
            if best.is_none_or(|(_, most)| bytes > most) {
                best = Some((field.as_str(), bytes));
            }
        }
        best
    }
}

/// The estimate of one configuration: `world` ranks, each holding `footprint`, for `steps`.
fn estimate_one(world: usize, steps: u64, footprint: &Footprint) -> MemoryEstimate {
    let ranks = size(world);
    let mut parts: Vec<(String, u64)> = footprint
        .rank_bytes
        .iter()
        .map(|(field, bytes)| (field.clone(), bytes.saturating_mul(ranks)))
        .collect();
    let records = footprint
        .records_per_step
        .unwrap_or(DEFAULT_RECORDS_PER_STEP);
    parts.push((
        "steps".to_owned(),
        bytes_of(&[TRACES_HELD, steps, ranks, records, RECORD_BYTES]),
    ));
    MemoryEstimate {
        parts,
        world_size: world,
    }
}

/// The largest estimate over the configurations `checks` run: the spec's world size (and each
/// of `world_sizes` under that check), its loader (and each of `workers` under that check).
#[must_use]
pub fn estimate(spec: &ScenarioSpec, checks: &[CheckKind], program: &Program) -> MemoryEstimate {
    let mut worlds = vec![spec.world_size];
    if checks.contains(&CheckKind::WorldSizes) {
        worlds.extend(&spec.world_sizes);
    }
    let mut plans = vec![RunPlan::default()];
    if checks.contains(&CheckKind::Workers) {
        plans.extend(spec.workers.iter().map(|&w| RunPlan {
            loader_workers: Some(w),
            ..RunPlan::default()
        }));
    }
    let mut largest = MemoryEstimate::default();
    for &world in &worlds {
        for plan in &plans {
            let one = estimate_one(world, spec.steps, &program.footprint(world, plan));
            if one.total() > largest.total() || largest.parts.is_empty() {
                largest = one;
            }
        }
    }
    largest
}

/// Memory this process may still use, in bytes, and where the number comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Available {
    /// The bytes.
    pub bytes: u64,
    /// Where they come from: `MemAvailable`, `cgroup memory.max`, or the fallback.
    pub source: &'static str,
}

/// The memory available now: the lowest of what each limit on this process leaves.
/// - `MemAvailable` of `/proc/meminfo`;
/// - the cgroup v2 limit: `/sys/fs/cgroup/memory.max` minus `memory.current`;
/// - the address-space limit (`ulimit -v`, "Max address space" of `/proc/self/limits`) minus the
///   process's `VmSize`: past it an allocation fails;
/// - under strict overcommit (`vm.overcommit_memory` 2), `CommitLimit` minus `Committed_AS`.
///
/// Where none can be read, [`FALLBACK_AVAILABLE`]. The last two are the limits under which an
/// allocation fails instead of the kernel's reclaiming memory: a run the estimate admits past
/// them would abort in its allocator ("memory allocation of N bytes failed"), not end with
/// a message.
#[must_use]
pub fn available_memory() -> Available {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let read_u64 = |path: &str| read(path).and_then(|t| t.trim().parse::<u64>().ok());
    let meminfo = read("/proc/meminfo");
    let field = |name: &str| meminfo.as_deref().and_then(|t| kib_field(t, name));
    let cgroup = read_u64("/sys/fs/cgroup/memory.max")
        .map(|max| max.saturating_sub(read_u64("/sys/fs/cgroup/memory.current").unwrap_or(0)));
    let address_space = read("/proc/self/limits")
        .and_then(|t| address_space_limit(&t))
        .map(|limit| {
            let used = read("/proc/self/status").and_then(|t| kib_field(&t, "VmSize"));
            limit.saturating_sub(used.unwrap_or(0))
        });
    let commit = (read("/proc/sys/vm/overcommit_memory")
        .as_deref()
        .map(str::trim)
        == Some("2"))
    .then(|| Some(field("CommitLimit")?.saturating_sub(field("Committed_AS")?)))
    .flatten();
    [
        (field("MemAvailable"), "MemAvailable"),
        (cgroup, "cgroup memory.max"),
        (address_space, "the address-space limit, ulimit -v"),
        (commit, "CommitLimit under vm.overcommit_memory=2"),
    ]
    .into_iter()
    .filter_map(|(bytes, source)| {
        Some(Available {
            bytes: bytes?,
            source,
        })
    })
    .min_by_key(|a| a.bytes)
    .unwrap_or(Available {
        bytes: FALLBACK_AVAILABLE,
        source: "assumed: /proc/meminfo unreadable",
    })
}

/// The soft "Max address space" of a `/proc/self/limits` text, in bytes; `None` when unlimited.
fn address_space_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    line.trim_start_matches("Max address space")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The `NAME:  N kB` field of a `/proc/meminfo` or `/proc/self/status` text, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(name))?;
    let kib: u64 = line[name.len() + 1..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

/// Bytes for people: `512 B`, `3.2 MB`, `1.5 TB` (powers of 1000).
#[must_use]
pub fn show_bytes(bytes: u64) -> String {
    if bytes == u64::MAX {
        return "more than 18 EB (overflows 64 bits)".to_owned();
    }
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Refuses a run whose estimate exceeds `available`, naming the field that dominates.
///
/// # Errors
/// A [`ParamError`] on that field, with the estimate, its largest parts and the available bytes.
pub fn check_memory(estimate: &MemoryEstimate, available: Available) -> Result<(), ParamError> {
    let total = estimate.total();
    if total <= available.bytes {
        return Ok(());
    }
    let (field, _) = estimate.dominant().unwrap_or(("steps", total));
    let mut parts: Vec<&(String, u64)> = estimate.parts.iter().filter(|(_, b)| *b > 0).collect();
    parts.sort_by_key(|(_, bytes)| std::cmp::Reverse(*bytes));
    let parts: Vec<String> = parts
        .iter()
        .take(3)
        .map(|(f, b)| format!("{f} {}", show_bytes(*b)))
        .collect();
    Err(ParamError::new(
        field,
        format!(
            "the run would hold about {} ({} at world size {}), more than the {} available \
             ({}); lower `{field}`",
            show_bytes(total),
            parts.join(", "),
            estimate.world_size,
            show_bytes(available.bytes),
            available.source
        ),
    ))
}

/// Rejects a size or count `value` of `field` below `minimum` or above [`MAX_SIZE`].
///
/// # Errors
/// A [`ParamError`] on `field`.
pub fn size_in_range(field: &str, value: u64, minimum: u64) -> Result<(), ParamError> {
    if value < minimum {
        return Err(ParamError::new(
            field,
            format!("must be at least {minimum}, got {value}"),
        ));
    }
    if value > MAX_SIZE {
        return Err(ParamError::new(
            field,
            format!("must be at most {MAX_SIZE} (2^40), got {value}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_from_a_file_saturate_instead_of_overflowing() {
        assert_eq!(bytes_of(&[1 << 63, 4]), u64::MAX);
        assert_eq!(bytes_of(&[3, 5, 7]), 105);
        let footprint = Footprint::default()
            .with_bytes("params.elements", u64::MAX)
            .with_records_per_step(u64::MAX);
        let estimate = estimate_one(1024, u64::MAX, &footprint);
        assert_eq!(estimate.total(), u64::MAX);
    }

    #[test]
    fn a_refusal_names_the_dominant_field_the_estimate_and_the_available_bytes() {
        let footprint = Footprint::default()
            .with_bytes("params.elements", 1_000_000_000)
            .with_bytes("params.workers", 10)
            .with_records_per_step(4);
        let estimate = estimate_one(8, 100, &footprint);
        assert_eq!(
            estimate.dominant(),
            Some(("params.elements", 8_000_000_000))
        );
        let available = Available {
            bytes: 4_000_000_000,
            source: "MemAvailable",
        };
        let err = check_memory(&estimate, available).unwrap_err();
        assert_eq!(err.field, "params.elements");
        assert_eq!(
            err.message,
            "the run would hold about 8.0 GB (params.elements 8.0 GB, steps 4.1 MB, \
             params.workers 80 B at world size 8), more than the 4.0 GB available \
             (MemAvailable); lower `params.elements`"
        );
        let roomy = Available {
            bytes: 9_000_000_000,
            source: "MemAvailable",
        };
        assert!(check_memory(&estimate, roomy).is_ok());
    }

    #[test]
    fn steps_dominate_a_long_run_of_small_tensors() {
        let footprint = Footprint::default()
            .with_bytes("params.elements", 1000)
            .with_records_per_step(7);
        let estimate = estimate_one(4, MAX_STEPS, &footprint);
        assert_eq!(estimate.dominant().map(|(f, _)| f), Some("steps"));
        assert_eq!(
            estimate.total(),
            4000 + TRACES_HELD * MAX_STEPS * 4 * 7 * RECORD_BYTES
        );
    }

    #[test]
    fn proc_fields_are_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   23000000 kB\n";
        assert_eq!(kib_field(text, "MemAvailable"), Some(23_000_000 * 1024));
        assert_eq!(kib_field(text, "Mem"), None);
        assert_eq!(kib_field("MemTotal: 5 kB\n", "MemAvailable"), None);
        assert_eq!(
            kib_field("VmSize:\t  2048 kB\n", "VmSize"),
            Some(2048 * 1024)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(address_space_limit(limits), None);
        let limited = limits.replace(
            "unlimited            unlimited",
            "3072000000           unlimited",
        );
        assert_eq!(address_space_limit(&limited), Some(3_072_000_000));
        assert!(available_memory().bytes > 0);
    }

    #[test]
    fn sizes_have_a_hard_maximum() {
        assert!(size_in_range("params.elements", MAX_SIZE, 1).is_ok());
        let err = size_in_range("params.elements", 1 << 63, 1).unwrap_err();
        assert_eq!(err.field, "params.elements");
        assert!(err.message.contains("must be at most 1099511627776"));
        assert!(size_in_range("params.elements", 0, 1).is_err());
        assert_eq!(show_bytes(u64::MAX), "more than 18 EB (overflows 64 bits)");
        assert_eq!(show_bytes(999), "999 B");
    }
}
