//! Every launch of a `command` scenario runs in a private copy of the working directory.
//!
//! A program writes files where it runs: snapshots, checkpoints, caches, logs. A script that
//! resumes from `snapshot.pt` when the file exists (PyTorch's DDP tutorial series) would resume the
//! second run of a check from the first run's snapshot, and fail `repeat` for a reason that is not
//! in the program; and it would leave the snapshot in the user's folder. So [`Workdir::mirror`]
//! builds, in a temporary folder of detcheck's, a tree that mirrors the working directory: folders
//! are made anew, small files are copied (their modification times kept), large files and folders
//! that are not the program's (`.git`, `target`, `node_modules`, `__pycache__`, virtual
//! environments) are symbolic links to the originals, and symbolic links are made again as they
//! are. The program runs there (its current directory, and `PWD`): what it creates or changes stays
//! in the mirror, which the next launch gets back made like the user's folder again, and the user's
//! folder is never written by detcheck, nor restored (restoring would undo what the user saves
//! there while a check runs). The mirror sits [`PARENT_LEVELS`] folders deep, each standing for the
//! user's folder at that level with links to its entries, so relative paths out of the working
//! directory (`../data`, `../../Datasets`: example repositories read their siblings) reach the
//! user's files as without detcheck; what the program writes into them there is written into the
//! user's folders, as without detcheck.
//!
//! The mirror is kept from launch to launch: a check launches its program several times from one
//! folder, and making a mirror costs a file or a link per entry (on a slow disk, about a second for
//! a repository of a thousand files or a `/tmp` of a thousand entries above it). So
//! [`Workdir::lend`] lends a launch the mirror an earlier launch of this process used, at the same
//! path (`detcheck-cwd-PID-N-HOST` in the launches' folder), after walking it beside the user's
//! folders and making it match them again entry by entry ([`Workdir::sync`]: what the earlier
//! launch wrote, changed, removed or replaced there, also in the folders above, is undone; a copied
//! file is kept only when its status-change time, which no program can set back, is the one it had
//! when copied; what the user changed meanwhile is taken). A launch at the same time as another
//! gets a mirror of its own. The command line removes its mirrors when the command ends
//! ([`remove_kept`]); a process that ended without doing so has its mirrors removed by the next one
//! that lends a mirror in the same folder.
//!
//! What can still reach the user's folder: a large file that the program changes in place
//! through its link ([`Workdir::changed_originals`] names it, and the runner puts the names in
//! every rank's environment snapshot, `detcheck.workdir`, where a failed check shows them as a
//! difference between runs), anything written inside a linked folder, and files written by
//! absolute path outside the working directory (a Python rank notes those it opens,
//! `detcheck.files`, and a failed check names one that a run read after another wrote it).
//!
//! Determinism: the walk is sorted, and what is copied depends only on the folder's contents;
//! a mirror lent again holds what a new one would.
//! Limits: at most [`MAX_ENTRIES`] entries are mirrored one by one (the folders beyond are
//! linked whole); files up to [`MAX_COPIED_FILE`] bytes are copied, [`MAX_COPIED_TOTAL`] in all.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
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
/// The name of a kept mirror's folder: `detcheck-cwd-PID-N-HOST` in the launches' folder (the
/// host: a folder that several nodes share holds the mirrors of processes on each).
const KEPT_PREFIX: &str = "detcheck-cwd-";

/// This machine's name, as a kept mirror's folder ends.
fn host() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The private copy of a working directory that one launch runs in.
#[derive(Debug)]
pub(crate) struct Workdir {
    root: PathBuf,
    /// The folder that holds the whole mirror, the folders above `root` included.
    base: PathBuf,
    mirror: PathBuf,
    /// The folders above `root` that the mirror stands for, from the top down.
    levels: Vec<Level>,
    /// Files linked rather than copied: (relative path, length, modification time).
    linked: Vec<(PathBuf, u64, Option<SystemTime>)>,
    /// The walk reached [`MAX_ENTRIES`]: the rest is linked whole.
    truncated: bool,
    /// The files copied, by relative path: what the original and the copy were just after.
    copies: BTreeMap<PathBuf, Copied>,
}

/// One folder above the working directory: the user's, the one that stands for it in the
/// mirror, and the name of the folder below it on the way down (made, not linked).
#[derive(Debug)]
struct Level {
    user: PathBuf,
    ours: PathBuf,
    down: OsString,
}

/// A copied file as it was made: its original's length and modification time, and the copy's
/// inode and status-change time. A copy that anything wrote, renamed over or touched since has
/// another status-change time (no program can set it back), so it is made again.
#[derive(Debug, PartialEq, Eq)]
struct Copied {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
    changed: (i64, i64),
}

impl Copied {
    fn of(original: &std::fs::Metadata, copy: &std::fs::Metadata) -> Self {
        Copied {
            len: original.len(),
            modified: original.modified().ok(),
            inode: copy.ino(),
            changed: (copy.ctime(), copy.ctime_nsec()),
        }
    }
}

fn is_venv(dir: &Path) -> bool {
    dir.join("pyvenv.cfg").is_file()
}

fn link(target: &Path, at: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, at)
}

/// Whether `at` is a symbolic link to `target`.
fn links_to(at: &Path, target: &Path) -> bool {
    std::fs::read_link(at).is_ok_and(|t| t == target)
}

/// A folder of its own at `at` (not a link to one), unless one is there already.
fn ensure_folder(at: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(at).is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    remove(at)?;
    std::fs::create_dir(at)
}

/// Removes whatever is at `at`: a link (not what it leads to), a file, a folder with its
/// contents (links inside are removed, not followed). Nothing there is fine.
fn remove(at: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(at) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(at),
        Ok(_) => std::fs::remove_file(at),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The names of the entries of `dir` (none when it cannot be read).
fn names(dir: &Path) -> BTreeSet<OsString> {
    std::fs::read_dir(dir)
        .map(|read| read.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default()
}

/// The folders above `root` that the mirror under `base` stands for, from the top down
/// ([`PARENT_LEVELS`] of them, fewer at the top of the file system), and where `root`'s
/// mirror goes.
fn parent_levels(root: &Path, base: &Path) -> (Vec<Level>, PathBuf) {
    let above: Vec<&Path> = root.ancestors().skip(1).take(PARENT_LEVELS).collect();
    let mut at = base.to_path_buf();
    let mut levels = Vec::new();
    for (k, dir) in above.iter().enumerate().rev() {
        let below = if k == 0 { root } else { above[k - 1] };
        let Some(name) = below.file_name() else {
            break;
        };
        levels.push(Level {
            user: dir.to_path_buf(),
            ours: at.clone(),
            down: name.to_owned(),
        });
        at.push(name);
    }
    (levels, at)
}

/// Mirrors kept for the next launch from the same folder (each in the launches' folder, its
/// `base`'s parent): a check launches its program several times from one working directory,
/// and making a mirror costs a file or a link per entry (on a slow disk, a second for a folder
/// of a thousand entries), bringing one back costs a look at each.
static KEPT: Mutex<Vec<Workdir>> = Mutex::new(Vec::new());

/// The launches' folders already swept of the kept mirrors of processes that have ended.
static SWEPT: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// A mirror lent to one launch; given back to be kept when dropped.
#[derive(Debug)]
pub(crate) struct Lent {
    workdir: Option<Workdir>,
}

impl std::ops::Deref for Lent {
    type Target = Workdir;
    fn deref(&self) -> &Workdir {
        self.workdir.as_ref().expect("lent until dropped")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(workdir) = self.workdir.take() {
            lock(&KEPT).push(workdir);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes the private copies of working directories that this process keeps from launch to
/// launch of `command` scenarios (`detcheck::run::remove_kept_workdirs`). The command line
/// calls it when a command ends; a program that checks `command` scenarios through the library
/// calls it when it is done with them (or leaves them to be removed by the next process that
/// launches from the same temporary folder, once this one has ended).
pub fn remove_kept() {
    for workdir in lock(&KEPT).drain(..) {
        let _ = std::fs::remove_dir_all(&workdir.base);
    }
}

/// Removes the kept mirrors in `parent` of this machine's processes that have ended (killed,
/// or a library's process that never called [`remove_kept`]); once per folder and process.
fn sweep(parent: &Path) {
    if !lock(&SWEPT).insert(parent.to_path_buf()) {
        return;
    }
    let host = host();
    for name in names(parent) {
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(KEPT_PREFIX))
            .and_then(|rest| rest.splitn(3, '-').collect::<Vec<_>>().try_into().ok())
            .filter(|[_, _, on]: &[&str; 3]| *on == host)
            .and_then(|[pid, _, _]| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            .map_or_else(|e| e == nix::errno::Errno::EPERM, |()| true);
        if !alive {
            let _ = std::fs::remove_dir_all(parent.join(name));
        }
    }
}

impl Workdir {
    /// The mirror of `root` for one launch, in a folder of its own in `parent`
    /// (`detcheck-cwd-PID-N-HOST`): one this process kept from an earlier launch from `root`, made
    /// to match the user's folders again entry by entry (what the earlier launch wrote,
    /// changed or removed is undone; what the user changed since is taken), or a new one.
    pub(crate) fn lend(root: &Path, parent: &Path) -> std::io::Result<Lent> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let root = std::path::absolute(root)?;
        let parent = std::path::absolute(parent)?;
        sweep(&parent);
        let kept = {
            let mut kept = lock(&KEPT);
            let found = kept
                .iter()
                .position(|w| w.root == root && w.base.parent() == Some(parent.as_path()));
            found.map(|i| kept.swap_remove(i))
        };
        if let Some(mut workdir) = kept {
            match workdir.sync() {
                Ok(()) => {
                    return Ok(Lent {
                        workdir: Some(workdir),
                    })
                }
                Err(_) => {
                    let _ = std::fs::remove_dir_all(&workdir.base);
                }
            }
        }
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = parent.join(format!(
            "{KEPT_PREFIX}{}-{n}-{}",
            std::process::id(),
            host()
        ));
        let _ = std::fs::remove_dir_all(&base);
        let workdir = Workdir::mirror(&root, &base).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&base);
        })?;
        Ok(Lent {
            workdir: Some(workdir),
        })
    }

    /// Builds the mirror of `root` under `base` (created; it must not exist yet, and must not
    /// be inside `root`'s mirrored part: the walk skips it): `base` stands for the folder
    /// [`PARENT_LEVELS`] above `root`, and each folder between holds links to the entries of
    /// the one it stands for, so that `../data` and `../../Datasets` from the mirror are the
    /// user's; the mirror of `root` is the last of them ([`Workdir::path`]).
    pub(crate) fn mirror(root: &Path, base: &Path) -> std::io::Result<Self> {
        let root = std::path::absolute(root)?;
        let base = std::path::absolute(base)?;
        std::fs::create_dir_all(&base)?;
        let (levels, mirror) = parent_levels(&root, &base);
        let mut workdir = Workdir {
            root,
            base,
            mirror,
            levels,
            linked: Vec::new(),
            truncated: false,
            copies: BTreeMap::new(),
        };
        workdir.sync()?;
        Ok(workdir)
    }

    /// Makes the mirror match the user's folders: the same walk, with the same decisions
    /// (copy, link, folder), whether the mirror is empty or was made before and a launch ran
    /// in it. An entry that already is what the walk wants stays; any other is made again; an
    /// entry the user's folder does not have is removed.
    fn sync(&mut self) -> std::io::Result<()> {
        for level in &self.levels {
            self.sync_level(level)?;
        }
        ensure_folder(&self.mirror)?;
        self.sync_tree()
    }

    /// One folder above the working directory: a link to each of the user's entries but the
    /// one on the way down, which is a folder of ours. A folder above that cannot be read, or
    /// holds more than [`MAX_ENTRIES`] entries, is stood for with no links.
    fn sync_level(&self, level: &Level) -> std::io::Result<()> {
        std::fs::create_dir_all(&level.ours)?;
        let mut wanted = names(&level.user);
        if wanted.len() > MAX_ENTRIES {
            wanted.clear();
        }
        wanted.remove(&level.down);
        for present in names(&level.ours) {
            if present != level.down && !wanted.contains(&present) {
                remove(&level.ours.join(present))?;
            }
        }
        for name in wanted {
            let (target, at) = (level.user.join(&name), level.ours.join(&name));
            if !links_to(&at, &target) {
                remove(&at)?;
                link(&target, &at)?;
            }
        }
        ensure_folder(&level.ours.join(&level.down))
    }

    /// The working directory's tree, sorted, breadth first: folders made, small files copied
    /// (their modification times kept), the rest linked; see the module's documentation.
    fn sync_tree(&mut self) -> std::io::Result<()> {
        let (root, mirror) = (self.root.clone(), self.mirror.clone());
        self.linked.clear();
        self.truncated = false;
        let mut copies = BTreeMap::new();
        let mut entries = 0usize;
        let mut copied = 0u64;
        let mut pending = VecDeque::from([PathBuf::new()]);
        while let Some(relative) = pending.pop_front() {
            let mut extra = names(&mirror.join(&relative));
            // Sorted (a set): the walk's decisions do not depend on the file system's order.
            for name in names(&root.join(&relative)) {
                let rel = relative.join(&name);
                let (original, copy) = (root.join(&rel), mirror.join(&rel));
                if mirror.starts_with(&original) {
                    continue; // the mirror itself, or a folder above it
                }
                let Ok(meta) = std::fs::symlink_metadata(&original) else {
                    continue;
                };
                extra.remove(&name);
                entries += 1;
                let budget = entries <= MAX_ENTRIES;
                self.truncated |= !budget;
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
                    self.ensure_link(&target, &copy)?;
                } else if meta.is_dir() {
                    let foreign = LINKED_FOLDERS.iter().any(|f| name == *f) || is_venv(&original);
                    let readable = std::fs::read_dir(&original).is_ok();
                    if foreign || !budget || !readable {
                        self.ensure_link(&original, &copy)?;
                    } else {
                        ensure_folder(&copy)?;
                        pending.push_back(rel);
                    }
                } else if meta.is_file()
                    && budget
                    && meta.len() <= MAX_COPIED_FILE
                    && copied + meta.len() <= MAX_COPIED_TOTAL
                {
                    let made = self.copies.remove(&rel).filter(|made| {
                        std::fs::symlink_metadata(&copy)
                            .is_ok_and(|now| now.is_file() && Copied::of(&meta, &now) == *made)
                    });
                    let made = match made {
                        Some(made) => made,
                        None => {
                            remove(&copy)?;
                            std::fs::copy(&original, &copy)?;
                            if let Ok(modified) = meta.modified() {
                                std::fs::File::options()
                                    .write(true)
                                    .open(&copy)?
                                    .set_modified(modified)?;
                            }
                            Copied::of(&meta, &std::fs::symlink_metadata(&copy)?)
                        }
                    };
                    copies.insert(rel, made);
                    copied += meta.len();
                } else {
                    self.ensure_link(&original, &copy)?;
                    if meta.is_file() {
                        self.linked.push((rel, meta.len(), meta.modified().ok()));
                    }
                }
            }
            for name in extra {
                remove(&mirror.join(&relative).join(name))?;
            }
        }
        self.copies = copies;
        Ok(())
    }

    /// A link to `target` at `at`, unless one is there already.
    fn ensure_link(&self, target: &Path, at: &Path) -> std::io::Result<()> {
        if !links_to(at, target) {
            remove(at)?;
            link(target, at)?;
        }
        Ok(())
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

    /// A check launches its program several times from one folder: the second launch gets the
    /// first one's mirror back, at the same path, made like the user's folders again. What the
    /// first launch wrote, changed, removed or replaced there (in the working directory and in
    /// the folders above it) is undone; what the user changed meanwhile is taken.
    #[test]
    fn a_mirror_lent_again_is_made_like_the_users_folder_again() {
        let top = tempfile::tempdir().unwrap();
        let t = top.path();
        let root = t.join("repo/examples/word_lm");
        std::fs::create_dir_all(root.join("data/shards")).unwrap();
        std::fs::create_dir_all(t.join("repo/data")).unwrap();
        std::fs::write(t.join("repo/data/corpus.txt"), "words").unwrap();
        std::fs::write(root.join("main.py"), "print(1)\n").unwrap();
        std::fs::write(root.join("config.json"), "{}").unwrap();
        std::fs::write(root.join("data/shards/0.bin"), [1u8; 64]).unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        let parent = tempfile::tempdir().unwrap();

        let first = Workdir::lend(&root, parent.path()).unwrap();
        let m = first.path().to_path_buf();
        assert!(
            m.starts_with(parent.path()) && m.ends_with("repo/examples/word_lm"),
            "{m:?}"
        );
        // What a run does: a snapshot, a folder of checkpoints, a changed, a removed and a
        // replaced file, a folder made a file, a link removed, a sibling made above.
        std::fs::write(m.join("snapshot.pt"), "weights").unwrap();
        std::fs::create_dir_all(m.join("out/ckpt")).unwrap();
        std::fs::write(m.join("main.py"), "print(2)\n").unwrap();
        std::fs::remove_file(m.join("config.json")).unwrap();
        std::fs::remove_dir_all(m.join("data/shards")).unwrap();
        std::fs::write(m.join("data/shards"), "not a folder").unwrap();
        std::fs::remove_file(m.join(".git")).unwrap();
        std::fs::create_dir_all(m.join("../../made_by_the_run")).unwrap();
        std::fs::remove_file(m.join("../../data")).unwrap();
        drop(first);
        // What the user does meanwhile: a new file, a changed one, a new sibling above.
        std::fs::write(root.join("notes.txt"), "new").unwrap();
        std::fs::write(root.join("config.json"), "{\"lr\": 1}").unwrap();
        std::fs::create_dir_all(t.join("repo/Datasets")).unwrap();

        let again = Workdir::lend(&root, parent.path()).unwrap();
        assert_eq!(again.path(), m);
        let read = |rel: &str| std::fs::read_to_string(m.join(rel)).unwrap();
        assert!(!m.join("snapshot.pt").exists() && !m.join("out").exists());
        assert_eq!(read("main.py"), "print(1)\n");
        assert_eq!(read("config.json"), "{\"lr\": 1}");
        assert_eq!(read("notes.txt"), "new");
        assert_eq!(
            std::fs::read(m.join("data/shards/0.bin")).unwrap(),
            [1u8; 64]
        );
        assert!(m.join(".git").is_symlink());
        assert!(!m.join("../../made_by_the_run").exists());
        assert_eq!(read("../../data/corpus.txt"), "words");
        assert!(m.join("../../Datasets").is_symlink());
        // The user's folder was never written.
        assert!(!t.join("repo/made_by_the_run").exists() && !root.join("snapshot.pt").exists());
        assert_eq!(
            std::fs::read_to_string(root.join("main.py")).unwrap(),
            "print(1)\n"
        );
        // The copies kept their originals' modification times.
        let modified = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
        assert_eq!(
            modified(&m.join("main.py")),
            modified(&root.join("main.py"))
        );
        // A launch at the same time as another gets a mirror of its own.
        let beside = Workdir::lend(&root, parent.path()).unwrap();
        assert_ne!(beside.path(), m);
    }

    /// A kept mirror whose process has ended (killed before it removed it) is removed by the
    /// next process that lends one in the same folder; a live process's is left alone.
    #[test]
    fn the_kept_mirrors_of_ended_processes_are_swept() {
        let parent = tempfile::tempdir().unwrap();
        let p = parent.path();
        // No process has the largest pid (the kernel's limit is far below it).
        let ended = p.join(format!("{KEPT_PREFIX}{}-0-{}", i32::MAX, host()));
        let live = p.join(format!("{KEPT_PREFIX}1-0-{}", host()));
        let elsewhere = p.join(format!("{KEPT_PREFIX}{}-0-another-node", i32::MAX));
        for folder in [&ended, &live, &elsewhere] {
            std::fs::create_dir_all(folder.join("tmp/x")).unwrap();
        }
        let root = tempfile::tempdir().unwrap();
        let lent = Workdir::lend(root.path(), p).unwrap();
        assert!(!ended.exists());
        assert!(live.exists(), "pid 1 lives");
        assert!(
            elsewhere.exists(),
            "another node's process is not this one's to judge"
        );
        drop(lent);
    }
}
