//! CPU time of this process for the benchmarks (`benches/detcheck.rs`, `benches/dump.rs`): on a
//! shared machine it varies less than the wall clock, which also counts waiting for a core.

/// The CPU time every thread of this process has run, ended ones included, in seconds
/// (`/proc/self/stat`'s utime and stime, in clock ticks of 10 ms; 0 where there is none).
pub(crate) fn process_cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The fields after the command name (which may hold spaces) in parentheses; utime and stime
    // are fields 14 and 15 of the line, 11 and 12 counted from 0 after the name.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
