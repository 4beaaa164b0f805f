//! Slurm's side of the launch contract: what a task started by `srun` is told, in the words a
//! program reads.
//!
//! `srun` gives each task `SLURM_PROCID` (its rank), `SLURM_NTASKS` (the world size),
//! `SLURM_LOCALID` (its rank on its node), `SLURM_NODEID` and the step's nodes as a compressed
//! list (`SLURM_STEP_NODELIST`, else the job's `SLURM_JOB_NODELIST`: `gpu[01-04,07]`,
//! `a,b[1-2]`, `n[001-003]-ib`) with the tasks on each (`SLURM_STEP_TASKS_PER_NODE`: `2(x3),1`).
//! [`SlurmTask::from_vars`] reads them; [`SlurmTask::rank_variables`] are the variables
//! torch.distributed reads (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//! `MASTER_ADDR`: the step's first node), which, with `DETCHECK_RANK`
//! (`crate::launch::srun_rank_variables`), the Python start-up hook sets before the
//! program's own code runs (`MASTER_PORT` comes from the launch: detcheck draws it). [`expand_node_list`] and [`first_node`] parse Slurm's host-list
//! grammar: comma-separated names, each with any number of bracketed ranges (`[01-04,07]`,
//! zero-padded to the width written), a prefix and a suffix.
//!
//! Determinism: pure functions of the variables. Limits: [`MAX_NODES`] names from one list; a
//! range's numbers fit in a `u64`.

use thiserror::Error;

/// The most names [`expand_node_list`] makes from one list (a larger one is an error, never an
/// allocation without end).
pub const MAX_NODES: usize = 1 << 20;

/// A Slurm variable that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SlurmError {
    /// A node list that is not Slurm's host-list grammar.
    #[error("node list `{list}`: {what}")]
    NodeList {
        /// The list as written.
        list: String,
        /// What is wrong with it.
        what: String,
    },
    /// A variable that is set but is not what Slurm writes there.
    #[error("`{name}` is `{value}`, not {what}")]
    Variable {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        what: &'static str,
    },
}

/// One piece of a host pattern: text, or the numbers of a bracket.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// Inclusive ranges, each with the width its first number was written with.
    Ranges(Vec<(u64, u64, usize)>),
}

impl Piece {
    fn count(&self) -> u128 {
        match self {
            Piece::Text(_) => 1,
            Piece::Ranges(ranges) => ranges.iter().map(|(a, b, _)| u128::from(b - a) + 1).sum(),
        }
    }

    /// The `i`-th value of the piece (`i` below [`Piece::count`]).
    fn nth(&self, mut i: u128) -> String {
        match self {
            Piece::Text(text) => text.clone(),
            Piece::Ranges(ranges) => {
                for &(a, b, width) in ranges {
                    let n = u128::from(b - a) + 1;
                    if i < n {
                        return format!("{:0width$}", u128::from(a) + i);
                    }
                    i -= n;
                }
                String::new()
            }
        }
    }
}

/// The names of a node list, in Slurm's order (a range's names in increasing number, the
/// leftmost bracket varying slowest).
///
/// # Errors
/// [`SlurmError::NodeList`] for an unbalanced or empty bracket, a range that decreases or is
/// not a number, an empty name, or more than [`MAX_NODES`] names.
pub fn expand_node_list(list: &str) -> Result<Vec<String>, SlurmError> {
    let mut names = Vec::new();
    for pattern in patterns(list)? {
        let counts: Vec<u128> = pattern.iter().map(Piece::count).collect();
        let total: u128 = counts.iter().product();
        if total + names.len() as u128 > MAX_NODES as u128 {
            return Err(bad(list, format!("more than {MAX_NODES} names")));
        }
        for mut index in 0..total {
            let mut parts = vec![String::new(); pattern.len()];
            for (k, piece) in pattern.iter().enumerate().rev() {
                parts[k] = piece.nth(index % counts[k]);
                index /= counts[k];
            }
            names.push(parts.concat());
        }
    }
    Ok(names)
}

/// The first name of a node list (however many it holds), where a multi-node job's rank 0
/// runs and torch.distributed's `MASTER_ADDR` points.
///
/// # Errors
/// As [`expand_node_list`] (but a list of any length is fine).
pub fn first_node(list: &str) -> Result<String, SlurmError> {
    let patterns = patterns(list)?;
    let first = patterns
        .first()
        .ok_or_else(|| bad(list, "no name".to_owned()))?;
    Ok(first.iter().map(|p| p.nth(0)).collect())
}

/// The tasks on each node of a step, from `SLURM_STEP_TASKS_PER_NODE` (`2(x3),1`: 2, 2, 2, 1).
///
/// # Errors
/// [`SlurmError::Variable`] when an entry is not `N` or `N(xK)`.
pub fn tasks_per_node(value: &str) -> Result<Vec<u32>, SlurmError> {
    let wrong = || SlurmError::Variable {
        name: "SLURM_STEP_TASKS_PER_NODE",
        value: value.to_owned(),
        what: "a list of `N` or `N(xK)`",
    };
    let mut out = Vec::new();
    for entry in value.split(',') {
        let (tasks, times) = match entry.split_once('(') {
            None => (entry, "1"),
            Some((tasks, rest)) => (
                tasks,
                rest.strip_prefix('x')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(wrong)?,
            ),
        };
        let tasks: u32 = tasks.trim().parse().map_err(|_| wrong())?;
        let times: usize = times.trim().parse().map_err(|_| wrong())?;
        if out.len() + times > MAX_NODES {
            return Err(wrong());
        }
        out.extend(std::iter::repeat_n(tasks, times));
    }
    Ok(out)
}

fn bad(list: &str, what: String) -> SlurmError {
    SlurmError::NodeList {
        list: list.to_owned(),
        what,
    }
}

/// The host patterns of a list: split at the commas outside brackets, each parsed into pieces.
fn patterns(list: &str) -> Result<Vec<Vec<Piece>>, SlurmError> {
    let mut patterns = Vec::new();
    let mut pieces: Vec<Piece> = Vec::new();
    let mut text = String::new();
    let mut chars = list.trim().chars();
    let mut finish = |pieces: &mut Vec<Piece>, text: &mut String| -> Result<(), SlurmError> {
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(text)));
        }
        if pieces.is_empty() {
            return Err(bad(list, "an empty name".to_owned()));
        }
        patterns.push(std::mem::take(pieces));
        Ok(())
    };
    while let Some(c) = chars.next() {
        match c {
            ',' => finish(&mut pieces, &mut text)?,
            '[' => {
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                let mut inside = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == ']' {
                        closed = true;
                        break;
                    }
                    inside.push(c);
                }
                if !closed {
                    return Err(bad(list, "a `[` without its `]`".to_owned()));
                }
                pieces.push(Piece::Ranges(ranges(list, &inside)?));
            }
            ']' => return Err(bad(list, "a `]` without its `[`".to_owned())),
            c if c.is_whitespace() => return Err(bad(list, "a space in a name".to_owned())),
            c => text.push(c),
        }
    }
    finish(&mut pieces, &mut text)?;
    Ok(patterns)
}

/// The ranges of a bracket's inside: `01-04,07`.
fn ranges(list: &str, inside: &str) -> Result<Vec<(u64, u64, usize)>, SlurmError> {
    let number = |s: &str| -> Result<u64, SlurmError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(list, format!("`{s}` in a bracket is not a number")));
        }
        s.parse()
            .map_err(|_| bad(list, format!("`{s}` is too large")))
    };
    inside
        .split(',')
        .map(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let (first, last) = (number(a)?, number(b)?);
            if last < first {
                return Err(bad(list, format!("the range `{range}` decreases")));
            }
            Ok((first, last, a.len()))
        })
        .collect()
}

/// One task of an `srun` step, as its variables say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmTask {
    /// `SLURM_PROCID`.
    pub rank: u32,
    /// `SLURM_NTASKS` (`SLURM_STEP_NUM_TASKS`).
    pub world_size: u32,
    /// `SLURM_LOCALID` (the rank when unset).
    pub local_rank: u32,
    /// The tasks on this task's node (`SLURM_STEP_TASKS_PER_NODE` at `SLURM_NODEID`; the
    /// world size when unset).
    pub local_world_size: u32,
    /// The step's first node (`SLURM_STEP_NODELIST`, else `SLURM_JOB_NODELIST`), when set.
    pub first_node: Option<String>,
}

impl SlurmTask {
    /// The task this process is, from `var`; `None` when `SLURM_PROCID` is unset.
    ///
    /// # Errors
    /// [`SlurmError`] naming the variable that is set but cannot be read.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, SlurmError> {
        let number = |name: &'static str| -> Result<Option<u32>, SlurmError> {
            var(name)
                .map(|v| {
                    v.trim().parse::<u32>().map_err(|_| SlurmError::Variable {
                        name,
                        value: v.clone(),
                        what: "a number",
                    })
                })
                .transpose()
        };
        let Some(rank) = number("SLURM_PROCID")? else {
            return Ok(None);
        };
        let world_size = match number("SLURM_STEP_NUM_TASKS")? {
            Some(n) => n,
            None => number("SLURM_NTASKS")?.unwrap_or(rank + 1),
        };
        if rank >= world_size {
            return Err(SlurmError::Variable {
                name: "SLURM_PROCID",
                value: rank.to_string(),
                what: "a rank below SLURM_NTASKS",
            });
        }
        let local_rank = number("SLURM_LOCALID")?.unwrap_or(rank);
        let local_world_size = match (var("SLURM_STEP_TASKS_PER_NODE"), number("SLURM_NODEID")?) {
            (Some(per_node), Some(node)) => tasks_per_node(&per_node)?
                .get(node as usize)
                .copied()
                .unwrap_or(world_size),
            _ => world_size,
        };
        let first_node = var("SLURM_STEP_NODELIST")
            .or_else(|| var("SLURM_JOB_NODELIST"))
            .map(|list| first_node(&list))
            .transpose()?;
        Ok(Some(SlurmTask {
            rank,
            world_size,
            local_rank,
            local_world_size,
            first_node,
        }))
    }

    /// The task of this process ([`SlurmTask::from_vars`] of its environment).
    ///
    /// # Errors
    /// As [`SlurmTask::from_vars`].
    pub fn from_env() -> Result<Option<Self>, SlurmError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The variables torch.distributed reads for a rank, in a fixed order (`MASTER_PORT` is
    /// the launch's).
    #[must_use]
    pub fn rank_variables(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            ("RANK", self.rank.to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("LOCAL_RANK", self.local_rank.to_string()),
            ("LOCAL_WORLD_SIZE", self.local_world_size.to_string()),
        ];
        if let Some(node) = &self.first_node {
            vars.push(("MASTER_ADDR", node.clone()));
        }
        vars
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<String> {
        expand_node_list(list).unwrap()
    }

    #[test]
    fn compressed_node_lists_expand_in_slurms_order() {
        assert_eq!(names("vm"), ["vm"]);
        assert_eq!(
            names("gpu[01-04,07]"),
            ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]
        );
        assert_eq!(names("a,b[1-2]"), ["a", "b1", "b2"]);
        assert_eq!(names("n[001-003]-ib"), ["n001-ib", "n002-ib", "n003-ib"]);
        assert_eq!(names("n[8-11]"), ["n8", "n9", "n10", "n11"]);
        assert_eq!(
            names("rack[1-2]-n[1-2],login"),
            ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2", "login"]
        );
        assert_eq!(names("node-1.cluster"), ["node-1.cluster"]);
        assert_eq!(names("x[7]"), ["x7"]);
        // 64 nodes of 8 GPUs: the list as Slurm writes it.
        let big = names("dgx[001-064]");
        assert_eq!(big.len(), 64);
        assert_eq!((big[0].as_str(), big[63].as_str()), ("dgx001", "dgx064"));
    }

    #[test]
    fn the_first_node_needs_no_expansion() {
        assert_eq!(first_node("gpu[01-04,07]").unwrap(), "gpu01");
        assert_eq!(first_node("a,b[1-2]").unwrap(), "a");
        assert_eq!(first_node("n[001-003]-ib").unwrap(), "n001-ib");
        assert_eq!(first_node("c[5-9]-[2-3]").unwrap(), "c5-2");
        // Far more names than MAX_NODES: still the first at once.
        assert_eq!(first_node("n[0-99999999]").unwrap(), "n0");
        assert!(expand_node_list("n[0-99999999]")
            .unwrap_err()
            .to_string()
            .contains("more than"));
    }

    #[test]
    fn bad_node_lists_are_named() {
        for (list, what) in [
            ("gpu[01-04", "without its `]`"),
            ("gpu01]", "without its `[`"),
            ("gpu[4-1]", "decreases"),
            ("gpu[a-b]", "not a number"),
            ("gpu[]", "not a number"),
            ("a,,b", "empty name"),
            ("", "empty name"),
            ("a b", "space"),
            ("n[99999999999999999999999]", "too large"),
        ] {
            let err = expand_node_list(list).unwrap_err().to_string();
            assert!(err.starts_with(&format!("node list `{list}`")), "{err}");
            assert!(err.contains(what), "{list}: {err}");
        }
    }

    #[test]
    fn tasks_per_node_expand() {
        assert_eq!(tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(tasks_per_node("8(x64)").unwrap().len(), 64);
        assert!(tasks_per_node("2(3)").is_err());
        assert!(tasks_per_node("x").is_err());
    }

    fn task(vars: &[(&str, &str)]) -> Result<Option<SlurmTask>, SlurmError> {
        SlurmTask::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn a_task_maps_to_torchs_variables() {
        assert_eq!(task(&[]).unwrap(), None, "not an srun task");
        let t = task(&[
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "8(x2)"),
            ("SLURM_JOB_NODELIST", "gpu[01-04]"),
            ("SLURM_STEP_NODELIST", "gpu[03-04]"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            t.rank_variables(),
            [
                ("RANK", "9".to_owned()),
                ("WORLD_SIZE", "16".to_owned()),
                ("LOCAL_RANK", "1".to_owned()),
                ("LOCAL_WORLD_SIZE", "8".to_owned()),
                ("MASTER_ADDR", "gpu03".to_owned()),
            ]
        );
        let err = task(&[("SLURM_PROCID", "2"), ("SLURM_NTASKS", "2")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`SLURM_PROCID` is `2`, not a rank below SLURM_NTASKS"
        );
        let err = task(&[("SLURM_PROCID", "x")]).unwrap_err().to_string();
        assert!(err.contains("`SLURM_PROCID` is `x`"), "{err}");
    }
}
