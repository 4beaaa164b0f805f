//! Every launch of a `command` scenario runs in a private copy of the working directory.
//!
//! A program writes files where it runs: snapshots, checkpoints, caches, logs. A script that
//! resumes from `snapshot.pt` when the file exists (PyTorch's DDP tutorial series) would resume
//! the second run of a check from the first run's snapshot, and fail `repeat` for a reason
//! that is not in the program; and it would leave the snapshot in the user's folder. So
//! [`Workdir::mirror`] builds, in the launch's own temporary folder, a tree that mirrors the
//! working directory: folders are made anew, small files are copied (their modification times
//! kept), large files and folders that are not the program's (`.git`, `target`,
//! `node_modules`, `__pycache__`, virtual environments) are symbolic links to the originals,
//! and symbolic links are made again as they are. The program runs there (its current
//! directory, and `PWD`): what it creates or changes stays in the mirror, which goes with the
//! launch's folder, and the user's folder is never written by detcheck, nor restored (restoring
//! would undo what the user saves there while a check runs). The mirror sits [`PARENT_LEVELS`]
//! folders deep, each standing for the user's folder at that level with links to its entries,
//! so relative paths out of the working directory (`../data`, `../../Datasets`: example
//! repositories read their siblings) reach the user's files as without detcheck; what the
//! program writes there is written into the user's folders, as without detcheck.
//!
//! What can still reach the user's folder: a large file that the program changes in place
//! through its link ([`Workdir::changed_originals`] names it, and the runner puts the names in
//! every rank's environment snapshot, `detcheck.workdir`, where a failed check shows them as a
//! difference between runs), anything written inside a linked folder, and files written by
//! absolute path outside the working directory (a Python rank notes those it opens,
//! `detcheck.files`, and a failed check names one that a run read after another wrote it).
//!
//! Determinism: the walk is sorted, and what is copied depends only on the folder's contents.
//! Limits: at most [`MAX_ENTRIES`] entries are mirrored one by one (the folders beyond are
//! linked whole); files up to [`MAX_COPIED_FILE`] bytes are copied, [`MAX_COPIED_TOTAL`] in all.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The most entries mirrored one by one.
pub(crate) const MAX_ENTRIES: usize = 20_000;
/// The largest file copied into the mirror (bytes); larger ones are linked.
pub(crate) const MAX_COPIED_FILE: u64 = 4 << 20;
/// The most bytes copied into one mirror.
pub(crate) const MAX_COPIED_TOTAL: u64 = 64 << 20;
/// How many folders above the working directory the mirror stands in for (`../`, `../../`,
/// ...): their entries are links to the user's, so a program that reads a sibling folder
/// (`../data`) finds it as it does without detcheck.
pub(crate) const PARENT_LEVELS: usize = 4;
/// Folders linked whole: not the program's outputs, and large.
const LINKED_FOLDERS: [&str; 4] = [".git", "target", "node_modules", "__pycache__"];

/// The private copy of a working directory that one launch runs in.
#[derive(Debug)]
pub(crate) struct Workdir {
    root: PathBuf,
    mirror: PathBuf,
    /// Files linked rather than copied: (relative path, length, modification time).
    linked: Vec<(PathBuf, u64, Option<SystemTime>)>,
    /// The walk reached [`MAX_ENTRIES`]: the rest is linked whole.
    truncated: bool,
}

fn is_venv(dir: &Path) -> bool {
    dir.join("pyvenv.cfg").is_file()
}

fn link(target: &Path, at: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, at)
}

/// Makes, under `base`, the folders that stand for the [`PARENT_LEVELS`] folders above `root`
/// (fewer at the top of the file system), from the top down: each holds a link to every entry
/// of the folder it stands for but the one on the way down to `root`, which is made as a
/// folder; returns where `root`'s mirror goes (not yet made). A folder above that cannot be
/// read, or holds more than [`MAX_ENTRIES`] entries, is stood for with no links.
fn mirror_parents(root: &Path, base: &Path) -> std::io::Result<PathBuf> {
    let above: Vec<&Path> = root.ancestors().skip(1).take(PARENT_LEVELS).collect();
    let mut at = base.to_path_buf();
    for (k, dir) in above.iter().enumerate().rev() {
        let below = if k == 0 { root } else { above[k - 1] };
        let Some(name) = below.file_name() else {
            break;
        };
        if let Ok(read) = std::fs::read_dir(dir) {
            let mut names: Vec<_> = read
                .filter_map(Result::ok)
                .map(|e| e.file_name())
                .take(MAX_ENTRIES + 1)
                .collect();
            if names.len() <= MAX_ENTRIES {
                names.sort();
                for other in names.iter().filter(|n| *n != name) {
                    link(&dir.join(other), &at.join(other))?;
                }
            }
        }
        at.push(name);
        if k > 0 {
            std::fs::create_dir(&at)?;
        }
    }
    Ok(at)
}

impl Workdir {
    /// Builds the mirror of `root` under `base` (created; it must not exist yet, and must not
    /// be inside `root`'s mirrored part: the walk skips it): `base` stands for the folder
    /// [`PARENT_LEVELS`] above `root`, and each folder between holds links to the entries of
    /// the one it stands for, so that `../data` and `../../Datasets` from the mirror are the
    /// user's; the mirror of `root` is the last of them ([`Workdir::path`]).
    pub(crate) fn mirror(root: &Path, base: &Path) -> std::io::Result<Self> {
        let root = std::path::absolute(root)?;
        let base = std::path::absolute(base)?;
        std::fs::create_dir_all(&base)?;
        let mirror = mirror_parents(&root, &base)?;
        std::fs::create_dir(&mirror)?;
        let mut workdir = Workdir {
            root: root.clone(),
            mirror: mirror.clone(),
            linked: Vec::new(),
            truncated: false,
        };
        let mut entries = 0usize;
        let mut copied = 0u64;
        let mut pending = VecDeque::from([PathBuf::new()]);
        while let Some(relative) = pending.pop_front() {
            let Ok(read) = std::fs::read_dir(root.join(&relative)) else {
                continue;
            };
            let mut names: Vec<_> = read.filter_map(Result::ok).map(|e| e.file_name()).collect();
            names.sort();
            for name in names {
                let rel = relative.join(&name);
                let (original, copy) = (root.join(&rel), mirror.join(&rel));
                if mirror.starts_with(&original) {
                    continue; // the mirror itself, or a folder above it
                }
                let Ok(meta) = std::fs::symlink_metadata(&original) else {
                    continue;
                };
                entries += 1;
                let budget = entries <= MAX_ENTRIES;
                workdir.truncated |= !budget;
                if meta.file_type().is_symlink() {
                    // As it is, unless it is relative and leads out of the folder (`../data`):
                    // from the mirror it would lead elsewhere, so it leads to its target.
                    let mut target = std::fs::read_link(&original)?;
                    if target.is_relative() {
                        let parent = original.parent().unwrap_or(&root);
                        let inside = std::fs::canonicalize(parent.join(&target))
                            .ok()
                            .zip(std::fs::canonicalize(&root).ok())
                            .is_some_and(|(t, r)| t.starts_with(r));
                        if !inside {
                            target = parent.join(target);
                        }
                    }
                    link(&target, &copy)?;
                } else if meta.is_dir() {
                    let foreign = LINKED_FOLDERS.iter().any(|f| name == *f) || is_venv(&original);
                    let readable = std::fs::read_dir(&original).is_ok();
                    if foreign || !budget || !readable {
                        link(&original, &copy)?;
                    } else {
                        std::fs::create_dir(&copy)?;
                        pending.push_back(rel);
                    }
                } else if meta.is_file()
                    && budget
                    && meta.len() <= MAX_COPIED_FILE
                    && copied + meta.len() <= MAX_COPIED_TOTAL
                {
                    std::fs::copy(&original, &copy)?;
                    if let Ok(modified) = meta.modified() {
                        std::fs::File::options()
                            .write(true)
                            .open(&copy)?
                            .set_modified(modified)?;
                    }
                    copied += meta.len();
                } else {
                    link(&original, &copy)?;
                    if meta.is_file() {
                        workdir.linked.push((rel, meta.len(), meta.modified().ok()));
                    }
                }
            }
        }
        Ok(workdir)
    }

    /// The folder the launch runs in.
    pub(crate) fn path(&self) -> &Path {
        &self.mirror
    }

    /// The linked files the launch changed in place (the user's own files), or `None`; and
    /// whether the mirror was truncated: the words of `detcheck.workdir`.
    pub(crate) fn changed_originals(&self) -> Option<String> {
        let changed: Vec<String> = self
            .linked
            .iter()
            .filter(|(rel, len, modified)| {
                let now = std::fs::metadata(self.root.join(rel)).ok();
                now.is_none_or(|m| m.len() != *len || m.modified().ok() != *modified)
            })
            .map(|(rel, _, _)| rel.display().to_string())
            .collect();
        let mut words = Vec::new();
        if !changed.is_empty() {
            words.push(format!(
                "changed in place in the working directory (files larger than {} MiB are \
                 linked, not copied, into a launch's private copy): {}; a later run reads the \
                 changed file",
                MAX_COPIED_FILE >> 20,
                changed.join(", ")
            ));
        }
        if self.truncated && !changed.is_empty() {
            words.push(format!(
                "more than {MAX_ENTRIES} entries: the folders beyond are linked whole"
            ));
        }
        (!words.is_empty()).then(|| words.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pytorch/examples and many repositories read a sibling folder (`../data`,
    /// `../../Datasets`): from the mirror they are the user's, and the working directory
    /// itself is the copy, not the original.
    #[test]
    fn relative_paths_out_of_the_working_directory_reach_the_users_folders() {
        let top = tempfile::tempdir().unwrap();
        let t = top.path();
        std::fs::create_dir_all(t.join("Datasets/mnist")).unwrap();
        std::fs::write(t.join("Datasets/mnist/train.bin"), "images").unwrap();
        std::fs::create_dir_all(t.join("repo/data")).unwrap();
        std::fs::write(t.join("repo/data/corpus.txt"), "words").unwrap();
        std::fs::create_dir_all(t.join("repo/examples/word_lm")).unwrap();
        let root = t.join("repo/examples/word_lm");
        std::fs::write(root.join("main.py"), "print(1)\n").unwrap();
        let launch = tempfile::tempdir().unwrap();
        let workdir = Workdir::mirror(&root, &launch.path().join("cwd")).unwrap();
        let m = workdir.path();
        assert!(m.starts_with(launch.path()), "{m:?}");
        assert!(m.ends_with("repo/examples/word_lm"), "{m:?}");
        let read = |rel: &str| std::fs::read_to_string(m.join(rel)).unwrap();
        assert_eq!(read("main.py"), "print(1)\n");
        assert_eq!(read("../../data/corpus.txt"), "words");
        assert_eq!(read("../../../Datasets/mnist/train.bin"), "images");
        // The way down is the mirror's own: `..` does not lead back into the original.
        assert!(!m.join("..").join("word_lm").is_symlink());
        assert!(m.join("../../data").is_symlink());
        std::fs::write(m.join("out.txt"), "run").unwrap();
        assert!(!root.join("out.txt").exists());
    }

    #[test]
    fn a_launch_writes_into_its_private_copy_and_never_into_the_folder() {
        let root = tempfile::tempdir().unwrap();
        let launch = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::write(r.join("train.py"), "print(1)\n").unwrap();
        std::fs::create_dir_all(r.join("data/shards")).unwrap();
        std::fs::write(r.join("data/shards/0.bin"), [1u8; 64]).unwrap();
        std::fs::write(r.join("big.bin"), vec![0u8; (MAX_COPIED_FILE + 1) as usize]).unwrap();
        std::fs::create_dir_all(r.join(".git")).unwrap();
        std::os::unix::fs::symlink("data/shards", r.join("shards")).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("vocab.txt"), "a b").unwrap();
        let up = Path::new("..")
            .join(outside.path().file_name().unwrap())
            .join("vocab.txt");
        std::os::unix::fs::symlink(&up, r.join("vocab.txt")).unwrap();
        let workdir = Workdir::mirror(r, &launch.path().join("cwd")).unwrap();
        let m = workdir.path();

        // The program's view: the same names and contents.
        assert_eq!(
            std::fs::read_to_string(m.join("train.py")).unwrap(),
            "print(1)\n"
        );
        assert_eq!(std::fs::read(m.join("shards/0.bin")).unwrap(), [1u8; 64]);
        assert_eq!(
            std::fs::read_link(m.join("shards")).unwrap(),
            Path::new("data/shards")
        );
        assert_eq!(std::fs::read_to_string(m.join("vocab.txt")).unwrap(), "a b");
        assert!(m.join("big.bin").is_symlink() && m.join(".git").is_symlink());
        assert!(!m.join("train.py").is_symlink() && !m.join("data").is_symlink());
        assert_eq!(
            std::fs::metadata(m.join("train.py"))
                .unwrap()
                .modified()
                .unwrap(),
            std::fs::metadata(r.join("train.py"))
                .unwrap()
                .modified()
                .unwrap()
        );

        // What a run does there: a snapshot, a folder of checkpoints, a changed and a removed
        // file. None of it reaches the user's folder.
        std::fs::write(m.join("snapshot.pt"), "weights").unwrap();
        std::fs::create_dir_all(m.join("out/ckpt")).unwrap();
        std::fs::write(m.join("train.py"), "print(2)\n").unwrap();
        std::fs::remove_file(m.join("data/shards/0.bin")).unwrap();
        assert_eq!(workdir.changed_originals(), None);
        assert!(!r.join("snapshot.pt").exists() && !r.join("out").exists());
        assert_eq!(
            std::fs::read_to_string(r.join("train.py")).unwrap(),
            "print(1)\n"
        );
        assert!(r.join("data/shards/0.bin").exists());

        // A large file changed in place through its link is the user's: it is named.
        std::fs::write(m.join("big.bin"), [7u8; 3]).unwrap();
        let words = workdir.changed_originals().unwrap();
        assert!(
            words.contains("larger than 4 MiB")
                && words.ends_with("big.bin; a later run reads the changed file"),
            "{words}"
        );
    }
}
