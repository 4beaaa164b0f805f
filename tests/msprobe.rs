//! `detcheck compare` on real msprobe 26.2 dumps (tests/fixtures/msprobe/, made by
//! scripts/msprobe_fixtures.py): both folder layouts, tensor mode (`.pt` and `.npy`) with its
//! element metrics, and damaged files, which must be errors naming the file.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/msprobe")
        .join(name)
}

/// `detcheck compare A B` with the exit code it must give.
fn compare(a: &Path, b: &Path, code: i32) -> Outcome {
    let out = Command::new(env!("CARGO_BIN_EXE_detcheck"))
        .arg("compare")
        .args([a, b])
        .output()
        .expect("the detcheck binary runs");
    let out = Outcome {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert_eq!(
        out.code,
        code,
        "compare {} {}\nstdout:\n{}\nstderr:\n{}",
        a.display(),
        b.display(),
        out.stdout,
        out.stderr
    );
    out
}

fn has(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "lacks {needle:?}:\n{text}");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The only folder inside `dir` (a step's `proc{PID}` folder, whatever its process id).
fn only_subdir(dir: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "{}", dir.display());
    dirs.pop().unwrap()
}

/// Replaces the first occurrence of `from` after `after` in a file.
fn edit(path: &Path, after: &str, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let start = text
        .find(after)
        .unwrap_or_else(|| panic!("{after} in {}", path.display()));
    let at = start + text[start..].find(from).unwrap();
    let edited = format!("{}{to}{}", &text[..at], &text[at + from.len()..]);
    std::fs::write(path, edited).unwrap();
}

#[test]
fn a_proc_dump_compares_with_itself_and_names_a_changed_record() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["md5_L1", "stats_L0", "nan_L1"] {
        // NaN and Infinity literals (nan_L1) are read as numbers: identical, exit 0.
        let out = compare(&fixture(name), &fixture(name), 0);
        has(
            &out.stdout,
            &["identical", "-> rank 0 (ranks by increasing process id)"],
        );
    }
    // A copy from another process (another pid) with one md5 changed: exit 1 naming the record.
    let b = dir.path().join("b");
    copy_dir(&fixture("md5_L1"), &b);
    let proc = only_subdir(&b.join("step1"));
    std::fs::rename(&proc, b.join("step1/proc4000000")).unwrap();
    std::fs::rename(only_subdir(&b.join("step0")), b.join("step0/proc4000000")).unwrap();
    edit(
        &b.join("step1/proc4000000/dump.json"),
        "\"Functional.relu.0.forward\"",
        "\"md5\": \"",
        "\"md5\": \"deadbeef\", \"old\": \"",
    );
    let out = compare(&fixture("md5_L1"), &b, 1);
    has(
        &out.stdout,
        &[
            "compared 30 records: 1 differ",
            "first divergence: step 1 rank 0 seq 4 `Functional.relu.0.forward.input.0`: md5 differs",
            "proc4000000 -> rank 0",
        ],
    );
    // Statistics mode (L0, modules and parameters_grad): a changed Max.
    let s = dir.path().join("s");
    copy_dir(&fixture("stats_L0"), &s);
    let json = only_subdir(&s.join("step0")).join("dump.json");
    edit(
        &json,
        "\"Module.0.Linear.parameters_grad.0\"",
        "\"Max\": ",
        "\"Max\": 1e3, \"old\": ",
    );
    let out = compare(&fixture("stats_L0"), &s, 1);
    has(
        &out.stdout,
        &["`Module.0.Linear.parameters_grad.0.bias`: stats differ"],
    );
}

#[test]
fn a_rank_dump_and_proc_folders_pair_by_process_id() {
    let dist = fixture("dist_md5_L1");
    let out = compare(&dist, &dist, 0);
    has(&out.stdout, &["identical", "2 ranks"]);
    // The same two dumps as proc folders: proc30 is rank 0 and proc200 rank 1 (by number, not
    // by name, where "proc200" < "proc30"), so they pair with rank0 and rank1.
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b");
    copy_dir(&dist.join("step0/rank0"), &b.join("step0/proc30"));
    copy_dir(&dist.join("step0/rank1"), &b.join("step0/proc200"));
    let out = compare(&dist, &b, 0);
    has(
        &out.stdout,
        &[
            "identical",
            "proc30 -> rank 0, proc200 -> rank 1 (ranks by increasing process id)",
        ],
    );
    // A changed md5 on rank 1 names that rank.
    edit(
        &b.join("step0/proc200/dump.json"),
        "\"Distributed.all_reduce.0.forward\"",
        "\"md5\": \"",
        "\"md5\": \"deadbeef\", \"old\": \"",
    );
    let out = compare(&dist, &b, 1);
    has(
        &out.stdout,
        &[
            "first divergence: step 0 rank 1 seq",
            "`Distributed.all_reduce.0.forward.input.0`",
        ],
    );
    // Both kinds of folder in one step: which process is which rank is unknown.
    copy_dir(&dist.join("step0/rank0"), &b.join("step0/rank0"));
    let out = compare(&dist, &b, 2);
    has(&out.stderr, &["holds both rank<M>/ and proc<PID>/ folders"]);
}

#[test]
fn pt_tensor_dumps_give_checksums_and_element_metrics() {
    let t = fixture("tensor_L1");
    let out = compare(&t, &t, 0);
    has(&out.stdout, &["compared 11 records: 0 differ"]);
    // The checksum of each .pt (the CRC-32 of its bytes, from the zip directory) is msprobe's
    // md5-mode checksum: the tensor dump matches the md5 dump of the same seeded run on every
    // record both hold.
    let out = compare(&fixture("md5_L1"), &t, 1);
    assert!(!out.stdout.contains("md5 differs"), "{}", out.stdout);
    has(
        &out.stdout,
        &["4 records are only in A within steps both have"],
    );
    // relu's input replaced by its output (same shape, negative values clipped): B differs there,
    // and the row shows the element metrics.
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b");
    copy_dir(&t, &b);
    let data = only_subdir(&b.join("step0")).join("dump_tensor_data");
    std::fs::copy(
        data.join("Functional.relu.0.forward.output.0.pt"),
        data.join("Functional.relu.0.forward.input.0.pt"),
    )
    .unwrap();
    let out = compare(&t, &b, 1);
    has(
        &out.stdout,
        &[
            "first divergence: step 0 rank 0 seq 4 `Functional.relu.0.forward.input.0`: md5 differs",
            "max_abs",
            "cosine",
            "<1e-3",
        ],
    );
    // A damaged .pt: its storage no longer matches the zip's CRC-32 when its elements are read.
    let pt = data.join("Functional.relu.0.forward.input.0.pt");
    let mut bytes = std::fs::read(&pt).unwrap();
    // The storage follows the local header of `.../data/0`: 30 bytes, the name, the extra field.
    let name = b"/data/0";
    let end = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let header = bytes[..end]
        .windows(4)
        .rposition(|w| w == b"PK\x03\x04")
        .unwrap();
    let field = |at: usize| usize::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]));
    let storage = header + 30 + field(header + 26) + field(header + 28);
    bytes[storage] ^= 0x40;
    std::fs::write(&pt, &bytes).unwrap();
    let out = compare(&t, &b, 2);
    has(
        &out.stderr,
        &[
            "Functional.relu.0.forward.input.0.pt: bad tensor file",
            "CRC-32",
        ],
    );
    // A truncated .pt: an error naming the file, when the step is read.
    std::fs::write(&pt, &bytes[..bytes.len() - 30]).unwrap();
    let out = compare(&t, &b, 2);
    has(
        &out.stderr,
        &[
            "Functional.relu.0.forward.input.0.pt: bad tensor file",
            "not a zip archive",
        ],
    );
}

#[test]
fn npy_tensor_dumps_give_element_metrics() {
    let (a, b) = (fixture("npy/a"), fixture("npy/b"));
    compare(&a, &a, 0);
    let out = compare(&a, &b, 1);
    has(
        &out.stdout,
        &[
            "compared 6 records: 1 differ",
            "`Functional.relu.0.forward.output.0`: md5 differs",
            "max_abs",
            "9.0003e-4",
            "1.000000",
            "100.0%",
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    copy_dir(&a, &c);
    let data = c.join("step0/rank0/dump_tensor_data");
    // The Fortran-order file holds relu's input column-major: read as the same tensor.
    std::fs::copy(
        data.join("Functional.relu.0.forward.input.0.npy"),
        data.join("Functional.fortran.0.forward.output.0.npy"),
    )
    .unwrap();
    compare(&a, &c, 0);
    // Truncated, and not a .npy at all: errors naming the file.
    let npy = data.join("Functional.relu.0.forward.output.0.npy");
    let bytes = std::fs::read(&npy).unwrap();
    std::fs::write(&npy, &bytes[..bytes.len() - 3]).unwrap();
    let out = compare(&a, &c, 2);
    has(
        &out.stderr,
        &["Functional.relu.0.forward.output.0.npy: bad tensor file: truncated"],
    );
    std::fs::write(&npy, b"garbage").unwrap();
    let out = compare(&a, &c, 2);
    has(
        &out.stderr,
        &["output.0.npy: bad tensor file: not a .npy file"],
    );
    // A file whose shape is not the record's.
    let other = std::fs::read(data.join("Functional.index.0.forward.output.0.npy")).unwrap();
    std::fs::write(&npy, other).unwrap();
    let out = compare(&a, &c, 2);
    has(&out.stderr, &["output.0.npy", "dump.json gives [2, 3]"]);
}

#[test]
fn bad_json_is_an_error_naming_the_file_field_and_byte() {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b");
    copy_dir(&fixture("dist_md5_L1"), &b);
    let json = b.join("step0/rank1/dump.json");
    let text = std::fs::read_to_string(&json).unwrap();
    // Trailing garbage after the document.
    std::fs::write(&json, format!("{text}\n{{}}")).unwrap();
    let out = compare(&fixture("dist_md5_L1"), &b, 2);
    has(
        &out.stderr,
        &[
            "rank1/dump.json: field `(top level)`",
            "after the end of the JSON document",
        ],
    );
    // Truncated inside a record (a crashed dump).
    std::fs::write(&json, &text[..text.len() / 2]).unwrap();
    let out = compare(&fixture("dist_md5_L1"), &b, 2);
    has(
        &out.stderr,
        &[
            "rank1/dump.json: field `data.",
            "the file ends inside",
            "(at byte",
        ],
    );
    // A statistic that is not a number.
    std::fs::write(
        &json,
        text.replacen("\"Max\": ", "\"Max\": \"big\", \"x\": ", 1),
    )
    .unwrap();
    let out = compare(&fixture("dist_md5_L1"), &b, 2);
    has(
        &out.stderr,
        &[
            "rank1/dump.json: field `data.Tensor.__add__.0.forward.input_args.0.Max`",
            "expected a number, got \"big\"",
        ],
    );
}
