//! What the comparison engine reads from any source of records: a rank's records one step at a
//! time ([`RankSource`]), as [`Batch`]es of entries with their [`Layout`]s and statistics.
//! Detcheck's trace files (`reader.rs`), msprobe's dumps (`msprobe.rs`) and in-memory traces
//! (`crate::compare`) implement it, so one engine reads them all.
//!
//! Determinism: a source yields its records in step order, and within a step in record order.

use crate::file::format::Entry;
use crate::file::DumpError;
use crate::record::Environment;
use crate::value::digest::Stats;
use crate::value::position::Shard;
use crate::value::tensor::{DType, Tensor};

/// A record's dtype and shape, as its source names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// `f32` ... for detcheck traces, `float16` ... for msprobe dumps.
    pub(crate) dtype: String,
    pub(crate) shape: Vec<u64>,
}

impl Layout {
    pub(crate) fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(ToString::to_string).collect();
        format!("{}[{}]", self.dtype, dims.join(","))
    }

    /// The bytes of the tensor, saturating; `None` for a dtype detcheck does not know (another
    /// tool's name).
    pub(crate) fn num_bytes(&self) -> Option<u64> {
        let dtype = DType::ALL.into_iter().find(|d| d.name() == self.dtype)?;
        Some(self.num_elements().saturating_mul(dtype.size_of() as u64))
    }

    /// The dtype, under any name a dump gives it ([`DType::from_dump_name`]).
    pub(crate) fn dtype(&self) -> Option<DType> {
        DType::from_dump_name(&self.dtype)
    }

    /// The product of the shape, saturating: a shape read from a file may overflow 64 bits.
    pub(crate) fn num_elements(&self) -> u64 {
        self.shape
            .iter()
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

/// The records of one step of one rank: entries, and their statistics where the source has them.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) entries: Vec<Entry>,
    /// Empty when the source holds no statistics, else one per entry.
    stats: Vec<Stats>,
    /// The placements of sharded entries: (index in `entries`, shard), in index order.
    shards: Vec<(usize, Shard)>,
}

impl Batch {
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.stats.clear();
        self.shards.clear();
    }

    /// Gives the last entry its shard (a `P` entry after its record).
    pub(crate) fn set_shard(&mut self, shard: Shard) {
        if let Some(last) = self.entries.len().checked_sub(1) {
            self.shards.push((last, shard));
        }
    }

    /// The shard of entry `i`, when it is a sharded record.
    pub(crate) fn shard(&self, i: usize) -> Option<&Shard> {
        self.shards
            .binary_search_by_key(&i, |(j, _)| *j)
            .ok()
            .map(|k| &self.shards[k].1)
    }

    /// Adds an entry; a source gives statistics for all its entries or for none.
    pub(crate) fn push(&mut self, e: Entry, stats: Option<Stats>) {
        self.entries.push(e);
        if let Some(s) = stats {
            self.stats.push(s);
        }
    }

    /// Removes the last entry (and its statistics; it must have no shard yet: a shard entry
    /// follows its record).
    pub(crate) fn pop(&mut self) -> Option<(Entry, Option<Stats>)> {
        let e = self.entries.pop()?;
        if self
            .shards
            .last()
            .is_some_and(|(i, _)| *i == self.entries.len())
        {
            self.shards.pop();
        }
        let s = if self.stats.len() > self.entries.len() {
            self.stats.pop()
        } else {
            None
        };
        Some((e, s))
    }

    /// The statistics of entry `i`, if the source has them.
    pub(crate) fn stats(&self, i: usize) -> Option<&Stats> {
        self.stats.get(i)
    }
}

/// One rank of a dump, read step by step in step order.
/// Which tensors a reader of a [`RankSource`] reads ([`RankSource::will_read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TensorReads {
    /// Those of the rows it reports (`compare`): each step's file is checked (hashed in
    /// chunks, not kept) when the step is reached, and read again for a tensor.
    Some,
    /// Every one (`compare --align`): each step's file is loaded when the step is reached,
    /// read once (memory: one step's file).
    Every,
    /// None (loss curves read statistics): the files are not opened.
    None,
}

pub(crate) trait RankSource {
    /// Reads the records of the next step into `out` (cleared first); `None` at the end.
    fn next_step(&mut self, out: &mut Batch) -> Result<Option<u64>, DumpError>;
    /// The names its entries point into.
    fn names(&self) -> &[String];
    /// The layouts its entries point into.
    fn layouts(&self) -> &[Layout];
    /// The full tensor of an entry, where the dump holds one.
    fn tensor(&mut self, entry: &Entry) -> Result<Option<Tensor>, DumpError>;
    /// Says which of its tensors the caller will read ([`TensorReads`]; `Some` unless told),
    /// so that a source with tensor files reads and checks each file once, or not at all.
    fn will_read(&mut self, _reads: TensorReads) {}
    /// The environment snapshot the rank was recorded under, where the source holds one.
    fn environment(&self) -> Option<&Environment> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::Layout;

    /// A shape read from a file may overflow its product: it saturates, never panics (nor
    /// wraps to 1 and passes for a scalar).
    #[test]
    fn num_elements_saturates() {
        let layout = |shape: Vec<u64>| Layout {
            dtype: "f32".into(),
            shape,
        };
        assert_eq!(layout(vec![2, 3]).num_elements(), 6);
        assert_eq!(
            layout(vec![3, 6_148_914_691_236_517_206]).num_elements(),
            u64::MAX
        );
        assert_eq!(layout(vec![1 << 32, 1 << 32, 2]).num_elements(), u64::MAX);
    }
}
