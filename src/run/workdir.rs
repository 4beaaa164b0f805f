//! Every launch of a `command` scenario starts from the working directory as it was.
//!
//! A program writes files where it runs: snapshots, checkpoints, caches, logs. A script that
//! resumes from `snapshot.pt` when the file exists (PyTorch's DDP tutorial series) would resume
//! the second run of a check from the first run's snapshot, and fail `repeat` for a reason
//! that is not in the program. So [`Workdir::snapshot`] notes every entry of the working
//! directory before a launch (size, modification time, kind) and copies its small files, and
//! [`Workdir::restore`] puts the folder back after it: what the launch created is removed, what
//! it changed or removed is copied back. What could not be put back (a changed file too large to
//! have been copied) is named in every rank's environment snapshot (`detcheck.workdir`), where
//! a failed check shows it as a difference between the runs.
//!
//! The walk skips folders that are not the program's outputs and would make it slow: `.git`,
//! `target`, `node_modules`, `__pycache__` and virtual environments (a `pyvenv.cfg`), never
//! follows a symbolic link, and stops at [`MAX_ENTRIES`] entries (then the rest of the folder is
//! not watched, and the environment says so).
//!
//! Determinism: the walk is sorted; what is restored depends only on the folder's contents.
//! Limits: files a program writes outside its working directory (an absolute path, `/tmp`) are
//! not watched; a file changed in place that is larger than [`MAX_COPIED_FILE`] (or beyond
//! [`MAX_COPIED_TOTAL`]) cannot be put back, and is named.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The most entries the walk notes.
pub(crate) const MAX_ENTRIES: usize = 20_000;
/// The largest file copied before a launch (bytes).
pub(crate) const MAX_COPIED_FILE: u64 = 4 << 20;
/// The most bytes copied before a launch.
pub(crate) const MAX_COPIED_TOTAL: u64 = 64 << 20;
/// Folders the walk does not enter.
const SKIPPED: [&str; 4] = [".git", "target", "node_modules", "__pycache__"];

/// One entry of the folder before the launch.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    dir: bool,
    len: u64,
    modified: Option<SystemTime>,
    /// Where its copy is (a small file).
    copy: Option<PathBuf>,
}

/// The working directory as it was before a launch.
#[derive(Debug)]
pub(crate) struct Workdir {
    root: PathBuf,
    /// Folders detcheck hands the program (its trace folder, a checkpoint folder): never
    /// watched, never removed, nor their parents.
    excluded: Vec<PathBuf>,
    entries: BTreeMap<PathBuf, Entry>,
    /// The walk stopped at [`MAX_ENTRIES`].
    truncated: bool,
}

/// What [`Workdir::restore`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Restored {
    /// Entries the launch created, removed (relative paths).
    pub(crate) removed: Vec<PathBuf>,
    /// Files it changed or removed, copied back.
    pub(crate) copied_back: Vec<PathBuf>,
    /// Files it changed or removed that could not be put back, and why.
    pub(crate) lost: Vec<(PathBuf, String)>,
    /// The walk stopped at [`MAX_ENTRIES`].
    pub(crate) truncated: bool,
}

impl Restored {
    /// The environment entry of the launch (`detcheck.workdir`), or `None` when the folder is
    /// as it was and fully watched.
    pub(crate) fn environment_entry(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.lost.is_empty() {
            let lost: Vec<String> = self
                .lost
                .iter()
                .map(|(p, why)| format!("{} ({why})", p.display()))
                .collect();
            parts.push(format!(
                "changed and not put back: {}; a later run reads the changed file",
                lost.join(", ")
            ));
        }
        if self.truncated {
            parts.push(format!(
                "more than {MAX_ENTRIES} entries: only the first are watched (run detcheck from \
                 the program's own folder)"
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

fn is_venv(dir: &Path) -> bool {
    dir.join("pyvenv.cfg").is_file()
}

impl Workdir {
    /// Whether `rel` is one of the excluded folders, inside one, or a parent of one.
    fn is_excluded(&self, rel: &Path) -> bool {
        let path = self.root.join(rel);
        self.excluded
            .iter()
            .any(|e| path.starts_with(e) || e.starts_with(&path))
    }

    /// Notes `root`'s entries and copies its small files into `copies` (created); `excluded`
    /// (relative to `root`, or absolute) are left alone.
    pub(crate) fn snapshot(
        root: &Path,
        copies: &Path,
        excluded: &[&Path],
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(copies)?;
        let mut workdir = Workdir {
            excluded: excluded
                .iter()
                .chain(std::iter::once(&copies))
                .map(|p| root.join(p))
                .collect(),
            root: root.to_path_buf(),
            entries: BTreeMap::new(),
            truncated: false,
        };
        let mut copied_total = 0u64;
        let mut pending = vec![PathBuf::new()];
        while let Some(relative) = pending.pop() {
            let Ok(read) = std::fs::read_dir(root.join(&relative)) else {
                continue;
            };
            let mut names: Vec<_> = read.filter_map(Result::ok).map(|e| e.file_name()).collect();
            names.sort();
            for name in names {
                if workdir.entries.len() >= MAX_ENTRIES {
                    workdir.truncated = true;
                    return Ok(workdir);
                }
                let rel = relative.join(&name);
                let path = root.join(&rel);
                if workdir.is_excluded(&rel) && !(path.is_dir() && !path.is_symlink()) {
                    continue;
                }
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                let dir = meta.is_dir();
                if workdir.excluded.contains(&path) {
                    continue;
                }
                let skipped = dir && (SKIPPED.iter().any(|s| name == *s) || is_venv(&path));
                let mut entry = Entry {
                    dir,
                    len: meta.len(),
                    modified: meta.modified().ok(),
                    copy: None,
                };
                if meta.is_file()
                    && meta.len() <= MAX_COPIED_FILE
                    && copied_total + meta.len() <= MAX_COPIED_TOTAL
                {
                    let copy = copies.join(format!("{}", workdir.entries.len()));
                    if std::fs::copy(&path, &copy).is_ok() {
                        copied_total += meta.len();
                        entry.copy = Some(copy);
                    }
                }
                if dir && !skipped {
                    pending.push(rel.clone());
                }
                workdir.entries.insert(rel, entry);
            }
        }
        Ok(workdir)
    }

    /// Puts the folder back as [`snapshot`](Self::snapshot) found it (module doc).
    pub(crate) fn restore(&self) -> Restored {
        let mut restored = Restored {
            truncated: self.truncated,
            ..Restored::default()
        };
        // Created entries: the walk of today's folder, inside the watched part.
        let mut pending = vec![PathBuf::new()];
        while let Some(relative) = pending.pop() {
            if !relative.as_os_str().is_empty() {
                match self.entries.get(&relative) {
                    Some(e) if e.dir => {}
                    _ if self.is_excluded(&relative) => {}
                    _ => continue,
                }
                let name = relative.file_name().unwrap_or_default();
                let path = self.root.join(&relative);
                if SKIPPED.iter().any(|s| name == *s) || is_venv(&path) {
                    continue;
                }
            }
            let Ok(read) = std::fs::read_dir(self.root.join(&relative)) else {
                continue;
            };
            let mut names: Vec<_> = read.filter_map(Result::ok).map(|e| e.file_name()).collect();
            names.sort();
            for name in names {
                let rel = relative.join(&name);
                let path = self.root.join(&rel);
                if self.is_excluded(&rel) {
                    if path.is_dir() && !path.is_symlink() && !self.excluded.contains(&path) {
                        pending.push(rel); // a parent of an excluded folder: look inside
                    }
                    continue;
                }
                match self.entries.get(&rel) {
                    None if !self.truncated => {
                        let gone = match std::fs::symlink_metadata(&path) {
                            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
                            _ => std::fs::remove_file(&path),
                        };
                        if gone.is_ok() {
                            restored.removed.push(rel);
                        }
                    }
                    Some(e) if e.dir => pending.push(rel),
                    _ => {}
                }
            }
        }
        // Changed or removed files: copied back where a copy exists.
        for (rel, entry) in &self.entries {
            if entry.dir {
                continue;
            }
            let path = self.root.join(rel);
            let now = std::fs::symlink_metadata(&path).ok();
            let same = now.as_ref().is_some_and(|m| {
                m.len() == entry.len && m.modified().ok() == entry.modified && !m.is_dir()
            });
            if same {
                continue;
            }
            match &entry.copy {
                Some(copy) => {
                    if let Some(parent) = path.parent() {
                        let _ = std::fs::create_dir_all(parent);
                    }
                    let back = std::fs::copy(copy, &path).and_then(|_| {
                        let file = std::fs::File::options().write(true).open(&path)?;
                        match entry.modified {
                            Some(t) => file.set_modified(t),
                            None => Ok(()),
                        }
                    });
                    match back {
                        Ok(()) => restored.copied_back.push(rel.clone()),
                        Err(e) => restored.lost.push((rel.clone(), e.to_string())),
                    }
                }
                None => restored.lost.push((
                    rel.clone(),
                    if now.is_none() {
                        "removed".to_owned()
                    } else {
                        format!(
                            "larger than the {} MiB copied before a launch",
                            MAX_COPIED_FILE >> 20
                        )
                    },
                )),
            }
        }
        restored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_leaves_the_folder_as_it_found_it() {
        let root = tempfile::tempdir().unwrap();
        let copies = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::write(r.join("train.py"), "print(1)\n").unwrap();
        std::fs::create_dir_all(r.join("data")).unwrap();
        std::fs::write(r.join("data/tokens.bin"), [1u8; 64]).unwrap();
        std::fs::write(r.join("big.bin"), vec![0u8; (MAX_COPIED_FILE + 1) as usize]).unwrap();
        std::fs::create_dir_all(r.join(".git")).unwrap();
        std::fs::write(r.join(".git/HEAD"), "ref").unwrap();
        std::fs::create_dir_all(r.join("dumps")).unwrap();
        let before = Workdir::snapshot(
            r,
            copies.path(),
            &[Path::new("dumps/run1"), Path::new("ck/a")],
        )
        .unwrap();

        // What a run does: a snapshot and a folder of checkpoints, a changed and a removed
        // file, a big file changed in place, and a file inside .git (not watched).
        std::fs::write(r.join("snapshot.pt"), "weights").unwrap();
        std::fs::create_dir_all(r.join("out/ckpt")).unwrap();
        std::fs::write(r.join("out/ckpt/1.pt"), "w").unwrap();
        std::fs::write(r.join("train.py"), "print(2)  # longer\n").unwrap();
        std::fs::remove_file(r.join("data/tokens.bin")).unwrap();
        std::fs::write(r.join("big.bin"), vec![1u8; 10]).unwrap();
        std::fs::write(r.join(".git/index"), "x").unwrap();
        // What detcheck hands the program: a dump folder and a checkpoint folder (and its new
        // parent), kept.
        std::fs::create_dir_all(r.join("dumps/run1")).unwrap();
        std::fs::write(r.join("dumps/run1/rank0.dctrace"), "t").unwrap();
        std::fs::write(r.join("dumps/stray"), "s").unwrap();
        std::fs::create_dir_all(r.join("ck/a")).unwrap();
        std::fs::write(r.join("ck/a/state"), "s").unwrap();

        let restored = before.restore();
        assert_eq!(
            restored.removed,
            [
                PathBuf::from("out"),
                PathBuf::from("snapshot.pt"),
                PathBuf::from("dumps/stray")
            ]
        );
        assert!(r.join("dumps/run1/rank0.dctrace").exists() && r.join("ck/a/state").exists());
        assert_eq!(
            restored.copied_back,
            [PathBuf::from("data/tokens.bin"), PathBuf::from("train.py")]
        );
        assert_eq!(restored.lost.len(), 1);
        assert_eq!(restored.lost[0].0, PathBuf::from("big.bin"));
        assert_eq!(
            std::fs::read_to_string(r.join("train.py")).unwrap(),
            "print(1)\n"
        );
        assert_eq!(std::fs::read(r.join("data/tokens.bin")).unwrap(), [1u8; 64]);
        assert!(!r.join("snapshot.pt").exists() && !r.join("out").exists());
        assert!(
            r.join(".git/index").exists(),
            "inside .git nothing is touched"
        );
        let entry = restored.environment_entry().unwrap();
        assert!(
            entry.starts_with("changed and not put back: big.bin (larger than the 4 MiB"),
            "{entry}"
        );

        // Nothing changed: nothing to say, nothing done.
        let again = Workdir::snapshot(r, copies.path(), &[]).unwrap().restore();
        assert_eq!(again, Restored::default());
        assert_eq!(again.environment_entry(), None);
    }
}
