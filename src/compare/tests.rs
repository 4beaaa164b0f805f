//! Dumps end to end: write, read back, reject damaged files, compare.

use super::*;
use crate::file::{
    format, tensor_path, trace_path, write_trace, write_trace_v2, DumpError, DumpMode, RunId,
    TraceWriter,
};
use crate::record::{Environment, RecordLevel, Recorder, Trace};
use crate::run::dump_scenario;
use crate::scenario::RunPlan;
use crate::value::tensor::Tensor;

/// A trace of `world` ranks; rank r records `a` = r + step and `b` = `value` at each step.
fn trace(world: u32, steps: u64, value: f32) -> Trace {
    let ranks = (0..world)
        .map(|r| {
            let mut rec = Recorder::new(r, RecordLevel::Stats);
            for step in 0..steps {
                rec.record(
                    step,
                    "a",
                    &Tensor::from_vec(vec![r as f32 + step as f32, 1.0]),
                );
                rec.record_replicated(step, "b", &Tensor::scalar(value));
            }
            rec.finish()
        })
        .collect();
    Trace { ranks }
}

/// A dump of `trace` in format version 1.
fn dump(trace: &Trace, mode: DumpMode) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_trace(dir.path(), trace, mode).unwrap();
    dir
}

/// The snapshot of the version 2 golden files.
fn golden_environment() -> Environment {
    [
        ("NCCL_ALGO", "Ring"),
        ("detcheck.kernel", "baseline"),
        ("launcher", "threads"),
    ]
    .into_iter()
    .collect()
}

/// A dump of `trace` in format version 2, with `environment` and `run_id` in every file.
fn dump_v2(
    trace: &Trace,
    mode: DumpMode,
    environment: &Environment,
    run_id: RunId,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_trace_v2(dir.path(), trace, mode, environment, run_id).unwrap();
    dir
}

fn compare(a: &Path, b: &Path) -> Comparison {
    compare_dumps(
        a,
        b,
        &CompareOptions {
            max_rows: 10,
            map: true,
        },
    )
    .unwrap()
}

#[test]
fn the_bytes_of_a_dump_do_not_change() {
    // Golden: the md5 of rank 0's file of a fixed trace, in both modes. A change here is a format
    // change: bump the version and update docs/trace-format.md.
    for (mode, expected_len, expected_md5) in [
        (DumpMode::Md5, 274, "ef54ec6d0b90f97e344600f48fde9e16"),
        (DumpMode::Stats, 530, "ce6b36d48d4194a3abd838bbb4fdaf28"),
    ] {
        let dir = dump(&trace(2, 2, 0.5), mode);
        let bytes = std::fs::read(trace_path(dir.path(), 0)).unwrap();
        assert_eq!(bytes.len(), expected_len, "{mode}");
        assert_eq!(
            crate::value::digest::Md5Digest::of_bytes(&bytes).to_string(),
            expected_md5,
            "{mode}"
        );
    }
}

#[test]
fn the_bytes_of_a_current_version_dump_do_not_change() {
    // Golden: the md5 of rank 0's file of the trace of `the_bytes_of_a_dump_do_not_change`, in
    // the current version (3), with a fixed snapshot and run id. A change here is a format change: bump the
    // version and update docs/trace-format.md (and scripts/dctrace.py).
    let run_id: RunId = "000102030405060708090a0b0c0d0e0f".parse().unwrap();
    for (mode, expected_len, expected_md5) in [
        (DumpMode::Md5, 441, "cae243e4a4c63eb2cdfa787b5f240b04"),
        (DumpMode::Stats, 697, "40f6689979d1f45edfff972144cda062"),
    ] {
        let dir = dump_v2(&trace(2, 2, 0.5), mode, &golden_environment(), run_id);
        let bytes = std::fs::read(trace_path(dir.path(), 0)).unwrap();
        assert_eq!(
            (
                bytes.len(),
                crate::value::digest::Md5Digest::of_bytes(&bytes).to_string()
            ),
            (expected_len, expected_md5.to_owned()),
            "{mode}"
        );
    }
}

#[test]
fn a_dump_reads_back_as_written() {
    let t = trace(3, 4, 0.5);
    let dumps = [DumpMode::Md5, DumpMode::Stats]
        .into_iter()
        .flat_map(|mode| {
            [
                (mode, dump(&t, mode)),
                (
                    mode,
                    dump_v2(&t, mode, &golden_environment(), RunId::of("x")),
                ),
            ]
        });
    for (mode, dir) in dumps {
        let d = open_dump(dir.path()).unwrap();
        assert_eq!(d.world_size(), 3);
        let mut src = d.open_rank(1).unwrap();
        let mut batch = Batch::default();
        let mut n = 0;
        while let Some(step) = src.next_step(&mut batch).unwrap() {
            for (i, e) in batch.entries.iter().enumerate() {
                let r = &t.ranks[1].records[n];
                assert_eq!((e.step, e.seq), (r.step, r.seq));
                assert_eq!(step, r.step);
                assert_eq!(src.names()[e.name as usize], r.name);
                assert_eq!(e.digest.bytes, r.md5.0);
                assert_eq!(e.replicated, r.replicated);
                assert_eq!(batch.stats(i), mode.has_stats().then_some(&r.stats));
                n += 1;
            }
        }
        assert_eq!(n, t.ranks[1].records.len());
        let same = compare(dir.path(), dir.path());
        assert!(same.is_identical());
        assert_eq!(same.num_compared, 3 * 4 * 2);
    }
}

#[test]
fn damaged_version_1_files_are_rejected_naming_the_file() {
    let dir = dump(&trace(1, 3, 0.5), DumpMode::Stats);
    let path = trace_path(dir.path(), 0);
    let good = std::fs::read(&path).unwrap();
    let reject = |bytes: &[u8], expect: &str| {
        std::fs::write(&path, bytes).unwrap();
        let err = compare_dumps(dir.path(), dir.path(), &CompareOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("rank0.dctrace"), "{err}");
        assert!(err.contains(expect), "{expect:?} not in {err}");
    };
    reject(&good[..good.len() - 1], "truncated or incomplete trace");
    reject(&good[..good.len() / 2], "truncated or incomplete trace");
    reject(&good[..10], "the file ends inside the header");
    let mut bad = good.clone();
    bad[0] = b'X';
    reject(&bad, "not a detcheck trace");
    // A version 1 file whose version byte says 2 fails version 2's header checksum.
    let mut bad = good.clone();
    bad[8] = 2;
    reject(
        &bad,
        "corrupt trace at byte 0: the header's checksum does not match",
    );
    let mut bad = good.clone();
    bad[8] = 9;
    reject(
        &bad,
        "the header says version 9, but its checksum does not match",
    );
    // A record count that disagrees with the footer.
    let mut bad = good.clone();
    let footer = bad.len() - format::FOOTER_LEN_V1;
    bad[footer + 8] += 1;
    reject(&bad, "the footer counts 7 records");
    // An unknown tag in the middle.
    let mut bad = good.clone();
    bad[format::HEADER_LEN_V1] = b'?';
    reject(&bad, "unknown entry tag 0x3f");
    std::fs::write(&path, &good).unwrap();
    assert!(compare(dir.path(), dir.path()).is_identical());
}

#[test]
fn folders_must_hold_one_whole_dump() {
    let dir = dump(&trace(3, 1, 0.5), DumpMode::Stats);
    std::fs::remove_file(trace_path(dir.path(), 1)).unwrap();
    let err = open_dump(dir.path()).unwrap_err().to_string();
    assert!(err.contains("rank1.dctrace is missing"), "{err}");
    let other = dump(&trace(2, 1, 0.5), DumpMode::Md5);
    std::fs::copy(trace_path(other.path(), 1), trace_path(dir.path(), 1)).unwrap();
    let err = open_dump(dir.path()).unwrap_err().to_string();
    assert!(err.contains("files of different dumps are mixed"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let err = open_dump(empty.path()).unwrap_err().to_string();
    assert!(err.contains("holds no dump"), "{err}");
}

#[test]
fn a_writer_rejects_out_of_order_steps_and_leaves_nothing_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = TraceWriter::create(dir.path(), 0, 1, DumpMode::Stats).unwrap();
    w.record(3, "x", &Tensor::scalar(1.0f32)).unwrap();
    let err = w.record(2, "x", &Tensor::scalar(1.0f32)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "record `x` of step 2 comes after step 3: records must be written in step order"
    );
    drop(w);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let err = TraceWriter::create(dir.path(), 2, 2, DumpMode::Md5).unwrap_err();
    assert!(err.to_string().contains("rank 2 does not fit world size 2"));
}

#[test]
fn the_first_divergence_is_earliest_step_then_seq_then_rank() {
    let a = trace(3, 3, 0.5);
    let mut b = a.clone();
    // rank 2 differs at step 1 seq 1, rank 1 at step 1 seq 1 too, rank 0 at step 2 seq 0.
    for (rank, step, seq) in [(2usize, 1u64, 1u32), (1, 1, 1), (0, 2, 0)] {
        let r = b.ranks[rank]
            .records
            .iter_mut()
            .find(|r| r.step == step && r.seq == seq)
            .unwrap();
        r.md5.0[0] ^= 1;
    }
    let (da, db) = (dump(&a, DumpMode::Md5), dump(&b, DumpMode::Md5));
    let cmp = compare(da.path(), db.path());
    assert_eq!(cmp.num_differing, 3);
    let first = cmp.first.clone().unwrap();
    assert_eq!((first.step, first.seq, first.rank), (1, 1, 1));
    assert_eq!(first.to_string(), "step 1 rank 1 seq 1 `b`: md5 differs");
    let keys: Vec<_> = cmp.rows.iter().map(|r| (r.step, r.seq, r.rank)).collect();
    assert_eq!(keys, [(1, 1, 1), (1, 1, 2), (2, 0, 0)]);
    let map = cmp.map.unwrap();
    assert_eq!(map.steps(), [0, 1, 2]);
    // Tensors are numbered in the order they are found: rank 0 first.
    assert_eq!(map.tensors(), ["a", "b"]);
    assert_eq!(map.cell(1, 1), MapCell::Diverged(1));
    assert_eq!(map.cell(0, 1), MapCell::Identical);
    assert_eq!(map.cell(0, 2), MapCell::Diverged(0));
}

#[test]
fn records_are_matched_by_name_and_occurrence() {
    let a = trace(1, 1, 0.5);
    let mut b = a.clone();
    // B records an extra tensor first: everything after it shifts by one seq, and still matches.
    let mut extra = b.ranks[0].records[0].clone();
    extra.name = "extra".into();
    b.ranks[0].records.insert(0, extra);
    for (i, r) in b.ranks[0].records.iter_mut().enumerate() {
        r.seq = i as u32;
    }
    let (da, db) = (dump(&a, DumpMode::Stats), dump(&b, DumpMode::Stats));
    let cmp = compare(da.path(), db.path());
    assert_eq!(cmp.num_differing, 1, "{:?}", cmp.rows);
    assert_eq!(
        cmp.first.as_ref().unwrap().difference,
        Difference::OnlyRight
    );
    assert!(
        cmp.notes
            .iter()
            .any(|n| n.contains("1 records are only in B")),
        "{:?}",
        cmp.notes
    );
}

#[test]
fn different_world_sizes_and_steps_are_explained() {
    let (da, db) = (
        dump(&trace(3, 4, 0.5), DumpMode::Md5),
        dump(&trace(2, 2, 0.5), DumpMode::Stats),
    );
    let cmp = compare(da.path(), db.path());
    assert!(!cmp.is_identical());
    let notes = cmp.notes.join("\n");
    assert!(
        notes.contains("A has 3 ranks and B has 2; ranks 2..=2 are only in A"),
        "{notes}"
    );
    assert!(
        notes.contains("ranks 0..=1: steps 2..=3 are only in A"),
        "{notes}"
    );
    assert!(notes.contains("A holds no statistics"), "{notes}");
}

#[test]
fn full_mode_writes_safetensors_and_compare_measures_the_difference() {
    let write = |values: Vec<f32>| {
        let dir = tempfile::tempdir().unwrap();
        let mut w = TraceWriter::create(dir.path(), 0, 1, DumpMode::Full).unwrap();
        w.record(0, "x", &Tensor::from_vec(values)).unwrap();
        w.record(1, "y", &Tensor::scalar(7i64)).unwrap();
        w.finish().unwrap();
        dir
    };
    let a = write(vec![1.0, 2.0, 3.0, 4.0]);
    let b = write(vec![1.0, 2.0, 3.003, 4.1]);
    assert!(tensor_path(a.path(), 0, 0).is_file());
    let cmp = compare(a.path(), b.path());
    assert_eq!(cmp.num_differing, 1);
    let m = cmp
        .first
        .unwrap()
        .metrics
        .expect("full tensors on both sides");
    assert!((m.max_abs_err - 0.1).abs() < 1e-6, "{m:?}");
    assert!((m.max_rel_err - 0.1 / 4.1).abs() < 1e-6, "{m:?}");
    assert!(m.cosine > 0.999 && m.cosine < 1.0, "{m:?}");
    assert_eq!((m.within_1e3, m.within_5e3), (0.75, 0.75));
    // A tensor file that is damaged is an error naming it.
    std::fs::write(tensor_path(b.path(), 0, 0), b"garbage").unwrap();
    let err = compare_dumps(a.path(), b.path(), &CompareOptions::default()).unwrap_err();
    assert!(err.to_string().contains("step0.safetensors"), "{err}");
}

#[test]
fn views_and_new_dtypes_dump_as_tensors_do() {
    use crate::value::tensor::TensorView;
    use half::{bf16, f16};
    // Every dtype but f32, f64, i64 and u8 (the first ones, recorded everywhere else), then f32
    // as a scalar; c128 last, as safetensors has no complex128 (full mode refuses it, below).
    let tensors = |last_f16: f32, mode: DumpMode| {
        let mut all = vec![
            Tensor::new(
                vec![2, 2],
                TensorData::F16(vec![
                    f16::from_f32(1.5),
                    f16::NAN,
                    f16::from_bits(1),
                    f16::from_f32(last_f16),
                ]),
            )
            .unwrap(),
            Tensor::from_vec(vec![
                bf16::from_f32(-2.0),
                bf16::INFINITY,
                bf16::from_bits(0x8000),
            ]),
            Tensor::from_vec(vec![i32::MIN, 0, 7]),
            Tensor::from_vec(vec![true, false]),
            Tensor::scalar(0.25f32),
            Tensor::from_vec(vec![i8::MIN, -1, 7]),
            Tensor::new(vec![1, 2], TensorData::I16(vec![i16::MIN, 300])).unwrap(),
            Tensor::from_vec(vec![u16::MAX, 0]),
            Tensor::new(vec![3], TensorData::F8E4M3(vec![0x7e, 0x7f, 0x80])).unwrap(),
            Tensor::new(vec![2], TensorData::F8E5M2(vec![0x7c, 0x01])).unwrap(),
            Tensor::from_vec(vec![[1.5f32, -2.0], [f32::NAN, -0.0]]),
        ];
        if mode != DumpMode::Full {
            all.push(Tensor::from_vec(vec![[f64::INFINITY, 0.5]]));
        }
        all
    };
    let bytes_of = |t: &Tensor| {
        let mut bytes = Vec::new();
        t.for_each_canonical_chunk(|c| bytes.extend_from_slice(c));
        bytes
    };
    let write = |mode: DumpMode, last_f16: f32, by_view: bool| {
        let dir = tempfile::tempdir().unwrap();
        let mut w = TraceWriter::create(dir.path(), 0, 1, mode).unwrap();
        for step in 0..2 {
            for (i, t) in tensors(last_f16, mode).iter().enumerate() {
                let name = format!("t{i}");
                let bytes = bytes_of(t);
                let view = TensorView::new(t.dtype(), t.shape(), &bytes).unwrap();
                match (by_view, i % 2 == 0) {
                    (false, false) => w.record(step, &name, t),
                    (false, true) => w.record_replicated(step, &name, t),
                    (true, false) => w.record_view(step, &name, view),
                    (true, true) => w.record_replicated_view(step, &name, view),
                }
                .unwrap();
            }
        }
        w.finish().unwrap();
        dir
    };
    for mode in [DumpMode::Md5, DumpMode::Stats, DumpMode::Full] {
        let (a, b) = (write(mode, 3.0, false), write(mode, 3.0, true));
        let read = |path: std::path::PathBuf| std::fs::read(path).unwrap();
        assert_eq!(
            read(trace_path(a.path(), 0)),
            read(trace_path(b.path(), 0)),
            "{mode}: a view writes the bytes its tensor writes"
        );
        if mode == DumpMode::Full {
            assert_eq!(
                read(tensor_path(a.path(), 0, 1)),
                read(tensor_path(b.path(), 0, 1))
            );
        }
        let d = open_dump(b.path()).unwrap();
        let mut src = d.open_rank(0).unwrap();
        let mut batch = Batch::default();
        while src.next_step(&mut batch).unwrap().is_some() {}
        let layouts: Vec<String> = src.layouts().iter().map(Layout::describe).collect();
        let mut want = vec![
            "f16[2,2]",
            "bf16[3]",
            "i32[3]",
            "bool[2]",
            "f32[]",
            "i8[3]",
            "i16[1,2]",
            "u16[2]",
            "f8e4m3fn[3]",
            "f8e5m2[2]",
            "c64[2]",
        ];
        if mode != DumpMode::Full {
            want.push("c128[1]");
        }
        assert_eq!(layouts, want, "{mode}");
        // Every record reads back with its md5 and, with stats, the stats of its tensor.
        let mut src = d.open_rank(0).unwrap();
        let mut batch = Batch::default();
        assert!(src.next_step(&mut batch).unwrap().is_some());
        let want = tensors(3.0, mode);
        assert_eq!(batch.entries.len(), want.len());
        for (i, (entry, t)) in batch.entries.iter().zip(&want).enumerate() {
            let md5 = crate::value::digest::Md5Digest::of_tensor(t);
            assert_eq!(entry.digest.bytes, md5.0, "{mode} {t:?}");
            let stats = mode
                .has_stats()
                .then(|| crate::value::digest::Stats::of_tensor(t));
            assert_eq!(batch.stats(i), stats.as_ref(), "{mode} {t:?}");
        }
        assert!(compare(a.path(), b.path()).is_identical(), "{mode}");
    }
    // Full mode cannot hold a c128 tensor: a clear error naming the tensor and the dtype.
    let dir = tempfile::tempdir().unwrap();
    let mut w = TraceWriter::create(dir.path(), 0, 1, DumpMode::Full).unwrap();
    w.record(0, "z", &Tensor::from_vec(vec![[1.0f64, 2.0]]))
        .unwrap();
    let err = w
        .record(1, "z", &Tensor::from_vec(vec![[1.0f64, 2.0]]))
        .and_then(|()| w.finish().map(drop))
        .unwrap_err();
    assert!(
        matches!(&err, DumpError::Safetensors { detail, .. }
            if detail.starts_with("tensor `00000:z`: dtype c128 has no safetensors dtype")),
        "{err}"
    );
    // Full tensors of a new dtype are read back for the metrics of a difference.
    let (a, c) = (
        write(DumpMode::Full, 3.0, true),
        write(DumpMode::Full, 3.5, true),
    );
    let cmp = compare(a.path(), c.path());
    assert_eq!(cmp.num_differing, 2, "t0 at both steps");
    let m = cmp
        .first
        .unwrap()
        .metrics
        .expect("full tensors on both sides");
    assert_eq!(m.max_abs_err, 0.5, "{m:?}");
}

#[test]
fn overflows_are_found_in_each_dump() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = TraceWriter::create(dir.path(), 0, 1, DumpMode::Stats).unwrap();
    w.record(0, "ok", &Tensor::scalar(1.0f32)).unwrap();
    w.record(1, "ok", &Tensor::scalar(1.0f32)).unwrap();
    // 65504 is fp16's limit, not f32's: only f32::MAX saturates an f32 record.
    w.record(1, "big", &Tensor::from_vec(vec![65504.0f32, 1.0]))
        .unwrap();
    w.record(1, "idx", &Tensor::from_vec(vec![1_281_166i64]))
        .unwrap();
    w.record(1, "sat", &Tensor::from_vec(vec![f32::MAX, 1.0]))
        .unwrap();
    w.record(2, "nan", &Tensor::scalar(f32::NAN)).unwrap();
    w.finish().unwrap();
    let cmp = compare(dir.path(), dir.path());
    let o = cmp.overflow[0].clone().unwrap();
    assert_eq!((o.step, o.name.as_str()), (1, "sat"));
    assert_eq!(cmp.overflow[0], cmp.overflow[1]);
}

/// Writes an msprobe dump: `step{s}/rank{r}/dump.json` with two calls per step.
fn msprobe(root: &Path, world: u32, steps: u64, md5_of: impl Fn(u64, u32, usize) -> String) {
    for step in 0..steps {
        for rank in 0..world {
            let dir = root.join(format!("step{step}")).join(format!("rank{rank}"));
            std::fs::create_dir_all(&dir).unwrap();
            let tensor = |i: usize| {
                format!(
                    r#"{{"type": "torch.Tensor", "dtype": "torch.float16", "shape": [2, 3],
                        "Max": 1.5, "Min": -0.5, "Mean": 0.25, "Norm": 2.0,
                        "requires_grad": false, "md5": "{}"}}"#,
                    md5_of(step, rank, i)
                )
            };
            let json = format!(
                r#"{{"task": "statistics", "level": "mix", "framework": "pytorch",
                    "dump_data_dir": null, "data": {{
                    "Module.conv1.Conv2d.forward.0": {{"input_args": [{}], "input_kwargs": {{}},
                        "output": [{}]}},
                    "Functional.relu.0.forward": {{"input_args": [{}],
                        "input_kwargs": {{"inplace": {{"type": "bool", "value": false}}}},
                        "output": [{}]}}}}}}"#,
                tensor(0),
                tensor(1),
                tensor(2),
                tensor(3)
            );
            std::fs::write(dir.join("dump.json"), json).unwrap();
        }
    }
}

#[test]
fn msprobe_dumps_are_compared_in_call_order() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    msprobe(a.path(), 2, 2, |_, _, i| format!("{:08x}", i));
    // B: rank 1 differs from step 1 on, at the relu input (call 2); rank 0 at step 1 output.
    msprobe(b.path(), 2, 2, |s, r, i| {
        let differs = s == 1 && ((r == 1 && i >= 2) || (r == 0 && i == 3));
        format!("{:08x}", i + if differs { 100 } else { 0 })
    });
    let cmp = compare(a.path(), b.path());
    assert_eq!(cmp.world_sizes, (2, 2));
    assert_eq!(cmp.num_compared, 2 * 2 * 4);
    assert_eq!(cmp.num_differing, 3);
    let first = cmp.first.clone().unwrap();
    assert_eq!(
        first.to_string(),
        "step 1 rank 1 seq 2 `Functional.relu.0.forward.input.0`: md5 differs"
    );
    assert_eq!(first.left.unwrap().layout, "float16[2,3]");
    assert!(cmp.left.starts_with("msprobe dump at"));
}

#[test]
fn msprobe_statistics_mode_compares_statistics() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    msprobe(a.path(), 1, 1, |_, _, _| String::new());
    msprobe(b.path(), 1, 1, |_, _, _| String::new());
    // Statistics mode: no md5 field. B's third tensor has another Max.
    for dir in [a.path(), b.path()] {
        let path = dir.join("step0/rank0/dump.json");
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace(r#", "md5": """#, "");
        std::fs::write(&path, text).unwrap();
    }
    let path = b.path().join("step0/rank0/dump.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let third = text.match_indices(r#""Max": 1.5"#).nth(2).unwrap().0;
    let text = format!("{}\"Max\": 9.5{}", &text[..third], &text[third + 10..]);
    std::fs::write(&path, text).unwrap();
    let cmp = compare(a.path(), b.path());
    assert_eq!(cmp.num_differing, 1);
    let first = cmp.first.unwrap();
    assert_eq!(first.difference, Difference::Stats);
    assert_eq!(first.name, "Functional.relu.0.forward.input.0");
    assert_eq!(first.right.unwrap().digest, None);
}

#[test]
fn a_failed_run_leaves_no_dump() {
    let spec = serde_json::from_str(
        r#"{"kind": "collective", "world_size": 3, "steps": 2, "seed": 1, "reduction": "ring",
            "deterministic_comm": true, "expect": "identical",
            "params": {"elements": 8, "fault": {"rank": 2, "step": 1, "kind": "error"}}}"#,
    )
    .unwrap();
    let scenario = crate::scenario::KindRegistry::builtin()
        .build(spec, Path::new("inline.json"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = crate::run::CheckOptions {
        deadline: std::time::Duration::from_secs(2),
        ..crate::run::CheckOptions::default()
    };
    let err = dump_scenario(
        &scenario,
        dir.path(),
        DumpMode::Full,
        &options,
        None,
        &RunPlan::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("rank 2 failed"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_bad_msprobe_field_is_named() {
    let a = tempfile::tempdir().unwrap();
    msprobe(a.path(), 1, 1, |_, _, _| "zz".into());
    let err = compare_dumps(a.path(), a.path(), &CompareOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "dump.json: field `data.Module.conv1.Conv2d.forward.0.input_args.0.md5`: expected up \
             to 32 hex digits"
        ),
        "{err}"
    );
    std::fs::write(a.path().join("step0/rank0/dump.json"), r#"{"data": 3}"#).unwrap();
    let err = compare_dumps(a.path(), a.path(), &CompareOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("field `data`"), "{err}");
}

#[test]
fn a_scenario_dump_matches_its_trace_in_memory() {
    let spec = serde_json::from_str(
        r#"{"kind": "collective", "world_size": 2, "steps": 2, "seed": 1, "reduction": "ring",
            "deterministic_comm": true, "expect": "identical", "params": {"elements": 64}}"#,
    )
    .unwrap();
    let scenario = crate::scenario::KindRegistry::builtin()
        .build(spec, Path::new("inline.json"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d");
    let trace = dump_scenario(
        &scenario,
        &out,
        DumpMode::Full,
        &crate::run::CheckOptions::default(),
        None,
        &RunPlan::default(),
    )
    .unwrap();
    let other = dump(&trace, DumpMode::Stats);
    assert!(compare(&out, other.path()).is_identical());
    assert!(tensor_path(&out, 1, 1).is_file());
    let err = dump_scenario(
        &scenario,
        &out,
        DumpMode::Md5,
        &crate::run::CheckOptions::default(),
        None,
        &RunPlan::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("already holds a dump"), "{err}");
}

/// A small full-mode dump of format version 2 (2 steps, 2 tensors each, a small snapshot).
fn small_full_dump(run_id: RunId, scale: f32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut w = TraceWriter::create(dir.path(), 0, 1, DumpMode::Full).unwrap();
    w.replace_environment(golden_environment());
    w.set_run_id(run_id);
    for step in 0..2u64 {
        let x = step as f32 * scale;
        w.record(step, "x", &Tensor::from_vec(vec![x, 2.0, f32::NAN]))
            .unwrap();
        w.record_replicated(step, "loss", &Tensor::scalar(x + 0.5))
            .unwrap();
    }
    w.finish().unwrap();
    dir
}

/// The offsets at which changing one byte of `file` (XOR with each of `masks`) goes unreported:
/// a compare of its dump with itself succeeds, or fails without naming the file and an offset
/// inside it as corrupt.
fn unreported_changes(dir: &Path, file: &Path, masks: &[u8]) -> Vec<(usize, u8, String)> {
    let good = std::fs::read(file).unwrap();
    let mut missed = Vec::new();
    for at in 0..good.len() {
        for &mask in masks {
            let mut bad = good.clone();
            bad[at] ^= mask;
            std::fs::write(file, &bad).unwrap();
            match compare_dumps(dir, dir, &CompareOptions::default()) {
                Err(DumpError::Corrupt { path, offset, .. })
                    if path == file && offset < good.len() as u64 => {}
                Err(e) => missed.push((at, mask, e.to_string())),
                Ok(_) => missed.push((at, mask, "read as a valid trace".to_owned())),
            }
        }
    }
    std::fs::write(file, &good).unwrap();
    missed
}

/// Any one damaged byte of a version 2 file, wherever it is (header, blocks, statistics, flags,
/// reserved bytes, the snapshot, the tensor-file list, the footer), is reported as corruption
/// naming the file and a byte offset; the same sweep over a version 1 file (no checksums) finds
/// changes that pass unnoticed, so this test would catch a return to unchecked files.
#[test]
fn every_single_byte_change_of_a_version_2_file_is_reported_with_its_offset() {
    let dir = small_full_dump(RunId::of("flip"), 1.0);
    let file = trace_path(dir.path(), 0);
    let len = std::fs::metadata(&file).unwrap().len();
    let missed = unreported_changes(dir.path(), &file, &[0x01, 0x80, 0xff]);
    assert!(missed.is_empty(), "{len} bytes; unreported: {missed:?}");
    assert!(compare(dir.path(), dir.path()).is_identical());

    let v1 = dump(&trace(1, 2, 0.5), DumpMode::Stats);
    let file = trace_path(v1.path(), 0);
    let missed = unreported_changes(v1.path(), &file, &[0x01]);
    assert!(
        missed
            .iter()
            .any(|(_, _, why)| why == "read as a valid trace"),
        "version 1 files have no checksums, so some changes must pass: {missed:?}"
    );
}

#[test]
fn a_newer_format_version_is_named_as_such() {
    let dir = dump_v2(
        &trace(1, 1, 0.5),
        DumpMode::Md5,
        &golden_environment(),
        RunId::UNKNOWN,
    );
    let path = trace_path(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = 4;
    let crc = format::crc32(&[&bytes[..60]]);
    bytes[60..64].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let err = open_dump(dir.path()).unwrap_err().to_string();
    assert!(
        err.ends_with(
            "rank0.dctrace: trace format version 4 is not supported (this detcheck reads \
             versions 1 to 3)"
        ),
        "{err}"
    );
}

#[test]
fn listed_tensor_files_that_are_deleted_truncated_or_changed_are_named() {
    let (a, b) = (
        small_full_dump(RunId::of("a"), 1.0),
        small_full_dump(RunId::of("b"), 3.0),
    );
    assert_eq!(
        compare(a.path(), b.path()).num_differing,
        2,
        "x and loss at step 1"
    );
    let step1 = tensor_path(b.path(), 0, 1);
    let good = std::fs::read(&step1).unwrap();
    let error = || {
        compare_dumps(a.path(), b.path(), &CompareOptions::default())
            .unwrap_err()
            .to_string()
    };
    std::fs::remove_file(&step1).unwrap();
    let err = error();
    assert!(
        err.contains("rank0/step1.safetensors: missing, but"),
        "{err}"
    );
    assert!(err.contains("rank0.dctrace lists it"), "{err}");
    std::fs::write(&step1, &good[..good.len() - 3]).unwrap();
    let err = error();
    assert!(
        err.contains("step1.safetensors: ") && err.contains("the tensor file is truncated"),
        "{err}"
    );
    // The same size, one byte changed: its md5 is checked when the compare reads it.
    let mut changed = good.clone();
    *changed.last_mut().unwrap() ^= 1;
    std::fs::write(&step1, &changed).unwrap();
    let err = error();
    assert!(
        err.contains("step1.safetensors: corrupt: its md5 is"),
        "{err}"
    );
    std::fs::write(&step1, &good).unwrap();
    assert_eq!(compare(a.path(), b.path()).num_differing, 2);
}

/// Issue 16 (black-box battery): a changed byte of a tensor file whose records compare
/// identical was never read, so the compare said "identical"; every listed file of a step is
/// checked when the step is read.
#[test]
fn a_changed_tensor_file_of_an_identical_step_is_an_error_not_identical() {
    let a = small_full_dump(RunId::of("a"), 1.0);
    let b = small_full_dump(RunId::of("a"), 1.0);
    assert!(compare(a.path(), b.path()).is_identical());
    for step in 0..2 {
        let file = tensor_path(a.path(), 0, step);
        let good = std::fs::read(&file).unwrap();
        for at in [0, good.len() / 2, good.len() - 1] {
            let mut changed = good.clone();
            changed[at] ^= 0x10;
            std::fs::write(&file, &changed).unwrap();
            for (left, right) in [(a.path(), b.path()), (b.path(), a.path())] {
                let err = compare_dumps(left, right, &CompareOptions::default())
                    .unwrap_err()
                    .to_string();
                let named = format!("rank0/step{step}.safetensors: corrupt: its md5 is");
                assert!(err.contains(&named), "byte {at}: {err}");
            }
        }
        std::fs::write(&file, &good).unwrap();
    }
    assert!(compare(a.path(), b.path()).is_identical());
}

#[test]
fn rank_files_of_two_dumps_are_not_mixed() {
    let t = trace(2, 1, 0.5);
    let env = golden_environment();
    let a = dump_v2(&t, DumpMode::Stats, &env, RunId::of("run a"));
    let b = dump_v2(&t, DumpMode::Stats, &env, RunId::of("run b"));
    assert!(compare(a.path(), b.path()).is_identical());
    std::fs::copy(trace_path(b.path(), 1), trace_path(a.path(), 1)).unwrap();
    let err = open_dump(a.path()).unwrap_err().to_string();
    assert!(err.contains("files of different dumps are mixed"), "{err}");
    assert!(err.contains(&RunId::of("run b").to_string()), "{err}");
    // A version 1 file among version 2 files is another dump too.
    let v1 = dump(&t, DumpMode::Stats);
    std::fs::copy(trace_path(v1.path(), 0), trace_path(b.path(), 0)).unwrap();
    let err = open_dump(b.path()).unwrap_err().to_string();
    assert!(err.contains("files of different dumps are mixed"), "{err}");
}

#[test]
fn environment_snapshots_round_trip_and_their_differences_are_compared() {
    let t = trace(2, 1, 0.5);
    let left = golden_environment();
    let mut right = left.clone();
    right.set("NCCL_ALGO", "Tree");
    right.set("torch.version", "2.5.1");
    right.remove("launcher");
    let (a, b) = (
        dump_v2(&t, DumpMode::Md5, &left, RunId::of("a")),
        dump_v2(&t, DumpMode::Md5, &right, RunId::of("b")),
    );
    // Read back as written, by the engine and into a trace.
    let d = open_dump(b.path()).unwrap();
    assert_eq!(d.open_rank(1).unwrap().environment(), Some(&right));
    let loaded = crate::file::load_trace(b.path(), 2).unwrap();
    assert_eq!(loaded.ranks[0].environment.as_ref(), Some(&right));
    // Differences, grouped over ranks; they are not divergences.
    let cmp = compare(a.path(), b.path());
    assert!(cmp.is_identical());
    let lines: Vec<String> = cmp.environment.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "NCCL_ALGO: Ring -> Tree (ranks 0..=1)",
            "launcher: threads -> (unset) (ranks 0..=1)",
            "torch.version: (unset) -> 2.5.1 (ranks 0..=1)",
        ]
    );
    assert!(compare(a.path(), a.path()).environment.is_empty());
    // A side without snapshots (version 1) is named in a note, not compared.
    let v1 = dump(&t, DumpMode::Md5);
    let cmp = compare(v1.path(), b.path());
    assert!(cmp.environment.is_empty());
    assert!(
        cmp.notes.iter().any(|n| n.starts_with(
            "A holds no environment snapshot (its files are of trace format version 1"
        )),
        "{:?}",
        cmp.notes
    );
    // A writer's own snapshot: this process's, plus what it adds.
    let dir = tempfile::tempdir().unwrap();
    let mut w = TraceWriter::create(dir.path(), 0, 1, DumpMode::Md5).unwrap();
    w.set_environment("torch.cuda", "12.4").unwrap();
    assert!(w.set_environment("", "x").is_err());
    w.record(0, "x", &Tensor::scalar(1.0f32)).unwrap();
    w.set_environment("late", "after the first record").unwrap();
    let handle = w.environment_handle();
    handle.set("from.another.thread", "yes").unwrap();
    assert!(handle.set("", "x").is_err());
    let expected = w.environment();
    assert_eq!(expected.get("from.another.thread"), Some("yes"));
    assert_eq!(
        expected.get("detcheck.version"),
        Some(env!("CARGO_PKG_VERSION"))
    );
    w.finish().unwrap();
    let d = open_dump(dir.path()).unwrap();
    let src = d.open_rank(0).unwrap();
    assert_eq!(src.environment(), Some(&expected));
    assert_eq!(expected.get("late"), Some("after the first record"));
}

#[test]
fn msprobe_dumps_are_noted_to_have_no_snapshot() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    msprobe(a.path(), 1, 1, |_, _, i| format!("{:08x}", i));
    msprobe(b.path(), 1, 1, |_, _, i| format!("{:08x}", i));
    let cmp = compare(a.path(), b.path());
    assert!(cmp.environment.is_empty());
    for side in ["A", "B"] {
        assert!(
            cmp.notes.iter().any(|n| n.starts_with(&format!(
                "{side} holds no environment snapshot (msprobe dumps have no environment snapshot)"
            ))),
            "{:?}",
            cmp.notes
        );
    }
}

/// A footer whose checksum holds but whose section offsets are near 2^64 (a crafted file) is
/// corrupt, not an overflow: the offsets are added without wrapping.
#[test]
fn footer_offsets_near_the_end_of_u64_are_corrupt_not_an_overflow() {
    let dir = dump_v2(
        &trace(1, 2, 1.0),
        DumpMode::Stats,
        &golden_environment(),
        RunId::of("offsets"),
    );
    let path = trace_path(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - format::FOOTER_LEN;
    for (environment, tensor_files) in [(u64::MAX - 8, 64), (64, u64::MAX - 8)] {
        let mut footer = format::decode_footer(&bytes[at..]).unwrap();
        footer.environment = environment;
        footer.tensor_files = tensor_files;
        bytes[at..].copy_from_slice(&format::encode_footer(&footer));
        std::fs::write(&path, &bytes).unwrap();
        let err = crate::file::open_dump(dir.path())
            .and_then(|dump| dump.open_rank(0).map(|_| ()))
            .unwrap_err();
        assert!(
            matches!(err, DumpError::Corrupt { .. }),
            "{environment} {tensor_files}: {err}"
        );
    }
}

/// The canonical bytes of an f32 tensor, written out by hand.
fn f32_bytes(tensor: &Tensor) -> Vec<u8> {
    let values = tensor.values::<f32>().expect("an f32 tensor");
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A trace of format version 2 (plain md5) against one of version 3 (the tree digest): records
/// up to 4 KiB compare (both digests are plain md5 there); a larger one is an error naming both
/// kinds, never "differs".
#[test]
fn version_2_and_3_traces_compare_up_to_one_chunk_and_refuse_beyond() {
    use crate::value::DigestKind;
    let old_and_new = |len: usize| {
        let tensor = Tensor::from_vec((0..len).map(|i| i as f32).collect::<Vec<f32>>());
        let (old, new) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut recorder = Recorder::new(0, RecordLevel::Digest);
        recorder.record(0, "x", &tensor);
        let mut trace = recorder.finish();
        let mut w = crate::file::TraceWriter::create(new.path(), 0, 1, DumpMode::Md5).unwrap();
        w.write_record(&trace.records[0], None).unwrap();
        w.finish().unwrap();
        trace.records[0].md5 = crate::value::Md5Digest::of_bytes(&f32_bytes(&tensor));
        let mut w = crate::file::TraceWriter::create_version(
            old.path(),
            0,
            1,
            DumpMode::Md5,
            format::VERSION_2,
        )
        .unwrap();
        w.write_record(&trace.records[0], None).unwrap();
        w.finish().unwrap();
        (old, new)
    };
    let (old, new) = old_and_new(1024);
    assert!(compare(old.path(), new.path()).is_identical());
    let (old, new) = old_and_new(1025);
    let options = CompareOptions {
        max_rows: 10,
        map: false,
    };
    let err = compare_dumps(old.path(), new.path(), &options).unwrap_err();
    assert!(
        matches!(
            &err,
            DumpError::MixedDigests { name, step: 0, rank: 0, left: DigestKind::Md5, right: DigestKind::Md5Tree4k } if name == "x"
        ),
        "{err}"
    );
    assert!(err.to_string().starts_with("cannot compare `x` (step 0, rank 0): A's records carry md5 digests and B's md5-tree-4k"), "{err}");
}

/// `TraceWriter::record_digested` (a digest computed elsewhere, as a GPU's) writes the record
/// `record` writes for the same tensor, stats from `Stats::from_totals`; full mode and a capture
/// need the tensor and say so.
#[test]
fn records_digested_elsewhere_are_the_records_of_their_tensors() {
    use crate::file::Digested;
    use crate::value::{tree_digest, Totals};
    let tensor = Tensor::from_vec((0..3000).map(|i| i as f32 - 7.5).collect::<Vec<f32>>());
    let bytes = f32_bytes(&tensor);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut w = crate::file::TraceWriter::create(a.path(), 0, 1, DumpMode::Md5).unwrap();
    w.record(0, "x", &tensor).unwrap();
    w.record_replicated(1, "x", &tensor).unwrap();
    w.finish().unwrap();
    let mut w = crate::file::TraceWriter::create(b.path(), 0, 1, DumpMode::Md5).unwrap();
    assert!(!w.needs_tensor(0, "x"));
    let stats = Stats::from_totals(
        3000,
        Totals {
            max: 2991.5,
            min: -7.5,
            sum: 0.0,
            sum_sq: 0.0,
            nan: 0,
            pos_inf: 0,
            neg_inf: 0,
        },
    );
    for (step, replicated) in [(0, false), (1, true)] {
        let digested = Digested {
            dtype: crate::value::DType::F32,
            shape: &[3000],
            digest: tree_digest(&bytes),
            stats: Some(stats),
            replicated,
        };
        w.record_digested(step, "x", &digested).unwrap();
    }
    w.finish().unwrap();
    assert!(compare(a.path(), b.path()).is_identical());

    let full = tempfile::tempdir().unwrap();
    let mut w = crate::file::TraceWriter::create(full.path(), 0, 1, DumpMode::Full).unwrap();
    assert!(w.needs_tensor(0, "x"));
    let digested = Digested {
        dtype: crate::value::DType::F32,
        shape: &[3000],
        digest: tree_digest(&bytes),
        stats: None,
        replicated: false,
    };
    let err = w.record_digested(0, "x", &digested).unwrap_err();
    assert!(
        matches!(&err, DumpError::MissingTensor { name } if name == "x"),
        "{err}"
    );
}

/// Rank `rank` of `world` writes rows of the global f32[4, 3] tensor `w` (element i = i + step,
/// or `changed` at rank 1's first element) as its shard, and a replicated `loss`.
fn sharded_dump(world: u32, changed: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for rank in 0..world {
        let mut w = TraceWriter::create(dir.path(), rank, world, DumpMode::Stats).unwrap();
        let rows = 4 / world as usize;
        for step in 0..2u64 {
            let first = rank as usize * rows;
            let values: Vec<f32> = (first * 3..(first + rows) * 3)
                .map(|i| {
                    if changed && rank == 1 && i == first * 3 {
                        -1.0
                    } else {
                        (i as u64 + step) as f32
                    }
                })
                .collect();
            let shard = Tensor::new(vec![rows, 3], crate::value::TensorData::F32(values)).unwrap();
            let placement = crate::value::Placement {
                global_shape: vec![4, 3],
                offset: vec![first as u64, 0],
                extent: vec![rows as u64, 3],
            };
            w.record_sharded(step, "w", &shard, &placement).unwrap();
            w.record_replicated(step, "loss", &Tensor::scalar(0.5f32))
                .unwrap();
        }
        w.finish().unwrap();
    }
    dir
}

#[test]
fn sharded_records_read_back_and_compare_across_world_sizes() {
    let (one, two) = (sharded_dump(1, false), sharded_dump(2, false));
    let (a, b) = (
        crate::file::load_trace(one.path(), 1).unwrap(),
        crate::file::load_trace(two.path(), 2).unwrap(),
    );
    let shard = b.ranks[1].records[0].shard.clone().unwrap();
    assert_eq!(
        (shard.placement.offset, shard.placement.extent),
        (vec![2, 0], vec![2, 3])
    );
    assert!(b.ranks[1].records[1].shard.is_none());
    let same = compare_traces(&a, &b, TraceView::RankZeroReplicated);
    // loss at 2 steps, the global `w` at 2 steps.
    assert_eq!((same.num_compared, same.num_differing), (4, 0), "{same:?}");
    let changed = crate::file::load_trace(sharded_dump(2, true).path(), 2).unwrap();
    let differ = compare_traces(&a, &changed, TraceView::RankZeroReplicated);
    assert_eq!(differ.num_differing, 2);
    let first = differ.first.unwrap();
    assert_eq!((first.step, first.name.as_str()), (0, "w"));
    assert_eq!(first.difference, Difference::Digest);
    // `replicas` never compares one rank's shard with another's.
    assert!(compare_traces(&b, &b, TraceView::Replicas).is_identical());
    // Repeat compares the local shards' tree digests as any record's.
    assert!(compare_traces(&b, &b, TraceView::All).is_identical());
}

#[test]
fn a_shard_entry_that_does_not_fit_is_rejected_naming_the_byte() {
    let dir = sharded_dump(2, false);
    let path = trace_path(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(2)
        .position(|w| w == [format::TAG_SHARD, 0])
        .unwrap();
    // The offset of dimension 0 (after the tag, digest and the global shape): 3 + 2 rows > 4.
    let offset_at = at + format::SHARD_LEN + 16;
    bytes[offset_at..offset_at + 8].copy_from_slice(&3u64.to_le_bytes());
    let block = format::HEADER_LEN;
    let len = u32::from_le_bytes(bytes[block + 4..block + 8].try_into().unwrap()) as usize;
    let payload = block + format::SECTION_LEN;
    let crc = format::crc32(&[&bytes[block..block + 12], &bytes[payload..payload + len]]);
    bytes[block + 12..block + 16].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let e = crate::file::load_trace(dir.path(), 2)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("corrupt trace at byte {at}"))
            && e.contains("offset 3 + extent 2 runs past the global size 4"),
        "{e}"
    );
}

#[test]
fn a_writer_refuses_a_placement_that_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = TraceWriter::create(dir.path(), 0, 2, DumpMode::Md5).unwrap();
    let placement = crate::value::Placement {
        global_shape: vec![4],
        offset: vec![2],
        extent: vec![3],
    };
    let e = w
        .record_sharded(0, "w", &Tensor::from_vec(vec![1.0f32; 3]), &placement)
        .unwrap_err();
    assert!(matches!(e, DumpError::Placement { .. }), "{e}");
    assert_eq!(w.num_records(), 0);
}
