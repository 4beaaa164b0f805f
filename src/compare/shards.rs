//! Sharded records across world sizes: the shards every rank of a run holds of one tensor are
//! put together, and the global tensors of two runs compared (the `world_sizes` check).
//!
//! A sharded record (one with a [`Shard`]: a DTensor's local shard, FSDP1's flat parameter) is
//! one rank's part of a global tensor. The records of one (step, name, occurrence) on every
//! rank of a run form a *group*: their placements are deduplicated (a replicated dimension of a
//! 2-D mesh gives several ranks the same box; the lowest rank's stands for them), must agree on
//! dtype and global shape, and must tile the global shape exactly (pairwise disjoint boxes whose
//! sizes add up to it). The group's digest is the sum of its shards' position digests
//! (`value/position.rs`), equal to the digest of the whole tensor whatever the world size; two
//! runs' groups are compared by dtype, global shape and that digest. [`put_together`] puts
//! captured shards together into the global tensor (a check's re-runs capture each rank's
//! shard: `diagnose/element.rs`), so the first differing element is named by its global index.
//!
//! A group that cannot be put together (a shard missing, overlapping boxes, ranks that disagree
//! on the global shape), or a sharded record whose other side is a whole record without a
//! position digest, is not a divergence: a note says why it was not compared. Guarantee:
//! bitwise, as the position digest. Determinism: groups are kept in `BTreeMap`s by (step, name,
//! occurrence), so the result is a function of the two traces. The `replicas` check never reads
//! this: one rank's shard is never compared with another's.

use crate::compare::{Comparison, Difference, Divergence, RecordSummary};
use crate::record::{Record, Trace};
use crate::value::position::{Placement, PositionDigest, Shard};
use crate::value::tensor::{DType, Tensor, TensorView};
use std::collections::BTreeMap;

/// A record's place among the records of its name in its step on its rank: (step, name, k).
type Key = (u64, String, u32);

/// The shards of one tensor in one run, put together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Combined {
    pub(crate) dtype: DType,
    pub(crate) global: Vec<u64>,
    pub(crate) digest: PositionDigest,
    /// Distinct shards (after dedupe).
    pub(crate) num_shards: usize,
    /// The lowest rank that holds a shard, and its record's seq.
    pub(crate) rank: u32,
    pub(crate) seq: u32,
}

impl Combined {
    fn summary(&self) -> RecordSummary {
        let dims: Vec<String> = self.global.iter().map(ToString::to_string).collect();
        RecordSummary {
            layout: format!(
                "{}[{}] (global, {} shard{})",
                self.dtype.name(),
                dims.join(","),
                self.num_shards,
                if self.num_shards == 1 { "" } else { "s" }
            ),
            digest: Some(format!("position {}", self.digest)),
            stats: None,
        }
    }
}

/// A shard's box in the global tensor: its offset and extent per dimension.
type ShardBox<'a> = (&'a [u64], &'a [u64]);

/// Puts the shards of one group together: `Err` says why they cannot be.
pub(crate) fn combine(members: &[&Record]) -> Result<Combined, String> {
    let Some(first) = members.first() else {
        return Err("no shard".into());
    };
    let first_shard = first.shard.as_ref().ok_or("a record without a shard")?;
    let global = first_shard.placement.global_shape.clone();
    // (offset, extent) -> the lowest rank holding that box, and its digest.
    let mut boxes: BTreeMap<ShardBox<'_>, (u32, PositionDigest)> = BTreeMap::new();
    let mut disagreeing: Option<(u32, u32)> = None;
    for r in members {
        let shard = r.shard.as_ref().ok_or("a record without a shard")?;
        if r.dtype != first.dtype || shard.placement.global_shape != global {
            return Err(format!(
                "ranks {} and {} disagree on its dtype or global shape ({} {:?} and {} {:?})",
                first.rank,
                r.rank,
                first.dtype.name(),
                global,
                r.dtype.name(),
                shard.placement.global_shape
            ));
        }
        let p = &shard.placement;
        match boxes.get(&(p.offset.as_slice(), p.extent.as_slice())) {
            Some(&(rank, digest)) => {
                if digest != shard.digest && disagreeing.is_none() {
                    disagreeing = Some((rank, r.rank));
                }
            }
            None => {
                boxes.insert(
                    (p.offset.as_slice(), p.extent.as_slice()),
                    (r.rank, shard.digest),
                );
            }
        }
    }
    if let Some((a, b)) = disagreeing {
        return Err(format!(
            "ranks {a} and {b} hold the same shard with different elements (a `replicas` \
             difference)"
        ));
    }
    let placements: Vec<Placement> = boxes
        .keys()
        .map(|(offset, extent)| Placement {
            global_shape: global.clone(),
            offset: offset.to_vec(),
            extent: extent.to_vec(),
        })
        .collect();
    let Some(total) = first_shard.placement.global_elements() else {
        return Err("its global shape has more than 2^64 elements".into());
    };
    let covered = placements
        .iter()
        .fold(0u64, |acc, p| acc.saturating_add(p.num_elements()));
    for (i, a) in placements.iter().enumerate() {
        if let Some(b) = placements[i + 1..]
            .iter()
            .find(|b| a.num_elements() > 0 && b.num_elements() > 0 && a.overlaps(b))
        {
            return Err(format!(
                "its shards {} and {} overlap",
                a.describe(),
                b.describe()
            ));
        }
    }
    if covered != total {
        return Err(format!(
            "its {} shards cover {covered} of its {total} elements (a rank's shard is missing, \
             or was not recorded)",
            placements.len()
        ));
    }
    let digest = boxes
        .values()
        .fold(PositionDigest::ZERO, |acc, (_, d)| acc + *d);
    let lowest = members
        .iter()
        .min_by_key(|r| r.rank)
        .expect("members is not empty");
    Ok(Combined {
        dtype: first.dtype,
        global,
        digest,
        num_shards: placements.len(),
        rank: lowest.rank,
        seq: lowest.seq,
    })
}

/// One side's records of a (step, name, occurrence): the sharded ones of every rank, and
/// rank 0's record when it is whole.
#[derive(Default)]
struct Group<'t> {
    shards: Vec<&'t Record>,
    whole: Option<&'t Record>,
}

/// Every group of a run with at least one sharded record, and the whole records of rank 0 at
/// the same places.
fn groups(trace: &Trace) -> BTreeMap<Key, Group<'_>> {
    let mut all: BTreeMap<Key, Group<'_>> = BTreeMap::new();
    let mut whole: BTreeMap<Key, &Record> = BTreeMap::new();
    for rank in &trace.ranks {
        let mut seen: BTreeMap<(u64, &str), u32> = BTreeMap::new();
        for r in &rank.records {
            let k = seen.entry((r.step, r.name.as_str())).or_insert(0);
            let key = (r.step, r.name.clone(), *k);
            *k += 1;
            if r.shard.is_some() {
                all.entry(key).or_default().shards.push(r);
            } else if rank.rank == 0 {
                whole.insert(key, r);
            }
        }
    }
    for (key, group) in &mut all {
        group.whole = whole.get(key).copied();
    }
    all
}

/// Compares the sharded records of two runs (of any world sizes) as the module doc says, and
/// adds what it finds to `cmp` (counts, rows in (step, seq, rank) order up to `max_rows`, the
/// first divergence, notes).
pub(crate) fn compare_sharded(left: &Trace, right: &Trace, cmp: &mut Comparison, max_rows: usize) {
    let (a, b) = (groups(left), groups(right));
    let mut keys: Vec<&Key> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut not_compared: Vec<String> = Vec::new();
    let mut rows: Vec<Divergence> = Vec::new();
    for key in keys {
        let (ga, gb) = (a.get(key), b.get(key));
        let (step, name, k) = key;
        let combined = |g: Option<&Group<'_>>, side: &str| -> Option<Result<Combined, String>> {
            let g = g?;
            if g.shards.is_empty() {
                return None;
            }
            Some(combine(&g.shards).map_err(|why| format!("{side}: {why}")))
        };
        let (ca, cb) = (combined(ga, "A"), combined(gb, "B"));
        let divergence = |c: &Combined, difference, left, right| Divergence {
            step: *step,
            rank: c.rank,
            seq: c.seq,
            name: name.clone(),
            difference,
            left,
            right,
            metrics: None,
            element: None,
            operator: None,
            cause: None,
        };
        match (ca, cb) {
            (Some(Ok(x)), Some(Ok(y))) => {
                cmp.num_compared += 1;
                let difference = if x.dtype != y.dtype || x.global != y.global {
                    Some(Difference::Layout)
                } else if x.digest != y.digest {
                    Some(Difference::Digest)
                } else {
                    None
                };
                if let Some(d) = difference {
                    rows.push(divergence(&x, d, Some(x.summary()), Some(y.summary())));
                }
            }
            (Some(Err(why)), _) | (_, Some(Err(why))) => {
                not_compared.push(format!("step {step} `{name}` (#{k}): {why}"));
            }
            (Some(Ok(x)), None) | (None, Some(Ok(x))) => {
                let (other, side) = if ga.is_some_and(|g| !g.shards.is_empty()) {
                    (gb, "B")
                } else {
                    (ga, "A")
                };
                let whole = other.and_then(|g| g.whole).or_else(|| {
                    let t = if side == "B" { right } else { left };
                    rank_zero_record(t, *step, name, *k)
                });
                match whole {
                    Some(_) => not_compared.push(format!(
                        "step {step} `{name}` (#{k}): sharded in {}, a whole record in {side}, \
                         which carries no position digest (record it as a DTensor, or compare \
                         full-mode dumps)",
                        if side == "B" { "A" } else { "B" }
                    )),
                    None => {
                        cmp.num_compared += 1;
                        let (difference, l, r) = if side == "B" {
                            (Difference::OnlyLeft, Some(x.summary()), None)
                        } else {
                            (Difference::OnlyRight, None, Some(x.summary()))
                        };
                        rows.push(divergence(&x, difference, l, r));
                    }
                }
            }
            (None, None) => {}
        }
    }
    cmp.num_differing += rows.len() as u64;
    if let Some(first) = rows.iter().min_by_key(|d| d.key()) {
        let earlier = cmp
            .first
            .as_ref()
            .is_none_or(|f| (first.step, first.seq, first.rank) < (f.step, f.seq, f.rank));
        if earlier {
            cmp.first = Some(first.clone());
        }
    }
    cmp.rows.extend(rows);
    cmp.rows.sort_by_key(Divergence::key);
    cmp.rows.truncate(max_rows);
    if let Some(first) = not_compared.first() {
        cmp.notes.push(format!(
            "{} sharded record{} not compared across world sizes (cannot compare: the shards \
             of a run must tile the global tensor), the first at {first}",
            not_compared.len(),
            if not_compared.len() == 1 {
                " was"
            } else {
                "s were"
            }
        ));
    }
}

/// Whether the record of `d` (its rank, step and seq) in `trace` is a shard.
pub(crate) fn is_sharded(trace: &Trace, d: &Divergence) -> bool {
    trace.ranks.get(d.rank as usize).is_some_and(|r| {
        r.records
            .iter()
            .any(|x| x.step == d.step && x.seq == d.seq && x.shard.is_some())
    })
}

/// The global tensor put together from captured shards (each rank's data and the shard its
/// re-run recorded), and its position digest as the check's summary shows it
/// (`position HEX`), computed from the captured data: equal to the check's when the re-runs
/// reproduced it.
///
/// # Errors
/// Why the shards do not make one tensor.
pub(crate) fn put_together(parts: &[(Tensor, Shard)]) -> Result<(Tensor, String), String> {
    let Some((first, shard)) = parts.first() else {
        return Err("no shard was captured".into());
    };
    let global = shard.placement.global_shape.clone();
    let mut digests: BTreeMap<&Placement, PositionDigest> = BTreeMap::new();
    for (tensor, shard) in parts {
        let digest = tensor
            .with_view(|v| PositionDigest::of_shard(v, &shard.placement))
            .map_err(|e| e.to_string())?;
        digests.insert(&shard.placement, digest);
    }
    let digest = digests
        .values()
        .fold(PositionDigest::ZERO, |acc, d| acc + *d);
    let owned: Vec<(Vec<u8>, Vec<usize>, &Placement)> = parts
        .iter()
        .map(|(t, s)| {
            let bytes = t.with_view(|v| v.bytes().to_vec());
            (bytes, t.shape().to_vec(), &s.placement)
        })
        .collect();
    let dtype = first.dtype();
    let mut list = Vec::with_capacity(owned.len());
    for (bytes, shape, placement) in &owned {
        let view = TensorView::new(dtype, shape, bytes).map_err(|e| e.to_string())?;
        list.push((view, *placement));
    }
    let tensor = assemble(dtype, &global, &list)
        .ok_or("the captured shards do not tile the global tensor")?;
    Ok((tensor, format!("position {digest}")))
}

/// Rank 0's `k`-th record `name` of `step`, if it has one.
fn rank_zero_record<'t>(trace: &'t Trace, step: u64, name: &str, k: u32) -> Option<&'t Record> {
    trace
        .ranks
        .first()?
        .records
        .iter()
        .filter(|r| r.step == step && r.name == name)
        .nth(k as usize)
}

/// The global tensor of `dtype` and `global` shape put together from shards (each a view of
/// its data and its placement); `None` when they do not fit or leave a gap (check them with
/// [`combine`] first). Duplicated shards are written twice, to the same place.
pub(crate) fn assemble(
    dtype: DType,
    global: &[u64],
    parts: &[(TensorView<'_>, &Placement)],
) -> Option<Tensor> {
    let size = dtype.size_of();
    let total = global.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
    let len = usize::try_from(total).ok()?.checked_mul(size)?;
    let mut bytes = vec![0u8; len];
    let mut covered = vec![false; total as usize];
    for (view, placement) in parts {
        if view.dtype() != dtype || placement.global_shape != global {
            return None;
        }
        for run in placement.runs(view.shape()).ok()? {
            let (l, g, n) = (run.local as usize, run.global as usize, run.len as usize);
            bytes[g * size..(g + n) * size]
                .copy_from_slice(&view.bytes()[l * size..(l + n) * size]);
            covered[g..g + n].iter_mut().for_each(|c| *c = true);
        }
    }
    if covered.contains(&false) {
        return None;
    }
    let shape: Vec<usize> = global.iter().map(|&d| d as usize).collect();
    TensorView::new(dtype, &shape, &bytes)
        .ok()
        .map(|v| v.to_tensor())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::ElementDetail;
    use crate::record::RankTrace;
    use crate::value::digest::{Md5Digest, Stats};
    use crate::value::md5tree::DigestKind;
    use crate::value::position::Shard;
    use crate::value::tensor::TensorData;

    /// The global tensor of the tests: f32[4, 6], element i = i (or `changed` at one index).
    fn global(changed: Option<usize>) -> Vec<f32> {
        (0..24)
            .map(|i| if Some(i) == changed { -1.0 } else { i as f32 })
            .collect()
    }

    /// The record of rank `rank` holding rows `rows` and columns `cols` of `values`.
    fn shard_record(
        rank: u32,
        values: &[f32],
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
    ) -> (Record, Tensor) {
        let data: Vec<f32> = rows
            .clone()
            .flat_map(|r| cols.clone().map(move |c| values[r * 6 + c]))
            .collect();
        let shape = vec![rows.len(), cols.len()];
        let tensor = Tensor::new(shape.clone(), TensorData::F32(data)).unwrap();
        let placement = Placement {
            global_shape: vec![4, 6],
            offset: vec![rows.start as u64, cols.start as u64],
            extent: vec![rows.len() as u64, cols.len() as u64],
        };
        let digest = tensor
            .with_view(|v| PositionDigest::of_shard(v, &placement))
            .unwrap();
        let record = Record {
            rank,
            step: 0,
            seq: 0,
            name: "w".into(),
            replicated: false,
            dtype: DType::F32,
            shape,
            md5: Md5Digest::of_tensor(&tensor),
            stats: Stats::default(),
            shard: Some(Shard { placement, digest }),
        };
        (record, tensor)
    }

    fn trace(records: Vec<Record>) -> Trace {
        let world = records.iter().map(|r| r.rank).max().map_or(1, |r| r + 1);
        Trace {
            ranks: (0..world)
                .map(|rank| RankTrace {
                    rank,
                    records: records.iter().filter(|r| r.rank == rank).cloned().collect(),
                    environment: None,
                    digest: DigestKind::CURRENT,
                })
                .collect(),
        }
    }

    fn compare(a: &Trace, b: &Trace) -> Comparison {
        let mut cmp = Comparison::empty();
        compare_sharded(a, b, &mut cmp, 8);
        cmp
    }

    /// World size 1 (one shard, the whole tensor).
    fn one_rank(values: &[f32]) -> Trace {
        trace(vec![shard_record(0, values, 0..4, 0..6).0])
    }

    #[test]
    fn row_shards_tile_the_tensor_and_equal_one_rank() {
        let g = global(None);
        let two = trace(vec![
            shard_record(0, &g, 0..2, 0..6).0,
            shard_record(1, &g, 2..4, 0..6).0,
        ]);
        let cmp = compare(&one_rank(&g), &two);
        assert_eq!((cmp.num_compared, cmp.num_differing), (1, 0), "{cmp:?}");
        assert!(cmp.notes.is_empty(), "{:?}", cmp.notes);
    }

    #[test]
    fn a_two_d_mesh_with_a_replicated_dimension_is_deduplicated() {
        // Mesh (2, 2): Shard(0) on the first dimension, Replicate on the second: ranks 0 and 1
        // hold rows 0..2, ranks 2 and 3 rows 2..4. And Shard(0), Shard(1): four blocks.
        let g = global(None);
        let replicated = trace(vec![
            shard_record(0, &g, 0..2, 0..6).0,
            shard_record(1, &g, 0..2, 0..6).0,
            shard_record(2, &g, 2..4, 0..6).0,
            shard_record(3, &g, 2..4, 0..6).0,
        ]);
        let blocks = trace(vec![
            shard_record(0, &g, 0..2, 0..3).0,
            shard_record(1, &g, 0..2, 3..6).0,
            shard_record(2, &g, 2..4, 0..3).0,
            shard_record(3, &g, 2..4, 3..6).0,
        ]);
        for t in [&replicated, &blocks] {
            let cmp = compare(&one_rank(&g), t);
            assert_eq!((cmp.num_compared, cmp.num_differing), (1, 0), "{cmp:?}");
        }
        let combined = combine(
            &replicated
                .ranks
                .iter()
                .map(|r| &r.records[0])
                .collect::<Vec<_>>(),
        );
        assert_eq!(combined.unwrap().num_shards, 2);
    }

    #[test]
    fn a_changed_element_in_one_shard_is_a_divergence() {
        let (g, changed) = (global(None), global(Some(15)));
        let two = trace(vec![
            shard_record(0, &g, 0..2, 0..6).0,
            shard_record(1, &changed, 2..4, 0..6).0,
        ]);
        let cmp = compare(&one_rank(&g), &two);
        assert_eq!((cmp.num_compared, cmp.num_differing), (1, 1));
        let first = cmp.first.unwrap();
        assert_eq!(
            (first.difference, first.name.as_str()),
            (Difference::Digest, "w")
        );
        assert!(first
            .left
            .unwrap()
            .layout
            .starts_with("f32[4,6] (global, 1 shard)"));
        // Put together, the global tensors name the element.
        let (r0, t0) = shard_record(0, &g, 0..2, 0..6);
        let (r1, t1) = shard_record(1, &changed, 2..4, 0..6);
        let parts = t0.with_view(|v0| {
            t1.with_view(|v1| {
                let p0 = &r0.shard.as_ref().unwrap().placement;
                let p1 = &r1.shard.as_ref().unwrap().placement;
                assemble(DType::F32, &[4, 6], &[(v0, p0), (v1, p1)]).unwrap()
            })
        });
        let whole = Tensor::new(vec![4, 6], TensorData::F32(g)).unwrap();
        let detail = ElementDetail::between(&whole, &parts).unwrap().unwrap();
        assert_eq!((detail.flat_index, detail.index.clone()), (15, vec![2, 3]));
    }

    #[test]
    fn a_missing_shard_or_an_overlap_cannot_be_compared() {
        let g = global(None);
        let missing = trace(vec![shard_record(0, &g, 0..2, 0..6).0]);
        let cmp = compare(&one_rank(&g), &missing);
        assert_eq!((cmp.num_compared, cmp.num_differing), (0, 0));
        assert!(
            cmp.notes[0].contains("cover 12 of its 24 elements"),
            "{:?}",
            cmp.notes
        );
        let overlap = trace(vec![
            shard_record(0, &g, 0..3, 0..6).0,
            shard_record(1, &g, 1..4, 0..6).0,
        ]);
        let cmp = compare(&one_rank(&g), &overlap);
        assert_eq!(cmp.num_differing, 0);
        assert!(cmp.notes[0].contains("overlap"), "{:?}", cmp.notes);
    }

    #[test]
    fn replicas_that_disagree_and_a_whole_record_are_not_compared() {
        let (g, changed) = (global(None), global(Some(0)));
        let disagree = trace(vec![
            shard_record(0, &g, 0..4, 0..6).0,
            shard_record(1, &changed, 0..4, 0..6).0,
        ]);
        let cmp = compare(&one_rank(&g), &disagree);
        assert_eq!(cmp.num_differing, 0);
        assert!(cmp.notes[0].contains("same shard with different elements"));
        let mut whole = shard_record(0, &g, 0..4, 0..6).0;
        whole.shard = None;
        let cmp = compare(&trace(vec![whole]), &one_rank(&g));
        assert_eq!(cmp.num_differing, 0);
        assert!(
            cmp.notes[0].contains("a whole record in A"),
            "{:?}",
            cmp.notes
        );
    }

    #[test]
    fn a_sharded_record_on_one_side_only_is_a_divergence() {
        let g = global(None);
        let cmp = compare(&one_rank(&g), &trace(vec![]));
        assert_eq!(cmp.num_differing, 1);
        assert_eq!(cmp.first.unwrap().difference, Difference::OnlyLeft);
    }
}
